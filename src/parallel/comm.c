#include "comm.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "topology.h"
#include "util.h"

const char *const comm_kind_names[COMM_N] = {
#define COMM_NAME(name) #name,
    COMM_KINDS(COMM_NAME)
#undef COMM_NAME
};
const char *const phase_names[PHASE_N] = {"prefill", "decode"};

/* group g of s's layout; without one (a single process) every group is
 * this rank alone */
static Group group(const CommStats *s, CommGroup g)
{
    const Topology *t = s->topo;
    if (!t) return (Group){MPI_COMM_SELF, 1, 0};
    switch (g) {
    case GROUP_TP: return (Group){t->tp_comm, t->tp, t->tp_rank};
    case GROUP_DCP: return (Group){t->dcp_comm, t->dcp, t->dcp_rank};
    case GROUP_EP: return (Group){t->ep_comm, t->ep, t->ep_rank};
    default: return (Group){t->world, t->world_size, t->world_rank};
    }
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

int comm_slice(int n, int N, int r, int *start)
{
    *start = (int)((long long)n * r / N);
    return (int)((long long)n * (r + 1) / N) - *start;
}

void comm_stats_free(CommStats *s)
{
    if (s->stage) s->be->host_release(s->stage);
    s->stage = NULL;
    s->stage_floats = 0;
}

void comm_sum_tree(CommStats *s, float *buf, float *scratch, int n, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) return;
    double t0 = now_s();
    s->t->sum_tree(s, buf, scratch, n, &g);
    /* every slice but its own to its owner, then its own slice (the
     * rank's share of n, as the transport slices it) to the others */
    int at;
    long long mine = comm_slice(n, g.size, g.rank, &at);
    count(s, COMM_tp_sum, 4 * (n - mine) + 4 * mine * (g.size - 1), t0);
}

void comm_sendrecv(CommStats *s, CommKind kind, const float *send, float *recv, int n, int partner, CommGroup gi)
{
    Group g = group(s, gi);
    double t0 = now_s();
    s->t->sendrecv(s, send, recv, n, partner, &g);
    count(s, kind, 4LL * n, t0);
}

void comm_allgather(CommStats *s, CommKind kind, const float *send, int n, float *recv, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) return;
    double t0 = now_s();
    s->t->allgather(s, send, n, recv, &g);
    count(s, kind, 4LL * n, t0);
}

void comm_alltoall(CommStats *s, const float *send, float *recv, int n, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) return;
    double t0 = now_s();
    s->t->alltoall(s, send, recv, n, &g);
    count(s, COMM_all_to_all, 4LL * g.size * n, t0);
}

void comm_argmax(CommStats *s, ValueIndex *pairs, int rows, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) return;
    double t0 = now_s();
    s->t->argmax(s, pairs, rows, &g);
    count(s, COMM_argmax, 8LL * rows, t0);
}

void comm_allgatherv(CommStats *s, const float *send, int n, float *recv, const int *counts, const int *displs,
                     CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) return;
    double t0 = now_s();
    s->t->allgatherv(s, send, n, recv, counts, displs, &g);
    count(s, COMM_logits_gather, 4LL * n, t0);
}

void comm_gather_logprobs(CommStats *s, const float *send, int n, float *recv, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) return;
    double t0 = now_s();
    int *counts = xmalloc(sizeof(int) * 2 * (size_t)g.size), *displs = counts + g.size;
    for (int r = 0; r < g.size; r++) counts[r] = n, displs[r] = r * n;
    s->t->allgatherv(s, send, n, recv, counts, displs, &g);
    free(counts);
    count(s, COMM_logprob_gather, 4LL * n, t0);
}

void comm_sum_int64(CommStats *s, int64_t *v, int n, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1 || n == 0) return;
    double t0 = now_s();
    s->t->sum_int64(s, v, n, &g);
    count(s, COMM_logprob_gather, 8LL * n, t0);
}

void comm_alltoallv_rows(CommStats *s, CommKind kind, const float *send, const int *scount, const int *sdispl,
                         float *recv, const int *rcount, const int *rdispl, int width, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) { /* to itself: a copy in the backend's memory */
        size_t bytes = sizeof(float) * (size_t)width * (size_t)scount[0];
        if (bytes) s->be->copy(recv + (size_t)rdispl[0] * width, send + (size_t)sdispl[0] * width, bytes);
        return;
    }
    double t0 = now_s();
    long long away = 0; /* the rows that leave the rank */
    for (int r = 0; r < g.size; r++) away += r == g.rank ? 0 : scount[r];
    comm_count((size_t)(away + scount[g.rank]));
    s->t->alltoallv_rows(s, send, scount, sdispl, recv, rcount, rdispl, width, &g);
    count(s, kind, 4LL * width * away, t0);
}

