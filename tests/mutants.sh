#!/bin/sh
# The conformance test must be able to fail: tests/test_backends_mutants
# is it, linked against the CUDA backend built with deliberate defects
# (MUTANT(n) in cuda/), run on HIP-CPU. Unbroken, it passes;
# with each defect, it fails by a check, not by a crash:
#   1  the grouped attention kernel (MLA, GQA) misses the barrier after loading a tile of rows
#   2  the grouped kernel writes one value column too few (v_dim - 1)
#   3  the attention kernel of wider rows (head_dim above 256) misses the barrier in its sum reduction
#   4  rmsnorm launches 2048 threads a block, which the launch check refuses
#   5  W4A4 activations are quantized without the matrix's input global scale
#   6  the key shards' one-launch merge misses the barrier before an LSE is updated
#   7  the experts' pair grouping scans the counts one expert off
#   8  the grouped kernel's split-KV fold misses the barrier before a head's LSE is updated
# Skips (77) outside a HIP-CPU build (configure --with-hip-cpu).
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
T=$BUILD/tests/test_backends_mutants
[ -x "$T" ] || { echo "no $T (a HIP-CPU build makes it): skipped" >&2; exit 77; }
run_mutant() { # N: runs the test with defect N; output in $WORK/mN.out, status in $WORK/mN.rc
    DCPINFER_MUTANT=$1 DCPINFER_CUDA_SYNC=1 timeout 300 "$MPIRUN" --oversubscribe -np 1 "$T" >"$WORK/m$1.out" 2>&1
    echo $? >"$WORK/m$1.rc"
}
checks=$((checks + 1))
run_mutant 0
if [ "$(cat "$WORK/m0.rc")" = 0 ]; then pass "no defect: the conformance test passes"
else fail "no defect: exit $(cat "$WORK/m0.rc")"; tail -20 "$WORK/m0.out" >&2; fi
for n in 1 2 3 5 6 7 8; do
    checks=$((checks + 1))
    run_mutant $n
    if [ "$(cat "$WORK/m$n.rc")" != 0 ] && grep -q "FAIL.*differs" "$WORK/m$n.out"; then
        pass "defect $n found: $(grep -c 'FAIL' "$WORK/m$n.out") failed checks, first: $(grep -m1 'FAIL' "$WORK/m$n.out")"
    else
        fail "defect $n not found: exit $(cat "$WORK/m$n.rc")"; tail -20 "$WORK/m$n.out" >&2
    fi
done
checks=$((checks + 1))
run_mutant 4
if [ "$(cat "$WORK/m4.rc")" != 0 ] && grep -q "k_rmsnorm.*2048 threads per block" "$WORK/m4.out"; then
    pass "defect 4 refused: $(grep -m1 '2048 threads' "$WORK/m4.out")"
else
    fail "defect 4 not refused: exit $(cat "$WORK/m4.rc")"; tail -20 "$WORK/m4.out" >&2
fi
finish
