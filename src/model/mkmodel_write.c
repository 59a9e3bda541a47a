#include "mkmodel_write.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "arch.h"
#include "model.h"
#include "quant.h"
#include "util.h"

static int write_all(FILE *f, const void *p, size_t n, const char *path)
{
    if (fwrite(p, 1, n, f) != n) return dcp_fail("%s: write error: %s", path, strerror(errno));
    return 0;
}

/* The rope block in the spelling asked for. */
static void write_rope(FILE *f, const ModelSpec *s)
{
    static const char *types[] = {"default", "linear", "llama3", "yarn"};
    const RopeScaling *r = &s->rope;
    if (r->type == ROPE_DEFAULT && !s->rope_parameters) {
        fprintf(f, "  \"rope_theta\": %.1f,\n  \"rope_scaling\": null,\n", (double)s->rope_theta);
        return;
    }
    if (!s->rope_parameters) fprintf(f, "  \"rope_theta\": %.1f,\n", (double)s->rope_theta);
    fprintf(f, "  \"%s\": {\"%s\": \"%s\"", s->rope_parameters ? "rope_parameters" : "rope_scaling",
            s->rope_parameters ? "rope_type" : "type", types[r->type]);
    if (s->rope_parameters) fprintf(f, ", \"rope_theta\": %.1f", (double)s->rope_theta);
    if (r->type != ROPE_DEFAULT) fprintf(f, ", \"factor\": %.9g", (double)r->factor);
    if (r->type == ROPE_LLAMA3)
        fprintf(f, ", \"low_freq_factor\": %.9g, \"high_freq_factor\": %.9g", (double)r->low_freq_factor,
                (double)r->high_freq_factor);
    if (r->type == ROPE_LLAMA3 || r->type == ROPE_YARN)
        fprintf(f, ", \"original_max_position_embeddings\": %d", r->original_max_position_embeddings);
    if (r->type == ROPE_YARN)
        fprintf(f, ", \"beta_fast\": %.9g, \"beta_slow\": %.9g", (double)(r->beta_fast ? r->beta_fast : 32),
                (double)(r->beta_slow ? r->beta_slow : 1));
    fprintf(f, "},\n");
}

/* DIR/config.json, open for writing (its path in path); NULL with the error */
static FILE *open_config(const char *dir, char *path, size_t n)
{
    snprintf(path, n, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) dcp_fail("%s: %s", path, strerror(errno));
    return f;
}

/* The fields every config.json ends with, and the close. */
static int finish_config(FILE *f, const char *path, const ModelSpec *s, const char *eos, const char *eps, int bf16)
{
    fprintf(f,
            "  \"rms_norm_eps\": %s,\n  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n"
            "  \"bos_token_id\": null,\n  \"eos_token_id\": %s,\n"
            "  \"torch_dtype\": \"%s\",\n  \"dcpinfer_seed\": %llu\n}%s\n",
            eps, s->tied ? "true" : "false", eos, bf16 ? "bfloat16" : "float32", (unsigned long long)s->seed,
            s->kimi_k25 ? "}" : "");
    if (fclose(f)) return dcp_fail("%s: write error", path);
    return 0;
}

static int write_config_json(const ModelSpec *s, const char *dir, int bf16)
{
    char path[4096];
    FILE *f = open_config(dir, path, sizeof path);
    if (!f) return -1;
    const Arch *a = &arch_table[s->arch];
    Config c;
    mkmodel_config(s, &c);
    char eos[32];
    if (s->eos >= 0) snprintf(eos, sizeof eos, "%d", s->eos);
    else snprintf(eos, sizeof eos, "null");
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
            "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
            "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
            "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n",
            a->name, a->model_type, s->dim, s->hidden, s->layers, s->heads, s->kv_heads, c.head_dim, s->vocab,
            s->max_len);
    write_rope(f, s);
    if (a->attention_bias) fprintf(f, "  \"attention_bias\": %s,\n", s->attention_bias ? "true" : "false");
    if (a->mlp_bias) fprintf(f, "  \"mlp_bias\": %s,\n", s->mlp_bias ? "true" : "false");
    if (a->moe == 1)
        fprintf(f,
                "  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n"
                "  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [],\n",
                s->moe.n_routed_experts, s->moe.experts_per_token, s->moe.moe_hidden,
                s->moe.norm_topk_prob ? "true" : "false");
    if (a->moe == 2) { /* GLM-4.5's fields, as its config.json spells them */
        const MoeConfig *moe = &s->moe;
        fprintf(f,
                "  \"n_routed_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n"
                "  \"n_shared_experts\": %d,\n  \"first_k_dense_replace\": %d,\n  \"n_group\": %d,\n"
                "  \"topk_group\": %d,\n  \"norm_topk_prob\": %s,\n  \"routed_scaling_factor\": %.9g,\n"
                "  \"use_qk_norm\": %s,\n  \"partial_rotary_factor\": %.9g,\n  \"num_nextn_predict_layers\": 0,\n",
                moe->n_routed_experts, moe->experts_per_token, moe->moe_hidden, moe->n_shared_experts,
                moe->first_k_dense_replace, moe->n_group, moe->topk_group, moe->norm_topk_prob ? "true" : "false",
                (double)moe->routed_scaling_factor, s->qk_norm ? "true" : "false",
                (double)(s->partial_rotary ? s->partial_rotary : 0.5f));
    }
    if (a->window == WINDOW_ALL) {
        if (s->sliding_window) fprintf(f, "  \"sliding_window\": %d,\n", s->sliding_window);
        else fprintf(f, "  \"sliding_window\": null,\n");
    } else if (a->window == WINDOW_UPPER) {
        fprintf(f, "  \"use_sliding_window\": %s,\n  \"sliding_window\": %d,\n  \"max_window_layers\": %d,\n",
                s->sliding_window ? "true" : "false", s->sliding_window ? s->sliding_window : 4096,
                s->sliding_window ? s->max_window_layers : s->layers);
    }
    return finish_config(f, path, s, eos, "1e-05", bf16);
}

