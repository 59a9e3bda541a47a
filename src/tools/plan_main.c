/* dcpinfer-plan: what a model gets at a layout, before any hardware. It
 * takes dcpinfer's own options (the same parser) and sizes everything
 * with the very functions a run uses: the weights by the loader itself in
 * its counting mode (model_size), the KV cache by engine_kv_sizing and
 * report_kv_cache, the collectives by running a decode step of the engine
 * itself on the counting transport and the null backend (count_decode_step:
 * nothing moves, no kernel runs). So its "KV cache size" and "Maximum
 * concurrency" lines are those dcpinfer prints for the same options, its
 * weight bytes are a run's /memory/weight_bytes, and its bytes per decode
 * step are what a run's rank 0 counts in /comm/decode/ per step.
 * The model is a checkpoint (its config and tensor headers are read, no
 * weights) or a bare config.json. On top: what fits on the GPUs named,
 * and a roofline estimate of a decode step, marked as one. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine.h"
#include "check.h"
#include "generate.h"
#include "kvcache.h"
#include "options.h"
#include "report.h"
#include "topology.h"
#include "util.h"

/* A GPU's memory (bytes), HBM bandwidth and the bandwidth one GPU sends
 * at to its peers in the node (bytes/s, one direction), as their makers
 * publish them. */
typedef struct {
    const char *name;
    double memory, hbm, link;
} GpuPreset;

static const GpuPreset presets[] = {
    /* NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80 GB HBM3 at
     * 3.35 TB/s; NVLink 900 GB/s (both directions together) */
    {"H100", 80e9, 3.35e12, 450e9},
    /* NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141 GB HBM3e at
     * 4.8 TB/s; NVLink 900 GB/s (both directions together) */
    {"H200", 141e9, 4.8e12, 450e9},
    /* NVIDIA DGX B200 datasheet: 1,440 GB of HBM3e at 64 TB/s over its 8
     * GPUs; fifth-generation NVLink 1.8 TB/s per GPU (both directions) */
    {"B200", 180e9, 8e12, 900e9},
    /* AMD Instinct MI300X data sheet: 192 GB HBM3 at 5.3 TB/s; 7 Infinity
     * Fabric links to the other GPUs of an 8-GPU platform, 896 GB/s in
     * all (both directions together) */
    {"MI300X", 192e9, 5.3e12, 448e9},
};
enum { N_PRESETS = sizeof presets / sizeof *presets };

typedef struct {
    int gpus;             /* 0: tp x dp */
    const GpuPreset *gpu; /* NULL: none named */
    size_t gpu_memory;    /* 0: the preset's, or unknown */
    double utilization;   /* of gpu_memory for weights, activations and KV */
    int kv_given;         /* --kv-cache-memory on the command line: KV bytes per rank as given */
    int sweep, json, input_len, output_len;
    double acceptance;    /* --acceptance-length: tokens a verification outputs, on average */
} PlanOptions;

