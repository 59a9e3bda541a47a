#include "engine.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "layer_dense.h"
#include "layer_mla.h"
#include "util.h"

static Topology solo_topology;

const LayerOps *engine_layer_ops(LayerFamily family)
{
    static const LayerOps *const families[] = {[FAMILY_DENSE] = &dense_layer_ops, [FAMILY_MLA] = &mla_layer_ops};
    return families[family];
}

size_t engine_kv_bytes_per_token(const Engine *e) { return attention_kv_bytes_per_token(&e->att); }

long long engine_kv_capacity(const Engine *e) { return attention_kv_capacity(&e->att); }

int engine_gpu_budget(size_t total, double utilization, size_t weights, size_t activations, int tokens, GpuBudget *b)
{
    *b = (GpuBudget){.total = total, .usable = (size_t)((double)total * utilization), .weights = weights,
                     .activations = activations, .utilization = utilization, .tokens = tokens};
    if (b->usable <= weights || b->usable - weights <= activations) {
        char act[128] = "";
        if (activations)
            snprintf(act, sizeof act, " and the activation peak of a step of %d tokens (%zu bytes)", tokens, activations);
        return dcp_fail("--gpu-memory-utilization %.2f: %zu bytes of the GPU's %zu, less the weights (%zu bytes a "
                        "rank)%s, leave nothing for the KV cache (give a larger share, more ranks to -tp, a smaller "
                        "--max-num-batched-tokens, or --kv-cache-memory)",
                        utilization, b->usable, total, weights, act);
    }
    b->kv = b->usable - weights - activations;
    return 0;
}

void engine_resize_kv(Engine *e, size_t kv_memory) { attention_resize_kv(&e->att, kv_memory); }

void engine_kv_sizing(const Model *m, int dcp, const EngineOptions *eo, KvSizing *out)
{
    AttnShape a;
    engine_layer_ops(arch_family(&m->cfg))->attn_shape(m, &a);
    kv_sizing(&a, eo ? eo->kv_dtype : DTYPE_F32, eo ? eo->kv_cache_memory : 0, eo ? eo->block_size : 0, dcp, out);
}

long engine_step_token_limit(const Model *m, const Topology *topo)
{
    AttnShape a;
    engine_layer_ops(arch_family(&m->cfg))->attn_shape(m, &a);
    long long D = a.v_dim ? a.v_dim : a.head_dim, N = topo->dcp;
    /* elements per token of each per-layer message: the TP sum, and with
     * DCP the gathered queries, ag_rs's first exchange (half the group's
     * partials with their LSEs) and a2a's partials of one rank's heads */
    long long per_token[] = {m->cfg.dim, N > 1 ? (long long)a.q_heads * a.head_dim : 0,
                             N > 1 ? N / 2 * a.q_heads * (D + 1) : 0, N > 1 ? a.q_heads * (D + 1) : 0};
    long long most = 1;
    for (size_t i = 0; i < sizeof per_token / sizeof *per_token; i++) most = per_token[i] > most ? per_token[i] : most;
    return (long)(INT_MAX / most);
}

void engine_init(Engine *e, const Model *m, const Backend *be, const Topology *topo, const EngineOptions *eo,
                 Timings *tm, CommStats *stats)
{
    memset(e, 0, sizeof *e);
    if (!topo) {
        if (!solo_topology.tp) {
            solo_topology = (Topology){.world_size = 1, .tp = 1, .dcp = 1, .dp = 1, .interleave = 1,
                                       .world = MPI_COMM_SELF, .tp_comm = MPI_COMM_SELF, .dcp_comm = MPI_COMM_SELF};
        }
        topo = &solo_topology;
    }
    CommStats *cs = stats ? stats : &e->own_stats;
    cs->topo = topo;
    cs->be = be;
    /* MPI reads host buffers; device buffers go through host staging
     * unless the MPI library takes device pointers */
    if (!cs->t) cs->t = be->host_memory || (eo && eo->mpi_device_buffers) ? &transport_mpi : &transport_mpi_staged;
    e->env = (LayerEnv){.model = m, .be = be, .topo = topo, .tm = tm, .comm = cs, .timing_sync = eo && eo->timing_sync,
                        .nvfp4_act = eo && eo->nvfp4_act, .att = &e->att};
    e->ops = engine_layer_ops(arch_family(&m->cfg));
    const Config *c = &m->cfg;
    if (topo->expert_parallel) {
        size_t n = (size_t)layers_held(c) * (size_t)c->moe.n_routed_experts;
        e->moe_counts = (MoeCounts){.received = xcalloc(n, sizeof(long long)), .sent = xcalloc(n, sizeof(long long))};
        e->env.moe_counts = &e->moe_counts;
    }
    size_t dim = (size_t)c->dim;
    size_t vocab = (size_t)m->shard.vocab;
    e->token_embedding = upload_matrix(&e->env, &e->up, m->w.token_embedding, vocab * dim);
    e->rms_final = upload_vector(&e->env, &e->up, m->w.rms_final, dim);
    e->lm_head = m->w.lm_head.data == m->w.token_embedding.data ? e->token_embedding
                                                                : upload_matrix(&e->env, &e->up, m->w.lm_head, vocab * dim);
    e->layers = e->ops->load(&e->env);
    if (c->mtp_loaded) {
        const MtpLayer *t = &m->w.mtp;
        e->mtp = c->n_layers;
        e->mtp_embed = upload_matrix(&e->env, &e->up, t->embed, vocab * dim);
        e->mtp_head = upload_matrix(&e->env, &e->up, t->head, vocab * dim);
        e->mtp_eh = upload_matrix(&e->env, &e->up, t->eh_proj, 2 * dim * dim);
        e->mtp_enorm = upload_vector(&e->env, &e->up, t->enorm, dim);
        e->mtp_hnorm = upload_vector(&e->env, &e->up, t->hnorm, dim);
        e->mtp_head_norm = upload_vector(&e->env, &e->up, t->head_norm, dim);
    }
    AttnShape shape;
    e->ops->attn_shape(m, &shape);
    shape.key_shards = m->shard.key_shards;
    attention_init(&e->att, be, topo, cs, &shape, eo ? eo->kv_cache_memory : 0, eo ? eo->block_size : 0,
                   eo ? eo->kv_dtype : DTYPE_F32, eo ? eo->merge : MERGE_AG_RS);
    e->att.kv_scale = m->w.kv_scale; /* an FP8 cache uses the checkpoint's scales */
    e->table_blocks = eo ? eo->table_blocks : 0;
}

