#include "kvcache.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Never-cached free ids: every id from next_fresh up has never been handed
 * out, and the ids released below it form a binary min-heap. Allocation
 * takes the lowest (deterministic whatever order requests finished in) at
 * O(log n) a block, and the bookkeeping grows with the blocks in use, not
 * with the size of the pool. */
static void heap_push(BlockPool *p, int id)
{
    if (p->n_heap == p->cap_heap)
        p->heap = xrealloc(p->heap, sizeof(int) * (size_t)(p->cap_heap = p->cap_heap ? 2 * p->cap_heap : 256));
    int i = p->n_heap++;
    while (i > 0 && p->heap[(i - 1) / 2] > id) {
        p->heap[i] = p->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    p->heap[i] = id;
}

static int heap_pop(BlockPool *p)
{
    int top = p->heap[0], last = p->heap[--p->n_heap], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= p->n_heap) break;
        if (c + 1 < p->n_heap && p->heap[c + 1] < p->heap[c]) c++;
        if (p->heap[c] >= last) break;
        p->heap[i] = p->heap[c];
        i = c;
    }
    if (p->n_heap) p->heap[i] = last;
    return top;
}

/* the per-block arrays cover ids below n */
static void grow_blocks(BlockPool *p, int n)
{
    if (n <= p->cap) return;
    int old = p->cap, cap = n > 2 * old ? n : 2 * old;
    if (cap > p->n_blocks) cap = p->n_blocks;
    size_t c = (size_t)cap;
    p->ref = xrealloc(p->ref, sizeof(int) * c);
    memset(p->ref + old, 0, sizeof(int) * (c - old));
    if (p->caching) {
        p->hash = xrealloc(p->hash, sizeof(uint64_t) * c);
        p->serial = xrealloc(p->serial, sizeof(uint64_t) * c);
        p->parent = xrealloc(p->parent, sizeof(uint64_t) * c);
        p->tokens = xrealloc(p->tokens, sizeof(int) * c * (size_t)p->block_tokens);
        p->chain = xrealloc(p->chain, sizeof(int) * c);
        p->lru_prev = xrealloc(p->lru_prev, sizeof(int) * c);
        p->lru_next = xrealloc(p->lru_next, sizeof(int) * c);
        memset(p->serial + old, 0, sizeof(uint64_t) * (c - old));
    }
    p->cap = cap;
}

/* a 64-bit mix of x: splitmix64's output at state x */
static uint64_t mix64(uint64_t x) { return splitmix64(&x); }

static uint64_t hash_bits(uint64_t h)
{
    return DCP_PREFIX_HASH_BITS >= 64 ? h : h & ((1ULL << DCP_PREFIX_HASH_BITS) - 1);
}

uint64_t prefix_hash(const BlockPool *p, uint64_t parent, const int *tokens)
{
    uint64_t h = mix64(parent);
    for (int i = 0; i < p->block_tokens; i++) h = mix64(h ^ ((uint64_t)(uint32_t)tokens[i] | (uint64_t)(i + 1) << 32));
    return hash_bits(h);
}

static int *bucket_of(const BlockPool *p, uint64_t hash) { return &p->bucket[mix64(hash) & (uint64_t)(p->n_buckets - 1)]; }

int prefix_find(const BlockPool *p, uint64_t hash, uint64_t parent_serial, const int *tokens)
{
    if (!p->n_recorded) return -1;
    for (int id = *bucket_of(p, hash); id >= 0; id = p->chain[id])
        if (p->hash[id] == hash && p->parent[id] == parent_serial &&
            !memcmp(p->tokens + (size_t)id * p->block_tokens, tokens, sizeof(int) * (size_t)p->block_tokens))
            return id;
    return -1;
}

static void rehash(BlockPool *p, int n_buckets)
{
    free(p->bucket);
    p->bucket = xmalloc(sizeof(int) * (size_t)n_buckets);
    p->n_buckets = n_buckets;
    for (int i = 0; i < n_buckets; i++) p->bucket[i] = -1;
    for (int id = 0; id < p->cap; id++)
        if (p->serial[id]) {
            int *b = bucket_of(p, p->hash[id]);
            p->chain[id] = *b;
            *b = id;
        }
}

uint64_t prefix_record(BlockPool *p, int id, uint64_t hash, uint64_t parent_serial, const int *tokens)
{
    int same = prefix_find(p, hash, parent_serial, tokens);
    if (same >= 0) return p->serial[same];
    if (2 * (p->n_recorded + 1) > p->n_buckets) rehash(p, p->n_buckets ? 2 * p->n_buckets : 1024);
    p->hash[id] = hash;
    p->parent[id] = parent_serial;
    p->serial[id] = ++p->next_serial;
    memcpy(p->tokens + (size_t)id * p->block_tokens, tokens, sizeof(int) * (size_t)p->block_tokens);
    int *b = bucket_of(p, hash);
    p->chain[id] = *b;
    *b = id;
    p->n_recorded++;
    return p->serial[id];
}

