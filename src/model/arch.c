#define PCRE2_CODE_UNIT_WIDTH 8
#include "arch.h"

#include <jansson.h>
#include <fnmatch.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

const Arch arch_table[] = {
    /* name                 model_type  qkv_bias attention_bias mlp_bias qk_norm window  mla family alias moe */
    {"LlamaForCausalLM",   "llama",    0,       1,             1,       0,      WINDOW_NONE,  0, FAMILY_DENSE, NULL, 0},
    {"MistralForCausalLM", "mistral",  0,       0,             0,       0,      WINDOW_ALL,   0, FAMILY_DENSE, NULL, 0},
    {"Qwen2ForCausalLM",   "qwen2",    1,       0,             0,       0,      WINDOW_UPPER, 0, FAMILY_DENSE, NULL, 0},
    {"Qwen3ForCausalLM",   "qwen3",    0,       1,             0,       1,      WINDOW_UPPER, 0, FAMILY_DENSE, NULL, 0},
    {"DeepseekV2ForCausalLM", "deepseek_v2", 0,  0,             0,       0,      WINDOW_NONE, 1, FAMILY_MLA, NULL, 0},
    {"DeepseekV3ForCausalLM", "deepseek_v3", 0,  0,             0,       0,      WINDOW_NONE, 2, FAMILY_MLA, "kimi_k2", 0},
    {"Qwen3MoeForCausalLM", "qwen3_moe", 0,     1,             0,       1,      WINDOW_UPPER, 0, FAMILY_DENSE, NULL, 1},
    {"Glm4MoeForCausalLM", "glm4_moe",  0,       2,             0,       2,      WINDOW_NONE,  0, FAMILY_DENSE, NULL, 2},
};
const int arch_count = (int)(sizeof arch_table / sizeof *arch_table);

LayerFamily arch_family(const Config *c) { return arch_table[c->arch].family; }

const char *arch_supported_list(void)
{
    static char list[256];
    if (!list[0])
        for (int i = 0; i < arch_count; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s (%s)", i ? ", " : "", arch_table[i].name,
                     arch_table[i].model_type);
    return list;
}

/* ---- typed fields -------------------------------------------------------
 * Each returns -1 with dcp_error() set for a value of the wrong type or out
 * of range; a missing or null field leaves *out as it was. */

static int get_int(json_t *o, const char *key, int *out, const char *path)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return dcp_fail("%s: \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < INT32_MIN || x > INT32_MAX) return dcp_fail("%s: \"%s\" is %lld, out of range", path, key, (long long)x);
    *out = (int)x;
    return 0;
}

static int get_float(json_t *o, const char *key, float *out, const char *path)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return dcp_fail("%s: \"%s\" must be a finite number", path, key);
    *out = (float)json_number_value(v);
    return 0;
}

