// The CUDA backend: the ops of src/backend_cpu.c on the GPU, with GEMMs in
// cuBLAS (fp32 or bf16 weights, fp32 accumulation) and the rest as kernels. All
// work goes to one stream; downloads wait for it. Weights and the KV cache
// live in device memory from cudaMalloc (never managed memory).
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
#include "moe_route.h"
#include "quant.h"
#include "tree.h"
#include "util.h"
}

static cudaStream_t stream;
static BackendCounts counts;
static cublasHandle_t blas;
// GEMM weights in bf16 (--dtype bfloat16): activations are converted to
// bf16 for each product, accumulation stays fp32
static int gemm_bf16;
static __nv_bfloat16 *x_bf16;
static size_t x_bf16_cap;
static float *w_f32; // a quantized matrix widened for cuBLAS (cuda_matmul)
static size_t w_f32_cap;

// Per-token attention metadata uploaded here for a caller that has no
// device copies of it (AttnBatch.d_*).
static const int **d_tables;
static int *d_nkeys, *d_key0, *d_row0;
static int meta_cap;

static unsigned blocks_for(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

// ---- memory -----------------------------------------------------------

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    DCP_CHECK(cudaMalloc(&p, bytes ? bytes : 4));
    return p;
}

static void cuda_release(void *p) { DCP_CHECK(cudaFree(p)); }

// Returns once src may be reused (gpu_runtime.h); in stream order.
static void cuda_upload(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    counts.uploads++;
    DCP_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    DCP_CHECK(gpu_pageable_source_released(stream));
}

// Weights: on the compute stream, waited for, so that no kernel can start
// before they land (a copy on the legacy default stream is not ordered
// before work on a non-blocking stream).
static void upload_weights(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    DCP_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    DCP_CHECK(cudaStreamSynchronize(stream));
}

static void cuda_download(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    counts.downloads++;
    DCP_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    DCP_CHECK(cudaStreamSynchronize(stream));
}

static void cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) DCP_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

static void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    DCP_CHECK(cudaMallocHost(&p, bytes ? bytes : 4));
    return p;
}

static void cuda_host_release(void *p) { DCP_CHECK(cudaFreeHost(p)); }

static const float *cuda_weights(const float *host, size_t n)
{
    float *d = (float *)cuda_alloc(sizeof(float) * n);
    upload_weights(d, host, sizeof(float) * n);
    return d;
}

static void cuda_release_weights(const void *p) { cuda_release((void *)p); }

// The matrices matmul reads: as loaded (bf16 stays bf16), or fp32 rounded
// to bf16 (round to nearest even, as f32_to_bf16 does) with --dtype
// bfloat16, stored in half the memory.
static WeightRef cuda_gemm_weights(WeightRef host, size_t n)
{
    if (dtype_quantized(host.dtype)) { // as stored, with its scales: --dtype never widens it
        WeightRef w = host;
        size_t bytes = dtype_data_bytes(host.dtype, n);
        void *d = cuda_alloc(bytes ? bytes : 1);
        upload_weights(d, host.data, bytes);
        size_t ns = n / (size_t)host.qcols;
        w.data = d;
        if (host.scale8) { // NVFP4's codes as stored, and their tables
            size_t nt = weight_tables(host, n) * 256;
            uint8_t *c = (uint8_t *)cuda_alloc(ns ? ns : 1);
            float *t = (float *)cuda_alloc(sizeof(float) * nt);
            upload_weights(c, host.scale8, ns);
            upload_weights(t, host.tables, sizeof(float) * nt);
            w.scale8 = c;
            w.tables = t;
            return w;
        }
        float *s = (float *)cuda_alloc(sizeof(float) * (ns ? ns : 1));
        upload_weights(s, host.scale, sizeof(float) * ns);
        w.scale = s;
        return w;
    }
    if (host.dtype == DTYPE_BF16) {
        void *d = cuda_alloc(sizeof(uint16_t) * (n ? n : 1));
        upload_weights(d, host.data, sizeof(uint16_t) * n);
        return weight_ref(d, DTYPE_BF16, 0);
    }
    const float *f = (const float *)host.data;
    if (!gemm_bf16) return weight_ref(cuda_weights(f, n), DTYPE_F32, 0);
    uint16_t *h = (uint16_t *)xmalloc(sizeof(uint16_t) * (n ? n : 1));
    f32_to_bf16_n(h, f, n);
    void *d = cuda_alloc(sizeof(uint16_t) * n);
    upload_weights(d, h, sizeof(uint16_t) * n);
    free(h);
    return weight_ref(d, DTYPE_BF16, 0);
}

static int cuda_set_gemm_dtype(const char *dtype)
{
    if (!strcmp(dtype, "auto") || !strcmp(dtype, "float32")) gemm_bf16 = 0;
    else if (!strcmp(dtype, "bfloat16")) gemm_bf16 = 1;
    else return dcp_fail("--dtype %s: choose float32 or bfloat16", dtype);
    return 0;
}

__global__ void k_to_bf16(__nv_bfloat16 *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

int cuda_sync_each_launch(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DCPINFER_CUDA_SYNC");
        on = e && !strcmp(e, "1");
    }
    return on;
}

void dcp_launch_check(const char *kernel, dim3 grid, dim3 block, size_t dynamic_shared, size_t static_shared,
                      const void *func)
{
    char what[160];
    unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (!threads || threads > DCP_MAX_BLOCK_THREADS || block.z > 64)
        snprintf(what, sizeof what, "%lu threads per block (%ux%ux%u): a GPU takes 1 to %d", threads, block.x,
                 block.y, block.z, DCP_MAX_BLOCK_THREADS);
    else if (!grid.x || !grid.y || !grid.z || grid.y > 65535 || grid.z > 65535)
        snprintf(what, sizeof what, "grid %ux%ux%u: a GPU takes 1 to 65535 blocks in y and z", grid.x, grid.y, grid.z);
    else if (static_shared + dynamic_shared > DCP_MAX_STATIC_SHARED)
        snprintf(what, sizeof what, "%zu bytes of shared memory per block: a GPU takes %d without opting in",
                 static_shared + dynamic_shared, DCP_MAX_STATIC_SHARED);
    else
        what[0] = 0;
#ifndef DCP_HIP_CPU
    cudaFuncAttributes attr;
    if (!what[0] && cudaFuncGetAttributes(&attr, func) == cudaSuccess && attr.sharedSizeBytes != static_shared)
        snprintf(what, sizeof what, "%zu bytes of static shared memory, declared as %zu (DCP_STATIC_SHARED)",
                 (size_t)attr.sharedSizeBytes, static_shared);
#else
    (void)func;
#endif
    if (what[0]) dcp_check_failed(__FILE__, __LINE__, kernel, what);
}

