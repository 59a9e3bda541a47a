/* dcpinfer-mktrace: a synthetic agentic trace as a prompt file. Agentic
 * serving sends long contexts and asks for short answers; the published
 * trace this imitates has inputs of ~67K tokens (median) and outputs of
 * ~400. Input lengths here are lognormal around --median-input, outputs
 * lognormal around --median-output, both clipped; prompts are token ids,
 * so any model with a vocabulary of --vocab or more can run it. The
 * defaults scale the trace to a CPU machine: 1/100 of its input length.
 *
 * With --sessions the trace is multi-turn, as an agent's is: every
 * session starts with the same system prompt, and each turn's prompt is
 * the previous turn's prompt, a stand-in for its output (as many tokens
 * as it may generate) and a new tool result. Turns come in rounds (every
 * session's first turn, then every second turn, ...), as a later turn
 * arrives after the earlier one answered. The stand-in is not the output
 * the model will give, so only the prompts' history is shared. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static double uniform01(uint64_t *st) { return ((splitmix64(st) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* standard normal, Box-Muller */
static double normal(uint64_t *st)
{
    double u = uniform01(st), v = uniform01(st);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static int lognormal(uint64_t *st, double median, double sigma, int lo, int hi)
{
    double x = median * exp(sigma * normal(st));
    int n = (int)(x + 0.5);
    return n < lo ? lo : n > hi ? hi : n;
}

static int token(uint64_t *st, int vocab) { return 1 + (int)(splitmix64(st) % (uint64_t)(vocab - 1)); }

static void write_request(FILE *f, const char *id, int max_tokens, const int *ids, int n)
{
    fprintf(f, "{\"id\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"prompt_token_ids\": [", id, max_tokens);
    for (int j = 0; j < n; j++) fprintf(f, j ? ",%d" : "%d", ids[j]);
    fprintf(f, "]}\n");
}

typedef struct {
    int *ids;
    int n, cap;
} History;

/* appends n tokens: ids, or random ones where ids is NULL */
static void history_add(History *h, const int *ids, int n, uint64_t *st, int vocab)
{
    if (h->n + n > h->cap) h->ids = xrealloc(h->ids, sizeof(int) * (size_t)(h->cap = 2 * (h->n + n) + 1));
    for (int j = 0; j < n; j++) h->ids[h->n++] = ids ? ids[j] : token(st, vocab);
}

int main(int argc, char **argv)
{
    int requests = 64, median_in = 670, median_out = 40, max_in = 4000, max_out = 400, vocab = 512;
    int sessions = 0, turns = 4, median_turn = -1, system = -1;
    double sigma_in = 0.5, sigma_out = 0.4;
    unsigned long long seed = 67;
    const char *out = NULL;
    static const struct option opts[] = {
        {"requests", 1, 0, 'n'},      {"median-input", 1, 0, 'i'}, {"sigma-input", 1, 0, 'I'},
        {"median-output", 1, 0, 'o'}, {"sigma-output", 1, 0, 'O'}, {"max-input", 1, 0, 'm'},
        {"max-output", 1, 0, 'M'},    {"vocab", 1, 0, 'v'},        {"seed", 1, 0, 's'},
        {"out", 1, 0, 'f'},           {"help", 0, 0, 'h'},         {"sessions", 1, 0, 'S'},
        {"turns", 1, 0, 'T'},         {"median-turn", 1, 0, 't'},  {"system", 1, 0, 'y'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'n': requests = atoi(optarg); break;
        case 'i': median_in = atoi(optarg); break;
        case 'I': sigma_in = atof(optarg); break;
        case 'o': median_out = atoi(optarg); break;
        case 'O': sigma_out = atof(optarg); break;
        case 'm': max_in = atoi(optarg); break;
        case 'M': max_out = atoi(optarg); break;
        case 'v': vocab = atoi(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'f': out = optarg; break;
        case 'S': sessions = atoi(optarg); break;
        case 'T': turns = atoi(optarg); break;
        case 't': median_turn = atoi(optarg); break;
        case 'y': system = atoi(optarg); break;
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "Usage: dcpinfer-mktrace [--out FILE] [options]\n"
                    "Writes a synthetic agentic trace (JSONL of token-id prompts, greedy).\n"
                    "  --requests N        requests (default 64)\n"
                    "  --median-input N    median prompt tokens (default 670: 1/100 of 67K)\n"
                    "  --sigma-input S     lognormal sigma of prompt lengths (default 0.5)\n"
                    "  --median-output N   median output tokens (default 40)\n"
                    "  --sigma-output S    lognormal sigma of output lengths (default 0.4)\n"
                    "  --max-input N, --max-output N   clip (defaults 4000, 400)\n"
                    "  --vocab N           token ids drawn from [1, N) (default 512)\n"
                    "  --seed N            (default 67)\n"
                    "Multi-turn agentic sessions (instead of --requests independent prompts):\n"
                    "  --sessions N        sessions, each of --turns turns: N x turns requests\n"
                    "  --turns N           turns per session (default 4)\n"
                    "  --system N          system prompt tokens every session starts with\n"
                    "                      (default median-input / 4)\n"
                    "  --median-turn N     median tokens of the tool result each later turn adds\n"
                    "                      after the previous prompt and its output's stand-in\n"
                    "                      (default median-input / 8); --median-input is the\n"
                    "                      first turn's prompt\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (system < 0) system = median_in / 4;
    if (median_turn < 0) median_turn = median_in / 8 > 1 ? median_in / 8 : 1;
    if (requests < 1 || median_in < 1 || median_out < 1 || vocab < 2 || max_in < 1 || max_out < 1 || sessions < 0 ||
        turns < 1 || median_turn < 1 || system > max_in) {
        fprintf(stderr, "dcpinfer-mktrace: sizes must be positive\n");
        return 2;
    }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) {
        perror(out);
        return 1;
    }
    uint64_t st = seed;
    char id[64];
    for (int r = 0; r < requests && !sessions; r++) {
        int n_in = lognormal(&st, median_in, sigma_in, 1, max_in);
        int n_out = lognormal(&st, median_out, sigma_out, 1, max_out);
        History h = {0};
        history_add(&h, NULL, n_in, &st, vocab);
        snprintf(id, sizeof id, "agent-%04d", r);
        write_request(f, id, n_out, h.ids, h.n);
        free(h.ids);
    }
    if (sessions) {
        History *h = xcalloc((size_t)sessions, sizeof(History)), sys = {0};
        int *last_out = xcalloc((size_t)sessions, sizeof(int));
        history_add(&sys, NULL, system, &st, vocab);
        for (int t = 0; t < turns; t++)
            for (int s = 0; s < sessions; s++) {
                if (t == 0) {
                    int n_in = lognormal(&st, median_in, sigma_in, system + 1, max_in);
                    history_add(&h[s], sys.ids, system, &st, vocab);
                    history_add(&h[s], NULL, n_in - system, &st, vocab);
                } else {
                    history_add(&h[s], NULL, last_out[s], &st, vocab);
                    history_add(&h[s], NULL, lognormal(&st, median_turn, sigma_in, 1, max_in), &st, vocab);
                }
                last_out[s] = lognormal(&st, median_out, sigma_out, 1, max_out);
                snprintf(id, sizeof id, "session-%03d-turn-%02d", s, t);
                write_request(f, id, last_out[s], h[s].ids, h[s].n);
            }
        for (int s = 0; s < sessions; s++) free(h[s].ids);
        free(h);
        free(sys.ids);
        free(last_out);
    }
    if (out && fclose(f)) {
        perror(out);
        return 1;
    }
    return 0;
}