static int get_bool(json_t *o, const char *key, int *out, const char *path)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return dcp_fail("%s: \"%s\" must be true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

/* ---- the architecture --------------------------------------------------- */

static int find_arch(json_t *root, const char *path)
{
    json_t *archs = json_object_get(root, "architectures"), *mt = json_object_get(root, "model_type");
    const char *name = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    const char *type = json_string_value(mt);
    if (archs && !json_is_null(archs) && (!json_is_array(archs) || (json_array_size(archs) && !name)))
        return dcp_fail("%s: \"architectures\" must be a list of names", path);
    if (!name && !type)
        return dcp_fail("%s: names no architecture (\"architectures\" or \"model_type\"); supported: %s", path,
                        arch_supported_list());
    for (int i = 0; i < arch_count; i++) {
        const Arch *a = &arch_table[i];
        int alias = type && a->alias && !strcmp(type, a->alias);
        if ((name && strcmp(name, a->name)) || (!name && strcmp(type, a->model_type) && !alias)) continue;
        if (type && strcmp(type, a->model_type) && !alias)
            return dcp_fail("%s: architecture %s with model_type \"%s\" (expected \"%s\")", path, a->name, type,
                            a->model_type);
        return i;
    }
    return dcp_fail("%s: architecture %s is not supported; supported: %s", path, name ? name : type,
                    arch_supported_list());
}

/* ---- DeepSeek-V2/V3 ------------------------------------------------------ */

static int read_rope(json_t *root, Config *c, const char *path, float partial);
static void add_eos_ids(json_t *v, Config *c);

/* A string field that must be one of the choices (NULL-terminated; the
 * first is the default when absent); its index, or -1 with the message. */
static int get_choice(json_t *o, const char *key, const char *const *choices, const char *arch, const char *path)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    const char *s = json_string_value(v);
    for (int i = 0; s && choices[i]; i++)
        if (!strcmp(s, choices[i])) return i;
    char list[128] = "";
    for (int i = 0; choices[i]; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", choices[i]);
    return dcp_fail("%s: %s \"%s\" is not supported for %s (supported: %s)", path, key, s ? s : "(not a string)", arch,
                    list);
}

/* Reads and checks a DeepSeek-V2/V3 config (docs/models.md) into c. */
/* quantization_config: block-scaled FP8 (DeepSeek-V3's own), or
 * compressed-tensors' pack-quantized INT4 W4A16 (Kimi K2's experts: one
 * config group of symmetric 4-bit integers in groups along the input,
 * activations unquantized). Anything else is refused by name. */
static int read_quantization(json_t *q, QuantConfig *m, const char *path)
{
    const char *qm = json_string_value(json_object_get(q, "quant_method"));
    if (qm && !strcmp(qm, "compressed-tensors")) {
        json_t *groups = json_object_get(q, "config_groups"), *kv = json_object_get(q, "kv_cache_scheme");
        const char *fmt = json_string_value(json_object_get(q, "format"));
        if (!json_is_object(groups) || json_object_size(groups) != 1)
            return dcp_fail("%s: quantization_config: compressed-tensors with %zu config_groups; dcpinfer reads one",
                            path, json_is_object(groups) ? json_object_size(groups) : (size_t)0);
        json_t *g = json_object_iter_value(json_object_iter(groups)), *w = json_object_get(g, "weights");
        const char *gfmt = json_string_value(json_object_get(g, "format"));
        if (gfmt) fmt = gfmt;
        json_t *ia = json_object_get(g, "input_activations");
        const char *type = json_string_value(json_object_get(w, "type"));
        const char *strategy = json_string_value(json_object_get(w, "strategy"));
        json_t *bits = json_object_get(w, "num_bits"), *gs = json_object_get(w, "group_size");
        json_t *sym = json_object_get(w, "symmetric");
        if (fmt && !strcmp(fmt, "nvfp4-pack-quantized")) {
            /* NVFP4 weights (E2M1 in groups of 16 with FP8 scales and a
             * global scale), activations unquantized (NVFP4A16) */
            if (!json_is_object(w) || !type || strcmp(type, "float") || json_integer_value(bits) != 4 || !strategy ||
                strcmp(strategy, "tensor_group") || json_integer_value(gs) != 16)
                return dcp_fail("%s: quantization_config: nvfp4-pack-quantized weights must be 4-bit floats in "
                                "tensor groups of 16",
                                path);
            if (ia && !json_is_null(ia))
                return dcp_fail("%s: quantization_config: NVFP4 input activations (W4A4) are not supported: dcpinfer "
                                "runs NVFP4 weight-only, activations in fp32 (input_activations null)",
                                path);
            if (kv && !json_is_null(kv))
                return dcp_fail("%s: quantization_config: kv_cache_scheme is not supported (use --kv-cache-dtype fp8)",
                                path);
            m->nvfp4_group = 16;
            m->nvfp4_round_bf16 = 1; /* compressed-tensors decompresses to bf16 */
            return 0;
        }
        if (!fmt || strcmp(fmt, "pack-quantized"))
            return dcp_fail("%s: quantization_config: compressed-tensors format \"%s\" is not supported "
                            "(pack-quantized INT4 or nvfp4-pack-quantized)",
                            path, fmt ? fmt : "(none)");
        if (!json_is_object(w) || !type || strcmp(type, "int") || json_integer_value(bits) != 4 || !strategy ||
            strcmp(strategy, "group") || !json_is_integer(gs) || json_integer_value(gs) < 1 ||
            json_integer_value(gs) > 1 << 20)
            return dcp_fail("%s: quantization_config: pack-quantized weights must be 4-bit ints in groups "
                            "(type int, num_bits 4, strategy group, group_size > 0)",
                            path);
        if (json_is_false(sym))
            return dcp_fail("%s: quantization_config: asymmetric INT4 (weight_zero_point) is not supported "
                            "(symmetric only)",
                            path);
        if (ia && !json_is_null(ia))
            return dcp_fail("%s: quantization_config: quantized input activations are not supported (W4A16: "
                            "input_activations null)",
                            path);
        if (kv && !json_is_null(kv))
            return dcp_fail("%s: quantization_config: kv_cache_scheme is not supported (use --kv-cache-dtype fp8)",
                            path);
        m->int4_group = (int)json_integer_value(gs);
        return 0;
    }
    if (qm && !strcmp(qm, "modelopt")) { /* NVIDIA ModelOpt's NVFP4 export, weight-only here */
        const char *algo = json_string_value(json_object_get(q, "quant_algo"));
        json_t *gs = json_object_get(q, "group_size"), *kv = json_object_get(q, "kv_cache_quant_algo");
        if (!algo || strcmp(algo, "NVFP4"))
            return dcp_fail("%s: quantization_config: modelopt quant_algo %s is not supported (NVFP4 only)", path,
                            algo ? algo : "(none)");
        if (gs && json_integer_value(gs) != 16)
            return dcp_fail("%s: quantization_config: NVFP4 group_size %lld is not supported (16)", path,
                            (long long)json_integer_value(gs));
        if (kv && !json_is_null(kv))
            return dcp_fail("%s: quantization_config: kv_cache_quant_algo is not supported (use --kv-cache-dtype fp8)",
                            path);
        m->nvfp4_group = 16;
        m->nvfp4_modelopt = 1;
        m->nvfp4_round_bf16 = 1;
        return 0;
    }
    const char *fmt = json_string_value(json_object_get(q, "fmt"));
    json_t *bs = json_object_get(q, "weight_block_size");
    if (!qm || strcmp(qm, "fp8"))
        return dcp_fail("%s: quantization_config %s is not supported (block-scaled fp8, compressed-tensors "
                        "pack-quantized INT4 or NVFP4, modelopt NVFP4)",
                        path, qm ? qm : "(no quant_method)");
    if (fmt && strcmp(fmt, "e4m3"))
        return dcp_fail("%s: quantization_config fmt \"%s\" is not supported (e4m3 only)", path, fmt);
    if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
        !json_is_integer(json_array_get(bs, 1)) || json_integer_value(json_array_get(bs, 0)) <= 0 ||
        json_integer_value(json_array_get(bs, 1)) <= 0 || json_integer_value(json_array_get(bs, 0)) > 1 << 20 ||
        json_integer_value(json_array_get(bs, 1)) > 1 << 20)
        return dcp_fail("%s: quantization_config fp8 needs \"weight_block_size\": [rows, cols], positive", path);
    m->fp8_block[0] = (int)json_integer_value(json_array_get(bs, 0));
    m->fp8_block[1] = (int)json_integer_value(json_array_get(bs, 1));
    return 0;
}

