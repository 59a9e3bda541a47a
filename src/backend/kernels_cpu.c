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
 * AVX-512 holds the 16 lanes in one register, AVX2 in two halves (and its
 * prefill kernel one lane of 16 outputs in two registers), the portable
 * fallback in an array with fmaf; the results are the same bits, so a
 * request's tokens do not depend on the machine's vector width either.
 * Threads split the output columns, never K. bf16 weights are widened to
 * fp32 in registers (exact), so a bf16 matrix gives the fp32 result of its
 * widened values. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "fmath.h"
#include "kernels_cpu.h"
#include "quant.h"
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
#define W2F_F8(w) f8e4m3_to_f32(w)

/* attention reads this many keys' rows through before it computes on
 * them, where it reads whole rows (kernels_cpu.inc); where it reads a part
 * of each row, it prefetches a row that does not follow the one before (a
 * paged cache's next block) ATT_AHEAD keys ahead, and the hardware
 * prefetcher takes the others. Other distances were no better
 * (docs/benchmarks.md, "Kernel choices"). */
#define ATT_TOUCH 8
#define ATT_AHEAD 8
/* keys a block, where four tokens or more share a call: read through
 * once, then head by head for all the tokens (other sizes from 8 to 64
 * did the same) */
#ifndef ATT_BLOCK
#define ATT_BLOCK 32
#endif
static inline void prefetch_bytes(const void *p, size_t bytes)
{
    for (size_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}
/* bytes of the rows of keys i0 .. i1-1 (i1 capped at n) whose row does not
 * follow the one before (rows at element offsets row[i] of esize bytes,
 * stride apart when they follow) */
static inline void prefetch_new_rows(const void *base, const size_t *row, int i0, int i1, int n, size_t stride,
                                     size_t esize, size_t bytes)
{
    for (int i = i0; i < i1 && i < n; i++)
        if (row[i] != row[i - 1] + stride) prefetch_bytes((const char *)base + row[i] * esize, bytes);
}
/* reads bytes from p, one 4-byte load per 64-byte line, in order, into
 * acc, a register the caller makes the compiler keep (byte loads OR-ed
 * into an int ran slower) */
static inline __m128i touch_run(__m128i acc, const char *p, size_t bytes)
{
    for (size_t b = 0; b < bytes; b += 64) acc = _mm_or_si128(acc, _mm_cvtsi32_si128(*(const volatile int *)(p + b)));
    return acc;
}
/* reads rows i0 .. i1-1 (rows at element offsets row[i] of esize bytes,
 * bytes each) through, by touch_run */
static inline void touch_rows(const void *base, const size_t *row, int i0, int i1, size_t esize, size_t bytes)
{
    __m128i acc = _mm_setzero_si128();
    for (int i = i0; i < i1; i++) acc = touch_run(acc, (const char *)base + row[i] * esize, bytes);
    __asm__ volatile("" ::"x"(acc));
}
/* head-major paged keys j0 .. j1-1 (key j's row of KV head 0 at element
 * offset row[j], KV heads hs apart up to the one at last, keys of a block
 * stride apart), read through by touch_run: KV head by KV head, each run
 * of keys whose rows follow one another (a block's, or a shard's part of
 * it) in order */
static inline void touch_heads(const void *base, const size_t *row, int j0, int j1, int B, size_t stride,
                               size_t hs, size_t last, size_t esize)
{
    __m128i acc = _mm_setzero_si128();
    for (size_t e = 0; e <= last; e += hs)
        for (int j = j0, je; j < j1; j = je) {
            int end = (j / B + 1) * B < j1 ? (j / B + 1) * B : j1; /* at most to the end of key j's block */
            for (je = j + 1; je < end && row[je] == row[je - 1] + stride; je++) {}
            acc = touch_run(acc, (const char *)base + (row[j] + e) * esize, (size_t)(je - j) * stride * esize);
        }
    __asm__ volatile("" ::"x"(acc));
}
/* the end of the block of kb keys from jb, at most hi: kb on from jb, or
 * (aligned, kb whole paged blocks) the next multiple of kb */
static inline int key_block_end(int jb, int kb, int hi, int aligned)
{
    int je = aligned ? (jb / kb + 1) * kb : jb + kb;
    return je < hi ? je : hi;
}
/* the four tokens r = 0 .. 3 (keys j0[r] .. n[r]-1) all attend keys j ..
 * e-1 */
static inline int allkeys(const int *j0, const int *n, int j, int e)
{
    int ok = 1;
    for (int r = 0; r < 4; r++) ok &= j >= j0[r] && e <= n[r];
    return ok;
}
static inline int all4(const int *j0, const int *n, int j) { return allkeys(j0, n, j, j + 4); }
/* The softmax's exp(x) is fmath.h's dcp_expf (the same bits on every
 * instruction set, with every libm and on the GPU): gen_exp below does it
 * 16 lanes at once, kernels_cpu.inc's vector ones (EXP_LANES) in the same
 * operations and constants. */

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
static inline VGen gen_loadw_f8(const uint8_t *p)
{
    VGen v;
    for (int i = 0; i < 16; i++) v.l[i] = f8e4m3_to_f32(p[i]);
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
#define GEN_LANES(name, expr)                                                                                      \
    static inline VGen name(VGen a, VGen b)                                                                        \
    {                                                                                                              \
        for (int i = 0; i < 16; i++) a.l[i] = (expr);                                                              \
        return a;                                                                                                  \
    }
GEN_LANES(gen_add, a.l[i] + b.l[i])
GEN_LANES(gen_sub, a.l[i] - b.l[i])
GEN_LANES(gen_mul, a.l[i] * b.l[i])
GEN_LANES(gen_max, a.l[i] > b.l[i] ? a.l[i] : b.l[i])
#undef GEN_LANES
static inline VGen gen_exp(VGen a)
{
    for (int i = 0; i < 16; i++) a.l[i] = dcp_expf(a.l[i]);
    return a;
}
static inline float gen_tree(VGen a)
{
    float h[8], g[4];
    for (int i = 0; i < 8; i++) h[i] = a.l[i] + a.l[i + 8];
    for (int i = 0; i < 4; i++) g[i] = h[i] + h[i + 4];
    return (g[0] + g[2]) + (g[1] + g[3]);
}
/* the maximum of the lanes by the same tree, max(a, b) = a > b ? a : b */
static inline float fmax_gt(float a, float b) { return a > b ? a : b; }
static inline float gen_maxtree(VGen a)
{
    float h[8], g[4];
    for (int i = 0; i < 8; i++) h[i] = fmax_gt(a.l[i], a.l[i + 8]);
    for (int i = 0; i < 4; i++) g[i] = fmax_gt(h[i], h[i + 4]);
    return fmax_gt(fmax_gt(g[0], g[2]), fmax_gt(g[1], g[3]));
}

static inline void gen_trees16(const VGen *a, float *s)
{
    for (int i = 0; i < 16; i++) s[i] = gen_tree(a[i]);
}

#define TGT
#define V VGen
#define v_trees16 gen_trees16
#define v_add gen_add
#define v_sub gen_sub
#define v_mul gen_mul
#define v_max gen_max
#define v_exp gen_exp
#define v_maxtree gen_maxtree
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
/* an FP8 KV cache's keys and values (--kv-cache-dtype fp8): its attention
 * is used, its GEMM kernels are not (FP8 weights carry scales: gen_dequant) */
#undef TGT
#define TGT __attribute__((unused))
#define SFX(name) gen_f8_##name
#define WT uint8_t
#define W2F W2F_F8
#define v_loadw gen_loadw_f8
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
/* eight FP8 E4M3 bytes to fp32: f8e4m3_to_f32's operations lane by lane */
TGT_AVX2 static inline __m256 avx2_widen8_f8(const uint8_t *p)
{
    const __m256i mag = _mm256_set1_epi32(0x7f), sign = _mm256_set1_epi32(0x80);
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)), e = _mm256_and_si256(b, mag);
    __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e, 20)), _mm256_set1_ps(0x1p120f));
    f = _mm256_blendv_ps(f, _mm256_set1_ps(__builtin_nanf("")), _mm256_castsi256_ps(_mm256_cmpeq_epi32(e, mag)));
    return _mm256_or_ps(f, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(b, sign), 24)));
}
TGT_AVX2 static inline V2 avx2_loadw_f8(const uint8_t *p) { return (V2){avx2_widen8_f8(p), avx2_widen8_f8(p + 8)}; }
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
/* the maximum of h's 8 lanes by gen_maxtree's tree (max_ps(a, b) is a > b
 * ? a : b), shared with AVX-512 */
TGT_AVX2 static inline float maxtree8(__m256 h)
{
    __m128 g = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    __m128 f = _mm_max_ps(g, _mm_movehl_ps(g, g));
    return _mm_cvtss_f32(_mm_max_ss(f, _mm_shuffle_ps(f, f, 1)));
}
/* dcp_expf in vector lanes, its operations in order: NAME(x) for the
 * target TGTATTR on VF vectors (VI their integers), intrinsics P##_op
 * (_mm256 or _mm512) and casts P##_castps_##SI (si256 or si512) */
