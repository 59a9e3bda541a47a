/* DeepSeek-V2/V3 layers: multi-head latent attention in the absorbed form
 * over a cache of latent rows, and mixture-of-experts feed-forward layers.
 *
 * Attention. A position's cache row is its latent c (kv_lora_rank values,
 * after kv_a_layernorm) followed by its RoPE key (qk_rope_head_dim values,
 * shared by all heads): one KV "head" of head_dim = kv_lora_rank +
 * qk_rope_head_dim. Each head's query is its no-RoPE part times its key
 * up-projection (W_uk^T q, kv_lora_rank values) followed by its RoPE part,
 * so that q . row = q_nope . (W_uk c) + q_rope . k_rope, the score of the
 * expanded form. The attention (engine_attend, the same op and the same
 * context/new-part merge as every model) averages latent rows (the values
 * are their first kv_lora_rank floats); the value up-projection W_uv of
 * each head follows, then o_proj.
 *
 * Experts. The router runs on the host from the logits the backend makes
 * (the same choice on every rank and in every batch: ties go to the lower
 * expert index); the step's tokens are grouped by expert and each expert
 * runs one GEMM over its tokens; outputs are added, weighted, into the
 * layer's output in expert order, then the shared experts. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "util.h"

enum { B_QA, B_QRAW, B_KVA, B_QROPE, B_TA, B_TB, B_ATTV, B_XG, B_HG, B_HU, B_YD, B_RL, B_N };

static const void *track(Engine *e, const void *p)
{
    EngineWeights *w = &e->w;
    w->uploaded = xrealloc(w->uploaded, sizeof(void *) * (size_t)(w->n_uploaded + 1));
    w->uploaded[w->n_uploaded++] = p;
    return p;
}

static WeightRef up_typed(Engine *e, WeightRef host, size_t n)
{
    if (!host.data) return (WeightRef){0};
    WeightRef w = e->be->gemm_weights(host, n);
    track(e, w.data);
    return w;
}

/* MLA's matrices load as fp32 (model_load_as) */
static WeightRef up_matrix(Engine *e, const float *host, size_t n) { return up_typed(e, (WeightRef){host, DTYPE_F32, 0}, n); }

static const float *up_vector(Engine *e, const float *host, size_t n)
{
    return host ? track(e, e->be->weights(host, n)) : NULL;
}

