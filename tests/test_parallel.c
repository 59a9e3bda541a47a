/* Every parallel layout against one rank. Runs as one MPI job of 8 ranks;
 * a layout of np < 8 ranks runs on the first np of them. For each layout
 * the ranks load their shards, generate, and compare with a single-rank run
 * made locally: token ids equal, logits (whole vocabulary, every position)
 * within 1e-3. Also: KV bytes per rank at dcp N against dcp 1, and the
 * bytes of every collective against the formulas of comm.h. */
#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "guarded_backend.h"
#include "kvcache.h"
#include "job.h"
#include "mkmodel_write.h"
#include "model.h"
#include "pmpi_count.h"
#include "testutil.h"
#include "transfer.h"
#include "topology.h"

typedef struct {
    int np, tp, dcp, I;
    MergeBackend merge;
    int budget; /* --max-num-batched-tokens; small values chunk the prefill */
    int tokens_only; /* no logits capture, so that the collectives are those of a normal run */
    int block_size;  /* 0: 16 (or the next multiple of I) */
    size_t kv_memory; /* per rank; 0: 64 MiB */
    int guarded;      /* the guarded backend: device-like buffers, staged MPI */
    double rel_tol;   /* >0: logits within this of one rank's, relative to the row's largest |logit| (else 1e-3 absolute) */
    DType kv_dtype;   /* of the KV cache */
    int ep;           /* --enable-expert-parallel: whole experts over the np ranks */
    int ref_ep;       /* the reference ran with it too (its reduction order is the EP one) */
    int nvfp4_act;    /* W4A4: emulated NVFP4 activations (EngineOptions.nvfp4_act) */
} Layout;

/* What a layout run reports besides its checks. */
typedef struct {
    long long kv_peak;     /* positions this rank held at once */
    long long preemptions;
    long long capacity;    /* logical KV positions of the DCP group */
    CommStats comm;
    /* expert parallelism: forward passes, idle passes, and the engine's
     * counts (MoeCounts: layers x experts; the caller frees them) */
    long long steps, idle;
    long long *sent, *received;
} LayoutRun;

typedef struct {
    int vocab;
    const int *global; /* request index in the full set, per subset index */
    float **logits;    /* per global request: (positions, vocab) */
    int *cap;          /* positions allocated per request */
} Capture;

static void capture(void *ctx, int request, int pos, const float *logits, int vocab)
{
    Capture *c = ctx;
    int g = c->global[request];
    if (pos < c->cap[g]) memcpy(c->logits[g] + (size_t)pos * vocab, logits, sizeof(float) * vocab);
}

static Capture capture_new(const RequestSet *rs, int vocab, const int *global)
{
    Capture c = {vocab, global, xcalloc((size_t)rs->n, sizeof(float *)), xcalloc((size_t)rs->n, sizeof(int))};
    for (int i = 0; i < rs->n; i++) {
        c.cap[i] = rs->r[i].n_prompt + rs->r[i].max_tokens;
        c.logits[i] = xcalloc((size_t)c.cap[i] * vocab, sizeof(float));
    }
    return c;
}

static void capture_free(Capture *c, int n)
{
    for (int i = 0; i < n; i++) free(c->logits[i]);
    free(c->logits);
    free(c->cap);
}

typedef struct {
    Result *res;
    Capture cap;
    int *identity;
} Reference;

static int rank_of_world(void)
{
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

/* One rank's run (every rank makes its own), with a KV cache of kv_dtype;
 * ep: with expert parallelism (over itself: whole experts, its order);
 * nvfp4_act: emulated W4A4 activations. */
static Reference reference_run_act(const char *path, RequestSet *rs, DType kv_dtype, int ep, int nvfp4_act)
{
    Model m;
    CHECK(model_load_ep(&m, path, 1, 0, ep, 0, "float32", 0) == 0, "load %s: %s", path, dcp_error());
    Topology t;
    if (ep) {
        topology_init(&t, MPI_COMM_SELF, 1, 1, 1);
        topology_enable_ep(&t);
    }
    Reference ref = {xcalloc((size_t)rs->n, sizeof(Result)), {0}, xmalloc(sizeof(int) * rs->n)};
    for (int i = 0; i < rs->n; i++) ref.identity[i] = i;
    ref.cap = capture_new(rs, m.cfg.vocab_size, ref.identity);
    Timings tm = {0};
    Engine e;
    EngineOptions eo = {.kv_dtype = kv_dtype, .nvfp4_act = nvfp4_act};
    CommStats cs = {0};
    engine_init(&e, &m, backend_cpu(), ep ? &t : NULL, &eo, &tm, ep ? &cs : NULL);
    GenOptions go = {.max_model_len = m.cfg.max_seq_len, .max_num_seqs = 64, .max_batched_tokens = 4096,
                     .on_logits = capture, .on_logits_ctx = &ref.cap};
    generate(&e, rs, ref.res, &go, NULL);
    engine_free(&e);
    model_free(&m);
    if (ep) topology_free(&t);
    return ref;
}

static Reference reference_run_ep(const char *path, RequestSet *rs, DType kv_dtype, int ep)
{
    return reference_run_act(path, rs, kv_dtype, ep, 0);
}

static Reference reference_run_kv(const char *path, RequestSet *rs, DType kv_dtype)
{
    return reference_run_ep(path, rs, kv_dtype, 0);
}

static Reference reference_run(const char *path, RequestSet *rs) { return reference_run_kv(path, rs, DTYPE_F32); }

/* Runs a layout on the first np ranks of world and checks it against ref.
 * Returns this rank's engine figures through kv_peak and stats. */
/* With ref NULL nothing is compared: the run's tokens and logits are
 * handed back in made (rank-local; dp must be 1). */
static void run_layout_into(const char *label, const char *path, RequestSet *rs, const Reference *ref, Layout L,
                            LayoutRun *out, Reference *made)
{
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rank < L.np, rank, &sub);
    if (rank < L.np) {
        Topology t;
        topology_init(&t, sub, L.tp, L.dcp, L.I);
        if (L.ep) topology_enable_ep(&t);
        Model m;
        CHECK(model_load_ep(&m, path, t.tp, t.tp_rank, L.ep ? t.ep : 0, t.ep_rank, "float32", 0) == 0, "load: %s",
              dcp_error());
        int *group = dp_assign(rs, t.dp, NULL);
        RequestSet mine;
        int *global = xmalloc(sizeof(int) * rs->n);
        dp_select(rs, group, t.dp_rank, &mine, global);
        Capture cap = capture_new(rs, m.cfg.vocab_size, global);
        Result *res = xcalloc((size_t)(mine.n ? mine.n : 1), sizeof(Result));
        CommStats cs = {0};
        Timings tm = {0};
        Engine e;
        /* blocks of 16 positions, or the multiple of the interleave next above */
        EngineOptions eo = {L.merge, L.kv_memory ? L.kv_memory : 64 << 20,
                            L.block_size ? L.block_size : (16 + L.I - 1) / L.I * L.I, 0, 0, L.kv_dtype, L.nvfp4_act};
        engine_init(&e, &m, L.guarded ? backend_guarded() : backend_cpu(), &t, &eo, &tm, &cs);
        GenOptions go = {.max_model_len = m.cfg.max_seq_len, .max_num_seqs = 64, .max_batched_tokens = L.budget,
                         .on_logits = L.tokens_only ? NULL : capture, .on_logits_ctx = &cap};
        GenStats gs;
        memset(pmpi_counts, 0, sizeof pmpi_counts);
        pmpi_counting = 1;
        generate(&e, &mine, res, &go, &gs);
        pmpi_counting = 0;
        CHECK(gs.kv_blocks_left == 0 && e.att.pool.n_free == e.att.pool.n_blocks, "%s: KV blocks released", label);
        if (out) {
            *out = (LayoutRun){.kv_peak = gs.kv_positions_peak, .preemptions = gs.preemptions,
                               .capacity = engine_kv_capacity(&e), .comm = cs, .steps = gs.n_steps,
                               .idle = e.moe_counts.idle_steps};
            if (L.ep) {
                size_t n = (size_t)m.cfg.n_layers * m.cfg.moe.n_routed_experts * sizeof(long long);
                out->sent = memcpy(xmalloc(n), e.moe_counts.sent, n);
                out->received = memcpy(xmalloc(n), e.moe_counts.received, n);
            }
        }
        free(gs.steps);
        engine_free(&e);
        double worst = 0;
        if (!ref) { /* hand the run back as a reference */
            made->res = res;
            made->cap = cap;
            made->identity = global;
            free(mine.r);
            free(group);
            model_free(&m);
            topology_free(&t);
            MPI_Comm_free(&sub);
            return;
        }
        for (int j = 0; j < mine.n; j++) {
            int g = global[j];
            const Request *q = &rs->r[g];
            CHECK(res[j].n == ref->res[g].n && !memcmp(res[j].tokens, ref->res[g].tokens, sizeof(int) * res[j].n),
                  "%s: request %s tokens differ from one rank", label, q->id);
            int positions = q->n_prompt + res[j].n - 1, V = m.cfg.vocab_size;
            for (int p = 0; p < positions; p++) {
                const float *a = cap.logits[g] + (size_t)p * V, *b = ref->cap.logits[g] + (size_t)p * V;
                double big = 0, d = 0;
                for (int x = 0; x < V; x++) {
                    big = fmax(big, fabs(b[x]));
                    d = fmax(d, fabs(a[x] - b[x]));
                }
                worst = fmax(worst, L.rel_tol > 0 ? d / (big > 0 ? big : 1) : d);
            }
        }
        if (!L.tokens_only) {
            double tol = L.rel_tol > 0 ? L.rel_tol : 1e-3;
            CHECK(worst <= tol, "%s: logits differ from one rank by %g (tolerance %g)", label, worst, tol);
            /* a layout of the canonical order (docs/design.md, "Same bits
             * at any layout"): tp dividing the K chunks, dcp the key
             * shards, and the reference's interleave, 1 */
            int canonical = m.shard.k_chunks % L.tp == 0 && m.shard.key_shards % L.dcp == 0 && L.I == 1 &&
                            L.ep == L.ref_ep;
            CHECK(!canonical || worst == 0, "%s: a canonical layout's logits differ from one rank's by %g", label, worst);
            if (rank == 0) fprintf(stderr, "%-44s max |logit - one rank| = %.2g\n", label, worst);
        }
        results_free(res, mine.n);
        free(res);
        capture_free(&cap, rs->n);
        free(global);
        free(mine.r);
        free(group);
        model_free(&m);
        topology_free(&t);
    }
    MPI_Comm_free(&sub);
}

