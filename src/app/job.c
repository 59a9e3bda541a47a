#define _GNU_SOURCE
#include "job.h"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "chat.h"
#include "check.h"
#include "device.h"
#include "config.h"
#include "engine.h"
#include "generate.h"
#include "model.h"
#include "scheduler.h"
#include "topology.h"
#include "output.h"
#include "requests.h"
#include "timing.h"
#include "tokenizer.h"
#include "identity.h"
#include "journal.h"
#include "report.h"
#include "kernels_cpu.h"
#include "transfer.h"
#include "watchdog.h"
#include "util.h"

int threads_per_rank(MPI_Comm world, int *bound_cpus, int *share)
{
    cpu_set_t set;
    int bound = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    MPI_Comm node;
    DCP_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int local;
    DCP_CHECK(MPI_Comm_size(node, &local));
    DCP_CHECK(MPI_Comm_free(&node));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = (int)(cores / local);
    if (bound_cpus) *bound_cpus = bound;
    if (share) *share = 0;
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) return atoi(env); /* the user's count: nothing limited it */
    /* more threads than the CPUs the launcher bound us to would only queue
     * on them */
    if (bound > 0 && bound < t) {
        if (share) *share = t;
        t = bound;
    }
    return t > 0 ? t : 1;
}

/* tokenizer.bin beside a llama2.c checkpoint, or the tokenizer.json (or
 * tiktoken.model) of a Hugging Face folder, if the user named none */
static char *default_tokenizer(const char *model)
{
    if (!model) return NULL;
    if (path_is_dir(model)) {
        char *p = xmalloc(strlen(model) + 32);
        sprintf(p, "%s/tokenizer.json", model);
        if (path_exists(p)) return p;
        sprintf(p, "%s/tiktoken.model", model);
        if (path_exists(p)) return p;
        free(p);
        return NULL;
    }
    char *p = path_beside(model, "tokenizer.bin");
    if (path_exists(p)) return p;
    free(p);
    return NULL;
}

/* Renders chat requests with the chat template (strftime_now reading now),
 * tokenizes text prompts and applies the context limit; failures stay with
 * their request. */
static void prepare_prompts(RequestSet *rs, const Tokenizer *tok, const ChatTemplate *chat, long long now,
                            const Config *c, int max_model_len)
{
    for (int i = 0; i < rs->n; i++) {
        Request *q = &rs->r[i];
        if (q->error) continue;
        int rendered = 0;
        if (q->chat) {
            if (!tok) {
                request_fail(q, "%s:%d: request \"%s\": \"messages\" need the model's tokenizer and chat template "
                             "(give --tokenizer)",
                             rs->path, q->line, q->id);
                continue;
            }
            json_t *req = json_loads(q->chat, 0, NULL);
            char *err = NULL, *text = chat_render(chat, req, now, &err);
            json_decref(req);
            if (!text) {
                request_fail(q, "%s:%d: request \"%s\": %s", rs->path, q->line, q->id, err);
                free(err);
                continue;
            }
            q->prompt = text, rendered = 1;
        }
        if (q->n_stop_str && !tok) {
            request_fail(q, "%s:%d: request \"%s\": \"stop\" strings need output text, but the model has no "
                         "tokenizer (give --tokenizer, or use stop_token_ids)",
                         rs->path, q->line, q->id);
            continue;
        }
        if (q->prompt) {
            if (!tok) {
                request_fail(q, "%s:%d: request \"%s\": text prompt, but the model has no tokenizer (give "
                             "--tokenizer, or prompt_token_ids)",
                             rs->path, q->line, q->id);
                continue;
            }
            /* a rendered conversation holds its special tokens already (as
             * transformers' apply_chat_template, no BOS is added again) */
            if (rendered ? tokenizer_encode_plain(tok, q->prompt, &q->prompt_tokens, &q->n_prompt)
                         : tokenizer_encode(tok, q->prompt, c->bos_id, &q->prompt_tokens, &q->n_prompt)) {
                request_fail(q, "%s:%d: request \"%s\": %s", rs->path, q->line, q->id, dcp_error());
                continue;
            }
            if (q->n_prompt == 0) {
                request_fail(q, "%s:%d: request \"%s\": the prompt encodes to no tokens", rs->path, q->line, q->id);
                continue;
            }
        }
        if (q->n_prompt > max_model_len)
            request_fail(q, "%s:%d: request \"%s\": prompt has %d tokens, above the context limit of %d "
                         "(--max-model-len)",
                         rs->path, q->line, q->id, q->n_prompt, max_model_len);
    }
}

/* A KV budget in host memory above the node's memory would be refused
 * only when its pages are touched, deep into the run. */
static int check_host_kv_memory(size_t bytes)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double node = (double)pages * (double)page;
    if (pages > 0 && page > 0 && (double)bytes > node)
        return dcp_fail("--kv-cache-memory %.1f GiB is above this node's memory of %.1f GiB", bytes / 1073741824.0,
                        node / 1073741824.0);
    return 0;
}

/* The prompt file, read by rank 0 alone and broadcast, so that every rank
 * parses the same bytes even if the file changes or differs between nodes
 * (a shared file system caught mid-write, node-local copies): their
 * schedulers must agree. */
static int read_prompts(const char *path, const RequestDefaults *d, int skip_invalid, RequestSet *rs, MPI_Comm world,
                        uint64_t *hash)
{
    int rank;
    DCP_CHECK(MPI_Comm_rank(world, &rank));
    char *data = NULL;
    size_t size = 0;
    uint64_t n = UINT64_MAX; /* rank 0 could not read it */
    if (rank == 0 && path_is_dir(path))
        dcp_fail("%s: a folder, not a prompt file: give a JSON Lines file of requests (see --help)", path);
    else if (rank == 0 && read_file(path, &data, &size) == 0) n = size;
    DCP_CHECK(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, world));
    if (n == UINT64_MAX) {
        memset(rs, 0, sizeof *rs);
        return rank == 0 ? -1 : dcp_fail("rank 0 could not read the prompt file %s", path);
    }
    if (rank) data = xmalloc((size_t)n + 1);
    xfer_bcast(data, (size_t)n, 0, world);
    *hash = fnv1a(FNV_START, data, (size_t)n);
    int rc = requests_parse(path, data, (size_t)n, d, skip_invalid, rs);
    free(data);
    return rc;
}

/* Every rank passes its status; if any failed, the lowest failing rank
 * prints its reason once and all return 1 together (no hang, no abort). */
