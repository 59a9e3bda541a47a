#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void engine_init(Engine *e, const Model *m, const Backend *be, Timings *tm)
{
    memset(e, 0, sizeof *e);
    e->model = m;
    e->be = be;
    e->tm = tm;
}

static void free_activations(Engine *e)
{
    float **bufs[] = {&e->x, &e->xb, &e->xb2, &e->q, &e->k, &e->v, &e->att, &e->lse,
                      &e->att_ctx, &e->lse_ctx, &e->hb, &e->hb2, &e->xf};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    free(e->pos);
    free(e->kp);
    free(e->vp);
    free(e->n_keys);
}

void engine_free(Engine *e)
{
    for (int i = 0; i < e->n_slots; i++) {
        free(e->k_cache[i]);
        free(e->v_cache[i]);
    }
    free(e->k_cache);
    free(e->v_cache);
    free(e->slot_cap);
    free_activations(e);
    memset(e, 0, sizeof *e);
}

/* Grows the activation buffers to hold T tokens. */
static void ensure_capacity(Engine *e, int T)
{
    if (T <= e->cap_T) return;
    free_activations(e);
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    size_t qd = (size_t)s->q_heads * c->head_dim, kvd = (size_t)s->kv_heads * c->head_dim;
    size_t width = (size_t)c->dim > qd ? (size_t)c->dim : qd;
    e->cap_T = T;
    e->x = xmalloc(sizeof(float) * T * c->dim);
    e->xb = xmalloc(sizeof(float) * T * width);
    e->xb2 = xmalloc(sizeof(float) * T * c->dim);
    e->xf = xmalloc(sizeof(float) * T * c->dim);
    e->q = xmalloc(sizeof(float) * T * qd);
    e->k = xmalloc(sizeof(float) * T * kvd);
    e->v = xmalloc(sizeof(float) * T * kvd);
    e->att = xmalloc(sizeof(float) * T * qd);
    e->att_ctx = xmalloc(sizeof(float) * T * qd);
    e->lse = xmalloc(sizeof(float) * T * s->q_heads);
    e->lse_ctx = xmalloc(sizeof(float) * T * s->q_heads);
    e->hb = xmalloc(sizeof(float) * T * s->hidden);
    e->hb2 = xmalloc(sizeof(float) * T * s->hidden);
    e->pos = xmalloc(sizeof(int) * T);
    e->kp = xmalloc(sizeof(float *) * T);
    e->vp = xmalloc(sizeof(float *) * T);
    e->n_keys = xmalloc(sizeof(int) * T);
}

static size_t kv_row(const Engine *e)
{
    return (size_t)e->model->shard.kv_heads * e->model->cfg.head_dim;
}

int engine_seq_alloc(Engine *e, int cap)
{
    int slot = 0;
    while (slot < e->n_slots && e->slot_cap[slot]) slot++;
    if (slot == e->n_slots) {
        e->n_slots++;
        e->k_cache = xrealloc(e->k_cache, sizeof(float *) * e->n_slots);
        e->v_cache = xrealloc(e->v_cache, sizeof(float *) * e->n_slots);
        e->slot_cap = xrealloc(e->slot_cap, sizeof(int) * e->n_slots);
    }
    size_t n = (size_t)e->model->cfg.n_layers * cap * kv_row(e);
    e->k_cache[slot] = xmalloc(sizeof(float) * n);
    e->v_cache[slot] = xmalloc(sizeof(float) * n);
    e->slot_cap[slot] = cap;
    return slot;
}

void engine_seq_free(Engine *e, int slot)
{
    free(e->k_cache[slot]);
    free(e->v_cache[slot]);
    e->k_cache[slot] = e->v_cache[slot] = NULL;
    e->slot_cap[slot] = 0;
}

size_t engine_kv_bytes(const Engine *e)
{
    size_t total = 0;
    for (int i = 0; i < e->n_slots; i++)
        total += 2 * sizeof(float) * (size_t)e->model->cfg.n_layers * e->slot_cap[i] * kv_row(e);
    return total;
}

static void timed_matmul(Engine *e, float *y, const float *x, const float *w, int T, int in, int out)
{
    double t0 = now_s();
    e->be->matmul(y, x, w, T, in, out);
    e->tm->matmul += now_s() - t0;
}

/* Points each token at the keys it attends to: in the context part the
 * sequence's cached positions [0, pos0); in the new part the chunk's own
 * keys up to and including itself (causal). */
