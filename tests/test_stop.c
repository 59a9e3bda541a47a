/* Stop rules through the scheduler, with real tokenizers (../shared, and a
 * Kimi K2-style tiktoken folder on its cl100k ranks): the
 * output text grows whole characters at a time as tokens arrive, a stop
 * string ends the request at the token that completes it (split over two
 * tokens, or beginning inside a multi-byte character spelled by byte
 * tokens), include_stop_str_in_output keeps it, min_tokens holds stops
 * back, ignore_eos lets EOS pass, and a stop token's text is left out. The
 * "model" is a script: each step samples the next token of a continuation
 * the tokenizer encoded. */
#include "kvcache.h"
#include "scheduler.h"
#include "testutil.h"
#include "tokenizer.h"

/* 1 when s is valid UTF-8 without U+FFFD (no character cut) */
static int whole_chars(const char *s) { return valid_utf8(s) && !strstr(s, "\xEF\xBF\xBD"); }

typedef struct {
    const char *stop;     /* one stop string, or NULL */
    int include, min_tokens, ignore_eos;
    int eos;              /* the model's EOS id, or -1 */
    int stop_id;          /* a stop_token_ids entry, or -1 */
} Rules;

/* Runs prompt, then the continuation's ids one per step under the rules;
 * every step's text must be whole characters. */
static void run(const Tokenizer *tok, const char *what, const int *prompt, int n_prompt, const int *cont, int n_cont,
                const Rules *ru, Result *out)
{
    Config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = tok->vocab_size;
    c.bos_id = 1;
    if (ru->eos >= 0) c.eos_ids[c.n_eos++] = ru->eos;
    Topology t = {.world_size = 1, .tp = 1, .dcp = 1, .dp = 1, .interleave = 1};
    BlockPool pool;
    pool_init(&pool, 1000, 16);
    RequestSet rs = {0};
    Request *q = add_request(&rs, prompt, n_prompt, n_cont, 0.0f, 1.0f, 0);
    if (ru->stop) {
        q->stop = xcalloc(2, sizeof(char *));
        q->stop[0] = xstrdup(ru->stop);
        q->n_stop_str = 1;
    }
    if (ru->stop_id >= 0) {
        q->stop_ids = xmalloc(sizeof(int));
        q->stop_ids[0] = ru->stop_id;
        q->n_stop = 1;
    }
    q->include_stop_str = ru->include;
    q->min_tokens = ru->min_tokens;
    q->ignore_eos = ru->ignore_eos;
    Result res[1];
    memset(res, 0, sizeof res);
    SchedulerLimits o = {.max_model_len = 1000, .max_num_seqs = 4, .max_batched_tokens = 64};
    Scheduler s;
    StepPlan p;
    scheduler_init(&s, &rs, res, &c, &t, &pool, &o);
    s.tok = tok;
    s.bos = c.bos_id;
    plan_init(&p, &o);
    int step = 0;
    while (scheduler_plan(&s, &p) && step < n_cont) {
        int sampled[1] = {cont[res[0].n]};
        scheduler_commit(&s, &p, sampled, step++);
        CHECK(whole_chars(res[0].text), "%s: after token %d the text \"%s\" cuts a character", what, res[0].n,
              res[0].text);
    }
    *out = res[0];
    scheduler_free(&s);
    plan_free(&p);
    pool_free_all(&pool);
    requests_free(&rs);
}

/* The number of leading ids of cont whose text first holds needle: where a
 * stop string is complete. */
static int tokens_until(const Tokenizer *tok, const int *prompt, int n_prompt, const int *cont, int n, const char *needle)
{
    for (int k = 1; k <= n; k++) {
        int *seq = xmalloc(sizeof(int) * (size_t)(n_prompt + k));
        memcpy(seq, prompt, sizeof(int) * (size_t)n_prompt);
        memcpy(seq + n_prompt, cont, sizeof(int) * (size_t)k);
        size_t len_p, len_all;
        char *a = tokenizer_decode_span(tok, -1, seq, n_prompt, 1, 1, &len_p);
        char *b = tokenizer_decode_span(tok, -1, seq, n_prompt + k, 1, 1, &len_all);
        int found = strstr(b + len_p, needle) != NULL;
        free(a);
        free(b);
        free(seq);
        if (found) return k;
    }
    return -1;
}

