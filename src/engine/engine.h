/* The forward pass over a batch of sequence chunks, and the paged KV cache
 * it reads and writes. A chunk is n consecutive tokens of one sequence
 * starting at position pos0: a whole or partial prompt (prefill), or one
 * token (decode). Attention is split into the context part (keys already
 * cached, sharded over the DCP group) and the new part (keys of this chunk,
 * on every rank), merged by LSE (DESIGN.md section 4). Every buffer comes
 * from the backend, so the same code drives the CPU and the GPU. */
#ifndef DCP_ENGINE_H
#define DCP_ENGINE_H

#include "backend.h"
#include "comm.h"
#include "kvcache.h"
#include "model.h"
#include "timing.h"
#include "topology.h"

typedef struct {
    const int *blocks; /* the sequence's block table (kvcache.h), host memory */
    int n_blocks;      /* entries in it */
    int pos0;          /* position of the chunk's first token; positions < pos0 are cached */
    int n;             /* tokens in the chunk */
} Chunk;

typedef enum { MERGE_AG_RS, MERGE_A2A } MergeBackend;

typedef struct {
    MergeBackend merge;
    size_t kv_cache_memory; /* bytes of K/V per rank; 0: 256 MiB */
    int block_size;         /* positions per block per rank; 0: 16 */
    int mpi_device_buffers; /* GPU backends: MPI takes device pointers (else staged) */
    int timing_sync;        /* wait for the device around timed phases (benchmarks) */
    DType kv_dtype;         /* of the KV cache (DTYPE_F32 unless --kv-cache-dtype) */
} EngineOptions;

/* One layer's weights as the backend holds them; shapes are this rank's
 * shard (Shard in model.h). */
typedef struct {
    const float *rms_att;           /* (dim) */
    WeightRef wq;                   /* (q_heads*head_dim, dim) */
    WeightRef wk, wv;               /* (kv_heads*head_dim, dim) */
    WeightRef wo;                   /* (dim, q_heads*head_dim) */
    const float *rms_ffn;           /* (dim) */
    WeightRef w_gate, w_up;         /* (hidden, dim) */
    WeightRef w_down;               /* (dim, hidden) */
    /* NULL unless the config has them (Weights in model.h) */
    const float *bq, *bk, *bv, *bo, *b_gate, *b_up, *b_down, *q_norm, *k_norm;
    int sliding;                    /* this layer attends within the sliding window */
} LayerWeights;

/* One layer of an MLA model (DeepSeek-V2/V3) as the backend holds it.
 * kv_b_proj is kept per head: its key part transposed (kv_lora, nope), to
 * fold into the query, and its value part (v, kv_lora), applied after the
 * attention (the absorbed form). */
typedef struct {
    const float *rms_att, *rms_ffn, *q_a_norm, *kv_a_norm;
    WeightRef q_a, q_b, q, kv_a, o;
    WeightRef *uk_t, *uv;                 /* per head */
    float *uk_t_host;                     /* the transposed key parts, on the host */
    WeightRef gate, up, down;             /* dense layer */
    WeightRef router;                     /* MoE layer */
    const float *router_bias;             /* host: V3's e_score_correction_bias */
    WeightRef *e_gate, *e_up, *e_down;    /* per expert */
    WeightRef s_gate, s_up, s_down;       /* shared experts; data NULL when none */
    int moe;
} MlaLayerWeights;

/* The backend's copies of the model's weights: whole per-layer stacks as
 * uploaded (released at the end), and a view of each layer into them. */
typedef struct {
    const float *token_embedding;   /* (vocab, dim), full */
    const float *rms_final;         /* (dim) */
    WeightRef lm_head;              /* (vocab shard, dim) */
    LayerWeights *layer;            /* n_layers views */
    const float *rms_att, *rms_ffn; /* stacks: (layer, dim) */
    WeightRef wq, wk, wv, wo, w_gate, w_up, w_down; /* stacks: (layer, rows, cols) */
    const float *bq, *bk, *bv, *bo, *b_gate, *b_up, *b_down, *q_norm, *k_norm; /* stacks, or NULL */
    const float *inv_freq;          /* (head_dim/2): RoPE frequencies (model.h rope_frequencies); MLA: qk_rope_head_dim/2 */
    float rope_scale;               /* cos/sin scale (YaRN), else 1 */
    MlaLayerWeights *mla;           /* MLA models: per layer, instead of the stacks */
    const void **uploaded;          /* MLA models: every array uploaded, to release */
    int n_uploaded;
} EngineWeights;

