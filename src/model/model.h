/* The model: this rank's shard of the weights (Weights) over the shapes of
 * hparams.h, and how a checkpoint is found, checked and read. */
#ifndef DCP_MODEL_H
#define DCP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "hparams.h"
#include "weight.h"

/* This rank's part of each split dimension. With tp = 1 every count equals
 * the full model's and every offset is 0. */
typedef struct {
    int tp, tp_rank;
    int q_heads, q_head0;    /* query heads held */
    int kv_heads, kv_head0;  /* KV heads held (replicated when tp > n_kv_heads) */
    int hidden, hidden0;     /* feed-forward rows/columns held */
    int vocab, vocab0;       /* LM-head rows held */
    int moe_hidden, moe_hidden0;       /* MoE models: each routed expert's intermediate rows held */
    int shared_hidden, shared_hidden0; /* and the shared experts' */
    /* The routed experts held: experts of them from expert0 on, with
     * moe_hidden rows each. Without expert parallelism (ep 0) all of them,
     * sliced by TP; with it (shard_set_ep) a contiguous range of whole
     * experts per rank of the EP group of ep ranks, whose down projections
     * are not cut into K chunks (expert_chunks 1: the rank holds every
     * column). */
    int ep, ep_rank;
    int experts, expert0, expert_chunks;
    /* The canonical reduction order (docs/design.md, "Same bits at any
     * layout"): every row-parallel product's K columns fall in k_chunks
     * canonical chunks, of which this rank holds chunks (k_chunks / tp, or 1
     * when tp does not divide k_chunks); attention's keys fall in
     * key_shards interleaved shards. */
    int k_chunks, chunks, key_shards;
} Shard;

/* A mixture-of-experts block's weights (DeepSeek's MoE layers, Qwen3-MoE's
 * layers): this rank's moe_hidden rows of each routed expert. */
typedef struct {
    float *router, *router_bias;         /* (experts, dim); (experts), DeepSeek-V3 only */
    /* the routed experts of each kind as one stack, expert e's matrix at
     * weight_at(e_gate, e * moe_hidden * dim): (moe_hidden, dim), ...,
     * (dim, moe_hidden) */
    WeightRef e_gate, e_up, e_down;
    WeightRef s_gate, s_up, s_down;      /* shared experts: (moe_hidden*n_shared, dim), ...; data NULL when none */
} MoeLayer;

/* One layer of a DeepSeek-V2/V3 model, this rank's shard: q_b/q and kv_b
 * by heads, o_proj by its head columns, the feed-forward and each expert
 * by intermediate rows; the rest whole. The matrices the GEMMs read are
 * quantized ones as stored (FP8, INT4, NVFP4), the others in the model's
 * gemm_dtype (fp32 or bf16); the router is fp32. kv_b is read in fp32 and
 * folded at load into the absorbed attention's stacks uk_t and uv
 * (layer_mla.c), in its own buffer: bf16 in a bf16 model (kv_b16, the
 * fp32 one then freed), else fp32, as a quantized kv_b's values are. */
typedef struct {
    float *rms_att, *rms_ffn;            /* (dim) */
    WeightRef q_a, q_b;                  /* (q_lora, dim), (H*(nope+rope), q_lora); q_lora_rank > 0 */
    float *q_a_norm;                     /* (q_lora) */
    WeightRef q;                         /* (H*(nope+rope), dim); q_lora_rank 0 */
    WeightRef kv_a;                      /* (kv_lora+rope, dim) */
    float *kv_a_norm, *kv_b;             /* (kv_lora), (H*(nope+v), kv_lora) as read */
    uint16_t *kv_b16;                    /* bf16 model: where kv_b is folded to (kv_b: a scratch copy) */
    WeightRef uk_t, uv;                  /* kv_b folded: (H, kv_lora, nope) then (H, v, kv_lora) */
    WeightRef o;                         /* (dim, H*v) */
    WeightRef gate, up, down;            /* dense feed-forward: (hidden, dim), (hidden, dim), (dim, hidden) */
    MoeLayer moe;                        /* a MoE layer's */
} MlaLayer;

/* A DeepSeek multi-token-prediction layer's own tensors, beside its
 * decoder layer (MlaLayer n_layers): it turns a token's embedding and the
 * hidden state of the position before it into the next position's
 * prediction (engine_mtp). eh_proj whole on every rank; the embedding and
 * the head this rank's rows of the vocabulary, as the main ones. */
typedef struct {
    float *enorm, *hnorm, *head_norm; /* (dim) */
    WeightRef eh_proj;                /* (dim, 2 dim): [enorm(embedding), hnorm(hidden)] in */
    WeightRef embed, head;            /* (vocab shard, dim) */
} MtpLayer;

/* The parts of a rank's weights, as dcpinfer-plan reports them:
 * attention (projections and norms), the feed-forward blocks every token
 * runs (dense layers' MLP, MoE layers' shared experts, their norms), the
 * routed experts with their router, the token embedding (read by row),
 * and the final norm with the LM head. */
