// What the files of the CUDA backend share (backend_cuda.cu: memory, the
// stream and the ops table; gemm.cu, elementwise.cu, moe.cu, attention.cu:
// the ops, one kind a file): the runtime, the stream and cuBLAS handle all
// work goes to, the launch helpers, and how a kernel reads a stored weight.
#ifndef DCP_BACKEND_CUDA_CUH
#define DCP_BACKEND_CUDA_CUH

#include "gpu_runtime.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.cuh"

// A test build's deliberate defects (tests/mutants.sh): DCPINFER_MUTANT=n
// breaks the kernel marked MUTANT(n), and the conformance test must fail.
// Only the HIP-CPU test build has them; every other build compiles them out.
#ifdef DCP_MUTATIONS
#ifndef DCP_HIP_CPU
#error "DCP_MUTATIONS is for the HIP-CPU test build only"
#endif
static int dcp_mutant = getenv("DCPINFER_MUTANT") ? atoi(getenv("DCPINFER_MUTANT")) : 0;
#define MUTANT(n) (dcp_mutant == (n))
#else
#define MUTANT(n) 0
#endif

extern "C" {
#include "backend.h"
#include "fmath.h"
#define DCP_ROUTE_EXP dcp_expf // the routing kernels' exponential (moe_route.h)
#include "moe_route.h"
#include "quant.h"
#include "tree.h"
#include "util.h"
}

// the one stream all work goes to, and the backend's counts
extern cudaStream_t stream;
extern BackendCounts counts;
// GEMM weights in bf16 (--dtype bfloat16): widened exactly in the GEMM,
// activations and accumulation fp32
extern int gemm_bf16;

static inline unsigned blocks_for(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

// memory (backend_cuda.cu)
void *cuda_alloc(size_t bytes);
void cuda_release(void *p);
void cuda_upload(void *dst, const void *src, size_t bytes);
void cuda_download(void *dst, const void *src, size_t bytes);
void cuda_copy(void *dst, const void *src, size_t bytes);

// element i of a weight stack: as stored, or a quantized element times its
// run's scale (quant.h: weight_value's arithmetic)
struct Int4 { // compressed-tensors' packed INT4: element i in byte i / 2
    uint8_t b;
};
__device__ static inline float w_load(const float *w, const WeightRef &, size_t i) { return w[i]; }
__device__ static inline float w_load(const __nv_bfloat16 *w, const WeightRef &, size_t i)
{
    return __bfloat162float(w[i]);
}
__device__ static inline float w_load(const uint8_t *w, const WeightRef &q, size_t i)
{
    return scaled_value(f8e4m3_to_f32(w[i]), weight_run_scale(&q, i / (size_t)q.qcols), q.qflags & QF_ROUND_BF16);
}
__device__ static inline float w_load(const Int4 *w, const WeightRef &q, size_t i)
{
    return scaled_value(i4_value((const uint8_t *)w, i), weight_run_scale(&q, i / (size_t)q.qcols),
                        q.qflags & QF_ROUND_BF16);
}
struct Fp4 { // NVFP4's E2M1 elements, packed as Int4
    uint8_t b;
};
__device__ static inline float w_load(const Fp4 *w, const WeightRef &q, size_t i)
{
    return scaled_value(fp4_value((const uint8_t *)w, i), weight_run_scale(&q, i / (size_t)q.qcols),
                        q.qflags & QF_ROUND_BF16);
}

// A quantized matrix's scales travel to the kernels as scalars and
// pointers (QS_PARAMS, QS_ARGS), not as the WeightRef struct, which
// HIP-CPU's SIMD clones of a kernel cannot take; qs_ref gathers them again
#define QS_PARAMS                                                                                                 \
    const float *scale, const uint8_t *scale8, const float *tables, size_t table_runs, size_t run0, int qcols,    \
        int qflags
#define QS_ARGS(w) (w).scale, (w).scale8, (w).tables, (w).table_runs, (w).run0, (w).qcols, (w).qflags
__device__ static inline WeightRef qs_ref(QS_PARAMS)
{
    WeightRef q = {};
    q.scale = scale, q.scale8 = scale8, q.tables = tables, q.table_runs = table_runs, q.run0 = run0;
    q.qcols = qcols, q.qflags = qflags;
    return q;
}


// ---- the GEMMs' arithmetic (gemm.cu, moe.cu) ---------------------------
// One output element of a product is 16 lane chains over the whole runs of
// 16 elements of K, added by lane_tree, then the K mod 16 tail by FMA: the
// CPU backend's invariant GEMM (docs/design.md, "Same bits whatever shares
// the batch").
#define GM_LANES 16

// elements i .. i + 15 of w, widened as w_load widens them; a stored
// format's 16 share one run (and its scale) when runs are multiples of 16
__device__ static inline float w_value(const uint8_t *w, size_t i) { return f8e4m3_to_f32(w[i]); }
__device__ static inline float w_value(const Int4 *w, size_t i) { return i4_value((const uint8_t *)w, i); }
__device__ static inline float w_value(const Fp4 *w, size_t i) { return fp4_value((const uint8_t *)w, i); }

// raw16: the 16 elements' values before any scale, read by 16-byte loads
// (8 bytes for the 4-bit formats) where they start on such a boundary
// (one load instruction each on a GPU), else element by element
struct alignas(16) Load16 {
    uint8_t b[16];
};
struct alignas(8) Load8 {
    uint8_t b[8];
};
__device__ static inline bool aligned_to(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) == 0; }
__device__ static inline void raw16(float *v, const float *w, size_t i)
{
    if (aligned_to(w + i, 16)) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            Load16 x = ((const Load16 *)(w + i))[c];
            memcpy(v + 4 * c, x.b, 16);
        }
        return;
    }
