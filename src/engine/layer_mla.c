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

/* One layer as the backend holds it, this rank's heads. kv_b_proj is kept
 * per head: its key part transposed (kv_lora, nope), to fold into the
 * query, and its value part (v, kv_lora), applied after the attention. */
typedef struct {
    const float *rms_att, *rms_ffn, *q_a_norm, *kv_a_norm;
    WeightRef q_a, q_b, q, kv_a, o;
    WeightRef *uk_t, *uv;   /* per head */
    float *uk_t_host;       /* the transposed key parts, on the host */
    SwiGlu ffn;             /* a dense layer's feed-forward block */
    MoeWeights moe;         /* a MoE layer's */
    int is_moe;
} MlaLayerWeights;

/* scratch buffers, sized for cap tokens */
enum { B_QA, B_QRAW, B_KVA, B_QROPE, B_TA, B_TB, B_ATTV, B_Q, B_K, B_ATT, B_LSE, B_HB, B_HB2, B_N };

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
    *a = (AttnShape){.n_layers = c->n_layers, .q_heads = m->shard.q_heads, .kv_heads = 1, .head_dim = c->head_dim,
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
    st->layer = xcalloc((size_t)c->n_layers, sizeof(MlaLayerWeights));
    for (int l = 0; l < c->n_layers; l++) {
        const MlaLayer *hl = &h->mla[l];
        MlaLayerWeights *lw = &st->layer[l];
        /* the host copy stays while the backend may use it in place (the CPU does) */
        float *uk_t = lw->uk_t_host = xmalloc(sizeof(float) * H * kvl * nope);
        lw->rms_att = upload_vector(env, u, hl->rms_att, dim);
        lw->rms_ffn = upload_vector(env, u, hl->rms_ffn, dim);
        lw->q_a = upload_f32_matrix(env, u, hl->q_a, q_lora * dim);
        lw->q_a_norm = upload_vector(env, u, hl->q_a_norm, q_lora);
        lw->q_b = upload_f32_matrix(env, u, hl->q_b, H * qk * q_lora);
        lw->q = upload_f32_matrix(env, u, hl->q, H * qk * dim);
        lw->kv_a = upload_f32_matrix(env, u, hl->kv_a, (kvl + rope) * dim);
        lw->kv_a_norm = upload_vector(env, u, hl->kv_a_norm, kvl);
        lw->o = upload_f32_matrix(env, u, hl->o, dim * H * vd);
        lw->uk_t = xcalloc(H, sizeof(WeightRef));
        lw->uv = xcalloc(H, sizeof(WeightRef));
        for (size_t hd = 0; hd < H; hd++) {
            const float *rows = hl->kv_b + hd * (nope + vd) * kvl; /* W_uk (nope, kvl), then W_uv (vd, kvl) */
            float *t = uk_t + hd * kvl * nope;
            for (size_t i = 0; i < nope; i++)
                for (size_t j = 0; j < kvl; j++) t[j * nope + i] = rows[i * kvl + j];
            lw->uk_t[hd] = upload_f32_matrix(env, u, t, kvl * nope);
            lw->uv[hd] = upload_f32_matrix(env, u, rows + nope * kvl, vd * kvl);
        }
        lw->is_moe = MLA_MOE_LAYER(c, l);
        if (lw->is_moe) {
            moe_load(env, u, l, &lw->moe);
        } else {
            size_t hid = (size_t)s->hidden;
            lw->ffn = (SwiGlu){.gate = upload_f32_matrix(env, u, hl->gate, hid * dim), .up = upload_f32_matrix(env, u, hl->up, hid * dim),
                               .down = upload_f32_matrix(env, u, hl->down, dim * hid)};
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
    for (int l = 0; l < env->model->cfg.n_layers; l++) {
        MlaLayerWeights *lw = &st->layer[l];
        free(lw->uk_t);
        free(lw->uk_t_host);
        free(lw->uv);
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
    size_t H = (size_t)env->model->shard.q_heads, nope = (size_t)m->qk_nope_head_dim,
           rope = (size_t)m->qk_rope_head_dim, kvl = (size_t)m->kv_lora_rank, vd = (size_t)m->v_head_dim,
           t = (size_t)T, W = kvl + rope, tmp = kvl > nope ? kvl : nope,
           hid = env->model->shard.hidden ? (size_t)env->model->shard.hidden : 1;
    if ((size_t)c->dim > tmp) tmp = (size_t)c->dim;
    size_t sizes[B_N] = {[B_QA] = t * (size_t)(m->q_lora_rank ? m->q_lora_rank : 1), [B_QRAW] = t * H * (nope + rope),
                         [B_KVA] = t * W, [B_QROPE] = t * H * rope, [B_TA] = t * tmp, [B_TB] = t * tmp,
                         [B_ATTV] = t * H * vd, [B_Q] = t * H * W, [B_K] = t * W, [B_ATT] = t * H * kvl,
                         [B_LSE] = t * H, [B_HB] = t * hid, [B_HB2] = t * hid};
    for (int i = 0; i < B_N; i++) st->buf[i] = env->be->alloc(sizeof(float) * sizes[i]);
    if (m->n_routed_experts > 0) moe_reserve(env, &st->moe, T);
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
    be->rmsnorm(env->xb, env->x, lw->rms_att, T, dim, eps);
    if (m->q_lora_rank) {
        layer_matmul(env, b[B_QA], env->xb, lw->q_a, T, dim, m->q_lora_rank);
        be->rmsnorm(b[B_QA], b[B_QA], lw->q_a_norm, T, m->q_lora_rank, eps);
        layer_matmul(env, b[B_QRAW], b[B_QA], lw->q_b, T, m->q_lora_rank, H * qk);
    } else {
        layer_matmul(env, b[B_QRAW], env->xb, lw->q, T, dim, H * qk);
    }
    /* the cache row: normed latent, then the shared RoPE key */
    layer_matmul(env, b[B_KVA], env->xb, lw->kv_a, T, dim, W);
    be->strided_copy(b[B_TA], kvl, b[B_KVA], W, T, kvl);
    be->rmsnorm(b[B_TA], b[B_TA], lw->kv_a_norm, T, kvl, eps);
    be->strided_copy(k, W, b[B_TA], kvl, T, kvl);
    be->strided_copy(b[B_TB], rope, b[B_KVA] + kvl, W, T, rope);
    be->rope(b[B_TB], pos, T, 1, rope, st->inv_freq, st->rope_scale, c->rope_style);
    be->strided_copy(k + kvl, W, b[B_TB], rope, T, rope);
    /* queries: every head's RoPE part, then W_uk^T q_nope beside it */
    for (int h = 0; h < H; h++)
        be->strided_copy(b[B_QROPE] + (size_t)h * rope, H * rope, b[B_QRAW] + (size_t)h * qk + nope, H * qk, T, rope);
    be->rope(b[B_QROPE], pos, T, H, rope, st->inv_freq, st->rope_scale, c->rope_style);
    for (int h = 0; h < H; h++) {
        be->strided_copy(b[B_TA], nope, b[B_QRAW] + (size_t)h * qk, H * qk, T, nope);
        layer_matmul(env, b[B_TB], b[B_TA], lw->uk_t[h], T, nope, kvl);
        be->strided_copy(q + (size_t)h * W, H * W, b[B_TB], kvl, T, kvl);
        be->strided_copy(q + (size_t)h * W + kvl, H * W, b[B_QROPE] + (size_t)h * rope, H * rope, T, rope);
    }
    layer_attention(env, l, 0, q, k, NULL, b[B_ATT], b[B_LSE]);
    /* each head's value up-projection, then o_proj */
    for (int h = 0; h < H; h++) {
        be->strided_copy(b[B_TA], kvl, b[B_ATT] + (size_t)h * kvl, H * kvl, T, kvl);
        layer_matmul(env, b[B_TB], b[B_TA], lw->uv[h], T, kvl, vd);
        be->strided_copy(b[B_ATTV] + (size_t)h * vd, H * vd, b[B_TB], vd, T, vd);
    }
    layer_matmul_rows(env, env->parts, b[B_ATTV], lw->o, T, H * vd, dim);
    layer_residual(env, NULL, T);

    be->rmsnorm(env->xb, env->x, lw->rms_ffn, T, dim, eps);
    if (lw->is_moe) moe_forward(env, &lw->moe, &st->moe, env->parts, env->xb, T);
    else layer_swiglu(env, &lw->ffn, env->parts, env->xb, T, env->model->shard.hidden, b[B_HB], b[B_HB2]);
    layer_residual(env, NULL, T);
}

const LayerOps mla_layer_ops = {
    .name = "mla",
    .attn_shape = mla_attn_shape,
    .load = mla_load,
    .release = mla_release,
    .reserve = mla_reserve,
    .forward = mla_forward,
};
