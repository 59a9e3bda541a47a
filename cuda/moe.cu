// Mixture of experts on the device: routing, grouping by expert, the
// experts' grouped GEMM and the combine (backend_cuda.cuh).
#include "backend_cuda.cuh"

// ---- mixture of experts, on the device ----------------------------------

#define MOE_MAX_EXPERTS 512
#define MOE_MAX_GROUPS 64

// One block per token: its experts and weights, as moe_route_token chooses
// them, by the same steps (moe_route.h): the scores expert by expert over
// the threads, the softmax's maximum and sum on one thread, each group's
// score on its own thread, the kept groups on one, and the K choices as K
// rounds of a block argmax (the larger score, the lower index at a tie:
// the sequential scan's first maximum). Logits are finite (a NaN would be
// ordered differently from the host's scan).
#define ROUTE_THREADS 256
struct RouteBest {
    float v;
    int i; // -1: none
};
__device__ static inline RouteBest route_better(RouteBest a, RouteBest b)
{
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a;
}
__global__ void k_moe_route_tokens(int experts, int per_token, int groups, int topk_group, int flags, float scaling,
                                   const float *logits, const float *bias, int *idx, float *wt)
{
    __shared__ float score[MOE_MAX_EXPERTS], choice[MOE_MAX_EXPERTS], gscore[MOE_MAX_GROUPS], red_v[ROUTE_THREADS],
        misc[2];
    __shared__ int keep[MOE_MAX_GROUPS], red_i[ROUTE_THREADS];
    __shared__ char taken[MOE_MAX_EXPERTS];
    int E = experts, G = groups, per = E / G, K = per_token, v3 = flags & 1, grouped = flags >> 1 & 1,
        norm = flags >> 2 & 1, tid = threadIdx.x;
    size_t t = blockIdx.x;
    const float *lg = logits + t * E;
    int *ti = idx + t * K;
    float *tw = wt + t * K;
    for (int x = tid; x < E; x += blockDim.x) taken[x] = 0;
    for (int g = tid; g < G; g += blockDim.x) keep[g] = 0;
    if (v3) {
        for (int x = tid; x < E; x += blockDim.x) moe_v3_score(lg, bias, x, score, choice);
    } else {
        if (tid == 0) misc[0] = moe_max(lg, E);
        __syncthreads();
        for (int x = tid; x < E; x += blockDim.x) score[x] = DCP_ROUTE_EXP(lg[x] - misc[0]);
        __syncthreads();
        if (tid == 0) misc[1] = moe_sum(score, E);
        __syncthreads();
        for (int x = tid; x < E; x += blockDim.x) choice[x] = score[x] /= misc[1];
    }
    __syncthreads();
    if (grouped) {
        for (int g = tid; g < G; g += blockDim.x) gscore[g] = moe_group_score(choice, g, per, v3);
        __syncthreads();
        if (tid == 0) moe_keep_groups(gscore, G, topk_group, keep);
        __syncthreads();
        for (int x = tid; x < E; x += blockDim.x) choice[x] = moe_masked(choice, keep, x, per, v3);
        __syncthreads();
    }
    for (int n = 0; n < K; n++) {
        RouteBest b = {0.0f, -1};
        for (int x = tid; x < E; x += blockDim.x)
            if (!taken[x] && (b.i < 0 || choice[x] > b.v)) b.v = choice[x], b.i = x;
        red_v[tid] = b.v, red_i[tid] = b.i;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w /= 2) {
            if (tid < w) {
                RouteBest m = route_better({red_v[tid], red_i[tid]}, {red_v[tid + w], red_i[tid + w]});
                red_v[tid] = m.v, red_i[tid] = m.i;
            }
            __syncthreads();
        }
        if (tid == 0) {
            int best = red_i[0];
            taken[best] = 1;
            ti[n] = best;
            tw[n] = v3 ? score[best] : choice[best];
        }
        __syncthreads();
    }
    if (tid == 0) moe_finish_weights(tw, K, norm, scaling);
}
DCP_STATIC_SHARED(k_moe_route_tokens, (2 * sizeof(float) + 1) * MOE_MAX_EXPERTS +
                                          (sizeof(float) + sizeof(int)) * (MOE_MAX_GROUPS + ROUTE_THREADS) +
                                          2 * sizeof(float));

