// Attention over the paged KV cache (GQA and MLA's latent rows), key
// shards merged by the canonical tree, and the DCP partials' packing
// (backend_cuda.cuh).
#include "backend_cuda.cuh"

// Per-token attention metadata uploaded here for a caller that has no
// device copies of it (AttnBatch.d_*).
static const int **d_tables;
static int *d_nkeys, *d_key0, *d_row0;
static int meta_cap;

// ---- attention --------------------------------------------------------

#define ATT_THREADS 128
#define ATT_MAX_D 640 // MLA: kv_lora_rank 512 + qk_rope_head_dim 64
static_assert(ATT_MAX_D % 128 == 0, "k_attention: whole column steps");

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

// ---- split-KV -----------------------------------------------------------
//
// A key shard's keys (a token's keys in that shard, from its first, key0)
// are attended in splits of ATT_SPLIT consecutive keys, each split alone
// (the kernel's tiles from the split's first key), and the splits'
// partials are folded in order (split 0 with 1, that with 2, ...) by the
// merge's arithmetic (merge_w, merge_v). A block may fold its row's splits
// as it goes (fold), or attend one split and leave the fold to
// k_merge_shards (split mode, a block per split: the grid grows with the
// keys, not with the shards); both compute the same values in the same
// order, so cuda_attention picks by the partials' memory and the bits
// stay a function of the shard's keys alone: of no layout and no batch.
#define ATT_SPLIT 512

// The merge of a partial x (LSE l1) with a partial y (LSE l2), as
// merge_partials does it (docs/design.md): x' = (x s1 + y s2) * (1 / (s1 +
// s2)), each operation rounded on its own (no FMA contraction, so that
// merging y into x and x into y give the same bits); a side at -inf
// leaves the other as it is.
struct MergeW {
    float s1, s2, inv, lse;
    int mode; // 0: x as it is, 1: y, 2: both weighed
};
__device__ static inline MergeW merge_w(float l1, float l2)
{
    MergeW w = {0.0f, 0.0f, 0.0f, l1, 0};
    if (l2 == -INFINITY) return w;
    if (l1 == -INFINITY) {
        w.mode = 1, w.lse = l2;
        return w;
    }
    float m = fmaxf(l1, l2);
    w.s1 = dcp_expf(l1 - m), w.s2 = dcp_expf(l2 - m), w.inv = __frcp_rn(__fadd_rn(w.s1, w.s2));
    w.lse = m + dcp_logf(__fadd_rn(w.s1, w.s2)), w.mode = 2;
    return w;
}
__device__ static inline float merge_v(const MergeW &w, float x, float y)
{
    return w.mode == 0 ? x : w.mode == 1 ? y : __fmul_rn(__fadd_rn(__fmul_rn(x, w.s1), __fmul_rn(y, w.s2)), w.inv);
}