static void run_layout(const char *label, const char *path, RequestSet *rs, const Reference *ref, Layout L,
                       LayoutRun *out)
{
    run_layout_into(label, path, rs, ref, L, out, NULL);
}

static void free_reference(Reference *ref, int n)
{
    results_free(ref->res, n);
    free(ref->res);
    capture_free(&ref->cap, n);
    free(ref->identity);
}

static const char *merge_name(MergeBackend m) { return m == MERGE_A2A ? "a2a" : "ag_rs"; }

/* a bf16 KV cache against the fp32 one on stories260K (logits span about
 * +-15), over the positions before the first differing greedy token */
#define BF16_KV_TOL 0.3
/* an FP8 E4M3 cache against the bf16 one, the same way: E4M3 keeps 3
 * mantissa bits to bf16's 7, so each K and V element moves by up to 2^-4
 * of itself instead of 2^-8, 16 times as far, and the bound is 16 x
 * BF16_KV_TOL */
#define FP8_KV_TOL (16 * BF16_KV_TOL)

/* The largest |logit| difference between two one-rank runs of rs with
 * different KV caches, over each request's positions up to its first
 * differing greedy token (the positions that saw the same inputs), printed
 * with the count of greedy tokens that agree. */
static double kv_cache_distance(const char *label, const char *against, const RequestSet *rs, const Reference *a,
                                const Reference *b, int vocab)
{
    double worst = 0;
    int same = 0, total = 0;
    for (int i = 0; i < rs->n; i++) {
        int n = a->res[i].n, agree = 0;
        while (agree < n && a->res[i].tokens[agree] == b->res[i].tokens[agree]) agree++;
        same += agree, total += n;
        for (size_t x = 0; x < (size_t)(rs->r[i].n_prompt + (agree < n ? agree : n - 1)) * vocab; x++)
            worst = fmax(worst, fabs(a->cap.logits[i][x] - b->cap.logits[i][x]));
    }
    if (rank_of_world() == 0)
        fprintf(stderr, "%-44s max |logit - %s KV| = %.2g, greedy tokens as %s: %d of %d\n", label, against, worst,
                against, same, total);
    return worst;
}

/* stories260K (8 query / 4 KV heads), REFERENCE-llama2c.txt cases 1 and 2 */
static void stories_layouts(void)
{
    char *path = shared_path("models/stories260K/stories260K.bin");
    char *tok_path = shared_path("models/stories260K/tok512.bin");
    char *ref_path = shared_path("models/stories260K/REFERENCE-llama2c.txt");
    if (!path_exists(path) || !path_exists(ref_path)) {
        fprintf(stderr, "stories260K not found under %s: its layouts skipped\n", shared_dir());
        free(path), free(tok_path), free(ref_path);
        return;
    }
    char *text;
    read_file(ref_path, &text, NULL);
    int want1[128], want2[300];
    CHECK(reference_tokens(text, 1, want1, 128) == 65 && reference_tokens(text, 2, want2, 300) == 257,
          "reference tokens");
    RequestSet rs = {0};
    add_request(&rs, want1, 5, 60, 0.0f, 1.0f, 0);
    add_request(&rs, want2, 1, 256, 0.0f, 1.0f, 0);
    Reference ref = reference_run(path, &rs);
    CHECK(!memcmp(ref.res[0].tokens, want1 + 5, 60 * sizeof(int)) && !memcmp(ref.res[1].tokens, want2 + 1, 256 * sizeof(int)),
          "one rank reproduces run.c's cases 1 and 2");
    static const int shapes[][4] = {{1, 1, 1, 1}, {2, 2, 1, 1}, {4, 4, 1, 1}, {8, 8, 1, 1},
                                    {8, 8, 2, 1}, {8, 4, 1, 2}, {8, 2, 1, 4}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int np = shapes[s][0], tp = shapes[s][1], dcp = shapes[s][2];
        for (int I = 1; I <= (dcp > 1 ? 3 : 1); I += 2)
            for (int mb = 0; mb < (dcp > 1 ? 2 : 1); mb++) {
                char label[96];
                snprintf(label, sizeof label, "stories260K np %d tp %d dcp %d dp %d I %d %s", np, tp, dcp,
                         shapes[s][3], I, merge_name((MergeBackend)mb));
                run_layout(label, path, &rs, &ref,
                           (Layout){.np = np, .tp = tp, .dcp = dcp, .I = I, .merge = (MergeBackend)mb, .budget = 2048},
                           NULL);
            }
    }
    /* a bf16 KV cache: against the fp32 cache, logits move by the rounding
     * of K and V to 8 mantissa bits; DCP shards and merges it as it does
     * fp32 (against one rank with the same cache) */
    Reference ref16 = reference_run_kv(path, &rs, DTYPE_BF16);
    double worst = kv_cache_distance("stories260K bf16 KV, one rank", "fp32", &rs, &ref16, &ref, 512);
    CHECK(worst <= BF16_KV_TOL, "bf16 KV cache: logits differ from the fp32 cache's by %g (tolerance %g)", worst,
          BF16_KV_TOL);
    /* an FP8 KV cache against the bf16 one: FP8_KV_TOL */
    Reference ref8 = reference_run_kv(path, &rs, DTYPE_F8_E4M3);
    worst = kv_cache_distance("stories260K fp8 KV, one rank", "bf16", &rs, &ref8, &ref16, 512);
    CHECK(worst <= FP8_KV_TOL, "fp8 KV cache: logits differ from the bf16 cache's by %g (tolerance %g)", worst,
          FP8_KV_TOL);
    free_reference(&ref8, rs.n);
    /* Across layouts the fp32 K and V differ in the last bits (the TP sums'
     * order), and a last-bit difference at a bf16 rounding boundary is a
     * bf16 step (2^-8): measured 0.023 at tp 8 dcp 2 (0.0016 of the row's
     * largest |logit|), so the tolerance is relative, 5e-3 of it; the
     * greedy tokens must still be the same. */
    for (int mb = 0; mb < 2; mb++) {
        char label[96];
        snprintf(label, sizeof label, "stories260K bf16 KV np 8 tp 8 dcp 2 I 3 %s", merge_name((MergeBackend)mb));
        run_layout(label, path, &rs, &ref16,
                   (Layout){.np = 8, .tp = 8, .dcp = 2, .I = 3, .merge = (MergeBackend)mb, .budget = 2048,
                            .kv_dtype = DTYPE_BF16, .rel_tol = 5e-3},
                   NULL);
    }
    free_reference(&ref16, rs.n);
    free_reference(&ref, rs.n);
    requests_free(&rs);
    free(text);
    free(path), free(tok_path), free(ref_path);
}