static int failed_anywhere(int rc, MPI_Comm world)
{
    int rank, size;
    DCP_CHECK(MPI_Comm_rank(world, &rank));
    DCP_CHECK(MPI_Comm_size(world, &size));
    int mine = rc ? rank : size, first;
    DCP_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, world));
    if (first == size) return 0;
    if (rank == first) {
        if (rank) fprintf(stderr, "dcpinfer: rank %d: %s\n", rank, dcp_error());
        else fprintf(stderr, "dcpinfer: %s\n", dcp_error());
    }
    return 1;
}

/* Results of every DP group to world rank 0, in file order. Each group's
 * TP rank 0 contributes the requests its group ran, packed (result_pack). */
static void gather_results(RequestSet *rs, const int *group, Result *res, const Topology *t)
{
    int n = rs->n, leader = t->tp_rank == 0, root = t->world_rank == 0;
    char *send = NULL;
    size_t len = 0, cap = 0;
    for (int i = 0; i < n; i++) {
        if (!leader || group[i] != t->dp_rank) continue;
        if (len + sizeof i > cap) send = xrealloc(send, cap = 2 * (len + sizeof i) + 256);
        memcpy(send + len, &i, sizeof i);
        len += sizeof i;
        result_pack(&res[i], &rs->r[i], &send, &len, &cap);
    }
    size_t *bytes = root ? xmalloc(sizeof(size_t) * (size_t)t->world_size) : NULL;
    char *all = xfer_gather(send, len, bytes, 0, t->world);
    if (root) {
        size_t total = 0;
        for (int r = 0; r < t->world_size; r++) total += bytes[r];
        for (size_t at = 0; at < total;) {
            int i;
            memcpy(&i, all + at, sizeof i);
            at += sizeof i;
            at += result_unpack(&res[i], &rs->r[i], all + at);
            /* failed while generating in another DP group: only that
             * group's ranks have the message, and non-finite logits are
             * the one way there */
            if (res[i].finish_reason && !strcmp(res[i].finish_reason, "error") && !rs->r[i].error)
                request_fail(&rs->r[i], "%s:%d: request \"%s\": %s", rs->path, rs->r[i].line, rs->r[i].id,
                             NONFINITE_REASON);
        }
    }
    free(send);
    free(bytes);
    free(all);
}

/* The steps of every DP group (recorded by its TP rank 0) to world rank 0,
 * group after group; returns their count there (0 elsewhere). */
static int gather_steps(const GenStats *gs, const Topology *t, StepRecord **steps, int **dp_of_step)
{
    int mine = t->tp_rank == 0 ? gs->n_steps : 0, root = t->world_rank == 0;
    size_t *bytes = root ? xmalloc(sizeof(size_t) * (size_t)t->world_size) : NULL, total = 0;
    *steps = xfer_gather(gs->steps, sizeof(StepRecord) * (size_t)mine, bytes, 0, t->world);
    if (!root) return 0;
    for (int r = 0; r < t->world_size; r++) total += bytes[r] / sizeof(StepRecord);
    *dp_of_step = xmalloc(sizeof(int) * (total + 1));
    for (int r = 0, k = 0; r < t->world_size; r++)
        for (size_t j = 0; j < bytes[r] / sizeof(StepRecord); j++) (*dp_of_step)[k++] = r / t->tp;
    free(bytes);
    return (int)total;
}

/* The launcher's local rank, from which the GPU was chosen, against MPI's
 * own view of the node (MPI_COMM_TYPE_SHARED). */
static void check_local_rank(MPI_Comm world, int rank)
{
    const char *from = NULL;
    int launcher = launcher_local_rank(&from);
    MPI_Comm node;
    DCP_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int local;
    DCP_CHECK(MPI_Comm_rank(node, &local));
    DCP_CHECK(MPI_Comm_free(&node));
    if (launcher >= 0 && launcher != local)
        fprintf(stderr, "dcpinfer: rank %d: the launcher says local rank %d (%s), MPI's node communicator says %d; the "
                        "GPU was chosen from %s\n",
                rank, launcher, from, local, from);
}

/* Progress on rank 0's stderr: rewritten in place on a terminal, plain
 * lines every --progress-interval seconds otherwise. By default shown on a
 * terminal, and under a launcher (mpirun, srun: stderr is then a pipe the
 * user watches, or a job's log), unless --quiet. */
