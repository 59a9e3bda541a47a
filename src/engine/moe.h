/* A mixture-of-experts feed-forward block (DeepSeek-V2/V3, Qwen3-MoE): a router picks
 * each token's experts, the step's (token, expert) pairs are grouped by
 * expert and the experts' SwiGLU blocks run as grouped GEMMs over them;
 * outputs are added, weighted, in expert order, then the shared experts'.
 * All of it runs in the backend (moe_route, moe_matmul, moe_combine), so a
 * GPU makes no host round-trip. Under TP each expert is split along its
 * intermediate dimension, every rank routes the same way, and the block's
 * output joins the layer's TP sum. */
#ifndef DCP_MOE_H
#define DCP_MOE_H

#include "layer.h"

typedef struct {
    WeightRef router;          /* (experts, dim) */
    const float *router_bias;  /* (experts): V3's e_score_correction_bias; NULL */
    /* the routed experts, this rank's moe_hidden rows of each, as stacks
     * (expert e at e * moe_hidden * dim): gate and up (moe_hidden, dim),
     * down (dim, moe_hidden) as Shard.chunks chunks (layer_matmul_rows) */
    WeightRef gate, up, down;
    SwiGlu shared;             /* the shared experts, moe_hidden x n_shared rows; gate.data NULL when none */
} MoeWeights;

/* Scratch for steps of up to cap tokens, all in the backend: the router's
 * logits, the (token, expert) pairs of the step grouped by expert
 * (moe_route), the experts' activations and outputs per pair. */
typedef struct {
    int cap;
    float *logits, *hg, *hu, *yd, *weights;
    int *rows, *slots, *start;
} MoeScratch;

/* A MoE layer's weights as loaded (model.h) into the backend. */
void moe_load(const LayerEnv *env, Uploads *u, const MoeLayer *h, MoeWeights *w);
void moe_free(MoeWeights *w);
void moe_reserve(const LayerEnv *env, MoeScratch *s, int T);
void moe_free_scratch(const LayerEnv *env, MoeScratch *s);
/* y (T, dim) = the block on x (T, dim), before the TP sum. */
void moe_forward(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, float *y, const float *x, int T);

#endif