static void check_text(const Result *r, const char *what, const char *want, const char *fin, int n)
{
    CHECK(r->text && !strcmp(r->text, want), "%s: text \"%s\", want \"%s\"", what, r->text ? r->text : "(null)", want);
    CHECK(r->finish_reason && !strcmp(r->finish_reason, fin), "%s: finish %s, want %s", what, r->finish_reason, fin);
    CHECK(r->n == n, "%s: %d tokens, want %d", what, r->n, n);
}

/* a shared tokenizer (rel), skipped when missing; or (rel absolute) one
 * made for the test, which must load */
static void test_tokenizer(const char *rel, const char *name)
{
    char *path = rel[0] == '/' ? xstrdup(rel) : shared_path(rel);
    Tokenizer tok;
    if (access(path, R_OK) || tokenizer_load(&tok, path, 1 << 20)) {
        if (rel[0] == '/') CHECK(0, "%s: %s", name, dcp_error());
        else fprintf(stderr, "%s: %s not found, skipped\n", name, path);
        free(path);
        return;
    }
    /* the continuation (its ids without BOS), after the prompt "Hello" */
    const char *text = " Un café 𓀀 très bon. The end."; /* 𓀀: four bytes, in byte tokens */
    int *pids, np, *all, na;
    tokenizer_encode(&tok, "Hello", 1, &pids, &np);
    char *joined = xmalloc(strlen(text) + 8);
    sprintf(joined, "Hello%s", text);
    tokenizer_encode(&tok, joined, 1, &all, &na);
    CHECK(na > np && !memcmp(all, pids, sizeof(int) * (size_t)np), "%s: \"Hello\" is not a prefix in ids", name);
    const int *cont = all + np;
    int nc = na - np;
    char what[128];
    Result r;

    /* no stop: the whole continuation, never a cut character */
    snprintf(what, sizeof what, "%s: no stop", name);
    run(&tok, what, pids, np, cont, nc, &(Rules){NULL, 0, 0, 0, -1, -1}, &r);
    check_text(&r, what, text, "length", nc);
    results_free(&r, 1);

    /* stop strings: inside the emoji's bytes, split over tokens, and with
     * the stop string kept */
    struct {
        const char *stop, *before;
    } cases[] = {{"𓀀", " Un café "}, {"é 𓀀 t", " Un caf"}, {"n. Th", " Un café 𓀀 très bo"}, {"afé", " Un c"}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int at = tokens_until(&tok, pids, np, cont, nc, cases[k].stop);
        for (int inc = 0; inc < 2; inc++) {
            char want[128];
            snprintf(want, sizeof want, "%s%s", cases[k].before, inc ? cases[k].stop : "");
            snprintf(what, sizeof what, "%s: stop \"%s\"%s", name, cases[k].stop, inc ? " included" : "");
            run(&tok, what, pids, np, cont, nc, &(Rules){cases[k].stop, inc, 0, 0, -1, -1}, &r);
            check_text(&r, what, want, "stop", at);
            CHECK(r.stop_str && !strcmp(r.stop_str, cases[k].stop), "%s: stop_str %s", what, r.stop_str);
            results_free(&r, 1);
        }
    }
    /* "𓀀" begins inside a run of byte tokens: it takes more than one token
     * after "café" for the test to mean anything */
    int emoji = tokens_until(&tok, pids, np, cont, nc, "𓀀"), before = tokens_until(&tok, pids, np, cont, nc, "café");
    CHECK(emoji - before >= 2, "%s: the character is not spread over tokens (%d, %d)", name, before, emoji);

    /* min_tokens: a stop string complete before it does not stop the request */
    int at = tokens_until(&tok, pids, np, cont, nc, "afé");
    snprintf(what, sizeof what, "%s: min_tokens", name);
    run(&tok, what, pids, np, cont, nc, &(Rules){"afé", 0, at + 1, 0, -1, -1}, &r);
    check_text(&r, what, text, "length", nc);
    results_free(&r, 1);

    /* EOS (here the continuation's third token): stops, its text left out;
     * ignore_eos runs through; min_tokens holds it back (the mask that keeps
     * the model from choosing it is generate's; here it is just not a stop) */
    int eos = cont[2];
    snprintf(what, sizeof what, "%s: eos", name);
    run(&tok, what, pids, np, cont, nc, &(Rules){NULL, 0, 0, 0, eos, -1}, &r);
    CHECK(!strcmp(r.finish_reason, "stop") && r.n == 3 && r.stop_token == eos && !r.stop_str,
          "%s: finish %s after %d tokens, stop token %d", what, r.finish_reason, r.n, r.stop_token);
    size_t two;
    int seq[64];
    memcpy(seq, pids, sizeof(int) * (size_t)np);
    memcpy(seq + np, cont, sizeof(int) * 2);
    size_t lp;
    char *p = tokenizer_decode_span(&tok, -1, seq, np, 1, 1, &lp), *t2 = tokenizer_decode_span(&tok, -1, seq, np + 2, 1, 1, &two);
    CHECK(!strcmp(r.text, t2 + lp), "%s: text \"%s\", want the first two tokens' \"%s\"", what, r.text, t2 + lp);
    free(p);
    free(t2);
    results_free(&r, 1);
    snprintf(what, sizeof what, "%s: ignore_eos", name);
    run(&tok, what, pids, np, cont, nc, &(Rules){NULL, 0, 0, 1, eos, -1}, &r);
    check_text(&r, what, text, "length", nc);
    results_free(&r, 1);
    snprintf(what, sizeof what, "%s: stop_token_ids with min_tokens", name);
    run(&tok, what, pids, np, cont, nc, &(Rules){NULL, 0, 4, 0, -1, eos}, &r);
    CHECK(r.n >= 4, "%s: stopped after %d tokens", what, r.n);
    results_free(&r, 1);

    free(pids);
    free(all);
    free(joined);
    tokenizer_free(&tok);
    free(path);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    char *dir = shared_path("tokenizers");
    int have = access(dir, R_OK) == 0;
    free(dir);
    if (!have) {
        fprintf(stderr, "test_stop: no shared tokenizers, skipped\n");
        MPI_Finalize();
        return TEST_SKIP;
    }
    test_tokenizer("tokenizers/mistral-sp/tokenizer.json", "mistral-sp");
    test_tokenizer("tokenizers/llama3/tokenizer.json", "llama3");
    test_tokenizer("tokenizers/qwen3/tokenizer.json", "qwen3");
    /* a Kimi K2-style tiktoken folder: cl100k's ranks linked in, with a
     * tokenizer_config.json naming TikTokenTokenizer */
    char *ranks = shared_path("tokenizers/cl100k/cl100k_base.tiktoken"), tmp[] = "/tmp/dcp_stop.XXXXXX", file[64];
    if (!access(ranks, R_OK) && mkdtemp(tmp)) {
        snprintf(file, sizeof file, "%s/tiktoken.model", tmp);
        int ok = symlink(ranks, file) == 0;
        snprintf(file, sizeof file, "%s/tokenizer_config.json", tmp);
        FILE *f = fopen(file, "w");
        ok = ok && f && fputs("{\"tokenizer_class\": \"TikTokenTokenizer\"}\n", f) >= 0;
        if (f) fclose(f);
        if (CHECK_OK(ok, "kimi-cl100k: could not make %s", tmp)) test_tokenizer(tmp, "kimi-cl100k");
        unlink(file);
        snprintf(file, sizeof file, "%s/tiktoken.model", tmp);
        unlink(file);
        rmdir(tmp);
    }
    free(ranks);
    MPI_Finalize();
    return test_finish("test_stop");
}
