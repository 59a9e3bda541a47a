#define _GNU_SOURCE
#include "job.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "engine.h"
#include "generate.h"
#include "model.h"
#include "output.h"
#include "requests.h"
#include "timing.h"
#include "tokenizer.h"
#include "util.h"

int threads_per_rank(MPI_Comm world, int *bound_cpus, int *share)
{
    cpu_set_t set;
    int bound = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    MPI_Comm node;
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = (int)(cores / local);
    if (bound_cpus) *bound_cpus = bound;
    if (share) *share = t;
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    /* more threads than the CPUs the launcher bound us to would only queue
     * on them */
    if (bound > 0 && bound < t) t = bound;
    return t > 0 ? t : 1;
}

/* tokenizer.bin beside a llama2.c checkpoint, if the user named none */
static char *default_tokenizer(const char *model)
{
    if (!model || path_is_dir(model)) return NULL;
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
        if (q->prompt) {
            if (!tok) {
                request_fail(q, "%s:%d: request \"%s\": text prompt, but the model has no tokenizer (give "
                             "--tokenizer, or prompt_token_ids)",
                             rs->path, q->line, q->id);
                continue;
            }
            tokenizer_encode(tok, q->prompt, c->bos_id, &q->prompt_tokens, &q->n_prompt);
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

/* Output text of a request: its generated pieces, stop tokens left out. */
static char *decode_text(const Tokenizer *tok, const Config *c, const Request *q, const Result *r)
{
    if (!tok || !q->prompt_tokens) return xstrdup("");
    size_t cap = 64, len = 0;
    char *s = xmalloc(cap);
    int prev = q->prompt_tokens[q->n_prompt - 1];
    for (int i = 0; i < r->n; i++) {
        int t = r->tokens[i];
        if (!is_stop_token(c, q, t)) {
            const char *piece = tokenizer_decode(tok, prev, t, c->bos_id);
            size_t n = strlen(piece);
            if (len + n + 1 > cap) s = xrealloc(s, cap = 2 * (len + n + 1));
            memcpy(s + len, piece, n);
            len += n;
        }
        prev = t;
    }
    s[len] = '\0';
    return s;
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

int run_job(const Options *o, MPI_Comm world)
{
    int rank, world_size;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &world_size);
    if (world_size > 1) {
        if (rank == 0)
            fprintf(stderr, "dcpinfer: %d ranks given, but this build runs one rank per job (mpirun -np 1); "
                            "multi-rank layouts come with tensor parallelism\n",
                    world_size);
        return 2;
    }
    Timings tm = {0};
    double t_begin = now_s();
    int bound_cpus, share;
    int threads = threads_per_rank(world, &bound_cpus, &share);
    if (rank == 0 && threads < share && !o->quiet)
        printf("# note: rank 0 is bound to %d CPU(s), so it runs %d thread(s) instead of its share of %d; launch "
               "with mpirun --bind-to none (or --map-by slot:PE=%d), or srun --cpus-per-task=%d\n",
               bound_cpus, threads, share, share, share);
    const Backend *be = backend_find(o->backend);
    if (!be) {
        fprintf(stderr, "dcpinfer: %s\n", dcp_error());
        return 2;
    }
    backend_set_threads(threads);
    if (backend_cpu_set_gemm(o->cpu_gemm)) {
        fprintf(stderr, "dcpinfer: %s\n", dcp_error());
        return 2;
    }

    if (output_check_writable(o->output)) {
        fprintf(stderr, "dcpinfer: %s\n", dcp_error());
        return 1;
    }
    RequestDefaults defaults = {o->max_tokens, o->temperature, o->top_p, o->seed};
    RequestSet rs;
    if (requests_read(o->prompts, &defaults, o->skip_invalid, &rs)) {
        fprintf(stderr, "dcpinfer: %s\n", dcp_error());
        return 1;
    }
    Config cfg;
    Model model = {0};
    Tokenizer tok_storage, *tok = NULL;
    char *tok_path = o->tokenizer ? xstrdup(o->tokenizer) : default_tokenizer(o->model);
    int status = 1;
    Result *res = NULL;
    char **texts = NULL;
    if (model_read_config(o->model, &cfg) || requests_check_vocab(&rs, cfg.vocab_size, o->skip_invalid)) {
        fprintf(stderr, "dcpinfer: %s\n", dcp_error());
        goto out;
    }
    int max_model_len = o->max_model_len ? o->max_model_len : cfg.max_seq_len;
    if (max_model_len > cfg.max_seq_len) {
        fprintf(stderr, "dcpinfer: --max-model-len %d exceeds the model's maximum of %d positions\n",
                max_model_len, cfg.max_seq_len);
        goto out;
    }
    double t0 = now_s();
    if (tok_path) {
        if (tokenizer_load(&tok_storage, tok_path, cfg.vocab_size)) {
            fprintf(stderr, "dcpinfer: %s\n", dcp_error());
            goto out;
        }
        tok = &tok_storage;
    }
    prepare_prompts(&rs, tok, &cfg, max_model_len);
    tm.tokenize = now_s() - t0;
    t0 = now_s();
    if (model_load(&model, o->model, 1, 0)) {
        fprintf(stderr, "dcpinfer: %s\n", dcp_error());
        goto out;
    }
    tm.load = now_s() - t0;
    if (!o->quiet)
        printf("# dcpinfer %s: model %s (%d layers, dim %d, %d heads / %d KV heads, vocab %d), %d request(s), "
               "backend %s, %d thread(s)\n",
               PACKAGE_VERSION, model.path, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size,
               rs.n, be->name, threads);

    Engine eng;
    engine_init(&eng, &model, be, &tm);
    GenOptions go = {.max_model_len = max_model_len, .max_num_seqs = o->max_num_seqs,
                     .max_batched_tokens = o->max_batched_tokens,
                     .progress = o->progress >= 0 ? o->progress : isatty(2)};
    res = xcalloc((size_t)rs.n, sizeof(Result));
    t0 = now_s();
    generate(&eng, &rs, res, &go);
    double gen_s = now_s() - t0;
    engine_free(&eng);

    texts = xcalloc((size_t)rs.n, sizeof(char *));
    long out_tokens = 0;
    int failed = 0;
    for (int i = 0; i < rs.n; i++) {
        texts[i] = decode_text(tok, &cfg, &rs.r[i], &res[i]);
        out_tokens += res[i].n;
        if (rs.r[i].error) {
            failed++;
            fprintf(stderr, "dcpinfer: %s\n", rs.r[i].error);
        }
    }
    if (!o->quiet) {
        printf("# %-14s %8s %8s %-7s %9s %9s  %s\n", "id", "prompt", "output", "finish", "ttft_s", "e2e_s", "text");
        for (int i = 0; i < rs.n; i++) {
            printf("  %-14s %8d %8d %-7s %9.4f %9.4f  ", rs.r[i].id, rs.r[i].n_prompt, res[i].n,
                   res[i].finish_reason, res[i].ttft_s, res[i].e2e_s);
            print_preview(texts[i], &res[i]);
            putchar('\n');
        }
    }
    printf("# %d request(s), %d failed, %ld output tokens in %.3f s: %.1f tokens/s\n", rs.n, failed, out_tokens,
           gen_s, gen_s > 0 ? out_tokens / gen_s : 0.0);

    tm.total = now_s() - t_begin;
    double *all_tm = xmalloc(sizeof(double) * TIMING_N * (size_t)world_size);
    MPI_Gather(&tm, TIMING_N, MPI_DOUBLE, all_tm, TIMING_N, MPI_DOUBLE, 0, world);
    RunInfo info = {.model_path = model.path, .cfg = &cfg, .max_model_len = max_model_len,
                    .world_size = world_size, .tp = 1, .dcp = 1, .dp = 1, .threads_per_rank = threads,
                    .backend = be->name, .seed = o->seed, .prompts_path = o->prompts};
    t0 = now_s();
    if (output_write(o->output, &info, &rs, res, texts, all_tm)) {
        fprintf(stderr, "dcpinfer: %s\n", dcp_error());
    } else {
        if (!o->quiet) printf("# results written to %s\n", o->output);
        status = 0;
    }
    free(all_tm);
out:
    if (texts)
        for (int i = 0; i < rs.n; i++) free(texts[i]);
    free(texts);
    if (res) results_free(res, rs.n);
    free(res);
    if (tok) tokenizer_free(tok);
    free(tok_path);
    model_free(&model);
    requests_free(&rs);
    return status;
}
