/* A model's hyperparameters (Config) and the tensors they imply: their
 * kinds, full shapes, Hugging Face names and RoPE frequencies. Known to
 * the config readers (arch.c), the loader (model.c) and the test-model
 * writer (mkmodel.c) alike, below all of them. */
#ifndef DCP_HPARAMS_H
#define DCP_HPARAMS_H

#include <stddef.h>

#include "rope.h"

/* How RoPE frequencies are scaled for long context (config.json's
 * rope_scaling / rope_parameters "rope_type"); dynamic NTK is refused (its
 * frequencies change with the sequence length). */
typedef enum { ROPE_DEFAULT, ROPE_LINEAR, ROPE_LLAMA3, ROPE_YARN } RopeType;

typedef struct {
    RopeType type;
    float factor;                 /* linear, llama3, yarn */
    float low_freq_factor, high_freq_factor; /* llama3 */
    int original_max_position_embeddings;    /* llama3, yarn */
    float beta_fast, beta_slow;   /* yarn */
    float attention_factor;       /* yarn: cos/sin scale; derived when the config gives none */
    int truncate;                 /* yarn: round the correction range (default 1) */
} RopeScaling;
typedef enum { FORMAT_GENERATED, FORMAT_LLAMA2C, FORMAT_HF } ModelFormat;

/* A mixture-of-experts block as config.json gives it, for any family
 * (DeepSeek's MoE layers, Qwen3-MoE's): n_routed_experts of moe_hidden
 * rows, experts_per_token chosen per token, n_shared_experts run by every
 * token; 0 routed experts: no MoE layers. */
typedef enum { ROUTE_GREEDY, ROUTE_GROUP_LIMITED_GREEDY, ROUTE_NOAUX_TC } RouteMethod;
typedef struct {
    int n_routed_experts, n_shared_experts, experts_per_token, moe_hidden;
    int first_k_dense_replace, moe_layer_freq; /* MoE in layers l >= first_k_dense_replace with l % freq == 0 */
    int n_group, topk_group;
    RouteMethod route;
    int sigmoid;                   /* sigmoid scores with a correction bias (DeepSeek-V3), else softmax */
    int norm_topk_prob;
    float routed_scaling_factor;
} MoeConfig;
/* 1 when layer l of a model with a MoE block is a mixture of experts */
#define MOE_LAYER(c, l)                                                                                           \
    ((c)->moe.n_routed_experts > 0 && (l) >= (c)->moe.first_k_dense_replace && (l) % (c)->moe.moe_layer_freq == 0)

/* How a checkpoint's quantization_config stores its matrices (DeepSeek's
 * FP8, INT4 and NVFP4 checkpoints); all 0: as their dtype says. */
typedef struct {
    int fp8_block[2];              /* block-scaled FP8 weights (quantization_config): block rows, cols; 0: none */
    int int4_group;                /* compressed-tensors pack-quantized INT4 (W4A16, symmetric): columns per
                                      scale; which matrices: its targets and ignore (model_check_checkpoint) */
    int nvfp4_group;               /* NVFP4: columns per FP8 scale; 0: none */
    int nvfp4_w4a4;                /* the checkpoint quantizes activations too (compressed-tensors'
                                      input_activations, every ModelOpt NVFP4): each quantized Linear has an
                                      input scale (input_global_scale /, ModelOpt's input_scale x) */
    int nvfp4_modelopt;            /* as NVIDIA ModelOpt writes it (weight, weight_scale, weight_scale_2 x);
                                      else as compressed-tensors (weight_packed, ..., weight_global_scale /) */
    int nvfp4_round_bf16;          /* dequantized values rounded to bf16 (compressed-tensors always; ModelOpt:
                                      to the model's dtype) */
    int kv_fp8;                    /* the checkpoint's FP8 KV cache scales (kv_cache_quant_algo FP8 or an
                                      8-bit float kv_cache_scheme): k_scale, v_scale per attention layer */
} QuantConfig;

/* DeepSeek-V2/V3 multi-head latent attention, as config.json gives it. */
typedef struct {
    int q_lora_rank;               /* 0: q_proj instead of q_a_proj / q_a_layernorm / q_b_proj */
    int kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int rope_interleave;           /* RoPE on adjacent pairs (else rotate-half) */
    float softmax_scale;           /* qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 */
} MlaConfig;

/* where a multimodal wrapper (Kimi K2.5) keeps its language model's tensors
 * and quantization names */
#define WRAPPED_PREFIX "language_model."