static char *write_mqa(const char *dir, int heads, int max_len)
{
    char *path = xmalloc(strlen(dir) + 32);
    sprintf(path, "%s/mqa%d-%d", dir, heads, max_len);
    ModelSpec s = {.layers = 4, .dim = 128, .heads = heads, .kv_heads = 1, .hidden = 172, .vocab = 300,
                   .max_len = max_len, .tied = 0, .eos = -1, .rope_theta = 10000.0f, .seed = 40 + heads};
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) CHECK(mkmodel_write_hf(&s, path, 0, 1) == 0, "mkmodel: %s", dcp_error());
    MPI_Barrier(MPI_COMM_WORLD);
    return path;
}

/* odd prompt lengths (never a multiple of dcp x I), four shorter than dcp 8;
 * greedy and sampled requests */
static void mqa_requests(RequestSet *rs, int vocab)
{
    static const int lens[] = {1, 3, 5, 7, 13, 29, 37};
    uint64_t st = 5;
    memset(rs, 0, sizeof *rs);
    for (int i = 0; i < 7; i++) {
        int ids[64];
        for (int j = 0; j < lens[i]; j++) ids[j] = (int)(splitmix64(&st) % (uint64_t)vocab);
        add_request(rs, ids, lens[i], 10 + i, i % 3 == 2 ? 0.8f : 0.0f, 0.95f, 100 + i);
    }
}

static void mqa_layouts(const char *path, int heads)
{
    RequestSet rs;
    mqa_requests(&rs, 300);
    Reference ref = reference_run(path, &rs);
    static const int budgets[] = {4096, 16, 7};
    for (int dcp = 1; dcp <= 8; dcp *= 2)
        for (int ii = 0; ii < (dcp > 1 ? 3 : 1); ii++) {
            int I = (int[]){1, 4, 16}[ii];
            for (int mb = 0; mb < (dcp > 1 ? 2 : 1); mb++) {
                char label[96];
                int budget = budgets[(ii + mb) % 3];
                snprintf(label, sizeof label, "MQA %d heads tp 8 dcp %d I %d %s budget %d", heads, dcp, I,
                         merge_name((MergeBackend)mb), budget);
                run_layout(label, path, &rs, &ref,
                           (Layout){.np = 8, .tp = 8, .dcp = dcp, .I = I, .merge = (MergeBackend)mb, .budget = budget},
                           NULL);
            }
        }
    free_reference(&ref, rs.n);
    requests_free(&rs);
}

/* KV positions held per rank at dcp N equal the dcp 1 figure over N, up to
 * one interleave unit per request, and exactly the sum of local lengths. */
static void kv_accounting(const char *path)
{
    static const int lens[] = {13, 29, 31, 7, 50};
    const int G = 10;
    RequestSet rs = {0};
    uint64_t st = 9;
    for (int i = 0; i < 5; i++) {
        int ids[64];
        for (int j = 0; j < lens[i]; j++) ids[j] = (int)(splitmix64(&st) % 300);
        add_request(&rs, ids, lens[i], G, 0.0f, 1.0f, 0);
    }
    Reference ref = reference_run(path, &rs);
    LayoutRun run = {0};
    run_layout("kv accounting: dcp 1", path, &rs, &ref, (Layout){.np = 8, .tp = 8, .dcp = 1, .I = 1, .budget = 4096}, &run);
    long long peak1 = run.kv_peak, capacity1 = run.capacity, peak;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long long total1 = 0;
    for (int i = 0; i < 5; i++) total1 += lens[i] + G - 1;
    CHECK(peak1 == total1, "dcp 1 holds every position: %lld vs %lld", peak1, total1);
    for (int N = 2; N <= 8; N *= 2)
        for (int I = 1; I <= 4; I *= 4) {
            char label[64];
            snprintf(label, sizeof label, "kv accounting: dcp %d I %d", N, I);
            run_layout(label, path, &rs, &ref, (Layout){.np = 8, .tp = 8, .dcp = N, .I = I, .budget = 4096}, &run);
            peak = run.kv_peak;
            if (I == 1)
                CHECK(run.capacity == N * capacity1, "%s: logical KV capacity %lld positions, dcp 1 has %lld",
                      label, run.capacity, capacity1);
            Topology t = {.dcp = N, .interleave = I};
            long long exact = 0;
            for (int i = 0; i < 5; i++) exact += kv_local_len(&t, lens[i] + G - 1, rank % N);
            CHECK(peak == exact, "%s rank %d: %lld positions, local lengths say %lld", label, rank, peak, exact);
            CHECK(llabs(peak * N - peak1) <= 5LL * I * N, "%s rank %d: %lld x %d vs %lld", label, rank, peak, N,
                  peak1);
            if (rank == 0)
                fprintf(stderr, "%s: rank 0 holds %lld positions (x%d = %lld; dcp 1: %lld)\n", label, peak, N,
                        peak * N, peak1);
        }
    free_reference(&ref, rs.n);
    requests_free(&rs);
}

/* Each collective's calls and bytes against comm.h's formulas, for one
 * request of P prompt tokens and G output tokens at tp 8, dcp 2. */
