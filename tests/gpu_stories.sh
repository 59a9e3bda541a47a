#!/bin/sh
# End to end on the GPU: stories260K greedy with --backend cuda gives the
# tokens of llama2.c's run.c (cases 1 and 2), as the CPU backend does: on
# one rank, and on two ranks (one GPU each, or both on one GPU) with tp 2,
# with dcp 2, and with MPI staging through host memory. Skips without a GPU.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
model=$SHARED/models/stories260K
[ -f "$model/stories260K.bin" ] || { echo "stories260K not found under $SHARED: skipped" >&2; exit 77; }
command -v h5dump >/dev/null 2>&1 || { echo "h5dump not installed: skipped" >&2; exit 77; }
P=$WORK/p.jsonl
printf '{"id": "c1", "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0}\n{"id": "c2", "prompt": "", "max_tokens": 256, "temperature": 0}\n' >"$P"
M="--model $model/stories260K.bin --tokenizer $model/tok512.bin"
run_dcp probe $M --backend cuda --max-tokens 1 --output "$WORK/probe.h5" "$P"
if grep -qE "built without CUDA|no usable GPU" "$WORK/probe.err"; then
    echo "$(cat "$WORK/probe.err"): skipped" >&2
    exit 77
fi
dump() { h5dump -d /requests/output_tokens "$1" | sed -n '/DATA {/,$p'; }
run_dcp cpu $M --output "$WORK/cpu.h5" "$P"
# the first greedy tokens of run.c's case 1, after the prompt 1 403 407 261 378
checks=$((checks + 1))
if dump "$WORK/cpu.h5" | grep -q '(0): 432, 383, 286, 261, 376, 298'; then pass "CPU run matches run.c"; else fail "CPU run"; fi
for layout in "" "-tp 2" "-tp 2 -dcp 2 --dcp-comm-backend a2a" "-tp 2 -dcp 2 --mpi-device-buffers no"; do
    checks=$((checks + 1))
    name=gpu$(echo "$layout" | tr -c 'a-z0-9\n' '_')
    np=1
    case $layout in *tp\ 2*) np=2 ;; esac
    NP=$np run_dcp "$name" $M --backend cuda $layout --output "$WORK/$name.h5" "$P"
    if [ "$(cat "$WORK/$name.rc")" = 0 ] && [ "$(dump "$WORK/cpu.h5")" = "$(dump "$WORK/$name.h5")" ]; then
        pass "cuda $layout: the reference tokens"
    else
        fail "cuda $layout: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
    fi
done
finish
