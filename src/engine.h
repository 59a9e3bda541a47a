/* The forward pass over a batch of sequence chunks, and the per-sequence KV
 * cache it reads and writes. A chunk is n consecutive tokens of one
 * sequence starting at position pos0: a whole or partial prompt (prefill),
 * or one token (decode). Attention is split into the context part (keys
 * already cached, sharded over the DCP group) and the new part (keys of
 * this chunk, on every rank), merged by LSE (DESIGN.md section 4). */
#ifndef DCP_ENGINE_H
#define DCP_ENGINE_H

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "timing.h"
#include "topology.h"

typedef struct {
    int seq;  /* KV cache slot */
    int pos0; /* position of the chunk's first token; positions < pos0 are cached */
    int n;    /* tokens in the chunk */
} Chunk;

typedef enum { MERGE_AG_RS, MERGE_A2A } MergeBackend;

typedef struct {
    const Model *model;
    const Backend *be;
    const Topology *topo;
    MergeBackend merge;
    Timings *tm;
    CommStats *comm;
    /* KV cache, one slot per running sequence, holding this rank's shard of
     * it: (layer, local capacity, kv_heads*head_dim) */
    int n_slots;
    float **k_cache, **v_cache;
    int *slot_cap;   /* local capacity in positions; 0: slot free */
    int *slot_len;   /* positions stored */
    long long kv_tokens, kv_tokens_peak; /* positions stored on this rank, now and at most */
    /* activations, sized for cap_T tokens */
    int cap_T;
    float *x, *xb, *xb2, *q, *k, *v, *att, *lse, *att_ctx, *lse_ctx, *hb, *hb2, *xf;
    float *q_all, *o_all, *lse_all, *lse_ranks, *parts; /* DCP merge buffers */
    int *pos;
    const float **kp, **vp;
    int *n_keys;
} Engine;

/* topo NULL: one rank (tp = dcp = 1). stats may be NULL when topo is. */
void engine_init(Engine *e, const Model *m, const Backend *be, const Topology *topo, MergeBackend merge,
                 Timings *tm, CommStats *stats);
void engine_free(Engine *e);

/* A KV slot for a sequence of at most cap positions; returns the slot. */
int engine_seq_alloc(Engine *e, int cap);
void engine_seq_free(Engine *e, int slot);
/* Bytes of KV this rank stores per position it owns, and the bytes of
 * positions stored now. */
size_t engine_kv_bytes_per_token(const Engine *e);
size_t engine_kv_bytes(const Engine *e);

/* Runs the model on the chunks' tokens (concatenated in chunk order) and
 * writes their K/V into the owners' caches. logits receives, per chunk (its
 * last token) or with all_logits per token, this rank's vocabulary shard
 * (shard.vocab floats per row). */
void engine_forward(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, int all_logits, float *logits);

#endif
