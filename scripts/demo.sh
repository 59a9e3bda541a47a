#!/bin/bash
# Builds dcpinfer (installing its Debian packages if missing) and runs the
# main job: the generated default model on inputs/demo.jsonl, then, when
# ../shared holds it, the stories260K checkpoint on text prompts.
set -u
. "$(dirname "$0")/setup.sh"
ensure_packages || exit 1
build_dcpinfer || exit 1
NP=${NP:-1}
DEMO_ARGS=${DEMO_ARGS:-}
OUT=${OUT:-$TOP/demo-out}
mkdir -p "$OUT"

echo "== default model, $NP rank(s): mpirun -np $NP dcpinfer${DEMO_ARGS:+ $DEMO_ARGS} --max-tokens 24 inputs/demo.jsonl"
mpirun --bind-to none --oversubscribe -np "$NP" "$BUILD_DIR/dcpinfer" $DEMO_ARGS --max-tokens 24 --output "$OUT/demo.h5" \
    "$TOP/inputs/demo.jsonl" || exit 1

STORIES=${STORIES:-$TOP/../shared/models/stories260K}
if [ -f "$STORIES/stories260K.bin" ]; then
    echo
    echo "== stories260K: mpirun -np $NP dcpinfer${DEMO_ARGS:+ $DEMO_ARGS} --model stories260K.bin --tokenizer tok512.bin inputs/stories.jsonl"
    mpirun --bind-to none --oversubscribe -np "$NP" "$BUILD_DIR/dcpinfer" $DEMO_ARGS --model "$STORIES/stories260K.bin" \
        --tokenizer "$STORIES/tok512.bin" --output "$OUT/stories.h5" "$TOP/inputs/stories.jsonl" || exit 1
    echo
    echo "== texts from $OUT/stories.h5 (h5dump -d /requests/text)"
    h5dump -d /requests/text "$OUT/stories.h5" | sed -n '/DATA {/,/}/p'
fi
