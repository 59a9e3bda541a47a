#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void moe_load(const LayerEnv *env, Uploads *u, const MoeLayer *h, MoeWeights *w)
{
    const Config *c = &env->model->cfg;
    const Shard *s = &env->model->shard;
    size_t E = (size_t)c->moe.n_routed_experts, per = (size_t)s->moe_hidden * c->dim, held = (size_t)s->experts;
    w->router = upload_f32_matrix(env, u, h->router, E * (size_t)c->dim);
    w->router_bias = h->router_bias ? upload_vector(env, u, h->router_bias, E) : NULL;
    /* the experts of each kind are one array (model.c): one stack each */
    w->gate = upload_matrix(env, u, h->e_gate, held * per);
    w->up = upload_matrix(env, u, h->e_up, held * per);
    w->down = upload_matrix(env, u, h->e_down, held * per);
    size_t sh = (size_t)s->shared_hidden, dim = (size_t)c->dim;
    if (h->s_gate.data)
        w->shared = (SwiGlu){.gate = upload_matrix(env, u, h->s_gate, sh * dim),
                             .up = upload_matrix(env, u, h->s_up, sh * dim),
                             .down = upload_matrix(env, u, h->s_down, dim * sh)};
}

void moe_free(MoeWeights *w) { memset(w, 0, sizeof *w); }

void moe_free_scratch(const LayerEnv *env, MoeScratch *s)
{
    void *dev[] = {s->logits, s->hg,   s->hu,   s->yd,     s->rows,   s->weights, s->slots, s->start, s->send,
                   s->ret,    s->routed, s->recv, s->back, s->d_rows, s->d_perm,  s->d_start};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) env->be->release(dev[i]);
    int *host[] = {s->h_start, s->h_count, s->h_rcount, s->h_rows, s->h_perm, s->h_lstart, s->h_ep};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    memset(s, 0, sizeof *s);
}

static int expert_parallel(const LayerEnv *env) { return env->topo && env->topo->expert_parallel; }

void moe_reserve(const LayerEnv *env, MoeScratch *s, int T)
{
    if (T <= s->cap) return;
    moe_free_scratch(env, s);
    const MoeConfig *moe = &env->model->cfg.moe;
    const Backend *be = env->be;
    size_t t = (size_t)T, dim = (size_t)env->model->cfg.dim, E = (size_t)moe->n_routed_experts,
           K = (size_t)moe->experts_per_token, f = sizeof(float),
           wide = (size_t)env->model->shard.moe_hidden, chunks = (size_t)env->model->shard.chunks;
    size_t sw = (size_t)env->model->shard.shared_hidden;
    s->logits = be->alloc(f * t * E);
    s->rows = be->alloc(sizeof(int) * t * K);
    s->weights = be->alloc(f * t * K);
    s->slots = be->alloc(sizeof(int) * t * K);
    s->start = be->alloc(sizeof(int) * (E + 1));
    s->cap = T;
    if (expert_parallel(env)) { /* the owners' buffers grow with the rows they receive (ep_reserve) */
        int N = env->topo->ep;
        s->send = be->alloc(f * t * K * dim);
        s->ret = be->alloc(f * t * K * dim);
        s->routed = be->alloc(f * t * dim);
        s->h_start = xmalloc(sizeof(int) * (E + 1));
        s->h_count = xmalloc(sizeof(int) * E);
        s->h_rcount = xmalloc(sizeof(int) * E);
        s->h_ep = xmalloc(sizeof(int) * (4 * (size_t)N + 2 * (size_t)env->topo->tp)); /* MPI counts, displacements */
        s->h_lstart = xmalloc(sizeof(int) * (E / (size_t)N + 1));
        s->d_start = be->alloc(sizeof(int) * (E / (size_t)N + 1));
        return;
    }
    if (sw > wide * K) wide = (sw + K - 1) / K; /* the shared experts' T rows use the same scratch */
    s->hg = be->alloc(f * t * K * wide);
    s->hu = be->alloc(f * t * K * wide);
    s->yd = be->alloc(f * chunks * t * K * dim);
}