void mla_upload(Engine *e)
{
    const Config *c = &e->model->cfg;
    const MlaConfig *m = &c->m;
    const Shard *s = &e->model->shard;
    const Weights *h = &e->model->w;
    EngineWeights *w = &e->w;
    size_t dim = (size_t)c->dim, H = (size_t)s->q_heads, nope = (size_t)m->qk_nope_head_dim,
           rope = (size_t)m->qk_rope_head_dim, kvl = (size_t)m->kv_lora_rank, vd = (size_t)m->v_head_dim,
           qk = nope + rope, q_lora = (size_t)m->q_lora_rank, mh = (size_t)s->moe_hidden,
           sh = (size_t)s->shared_hidden; /* this rank's heads and intermediate rows */
    w->token_embedding = up_vector(e, h->token_embedding, (size_t)c->vocab_size * dim);
    w->rms_final = up_vector(e, h->rms_final, dim);
    w->lm_head = up_typed(e, h->lm_head, (size_t)s->vocab * dim);
    Config rc = *c; /* RoPE runs over the rope part of a head */
    rc.head_dim = m->qk_rope_head_dim;
    float *freq = xmalloc(sizeof(float) * (rope / 2 + 1));
    rope_frequencies(&rc, freq, &w->rope_scale);
    w->inv_freq = up_vector(e, freq, rope / 2);
    e->rope_host = freq;
    w->mla = xcalloc((size_t)c->n_layers, sizeof(MlaLayerWeights));
    for (int l = 0; l < c->n_layers; l++) {
        const MlaLayer *hl = &h->mla[l];
        MlaLayerWeights *lw = &w->mla[l];
        /* the host copy stays while the backend may use it in place (the CPU does) */
        float *uk_t = lw->uk_t_host = xmalloc(sizeof(float) * H * kvl * nope);
        lw->rms_att = up_vector(e, hl->rms_att, dim);
        lw->rms_ffn = up_vector(e, hl->rms_ffn, dim);
        lw->q_a = up_matrix(e, hl->q_a, q_lora * dim);
        lw->q_a_norm = up_vector(e, hl->q_a_norm, q_lora);
        lw->q_b = up_matrix(e, hl->q_b, H * qk * q_lora);
        lw->q = up_matrix(e, hl->q, H * qk * dim);
        lw->kv_a = up_matrix(e, hl->kv_a, (kvl + rope) * dim);
        lw->kv_a_norm = up_vector(e, hl->kv_a_norm, kvl);
        lw->o = up_matrix(e, hl->o, dim * H * vd);
        lw->uk_t = xcalloc(H, sizeof(WeightRef));
        lw->uv = xcalloc(H, sizeof(WeightRef));
        for (size_t hd = 0; hd < H; hd++) {
            const float *rows = hl->kv_b + hd * (nope + vd) * kvl; /* W_uk (nope, kvl), then W_uv (vd, kvl) */
            float *t = uk_t + hd * kvl * nope;
            for (size_t i = 0; i < nope; i++)
                for (size_t j = 0; j < kvl; j++) t[j * nope + i] = rows[i * kvl + j];
            lw->uk_t[hd] = up_matrix(e, t, kvl * nope);
            lw->uv[hd] = up_matrix(e, rows + nope * kvl, vd * kvl);
        }
        lw->moe = MLA_MOE_LAYER(c, l);
        if (!lw->moe) {
            size_t hid = (size_t)s->hidden;
            lw->gate = up_matrix(e, hl->gate, hid * dim);
            lw->up = up_matrix(e, hl->up, hid * dim);
            lw->down = up_matrix(e, hl->down, dim * hid);
            continue;
        }
        size_t E = (size_t)m->n_routed_experts;
        lw->router = up_matrix(e, hl->router, E * dim);
        lw->router_bias = hl->router_bias; /* the routing runs on the host */
        lw->e_gate = xcalloc(E, sizeof(WeightRef));
        lw->e_up = xcalloc(E, sizeof(WeightRef));
        lw->e_down = xcalloc(E, sizeof(WeightRef));
        for (size_t x = 0; x < E; x++) {
            lw->e_gate[x] = up_matrix(e, hl->e_gate[x], mh * dim);
            lw->e_up[x] = up_matrix(e, hl->e_up[x], mh * dim);
            lw->e_down[x] = up_matrix(e, hl->e_down[x], dim * mh);
        }
        lw->s_gate = up_matrix(e, hl->s_gate, sh * dim);
        lw->s_up = up_matrix(e, hl->s_up, sh * dim);
        lw->s_down = up_matrix(e, hl->s_down, dim * sh);
    }
}

void mla_release(Engine *e)
{
    EngineWeights *w = &e->w;
    for (int i = 0; i < w->n_uploaded; i++)
        if (w->uploaded[i]) e->be->release_weights(w->uploaded[i]);
    for (int l = 0; l < e->model->cfg.n_layers; l++) {
        MlaLayerWeights *lw = &w->mla[l];
        free(lw->uk_t);
        free(lw->uk_t_host);
        free(lw->uv);
        free(lw->e_gate);
        free(lw->e_up);
        free(lw->e_down);
    }
    free(w->mla);
    free(w->uploaded);
    free(e->rope_host);
    w->mla = NULL;
    w->uploaded = NULL;
    w->n_uploaded = 0;
    e->rope_host = NULL;
}

void mla_free_scratch(Engine *e)
{
    for (int i = 0; i < B_N; i++)
        if (e->mla_buf[i]) e->be->release(e->mla_buf[i]);
    if (e->d_moe_rows) e->be->release(e->d_moe_rows);
    if (e->d_moe_weights) e->be->release(e->d_moe_weights);
    memset(e->mla_buf, 0, sizeof e->mla_buf);
    e->d_moe_rows = NULL;
    e->d_moe_weights = NULL;
    e->mla_cap = 0;
}

