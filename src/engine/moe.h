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
 * (moe_route), the experts' activations and outputs per pair. With expert
 * parallelism also the rows sent and received and the host's counts;
 * the rows an expert owner receives vary by step, so their buffers grow
 * on demand (cap_recv pairs). */
typedef struct {
    int cap;
    float *logits, *hg, *hu, *yd, *weights;
    int *rows, *slots, *start;
    /* expert parallelism */
    float *send, *ret, *routed;     /* (cap * K, dim) x 2, (cap, dim) */
    int cap_recv;
    float *recv, *back;             /* (cap_recv, dim): rows received, outputs in their order */
    int *d_rows, *d_perm, *d_start; /* expert-major pairs' rows; each received row's pair; local experts' starts */
    int *h_start, *h_count, *h_rcount, *h_rows, *h_perm, *h_lstart, *h_ep; /* host copies and MPI counts */
} MoeScratch;

/* A MoE layer's weights as loaded (model.h) into the backend. */
void moe_load(const LayerEnv *env, Uploads *u, const MoeLayer *h, MoeWeights *w);
void moe_free(MoeWeights *w);
void moe_reserve(const LayerEnv *env, MoeScratch *s, int T);
void moe_free_scratch(const LayerEnv *env, MoeScratch *s);
/* Layer l's block on x (T, dim), the step's normalized hidden rows, added
 * to the residual stream env->x. Without expert parallelism every rank
 * routes every token over its slice of every expert and the output joins
 * the TP sum. With it (Shard.ep > 1, or ep 1 under --enable-expert-parallel:
 * Topology.ep_comm) each TP rank routes its share of the rows, sends each
 * (token, expert) pair's row to the expert's owner (moe_dispatch), the
 * owner runs one GEMM per expert over the rows it received and returns
 * them (moe_combine), and the rank adds its tokens' outputs in expert
 * order; the TP group then gathers the rows and adds them to the shared
 * experts' TP sum. T 0 (a DP group without tokens) still serves the other
 * groups' rows. */
void moe_block(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, int layer, const float *x, int T);
/* Its part without expert parallelism: y (Shard.chunks x (T, dim)) = the
 * block on x (T, dim), this rank's slice of every expert, before the sum
 * over chunks and the TP group. */
void moe_forward(const LayerEnv *env, const MoeWeights *w, MoeScratch *s, float *y, const float *x, int T);

#endif
