/* Token choice from one row of logits. Greedy is argmax (lowest index wins
 * ties); otherwise temperature and top-p sampling as llama2.c's run.c does
 * it, with a per-request xorshift generator, so a request's tokens depend on
 * its seed and logits only, never on the batch or the parallel layout.
 * vLLM's further parameters come in vLLM's order: logit_bias, then the
 * repetition, frequency and presence penalties on the logits
 * (sampler_adjust, before greedy's argmax too), then temperature, min_p,
 * top_k and top_p on the probabilities. */
#ifndef DCP_SAMPLER_H
#define DCP_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "requests.h"

typedef struct {
    float temperature;
    float top_p;
    int top_k;   /* 0: off */
    float min_p; /* 0: off */
    uint64_t rng;
} Sampler;

void sampler_init(Sampler *s, float temperature, float top_p, uint64_t seed);
/* A request's top_k and min_p (its SamplingExtra) */
void sampler_set_extra(Sampler *s, const SamplingExtra *x);
/* 1 when the request adjusts logits (sampler_adjust has work) */
int sampler_adjusts(const Request *q);
/* logit_bias, then the repetition penalty (over the prompt's and the
 * output's tokens), the frequency and the presence penalty (over the
 * output's: OpenAI's logit - count x frequency - (count > 0) x presence)
 * on row, the logits of ids v0..v0+vn-1 (a shard of the vocabulary, or
 * all of it). out: the n_out tokens generated so far. */
void sampler_adjust(float *row, int v0, int vn, const Request *q, const int *out, int n_out);
/* The distribution the sampler draws from for these logits (n), into
 * probs (n): after temperature, min_p, top_k and top_p, renormalized;
 * zero for the tokens left out. Greedy (temperature 0): 1 at the argmax.
 * logits are overwritten. */
void sampler_distribution(const Sampler *s, float *logits, int n, float *probs, void *scratch);
int argmax_f32(const float *x, int n);
/* 1 when every logit is a finite number */
int logits_finite(const float *x, int n);
/* The chosen token, or SAMPLE_NONFINITE when a logit is NaN or infinite
 * (broken weights or config): there is no distribution to sample from.
 * logits (n) are overwritten (scaled, softmaxed); scratch holds n (prob,
 * index) pairs. */
#define SAMPLE_NONFINITE (-1)
int sampler_sample(Sampler *s, float *logits, int n, void *scratch);
/* Why a request whose logits turned NaN or infinite stopped. */
#define NONFINITE_REASON                                                                                      \
    "the model's logits are not finite (NaN or inf); its weights or config (rms_norm_eps, rope_theta, a "    \
    "corrupt tensor) are broken"

size_t sampler_scratch_bytes(int n);

/* The log-probabilities of one position: the chosen token's, and the top
 * k tokens (best first; equal ones lower id first). */
typedef struct {
    float lp;
    int k;
    float top_lp[MAX_LOGPROBS];
    int top_id[MAX_LOGPROBS];
} TokenLogprobs;

/* Log-probabilities from a vocabulary split over ranks: each rank makes a
 * record of its shard (row: vn logits of ids v0..v0+vn-1), of
 * LOGPROB_RECORD(k) floats: its max, 0 (unused), the chosen id's logit
 * (-inf when outside the shard) and its top k (logits, ids); the records
 * of all shards and the log-sum-exp of the whole row (lse_fixed) combine
 * into the log-softmax's values. */
#define LOGPROB_RECORD(k) (3 + 2 * (k))
void logprob_record(const float *row, int v0, int vn, int chosen, int k, float *rec);
void logprob_combine(const float *recs, int n_shards, int k, double lse, TokenLogprobs *out);

/* The log-sum-exp of a row split over shards, the same bits however it is
 * split (docs/design.md, "Same bits at any layout"): with m the maximum
 * over every shard, each term exp(x - m) is rounded to a multiple of
 * 2^-bits (bits = lse_fixed_bits(the whole row's length), so that no sum
 * can pass 2^63) and the shards' integer sums add exactly, in any order;
 * lse = m + log(sum 2^-bits). */
int lse_fixed_bits(int n);
int64_t lse_fixed_sum(const float *row, int n, float m, int bits);
double lse_fixed(float m, int64_t sum, int bits);

#endif