static int progress_mode(const Options *o)
{
    static const char *launchers[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_STEP_ID"};
    int under_launcher = 0;
    for (size_t i = 0; i < sizeof launchers / sizeof *launchers; i++) under_launcher |= getenv(launchers[i]) != NULL;
    int on = o->progress >= 0 ? o->progress : !o->quiet && (isatty(2) || under_launcher);
    return !on ? 0 : isatty(2) ? PROGRESS_TERMINAL : PROGRESS_LINES;
}

/* ---- inputs and outputs ------------------------------------------------- */

/* 1 when a and b name the same existing file */
static int same_file(const char *a, const char *b)
{
    struct stat x, y;
    return a && b && stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* The files a run reads: the prompts, the model's files, the tokenizer's;
 * none may be a file the run writes (the results, their identity beside
 * them, the lock, the journals), which would replace the input. */
static int check_output_not_input(const Options *o, const char *tok_path)
{
    const char *written[] = {"", ".run.json", ".lock", ".journal", ".journal.dp0"};
    const char *model_files[] = {"config.json", "generation_config.json", "model.safetensors.index.json",
                                 "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    char out[4096], in[4096];
    for (size_t w = 0; w < sizeof written / sizeof *written; w++) {
        snprintf(out, sizeof out, "%s%s", o->output, written[w]);
        const char *what = NULL;
        if (same_file(out, o->prompts)) what = "the prompt file";
        if (!what && o->model && same_file(out, o->model)) what = "the model file";
        if (!what && tok_path && same_file(out, tok_path)) what = "the tokenizer";
        for (size_t m = 0; !what && o->model && m < sizeof model_files / sizeof *model_files; m++) {
            snprintf(in, sizeof in, "%s/%s", o->model, model_files[m]);
            if (same_file(out, in)) what = "a file of the model";
        }
        if (!what && o->model && path_is_dir(o->model)) { /* the shards */
            DIR *d = opendir(o->model);
            struct dirent *e;
            while (d && !what && (e = readdir(d))) {
                size_t n = strlen(e->d_name);
                snprintf(in, sizeof in, "%s/%s", o->model, e->d_name);
                if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors") && same_file(out, in)) what = "a file of the model";
            }
            if (d) closedir(d);
        }
        if (what)
            return dcp_fail("--output %s: dcpinfer would write %s, which is %s it reads; give another --output", o->output,
                            out, what);
    }
    return 0;
}

/* The model's vocabulary may exceed the tokenizer's by padding (real
 * checkpoints pad by a few hundred ids); more means the tokenizer is not
 * the model's, and the model would generate ids it cannot spell. */
enum { VOCAB_PADDING_MAX = 1024 };
static int check_tokenizer_vocab(const Tokenizer *tok, const char *tok_path, const Config *c)
{
    int ids = tokenizer_ids(tok);
    if (c->vocab_size - ids > VOCAB_PADDING_MAX)
        return dcp_fail("%s: the tokenizer spells ids 0-%d, the model's vocabulary has %d: %d ids it cannot spell, "
                        "more than the %d a checkpoint pads its vocabulary by (wrong tokenizer?)",
                        tok_path, ids - 1, c->vocab_size, c->vocab_size - ids, VOCAB_PADDING_MAX);
    return 0;
}

/* A step of --max-num-batched-tokens tokens must fit MPI's int counts. */
static int check_step_tokens(const Options *o, const Config *c, int world_size)
{
    Model m = {.cfg = *c};
    shard_init(&m.shard, c, o->tp, 0);
    Topology t = {.world_size = world_size, .tp = o->tp, .dcp = o->dcp, .dp = world_size / o->tp, .interleave = o->interleave};
    long limit = engine_step_token_limit(&m, &t);
    if (o->max_batched_tokens > limit)
        return dcp_fail("--max-num-batched-tokens %d: at this model and layout (-tp %d -dcp %d) a step of that many "
                        "tokens would send MPI messages of more than 2^31 - 1 elements; at most %ld",
                        o->max_batched_tokens, o->tp, o->dcp, limit);
    return 0;
}

/* ---- interruption ---------------------------------------------------------- */

/* SIGINT and SIGTERM (Ctrl-C, scancel, a job's time limit): rank 0 says
 * what is kept and how to go on, then the signal ends the process as it
 * would have. The line is made in advance: a handler may only write. */
static char interrupt_line[1024];
static size_t interrupt_len;

static void on_interrupt(int sig)
{
    if (interrupt_len && write(2, interrupt_line, interrupt_len) < 0) { /* nothing left to tell */
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* From the first step to the results file (before it there is nothing
 * to resume; after it, at MPI_Finalize, a launcher ends ranks whose peers
 * exited with a failure, which is no interruption). */
static void catch_interrupts(const Options *o, int rank)
{
    if (rank == 0)
        interrupt_len = (size_t)snprintf(
            interrupt_line, sizeof interrupt_line,
            o->journal ? "\ndcpinfer: interrupted: the requests finished so far are kept in %s.journal*; rerun the same "
                         "command with --resume to run the rest\n"
                       : "\ndcpinfer: interrupted: no journal was kept (--no-journal), so a rerun starts over (%s not "
                         "written)\n",
            o->output);
    if (interrupt_len >= sizeof interrupt_line) interrupt_len = sizeof interrupt_line - 1;
    struct sigaction sa = {.sa_handler = on_interrupt};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static void release_interrupts(void)
{
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
}

/* ---- the run ------------------------------------------------------------- */

/* One run's state, from its inputs to its report. */
typedef struct {
    const Options *o;
    Options resolved;    /* o with -dcp auto resolved for the model (o then points here) */
    MPI_Comm world;
    int rank, world_size, device;
    const Backend *be;
    int threads, mpi_device;
    const char *mpi_buffers, *cpu_kernels;
    Timings tm;
    double t_begin;
    RequestSet rs;
    uint64_t prompts_hash;
    Config cfg;
    int max_model_len;
    Tokenizer tok_storage, *tok;
    char *tok_path;
    ChatTemplate chat;
    RunIdentity id;
    OutputLock lock;
    /* requests finished by earlier runs (--resume): done on every rank,
     * their results on rank 0 */
    char *done;
    Result *earlier;
    int n_done, complete;
    Topology topo;
    int topo_ready;
    Model model;
    RankInfo *ranks;
} Run;

/* The backend, its kernels and threads, and where MPI's buffers live. */
static int setup_backend(Run *r)
{
    const Options *o = r->o;
    int bound_cpus, share;
    r->threads = threads_per_rank(r->world, &bound_cpus, &share);
    r->be = backend_find(o->backend);
    if (failed_anywhere(!r->be || backend_cpu_set_gemm(o->cpu_gemm) || cpu_set_isa(o->cpu_isa) ||
                            r->be->set_gemm_dtype(o->dtype),
                        r->world))
        return EXIT_USAGE;
    const Backend *be = r->be;
    if (!be->host_memory) check_local_rank(r->world, r->rank);
    r->mpi_device = !be->host_memory && (!strcmp(o->mpi_device_buffers, "yes") ||
                                         (!strcmp(o->mpi_device_buffers, "auto") && device_mpi_accepts_device_buffers()));
    r->mpi_buffers = be->host_memory ? "host" : r->mpi_device ? "device" : "staged";
    r->cpu_kernels = be->host_memory ? cpu_isa() : ""; /* only the CPU backend runs them */
    backend_set_threads(r->threads);
    if (r->rank == 0 && share && !o->quiet)
        printf("# note: rank 0 is bound to %d CPU(s), so it runs %d thread(s) instead of its share of %d; launch "
               "with mpirun --bind-to none (or --map-by slot:PE=%d), or srun --cpus-per-task=%d\n",
               bound_cpus, r->threads, share, share, share);
    return EXIT_OK;
}

/* The prompts, the model's config, the layout and the tokenizer, checked
 * before any weight is read; the prompts tokenized. */
static int read_inputs(Run *r)
{
    const Options *o = r->o;
    const Backend *be = r->be;
    MPI_Comm world = r->world;
    r->tok_path = o->tokenizer ? xstrdup(o->tokenizer) : default_tokenizer(o->model);
    if (failed_anywhere(r->rank == 0 && (output_check_writable(o->output) || check_output_not_input(o, r->tok_path)),
                        world))
        return EXIT_RUN_FAILED;
    /* an OpenAI chat body without max_tokens runs to EOS or the context
     * limit, as vLLM's chat endpoint, unless --max-tokens says otherwise */
    RequestDefaults defaults = {o->max_tokens, o->temperature, o->top_p, o->seed, o->sampling,
                                o->max_tokens_given ? 0 : INT32_MAX};
    if (failed_anywhere(read_prompts(o->prompts, &defaults, o->skip_invalid, &r->rs, world, &r->prompts_hash), world))
        return EXIT_RUN_FAILED;
    Config *cfg = &r->cfg;
    if (failed_anywhere(model_read_config(o->model, cfg) || model_check_checkpoint(o->model, cfg), world))
        return EXIT_RUN_FAILED;
    if (!o->dcp) { /* -dcp auto: the largest the model allows at this tp */
        r->resolved = *o;
        r->resolved.dcp = topology_max_dcp(cfg, o->tp);
        r->o = o = &r->resolved;
    }
    if (failed_anywhere(topology_check(cfg, r->world_size, o->tp, o->dcp, o->dp, o->interleave, o->block_size) ||
                            (o->expert_parallel && expert_parallel_check(cfg, r->world_size)) ||
                            check_step_tokens(o, cfg, r->world_size) ||
                            requests_check_vocab(&r->rs, cfg->vocab_size, o->skip_invalid),
                        world))
        return EXIT_RUN_FAILED;
    if (failed_anywhere(cfg->mla && !be->strided_copy &&
                            dcp_fail("%s: DeepSeek models (multi-head latent attention, experts) run on the cpu backend "
                                     "only for now; the %s backend lacks their operations",
                                     o->model, be->name),
                        world))
        return EXIT_RUN_FAILED;
    if (failed_anywhere(options_max_model_len(o, cfg, &r->max_model_len), world)) return EXIT_RUN_FAILED;
    double t0 = now_s();
    int loaded = r->tok_path && tokenizer_load(&r->tok_storage, r->tok_path, cfg->vocab_size) == 0;
    if (loaded) r->tok = &r->tok_storage; /* released with the run, whatever follows */
    if (failed_anywhere(r->tok_path && (!loaded || check_tokenizer_vocab(r->tok, r->tok_path, cfg)), world))
        return EXIT_RUN_FAILED;
    if (r->tok) config_add_eos(cfg, r->tok->eos_id); /* tokenizer_config.json's eos_token ends generation too (as vLLM) */
    /* the chat template, when a request is a conversation or one is named;
     * its text joins the tokenizer's identity (it makes the prompts) */
    int chats = 0;
    for (int i = 0; i < r->rs.n; i++) chats += r->rs.r[i].chat != NULL;
    if (failed_anywhere(o->chat_template && !r->tok &&
                            dcp_fail("--chat-template %s: chat templates need the model's tokenizer (give --tokenizer)",
                                     o->chat_template),
                        world))
        return EXIT_RUN_FAILED;
    if (r->tok && (chats || o->chat_template)) {
        if (failed_anywhere(chat_template_load(&r->chat, o->chat_template, r->tok->hf_file), world))
            return EXIT_RUN_FAILED;
        if (r->chat.text) r->tok->content_hash = fnv1a(r->tok->content_hash, r->chat.text, strlen(r->chat.text) + 1);
    }
    long long now = (long long)time(NULL); /* rank 0's clock: every rank renders the same prompts */
    DCP_CHECK(MPI_Bcast(&now, 1, MPI_LONG_LONG, 0, world));
    prepare_prompts(&r->rs, r->tok, &r->chat, now, cfg, r->max_model_len);
    r->tm.tokenize = now_s() - t0;
    return EXIT_OK;
}

/* The KV cache's element type for --kv-cache-dtype */
/* Everything this run's tokens and texts depend on (identity.h). */
static int make_identity(Run *r)
{
    const Options *o = r->o;
    RunIdentity *id = &r->id;
    uint64_t model_hash = 0;
    DType gemm;
    /* OpenBLAS has only an fp32 GEMM: "auto" loads fp32 for it */
    const char *dtype = !strcmp(o->dtype, "auto") && !strcmp(o->cpu_gemm, "openblas") && r->be->host_memory
                            ? "float32"
                            : o->dtype;
    /* the model's files are read by rank 0 alone (up to 1 GiB each) */
    if (failed_anywhere((r->rank == 0 && model_content_hash(o->model, &model_hash)) ||
                            model_gemm_dtype(o->model, &r->cfg, dtype, &gemm),
                        r->world))
        return EXIT_RUN_FAILED;
    DCP_CHECK(MPI_Bcast(&model_hash, 1, MPI_UINT64_T, 0, r->world));
    if (failed_anywhere(!strcmp(options_nvfp4_activations(o), "emulate") && !r->cfg.quant.nvfp4_w4a4
                            ? dcp_fail("--nvfp4-activations emulate: %s does not quantize activations (not a W4A4 "
                                       "NVFP4 checkpoint)",
                                       o->model ? o->model : "the generated default model")
                            : 0,
                        r->world))
        return EXIT_USAGE;
    identity_set(id, ID_version, "%s", PACKAGE_VERSION);
    identity_set(id, ID_model, "%016llx", (unsigned long long)model_hash);
    if (r->tok) identity_set(id, ID_tokenizer, "%016llx", (unsigned long long)r->tok->content_hash);
    else identity_set(id, ID_tokenizer, "none");
    identity_set(id, ID_prompts, "%016llx", (unsigned long long)r->prompts_hash);
    identity_set(id, ID_dtype, "%s", gemm == DTYPE_BF16 ? "bfloat16" : "float32");
    identity_set(id, ID_kv_cache_dtype, "%s", dtype_name(options_kv_dtype(o, &r->cfg)));
    identity_set(id, ID_nvfp4_activations, "%s", r->cfg.quant.nvfp4_w4a4 ? options_nvfp4_activations(o) : "-");
    identity_set(id, ID_backend, "%s", r->be->name);
    identity_set(id, ID_cpu_gemm, "%s", r->be->host_memory ? o->cpu_gemm : "-");
    identity_set(id, ID_max_model_len, "%d", r->max_model_len);
    identity_set(id, ID_max_tokens, o->max_tokens_given ? "%d" : "%d (chat: the context)", o->max_tokens);
    identity_set(id, ID_temperature, "%.9g", (double)o->temperature);
    identity_set(id, ID_top_p, "%.9g", (double)o->top_p);
    identity_set(id, ID_sampling, "top_k %d min_p %.9g presence %.9g frequency %.9g repetition %.9g", o->sampling.top_k,
                 (double)o->sampling.min_p, (double)o->sampling.presence_penalty,
                 (double)o->sampling.frequency_penalty, (double)o->sampling.repetition_penalty);
    identity_set(id, ID_seed, "%llu", (unsigned long long)o->seed);
    /* the layout itself is not part of it: canonical layouts give the same
     * bits (docs/design.md, "Same bits at any layout") */
    char order[64];
    reduction_order(&r->cfg, o->tp, o->dcp, o->interleave, o->expert_parallel, order, sizeof order);
    identity_set(id, ID_reduction_order, "%s", order);
    return EXIT_OK;
}

/* Rank 0: the output's lock, then what earlier runs left. A fresh run
 * removes an earlier run's journal; --resume takes the requests it
 * finished (done, earlier) and rewrites them as this run's starting
 * journal, or finds the output already complete (nothing to do). Any
 * difference of identity is refused before a file is changed. */
static int prepare_resume(Run *r)
{
    const Options *o = r->o;
    const RequestSet *rs = &r->rs;
    if (output_lock(&r->lock, o->output)) return -1;
    if (!o->resume) {
        int n = journal_remove(o->output);
        if (n && !o->quiet)
            printf("# removed %d journal file(s) of an earlier run of %s (--resume would have continued it)\n", n,
                   o->output);
        return 0;
    }
    char *stored = output_read_identity(o->output, o->output_format);
    if (stored) {
        int rc = identity_check(&r->id, stored, o->output);
        free(stored);
        if (rc) return -1;
        r->complete = 1;
        journal_remove(o->output); /* left by a run that stopped after writing its results */
        printf("# %s is already the complete result of these inputs: nothing to resume\n", o->output);
        return 0;
    }
    JournalCheck chk = {&r->cfg, r->max_model_len, r->tok != NULL};
    JournalLoad jl;
    if (journal_load(o->output, &r->id, rs, &chk, r->earlier, r->done, &jl)) return -1;
    r->n_done = jl.taken;
    if (jl.dropped && !o->quiet)
        printf("# --resume: %d journal record(s) failed their checks and their requests run again; the first: %s\n",
               jl.dropped, jl.first_drop);
    if (!o->quiet && r->n_done == 0)
        printf("# --resume: no finished request of an earlier run in %s.journal*: all %d to run\n", o->output, rs->n);
    else if (!o->quiet)
        printf("# resumed: %d of %d request(s) finished by earlier runs (%s.journal*), %d to run\n", r->n_done, rs->n,
               o->output, rs->n - r->n_done);
    return journal_consolidate(o->output, &r->id, rs, r->earlier, r->done);
}

/* The communicators and this rank's shard of the weights; the rank map. */
static int load_model(Run *r)
{
    const Options *o = r->o;
    if (failed_anywhere(r->be->host_memory && check_host_kv_memory(o->kv_cache_memory), r->world))
        return EXIT_RUN_FAILED;
    topology_init(&r->topo, r->world, o->tp, o->dcp, o->interleave);
    if (o->expert_parallel) topology_enable_ep(&r->topo);
    r->topo_ready = 1;
    double t0 = now_s();
    const char *load_dtype = r->id.v[ID_dtype];
    /* bf16 matrices in the row groups the backend reads fastest (CPU: AVX2) */
    int bf16_group = r->be->gemm_row_group ? r->be->gemm_row_group(DTYPE_BF16) : 0;
    int ep = r->topo.expert_parallel ? r->topo.ep : 0; /* 0: experts sliced by TP */
    if (failed_anywhere(
            model_load_mtp(&r->model, o->model, r->topo.tp, r->topo.tp_rank, ep, r->topo.ep_rank, load_dtype,
                           bf16_group, o->spec.method == SPEC_MTP),
            r->world))
        return EXIT_RUN_FAILED;
    if (r->tok) config_add_eos(&r->model.cfg, r->tok->eos_id);
    r->tm.load = now_s() - t0;
    int emulate = !strcmp(options_nvfp4_activations(o), "emulate");
    if (failed_anywhere(emulate && r->model.w.act_split[0]
                            ? dcp_fail("--nvfp4-activations emulate: '%s' cannot quantize its input at -tp %d (its "
                                       "columns split a group of 16, or it is a kv_b_proj, folded into the "
                                       "attention); choose weight-only or a -tp whose slices hold whole groups",
                                       r->model.w.act_split, r->topo.tp)
                            : 0,
                        r->world))
        return EXIT_USAGE;
    const Topology *t = &r->topo;
    const Shard *s = &r->model.shard;
    RankInfo me = {.world_rank = r->rank, .dp_rank = t->dp_rank, .tp_rank = t->tp_rank, .dcp_rank = t->dcp_rank,
                   .q_head0 = s->q_head0, .q_heads = s->q_heads, .kv_head0 = s->kv_head0, .kv_heads = s->kv_heads,
                   .device = r->be->host_memory ? -1 : r->device};
    gethostname(me.host, sizeof me.host - 1);
    r->ranks = r->rank == 0 ? xmalloc(sizeof(RankInfo) * r->world_size) : NULL;
    DCP_CHECK(MPI_Gather(&me, sizeof me, MPI_BYTE, r->ranks, sizeof me, MPI_BYTE, 0, r->world));
    const Config *cfg = &r->cfg;
    if (r->rank == 0 && !o->quiet) {
        printf("# dcpinfer %s: model %s (%d layers, dim %d, %d heads / %d KV heads, vocab %d), %d request(s), "
               "backend %s%s%s%s, %d thread(s) per rank\n",
               PACKAGE_VERSION, r->model.path, cfg->n_layers, cfg->dim, cfg->n_heads, cfg->n_kv_heads, cfg->vocab_size,
               r->rs.n, r->be->name, r->cpu_kernels[0] ? " (CPU kernels " : r->be->runs_on ? " (" : "",
               r->cpu_kernels[0] ? r->cpu_kernels : r->be->runs_on ? r->be->runs_on : "",
               r->cpu_kernels[0] || r->be->runs_on ? ")" : "", r->threads);
        char weights[512];
        model_weights_summary(&r->model, weights, sizeof weights);
        printf("# weights: %s (rank 0)\n", weights);
        if (cfg->quant.nvfp4_w4a4)
            printf("# NVFP4 activations: %s (the checkpoint is W4A4; --nvfp4-activations)\n",
                   !strcmp(options_nvfp4_activations(o), "emulate")
                       ? "emulate, each row quantized to FP4 in groups of 16 with the input scales"
                       : "weight-only, in the compute dtype: input scales read and checked, not applied");
        if (options_kv_dtype(o, cfg) == DTYPE_F8_E4M3)
            printf("# FP8 KV cache (E4M3): %s\n",
                   r->model.w.kv_scale ? "the checkpoint's k_scale and v_scale per layer (--kv-cache-dtype)"
                                       : "scale 1 (the checkpoint has no KV scales)");
        printf("# layout: %d rank(s) = dp %d x tp %d, dcp %d, interleave %d, dcp comm backend %s, MPI buffers %s\n",
               r->world_size, t->dp, t->tp, t->dcp, t->interleave, o->dcp_comm_backend, r->mpi_buffers);
        if (t->expert_parallel)
            printf("# expert parallel: %d routed experts over %d rank(s), %d whole experts each; shared experts and "
                   "dense layers tensor-parallel\n",
                   cfg->moe.n_routed_experts, t->ep, r->model.shard.experts);
        char order[64];
        if (reduction_order(cfg, t->tp, t->dcp, t->interleave, t->expert_parallel, order, sizeof order))
            printf("# reduction order: %s (K chunks, key shards, interleave%s): the same bits at every layout with tp "
                   "dividing %d, dcp dividing %d and this interleave%s\n",
                   order, t->expert_parallel ? ", whole experts" : "", r->model.shard.k_chunks,
                   r->model.shard.key_shards, t->expert_parallel ? ", with --enable-expert-parallel" : "");
        else
            printf("# reduction order: %s: -tp %d -dcp %d do not divide the model's %d K chunks and %d key shards, so "
                   "the bits equal those of this layout only\n",
                   order, t->tp, t->dcp, r->model.shard.k_chunks, r->model.shard.key_shards);
        report_rank_map(r->ranks, r->world_size);
    }
    return EXIT_OK;
}

/* After each step: progress for the watchdog, and the finished requests
 * into this DP group's journal (its TP rank 0 writes it). */
typedef struct {
    Journal journal;
    const RequestSet *mine;
    const Result *res;
    const int *index; /* position in the prompt file of each of mine */
} StepHook;

static void after_step(void *ctx, const int *finished, int n)
{
    StepHook *h = ctx;
    watchdog_beat();
    for (int k = 0; k < n; k++)
        journal_append(&h->journal, h->index[finished[k]], &h->mine->r[finished[k]], &h->res[finished[k]]);
}

/* What generation leaves for the report. */
typedef struct {
    Result *res;        /* rs.n results (rank 0: every group's) */
    StepRecord *steps;  /* rank 0: every group's steps */
    int *step_dp, n_steps;
    double gen_s;
    long long kv_peak, capacity;
    int block_size, kv_blocks;
    CommStats comm;
    /* expert parallelism (rank 0): every expert's tokens, every rank's idle passes */
    MoeReport moe;
    long long *expert_tokens, *idle_steps;
    double *idle_seconds;
    /* speculative decoding, every DP group's: verifications, and those
     * that accepted draft j */
    long long spec_steps, spec_at[SPEC_MAX_TOKENS];
} Generated;

/* Expert parallelism's counts to rank 0: each expert's tokens from its
 * owner, each rank's idle passes. */
static void gather_moe(Run *r, const Engine *e, Generated *g)
{
    const Topology *t = &r->topo;
    const Config *c = &r->model.cfg;
    if (!t->expert_parallel) return;
    size_t n = (size_t)c->n_layers * (size_t)c->moe.n_routed_experts, W = (size_t)r->world_size;
    if (r->rank == 0) {
        g->expert_tokens = xmalloc(sizeof(long long) * n);
        g->idle_steps = xmalloc(sizeof(long long) * W);
        g->idle_seconds = xmalloc(sizeof(double) * W);
    }
    DCP_CHECK(MPI_Reduce(e->moe_counts.received, g->expert_tokens, (int)n, MPI_LONG_LONG, MPI_SUM, 0, r->world));
    DCP_CHECK(MPI_Gather(&e->moe_counts.idle_steps, 1, MPI_LONG_LONG, g->idle_steps, 1, MPI_LONG_LONG, 0, r->world));
    DCP_CHECK(MPI_Gather(&e->moe_counts.idle_seconds, 1, MPI_DOUBLE, g->idle_seconds, 1, MPI_DOUBLE, 0, r->world));
    g->moe = (MoeReport){.layers = c->n_layers, .experts = c->moe.n_routed_experts, .ep = t->ep,
                         .expert_tokens = g->expert_tokens, .idle_steps = g->idle_steps,
                         .idle_seconds = g->idle_seconds};
}

/* The device memory --gpu-memory-utilization takes a share of: the
 * smallest rank's, or DCPINFER_GPU_MEMORY's (tests: HIP-CPU reports the
 * host's); 0 with dcp_error() when that is not a size */
static size_t device_memory(const Run *r)
{
    const char *env = getenv("DCPINFER_GPU_MEMORY");
    size_t total = 0;
    if (env && parse_bytes(env, &total)) {
        dcp_fail("DCPINFER_GPU_MEMORY: '%s' is not a size (e.g. 80G)", env);
        total = 0;
    } else if (!env) {
        total = r->be->device_memory();
    }
    unsigned long long t = total;
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, r->world));
    return (size_t)t;
}

/* On a GPU without --kv-cache-memory, the KV cache as vLLM sizes it
 * (engine_gpu_budget): a step of --max-num-batched-tokens profiled on the
 * engine, whose pool is then resized; the same on every rank (the
 * smallest device, the largest weights and activation peak). A budget
 * with no room for a KV cache is refused. */
static int size_kv_for_gpu(Run *r, Engine *eng, size_t total, size_t weights)
{
    const Options *o = r->o;
    double t0 = now_s();
    unsigned long long peak = generate_profile(eng, o->max_batched_tokens, r->max_model_len, r->topo.dp, r->topo.dp_rank);
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, r->world));
    GpuBudget b;
    if (failed_anywhere(engine_gpu_budget(total, o->gpu_memory_utilization, weights, peak, o->max_batched_tokens, &b),
                        r->world))
        return EXIT_USAGE;
    engine_resize_kv(eng, b.kv);
    if (r->rank == 0 && !o->quiet) {
        report_gpu_budget(&b);
        printf("# memory profiling: %.2f s\n", now_s() - t0);
    }
    return EXIT_OK;
}

/* This rank's DP group's requests, less those done earlier, through the
 * engine; every group's results and steps to rank 0. */
static int generate_all(Run *r, Generated *g)
{
    const Options *o = r->o;
    const Topology *topo = &r->topo;
    Engine eng;
    EngineOptions eo = options_engine(o, &r->model.cfg);
    eo.mpi_device_buffers = r->mpi_device;
    size_t total = 0;
    unsigned long long weights = r->model.w.bytes; /* the largest rank's */
    if (r->be->device_memory && !o->kv_cache_memory_given) {
        /* refused before the weights go to the device when they alone
         * leave no room; the engine's pool starts at a profiling step's */
        GpuBudget b;
        total = device_memory(r);
        DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, &weights, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, r->world));
        if (failed_anywhere(
                !total || engine_gpu_budget(total, o->gpu_memory_utilization, weights, 0, o->max_batched_tokens, &b),
                r->world))
            return EXIT_USAGE;
        eo.kv_cache_memory = generate_profile_kv(&r->model, topo->dcp, &eo, o->max_batched_tokens, r->max_model_len);
    }
    engine_init(&eng, &r->model, r->be, topo, &eo, &r->tm, &g->comm);
    if (total) {
        int rc = size_kv_for_gpu(r, &eng, total, weights);
        if (rc != EXIT_OK) {
            engine_free(&eng);
            return rc;
        }
    }
    g->capacity = engine_kv_capacity(&eng);
    if (r->rank == 0 && !o->quiet) report_kv_cache(&eng.att.kv, topo->dcp, r->max_model_len);
    RequestSet *rs = &r->rs;
    requests_check_kv(rs, topo, &eng.att.pool, r->max_model_len);

    /* this DP group's requests, in file order, less those done earlier */
    int *group = dp_assign(rs, topo->dp, r->done);
    RequestSet mine;
    int *index = xmalloc(sizeof(int) * (size_t)(rs->n ? rs->n : 1));
    dp_select(rs, group, topo->dp_rank, &mine, index);
    GenOptions go = {.max_model_len = r->max_model_len, .max_num_seqs = o->max_num_seqs,
                     .max_batched_tokens = o->max_batched_tokens, .progress = r->rank == 0 ? progress_mode(o) : 0,
                     .dp = topo->dp, .dp_rank = topo->dp_rank, .tok = r->tok, .prefix_caching = o->prefix_caching,
                     .spec = o->spec};
    go.progress_interval = o->progress_interval > 0 ? o->progress_interval
                           : go.progress == PROGRESS_TERMINAL ? 1.0
                                                              : 10.0;
    Result *mine_res = xcalloc((size_t)(mine.n ? mine.n : 1), sizeof(Result));
    StepHook hook = {.journal = {.fd = -1}, .mine = &mine, .res = mine_res, .index = index};
    if (o->journal && topo->tp_rank == 0 && journal_open(&hook.journal, o->output, topo->dp_rank, &r->id, 10.0) &&
        r->rank == 0 && !o->quiet)
        fprintf(stderr, "dcpinfer: %s; the run goes on without it\n", dcp_error());
    go.on_step = after_step;
    go.on_step_ctx = &hook;
    GenStats gs;
    DCP_CHECK(MPI_Barrier(r->world));
    watchdog_start(o->step_timeout, r->rank, EXIT_STALLED);
    double t0 = now_s();
    generate(&eng, &mine, mine_res, &go, &gs);
    journal_close(&hook.journal);
    DCP_CHECK(MPI_Barrier(r->world));
    /* Ranks leave a barrier at slightly different moments, so each
     * measures from its own start and the run takes the longest: every DP
     * group's wall time, timed on its own ranks, then fits inside it. */
    g->gen_s = now_s() - t0;
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, &g->gen_s, 1, MPI_DOUBLE, MPI_MAX, r->world));
    g->kv_peak = gs.kv_positions_peak * (long long)engine_kv_bytes_per_token(&eng);
    /* every rank of a DP group counts the same verifications: its first counts them */
    long long spec[1 + SPEC_MAX_TOKENS] = {0};
    spec[0] = topo->tp_rank == 0 ? gs.spec_steps : 0;
    for (int j = 0; j < SPEC_MAX_TOKENS; j++) spec[1 + j] = topo->tp_rank == 0 ? gs.spec_accepted_at[j] : 0;
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, spec, 1 + SPEC_MAX_TOKENS, MPI_LONG_LONG, MPI_SUM, r->world));
    g->spec_steps = spec[0];
    memcpy(g->spec_at, spec + 1, sizeof g->spec_at);
    g->block_size = eng.att.pool.block_size;
    g->kv_blocks = eng.att.pool.n_blocks;
    gather_moe(r, &eng, g);
    engine_free(&eng);
    g->res = xcalloc((size_t)(rs->n ? rs->n : 1), sizeof(Result));
    for (int j = 0; j < mine.n; j++) g->res[index[j]] = mine_res[j];
    free(mine_res);
    free(mine.r);
    free(index);
    for (int i = 0; i < rs->n; i++)
        if (rs->r[i].error) g->res[i].finish_reason = "error";
    gather_results(rs, group, g->res, topo);
    free(group);
    if (r->rank == 0)
        for (int i = 0; i < rs->n; i++)
            if (r->done[i]) { /* from the journal */
                g->res[i] = r->earlier[i];
                memset(&r->earlier[i], 0, sizeof r->earlier[i]);
            }
    g->n_steps = gather_steps(&gs, topo, &g->steps, &g->step_dp);
    free(gs.steps);
    return EXIT_OK;
}

