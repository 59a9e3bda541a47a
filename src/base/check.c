#include "check.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int dcp_env_rank(void)
{
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    int initialized = 0, rank;
    MPI_Initialized(&initialized);
    if (initialized && MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS) return rank;
    for (int i = 0; i < 4; i++)
        if (getenv(names[i])) return atoi(getenv(names[i]));
    return 0;
}

void dcp_check_failed(const char *file, int line, const char *stmt, const char *what)
{
    fprintf(stderr, "dcpinfer: rank %d: %s:%d: %s: %s\n", dcp_env_rank(), file, line, stmt, what);
    fflush(stderr);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

void dcp_check_mpi(int rc, const char *file, int line, const char *stmt)
{
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    dcp_check_failed(file, line, stmt, msg);
}
