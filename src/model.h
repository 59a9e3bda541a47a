/* The model: shapes (Config), this rank's shard of the weights (Weights),
 * and how a checkpoint is found and read. */
#ifndef DCP_MODEL_H
#define DCP_MODEL_H

#include <stddef.h>

typedef enum { ROPE_ADJACENT_PAIRS, ROPE_ROTATE_HALF } RopeStyle;
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
    int tied_embeddings;
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
} Config;

/* This rank's part of each split dimension. With tp = 1 every count equals
 * the full model's and every offset is 0. */
typedef struct {
    int tp, tp_rank;
    int q_heads, q_head0;    /* query heads held */
    int kv_heads, kv_head0;  /* KV heads held (replicated when tp > n_kv_heads) */
    int hidden, hidden0;     /* feed-forward rows/columns held */
    int vocab, vocab0;       /* LM-head rows held */
} Shard;

/* Per-rank fp32 weights; shapes are the shard's (tp = 1: the full model's). */
typedef struct {
    float *token_embedding; /* (vocab, dim), full: every rank embeds every token */
    float *rms_att;         /* (layer, dim) */
    float *wq;              /* (layer, q_heads*head_dim, dim) */
    float *wk;              /* (layer, kv_heads*head_dim, dim) */
    float *wv;              /* (layer, kv_heads*head_dim, dim) */
    float *wo;              /* (layer, dim, q_heads*head_dim) */
    float *rms_ffn;         /* (layer, dim) */
    float *w_gate;          /* (layer, hidden, dim) */
    float *w_up;            /* (layer, hidden, dim) */
    float *w_down;          /* (layer, dim, hidden) */
    float *rms_final;       /* (dim) */
    float *lm_head;         /* (vocab, dim) */
    /* present when the config says so, else NULL */
    float *bq;              /* (layer, q_heads*head_dim) */
    float *bk, *bv;         /* (layer, kv_heads*head_dim) */
    float *bo;              /* (layer, dim): added once, after the TP sum */
    float *b_gate, *b_up;   /* (layer, hidden) */
    float *b_down;          /* (layer, dim): added once, after the TP sum */
    float *q_norm, *k_norm; /* (layer, head_dim) */
    /* Buffers to release: weights are copied into these as fp32 shards,
     * except whole f32 tensors of a llama2.c file, which point into its
     * mapping (kept until model_free). */
    void **owned;
    int n_owned;
    void *map;
    size_t map_size;
} Weights;

typedef struct {
    Config cfg;
    Shard shard;
    Weights w;
    char *path;
} Model;

/* Balanced split of n items over p parts: part i gets [start, start+count). */
void balanced_part(int n, int p, int i, int *start, int *count);
void shard_init(Shard *s, const Config *c, int tp, int tp_rank);

/* Reads shapes only (cheap): llama2.c .bin header or HF config.json.
 * path NULL means the generated default model. */
int model_read_config(const char *path, Config *cfg);
/* The same from the bytes of a config.json, or from the first head_bytes
 * (28 or fewer) bytes of a llama2.c file of size bytes; path names the file
 * in messages. */
int config_from_json(const char *path, const char *text, size_t len, Config *c);
int config_from_llama2c_header(const char *path, const unsigned char *head, size_t head_bytes, size_t size, Config *c);
/* For a Hugging Face checkpoint: every tensor the config implies is there
 * with its shape, and every tensor there is used or known to be ignorable
 * (rotary_emb.inv_freq). Reads the headers only. */
int model_check_checkpoint(const char *path, const Config *c);
/* Loads this rank's shard of the weights (path NULL: generated default). */
int model_load(Model *m, const char *path, int tp, int tp_rank);

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
/* 1 when a checkpoint of this config holds tensors of kind k (biases and
 * q/k norms only when configured; the LM head unless tied). */
int tensor_present(const Config *c, TensorKind k);
/* RoPE's inverse frequencies (head_dim/2) and the cos/sin scale of the
 * config's scaling, as transformers computes them. */
void rope_frequencies(const Config *c, float *inv_freq, float *scale);
/* Hugging Face name of a tensor, e.g. model.layers.3.self_attn.q_proj.weight. */
void tensor_hf_name(TensorKind k, int layer, char *buf, size_t n);
void model_free(Model *m);

size_t model_param_count(const Config *c);

#endif