/* Rank 0: the summary on stdout and the results file; then the journal
 * goes. Returns the count of failed requests (-1: writing failed). */
static int report_and_write(Run *r, Generated *g, const double *all_tm, const CommStats *all_comm,
                            const long long *all_kv, const long long *all_w, const long long *all_rss)
{
    const Options *o = r->o;
    const RequestSet *rs = &r->rs;
    Result *res = g->res;
    char **texts = xcalloc((size_t)(rs->n ? rs->n : 1), sizeof(char *));
    long out_tokens = 0, run_tokens = 0; /* run_tokens: generated by this run (not resumed) */
    int failed = 0;
    for (int i = 0; i < rs->n; i++) {
        texts[i] = xstrdup(res[i].text ? res[i].text : "");
        out_tokens += res[i].n;
        run_tokens += r->done[i] ? 0 : res[i].n;
        if (rs->r[i].error) {
            failed++;
            fprintf(stderr, "dcpinfer: %s\n", rs->r[i].error);
        }
    }
    if (!o->quiet) {
        report_requests(rs, res, texts);
        if (r->world_size > 1) report_comm(all_comm, all_kv, r->world_size);
    }
    report_steps(g->steps, g->step_dp, g->n_steps, r->topo.dp, g->kv_blocks);
    if (o->spec.method) report_spec(&o->spec, g->steps, g->n_steps, g->spec_steps, g->spec_at);
    if (g->moe.expert_tokens) report_moe(&g->moe, r->world_size);
    if (o->prefix_caching) report_prefix_cache(rs, res, r->done);
    long long w_max = 0, kv_max = 0, rss_max = 0;
    for (int k = 0; k < r->world_size; k++) {
        w_max = all_w[k] > w_max ? all_w[k] : w_max;
        kv_max = all_kv[k] > kv_max ? all_kv[k] : kv_max;
        rss_max = all_rss[k] > rss_max ? all_rss[k] : rss_max;
    }
    printf("# memory per rank (most of any rank): weights %.1f MiB, KV at most %.1f MiB, peak resident %.1f MiB\n",
           w_max / 1048576.0, kv_max / 1048576.0, rss_max / 1048576.0);
    report_latency(rs, res);
    int run_requests = rs->n - failed - r->n_done;
    double gen_s = g->gen_s;
    printf("# %d request(s), %d failed, %ld output tokens in %.3f s: %.1f tokens/s, %.2f requests/s%s\n", rs->n, failed,
           out_tokens, gen_s, gen_s > 0 ? run_tokens / gen_s : 0.0, gen_s > 0 ? run_requests / gen_s : 0.0,
           r->n_done ? " (rates of this run's requests; the resumed ones are not counted)" : "");
    char *identity = identity_json(&r->id);
    RunInfo info = {.reduction_order = r->id.v[ID_reduction_order], .k_chunks = r->model.shard.k_chunks,
                    .key_shards = r->model.shard.key_shards,
                    .model_path = r->model.path, .served_model_name = o->served_model_name, .cfg = &r->cfg, .max_model_len = r->max_model_len,
                    .world_size = r->world_size, .tp = r->topo.tp, .dcp = r->topo.dcp, .dp = r->topo.dp,
                    .interleave = r->topo.interleave, .dcp_comm_backend = o->dcp_comm_backend,
                    .threads_per_rank = r->threads, .backend = r->be->name, .mpi_buffers = r->mpi_buffers,
                    .cpu_kernels = r->cpu_kernels, .seed = o->seed, .prompts_path = o->prompts, .identity = identity,
                    .resumed_requests = r->n_done, .run_tokens = run_tokens, .run_requests = run_requests,
                    .reasoning_parser = o->reasoning_parser, .speculative_config = o->spec_json};
    RankReports rep = {r->ranks, all_tm, all_comm, all_kv, all_w, all_rss, g->moe.expert_tokens ? &g->moe : NULL};
    StepReport sr = {g->steps, g->step_dp, g->n_steps, g->kv_blocks, g->block_size, g->capacity, gen_s,
                     r->be->counts != NULL};
    int rc = !strcmp(o->output_format, "jsonl") ? output_write_jsonl(o->output, &info, rs, res, texts, r->tok)
                                                 : output_write(o->output, &info, rs, res, texts, &rep, &sr);
    if (!rc && !o->quiet) printf("# results written to %s\n", o->output);
    if (!rc) journal_remove(o->output); /* the results file holds it all now */
    free(identity);
    for (int i = 0; i < rs->n; i++) free(texts[i]);
    free(texts);
    return rc ? -1 : failed;
}