static void cuda_synchronize(void)
{
    counts.synchronizes++;
    DCP_CHECK(cudaStreamSynchronize(stream));
}

// ---- GEMM -------------------------------------------------------------

// y (T, out) = x (T, in) . w (out, in)^T, all row-major. In cuBLAS's
// column-major terms: y^T (out x T) = w (out x in) . x^T (in x T).
// x (n floats) as bf16 in x_bf16, grown on demand: the activations of a
// product with bf16 weights
static const __nv_bfloat16 *activations_bf16(const float *x, size_t n)
{
    if (n > x_bf16_cap) {
        if (x_bf16) cuda_release(x_bf16);
        x_bf16_cap = 2 * n;
        x_bf16 = (__nv_bfloat16 *)cuda_alloc(sizeof(__nv_bfloat16) * x_bf16_cap);
    }
    DCP_LAUNCH(k_to_bf16, blocks_for(n, 256), 256, 0, stream, x_bf16, x, n);
    DCP_CHECK_LAUNCH(stream);
    return x_bf16;
}

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

// n elements of a quantized matrix widened to fp32: weight_value's
// arithmetic (w_load), so that the GEMM that follows reads the dequantized
// twin's values
template <typename W>
__global__ void k_dequant(float *m, const W *q, QS_PARAMS, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) m[i] = w_load(q, qs_ref(scale, scale8, tables, table_runs, run0, qcols, qflags), i);
}

// A quantized matrix's values in fp32, in a scratch buffer grown on demand
static const float *dequantized(WeightRef w, size_t n)
{
    if (n > w_f32_cap) {
        if (w_f32) cuda_release(w_f32);
        w_f32_cap = n;
        w_f32 = (float *)cuda_alloc(sizeof(float) * n);
    }
    if (w.dtype == DTYPE_I4)
        DCP_LAUNCH(k_dequant<Int4>, blocks_for(n, 256), 256, 0, stream, w_f32, (const Int4 *)w.data, QS_ARGS(w), n);
    else if (w.dtype == DTYPE_FP4)
        DCP_LAUNCH(k_dequant<Fp4>, blocks_for(n, 256), 256, 0, stream, w_f32, (const Fp4 *)w.data, QS_ARGS(w), n);
    else
        DCP_LAUNCH(k_dequant<uint8_t>, blocks_for(n, 256), 256, 0, stream, w_f32, (const uint8_t *)w.data, QS_ARGS(w),
                   n);
    DCP_CHECK_LAUNCH(stream);
    return w_f32;
}

// Decode's product on a quantized matrix, up to QG_T rows of x: one block
// per output row, its threads striding the row's elements (each widened as
// w_load widens it) and summing in fp32, then a tree over the threads.
// The matrix is read once, as stored, with no fp32 copy.
#define QG_T 8
#define QG_THREADS 128
template <typename W>
__global__ void k_qgemv(float *y, const float *x, const W *w, QS_PARAMS, int T, int in, int out)
{
    WeightRef qs = qs_ref(scale, scale8, tables, table_runs, run0, qcols, qflags);
    __shared__ float red[QG_T][QG_THREADS];
    int row = blockIdx.x, tid = threadIdx.x;
    float acc[QG_T] = {0};
    size_t base = (size_t)row * in;
    for (int k = tid; k < in; k += QG_THREADS) {
        float v = w_load(w, qs, base + k);
#pragma unroll
        for (int t = 0; t < QG_T; t++)
            if (t < T) acc[t] = fmaf(x[(size_t)t * in + k], v, acc[t]);
    }
#pragma unroll
    for (int t = 0; t < QG_T; t++) red[t][tid] = acc[t];
    __syncthreads();
    for (int half = QG_THREADS / 2; half > 0; half /= 2) {
        if (tid < half)
            for (int t = 0; t < T; t++) red[t][tid] += red[t][tid + half];
        __syncthreads();
    }
    if (tid < T) y[(size_t)tid * out + row] = red[tid][0];
}
DCP_STATIC_SHARED(k_qgemv<uint8_t>, sizeof(float) * QG_T * QG_THREADS);
DCP_STATIC_SHARED(k_qgemv<Int4>, sizeof(float) * QG_T * QG_THREADS);
DCP_STATIC_SHARED(k_qgemv<Fp4>, sizeof(float) * QG_T * QG_THREADS);

static void cuda_matmul(float *y, const float *x, WeightRef w, int T, int in, int out)
{
    if (!T || !out) return;
    counts.matmuls++;
    const float one = 1.0f, zero = 0.0f;
    if (dtype_quantized(w.dtype) && T <= QG_T) { // decode: read as stored
        if (w.dtype == DTYPE_I4)
            DCP_LAUNCH(k_qgemv<Int4>, out, QG_THREADS, 0, stream, y, x, (const Int4 *)w.data, QS_ARGS(w), T, in, out);
        else if (w.dtype == DTYPE_FP4)
            DCP_LAUNCH(k_qgemv<Fp4>, out, QG_THREADS, 0, stream, y, x, (const Fp4 *)w.data, QS_ARGS(w), T, in, out);
        else
            DCP_LAUNCH(k_qgemv<uint8_t>, out, QG_THREADS, 0, stream, y, x, (const uint8_t *)w.data, QS_ARGS(w), T, in,
                       out);
        DCP_CHECK_LAUNCH(stream);
        return;
    }
    if (dtype_quantized(w.dtype)) { // prefill: widened, then cuBLAS's fp32 GEMM
        const float *wf = dequantized(w, (size_t)out * in);
        DCP_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, wf, in, x, in, &zero, y, out));
        return;
    }
    if (w.dtype == DTYPE_F32) {
        DCP_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, (const float *)w.data, in, x, in,
                              &zero, y, out));
        return;
    }
    const __nv_bfloat16 *xb = activations_bf16(x, (size_t)T * in);
    DCP_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w.data, CUDA_R_16BF, in, xb, CUDA_R_16BF,
                           in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// One cuBLAS strided-batched GEMM for all heads (backend.h): head b's
