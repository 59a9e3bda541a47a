/* One dcpinfer run: read and check the prompts, load the model, generate,
 * report. Called by main() between MPI_Init and MPI_Finalize. */
#ifndef DCP_JOB_H
#define DCP_JOB_H

#include <mpi.h>

#include "options.h"

/* Threads for this rank: OMP_NUM_THREADS, else the node's cores divided by
 * the ranks on the node (MPI_COMM_TYPE_SHARED). */
int threads_per_rank(MPI_Comm world);

/* Returns the process exit status. */
int run_job(const Options *o, MPI_Comm world);

#endif
