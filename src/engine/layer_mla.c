/* DeepSeek-V2/V3 layers: multi-head latent attention in the absorbed form
 * over a cache of latent rows, then a dense or mixture-of-experts (moe.c)
 * feed-forward block.
 *
 * A position's cache row is its latent c (kv_lora_rank values, after
 * kv_a_layernorm) followed by its RoPE key (qk_rope_head_dim values, shared
 * by all heads): one KV "head" of head_dim = kv_lora_rank +
 * qk_rope_head_dim, and no separate values. Each head's query is its
 * no-RoPE part times its key up-projection (W_uk^T q_nope, kv_lora_rank
 * values) followed by its RoPE part, so that q . row = q_nope . (W_uk c) +
 * q_rope . k_rope, the score of the expanded form. The attention core
 * averages latent rows (the values are their first kv_lora_rank floats);
 * the value up-projection W_uv of each head follows, then o_proj. */
#include "layer_mla.h"

#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "util.h"

/* One layer as the backend holds it, this rank's heads. kv_b_proj comes
 * folded by the loader (model.h) into two stacks of per-head matrices,
 * each applied by one batched GEMM: its key parts transposed (kv_lora,
 * nope), to fold into the queries, and its value parts (v, kv_lora),
 * applied after the attention. */
typedef struct {
    const float *rms_att, *rms_ffn, *q_a_norm, *kv_a_norm;
    WeightRef q_a, q_b, q, kv_a, o;
    WeightRef uk_t, uv;     /* head h's matrix at h * kv_lora * nope (uk_t), h * v * kv_lora (uv) */
    SwiGlu ffn;             /* a dense layer's feed-forward block */
    MoeWeights moe;         /* a MoE layer's */
    int is_moe;
} MlaLayerWeights;

/* scratch buffers, sized for cap tokens */
enum { B_QA, B_QRAW, B_KVA, B_ATTV, B_Q, B_K, B_ATT, B_LSE, B_HB, B_HB2, B_N };

typedef struct {
    Uploads up;
    MlaLayerWeights *layer;
    const float *inv_freq;  /* (qk_rope_head_dim/2) */
    float rope_scale;
    float *rope_host;
    int cap;
    float *buf[B_N];
    MoeScratch moe;
} Mla;

static void mla_attn_shape(const Model *m, AttnShape *a)
{
    const Config *c = &m->cfg;
    *a = (AttnShape){.n_layers = layers_held(c), .q_heads = m->shard.q_heads, .kv_heads = 1, .head_dim = c->head_dim,
                     .v_dim = c->m.kv_lora_rank, .keys_only = 1, .scale = c->m.softmax_scale};
}

static void *mla_load(const LayerEnv *env)
{
    const Config *c = &env->model->cfg;
    const MlaConfig *m = &c->m;
    const Shard *s = &env->model->shard;
    const Weights *h = &env->model->w;
    Mla *st = xcalloc(1, sizeof *st);
    Uploads *u = &st->up;
    size_t dim = (size_t)c->dim, H = (size_t)s->q_heads, nope = (size_t)m->qk_nope_head_dim,
           rope = (size_t)m->qk_rope_head_dim, kvl = (size_t)m->kv_lora_rank, vd = (size_t)m->v_head_dim,
           qk = nope + rope, q_lora = (size_t)m->q_lora_rank; /* this rank's heads */
    st->inv_freq = upload_rope(env, u, m->qk_rope_head_dim, &st->rope_host, &st->rope_scale);
    st->layer = xcalloc((size_t)layers_held(c), sizeof(MlaLayerWeights));
    for (int l = 0; l < layers_held(c); l++) { /* and an MTP layer's decoder layer */
        const MlaLayer *hl = &h->mla[l];
        MlaLayerWeights *lw = &st->layer[l];
        lw->rms_att = upload_vector(env, u, hl->rms_att, dim);
        lw->rms_ffn = upload_vector(env, u, hl->rms_ffn, dim);
        lw->q_a = upload_matrix(env, u, hl->q_a, q_lora * dim);
        lw->q_a_norm = upload_vector(env, u, hl->q_a_norm, q_lora);
        lw->q_b = upload_matrix(env, u, hl->q_b, H * qk * q_lora);
        lw->q = upload_matrix(env, u, hl->q, H * qk * dim);
        lw->kv_a = upload_matrix(env, u, hl->kv_a, (kvl + rope) * dim);
        lw->kv_a_norm = upload_vector(env, u, hl->kv_a_norm, kvl);
        lw->o = upload_matrix(env, u, hl->o, dim * H * vd);
        lw->uk_t = upload_matrix(env, u, hl->uk_t, H * kvl * nope);
        lw->uv = upload_matrix(env, u, hl->uv, H * vd * kvl);
        lw->is_moe = MOE_LAYER(c, l);
        if (lw->is_moe) {
            moe_load(env, u, &hl->moe, &lw->moe);
        } else {
            size_t hid = (size_t)s->hidden;
            lw->ffn = (SwiGlu){.gate = upload_matrix(env, u, hl->gate, hid * dim),
                               .up = upload_matrix(env, u, hl->up, hid * dim),
                               .down = upload_matrix(env, u, hl->down, dim * hid)};
        }
    }
    return st;
}

static void free_scratch(const LayerEnv *env, Mla *st)
{
    for (int i = 0; i < B_N; i++)
        if (st->buf[i]) env->be->release(st->buf[i]);
    memset(st->buf, 0, sizeof st->buf);
    moe_free_scratch(env, &st->moe);
    st->cap = 0;
}

