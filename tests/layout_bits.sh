#!/bin/sh
# Same bits at every layout (docs/design.md, "Same bits at any layout"):
# seeded sampling at temperature 1.0 over a 32K vocabulary of random
# weights (nearly flat distributions, where the last bit of a logit can
# decide a draw) gives the same tokens and the same log-probabilities, bit
# for bit (the JSON's 17 significant digits carry every float exactly), at
# one rank, -tp 2, -tp 4 -dcp 2, -tp 8 -dcp 8 with either merge, and -dp 2
# with chunked prefill, 4 sequences at a time and blocks of 4;
# with --cp-kv-cache-interleave-size 16, -tp 8 -dcp 8 against one rank run
# at that interleave. For a Llama-family model (one KV head, so that dcp
# reaches 8), Qwen3 and DeepSeek-V3. A layout that does not divide the
# canonical sizes says so in its header.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
SHAPE="--layers 2 --dim 64 --heads 8 --hidden 128 --vocab 32768"
"$MKMODEL" --out "$WORK/llama" --arch llama $SHAPE --kv-heads 1 >/dev/null &&
    "$MKMODEL" --out "$WORK/qwen3" --arch qwen3 $SHAPE --kv-heads 1 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3" --arch deepseek_v3 $SHAPE --first-dense 1 --q-lora-rank 24 --norm-topk-prob \
        >/dev/null || { echo "FAIL: dcpinfer-mkmodel could not write the models" >&2; exit 1; }
P=$WORK/p.jsonl
for i in 0 1 2 3 4 5; do
    ids=$(awk -v i=$i 'BEGIN { n = 5 + 7 * i; for (j = 0; j < n; j++) printf "%s%d", j ? ", " : "", (j * 7919 + i * 104729) % 32768 }')
    echo "{\"id\": \"s$i\", \"prompt_token_ids\": [$ids], \"max_tokens\": $((10 + 3 * i)), \"temperature\": 1.0, \"seed\": $((i + 11)), \"logprobs\": 3, \"prompt_logprobs\": $((i % 3))}"
done >"$P"

for m in llama qwen3 v3; do
    for I in 1 16; do
        NP=1 run_dcp "$m-$I-one" --model "$WORK/$m" --cp-kv-cache-interleave-size $I --block-size 16 \
            --output "$WORK/$m-$I-one.jsonl" "$P"
        [ "$(cat "$WORK/$m-$I-one.rc")" = 0 ] || { fail "$m: one rank, interleave $I: exit $(cat "$WORK/$m-$I-one.rc")"; cat "$WORK/$m-$I-one.err" >&2; continue; }
        untimed "$WORK/$m-$I-one.jsonl" >"$WORK/$m-$I-one.want"
        if [ $I = 1 ]; then
            set -- "2 -tp 2" "4 -tp 4 -dcp 2" "8 -tp 8 -dcp 8" "8 -tp 8 -dcp 8 --dcp-comm-backend a2a" \
                "2 -dp 2 --max-num-batched-tokens 8 --max-num-seqs 4 --block-size 4"
        else
            set -- "8 -tp 8 -dcp 8 --dcp-comm-backend a2a" "4 -tp 4 -dcp 4"
        fi
        for layout in "$@"; do
            np=${layout%% *}
            args=${layout#"$np" }
            name=$m-$I-$(echo "$args" | tr -c 'a-z0-9' '_')
            checks=$((checks + 1))
            NP=$np run_dcp "$name" --model "$WORK/$m" --cp-kv-cache-interleave-size $I --block-size 16 $args \
                --output "$WORK/$name.jsonl" "$P"
            if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
                fail "$m, interleave $I, $args: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
            elif ! untimed "$WORK/$name.jsonl" | cmp -s - "$WORK/$m-$I-one.want"; then
                fail "$m, interleave $I, $args: tokens or log-probabilities differ from one rank's"
                untimed "$WORK/$name.jsonl" | diff - "$WORK/$m-$I-one.want" | head -4 | cut -c1-300 >&2
            elif ! grep -q "^# reduction order: k8 d8 i$I (K chunks" "$WORK/$name.out"; then
                fail "$m, interleave $I, $args: no canonical reduction order in the header"; grep "^# reduction" "$WORK/$name.out" >&2
            else
                pass "$m, interleave $I, -np $np $args: every token and log-probability one rank's, bit for bit"
            fi
        done
    done
done
# the sampled tokens really are near the draw's edges: the two interleaves
# (two reduction orders) give different bits
checks=$((checks + 1))
if cmp -s "$WORK/llama-1-one.want" "$WORK/llama-16-one.want"; then
    fail "interleaves 1 and 16 gave the same bits: the test cannot tell reduction orders apart"
else
    pass "interleaves 1 and 16 (two reduction orders) differ in the bits, as they should"
fi
# -tp 3 does not divide 8 K chunks: it runs, and says its bits are its own
"$MKMODEL" --out "$WORK/h12" --arch llama --layers 1 --dim 96 --heads 12 --kv-heads 12 --hidden 96 --vocab 512 >/dev/null
checks=$((checks + 1))
sed -E 's/"prompt_token_ids": \[[^]]*\]/"prompt_token_ids": [1, 2, 3]/' "$P" >"$WORK/small.jsonl"
NP=3 run_dcp tp3 --model "$WORK/h12" -tp 3 --output "$WORK/tp3.jsonl" "$WORK/small.jsonl"
if [ "$(cat "$WORK/tp3.rc")" = 0 ] && grep -q "^# reduction order: layout tp3 dcp1 i1: -tp 3 -dcp 1 do not divide the model's 4 K chunks" "$WORK/tp3.out"; then
    pass "-tp 3 on a model of 4 K chunks runs and names its reduction order as its layout's"
else
    fail "-tp 3: exit $(cat "$WORK/tp3.rc")"; grep "^# reduction" "$WORK/tp3.out" >&2; cat "$WORK/tp3.err" >&2
fi
finish