static int read_deepseek(json_t *root, const char *arch, int v3, const char *path, Config *cp)
{
    Config c = *cp;
    MlaConfig m;
    MoeConfig moe;
    memset(&m, 0, sizeof m);
    memset(&moe, 0, sizeof moe);
    moe.sigmoid = v3;
    m.rope_interleave = 1;
    moe.n_group = moe.topk_group = moe.moe_layer_freq = 1;
    moe.routed_scaling_factor = 1.0f;
    moe.norm_topk_prob = 0;
    c.max_seq_len = 2048;
    int head_dim = 0, attention_bias = 0;
    static const char *required[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                                     "intermediate_size", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                     "v_head_dim"};
    int *req[] = {&c.dim, &c.n_layers, &c.n_heads, &c.vocab_size, &c.hidden_dim, &m.kv_lora_rank,
                  &m.qk_nope_head_dim, &m.qk_rope_head_dim, &m.v_head_dim};
    for (int i = 0; i < 9; i++) {
        json_t *v = json_object_get(root, required[i]);
        if (!v || json_is_null(v)) return dcp_fail("%s: missing \"%s\"", path, required[i]);
        if (get_int(root, required[i], req[i], path)) return -1;
        if (*req[i] <= 0) return dcp_fail("%s: \"%s\" must be positive, not %d", path, required[i], *req[i]);
    }
    if (get_int(root, "q_lora_rank", &m.q_lora_rank, path) || get_int(root, "head_dim", &head_dim, path) ||
        get_int(root, "n_routed_experts", &moe.n_routed_experts, path) ||
        get_int(root, "n_shared_experts", &moe.n_shared_experts, path) ||
        get_int(root, "num_experts_per_tok", &moe.experts_per_token, path) ||
        get_int(root, "moe_intermediate_size", &moe.moe_hidden, path) ||
        get_int(root, "first_k_dense_replace", &moe.first_k_dense_replace, path) ||
        get_int(root, "moe_layer_freq", &moe.moe_layer_freq, path) || get_int(root, "n_group", &moe.n_group, path) ||
        get_int(root, "topk_group", &moe.topk_group, path) ||
        get_bool(root, "norm_topk_prob", &moe.norm_topk_prob, path) ||
        get_float(root, "routed_scaling_factor", &moe.routed_scaling_factor, path) ||
        get_int(root, "num_nextn_predict_layers", &c.mtp_layers, path) ||
        get_int(root, "max_position_embeddings", &c.max_seq_len, path) ||
        get_bool(root, "attention_bias", &attention_bias, path) ||
        (v3 && get_bool(root, "rope_interleave", &m.rope_interleave, path)))
        return -1;
    if (m.q_lora_rank < 0) return dcp_fail("%s: q_lora_rank %d must be positive or null", path, m.q_lora_rank);
    /* bounds far above any real model (DeepSeek-V3: 512, 128, 64, 128,
     * 1536, 256 experts of 2048), so that the sizes formed from them (a
     * latent row, a head's query, the tensors of a layer) stay in an int */
    const struct {
        const char *name;
        int value, max;
    } bounds[] = {{"kv_lora_rank", m.kv_lora_rank, 1 << 12},          {"qk_nope_head_dim", m.qk_nope_head_dim, 1 << 12},
                  {"qk_rope_head_dim", m.qk_rope_head_dim, 1 << 12},  {"v_head_dim", m.v_head_dim, 1 << 12},
                  {"q_lora_rank", m.q_lora_rank, 1 << 16},
                  {"n_routed_experts", moe.n_routed_experts, 1 << 16},
                  {"n_shared_experts", moe.n_shared_experts, 1 << 8},
                  {"moe_intermediate_size", moe.moe_hidden, 1 << 20},
                  {"num_experts_per_tok", moe.experts_per_token, 1 << 16}, {"n_group", moe.n_group, 1 << 16},
                  {"topk_group", moe.topk_group, 1 << 16},
                  {"first_k_dense_replace", moe.first_k_dense_replace, 1 << 12},
                  {"moe_layer_freq", moe.moe_layer_freq, 1 << 12},
                  {"num_nextn_predict_layers", c.mtp_layers, 1 << 12}};
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++)
        if (bounds[i].value > bounds[i].max)
            return dcp_fail("%s: %s is %d; it must be at most %d", path, bounds[i].name, bounds[i].value, bounds[i].max);
    if (head_dim && head_dim != m.qk_rope_head_dim)
        return dcp_fail("%s: head_dim %d differs from qk_rope_head_dim %d (the RoPE part of a head)", path, head_dim,
                        m.qk_rope_head_dim);
    if (m.qk_rope_head_dim % 2) return dcp_fail("%s: qk_rope_head_dim %d must be even", path, m.qk_rope_head_dim);
    if (attention_bias) return dcp_fail("%s: attention_bias true is not supported for %s", path, arch);
    /* the router: V2 softmax with greedy or group-limited choice; V3 sigmoid with a correction bias */
    static const char *v2_methods[] = {"greedy", "group_limited_greedy", NULL}, *v3_methods[] = {"noaux_tc", NULL};
    static const char *v2_scores[] = {"softmax", NULL}, *v3_scores[] = {"sigmoid", NULL};
    int method = get_choice(root, "topk_method", v3 ? v3_methods : v2_methods, arch, path);
    if (method < 0 || get_choice(root, "scoring_func", v3 ? v3_scores : v2_scores, arch, path) < 0) return -1;
    moe.route = v3 ? ROUTE_NOAUX_TC : (RouteMethod)method;
    if (!v3) moe.norm_topk_prob = 0; /* transformers' DeepSeek-V2 weights its top-k as scored, whatever it says */
    if (moe.n_routed_experts > 0) {
        if (moe.experts_per_token <= 0 || moe.experts_per_token > moe.n_routed_experts || moe.moe_hidden <= 0)
            return dcp_fail("%s: num_experts_per_tok %d must be from 1 to n_routed_experts %d, and "
                            "moe_intermediate_size positive",
                            path, moe.experts_per_token, moe.n_routed_experts);
        if (moe.n_group <= 0 || moe.n_routed_experts % moe.n_group || moe.topk_group <= 0 ||
            moe.topk_group > moe.n_group)
            return dcp_fail("%s: n_group %d must divide n_routed_experts %d, and topk_group %d be from 1 to n_group",
                            path, moe.n_group, moe.n_routed_experts, moe.topk_group);
        if (v3 && moe.n_routed_experts / moe.n_group < 2)
            return dcp_fail("%s: a group scores by its two best experts, so n_routed_experts / n_group must be at "
                            "least 2 (it is %d)",
                            path, moe.n_routed_experts / moe.n_group);
        if (moe.moe_layer_freq <= 0 || moe.first_k_dense_replace < 0)
            return dcp_fail("%s: moe_layer_freq must be positive and first_k_dense_replace not negative", path);
    }
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu")) return dcp_fail("%s: hidden_act %s is not supported (silu only)", path, act);
    json_t *q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q) && read_quantization(q, &c.quant, path)) return -1;
    if (get_int(root, "bos_token_id", &c.bos_id, path) || get_float(root, "rms_norm_eps", &c.norm_eps, path) ||
        get_bool(root, "tie_word_embeddings", &c.tied_embeddings, path))
        return -1;
    if (read_rope(root, &c, path, 0)) return -1;
    /* the softmax scale: qk_head_dim^-0.5, times YaRN's mscale^2 from mscale_all_dim */
    m.softmax_scale = 1.0f / sqrtf((float)(m.qk_nope_head_dim + m.qk_rope_head_dim));
    json_t *r = json_object_get(root, "rope_parameters");
    if (!r || json_is_null(r)) r = json_object_get(root, "rope_scaling");
    float mscale_all = 0;
    if (c.rope.type != ROPE_DEFAULT && r && get_float(r, "mscale_all_dim", &mscale_all, path)) return -1;
    if (c.rope.type != ROPE_DEFAULT && mscale_all && c.rope.factor > 1) {
        float ms = 0.1f * mscale_all * logf(c.rope.factor) + 1.0f;
        m.softmax_scale *= ms * ms;
    }
    c.n_kv_heads = 1; /* one latent row per position, shared by every head */
    c.head_dim = m.kv_lora_rank + m.qk_rope_head_dim;
    c.rope_style = m.rope_interleave ? ROPE_ADJACENT_PAIRS : ROPE_ROTATE_HALF;
    c.mla = 1;
    c.m = m;
    c.moe = moe;
    *cp = c;
    add_eos_ids(json_object_get(root, "eos_token_id"), cp);
    return 0;
}

