#!/bin/sh
# logprobs and prompt_logprobs equal log_softmax of llama2.c's own logits
# (stories260K, "Once upon a time") to 1e-4, at one rank and at -tp 8 -dcp 2
# (the vocabulary in 8 shards: each sends its top N and log-sum-exp); a
# stop_token_ids entry ends a request and min_tokens holds it back, the
# model then choosing the reference's best other token (tests/check_logprobs.c).
# Sampled requests with stop strings, min_tokens and log-probabilities give
# the same results at -tp 2 -dp 2 with chunked prefill and preemption as at
# one rank.
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

R=$WORK/mixed.jsonl
for i in $(seq 0 11); do
    echo "{\"id\": \"r$i\", \"prompt\": \"Once upon a time $i\", \"max_tokens\": $((20 + i * 3)), \"temperature\": $([ $((i % 2)) = 0 ] && echo 0.7 || echo 0), \"seed\": $i, \"logprobs\": $((i % 3)), \"prompt_logprobs\": $((i % 2)), \"stop\": [\"park\", \"ball\"], \"min_tokens\": $((i % 5))}"
done >"$R"
checks=$((checks + 1))
NP=1 run_dcp one --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --output "$WORK/one.jsonl" "$R"
NP=4 run_dcp four --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -tp 2 -dp 2 --max-num-batched-tokens 8 \
    --max-num-seqs 4 --kv-cache-memory 48K --block-size 4 --output "$WORK/four.jsonl" "$R"
if [ "$(cat "$WORK/one.rc")$(cat "$WORK/four.rc")" != 00 ]; then
    fail "mixed requests: exit $(cat "$WORK/one.rc") and $(cat "$WORK/four.rc")"; cat "$WORK/four.err" >&2
elif ! grep -q ' [1-9][0-9]* preemption(s)' "$WORK/four.out"; then
    fail "mixed requests: the 4-rank run did not preempt: $(grep preemption "$WORK/four.out")"
elif "$BUILD/tests/check_logprobs" --same "$WORK/one.jsonl" "$WORK/four.jsonl"; then
    pass "mixed requests: -tp 2 -dp 2, chunks of 8, $(grep -o '[0-9]* preemption(s)' "$WORK/four.out"): the same as one rank"
else
    fail "mixed requests: -tp 2 -dp 2 differs from one rank (see above)"
fi
finish
