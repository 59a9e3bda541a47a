#!/bin/bash
# dcpinfer-plan sizes the KV cache as a run does: for stories260K, a GQA
# and an MQA test model and DeepSeek-V2/V3 test models, at several layouts,
# KV budgets, cache dtypes and block sizes, its "KV cache" lines are those
# dcpinfer prints for the same options; a bare config.json plans as its
# folder does; an invalid layout is refused in dcpinfer's words.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
PLAN=$BUILD/dcpinfer-plan
"$MKMODEL" --out "$WORK/gqa" --layers 2 --dim 64 --heads 8 --kv-heads 2 --hidden 128 --vocab 300 --max-len 1024 \
    --seed 1 >/dev/null || exit 1
"$MKMODEL" --out "$WORK/mqa" --layers 3 --dim 64 --heads 4 --kv-heads 1 --hidden 128 --vocab 300 --max-len 4096 \
    --seed 2 >/dev/null || exit 1
"$MKMODEL" --out "$WORK/v3" --arch deepseek_v3 --layers 2 --dim 64 --heads 4 --hidden 128 --vocab 300 --max-len 2048 \
    --seed 3 --kv-lora-rank 16 --qk-rope-dim 8 --qk-nope-dim 8 --v-head-dim 8 --q-lora-rank 32 --experts 8 \
    --experts-per-token 2 --moe-hidden 32 --first-dense 1 >/dev/null || exit 1
"$MKMODEL" --out "$WORK/v2" --arch deepseek_v2 --layers 2 --dim 64 --heads 4 --hidden 128 --vocab 300 --max-len 2048 \
    --seed 4 --kv-lora-rank 24 --qk-rope-dim 8 --qk-nope-dim 8 --v-head-dim 8 --experts 4 --experts-per-token 2 \
    --moe-hidden 32 --first-dense 1 >/dev/null || exit 1
echo '{"id": "a", "prompt_token_ids": [1, 5, 9], "max_tokens": 1, "temperature": 0}' >"$WORK/p.jsonl"
S=$SHARED/models/stories260K

# same NAME NP MODEL-ARGS -- OPTIONS: the plan's KV lines against a run's,
# and its weight bytes of each TP rank against the run's /memory/weight_bytes
# (PLAN_ARGS: the plan's own options besides)
same() {
    local name=$1 np=$2 model=$3; shift 3
    checks=$((checks + 2))
    "$PLAN" $model "$@" ${PLAN_ARGS:-} >"$WORK/$name.plan" 2>&1
    NP=$np run_dcp "$name" $model "$@" --output "$WORK/$name.h5" "$WORK/p.jsonl"
    local want got
    want=$(grep -E '^# (KV cache|Maximum concurrency)' "$WORK/$name.out" | grep -v 'bytes held')
    got=$(grep -E '^# (KV cache|Maximum concurrency)' "$WORK/$name.plan")
    if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
        fail "$name: dcpinfer exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
        return
    elif [ -z "$want" ] || [ "$got" != "$want" ]; then
        fail "$name: plan says '$got', the run '$want'"
    else
        pass "$name: $(echo "$got" | sed -n 2,3p | tr '\n' ' ')"
    fi
    # every DP group holds the TP ranks' weights again
    local tp_ranks dp
    tp_ranks=$(sed -n 's/^# weight bytes by TP rank: //p' "$WORK/$name.plan")
    dp=$((np / $(echo $tp_ranks | wc -w)))
    want=$(h5_numbers "$WORK/$name.h5" /memory/weight_bytes | tr '\n' ' ' | sed 's/ $//')
    got=$(for g in $(seq "$dp"); do echo $tp_ranks; done | tr '\n' ' ' | sed 's/ $//')
    if [ -n "$tp_ranks" ] && [ "$got" = "$want" ]; then
        pass "$name: weight bytes per rank $got, as the run's /memory/weight_bytes"
    else
        fail "$name: plan's weight bytes '$got', the run's /memory/weight_bytes '$want'"
    fi
}