/* Every rank's timings, collectives and memory to rank 0, the report
 * there; returns the run's exit status on every rank. */
static int finish(Run *r, Generated *g)
{
    int rank = r->rank, world_size = r->world_size;
    r->tm.total = now_s() - r->t_begin;
    double *all_tm = rank == 0 ? xmalloc(sizeof(double) * TIMING_N * (size_t)world_size) : NULL;
    CommStats *all_comm = rank == 0 ? xmalloc(sizeof(CommStats) * (size_t)world_size) : NULL;
    /* per rank: KV peak, weight bytes, peak resident memory */
    long long *all_mem = rank == 0 ? xmalloc(sizeof(long long) * 3 * (size_t)world_size) : NULL;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long long mem[3] = {g->kv_peak, (long long)r->model.w.bytes, (long long)ru.ru_maxrss * 1024};
    DCP_CHECK(MPI_Gather(&r->tm, TIMING_N, MPI_DOUBLE, all_tm, TIMING_N, MPI_DOUBLE, 0, r->world));
    DCP_CHECK(MPI_Gather(&g->comm, sizeof g->comm, MPI_BYTE, all_comm, sizeof g->comm, MPI_BYTE, 0, r->world));
    DCP_CHECK(MPI_Gather(mem, 3, MPI_LONG_LONG, all_mem, 3, MPI_LONG_LONG, 0, r->world));
    /* the rest is rank 0's alone (writing may take longer than a step) */
    watchdog_stop();
    int failed = 0;
    if (rank == 0) { /* (rank, 3) -> three per-rank columns */
        long long *cols = xmalloc(sizeof(long long) * 3 * (size_t)world_size);
        for (int k = 0; k < world_size; k++)
            for (int c = 0; c < 3; c++) cols[(size_t)c * world_size + k] = all_mem[3 * k + c];
        failed = report_and_write(r, g, all_tm, all_comm, cols, cols + world_size, cols + 2 * (size_t)world_size);
        free(cols);
    }
    free(all_tm);
    free(all_comm);
    free(all_mem);
    DCP_CHECK(MPI_Bcast(&failed, 1, MPI_INT, 0, r->world));
    if (failed_anywhere(failed < 0, r->world)) return EXIT_RUN_FAILED;
    return failed ? EXIT_SOME_FAILED : EXIT_OK;
}

