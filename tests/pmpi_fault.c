/* dcpinfer with MPI calls that fail on demand: linked into a test build of
 * the program (tests/dcpinfer-mpifault), these definitions take the place
 * of the library's (PMPI interposition). DCP_FAIL_MPI names the function
 * whose calls return MPI_ERR_OTHER instead of running, to check that every
 * call is checked and reported with its place. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static int fails(const char *name)
{
    const char *e = getenv("DCP_FAIL_MPI");
    return e && !strcmp(e, name);
}

int MPI_Send(const void *buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm comm)
{
    return fails("MPI_Send") ? MPI_ERR_OTHER : PMPI_Send(buf, count, t, dest, tag, comm);
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *out)
{
    return fails("MPI_Comm_split") ? MPI_ERR_OTHER : PMPI_Comm_split(comm, color, key, out);
}

int MPI_Gather(const void *send, int scount, MPI_Datatype st, void *recv, int rcount, MPI_Datatype rt, int root,
               MPI_Comm comm)
{
    return fails("MPI_Gather") ? MPI_ERR_OTHER : PMPI_Gather(send, scount, st, recv, rcount, rt, root, comm);
}