/* One safetensors file holding tensors [first, last) of the flat list. */
typedef struct { TensorKind k; int layer; } TensorRef;

static int write_safetensors(const ModelSpec *s, const char *path, const TensorRef *refs, int n, int bf16)
{
    Config c;
    mkmodel_config(s, &c);
    size_t esize = bf16 ? 2 : 4;
    /* header JSON with running offsets */
    size_t cap = 256 + (size_t)n * 272, len = 0, off = 0;
    char *hdr = xmalloc(cap);
    len += snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        int rows, cols;
        tensor_full_shape(&c, refs[i].k, &rows, &cols);
        char name[128];
        tensor_hf_name(refs[i].k, refs[i].layer, name, sizeof name);
        size_t bytes = (size_t)rows * cols * esize;
        int one_d = refs[i].k == T_RMS_ATT || refs[i].k == T_RMS_FFN || refs[i].k == T_RMS_FINAL || refs[i].k >= T_BQ;
        if (one_d)
            len += snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                            name, bf16 ? "BF16" : "F32", cols, off, off + bytes);
        else
            len += snprintf(hdr + len, cap - len,
                            ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}", name,
                            bf16 ? "BF16" : "F32", rows, cols, off, off + bytes);
        off += bytes;
    }
    len += snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' '; /* keep the data section 8-byte aligned */
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return dcp_fail("%s: %s", path, strerror(errno));
    }
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)len >> (8 * i));
    int rc = write_all(f, lenb, 8, path) || write_all(f, hdr, len, path);
    free(hdr);
    for (int i = 0; i < n && !rc; i++) {
        int rows, cols;
        tensor_full_shape(&c, refs[i].k, &rows, &cols);
        size_t cnt = (size_t)rows * cols;
        float *buf = xmalloc(cnt * 4);
        mkmodel_tensor(s, refs[i].k, refs[i].layer, buf);
        if (bf16) {
            uint16_t *h = xmalloc(cnt * 2);
            for (size_t j = 0; j < cnt; j++) h[j] = f32_to_bf16(buf[j]);
            rc = write_all(f, h, cnt * 2, path);
            free(h);
        } else {
            rc = write_all(f, buf, cnt * 4, path);
        }
        free(buf);
    }
    if (fclose(f) && !rc) rc = dcp_fail("%s: write error", path);
    return rc ? -1 : 0;
}

/* ---- DeepSeek-V2/V3 ------------------------------------------------------ */

/* Values of a named tensor: uniform, 1.7/sqrt(fan-in) for matrices, 1 +-
 * 0.1 for norms, +-0.3 for the router's correction bias; from the seed and
 * the name. */
static void mla_values(const ModelSpec *s, const char *name, int rows, int cols, float *out)
{
    /* an MTP layer's embedding and head are copies of the model's, as in
     * DeepSeek's checkpoints; with --branch-scale its eh_proj passes the
     * normed embedding through ([I 0]), so that it predicts a token's
     * successor as the model's chain does */
    if (strstr(name, ".embed_tokens.") && strcmp(name, "model.embed_tokens.weight")) name = "model.embed_tokens.weight";
    if (strstr(name, ".shared_head.head.")) name = s->tied ? "model.embed_tokens.weight" : "lm_head.weight";
    if (strstr(name, ".eh_proj.") && s->branch_scale > 0.0f) {
        for (size_t i = 0; i < (size_t)rows * cols; i++) out[i] = i % (size_t)cols == i / (size_t)cols;
        return;
    }
    uint64_t st = fnv1a(s->seed * 0x100000001B3ull, name, strlen(name));
    splitmix64(&st);
    int norm = strstr(name, "norm") != NULL, bias = strstr(name, "correction_bias") != NULL;
    int embed = strstr(name, "embed_tokens") != NULL;
    float scale = norm ? 0.1f : bias ? 0.3f : embed ? 1.0f : 1.7f / sqrtf((float)cols);
    if (s->branch_scale > 0.0f && (strstr(name, "o_proj") || strstr(name, "down_proj"))) scale *= s->branch_scale;
    for (size_t i = 0; i < (size_t)(rows ? rows : 1) * cols; i++) {
        double u = (double)(splitmix64(&st) >> 11) * (1.0 / 9007199254740992.0);
        float v = (float)(2.0 * u - 1.0) * scale;
        out[i] = norm ? 1.0f + v : v;
    }
}

