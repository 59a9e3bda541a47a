#!/bin/sh
# logprobs and prompt_logprobs equal log_softmax of llama2.c's own logits
# (stories260K, "Once upon a time") to 1e-4, at one rank and at -tp 8 -dcp 2
# (the vocabulary in 8 shards: each sends its top N and log-sum-exp); a
# stop_token_ids entry ends a request and min_tokens holds it back, the
# model then choosing the reference's best other token (tests/check_logprobs.c).
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "$M not found: skipped" >&2; exit 77; }
P=$WORK/p.jsonl
cat >"$P" <<'JSON'
{"id": "lp", "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "logprobs": 5, "prompt_logprobs": 5}
{"id": "stop_token", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stop_token_ids": [286]}
{"id": "min_tokens", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stop_token_ids": [286], "min_tokens": 8}
JSON
for layout in "1" "8 -tp 8 -dcp 2"; do
    np=${layout%% *}
    args=${layout#"$np"}
    checks=$((checks + 1))
    NP=$np run_dcp "np$np" --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" $args --output "$WORK/np$np.jsonl" "$P"
    if [ "$(cat "$WORK/np$np.rc")" != 0 ]; then
        fail "np $np: exit $(cat "$WORK/np$np.rc")"; cat "$WORK/np$np.err" >&2
    elif "$BUILD/tests/check_logprobs" "$WORK/np$np.jsonl"; then
        pass "-np $np$args: logprobs are log_softmax of the reference logits"
    else
        fail "-np $np$args: see above"
    fi
done
finish
