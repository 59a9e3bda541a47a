/* One table of operations per backend. The forward pass calls only these,
 * so a second backend (CUDA) replaces the table, not the model code.
 * Shapes are per rank: with tensor parallelism, heads and rows are shards. */
#ifndef DCP_BACKEND_H
#define DCP_BACKEND_H

#include <stddef.h>

#include "rope.h"
#include "weight.h"

/* Where row r's KV head h (hd elements) starts in a paged pool of kv_heads
 * heads and blocks of B rows: a block holds its rows KV head by KV head, so
 * that reading one head's keys of a block, as decode attention does for
 * each head, reads memory in order. */
#ifdef __CUDACC__
#define DCP_HOST_DEVICE __host__ __device__
#else
#define DCP_HOST_DEVICE
#endif
DCP_HOST_DEVICE static inline size_t kv_pool_offset(size_t r, int h, size_t hd, int kv_heads, size_t B)
{
    return ((r / B * (size_t)kv_heads + (size_t)h) * B + r % B) * hd;
}

/* The keys before key x in shard g of G canonical key shards of runs of
 * `run` keys (AttnBatch.shards): shard g's count of a token's keys */
DCP_HOST_DEVICE static inline int shard_keys(int x, int G, int run, int g)
{
    int base = (x / run / G) * run, rem = x - base * G - g * run;
    return base + (rem < 0 ? 0 : rem > run ? run : rem);
}

/* Attention of T query tokens, each over its own run of keys, returning the
 * output and the log-sum-exp of the scaled scores per (token, head). The
 * same op serves the context part (keys in the KV cache) and the new part
 * (keys of the tokens being processed, causal). A token with no keys gets
 * out = 0 and lse = -inf, so it contributes nothing to a merge. */
typedef struct {
    int T;
    int n_heads;    /* query heads in q/out */
    int n_kv_heads; /* query head h reads KV head h / (n_heads / n_kv_heads) */
    int head_dim;
    float scale;
    const float *q;           /* (T, n_heads, head_dim) */
    float *out;               /* (T, n_heads, v_dim, or head_dim when v_dim is 0) */
    float *lse;               /* (T, n_heads) */
    /* Keys and values: rows of kv_stride elements of kv_dtype. Unpaged, key j
     * of token t is row row0[t] + j of k (its value the same row of v). */
    const void *k, *v;
    const int *n_keys;        /* per token: rows to attend to */
    const int *key0;          /* per token: first key attended to (keys before it are outside a sliding
                                 window); NULL: 0 */
    int kv_stride;            /* elements from one key row to the next (n_kv_heads KV heads) */
    /* Paged keys: when blocks is set, k and v are a layer's pools and key j
     * of token t is row blocks[t][j / block_size] * block_size + j %
     * block_size, a pool that holds each block's rows KV head by KV head
     * (kv_pool_offset); row0 is then unused. */
    const int *const *blocks;   /* host array of pointers into backend memory */
    int block_size;
    int v_dim;                /* values: the first v_dim floats of each value row (MLA); 0: head_dim */
    DType kv_dtype;           /* of the key and value rows (bf16: a --kv-cache-dtype bfloat16 cache) */
    const int *row0;          /* per token: its first key's row, unpaged; NULL: 0 */
    /* The canonical key shards (docs/design.md, "Same bits at any
     * layout"): key j is in shard (j / shard_interleave) % shards; each
     * shard is attended alone and the shards' (out, lse) merged by the tree
     * that merges shard g with g + shards / 2 first, then with g +
     * shards / 4, ... (merge_partials' arithmetic); a count that is not a
     * power of two: that tree over the largest power of two below it, then
     * the rest into shard 0 in order. 0 or 1: one shard. */
    int shards, shard_interleave;
    /* n_keys, key0, row0 and blocks in backend memory, where the caller
     * uploaded them once for the step (attention.c); NULL: a backend that
     * needs them there uploads the host arrays itself */
    const int *d_n_keys, *d_key0, *d_row0;
    const int *const *d_blocks;
} AttnBatch;

/* How a mixture-of-experts router picks a token's experts (moe_route.h). */
typedef struct {
    int experts, per_token; /* routed experts, and how many each token takes */
    int groups, topk_group; /* expert groups, and how many of them a token may use */
    int v3;                 /* sigmoid scores, with a correction bias for the choice; else softmax */
    int grouped;            /* choose within the best groups (V3; V2's group_limited_greedy) */
    int norm_topk;          /* the chosen weights normalized to sum 1 (V3's norm_topk_prob) */
    float scaling;          /* routed_scaling_factor */
} MoeRouting;

/* What a device backend has done, for tests and the run's figures: calls
 * by kind. Transfers are the host round-trips a step pays; each run step's
 * share goes to HDF5 /gpu/steps (generate.c). */
typedef struct {
    long uploads, downloads, synchronizes; /* host <-> device copies, and waits for the device (a download waits) */
    long matmuls, batched_matmuls, moe_matmuls;
    long launches;        /* kernels queued on the device */
    long allocations;     /* device allocations (alloc, host_alloc) */
    long long d2h_bytes;  /* bytes the downloads moved */
} BackendCounts;

