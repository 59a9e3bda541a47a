#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void report_rank_map(const RankInfo *ri, int world)
{
    printf("# rank map\n# %5s %-20s %4s %4s %4s %4s %12s %9s\n", "rank", "host", "gpu", "dp", "tp", "dcp",
           "query heads", "KV heads");
    for (int r = 0; r < world; r++) {
        char q[32], kv[32];
        snprintf(q, sizeof q, "%d-%d", ri[r].q_head0, ri[r].q_head0 + ri[r].q_heads - 1);
        snprintf(kv, sizeof kv, "%d-%d", ri[r].kv_head0, ri[r].kv_head0 + ri[r].kv_heads - 1);
        char gpu[16];
        snprintf(gpu, sizeof gpu, ri[r].device < 0 ? "-" : "%d", ri[r].device);
        printf("  %5d %-20s %4s %4d %4d %4d %12s %9s\n", r, ri[r].host, gpu, ri[r].dp_rank, ri[r].tp_rank,
               ri[r].dcp_rank, q, kv);
    }
}

/* the length of the UTF-8 character at p (n bytes left), 0 when the bytes
 * there are not one */
static int utf8_char(const unsigned char *p, size_t n)
{
    int len = p[0] < 0x80 ? 1 : (p[0] & 0xe0) == 0xc0 ? 2 : (p[0] & 0xf0) == 0xe0 ? 3 : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || (size_t)len > n || (len == 2 && p[0] < 0xc2)) return 0;
    for (int i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    unsigned cp = len == 1 ? p[0] : len == 2 ? p[0] & 0x1f : len == 3 ? p[0] & 0x0f : p[0] & 0x07;
    for (int i = 1; i < len; i++) cp = cp << 6 | (p[i] & 0x3f);
    /* overlong forms, surrogates and code points past U+10FFFF are not UTF-8 */
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void text_preview(const char *text, size_t len, int max_chars, char *out, size_t n)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t at = 0, o = 0;
    int shown = 0;
    out[o++] = '"';
    for (; at < len && shown < max_chars && o + 8 < n; shown++) {
        int c = utf8_char(p + at, len - at);
        if (c == 1 && p[at] == '\n') o += (size_t)snprintf(out + o, n - o, "\\n");
        else if (c == 1 && p[at] == '"') o += (size_t)snprintf(out + o, n - o, "\\\"");
        else if (c == 1 && (p[at] < 0x20 || p[at] == 0x7f)) o += (size_t)snprintf(out + o, n - o, "\\x%02x", p[at]);
        else if (c) memcpy(out + o, p + at, (size_t)c), o += (size_t)c;
        else o += (size_t)snprintf(out + o, n - o, "\\x%02x", p[at]);
        at += c ? (size_t)c : 1;
    }
    o += (size_t)snprintf(out + o, n - o, at < len ? "...\"" : "\"");
}

void report_requests(const RequestSet *rs, const Result *res, char *const *texts)
{
    enum { CHARS = 60 };
    char preview[8 * CHARS + 8];
    printf("# %-14s %8s %8s %-7s %9s %9s  %s\n", "id", "prompt", "output", "finish", "ttft_s", "e2e_s", "text");
    for (int i = 0; i < rs->n; i++) {
        const Result *r = &res[i];
        printf("  %-14s %8d %8d %-7s %9.4f %9.4f  ", rs->r[i].id, rs->r[i].n_prompt, r->n, r->finish_reason,
               r->ttft_s, r->e2e_s);
        if (!texts[i][0] && r->n) { /* no tokenizer: the ids */
            putchar('[');
            for (int k = 0; k < r->n && k < 12; k++) printf(k ? ", %d" : "%d", r->tokens[k]);
            fputs(r->n > 12 ? ", ...]" : "]", stdout);
        } else {
            text_preview(texts[i], strlen(texts[i]), CHARS, preview, sizeof preview);
            fputs(preview, stdout);
        }
        putchar('\n');
    }
}

void report_comm(const CommStats *cs, const long long *kv_peak, int world)
{
    printf("# %-15s %10s %14s %10s %10s %10s\n", "collective", "calls", "bytes", "avg_s", "min_s", "max_s");
    for (int k = 0; k < COMM_N; k++) {
        long long calls = 0, bytes = 0;
        double sum = 0, lo = 1e300, hi = 0;
        for (int r = 0; r < world; r++) {
            double t = 0;
            for (int p = 0; p < PHASE_N; p++) {
                calls += cs[r].c[p][k].calls;
                bytes += cs[r].c[p][k].bytes;
                t += cs[r].c[p][k].seconds;
            }
            sum += t;
            lo = t < lo ? t : lo;
            hi = t > hi ? t : hi;
        }
        if (calls)
            printf("  %-15s %10lld %14lld %10.4f %10.4f %10.4f\n", comm_kind_names[k], calls, bytes, sum / world, lo,
                   hi);
    }
    long long lo = kv_peak[0], hi = kv_peak[0], sum = 0;
    for (int r = 0; r < world; r++) {
        sum += kv_peak[r];
        lo = kv_peak[r] < lo ? kv_peak[r] : lo;
        hi = kv_peak[r] > hi ? kv_peak[r] : hi;
    }
    printf("# KV cache bytes held at peak per rank: avg %lld, min %lld, max %lld\n", sum / world, lo, hi);
}

