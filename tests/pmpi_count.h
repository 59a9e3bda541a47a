/* What really crossed MPI: the collectives the forward pass and the token
 * choice use, counted at the MPI interface itself by PMPI interposition
 * (these definitions replace the library's for the whole test program,
 * libdcpinfer.a included, and call the PMPI_ entry points). The counts are
 * independent of dcpinfer's own CommStats, which the tests compare with
 * them. Bytes are those one rank sends, in comm.h's terms. */
#ifndef DCP_PMPI_COUNT_H
#define DCP_PMPI_COUNT_H

#include <mpi.h>

/* PM_TP_SUM: an MPI_Alltoallv of floats (a call and its bytes to the
 * other ranks) and the in-place MPI_Allgatherv of floats after it (its
 * bytes). Expert parallelism's exchanges move rows (an MPI type of dim
 * floats) and int counts: PM_MOE_DISPATCH, the MPI_Alltoall of ints and
 * every first MPI_Alltoallv of rows (a layer's rows out); PM_MOE_COMBINE,
 * every second one (the outputs back) and the in-place MPI_Allgatherv of
 * rows; PM_MAX, MPI_Allreduce(MAX) (ep_step). */
enum { PM_SUM, PM_MAXLOC, PM_ALLGATHER, PM_SENDRECV, PM_ALLTOALL, PM_ALLGATHERV, PM_TP_SUM, PM_MOE_DISPATCH,
       PM_MOE_COMBINE, PM_MAX, PM_N };
static const char *const pm_names[PM_N] = {"MPI_Allreduce(SUM)", "MPI_Allreduce(MAXLOC)", "MPI_Allgather",
                                           "MPI_Sendrecv", "MPI_Alltoall", "MPI_Allgatherv",
                                           "MPI_Alltoallv + MPI_Allgatherv(in place)",
                                           "MPI_Alltoall(ints) + MPI_Alltoallv(rows out)",
                                           "MPI_Alltoallv(rows back) + MPI_Allgatherv(rows, in place)",
                                           "MPI_Allreduce(MAX)"};
static int pm_rows_back; /* the next MPI_Alltoallv of rows is a combine */

typedef struct {
    long long calls, bytes;
} PmpiCount;

static PmpiCount pmpi_counts[PM_N];
static int pmpi_counting; /* set around the runs to count */

static long long pm_bytes(int count, MPI_Datatype t)
{
    int size;
    PMPI_Type_size(t, &size);
    return (long long)count * size;
}

static int pm_size(MPI_Comm c)
{
    int n;
    PMPI_Comm_size(c, &n);
    return n;
}

static void pm_count(int kind, long long bytes)
{
    if (!pmpi_counting) return;
    pmpi_counts[kind].calls++;
    pmpi_counts[kind].bytes += bytes;
}

int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm)
{
    pm_count(op == MPI_MAXLOC ? PM_MAXLOC : op == MPI_MAX ? PM_MAX : PM_SUM, pm_bytes(count, t));
    return PMPI_Allreduce(send, recv, count, t, op, comm);
}

int MPI_Allgather(const void *send, int scount, MPI_Datatype st, void *recv, int rcount, MPI_Datatype rt,
                  MPI_Comm comm)
{
    pm_count(PM_ALLGATHER, pm_bytes(scount, st));
    return PMPI_Allgather(send, scount, st, recv, rcount, rt, comm);
}

int MPI_Sendrecv(const void *send, int scount, MPI_Datatype st, int dest, int stag, void *recv, int rcount,
                 MPI_Datatype rt, int source, int rtag, MPI_Comm comm, MPI_Status *status)
{
    pm_count(PM_SENDRECV, pm_bytes(scount, st));
    return PMPI_Sendrecv(send, scount, st, dest, stag, recv, rcount, rt, source, rtag, comm, status);
}

int MPI_Alltoallv(const void *send, const int *scounts, const int *sdispls, MPI_Datatype st, void *recv,
                  const int *rcounts, const int *rdispls, MPI_Datatype rt, MPI_Comm comm)
{
    int me;
    PMPI_Comm_rank(comm, &me);
    long long b = 0;
    for (int r = 0; r < pm_size(comm); r++)
        if (r != me) b += pm_bytes(scounts[r], st);
    int kind = PM_TP_SUM;
    if (st != MPI_FLOAT) {
        kind = pm_rows_back ? PM_MOE_COMBINE : PM_MOE_DISPATCH;
        pm_rows_back = !pm_rows_back;
    }
    pm_count(kind, b);
    return PMPI_Alltoallv(send, scounts, sdispls, st, recv, rcounts, rdispls, rt, comm);
}

int MPI_Alltoall(const void *send, int scount, MPI_Datatype st, void *recv, int rcount, MPI_Datatype rt,
                 MPI_Comm comm)
{
    if (st == MPI_INT) /* expert parallelism's counts: the bytes to the other ranks */
        pm_count(PM_MOE_DISPATCH, (pm_size(comm) - 1) * pm_bytes(scount, st));
    else pm_count(PM_ALLTOALL, pm_size(comm) * pm_bytes(scount, st));
    return PMPI_Alltoall(send, scount, st, recv, rcount, rt, comm);
}

int MPI_Allgatherv(const void *send, int scount, MPI_Datatype st, void *recv, const int *rcounts,
                   const int *displs, MPI_Datatype rt, MPI_Comm comm)
{
    if (send == MPI_IN_PLACE && rt != MPI_FLOAT) { /* expert parallelism's combined rows: a call of its own */
        int me;
        PMPI_Comm_rank(comm, &me);
        pm_count(PM_MOE_COMBINE, (pm_size(comm) - 1) * pm_bytes(rcounts[me], rt));
    } else if (send == MPI_IN_PLACE) { /* a tp_sum's second half: no call of its own */
        int me;
        PMPI_Comm_rank(comm, &me);
        if (pmpi_counting) pmpi_counts[PM_TP_SUM].bytes += (pm_size(comm) - 1) * pm_bytes(rcounts[me], rt);
    } else {
        pm_count(PM_ALLGATHERV, pm_bytes(scount, st));
    }
    return PMPI_Allgatherv(send, scount, st, recv, rcounts, displs, rt, comm);
}

#endif
