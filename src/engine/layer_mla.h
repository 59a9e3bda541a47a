/* The DeepSeek-V2/V3 family's decoder layer: multi-head latent attention,
 * then a dense or mixture-of-experts feed-forward block (layer_mla.c). */
#ifndef DCP_LAYER_MLA_H
#define DCP_LAYER_MLA_H

#include "layer.h"

extern const LayerOps mla_layer_ops;

#endif
