#!/bin/sh
# What the GPU backend does per step, from the results file's
# /gpu/steps counters (docs/output.md): the DeepSeek-V3 test model (3
# layers: 1 dense, 2 MoE; 256 tokens) decoding 3 requests at -tp 4 -dcp 4
# and at -tp 2 with expert parallelism, MPI on device buffers. In every
# decode step after the first: no device allocation; at most 2 waits for
# the device outside MPI; device-to-host copies of only what sampling
# needs: the step's logits rows of this rank's vocabulary shard (1 copy,
# rows x vocab/tp floats), and with expert parallelism each MoE layer's
# routing counts (E + 1 ints), which MPI needs on the host (each such copy
# waits, and the wait is counted as MPI's); and at most LAUNCHES_PER_LAYER
# kernel launches per layer, the step's launches over its layers (the
# figures are printed).
# Skips without the CUDA backend.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
LAUNCHES_PER_LAYER=42
DS=$SRC/tests/data/deepseek/v3_yarn
command -v h5dump >/dev/null 2>&1 || { echo "h5dump not installed: skipped" >&2; exit 77; }
ids=$(tr ' ' ',' <"$DS/prompt.txt" | tr -d '\n' | sed 's/,$//')
P=$WORK/p.jsonl
for i in 0 1 2; do
    echo "{\"id\": \"d$i\", \"prompt_token_ids\": [$ids], \"max_tokens\": $((8 + 3 * i)), \"temperature\": 0}"
done >"$P"
run_dcp probe --backend cuda --model "$DS" --kv-cache-memory 1M --max-tokens 1 --output "$WORK/probe.h5" "$P"
if grep -qE "built without CUDA|no usable GPU" "$WORK/probe.err"; then
    echo "$(cat "$WORK/probe.err"): skipped" >&2
    exit 77
fi
layers=3 moe_layers=2 vocab=256 experts=8

# check NAME NP TP EP ARGS...: one run; its decode steps' counters against the bounds
check() {
    name=$1 np=$2 tp=$3 ep=$4
    shift 4
    checks=$((checks + 1))
    NP=$np run_dcp "$name" --backend cuda --model "$DS" --kv-cache-memory 64M --mpi-device-buffers yes "$@" \
        --output "$WORK/$name.h5" "$P"
    [ "$(cat "$WORK/$name.rc")" = 0 ] || { fail "$name: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2; return; }
    for f in launches host_syncs mpi_syncs allocations d2h_copies d2h_bytes; do
        h5_numbers "$WORK/$name.h5" /gpu/steps/$f >"$WORK/$name.$f"
    done
    h5_numbers "$WORK/$name.h5" /steps/decode_tokens >"$WORK/$name.decode"
    h5_numbers "$WORK/$name.h5" /steps/prefill_tokens >"$WORK/$name.prefill"
    # copies: the logits rows of this rank's vocabulary shard, and with
    # expert parallelism each MoE layer's routing counts
    copies=$((1 + ep * moe_layers))
    report=$(paste "$WORK/$name.decode" "$WORK/$name.prefill" "$WORK/$name.launches" "$WORK/$name.host_syncs" \
        "$WORK/$name.mpi_syncs" "$WORK/$name.allocations" "$WORK/$name.d2h_copies" "$WORK/$name.d2h_bytes" |
        awk -v layers=$layers -v copies=$copies -v waits=2 -v shard=$((vocab / tp)) -v counts=$((ep * moe_layers * (experts + 1) * 4)) \
            -v most=$LAUNCHES_PER_LAYER '
        $2 > 0 || $1 == 0 { next }            # prefill steps
        !seen++ { next }                      # the first decode step
        { n++; launches = $3 > launches ? $3 : launches; hs = $4 > hs ? $4 : hs; mpi = $5 }
        $6 != 0 { bad = bad sprintf(" step %d: %d allocations;", NR, $6) }
        $4 > waits { bad = bad sprintf(" step %d: %d host syncs, at most %d;", NR, $4, waits) }
        $7 != copies { bad = bad sprintf(" step %d: %d copies, expected %d;", NR, $7, copies) }
        $8 != $1 * shard * 4 + counts { bad = bad sprintf(" step %d: %d bytes copied, expected %d;", NR, $8, $1 * shard * 4 + counts) }
        END {
            if (!n) { print "FAIL no decode step after the first"; exit }
            if (launches > most * layers) bad = bad sprintf(" %d launches in a step: above %d per layer;", launches, most)
            printf "%s%d decode steps after the first: 0 allocations, %d copies, up to %d waits outside MPI (bound %d), up to %d launches (%.1f per layer, %d layers), %d MPI waits\n",
                (bad == "" ? "ok " : "FAIL" bad " "), n, copies, hs, waits, launches, launches / layers, layers, mpi
        }')
    case $report in
    ok*) pass "$name: ${report#ok }" ;;
    *) fail "$name: ${report#FAIL}" ;;
    esac
}
check tp4-dcp4 4 4 0 -tp 4 -dcp 4
check tp2-ep 2 2 1 -tp 2 --enable-expert-parallel
finish
