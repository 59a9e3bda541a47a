#define PCRE2_CODE_UNIT_WIDTH 8
#include "hftok.h"

#include <ctype.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "util.h"

/* ---- growable byte strings and string -> id maps ----------------------- */

typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void buf_add(Buf *b, const void *p, size_t n)
{
    if (b->n + n + 1 > b->cap) b->s = xrealloc(b->s, b->cap = 2 * (b->n + n + 1));
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = '\0';
}

typedef struct {
    const char *key; /* points into the tokenizer's strings */
    size_t len;
    int value;
} Slot;

typedef struct {
    Slot *slot;
    size_t cap, n;
} Map;

static void map_put(Map *m, const char *key, size_t len, int value);

static void map_grow(Map *m)
{
    Map g = {xcalloc(m->cap ? 2 * m->cap : 1024, sizeof(Slot)), m->cap ? 2 * m->cap : 1024, 0};
    for (size_t i = 0; i < m->cap; i++)
        if (m->slot[i].key) map_put(&g, m->slot[i].key, m->slot[i].len, m->slot[i].value);
    free(m->slot);
    *m = g;
}

static void map_put(Map *m, const char *key, size_t len, int value)
{
    if (2 * (m->n + 1) > m->cap) map_grow(m);
    for (size_t i = fnv1a(FNV_START, key, len) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        Slot *s = &m->slot[i];
        if (!s->key) {
            *s = (Slot){key, len, value};
            m->n++;
            return;
        }
        if (s->len == len && !memcmp(s->key, key, len)) {
            s->value = value; /* a later entry overrides an earlier one */
            return;
        }
    }
}

static int map_get(const Map *m, const char *key, size_t len)
{
    if (!m->cap) return -1;
    for (size_t i = fnv1a(FNV_START, key, len) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const Slot *s = &m->slot[i];
        if (!s->key) return -1;
        if (s->len == len && !memcmp(s->key, key, len)) return s->value;
    }
}

/* ---- the pipeline's parts ------------------------------------------------ */

typedef enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_PREPEND, N_REPLACE } NormKind;
typedef struct {
    NormKind kind;
    char *a, *b; /* prepend: a; replace: pattern a, content b */
} Norm;

typedef enum { P_SPLIT, P_BYTELEVEL, P_METASPACE, P_DIGITS } PreKind;
typedef struct {
    PreKind kind;
    pcre2_code *re;       /* split; ByteLevel with use_regex */
    int removed, invert;  /* split behaviour Removed (else Isolated) */
    int add_prefix_space; /* ByteLevel */
    char *replacement;    /* Metaspace */
    int prepend;          /* Metaspace: 0 never, 1 first, 2 always */
    int split;            /* Metaspace */
    int individual;       /* Digits */
} Pre;

typedef enum { D_BYTELEVEL, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_METASPACE } DecKind;
typedef struct {
    DecKind kind;
    char *a, *b;          /* replace: pattern, content; metaspace: replacement */
    int start, stop;      /* strip */
    int prepend;          /* metaspace: strip the leading replacement */
} Dec;

typedef struct {
    char *content;
    int id, special, lstrip, rstrip, single_word;
    size_t len;
    int normalized;  /* matched in the normalized text, as its normalized form (norm) */
    char *norm;
    size_t norm_len;
} Added;

struct HfTokenizer {
    char **token;       /* id -> string */
    int n_vocab;
    Map vocab;          /* string -> id */
    Map merges;         /* "idA idB" packed as 8 bytes -> rank; merged id in merged_id */
    int *merged_id;     /* per rank */
    int32_t *merge_keys; /* a ranks file's merge keys, one block (tokenizer.json's are one allocation each) */
    int n_merges;
    int ignore_merges, byte_fallback, fuse_unk, unk;
    int byte_id[256];   /* <0xXX> tokens, -1 when absent */
    Norm *norm;
    int n_norm;
    Pre *pre;
    int n_pre;
    Dec *dec;
    int n_dec;
    Added *added;
    int n_added;
    char added_first[2][256]; /* [normalized][byte]: 1 when the byte begins such an added token */
    char *is_special;   /* per id */
    int *bos, n_bos, *eos, n_eos; /* TemplateProcessing "single": tokens before and after the sequence */
    char *path;
};

/* GPT-2's byte <-> printable character table of ByteLevel */
static int byte_to_cp[256], cp_to_byte[512];

static void bytelevel_table(void)
{
    if (byte_to_cp['!']) return;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = printable ? b : 256 + n++;
    }
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp[b]] = b;
}

static void add_cp(Buf *b, int cp)
{
    utf8proc_uint8_t u[4];
    utf8proc_ssize_t n = utf8proc_encode_char(cp, u);
    buf_add(b, u, (size_t)n);
}

/* ---- loading ---------------------------------------------------------------- */

static char *dup_str(json_t *v) { return json_is_string(v) ? xstrdup(json_string_value(v)) : NULL; }

static pcre2_code *compile(const char *pattern, const char *path)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        dcp_fail("%s: regex /%s/ does not compile at %zu: %s", path, pattern, (size_t)off, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* Whether a Split pattern can match the empty string: tokenizers splits
 * on an empty match otherwise than a step past it, so its ids would
 * differ. Tried at every place of a few subjects (letters, digits, spaces,
 * punctuation, newlines, and nothing). */
static int matches_empty(const pcre2_code *re)
{
    static const char *const subjects[] = {"", "a", "Ab c", " 12 ", "x, y!\n\nz\t", "\xc3\xa9t\xc3\xa9"};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int empty = 0;
    for (size_t k = 0; k < sizeof subjects / sizeof *subjects && !empty; k++) {
        size_t n = strlen(subjects[k]);
        for (size_t at = 0; at <= n && !empty; at++) {
            if (at < n && ((unsigned char)subjects[k][at] & 0xC0) == 0x80) continue;
            int rc = pcre2_match(re, (PCRE2_SPTR)subjects[k], n, at, PCRE2_ANCHORED, md, NULL);
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            empty = rc >= 0 && ov[0] == ov[1];
        }
    }
    pcre2_match_data_free(md);
    return empty;
}

static const char *pattern_of(json_t *p, int *is_regex)
{
    const char *s = json_string_value(json_object_get(p, "String"));
    *is_regex = 0;
    if (s) return s;
    *is_regex = 1;
    return json_string_value(json_object_get(p, "Regex"));
}

/* The type of one pipeline component (what names its kind in messages).
 * A missing component, or a Sequence, which is loaded here item by item
 * (its list under list_key) through load, gives NULL with *rc set. */
static const char *component(HfTokenizer *t, json_t *c, const char *what, const char *list_key,
                             int (*load)(HfTokenizer *, json_t *), int *rc)
{
    *rc = 0;
    if (!c || json_is_null(c)) return NULL;
    const char *type = json_string_value(json_object_get(c, "type"));
    if (!type) {
        *rc = dcp_fail("%s: %s without a type", t->path, what);
        return NULL;
    }
    if (strcmp(type, "Sequence")) return type;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(c, list_key), i, e) if ((*rc = load(t, e))) break;
    return NULL;
}