/* How a tensor of a DeepSeek file is stored: float32, FP8 with its block
 * scales after it, or compressed-tensors INT4 (weight_packed, then its
 * weight_scale and weight_shape) */
typedef enum { NT_F32, NT_F8, NT_F8_SCALE, NT_I4, NT_I4_SCALE, NT_I4_SHAPE, NT_FP4, NT_FP4_SCALE, NT_FP4_GLOBAL,
               NT_FP4_INPUT, NT_BF16 } NtKind;
typedef struct {
    char name[160];
    int rows, cols; /* rows 0: a vector; the shape as stored */
    NtKind kind;
} NamedTensor;

static const struct {
    const char *dtype;
    int bits;
} nt_types[] = {{"F32", 32}, {"F8_E4M3", 8}, {"F32", 32}, {"I32", 32}, {"BF16", 16}, {"I64", 64},
                {"U8", 8},   {"F8_E4M3", 8}, {"F32", 32}, {"F32", 32}, {"BF16", 16}};

/* the routed experts, which --quant int4-w4a16 quantizes (Kimi K2's
 * choice: attention, shared experts, dense layers and the LM head stay) */
static int routed_expert(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

/* An FP8 matrix (v: rows x cols): each B x B block's scale max |w| / 448
 * (scales: its blocks), each value w / scale rounded to E4M3 (q8) */
static void quantize_f8(const float *v, int rows, int cols, int B, float *scales, uint8_t *q8)
{
    int bc = (cols + B - 1) / B;
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < cols; q++) {
            float *sc = &scales[(r / B) * bc + q / B];
            *sc = fmaxf(*sc, fabsf(v[(size_t)r * cols + q]));
        }
    for (int b = 0; b < (rows + B - 1) / B * bc; b++) scales[b] = fmaxf(scales[b], 1e-12f) / 448.0f;
    for (int r = 0; r < rows; r++)
        for (int q = 0; q < cols; q++)
            q8[(size_t)r * cols + q] = f32_to_f8e4m3(v[(size_t)r * cols + q] / scales[(r / B) * bc + q / B]);
}

/* An INT4 matrix as compressed-tensors' symmetric W4A16 packs it: each
 * group of G columns' scale max |w| / 7.5 in bf16 (calculate_qparams'
 * rule for -8 .. 7), each value w / scale rounded to even and clamped to
 * -8 .. 7, stored plus 8, eight to an int32 from its low bits */
static void quantize_i4(const float *v, int rows, int cols, int G, uint16_t *scales, uint8_t *packed)
{
    memset(packed, 0, (size_t)rows * cols / 2);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < cols / G; g++) {
            const float *w = v + (size_t)r * cols + (size_t)g * G;
            float m = 0;
            for (int i = 0; i < G; i++) m = fmaxf(m, fabsf(w[i]));
            uint16_t sb = f32_to_bf16(fmaxf(m, 1e-12f) / 7.5f);
            float sc = bf16_to_f32(sb);
            scales[(size_t)r * (cols / G) + g] = sb;
            for (int i = 0; i < G; i++) {
                float q = rintf(w[i] / sc);
                int n = (int)(q < -8 ? -8 : q > 7 ? 7 : q) + 8;
                size_t at = (size_t)r * cols + (size_t)g * G + i;
                packed[at / 2] |= (uint8_t)(n << (4 * (at % 2)));
            }
        }
}

/* An NVFP4 matrix: its global scale g (compressed-tensors: 448 x 6 /
 * max |w|, dividing; ModelOpt: max |w| / (6 x 448), multiplying), each
 * group of 16's FP8 scale (its max |w| / 6, brought to FP8 by the global
 * scale), each value the nearest E2M1 to w over its group's scale, packed
 * two to a byte, the low nibble first */
static float quantize_fp4(const float *v, int rows, int cols, int modelopt, uint8_t *scales, uint8_t *packed)
{
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    float amax = 1e-12f;
    for (size_t i = 0; i < (size_t)rows * cols; i++) amax = fmaxf(amax, fabsf(v[i]));
    float g = modelopt ? amax / (6.0f * 448.0f) : 448.0f * 6.0f / amax;
    memset(packed, 0, (size_t)rows * cols / 2);
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < cols / 16; b++) {
            const float *w = v + (size_t)r * cols + (size_t)b * 16;
            float m = 0;
            for (int i = 0; i < 16; i++) m = fmaxf(m, fabsf(w[i]));
            uint8_t s8 = f32_to_f8e4m3(modelopt ? m / 6.0f / g : m / 6.0f * g);
            scales[(size_t)r * (cols / 16) + b] = s8;
            float sc = modelopt ? f8e4m3_to_f32(s8) * g : f8e4m3_to_f32(s8) / g;
            for (int i = 0; i < 16; i++) {
                float y = sc > 0 ? w[i] / sc : 0;
                int best = 0;
                for (int c = 1; c < 8; c++)
                    if (fabsf(fabsf(y) - e2m1[c]) < fabsf(fabsf(y) - e2m1[best])) best = c;
                size_t at = (size_t)r * cols + (size_t)b * 16 + i;
                packed[at / 2] |= (uint8_t)((best | (y < 0 ? 8 : 0)) << (4 * (at % 2)));
            }
        }
    return g;
}