/* What one layout gets. */
typedef struct {
    int tp, dcp, dp;
    char refused[512];          /* why the layout is invalid; "" when valid */
    size_t weights;             /* the largest rank's weight bytes */
    size_t part[WPART_N];       /* that rank's by part */
    size_t *rank_weights;       /* (tp) each TP rank's; with expert parallelism (tp x dp) each rank's */
    int ep;                     /* ranks of the expert-parallel group; 0: off */
    int experts;                /* routed experts per rank under it */
    int moe_layers;             /* layers with routed experts */
    size_t usable, kv_memory;   /* per GPU: memory for weights, activations and KV; KV bytes per rank */
    GpuBudget budget;           /* with a GPU's memory: engine_gpu_budget's (the run's own sizing) */
    int budget_ok;              /* it left room for a KV cache */
    char budget_why[512];       /* else why not, in dcpinfer's words */
    int fits;                   /* -1: unknown (no GPU memory given) */
    KvSizing kv;
    int max_model_len;
    int running;                /* requests at once: by KV capacity and --max-num-seqs */
    CommCounter step[COMM_N];   /* what rank 0 sends in a decode step of the running requests */
    double read_weights, read_kv, sent, step_s, tokens_s; /* the estimate, per decode step */
    /* with --speculative-config: the same for a step of 1 + K rows per
     * request, which outputs --acceptance-length tokens per request */
    CommCounter spec_step[COMM_N];
    double spec_read_weights, spec_sent, spec_step_s, spec_tokens_s;
    int spec_rows;        /* 1 + K; 1: no speculation */
    double spec_accept;   /* --acceptance-length */
    /* with method mtp, the MTP layer's K passes per verification (a
     * catch-up over the kept rows, K - 1 draft steps of one row): its
     * weights by part, their part of spec_read_weights, its cache row's
     * reads, what a draft step sends and what the K passes send */
    int mtp;
    size_t mtp_part[WPART_N];
    double mtp_read_weights, mtp_read_kv, mtp_sent;
    CommCounter mtp_pass[COMM_N];
} Layout;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: dcpinfer-plan --model PATH [--gpus N] [--gpu H100|H200|B200|MI300X] [--gpu-memory SIZE]\n"
            "                     [--gpu-memory-utilization F] [-tp N] [-dcp N] [-dp N] [--sweep]\n"
            "                     [--input-len N] [--output-len N] [--format table|json] [dcpinfer's options]\n"
            "What a model gets at a layout without running it: each rank's weight bytes (by part), whether\n"
            "it fits, the KV cache dcpinfer would have (its own 'KV cache size' and 'Maximum concurrency'\n"
            "lines), the bytes each collective sends per decode step, and a roofline estimate of the step.\n"
            "  --model PATH          a llama2.c .bin, a Hugging Face folder or a bare config.json (its\n"
            "                        quantization_config and torch_dtype say how the weights are stored)\n"
            "  --gpus N              GPUs in all, one rank each (default: tp x dp)\n"
            "  --gpu NAME            memory, HBM and link bandwidth of an H100 (80 GB), H200 (141 GB),\n"
            "                        B200 (180 GB) or MI300X (192 GB), from their data sheets\n"
            "  --gpu-memory SIZE     memory per GPU (default: the preset's)\n"
            "  --gpu-memory-utilization F  share of it for weights, activations and KV cache (default\n"
            "                        0.9); the KV cache takes what the weights and the activation peak\n"
            "                        of a step of --max-num-batched-tokens leave, as dcpinfer sizes it\n"
            "  --kv-cache-memory SIZE  KV bytes per rank as dcpinfer takes it (default with a GPU: what is\n"
            "                        left of its memory; without: dcpinfer's default)\n"
            "  --sweep               every layout of the GPUs (instead of -tp, -dcp, -dp): tp dividing them,\n"
            "                        dcp dividing tp, dp the rest\n"
            "  --input-len N, --output-len N  the workload's requests (default: --max-model-len each)\n"
            "  --enable-expert-parallel  as dcpinfer's: each rank's share of whole experts, and the\n"
            "                        bytes of the tokens' trips to their experts when they fall evenly\n"
            "  --speculative-config JSON  as dcpinfer's; with --acceptance-length A (the tokens a\n"
            "                        verification of K drafts outputs on average, 1 to K + 1) the estimate\n"
            "                        of a step of 1 + K rows per request that outputs A tokens each\n"
            "  --temperature T       the requests' (default 1.0): greedy ones agree on each token by an\n"
            "                        argmax over the TP group, sampled ones gather their logits\n"
            "  --format json         one JSON object with a \"layouts\" array, for scripts\n"
            "The other options mean what they mean to dcpinfer (its --help).\n");
}

/* "--name" or "-name" or "--name=value": the option's name, else NULL */
static const char *opt_name(const char *arg, char *buf, size_t n)
{
    if (arg[0] != '-') return NULL;
    arg += arg[1] == '-' ? 2 : 1;
    snprintf(buf, n, "%.*s", (int)strcspn(arg, "="), arg);
    return buf;
}

/* Takes the plan's own options out of argv (the rest go to
 * options_parse); 0, or -1 with dcp_error() set. */
static int plan_options(int *argc, char **argv, PlanOptions *p)
{
    *p = (PlanOptions){.utilization = 0.9};
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        char name[64];
        const char *n = opt_name(argv[i], name, sizeof name), *eq = strchr(argv[i], '=');
        static const char *const takes_value[] = {"gpus", "gpu", "gpu-memory", "gpu-memory-utilization", "input-len", "output-len", "format",
                                                  "acceptance-length", NULL};
        int known = -1;
        for (int k = 0; n && takes_value[k]; k++)
            if (!strcmp(n, takes_value[k])) known = k;
        if (n && !strcmp(n, "kv-cache-memory")) p->kv_given = 1;
        if (n && !strcmp(n, "sweep")) {
            p->sweep = 1;
            continue;
        }
        if (known < 0) {
            argv[out++] = argv[i];
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < *argc ? argv[++i] : NULL;
        if (!v) return dcp_fail("--%s needs a value (see --help)", n);
        char *end;
        double d = strtod(v, &end);
        switch (known) {
        case 0:
            if (*end || d < 1 || d > 1 << 16 || d != floor(d))
                return dcp_fail("--gpus: '%s' is not a count of GPUs from 1 to 65536", v);
            p->gpus = (int)d;
            break;
        case 1:
            for (int k = 0; k < N_PRESETS && !p->gpu; k++)
                if (!strncasecmp(v, presets[k].name, strlen(presets[k].name))) p->gpu = &presets[k];
            if (!p->gpu) return dcp_fail("--gpu: '%s' is not one of H100, H200, B200, MI300X", v);
            break;
        case 2:
            if (parse_bytes(v, &p->gpu_memory))
                return dcp_fail("--gpu-memory: '%s' is not a size from 1K to 1P (e.g. 80G, 141000000000)", v);
            break;
        case 3:
            if (*end || !(d > 0 && d <= 1)) return dcp_fail("--gpu-memory-utilization: '%s' is not in (0, 1]", v);
            p->utilization = d;
            break;
        case 4:
        case 5:
            if (*end || d < 1 || d > 1 << 30 || d != floor(d))
                return dcp_fail("--%s: '%s' is not a positive number of tokens", n, v);
            *(known == 4 ? &p->input_len : &p->output_len) = (int)d;
            break;
        case 6:
            if (strcmp(v, "table") && strcmp(v, "json")) return dcp_fail("--format: '%s' is not table or json", v);
            p->json = !strcmp(v, "json");
            break;
        case 7:
            if (*end || !(d >= 1 && d <= 1 + SPEC_MAX_TOKENS))
                return dcp_fail("--acceptance-length: '%s' is not a number of tokens from 1 to %d", v, 1 + SPEC_MAX_TOKENS);
            p->acceptance = d;
            break;
        }
    }
    argv[out] = NULL;
    *argc = out;
    if (p->gpu && !p->gpu_memory) p->gpu_memory = (size_t)p->gpu->memory;
    return 0;
}