/* ---- RoPE ---------------------------------------------------------------- */

/* The rope block, spelled rope_parameters (transformers 5) or rope_scaling
 * (older), with its type as "rope_type" or "type". partial: the
 * architecture rotates the first partial_rotary_factor of each head (this
 * its default, GLM-4.5's 0.5; given at the top level or in the block);
 * 0: it rotates whole heads, and a factor other than 1 is refused. */
static int read_rope(json_t *root, Config *c, const char *path, float partial)
{
    json_t *params = json_object_get(root, "rope_parameters"), *scaling = json_object_get(root, "rope_scaling");
    if (params && !json_is_null(params) && scaling && !json_is_null(scaling))
        return dcp_fail("%s: both \"rope_parameters\" and \"rope_scaling\" are given; give one", path);
    json_t *r = params && !json_is_null(params) ? params : scaling;
    const char *field = r == params ? "rope_parameters" : "rope_scaling";
    c->rope_theta = 10000.0f;
    float factor = partial ? partial : 1.0f;
    if (get_float(root, "rope_theta", &c->rope_theta, path) ||
        (partial && get_float(root, "partial_rotary_factor", &factor, path)) ||
        (r && json_is_object(r) && get_float(r, "partial_rotary_factor", &factor, path)))
        return -1;
    if (!partial && factor != 1.0f)
        return dcp_fail("%s: partial_rotary_factor %g is not supported (1 only)", path, (double)factor);
    /* the dimensions rotated: transformers' int(head_dim * factor) */
    c->rotary_dim = partial ? (int)((float)c->head_dim * factor) : 0;
    if (partial && (!(factor > 0 && factor <= 1) || c->rotary_dim < 2 || c->rotary_dim % 2))
        return dcp_fail("%s: partial_rotary_factor %g of head_dim %d rotates %d dimensions: it must be an even "
                        "count from 2 to head_dim",
                        path, (double)factor, c->head_dim, c->rotary_dim);
    memset(&c->rope, 0, sizeof c->rope);
    c->rope.type = ROPE_DEFAULT;
    if (!r || json_is_null(r)) return 0;
    if (!json_is_object(r)) return dcp_fail("%s: \"%s\" must be an object", path, field);
    static const char *known[] = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                                  "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                                  "mscale", "mscale_all_dim", "truncate", "partial_rotary_factor", NULL};
    const char *key;
    json_t *v;
    json_object_foreach(r, key, v)
    {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(key, known[i]);
        if (!ok) return dcp_fail("%s: \"%s\" has the field \"%s\", which dcpinfer does not know", path, field, key);
    }
    const char *type = json_string_value(json_object_get(r, "rope_type"));
    if (!type) type = json_string_value(json_object_get(r, "type"));
    if (!type) return dcp_fail("%s: \"%s\" gives no \"rope_type\"", path, field);
    if (get_float(r, "rope_theta", &c->rope_theta, path)) return -1;
    RopeScaling *s = &c->rope;
    s->factor = 0;
    s->truncate = 1;
    s->beta_fast = 32;
    s->beta_slow = 1;
    if (get_float(r, "factor", &s->factor, path) || get_float(r, "low_freq_factor", &s->low_freq_factor, path) ||
        get_float(r, "high_freq_factor", &s->high_freq_factor, path) ||
        get_int(r, "original_max_position_embeddings", &s->original_max_position_embeddings, path) ||
        get_float(r, "beta_fast", &s->beta_fast, path) || get_float(r, "beta_slow", &s->beta_slow, path) ||
        get_bool(r, "truncate", &s->truncate, path))
        return -1;
    if (!strcmp(type, "default")) {
        s->type = ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        s->type = ROPE_LINEAR;
        if (!(s->factor > 0)) return dcp_fail("%s: rope type linear needs a positive \"factor\"", path);
    } else if (!strcmp(type, "llama3")) {
        s->type = ROPE_LLAMA3;
        if (!(s->factor > 0) || !(s->low_freq_factor > 0) || !(s->high_freq_factor > s->low_freq_factor) ||
            s->original_max_position_embeddings <= 0)
            return dcp_fail("%s: rope type llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                            "original_max_position_embeddings > 0",
                            path);
    } else if (!strcmp(type, "yarn")) {
        s->type = ROPE_YARN;
        /* a field that is given must be valid; only a missing one is derived */
        json_t *given_omp = json_object_get(r, "original_max_position_embeddings"), *given_f = json_object_get(r, "factor");
        if (given_omp && !json_is_null(given_omp) && s->original_max_position_embeddings <= 0)
            return dcp_fail("%s: rope type yarn: original_max_position_embeddings %d must be positive", path,
                            s->original_max_position_embeddings);
        if (s->original_max_position_embeddings <= 0) s->original_max_position_embeddings = c->max_seq_len;
        if (given_f && !json_is_null(given_f) && !(s->factor > 0))
            return dcp_fail("%s: rope type yarn: factor %g must be positive", path, (double)s->factor);
        if (!(s->factor > 0)) s->factor = (float)c->max_seq_len / (float)s->original_max_position_embeddings;
        if (!(s->factor > 0) || !(s->beta_fast > 0) || !(s->beta_slow > 0))
            return dcp_fail("%s: rope type yarn needs positive factor, beta_fast and beta_slow", path);
        /* the cos/sin scale, as transformers derives it when none is given */
        float attention = 0, mscale = 0, mscale_all = 0;
        if (get_float(r, "attention_factor", &attention, path) || get_float(r, "mscale", &mscale, path) ||
            get_float(r, "mscale_all_dim", &mscale_all, path))
            return -1;
        json_t *given_a = json_object_get(r, "attention_factor");
        if (given_a && !json_is_null(given_a) && !(attention > 0))
            return dcp_fail("%s: rope type yarn: attention_factor %g must be positive", path, (double)attention);
        if (attention > 0) {
            s->attention_factor = attention;
        } else {
#define YARN_MSCALE(scale, m) ((scale) <= 1 ? 1.0 : 0.1 * (m) * log(scale) + 1.0)
            s->attention_factor = mscale && mscale_all ? (float)(YARN_MSCALE(s->factor, mscale) /
                                                                 YARN_MSCALE(s->factor, mscale_all))
                                                       : (float)YARN_MSCALE(s->factor, 1.0);
#undef YARN_MSCALE
        }
    } else if (!strcmp(type, "dynamic")) {
        return dcp_fail("%s: rope type dynamic is not supported (its frequencies change with the sequence length); "
                        "supported: default, linear, llama3, yarn",
                        path);
    } else {
        return dcp_fail("%s: rope type \"%s\" is not supported; supported: default, linear, llama3, yarn", path,
                        type);
    }
    return 0;
}

