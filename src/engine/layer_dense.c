/* The Llama family's decoder layer (Llama, Mistral, Qwen2, Qwen3,
 * Qwen3-MoE, GLM-4.5): grouped-query attention with optional q/k/v/o
 * biases, per-head q/k norms, RoPE over whole heads or their first part,
 * and a sliding window, then a SwiGLU feed-forward block, or in MoE layers
 * a mixture of experts (moe.c). Under TP the Q/K/V and
 * gate/up projections are column-parallel (this rank's heads and hidden
 * rows), o_proj and down_proj row-parallel, summed over the group. */
#include "layer_dense.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "util.h"

/* One layer's weights as the backend holds them; shapes are this rank's
 * shard (Shard in model.h). */
typedef struct {
    const float *rms_att;   /* (dim) */
    WeightRef wq;           /* (q_heads*head_dim, dim) */
    WeightRef wk, wv;       /* (kv_heads*head_dim, dim) */
    WeightRef wo;           /* (dim, q_heads*head_dim) as Shard.chunks column chunks */
    const float *rms_ffn;   /* (dim) */
    SwiGlu ffn;             /* (hidden, dim) x 2, (dim, hidden) as column chunks */
    MoeWeights moe;         /* instead, a MoE layer's experts (is_moe) */
    int is_moe;
    /* NULL unless the config has them (Weights in model.h) */
    const float *bq, *bk, *bv, *bo, *b_down, *q_norm, *k_norm;
    int sliding;            /* this layer attends within the sliding window */
} DenseLayer;

typedef struct {
    Uploads up;
    DenseLayer *layer;      /* n_layers views into the uploaded stacks */
    const float *inv_freq;  /* (rotary/2) RoPE frequencies */
    int rotary;             /* dimensions RoPE rotates, the first of each head */
    float rope_scale;       /* cos/sin scale (YaRN), else 1 */
    float *rope_host;
    /* scratch for cap tokens */
    int cap;
    float *q, *k, *v, *att, *lse, *hb, *hb2;
    MoeScratch moe;
} Dense;

static void dense_attn_shape(const Model *m, AttnShape *a)
{
    const Config *c = &m->cfg;
    *a = (AttnShape){.n_layers = c->n_layers, .q_heads = m->shard.q_heads, .kv_heads = m->shard.kv_heads,
                     .head_dim = c->head_dim, .scale = 1.0f / sqrtf((float)c->head_dim),
                     .window = c->sliding_window};
}

/* The model's per-layer stacks go to the backend whole (as loaded, one
 * buffer per tensor kind); each layer is a view into them. */
static void *dense_load(const LayerEnv *env)
{
    const Model *m = env->model;
    const Config *c = &m->cfg;
    const Shard *s = &m->shard;
    const Weights *h = &m->w;
    Dense *d = xcalloc(1, sizeof *d);
    Uploads *u = &d->up;
    size_t L = (size_t)c->n_layers, dim = (size_t)c->dim, D = (size_t)c->head_dim, qd = (size_t)s->q_heads * D,
           kvd = (size_t)s->kv_heads * D, hid = (size_t)s->hidden, Lf = (size_t)tensor_layers(c, T_GATE);
    const float *rms_att = upload_vector(env, u, h->rms_att, L * dim), *rms_ffn = upload_vector(env, u, h->rms_ffn, L * dim);
    WeightRef wq = upload_matrix(env, u, h->wq, L * qd * dim), wk = upload_matrix(env, u, h->wk, L * kvd * dim),
              wv = upload_matrix(env, u, h->wv, L * kvd * dim), wo = upload_matrix(env, u, h->wo, L * dim * qd),
              gate = {0}, up = {0}, down = {0};
    if (Lf) { /* the dense layers' feed-forward stacks: the first Lf layers */
        gate = upload_matrix(env, u, h->w_gate, Lf * hid * dim);
        up = upload_matrix(env, u, h->w_up, Lf * hid * dim);
        down = upload_matrix(env, u, h->w_down, Lf * dim * hid);
    }
    /* the optional vectors: biases and q/k norms, one row per layer (the
     * feed-forward's per dense layer) */
    const float *const host_vec[] = {h->bq, h->bk, h->bv, h->bo, h->b_gate, h->b_up, h->b_down, h->q_norm, h->k_norm};
    const size_t per_layer[] = {qd, kvd, kvd, dim, hid, hid, dim, D, D}, layers[] = {L, L, L, L, Lf, Lf, Lf, L, L};
    const float *vec[9];
    for (int i = 0; i < 9; i++) vec[i] = upload_vector(env, u, host_vec[i], layers[i] * per_layer[i]);
    d->rotary = c->rotary_dim ? c->rotary_dim : c->head_dim;
    d->inv_freq = upload_rope(env, u, d->rotary, &d->rope_host, &d->rope_scale);
    d->layer = xcalloc(L, sizeof(DenseLayer));
    for (size_t l = 0; l < L; l++) {
        DenseLayer *lw = &d->layer[l];
        const float **at[] = {&lw->bq, &lw->bk, &lw->bv, &lw->bo, &lw->ffn.b_gate, &lw->ffn.b_up, &lw->b_down,
                              &lw->q_norm, &lw->k_norm};
        for (int i = 0; i < 9; i++) *at[i] = vec[i] && l < layers[i] ? vec[i] + l * per_layer[i] : NULL;
        lw->sliding = c->sliding_window > 0 && (int)l >= c->window_first_layer;
        lw->rms_att = rms_att + l * dim;
        lw->rms_ffn = rms_ffn + l * dim;
        lw->wq = weight_at(wq, l * qd * dim);
        lw->wk = weight_at(wk, l * kvd * dim);
        lw->wv = weight_at(wv, l * kvd * dim);
        lw->wo = weight_at(wo, l * dim * qd);
        lw->is_moe = h->moe && MOE_LAYER(c, (int)l);
        if (lw->is_moe) {
            moe_load(env, u, &h->moe[l], &lw->moe);
            continue;
        }
        lw->ffn.gate = weight_at(gate, l * hid * dim);
        lw->ffn.up = weight_at(up, l * hid * dim);
        lw->ffn.down = weight_at(down, l * dim * hid);
    }
    return d;
}

