/* The Llama family's decoder layer (layer_dense.c). */
#ifndef DCP_LAYER_DENSE_H
#define DCP_LAYER_DENSE_H

#include "layer.h"

extern const LayerOps dense_layer_ops;

#endif
