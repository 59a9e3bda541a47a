#include "attention.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

size_t attention_kv_bytes_per_token(const Attention *a)
{
    const AttnShape *s = &a->shape;
    size_t kv = kv_bytes_per_position(s->n_layers, s->kv_heads, s->head_dim, dtype_bytes(a->kv_dtype));
    return s->keys_only ? kv / 2 : kv;
}

long long attention_kv_capacity(const Attention *a) { return (long long)a->pool.n_blocks * a->pool.block_size * a->topo->dcp; }

void attention_init(Attention *a, const Backend *be, const Topology *topo, CommStats *comm, const AttnShape *shape,
                    size_t kv_memory, int block_size, DType kv_dtype, MergeBackend merge)
{
    memset(a, 0, sizeof *a);
    a->be = be;
    a->topo = topo;
    a->comm = comm;
    a->merge = merge;
    a->shape = *shape;
    a->kv_dtype = kv_dtype;
    size_t memory = kv_memory ? kv_memory : (size_t)256 << 20;
    int B = block_size ? block_size : 16;
    size_t per_block = attention_kv_bytes_per_token(a) * B;
    size_t n_blocks = memory / per_block;
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    pool_init(&a->pool, (int)n_blocks, B);
    /* on the CPU, untouched pages of the pool cost no memory until used */
    size_t bytes = n_blocks * per_block / (shape->keys_only ? 1 : 2);
    a->k_pool = be->alloc(bytes ? bytes : sizeof(float));
    a->v_pool = shape->keys_only ? NULL : be->alloc(bytes ? bytes : sizeof(float));
}

static void free_step_arrays(Attention *a)
{
    Step *s = &a->step;
    void *dev[] = {s->d_pos, s->d_slots, a->ctx_out, a->ctx_lse, a->q_all, a->o_all, a->lse_all, a->lse_ranks,
                   a->parts};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) a->be->release(dev[i]);
    void *host[] = {s->pos, s->slots, s->cache_n, s->cache_key0, (void *)s->cache_tables, s->new_row0, s->new_n,
                    s->new_key0};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    a->ctx_out = a->ctx_lse = a->q_all = a->o_all = a->lse_all = a->lse_ranks = a->parts = NULL;
    const int **chunk_tables = s->chunk_tables;
    memset(s, 0, sizeof *s);
    s->chunk_tables = chunk_tables;
    a->cap_T = 0;
}

void attention_free(Attention *a)
{
    free_step_arrays(a);
    free((void *)a->step.chunk_tables);
    if (a->d_tables) a->be->release(a->d_tables);
    a->be->release(a->k_pool);
    if (a->v_pool) a->be->release(a->v_pool);
    pool_free_all(&a->pool);
    memset(a, 0, sizeof *a);
}

/* Grows the step arrays and the DCP merge buffers to T tokens. */
static void reserve(Attention *a, int T)
{
    if (T <= a->cap_T) return;
    free_step_arrays(a);
    const Backend *be = a->be;
    const AttnShape *sh = &a->shape;
    Step *s = &a->step;
    size_t N = (size_t)a->topo->dcp, t = (size_t)T, H = (size_t)sh->q_heads, qd = H * (size_t)sh->head_dim,
           D = (size_t)(sh->v_dim ? sh->v_dim : sh->head_dim), f = sizeof(float);
    a->cap_T = T;
    s->pos = xmalloc(sizeof(int) * t);
    s->slots = xmalloc(sizeof(int) * t);
    s->d_pos = be->alloc(sizeof(int) * t);
    s->d_slots = be->alloc(sizeof(int) * t);
    s->cache_n = xmalloc(sizeof(int) * N * t);
    s->cache_key0 = xmalloc(sizeof(int) * N * t);
    s->cache_tables = xmalloc(sizeof(int *) * N * t);
    s->new_row0 = xmalloc(sizeof(int) * t);
    s->new_n = xmalloc(sizeof(int) * t);
    s->new_key0 = xmalloc(sizeof(int) * t);
    if (N > 1) {
        a->ctx_out = be->alloc(f * t * H * D);
        a->ctx_lse = be->alloc(f * t * H);
        a->q_all = be->alloc(f * N * t * qd);
        a->o_all = be->alloc(f * N * t * H * D);
        a->lse_all = be->alloc(f * N * t * H);
        a->lse_ranks = be->alloc(f * N * N * t * H);
        a->parts = be->alloc(f * 2 * N * t * H * (D + 1)); /* send and receive halves */
    }
}

