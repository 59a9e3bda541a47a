/* The architectures dcpinfer runs, one row each in arch.c's table: the
 * names a Hugging Face config.json gives them (architectures[0],
 * model_type), its layer family, and what each allows. The Llama family
 * (Llama, Mistral, Qwen2, Qwen3, and with experts Qwen3-MoE and GLM-4.5)
 * shares one decoder layer
 * (engine/layer_dense.c); a row says which of its parts the architecture
 * has: q/k/v biases, the attention_bias and mlp_bias fields, per-head q/k
 * norms, and its kind of sliding window. DeepSeek-V2/V3 share another
 * (engine/layer_mla.c). A row names its family's reader of config.json
 * (family_llama.c, family_deepseek.c). Anything else is refused before any
 * weight is read. */
#ifndef DCP_ARCH_H
#define DCP_ARCH_H

#include <stddef.h>

#include "hparams.h"

typedef enum {
    WINDOW_NONE,   /* sliding_window is not read (Llama ignores it) */
    WINDOW_ALL,    /* Mistral: every layer, when sliding_window is set */
    WINDOW_UPPER,  /* Qwen2/Qwen3: with use_sliding_window, the layers from max_window_layers on */
} WindowKind;

/* Which decoder layer an architecture runs (the engine's layer modules). */
typedef enum {
    FAMILY_DENSE, /* the Llama family: grouped-query attention, SwiGLU */
    FAMILY_MLA,   /* DeepSeek-V2/V3: multi-head latent attention, mixture of experts */
} LayerFamily;

struct json_t;

typedef struct Arch {
    const char *name;        /* architectures[0], e.g. "LlamaForCausalLM" */
    const char *model_type;  /* e.g. "llama" */
    int qkv_bias;            /* q/k/v biases always (Qwen2) */
    int attention_bias;      /* reads attention_bias: 1 q/k/v/o biases (Llama, Qwen3), 2 q/k/v (GLM-4.5) */
    int mlp_bias;            /* reads mlp_bias: gate/up/down biases (Llama) */
    int qk_norm;             /* q_norm/k_norm over head_dim before RoPE: 1 always (Qwen3), 2 with use_qk_norm (GLM) */
    WindowKind window;
    int mla;                 /* DeepSeek: 1 for V2 (softmax router), 2 for V3 (sigmoid with a correction bias) */
    LayerFamily family;
    const char *alias;       /* another model_type of the same architecture (Kimi K2's "kimi_k2"), or NULL */
    int moe;                 /* mixture-of-experts layers: 1 Qwen3-MoE's (num_experts..., every layer, softmax
                              * router, no shared experts), 2 GLM-4.5's (n_routed_experts..., DeepSeek-V3's
                              * router, shared experts, the first layers dense, partial RoPE) */
    /* the family's reader of the rest of config.json (arch_impl.h): shapes
     * and features into c, or -1 with dcp_error() naming the field */
    int (*read_config)(struct json_t *root, const struct Arch *a, const char *path, Config *c);
} Arch;

extern const Arch arch_table[];
extern const int arch_count;

/* The shapes and features of a config.json (text of len bytes; path names
 * it in messages): the architecture first, then every field that changes
 * the math, each read or refused with one line. */
int arch_read_config(const char *path, const char *text, size_t len, Config *c);
/* generation_config.json: its eos_token_id (an id or a list) join config.json's,
 * as generation stops on either (transformers, vLLM). */
int arch_read_generation_config(const char *path, const char *text, size_t len, Config *c);

/* The layer family of a config's architecture (the generated and llama2.c
 * models are Llama's). */
LayerFamily arch_family(const Config *c);

/* "LlamaForCausalLM, MistralForCausalLM, ...", for messages and --help. */
const char *arch_supported_list(void);

/* Which matrices a compressed-tensors checkpoint quantizes: the targets
 * and ignore lists of its config.json's quantization_config, each entry a
 * module name, a class ("Linear": every matrix a layer multiplies by, and
 * the LM head) or "re:" and a regular expression matched from the start
 * of the name (as compressed-tensors does, with Python's re.match). A
 * ModelOpt checkpoint: every Linear but its exclude_modules, shell
 * patterns (fnmatch). */
typedef struct QuantRules QuantRules;
/* NULL with dcp_error() on a bad list or pattern */
QuantRules *quant_rules_read(const char *config_path);
/* 1 when module (a tensor's name less ".weight"), a Linear when linear,
 * is quantized: matched by a target and by no ignore entry (for block-scaled
 * FP8: a Linear outside modules_to_not_convert) */
int quant_rules_quantized(const QuantRules *r, const char *module, int linear);
void quant_rules_free(QuantRules *r);

#endif
