/* The paged KV cache's bookkeeping: a pool of blocks per rank and the
 * block tables of sequences. A block holds B positions of this rank's
 * shard; with DCP, block id b names one such block on each of the N ranks
 * of the group, so a logical block spans B x N positions and one table
 * serves the whole group (docs/design.md, "Where a token's KV lives").
 * Allocation is deterministic, so every rank of a DP group that makes the
 * same calls holds the same tables.
 *
 * Prefix caching (docs/design.md, "Prefix caching"): a full logical block
 * can be recorded with the tokens it holds; tables then share it by
 * reference count, and when its last holder lets go it stays cached
 * (still free to allocate) until it is evicted, least recently released
 * first, for a block nobody caches. */
#ifndef DCP_KVCACHE_H
#define DCP_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

/* Bits of the prefix hash: 64, or fewer in a test build that forces
 * collisions (-DDCP_PREFIX_HASH_BITS=2). A match never rests on the hash
 * alone (prefix_find). */
#ifndef DCP_PREFIX_HASH_BITS
#define DCP_PREFIX_HASH_BITS 64
#endif

typedef struct {
    int n_blocks;
    int block_size; /* B: positions per block on one rank */
    int n_free;     /* blocks no table holds: never cached ones and cached ones */
    /* never-cached free ids: next_fresh and above, and the min-heap of
     * released ids below it; the lowest is allocated first */
    int next_fresh;
    int *heap;
    int n_heap, cap_heap;
    /* per block id below cap (they grow with next_fresh) */
    int cap;
    int *ref;           /* tables holding the block */
    long long shared;   /* sum over blocks of (ref - 1) where ref > 1 */
    /* the prefix cache; caching 0: nothing is recorded */
    int caching;
    int block_tokens;   /* global positions of a logical block: B x dcp */
    uint64_t root;      /* the hash chain's start: what else changes KV */
    uint64_t *hash;     /* per block: its recorded hash */
    uint64_t *serial;   /* per block: its record's number (never reused); 0: not recorded */
    uint64_t *parent;   /* per block: the serial of the block before it; 0: the first */
    int *tokens;        /* per block: its block_tokens token ids */
    int *chain;         /* per block: the next block in its hash bucket, -1 */
    int *lru_prev, *lru_next; /* cached blocks no table holds, least recently released first */
    int lru_head, lru_tail, n_lru;
    int *bucket;        /* n_buckets (a power of two) heads of bucket chains */
    int n_buckets, n_recorded;
    uint64_t next_serial;
    long long evictions; /* cached blocks reused for other content */
} BlockPool;

typedef struct {
    int *ids;
    int n, cap;
} BlockTable;

void pool_init(BlockPool *p, int n_blocks, int block_size);
void pool_free_all(BlockPool *p);
static inline int pool_used(const BlockPool *p) { return p->n_blocks - p->n_free; }

/* Grows t to n blocks; fails (returns -1, t unchanged) when the pool has
 * fewer than the missing blocks free. */
int table_reserve(BlockPool *p, BlockTable *t, int n);
/* Starts the empty t with the cached blocks shared[0..n_shared) and grows it
 * to n blocks; fails (-1, t and the pool unchanged) when the pool lacks
 * the blocks. */
int table_share_reserve(BlockPool *p, BlockTable *t, const int *shared, int n_shared, int n);
/* Lets go of the table's blocks after its first `keep` (speculative
 * decoding's rejected positions), the last first. */
void table_truncate(BlockPool *p, BlockTable *t, int keep);
/* Lets go of every block of t: a recorded block stays cached, its last
 * blocks the first to be evicted. */
void table_release(BlockPool *p, BlockTable *t);
void table_free(BlockTable *t);

/* Turns prefix caching on (or off, forgetting every cached block) for a
 * pool no table holds a block of. A logical block spans B x dcp
 * positions; its K/V depends on its tokens and on the cache's layout
 * (dcp, interleave) and element type (kv_dtype, a DType), which start the
 * hash chain. */
void pool_prefix_caching(BlockPool *p, int on, int dcp, int interleave, int kv_dtype);
/* The hash of a logical block holding tokens (block_tokens ids) after a
 * block of hash parent (p->root for the first block). */
uint64_t prefix_hash(const BlockPool *p, uint64_t parent, const int *tokens);
/* The cached block that holds exactly tokens right after the cached block
 * numbered parent_serial (0: at the start), or -1. The hash only picks the
 * bucket: the tokens are compared in full and the parent is the very
 * record the previous block matched, so by induction a match holds the
 * same tokens at every position before it. */
int prefix_find(const BlockPool *p, uint64_t hash, uint64_t parent_serial, const int *tokens);
/* Records block id (full, its K/V stored) as holding tokens after the
 * record parent_serial. Returns the serial that stands for this content
 * from now on: id's, or that of an identical record (id then stays
 * unrecorded and is freed as never cached). */
uint64_t prefix_record(BlockPool *p, int id, uint64_t hash, uint64_t parent_serial, const int *tokens);
static inline uint64_t prefix_serial(const BlockPool *p, int id) { return p->serial[id]; }

/* Bytes of (K, V) one rank stores per position: 2 x elem_bytes x layers x
 * kv_heads x head_dim (elem_bytes: 4 for fp32, 2 for a bf16 cache). */
size_t kv_bytes_per_position(int n_layers, int kv_heads, int head_dim, size_t elem_bytes);

#endif