static void run_free(Run *r)
{
    if (r->earlier) results_free(r->earlier, r->rs.n);
    free(r->earlier);
    free(r->done);
    if (r->tok) tokenizer_free(r->tok);
    chat_template_free(&r->chat);
    free(r->tok_path);
    free(r->ranks);
    model_free(&r->model);
    requests_free(&r->rs);
    if (r->topo_ready) topology_free(&r->topo);
    output_unlock(&r->lock);
}

int run_job(const Options *o, MPI_Comm world, int device)
{
    Run r = {.o = o, .world = world, .device = device, .t_begin = now_s(), .lock = {.fd = -1}};
    DCP_CHECK(MPI_Comm_rank(world, &r.rank));
    DCP_CHECK(MPI_Comm_size(world, &r.world_size));
    int status = setup_backend(&r);
    if (status == EXIT_OK) status = read_inputs(&r);
    if (status == EXIT_OK) status = make_identity(&r);
    if (status == EXIT_OK) {
        r.done = xcalloc((size_t)r.rs.n + 1, 1);
        r.earlier = r.rank == 0 ? xcalloc((size_t)r.rs.n + 1, sizeof(Result)) : NULL;
        if (failed_anywhere(r.rank == 0 && prepare_resume(&r), world)) status = EXIT_RUN_FAILED;
    }
    if (status == EXIT_OK) {
        DCP_CHECK(MPI_Bcast(&r.complete, 1, MPI_INT, 0, world));
        xfer_bcast(r.done, (size_t)r.rs.n, 0, world);
    }
    if (status == EXIT_OK && !r.complete) status = load_model(&r);
    if (status == EXIT_OK && !r.complete) {
        Generated g = {0};
        catch_interrupts(o, r.rank);
        status = generate_all(&r, &g);
        if (status == EXIT_OK) status = finish(&r, &g);
        release_interrupts();
        if (g.res) results_free(g.res, r.rs.n);
        free(g.res);
        free(g.steps);
        free(g.step_dp);
        free(g.expert_tokens);
        free(g.idle_steps);
        free(g.idle_seconds);
    }
    run_free(&r);
    return status;
}