typedef struct Backend {
    const char *name;
    const char *runs_on; /* how the backend runs when that is not the obvious (HIP-CPU), for the header; or NULL */
    /* Memory. Buffers the ops read and write come from alloc: device memory
     * on a GPU backend, host memory on the CPU backend (host_memory = 1,
     * and MPI can take them directly). Arrays the ops take as metadata
     * (tokens, positions, slots, rows) live in such buffers too; the
     * per-token arrays of AttnBatch are host arrays (its block tables
     * pointers into buffers). */
    int host_memory;
    /* the device's total memory in bytes (NULL on the CPU, whose KV cache
     * is --kv-cache-memory): --gpu-memory-utilization's whole */
    size_t (*device_memory)(void);
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    /* page-locked host memory, for staging MPI transfers */
    void *(*host_alloc)(size_t bytes);
    void (*host_release)(void *p);
    /* the backend's copy of an fp32 weight array (the array itself on the
     * CPU); gemm_weights for the matrices matmul reads, as loaded (fp32 or
     * bf16) or converted to the type set_gemm_dtype chose (the CPU uses a
     * matrix of that type in place) */
    const float *(*weights)(const float *host, size_t n);
    WeightRef (*gemm_weights)(WeightRef host, size_t n);
    void (*release_weights)(const void *p);
    /* rows per group (WeightRef.group) of the layout matmul reads fastest
     * for matrices of type t, 0 for row after row; NULL: row after row only */
    int (*gemm_row_group)(DType t);
    /* "auto" (as loaded), "float32" or "bfloat16" storage of the GEMM
     * weights; returns -1 with dcp_error() when the backend has no such type */
    int (*set_gemm_dtype)(const char *dtype);
    /* waits for queued work (the GPU stream); a no-op on the CPU */
    void (*synchronize)(void);

    /* y (T, out) = x (T, in) . w (out, in)^T */
    void (*matmul)(float *y, const float *x, WeightRef w, int T, int in, int out);
    /* W4A4 NVFP4 activations (--nvfp4-activations emulate): T rows of x
     * (row rows[t], or t, ldx apart) as the NVFP4 matrix w reads them, each
     * group of 16 of the in columns quantized to FP4 and back
     * (nvfp4_act_group) with w's input global scale (weight_act_scale),
     * copied where it has none; w is a stack of experts w_step elements
     * apart, row t expert e's for start[e] <= t < start[e + 1] (start NULL:
     * one matrix, experts 1). Returns (T, in) in the backend's scratch,
     * valid until the next call. */
    const float *(*nvfp4_act)(const float *x, int ldx, const int *rows, const int *start, int experts, int T,
                              WeightRef w, size_t w_step, int in);
    /* y row t (dim) = x row t / rms(x row t) * w, rows ldy and ldx apart
     * (y == x: in place, ldy == ldx) */
    void (*rmsnorm)(float *y, int ldy, const float *x, int ldx, const float *w, int T, int dim, float eps);
    /* RoPE on the T * n_heads rows of head_dim values, row t * n_heads + h
     * (token t, head h) of x ldx apart, into y's rows ldy apart (y == x:
     * in place, ldy == ldx), for the positions pos (T): angle pos *
     * inv_freq[i] (head_dim/2 frequencies, a backend buffer), cos and sin
     * multiplied by scale (YaRN's attention factor, else 1) */
    void (*rope)(float *y, int ldy, const float *x, int ldx, const int *pos, int T, int n_heads, int head_dim,
                 const float *inv_freq, float scale, RopeStyle style);
    /* y (T, n) += b (n), per row */
    void (*add_bias)(float *y, const float *b, int T, int n);
    /* gate (n) = silu(gate) * up */
    void (*silu_mul)(float *gate, const float *up, size_t n);
    /* y (n) += x */
    void (*add)(float *y, const float *x, size_t n);
    /* parts x n floats from y, added into the first n by the canonical sum
     * tree (tree.h): tree_sum_step's additions in order, as `add` would
     * make them one by one; the other parts hold the tree's partial sums */
    void (*sum_parts)(float *y, int parts, size_t n);
    /* x (n) = x / s (divide) or x * s, each one fp32 operation: an FP8 KV
     * cache's per-layer scales (attention.c) */
    void (*scale)(float *x, size_t n, float s, int divide);
    /* x (T, dim) = table[tokens] for a table of the vocabulary's rows row0
     * to row0 + rows (fp32 or bf16, rows grouped as WeightRef.group says),
     * widened to fp32; zeros for a token outside them (another rank's
     * rows, which the TP sum adds) */
    void (*embedding)(float *x, WeightRef table, int row0, int rows, const int *tokens, int T, int dim);
    /* dst (R, dim) = src[rows[r]] */
    void (*gather_rows)(float *dst, const float *src, const int *rows, int R, int dim);
    /* Multi-head latent attention and mixture of experts (NULL on a backend
     * without them: such models are refused there). strided_copy copies
     * width floats of each of rows rows (strides in floats). */
    void (*strided_copy)(float *dst, int dst_stride, const float *src, int src_stride, int rows, int width);
    /* One GEMM per head (MLA's absorbed W_uk and W_uv): for b < batch,
     * y_b (T, out) = x_b (T, in) . W_b^T, with x_b at x + b * x_step (rows
     * ldx apart), y_b at y + b * y_step (rows ldy apart) and W_b =
     * weight_at(w, b * out * in). */
    void (*matmul_batched)(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                           int batch, int T, int in, int out);
    /* Mixture of experts without a host round-trip (moe.c). moe_route: T
     * tokens' router logits (T, experts) and correction bias (experts;
     * NULL: none) to each token's experts and weights (moe_route_token),
     * grouped by expert (moe_group_pairs): pair i is token rows[i] with
     * weights[i], expert e's pairs from start[e] to start[e + 1] (start:
     * experts + 1), slots (T, per_token) each token's pairs in expert
     * order. */
    void (*moe_route)(const MoeRouting *r, const float *logits, const float *bias, int T, int *rows, float *weights,
                      int *slots, int *start);
    /* a grouped GEMM over the pairs, in `chunks` K chunks apart (1: the
     * whole rows): for pair i of expert e, row i of y's block c (out; the
     * blocks pairs * out apart) = columns c * in .. c * in + in - 1 of x row
     * (rows ? rows[i] : i) (rows ldx apart) . W_ec^T, W_ec =
     * weight_at(w, e * w_step + c * out * in) (out, in) */
    void (*moe_matmul)(float *y, const float *x, int ldx, const int *rows, const int *start, int experts, int pairs,
                       WeightRef w, size_t w_step, int in, int out, int chunks);
    /* for each of `chunks` blocks (y's T * dim apart, src's T * per_token
     * * dim): y row t (dim) = 0 + weights[s] * src row s + ... over token
     * t's pairs s = slots[t * per_token + n], in expert order */
    void (*moe_combine)(float *y, const float *src, const int *slots, const float *weights, int T, int per_token,
                        int dim, int chunks);
    /* the slot mapping: for t with slots[t] >= 0, row slots[t] of one
     * layer's k_pool/v_pool (rows of kvd elements of kv_dtype, kv_heads KV
     * heads, blocks of block_size rows laid out as kv_pool_offset says)
     * receives k[t]/v[t] (rounded to nearest even for bf16; for FP8 E4M3
     * also, saturating at +-448: f32_to_f8e4m3, a per-tensor scale of 1 as
     * vLLM's default); v_pool NULL: keys only */
    void (*kv_write)(void *k_pool, void *v_pool, DType kv_dtype, const float *k, const float *v, const int *slots, int T,
                     int kvd, int kv_heads, int block_size);
    /* the KV cache types the backend stores: 1 << DTYPE_F32 | ...; and
     * x (n) rounded in place to the values a cache of type t (bf16 or FP8)
     * holds */
    unsigned kv_dtypes;
    void (*round_kv)(float *x, size_t n, DType t);
    void (*attention)(const AttnBatch *a);
    /* a's rows become the merges of two partial attentions over disjoint
     * keys, a's and b's: rows of stride floats, head_dim output values
     * then the LSE. Symmetric bit for bit, so that the canonical tree
     * (docs/design.md, "Same bits at any layout") gives the same bits
     * wherever its nodes are computed. */
    void (*merge_partials)(float *a, const float *b, int rows, int head_dim, int stride);
    /* parts (rows, head_dim + 1) = (o, lse): the DCP merges' packed rows */
    void (*pack_partials)(float *parts, const float *o, const float *lse, int rows, int head_dim);
    /* calls so far (a device backend; NULL: not counted) */
    const BackendCounts *counts;
} Backend;

const Backend *backend_cpu(void);
/* The CUDA backend, or NULL with dcp_error() saying why (not built, or no
 * usable GPU). backend_cuda.c in a CPU-only build, cuda/backend_cuda.cu
 * with --enable-cuda. */
const Backend *backend_cuda(void);
/* The null backend (backend_null.c): buffers that cost nothing until
 * touched, kernels that do nothing, experts chosen evenly over ep_ranks
 * groups of them; for dcpinfer-plan's counted decode step. */
const Backend *backend_null(int ep_ranks);
/* The backend named by --backend, or NULL with dcp_error() saying why. */
const Backend *backend_find(const char *name);
void backend_set_threads(int threads);
/* The CPU threads the CUDA backend's runtime may use: HIP-CPU runs kernels
 * on a thread pool of all cores otherwise, which several ranks per node
 * would oversubscribe; a no-op on a GPU. Called by backend_set_threads. */
void backend_cuda_set_threads(int threads);
/* CPU GEMM: "invariant" (default) or "openblas". */
int backend_cpu_set_gemm(const char *name);

#endif