typedef struct {
    const Model *model;
    const Backend *be;
    const Topology *topo;
    MergeBackend merge;
    int timing_sync;
    Timings *tm;
    CommStats *comm;
    EngineWeights w;
    /* paged KV cache of this rank: (layer, block, block_size, kv_heads*head_dim) */
    BlockPool pool;
    void *k_pool, *v_pool; /* elements of kv_dtype */
    DType kv_dtype;
    /* activations (backend buffers), sized for cap_T tokens and cap_R logit rows */
    int cap_T, cap_R;
    float *x, *xb, *xb2, *q, *k, *v, *att, *lse, *att_ctx, *lse_ctx, *hb, *hb2, *xf, *logits;
    float *q_all, *o_all, *lse_all, *lse_ranks, *parts; /* DCP merge buffers */
    /* per-step metadata: host arrays and their backend copies */
    int *pos, *slots, *rows;
    int *d_tokens, *d_pos, *d_slots, *d_rows, *d_tables;
    int cap_tables;
    const void **kp, **vp;
    int *n_keys, *key0;
    const int **tables;
    const int **chunk_tables; /* per chunk: its block table in backend memory */
    int cap_chunks;
    float *rope_host;      /* the RoPE frequencies as computed on the host */
    /* MLA and MoE scratch (mla.c), sized for mla_cap tokens */
    int mla_cap;
    float *mla_buf[12];
    int *d_moe_rows;
    float *d_moe_weights;
} Engine;

/* topo NULL: one rank (tp = dcp = 1); stats may then be NULL too.
 * eo NULL: ag_rs merge, 256 MiB of KV cache, blocks of 16. */
void engine_init(Engine *e, const Model *m, const Backend *be, const Topology *topo, const EngineOptions *eo,
                 Timings *tm, CommStats *stats);
void engine_free(Engine *e);

/* Bytes of K/V this rank stores per position it owns. */
size_t engine_kv_bytes_per_token(const Engine *e);
/* Logical KV capacity of the DCP group in positions: blocks x B x dcp. */
long long engine_kv_capacity(const Engine *e);

/* Runs the model on the chunks' tokens (concatenated in chunk order) and
 * writes their K/V into the owners' caches. logits (host memory) receives,
 * per chunk (its last token) or with all_logits per token, this rank's
 * vocabulary shard (shard.vocab floats per row). */
void engine_forward(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, int all_logits, float *logits);

/* Which keys engine_attend gives each token (engine.c). */
typedef enum { ATTEND_NEW, ATTEND_CACHED, ATTEND_ALL } AttendKeys;
void engine_attend(Engine *e, const Chunk *chunks, const int *const *tables, int n_chunks, int layer, AttendKeys keys,
                   const float *q, int copies, int n_heads, float *out, float *lse);
/* One layer's attention of the step's queries (e->q, n_heads of this
 * rank's heads) over every key up to each token, into e->att (out_dim
 * floats per head) and e->lse, storing the new tokens' rows (e->k, e->v;
 * kv_row floats; MLA: e->k only) in the owners' caches; merged over the
 * DCP group when the cache is sharded (engine.c). */
void engine_self_attention(Engine *e, const Chunk *chunks, const int *const *tables, int n_chunks, int layer, int T,
                           int has_context, int n_heads, int out_dim, int kv_row);
/* mla.c: the weights of an MLA model into the backend, and its release;
 * its scratch buffers' release */
void mla_upload(Engine *e);
void mla_release(Engine *e);
void mla_free_scratch(Engine *e);
/* mla.c: one MLA layer (attention and feed-forward) on e->x */
void mla_layer(Engine *e, int layer, const Chunk *chunks, const int *const *tables, int n_chunks, int T,
               int has_context);

#endif
