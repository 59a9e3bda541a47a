#!/bin/bash
# The GPU check: on a machine with one NVIDIA GPU, the CUDA toolkit and
# MPI, build dcpinfer with CUDA and answer in one command whether the GPU
# path is right and how fast it decodes:
# - the backend conformance test (tests/test_backends): every op against
#   the CPU backend at real models' shapes (head_dim 64/128, GQA 1-8, MLA
#   576/512 and 192/128, up to 4,096 keys and 512 tokens, bf16 and fp32
#   weights and KV), the MoE layer without host round-trips and the batched
#   absorption, counted;
# - end to end (tests/gpu_stories.sh): stories260K, an MQA model and the
#   DeepSeek-V3/V2 test models give the CPU backend's tokens at one rank and
#   at TP/DCP layouts, both merges, both MPI buffer modes;
# both with every launch checked against the GPU's limits and synchronised
# (DCPINFER_CUDA_SYNC=1); then short decode benchmarks, a GQA model and a
# DeepSeek-V3-shaped MLA + MoE model, that print tokens/s and the fraction
# of peak memory bandwidth reached by the decode attention and the GEMMs.
# Needs no network. Meant to finish within 8 minutes on one H200.
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
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || missing+=("an NVIDIA GPU and driver (nvidia-smi -L fails)")
for tool in gcc make autoreconf automake pkg-config mpicc mpirun h5dump; do
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
[ -f "$SHARED/models/stories260K/stories260K.bin" ] || say "note: no stories260K under $SHARED: its GPU test will skip"
nvidia-smi -L

# ---- build -----------------------------------------------------------
say "building with CUDA in $BUILD_DIR"
(cd "$TOP" && autoreconf -fi) >/dev/null || { say "autoreconf failed"; exit 1; }
mkdir -p "$BUILD_DIR"
(cd "$BUILD_DIR" && "$TOP/configure" --enable-cuda --with-cuda="$CUDA_HOME" ${CONFIGURE_ARGS:-} >configure.out 2>&1) ||
    { tail -20 "$BUILD_DIR/configure.out"; say "configure failed"; exit 1; }
make -C "$BUILD_DIR" -j"$(nproc)" >"$BUILD_DIR/make.out" 2>&1 || { tail -30 "$BUILD_DIR/make.out"; say "build failed"; exit 1; }

# ---- GPU tests -------------------------------------------------------
say "GPU tests"
# every kernel launch synchronised and checked, so that a fault names its launch
DCPINFER_CUDA_SYNC=1 make -C "$BUILD_DIR" check DCP_SHARED="$SHARED" TESTS="tests/test_backends tests/gpu_stories.sh" \
    >"$BUILD_DIR/gpu-tests.out" 2>&1
grep -E '^(PASS|FAIL|SKIP|ERROR):' "$BUILD_DIR/gpu-tests.out"
for t in test_backends gpu_stories.sh; do sed 's/^/    /' "$BUILD_DIR/tests/$t.log" 2>/dev/null | grep -vE '^    $' | tail -25; done
status=0
grep -q '^PASS: tests/test_backends' "$BUILD_DIR/gpu-tests.out" || { say "backend conformance did not pass"; status=1; }
grep -qE '^(PASS|SKIP): tests/gpu_stories.sh' "$BUILD_DIR/gpu-tests.out" || { say "stories260K on the GPU did not pass"; status=1; }

# ---- decode benchmark ------------------------------------------------
say "decode benchmark (one GPU)"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$BUILD_DIR/dcpinfer-mkmodel" --out "$W/model" --layers 8 --dim 2048 --heads 16 --kv-heads 4 --hidden 5632 \
    --vocab 32000 --max-len 40000 --seed 1 || exit 1
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