static MoeRouting routing(const MoeConfig *m)
{
    return (MoeRouting){.experts = m->n_routed_experts, .per_token = m->experts_per_token,
                        .groups = m->n_group > 0 ? m->n_group : 1, .topk_group = m->topk_group, .v3 = m->sigmoid,
                        .grouped = m->sigmoid || m->route == ROUTE_GROUP_LIMITED_GREEDY, .norm_topk = m->norm_topk_prob,
                        .scaling = m->routed_scaling_factor};
}

/* The experts' SwiGLU on P (token, expert) pairs grouped by expert (start:
 * experts + 1 offsets; rows: each pair's row of x, NULL: x's rows in
 * order), this rank's moe_hidden rows of each: y (chunks x (P, dim)) holds
 * the down projection's K chunks apart (1: the whole of it), in s->hg and
 * s->hu's scratch; timed as matmul. */
static void experts_swiglu(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, float *y, const float *x,
                           const int *rows, const int *start, int experts, int P, int chunks)
{
    const Backend *be = env->be;
    int dim = env->model->cfg.dim, mh = env->model->shard.moe_hidden, cin = mh / chunks;
    size_t per = (size_t)mh * dim;
    double t0 = layer_clock(env);
    /* W4A4 (LayerEnv.nvfp4_act): each expert's input rows quantized with
     * that matrix's input scale, in pair order; the down projection's whole
     * rows, before its K chunks */
    int act = env->nvfp4_act && w->gate.dtype == DTYPE_FP4 && w->gate.scale8;
    const float *xa = act ? be->nvfp4_act(x, dim, rows, start, experts, P, w->gate, per, dim) : x;
    be->moe_matmul(s->hg, xa, dim, act ? NULL : rows, start, experts, P, w->gate, per, dim, mh, 1);
    xa = act ? be->nvfp4_act(x, dim, rows, start, experts, P, w->up, per, dim) : x;
    be->moe_matmul(s->hu, xa, dim, act ? NULL : rows, start, experts, P, w->up, per, dim, mh, 1);
    be->silu_mul(s->hg, s->hu, (size_t)P * mh);
    act = env->nvfp4_act && w->down.dtype == DTYPE_FP4 && w->down.scale8;
    const float *h = act ? be->nvfp4_act(s->hg, mh, NULL, start, experts, P, w->down, per, mh) : s->hg;
    be->moe_matmul(y, h, mh, NULL, start, experts, P, w->down, per, cin, dim, chunks);
    env->tm->matmul += layer_clock(env) - t0;
}

void moe_forward(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, float *y, const float *x, int T)
{
    const Config *c = &env->model->cfg;
    const MoeConfig *moe = &c->moe;
    const Backend *be = env->be;
    int E = moe->n_routed_experts, K = moe->experts_per_token, dim = c->dim, P = T * K,
        chunks = env->model->shard.chunks;
    MoeRouting r = routing(moe);
    layer_matmul(env, s->logits, x, w->router, T, dim, E);
    /* routing, the experts' GEMMs and the weighted sum all stay on the
     * device: the host never learns which experts a token chose */
    be->moe_route(&r, s->logits, w->router_bias, T, s->rows, s->weights, s->slots, s->start);
    /* each K chunk of the down projection (layer_matmul_rows) apart, and
     * each chunk's output sums the experts in order, then the shared
     * experts: the same in every chunk on every layout */
    experts_swiglu(env, w, s, s->yd, x, s->rows, s->start, E, P, chunks);
    size_t n = (size_t)T * dim;
    be->moe_combine(y, s->yd, s->slots, s->weights, T, K, dim, chunks);
    if (w->shared.gate.data) {
        layer_swiglu(env, &w->shared, s->yd, x, T, env->model->shard.shared_hidden, s->hg, s->hu);
        be->add(y, s->yd, chunks * n);
    }
}

