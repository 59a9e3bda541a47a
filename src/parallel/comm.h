/* The collectives dcpinfer calls, each counted: calls, bytes this rank
 * sends, seconds, split by prefill and decode steps. Bytes sent per call:
 *   allreduce        count * 4            (MPI_Allreduce, sum, over tp_comm)
 *   q_allgather      count * 4            (MPI_Allgather of Q, over dcp_comm)
 *   lse_allgather    count * 4            (MPI_Allgather of LSEs, ag_rs)
 *   reduce_scatter   N * recvcount * 4    (MPI_Reduce_scatter_block, ag_rs)
 *   all_to_all       N * count * 4        (MPI_Alltoall of partials + LSE, a2a)
 *   argmax           rows * 8             (MPI_Allreduce MAXLOC of (float, int))
 *   logits_gather    count * 4            (MPI_Allgatherv of a vocabulary shard)
 *   logprob_gather   count * 4            (MPI_Allgather of each shard's top-N and log-sum-exp)
 * where N is the communicator's size. A communicator of one rank makes no
 * call and counts nothing. allreduce, the allgathers of Q and LSE,
 * reduce_scatter and all_to_all take backend buffers (staged when MPI
 * cannot read device memory); argmax, logits_gather and logprob_gather take
 * host arrays. */
#ifndef DCP_COMM_H
#define DCP_COMM_H

#include <mpi.h>
#include <stddef.h>

#define COMM_KINDS(X) \
    X(allreduce)      \
    X(q_allgather)    \
    X(lse_allgather)  \
    X(reduce_scatter) \
    X(all_to_all)     \
    X(argmax)         \
    X(logits_gather)  \
    X(logprob_gather)

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

void comm_allreduce_sum(CommStats *s, float *buf, int count, MPI_Comm comm);
void comm_allgather(CommStats *s, CommKind kind, const float *send, int count, float *recv, MPI_Comm comm);
void comm_reduce_scatter_sum(CommStats *s, const float *send, float *recv, int recvcount, MPI_Comm comm);
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

#endif