if [ -f "$S/stories260K.bin" ]; then
    same stories-tp8-dcp2 8 "--model $S/stories260K.bin --tokenizer $S/tok512.bin" -tp 8 -dcp 2 --kv-cache-memory 1M
    same stories-tp2-bf16 2 "--model $S/stories260K.bin --tokenizer $S/tok512.bin" -tp 2 --kv-cache-memory 3M \
        --kv-cache-dtype bfloat16 --max-model-len 300
else
    echo "stories260K not found under $SHARED: its cases skipped" >&2
fi
same gqa-tp4-dcp2 4 "--model $WORK/gqa" -tp 4 -dcp 2 --kv-cache-memory 700K --block-size 8
same gqa-dp2 2 "--model $WORK/gqa" -tp 1 -dp 2 --kv-cache-memory 2M --kv-cache-dtype fp8
same mqa-tp4-dcp4 4 "--model $WORK/mqa" -tp 4 -dcp 4 --kv-cache-memory 5M --cp-kv-cache-interleave-size 4 \
    --max-model-len 4000
same v3-tp4-dcp4 4 "--model $WORK/v3" -tp 4 -dcp 4 --kv-cache-memory 1500K
same v3-tp2-bf16 2 "--model $WORK/v3" -tp 2 --kv-cache-memory 2G --kv-cache-dtype bfloat16 --block-size 32
same v2-tp2-dcp2 2 "--model $WORK/v2" -tp 2 -dcp 2 --kv-cache-memory 900K
# with MTP drafts the MTP layer's weights and cache row count as a run loads them
"$MKMODEL" --out "$WORK/v3mtp" --arch deepseek_v3 --layers 2 --dim 64 --heads 4 --hidden 128 --vocab 300 \
    --max-len 2048 --seed 3 --kv-lora-rank 16 --qk-rope-dim 8 --qk-nope-dim 8 --v-head-dim 8 --q-lora-rank 32 \
    --experts 8 --experts-per-token 2 --moe-hidden 32 --first-dense 1 --mtp-layers 1 >/dev/null || exit 1
PLAN_ARGS="--acceptance-length 2" same v3-mtp-tp4-dcp4 4 "--model $WORK/v3mtp" -tp 4 -dcp 4 --kv-cache-memory 1500K \
    --speculative-config '{"method": "mtp", "num_speculative_tokens": 2}'
same default-model 1 "" --kv-cache-memory 64M
same gqa-tp2-bf16 2 "--model $WORK/gqa" -tp 2 --dtype bfloat16 --kv-cache-memory 1M
# the checkpoints' own formats: block-scaled FP8, INT4 W4A16, NVFP4 (both
# layouts, weight-only and W4A4), a V2 with softmax routing
Q=$DCP_SRCDIR/tests/data/deepseek
for q in v3_fp8 v3_int4 v3_nvfp4 v3_nvfp4_modelopt v3_w4a4 v3_w4a4_mo v2_softmax; do
    same "$q-tp2" 2 "--model $Q/$q" -tp 2 --kv-cache-memory 1M
done
same v3_int4-tp4-dcp2 4 "--model $Q/v3_int4" -tp 4 -dcp 2 --kv-cache-memory 1M

# a bare config.json plans as its folder does: the stored formats its
# quantization_config implies are those of the checkpoint
bare() {
    local name=$1 config=$2; shift 2
    checks=$((checks + 1))
    "$PLAN" --model "$config" "$@" | sed 1d >"$WORK/$name.bare"
    if sed 1d "$WORK/$name.plan" | cmp -s - "$WORK/$name.bare"; then
        pass "$name: its config.json alone plans the same: $(grep '^# weight bytes' "$WORK/$name.bare")"
    else
        fail "$name: config.json alone: $(cat "$WORK/$name.bare")"
    fi
}
bare v3-tp4-dcp4 "$WORK/v3/config.json" -tp 4 -dcp 4 --kv-cache-memory 1500K
for q in v3_fp8 v3_int4 v3_nvfp4 v3_nvfp4_modelopt v3_w4a4 v3_w4a4_mo v2_softmax; do
    bare "$q-tp2" "$Q/$q/config.json" -tp 2 --kv-cache-memory 1M
