#include "comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "check.h"
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
    DCP_CHECK(MPI_Comm_size(comm, &n));
    return n;
}

/* Device buffers handed to MPI directly must hold their final values. */
static void settle(CommStats *s)
{
    if (s->sync_be) s->sync_be->synchronize();
}

/* A staged result is uploaded from page-locked memory, asynchronously:
 * wait before the staging buffer is reused. */
static void staged_upload(CommStats *s, void *dst, const float *src, size_t floats)
{
    s->stage_be->upload(dst, src, sizeof(float) * floats);
    s->stage_be->synchronize();
}

static void count(CommStats *s, CommKind k, long long bytes, double t0)
{
    CommCounter *c = &s->c[s->phase][k];
    c->calls++;
    c->bytes += bytes;
    c->seconds += now_s() - t0;
}

int comm_count(size_t n)
{
    if (n > INT_MAX) {
        char what[96];
        snprintf(what, sizeof what, "an MPI message of %zu elements, above MPI's limit of %d", n, INT_MAX);
        dcp_check_failed(__FILE__, __LINE__, "comm_count", what);
    }
    return (int)n;
}

void comm_stats_free(CommStats *s)
{
    if (s->stage) s->stage_be->host_release(s->stage);
    s->stage = NULL;
    s->stage_floats = 0;
}

/* Host staging space for `floats` floats (grown on demand). */
static float *stage(CommStats *s, size_t floats)
{
    if (floats > s->stage_floats) {
        if (s->stage) s->stage_be->host_release(s->stage);
        s->stage = s->stage_be->host_alloc(sizeof(float) * floats);
        s->stage_floats = floats;
    }
    return s->stage;
}

void comm_allreduce_sum(CommStats *s, float *buf, int n, MPI_Comm comm)
{
    if (size_of(comm) == 1) return;
    double t0 = now_s();
    if (s->stage_be) {
        float *h = stage(s, (size_t)n);
        s->stage_be->download(h, buf, sizeof(float) * n);
        DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, h, n, MPI_FLOAT, MPI_SUM, comm));
        staged_upload(s, buf, h, (size_t)n);
    } else {
        settle(s);
        DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, comm));
    }
    count(s, COMM_allreduce, 4LL * n, t0);
}

void comm_allgather(CommStats *s, CommKind kind, const float *send, int n, float *recv, MPI_Comm comm)
{
    int N = size_of(comm);
    if (N == 1) return;
    double t0 = now_s();
    if (s->stage_be) {
        float *h = stage(s, (size_t)n * (N + 1));
        s->stage_be->download(h, send, sizeof(float) * n);
        DCP_CHECK(MPI_Allgather(h, n, MPI_FLOAT, h + n, n, MPI_FLOAT, comm));
        staged_upload(s, recv, h + n, (size_t)n * N);
    } else {
        settle(s);
        DCP_CHECK(MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm));
    }
    count(s, kind, 4LL * n, t0);
}

void comm_reduce_scatter_sum(CommStats *s, const float *send, float *recv, int recvcount, MPI_Comm comm)
{
    int N = size_of(comm);
    if (N == 1) return;
    double t0 = now_s();
    if (s->stage_be) {
        float *h = stage(s, (size_t)recvcount * (N + 1));
        s->stage_be->download(h, send, sizeof(float) * recvcount * N);
        DCP_CHECK(MPI_Reduce_scatter_block(h, h + (size_t)recvcount * N, recvcount, MPI_FLOAT, MPI_SUM, comm));
        staged_upload(s, recv, h + (size_t)recvcount * N, (size_t)recvcount);
    } else {
        settle(s);
        DCP_CHECK(MPI_Reduce_scatter_block(send, recv, recvcount, MPI_FLOAT, MPI_SUM, comm));
    }
    count(s, COMM_reduce_scatter, 4LL * N * recvcount, t0);
}

void comm_alltoall(CommStats *s, const float *send, float *recv, int n, MPI_Comm comm)
{
    int N = size_of(comm);
    if (N == 1) return;
    double t0 = now_s();
    if (s->stage_be) {
        float *h = stage(s, (size_t)n * N * 2);
        s->stage_be->download(h, send, sizeof(float) * n * N);
        DCP_CHECK(MPI_Alltoall(h, n, MPI_FLOAT, h + (size_t)n * N, n, MPI_FLOAT, comm));
        staged_upload(s, recv, h + (size_t)n * N, (size_t)n * N);
    } else {
        settle(s);
        DCP_CHECK(MPI_Alltoall(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm));
    }
    count(s, COMM_all_to_all, 4LL * N * n, t0);
}

void comm_argmax(CommStats *s, ValueIndex *pairs, int rows, MPI_Comm comm)
{
    if (size_of(comm) == 1) return;
    double t0 = now_s();
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, pairs, rows, MPI_FLOAT_INT, MPI_MAXLOC, comm));
    count(s, COMM_argmax, 8LL * rows, t0);
}

void comm_allgatherv(CommStats *s, const float *send, int n, float *recv, const int *counts, const int *displs,
                     MPI_Comm comm)
{
    if (size_of(comm) == 1) return;
    double t0 = now_s();
    DCP_CHECK(MPI_Allgatherv(send, n, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, comm));
    count(s, COMM_logits_gather, 4LL * n, t0);
}

void comm_gather_logprobs(CommStats *s, const float *send, int n, float *recv, MPI_Comm comm)
{
    if (size_of(comm) == 1) return;
    double t0 = now_s();
    DCP_CHECK(MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm));
    count(s, COMM_logprob_gather, 4LL * n, t0);
}
