/* The llama2.c tokenizer: the O(n log n) merge gives exactly the ids of
 * llama2.c's own merge loop (written out here as run.c has it) on random
 * texts of mixed scripts, with stories260K's tokenizer; ids that the byte
 * fallback or BOS would put outside the vocabulary are refused. */
#include "testutil.h"
#include "tokenizer.h"

/* run.c's encode merge step: rescan all adjacent pairs, merge the best
 * (first on ties), until none merges. */
static int reference_merge(const Tokenizer *t, int *tok, int n)
{
    char *pair = xmalloc((size_t)t->max_token_length * 2 + 3);
    for (;;) {
        float best = -1e10f;
        int best_id = -1, best_i = -1;
        for (int i = 0; i + 1 < n; i++) {
            snprintf(pair, (size_t)t->max_token_length * 2 + 3, "%s%s", t->vocab[tok[i]], t->vocab[tok[i + 1]]);
            int id = -1;
            for (int v = 0; v < t->vocab_size && id < 0; v++)
                if (!strcmp(t->vocab[v], pair)) id = v;
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
    return n;
}

/* The unmerged ids: encode a text whose merges are all disabled by giving
 * every piece the lowest score, then merge with the reference. */
static void check_against_reference(Tokenizer *t, const char *text)
{
    int *got, n_got;
    CHECK(tokenizer_encode(t, text, 1, &got, &n_got) == 0, "encode: %s", dcp_error());
    float *scores = t->scores;
    float *none = xmalloc(sizeof(float) * (size_t)t->vocab_size);
    for (int i = 0; i < t->vocab_size; i++) none[i] = -1e30f;
    t->scores = none;
    int *raw, n_raw;
    tokenizer_encode(t, text, 1, &raw, &n_raw);
    t->scores = scores;
    free(none);
    int n_ref = reference_merge(t, raw, n_raw);
    CHECK(n_ref == n_got && !memcmp(raw, got, sizeof(int) * (size_t)n_got),
          "text of %zu bytes: %d ids, llama2.c's loop gives %d", strlen(text), n_got, n_ref);
    free(got);
    free(raw);
}

static void write_tiny_tokenizer(const char *path)
{
    /* 10 pieces: no byte-fallback pieces, so a byte maps to id byte + 3 */
    FILE *f = fopen(path, "wb");
    int max_len = 5;
    fwrite(&max_len, sizeof max_len, 1, f);
    const char *pieces[10] = {"<unk>", "<s>", "</s>", " ", "a", "b", "ab", " a", "ba", "aa"};
    for (int i = 0; i < 10; i++) {
        float score = (float)i;
        int len = (int)strlen(pieces[i]);
        fwrite(&score, sizeof score, 1, f);
        fwrite(&len, sizeof len, 1, f);
        fwrite(pieces[i], 1, (size_t)len, f);
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    char *dir = scratch_dir(), path[4200];
    snprintf(path, sizeof path, "%s/tiny.bin", dir);
    write_tiny_tokenizer(path);
    Tokenizer t;
    CHECK(tokenizer_load(&t, path, 10) == 0, "tiny tokenizer: %s", dcp_error());
    int *ids, n;
    CHECK(tokenizer_encode(&t, "abba", 1, &ids, &n) == 0 && n == 4 && ids[0] == 1 && ids[1] == 7 && ids[2] == 5 && ids[3] == 8,
          "abba -> %d ids", n);
    free(ids);
    CHECK(tokenizer_encode(&t, "abc", 1, &ids, &n) == -1 && strstr(dcp_error(), "token id 102"),
          "'c' falls back to byte id 102 of a 10-piece vocabulary: %s", dcp_error());
    CHECK(tokenizer_encode(&t, "ab", 12, &ids, &n) == -1 && strstr(dcp_error(), "token id 12"),
          "BOS id 12 outside the vocabulary: %s", dcp_error());
    tokenizer_free(&t);
    remove_tree(dir);
    free(dir);

    char *tok_path = shared_path("models/stories260K/tok512.bin");
    if (access(tok_path, R_OK)) {
        fprintf(stderr, "%s not found; llama2.c comparison skipped\n", tok_path);
        free(tok_path);
        MPI_Finalize();
        return test_failures ? test_finish("test_tokenizer") : TEST_SKIP;
    }
    CHECK(tokenizer_load(&t, tok_path, 512) == 0, "tok512: %s", dcp_error());
    static const char *words[] = {"Once", " upon", " a", " time", ",", " the", " little", " girl", "\n", "  ",
                                   "é", "日本", "😀", "ſ", "\t", "x", "qz", "3", "...", "Лиса"};
    uint64_t st = 7;
    for (int k = 0; k < 40; k++) {
        char text[2048] = "";
        int nw = 1 + (int)(splitmix64(&st) % 120);
        for (int i = 0; i < nw; i++) strcat(text, words[splitmix64(&st) % (sizeof words / sizeof *words)]);
        check_against_reference(&t, text);
    }
    check_against_reference(&t, "Once upon a time");
    tokenizer_free(&t);
    free(tok_path);
    MPI_Finalize();
    return test_finish("test_tokenizer");
}