#pragma unroll
    for (int l = 0; l < GM_LANES; l++) v[l] = w[i + l];
}
__device__ static inline void raw16(float *v, const __nv_bfloat16 *w, size_t i)
{
    if (aligned_to(w + i, 16)) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            Load16 x = ((const Load16 *)(w + i))[c];
            __nv_bfloat16 h[8];
            memcpy(h, x.b, 16);
#pragma unroll
            for (int l = 0; l < 8; l++) v[8 * c + l] = __bfloat162float(h[l]);
        }
        return;
    }
#pragma unroll
    for (int l = 0; l < GM_LANES; l++) v[l] = __bfloat162float(w[i + l]);
}
__device__ static inline void raw16(float *v, const uint8_t *w, size_t i)
{
    if (aligned_to(w + i, 16)) {
        Load16 x = *(const Load16 *)(w + i);
#pragma unroll
        for (int l = 0; l < GM_LANES; l++) v[l] = f8e4m3_to_f32(x.b[l]);
        return;
    }
#pragma unroll
    for (int l = 0; l < GM_LANES; l++) v[l] = w_value(w, i + l);
}
// the 4-bit formats: 16 elements from an even i are the 8 bytes from i / 2
template <typename W4> __device__ static inline void raw16_4bit(float *v, const W4 *w, size_t i)
{
    const uint8_t *p = (const uint8_t *)w + i / 2;
    if (i % 2 == 0 && aligned_to(p, 8)) {
        Load8 x = *(const Load8 *)p;
#pragma unroll
        for (int l = 0; l < GM_LANES; l++) v[l] = w_value((const W4 *)x.b, l);
        return;
    }
#pragma unroll
    for (int l = 0; l < GM_LANES; l++) v[l] = w_value(w, i + l);
}
__device__ static inline void raw16(float *v, const Int4 *w, size_t i) { raw16_4bit(v, w, i); }
__device__ static inline void raw16(float *v, const Fp4 *w, size_t i) { raw16_4bit(v, w, i); }