static void free_step_buffers(Engine *e)
{
    LayerEnv *env = &e->env;
    void *bufs[] = {env->x, env->xb, env->parts, env->sum_scratch, e->xf, e->d_tokens, e->d_rows, e->hidden, e->mtp_in};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) env->be->release(bufs[i]);
    env->x = env->xb = env->parts = env->sum_scratch = e->xf = e->hidden = e->mtp_in = NULL;
    e->d_tokens = e->d_rows = NULL;
    free(e->rows);
    free(e->mtp_tokens);
    e->rows = e->mtp_tokens = NULL;
    e->cap_T = 0;
}

void engine_free(Engine *e)
{
    const Backend *be = e->env.be;
    if (e->logits) be->release(e->logits);
    free_step_buffers(e);
    e->ops->release(&e->env, e->layers);
    uploads_release(&e->env, &e->up);
    attention_free(&e->att);
    comm_stats_free(e->env.comm);
    free(e->moe_counts.received);
    free(e->moe_counts.sent);
    memset(e, 0, sizeof *e);
}

/* Grows the step's buffers, the family's scratch and the attention core's
 * to T tokens. */
static void reserve(Engine *e, int T)
{
    e->ops->reserve(&e->env, e->layers, T);
    /* the block tables of the most a step holds, with the first step's
     * buffers (a profiling step counts them) */
    if (e->table_blocks && !e->att.cap_tables) attention_reserve_tables(&e->att, e->table_blocks);
    if (T <= e->cap_T) return;
    free_step_buffers(e);
    LayerEnv *env = &e->env;
    const Backend *be = env->be;
    size_t t = (size_t)T, f = sizeof(float) * (size_t)env->model->cfg.dim;
    const Shard *s = &env->model->shard;
    env->x = be->alloc(f * t);
    env->xb = be->alloc(f * t);
    env->parts = be->alloc(f * t * (size_t)s->chunks);
    env->sum_scratch = be->alloc(f * t);
    e->xf = be->alloc(f * t);
    e->d_tokens = be->alloc(sizeof(int) * t);
    e->d_rows = be->alloc(sizeof(int) * t);
    e->rows = xmalloc(sizeof(int) * t);
    if (e->mtp) {
        e->hidden = be->alloc(f * t);
        e->mtp_in = be->alloc(2 * f * t);
        e->mtp_tokens = xmalloc(sizeof(int) * t);
    }
    e->cap_T = T;
}

void engine_mtp_idle(Engine *e)
{
    double t0 = now_s();
    reserve(e, 1);
    e->ops->idle(&e->env, e->layers, e->mtp);
    e->moe_counts.idle_seconds += now_s() - t0;
}

void engine_idle(Engine *e)
{
    double t0 = now_s();
    reserve(e, 1);
    for (int l = 0; l < e->env.model->cfg.n_layers; l++) e->ops->idle(&e->env, e->layers, l);
    e->moe_counts.idle_steps++;
    e->moe_counts.idle_seconds += now_s() - t0;
}

/* The rows whose logits are wanted (row_end: engine_forward's) through
 * the norm `norm` and this rank's slice of the vocabulary-parallel head
 * w, into logits (host); their states before the norm into hidden (host;
 * NULL: not wanted). */
