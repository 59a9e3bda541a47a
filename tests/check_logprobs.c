/* Checks a JSONL results file of tests/logprobs.sh against llama2.c's own
 * logits of "Once upon a time" (../shared/models/stories260K): every
 * logprobs / prompt_logprobs value equals log_softmax of the reference row
 * to 1e-4, the top N are the reference's N best (ids where the values are
 * apart by more than the tolerance), and where min_tokens held back a stop
 * token the token chosen is the reference's best other one.
 * With --same A B: two results files of the same requests hold the same
 * token ids, texts, finish and stop reasons, and log-probabilities within
 * 1e-4 (a layout against one rank).
 * Usage: check_logprobs RESULTS.jsonl | check_logprobs --same A.jsonl B.jsonl */
#include <jansson.h>

#include "testutil.h"

#define VOCAB 512
#define ROWS 64
#define TOL 1e-4

static float logits[ROWS][VOCAB];
static double lsm[ROWS][VOCAB]; /* log_softmax, in double */

/* the rank-ordered ids of row r, best first (lowest id first among equals) */
static int order_row;
static int by_value(const void *a, const void *b)
{
    double x = lsm[order_row][*(const int *)a], y = lsm[order_row][*(const int *)b];
    return x > y ? -1 : x < y ? 1 : *(const int *)a - *(const int *)b;
}

/* one position's entry against reference row r, scoring token want */
static void check_position(json_t *e, int r, int want, int n_top, const char *what)
{
    int id = (int)json_integer_value(json_object_get(e, "token_id"));
    double lp = json_number_value(json_object_get(e, "logprob"));
    CHECK(id == want, "%s: token %d, want %d", what, id, want);
    CHECK(fabs(lp - lsm[r][want]) <= TOL, "%s: logprob %.6f, log_softmax %.6f", what, lp, lsm[r][want]);
    json_t *top = json_object_get(e, "top_logprobs");
    CHECK((int)json_array_size(top) == n_top, "%s: %zu top logprobs, want %d", what, json_array_size(top), n_top);
    int ids[VOCAB];
    for (int i = 0; i < VOCAB; i++) ids[i] = i;
    order_row = r;
    qsort(ids, VOCAB, sizeof(int), by_value);
    for (int j = 0; j < n_top && j < (int)json_array_size(top); j++) {
        json_t *t = json_array_get(top, j);
        int tid = (int)json_integer_value(json_object_get(t, "token_id"));
        double tlp = json_number_value(json_object_get(t, "logprob"));
        CHECK(fabs(tlp - lsm[r][ids[j]]) <= TOL, "%s: top %d logprob %.6f, want %.6f", what, j, tlp, lsm[r][ids[j]]);
        int clear = (j == 0 || lsm[r][ids[j - 1]] - lsm[r][ids[j]] > 2 * TOL) &&
                    lsm[r][ids[j]] - lsm[r][ids[j + 1]] > 2 * TOL;
        CHECK(!clear || tid == ids[j], "%s: top %d is token %d, want %d", what, j, tid, ids[j]);
    }
}

static json_t *read_lines(const char *path)
{
    json_t *all = json_array();
    FILE *in = fopen(path, "r");
    static char buf[1 << 22];
    while (in && fgets(buf, sizeof buf, in)) json_array_append_new(all, json_loads(buf, 0, NULL));
    if (in) fclose(in);
    return all;
}

/* the logprob entries of two lines agree to TOL (null where either is) */
static double max_logprob_diff(json_t *a, json_t *b, int *shape_ok)
{
    double m = 0;
    *shape_ok &= json_array_size(a) == json_array_size(b);
    for (size_t i = 0; i < json_array_size(a) && i < json_array_size(b); i++) {
        json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
        if (json_is_null(x) || json_is_null(y)) {
            *shape_ok &= json_is_null(x) == json_is_null(y);
            continue;
        }
        m = fmax(m, fabs(json_number_value(json_object_get(x, "logprob")) - json_number_value(json_object_get(y, "logprob"))));
        json_t *tx = json_object_get(x, "top_logprobs"), *ty = json_object_get(y, "top_logprobs");
        *shape_ok &= json_array_size(tx) == json_array_size(ty);
        for (size_t j = 0; j < json_array_size(tx) && j < json_array_size(ty); j++)
            m = fmax(m, fabs(json_number_value(json_object_get(json_array_get(tx, j), "logprob")) -
                             json_number_value(json_object_get(json_array_get(ty, j), "logprob"))));
    }
    return m;
}

