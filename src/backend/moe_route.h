/* DeepSeek's expert routing: the CPU backend's moe_route calls these per
 * token and per step; the CUDA backend's kernels (cuda/moe.cu) compute the
 * same choices and grouping in parallel, step for step the same
 * arithmetic, and tests/test_backends holds them to this code. */
#ifndef DCP_MOE_ROUTE_H
#define DCP_MOE_ROUTE_H

#include <math.h>

#include "backend.h"

/* Token t's experts and their weights (K = r->per_token each), as
 * transformers' DeepSeek routers choose them (V3: sigmoid scores, the
 * correction bias for the choice only, groups by the sum of their two
 * best; V2: softmax, greedy or by each group's best); equal scores go to
 * the lower index. score and choice: scratch of r->experts floats, gscore
 * and keep of r->groups, taken of r->experts. */
DCP_HOST_DEVICE static inline void moe_route_token(const MoeRouting *r, const float *logits, const float *bias,
                                                   float *score, float *choice, float *gscore, int *keep,
                                                   char *taken, int *idx, float *weight)
{
    int E = r->experts, G = r->groups, per = E / G, K = r->per_token;
    for (int g = 0; g < G; g++) keep[g] = 0;
    for (int x = 0; x < E; x++) taken[x] = 0;
    if (r->v3) {
        for (int x = 0; x < E; x++) {
            score[x] = 1.0f / (1.0f + expf(-logits[x]));
            choice[x] = score[x] + (bias ? bias[x] : 0.0f);
        }
    } else {
        float mx = -INFINITY, sum = 0;
        for (int x = 0; x < E; x++) mx = logits[x] > mx ? logits[x] : mx;
        for (int x = 0; x < E; x++) sum += score[x] = expf(logits[x] - mx);
        for (int x = 0; x < E; x++) choice[x] = score[x] /= sum;
    }
    if (r->grouped) {
        for (int g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY; /* the best two (V3) or the best (V2) */
            for (int x = g * per; x < (g + 1) * per; x++) {
                if (choice[x] > a) b = a, a = choice[x];
                else if (choice[x] > b) b = choice[x];
            }
            gscore[g] = r->v3 ? a + b : a;
        }
        for (int n = 0; n < r->topk_group; n++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            keep[best] = 1;
        }
        /* experts outside the kept groups: -inf (V3) or 0 (V2), as transformers masks them */
        for (int x = 0; x < E; x++)
            if (!keep[x / per]) choice[x] = r->v3 ? -INFINITY : 0.0f;
    }
    for (int n = 0; n < K; n++) {
        int best = -1;
        for (int x = 0; x < E; x++)
            if (!taken[x] && (best < 0 || choice[x] > choice[best])) best = x;
        taken[best] = 1;
        idx[n] = best;
        weight[n] = r->v3 ? score[best] : choice[best];
    }
    if (r->norm_topk) {
        float sum = 1e-20f;
        for (int n = 0; n < K; n++) sum += weight[n];
        for (int n = 0; n < K; n++) weight[n] /= sum;
    }
    for (int n = 0; n < K; n++) weight[n] *= r->scaling;
}

/* The T * K (token, expert) choices idx/wt grouped by expert, tokens in
 * order within an expert: pair i is token rows[i] with weight weights[i];
 * expert e's pairs run from start[e] to start[e + 1] (start: E + 1);
 * slots[t * K + n] are token t's pairs in expert order. fill: scratch of E. */
DCP_HOST_DEVICE static inline void moe_group_pairs(const int *idx, const float *wt, int T, int K, int E, int *rows,
                                                   float *weights, int *slots, int *start, int *fill)
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
