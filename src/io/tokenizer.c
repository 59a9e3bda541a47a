#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hftok.h"
#include "tiktoken.h"
#include "util.h"

static const Tokenizer *sort_ctx;

static int cmp_piece(const void *a, const void *b)
{
    return strcmp(sort_ctx->vocab[*(const int *)a], sort_ctx->vocab[*(const int *)b]);
}

int tokenizer_parse(Tokenizer *t, const char *path, const unsigned char *data, size_t size, int vocab_size)
{
    memset(t, 0, sizeof *t);
    t->eos_id = -1;
    /* each piece takes at least 8 bytes (score, length): a vocabulary the
     * file cannot hold is refused before anything is allocated for it */
    if (vocab_size <= 0 || size < 4 + 8 * (size_t)vocab_size)
        return dcp_fail("%s: %zu bytes cannot hold the model's %d pieces (wrong tokenizer?)", path, size, vocab_size);
    t->path = xstrdup(path);
    t->vocab_size = vocab_size;
    t->vocab = xcalloc((size_t)vocab_size, sizeof(char *));
    t->scores = xcalloc((size_t)vocab_size, sizeof(float));
    size_t at = 0;
#define TAKE(dst, n) (size - at >= (size_t)(n) ? (memcpy((dst), data + at, (size_t)(n)), at += (size_t)(n), 1) : 0)
    int rc = 0;
    if (!TAKE(&t->max_token_length, sizeof(int)) || t->max_token_length <= 0 || t->max_token_length > 1 << 16)
        rc = dcp_fail("%s: not a llama2.c tokenizer file (bad max_token_length)", path);
    for (int i = 0; i < vocab_size && !rc; i++) {
        int len;
        if (!TAKE(&t->scores[i], sizeof(float)) || !TAKE(&len, sizeof(int)))
            rc = dcp_fail("%s: ends after %d pieces, the model has %d (wrong tokenizer?)", path, i, vocab_size);
        else if (len < 0 || len > t->max_token_length)
            rc = dcp_fail("%s: piece %d has length %d", path, i, len);
        else {
            t->vocab[i] = xmalloc((size_t)len + 1);
            if (!TAKE(t->vocab[i], len)) rc = dcp_fail("%s: truncated in piece %d", path, i);
            t->vocab[i][len] = '\0';
        }
    }
#undef TAKE
    if (!rc && at != size)
        rc = dcp_fail("%s: holds more than the model's %d pieces (wrong tokenizer?)", path, vocab_size);
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

/* a tiktoken file: named tiktoken.model or *.tiktoken */
static int is_tiktoken(const char *path)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t n = strlen(base);
    return !strcmp(base, "tiktoken.model") || (n > 9 && !strcmp(base + n - 9, ".tiktoken"));
}

/* a tokenizer.json: a folder holding one (or else a tiktoken.model), or a
 * file that starts with '{' (or a tiktoken file) */
static char *hf_tokenizer_path(const char *path)
{
    if (path_is_dir(path)) {
        char *p = xmalloc(strlen(path) + 32);
        sprintf(p, "%s/tokenizer.json", path);
        if (!path_exists(p)) {
            sprintf(p, "%s/tiktoken.model", path);
            if (!path_exists(p)) sprintf(p, "%s/tokenizer.json", path); /* the error names the usual file */
        }
        return p;
    }
    if (is_tiktoken(path)) return xstrdup(path);
    FILE *f = fopen(path, "rb");
    int c = f ? fgetc(f) : EOF;
    while (c == ' ' || c == '\n' || c == '\t' || c == '\r') c = fgetc(f);
    if (f) fclose(f);
    return c == '{' ? xstrdup(path) : NULL;
}

/* A special token of tokenizer_config.json (key): "text" or {"content":
 * "text"}; its id, or -1 when the field is missing or null. A token the
 * tokenizer does not have, or a field of another type, is an error: a
 * silently ignored eos_token would let generation run past the end. */
static int config_token(const HfTokenizer *hf, const char *path, json_t *root, const char *key, int *id)
{
    json_t *v = json_object_get(root, key);
    *id = -1;
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v))
        return dcp_fail("%s: \"%s\" must be a token's text or an object with \"content\"", path, key);
    *id = hftok_token_id(hf, json_string_value(v));
    if (*id < 0)
        return dcp_fail("%s: \"%s\" names \"%s\", which the tokenizer does not have (wrong tokenizer_config.json?)",
                        path, key, json_string_value(v));
    return 0;
}

/* tokenizer_config.json beside the tokenizer.json at json, if any; its
 * bytes join the tokenizer's content hash */
