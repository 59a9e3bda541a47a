#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static Topology solo_topology;
static CommStats solo_stats;

size_t engine_kv_bytes_per_token(const Engine *e)
{
    size_t kv = kv_bytes_per_position(e->model->cfg.n_layers, e->model->shard.kv_heads, e->model->cfg.head_dim,
                                      dtype_bytes(e->kv_dtype));
    return e->model->cfg.mla ? kv / 2 : kv; /* MLA: one latent row, no separate values */
}

long long engine_kv_capacity(const Engine *e)
{
    return (long long)e->pool.n_blocks * e->pool.block_size * e->topo->dcp;
}

/* the backend's copy of every weight array, and each layer's view of it */
static void upload_weights(Engine *e)
{
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    const Weights *h = &e->model->w;
    const Backend *be = e->be;
    EngineWeights *w = &e->w;
    size_t L = (size_t)c->n_layers, dim = (size_t)c->dim, qd = (size_t)s->q_heads * c->head_dim,
           kvd = (size_t)s->kv_heads * c->head_dim, hid = (size_t)s->hidden;
    memset(w, 0, sizeof *w);
    if (c->mla) {
        mla_upload(e);
        return;
    }
    w->token_embedding = be->weights(h->token_embedding, (size_t)c->vocab_size * dim);
    w->rms_final = be->weights(h->rms_final, dim);
    w->lm_head = be->gemm_weights(h->lm_head, (size_t)s->vocab * dim);
    w->rms_att = be->weights(h->rms_att, L * dim);
    w->rms_ffn = be->weights(h->rms_ffn, L * dim);
    w->wq = be->gemm_weights(h->wq, L * qd * dim);
    w->wk = be->gemm_weights(h->wk, L * kvd * dim);
    w->wv = be->gemm_weights(h->wv, L * kvd * dim);
    w->wo = be->gemm_weights(h->wo, L * dim * qd);
    w->w_gate = be->gemm_weights(h->w_gate, L * hid * dim);
    w->w_up = be->gemm_weights(h->w_up, L * hid * dim);
    w->w_down = be->gemm_weights(h->w_down, L * dim * hid);
    /* the optional vectors: biases and q/k norms, one row per layer */
    size_t D = (size_t)c->head_dim;
    const float *const host_vec[] = {h->bq, h->bk, h->bv, h->bo, h->b_gate, h->b_up, h->b_down, h->q_norm, h->k_norm};
    const float **dev_vec[] = {&w->bq, &w->bk, &w->bv, &w->bo, &w->b_gate, &w->b_up, &w->b_down, &w->q_norm, &w->k_norm};
    const size_t per_layer[] = {qd, kvd, kvd, dim, hid, hid, dim, D, D};
    for (int i = 0; i < 9; i++) *dev_vec[i] = host_vec[i] ? be->weights(host_vec[i], L * per_layer[i]) : NULL;
    float *freq = xmalloc(sizeof(float) * (D / 2 + 1));
    rope_frequencies(c, freq, &w->rope_scale);
    w->inv_freq = be->weights(freq, D / 2);
    e->rope_host = freq; /* the CPU backend computes on it in place */
    w->layer = xcalloc(L, sizeof(LayerWeights));
    for (size_t l = 0; l < L; l++) {
        LayerWeights *lw = &w->layer[l];
        const float **lv[] = {&lw->bq, &lw->bk, &lw->bv, &lw->bo, &lw->b_gate, &lw->b_up, &lw->b_down, &lw->q_norm,
                              &lw->k_norm};
        for (int i = 0; i < 9; i++) *lv[i] = *dev_vec[i] ? *dev_vec[i] + l * per_layer[i] : NULL;
        lw->sliding = c->sliding_window > 0 && (int)l >= c->window_first_layer;
        lw->rms_att = w->rms_att + l * dim;
        lw->rms_ffn = w->rms_ffn + l * dim;
        lw->wq = weight_at(w->wq, l * qd * dim);
        lw->wk = weight_at(w->wk, l * kvd * dim);
        lw->wv = weight_at(w->wv, l * kvd * dim);
        lw->wo = weight_at(w->wo, l * dim * qd);
        lw->w_gate = weight_at(w->w_gate, l * hid * dim);
        lw->w_up = weight_at(w->w_up, l * hid * dim);
        lw->w_down = weight_at(w->w_down, l * dim * hid);
    }
}

