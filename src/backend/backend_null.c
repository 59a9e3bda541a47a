/* The null backend (backend.h): what dcpinfer-plan runs a decode step on
 * with the counting transport (comm.h), so that the step's collectives are
 * those a run calls, counted by the same code, while no kernel runs.
 *
 * Its buffers are host memory reserved without being committed (untouched
 * pages cost nothing, so a KV cache of any size "fits"); its kernels do
 * nothing but moe_route, which chooses experts so that the pairs fall
 * evenly on the experts and, with expert parallelism, on the ranks
 * holding them; copies between host and buffers are real (small: the
 * step's metadata, and the logits, which read as zeros). Weights stay
 * where the loader put them: a counted model's point at nothing and are
 * never read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"
#include "moe_route.h"
#include "util.h"

/* the mapping's size sits in its first page, the buffer after it */
enum { NULL_HEADER = 4096 };

static void *null_alloc(size_t bytes)
{
    size_t n = NULL_HEADER + (bytes ? bytes : 1);
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "dcpinfer: the null backend could not reserve %zu bytes of address space\n", n);
        exit(1);
    }
    memcpy(p, &n, sizeof n);
    return p + NULL_HEADER;
}

static void null_release(void *p)
{
    if (!p) return;
    char *base = (char *)p - NULL_HEADER;
    size_t n;
    memcpy(&n, base, sizeof n);
    munmap(base, n);
}

static void null_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) memmove(dst, src, bytes);
}
static void *null_host_alloc(size_t bytes) { return xmalloc(bytes ? bytes : 1); }
static void null_host_release(void *p) { free(p); }
static const float *null_weights(const float *host, size_t n)
{
    (void)n;
    return host;
}
static WeightRef null_gemm_weights(WeightRef host, size_t n)
{
    (void)n;
    return host;
}
static void null_release_weights(const void *p) { (void)p; }
static const float *null_nvfp4_act(const float *x, int ldx, const int *rows, const int *start, int experts, int T,
                                   WeightRef w, size_t w_step, int in)
{
    (void)ldx, (void)rows, (void)start, (void)experts, (void)T, (void)w, (void)w_step, (void)in;
    return x; /* the kernels that read it do nothing */
}

static int null_set_gemm_dtype(const char *dtype)
{
    (void)dtype;
    return 0;
}
static void null_synchronize(void) {}

static void null_matmul(float *y, const float *x, WeightRef w, int T, int in, int out)
{
    (void)y, (void)x, (void)w, (void)T, (void)in, (void)out;
}
static void null_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int T, int dim, float eps)
{
    (void)y, (void)ldy, (void)x, (void)ldx, (void)w, (void)T, (void)dim, (void)eps;
}
static void null_rope(float *y, int ldy, const float *x, int ldx, const int *pos, int T, int n_heads, int head_dim,
                      const float *inv_freq, float scale, RopeStyle style)
{
    (void)y, (void)ldy, (void)x, (void)ldx, (void)pos, (void)T, (void)n_heads, (void)head_dim, (void)inv_freq,
        (void)scale, (void)style;
}
static void null_add_bias(float *y, const float *b, int T, int n) { (void)y, (void)b, (void)T, (void)n; }
static void null_silu_mul(float *gate, const float *up, size_t n) { (void)gate, (void)up, (void)n; }
static void null_add(float *y, const float *x, size_t n) { (void)y, (void)x, (void)n; }
static void null_sum_parts(float *y, int parts, size_t n) { (void)y, (void)parts, (void)n; }
static void null_scale(float *x, size_t n, float s, int divide) { (void)x, (void)n, (void)s, (void)divide; }
static void null_embedding(float *x, WeightRef table, int row0, int rows, const int *tokens, int T, int dim)
{
    (void)x, (void)table, (void)row0, (void)rows, (void)tokens, (void)T, (void)dim;
}
static void null_gather_rows(float *dst, const float *src, const int *rows, int R, int dim)
{
    (void)dst, (void)src, (void)rows, (void)R, (void)dim;
}
static void null_strided_copy(float *dst, int dst_stride, const float *src, int src_stride, int rows, int width)
{
    (void)dst, (void)dst_stride, (void)src, (void)src_stride, (void)rows, (void)width;
}
static void null_matmul_batched(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                                int batch, int T, int in, int out)
{
    (void)y, (void)ldy, (void)y_step, (void)x, (void)ldx, (void)x_step, (void)w, (void)batch, (void)T, (void)in,
        (void)out;
}