done
bare gqa-tp2-bf16 "$WORK/gqa/config.json" -tp 2 --dtype bfloat16 --kv-cache-memory 1M

# comm NAME NP MODEL -- OPTIONS: a request of G tokens (greedy, or with
# TEMP=1 sampled) decodes in G - 1 steps of one token; each collective's
# bytes and calls on rank 0 in /comm/decode/ are those steps x the plan's
# per decode step (the engine's own step, run on the counting transport).
# The trips to the experts (moe_dispatch, moe_combine) depend on where the
# router sends the token, which the plan takes to be even: their calls
# only.
G=5
comm() {
    local name=$1 np=$2 model=$3 temp=${TEMP:-0}; shift 3
    echo '{"id": "c", "prompt_token_ids": [3, 1, 4, 1, 5, 9, 2, 6], "max_tokens": '$G', "temperature": '$temp', '\
'"ignore_eos": true}' >"$WORK/$name.jsonl"
    "$PLAN" --model "$model" --max-num-seqs 1 --temperature "$temp" "$@" >"$WORK/$name.plan" 2>&1
    NP=$np run_dcp "$name" --model "$model" "$@" --no-enable-prefix-caching --output "$WORK/$name.h5" \
        "$WORK/$name.jsonl"
    local line k step calls want got got_calls seen=""
    line=$(grep '^# decode step of 1 request' "$WORK/$name.plan")
    for k in tp_sum q_allgather merge_exchange all_to_all argmax logits_gather moe_dispatch moe_combine ep_step; do
        step=$(echo "$line" | grep -o "$k [0-9]* B in [0-9]*" | awk '{print $2}')
        calls=$(echo "$line" | grep -o "$k [0-9]* B in [0-9]*" | awk '{print $5}')
        got=$(h5_numbers "$WORK/$name.h5" /comm/decode/$k/bytes | head -1)
        got_calls=$(h5_numbers "$WORK/$name.h5" /comm/decode/$k/calls | head -1)
        [ -z "$step" ] && [ "${got_calls:-0}" = 0 ] && continue
        checks=$((checks + 1))
        seen="$seen $k"
        want=$(( (G - 1) * ${step:-0} ))
        case $k in moe_*) got=$want ;; esac
        if [ -n "$line" ] && [ "$got" = "$want" ] && [ "$got_calls" = $(( (G - 1) * ${calls:-0} )) ]; then
            pass "$name $k: $got bytes in $got_calls calls = $((G - 1)) steps x $step B in $calls"
        else
            fail "$name $k: the run's rank 0 sent '$got' bytes in '$got_calls' calls, the plan says $want ($line)"
        fi
    done
    checks=$((checks + 1))
    if [ -n "$seen" ]; then pass "$name: collectives compared:$seen"; else fail "$name: nothing to compare ($line)"; fi
}
comm comm-gqa-tp4-dcp2 4 "$WORK/gqa" -tp 4 -dcp 2
comm comm-v3-tp4-dcp4-a2a 4 "$WORK/v3" -tp 4 -dcp 4 --dcp-comm-backend a2a
comm comm-mqa-tp4-dcp4 4 "$WORK/mqa" -tp 4 -dcp 4
TEMP=1 comm comm-gqa-tp2-sampled 2 "$WORK/gqa" -tp 2
comm comm-v3-tp2-dp2-ep 4 "$WORK/v3" -tp 2 -dp 2 --enable-expert-parallel
# the plan's even routing: a token's 2 experts of 8 on two of the 4 ranks,
# one of them rank 0 itself, and a balanced exchange: 8 B of counts to
# each other rank, one row of 64 floats away and one back, and the TP
# gather of the combined row to the other TP rank
line=$(grep '^# decode step of 1 request' "$WORK/comm-v3-tp2-dp2-ep.plan")
checks=$((checks + 1))
if echo "$line" | grep -q 'moe_dispatch 280 B in 2 call(s), moe_combine 512 B in 2 call(s)'; then
    pass "v3 tp 2 dp 2 EP: per MoE layer 3 x 8 B of counts + 256 B of a row out, 256 B back + 256 B gathered"
