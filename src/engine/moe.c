#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void moe_load(const LayerEnv *env, Uploads *u, const MoeLayer *h, MoeWeights *w)
{
    const Config *c = &env->model->cfg;
    const Shard *s = &env->model->shard;
    size_t E = (size_t)c->m.n_routed_experts, per = (size_t)s->moe_hidden * c->dim;
    w->router = upload_f32_matrix(env, u, h->router, E * (size_t)c->dim);
    w->router_bias = h->router_bias ? upload_vector(env, u, h->router_bias, E) : NULL;
    /* the experts of each kind are one array (model.c): one stack each */
    w->gate = upload_matrix(env, u, h->e_gate, E * per);
    w->up = upload_matrix(env, u, h->e_up, E * per);
    w->down = upload_matrix(env, u, h->e_down, E * per);
    size_t sh = (size_t)s->shared_hidden, dim = (size_t)c->dim;
    if (h->s_gate.data)
        w->shared = (SwiGlu){.gate = upload_matrix(env, u, h->s_gate, sh * dim),
                             .up = upload_matrix(env, u, h->s_up, sh * dim),
                             .down = upload_matrix(env, u, h->s_down, dim * sh)};
}

void moe_free(MoeWeights *w) { memset(w, 0, sizeof *w); }

void moe_free_scratch(const LayerEnv *env, MoeScratch *s)
{
    void *dev[] = {s->logits, s->hg, s->hu, s->yd, s->rows, s->weights, s->slots, s->start};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) env->be->release(dev[i]);
    memset(s, 0, sizeof *s);
}

void moe_reserve(const LayerEnv *env, MoeScratch *s, int T)
{
    if (T <= s->cap) return;
    moe_free_scratch(env, s);
    const MlaConfig *m = &env->model->cfg.m;
    const Backend *be = env->be;
    size_t t = (size_t)T, dim = (size_t)env->model->cfg.dim, E = (size_t)m->n_routed_experts,
           K = (size_t)m->experts_per_token, f = sizeof(float),
           wide = (size_t)env->model->shard.moe_hidden, chunks = (size_t)env->model->shard.chunks;
    size_t sw = (size_t)env->model->shard.shared_hidden;
    if (sw > wide * K) wide = (sw + K - 1) / K; /* the shared experts' T rows use the same scratch */
    s->logits = be->alloc(f * t * E);
    s->hg = be->alloc(f * t * K * wide);
    s->hu = be->alloc(f * t * K * wide);
    s->yd = be->alloc(f * chunks * t * K * dim);
    s->rows = be->alloc(sizeof(int) * t * K);
    s->weights = be->alloc(f * t * K);
    s->slots = be->alloc(sizeof(int) * t * K);
    s->start = be->alloc(sizeof(int) * (E + 1));
    s->cap = T;
}

void moe_forward(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, float *y, const float *x, int T)
{
    const Config *c = &env->model->cfg;
    const MlaConfig *m = &c->m;
    const Backend *be = env->be;
    int E = m->n_routed_experts, K = m->experts_per_token, dim = c->dim, mh = env->model->shard.moe_hidden,
        P = T * K, chunks = env->model->shard.chunks, cin = mh / chunks;
    MoeRouting r = {.experts = E, .per_token = K, .groups = m->n_group > 0 ? m->n_group : 1,
                    .topk_group = m->topk_group, .v3 = m->v3,
                    .grouped = m->v3 || m->route == ROUTE_GROUP_LIMITED_GREEDY, .norm_topk = m->norm_topk_prob,
                    .scaling = m->routed_scaling_factor};
    layer_matmul(env, s->logits, x, w->router, T, dim, E);
    /* routing, the experts' GEMMs and the weighted sum all stay on the
     * device: the host never learns which experts a token chose */
    be->moe_route(&r, s->logits, w->router_bias, T, s->rows, s->weights, s->slots, s->start);
    double t0 = layer_clock(env);
    size_t per = (size_t)mh * dim;
    be->moe_matmul(s->hg, x, dim, s->rows, s->start, E, P, w->gate, per, dim, mh);
    be->moe_matmul(s->hu, x, dim, s->rows, s->start, E, P, w->up, per, dim, mh);
    be->silu_mul(s->hg, s->hu, (size_t)P * mh);
    /* each K chunk of the down projection (layer_matmul_rows) apart, and
     * each chunk's output sums the experts in order, then the shared
     * experts: the same in every chunk on every layout */
    for (int ch = 0; ch < chunks; ch++)
        be->moe_matmul(s->yd + (size_t)ch * P * dim, s->hg + (size_t)ch * cin, mh, NULL, s->start, E, P,
                       weight_at(w->down, (size_t)ch * dim * cin), per, cin, dim);
    env->tm->matmul += layer_clock(env) - t0;
    size_t n = (size_t)T * dim;
    for (int ch = 0; ch < chunks; ch++)
        be->moe_combine(y + ch * n, s->yd + (size_t)ch * P * dim, s->slots, s->weights, T, K, dim);
    if (w->shared.gate.data) {
        layer_swiglu(env, &w->shared, s->yd, x, T, env->model->shard.shared_hidden, s->hg, s->hu);
        be->add(y, s->yd, chunks * n);
    }
}