/* Rank 0's Topology at layout L, its communicators MPI_COMM_NULL */
static Topology plan_topology(const Options *o, const Layout *L)
{
    Topology t = {.world_size = L->tp * L->dp, .tp = L->tp, .dcp = L->dcp, .dp = L->dp, .interleave = o->interleave,
                  .world = MPI_COMM_NULL, .tp_comm = MPI_COMM_NULL, .dcp_comm = MPI_COMM_NULL, .ep = 1,
                  .ep_comm = MPI_COMM_NULL, .expert_parallel = L->ep > 0};
    if (L->ep) t.ep = L->ep;
    return t;
}

/* The bytes of a decode step of T requests at layout L (the KV cache and
 * options eo), as rank 0 of the first DP group sends them: the engine runs
 * T one-token prompts with two output tokens each, a prefill step then a
 * decode step, on the null backend and the counting transport (comm.h),
 * within a Topology of L's sizes whose communicators are MPI_COMM_NULL.
 * The decode phase's counts are the decode step's, and, when expert
 * parallelism spans DP groups, the one agreement to step again that a run
 * pays per step (the last, after which generate() ends). The requests
 * take the options' temperature. */
static void count_decode_step(const Options *o, const Model *m, Layout *L, const EngineOptions *eo, int T,
                              CommCounter step[COMM_N])
{
    Topology t = plan_topology(o, L);
    CommStats cs = {.t = &transport_counting};
    Timings tm = {0};
    Engine e;
    engine_init(&e, m, backend_null(t.ep), &t, eo, &tm, &cs);
    RequestSet rs = {.r = xcalloc((size_t)T, sizeof(Request)), .n = T, .path = "(a planned decode step)"};
    int token = m->cfg.bos_id > 0 ? m->cfg.bos_id : 0;
    for (int i = 0; i < T; i++)
        rs.r[i] = (Request){.id = "planned", .line = i + 1, .prompt_tokens = &token, .n_prompt = 1, .max_tokens = 2,
                            .temperature = o->temperature, .top_p = o->top_p, .seed = o->seed, .x = o->sampling,
                            .ignore_eos = 1, .logprobs = -1, .prompt_logprobs = -1, .n_choices = 1};
    Result *res = xcalloc((size_t)T, sizeof(Result));
    GenOptions go = {.max_model_len = L->max_model_len, .max_num_seqs = T,
                     .max_batched_tokens = o->max_batched_tokens > T ? o->max_batched_tokens : T};
    generate(&e, &rs, res, &go, NULL);
    memcpy(step, cs.c[PHASE_DECODE], sizeof(CommCounter) * COMM_N);
    for (int i = 0; i < T; i++) /* else the decode step was not of T requests */
        if (res[i].n != 2) dcp_check_failed(__FILE__, __LINE__, "count_decode_step", "a planned request stopped early");
    results_free(res, T);
    free(res);
    free(rs.r);
    engine_free(&e);
}

/* The bytes of one pass of the MTP layer (engine_mtp) over T requests of
 * `rows` rows each after a position of context (so that the DCP group
 * gathers and merges, as at decode), as rank 0 of the first DP group sends
 * them, on the null backend and the counting transport as
 * count_decode_step counts. */
