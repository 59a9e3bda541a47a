#define PCRE2_CODE_UNIT_WIDTH 8
#include "arch.h"

#include <jansson.h>
#include <fnmatch.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_impl.h"
#include "util.h"

const Arch arch_table[] = {
    /* name                 model_type  qkv_bias attention_bias mlp_bias qk_norm window  mla family alias moe reader */
    {"LlamaForCausalLM",   "llama",    0,       1,             1,       0,      WINDOW_NONE,  0, FAMILY_DENSE, NULL, 0,
     llama_read_config},
    {"MistralForCausalLM", "mistral",  0,       0,             0,       0,      WINDOW_ALL,   0, FAMILY_DENSE, NULL, 0,
     llama_read_config},
    {"Qwen2ForCausalLM",   "qwen2",    1,       0,             0,       0,      WINDOW_UPPER, 0, FAMILY_DENSE, NULL, 0,
     llama_read_config},
    {"Qwen3ForCausalLM",   "qwen3",    0,       1,             0,       1,      WINDOW_UPPER, 0, FAMILY_DENSE, NULL, 0,
     llama_read_config},
    {"DeepseekV2ForCausalLM", "deepseek_v2", 0,  0,             0,       0,      WINDOW_NONE, 1, FAMILY_MLA, NULL, 0,
     deepseek_read_config},
    {"DeepseekV3ForCausalLM", "deepseek_v3", 0,  0,             0,       0,      WINDOW_NONE, 2, FAMILY_MLA, "kimi_k2", 0,
     deepseek_read_config},
    {"Qwen3MoeForCausalLM", "qwen3_moe", 0,     1,             0,       1,      WINDOW_UPPER, 0, FAMILY_DENSE, NULL, 1,
     llama_read_config},
    {"Glm4MoeForCausalLM", "glm4_moe",  0,       2,             0,       2,      WINDOW_NONE,  0, FAMILY_DENSE, NULL, 2,
     llama_read_config},
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

int get_int(json_t *o, const char *key, int *out, const char *path)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return dcp_fail("%s: \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < INT32_MIN || x > INT32_MAX) return dcp_fail("%s: \"%s\" is %lld, out of range", path, key, (long long)x);
    *out = (int)x;
    return 0;
}

int get_float(json_t *o, const char *key, float *out, const char *path)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return dcp_fail("%s: \"%s\" must be a finite number", path, key);
    *out = (float)json_number_value(v);
    return 0;
}

int get_bool(json_t *o, const char *key, int *out, const char *path)
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

/* ---- fields every family reads ------------------------------------------ */

/* A string field that must be one of the choices (NULL-terminated; the
 * first is the default when absent); its index, or -1 with the message. */
int get_choice(json_t *o, const char *key, const char *const *choices, const char *arch, const char *path)
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

/* ModelOpt's settings in one form: {quant_algo, group_size,
 * kv_cache_quant_algo, exclude_modules}, from config.json's
 * quantization_config (quant_method "modelopt": quant_algo, group_size,
 * kv_cache_quant_algo or an 8-bit float kv_cache_scheme, ignore) and from
 * hf_quant_config.json beside config_path (quantization: quant_algo,
 * group_size, kv_cache_quant_algo, exclude_modules). Where both exist they
 * must agree (the module lists as sets); q NULL: the file alone, as older
 * exports ship. A new reference, or NULL with the message. */