/* A Qwen3-MoE or GLM-4.5 layer's tensors as named ones: the dense
 * family's of the layer (attention, norms, and in the first, dense layers
 * the feed-forward's), then a MoE layer's experts (moe_tensors) */
static int moe_layer_tensors(const Config *c, int l, TensorSpec *mt)
{
    int n = 0;
    for (int k = T_RMS_ATT; k < T_COUNT; k++) {
        if (!tensor_is_per_layer((TensorKind)k) || !tensor_present(c, (TensorKind)k)) continue;
        if (l >= tensor_layers(c, (TensorKind)k)) continue; /* a MoE layer's feed-forward: its experts */
        int rows, cols;
        tensor_full_shape(c, (TensorKind)k, &rows, &cols);
        int vector = k == T_RMS_ATT || k == T_RMS_FFN || k >= T_BQ;
        mt[n] = (TensorSpec){.rows = vector ? 0 : rows, .cols = cols};
        tensor_hf_name((TensorKind)k, l, mt[n++].name, sizeof mt->name);
    }
    return MOE_LAYER(c, l) ? n + moe_tensors(c, NULL, l, NULL, mt + n) : n;
}

/* A DeepSeek or Qwen3-MoE model's tensors by name, values by name
 * (mla_values). bf16: every tensor the quantization leaves is BF16
 * (values rounded to nearest even), as a bf16 checkpoint (Kimi K2.x's)
 * stores them */
