/* tokenizer.json against the Hugging Face `tokenizers` package: for the
 * three tokenizers in ../shared/tokenizers (Llama-3 and Qwen3 byte-level
 * BPE with regex splits, a sentencepiece-style 32K BPE with byte fallback),
 * encoding the committed corpus (tests/data/tok, made by
 * tests/ref/make_tok_refs.py) gives exactly the reference ids, with and
 * without the post-processor's special tokens, and decoding the reference
 * ids gives exactly the reference texts, with and without special tokens. */
#include <jansson.h>

#include "hftok.h"
#include "tiktoken.h"
#include "mixed_text.h"
#include "testutil.h"

static int same_ids(json_t *want, const int *ids, int n)
{
    if ((int)json_array_size(want) != n) return 0;
    for (int i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, (size_t)i)) != ids[i]) return 0;
    return 1;
}

/* 10,000 random mixed-script lines (tests/mixed_text.h, seed 1): the same
 * ids as tokenizers gives (their hash per line) and decode(encode(s)) == s
 * exactly where it holds for tokenizers (tests/data/tok/roundtrip-NAME.txt,
 * from tests/ref/make_roundtrip_refs.py). */
static void test_roundtrip(const HfTokenizer *t, const char *name, const char *src)
{
    char ref[4200], head[128];
    snprintf(ref, sizeof ref, "%s/tests/data/tok/roundtrip-%s.txt", src, name);
    FILE *f = fopen(ref, "r");
    if (!CHECK_OK(f != NULL, "%s: no reference %s", name, ref)) return;
    unsigned long long want_text = 0, seed = 0;
    int lines = 0;
    CHECK(fgets(head, sizeof head, f) && sscanf(head, "# seed %llu, %d lines, text %llx", &seed, &lines, &want_text) == 3,
          "%s: bad header in %s", name, ref);
    uint64_t s = seed, text_hash = FNV_START;
    char buf[MIX_LINE_MAX];
    int same = 0, ids_differ = 0, rt_differ = 0, rt_both = 0;
    for (int i = 0; i < lines; i++) {
        size_t len = mixed_line(&s, buf);
        text_hash = fnv1a(fnv1a(text_hash, buf, len), "\n", 1);
        unsigned long long want_ids;
        int want_rt, *ids, n;
        if (fscanf(f, "%llx %d", &want_ids, &want_rt) != 2 || hftok_encode(t, buf, len, 0, &ids, &n)) {
            CHECK(0, "%s: line %d: no reference, or encoding failed", name, i);
            break;
        }
        char *dec = hftok_decode(t, ids, n, 1);
        int rt = !strcmp(dec, buf), ok_ids = fnv1a(FNV_START, ids, sizeof(int) * (size_t)n) == want_ids;
        ids_differ += !ok_ids;
        rt_differ += rt != want_rt;
        rt_both += rt && want_rt;
        same += ok_ids && rt == want_rt;
        if ((!ok_ids || rt != want_rt) && ids_differ + rt_differ <= 3)
            fprintf(stderr, "%s: random line %d \"%s\": ids %s, round trip %d (reference: %d)\n", name, i, buf,
                    ok_ids ? "same" : "DIFFER", rt, want_rt);
        free(ids);
        free(dec);
    }
    fclose(f);
    CHECK(text_hash == want_text, "%s: the random text is not the reference's (mixed_text.h and mixed_text.py differ)", name);
    fprintf(stderr, "%-10s %d of %d random lines: same ids and round trip as the reference (%d round-trip in both)\n", name,
            same, lines, rt_both);
    CHECK(lines == 10000 && ids_differ == 0 && rt_differ == 0, "%s: %d lines' ids and %d round trips differ", name,
          ids_differ, rt_differ);
}

/* Copies of the shared tokenizers with added tokens matched in the
 * normalized text, or with lstrip / rstrip / single_word
 * (tests/data/tok/added-variants.jsonl, from tests/ref/make_tok_refs.py):
 * the same ids as tokenizers. */