else
    fail "v3 tp 2 dp 2 EP: the even routing's bytes are not 280 B out and 512 B back: $line"
fi

# The shipped real configs on 8 GPUs: every layout listed (tp dividing 8,
# dcp dividing tp); an MLA model's KV cache at dcp 8 holds 8 times the
# tokens of dcp 1 at tp 8 in the same KV memory per rank (given: the
# activation peak, and so what --gpu-memory-utilization leaves, differs
# with dcp); a GQA model's dcp is capped by its KV heads (Llama-3.1-70B's and
# GLM-4.5's 8: none; Qwen3-235B-A22B's 4: dcp 2 at tp 8, twice dcp 1's
# tokens).
C=$DCP_SRCDIR/tests/data/configs
for cfg in deepseek-v3 kimi-k2-instruct kimi-k2-thinking llama-3.1-70b-instruct qwen3-235b-a22b glm-4.5; do
    checks=$((checks + 2))
    "$PLAN" --model "$C/$cfg.config.json" --gpus 8 --sweep --gpu B200 --input-len 67000 --output-len 1000 \
        --kv-cache-dtype bfloat16 --kv-cache-memory 10G >"$WORK/$cfg.sweep" 2>&1
    rows=$(grep -v '^#' "$WORK/$cfg.sweep" | awk '{print $1 "/" $2 "/" $3}' | tr '\n' ' ')
    if [ "$rows" = "1/1/8 2/1/4 2/2/4 4/1/2 4/2/2 4/4/2 8/1/1 8/2/1 8/4/1 8/8/1 " ]; then
        pass "$cfg: --sweep lists the 10 layouts of 8 GPUs"
    else
        fail "$cfg: --sweep lists '$rows'"; cat "$WORK/$cfg.sweep" >&2
    fi
    case $cfg in
    llama* | glm*)
        capped=$(awk '!/^#/ && $2 > 1 && /refused: invalid layout: -dcp [0-9]+ needs -tp above the model.s 8 KV heads/' \
            "$WORK/$cfg.sweep" | wc -l)
        valid=$(awk '!/^#/ && $2 == 1 && !/refused/' "$WORK/$cfg.sweep" | wc -l)
        if [ "$capped" = 6 ] && [ "$valid" = 4 ]; then
            pass "$cfg: 8 KV heads: every dcp > 1 refused (6 layouts), every dcp 1 planned (4)"
        else
            fail "$cfg: $capped layouts with dcp > 1 refused for the KV heads, $valid with dcp 1 planned"
        fi ;;
    qwen*)
        capped=$(grep -cE 'refused: invalid layout: -dcp [0-9]+ (needs -tp above the model.s 4 KV heads|is above tp/kv_heads = 8/4 = 2)' \
            "$WORK/$cfg.sweep")
        t1=$(awk '!/^#/ && $1 == 8 && $2 == 1 {print $7}' "$WORK/$cfg.sweep")
        t2=$(awk '!/^#/ && $1 == 8 && $2 == 2 {print $7}' "$WORK/$cfg.sweep")
        if [ "$capped" = 5 ] && [ -n "$t1" ] && [ "$t1" -gt 0 ] && [ "$t2" = $((2 * t1)) ]; then
            pass "$cfg: 4 KV heads: 5 layouts refused; tp 8 dcp 2 holds $t2 tokens, 2 x dcp 1's $t1"
        else
            fail "$cfg: $capped layouts refused for the KV heads; tp 8: dcp 1 holds '$t1' tokens, dcp 2 '$t2'"
        fi ;;
    *)
        t1=$(awk '!/^#/ && $1 == 8 && $2 == 1 {print $7}' "$WORK/$cfg.sweep")
        t8=$(awk '!/^#/ && $1 == 8 && $2 == 8 {print $7}' "$WORK/$cfg.sweep")
        if [ -n "$t1" ] && [ "$t1" -gt 0 ] && [ "$t8" = $((8 * t1)) ]; then
            pass "$cfg: tp 8 dcp 8 holds $t8 tokens, 8 x dcp 1's $t1"
        else
            fail "$cfg: tp 8: dcp 1 holds '$t1' tokens, dcp 8 '$t8'"
        fi ;;
    esac
