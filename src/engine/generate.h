/* Batch generation: every request of the file goes through prefill and
 * decode together, continuously batched: each step runs the decode tokens
 * of the running requests and prefill chunks of newly admitted ones through
 * one forward pass. */
#ifndef DCP_GENERATE_H
#define DCP_GENERATE_H

#include "engine.h"
#include "requests.h"
#include "spec.h"
#include "tokenizer.h"

typedef struct {
    int max_model_len;       /* context limit: prompt + output tokens */
    int max_num_seqs;        /* requests decoding together */
    int max_batched_tokens;  /* tokens per forward pass */
    int progress;            /* on stderr: PROGRESS_TERMINAL, PROGRESS_LINES or 0 */
    double progress_interval; /* seconds between updates */
    int dp, dp_rank;         /* the DP groups, for the progress line's label */
    const Tokenizer *tok;    /* when set: output text as tokens arrive, and stop strings */
    int prefix_caching;      /* reuse cached KV blocks of earlier prompts (off with on_logits) */
    SpecConfig spec;         /* speculative decoding; method SPEC_NONE (0): off */
    /* When set, called with the logits of every position of every request
     * (forces logits for all prompt tokens too). */
    void (*on_logits)(void *ctx, int request, int pos, const float *logits, int vocab);
    void *on_logits_ctx;
    /* When set, called after every step with the requests (indices in the
     * request set) that finished in it, "stop" or "length". */
    void (*on_step)(void *ctx, const int *finished, int n_finished);
    void *on_step_ctx;
} GenOptions;

/* Progress on stderr every progress_interval seconds: one line rewritten
 * in place (a terminal), or plain lines (a pipe, a log). */
enum { PROGRESS_TERMINAL = 1, PROGRESS_LINES = 2 };

/* One scheduler step, as recorded. */
typedef struct {
    double t_start, seconds;
    int decode_tokens, prefill_tokens; /* prefill_tokens: computed, not taken from the cache;
                                        * decode_tokens: decoding requests' rows, drafts' included */
    int spec_drafted, spec_accepted;   /* speculative decoding: drafts verified, and accepted */
    int cached_tokens;  /* prompt positions taken from the prefix cache */
    int running;        /* requests in the step */
    int waiting;        /* requests queued after it */
    int preempted;      /* requests preempted to make room for it */
    int kv_blocks_used; /* blocks held during the step */
    /* a device backend's work in the step (BackendCounts): kernels queued,
     * waits for the device outside MPI, and the MPI transport's own waits
     * (buffers settled before a collective), device allocations,
     * device-to-host copies and their bytes */
    long launches, host_syncs, mpi_syncs, allocations, d2h_copies;
    long long d2h_bytes;
} StepRecord;

typedef struct {
    StepRecord *steps;
    int n_steps, cap_steps;
    long long preemptions;
    long long kv_positions_peak; /* most positions this rank stored at once */
    int kv_blocks_left;          /* blocks still held after the run: 0 */
    long long evictions;         /* cached blocks evicted for other content */
    /* speculative decoding: verifications (steps of a request with
     * drafts), and how many of them accepted draft j */
    long long spec_steps, spec_accepted_at[SPEC_MAX_TOKENS];
} GenStats;

/* Requests that carry an error are skipped (finish_reason "error"), as are
 * requests that could never fit the KV cache (they get an error). res has
 * one entry per request; stats (may be NULL) receives the step records. */
int generate(Engine *e, RequestSet *rs, Result *res, const GenOptions *o, GenStats *stats);
/* vLLM's profiling run, for --gpu-memory-utilization: engine e, whose KV
 * pool holds generate_profile_kv bytes and no request, runs one step of
 * `tokens` prompt tokens (the most a step takes: --max-num-batched-tokens;
 * requests of at most max_model_len - 1 tokens, one output token each)
 * and returns the most backend memory its buffers held at once: the
 * activation peak, weights and KV pool not counted. Its collectives,
 * timings and expert counts are not counted as the run's. A collective
 * call over the ranks of e's topology (each DP group runs the same step);
 * on the null backend, dcpinfer-plan's same number. */
size_t generate_profile(Engine *e, int tokens, int max_model_len, int dp, int dp_rank);
/* The KV pool bytes a profiling step of `tokens` tokens needs at options eo */
size_t generate_profile_kv(const Model *m, int dcp, const EngineOptions *eo, int tokens, int max_model_len);

/* The DP group of each request (malloc'ed, rs->n entries): balanced by
 * prompt plus output tokens, longest first to the least-loaded group,
 * lowest group on ties; the same on every rank. Requests with skip[i]
 * set (skip may be NULL) go to no group (-1). */
int *dp_assign(const RequestSet *rs, int dp, const char *skip);
/* The requests of DP group g, in file order: out shares rs's requests
 * (free only out->r) and index[k] is the position in rs of out->r[k]. */
void dp_select(const RequestSet *rs, const int *group, int g, RequestSet *out, int *index);

#endif