/* ---- the sliding window -------------------------------------------------- */

static int read_window(json_t *root, const Arch *a, Config *c, const char *path)
{
    c->sliding_window = 0;
    c->window_first_layer = 0;
    int window = 0, use = a->window == WINDOW_ALL, first = 0;
    if (a->window != WINDOW_NONE && get_int(root, "sliding_window", &window, path)) return -1;
    if (a->window == WINDOW_UPPER) {
        first = c->n_layers;
        if (get_bool(root, "use_sliding_window", &use, path) || get_int(root, "max_window_layers", &first, path))
            return -1;
    }
    if (use && window > 0) {
        c->sliding_window = window;
        c->window_first_layer = first < c->n_layers ? (first > 0 ? first : 0) : c->n_layers;
    } else if (use && json_is_integer(json_object_get(root, "sliding_window")) && window <= 0) {
        return dcp_fail("%s: sliding_window %d must be positive", path, window);
    }
    /* layer_types, when given, must say the same */
    json_t *types = json_object_get(root, "layer_types");
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || (int)json_array_size(types) != c->n_layers)
            return dcp_fail("%s: \"layer_types\" must list one type per layer (%d)", path, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            int sliding = c->sliding_window > 0 && l >= c->window_first_layer;
            if (!t || (strcmp(t, "full_attention") && strcmp(t, "sliding_attention")))
                return dcp_fail("%s: layer_types[%d] is not \"full_attention\" or \"sliding_attention\"", path, l);
            if ((strcmp(t, "sliding_attention") == 0) != sliding)
                return dcp_fail("%s: layer_types[%d] is \"%s\", but sliding_window, use_sliding_window and "
                                "max_window_layers make it %s",
                                path, l, t, sliding ? "sliding_attention" : "full_attention");
        }
    }
    return 0;
}