/* Pair p = t K + n goes to rank p mod N of the expert-parallel group and
 * to local expert (p / N) mod (E / N) there, N being the groups into which
 * the experts are cut (1 without expert parallelism): the K experts of a
 * token differ (p mod E differs), and over many tokens every expert and
 * every rank gets its share. */
static int null_ep_ranks = 1;

static void null_moe_route(const MoeRouting *r, const float *logits, const float *bias, int T, int *rows,
                           float *weights, int *slots, int *start)
{
    (void)logits, (void)bias;
    int K = r->per_token, E = r->experts, N = null_ep_ranks, El = E / N;
    int *idx = xmalloc(sizeof(int) * ((size_t)T * K + (size_t)E));
    float *wt = xcalloc((size_t)T * K, sizeof(float));
    for (int p = 0; p < T * K; p++) idx[p] = p % N * El + p / N % El;
    moe_group_pairs(idx, wt, T, K, E, rows, weights, slots, start, idx + (size_t)T * K);
    free(idx);
    free(wt);
}
static void null_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int experts,
                            int pairs, WeightRef w, size_t w_step, int in, int out, int chunks)
{
    (void)y, (void)x, (void)ldx, (void)rows, (void)start, (void)experts, (void)pairs, (void)w, (void)w_step, (void)in,
        (void)out, (void)chunks;
}
static void null_moe_combine(float *y, const float *src, const int *slots, const float *weights, int T, int per_token,
                             int dim, int chunks)
{
    (void)y, (void)src, (void)slots, (void)weights, (void)T, (void)per_token, (void)dim, (void)chunks;
}
static void null_kv_write(void *k_pool, void *v_pool, DType kv_dtype, const float *k, const float *v, const int *slots,
                          int T, int kvd, int kv_heads, int block_size)
{
    (void)k_pool, (void)v_pool, (void)kv_dtype, (void)k, (void)v, (void)slots, (void)T, (void)kvd, (void)kv_heads,
        (void)block_size;
}
static void null_round_kv(float *x, size_t n, DType t) { (void)x, (void)n, (void)t; }
static void null_attention(const AttnBatch *a) { (void)a; }
static void null_merge_partials(float *a, const float *b, int rows, int head_dim, int stride)
{
    (void)a, (void)b, (void)rows, (void)head_dim, (void)stride;
}
static void null_pack_partials(float *parts, const float *o, const float *lse, int rows, int head_dim)
{
    (void)parts, (void)o, (void)lse, (void)rows, (void)head_dim;
}

const Backend *backend_null(int ep_ranks)
{
    static const Backend be = {
        .name = "null",
        .host_memory = 1,
        .alloc = null_alloc,
        .release = null_release,
        .upload = null_copy,
        .download = null_copy,
        .copy = null_copy,
        .host_alloc = null_host_alloc,
        .host_release = null_host_release,
        .weights = null_weights,
        .gemm_weights = null_gemm_weights,
        .release_weights = null_release_weights,
        .set_gemm_dtype = null_set_gemm_dtype,
        .nvfp4_act = null_nvfp4_act,
        .synchronize = null_synchronize,
        .matmul = null_matmul,
        .rmsnorm = null_rmsnorm,
        .rope = null_rope,
        .add_bias = null_add_bias,
        .silu_mul = null_silu_mul,
        .add = null_add,
        .sum_parts = null_sum_parts,
        .scale = null_scale,
        .embedding = null_embedding,
        .gather_rows = null_gather_rows,
        .strided_copy = null_strided_copy,
        .matmul_batched = null_matmul_batched,
        .moe_route = null_moe_route,
        .moe_matmul = null_moe_matmul,
        .moe_combine = null_moe_combine,
        .kv_write = null_kv_write,
        .kv_dtypes = ~0u,
        .round_kv = null_round_kv,
        .attention = null_attention,
        .merge_partials = null_merge_partials,
        .pack_partials = null_pack_partials,
    };
    null_ep_ranks = ep_ranks > 1 ? ep_ranks : 1;
    return &be;
}