static json_t *modelopt_settings(json_t *q, const char *config_path)
{
    json_t *out[2] = {NULL, NULL};
    if (q && !json_is_null(q)) {
        json_t *kv = json_object_get(q, "kv_cache_quant_algo"), *scheme = json_object_get(q, "kv_cache_scheme");
        json_t *ex = json_object_get(q, "ignore");
        if (!kv && json_is_object(scheme)) /* as vLLM maps it */
            kv = json_integer_value(json_object_get(scheme, "num_bits")) == 8 &&
                         json_string_value(json_object_get(scheme, "type")) &&
                         !strcmp(json_string_value(json_object_get(scheme, "type")), "float")
                     ? json_string("FP8")
                     : json_string("(kv_cache_scheme)");
        else
            kv = json_incref(kv);
        out[0] = json_pack("{s:O?, s:O?, s:o?, s:O?}", "quant_algo", json_object_get(q, "quant_algo"), "group_size",
                           json_object_get(q, "group_size"), "kv_cache_quant_algo", kv, "exclude_modules", ex);
    }
    char *file = path_beside(config_path, "hf_quant_config.json");
    if (path_exists(file)) {
        json_error_t err;
        json_t *root = json_load_file(file, 0, &err), *h = json_object_get(root, "quantization");
        if (!root || !json_is_object(h)) {
            if (root) dcp_fail("%s: no \"quantization\" object", file);
            else dcp_fail("%s:%d: %s", file, err.line, err.text);
            json_decref(root);
            json_decref(out[0]);
            free(file);
            return NULL;
        }
        out[1] = json_pack("{s:O?, s:O?, s:O?, s:O?}", "quant_algo", json_object_get(h, "quant_algo"), "group_size",
                           json_object_get(h, "group_size"), "kv_cache_quant_algo",
                           json_object_get(h, "kv_cache_quant_algo"), "exclude_modules",
                           json_object_get(h, "exclude_modules"));
        json_decref(root);
    }
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        json_t *ex = json_object_get(out[k], "exclude_modules");
        if (ex && !json_is_null(ex) && !json_is_array(ex))
            rc = dcp_fail("%s: %s must be a list of module patterns", k ? file : config_path,
                          k ? "exclude_modules" : "quantization_config ignore");
        for (size_t i = 0; !rc && i < json_array_size(ex); i++)
            if (!json_is_string(json_array_get(ex, i)))
                rc = dcp_fail("%s: %s[%zu] is not a string", k ? file : config_path,
                              k ? "exclude_modules" : "quantization_config ignore", i);
    }
    if (!rc && out[0] && out[1]) { /* the two must say the same */
        static const char *const keys[] = {"quant_algo", "group_size", "kv_cache_quant_algo"};
        for (int i = 0; i < 3 && !rc; i++) {
            json_t *a = json_object_get(out[0], keys[i]), *b = json_object_get(out[1], keys[i]);
            if (json_is_null(a)) a = NULL;
            if (json_is_null(b)) b = NULL;
            if (a && b ? !json_equal(a, b) : i != 1 && a != b) {
                char *sa = a ? json_dumps(a, JSON_ENCODE_ANY) : NULL, *sb = b ? json_dumps(b, JSON_ENCODE_ANY) : NULL;
                rc = dcp_fail("%s: quantization_config %s is %s, but %s says %s", config_path, keys[i],
                              sa ? sa : "absent", file, sb ? sb : "absent");
                free(sa);
                free(sb);
            }
        }
        json_t *ea = json_object_get(out[0], "exclude_modules"), *eb = json_object_get(out[1], "exclude_modules");
        for (int side = 0; side < 2 && !rc; side++) {
            json_t *from = side ? eb : ea, *to = side ? ea : eb;
            for (size_t i = 0; i < json_array_size(from) && !rc; i++) {
                size_t j = 0;
                while (j < json_array_size(to) && !json_equal(json_array_get(from, i), json_array_get(to, j))) j++;
                if (j == json_array_size(to))
                    rc = dcp_fail("%s: \"%s\" is in %s but not in %s: the two files must exclude the same modules",
                                  config_path, json_string_value(json_array_get(from, i)),
                                  side ? "hf_quant_config.json's exclude_modules" : "quantization_config's ignore",
                                  side ? "quantization_config's ignore" : "hf_quant_config.json's exclude_modules");
            }
        }
    }
    free(file);
    json_t *r = out[0] ? out[0] : out[1];
    json_decref(r == out[0] ? out[1] : out[0]);
    if (rc || !r) {
        json_decref(r);
        if (!rc) dcp_fail("%s: no ModelOpt quantization settings", config_path);
        return NULL;
    }
    return r;
}

/* compressed-tensors' kv_cache_scheme: none, or FP8 E4M3 with a static
 * per-tensor scale per layer (k_scale, v_scale) */
