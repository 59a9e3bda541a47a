#!/bin/bash
# Benchmark (not a test): one decode step of batch b at context L on 8
# ranks (tp 8) of a generated MQA model (1 KV head), for plain TP (dcp 1)
# and DCP 2/4/8 with both merge backends: step time, time and bytes of the
# merge collectives, allreduce bytes, KV bytes per rank.
# NP=8 CASES="1:1024,8:4096" STEPS=5 scripts/bench-dcp.sh
set -u
. "$(dirname "$0")/setup.sh"
ensure_packages || exit 1
build_dcpinfer || exit 1
NP=${NP:-8}
bench_workdir
"$BUILD_DIR/dcpinfer-mkmodel" --out "$W/mqa" --layers 4 --dim 512 --heads 16 --kv-heads 1 --hidden 1376 \
    --vocab 2000 --max-len 40000 || exit 1
mpirun -q --oversubscribe --bind-to none -np "$NP" "$BUILD_DIR/dcpinfer-bench-decode" --model "$W/mqa" \
    --cases "${CASES:-1:1024,8:1024,8:4096,32:4096,8:16384}" --steps "${STEPS:-5}"
