#!/bin/sh
# valgrind finds no leak in a small dcpinfer run (generated model, two
# requests, plain executable; stories260K with a text prompt when present). Open MPI's own allocations are not ours:
# only blocks allocated under dcpinfer's code count (see the suppressions
# in tests/valgrind.supp).
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
command -v valgrind >/dev/null 2>&1 || { echo "valgrind not installed: skipped" >&2; exit 77; }
if nm "$DCPINFER" 2>/dev/null | grep -q __asan_init; then echo "sanitizer build: skipped" >&2; exit 77; fi

P=$WORK/p.jsonl
cat >"$P" <<'JSON'
{"id": "x", "prompt_token_ids": [10, 20, 30], "max_tokens": 6, "temperature": 0}
{"id": "y", "prompt_token_ids": [7], "max_tokens": 4, "seed": 42}
JSON
# with stories260K, the tokenizer and text paths run too
model=
if [ -f "$SHARED/models/stories260K/stories260K.bin" ]; then
    model="--model $SHARED/models/stories260K/stories260K.bin --tokenizer $SHARED/models/stories260K/tok512.bin"
    echo '{"id": "t", "prompt": "Once upon a time", "max_tokens": 8}' >>"$P"
fi
checks=$((checks + 1))
OMP_NUM_THREADS=1 OMPI_MCA_ess_singleton_isolated=1 valgrind --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=9 \
    --suppressions="$SRC/tests/valgrind.supp" "$DCPINFER" $model --quiet --output "$WORK/o.h5" "$P" \
    >"$WORK/vg.out" 2>"$WORK/vg.err"
rc=$?
if [ "$rc" = 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$WORK/vg.err"; then
    pass "no leaks: $(grep -E 'definitely lost|indirectly lost|All heap' "$WORK/vg.err" | sed 's/==[0-9]*== *//' | tr '\n' ' ')"
else
    fail "valgrind exit $rc"; grep -A12 -E "definitely lost in|indirectly lost in|Invalid|uninitialised" "$WORK/vg.err" | head -80 >&2
fi
finish