static void comm_bytes(const char *path, int heads)
{
    const int P = 11, G = 6, Lyr = 4, dim = 128, N = 2, tp = 8;
    const int qh = heads / tp, D = dim / heads;
    for (int sampled = 0; sampled < 2; sampled++)
        for (int mb = 0; mb < 2; mb++) {
            RequestSet rs = {0};
            int ids[P];
            for (int j = 0; j < P; j++) ids[j] = 17 * j % 300;
            add_request(&rs, ids, P, G, sampled ? 0.7f : 0.0f, 1.0f, 3);
            Reference ref = reference_run(path, &rs);
            LayoutRun run;
            char label[64];
            snprintf(label, sizeof label, "comm bytes: %s %s", merge_name((MergeBackend)mb), sampled ? "sampled" : "greedy");
            run_layout(label, path, &rs, &ref,
                       (Layout){.np = 8, .tp = tp, .dcp = N, .I = 1, .merge = (MergeBackend)mb, .budget = 4096,
                                .tokens_only = 1},
                       &run);
            const CommStats cs = run.comm;
            int rank, v0, vn;
            MPI_Comm_rank(MPI_COMM_WORLD, &rank);
            balanced_part(300, tp, rank % tp, &v0, &vn);
            long long steps[PHASE_N] = {1, G - 1}, T[PHASE_N] = {P, 1};
            long long formula_calls[COMM_N] = {0}, formula_bytes[COMM_N] = {0};
            for (int p = 0; p < PHASE_N; p++) {
                long long want_calls[COMM_N] = {0}, want_bytes[COMM_N] = {0};
                long long s = steps[p], n = T[p] * dim, rows = T[p] * qh;
                long long mine = n * (rank % tp + 1) / tp - n * (rank % tp) / tp; /* this rank's slice */
                /* two per layer, and the embedding's: each rank holds a
                 * slice of the vocabulary (as the LM head) */
                want_calls[COMM_tp_sum] = (2 * Lyr + 1) * s;
                want_bytes[COMM_tp_sum] = (2 * Lyr + 1) * s * 4 * (n - mine + (tp - 1) * mine);
                /* decode steps read the sharded cache; the prompt's one
                 * chunk (from position 0) is attended on every rank alone */
                long long ctx = p == PHASE_DECODE;
                want_calls[COMM_q_allgather] = ctx * Lyr * s;
                want_bytes[COMM_q_allgather] = ctx * Lyr * s * T[p] * qh * D * 4;
                if (mb == MERGE_AG_RS) { /* log2 N exchanges, N - 1 blocks sent in all */
                    want_calls[COMM_merge_exchange] = ctx * Lyr * s * (N == 2 ? 1 : N == 4 ? 2 : 3);
                    want_bytes[COMM_merge_exchange] = ctx * Lyr * s * (N - 1) * rows * (D + 1) * 4;
                } else {
                    want_calls[COMM_all_to_all] = ctx * Lyr * s;
                    want_bytes[COMM_all_to_all] = ctx * Lyr * s * N * rows * (D + 1) * 4;
                }
                /* one token chosen per step: MAXLOC, or the whole vocabulary gathered */
                want_calls[sampled ? COMM_logits_gather : COMM_argmax] = s;
                want_bytes[sampled ? COMM_logits_gather : COMM_argmax] = s * (sampled ? 4LL * vn : 8);
                for (int k = 0; k < COMM_N; k++) {
                    CHECK(cs.c[p][k].calls == want_calls[k] && cs.c[p][k].bytes == want_bytes[k],
                          "%s rank %d %s %s: %lld calls / %lld bytes, formula %lld / %lld", label, rank,
                          phase_names[p], comm_kind_names[k], cs.c[p][k].calls, cs.c[p][k].bytes, want_calls[k],
                          want_bytes[k]);
                    formula_calls[k] += want_calls[k];
                    formula_bytes[k] += want_bytes[k];
                }
            }
            /* what crossed MPI (counted by interposition) against the
             * formula and against the program's own counters */
            static const int kinds[PM_N][2] = {
                [PM_SUM] = {-1, -1},          [PM_MAXLOC] = {COMM_argmax, -1},
                [PM_ALLGATHER] = {COMM_q_allgather, -1}, [PM_SENDRECV] = {COMM_merge_exchange, -1},
                [PM_ALLTOALL] = {COMM_all_to_all, -1}, [PM_ALLGATHERV] = {COMM_logits_gather, -1},
                [PM_TP_SUM] = {COMM_tp_sum, -1}, [PM_MOE_DISPATCH] = {-1, -1}, [PM_MOE_COMBINE] = {-1, -1},
                [PM_MAX] = {-1, -1}};
            for (int k = 0; k < PM_N; k++) {
                long long fc = 0, fb = 0, sc = 0, sb = 0;
                for (int j = 0; j < 2; j++) {
                    int c = kinds[k][j];
                    if (c < 0) continue;
                    fc += formula_calls[c];
                    fb += formula_bytes[c];
                    for (int p = 0; p < PHASE_N; p++) {
                        sc += cs.c[p][c].calls;
                        sb += cs.c[p][c].bytes;
                    }
                }
                CHECK(pmpi_counts[k].calls == fc && pmpi_counts[k].bytes == fb && sc == fc && sb == fb,
                      "%s rank %d %s: %lld calls / %lld bytes crossed MPI, formula %lld / %lld, counted %lld / %lld",
                      label, rank, pm_names[k], pmpi_counts[k].calls, pmpi_counts[k].bytes, fc, fb, sc, sb);
            }
            free_reference(&ref, rs.n);
            requests_free(&rs);
        }
}

/* The engine run over buffers the host cannot touch (guarded_backend.h),
 * with collectives staged through host memory as on a GPU without
 * CUDA-aware MPI: the same tokens and logits as one rank. */
static void guarded_layouts(const char *path)
{
    RequestSet rs;
    mqa_requests(&rs, 300);
    Reference ref = reference_run(path, &rs);
    for (int mb = 0; mb < 2; mb++) {
        char label[96];
        snprintf(label, sizeof label, "guarded buffers, staged MPI: dcp 4 %s", merge_name((MergeBackend)mb));
        run_layout(label, path, &rs, &ref,
                   (Layout){.np = 8, .tp = 8, .dcp = 4, .I = 2, .merge = (MergeBackend)mb, .budget = 16, .guarded = 1},
                   NULL);
    }
    run_layout("guarded buffers, staged MPI: tp 4 dp 2", path, &rs, &ref,
               (Layout){.np = 8, .tp = 4, .dcp = 1, .I = 1, .budget = 4096, .guarded = 1}, NULL);
    free_reference(&ref, rs.n);
    requests_free(&rs);
}

/* Greedy outputs do not change when the KV budget forces preemptions:
 * block sizes 1, 16 and 64, token budgets 16, 256 and unlimited, dcp 1
 * and 4. Six requests whose outputs need one block more than their
 * prompts, in a pool that holds two prompts but not two outputs. */