static void count_mtp_pass(const Options *o, const Model *m, Layout *L, const EngineOptions *eo, int T, int rows,
                           CommCounter pass[COMM_N])
{
    Topology t = plan_topology(o, L);
    CommStats cs = {.t = &transport_counting};
    Timings tm = {0};
    Engine e;
    engine_init(&e, m, backend_null(t.ep), &t, eo, &tm, &cs);
    size_t dim = (size_t)m->cfg.dim, n = (size_t)T * rows, vocab = (size_t)(m->shard.vocab ? m->shard.vocab : 1);
    BlockTable *tables = xcalloc((size_t)T, sizeof(BlockTable));
    Chunk *chunks = xmalloc(sizeof(Chunk) * (size_t)T);
    int *tokens = xcalloc(n, sizeof(int)), *row_end = xmalloc(sizeof(int) * (size_t)T);
    float *prev = xcalloc(n * dim, sizeof(float)), *logits = xmalloc(sizeof(float) * (size_t)T * vocab),
          *hidden = xmalloc(sizeof(float) * (size_t)T * dim);
    for (int i = 0; i < T; i++) {
        if (table_reserve(&e.att.pool, &tables[i], kv_blocks_for(&t, 1 + rows, e.att.pool.block_size)))
            dcp_check_failed(__FILE__, __LINE__, "count_mtp_pass", "no KV blocks for a planned MTP pass");
        chunks[i] = (Chunk){tables[i].ids, tables[i].n, 1, rows};
        row_end[i] = i + 1;
    }
    cs.phase = PHASE_DECODE;
    engine_mtp(&e, tokens, chunks, T, NULL, prev, row_end, logits, hidden);
    memcpy(pass, cs.c[PHASE_DECODE], sizeof(CommCounter) * COMM_N);
    for (int i = 0; i < T; i++) {
        table_release(&e.att.pool, &tables[i]);
        table_free(&tables[i]);
    }
    free(tables);
    free(chunks);
    free(tokens);
    free(row_end);
    free(prev);
    free(logits);
    free(hidden);
    engine_free(&e);
}

/* The activation peak of a step of --max-num-batched-tokens at layout L:
 * dcpinfer's profiling step (generate_profile) run by rank 0 of the first
 * DP group on the null backend and the counting transport */
static size_t profile_step(const Options *o, const Model *m, const Layout *L, const EngineOptions *eo)
{
    Topology t = plan_topology(o, L);
    CommStats cs = {.t = &transport_counting};
    Timings tm = {0};
    EngineOptions pe = *eo;
    pe.kv_cache_memory = generate_profile_kv(m, L->dcp, eo, o->max_batched_tokens, L->max_model_len);
    Engine e;
    engine_init(&e, m, backend_null(t.ep), &t, &pe, &tm, &cs);
    size_t peak = generate_profile(&e, o->max_batched_tokens, L->max_model_len, L->dp, 0);
    engine_free(&e);
    return peak;
}

/* The weight bytes rank 0 reads in a pass of `rows` rows over weights of
 * these parts: all but the embedding (read by row), and of the routed
 * experts the share the rows' top-k choices reach if spread evenly (with
 * expert parallelism every DP group's rows reach this rank's experts) */
static double step_weights(const Model *m, const Layout *L, const size_t part[WPART_N], int rows)
{
    const MoeConfig *moe = &m->cfg.moe;
    int reaching = L->ep ? rows * L->dp : rows;
    double reach =
        moe->n_routed_experts ? 1 - pow(1 - (double)moe->experts_per_token / moe->n_routed_experts, reaching) : 1;
    return (double)part[WPART_ATTENTION] + part[WPART_MLP] + part[WPART_LM_HEAD] + reach * part[WPART_EXPERTS];
}

static double comm_bytes(const CommCounter c[COMM_N])
{
    double sent = 0;
    for (int k = 0; k < COMM_N; k++) sent += (double)c[k].bytes;
    return sent;
}

