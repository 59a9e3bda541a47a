/* The scheduler without a model: admission, chunking, preemption order,
 * block accounting and capacity, driven step by step with made-up sampled
 * tokens. */
#include "kvcache.h"
#include "scheduler.h"
#include "testutil.h"

static Config cfg_no_eos(void)
{
    Config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 100;
    return c;
}

/* tables of running requests cover what they store; the pool adds up */
static void check_accounting(const Scheduler *s, const char *when)
{
    int held = 0;
    for (int i = 0; i < s->rs->n; i++) held += s->seq[i].table.n;
    CHECK(held == pool_used(s->pool) && pool_used(s->pool) <= s->pool->n_blocks, "%s: tables hold %d blocks, pool %d/%d",
          when, held, pool_used(s->pool), s->pool->n_blocks);
    for (int k = 0; k < s->n_running; k++) {
        int r = s->running[k];
        CHECK(s->seq[r].table.n >= kv_blocks_for(s->topo, s->seq[r].computed, s->pool->block_size),
              "%s: request %d stores %d positions in %d blocks", when, r, s->seq[r].computed, s->seq[r].table.n);
    }
}

/* runs to the end; fake token = 7 + request; returns steps */
static int drive(Scheduler *s, StepPlan *p, int *max_running)
{
    int steps = 0, sampled[64];
    while (scheduler_plan(s, p)) {
        CHECK(p->nc > 0, "step %d made no progress", steps);
        if (p->nc == 0) break;
        CHECK(p->T <= s->max_batched_tokens, "step %d: %d tokens over the budget %d", steps, p->T, s->max_batched_tokens);
        CHECK(p->nc <= s->max_num_seqs, "step %d: %d requests over --max-num-seqs", steps, p->nc);
        check_accounting(s, "planned");
        for (int i = 0; i < p->nc; i++) sampled[i] = 7 + p->req[i];
        scheduler_commit(s, p, sampled, steps);
        if (p->nc > *max_running) *max_running = p->nc;
        check_accounting(s, "committed");
        steps++;
    }
    return steps;
}

static void test_admission_and_chunks(void)
{
    Config c = cfg_no_eos();
    Topology t = {.world_size = 1, .tp = 1, .dcp = 1, .dp = 1, .interleave = 1};
    BlockPool pool;
    pool_init(&pool, 1000, 4);
    RequestSet rs = {0};
    int ids[40] = {0};
    for (int i = 0; i < 5; i++) add_request(&rs, ids, 10 + 5 * i, 3, 0, 1, 0);
    Result res[5];
    memset(res, 0, sizeof res);
    SchedulerLimits o = {.max_model_len = 1000, .max_num_seqs = 2, .max_batched_tokens = 16};
    Scheduler s;
    scheduler_init(&s, &rs, res, &c, &t, &pool, &o);
    StepPlan p;
    plan_init(&p, &o);
    /* step 1: request 0 (10 tokens) whole, request 1 (15) chunked to 6 */
    scheduler_plan(&s, &p);
    CHECK(p.nc == 2 && p.req[0] == 0 && p.req[1] == 1 && p.chunks[0].n == 10 && p.chunks[1].n == 6 &&
              p.samples[0] == 1 && p.samples[1] == 0 && p.prefill_tokens == 16 && p.T == 16,
          "first step: FIFO, chunked under the budget");
    int tok[2] = {50, 51};
    scheduler_commit(&s, &p, tok, 0);
    /* step 2: request 0 decodes one token, request 1 continues its prefill */
    scheduler_plan(&s, &p);
    CHECK(p.nc == 2 && p.chunks[0].n == 1 && p.chunks[0].pos0 == 10 && p.tokens[0] == 50 && p.chunks[1].pos0 == 6 &&
              p.chunks[1].n == 9 && p.decode_tokens == 1 && p.prefill_tokens == 9,
          "second step: decode first, then the rest of the prompt");
    CHECK(s.tail - s.head == 3, "max-num-seqs 2 keeps three waiting");
    scheduler_commit(&s, &p, tok, 1);
    int max_running = 0;
    drive(&s, &p, &max_running);
    CHECK(max_running == 2, "never more than --max-num-seqs");
    for (int i = 0; i < 5; i++)
        CHECK(res[i].n == 3 && !strcmp(res[i].finish_reason, "length"), "request %d: %d tokens", i, res[i].n);
    CHECK(pool_used(&pool) == 0, "all blocks free after the run (%d used)", pool_used(&pool));
    plan_free(&p);
    scheduler_free(&s);
    results_free(res, 5);
    requests_free(&rs);
    pool_free_all(&pool);
}

