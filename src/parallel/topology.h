/* Where a rank sits: world = dp x tp, TP innermost; DCP groups are runs of
 * dcp consecutive ranks inside a TP group (docs/design.md, "Ranks and communicators"). */
#ifndef DCP_TOPOLOGY_H
#define DCP_TOPOLOGY_H

#include <mpi.h>

#include "model.h"

typedef struct Topology {
    int world_size, world_rank;
    int tp, dcp, dp;
    int interleave;          /* I: consecutive positions per owner rank */
    int dp_rank, tp_rank, dcp_rank, dcp_group;
    MPI_Comm world;
    MPI_Comm tp_comm;        /* the ranks of one DP replica */
    MPI_Comm dcp_comm;       /* the ranks sharing one KV head's sequence */
    /* Expert parallelism (--enable-expert-parallel): the routed experts
     * spread whole over ep ranks, the TP group's and, with dp > 1, every
     * DP group's (all of world, ep_rank the world rank); ep 1: off. */
    int expert_parallel; /* on (topology_enable_ep), at any ep, 1 included */
    int ep, ep_rank;
    MPI_Comm ep_comm;
} Topology;

/* Checks a layout against the model before anything is loaded. On failure
 * dcp_error() names the values and the rule. dp 0 means world / tp. */
int topology_check(const Config *c, int world_size, int tp, int dcp, int dp, int interleave, int block_size);
/* The largest -dcp the model allows at -tp tp (-dcp auto): tp / kv_heads
 * where tp is above the KV heads (an MLA model's one latent: tp), else 1 */
int topology_max_dcp(const Config *c, int tp);
/* Builds the communicators; collective over world. */
void topology_init(Topology *t, MPI_Comm world, int tp, int dcp, int interleave);
/* Turns expert parallelism on over every rank of world (its own
 * communicator); collective over world. */
void topology_enable_ep(Topology *t);
void topology_free(Topology *t);

/* docs/design.md, "Where a token's KV lives": the DCP rank that stores position p, the index of p
 * in that rank's shard, and how many of the first len positions rank d
 * stores. */
static inline int kv_owner(const Topology *t, int p) { return (p / t->interleave) % t->dcp; }
static inline int kv_local_index(const Topology *t, int p)
{
    return (p / (t->dcp * t->interleave)) * t->interleave + p % t->interleave;
}
static inline int kv_local_len(const Topology *t, int len, int d)
{
    int I = t->interleave, N = t->dcp;
    int base = (len / I / N) * I, rem = len - base * N - d * I;
    return base + (rem < 0 ? 0 : rem > I ? I : rem);
}

/* KV blocks of B positions a sequence of len positions needs on each rank
 * of its DCP group (the group shares one block table; rank 0 holds the
 * most positions). */
static inline int kv_blocks_for(const Topology *t, int len, int B)
{
    return (kv_local_len(t, len, 0) + B - 1) / B;
}

#endif