static int load_normalizer(HfTokenizer *t, json_t *n)
{
    int rc;
    const char *type = component(t, n, "normalizer", "normalizers", load_normalizer, &rc);
    if (!type) return rc;
    Norm x = {0};
    if (!strcmp(type, "NFC")) x.kind = N_NFC;
    else if (!strcmp(type, "NFD")) x.kind = N_NFD;
    else if (!strcmp(type, "NFKC")) x.kind = N_NFKC;
    else if (!strcmp(type, "NFKD")) x.kind = N_NFKD;
    else if (!strcmp(type, "Prepend")) x.kind = N_PREPEND, x.a = dup_str(json_object_get(n, "prepend"));
    else if (!strcmp(type, "Replace")) {
        int regex;
        const char *p = pattern_of(json_object_get(n, "pattern"), &regex);
        if (!p || regex) return dcp_fail("%s: Replace normalizer with a regex pattern is not supported", t->path);
        x.kind = N_REPLACE, x.a = xstrdup(p), x.b = dup_str(json_object_get(n, "content"));
    } else return dcp_fail("%s: normalizer %s is not supported", t->path, type);
    if ((x.kind == N_PREPEND && !x.a) || (x.kind == N_REPLACE && !x.b))
        return free(x.a), free(x.b), dcp_fail("%s: normalizer %s lacks its strings", t->path, type);
    t->norm = xrealloc(t->norm, sizeof(Norm) * (size_t)(t->n_norm + 1));
    t->norm[t->n_norm++] = x;
    return 0;
}

/* GPT-2's pattern, ByteLevel's own split */
static const char *gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pre(HfTokenizer *t, json_t *p)
{
    int rc;
    const char *type = component(t, p, "pre-tokenizer", "pretokenizers", load_pre, &rc);
    if (!type) return rc;
    Pre x = {0};
    if (!strcmp(type, "Split")) {
        int regex;
        const char *pat = pattern_of(json_object_get(p, "pattern"), &regex);
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!pat || !beh) return dcp_fail("%s: Split without a pattern or behavior", t->path);
        if (strcmp(beh, "Isolated") && strcmp(beh, "Removed"))
            return dcp_fail("%s: Split behavior %s is not supported (Isolated, Removed)", t->path, beh);
        x.kind = P_SPLIT;
        x.removed = !strcmp(beh, "Removed");
        x.invert = json_is_true(json_object_get(p, "invert"));
        if (x.invert) return dcp_fail("%s: Split with invert is not supported", t->path);
        if (!pat[0]) return dcp_fail("%s: Split with an empty pattern", t->path);
        if (regex) x.re = compile(pat, t->path);
        else {
            /* a literal string: quote it for PCRE2 */
            Buf q = {0};
            buf_add(&q, "\\Q", 2);
            buf_add(&q, pat, strlen(pat));
            buf_add(&q, "\\E", 2);
            x.re = compile(q.s, t->path);
            free(q.s);
        }
        if (!x.re) return -1;
        if (regex && matches_empty(x.re)) {
            pcre2_code_free(x.re);
            return dcp_fail("%s: the Split pattern /%s/ can match the empty string, which dcpinfer does not split "
                            "as tokenizers does: refused",
                            t->path, pat);
        }
    } else if (!strcmp(type, "ByteLevel")) {
        x.kind = P_BYTELEVEL;
        x.add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *ur = json_object_get(p, "use_regex");
        if ((!ur || json_is_true(ur)) && !(x.re = compile(gpt2_pattern, t->path))) return -1;
    } else if (!strcmp(type, "Metaspace")) {
        x.kind = P_METASPACE;
        x.replacement = dup_str(json_object_get(p, "replacement"));
        const char *scheme = json_string_value(json_object_get(p, "prepend_scheme"));
        x.prepend = !scheme || !strcmp(scheme, "always") ? 2 : !strcmp(scheme, "first") ? 1 : 0;
        json_t *sp = json_object_get(p, "split");
        x.split = !sp || json_is_true(sp);
        if (!x.replacement) return dcp_fail("%s: Metaspace without a replacement", t->path);
    } else if (!strcmp(type, "Digits")) {
        x.kind = P_DIGITS;
        x.individual = json_is_true(json_object_get(p, "individual_digits"));
    } else return dcp_fail("%s: pre-tokenizer %s is not supported", t->path, type);
    t->pre = xrealloc(t->pre, sizeof(Pre) * (size_t)(t->n_pre + 1));
    t->pre[t->n_pre++] = x;
    return 0;
}

static int load_decoder(HfTokenizer *t, json_t *d)
{
    int rc;
    const char *type = component(t, d, "decoder", "decoders", load_decoder, &rc);
    if (!type) return rc;
    Dec x = {0};
    if (!strcmp(type, "ByteLevel")) x.kind = D_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) x.kind = D_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) x.kind = D_FUSE;
    else if (!strcmp(type, "Replace")) {
        int regex;
        const char *p = pattern_of(json_object_get(d, "pattern"), &regex);
        if (!p || regex) return dcp_fail("%s: Replace decoder with a regex pattern is not supported", t->path);
        x.kind = D_REPLACE, x.a = xstrdup(p), x.b = dup_str(json_object_get(d, "content"));
        if (!x.b) return free(x.a), dcp_fail("%s: Replace decoder without content", t->path);
    } else if (!strcmp(type, "Strip")) {
        x.kind = D_STRIP;
        x.a = dup_str(json_object_get(d, "content"));
        x.start = (int)json_integer_value(json_object_get(d, "start"));
        x.stop = (int)json_integer_value(json_object_get(d, "stop"));
        if (!x.a || utf8proc_iterate((const utf8proc_uint8_t *)x.a, -1, &(utf8proc_int32_t){0}) != (int)strlen(x.a))
            return free(x.a), dcp_fail("%s: Strip decoder needs one character of content", t->path);
    } else if (!strcmp(type, "Metaspace")) {
        x.kind = D_METASPACE;
        x.a = dup_str(json_object_get(d, "replacement"));
        const char *scheme = json_string_value(json_object_get(d, "prepend_scheme"));
        x.prepend = !scheme || strcmp(scheme, "never");
        if (!x.a) return dcp_fail("%s: Metaspace decoder without a replacement", t->path);
    } else return dcp_fail("%s: decoder %s is not supported", t->path, type);
    t->dec = xrealloc(t->dec, sizeof(Dec) * (size_t)(t->n_dec + 1));
    t->dec[t->n_dec++] = x;
    return 0;
}

