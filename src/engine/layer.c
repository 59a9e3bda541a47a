#include "layer.h"

#include <stdlib.h>

#include "tree.h"
#include "util.h"

double layer_clock(const LayerEnv *env)
{
    if (env->timing_sync) env->be->synchronize();
    return now_s();
}

const float *layer_act(const LayerEnv *env, const float *x, WeightRef w, int T, int in)
{
    if (!env->nvfp4_act || w.dtype != DTYPE_FP4 || !w.scale8) return x;
    return env->be->nvfp4_act(x, in, NULL, NULL, 1, T, w, 0, in);
}

/* the product on x as given, timed as matmul */
static void matmul_timed(const LayerEnv *env, float *y, const float *x, WeightRef w, int T, int in, int out)
{
    double t0 = layer_clock(env);
    env->be->matmul(y, x, w, T, in, out);
    env->tm->matmul += layer_clock(env) - t0;
}

void layer_matmul(const LayerEnv *env, float *y, const float *x, WeightRef w, int T, int in, int out)
{
    matmul_timed(env, y, layer_act(env, x, w, T, in), w, T, in, out);
}

void layer_matmul_batched(const LayerEnv *env, float *y, int ldy, size_t y_step, const float *x, int ldx,
                          size_t x_step, WeightRef w, int batch, int T, int in, int out)
{
    double t0 = layer_clock(env);
    env->be->matmul_batched(y, ldy, y_step, x, ldx, x_step, w, batch, T, in, out);
    env->tm->matmul += layer_clock(env) - t0;
}

void layer_attention(const LayerEnv *env, int layer, int sliding, const float *q, float *k, float *v, float *out,
                     float *lse)
{
    double t0 = layer_clock(env);
    attention_layer(env->att, layer, sliding, q, k, v, out, lse);
    env->tm->attention += layer_clock(env) - t0;
}

void layer_matmul_rows(const LayerEnv *env, float *parts, const float *x, WeightRef w, int T, int in, int out)
{
    int chunks = env->model->shard.chunks, cin = in / chunks;
    x = layer_act(env, x, w, T, in); /* whole rows: a chunk may hold part of a group of 16 */
    if (chunks == 1) {
        matmul_timed(env, parts, x, w, T, in, out);
        return;
    }
    /* the chunks' matrices are a stack: chunk c reads columns c * cin of
     * every row and writes parts[c], one batched product */
    layer_matmul_batched(env, parts, out, (size_t)T * out, x, in, (size_t)cin, w, chunks, T, cin, out);
}

void layer_sum_parts(const LayerEnv *env, int T)
{
    int dim = env->model->cfg.dim, chunks = env->model->shard.chunks;
    size_t n = (size_t)T * dim;
    float *y = env->parts;
    /* this rank's chunks: a subtree of the canonical tree (tree.h), whose
     * upper levels comm_sum_tree adds */
    env->be->sum_parts(y, chunks, n);
    comm_sum_tree(env->comm, y, env->sum_scratch, comm_count(n), GROUP_TP);
}

void layer_residual(const LayerEnv *env, const float *b, int T)
{
    int dim = env->model->cfg.dim;
    float *y = env->parts;
    layer_sum_parts(env, T);
    if (b) env->be->add_bias(y, b, T, dim); /* once, after the sum */
    env->be->add(env->x, y, (size_t)T * dim);
}

void layer_swiglu(const LayerEnv *env, const SwiGlu *w, float *parts, const float *x, int T, int hidden, float *h1,
                  float *h2)
{
    const Backend *be = env->be;
    int dim = env->model->cfg.dim;
    layer_matmul(env, h1, x, w->gate, T, dim, hidden);
    layer_matmul(env, h2, x, w->up, T, dim, hidden);
    if (w->b_gate) {
        be->add_bias(h1, w->b_gate, T, hidden);
        be->add_bias(h2, w->b_up, T, hidden);
    }
    be->silu_mul(h1, h2, (size_t)T * hidden);
    layer_matmul_rows(env, parts, h1, w->down, T, hidden, dim);
}

static const void *track(Uploads *u, const void *p)
{
    u->p = xrealloc(u->p, sizeof(void *) * (size_t)(u->n + 1));
    u->p[u->n++] = p;
    return p;
}

const float *upload_vector(const LayerEnv *env, Uploads *u, const float *host, size_t n)
{
    return host ? track(u, env->be->weights(host, n)) : NULL;
}

WeightRef upload_matrix(const LayerEnv *env, Uploads *u, WeightRef host, size_t n)
{
    if (!host.data) return (WeightRef){0};
    WeightRef w = env->be->gemm_weights(host, n);
    track(u, w.data);
    if (w.scale) track(u, w.scale);
    if (w.scale8) track(u, w.scale8), track(u, w.tables);
    return w;
}

WeightRef upload_f32_matrix(const LayerEnv *env, Uploads *u, const float *host, size_t n)
{
    return upload_matrix(env, u, weight_ref(host, DTYPE_F32, 0), n);
}

void uploads_release(const LayerEnv *env, Uploads *u)
{
    for (int i = 0; i < u->n; i++)
        if (u->p[i]) env->be->release_weights(u->p[i]);
    free(u->p);
    u->p = NULL;
    u->n = 0;
}

const float *upload_rope(const LayerEnv *env, Uploads *u, int width, float **host, float *scale)
{
    Config rc = env->model->cfg; /* RoPE over width dimensions of a head */
    rc.head_dim = width;
    float *freq = xmalloc(sizeof(float) * (size_t)(width / 2 + 1));
    rope_frequencies(&rc, freq, scale);
    *host = freq;
    return upload_vector(env, u, freq, (size_t)width / 2);
}
