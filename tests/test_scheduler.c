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

/* spec_ngram_propose against the definition's drafts (tests/ref/make_ngram_refs.py) */
static void test_ngram_reference(void)
{
    char path[1024];
    const char *src = getenv("srcdir");
    snprintf(path, sizeof path, "%s/tests/data/spec/ngram_cases.txt", src ? src : ".");
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "%s missing", path);
    if (!f) return;
    char line[4096];
    int cases = 0, with_drafts = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        int lo, hi, k, n, used, toks[64], want[8], nw = 0, got[8];
        char *p = line;
        if (sscanf(p, "%d %d %d %d%n", &lo, &hi, &k, &n, &used) != 4) continue;
        p += used;
        for (int i = 0; i < n; i++, p += used) sscanf(p, "%d%n", &toks[i], &used);
        p = strchr(p, '|') + 1;
        while (sscanf(p, "%d%n", &want[nw], &used) == 1) nw++, p += used;
        int m = spec_ngram_propose(toks, n, lo, hi, k, got);
        CHECK(m == nw && !memcmp(got, want, sizeof(int) * (size_t)nw),
              "case %d (min %d max %d k %d, %d tokens): %d drafts, the reference has %d", cases, lo, hi, k, n, m, nw);
        cases++;
        with_drafts += nw > 0;
    }
    fclose(f);
    CHECK(cases == 400 && with_drafts > 100, "%d cases read, %d with drafts", cases, with_drafts);
}

/* A made-up model for speculative decoding: the token after a context of
 * len tokens copies the one 5 back, except at every 7th position */
static int copy_target(const int *ctx, int len) { return len % 7 ? ctx[len - 5] : (ctx[len - 1] + 1) % 50; }

/* Runs the requests to the end with the made-up model, each row seeing the
 * output so far and the drafts before it; returns the steps */
static int drive_target(Scheduler *s, StepPlan *p)
{
    int steps = 0, sampled[256], ctx[512];
    while (scheduler_plan(s, p) && p->nc) {
        for (int i = 0, t0 = 0; i < p->nc; t0 += p->chunks[i++].n) {
            if (!p->samples[i]) continue;
            int r = p->req[i], d = p->drafts[i], len = s->rs->r[r].n_prompt + s->res[r].n;
            memcpy(ctx, s->rs->r[r].prompt_tokens, sizeof(int) * (size_t)s->rs->r[r].n_prompt);
            if (s->res[r].n) memcpy(ctx + s->rs->r[r].n_prompt, s->res[r].tokens, sizeof(int) * (size_t)s->res[r].n);
            for (int j = 0; j <= d; j++) {
                sampled[p->row_end[i] - 1 - d + j] = copy_target(ctx, len);
                if (j < d) ctx[len++] = p->tokens[t0 + p->chunks[i].n - d + j];
            }
        }
        scheduler_commit(s, p, sampled, steps++);
        check_accounting(s, "committed");
    }
    return steps;
}

/* Speculative decoding's bookkeeping: the same outputs as without, in
 * fewer steps; drafts within max_tokens, the context and the step's
 * budget; rejected positions rolled back and their blocks returned; with
 * preemption (a pool too small for all) and prefix caching */
static void test_speculative(void)
{
    Config c = cfg_no_eos();
    Topology t = {.world_size = 1, .tp = 1, .dcp = 1, .dp = 1, .interleave = 1};
    int ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (i * 7) % 11;
    for (int caching = 0; caching < 2; caching++)
        for (int pool_blocks = 16; pool_blocks <= 200; pool_blocks += 184) {
            Result res[2][4];
            int steps[2];
            long long drafted = 0, accepted = 0, preemptions = 0;
            for (int spec = 0; spec < 2; spec++) {
                BlockPool pool;
                pool_init(&pool, pool_blocks, 4);
                pool_prefix_caching(&pool, caching, 1, 1, 0);
                RequestSet rs = {0};
                for (int i = 0; i < 4; i++) add_request(&rs, ids + i, 10 + i, 20 + 9 * i, 0, 1, 0);
                memset(res[spec], 0, sizeof res[spec]);
                SchedulerLimits o = {.max_model_len = 60, .max_num_seqs = 4, .max_batched_tokens = 24};
                Scheduler s;
                scheduler_init(&s, &rs, res[spec], &c, &t, &pool, &o);
                s.spec = (SpecConfig){spec ? SPEC_NGRAM : SPEC_NONE, 5, 2, 4};
                StepPlan p;
                plan_init(&p, &o);
                steps[spec] = drive_target(&s, &p);
                for (int i = 0; spec && i < 4; i++) {
                    drafted += res[1][i].spec_draft_tokens;
                    accepted += res[1][i].spec_accepted_tokens;
                }
                if (spec) preemptions = s.preemptions;
                CHECK(pool_used(&pool) == 0, "all blocks free after the run");
                plan_free(&p);
                scheduler_free(&s);
                requests_free(&rs);
                pool_free_all(&pool);
            }
            for (int i = 0; i < 4; i++) {
                int want = 20 + 9 * i < 60 - 10 - i ? 20 + 9 * i : 60 - 10 - i;
                CHECK(res[1][i].n == res[0][i].n && res[0][i].n == want &&
                          !memcmp(res[1][i].tokens, res[0][i].tokens, sizeof(int) * (size_t)res[0][i].n),
                      "caching %d, %d blocks: request %d: %d tokens with speculation, %d without (want %d)", caching,
                      pool_blocks, i, res[1][i].n, res[0][i].n, want);
            }
            CHECK(accepted > 0 && accepted < drafted && steps[1] < steps[0],
                  "caching %d, %d blocks: %lld of %lld drafts accepted, %d steps against %d", caching, pool_blocks,
                  accepted, drafted, steps[1], steps[0]);
            CHECK((pool_blocks == 16) == (preemptions > 0), "%d blocks: %lld preemptions", pool_blocks, preemptions);
            for (int spec = 0; spec < 2; spec++) results_free(res[spec], 4);
        }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    test_admission_and_chunks();
    test_preemption();
    test_never_fits();
    test_capacity();
    test_ngram_reference();
    test_speculative();
    MPI_Finalize();
    return test_finish("test_scheduler");
}
