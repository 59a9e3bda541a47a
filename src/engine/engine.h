/* The forward pass over a step's chunks (attention.h): the token
 * embedding, the architecture family's layers (layer.h) in order, the final
 * norm and this rank's slice of the vocabulary-parallel LM head. What lives
 * for the run (weights, the KV cache), what lives for a step (the
 * attention core's metadata) and scratch are kept apart. */
#ifndef DCP_ENGINE_H
#define DCP_ENGINE_H

#include "arch.h"
#include "attention.h"
#include "layer.h"

typedef struct {
    MergeBackend merge;
    size_t kv_cache_memory; /* bytes of K/V per rank; 0: 256 MiB */
    int block_size;         /* positions per block per rank; 0: 16 */
    int mpi_device_buffers; /* GPU backends: MPI takes device pointers (else staged) */
    int timing_sync;        /* wait for the device around timed phases (benchmarks) */
    DType kv_dtype;         /* of the KV cache (DTYPE_F32 unless --kv-cache-dtype) */
    int nvfp4_act;          /* W4A4 checkpoints: quantize each NVFP4 matrix's input (LayerEnv.nvfp4_act) */
    size_t table_blocks;    /* a step's block tables together at most, held from the start (0: grown as needed) */
} EngineOptions;

typedef struct {
    LayerEnv env;          /* the run's state the layers see */
    Attention att;         /* the KV cache, the step's metadata, the DCP merges */
    const LayerOps *ops;   /* the architecture family's layer, chosen once */
    void *layers;          /* its weights and scratch */
    /* the weights every family shares, in the backend */
    Uploads up;
    WeightRef token_embedding;    /* (vocab shard, dim): Weights.token_embedding */
    const float *rms_final;       /* (dim) */
    WeightRef lm_head;            /* (vocab shard, dim); a tied one is token_embedding */
    /* the step's buffers, sized for cap_T tokens and cap_R logit rows */
    int cap_T, cap_R;
    float *xf, *logits;
    int *d_tokens, *d_rows, *rows;
    MoeCounts moe_counts; /* expert parallelism's counts (layer.h); empty without it */
    /* speculative decoding's MTP layer (Config.mtp_loaded): its decoder
     * layer's index in the family's layers (n_layers; 0: none), its own
     * weights, the final-normed hidden states of the last engine_forward's
     * tokens (cap_T, dim) and its input rows (cap_T, 2 dim) */
    int mtp;
    WeightRef mtp_embed, mtp_eh, mtp_head;
    const float *mtp_enorm, *mtp_hnorm, *mtp_head_norm;
    float *hidden, *mtp_in;
    int *mtp_tokens;
    size_t table_blocks;  /* EngineOptions.table_blocks */
    CommStats own_stats;  /* the collectives' counts when engine_init was given none */
} Engine;

/* The layer of an architecture family (arch.h). */
const LayerOps *engine_layer_ops(LayerFamily family);

/* topo NULL: one rank (tp = dcp = 1); stats may then be NULL too.
 * eo NULL: ag_rs merge, 256 MiB of KV cache, blocks of 16. The
 * collectives go over stats->t (comm.h; NULL: MPI) within topo's groups:
 * dcpinfer-plan runs a step on the counting transport and the null
 * backend with a Topology whose communicators are MPI_COMM_NULL. */
void engine_init(Engine *e, const Model *m, const Backend *be, const Topology *topo, const EngineOptions *eo,
                 Timings *tm, CommStats *stats);
void engine_free(Engine *e);

/* Bytes of K/V this rank stores per position it owns. */
size_t engine_kv_bytes_per_token(const Engine *e);
/* The KV pool engine_init would give a model (only its cfg and shard are
 * read, so a Model without weights will do) at a DCP size and options. */
void engine_kv_sizing(const Model *m, int dcp, const EngineOptions *eo, KvSizing *out);
/* Logical KV capacity of the DCP group in positions: blocks x B x dcp. */
long long engine_kv_capacity(const Engine *e);

/* vLLM's --gpu-memory-utilization: of a device's total memory, the share
 * `utilization` is dcpinfer's (usable, rounded down to a byte); the KV
 * cache takes what the weights and the activation peak of a profiled step
 * of `tokens` tokens (generate_profile) leave of it. dcpinfer and
 * dcpinfer-plan size it with this one function. */
typedef struct {
    size_t total, usable, weights, activations, kv;
    double utilization;
    int tokens;
} GpuBudget;
/* fills b; -1 with dcp_error() when the weights and activations leave no
 * byte for the KV cache */
int engine_gpu_budget(size_t total, double utilization, size_t weights, size_t activations, int tokens, GpuBudget *b);
/* A new KV pool of kv_memory bytes, before any request has run */
void engine_resize_kv(Engine *e, size_t kv_memory);

/* The most tokens a step may hold at this model and layout: above it, an
 * MPI message of a layer (a TP sum, the DCP gathers and merges) would
 * count more than 2^31 - 1 elements, which MPI's int counts cannot say. */
long engine_step_token_limit(const Model *m, const Topology *topo);

/* Runs the model on the chunks' tokens (concatenated in chunk order) and
 * writes their K/V into the owners' caches. logits (host memory) receives
 * this rank's vocabulary shard (shard.vocab floats per row) of rows in
 * chunk order: chunk i's last row_end[i] - row_end[i - 1] tokens' (NULL:
 * its last token's). */
void engine_forward(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, const int *row_end, float *logits);
/* With expert parallelism across DP groups, a DP group without a step to
 * run while others run theirs: every MoE layer's exchange without tokens
 * of its own, serving the rows the other groups send its experts. */
void engine_idle(Engine *e);

/* The MTP layer (e->mtp) over chunks, as vLLM's deepseek_mtp runs it:
 * the token at row t (its embedding; zeros at position 0) and the hidden
 * state of the position before it, each RMS-normed (enorm, hnorm), go
 * through eh_proj and the decoder layer at the chunk's positions, whose
 * K/V it writes to its own cache (the target's block tables and DCP
 * shards). The previous hidden states are rows prev_rows[t] of the last
 * engine_forward's final-normed states, or prev (host, (T, dim)) when
 * prev_rows is NULL. Rows are chosen as engine_forward's (row_end); their
 * logits (shared_head's norm and head, this rank's vocabulary shard) go
 * to logits and their hidden states (T, dim: the input of the next draft
 * step) to hidden, host memory both. */
void engine_mtp(Engine *e, const int *tokens, const Chunk *chunks, int n_chunks, const int *prev_rows,
                const float *prev, const int *row_end, float *logits, float *hidden);
/* engine_idle's counterpart for an MTP pass (the MTP layer's exchange) */
void engine_mtp_idle(Engine *e);

#endif
