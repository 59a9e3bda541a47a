/* The CPU backend: fp32, OpenMP loops, and GEMMs either batch-invariant
 * (default: a token's result never depends on the rest of the batch) or
 * OpenBLAS sgemm (faster for large prefill batches, but its rounding depends
 * on how many rows share a call). It is the reference every other backend
 * and every parallel layout is checked against. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "moe_route.h"
#include "kernels_cpu.h"
#include "quant.h"
#include "tree.h"
#include "util.h"

static int use_openblas;
static float *gather_scratch(int which, size_t n);

static const float *cpu_nvfp4_act(const float *x, int ldx, const int *rows, const int *start, int experts, int T,
                                  WeightRef w, size_t w_step, int in)
{
    float *q = gather_scratch(2, (size_t)T * in);
    for (int e = 0; e < experts; e++) {
        int t0 = start ? start[e] : 0, t1 = start ? start[e + 1] : T;
        WeightRef we = weight_at(w, (size_t)e * w_step);
        float gs = weight_act_scale(&we);
#pragma omp parallel for if (t1 - t0 > 4)
        for (int t = t0; t < t1; t++) {
            const float *xr = x + (size_t)(rows ? rows[t] : t) * ldx;
            float *qr = q + (size_t)t * in;
            if (gs == 0.0f) memcpy(qr, xr, sizeof(float) * (size_t)in);
            else
                for (int g = 0; g < in; g += NVFP4_ACT_GROUP) nvfp4_act_group(qr + g, xr + g, gs);
        }
    }
    return q;
}

static void cpu_matmul(float *y, const float *x, WeightRef wr, int T, int in, int out)
{
    if (!use_openblas || wr.dtype != DTYPE_F32) { /* OpenBLAS has no bf16 sgemm: refused at set-up */
        gemm_invariant(y, x, wr, T, in, out);
        return;
    }
    const float *w = wr.data;
    /* Our OpenMP threads split the output columns and each calls a
     * single-threaded sgemm: OpenBLAS's own thread pool would compete for
     * the cores with OpenMP's spinning workers. */
    int parts = omp_get_max_threads();
    int width = ((out + parts - 1) / parts + 15) / 16 * 16;
#pragma omp parallel for schedule(static)
    for (int p = 0; p < parts; p++) {
        int n0 = p * width, n = n0 + width <= out ? width : out - n0;
        if (n > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n, in, 1.0f, x, in, w + (size_t)n0 * in, in, 0.0f,
                        y + n0, out);
    }
}

int backend_cpu_set_gemm(const char *name)
{
    if (!strcmp(name, "invariant")) use_openblas = 0;
    else if (!strcmp(name, "openblas")) use_openblas = 1;
    else return dcp_fail("--cpu-gemm %s: choose invariant or openblas", name);
    return 0;
}

static void cpu_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int T, int dim, float eps)
{
#pragma omp parallel for if (T > 4)
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        float *yr = y + (size_t)t * ldy;
        float ss = 0.0f;
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / dim + eps);
        for (int i = 0; i < dim; i++) yr[i] = w[i] * (inv * xr[i]);
    }
}

static void cpu_rope(float *y, int ldy, const float *x, int ldx, const int *pos, int T, int n_heads, int head_dim,
                     const float *inv_freq, float scale, RopeStyle style)
{
    int half = head_dim / 2;
#pragma omp parallel for if (T > 4)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = pos[t] * inv_freq[i];
            float c = cosf(angle) * scale, s = sinf(angle) * scale;
            for (int h = 0; h < n_heads; h++) {
                size_t row = (size_t)t * n_heads + h;
                const float *v = x + row * ldx;
                float *u = y + row * ldy;
                /* adjacent pairs (2i, 2i+1), as llama2.c; or halves (i, i+D/2), as HF */
                int a = style == ROPE_ADJACENT_PAIRS ? 2 * i : i;
                int b = style == ROPE_ADJACENT_PAIRS ? 2 * i + 1 : i + half;
                float v0 = v[a], v1 = v[b];
                u[a] = v0 * c - v1 * s;
                u[b] = v0 * s + v1 * c;
            }
        }
    }
}

