/* The canonical reduction tree (docs/design.md, "Same bits at any
 * layout"): the one order in which dcpinfer adds the partials of a sum that
 * crosses chunks, key shards or ranks, for host and device code alike.
 *
 * A tree over n parts is n - 1 steps, each folding part `from` into part
 * `into`; part 0 holds the whole after the last. It is one binary tree,
 * numbered two ways after how the parts are laid out over ranks:
 *
 *   tree_sum_step    parts numbered in order (a row-parallel GEMM's K
 *                    chunks, contiguous on each TP rank, and the TP ranks
 *                    themselves): adjacent pairs first, then pairs of pairs,
 *                    so a rank's own chunks form a subtree and the ranks'
 *                    sums are the tree's upper levels.
 *   tree_merge_step  parts interleaved over ranks (attention's key shards:
 *                    shard g on DCP rank g % N): over the largest power of
 *                    two `top` <= n, part g + top/2 into g, then g + top/4
 *                    into g, ...; the parts past top follow into part 0 in
 *                    order. A rank's shards are merged first, the ranks'
 *                    partials last, by the same steps (attention.c's
 *                    recursive halving is this tree, run across ranks).
 *
 * For a power of two these are the same tree, the second on bit-reversed
 * part numbers. Callers walk i = 0 .. n - 2 and apply step i. */
#ifndef DCP_TREE_H
#define DCP_TREE_H

#ifdef __CUDACC__
#define DCP_TREE_FN __host__ __device__ static inline
#else
#define DCP_TREE_FN static inline
#endif

typedef struct {
    int into, from;
} TreeStep;

DCP_TREE_FN TreeStep tree_step(int into, int from)
{
    TreeStep s = {into, from};
    return s;
}

/* The largest power of two <= n (n >= 1). */
DCP_TREE_FN int tree_top(int n)
{
    int top = 1;
    while (top * 2 <= n) top *= 2;
    return top;
}

/* Step i of the sum tree over n parts: level w = 1, 2, 4, ... adds part
 * c + w into c for c = 0, 2w, 4w, ... while c + w < n. */
DCP_TREE_FN TreeStep tree_sum_step(int n, int i)
{
    for (int w = 1;; w *= 2) {
        int level = (n + w - 1) / (2 * w); /* steps at this level */
        if (i < level) return tree_step(2 * w * i, 2 * w * i + w);
        i -= level;
    }
}

/* Step i of the merge tree over n parts. */
DCP_TREE_FN TreeStep tree_merge_step(int n, int i)
{
    int top = tree_top(n);
    if (i >= top - 1) return tree_step(0, top + i - (top - 1));
    int half = top / 2;
    while (i >= half) {
        i -= half;
        half /= 2;
    }
    return tree_step(i, i + half);
}

#endif
