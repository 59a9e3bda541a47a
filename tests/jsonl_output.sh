#!/bin/sh
# JSONL results: OpenAI batch input gives lines a reader written from the
# OpenAI batch output documentation accepts (tests/read_batch_output.c),
# with a failed line as an "error"; dcpinfer's own form carries the same
# texts, which are llama2.c's reference continuation; --output-format
# overrides the extension; the HDF5 file records which stop ended a request.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "$M not found: skipped" >&2; exit 77; }
B=$WORK/batch.jsonl
cat >"$B" <<'JSON'
{"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}}
{"custom_id": "r2", "method": "POST", "url": "/v1/completions", "body": {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "logprobs": 2, "stop": "named"}}
{"custom_id": "r3", "method": "POST", "url": "/v1/completions", "body": {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": -1}}
JSON
# the same requests in dcpinfer's own form
sed 's/^{"custom_id": \("r[0-9]"\), "method": "POST", "url": "\/v1\/completions", "body": {"model": "stories260K", /{"id": \1, /; s/}}$/}/' "$B" >"$WORK/own.jsonl"
ARGS="--model $M/stories260K.bin --tokenizer $M/tok512.bin --skip-invalid"
REF=", there was a little girl named Lily. She loved to play outside in the park."

checks=$((checks + 1))
run_dcp batch $ARGS --output "$WORK/batch_out.jsonl" "$B"
if [ "$(cat "$WORK/batch.rc")" != 4 ]; then
    fail "batch: exit $(cat "$WORK/batch.rc"), want 4 (one request failed)"; cat "$WORK/batch.err" >&2
elif ! "$BUILD/tests/read_batch_output" "$WORK/batch_out.jsonl" >"$WORK/read.txt"; then
    fail "batch: the OpenAI batch output reader refused the file"; cat "$WORK/batch_out.jsonl" >&2
else
    pass "batch: the reader accepts all $(grep -c '' "$WORK/read.txt") lines"
fi

checks=$((checks + 1))
r1=$(awk -F '\t' '$1 == "r1" && $2 == 200 {print $3}' "$WORK/read.txt")
r2=$(awk -F '\t' '$1 == "r2" && $2 == 200 {print $3}' "$WORK/read.txt")
r3=$(awk -F '\t' '$1 == "r3" && $2 == "error" {print $3}' "$WORK/read.txt")
case "$REF" in
    "$r1"*) ok1=${#r1} ;;
    *) ok1=0 ;;
esac
if [ "$ok1" -gt 20 ] && [ "$r2" = ", there was a little girl " ] && echo "$r3" | grep -q 'max_tokens'; then
    pass "batch: r1 is the reference's start, r2 ends before its stop string, r3 is an error"
else
    fail "batch: r1 '$r1', r2 '$r2', r3 '$r3'"
fi

checks=$((checks + 1))
NP=2 run_dcp own $ARGS --output "$WORK/own_out.data" --output-format jsonl "$WORK/own.jsonl"
o1=$(grep '"id":"r1"' "$WORK/own_out.data" | sed 's/.*"text":"\([^"]*\)".*/\1/')
o2=$(grep '"id":"r2"' "$WORK/own_out.data" | sed 's/.*"text":"\([^"]*\)".*/\1/')
if [ "$(cat "$WORK/own.rc")" = 4 ] && [ "$o1" = "$r1" ] && [ "$o2" = "$r2" ] && grep -q '"stop_reason":"named"' "$WORK/own_out.data" &&
    grep '"id":"r3"' "$WORK/own_out.data" | grep -q '"error":".*max_tokens'; then
    pass "own form (--output-format jsonl, 2 ranks): the same texts, stop_reason and error"
else
    fail "own form: exit $(cat "$WORK/own.rc"); r1 '$o1', r2 '$o2'"; cat "$WORK/own_out.data" "$WORK/own.err" >&2
fi

if command -v h5dump >/dev/null 2>&1; then
    checks=$((checks + 1))
    run_dcp h5 $ARGS --output "$WORK/h5.jsonl" --output-format hdf5 "$WORK/own.jsonl"
    stop=$(h5dump -y -d /requests/stop_str "$WORK/h5.jsonl" 2>/dev/null | tr -d '\n ')
    if [ "$(cat "$WORK/h5.rc")" = 4 ] && echo "$stop" | grep -q '"","named",""'; then
        pass "--output-format hdf5 wins over .jsonl; /requests/stop_str holds the stop string"
    else
        fail "hdf5: exit $(cat "$WORK/h5.rc"); stop_str $stop"
    fi
fi
finish