static void release_weights(Engine *e)
{
    EngineWeights *w = &e->w;
    if (w->mla) {
        mla_release(e);
        return;
    }
    const void *all[] = {w->token_embedding, w->rms_final, w->lm_head.data, w->rms_att, w->rms_ffn, w->wq.data,
                         w->wk.data,         w->wv.data,   w->wo.data,      w->w_gate.data, w->w_up.data,
                         w->w_down.data,     w->bq,        w->bk,           w->bv,         w->bo,
                         w->b_gate,          w->b_up,      w->b_down,       w->q_norm,     w->k_norm,
                         w->inv_freq};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]) e->be->release_weights(all[i]);
    free(w->layer);
    free(e->rope_host);
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
    e->model = m;
    e->be = be;
    e->topo = topo;
    e->merge = eo ? eo->merge : MERGE_AG_RS;
    e->timing_sync = eo && eo->timing_sync;
    e->tm = tm;
    e->comm = stats ? stats : &solo_stats;
    /* MPI reads host buffers; device buffers go through host staging
     * unless the MPI library takes device pointers */
    e->comm->stage_be = be->host_memory || (eo && eo->mpi_device_buffers) ? NULL : be;
    e->comm->sync_be = !be->host_memory && eo && eo->mpi_device_buffers ? be : NULL;
    upload_weights(e);
    e->kv_dtype = eo ? eo->kv_dtype : DTYPE_F32; /* the job checked the backend stores it */
    size_t memory = eo && eo->kv_cache_memory ? eo->kv_cache_memory : (size_t)256 << 20;
    int B = eo && eo->block_size ? eo->block_size : 16;
    size_t per_block = engine_kv_bytes_per_token(e) * B;
    size_t n_blocks = memory / per_block;
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    pool_init(&e->pool, (int)n_blocks, B);
    /* on the CPU, untouched pages of the pool cost no memory until used */
    size_t bytes = n_blocks * per_block / 2;
    if (m->cfg.mla) bytes *= 2; /* MLA: all of it for the latent rows */
    e->k_pool = be->alloc(bytes ? bytes : sizeof(float));
    e->v_pool = m->cfg.mla ? NULL : be->alloc(bytes ? bytes : sizeof(float));
}

static void free_activations(Engine *e)
{
    void **bufs[] = {(void **)&e->x,       (void **)&e->xb,      (void **)&e->xb2,     (void **)&e->q,
                     (void **)&e->k,       (void **)&e->v,       (void **)&e->att,     (void **)&e->lse,
                     (void **)&e->att_ctx, (void **)&e->lse_ctx, (void **)&e->hb,      (void **)&e->hb2,
                     (void **)&e->xf,      (void **)&e->q_all,   (void **)&e->o_all,
                     (void **)&e->lse_all, (void **)&e->lse_ranks, (void **)&e->parts, (void **)&e->d_tokens,
                     (void **)&e->d_pos,   (void **)&e->d_slots, (void **)&e->d_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        if (*bufs[i]) e->be->release(*bufs[i]);
        *bufs[i] = NULL;
    }
    mla_free_scratch(e);
    free(e->pos);
    free(e->slots);
    free(e->rows);
    free(e->kp);
    free(e->vp);
    free(e->n_keys);
    free(e->key0);
    free(e->tables);
    e->pos = e->slots = e->rows = e->n_keys = e->key0 = NULL;
    e->kp = e->vp = NULL;
    e->tables = NULL;
}

void engine_free(Engine *e)
{
    if (e->logits) e->be->release(e->logits);
    e->be->release(e->k_pool);
    if (e->v_pool) e->be->release(e->v_pool);
    if (e->d_tables) e->be->release(e->d_tables);
    pool_free_all(&e->pool);
    free(e->chunk_tables);
    free_activations(e);
    release_weights(e);
    comm_stats_free(e->comm);
    memset(e, 0, sizeof *e);
}

