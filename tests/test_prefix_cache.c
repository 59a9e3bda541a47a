/* Prefix caching: the pool's reference counts, LRU eviction and records;
 * hash collisions that must not match; and, through the engine, sessions
 * sharing long histories whose tokens are the same with and without the
 * cache, with exactly the cached positions the blocks allow.
 *
 * Built twice: tests/test_prefix_cache, and tests/test_prefix_collide with
 * kvcache.c compiled for 2-bit hashes (-DDCP_PREFIX_HASH_BITS=2), where
 * nearly every block collides with others and only the full comparison of
 * the key keeps requests apart. */
#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "kvcache.h"
#include "model.h"
#include "testutil.h"

/* ---- the pool ---------------------------------------------------------- */

static void check_free(const BlockPool *p, int n_free, int n_lru, long long shared, const char *when)
{
    CHECK(p->n_free == n_free && p->n_lru == n_lru && p->shared == shared,
          "%s: %d free (want %d), %d cached free (want %d), %lld shared references (want %lld)", when, p->n_free,
          n_free, p->n_lru, n_lru, p->shared, shared);
}

static void pool_records(void)
{
    BlockPool p;
    pool_init(&p, 6, 2);
    pool_prefix_caching(&p, 1, 1, 1, DTYPE_F32);
    BlockTable a = {0}, b = {0}, c = {0};
    int t0[2] = {1, 2}, t1[2] = {3, 4}, t2[2] = {5, 6};
    CHECK(table_reserve(&p, &a, 3) == 0 && a.ids[0] == 0 && a.ids[1] == 1 && a.ids[2] == 2, "fresh ids, lowest first");
    uint64_t h0 = prefix_hash(&p, p.root, t0), h1 = prefix_hash(&p, h0, t1);
    uint64_t s0 = prefix_record(&p, a.ids[0], h0, 0, t0), s1 = prefix_record(&p, a.ids[1], h1, s0, t1);
    CHECK(s0 && s1 && s0 != s1, "records get distinct serials");
    CHECK(prefix_find(&p, h0, 0, t0) == 0 && prefix_find(&p, h1, s0, t1) == 1, "recorded blocks are found");
    CHECK(prefix_find(&p, h1, 0, t1) == -1, "the second block's tokens at the start are not the second block");
    CHECK(prefix_find(&p, prefix_hash(&p, h0, t2), s0, t2) == -1, "other tokens after the first block: no match");
    /* an identical record on another block keeps the first */
    CHECK(prefix_record(&p, a.ids[2], h0, 0, t0) == s0 && prefix_serial(&p, 2) == 0,
          "a duplicate stays unrecorded and stands for the existing record");

    int shared[2] = {0, 1};
    CHECK(table_share_reserve(&p, &b, shared, 2, 3) == 0 && b.n == 3 && b.ids[0] == 0 && b.ids[1] == 1 && b.ids[2] == 3,
          "b shares blocks 0 and 1 and takes block 3");
    CHECK(p.ref[0] == 2 && p.ref[1] == 2 && p.ref[3] == 1, "reference counts 2, 2, 1");
    check_free(&p, 2, 0, 2, "a and b held");
    table_release(&p, &a);
    check_free(&p, 3, 0, 0, "a released (block 2 never cached, 0 and 1 still b's)");
    table_release(&p, &b);
    check_free(&p, 6, 2, 0, "b released: blocks 0 and 1 stay cached");
    CHECK(p.lru_head == 1 && p.lru_tail == 0, "a table's last block is the first to be evicted (head %d, tail %d)",
          p.lru_head, p.lru_tail);

    /* a table that does not fit changes nothing */
    CHECK(table_share_reserve(&p, &c, shared, 2, 7) == -1 && c.n == 0, "7 blocks do not fit 6");
    check_free(&p, 6, 2, 0, "after the refusal");
    /* allocation takes never-cached blocks before evicting */
    CHECK(table_reserve(&p, &c, 4) == 0 && c.ids[0] == 2 && c.ids[1] == 3 && c.ids[2] == 4 && c.ids[3] == 5,
          "never-cached blocks 2..5 first");
    CHECK(prefix_find(&p, h0, 0, t0) == 0 && prefix_find(&p, h1, s0, t1) == 1 && p.evictions == 0,
          "both cached blocks survive");
    CHECK(table_reserve(&p, &c, 5) == 0 && c.ids[4] == 1 && p.evictions == 1, "then the least recently released");
    CHECK(prefix_find(&p, h1, s0, t1) == -1 && prefix_find(&p, h0, 0, t0) == 0, "the evicted block is forgotten");
    /* a cached block no table holds comes back into use */
    BlockTable d = {0};
    int first[1] = {0};
    CHECK(table_share_reserve(&p, &d, first, 1, 1) == 0 && p.ref[0] == 1, "block 0 revived");
    check_free(&p, 0, 0, 0, "everything held");
    CHECK(table_share_reserve(&p, &b, first, 1, 2) == -1 && p.ref[0] == 1, "no block left for b's second");
    table_release(&p, &c);
    table_release(&p, &d);
    check_free(&p, 6, 1, 0, "all released");
    table_free(&a);
    table_free(&b);
    table_free(&c);
    table_free(&d);
    pool_free_all(&p);
}