// The step's T * K pairs grouped by expert, as moe_group_pairs groups
// them (tokens in order within an expert; token t's slots in expert
// order), by one block: a histogram (each thread counts the pairs of the
// experts it owns), an exclusive scan of the counts in shared memory
// (Hillis-Steele, log2 E rounds), and each owner placing its pairs in
// token order. No atomics: every offset is a count, the same every run.
#define GROUP_THREADS 512
static_assert(GROUP_THREADS >= MOE_MAX_EXPERTS, "k_moe_group: a thread per expert");
__global__ void k_moe_group(const int *idx, const float *wt, int T, int K, int E, int *rows, float *weights,
                            int *slots, int *start)
{
    __shared__ int scan[2][GROUP_THREADS];
    int e = threadIdx.x, P = T * K, c = 0;
    if (e < E)
        for (int i = 0; i < P; i++) c += idx[i] == e;
    scan[0][e] = c;
    __syncthreads();
    int from = 0;
    for (int w = 1; w < GROUP_THREADS; w *= 2) { // inclusive prefix sums
        scan[!from][e] = scan[from][e] + (e >= w ? scan[from][e - w] : 0);
        from = !from;
        __syncthreads();
    }
    int at = scan[from][e] - c; // exclusive: the pairs of the experts before e
    if (MUTANT(7) && e > 0) at = e >= 2 ? scan[from][e - 2] : 0; // the scan read one expert back
    if (e < E) start[e] = at;
    if (e == E - 1) start[E] = at + c;
    if (e >= E) return;
    for (int t = 0; t < T && c; t++)
        for (int n = 0; n < K; n++) {
            const int *ti = idx + (size_t)t * K;
            if (ti[n] != e) continue;
            int rank = 0; // token t's experts below e: this pair's place among its slots
            for (int m = 0; m < K; m++) rank += ti[m] < e;
            rows[at] = t;
            weights[at] = wt[(size_t)t * K + n];
            slots[(size_t)t * K + rank] = at;
            at++, c--;
        }
}
DCP_STATIC_SHARED(k_moe_group, sizeof(int) * 2 * GROUP_THREADS);

static int *d_moe_idx;
static float *d_moe_wt;
static size_t moe_cap;

void cuda_moe_route(const MoeRouting *r, const float *logits, const float *bias, int T, int *rows,
                    float *weights, int *slots, int *start)
{
    if (r->experts > MOE_MAX_EXPERTS || r->groups > MOE_MAX_GROUPS)
        dcp_check_failed(__FILE__, __LINE__, "cuda_moe_route", "more than 512 experts or 64 expert groups");
    size_t pairs = (size_t)T * r->per_token;
    if (pairs > moe_cap) {
        if (moe_cap) cuda_release(d_moe_idx), cuda_release(d_moe_wt);
        moe_cap = 2 * pairs;
        d_moe_idx = (int *)cuda_alloc(sizeof(int) * moe_cap);
        d_moe_wt = (float *)cuda_alloc(sizeof(float) * moe_cap);
    }
    if (T)
        DCP_LAUNCH(k_moe_route_tokens, T, ROUTE_THREADS, 0, stream, r->experts, r->per_token, r->groups,
                   r->topk_group, r->v3 | r->grouped << 1 | r->norm_topk << 2, r->scaling, logits, bias, d_moe_idx,
                   d_moe_wt);
    DCP_CHECK_LAUNCH(stream);
    DCP_LAUNCH(k_moe_group, 1, GROUP_THREADS, 0, stream, d_moe_idx, d_moe_wt, T, r->per_token, r->experts, rows,
               weights, slots, start);
    DCP_CHECK_LAUNCH(stream);
}