#define EXP_LANES(name, tgtattr, VF, VI, P, SI)                                                                   \
    tgtattr static inline VF name(VF x)                                                                            \
    {                                                                                                              \
        x = P##_min_ps(P##_set1_ps(EXP_HI), P##_max_ps(P##_set1_ps(EXP_LO), x)); /* NaN: x */                    \
        VF magic = P##_set1_ps(EXP_MAGIC), t = P##_fmadd_ps(x, P##_set1_ps(EXP_LOG2E), magic);                   \
        VF kf = P##_sub_ps(t, magic);                                                                              \
        VF r = P##_fmadd_ps(kf, P##_set1_ps(-EXP_LN2_LO), P##_fmadd_ps(kf, P##_set1_ps(-EXP_LN2_HI), x));       \
        VF p = P##_fmadd_ps(P##_set1_ps(EXP_P0), r, P##_set1_ps(EXP_P1));                                        \
        p = P##_fmadd_ps(p, r, P##_set1_ps(EXP_P2));                                                             \
        p = P##_fmadd_ps(p, r, P##_set1_ps(EXP_P3));                                                             \
        p = P##_fmadd_ps(p, r, P##_set1_ps(EXP_P4));                                                             \
        p = P##_fmadd_ps(p, r, P##_set1_ps(EXP_P5));                                                             \
        p = P##_add_ps(P##_fmadd_ps(p, P##_mul_ps(r, r), r), P##_set1_ps(1.0f));                                 \
        VI k = P##_sub_epi32(P##_castps_##SI(t), P##_castps_##SI(magic));                                        \
        VI k1 = P##_srai_epi32(k, 1), k2 = P##_sub_epi32(k, k1), bias = P##_set1_epi32(127);                     \
        VF f1 = P##_cast##SI##_ps(P##_slli_epi32(P##_add_epi32(k1, bias), 23));                                \
        VF f2 = P##_cast##SI##_ps(P##_slli_epi32(P##_add_epi32(k2, bias), 23));                                \
        return P##_mul_ps(P##_mul_ps(p, f1), f2);                                                                \
    }
EXP_LANES(avx2_exp8, TGT_AVX2, __m256, __m256i, _mm256, si256)
#define AVX2_LANES(name, op)                                                                                       \
    TGT_AVX2 static inline V2 name(V2 a, V2 b) { return (V2){op(a.lo, b.lo), op(a.hi, b.hi)}; }
