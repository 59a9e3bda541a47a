#include <mpi.h>
#include <stdio.h>

#include "device.h"
#include "job.h"
#include "options.h"
#include "check.h"
#include "util.h"

int main(int argc, char **argv)
{
    /* The command line is parsed before MPI_Init, because the GPU is chosen
     * from it (--backend, in any form getopt accepts) and from the local
     * rank before MPI_Init, so that MPI's own GPU resources land on it. */
    Options o;
    int rc = options_parse(&o, argc, argv, dcp_env_rank() == 0);
    int device = rc == 0 ? device_select(o.backend) : -1;
    MPI_Init(&argc, &argv);
    /* MPI errors come back as codes, reported by DCP_CHECK with the place */
    DCP_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    int rank;
    DCP_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    int status;
    if (rc < 0) {
        if (rank == 0) fprintf(stderr, "dcpinfer: %s\n", dcp_error());
        status = EXIT_USAGE;
    } else if (rc > 0) {
        status = 0;
    } else {
        status = run_job(&o, MPI_COMM_WORLD, device);
    }
    MPI_Finalize();
    return status;
}
