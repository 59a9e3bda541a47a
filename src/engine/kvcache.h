/* The paged KV cache's bookkeeping: a pool of blocks per rank and the
 * block tables of sequences. A block holds B positions of this rank's
 * shard; with DCP, block id b names one such block on each of the N ranks
 * of the group, so a logical block spans B x N positions and one table
 * serves the whole group (docs/design.md, "Where a token's KV lives"). Allocation is
 * deterministic (lowest free id first), so every rank of a DP group that
 * makes the same calls holds the same tables. */
#ifndef DCP_KVCACHE_H
#define DCP_KVCACHE_H

#include <stddef.h>

typedef struct {
    int n_blocks;
    int block_size; /* B: positions per block on one rank */
    int n_free;
    /* free ids: next_fresh and above, and the min-heap of released ids
     * below it; the lowest free id is allocated first */
    int next_fresh;
    int *heap;
    int n_heap, cap_heap;
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
/* Returns every block of t to the pool. */
void table_release(BlockPool *p, BlockTable *t);
void table_free(BlockTable *t);

/* Bytes of (K, V) one rank stores per position: 2 x elem_bytes x layers x
 * kv_heads x head_dim (elem_bytes: 4 for fp32, 2 for a bf16 cache). */
size_t kv_bytes_per_position(int n_layers, int kv_heads, int head_dim, size_t elem_bytes);
/* Parses a byte count with an optional K, M, G, T or P suffix (powers of
 * 1024); from 1K to 1P, else -1. */
int parse_bytes(const char *s, size_t *out);

#endif