/* eos_token_id: an id or a list of them, added to c's (once each) */
static void add_eos_ids(json_t *v, Config *c)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX) continue;
        config_add_eos(c, (int)json_integer_value(e));
    }
}

int arch_read_generation_config(const char *path, const char *text, size_t len, Config *c)
{
    json_error_t err;
    json_t *root = json_loadb(text, len, 0, &err);
    if (!json_is_object(root)) {
        json_decref(root);
        return dcp_fail("%s:%d: not a JSON object%s%s", path, err.line, root ? "" : ": ", root ? "" : err.text);
    }
    add_eos_ids(json_object_get(root, "eos_token_id"), c);
    json_decref(root);
    return 0;
}

/* Kimi K2.5's multimodal config, by architecture or model_type */
#define WRAPPER_NAME "KimiK25ForConditionalGeneration"
static int is_wrapper(json_t *root)
{
    const char *name = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
    const char *type = json_string_value(json_object_get(root, "model_type"));
    return (name && !strcmp(name, WRAPPER_NAME)) || (type && !strcmp(type, "kimi_k25"));
}

/* GLM-4.5/4.6's experts into c->moe: DeepSeek-V3's router (sigmoid scores
 * with a correction bias, the best topk_group of n_group groups by their
 * two best experts, renormalized when norm_topk_prob, scaled by
 * routed_scaling_factor), n_shared_experts beside them, and the first
 * first_k_dense_replace layers dense (intermediate_size). */
static int read_glm_moe(json_t *root, const char *arch, const char *path, Config *c)
{
    MoeConfig *moe = &c->moe;
    memset(moe, 0, sizeof *moe);
    moe->n_group = moe->topk_group = moe->moe_layer_freq = moe->first_k_dense_replace = moe->n_shared_experts = 1;
    moe->routed_scaling_factor = 1.0f;
    moe->norm_topk_prob = 1;
    moe->sigmoid = 1;
    moe->route = ROUTE_NOAUX_TC;
    moe->n_routed_experts = 128;
    moe->experts_per_token = 8;
    moe->moe_hidden = 1408; /* transformers' defaults, for fields a config leaves out */
    int mtp = 0;
    if (get_int(root, "n_routed_experts", &moe->n_routed_experts, path) ||
        get_int(root, "num_experts_per_tok", &moe->experts_per_token, path) ||
        get_int(root, "moe_intermediate_size", &moe->moe_hidden, path) ||
        get_int(root, "n_shared_experts", &moe->n_shared_experts, path) ||
        get_int(root, "first_k_dense_replace", &moe->first_k_dense_replace, path) ||
        get_int(root, "n_group", &moe->n_group, path) || get_int(root, "topk_group", &moe->topk_group, path) ||
        get_bool(root, "norm_topk_prob", &moe->norm_topk_prob, path) ||
        get_float(root, "routed_scaling_factor", &moe->routed_scaling_factor, path) ||
        get_int(root, "num_nextn_predict_layers", &mtp, path))
        return -1;
    if (moe->n_routed_experts < 2 || moe->n_routed_experts > 1 << 16 || moe->experts_per_token < 1 ||
        moe->experts_per_token > moe->n_routed_experts || moe->moe_hidden < 1 || moe->moe_hidden > 1 << 20 ||
        moe->n_shared_experts < 0 || moe->n_shared_experts > 1 << 8)
        return dcp_fail("%s: n_routed_experts %d (2 to 65536), num_experts_per_tok %d (1 to n_routed_experts), "
                        "moe_intermediate_size %d (1 to 2^20) or n_shared_experts %d (0 to 256) out of range",
                        path, moe->n_routed_experts, moe->experts_per_token, moe->moe_hidden, moe->n_shared_experts);
    if (moe->n_group < 1 || moe->n_routed_experts % moe->n_group || moe->n_routed_experts / moe->n_group < 2 ||
        moe->topk_group < 1 || moe->topk_group > moe->n_group)
        return dcp_fail("%s: n_group %d must divide n_routed_experts %d into groups of two or more, and topk_group "
                        "%d be from 1 to n_group",
                        path, moe->n_group, moe->n_routed_experts, moe->topk_group);
    if (moe->first_k_dense_replace < 0 || moe->first_k_dense_replace > c->n_layers)
        return dcp_fail("%s: first_k_dense_replace %d must be from 0 to num_hidden_layers %d", path,
                        moe->first_k_dense_replace, c->n_layers);
    if (mtp < 0 || mtp > 1 << 12)
        return dcp_fail("%s: num_nextn_predict_layers %d out of range (0 to 4096)", path, mtp);
    c->mtp_layers = mtp; /* their tensors (layers from num_hidden_layers on) are skipped */
    json_t *q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q))
        return dcp_fail("%s: quantization_config is not supported for %s (bf16 or fp32 checkpoints)", path, arch);
    return 0;
}

/* Qwen3-MoE's experts into c->moe: every layer a mixture of num_experts
 * of moe_intermediate_size rows, num_experts_per_tok per token by softmax
 * scores (renormalized when norm_topk_prob), no shared experts. */
