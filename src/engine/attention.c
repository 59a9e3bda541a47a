#include "attention.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tree.h"
#include "util.h"

size_t attention_kv_bytes_per_token(const Attention *a) { return a->kv.bytes_per_token; }

long long attention_kv_capacity(const Attention *a) { return a->kv.capacity; }

void kv_sizing(const AttnShape *shape, DType kv_dtype, size_t kv_memory, int block_size, int dcp, KvSizing *out)
{
    size_t kv = kv_bytes_per_position(shape->n_layers, shape->kv_heads, shape->head_dim, dtype_bytes(kv_dtype));
    out->bytes_per_token = shape->keys_only ? kv / 2 : kv;
    size_t memory = kv_memory ? kv_memory : (size_t)256 << 20;
    out->block_size = block_size ? block_size : 16;
    size_t n_blocks = memory / (out->bytes_per_token * (size_t)out->block_size);
    out->n_blocks = (int)(n_blocks > (1u << 30) ? 1u << 30 : n_blocks);
    out->capacity = (long long)out->n_blocks * out->block_size * dcp;
}

/* The KV pool of kv_memory bytes (kv_sizing) */
static void alloc_pool(Attention *a, size_t kv_memory, int block_size)
{
    kv_sizing(&a->shape, a->kv_dtype, kv_memory, block_size, a->topo->dcp, &a->kv);
    const KvSizing *kv = &a->kv;
    pool_init(&a->pool, kv->n_blocks, kv->block_size);
    /* on the CPU, untouched pages of the pool cost no memory until used */
    size_t bytes = (size_t)kv->n_blocks * kv->block_size * kv->bytes_per_token / (a->shape.keys_only ? 1 : 2);
    a->k_pool = a->be->alloc(bytes ? bytes : sizeof(float));
    a->v_pool = a->shape.keys_only ? NULL : a->be->alloc(bytes ? bytes : sizeof(float));
}

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
    /* the canonical key shards this rank holds; a dcp that does not divide
     * their count attends its whole shard as one */
    int C = shape->key_shards > 0 ? shape->key_shards : 1;
    a->shards = C % topo->dcp ? 1 : C / topo->dcp;
    alloc_pool(a, kv_memory, block_size);
}

void attention_resize_kv(Attention *a, size_t kv_memory)
{
    a->be->release(a->k_pool);
    if (a->v_pool) a->be->release(a->v_pool);
    pool_free_all(&a->pool);
    alloc_pool(a, kv_memory, a->kv.block_size);
}

static void free_step_arrays(Attention *a)
{
    Step *s = &a->step;
    void *dev[] = {s->d_meta, (void *)s->d_cache_tables, a->q_all, a->o_all, a->lse_all, a->parts};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) a->be->release(dev[i]);
    void *host[] = {s->meta, (void *)s->cache_tables};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
    a->q_all = a->o_all = a->lse_all = a->parts = NULL;
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
    free(a->h_tables);
    a->be->release(a->k_pool);
    if (a->v_pool) a->be->release(a->v_pool);
    pool_free_all(&a->pool);
    memset(a, 0, sizeof *a);
}

/* The step's integer arrays: pos, slots, new_row0, new_n, new_key0 of T
 * entries and cache_n, cache_key0 of N x T, for a DCP group of N. */
#define META_ARRAYS(N) (5 + 2 * (size_t)(N))

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
    s->meta = xmalloc(sizeof(int) * META_ARRAYS(N) * t);
    s->d_meta = be->alloc(sizeof(int) * META_ARRAYS(N) * t);
    s->cache_tables = xmalloc(sizeof(int *) * N * t);
    s->d_cache_tables = be->alloc(sizeof(int *) * N * t);
    if (N > 1) {
        a->q_all = be->alloc(f * N * t * qd);
        a->o_all = be->alloc(f * N * t * H * D);
        a->lse_all = be->alloc(f * N * t * H);
        a->parts = be->alloc(f * 2 * N * t * H * (D + 1)); /* held and received rows */
    }
}

/* Room for `total` entries of block tables (none is freed in a step
 * that fits) */