/* Grows the buffers to hold T tokens. */
static void ensure_capacity(Engine *e, int T)
{
    if (T <= e->cap_T) return;
    free_activations(e);
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    const Backend *be = e->be;
    size_t N = (size_t)e->topo->dcp, D = (size_t)c->head_dim, f = sizeof(float);
    size_t qd = (size_t)s->q_heads * D, kvd = (size_t)s->kv_heads * D, H = (size_t)s->q_heads, dim = (size_t)c->dim;
    size_t hid = s->hidden ? (size_t)s->hidden : 1;
    e->cap_T = T;
    e->x = be->alloc(f * T * dim);
    e->xb = be->alloc(f * T * dim);
    e->xb2 = be->alloc(f * T * dim);
    e->xf = be->alloc(f * T * dim);
    e->q = be->alloc(f * T * qd);
    e->k = be->alloc(f * T * kvd);
    e->v = be->alloc(f * T * kvd);
    e->att = be->alloc(f * T * qd);
    e->att_ctx = be->alloc(f * T * qd);
    e->lse = be->alloc(f * T * H);
    e->lse_ctx = be->alloc(f * T * H);
    e->hb = be->alloc(f * T * hid);
    e->hb2 = be->alloc(f * T * hid);
    e->d_tokens = be->alloc(sizeof(int) * T);
    e->d_pos = be->alloc(sizeof(int) * T);
    e->d_slots = be->alloc(sizeof(int) * T);
    e->d_rows = be->alloc(sizeof(int) * T);
    e->pos = xmalloc(sizeof(int) * T);
    e->slots = xmalloc(sizeof(int) * T);
    e->rows = xmalloc(sizeof(int) * T);
    e->kp = xmalloc(sizeof(void *) * T * N);
    e->vp = xmalloc(sizeof(void *) * T * N);
    e->n_keys = xmalloc(sizeof(int) * T * N);
    e->key0 = xmalloc(sizeof(int) * T * N);
    e->tables = xmalloc(sizeof(int *) * T * N);
    if (N > 1) {
        e->q_all = be->alloc(f * N * T * qd);
        e->o_all = be->alloc(f * N * T * qd);
        e->lse_all = be->alloc(f * N * T * H);
        e->lse_ranks = be->alloc(f * N * N * T * H);
        e->parts = be->alloc(f * 2 * N * T * H * (D + 1)); /* send and receive halves */
    }
}

/* Floats from the start of the pool to position slot of block b in layer. */
static size_t kv_offset(const Engine *e, int layer, int block, int slot)
{
    size_t kvd = (size_t)e->model->shard.kv_heads * e->model->cfg.head_dim, B = (size_t)e->pool.block_size;
    return (((size_t)layer * e->pool.n_blocks + block) * B + slot) * kvd;
}

/* A layer's rows of a KV pool (elements of kv_dtype). */
static void *kv_layer(const Engine *e, void *pool, int layer)
{
    return pool ? (char *)pool + kv_offset(e, layer, 0, 0) * dtype_bytes(e->kv_dtype) : NULL;
}

/* Per-step metadata, computed once on the host and handed to the backend:
 * positions, the slot mapping (row of this rank's pool each new token is
 * stored at, -1 where another DCP rank owns it), and the block tables of
 * the chunks. Returns each chunk's table in backend memory. */
static void prepare_step(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, int T, const int **tables)
{
    const Topology *tp = e->topo;
    const Backend *be = e->be;
    int B = e->pool.block_size, total = 0;
    for (int i = 0, t = 0; i < n_chunks; i++) {
        total += chunks[i].n_blocks;
        for (int j = 0; j < chunks[i].n; j++, t++) {
            int p = chunks[i].pos0 + j;
            e->pos[t] = p;
            e->slots[t] = -1;
            if (kv_owner(tp, p) == tp->dcp_rank) {
                int li = kv_local_index(tp, p);
                e->slots[t] = chunks[i].blocks[li / B] * B + li % B;
            }
        }
    }
    if (total > e->cap_tables) {
        if (e->d_tables) be->release(e->d_tables);
        e->cap_tables = total > 2 * e->cap_tables ? total : 2 * e->cap_tables;
        e->d_tables = be->alloc(sizeof(int) * (size_t)e->cap_tables);
    }
    for (int i = 0, off = 0; i < n_chunks; i++) {
        if (chunks[i].n_blocks) be->upload(e->d_tables + off, chunks[i].blocks, sizeof(int) * chunks[i].n_blocks);
        tables[i] = e->d_tables + off;
        off += chunks[i].n_blocks;
    }
    be->upload(e->d_tokens, tokens, sizeof(int) * T);
    be->upload(e->d_pos, e->pos, sizeof(int) * T);
    be->upload(e->d_slots, e->slots, sizeof(int) * T);
}

/* A clock reading; with timing_sync, after the device's queued work. */
static double clock_now(const Engine *e)
{
    if (e->timing_sync) e->be->synchronize();
    return now_s();
}

static void timed_matmul(Engine *e, float *y, const float *x, WeightRef w, int T, int in, int out)
{
    double t0 = clock_now(e);
    e->be->matmul(y, x, w, T, in, out);
    e->tm->matmul += clock_now(e) - t0;
}