void report_moe(const MoeReport *m, int world)
{
    int L = m->layers, E = m->experts, per = E / m->ep, worst = -1, moe_layers = 0;
    double worst_ratio = 0, ratio_sum = 0;
    long long *rank_load = xcalloc((size_t)m->ep, sizeof(long long));
    for (int l = 0; l < L; l++) {
        const long long *t = m->expert_tokens + (size_t)l * E;
        long long sum = 0, hi = 0;
        for (int e = 0; e < E; e++) {
            sum += t[e];
            hi = t[e] > hi ? t[e] : hi;
            rank_load[e / per] += t[e];
        }
        if (!sum) continue; /* a dense layer */
        double r = (double)hi * E / (double)sum;
        moe_layers++;
        ratio_sum += r;
        if (r > worst_ratio) worst_ratio = r, worst = l;
    }
    long long all = 0, hi = 0;
    for (int r = 0; r < m->ep; r++) {
        all += rank_load[r];
        hi = rank_load[r] > hi ? rank_load[r] : hi;
    }
    free(rank_load);
    printf("# experts: %d over %d rank(s), %d each; %lld (token, expert) pair(s) routed", E, m->ep, per, all);
    if (moe_layers)
        printf("; load max/mean: per expert %.2f on average over %d MoE layer(s) (worst %.2f, layer %d), per rank "
               "%.2f",
               ratio_sum / moe_layers, moe_layers, worst_ratio, worst, all ? (double)hi * m->ep / (double)all : 0.0);
    printf("\n");
    long long idle = 0, idle_hi = 0;
    double secs = 0;
    for (int r = 0; r < world; r++) {
        idle += m->idle_steps[r];
        idle_hi = m->idle_steps[r] > idle_hi ? m->idle_steps[r] : idle_hi;
        secs = m->idle_seconds[r] > secs ? m->idle_seconds[r] : secs;
    }
    if (idle)
        printf("# idle passes (a DP group without tokens, in step with the others through the MoE layers): up to %lld "
               "on a rank, %.3f s at most\n",
               idle_hi, secs);
}

void report_steps(const StepRecord *steps, const int *step_dp, int n_steps, int dp, int kv_blocks)
{
    int max_running = 0, peak_blocks = 0, preempted = 0;
    int *count = xcalloc((size_t)dp, sizeof(int));
    double *end = xcalloc((size_t)dp, sizeof(double)); /* a group's last step's end */
    long *tokens = xcalloc((size_t)dp, sizeof(long));
    double *secs = xcalloc((size_t)dp, sizeof(double));
    for (int i = 0; i < n_steps; i++) {
        int g = step_dp ? step_dp[i] : 0;
        max_running = steps[i].running > max_running ? steps[i].running : max_running;
        peak_blocks = steps[i].kv_blocks_used > peak_blocks ? steps[i].kv_blocks_used : peak_blocks;
        preempted += steps[i].preempted;
        count[g]++;
        double e = steps[i].t_start + steps[i].seconds;
        end[g] = e > end[g] ? e : end[g];
        if (!steps[i].prefill_tokens) { /* tokens output: a row each, less drafts rejected */
            tokens[g] += steps[i].decode_tokens - steps[i].spec_drafted + steps[i].spec_accepted;
            secs[g] += steps[i].seconds;
        }
    }
    const char *in_group = dp > 1 ? " in a DP group" : "";
    if (dp == 1) printf("# %d step(s)", n_steps);
    else {
        printf("# steps per DP group (the groups run concurrently):");
        for (int g = 0; g < dp; g++) printf(" %d", count[g]);
    }
    printf(", at most %d request(s) running%s, %d preemption(s), KV use at most %.1f%% of %d blocks%s\n",
           max_running, in_group, preempted, 100.0 * peak_blocks / (kv_blocks ? kv_blocks : 1), kv_blocks,
           dp > 1 ? " per rank" : "");
    if (dp == 1) {
        if (secs[0] > 0)
            printf("# decode-only steps: %ld tokens in %.3f s: %.1f tokens/s\n", tokens[0], secs[0],
                   tokens[0] / secs[0]);
    } else {
        double rate = 0;
        int any = 0;
        for (int g = 0; g < dp; g++) any |= secs[g] > 0;
        if (any) {
            printf("# decode-only steps per DP group:");
            for (int g = 0; g < dp; g++) {
                printf("%s %d: %ld tokens in %.3f s (%.1f tokens/s)", g ? ";" : "", g, tokens[g], secs[g],
                       secs[g] > 0 ? tokens[g] / secs[g] : 0.0);
                rate += secs[g] > 0 ? tokens[g] / secs[g] : 0.0;
            }
            printf("; together %.1f tokens/s\n", rate);
        }
        printf("# DP groups' generation wall time (the run's is the slowest):");
        for (int g = 0; g < dp; g++) printf("%s %d: %.3f s", g ? "," : "", g, end[g]);
        printf("\n");
    }
    free(count);
    free(end);
    free(tokens);
    free(secs);
}