/* The owner's buffers for P received pairs (and the shared experts' T
 * rows, which share hg and hu). */
static void ep_reserve(const LayerEnv *env, MoeScratch *s, int P, int T)
{
    const Shard *sh = &env->model->shard;
    size_t dim = (size_t)env->model->cfg.dim, f = sizeof(float);
    size_t need = (size_t)P, shared = (size_t)sh->shared_hidden * T;
    if (s->hg && need <= (size_t)s->cap_recv && shared <= (size_t)sh->moe_hidden * s->cap_recv) return;
    const Backend *be = env->be;
    void *dev[] = {s->hg, s->hu, s->yd, s->recv, s->back, s->d_rows, s->d_perm};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) be->release(dev[i]);
    free(s->h_rows);
    free(s->h_perm);
    /* room for half again as many, so that a few larger steps do not
     * reallocate each time */
    size_t cap = need + need / 2 + 16;
    while ((size_t)sh->moe_hidden * cap < shared) cap *= 2;
    size_t width = (size_t)sh->moe_hidden * cap;
    s->hg = be->alloc(f * width);
    s->hu = be->alloc(f * width);
    s->yd = be->alloc(f * cap * dim);
    s->recv = be->alloc(f * cap * dim);
    s->back = be->alloc(f * cap * dim);
    s->d_rows = be->alloc(sizeof(int) * cap);
    s->d_perm = be->alloc(sizeof(int) * cap);
    s->h_rows = xmalloc(sizeof(int) * cap);
    s->h_perm = xmalloc(sizeof(int) * cap);
    s->cap_recv = (int)cap;
}

/* The owner's received rows in expert order (sources in rank order within
 * an expert), for one GEMM per expert: rc[src * El + e] rows came from
 * rank src for local expert e, rank src's at rdispl[src]. s->h_rows lists
 * the rows in that order, s->h_perm returns each row's output to its
 * place; lstart (El + 1) where each expert's rows start. */
static void expert_order(MoeScratch *s, const int *rc, const int *rdispl, int N, int El, int *lstart)
{
    int at = 0;
    for (int e = 0; e < El; e++) {
        lstart[e] = at;
        for (int src = 0; src < N; src++) {
            int from = rdispl[src];
            for (int f = 0; f < e; f++) from += rc[src * El + f];
            for (int j = 0; j < rc[src * El + e]; j++, at++) {
                s->h_rows[at] = from + j;
                s->h_perm[from + j] = at;
            }
        }
    }
    lstart[El] = at;
}