static int read_kv_scheme(json_t *kv, QuantConfig *m, const char *path)
{
    if (!kv || json_is_null(kv)) return 0;
    const char *type = json_string_value(json_object_get(kv, "type"));
    const char *strategy = json_string_value(json_object_get(kv, "strategy"));
    json_t *dyn = json_object_get(kv, "dynamic"), *sym = json_object_get(kv, "symmetric");
    if (!json_is_object(kv) || !type || strcmp(type, "float") || json_integer_value(json_object_get(kv, "num_bits")) != 8 ||
        (strategy && strcmp(strategy, "tensor")) || (dyn && !json_is_false(dyn)) || json_is_false(sym))
        return dcp_fail("%s: quantization_config: kv_cache_scheme must be 8-bit floats with a static scale per tensor "
                        "(FP8 k_scale and v_scale per layer)",
                        path);
    m->kv_fp8 = 1;
    return 0;
}

/* quantization_config: block-scaled FP8 (DeepSeek-V3's own), or
 * compressed-tensors' pack-quantized INT4 W4A16 (Kimi K2's experts: one
 * config group of symmetric 4-bit integers in groups along the input,
 * activations unquantized). Anything else is refused by name. */
int read_quantization(json_t *q, QuantConfig *m, const char *path)
{
    const char *qm = json_string_value(json_object_get(q, "quant_method"));
    if (!q || json_is_null(q)) { /* none, or a ModelOpt export's hf_quant_config.json alone */
        char *file = path_beside(path, "hf_quant_config.json");
        int there = path_exists(file);
        free(file);
        if (!there) return 0;
        q = NULL;
        qm = "modelopt";
    }
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
            if (ia && !json_is_null(ia)) { /* W4A4: activations in dynamic groups of 16 too */
                const char *it = json_string_value(json_object_get(ia, "type"));
                const char *is = json_string_value(json_object_get(ia, "strategy"));
                json_t *dyn = json_object_get(ia, "dynamic");
                if (!json_is_object(ia) || !it || strcmp(it, "float") ||
                    json_integer_value(json_object_get(ia, "num_bits")) != 4 || !is || strcmp(is, "tensor_group") ||
                    json_integer_value(json_object_get(ia, "group_size")) != 16 || !json_is_string(dyn) ||
                    strcmp(json_string_value(dyn), "local"))
                    return dcp_fail("%s: quantization_config: NVFP4 input_activations must be 4-bit floats in "
                                    "tensor groups of 16, dynamic \"local\" (as compressed-tensors' NVFP4 scheme)",
                                    path);
                m->nvfp4_w4a4 = 1;
            }
            if (read_kv_scheme(kv, m, path)) return -1;
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
        if (read_kv_scheme(kv, m, path)) return -1;
        m->int4_group = (int)json_integer_value(gs);
        return 0;
    }
    if (qm && !strcmp(qm, "modelopt")) { /* NVIDIA ModelOpt's NVFP4 export */
        json_t *mo = modelopt_settings(q, path);
        if (!mo) return -1;
        const char *algo = json_string_value(json_object_get(mo, "quant_algo"));
        json_t *gs = json_object_get(mo, "group_size"), *kv = json_object_get(mo, "kv_cache_quant_algo");
        int rc = 0;
        if (!algo || strcmp(algo, "NVFP4"))
            rc = dcp_fail("%s: quantization_config: modelopt quant_algo %s is not supported (NVFP4 only)", path,
                          algo ? algo : "(none)");
        else if (gs && !json_is_null(gs) && json_integer_value(gs) != 16)
            rc = dcp_fail("%s: quantization_config: NVFP4 group_size %lld is not supported (16)", path,
                          (long long)json_integer_value(gs));
        else if (kv && !json_is_null(kv) && (!json_is_string(kv) || strcmp(json_string_value(kv), "FP8")))
            rc = dcp_fail("%s: quantization_config: kv_cache_quant_algo %s is not supported (FP8, or none)", path,
                          json_is_string(kv) ? json_string_value(kv) : "(not a string)");
        m->kv_fp8 = kv && json_is_string(kv) && !strcmp(json_string_value(kv), "FP8");
        json_decref(mo);
        if (rc) return rc;
        m->nvfp4_group = 16;
        m->nvfp4_modelopt = 1;
        m->nvfp4_round_bf16 = 1;
        m->nvfp4_w4a4 = 1; /* ModelOpt's NVFP4 quantizes activations: every Linear has its input_scale */
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
        return dcp_fail("%s: quantization_config fp8 needs \"weight_block_size\": [rows, cols], each from 1 to "
                        "1048576",
                        path);
    /* static activation scales (an input_scale per Linear, which dcpinfer
     * would not apply): refused rather than run differently from the
     * checkpoint's own numerics */
    const char *as = json_string_value(json_object_get(q, "activation_scheme"));
    if (json_object_get(q, "activation_scheme") && (!as || strcmp(as, "dynamic")))
        return dcp_fail("%s: quantization_config fp8 \"activation_scheme\": %s is not supported (dynamic only: "
                        "dcpinfer keeps activations unquantized, as a dynamic scheme's weight-only reading)",
                        path, as ? as : "(not a string)");

    m->fp8_block[0] = (int)json_integer_value(json_array_get(bs, 0));
    m->fp8_block[1] = (int)json_integer_value(json_array_get(bs, 1));
    return 0;
}

