/* A request gets exactly the tokens it gets alone, whatever shares its
 * batch: 20 different prompts, greedy and seeded sampling, all at once,
 * alone, and with a small token budget that chunks prefills and queues
 * requests. min_tokens holds stop tokens back as vLLM does: while fewer
 * than min_tokens tokens are generated. */
#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "model.h"
#include "testutil.h"

enum { NREQ = 20 };

static void build(RequestSet *rs, int vocab, float temperature, float top_p)
{
    memset(rs, 0, sizeof *rs);
    uint64_t s = 2024;
    for (int i = 0; i < NREQ; i++) {
        int n = 1 + (int)(splitmix64(&s) % 45), ids[64];
        for (int j = 0; j < n; j++) ids[j] = (int)(splitmix64(&s) % (uint64_t)vocab);
        add_request(rs, ids, n, 8 + i % 17, temperature, top_p, 1000 + i);
    }
}

static void run(const Model *m, RequestSet *rs, Result *res, int max_num_seqs, int max_batched)
{
    Timings tm = {0};
    Engine e;
    engine_init(&e, m, backend_cpu(), NULL, NULL, &tm, NULL);
    GenOptions go = {.max_model_len = m->cfg.max_seq_len, .max_num_seqs = max_num_seqs,
                     .max_batched_tokens = max_batched};
    GenStats gs;
    generate(&e, rs, res, &go, &gs);
    CHECK(gs.kv_blocks_left == 0 && e.att.pool.n_free == e.att.pool.n_blocks, "all KV blocks released");
    free(gs.steps);
    engine_free(&e);
}

static void compare(const Model *m, float temperature, float top_p, const char *label)
{
    RequestSet rs;
    build(&rs, m->cfg.vocab_size, temperature, top_p);
    Result batched[NREQ], chunked[NREQ];
    run(m, &rs, batched, 256, 2048);
    run(m, &rs, chunked, 6, 7);
    int distinct = 0;
    for (int i = 0; i < NREQ; i++) {
        RequestSet one = {0};
        Request *q = &rs.r[i];
        add_request(&one, q->prompt_tokens, q->n_prompt, q->max_tokens, q->temperature, q->top_p, q->seed);
        Result alone;
        run(m, &one, &alone, 256, 2048);
        CHECK(alone.n == q->max_tokens, "%s request %d: %d tokens, wanted %d", label, i, alone.n, q->max_tokens);
        CHECK(batched[i].n == alone.n && !memcmp(batched[i].tokens, alone.tokens, sizeof(int) * alone.n),
              "%s request %d: batched tokens differ from alone", label, i);
        CHECK(chunked[i].n == alone.n && !memcmp(chunked[i].tokens, alone.tokens, sizeof(int) * alone.n),
              "%s request %d: chunked/queued tokens differ from alone", label, i);
        if (i > 0 && (batched[i].n != batched[0].n || memcmp(batched[i].tokens, batched[0].tokens, sizeof(int) * 8)))
            distinct++;
        results_free(&alone, 1);
        requests_free(&one);
    }
    CHECK(distinct >= NREQ - 2, "%s: outputs are not all alike (%d distinct)", label, distinct);
    results_free(batched, NREQ);
    results_free(chunked, NREQ);
    requests_free(&rs);
}

/* vLLM masks a request's stop tokens while it has generated fewer than
 * min_tokens: the first that may be a stop token is token min_tokens + 1.
 * A greedy request whose token k (new in its output) is made its stop
 * token, with min_tokens k, must not stop at token k. */
static void min_tokens(const Model *m)
{
    int prompt[] = {5, 17, 230, 41}, k;
    RequestSet free_run = {0};
    add_request(&free_run, prompt, 4, 12, 0.0f, 1.0f, 1);
    Result ref;
    run(m, &free_run, &ref, 4, 64);
    for (k = 3; k < ref.n; k++) { /* a token position whose token is new there */
        int seen = 0;
        for (int j = 0; j < k - 1; j++) seen |= ref.tokens[j] == ref.tokens[k - 1];
        if (!seen) break;
    }
    if (!CHECK_OK(k < ref.n, "no new token in the free run")) return;
    int stop = ref.tokens[k - 1];
    for (int mt = k - 1; mt <= k; mt++) {
        RequestSet rs = {0};
        Request *q = add_request(&rs, prompt, 4, 12, 0.0f, 1.0f, 1);
        q->stop_ids = xmalloc(sizeof(int));
        q->stop_ids[0] = stop;
        q->n_stop = 1;
        q->min_tokens = mt;
        Result r;
        run(m, &rs, &r, 4, 64);
        if (mt < k) /* allowed at token k: it stops there */
            CHECK(r.n == k && r.tokens[k - 1] == stop && !strcmp(r.finish_reason, "stop"),
                  "min_tokens %d, stop token %d at position %d: %d tokens, finish %s", mt, stop, k, r.n, r.finish_reason);
        else /* masked at token k: another token comes there */
            CHECK(r.n > k && r.tokens[k - 1] != stop && !memcmp(r.tokens, ref.tokens, sizeof(int) * (size_t)(k - 1)),
                  "min_tokens %d: the stop token %d was chosen as token %d (%d tokens)", mt, stop, k, r.n);
        results_free(&r, 1);
        requests_free(&rs);
    }
    results_free(&ref, 1);
    requests_free(&free_run);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    Model m;
    CHECK(model_load(&m, NULL, 1, 0) == 0, "default model: %s", dcp_error());
    compare(&m, 0.0f, 1.0f, "greedy");
    compare(&m, 0.9f, 0.95f, "sampled");
    compare(&m, 1.0f, 1.0f, "sampled-full");
    min_tokens(&m);
    model_free(&m);
    MPI_Finalize();
    return test_finish("test_batch");
}