/* forgets block id's record; records of blocks after it stay, unreachable
 * (their parent serial is never given again) until they are evicted too */
static void unrecord(BlockPool *p, int id)
{
    int *at = bucket_of(p, p->hash[id]);
    while (*at != id) at = &p->chain[*at];
    *at = p->chain[id];
    p->serial[id] = 0;
    p->n_recorded--;
}

static void lru_unlink(BlockPool *p, int id)
{
    int a = p->lru_prev[id], b = p->lru_next[id];
    if (a >= 0) p->lru_next[a] = b;
    else p->lru_head = b;
    if (b >= 0) p->lru_prev[b] = a;
    else p->lru_tail = a;
    p->n_lru--;
}

static void lru_append(BlockPool *p, int id)
{
    p->lru_prev[id] = p->lru_tail;
    p->lru_next[id] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = id;
    else p->lru_head = id;
    p->lru_tail = id;
    p->n_lru++;
}

/* A free block for a table: the lowest never-cached id, else the least
 * recently released cached block, evicted. The caller has checked n_free. */
static int take_block(BlockPool *p)
{
    int id;
    if (p->n_heap) {
        id = heap_pop(p);
    } else if (p->next_fresh < p->n_blocks) {
        id = p->next_fresh++;
        grow_blocks(p, id + 1);
    } else {
        id = p->lru_head;
        lru_unlink(p, id);
        unrecord(p, id);
        p->evictions++;
    }
    p->ref[id] = 1;
    p->n_free--;
    return id;
}

void pool_init(BlockPool *p, int n_blocks, int block_size)
{
    memset(p, 0, sizeof *p);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->n_free = n_blocks;
    p->lru_head = p->lru_tail = -1;
}

void pool_free_all(BlockPool *p)
{
    void *arrays[] = {p->heap, p->ref, p->hash, p->serial, p->parent, p->tokens, p->chain, p->lru_prev, p->lru_next,
                      p->bucket};
    for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++) free(arrays[i]);
    memset(p, 0, sizeof *p);
}

void pool_prefix_caching(BlockPool *p, int on, int dcp, int interleave, int kv_dtype)
{
    /* no table holds a block: start afresh, every id never cached */
    int n_blocks = p->n_blocks, B = p->block_size;
    pool_free_all(p);
    pool_init(p, n_blocks, B);
    p->caching = on;
    p->block_tokens = B * dcp;
    uint64_t salt = (uint64_t)kv_dtype << 48 ^ (uint64_t)interleave << 32 ^ (uint64_t)B << 16 ^ (uint64_t)dcp;
    p->root = hash_bits(mix64(salt ^ 0x243f6a8885a308d3ULL));
}

static void grow_table(BlockTable *t, int n)
{
    if (n > t->cap) t->ids = xrealloc(t->ids, sizeof(int) * (size_t)(t->cap = n > 2 * t->cap ? n : 2 * t->cap));
}

int table_reserve(BlockPool *p, BlockTable *t, int n)
{
    int missing = n - t->n;
    if (missing <= 0) return 0;
    if (missing > p->n_free) return -1;
    grow_table(t, n);
    while (t->n < n) t->ids[t->n++] = take_block(p);
    return 0;
}

int table_share_reserve(BlockPool *p, BlockTable *t, const int *shared, int n_shared, int n)
{
    /* the cached blocks no table holds yet leave the free count */
    int revived = 0;
    for (int i = 0; i < n_shared; i++) revived += p->ref[shared[i]] == 0;
    int total = n > n_shared ? n : n_shared;
    if (total - n_shared > p->n_free - revived) return -1;
    grow_table(t, total);
    for (int i = 0; i < n_shared; i++) {
        int id = shared[i];
        if (p->ref[id] == 0) {
            lru_unlink(p, id);
            p->n_free--;
        } else {
            p->shared++;
        }
        p->ref[id]++;
        t->ids[t->n++] = id;
    }
    return table_reserve(p, t, total);
}

void table_truncate(BlockPool *p, BlockTable *t, int keep)
{
    /* last block first: a sequence's later blocks, the least likely to be
     * shared, are evicted before its earlier ones */
    for (int i = t->n - 1; i >= keep; i--) {
        int id = t->ids[i];
        if (--p->ref[id] > 0) {
            p->shared--;
            continue;
        }
        p->n_free++;
        if (p->caching && p->serial[id]) lru_append(p, id);
        else heap_push(p, id);
    }
    if (t->n > keep) t->n = keep;
}

void table_release(BlockPool *p, BlockTable *t) { table_truncate(p, t, 0); }

void table_free(BlockTable *t)
{
    free(t->ids);
    memset(t, 0, sizeof *t);
}

size_t kv_bytes_per_position(int n_layers, int kv_heads, int head_dim, size_t elem_bytes)
{
    return 2 * elem_bytes * (size_t)n_layers * kv_heads * head_dim;
}