done

# Llama-3.1-70B at tp 8, bf16 as its torch_dtype says, by hand: the bf16
# embedding's 16,032 rows of the vocabulary's 128,256 (vocabulary-parallel,
# as the LM head); per layer 8 of 64 query heads, 1 of 8 KV heads, o's
# 1,024 columns, 3,584 of 28,672 feed-forward rows, two fp32 norms; 16,032
# LM head rows and the final norm.
checks=$((checks + 1))
dim=8192 hd=128
attn=$(( (8 * hd * dim + 2 * hd * dim + dim * 8 * hd) * 2 + dim * 4 ))
mlp=$(( 3 * 3584 * dim * 2 + dim * 4 ))
want=$(( 16032 * dim * 2 + 80 * (attn + mlp) + 16032 * dim * 2 + dim * 4 ))
got=$("$PLAN" --model "$C/llama-3.1-70b-instruct.config.json" -tp 8 | sed -n 's/^# weight bytes by TP rank: \([0-9]*\) .*/\1/p')
if [ "$got" = "$want" ]; then
    pass "Llama-3.1-70B tp 8: $got weight bytes on rank 0, as counted by hand"
else
    fail "Llama-3.1-70B tp 8: the plan says '$got' weight bytes on rank 0, by hand $want"
fi

# a config at the bounds dcpinfer accepts plans in seconds: every dimension
# at its maximum and 1,048,576 expert slots (16 layers x 65,536 routed
# experts, every tensor named, sized and checked), or 4,096 dense layers;
# one expert slot more is refused. The timeout guards against a hang; the
# time itself is printed, not held. A sanitizer build (ten times slower)
# checks the refusal only.
max_cfg() {
    python3 - "$C/kimi-k2-instruct.config.json" "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for kv in sys.argv[2:]:
    k, v = kv.split("=")
    c[k] = int(v)
print(json.dumps(c))
PY
}
dims="hidden_size=131072 intermediate_size=1048576 moe_intermediate_size=1048576 vocab_size=16777216 max_position_embeddings=16777216 num_nextn_predict_layers=4096"
max_cfg $dims num_hidden_layers=16 n_routed_experts=65536 first_k_dense_replace=0 >"$WORK/max-moe.json"
max_cfg $dims num_hidden_layers=4096 n_routed_experts=256 first_k_dense_replace=4096 >"$WORK/max-dense.json"
max_cfg num_hidden_layers=17 n_routed_experts=65536 >"$WORK/over.json"
"$BUILD/dcpinfer" --version | grep -q '^sanitizers: no' && maxima="max-moe max-dense" || maxima=
for cfg in $maxima; do
    checks=$((checks + 1))
    t0=$(date +%s.%N)
    timeout 600 "$PLAN" --model "$WORK/$cfg.json" -tp 8 --gpu B200 >"$WORK/$cfg.plan" 2>&1
    rc=$?
    t=$(echo "$t0 $(date +%s.%N)" | awk '{printf "%.1f", $2 - $1}')
    if [ "$rc" = 0 ] && grep -q '^# fits: no' "$WORK/$cfg.plan"; then
        pass "$cfg: planned in $t s: $(grep '^# weight bytes by TP rank' "$WORK/$cfg.plan" | cut -c1-60)"
    else
        fail "$cfg: exit $rc after $t s: $(tail -2 "$WORK/$cfg.plan")"
    fi