static void test_added_variants(const char *src)
{
    char ref[4200];
    snprintf(ref, sizeof ref, "%s/tests/data/tok/added-variants.jsonl", src);
    FILE *f = fopen(ref, "r");
    if (!CHECK_OK(f != NULL, "no reference %s", ref)) return;
    char *line = NULL;
    size_t cap = 0;
    int texts = 0, bad = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        const char *base = json_string_value(json_object_get(o, "base"));
        char rel[256];
        snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", base ? base : "?");
        char *path = shared_path(rel), *data;
        size_t size;
        if (!o || !base || access(path, R_OK) || read_file(path, &data, &size)) {
            free(path);
            json_decref(o);
            continue;
        }
        json_t *spec = json_loadb(data, size, 0, NULL);
        json_array_extend(json_object_get(spec, "added_tokens"), json_object_get(o, "add"));
        char *text = json_dumps(spec, JSON_COMPACT);
        HfTokenizer *t = hftok_parse(path, text, strlen(text));
        const char *s = json_string_value(json_object_get(o, "text"));
        int *ids = NULL, n = 0, ok = t && hftok_encode(t, s, strlen(s), 0, &ids, &n) == 0;
        if (!(ok && same_ids(json_object_get(o, "ids"), ids, n))) {
            bad++;
            fprintf(stderr, "%s with added tokens: \"%s\" gives", base, s);
            for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        texts++;
        free(ids);
        hftok_free(t);
        free(text);
        json_decref(spec);
        free(data);
        free(path);
        json_decref(o);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "added tokens (normalized, lstrip, rstrip, single_word): %d of %d texts as tokenizers\n",
            texts - bad, texts);
    CHECK(bad == 0, "%d of %d texts with added tokens differ from tokenizers", bad, texts);
}

/* Encoding grows linearly with the text: a string of digits (one token
 * each under a regex pre-tokenizer) of 256 KB and of 1 MB, best of two
 * each. The ratio is 4 when linear and 16 when quadratic; pcre2_match
 * checking the whole subject's UTF-8 on every match made it 16. */
static void test_linear(const HfTokenizer *t, const char *name)
{
    enum { SMALL = 1 << 18, LARGE = 1 << 20 };
    char *digits = xmalloc(LARGE);
    uint64_t st = 5;
    for (int i = 0; i < LARGE; i++) digits[i] = (char)('0' + splitmix64(&st) % 10);
    double secs[2] = {1e30, 1e30};
    int tokens[2] = {0, 0};
    for (int rep = 0; rep < 2; rep++)
        for (int k = 0; k < 2; k++) {
            int *ids, n;
            double t0 = now_s();
            if (!CHECK_OK(hftok_encode(t, digits, k ? LARGE : SMALL, 0, &ids, &n) == 0, "%s: %s", name, dcp_error()))
                break;
            double s = now_s() - t0;
            secs[k] = s < secs[k] ? s : secs[k];
            tokens[k] = n;
            free(ids);
        }
    double ratio = secs[1] / secs[0];
    fprintf(stderr, "%-10s 1 MB of digits: %d tokens in %.3f s; 256 KB in %.3f s (ratio %.1f; linear 4)\n", name,
            tokens[1], secs[1], secs[0], ratio);
    CHECK(ratio < 8, "%s: 4x the text took %.1fx the time (%.3f s for 1 MB)", name, ratio, secs[1]);
    free(digits);
}

/* What tokenizers would split or number otherwise is refused: a Split
 * pattern that can match the empty string, an added token whose id the
 * vocabulary gives to another piece. */
static void test_refusals(void)
{
    char *path = shared_path("tokenizers/mistral-sp/tokenizer.json"), *data;
    size_t size;
    if (access(path, R_OK) || read_file(path, &data, &size)) {
        free(path);
        return;
    }
    static const char *const cases[][2] = {
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s*\"}, \"behavior\": \"Isolated\"}}",
         "can match the empty string"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?=a)|b\"}, \"behavior\": \"Isolated\"}}",
         "can match the empty string"},
        {"{\"added_tokens\": [{\"id\": 100, \"content\": \"<qqq>\", \"special\": true}]}", "has id 100, which the vocabulary gives to"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        json_t *spec = json_loadb(data, size, 0, NULL), *patch = json_loads(cases[k][0], 0, NULL);
        json_object_update(spec, patch);
        char *text = json_dumps(spec, JSON_COMPACT);
        HfTokenizer *t = hftok_parse(path, text, strlen(text));
        CHECK(!t && strstr(dcp_error(), cases[k][1]), "%s: %s", cases[k][0], t ? "accepted" : dcp_error());
        hftok_free(t);
        free(text);
        json_decref(patch);
        json_decref(spec);
    }
    free(data);
    free(path);
}