static int same_results(const char *pa, const char *pb)
{
    json_t *a = read_lines(pa), *b = read_lines(pb);
    CHECK(json_array_size(a) > 0 && json_array_size(a) == json_array_size(b), "%zu and %zu lines", json_array_size(a),
          json_array_size(b));
    double worst = 0;
    for (size_t i = 0; i < json_array_size(a) && i < json_array_size(b); i++) {
        json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
        static const char *keys[] = {"id", "text", "token_ids", "finish_reason", "stop_reason", "error"};
        for (int k = 0; k < 6; k++)
            CHECK(json_equal(json_object_get(x, keys[k]), json_object_get(y, keys[k])), "line %zu: %s differs", i + 1,
                  keys[k]);
        int shape = 1;
        double d = fmax(max_logprob_diff(json_object_get(x, "logprobs"), json_object_get(y, "logprobs"), &shape),
                        max_logprob_diff(json_object_get(x, "prompt_logprobs"), json_object_get(y, "prompt_logprobs"),
                                         &shape));
        CHECK(shape && d <= TOL, "line %zu: log-probabilities differ (%.2e, or in number)", i + 1, d);
        worst = fmax(worst, d);
    }
    fprintf(stderr, "check_logprobs: %zu requests the same; log-probabilities within %.2e\n", json_array_size(a), worst);
    json_decref(a);
    json_decref(b);
    return test_finish("check_logprobs --same");
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--same")) return same_results(argv[2], argv[3]);
    if (argc != 2) {
        fprintf(stderr, "usage: check_logprobs RESULTS.jsonl\n");
        return 2;
    }
    char *lpath = shared_path("models/stories260K/logits_case1_once_upon_a_time_n64.f32");
    char *rpath = shared_path("models/stories260K/REFERENCE-llama2c.txt");
    FILE *f = fopen(lpath, "rb");
    char *ref;
    size_t ref_n;
    if (!f || fread(logits, sizeof logits, 1, f) != 1 || read_file(rpath, &ref, &ref_n)) {
        fprintf(stderr, "check_logprobs: cannot read %s or %s\n", lpath, rpath);
        return 1;
    }
    fclose(f);
    int seq[128], n_seq = reference_tokens(ref, 1, seq, 128);
    CHECK(n_seq == 65, "reference: %d tokens, want 65", n_seq);
    for (int r = 0; r < ROWS; r++) {
        double m = -INFINITY, s = 0;
        for (int v = 0; v < VOCAB; v++) m = logits[r][v] > m ? logits[r][v] : m;
        for (int v = 0; v < VOCAB; v++) s += exp((double)logits[r][v] - m);
        for (int v = 0; v < VOCAB; v++) lsm[r][v] = logits[r][v] - m - log(s);
    }
    json_error_t err;
    json_t *lines[8];
    int n = 0;
    FILE *in = fopen(argv[1], "r");
    char buf[1 << 20];
    while (in && n < 8 && fgets(buf, sizeof buf, in)) lines[n++] = json_loads(buf, 0, &err);
    if (in) fclose(in);
    CHECK(n == 3, "%s: %d lines, want 3", argv[1], n);
    for (int i = 0; i < n; i++) {
        json_t *o = lines[i];
        const char *id = json_string_value(json_object_get(o, "id"));
        json_t *toks = json_object_get(o, "token_ids");
        if (!CHECK_OK(id && json_is_array(toks), "line %d: no id or token_ids", i + 1)) continue;
        if (!strcmp(id, "lp")) {
            /* 5 prompt tokens (rows 0-3 score tokens 1-4), 60 generated (rows 4-63) */
            json_t *lp = json_object_get(o, "logprobs"), *plp = json_object_get(o, "prompt_logprobs");
            CHECK(json_array_size(lp) == 60 && json_array_size(plp) == 5, "lp: %zu logprobs, %zu prompt logprobs",
                  json_array_size(lp), json_array_size(plp));
            CHECK(json_is_null(json_array_get(plp, 0)), "lp: the first prompt token has a log-probability");
            char what[64];
            for (int p = 1; p < 5 && p < (int)json_array_size(plp); p++) {
                snprintf(what, sizeof what, "prompt token %d", p);
                check_position(json_array_get(plp, p), p - 1, seq[p], 5, what);
            }
            for (int k = 0; k < 60 && k < (int)json_array_size(lp); k++) {
                snprintf(what, sizeof what, "output token %d", k);
                check_position(json_array_get(lp, k), 4 + k, seq[5 + k], 5, what);
            }
        } else if (!strcmp(id, "stop_token")) {
            /* the third generated token is a stop token: three tokens, it the last */
            CHECK(json_array_size(toks) == 3 && json_integer_value(json_array_get(toks, 2)) == seq[7] &&
                      json_integer_value(json_object_get(o, "stop_reason")) == seq[7],
                  "stop_token: %zu tokens, stop_reason %lld", json_array_size(toks),
                  (long long)json_integer_value(json_object_get(o, "stop_reason")));
        } else if (!strcmp(id, "min_tokens")) {
            /* the same stop token, held back by min_tokens 8: the third token is
             * row 6's best other one, and the request runs to 8 tokens */
            int best = -1;
            for (int v = 0; v < VOCAB; v++)
                if (v != seq[7] && (best < 0 || logits[6][v] > logits[6][best])) best = v;
            CHECK(json_array_size(toks) == 8 && json_integer_value(json_array_get(toks, 2)) == best,
                  "min_tokens: %zu tokens, third %lld, want 8 and %d", json_array_size(toks),
                  (long long)json_integer_value(json_array_get(toks, 2)), best);
        } else {
            CHECK(0, "unexpected id %s", id);
        }
        json_decref(o);
    }
    free(ref);
    free(lpath);
    free(rpath);
    return test_finish("check_logprobs");
}