/* ---- RoPE ---------------------------------------------------------------- */

/* The rope block, spelled rope_parameters (transformers 5) or rope_scaling
 * (older), with its type as "rope_type" or "type". partial: the
 * architecture rotates the first partial_rotary_factor of each head (this
 * its default, GLM-4.5's 0.5; given at the top level or in the block);
 * 0: it rotates whole heads, and a factor other than 1 is refused. */
int read_rope(json_t *root, Config *c, const char *path, float partial)
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

/* eos_token_id: an id or a list of them, added to c's (once each) */
void add_eos_ids(json_t *v, Config *c)
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
    c->wrapped = wrapped;
    rc = a->read_config(root, a, path, c);
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
    int prefix;          /* a name also matches the modules under it and those it ends (fp8's
                          * modules_to_not_convert: "lm_head", "model.layers.0.mlp", "mlp.gate") */
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
    json_t *mo = NULL;
    char *hf = path_beside(config_path, "hf_quant_config.json");
    if ((qm && !strcmp(qm, "modelopt")) || (!q && path_exists(hf))) {
        /* every Linear but the excluded, shell patterns (ModelOpt's own) */
        if (!(mo = modelopt_settings(q, config_path))) {
            free(hf);
            json_decref(root);
            json_decref(all);
            free(r);
            return NULL;
        }
        lists[0] = all;
        lists[1] = json_object_get(mo, "exclude_modules");
        r->glob = 1;
    } else if (qm && !strcmp(qm, "fp8")) { /* every Linear but modules_to_not_convert, in bf16 */
        lists[0] = all;
        lists[1] = json_object_get(q, "modules_to_not_convert");
        r->prefix = 1;
    }
    free(hf);
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        if (lists[k] && !json_is_null(lists[k]) && !json_is_array(lists[k])) {
            rc = dcp_fail("%s: quantization_config %s must be a list of names", config_path,
                          k ? (r->prefix ? "modules_to_not_convert" : "ignore") : "targets");
            break;
        }
        r->n[k] = (int)json_array_size(lists[k]);
        r->name[k] = xcalloc((size_t)r->n[k] + 1, sizeof(char *));
        r->re[k] = xcalloc((size_t)r->n[k] + 1, sizeof(pcre2_code *));
        for (int i = 0; i < r->n[k] && !rc; i++) {
            const char *e = json_string_value(json_array_get(lists[k], (size_t)i));
            if (!e) {
                rc = dcp_fail("%s: quantization_config %s[%d] is not a string", config_path,
                              k ? (r->prefix ? "modules_to_not_convert" : "ignore") : "targets", i);
                break;
            }
            if (r->glob || r->prefix || strncmp(e, "re:", 3)) {
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
    json_decref(mo);
    if (rc) {
        quant_rules_free(r);
        return NULL;
    }
    return r;
}

/* module is name, lies under it (name.) or ends with it (.name) */
static int prefix_match(const char *name, const char *module)
{
    size_t n = strlen(name), m = strlen(module);
    if (n > m) return 0;
    return (!strncmp(module, name, n) && (m == n || module[n] == '.')) ||
           (m > n && module[m - n - 1] == '.' && !strcmp(module + m - n, name));
}

static int rule_matches(const QuantRules *r, int k, const char *module, int linear)
{
    for (int i = 0; i < r->n[k]; i++) {
        if (r->prefix && r->name[k][i] && k == 1) {
            if (prefix_match(r->name[k][i], module)) return 1;
            continue;
        }
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