static int write_named(const ModelSpec *s, const char *dir, int bf16)
{
    Config c;
    mkmodel_config(s, &c);
    TensorSpec *mt = xmalloc(sizeof(TensorSpec) * (size_t)(layer_max_tensors(&c) + T_COUNT));
    int layers = c.n_layers + (c.mla ? s->mtp_layers : 0);
    NamedTensor *t = xmalloc(sizeof(NamedTensor) * (size_t)(4 * (layer_max_tensors(&c) + T_COUNT) * layers + 8));
    int n = 0, B = s->fp8_block, G = s->int4_group;
    t[n++] = (NamedTensor){"model.embed_tokens.weight", c.vocab_size, c.dim, NT_F32};
    for (int l = 0; l < layers; l++) {
        int k = c.mla ? mla_tensors(&c, NULL, l, NULL, mt) : moe_layer_tensors(&c, l, mt), own = k;
        if (l >= c.n_layers) k += mtp_tensors(&c, NULL, l, NULL, mt + k); /* an MTP layer's own: float32 */
        for (int i = 0; i < k; i++) {
            int matrix = mt[i].rows && !strstr(mt[i].name, "mlp.gate.weight") && i < own;
            NamedTensor x = {"", mt[i].rows, mt[i].cols, NT_F32};
            snprintf(x.name, sizeof x.name, "%s", mt[i].name);
            if (s->nvfp4 && matrix && routed_expert(mt[i].name)) { /* NVFP4: packed, scales, global (, input) */
                int len = (int)strlen(x.name) - 7, mo = s->nvfp4 == 2;
                t[n] = (NamedTensor){"", x.rows, x.cols / 2, NT_FP4};
                snprintf(t[n++].name, sizeof x.name, "%.*s.%s", len, x.name, mo ? "weight" : "weight_packed");
                t[n] = (NamedTensor){"", x.rows, x.cols / 16, NT_FP4_SCALE};
                snprintf(t[n++].name, sizeof x.name, "%.*s.weight_scale", len, x.name);
                t[n] = (NamedTensor){"", mo ? -1 : 0, 1, NT_FP4_GLOBAL}; /* rows -1: a scalar, [] */
                snprintf(t[n++].name, sizeof x.name, "%.*s.%s", len, x.name, mo ? "weight_scale_2" : "weight_global_scale");
                if (mo) {
                    t[n] = (NamedTensor){"", -1, 1, NT_FP4_INPUT};
                    snprintf(t[n++].name, sizeof x.name, "%.*s.input_scale", len, x.name);
                }
                continue;
            }
            if (G && matrix && routed_expert(mt[i].name)) { /* module.weight_packed, _scale, _shape */
                const char *module = x.name;
                int len = (int)strlen(module) - 7;
                t[n] = (NamedTensor){"", x.rows, x.cols / 8, NT_I4};
                snprintf(t[n++].name, sizeof x.name, "%.*s.weight_packed", len, module);
                t[n] = (NamedTensor){"", x.rows, x.cols / G, NT_I4_SCALE};
                snprintf(t[n++].name, sizeof x.name, "%.*s.weight_scale", len, module);
                t[n] = (NamedTensor){"", 0, 2, NT_I4_SHAPE};
                snprintf(t[n++].name, sizeof x.name, "%.*s.weight_shape", len, module);
                continue;
            }
            if (B && matrix) x.kind = NT_F8;
            t[n++] = x;
            if (x.kind == NT_F8) {
                NamedTensor sc = {"", (x.rows + B - 1) / B, (x.cols + B - 1) / B, NT_F8_SCALE};
                snprintf(sc.name, sizeof sc.name, "%s_scale_inv", x.name);
                t[n++] = sc;
            }
        }
    }
    t[n++] = (NamedTensor){"model.norm.weight", 0, c.dim, NT_F32};
    if (!s->tied) t[n++] = (NamedTensor){"lm_head.weight", c.vocab_size, c.dim, NT_F32};
    if (s->kimi_k25) t[n++] = (NamedTensor){"vision_tower.patch_embed.proj.weight", 4, 4, NT_F32}; /* never read */
    for (int i = 0; i < n && bf16; i++)
        if (t[i].kind == NT_F32) t[i].kind = NT_BF16;
    free(mt);
    /* header, then the data */
    size_t cap = 256 + (size_t)n * 272, len = 0, off = 0;
    char *hdr = xmalloc(cap);
    len += snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)(t[i].rows > 0 ? t[i].rows : 1) * t[i].cols, bytes = cnt * nt_types[t[i].kind].bits / 8;
        /* Kimi K2.5: the language model's tensors under its prefix */
        const char *pre = s->kimi_k25 && strncmp(t[i].name, "vision_tower.", 13) ? WRAPPED_PREFIX : "";
        if (t[i].rows < 0)
            len += snprintf(hdr + len, cap - len, ",\"%s%s\":{\"dtype\":\"%s\",\"shape\":[],\"data_offsets\":[%zu,%zu]}",
                            pre, t[i].name, nt_types[t[i].kind].dtype, off, off + bytes);
        else if (t[i].rows)
            len += snprintf(hdr + len, cap - len, ",\"%s%s\":{\"dtype\":\"%s\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                            pre, t[i].name, nt_types[t[i].kind].dtype, t[i].rows, t[i].cols, off, off + bytes);
        else
            len += snprintf(hdr + len, cap - len, ",\"%s%s\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                            pre, t[i].name, nt_types[t[i].kind].dtype, t[i].cols, off, off + bytes);
        off += bytes;
    }
    len += snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    int rc = f ? 0 : dcp_fail("%s: %s", path, strerror(errno));
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)len >> (8 * i));
    rc = rc || write_all(f, lenb, 8, path) || write_all(f, hdr, len, path);
    free(hdr);
    void *scales = NULL; /* a matrix's scales, written as the entry after it */
    float global = 0;    /* an NVFP4 matrix's global scale, written two entries after it */
    for (int i = 0; i < n && !rc; i++) {
        size_t cnt = (size_t)(t[i].rows > 0 ? t[i].rows : 1) * t[i].cols, bytes = cnt * nt_types[t[i].kind].bits / 8;
        if (t[i].kind == NT_FP4_GLOBAL || t[i].kind == NT_FP4_INPUT) {
            float one = 1.0f; /* input_scale: read and checked, not applied */
            rc = write_all(f, t[i].kind == NT_FP4_GLOBAL ? &global : &one, 4, path);
            continue;
        }
        if (t[i].kind == NT_F8_SCALE || t[i].kind == NT_I4_SCALE || t[i].kind == NT_FP4_SCALE) {
            rc = write_all(f, scales, bytes, path);
            free(scales);
            scales = NULL;
            continue;
        }
        if (t[i].kind == NT_I4_SHAPE) { /* the matrix's own shape: that of two entries before */
            int64_t shape[2] = {t[i - 2].rows, (int64_t)t[i - 2].cols * 8};
            rc = write_all(f, shape, sizeof shape, path);
            continue;
        }
        /* the matrix's values, by its name as a float32 model would have them */
        char name[160];
        int rows = t[i].rows, cols = t[i].kind == NT_I4 ? t[i].cols * 8 : t[i].kind == NT_FP4 ? t[i].cols * 2 : t[i].cols;
        if (t[i].kind == NT_I4 || (t[i].kind == NT_FP4 && s->nvfp4 == 1)) /* less "_packed" */
            snprintf(name, sizeof name, "%.*s", (int)strlen(t[i].name) - 7, t[i].name);
        else snprintf(name, sizeof name, "%s", t[i].name);
        size_t vals = (size_t)(rows ? rows : 1) * cols;
        float *v = xmalloc(vals * 4);
        mla_values(s, name, rows, cols, v);
        if (t[i].kind == NT_F32) {
            rc = write_all(f, v, bytes, path);
        } else if (t[i].kind == NT_BF16) {
            uint16_t *h = xmalloc(bytes);
            f32_to_bf16_n(h, v, vals);
            rc = write_all(f, h, bytes, path);
            free(h);
        } else {
            uint8_t *q = xmalloc(bytes);
            if (t[i].kind == NT_F8) {
                scales = xcalloc((size_t)((rows + B - 1) / B) * ((cols + B - 1) / B), sizeof(float));
                quantize_f8(v, rows, cols, B, scales, q);
            } else if (t[i].kind == NT_FP4) {
                scales = xmalloc((size_t)rows * (cols / 16));
                global = quantize_fp4(v, rows, cols, s->nvfp4 == 2, scales, q);
            } else {
                scales = xmalloc(sizeof(uint16_t) * (size_t)rows * (cols / G));
                quantize_i4(v, rows, cols, G, scales, q);
            }
            rc = write_all(f, q, bytes, path);
            free(q);
        }
        free(v);
    }
    free(scales);
    if (f && fclose(f) && !rc) rc = dcp_fail("%s: write error", path);
    free(t);
    return rc ? -1 : 0;
}

