#include "model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arch.h"
#include "mkmodel.h"
#include "quant.h"
#include "safetensors.h"
#include "util.h"


void shard_init(Shard *s, const Config *c, int tp, int tp_rank)
{
    memset(s, 0, sizeof *s);
    s->tp = tp;
    s->tp_rank = tp_rank;
    s->q_heads = c->n_heads / tp;
    s->q_head0 = tp_rank * s->q_heads;
    if (tp <= c->n_kv_heads) {
        s->kv_heads = c->n_kv_heads / tp;
        s->kv_head0 = tp_rank * s->kv_heads;
    } else { /* each KV head is replicated on tp / n_kv_heads ranks */
        s->kv_heads = 1;
        s->kv_head0 = tp_rank / (tp / c->n_kv_heads);
    }
    balanced_part(c->hidden_dim, tp, tp_rank, &s->hidden0, &s->hidden);
    balanced_part(c->vocab_size, tp, tp_rank, &s->vocab0, &s->vocab);
    if (c->mla || c->moe.n_routed_experts) {
        balanced_part(c->moe.moe_hidden, tp, tp_rank, &s->moe_hidden0, &s->moe_hidden);
        balanced_part(c->moe.moe_hidden * c->moe.n_shared_experts, tp, tp_rank, &s->shared_hidden0, &s->shared_hidden);
    }
    canonical_order(c, &s->k_chunks, &s->key_shards);
    s->chunks = s->k_chunks % tp ? 1 : s->k_chunks / tp;
    s->ep = 0; /* off (shard_set_ep) */
    s->experts = c->moe.n_routed_experts;
    s->expert_chunks = s->chunks;
}

int expert_parallel_check(const Config *c, int ep)
{
    int E = c->moe.n_routed_experts;
    if (!E)
        return dcp_fail("--enable-expert-parallel: the model has no routed experts (it is not a mixture of experts)");
    if (E % ep)
        return dcp_fail("--enable-expert-parallel: the model's %d routed experts are not divisible by the %d ranks of "
                        "the expert-parallel group (tp x dp); each rank holds a whole, equal range of them",
                        E, ep);
    return 0;
}

void shard_set_ep(Shard *s, const Config *c, int ep, int ep_rank)
{
    if (ep < 1) return;
    s->ep = ep;
    s->ep_rank = ep_rank;
    s->experts = c->moe.n_routed_experts / ep;
    s->expert0 = ep_rank * s->experts;
    s->moe_hidden = c->moe.moe_hidden;
    s->moe_hidden0 = 0;
    s->expert_chunks = 1;
}

void canonical_order(const Config *c, int *k_chunks, int *key_shards)
{
    int kv = c->mla ? 1 : c->n_kv_heads, p = 16;
    for (; p > 1; p /= 2) {
        int ok = c->n_heads % p == 0 && (kv % p == 0 || p % kv == 0) &&
                 (c->hidden_dim % p == 0 || !tensor_present(c, T_GATE));
        if (c->mla) ok &= c->m.v_head_dim > 0;
        if (c->mla || c->moe.n_routed_experts) ok &= c->moe.moe_hidden % p == 0;
        if (ok) break;
    }
    *k_chunks = p;
    *key_shards = p > kv ? p / kv : 1;
}

int reduction_order(const Config *c, int tp, int dcp, int interleave, int ep, char *buf, size_t n)
{
    int C_k, C_d;
    canonical_order(c, &C_k, &C_d);
    int canonical = C_k % tp == 0 && C_d % dcp == 0, I = C_d > 1 ? interleave : 1; /* one shard: no interleave */
    if (canonical) snprintf(buf, n, "k%d d%d i%d%s", C_k, C_d, I, ep ? " ep" : "");
    else snprintf(buf, n, "layout tp%d dcp%d i%d%s", tp, dcp, interleave, ep ? " ep" : "");
    return canonical;
}

/* ---- config readers ---------------------------------------------------- */

/* Upper bounds on every dimension, far above any real model, so that all
 * size arithmetic below stays well inside 64 bits (and products the forward
 * pass forms in int, such as heads x head_dim, inside 32). */
static const struct {
    const char *name;
    size_t offset;
    long long max;
} dim_bounds[] = {
    {"hidden size (dim)", offsetof(Config, dim), 1 << 17},
    {"intermediate size", offsetof(Config, hidden_dim), 1 << 20},
    {"layers", offsetof(Config, n_layers), 1 << 12},
    {"attention heads", offsetof(Config, n_heads), 1 << 12},
    {"KV heads", offsetof(Config, n_kv_heads), 1 << 12},
    {"head_dim", offsetof(Config, head_dim), 1 << 12},
    {"vocabulary", offsetof(Config, vocab_size), 1 << 24},
    {"maximum positions", offsetof(Config, max_seq_len), 1 << 24},
};

#define MAX_LAYER_EXPERTS (1 << 20)

static int validate_config(const char *path, const Config *c)
{
    for (size_t i = 0; i < sizeof dim_bounds / sizeof *dim_bounds; i++) {
        int v = *(const int *)((const char *)c + dim_bounds[i].offset);
        if (v <= 0 || v > dim_bounds[i].max)
            return dcp_fail("%s: %s is %d; it must be from 1 to %lld", path, dim_bounds[i].name, v,
                            dim_bounds[i].max);
    }
    if ((long long)c->n_heads * c->head_dim > 1 << 20)
        return dcp_fail("%s: %d heads x head_dim %d is above %d", path, c->n_heads, c->head_dim, 1 << 20);
    if (c->bos_id >= c->vocab_size)
        return dcp_fail("%s: bos_token_id %d is outside the vocabulary of %d", path, c->bos_id, c->vocab_size);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return dcp_fail("%s: rms_norm_eps %g must be a positive number", path, c->norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return dcp_fail("%s: rope_theta %g must be a positive number", path, c->rope_theta);
    if (c->n_heads % c->n_kv_heads)
        return dcp_fail("%s: %d query heads are not a multiple of %d KV heads", path, c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2) return dcp_fail("%s: head_dim %d is odd; RoPE needs pairs", path, c->head_dim);
    if (c->sliding_window < 0) return dcp_fail("%s: sliding_window %d must be positive", path, c->sliding_window);
    /* every expert of every layer is a tensor to name, find and size: a
     * bound on the product (45 times Kimi K2's 61 x 384) keeps a load and
     * a plan to seconds */
    if ((long long)c->n_layers * c->moe.n_routed_experts > MAX_LAYER_EXPERTS)
        return dcp_fail("%s: %d layers x %d routed experts is above %d expert slots", path, c->n_layers,
                        c->moe.n_routed_experts, MAX_LAYER_EXPERTS);
    return 0;
}

/* llama2.c v0 header: dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size (negative: separate classifier), seq_len. */
static int read_llama2c_config(const char *path, Config *c)
{
    if (check_regular_file(path, "model")) return -1;
    FILE *f = fopen(path, "rb");
    if (!f) return dcp_fail("%s: %s", path, strerror(errno));
    unsigned char head[28];
    size_t got = fread(head, 1, sizeof head, f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    return config_from_llama2c_header(path, head, got, (size_t)size, c);
}

int config_from_llama2c_header(const char *path, const unsigned char *head, size_t head_bytes, size_t size, Config *c)
{
    int32_t h[7];
    if (head_bytes < sizeof h) return dcp_fail("%s: %zu bytes, too short for a llama2.c header", path, size);
    memcpy(h, head, sizeof h);
    memset(c, 0, sizeof *c);
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->tied_embeddings = h[5] > 0;
    /* negative: a separate classifier; INT32_MIN has no positive twin */
    c->vocab_size = h[5] > 0 ? h[5] : h[5] == INT32_MIN ? 0 : -h[5];
    c->max_seq_len = h[6];
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    c->rope_theta = 10000.0f;
    c->norm_eps = 1e-5f;
    c->rope_style = ROPE_ADJACENT_PAIRS;
    c->bos_id = 1;
    c->eos_ids[0] = 1; /* run.c stops when the next token is BOS */
    c->n_eos = 1;
    c->format = FORMAT_LLAMA2C;
    if (validate_config(path, c)) return -1;
    /* the shapes bound above keep this sum far inside 64 bits */
    size_t need = 7 * 4 + 4 * (model_param_count(c) + (size_t)c->max_seq_len * c->head_dim);
    if (size != need)
        return dcp_fail("%s: %zu bytes, but the header's shapes (dim %d, hidden %d, %d layers, %d heads, %d KV "
                        "heads, vocab %d, seq_len %d) need exactly %zu (%s)",
                        path, size, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                        c->max_seq_len, need, size < need ? "truncated file?" : "a different header?");
    return 0;
}

/* A folder given as --model without config.json: names the llama2.c
 * checkpoints in it, if any, as the likely intent. */
static int not_hf_folder(const char *dir)
{
    char bins[1024] = "", first[512] = "";
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && !strcmp(e->d_name + n - 4, ".bin") && strncmp(e->d_name, "tok", 3) && /* tokenizer.bin, tok512.bin */
            strlen(bins) + n + 3 < sizeof bins) {
            snprintf(bins + strlen(bins), sizeof bins - strlen(bins), "%s%s", *bins ? ", " : "", e->d_name);
            if (!*first) snprintf(first, sizeof first, "%s", e->d_name);
        }
    }
    if (d) closedir(d);
    if (*first)
        return dcp_fail("%s: a folder without config.json, so not a Hugging Face checkpoint; it holds the llama2.c "
                        "checkpoint(s) %s: name the file, e.g. --model %s/%s",
                        dir, bins, dir, first);
    return dcp_fail("%s: a folder without config.json: --model takes a Hugging Face folder (config.json and "
                    "*.safetensors) or a llama2.c .bin file",
                    dir);
}

