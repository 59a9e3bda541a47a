#!/bin/sh
# GLM-4.5 (Glm4MoeForCausalLM: grouped-query attention with q/k/v biases,
# per-head q/k norms and RoPE on half of each head; the first layer dense,
# then DeepSeek-V3's experts: sigmoid scores with a correction bias, the
# best group, a shared expert) gives transformers' 32 greedy tokens after
# its 320-token prompt (tests/data/hf/glm4_moe, tests/ref/make_hf_refs.py;
# its logits: tests/test_hf_reference) at every kind of layout, and the
# same bits, sampled tokens and log-probabilities, at every layout of its
# canonical order (k8 d4): TP, DCP with either merge, DP with chunked
# prefill. With expert parallelism (its own order, "ep") every layout gives
# one rank's EP bits, and those are one rank's without EP to 1e-4. The
# plan's weight bytes per rank are the run's, with and without EP.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
M=$SRC/tests/data/hf/glm4_moe
want=$(id_list "$M/greedy.txt")
printf '{"id": "ref", "prompt_token_ids": [%s], "max_tokens": 32, "temperature": 0, "ignore_eos": true, "logprobs": 2}\n' \
    "$(id_list "$M/prompt.txt")" >"$WORK/p.jsonl"
printf '{"id": "b", "prompt_token_ids": [7, 7, 7, 1, 150, 3], "max_tokens": 24, "temperature": 1.0, "seed": 5, "ignore_eos": true, "logprobs": 3, "prompt_logprobs": 1}\n' \
    >>"$WORK/p.jsonl"

# LAYOUT REF ORDER: the run at LAYOUT ("NP ARGS") gives transformers'
# tokens and REF's results bit for bit, in the reduction order ORDER
same_bits() {
    np=${1%% *}
    args=${1#"$np" }
    name=$(echo "$args" | tr -c 'a-z0-9' '_')
    checks=$((checks + 1))
    NP=$np run_dcp "$name" --model "$M" --max-num-seqs 4 $args --output "$WORK/$name.jsonl" "$WORK/p.jsonl"
    if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
        fail "$args: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
    elif [ "$(token_ids "$WORK/$name.jsonl" ref)" != "$want" ]; then
        fail "$args: '$(token_ids "$WORK/$name.jsonl" ref)', not transformers' '$want'"
    elif ! untimed "$WORK/$name.jsonl" | cmp -s - "$WORK/$2.want"; then
        fail "$args: tokens or log-probabilities differ from $2's"
        untimed "$WORK/$name.jsonl" | diff - "$WORK/$2.want" | head -4 | cut -c1-300 >&2
    elif ! grep -q "^# reduction order: $3 (K chunks" "$WORK/$name.out"; then
        fail "$args: not the reduction order $3"; grep "^# reduction" "$WORK/$name.out" >&2
    else
        pass "-np $np $args: transformers' 32 greedy tokens, and every token and log-probability $2's, bit for bit"
    fi
}

for ep in "" --enable-expert-parallel; do
    ref=one${ep:+-ep}
    checks=$((checks + 1))
    run_dcp "$ref" --model "$M" $ep --output "$WORK/$ref.jsonl" "$WORK/p.jsonl"
    if [ "$(cat "$WORK/$ref.rc")" = 0 ] && [ "$(token_ids "$WORK/$ref.jsonl" ref)" = "$want" ]; then
        pass "one rank ${ep:-without expert parallelism}: transformers' 32 greedy tokens"
    else
        fail "one rank $ep: exit $(cat "$WORK/$ref.rc"), '$(token_ids "$WORK/$ref.jsonl" ref)' vs '$want'"
        cat "$WORK/$ref.err" >&2
    fi
    untimed "$WORK/$ref.jsonl" >"$WORK/$ref.want"
done
for layout in "2 -tp 2" "4 -tp 4 -dcp 2" "8 -tp 8 -dcp 4 --dcp-comm-backend a2a" \
    "4 -tp 2 -dp 2 --max-num-batched-tokens 64 --block-size 4"; do
    same_bits "$layout" one "k8 d4 i1"
done
for layout in "4 -tp 4 -dcp 2 --enable-expert-parallel" \
    "8 -tp 2 -dp 4 --enable-expert-parallel --max-num-batched-tokens 64"; do
    same_bits "$layout" one-ep "k8 d4 i1 ep"
done
checks=$((checks + 1))
if "$BUILD/tests/check_logprobs" --same "$WORK/one.jsonl" "$WORK/one-ep.jsonl"; then
    pass "expert parallelism: one rank's tokens and log-probabilities without it, to 1e-4"
else
    fail "expert parallelism: tokens or log-probabilities differ from one rank's without it"
fi

# with EP the plan lists every rank (their experts differ), else the TP ranks
for layout in "4 -tp 4 -dcp 2:by TP rank" "4 -tp 2 -dp 2 --enable-expert-parallel:by rank"; do
    checks=$((checks + 1))
    np=${layout%% *} by=${layout#*:}
    args=${layout#"$np" }
    args=${args%:*}
    NP=$np run_dcp w --model "$M" $args --output "$WORK/w.h5" "$WORK/p.jsonl"
    plan=$("$BUILD/dcpinfer-plan" --model "$M" $args | sed -n "s/^# weight bytes $by: //p")
    run=$(h5_numbers "$WORK/w.h5" /memory/weight_bytes | tr '\n' ' ' | sed 's/ $//')
    if [ -n "$plan" ] && [ "$plan" = "$run" ]; then
        pass "$args: the plan's weight bytes per rank are the run's ($run)"
    else
        fail "$args: the plan says '$plan' weight bytes $by, the run '$run'"
    fi
done
finish
