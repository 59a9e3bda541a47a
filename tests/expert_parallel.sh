#!/bin/bash
# Expert parallelism from the command line (--enable-expert-parallel) on the
# DeepSeek-V3 and V2 models dcpinfer-mkmodel writes (8 routed experts, top
# 2, a shared expert, a dense first layer):
# - at -tp 4 -dcp 4, -tp 2 -dp 2 and -tp 8 -dcp 8 (a2a), in steps of 8
#   tokens (chunked prefill) and, at tp 8, 4 KV blocks that preempt: the
#   greedy tokens of one rank without EP, and log-probabilities equal to
#   the bit across the EP layouts and one rank with EP;
# - each rank's routed-expert bytes are 1/N of the model's (N = tp x dp),
#   the model's by the formula (float32 and INT4 experts), and the run's
#   /memory/weight_bytes are dcpinfer-plan's, rank by rank;
# - /moe/expert_tokens adds up to K pairs per token forwarded per MoE
#   layer, the same at every EP layout; the summary reports the load and
#   the DP groups' idle passes;
# - refusals: a model without experts, experts not divisible by the ranks.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
PLAN=$BUILD/dcpinfer-plan
SHAPE="--layers 3 --dim 64 --heads 8 --hidden 96 --vocab 256 --first-dense 1"
"$MKMODEL" --out "$WORK/v3" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob >/dev/null &&
    "$MKMODEL" --out "$WORK/v3int4" --arch deepseek_v3 $SHAPE --q-lora-rank 24 --norm-topk-prob \
        --quant int4-w4a16 >/dev/null &&
    "$MKMODEL" --out "$WORK/v2" --arch deepseek_v2 $SHAPE --n-group 4 --topk-group 2 >/dev/null &&
    "$MKMODEL" --out "$WORK/dense" --layers 2 --dim 64 --heads 8 --hidden 96 --vocab 256 >/dev/null ||
    { echo "FAIL: dcpinfer-mkmodel could not write the models" >&2; exit 1; }
E=8 K=2 MOE_LAYERS=2 DIM=64 MH=32
P=$WORK/p.jsonl
{
    echo '{"id": "a", "prompt_token_ids": [5, 17, 200, 31, 9, 77, 140, 3, 62, 250, 18, 99], "max_tokens": 24, "temperature": 0, "logprobs": 2}'
    echo '{"id": "b", "prompt_token_ids": [7, 7, 7, 1], "max_tokens": 30, "temperature": 0, "logprobs": 2}'
    echo '{"id": "c", "prompt_token_ids": [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], "max_tokens": 17, "temperature": 0, "logprobs": 2}'
    echo '{"id": "d", "prompt_token_ids": [250, 3], "max_tokens": 9, "temperature": 0, "logprobs": 2}'
} >"$P"
ids() { grep -o '"token_ids":\[[^]]*\]' "$1"; }
# the results without timings: tokens and log-probabilities, to the bit
bits() { sed 's/"metrics".*//; s/"cached_tokens":[0-9]*//' "$1"; }
# forwarded tokens: every prompt and output token but each request's last
forwarded=$((12 + 24 + 4 + 30 + 21 + 17 + 2 + 9 - 4))