static void preemption(const char *path)
{
    const int G = 16, Ns[] = {1, 4}, Bs[] = {1, 16, 64}, budgets[] = {16, 256, 4096};
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t per_position = kv_bytes_per_position(4, 1, 16, sizeof(float));
    for (int ni = 0; ni < 2; ni++)
        for (int bi = 0; bi < 3; bi++) {
            int N = Ns[ni], B = Bs[bi], span = B * N;
            Topology t = {.dcp = N, .interleave = 1};
            RequestSet rs = {0};
            uint64_t st = 77;
            int pool = 0;
            for (int i = 0; i < 6; i++) {
                int P = (span - 6 > 20 ? span - 6 : 20) + i, ids[300];
                for (int j = 0; j < P; j++) ids[j] = (int)(splitmix64(&st) % 300);
                add_request(&rs, ids, P, G, 0.0f, 1.0f, 0);
                /* the longest request alone, or two prompts: whichever is more */
                int need = kv_blocks_for(&t, P + G, B), two = 2 * kv_blocks_for(&t, P, B);
                pool = need > pool ? need : pool;
                pool = two > pool ? two : pool;
            }
            Reference ref = reference_run(path, &rs);
            for (int k = 0; k < 3; k++) {
                char label[96];
                snprintf(label, sizeof label, "preemption: dcp %d block %d budget %d, %d blocks", N, B, budgets[k],
                         pool);
                LayoutRun run;
                run_layout(label, path, &rs, &ref,
                           (Layout){.np = 8, .tp = 8, .dcp = N, .I = 1, .budget = budgets[k], .block_size = B,
                                    .kv_memory = (size_t)pool * B * per_position},
                           &run);
                CHECK(run.preemptions > 0, "%s: no preemption happened", label);
                if (rank == 0) fprintf(stderr, "%s: %lld preemption(s)\n", label, run.preemptions);
            }
            free_reference(&ref, rs.n);
            requests_free(&rs);
        }
}

/* A 4K-token prompt at tp 8 dcp 8, prefilled at once and in 256-token
 * chunks (the chunks' context part goes through the sharded attention as
 * decode does), gives one rank's tokens and logits. */
static void chunked_prefill_4k(const char *path)
{
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    RequestSet rs = {0};
    int *ids = xmalloc(sizeof(int) * 4096);
    uint64_t st = 4096;
    for (int j = 0; j < 4096; j++) ids[j] = (int)(splitmix64(&st) % 300);
    add_request(&rs, ids, 4096, 8, 0.0f, 1.0f, 0);
    free(ids);
    /* against one rank, prefilled in one chunk */
    Reference one = reference_run(path, &rs);
    run_layout("4K prompt at once, dcp 8", path, &rs, &one,
               (Layout){.np = 8, .tp = 8, .dcp = 8, .I = 1, .budget = 8192}, NULL);
    run_layout("4K prompt in 256-token chunks, dcp 8", path, &rs, &one,
               (Layout){.np = 8, .tp = 8, .dcp = 8, .I = 1, .budget = 256}, NULL);
    if (rank == 0) fprintf(stderr, "4K prompt: %d tokens generated by one rank, both dcp 8 runs checked against it\n",
                           one.res[0].n);
    free_reference(&one, rs.n);
    requests_free(&rs);
}

/* The Hugging Face families of tests/data/hf (test_hf_reference checks
 * them against transformers at one rank) at tp 2 and at tp 4 dcp 2 (2 KV
 * heads: 2 ranks per head), with 16-token steps, so that the prompt is
 * prefilled in chunks whose context part, under a sliding window too,
 * goes through the sharded attention: the same greedy tokens as one rank
 * and logits within 1e-4 of its, relative to the row's largest. */
/* The ids of DIR/prompt.txt (at most cap); their count. */
static int read_prompt(const char *dir, int *prompt, int cap)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    int n = 0;
    FILE *f = fopen(path, "r");
    while (f && n < cap && fscanf(f, "%d", &prompt[n]) == 1) n++;
    if (f) fclose(f);
    return n;
}

static void hf_layouts(void)
{
    static const char *cases[] = {"llama3", "rope_parameters", "linear", "yarn", "mistral_window", "qwen2_bias",
                                  "qwen3_qk_norm", "mlp_bias"};
    const char *src = getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : ".";
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/tests/data/hf/%s", src, cases[k]);
        int prompt[1024], n = read_prompt(dir, prompt, 1024);
        if (!CHECK_OK(n >= 300, "%s: no prompt in %s", cases[k], dir)) continue;
        RequestSet rs = {0};
        add_request(&rs, prompt, n, 32, 0.0f, 1.0f, 0);
        add_request(&rs, prompt + 100, 57, 20, 0.0f, 1.0f, 0);
        Reference ref = reference_run(dir, &rs);
        char label[96];
        snprintf(label, sizeof label, "%s: tp 2, 16-token steps", cases[k]);
        run_layout(label, dir, &rs, &ref, (Layout){.np = 2, .tp = 2, .dcp = 1, .I = 1, .budget = 16, .rel_tol = 1e-4},
                   NULL);
        snprintf(label, sizeof label, "%s: tp 4 dcp 2, 16-token steps", cases[k]);
        run_layout(label, dir, &rs, &ref,
                   (Layout){.np = 4, .tp = 4, .dcp = 2, .I = 1, .budget = 16, .rel_tol = 1e-4}, NULL);
        if (!strcmp(cases[k], "mistral_window")) {
            snprintf(label, sizeof label, "%s: tp 4 dcp 2, interleave 4, a2a", cases[k]);
            run_layout(label, dir, &rs, &ref,
                       (Layout){.np = 4, .tp = 4, .dcp = 2, .I = 4, .merge = MERGE_A2A, .budget = 16, .rel_tol = 1e-4},
                       NULL);
        }
        free_reference(&ref, rs.n);
        requests_free(&rs);
    }
}

/* The DeepSeek test model `name` (tests/data/deepseek) in dir, and four
 * greedy requests from its prompt; 0 (a failed check) without it. */
static int deepseek_requests(const char *name, char *dir, size_t size, RequestSet *rs)
{
    const char *src = getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : ".";
    snprintf(dir, size, "%s/tests/data/deepseek/%s", src, name);
    int prompt[1024], n = read_prompt(dir, prompt, 1024);
    if (!CHECK_OK(n >= 200, "%s: no prompt in %s", name, dir)) return 0;
    static const int start[] = {0, 100, 10, 50}, len[] = {0, 57, 120, 90}, gen[] = {32, 20, 24, 30};
    for (int i = 0; i < 4; i++) add_request(rs, prompt + start[i], len[i] ? len[i] : n, gen[i], 0.0f, 1.0f, 0);
    return 1;
}

/* DeepSeek-V2/V3 (tests/data/deepseek: MLA, one latent KV row per position,
 * and MoE layers): greedy tokens identical to one rank and logits within
 * 1e-4 at tp 2, tp 4 dcp 2, tp 4 dcp 4 and tp 8 dcp 8, interleave 1 and 16,
 * both merges, 16-token steps, and with a KV budget that forces
 * preemption; the latent bytes held per rank at dcp 8 are the dcp-1 figure
 * over 8 (up to an interleave unit per request) and the KV capacity is
 * exactly 8 times. */