/* Blocks whose hashes collide (all of them, in the 2-bit build) match only
 * their own tokens after their own parent. */
static void collisions(void)
{
    enum { N = 300, BT = 4 };
    BlockPool p;
    pool_init(&p, N, BT);
    pool_prefix_caching(&p, 1, 1, 1, DTYPE_F32);
    BlockTable t = {0};
    CHECK(table_reserve(&p, &t, N) == 0, "N blocks");
    static int tok[N][BT];
    uint64_t h[N], serial[N], st = 5;
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < BT; j++) tok[i][j] = (int)(splitmix64(&st) % 1000);
        tok[i][0] = i; /* distinct blocks */
        h[i] = prefix_hash(&p, p.root, tok[i]);
        int seen = 0;
        for (int k = 0; k < i; k++) seen |= h[k] == h[i];
        distinct += !seen;
        serial[i] = prefix_record(&p, t.ids[i], h[i], 0, tok[i]);
    }
    if (DCP_PREFIX_HASH_BITS < 64)
        CHECK(distinct <= 1 << (DCP_PREFIX_HASH_BITS & 31), "%d-bit hashes: %d distinct values", DCP_PREFIX_HASH_BITS, distinct);
    else
        CHECK(distinct == N, "64-bit hashes of %d distinct blocks: %d distinct values", N, distinct);
    int right = 0, wrong = 0;
    for (int i = 0; i < N; i++) {
        right += prefix_find(&p, h[i], 0, tok[i]) == t.ids[i];
        /* the same tokens after another block: never cached */
        wrong += prefix_find(&p, prefix_hash(&p, h[(i + 1) % N], tok[i]), serial[(i + 1) % N], tok[i]) != -1;
        /* other tokens with a colliding hash */
        int other[BT];
        memcpy(other, tok[i], sizeof other);
        other[BT - 1] ^= 1;
        wrong += prefix_find(&p, h[i], 0, other) != -1;
    }
    CHECK(right == N && wrong == 0, "%d of %d blocks found as themselves, %d false matches", right, N, wrong);
    table_release(&p, &t);
    table_free(&t);
    pool_free_all(&p);
}

/* ---- through the engine ------------------------------------------------ */

typedef struct {
    int max_num_seqs, max_batched;
    size_t kv_memory; /* 0: the engine's default */
    int caching;
} RunConf;

typedef struct {
    long long prefill, cached, preemptions, evictions;
} RunStats;