// weights are the b-th (out, in) matrix of the stack.
static void cuda_matmul_batched(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                                int batch, int T, int in, int out)
{
    if (!T || !out || !batch) return;
    counts.batched_matmuls++;
    const float one = 1.0f, zero = 0.0f;
    long long w_step = (long long)out * in;
    if (w.dtype == DTYPE_F32) {
        DCP_CHECK(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, (const float *)w.data,
                                            in, w_step, x, ldx, (long long)x_step, &zero, y, ldy, (long long)y_step,
                                            batch));
        return;
    }
    // the activations as bf16, at the same offsets: from x to the last head's last row
    const __nv_bfloat16 *xb = activations_bf16(x, (size_t)(T - 1) * ldx + (size_t)(batch - 1) * x_step + in);
    DCP_CHECK(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w.data, CUDA_R_16BF, in,
                                         w_step, xb, CUDA_R_16BF, ldx, (long long)x_step, &zero, y, CUDA_R_32F, ldy,
                                         (long long)y_step, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---- element-wise kernels ---------------------------------------------

__global__ void k_rmsnorm(float *y, const float *x, const float *w, int dim, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    __shared__ float part[256];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    float inv = rsqrtf(part[0] / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (inv * xr[i]);
}

DCP_STATIC_SHARED(k_rmsnorm, sizeof(float) * 256);

static void cuda_rmsnorm(float *y, const float *x, const float *w, int T, int dim, float eps)
{
    if (T) DCP_LAUNCH(k_rmsnorm, T, MUTANT(4) ? 2048 : 256, 0, stream, y, x, w, dim, eps);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_rope(float *x, const int *pos, int T, int heads, int head_dim, const float *inv_freq, float scale,
                       int adjacent)
{
    int half = head_dim / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * heads * half) return;
    int i = (int)(idx % half), h = (int)((idx / half) % heads), t = (int)(idx / half / heads);
    float angle = pos[t] * inv_freq[i], c = cosf(angle) * scale, s = sinf(angle) * scale;
    float *v = x + ((size_t)t * heads + h) * head_dim;
    int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + half;
    float v0 = v[a], v1 = v[b];
    v[a] = v0 * c - v1 * s;
    v[b] = v0 * s + v1 * c;
}

static void cuda_rope(float *x, const int *pos, int T, int n_heads, int head_dim, const float *inv_freq, float scale,
                      RopeStyle style)
{
    size_t n = (size_t)T * n_heads * (head_dim / 2);
    if (n)
        DCP_LAUNCH(k_rope, blocks_for(n, 256), 256, 0, stream, x, pos, T, n_heads, head_dim, inv_freq, scale,
                                                        style == ROPE_ADJACENT_PAIRS);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_silu_mul(float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

static void cuda_silu_mul(float *gate, const float *up, size_t n)
{
    if (n) DCP_LAUNCH(k_silu_mul, blocks_for(n, 256), 256, 0, stream, gate, up, n);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_add_bias(float *y, const float *b, int T, int n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)T * n) y[i] += b[i % n];
}

static void cuda_add_bias(float *y, const float *b, int T, int n)
{
    size_t total = (size_t)T * n;
    if (total) DCP_LAUNCH(k_add_bias, blocks_for(total, 256), 256, 0, stream, y, b, T, n);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_add(float *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

static void cuda_add(float *y, const float *x, size_t n)
{
    if (n) DCP_LAUNCH(k_add, blocks_for(n, 256), 256, 0, stream, y, x, n);
    DCP_CHECK_LAUNCH(stream);
}

// dst row r = src row rows[r] (embedding: src = table, rows = tokens)
__global__ void k_gather_rows(float *dst, const float *src, const int *rows, int dim)
{
    const float *s = src + (size_t)rows[blockIdx.x] * dim;
    float *d = dst + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) d[i] = s[i];
}

static void cuda_gather_rows(float *dst, const float *src, const int *rows, int R, int dim)
{
    if (R) DCP_LAUNCH(k_gather_rows, R, 128, 0, stream, dst, src, rows, dim);
    DCP_CHECK_LAUNCH(stream);
}

static void cuda_embedding(float *x, const float *table, const int *tokens, int T, int dim)
{
    cuda_gather_rows(x, table, tokens, T, dim);
}

// KV cache rows: fp32, bf16 (--kv-cache-dtype bfloat16) or FP8 E4M3
// (--kv-cache-dtype fp8), rounded as the CPU backend rounds them
__device__ static inline float kv_load(const float *p) { return *p; }
__device__ static inline float kv_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ static inline float kv_load(const uint8_t *p) { return f8e4m3_to_f32(*p); }
__device__ static inline void kv_store(float *p, float v) { *p = v; }
__device__ static inline void kv_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ static inline void kv_store(uint8_t *p, float v) { *p = f32_to_f8e4m3(v); }

// a block's rows KV head by KV head, as kv_pool_offset (backend.h) lays them
template <typename KV>
__global__ void k_kv_write(KV *k_pool, KV *v_pool, const float *k, const float *v, const int *slots, int kvd,
                           int kv_heads, int block_size)
{
    int slot = slots[blockIdx.x], hd = kvd / kv_heads;
    if (slot < 0) return; // another DCP rank owns this position
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        size_t at = kv_pool_offset((size_t)slot, i / hd, (size_t)hd, kv_heads, (size_t)block_size) + i % hd;
        kv_store(k_pool + at, k[(size_t)blockIdx.x * kvd + i]);
        if (v_pool) kv_store(v_pool + at, v[(size_t)blockIdx.x * kvd + i]); // MLA: latent rows only
    }
}

static void cuda_kv_write(void *k_pool, void *v_pool, DType kv_dtype, const float *k, const float *v, const int *slots,
                          int T, int kvd, int kv_heads, int block_size)
{
    if (!T) return;
    if (kv_dtype == DTYPE_F8_E4M3)
        DCP_LAUNCH(k_kv_write<uint8_t>, T, 128, 0, stream, (uint8_t *)k_pool, (uint8_t *)v_pool, k, v, slots, kvd,
                   kv_heads, block_size);
    else if (kv_dtype == DTYPE_BF16)
        DCP_LAUNCH(k_kv_write<__nv_bfloat16>, T, 128, 0, stream, (__nv_bfloat16 *)k_pool, (__nv_bfloat16 *)v_pool, k,
                   v, slots, kvd, kv_heads, block_size);
    else
        DCP_LAUNCH(k_kv_write<float>, T, 128, 0, stream, (float *)k_pool, (float *)v_pool, k, v, slots, kvd, kv_heads,
                   block_size);
    DCP_CHECK_LAUNCH(stream);
}

// x rounded in place to the values a cache of KV's type holds
template <typename KV>
__global__ void k_round_kv(float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    KV held;
    if (i < n) kv_store(&held, x[i]), x[i] = kv_load(&held);
}

static void cuda_round_kv(float *x, size_t n, DType t)
{
    if (!n || t == DTYPE_F32) return;
    if (t == DTYPE_F8_E4M3) DCP_LAUNCH(k_round_kv<uint8_t>, blocks_for(n, 256), 256, 0, stream, x, n);
    else DCP_LAUNCH(k_round_kv<__nv_bfloat16>, blocks_for(n, 256), 256, 0, stream, x, n);
    DCP_CHECK_LAUNCH(stream);
}

// row r of dst (stride dst_stride) = width floats of row r of src
__global__ void k_strided_copy(float *dst, int dst_stride, const float *src, int src_stride, int width)
{
    const float *s = src + (size_t)blockIdx.x * src_stride;
    float *d = dst + (size_t)blockIdx.x * dst_stride;
    for (int i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

static void cuda_strided_copy(float *dst, int dst_stride, const float *src, int src_stride, int rows, int width)
{
    if (rows) DCP_LAUNCH(k_strided_copy, rows, 128, 0, stream, dst, dst_stride, src, src_stride, width);
    DCP_CHECK_LAUNCH(stream);
}

// ---- mixture of experts, on the device ----------------------------------

#define MOE_MAX_EXPERTS 512
#define MOE_MAX_GROUPS 64

// One block per token: its experts and weights, by the host's own code
// (moe_route_token), on one thread; E is a few hundred at most.
// (the router's fields come as scalars: HIP-CPU's kernels take no structs by value without a warning)
__global__ void k_moe_route_tokens(int experts, int per_token, int groups, int topk_group, int flags, float scaling,
                                   const float *logits, const float *bias, int *idx, float *wt)
{
    MoeRouting r = {experts, per_token, groups, topk_group, flags & 1, flags >> 1 & 1, flags >> 2 & 1, scaling};
    __shared__ float score[MOE_MAX_EXPERTS], choice[MOE_MAX_EXPERTS], gscore[MOE_MAX_GROUPS];
    __shared__ int keep[MOE_MAX_GROUPS];
    __shared__ char taken[MOE_MAX_EXPERTS];
    size_t t = blockIdx.x;
    if (threadIdx.x == 0)
        moe_route_token(&r, logits + t * r.experts, bias, score, choice, gscore, keep, taken, idx + t * r.per_token,
                        wt + t * r.per_token);
}
DCP_STATIC_SHARED(k_moe_route_tokens, (2 * sizeof(float) + 1) * MOE_MAX_EXPERTS + (sizeof(float) + sizeof(int)) * MOE_MAX_GROUPS);

// The step's pairs grouped by expert (moe_group_pairs), on one thread: a
// counting sort of T * K entries.
__global__ void k_moe_group(const int *idx, const float *wt, int T, int K, int E, int *rows, float *weights,
                            int *slots, int *start, int *fill)
{
    if (threadIdx.x == 0) moe_group_pairs(idx, wt, T, K, E, rows, weights, slots, start, fill);
}

static int *d_moe_idx, *d_moe_fill;
static float *d_moe_wt;
static size_t moe_cap;

static void cuda_moe_route(const MoeRouting *r, const float *logits, const float *bias, int T, int *rows,
                           float *weights, int *slots, int *start)
{
    if (r->experts > MOE_MAX_EXPERTS || r->groups > MOE_MAX_GROUPS)
        dcp_check_failed(__FILE__, __LINE__, "cuda_moe_route", "more than 512 experts or 64 expert groups");
    size_t pairs = (size_t)T * r->per_token;
    if (pairs + r->experts > moe_cap) {
        if (moe_cap) cuda_release(d_moe_idx), cuda_release(d_moe_fill), cuda_release(d_moe_wt);
        moe_cap = 2 * (pairs + r->experts);
        d_moe_idx = (int *)cuda_alloc(sizeof(int) * moe_cap);
        d_moe_fill = (int *)cuda_alloc(sizeof(int) * moe_cap);
        d_moe_wt = (float *)cuda_alloc(sizeof(float) * moe_cap);
    }
    if (!T) return;
    DCP_LAUNCH(k_moe_route_tokens, T, 32, 0, stream, r->experts, r->per_token, r->groups, r->topk_group,
               r->v3 | r->grouped << 1 | r->norm_topk << 2, r->scaling, logits, bias, d_moe_idx, d_moe_wt);
    DCP_CHECK_LAUNCH(stream);
    DCP_LAUNCH(k_moe_group, 1, 32, 0, stream, d_moe_idx, d_moe_wt, T, r->per_token, r->experts, rows, weights, slots,
               start, d_moe_fill);
    DCP_CHECK_LAUNCH(stream);
}

// The grouped GEMM of the experts (backend.h, moe_matmul). The grid covers
// the worst case of row tiles, pairs / MM_BM + experts (each expert adds at
// most one partial tile); block x finds its expert and tile from start[]
// on the device, and blocks past the last tile return, so the host never
// needs the counts. A block computes MM_BM rows x MM_BN outputs, K in steps
// of MM_BK through shared memory; each of the 256 threads 2 x 4 of them,
// accumulated in fp32 (bf16 weights widened exactly).
#define MM_BM 32
#define MM_BN 64
#define MM_BK 32
#define MM_THREADS 256 // 16 x 16, each 2 x 4 outputs of the 32 x 64 tile
static_assert(MM_THREADS == (MM_BM / 2) * (MM_BN / 4) && MM_BM / 2 == 16 && MM_BN / 4 == 16, "k_moe_matmul's thread grid");
template <typename W>
__global__ void k_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int experts,
                             const W *w, QS_PARAMS, size_t w_step, int in, int out)
{
    WeightRef qs = qs_ref(scale, scale8, tables, table_runs, run0, qcols, qflags);
    __shared__ float xs[MM_BM][MM_BK + 1], ws[MM_BN][MM_BK + 1];
    int b = blockIdx.x, e = 0;
    for (; e < experts; e++) {
        int tiles = (start[e + 1] - start[e] + MM_BM - 1) / MM_BM;
        if (b < tiles) break;
        b -= tiles;
    }
    if (e == experts) return; // the whole block: past the last tile
    int r0 = start[e] + b * MM_BM, r1 = min(start[e + 1], r0 + MM_BM), n0 = blockIdx.y * MM_BN;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    size_t we = (size_t)e * w_step; // expert e's first element
    float acc[2][4] = {{0}};
    for (int k0 = 0; k0 < in; k0 += MM_BK) {
        for (int i = threadIdx.x; i < MM_BM * MM_BK; i += blockDim.x) {
            int r = i / MM_BK, k = i % MM_BK, row = r0 + r;
            xs[r][k] = row < r1 && k0 + k < in ? x[(size_t)(rows ? rows[row] : row) * ldx + k0 + k] : 0.0f;
        }
        for (int i = threadIdx.x; i < MM_BN * MM_BK; i += blockDim.x) {
            int n = i / MM_BK, k = i % MM_BK;
            ws[n][k] = n0 + n < out && k0 + k < in ? w_load(w, qs, we + (size_t)(n0 + n) * in + k0 + k)
                                                   : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < MM_BK; k++)
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[a][c] += xs[ty + 16 * a][k] * ws[tx + 16 * c][k];
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int row = r0 + ty + 16 * a, n = n0 + tx + 16 * c;
            if (row < r1 && n < out) y[(size_t)row * out + n] = acc[a][c];
        }
}
DCP_STATIC_SHARED(k_moe_matmul<float>, sizeof(float) * (MM_BM + MM_BN) * (MM_BK + 1));
DCP_STATIC_SHARED(k_moe_matmul<__nv_bfloat16>, sizeof(float) * (MM_BM + MM_BN) * (MM_BK + 1));
DCP_STATIC_SHARED(k_moe_matmul<uint8_t>, sizeof(float) * (MM_BM + MM_BN) * (MM_BK + 1));
DCP_STATIC_SHARED(k_moe_matmul<Int4>, sizeof(float) * (MM_BM + MM_BN) * (MM_BK + 1));
DCP_STATIC_SHARED(k_moe_matmul<Fp4>, sizeof(float) * (MM_BM + MM_BN) * (MM_BK + 1));

static void cuda_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int experts,
                            int pairs, WeightRef w, size_t w_step, int in, int out)
{
    if (!pairs || !out) return;
    counts.moe_matmuls++;
    dim3 grid(pairs / MM_BM + experts, blocks_for(out, MM_BN));
    if (w.dtype == DTYPE_I4)
        DCP_LAUNCH(k_moe_matmul<Int4>, grid, MM_THREADS, 0, stream, y, x, ldx, rows, start, experts,
                   (const Int4 *)w.data, QS_ARGS(w), w_step, in, out);
    else if (w.dtype == DTYPE_FP4)
        DCP_LAUNCH(k_moe_matmul<Fp4>, grid, MM_THREADS, 0, stream, y, x, ldx, rows, start, experts,
                   (const Fp4 *)w.data, QS_ARGS(w), w_step, in, out);
    else if (w.dtype == DTYPE_F8_E4M3)
        DCP_LAUNCH(k_moe_matmul<uint8_t>, grid, MM_THREADS, 0, stream, y, x, ldx, rows, start, experts,
                   (const uint8_t *)w.data, QS_ARGS(w), w_step, in, out);
    else if (w.dtype == DTYPE_BF16)
        DCP_LAUNCH(k_moe_matmul<__nv_bfloat16>, grid, MM_THREADS, 0, stream, y, x, ldx, rows, start, experts,
                   (const __nv_bfloat16 *)w.data, QS_ARGS(w), w_step, in, out);
    else
        DCP_LAUNCH(k_moe_matmul<float>, grid, MM_THREADS, 0, stream, y, x, ldx, rows, start, experts, (const float *)w.data,
                   QS_ARGS(w), w_step, in, out);
    DCP_CHECK_LAUNCH(stream);
}

// y row t = 0 + w * src row + ... over its pairs in expert order, each
// product and sum rounded on its own, as the CPU adds them
__global__ void k_moe_combine(float *y, const float *src, const int *slots, const float *weights, int K, int dim)
{
    const int *s = slots + (size_t)blockIdx.x * K;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int n = 0; n < K; n++) acc = __fadd_rn(acc, __fmul_rn(weights[s[n]], src[(size_t)s[n] * dim + d]));
        y[(size_t)blockIdx.x * dim + d] = acc;
    }
}

static void cuda_moe_combine(float *y, const float *src, const int *slots, const float *weights, int T, int K, int dim)
{
    if (T) DCP_LAUNCH(k_moe_combine, T, 128, 0, stream, y, src, slots, weights, K, dim);
    DCP_CHECK_LAUNCH(stream);
}

// ---- attention --------------------------------------------------------

#define ATT_THREADS 128
#define ATT_MAX_D 640 // MLA: kv_lora_rank 512 + qk_rope_head_dim 64

// One block per (token, head): keys in tiles of ATT_THREADS, one score per
// thread, an online softmax across tiles, the output accumulated by the
// threads d < head_dim. Keys are contiguous rows, or paged through the
// token's block table (a block's rows KV head by KV head, kv_pool_offset).
__device__ static size_t att_row(const int *table, int j, int block_size, int kv_heads, int kvh, int kv_stride)
{
    if (!table) return (size_t)j * kv_stride + (size_t)kvh * (kv_stride / kv_heads);
    return kv_pool_offset((size_t)table[j / block_size] * block_size + j % block_size, kvh,
                          (size_t)(kv_stride / kv_heads), kv_heads, (size_t)block_size);
}

// Keys before key x in shard g of G shards of runs of `run` keys (AttnBatch).
__device__ static int shard_keys(int x, int G, int run, int g)
{
    int base = (x / run / G) * run, rem = x - base * G - g * run;
    return base + (rem < 0 ? 0 : rem > run ? run : rem);
}

// Block (r, g): row r (token t, head h) over key shard g of G. Its output
// row goes to out + (g * rows + r) * out_stride, its LSE to lse + (g * rows +
// r) * lse_stride.
template <typename KV>
__global__ void k_attention(float *out, size_t out_stride, float *lse, size_t lse_stride, const float *q,
                            const KV *k_base, const KV *v_base, const int *row0, const int *n_keys,
                            const int *key0, const int *const *tables, int block_size, int n_heads, int group,
                            int head_dim, int v_dim, int kv_stride, float scale, int G, int run)
{
    int r = blockIdx.x, g = blockIdx.y, rows = gridDim.x, t = r / n_heads, h = r % n_heads, kvh = h / group,
        kv_heads = n_heads / group;
    int n = shard_keys(n_keys[t], G, run, g), first = key0 ? shard_keys(key0[t], G, run, g) : 0, tid = threadIdx.x;
    const float *qr = q + (size_t)r * head_dim;
    const int *table = tables ? tables[t] : NULL;
    size_t base = !table && row0 ? (size_t)row0[t] * kv_stride : 0;
    const KV *k = k_base + base, *v = v_base + base;
    __shared__ float qs[ATT_MAX_D], p[ATT_THREADS], red[ATT_THREADS];
    for (int d = tid; d < head_dim; d += blockDim.x) qs[d] = qr[d];
    __syncthreads();
    float m = -INFINITY, sum = 0.0f, acc[ATT_MAX_D / ATT_THREADS] = {0};
    for (int j0 = first; j0 < n; j0 += ATT_THREADS) {
        int j = j0 + tid;
        float s = -INFINITY;
        if (j < n) {
            int key = (j / run) * G * run + g * run + j % run; // shard g's key j
            const KV *kj = k + att_row(table, key, block_size, kv_heads, kvh, kv_stride);
            s = 0.0f;
            for (int d = 0; d < head_dim; d++) s += qs[d] * kv_load(kj + d);
            s *= scale;
        }
        red[tid] = s;
        __syncthreads();
        for (int w = ATT_THREADS / 2; w > 0; w >>= 1) {
            if (tid < w) red[tid] = fmaxf(red[tid], red[tid + w]);
            __syncthreads();
        }
        float m_new = fmaxf(m, red[0]);
        __syncthreads();
        float e = j < n ? expf(s - m_new) : 0.0f;
        p[tid] = e;
        red[tid] = e;
        __syncthreads();
        for (int w = ATT_THREADS / 2; w > 0; w >>= 1) {
            if (tid < w) red[tid] += red[tid + w];
            if (!MUTANT(3)) __syncthreads();
        }
        float correction = expf(m - m_new);
        sum = sum * correction + red[0];
        int tile = min(ATT_THREADS, n - j0);
        for (int c = 0; c * ATT_THREADS + tid < v_dim; c++) {
            int d = c * ATT_THREADS + tid;
            float a = acc[c] * correction;
            for (int jj = 0; jj < tile; jj++) {
                int jk = j0 + jj, key = (jk / run) * G * run + g * run + jk % run;
                a += p[jj] * kv_load(v + att_row(table, key, block_size, kv_heads, kvh, kv_stride) + d);
            }
            acc[c] = a;
        }
        m = m_new;
        __syncthreads();
    }
    size_t at = (size_t)g * rows + r;
    float *o = out + at * out_stride;
    for (int c = 0; c * ATT_THREADS + tid < v_dim; c++) o[c * ATT_THREADS + tid] = n > first ? acc[c] / sum : 0.0f;
    if (tid == 0) lse[at * lse_stride] = n > first ? m + logf(sum) : -INFINITY;
}

DCP_STATIC_SHARED(k_attention<float>, sizeof(float) * (ATT_MAX_D + 2 * ATT_THREADS));
DCP_STATIC_SHARED(k_attention<__nv_bfloat16>, sizeof(float) * (ATT_MAX_D + 2 * ATT_THREADS));
DCP_STATIC_SHARED(k_attention<uint8_t>, sizeof(float) * (ATT_MAX_D + 2 * ATT_THREADS));

// Latent attention (MLA: one KV head, the values the first v_dim floats of
// the key rows, paged or contiguous), as FlashMLA shapes it: a block serves up to LAT_HEADS heads
// of one token, so that each latent row is read once for all of them
// instead of once per head. Keys come in tiles of LAT_KEYS rows through
// shared memory, loaded row by row by consecutive threads (coalesced);
// every (head, key) score of a tile is two threads' half dot products; the
// heads' online softmax states live in shared memory, and each thread
// accumulates the value columns d = tid + c * ATT_THREADS of every head.
#define LAT_HEADS 16
#define LAT_KEYS 4
#define LAT_MAX_D 576 // kv_lora_rank 512 + qk_rope_head_dim 64
#define LAT_ROW (LAT_MAX_D + 1) // a row's floats in shared memory, padded so that rows start in different banks
#define LAT_COLS ((LAT_MAX_D + ATT_THREADS - 1) / ATT_THREADS)
static_assert(ATT_THREADS == 2 * LAT_HEADS * LAT_KEYS, "k_latent_attention: two threads per (head, key) score");
template <typename KV>
__global__ void k_latent_attention(float *out, size_t out_stride, float *lse, size_t lse_stride, const float *q,
                                   const KV *rows_base, const int *row0, const int *n_keys, const int *key0,
                                   const int *const *tables, int block_size, int n_heads, int head_dim, int v_dim,
                                   float scale, int G, int run)
{
    __shared__ float qs[LAT_HEADS][LAT_ROW], ks[LAT_KEYS][LAT_ROW], sc[LAT_HEADS][LAT_KEYS],
        red[ATT_THREADS], m[LAT_HEADS], l[LAT_HEADS], corr[LAT_HEADS];
    int chunks = (n_heads + LAT_HEADS - 1) / LAT_HEADS, t = blockIdx.x / chunks,
        h0 = blockIdx.x % chunks * LAT_HEADS, nh = min(LAT_HEADS, n_heads - h0), g = blockIdx.y, tid = threadIdx.x;
    int rows = gridDim.x / chunks * n_heads;
    int n = shard_keys(n_keys[t], G, run, g), first = key0 ? shard_keys(key0[t], G, run, g) : 0;
    const int *table = tables ? tables[t] : NULL;
    if (!table && row0) rows_base += (size_t)row0[t] * head_dim; // contiguous rows from the token's first
    for (int i = tid; i < nh * head_dim; i += blockDim.x)
        qs[i / head_dim][i % head_dim] = q[((size_t)t * n_heads + h0) * head_dim + i];
    if (tid < LAT_HEADS) m[tid] = -INFINITY, l[tid] = 0.0f;
    float acc[LAT_HEADS][LAT_COLS] = {{0}};
    int pair = tid % (LAT_HEADS * LAT_KEYS), hh = pair / LAT_KEYS, jj = pair % LAT_KEYS,
        half = tid / (LAT_HEADS * LAT_KEYS), mid = head_dim / 2;
    for (int j0 = first; j0 < n; j0 += LAT_KEYS) {
        int kt = min(LAT_KEYS, n - j0);
        for (int i = tid; i < kt * head_dim; i += blockDim.x) {
            int jk = j0 + i / head_dim, key = (jk / run) * G * run + g * run + jk % run; // shard g's key jk
            ks[i / head_dim][i % head_dim] = kv_load(rows_base + att_row(table, key, block_size, 1, 0, head_dim) +
                                                     i % head_dim);
        }
        if (!MUTANT(1)) __syncthreads();
        float part = 0.0f;
        if (hh < nh && jj < kt)
            for (int d = half ? mid : 0; d < (half ? head_dim : mid); d++) part += qs[hh][d] * ks[jj][d];
        red[tid] = part;
        __syncthreads();
        if (tid < LAT_HEADS * LAT_KEYS)
            sc[hh][jj] = hh < nh && jj < kt ? (red[tid] + red[tid + LAT_HEADS * LAT_KEYS]) * scale : -INFINITY;
        __syncthreads();
        if (tid < nh) { // head tid's online softmax over the tile
            float mt = m[tid];
            for (int j = 0; j < kt; j++) mt = fmaxf(mt, sc[tid][j]);
            float sum = 0.0f;
            for (int j = 0; j < LAT_KEYS; j++) sum += sc[tid][j] = j < kt ? expf(sc[tid][j] - mt) : 0.0f;
            corr[tid] = expf(m[tid] - mt);
            l[tid] = l[tid] * corr[tid] + sum;
            m[tid] = mt;
        }
        __syncthreads();
#pragma unroll
        for (int h = 0; h < LAT_HEADS; h++)
#pragma unroll
            for (int c = 0; c < LAT_COLS; c++) {
                int d = c * ATT_THREADS + tid;
                if (h >= nh || d >= v_dim) continue;
                float a = acc[h][c] * corr[h];
                for (int j = 0; j < kt; j++) a += sc[h][j] * ks[j][d];
                acc[h][c] = a;
            }
        __syncthreads();
    }
    int width = MUTANT(2) ? v_dim - 1 : v_dim;
#pragma unroll
    for (int h = 0; h < LAT_HEADS; h++) {
        if (h >= nh) continue;
        size_t at = (size_t)g * rows + (size_t)t * n_heads + h0 + h;
#pragma unroll
        for (int c = 0; c < LAT_COLS; c++) {
            int d = c * ATT_THREADS + tid;
            if (d < width) out[at * out_stride + d] = n > first ? acc[h][c] / l[h] : 0.0f;
        }
        if (tid == 0) lse[at * lse_stride] = n > first ? m[h] + logf(l[h]) : -INFINITY;
    }
}

#define LAT_SHARED (sizeof(float) * ((LAT_HEADS + LAT_KEYS) * LAT_ROW + LAT_HEADS * LAT_KEYS + ATT_THREADS + 3 * LAT_HEADS))
DCP_STATIC_SHARED(k_latent_attention<float>, LAT_SHARED);
DCP_STATIC_SHARED(k_latent_attention<__nv_bfloat16>, LAT_SHARED);
DCP_STATIC_SHARED(k_latent_attention<uint8_t>, LAT_SHARED);

// ---- LSE merges (docs/design.md, "Same bits at any layout") ------------

// a's row r becomes the merge of a's and b's (rows of stride floats: the
// outputs, then the LSE at head_dim). The arithmetic is kept from FMA
// contraction, so that merging b into a and a into b give the same bits.
__global__ void k_merge_partials(float *a, const float *b, int rows, int head_dim, int stride)
{
    int r = blockIdx.x * blockDim.y + threadIdx.y;
    float *x = a + (size_t)r * stride;
    const float *y = b + (size_t)r * stride;
    float l1 = r < rows ? x[head_dim] : 0.0f, l2 = r < rows ? y[head_dim] : -INFINITY;
    if (r < rows && l2 != -INFINITY) {
        if (l1 == -INFINITY) {
            for (int d = threadIdx.x; d < head_dim; d += blockDim.x) x[d] = y[d];
        } else {
            float m = fmaxf(l1, l2), s1 = expf(l1 - m), s2 = expf(l2 - m), inv = __frcp_rn(__fadd_rn(s1, s2));
            for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
                x[d] = __fmul_rn(__fadd_rn(__fmul_rn(x[d], s1), __fmul_rn(y[d], s2)), inv);
            l2 = m + logf(__fadd_rn(s1, s2));
        }
    }
    // every thread of the row has read x[head_dim] before one writes it
    // (a block barrier: no kernel here relies on a warp's width)
    __syncthreads();
    if (r < rows && threadIdx.x == 0 && y[head_dim] != -INFINITY) x[head_dim] = l2;
}

static void cuda_merge_partials(float *a, const float *b, int rows, int head_dim, int stride)
{
    dim3 threads(32, 8);
    if (rows) DCP_LAUNCH(k_merge_partials, blocks_for(rows, 8), threads, 0, stream, a, b, rows, head_dim, stride);
    DCP_CHECK_LAUNCH(stream);
}

// the shards' packed partials (cuda_attention), grown on demand
static float *d_shard_parts;
static size_t shard_parts_cap;

// The per-token arrays of a batch in device memory: the caller's copies
// (uploaded once per step), or the host arrays uploaded here (a caller
// without them, as the conformance test).
static void attention_metadata(const AttnBatch *a, const int **n_keys, const int **key0, const int **row0,
                               const int *const **tables)
{
    *n_keys = a->d_n_keys, *key0 = a->key0 ? a->d_key0 : NULL, *row0 = a->row0 && !a->blocks ? a->d_row0 : NULL;
    *tables = a->blocks ? a->d_blocks : NULL;
    if (*n_keys && (!a->key0 || *key0) && (!a->row0 || a->blocks || *row0) && (!a->blocks || *tables)) return;
    if (a->T > meta_cap) {
        if (meta_cap) {
            cuda_release(d_tables);
            cuda_release(d_nkeys);
            cuda_release(d_key0);
            cuda_release(d_row0);
        }
        meta_cap = a->T * 2;
        d_tables = (const int **)cuda_alloc(sizeof(int *) * meta_cap);
        d_nkeys = (int *)cuda_alloc(sizeof(int) * meta_cap);
        d_key0 = (int *)cuda_alloc(sizeof(int) * meta_cap);
        d_row0 = (int *)cuda_alloc(sizeof(int) * meta_cap);
    }
    cuda_upload(d_nkeys, a->n_keys, sizeof(int) * a->T);
    if (a->blocks) cuda_upload(d_tables, a->blocks, sizeof(int *) * a->T);
    if (a->key0) cuda_upload(d_key0, a->key0, sizeof(int) * a->T);
    if (a->row0 && !a->blocks) cuda_upload(d_row0, a->row0, sizeof(int) * a->T);
    *n_keys = d_nkeys, *key0 = a->key0 ? d_key0 : NULL, *row0 = a->row0 && !a->blocks ? d_row0 : NULL;
    *tables = a->blocks ? d_tables : NULL;
}

// The attention kernel for a's shape, over a cache of KV's type: the
// latent kernel for one KV head whose keys are its values (MLA), else the
// general one
template <typename KV>
static void attention_kernels(const AttnBatch *a, float *out, size_t out_stride, float *lse, size_t lse_stride,
                              const int *row0, const int *n_keys, const int *key0, const int *const *tables, int rows,
                              int Dv, int G, int run)
{
    if (a->n_kv_heads == 1 && a->k == a->v && a->kv_stride == a->head_dim && a->head_dim <= LAT_MAX_D &&
        Dv <= a->head_dim) {
        dim3 grid(a->T * ((a->n_heads + LAT_HEADS - 1) / LAT_HEADS), G);
        DCP_LAUNCH(k_latent_attention<KV>, grid, ATT_THREADS, 0, stream, out, out_stride, lse, lse_stride, a->q,
                   (const KV *)a->k, row0, n_keys, key0, tables, a->block_size, a->n_heads, a->head_dim, Dv, a->scale,
                   G, run);
    } else {
        DCP_LAUNCH(k_attention<KV>, dim3(rows, G), ATT_THREADS, 0, stream, out, out_stride, lse, lse_stride, a->q,
                   (const KV *)a->k, (const KV *)a->v, row0, n_keys, key0, tables, a->block_size, a->n_heads,
                   a->n_heads / a->n_kv_heads, a->head_dim, Dv, a->kv_stride, a->scale, G, run);
    }
}

static void cuda_attention(const AttnBatch *a)
{
    if (!a->T) return;
    if (a->head_dim > ATT_MAX_D) dcp_check_failed(__FILE__, __LINE__, "cuda_attention", "head_dim above 640");
    const int *n_keys, *key0, *row0, *const *tables;
    attention_metadata(a, &n_keys, &key0, &row0, &tables);
    int G = a->shards > 1 ? a->shards : 1, run = a->shard_interleave > 0 ? a->shard_interleave : 1;
    int Dv = a->v_dim ? a->v_dim : a->head_dim, rows = a->T * a->n_heads;
    float *out = a->out, *lse = a->lse;
    size_t out_stride = (size_t)Dv, lse_stride = 1;
    if (G > 1) { // each shard's rows packed (outputs, LSE), then merged by the tree
        size_t need = (size_t)G * rows * (Dv + 1);
        if (need > shard_parts_cap) {
            if (d_shard_parts) cuda_release(d_shard_parts);
            shard_parts_cap = need;
            d_shard_parts = (float *)cuda_alloc(sizeof(float) * need);
        }
        out = d_shard_parts, lse = d_shard_parts + Dv;
        out_stride = lse_stride = (size_t)Dv + 1;
    }
    if (a->kv_dtype == DTYPE_F8_E4M3)
        attention_kernels<uint8_t>(a, out, out_stride, lse, lse_stride, row0, n_keys, key0, tables, rows, Dv, G, run);
    else if (a->kv_dtype == DTYPE_BF16)
        attention_kernels<__nv_bfloat16>(a, out, out_stride, lse, lse_stride, row0, n_keys, key0, tables, rows, Dv, G,
                                         run);
    else
        attention_kernels<float>(a, out, out_stride, lse, lse_stride, row0, n_keys, key0, tables, rows, Dv, G, run);
    DCP_CHECK_LAUNCH(stream);
    if (G == 1) return;
    size_t blk = (size_t)rows * (Dv + 1);
    for (int i = 0; i < G - 1; i++) { // the canonical merge tree (tree.h)
        TreeStep st = tree_merge_step(G, i);
        cuda_merge_partials(d_shard_parts + st.into * blk, d_shard_parts + st.from * blk, rows, Dv, Dv + 1);
    }
    cuda_strided_copy(a->out, Dv, d_shard_parts, Dv + 1, rows, Dv);
    cuda_strided_copy(a->lse, 1, d_shard_parts + Dv, Dv + 1, rows, 1);
}

__global__ void k_pack_partials(float *parts, const float *o, const float *lse, int rows, int head_dim)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * (head_dim + 1)) return;
    size_t r = i / (head_dim + 1);
    int d = (int)(i % (head_dim + 1));
    parts[i] = d < head_dim ? o[r * head_dim + d] : lse[r];
}