static int read_qwen_moe(json_t *root, const char *arch, const char *path, Config *c)
{
    MoeConfig *moe = &c->moe;
    memset(moe, 0, sizeof *moe);
    moe->n_group = moe->topk_group = moe->moe_layer_freq = 1;
    moe->routed_scaling_factor = 1.0f;
    moe->route = ROUTE_GREEDY;
    int step = 1;
    json_t *only = json_object_get(root, "mlp_only_layers");
    static const char *required[] = {"num_experts", "num_experts_per_tok", "moe_intermediate_size"};
    int *req[] = {&moe->n_routed_experts, &moe->experts_per_token, &moe->moe_hidden};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(root, required[i]);
        if (!v || json_is_null(v)) return dcp_fail("%s: missing \"%s\"", path, required[i]);
        if (get_int(root, required[i], req[i], path)) return -1;
    }
    if (get_int(root, "decoder_sparse_step", &step, path) ||
        get_bool(root, "norm_topk_prob", &moe->norm_topk_prob, path))
        return -1;
    if (moe->n_routed_experts < 1 || moe->n_routed_experts > 1 << 16 || moe->experts_per_token < 1 ||
        moe->experts_per_token > moe->n_routed_experts || moe->moe_hidden < 1 || moe->moe_hidden > 1 << 20)
        return dcp_fail("%s: num_experts %d (1 to 65536), num_experts_per_tok %d (1 to num_experts) and "
                        "moe_intermediate_size %d (1 to 2^20) out of range",
                        path, moe->n_routed_experts, moe->experts_per_token, moe->moe_hidden);
    if (step != 1 || (only && !json_is_null(only) && (!json_is_array(only) || json_array_size(only))))
        return dcp_fail("%s: %s with dense layers (decoder_sparse_step %d, mlp_only_layers) is not supported: "
                        "dcpinfer runs every layer's feed-forward block as its experts",
                        path, arch, step);
    json_t *q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q))
        return dcp_fail("%s: quantization_config is not supported for %s (bf16 or fp32 checkpoints)", path, arch);
    return 0;
}

int arch_read_config(const char *path, const char *text, size_t len, Config *c)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return dcp_fail("%s:%d: %s", path, jerr.line, jerr.text);
    int rc = -1;
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) {
        dcp_fail("%s: not a JSON object", path);
        goto out;
    }
    /* Kimi K2.5/K2.6 wrap the language model in a multimodal config: read
     * its text_config, with the top level's quantization_config */
    int wrapped = is_wrapper(root);
    if (wrapped) {
        json_t *tc = json_object_get(root, "text_config"), *q = json_object_get(root, "quantization_config");
        if (!json_is_object(tc)) {
            dcp_fail("%s: %s without a \"text_config\" object", path, WRAPPER_NAME);
            goto out;
        }
        if (q && !json_object_get(tc, "quantization_config")) json_object_set(tc, "quantization_config", q);
        json_incref(tc);
        json_decref(root);
        root = tc;
    }
    /* the architecture before anything else: a Gemma config is "not
     * supported", not "gelu not supported" */
    int ai = find_arch(root, path);
    if (ai < 0) goto out;
    const Arch *a = &arch_table[ai];
    c->arch = ai;
    if (wrapped && !a->mla) {
        dcp_fail("%s: %s around %s: dcpinfer reads a DeepSeek-V3 language model there", path, WRAPPER_NAME, a->name);
        goto out;
    }
    c->rope_style = ROPE_ROTATE_HALF;
    c->format = FORMAT_HF;
    c->bos_id = -1;
    c->max_seq_len = 2048;
    c->norm_eps = 1e-6f;
    if (a->mla) {
        rc = read_deepseek(root, a->name, a->mla == 2, path, c);
        c->wrapped = wrapped;
        goto out;
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        dcp_fail("%s: hidden_act %s is not supported (silu only)", path,
                 json_is_string(act) ? json_string_value(act) : "(not a string)");
        goto out;
    }
    static const char *required[] = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                     "vocab_size"};
    int *req_out[] = {&c->dim, &c->hidden_dim, &c->n_layers, &c->n_heads, &c->vocab_size};
    for (int i = 0; i < 5; i++) {
        json_t *v = json_object_get(root, required[i]);
        if (!v || json_is_null(v)) {
            dcp_fail("%s: missing \"%s\"", path, required[i]);
            goto out;
        }
        if (get_int(root, required[i], req_out[i], path)) goto out;
    }
    c->n_kv_heads = c->n_heads;
    int attention_bias = 0, mlp_bias = 0;
    if (get_int(root, "num_key_value_heads", &c->n_kv_heads, path) ||
        get_int(root, "max_position_embeddings", &c->max_seq_len, path) ||
        get_int(root, "bos_token_id", &c->bos_id, path) || get_float(root, "rms_norm_eps", &c->norm_eps, path) ||
        get_bool(root, "tie_word_embeddings", &c->tied_embeddings, path) ||
        (a->attention_bias && get_bool(root, "attention_bias", &attention_bias, path)) ||
        (a->mlp_bias && get_bool(root, "mlp_bias", &mlp_bias, path)))
        goto out;
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    json_t *hd = json_object_get(root, "head_dim");
    if (hd && !json_is_null(hd)) {
        if (get_int(root, "head_dim", &c->head_dim, path)) goto out;
    } else if (c->n_heads > 0 && c->dim % c->n_heads) {
        dcp_fail("%s: hidden_size %d is not a multiple of num_attention_heads %d, and no head_dim is given", path,
                 c->dim, c->n_heads);
        goto out;
    }
    if (a->moe == 1 && read_qwen_moe(root, a->name, path, c)) goto out;
    if (a->moe == 2 && read_glm_moe(root, a->name, path, c)) goto out;
    c->qkv_bias = a->qkv_bias || attention_bias;
    c->o_bias = a->attention_bias == 1 && attention_bias; /* GLM's attention_bias: q/k/v only */
    c->mlp_bias = mlp_bias;
    c->qk_norm = a->qk_norm == 1;
    if (a->qk_norm == 2 && get_bool(root, "use_qk_norm", &c->qk_norm, path)) goto out;
    if (read_rope(root, c, path, a->moe == 2 ? 0.5f : 0) || read_window(root, a, c, path)) goto out;
    add_eos_ids(json_object_get(root, "eos_token_id"), c);
    rc = 0;
