#!/bin/bash
# The GPU check: on a machine with one NVIDIA GPU, the CUDA toolkit and
# MPI, build dcpinfer with CUDA and answer in one command whether the GPU
# path is right and how fast it decodes:
# - the build for the default architectures (sm_90 and sm_100), with no
#   register spill or local memory in any kernel (ptxas -warn-spills);
# - compute-sanitizer's memcheck, racecheck, synccheck and initcheck on
#   the backend conformance test (tests/test_backends);
# - the GPU tests, each once without DCPINFER_CUDA_SYNC (launches queued
#   as in a run, so that an ordering bug shows) and once with it (every
#   launch checked against the GPU's limits and waited for, so that a
#   fault names its launch): tests/test_backends (every op against the CPU
#   backend at real models' shapes, the GEMMs bit for bit),
#   tests/gpu_stories.sh (the CPU backend's tokens at TP/DCP layouts),
#   tests/gpu_bits.sh (the same bits at every layout and batch, every
#   weight format), tests/gpu_steps.sh (per-step launches, waits,
#   allocations and copies), tests/gpu_memory.sh; a skipped test is a
#   failure here;
# - h5diff of the results file of a run against the same run again and
#   against -tp 2 (tokens and log-probabilities, bit for bit);
# - the GPU against HIP-CPU, which runs the same kernels on the host in
#   CI: seeded requests on a GQA and a DeepSeek-V3 test model, the same
#   tokens and log-probabilities bit for bit (the kernels call no math
#   library and nothing is contracted into an FMA: docs/design.md);
# - short decode benchmarks, a GQA model and a DeepSeek-V3-shaped MLA +
#   MoE model: tokens/s with no wait inside a step, and the attention and
#   GEMMs' fraction of peak memory bandwidth.
# Needs no network. Meant to finish within 8 minutes on one H200.
# Exit status: 0 all passed, 1 a check failed, 2 a dependency is missing,
# 3 built and checked here but the GPU steps not run (no GPU).
#
# Dependencies are checked first and any missing one is named. Debian's
# libraries may come unpacked in a folder instead of installed:
#   DEPS_PREFIX=/path/to/root scripts/gpu-check.sh
# where the folder holds `dpkg -x` of the .deb files that
# scripts/fetch-gpu-deps.sh downloads on a Debian machine with network.
set -u
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$TOP/build-gpu}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SHARED=${DCP_SHARED:-$TOP/../shared}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
start=$(date +%s)
say() { echo "gpu-check: $*"; }

# ---- dependencies ----------------------------------------------------
if [ -n "${DEPS_PREFIX:-}" ]; then
    D=$DEPS_PREFIX
    arch=x86_64-linux-gnu
    export PATH="$D/usr/bin:$PATH"
    export PKG_CONFIG_PATH="$D/usr/lib/$arch/pkgconfig:$D/usr/share/pkgconfig:$D/usr/lib/$arch/openblas-pthread/pkgconfig:${PKG_CONFIG_PATH:-}"
    export PKG_CONFIG_SYSROOT_DIR=$D
    export CPPFLAGS="-I$D/usr/include -I$D/usr/include/$arch -I$D/usr/include/hdf5/serial ${CPPFLAGS:-}"
    export LDFLAGS="-L$D/usr/lib/$arch -L$D/usr/lib/$arch/hdf5/serial -L$D/usr/lib/$arch/openblas-pthread ${LDFLAGS:-}"
    export LD_LIBRARY_PATH="$D/usr/lib/$arch:$D/usr/lib/$arch/hdf5/serial:$D/usr/lib/$arch/openblas-pthread:$D/usr/lib/$arch/openmpi/lib:${LD_LIBRARY_PATH:-}"
    export OPAL_PREFIX=$D/usr
    export ACLOCAL_PATH="$D/usr/share/aclocal:${ACLOCAL_PATH:-}"
