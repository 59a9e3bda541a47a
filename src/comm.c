#include "comm.h"

#include "util.h"

const char *const comm_kind_names[COMM_N] = {
#define COMM_NAME(name) #name,
    COMM_KINDS(COMM_NAME)
#undef COMM_NAME
};
const char *const phase_names[PHASE_N] = {"prefill", "decode"};

static int size_of(MPI_Comm comm)
{
    int n;
    MPI_Comm_size(comm, &n);
    return n;
}

static void count(CommStats *s, CommKind k, long long bytes, double t0)
{
    CommCounter *c = &s->c[s->phase][k];
    c->calls++;
    c->bytes += bytes;
    c->seconds += now_s() - t0;
}

void comm_allreduce_sum(CommStats *s, float *buf, int n, MPI_Comm comm)
{
    if (size_of(comm) == 1) return;
    double t0 = now_s();
    MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, comm);
    count(s, COMM_allreduce, 4LL * n, t0);
}

void comm_allgather(CommStats *s, CommKind kind, const float *send, int n, float *recv, MPI_Comm comm)
{
    if (size_of(comm) == 1) return;
    double t0 = now_s();
    MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm);
    count(s, kind, 4LL * n, t0);
}

void comm_reduce_scatter_sum(CommStats *s, const float *send, float *recv, int recvcount, MPI_Comm comm)
{
    int N = size_of(comm);
    if (N == 1) return;
    double t0 = now_s();
    MPI_Reduce_scatter_block(send, recv, recvcount, MPI_FLOAT, MPI_SUM, comm);
    count(s, COMM_reduce_scatter, 4LL * N * recvcount, t0);
}

void comm_alltoall(CommStats *s, const float *send, float *recv, int n, MPI_Comm comm)
{
    int N = size_of(comm);
    if (N == 1) return;
    double t0 = now_s();
    MPI_Alltoall(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm);
    count(s, COMM_all_to_all, 4LL * N * n, t0);
}

void comm_argmax(CommStats *s, ValueIndex *pairs, int rows, MPI_Comm comm)
{
    if (size_of(comm) == 1) return;
    double t0 = now_s();
    MPI_Allreduce(MPI_IN_PLACE, pairs, rows, MPI_FLOAT_INT, MPI_MAXLOC, comm);
    count(s, COMM_argmax, 8LL * rows, t0);
}

void comm_allgatherv(CommStats *s, const float *send, int n, float *recv, const int *counts, const int *displs,
                     MPI_Comm comm)
{
    if (size_of(comm) == 1) return;
    double t0 = now_s();
    MPI_Allgatherv(send, n, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, comm);
    count(s, COMM_logits_gather, 4LL * n, t0);
}
