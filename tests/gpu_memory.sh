#!/bin/sh
# --gpu-memory-utilization on a GPU backend (the HIP-CPU suite runs it;
# skips where dcpinfer has no CUDA backend): with a device memory of a
# stated size (DCPINFER_GPU_MEMORY), each rank's KV cache is that memory x
# the share, less the weights and the profiled activation peak of a step
# of --max-num-batched-tokens, and it is what dcpinfer-plan predicts for
# the same run to the byte (the budget lines and the KV cache lines
# equal), for a GQA model at tp 4 dcp 2, a DeepSeek-V3 model at tp 2 and
# with expert parallelism; --kv-cache-memory overrides it; a budget the
# weights fill is refused with the numbers, before the weights reach the
# device.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
PLAN=$BUILD/dcpinfer-plan
"$MKMODEL" --out "$WORK/gqa" --layers 2 --dim 64 --heads 8 --kv-heads 2 --hidden 128 --vocab 300 --max-len 1024 \
    --seed 1 >/dev/null || exit 1
"$MKMODEL" --out "$WORK/v3" --arch deepseek_v3 --dtype bf16 --layers 2 --dim 64 --heads 4 --hidden 128 --vocab 300 \
    --max-len 2048 --seed 3 --kv-lora-rank 16 --qk-rope-dim 8 --qk-nope-dim 8 --v-head-dim 8 --q-lora-rank 32 \
    --experts 8 --experts-per-token 2 --moe-hidden 32 --first-dense 1 >/dev/null || exit 1
printf '{"id": "a", "prompt_token_ids": [5, 17, 200, 31], "max_tokens": 3}\n' >"$WORK/p.jsonl"
run_dcp probe --backend cuda --model "$WORK/gqa" --kv-cache-memory 1M --output "$WORK/probe.h5" "$WORK/p.jsonl"
if grep -qE "built without CUDA|no usable GPU" "$WORK/probe.err"; then
    echo "$(cat "$WORK/probe.err"): skipped" >&2
    exit 77
fi

# same NAME NP MEMORY MODEL OPTIONS...: the run's budget and KV lines are the plan's
same() {
    local name=$1 np=$2 mem=$3 model=$4; shift 4
    checks=$((checks + 1))
    "$PLAN" --model "$model" --gpu-memory "$mem" "$@" >"$WORK/$name.plan" 2>&1
    DCPINFER_GPU_MEMORY=$mem NP=$np run_dcp "$name" --backend cuda --model "$model" "$@" --output "$WORK/$name.h5" \
        "$WORK/p.jsonl"
    local want got
    got=$(grep -E '^# (GPU memory|Available KV|KV cache|Maximum concurrency)' "$WORK/$name.out" | grep -v 'bytes held')
    want=$(grep -E '^# (GPU memory|Available KV|KV cache|Maximum concurrency)' "$WORK/$name.plan")
    if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
        fail "$name: dcpinfer exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
    elif ! echo "$got" | grep -q '^# Available KV cache memory: .*(--kv-cache-memory [0-9]*)'; then
        fail "$name: no budget in the run's lines: '$got'"
    elif [ "$got" != "$want" ]; then
        fail "$name: the run says '$got', the plan '$want'"
    else
        pass "$name: $(echo "$got" | grep -o 'kv-cache-memory [0-9]*'), as planned"
    fi
}
same gqa-tp4-dcp2 4 64M "$WORK/gqa" -tp 4 -dcp 2 --max-num-batched-tokens 256
same v3-tp2 2 96M "$WORK/v3" -tp 2 --max-num-batched-tokens 256
same v3-ep2 2 96M "$WORK/v3" -tp 2 --max-num-batched-tokens 256 --enable-expert-parallel --gpu-memory-utilization 0.5

# the budget by hand: 64M x 0.9 - weights - activations
checks=$((checks + 1))
line=$(grep '^# GPU memory' "$WORK/gqa-tp4-dcp2.plan")
w=$(h5_numbers "$WORK/gqa-tp4-dcp2.h5" /memory/weight_bytes | sort -n | tail -1)
"$PLAN" --model "$WORK/gqa" --gpu-memory 64M -tp 4 -dcp 2 --max-num-batched-tokens 256 --format json >"$WORK/gqa.json"
a=$(grep -o '"activation_bytes_per_rank": [0-9]*' "$WORK/gqa.json" | grep -o '[0-9]*$')
kv=$(grep -o 'kv-cache-memory [0-9]*' "$WORK/gqa-tp4-dcp2.out" | head -1 | grep -o '[0-9]*$')
want=$((64 * 1048576 * 9 / 10 - w - a))
if [ -n "$a" ] && [ "$a" -gt 0 ] && [ "$kv" = "$want" ]; then
    pass "gqa: KV $kv bytes = 64 MiB x 0.9 - weights $w - activation peak $a"
else
    fail "gqa: KV '$kv' bytes, by hand 64 MiB x 0.9 - weights '$w' - activations '$a' = $want ($line)"
fi

# --kv-cache-memory overrides the budget
checks=$((checks + 1))
DCPINFER_GPU_MEMORY=64M run_dcp given --backend cuda --model "$WORK/gqa" --kv-cache-memory 1M \
    --output "$WORK/given.h5" "$WORK/p.jsonl"
if [ "$(cat "$WORK/given.rc")" = 0 ] && ! grep -q '^# GPU memory' "$WORK/given.out" &&
    grep -q '^# KV cache: 256 blocks of 16 positions' "$WORK/given.out"; then
    pass "--kv-cache-memory 1M: 256 blocks, no budget"
else
    fail "--kv-cache-memory 1M: exit $(cat "$WORK/given.rc"): $(grep '^# KV cache:' "$WORK/given.out")"
    cat "$WORK/given.err" >&2
fi

# refused: weights that fill the share; a memory that is not a size
checks=$((checks + 1))
DCPINFER_GPU_MEMORY=100K NP=2 run_dcp small --backend cuda --model "$WORK/v3" -tp 2 --output "$WORK/small.h5" \
    "$WORK/p.jsonl"
w=$(grep -o 'weights ([0-9]* bytes a rank)' "$WORK/small.err" | grep -o '[0-9]*')
if [ "$(cat "$WORK/small.rc")" = 2 ] && grep -q "92160 bytes of the GPU's 102400, less the weights ([0-9]* bytes a rank), leave nothing for the KV cache" "$WORK/small.err" &&
    [ "${w:-0}" -gt 92160 ] && [ ! -e "$WORK/small.h5" ]; then
    pass "100K x 0.9 for $w bytes of weights: refused, no output"
else
    fail "100K: exit $(cat "$WORK/small.rc"): $(cat "$WORK/small.err")"
fi
checks=$((checks + 1))
DCPINFER_GPU_MEMORY=lots run_dcp notsize --backend cuda --model "$WORK/gqa" --output "$WORK/notsize.h5" "$WORK/p.jsonl"
if [ "$(cat "$WORK/notsize.rc")" != 0 ] && grep -q "DCPINFER_GPU_MEMORY: 'lots' is not a size" "$WORK/notsize.err"; then
    pass "DCPINFER_GPU_MEMORY=lots: refused"
else
    fail "DCPINFER_GPU_MEMORY=lots: exit $(cat "$WORK/notsize.rc"): $(cat "$WORK/notsize.err")"
fi
finish