static int load_model(HfTokenizer *t, json_t *m)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!type || strcmp(type, "BPE")) return dcp_fail("%s: model %s is not supported (BPE only)", t->path, type ? type : "?");
    const char *cont = json_string_value(json_object_get(m, "continuing_subword_prefix"));
    const char *eow = json_string_value(json_object_get(m, "end_of_word_suffix"));
    if ((cont && *cont) || (eow && *eow))
        return dcp_fail("%s: BPE with a continuing_subword_prefix or end_of_word_suffix is not supported", t->path);
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) > 0)
        return dcp_fail("%s: BPE dropout is not supported", t->path);
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return dcp_fail("%s: BPE model without a vocab", t->path);
    const char *key;
    json_t *v;
    int max_id = -1;
    json_object_foreach(vocab, key, v)
    {
        /* ids index a table: bounded as the model's vocabulary is */
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= 1 << 24)
            return dcp_fail("%s: vocab entry '%s' has no id from 0 to 2^24", t->path, key);
        if (json_integer_value(v) > max_id) max_id = (int)json_integer_value(v);
    }
    t->n_vocab = max_id + 1;
    t->token = xcalloc((size_t)t->n_vocab + 1, sizeof(char *));
    json_object_foreach(vocab, key, v)
    {
        json_int_t id = json_integer_value(v);
        if (t->token[id]) return dcp_fail("%s: vocab id %lld is given to '%s' and '%s'", t->path, (long long)id, t->token[id], key);
        t->token[id] = xstrdup(key);
        map_put(&t->vocab, t->token[id], strlen(key), (int)id);
    }
    t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    t->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
    const char *unk = json_string_value(json_object_get(m, "unk_token"));
    t->unk = unk ? map_get(&t->vocab, unk, strlen(unk)) : -1;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = map_get(&t->vocab, name, 6);
    }
    json_t *merges = json_object_get(m, "merges");
    size_t n = json_array_size(merges), i;
    t->merged_id = xmalloc(sizeof(int) * (n + 1));
    json_t *e;
    json_array_foreach(merges, i, e)
    {
        const char *a, *b;
        char *owned = NULL;
        if (json_is_string(e)) {
            owned = xstrdup(json_string_value(e));
            char *sp = strchr(owned, ' ');
            if (!sp) return free(owned), dcp_fail("%s: merge %zu '%s' is not two tokens", t->path, i, json_string_value(e));
            *sp = '\0';
            a = owned, b = sp + 1;
        } else {
            a = json_string_value(json_array_get(e, 0)), b = json_string_value(json_array_get(e, 1));
            if (!a || !b) return dcp_fail("%s: merge %zu is not a pair of strings", t->path, i);
        }
        int ia = map_get(&t->vocab, a, strlen(a)), ib = map_get(&t->vocab, b, strlen(b));
        Buf ab = {0};
        buf_add(&ab, a, strlen(a));
        buf_add(&ab, b, strlen(b));
        int iab = map_get(&t->vocab, ab.s, ab.n);
        free(ab.s);
        free(owned);
        if (ia < 0 || ib < 0 || iab < 0) return dcp_fail("%s: merge %zu has a token outside the vocab", t->path, i);
        /* the pair's key lives in the merged_id table's twin below */
        t->merged_id[t->n_merges] = iab;
        int32_t *key = xmalloc(8);
        key[0] = ia, key[1] = ib;
        int seen = map_get(&t->merges, (const char *)key, 8) >= 0;
        map_put(&t->merges, (const char *)key, 8, t->n_merges++); /* a later duplicate overrides the earlier one */
        if (seen) free(key); /* the map keeps the earlier key */
    }
    return 0;
}

/* A tiktoken ranks file (a token's bytes in base64, a space, its rank, per
 * line) as a BPE model: each token's bytes as ByteLevel writes them in
 * the vocabulary at its rank, and every split of a token into two tokens
 * a merge of the token's rank. tiktoken merges the adjacent pair whose
 * concatenation has the lowest rank, the leftmost among equals: these
 * merges, ranked by their result, and bpe()'s leftmost tie give the same
 * ids. The whole piece is looked up first (ignore_merges), as tiktoken. */