void comm_alltoall_ints(CommStats *s, CommKind kind, const int *send, int *recv, int n, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) {
        memcpy(recv, send, sizeof(int) * (size_t)n);
        return;
    }
    double t0 = now_s();
    s->t->alltoall_ints(s, send, recv, n, &g);
    count(s, kind, 4LL * n * (g.size - 1), t0);
}

void comm_allgatherv_rows(CommStats *s, CommKind kind, float *buf, const int *cnt, const int *displ, int width,
                          CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) return;
    double t0 = now_s();
    s->t->allgatherv_rows(s, buf, cnt, displ, width, &g);
    count(s, kind, 4LL * width * (g.size - 1) * cnt[g.rank], t0);
}

int comm_any(CommStats *s, int flag, CommGroup gi)
{
    Group g = group(s, gi);
    if (g.size == 1) return flag != 0;
    double t0 = now_s();
    int any = s->t->any(s, flag != 0, &g);
    count(s, COMM_ep_step, 4, t0);
    return any;
}

/* The counting transport: nothing moves (see comm.h). */
static void count_sum_tree(CommStats *s, float *buf, float *scratch, int n, const Group *g)
{
    (void)s, (void)buf, (void)scratch, (void)n, (void)g;
}
static void count_allgather(CommStats *s, const float *send, int n, float *recv, const Group *g)
{
    (void)s, (void)send, (void)n, (void)recv, (void)g;
}
static void count_sendrecv(CommStats *s, const float *send, float *recv, int n, int partner, const Group *g)
{
    (void)s, (void)send, (void)recv, (void)n, (void)partner, (void)g;
}
static void count_alltoall(CommStats *s, const float *send, float *recv, int n, const Group *g)
{
    (void)s, (void)send, (void)recv, (void)n, (void)g;
}
static void count_argmax(CommStats *s, ValueIndex *pairs, int rows, const Group *g)
{
    (void)s, (void)pairs, (void)rows, (void)g; /* this rank's maxima stand for the group's */
}
/* host arrays the sampler reads next: every rank's part is this rank's
 * (cut or padded with zeros to its count) */
static void count_allgatherv(CommStats *s, const float *send, int n, float *recv, const int *counts, const int *displs,
                             const Group *g)
{
    (void)s;
    for (int r = 0; r < g->size; r++) {
        int k = n < counts[r] ? n : counts[r];
        memmove(recv + displs[r], send, sizeof(float) * (size_t)k);
        memset(recv + displs[r] + k, 0, sizeof(float) * (size_t)(counts[r] - k));
    }
}
static void count_sum_int64(CommStats *s, int64_t *v, int n, const Group *g)
{
    (void)s, (void)v, (void)n, (void)g;
}
static void count_alltoallv_rows(CommStats *s, const float *send, const int *scount, const int *sdispl, float *recv,
                                 const int *rcount, const int *rdispl, int width, const Group *g)
{
    (void)s, (void)send, (void)scount, (void)sdispl, (void)recv, (void)rcount, (void)rdispl, (void)width, (void)g;
}
static void count_allgatherv_rows(CommStats *s, float *buf, const int *cnt, const int *displ, int width, const Group *g)
{
    (void)s, (void)buf, (void)cnt, (void)displ, (void)width, (void)g;
}
/* a balanced exchange: every rank sends this one what this one sends it */
static void count_alltoall_ints(CommStats *s, const int *send, int *recv, int n, const Group *g)
{
    (void)s;
    memcpy(recv, send, sizeof(int) * (size_t)n * (size_t)g->size);
}
static int count_any(CommStats *s, int flag, const Group *g)
{
    (void)s, (void)g;
    return flag;
}

const Transport transport_counting = {
    .name = "counting",
    .sum_tree = count_sum_tree,
    .allgather = count_allgather,
    .sendrecv = count_sendrecv,
    .alltoall = count_alltoall,
    .argmax = count_argmax,
    .allgatherv = count_allgatherv,
    .sum_int64 = count_sum_int64,
    .alltoallv_rows = count_alltoallv_rows,
    .alltoall_ints = count_alltoall_ints,
    .allgatherv_rows = count_allgatherv_rows,
    .any = count_any,
};