static void cuda_pack_partials(float *parts, const float *o, const float *lse, int rows, int head_dim)
{
    size_t n = (size_t)rows * (head_dim + 1);
    if (n) DCP_LAUNCH(k_pack_partials, blocks_for(n, 256), 256, 0, stream, parts, o, lse, rows, head_dim);
    DCP_CHECK_LAUNCH(stream);
}

#ifdef DCP_HIP_CPU
#include <memory>
#include <tbb/global_control.h>
// HIP-CPU runs a kernel's blocks through the C++ parallel algorithms (TBB):
// at most the rank's share of the cores, as the CPU backend's threads
extern "C" void backend_cuda_set_threads(int threads)
{
    static std::unique_ptr<tbb::global_control> limit;
    limit.reset();
    if (threads > 0) limit.reset(new tbb::global_control(tbb::global_control::max_allowed_parallelism, threads));
}
#else
extern "C" void backend_cuda_set_threads(int threads) { (void)threads; }
#endif

// ---- the table ----------------------------------------------------------

static Backend cuda_table;

extern "C" const Backend *backend_cuda(void)
{
    static int ready;
    if (ready) return &cuda_table;
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        dcp_fail("--backend cuda: no usable GPU on this machine (%s)",
                 rc != cudaSuccess ? cudaGetErrorString(rc) : "no CUDA device visible");
        return NULL;
    }
    DCP_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DCP_CHECK(cublasCreate(&blas));
    DCP_CHECK(cublasSetStream(blas, stream));
    // fp32 GEMMs stay fp32: no TF32 rounding, so results match the CPU backend closely
    DCP_CHECK(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
    Backend b;
    memset(&b, 0, sizeof b);
    b.name = "cuda";
    b.runs_on = GPU_RUNS_ON;
    b.host_memory = 0;
    b.alloc = cuda_alloc;
    b.release = cuda_release;
    b.upload = cuda_upload;
    b.download = cuda_download;
    b.copy = cuda_copy;
    b.host_alloc = cuda_host_alloc;
    b.host_release = cuda_host_release;
    b.weights = cuda_weights;
    b.gemm_weights = cuda_gemm_weights;
    b.release_weights = cuda_release_weights;
    b.set_gemm_dtype = cuda_set_gemm_dtype;
    b.synchronize = cuda_synchronize;
    b.matmul = cuda_matmul;
    b.rmsnorm = cuda_rmsnorm;
    b.rope = cuda_rope;
    b.silu_mul = cuda_silu_mul;
    b.add = cuda_add;
    b.add_bias = cuda_add_bias;
    b.embedding = cuda_embedding;
    b.gather_rows = cuda_gather_rows;
    b.kv_write = cuda_kv_write;
    b.kv_dtypes = 1u << DTYPE_F32 | 1u << DTYPE_BF16 | 1u << DTYPE_F8_E4M3;
    b.round_kv = cuda_round_kv;
    b.strided_copy = cuda_strided_copy;
    b.matmul_batched = cuda_matmul_batched;
    b.moe_route = cuda_moe_route;
    b.moe_matmul = cuda_moe_matmul;
    b.moe_combine = cuda_moe_combine;
    b.counts = &counts;
    b.attention = cuda_attention;
    b.merge_partials = cuda_merge_partials;
    b.pack_partials = cuda_pack_partials;
    cuda_table = b;
    ready = 1;
    return &cuda_table;
}