static int base64_value(int c)
{
    return c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '+' ? 62 : c == '/' ? 63 : -1;
}
static int load_ranks(HfTokenizer *t, const char *text, size_t len)
{
    Buf *tok = NULL; /* per rank: the token's ByteLevel string */
    int n = 0, cap = 0, line = 0, rc = 0;
    for (size_t at = 0; at < len && !rc; line++) {
        size_t end = at;
        while (end < len && text[end] != '\n') end++;
        size_t sp = at;
        while (sp < end && text[sp] != ' ') sp++;
        char *stop;
        long rank = sp < end ? strtol(text + sp + 1, &stop, 10) : -1;
        if (sp == end || sp == at || rank < 0 || rank >= 1 << 24 || (stop != text + end && *stop != '\r')) {
            if (end > at && !(end == at + 1 && text[at] == '\r'))
                rc = dcp_fail("%s:%d: not a tiktoken rank line (base64 token, a space, its rank)", t->path, line + 1);
            at = end + 1;
            continue;
        }
        if (rank >= cap) { /* geometric: ranks arrive one by one */
            int grown = (int)rank + 1 > 2 * cap ? (int)rank + 1 : 2 * cap;
            tok = xrealloc(tok, sizeof(Buf) * (size_t)grown);
            memset(tok + cap, 0, sizeof(Buf) * (size_t)(grown - cap));
            cap = grown;
        }
        if (rank >= n) n = (int)rank + 1;
        if (tok[rank].s) rc = dcp_fail("%s:%d: rank %ld appears twice", t->path, line + 1, rank);
        uint32_t acc = 0;
        int bits = 0;
        for (size_t i = at; i < sp && !rc; i++) {
            if (text[i] == '=') break;
            int v = base64_value((unsigned char)text[i]);
            if (v < 0) {
                rc = dcp_fail("%s:%d: '%c' is not base64", t->path, line + 1, text[i]);
                break;
            }
            acc = acc << 6 | (uint32_t)v, bits += 6;
            if (bits >= 8) bits -= 8, add_cp(&tok[rank], byte_to_cp[(acc >> bits) & 0xff]);
        }
        if (!rc && !tok[rank].s) rc = dcp_fail("%s:%d: an empty token", t->path, line + 1);
        at = end + 1;
    }
    if (!rc && !n) rc = dcp_fail("%s: no ranks", t->path);
    t->n_vocab = n;
    t->token = xcalloc((size_t)n + 1, sizeof(char *));
    for (int r = 0; r < n && !rc; r++) {
        if (!tok[r].s) continue;
        if (map_get(&t->vocab, tok[r].s, tok[r].n) >= 0) rc = dcp_fail("%s: rank %d repeats a token", t->path, r);
        t->token[r] = tok[r].s, tok[r].s = NULL;
        map_put(&t->vocab, t->token[r], strlen(t->token[r]), r);
    }
    t->merged_id = xmalloc(sizeof(int) * ((size_t)n + 1));
    t->n_merges = n;
    size_t splits = 0, k = 0;
    for (int r = 0; r < n; r++) splits += t->token[r] ? strlen(t->token[r]) : 0;
    t->merge_keys = xmalloc(sizeof(int32_t) * 2 * (splits + 1));
    for (int r = 0; r < n && !rc; r++) {
        t->merged_id[r] = r;
        const char *s = t->token[r];
        if (!s) continue;
        size_t sl = strlen(s);
        for (size_t i = 1; i < sl; i++) { /* at each character after the first: one byte each */
            if (((unsigned char)s[i] & 0xC0) == 0x80) continue;
            int a = map_get(&t->vocab, s, i), b = map_get(&t->vocab, s + i, sl - i);
            if (a < 0 || b < 0) continue;
            int32_t *key = t->merge_keys + 2 * k++;
            key[0] = a, key[1] = b;
            map_put(&t->merges, (const char *)key, 8, r);
        }
    }
    for (int r = 0; r < n; r++) free(tok[r].s);
    free(tok);
    t->ignore_merges = 1;
    t->unk = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    return rc;
}

static int special_list(HfTokenizer *t, json_t *items, int **out, int *n)
{
    size_t i;
    json_t *e;
    json_array_foreach(items, i, e)
    {
        json_t *sp = json_object_get(e, "SpecialToken");
        if (!sp) continue;
        const char *id = json_string_value(json_object_get(sp, "id"));
        int tok = id ? map_get(&t->vocab, id, strlen(id)) : -1;
        if (tok < 0) return dcp_fail("%s: TemplateProcessing names the unknown token %s", t->path, id ? id : "?");
        *out = xrealloc(*out, sizeof(int) * (size_t)(*n + 1));
        (*out)[(*n)++] = tok;
    }
    return 0;
}

static int load_post(HfTokenizer *t, json_t *p)
{
    if (!p || json_is_null(p)) return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (type && !strcmp(type, "TemplateProcessing")) {
        /* the special tokens of "single" before and after its sequence */
        json_t *single = json_object_get(p, "single");
        size_t i, seq = json_array_size(single);
        json_t *e;
        json_array_foreach(single, i, e) if (json_object_get(e, "Sequence")) seq = i;
        json_t *before = json_array(), *after = json_array();
        json_array_foreach(single, i, e) json_array_append(i < seq ? before : after, e);
        int rc = special_list(t, before, &t->bos, &t->n_bos) || special_list(t, after, &t->eos, &t->n_eos);
        json_decref(before);
        json_decref(after);
        return rc;
    }
    return dcp_fail("%s: post-processor %s is not supported", t->path, type ? type : "?");
}

HfTokenizer *hftok_load(const char *path)
{
    char *text;
    size_t len;
    if (check_regular_file(path, "tokenizer") || read_file(path, &text, &len)) return NULL;
    HfTokenizer *t = hftok_parse(path, text, len);
    free(text);
    return t;
}

static void normalize(const HfTokenizer *t, Buf *b);

/* tokenizer.json's text, or (ranks) the pipeline around a tiktoken ranks
 * file's model */