static void ensure_scratch(Engine *e, int T)
{
    if (T <= e->mla_cap) return;
    mla_free_scratch(e);
    const Config *c = &e->model->cfg;
    const MlaConfig *m = &c->m;
    size_t H = (size_t)c->n_heads, nope = (size_t)m->qk_nope_head_dim, rope = (size_t)m->qk_rope_head_dim,
           kvl = (size_t)m->kv_lora_rank, vd = (size_t)m->v_head_dim, t = (size_t)T,
           wide = (size_t)m->moe_hidden * (m->n_shared_experts > 1 ? (size_t)m->n_shared_experts : 1),
           tmp = kvl > nope ? kvl : nope, k = (size_t)(m->experts_per_token > 0 ? m->experts_per_token : 1);
    if ((size_t)c->dim > tmp) tmp = (size_t)c->dim;
    size_t sizes[B_N] = {[B_QA] = t * (size_t)(m->q_lora_rank ? m->q_lora_rank : 1), [B_QRAW] = t * H * (nope + rope),
                         [B_KVA] = t * (kvl + rope), [B_QROPE] = t * H * rope, [B_TA] = t * tmp, [B_TB] = t * tmp,
                         [B_ATTV] = t * H * vd, [B_XG] = t * k * (size_t)c->dim, [B_HG] = t * k * wide,
                         [B_HU] = t * k * wide, [B_YD] = t * k * (size_t)c->dim,
                         [B_RL] = t * (size_t)(m->n_routed_experts ? m->n_routed_experts : 1)};
    for (int i = 0; i < B_N; i++) e->mla_buf[i] = e->be->alloc(sizeof(float) * sizes[i]);
    e->d_moe_rows = e->be->alloc(sizeof(int) * t * k);
    e->d_moe_weights = e->be->alloc(sizeof(float) * t * k);
    e->mla_cap = T;
}

/* Token t's experts and their weights, as transformers' DeepSeek routers
 * choose them (V3: sigmoid scores, the correction bias for the choice only,
 * groups by the sum of their two best; V2: softmax, greedy or by each
 * group's best); equal scores go to the lower index. */
/* Scratch of one routing: sized by the config's experts and groups. */
typedef struct {
    float *score, *choice, *gscore;
    int *keep;
    char *taken;
} RouteScratch;

static void route(const MlaConfig *m, const float *logits, const float *bias, const RouteScratch *rs, int *idx,
                  float *weight)
{
    int E = m->n_routed_experts, G = m->n_group, per = E / G, K = m->experts_per_token;
    float *score = rs->score, *choice = rs->choice, *gscore = rs->gscore;
    int *keep = rs->keep;
    char *taken = rs->taken;
    memset(keep, 0, sizeof(int) * (size_t)G);
    memset(taken, 0, (size_t)E);
    if (m->v3) {
        for (int x = 0; x < E; x++) {
            score[x] = 1.0f / (1.0f + expf(-logits[x]));
            choice[x] = score[x] + (bias ? bias[x] : 0.0f);
        }
    } else {
        float mx = -INFINITY, sum = 0;
        for (int x = 0; x < E; x++) mx = logits[x] > mx ? logits[x] : mx;
        for (int x = 0; x < E; x++) sum += score[x] = expf(logits[x] - mx);
        for (int x = 0; x < E; x++) choice[x] = score[x] /= sum;
    }
    int grouped = m->v3 || m->route == ROUTE_GROUP_LIMITED_GREEDY;
    if (grouped) {
        for (int g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY; /* the best two (V3) or the best (V2) */
            for (int x = g * per; x < (g + 1) * per; x++) {
                if (choice[x] > a) b = a, a = choice[x];
                else if (choice[x] > b) b = choice[x];
            }
            gscore[g] = m->v3 ? a + b : a;
        }
        for (int n = 0; n < m->topk_group; n++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            keep[best] = 1;
        }
        /* experts outside the kept groups: -inf (V3) or 0 (V2), as transformers masks them */
        for (int x = 0; x < E; x++)
            if (!keep[x / per]) choice[x] = m->v3 ? -INFINITY : 0.0f;
    }
    for (int n = 0; n < K; n++) {
        int best = -1;
        for (int x = 0; x < E; x++)
            if (!taken[x] && (best < 0 || choice[x] > choice[best])) best = x;
        taken[best] = 1;
        idx[n] = best;
        weight[n] = m->v3 ? score[best] : choice[best];
    }
    if (m->v3 && m->norm_topk_prob) {
        float sum = 1e-20f;
        for (int n = 0; n < K; n++) sum += weight[n];
        for (int n = 0; n < K; n++) weight[n] /= sum;
    }
    for (int n = 0; n < K; n++) weight[n] *= m->routed_scaling_factor;
}

