/* One dcpinfer run: read and check the prompts, load the model, generate,
 * report. Called by main() between MPI_Init and MPI_Finalize. */
#ifndef DCP_JOB_H
#define DCP_JOB_H

#include <mpi.h>

#include "options.h"

/* Threads for this rank: OMP_NUM_THREADS, else the node's cores divided by
 * the ranks on the node (MPI_COMM_TYPE_SHARED), at most the CPUs the rank
 * is bound to. Reports that count (bound_cpus) and, only when the binding
 * lowered the thread count, the node share it would have had (share; 0
 * otherwise). Either may be NULL. */
int threads_per_rank(MPI_Comm world, int *bound_cpus, int *share);

/* Exit status of dcpinfer (docs/usage.md, "Exit status"). */
enum {
    EXIT_OK = 0,          /* every request finished; results written */
    EXIT_RUN_FAILED = 1,  /* the run stopped: bad input, model, layout, or writing the results */
    EXIT_USAGE = 2,       /* bad command line */
    EXIT_CHECK = 3,       /* an MPI or CUDA call failed (the job was aborted) */
    EXIT_SOME_FAILED = 4, /* results written, but at least one request failed (see /requests/error) */
    EXIT_STALLED = 5,     /* no step completed within --step-timeout */
};

/* device: the GPU chosen before MPI_Init (-1: none). Returns the process
 * exit status. */
int run_job(const Options *o, MPI_Comm world, int device);

#endif
