#ifndef DCP_KERNELS_CPU_H
#define DCP_KERNELS_CPU_H

#include "backend.h"

/* The CPU backend's kernels, each in one defined arithmetic for every
 * instruction set (kernels_cpu.c).
 *
 * y (T, out) = x (T, in) . w (out, in)^T, w float32 or bfloat16; each
 * element's value is independent of T, of the other rows, of the thread
 * count and of the instruction set (see kernels_cpu.c). */
void gemm_invariant(float *y, const float *x, WeightRef w, int T, int in, int out);

/* Rows per group (WeightRef.group) of the weight layout these kernels read
 * fastest for elements of type t: 6 for bf16 on AVX2 and AVX-512 (decode
 * streams a matrix as one run of memory), else 0 (row after row).
 * gemm_invariant takes either layout on every instruction set, with the
 * same result. */
int cpu_weight_group(DType t);

/* The kernels' instruction set: "auto" (default: the best this CPU has),
 * "generic", "avx2" or "avx512"; -1 with dcp_error() when the CPU lacks it. */
int cpu_set_isa(const char *name);
const char *cpu_isa(void);

/* Attention of R query tokens of one sequence, each by H query heads (row
 * h reading KV head h / group), token r over keys j0[r] .. n[r]-1 of k and
 * v (elements of the kv type): key j's elements of KV head g at k + g *
 * head_stride + (table ? table[j / B] * block_stride + (j % B) * stride :
 * j * stride), and the same in v. Token-major rows (a key's KV heads side
 * by side): stride = the row, head_stride = D. Head-major paged blocks
 * (each KV head's keys of a block side by side, as the CPU backend's pools
 * hold them): stride = D, head_stride = B * D. Returns out and lse. A
 * row's value depends on its keys only, not on the instruction set, the
 * layout, the batch or the other heads and tokens of the call
 * (kernels_cpu.inc). Tokens attended together read each key once from
 * memory. */
typedef struct {
    int R, H, group, D, Dv;
    const int *j0, *n; /* per token: its keys j0[r] .. n[r]-1, at least one */
    /* token r's head h: q + r * q_stride + h * D (D floats), out + r *
     * out_stride + h * Dv (Dv floats), lse[r * lse_stride + h] */
    const float *q;
    float *out, *lse;
    size_t q_stride, out_stride, lse_stride;
    const void *k, *v;
    const int *table; /* NULL: not paged */
    int B;
    /* elements from a key's row to the next key's (within a paged block),
     * from a KV head to the next, and from a paged block to the next */
    size_t stride, head_stride, block_stride;
    float scale;
    float *scratch; /* attend_scratch_bytes(the largest n, R * H) */
    /* the keys were just read (by the token before, of the same sequence),
     * so they are in cache; it changes the order of reading only */
    int warm;
    /* map_shards > 1: the call's key j is key (j / I) * G * I + s * I + j % I
     * of the stored keys (G map_shards, s map_shard, I map_interleave):
     * shard s of G interleaved shards (AttnBatch) */
    int map_shards, map_shard, map_interleave;
} AttendRows;
typedef void (*AttendFn)(const AttendRows *a);
AttendFn cpu_attend(DType kv);
/* the scratch for H query rows: H rows of n scores, H sums, then (8-byte
 * aligned) n key offsets */
static inline size_t attend_scores_floats(int n) { return ((size_t)n + 1) & ~(size_t)1; }
static inline size_t attend_offsets_at(int n, int H)
{
    return sizeof(float) * ((size_t)H * attend_scores_floats(n) + (((size_t)H + 1) & ~(size_t)1));
}
static inline size_t *attend_offsets(float *scratch, int n, int H)
{
    return (size_t *)((char *)scratch + attend_offsets_at(n, H));
}
static inline size_t attend_scratch_bytes(int n, int H) { return attend_offsets_at(n, H) + sizeof(size_t) * (size_t)n; }

#endif
