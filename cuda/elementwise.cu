// The element-wise and row ops: norms, RoPE, SwiGLU, adds, gathers, the KV
// cache's writes and copies (backend_cuda.cuh).
#include "backend_cuda.cuh"

// ---- element-wise kernels ---------------------------------------------

__global__ void k_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int dim, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * ldx;
    float *yr = y + (size_t)blockIdx.x * ldy;
    __shared__ float part[256];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    float inv = 1.0f / sqrtf(part[0] / dim + eps); // IEEE-rounded, where rsqrtf is not
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (inv * xr[i]);
}

DCP_STATIC_SHARED(k_rmsnorm, sizeof(float) * 256);

void cuda_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int T, int dim, float eps)
{
    if (T) DCP_LAUNCH(k_rmsnorm, T, MUTANT(4) ? 2048 : 256, 0, stream, y, ldy, x, ldx, w, dim, eps);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_rope(float *y, int ldy, const float *x, int ldx, const int *pos, int T, int heads, int head_dim,
                       const float *inv_freq, float scale, int adjacent)
{
    int half = head_dim / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * heads * half) return;
    int i = (int)(idx % half), h = (int)((idx / half) % heads), t = (int)(idx / half / heads);
    float angle = pos[t] * inv_freq[i], c, s;
    dcp_sincosf(angle, &s, &c);
    c *= scale, s *= scale;
    size_t row = (size_t)t * heads + h;
    const float *v = x + row * ldx;
    float *u = y + row * ldy;
    int a = adjacent ? 2 * i : i, b = adjacent ? 2 * i + 1 : i + half;
    float v0 = v[a], v1 = v[b];
    u[a] = v0 * c - v1 * s;
    u[b] = v0 * s + v1 * c;
}

void cuda_rope(float *y, int ldy, const float *x, int ldx, const int *pos, int T, int n_heads, int head_dim,
               const float *inv_freq, float scale, RopeStyle style)
{
    size_t n = (size_t)T * n_heads * (head_dim / 2);
    if (n)
        DCP_LAUNCH(k_rope, blocks_for(n, 256), 256, 0, stream, y, ldy, x, ldx, pos, T, n_heads, head_dim, inv_freq,
                   scale, style == ROPE_ADJACENT_PAIRS);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_silu_mul(float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        g[i] = v / (1.0f + dcp_expf(-v)) * u[i];
    }
}

void cuda_silu_mul(float *gate, const float *up, size_t n)
{
    if (n) DCP_LAUNCH(k_silu_mul, blocks_for(n, 256), 256, 0, stream, gate, up, n);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_add_bias(float *y, const float *b, int T, int n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)T * n) y[i] += b[i % n];
}

void cuda_add_bias(float *y, const float *b, int T, int n)
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

void cuda_add(float *y, const float *x, size_t n)
{
    if (n) DCP_LAUNCH(k_add, blocks_for(n, 256), 256, 0, stream, y, x, n);
    DCP_CHECK_LAUNCH(stream);
}

// parts x n floats of y added into the first n by the canonical sum tree,
// in one launch: thread i walks the tree's steps for element i, each a
// read-modify-write of its own element of two parts (no thread reads
// another's), the additions of cuda_add's one by one
__global__ void k_sum_parts(float *y, int parts, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    for (int s = 0; s < parts - 1; s++) {
        TreeStep st = tree_sum_step(parts, s);
        y[st.into * n + i] += y[st.from * n + i];
    }
}

void cuda_sum_parts(float *y, int parts, size_t n)
{
    if (n && parts > 1) DCP_LAUNCH(k_sum_parts, blocks_for(n, 256), 256, 0, stream, y, parts, n);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_scale(float *x, size_t n, float s, int divide)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = divide ? x[i] / s : x[i] * s;
}

void cuda_scale(float *x, size_t n, float s, int divide)
{
    if (n) DCP_LAUNCH(k_scale, blocks_for(n, 256), 256, 0, stream, x, n, s, divide);
    DCP_CHECK_LAUNCH(stream);
}

// dst row r = src row rows[r] (embedding: src = table, rows = tokens)
__global__ void k_gather_rows(float *dst, const float *src, const int *rows, int dim)
{
    const float *s = src + (size_t)rows[blockIdx.x] * dim;
    float *d = dst + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) d[i] = s[i];
}

void cuda_gather_rows(float *dst, const float *src, const int *rows, int R, int dim)
{
    if (R) DCP_LAUNCH(k_gather_rows, R, 128, 0, stream, dst, src, rows, dim);
    DCP_CHECK_LAUNCH(stream);
}

// x row t = table row tokens[t] - row0 widened to fp32, zeros outside the
// table's rows (backend.h)
template <typename W>
__global__ void k_embedding(float *x, const W *table, int group, int row0, int rows, const int *tokens, int dim)
{
    const WeightRef plain{}; // fp32 and bf16 elements need no scale
    float *y = x + (size_t)blockIdx.x * dim;
    int r = tokens[blockIdx.x] - row0;
    if (r < 0 || r >= rows) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) y[i] = 0.0f;
        return;
    }
    size_t at = weight_row_start(group, r, rows, dim), step = weight_row_step(group, r, rows);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) y[i] = w_load(table, plain, at + (size_t)(i / 16) * step + i % 16);
}

void cuda_embedding(float *x, WeightRef table, int row0, int rows, const int *tokens, int T, int dim)
{
    if (T && table.dtype == DTYPE_BF16)
        DCP_LAUNCH(k_embedding<__nv_bfloat16>, T, 128, 0, stream, x, (const __nv_bfloat16 *)table.data, table.group, row0, rows, tokens, dim);
    else if (T)
        DCP_LAUNCH(k_embedding<float>, T, 128, 0, stream, x, (const float *)table.data, table.group, row0, rows, tokens, dim);
    DCP_CHECK_LAUNCH(stream);
}

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

void cuda_kv_write(void *k_pool, void *v_pool, DType kv_dtype, const float *k, const float *v, const int *slots,
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

void cuda_round_kv(float *x, size_t n, DType t)
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

void cuda_strided_copy(float *dst, int dst_stride, const float *src, int src_stride, int rows, int width)
{
    if (rows) DCP_LAUNCH(k_strided_copy, rows, 128, 0, stream, dst, dst_stride, src, src_stride, width);
    DCP_CHECK_LAUNCH(stream);
}