done
checks=$((checks + 1))
"$PLAN" --model "$WORK/over.json" -tp 8 >"$WORK/over.plan" 2>&1
rc=$?
if [ "$rc" = 2 ] && grep -q '17 layers x 65536 routed experts is above 1048576 expert slots' "$WORK/over.plan"; then
    pass "17 x 65,536 experts refused: $(cat "$WORK/over.plan")"
else
    fail "17 x 65,536 experts: exit $rc: $(cat "$WORK/over.plan")"
fi

# a small model's sizes in KiB (or MiB), not as 0.00 GiB
checks=$((checks + 1))
"$PLAN" --model "$WORK/gqa" --gpu-memory 64M >"$WORK/small.plan" 2>&1
b=$(sed -n 's/^# weight bytes by TP rank: \([0-9]*\)$/\1/p' "$WORK/small.plan")
w=$(sed -n 's/^# weights per rank: \([0-9.]*\) KiB (.* KiB)$/\1/p' "$WORK/small.plan")
if [ -n "$b" ] && [ "$w" = "$(awk -v b="$b" 'BEGIN {printf "%.2f", b / 1024}')" ] &&
    grep -q '^# model: .*; 64.00 MiB x 0.90 per GPU' "$WORK/small.plan" &&
    grep -q '^# Available KV cache memory: [0-9.]* MiB (--kv-cache-memory [0-9]*)$' "$WORK/small.plan"; then
    pass "small model: weights $w KiB ($b bytes), memory in MiB"
else
    fail "small model's sizes: $(grep -E '^# (weights|model|Available)' "$WORK/small.plan")"
fi

# --format json says what the table says; Kimi K2 Thinking's INT4 experts
# by hand: 60 MoE layers of 384 experts, each rank 256 of 2,048 rows; gate
# and up 256 x 7,168 nibbles with an fp32 scale per row and group of 32,
# down 7,168 x 256 the same; the router fp32 (one float of slack per
# vector, as the loader allocates it)
checks=$((checks + 2))
k2=(--model "$C/kimi-k2-thinking.config.json" --gpu H200 -tp 8 -dcp 8 --kv-cache-dtype bfloat16 --input-len 67000
    --output-len 1000)
"$PLAN" "${k2[@]}" >"$WORK/k2.table"
"$PLAN" "${k2[@]}" --format json >"$WORK/k2.json"
tokens=$(sed -n 's/^# KV cache size: \([0-9]*\) tokens/\1/p' "$WORK/k2.table")
weights=$(sed -n 's/^# weight bytes by TP rank: \([0-9]*\) .*/\1/p' "$WORK/k2.table")
if [ -n "$tokens" ] && grep -q "\"kv_cache_tokens\": $tokens," "$WORK/k2.json" &&
    grep -q "\"weight_bytes_per_rank\": $weights," "$WORK/k2.json" && grep -q '"fits": true' "$WORK/k2.json" &&
    grep -q '"decode_step_seconds"' "$WORK/k2.json"; then
    pass "Kimi K2 Thinking on 8 H200 at tp 8 dcp 8: JSON and table agree ($tokens KV tokens, $weights weight bytes)"
else
    fail "Kimi K2 Thinking: the JSON does not say the table's $tokens tokens and $weights bytes"; cat "$WORK/k2.json" >&2
fi
expert=$(( 2 * (256 * 7168 / 2 + 256 * 224 * 4) + 7168 * 256 / 2 + 7168 * 8 * 4 ))
want=$(( 60 * (384 * expert + (384 * 7168 + 1) * 4 + (384 + 1) * 4) ))
if grep -q "\"experts\": $want," "$WORK/k2.json"; then
    pass "Kimi K2 Thinking tp 8: $want bytes of routed experts and router per rank, as counted by hand"
else
    fail "Kimi K2 Thinking tp 8: by hand $want bytes of experts, the plan: $(grep '"experts"' "$WORK/k2.json")"
fi

