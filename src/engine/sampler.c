#include "sampler.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    float prob;
    int index;
} ProbIndex;

void sampler_init(Sampler *s, float temperature, float top_p, uint64_t seed)
{
    s->temperature = temperature;
    s->top_p = top_p;
    s->rng = seed ? seed : 0x2545F4914F6CDD1Dull; /* xorshift must not start at 0 */
}

size_t sampler_scratch_bytes(int n) { return sizeof(ProbIndex) * (size_t)n; }

static uint32_t random_u32(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float random_f32(uint64_t *state) { return (random_u32(state) >> 8) / 16777216.0f; }

int argmax_f32(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int logits_finite(const float *x, int n)
{
    /* a sum is NaN or inf when any term is; one pass, no branch per entry */
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += x[i] * 0.0f;
    return s == 0.0f;
}

static void softmax(float *x, int n)
{
    float m = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > m) m = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

static int cmp_desc(const void *a, const void *b)
{
    float pa = ((const ProbIndex *)a)->prob, pb = ((const ProbIndex *)b)->prob;
    if (pa > pb) return -1;
    if (pa < pb) return 1;
    /* equal probabilities: lower index first, so the order is fully defined */
    return ((const ProbIndex *)a)->index - ((const ProbIndex *)b)->index;
}

int sampler_sample(Sampler *s, float *logits, int n, void *scratch)
{
    if (!logits_finite(logits, n)) return SAMPLE_NONFINITE;
    if (s->temperature == 0.0f) return argmax_f32(logits, n);
    for (int i = 0; i < n; i++) logits[i] /= s->temperature;
    softmax(logits, n);
    float coin = random_f32(&s->rng);
    if (s->top_p <= 0.0f || s->top_p >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[i];
            if (coin < cdf) return i;
        }
        return n - 1;
    }
    /* top-p: the smallest set of most likely tokens whose mass exceeds top_p;
     * tokens below (1 - top_p)/(n - 1) cannot be in it and are dropped first */
    ProbIndex *pi = scratch;
    float cutoff = (1.0f - s->top_p) / (float)(n - 1);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= cutoff) pi[m++] = (ProbIndex){logits[i], i};
    qsort(pi, (size_t)m, sizeof *pi, cmp_desc);
    float cum = 0.0f;
    int last = m - 1;
    for (int i = 0; i < m; i++) {
        cum += pi[i].prob;
        if (cum > s->top_p) {
            last = i;
            break;
        }
    }
    float r = coin * cum, cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += pi[i].prob;
        if (r < cdf) return pi[i].index;
    }
    return pi[last].index;
}
