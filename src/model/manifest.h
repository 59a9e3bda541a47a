/* How a family writes its layers' tensor manifests (model.h, TensorSpec):
 * included by the family files only (family_deepseek.c, family_moe.c). */
#ifndef DCP_MANIFEST_H
#define DCP_MANIFEST_H

#include <stdio.h>

#include "model.h"

/* In a manifest function with out and n: a tensor, its rows [r0, r0+nr) and
 * columns [c0, c0+nc) held here, into the fp32 array *d or the matrix *mt
 * (at its element at) */
#define PUT(nm, r, cl, d, mt, at, total, r0, nr, c0, nc)                                                          \
    do {                                                                                                          \
        out[n] = (TensorSpec){.rows = (r), .cols = (cl), .dst = (d), .mat = (mt), .mat_at = (at),                  \
                             .mat_n = (total), .row0 = (r0), .nrows = (nr), .col0 = (c0), .ncols = (nc),          \
                             .chunks = 1};                                                                        \
        snprintf(out[n].name, sizeof out[n].name, "model.layers.%d.%s", l, nm);                                   \
        n++;                                                                                                      \
    } while (0)
#define SLICE(nm, r, cl, d, r0, nr, c0, nc) PUT(nm, r, cl, d, NULL, 0, 0, r0, nr, c0, nc)
#define MSLICE(nm, r, cl, mt, r0, nr, c0, nc) PUT(nm, r, cl, NULL, mt, 0, (size_t)(nr) * (nc), r0, nr, c0, nc)
#define ADD(nm, r, cl, d) SLICE(nm, r, cl, d, 0, (r) ? (r) : 1, 0, cl)
#define MADD(nm, r, cl, mt) MSLICE(nm, r, cl, mt, 0, r, 0, cl)

/* s, or the whole model's shard (tp 1) in *whole when s is NULL */
static inline const Shard *shard_or_whole(const Config *c, const Shard *s, Shard *whole)
{
    if (!s) shard_init(whole, c, 1, 0);
    return s ? s : whole;
}


#endif
