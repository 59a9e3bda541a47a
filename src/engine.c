#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static Topology solo_topology;
static CommStats solo_stats;

size_t engine_kv_bytes_per_token(const Engine *e);

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
    e->model = m;
    e->be = be;
    e->topo = topo;
    e->merge = eo ? eo->merge : MERGE_AG_RS;
    e->tm = tm;
    e->comm = stats ? stats : &solo_stats;
    size_t memory = eo && eo->kv_cache_memory ? eo->kv_cache_memory : (size_t)256 << 20;
    int B = eo && eo->block_size ? eo->block_size : 16;
    size_t per_block = engine_kv_bytes_per_token(e) * B;
    size_t n_blocks = memory / per_block;
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    pool_init(&e->pool, (int)n_blocks, B);
    /* untouched pages of the pool cost no memory until a block is used */
    size_t floats = n_blocks * per_block / 2 / sizeof(float);
    e->k_pool = xmalloc(sizeof(float) * (floats ? floats : 1));
    e->v_pool = xmalloc(sizeof(float) * (floats ? floats : 1));
}

static void free_activations(Engine *e)
{
    float **bufs[] = {&e->x,       &e->xb,      &e->xb2,   &e->q,     &e->k,       &e->v,
                      &e->att,     &e->lse,     &e->att_ctx, &e->lse_ctx, &e->hb,   &e->hb2,
                      &e->xf,      &e->q_all,   &e->o_all, &e->lse_all, &e->lse_ranks, &e->parts};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
    free(e->pos);
    free(e->kp);
    free(e->vp);
    free(e->n_keys);
    free(e->tables);
    e->pos = NULL;
    e->kp = e->vp = NULL;
    e->n_keys = NULL;
    e->tables = NULL;
}

void engine_free(Engine *e)
{
    free(e->k_pool);
    free(e->v_pool);
    pool_free_all(&e->pool);
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
    size_t N = (size_t)e->topo->dcp, D = (size_t)c->head_dim;
    size_t qd = (size_t)s->q_heads * D, kvd = (size_t)s->kv_heads * D, H = (size_t)s->q_heads;
    e->cap_T = T;
    e->x = xmalloc(sizeof(float) * T * c->dim);
    e->xb = xmalloc(sizeof(float) * T * c->dim);
    e->xb2 = xmalloc(sizeof(float) * T * c->dim);
    e->xf = xmalloc(sizeof(float) * T * c->dim);
    e->q = xmalloc(sizeof(float) * T * qd);
    e->k = xmalloc(sizeof(float) * T * kvd);
    e->v = xmalloc(sizeof(float) * T * kvd);
    e->att = xmalloc(sizeof(float) * T * qd);
    e->att_ctx = xmalloc(sizeof(float) * T * qd);
    e->lse = xmalloc(sizeof(float) * T * H);
    e->lse_ctx = xmalloc(sizeof(float) * T * H);
    e->hb = xmalloc(sizeof(float) * T * (s->hidden ? s->hidden : 1));
    e->hb2 = xmalloc(sizeof(float) * T * (s->hidden ? s->hidden : 1));
    e->pos = xmalloc(sizeof(int) * T);
    e->kp = xmalloc(sizeof(float *) * T * N);
    e->vp = xmalloc(sizeof(float *) * T * N);
    e->n_keys = xmalloc(sizeof(int) * T * N);
    e->tables = xmalloc(sizeof(int *) * T * N);
    if (N > 1) {
        e->q_all = xmalloc(sizeof(float) * N * T * qd);
        e->o_all = xmalloc(sizeof(float) * N * T * qd);
        e->lse_all = xmalloc(sizeof(float) * N * T * H);
        e->lse_ranks = xmalloc(sizeof(float) * N * N * T * H);
        e->parts = xmalloc(sizeof(float) * 2 * N * T * H * (D + 1)); /* send and receive halves */
    }
}

size_t engine_kv_bytes_per_token(const Engine *e)
{
    return kv_bytes_per_position(e->model->cfg.n_layers, e->model->shard.kv_heads, e->model->cfg.head_dim);
}

long long engine_kv_capacity(const Engine *e)
{
    return (long long)e->pool.n_blocks * e->pool.block_size * e->topo->dcp;
}