static void tables_room(Attention *a, size_t total, size_t at_least)
{
    if (total <= (size_t)a->cap_tables) return;
    if (a->d_tables) a->be->release(a->d_tables);
    size_t cap = total > at_least ? total : at_least;
    if (cap > INT_MAX) cap = total;
    a->cap_tables = (int)cap;
    a->d_tables = a->be->alloc(sizeof(int) * cap);
    a->h_tables = xrealloc(a->h_tables, sizeof(int) * cap);
}

void attention_reserve_tables(Attention *a, size_t entries)
{
    tables_room(a, entries < INT_MAX ? entries : INT_MAX, 0);
}

/* The chunks' block tables, one after another in backend memory. */
static void upload_tables(Attention *a, const Chunk *chunks, int n_chunks)
{
    Step *s = &a->step;
    int total = 0;
    for (int i = 0; i < n_chunks; i++) total += chunks[i].n_blocks;
    tables_room(a, (size_t)total, 2 * (size_t)a->cap_tables);
    if (n_chunks > a->cap_chunks) {
        a->cap_chunks = n_chunks;
        s->chunk_tables = xrealloc((void *)s->chunk_tables, sizeof(int *) * (size_t)n_chunks);
    }
    for (int i = 0, off = 0; i < n_chunks; i++) {
        if (chunks[i].n_blocks) memcpy(a->h_tables + off, chunks[i].blocks, sizeof(int) * chunks[i].n_blocks);
        s->chunk_tables[i] = a->d_tables + off;
        off += chunks[i].n_blocks;
    }
    a->be->upload(a->d_tables, a->h_tables, sizeof(int) * (size_t)total);
}

int attention_begin_step(Attention *a, const Chunk *chunks, int n_chunks)
{
    const Topology *tp = a->topo;
    int T = 0, B = a->pool.block_size, W = a->shape.window, N = tp->dcp, me = tp->dcp_rank, has_context = 0;
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
    /* the arrays one after another for this T, host and backend alike */
    int **host[] = {&s->pos, &s->slots, &s->new_row0, &s->new_n, &s->new_key0, &s->cache_n, &s->cache_key0},
        **dev[] = {&s->d_pos, &s->d_slots, &s->d_new_row0, &s->d_new_n, &s->d_new_key0, &s->d_cache_n,
                   &s->d_cache_key0};
    for (size_t i = 0, off = 0; i < sizeof host / sizeof *host; off += (size_t)T * (i < 5 ? 1 : N), i++) {
        *host[i] = s->meta + off;
        *dev[i] = s->d_meta + off;
    }
    for (int i = 0, t = 0; i < n_chunks; i++) {
        const Chunk *ch = &chunks[i];
        for (int j = 0; j < ch->n; j++, t++) {
            int p = ch->pos0 + j;
            s->pos[t] = p;
            s->slots[t] = -1;
            if (kv_owner(tp, p) == me) {
                int li = kv_local_index(tp, p);
                s->slots[t] = ch->blocks[li / B] * B + li % B;
            }
            /* The new keys are stored before any token attends, and every
             * token reads its keys from the cache: positions [0, p] of its
             * sequence, this rank's shard of them. A sliding window keeps
             * those > p - W: in the shard, the ones after this rank's first
             * local positions (local indices grow with the position). */
            int first = W && p - W + 1 > 0 ? p - W + 1 : 0;
            s->cache_n[t] = kv_local_len(tp, p + 1, me);
            s->cache_key0[t] = first ? kv_local_len(tp, first, me) : 0;
            s->cache_tables[t] = s->chunk_tables[i];
            /* a chunk from position 0: its key j is position j */
            s->new_row0[t] = t - j;
            s->new_n[t] = j + 1;
            s->new_key0[t] = first;
        }
    }
    for (int r = 1; r < N; r++) { /* gathered queries of other ranks read the same keys */
        memcpy(s->cache_n + (size_t)r * T, s->cache_n, sizeof(int) * T);
        memcpy(s->cache_key0 + (size_t)r * T, s->cache_key0, sizeof(int) * T);
        memcpy(s->cache_tables + (size_t)r * T, s->cache_tables, sizeof(int *) * T);
    }
    a->be->upload(s->d_meta, s->meta, sizeof(int) * META_ARRAYS(N) * T);
    a->be->upload((void *)s->d_cache_tables, s->cache_tables, sizeof(int *) * (size_t)N * T);
    return T;
}

