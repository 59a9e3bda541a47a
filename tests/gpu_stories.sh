#!/bin/sh
# End to end on a backend (DCP_E2E_BACKEND, default cuda): stories260K
# greedy gives the tokens of llama2.c's run.c (cases 1 and 2), as the CPU
# backend on one rank does, on one rank and on layouts the model allows:
# tp 2, and tp 8 with dcp 2 (4 KV heads: 2 ranks per head), with both
# merges and with MPI staged through host memory, and with a bf16 KV
# cache; an MQA model (1 KV head) at tp 2 dcp 2 gives the tokens of the
# CPU on one rank, and so do the DeepSeek-V3 model at tp 2 dcp 2, tp 8
# dcp 8 and tp 4 dcp 4 (both merges, both MPI buffer modes; one run with
# every launch checked, DCPINFER_CUDA_SYNC=1), the FP8 DeepSeek-V3 model
# with an FP8 latent cache, and the DeepSeek-V2 model; DeepSeek-V3 with
# expert parallelism at one rank, tp 4 dcp 4 and tp 2 dp 2.
# Skips without a GPU. tests/stories_layouts.sh runs the same layouts on the CPU backend in
# every suite, so that a layout the model refuses cannot hide here.
# DCP_E2E_QUICK=1 (scripts/test.sh, where HIP-CPU runs the kernels on two
# cores at a fifteenth of the speed) runs each model and feature once: the
# layouts that split and merge every way (tp with dcp, a2a, staged MPI
# buffers, expert parallelism with dp), not each of them apart.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
BACKEND=${DCP_E2E_BACKEND:-cuda}
model=$SHARED/models/stories260K
[ -f "$model/stories260K.bin" ] || { echo "stories260K not found under $SHARED: skipped" >&2; exit 77; }
command -v h5dump >/dev/null 2>&1 || { echo "h5dump not installed: skipped" >&2; exit 77; }
P=$WORK/p.jsonl
printf '{"id": "c1", "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0}\n{"id": "c2", "prompt": "", "max_tokens": 256, "temperature": 0}\n' >"$P"
M="--model $model/stories260K.bin --tokenizer $model/tok512.bin"
if [ "$BACKEND" = cuda ]; then
    run_dcp probe $M --backend cuda --max-tokens 1 --output "$WORK/probe.h5" "$P"
    if grep -qE "built without CUDA|no usable GPU" "$WORK/probe.err"; then
        echo "$(cat "$WORK/probe.err"): skipped" >&2
        exit 77
    fi
fi
dump() { h5dump -d /requests/output_tokens "$1" | sed -n '/DATA {/,$p'; }
run_dcp cpu $M --output "$WORK/cpu.h5" "$P"
# the first greedy tokens of run.c's case 1, after the prompt 1 403 407 261 378
checks=$((checks + 1))
if dump "$WORK/cpu.h5" | grep -q '(0): 432, 383, 286, 261, 376, 298'; then pass "CPU run matches run.c"; else fail "CPU run"; fi

# run_layouts REFERENCE MODEL_ARGS LAYOUT...: each layout on $BACKEND gives
# the reference's tokens
run_layouts() {
    ref=$1 args=$2
    shift 2
    for layout in "$@"; do
        checks=$((checks + 1))
        name=$BACKEND$(echo "$layout $args" | md5sum | cut -c1-8)
        np=$(echo " $layout" | sed -n 's/.* -tp \([0-9]*\).*/\1/p') dp=$(echo " $layout" | sed -n 's/.* -dp \([0-9]*\).*/\1/p')
        NP=$((${np:-1} * ${dp:-1})) run_dcp "$name" $args --backend "$BACKEND" $layout --output "$WORK/$name.h5" "$P"
        if [ "$(cat "$WORK/$name.rc")" = 0 ] && [ "$(dump "$ref")" = "$(dump "$WORK/$name.h5")" ]; then
            pass "$BACKEND $layout: the reference tokens"
        else
            fail "$BACKEND $layout: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
        fi
    done
}
quick() { [ -n "${DCP_E2E_QUICK:-}" ]; }
if quick; then run_layouts "$WORK/cpu.h5" "$M" "" "-tp 8 -dcp 2 --dcp-comm-backend a2a --mpi-device-buffers no"
else run_layouts "$WORK/cpu.h5" "$M" "" "-tp 2" "-tp 8 -dcp 2" "-tp 8 -dcp 2 --dcp-comm-backend a2a --mpi-device-buffers no"; fi
# a bf16 KV cache: the CPU's tokens with the same cache
run_dcp cpu-bf16 $M --kv-cache-dtype bfloat16 --output "$WORK/cpu-bf16.h5" "$P"
if quick; then run_layouts "$WORK/cpu-bf16.h5" "$M --kv-cache-dtype bfloat16" "-tp 2"
else run_layouts "$WORK/cpu-bf16.h5" "$M --kv-cache-dtype bfloat16" "" "-tp 2"; fi