/* Expert parallelism (docs/design.md, "Expert parallelism"). */
static void moe_block_ep(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, int l, const float *x, int T)
{
    const Config *c = &env->model->cfg;
    const MoeConfig *moe = &c->moe;
    const Shard *sh = &env->model->shard;
    const Topology *topo = env->topo;
    const Backend *be = env->be;
    int E = moe->n_routed_experts, K = moe->experts_per_token, dim = c->dim, N = topo->ep, El = sh->experts,
        tp = topo->tp;
    /* this TP rank's share of the step's rows: it routes them, sends them
     * and adds up their experts' outputs */
    int h0, H;
    balanced_part(T, tp, topo->tp_rank, &h0, &H);
    const float *xh = x + (size_t)h0 * dim;
    if (H) {
        MoeRouting r = routing(moe);
        layer_matmul(env, s->logits, xh, w->router, H, dim, E);
        be->moe_route(&r, s->logits, w->router_bias, H, s->rows, s->weights, s->slots, s->start);
        /* the counts MPI exchanges next: this copy's wait is MPI's
         * (CommStats.device_waits; /gpu/steps/mpi_syncs) */
        env->comm->device_waits++;
        be->download(s->h_start, s->start, sizeof(int) * (size_t)(E + 1));
        be->gather_rows(s->send, xh, s->rows, H * K, dim);
    } else {
        memset(s->h_start, 0, sizeof(int) * (size_t)(E + 1));
    }
    /* rank d owns experts [d El, (d + 1) El): the pairs, grouped by
     * expert, are already grouped by owner */
    int *cnt = s->h_count, *scount = s->h_ep, *sdispl = scount + N, *rcount = sdispl + N, *rdispl = rcount + N;
    for (int e = 0; e < E; e++) cnt[e] = s->h_start[e + 1] - s->h_start[e];
    for (int d = 0; d < N; d++) {
        sdispl[d] = s->h_start[d * El];
        scount[d] = s->h_start[(d + 1) * El] - sdispl[d];
    }
    /* rc[src * El + e]: the rows rank src sends to local expert e */
    int *rc = s->h_rcount;
    comm_alltoall_ints(env->comm, COMM_moe_dispatch, cnt, rc, El, GROUP_EP);
    int P = 0;
    for (int src = 0; src < N; src++) {
        rdispl[src] = P;
        rcount[src] = 0;
        for (int e = 0; e < El; e++) rcount[src] += rc[src * El + e];
        P += rcount[src];
    }
    ep_reserve(env, s, P, T);
    comm_alltoallv_rows(env->comm, COMM_moe_dispatch, s->send, scount, sdispl, s->recv, rcount, rdispl, dim,
                        GROUP_EP);
    int *lstart = s->h_lstart;
    expert_order(s, rc, rdispl, N, El, lstart);
    MoeCounts *mc = env->moe_counts;
    if (mc) {
        long long *got = mc->received + (size_t)l * E + sh->expert0, *sent = mc->sent + (size_t)l * E;
        for (int e = 0; e < El; e++) got[e] += lstart[e + 1] - lstart[e];
        for (int e = 0; e < E; e++) sent[e] += cnt[e];
    }
    if (P) {
        be->upload(s->d_rows, s->h_rows, sizeof(int) * (size_t)P);
        be->upload(s->d_perm, s->h_perm, sizeof(int) * (size_t)P);
        be->upload(s->d_start, lstart, sizeof(int) * (size_t)(El + 1));
        experts_swiglu(env, w, s, s->yd, s->recv, s->d_rows, s->d_start, El, P, 1); /* whole experts */
        be->gather_rows(s->back, s->yd, s->d_perm, P, dim);
    }
    /* the outputs back to the ranks that sent the rows, into each pair's
     * place, and each token's added in expert order */
    comm_alltoallv_rows(env->comm, COMM_moe_combine, s->back, rcount, rdispl, s->ret, scount, sdispl, dim,
                        GROUP_EP);
    if (!T) return; /* the whole TP group is without tokens */
    if (H) be->moe_combine(s->routed + (size_t)h0 * dim, s->ret, s->slots, s->weights, H, K, dim, 1);
    int *tcount = rdispl + N, *tdispl = tcount + tp;
    for (int r = 0; r < tp; r++) balanced_part(T, tp, r, &tdispl[r], &tcount[r]);
    comm_allgatherv_rows(env->comm, COMM_moe_combine, s->routed, tcount, tdispl, dim, GROUP_TP);
    size_t n = (size_t)T * dim;
    if (w->shared.gate.data) { /* the shared experts' TP sum, then the routed experts' rows */
        layer_swiglu(env, &w->shared, env->parts, x, T, sh->shared_hidden, s->hg, s->hu);
        layer_sum_parts(env, T);
        be->add(env->parts, s->routed, n);
        be->add(env->x, env->parts, n);
    } else {
        be->add(env->x, s->routed, n);
    }
}

void moe_block(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, int layer, const float *x, int T)
{
    double t0 = layer_clock(env);
    if (expert_parallel(env)) {
        moe_block_ep(env, w, s, layer, x, T);
    } else {
        moe_forward(env, w, s, env->parts, x, T);
        layer_residual(env, NULL, T);
    }
    env->tm->moe += layer_clock(env) - t0; /* the whole block: its GEMMs (also in matmul) and its exchanges */
}
