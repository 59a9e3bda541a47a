/* The model: shapes (Config), this rank's shard of the weights (Weights),
 * and how a checkpoint is found and read. */
#ifndef DCP_MODEL_H
#define DCP_MODEL_H

#include <stddef.h>

typedef enum { ROPE_ADJACENT_PAIRS, ROPE_ROTATE_HALF } RopeStyle;
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
    float norm_eps;
    RopeStyle rope_style;
    int tied_embeddings;
    int bos_id;         /* -1 when the model has none */
    int eos_ids[8];     /* generation stops on any of these */
    int n_eos;
    /* Qwen2-style attention bias and Qwen3-style per-head q/k RMSNorm; the
     * loaders recognise them and refuse until the forward pass has them. */
    int attn_bias;
    int qk_norm;
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
/* Loads this rank's shard of the weights (path NULL: generated default). */
int model_load(Model *m, const char *path, int tp, int tp_rank);

/* The weight tensors, named by role; their full shapes follow from Config. */
typedef enum {
    T_EMBED, T_RMS_ATT, T_WQ, T_WK, T_WV, T_WO, T_RMS_FFN, T_GATE, T_UP, T_DOWN, T_RMS_FINAL, T_LM_HEAD,
    T_COUNT
} TensorKind;
/* Full (unsharded) rows and columns of one layer's tensor of this kind;
 * 1-D tensors have one row. */
void tensor_full_shape(const Config *c, TensorKind k, int *rows, int *cols);
int tensor_is_per_layer(TensorKind k);
/* Hugging Face name of a tensor, e.g. model.layers.3.self_attn.q_proj.weight. */
void tensor_hf_name(TensorKind k, int layer, char *buf, size_t n);
void model_free(Model *m);

size_t model_param_count(const Config *c);

#endif
