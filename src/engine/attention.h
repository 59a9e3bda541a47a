/* The attention core every layer family calls: this rank's paged KV cache,
 * the step's KV metadata (built once per step, read by every layer), and
 * attention of a layer's queries over the cache, merged over the DCP group
 * when the cache is sharded (docs/design.md, "Attention with a sharded KV
 * cache").
 *
 * A step is a batch of chunks. A chunk is n consecutive tokens of one
 * sequence starting at position pos0: a whole or partial prompt (prefill),
 * or one token (decode). The chunk's keys are stored first; then every
 * token attends its keys in the cache, by the canonical key shards, merged
 * over the DCP group by the canonical tree (docs/design.md, "Same bits at
 * any layout"); a step of only fresh prompts attends their own rows on
 * every rank, by all the shards. Every buffer comes from the backend, so
 * the same code drives the CPU and the GPU. */
#ifndef DCP_ATTENTION_H
#define DCP_ATTENTION_H

#include "backend.h"
#include "comm.h"
#include "kvcache.h"
#include "topology.h"

typedef struct {
    const int *blocks; /* the sequence's block table (kvcache.h), host memory */
    int n_blocks;      /* entries in it */
    int pos0;          /* position of the chunk's first token; positions < pos0 are cached */
    int n;             /* tokens in the chunk */
} Chunk;

typedef enum { MERGE_AG_RS, MERGE_A2A } MergeBackend;

/* A family's attention, fixed for the run: the cache row and the score. */
typedef struct {
    int n_layers;
    int q_heads;    /* this rank's query heads */
    int kv_heads;   /* KV heads in a cache row (this rank's) */
    int head_dim;   /* elements of a KV head's key, and of a query head */
    int v_dim;      /* values: the first v_dim elements of each value row; 0: head_dim */
    int keys_only;  /* 1: no value pool, the values are the key rows (MLA's latent rows) */
    float scale;    /* of the scores */
    int window;     /* sliding window in positions (layers that slide); 0: none */
    int key_shards; /* the model's canonical key shards (Shard) */
} AttnShape;

/* The step's metadata, built once per step from its chunks on the host
 * and uploaded once: the integer arrays as one block (meta, d_meta), the
 * block-table pointers as another, the chunks' block tables as a third;
 * every layer's attention reads the backend's copies (AttnBatch.d_*). The
 * key sets: cache, the keys each token reads from this rank's cache, its
 * shard of every position up to its own (stored first), repeated for each
 * rank's gathered queries under DCP; new, the keys of a chunk that starts
 * its sequence, in the step's own rows (a step of only such chunks attends
 * them on every rank, without the DCP group). */
typedef struct {
    const Chunk *chunks;
    int n_chunks, T, has_context;
    int *meta, *d_meta;         /* the arrays below, host and backend, one after another */
    int *pos;                   /* (T) positions */
    int *slots;                 /* (T) row of this rank's pool each token is stored at, -1: another rank's */
    int *cache_n, *cache_key0;  /* (copies x T) */
    int *new_row0, *new_n, *new_key0; /* (T) */
    int *d_pos, *d_slots, *d_cache_n, *d_cache_key0, *d_new_row0, *d_new_n, *d_new_key0; /* in d_meta */
    const int **chunk_tables;   /* (n_chunks) each chunk's block table in backend memory */
    const int **cache_tables;   /* (copies x T), host */
    const int **d_cache_tables; /* the same in backend memory */
} Step;

/* What a KV pool holds, from the family's shape alone: one
 * implementation for the run (attention_init) and for planning without
 * the hardware (dcpinfer-plan). */
typedef struct {
    size_t bytes_per_token; /* K/V bytes a rank stores per position it owns */
    int block_size;         /* B: positions per block per rank */
    int n_blocks;           /* blocks per rank */
    long long capacity;     /* positions the DCP group holds: blocks x B x dcp */
} KvSizing;

typedef struct {
    const Backend *be;
    const Topology *topo;
    CommStats *comm;
    MergeBackend merge;
    AttnShape shape;
    /* paged KV cache of this rank: (layer, block, kv_heads, block_size, head_dim) */
    BlockPool pool;
    void *k_pool, *v_pool; /* elements of kv_dtype; v_pool NULL when keys_only */
    DType kv_dtype;
    /* an FP8 cache's per-layer scales, k then v for each layer (host; NULL:
     * 1): the cache holds x / scale; the keys' scale multiplies the
     * softmax scale and the values' the attention's output (the latent
     * cache's: its k_scale both) */
    const float *kv_scale;
    KvSizing kv;            /* the pool's sizing */
    Step step;
    /* capacities of the step arrays (tokens, chunks, table entries) */
    int cap_T, cap_chunks, cap_tables;
    int *d_tables, *h_tables; /* the step's chunks' block tables, backend and host */
    /* the canonical key shards this rank holds (AttnBatch.shards) */
    int shards;
    /* DCP merge buffers (dcp > 1), sized for cap_T tokens */
    float *q_all, *o_all, *lse_all, *parts;
} Attention;

/* kv_memory: bytes of K/V per rank (0: 256 MiB); block_size 0: 16. */
void kv_sizing(const AttnShape *shape, DType kv_dtype, size_t kv_memory, int block_size, int dcp, KvSizing *out);

/* kv_memory: bytes of K/V per rank (0: 256 MiB); block_size 0: 16. */
/* Block tables for `entries` blocks in all held from now (the engine's
 * first step: the most a step can have), so that no later step allocates */
void attention_reserve_tables(Attention *a, size_t entries);
void attention_init(Attention *a, const Backend *be, const Topology *topo, CommStats *comm, const AttnShape *shape,
                    size_t kv_memory, int block_size, DType kv_dtype, MergeBackend merge);
void attention_free(Attention *a);
/* A new KV pool of kv_memory bytes in place of the one it has, which holds
 * no request (after a profiling step: generate_profile) */
void attention_resize_kv(Attention *a, size_t kv_memory);

/* Bytes of K/V this rank stores per position it owns. */
size_t attention_kv_bytes_per_token(const Attention *a);
/* Logical KV capacity of the DCP group in positions: blocks x B x dcp. */
long long attention_kv_capacity(const Attention *a);

/* Builds the step's metadata from its chunks and hands it to the backend;
 * returns the step's tokens. */
int attention_begin_step(Attention *a, const Chunk *chunks, int n_chunks);

/* One layer's attention of the step's queries q (T, q_heads, head_dim) over
 * every key up to each token, into out (T, q_heads, v_dim) and lse
 * (T, q_heads); the new tokens' rows k (and v unless keys_only), T rows of
 * kv_heads x head_dim, are stored in their owners' caches. sliding: the
 * layer attends within the shape's window. */
void attention_layer(Attention *a, int layer, int sliding, const float *q, float *k, float *v, float *out,
                     float *lse);

#endif