/* The chunks' block tables, one after another in backend memory. */
static void upload_tables(Attention *a, const Chunk *chunks, int n_chunks)
{
    Step *s = &a->step;
    int total = 0;
    for (int i = 0; i < n_chunks; i++) total += chunks[i].n_blocks;
    if (total > a->cap_tables) {
        if (a->d_tables) a->be->release(a->d_tables);
        a->cap_tables = total > 2 * a->cap_tables ? total : 2 * a->cap_tables;
        a->d_tables = a->be->alloc(sizeof(int) * (size_t)a->cap_tables);
    }
    if (n_chunks > a->cap_chunks) {
        a->cap_chunks = n_chunks;
        s->chunk_tables = xrealloc((void *)s->chunk_tables, sizeof(int *) * (size_t)n_chunks);
    }
    for (int i = 0, off = 0; i < n_chunks; i++) {
        if (chunks[i].n_blocks) a->be->upload(a->d_tables + off, chunks[i].blocks, sizeof(int) * chunks[i].n_blocks);
        s->chunk_tables[i] = a->d_tables + off;
        off += chunks[i].n_blocks;
    }
}

int attention_begin_step(Attention *a, const Chunk *chunks, int n_chunks)
{
    const Topology *tp = a->topo;
    int T = 0, has_context = 0, B = a->pool.block_size, W = a->shape.window, N = tp->dcp, me = tp->dcp_rank;
    for (int i = 0; i < n_chunks; i++) {
        T += chunks[i].n;
        has_context |= chunks[i].pos0 > 0;
    }
    reserve(a, T);
    upload_tables(a, chunks, n_chunks);
    Step *s = &a->step;
    s->chunks = chunks;
    s->n_chunks = n_chunks;
    s->T = T;
    s->has_context = has_context;
    for (int i = 0, t = 0; i < n_chunks; i++) {
        const Chunk *ch = &chunks[i];
        int local = kv_local_len(tp, ch->pos0, me);
        for (int j = 0; j < ch->n; j++, t++) {
            int p = ch->pos0 + j;
            s->pos[t] = p;
            s->slots[t] = -1;
            if (kv_owner(tp, p) == me) {
                int li = kv_local_index(tp, p);
                s->slots[t] = ch->blocks[li / B] * B + li % B;
            }
            /* a sliding window keeps the keys at positions > p - W: in the
             * cached shard those after this rank's first local positions
             * (local indices grow with the position), in the chunk those
             * after its first j - W + 1 */
            int first = W && p - W + 1 > 0 ? p - W + 1 : 0;
            /* dcp 1: the token's keys are stored before it attends, so it
             * reads positions [0, p]; dcp > 1: the shard before the chunk */
            int upto = N == 1 ? p + 1 : ch->pos0;
            s->cache_n[t] = N == 1 ? upto : local;
            s->cache_key0[t] = first ? kv_local_len(tp, first < upto ? first : upto, me) : 0;
            s->cache_tables[t] = s->chunk_tables[i];
            s->new_row0[t] = t - j;
            s->new_n[t] = j + 1;
            s->new_key0[t] = first > ch->pos0 ? first - ch->pos0 : 0;
        }
    }
    for (int r = 1; r < N; r++) { /* gathered queries of other ranks read the same keys */
        memcpy(s->cache_n + (size_t)r * T, s->cache_n, sizeof(int) * T);
        memcpy(s->cache_key0 + (size_t)r * T, s->cache_key0, sizeof(int) * T);
        memcpy(s->cache_tables + (size_t)r * T, s->cache_tables, sizeof(int *) * T);
    }
    a->be->upload(s->d_pos, s->pos, sizeof(int) * T);
    a->be->upload(s->d_slots, s->slots, sizeof(int) * T);
    return T;
}

static void *kv_layer(const Attention *a, void *pool, int layer)
{
    const AttnShape *s = &a->shape;
    size_t rows = (size_t)layer * a->pool.n_blocks * a->pool.block_size;
    return pool ? (char *)pool + rows * s->kv_heads * s->head_dim * dtype_bytes(a->kv_dtype) : NULL;
}

/* The attention of rows = copies x T queries over this rank's cache of a
 * layer (cache: 1) or over the step's new rows k/v (cache: 0). */
static void attend(const Attention *a, int layer, int sliding, int cache, int copies, const float *q, const float *k,
                   const float *v, float *out, float *lse)
{
    const AttnShape *sh = &a->shape;
    const Step *s = &a->step;
    AttnBatch ab = {.T = s->T * copies, .n_heads = sh->q_heads, .n_kv_heads = sh->kv_heads, .head_dim = sh->head_dim,
                    .scale = sh->scale, .q = q, .out = out, .lse = lse, .kv_stride = sh->kv_heads * sh->head_dim,
                    .v_dim = sh->v_dim, .block_size = a->pool.block_size};
    if (cache) {
        ab.k = kv_layer(a, a->k_pool, layer);
        ab.v = sh->keys_only ? ab.k : kv_layer(a, a->v_pool, layer);
        ab.n_keys = s->cache_n;
        ab.key0 = sliding ? s->cache_key0 : NULL;
        ab.blocks = s->cache_tables;
        ab.kv_dtype = a->kv_dtype;
    } else {
        ab.k = k;
        ab.v = sh->keys_only ? k : v;
        ab.row0 = s->new_row0;
        ab.n_keys = s->new_n;
        ab.key0 = sliding ? s->new_key0 : NULL;
        ab.kv_dtype = DTYPE_F32;
    }
    a->be->attention(&ab);
}

