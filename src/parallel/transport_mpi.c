/* The MPI transports (comm.h), each collective over a group of more than
 * one rank; comm.c counts what they send.
 *   transport_mpi         MPI on the buffers themselves: host memory (the
 *                         CPU backend), or device memory where the MPI
 *                         library takes device pointers (CUDA-aware MPI),
 *                         handed over once the backend's queue has drained
 *   transport_mpi_staged  device buffers copied through the backend's
 *                         page-locked host memory around the same MPI calls
 * The MPI calls are the same functions in both; staging only wraps them. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "comm.h"
#include "tree.h"
#include "util.h"

/* Buffers handed to MPI must hold their final values. Every wait for the
 * device made here is counted (CommStats.device_waits), so that a step's
 * figures can tell them from the engine's own (/gpu/steps). */
static void settle(CommStats *s)
{
    s->device_waits++;
    s->be->synchronize();
}

/* A staged result is uploaded from page-locked memory, asynchronously:
 * wait before the staging buffer is reused. */
static void staged_upload(CommStats *s, void *dst, const float *src, size_t floats)
{
    s->be->upload(dst, src, sizeof(float) * floats);
    settle(s);
}

/* A device buffer copied to the host for MPI (a download waits for the device). */
static void staged_download(CommStats *s, float *dst, const float *src, size_t floats)
{
    s->device_waits++;
    s->be->download(dst, src, sizeof(float) * floats);
}

/* Host staging space for `floats` floats (grown on demand). */
static float *stage(CommStats *s, size_t floats)
{
    if (floats > s->stage_floats) {
        if (s->stage) s->be->host_release(s->stage);
        s->stage = s->be->host_alloc(sizeof(float) * floats);
        s->stage_floats = floats;
    }
    return s->stage;
}

/* The canonical sum (comm_sum_tree) of b (n floats) with recv (N slices of
 * this rank's share) as scratch, both in memory MPI reads; the additions
 * by the backend (device) or on the host (staged). */
static void sum_tree_on(CommStats *s, float *b, float *recv, int n, const Group *g, int on_backend)
{
    int N = g->size, me = g->rank;
    int *cnt = xmalloc(sizeof(int) * 4 * (size_t)N), *displ = cnt + N, *rcount = displ + N, *rdispl = rcount + N;
    for (int r = 0; r < N; r++) cnt[r] = comm_slice(n, N, r, &displ[r]);
    int mine = cnt[me];
    for (int r = 0; r < N; r++) {
        rcount[r] = mine;
        rdispl[r] = r * mine;
    }
    /* rank d receives slice d of every rank's partial sum, adds them by
     * the sum tree (tree.h: the upper levels of the canonical tree over
     * the K chunks), and all gather the slices */
    DCP_CHECK(MPI_Alltoallv(b, cnt, displ, MPI_FLOAT, recv, rcount, rdispl, MPI_FLOAT, g->comm));
    if (on_backend) s->be->sum_parts(recv, N, (size_t)mine);
    else
        for (int i = 0; i < N - 1; i++) {
            TreeStep st = tree_sum_step(N, i);
            float *into = recv + (size_t)st.into * mine, *from = recv + (size_t)st.from * mine;
            for (int j = 0; j < mine; j++) into[j] += from[j];
        }
    if (on_backend) {
        s->be->copy(b + displ[me], recv, sizeof(float) * mine);
        settle(s);
    } else {
        memcpy(b + displ[me], recv, sizeof(float) * mine);
    }
    DCP_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, b, cnt, displ, MPI_FLOAT, g->comm));
    free(cnt);
}

static void mpi_sum_tree(CommStats *s, float *buf, float *scratch, int n, const Group *g)
{
    settle(s);
    sum_tree_on(s, buf, scratch, n, g, 1);
}

static void staged_sum_tree(CommStats *s, float *buf, float *scratch, int n, const Group *g)
{
    (void)scratch;
    int at, mine = comm_slice(n, g->size, g->rank, &at);
    float *b = stage(s, (size_t)n + (size_t)mine * (size_t)g->size); /* the whole exchange in host memory */
    staged_download(s, b, buf, n);
    sum_tree_on(s, b, b + n, n, g, 0);
    staged_upload(s, buf, b, (size_t)n);
}

static void sendrecv(const float *send, float *recv, int n, int partner, const Group *g)
{
    DCP_CHECK(MPI_Sendrecv(send, n, MPI_FLOAT, partner, 0, recv, n, MPI_FLOAT, partner, 0, g->comm, MPI_STATUS_IGNORE));
}

static void mpi_sendrecv(CommStats *s, const float *send, float *recv, int n, int partner, const Group *g)
{
    settle(s);
    sendrecv(send, recv, n, partner, g);
}

static void staged_sendrecv(CommStats *s, const float *send, float *recv, int n, int partner, const Group *g)
{
    float *h = stage(s, (size_t)n * 2);
    staged_download(s, h, send, n);
    sendrecv(h, h + n, n, partner, g);
    staged_upload(s, recv, h + n, (size_t)n);
}

static void mpi_allgather(CommStats *s, const float *send, int n, float *recv, const Group *g)
{
    settle(s);
    DCP_CHECK(MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, g->comm));
}

static void staged_allgather(CommStats *s, const float *send, int n, float *recv, const Group *g)
{
    float *h = stage(s, (size_t)n * (g->size + 1));
    staged_download(s, h, send, n);
    mpi_allgather(s, h, n, h + n, g);
    staged_upload(s, recv, h + n, (size_t)n * g->size);
}