/* Runs attention for rows = copies x T query tokens (q: copies blocks of T
 * tokens), each token over the keys of its chunk: ATTEND_CACHED, this
 * rank's cached shard of positions [0, pos0), read through the chunk's
 * block table; ATTEND_NEW, the chunk's own keys up to and including the
 * token (causal); ATTEND_ALL, the cache's positions [0, p] (the chunk's
 * keys already stored). */
void engine_attend(Engine *e, const Chunk *chunks, const int *const *tables, int n_chunks, int layer, AttendKeys keys,
                   const float *q, int copies, int n_heads, float *out, float *lse)
{
    int context = keys != ATTEND_NEW;
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    const Topology *tp = e->topo;
    int kvd = s->kv_heads * c->head_dim, T = 0, W = e->w.layer && e->w.layer[layer].sliding ? c->sliding_window : 0;
    for (int i = 0; i < n_chunks; i++) T += chunks[i].n;
    const void *k_rows = kv_layer(e, e->k_pool, layer), *v_rows = kv_layer(e, e->v_pool, layer);
    for (int i = 0, t = 0; i < n_chunks; i++) {
        const Chunk *ch = &chunks[i];
        int local = kv_local_len(tp, ch->pos0, tp->dcp_rank);
        for (int j = 0; j < ch->n; j++, t++) {
            /* a sliding window keeps the keys at positions > p - W: in the
             * cached shard those after this rank's first local positions
             * (local indices grow with the position), in the chunk those
             * after its first j - W + 1 */
            int p = ch->pos0 + j, first = W && p - W + 1 > 0 ? p - W + 1 : 0;
            if (context) {
                int upto = keys == ATTEND_ALL ? p + 1 : ch->pos0;
                e->kp[t] = k_rows;
                e->vp[t] = c->mla ? k_rows : v_rows; /* MLA: values are the latent rows */
                e->n_keys[t] = keys == ATTEND_ALL ? kv_local_len(tp, upto, tp->dcp_rank) : local;
                e->key0[t] = first ? kv_local_len(tp, first < upto ? first : upto, tp->dcp_rank) : 0;
                e->tables[t] = tables[i];
            } else {
                e->kp[t] = e->k + (size_t)(t - j) * kvd;
                e->vp[t] = (c->mla ? e->k : e->v) + (size_t)(t - j) * kvd;
                e->n_keys[t] = j + 1;
                e->key0[t] = first > ch->pos0 ? first - ch->pos0 : 0;
            }
        }
    }
    for (int r = 1; r < copies; r++) { /* gathered queries of other ranks read the same keys */
        memcpy(e->kp + (size_t)r * T, e->kp, sizeof(void *) * T);
        memcpy(e->vp + (size_t)r * T, e->vp, sizeof(void *) * T);
        memcpy(e->n_keys + (size_t)r * T, e->n_keys, sizeof(int) * T);
        memcpy(e->key0 + (size_t)r * T, e->key0, sizeof(int) * T);
        memcpy(e->tables + (size_t)r * T, e->tables, sizeof(int *) * T);
    }
    AttnBatch ab = {.T = T * copies, .n_heads = n_heads, .n_kv_heads = s->kv_heads, .head_dim = c->head_dim,
                    .v_dim = c->mla ? c->m.kv_lora_rank : 0,
                    .scale = c->mla ? c->m.softmax_scale : 1.0f / sqrtf((float)c->head_dim), .q = q, .out = out,
                    .lse = lse,
                    .k = e->kp, .v = e->vp, .n_keys = e->n_keys, .key0 = W ? e->key0 : NULL, .kv_stride = kvd,
                    .blocks = context ? e->tables : NULL, .block_size = e->pool.block_size,
                    .kv_dtype = context ? e->kv_dtype : DTYPE_F32};
    e->be->attention(&ab);
}

/* Context attention over a KV cache sharded across the DCP group: every
 * rank attends the group's queries to its own shard, then the partials are
 * merged so that each rank ends with its own heads' output and LSE. */
