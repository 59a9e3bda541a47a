/* The collectives dcpinfer calls, each counted: calls, bytes this rank
 * sends, seconds, split by prefill and decode steps. Bytes sent per call:
 *   tp_sum           4 * (count - s + (N - 1) * s), s = this rank's slice of count
 *                                         (MPI_Alltoallv + MPI_Allgatherv over tp_comm)
 *   q_allgather      count * 4            (MPI_Allgather of Q, over dcp_comm)
 *   merge_exchange   count * 4            (MPI_Sendrecv of partials + LSE with one rank, ag_rs)
 *   all_to_all       N * count * 4        (MPI_Alltoall of partials + LSE, a2a)
 *   argmax           rows * 8             (MPI_Allreduce MAXLOC of (float, int))
 *   logits_gather    count * 4            (MPI_Allgatherv of a vocabulary shard)
 *   logprob_gather   count * 4            (MPI_Allgather of each shard's maximum, top-N and chosen logit)
 *                    + rows * 8           (MPI_Allreduce of the rows' exact log-sum-exp sums)
 *   moe_dispatch     4 * (N - 1) * E / N  (MPI_Alltoall of the token counts of each rank's E / N experts)
 *                    + 4 * dim * rows     (MPI_Alltoallv of hidden rows, those sent to other ranks)
 *   moe_combine      4 * dim * rows       (MPI_Alltoallv of the experts' outputs back, to other ranks)
 *                    + 4 * dim * (tp - 1) * h  (MPI_Allgatherv of the combined rows over tp_comm,
 *                                         h: the rows this rank combined)
 *   ep_step          4                    (MPI_Allreduce(MAX) over world: whether a DP group has work)
 * where N is the communicator's size. A communicator of one rank makes no
 * call and counts nothing; moe_dispatch and moe_combine (expert
 * parallelism, moe.c) count the bytes that leave the rank, not those to
 * itself. tp_sum, q_allgather, merge_exchange, all_to_all and the MoE rows
 * take backend buffers (staged when MPI
 * cannot read device memory); argmax, logits_gather and logprob_gather take
 * host arrays. */
#ifndef DCP_COMM_H
#define DCP_COMM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#define COMM_KINDS(X) \
    X(tp_sum)         \
    X(q_allgather)    \
    X(merge_exchange) \
    X(all_to_all)     \
    X(argmax)         \
    X(logits_gather)  \
    X(logprob_gather) \
    X(moe_dispatch)   \
    X(moe_combine)    \
    X(ep_step)

typedef enum {
#define COMM_ENUM(name) COMM_##name,
    COMM_KINDS(COMM_ENUM)
#undef COMM_ENUM
    COMM_N
} CommKind;

enum { PHASE_PREFILL, PHASE_DECODE, PHASE_N };

extern const char *const comm_kind_names[COMM_N];
extern const char *const phase_names[PHASE_N];

typedef struct {
    long long calls, bytes;
    double seconds;
} CommCounter;

struct Backend;

typedef struct {
    CommCounter c[PHASE_N][COMM_N];
    int phase; /* where calls are counted now */
    /* When the buffers are device memory that MPI cannot take, transfers
     * are staged through a page-locked host buffer of this backend. */
    const struct Backend *stage_be;
    float *stage;
    size_t stage_floats;
    /* When MPI takes device buffers directly: the backend whose queued
     * work must finish before MPI reads them. */
    const struct Backend *sync_be;
} CommStats;

/* An element count for an MPI call: n itself when it fits MPI's int, else
 * a failed check that names it and stops the job. The run's limits keep
 * every step's messages below that (engine_step_token_limit), so this only
 * guards against a limit that was missed. */
int comm_count(size_t n);

/* Frees the staging buffer. */
void comm_stats_free(CommStats *s);

/* buf (count) summed over comm in the canonical order (docs/design.md,
 * "Same bits at any layout"): rank d adds slice d of every rank's buf by
 * a tree over the ranks (adjacent pairs, then pairs of pairs), then every
 * rank gathers every slice; the bytes a ring allreduce moves, in an order
 * the library does not choose. scratch: count floats in buf's memory. */
void comm_sum_tree(CommStats *s, float *buf, float *scratch, int count, MPI_Comm comm);
/* The bytes comm_sum_tree sends from rank me of N for count floats: every
 * slice but its own, then its own slice to the N - 1 others. */
long long comm_sum_tree_bytes(long long count, int N, int me);
void comm_allgather(CommStats *s, CommKind kind, const float *send, int count, float *recv, MPI_Comm comm);
/* count floats to partner, as many from it */
void comm_sendrecv(CommStats *s, CommKind kind, const float *send, float *recv, int count, int partner, MPI_Comm comm);
void comm_alltoall(CommStats *s, const float *send, float *recv, int count, MPI_Comm comm);
/* pairs[i] = (value, global index) in, global max with lowest index out */
typedef struct {
    float value;
    int index;
} ValueIndex;
void comm_argmax(CommStats *s, ValueIndex *pairs, int rows, MPI_Comm comm);
void comm_allgatherv(CommStats *s, const float *send, int count, float *recv, const int *counts, const int *displs,
                     MPI_Comm comm);
/* count host floats from every rank of comm, in rank order */
void comm_gather_logprobs(CommStats *s, const float *send, int count, float *recv, MPI_Comm comm);
/* v (count) summed over comm: integers, exact in any order; counted with
 * logprob_gather (count * 8 bytes) */
void comm_sum_int64(CommStats *s, int64_t *v, int count, MPI_Comm comm);

/* Expert parallelism's exchanges (moe.c), counted as kind. Rows of width
 * floats to and from every rank of comm (backend buffers): scount[r] rows
 * from send + sdispl[r] rows to rank r, rcount[r] rows from rank r into
 * recv + rdispl[r] rows (an MPI type of one row keeps the counts in rows).
 * Each side's rows are packed from row 0 in rank order (displacements the
 * running sums of the counts), as staging copies them whole. */
void comm_alltoallv_rows(CommStats *s, CommKind kind, const float *send, const int *scount, const int *sdispl,
                         float *recv, const int *rcount, const int *rdispl, int width, MPI_Comm comm);
/* n host ints to and from every rank of comm */
void comm_alltoall_ints(CommStats *s, CommKind kind, const int *send, int *recv, int n, MPI_Comm comm);
/* rank r's count[r] rows at displ[r] of buf (backend buffer) to every rank */
void comm_allgatherv_rows(CommStats *s, CommKind kind, float *buf, const int *count, const int *displ, int width,
                          MPI_Comm comm);
/* Whether any rank of comm passes a nonzero flag (ep_step). */
int comm_any(CommStats *s, int flag, MPI_Comm comm);

#endif
