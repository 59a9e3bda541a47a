/* What a layer module works with, and the pieces every family shares.
 *
 * An architecture family (the dense Llama family, DeepSeek's MLA + MoE)
 * provides its decoder layer as one LayerOps table, chosen once per run
 * from the architecture table; the engine only orchestrates: embedding,
 * the family's layers in order, the final norm and the LM head. A family
 * keeps its own weights and scratch, and calls the attention core
 * (attention.h) for attention over the paged, possibly DCP-sharded cache. */
#ifndef DCP_LAYER_H
#define DCP_LAYER_H

#include "attention.h"
#include "backend.h"
#include "comm.h"
#include "model.h"
#include "timing.h"
#include "topology.h"

/* Expert parallelism's counts (moe_block), per layer and routed expert
 * (layers x experts, summed over steps): received, the pairs this rank's
 * experts received (its own experts' entries only); sent, the pairs of
 * the tokens this rank routed, to each expert. */
typedef struct {
    long long *received, *sent;
    long long idle_steps; /* passes without tokens to serve other DP groups (engine_idle) */
    double idle_seconds;
} MoeCounts;

/* The run's state a layer sees. */
typedef struct {
    const Model *model;
    const Backend *be;
    const Topology *topo;
    Timings *tm;
    CommStats *comm;
    int timing_sync;  /* wait for the device around timed phases (benchmarks) */
    int nvfp4_act;    /* quantize the input of every NVFP4 matrix with an input scale (layer_act) */
    Attention *att;   /* the attention core; its step holds the step's tokens and positions */
    /* the residual stream and a block's input, (T, dim) each, in backend
     * memory, sized by the engine for the step */
    float *x, *xb;
    /* a row-parallel product's partial sums, one (T, dim) per K chunk this
     * rank holds (Shard.chunks), summed in the canonical order by
     * layer_residual; the TP sum's receive buffer, (T, dim) */
    float *parts, *sum_scratch;
    MoeCounts *moe_counts; /* with expert parallelism; else NULL */
} LayerEnv;

/* One family's decoder layer. `state` is what load returned: the family's
 * weights in the backend and its scratch. */
typedef struct {
    const char *name;
    /* the attention core's shape for this model */
    void (*attn_shape)(const Model *m, AttnShape *shape);
    /* this rank's shard of the family's layer weights into the backend */
    void *(*load)(const LayerEnv *env);
    void (*release)(const LayerEnv *env, void *state);
    /* scratch for steps of up to T tokens */
    void (*reserve)(const LayerEnv *env, void *state, int T);
    /* layer l over the step's tokens: env->x in, env->x out */
    void (*forward)(const LayerEnv *env, void *state, int layer);
    /* layer l without tokens: its expert-parallel exchange alone, serving
     * other DP groups' tokens (engine_idle); NULL: a family without experts */
    void (*idle)(const LayerEnv *env, void *state, int layer);
} LayerOps;

/* A clock reading; with timing_sync, after the device's queued work. */
double layer_clock(const LayerEnv *env);
/* x (T, in) as the matrix w reads it: with nvfp4_act and an NVFP4 w,
 * quantized by the backend's nvfp4_act (W4A4, where w has an input
 * scale); else x itself */
const float *layer_act(const LayerEnv *env, const float *x, WeightRef w, int T, int in);
/* y (T, out) = layer_act(x) (T, in) . w^T, timed as matmul. */
void layer_matmul(const LayerEnv *env, float *y, const float *x, WeightRef w, int T, int in, int out);
/* The backend's matmul_batched (one GEMM per head, backend.h), timed as matmul. */
void layer_matmul_batched(const LayerEnv *env, float *y, int ldy, size_t y_step, const float *x, int ldx,
                          size_t x_step, WeightRef w, int batch, int T, int in, int out);
/* The attention core's layer call, timed as attention. */
void layer_attention(const LayerEnv *env, int layer, int sliding, const float *q, float *k, float *v, float *out,
                     float *lse);
/* A row-parallel product, this rank's K columns (in) as Shard.chunks
 * canonical chunks (w: their (out, in / chunks) matrices one after
 * another): parts[c] (T, out) = x's chunk c columns . w_c^T, timed as
 * matmul. */
void layer_matmul_rows(const LayerEnv *env, float *parts, const float *x, WeightRef w, int T, int in, int out);
/* env->parts (the row-parallel output's chunks) summed in the canonical
 * order, over this rank's chunks and then over the TP group
 * (docs/design.md, "Same bits at any layout"), then added to the residual
 * stream with the bias b (dim; NULL: none) added once. */
void layer_residual(const LayerEnv *env, const float *b, int T);
/* Its first half: env->parts summed in the canonical order over this
 * rank's chunks and the TP group, into env->parts' first (T, dim). */
void layer_sum_parts(const LayerEnv *env, int T);

/* A SwiGLU feed-forward block: down . (silu(gate . x + b_gate) * (up . x + b_up)),
 * this rank's hidden rows (column-parallel gate/up, row-parallel down). */
typedef struct {
    WeightRef gate, up; /* (hidden, dim) */
    WeightRef down;     /* (dim, hidden) */
    const float *b_gate, *b_up; /* (hidden) or NULL */
} SwiGlu;
/* parts (chunks x (T, dim)) = the block on x (T, dim), before the sum over
 * chunks and ranks (layer_matmul_rows); h1, h2 scratch of (T, hidden). */
void layer_swiglu(const LayerEnv *env, const SwiGlu *w, float *parts, const float *x, int T, int hidden, float *h1,
                  float *h2);

/* Weights into the backend, with a list of what to release. */
typedef struct {
    const void **p;
    int n;
} Uploads;
const float *upload_vector(const LayerEnv *env, Uploads *u, const float *host, size_t n);
WeightRef upload_matrix(const LayerEnv *env, Uploads *u, WeightRef host, size_t n);
/* an fp32 matrix (the absorbed MLA stacks, built at load) */
WeightRef upload_f32_matrix(const LayerEnv *env, Uploads *u, const float *host, size_t n);
void uploads_release(const LayerEnv *env, Uploads *u);

/* RoPE frequencies of width rotated dimensions into the backend, and the
 * cos/sin scale (YaRN), computed from the model's config; the host copy
 * stays with *host (the CPU backend computes on it in place). */
const float *upload_rope(const LayerEnv *env, Uploads *u, int width, float **host, float *scale);

#endif