# Kimi K2's shapes in W4A4 NVFP4 (compressed-tensors' NVFP4 scheme on the
# routed experts): planned on 8 B200s at tp 8 and tp 8 dcp 8 and on 8
# H200s; the experts by hand: gate and up 256 x 7,168 nibbles, down
# 7,168 x 256, each with a 1-byte FP8 code per 16 and a table of
# WEIGHT_TABLE (260) floats per matrix; the router as above
for case in "B200 1" "B200 8" "H200 1"; do
    set -- $case
    checks=$((checks + 1))
    "$PLAN" --model "$C/kimi-k2-nvfp4.config.json" --gpu "$1" -tp 8 -dcp "$2" --kv-cache-dtype bfloat16 \
        --input-len 67000 --output-len 1000 --format json >"$WORK/k2fp4-$1-$2.json" 2>&1
    expert=$(( 3 * (256 * 7168 / 2 + 256 * 7168 / 16 + 260 * 4) ))
    want=$(( 60 * (384 * expert + (384 * 7168 + 1) * 4 + (384 + 1) * 4) ))
    if grep -q '"fits": true' "$WORK/k2fp4-$1-$2.json" && grep -q "\"experts\": $want," "$WORK/k2fp4-$1-$2.json" &&
        grep -q '"kv_cache_tokens": [1-9]' "$WORK/k2fp4-$1-$2.json"; then
        pass "Kimi K2 W4A4 NVFP4 on 8 $1 at tp 8 dcp $2: fits, $want bytes of experts and router per rank as by hand"
    else
        fail "Kimi K2 W4A4 NVFP4 on 8 $1 at tp 8 dcp $2"; cat "$WORK/k2fp4-$1-$2.json" >&2
    fi
done

# speculative decoding: a verification step of K = 3 drafts carries 4 rows
# per request through every row-proportional collective (the TP sums and
# the DCP merges four times a decode step's bytes), and outputs
# --acceptance-length tokens per request
checks=$((checks + 1))
"$PLAN" --model "$C/deepseek-v3.config.json" --gpu H200 -tp 8 -dcp 8 --input-len 67000 --output-len 1000 \
    --max-num-seqs 8 --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}' --acceptance-length 2.5 \
    --format json >"$WORK/spec.json" 2>&1
if python3 - "$WORK/spec.json" <<'PY'; then
import json, sys
L = json.load(open(sys.argv[1]))["layouts"][0]
d, v, e = L["comm_per_decode_step"], L["comm_per_verification_step"], L["estimate_speculative"]
for k in ("tp_sum", "merge_exchange"):
    assert v[k]["bytes"] == 4 * d[k]["bytes"] and v[k]["calls"] == d[k]["calls"], k
assert e["draft_tokens"] == 3 and e["acceptance_length"] == 2.5
assert abs(e["tokens_per_second"] - L["running_requests"] * 2.5 / e["step_seconds"]) < 1e-6 * e["tokens_per_second"]
assert e["step_seconds"] > L["estimate"]["decode_step_seconds"]
PY
    pass "DeepSeek-V3 tp 8 dcp 8, K = 3: a verification step's TP sums and merges carry 4 rows per request, $(grep -o '"tokens_per_second": [0-9.]*' "$WORK/spec.json" | tail -1)"
else
    fail "DeepSeek-V3 with --speculative-config: the verification step's estimate is off"; cat "$WORK/spec.json" >&2
fi

# MTP drafts: the same verification, plus the MTP layer's three passes (a
# catch-up, two draft steps): a draft step sends one layer's share of a
# decode step's TP sums (the embedding's and the layer's two), DCP query
# gathers and merges; the passes read the MTP layer's cache row, a 61st of
# the model's KV, three times; the model's own weights read are the ngram
# estimate's
checks=$((checks + 1))
"$PLAN" --model "$C/deepseek-v3.config.json" --gpu H200 -tp 8 -dcp 8 --input-len 67000 --output-len 1000 \
    --max-num-seqs 8 --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' --acceptance-length 2.5 \
    --format json >"$WORK/spec-mtp.json" 2>&1