/* Everything about layout L that does not need the hardware, and what fits. */
static void plan_layout(const Options *o, const PlanOptions *p, Layout *L)
{
    Config cfg;
    if (model_read_any_config(o->model, &cfg) ||
        topology_check(&cfg, L->tp * L->dp, L->tp, L->dcp, L->dp, o->interleave, o->block_size) ||
        (o->expert_parallel && expert_parallel_check(&cfg, L->tp * L->dp)) ||
        options_max_model_len(o, &cfg, &L->max_model_len)) {
        snprintf(L->refused, sizeof L->refused, "%s", dcp_error());
        return;
    }
    /* each TP rank's weights; with expert parallelism each rank's, whose
     * experts differ across DP groups too */
    L->ep = o->expert_parallel ? L->tp * L->dp : 0;
    int ranks = L->ep ? L->ep : L->tp;
    L->rank_weights = xcalloc((size_t)ranks, sizeof(size_t));
    L->mtp = o->spec.method == SPEC_MTP;
    Model m, other; /* rank 0's, kept for its decode step; the others' */
    for (int r = 0; r < ranks; r++) {
        Model *mr = r ? &other : &m;
        if (model_size_mtp(mr, o->model, L->tp, r % L->tp, L->ep, r, o->dtype, L->mtp)) {
            snprintf(L->refused, sizeof L->refused, "%s", dcp_error());
            if (r) model_free(&m);
            return;
        }
        L->rank_weights[r] = mr->w.bytes;
        L->experts = mr->shard.experts;
        if (mr->w.bytes > L->weights || !r) {
            L->weights = mr->w.bytes;
            memcpy(L->part, mr->w.part_bytes, sizeof L->part);
        }
        if (r) model_free(mr);
    }
    for (int l = 0; l < cfg.n_layers; l++)
        L->moe_layers += MOE_LAYER(&cfg, l);
    /* the MTP layer's share of the weights, by part: rank 0's with it
     * less rank 0's without; the model's own parts are the rest */
    size_t model_part[WPART_N];
    memcpy(model_part, L->part, sizeof model_part);
    if (L->mtp) {
        if (model_size(&other, o->model, L->tp, 0, L->ep, 0, o->dtype)) {
            snprintf(L->refused, sizeof L->refused, "%s", dcp_error());
            model_free(&m);
            return;
        }
        for (int k = 0; k < WPART_N; k++) {
            L->mtp_part[k] = m.w.part_bytes[k] - other.w.part_bytes[k];
            model_part[k] -= L->mtp_part[k];
        }
        model_free(&other);
    }
    /* KV bytes per rank: as given, else what the GPU's usable memory
     * leaves after the largest rank's weights and the activation peak of a
     * step of --max-num-batched-tokens, profiled as dcpinfer profiles it */
    EngineOptions eo = options_engine(o, &m.cfg);
    L->fits = -1;
    L->kv_memory = o->kv_cache_memory;
    if (p->gpu_memory) {
        size_t act = profile_step(o, &m, L, &eo);
        L->budget_ok = !engine_gpu_budget(p->gpu_memory, p->utilization, L->weights, act, o->max_batched_tokens,
                                          &L->budget);
        L->usable = L->budget.usable;
        if (!L->budget_ok) snprintf(L->budget_why, sizeof L->budget_why, "%s", dcp_error());
        if (!p->kv_given) L->kv_memory = L->budget_ok ? L->budget.kv : 0;
        L->fits = L->kv_memory > 0 && L->weights + act + L->kv_memory <= L->usable;
    }
    eo.kv_cache_memory = L->kv_memory;
    engine_kv_sizing(&m, L->dcp, &eo, &L->kv);
    if (L->fits == 1 && L->kv.n_blocks < 1) L->fits = 0;
    /* the workload's requests at once, each holding its whole length */
    long long per = p->input_len || p->output_len ? (long long)p->input_len + p->output_len : L->max_model_len;
    long long running = L->kv.capacity / per;
    L->running = (int)(running < o->max_num_seqs ? running : o->max_num_seqs);
    int T = L->running > 0 ? L->running : 1, rows = o->spec.method ? 1 + o->spec.k : 1;
    if (L->fits != 0) count_decode_step(o, &m, L, &eo, T, L->step);
    /* a verification's collectives carry 1 + K rows per request, as a
     * step of that many one-row requests does */
    if (L->fits != 0 && rows > 1) count_decode_step(o, &m, L, &eo, T * rows, L->spec_step);
    /* The roofline: a step reads this rank's weights (the embedding only
     * by row; of the routed experts, the share T tokens' top-k choices
     * reach if spread evenly) and its shard of every running request's
     * context, and sends its collectives; HBM and link bandwidth bound it.
     * A verification step reads the context once for its 1 + K rows and
     * the experts its (1 + K) T rows reach. */
    double context = p->input_len || p->output_len ? p->input_len + p->output_len / 2.0 : L->max_model_len;
    /* (an MTP layer's cache row is read by its own passes only) */
    double layers = layers_held(&m.cfg), per_layer = (double)T * context / L->dcp * L->kv.bytes_per_token / layers;
    L->read_kv = per_layer * m.cfg.n_layers;
    L->read_weights = step_weights(&m, L, model_part, T);
    L->sent = comm_bytes(L->step);
    if (p->gpu && L->running > 0) {
        L->step_s = (L->read_weights + L->read_kv) / p->gpu->hbm + L->sent / p->gpu->link;
        L->tokens_s = L->dp * T / L->step_s;
    }
    L->spec_rows = rows;
    L->spec_accept = p->acceptance;
    if (rows > 1) {
        L->spec_read_weights = step_weights(&m, L, model_part, T * rows);
        L->spec_sent = comm_bytes(L->spec_step);
        if (L->mtp && L->fits != 0) {
            /* the catch-up over the kept rows (the acceptance length, rounded
             * up, per request) and K - 1 draft steps of one row */
            int kept = (int)ceil(p->acceptance);
            CommCounter catch_up[COMM_N];
            count_mtp_pass(o, &m, L, &eo, T, kept, catch_up);
            count_mtp_pass(o, &m, L, &eo, T, 1, L->mtp_pass);
            L->mtp_sent = comm_bytes(catch_up) + (rows - 2) * comm_bytes(L->mtp_pass);
            L->mtp_read_weights = step_weights(&m, L, L->mtp_part, T * kept) +
                                  (rows - 2) * step_weights(&m, L, L->mtp_part, T);
            L->mtp_read_kv = (rows - 1) * per_layer;
        }
        L->spec_read_weights += L->mtp_read_weights;
        L->spec_sent += L->mtp_sent;
        if (p->gpu && L->running > 0) {
            L->spec_step_s = (L->spec_read_weights + L->read_kv + L->mtp_read_kv) / p->gpu->hbm +
                             L->spec_sent / p->gpu->link;
            L->spec_tokens_s = L->dp * T * p->acceptance / L->spec_step_s;
        }
    }
    model_free(&m);
}