// Block (r, g, z): row r (token t, head h) over key shard g of G: split z
// of the shard (split mode), or every split folded (fold, grid z 1). Its
// output row goes to out + ((z * G + g) * rows + r) * out_stride, its LSE
// to lse + ((z * G + g) * rows + r) * lse_stride.
template <typename KV>
__global__ void k_attention(float *out, size_t out_stride, float *lse, size_t lse_stride, const float *q,
                            const KV *k_base, const KV *v_base, const int *row0, const int *n_keys,
                            const int *key0, const int *const *tables, int block_size, int n_heads, int group,
                            int head_dim, int v_dim, int kv_stride, float scale, int G, int run, int fold)
{
    int r = blockIdx.x, g = blockIdx.y, rows = gridDim.x, t = r / n_heads, h = r % n_heads, kvh = h / group,
        kv_heads = n_heads / group;
    int n = shard_keys(n_keys[t], G, run, g), first = key0 ? shard_keys(key0[t], G, run, g) : 0, tid = threadIdx.x;
    int s0 = fold ? 0 : blockIdx.z, s1 = fold ? max(1, (n - first + ATT_SPLIT - 1) / ATT_SPLIT) : s0 + 1;
    size_t at = ((size_t)blockIdx.z * G + g) * rows + r;
    float *o = out + at * out_stride;
    const float *qr = q + (size_t)r * head_dim;
    const int *table = tables ? tables[t] : NULL;
    size_t base = !table && row0 ? (size_t)row0[t] * kv_stride : 0;
    const KV *k = k_base + base, *v = v_base + base;
    __shared__ float qs[ATT_MAX_D], p[ATT_THREADS], red[ATT_THREADS];
    for (int d = tid; d < head_dim; d += blockDim.x) qs[d] = qr[d];
    __syncthreads();
    float fl = -INFINITY; // the fold's LSE so far (the same on every thread)
    for (int sp = s0; sp < s1; sp++) {
        int lo = first + sp * ATT_SPLIT, hi = min(n, lo + ATT_SPLIT);
        float m = -INFINITY, sum = 0.0f, acc[ATT_MAX_D / ATT_THREADS] = {0};
        for (int j0 = lo; j0 < hi; j0 += ATT_THREADS) {
            int j = j0 + tid;
            float s = -INFINITY;
            if (j < hi) {
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
            float e = j < hi ? dcp_expf(s - m_new) : 0.0f;
            p[tid] = e;
            red[tid] = e;
            __syncthreads();
            for (int w = ATT_THREADS / 2; w > 0; w >>= 1) {
                if (tid < w) red[tid] += red[tid + w];
                if (!MUTANT(3)) __syncthreads();
            }
            float correction = dcp_expf(m - m_new);
            sum = sum * correction + red[0];
            int tile = min(ATT_THREADS, hi - j0);
#pragma unroll // a fixed count, so that acc stays in registers
            for (int c = 0; c < ATT_MAX_D / ATT_THREADS; c++) {
                int d = c * ATT_THREADS + tid;
                if (d >= v_dim) continue;
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
        // the split's partial, folded into the row (each thread its columns)
        float ls = hi > lo ? m + dcp_logf(sum) : -INFINITY;
        MergeW w = merge_w(fl, ls);
#pragma unroll
        for (int c = 0; c < ATT_MAX_D / ATT_THREADS; c++) {
            int d = c * ATT_THREADS + tid;
            if (d >= v_dim) continue;
            float val = hi > lo ? acc[c] / sum : 0.0f;
            o[d] = sp == s0 ? val : merge_v(w, o[d], val);
        }
        fl = sp == s0 ? ls : w.lse;
    }
    if (tid == 0) lse[at * lse_stride] = fl;
}

DCP_STATIC_SHARED(k_attention<float>, sizeof(float) * (ATT_MAX_D + 2 * ATT_THREADS));
DCP_STATIC_SHARED(k_attention<__nv_bfloat16>, sizeof(float) * (ATT_MAX_D + 2 * ATT_THREADS));
DCP_STATIC_SHARED(k_attention<uint8_t>, sizeof(float) * (ATT_MAX_D + 2 * ATT_THREADS));

// Attention of a group of query heads that share their keys: MLA's latent
// rows (one KV head, the values the first v_dim floats of the key rows;
// SEPV false) or a GQA group's KV head (keys and values rows of their own;
// SEPV true), paged or contiguous, as FlashMLA shapes it: a block serves
// up to LAT_HEADS heads of one token that read one KV head, so that each
// key and value row is read once for all of them instead of once per
// head. Keys come in tiles of LAT_KEYS rows through shared memory, loaded
// row by row by consecutive threads (coalesced); every (head, key) score
// of a tile is two threads' half dot products; the heads' online softmax
// states live in shared memory, and each thread accumulates the value
// columns d = tid + c * ATT_THREADS of every head. Rows of up to MAXD
// values. Splits as k_attention's: block (x, g, z) is split z of shard g,
// or every split of it folded (fold); x is (token, KV head, chunk of
// LAT_HEADS of the group's heads).
#define LAT_HEADS 16
#define LAT_KEYS 4
#define LAT_MAX_D 576 // MLA: kv_lora_rank 512 + qk_rope_head_dim 64
#define GQA_MAX_D 256 // GQA: head_dim up to 256
static_assert(ATT_THREADS == 2 * LAT_HEADS * LAT_KEYS, "k_group_attention: two threads per (head, key) score");
// the two kinds of rows, each over a cache of T's type
template <typename T> struct LatentRows {
    using KV = T;
    static constexpr int MAXD = LAT_MAX_D;
    static constexpr bool SEPV = false;
};
template <typename T> struct GqaRows {
    using KV = T;
    static constexpr int MAXD = GQA_MAX_D;
    static constexpr bool SEPV = true;
};
template <typename R>
__global__ void k_group_attention(float *out, size_t out_stride, float *lse, size_t lse_stride, const float *q,
                                  const typename R::KV *k_base, const typename R::KV *v_base, const int *row0,
                                  const int *n_keys, const int *key0, const int *const *tables, int block_size,
                                  int n_heads, int group, int head_dim, int v_dim, int kv_stride, float scale, int G,
                                  int run, int fold)
{
    constexpr int MAXD = R::MAXD;
    constexpr bool SEPV = R::SEPV;
    constexpr int ROW = MAXD + 1; // a row's floats in shared memory, padded so that rows start in different banks
    constexpr int COLS = (MAXD + ATT_THREADS - 1) / ATT_THREADS;
    // a tile's key rows, then (SEPV) its value rows; else the values are the keys
    __shared__ float qs[LAT_HEADS][ROW], kvs[SEPV ? 2 * LAT_KEYS : LAT_KEYS][ROW], sc[LAT_HEADS][LAT_KEYS],
        red[ATT_THREADS], m[LAT_HEADS], l[LAT_HEADS], corr[LAT_HEADS], fl[LAT_HEADS];
    float(*ks)[ROW] = kvs, (*vs)[ROW] = SEPV ? kvs + LAT_KEYS : kvs;
    int kv_heads = n_heads / group, chunks = (group + LAT_HEADS - 1) / LAT_HEADS, per_token = kv_heads * chunks;
    int t = blockIdx.x / per_token, kvh = blockIdx.x % per_token / chunks,
        h0 = kvh * group + blockIdx.x % chunks * LAT_HEADS,
        nh = min(LAT_HEADS, (kvh + 1) * group - h0), g = blockIdx.y, tid = threadIdx.x;
    int rows = gridDim.x / per_token * n_heads;
    int n = shard_keys(n_keys[t], G, run, g), first = key0 ? shard_keys(key0[t], G, run, g) : 0;
    int s0 = fold ? 0 : blockIdx.z, s1 = fold ? max(1, (n - first + ATT_SPLIT - 1) / ATT_SPLIT) : s0 + 1;
    size_t at0 = ((size_t)blockIdx.z * G + g) * rows + (size_t)t * n_heads + h0; // the block's first head's row
    int width = MUTANT(2) ? v_dim - 1 : v_dim;
    const int *table = tables ? tables[t] : NULL;
    size_t base = !table && row0 ? (size_t)row0[t] * kv_stride : 0; // contiguous rows from the token's first
    k_base += base, v_base += base;
    for (int i = tid; i < nh * head_dim; i += blockDim.x)
        qs[i / head_dim][i % head_dim] = q[((size_t)t * n_heads + h0) * head_dim + i];
    int pair = tid % (LAT_HEADS * LAT_KEYS), hh = pair / LAT_KEYS, jj = pair % LAT_KEYS,
        half = tid / (LAT_HEADS * LAT_KEYS), mid = head_dim / 2;
    for (int sp = s0; sp < s1; sp++) {
        int lo = first + sp * ATT_SPLIT, hi = min(n, lo + ATT_SPLIT);
        if (tid < LAT_HEADS) m[tid] = -INFINITY, l[tid] = 0.0f;
        __syncthreads();
        float acc[LAT_HEADS][COLS] = {{0}};
        for (int j0 = lo; j0 < hi; j0 += LAT_KEYS) {
            int kt = min(LAT_KEYS, hi - j0);
            for (int i = tid; i < kt * head_dim; i += blockDim.x) {
                int jk = j0 + i / head_dim, key = (jk / run) * G * run + g * run + jk % run; // shard g's key jk
                size_t at = att_row(table, key, block_size, kv_heads, kvh, kv_stride) + i % head_dim;
                ks[i / head_dim][i % head_dim] = kv_load(k_base + at);
                if (SEPV) vs[i / head_dim][i % head_dim] = kv_load(v_base + at);
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
                for (int j = 0; j < LAT_KEYS; j++) sum += sc[tid][j] = j < kt ? dcp_expf(sc[tid][j] - mt) : 0.0f;
                corr[tid] = dcp_expf(m[tid] - mt);
                l[tid] = l[tid] * corr[tid] + sum;
                m[tid] = mt;
            }
            __syncthreads();
#pragma unroll
            for (int h = 0; h < LAT_HEADS; h++)
#pragma unroll
                for (int c = 0; c < COLS; c++) {
                    int d = c * ATT_THREADS + tid;
                    if (h >= nh || d >= v_dim) continue;
                    float a = acc[h][c] * corr[h];
                    for (int j = 0; j < kt; j++) a += sc[h][j] * vs[j][d];
                    acc[h][c] = a;
                }
            __syncthreads();
        }
        // the split's partials, folded into the heads' rows (each thread its
        // columns); every thread reads the fold's LSEs before they move on
#pragma unroll
        for (int h = 0; h < LAT_HEADS; h++) {
            if (h >= nh) continue;
            float ls = hi > lo ? m[h] + dcp_logf(l[h]) : -INFINITY;
            MergeW w = merge_w(fl[h], ls);
            float *o = out + (at0 + h) * out_stride;
#pragma unroll
            for (int c = 0; c < COLS; c++) {
                int d = c * ATT_THREADS + tid;
                if (d >= width) continue;
                float val = hi > lo ? acc[h][c] / l[h] : 0.0f;
                o[d] = sp == s0 ? val : merge_v(w, o[d], val);
            }
        }
        if (!MUTANT(8)) __syncthreads();
        if (tid < nh) {
            float ls = hi > lo ? m[tid] + dcp_logf(l[tid]) : -INFINITY;
            fl[tid] = sp == s0 ? ls : merge_w(fl[tid], ls).lse;
        }
    }
    __syncthreads();
    if (tid < nh) lse[(at0 + tid) * lse_stride] = fl[tid];
}

#define GROUP_SHARED(MAXD, SEPV)                                                                                \
    (sizeof(float) * ((LAT_HEADS + (SEPV ? 2 : 1) * LAT_KEYS) * (MAXD + 1) + LAT_HEADS * LAT_KEYS + ATT_THREADS + \
                      4 * LAT_HEADS))
#define GROUP_KERNELS(KV)                                                                                      \
    DCP_STATIC_SHARED(k_group_attention<LatentRows<KV>>, GROUP_SHARED(LAT_MAX_D, false));                      \
    DCP_STATIC_SHARED(k_group_attention<GqaRows<KV>>, GROUP_SHARED(GQA_MAX_D, true))
GROUP_KERNELS(float);
GROUP_KERNELS(__nv_bfloat16);
GROUP_KERNELS(uint8_t);

// ---- LSE merges (docs/design.md, "Same bits at any layout") ------------

// a's row r becomes the merge of a's and b's (rows of stride floats: the
// outputs, then the LSE at head_dim). The arithmetic is kept from FMA
// contraction, so that merging b into a and a into b give the same bits.
__global__ void k_merge_partials(float *a, const float *b, int rows, int head_dim, int stride)
{
    int r = blockIdx.x * blockDim.y + threadIdx.y;
    float *x = a + (size_t)r * stride;
    const float *y = b + (size_t)r * stride;
    MergeW w = merge_w(r < rows ? x[head_dim] : 0.0f, r < rows ? y[head_dim] : -INFINITY);
    if (r < rows)
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) x[d] = merge_v(w, x[d], y[d]);
    // every thread of the row has read x[head_dim] before one writes it
    // (a block barrier: no kernel here relies on a warp's width)
    __syncthreads();
    if (r < rows && threadIdx.x == 0) x[head_dim] = w.lse;
}

// A block per row: the row's packed partials (outputs, then the LSE at
// head_dim) of `splits` splits of each of G key shards (split z of shard
// g: rows (z * G + g) * rows ... apart), each shard's splits folded in
// order into its split 0 (split-KV), then the shards merged by the
// canonical merge tree (tree.h), every step merge_w's arithmetic, into out
// (rows, head_dim) and lse (rows): one launch for every merge. The threads
// split the columns; the fold's LSE is a register (the same on every
// thread), the shards' LSEs sit in shared memory, updated by thread 0
// between two barriers per tree step.
#define MERGE_MAX_SHARDS 64
__global__ void k_merge_shards(float *parts, int splits, int G, int rows, int head_dim, float *out, float *lse)
{
    __shared__ float l[MERGE_MAX_SHARDS];
    int r = blockIdx.x, tid = threadIdx.x;
    size_t stride = (size_t)head_dim + 1, blk = (size_t)rows * stride;
    float *row = parts + (size_t)r * stride;
    for (int g = 0; g < G; g++) {
        float *x = row + g * blk, fl = x[head_dim];
        for (int z = 1; z < splits; z++) {
            const float *y = row + ((size_t)z * G + g) * blk;
            MergeW w = merge_w(fl, y[head_dim]);
            for (int d = tid; d < head_dim; d += blockDim.x) x[d] = merge_v(w, x[d], y[d]);
            fl = w.lse;
        }
        if (tid == 0) l[g] = fl;
    }
    __syncthreads();
    for (int s = 0; s < G - 1; s++) {
        TreeStep st = tree_merge_step(G, s);
        MergeW w = merge_w(l[st.into], l[st.from]);
        float *x = row + st.into * blk;
        const float *y = row + st.from * blk;
        for (int d = tid; d < head_dim; d += blockDim.x) x[d] = merge_v(w, x[d], y[d]);
        // every thread has read the step's LSEs before thread 0 writes one
        if (!MUTANT(6)) __syncthreads();
        if (tid == 0) l[st.into] = w.lse;
        __syncthreads();
    }
    for (int d = tid; d < head_dim; d += blockDim.x) out[(size_t)r * head_dim + d] = row[d];
    if (tid == 0) lse[r] = l[0];
}
DCP_STATIC_SHARED(k_merge_shards, sizeof(float) * MERGE_MAX_SHARDS);

void cuda_merge_partials(float *a, const float *b, int rows, int head_dim, int stride)
{
    dim3 threads(32, 8);
    if (rows) DCP_LAUNCH(k_merge_partials, blocks_for(rows, 8), threads, 0, stream, a, b, rows, head_dim, stride);
    DCP_CHECK_LAUNCH(stream);
}

// the shards' and splits' packed partials (cuda_attention): at least
// split_bytes() once used, so that split mode never grows it as keys come
static float *d_shard_parts;
static size_t shard_parts_cap;

// The partials' bytes split mode may hold (DCPINFER_CUDA_SPLIT_BYTES,
// default 64 MiB); a step whose splits need more folds them in the
// attention kernel. Read at every call: a test switches modes with it.
static size_t split_bytes(void)
{
    const char *e = getenv("DCPINFER_CUDA_SPLIT_BYTES");
    return e && *e ? (size_t)strtoull(e, NULL, 10) : (size_t)64 << 20;
}

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
                              int Dv, int G, int run, int splits, int fold)
{
    int group = a->n_heads / a->n_kv_heads;
    dim3 grid(a->T * a->n_kv_heads * ((group + LAT_HEADS - 1) / LAT_HEADS), G, splits);
    if (a->n_kv_heads == 1 && a->k == a->v && a->kv_stride == a->head_dim && a->head_dim <= LAT_MAX_D &&
        Dv <= a->head_dim) {
        DCP_LAUNCH(k_group_attention<LatentRows<KV>>, grid, ATT_THREADS, 0, stream, out, out_stride, lse,
                   lse_stride, a->q, (const KV *)a->k, (const KV *)a->k, row0, n_keys, key0, tables, a->block_size,
                   a->n_heads, group, a->head_dim, Dv, a->kv_stride, a->scale, G, run, fold);
    } else if (a->head_dim <= GQA_MAX_D && Dv <= a->head_dim) {
        DCP_LAUNCH(k_group_attention<GqaRows<KV>>, grid, ATT_THREADS, 0, stream, out, out_stride, lse,
                   lse_stride, a->q, (const KV *)a->k, (const KV *)a->v, row0, n_keys, key0, tables, a->block_size,
                   a->n_heads, group, a->head_dim, Dv, a->kv_stride, a->scale, G, run, fold);
    } else {
        DCP_LAUNCH(k_attention<KV>, dim3(rows, G, splits), ATT_THREADS, 0, stream, out, out_stride, lse, lse_stride,
                   a->q, (const KV *)a->k, (const KV *)a->v, row0, n_keys, key0, tables, a->block_size, a->n_heads,
                   a->n_heads / a->n_kv_heads, a->head_dim, Dv, a->kv_stride, a->scale, G, run, fold);
    }
}

void cuda_attention(const AttnBatch *a)
{
    if (!a->T) return;
    if (a->head_dim > ATT_MAX_D) dcp_check_failed(__FILE__, __LINE__, "cuda_attention", "head_dim above 640");
    const int *n_keys, *key0, *row0, *const *tables;
    attention_metadata(a, &n_keys, &key0, &row0, &tables);
    int G = a->shards > 1 ? a->shards : 1, run = a->shard_interleave > 0 ? a->shard_interleave : 1;
    int Dv = a->v_dim ? a->v_dim : a->head_dim, rows = a->T * a->n_heads;
    // the most splits any token has in any shard (the host's counts: no
    // wait for the device)
    int splits = 1;
    for (int t = 0; t < a->T; t++)
        for (int g = 0; g < G; g++) {
            int keys = shard_keys(a->n_keys[t], G, run, g) - (a->key0 ? shard_keys(a->key0[t], G, run, g) : 0);
            if (keys > splits * ATT_SPLIT) splits = (keys + ATT_SPLIT - 1) / ATT_SPLIT;
        }
    // split mode (a block per split, folded by k_merge_shards) where its
    // partials fit split_bytes(); else each block folds its splits
    size_t slot = (size_t)rows * (Dv + 1);
    int fold = splits > 1 && sizeof(float) * slot * G * splits > split_bytes();
    if (fold) splits = 1;
    float *out = a->out, *lse = a->lse;
    size_t out_stride = (size_t)Dv, lse_stride = 1;
    if (G > 1 || splits > 1) { // each split's and shard's rows packed (outputs, LSE), then merged
        size_t need = slot * G * splits;
        if (need > shard_parts_cap) {
            if (d_shard_parts) cuda_release(d_shard_parts);
            shard_parts_cap = need > split_bytes() / sizeof(float) ? need : split_bytes() / sizeof(float);
            d_shard_parts = (float *)cuda_alloc(sizeof(float) * shard_parts_cap);
        }
        out = d_shard_parts, lse = d_shard_parts + Dv;
        out_stride = lse_stride = (size_t)Dv + 1;
    }
    if (a->kv_dtype == DTYPE_F8_E4M3)
        attention_kernels<uint8_t>(a, out, out_stride, lse, lse_stride, row0, n_keys, key0, tables, rows, Dv, G, run,
                                   splits, fold);
    else if (a->kv_dtype == DTYPE_BF16)
        attention_kernels<__nv_bfloat16>(a, out, out_stride, lse, lse_stride, row0, n_keys, key0, tables, rows, Dv, G,
                                         run, splits, fold);
    else
        attention_kernels<float>(a, out, out_stride, lse, lse_stride, row0, n_keys, key0, tables, rows, Dv, G, run,
                                 splits, fold);
    DCP_CHECK_LAUNCH(stream);
    if (G == 1 && splits == 1) return;
    if (G > MERGE_MAX_SHARDS) dcp_check_failed(__FILE__, __LINE__, "cuda_attention", "more than 64 key shards");
    DCP_LAUNCH(k_merge_shards, rows, 128, 0, stream, d_shard_parts, splits, G, rows, Dv, a->out, a->lse);
    DCP_CHECK_LAUNCH(stream);
}

__global__ void k_pack_partials(float *parts, const float *o, const float *lse, int rows, int head_dim)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * (head_dim + 1)) return;
    size_t r = i / (head_dim + 1);
    int d = (int)(i % (head_dim + 1));
    parts[i] = d < head_dim ? o[r * head_dim + d] : lse[r];
}

void cuda_pack_partials(float *parts, const float *o, const float *lse, int rows, int head_dim)
{
    size_t n = (size_t)rows * (head_dim + 1);
    if (n) DCP_LAUNCH(k_pack_partials, blocks_for(n, 256), 256, 0, stream, parts, o, lse, rows, head_dim);
    DCP_CHECK_LAUNCH(stream);
}