typedef enum { WPART_ATTENTION, WPART_MLP, WPART_EXPERTS, WPART_EMBED, WPART_LM_HEAD, WPART_N } WeightPart;
extern const char *const weight_part_names[WPART_N];

/* Per-rank weights; shapes are the shard's (tp = 1: the full model's). The
 * matrices the GEMMs read are in the model's gemm_dtype, the rest fp32. */
typedef struct {
    WeightRef token_embedding; /* (vocab shard, dim): the LM head's rows (Shard.vocab0, vocab), whose */
                               /* tokens this rank embeds; the TP sum gives each token its row */
    float *rms_att;         /* (layer, dim) */
    WeightRef wq;           /* (layer, q_heads*head_dim, dim) */
    WeightRef wk;           /* (layer, kv_heads*head_dim, dim) */
    WeightRef wv;           /* (layer, kv_heads*head_dim, dim) */
    WeightRef wo;           /* (layer, dim, q_heads*head_dim) */
    float *rms_ffn;         /* (layer, dim) */
    /* the dense feed-forward blocks of the first tensor_layers(T_GATE) layers (all, without experts) */
    WeightRef w_gate;       /* (layer, hidden, dim) */
    WeightRef w_up;         /* (layer, hidden, dim) */
    WeightRef w_down;       /* (layer, dim, hidden) */
    float *rms_final;       /* (dim) */
    WeightRef lm_head;      /* (vocab, dim) */
    /* present when the config says so, else NULL */
    float *bq;              /* (layer, q_heads*head_dim) */
    float *bk, *bv;         /* (layer, kv_heads*head_dim) */
    float *bo;              /* (layer, dim): added once, after the TP sum */
    float *b_gate, *b_up;   /* (layer, hidden) */
    float *b_down;          /* (layer, dim): added once, after the TP sum */
    float *q_norm, *k_norm; /* (layer, head_dim) */
    MlaLayer *mla;          /* DeepSeek-V2/V3: per layer, instead of the stacks above */
    MoeLayer *moe;          /* Qwen3-MoE, GLM-4.5: per layer, the MoE layers' (MOE_LAYER) */
    MtpLayer mtp;           /* Config.mtp_loaded: the MTP layer's own tensors */
    /* Buffers to release: weights are copied into these as shards, except
     * whole f32 tensors of a llama2.c file, which point into its mapping
     * (kept until model_free), and a tied LM head that is the embedding. */
    void **owned;
    int n_owned;
    size_t bytes; /* all of this rank's weights, owned or mapped */
    size_t part_bytes[WPART_N]; /* the same by part */
    WeightPart part;            /* the part being loaded */
    int sizing;                 /* model_size: counted, nothing allocated or read */
    /* a W4A4 matrix whose input activations cannot be quantized as the
     * checkpoint does ("" when none): its columns on this rank start or end
     * inside a group of 16, or it is an MLA kv_b_proj, folded at load */
    char act_split[128];
    /* an FP8 KV checkpoint's scales (QuantConfig.kv_fp8): k_scale then
     * v_scale of each layer (an MLA layer's v_scale its k_scale); NULL
     * without */
    float *kv_scale;
    void *map;
    size_t map_size;
} Weights;

typedef struct {
    Config cfg;
    Shard shard;
    Weights w;
    DType gemm_dtype; /* of w's matrices */
    int bf16_group;   /* rows per group of bf16 matrices that allow it */
    char *path;
} Model;

void shard_init(Shard *s, const Config *c, int tp, int tp_rank);
/* Expert parallelism over ep ranks (docs/design.md, "Expert
 * parallelism"): rank ep_rank holds experts [ep_rank E / ep, (ep_rank + 1)
 * E / ep) whole (ep 1: all of them, whole). ep 0: off, as shard_init left
 * it. The caller has checked that ep divides the routed experts
 * (expert_parallel_check). */
void shard_set_ep(Shard *s, const Config *c, int ep, int ep_rank);
/* 0 when expert parallelism over ep ranks suits the model, else -1 and
 * dcp_error() says why (no routed experts; ep does not divide them). */
int expert_parallel_check(const Config *c, int ep);
/* The canonical sizes of a model: K chunks (a power of two up to 16 that
 * is a valid -tp and divides every row-parallel product's K) and key
 * shards (the largest -dcp a layout with tp = k_chunks has). */
void canonical_order(const Config *c, int *k_chunks, int *key_shards);
/* The reduction order a layout computes in, for the results and the run
 * identity: "k8 d8 i1" (the canonical K chunks, key shards and the
 * interleave the shards use: every layout with tp dividing 8 and dcp
 * dividing 8 at that interleave gives the same bits), or "layout tp3 dcp1
 * i1" where tp or dcp does not divide them. ep (expert parallelism on,
 * at any EP size) appends " ep": whole experts add their down
 * projections and their tokens' experts in another order, the same at
 * every such layout. Returns 1 when canonical. */