static HfTokenizer *build(const char *path, const char *text, size_t len, const char *ranks, size_t ranks_len)
{
    bytelevel_table();
    HfTokenizer *t = xcalloc(1, sizeof *t);
    t->path = xstrdup(path);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    int rc = root ? (json_is_object(root) ? 0 : dcp_fail("%s: not a JSON object", path))
                  : dcp_fail("%s:%d: %s", path, jerr.line, jerr.text);
    rc = rc || (ranks ? load_ranks(t, ranks, ranks_len) : load_model(t, json_object_get(root, "model"))) ||
         load_normalizer(t, json_object_get(root, "normalizer")) ||
         load_pre(t, json_object_get(root, "pre_tokenizer")) || load_decoder(t, json_object_get(root, "decoder"));
    if (!rc) {
        size_t i;
        json_t *e, *added = json_object_get(root, "added_tokens");
        /* room for every added token at once (a tiktoken folder adds
         * thousands of reserved ids past the ranks) */
        t->added = xmalloc(sizeof(Added) * (json_array_size(added) + 1));
        json_int_t top = -1;
        json_array_foreach(added, i, e)
        {
            json_int_t id = json_integer_value(json_object_get(e, "id"));
            if (id > top && id < 1 << 24) top = id;
        }
        if (top >= t->n_vocab) {
            t->token = xrealloc(t->token, sizeof(char *) * (size_t)(top + 2));
            memset(t->token + t->n_vocab, 0, sizeof(char *) * (size_t)(top + 2 - t->n_vocab));
        }
        json_array_foreach(added, i, e)
        {
            const char *c = json_string_value(json_object_get(e, "content"));
            json_int_t id = json_integer_value(json_object_get(e, "id"));
            if (!c || !json_is_integer(json_object_get(e, "id")) || id < 0 || id >= 1 << 24) {
                rc = dcp_fail("%s: added token %zu lacks content or an id from 0 to 2^24", path, i);
                break;
            }
            /* as tokenizers: a content already in the vocabulary keeps its id there */
            int in_vocab = map_get(&t->vocab, c, strlen(c));
            if (in_vocab >= 0) id = in_vocab;
            else if (id < t->n_vocab && t->token[id] && strcmp(t->token[id], c)) {
                /* an id the vocabulary gives to another piece: its text and
                 * the id's would disagree */
                rc = dcp_fail("%s: added token \"%s\" has id %lld, which the vocabulary gives to \"%s\"", path, c,
                              (long long)id, t->token[id]);
                break;
            }
            if (id >= t->n_vocab) t->n_vocab = (int)id + 1;
            if (!t->token[id]) t->token[id] = xstrdup(c);
            t->added[t->n_added++] = (Added){xstrdup(c), (int)id, json_is_true(json_object_get(e, "special")),
                                             json_is_true(json_object_get(e, "lstrip")),
                                             json_is_true(json_object_get(e, "rstrip")),
                                             json_is_true(json_object_get(e, "single_word")), strlen(c), 0, NULL, 0};
            Added *a = &t->added[t->n_added - 1];
            /* tokenizers' default: special tokens are matched as written, others normalized */
            json_t *nz = json_object_get(e, "normalized");
            a->normalized = nz ? json_is_true(nz) : !a->special;
            Buf b = {0};
            buf_add(&b, c, a->len);
            if (a->normalized) normalize(t, &b);
            a->norm = b.s;
            a->norm_len = b.n;
            if (a->norm_len) t->added_first[a->normalized][(unsigned char)a->norm[0]] = 1;
        }
    }
    if (!rc) {
        t->is_special = xcalloc((size_t)t->n_vocab + 1, 1);
        for (int i = 0; i < t->n_added; i++) t->is_special[t->added[i].id] = (char)t->added[i].special;
        rc = load_post(t, json_object_get(root, "post_processor"));
    }
    json_decref(root);
    if (rc) {
        hftok_free(t);
        return NULL;
    }
    return t;
}

HfTokenizer *hftok_parse(const char *path, const char *text, size_t len) { return build(path, text, len, NULL, 0); }

HfTokenizer *hftok_from_ranks(const char *path, const char *ranks, size_t ranks_len, const char *pipeline)
{
    return build(path, pipeline, strlen(pipeline), ranks, ranks_len);
}

void hftok_free(HfTokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_vocab; i++) free(t->token[i]);
    free(t->token);
    free(t->vocab.slot);
    if (t->merge_keys) free(t->merge_keys);
    else
        for (size_t i = 0; i < t->merges.cap; i++) free((void *)t->merges.slot[i].key);
    free(t->merges.slot);
    free(t->merged_id);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++) {
        if (t->pre[i].re) pcre2_code_free(t->pre[i].re);
        free(t->pre[i].replacement);
    }
    free(t->pre);
    for (int i = 0; i < t->n_dec; i++) free(t->dec[i].a), free(t->dec[i].b);
    free(t->dec);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    free(t->is_special);
    free(t->bos);
    free(t->eos);
    free(t->path);
    free(t);
}

int hftok_vocab_size(const HfTokenizer *t) { return t->n_vocab; }

/* ---- encoding ------------------------------------------------------------ */

typedef struct {
    Buf *s;
    int n, cap;
} Pieces;

static void piece_add(Pieces *p, const char *s, size_t n)
{
    if (p->n == p->cap) p->s = xrealloc(p->s, sizeof(Buf) * (size_t)(p->cap = p->cap ? 2 * p->cap : 16));
    p->s[p->n] = (Buf){0};
    buf_add(&p->s[p->n++], s, n);
}

static void pieces_free(Pieces *p)
{
    for (int i = 0; i < p->n; i++) free(p->s[i].s);
    free(p->s);
    *p = (Pieces){0};
}

static void normalize(const HfTokenizer *t, Buf *b)
{
    for (int k = 0; k < t->n_norm; k++) {
        const Norm *x = &t->norm[k];
        if (x->kind <= N_NFKD) {
            static const utf8proc_option_t opts[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE,
                                                     UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                                                     UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
            utf8proc_uint8_t *out = NULL;
            utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)b->s, (utf8proc_ssize_t)b->n, &out,
                                              opts[x->kind] | UTF8PROC_STABLE);
            if (n >= 0) {
                b->n = 0;
                buf_add(b, out, (size_t)n);
            }
            free(out);
        } else if (x->kind == N_PREPEND) {
            if (!b->n) continue;
            Buf o = {0};
            buf_add(&o, x->a, strlen(x->a));
            buf_add(&o, b->s, b->n);
            free(b->s);
            *b = o;
        } else {
            size_t pl = strlen(x->a), cl = strlen(x->b);
            Buf o = {0};
            buf_add(&o, "", 0);
            for (size_t i = 0; i < b->n;) {
                if (pl && i + pl <= b->n && !memcmp(b->s + i, x->a, pl)) {
                    buf_add(&o, x->b, cl);
                    i += pl;
                } else {
                    buf_add(&o, b->s + i, 1);
                    i++;
                }
            }
            free(b->s);
            *b = o;
        }
    }
}

/* Splits by the regex: matches and the text between them are pieces
 * (Isolated), or only the text between them (Removed). The subject's UTF-8
 * is checked by the first match only: pcre2_match checks all of it on
 * every call unless told not to, which made a split quadratic in the
 * text's length. */
static void split_regex(const pcre2_code *re, int removed, const Buf *in, Pieces *out)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t at = 0, last = 0;
    uint32_t checked = 0;
    while (at <= in->n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)in->s, in->n, at, checked, md, NULL);
        checked = PCRE2_NO_UTF_CHECK;
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e == s) { /* an empty match: step over one character */
            at = s + 1;
            while (at < in->n && ((unsigned char)in->s[at] & 0xC0) == 0x80) at++;
            if (s >= in->n) break;
            continue;
        }
        if (s > last) piece_add(out, in->s + last, s - last);
        if (!removed) piece_add(out, in->s + s, e - s);
        last = at = e;
    }
    if (last < in->n) piece_add(out, in->s + last, in->n - last);
    pcre2_match_data_free(md);
}