/* Floats from the start of a layer's pool to position slot of block b. */
static size_t kv_offset(const Engine *e, int layer, int block, int slot)
{
    size_t kvd = (size_t)e->model->shard.kv_heads * e->model->cfg.head_dim, B = (size_t)e->pool.block_size;
    return (((size_t)layer * e->pool.n_blocks + block) * B + slot) * kvd;
}

static void timed_matmul(Engine *e, float *y, const float *x, const float *w, int T, int in, int out)
{
    double t0 = now_s();
    e->be->matmul(y, x, w, T, in, out);
    e->tm->matmul += now_s() - t0;
}

/* Runs attention for rows = copies x T query tokens (q: copies blocks of T
 * tokens), each token over the keys of its chunk: in the context part this
 * rank's cached shard of positions [0, pos0), in the new part the chunk's
 * own keys up to and including the token (causal). */
static void attend(Engine *e, const Chunk *chunks, int n_chunks, int layer, int context, const float *q, int copies,
                   int n_heads, float *out, float *lse)
{
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    const Topology *tp = e->topo;
    int kvd = s->kv_heads * c->head_dim, T = 0;
    for (int i = 0; i < n_chunks; i++) T += chunks[i].n;
    size_t layer_off = kv_offset(e, layer, 0, 0);
    for (int i = 0, t = 0; i < n_chunks; i++) {
        const Chunk *ch = &chunks[i];
        int local = kv_local_len(tp, ch->pos0, tp->dcp_rank);
        for (int j = 0; j < ch->n; j++, t++) {
            if (context) {
                e->kp[t] = e->k_pool + layer_off;
                e->vp[t] = e->v_pool + layer_off;
                e->n_keys[t] = local;
                e->tables[t] = ch->blocks;
            } else {
                e->kp[t] = e->k + (size_t)(t - j) * kvd;
                e->vp[t] = e->v + (size_t)(t - j) * kvd;
                e->n_keys[t] = j + 1;
            }
        }
    }
    for (int r = 1; r < copies; r++) { /* gathered queries of other ranks read the same keys */
        memcpy(e->kp + (size_t)r * T, e->kp, sizeof(float *) * T);
        memcpy(e->vp + (size_t)r * T, e->vp, sizeof(float *) * T);
        memcpy(e->n_keys + (size_t)r * T, e->n_keys, sizeof(int) * T);
        memcpy(e->tables + (size_t)r * T, e->tables, sizeof(int *) * T);
    }
    AttnBatch ab = {.T = T * copies, .n_heads = n_heads, .n_kv_heads = s->kv_heads, .head_dim = c->head_dim,
                    .scale = 1.0f / sqrtf((float)c->head_dim), .q = q, .out = out, .lse = lse,
                    .k = e->kp, .v = e->vp, .n_keys = e->n_keys, .kv_stride = kvd,
                    .blocks = context ? e->tables : NULL, .block_size = e->pool.block_size};
    e->be->attention(&ab);
}

/* Context attention over a KV cache sharded across the DCP group: every
 * rank attends the group's queries to its own shard, then the partials are
 * merged so that each rank ends with its own heads' output and LSE. */
static void context_attention_dcp(Engine *e, const Chunk *chunks, int n_chunks, int layer, int T)
{
    const Topology *tp = e->topo;
    const Shard *s = &e->model->shard;
    int N = tp->dcp, D = e->model->cfg.head_dim, H = s->q_heads;
    int qd = H * D, rows = T * H; /* rows of one rank's heads */
    CommStats *cs = e->comm;
    /* queries of the whole group: (N, T, H, D) */
    comm_allgather(cs, COMM_q_allgather, e->q, T * qd, e->q_all, tp->dcp_comm);
    attend(e, chunks, n_chunks, layer, 1, e->q_all, N, H, e->o_all, e->lse_all);
    if (e->merge == MERGE_AG_RS) {
        /* every rank's LSEs for all N*rows rows, then the scaled partials
         * summed so that rank d receives block d: its own heads */
        comm_allgather(cs, COMM_lse_allgather, e->lse_all, N * rows, e->lse_ranks, tp->dcp_comm);
        e->be->lse_rescale(e->o_all, e->lse_all, e->lse_ranks, tp->dcp_rank, N, N * rows, D);
        comm_reduce_scatter_sum(cs, e->o_all, e->att_ctx, T * qd, tp->dcp_comm);
        memcpy(e->lse_ctx, e->lse_all + (size_t)tp->dcp_rank * rows, sizeof(float) * rows);
    } else {
        /* block d of (partial, LSE) rows goes to rank d, which combines them */
        float *send = e->parts, *recv = e->parts + (size_t)N * rows * (D + 1);
        for (int r = 0; r < N * rows; r++) {
            memcpy(send + (size_t)r * (D + 1), e->o_all + (size_t)r * D, sizeof(float) * D);
            send[(size_t)r * (D + 1) + D] = e->lse_all[r];
        }
        comm_alltoall(cs, send, recv, rows * (D + 1), tp->dcp_comm);
        e->be->lse_combine(e->att_ctx, e->lse_ctx, recv, N, rows, D);
    }
}