/* " tp_sum 768 B in 2 call(s), ..." for each collective called, or
 * " nothing" */
static void print_comm(const CommCounter c[COMM_N])
{
    int any = 0;
    for (int k = 0; k < COMM_N; k++)
        if (c[k].calls) printf("%s %s %lld B in %lld call(s)", any++ ? "," : "", comm_kind_names[k], c[k].bytes, c[k].calls);
    if (!any) printf(" nothing");
}

static void print_layout(const PlanOptions *p, const Layout *L)
{
    printf("# layout: tp %d, dcp %d, dp %d%s\n", L->tp, L->dcp, L->dp, L->ep ? ", expert parallel" : "");
    if (*L->refused) {
        printf("# refused: %s\n", L->refused);
        return;
    }
    double u;
    const char *unit = size_unit((double)L->weights, &u); /* GiB, or MiB and KiB for a small model */
    printf("# weights per rank: %.2f %s (attention %.2f, mlp %.2f, experts %.2f, embedding %.2f, LM head %.2f %s)\n",
           L->weights / u, unit, L->part[WPART_ATTENTION] / u, L->part[WPART_MLP] / u, L->part[WPART_EXPERTS] / u,
           L->part[WPART_EMBED] / u, L->part[WPART_LM_HEAD] / u, unit);
    printf("# weight bytes by %s:", L->ep ? "rank" : "TP rank");
    for (int r = 0; r < (L->ep ? L->ep : L->tp); r++) printf(" %zu", L->rank_weights[r]);
    printf("\n");
    if (L->ep)
        printf("# expert parallel: %d routed experts over %d ranks, %d whole experts each\n", L->ep * L->experts,
               L->ep, L->experts);
    if (L->fits >= 0 && !p->kv_given) {
        if (L->budget_ok) report_gpu_budget(&L->budget);
        else printf("# no KV cache: %s\n", L->budget_why);
    }
    if (L->fits >= 0) {
        unit = size_unit((double)L->usable, &u);
        printf("# fits: %s (%.2f %s usable per GPU: weights %.2f + activations %.2f + KV %.2f %s; "
               "--kv-cache-memory %zu)\n",
               L->fits ? "yes" : "no", L->usable / u, unit, L->weights / u, L->budget.activations / u,
               L->kv_memory / u, unit, L->kv_memory);
    }
    if (L->fits == 0) return;
    report_kv_cache(&L->kv, L->dcp, L->max_model_len);
    printf("# KV bytes per token per rank: %zu\n", L->kv.bytes_per_token);
    int T = L->running > 0 ? L->running : 1;
    printf("# decode step of %d request(s) at once, rank 0 sends:", T);
    print_comm(L->step);
    printf("\n");
    if (L->ep)
        printf("# (the tokens' trips to the experts of the %d MoE layers as when they fall evenly on the experts "
               "and ranks)\n",
               L->moe_layers);
    if (L->step_s > 0)
        printf("# estimate (roofline, %s): decode step %.2f ms = %.2f GB of weights + %.2f GB of KV at %.2f TB/s + "
               "%.1f MB sent at %.0f GB/s; %.0f tokens/s\n",
               p->gpu->name, L->step_s * 1e3, L->read_weights / 1e9, L->read_kv / 1e9, p->gpu->hbm / 1e12,
               L->sent / 1e6, p->gpu->link / 1e9, L->tokens_s);
    if (L->spec_step_s > 0)
        printf("# estimate with %d draft(s) per request (%d rows each), %.2f tokens per verification: step %.2f ms = "
               "%.2f GB of weights + %.2f GB of KV + %.1f MB sent; %.0f tokens/s (%.2fx)\n",
               L->spec_rows - 1, L->spec_rows, L->spec_accept, L->spec_step_s * 1e3, L->spec_read_weights / 1e9,
               (L->read_kv + L->mtp_read_kv) / 1e9, L->spec_sent / 1e6, L->spec_tokens_s, L->spec_tokens_s / L->tokens_s);
    if (L->spec_step_s > 0 && L->mtp)
        printf("# of which the MTP layer's %d pass(es) (a catch-up, %d draft step(s)): %.3f GB of weights, %.3f GB of "
               "KV, %.2f MB sent (each pass is launches of its own, which the roofline does not count)\n",
               L->spec_rows - 1, L->spec_rows - 2, L->mtp_read_weights / 1e9, L->mtp_read_kv / 1e9, L->mtp_sent / 1e6);
}

