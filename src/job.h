/* One dcpinfer run: read and check the prompts, load the model, generate,
 * report. Called by main() between MPI_Init and MPI_Finalize. */
#ifndef DCP_JOB_H
#define DCP_JOB_H

#include <mpi.h>

#include "options.h"

/* Threads for this rank: OMP_NUM_THREADS, else the node's cores divided by
 * the ranks on the node (MPI_COMM_TYPE_SHARED), at most the CPUs the rank
 * is bound to. Reports that count and the node share (may be NULL). */
int threads_per_rank(MPI_Comm world, int *bound_cpus, int *share);

/* device: the GPU chosen before MPI_Init (-1: none). Returns the process
 * exit status. */
int run_job(const Options *o, MPI_Comm world, int device);

#endif
