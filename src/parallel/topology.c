#include "topology.h"

#include <string.h>

#include "check.h"
#include "util.h"

int topology_max_dcp(const Config *c, int tp) { return tp > c->n_kv_heads ? tp / c->n_kv_heads : 1; }

int topology_check(const Config *c, int world_size, int tp, int dcp, int dp, int interleave, int block_size)
{
    int Hq = c->n_heads, Hkv = c->n_kv_heads;
    if (tp < 1 || dcp < 1 || dp < 0)
        return dcp_fail("invalid layout: -tp %d, -dcp %d, -dp %d must be positive", tp, dcp, dp);
    if (world_size == 1 && tp > 1)
        return dcp_fail("invalid layout: -tp %d needs %d ranks (a multiple of %d), and this run has 1: start it with "
                        "mpirun -np %d dcpinfer ... (or srun -n %d)",
                        tp, tp, tp, tp, tp);
    if (world_size % tp)
        return dcp_fail("invalid layout: %d ranks are not divisible by -tp %d (world = dp x tp)", world_size, tp);
    if (dp && (long long)dp * tp != world_size)
        return dcp_fail("invalid layout: -dp %d x -tp %d = %lld, but there are %d ranks (world = dp x tp)", dp, tp,
                        (long long)dp * tp, world_size);
    if (tp % dcp) return dcp_fail("invalid layout: -dcp %d does not divide -tp %d", dcp, tp);
    if (Hq % tp)
        return dcp_fail("invalid layout: the model's %d query heads are not divisible by -tp %d", Hq, tp);
    if (Hkv % tp && tp % Hkv)
        return dcp_fail("invalid layout: -tp %d and the model's %d KV heads must divide one another", tp, Hkv);
    if (dcp > 1) {
        if (tp <= Hkv)
            return dcp_fail("invalid layout: -dcp %d needs -tp above the model's %d KV heads (got -tp %d): DCP "
                            "shards the KV cache only across ranks that would duplicate it",
                            dcp, Hkv, tp);
        if (dcp > tp / Hkv)
            return dcp_fail("invalid layout: -dcp %d is above tp/kv_heads = %d/%d = %d, the ranks that share a KV "
                            "head; -dcp must be at most %d",
                            dcp, tp, Hkv, tp / Hkv, tp / Hkv);
        if ((tp / Hkv) % dcp)
            return dcp_fail("invalid layout: tp/kv_heads = %d/%d = %d is not divisible by -dcp %d, so a DCP group "
                            "would span two KV heads",
                            tp, Hkv, tp / Hkv, dcp);
    }
    if (interleave < 1)
        return dcp_fail("invalid layout: --cp-kv-cache-interleave-size %d must be at least 1", interleave);
    if (block_size % interleave)
        return dcp_fail("invalid layout: --block-size %d is not a multiple of --cp-kv-cache-interleave-size %d",
                        block_size, interleave);
    return 0;
}

void topology_init(Topology *t, MPI_Comm world, int tp, int dcp, int interleave)
{
    memset(t, 0, sizeof *t);
    t->world = world;
    DCP_CHECK(MPI_Comm_size(world, &t->world_size));
    DCP_CHECK(MPI_Comm_rank(world, &t->world_rank));
    t->tp = tp;
    t->dcp = dcp;
    t->dp = t->world_size / tp;
    t->interleave = interleave;
    t->dp_rank = t->world_rank / tp;
    t->tp_rank = t->world_rank % tp;
    t->dcp_rank = t->tp_rank % dcp;
    t->dcp_group = t->tp_rank / dcp;
    DCP_CHECK(MPI_Comm_split(world, t->dp_rank, t->tp_rank, &t->tp_comm));
    DCP_CHECK(MPI_Comm_split(t->tp_comm, t->dcp_group, t->dcp_rank, &t->dcp_comm));
    t->ep = 1;
    t->ep_comm = MPI_COMM_NULL;
}

void topology_enable_ep(Topology *t)
{
    t->expert_parallel = 1;
    t->ep = t->world_size;
    t->ep_rank = t->world_rank;
    DCP_CHECK(MPI_Comm_dup(t->world, &t->ep_comm));
}

void topology_free(Topology *t)
{
    if (t->ep_comm != MPI_COMM_NULL && t->ep_comm) DCP_CHECK(MPI_Comm_free(&t->ep_comm));
    if (t->dcp_comm != MPI_COMM_NULL && t->dcp_comm) DCP_CHECK(MPI_Comm_free(&t->dcp_comm));
    if (t->tp_comm != MPI_COMM_NULL && t->tp_comm) DCP_CHECK(MPI_Comm_free(&t->tp_comm));
    memset(t, 0, sizeof *t);
}
