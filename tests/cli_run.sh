#!/bin/sh
# dcpinfer runs the same under mpirun -np 1 and as a plain executable, on
# the default model and on stories260K with text prompts, and writes the
# same tokens.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"

P=$WORK/p.jsonl
cat >"$P" <<'JSON'
{"id": "x", "prompt_token_ids": [10, 20, 30], "max_tokens": 12, "temperature": 0}
{"id": "y", "prompt_token_ids": [7], "max_tokens": 5, "seed": 42}
JSON

checks=$((checks + 1))
run_dcp mpi --output "$WORK/mpi.h5" "$P"
OMPI_MCA_ess_singleton_isolated=1 "$DCPINFER" --output "$WORK/plain.h5" "$P" >"$WORK/plain.out" 2>"$WORK/plain.err"
plain_rc=$?
if [ "$(cat "$WORK/mpi.rc")" = 0 ] && [ "$plain_rc" = 0 ] && [ -f "$WORK/mpi.h5" ] && [ -f "$WORK/plain.h5" ]; then
    pass "mpirun and plain runs succeed"
else
    fail "runs: mpirun rc $(cat "$WORK/mpi.rc"), plain rc $plain_rc"; cat "$WORK/mpi.err" "$WORK/plain.err" >&2
fi

# the per-request lines without their timing columns must agree
checks=$((checks + 1))
strip() { grep -E '^  (x|y) ' "$1" | awk '{print $1, $2, $3, $4}'; }
if [ -n "$(strip "$WORK/mpi.out")" ] && [ "$(strip "$WORK/mpi.out")" = "$(strip "$WORK/plain.out")" ]; then
    pass "same requests and lengths: $(strip "$WORK/mpi.out" | tr '\n' ';')"
else
    fail "summaries differ"; cat "$WORK/mpi.out" "$WORK/plain.out" >&2
fi
if command -v h5dump >/dev/null 2>&1; then
    checks=$((checks + 1))
    a=$(h5dump -d /requests/output_tokens -y "$WORK/mpi.h5" | grep -v HDF5)
    b=$(h5dump -d /requests/output_tokens -y "$WORK/plain.h5" | grep -v HDF5)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "same output tokens in both files"; else fail "output tokens differ"; fi
fi

# --help documents every option
checks=$((checks + 1))
"$DCPINFER" --help >"$WORK/help" 2>&1
missing=
for opt in --model --tokenizer --max-tokens --temperature --top-p --seed --max-model-len --output --backend \
    --cpu-gemm --max-num-seqs --max-num-batched-tokens --skip-invalid --progress --quiet; do
    grep -q -- "$opt" "$WORK/help" || missing="$missing $opt"
done
if [ -z "$missing" ]; then pass "--help documents every option"; else fail "--help lacks:$missing"; fi

# stories260K with a text prompt: the greedy story of llama2.c's run.c
model=$SHARED/models/stories260K
if [ -f "$model/stories260K.bin" ]; then
    checks=$((checks + 1))
    printf '{"id": "story", "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0}\n' >"$P"
    run_dcp story --model "$model/stories260K.bin" --tokenizer "$model/tok512.bin" --output "$WORK/s.h5" "$P"
    if grep -q '^  story .* 5 .* 60 length .*", there was a little girl named Lily. She loved' "$WORK/story.out"; then
        pass "stories260K text"
    else
        fail "stories260K text:"; cat "$WORK/story.out" "$WORK/story.err" >&2
    fi
else
    echo "stories260K not found under $SHARED: its check skipped" >&2
fi
finish
