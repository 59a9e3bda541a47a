#define _GNU_SOURCE
#include "job.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "backend.h"
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
#include "journal.h"
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

/* tokenizer.bin beside a llama2.c checkpoint, or the tokenizer.json of a
 * Hugging Face folder, if the user named none */
static char *default_tokenizer(const char *model)
{
    if (!model) return NULL;
    if (path_is_dir(model)) {
        char *p = xmalloc(strlen(model) + 32);
        sprintf(p, "%s/tokenizer.json", model);
        if (path_exists(p)) return p;
        free(p);
        return NULL;
    }
    const char *slash = strrchr(model, '/');
    size_t dir = slash ? (size_t)(slash - model + 1) : 0;
    char *p = xmalloc(dir + 16);
    memcpy(p, model, dir);
    strcpy(p + dir, "tokenizer.bin");
    if (path_exists(p)) return p;
    free(p);
    return NULL;
}

/* Tokenizes text prompts and applies the context limit; failures stay with
 * their request. */
static void prepare_prompts(RequestSet *rs, const Tokenizer *tok, const Config *c, int max_model_len)
{
    for (int i = 0; i < rs->n; i++) {
        Request *q = &rs->r[i];
        if (q->error) continue;
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
            if (tokenizer_encode(tok, q->prompt, c->bos_id, &q->prompt_tokens, &q->n_prompt)) {
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

/* A short quoted preview of the text, or of the token ids when the model
 * has no tokenizer. */
static void print_preview(const char *text, const Result *r)
{
    int shown = 0;
    if (!text[0] && r->n) {
        putchar('[');
        for (int i = 0; i < r->n && i < 12; i++) printf(i ? ", %d" : "%d", r->tokens[i]);
        fputs(r->n > 12 ? ", ...]" : "]", stdout);
        return;
    }
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)text; *p && shown < 60; p++, shown++) {
        if (*p == '\n') fputs("\\n", stdout);
        else if (*p == '"') fputs("\\\"", stdout);
        else if (*p < 0x20) printf("\\x%02x", *p);
        else putchar(*p);
    }
    fputs(shown == 60 && text[60] ? "...\"" : "\"", stdout);
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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Mean, median and 99th percentile of TTFT, TPOT and ITL over the
 * requests that produced tokens. */
static void print_latency(const RequestSet *rs, const Result *res)
{
    int n = 0;
    long n_itl = 0;
    for (int i = 0; i < rs->n; i++) {
        n += res[i].n > 0;
        n_itl += res[i].n > 1 ? res[i].n - 1 : 0;
    }
    if (!n) return;
    double *ttft = xmalloc(sizeof(double) * n), *tpot = xmalloc(sizeof(double) * n);
    double *itl = xmalloc(sizeof(double) * (size_t)(n_itl + 1));
    int k = 0;
    long m = 0;
    for (int i = 0; i < rs->n; i++) {
        if (!res[i].n) continue;
        ttft[k] = res[i].ttft_s;
        tpot[k++] = res[i].tpot_s;
        for (int j = 1; j < res[i].n; j++) itl[m++] = res[i].times[j] - res[i].times[j - 1];
    }
    const char *names[3] = {"TTFT", "TPOT", "ITL"};
    double *sets[3] = {ttft, tpot, itl};
    long counts[3] = {n, n, n_itl};
    printf("# latency (s)      mean        p50        p99\n");
    for (int s = 0; s < 3; s++) {
        if (!counts[s]) continue;
        qsort(sets[s], (size_t)counts[s], sizeof(double), cmp_double);
        double sum = 0;
        for (long i = 0; i < counts[s]; i++) sum += sets[s][i];
        printf("  %-10s %10.4f %10.4f %10.4f\n", names[s], sum / counts[s], sets[s][counts[s] / 2],
               sets[s][(long)(0.99 * (counts[s] - 1))]);
    }
    free(ttft);
    free(tpot);
    free(itl);
}

static void print_rank_map(const RankInfo *ri, int world)
{
    printf("# rank map\n# %5s %-20s %4s %4s %4s %4s %12s %9s\n", "rank", "host", "gpu", "dp", "tp", "dcp",
           "query heads", "KV heads");
    for (int r = 0; r < world; r++) {
        char q[32], kv[32];
        snprintf(q, sizeof q, "%d-%d", ri[r].q_head0, ri[r].q_head0 + ri[r].q_heads - 1);
        snprintf(kv, sizeof kv, "%d-%d", ri[r].kv_head0, ri[r].kv_head0 + ri[r].kv_heads - 1);
        char gpu[16];
        snprintf(gpu, sizeof gpu, ri[r].device < 0 ? "-" : "%d", ri[r].device);
        printf("  %5d %-20s %4s %4d %4d %4d %12s %9s\n", r, ri[r].host, gpu, ri[r].dp_rank, ri[r].tp_rank,
               ri[r].dcp_rank, q, kv);
    }
}

/* Collectives per run: calls and bytes summed over ranks, seconds as
 * avg/min/max over ranks (each rank's total). */
static void print_comm_summary(const CommStats *cs, const long long *kv_peak, int world)
{
    printf("# %-15s %10s %14s %10s %10s %10s\n", "collective", "calls", "bytes", "avg_s", "min_s", "max_s");
    for (int k = 0; k < COMM_N; k++) {
        long long calls = 0, bytes = 0;
        double sum = 0, lo = 1e300, hi = 0;
        for (int r = 0; r < world; r++) {
            double t = 0;
            for (int p = 0; p < PHASE_N; p++) {
                calls += cs[r].c[p][k].calls;
                bytes += cs[r].c[p][k].bytes;
                t += cs[r].c[p][k].seconds;
            }
            sum += t;
            lo = t < lo ? t : lo;
            hi = t > hi ? t : hi;
        }
        if (calls)
            printf("  %-15s %10lld %14lld %10.4f %10.4f %10.4f\n", comm_kind_names[k], calls, bytes, sum / world, lo,
                   hi);
    }
    long long lo = kv_peak[0], hi = kv_peak[0], sum = 0;
    for (int r = 0; r < world; r++) {
        sum += kv_peak[r];
        lo = kv_peak[r] < lo ? kv_peak[r] : lo;
        hi = kv_peak[r] > hi ? kv_peak[r] : hi;
    }
    printf("# KV cache bytes held at peak per rank: avg %lld, min %lld, max %lld\n", sum / world, lo, hi);
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

/* What this run's tokens depend on: the model (path and shapes), the
 * prompt file's bytes, and the options that change tokens. */
static void run_fingerprint(const Options *o, const Config *cfg, uint64_t prompts_hash, int max_model_len,
                            const char *tok_path, Fingerprint *fp)
{
    const char *model = o->model ? o->model : "(generated default model)";
    uint64_t h = fnv1a(FNV_START, model, strlen(model) + 1);
    fingerprint_hex(fnv1a(h, cfg, sizeof *cfg), fp->model);
    fingerprint_hex(prompts_hash, fp->prompts);
    struct {
        int max_tokens, max_model_len;
        float temperature, top_p;
        uint64_t seed;
    } sampling = {o->max_tokens, max_model_len, o->temperature, o->top_p, o->seed};
    h = fnv1a(FNV_START, &sampling, sizeof sampling);
    fingerprint_hex(fnv1a(h, tok_path ? tok_path : "", tok_path ? strlen(tok_path) + 1 : 1), fp->sampling);
}

/* Rank 0, before generation: a fresh run removes the journal of an
 * earlier run of the same output; --resume takes the requests it finished
 * (done, earlier) and rewrites them as this run's starting journal.
 * complete: the output file is already the finished result of these
 * inputs, and nothing is left to do. */
static int prepare_journal(const Options *o, const Fingerprint *fp, const RequestSet *rs, Result *earlier, char *done,
                           int *n_done, int *complete)
{
    *n_done = *complete = 0;
    if (!o->resume) {
        int n = journal_remove(o->output);
        if (n && !o->quiet)
            printf("# removed %d journal file(s) of an earlier run of %s (--resume would have continued it)\n", n,
                   o->output);
        return 0;
    }
    int n = journal_load(o->output, fp, rs, earlier, done);
    if (n < 0) return -1;
    char line[128], stored[128] = "";
    fingerprint_line(fp, line, sizeof line);
    if (n == 0 && output_read_fingerprint(o->output, stored, sizeof stored) == 0 && !strcmp(stored, line)) {
        *complete = 1;
        printf("# %s is already the complete result of these inputs: nothing to resume\n", o->output);
        return 0;
    }
    *n_done = n;
    if (!o->quiet && n == 0)
        printf("# --resume: no finished request of an earlier run in %s.journal*: all %d to run\n", o->output,
               rs->n);
    else if (!o->quiet)
        printf("# resumed: %d of %d request(s) finished by earlier runs (%s.journal*), %d to run\n", n, rs->n,
               o->output, rs->n - n);
    return journal_consolidate(o->output, fp, rs, earlier, done);
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

/* The steps' summary. DP groups step concurrently, each on its own
 * requests: their step counts and decode-only times are given per group
 * (and the tokens/s of the groups together), never summed as if one ran
 * after the other. */
static void print_step_summary(const StepRecord *steps, const int *step_dp, int n_steps, int dp, int kv_blocks)
{
    int max_running = 0, peak_blocks = 0, preempted = 0;
    int *count = xcalloc((size_t)dp, sizeof(int));
    double *end = xcalloc((size_t)dp, sizeof(double)); /* a group's last step's end */
    long *tokens = xcalloc((size_t)dp, sizeof(long));
    double *secs = xcalloc((size_t)dp, sizeof(double));
    for (int i = 0; i < n_steps; i++) {
        int g = step_dp ? step_dp[i] : 0;
        max_running = steps[i].running > max_running ? steps[i].running : max_running;
        peak_blocks = steps[i].kv_blocks_used > peak_blocks ? steps[i].kv_blocks_used : peak_blocks;
        preempted += steps[i].preempted;
        count[g]++;
        double e = steps[i].t_start + steps[i].seconds;
        end[g] = e > end[g] ? e : end[g];
        if (!steps[i].prefill_tokens) {
            tokens[g] += steps[i].decode_tokens;
            secs[g] += steps[i].seconds;
        }
    }
    const char *in_group = dp > 1 ? " in a DP group" : "";
    if (dp == 1) printf("# %d step(s)", n_steps);
    else {
        printf("# steps per DP group (the groups run concurrently):");
        for (int g = 0; g < dp; g++) printf(" %d", count[g]);
    }
    printf(", at most %d request(s) running%s, %d preemption(s), KV use at most %.1f%% of %d blocks%s\n",
           max_running, in_group, preempted, 100.0 * peak_blocks / (kv_blocks ? kv_blocks : 1), kv_blocks,
           dp > 1 ? " per rank" : "");
    if (dp == 1) {
        if (secs[0] > 0)
            printf("# decode-only steps: %ld tokens in %.3f s: %.1f tokens/s\n", tokens[0], secs[0],
                   tokens[0] / secs[0]);
    } else {
        double rate = 0;
        int any = 0;
        for (int g = 0; g < dp; g++) any |= secs[g] > 0;
        if (any) {
            printf("# decode-only steps per DP group:");
            for (int g = 0; g < dp; g++) {
                printf("%s %d: %ld tokens in %.3f s (%.1f tokens/s)", g ? ";" : "", g, tokens[g], secs[g],
                       secs[g] > 0 ? tokens[g] / secs[g] : 0.0);
                rate += secs[g] > 0 ? tokens[g] / secs[g] : 0.0;
            }
            printf("; together %.1f tokens/s\n", rate);
        }
        printf("# DP groups' generation wall time (the run's is the slowest):");
        for (int g = 0; g < dp; g++) printf("%s %d: %.3f s", g ? "," : "", g, end[g]);
        printf("\n");
    }
    free(count);
    free(end);
    free(tokens);
    free(secs);
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

int run_job(const Options *o, MPI_Comm world, int device)
{
    int rank, world_size;
    DCP_CHECK(MPI_Comm_rank(world, &rank));
    DCP_CHECK(MPI_Comm_size(world, &world_size));
    Timings tm = {0};
    double t_begin = now_s();
    int bound_cpus, share;
    int threads = threads_per_rank(world, &bound_cpus, &share);
    const Backend *be = backend_find(o->backend);
    if (failed_anywhere(
            !be || backend_cpu_set_gemm(o->cpu_gemm) || cpu_set_isa(o->cpu_isa) || be->set_gemm_dtype(o->dtype), world))
        return EXIT_USAGE;
    if (!be->host_memory) check_local_rank(world, rank);
    int mpi_device = !be->host_memory && (!strcmp(o->mpi_device_buffers, "yes") ||
                                          (!strcmp(o->mpi_device_buffers, "auto") && device_mpi_accepts_device_buffers()));
    const char *mpi_buffers = be->host_memory ? "host" : mpi_device ? "device" : "staged";
    const char *cpu_kernels = be->host_memory ? cpu_isa() : ""; /* only the CPU backend runs them */
    backend_set_threads(threads);
    if (rank == 0 && share && !o->quiet)
        printf("# note: rank 0 is bound to %d CPU(s), so it runs %d thread(s) instead of its share of %d; launch "
               "with mpirun --bind-to none (or --map-by slot:PE=%d), or srun --cpus-per-task=%d\n",
               bound_cpus, threads, share, share, share);
    if (failed_anywhere(rank == 0 && output_check_writable(o->output), world)) return EXIT_RUN_FAILED;

    /* the prompts and the layout are checked before any weight is read */
    RequestDefaults defaults = {o->max_tokens, o->temperature, o->top_p, o->seed};
    RequestSet rs;
    uint64_t prompts_hash = 0;
    if (failed_anywhere(read_prompts(o->prompts, &defaults, o->skip_invalid, &rs, world, &prompts_hash), world)) return EXIT_RUN_FAILED;
    Config cfg;
    Model model = {0};
    Tokenizer tok_storage, *tok = NULL;
    char *tok_path = o->tokenizer ? xstrdup(o->tokenizer) : default_tokenizer(o->model);
    int status = EXIT_RUN_FAILED, topo_ready = 0;
    Topology topo;
    Result *res = NULL;
    char **texts = NULL, *done = NULL;
    int *group = NULL;
    Result *earlier = NULL;
    if (failed_anywhere(model_read_config(o->model, &cfg) || model_check_checkpoint(o->model, &cfg) ||
                            topology_check(&cfg, world_size, o->tp, o->dcp, o->dp, o->interleave, o->block_size) ||
                            requests_check_vocab(&rs, cfg.vocab_size, o->skip_invalid),
                        world))
        goto out;
    if (failed_anywhere(cfg.mla && !be->strided_copy &&
                            dcp_fail("%s: DeepSeek models (multi-head latent attention, experts) run on the cpu backend "
                                     "only for now; the %s backend lacks their operations",
                                     o->model, be->name),
                        world))
        goto out;
    int max_model_len = o->max_model_len ? o->max_model_len : cfg.max_seq_len;
    if (failed_anywhere(max_model_len > cfg.max_seq_len &&
                            dcp_fail("--max-model-len %d exceeds the model's maximum of %d positions",
                                     max_model_len, cfg.max_seq_len),
                        world))
        goto out;
    double t0 = now_s();
    if (failed_anywhere(tok_path && tokenizer_load(&tok_storage, tok_path, cfg.vocab_size), world)) goto out;
    if (tok_path) tok = &tok_storage;
    prepare_prompts(&rs, tok, &cfg, max_model_len);
    tm.tokenize = now_s() - t0;

    /* requests finished by earlier runs (--resume): rank 0 reads the
     * journal, every rank learns which they are */
    Fingerprint fp;
    run_fingerprint(o, &cfg, prompts_hash, max_model_len, tok_path, &fp);
    done = xcalloc((size_t)rs.n + 1, 1);
    earlier = rank == 0 ? xcalloc((size_t)rs.n + 1, sizeof(Result)) : NULL;
    int n_done = 0, complete = 0;
    if (failed_anywhere(rank == 0 && prepare_journal(o, &fp, &rs, earlier, done, &n_done, &complete), world))
        goto out;
    DCP_CHECK(MPI_Bcast(&complete, 1, MPI_INT, 0, world));
    if (complete) {
        status = EXIT_OK;
        goto out;
    }
    xfer_bcast(done, (size_t)rs.n, 0, world);

    if (failed_anywhere(be->host_memory && check_host_kv_memory(o->kv_cache_memory), world)) goto out;
    topology_init(&topo, world, o->tp, o->dcp, o->interleave);
    topo_ready = 1;
    t0 = now_s();
    /* OpenBLAS has only an fp32 GEMM: "auto" loads fp32 for it */
    const char *load_dtype = !strcmp(o->dtype, "auto") && !strcmp(o->cpu_gemm, "openblas") && be->host_memory
                                 ? "float32"
                                 : o->dtype;
    /* bf16 matrices in the row groups the backend reads fastest (CPU: AVX2) */
    int bf16_group = be->gemm_row_group ? be->gemm_row_group(DTYPE_BF16) : 0;
    if (failed_anywhere(model_load_as(&model, o->model, topo.tp, topo.tp_rank, load_dtype, bf16_group), world))
        goto out;
    /* tokenizer_config.json's eos_token ends generation too (as vLLM) */
    if (tok) config_add_eos(&model.cfg, tok->eos_id);
    tm.load = now_s() - t0;

    RankInfo me = {.world_rank = rank, .dp_rank = topo.dp_rank, .tp_rank = topo.tp_rank, .dcp_rank = topo.dcp_rank,
                   .q_head0 = model.shard.q_head0, .q_heads = model.shard.q_heads,
                   .kv_head0 = model.shard.kv_head0, .kv_heads = model.shard.kv_heads,
                   .device = be->host_memory ? -1 : device};
    gethostname(me.host, sizeof me.host - 1);
    RankInfo *ranks = rank == 0 ? xmalloc(sizeof(RankInfo) * world_size) : NULL;
    DCP_CHECK(MPI_Gather(&me, sizeof me, MPI_BYTE, ranks, sizeof me, MPI_BYTE, 0, world));
    if (rank == 0 && !o->quiet) {
        printf("# dcpinfer %s: model %s (%d layers, dim %d, %d heads / %d KV heads, vocab %d), %d request(s), "
               "backend %s%s%s%s, %d thread(s) per rank\n",
               PACKAGE_VERSION, model.path, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size,
               rs.n, be->name, cpu_kernels[0] ? " (CPU kernels " : "", cpu_kernels, cpu_kernels[0] ? ")" : "", threads);
        printf("# layout: %d rank(s) = dp %d x tp %d, dcp %d, interleave %d, dcp comm backend %s, MPI buffers %s\n",
               world_size, topo.dp, topo.tp, topo.dcp, topo.interleave, o->dcp_comm_backend, mpi_buffers);
        print_rank_map(ranks, world_size);
    }

    CommStats comm = {0};
    Engine eng;
    EngineOptions eo = {strcmp(o->dcp_comm_backend, "a2a") ? MERGE_AG_RS : MERGE_A2A, o->kv_cache_memory,
                        o->block_size, mpi_device, 0,
                        strcmp(o->kv_cache_dtype, "bfloat16") ? DTYPE_F32 : DTYPE_BF16};
    if (failed_anywhere(!(be->kv_dtypes & 1u << eo.kv_dtype) &&
                            dcp_fail("--kv-cache-dtype %s: the %s backend stores float32 KV caches only",
                                     o->kv_cache_dtype, be->name),
                        world))
        goto out;
    engine_init(&eng, &model, be, &topo, &eo, &tm, &comm);
    long long capacity = engine_kv_capacity(&eng);
    if (rank == 0 && !o->quiet)
        printf("# KV cache: %d blocks of %d positions per rank (%.1f MiB), %d ranks per DCP group\n"
               "# KV cache size: %lld tokens\n"
               "# Maximum concurrency for %d tokens per request: %.2fx\n",
               eng.att.pool.n_blocks, eng.att.pool.block_size,
               eng.att.pool.n_blocks * (double)eng.att.pool.block_size * engine_kv_bytes_per_token(&eng) / 1048576.0,
               topo.dcp, capacity, max_model_len, (double)capacity / max_model_len);
    requests_check_kv(&rs, &topo, &eng.att.pool, max_model_len);

    /* this DP group's requests, in file order, less those done earlier */
    group = dp_assign(&rs, topo.dp, done);
    RequestSet mine;
    int *index = xmalloc(sizeof(int) * (size_t)(rs.n ? rs.n : 1));
    dp_select(&rs, group, topo.dp_rank, &mine, index);
    GenOptions go = {.max_model_len = max_model_len, .max_num_seqs = o->max_num_seqs,
                     .max_batched_tokens = o->max_batched_tokens,
                     .progress = rank == 0 ? progress_mode(o) : 0,
                     .dp = topo.dp, .dp_rank = topo.dp_rank, .tok = tok};
    go.progress_interval = o->progress_interval > 0 ? o->progress_interval
                           : go.progress == PROGRESS_TERMINAL ? 1.0 : 10.0;
    Result *mine_res = xcalloc((size_t)(mine.n ? mine.n : 1), sizeof(Result));
    StepHook hook = {.mine = &mine, .res = mine_res, .index = index};
    if (o->journal && topo.tp_rank == 0 &&
        journal_open(&hook.journal, o->output, topo.dp_rank, &fp) && rank == 0 && !o->quiet)
        fprintf(stderr, "dcpinfer: %s; the run goes on without it\n", dcp_error());
    go.on_step = after_step;
    go.on_step_ctx = &hook;
    GenStats gs;
    DCP_CHECK(MPI_Barrier(world));
    watchdog_start(o->step_timeout, rank, EXIT_STALLED);
    t0 = now_s();
    generate(&eng, &mine, mine_res, &go, &gs);
    journal_close(&hook.journal);
    DCP_CHECK(MPI_Barrier(world));
    /* Ranks leave a barrier at slightly different moments, so each
     * measures from its own start and the run takes the longest: every DP
     * group's wall time, timed on its own ranks, then fits inside it. */
    double gen_s = now_s() - t0;
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, &gen_s, 1, MPI_DOUBLE, MPI_MAX, world));
    long long kv_peak = gs.kv_positions_peak * (long long)engine_kv_bytes_per_token(&eng);
    int block_size = eng.att.pool.block_size, kv_blocks = eng.att.pool.n_blocks;
    engine_free(&eng);
    res = xcalloc((size_t)(rs.n ? rs.n : 1), sizeof(Result));
    for (int j = 0; j < mine.n; j++) res[index[j]] = mine_res[j];
    free(mine_res);
    free(mine.r);
    free(index);
    for (int i = 0; i < rs.n; i++)
        if (rs.r[i].error) res[i].finish_reason = "error";
    gather_results(&rs, group, res, &topo);
    if (rank == 0)
        for (int i = 0; i < rs.n; i++)
            if (done[i]) { /* from the journal */
                res[i] = earlier[i];
                memset(&earlier[i], 0, sizeof earlier[i]);
            }
    StepRecord *steps = NULL;
    int *step_dp = NULL, n_steps = gather_steps(&gs, &topo, &steps, &step_dp);
    free(gs.steps);

    tm.total = now_s() - t_begin;
    double *all_tm = rank == 0 ? xmalloc(sizeof(double) * TIMING_N * (size_t)world_size) : NULL;
    CommStats *all_comm = rank == 0 ? xmalloc(sizeof(CommStats) * (size_t)world_size) : NULL;
    /* per rank: KV peak, weight bytes, peak resident memory */
    long long *all_kv = rank == 0 ? xmalloc(sizeof(long long) * 3 * (size_t)world_size) : NULL;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long long mem[3] = {kv_peak, (long long)model.w.bytes, (long long)ru.ru_maxrss * 1024};
    DCP_CHECK(MPI_Gather(&tm, TIMING_N, MPI_DOUBLE, all_tm, TIMING_N, MPI_DOUBLE, 0, world));
    DCP_CHECK(MPI_Gather(&comm, sizeof comm, MPI_BYTE, all_comm, sizeof comm, MPI_BYTE, 0, world));
    DCP_CHECK(MPI_Gather(mem, 3, MPI_LONG_LONG, all_kv, 3, MPI_LONG_LONG, 0, world));
    long long *all_w = all_kv ? all_kv + world_size : NULL, *all_rss = all_kv ? all_kv + 2 * (size_t)world_size : NULL;
    if (rank == 0) { /* (rank, 3) -> three per-rank columns */
        long long *rows = xmalloc(sizeof(long long) * 3 * (size_t)world_size);
        memcpy(rows, all_kv, sizeof(long long) * 3 * (size_t)world_size);
        for (int r = 0; r < world_size; r++)
            all_kv[r] = rows[3 * r], all_w[r] = rows[3 * r + 1], all_rss[r] = rows[3 * r + 2];
        free(rows);
    }
    /* the rest is rank 0's alone (writing may take longer than a step) */
    watchdog_stop();
    int write_rc = 0, failed = 0;
    if (rank == 0) {
        texts = xcalloc((size_t)(rs.n ? rs.n : 1), sizeof(char *));
        long out_tokens = 0, run_tokens = 0; /* run_tokens: generated by this run (not resumed) */
        for (int i = 0; i < rs.n; i++) {
            texts[i] = xstrdup(res[i].text ? res[i].text : "");
            out_tokens += res[i].n;
            run_tokens += done[i] ? 0 : res[i].n;
            if (rs.r[i].error) {
                failed++;
                fprintf(stderr, "dcpinfer: %s\n", rs.r[i].error);
            }
        }
        if (!o->quiet) {
            printf("# %-14s %8s %8s %-7s %9s %9s  %s\n", "id", "prompt", "output", "finish", "ttft_s", "e2e_s",
                   "text");
            for (int i = 0; i < rs.n; i++) {
                printf("  %-14s %8d %8d %-7s %9.4f %9.4f  ", rs.r[i].id, rs.r[i].n_prompt, res[i].n,
                       res[i].finish_reason, res[i].ttft_s, res[i].e2e_s);
                print_preview(texts[i], &res[i]);
                putchar('\n');
            }
            if (world_size > 1) print_comm_summary(all_comm, all_kv, world_size);
        }
        print_step_summary(steps, step_dp, n_steps, topo.dp, kv_blocks);
        long long w_max = 0, kv_max = 0, rss_max = 0;
        for (int r = 0; r < world_size; r++) {
            w_max = all_w[r] > w_max ? all_w[r] : w_max;
            kv_max = all_kv[r] > kv_max ? all_kv[r] : kv_max;
            rss_max = all_rss[r] > rss_max ? all_rss[r] : rss_max;
        }
        printf("# memory per rank (most of any rank): weights %.1f MiB, KV at most %.1f MiB, peak resident %.1f MiB\n",
               w_max / 1048576.0, kv_max / 1048576.0, rss_max / 1048576.0);
        print_latency(&rs, res);
        int run_requests = rs.n - failed - n_done;
        printf("# %d request(s), %d failed, %ld output tokens in %.3f s: %.1f tokens/s, %.2f requests/s%s\n", rs.n,
               failed, out_tokens, gen_s, gen_s > 0 ? run_tokens / gen_s : 0.0, gen_s > 0 ? run_requests / gen_s : 0.0,
               n_done ? " (rates of this run's requests; the resumed ones are not counted)" : "");
        char fp_line[128];
        fingerprint_line(&fp, fp_line, sizeof fp_line);
        RunInfo info = {.model_path = model.path, .cfg = &cfg, .max_model_len = max_model_len,
                        .world_size = world_size, .tp = topo.tp, .dcp = topo.dcp, .dp = topo.dp,
                        .interleave = topo.interleave, .dcp_comm_backend = o->dcp_comm_backend,
                        .threads_per_rank = threads, .backend = be->name, .mpi_buffers = mpi_buffers,
                        .cpu_kernels = cpu_kernels, .seed = o->seed,
                        .prompts_path = o->prompts, .fingerprint = fp_line, .resumed_requests = n_done,
                        .run_tokens = run_tokens, .run_requests = run_requests};
        RankReports rep = {ranks, all_tm, all_comm, all_kv, all_w, all_rss};
        StepReport sr = {steps, step_dp, n_steps, kv_blocks, block_size, capacity, gen_s};
        write_rc = !strcmp(o->output_format, "jsonl") ? output_write_jsonl(o->output, &info, &rs, res, texts, tok)
                                                      : output_write(o->output, &info, &rs, res, texts, &rep, &sr);
        if (!write_rc && !o->quiet) printf("# results written to %s\n", o->output);
        if (!write_rc) journal_remove(o->output); /* the results file holds it all now */
    }
    free(steps);
    free(step_dp);
    free(ranks);
    free(all_tm);
    free(all_comm);
    free(all_kv);
    DCP_CHECK(MPI_Bcast(&failed, 1, MPI_INT, 0, world));
    status = failed_anywhere(write_rc, world) ? EXIT_RUN_FAILED : failed ? EXIT_SOME_FAILED : EXIT_OK;
out:
    if (texts)
        for (int i = 0; i < rs.n; i++) free(texts[i]);
    free(texts);
    if (res) results_free(res, rs.n);
    free(res);
    if (earlier) results_free(earlier, rs.n);
    free(earlier);
    free(done);
    free(group);
    if (tok) tokenizer_free(tok);
    free(tok_path);
    model_free(&model);
    requests_free(&rs);
    if (topo_ready) topology_free(&topo);
    return status;
}
