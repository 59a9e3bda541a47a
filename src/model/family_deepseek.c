/* The DeepSeek-V2/V3 family (and Kimi K2, its model_type kimi_k2): what
 * its config.json holds and allows, the tensors of each layer (latent
 * attention, then a dense feed-forward block or a MoE block, moe_tensors),
 * the fold of kv_b_proj into the absorbed attention at load, and its test
 * models' shapes and defaults (dcpinfer-mkmodel). Its layer is
 * engine/layer_mla.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "arch_impl.h"
#include "manifest.h"
#include "mkmodel.h"
#include "util.h"

/* Reads and checks a DeepSeek-V2/V3 config (docs/models.md) into c. */
int deepseek_read_config(json_t *root, const Arch *a, const char *path, Config *cp)
{
    const char *arch = a->name;
    int v3 = a->mla == 2;
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
    if (read_quantization(q, &c.quant, path)) return -1; /* none, or config.json's / hf_quant_config.json's */
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

/* Each tensor of layer l of an MLA model: its name, shape and where its
 * weights go (dst may be NULL when only checking); returns the count. */
int mla_tensors(const Config *c, const Shard *s, int l, MlaLayer *w, TensorSpec *out)
{
    const MlaConfig *m = &c->m;
    MlaLayer dummy = {0}; /* where nothing is loaded: only names and shapes are wanted */
    if (!w) w = &dummy;
    int n = 0, H = c->n_heads, qk = m->qk_nope_head_dim + m->qk_rope_head_dim, dim = c->dim;
    Shard whole;
    s = shard_or_whole(c, s, &whole);
    int hq = s->q_heads, h0 = s->q_head0;
    ADD("input_layernorm.weight", 0, dim, &w->rms_att);
    ADD("post_attention_layernorm.weight", 0, dim, &w->rms_ffn);
    if (m->q_lora_rank) {
        MADD("self_attn.q_a_proj.weight", m->q_lora_rank, dim, &w->q_a);
        ADD("self_attn.q_a_layernorm.weight", 0, m->q_lora_rank, &w->q_a_norm);
        MSLICE("self_attn.q_b_proj.weight", H * qk, m->q_lora_rank, &w->q_b, h0 * qk, hq * qk, 0, m->q_lora_rank);
    } else {
        MSLICE("self_attn.q_proj.weight", H * qk, dim, &w->q, h0 * qk, hq * qk, 0, dim);
    }
    int kvb = m->qk_nope_head_dim + m->v_head_dim;
    MADD("self_attn.kv_a_proj_with_mqa.weight", m->kv_lora_rank + m->qk_rope_head_dim, dim, &w->kv_a);
    ADD("self_attn.kv_a_layernorm.weight", 0, m->kv_lora_rank, &w->kv_a_norm);
    SLICE("self_attn.kv_b_proj.weight", H * kvb, m->kv_lora_rank, &w->kv_b, h0 * kvb, hq * kvb, 0, m->kv_lora_rank);
    out[n - 1].bf16 = &w->kv_b16;
    MSLICE("self_attn.o_proj.weight", dim, H * m->v_head_dim, &w->o, 0, dim, h0 * m->v_head_dim, hq * m->v_head_dim);
    out[n - 1].chunks = s->chunks;
    if (!MOE_LAYER(c, l)) {
        MSLICE("mlp.gate_proj.weight", c->hidden_dim, dim, &w->gate, s->hidden0, s->hidden, 0, dim);
        MSLICE("mlp.up_proj.weight", c->hidden_dim, dim, &w->up, s->hidden0, s->hidden, 0, dim);
        MSLICE("mlp.down_proj.weight", dim, c->hidden_dim, &w->down, 0, dim, s->hidden0, s->hidden);
        out[n - 1].chunks = s->chunks;
        return n;
    }
    return n + moe_tensors(c, s, l, &w->moe, out + n);
}

int mtp_tensors(const Config *c, const Shard *s, int l, MtpLayer *w, TensorSpec *out)
{
    MtpLayer dummy = {0};
    if (!w) w = &dummy;
    int n = 0, dim = c->dim, V = c->vocab_size;
    Shard whole;
    s = shard_or_whole(c, s, &whole);
    ADD("enorm.weight", 0, dim, &w->enorm);
    ADD("hnorm.weight", 0, dim, &w->hnorm);
    MADD("eh_proj.weight", dim, 2 * dim, &w->eh_proj);
    ADD("shared_head.norm.weight", 0, dim, &w->head_norm);
    MSLICE("shared_head.head.weight", V, dim, &w->head, s->vocab0, s->vocab, 0, dim);
    if (l == c->n_layers) MSLICE("embed_tokens.weight", V, dim, &w->embed, s->vocab0, s->vocab, 0, dim);
    return n;
}

/* kv_b_proj's rows of each of this rank's heads, W_uk (nope, kv_lora) then
 * W_uv (v, kv_lora), rearranged into the absorbed form's two stacks: uk_t,
 * each head's W_uk transposed (kv_lora, nope), then uv, each head's W_uv;
 * in kv_b's own buffer, or in bf16 into kv_b16 (kv_b then freed: it was
 * read into a scratch copy). A counted model's point where kv_b does. */
void mla_fold_kv_b(const Model *m, MlaLayer *w)
{
    const MlaConfig *a = &m->cfg.m;
    size_t H = (size_t)m->shard.q_heads, nope = (size_t)a->qk_nope_head_dim, kvl = (size_t)a->kv_lora_rank,
           vd = (size_t)a->v_head_dim, n = H * (nope + vd) * kvl;
    DType t = w->kv_b16 ? DTYPE_BF16 : DTYPE_F32;
    WeightRef all = weight_ref(w->kv_b16 ? (const void *)w->kv_b16 : w->kv_b, t, 0);
    w->uk_t = all;
    w->uv = m->w.sizing ? all : weight_at(all, H * kvl * nope);
    if (m->w.sizing) return;
    float *fold = xmalloc(sizeof(float) * n);
    for (size_t hd = 0; hd < H; hd++) {
        const float *rows = w->kv_b + hd * (nope + vd) * kvl;
        float *uk = fold + hd * kvl * nope;
        for (size_t i = 0; i < nope; i++)
            for (size_t j = 0; j < kvl; j++) uk[j * nope + i] = rows[i * kvl + j];
        memcpy(fold + H * kvl * nope + hd * vd * kvl, rows + nope * kvl, sizeof(float) * vd * kvl);
    }
    if (w->kv_b16) {
        f32_to_bf16_n(w->kv_b16, fold, n); /* exact: the values are bf16's */
        free(w->kv_b);
        w->kv_b = NULL;
    } else {
        memcpy(w->kv_b, fold, sizeof(float) * n);
    }
    free(fold);
}

/* dcpinfer-mkmodel's DeepSeek shapes: what the config reader accepts */
int deepseek_check_spec(const ModelSpec *s)
{
    const MlaConfig *m = &s->mla;
    const MoeConfig *moe = &s->moe;
    if (m->kv_lora_rank < 1 || m->qk_nope_head_dim < 1 || m->qk_rope_head_dim < 2 || m->qk_rope_head_dim % 2 ||
        m->v_head_dim < 1 || m->q_lora_rank < 0 || moe->n_routed_experts < 0 || moe->experts_per_token < 1 ||
        moe->experts_per_token > (moe->n_routed_experts ? moe->n_routed_experts : 1) || moe->moe_hidden < 1 ||
        moe->n_group < 1 || (moe->n_routed_experts && moe->n_routed_experts % moe->n_group) ||
        moe->topk_group < 1 || moe->topk_group > moe->n_group ||
        (moe->sigmoid && moe->n_routed_experts && moe->n_routed_experts / moe->n_group < 2))
        return dcp_fail("DeepSeek shape: kv-lora-rank, qk dims (rope even), v-head-dim and moe-hidden must be "
                        "positive, experts-per-token at most experts, n-group dividing the experts (V3: two per "
                        "group) and topk-group at most n-group");
    return 0;
}

/* A generated DeepSeek model's config, as deepseek_read_config reads the
 * written one back */
void deepseek_spec_config(const ModelSpec *s, Config *c)
{
    c->mla = 1;
    c->m = s->mla;
    c->moe = s->moe;
    c->quant.fp8_block[0] = c->quant.fp8_block[1] = s->fp8_block;
    c->quant.int4_group = s->int4_group;
    c->quant.nvfp4_group = s->nvfp4 ? 16 : 0;
    c->quant.nvfp4_modelopt = s->nvfp4 == 2;
    c->quant.nvfp4_round_bf16 = s->nvfp4 != 0;
    c->n_kv_heads = 1;
    c->head_dim = s->mla.kv_lora_rank + s->mla.qk_rope_head_dim;
    c->rope_style = ROPE_ADJACENT_PAIRS;
    c->m.softmax_scale = 1.0f / sqrtf((float)(s->mla.qk_nope_head_dim + s->mla.qk_rope_head_dim));
    c->format = FORMAT_HF;
}

void mkmodel_mla_defaults(ModelSpec *s)
{
    MlaConfig *m = &s->mla;
    MoeConfig *moe = &s->moe;
    moe->sigmoid = arch_table[s->arch].mla == 2;
    if (!m->kv_lora_rank) m->kv_lora_rank = 32;
    if (!m->qk_nope_head_dim) m->qk_nope_head_dim = 16;
    if (!m->qk_rope_head_dim) m->qk_rope_head_dim = 8;
    if (!m->v_head_dim) m->v_head_dim = 16;
    if (!moe->n_routed_experts) moe->n_routed_experts = 8;
    if (moe->n_shared_experts < 0) moe->n_shared_experts = 1; /* transformers builds them whatever the count */
    if (!moe->experts_per_token) moe->experts_per_token = 2;
    if (!moe->moe_hidden) moe->moe_hidden = 32;
    if (!moe->n_group) moe->n_group = moe->sigmoid ? 4 : 1;
    if (!moe->topk_group) moe->topk_group = moe->sigmoid ? 2 : 1;
    if (!moe->moe_layer_freq) moe->moe_layer_freq = 1;
    if (!moe->routed_scaling_factor) moe->routed_scaling_factor = moe->sigmoid ? 2.5f : 1.0f;
    moe->route = moe->sigmoid ? ROUTE_NOAUX_TC : moe->n_group > 1 ? ROUTE_GROUP_LIMITED_GREEDY : ROUTE_GREEDY;
    m->rope_interleave = 1;
}