static void context_attention_dcp(Engine *e, const Chunk *chunks, const int *const *tables, int n_chunks,
                                  int layer, int T)
{
    const Topology *tp = e->topo;
    const Shard *s = &e->model->shard;
    const Config *c = &e->model->cfg;
    const Backend *be = e->be;
    /* D: an output row (MLA: the latent values, narrower than the query) */
    int N = tp->dcp, D = c->mla ? c->m.kv_lora_rank : c->head_dim, H = s->q_heads;
    int qd = H * c->head_dim, rows = T * H; /* rows of one rank's heads */
    CommStats *cs = e->comm;
    /* queries of the whole group: (N, T, H, head_dim) */
    comm_allgather(cs, COMM_q_allgather, e->q, T * qd, e->q_all, tp->dcp_comm);
    engine_attend(e, chunks, tables, n_chunks, layer, ATTEND_CACHED, e->q_all, N, H, e->o_all, e->lse_all);
    if (e->merge == MERGE_AG_RS) {
        /* every rank's LSEs for all N*rows rows, then the scaled partials
         * summed so that rank d receives block d: its own heads */
        comm_allgather(cs, COMM_lse_allgather, e->lse_all, N * rows, e->lse_ranks, tp->dcp_comm);
        be->lse_rescale(e->o_all, e->lse_all, e->lse_ranks, tp->dcp_rank, N, N * rows, D);
        comm_reduce_scatter_sum(cs, e->o_all, e->att_ctx, rows * D, tp->dcp_comm);
        be->copy(e->lse_ctx, e->lse_all + (size_t)tp->dcp_rank * rows, sizeof(float) * rows);
    } else {
        /* block d of (partial, LSE) rows goes to rank d, which combines them */
        float *send = e->parts, *recv = e->parts + (size_t)N * rows * (D + 1);
        be->pack_partials(send, e->o_all, e->lse_all, N * rows, D);
        comm_alltoall(cs, send, recv, rows * (D + 1), tp->dcp_comm);
        be->lse_combine(e->att_ctx, e->lse_ctx, recv, N, rows, D);
    }
}

void engine_self_attention(Engine *e, const Chunk *chunks, const int *const *tables, int n_chunks, int layer, int T,
                           int has_context, int n_heads, int out_dim, int kv_row)
{
    const Backend *be = e->be;
    int mla = e->model->cfg.mla;
    void *k_pool = kv_layer(e, e->k_pool, layer), *v_pool = kv_layer(e, e->v_pool, layer);
    float *v = mla ? NULL : e->v;
    if (e->topo->dcp == 1) {
        /* The new keys are stored first and every token reads its keys from
         * the cache in one pass: the same keys in the same order whether
         * its prompt came in one chunk or several, alone or batched, so its
         * result does not depend on either. */
        be->kv_write(k_pool, v_pool, e->kv_dtype, e->k, v, e->d_slots, T, kv_row, e->model->shard.kv_heads,
                      e->pool.block_size);
        engine_attend(e, chunks, tables, n_chunks, layer, ATTEND_ALL, e->q, 1, n_heads, e->att, e->lse);
        return;
    }
    /* The cache is sharded: the new keys (which every rank holds) and each
     * rank's cached shard are attended apart; the shards' partials are
     * merged over the DCP group, then with the new part. A bf16 cache's
     * new keys are read as the cache will hold them, as at DCP 1. */
    if (e->kv_dtype == DTYPE_BF16) {
        be->round_bf16(e->k, (size_t)T * kv_row);
        if (v) be->round_bf16(v, (size_t)T * kv_row);
    }
    engine_attend(e, chunks, tables, n_chunks, layer, ATTEND_NEW, e->q, 1, n_heads, e->att, e->lse);
    if (has_context) {
        context_attention_dcp(e, chunks, tables, n_chunks, layer, T);
        be->merge_attention(e->att, e->lse, e->att_ctx, e->lse_ctx, T * n_heads, out_dim);
    }
    /* the owners store the new tokens' K/V (DESIGN.md section 3) */
    be->kv_write(k_pool, v_pool, e->kv_dtype, e->k, v, e->d_slots, T, kv_row, e->model->shard.kv_heads,
                      e->pool.block_size);
}