# MQA: one KV head, so tp 2 can split its cache with dcp 2
"$MKMODEL" --out "$WORK/mqa" --layers 2 --dim 64 --heads 8 --kv-heads 1 --hidden 96 --vocab 512 >/dev/null
printf '{"id": "m1", "prompt_token_ids": [1, 403, 407, 261, 378], "max_tokens": 40, "temperature": 0}\n{"id": "m2", "prompt_token_ids": [1], "max_tokens": 90, "temperature": 0}\n' >"$P"
run_dcp mqa-cpu --model "$WORK/mqa" --output "$WORK/mqa-cpu.h5" "$P"
if quick; then run_layouts "$WORK/mqa-cpu.h5" "--model $WORK/mqa" "-tp 2 -dcp 2"
else run_layouts "$WORK/mqa-cpu.h5" "--model $WORK/mqa" "" "-tp 2 -dcp 2" "-tp 2 -dcp 2 --dcp-comm-backend a2a"; fi

# DeepSeek-V3 (latent attention, experts): the CPU's tokens at one rank,
# and with the latent cache split 8 ways. The DeepSeek runs give their KV
# cache (NOPROF): no profiling step of 2048 tokens, which HIP-CPU takes
# 15 s over (tests/gpu_memory.sh checks the profiling)
NOPROF="--kv-cache-memory 64M"
DS=$SRC/tests/data/deepseek/v3_yarn
printf '{"id": "d1", "prompt_token_ids": [%s], "max_tokens": 32, "temperature": 0}\n' "$(tr ' ' ',' <"$DS/prompt.txt" | tr -d '\n' | sed 's/,$//')" >"$P"
run_dcp ds-cpu --model "$DS" --output "$WORK/ds-cpu.h5" "$P"
if quick; then run_layouts "$WORK/ds-cpu.h5" "--model $DS $NOPROF" "" "-tp 4 -dcp 4 --dcp-comm-backend a2a --mpi-device-buffers no"
else
    run_layouts "$WORK/ds-cpu.h5" "--model $DS $NOPROF" "" "-tp 2 -dcp 2" "-tp 8 -dcp 8" "-tp 4 -dcp 4" \
        "-tp 4 -dcp 4 --dcp-comm-backend a2a" "-tp 4 -dcp 4 --mpi-device-buffers no" \
        "-tp 4 -dcp 4 --dcp-comm-backend a2a --mpi-device-buffers no"
fi
# expert parallelism: whole experts, rows dispatched and combined between
# the ranks (device buffers, and staged), DP groups in step
if quick; then run_layouts "$WORK/ds-cpu.h5" "--model $DS $NOPROF --enable-expert-parallel" "-tp 2 -dp 2 --mpi-device-buffers no"
else
    run_layouts "$WORK/ds-cpu.h5" "--model $DS $NOPROF --enable-expert-parallel" "" "-tp 4 -dcp 4" \
        "-tp 4 -dcp 4 --mpi-device-buffers no" "-tp 2 -dp 2 --mpi-device-buffers no"
fi
# a bf16 latent cache, every launch checked against a GPU's limits and waited for
run_dcp ds-cpu-bf16 --model "$DS" --kv-cache-dtype bfloat16 --output "$WORK/ds-cpu-bf16.h5" "$P"
export DCPINFER_CUDA_SYNC=1
run_layouts "$WORK/ds-cpu-bf16.h5" "--model $DS $NOPROF --kv-cache-dtype bfloat16" "-tp 2 -dcp 2"
unset DCPINFER_CUDA_SYNC
# FP8 weights as stored (block-scaled) with an FP8 latent cache
DS8=$SRC/tests/data/deepseek/v3_fp8
run_dcp ds8-cpu --model "$DS8" --kv-cache-dtype fp8 --output "$WORK/ds8-cpu.h5" "$P"
if quick; then run_layouts "$WORK/ds8-cpu.h5" "--model $DS8 $NOPROF --kv-cache-dtype fp8" "-tp 2 -dcp 2"
else run_layouts "$WORK/ds8-cpu.h5" "--model $DS8 $NOPROF --kv-cache-dtype fp8" "" "-tp 4 -dcp 4"; fi
# DeepSeek-V2 (softmax routing, no q_lora_rank)
DS=$SRC/tests/data/deepseek/v2_softmax
printf '{"id": "d2", "prompt_token_ids": [%s], "max_tokens": 32, "temperature": 0}\n' "$(tr ' ' ',' <"$DS/prompt.txt" | tr -d '\n' | sed 's/,$//')" >"$P"
run_dcp ds2-cpu --model "$DS" --output "$WORK/ds2-cpu.h5" "$P"
run_layouts "$WORK/ds2-cpu.h5" "--model $DS $NOPROF" "" "-tp 2 -dcp 2 --dcp-comm-backend a2a"
finish