for m in v3 v2; do
    run_dcp "$m-1" --model "$WORK/$m" --output "$WORK/$m-1.jsonl" "$P"
    run_dcp "$m-1ep" --model "$WORK/$m" --enable-expert-parallel --output "$WORK/$m-1ep.jsonl" "$P"
    checks=$((checks + 1))
    if [ "$(cat "$WORK/$m-1.rc")$(cat "$WORK/$m-1ep.rc")" = 00 ] && [ -n "$(ids "$WORK/$m-1.jsonl")" ] &&
        [ "$(ids "$WORK/$m-1.jsonl")" = "$(ids "$WORK/$m-1ep.jsonl")" ]; then
        pass "$m: one rank with EP gives one rank's tokens"
    else
        fail "$m: one rank with EP: exit $(cat "$WORK/$m-1.rc") $(cat "$WORK/$m-1ep.rc")"; cat "$WORK/$m-1ep.err" >&2
    fi
    for layout in "4 -tp 4 -dcp 4" "4 -tp 2 -dp 2" "8 -tp 8 -dcp 8 --dcp-comm-backend a2a --kv-cache-memory 4K --block-size 2"; do
        checks=$((checks + 2))
        np=${layout%% *} name=$m-$(echo "${layout#* }" | tr -d ' -' | cut -c1-11)
        NP=$np run_dcp "$name" --model "$WORK/$m" ${layout#"$np"} --enable-expert-parallel \
            --max-num-batched-tokens 8 --max-num-seqs 4 --output "$WORK/$name.h5" "$P"
        NP=$np run_dcp "$name-j" --model "$WORK/$m" ${layout#"$np"} --enable-expert-parallel \
            --max-num-batched-tokens 8 --max-num-seqs 4 --output "$WORK/$name.jsonl" "$P"
        if [ "$(cat "$WORK/$name.rc")$(cat "$WORK/$name-j.rc")" = 00 ] &&
            [ "$(ids "$WORK/$m-1.jsonl")" = "$(ids "$WORK/$name.jsonl")" ]; then
            pass "$m: ${layout#"$np" } --enable-expert-parallel gives one rank's tokens"
        else
            fail "$m: ${layout#"$np" } EP: exit $(cat "$WORK/$name.rc") $(cat "$WORK/$name-j.rc")"
            cat "$WORK/$name.err" "$WORK/$name-j.err" >&2
        fi
        if [ "$(bits "$WORK/$m-1ep.jsonl")" = "$(bits "$WORK/$name.jsonl")" ]; then
            pass "$m: ${layout#"$np" } EP: every log-probability the bits of one rank with EP"
        else
            fail "$m: ${layout#"$np" } EP: log-probabilities differ from one rank with EP"
        fi
    done
    # the tight KV budget preempted, and the run still matched
    checks=$((checks + 1))
    if grep -qE ', [1-9][0-9]* preemption' "$WORK/$m-tp8dcp8dcpc.out"; then
        pass "$m: tp 8 dcp 8 EP: $(grep -oE '[0-9]+ preemption\(s\)' "$WORK/$m-tp8dcp8dcpc.out")"
    else
        fail "$m: tp 8 dcp 8 EP with 4 KV blocks per rank preempted nothing"
    fi
done

# /moe/expert_tokens: K pairs per token forwarded per MoE layer, the same
# routing at every EP layout (dense first layer: zeros)
checks=$((checks + 3))
sum=$(h5_sum "$WORK/v3-tp2dp2.h5" /moe/expert_tokens)
if [ "$sum" = $((forwarded * K * MOE_LAYERS)) ]; then
    pass "v3 tp 2 dp 2 EP: /moe/expert_tokens sums to $sum = $forwarded tokens x $K x $MOE_LAYERS MoE layers"
else
    fail "v3 tp 2 dp 2 EP: /moe/expert_tokens sums to $sum, want $((forwarded * K * MOE_LAYERS))"
fi
a=$(h5_numbers "$WORK/v3-tp2dp2.h5" /moe/expert_tokens | tr '\n' ' ') b=$(h5_numbers "$WORK/v3-tp4dcp4.h5" /moe/expert_tokens | tr '\n' ' ')
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(echo $a | cut -d' ' -f1-8)" = "0 0 0 0 0 0 0 0" ]; then
    pass "v3: the same expert_tokens at tp 2 dp 2 and tp 4 dcp 4 EP, none in the dense layer"
else
    fail "v3: expert_tokens differ: '$a' vs '$b'"
fi
if grep -q '^# experts: 8 over 4 rank(s), 2 each; ' "$WORK/v3-tp2dp2.out" &&
    grep -q 'load max/mean: per expert' "$WORK/v3-tp2dp2.out" && grep -q '^# idle passes' "$WORK/v3-tp2dp2.out" &&
    grep -q 'moe_dispatch' "$WORK/v3-tp2dp2.out" && grep -q 'ep_step' "$WORK/v3-tp2dp2.out"; then
    pass "v3 tp 2 dp 2 EP: $(grep '^# experts' "$WORK/v3-tp2dp2.out")"
else
    fail "v3 tp 2 dp 2 EP: the summary lacks the experts, idle passes or exchanges"; cat "$WORK/v3-tp2dp2.out" >&2
fi

# each rank's routed experts: 1/N of the model's, by the formula; the
# router (and V3's correction bias) stays whole on every rank
experts_part() { # MODEL ARGS...: the experts part of rank 0 (plan JSON)
    local model=$1; shift
    "$PLAN" --model "$model" "$@" --format json | sed -n 's/.*"experts": \([0-9]*\).*/\1/p' | head -1
}
router=$((MOE_LAYERS * ((E * DIM + 1) * 4 + (E + 1) * 4)))
for m in v3 v3int4; do
    one=$(experts_part "$WORK/$m" --enable-expert-parallel)
    routed=$((one - router))
    # float32: 3 matrices of MH x DIM per expert; INT4 (groups of 32
    # columns): half a byte per weight and an fp32 scale per row and group
    # (gate and up: MH rows of DIM / 32 groups; down: DIM rows of MH / 32)
    if [ "$m" = v3 ]; then
        want=$((MOE_LAYERS * 3 * E * MH * DIM * 4))
    else
        want=$((MOE_LAYERS * E * (3 * MH * DIM / 2 + 4 * (2 * MH * (DIM / 32) + DIM * (MH / 32)))))
    fi
    for lay in "-tp 2 -dp 2" "-tp 8 -dcp 8" "-tp 4 -dp 2"; do
        checks=$((checks + 1))
        set -- $lay
        n=$(($2 * ${4:-1}))
        [ "$3" = -dcp ] && n=$2
        got=$(experts_part "$WORK/$m" $lay --enable-expert-parallel)
        if [ -n "$one" ] && [ "$routed" = "$want" ] && [ $((got - router)) = $((routed / n)) ] && [ $((routed % n)) = 0 ]; then
            pass "$m $lay EP: $((got - router)) bytes of routed experts per rank = $routed / $n (+ router $router)"
        else
            fail "$m $lay EP: $got bytes of experts per rank, want $routed / $n + $router (whole: $one, formula $want)"
        fi
    done
done
# the run's weight bytes are the plan's, rank by rank
for name in v3-tp2dp2:-tp\ 2\ -dp\ 2 v3-tp8dcp8dcpc:-tp\ 8\ -dcp\ 8; do
    checks=$((checks + 1))
    h5=${name%%:*} lay=${name#*:}
    got=$("$PLAN" --model "$WORK/v3" $lay --enable-expert-parallel | sed -n 's/^# weight bytes by rank: //p')
    want=$(h5_numbers "$WORK/$h5.h5" /memory/weight_bytes | tr '\n' ' ' | sed 's/ $//')
    if [ -n "$got" ] && [ "$got" = "$want" ]; then
        pass "v3 $lay EP: the plan's weight bytes per rank are the run's: $got"
    else
        fail "v3 $lay EP: plan '$got', run's /memory/weight_bytes '$want'"
    fi
done

expect_error ep-dense 1 "the model has no routed experts" --model "$WORK/dense" --enable-expert-parallel \
    --output "$WORK/x.h5" "$P"
NP=3 expect_error ep-indivisible 1 "routed experts are not divisible by the 3 ranks" --model "$WORK/v3" -dp 3 \
    --enable-expert-parallel --output "$WORK/x.h5" "$P"
checks=$((checks + 1))
if "$PLAN" --model "$WORK/v3" -dp 3 --enable-expert-parallel >"$WORK/plan3.out" 2>&1; then
    fail "dcpinfer-plan: 8 experts over 3 ranks was not refused"
elif grep -q "not divisible by the 3 ranks" "$WORK/plan3.out"; then
    pass "dcpinfer-plan refuses it too: $(cat "$WORK/plan3.out")"
else
    fail "dcpinfer-plan -dp 3 EP: $(cat "$WORK/plan3.out")"
fi
finish
