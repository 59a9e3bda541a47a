#include "sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct {
    float prob;
    int index;
} ProbIndex;

void sampler_init(Sampler *s, float temperature, float top_p, uint64_t seed)
{
    s->temperature = temperature;
    s->top_p = top_p;
    s->top_k = 0;
    s->min_p = 0.0f;
    s->rng = seed ? seed : 0x2545F4914F6CDD1Dull; /* xorshift must not start at 0 */
}

/* the candidates, and as many again for the radix sort's passes */
size_t sampler_scratch_bytes(int n) { return 2 * sizeof(ProbIndex) * (size_t)n; }

static uint32_t random_u32(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float random_f32(uint64_t *state) { return (random_u32(state) >> 8) / 16777216.0f; }

/* The vocabulary scans keep SCAN_LANES independent running values, which
 * the compiler turns into vector lanes: one running value waited on each
 * compare or add before the next. */
#define SCAN_LANES 16

/* the first index of the largest entry (no entry is larger; -0 and +0
 * equal): the maximum by lanes, then its first occurrence. Entries that
 * are NaN are never larger, as with a plain scan; x[0] NaN gives 0. */
int argmax_f32(const float *x, int n)
{
    if (n <= 0) return 0;
    float m[SCAN_LANES];
    int i = 0;
    for (int l = 0; l < SCAN_LANES; l++) m[l] = x[0];
    for (; i + SCAN_LANES <= n; i += SCAN_LANES)
        for (int l = 0; l < SCAN_LANES; l++) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    float best = m[0];
    for (int l = 1; l < SCAN_LANES; l++) best = m[l] > best ? m[l] : best;
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    for (i = 0; i < n; i++)
        if (x[i] == best) return i;
    return 0;
}

/* 0 when an entry is NaN or infinite: its exponent bits all set */
int logits_finite(const float *x, int n)
{
    uint32_t bad[SCAN_LANES] = {0}, any = 0;
    int i = 0;
    for (; i + SCAN_LANES <= n; i += SCAN_LANES)
        for (int l = 0; l < SCAN_LANES; l++) {
            uint32_t u;
            memcpy(&u, x + i + l, sizeof u);
            bad[l] |= (u & 0x7f800000u) == 0x7f800000u;
        }
    for (int l = 0; l < SCAN_LANES; l++) any |= bad[l];
    for (; i < n; i++) any |= !isfinite(x[i]);
    return !any;
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

/* Sorts m (prob, index) pairs, collected in index order, by probability
 * from the largest, equal ones in index order: a stable radix sort on the
 * probabilities' bits (positive floats order as their bit patterns), three
 * passes of 11, 11 and 10 bits, in O(m). With a flat distribution over a
 * large vocabulary nearly every token is a candidate, and a comparison
 * sort of them was most of a sampled step. tmp holds m pairs. */
static void sort_desc(ProbIndex *pi, ProbIndex *tmp, int m)
{
    enum { BITS = 11, BUCKETS = 1 << BITS };
    static _Thread_local int count[BUCKETS];
    ProbIndex *from = pi, *to = tmp;
    for (int shift = 0; shift < 32; shift += BITS) {
        memset(count, 0, sizeof count);
        for (int i = 0; i < m; i++) {
            uint32_t u;
            memcpy(&u, &from[i].prob, sizeof u);
            count[(~u >> shift) & (BUCKETS - 1)]++; /* ~bits: the largest first */
        }
        for (int b = 0, at = 0; b < BUCKETS; b++) {
            int c = count[b];
            count[b] = at;
            at += c;
        }
        for (int i = 0; i < m; i++) {
            uint32_t u;
            memcpy(&u, &from[i].prob, sizeof u);
            to[count[(~u >> shift) & (BUCKETS - 1)]++] = from[i];
        }
        ProbIndex *t = from;
        from = to;
        to = t;
    }
    if (from != pi) memcpy(pi, from, sizeof *pi * (size_t)m);
}

void sampler_set_extra(Sampler *s, const SamplingExtra *x)
{
    s->top_k = x->top_k > 0 ? x->top_k : 0;
    s->min_p = x->min_p > 0.0f ? x->min_p : 0.0f;
}

static int repetition_on(float r) { return r > 0.0f && r != 1.0f; }

int sampler_adjusts(const Request *q)
{
    return q->n_bias || q->x.presence_penalty != 0.0f || q->x.frequency_penalty != 0.0f ||
           repetition_on(q->x.repetition_penalty);
}

/* Counts of token ids over a shard of the vocabulary, kept between calls
 * and cleared entry by entry (the ids a call touched), so that a sampled
 * token costs the prompt's and the output's lengths, never the
 * vocabulary's; the forward pass, and with it sampler_adjust, runs on one
 * thread. */
static struct {
    int *count, *seen; /* count (cap_v); the first sighting of each id (cap_s) */
    char *in_prompt;   /* (cap_v) */
    int cap_v, cap_s;
} adj;

static void adj_reserve(int vn, int n)
{
    if (vn > adj.cap_v) {
        free(adj.count), free(adj.in_prompt);
        adj.count = xcalloc((size_t)vn, sizeof(int));
        adj.in_prompt = xcalloc((size_t)vn, 1);
        adj.cap_v = vn;
    }
    if (n > adj.cap_s) {
        free(adj.seen);
        adj.seen = xmalloc(sizeof(int) * (size_t)n);
        adj.cap_s = n;
    }
}

/* the ids of ids[0..n) in [v0, v0+vn), counted into adj.count with the
 * first sighting of each listed in adj.seen */
static int tally(const int *ids, int n, int v0, int vn)
{
    int n_seen = 0;
    for (int i = 0; i < n; i++) {
        int t = ids[i] - v0;
        if (t < 0 || t >= vn) continue;
        if (!adj.count[t]++) adj.seen[n_seen++] = t;
    }
    return n_seen;
}

static float repeated(float x, float rep) { return x > 0.0f ? x / rep : x * rep; }

void sampler_adjust(float *row, int v0, int vn, const Request *q, const int *out, int n_out)
{
    for (int j = 0; j < q->n_bias; j++)
        if (q->bias_ids[j] >= v0 && q->bias_ids[j] < v0 + vn) row[q->bias_ids[j] - v0] += q->bias[j];
    float rep = q->x.repetition_penalty, freq = q->x.frequency_penalty, pres = q->x.presence_penalty;
    int use_rep = repetition_on(rep), use_out = freq != 0.0f || pres != 0.0f;
    if (!use_rep && !use_out) return;
    /* counts of the output's tokens, and the prompt's marked, over this
     * shard: only the ids that occur are visited afterwards */
    adj_reserve(vn, n_out + 1);
    int n_seen = tally(out, n_out, v0, vn);
    if (use_rep) {
        for (int i = 0; i < q->n_prompt; i++) {
            int t = q->prompt_tokens[i] - v0;
            if (t < 0 || t >= vn || adj.in_prompt[t]) continue;
            adj.in_prompt[t] = 1;
            if (!adj.count[t]) row[t] = repeated(row[t], rep);
        }
        for (int k = 0; k < n_seen; k++) row[adj.seen[k]] = repeated(row[adj.seen[k]], rep);
        for (int i = 0; i < q->n_prompt; i++) {
            int t = q->prompt_tokens[i] - v0;
            if (t >= 0 && t < vn) adj.in_prompt[t] = 0;
        }
    }
    for (int k = 0; k < n_seen; k++) {
        int t = adj.seen[k];
        if (use_out) {
            row[t] -= (float)adj.count[t] * freq; /* as vLLM: the frequency term, then the presence term */
            row[t] -= pres;
        }
        adj.count[t] = 0;
    }
}

/* min_p, top_k and top_p over probs (n, softmaxed): the kept tokens, most
 * likely first (equal ones lower id first), into pi; returns how many, and
 * their probability mass in *mass. */
static int keep_extra(const Sampler *s, const float *probs, int n, ProbIndex *pi, float *mass)
{
    float pmax = 0.0f;
    for (int i = 0; i < n; i++) pmax = probs[i] > pmax ? probs[i] : pmax;
    float floor_p = s->min_p > 0.0f ? pmax * s->min_p : 0.0f;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (probs[i] > 0.0f && probs[i] >= floor_p) pi[m++] = (ProbIndex){probs[i], i};
    sort_desc(pi, pi + n, m);
    if (s->top_k > 0 && m > s->top_k) { /* the k most likely, and any equal to the k-th */
        int k = s->top_k;
        while (k < m && pi[k].prob == pi[s->top_k - 1].prob) k++;
        m = k;
    }
    float total = 0.0f;
    for (int i = 0; i < m; i++) total += pi[i].prob;
    if (s->top_p > 0.0f && s->top_p < 1.0f) { /* the smallest head whose share of the kept mass exceeds top_p */
        float cum = 0.0f;
        for (int i = 0; i < m; i++) {
            cum += pi[i].prob / total;
            if (cum > s->top_p) {
                m = i + 1;
                break;
            }
        }
        total = 0.0f;
        for (int i = 0; i < m; i++) total += pi[i].prob;
    }
    *mass = total;
    return m;
}

void sampler_distribution(const Sampler *s, float *logits, int n, float *probs, void *scratch)
{
    memset(probs, 0, sizeof(float) * (size_t)n);
    if (s->temperature == 0.0f) {
        probs[argmax_f32(logits, n)] = 1.0f;
        return;
    }
    for (int i = 0; i < n; i++) logits[i] /= s->temperature;
    softmax(logits, n);
    ProbIndex *pi = scratch;
    float mass;
    int m = keep_extra(s, logits, n, pi, &mass);
    for (int i = 0; i < m; i++) probs[pi[i].index] = pi[i].prob / mass;
}

int sampler_sample(Sampler *s, float *logits, int n, void *scratch)
{
    if (!logits_finite(logits, n)) return SAMPLE_NONFINITE;
    if (s->temperature == 0.0f) return argmax_f32(logits, n);
    for (int i = 0; i < n; i++) logits[i] /= s->temperature;
    softmax(logits, n);
    float coin = random_f32(&s->rng);
    if (s->top_k > 0 || s->min_p > 0.0f) { /* vLLM's min_p and top_k, then top_p, over the kept tokens */
        ProbIndex *pi = scratch;
        float mass;
        int m = keep_extra(s, logits, n, pi, &mass);
        float r = coin * mass, cdf = 0.0f;
        for (int i = 0; i < m; i++) {
            cdf += pi[i].prob;
            if (r < cdf) return pi[i].index;
        }
        return pi[m - 1].index;
    }
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
    sort_desc(pi, pi + n, m);
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

/* the k best (value, id) of a small sorted list, best first; equal values
 * lower id first */
static void top_insert(float *v, int *id, int *n, int k, float x, int i)
{
    if (k == 0 || (*n == k && (x < v[k - 1] || (x == v[k - 1] && i > id[k - 1])))) return;
    int j = *n < k ? (*n)++ : k - 1;
    while (j > 0 && (x > v[j - 1] || (x == v[j - 1] && i < id[j - 1]))) {
        v[j] = v[j - 1];
        id[j] = id[j - 1];
        j--;
    }
    v[j] = x;
    id[j] = i;
}

void logprob_record(const float *row, int v0, int vn, int chosen, int k, float *rec)
{
    float m = -INFINITY;
    for (int i = 0; i < vn; i++) m = row[i] > m ? row[i] : m;
    float *v = rec + 3;
    int ids[MAX_LOGPROBS], n = 0;
    for (int i = 0; i < vn; i++)
        if (k && (n < k || row[i] >= v[k - 1])) top_insert(v, ids, &n, k, row[i], v0 + i);
    for (int j = 0; j < k; j++) {
        if (j >= n) v[j] = -INFINITY, ids[j] = -1;
        rec[3 + k + j] = (float)ids[j]; /* ids below 2^24 are exact in a float */
    }
    rec[0] = m;
    rec[1] = 0.0f;
    rec[2] = chosen >= v0 && chosen < v0 + vn ? row[chosen - v0] : -INFINITY;
}

int lse_fixed_bits(int n)
{
    int b = 0;
    while (b < 31 && (1LL << b) < (long long)n + 1) b++;
    return 62 - b;
}

int64_t lse_fixed_sum(const float *row, int n, float m, int bits)
{
    int64_t sum = 0;
    for (int i = 0; i < n; i++) sum += llrint(ldexp(exp((double)row[i] - m), bits));
    return sum;
}

double lse_fixed(float m, int64_t sum, int bits) { return m + log(ldexp((double)sum, -bits)); }

void logprob_combine(const float *recs, int n_shards, int k, double lse, TokenLogprobs *out)
{
    size_t stride = LOGPROB_RECORD(k);
    float chosen = -INFINITY;
    for (int r = 0; r < n_shards; r++) {
        const float *x = recs + r * stride;
        chosen = x[2] > chosen ? x[2] : chosen;
    }
    int n = 0;
    out->k = k;
    for (int r = 0; r < n_shards; r++)
        for (int j = 0; j < k; j++) {
            const float *x = recs + r * stride;
            if (x[3 + k + j] >= 0) top_insert(out->top_lp, out->top_id, &n, k, x[3 + j], (int)x[3 + k + j]);
        }
    for (int j = 0; j < n; j++) out->top_lp[j] = (float)(out->top_lp[j] - lse);
    out->lp = (float)(chosen - lse);
}