static void *kv_layer(const Attention *a, void *pool, int layer)
{
    const AttnShape *s = &a->shape;
    size_t rows = (size_t)layer * a->pool.n_blocks * a->pool.block_size;
    return pool ? (char *)pool + rows * s->kv_heads * s->head_dim * dtype_bytes(a->kv_dtype) : NULL;
}

/* The attention of copies x T queries over this rank's cache of a layer,
 * its keys in the canonical key shards this rank holds (Attention);
 * k_scale: the FP8 cache's key scale (1 for others) */
static void attend(const Attention *a, int layer, int sliding, int copies, const float *q, float *out, float *lse,
                   float k_scale)
{
    const AttnShape *sh = &a->shape;
    const Step *s = &a->step;
    AttnBatch ab = {.T = s->T * copies, .n_heads = sh->q_heads, .n_kv_heads = sh->kv_heads, .head_dim = sh->head_dim,
                    .scale = sh->scale * k_scale, .q = q, .out = out, .lse = lse, .kv_stride = sh->kv_heads * sh->head_dim,
                    .v_dim = sh->v_dim, .block_size = a->pool.block_size, .n_keys = s->cache_n,
                    .key0 = sliding ? s->cache_key0 : NULL, .blocks = s->cache_tables, .kv_dtype = a->kv_dtype,
                    .shards = a->shards, .shard_interleave = a->topo->interleave, .d_n_keys = s->d_cache_n,
                    .d_key0 = sliding ? s->d_cache_key0 : NULL, .d_blocks = s->d_cache_tables};
    ab.k = kv_layer(a, a->k_pool, layer);
    ab.v = sh->keys_only ? ab.k : kv_layer(a, a->v_pool, layer);
    a->be->attention(&ab);
}

/* The DCP group's merge of its ranks' partials (docs/design.md, "Same bits
 * at any layout"): rank d's partial for rank e's heads is block e of
 * parts (N blocks of rows x (D + 1): outputs, then the LSE). The merge
 * tree (tree.h) merges rank d's with rank d + N/2's first, then d + N/4's, ...; rank d
 * ends with its own heads' merge in block d (ag_rs) or block 0 (a2a);
 * returns that block. */
static float *merge_ranks(Attention *a, float *parts, int rows, int D)
{
    const Topology *tp = a->topo;
    const Backend *be = a->be;
    CommStats *cs = a->comm;
    int N = tp->dcp, me = tp->dcp_rank;
    size_t blk = (size_t)rows * (D + 1);
    float *recv = parts + (size_t)N * blk;
    if (a->merge == MERGE_AG_RS && (N & (N - 1)) == 0) {
        /* recursive halving: each step halves the blocks a rank holds,
         * exchanging the other half with the rank whose partial the tree
         * merges with its own at that level */
        int lo = 0;
        for (int h = N / 2; h >= 1; h /= 2) {
            int partner = me ^ h, keep = me & h ? lo + h : lo, give = me & h ? lo : lo + h;
            comm_sendrecv(cs, COMM_merge_exchange, parts + (size_t)give * blk, recv, comm_count(h * blk), partner,
                          GROUP_DCP);
            be->merge_partials(parts + (size_t)keep * blk, recv, h * rows, D, D + 1);
            lo = keep;
        }
        return parts + (size_t)me * blk;
    }
    /* a2a: every rank's partial of this rank's heads, merged here */
    comm_alltoall(cs, parts, recv, comm_count(blk), GROUP_DCP);
    for (int i = 0; i < N - 1; i++) {
        TreeStep st = tree_merge_step(N, i);
        be->merge_partials(recv + (size_t)st.into * blk, recv + (size_t)st.from * blk, rows, D, D + 1);
    }
    return recv;
}

