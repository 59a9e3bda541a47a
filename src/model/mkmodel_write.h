/* Test models written as files: Hugging Face layout (config.json +
 * safetensors, DeepSeek's in fp32 or block-scaled FP8) or a llama2.c .bin
 * checkpoint, with the values of mkmodel.h. */
#ifndef DCP_MKMODEL_WRITE_H
#define DCP_MKMODEL_WRITE_H

#include "mkmodel.h"

int mkmodel_write_hf(const ModelSpec *s, const char *dir, int bf16, int shards);
/* llama2.c v0 layout; Q/K rows are permuted to adjacent-pair RoPE order so
 * that the two files describe the same model. */
int mkmodel_write_llama2c(const ModelSpec *s, const char *path);

#endif