static void run(const Model *m, RequestSet *rs, Result *res, const RunConf *rc, RunStats *out)
{
    Timings tm = {0};
    EngineOptions eo = {.kv_cache_memory = rc->kv_memory, .block_size = 16};
    Engine e;
    engine_init(&e, m, backend_cpu(), NULL, &eo, &tm, NULL);
    GenOptions go = {.max_model_len = m->cfg.max_seq_len, .max_num_seqs = rc->max_num_seqs,
                     .max_batched_tokens = rc->max_batched, .prefix_caching = rc->caching};
    GenStats gs;
    generate(&e, rs, res, &go, &gs);
    CHECK(gs.kv_blocks_left == 0 && e.att.pool.n_free == e.att.pool.n_blocks, "all KV blocks released");
    *out = (RunStats){.preemptions = gs.preemptions, .evictions = gs.evictions};
    for (int i = 0; i < gs.n_steps; i++) {
        out->prefill += gs.steps[i].prefill_tokens;
        out->cached += gs.steps[i].cached_tokens;
    }
    free(gs.steps);
    engine_free(&e);
}

enum { SESSIONS = 3, TURNS = 4, NREQ = SESSIONS * TURNS, BT = 16 };

/* Agentic sessions: a shared system prompt, then per session a history
 * that each turn extends by a tool result; turns in rounds (every
 * session's turn 1, then every turn 2, ...). Session 1 samples (seeded). */
static void sessions(RequestSet *rs, int vocab)
{
    memset(rs, 0, sizeof *rs);
    static int hist[SESSIONS][1024];
    int len[SESSIONS] = {0}, sys = 53;
    uint64_t st = 77;
    for (int j = 0; j < sys; j++) hist[0][j] = (int)(splitmix64(&st) % (uint64_t)vocab);
    for (int s = 0; s < SESSIONS; s++) {
        memcpy(hist[s], hist[0], sizeof(int) * sys);
        len[s] = sys;
    }
    for (int t = 0; t < TURNS; t++)
        for (int s = 0; s < SESSIONS; s++) {
            int add = 21 + 9 * s + 13 * t;
            for (int j = 0; j < add; j++) hist[s][len[s]++] = (int)(splitmix64(&st) % (uint64_t)vocab);
            add_request(rs, hist[s], len[s], 12 + 5 * s, s == 1 ? 0.8f : 0.0f, 0.95f, 300 + t * SESSIONS + s);
        }
}

/* the most positions of request j's prompt that whole blocks stored by
 * requests 0..j-1 hold (each stored its prompt and all its output but the
 * last token), short of j's last prompt token */
static int reusable(const RequestSet *rs, const Result *res, int j)
{
    const Request *q = &rs->r[j];
    int best = 0;
    for (int i = 0; i < j; i++) {
        const Request *o = &rs->r[i];
        int stored = o->n_prompt + res[i].n - 1, l = 0;
        while (l < q->n_prompt && l < stored && q->prompt_tokens[l] == (l < o->n_prompt ? o->prompt_tokens[l]
                                                                                           : res[i].tokens[l - o->n_prompt]))
            l++;
        int blocks = l / BT;
        best = blocks > best ? blocks : best;
    }
    int most = (q->n_prompt - 1) / BT;
    return (best < most ? best : most) * BT;
}

static int same_tokens(const Result *a, const Result *b) { return a->n == b->n && !memcmp(a->tokens, b->tokens, sizeof(int) * a->n); }

