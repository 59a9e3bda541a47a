/* The collectives dcpinfer calls, each counted: calls, bytes this rank
 * sends, seconds, split by prefill and decode steps. Bytes sent per call:
 *   tp_sum           4 * (count - s + (N - 1) * s), s = this rank's slice of count
 *                                         (MPI_Alltoallv + MPI_Allgatherv over tp_comm; two a
 *                                         layer and the vocabulary-parallel embedding's)
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
 * where N is the group's size. A group of one rank makes no call and
 * counts nothing; moe_dispatch and moe_combine (expert parallelism, moe.c)
 * count the bytes that leave the rank, not those to itself. tp_sum,
 * q_allgather, merge_exchange, all_to_all and the MoE rows take backend
 * buffers; argmax, logits_gather and logprob_gather take host arrays.
 * These counts are made in comm.c, the same for every transport. */
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
struct Topology;
struct CommStats;

/* The communicators of a rank's layout (topology.h), as the collectives
 * name them. */
typedef enum { GROUP_WORLD, GROUP_TP, GROUP_DCP, GROUP_EP } CommGroup;

/* One of them resolved: its MPI communicator (MPI_COMM_NULL where nothing
 * is sent, as under the counting transport), its size and this rank's
 * place in it. */
typedef struct {
    MPI_Comm comm;
    int size, rank;
} Group;

/* pairs[i] = (value, global index) in, global max with lowest index out */
typedef struct {
    float value;
    int index;
} ValueIndex;

/* How the collectives move data, one table per transport (as Backend is
 * for kernels): the comm_* functions below check their arguments, skip a
 * group of one rank, count calls and bytes, and call the transport's entry
 * for a group of size > 1. So every transport counts the same bytes for
 * the same calls.
 *   transport_mpi         MPI on the buffers themselves: host memory, or
 *                         device memory where the MPI library takes device
 *                         pointers (after the backend's queue drains)
 *   transport_mpi_staged  device buffers through page-locked host memory
 *                         (transport_mpi.c)
 *   transport_counting    moves nothing: what dcpinfer-plan runs a decode
 *                         step on, so that its bytes are a run's by
 *                         construction. Where a result steers what
 *                         follows, it stands in for the other ranks with
 *                         this one: the exchange of moe_dispatch's counts
 *                         is taken to be balanced (every rank sends this
 *                         one as many rows as this one sends it), the
 *                         gathers of host arrays give every rank's part
 *                         this rank's values, and reductions return this
 *                         rank's own; device buffers are left as they are
 *                         (the null backend never reads them).
 * Host arrays (argmax, the logits and log-probability gathers, the counts)
 * go to MPI as they are in both MPI transports. */
typedef struct Transport {
    const char *name;
    void (*sum_tree)(struct CommStats *s, float *buf, float *scratch, int count, const Group *g);
    void (*allgather)(struct CommStats *s, const float *send, int count, float *recv, const Group *g);
    void (*sendrecv)(struct CommStats *s, const float *send, float *recv, int count, int partner, const Group *g);
    void (*alltoall)(struct CommStats *s, const float *send, float *recv, int count, const Group *g);
    void (*argmax)(struct CommStats *s, ValueIndex *pairs, int rows, const Group *g);
    void (*allgatherv)(struct CommStats *s, const float *send, int count, float *recv, const int *counts,
                       const int *displs, const Group *g);
    void (*sum_int64)(struct CommStats *s, int64_t *v, int count, const Group *g);
    void (*alltoallv_rows)(struct CommStats *s, const float *send, const int *scount, const int *sdispl, float *recv,
                           const int *rcount, const int *rdispl, int width, const Group *g);
    void (*alltoall_ints)(struct CommStats *s, const int *send, int *recv, int n, const Group *g);
    void (*allgatherv_rows)(struct CommStats *s, float *buf, const int *count, const int *displ, int width,
                            const Group *g);
    int (*any)(struct CommStats *s, int flag, const Group *g);
} Transport;

extern const Transport transport_mpi, transport_mpi_staged, transport_counting;

typedef struct CommStats {
    CommCounter c[PHASE_N][COMM_N];
    int phase; /* where calls are counted now */
    /* set by engine_init: the transport (a caller may choose one before;
     * else MPI, staged unless MPI takes the backend's buffers), the
     * groups' sizes and ranks, and the backend whose buffers move */
    const Transport *t;
    const struct Topology *topo;
    const struct Backend *be;
    float *stage; /* transport_mpi_staged's host buffer */
    size_t stage_floats;
    long device_waits; /* the transports' waits for the backend's device (settling, staging) */
} CommStats;

/* An element count for an MPI call: n itself when it fits MPI's int, else
 * a failed check that names it and stops the job. The run's limits keep
 * every step's messages below that (engine_step_token_limit), so this only
 * guards against a limit that was missed. */
int comm_count(size_t n);

/* Rank r's slice of n elements split over N ranks, comm_sum_tree's:
 * [n r / N, n (r + 1) / N), its start in *start; returns its length. */
int comm_slice(int n, int N, int r, int *start);

/* Frees the staging buffer. */
void comm_stats_free(CommStats *s);

/* buf (count) summed over group g in the canonical order (docs/design.md,
 * "Same bits at any layout"): rank d adds slice d of every rank's buf by
 * a tree over the ranks (adjacent pairs, then pairs of pairs), then every
 * rank gathers every slice; the bytes a ring allreduce moves, in an order
 * the library does not choose. scratch: count floats in buf's memory. */
void comm_sum_tree(CommStats *s, float *buf, float *scratch, int count, CommGroup g);
void comm_allgather(CommStats *s, CommKind kind, const float *send, int count, float *recv, CommGroup g);
/* count floats to partner, as many from it */
void comm_sendrecv(CommStats *s, CommKind kind, const float *send, float *recv, int count, int partner, CommGroup g);
void comm_alltoall(CommStats *s, const float *send, float *recv, int count, CommGroup g);
void comm_argmax(CommStats *s, ValueIndex *pairs, int rows, CommGroup g);
void comm_allgatherv(CommStats *s, const float *send, int count, float *recv, const int *counts, const int *displs,
                     CommGroup g);
/* count host floats from every rank of g, in rank order */
void comm_gather_logprobs(CommStats *s, const float *send, int count, float *recv, CommGroup g);
/* v (count) summed over g: integers, exact in any order; counted with
 * logprob_gather (count * 8 bytes) */
void comm_sum_int64(CommStats *s, int64_t *v, int count, CommGroup g);

/* Expert parallelism's exchanges (moe.c), counted as kind. Rows of width
 * floats to and from every rank of g (backend buffers): scount[r] rows
 * from send + sdispl[r] rows to rank r, rcount[r] rows from rank r into
 * recv + rdispl[r] rows (an MPI type of one row keeps the counts in rows).
 * Each side's rows are packed from row 0 in rank order (displacements the
 * running sums of the counts), as staging copies them whole. */
void comm_alltoallv_rows(CommStats *s, CommKind kind, const float *send, const int *scount, const int *sdispl,
                         float *recv, const int *rcount, const int *rdispl, int width, CommGroup g);
/* n host ints to and from every rank of g */
void comm_alltoall_ints(CommStats *s, CommKind kind, const int *send, int *recv, int n, CommGroup g);
/* rank r's count[r] rows at displ[r] of buf (backend buffer) to every rank */
void comm_allgatherv_rows(CommStats *s, CommKind kind, float *buf, const int *count, const int *displ, int width,
                          CommGroup g);
/* Whether any rank of g passes a nonzero flag (ep_step). */
int comm_any(CommStats *s, int flag, CommGroup g);

#endif
