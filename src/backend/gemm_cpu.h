#ifndef DCP_GEMM_CPU_H
#define DCP_GEMM_CPU_H

#include "backend.h"

/* y (T, out) = x (T, in) . w (out, in)^T, w float32 or bfloat16; each
 * element's value is independent of T, of the other rows, of the thread
 * count and of the instruction set (see gemm_cpu.c). */
void gemm_invariant(float *y, const float *x, WeightRef w, int T, int in, int out);

/* The kernels' instruction set: "auto" (default: the best this CPU has),
 * "generic", "avx2" or "avx512"; -1 with dcp_error() when the CPU lacks it. */
int gemm_cpu_set_isa(const char *name);
const char *gemm_cpu_isa(void);

#endif
