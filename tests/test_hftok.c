/* tokenizer.json against the Hugging Face `tokenizers` package: for the
 * three tokenizers in ../shared/tokenizers (Llama-3 and Qwen3 byte-level
 * BPE with regex splits, a sentencepiece-style 32K BPE with byte fallback),
 * encoding the committed corpus (tests/data/tok, made by
 * tests/ref/make_tok_refs.py) gives exactly the reference ids, with and
 * without the post-processor's special tokens, and decoding the reference
 * ids gives exactly the reference texts, with and without special tokens. */
#include <jansson.h>

#include "hftok.h"
#include "testutil.h"

static int same_ids(json_t *want, const int *ids, int n)
{
    if ((int)json_array_size(want) != n) return 0;
    for (int i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, (size_t)i)) != ids[i]) return 0;
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
        hftok_free(t);
    }
    MPI_Finalize();
    if (!ran && !test_failures) return TEST_SKIP;
    return test_finish("test_hftok");
}