static void head(Engine *e, const Chunk *chunks, int n_chunks, const int *row_end, const float *norm, WeightRef w,
                 float *logits, float *hidden)
{
    LayerEnv *env = &e->env;
    const Config *c = &env->model->cfg;
    const Shard *s = &env->model->shard;
    const Backend *be = env->be;
    int R = 0;
    for (int i = 0, t = 0; i < n_chunks; i++) {
        t += chunks[i].n;
        for (int r = row_end ? row_end[i] - (i ? row_end[i - 1] : 0) : 1; r > 0; r--) e->rows[R++] = t - r;
    }
    if (!R) return; /* an MTP pass whose rows only store their K/V */
    if (R > e->cap_R) {
        if (e->logits) be->release(e->logits);
        e->cap_R = R;
        e->logits = be->alloc(sizeof(float) * (size_t)R * (s->vocab ? s->vocab : 1));
    }
    be->upload(e->d_rows, e->rows, sizeof(int) * R);
    be->gather_rows(env->xb, env->x, e->d_rows, R, c->dim);
    if (hidden) be->download(hidden, env->xb, sizeof(float) * (size_t)R * c->dim);
    be->rmsnorm(e->xf, c->dim, env->xb, c->dim, norm, R, c->dim, c->norm_eps);
    double t0 = layer_clock(env);
    be->matmul(e->logits, layer_act(env, e->xf, w, R, c->dim), w, R, c->dim, s->vocab);
    be->download(logits, e->logits, sizeof(float) * R * s->vocab);
    env->tm->lm_head += now_s() - t0;
}

void engine_forward(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, const int *row_end, float *logits)
{
    LayerEnv *env = &e->env;
    const Config *c = &env->model->cfg;
    const Shard *s = &env->model->shard;
    const Backend *be = env->be;
    int T = attention_begin_step(&e->att, chunks, n_chunks);
    reserve(e, T);
    be->upload(e->d_tokens, tokens, sizeof(int) * T);
    /* each rank embeds the tokens of its rows of the vocabulary, zeros for
     * the rest; the TP sum adds the one row each token has (exact: the
     * other terms are zeros) */
    be->embedding(env->x, e->token_embedding, s->vocab0, s->vocab, e->d_tokens, T, c->dim);
    if (s->vocab < c->vocab_size) comm_sum_tree(env->comm, env->x, env->sum_scratch, comm_count((size_t)T * c->dim), GROUP_TP);
    for (int l = 0; l < c->n_layers; l++) e->ops->forward(env, e->layers, l);
    /* every token's final-normed state, the MTP layer's input */
    if (e->mtp) be->rmsnorm(e->hidden, c->dim, env->x, c->dim, e->rms_final, T, c->dim, c->norm_eps);
    head(e, chunks, n_chunks, row_end, e->rms_final, e->lm_head, logits, NULL);
}

void engine_mtp(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, const int *prev_rows,
                const float *prev, const int *row_end, float *logits, float *hidden)
{
    LayerEnv *env = &e->env;
    const Config *c = &env->model->cfg;
    const Shard *s = &env->model->shard;
    const Backend *be = env->be;
    size_t dim = (size_t)c->dim;
    int T = attention_begin_step(&e->att, chunks, n_chunks);
    reserve(e, T);
    /* position 0 has no token before it to predict from: its embedding is
     * zeros, as a token no rank's vocabulary rows hold gives */
    for (int i = 0, t = 0; i < n_chunks; i++)
        for (int j = 0; j < chunks[i].n; j++, t++) e->mtp_tokens[t] = chunks[i].pos0 + j ? tokens[t] : c->vocab_size;
    be->upload(e->d_tokens, e->mtp_tokens, sizeof(int) * T);
    be->embedding(env->xb, e->mtp_embed, s->vocab0, s->vocab, e->d_tokens, T, c->dim);
    if (s->vocab < c->vocab_size) comm_sum_tree(env->comm, env->xb, env->sum_scratch, comm_count((size_t)T * dim), GROUP_TP);
    be->rmsnorm(e->mtp_in, 2 * c->dim, env->xb, c->dim, e->mtp_enorm, T, c->dim, c->norm_eps);
    if (prev_rows) {
        be->upload(e->d_rows, prev_rows, sizeof(int) * T);
        be->gather_rows(env->xb, e->hidden, e->d_rows, T, c->dim);
    } else {
        be->upload(env->xb, prev, sizeof(float) * T * dim);
    }
    be->rmsnorm(e->mtp_in + dim, 2 * c->dim, env->xb, c->dim, e->mtp_hnorm, T, c->dim, c->norm_eps);
    layer_matmul(env, env->x, e->mtp_in, e->mtp_eh, T, 2 * c->dim, c->dim);
    e->ops->forward(env, e->layers, e->mtp);
    head(e, chunks, n_chunks, row_end, e->mtp_head_norm, e->mtp_head, logits, hidden);
}
