#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static SwiGlu upload_swiglu(const LayerEnv *env, Uploads *u, const float *gate, const float *up, const float *down,
                            size_t hidden)
{
    size_t dim = (size_t)env->model->cfg.dim;
    return (SwiGlu){.gate = upload_f32_matrix(env, u, gate, hidden * dim), .up = upload_f32_matrix(env, u, up, hidden * dim),
                    .down = upload_f32_matrix(env, u, down, dim * hidden)};
}

void moe_load(const LayerEnv *env, Uploads *u, int layer, MoeWeights *w)
{
    const Config *c = &env->model->cfg;
    const Shard *s = &env->model->shard;
    const MlaLayer *h = &env->model->w.mla[layer];
    size_t E = (size_t)c->m.n_routed_experts;
    w->router = upload_f32_matrix(env, u, h->router, E * (size_t)c->dim);
    w->router_bias = h->router_bias; /* the routing runs on the host */
    w->experts = xcalloc(E, sizeof(SwiGlu));
    for (size_t x = 0; x < E; x++)
        w->experts[x] = upload_swiglu(env, u, h->e_gate[x], h->e_up[x], h->e_down[x], (size_t)s->moe_hidden);
    w->shared = upload_swiglu(env, u, h->s_gate, h->s_up, h->s_down, (size_t)s->shared_hidden);
}

void moe_free(MoeWeights *w)
{
    free(w->experts);
    memset(w, 0, sizeof *w);
}

void moe_free_scratch(const LayerEnv *env, MoeScratch *s)
{
    void *dev[] = {s->logits, s->xg, s->hg, s->hu, s->yd, s->zero, s->d_rows, s->d_weights};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) env->be->release(dev[i]);
    void *host[] = {s->h_logits, s->wt, s->wsorted, s->score, s->choice, s->gscore, s->idx, s->rows, s->start,
                    s->fill, s->keep, s->taken};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    memset(s, 0, sizeof *s);
}

void moe_reserve(const LayerEnv *env, MoeScratch *s, int T)
{
    if (T <= s->cap) return;
    moe_free_scratch(env, s);
    const MlaConfig *m = &env->model->cfg.m;
    const Backend *be = env->be;
    size_t t = (size_t)T, dim = (size_t)env->model->cfg.dim, E = (size_t)m->n_routed_experts,
           K = (size_t)m->experts_per_token, G = (size_t)(m->n_group > 0 ? m->n_group : 1), f = sizeof(float),
           wide = (size_t)m->moe_hidden * (m->n_shared_experts > 1 ? (size_t)m->n_shared_experts : 1),
           chunks = (size_t)env->model->shard.chunks;
    s->logits = be->alloc(f * t * E);
    s->xg = be->alloc(f * t * K * dim);
    s->hg = be->alloc(f * t * K * wide);
    s->hu = be->alloc(f * t * K * wide);
    s->yd = be->alloc(f * chunks * t * K * dim);
    s->d_rows = be->alloc(sizeof(int) * t * K);
    s->d_weights = be->alloc(f * t * K);
    float *zero = xcalloc(chunks * t * dim, f);
    s->zero = be->alloc(f * chunks * t * dim);
    be->upload(s->zero, zero, f * chunks * t * dim);
    free(zero);
    s->h_logits = xmalloc(f * t * E);
    s->wt = xmalloc(f * t * K);
    s->wsorted = xmalloc(f * t * K);
    s->idx = xmalloc(sizeof(int) * t * K);
    s->rows = xmalloc(sizeof(int) * t * K);
    s->start = xmalloc(sizeof(int) * (E + 1));
    s->fill = xmalloc(sizeof(int) * E);
    s->score = xmalloc(f * E);
    s->choice = xmalloc(f * E);
    s->gscore = xmalloc(f * G);
    s->keep = xmalloc(sizeof(int) * G);
    s->taken = xmalloc(E);
    s->cap = T;
}

/* Token t's experts and their weights, as transformers' DeepSeek routers
 * choose them (V3: sigmoid scores, the correction bias for the choice only,
 * groups by the sum of their two best; V2: softmax, greedy or by each
 * group's best); equal scores go to the lower index. */
static void route(const MlaConfig *m, const float *logits, const float *bias, MoeScratch *rs, int *idx, float *weight)
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

void moe_forward(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, float *y, const float *x, int T)
{
    const Config *c = &env->model->cfg;
    const MlaConfig *m = &c->m;
    const Backend *be = env->be;
    int E = m->n_routed_experts, K = m->experts_per_token, dim = c->dim, mh = env->model->shard.moe_hidden;
    layer_matmul(env, s->logits, x, w->router, T, dim, E);
    be->download(s->h_logits, s->logits, sizeof(float) * (size_t)T * E);
    for (int t = 0; t < T; t++)
        route(m, s->h_logits + (size_t)t * E, w->router_bias, s, s->idx + (size_t)t * K, s->wt + (size_t)t * K);
    /* the step's (token, weight) pairs grouped by expert, tokens in order */
    int *start = s->start;
    memset(start, 0, sizeof(int) * (size_t)(E + 1));
    for (int i = 0; i < T * K; i++) start[s->idx[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    memcpy(s->fill, start, sizeof(int) * (size_t)E);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < K; n++) {
            int e = s->idx[t * K + n], at = s->fill[e]++;
            s->rows[at] = t;
            s->wsorted[at] = s->wt[t * K + n];
        }
    be->upload(s->d_rows, s->rows, sizeof(int) * (size_t)T * K);
    be->upload(s->d_weights, s->wsorted, sizeof(float) * (size_t)T * K);
    /* each K chunk of the output (layer_matmul_rows) sums the experts in
     * order, then the shared experts: the same in every chunk on every layout */
    int chunks = env->model->shard.chunks;
    size_t n = (size_t)T * dim;
    be->copy(y, s->zero, sizeof(float) * chunks * n);
    for (int e = 0; e < E; e++) {
        int R = start[e + 1] - start[e];
        if (!R) continue;
        be->gather_rows(s->xg, x, s->d_rows + start[e], R, dim);
        layer_swiglu(env, &w->experts[e], s->yd, s->xg, R, mh, s->hg, s->hu);
        for (int c = 0; c < chunks; c++)
            be->scatter_add_rows(y + c * n, s->yd + (size_t)c * R * dim, s->d_rows + start[e],
                                 s->d_weights + start[e], R, dim);
    }
    if (w->shared.gate.data) {
        layer_swiglu(env, &w->shared, s->yd, x, T, env->model->shard.shared_hidden, s->hg, s->hu);
        be->add(y, s->yd, chunks * n);
    }
}