out:
    if (!rc) {
        const char *td = json_string_value(json_object_get(root, "torch_dtype"));
        if (!td) td = json_string_value(json_object_get(root, "dtype")); /* transformers 5's name */
        c->stored_bf16 = td && !strcmp(td, "bfloat16");
    }
    json_decref(root);
    return rc;
}

/* ---- compressed-tensors: which matrices are quantized ------------------ */

struct QuantRules {
    int glob;            /* names are shell patterns (ModelOpt's exclude_modules), else exact */
    int wrapped;         /* a wrapper's rules may name modules under WRAPPED_PREFIX too */
    int n[2];            /* entries of targets [0] and ignore [1] */
    char **name[2];      /* a module or class name, or NULL for a pattern */
    pcre2_code **re[2];  /* the pattern of a "re:" entry */
};

QuantRules *quant_rules_read(const char *config_path)
{
    char *text;
    size_t len;
    if (read_file(config_path, &text, &len)) return NULL;
    json_error_t err;
    json_t *root = json_loadb(text, len, 0, &err);
    free(text);
    json_t *q = json_object_get(root, "quantization_config");
    int wrapped = is_wrapper(root);
    if (wrapped && json_object_get(json_object_get(root, "text_config"), "quantization_config"))
        q = json_object_get(json_object_get(root, "text_config"), "quantization_config");
    json_t *g = json_object_get(q, "config_groups");
    json_t *lists[2] = {json_object_get(json_object_iter_value(json_object_iter(g)), "targets"),
                        json_object_get(q, "ignore")};
    QuantRules *r = xcalloc(1, sizeof *r);
    r->wrapped = wrapped;
    const char *qm = json_string_value(json_object_get(q, "quant_method"));
    json_t *all = json_pack("[s]", "Linear");
    if (qm && !strcmp(qm, "modelopt")) { /* every Linear but exclude_modules, shell patterns */
        lists[0] = all;
        lists[1] = json_object_get(q, "exclude_modules");
        r->glob = 1;
    }
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        if (lists[k] && !json_is_null(lists[k]) && !json_is_array(lists[k])) {
            rc = dcp_fail("%s: quantization_config %s must be a list of names", config_path, k ? "ignore" : "targets");
            break;
        }
        r->n[k] = (int)json_array_size(lists[k]);
        r->name[k] = xcalloc((size_t)r->n[k] + 1, sizeof(char *));
        r->re[k] = xcalloc((size_t)r->n[k] + 1, sizeof(pcre2_code *));
        for (int i = 0; i < r->n[k] && !rc; i++) {
            const char *e = json_string_value(json_array_get(lists[k], (size_t)i));
            if (!e) {
                rc = dcp_fail("%s: quantization_config %s[%d] is not a string", config_path, k ? "ignore" : "targets", i);
                break;
            }
            if (strncmp(e, "re:", 3)) {
                r->name[k][i] = xstrdup(e);
                continue;
            }
            int code;
            PCRE2_SIZE off;
            r->re[k][i] = pcre2_compile((PCRE2_SPTR)(e + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &code, &off, NULL);
            if (!r->re[k][i]) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(code, msg, sizeof msg);
                rc = dcp_fail("%s: quantization_config pattern \"%s\": %s at offset %zu", config_path, e,
                              (const char *)msg, (size_t)off);
            }
        }
    }
    json_decref(root);
    json_decref(all);
    if (rc) {
        quant_rules_free(r);
        return NULL;
    }
    return r;
}

static int rule_matches(const QuantRules *r, int k, const char *module, int linear)
{
    for (int i = 0; i < r->n[k]; i++) {
        if (r->name[k][i] && (!strcmp(r->name[k][i], module) || (linear && !strcmp(r->name[k][i], "Linear")) ||
                              (r->glob && !fnmatch(r->name[k][i], module, 0))))
            return 1;
        if (r->re[k][i]) {
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->re[k][i], NULL);
            int hit = pcre2_match(r->re[k][i], (PCRE2_SPTR)module, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL) >= 0;
            pcre2_match_data_free(md);
            if (hit) return 1;
        }
    }
    return 0;
}

int quant_rules_quantized(const QuantRules *r, const char *module, int linear)
{
    char full[256];
    snprintf(full, sizeof full, WRAPPED_PREFIX "%s", module);
    int target = rule_matches(r, 0, module, linear) || (r->wrapped && rule_matches(r, 0, full, linear));
    int ignore = rule_matches(r, 1, module, linear) || (r->wrapped && rule_matches(r, 1, full, linear));
    return target && !ignore;
}

void quant_rules_free(QuantRules *r)
{
    if (!r) return;
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < r->n[k]; i++) {
            free(r->name[k] ? r->name[k][i] : NULL);
            if (r->re[k] && r->re[k][i]) pcre2_code_free(r->re[k][i]);
        }
        free(r->name[k]);
        free(r->re[k]);
    }
    free(r);
}