static void deepseek_layouts(void)
{
    static const char *cases[] = {"v3_yarn", "v2_softmax"};
    const char *src = getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : ".";
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (size_t k = 0; k < 2; k++) {
        char dir[4096];
        RequestSet rs = {0};
        if (!deepseek_requests(cases[k], dir, sizeof dir, &rs)) continue;
        Reference ref = reference_run(dir, &rs);
        struct {
            int tp, dcp, I;
            MergeBackend merge;
            int budget;
        } L[] = {{2, 1, 1, MERGE_AG_RS, 16},  {4, 2, 16, MERGE_A2A, 16},  {4, 4, 1, MERGE_A2A, 4096},
                 {4, 4, 16, MERGE_AG_RS, 16}, {8, 8, 1, MERGE_AG_RS, 16}, {8, 8, 16, MERGE_A2A, 4096}};
        for (size_t j = 0; j < sizeof L / sizeof *L; j++) {
            if (k == 1 && j % 2) continue; /* V2: half of them */
            char label[128];
            snprintf(label, sizeof label, "deepseek %s: tp %d dcp %d, interleave %d, %s, %d-token steps", cases[k],
                     L[j].tp, L[j].dcp, L[j].I, merge_name(L[j].merge), L[j].budget);
            run_layout(label, dir, &rs, &ref,
                       (Layout){.np = L[j].tp, .tp = L[j].tp, .dcp = L[j].dcp, .I = L[j].I, .merge = L[j].merge,
                                .budget = L[j].budget, .rel_tol = 1e-4},
                       NULL);
        }
        if (k == 0) {
            /* KV accounting: every rank of tp 8 holds the whole latent cache
             * at dcp 1, an eighth of it at dcp 8 */
            LayoutRun one = {0}, eight = {0};
            run_layout("deepseek v3_yarn: kv accounting dcp 1", dir, &rs, &ref,
                       (Layout){.np = 8, .tp = 8, .dcp = 1, .I = 1, .budget = 4096, .rel_tol = 1e-4}, &one);
            run_layout("deepseek v3_yarn: kv accounting dcp 8", dir, &rs, &ref,
                       (Layout){.np = 8, .tp = 8, .dcp = 8, .I = 1, .budget = 4096, .rel_tol = 1e-4}, &eight);
            CHECK(eight.capacity == 8 * one.capacity, "MLA KV capacity at dcp 8: %lld positions, dcp 1: %lld",
                  eight.capacity, one.capacity);
            CHECK(llabs(eight.kv_peak * 8 - one.kv_peak) <= 8LL * rs.n, "MLA rank %d: %lld positions x 8 vs %lld", rank,
                  eight.kv_peak, one.kv_peak);
            if (rank == 0)
                fprintf(stderr, "deepseek v3_yarn: latent rows held at dcp 8: %lld (x8 = %lld; dcp 1: %lld), "
                                "capacity %lld vs %lld positions\n",
                        eight.kv_peak, eight.kv_peak * 8, one.kv_peak, eight.capacity, one.capacity);
            /* an FP8 latent cache, sharded by DCP at the canonical layouts:
             * the same bits as one rank with the same cache */
            Reference ref8 = reference_run_kv(dir, &rs, DTYPE_F8_E4M3);
            for (int mb = 0; mb < 2; mb++)
                run_layout(mb ? "deepseek v3_yarn: fp8 KV tp 8 dcp 8 a2a" : "deepseek v3_yarn: fp8 KV tp 4 dcp 4 ag_rs",
                           dir, &rs, &ref8,
                           (Layout){.np = mb ? 8 : 4, .tp = mb ? 8 : 4, .dcp = mb ? 8 : 4, .I = 1,
                                    .merge = (MergeBackend)mb, .budget = 16, .kv_dtype = DTYPE_F8_E4M3,
                                    .rel_tol = 1e-4},
                           NULL);
            free_reference(&ref8, rs.n);
            /* a KV budget below what the four requests need together */
            size_t per_position = kv_bytes_per_position(3, 1, 40, sizeof(float)) / 2;
            LayoutRun tight = {0};
            run_layout("deepseek v3_yarn: tp 8 dcp 8, 4 KV blocks (preemption)", dir, &rs, &ref,
                       (Layout){.np = 8, .tp = 8, .dcp = 8, .I = 1, .budget = 16, .block_size = 16,
                                .kv_memory = 4 * 16 * per_position, .rel_tol = 1e-4},
                       &tight);
            CHECK(tight.preemptions > 0, "the small KV budget preempted nothing");
            if (rank == 0) fprintf(stderr, "deepseek v3_yarn: %lld preemption(s) with 4 KV blocks\n", tight.preemptions);
            /* FP8 block-scaled weights, each rank holding its slices in
             * FP8, against the float32 twin at one rank: the same bits at
             * the canonical layouts */
            char fp8[4096], twin[4200];
            snprintf(fp8, sizeof fp8, "%s/tests/data/deepseek/v3_fp8", src);
            snprintf(twin, sizeof twin, "%s/tests/data/deepseek/v3_fp8_twin", src);
            Reference tref = reference_run(twin, &rs);
            run_layout("deepseek v3_fp8: tp 4 dcp 4 against its float32 twin", fp8, &rs, &tref,
                       (Layout){.np = 4, .tp = 4, .dcp = 4, .I = 1, .budget = 16, .rel_tol = 1e-4}, NULL);
            run_layout("deepseek v3_fp8: tp 8 dcp 8 against its float32 twin", fp8, &rs, &tref,
                       (Layout){.np = 8, .tp = 8, .dcp = 8, .I = 1, .budget = 16, .rel_tol = 1e-4}, NULL);
            free_reference(&tref, rs.n);
            /* INT4 W4A16 experts (compressed-tensors) and NVFP4 ones (as
             * compressed-tensors and as ModelOpt write them), the same way */
            static const char *const quantized[] = {"v3_int4", "v3_nvfp4", "v3_nvfp4_modelopt"};
            for (int qi = 0; qi < 3; qi++) {
                char label[128];
                snprintf(fp8, sizeof fp8, "%s/tests/data/deepseek/%s", src, quantized[qi]);
                snprintf(twin, sizeof twin, "%s_twin", fp8);
                tref = reference_run(twin, &rs);
                snprintf(label, sizeof label, "deepseek %s: tp 4 dcp 4 against its float32 twin", quantized[qi]);
                run_layout(label, fp8, &rs, &tref,
                           (Layout){.np = 4, .tp = 4, .dcp = 4, .I = 1, .budget = 16, .rel_tol = 1e-4}, NULL);
                snprintf(label, sizeof label, "deepseek %s: tp 8 dcp 8 against its float32 twin", quantized[qi]);
                run_layout(label, fp8, &rs, &tref,
                           (Layout){.np = 8, .tp = 8, .dcp = 8, .I = 1, .merge = MERGE_A2A, .budget = 16,
                                    .rel_tol = 1e-4},
                           NULL);
                free_reference(&tref, rs.n);
            }
        }
        free_reference(&ref, rs.n);
        requests_free(&rs);
    }
}

/* an FP8 latent cache with a checkpoint's scales against the fp32 cache on
 * v3_w4a4_mo (logits span about +-4): the mean |logit difference| over the
 * prompts' positions. The scales applied as they should be give 0.077
 * (scale 1: 0.088); a cache whose scores or outputs miss their scale,
 * about 0.97. */
#define W4A4_FP8_KV_MEAN 0.2

/* W4A4 NVFP4 checkpoints (tests/ref/make_w4a4_refs.py: compressed-tensors'
 * and ModelOpt's) at tp 4 dcp 4, without and with expert parallelism, on
 * v3_yarn's requests: weight-only, the bits of the float32 twin at one rank
 * (with EP: of the twin at one rank with EP); emulated activations, the
 * bits of one rank emulating them (which test_hf_reference holds to
 * compressed-tensors' own quantization of every expert's input). */