template <typename W> struct stored_format {
    static constexpr bool scaled = true;
};
template <> struct stored_format<float> {
    static constexpr bool scaled = false;
};
template <> struct stored_format<__nv_bfloat16> {
    static constexpr bool scaled = false;
};
template <typename W>
__device__ static inline void w_load16(float *v, const W *w, const WeightRef &q, size_t i)
{
    if constexpr (stored_format<W>::scaled) {
        if (q.qcols % GM_LANES == 0) {
            float s = weight_run_scale(&q, i / (size_t)q.qcols);
            int bf16 = q.qflags & QF_ROUND_BF16;
            raw16(v, w, i);
#pragma unroll
            for (int l = 0; l < GM_LANES; l++) v[l] = scaled_value(v[l], s, bf16);
            return;
        }
#pragma unroll
        for (int l = 0; l < GM_LANES; l++) v[l] = w_load(w, q, i + l);
    } else {
        raw16(v, w, i);
    }
}

// one output element's lanes added by the fixed tree
__device__ static inline float lane_tree(const float *a)
{
    float h[8], g[4];
#pragma unroll
    for (int i = 0; i < 8; i++) h[i] = a[i] + a[i + 8];
#pragma unroll
    for (int i = 0; i < 4; i++) g[i] = h[i] + h[i + 4];
    return (g[0] + g[2]) + (g[1] + g[3]);
}

// The expert whose pairs hold pair row i: the last e with start[e] <= i
// (start: experts + 1 ascending offsets, i < start[experts]), by binary
// search
__device__ static inline int expert_of(const int *start, int experts, int i)
{
    int lo = 0, hi = experts - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// KV cache rows: fp32, bf16 (--kv-cache-dtype bfloat16) or FP8 E4M3
// (--kv-cache-dtype fp8), rounded as the CPU backend rounds them
__device__ static inline float kv_load(const float *p) { return *p; }
__device__ static inline float kv_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ static inline float kv_load(const uint8_t *p) { return f8e4m3_to_f32(*p); }
__device__ static inline void kv_store(float *p, float v) { *p = v; }
__device__ static inline void kv_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ static inline void kv_store(uint8_t *p, float v) { *p = f32_to_f8e4m3(v); }

// the ops, by file
const float *cuda_fp4_activations(const float *x, int ldx, const int *rows, const int *start, int experts, int T,
                                  WeightRef w, size_t w_step, int in);
void cuda_matmul(float *y, const float *x, WeightRef w, int T, int in, int out);
void cuda_matmul_batched(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                         int batch, int T, int in, int out);
void cuda_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int T, int dim, float eps);
void cuda_rope(float *y, int ldy, const float *x, int ldx, const int *pos, int T, int n_heads, int head_dim,
               const float *inv_freq, float scale, RopeStyle style);
void cuda_silu_mul(float *gate, const float *up, size_t n);
void cuda_add_bias(float *y, const float *b, int T, int n);
void cuda_add(float *y, const float *x, size_t n);
void cuda_sum_parts(float *y, int parts, size_t n);
void cuda_scale(float *x, size_t n, float s, int divide);
void cuda_gather_rows(float *dst, const float *src, const int *rows, int R, int dim);
void cuda_embedding(float *x, WeightRef table, int row0, int rows, const int *tokens, int T, int dim);
void cuda_kv_write(void *k_pool, void *v_pool, DType kv_dtype, const float *k, const float *v, const int *slots,
                   int T, int kvd, int kv_heads, int block_size);
void cuda_round_kv(float *x, size_t n, DType t);
void cuda_strided_copy(float *dst, int dst_stride, const float *src, int src_stride, int rows, int width);
void cuda_moe_route(const MoeRouting *r, const float *logits, const float *bias, int T, int *rows, float *weights,
                    int *slots, int *start);
void cuda_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int experts, int pairs,
                     WeightRef w, size_t w_step, int in, int out, int chunks);
void cuda_moe_combine(float *y, const float *src, const int *slots, const float *weights, int T, int K, int dim,
                      int chunks);
void cuda_attention(const AttnBatch *a);
void cuda_merge_partials(float *a, const float *b, int rows, int head_dim, int stride);
void cuda_pack_partials(float *parts, const float *o, const float *lse, int rows, int head_dim);

#endif
