#include "tiktoken.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

const char tiktoken_kimi_pattern[] =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

/* the end of the class that opens at p[0] == '[' (just past its ']'),
 * nested classes and escapes included; NULL if it does not close */
static const char *class_end(const char *p)
{
    int depth = 0;
    for (const char *q = p; *q; q++) {
        if (*q == '\\') {
            if (!*++q) return NULL;
        } else if (*q == '[') {
            depth++;
            if (q[1] == '^') q++;
            if (q[1] == ']') q++; /* a ']' first in a class is literal */
        } else if (*q == ']' && --depth == 0) {
            return q + 1;
        }
    }
    return NULL;
}

char *tiktoken_pcre2_pattern(const char *pattern)
{
    size_t n = strlen(pattern), cap = 2 * n + 64, o = 0;
    char *out = xmalloc(cap);
    for (const char *p = pattern; *p;) {
        if (*p == '\\' && p[1]) {
            memcpy(out + o, p, 2), o += 2, p += 2;
            continue;
        }
        if (*p != '[') {
            out[o++] = *p++;
            continue;
        }
        const char *end = class_end(p);
        if (!end) {
            free(out);
            dcp_fail("split pattern: a character class at offset %zu does not close", (size_t)(p - pattern));
            return NULL;
        }
        /* [X&&[^Y]]: X up to the "&&", Y inside the nested negated class */
        const char *amp = NULL;
        for (const char *q = p + 1; q < end - 1; q++) {
            if (*q == '\\') q++;
            else if (q[0] == '&' && q[1] == '&') {
                amp = q;
                break;
            }
        }
        size_t len = (size_t)(end - p);
        if (o + 2 * len + 16 > cap) out = xrealloc(out, cap = 2 * (o + 2 * len + 16));
        if (!amp) {
            memcpy(out + o, p, len), o += len;
        } else {
            const char *inner = amp + 2, *inner_end = inner[0] == '[' ? class_end(inner) : NULL;
            if (inner[1] != '^' || inner_end != end - 1) {
                free(out);
                dcp_fail("split pattern: the class intersection at offset %zu is not [X&&[^Y]], the form dcpinfer "
                         "rewrites for PCRE2",
                         (size_t)(p - pattern));
                return NULL;
            }
            o += (size_t)sprintf(out + o, "(?:(?![%.*s])[%.*s])", (int)(inner_end - 1 - (inner + 2)), inner + 2,
                                 (int)(amp - (p + 1)), p + 1);
        }
        p = end;
    }
    out[o] = '\0';
    return out;
}

/* tiktoken_load with the ranks file's text (len bytes) already read */
static HfTokenizer *load_ranks_text(const char *path, const char *ranks, size_t len, const char *pattern,
                                    const char *const *special, const int *special_id, int n_special)
{
    char *re = tiktoken_pcre2_pattern(pattern);
    if (!re) return NULL;
    /* the pipeline transformers' TikTokenConverter writes: the pattern's
     * pieces, isolated, as ByteLevel bytes, and ByteLevel decoding */
    json_t *added = json_array();
    for (int i = 0; i < n_special; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", special_id[i], "content",
                                               special[i], "special", 1, "normalized", 0, "lstrip", 0, "rstrip", 0,
                                               "single_word", 0));
    json_t *root = json_pack("{s:o, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}, s:{s:s}}",
                             "added_tokens", added, "pre_tokenizer", "type", "Sequence", "pretokenizers", "type",
                             "Split", "pattern", "Regex", re, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                             "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0, "decoder", "type", "ByteLevel");
    char *pipeline = json_dumps(root, JSON_COMPACT);
    HfTokenizer *t = hftok_from_ranks(path, ranks, len, pipeline);
    free(pipeline);
    json_decref(root);
    free(re);
    return t;
}

HfTokenizer *tiktoken_load(const char *path, const char *pattern, const char *const *special, const int *special_id,
                           int n_special)
{
    char *ranks = NULL;
    size_t len = 0;
    if (check_regular_file(path, "tiktoken ranks") || read_file(path, &ranks, &len)) return NULL;
    HfTokenizer *t = load_ranks_text(path, ranks, len, pattern, special, special_id, n_special);
    free(ranks);
    return t;
}

