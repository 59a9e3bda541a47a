#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static const Tokenizer *sort_ctx;

static int cmp_piece(const void *a, const void *b)
{
    return strcmp(sort_ctx->vocab[*(const int *)a], sort_ctx->vocab[*(const int *)b]);
}

int tokenizer_load(Tokenizer *t, const char *path, int vocab_size)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return dcp_fail("%s: %s", path, strerror(errno));
    t->path = xstrdup(path);
    t->vocab_size = vocab_size;
    t->vocab = xcalloc((size_t)vocab_size, sizeof(char *));
    t->scores = xcalloc((size_t)vocab_size, sizeof(float));
    int rc = 0;
    if (fread(&t->max_token_length, sizeof(int), 1, f) != 1 || t->max_token_length <= 0 ||
        t->max_token_length > 1 << 16)
        rc = dcp_fail("%s: not a llama2.c tokenizer file (bad max_token_length)", path);
    for (int i = 0; i < vocab_size && !rc; i++) {
        int len;
        if (fread(&t->scores[i], sizeof(float), 1, f) != 1 || fread(&len, sizeof(int), 1, f) != 1)
            rc = dcp_fail("%s: ends after %d pieces, the model has %d (wrong tokenizer?)", path, i, vocab_size);
        else if (len < 0 || len > t->max_token_length)
            rc = dcp_fail("%s: piece %d has length %d", path, i, len);
        else {
            t->vocab[i] = xmalloc((size_t)len + 1);
            if (fread(t->vocab[i], 1, (size_t)len, f) != (size_t)len)
                rc = dcp_fail("%s: truncated in piece %d", path, i);
            t->vocab[i][len] = '\0';
        }
    }
    if (!rc && fgetc(f) != EOF)
        rc = dcp_fail("%s: holds more than the model's %d pieces (wrong tokenizer?)", path, vocab_size);
    fclose(f);
    if (rc) {
        tokenizer_free(t);
        return -1;
    }
    for (int i = 0; i < 256; i++) {
        t->byte_pieces[2 * i] = (unsigned char)i;
        t->byte_pieces[2 * i + 1] = '\0';
    }
    t->sorted = xmalloc(sizeof(int) * (size_t)vocab_size);
    for (int i = 0; i < vocab_size; i++) t->sorted[i] = i;
    sort_ctx = t;
    qsort(t->sorted, (size_t)vocab_size, sizeof(int), cmp_piece);
    return 0;
}

void tokenizer_free(Tokenizer *t)
{
    if (t->vocab)
        for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted);
    free(t->path);
    memset(t, 0, sizeof *t);
}

static int lookup(const Tokenizer *t, const char *s)
{
    int lo = 0, hi = t->vocab_size - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(s, t->vocab[t->sorted[mid]]);
        if (c == 0) return t->sorted[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

int tokenizer_encode(const Tokenizer *t, const char *text, int bos, int **out, int *n_out)
{
    size_t len = strlen(text);
    /* BOS + dummy prefix + at most one token per byte */
    int *tok = xmalloc(sizeof(int) * (len + 3));
    char *buf = xmalloc((size_t)t->max_token_length * 2 + 3);
    int n = 0;
    if (bos >= 0) tok[n++] = bos;
    if (text[0] != '\0') {
        int sp = lookup(t, " ");
        if (sp >= 0) tok[n++] = sp;
    }
    size_t blen = 0;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80) blen = 0; /* start of a new code point */
        buf[blen++] = *c;
        buf[blen] = '\0';
        if ((c[1] & 0xC0) == 0x80 && blen < 4) continue;
        int id = lookup(t, buf);
        if (id >= 0) {
            tok[n++] = id;
        } else { /* byte fallback: ids 3..258 are <0x00>..<0xFF> */
            for (size_t i = 0; i < blen; i++) tok[n++] = (unsigned char)buf[i] + 3;
        }
        blen = 0;
    }
    /* merge the adjacent pair with the best score until none merges */
    char *pair = xmalloc((size_t)t->max_token_length * 2 + 3);
    for (;;) {
        float best = -1e10f;
        int best_id = -1, best_i = -1;
        for (int i = 0; i + 1 < n; i++) {
            size_t a = strlen(t->vocab[tok[i]]), b = strlen(t->vocab[tok[i + 1]]);
            if (a + b > (size_t)t->max_token_length * 2) continue;
            memcpy(pair, t->vocab[tok[i]], a);
            memcpy(pair + a, t->vocab[tok[i + 1]], b + 1);
            int id = lookup(t, pair);
            if (id >= 0 && t->scores[id] > best) {
                best = t->scores[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_i < 0) break;
        tok[best_i] = best_id;
        memmove(tok + best_i + 1, tok + best_i + 2, sizeof(int) * (size_t)(n - best_i - 2));
        n--;
    }
    free(pair);
    free(buf);
    *out = tok;
    *n_out = n;
    return 0;
}

const char *tokenizer_decode(const Tokenizer *t, int prev, int token, int bos)
{
    if (token < 0 || token >= t->vocab_size) return "";
    const char *piece = t->vocab[token];
    if (prev == bos && piece[0] == ' ') piece++;
    unsigned int byte;
    char tail;
    if (sscanf(piece, "<0x%02X%c", &byte, &tail) == 2 && tail == '>' && byte < 256)
        piece = (const char *)t->byte_pieces + byte * 2;
    return piece;
}
