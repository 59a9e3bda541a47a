/* Which elements of a head RoPE rotates together: a model's choice
 * (hparams.h) and an argument of the backends' rope op (backend.h). */
#ifndef DCP_ROPE_H
#define DCP_ROPE_H

/* the pairs (2i, 2i + 1) of a head (adjacent pairs) or (i, i + head_dim / 2)
 * (rotate half) */
typedef enum { ROPE_ADJACENT_PAIRS, ROPE_ROTATE_HALF } RopeStyle;

#endif