typedef struct {
    int dim;          /* hidden size */
    int hidden_dim;   /* feed-forward size */
    int n_layers;
    int n_heads;      /* query heads */
    int n_kv_heads;   /* key/value heads; divides n_heads */
    int head_dim;
    int vocab_size;
    int max_seq_len;
    float rope_theta;
    RopeScaling rope;
    float norm_eps;
    RopeStyle rope_style;
    int rotary_dim;   /* RoPE rotates the first rotary_dim dimensions of a head (GLM-4.5: half); 0: all */
    int tied_embeddings;
    int stored_bf16;         /* config.json's torch_dtype (or dtype) is bfloat16: how a checkpoint stores the
                              * tensors its quantization_config leaves alone (sizing from a bare config.json) */
    int wrapped;             /* the language model of Kimi K2.5's multimodal checkpoint: text_config, tensors under
                              * WRAPPED_PREFIX, the vision tower's skipped (open_checkpoint, model.c) */
    int bos_id;         /* -1 when the model has none */
    int eos_ids[8];     /* generation stops on any of these */
    int n_eos;
    int qkv_bias;       /* q/k/v projections have biases (Qwen2; attention_bias) */
    int o_bias;         /* o_proj has a bias (attention_bias of Llama/Qwen3) */
    int mlp_bias;       /* gate/up/down have biases (Llama's mlp_bias) */
    int qk_norm;        /* Qwen3: RMSNorm over head_dim of q and k before RoPE */
    /* Mistral/Qwen2-style sliding-window attention: a token at position p
     * attends to keys at positions > p - sliding_window, in the layers from
     * window_first_layer on; sliding_window 0: full attention everywhere */
    int sliding_window;
    int window_first_layer;
    int arch;           /* index in the table of architectures (arch.h); 0 is Llama */
    ModelFormat format;
    /* DeepSeek-V2/V3: multi-head latent attention (then n_kv_heads is 1 and
     * head_dim is kv_lora_rank + qk_rope_head_dim, the width of a latent
     * cache row) */
    int mla;
    MlaConfig m;
    MoeConfig moe;     /* the mixture-of-experts layers of DeepSeek, Qwen3-MoE and GLM-4.5 */
    QuantConfig quant; /* stored formats of the matrices */
    int mtp_layers;    /* num_nextn_predict_layers: multi-token-prediction layers after the last (DeepSeek-V3,
                        * GLM-4.5); skipped unless loaded */
    int mtp_loaded;    /* of them, loaded as layer n_layers on (speculative decoding with "mtp"): 0 or 1 */
} Config;

/* The decoder layers a model holds: its n_layers and a loaded MTP layer */
static inline int layers_held(const Config *c) { return c->n_layers + c->mtp_loaded; }


/* The weight tensors, named by role; their full shapes follow from Config. */
typedef enum {
    T_EMBED, T_RMS_ATT, T_WQ, T_WK, T_WV, T_WO, T_RMS_FFN, T_GATE, T_UP, T_DOWN, T_RMS_FINAL, T_LM_HEAD,
    T_BQ, T_BK, T_BV, T_BO, T_B_GATE, T_B_UP, T_B_DOWN, T_Q_NORM, T_K_NORM,
    T_COUNT
} TensorKind;
/* Full (unsharded) rows and columns of one layer's tensor of this kind;
 * 1-D tensors have one row. */
void tensor_full_shape(const Config *c, TensorKind k, int *rows, int *cols);
int tensor_is_per_layer(TensorKind k);
/* How many tensors of kind k a checkpoint holds: 1, n_layers, or for the
 * dense feed-forward's (gate, up, down and their biases) the layers
 * without experts, which come first (GLM-4.5's first_k_dense_replace;
 * none for Qwen3-MoE). */
int tensor_layers(const Config *c, TensorKind k);
/* 1 when a checkpoint of this config holds tensors of kind k (biases and
 * q/k norms only when configured; the LM head unless tied). */
int tensor_present(const Config *c, TensorKind k);
/* RoPE's inverse frequencies (head_dim/2) and the cos/sin scale of the
 * config's scaling, as transformers computes them. */
void rope_frequencies(const Config *c, float *inv_freq, float *scale);
/* Hugging Face name of a tensor, e.g. model.layers.3.self_attn.q_proj.weight. */
void tensor_hf_name(TensorKind k, int layer, char *buf, size_t n);
size_t model_param_count(const Config *c);

/* Adds id to the EOS ids (once; at most 8). */
void config_add_eos(Config *c, int id);

#endif