static void w4a4_layouts(void)
{
    const char *src = getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : ".";
    static const char *const names[] = {"v3_w4a4", "v3_w4a4_mo"};
    char dir[4096];
    RequestSet rs = {0};
    if (!deepseek_requests("v3_yarn", dir, sizeof dir, &rs)) return;
    for (int k = 0; k < 2; k++) {
        char q[4096], twin[4200], label[160];
        snprintf(q, sizeof q, "%s/tests/data/deepseek/%s", src, names[k]);
        snprintf(twin, sizeof twin, "%s_twin", q);
        for (int act = 0; act < 2; act++) {
            const char *how = act ? "emulated activations" : "weight-only";
            for (int ep = 0; ep < 2; ep++) {
                Reference ref = act ? reference_run_act(q, &rs, DTYPE_F32, ep, 1)
                                    : reference_run_act(twin, &rs, DTYPE_F32, ep, 0);
                snprintf(label, sizeof label, "deepseek %s %s: tp 4 dcp 4%s", names[k], how, ep ? " EP" : "");
                run_layout(label, q, &rs, &ref,
                           (Layout){.np = 4, .tp = 4, .dcp = 4, .I = 1, .budget = 16, .rel_tol = 1e-4, .ep = ep,
                                    .ref_ep = ep, .nvfp4_act = act},
                           NULL);
                if (!ep) { /* EP's order at one rank: the same tokens, logits within 1e-4 */
                    snprintf(label, sizeof label, "deepseek %s %s: one rank EP", names[k], how);
                    run_layout(label, q, &rs, &ref,
                               (Layout){.np = 1, .tp = 1, .dcp = 1, .I = 1, .budget = 16, .rel_tol = 1e-4, .ep = 1,
                                        .nvfp4_act = act},
                               NULL);
                }
                free_reference(&ref, rs.n);
            }
        }
        if (k == 1) { /* ModelOpt's FP8 KV scales, one per layer, with an FP8 cache */
            Reference f32 = reference_run_act(q, &rs, DTYPE_F32, 0, 0), f8 = reference_run_act(q, &rs, DTYPE_F8_E4M3, 0, 0);
            kv_cache_distance("deepseek v3_w4a4_mo fp8 KV (its scales)", "fp32", &rs, &f8, &f32, 256);
            double mean = 0;
            size_t count = 0;
            for (int i = 0; i < rs.n; i++)
                for (size_t x = 0; x < (size_t)rs.r[i].n_prompt * 256; x++, count++)
                    mean += fabs(f8.cap.logits[i][x] - f32.cap.logits[i][x]);
            mean /= (double)count;
            if (rank_of_world() == 0)
                fprintf(stderr, "deepseek v3_w4a4_mo fp8 KV (its scales): mean |logit - fp32 KV's| over the prompts %.3g\n",
                        mean);
            CHECK(mean <= W4A4_FP8_KV_MEAN, "v3_w4a4_mo: the FP8 cache with its scales moves the prompts' logits by %g on "
                                            "average (at most %g)", mean, (double)W4A4_FP8_KV_MEAN);
            run_layout("deepseek v3_w4a4_mo fp8 KV (its scales): tp 4 dcp 4", q, &rs, &f8,
                       (Layout){.np = 4, .tp = 4, .dcp = 4, .I = 1, .budget = 16, .rel_tol = 1e-4,
                                .kv_dtype = DTYPE_F8_E4M3},
                       NULL);
            run_layout("deepseek v3_w4a4_mo fp8 KV (its scales): tp 8 dcp 8 a2a", q, &rs, &f8,
                       (Layout){.np = 8, .tp = 8, .dcp = 8, .I = 1, .merge = MERGE_A2A, .budget = 16, .rel_tol = 1e-4,
                                .kv_dtype = DTYPE_F8_E4M3},
                       NULL);
            free_reference(&f32, rs.n);
            free_reference(&f8, rs.n);
        }
    }
    requests_free(&rs);
}

/* Expert parallelism (--enable-expert-parallel) on DeepSeek-V3 and V2:
 * greedy tokens identical to one rank's and logits within 1e-4 of them
 * at tp 4 dcp 4, tp 2 dp 2 and tp 8 dcp 8 (16-token steps, so chunked
 * prefill; a KV budget that preempts; staged device-like buffers), and
 * the same bits at every EP layout as one rank with EP. Then what
 * crossed MPI against the formulas from the routed counts. */
static void expert_parallel_layouts(void)
{
    static const char *cases[] = {"v3_yarn", "v2_softmax"};
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (size_t k = 0; k < 2; k++) {
        char dir[4096];
        RequestSet rs = {0};
        if (!deepseek_requests(cases[k], dir, sizeof dir, &rs)) continue;
        /* one rank, and one rank with EP (whole experts, the EP layouts' bits) */
        Reference ref = reference_run(dir, &rs), one_ep = reference_run_ep(dir, &rs, DTYPE_F32, 1);
        char label[128];
        snprintf(label, sizeof label, "deepseek %s EP: one rank with EP against one rank", cases[k]);
        run_layout(label, dir, &rs, &ref,
                   (Layout){.np = 1, .tp = 1, .dcp = 1, .I = 1, .budget = 16, .ep = 1, .rel_tol = 1e-4}, NULL);
        size_t per_position = kv_bytes_per_position(3, 1, 40, sizeof(float)) / 2;
        struct {
            int np, tp, dcp, guarded, tight;
            MergeBackend merge;
        } L[] = {{4, 4, 4, 0, 0, MERGE_A2A}, {4, 2, 1, 0, 0, MERGE_AG_RS}, {8, 8, 8, 0, 1, MERGE_AG_RS},
                 {4, 2, 1, 1, 0, MERGE_AG_RS}};
        for (size_t j = 0; j < sizeof L / sizeof *L; j++) {
            if (k == 1 && L[j].guarded) continue;
            for (int against_ep = 0; against_ep < 2; against_ep++) {
                Layout lay = {.np = L[j].np, .tp = L[j].tp, .dcp = L[j].dcp, .I = 1, .merge = L[j].merge, .budget = 16,
                              .guarded = L[j].guarded, .ep = 1, .ref_ep = against_ep, .rel_tol = 1e-4};
                if (L[j].tight) lay.block_size = 16, lay.kv_memory = 4 * 16 * per_position;
                snprintf(label, sizeof label, "deepseek %s EP: tp %d dcp %d dp %d%s%s against one rank%s", cases[k],
                         L[j].tp, L[j].dcp, L[j].np / L[j].tp, L[j].tight ? ", 4 KV blocks" : "",
                         L[j].guarded ? ", staged" : "", against_ep ? " with EP" : "");
                LayoutRun run = {0};
                run_layout(label, dir, &rs, against_ep ? &one_ep : &ref, lay, &run);
                CHECK(!L[j].tight || rank >= L[j].np || run.preemptions > 0, "%s: nothing preempted", label);
                free(run.sent), free(run.received);
                if (L[j].guarded) break; /* once is enough */
            }
        }
        free_reference(&one_ep, rs.n);
        free_reference(&ref, rs.n);
        requests_free(&rs);
    }
}

/* Each rank's moe_dispatch, moe_combine and ep_step calls and bytes
 * (comm.h) against the formulas from the routed counts, and against what
 * crossed MPI (PMPI), at tp 2 dp 2 (two DP groups of unequal work, so idle
 * passes) and tp 4 dcp 4; the counts themselves add up to K pairs per
 * token and MoE layer. */
