/* dcpinfer-mktrace: a synthetic agentic trace as a prompt file. Agentic
 * serving sends long contexts and asks for short answers; the published
 * trace this imitates has inputs of ~67K tokens (median) and outputs of
 * ~400. Input lengths here are lognormal around --median-input, outputs
 * lognormal around --median-output, both clipped; prompts are token ids,
 * so any model with a vocabulary of --vocab or more can run it. The
 * defaults scale the trace to a CPU machine: 1/100 of its input length. */
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

int main(int argc, char **argv)
{
    int requests = 64, median_in = 670, median_out = 40, max_in = 4000, max_out = 400, vocab = 512;
    double sigma_in = 0.5, sigma_out = 0.4;
    unsigned long long seed = 67;
    const char *out = NULL;
    static const struct option opts[] = {
        {"requests", 1, 0, 'n'},      {"median-input", 1, 0, 'i'}, {"sigma-input", 1, 0, 'I'},
        {"median-output", 1, 0, 'o'}, {"sigma-output", 1, 0, 'O'}, {"max-input", 1, 0, 'm'},
        {"max-output", 1, 0, 'M'},    {"vocab", 1, 0, 'v'},        {"seed", 1, 0, 's'},
        {"out", 1, 0, 'f'},           {"help", 0, 0, 'h'},         {0, 0, 0, 0}};
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
                    "  --seed N            (default 67)\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (requests < 1 || median_in < 1 || median_out < 1 || vocab < 2 || max_in < 1 || max_out < 1) {
        fprintf(stderr, "dcpinfer-mktrace: sizes must be positive\n");
        return 2;
    }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) {
        perror(out);
        return 1;
    }
    uint64_t st = seed;
    for (int r = 0; r < requests; r++) {
        int n_in = lognormal(&st, median_in, sigma_in, 1, max_in);
        int n_out = lognormal(&st, median_out, sigma_out, 1, max_out);
        fprintf(f, "{\"id\": \"agent-%04d\", \"max_tokens\": %d, \"temperature\": 0, \"prompt_token_ids\": [", r, n_out);
        for (int j = 0; j < n_in; j++) fprintf(f, j ? ",%d" : "%d", 1 + (int)(splitmix64(&st) % (uint64_t)(vocab - 1)));
        fprintf(f, "]}\n");
    }
    if (out && fclose(f)) {
        perror(out);
        return 1;
    }
    return 0;
}