if python3 - "$WORK/spec.json" "$WORK/spec-mtp.json" <<'PY'; then
import json, sys
N = json.load(open(sys.argv[1]))["layouts"][0]
M = json.load(open(sys.argv[2]))["layouts"][0]
d, s, mtp = M["comm_per_decode_step"], M["comm_per_mtp_draft_step"], M["mtp"]
assert d == N["comm_per_decode_step"] and M["running_requests"] == N["running_requests"] == 8
assert s["tp_sum"]["calls"] == 3 and s["tp_sum"]["bytes"] * d["tp_sum"]["calls"] == 3 * d["tp_sum"]["bytes"]
for k in ("q_allgather", "merge_exchange"):
    assert s[k]["calls"] * 61 == d[k]["calls"] and s[k]["bytes"] * 61 == d[k]["bytes"], k
assert mtp["passes"] == 3 and mtp["weight_bytes"] > 0 and mtp["weight_bytes_read"] > 0
assert abs(mtp["kv_bytes_read"] - 3 * N["estimate"]["kv_bytes_read"] / 61) < 1e-9 * mtp["kv_bytes_read"]
e, n = M["estimate_speculative"], N["estimate_speculative"]
assert e["weight_bytes_read"] - mtp["weight_bytes_read"] == n["weight_bytes_read"]
assert e["bytes_sent"] > n["bytes_sent"] and e["step_seconds"] > n["step_seconds"]
assert M["weight_bytes_per_rank"] == N["weight_bytes_per_rank"] + mtp["weight_bytes"]
PY
    pass "DeepSeek-V3 tp 8 dcp 8, MTP K = 3: a draft step sends one layer's collectives, $(python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))["layouts"][0]["mtp"]; print("%.2f GB of the MTP layer read in %d passes" % (m["weight_bytes_read"] / 1e9, m["passes"]))' "$WORK/spec-mtp.json")"
else
    fail "DeepSeek-V3 with MTP: the estimate is off"; cat "$WORK/spec-mtp.json" >&2
fi

# the plan's own options refuse what they cannot mean
refuse() {
    local why=$1; shift
    checks=$((checks + 1))
    "$PLAN" --model "$WORK/gqa" "$@" >"$WORK/refuse.out" 2>&1
    local rc=$?
    if [ "$rc" = 2 ] && grep -qF -- "$why" "$WORK/refuse.out"; then
        pass "$*: refused: $(cat "$WORK/refuse.out")"
    else
        fail "$*: exit $rc: $(cat "$WORK/refuse.out")"
    fi
}
refuse "--gpu: 'X100' is not one of H100, H200, B200, MI300X" --gpu X100
refuse "--gpus 8 is not -tp 4 x -dp 4" --gpus 8 -tp 4 -dp 4
refuse "--gpu-memory-utilization: '1.5' is not in (0, 1]" --gpu-memory-utilization 1.5
refuse "the model has no routed experts" --enable-expert-parallel
refuse "give --acceptance-length A, the tokens a verification outputs on average, from 1 to 3" \
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 2}'
refuse "speculative decoding with \"mtp\" needs a DeepSeek model with multi-token-prediction layers" \
    --speculative-config '{"method": "mtp", "num_speculative_tokens": 2}' --acceptance-length 2

checks=$((checks + 1))
"$PLAN" --model "$WORK/gqa" -tp 4 -dcp 4 >"$WORK/bad.plan" 2>&1
rc=$?
NP=4 run_dcp bad --model "$WORK/gqa" -tp 4 -dcp 4 --output "$WORK/bad.h5" "$WORK/p.jsonl"
why=$(sed 's/^dcpinfer-plan: //' "$WORK/bad.plan")
if [ "$rc" = 2 ] && [ -n "$why" ] && grep -qF -- "$why" "$WORK/bad.err"; then
    pass "-tp 4 -dcp 4 with 2 KV heads refused as dcpinfer refuses it: $why"
else
    fail "refusal: exit $rc, '$(cat "$WORK/bad.plan")'; dcpinfer: $(cat "$WORK/bad.err")"
fi
finish
