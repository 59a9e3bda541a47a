/* The mixture-of-experts block as the families have it: Qwen3-MoE's and
 * GLM-4.5's config fields (DeepSeek's are read with the rest of its
 * config, family_deepseek.c), and the tensors of any family's MoE block:
 * router, routed experts (each rank's share: TP slices or whole experts
 * under expert parallelism) and shared experts; the test models' MoE
 * shapes and defaults (dcpinfer-mkmodel). The block's layer is
 * engine/moe.c. */
#include <stdio.h>
#include <string.h>

#include "arch_impl.h"
#include "arch.h"
#include "manifest.h"
#include "mkmodel.h"
#include "util.h"

/* GLM-4.5/4.6's experts into c->moe: DeepSeek-V3's router (sigmoid scores
 * with a correction bias, the best topk_group of n_group groups by their
 * two best experts, renormalized when norm_topk_prob, scaled by
 * routed_scaling_factor), n_shared_experts beside them, and the first
 * first_k_dense_replace layers dense (intermediate_size). */
int glm4_moe_read_config(json_t *root, const char *arch, const char *path, Config *c)
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
int qwen3_moe_read_config(json_t *root, const char *arch, const char *path, Config *c)
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

int moe_tensors(const Config *c, const Shard *s, int l, MoeLayer *w, TensorSpec *out)
{
    const MoeConfig *moe = &c->moe;
    MoeLayer dummy = {0}; /* where nothing is loaded: only names and shapes are wanted */
    if (!w) w = &dummy;
    Shard whole;
    s = shard_or_whole(c, s, &whole);
    int n = 0, dim = c->dim;
    ADD("mlp.gate.weight", moe->n_routed_experts, dim, &w->router);
    if (moe->sigmoid) ADD("mlp.gate.e_score_correction_bias", 0, moe->n_routed_experts, &w->router_bias);
    for (int e = s->expert0; e < s->expert0 + s->experts; e++) {
        int mh = moe->moe_hidden, r0 = s->moe_hidden0, nr = s->moe_hidden;
        /* e's place in the stack of the experts held */
        size_t per = (size_t)nr * dim, at = (size_t)(e - s->expert0) * per, all = (size_t)s->experts * per;
        /* PUT with the expert's name written at once (layer_name) */
        PUT("", mh, dim, NULL, &w->e_gate, at, all, r0, nr, 0, dim);
        layer_name(out[n - 1].name, sizeof out[n - 1].name, l, "mlp.experts.", e, ".gate_proj.weight");
        PUT("", mh, dim, NULL, &w->e_up, at, all, r0, nr, 0, dim);
        layer_name(out[n - 1].name, sizeof out[n - 1].name, l, "mlp.experts.", e, ".up_proj.weight");
        PUT("", dim, mh, NULL, &w->e_down, at, all, 0, dim, r0, nr);
        layer_name(out[n - 1].name, sizeof out[n - 1].name, l, "mlp.experts.", e, ".down_proj.weight");
        out[n - 1].chunks = s->expert_chunks;
    }
    if (moe->n_shared_experts > 0) {
        int sh = moe->moe_hidden * moe->n_shared_experts, r0 = s->shared_hidden0, nr = s->shared_hidden;
        MSLICE("mlp.shared_experts.gate_proj.weight", sh, dim, &w->s_gate, r0, nr, 0, dim);
        MSLICE("mlp.shared_experts.up_proj.weight", sh, dim, &w->s_up, r0, nr, 0, dim);
        MSLICE("mlp.shared_experts.down_proj.weight", dim, sh, &w->s_down, 0, dim, r0, nr);
        out[n - 1].chunks = s->chunks;
    }
    return n;
}

/* dcpinfer-mkmodel's Qwen3-MoE and GLM-4.5 shapes: what their readers accept */
int moe_check_spec(const ModelSpec *s)
{
    const Arch *a = &arch_table[s->arch];
    const MoeConfig *moe = &s->moe;
    int D = s->head_dim ? s->head_dim : s->dim / s->heads;
    if (a->moe == 1 && (moe->n_routed_experts < 1 || moe->experts_per_token < 1 ||
                        moe->experts_per_token > moe->n_routed_experts || moe->moe_hidden < 1 || moe->n_shared_experts))
        return dcp_fail("Qwen3-MoE shape: experts and moe-hidden positive, experts-per-token at most experts, no "
                        "shared experts");
    int R = (int)((float)D * (s->partial_rotary ? s->partial_rotary : 0.5f));
    if (a->moe == 2 &&
        (moe->n_routed_experts < 2 || moe->experts_per_token < 1 || moe->experts_per_token > moe->n_routed_experts ||
         moe->moe_hidden < 1 || moe->n_shared_experts < 0 || moe->n_group < 1 ||
         moe->n_routed_experts % moe->n_group || moe->n_routed_experts / moe->n_group < 2 || moe->topk_group < 1 ||
         moe->topk_group > moe->n_group || moe->first_k_dense_replace < 0 || moe->first_k_dense_replace > s->layers ||
         R < 2 || R % 2 || R > D))
        return dcp_fail("GLM-4.5 shape: experts (two or more per group) and moe-hidden positive, experts-per-token "
                        "at most experts, topk-group at most n-group, first-dense at most layers, and an even "
                        "rotated part of the head");
    return 0;
}

/* A generated Qwen3-MoE or GLM-4.5 model's MoE block, as their readers
 * read the written config back */
void moe_spec_config(const ModelSpec *s, Config *c)
{
    c->moe = s->moe;
    if (arch_table[s->arch].moe == 2)
        c->rotary_dim = (int)((float)c->head_dim * (s->partial_rotary ? s->partial_rotary : 0.5f));
    c->format = FORMAT_HF;
}

void mkmodel_moe_defaults(ModelSpec *s)
{
    MoeConfig *moe = &s->moe;
    if (arch_table[s->arch].moe == 2) { /* GLM-4.5: DeepSeek-V3's router, a shared expert, the first layer dense */
        if (!moe->n_routed_experts) moe->n_routed_experts = 8;
        if (moe->n_shared_experts < 0) moe->n_shared_experts = 1;
        if (!moe->experts_per_token) moe->experts_per_token = 2;
        if (!moe->moe_hidden) moe->moe_hidden = 32;
        if (!moe->n_group) moe->n_group = 1;
        if (!moe->topk_group) moe->topk_group = 1;
        if (!moe->routed_scaling_factor) moe->routed_scaling_factor = 1.0f;
        moe->moe_layer_freq = 1;
        moe->sigmoid = 1;
        moe->route = ROUTE_NOAUX_TC;
        return;
    }
    if (!moe->n_routed_experts) moe->n_routed_experts = 8;
    if (moe->n_shared_experts < 0) moe->n_shared_experts = 0;
    if (!moe->experts_per_token) moe->experts_per_token = 2;
    if (!moe->moe_hidden) moe->moe_hidden = 32;
    moe->n_group = moe->topk_group = moe->moe_layer_freq = 1;
    moe->routed_scaling_factor = 1.0f;
    moe->route = ROUTE_GREEDY;
    moe->norm_topk_prob = 1; /* as Qwen3-MoE's releases */
}