static void test_preemption(void)
{
    Config c = cfg_no_eos();
    Topology t = {.world_size = 1, .tp = 1, .dcp = 1, .dp = 1, .interleave = 1};
    BlockPool pool;
    pool_init(&pool, 6, 4); /* 24 positions */
    RequestSet rs = {0};
    int ids[16] = {0};
    /* three requests of 7 prompt tokens and 8 output tokens: 15 positions
     * (4 blocks) each, 12 blocks together: they cannot all stay */
    for (int i = 0; i < 3; i++) add_request(&rs, ids, 7, 8, 0, 1, 0);
    Result res[3];
    memset(res, 0, sizeof res);
    SchedulerLimits o = {.max_model_len = 1000, .max_num_seqs = 8, .max_batched_tokens = 64};
    Scheduler s;
    scheduler_init(&s, &rs, res, &c, &t, &pool, &o);
    StepPlan p;
    plan_init(&p, &o);
    scheduler_plan(&s, &p);
    CHECK(p.nc == 3 && pool_used(&pool) == 6, "all three admitted with 2 blocks each (%d running, %d used)", p.nc,
          pool_used(&pool));
    int tok[3] = {1, 2, 3};
    scheduler_commit(&s, &p, tok, 0);
    /* positions 7 and 8 fit in the second block; position 9 needs a third */
    scheduler_plan(&s, &p);
    scheduler_commit(&s, &p, tok, 1);
    scheduler_plan(&s, &p);
    CHECK(p.preempted == 1 && s.n_running == 2 && s.running[0] == 0 && s.running[1] == 1 &&
              s.waiting[s.head] == 2 && s.seq[2].computed == 0 && s.seq[2].table.n == 0,
          "the most recently admitted request (2) is preempted to the front of the queue");
    CHECK(p.nc == 2 && pool_used(&pool) == 6, "the step runs the two others, blocks all used");
    scheduler_commit(&s, &p, tok, 2);
    int max_running = 0;
    drive(&s, &p, &max_running);
    CHECK(s.preemptions >= 1, "preemptions counted (%lld)", s.preemptions);
    for (int i = 0; i < 3; i++)
        CHECK(res[i].n == 8 && !strcmp(res[i].finish_reason, "length"), "request %d: %d tokens after preemption", i,
              res[i].n);
    CHECK(res[2].tokens[0] == 3 && res[2].tokens[1] == 3, "the preempted request keeps its first output tokens");
    CHECK(pool_used(&pool) == 0, "all blocks free after the run");
    plan_free(&p);
    scheduler_free(&s);
    results_free(res, 3);
    requests_free(&rs);
    pool_free_all(&pool);
}

static void test_never_fits(void)
{
    Config c = cfg_no_eos();
    Topology t = {.world_size = 1, .tp = 1, .dcp = 1, .dp = 1, .interleave = 1};
    BlockPool pool;
    pool_init(&pool, 4, 4); /* 16 positions */
    RequestSet rs = {0};
    int ids[32] = {0};
    add_request(&rs, ids, 10, 4, 0, 1, 0);  /* 14 positions: fits */
    add_request(&rs, ids, 20, 4, 0, 1, 0);  /* 24: never */
    Result res[2];
    memset(res, 0, sizeof res);
    SchedulerLimits o = {.max_model_len = 1000, .max_num_seqs = 8, .max_batched_tokens = 64};
    Scheduler s;
    scheduler_init(&s, &rs, res, &c, &t, &pool, &o);
    CHECK(rs.r[1].error && strstr(rs.r[1].error, "24 positions need 6 KV blocks of 4 per rank, the cache has 4") &&
              !rs.r[0].error,
          "the request that can never fit fails alone: %s", rs.r[1].error ? rs.r[1].error : "(none)");
    StepPlan p;
    plan_init(&p, &o);
    int max_running = 0;
    drive(&s, &p, &max_running);
    CHECK(res[0].n == 4 && !strcmp(res[1].finish_reason, "error"), "the other completes");
    plan_free(&p);
    scheduler_free(&s);
    results_free(res, 2);
    requests_free(&rs);
    pool_free_all(&pool);
}

/* docs/design.md, "Where a token's KV lives": a logical block spans B x N positions */
static void test_capacity(void)
{
    for (int N = 1; N <= 8; N *= 2)
        for (int I = 1; I <= 4; I *= 2) {
            Topology t = {.tp = 8, .dcp = N, .interleave = I};
            int B = 16;
            /* a sequence of len positions needs ceil(len / (B N)) blocks when I divides B */
            for (int len = 1; len < 300; len += 7) {
                int want = (len + B * N - 1) / (B * N);
                CHECK(kv_blocks_for(&t, len, B) == want, "dcp %d I %d len %d: %d blocks, want %d", N, I, len,
                      kv_blocks_for(&t, len, B), want);
            }
        }
    size_t bytes;
    CHECK(parse_bytes("512M", &bytes) == 0 && bytes == 512u << 20, "512M");
    CHECK(parse_bytes("2G", &bytes) == 0 && bytes == (size_t)2 << 30, "2G");
    CHECK(parse_bytes("1.5KiB", &bytes) == 0 && bytes == 1536, "1.5KiB");
    CHECK(parse_bytes("12x", &bytes) == -1 && parse_bytes("-1G", &bytes) == -1, "bad sizes");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    test_admission_and_chunks();
    test_preemption();
    test_never_fits();
    test_capacity();
    MPI_Finalize();
    return test_finish("test_scheduler");
}
