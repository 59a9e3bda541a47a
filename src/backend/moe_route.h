/* DeepSeek's expert routing: the CPU backend's moe_route calls these per
 * token and per step; the CUDA backend's kernels (cuda/moe.cu) compute the
 * same choices and grouping in parallel, step for step the same
 * arithmetic, and tests/test_backends holds them to this code. */
#ifndef DCP_MOE_ROUTE_H
#define DCP_MOE_ROUTE_H

#include <math.h>

#include "backend.h"

/* the routing's exponential: the C library's on the CPU; fmath.h's in the
 * CUDA backend's kernels (backend_cuda.cuh defines it first), the same
 * bits on a GPU and under HIP-CPU */
#ifndef DCP_ROUTE_EXP
#define DCP_ROUTE_EXP expf
#endif

/* The steps of a token's routing that the CPU (moe_route_token, one
 * thread) and the CUDA backend (k_moe_route_tokens, a block) share, so
 * that both compute each value by the same arithmetic. */

/* V3: expert x's score (sigmoid) and its choice value (the score plus the
 * correction bias, for the choice only) */
DCP_HOST_DEVICE static inline void moe_v3_score(const float *logits, const float *bias, int x, float *score,
                                                float *choice)
{
    score[x] = 1.0f / (1.0f + DCP_ROUTE_EXP(-logits[x]));
    choice[x] = score[x] + (bias ? bias[x] : 0.0f);
}

/* V2's softmax: the largest logit, then the sum of the exponentials in
 * expert order */
DCP_HOST_DEVICE static inline float moe_max(const float *logits, int E)
{
    float mx = -INFINITY;
    for (int x = 0; x < E; x++) mx = logits[x] > mx ? logits[x] : mx;
    return mx;
}
DCP_HOST_DEVICE static inline float moe_sum(const float *v, int E)
{
    float sum = 0;
    for (int x = 0; x < E; x++) sum += v[x];
    return sum;
}

/* group g's score: the sum of its best two choices (V3) or its best (V2) */
DCP_HOST_DEVICE static inline float moe_group_score(const float *choice, int g, int per, int v3)
{
    float a = -INFINITY, b = -INFINITY;
    for (int x = g * per; x < (g + 1) * per; x++) {
        if (choice[x] > a) b = a, a = choice[x];
        else if (choice[x] > b) b = choice[x];
    }
    return v3 ? a + b : a;
}

/* keep[g] = 1 for the topk_group best groups (keep: zeros on entry), the
 * lower index at a tie */
DCP_HOST_DEVICE static inline void moe_keep_groups(const float *gscore, int G, int topk_group, int *keep)
{
    for (int n = 0; n < topk_group; n++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        keep[best] = 1;
    }
}

/* expert x's choice value once groups are kept: unchanged inside a kept
 * group, else -inf (V3) or 0 (V2), as transformers masks them */
DCP_HOST_DEVICE static inline float moe_masked(const float *choice, const int *keep, int x, int per, int v3)
{
    return keep[x / per] ? choice[x] : v3 ? -INFINITY : 0.0f;
}

/* the K chosen experts' weights: normalised to sum 1 (norm_topk), then
 * scaled */
DCP_HOST_DEVICE static inline void moe_finish_weights(float *weight, int K, int norm_topk, float scaling)
{
    if (norm_topk) {
        float sum = 1e-20f;
        for (int n = 0; n < K; n++) sum += weight[n];
        for (int n = 0; n < K; n++) weight[n] /= sum;
    }
    for (int n = 0; n < K; n++) weight[n] *= scaling;
}

/* Token t's experts and their weights (K = r->per_token each), as
 * transformers' DeepSeek routers choose them (V3: sigmoid scores, the
 * correction bias for the choice only, groups by the sum of their two
 * best; V2: softmax, greedy or by each group's best); equal scores go to
 * the lower index. score and choice: scratch of r->experts floats, gscore
 * and keep of r->groups, taken of r->experts. */
static inline void moe_route_token(const MoeRouting *r, const float *logits, const float *bias, float *score,
                                   float *choice, float *gscore, int *keep, char *taken, int *idx, float *weight)
{
    int E = r->experts, G = r->groups, per = E / G, K = r->per_token;
    for (int g = 0; g < G; g++) keep[g] = 0;
    for (int x = 0; x < E; x++) taken[x] = 0;
    if (r->v3) {
        for (int x = 0; x < E; x++) moe_v3_score(logits, bias, x, score, choice);
    } else {
        float mx = moe_max(logits, E);
        for (int x = 0; x < E; x++) score[x] = DCP_ROUTE_EXP(logits[x] - mx);
        float sum = moe_sum(score, E);
        for (int x = 0; x < E; x++) choice[x] = score[x] /= sum;
    }
    if (r->grouped) {
        for (int g = 0; g < G; g++) gscore[g] = moe_group_score(choice, g, per, r->v3);
        moe_keep_groups(gscore, G, r->topk_group, keep);
        for (int x = 0; x < E; x++) choice[x] = moe_masked(choice, keep, x, per, r->v3);
    }
    for (int n = 0; n < K; n++) {
        int best = -1;
        for (int x = 0; x < E; x++)
            if (!taken[x] && (best < 0 || choice[x] > choice[best])) best = x;
        taken[best] = 1;
        idx[n] = best;
        weight[n] = r->v3 ? score[best] : choice[best];
    }
    moe_finish_weights(weight, K, r->norm_topk, r->scaling);
}

/* The T * K (token, expert) choices idx/wt grouped by expert, tokens in
 * order within an expert: pair i is token rows[i] with weight weights[i];
 * expert e's pairs run from start[e] to start[e + 1] (start: E + 1);
 * slots[t * K + n] are token t's pairs in expert order. fill: scratch of E. */
static inline void moe_group_pairs(const int *idx, const float *wt, int T, int K, int E, int *rows, float *weights,
                                   int *slots, int *start, int *fill)
{
    for (int e = 0; e <= E; e++) start[e] = 0;
    for (int i = 0; i < T * K; i++) start[idx[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (int e = 0; e < E; e++) fill[e] = start[e];
    for (int t = 0; t < T; t++) {
        int *s = slots + (size_t)t * K;
        for (int n = 0; n < K; n++) {
            int at = fill[idx[t * K + n]]++, j = n;
            rows[at] = t;
            weights[at] = wt[t * K + n];
            /* insertion into token t's slots, ascending: pairs are ordered by expert */
            while (j > 0 && s[j - 1] > at) s[j] = s[j - 1], j--;
            s[j] = at;
        }
    }
}

#endif