AVX2_LANES(avx2_add, _mm256_add_ps)
AVX2_LANES(avx2_sub, _mm256_sub_ps)
AVX2_LANES(avx2_mul, _mm256_mul_ps)
AVX2_LANES(avx2_max, _mm256_max_ps)
#undef AVX2_LANES
TGT_AVX2 static inline V2 avx2_exp(V2 a) { return (V2){avx2_exp8(a.lo), avx2_exp8(a.hi)}; }
TGT_AVX2 static inline float avx2_maxtree(V2 a) { return maxtree8(_mm256_max_ps(a.lo, a.hi)); }
TGT_AVX2 static inline V2 avx2_set1(float f) { return (V2){_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
TGT_AVX2 static inline void avx2_storex(float *p, V2 v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
TGT_AVX2 static inline float avx2_tree(V2 a) { return tree8(_mm256_add_ps(a.lo, a.hi)); }
TGT_AVX2 static inline void avx2_trees16(const V2 *a, float *s)
{
    for (int i = 0; i < 16; i++) s[i] = avx2_tree(a[i]);
}

/* AVX2's prefill kernel holds the 16 chains the other way round: one
 * lane's chain (k = l, l + 16, ... < K16) for a tile of six activation
 * rows by 16 weight rows, 12 registers, with the activations broadcast.
 * The lanes run one after another, each from zero over its k in order, and
 * their sums of an output are added by v_tree's tree (avx2_lane_panel), so
 * every element is dot_finish's arithmetic. Per step: two vector loads
 * of weights and six broadcasts for 12 FMAs, where lanes along K (as in
 * the GEMV and the pair kernel below) make every operand a full vector,
 * eight vector loads per 12 FMAs, so the broadcast form does more FMAs per
 * load and wins for prefill's long K; each lane's run of K/16 steps costs
 * a few steps more to start, which short K cannot pay back
 * (docs/benchmarks.md, "Kernel choices"). Both operands come packed in lane order: a tile (avx2_pack_tile)
 * holds, lane by lane in the kernel's order (avx2_packed_at), the six
 * rows' x[k] for k = l, l + 16, ...; a panel of 16 weight rows
 * (avx2_pack_weights) the 16 rows' w[k] the same way, widened to fp32, so
 * bf16 and fp32 share the kernel. Each lane's run is padded by one cache
 * line: lane runs a power of two apart (K = 2048) would map the 16 streams
 * of the packing to one L1 set. The tail k = K16 .. K-1 follows the 16
 * lanes, one k at a time. */
static inline size_t avx2_lane_floats(int K, int rows) { return (size_t)K / 16 * rows + 16; }
static inline size_t avx2_lane_tile_floats(int K) { return 16 * avx2_lane_floats(K, 6) + (size_t)(K % 16) * 6; }
static inline size_t avx2_panel_floats(int K) { return 16 * avx2_lane_floats(K, 16) + (size_t)(K % 16) * 16; }
/* lane l's run is the bitrev4(l)-th: the runs in the order v_tree adds the
 * lanes (0, 8, 4, 12, 2, ...), the order the kernel takes them */
static inline int bitrev4(int l) { return (l & 1) << 3 | (l & 2) << 1 | (l & 4) >> 1 | (l & 8) >> 3; }
/* packed index of column k: its lane's run, then its step in it */
static inline size_t avx2_packed_at(int k, int K, int rows)
{
    int K16 = K & ~15;
    return k < K16 ? (size_t)bitrev4(k % 16) * avx2_lane_floats(K, rows) + (size_t)(k / 16) * rows
                   : 16 * avx2_lane_floats(K, rows) + (size_t)(k - K16) * rows;
}

/* where each lane's run starts, for the packing's stores (computed for
 * every store, bitrev4 and all, they made GEMMs of a few tiles, where the
 * packing outweighs the kernel, 8-21% longer) */
static inline void avx2_run_starts(size_t run[16], int K, int rows)
{
    for (int l = 0; l < 16; l++) run[l] = avx2_packed_at(l, K, rows);
}
/* avx2_packed_at(k, K, rows) for k < K16, from those starts */
static inline size_t avx2_run_at(const size_t run[16], int k, int rows)
{
    return run[k % 16] + (size_t)(k / 16) * rows;
}

TGT_AVX2 static inline void avx2_transpose8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Six rows of x (ldx apart) packed in lane order: avx2_lane_tile_floats(K).
 * A part tile (rows < 6) repeats its last row; the panel stores only
 * its rows. */
TGT_AVX2 static void avx2_pack_lane_tile(float *xp, const float *x, size_t ldx, int K, int rows)
{
    int K16 = K & ~15;
    size_t run[16];
    avx2_run_starts(run, K, 6);
    for (int k0 = 0; k0 < K16; k0 += 8) { /* 8 columns of the 6 rows (the last twice or more) turned */
        __m256 r[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(x + (i < rows ? i : rows - 1) * ldx + k0);
        avx2_transpose8(r);
        for (int i = 0; i < 8; i++) { /* six floats: a masked store is microcoded on AMD */
            float *d = xp + avx2_run_at(run, k0 + i, 6);
            _mm_storeu_ps(d, _mm256_castps256_ps128(r[i]));
            _mm_storel_pi((__m64 *)(d + 4), _mm256_extractf128_ps(r[i], 1));
        }
    }
    for (int k = K16; k < K; k++)
        for (int r = 0; r < 6; r++) xp[avx2_packed_at(k, K, 6) + r] = x[(r < rows ? r : rows - 1) * ldx + k];
}

/* Weight rows n0 .. n0 + ncols - 1 of an N x K matrix (elements of esize
 * bytes, row groups G: WeightRef) packed as panels of 16 rows in lane
 * order, fp32: avx2_panel_floats(K) each. A last panel's missing rows
 * repeat its last row (their results are not stored). */
TGT_AVX2 static void avx2_pack_panels(void *wp, const void *w, int n0, int ncols, int N, int K, int G, size_t esize)
{
    int K16 = K & ~15;
    const char *in = w;
    float *out = wp;
    size_t run[16];
    avx2_run_starts(run, K, 16);
    for (int p = 0; p < ncols; p += 16, out += avx2_panel_floats(K)) {
        const char *row[16];
        size_t step[16];
        for (int i = 0; i < 16; i++) {
            int n = n0 + p + (p + i < ncols ? i : ncols - 1 - p);
            row[i] = in + weight_row_start(G, n, N, K) * esize, step[i] = weight_row_step(G, n, N) * esize;
        }
        /* the next panel's 16 rows, one run of memory (nearly so when
         * grouped), fetched into L2 while this one is turned */
        const char *next = in + weight_row_start(G, n0 + p + 16 < N ? n0 + p + 16 : n0 + p, N, K) * esize;
        size_t next_lines = p + 16 < ncols ? 16 * (size_t)K * esize / 64 : 0, fetched = 0;
        for (int k0 = 0; k0 < K16; k0 += 8) {
            for (size_t end = next_lines * (k0 + 8) / K16; fetched < end; fetched++)
                _mm_prefetch(next + 64 * fetched, _MM_HINT_T1);
            for (int h = 0; h < 16; h += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++) {
                    const char *from = row[h + i] + (size_t)(k0 / 16) * step[h + i] + (size_t)(k0 % 16) * esize;
                    r[i] = esize == 4 ? _mm256_loadu_ps((const float *)from) : avx2_widen8((const uint16_t *)from);
                }
                avx2_transpose8(r);
                for (int i = 0; i < 8; i++) _mm256_storeu_ps(out + avx2_run_at(run, k0 + i, 16) + h, r[i]);
            }
        }
        for (int k = K16; k < K; k++) /* the tail: rows stored whole (G 0) */
            for (int i = 0; i < 16; i++) {
                const char *from = row[i] + (size_t)k * esize;
                out[avx2_packed_at(k, K, 16) + i] = esize == 4 ? *(const float *)from : bf16_bits_to_f32(*(const uint16_t *)from);
            }
    }
}

/* The packed tile against ncols packed weight rows: y (the tile's rows,
 * ldy apart). The lanes run in the order v_tree adds them (0, 8, 4, 12,
 * 2, ...: bitrev4, as they are packed), and each lane's sums join the
 * tree as soon as its run ends: the q-th lane closes a subtree for each
 * trailing one bit of q, and adds that subtree's other half from a stack
 * of at most four, the same additions as v_tree's. They overlap the next
 * lane's run, where adding all 16 lanes' stored sums after the last was a
 * visible share of the kernel's time. The panels are packed in the same
 * order, so that they are read as one stream. */
#define ACC12(OP) OP(0, a00) OP(1, a01) OP(2, a10) OP(3, a11) OP(4, a20) OP(5, a21) \
    OP(6, a30) OP(7, a31) OP(8, a40) OP(9, a41) OP(10, a50) OP(11, a51)
TGT_AVX2 static void avx2_lane_panel(float *y, size_t ldy, const float *xp, const float *wp, int ncols, int K, int rows)
{
    int S = K / 16, K16 = K & ~15;
    for (int p = 0; p < ncols; p += 16, wp += avx2_panel_floats(K)) {
        __m256 part[4][12]; /* part[j]: a subtree of 2^j lanes; its 12 sums: row i, weight rows 0-7 (2i), 8-15 (2i + 1) */
        __m256 sum[12];
        for (int q = 0; q < 16; q++) {
            const float *xl = xp + (size_t)q * avx2_lane_floats(K, 6), *wl = wp + (size_t)q * avx2_lane_floats(K, 16);
            __m256 z = _mm256_setzero_ps(), a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z;
            __m256 a30 = z, a31 = z, a40 = z, a41 = z, a50 = z, a51 = z;
            for (int s = 0; s < S; s++, xl += 6, wl += 16) {
                __m256 b0 = _mm256_loadu_ps(wl), b1 = _mm256_loadu_ps(wl + 8), v;
                v = _mm256_broadcast_ss(xl);
                a00 = _mm256_fmadd_ps(v, b0, a00), a01 = _mm256_fmadd_ps(v, b1, a01);
                v = _mm256_broadcast_ss(xl + 1);
                a10 = _mm256_fmadd_ps(v, b0, a10), a11 = _mm256_fmadd_ps(v, b1, a11);
                v = _mm256_broadcast_ss(xl + 2);
                a20 = _mm256_fmadd_ps(v, b0, a20), a21 = _mm256_fmadd_ps(v, b1, a21);
                v = _mm256_broadcast_ss(xl + 3);
                a30 = _mm256_fmadd_ps(v, b0, a30), a31 = _mm256_fmadd_ps(v, b1, a31);
                v = _mm256_broadcast_ss(xl + 4);
                a40 = _mm256_fmadd_ps(v, b0, a40), a41 = _mm256_fmadd_ps(v, b1, a41);
                v = _mm256_broadcast_ss(xl + 5);
                a50 = _mm256_fmadd_ps(v, b0, a50), a51 = _mm256_fmadd_ps(v, b1, a51);
            }
            int j = 0;
            for (; q >> j & 1; j++) { /* the subtrees this lane closes: earlier lanes first, as v_tree adds */
#define JOIN(i, a) a = _mm256_add_ps(part[j][i], a);
                ACC12(JOIN)
#undef JOIN
            }
#define KEEP(i, a) to[i] = a;
            __m256 *to = q < 15 ? part[j] : sum;
            ACC12(KEEP)
#undef KEEP
        }
        const float *xt = xp + avx2_packed_at(K16, K, 6), *wt = wp + avx2_packed_at(K16, K, 16);
        for (int i = 0; i < 12; i++) { /* then the tail, eight outputs at a time */
            int r = i / 2, c = 8 * (i % 2);
            if (r >= rows) break;
            __m256 s = sum[i];
            for (int k = 0; k < K - K16; k++)
                s = _mm256_fmadd_ps(_mm256_broadcast_ss(xt + k * 6 + r), _mm256_loadu_ps(wt + k * 16 + c), s);
            float *yr = y + r * ldy + p + c;
            if (ncols - p - c >= 8) _mm256_storeu_ps(yr, s);
            else {
                float v[8];
                _mm256_storeu_ps(v, s);
                for (int j = 0; j < ncols - p - c; j++) yr[j] = v[j];
            }
        }
    }
}
#undef ACC12

/* For K under AVX2_LANE_K, a lane's run is too short to pay for its start
 * and its store (110M's shapes have K = 768 and 2048; stories15M's
 * K = 288, where the batched GEMMs took 20-40% longer so), and the tile
 * keeps lanes along K, as the GEMV does: six rows against two weight rows,
 * each 16-column step in two passes (lanes 0-7, then 8-15), twelve 8-lane
 * accumulators. Each lane's chain runs over k in order, so the result is
 * dot_finish's. Packed: a tile, K16 * 6 floats, holds lanes 0-7 of every
 * step with the six rows' 8 floats side by side, then lanes 8-15; a pair
 * of weight rows, in their own type, lanes 0-7 of every step of both rows
 * side by side, then lanes 8-15, so each pass streams whole cache lines. */
#define AVX2_LANE_K 512
#define REG(v) ({ __asm__("" : "+x"(v)); }) /* else GCC reloads v inside every FMA */
TGT_AVX2 static void avx2_pack_pair_tile(float *xp, const float *x, size_t ldx, int K, int rows)
{
    int K16 = K & ~15;
    for (int half = 0; half < 2; half++)
        for (int k = 0; k < K16; k += 16)
            for (int r = 0; r < 6; r++)
                memcpy(xp + (size_t)half * K16 * 3 + (size_t)k * 3 + r * 8,
                       x + (r < rows ? r : rows - 1) * ldx + k + 8 * half, 32);
}
/* (an odd last row is paired with itself; its second result is not stored) */
TGT_AVX2 static void avx2_pack_pairs(void *wp, const void *w, int n0, int ncols, int N, int K, int G, size_t esize)
{
    int K16 = K & ~15;
    char *out = wp;
    const char *in = w;
    for (int n = n0; n < n0 + ncols; n += 2) {
        int m = n + 1 < n0 + ncols ? n + 1 : n;
        const char *row[2] = {in + weight_row_start(G, n, N, K) * esize, in + weight_row_start(G, m, N, K) * esize};
        size_t step[2] = {weight_row_step(G, n, N) * esize, weight_row_step(G, m, N) * esize};
        for (int half = 0; half < 2; half++)
            for (int k = 8 * half; k < K16; k += 16)
                for (int j = 0; j < 2; j++, out += 8 * esize) {
                    const char *from = row[j] + (size_t)(k / 16) * step[j] + (size_t)(k % 16) * esize;
                    if (esize == 4) memcpy(out, from, 32); /* constant sizes: inlined moves, not calls */
                    else memcpy(out, from, 16);
                }
    }
}
/* wp: the block packed by avx2_pack_pairs, or NULL: the rows read in
 * place, row n's 16 columns of step s at weight_row_start + s * step. Row
 * starts once per pair, and not at all when packed: computed for every
 * output element, they made a 510 x 288 x 768 bf16 GEMM take about 15%
 * longer. */
#define AVX2_PAIRS_PANEL(NAME, WT, LOADW8, FINISH)                                                                  \
    TGT_AVX2 static void NAME(float *y, size_t ldy, const float *x, size_t ldx, const float *xp, const WT *w,       \
                              const WT *wp, int n0, int N, int G, int ncols, int K, int rows)                      \
    {                                                                                                              \
        int K16 = K & ~15;                                                                                         \
        for (int pr = 0; 2 * pr < ncols; pr++) {                                                                   \
            int n = n0 + 2 * pr, m = 2 * pr + 1 < ncols ? n + 1 : n;                                               \
            /* packed, the rows are read only for the tail, and grouped rows have none */                         \
            int g = wp ? 0 : G;                                                                                    \
            const WT *row[2] = {w + weight_row_start(g, n, N, K), w + weight_row_start(g, m, N, K)};               \
            size_t sa = weight_row_step(g, n, N), sb = weight_row_step(g, m, N);                                   \
            __m256 acc[2][12];                                                                                     \
            for (int half = 0; half < 2; half++) {                                                                 \
                const WT *wa = wp ? wp + (size_t)(2 * pr + half) * K16 : row[0] + 8 * half;                        \
                const WT *wb = wp ? wa + 8 : row[1] + 8 * half;                                                    \
                const float *xk = xp + (size_t)half * K16 * 3;                                                     \
                __m256 z = _mm256_setzero_ps(), a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z;              \
                __m256 a30 = z, a31 = z, a40 = z, a41 = z, a50 = z, a51 = z;                                       \
                for (int k = 0; k < K16; k += 16, xk += 48, wa += sa, wb += sb) {                                  \
                    __m256 b0 = LOADW8(wa), b1 = LOADW8(wb), v;                                                    \
                    v = _mm256_loadu_ps(xk), REG(v);                                                               \
                    a00 = _mm256_fmadd_ps(v, b0, a00), a01 = _mm256_fmadd_ps(v, b1, a01);                          \
                    v = _mm256_loadu_ps(xk + 8), REG(v);                                                           \
                    a10 = _mm256_fmadd_ps(v, b0, a10), a11 = _mm256_fmadd_ps(v, b1, a11);                          \
                    v = _mm256_loadu_ps(xk + 16), REG(v);                                                          \
                    a20 = _mm256_fmadd_ps(v, b0, a20), a21 = _mm256_fmadd_ps(v, b1, a21);                          \
                    v = _mm256_loadu_ps(xk + 24), REG(v);                                                          \
                    a30 = _mm256_fmadd_ps(v, b0, a30), a31 = _mm256_fmadd_ps(v, b1, a31);                          \
                    v = _mm256_loadu_ps(xk + 32), REG(v);                                                          \
                    a40 = _mm256_fmadd_ps(v, b0, a40), a41 = _mm256_fmadd_ps(v, b1, a41);                          \
                    v = _mm256_loadu_ps(xk + 40), REG(v);                                                          \
                    a50 = _mm256_fmadd_ps(v, b0, a50), a51 = _mm256_fmadd_ps(v, b1, a51);                          \
                }                                                                                                  \
                __m256 *p = acc[half];                                                                             \
                p[0] = a00, p[1] = a01, p[2] = a10, p[3] = a11, p[4] = a20, p[5] = a21;                            \
                p[6] = a30, p[7] = a31, p[8] = a40, p[9] = a41, p[10] = a50, p[11] = a51;                          \
            }                                                                                                      \
            for (int i = 0; i < rows; i++)                                                                         \
                for (int j = 0; j < 2 && 2 * pr + j < ncols; j++)                                                 \
                    y[i * ldy + 2 * pr + j] = FINISH((V2){acc[0][2 * i + j], acc[1][2 * i + j]}, x + i * ldx,      \
                                                     row[j], K16, K);                                              \
        }                                                                                                          \
    }                                                                                                              \
    TGT_AVX2 static void NAME##_or_lanes(float *y, size_t ldy, const float *x, size_t ldx, const float *xp,        \
                                         const WT *w, const void *wp, int n0, int N, int G, int ncols, int K,      \
                                         int rows)                                                                 \
    {                                                                                                              \
        if (K >= AVX2_LANE_K) avx2_lane_panel(y, ldy, xp, wp, ncols, K, rows);                                     \
        else NAME(y, ldy, x, ldx, xp, w, wp, n0, N, G, ncols, K, rows);                                            \
    }

/* the AVX2 prefill layouts by K */
TGT_AVX2 static void avx2_pack_tile(float *xp, const float *x, size_t ldx, int K, int rows)
{
    if (K >= AVX2_LANE_K) avx2_pack_lane_tile(xp, x, ldx, K, rows);
    else avx2_pack_pair_tile(xp, x, ldx, K, rows);
}
static size_t avx2_tile_floats(int K) { return K >= AVX2_LANE_K ? avx2_lane_tile_floats(K) : (size_t)(K & ~15) * 6; }
/* Lanes: always packed. Pairs: packed only for many rows, read in place
 * for fewer (packing costs about what a few tiles do). Read in place
 * against packed, one thread: fp32 32 x 288 x 32000 0.86 of the time,
 * T x 288 x 768 0.91-0.96 for T = 32-96, 0.97-1.04 from 128 rows; bf16 in
 * six-row groups 0.98 at 32 rows, 1.02 at 48, 1.04-1.07 from 96. */
#ifndef PAIRS_PACK_F32
#define PAIRS_PACK_F32 192
#endif
#ifndef PAIRS_PACK_BF16
#define PAIRS_PACK_BF16 48
#endif
TGT_AVX2 static const void *avx2_pack_weights(void *wp, const void *w, int n0, int ncols, int N, int K, int G,
                                              size_t esize, int tiles)
{
    if (K >= AVX2_LANE_K) avx2_pack_panels(wp, w, n0, ncols, N, K, G, esize);
    else if (tiles >= (esize == 4 ? PAIRS_PACK_F32 : PAIRS_PACK_BF16)) avx2_pack_pairs(wp, w, n0, ncols, N, K, G, esize);
    else return NULL;
    return wp;
}
/* weight rows per block (a multiple of 16) and the floats their packing
 * takes: panels about 512 KiB (each tile is read once per block, and a
 * packed panel streams well even from L3: 110M's GEMMs on one thread were
 * alike from 64 to 256 rows); pairs about 128 KiB as stored, the block
 * staying in L2 while the tiles pass it */
static int avx2_block_rows(int K, size_t esize)
{
    int n = K >= AVX2_LANE_K ? (int)(524288 / (avx2_panel_floats(K) / 16 * sizeof(float)))
                             : (int)(131072 / ((size_t)K * esize));
    return n < 16 ? 16 : n / 16 * 16;
}
static size_t avx2_block_floats(int n, int K)
{
    return K >= AVX2_LANE_K ? (size_t)(n + 15) / 16 * avx2_panel_floats(K) : (size_t)(n + 1) / 2 * 2 * (K & ~15);
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
 * run of memory, prefetched 1 KiB ahead, which reads faster than six
 * whole rows side by side. Whole rows under 4 KiB prefetch the next R rows
 * as one linear stream: the hardware prefetcher would start each row's
 * stream anew; longer rows do better without. */
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
#define v_trees16 avx2_trees16
#define v_add avx2_add
#define v_sub avx2_sub
#define v_mul avx2_mul
#define v_max avx2_max
#define v_exp avx2_exp
#define v_maxtree avx2_maxtree
#define v_set1 avx2_set1
#define v_storex avx2_storex
#define SFX(name) avx2_f32_##name
#define WT float
#define W2F W2F_F32
#define v_loadw avx2_loadx
TGT static inline float SFX(dot_finish)(V acc, const float *x, const WT *w, int k, int K);
/* decode's GEMV: one weight row at a time, its 16 lanes in two 8-lane
 * chains, so that the weights are read as one linear stream (as with
 * AVX-512). Six rows at once (twelve chains) read six streams side by
 * side, which the hardware prefetcher follows worse. Prefetching ahead,
 * which helps AVX-512's, did not help here (docs/benchmarks.md, "Kernel
 * choices"). */
TGT_AVX2 static void avx2_f32_gemv_rows(float *y, const float *x, const float *w, int n0, int n1, int N, int K, int G)
{
    (void)N, (void)G; /* fp32 rows are stored whole */
    int K16 = K & ~15;
    for (int n = n0; n < n1; n++) {
        const float *wn = w + (size_t)n * K;
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int k = 0; k < K16; k += 16) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(wn + k), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(wn + k + 8), hi);
        }
        y[n] = avx2_f32_dot_finish((V2){lo, hi}, x, wn, K16, K);
    }
}
AVX2_PAIRS_PANEL(avx2_f32_pairs, float, avx2_loadu8, avx2_f32_dot_finish)
#define PANEL avx2_f32_pairs_or_lanes
#define PACK_W avx2_pack_weights
#define TILE_FLOATS avx2_tile_floats
#define GEMV_ROWS avx2_f32_gemv_rows
#define TILE_M 6