static int read_hf_config(const char *dir, Config *c)
{
    char path[4096], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!path_exists(path)) return not_hf_folder(dir);
    if (check_regular_file(path, "config") || read_file(path, &text, &len)) return -1;
    int rc = config_from_json(path, text, len, c);
    free(text);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!rc && path_exists(path)) {
        rc = check_regular_file(path, "generation config") || read_file(path, &text, &len) ? -1 : 0;
        if (!rc) {
            rc = arch_read_generation_config(path, text, len, c);
            free(text);
        }
    }
    return rc;
}

int config_from_json(const char *path, const char *text, size_t len, Config *c)
{
    return arch_read_config(path, text, len, c) || validate_config(path, c) ? -1 : 0;
}

int model_read_config(const char *path, Config *cfg)
{
    if (!path) {
        ModelSpec s;
        mkmodel_default_spec(&s);
        mkmodel_config(&s, cfg);
        return 0;
    }
    if (!path_exists(path)) {
        /* "Org/Name" with no such folder here: a Hugging Face Hub id */
        const char *slash = strchr(path, '/');
        int hub_id = slash && slash != path && !strchr(slash + 1, '/') && slash[1] && path[0] != '.' &&
                     strspn(path, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_./") == strlen(path);
        if (hub_id)
            return dcp_fail("%s: model path does not exist; dcpinfer loads local folders only and downloads nothing: "
                            "fetch it first (huggingface-cli download %s --local-dir models/%s), then --model models/%s",
                            path, path, slash + 1, slash + 1);
        return dcp_fail("%s: model path does not exist", path);
    }
    if (path_is_dir(path)) return read_hf_config(path, cfg);
    return read_llama2c_config(path, cfg);
}

int layer_max_tensors(const Config *c) { return 16 + MTP_TENSORS + 3 * c->moe.n_routed_experts; }

/* Multi-token-prediction layers (indices from num_hidden_layers on) that
 * are not loaded (Config.mtp_loaded: the first of them with speculative
 * decoding's "mtp"; the tensors of that one are checked by name). */
static int mtp_tensor(const Config *c, const char *name)
{
    int l;
    return (c->mla || c->mtp_layers) && sscanf(name, "model.layers.%d.", &l) == 1 && l >= layers_held(c);
}

/* ---- the checkpoint against the config --------------------------------- */

/* How a matrix quantized to 4-bit elements is stored in the checkpoint:
 * the tensors beside module.weight (or in its place), by suffix */
typedef struct {
    DType dtype;
    const char *data;   /* the packed elements: I32 words of 8 (per 8) or bytes of 2 (per 2) */
    const char *scale;  /* one per group of columns: BF16 or F32 (INT4), F8_E4M3 (NVFP4) */
    const char *global; /* NVFP4's global scale, an F32 scalar: it divides the scales (compressed-tensors'
                           weight_global_scale) or multiplies them (ModelOpt's weight_scale_2); or NULL */
    int divide;
    const char *shape;  /* INT4's weight_shape (I64 [2]), or NULL */
    const char *input;  /* W4A4's input scale, an F32 scalar: compressed-tensors' input_global_scale (it
                           divides, as weight_global_scale) or ModelOpt's input_scale (it multiplies); or NULL */
    int group, per;
} QuantFormat;

/* The config's 4-bit format, or 0 when it has none */
static int quant_format(const Config *c, QuantFormat *f)
{
    const QuantConfig *qc = &c->quant;
    if (qc->int4_group)
        *f = (QuantFormat){DTYPE_I4, "weight_packed", "weight_scale", NULL, 0, "weight_shape", NULL, qc->int4_group, 8};
    else if (qc->nvfp4_group && qc->nvfp4_modelopt)
        *f = (QuantFormat){DTYPE_FP4, "weight", "weight_scale", "weight_scale_2", 0, NULL, "input_scale",
                           qc->nvfp4_group, 2};
    else if (qc->nvfp4_group)
        *f = (QuantFormat){DTYPE_FP4, "weight_packed", "weight_scale", "weight_global_scale", 1, NULL,
                           qc->nvfp4_w4a4 ? "input_global_scale" : NULL, qc->nvfp4_group, 2};
    else
        return 0;
    return 1;
}

/* An F32 tensor of one value (shape [] or [1]) into *v */
static int st_scalar(const StTensor *t, float *v)
{
    if (!t || t->dtype != ST_F32 || (t->ndim == 1 ? t->shape[0] != 1 : t->ndim != 0)) return -1;
    memcpy(v, t->data, sizeof *v);
    return 0;
}

/* The tensors of module, a matrix of rows x cols the config quantizes in
 * format f: each there, of its type and shape, and named in used */
static int check_quantized(const char *path, const StCheckpoint *ck, const QuantFormat *f, const char *module,
                           int rows, int cols, char (*used)[160], int *n_used)
{
    const char *parts[5] = {f->data, f->scale, f->global, f->shape, f->input};
    const StTensor *t[5] = {0};
    for (int k = 0; k < 5; k++) {
        if (!parts[k]) continue;
        snprintf(used[*n_used], sizeof *used, "%s.%s", module, parts[k]);
        if (!(t[k] = st_find(ck, used[(*n_used)++])))
            return dcp_fail("%s: tensor '%s.%s' not found: config.json's quantization_config quantizes '%s' (%s)",
                            path, module, parts[k], module, dtype_name(f->dtype));
    }
    int G = f->group;
    float v;
    if (cols % G || cols % f->per)
        return dcp_fail("%s: '%s' has %d columns, not a whole number of groups of %d", path, module, cols, G);
    if (t[0]->dtype != (f->per == 8 ? ST_I32 : ST_U8) || t[0]->ndim != 2 || t[0]->shape[0] != rows ||
        t[0]->shape[1] != cols / f->per)
        return dcp_fail("%s: tensor '%s.%s' is %s [%lld, %lld], config.json implies %s [%d, %d]", path, module,
                        f->data, st_dtype_name(t[0]->dtype), (long long)t[0]->shape[0],
                        t[0]->ndim > 1 ? (long long)t[0]->shape[1] : 0LL, f->per == 8 ? "I32" : "U8", rows,
                        cols / f->per);
    int fp4 = f->dtype == DTYPE_FP4;
    if ((fp4 ? t[1]->dtype != ST_F8_E4M3 : t[1]->dtype != ST_BF16 && t[1]->dtype != ST_F32) || t[1]->ndim != 2 ||
        t[1]->shape[0] != rows || t[1]->shape[1] != cols / G)
        return dcp_fail("%s: tensor '%s.%s' is %s [%lld, %lld], config.json implies %s [%d, %d]", path, module,
                        f->scale, st_dtype_name(t[1]->dtype), (long long)t[1]->shape[0],
                        t[1]->ndim > 1 ? (long long)t[1]->shape[1] : 0LL, fp4 ? "F8_E4M3" : "BF16 or F32", rows,
                        cols / G);
    if (f->global && (st_scalar(t[2], &v) || !(v > 0) || !isfinite(v)))
        return dcp_fail("%s: tensor '%s.%s' must be one positive F32 value", path, module, f->global);
    if (f->input && (st_scalar(t[4], &v) || !(v > 0) || !isfinite(v)))
        return dcp_fail("%s: tensor '%s.%s' must be one positive F32 value", path, module, f->input);
    return 0;
}

/* Layer l's FP8 KV cache scale (kv 'k' or 'v') in the checkpoint: at the
 * attention (compressed-tensors: self_attn.k_scale) or at its projection
 * (ModelOpt: self_attn.k_proj.k_scale); its name into name, or NULL */
static const StTensor *kv_scale_tensor(const StCheckpoint *ck, int l, char kv, char *name, size_t n)
{
    snprintf(name, n, "model.layers.%d.self_attn.%c_scale", l, kv);
    const StTensor *t = st_find(ck, name);
    if (t) return t;
    snprintf(name, n, "model.layers.%d.self_attn.%c_proj.%c_scale", l, kv, kv);
    return st_find(ck, name);
}

/* Every layer's FP8 KV scales into to (k then v per layer; an MLA layer's
 * v its k, whose latent cache has one scale), each one positive F32
 * value; their names into names (NULL: not wanted) */
static int read_kv_scales(const char *path, const StCheckpoint *ck, const Config *c, float *to, char (*names)[160],
                          int *n_names)
{
    for (int l = 0; l < layers_held(c); l++)
        for (int k = 0; k < 2; k++) {
            char name[160];
            const StTensor *t = kv_scale_tensor(ck, l, "kv"[k], name, sizeof name);
            float v = 1;
            /* an MTP layer's scales may be left out: 1 */
            if (!t && (k == 0 || !c->mla) && l < c->n_layers)
                return dcp_fail("%s: tensor 'model.layers.%d.self_attn.%c_scale' (or its %c_proj's) not found: "
                                "the quantization config says the KV cache is FP8 with the checkpoint's scales",
                                path, l, "kv"[k], "kv"[k]);
            if (t && (st_scalar(t, &v) || !(v > 0) || !isfinite(v)))
                return dcp_fail("%s: tensor '%s' must be one positive F32 value", path, name);
            if (t && names) strcpy(names[(*n_names)++], name);
            if (to) to[2 * l + k] = k && c->mla ? to[2 * l] : v;
        }
    return 0;
}

/* A Linear module's weight, which a quantization_config's "Linear"
 * targets reach: a matrix that is not the router and not an embedding (an
 * MTP layer's embed_tokens) */
static int linear_tensor(const TensorSpec *mt)
{
    return mt->rows && !strstr(mt->name, "mlp.gate.weight") && !strstr(mt->name, "embed_tokens");
}

/* Tensors a checkpoint may hold that no architecture reads. */
static int ignorable_tensor(const char *name)
{
    size_t n = strlen(name), k = strlen("rotary_emb.inv_freq");
    return n >= k && !strcmp(name + n - k, "rotary_emb.inv_freq");
}

/* The module a ".weight" tensor belongs to (its name less ".weight"), in buf */
static const char *spec_module(const TensorSpec *mt, char *buf, size_t n)
{
    size_t len = strlen(mt->name);
    len = len > 7 ? len - 7 : 0;
    if (len >= n) len = n - 1;
    memcpy(buf, mt->name, len);
    buf[len] = '\0';
    return buf;
}

/* The checkpoint at path as the config reads it: a wrapped language
 * model's tensors (Config.wrapped) under their own names, the vision
 * tower's and projector's left out */
static int open_checkpoint(StCheckpoint *ck, const char *path, const Config *c)
{
    static const char *const vision[] = {"vision_tower.", "mm_projector.", "multi_modal_projector.", NULL};
    if (st_checkpoint_open(ck, path)) return -1;
    if (c->wrapped) st_checkpoint_unwrap(ck, WRAPPED_PREFIX, vision);
    return 0;
}

int model_check_checkpoint(const char *path, const Config *c)
{
    if (c->format != FORMAT_HF) return 0;
    StCheckpoint ck;
    if (open_checkpoint(&ck, path, c)) return -1;
    /* every tensor the config implies, with its shape */
    int n_names = 0, rc = 0;
    int named = c->mla || c->moe.n_routed_experts; /* tensors by name: MLA layers, the dense family's experts */
    size_t per_layer = named ? 3 * (size_t)layer_max_tensors(c) + T_COUNT : T_COUNT; /* and quantization's */
    char (*names)[160] = xmalloc(sizeof *names * (per_layer * (layers_held(c) + 1) + T_COUNT));
    TensorSpec *mt = named ? xmalloc(sizeof(TensorSpec) * per_layer) : NULL;
    QuantRules *rules = NULL;
    QuantFormat qf = {0};
    int four_bit = c->mla && quant_format(c, &qf);
    if (four_bit || (c->mla && c->quant.fp8_block[0])) {
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (!(rules = quant_rules_read(cfg))) rc = -1;
    }
    for (int l = 0; named && l < layers_held(c) && !rc; l++) {
        int n = c->mla ? mla_tensors(c, NULL, l, NULL, mt) : MOE_LAYER(c, l) ? moe_tensors(c, NULL, l, NULL, mt) : 0;
        if (l >= c->n_layers) {
            n += mtp_tensors(c, NULL, l, NULL, mt + n);
            if (!st_find(&ck, mt[n - 1].name)) { /* its embed_tokens: the one tensor no decoder layer has */
                rc = dcp_fail("%s: config.json says num_nextn_predict_layers %d, but the checkpoint has no '%s': "
                              "its MTP layer was left out, so speculative decoding cannot use \"mtp\"",
                              path, c->mtp_layers, mt[n - 1].name);
                break;
            }
        }
        for (int i = 0; i < n && !rc; i++) {
            const StTensor *t = st_find(&ck, mt[i].name);
            int vector = mt[i].rows == 0;
            /* a 4-bit format: its tensors in place of module.weight
             * where the config's targets and ignore say (Linear: every
             * matrix but the router) */
            char module[128], packed[144];
            spec_module(&mt[i], module, sizeof module);
            snprintf(packed, sizeof packed, "%s.weight_packed", module);
            int linear = linear_tensor(&mt[i]);
            if (four_bit && linear && quant_rules_quantized(rules, module, 1)) {
                rc = check_quantized(path, &ck, &qf, module, mt[i].rows, mt[i].cols, names, &n_names);
                continue;
            }
            if (t && t->dtype == ST_U8) {
                rc = dcp_fail("%s: tensor '%s' is packed 4-bit, but config.json's quantization_config does not "
                              "quantize '%s' (its exclude_modules)",
                              path, mt[i].name, module);
                break;
            }
            if (!t && st_find(&ck, packed)) {
                rc = dcp_fail("%s: tensor '%s' is packed 4-bit, but config.json's quantization_config does not "
                              "quantize '%s' (its targets and ignore)",
                              path, packed, module);
                break;
            }
            strcpy(names[n_names++], mt[i].name);
            if (t && t->dtype == ST_F8_E4M3) { /* its block scales come with it */
                char sc[160];
                snprintf(sc, sizeof sc, "%s_scale_inv", mt[i].name);
                strcpy(names[n_names++], sc);
                if (!c->quant.fp8_block[0])
                    rc = dcp_fail("%s: tensor '%s' is FP8, but config.json has no fp8 quantization_config", path,
                                  mt[i].name);
                else if (rules && linear && !quant_rules_quantized(rules, module, 1))
                    rc = dcp_fail("%s: tensor '%s' is FP8, but config.json's quantization_config lists '%s' in "
                                  "modules_to_not_convert",
                                  path, mt[i].name, module);
                else if (!st_find(&ck, sc))
                    rc = dcp_fail("%s: FP8 tensor '%s' has no '%s'", path, mt[i].name, sc);
            }
            if (rc) break;
            if (!t) rc = dcp_fail("%s: tensor '%s' not found in the checkpoint", path, mt[i].name);
            else if (vector ? t->ndim != 1 || t->shape[0] != mt[i].cols
                            : t->ndim != 2 || t->shape[0] != mt[i].rows || t->shape[1] != mt[i].cols)
                rc = dcp_fail("%s: tensor '%s' has %d dimension(s) [%lld, ...], config.json implies [%d%s%d]", path,
                              mt[i].name, t->ndim, (long long)t->shape[0], vector ? mt[i].cols : mt[i].rows,
                              vector ? "" : ", ", vector ? 0 : mt[i].cols);
            else if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F8_E4M3)
                rc = dcp_fail("%s: tensor '%s' is %s, which config.json's quantization_config does not account for",
                              path, mt[i].name, st_dtype_name(t->dtype));
        }
    }
    /* (block-scaled FP8 leaves lm_head alone whatever its list says: its
     * rules speak of the layers only) */
    if (!rc && four_bit && quant_rules_quantized(rules, "lm_head", 1) && !c->tied_embeddings && c->format == FORMAT_HF)
        rc = dcp_fail("%s: quantization_config quantizes lm_head, which dcpinfer does not read quantized (add it to "
                      "ignore)",
                      path);
    quant_rules_free(rules);
    free(mt);
    if (!rc && c->quant.kv_fp8) rc = read_kv_scales(path, &ck, c, NULL, names, &n_names);
    for (int k = 0; k < T_COUNT && !rc; k++) {
        if (!tensor_present(c, (TensorKind)k)) continue;
        if (c->mla && k != T_EMBED && k != T_RMS_FINAL && k != T_LM_HEAD) continue;
        int nl = tensor_layers(c, (TensorKind)k), rows, cols;
        tensor_full_shape(c, (TensorKind)k, &rows, &cols);
        int vector = k == T_RMS_ATT || k == T_RMS_FFN || k == T_RMS_FINAL || k >= T_BQ;
        for (int l = 0; l < nl && !rc; l++) {
            char *name = names[n_names++];
            tensor_hf_name((TensorKind)k, l, name, sizeof *names);
            const StTensor *t = st_find(&ck, name);
            if (!t) rc = dcp_fail("%s: tensor '%s' not found in the checkpoint", path, name);
            else if (vector ? t->ndim != 1 || t->shape[0] != cols
                            : t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
                rc = vector ? dcp_fail("%s: tensor '%s' has %d dimension(s) [%lld%s], config.json implies [%d]", path,
                                       name, t->ndim, (long long)t->shape[0], t->ndim > 1 ? ", ..." : "", cols)
                            : dcp_fail("%s: tensor '%s' has shape [%lld, %lld], config.json implies [%d, %d]", path,
                                       name, (long long)t->shape[0], t->ndim > 1 ? (long long)t->shape[1] : 0LL,
                                       rows, cols);
        }
    }
    /* and nothing else: a tensor the config does not account for means
     * that config and weights disagree */
    for (int f = 0; f < ck.n_files && !rc; f++)
        for (int i = 0; i < ck.files[f].n && !rc; i++) {
            const char *name = ck.files[f].tensors[i].name;
            int used = ignorable_tensor(name) || mtp_tensor(c, name);
            for (int j = 0; j < n_names && !used; j++) used = !strcmp(names[j], name);
            if (!used)
                rc = dcp_fail("%s: tensor '%s' is in the checkpoint, but config.json (%s) has no use for it: config "
                              "and weights disagree",
                              path, name, arch_table[c->arch].name);
        }
    free(names);
    st_checkpoint_close(&ck);
    return rc;
}

/* ---- weight sources ---------------------------------------------------- */

/* A source copies a slice of one full tensor (HF row/column order for the
 * generated and HF formats, llama2.c order for .bin) into fp32. */
typedef struct {
    const Config *cfg;
    const char *path;
    /* llama2.c: mmapped file and the offset of each tensor kind */
    const unsigned char *map;
    size_t map_size;
    size_t offset[T_COUNT];
    /* HF */
    StCheckpoint ck;
    /* generated */
    ModelSpec spec;
    /* a bare config.json (model_size): no tensors, the stored types its
     * quantization_config implies (stored_dtype) */
    int bare;
    QuantRules *rules;
} Source;

/* The checkpoint tensor of a kind and layer, its shape checked against the
 * config's (a tied LM head is the embedding). */
static int hf_tensor(const Source *src, TensorKind k, int layer, const StTensor **out)
{
    const Config *c = src->cfg;
    int rows, cols;
    tensor_full_shape(c, k, &rows, &cols);
    if (k == T_LM_HEAD && c->tied_embeddings) k = T_EMBED;
    char name[128];
    tensor_hf_name(k, layer, name, sizeof name);
    const StTensor *t = st_find(&src->ck, name);
    if (!t) return dcp_fail("%s: tensor '%s' not found in the checkpoint", src->path, name);
    int64_t trows = t->ndim == 1 ? 1 : t->shape[0], tcols = t->ndim == 1 ? t->shape[0] : t->shape[1];
    if (t->ndim > 2 || trows != rows || tcols != cols)
        return dcp_fail("%s: tensor '%s' has shape [%lld, %lld], config.json implies [%d, %d]", src->path, name,
                        (long long)trows, (long long)tcols, rows, cols);
    *out = t;
    return 0;
}

static int source_read(Source *src, TensorKind k, int layer, int row0, int nrows, int col0, int ncols, float *dst)
{
    const Config *c = src->cfg;
    int rows, cols;
    tensor_full_shape(c, k, &rows, &cols);
    if (k == T_LM_HEAD && c->tied_embeddings) k = T_EMBED;
    switch (c->format) {
    case FORMAT_GENERATED: {
        float *full = xmalloc((size_t)rows * cols * sizeof(float));
        mkmodel_tensor(&src->spec, k, layer, full);
        for (int r = 0; r < nrows; r++)
            memcpy(dst + (size_t)r * ncols, full + (size_t)(row0 + r) * cols + col0, (size_t)ncols * 4);
        free(full);
        return 0;
    }
    case FORMAT_LLAMA2C: {
        const unsigned char *base = src->map + src->offset[k] + (size_t)layer * rows * cols * 4;
        for (int r = 0; r < nrows; r++)
            memcpy(dst + (size_t)r * ncols, base + ((size_t)(row0 + r) * cols + col0) * 4, (size_t)ncols * 4);
        return 0;
    }
    case FORMAT_HF: {
        const StTensor *t;
        return hf_tensor(src, k, layer, &t) || st_read_f32(t, row0, nrows, col0, ncols, dst) ? -1 : 0;
    }
    }
    return -1;
}

static int source_open(Source *src, const char *path, const Config *c)
{
    memset(src, 0, sizeof *src);
    src->cfg = c;
    src->path = path ? path : "(generated default model)";
    if (c->format == FORMAT_GENERATED) {
        mkmodel_default_spec(&src->spec);
        return 0;
    }
    if (c->format == FORMAT_HF) return open_checkpoint(&src->ck, path, c);
    if (check_regular_file(path, "model")) return -1;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return dcp_fail("%s: %s", path, strerror(errno));
    struct stat st;
    fstat(fd, &st);
    src->map_size = (size_t)st.st_size;
    void *m = mmap(NULL, src->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return dcp_fail("%s: mmap: %s", path, strerror(errno));
    src->map = m;
    /* llama2.c v0 order: embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2,
     * w3, rms_final, freq_cis (skipped), classifier */
    static const TensorKind order[] = {T_EMBED, T_RMS_ATT, T_WQ,   T_WK, T_WV,       T_WO,
                                       T_RMS_FFN, T_GATE, T_DOWN, T_UP, T_RMS_FINAL};
    size_t off = 7 * 4;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        int r, cl;
        tensor_full_shape(c, order[i], &r, &cl);
        src->offset[order[i]] = off;
        off += (size_t)r * cl * 4 * (tensor_is_per_layer(order[i]) ? c->n_layers : 1);
    }
    off += (size_t)c->max_seq_len * c->head_dim * 4; /* freq_cis_real + imag */
    src->offset[T_LM_HEAD] = off;
    return 0;
}

static void source_close(Source *src)
{
    if (src->map) munmap((void *)src->map, src->map_size);
    st_checkpoint_close(&src->ck);
    quant_rules_free(src->rules);
}

const char *const weight_part_names[WPART_N] = {"attention", "mlp", "experts", "embedding", "lm_head"};

/* What a sizing run's weights point at: nothing is written there. */
static char sizing_only;

static void count_bytes(Weights *w, size_t bytes)
{
    w->bytes += bytes;
    w->part_bytes[w->part] += bytes;
}

/* Weight buffers: large ones in huge pages (xmalloc_huge), so that
 * decode's weight streams do not miss the TLB every 4 KiB. A sizing run
 * counts them only. */
static void *owned_alloc(Weights *w, size_t bytes)
{
    count_bytes(w, bytes);
    if (w->sizing) return &sizing_only;
    w->owned = xrealloc(w->owned, sizeof(void *) * (size_t)(w->n_owned + 1));
    void *p = xmalloc_huge(bytes ? bytes : 1); /* an empty shard still has an address */
    w->owned[w->n_owned++] = p;
    return p;
}

/* Drops the pages of a llama2.c tensor kind from this process's resident
 * memory once they have been copied (they stay in the page cache). */
static void source_release(Source *src, TensorKind k)
{
    /* a tied LM head is the embedding's rows, which may be in use in place */
    if (!src->map || (k == T_LM_HEAD && src->cfg->tied_embeddings)) return;
    int rows, cols;
    tensor_full_shape(src->cfg, k, &rows, &cols);
    size_t nl = tensor_is_per_layer(k) ? (size_t)src->cfg->n_layers : 1, page = (size_t)sysconf(_SC_PAGESIZE);
    size_t a = src->offset[k], b = a + nl * rows * cols * 4;
    if (b > src->map_size) b = src->map_size; /* never past the mapping: those pages are someone else's */
    a = (a + page - 1) / page * page; /* pages wholly inside: its neighbours may be in use */
    b = b / page * page;
    if (b > a) madvise((char *)src->map + a, b - a, MADV_DONTNEED);
}

/* Loads rows [row0, row0+nrows) x cols [col0, col0+ncols) of a tensor kind for
 * every layer it has, into one (layer, nrows, ncols) buffer. A whole tensor
 * of a llama2.c file is already that buffer, in the mapping: no copy. */
static int load_kind_chunked(Source *src, Weights *w, float **dst, TensorKind k, int row0, int nrows, int col0,
                             int ncols, int chunks)
{
    int nl = tensor_layers(src->cfg, k), rows, cols;
    tensor_full_shape(src->cfg, k, &rows, &cols);
    if (src->cfg->format == FORMAT_LLAMA2C && row0 == 0 && nrows == rows && col0 == 0 && ncols == cols &&
        chunks == 1) {
        TensorKind at = k == T_LM_HEAD && src->cfg->tied_embeddings ? T_EMBED : k;
        *dst = (float *)(src->map + src->offset[at]); /* 4-byte aligned: 28-byte header, f32 data */
        if (at == k) count_bytes(w, (size_t)nl * rows * cols * sizeof(float)); /* a tied head is counted once */
        return 0;
    }
    size_t per = (size_t)nrows * ncols, cc = (size_t)(ncols / chunks);
    *dst = owned_alloc(w, per * nl * sizeof(float));
    if (w->sizing) return 0;
    for (int l = 0; l < nl; l++)
        for (int ch = 0; ch < chunks; ch++)
            if (source_read(src, k, l, row0, nrows, col0 + ch * (int)cc, (int)cc, *dst + per * l + nrows * cc * ch))
                return -1;
    source_release(src, k);
    return 0;
}

static int load_kind(Source *src, Weights *w, float **dst, TensorKind k, int row0, int nrows, int col0, int ncols)
{
    return load_kind_chunked(src, w, dst, k, row0, nrows, col0, ncols, 1);
}

/* A matrix the GEMMs read, as load_kind, in the model's GEMM type: bf16 is
 * copied as stored from a bf16 checkpoint, else rounded to nearest even.
 * chunks > 1 (row-parallel products): each layer's columns are stored as
 * that many (nrows, ncols / chunks) matrices one after another, the
 * canonical K chunks (Shard). */
static int load_matrix_chunked(Source *src, Model *m, WeightRef *dst, TensorKind k, int row0, int nrows, int col0,
                               int ncols, int chunks)
{
    if (m->gemm_dtype == DTYPE_F32) {
        float *p;
        if (load_kind_chunked(src, &m->w, &p, k, row0, nrows, col0, ncols, chunks)) return -1;
        *dst = weight_ref(p, DTYPE_F32, 0);
        return 0;
    }
    const Config *c = src->cfg;
    int nl = tensor_layers(c, k);
    int cc = ncols / chunks;
    size_t per = (size_t)nrows * cc; /* one chunk's matrix */
    uint16_t *out = owned_alloc(&m->w, per * chunks * nl * sizeof(uint16_t));
    if (m->w.sizing) {
        *dst = weight_ref(out, DTYPE_BF16, 0);
        return 0;
    }
    float *tmp = NULL;
    int rc = 0;
    for (int l = 0; l < nl && !rc; l++) {
        const StTensor *t = NULL;
        if (c->format == FORMAT_HF && (rc = hf_tensor(src, k, l, &t))) break;
        for (int ch = 0; ch < chunks && !rc; ch++) {
            uint16_t *to = out + per * ((size_t)l * chunks + ch);
            if (t && t->dtype == ST_BF16) {
                rc = st_read_bf16(t, row0, nrows, col0 + ch * cc, cc, to);
                continue;
            }
            if (!tmp) tmp = xmalloc(per * sizeof(float));
            rc = source_read(src, k, l, row0, nrows, col0 + ch * cc, cc, tmp);
            if (!rc) f32_to_bf16_n(to, tmp, per);
        }
    }
    free(tmp);
    source_release(src, k);
    int group = 0;
    for (size_t i = 0; i < (size_t)nl * chunks && !rc && m->bf16_group; i++)
        group = weight_group_rows(out + per * i, nrows, cc, sizeof(uint16_t), m->bf16_group);
    *dst = weight_ref(out, DTYPE_BF16, group);
    return rc;
}

static int load_matrix(Source *src, Model *m, WeightRef *dst, TensorKind k, int row0, int nrows, int col0, int ncols)
{
    return load_matrix_chunked(src, m, dst, k, row0, nrows, col0, ncols, 1);
}


/* The embedding as vLLM's vocabulary-parallel one holds it: this rank's
 * rows of the vocabulary (the LM head's), in the GEMM type; a token of
 * another rank's rows embeds as zeros here and the TP sum adds its row. */
static int load_embedding(Source *src, Model *m)
{
    m->w.part = WPART_EMBED;
    return load_matrix(src, m, &m->w.token_embedding, T_EMBED, m->shard.vocab0, m->shard.vocab, 0, m->cfg.dim);
}

/* The LM head, this rank's rows of the vocabulary; a tied one is the
 * embedding's same rows: one copy */
static int load_lm_head(Source *src, Model *m)
{
    m->w.part = WPART_LM_HEAD;
    if (m->cfg.tied_embeddings) {
        m->w.lm_head = m->w.token_embedding;
        return 0;
    }
    return load_matrix(src, m, &m->w.lm_head, T_LM_HEAD, m->shard.vocab0, m->shard.vocab, 0, m->cfg.dim);
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

/* This rank's slice of a 4-bit matrix (t: its packed elements) in its
 * stored form: elements into dst, each run's fp32 scale into scale_dst
 * (NVFP4: the FP8 scale and the global one applied); or, with code_dst,
 * NVFP4's scales as stored into code_dst and what each of the 256 codes
 * stands for, the global scale applied, into table */
static int read_nibbles(Source *src, const TensorSpec *mt, const StTensor *t, const QuantFormat *f, int64_t col0,
                        int64_t ncols, int qcols, uint8_t *dst, float *scale_dst, uint8_t *code_dst, float *table)
{
    char module[128], name[160];
    snprintf(name, sizeof name, "%s.%s", spec_module(mt, module, sizeof module), f->scale);
    const StTensor *scale = st_find(&src->ck, name), *shape = NULL;
    float global = 1;
    if (f->shape) {
        snprintf(name, sizeof name, "%s.%s", module, f->shape);
        shape = st_find(&src->ck, name);
    }
    if (f->global) {
        snprintf(name, sizeof name, "%s.%s", module, f->global);
        if (st_scalar(st_find(&src->ck, name), &global))
            return dcp_fail("%s: tensor '%s' must be one F32 value", src->path, name);
    }
    float mul = f->divide ? 1 : global, div = f->divide ? global : 0;
    for (int b = 0; table && b < 256; b++) table[b] = global_scaled(f8e4m3_to_f32((uint8_t)b), mul, div);
    float act = 0; /* the input global scale: compressed-tensors' as stored, one over ModelOpt's input_scale */
    if (table && f->input) {
        snprintf(name, sizeof name, "%s.%s", module, f->input);
        if (st_scalar(st_find(&src->ck, name), &act))
            return dcp_fail("%s: tensor '%s' must be one F32 value", src->path, name);
        if (!f->divide) act = 1.0f / act;
    }
    for (int b = 256; table && b < WEIGHT_TABLE; b++) table[b] = b == WEIGHT_TABLE_ACT ? act : 0;
    return st_read_nibbles(t, scale, shape, f->group, mul, div, mt->row0, mt->nrows, col0, ncols, qcols, dst,
                           scale_dst, code_dst);
}

/* whether a 4-bit matrix's values round to bf16: INT4 with bf16 scales,
 * NVFP4 as the config says */
static int nibbles_round_bf16(Source *src, const TensorSpec *mt, const QuantFormat *f)
{
    if (f->dtype == DTYPE_FP4) return src->cfg->quant.nvfp4_round_bf16;
    char name[160];
    char module[128];
    snprintf(name, sizeof name, "%s.%s", spec_module(mt, module, sizeof module), f->scale);
    const StTensor *scale = st_find(&src->ck, name);
    return scale && scale->dtype == ST_BF16;
}

/* This rank's slice of a 4-bit matrix read as fp32 (kv_b_proj, which the
 * attention folds in at load): its stored form, then each value */
static int read_nibbles_as_f32(Source *src, const TensorSpec *mt, const StTensor *t, float *to)
{
    QuantFormat f;
    quant_format(src->cfg, &f);
    int qcols = gcd(gcd(f.group, mt->ncols), mt->col0);
    size_t n = (size_t)mt->nrows * mt->ncols;
    uint8_t *q = xcalloc(n / 2 + 1, 1);
    float *s = xmalloc(sizeof(float) * (n / (size_t)qcols + 1));
    int rc = read_nibbles(src, mt, t, &f, mt->col0, mt->ncols, qcols, q, s, NULL, NULL);
    WeightRef w = {.data = q, .dtype = f.dtype, .scale = s, .qcols = qcols,
                   .qflags = nibbles_round_bf16(src, mt, &f) ? QF_ROUND_BF16 : 0};
    for (size_t i = 0; i < n && !rc; i++) to[i] = weight_value(w, i);
    free(q), free(s);
    return rc;
}

/* A slice of a matrix as bf16: copied from a BF16 tensor, else its values
 * rounded to nearest even */
static int read_bf16(const StTensor *t, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, uint16_t *dst)
{
    if (t->dtype == ST_BF16) return st_read_bf16(t, row0, nrows, col0, ncols, dst);
    size_t n = (size_t)(nrows * ncols);
    float *tmp = xmalloc(sizeof(float) * (n ? n : 1));
    int rc = st_read_f32(t, row0, nrows, col0, ncols, tmp);
    if (!rc) f32_to_bf16_n(dst, tmp, n);
    free(tmp);
    return rc;
}

/* One matrix of an MLA layer (an expert: its place in its kind's stack)
 * into this rank's storage, in the checkpoint's type: block-scaled FP8 as
 * stored with its scales (WeightRef), 4-bit formats (INT4, NVFP4) packed
 * as stored with theirs, anything else in the GEMM type (model_gemm_dtype:
 * a bf16 checkpoint's matrices stay bf16, in the backend's row groups). A
 * K-chunked matrix (row-parallel) is stored chunk by chunk
 * (load_matrix_chunked). */
static int load_spec_matrix(Source *src, Model *m, const TensorSpec *mt, const StTensor *t)
{
    const Config *c = &m->cfg;
    WeightRef *w = mt->mat;
    QuantFormat f = {0};
    int fp8 = t->dtype == ST_F8_E4M3, nib = (t->dtype == ST_I32 || t->dtype == ST_U8) && quant_format(c, &f);
    int cc = mt->ncols / mt->chunks;
    /* the runs that share a scale: the block's (group's) columns, or fewer
     * where this rank's columns or their K chunks start inside one (each
     * run then repeats its scale) */
    int qcols = fp8 || nib ? gcd(gcd(fp8 ? c->quant.fp8_block[1] : f.group, cc), mt->col0) : 0;
    int qflags = nib && nibbles_round_bf16(src, mt, &f) ? QF_ROUND_BF16 : 0;
    DType want = fp8 ? DTYPE_F8_E4M3 : nib ? f.dtype : m->gemm_dtype;
    /* NVFP4's scales stay FP8 codes, with a table of their values per
     * checkpoint matrix (an expert's, in a stack) */
    int codes = nib && f.dtype == DTYPE_FP4;
    size_t per = (size_t)mt->nrows * mt->ncols, runs = per / (size_t)(qcols ? qcols : 1);
    if (!w->data) { /* the first of its stack: the stack's storage */
        *w = (WeightRef){.data = owned_alloc(&m->w, dtype_data_bytes(want, mt->mat_n)), .dtype = want,
                         .qcols = qcols, .qflags = qflags};
        if (codes) {
            w->scale8 = owned_alloc(&m->w, mt->mat_n / (size_t)qcols);
            w->tables = owned_alloc(&m->w, mt->mat_n / per * WEIGHT_TABLE * sizeof(float));
            w->table_runs = runs;
        } else if (fp8 || nib) {
            w->scale = owned_alloc(&m->w, mt->mat_n / (size_t)qcols * sizeof(float));
        }
    } else if (w->dtype != want || w->qcols != qcols || w->qflags != qflags || (codes && w->table_runs != runs)) {
        return dcp_fail("%s: tensor '%s' is %s, unlike the other experts of its layer: their matrices must share one "
                        "format",
                        src->path, mt->name, st_dtype_name(t->dtype));
    }
    if (codes && f.input && gcd(gcd(f.group, mt->ncols), mt->col0) != f.group && !m->w.act_split[0])
        snprintf(m->w.act_split, sizeof m->w.act_split, "%s", mt->name);
    if (m->w.sizing) return 0;
    char sc[160];
    snprintf(sc, sizeof sc, "%s_scale_inv", mt->name);
    size_t chunk = (size_t)mt->nrows * cc;
    for (int ch = 0; ch < mt->chunks; ch++) {
        WeightRef to = weight_at(*w, mt->mat_at + chunk * ch);
        int col0 = mt->col0 + ch * cc, rc;
        if (fp8)
            rc = st_read_f8_scaled(t, st_find(&src->ck, sc), c->quant.fp8_block[0], c->quant.fp8_block[1], mt->row0,
                                   mt->nrows, col0, cc, qcols, (uint8_t *)to.data, (float *)to.scale);
        else if (codes)
            rc = read_nibbles(src, mt, t, &f, col0, cc, qcols, (uint8_t *)to.data, NULL, (uint8_t *)to.scale8,
                              ch ? NULL : (float *)w->tables + mt->mat_at / per * WEIGHT_TABLE);
        else if (nib)
            rc = read_nibbles(src, mt, t, &f, col0, cc, qcols, (uint8_t *)to.data, (float *)to.scale, NULL, NULL);
        else if (want == DTYPE_BF16)
            rc = read_bf16(t, mt->row0, mt->nrows, col0, cc, (uint16_t *)to.data);
        else
            rc = st_read_f32(t, mt->row0, mt->nrows, col0, cc, (float *)to.data);
        if (rc) return -1;
        /* bf16 in the backend's row groups, each K chunk (each expert's) on its own */
        int g = want == DTYPE_BF16 && m->bf16_group
                    ? weight_group_rows((void *)to.data, mt->nrows, cc, sizeof(uint16_t), m->bf16_group)
                    : 0;
        if (!mt->mat_at && !ch) w->group = g; /* the stack's first matrix sets it */
        else if (w->group != g)
            return dcp_fail("%s: tensor '%s' cannot be laid out as the other matrices of its stack", src->path,
                            mt->name);
    }
    return 0;
}

/* The part of the weights an MLA tensor belongs to (WeightPart) */
static WeightPart spec_part(const char *name)
{
    if (strstr(name, ".self_attn.") || strstr(name, ".input_layernorm.")) return WPART_ATTENTION;
    if (strstr(name, ".embed_tokens.")) return WPART_EMBED;
    if (strstr(name, ".shared_head.head.")) return WPART_LM_HEAD;
    if (strstr(name, ".mlp.experts.") || strstr(name, ".mlp.gate.")) return WPART_EXPERTS;
    return WPART_MLP;
}

/* How a bare config.json's checkpoint stores an MLA tensor (model_size):
 * 4-bit where its quantization_config's rules quantize the module, FP8
 * for every matrix but the router under block-scaled FP8, else its
 * torch_dtype. The matrices are those model_check_checkpoint quantizes,
 * but for an MTP layer's eh_proj and shared_head, which DeepSeek's
 * checkpoints keep in their torch_dtype as the LM head. */
static StDtype stored_dtype(const Source *src, const TensorSpec *mt)
{
    const Config *c = src->cfg;
    int linear = linear_tensor(mt) && !strstr(mt->name, ".eh_proj.") && !strstr(mt->name, ".shared_head.");
    char module[128];
    int quantized = linear && (!src->rules || quant_rules_quantized(src->rules, spec_module(mt, module, sizeof module), 1));
    if (quantized && c->quant.fp8_block[0]) return ST_F8_E4M3; /* less modules_to_not_convert */
    if (quantized && src->rules) return c->quant.int4_group ? ST_I32 : ST_U8;
    return c->stored_bf16 ? ST_BF16 : ST_F32;
}

/* The named tensors mt[0..n) of a layer (mla_tensors, moe_tensors) into
 * this rank's storage: matrices in their stored formats (load_spec_matrix),
 * vectors and kv_b in fp32 (a bf16 model's kv_b in a scratch copy, folded
 * into bf16: mla_fold_kv_b). */
static int load_named(Source *src, Model *m, const TensorSpec *mt, int n)
{
    const Config *c = &m->cfg;
    Weights *w = &m->w;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        w->part = spec_part(mt[i].name);
        StTensor stand_in = {.dtype = src->bare ? stored_dtype(src, &mt[i]) : ST_F32};
        const StTensor *t = src->bare ? &stand_in : st_find(&src->ck, mt[i].name);
        if (!t) { /* a packed 4-bit tensor in its place */
            char module[128], packed[160];
            snprintf(packed, sizeof packed, "%s.weight_packed", spec_module(&mt[i], module, sizeof module));
            if (!(t = st_find(&src->ck, packed)))
                return dcp_fail("%s: tensor '%s' not found in the checkpoint", src->path, mt[i].name);
        }
        if (mt[i].mat) {
            rc = load_spec_matrix(src, m, &mt[i], t);
            continue;
        }
        size_t elems = (size_t)mt[i].nrows * mt[i].ncols;
        float *to;
        if (mt[i].bf16 && m->gemm_dtype == DTYPE_BF16 && (t->dtype == ST_BF16 || t->dtype == ST_F32)) {
            /* kv_b of a bf16 model: held in bf16 once folded, read here
             * into a scratch copy (mla_fold_kv_b) */
            *mt[i].bf16 = owned_alloc(w, elems * sizeof(uint16_t));
            to = *mt[i].dst = w->sizing ? NULL : xmalloc(sizeof(float) * (elems + 1));
        } else {
            to = *mt[i].dst = owned_alloc(w, (elems + 1) * sizeof(float));
        }
        if (w->sizing) continue;
        char sc[160];
        snprintf(sc, sizeof sc, "%s_scale_inv", mt[i].name);
        if (t->dtype == ST_F8_E4M3) /* kv_b: dequantized here, this rank's slice only */
            rc = st_read_f32_scaled(t, st_find(&src->ck, sc), c->quant.fp8_block[0], c->quant.fp8_block[1], mt[i].row0,
                                    mt[i].nrows, mt[i].col0, mt[i].ncols, to);
        else if (t->dtype == ST_I32 || t->dtype == ST_U8) { /* a 4-bit kv_b: the same, through its stored form */
            rc = read_nibbles_as_f32(src, &mt[i], t, to);
            /* folded into the attention at load, it reads no activation
             * row of its own to quantize */
            if (c->quant.nvfp4_w4a4 && !w->act_split[0])
                snprintf(w->act_split, sizeof w->act_split, "%s", mt[i].name);
        }
        else rc = st_read_f32(t, mt[i].row0, mt[i].nrows, mt[i].col0, mt[i].ncols, to);
    }
    return rc;
}

/* Every layer of an MLA model, or the MoE blocks of a Qwen3-MoE model:
 * this rank's shard of them. */
static int load_layers(Source *src, Model *m)
{
    const Config *c = &m->cfg;
    Weights *w = &m->w;
    if (c->mla) w->mla = xcalloc((size_t)layers_held(c), sizeof(MlaLayer));
    else w->moe = xcalloc((size_t)c->n_layers, sizeof(MoeLayer));
    TensorSpec *mt = xmalloc(sizeof(TensorSpec) * (size_t)layer_max_tensors(c));
    int rc = 0;
    for (int l = 0; l < layers_held(c) && !rc; l++) /* the dense family's layers without experts: none named */
        rc = load_named(src, m, mt,
                        c->mla            ? mla_tensors(c, &m->shard, l, &w->mla[l], mt)
                        : MOE_LAYER(c, l) ? moe_tensors(c, &m->shard, l, &w->moe[l], mt)
                                          : 0);
    /* an MTP layer's own tensors (its embedding and head count as the
     * main ones do) */
    for (int l = c->n_layers; l < layers_held(c) && !rc; l++) rc = load_named(src, m, mt, mtp_tensors(c, &m->shard, l, &w->mtp, mt));
    for (int l = 0; c->mla && l < layers_held(c) && !rc; l++) mla_fold_kv_b(m, &w->mla[l]);
    free(mt);
    if (!rc && c->quant.kv_fp8) {
        w->part = WPART_ATTENTION;
        w->kv_scale = owned_alloc(w, sizeof(float) * 2 * (size_t)layers_held(c));
        if (!w->sizing && !src->bare) rc = read_kv_scales(src->path, &src->ck, c, w->kv_scale, NULL, NULL);
        if (w->sizing) w->kv_scale = NULL;
    }
    return rc;
}

/* "fp8-e4m3 128x128 blocks", "int4-w4a16 g32 (bf16 scales)" or the type's name */
static void format_name(const Config *c, WeightRef w, char *buf, size_t n)
{
    if (w.dtype == DTYPE_F8_E4M3)
        snprintf(buf, n, "%s %dx%d blocks", dtype_name(w.dtype), c->quant.fp8_block[0], c->quant.fp8_block[1]);
    else if (w.dtype == DTYPE_I4)
        snprintf(buf, n, "int4-w4a16 g%d%s", c->quant.int4_group, w.qflags & QF_ROUND_BF16 ? " (bf16 scales)" : "");
    else if (w.dtype == DTYPE_FP4)
        snprintf(buf, n, "nvfp4 g%d (%s%s)", c->quant.nvfp4_group,
                 c->quant.nvfp4_modelopt ? "modelopt" : "compressed-tensors", c->quant.nvfp4_w4a4 ? ", W4A4" : "");
    else snprintf(buf, n, "%s", dtype_name(w.dtype));
}

void model_weights_summary(const Model *m, char *buf, size_t n)
{
    const Config *c = &m->cfg;
    const Weights *w = &m->w;
    char a[64] = "", e[64] = "", d[64] = "", h[64];
    for (int l = 0; w->mla && l < c->n_layers; l++) { /* the first layer of each kind says */
        const MlaLayer *ml = &w->mla[l];
        if (!*a) format_name(c, ml->o, a, sizeof a);
        if (!*e && ml->moe.e_gate.data) format_name(c, ml->moe.e_gate, e, sizeof e);
        if (!*d && ml->gate.data) format_name(c, ml->gate, d, sizeof d);
    }
    if (!w->mla) format_name(c, w->wq, a, sizeof a);
    if (!w->mla && w->w_gate.data) format_name(c, w->w_gate, d, sizeof d);
    if (w->moe) format_name(c, w->moe[0].e_gate, e, sizeof e);
    format_name(c, w->lm_head, h, sizeof h);
    double mib = w->bytes / 1048576.0;
    snprintf(buf, n, "%d layers%s; attention %s%s%s%s%s, LM head %s; %.*f %s on this rank%s", c->n_layers,
             c->mtp_loaded ? " and an MTP layer" : "", a,
             *e ? ", experts " : "", e, *d ? ", dense feed-forward " : "", d, h, mib < 1024 ? 2 : 3,
             mib < 1024 ? mib : mib / 1024, mib < 1024 ? "MiB" : "GiB",
             c->wrapped ? "; the language model of a multimodal checkpoint, its vision tower not loaded" : "");
}

int model_content_hash(const char *path, uint64_t *h)
{
    *h = FNV_START;
    if (!path) { /* its values are this version's: the run identity names the version */
        static const char name[] = "generated default model";
        *h = fnv1a(*h, name, sizeof name);
        return 0;
    }
    if (!path_is_dir(path)) return hash_file_sampled(path, 1 << 16, h); /* llama2.c: header and weights */
    static const char *const configs[] = {"config.json", "generation_config.json", "model.safetensors.index.json"};
    char file[4096];
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++) {
        snprintf(file, sizeof file, "%s/%s", path, configs[i]);
        if (path_exists(file) && hash_file_sampled(file, (size_t)1 << 30, h)) return -1;
    }
    StCheckpoint ck;
    if (st_checkpoint_open(&ck, path)) return -1;
    int rc = 0;
    for (int i = 0; i < ck.n_files && !rc; i++) { /* each file's header whole, its data sampled */
        const unsigned char *m = ck.files[i].map;
        uint64_t header = 0;
        for (int b = 0; b < 8 && ck.files[i].size >= 8; b++) header |= (uint64_t)m[b] << (8 * b);
        rc = hash_file_sampled(ck.files[i].path, (size_t)(8 + header), h);
    }
    st_checkpoint_close(&ck);
    return rc;
}