/* --sweep's table: one row per layout */
static void print_sweep(const Layout *ls, int n)
{
    printf("# %3s %4s %3s %13s %5s %12s %12s %8s %14s %14s\n", "tp", "dcp", "dp", "weights/rank", "fits", "KV tokens",
           "concurrency", "running", "step ms (est)", "tokens/s (est)");
    for (int i = 0; i < n; i++) {
        const Layout *L = &ls[i];
        printf("  %3d %4d %3d ", L->tp, L->dcp, L->dp);
        if (*L->refused) {
            printf("refused: %s\n", L->refused);
            continue;
        }
        double u;
        const char *unit = size_unit((double)L->weights, &u);
        printf("%9.2f %-3s %5s ", L->weights / u, unit, L->fits < 0 ? "?" : L->fits ? "yes" : "no");
        if (!L->fits) {
            printf("\n");
            continue;
        }
        printf("%12lld %11.2fx %8d", L->kv.capacity, (double)L->kv.capacity / L->max_model_len, L->running);
        if (L->step_s > 0) printf(" %14.2f %14.0f", L->step_s * 1e3, L->tokens_s);
        printf("\n");
    }
}

static json_t *comm_json(const CommCounter c[COMM_N])
{
    json_t *j = json_object();
    for (int k = 0; k < COMM_N; k++)
        if (c[k].calls) json_object_set_new(j, comm_kind_names[k], json_pack("{s:I,s:I}", "calls", c[k].calls, "bytes", c[k].bytes));
    return j;
}

