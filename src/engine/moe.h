/* A mixture-of-experts feed-forward block (DeepSeek-V2/V3): a router picks
 * each token's experts, the step's tokens are grouped by expert and each
 * expert (a SwiGLU block) runs one GEMM chain over its tokens; outputs are
 * added, weighted, in expert order, then the shared experts'. Under TP each
 * expert is split along its intermediate dimension, every rank routes the
 * same way, and the block's output joins the layer's TP sum. */
#ifndef DCP_MOE_H
#define DCP_MOE_H

#include "layer.h"

typedef struct {
    WeightRef router;          /* (experts, dim) */
    const float *router_bias;  /* (experts), host: V3's e_score_correction_bias; NULL */
    SwiGlu *experts;           /* per expert: this rank's moe_hidden rows */
    SwiGlu shared;             /* the shared experts, moe_hidden x n_shared rows; gate.data NULL when none */
} MoeWeights;

/* Scratch for steps of up to cap tokens. */
typedef struct {
    int cap;
    float *logits, *xg, *hg, *hu, *yd, *zero; /* backend */
    int *d_rows;
    float *d_weights;
    /* host: router logits, choices, and the (token, weight) pairs by expert */
    float *h_logits, *wt, *wsorted, *score, *choice, *gscore;
    int *idx, *rows, *start, *fill, *keep;
    char *taken;
} MoeScratch;

/* Layer l's experts (a MoE layer of the model) into the backend. */
void moe_load(const LayerEnv *env, Uploads *u, int layer, MoeWeights *w);
void moe_free(MoeWeights *w);
void moe_reserve(const LayerEnv *env, MoeScratch *s, int T);
void moe_free_scratch(const LayerEnv *env, MoeScratch *s);
/* y (T, dim) = the block on x (T, dim), before the TP sum. */
void moe_forward(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, float *y, const float *x, int T);

#endif
