#!/bin/bash
# Builds dcpinfer (installing its Debian packages if missing) and runs the
# test suite twice: a normal build, and an AddressSanitizer +
# UndefinedBehaviorSanitizer build (all but three tests, below) with a short
# fuzzing run of every parser;
# in between the system tests (the README's commands, Slurm) and the CUDA
# variant's build (build only) where nvcc exists.
# Last, make distcheck builds the release tarball and tests it (a few
# tests; its file list against git's). Ends with
# "N passed, N failed, N skipped", after the logs of what failed (a test
# that fails among the others runs once more alone; see run_suite).
set -u
. "$(dirname "$0")/setup.sh"
ensure_packages || exit 1
# the shared models and tokenizers beside the checkout (tests skip without them)
export DCP_SHARED=${DCP_SHARED:-$(cd "$TOP/.." && pwd)/shared}

passed=0 failed=0 skipped=0
run_suite() { # NAME BUILD_DIR CONFIGURE_ARGS [TESTS]: all of make check, or those tests
    local name=$1 only=${4:-}
    BUILD_DIR=$2 CONFIGURE_ARGS=$3
    echo "== $name build ($BUILD_DIR)"
    if ! build_dcpinfer; then
        echo "== $name: build failed"
        failed=$((failed + 1))
        return
    fi
    if [ -n "$only" ]; then
        make -C "$BUILD_DIR" -j"$(nproc 2>/dev/null || echo 2)" check TESTS="$only" >"$BUILD_DIR/check.out" 2>&1
    else
        make -C "$BUILD_DIR" -j"$(nproc 2>/dev/null || echo 2)" check >"$BUILD_DIR/check.out" 2>&1
    fi
    grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR):' "$BUILD_DIR/check.out" | sed "s/^/   /"
    local p f s
    p=$(grep -c '^PASS:' "$BUILD_DIR/check.out")
    f=$(grep -cE '^(FAIL|ERROR|XPASS):' "$BUILD_DIR/check.out")
    s=$(grep -cE '^(SKIP|XFAIL):' "$BUILD_DIR/check.out")
    if [ "$((p + f + s))" = 0 ]; then
        tail -30 "$BUILD_DIR/check.out"
        f=1
    fi
    # a test that failed among the others runs again alone, once: a pass
    # there counts, but its first log goes to the report at the end (as
    # FLAKY), so that a failure that depends on load is seen, not lost
    local t log
    for t in $(sed -n 's/^\(FAIL\|ERROR\): //p' "$BUILD_DIR/check.out"); do
        log=$BUILD_DIR/${t%.sh}.log
        cp "$log" "$log.first" 2>/dev/null
        if make -C "$BUILD_DIR" check TESTS="$t" >"$BUILD_DIR/rerun.out" 2>&1 && grep -q "^PASS: $t" "$BUILD_DIR/rerun.out"; then
            echo "   FLAKY: $t failed among the others and passed alone"
            report "FLAKY ($name build): $t, its failing log" "$log.first"
            p=$((p + 1)) f=$((f - 1))
        else
            echo "   FAIL: $t again alone"
            report "FAIL ($name build): $t" "$log"
        fi
    done
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

# report TITLE LOG: the log's tail, printed again just before the summary
# line, where a reader of the run's end finds it
REPORT=$(mktemp)
trap 'rm -f "$REPORT"' EXIT
report() {
    { echo "--- $1"; tail -40 "$2" 2>/dev/null; } >>"$REPORT"
}

# the CUDA variant must keep compiling, GPU or not (its tests run where
# there is a GPU: scripts/gpu-check.sh)
cuda_build() {
    local nvcc
    nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
    if [ ! -x "$nvcc" ]; then
        echo "== cuda build: skipped, no nvcc"
        skipped=$((skipped + 1))
        return
    fi
    echo "== cuda build, build only ($TOP/build-cuda)"
    if BUILD_DIR=$TOP/build-cuda CONFIGURE_ARGS="--enable-cuda --with-cuda=$(dirname "$(dirname "$nvcc")")" \
        build_dcpinfer; then
        echo "   PASS: configure --enable-cuda && make"
        passed=$((passed + 1))
        # machine code for each listed architecture plus PTX of the newest,
        # so that GPUs newer than the list still run (no "no kernel image")
        if grep -q '^NVCC_ARCH_FLAGS = .*code=sm_90.*code=sm_100.*code=compute_100' "$TOP/build-cuda/Makefile"; then
            echo "   PASS: CUDA build embeds sm_90/sm_100 code and compute_100 PTX"
            passed=$((passed + 1))
        else
            echo "   FAIL: CUDA build lacks PTX for its newest architecture: $(grep '^NVCC_ARCH_FLAGS' "$TOP/build-cuda/Makefile")"
            failed=$((failed + 1))
        fi
        # ptxas -warn-spills (NVCCFLAGS): no kernel spills registers
        if grep -qE "ptxas.*[Ss]pill" "$TOP/build-cuda/make.out"; then
            echo "   FAIL: CUDA kernels spill registers:"
            grep -E "ptxas.*[Ss]pill" "$TOP/build-cuda/make.out" | sort -u | head -5 | sed 's/^/     /'
            failed=$((failed + 1))
        elif grep -q -- "-warn-spills" "$TOP/build-cuda/Makefile"; then
            echo "   PASS: no CUDA kernel spills registers (ptxas -warn-spills)"
            passed=$((passed + 1))
        else
            echo "   FAIL: the CUDA build does not ask ptxas for spill warnings"
            failed=$((failed + 1))
        fi
    else
        echo "   FAIL: configure --enable-cuda && make"
        failed=$((failed + 1))
    fi
}