static void pretokenize(const HfTokenizer *t, Buf *text, int first_segment, Pieces *out)
{
    Pieces cur = {0};
    piece_add(&cur, text->s, text->n);
    for (int k = 0; k < t->n_pre; k++) {
        const Pre *x = &t->pre[k];
        Pieces next = {0};
        for (int i = 0; i < cur.n; i++) {
            Buf *p = &cur.s[i];
            if (x->kind == P_SPLIT) {
                split_regex(x->re, x->removed, p, &next);
            } else if (x->kind == P_BYTELEVEL) {
                Buf src = {0};
                if (x->add_prefix_space && i == 0 && first_segment && p->n && p->s[0] != ' ') buf_add(&src, " ", 1);
                buf_add(&src, p->s, p->n);
                Pieces parts = {0};
                if (x->re) split_regex(x->re, 0, &src, &parts);
                else piece_add(&parts, src.s, src.n);
                for (int j = 0; j < parts.n; j++) {
                    Buf mapped = {0};
                    buf_add(&mapped, "", 0);
                    for (size_t b = 0; b < parts.s[j].n; b++) add_cp(&mapped, byte_to_cp[(unsigned char)parts.s[j].s[b]]);
                    piece_add(&next, mapped.s, mapped.n);
                    free(mapped.s);
                }
                pieces_free(&parts);
                free(src.s);
            } else if (x->kind == P_METASPACE) {
                Buf m = {0};
                buf_add(&m, "", 0);
                size_t rl = strlen(x->replacement);
                if ((x->prepend == 2 || (x->prepend == 1 && i == 0 && first_segment)) &&
                    !(p->n >= rl && !memcmp(p->s, x->replacement, rl)) && p->n)
                    buf_add(&m, x->replacement, rl);
                for (size_t b = 0; b < p->n; b++)
                    if (p->s[b] == ' ') buf_add(&m, x->replacement, rl);
                    else buf_add(&m, p->s + b, 1);
                if (!x->split) {
                    piece_add(&next, m.s, m.n);
                } else { /* each replacement starts a piece */
                    size_t last = 0;
                    for (size_t b = rl; b + rl <= m.n; b++)
                        if (!memcmp(m.s + b, x->replacement, rl)) {
                            piece_add(&next, m.s + last, b - last);
                            last = b;
                        }
                    if (last < m.n) piece_add(&next, m.s + last, m.n - last);
                }
                free(m.s);
            } else { /* digits: runs of digits (or each digit) apart */
                size_t last = 0;
                for (size_t b = 0; b < p->n; b++) {
                    int dig = p->s[b] >= '0' && p->s[b] <= '9';
                    int prev = b > 0 && p->s[b - 1] >= '0' && p->s[b - 1] <= '9';
                    if (b > last && (dig != prev || (dig && x->individual))) {
                        piece_add(&next, p->s + last, b - last);
                        last = b;
                    }
                }
                if (last < p->n) piece_add(&next, p->s + last, p->n - last);
            }
        }
        pieces_free(&cur);
        cur = next;
    }
    for (int i = 0; i < cur.n; i++)
        if (cur.s[i].n) piece_add(out, cur.s[i].s, cur.s[i].n);
    pieces_free(&cur);
}

typedef struct {
    int rank, left, right;
    int lid, rid; /* the tokens the merge was made for */
} Cand;

static int cand_before(const Cand *a, const Cand *b) { return a->rank < b->rank || (a->rank == b->rank && a->left < b->left); }

/* BPE on one piece: its characters (or their bytes, or unk), then merges
 * by rank, lowest first, leftmost among equals. */
static int bpe(const HfTokenizer *t, const char *s, size_t n, int **ids, int *n_ids, int *cap)
{
#define EMIT(id) ((*n_ids == *cap ? (*ids = xrealloc(*ids, sizeof(int) * (size_t)(*cap = 2 * *cap + 16))) : 0), \
                  (*ids)[(*n_ids)++] = (id))
    int whole = map_get(&t->vocab, s, n);
    if (t->ignore_merges && whole >= 0) {
        EMIT(whole);
        return 0;
    }
    int *sym = xmalloc(sizeof(int) * (n + 1)), m = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (len <= 0) len = 1;
        int id = map_get(&t->vocab, s + i, (size_t)len);
        if (id >= 0) {
            sym[m++] = id;
        } else {
            int all = t->byte_fallback;
            for (utf8proc_ssize_t b = 0; b < len && all; b++) all = t->byte_id[(unsigned char)s[i + b]] >= 0;
            if (all) {
                for (utf8proc_ssize_t b = 0; b < len; b++) sym[m++] = t->byte_id[(unsigned char)s[i + b]];
            } else if (t->unk >= 0) {
                if (!(t->fuse_unk && m > 0 && sym[m - 1] == t->unk)) sym[m++] = t->unk;
            } else {
                free(sym);
                return dcp_fail("%s: the text has a character outside the vocabulary and no unk_token", t->path);
            }
        }
        i += (size_t)len;
    }
    int *next = xmalloc(sizeof(int) * (size_t)(m + 1)), *prev = xmalloc(sizeof(int) * (size_t)(m + 1));
    for (int i = 0; i < m; i++) next[i] = i + 1 < m ? i + 1 : -1, prev[i] = i - 1;
    Cand *heap = NULL;
    int hn = 0, hcap = 0;
