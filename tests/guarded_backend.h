/* A stand-in for a GPU backend on the CPU: the CPU backend's arithmetic,
 * but its buffers are pages that the host cannot touch (PROT_NONE) except
 * inside the backend's own calls. A run with it crashes if the engine,
 * the scheduler or the collectives read or write a backend buffer
 * directly instead of through upload/download, and it exercises the
 * staging of MPI transfers through host memory, as the CUDA backend
 * without CUDA-aware MPI does. */
#ifndef DCP_GUARDED_BACKEND_H
#define DCP_GUARDED_BACKEND_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "util.h"

typedef struct {
    void *base;
    size_t bytes;
} GuardedRegion;

static GuardedRegion *guarded;
static int n_guarded, cap_guarded;
static Backend guarded_be;
static const Backend *guarded_cpu;

static void guard_all(int prot)
{
    for (int i = 0; i < n_guarded; i++)
        if (guarded[i].base && mprotect(guarded[i].base, guarded[i].bytes, prot)) {
            perror("mprotect");
            abort();
        }
}
#define OPEN() guard_all(PROT_READ | PROT_WRITE)
#define CLOSE() guard_all(PROT_NONE)

static void *g_alloc(size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + page - 1) / page * page;
    void *p = mmap(NULL, n ? n : page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        abort();
    }
    if (n_guarded == cap_guarded) guarded = xrealloc(guarded, sizeof *guarded * (cap_guarded = cap_guarded ? 2 * cap_guarded : 64));
    guarded[n_guarded++] = (GuardedRegion){p, n ? n : page};
    return p;
}

static void g_release(void *p)
{
    for (int i = 0; i < n_guarded; i++)
        if (guarded[i].base == p) {
            munmap(p, guarded[i].bytes);
            guarded[i] = guarded[--n_guarded];
            return;
        }
    abort(); /* not ours */
}

static void g_copy(void *dst, const void *src, size_t n) { OPEN(); memcpy(dst, src, n); CLOSE(); }
static const float *g_weights(const float *host, size_t n)
{
    float *d = g_alloc(sizeof(float) * n);
    g_copy(d, host, sizeof(float) * n);
    return d;
}
static WeightRef g_gemm_weights(WeightRef host, size_t n)
{
    void *d = g_alloc(dtype_data_bytes(host.dtype, n));
    g_copy(d, host.data, dtype_data_bytes(host.dtype, n));
    WeightRef w = host;
    w.data = d;
    if (host.scale) { /* a quantized matrix's scales travel with it */
        size_t ns = n / (size_t)host.qcols;
        float *s = g_alloc(sizeof(float) * ns);
        g_copy(s, host.scale, sizeof(float) * ns);
        w.scale = s;
    }
    if (host.scale8) { /* or NVFP4's codes and their tables */
        size_t ns = n / (size_t)host.qcols, nt = weight_tables(host, n) * 256 * sizeof(float);
        uint8_t *c = g_alloc(ns ? ns : 1);
        float *t = g_alloc(nt);
        g_copy(c, host.scale8, ns);
        g_copy(t, host.tables, nt);
        w.scale8 = c, w.tables = t;
    }
    return w;
}
static void g_release_weights(const void *p) { g_release((void *)p); }
static void g_sync(void) {}

