/* Deterministic test models of any shape: their specification, the config
 * it implies and the values of their tensors, which the loader holds in
 * memory for the default model and mkmodel_write.h writes as files. */
#ifndef DCP_MKMODEL_H
#define DCP_MKMODEL_H

#include <stdint.h>

#include "hparams.h"

typedef struct {
    int layers, dim, heads, kv_heads, hidden, vocab, max_len;
    int tied;          /* share token embedding and LM head */
    int eos;           /* -1: none */
    float rope_theta;
    uint64_t seed;
    float branch_scale;   /* o_proj and down_proj (experts' too) scaled by this; 0: 1 */
    /* Hugging Face architecture (arch.h's table; 0: Llama) and its options */
    int arch;
    int head_dim;         /* 0: dim / heads */
    int attention_bias;   /* Llama, Qwen3: q/k/v/o biases */
    int mlp_bias;         /* Llama */
    RopeScaling rope;     /* type ROPE_DEFAULT: none */
    int rope_parameters;  /* write the rope block as "rope_parameters" (transformers 5) instead of "rope_scaling" */
    int sliding_window;   /* Mistral, Qwen2, Qwen3; 0: none */
    int max_window_layers; /* Qwen2, Qwen3: the first layer with the window */
    /* DeepSeek-V2/V3 (arch deepseek_v2 / deepseek_v3): latent attention;
     * their experts and Qwen3-MoE's (moe); the feed-forward of dense layers
     * is hidden */
    MlaConfig mla;
    MoeConfig moe;
    int fp8_block;         /* write layer matrices as block-scaled FP8 with blocks of this size; 0: float32 */
    int int4_group;        /* write the routed experts as compressed-tensors INT4 W4A16 in groups of this
                              many columns (bf16 scales), as Kimi K2's; 0: float32 */
    int nvfp4;             /* write the routed experts as NVFP4: 1 as compressed-tensors, 2 as ModelOpt */
    int kimi_k25;          /* wrap a DeepSeek-V3 model as Kimi K2.5's multimodal checkpoint */
    int mtp_layers;        /* DeepSeek: multi-token-prediction layers after the last (num_nextn_predict_layers) */
    /* GLM-4.5 (arch glm4_moe): per-head q/k norms (use_qk_norm), and the
     * share of each head RoPE rotates (0: its default, 0.5) */
    int qk_norm;
    float partial_rotary;
} ModelSpec;

/* The model dcpinfer runs when no --model is given. */
void mkmodel_default_spec(ModelSpec *s);
int mkmodel_check_spec(const ModelSpec *s);
void mkmodel_config(const ModelSpec *s, Config *c);

/* Values of one full tensor in Hugging Face layout (rotate-half RoPE). */
void mkmodel_tensor(const ModelSpec *s, TensorKind k, int layer, float *out);

/* The families' parts (family_deepseek.c, family_moe.c): defaults for
 * what the options left at 0 (DeepSeek: small, 8 experts in 4 groups;
 * Qwen3-MoE: 8 experts of 32 rows, 2 per token, renormalized; GLM-4.5:
 * DeepSeek-V3's router with a shared expert), the shapes their readers
 * accept, and the config a written model reads back as. */
void mkmodel_mla_defaults(ModelSpec *s);
void mkmodel_moe_defaults(ModelSpec *s);
int deepseek_check_spec(const ModelSpec *s);
int moe_check_spec(const ModelSpec *s);
void deepseek_spec_config(const ModelSpec *s, Config *c);
void moe_spec_config(const ModelSpec *s, Config *c);

#endif