/* The owner of each new position stores its K/V at its local index,
 * through the sequence's block table (the slot mapping). */
static void kv_write(Engine *e, const Chunk *chunks, int n_chunks, int layer)
{
    const Topology *tp = e->topo;
    int kvd = e->model->shard.kv_heads * e->model->cfg.head_dim, B = e->pool.block_size;
    for (int i = 0, t = 0; i < n_chunks; i++) {
        const Chunk *ch = &chunks[i];
        for (int j = 0; j < ch->n; j++, t++) {
            int p = ch->pos0 + j;
            if (kv_owner(tp, p) != tp->dcp_rank) continue;
            int li = kv_local_index(tp, p);
            size_t off = kv_offset(e, layer, ch->blocks[li / B], li % B);
            memcpy(e->k_pool + off, e->k + (size_t)t * kvd, sizeof(float) * kvd);
            memcpy(e->v_pool + off, e->v + (size_t)t * kvd, sizeof(float) * kvd);
        }
    }
}

void engine_forward(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, int all_logits, float *logits)
{
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    const Weights *w = &e->model->w;
    const Backend *be = e->be;
    const Topology *tp = e->topo;
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
        /* attention block: column-parallel Q/K/V, this rank's heads */
        be->rmsnorm(e->xb, e->x, w->rms_att + (size_t)l * dim, T, dim, c->norm_eps);
        timed_matmul(e, e->q, e->xb, w->wq + (size_t)l * qd * dim, T, dim, qd);
        timed_matmul(e, e->k, e->xb, w->wk + (size_t)l * kvd * dim, T, dim, kvd);
        timed_matmul(e, e->v, e->xb, w->wv + (size_t)l * kvd * dim, T, dim, kvd);
        be->rope(e->q, e->pos, T, s->q_heads, D, c->rope_theta, c->rope_style);
        be->rope(e->k, e->pos, T, s->kv_heads, D, c->rope_theta, c->rope_style);
        double t0 = now_s();
        attend(e, chunks, n_chunks, l, 0, e->q, 1, s->q_heads, e->att, e->lse);
        if (has_context) {
            if (tp->dcp > 1) context_attention_dcp(e, chunks, n_chunks, l, T);
            else attend(e, chunks, n_chunks, l, 1, e->q, 1, s->q_heads, e->att_ctx, e->lse_ctx);
            be->merge_attention(e->att, e->lse, e->att_ctx, e->lse_ctx, T * s->q_heads, D);
        }
        kv_write(e, chunks, n_chunks, l);
        e->tm->attention += now_s() - t0;
        /* row-parallel output projection, summed over the TP group */
        timed_matmul(e, e->xb2, e->att, w->wo + (size_t)l * dim * qd, T, qd, dim);
        comm_allreduce_sum(e->comm, e->xb2, T * dim, tp->tp_comm);
        be->add(e->x, e->xb2, (size_t)T * dim);

        /* feed-forward block: column-parallel gate/up, row-parallel down */
        be->rmsnorm(e->xb, e->x, w->rms_ffn + (size_t)l * dim, T, dim, c->norm_eps);
        timed_matmul(e, e->hb, e->xb, w->w_gate + (size_t)l * hidden * dim, T, dim, hidden);
        timed_matmul(e, e->hb2, e->xb, w->w_up + (size_t)l * hidden * dim, T, dim, hidden);
        be->silu_mul(e->hb, e->hb2, (size_t)T * hidden);
        timed_matmul(e, e->xb2, e->hb, w->w_down + (size_t)l * dim * hidden, T, hidden, dim);
        comm_allreduce_sum(e->comm, e->xb2, T * dim, tp->tp_comm);
        be->add(e->x, e->xb2, (size_t)T * dim);
    }

    /* final norm and this rank's slice of the vocabulary-parallel LM head,
     * for the rows whose logits are wanted */
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