static void attend(Engine *e, const Chunk *chunks, int n_chunks, int layer, int context, float *out, float *lse)
{
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    int kvd = s->kv_heads * c->head_dim;
    for (int i = 0, t = 0; i < n_chunks; i++) {
        const Chunk *ch = &chunks[i];
        size_t layer_off = (size_t)layer * e->slot_cap[ch->seq] * kvd;
        for (int j = 0; j < ch->n; j++, t++) {
            if (context) {
                e->kp[t] = e->k_cache[ch->seq] + layer_off;
                e->vp[t] = e->v_cache[ch->seq] + layer_off;
                e->n_keys[t] = ch->pos0;
            } else {
                e->kp[t] = e->k + (size_t)(t - j) * kvd;
                e->vp[t] = e->v + (size_t)(t - j) * kvd;
                e->n_keys[t] = j + 1;
            }
        }
    }
    int T = 0;
    for (int i = 0; i < n_chunks; i++) T += chunks[i].n;
    AttnBatch ab = {.T = T, .n_heads = s->q_heads, .n_kv_heads = s->kv_heads, .head_dim = c->head_dim,
                    .scale = 1.0f / sqrtf((float)c->head_dim), .q = e->q, .out = out, .lse = lse,
                    .k = e->kp, .v = e->vp, .n_keys = e->n_keys, .kv_stride = kvd};
    e->be->attention(&ab);
}

/* Copies the chunks' new K/V rows into their sequences' cache slots. */
static void kv_write(Engine *e, const Chunk *chunks, int n_chunks, int layer)
{
    int kvd = e->model->shard.kv_heads * e->model->cfg.head_dim;
    for (int i = 0, t = 0; i < n_chunks; i++) {
        const Chunk *ch = &chunks[i];
        size_t off = ((size_t)layer * e->slot_cap[ch->seq] + ch->pos0) * kvd;
        memcpy(e->k_cache[ch->seq] + off, e->k + (size_t)t * kvd, sizeof(float) * ch->n * kvd);
        memcpy(e->v_cache[ch->seq] + off, e->v + (size_t)t * kvd, sizeof(float) * ch->n * kvd);
        t += ch->n;
    }
}

void engine_forward(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, int all_logits, float *logits)
{
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    const Weights *w = &e->model->w;
    const Backend *be = e->be;
    int T = 0, has_context = 0;
    for (int i = 0; i < n_chunks; i++) {
        T += chunks[i].n;
        has_context |= chunks[i].pos0 > 0;
    }
    ensure_capacity(e, T);
    for (int i = 0, t = 0; i < n_chunks; i++)
        for (int j = 0; j < chunks[i].n; j++) e->pos[t++] = chunks[i].pos0 + j;
    int dim = c->dim, D = c->head_dim, hidden = s->hidden;
    int qd = s->q_heads * D, kvd = s->kv_heads * D;

    be->embedding(e->x, w->token_embedding, tokens, T, dim);
    for (int l = 0; l < c->n_layers; l++) {
        /* attention block */
        be->rmsnorm(e->xb, e->x, w->rms_att + (size_t)l * dim, T, dim, c->norm_eps);
        timed_matmul(e, e->q, e->xb, w->wq + (size_t)l * qd * dim, T, dim, qd);
        timed_matmul(e, e->k, e->xb, w->wk + (size_t)l * kvd * dim, T, dim, kvd);
        timed_matmul(e, e->v, e->xb, w->wv + (size_t)l * kvd * dim, T, dim, kvd);
        be->rope(e->q, e->pos, T, s->q_heads, D, c->rope_theta, c->rope_style);
        be->rope(e->k, e->pos, T, s->kv_heads, D, c->rope_theta, c->rope_style);
        double t0 = now_s();
        attend(e, chunks, n_chunks, l, 0, e->att, e->lse);
        if (has_context) {
            attend(e, chunks, n_chunks, l, 1, e->att_ctx, e->lse_ctx);
            be->merge_attention(e->att, e->lse, e->att_ctx, e->lse_ctx, T * s->q_heads, D);
        }
        kv_write(e, chunks, n_chunks, l);
        e->tm->attention += now_s() - t0;
        timed_matmul(e, e->xb2, e->att, w->wo + (size_t)l * dim * qd, T, qd, dim);
        be->add(e->x, e->xb2, (size_t)T * dim);

        /* feed-forward block */
        be->rmsnorm(e->xb, e->x, w->rms_ffn + (size_t)l * dim, T, dim, c->norm_eps);
        timed_matmul(e, e->hb, e->xb, w->w_gate + (size_t)l * hidden * dim, T, dim, hidden);
        timed_matmul(e, e->hb2, e->xb, w->w_up + (size_t)l * hidden * dim, T, dim, hidden);
        be->silu_mul(e->hb, e->hb2, (size_t)T * hidden);
        timed_matmul(e, e->xb2, e->hb, w->w_down + (size_t)l * dim * hidden, T, hidden, dim);
        be->add(e->x, e->xb2, (size_t)T * dim);
    }

    /* final norm and LM head, for the rows whose logits are wanted */
    int R = all_logits ? T : n_chunks;
    if (!all_logits)
        for (int i = 0, t = 0; i < n_chunks; i++) {
            t += chunks[i].n;
            memcpy(e->xb + (size_t)i * dim, e->x + (size_t)(t - 1) * dim, sizeof(float) * dim);
        }
    else
        memcpy(e->xb, e->x, sizeof(float) * (size_t)T * dim);
    be->rmsnorm(e->xf, e->xb, w->rms_final, R, dim, c->norm_eps);
    double t0 = now_s();
    be->matmul(logits, e->xf, w->lm_head, R, dim, s->vocab);
    e->tm->lm_head += now_s() - t0;
}