/* the modules ModelOpt leaves unquantized in dcpinfer-mkmodel's models (the
 * first %s: a wrapper's prefix; the second: MTP_EXCLUDE's or "") */
#define MODELOPT_EXCLUDE                                                                                               \
    "[\"%slm_head\", \"model.layers.*.self_attn*\", \"model.layers.*.shared_experts*\", \"*.mlp.gate_proj\", "      \
    "\"*.mlp.up_proj\", \"*.mlp.down_proj\", \"*.mlp.gate\"%s]"
/* an MTP layer's own matrices, written in float32: left out by either
 * format's list (compressed-tensors' regular expressions, ModelOpt's
 * patterns) */
#define MTP_IGNORE_CT ", \"re:.*\\\\.eh_proj$\", \"re:.*\\\\.shared_head\\\\.head$\""
#define MTP_EXCLUDE_MO ", \"*.eh_proj\", \"*.shared_head.head\""

/* the quantization_config line of a quantized DeepSeek model ("" if none) */
static void mla_quant_config(const ModelSpec *s, char *buf, size_t n)
{
    /* a wrapper's ignore list names the LM head under its prefix */
    const char *lm = s->kimi_k25 ? WRAPPED_PREFIX : "", *mtp_ct = s->mtp_layers ? MTP_IGNORE_CT : "",
               *mtp_mo = s->mtp_layers ? MTP_EXCLUDE_MO : "";
    if (s->fp8_block)
        snprintf(buf, n, "  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
                   "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [%d, %d]},\n",
                s->fp8_block, s->fp8_block);
    if (s->int4_group) /* as compressed-tensors writes it, with Kimi K2's ignore list */
        snprintf(buf, n, "  \"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "
                   "\"pack-quantized\", \"quantization_status\": \"compressed\", \"config_groups\": {\"group_0\": "
                   "{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, "
                   "\"group_size\": %d, \"strategy\": \"group\", \"dynamic\": false}}}, \"ignore\": [\"%slm_head\", "
                   "\"re:.*self_attn.*\", \"re:.*shared_experts.*\", \"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"%s]},\n",
                s->int4_group, lm, mtp_ct);
    if (s->nvfp4 == 1)
        snprintf(buf, n, "  \"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "
                   "\"nvfp4-pack-quantized\", \"quantization_status\": \"compressed\", \"config_groups\": {\"group_0\": "
                   "{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\", \"symmetric\": "
                   "true, \"group_size\": 16, \"strategy\": \"tensor_group\", \"dynamic\": false, \"scale_dtype\": "
                   "\"torch.float8_e4m3fn\"}}}, \"ignore\": [\"%slm_head\", \"re:.*self_attn.*\", \"re:.*shared_experts.*\", "
                   "\"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"%s]},\n", lm, mtp_ct);
    if (s->nvfp4 == 2) /* ModelOpt's config.json form; hf_quant_config.json says the same (modelopt_quant_file) */
        snprintf(buf, n, "  \"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", "
                   "\"producer\": {\"name\": \"modelopt\"}, \"config_groups\": {\"group_0\": {\"targets\": "
                   "[\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\", \"group_size\": 16, "
                   "\"dynamic\": false}, \"input_activations\": {\"num_bits\": 4, \"type\": \"float\", "
                   "\"group_size\": 16, \"dynamic\": false}}}, \"ignore\": " MODELOPT_EXCLUDE "},\n",
                 lm, mtp_mo);
}

/* hf_quant_config.json, as ModelOpt writes it beside config.json: the
 * settings of config.json's quantization_config, exclude_modules for its
 * ignore */
