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

# same NAME NP MODEL-ARGS -- OPTIONS: the plan's KV lines against a run's
same() {
    local name=$1 np=$2 model=$3; shift 3
    checks=$((checks + 1))
    "$PLAN" $model "$@" >"$WORK/$name.plan" 2>&1
    NP=$np run_dcp "$name" $model "$@" --output "$WORK/$name.h5" "$WORK/p.jsonl"
    local want got
    want=$(grep -E '^# (KV cache|Maximum concurrency)' "$WORK/$name.out" | grep -v 'bytes held')
    got=$(grep -E '^# (KV cache|Maximum concurrency)' "$WORK/$name.plan")
    if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
        fail "$name: dcpinfer exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
    elif [ -z "$want" ] || [ "$got" != "$want" ]; then
        fail "$name: plan says '$got', the run '$want'"
    else
        pass "$name: $(echo "$got" | sed -n 2,3p | tr '\n' ' ')"
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
same default-model 1 "" --kv-cache-memory 64M

checks=$((checks + 1))
"$PLAN" --model "$WORK/v3/config.json" -tp 4 -dcp 4 --kv-cache-memory 1500K >"$WORK/json.plan" 2>&1
if cmp -s "$WORK/json.plan" "$WORK/v3-tp4-dcp4.plan"; then
    pass "a bare config.json plans as its folder does"
else
    fail "config.json: $(cat "$WORK/json.plan")"
fi

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