fi
missing=()
[ -x "$CUDA_HOME/bin/nvcc" ] || command -v nvcc >/dev/null || missing+=("nvcc (CUDA toolkit; set CUDA_HOME)")
gpu=1
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || gpu=0
SANITIZER=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
[ $gpu = 0 ] || [ -x "$SANITIZER" ] || missing+=("compute-sanitizer (CUDA toolkit)")
for tool in gcc make autoreconf automake pkg-config mpicc mpirun h5dump h5diff; do
    command -v $tool >/dev/null || missing+=("$tool")
done
for pc in hdf5-serial openblas jansson; do
    pkg-config --exists $pc 2>/dev/null || missing+=("$pc (pkg-config; Debian: lib${pc%%-*}-dev)")
done
if ((${#missing[@]})); then
    say "missing dependencies:"
    for m in "${missing[@]}"; do echo "  - $m"; done
    exit 2
fi
[ -f "$SHARED/models/stories260K/stories260K.bin" ] ||
    say "note: no stories260K under $SHARED: gpu_stories.sh will skip, which fails this check"
[ $gpu = 1 ] && nvidia-smi -L

# ---- build -----------------------------------------------------------
say "building with CUDA in $BUILD_DIR"
mkdir -p "$BUILD_DIR"
(cd "$TOP" && autoreconf -fi) >"$BUILD_DIR/autoreconf.out" 2>&1 ||
    { tail -20 "$BUILD_DIR/autoreconf.out"; say "autoreconf failed"; exit 1; }
(cd "$BUILD_DIR" && "$TOP/configure" --enable-cuda --with-cuda="$CUDA_HOME" ${CONFIGURE_ARGS:-} >configure.out 2>&1) ||
    { tail -20 "$BUILD_DIR/configure.out"; say "configure failed"; exit 1; }
make -C "$BUILD_DIR" -j"$(nproc)" >"$BUILD_DIR/make.out" 2>&1 || { tail -30 "$BUILD_DIR/make.out"; say "build failed"; exit 1; }

# ---- spills ----------------------------------------------------------
# ptxas warns of any register spill and any stack frame (NVCCFLAGS): a
# spill fails the check; a stack frame is listed (none in the default
# build)
status=0
spills=$(grep -E "ptxas.*[Ss]pill" "$BUILD_DIR/make.out" | sort -u)
if [ -n "$spills" ]; then
    echo "$spills" | head -20
    say "FAIL: kernels spill registers"
    status=1
else
    say "ok: no kernel spills registers ($(sed -n 's/^NVCC_ARCH_FLAGS = //p' "$BUILD_DIR/Makefile"))"
fi
grep -E "ptxas.*Local memory used" "$BUILD_DIR/make.out" | sed -E "s/.*function '([^']*)'.*frame: ([0-9]+).*/\1 \2/" |
    sort -u | while read -r f bytes; do say "note: $(echo "$f" | c++filt | sed 's/(.*//') keeps $bytes bytes on its stack"; done

if [ $gpu = 0 ]; then
    for step in "compute-sanitizer on test_backends" "GPU tests without and with DCPINFER_CUDA_SYNC" \
        "h5diff of runs" "the GPU against HIP-CPU" "decode benchmarks"; do
        say "not run: $step (no NVIDIA GPU: nvidia-smi -L fails)"
    done
    say "done in $(( $(date +%s) - start )) s: built; GPU steps not run (exit 3)"
    [ $status = 0 ] && exit 3
    exit $status
fi

# ---- compute-sanitizer -----------------------------------------------
T=$BUILD_DIR/tests/test_backends
for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}; do
    if (cd "$BUILD_DIR/tests" && DCP_SRCDIR=$TOP DCP_SHARED=$SHARED mpirun -np 1 "$SANITIZER" --tool "$tool" \
        --error-exitcode 9 "$T" >"$BUILD_DIR/sanitizer-$tool.out" 2>&1); then
        say "ok: compute-sanitizer --tool $tool: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$BUILD_DIR/sanitizer-$tool.out")"
    else
        tail -20 "$BUILD_DIR/sanitizer-$tool.out"
        say "FAIL: compute-sanitizer --tool $tool"
        status=1
    fi
done

# ---- GPU tests -------------------------------------------------------
TESTS="tests/test_backends tests/gpu_stories.sh tests/gpu_bits.sh tests/gpu_steps.sh tests/gpu_memory.sh"
for sync in 0 1; do
    say "GPU tests, DCPINFER_CUDA_SYNC=$sync"
    DCPINFER_CUDA_SYNC=$sync make -C "$BUILD_DIR" check DCP_SHARED="$SHARED" TESTS="$TESTS" \
        >"$BUILD_DIR/gpu-tests-$sync.out" 2>&1
    grep -E '^(PASS|FAIL|SKIP|ERROR|XFAIL|XPASS):' "$BUILD_DIR/gpu-tests-$sync.out"
    for t in $TESTS; do
        if grep -q "^PASS: $t\$" "$BUILD_DIR/gpu-tests-$sync.out"; then continue; fi
        sed 's/^/    /' "$BUILD_DIR/$t.log" 2>/dev/null | grep -vE '^    $' | tail -25
        say "FAIL: $t (DCPINFER_CUDA_SYNC=$sync) did not pass (a skip counts as a failure here)"
        status=1
    done
done

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$BUILD_DIR/dcpinfer-mkmodel" --out "$W/model" --layers 8 --dim 2048 --heads 16 --kv-heads 4 --hidden 5632 \
    --vocab 32000 --max-len 40000 --seed 1 >/dev/null || exit 1

# ---- h5diff ------------------------------------------------------------
# 16 seeded requests at temperature 1.0: a run, the same run again, and
# -tp 2; tokens and log-probabilities compared by h5diff, bit for bit
"$BUILD_DIR/dcpinfer-mktrace" --requests 16 --median-input 200 --sigma-input 0.3 --median-output 32 \
    --sigma-output 0.01 --vocab 32000 --out "$W/small.jsonl"
sed -i 's/"temperature": 0,/"temperature": 1.0, "seed": 7, "logprobs": 2,/' "$W/small.jsonl"
for run in a b tp2; do
    np=1 args=
    [ $run = tp2 ] && np=2 args="-tp 2"
    mpirun -np $np "$BUILD_DIR/dcpinfer" --backend cuda --model "$W/model" $args --kv-cache-memory 4G --quiet \
        --output "$W/$run.h5" "$W/small.jsonl" >"$W/$run.out" 2>&1 || { cat "$W/$run.out"; say "FAIL: run $run"; status=1; }
done
for pair in "a b" "a tp2"; do
    set -- $pair
    same=1
    for d in output_tokens output_logprobs output_top_ids output_top_logprobs; do
        h5diff "$W/$1.h5" "$W/$2.h5" /requests/$d /requests/$d >"$W/diff.out" 2>&1 || { same=0; head -5 "$W/diff.out"; }
    done
    if [ $same = 1 ]; then say "ok: h5diff $1 $2: tokens and log-probabilities identical"
    else say "FAIL: h5diff $1 $2"; status=1; fi
done

# ---- the GPU against HIP-CPU ---------------------------------------------
# tests/gpu_bits.sh's models and requests (9 seeded requests at
# temperature 1.0 over a 32K vocabulary), run by this build on the GPU and
# by a HIP-CPU build of the same source on the host
HIP=$SHARED/vendor/hip-cpu HB=$BUILD_DIR-hip
if [ ! -f "$HIP/include/hip/hip_runtime.h" ]; then
    say "not run: the GPU against HIP-CPU (no HIP-CPU at $HIP)"
elif ! (mkdir -p "$HB" && cd "$HB" && "$TOP/configure" --with-hip-cpu="$HIP" ${CONFIGURE_ARGS:-} >configure.out 2>&1 &&
    make -j"$(nproc)" dcpinfer >make.out 2>&1); then
    say "not run: the GPU against HIP-CPU (its build failed: $HB/configure.out, $HB/make.out)"
else
    SHAPE="--layers 2 --dim 64 --heads 8 --hidden 128 --vocab 32768"
    "$BUILD_DIR/dcpinfer-mkmodel" --out "$W/gqa" --arch llama $SHAPE --kv-heads 1 >/dev/null &&
        "$BUILD_DIR/dcpinfer-mkmodel" --out "$W/v3" --arch deepseek_v3 $SHAPE --first-dense 1 --q-lora-rank 24 \
            --norm-topk-prob >/dev/null || exit 1
    for i in 0 1 2 3 4 5 6 7 8; do
        ids=$(awk -v i=$i 'BEGIN { n = 5 + 7 * i; for (j = 0; j < n; j++) printf "%s%d", j ? ", " : "", (j * 7919 + i * 104729) % 32768 }')
        echo "{\"id\": \"s$i\", \"prompt_token_ids\": [$ids], \"max_tokens\": $((6 + i)), \"temperature\": 1.0, \"seed\": $((i + 11)), \"logprobs\": 2}"
    done >"$W/bits.jsonl"
    for m in gqa v3; do
        for b in gpu hip; do
            bin=$BUILD_DIR/dcpinfer
            [ $b = hip ] && bin=$HB/dcpinfer
            mpirun -np 1 "$bin" --backend cuda --model "$W/$m" --kv-cache-memory 64M --quiet \
                --output "$W/$m-$b.jsonl" "$W/bits.jsonl" >"$W/$m-$b.out" 2>&1 || cat "$W/$m-$b.out"
            sed -E 's/"(ttft_s|tpot_s|e2e_s)": *[-0-9.e+]*,? *//g' "$W/$m-$b.jsonl" >"$W/$m-$b.untimed" 2>/dev/null
        done
        if [ -s "$W/$m-gpu.untimed" ] && cmp -s "$W/$m-gpu.untimed" "$W/$m-hip.untimed"; then
            say "ok: the GPU and HIP-CPU: $m, 9 requests' tokens and log-probabilities identical"
        else
            diff "$W/$m-gpu.untimed" "$W/$m-hip.untimed" | head -4
            say "FAIL: the GPU and HIP-CPU differ ($m)"
            status=1
        fi
    done
fi

# ---- decode benchmark ------------------------------------------------
say "decode benchmark (one GPU): step times with no wait inside a step"
mpirun -np 1 "$BUILD_DIR/dcpinfer-bench-decode" --backend cuda --model "$W/model" \
    --cases "${CASES:-1:4096,16:4096,64:8192,32:32768}" --steps "${STEPS:-10}"
say "MLA decode benchmark: DeepSeek-V3's attention shape (16 heads, latent 512 + 64), 64 experts of 8 per token"
"$BUILD_DIR/dcpinfer-mkmodel" --out "$W/mla" --arch deepseek_v3 --layers 4 --dim 2048 --heads 16 --hidden 4096 \
    --kv-lora-rank 512 --q-lora-rank 512 --qk-nope-dim 128 --qk-rope-dim 64 --v-head-dim 128 --experts 64 \
    --shared-experts 1 --experts-per-token 8 --moe-hidden 512 --first-dense 1 --n-group 8 --topk-group 4 \
    --vocab 32000 --max-len 40000 --seed 1 >/dev/null || exit 1
mpirun -np 1 "$BUILD_DIR/dcpinfer-bench-decode" --backend cuda --model "$W/mla" \
    --cases "${MLA_CASES:-1:4096,16:4096,64:8192,16:32768}" --steps "${STEPS:-10}"
say "end-to-end: 64 requests of 512 tokens, 128 generated each"
"$BUILD_DIR/dcpinfer-mktrace" --requests 64 --median-input 512 --sigma-input 0.01 --median-output 128 \
    --sigma-output 0.01 --vocab 32000 --out "$W/trace.jsonl"
mpirun -np 1 "$BUILD_DIR/dcpinfer" --backend cuda --model "$W/model" --kv-cache-memory 8G --quiet \
    --output "$W/run.h5" "$W/trace.jsonl" | grep -E '^# (layout|decode-only|[0-9]+ request)|TPOT|rank map|^  +0 '
say "done in $(( $(date +%s) - start )) s, status $status"
exit $status