#define PUSH(l)                                                                                                    \
    do {                                                                                                           \
        int l_ = (l), r_ = l_ >= 0 ? next[l_] : -1;                                                                \
        if (r_ < 0) break;                                                                                         \
        int32_t key_[2] = {sym[l_], sym[r_]};                                                                      \
        int rank_ = map_get(&t->merges, (const char *)key_, 8);                                                    \
        if (rank_ < 0) break;                                                                                      \
        if (hn == hcap) heap = xrealloc(heap, sizeof(Cand) * (size_t)(hcap = 2 * hcap + 16));                      \
        Cand c_ = {rank_, l_, r_, sym[l_], sym[r_]};                                                               \
        int i_ = hn++;                                                                                             \
        while (i_ > 0 && cand_before(&c_, &heap[(i_ - 1) / 2])) heap[i_] = heap[(i_ - 1) / 2], i_ = (i_ - 1) / 2; \
        heap[i_] = c_;                                                                                             \
    } while (0)
    for (int i = 0; i + 1 < m; i++) PUSH(i);
    while (hn) {
        Cand top = heap[0], last = heap[--hn];
        int i = 0;
        for (;;) {
            int c = 2 * i + 1;
            if (c >= hn) break;
            if (c + 1 < hn && cand_before(&heap[c + 1], &heap[c])) c++;
            if (!cand_before(&heap[c], &last)) break;
            heap[i] = heap[c];
            i = c;
        }
        if (hn) heap[i] = last;
        if (next[top.left] != top.right || sym[top.left] != top.lid || sym[top.right] != top.rid) continue;
        sym[top.left] = t->merged_id[top.rank];
        next[top.left] = next[top.right];
        if (next[top.right] >= 0) prev[next[top.right]] = top.left;
        next[top.right] = -2;
        sym[top.right] = -1;
        PUSH(prev[top.left]);
        PUSH(top.left);
    }
#undef PUSH
    for (int i = 0; i >= 0 && m > 0; i = next[i]) EMIT(sym[i]);
#undef EMIT
    free(heap);
    free(next);
    free(prev);
    free(sym);
    return 0;
}

/* The added token matching at text[i], longest first, among those matched
 * in the raw text (normalized 0) or in the normalized text (1, as their
 * normalized form); its end (with the whitespace rstrip absorbs) in *end. */
static const Added *match_added(const HfTokenizer *t, int normalized, const char *text, size_t len, size_t i,
                                size_t *end)
{
    const Added *best = NULL;
    size_t best_len = 0;
    if (!t->added_first[normalized][(unsigned char)text[i]]) return NULL;
    for (int k = 0; k < t->n_added; k++) {
        const Added *a = &t->added[k];
        size_t l = a->norm_len;
        if (a->normalized != normalized || !l || l <= best_len || i + l > len || memcmp(text + i, a->norm, l)) continue;
        if (a->single_word) {
            int before = i > 0 && ((unsigned char)text[i - 1] > 127 || isalnum((unsigned char)text[i - 1]));
            int after = i + l < len && ((unsigned char)text[i + l] > 127 || isalnum((unsigned char)text[i + l]));
            if (before || after) continue;
        }
        best = a, best_len = l;
    }
    if (!best) return NULL;
    size_t e = i + best_len;
    if (best->rstrip)
        while (e < len && (text[e] == ' ' || text[e] == '\t' || text[e] == '\n' || text[e] == '\r')) e++;
    *end = e;
    return best;
}

static int is_space_byte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Splits text at the added tokens of one kind (raw or normalized): the
 * text between them goes on (raw: normalized, then split again at the
 * normalized tokens; normalized: pre-tokenized and through the model), an
 * added token becomes its id. *first: the next piece begins the text (for
 * Metaspace's prepend_scheme "first"). */
static int encode_split(const HfTokenizer *t, int normalized, const char *text, size_t len, int *first, int **ids,
                        int *n, int *cap)
{
    int rc = 0;
    size_t seg = 0;
    for (size_t i = 0; i <= len && !rc; i++) {
        size_t end = 0;
        const Added *a = i < len ? match_added(t, normalized, text, len, i, &end) : NULL;
        if (!a && i < len) continue;
        size_t seg_end = i;
        if (a && a->lstrip)
            while (seg_end > seg && is_space_byte(text[seg_end - 1])) seg_end--;
        if (seg_end > seg) {
            Buf b = {0};
            buf_add(&b, text + seg, seg_end - seg);
            if (!normalized) {
                normalize(t, &b);
                rc = encode_split(t, 1, b.s, b.n, first, ids, n, cap);
            } else {
                Pieces p = {0};
                pretokenize(t, &b, *first, &p);
                for (int k = 0; k < p.n && !rc; k++) rc = bpe(t, p.s[k].s, p.s[k].n, ids, n, cap);
                pieces_free(&p);
                *first = 0;
            }
            free(b.s);
        }
        if (a) {
            if (*n == *cap) *ids = xrealloc(*ids, sizeof(int) * (size_t)(*cap = 2 * *cap + 16));
            (*ids)[(*n)++] = a->id;
            seg = end;
            i = end - 1;
            *first = 0;
        }
    }
    return rc;
}

int hftok_encode(const HfTokenizer *t, const char *text, size_t len, int add_special, int **ids_out, int *n_out)
{
    int *ids = NULL, n = 0, cap = 0, rc = 0;
    if (add_special)
        for (int k = 0; k < t->n_bos; k++) {
            if (n == cap) ids = xrealloc(ids, sizeof(int) * (size_t)(cap = 2 * cap + 16));
            ids[n++] = t->bos[k];
        }
    /* added tokens first, those matched as written, then in each normalized
     * piece between them those matched normalized (as tokenizers does) */
    int first = 1;
    rc = encode_split(t, 0, text, len, &first, &ids, &n, &cap);
    if (add_special && !rc)
        for (int k = 0; k < t->n_eos; k++) {
            if (n == cap) ids = xrealloc(ids, sizeof(int) * (size_t)(cap = 2 * cap + 16));
            ids[n++] = t->eos[k];
        }
    if (rc) {
        free(ids);
        return -1;
    }
    *ids_out = ids ? ids : xmalloc(sizeof(int));
    *n_out = n;
    return 0;
}

/* ---- decoding ------------------------------------------------------------ */

/* Appends bytes with each maximal invalid UTF-8 subpart replaced by one
 * U+FFFD, as Rust's String::from_utf8_lossy does: a truncated multi-byte
 * sequence is one replacement, a stray byte another. */
static void add_lossy(Buf *o, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate(u + i, (utf8proc_ssize_t)(n - i), &cp);
        if (len > 0) {
            buf_add(o, s + i, (size_t)len);
            i += (size_t)len;
            continue;
        }
        /* how far the bytes are a valid beginning of a character */
        unsigned char b = u[i];
        int need = b >= 0xC2 && b <= 0xDF ? 1 : b >= 0xE0 && b <= 0xEF ? 2 : b >= 0xF0 && b <= 0xF4 ? 3 : 0;
        unsigned char lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80, hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
        size_t j = i + 1;
        for (int k = 0; k < need && j < n; k++, j++) {
            unsigned char c = u[j];
            if (k == 0 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
        }
        buf_add(o, "\xEF\xBF\xBD", 3);
        i = j;
    }
}

int hftok_token_id(const HfTokenizer *t, const char *s)
{
    for (int i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, s)) return t->added[i].id;
    return map_get(&t->vocab, s, strlen(s));
}

