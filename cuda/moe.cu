// Mixture of experts on the device: routing, grouping by expert, the
// experts' grouped GEMM and the combine (backend_cuda.cuh).
#include "backend_cuda.cuh"

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

void cuda_moe_route(const MoeRouting *r, const float *logits, const float *bias, int T, int *rows,
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

void cuda_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int experts,
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

void cuda_moe_combine(float *y, const float *src, const int *slots, const float *weights, int T, int K, int dim)
{
    if (T) DCP_LAUNCH(k_moe_combine, T, 128, 0, stream, y, src, slots, weights, K, dim);
    DCP_CHECK_LAUNCH(stream);
}

