/* The HDF5 results file, written by world rank 0 under a temporary name
 * and renamed into place, so a reader never sees a half-written file.
 * Layout (docs/output.md):
 *   /            attributes: version, model, shapes, layout, backend, seed, created
 *   /requests/   id, line, prompt_offsets, prompt_tokens, output_offsets,
 *                output_tokens, text, finish_reason, error, ttft_s, tpot_s,
 *                e2e_s, itl_offsets, itl_s
 *   /layout/     the rank map: coordinates, heads and host of each rank
 *   /timings/    one dataset per phase: seconds on each rank (world_size)
 *   /comm/PHASE/KIND/  calls, bytes, seconds of each collective per rank
 *   /memory/     kv_bytes_peak, weight_bytes, rss_bytes_peak per rank
 *   /moe/        with expert parallelism: expert_tokens (layers x experts),
 *                idle_steps and idle_seconds per rank
 *   /steps/      one row per scheduler step of each DP group */
#ifndef DCP_OUTPUT_H
#define DCP_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "generate.h"
#include "model.h"
#include "requests.h"
#include "timing.h"
#include "tokenizer.h"

/* Where one rank sits and what it holds (the start-up rank map). */
typedef struct {
    int world_rank, dp_rank, tp_rank, dcp_rank;
    int q_head0, q_heads, kv_head0, kv_heads;
    int device; /* GPU index, -1 on the CPU backend */
    char host[64];
} RankInfo;

/* Expert parallelism's counts (moe.c, MoeCounts), gathered to rank 0. */
typedef struct {
    int layers, experts, ep;
    const long long *expert_tokens; /* (layers, experts): pairs each expert received, all steps and DP groups */
    const long long *idle_steps;    /* per rank: passes without tokens of its own (engine_idle) */
    const double *idle_seconds;
} MoeReport;

/* Per-rank figures gathered to rank 0, world_size entries each. */
typedef struct {
    const RankInfo *ranks;
    const double *timings;          /* (world_size, TIMING_N) seconds */
    const CommStats *comm;
    const long long *kv_peak_bytes; /* most KV bytes the rank held at once */
    const long long *weight_bytes;  /* the rank's weights */
    const long long *rss_peak_bytes; /* its peak resident memory (getrusage) */
    const MoeReport *moe;            /* NULL without expert parallelism */
} RankReports;

/* The scheduler's steps of every DP group, and the run's totals. */
typedef struct {
    const StepRecord *steps;
    const int *dp_rank;      /* per step: its DP group */
    int n_steps;
    int kv_blocks;           /* per rank */
    int block_size;
    long long kv_capacity;   /* positions of one DCP group */
    double generation_s;
    int device;              /* a device backend's figures are in the records (/gpu/steps) */
} StepReport;

typedef struct {
    const char *model_path;
    const char *served_model_name; /* OpenAI responses' "model" (NULL: model_path's last part) */
    const Config *cfg;
    int max_model_len;
    int world_size, tp, dcp, dp;
    int interleave;
    const char *dcp_comm_backend;
    int threads_per_rank;
    const char *backend;
    const char *mpi_buffers; /* host, device or staged */
    const char *cpu_kernels; /* the CPU backend's kernels (--cpu-isa): avx512, avx2 or generic; "" on a GPU */
    uint64_t seed;
    const char *prompts_path;
    const char *identity;    /* the run identity (identity.h), JSON */
    const char *reduction_order; /* reduction_order (model.h) */
    int k_chunks, key_shards;    /* the model's canonical sizes (Shard) */
    int resumed_requests;    /* taken from an earlier run's journal */
    long long run_tokens;    /* output tokens and finished requests of this run (the rates' basis) */
    int run_requests;
    int reasoning_parser;    /* reasoning.h: REASONING_NONE, or the split of each text the results carry */
    const char *speculative_config; /* --speculative-config as given; NULL: none */
} RunInfo;

/* Fails when the file's folder is missing or not writable, so that a run
 * stops before its work rather than after it. */
int output_check_writable(const char *path);

/* The run identity a complete results file carries (JSON, malloc'ed):
 * HDF5 files in their run_identity attribute, JSON Lines files in
 * OUT.run.json beside them; NULL when there is none. */
char *output_read_identity(const char *path, const char *format);

/* texts: one per request. */
int output_write(const char *path, const RunInfo *info, const RequestSet *rs, const Result *res,
                 char *const *texts, const RankReports *rep, const StepReport *steps);

/* The results as JSON Lines, one object per request in input order
 * (docs/output.md, "JSON Lines results"): dcpinfer's own form, or for OpenAI batch input
 * the OpenAI batch output form with a completions body. tok (may be NULL)
 * spells the tokens of log-probabilities. Then OUT.run.json: the run
 * identity, with the results file's size and hash. */
int output_write_jsonl(const char *path, const RunInfo *info, const RequestSet *rs, const Result *res,
                       char *const *texts, const Tokenizer *tok);

#endif
