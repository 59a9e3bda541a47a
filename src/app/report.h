/* What rank 0 prints about a run on stdout: the rank map, one line per
 * request, the collectives, the steps, memory and latencies. */
#ifndef DCP_REPORT_H
#define DCP_REPORT_H

#include <stddef.h>

#include "comm.h"
#include "generate.h"
#include "output.h"
#include "requests.h"

void report_rank_map(const RankInfo *ri, int world);
/* The KV cache's lines, as vLLM words its last two: blocks and MiB per
 * rank, "KV cache size: N tokens", "Maximum concurrency for L tokens per
 * request: X.XXx" (the run's and dcpinfer-plan's). */
void report_kv_cache(const KvSizing *kv, int dcp, int max_model_len);
/* --gpu-memory-utilization's sizing of the KV cache, as vLLM says it
 * (dcpinfer and dcpinfer-plan print the same lines) */
void report_gpu_budget(const GpuBudget *b);
/* One line per request: id, prompt and output tokens, finish, TTFT,
 * latency and the start of its text (or of its token ids). */
void report_requests(const RequestSet *rs, const Result *res, char *const *texts);
/* Collectives per run: calls and bytes summed over ranks, seconds as
 * avg/min/max over ranks (each rank's total); KV bytes at peak per rank. */
void report_comm(const CommStats *cs, const long long *kv_peak, int world);
/* The steps' summary. DP groups step concurrently, each on its own
 * requests: their step counts and decode-only times are given per group. */
/* Expert parallelism: how evenly the routed tokens fell on the experts
 * and on the ranks that hold them, and the DP groups' idle passes. */
void report_moe(const MoeReport *m, int world);
void report_steps(const StepRecord *steps, const int *step_dp, int n_steps, int dp, int kv_blocks);
/* "prefix cache hit rate: X% (N of M prompt tokens)" over the requests
 * this run computed (skip[i] set: resumed from the journal; failed ones
 * carry none): each request's first admission's cached positions. */
void report_prefix_cache(const RequestSet *rs, const Result *res, const char *skip);
/* Mean, median and 99th percentile of TTFT, TPOT and ITL over the
 * requests that produced tokens. */
void report_latency(const RequestSet *rs, const Result *res);

/* The value at the nearest rank of percentile p (0 < p <= 100) of n sorted
 * values: the smallest value with at least p% of them at or below it. */
double percentile_nearest_rank(const double *sorted, long n, double p);
/* A quoted preview of text (len bytes): at most max_chars characters, cut
 * only between whole UTF-8 characters ("..." after a cut), newlines and
 * control bytes escaped, bytes that are not UTF-8 as \xNN. Into out (n
 * bytes, which must hold 8 * max_chars + 8). */
void text_preview(const char *text, size_t len, int max_chars, char *out, size_t n);

/* The speculative decoding line: drafts, accepted ones, the mean
 * acceptance length (1 + accepted per verification, as vLLM reports it)
 * and the acceptance rate of each draft position (verifications that kept
 * draft j over all verifications). */
void report_spec(const SpecConfig *sc, const StepRecord *steps, int n_steps, long long verifications,
                 const long long *accepted_at);

#endif