// The experts' grouped GEMM (backend.h, moe_matmul), in the GEMM's
// arithmetic (backend_cuda.cuh): a thread computes weight row n of the
// experts of MM_T consecutive pair rows, the rows of one expert at a time
// (a tile may hold the last pairs of one expert and the first of the
// next); block x is a tile of pair rows, its experts found by binary
// search of start[], so the grid is the pairs' tiles, never the experts;
// block z is the K chunk (the down projection's chunks in one launch).
#define MM_T 4
#define MM_THREADS 128
template <typename W>
__global__ void k_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int experts,
                             int pairs, const W *w, QS_PARAMS, size_t w_step, int in, int out)
{
    WeightRef qs = qs_ref(scale, scale8, tables, table_runs, run0, qcols, qflags);
    int n = blockIdx.y * blockDim.x + threadIdx.x, r0 = blockIdx.x * MM_T, r1 = min(pairs, r0 + MM_T),
        whole = in - in % GM_LANES, c = blockIdx.z;
    if (n >= out) return;
    y += (size_t)c * pairs * out, x += (size_t)c * in;
    const float *xr[MM_T];
#pragma unroll
    for (int t = 0; t < MM_T; t++) xr[t] = r0 + t < r1 ? x + (size_t)(rows ? rows[r0 + t] : r0 + t) * ldx : x;
    for (int s0 = r0; s0 < r1;) { // the rows s0 .. s1 - 1 of expert e
        int e = expert_of(start, experts, s0), s1 = max(s0 + 1, min(r1, start[e + 1])); // progress even on a bad start[]
        size_t row = (size_t)e * w_step + ((size_t)c * out + n) * in;
        float acc[MM_T][GM_LANES];
#pragma unroll
        for (int t = 0; t < MM_T; t++)
#pragma unroll
            for (int l = 0; l < GM_LANES; l++) acc[t][l] = 0.0f;
        for (int k = 0; k < whole; k += GM_LANES) {
            float v[GM_LANES];
            w_load16(v, w, qs, row + k);
#pragma unroll
            for (int t = 0; t < MM_T; t++)
                if (r0 + t >= s0 && r0 + t < s1)
#pragma unroll
                    for (int l = 0; l < GM_LANES; l++) acc[t][l] = fmaf(xr[t][k + l], v[l], acc[t][l]);
        }
#pragma unroll
        for (int t = 0; t < MM_T; t++)
            if (r0 + t >= s0 && r0 + t < s1) {
                float sum = lane_tree(acc[t]);
                for (int k = whole; k < in; k++) sum = fmaf(xr[t][k], w_load(w, qs, row + k), sum);
                y[(size_t)(r0 + t) * out + n] = sum;
            }
        s0 = s1;
    }
}

void cuda_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int experts,
                     int pairs, WeightRef w, size_t w_step, int in, int out, int chunks)
{
    if (!pairs || !out || !chunks) return;
    counts.moe_matmuls++;
    dim3 grid(blocks_for((size_t)pairs, MM_T), blocks_for((size_t)out, MM_THREADS), chunks);
#define MM_LAUNCH(W)                                                                                                  \
    DCP_LAUNCH(k_moe_matmul<W>, grid, MM_THREADS, 0, stream, y, x, ldx, rows, start, experts, pairs,                 \
               (const W *)w.data, QS_ARGS(w), w_step, in, out)
    switch (w.dtype) {
    case DTYPE_F32: MM_LAUNCH(float); break;
    case DTYPE_BF16: MM_LAUNCH(__nv_bfloat16); break;
    case DTYPE_F8_E4M3: MM_LAUNCH(uint8_t); break;
    case DTYPE_I4: MM_LAUNCH(Int4); break;
    case DTYPE_FP4: MM_LAUNCH(Fp4); break;
    default: dcp_check_failed(__FILE__, __LINE__, "cuda_moe_matmul", "a weight format without a kernel");
    }
#undef MM_LAUNCH
    DCP_CHECK_LAUNCH(stream);
}

// y row t = 0 + w * src row + ... over its pairs in expert order, each
// product and sum rounded on its own, as the CPU adds them; block (t, c):
// token t of chunk c
__global__ void k_moe_combine(float *y, const float *src, const int *slots, const float *weights, int T, int K,
                              int dim)
{
    const int *s = slots + (size_t)blockIdx.x * K;
    size_t c = blockIdx.y;
    y += (c * T + blockIdx.x) * dim, src += c * T * K * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int n = 0; n < K; n++) acc = __fadd_rn(acc, __fmul_rn(weights[s[n]], src[(size_t)s[n] * dim + d]));
        y[d] = acc;
    }
}

void cuda_moe_combine(float *y, const float *src, const int *slots, const float *weights, int T, int K, int dim,
                      int chunks)
{
    if (T && chunks) DCP_LAUNCH(k_moe_combine, dim3(T, chunks), 128, 0, stream, y, src, slots, weights, T, K, dim);
    DCP_CHECK_LAUNCH(stream);
}