static json_t *layout_json(const Layout *L)
{
    json_t *j = json_pack("{s:i,s:i,s:i}", "tp", L->tp, "dcp", L->dcp, "dp", L->dp);
    if (*L->refused) {
        json_object_set_new(j, "refused", json_string(L->refused));
        return j;
    }
    json_t *parts = json_object(), *ranks = json_array();
    for (int k = 0; k < WPART_N; k++) json_object_set_new(parts, weight_part_names[k], json_integer((json_int_t)L->part[k]));
    for (int r = 0; r < (L->ep ? L->ep : L->tp); r++)
        json_array_append_new(ranks, json_integer((json_int_t)L->rank_weights[r]));
    json_object_set_new(j, "weight_bytes_per_rank", json_integer((json_int_t)L->weights));
    json_object_set_new(j, "weight_bytes_by_part", parts);
    json_object_set_new(j, L->ep ? "weight_bytes_by_rank" : "weight_bytes_by_tp_rank", ranks);
    if (L->ep) json_object_set_new(j, "expert_parallel_ranks", json_integer(L->ep));
    json_object_set_new(j, "fits", L->fits < 0 ? json_null() : json_boolean(L->fits));
    json_object_set_new(j, "kv_cache_memory_per_rank", json_integer((json_int_t)L->kv_memory));
    if (L->fits >= 0) json_object_set_new(j, "activation_bytes_per_rank", json_integer((json_int_t)L->budget.activations));
    if (L->fits == 0) return j;
    json_object_set_new(j, "kv_bytes_per_token_per_rank", json_integer((json_int_t)L->kv.bytes_per_token));
    json_object_set_new(j, "kv_blocks_per_rank", json_integer(L->kv.n_blocks));
    json_object_set_new(j, "block_size", json_integer(L->kv.block_size));
    json_object_set_new(j, "kv_cache_tokens", json_integer(L->kv.capacity));
    json_object_set_new(j, "max_model_len", json_integer(L->max_model_len));
    json_object_set_new(j, "max_concurrency", json_real((double)L->kv.capacity / L->max_model_len));
    json_object_set_new(j, "running_requests", json_integer(L->running));
    json_object_set_new(j, "comm_per_decode_step", comm_json(L->step));
    if (L->ep) json_object_set_new(j, "moe_layers", json_integer(L->moe_layers));
    if (L->step_s > 0)
        json_object_set_new(j, "estimate",
                            json_pack("{s:f,s:f,s:f,s:f,s:f}", "decode_step_seconds", L->step_s, "tokens_per_second",
                                      L->tokens_s, "weight_bytes_read", L->read_weights, "kv_bytes_read", L->read_kv,
                                      "bytes_sent", L->sent));
    if (L->spec_rows > 1) {
        json_object_set_new(j, "comm_per_verification_step", comm_json(L->spec_step));
        if (L->spec_step_s > 0)
            json_object_set_new(j, "estimate_speculative",
                                json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:f}", "draft_tokens", L->spec_rows - 1,
                                          "acceptance_length", L->spec_accept, "step_seconds", L->spec_step_s,
                                          "tokens_per_second", L->spec_tokens_s, "weight_bytes_read",
                                          L->spec_read_weights, "kv_bytes_read", L->read_kv + L->mtp_read_kv,
                                          "bytes_sent", L->spec_sent));
        if (L->mtp) {
            size_t own = 0;
            for (int k = 0; k < WPART_N; k++) own += L->mtp_part[k];
            json_object_set_new(j, "comm_per_mtp_draft_step", comm_json(L->mtp_pass));
            json_object_set_new(j, "mtp", json_pack("{s:I,s:i,s:f,s:f,s:f}", "weight_bytes", (json_int_t)own,
                                                    "passes", L->spec_rows - 1, "weight_bytes_read",
                                                    L->mtp_read_weights, "kv_bytes_read", L->mtp_read_kv,
                                                    "bytes_sent", L->mtp_sent));
        }
    }
    return j;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-help")) {
            usage(stdout);
            return 0;
        }
    PlanOptions p;
    Options o;
    if (plan_options(&argc, argv, &p) || options_parse(&o, argc, argv, OPTIONS_NO_PROMPTS)) {
        fprintf(stderr, "dcpinfer-plan: %s\n", dcp_error());
        return 2;
    }
    int dp = o.dp ? o.dp : 1, gpus = p.gpus ? p.gpus : o.tp * dp;
    if (p.gpus && !p.sweep && !o.dp) dp = p.gpus / o.tp;
    if (!p.sweep && o.tp * dp != gpus) {
        fprintf(stderr, "dcpinfer-plan: --gpus %d is not -tp %d x -dp %d\n", gpus, o.tp, dp);
        return 2;
    }
    if (o.spec.method && !(p.acceptance >= 1 && p.acceptance <= 1 + o.spec.k)) {
        fprintf(stderr, "dcpinfer-plan: --speculative-config with %d draft(s): give --acceptance-length A, the tokens "
                        "a verification outputs on average, from 1 to %d\n", o.spec.k, 1 + o.spec.k);
        return 2;
    }
    Config cfg;
    if (model_read_any_config(o.model, &cfg)) { /* nothing to plan at any layout */
        fprintf(stderr, "dcpinfer-plan: %s\n", dcp_error());
        return 2;
    }
    /* the layout asked for, or with --sweep every tp dividing the GPUs
     * and every dcp dividing tp */
    int n = 0, cap = 1;
    for (int tp = 1; p.sweep && tp <= gpus; tp++)
        for (int dcp = 1; !(gpus % tp) && dcp <= tp; dcp++) cap += !(tp % dcp);
    Layout *ls = xcalloc((size_t)cap, sizeof(Layout));
    if (!p.sweep) ls[n++] = (Layout){.tp = o.tp, .dcp = o.dcp ? o.dcp : topology_max_dcp(&cfg, o.tp), .dp = dp};
    for (int tp = 1; p.sweep && tp <= gpus; tp++)
        for (int dcp = 1; !(gpus % tp) && dcp <= tp; dcp++)
            if (!(tp % dcp)) ls[n++] = (Layout){.tp = tp, .dcp = dcp, .dp = gpus / tp};
    for (int i = 0; i < n; i++) plan_layout(&o, &p, &ls[i]);
    int bad = !p.sweep && *ls[0].refused;
    if (bad) {
        fprintf(stderr, "dcpinfer-plan: %s\n", ls[0].refused);
    } else if (p.json) {
        json_t *root = json_pack("{s:s,s:i}", "model", o.model ? o.model : "(generated default model)", "gpus", gpus),
               *arr = json_array();
        if (p.gpu)
            json_object_set_new(root, "gpu", json_pack("{s:s,s:f,s:f}", "name", p.gpu->name, "hbm_bytes_per_second",
                                                       p.gpu->hbm, "link_bytes_per_second", p.gpu->link));
        if (p.gpu_memory) {
            json_object_set_new(root, "gpu_memory", json_integer((json_int_t)p.gpu_memory));
            json_object_set_new(root, "gpu_memory_utilization", json_real(p.utilization));
        }
        for (int i = 0; i < n; i++) json_array_append_new(arr, layout_json(&ls[i]));
        json_object_set_new(root, "layouts", arr);
        json_dumpf(root, stdout, JSON_INDENT(1));
        printf("\n");
        json_decref(root);
    } else {
        printf("# model: %s (%d layers), %d GPU(s)", o.model ? o.model : "(generated default model)", cfg.n_layers,
               gpus);
        if (p.gpu)
            printf(" %s: %.0f GB, %.2f TB/s HBM, %.0f GB/s link each way", p.gpu->name, p.gpu->memory / 1e9,
                   p.gpu->hbm / 1e12, p.gpu->link / 1e9);
        if (p.gpu_memory) {
            double u;
            const char *unit = size_unit((double)p.gpu_memory, &u);
            printf("; %.2f %s x %.2f per GPU for weights, activations and KV", p.gpu_memory / u, unit, p.utilization);
        }
        printf("\n");
        if (p.sweep) print_sweep(ls, n);
        else print_layout(&p, &ls[0]);
    }
    for (int i = 0; i < n; i++) free(ls[i].rank_weights);
    free(ls);
    return bad ? 2 : 0;
}