static void cpu_silu_mul(float *gate, const float *up, size_t n)
{
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void cpu_add_bias(float *y, const float *b, int T, int n)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < n; i++) y[(size_t)t * n + i] += b[i];
}

static void cpu_add(float *y, const float *x, size_t n)
{
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_sum_parts(float *y, int parts, size_t n)
{
    for (int i = 0; i < parts - 1; i++) {
        TreeStep st = tree_sum_step(parts, i);
        cpu_add(y + st.into * n, y + st.from * n, n);
    }
}

static void cpu_scale(float *x, size_t n, float s, int divide)
{
    if (divide)
        for (size_t i = 0; i < n; i++) x[i] = x[i] / s;
    else
        for (size_t i = 0; i < n; i++) x[i] = x[i] * s;
}

static void cpu_embedding(float *x, WeightRef table, int row0, int rows, const int *tokens, int T, int dim)
{
    for (int t = 0; t < T; t++) {
        float *y = x + (size_t)t * dim;
        int r = tokens[t] - row0;
        if (r < 0 || r >= rows) {
            memset(y, 0, sizeof(float) * dim);
            continue;
        }
        size_t at = weight_row_start(table.group, r, rows, dim), step = weight_row_step(table.group, r, rows);
        for (int c = 0; c < dim; c += 16)
            for (int i = 0; i < 16 && c + i < dim; i++) {
                size_t e = at + (size_t)(c / 16) * step + i;
                y[c + i] = table.dtype == DTYPE_BF16 ? bf16_to_f32(((const uint16_t *)table.data)[e])
                                                     : ((const float *)table.data)[e];
            }
    }
}

/* tokens attended together, at most: consecutive tokens of one sequence
 * (a prefill chunk's) read each key once for all of them; and their
 * scores' bytes (per thread), at most, which caps them at long contexts */
#ifndef ATT_ROWS
#define ATT_ROWS 32
#endif
#define ATT_SCRATCH ((size_t)16 << 20)

/* token t's first key row, unpaged */
static size_t first_row(const AttnBatch *a, int t) { return a->row0 && !a->blocks ? (size_t)a->row0[t] : 0; }

/* token u reads the keys token t reads, and both read some */
static int same_keys(const AttnBatch *a, int t, int u)
{
    int j0t = a->key0 ? a->key0[t] : 0, j0u = a->key0 ? a->key0[u] : 0;
    return first_row(a, t) == first_row(a, u) && (a->blocks ? a->blocks[t] == a->blocks[u] : 1) &&
           a->n_keys[t] > j0t && a->n_keys[u] > j0u;
}

/* a (D) with LSE *la becomes the merge of two partial attentions over
 * disjoint keys, b (D) with LSE lb (docs/design.md, "Same bits at any
 * layout"): symmetric in its two sides, bit for bit, and a side without
 * keys (LSE -inf) leaves the other as it is. */
__attribute__((optimize("tree-vectorize"))) /* elementwise: the same bits in vector lanes */
static inline void merge_row(float *a, float *la, const float *b, float lb, int D)
{
    float l1 = *la, l2 = lb;
    if (l2 == -INFINITY) return;
    if (l1 == -INFINITY) {
        memcpy(a, b, sizeof(float) * D);
        *la = l2;
        return;
    }
    float m = l1 > l2 ? l1 : l2;
    float s1 = expf(l1 - m), s2 = expf(l2 - m), inv = 1.0f / (s1 + s2);
    for (int d = 0; d < D; d++) a[d] = (a[d] * s1 + b[d] * s2) * inv;
    *la = m + logf(s1 + s2);
}

static void cpu_merge_partials(float *a, const float *b, int rows, int head_dim, int stride)
{
#pragma omp parallel for if (rows > 64)
    for (int r = 0; r < rows; r++) {
        float *x = a + (size_t)r * stride;
        const float *y = b + (size_t)r * stride;
        merge_row(x, x + head_dim, y, y[head_dim], head_dim);
    }
}

static void *cpu_alloc(size_t bytes) { return xmalloc(bytes); }
static void cpu_release(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static const float *cpu_weights(const float *host, size_t n)
{
    (void)n;
    return host; /* the CPU computes on the loaded weights themselves */
}

/* GEMM weights: used where they were loaded when already of the chosen type;
 * otherwise converted copies, remembered so that release frees only those */
static int gemm_bf16 = -1; /* -1: as loaded */
static const void **copies;
static int n_copies;

static WeightRef cpu_gemm_weights(WeightRef host, size_t n)
{
    /* a quantized matrix is read as stored: --dtype never widens it */
    if (gemm_bf16 < 0 || dtype_quantized(host.dtype) || (gemm_bf16 == 1) == (host.dtype == DTYPE_BF16)) return host;
    void *p;
    if (gemm_bf16) {
        p = xmalloc(sizeof(uint16_t) * (n ? n : 1));
        f32_to_bf16_n(p, host.data, n);
    } else {
        float *f = xmalloc(sizeof(float) * (n ? n : 1));
        const uint16_t *h = host.data;
        for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
        p = f;
    }
    copies = xrealloc(copies, sizeof(void *) * (size_t)(n_copies + 1));
    copies[n_copies++] = p;
    return weight_ref(p, gemm_bf16 ? DTYPE_BF16 : DTYPE_F32, 0);
}

static void cpu_release_weights(const void *p)
{
    for (int i = 0; i < n_copies; i++)
        if (copies[i] == p) {
            free((void *)p);
            copies[i] = copies[--n_copies];
            if (!n_copies) {
                free(copies);
                copies = NULL;
            }
            return;
        }
}

static int cpu_gemm_row_group(DType t) { return use_openblas ? 0 : cpu_weight_group(t); }

static int cpu_set_gemm_dtype(const char *dtype)
{
    if (!strcmp(dtype, "auto")) gemm_bf16 = -1;
    else if (!strcmp(dtype, "float32")) gemm_bf16 = 0;
    else if (!strcmp(dtype, "bfloat16")) gemm_bf16 = 1;
    else return dcp_fail("--dtype %s: choose auto, float32 or bfloat16", dtype);
    if (gemm_bf16 == 1 && use_openblas) return dcp_fail("--dtype bfloat16: OpenBLAS has no bf16 GEMM (--cpu-gemm openblas)");
    return 0;
}
static void cpu_synchronize(void) {}

static void cpu_gather_rows(float *dst, const float *src, const int *rows, int R, int dim)
{
    for (int r = 0; r < R; r++) memcpy(dst + (size_t)r * dim, src + (size_t)rows[r] * dim, sizeof(float) * dim);
}

static void cpu_kv_write(void *k_pool, void *v_pool, DType kv_dtype, const float *k, const float *v, const int *slots,
                         int T, int kvd, int kv_heads, int block_size)
{
    size_t hd = (size_t)(kvd / kv_heads), B = (size_t)block_size;
    for (int t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        for (int h = 0; h < kv_heads; h++) {
            size_t at = kv_pool_offset(slots[t], h, hd, kv_heads, B), from = (size_t)t * kvd + h * hd;
            if (kv_dtype == DTYPE_F32) {
                memcpy((float *)k_pool + at, k + from, sizeof(float) * hd);
                if (v_pool) memcpy((float *)v_pool + at, v + from, sizeof(float) * hd);
                continue;
            }
            if (kv_dtype == DTYPE_F8_E4M3) {
                for (size_t i = 0; i < hd; i++) {
                    ((uint8_t *)k_pool)[at + i] = f32_to_f8e4m3(k[from + i]);
                    if (v_pool) ((uint8_t *)v_pool)[at + i] = f32_to_f8e4m3(v[from + i]);
                }
                continue;
            }
            f32_to_bf16_n((uint16_t *)k_pool + at, k + from, hd);
            if (v_pool) f32_to_bf16_n((uint16_t *)v_pool + at, v + from, hd);
        }
    }
}

static void cpu_round_kv(float *x, size_t n, DType t)
{
    if (t == DTYPE_F8_E4M3)
        for (size_t i = 0; i < n; i++) x[i] = f8e4m3_to_f32(f32_to_f8e4m3(x[i]));
    else if (t == DTYPE_BF16)
        for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

static void cpu_strided_copy(float *dst, int dst_stride, const float *src, int src_stride, int rows, int width)
{
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * dst_stride, src + (size_t)r * src_stride, sizeof(float) * (size_t)width);
}

/* Scratch of the ops below that gather rows into contiguous matrices for
 * the GEMM, grown on demand (the forward pass runs on one thread). */
static float *gather_buf[3];
static size_t gather_cap[3];

static float *gather_scratch(int which, size_t n)
{
    if (n > gather_cap[which]) {
        free(gather_buf[which]);
        gather_buf[which] = xmalloc(sizeof(float) * n);
        gather_cap[which] = n;
    }
    return gather_buf[which];
}

/* each head's GEMM on its rows copied out contiguous: the bits of the
 * per-head products, whatever the strides */
static void cpu_matmul_batched(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                               int batch, int T, int in, int out)
{
    float *xb = gather_scratch(0, (size_t)T * in), *yb = gather_scratch(1, (size_t)T * out);
    for (int b = 0; b < batch; b++) {
        cpu_strided_copy(xb, in, x + b * x_step, ldx, T, in);
        cpu_matmul(yb, xb, weight_at(w, (size_t)b * out * in), T, in, out);
        cpu_strided_copy(y + b * y_step, ldy, yb, out, T, out);
    }
}

static void cpu_moe_route(const MoeRouting *r, const float *logits, const float *bias, int T, int *rows,
                          float *weights, int *slots, int *start)
{
    int E = r->experts, K = r->per_token, G = r->groups;
    /* scratch grown once, as gather_scratch's: this runs per MoE layer per step */
    static float *fscratch;
    static int *iscratch;
    static char *taken;
    static size_t fcap, icap, tcap;
    size_t nf = 2 * (size_t)E + G + (size_t)T * K, ni = G + (size_t)T * K + E;
    if (nf > fcap) free(fscratch), fscratch = xmalloc(sizeof(float) * nf), fcap = nf;
    if (ni > icap) free(iscratch), iscratch = xmalloc(sizeof(int) * ni), icap = ni;
    if ((size_t)E > tcap) free(taken), taken = xmalloc((size_t)E), tcap = (size_t)E;
    float *score = fscratch, *choice = score + E, *gscore = choice + E, *wt = gscore + G;
    int *keep = iscratch, *idx = keep + G, *fill = idx + (size_t)T * K;
    for (int t = 0; t < T; t++)
        moe_route_token(r, logits + (size_t)t * E, bias, score, choice, gscore, keep, taken, idx + (size_t)t * K,
                        wt + (size_t)t * K);
    moe_group_pairs(idx, wt, T, K, E, rows, weights, slots, start, fill);
}

/* chunk by chunk, expert by expert: its pairs' rows gathered, one GEMM */
static void cpu_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int experts,
                           int pairs, WeightRef w, size_t w_step, int in, int out, int chunks)
{
    for (int c = 0; c < chunks; c++)
        for (int e = 0; e < experts; e++) {
            int R = start[e + 1] - start[e];
            if (!R) continue;
            float *xe = gather_scratch(0, (size_t)R * in);
            for (int i = 0; i < R; i++) {
                int row = rows ? rows[start[e] + i] : start[e] + i;
                memcpy(xe + (size_t)i * in, x + (size_t)row * ldx + (size_t)c * in, sizeof(float) * (size_t)in);
            }
            cpu_matmul(y + ((size_t)c * pairs + start[e]) * out, xe,
                       weight_at(w, (size_t)e * w_step + (size_t)c * out * in), R, in, out);
        }
}

static void cpu_moe_combine(float *y, const float *src, const int *slots, const float *weights, int T, int K, int dim,
                            int chunks)
{
    for (int c = 0; c < chunks; c++)
        for (int t = 0; t < T; t++) {
            float *yr = y + ((size_t)c * T + t) * dim;
            memset(yr, 0, sizeof(float) * (size_t)dim);
            for (int n = 0; n < K; n++) {
                int s = slots[t * K + n];
                const float *sr = src + ((size_t)c * T * K + s) * dim;
                float w = weights[s];
                for (int d = 0; d < dim; d++) yr[d] += w * sr[d];
            }
        }
}

/* Shard g of the unit's rows (tokens t .. t+R-1, H heads from KV head g0,
 * its first row r) into the shard's partials: outputs po (rows of
 * n_heads x Dv a token, as a->out) and LSEs pl (as a->lse). The shard's
 * keys go to the kernel through its key map (AttendRows); a row without
 * keys in the shard gets LSE -inf and zeros. */
static void attend_shard(const AttnBatch *a, AttendFn attend, int t, int R, size_t r, int H, int g0, int group,
                         int g, float *po, float *pl, float **score, size_t *cap)
{
    static _Thread_local int *keys;
    static _Thread_local size_t cap_keys;
    int G = a->shards, run = a->shard_interleave > 0 ? a->shard_interleave : 1, Dv = a->v_dim ? a->v_dim : a->head_dim;
    if ((size_t)R > cap_keys) {
        free(keys);
        cap_keys = (size_t)R;
        keys = xmalloc(sizeof(int) * 2 * cap_keys);
    }
    size_t esize = dtype_bytes(a->kv_dtype), hd = (size_t)a->kv_stride / a->n_kv_heads, B = (size_t)a->block_size;
    size_t hs = a->blocks ? B * hd : hd, row_o = (size_t)a->n_heads * Dv;
    int *j0 = keys, *n = keys + R;
    for (int i = 0; i < R; i++) {
        j0[i] = a->key0 ? shard_keys(a->key0[t + i], G, run, g) : 0;
        n[i] = shard_keys(a->n_keys[t + i], G, run, g);
    }
    for (int i0 = 0, i1; i0 < R; i0 = i1) {
        float *o = po + (r + (size_t)i0 * a->n_heads) * Dv, *l = pl + r + (size_t)i0 * a->n_heads;
        if (n[i0] <= j0[i0]) { /* no keys in this shard */
            memset(o, 0, sizeof(float) * H * Dv);
            for (int h = 0; h < H; h++) l[h] = -INFINITY;
            i1 = i0 + 1;
            continue;
        }
        int hi = n[i0];
        for (i1 = i0 + 1; i1 < R && n[i1] > j0[i1]; i1++) hi = n[i1] > hi ? n[i1] : hi;
        size_t want = attend_scratch_bytes(hi, (i1 - i0) * H);
        if (want > *cap) {
            *cap = want > 2 * *cap ? want : 2 * *cap;
            free(*score);
            *score = xmalloc(*cap);
        }
        size_t kv0 = (first_row(a, t) * a->kv_stride + (size_t)g0 * hs) * esize;
        AttendRows ar = {.R = i1 - i0, .H = H, .group = group, .D = a->head_dim, .Dv = Dv, .j0 = j0 + i0,
                         .n = n + i0, .q = a->q + (r + (size_t)i0 * a->n_heads) * a->head_dim, .out = o, .lse = l,
                         .q_stride = (size_t)a->n_heads * a->head_dim, .out_stride = row_o,
                         .lse_stride = (size_t)a->n_heads, .k = (const char *)a->k + kv0,
                         .v = (const char *)a->v + kv0, .table = a->blocks ? a->blocks[t] : NULL,
                         .B = a->block_size, .stride = a->blocks ? hd : (size_t)a->kv_stride, .head_stride = hs,
                         .block_stride = B * a->kv_stride, .scale = a->scale, .scratch = *score,
                         /* the token before, of the same sequence, has just read these keys */
                         .warm = t > 0 && same_keys(a, t - 1, t), .map_shards = G, .map_shard = g,
                         .map_interleave = run};
        attend(&ar);
    }
}

/* The shards' partials (G x rows) merged by the canonical merge tree
 * (tree.h) into out and lse. */
static void merge_shards(const AttnBatch *a, float *po, float *pl, size_t rows)
{
    int G = a->shards, Dv = a->v_dim ? a->v_dim : a->head_dim;
#pragma omp parallel for if (rows > 64)
    for (size_t i = 0; i < rows; i++) {
        for (int j = 0; j < G - 1; j++) {
            TreeStep st = tree_merge_step(G, j);
            size_t into = (size_t)st.into * rows + i, from = (size_t)st.from * rows + i;
            merge_row(po + into * Dv, pl + into, po + from * Dv, pl[from], Dv);
        }
        memcpy(a->out + i * Dv, po + i * Dv, sizeof(float) * Dv);
        a->lse[i] = pl[i];
    }
}

static void cpu_attention(const AttnBatch *a)
{
    static const int no_key0[ATT_ROWS];
    int kv_heads = a->n_kv_heads, group = a->n_heads / kv_heads, D = a->head_dim, Dv = a->v_dim ? a->v_dim : a->head_dim;
    AttendFn attend = cpu_attend(a->kv_dtype);
    size_t esize = dtype_bytes(a->kv_dtype);
    /* a KV head's elements in a row; paged pools hold a block's keys KV
     * head by KV head (AttnBatch) */
    size_t hd = (size_t)a->kv_stride / kv_heads, B = (size_t)a->block_size;
    size_t stride = a->blocks ? hd : (size_t)a->kv_stride, hs = a->blocks ? B * hd : hd;
    /* a unit of work: a run of tokens' heads (read together, key by key),
     * split by KV heads when there are too few tokens to go round the
     * threads; runs as long as leave every thread two at least */
    int threads = omp_get_max_threads(), splits = 1, most = a->T / (2 * threads);
    if (a->T < threads) splits = (threads + a->T - 1) / a->T;
    if (splits > kv_heads) splits = kv_heads;
    most = most < 1 ? 1 : most > ATT_ROWS ? ATT_ROWS : most;
    static int *run0, cap_runs; /* run i: tokens run0[i] .. run0[i + 1] - 1 */
    if (a->T + 1 > cap_runs) {
        cap_runs = 2 * (a->T + 1);
        run0 = xrealloc(run0, sizeof(int) * (size_t)cap_runs);
    }
    int runs = 0;
    for (int t = 0, u; t < a->T; t = u) {
        run0[runs++] = t;
        int n = a->n_keys[t];
        for (u = t + 1; u < a->T && u - t < most && same_keys(a, t, u); u++) {
            n = a->n_keys[u] > n ? a->n_keys[u] : n;
            if (attend_scratch_bytes(n, (u - t + 1) * a->n_heads) > ATT_SCRATCH) break;
        }
    }
    run0[runs] = a->T;
    /* canonical key shards: each (run, split, shard) a unit of its own,
     * into the shards' partials, merged after */
    int G = a->shards > 1 ? a->shards : 1;
    static float *part;
    static size_t cap_part;
    size_t rows = (size_t)a->T * a->n_heads;
    if (G > 1 && (size_t)G * rows * (Dv + 1) > cap_part) {
        free(part);
        cap_part = (size_t)G * rows * (Dv + 1);
        part = xmalloc(sizeof(float) * cap_part);
    }
    float *po = part, *pl = part + (size_t)G * rows * Dv;
    int units = runs * splits * G;
#pragma omp parallel if (units > 1)
    {
        /* each thread's scores and key offsets, kept from call to call */
        static _Thread_local float *score;
        static _Thread_local size_t cap;
#pragma omp for schedule(dynamic, 1)
        for (int uu = 0; uu < units; uu++) {
            int u = uu / G, g = uu % G;
            int t = run0[u / splits], R = run0[u / splits + 1] - t, s = u % splits;
            int g0 = (int)((long)kv_heads * s / splits), g1 = (int)((long)kv_heads * (s + 1) / splits);
            int H = (g1 - g0) * group, n = a->n_keys[t], j0 = a->key0 ? a->key0[t] : 0;
            size_t r = (size_t)t * a->n_heads + (size_t)g0 * group; /* the unit's first row */
            float *o = a->out + r * Dv;
            if (G > 1) {
                o = po + (size_t)g * rows * Dv + r * Dv;
                if (n - j0 <= 0) {
                    memset(o, 0, sizeof(float) * Dv * H);
                    for (int h = 0; h < H; h++) pl[(size_t)g * rows + r + h] = -INFINITY;
                    continue;
                }
            }
            if (n - j0 <= 0) { /* a run of its own */
                memset(o, 0, sizeof(float) * Dv * H);
                for (int h = 0; h < H; h++) a->lse[r + h] = -INFINITY;
                continue;
            }
            for (int i = 1; i < R; i++) n = a->n_keys[t + i] > n ? a->n_keys[t + i] : n;
            size_t need = attend_scratch_bytes(n, R * H);
            if (need > cap) {
                cap = need > 2 * cap ? need : 2 * cap;
                free(score);
                score = xmalloc(cap);
            }
            if (G > 1) {
                attend_shard(a, attend, t, R, r, H, g0, group, g, po + (size_t)g * rows * Dv, pl + (size_t)g * rows,
                             &score, &cap);
                continue;
            }
            AttendRows ar = {.R = R, .H = H, .group = group, .D = D, .Dv = Dv,
                             .j0 = a->key0 ? a->key0 + t : no_key0, .n = a->n_keys + t,
                             .q = a->q + r * D, .out = o, .lse = &a->lse[r],
                             .q_stride = (size_t)a->n_heads * D, .out_stride = (size_t)a->n_heads * Dv,
                             .lse_stride = (size_t)a->n_heads,
                             .k = (const char *)a->k + (first_row(a, t) * a->kv_stride + (size_t)g0 * hs) * esize,
                             .v = (const char *)a->v + (first_row(a, t) * a->kv_stride + (size_t)g0 * hs) * esize,
                             .table = a->blocks ? a->blocks[t] : NULL, .B = a->block_size, .stride = stride,
                             .head_stride = hs, .block_stride = B * a->kv_stride, .scale = a->scale, .scratch = score,
                             /* the token before, of the same sequence, has just read these keys */
                             .warm = t > 0 && same_keys(a, t - 1, t)};
            attend(&ar);
        }
    }
    if (G > 1) merge_shards(a, po, pl, rows);
}

static void cpu_pack_partials(float *parts, const float *o, const float *lse, int rows, int head_dim)
{
    for (int r = 0; r < rows; r++) {
        memcpy(parts + (size_t)r * (head_dim + 1), o + (size_t)r * head_dim, sizeof(float) * head_dim);
        parts[(size_t)r * (head_dim + 1) + head_dim] = lse[r];
    }
}

static const Backend cpu = {
    .name = "cpu",
    .host_memory = 1,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .host_alloc = cpu_alloc,
    .host_release = cpu_release,
    .weights = cpu_weights,
    .gemm_weights = cpu_gemm_weights,
    .release_weights = cpu_release_weights,
    .gemm_row_group = cpu_gemm_row_group,
    .set_gemm_dtype = cpu_set_gemm_dtype,
    .nvfp4_act = cpu_nvfp4_act,
    .synchronize = cpu_synchronize,
    .gather_rows = cpu_gather_rows,
    .kv_write = cpu_kv_write,
    .kv_dtypes = 1u << DTYPE_F32 | 1u << DTYPE_BF16 | 1u << DTYPE_F8_E4M3,
    .round_kv = cpu_round_kv,
    .strided_copy = cpu_strided_copy,
    .matmul_batched = cpu_matmul_batched,
    .moe_route = cpu_moe_route,
    .moe_matmul = cpu_moe_matmul,
    .moe_combine = cpu_moe_combine,
    .pack_partials = cpu_pack_partials,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .sum_parts = cpu_sum_parts,
    .scale = cpu_scale,
    .add_bias = cpu_add_bias,
    .embedding = cpu_embedding,
    .attention = cpu_attention,
    .merge_partials = cpu_merge_partials,
};

const Backend *backend_cpu(void) { return &cpu; }

const Backend *backend_find(const char *name)
{
    if (!strcmp(name, "cpu")) return &cpu;
    if (!strcmp(name, "cuda")) return backend_cuda();
    dcp_fail("--backend %s: unknown backend (choose cpu or cuda)", name);
    return NULL;
}

void backend_set_threads(int threads)
{
    omp_set_num_threads(threads);
    openblas_set_num_threads(1); /* see cpu_matmul */
    backend_cuda_set_threads(threads);
}