static void mpi_alltoall(CommStats *s, const float *send, float *recv, int n, const Group *g)
{
    settle(s);
    DCP_CHECK(MPI_Alltoall(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, g->comm));
}

static void staged_alltoall(CommStats *s, const float *send, float *recv, int n, const Group *g)
{
    size_t all = (size_t)n * g->size;
    float *h = stage(s, all * 2);
    staged_download(s, h, send, all);
    mpi_alltoall(s, h, h + all, n, g);
    staged_upload(s, recv, h + all, all);
}

/* host arrays, in either transport */
static void mpi_argmax(CommStats *s, ValueIndex *pairs, int rows, const Group *g)
{
    (void)s;
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, pairs, rows, MPI_FLOAT_INT, MPI_MAXLOC, g->comm));
}

static void mpi_allgatherv(CommStats *s, const float *send, int n, float *recv, const int *counts, const int *displs,
                           const Group *g)
{
    (void)s;
    DCP_CHECK(MPI_Allgatherv(send, n, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, g->comm));
}

static void mpi_sum_int64(CommStats *s, int64_t *v, int n, const Group *g)
{
    (void)s;
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_SUM, g->comm));
}

static void mpi_alltoall_ints(CommStats *s, const int *send, int *recv, int n, const Group *g)
{
    (void)s;
    DCP_CHECK(MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, g->comm));
}

static int mpi_any(CommStats *s, int flag, const Group *g)
{
    (void)s;
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, g->comm));
    return flag;
}

static MPI_Datatype row_type(int width)
{
    MPI_Datatype t;
    DCP_CHECK(MPI_Type_contiguous(width, MPI_FLOAT, &t));
    DCP_CHECK(MPI_Type_commit(&t));
    return t;
}

static int rows_total(const int *count, int N)
{
    long long n = 0;
    for (int r = 0; r < N; r++) n += count[r];
    return comm_count((size_t)n);
}

static void alltoallv_rows(const float *send, const int *scount, const int *sdispl, float *recv, const int *rcount,
                           const int *rdispl, int width, const Group *g)
{
    MPI_Datatype row = row_type(width);
    DCP_CHECK(MPI_Alltoallv(send, scount, sdispl, row, recv, rcount, rdispl, row, g->comm));
    DCP_CHECK(MPI_Type_free(&row));
}

static void mpi_alltoallv_rows(CommStats *s, const float *send, const int *scount, const int *sdispl, float *recv,
                               const int *rcount, const int *rdispl, int width, const Group *g)
{
    settle(s);
    alltoallv_rows(send, scount, sdispl, recv, rcount, rdispl, width, g);
}

/* displacements index rows of the packed send and receive arrays */
static void staged_alltoallv_rows(CommStats *s, const float *send, const int *scount, const int *sdispl, float *recv,
                                  const int *rcount, const int *rdispl, int width, const Group *g)
{
    size_t w = (size_t)width, ns = (size_t)rows_total(scount, g->size), nr = (size_t)rows_total(rcount, g->size);
    float *h = stage(s, w * (ns + nr) + 1);
    if (ns) staged_download(s, h, send, w * ns);
    alltoallv_rows(h, scount, sdispl, h + w * ns, rcount, rdispl, width, g);
    if (nr) staged_upload(s, recv, h + w * ns, w * nr);
}

static void allgatherv_rows(float *b, const int *cnt, const int *displ, int width, const Group *g)
{
    MPI_Datatype row = row_type(width);
    DCP_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, row, b, cnt, displ, row, g->comm));
    DCP_CHECK(MPI_Type_free(&row));
}

static void mpi_allgatherv_rows(CommStats *s, float *buf, const int *cnt, const int *displ, int width, const Group *g)
{
    settle(s);
    allgatherv_rows(buf, cnt, displ, width, g);
}

static void staged_allgatherv_rows(CommStats *s, float *buf, const int *cnt, const int *displ, int width,
                                   const Group *g)
{
    int me = g->rank, n = 0;
    for (int r = 0; r < g->size; r++) n = displ[r] + cnt[r] > n ? displ[r] + cnt[r] : n;
    size_t w = (size_t)width, at = w * (size_t)displ[me];
    float *b = stage(s, w * (size_t)n + 1);
    if (cnt[me]) staged_download(s, b + at, buf + at, w * (size_t)cnt[me]);
    allgatherv_rows(b, cnt, displ, width, g);
    if (n) staged_upload(s, buf, b, w * (size_t)n);
}

const Transport transport_mpi = {
    .name = "mpi",
    .sum_tree = mpi_sum_tree,
    .allgather = mpi_allgather,
    .sendrecv = mpi_sendrecv,
    .alltoall = mpi_alltoall,
    .argmax = mpi_argmax,
    .allgatherv = mpi_allgatherv,
    .sum_int64 = mpi_sum_int64,
    .alltoallv_rows = mpi_alltoallv_rows,
    .alltoall_ints = mpi_alltoall_ints,
    .allgatherv_rows = mpi_allgatherv_rows,
    .any = mpi_any,
};

const Transport transport_mpi_staged = {
    .name = "mpi-staged",
    .sum_tree = staged_sum_tree,
    .allgather = staged_allgather,
    .sendrecv = staged_sendrecv,
    .alltoall = staged_alltoall,
    .argmax = mpi_argmax,
    .allgatherv = mpi_allgatherv,
    .sum_int64 = mpi_sum_int64,
    .alltoallv_rows = staged_alltoallv_rows,
    .alltoall_ints = mpi_alltoall_ints,
    .allgatherv_rows = staged_allgatherv_rows,
    .any = mpi_any,
};