void hftok_set_template(HfTokenizer *t, int add_bos, int bos, int add_eos, int eos)
{
    int flag[2] = {add_bos, add_eos}, id[2] = {bos, eos};
    int **list[2] = {&t->bos, &t->eos}, *n[2] = {&t->n_bos, &t->n_eos};
    for (int k = 0; k < 2; k++) {
        if (flag[k] < 0 || (flag[k] && id[k] < 0)) continue;
        free(*list[k]);
        *list[k] = xmalloc(sizeof(int));
        **list[k] = id[k];
        *n[k] = flag[k];
    }
}

char *hftok_utf8_lossy(const char *s, size_t n, size_t *out_n)
{
    Buf o = {0};
    buf_add(&o, "", 0);
    add_lossy(&o, s, n);
    *out_n = o.n;
    return o.s;
}

char *hftok_decode(const HfTokenizer *t, const int *ids, int n, int skip_special)
{
    /* the decoders work on the list of token strings */
    Pieces toks = {0};
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab || !t->token[ids[i]]) continue;
        if (skip_special && t->is_special[ids[i]]) continue;
        piece_add(&toks, t->token[ids[i]], strlen(t->token[ids[i]]));
    }
    for (int k = 0; k < t->n_dec; k++) {
        const Dec *d = &t->dec[k];
        Pieces next = {0};
        if (d->kind == D_BYTELEVEL) { /* characters back to bytes, then lossy UTF-8 */
            Buf raw = {0};
            buf_add(&raw, "", 0);
            for (int i = 0; i < toks.n; i++)
                for (size_t j = 0; j < toks.s[i].n;) {
                    utf8proc_int32_t cp;
                    utf8proc_ssize_t len = utf8proc_iterate((const utf8proc_uint8_t *)toks.s[i].s + j,
                                                            (utf8proc_ssize_t)(toks.s[i].n - j), &cp);
                    if (len <= 0) len = 1, cp = -1;
                    if (cp >= 0 && cp < 512 && cp_to_byte[cp] >= 0) {
                        char c = (char)cp_to_byte[cp];
                        buf_add(&raw, &c, 1);
                    } else {
                        buf_add(&raw, toks.s[i].s + j, (size_t)len);
                    }
                    j += (size_t)len;
                }
            Buf o = {0};
            buf_add(&o, "", 0);
            add_lossy(&o, raw.s, raw.n);
            piece_add(&next, o.s, o.n);
            free(raw.s);
            free(o.s);
        } else if (d->kind == D_BYTEFALLBACK) { /* runs of <0xXX> tokens to bytes */
            for (int i = 0; i < toks.n;) {
                unsigned int byte;
                char tail;
                Buf raw = {0};
                int j = i;
                while (j < toks.n && toks.s[j].n == 6 && sscanf(toks.s[j].s, "<0x%2X%c", &byte, &tail) == 2 &&
                       tail == '>') {
                    char c = (char)byte;
                    buf_add(&raw, &c, 1);
                    j++;
                }
                if (j == i) {
                    piece_add(&next, toks.s[i].s, toks.s[i].n);
                    i++;
                    continue;
                }
                /* invalid UTF-8: one U+FFFD per byte, as tokenizers does */
                Buf o = {0};
                buf_add(&o, "", 0);
                int valid = 1;
                for (size_t b = 0; b < raw.n && valid;) {
                    utf8proc_int32_t cp;
                    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)raw.s + b,
                                                          (utf8proc_ssize_t)(raw.n - b), &cp);
                    if (l <= 0) valid = 0;
                    else b += (size_t)l;
                }
                if (valid) buf_add(&o, raw.s, raw.n);
                else
                    for (size_t b = 0; b < raw.n; b++) buf_add(&o, "\xEF\xBF\xBD", 3);
                piece_add(&next, o.s, o.n);
                free(o.s);
                free(raw.s);
                i = j;
            }
        } else if (d->kind == D_FUSE) {
            Buf o = {0};
            buf_add(&o, "", 0);
            for (int i = 0; i < toks.n; i++) buf_add(&o, toks.s[i].s, toks.s[i].n);
            piece_add(&next, o.s, o.n);
            free(o.s);
        } else {
            for (int i = 0; i < toks.n; i++) {
                Buf o = {0};
                buf_add(&o, "", 0);
                const Buf *p = &toks.s[i];
                if (d->kind == D_REPLACE || d->kind == D_METASPACE) {
                    const char *pat = d->a, *rep = d->kind == D_REPLACE ? d->b : " ";
                    size_t pl = strlen(pat);
                    for (size_t b = 0; b < p->n;) {
                        if (pl && b + pl <= p->n && !memcmp(p->s + b, pat, pl)) {
                            buf_add(&o, rep, strlen(rep));
                            b += pl;
                        } else {
                            buf_add(&o, p->s + b, 1);
                            b++;
                        }
                    }
                    if (d->kind == D_METASPACE && i == 0 && d->prepend && o.n && o.s[0] == ' ')
                        memmove(o.s, o.s + 1, o.n--);
                } else { /* strip: up to start leading and stop trailing copies of the character */
                    size_t cl = strlen(d->a), b = 0, e = p->n;
                    for (int k2 = 0; k2 < d->start && b + cl <= e && !memcmp(p->s + b, d->a, cl); k2++) b += cl;
                    for (int k2 = 0; k2 < d->stop && e >= b + cl && !memcmp(p->s + e - cl, d->a, cl); k2++) e -= cl;
                    buf_add(&o, p->s + b, e - b);
                }
                piece_add(&next, o.s, o.n);
                free(o.s);
            }
        }
        pieces_free(&toks);
        toks = next;
    }
    Buf out = {0};
    buf_add(&out, "", 0);
    for (int i = 0; i < toks.n; i++) buf_add(&out, toks.s[i].s, toks.s[i].n);
    pieces_free(&toks);
    return out.s;
}