# tests of the whole system, once, against the normal build: the README's
# commands as written (tests/readme.sh), and the Slurm scripts on a real
# one-node Slurm cluster (tests/slurm.sh)
system_tests() {
    local t rc
    for t in readme slurm; do
        echo "== system test tests/$t.sh"
        DCP_SRCDIR=$TOP DCP_BUILDDIR=$TOP/build bash "$TOP/tests/$t.sh" >"$TOP/build/$t.log" 2>&1
        rc=$?
        grep -E '^(ok|FAIL):' "$TOP/build/$t.log" | sed 's/^/   /'
        if [ $rc = 0 ]; then
            echo "   PASS: tests/$t.sh"
            passed=$((passed + 1))
        elif [ $rc = 77 ]; then
            echo "   SKIP: tests/$t.sh: $(tail -1 "$TOP/build/$t.log")"
            skipped=$((skipped + 1))
        else
            echo "   FAIL: tests/$t.sh"
            report "FAIL: tests/$t.sh" "$TOP/build/$t.log"
            failed=$((failed + 1))
        fi
    done
}

# the CUDA backend's kernels executed on the CPU through HIP-CPU (the
# vendored runtime beside the checkout): its conformance test and the GPU
# end-to-end test, --backend cuda against the CPU backend
hip_cpu_suite() {
    local hip=$DCP_SHARED/vendor/hip-cpu
    if [ ! -f "$hip/include/hip/hip_runtime.h" ]; then
        echo "== hip-cpu build: skipped, no HIP-CPU at $hip"
        skipped=$((skipped + 1))
        return
    fi
    # gpu_stories.sh runs each model and feature once here (DCP_E2E_QUICK);
    # every layout of it runs on a GPU (scripts/gpu-check.sh)
    DCP_E2E_QUICK=1 run_suite hip-cpu "$TOP/build-hip" "--with-hip-cpu=$hip" \
        "tests/test_backends tests/mutants.sh tests/gpu_stories.sh tests/gpu_memory.sh tests/gpu_bits.sh tests/gpu_steps.sh"
}

run_suite normal "$TOP/build" ""
system_tests
cuda_build
hip_cpu_suite
# Open MPI keeps allocations until exit; valgrind_leaks.sh checks leaks in
# the normal build, so LeakSanitizer stays off here. tests/fuzz.sh fuzzes
# each parser for DCP_FUZZ_SECONDS (scripts/fuzz.sh 600 for long runs).
(
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    export DCP_FUZZ_SECONDS=${DCP_FUZZ_SECONDS:-10}
    # every test but four that take long under the sanitizers and whose
    # checks they add nothing to: ux.sh (progress lines, summaries and
    # interruption at a terminal), stories_layouts.sh (the layouts' tokens,
    # which parallel.sh and layout_bits.sh run under the sanitizers too),
    # quant_memory.sh (resident memory, which ASan's shadow memory inflates)
    # and spec_long.sh (an 8,192-token prompt through the code that
    # spec_decode.sh runs under the sanitizers at every layout)
    san_tests=$(make -s -C "$TOP/build" print-tests 2>/dev/null | tr ' ' '\n' |
        grep -vxE 'tests/(ux|stories_layouts|quant_memory|spec_long)\.sh' | tr '\n' ' ')
    run_suite sanitizers "$TOP/build-sanitizers" "--enable-sanitizers" "$san_tests"
    echo "$passed $failed $skipped" >"$TOP/build-sanitizers/counts"
)
read -r passed failed skipped <"$TOP/build-sanitizers/counts"

# the release tarball: every file the build and the tests need is in it.
# make distcheck builds it out of tree from the tarball and runs a few
# tests there that read the source tree's data (the whole suite ran
# above, on the same files); the tarball's list is git's, less .ci/ and
# .gitignore, so that no test's file can be missing from it
echo "== make distcheck ($TOP/build)"
dist_tests="tests/test_ops tests/test_hf_reference tests/layers.sh tests/plan.sh"
if make -C "$TOP/build" -j"$(nproc 2>/dev/null || echo 2)" distcheck TESTS="$dist_tests" \
    >"$TOP/build/distcheck.out" 2>&1; then
    echo "   PASS: make distcheck (tests there: $dist_tests)"
    passed=$((passed + 1))
else
    echo "   FAIL: make distcheck"
    grep -E '^(FAIL|ERROR):|Error|error:' "$TOP/build/distcheck.out" | head -20
    failed=$((failed + 1))
fi
if command -v git >/dev/null && git -C "$TOP" rev-parse >/dev/null 2>&1; then
    tarball=$(ls -t "$TOP"/build/dcpinfer-*.tar.gz 2>/dev/null | head -1)
    missing=$(comm -23 <(git -C "$TOP" ls-files | grep -vE '^(\.ci/|\.gitignore$)' | sort) \
        <(tar tzf "${tarball:-/dev/null}" 2>/dev/null | grep -v '/$' | cut -d/ -f2- | sort))
    if [ -n "$tarball" ] && [ -z "$missing" ]; then
        echo "   PASS: $(basename "$tarball") holds every tracked file (but .ci/, .gitignore)"
        passed=$((passed + 1))
    else
        echo "   FAIL: the release tarball ${tarball:-(none)} lacks: $(echo $missing | head -c 400)"
        failed=$((failed + 1))
    fi
fi

if [ -s "$REPORT" ]; then
    echo "== the logs of what failed"
    cat "$REPORT"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