/* attention_layer's work on keys and values as the cache holds them */
static void attend_and_merge(Attention *a, int layer, int sliding, const float *q, float *k, float *v, float *out,
                             float *lse, void *k_pool, void *v_pool, float ks)
{
    const Backend *be = a->be;
    const AttnShape *sh = &a->shape;
    const Topology *tp = a->topo;
    const Step *s = &a->step;
    int T = s->T, kv_row = sh->kv_heads * sh->head_dim, D = sh->v_dim ? sh->v_dim : sh->head_dim, N = tp->dcp;
    /* The owners store the new keys first (docs/design.md, "Where a token's
     * KV lives"), and every token reads its keys from the cache in one
     * pass: the same keys in the same order whether its prompt came in one
     * chunk or several, alone or batched. */
    be->kv_write(k_pool, v_pool, a->kv_dtype, k, v, s->d_slots, T, kv_row, sh->kv_heads, a->pool.block_size);
    if (N == 1) {
        attend(a, layer, sliding, 1, q, out, lse, ks);
        return;
    }
    if (!s->has_context) {
        /* Every chunk starts its sequence, so every rank holds all of its
         * keys in the step's rows: each attends its own heads to them by
         * all the key shards, the whole tree here and no partial to send.
         * A bf16 or FP8 cache's keys are read as it holds them. */
        if (a->kv_dtype != DTYPE_F32) {
            be->round_kv(k, (size_t)T * kv_row, a->kv_dtype);
            if (v) be->round_kv(v, (size_t)T * kv_row, a->kv_dtype);
        }
        AttnBatch ab = {.T = T, .n_heads = sh->q_heads, .n_kv_heads = sh->kv_heads, .head_dim = sh->head_dim,
                        .scale = sh->scale * ks, .q = q, .out = out, .lse = lse, .k = k, .v = v ? v : k,
                        .n_keys = s->new_n, .key0 = sliding ? s->new_key0 : NULL, .kv_stride = kv_row,
                        .v_dim = sh->v_dim, .kv_dtype = DTYPE_F32, .row0 = s->new_row0,
                        .shards = a->shards * N, .shard_interleave = tp->interleave, .d_n_keys = s->d_new_n,
                        .d_key0 = sliding ? s->d_new_key0 : NULL, .d_row0 = s->d_new_row0};
        be->attention(&ab);
        return;
    }
    /* The cache is sharded: every rank attends the group's queries to its
     * shard, and the partials are merged over the group. */
    int H = sh->q_heads, rows = T * H;
    size_t qd = (size_t)H * sh->head_dim;
    comm_allgather(a->comm, COMM_q_allgather, q, comm_count(T * qd), a->q_all, GROUP_DCP);
    attend(a, layer, sliding, N, a->q_all, a->o_all, a->lse_all, ks);
    be->pack_partials(a->parts, a->o_all, a->lse_all, N * rows, D);
    const float *mine = merge_ranks(a, a->parts, rows, D);
    be->strided_copy(out, D, mine, D + 1, rows, D);
    be->strided_copy(lse, 1, mine + D, D + 1, rows, 1);
}

void attention_layer(Attention *a, int layer, int sliding, const float *q, float *k, float *v, float *out, float *lse)
{
    const Backend *be = a->be;
    const AttnShape *sh = &a->shape;
    int T = a->step.T, kv_row = sh->kv_heads * sh->head_dim, D = sh->v_dim ? sh->v_dim : sh->head_dim;
    void *k_pool = kv_layer(a, a->k_pool, layer), *v_pool = kv_layer(a, a->v_pool, layer);
    if (sh->keys_only) v = NULL;
    /* an FP8 cache with the checkpoint's scales: it holds k / k_scale and
     * v / v_scale (the new rows divided here, in place: nothing reads them
     * after); the scores take k_scale in the softmax scale and the output
     * v_scale, after every merge, as at every layout */
    float ks = a->kv_scale && a->kv_dtype == DTYPE_F8_E4M3 ? a->kv_scale[2 * layer] : 1.0f;
    float vs = a->kv_scale && a->kv_dtype == DTYPE_F8_E4M3 ? a->kv_scale[2 * layer + (sh->keys_only ? 0 : 1)] : 1.0f;
    if (ks != 1.0f) be->scale(k, (size_t)T * kv_row, ks, 1);
    if (v && vs != 1.0f) be->scale(v, (size_t)T * kv_row, vs, 1);
    attend_and_merge(a, layer, sliding, q, k, v, out, lse, k_pool, v_pool, ks);
    if (vs != 1.0f) be->scale(out, (size_t)T * sh->q_heads * D, vs, 0);
}