#include "kernels_cpu.inc"
#define SFX(name) avx2_bf16_##name
#define WT uint16_t
#define W2F W2F_BF16
#define v_loadw avx2_loadw_bf16
AVX2_PAIRS_PANEL(avx2_bf16_pairs, uint16_t, avx2_widen8, avx2_bf16_dot_finish)
#define PANEL avx2_bf16_pairs_or_lanes
#define PACK_W avx2_pack_weights
#define TILE_FLOATS avx2_tile_floats
#define GEMV_ROWS avx2_bf16_gemv_rows
#define TILE_M 6

#include "kernels_cpu.inc"
#undef TGT
#define TGT TGT_AVX2 __attribute__((unused))
#define SFX(name) avx2_f8_##name
#define WT uint8_t
#define W2F W2F_F8
#define v_loadw avx2_loadw_f8
#include "kernels_cpu.inc"
#include "kernels_cpu_end.inc"

/* ---- AVX-512: 16 lanes in one register ------------------------------- */
#define TGT_AVX512 __attribute__((target("avx512f,avx2,fma")))
TGT_AVX512 static inline __m512 avx512_loadw_bf16(const uint16_t *p)
{
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
/* sixteen FP8 E4M3 bytes to fp32: f8e4m3_to_f32's operations lane by lane */
TGT_AVX512 static inline __m512 avx512_loadw_f8(const uint8_t *p)
{
    const __m512i mag = _mm512_set1_epi32(0x7f), sign = _mm512_set1_epi32(0x80);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)), e = _mm512_and_si512(b, mag);
    __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(e, 20)), _mm512_set1_ps(0x1p120f));
    f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(e, mag), _mm512_set1_ps(__builtin_nanf("")));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), _mm512_slli_epi32(_mm512_and_si512(b, sign), 24)));
}
TGT_AVX512 static inline float avx512_tree(__m512 a)
{
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return tree8(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
}

/* the 16 trees of a[0 .. 15] at once, s[i] = avx512_tree(a[i]): the same
 * additions (h[i] = a[i] + a[i + 8], g[i] = h[i] + h[i + 4], (g0 + g2) +
 * (g1 + g3)) on the 16 accumulators side by side, their lanes brought
 * together by shuffles; b[4m + c] = a[4c + m] puts a[i]'s sum in lane i */
TGT_AVX512 static inline void avx512_trees16(const __m512 *a, float *s)
{
    __m512 p[8], g[4], z[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* [h(b[2i]) | h(b[2i + 1])] */
        __m512 x = a[(2 * i) % 4 * 4 + (2 * i) / 4], y = a[(2 * i + 1) % 4 * 4 + (2 * i + 1) / 4];
        p[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xee));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* [g(b[4i]), g(b[4i + 1]), g(b[4i + 2]), g(b[4i + 3])], 4 lanes each */
        g[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xdd));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* per 4 lanes c: [g0 + g2, g1 + g3] of two of them */
        z[i] = _mm512_add_ps(_mm512_shuffle_ps(g[2 * i], g[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(g[2 * i], g[2 * i + 1], 0xee));
    /* lane 4c + m: the sum of b[4m + c] */
    _mm512_storeu_ps(s, _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xdd)));
}