static int read_tokenizer_config(Tokenizer *t, const char *json)
{
    char *p = path_beside(json, "tokenizer_config.json"), *text = NULL;
    size_t len = 0;
    if (!path_exists(p)) {
        free(p);
        return 0;
    }
    /* a FIFO or device would block the read or never end */
    if (check_regular_file(p, "tokenizer config") || read_file(p, &text, &len)) {
        free(p);
        return -1;
    }
    t->content_hash = fnv1a(t->content_hash, text, len + 1);
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &err); /* model_max_length may be 1e30 */
    int rc = 0;
    if (!json_is_object(root)) {
        rc = dcp_fail("%s:%d: not a JSON object: %s", p, err.line, root ? "" : err.text);
    } else {
        json_t *ab = json_object_get(root, "add_bos_token"), *ae = json_object_get(root, "add_eos_token");
        int bos = -1;
        if (config_token(t->hf, p, root, "bos_token", &bos) || config_token(t->hf, p, root, "eos_token", &t->eos_id))
            rc = -1;
        else
            hftok_set_template(t->hf, json_is_boolean(ab) ? json_is_true(ab) : -1, bos,
                               json_is_boolean(ae) ? json_is_true(ae) : -1, t->eos_id);
    }
    json_decref(root);
    free(text);
    free(p);
    return rc;
}

int tokenizer_load(Tokenizer *t, const char *path, int vocab_size)
{
    memset(t, 0, sizeof *t);
    t->eos_id = -1;
    t->content_hash = FNV_START;
    if (!path_is_dir(path) && check_regular_file(path, "tokenizer")) return -1; /* a FIFO would block the sniffing */
    char *json = hf_tokenizer_path(path);
    if (json) {
        t->hf = is_tiktoken(json) ? tiktoken_load_model(json) : hftok_load(json);
        if (!t->hf || hash_file_sampled(json, (size_t)1 << 40, &t->content_hash)) {
            hftok_free(t->hf);
            t->hf = NULL;
            free(json);
            return -1;
        }
        if (hftok_vocab_size(t->hf) > vocab_size) {
            int n = hftok_vocab_size(t->hf);
            hftok_free(t->hf);
            t->hf = NULL;
            free(json);
            return dcp_fail("%s: the tokenizer has ids up to %d, the model's vocabulary only %d (wrong tokenizer?)",
                            path, n - 1, vocab_size);
        }
        t->path = xstrdup(path);
        t->hf_file = json;
        t->vocab_size = vocab_size;
        return read_tokenizer_config(t, json);
    }
    struct stat st;
    if (check_regular_file(path, "tokenizer")) return -1;
    if (stat(path, &st) == 0 && (size_t)st.st_size < 4 + 8 * (size_t)vocab_size)
        return dcp_fail("%s: %lld bytes cannot hold the model's %d pieces (wrong tokenizer?)", path,
                        (long long)st.st_size, vocab_size);
    char *data;
    size_t size;
    if (read_file(path, &data, &size)) return -1;
    int rc = tokenizer_parse(t, path, (const unsigned char *)data, size, vocab_size);
    t->content_hash = fnv1a(FNV_START, data, size);
    free(data);
    return rc;
}

int tokenizer_ids(const Tokenizer *t) { return t->hf ? hftok_vocab_size(t->hf) : t->vocab_size; }

void tokenizer_free(Tokenizer *t)
{
    hftok_free(t->hf);
    if (t->vocab)
        for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted);
    free(t->path);
    free(t->hf_file);
    memset(t, 0, sizeof *t);
    t->eos_id = -1;
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

/* A candidate merge of the adjacent tokens at nodes left and right into
 * id, valid while both nodes still hold the tokens they held when it was
 * made (their versions). */
typedef struct {
    float score;
    int left, right, id;
    unsigned lver, rver;
} Merge;

typedef struct {
    Merge *h;
    int n, cap;
} MergeHeap;

/* best score first; among equal scores the leftmost pair, as llama2.c's
 * scan (strictly greater wins) picks it */