static void free_scratch(const LayerEnv *env, Dense *d)
{
    float **bufs[] = {&d->q, &d->k, &d->v, &d->att, &d->lse, &d->hb, &d->hb2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        if (*bufs[i]) env->be->release(*bufs[i]);
        *bufs[i] = NULL;
    }
    moe_free_scratch(env, &d->moe);
    d->cap = 0;
}

static void dense_release(const LayerEnv *env, void *state)
{
    Dense *d = state;
    free_scratch(env, d);
    uploads_release(env, &d->up);
    for (int l = 0; l < env->model->cfg.n_layers; l++) moe_free(&d->layer[l].moe);
    free(d->layer);
    free(d->rope_host);
    free(d);
}

static void dense_reserve(const LayerEnv *env, void *state, int T)
{
    Dense *d = state;
    if (T <= d->cap) return;
    free_scratch(env, d);
    const Shard *s = &env->model->shard;
    size_t t = (size_t)T, D = (size_t)env->model->cfg.head_dim, f = sizeof(float);
    const Config *c = &env->model->cfg;
    size_t qd = (size_t)s->q_heads * D, kvd = (size_t)s->kv_heads * D,
           hid = s->hidden && tensor_layers(c, T_GATE) ? (size_t)s->hidden : 1; /* experts: their own scratch */
    const Backend *be = env->be;
    d->q = be->alloc(f * t * qd);
    d->k = be->alloc(f * t * kvd);
    d->v = be->alloc(f * t * kvd);
    d->att = be->alloc(f * t * qd);
    d->lse = be->alloc(f * t * (size_t)s->q_heads);
    d->hb = be->alloc(f * t * hid);
    d->hb2 = be->alloc(f * t * hid);
    if (env->model->w.moe) moe_reserve(env, &d->moe, T);
    d->cap = T;
}

/* RoPE on x's heads (T, heads, head_dim) in place: whole, or their first
 * d->rotary dimensions (rows of d->rotary, head_dim apart) */
static void rope_heads(const LayerEnv *env, const Dense *d, float *x, int T, int heads)
{
    const Config *c = &env->model->cfg;
    int D = c->head_dim;
    env->be->rope(x, D, x, D, env->att->step.d_pos, T, heads, d->rotary, d->inv_freq, d->rope_scale, c->rope_style);
}

static void dense_forward(const LayerEnv *env, void *state, int l)
{
    Dense *d = state;
    const DenseLayer *lw = &d->layer[l];
    const Config *c = &env->model->cfg;
    const Shard *s = &env->model->shard;
    const Backend *be = env->be;
    int T = env->att->step.T, dim = c->dim, D = c->head_dim, qd = s->q_heads * D, kvd = s->kv_heads * D;

    /* attention block: column-parallel Q/K/V, this rank's heads */
    be->rmsnorm(env->xb, dim, env->x, dim, lw->rms_att, T, dim, c->norm_eps);
    layer_matmul(env, d->q, env->xb, lw->wq, T, dim, qd);
    layer_matmul(env, d->k, env->xb, lw->wk, T, dim, kvd);
    layer_matmul(env, d->v, env->xb, lw->wv, T, dim, kvd);
    if (lw->bq) {
        be->add_bias(d->q, lw->bq, T, qd);
        be->add_bias(d->k, lw->bk, T, kvd);
        be->add_bias(d->v, lw->bv, T, kvd);
    }
    if (lw->q_norm) { /* per head, before RoPE */
        be->rmsnorm(d->q, D, d->q, D, lw->q_norm, T * s->q_heads, D, c->norm_eps);
        be->rmsnorm(d->k, D, d->k, D, lw->k_norm, T * s->kv_heads, D, c->norm_eps);
    }
    rope_heads(env, d, d->q, T, s->q_heads);
    rope_heads(env, d, d->k, T, s->kv_heads);
    layer_attention(env, l, lw->sliding, d->q, d->k, d->v, d->att, d->lse);
    /* row-parallel output projection, summed over the TP group */
    layer_matmul_rows(env, env->parts, d->att, lw->wo, T, qd, dim);
    layer_residual(env, lw->bo, T);

    /* feed-forward block: column-parallel gate/up, row-parallel down; or
     * the experts, each split the same way */
    be->rmsnorm(env->xb, dim, env->x, dim, lw->rms_ffn, T, dim, c->norm_eps);
    if (lw->is_moe) {
        moe_block(env, &lw->moe, &d->moe, l, env->xb, T);
        return;
    }
    layer_swiglu(env, &lw->ffn, env->parts, env->xb, T, s->hidden, d->hb, d->hb2);
    layer_residual(env, lw->b_down, T);
}

static void dense_idle(const LayerEnv *env, void *state, int l)
{
    Dense *d = state;
    if (d->layer[l].is_moe) moe_block(env, &d->layer[l].moe, &d->moe, l, NULL, 0);
}

const LayerOps dense_layer_ops = {
    .name = "dense",
    .attn_shape = dense_attn_shape,
    .load = dense_load,
    .release = dense_release,
    .reserve = dense_reserve,
    .forward = dense_forward,
    .idle = dense_idle,
};
