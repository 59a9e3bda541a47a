/* A request gets exactly the tokens it gets alone, whatever shares its
 * batch: 20 different prompts, greedy and seeded sampling, all at once,
 * alone, and with a small token budget that chunks prefills and queues
 * requests. */
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

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    Model m;
    CHECK(model_load(&m, NULL, 1, 0) == 0, "default model: %s", dcp_error());
    compare(&m, 0.0f, 1.0f, "greedy");
    compare(&m, 0.9f, 0.95f, "sampled");
    compare(&m, 1.0f, 1.0f, "sampled-full");
    model_free(&m);
    MPI_Finalize();
    return test_finish("test_batch");
}