static int merge_before(const Merge *a, const Merge *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void merge_push(MergeHeap *q, Merge m)
{
    if (q->n == q->cap) q->h = xrealloc(q->h, sizeof(Merge) * (size_t)(q->cap = q->cap ? 2 * q->cap : 64));
    int i = q->n++;
    while (i > 0 && merge_before(&m, &q->h[(i - 1) / 2])) {
        q->h[i] = q->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q->h[i] = m;
}

static Merge merge_pop(MergeHeap *q)
{
    Merge top = q->h[0], last = q->h[--q->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && merge_before(&q->h[c + 1], &q->h[c])) c++;
        if (!merge_before(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = last;
    return top;
}

/* Merges the adjacent pair with the best score until none merges, as
 * llama2.c's run.c does, but in O(n log n): the tokens are a linked list
 * and the candidate pairs a heap, refreshed around each merge. */
static void merge_pairs(const Tokenizer *t, int *tok, int *n_io)
{
    int n = *n_io;
    if (n < 2) return;
    int *next = xmalloc(sizeof(int) * (size_t)n), *prev = xmalloc(sizeof(int) * (size_t)n);
    unsigned *ver = xcalloc((size_t)n, sizeof(unsigned));
    char *pair = xmalloc((size_t)t->max_token_length * 2 + 3);
    MergeHeap q = {0};
    for (int i = 0; i < n; i++) {
        next[i] = i + 1 < n ? i + 1 : -1;
        prev[i] = i - 1;
    }
#define CANDIDATE(i)                                                                                           \
    do {                                                                                                       \
        int l_ = (i), r_ = l_ >= 0 ? next[l_] : -1;                                                            \
        if (r_ < 0) break;                                                                                     \
        size_t a_ = strlen(t->vocab[tok[l_]]), b_ = strlen(t->vocab[tok[r_]]);                                 \
        if (a_ + b_ > (size_t)t->max_token_length * 2) break;                                                  \
        memcpy(pair, t->vocab[tok[l_]], a_);                                                                   \
        memcpy(pair + a_, t->vocab[tok[r_]], b_ + 1);                                                          \
        int id_ = lookup(t, pair);                                                                             \
        if (id_ >= 0 && t->scores[id_] > -1e10f)                                                               \
            merge_push(&q, (Merge){t->scores[id_], l_, r_, id_, ver[l_], ver[r_]});                            \
    } while (0)
    for (int i = 0; i + 1 < n; i++) CANDIDATE(i);
    while (q.n) {
        Merge m = merge_pop(&q);
        if (next[m.left] != m.right || ver[m.left] != m.lver || ver[m.right] != m.rver) continue; /* stale */
        tok[m.left] = m.id;
        ver[m.left]++;
        ver[m.right]++;
        next[m.left] = next[m.right];
        if (next[m.right] >= 0) prev[next[m.right]] = m.left;
        next[m.right] = -2; /* removed */
        CANDIDATE(prev[m.left]);
        CANDIDATE(m.left);
    }
#undef CANDIDATE
    int k = 0;
    for (int i = 0; i >= 0; i = next[i]) tok[k++] = tok[i];
    *n_io = k;
    free(q.h);
    free(pair);
    free(next);
    free(prev);
    free(ver);
}

int tokenizer_encode_plain(const Tokenizer *t, const char *text, int **out, int *n_out)
{
    if (t->hf) return hftok_encode(t->hf, text, strlen(text), 0, out, n_out);
    return tokenizer_encode(t, text, -1, out, n_out);
}

int tokenizer_encode(const Tokenizer *t, const char *text, int bos, int **out, int *n_out)
{
    if (t->hf) return hftok_encode(t->hf, text, strlen(text), 1, out, n_out);
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
    free(buf);
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= t->vocab_size) {
            int bad = tok[i];
            free(tok);
            *out = NULL;
            *n_out = 0;
            return dcp_fail("%s yields token id %d, outside the model's vocabulary of %d (byte fallback or BOS id "
                            "on a vocabulary without those pieces)",
                            t->path ? t->path : "the tokenizer", bad, t->vocab_size);
        }
    merge_pairs(t, tok, &n);
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

char *tokenizer_decode_span(const Tokenizer *t, int prev, const int *ids, int n, int bos, int skip_special,
                            size_t *len)
{
    if (t->hf) {
        char *s = hftok_decode(t->hf, ids, n, skip_special);
        *len = strlen(s);
        return s;
    }
    size_t cap = 64, k = 0;
    char *s = xmalloc(cap);
    for (int i = 0; i < n; i++) {
        if (!(skip_special && ids[i] >= 0 && ids[i] < 3)) {
            const char *piece = tokenizer_decode(t, prev, ids[i], bos);
            size_t m = ids[i] >= 3 && ids[i] < 259 && !piece[0] ? 1 : strlen(piece); /* <0x00> is one byte */
            if (k + m + 1 > cap) s = xrealloc(s, cap = 2 * (k + m + 1));
            memcpy(s + k, piece, m);
            k += m;
        }
        prev = ids[i];
    }
    s[k] = '\0';
    *len = k;
    return s;
}