int reduction_order(const Config *c, int tp, int dcp, int interleave, int ep, char *buf, size_t n);

/* A layer's tensor manifest, entry by entry: a checkpoint tensor's name,
 * its full shape, this rank's slice of it and where its values go. The
 * layers of an MLA model (mla_tensors) and the MoE blocks of any family
 * (moe_tensors) are loaded, checked, sized and written (dcpinfer-mkmodel)
 * by walking theirs; the dense family's stacks are still loaded by
 * TensorKind (hparams.h). mla_tensors and moe_tensors take the shard s
 * (NULL: whole) and w (may be NULL), fill out (layer_max_tensors(c)
 * entries) and return the count. */
typedef struct {
    char name[128];
    int rows, cols; /* rows 0: a vector of cols */
    float **dst;     /* fp32 (vectors, kv_b, the router) */
    uint16_t **bf16; /* kv_b: where a bf16 model holds it folded (MlaLayer.kv_b16) */
    WeightRef *mat;  /* or a matrix the GEMMs read, in the stored type (FP8 stays FP8) */
    size_t mat_at;   /* its elements before this tensor's (an expert in a stack) */
    size_t mat_n;    /* the elements of the whole matrix or stack */
    int row0, nrows, col0, ncols;
    int chunks; /* row-parallel: the columns read as this many (nrows, ncols / chunks) matrices in turn */
} TensorSpec;
int mla_tensors(const Config *c, const Shard *s, int l, MlaLayer *w, TensorSpec *out);
/* An MTP layer's own tensors (l from n_layers on), after its decoder
 * layer's: enorm, hnorm, eh_proj, shared_head.norm and .head, and the
 * first MTP layer's embed_tokens (the MTP layers share it, as vLLM reads
 * them). At most MTP_TENSORS. */
#define MTP_TENSORS 6
int mtp_tensors(const Config *c, const Shard *s, int l, MtpLayer *w, TensorSpec *out);
/* The same for layer l's mixture-of-experts block (MOE_LAYER) alone:
 * router, routed and shared experts */
int moe_tensors(const Config *c, const Shard *s, int l, MoeLayer *w, TensorSpec *out);
int layer_max_tensors(const Config *c);
/* After an MLA layer's tensors are read: kv_b into uk_t and uv (MlaLayer) */
void mla_fold_kv_b(const Model *m, MlaLayer *w);

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
/* The same with the GEMM matrices in dtype: "float32", "bfloat16", or
 * "auto": bfloat16 when the checkpoint stores them so (not for MLA models,
 * whose matrices load as float32), else float32. bf16_group: bfloat16
 * matrices stored in groups of that many rows where they can be (see
 * WeightRef; the backend's gemm_row_group), 0: row after row. */
int model_load_as(Model *m, const char *path, int tp, int tp_rank, const char *dtype, int bf16_group);
/* model_load_as with the routed experts spread whole over ep ranks
 * (shard_set_ep); ep 0 is model_load_as. */
int model_load_ep(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype,
                  int bf16_group);
/* model_load_ep, and with mtp the first multi-token-prediction layer as
 * well (Config.mtp_loaded; speculative decoding's "mtp"): a DeepSeek
 * model's that has one, else -1 with the reason. */
int model_load_mtp(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype,
                   int bf16_group, int mtp);

/* What model_load_as would hold on this rank, without reading a weight:
 * m's cfg, shard, gemm_dtype and w.bytes / w.part_bytes, nothing else
 * (free with model_free). path: what model_load_as takes, or a bare
 * config.json, whose tensors are taken to be stored as its
 * quantization_config says (4-bit where its rules quantize a module, FP8
 * for every matrix but the router under block-scaled FP8, as DeepSeek-V3's
 * checkpoints store them) and otherwise as its torch_dtype. */
int model_size(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype);
/* model_size, with mtp the first MTP layer as model_load_mtp loads it */
int model_size_mtp(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype, int mtp);
/* A config from whatever model_size takes. */
int model_read_any_config(const char *path, Config *c);

void model_free(Model *m);
/* One line on how the loaded weights are stored: each kind of matrix's
 * format and this rank's bytes ("61 layers; attention fp8-e4m3 128x128
 * blocks, experts ..., LM head float32; 84.2 GiB on this rank"). */
void model_weights_summary(const Model *m, char *buf, size_t n);

/* What the model's arithmetic depends on, by content (the run identity):
 * each of its files (hash_file_sampled: whole up to 1 GiB, else size,
 * header and samples): a llama2.c file; a Hugging Face folder's config
 * files and safetensors files; for the generated model, its name. */
int model_content_hash(const char *path, uint64_t *h);
/* The type the GEMM matrices load as for --dtype (model_load_as), without
 * loading them. */
int model_gemm_dtype(const char *path, const Config *c, const char *dtype, DType *out);



#endif