static void expert_parallel_bytes(void)
{
    const char *src = getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : ".";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/data/deepseek/v3_yarn", src);
    int prompt[1024], n = read_prompt(dir, prompt, 1024), rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (!CHECK_OK(n >= 200, "no prompt in %s", dir)) return;
    Config c;
    CHECK(model_read_config(dir, &c) == 0, "%s", dcp_error());
    RequestSet rs = {0};
    add_request(&rs, prompt, 37, 9, 0.0f, 1.0f, 0);
    add_request(&rs, prompt + 40, 5, 3, 0.0f, 1.0f, 0);
    add_request(&rs, prompt + 60, 11, 2, 0.0f, 1.0f, 0);
    Reference ref = reference_run(dir, &rs);
    int E = c.moe.n_routed_experts, K = c.moe.experts_per_token, dim = c.dim, Lyr = c.n_layers;
    int moe_layers = 0;
    for (int l = 0; l < Lyr; l++) moe_layers += MOE_LAYER(&c, l);
    static const int shapes[][2] = {{2, 1}, {4, 4}}; /* tp, dcp over 4 ranks */
    for (int sh = 0; sh < 2; sh++) {
        int tp = shapes[sh][0], N = 4, El = E / N, me = rank;
        char label[96];
        snprintf(label, sizeof label, "EP bytes: tp %d dcp %d dp %d", tp, shapes[sh][1], N / tp);
        LayoutRun run = {0};
        run_layout(label, dir, &rs, &ref,
                   (Layout){.np = N, .tp = tp, .dcp = shapes[sh][1], .I = 1, .budget = 4096, .tokens_only = 1, .ep = 1},
                   &run);
        if (rank < N) {
            long long rows_out = 0, rows_back = 0, pairs = 0;
            for (int l = 0; l < Lyr; l++)
                for (int e = 0; e < E; e++) {
                    long long sent = run.sent[(size_t)l * E + e], got = run.received[(size_t)l * E + e];
                    int mine = e / El == me;
                    if (!mine) rows_out += sent;
                    if (mine) rows_back += got - sent; /* pairs from other ranks, returned to them */
                    CHECK(mine || got == 0, "%s rank %d: received tokens for expert %d it does not hold", label, rank,
                          e);
                    pairs += sent;
                }
            long long passes = (run.steps + run.idle) * moe_layers; /* MoE layer calls, idle ones included */
            long long want_c[3] = {2 * passes, passes + (tp > 1 ? run.steps * moe_layers : 0),
                                   N / tp > 1 ? run.steps + run.idle + 1 : 0};
            long long want_b[3] = {4LL * (N - 1) * El * passes + 4LL * dim * rows_out,
                                   4LL * dim * rows_back + 4LL * dim * (tp - 1) * pairs / K, 4 * want_c[2]};
            const int kinds[3] = {COMM_moe_dispatch, COMM_moe_combine, COMM_ep_step};
            const int pm[3] = {PM_MOE_DISPATCH, PM_MOE_COMBINE, PM_MAX};
            for (int i = 0; i < 3; i++) {
                long long calls = 0, bytes = 0;
                for (int p = 0; p < PHASE_N; p++)
                    calls += run.comm.c[p][kinds[i]].calls, bytes += run.comm.c[p][kinds[i]].bytes;
                CHECK(calls == want_c[i] && bytes == want_b[i] && pmpi_counts[pm[i]].calls == want_c[i] &&
                          pmpi_counts[pm[i]].bytes == want_b[i],
                      "%s rank %d %s: counted %lld calls / %lld bytes, crossed MPI %lld / %lld, formula %lld / %lld",
                      label, rank, comm_kind_names[kinds[i]], calls, bytes, pmpi_counts[pm[i]].calls,
                      pmpi_counts[pm[i]].bytes, want_c[i], want_b[i]);
                if (rank == 0)
                    fprintf(stderr, "%s rank 0 %s: %lld calls, %lld bytes (formula %lld / %lld)\n", label,
                            comm_kind_names[kinds[i]], calls, bytes, want_c[i], want_b[i]);
            }
            /* every rank's pairs and every expert's tokens add up to K per
             * token forwarded (prompts and outputs, less each request's
             * last) per MoE layer: each TP rank routes its share of its DP
             * group's rows */
            long long r[2] = {pairs, 0}, tot[2], tokens = 0;
            for (int l = 0; l < Lyr; l++)
                for (int e = 0; e < E; e++) r[1] += run.received[(size_t)l * E + e];
            for (int i = 0; i < rs.n; i++) tokens += rs.r[i].n_prompt + ref.res[i].n - 1;
            MPI_Comm sub;
            MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &sub);
            MPI_Allreduce(r, tot, 2, MPI_LONG_LONG, MPI_SUM, sub);
            MPI_Comm_free(&sub);
            CHECK(tot[0] == tokens * K * moe_layers && tot[1] == tot[0],
                  "%s: %lld pairs sent and %lld received, want %lld tokens x %d x %d MoE layers", label, tot[0], tot[1],
                  tokens, K, moe_layers);
        } else {
            MPI_Comm sub;
            MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, rank, &sub);
        }
        free(run.sent), free(run.received);
    }
    free_reference(&ref, rs.n);
    requests_free(&rs);
}

/* The bulk transfers, with chunks of a few bytes so that every transfer
 * crosses many chunk boundaries (as 2^30-byte chunks do past 2^31). */
static void chunked_transfers(void)
{
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t saved = xfer_chunk;
    xfer_chunk = 7;
    char text[1000];
    for (int i = 0; i < 1000; i++) text[i] = rank == 0 ? (char)('a' + i % 26) : 0;
    xfer_bcast(text, sizeof text, 0, MPI_COMM_WORLD);
    int same = 1;
    for (int i = 0; i < 1000; i++) same &= text[i] == 'a' + i % 26;
    CHECK(same, "rank %d: chunked broadcast differs", rank);
    /* rank r sends 13 r + 1 bytes of value r */
    size_t n = 13 * (size_t)rank + 1, counts[64];
    char *mine = xmalloc(n);
    memset(mine, rank, n);
    char *all = xfer_gather(mine, n, counts, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        size_t at = 0;
        int ok = 1;
        for (int r = 0; r < size; r++) {
            ok &= counts[r] == 13 * (size_t)r + 1;
            for (size_t j = 0; j < counts[r]; j++) ok &= all[at + j] == r;
            at += counts[r];
        }
        CHECK(ok, "chunked gather: wrong counts or bytes");
    }
    free(mine);
    free(all);
    xfer_chunk = saved;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 8) {
        if (rank == 0) fprintf(stderr, "test_parallel needs 8 ranks (mpirun -np 8), got %d\n", size);
        MPI_Finalize();
        return 99;
    }
    backend_set_threads(threads_per_rank(MPI_COMM_WORLD, NULL, NULL)); /* 8 ranks on few cores */
    char dir[4096] = "";
    if (rank == 0) {
        char *d = scratch_dir();
        snprintf(dir, sizeof dir, "%s", d);
        free(d);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);

    /* the groups named on the command line (a developer's shortcut), else all */
    static const struct {
        const char *name;
        void (*run)(void);
    } groups[] = {{"chunked", chunked_transfers},  {"hf", hf_layouts},           {"deepseek", deepseek_layouts},
                  {"ep", expert_parallel_layouts}, {"w4a4", w4a4_layouts},       {"ep_bytes", expert_parallel_bytes},
                  {"stories", stories_layouts}};
    int all = argc < 2;
    for (size_t g = 0; g < sizeof groups / sizeof *groups; g++)
        for (int a = all ? 0 : 1; a < (all ? 1 : argc); a++)
            if (all || !strcmp(argv[a], groups[g].name)) groups[g].run();
    int mqa = all;
    for (int a = 1; a < argc; a++) mqa |= !strcmp(argv[a], "mqa");
    if (mqa) {
        char *mqa8 = write_mqa(dir, 8, 512), *mqa16 = write_mqa(dir, 16, 512), *mqa_long = write_mqa(dir, 8, 4200);
        mqa_layouts(mqa8, 8);
        mqa_layouts(mqa16, 16);
        kv_accounting(mqa8);
        comm_bytes(mqa16, 16);
        guarded_layouts(mqa16);
        preemption(mqa8);
        chunked_prefill_4k(mqa_long);
        free(mqa8);
        free(mqa16);
        free(mqa_long);
    }

    int failures = test_failures, total;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) remove_tree(dir);
    MPI_Finalize();
    test_failures = total;
    return rank == 0 ? test_finish("test_parallel") : (total ? 1 : 0);
}
