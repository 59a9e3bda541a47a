/* The Llama family: Llama, Mistral, Qwen2, Qwen3, and with MoE blocks
 * Qwen3-MoE and GLM-4.5 (family_moe.c reads those). What its config.json
 * holds and allows: shapes, grouped-query attention with the biases,
 * q/k norms and sliding windows its row in arch_table says the
 * architecture has, RoPE (partial for GLM-4.5). Its tensors are the dense
 * kinds of hparams.h, loaded as per-layer stacks; its layer is
 * engine/layer_dense.c. */
#include <string.h>

#include "arch.h"
#include "arch_impl.h"
#include "util.h"

/* sliding_window and its switches, as the row's kind of window reads them */
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

int llama_read_config(json_t *root, const Arch *a, const char *path, Config *c)
{
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        return dcp_fail("%s: hidden_act %s is not supported (silu only)", path,
                        json_is_string(act) ? json_string_value(act) : "(not a string)");
    }
    static const char *required[] = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                     "vocab_size"};
    int *req_out[] = {&c->dim, &c->hidden_dim, &c->n_layers, &c->n_heads, &c->vocab_size};
    for (int i = 0; i < 5; i++) {
        json_t *v = json_object_get(root, required[i]);
        if (!v || json_is_null(v)) return dcp_fail("%s: missing \"%s\"", path, required[i]);
        if (get_int(root, required[i], req_out[i], path)) return -1;
    }
    c->n_kv_heads = c->n_heads;
    int attention_bias = 0, mlp_bias = 0;
    if (get_int(root, "num_key_value_heads", &c->n_kv_heads, path) ||
        get_int(root, "max_position_embeddings", &c->max_seq_len, path) ||
        get_int(root, "bos_token_id", &c->bos_id, path) || get_float(root, "rms_norm_eps", &c->norm_eps, path) ||
        get_bool(root, "tie_word_embeddings", &c->tied_embeddings, path) ||
        (a->attention_bias && get_bool(root, "attention_bias", &attention_bias, path)) ||
        (a->mlp_bias && get_bool(root, "mlp_bias", &mlp_bias, path)))
        return -1;
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    json_t *hd = json_object_get(root, "head_dim");
    if (hd && !json_is_null(hd)) {
        if (get_int(root, "head_dim", &c->head_dim, path)) return -1;
    } else if (c->n_heads > 0 && c->dim % c->n_heads) {
        return dcp_fail("%s: hidden_size %d is not a multiple of num_attention_heads %d, and no head_dim is given",
                        path, c->dim, c->n_heads);
    }
    if (a->moe == 1 && qwen3_moe_read_config(root, a->name, path, c)) return -1;
    if (a->moe == 2 && glm4_moe_read_config(root, a->name, path, c)) return -1;
    c->qkv_bias = a->qkv_bias || attention_bias;
    c->o_bias = a->attention_bias == 1 && attention_bias; /* GLM's attention_bias: q/k/v only */
    c->mlp_bias = mlp_bias;
    c->qk_norm = a->qk_norm == 1;
    if (a->qk_norm == 2 && get_bool(root, "use_qk_norm", &c->qk_norm, path)) return -1;
    if (read_rope(root, c, path, a->moe == 2 ? 0.5f : 0) || read_window(root, a, c, path)) return -1;
    add_eos_ids(json_object_get(root, "eos_token_id"), c);
    return 0;
}
