#include "comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "tree.h"
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

/* dst[i] += src[i]: on the host, or on the device when MPI reads device
 * memory (the backend's add) */
static void add_floats(CommStats *s, float *dst, const float *src, size_t n, int device)
{
    if (device) {
        s->sync_be->add(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Slice r of n elements split over N ranks: [n r / N, n (r + 1) / N). */
static void slices(int n, int N, int *count, int *displ)
{
    for (int r = 0; r < N; r++) {
        displ[r] = (int)((long long)n * r / N);
        count[r] = (int)((long long)n * (r + 1) / N) - displ[r];
    }
}

long long comm_sum_tree_bytes(long long n, int N, int me)
{
    long long mine = n * (me + 1) / N - n * me / N;
    return N > 1 ? 4 * (n - mine) + 4 * mine * (N - 1) : 0;
}

void comm_sum_tree(CommStats *s, float *buf, float *scratch, int n, MPI_Comm comm)
{
    int N = size_of(comm), me;
    if (N == 1) return;
    DCP_CHECK(MPI_Comm_rank(comm, &me));
    double t0 = now_s();
    int *cnt = xmalloc(sizeof(int) * 4 * (size_t)N), *displ = cnt + N, *rcount = displ + N, *rdispl = rcount + N;
    slices(n, N, cnt, displ);
    int mine = cnt[me];
    for (int r = 0; r < N; r++) {
        rcount[r] = mine;
        rdispl[r] = r * mine;
    }
    int device = !s->stage_be && s->sync_be;
    float *b = buf, *recv = scratch;
    if (s->stage_be) { /* the whole exchange in host memory */
        b = stage(s, (size_t)n + (size_t)mine * N);
        recv = b + n;
        s->stage_be->download(b, buf, sizeof(float) * n);
    } else {
        settle(s);
    }
    /* rank d receives slice d of every rank's partial sum, adds them by
     * the sum tree (tree.h: the upper levels of the canonical tree over
     * the K chunks), and all gather the slices */
    DCP_CHECK(MPI_Alltoallv(b, cnt, displ, MPI_FLOAT, recv, rcount, rdispl, MPI_FLOAT, comm));
    for (int i = 0; i < N - 1; i++) {
        TreeStep st = tree_sum_step(N, i);
        add_floats(s, recv + (size_t)st.into * mine, recv + (size_t)st.from * mine, (size_t)mine, device);
    }
    if (device) s->sync_be->copy(b + displ[me], recv, sizeof(float) * mine);
    else memcpy(b + displ[me], recv, sizeof(float) * mine);
    if (device) settle(s);
    DCP_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, b, cnt, displ, MPI_FLOAT, comm));
    if (s->stage_be) staged_upload(s, buf, b, (size_t)n);
    count(s, COMM_tp_sum, comm_sum_tree_bytes(n, N, me), t0);
    free(cnt);
}

void comm_sendrecv(CommStats *s, CommKind kind, const float *send, float *recv, int n, int partner, MPI_Comm comm)
{
    double t0 = now_s();
    if (s->stage_be) {
        float *h = stage(s, (size_t)n * 2);
        s->stage_be->download(h, send, sizeof(float) * n);
        DCP_CHECK(MPI_Sendrecv(h, n, MPI_FLOAT, partner, 0, h + n, n, MPI_FLOAT, partner, 0, comm, MPI_STATUS_IGNORE));
        staged_upload(s, recv, h + n, (size_t)n);
    } else {
        settle(s);
        DCP_CHECK(MPI_Sendrecv(send, n, MPI_FLOAT, partner, 0, recv, n, MPI_FLOAT, partner, 0, comm, MPI_STATUS_IGNORE));
    }
    count(s, kind, 4LL * n, t0);
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

void comm_sum_int64(CommStats *s, int64_t *v, int n, MPI_Comm comm)
{
    if (size_of(comm) == 1 || n == 0) return;
    double t0 = now_s();
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_SUM, comm));
    count(s, COMM_logprob_gather, 8LL * n, t0);
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

void comm_alltoallv_rows(CommStats *s, CommKind kind, const float *send, const int *scount, const int *sdispl,
                         float *recv, const int *rcount, const int *rdispl, int width, MPI_Comm comm)
{
    int N = size_of(comm), me;
    DCP_CHECK(MPI_Comm_rank(comm, &me));
    double t0 = now_s();
    int ns = rows_total(scount, N), nr = rows_total(rcount, N);
    size_t w = (size_t)width;
    if (N == 1) { /* to itself: a copy in the backend's memory */
        const struct Backend *be = s->stage_be ? s->stage_be : s->sync_be;
        float *to = recv + (size_t)rdispl[0] * w;
        const float *from = send + (size_t)sdispl[0] * w;
        size_t bytes = sizeof(float) * w * (size_t)scount[0];
        if (bytes && be) be->copy(to, from, bytes);
        else if (bytes) memcpy(to, from, bytes);
        return;
    }
    MPI_Datatype row = row_type(width);
    if (s->stage_be) { /* displacements index rows of the packed send and receive arrays */
        float *h = stage(s, w * ((size_t)ns + (size_t)nr) + 1);
        if (ns) s->stage_be->download(h, send, sizeof(float) * w * (size_t)ns);
        DCP_CHECK(MPI_Alltoallv(h, scount, sdispl, row, h + w * (size_t)ns, rcount, rdispl, row, comm));
        if (nr) staged_upload(s, recv, h + w * (size_t)ns, w * (size_t)nr);
    } else {
        settle(s);
        DCP_CHECK(MPI_Alltoallv(send, scount, sdispl, row, recv, rcount, rdispl, row, comm));
    }
    DCP_CHECK(MPI_Type_free(&row));
    count(s, kind, 4LL * width * (ns - scount[me]), t0);
}

void comm_alltoall_ints(CommStats *s, CommKind kind, const int *send, int *recv, int n, MPI_Comm comm)
{
    int N = size_of(comm);
    if (N == 1) {
        memcpy(recv, send, sizeof(int) * (size_t)n);
        return;
    }
    double t0 = now_s();
    DCP_CHECK(MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, comm));
    count(s, kind, 4LL * n * (N - 1), t0);
}

void comm_allgatherv_rows(CommStats *s, CommKind kind, float *buf, const int *cnt, const int *displ, int width,
                          MPI_Comm comm)
{
    int N = size_of(comm), me;
    if (N == 1) return;
    DCP_CHECK(MPI_Comm_rank(comm, &me));
    double t0 = now_s();
    int n = 0;
    for (int r = 0; r < N; r++) n = displ[r] + cnt[r] > n ? displ[r] + cnt[r] : n;
    size_t w = (size_t)width;
    MPI_Datatype row = row_type(width);
    float *b = buf;
    if (s->stage_be) {
        b = stage(s, w * (size_t)n + 1);
        size_t at = w * (size_t)displ[me];
        if (cnt[me]) s->stage_be->download(b + at, buf + at, sizeof(float) * w * (size_t)cnt[me]);
    } else {
        settle(s);
    }
    DCP_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, row, b, cnt, displ, row, comm));
    if (s->stage_be && n) staged_upload(s, buf, b, w * (size_t)n);
    DCP_CHECK(MPI_Type_free(&row));
    count(s, kind, 4LL * width * (N - 1) * cnt[me], t0);
}

int comm_any(CommStats *s, int flag, MPI_Comm comm)
{
    if (size_of(comm) == 1) return flag != 0;
    double t0 = now_s();
    int any = flag != 0;
    DCP_CHECK(MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, comm));
    count(s, COMM_ep_step, 4, t0);
    return any;
}