static void mla_release(const LayerEnv *env, void *state)
{
    Mla *st = state;
    free_scratch(env, st);
    uploads_release(env, &st->up);
    for (int l = 0; l < layers_held(&env->model->cfg); l++) {
        MlaLayerWeights *lw = &st->layer[l];
        moe_free(&lw->moe);
    }
    free(st->layer);
    free(st->rope_host);
    free(st);
}

static void mla_reserve(const LayerEnv *env, void *state, int T)
{
    Mla *st = state;
    if (T <= st->cap) return;
    free_scratch(env, st);
    const Config *c = &env->model->cfg;
    const MlaConfig *m = &c->m;
    const MoeConfig *moe = &c->moe;
    size_t H = (size_t)env->model->shard.q_heads, nope = (size_t)m->qk_nope_head_dim,
           rope = (size_t)m->qk_rope_head_dim, kvl = (size_t)m->kv_lora_rank, vd = (size_t)m->v_head_dim,
           t = (size_t)T, W = kvl + rope,
           hid = env->model->shard.hidden ? (size_t)env->model->shard.hidden : 1;
    size_t sizes[B_N] = {[B_QA] = t * (size_t)(m->q_lora_rank ? m->q_lora_rank : 1), [B_QRAW] = t * H * (nope + rope),
                         [B_KVA] = t * W, [B_ATTV] = t * H * vd, [B_Q] = t * H * W, [B_K] = t * W, [B_ATT] = t * H * kvl,
                         [B_LSE] = t * H, [B_HB] = t * hid, [B_HB2] = t * hid};
    for (int i = 0; i < B_N; i++) st->buf[i] = env->be->alloc(sizeof(float) * sizes[i]);
    if (moe->n_routed_experts > 0) moe_reserve(env, &st->moe, T);
    st->cap = T;
}

static void mla_forward(const LayerEnv *env, void *state, int l)
{
    Mla *st = state;
    const Config *c = &env->model->cfg;
    const MlaConfig *m = &c->m;
    const Backend *be = env->be;
    const MlaLayerWeights *lw = &st->layer[l];
    const int *pos = env->att->step.d_pos;
    int T = env->att->step.T, H = env->model->shard.q_heads, dim = c->dim, nope = m->qk_nope_head_dim,
        rope = m->qk_rope_head_dim, kvl = m->kv_lora_rank, vd = m->v_head_dim, qk = nope + rope, W = kvl + rope;
    float **b = st->buf, *q = b[B_Q], *k = b[B_K], eps = c->norm_eps;
    be->rmsnorm(env->xb, dim, env->x, dim, lw->rms_att, T, dim, eps);
    if (m->q_lora_rank) {
        int r = m->q_lora_rank;
        layer_matmul(env, b[B_QA], env->xb, lw->q_a, T, dim, r);
        be->rmsnorm(b[B_QA], r, b[B_QA], r, lw->q_a_norm, T, r, eps);
        layer_matmul(env, b[B_QRAW], b[B_QA], lw->q_b, T, m->q_lora_rank, H * qk);
    } else {
        layer_matmul(env, b[B_QRAW], env->xb, lw->q, T, dim, H * qk);
    }
    /* the cache row (W wide): the normed latent, then the shared RoPE
     * key, each read from kv_a's output row and written into its place */
    layer_matmul(env, b[B_KVA], env->xb, lw->kv_a, T, dim, W);
    be->rmsnorm(k, W, b[B_KVA], W, lw->kv_a_norm, T, kvl, eps);
    be->rope(k + kvl, W, b[B_KVA] + kvl, W, pos, T, 1, rope, st->inv_freq, st->rope_scale, c->rope_style);
    /* queries (rows of W per (token, head)): each head's W_uk^T q_nope (one
     * batched GEMM over the heads), and its RoPE part from the (token, head)
     * rows of q_raw, qk apart */
    layer_matmul_batched(env, q, H * W, (size_t)W, b[B_QRAW], H * qk, (size_t)qk, lw->uk_t, H, T, nope, kvl);
    be->rope(q + kvl, W, b[B_QRAW] + nope, qk, pos, T, H, rope, st->inv_freq, st->rope_scale, c->rope_style);
    layer_attention(env, l, 0, q, k, NULL, b[B_ATT], b[B_LSE]);
    /* each head's value up-projection (one batched GEMM), then o_proj */
    layer_matmul_batched(env, b[B_ATTV], H * vd, (size_t)vd, b[B_ATT], H * kvl, (size_t)kvl, lw->uv, H, T, kvl, vd);
    layer_matmul_rows(env, env->parts, b[B_ATTV], lw->o, T, H * vd, dim);
    layer_residual(env, NULL, T);

    be->rmsnorm(env->xb, dim, env->x, dim, lw->rms_ffn, T, dim, eps);
    if (lw->is_moe) {
        moe_block(env, &lw->moe, &st->moe, l, env->xb, T);
        return;
    }
    layer_swiglu(env, &lw->ffn, env->parts, env->xb, T, env->model->shard.hidden, b[B_HB], b[B_HB2]);
    layer_residual(env, NULL, T);
}

static void mla_idle(const LayerEnv *env, void *state, int l)
{
    Mla *st = state;
    if (st->layer[l].is_moe) moe_block(env, &st->layer[l].moe, &st->moe, l, NULL, 0);
}

const LayerOps mla_layer_ops = {
    .name = "mla",
    .attn_shape = mla_attn_shape,
    .load = mla_load,
    .release = mla_release,
    .reserve = mla_reserve,
    .forward = mla_forward,
    .idle = mla_idle,
};