static void timed(Engine *e, float *y, const float *x, WeightRef w, int T, int in, int out)
{
    double t0 = now_s();
    e->be->matmul(y, x, w, T, in, out);
    e->tm->matmul += now_s() - t0;
}

/* the mixture-of-experts block: e->xb (normed) in, the block's output
 * (before the TP sum) in e->xb2 */
static void moe(Engine *e, const MlaLayerWeights *lw, int T)
{
    const Config *c = &e->model->cfg;
    const MlaConfig *m = &c->m;
    const Backend *be = e->be;
    int E = m->n_routed_experts, K = m->experts_per_token, dim = c->dim, mh = e->model->shard.moe_hidden;
    float *logits = xmalloc(sizeof(float) * (size_t)T * E);
    timed(e, e->mla_buf[B_RL], e->xb, lw->router, T, dim, E);
    be->download(logits, e->mla_buf[B_RL], sizeof(float) * (size_t)T * E);
    int *idx = xmalloc(sizeof(int) * (size_t)T * K), *rows = xmalloc(sizeof(int) * (size_t)T * K);
    float *wt = xmalloc(sizeof(float) * (size_t)T * K), *wsorted = xmalloc(sizeof(float) * (size_t)T * K);
    int *start = xcalloc((size_t)E + 1, sizeof(int));
    RouteScratch rsc = {xmalloc(sizeof(float) * (size_t)E), xmalloc(sizeof(float) * (size_t)E),
                        xmalloc(sizeof(float) * (size_t)m->n_group), xmalloc(sizeof(int) * (size_t)m->n_group),
                        xmalloc((size_t)E)};
    for (int t = 0; t < T; t++)
        route(m, logits + (size_t)t * E, lw->router_bias, &rsc, idx + (size_t)t * K, wt + (size_t)t * K);
    free(rsc.score);
    free(rsc.choice);
    free(rsc.gscore);
    free(rsc.keep);
    free(rsc.taken);
    /* the step's (token, weight) pairs grouped by expert, tokens in order */
    for (int i = 0; i < T * K; i++) start[idx[i] + 1]++;
    for (int x = 0; x < E; x++) start[x + 1] += start[x];
    int *fill = xmalloc(sizeof(int) * (size_t)E);
    memcpy(fill, start, sizeof(int) * (size_t)E);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < K; n++) {
            int x = idx[t * K + n], at = fill[x]++;
            rows[at] = t;
            wsorted[at] = wt[t * K + n];
        }
    be->upload(e->d_moe_rows, rows, sizeof(int) * (size_t)T * K);
    be->upload(e->d_moe_weights, wsorted, sizeof(float) * (size_t)T * K);
    float *zero = xcalloc((size_t)T * dim, sizeof(float));
    be->upload(e->xb2, zero, sizeof(float) * (size_t)T * dim);
    free(zero);
    float *xg = e->mla_buf[B_XG], *hg = e->mla_buf[B_HG], *hu = e->mla_buf[B_HU], *yd = e->mla_buf[B_YD];
    for (int x = 0; x < E; x++) {
        int R = start[x + 1] - start[x];
        if (!R) continue;
        be->gather_rows(xg, e->xb, e->d_moe_rows + start[x], R, dim);
        timed(e, hg, xg, lw->e_gate[x], R, dim, mh);
        timed(e, hu, xg, lw->e_up[x], R, dim, mh);
        be->silu_mul(hg, hu, (size_t)R * mh);
        timed(e, yd, hg, lw->e_down[x], R, mh, dim);
        be->scatter_add_rows(e->xb2, yd, e->d_moe_rows + start[x], e->d_moe_weights + start[x], R, dim);
    }
    if (lw->s_gate.data) {
        int sh = e->model->shard.shared_hidden;
        timed(e, hg, e->xb, lw->s_gate, T, dim, sh);
        timed(e, hu, e->xb, lw->s_up, T, dim, sh);
        be->silu_mul(hg, hu, (size_t)T * sh);
        timed(e, yd, hg, lw->s_down, T, sh, dim);
        be->add(e->xb2, yd, (size_t)T * dim);
    }
    free(fill);
    free(start);
    free(logits);
    free(idx);
    free(rows);
    free(wt);
    free(wsorted);
}

