#ifndef DCP_GEMM_CPU_H
#define DCP_GEMM_CPU_H

/* y (T, out) = x (T, in) . w (out, in)^T; each element's value is
 * independent of T and of the other rows (see gemm_cpu.c). */
void gemm_invariant(float *y, const float *x, const float *w, int T, int in, int out);

#endif