TGT_AVX512 static inline float avx512_maxtree(__m512 a)
{
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return maxtree8(_mm256_max_ps(_mm512_castps512_ps256(a), hi));
}
EXP_LANES(avx512_exp, TGT_AVX512, __m512, __m512i, _mm512, si512)

TGT_AVX512 static inline float avx512_f32_dot_finish(__m512 acc, const float *x, const float *w, int k, int K);
TGT_AVX512 static inline float avx512_bf16_dot_finish(__m512 acc, const float *x, const uint16_t *w, int k, int K);

/* AVX2's prefill kernel (avx2_lane_panel) with a lane's 16 weight rows in
 * one register: the same packing, six accumulators, and the activations
 * broadcast from memory into the FMAs. The same additions in the same
 * order, so the same bits. */
#define ACC6(OP) OP(0, a0) OP(1, a1) OP(2, a2) OP(3, a3) OP(4, a4) OP(5, a5)
TGT_AVX512 static void avx512_lane_panel(float *y, size_t ldy, const float *xp, const float *wp, int ncols, int K,
                                         int rows)
{
    int S = K / 16, K16 = K & ~15;
    for (int p = 0; p < ncols; p += 16, wp += avx2_panel_floats(K)) {
        __m512 part[4][6], sum[6];
        for (int q = 0; q < 16; q++) {
            const float *xl = xp + (size_t)q * avx2_lane_floats(K, 6), *wl = wp + (size_t)q * avx2_lane_floats(K, 16);
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
            for (int s = 0; s < S; s++, xl += 6, wl += 16) {
                __m512 b = _mm512_loadu_ps(wl);
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(xl[0]), b, a0), a1 = _mm512_fmadd_ps(_mm512_set1_ps(xl[1]), b, a1);
                a2 = _mm512_fmadd_ps(_mm512_set1_ps(xl[2]), b, a2), a3 = _mm512_fmadd_ps(_mm512_set1_ps(xl[3]), b, a3);
                a4 = _mm512_fmadd_ps(_mm512_set1_ps(xl[4]), b, a4), a5 = _mm512_fmadd_ps(_mm512_set1_ps(xl[5]), b, a5);
            }
            int j = 0;
            for (; q >> j & 1; j++) { /* the subtrees this lane closes, as in avx2_lane_panel */
#define JOIN(i, a) a = _mm512_add_ps(part[j][i], a);
                ACC6(JOIN)
#undef JOIN
            }
#define KEEP(i, a) to[i] = a;
            __m512 *to = q < 15 ? part[j] : sum;
            ACC6(KEEP)
#undef KEEP
        }
        const float *xt = xp + avx2_packed_at(K16, K, 6), *wt = wp + avx2_packed_at(K16, K, 16);
        int n = ncols - p < 16 ? ncols - p : 16;
        for (int r = 0; r < rows; r++) {
            __m512 s = sum[r];
            for (int k = 0; k < K - K16; k++)
                s = _mm512_fmadd_ps(_mm512_set1_ps(xt[k * 6 + r]), _mm512_loadu_ps(wt + k * 16), s);
            _mm512_mask_storeu_ps(y + r * ldy + p, (__mmask16)((1u << n) - 1), s);
        }
    }
}
#undef ACC6

/* decode's fp32 GEMV: one weight row at a time, one 16-lane chain, so that
 * the weights are read as one linear stream, which the hardware prefetcher
 * follows best; out-of-order execution overlaps the next rows' chains
 * with this one's; it reads faster than six rows at once with the next
 * six fetched into L2. Each line is also fetched into L2 GEMV_AHEAD bytes
 * ahead of its use, the distance that read fastest; bf16's groups did not
 * gain from it at any distance (docs/benchmarks.md, "Kernel choices"). */
#define GEMV_AHEAD 3072
TGT_AVX512 static void avx512_f32_gemv_rows(float *y, const float *x, const float *w, int n0, int n1, int N, int K,
                                            int G)
{
    (void)N, (void)G; /* fp32 rows are stored whole */
    int K16 = K & ~15;
    for (int n = n0; n < n1; n++) {
        const float *wn = w + (size_t)n * K;
        __m512 a = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int k = 0; k < K16; k += 16) {
            _mm_prefetch((const char *)(wn + k) + GEMV_AHEAD, _MM_HINT_T1);
            a = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(wn + k), a);
        }
        y[n] = avx512_f32_dot_finish(a, x, wn, K16, K);
    }
}
/* A few activation rows (2 to ROWS_MAX: a step verifying drafts, a small
 * batch) against fp32 weight rows stored whole: each weight row is read
 * once, as the GEMV reads it, and each load of it feeds every activation
 * row's chain, two weight rows at a time (four at a time, or three for
 * six rows and more, read no faster). Each output element is still one 16-lane chain over k
 * in order and dot_finish, so its bits are the GEMV's and the tiles'. */
#define ROWS_MAX 8
TGT_AVX512 static inline __attribute__((always_inline)) void avx512_f32_rows_t(float *y, size_t ldy, const float *x,
                                                                               const float *w, int n0, int n1, int K,
                                                                               const int T, const int NW)
{
    int K16 = K & ~15, n = n0;
    for (; n + NW <= n1; n += NW) {
        const float *wn = w + (size_t)n * K;
        __m512 a[4][ROWS_MAX];
#pragma GCC unroll 4
        for (int j = 0; j < NW; j++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) a[j][t] = _mm512_setzero_ps();
        for (int k = 0; k < K16; k += 16) {
            __m512 b[4];
#pragma GCC unroll 4
            for (int j = 0; j < NW; j++) {
                _mm_prefetch((const char *)(wn + (size_t)j * K + k) + GEMV_AHEAD, _MM_HINT_T1);
                b[j] = _mm512_loadu_ps(wn + (size_t)j * K + k);
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512 xv = _mm512_loadu_ps(x + (size_t)t * K + k);
#pragma GCC unroll 4
                for (int j = 0; j < NW; j++) a[j][t] = _mm512_fmadd_ps(xv, b[j], a[j][t]);
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < NW; j++)
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                y[t * ldy + n + j] = avx512_f32_dot_finish(a[j][t], x + (size_t)t * K, wn + (size_t)j * K, K16, K);
    }
    for (; n < n1; n++)
        for (int t = 0; t < T; t++) avx512_f32_gemv_rows(y + t * ldy, x + (size_t)t * K, w, n, n + 1, 0, K, 0);
}
/* rows y[0 .. T) (ldy apart), columns [n0, n1), 2 <= T <= ROWS_MAX */
TGT_AVX512 static void avx512_f32_rows(float *y, size_t ldy, const float *x, const float *w, int n0, int n1, int K,
                                       int T)
{
    switch (T) {
    case 2: avx512_f32_rows_t(y, ldy, x, w, n0, n1, K, 2, 2); break;
    case 3: avx512_f32_rows_t(y, ldy, x, w, n0, n1, K, 3, 2); break;
    case 4: avx512_f32_rows_t(y, ldy, x, w, n0, n1, K, 4, 2); break;
    case 5: avx512_f32_rows_t(y, ldy, x, w, n0, n1, K, 5, 2); break;
    case 6: avx512_f32_rows_t(y, ldy, x, w, n0, n1, K, 6, 2); break;
    case 7: avx512_f32_rows_t(y, ldy, x, w, n0, n1, K, 7, 2); break;
    default: avx512_f32_rows_t(y, ldy, x, w, n0, n1, K, 8, 2); break;
    }
}
/* bf16's: R (<= 6) rows at once, one 16-lane chain each, from AVX2's
 * groups of six (one run of memory: rs = 16, ks = 6) or rows stored whole
 * (rs = K, ks = 1; those under 4 KiB fetch the next R rows into L2 as one
 * linear stream, R x 16 elements per step). Rows one at a time, stored
 * whole, as fp32's, read slower. */
TGT_AVX512 static inline __attribute__((always_inline)) void avx512_bf16_rows(float *y, const float *x,
                                                                              const uint16_t *w, int K, int R,
                                                                              size_t rs, size_t ks)
{
    int K16 = K & ~15;
    __m512 a[6];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_ps();
    const char *next = (const char *)(w + (size_t)R * K);
    int ahead = ks == 1 && (size_t)K * sizeof(uint16_t) < 4096;
    for (int k = 0; k < K16; k += 16) {
        __m512 xv = _mm512_loadu_ps(x + k);
        if (ahead)
            for (int i = 0; i < R / 2; i++) _mm_prefetch(next + (size_t)R * 2 * k + 64 * i, _MM_HINT_T1);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) a[r] = _mm512_fmadd_ps(xv, avx512_loadw_bf16(w + r * rs + k * ks), a[r]);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) y[r] = avx512_bf16_dot_finish(a[r], x, w + r * rs, K16, K);
}
TGT_AVX512 static void avx512_bf16_gemv_rows(float *y, const float *x, const uint16_t *w, int n0, int n1, int N,
                                             int K, int G)
{
    int n = n0, grouped = G ? N / G * G : n0;
    for (; n + 6 <= n1 && n < grouped; n += 6)
        avx512_bf16_rows(y + n, x, w + weight_row_start(G, n, N, K), K, 6, 16, 6);
    for (; n + 6 <= n1; n += 6) avx512_bf16_rows(y + n, x, w + (size_t)n * K, K, 6, (size_t)K, 1);
    for (; n < n1; n++) avx512_bf16_rows(y + n, x, w + (size_t)n * K, K, 1, (size_t)K, 1);
}
/* prefill: the lane kernel, or AVX2's pairs for short K */
#define AVX512_PANEL(NAME, WT, PAIRS)                                                                               \
    TGT_AVX512 static void NAME(float *y, size_t ldy, const float *x, size_t ldx, const float *xp, const WT *w,     \
                                const void *wp, int n0, int N, int G, int ncols, int K, int rows)                  \
    {                                                                                                              \
        if (K >= AVX2_LANE_K) avx512_lane_panel(y, ldy, xp, wp, ncols, K, rows);                                   \
        else PAIRS(y, ldy, x, ldx, xp, w, wp, n0, N, G, ncols, K, rows);                                           \
    }