int model_gemm_dtype(const char *path, const Config *c, const char *dtype, DType *out)
{
    if (strcmp(dtype, "auto") && strcmp(dtype, "float32") && strcmp(dtype, "bfloat16"))
        return dcp_fail("--dtype %s: choose auto, float32 or bfloat16", dtype);
    *out = DTYPE_F32;
    if (!strcmp(dtype, "bfloat16")) *out = DTYPE_BF16;
    if (strcmp(dtype, "auto") || c->format != FORMAT_HF) return 0;
    /* "auto": as the checkpoint stores its first layer's q projection (an
     * MLA model's latent KV projection, which every variant has; where that
     * is quantized, as the LM head, or the embedding it is tied to) */
    StCheckpoint ck;
    if (open_checkpoint(&ck, path, c)) return -1;
    char name[128];
    if (c->mla) snprintf(name, sizeof name, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
    else tensor_hf_name(T_WQ, 0, name, sizeof name);
    const StTensor *t = st_find(&ck, name);
    if (c->mla && (!t || (t->dtype != ST_BF16 && t->dtype != ST_F32 && t->dtype != ST_F16)))
        t = st_find(&ck, c->tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    if (t && t->dtype == ST_BF16) *out = DTYPE_BF16;
    st_checkpoint_close(&ck);
    return 0;
}

int model_load(Model *m, const char *path, int tp, int tp_rank)
{
    return model_load_as(m, path, tp, tp_rank, "float32", 0);
}

/* A path model_size takes as a bare config.json */
static int bare_config(const char *path)
{
    size_t n = path ? strlen(path) : 0;
    return n >= 5 && !strcmp(path + n - 5, ".json") && !path_is_dir(path);
}

int model_read_any_config(const char *path, Config *c)
{
    if (!bare_config(path)) return model_read_config(path, c);
    size_t len;
    char *text;
    if (read_file(path, &text, &len)) return -1;
    int rc = config_from_json(path, text, len, c);
    free(text);
    return rc;
}

/* model_load_as, or with sizing model_size: the same calls, in the same
 * order, counting the same bytes (Weights.sizing) */
static int load(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype,
                int bf16_group, int sizing, int mtp)
{
    memset(m, 0, sizeof *m);
    m->bf16_group = bf16_group;
    m->w.sizing = sizing;
    int bare = sizing && bare_config(path);
    if (bare ? model_read_any_config(path, &m->cfg) : model_read_config(path, &m->cfg)) return -1;
    if (mtp && !(m->cfg.mla && m->cfg.mtp_layers > 0))
        return dcp_fail("%s: speculative decoding with \"mtp\" needs a DeepSeek model with multi-token-prediction "
                        "layers (num_nextn_predict_layers > 0); this one has %s",
                        path ? path : "(generated default model)", m->cfg.mla ? "none" : "a different architecture");
    m->cfg.mtp_loaded = mtp ? 1 : 0;
    if (bare) {
        /* "auto": as the config says the checkpoint stores its tensors */
        if (model_gemm_dtype(NULL, &m->cfg, strcmp(dtype, "auto") ? dtype : m->cfg.stored_bf16 ? "bfloat16" : "float32",
                             &m->gemm_dtype))
            return -1;
    } else if (model_check_checkpoint(path, &m->cfg) || model_gemm_dtype(path, &m->cfg, dtype, &m->gemm_dtype)) {
        return -1;
    }
    m->path = xstrdup(path ? path : "(generated default model)");
    const Config *c = &m->cfg;
    shard_init(&m->shard, c, tp, tp_rank);
    shard_set_ep(&m->shard, c, ep, ep_rank);
    const Shard *s = &m->shard;
    Source src;
    QuantFormat qf;
    if (bare) {
        memset(&src, 0, sizeof src);
        src.cfg = c;
        src.path = path;
        src.bare = 1;
        if (c->mla && (quant_format(c, &qf) || c->quant.fp8_block[0]) && !(src.rules = quant_rules_read(path))) {
            model_free(m);
            return -1;
        }
    } else if (source_open(&src, path, c)) {
        model_free(m);
        return -1;
    }
    int D = c->head_dim, dim = c->dim;
    Weights *w = &m->w;
    if (c->mla) {
        int rc = load_embedding(&src, m);
        w->part = WPART_LM_HEAD;
        rc = rc || load_kind(&src, w, &w->rms_final, T_RMS_FINAL, 0, 1, 0, dim) || load_lm_head(&src, m) ||
             load_layers(&src, m);
        source_close(&src);
        if (rc) model_free(m);
        return rc ? -1 : 0;
    }
    int rc = load_embedding(&src, m);
    w->part = WPART_ATTENTION;
    rc = rc || load_kind(&src, w, &w->rms_att, T_RMS_ATT, 0, 1, 0, dim) ||
         load_matrix(&src, m, &w->wq, T_WQ, s->q_head0 * D, s->q_heads * D, 0, dim) ||
         load_matrix(&src, m, &w->wk, T_WK, s->kv_head0 * D, s->kv_heads * D, 0, dim) ||
         load_matrix(&src, m, &w->wv, T_WV, s->kv_head0 * D, s->kv_heads * D, 0, dim) ||
         load_matrix_chunked(&src, m, &w->wo, T_WO, 0, dim, s->q_head0 * D, s->q_heads * D, s->chunks);
    w->part = WPART_MLP;
    rc = rc || load_kind(&src, w, &w->rms_ffn, T_RMS_FFN, 0, 1, 0, dim);
    /* the first layers' dense feed-forward blocks (all of them, but for
     * Qwen3-MoE and GLM-4.5), then the experts of the rest */
    if (tensor_layers(c, T_GATE))
        rc = rc || load_matrix(&src, m, &w->w_gate, T_GATE, s->hidden0, s->hidden, 0, dim) ||
             load_matrix(&src, m, &w->w_up, T_UP, s->hidden0, s->hidden, 0, dim) ||
             load_matrix_chunked(&src, m, &w->w_down, T_DOWN, 0, dim, s->hidden0, s->hidden, s->chunks);
    if (c->moe.n_routed_experts) rc = rc || load_layers(&src, m);
    w->part = WPART_LM_HEAD;
    rc = rc || load_kind(&src, w, &w->rms_final, T_RMS_FINAL, 0, 1, 0, dim) || load_lm_head(&src, m);
    /* biases follow their matrices' split: column-parallel ones are
     * sharded, row-parallel ones (o, down) are whole and added once after
     * the TP sum; q/k norms act within a head and are whole */
    w->part = WPART_ATTENTION;
    if (!rc && c->qkv_bias)
        rc = load_kind(&src, w, &w->bq, T_BQ, 0, 1, s->q_head0 * D, s->q_heads * D) ||
             load_kind(&src, w, &w->bk, T_BK, 0, 1, s->kv_head0 * D, s->kv_heads * D) ||
             load_kind(&src, w, &w->bv, T_BV, 0, 1, s->kv_head0 * D, s->kv_heads * D);
    if (!rc && c->o_bias) rc = load_kind(&src, w, &w->bo, T_BO, 0, 1, 0, dim);
    if (!rc && c->qk_norm)
        rc = load_kind(&src, w, &w->q_norm, T_Q_NORM, 0, 1, 0, D) || load_kind(&src, w, &w->k_norm, T_K_NORM, 0, 1, 0, D);
    w->part = WPART_MLP;
    if (!rc && c->mlp_bias)
        rc = load_kind(&src, w, &w->b_gate, T_B_GATE, 0, 1, s->hidden0, s->hidden) ||
             load_kind(&src, w, &w->b_up, T_B_UP, 0, 1, s->hidden0, s->hidden) ||
             load_kind(&src, w, &w->b_down, T_B_DOWN, 0, 1, 0, dim);
    /* the mapping stays while weights point into it */
    w->map = (void *)src.map;
    w->map_size = src.map_size;
    src.map = NULL;
    source_close(&src);
    if (rc) {
        model_free(m);
        return -1;
    }
    return 0;
}

int model_load_as(Model *m, const char *path, int tp, int tp_rank, const char *dtype, int bf16_group)
{
    return load(m, path, tp, tp_rank, 0, 0, dtype, bf16_group, 0, 0);
}

int model_load_ep(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype,
                  int bf16_group)
{
    return load(m, path, tp, tp_rank, ep, ep_rank, dtype, bf16_group, 0, 0);
}

int model_load_mtp(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype,
                   int bf16_group, int mtp)
{
    return load(m, path, tp, tp_rank, ep, ep_rank, dtype, bf16_group, 0, mtp);
}

int model_size(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype)
{
    return load(m, path, tp, tp_rank, ep, ep_rank, dtype, 0, 1, 0);
}

int model_size_mtp(Model *m, const char *path, int tp, int tp_rank, int ep, int ep_rank, const char *dtype, int mtp)
{
    return load(m, path, tp, tp_rank, ep, ep_rank, dtype, 0, 1, mtp);
}

void model_free(Model *m)
{
    /* a bf16 kv_b's scratch copy, left by a load that failed before the fold */
    for (int l = 0; m->w.mla && l < layers_held(&m->cfg); l++)
        if (m->w.mla[l].kv_b16) free(m->w.mla[l].kv_b);
    free(m->w.mla);
    free(m->w.moe);
    if (m->w.map) munmap(m->w.map, m->w.map_size);
    for (int i = 0; i < m->w.n_owned; i++) free(m->w.owned[i]);
    free(m->w.owned);
    free(m->path);
    memset(m, 0, sizeof *m);
}