void mla_layer(Engine *e, int l, const Chunk *chunks, const int *const *tables, int n_chunks, int T, int has_context)
{
    const Config *c = &e->model->cfg;
    const MlaConfig *m = &c->m;
    const Backend *be = e->be;
    const MlaLayerWeights *lw = &e->w.mla[l];
    ensure_scratch(e, T);
    int H = e->model->shard.q_heads, dim = c->dim, nope = m->qk_nope_head_dim, rope = m->qk_rope_head_dim,
        kvl = m->kv_lora_rank, vd = m->v_head_dim, qk = nope + rope, W = kvl + rope;
    float **b = e->mla_buf, eps = c->norm_eps;
    double t0 = now_s();
    be->rmsnorm(e->xb, e->x, lw->rms_att, T, dim, eps);
    if (m->q_lora_rank) {
        timed(e, b[B_QA], e->xb, lw->q_a, T, dim, m->q_lora_rank);
        be->rmsnorm(b[B_QA], b[B_QA], lw->q_a_norm, T, m->q_lora_rank, eps);
        timed(e, b[B_QRAW], b[B_QA], lw->q_b, T, m->q_lora_rank, H * qk);
    } else {
        timed(e, b[B_QRAW], e->xb, lw->q, T, dim, H * qk);
    }
    /* the cache row: normed latent, then the shared RoPE key */
    timed(e, b[B_KVA], e->xb, lw->kv_a, T, dim, W);
    be->strided_copy(b[B_TA], kvl, b[B_KVA], W, T, kvl);
    be->rmsnorm(b[B_TA], b[B_TA], lw->kv_a_norm, T, kvl, eps);
    be->strided_copy(e->k, W, b[B_TA], kvl, T, kvl);
    be->strided_copy(b[B_TB], rope, b[B_KVA] + kvl, W, T, rope);
    be->rope(b[B_TB], e->d_pos, T, 1, rope, e->w.inv_freq, e->w.rope_scale, c->rope_style);
    be->strided_copy(e->k + kvl, W, b[B_TB], rope, T, rope);
    /* queries: every head's RoPE part, then W_uk^T q_nope beside it */
    for (int h = 0; h < H; h++)
        be->strided_copy(b[B_QROPE] + (size_t)h * rope, H * rope, b[B_QRAW] + (size_t)h * qk + nope, H * qk, T, rope);
    be->rope(b[B_QROPE], e->d_pos, T, H, rope, e->w.inv_freq, e->w.rope_scale, c->rope_style);
    for (int h = 0; h < H; h++) {
        be->strided_copy(b[B_TA], nope, b[B_QRAW] + (size_t)h * qk, H * qk, T, nope);
        timed(e, b[B_TB], b[B_TA], lw->uk_t[h], T, nope, kvl);
        be->strided_copy(e->q + (size_t)h * W, H * W, b[B_TB], kvl, T, kvl);
        be->strided_copy(e->q + (size_t)h * W + kvl, H * W, b[B_QROPE] + (size_t)h * rope, H * rope, T, rope);
    }
    engine_self_attention(e, chunks, tables, n_chunks, l, T, has_context, H, kvl, W);
    /* each head's value up-projection, then o_proj */
    for (int h = 0; h < H; h++) {
        be->strided_copy(b[B_TA], kvl, e->att + (size_t)h * kvl, H * kvl, T, kvl);
        timed(e, b[B_TB], b[B_TA], lw->uv[h], T, kvl, vd);
        be->strided_copy(b[B_ATTV] + (size_t)h * vd, H * vd, b[B_TB], vd, T, vd);
    }
    e->tm->attention += now_s() - t0;
    timed(e, e->xb2, b[B_ATTV], lw->o, T, H * vd, dim);
    comm_allreduce_sum(e->comm, e->xb2, T * dim, e->topo->tp_comm);
    be->add(e->x, e->xb2, (size_t)T * dim);

    be->rmsnorm(e->xb, e->x, lw->rms_ffn, T, dim, eps);
    if (lw->moe) {
        moe(e, lw, T);
    } else {
        int hid = e->model->shard.hidden;
        timed(e, e->hb, e->xb, lw->gate, T, dim, hid);
        timed(e, e->hb2, e->xb, lw->up, T, dim, hid);
        be->silu_mul(e->hb, e->hb2, (size_t)T * hid);
        timed(e, e->xb2, e->hb, lw->down, T, hid, dim);
    }
    comm_allreduce_sum(e->comm, e->xb2, T * dim, e->topo->tp_comm);
    be->add(e->x, e->xb2, (size_t)T * dim);
}