static int modelopt_quant_file(const ModelSpec *s, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return dcp_fail("%s: %s", path, strerror(errno));
    fprintf(f, "{\n  \"producer\": {\"name\": \"modelopt\"},\n  \"quantization\": {\"quant_algo\": \"NVFP4\", "
               "\"kv_cache_quant_algo\": null, \"group_size\": 16, \"exclude_modules\": " MODELOPT_EXCLUDE "}\n}\n",
            s->kimi_k25 ? WRAPPED_PREFIX : "", s->mtp_layers ? MTP_EXCLUDE_MO : "");
    return fclose(f) ? dcp_fail("%s: write error", path) : 0;
}

static int write_mla_config(const ModelSpec *s, const char *dir, int bf16)
{
    char path[4096];
    FILE *f = open_config(dir, path, sizeof path);
    if (!f) return -1;
    const Arch *a = &arch_table[s->arch];
    const MlaConfig *m = &s->mla;
    const MoeConfig *moe = &s->moe;
    char eos[32], qlora[32], scale[40];
    snprintf(eos, sizeof eos, s->eos >= 0 ? "%d" : "null", s->eos);
    snprintf(scale, sizeof scale, "%.9g", (double)moe->routed_scaling_factor);
    if (!strpbrk(scale, ".e")) strcat(scale, ".0"); /* transformers wants a float */
    snprintf(qlora, sizeof qlora, m->q_lora_rank ? "%d" : "null", m->q_lora_rank);
    char quant[1024] = "";
    mla_quant_config(s, quant, sizeof quant);
    if (s->kimi_k25) /* the wrapper's fields, then the language model's as text_config */
        fprintf(f, "{\n  \"architectures\": [\"KimiK25ForConditionalGeneration\"],\n  \"model_type\": \"kimi_k25\",\n"
                   "  \"vision_config\": {\"model_type\": \"kimi_k25_vision\", \"hidden_size\": 16},\n%s"
                   "  \"text_config\": ",
                quant);
    fprintf(f,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n  \"hidden_size\": %d,\n"
            "  \"intermediate_size\": %d,\n  \"moe_intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
            "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"vocab_size\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"kv_lora_rank\": %d,\n  \"q_lora_rank\": %s,\n"
            "  \"qk_nope_head_dim\": %d,\n  \"qk_rope_head_dim\": %d,\n  \"head_dim\": %d,\n  \"v_head_dim\": %d,\n"
            "  \"n_routed_experts\": %d,\n  \"n_shared_experts\": %d,\n  \"num_experts_per_tok\": %d,\n"
            "  \"first_k_dense_replace\": %d,\n  \"n_group\": %d,\n  \"topk_group\": %d,\n"
            "  \"norm_topk_prob\": %s,\n  \"routed_scaling_factor\": %s,\n",
            a->name, s->kimi_k25 ? "kimi_k2" : a->model_type, s->dim, s->hidden, moe->moe_hidden, s->layers, s->heads,
            s->heads, s->vocab,
            s->max_len, m->kv_lora_rank, qlora, m->qk_nope_head_dim, m->qk_rope_head_dim, m->qk_rope_head_dim,
            m->v_head_dim, moe->n_routed_experts, moe->n_shared_experts, moe->experts_per_token,
            moe->first_k_dense_replace,
            moe->n_group, moe->topk_group, moe->norm_topk_prob ? "true" : "false", scale);
    if (a->mla == 2) fprintf(f, "  \"rope_interleave\": true,\n"); /* DeepSeek-V3 */
    else
        fprintf(f, "  \"topk_method\": \"%s\",\n",
                moe->route == ROUTE_GROUP_LIMITED_GREEDY ? "group_limited_greedy" : "greedy");
    if (s->mtp_layers) fprintf(f, "  \"num_nextn_predict_layers\": %d,\n", s->mtp_layers);
    if (!s->kimi_k25) fputs(quant, f);
    write_rope(f, s);
    fprintf(f, "  \"attention_bias\": false,\n");
    return finish_config(f, path, s, eos, "1e-06", bf16);
}