static void session_runs(const Model *m)
{
    RequestSet rs;
    sessions(&rs, m->cfg.vocab_size);
    long long prompt = 0;
    for (int i = 0; i < rs.n; i++) prompt += rs.r[i].n_prompt;
    Result ref[NREQ], res[NREQ];
    RunStats rf, st;
    run(m, &rs, ref, &(RunConf){256, 2048, 0, 0}, &rf);
    CHECK(rf.cached == 0 && rf.prefill == prompt, "without caching every prompt position is computed (%lld of %lld)",
          rf.prefill, prompt);

    /* one request at a time: each finds whatever earlier ones stored */
    run(m, &rs, res, &(RunConf){1, 2048, 0, 1}, &st);
    long long want_cached = 0;
    int exact = 1, same = 1;
    for (int i = 0; i < NREQ; i++) {
        int want = reusable(&rs, res, i);
        want_cached += want;
        if (res[i].num_cached_tokens != want) {
            exact = 0;
            fprintf(stderr, "  request %d: %d cached, want %d\n", i, res[i].num_cached_tokens, want);
        }
        same &= same_tokens(&res[i], &ref[i]);
    }
    CHECK(exact && want_cached > prompt / 2, "max-num-seqs 1: every request's cached positions as its blocks allow (%lld "
                                              "of %lld)",
          want_cached, prompt);
    CHECK(same, "max-num-seqs 1: the same tokens as without the cache");
    CHECK(st.cached == want_cached && st.prefill == prompt - want_cached && !st.preemptions,
          "steps: %lld cached + %lld computed = %lld prompt positions", st.cached, st.prefill, prompt);
    results_free(res, NREQ);

    /* two at a time, four with chunked prefills (a later turn meets the
     * blocks its earlier turn has stored so far), and all at once (every
     * prompt in the first step: nothing cached yet) */
    RunConf confs[] = {{2, 2048, 0, 1}, {4, 40, 0, 1}, {256, 2048, 0, 1}};
    for (size_t k = 0; k < sizeof confs / sizeof *confs; k++) {
        run(m, &rs, res, &confs[k], &st);
        int same_all = 1;
        long long cached = 0;
        for (int i = 0; i < NREQ; i++) {
            same_all &= same_tokens(&res[i], &ref[i]);
            cached += res[i].num_cached_tokens;
        }
        int all_at_once = confs[k].max_num_seqs >= NREQ;
        CHECK(same_all && (cached > 0) != all_at_once && cached % BT == 0 && st.cached == cached &&
                  st.prefill == prompt - cached,
              "max-num-seqs %d, %d tokens a step: the same tokens, %lld positions cached", confs[k].max_num_seqs,
              confs[k].max_batched, cached);
        results_free(res, NREQ);
    }

    /* a cache too small for the sessions: blocks are evicted, requests
     * preempted, and a readmitted request finds its own blocks again */
    size_t per_block = 16 * 1024; /* the default model: 1 KiB of K/V per position */
    run(m, &rs, res, &(RunConf){6, 2048, 24 * per_block, 1}, &st);
    int same_all = 1;
    long long first = 0;
    for (int i = 0; i < NREQ; i++) {
        same_all &= same_tokens(&res[i], &ref[i]);
        first += res[i].num_cached_tokens;
    }
    CHECK(same_all, "24 blocks: the same tokens as without the cache");
    fprintf(stderr, "24 blocks: %lld preemptions, %lld evictions, %lld cached positions (%lld at first admissions)\n",
            st.preemptions, st.evictions, st.cached, first);
    CHECK(st.preemptions > 0 && st.evictions > 0, "24 blocks: %lld preemptions, %lld evictions", st.preemptions,
          st.evictions);
    CHECK(st.cached > first, "24 blocks: readmissions took %lld positions from the cache beyond the first admissions' %lld",
          st.cached - first, first);
    results_free(res, NREQ);
    Result tight[NREQ];
    run(m, &rs, tight, &(RunConf){6, 2048, 24 * per_block, 0}, &st);
    same_all = 1;
    for (int i = 0; i < NREQ; i++) same_all &= same_tokens(&tight[i], &ref[i]);
    CHECK(same_all && st.preemptions > 0, "24 blocks without the cache: the same tokens, %lld preemptions",
          st.preemptions);
    results_free(tight, NREQ);
    results_free(ref, NREQ);
    requests_free(&rs);
}

/* A request scoring its prompt computes every position, as vLLM does; its
 * prompt log-probabilities are those of a run without the cache. */