/* tokenization_kimi.py's num_reserved_special_tokens, if the file is there
 * and assigns it a number; else K2's 256 */
static int reserved_count(const char *path)
{
    static const char key[] = "num_reserved_special_tokens";
    char *py = path_beside(path, "tokenization_kimi.py"), *text = NULL;
    size_t len;
    int n = 256;
    if (path_exists(py) && !read_file(py, &text, &len))
        for (const char *k = strstr(text, key); k; k = strstr(k + 1, key)) {
            const char *v = k + sizeof key - 1;
            while (*v == ' ') v++;
            if (*v != '=' || v[1] == '=') continue; /* not an assignment */
            for (v++; *v == ' ';) v++;
            if (*v >= '0' && *v <= '9') {
                n = atoi(v);
                break;
            }
        }
    free(text);
    free(py);
    return n;
}

HfTokenizer *tiktoken_load_model(const char *path)
{
    char *cfg = path_beside(path, "tokenizer_config.json"), *text = NULL, *ranks = NULL;
    size_t len = 0, ranks_len = 0;
    HfTokenizer *t = NULL;
    json_t *root = NULL;
    if (!path_exists(cfg)) {
        dcp_fail("%s: a tiktoken file needs the tokenizer_config.json beside it (%s), which names its tokenizer class "
                 "and special tokens",
                 path, cfg);
        goto out;
    }
    json_error_t err;
    if (check_regular_file(cfg, "tokenizer config") || read_file(cfg, &text, &len)) goto out;
    root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &err);
    if (!json_is_object(root)) {
        dcp_fail("%s:%d: not a JSON object: %s", cfg, err.line, root ? "" : err.text);
        goto out;
    }
    const char *cls = json_string_value(json_object_get(root, "tokenizer_class"));
    if (!cls || strcmp(cls, "TikTokenTokenizer")) {
        dcp_fail("%s: tokenizer_class \"%s\": dcpinfer reads tiktoken files with Kimi K2's TikTokenTokenizer (its "
                 "split pattern) only",
                 cfg, cls ? cls : "(none)");
        goto out;
    }
    /* the base ranks: one per non-empty line */
    if (check_regular_file(path, "tiktoken ranks") || read_file(path, &ranks, &ranks_len)) goto out;
    int base = 0;
    for (size_t i = 0; i < ranks_len; i++)
        if (ranks[i] != '\n' && ranks[i] != '\r' && (i == 0 || ranks[i - 1] == '\n')) base++;
    /* the reserved ids after the ranks: named in added_tokens_decoder, else
     * <|reserved_token_ID|>; added tokens elsewhere keep their ids */
    json_t *dec = json_object_get(root, "added_tokens_decoder");
    int reserved = reserved_count(path), n = reserved;
    if (reserved < 0 || reserved > 1 << 16) {
        dcp_fail("%s: num_reserved_special_tokens %d (tokenization_kimi.py) is not from 0 to 65536", path, reserved);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(dec, key, v) n++;
    char **special = xcalloc((size_t)n + 1, sizeof(char *));
    int *id = xmalloc(sizeof(int) * ((size_t)n + 1)), k = 0, rc = 0;
    json_object_foreach(dec, key, v)
    {
        const char *c = json_string_value(json_object_get(v, "content"));
        char *end;
        long i = strtol(key, &end, 10);
        if (!c || *end || i < 0 || i >= 1 << 24) {
            rc = dcp_fail("%s: added_tokens_decoder \"%s\" is not an id with a \"content\"", cfg, key);
            break;
        }
        special[k] = xstrdup(c), id[k++] = (int)i;
    }
    for (int r = 0; r < reserved && !rc; r++) {
        char num[16], *name;
        snprintf(num, sizeof num, "%d", base + r);
        if (json_object_get(dec, num)) continue; /* named above */
        name = xmalloc(48);
        snprintf(name, 48, "<|reserved_token_%d|>", base + r);
        special[k] = name, id[k++] = base + r;
    }
    if (!rc) t = load_ranks_text(path, ranks, ranks_len, tiktoken_kimi_pattern, (const char *const *)special, id, k);
    for (int i = 0; i < k; i++) free(special[i]);
    free(special);
    free(id);
out:
    json_decref(root);
    free(ranks);
    free(text);
    free(cfg);
    return t;
}