void engine_forward(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, int all_logits, float *logits)
{
    const Config *c = &e->model->cfg;
    const Shard *s = &e->model->shard;
    const EngineWeights *w = &e->w;
    const Backend *be = e->be;
    const Topology *tp = e->topo;
    int T = 0, has_context = 0;
    for (int i = 0; i < n_chunks; i++) {
        T += chunks[i].n;
        has_context |= chunks[i].pos0 > 0;
    }
    ensure_capacity(e, T);
    if (n_chunks > e->cap_chunks) {
        e->cap_chunks = n_chunks;
        e->chunk_tables = xrealloc(e->chunk_tables, sizeof(int *) * (size_t)n_chunks);
    }
    const int **tables = e->chunk_tables;
    prepare_step(e, tokens, chunks, n_chunks, T, tables);
    int dim = c->dim, D = c->head_dim, hidden = s->hidden;
    int qd = s->q_heads * D, kvd = s->kv_heads * D;

    be->embedding(e->x, w->token_embedding, e->d_tokens, T, dim);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->mla) {
            mla_layer(e, l, chunks, tables, n_chunks, T, has_context);
            continue;
        }
        const LayerWeights *lw = &w->layer[l];
        /* attention block: column-parallel Q/K/V, this rank's heads */
        be->rmsnorm(e->xb, e->x, lw->rms_att, T, dim, c->norm_eps);
        timed_matmul(e, e->q, e->xb, lw->wq, T, dim, qd);
        timed_matmul(e, e->k, e->xb, lw->wk, T, dim, kvd);
        timed_matmul(e, e->v, e->xb, lw->wv, T, dim, kvd);
        if (lw->bq) {
            be->add_bias(e->q, lw->bq, T, qd);
            be->add_bias(e->k, lw->bk, T, kvd);
            be->add_bias(e->v, lw->bv, T, kvd);
        }
        if (lw->q_norm) { /* per head, before RoPE */
            be->rmsnorm(e->q, e->q, lw->q_norm, T * s->q_heads, D, c->norm_eps);
            be->rmsnorm(e->k, e->k, lw->k_norm, T * s->kv_heads, D, c->norm_eps);
        }
        be->rope(e->q, e->d_pos, T, s->q_heads, D, w->inv_freq, w->rope_scale, c->rope_style);
        be->rope(e->k, e->d_pos, T, s->kv_heads, D, w->inv_freq, w->rope_scale, c->rope_style);
        double t0 = clock_now(e);
        engine_self_attention(e, chunks, tables, n_chunks, l, T, has_context, s->q_heads, D, kvd);
        e->tm->attention += clock_now(e) - t0;
        /* row-parallel output projection, summed over the TP group */
        timed_matmul(e, e->xb2, e->att, lw->wo, T, qd, dim);
        comm_allreduce_sum(e->comm, e->xb2, T * dim, tp->tp_comm);
        if (lw->bo) be->add_bias(e->xb2, lw->bo, T, dim); /* once, after the sum */
        be->add(e->x, e->xb2, (size_t)T * dim);

        /* feed-forward block: column-parallel gate/up, row-parallel down */
        be->rmsnorm(e->xb, e->x, lw->rms_ffn, T, dim, c->norm_eps);
        timed_matmul(e, e->hb, e->xb, lw->w_gate, T, dim, hidden);
        timed_matmul(e, e->hb2, e->xb, lw->w_up, T, dim, hidden);
        if (lw->b_gate) {
            be->add_bias(e->hb, lw->b_gate, T, hidden);
            be->add_bias(e->hb2, lw->b_up, T, hidden);
        }
        be->silu_mul(e->hb, e->hb2, (size_t)T * hidden);
        timed_matmul(e, e->xb2, e->hb, lw->w_down, T, hidden, dim);
        comm_allreduce_sum(e->comm, e->xb2, T * dim, tp->tp_comm);
        if (lw->b_down) be->add_bias(e->xb2, lw->b_down, T, dim);
        be->add(e->x, e->xb2, (size_t)T * dim);
    }

    /* final norm and this rank's slice of the vocabulary-parallel LM head,
     * for the rows whose logits are wanted */
    int R = all_logits ? T : n_chunks;
    for (int i = 0, t = 0; i < R; i++) {
        t += all_logits ? 1 : chunks[i].n;
        e->rows[i] = t - 1;
    }
    if (R > e->cap_R) {
        if (e->logits) be->release(e->logits);
        e->cap_R = R;
        e->logits = be->alloc(sizeof(float) * (size_t)R * (s->vocab ? s->vocab : 1));
    }
    be->upload(e->d_rows, e->rows, sizeof(int) * R);
    be->gather_rows(e->xb, e->x, e->d_rows, R, dim);
    be->rmsnorm(e->xf, e->xb, w->rms_final, R, dim, c->norm_eps);
    double t0 = clock_now(e);
    be->matmul(e->logits, e->xf, w->lm_head, R, dim, s->vocab);
    be->download(logits, e->logits, sizeof(float) * R * s->vocab);
    e->tm->lm_head += now_s() - t0;
}