/* A tiktoken tokenizer as Kimi K2's: the cl100k_base ranks with Kimi's
 * split pattern (rewritten for PCRE2) and Kimi's special tokens after the
 * ranks, against the tiktoken package (tests/ref/make_tiktoken_refs.py):
 * hand-written texts for the pattern's corners (ids and decoded text), and
 * the 10,000 random lines' ids and round trips. The rewritten pattern is
 * checked as written too. Returns whether the ranks were there. */
static int test_kimi_cl100k(const char *src)
{
    char *path = shared_path("tokenizers/cl100k/cl100k_base.tiktoken");
    if (access(path, R_OK)) {
        fprintf(stderr, "%s not found: skipped\n", path);
        free(path);
        return 0;
    }
    static const char *named[] = {"[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                  "<|start_header_id|>", "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>"};
    enum { BASE = 100256, N_SPECIAL = 256 };
    char *special[N_SPECIAL];
    int special_id[N_SPECIAL];
    for (int i = 0; i < N_SPECIAL; i++) {
        special[i] = xmalloc(40);
        if (i < 10) strcpy(special[i], named[i]);
        else snprintf(special[i], 40, "<|reserved_token_%d|>", BASE + i);
        special_id[i] = BASE + i;
    }
    char *re = tiktoken_pcre2_pattern("[a-z&&[^aeiou]]+|[\\p{L}&&[^\\p{Han}]]|[]&&[^x]]|\\[x&&y\\]");
    CHECK(re && !strcmp(re, "(?:(?![aeiou])[a-z])+|(?:(?![\\p{Han}])[\\p{L}])|(?:(?![x])[]])|\\[x&&y\\]"),
          "class intersections rewritten: %s", re ? re : dcp_error());
    free(re);
    CHECK(!tiktoken_pcre2_pattern("[a&&b]") && strstr(dcp_error(), "not [X&&[^Y]]"), "[a&&b] refused: %s", dcp_error());
    double t0 = now_s();
    HfTokenizer *t = tiktoken_load(path, tiktoken_kimi_pattern, (const char *const *)special, special_id, N_SPECIAL);
    double load_s = now_s() - t0;
    int ok = CHECK_OK(t != NULL, "kimi-cl100k: %s", dcp_error());
    if (ok) {
        CHECK(hftok_vocab_size(t) == BASE + N_SPECIAL, "kimi-cl100k: %d ids", hftok_vocab_size(t));
        char ref[4200];
        snprintf(ref, sizeof ref, "%s/tests/data/tok/kimi-cl100k.jsonl", src);
        FILE *f = fopen(ref, "r");
        int texts = 0, bad = 0;
        char line[8192];
        while (f && fgets(line, sizeof line, f)) {
            json_t *o = json_loads(line, 0, NULL);
            const char *text = json_string_value(json_object_get(o, "text"));
            int *ids = NULL, n = 0, enc = text && hftok_encode(t, text, strlen(text), 0, &ids, &n) == 0;
            json_t *want = json_object_get(o, "ids");
            int same = enc && same_ids(want, ids, n);
            char *dec = enc ? hftok_decode(t, ids, n, 0) : NULL;
            same = same && !strcmp(dec, json_string_value(json_object_get(o, "decoded")));
            if (!same && ++bad <= 3) {
                fprintf(stderr, "kimi-cl100k: \"%s\": got", text ? text : "?");
                for (int i = 0; i < n && i < 16; i++) fprintf(stderr, " %d", ids[i]);
                fprintf(stderr, ", want");
                for (size_t i = 0; i < json_array_size(want) && i < 16; i++)
                    fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
                fprintf(stderr, "\n");
            }
            free(ids);
            free(dec);
            json_decref(o);
            texts++;
        }
        if (f) fclose(f);
        fprintf(stderr, "kimi-cl100k loaded in %.2f s; %d of %d texts encode and decode exactly as tiktoken does\n",
                load_s, texts - bad, texts);
        CHECK(texts >= 30 && bad == 0, "kimi-cl100k: %d of %d texts differ from tiktoken (%s)", bad, texts, ref);
        test_roundtrip(t, "kimi-cl100k", src);
        hftok_free(t);
    }
    for (int i = 0; i < N_SPECIAL; i++) free(special[i]);
    free(path);
    return 1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const char *src = getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : ".";
    static const char *names[] = {"llama3", "qwen3", "mistral-sp"};
    int ran = 0;
    for (int k = 0; k < 3; k++) {
        char rel[128], ref[4200];
        snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", names[k]);
        char *path = shared_path(rel);
        if (access(path, R_OK)) {
            fprintf(stderr, "%s not found: skipped\n", path);
            free(path);
            continue;
        }
        double t0 = now_s();
        HfTokenizer *t = hftok_load(path);
        double load_s = now_s() - t0;
        free(path);
        if (!CHECK_OK(t != NULL, "%s: %s", names[k], dcp_error())) continue;
        ran++;
        snprintf(ref, sizeof ref, "%s/tests/data/tok/%s.jsonl", src, names[k]);
        FILE *f = fopen(ref, "r");
        if (!CHECK_OK(f != NULL, "%s: no reference %s", names[k], ref)) {
            hftok_free(t);
            continue;
        }
        char *line = NULL;
        size_t cap = 0;
        int texts = 0, bad = 0;
        while (getline(&line, &cap, f) > 0) {
            json_t *o = json_loads(line, JSON_ALLOW_NUL, NULL);
            if (!CHECK_OK(o != NULL, "%s: reference line %d is not JSON", names[k], texts + 1)) continue;
            const char *text = json_string_value(json_object_get(o, "text"));
            size_t len = json_string_length(json_object_get(o, "text"));
            int *ids, n, *sids, sn;
            int ok = text && hftok_encode(t, text, len, 0, &ids, &n) == 0;
            int ok_s = text && hftok_encode(t, text, len, 1, &sids, &sn) == 0;
            json_t *want = json_object_get(o, "ids");
            int wn = (int)json_array_size(want);
            int *wids = xmalloc(sizeof(int) * (size_t)(wn + 1));
            for (int i = 0; i < wn; i++) wids[i] = (int)json_integer_value(json_array_get(want, (size_t)i));
            char *dec = hftok_decode(t, wids, wn, 1), *dec_all = hftok_decode(t, wids, wn, 0);
            int e1 = ok && same_ids(want, ids, n), e2 = ok_s && same_ids(json_object_get(o, "with_special"), sids, sn);
            int d1 = !strcmp(dec, json_string_value(json_object_get(o, "decoded")));
            int d2 = !strcmp(dec_all, json_string_value(json_object_get(o, "decoded_all")));
            if (!(e1 && e2 && d1 && d2)) {
                bad++;
                if (bad <= 3) {
                    fprintf(stderr, "%s: text %d \"%.40s\": encode %s, with special %s, decode %s, decode all %s\n",
                            names[k], texts, text, e1 ? "ok" : "DIFFERS", e2 ? "ok" : "DIFFERS", d1 ? "ok" : "DIFFERS",
                            d2 ? "ok" : "DIFFERS");
                    if (!e1 && ok) {
                        fprintf(stderr, "   got ");
                        for (int i = 0; i < n && i < 16; i++) fprintf(stderr, "%d ", ids[i]);
                        fprintf(stderr, "\n   want ");
                        for (int i = 0; i < wn && i < 16; i++) fprintf(stderr, "%d ", wids[i]);
                        fprintf(stderr, "\n");
                    }
                    if (!d1) fprintf(stderr, "   decoded \"%s\"\n   want    \"%s\"\n", dec,
                                     json_string_value(json_object_get(o, "decoded")));
                }
            }
            if (ok) free(ids);
            if (ok_s) free(sids);
            free(wids);
            free(dec);
            free(dec_all);
            json_decref(o);
            texts++;
        }
        free(line);
        fclose(f);
        fprintf(stderr, "%-10s loaded in %.2f s; %d of %d texts encode and decode exactly as tokenizers does\n",
                names[k], load_s, texts - bad, texts);
        CHECK(texts > 20 && bad == 0, "%s: %d of %d texts differ from tokenizers", names[k], bad, texts);
        test_roundtrip(t, names[k], src);
        test_linear(t, names[k]);
        hftok_free(t);
    }
    ran |= test_kimi_cl100k(src);
    if (ran) test_added_variants(src);
    if (ran) test_refusals();
    MPI_Finalize();
    if (!ran && !test_failures) return TEST_SKIP;
    return test_finish("test_hftok");
}
