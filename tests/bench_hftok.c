/* Encoding speed of a tokenizer.json: every line of a text file encoded
 * (no special tokens), one thread; prints MB/s and tokens. For
 * scripts/bench-tokenizer.sh, not a test.
 * Usage: bench_hftok TOKENIZER.json TEXT [REPEAT] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hftok.h"
#include "util.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_hftok TOKENIZER.json TEXT [REPEAT]\n");
        return 2;
    }
    HfTokenizer *t = hftok_load(argv[1]);
    char *text;
    size_t size;
    if (!t || read_file(argv[2], &text, &size)) {
        fprintf(stderr, "bench_hftok: %s\n", dcp_error());
        return 1;
    }
    int repeat = argc > 3 ? atoi(argv[3]) : 1;
    double best = 1e30;
    long tokens = 0;
    for (int r = 0; r < repeat; r++) {
        double t0 = now_s();
        tokens = 0;
        for (size_t at = 0; at < size;) {
            char *nl = memchr(text + at, '\n', size - at);
            size_t len = nl ? (size_t)(nl - text - at) + 1 : size - at;
            int *ids, n;
            if (hftok_encode(t, text + at, len, 0, &ids, &n)) {
                fprintf(stderr, "bench_hftok: %s\n", dcp_error());
                return 1;
            }
            tokens += n;
            free(ids);
            at += len;
        }
        double s = now_s() - t0;
        best = s < best ? s : best;
    }
    printf("%.2f MB/s (%zu bytes, %ld tokens, best of %d: %.3f s)\n", size / best / 1e6, size, tokens, repeat, best);
    free(text);
    hftok_free(t);
    return 0;
}
