/* Batch-invariant matrix product for the CPU backend.
 *
 * OpenBLAS picks different micro-kernels for a row depending on how many
 * rows share the call, so a token's activations (and, rarely, its sampled
 * token) would depend on which other requests are in the batch. Here every
 * element y[t][n] is computed by one arithmetic, whatever T is, wherever the
 * row falls in a tile, whichever thread computes it and whichever
 * instruction set the CPU has:
 *   16 partial sums, lane l an FMA chain over k = l, l+16, ... < K16
 *   (K16 = K rounded down to a multiple of 16), combined by a fixed tree
 *   h[i] = a[i] + a[i+8], g[i] = h[i] + h[i+4], f[i] = g[i] + g[i+2],
 *   s = f[0] + f[1], then s = fma(x[k], w[k], s) for k = K16 .. K-1.
 * AVX-512 holds the 16 lanes in one register, AVX2 in two halves, the
 * portable fallback in an array with fmaf; the results are the same bits,
 * so a request's tokens do not depend on the machine's vector width either.
 * Threads split the output columns, never K. bf16 weights are widened to
 * fp32 in registers (exact), so a bf16 matrix gives the fp32 result of its
 * widened values. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels_cpu.h"
#include "util.h"

static inline float bf16_bits_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#define W2F_F32(w) (w)
#define W2F_BF16(w) bf16_bits_to_f32(w)

/* attention reads a key's row this many keys after prefetching it */
#define ATT_AHEAD 8
static inline void prefetch_bytes(const void *p, size_t bytes)
{
    for (size_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}
/* bytes of the rows of keys i0 .. i1-1 (i1 capped at n) whose row does not
 * follow the one before (rows at element offsets row[i] of esize bytes,
 * stride apart when they follow): the hardware prefetcher takes the others */
static inline void prefetch_new_rows(const void *base, const size_t *row, int i0, int i1, int n, size_t stride,
                                     size_t esize, size_t bytes)
{
    for (int i = i0; i < i1 && i < n; i++)
        if (row[i] != row[i - 1] + stride) prefetch_bytes((const char *)base + row[i] * esize, bytes);
}

/* weight rows per block are at most 2 * PANEL_MAX_PAIRS */
#define PANEL_MAX_PAIRS 64

/* ---- portable: 16 lanes in an array ---------------------------------- */
typedef struct {
    float l[16];
} VGen;
static inline VGen gen_zero(void) { return (VGen){{0}}; }
static inline VGen gen_loadx(const float *p)
{
    VGen v;
    memcpy(v.l, p, sizeof v.l);
    return v;
}
static inline VGen gen_loadw_f32(const float *p) { return gen_loadx(p); }
static inline VGen gen_loadw_bf16(const uint16_t *p)
{
    VGen v;
    for (int i = 0; i < 16; i++) v.l[i] = bf16_bits_to_f32(p[i]);
    return v;
}
static inline VGen gen_fma(VGen a, VGen b, VGen c)
{
    for (int i = 0; i < 16; i++) c.l[i] = fmaf(a.l[i], b.l[i], c.l[i]);
    return c;
}
static inline VGen gen_set1(float f)
{
    VGen v;
    for (int i = 0; i < 16; i++) v.l[i] = f;
    return v;
}
static inline void gen_storex(float *p, VGen v) { memcpy(p, v.l, sizeof v.l); }
static inline float gen_tree(VGen a)
{
    float h[8], g[4];
    for (int i = 0; i < 8; i++) h[i] = a.l[i] + a.l[i + 8];
    for (int i = 0; i < 4; i++) g[i] = h[i] + h[i + 4];
    return (g[0] + g[2]) + (g[1] + g[3]);
}

#define TGT
#define V VGen
#define v_zero gen_zero
#define v_loadx gen_loadx
#define v_fma gen_fma
#define v_tree gen_tree
#define v_set1 gen_set1
#define v_storex gen_storex
#define SFX(name) gen_f32_##name
#define WT float
#define W2F W2F_F32
#define v_loadw gen_loadw_f32
#include "kernels_cpu.inc"
#define SFX(name) gen_bf16_##name
#define WT uint16_t
#define W2F W2F_BF16
#define v_loadw gen_loadw_bf16
#include "kernels_cpu.inc"
#include "kernels_cpu_end.inc"

/* ---- AVX2 + FMA: 16 lanes in two 8-lane halves ------------------------ */
#define TGT_AVX2 __attribute__((target("avx2,fma")))
typedef struct {
    __m256 lo, hi;
} V2;
TGT_AVX2 static inline V2 avx2_zero(void) { return (V2){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
TGT_AVX2 static inline V2 avx2_loadx(const float *p) { return (V2){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
TGT_AVX2 static inline __m256 avx2_widen8(const uint16_t *p)
{
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
TGT_AVX2 static inline V2 avx2_loadw_bf16(const uint16_t *p) { return (V2){avx2_widen8(p), avx2_widen8(p + 8)}; }
TGT_AVX2 static inline V2 avx2_fma(V2 a, V2 b, V2 c)
{
    return (V2){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
/* h (8 lanes) -> g -> f -> s, shared with AVX-512 */
TGT_AVX2 static inline float tree8(__m256 h)
{
    __m128 g = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 f = _mm_add_ps(g, _mm_movehl_ps(g, g));
    return _mm_cvtss_f32(_mm_add_ss(f, _mm_shuffle_ps(f, f, 1)));
}
TGT_AVX2 static inline V2 avx2_set1(float f) { return (V2){_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
TGT_AVX2 static inline void avx2_storex(float *p, V2 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
TGT_AVX2 static inline float avx2_tree(V2 a) { return tree8(_mm256_add_ps(a.lo, a.hi)); }

/* AVX2's tile: six activation rows against the block's weight rows, two
 * at a time. Twelve 16-lane accumulators are 24 registers, more than AVX2
 * has, so each chunk of K is passed twice: lanes 0-7 (k = 0..7 mod 16),
 * then lanes 8-15, twelve 8-lane accumulators at a time, parked in memory
 * between passes. Chunks are the outer loop, so a chunk of the six rows
 * stays in L1 while every weight pair of the block passes it. Each lane's
 * chain still runs over k in order, so the result is dot_finish's.
 * The six rows come packed (avx2_pack_tile): activation rows a power of two
 * apart (K = 2048) would otherwise share L1 sets with each other and with
 * the weights and evict each other. */
#define REG(v) ({ __asm__("" : "+x"(v)); }) /* else GCC reloads v inside every FMA */
/* K in chunks of at most PANEL_CHUNK columns, as equal as whole 16-column
 * steps allow: a chunk of the six rows (24 KiB at most, both passes) stays
 * in L1 beside a pair's weights, and a K that fits in one chunk parks
 * nothing (110M's K = 768 GEMMs, one thread: 54-58 GFLOP/s with 512-column
 * chunks, 63-66 with one 768-column chunk) */
#define PANEL_CHUNK 1024
static inline int panel_chunk(int K16)
{
    int n = (K16 + PANEL_CHUNK - 1) / PANEL_CHUNK;
    return n ? (K16 / 16 + n - 1) / n * 16 : 16;
}
#define AVX2_PANEL(NAME, WT, LOADW8, FINISH)                                                                   \
    TGT_AVX2 static void NAME(float *y, size_t ldy, const float *x, size_t ldx, const float *xp, const WT *w,  \
                              const WT *wp, size_t ldw, int npairs, int K)                                    \
    {                                                                                                         \
        static _Thread_local __m256 park[PANEL_MAX_PAIRS][2][12];                                             \
        int K16 = K & ~15;                                                                                    \
        if (K16 == 0) memset(park, 0, sizeof(park[0]) * (size_t)npairs);                                      \
        int chunk = panel_chunk(K16);                                                                         \
        for (int kc = 0; kc < K16; kc += chunk) {                                                             \
            int kend = kc + chunk < K16 ? kc + chunk : K16;                                                   \
            for (int pr = 0; pr < npairs; pr++)                                                               \
                for (int half = 0; half < 2; half++) {                                                        \
                    __m256 *p = park[pr][half];                                                               \
                    const WT *wq = wp + (size_t)kc * 2 * npairs + (size_t)(2 * pr + half) * (kend - kc) - kc; \
                    const float *xq = xp + (size_t)half * K16 * 3;                                            \
                    __m256 z = _mm256_setzero_ps(), a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z;     \
                    __m256 a30 = z, a31 = z, a40 = z, a41 = z, a50 = z, a51 = z;                              \
                    if (kc > 0) {                                                                             \
                        a00 = p[0], a01 = p[1], a10 = p[2], a11 = p[3], a20 = p[4], a21 = p[5];               \
                        a30 = p[6], a31 = p[7], a40 = p[8], a41 = p[9], a50 = p[10], a51 = p[11];             \
                    }                                                                                         \
                    for (int k = kc; k < kend; k += 16) {                                                     \
                        const float *xk = xq + (size_t)k * 3;                                                 \
                        __m256 b0 = LOADW8(wq + k), b1 = LOADW8(wq + k + 8), v;                               \
                        v = _mm256_loadu_ps(xk), REG(v);                                                      \
                        a00 = _mm256_fmadd_ps(v, b0, a00), a01 = _mm256_fmadd_ps(v, b1, a01);                 \
                        v = _mm256_loadu_ps(xk + 8), REG(v);                                                  \
                        a10 = _mm256_fmadd_ps(v, b0, a10), a11 = _mm256_fmadd_ps(v, b1, a11);                 \
                        v = _mm256_loadu_ps(xk + 16), REG(v);                                                 \
                        a20 = _mm256_fmadd_ps(v, b0, a20), a21 = _mm256_fmadd_ps(v, b1, a21);                 \
                        v = _mm256_loadu_ps(xk + 24), REG(v);                                                 \
                        a30 = _mm256_fmadd_ps(v, b0, a30), a31 = _mm256_fmadd_ps(v, b1, a31);                 \
                        v = _mm256_loadu_ps(xk + 32), REG(v);                                                 \
                        a40 = _mm256_fmadd_ps(v, b0, a40), a41 = _mm256_fmadd_ps(v, b1, a41);                 \
                        v = _mm256_loadu_ps(xk + 40), REG(v);                                                 \
                        a50 = _mm256_fmadd_ps(v, b0, a50), a51 = _mm256_fmadd_ps(v, b1, a51);                 \
                    }                                                                                         \
                    p[0] = a00, p[1] = a01, p[2] = a10, p[3] = a11, p[4] = a20, p[5] = a21, p[6] = a30;       \
                    p[7] = a31, p[8] = a40, p[9] = a41, p[10] = a50, p[11] = a51;                             \
                }                                                                                             \
        }                                                                                                     \
        for (int pr = 0; pr < npairs; pr++)                                                                   \
            for (int i = 0; i < 6; i++)                                                                       \
                for (int j = 0; j < 2; j++)                                                                   \
                    y[i * ldy + 2 * pr + j] = FINISH((V2){park[pr][0][2 * i + j], park[pr][1][2 * i + j]},    \
                                                     x + i * ldx, w + (2 * pr + j) * ldw, K16, K);            \
    }

/* Weight rows n0 .. n0 + 2 * npairs - 1 of an N x K matrix (elements of
 * esize bytes, row groups G: WeightRef) packed for AVX2_PANEL: per chunk
 * of K, per pair, lanes 0-7 of every 16-column step of both rows side by
 * side (16 elements), then lanes 8-15 the same way, so each pass streams
 * whole cache lines. */
TGT_AVX2 static void avx2_pack_weights(void *wp, const void *w, int n0, int npairs, int N, int K, int G, size_t esize)
{
    int K16 = K & ~15;
    char *out = wp;
    const char *in = w;
    int chunk = panel_chunk(K16);
    for (int kc = 0; kc < K16; kc += chunk) {
        int kend = kc + chunk < K16 ? kc + chunk : K16;
        for (int pr = 0; pr < npairs; pr++) {
            int n = n0 + 2 * pr;
            const char *row[2] = {in + weight_row_start(G, n, N, K) * esize, in + weight_row_start(G, n + 1, N, K) * esize};
            size_t step[2] = {weight_row_step(G, n, N) * esize, weight_row_step(G, n + 1, N) * esize};
            for (int half = 0; half < 2; half++)
                for (int k = kc + 8 * half; k < kend; k += 16)
                    for (int j = 0; j < 2; j++, out += 8 * esize) {
                        const char *from = row[j] + (size_t)(k / 16) * step[j] + (size_t)(k % 16) * esize;
                        if (esize == 4) memcpy(out, from, 32); /* constant sizes: inlined moves, not calls */
                        else memcpy(out, from, 16);
                    }
        }
    }
}

/* Six rows of x (ldx apart) packed for AVX2_PANEL: lanes 0-7 of every
 * 16-column step, the six rows' 8 floats side by side, then lanes 8-15 the
 * same way; K16 * 6 floats. */
TGT_AVX2 static void avx2_pack_tile(float *xp, const float *x, size_t ldx, int K)
{
    int K16 = K & ~15;
    for (int half = 0; half < 2; half++)
        for (int k = 0; k < K16; k += 16)
            for (int r = 0; r < 6; r++)
                memcpy(xp + (size_t)half * K16 * 3 + (size_t)k * 3 + r * 8, x + r * ldx + k + 8 * half, 32);
}
/* AVX2's bf16 GEMV. Widening with one AND (odd elements: the high half of
 * each 32-bit pair) and one shift (even elements) per 16 weights, instead
 * of a zero-extension and a shift per 8, makes decode memory-bound at one
 * thread. The vectors then hold k = 0, 2, .., 14 and k = 1, 3, .., 15 of
 * each step, so x is split the same way first (xeo) and the accumulators
 * are put back in lane order (k mod 16) before dot_finish: each lane is
 * the same FMA chain as everywhere else. */
TGT_AVX2 static inline V2 avx2_eo_to_lanes(__m256 even, __m256 odd)
{
    __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
    return (V2){_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31)};
}
TGT_AVX2 static inline float avx2_bf16_dot_finish(V2 acc, const float *x, const uint16_t *w, int k, int K);
/* R (<= 6) weight rows at once, each row's 16 lanes in two accumulators,
 * twelve chains in flight; row r's step of 16 columns at k is at
 * w + r * rs + k * ks: rows stored whole (rs = K, ks = 1) or a group of six
 * (WeightRef.group 6: rs = 16, ks = 6, K a multiple of 16). A group is one
 * run of memory, prefetched 1 KiB ahead (110M's decode matrices,
 * alternating runs: about 10% more bytes per second than six whole rows,
 * within a few percent of fp32's). Whole rows under 4 KiB prefetch the
 * next R rows as one linear stream: the hardware prefetcher would start
 * each row's stream anew; longer rows do better without. */
#define GROUP_AHEAD 1024
TGT_AVX2 static inline __attribute__((always_inline)) void avx2_bf16_rows(float *y, const float *x, const float *xeo,
                                                                          const uint16_t *w, int K, int R, size_t rs,
                                                                          size_t ks)
{
    int K16 = K & ~15, grouped = ks > 1, ahead = !grouped && (size_t)K * 2 < 4096;
    const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);
    const char *next = (const char *)(w + (size_t)R * K);
    __m256 e[6], o[6];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) e[r] = o[r] = _mm256_setzero_ps();
    for (int k = 0; k < K16; k += 16) {
        __m256 xe = _mm256_loadu_ps(xeo + k), xo = _mm256_loadu_ps(xeo + k + 8);
        if (grouped) { /* the group's 192 bytes of this step, 1 KiB on */
            const char *p = (const char *)(w + (size_t)k * ks) + GROUP_AHEAD;
            _mm_prefetch(p, _MM_HINT_NTA), _mm_prefetch(p + 64, _MM_HINT_NTA), _mm_prefetch(p + 128, _MM_HINT_NTA);
        } else if (ahead) /* R x 32 bytes of the next rows per step */
            for (int i = 0; i < R; i += 2) _mm_prefetch(next + (size_t)R * 2 * k + 64 * (i / 2), _MM_HINT_T0);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(w + r * rs + k * ks));
            __asm__("" : "+x"(u)); /* one load: GCC would load it again as the AND's operand */
            e[r] = _mm256_fmadd_ps(xe, _mm256_castsi256_ps(_mm256_slli_epi32(u, 16)), e[r]);
            o[r] = _mm256_fmadd_ps(xo, _mm256_castsi256_ps(_mm256_and_si256(u, himask)), o[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) /* (a group has no tail for dot_finish to read) */
        y[r] = avx2_bf16_dot_finish(avx2_eo_to_lanes(e[r], o[r]), x, w + r * rs, K16, K);
}
/* y[n] for rows n0 .. n1-1 of an N x K matrix in row groups G (0 or 6) */
TGT_AVX2 static void avx2_bf16_gemv_rows(float *y, const float *x, const uint16_t *w, int n0, int n1, int N, int K,
                                         int G)
{
    int K16 = K & ~15;
    float xeo[K16 ? K16 : 1]; /* per 16: the 8 even, then the 8 odd elements */
    for (int k = 0; k < K16; k += 16)
        for (int i = 0; i < 8; i++) xeo[k + i] = x[k + 2 * i], xeo[k + 8 + i] = x[k + 2 * i + 1];
    int n = n0, grouped = G ? N / G * G : n0;
    for (; n + 6 <= n1 && n < grouped; n += 6)
        avx2_bf16_rows(y + n, x, xeo, w + weight_row_start(G, n, N, K), K, 6, 16, 6);
    for (; n + 6 <= n1; n += 6) avx2_bf16_rows(y + n, x, xeo, w + (size_t)n * K, K, 6, (size_t)K, 1);
    for (; n < n1; n++) avx2_bf16_rows(y + n, x, xeo, w + (size_t)n * K, K, 1, (size_t)K, 1);
}

static inline __m256 avx2_loadu8(const float *p) __attribute__((target("avx2,fma"), always_inline));
static inline __m256 avx2_loadu8(const float *p) { return _mm256_loadu_ps(p); }

#define TGT TGT_AVX2
#define V V2
#define v_zero avx2_zero
#define v_loadx avx2_loadx
#define v_fma avx2_fma
#define v_tree avx2_tree
#define v_set1 avx2_set1
#define v_storex avx2_storex
#define SFX(name) avx2_f32_##name
#define WT float
#define W2F W2F_F32
#define v_loadw avx2_loadx
TGT static inline float SFX(dot_finish)(V acc, const float *x, const WT *w, int k, int K);
AVX2_PANEL(avx2_f32_panel, float, avx2_loadu8, avx2_f32_dot_finish)
/* decode's GEMV: R (<= 6) weight rows at once, twelve chains in flight
 * (four rows left the loads waiting on too few misses) */
TGT_AVX2 static inline __attribute__((always_inline)) void avx2_f32_rows(float *y, const float *x, const float *w,
                                                                         int K, int R)
{
    int K16 = K & ~15;
    __m256 lo[6], hi[6];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int k = 0; k < K16; k += 16) {
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            lo[r] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + (size_t)r * K + k), lo[r]);
            hi[r] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + (size_t)r * K + k + 8), hi[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) y[r] = avx2_f32_dot_finish((V2){lo[r], hi[r]}, x, w + (size_t)r * K, K16, K);
}
TGT_AVX2 static void avx2_f32_gemv_rows(float *y, const float *x, const float *w, int n0, int n1, int N, int K, int G)
{
    (void)N, (void)G; /* fp32 rows are stored whole */
    int n = n0;
    for (; n + 6 <= n1; n += 6) avx2_f32_rows(y + n, x, w + (size_t)n * K, K, 6);
    for (; n < n1; n++) avx2_f32_rows(y + n, x, w + (size_t)n * K, K, 1);
}
#define PANEL avx2_f32_panel
#define PACK_W avx2_pack_weights
#define GEMV_ROWS avx2_f32_gemv_rows
#define TILE_M 6

#include "kernels_cpu.inc"
#define SFX(name) avx2_bf16_##name
#define WT uint16_t
#define W2F W2F_BF16
#define v_loadw avx2_loadw_bf16
TGT static inline float SFX(dot_finish)(V acc, const float *x, const WT *w, int k, int K);
AVX2_PANEL(avx2_bf16_panel, uint16_t, avx2_widen8, avx2_bf16_dot_finish)
#define PANEL avx2_bf16_panel
#define PACK_W avx2_pack_weights
#define GEMV_ROWS avx2_bf16_gemv_rows
#define TILE_M 6

#include "kernels_cpu.inc"
#include "kernels_cpu_end.inc"

/* ---- AVX-512: 16 lanes in one register ------------------------------- */
#define TGT_AVX512 __attribute__((target("avx512f,avx2,fma")))
TGT_AVX512 static inline __m512 avx512_loadw_bf16(const uint16_t *p)
{
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
TGT_AVX512 static inline float avx512_tree(__m512 a)
{
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return tree8(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
}

#define TGT TGT_AVX512
#define V __m512
#define v_zero _mm512_setzero_ps
#define v_loadx _mm512_loadu_ps
#define v_fma _mm512_fmadd_ps
#define v_tree avx512_tree
#define v_set1 _mm512_set1_ps
#define v_storex _mm512_storeu_ps
#define SFX(name) avx512_f32_##name
#define WT float
#define W2F W2F_F32
#define v_loadw _mm512_loadu_ps
#include "kernels_cpu.inc"
#define SFX(name) avx512_bf16_##name
#define WT uint16_t
#define W2F W2F_BF16
#define v_loadw avx512_loadw_bf16
#include "kernels_cpu.inc"
#include "kernels_cpu_end.inc"

/* ---- dispatch ---------------------------------------------------------- */
typedef void (*BlockFn)(float *y, const float *x, const float *xpack, void *wpack, const void *w, int T, int K, int N,
                        int n0, int n1, int G);
static const struct {
    const char *name;
    BlockFn f32, bf16;
    AttendFn attend_f32, attend_bf16;
    int tile_m;                                                   /* rows per prefill tile */
    void (*pack)(float *xp, const float *x, size_t ldx, int K); /* one tile for its panel, or NULL */
} isas[] = {
    {"generic", gen_f32_block, gen_bf16_block, gen_f32_attend, gen_bf16_attend, 3, NULL},
    {"avx2", avx2_f32_block, avx2_bf16_block, avx2_f32_attend, avx2_bf16_attend, 6, avx2_pack_tile},
    {"avx512", avx512_f32_block, avx512_bf16_block, avx512_f32_attend, avx512_bf16_attend, 3, NULL},
};
enum { ISA_GENERIC, ISA_AVX2, ISA_AVX512, ISA_AUTO = -1 };
static int isa = ISA_AUTO;
static char *pack_buf; /* packed activation tiles and weights, one region per thread */
static size_t pack_cap;

static int best_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
    return ISA_GENERIC;
}

int cpu_set_isa(const char *name)
{
    int best = best_isa();
    if (!strcmp(name, "auto")) {
        isa = best;
        return 0;
    }
    for (int i = 0; i < (int)(sizeof isas / sizeof *isas); i++)
        if (!strcmp(name, isas[i].name)) {
            if (i > best) return dcp_fail("--cpu-isa %s: this CPU does not have it (best: %s)", name, isas[best].name);
            isa = i;
            return 0;
        }
    return dcp_fail("--cpu-isa %s: choose auto, generic, avx2 or avx512", name);
}

const char *cpu_isa(void)
{
    if (isa == ISA_AUTO) isa = best_isa();
    return isas[isa].name;
}

AttendFn cpu_attend(DType kv)
{
    if (isa == ISA_AUTO) isa = best_isa();
    return kv == DTYPE_BF16 ? isas[isa].attend_bf16 : isas[isa].attend_f32;
}

int cpu_weight_group(DType t)
{
    if (isa == ISA_AUTO) isa = best_isa();
    return isa == ISA_AVX2 && t == DTYPE_BF16 ? 6 : 0;
}

/* a grouped matrix for kernels that read rows stored whole: a copy so */
static void *ungrouped(WeightRef w, int rows, int cols)
{
    size_t e = dtype_bytes(w.dtype);
    char *m = xmalloc((size_t)rows * cols * e);
    for (int r = 0; r < rows; r++) {
        const char *from = (const char *)w.data + weight_row_start(w.group, r, rows, cols) * e;
        size_t step = weight_row_step(w.group, r, rows) * e;
        for (int c = 0; c < cols; c += 16) memcpy(m + ((size_t)r * cols + c) * e, from + (size_t)(c / 16) * step, 16 * e);
    }
    return m;
}

void gemm_invariant(float *y, const float *x, WeightRef w, int T, int in, int out)
{
    if (isa == ISA_AUTO) isa = best_isa();
    if (w.group && w.group != cpu_weight_group(w.dtype)) { /* laid out for another instruction set */
        void *m = ungrouped(w, out, in);
        gemm_invariant(y, x, (WeightRef){m, w.dtype, 0}, T, in, out);
        free(m);
        return;
    }
    int G = w.group, align = G ? 12 : 4; /* row splits: whole pairs, and whole groups */
    BlockFn f = w.dtype == DTYPE_BF16 ? isas[isa].bf16 : isas[isa].f32;
    /* about 128 KiB of weights per block, a multiple of align rows: the packed
     * block stays in L2 (half of a 512 KiB L2) while prefill's row tiles
     * stream past it */
    int nb = (int)(131072 / ((size_t)in * dtype_bytes(w.dtype))) / align * align;
    if (nb < align) nb = align;
    if (nb > 2 * PANEL_MAX_PAIRS) nb = 2 * PANEL_MAX_PAIRS / align * align;
    /* prefill: rows in groups of about 2 MiB of activations (a multiple of
     * the 6- and 3-row tiles), each group passing over this thread's blocks;
     * the tiles stream from L3 (a few KiB per tile against a whole block),
     * while each group re-reads and repacks the weights from memory, so
     * larger groups pay that less often (the 110M shape's 512-token prefill
     * GEMMs: 49 -> 54-57 GFLOP/s on one thread, 93 -> 100 on two, against
     * 256 KiB blocks and 256 KiB groups) */
    int tb = (int)(2097152 / ((size_t)in * sizeof(float))) / 6 * 6;
    if (tb < 6) tb = 6;
    int tm = isas[isa].tile_m, parallel = (long)T * in * out > 100000, K16 = in & ~15;
    int threads = parallel ? omp_get_max_threads() : 1;
    /* per thread: the row group's tiles and one block's weights, packed
     * (the block repacked for each row group: packed into a buffer that
     * stays in L2, it is read faster than a packed copy of all blocks) */
    size_t xbytes = (size_t)tb * K16 * sizeof(float), block_bytes = (size_t)nb * K16 * dtype_bytes(w.dtype);
    size_t per_thread = (xbytes + block_bytes + 63) & ~(size_t)63;
    int packing = isas[isa].pack && T >= tm && K16 > 0;
    if (packing && per_thread * threads > pack_cap) { /* grows to the largest shape, then stays */
        free(pack_buf);
        pack_cap = per_thread * threads;
        pack_buf = xmalloc(pack_cap);
    }
#pragma omp parallel if (parallel)
    {
        /* this thread's rows: an even share, in multiples of align */
        int nt = omp_get_num_threads(), me = omp_get_thread_num();
        int r0 = (int)((long)out * me / nt) / align * align;
        int r1 = me == nt - 1 ? out : (int)((long)out * (me + 1) / nt) / align * align;
        float *xp = packing ? (float *)(pack_buf + per_thread * me) : NULL;
        char *wp = packing ? pack_buf + per_thread * me + xbytes : NULL;
        for (int t0 = 0; t0 < T; t0 += tb) {
            int rows = T - t0 < tb ? T - t0 : tb;
            const float *xt = x + (size_t)t0 * in;
            if (packing && r0 < r1) /* each thread packs its own copy: no barrier */
                for (int i = 0; i + tm <= rows; i += tm)
                    isas[isa].pack(xp + (size_t)(i / tm) * K16 * tm, xt + (size_t)i * in, (size_t)in, in);
            /* one row (decode) keeps nothing in L2: its GEMV takes the
             * thread's rows in one call (bf16 splits x once per call) */
            int step = T == 1 ? r1 - r0 : nb;
            for (int n0 = r0; n0 < r1; n0 += step) {
                int n1 = n0 + step < r1 ? n0 + step : r1;
                f(y + (size_t)t0 * out, xt, xp, wp, w.data, rows, in, out, n0, n1, G);
            }
        }
    }
}