/* each op: open the pages, run the CPU op, close them */
static void g_matmul(float *y, const float *x, WeightRef w, int T, int in, int out)
{ OPEN(); guarded_cpu->matmul(y, x, w, T, in, out); CLOSE(); }
static void g_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int T, int dim, float eps)
{ OPEN(); guarded_cpu->rmsnorm(y, ldy, x, ldx, w, T, dim, eps); CLOSE(); }
static void g_rope(float *y, int ldy, const float *x, int ldx, const int *pos, int T, int h, int d, const float *f,
                   float sc, RopeStyle st)
{ OPEN(); guarded_cpu->rope(y, ldy, x, ldx, pos, T, h, d, f, sc, st); CLOSE(); }
static void g_add_bias(float *y, const float *b, int T, int n) { OPEN(); guarded_cpu->add_bias(y, b, T, n); CLOSE(); }
static void g_silu_mul(float *g, const float *u, size_t n) { OPEN(); guarded_cpu->silu_mul(g, u, n); CLOSE(); }
static void g_add(float *y, const float *x, size_t n) { OPEN(); guarded_cpu->add(y, x, n); CLOSE(); }
static void g_sum_parts(float *y, int parts, size_t n) { OPEN(); guarded_cpu->sum_parts(y, parts, n); CLOSE(); }
static void g_scale(float *x, size_t n, float s, int divide) { OPEN(); guarded_cpu->scale(x, n, s, divide); CLOSE(); }
static void g_round_kv(float *x, size_t n, DType t) { OPEN(); guarded_cpu->round_kv(x, n, t); CLOSE(); }
static const float *g_nvfp4_act(const float *x, int ldx, const int *rows, const int *start, int experts, int T,
                                WeightRef w, size_t w_step, int in)
{
    OPEN();
    const float *q = guarded_cpu->nvfp4_act(x, ldx, rows, start, experts, T, w, w_step, in);
    CLOSE();
    return q;
}
static void g_embedding(float *x, WeightRef t, int row0, int rows, const int *tok, int T, int dim)
{ OPEN(); guarded_cpu->embedding(x, t, row0, rows, tok, T, dim); CLOSE(); }
static void g_gather_rows(float *d, const float *s, const int *rows, int R, int dim)
{ OPEN(); guarded_cpu->gather_rows(d, s, rows, R, dim); CLOSE(); }
static void g_kv_write(void *kp, void *vp, DType kv, const float *k, const float *v, const int *slots, int T, int kvd,
                       int kv_heads, int B)
{ OPEN(); guarded_cpu->kv_write(kp, vp, kv, k, v, slots, T, kvd, kv_heads, B); CLOSE(); }
static void g_attention(const AttnBatch *a) { OPEN(); guarded_cpu->attention(a); CLOSE(); }
static void g_strided_copy(float *d, int ds, const float *s, int ss, int rows, int w)
{ OPEN(); guarded_cpu->strided_copy(d, ds, s, ss, rows, w); CLOSE(); }
static void g_matmul_batched(float *y, int ldy, size_t ys, const float *x, int ldx, size_t xs, WeightRef w, int batch,
                             int T, int in, int out)
{ OPEN(); guarded_cpu->matmul_batched(y, ldy, ys, x, ldx, xs, w, batch, T, in, out); CLOSE(); }
static void g_moe_route(const MoeRouting *r, const float *logits, const float *bias, int T, int *rows, float *weights,
                        int *slots, int *start)
{ OPEN(); guarded_cpu->moe_route(r, logits, bias, T, rows, weights, slots, start); CLOSE(); }
static void g_moe_matmul(float *y, const float *x, int ldx, const int *rows, const int *start, int E, int P,
                         WeightRef w, size_t w_step, int in, int out, int chunks)
{ OPEN(); guarded_cpu->moe_matmul(y, x, ldx, rows, start, E, P, w, w_step, in, out, chunks); CLOSE(); }
static void g_moe_combine(float *y, const float *src, const int *slots, const float *w, int T, int K, int dim,
                          int chunks)
{ OPEN(); guarded_cpu->moe_combine(y, src, slots, w, T, K, dim, chunks); CLOSE(); }
static void g_merge(float *a, const float *b, int rows, int d, int stride)
{ OPEN(); guarded_cpu->merge_partials(a, b, rows, d, stride); CLOSE(); }
static void g_pack(float *p, const float *o, const float *l, int rows, int d)
{ OPEN(); guarded_cpu->pack_partials(p, o, l, rows, d); CLOSE(); }

static inline const Backend *backend_guarded(void)
{
    guarded_cpu = backend_cpu();
    Backend b = *guarded_cpu;
    b.name = "guarded";
    b.host_memory = 0;
    b.alloc = g_alloc;
    b.release = g_release;
    b.upload = g_copy;
    b.download = g_copy;
    b.copy = g_copy;
    b.weights = g_weights;
    b.gemm_weights = g_gemm_weights;
    b.release_weights = g_release_weights;
    b.synchronize = g_sync;
    b.matmul = g_matmul;
    b.rmsnorm = g_rmsnorm;
    b.rope = g_rope;
    b.silu_mul = g_silu_mul;
    b.add = g_add;
    b.sum_parts = g_sum_parts;
    b.scale = g_scale;
    b.round_kv = g_round_kv;
    b.nvfp4_act = g_nvfp4_act;
    b.add_bias = g_add_bias;
    b.embedding = g_embedding;
    b.gather_rows = g_gather_rows;
    b.kv_write = g_kv_write;
    b.attention = g_attention;
    b.merge_partials = g_merge;
    b.strided_copy = g_strided_copy;
    b.matmul_batched = g_matmul_batched;
    b.moe_route = g_moe_route;
    b.moe_matmul = g_moe_matmul;
    b.moe_combine = g_moe_combine;
    b.pack_partials = g_pack;
    guarded_be = b;
    return &guarded_be;
}

#endif