void report_kv_cache(const KvSizing *kv, int dcp, int max_model_len)
{
    printf("# KV cache: %d blocks of %d positions per rank (%.1f MiB), %d ranks per DCP group\n"
           "# KV cache size: %lld tokens\n"
           "# Maximum concurrency for %d tokens per request: %.2fx\n",
           kv->n_blocks, kv->block_size, kv->n_blocks * (double)kv->block_size * kv->bytes_per_token / 1048576.0, dcp,
           kv->capacity, max_model_len, (double)kv->capacity / max_model_len);
}

/* "1.50 GiB", "12.34 MiB", "0.50 KiB": GiB, or MiB and KiB for small sizes */
static const char *size_text(char *buf, size_t n, size_t bytes)
{
    double u;
    const char *unit = size_unit((double)bytes, &u);
    snprintf(buf, n, "%.2f %s", bytes / u, unit);
    return buf;
}

void report_gpu_budget(const GpuBudget *b)
{
    char s[5][32];
    printf("# GPU memory: %s x gpu_memory_utilization %.2f = %s per rank; model weights take %s; the activation peak "
           "of a step of %d tokens takes %s\n"
           "# Available KV cache memory: %s (--kv-cache-memory %zu)\n",
           size_text(s[0], 32, b->total), b->utilization, size_text(s[1], 32, b->usable), size_text(s[2], 32, b->weights),
           b->tokens, size_text(s[3], 32, b->activations), size_text(s[4], 32, b->kv), b->kv);
}

void report_prefix_cache(const RequestSet *rs, const Result *res, const char *skip)
{
    long long cached = 0, prompt = 0;
    for (int i = 0; i < rs->n; i++) {
        if ((skip && skip[i]) || rs->r[i].error) continue;
        cached += res[i].num_cached_tokens;
        prompt += rs->r[i].n_prompt;
    }
    printf("# prefix cache hit rate: %.1f%% (%lld of %lld prompt tokens)\n", prompt ? 100.0 * cached / prompt : 0.0,
           cached, prompt);
}

double percentile_nearest_rank(const double *sorted, long n, double p)
{
    long rank = (long)ceil(p / 100.0 * (double)n); /* 1-based */
    rank = rank < 1 ? 1 : rank > n ? n : rank;
    return sorted[rank - 1];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void report_latency(const RequestSet *rs, const Result *res)
{
    int n = 0;
    long n_itl = 0;
    for (int i = 0; i < rs->n; i++) {
        n += res[i].n > 0;
        n_itl += res[i].n > 1 ? res[i].n - 1 : 0;
    }
    if (!n) return;
    double *ttft = xmalloc(sizeof(double) * n), *tpot = xmalloc(sizeof(double) * n);
    double *itl = xmalloc(sizeof(double) * (size_t)(n_itl + 1));
    int k = 0;
    long m = 0;
    for (int i = 0; i < rs->n; i++) {
        if (!res[i].n) continue;
        ttft[k] = res[i].ttft_s;
        tpot[k++] = res[i].tpot_s;
        for (int j = 1; j < res[i].n; j++) itl[m++] = res[i].times[j] - res[i].times[j - 1];
    }
    const char *names[3] = {"TTFT", "TPOT", "ITL"};
    double *sets[3] = {ttft, tpot, itl};
    long counts[3] = {n, n, n_itl};
    printf("# latency (s)      mean        p50        p99\n");
    for (int s = 0; s < 3; s++) {
        if (!counts[s]) continue;
        qsort(sets[s], (size_t)counts[s], sizeof(double), cmp_double);
        double sum = 0;
        for (long i = 0; i < counts[s]; i++) sum += sets[s][i];
        printf("  %-10s %10.4f %10.4f %10.4f\n", names[s], sum / counts[s], percentile_nearest_rank(sets[s], counts[s], 50),
               percentile_nearest_rank(sets[s], counts[s], 99));
    }
    free(ttft);
    free(tpot);
    free(itl);
}

void report_spec(const SpecConfig *sc, const StepRecord *steps, int n_steps, long long verifications,
                 const long long *accepted_at)
{
    long long drafted = 0, accepted = 0;
    for (int i = 0; i < n_steps; i++) {
        drafted += steps[i].spec_drafted;
        accepted += steps[i].spec_accepted;
    }
    printf("# speculative decoding (%s, K=%d): %lld draft token(s) in %lld verification(s), %lld accepted "
           "(%.1f%%); mean acceptance length %.2f; acceptance rate per position:",
           sc->method == SPEC_NGRAM ? "ngram" : "mtp", sc->k, drafted, verifications, accepted,
           drafted ? 100.0 * accepted / drafted : 0.0,
           verifications ? 1.0 + (double)accepted / verifications : 1.0);
    for (int j = 0; j < sc->k; j++) printf(" %.3f", verifications ? (double)accepted_at[j] / verifications : 0.0);
    printf("\n");
}