static void prompt_logprobs(const Model *m)
{
    RequestSet rs = {0};
    int ids[80];
    uint64_t st = 9;
    for (int j = 0; j < 80; j++) ids[j] = (int)(splitmix64(&st) % (uint64_t)m->cfg.vocab_size);
    add_request(&rs, ids, 80, 3, 0.0f, 1.0f, 1);
    add_request(&rs, ids, 70, 3, 0.0f, 1.0f, 2)->prompt_logprobs = 2;
    add_request(&rs, ids, 75, 3, 0.0f, 1.0f, 3);
    Result a[3], b[3];
    RunStats sa, sb;
    run(m, &rs, a, &(RunConf){1, 2048, 0, 1}, &sa);
    run(m, &rs, b, &(RunConf){1, 2048, 0, 0}, &sb);
    CHECK(a[1].num_cached_tokens == 0 && a[2].num_cached_tokens == 64, "prompt_logprobs: cached %d (want 0); next: %d (want 64)",
          a[1].num_cached_tokens, a[2].num_cached_tokens);
    int same = a[1].plp && b[1].plp && !memcmp(a[1].plp + 1, b[1].plp + 1, sizeof(float) * 69) &&
               !memcmp(a[1].ptop_id + 2, b[1].ptop_id + 2, sizeof(int) * 69 * 2);
    for (int i = 0; i < 3; i++) same &= same_tokens(&a[i], &b[i]);
    CHECK(same, "prompt_logprobs: the same scores and tokens as without the cache");
    results_free(a, 3);
    results_free(b, 3);
    requests_free(&rs);
}

/* Two prompts whose first blocks differ but whose blocks' truncated hashes
 * are equal, the second holding the first's later blocks: the second
 * finds nothing, and gets the tokens it gets alone. */
static void colliding_prompts(const Model *m)
{
    if (DCP_PREFIX_HASH_BITS >= 64) return; /* no collision to be found */
    BlockPool p;
    pool_init(&p, 1, BT);
    pool_prefix_caching(&p, 1, 1, 1, DTYPE_F32); /* as the engine's pool: one rank, a float32 cache */
    int a[64], b[64];
    uint64_t st = 3;
    for (int j = 0; j < 64; j++) a[j] = b[j] = (int)(splitmix64(&st) % (uint64_t)m->cfg.vocab_size);
    /* a new first block for b until its hash equals a's */
    uint64_t ha = prefix_hash(&p, p.root, a);
    do {
        for (int j = 0; j < BT; j++) b[j] = (int)(splitmix64(&st) % (uint64_t)m->cfg.vocab_size);
    } while (prefix_hash(&p, p.root, b) != ha || !memcmp(a, b, sizeof(int) * BT));
    pool_free_all(&p);
    RequestSet rs = {0}, alone = {0};
    add_request(&rs, a, 64, 6, 0.0f, 1.0f, 1);
    add_request(&rs, b, 64, 6, 0.0f, 1.0f, 1);
    add_request(&alone, b, 64, 6, 0.0f, 1.0f, 1);
    Result r[2], solo;
    RunStats s;
    run(m, &rs, r, &(RunConf){1, 2048, 0, 1}, &s);
    run(m, &alone, &solo, &(RunConf){1, 2048, 0, 0}, &s);
    CHECK(r[1].num_cached_tokens == 0 && same_tokens(&r[1], &solo),
          "colliding hashes: the second prompt takes %d cached positions (want 0), its tokens are its own",
          r[1].num_cached_tokens);
    results_free(r, 2);
    results_free(&solo, 1);
    requests_free(&rs);
    requests_free(&alone);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    pool_records();
    collisions();
    Model m;
    CHECK(model_load(&m, NULL, 1, 0) == 0, "default model: %s", dcp_error());
    session_runs(&m);
    prompt_logprobs(&m);
    colliding_prompts(&m);
    model_free(&m);
    MPI_Finalize();
    return test_finish(DCP_PREFIX_HASH_BITS < 64 ? "test_prefix_collide" : "test_prefix_cache");
}