AVX512_PANEL(avx512_f32_panel, float, avx2_f32_pairs)
AVX512_PANEL(avx512_bf16_panel, uint16_t, avx2_bf16_pairs)

#define TGT TGT_AVX512
#define V __m512
#define v_zero _mm512_setzero_ps
#define v_loadx _mm512_loadu_ps
#define v_fma _mm512_fmadd_ps
#define v_tree avx512_tree
#define v_trees16 avx512_trees16
#define v_add _mm512_add_ps
#define v_sub _mm512_sub_ps
#define v_mul _mm512_mul_ps
#define v_max _mm512_max_ps
#define v_exp avx512_exp
#define v_maxtree avx512_maxtree
#define v_set1 _mm512_set1_ps
#define v_storex _mm512_storeu_ps
#define SFX(name) avx512_f32_##name
#define WT float
#define W2F W2F_F32
#define v_loadw _mm512_loadu_ps
#define PANEL avx512_f32_panel
#define PACK_W avx2_pack_weights
#define TILE_FLOATS avx2_tile_floats
#define GEMV_ROWS avx512_f32_gemv_rows
#define TILE_M 6
#include "kernels_cpu.inc"
#define SFX(name) avx512_bf16_##name
#define WT uint16_t
#define W2F W2F_BF16
#define v_loadw avx512_loadw_bf16
#define PANEL avx512_bf16_panel
#define PACK_W avx2_pack_weights
#define TILE_FLOATS avx2_tile_floats
#define GEMV_ROWS avx512_bf16_gemv_rows
#define TILE_M 6
#include "kernels_cpu.inc"
#undef TGT
#define TGT TGT_AVX512 __attribute__((unused))
#define SFX(name) avx512_f8_##name
#define WT uint8_t
#define W2F W2F_F8
#define v_loadw avx512_loadw_f8
#include "kernels_cpu.inc"
#include "kernels_cpu_end.inc"

/* ---- quantized weights ------------------------------------------------ */
/* n elements of a quantized matrix from element e0 (a multiple of qcols)
 * widened to fp32: each weight_value, the stored element's exact value
 * times its run's scale, rounded once (and to bf16 where QF_ROUND_BF16
 * says), the same bits on every instruction set. The GEMMs then run the
 * fp32 kernels on these values (gemm_invariant), so a quantized matrix
 * gives exactly the fp32 result of its dequantized twin. */
static void gen_dequant(float *m, WeightRef w, size_t e0, size_t n)
{
    for (size_t i = 0; i < n; i++) m[i] = weight_value(w, e0 + i);
}
/* bf16 rounding of finite lanes (scaled_value) */
TGT_AVX2 static inline __m256 avx2_round_bf16(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)));
}
/* The 16 values of a nibble type's elements, by nibble: INT4's v - 8
 * (i4_value), FP4 E2M1's (fp4_value) */
static const float nibble_levels[2][16] = {
    {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7},
    {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6}};
static inline const float *levels_of(DType t) { return nibble_levels[t == DTYPE_FP4]; }
/* eight nibble elements from byte p (the low nibble first) looked up in a
 * table of their 16 values (t0: nibbles 0-7, t1: 8-15) */
TGT_AVX2 static inline __m256 avx2_lookup8(const uint8_t *p, __m256 t0, __m256 t1)
{
    uint32_t b;
    memcpy(&b, p, 4);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)b), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    /* bit 3 of the nibble (at bit 31 after the shift) picks the table half */
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, v), _mm256_permutevar8x32_ps(t1, v),
                            _mm256_castsi256_ps(_mm256_slli_epi32(v, 28)));
}
TGT_AVX2 static void avx2_dequant(float *m, WeightRef w, size_t e0, size_t n)
{
    if (w.qcols % 8) { /* runs narrower than a vector: one element at a time */
        gen_dequant(m, w, e0, n);
        return;
    }
    const uint8_t *q = w.data;
    size_t j0 = e0 / (size_t)w.qcols;
    int nib = dtype_nibbles(w.dtype), bf = w.qflags & QF_ROUND_BF16;
    const float *lv = levels_of(w.dtype);
    __m256 t0 = _mm256_loadu_ps(lv), t1 = _mm256_loadu_ps(lv + 8);
    for (size_t i = 0; i < n; i += 8) {
        __m256 v = nib ? avx2_lookup8(q + (e0 + i) / 2, t0, t1) : avx2_widen8_f8(q + e0 + i);
        v = _mm256_mul_ps(v, _mm256_set1_ps(weight_run_scale(&w, j0 + i / (size_t)w.qcols)));
        _mm256_storeu_ps(m + i, bf ? avx2_round_bf16(v) : v);
    }
}
TGT_AVX512 static inline __m512 avx512_round_bf16(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
}
/* The indices of sixteen nibble elements from byte p, in order, each in
 * the low 4 bits of its lane (the permute reads no more): lanes 0-7 shift
 * the first four bytes, lanes 8-15 the next four */
TGT_AVX512 static inline __m512i avx512_nibbles16(const uint8_t *p)
{
    const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i shift = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    long long b;
    memcpy(&b, p, 8);
    return _mm512_srlv_epi32(_mm512_permutexvar_epi32(half, _mm512_set1_epi64(b)), shift);
}
TGT_AVX512 static void avx512_dequant(float *m, WeightRef w, size_t e0, size_t n)
{
    if (w.qcols % 16) {
        avx2_dequant(m, w, e0, n);
        return;
    }
    const uint8_t *q = w.data;
    size_t j0 = e0 / (size_t)w.qcols;
    int nib = dtype_nibbles(w.dtype), bf = w.qflags & QF_ROUND_BF16;
    __m512 levels = _mm512_loadu_ps(levels_of(w.dtype));
    for (size_t i = 0; i < n; i += 16) {
        __m512 v = nib ? _mm512_permutexvar_ps(avx512_nibbles16(q + (e0 + i) / 2), levels) : avx512_loadw_f8(q + e0 + i);
        v = _mm512_mul_ps(v, _mm512_set1_ps(weight_run_scale(&w, j0 + i / (size_t)w.qcols)));
        _mm512_storeu_ps(m + i, bf ? avx512_round_bf16(v) : v);
    }
}
typedef void (*DequantFn)(float *m, WeightRef w, size_t e0, size_t n);

/* Decode's GEMV on a quantized matrix, rows n0 .. n1-1 of y = x . w^T (K
 * columns, a multiple of qcols, itself of the vector width): each weight
 * widened in registers as the dequant functions widen it, then the fp32
 * GEMV's 16 lane chains and tree, so the same bits as widening first and
 * without the round trip through memory. A nibble type (INT4, FP4) looks
 * each element up in its row's table for the run: the 16 possible values
 * times the run's scale, rounded as the dequant functions round them.
 * R rows at once (independent chains hide the FMA latency); R, nib (a
 * nibble type) and bf (QF_ROUND_BF16) are constants at each call, so the
 * row loop is unrolled whole, chains and tables stay in registers and no
 * test is left in the loops. AVX2: two rows (sixteen registers hold two
 * rows' chains and tables, not more). */
/* The next R rows' elements and scales fetched into L2 while these R rows
 * are read, a share at each run: the rows' streams alone are not
 * prefetched early enough (docs/benchmarks.md, "Weights in their stored
 * formats"). A prefetch past the matrix's end is harmless. */
typedef struct {
    const char *data, *scale;
    size_t data_lines, scale_lines, data_per, scale_per; /* lines in all, lines per run */
} QNext;
static inline QNext qnext(WeightRef w, size_t e0, int K, int R)
{
    size_t n = (size_t)R * K, runs = (size_t)K / (size_t)w.qcols;
    size_t sb = w.scale ? sizeof(float) : 1; /* bytes per run's scale: fp32, or an FP8 code */
    const char *scales = w.scale ? (const char *)w.scale : (const char *)w.scale8;
    QNext t = {(const char *)w.data + dtype_data_bytes(w.dtype, e0 + n), scales + (e0 + n) / w.qcols * sb,
               dtype_data_bytes(w.dtype, n) / 64, n / (size_t)w.qcols * sb / 64, 0, 0};
    t.data_per = (t.data_lines + runs - 1) / runs, t.scale_per = (t.scale_lines + runs - 1) / runs;
    return t;
}
static inline __attribute__((always_inline)) void qnext_fetch(const QNext *t, int g)
{
    for (size_t l = (size_t)g * t->data_per, end = l + t->data_per; l < end && l < t->data_lines; l++)
        _mm_prefetch(t->data + 64 * l, _MM_HINT_T1);
    for (size_t l = (size_t)g * t->scale_per, end = l + t->scale_per; l < end && l < t->scale_lines; l++)
        _mm_prefetch(t->scale + 64 * l, _MM_HINT_T1);
}
/* Eight E4M3 elements from p times s2, a scale times 2^120: each
 * element's sign, exponent and mantissa moved to fp32's places (its value
 * times 2^-120, exact) and multiplied once; the NaN codes (0x7f, 0xff)
 * give NaN (avx512_f8_times in 8 lanes) */
