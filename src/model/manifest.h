/* How a family writes its layers' tensor manifests (model.h, TensorSpec):
 * included by the family files only (family_deepseek.c, family_moe.c). */
#ifndef DCP_MANIFEST_H
#define DCP_MANIFEST_H

#include <stdio.h>

#include "model.h"

/* In a manifest function with out and n: a tensor, its rows [r0, r0+nr) and
 * columns [c0, c0+nc) held here, into the fp32 array *d or the matrix *mt
 * (at its element at) */
/* "model.layers.L.A" and, for e >= 0, "E" and b after it, into buf: a
 * layer's tensor names without printf, which a model of a million experts
 * would spend seconds in */
static inline void layer_name(char *buf, size_t size, int l, const char *a, int e, const char *b)
{
    char digits[2][12];
    int nd[2] = {0, 0}, v[2] = {l, e};
    for (int k = 0; k < 2; k++) {
        unsigned x = v[k] < 0 ? 0 : (unsigned)v[k];
        do digits[k][nd[k]++] = (char)('0' + x % 10), x /= 10;
        while (x);
    }
    size_t n = 0;
#define LAYER_NAME_PUT(ch) (n + 1 < size ? (void)(buf[n++] = (ch)) : (void)0)
    for (const char *p = "model.layers."; *p; p++) LAYER_NAME_PUT(*p);
    while (nd[0]) LAYER_NAME_PUT(digits[0][--nd[0]]);
    LAYER_NAME_PUT('.');
    for (const char *p = a; *p; p++) LAYER_NAME_PUT(*p);
    if (e >= 0) {
        while (nd[1]) LAYER_NAME_PUT(digits[1][--nd[1]]);
        for (const char *p = b; *p; p++) LAYER_NAME_PUT(*p);
    }
#undef LAYER_NAME_PUT
    buf[n] = '\0';
}

#define PUT(nm, r, cl, d, mt, at, total, r0, nr, c0, nc)                                                          \
    do {                                                                                                          \
        out[n] = (TensorSpec){.rows = (r), .cols = (cl), .dst = (d), .mat = (mt), .mat_at = (at),                  \
                             .mat_n = (total), .row0 = (r0), .nrows = (nr), .col0 = (c0), .ncols = (nc),          \
                             .chunks = 1};                                                                        \
        layer_name(out[n].name, sizeof out[n].name, l, nm, -1, "");                                               \
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
