/* What the config readers share (arch.h is their interface): arch.c's
 * typed fields and the blocks every family reads the same way, and the
 * readers the families own, which arch_read_config calls by its table's
 * row:
 *   arch.c            the table, typed fields, RoPE, eos ids,
 *                     quantization_config's formats
 *   family_llama.c    the Llama family: Llama, Mistral, Qwen2, Qwen3, and
 *                     the attention side of Qwen3-MoE and GLM-4.5
 *   family_deepseek.c DeepSeek-V2/V3 (and Kimi K2): latent attention, its
 *                     experts, their tensors
 *   family_moe.c      the MoE blocks of Qwen3-MoE and GLM-4.5, and the
 *                     tensors of any family's MoE block */
#ifndef DCP_ARCH_IMPL_H
#define DCP_ARCH_IMPL_H

#include <jansson.h>

#include "hparams.h"

/* Each returns -1 with dcp_error() set for a value of the wrong type or out
 * of range; a missing or null field leaves *out as it was. */
int get_int(json_t *o, const char *key, int *out, const char *path);
int get_float(json_t *o, const char *key, float *out, const char *path);
int get_bool(json_t *o, const char *key, int *out, const char *path);
/* A string field that must be one of the choices (NULL-terminated; the
 * first is the default when absent); its index, or -1 with the message. */
int get_choice(json_t *o, const char *key, const char *const *choices, const char *arch, const char *path);

/* The rope block into c (partial: the default share of each head rotated,
 * 0: all of it); eos_token_id's ids added to c's; quantization_config's
 * stored format into m. */
int read_rope(json_t *root, Config *c, const char *path, float partial);
void add_eos_ids(json_t *v, Config *c);
int read_quantization(json_t *q, QuantConfig *m, const char *path);

/* The families' readers, as arch_table's rows name them: everything past
 * the architecture, for the row a (its name for messages, its features);
 * and the MoE blocks into c->moe, which the Llama family's reader calls
 * for the rows with experts (arch name for messages). */
struct Arch;
int llama_read_config(json_t *root, const struct Arch *a, const char *path, Config *c);
int deepseek_read_config(json_t *root, const struct Arch *a, const char *path, Config *c);
int qwen3_moe_read_config(json_t *root, const char *arch, const char *path, Config *c);
int glm4_moe_read_config(json_t *root, const char *arch, const char *path, Config *c);

#endif