/* Context attention over a KV cache sharded across the DCP group: every
 * rank attends the group's queries to its own shard, then the partials are
 * merged so that each rank ends with its own heads' output and LSE. */
static void context_attention_dcp(Attention *a, int layer, int sliding, const float *q)
{
    const Topology *tp = a->topo;
    const AttnShape *sh = &a->shape;
    const Backend *be = a->be;
    CommStats *cs = a->comm;
    /* D: an output row (MLA: the latent values, narrower than the query) */
    int N = tp->dcp, T = a->step.T, H = sh->q_heads, D = sh->v_dim ? sh->v_dim : sh->head_dim;
    size_t qd = (size_t)H * sh->head_dim, rows = (size_t)T * H; /* rows of one rank's heads */
    /* queries of the whole group: (N, T, H, head_dim) */
    comm_allgather(cs, COMM_q_allgather, q, comm_count(T * qd), a->q_all, tp->dcp_comm);
    attend(a, layer, sliding, 1, N, a->q_all, NULL, NULL, a->o_all, a->lse_all);
    if (a->merge == MERGE_AG_RS) {
        /* every rank's LSEs for all N*rows rows, then the scaled partials
         * summed so that rank d receives block d: its own heads */
        comm_allgather(cs, COMM_lse_allgather, a->lse_all, comm_count(N * rows), a->lse_ranks, tp->dcp_comm);
        be->lse_rescale(a->o_all, a->lse_all, a->lse_ranks, tp->dcp_rank, N, (int)(N * rows), D);
        comm_reduce_scatter_sum(cs, a->o_all, a->ctx_out, comm_count(rows * D), tp->dcp_comm);
        be->copy(a->ctx_lse, a->lse_all + (size_t)tp->dcp_rank * rows, sizeof(float) * rows);
    } else {
        /* block d of (partial, LSE) rows goes to rank d, which combines them */
        float *send = a->parts, *recv = a->parts + (size_t)N * rows * (D + 1);
        be->pack_partials(send, a->o_all, a->lse_all, (int)(N * rows), D);
        comm_alltoall(cs, send, recv, comm_count(rows * (D + 1)), tp->dcp_comm);
        be->lse_combine(a->ctx_out, a->ctx_lse, recv, N, (int)rows, D);
    }
}

void attention_layer(Attention *a, int layer, int sliding, const float *q, float *k, float *v, float *out, float *lse)
{
    const Backend *be = a->be;
    const AttnShape *sh = &a->shape;
    const Step *s = &a->step;
    int T = s->T, kv_row = sh->kv_heads * sh->head_dim, D = sh->v_dim ? sh->v_dim : sh->head_dim;
    void *k_pool = kv_layer(a, a->k_pool, layer), *v_pool = kv_layer(a, a->v_pool, layer);
    if (sh->keys_only) v = NULL;
    if (a->topo->dcp == 1) {
        /* The new keys are stored first and every token reads its keys from
         * the cache in one pass: the same keys in the same order whether
         * its prompt came in one chunk or several, alone or batched, so its
         * result does not depend on either. */
        be->kv_write(k_pool, v_pool, a->kv_dtype, k, v, s->d_slots, T, kv_row, sh->kv_heads, a->pool.block_size);
        attend(a, layer, sliding, 1, 1, q, NULL, NULL, out, lse);
        return;
    }
    /* The cache is sharded: the new keys (which every rank holds) and each
     * rank's cached shard are attended apart; the shards' partials are
     * merged over the DCP group, then with the new part. A bf16 cache's
     * new keys are read as the cache will hold them, as at DCP 1. */
    if (a->kv_dtype == DTYPE_BF16) {
        be->round_bf16(k, (size_t)T * kv_row);
        if (v) be->round_bf16(v, (size_t)T * kv_row);
    }
    attend(a, layer, sliding, 0, 1, q, k, v, out, lse);
    if (s->has_context) {
        context_attention_dcp(a, layer, sliding, q);
        be->merge_attention(out, lse, a->ctx_out, a->ctx_lse, T * sh->q_heads, D);
    }
    /* the owners store the new tokens' K/V (docs/design.md, "Where a token's KV lives") */
    be->kv_write(k_pool, v_pool, a->kv_dtype, k, v, s->d_slots, T, kv_row, sh->kv_heads, a->pool.block_size);
}
