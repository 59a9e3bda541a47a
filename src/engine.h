/* The forward pass over a batch of sequence chunks, and the per-sequence KV
 * cache it reads and writes. A chunk is n consecutive tokens of one
 * sequence starting at position pos0: a whole or partial prompt (prefill),
 * or one token (decode). Attention is split into the context part (keys
 * already cached) and the new part (keys of this chunk), merged by LSE, so
 * chunked prefill and, later, a sequence-sharded cache fit the same code. */
#ifndef DCP_ENGINE_H
#define DCP_ENGINE_H

#include "backend.h"
#include "model.h"
#include "timing.h"

typedef struct {
    int seq;  /* KV cache slot */
    int pos0; /* position of the chunk's first token; positions < pos0 are cached */
    int n;    /* tokens in the chunk */
} Chunk;

typedef struct {
    const Model *model;
    const Backend *be;
    Timings *tm;
    /* KV cache, one slot per running sequence: (layer, cap, kv_heads*head_dim) */
    int n_slots;
    float **k_cache, **v_cache;
    int *slot_cap; /* 0: slot free */
    /* activations, sized for cap_T tokens and cap_R logit rows */
    int cap_T, cap_R;
    float *x, *xb, *xb2, *q, *k, *v, *att, *lse, *att_ctx, *lse_ctx, *hb, *hb2, *xf;
    int *pos;
    const float **kp, **vp;
    int *n_keys;
} Engine;

void engine_init(Engine *e, const Model *m, const Backend *be, Timings *tm);
void engine_free(Engine *e);

/* A KV slot for a sequence of at most cap tokens; returns the slot. */
int engine_seq_alloc(Engine *e, int cap);
void engine_seq_free(Engine *e, int slot);
/* Bytes of KV cache held now by this rank. */
size_t engine_kv_bytes(const Engine *e);

/* Runs the model on the chunks' tokens (concatenated in chunk order) and
 * writes their K/V into the cache. logits receives one row of vocab floats
 * per chunk (its last token) or, with all_logits, one per token. */
void engine_forward(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, int all_logits, float *logits);

#endif
