/* Batch-invariant matrix product for the CPU backend.
 *
 * OpenBLAS picks different micro-kernels for a row depending on how many
 * rows share the call, so a token's activations (and, rarely, its sampled
 * token) would depend on which other requests are in the batch. Here every
 * element y[t][n] is computed by the same arithmetic in the same order,
 * whatever T is and wherever the row falls in a tile: 4-lane partial sums
 * over k, a fixed horizontal reduction, then the k % 4 tail in order.
 * Tiles of 4 rows x 2 weight rows keep a weight row in cache across all
 * tokens of the step, so decode reads each weight once per step. */
#include <string.h>

#include "gemm_cpu.h"

typedef float v4 __attribute__((vector_size(16)));

static inline v4 load4(const float *p)
{
    v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float finish(v4 acc, const float *x, const float *w, int k, int K)
{
    float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (; k < K; k++) s += x[k] * w[k];
    return s;
}

/* The defining arithmetic of one element. */
static inline float dot1(const float *x, const float *w, int K)
{
    v4 acc = {0, 0, 0, 0};
    int k = 0;
    for (; k + 4 <= K; k += 4) acc += load4(x + k) * load4(w + k);
    return finish(acc, x, w, k, K);
}

/* Eight elements at once: rows x[0..3] against weight rows w0, w1, each
 * with exactly dot1's operations. */
static inline void dot4x2(const float *x, int ldx, const float *w0, const float *w1, int K, float *y, int ldy)
{
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    v4 a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
    int k = 0;
    for (; k + 4 <= K; k += 4) {
        v4 b0 = load4(w0 + k), b1 = load4(w1 + k), v;
        v = load4(x0 + k); a00 += v * b0; a01 += v * b1;
        v = load4(x1 + k); a10 += v * b0; a11 += v * b1;
        v = load4(x2 + k); a20 += v * b0; a21 += v * b1;
        v = load4(x3 + k); a30 += v * b0; a31 += v * b1;
    }
    y[0] = finish(a00, x0, w0, k, K);
    y[1] = finish(a01, x0, w1, k, K);
    y[ldy] = finish(a10, x1, w0, k, K);
    y[ldy + 1] = finish(a11, x1, w1, k, K);
    y[2 * ldy] = finish(a20, x2, w0, k, K);
    y[2 * ldy + 1] = finish(a21, x2, w1, k, K);
    y[3 * ldy] = finish(a30, x3, w0, k, K);
    y[3 * ldy + 1] = finish(a31, x3, w1, k, K);
}

#define N_BLOCK 32 /* weight rows per task: 32 x dim floats stay in L1/L2 */

void gemm_invariant(float *y, const float *x, const float *w, int T, int in, int out)
{
    int nblocks = (out + N_BLOCK - 1) / N_BLOCK;
#pragma omp parallel for schedule(static) if ((long)T * in * out > 100000)
    for (int b = 0; b < nblocks; b++) {
        int n0 = b * N_BLOCK, n1 = n0 + N_BLOCK < out ? n0 + N_BLOCK : out;
        int t = 0;
        for (; t + 4 <= T; t += 4) {
            const float *xt = x + (size_t)t * in;
            float *yt = y + (size_t)t * out;
            int n = n0;
            for (; n + 2 <= n1; n += 2)
                dot4x2(xt, in, w + (size_t)n * in, w + (size_t)(n + 1) * in, in, yt + n, out);
            for (; n < n1; n++)
                for (int r = 0; r < 4; r++) yt[(size_t)r * out + n] = dot1(xt + (size_t)r * in, w + (size_t)n * in, in);
        }
        for (; t < T; t++)
            for (int n = n0; n < n1; n++) y[(size_t)t * out + n] = dot1(x + (size_t)t * in, w + (size_t)n * in, in);
    }
}