int mkmodel_write_hf(const ModelSpec *s, const char *dir, int bf16, int shards)
{
    if (mkmodel_check_spec(s)) return -1;
    const Arch *a = &arch_table[s->arch];
    if (a->mla || a->moe) {
        if (shards > 1) return dcp_fail("DeepSeek, Qwen3-MoE and GLM-4.5 models are written as one file");
        if (mkdir(dir, 0755) && errno != EEXIST) return dcp_fail("%s: %s", dir, strerror(errno));
        return (a->mla ? write_mla_config(s, dir, bf16) : write_config_json(s, dir, bf16)) ||
                       (s->nvfp4 == 2 && modelopt_quant_file(s, dir)) || write_named(s, dir, bf16)
                   ? -1
                   : 0;
    }
    if (mkdir(dir, 0755) && errno != EEXIST) return dcp_fail("%s: %s", dir, strerror(errno));
    if (write_config_json(s, dir, bf16)) return -1;
    Config c;
    mkmodel_config(s, &c);
    TensorRef *refs = xmalloc(sizeof(TensorRef) * (size_t)(T_COUNT * s->layers + T_COUNT));
    int n = 0;
    refs[n++] = (TensorRef){T_EMBED, 0};
    for (int l = 0; l < s->layers; l++)
        for (int k = T_RMS_ATT; k < T_COUNT; k++)
            if (tensor_is_per_layer((TensorKind)k) && tensor_present(&c, (TensorKind)k))
                refs[n++] = (TensorRef){(TensorKind)k, l};
    refs[n++] = (TensorRef){T_RMS_FINAL, 0};
    if (tensor_present(&c, T_LM_HEAD)) refs[n++] = (TensorRef){T_LM_HEAD, 0};
    int rc = 0;
    char path[4096];
    if (shards <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = write_safetensors(s, path, refs, n, bf16);
    } else {
        if (shards > n) shards = n;
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *idx = fopen(path, "w");
        if (!idx) rc = dcp_fail("%s: %s", path, strerror(errno));
        if (idx) fprintf(idx, "{\n  \"metadata\": {},\n  \"weight_map\": {");
        for (int i = 0; i < shards && !rc; i++) {
            int first, count;
            balanced_part(n, shards, i, &first, &count);
            char fname[64];
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", i + 1, shards);
            snprintf(path, sizeof path, "%s/%s", dir, fname);
            rc = write_safetensors(s, path, refs + first, count, bf16);
            for (int j = first; j < first + count; j++) {
                char name[128];
                tensor_hf_name(refs[j].k, refs[j].layer, name, sizeof name);
                fprintf(idx, "%s\n    \"%s\": \"%s\"", j ? "," : "", name, fname);
            }
        }
        if (idx) {
            fprintf(idx, "\n  }\n}\n");
            if (fclose(idx) && !rc) rc = dcp_fail("index: write error");
        }
    }
    free(refs);
    return rc;
}

int mkmodel_write_llama2c(const ModelSpec *s, const char *path)
{
    if (mkmodel_check_spec(s)) return -1;
    Config c;
    mkmodel_config(s, &c);
    if (c.n_heads * c.head_dim != c.dim) return dcp_fail("llama2.c format needs heads * head_dim == dim");
    if (s->rope_theta != 10000.0f) return dcp_fail("llama2.c format has RoPE theta 10000 only");
    if (s->arch || c.qkv_bias || c.mlp_bias || c.sliding_window || c.rope.type != ROPE_DEFAULT || s->head_dim)
        return dcp_fail("llama2.c format holds plain Llama models only (no --arch, biases, window, RoPE scaling)");
    FILE *f = fopen(path, "wb");
    if (!f) return dcp_fail("%s: %s", path, strerror(errno));
    int32_t hdr[7] = {s->dim, s->hidden, s->layers, s->heads, s->kv_heads, s->tied ? s->vocab : -s->vocab,
                      s->max_len};
    int rc = write_all(f, hdr, sizeof hdr, path);
    static const TensorKind order[] = {T_EMBED, T_RMS_ATT, T_WQ,      T_WK,   T_WV,       T_WO,
                                       T_RMS_FFN, T_GATE, T_DOWN, T_UP, T_RMS_FINAL};
    int D = c.head_dim;
    for (size_t o = 0; o < sizeof order / sizeof *order && !rc; o++) {
        TensorKind k = order[o];
        int nl = tensor_is_per_layer(k) ? s->layers : 1;
        for (int l = 0; l < nl && !rc; l++) {
            int rows, cols;
            tensor_full_shape(&c, k, &rows, &cols);
            size_t cnt = (size_t)rows * cols;
            float *buf = xmalloc(cnt * 4);
            mkmodel_tensor(s, k, l, buf);
            if (k == T_WQ || k == T_WK) {
                /* llama2.c row h*D + 2i + j holds Hugging Face row h*D + j*D/2 + i */
                float *perm = xmalloc(cnt * 4);
                for (int r = 0; r < rows; r++) {
                    int h = r / D, within = r % D, i = within / 2, j = within % 2;
                    int src = h * D + j * (D / 2) + i;
                    memcpy(perm + (size_t)r * cols, buf + (size_t)src * cols, (size_t)cols * 4);
                }
                free(buf);
                buf = perm;
            }
            rc = write_all(f, buf, cnt * 4, path);
            free(buf);
        }
    }
    /* legacy freq_cis_real/imag, unused by readers */
    size_t nfreq = (size_t)s->max_len * (D / 2) * 2;
    float *zeros = xcalloc(nfreq, 4);
    if (!rc) rc = write_all(f, zeros, nfreq * 4, path);
    free(zeros);
    if (!rc && !s->tied) {
        int rows, cols;
        tensor_full_shape(&c, T_LM_HEAD, &rows, &cols);
        float *buf = xmalloc((size_t)rows * cols * 4);
        mkmodel_tensor(s, T_LM_HEAD, 0, buf);
        rc = write_all(f, buf, (size_t)rows * cols * 4, path);
        free(buf);
    }
    if (fclose(f) && !rc) rc = dcp_fail("%s: write error", path);
    return rc ? -1 : 0;
}
