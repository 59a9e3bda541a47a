/* The HDF5 results file, written by world rank 0 under a temporary name
 * and renamed into place, so a reader never sees a half-written file.
 * Layout (README "Output file"):
 *   /            attributes: version, model, shapes, layout, backend, seed, created
 *   /requests/   id, line, prompt_offsets, prompt_tokens, output_offsets,
 *                output_tokens, text, finish_reason, error, ttft_s, tpot_s, e2e_s
 *   /timings/    one dataset per phase: seconds on each rank (world_size) */
#ifndef DCP_OUTPUT_H
#define DCP_OUTPUT_H

#include <stdint.h>

#include "generate.h"
#include "model.h"
#include "requests.h"
#include "timing.h"

typedef struct {
    const char *model_path;
    const Config *cfg;
    int max_model_len;
    int world_size, tp, dcp, dp;
    int threads_per_rank;
    const char *backend;
    uint64_t seed;
    const char *prompts_path;
} RunInfo;

/* Fails when the file's folder is missing or not writable, so that a run
 * stops before its work rather than after it. */
int output_check_writable(const char *path);

/* timings: world_size rows of TIMING_N seconds; texts: one per request. */
int output_write(const char *path, const RunInfo *info, const RequestSet *rs, const Result *res,
                 char *const *texts, const double *timings);

#endif