TGT_AVX2 static inline __m256 avx2_f8_times(const uint8_t *p, __m256 s2)
{
    __m256i u = _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)), 20);
    u = _mm256_and_si256(u, _mm256_set1_epi32((int)0x87f00000u));
    __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(u), s2);
    __m256i nan = _mm256_cmpeq_epi32(_mm256_slli_epi32(u, 1), _mm256_set1_epi32(0x0fe00000));
    return _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")), _mm256_castsi256_ps(nan));
}
/* The scales of R rows from element e0 on (row r's runs at r * runs):
 * fp32, or FP8 codes and their table (weight_run_scale, the table found
 * once: the R rows lie within one table, qrows_one_table) */
typedef struct {
    const float *f;
    const uint8_t *codes;
    const float *tab;
} QRowScales;
static inline size_t qrow_table(WeightRef w, size_t e)
{
    return (w.run0 + e / (size_t)w.qcols) / w.table_runs;
}
/* whether rows n .. n+R-1 of a matrix of K columns share a scale table */
static inline int qrows_one_table(WeightRef w, int n, int K, int R)
{
    return !w.scale8 || qrow_table(w, (size_t)n * K) == qrow_table(w, (size_t)(n + R) * K - 1);
}
static inline QRowScales qrow_scales(WeightRef w, size_t e0)
{
    size_t j0 = e0 / (size_t)w.qcols;
    QRowScales s = {w.scale ? w.scale + j0 : NULL, w.scale8 ? w.scale8 + j0 : NULL, NULL};
    if (s.codes) s.tab = w.tables + qrow_table(w, e0) * WEIGHT_TABLE;
    return s;
}
static inline __attribute__((always_inline)) float qrow_scale(const QRowScales *s, int r, int runs, int g, int codes)
{
    size_t j = (size_t)r * runs + g;
    return codes ? s->tab[s->codes[j]] : s->f[j];
}
TGT_AVX2 static inline __attribute__((always_inline)) void avx2_qrows(float *y, const float *x, WeightRef w, int n,
                                                                      int K, int R, int nib, int bf)
{
    const uint8_t *q = w.data;
    int Q = w.qcols, runs = K / Q;
    const float *lv = levels_of(w.dtype);
    const __m256 l0 = _mm256_loadu_ps(lv), l1 = _mm256_loadu_ps(lv + 8);
    size_t e0 = (size_t)n * K;
    QRowScales rs = qrow_scales(w, e0);
    __m256 lo[2], hi[2], t0[2], t1[2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    QNext next = qnext(w, e0, K, R);
    for (int g = 0, k0 = 0; g < runs; g++, k0 += Q) {
        qnext_fetch(&next, g);
        int fold = !nib; /* FP8: 2^120 folded into the scale, as avx512_qrows */
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            float v = qrow_scale(&rs, r, runs, g, nib == 2);
            fold = fold && fabsf(v) < 0x1p8f;
            __m256 s = _mm256_set1_ps(v);
            if (nib) {
                t0[r] = _mm256_mul_ps(l0, s), t1[r] = _mm256_mul_ps(l1, s);
                if (bf) t0[r] = avx2_round_bf16(t0[r]), t1[r] = avx2_round_bf16(t1[r]);
            } else {
                t0[r] = s;
            }
        }
        if (fold)
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) t0[r] = _mm256_mul_ps(t0[r], _mm256_set1_ps(0x1p120f));
        for (int k = k0; k < k0 + Q; k += 16) {
            __m256 xa = _mm256_loadu_ps(x + k), xb = _mm256_loadu_ps(x + k + 8);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                size_t e = e0 + (size_t)r * K + (size_t)k;
                __m256 a, b;
                if (nib) {
                    a = avx2_lookup8(q + e / 2, t0[r], t1[r]), b = avx2_lookup8(q + e / 2 + 4, t0[r], t1[r]);
                } else if (fold) {
                    a = avx2_f8_times(q + e, t0[r]), b = avx2_f8_times(q + e + 8, t0[r]);
                    if (bf) a = avx2_round_bf16(a), b = avx2_round_bf16(b);
                } else {
                    a = _mm256_mul_ps(avx2_widen8_f8(q + e), t0[r]), b = _mm256_mul_ps(avx2_widen8_f8(q + e + 8), t0[r]);
                    if (bf) a = avx2_round_bf16(a), b = avx2_round_bf16(b);
                }
                lo[r] = _mm256_fmadd_ps(xa, a, lo[r]);
                hi[r] = _mm256_fmadd_ps(xb, b, hi[r]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) y[n + r] = avx2_tree((V2){lo[r], hi[r]});
}
/* one function per (FP8, a nibble type with fp32 scales or with FP8
 * codes; QF_ROUND_BF16?): the row functions' tests made once, outside
 * their loops */
#define QGEMV_VARIANTS(ISA, R)                                                                                    \
    QGEMV_VARIANT(ISA, R, f8, 0, 0)                                                                               \
    QGEMV_VARIANT(ISA, R, f8_bf16, 0, 1)                                                                          \
    QGEMV_VARIANT(ISA, R, nib, 1, 0)                                                                              \
    QGEMV_VARIANT(ISA, R, nib_bf16, 1, 1)                                                                         \
    QGEMV_VARIANT(ISA, R, codes, 2, 0)                                                                            \
    QGEMV_VARIANT(ISA, R, codes_bf16, 2, 1)                                                                       \
    static void ISA##_qgemv(float *y, const float *x, WeightRef w, int n0, int n1, int K)                        \
    {                                                                                                             \
        int bf = (w.qflags & QF_ROUND_BF16) != 0;                                                                 \
        (w.scale8                 ? (bf ? ISA##_qgemv_codes_bf16 : ISA##_qgemv_codes)                             \
         : dtype_nibbles(w.dtype) ? (bf ? ISA##_qgemv_nib_bf16 : ISA##_qgemv_nib)                                 \
                                  : (bf ? ISA##_qgemv_f8_bf16 : ISA##_qgemv_f8))(y, x, w, n0, n1, K);             \
    }
#define QGEMV_VARIANT(ISA, R, NAME, NIB, BF)                                                                      \
    TGT_##ISA static void ISA##_qgemv_##NAME(float *y, const float *x, WeightRef w, int n0, int n1, int K)        \
    {                                                                                                             \
        int n = n0;                                                                                               \
        for (; n + R <= n1; n += R)                                                                               \
            if (qrows_one_table(w, n, K, R))                                                                      \
                ISA##_qrows(y, x, w, n, K, R, NIB, BF);                                                           \
            else /* rows of two checkpoint matrices (experts): each row alone */                                 \
                for (int r = 0; r < R; r++) ISA##_qrows(y, x, w, n + r, K, 1, NIB, BF);                           \
        for (; n < n1; n++) ISA##_qrows(y, x, w, n, K, 1, NIB, BF);                                               \
    }
#define TGT_avx2 TGT_AVX2
#define TGT_avx512 TGT_AVX512
QGEMV_VARIANTS(avx2, 2)
/* Sixteen E4M3 elements from p times s2, a scale times 2^120: each
 * element's sign, exponent and mantissa moved to fp32's places (its value
 * times 2^-120, exact) and multiplied once; the NaN codes (0x7f, 0xff)
 * give NaN */
TGT_AVX512 static inline __m512 avx512_f8_times(const uint8_t *p, __m512 s2)
{
    __m512i u = _mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)), 20);
    u = _mm512_and_si512(u, _mm512_set1_epi32((int)0x87f00000u));
    __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(u), s2);
    __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_slli_epi32(u, 1), _mm512_set1_epi32(0x0fe00000));
    return _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(__builtin_nanf("")));
}
/* avx2_qrows' arithmetic in 16 lanes, four rows at once */
TGT_AVX512 static inline __attribute__((always_inline)) void avx512_qrows(float *y, const float *x, WeightRef w, int n,
                                                                          int K, int R, int nib, int bf)
{
    const uint8_t *q = w.data;
    int Q = w.qcols, runs = K / Q;
    const __m512 levels = _mm512_loadu_ps(levels_of(w.dtype));
    size_t e0 = (size_t)n * K;
    QRowScales rs = qrow_scales(w, e0);
    __m512 a[4], s[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_ps();
    QNext next = qnext(w, e0, K, R);
    for (int g = 0, k0 = 0; g < runs; g++, k0 += Q) {
        qnext_fetch(&next, g);
        /* FP8: each scale times 2^120, the factor that makes an E4M3
         * element's bits moved to fp32's places its value, so that one
         * rounded product gives the element times the scale, as widening
         * then scaling does, where that product of scale and 2^120 is
         * finite (every scale below 2^8; else both steps) */
        int fold = !nib;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            float v = qrow_scale(&rs, r, runs, g, nib == 2);
            fold = fold && fabsf(v) < 0x1p8f;
            s[r] = _mm512_set1_ps(v);
            if (nib) {
                s[r] = _mm512_mul_ps(levels, s[r]);
                if (bf) s[r] = avx512_round_bf16(s[r]);
            }
        }
        if (fold)
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) s[r] = _mm512_mul_ps(s[r], _mm512_set1_ps(0x1p120f));
        for (int k = k0; k < k0 + Q; k += 16) {
            __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                size_t e = e0 + (size_t)r * K + (size_t)k;
                __m512 v;
                if (nib) {
                    v = _mm512_permutexvar_ps(avx512_nibbles16(q + e / 2), s[r]);
                } else if (fold) {
                    v = avx512_f8_times(q + e, s[r]);
                    if (bf) v = avx512_round_bf16(v);
                } else {
                    v = _mm512_mul_ps(avx512_loadw_f8(q + e), s[r]);
                    if (bf) v = avx512_round_bf16(v);
                }
                a[r] = _mm512_fmadd_ps(xv, v, a[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) y[n + r] = avx512_tree(a[r]);
}
QGEMV_VARIANTS(avx512, 4)
typedef void (*QGemvFn)(float *y, const float *x, WeightRef w, int n0, int n1, int K);

/* ---- dispatch ---------------------------------------------------------- */
/* Rows past the last whole tile: up to GEMV_LEFT of them go to the GEMV
 * block by block, more fill a last tile packed in part: two rows gained
 * against padding the tile, three to five did not always. */
#ifndef GEMV_LEFT
#define GEMV_LEFT 2
#endif
typedef void (*BlockFn)(float *y, const float *x, const float *xpack, void *wpack, const void *w, int T, int tiles,
                        int K, int N, int n0, int n1, int G);
static const struct {
    const char *name;
    BlockFn f32, bf16;
    AttendFn attend_f32, attend_bf16, attend_f8;
    DequantFn dequant;
    QGemvFn qgemv;         /* NULL: decode widens first too */
    int qgemv_lanes;       /* the scale runs it takes: multiples of this */
    int tile_m; /* rows per prefill tile */
    /* one tile packed for its panel (tile_floats(K) floats), the weight
     * rows per block, and the floats of a block of n packed weight rows;
     * or NULL */
    void (*pack)(float *xp, const float *x, size_t ldx, int K, int rows);
    size_t (*tile_floats)(int K);
    int (*block_rows)(int K, size_t esize);
    size_t (*block_floats)(int n, int K);
    /* 2 to ROWS_MAX activation rows against fp32 rows stored whole, each
     * weight row read once; or NULL */
    void (*f32_rows)(float *y, size_t ldy, const float *x, const float *w, int n0, int n1, int K, int T);
} isas[] = {
    {"generic", gen_f32_block, gen_bf16_block, gen_f32_attend, gen_bf16_attend, gen_f8_attend, gen_dequant, NULL, 0, 3, NULL, NULL, NULL,
     NULL, NULL},
    {"avx2", avx2_f32_block, avx2_bf16_block, avx2_f32_attend, avx2_bf16_attend, avx2_f8_attend, avx2_dequant, avx2_qgemv, 16, 6, avx2_pack_tile,
     avx2_tile_floats, avx2_block_rows, avx2_block_floats, NULL},
    {"avx512", avx512_f32_block, avx512_bf16_block, avx512_f32_attend, avx512_bf16_attend, avx512_f8_attend, avx512_dequant, avx512_qgemv, 16, 6,
     avx2_pack_tile, avx2_tile_floats, avx2_block_rows, avx2_block_floats, avx512_f32_rows},
};
enum { ISA_GENERIC, ISA_AVX2, ISA_AVX512, ISA_AUTO = -1 };
static int isa = ISA_AUTO;
static char *pack_buf; /* packed activation tiles and weights, one region per thread */
static size_t pack_cap;
static float *deq_buf; /* a block of a quantized matrix's rows widened to fp32, one region per thread */
static size_t deq_cap;

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
    return kv == DTYPE_BF16 ? isas[isa].attend_bf16 : kv == DTYPE_F8_E4M3 ? isas[isa].attend_f8 : isas[isa].attend_f32;
}

int cpu_weight_group(DType t)
{
    if (isa == ISA_AUTO) isa = best_isa();
    /* AVX2's bf16 GEMV reads rows in groups of six (avx2_bf16_gemv_rows), and AVX-512's the same */
    return isa != ISA_GENERIC && t == DTYPE_BF16 ? 6 : 0;
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
        gemm_invariant(y, x, weight_ref(m, w.dtype, 0), T, in, out);
        free(m);
        return;
    }
    int G = w.group, align = G ? 48 : 16; /* row splits: whole panels of 16, and whole groups */
    /* a quantized matrix: each block of rows widened to fp32 just before
     * the fp32 kernels read it (gen_dequant) */
    int quant = dtype_quantized(w.dtype);
    if (quant && T == 1 && isas[isa].qgemv && w.qcols % isas[isa].qgemv_lanes == 0) {
        /* decode: each row's weights widened in registers */
        int parallel1 = (long)in * out > 100000;
#pragma omp parallel if (parallel1)
        {
            int nt = omp_get_num_threads(), me = omp_get_thread_num();
            int r0 = (int)((long)out * me / nt), r1 = (int)((long)out * (me + 1) / nt);
            isas[isa].qgemv(y, x, w, r0, r1, in);
        }
        return;
    }
    if (w.dtype == DTYPE_F32 && !G && T >= 2 && T <= ROWS_MAX && isas[isa].f32_rows) {
        /* a few rows: the weights streamed once for all of them */
        int parallel_rows = (long)T * in * out > 100000;
#pragma omp parallel if (parallel_rows)
        {
            int nt = omp_get_num_threads(), me = omp_get_thread_num();
            int r0 = (int)((long)out * me / nt), r1 = (int)((long)out * (me + 1) / nt);
            isas[isa].f32_rows(y, (size_t)out, x, w.data, r0, r1, in, T);
        }
        return;
    }
    size_t wbytes = quant ? sizeof(float) : dtype_bytes(w.dtype);
    BlockFn f = w.dtype == DTYPE_BF16 ? isas[isa].bf16 : isas[isa].f32;
    int tm = isas[isa].tile_m, parallel = (long)T * in * out > 100000;
    int threads = parallel ? omp_get_max_threads() : 1;
    int packing = isas[isa].pack && T >= tm;
    /* weight rows per block, a multiple of align: the packing's own, or
     * about 128 KiB as stored for the kernels that read them in place (half
     * of a 512 KiB L2) */
    int nb = packing ? isas[isa].block_rows(in, wbytes) : (int)(131072 / ((size_t)in * wbytes));
    nb = nb < align ? align : nb / align * align;
    if (quant && (size_t)nb * in * threads > deq_cap) { /* grows to the largest shape, then stays */
        free(deq_buf);
        deq_cap = (size_t)nb * in * threads;
        deq_buf = xmalloc(deq_cap * sizeof(float));
    }
    /* prefill: rows in groups of about 2 MiB of activations (a multiple of
     * the 6- and 3-row tiles), each group passing over this thread's blocks;
     * the tiles stream from L3 (a few KiB per tile against a whole block),
     * while each group re-reads and repacks the weights from memory, so
     * larger groups pay that less often */
    int tb = (int)(2097152 / ((size_t)in * sizeof(float))) / 6 * 6;
    if (tb < 6) tb = 6;
    /* packed: the row group's tiles, shared by the threads, and per thread
     * one block's weights (the block repacked for each row group: packed
     * into a buffer that stays in L2, it is read faster than a packed copy
     * of all blocks) */
    size_t xbytes = 0, per_thread = 0;
    if (packing) {
        xbytes = ((size_t)(tb + tm - 1) / tm * isas[isa].tile_floats(in) * sizeof(float) + 63) & ~(size_t)63;
        per_thread = (isas[isa].block_floats(nb, in) * sizeof(float) + 63) & ~(size_t)63;
    }
    if (packing && xbytes + per_thread * threads > pack_cap) { /* grows to the largest shape, then stays */
        free(pack_buf);
        pack_cap = xbytes + per_thread * threads;
        pack_buf = xmalloc(pack_cap);
    }
#pragma omp parallel if (parallel)
    {
        /* this thread's rows: an even share, in multiples of align */
        int nt = omp_get_num_threads(), me = omp_get_thread_num();
        int r0 = (int)((long)out * me / nt) / align * align;
        int r1 = me == nt - 1 ? out : (int)((long)out * (me + 1) / nt) / align * align;
        float *xp = packing ? (float *)pack_buf : NULL;
        char *wp = packing ? pack_buf + xbytes + per_thread * me : NULL;
        for (int t0 = 0; t0 < T; t0 += tb) {
            /* the rows run in tiles: whole tiles, and a last one packed in
             * part unless its rows are few enough for the GEMV to take them
             * block by block */
            int rows = T - t0 < tb ? T - t0 : tb, tiles = rows / tm * tm;
            if (packing && rows - tiles > GEMV_LEFT) tiles = rows;
            const float *xt = x + (size_t)t0 * in;
            float *yt = y + (size_t)t0 * out;
            if (packing) { /* the threads pack every nt-th tile, then all read all */
                for (int i = me * tm; i < tiles; i += nt * tm)
                    isas[isa].pack(xp + (size_t)(i / tm) * isas[isa].tile_floats(in), xt + (size_t)i * in, (size_t)in,
                                   in, tiles - i < tm ? tiles - i : tm);
#pragma omp barrier
            }
            /* one row (decode) keeps nothing in L2: its GEMV takes the
             * thread's rows in one call; more rows go block by block, each
             * block read from memory once for all of them (against 2-5
             * rows in one call: 2 x 768 x 2048 0.82 of the time, 3 x 2048
             * x 768 0.81-0.89, 4 x 288 x 32000 0.40) */
            int step = tiles || rows > 1 || quant ? nb : r1 - r0;
            for (int n0 = r0; n0 < r1; n0 += step) {
                int n1 = n0 + step < r1 ? n0 + step : r1;
                if (!quant) {
                    f(yt, xt, xp, wp, w.data, rows, tiles, in, out, n0, n1, G);
                    continue;
                }
                /* rows n0 .. n1-1 widened, read as rows 0 .. n1-n0-1 of
                 * outputs yt + n0 (the kernels step output rows by out) */
                float *wq = deq_buf + (size_t)nb * in * me;
                isas[isa].dequant(wq, w, (size_t)n0 * in, (size_t)(n1 - n0) * in);
                f(yt + n0, xt, xp, wp, wq, rows, tiles, in, out, 0, n1 - n0, 0);
            }
            if (packing && t0 + tb < T) {
#pragma omp barrier /* the next group's tiles go where these are */
            }
        }
    }
}
