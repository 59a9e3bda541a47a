#include "mkmodel.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "arch.h"
#include "util.h"

void mkmodel_default_spec(ModelSpec *s)
{
    /* Small enough to start instantly, with 8 query / 2 KV heads so that
     * every tensor-parallel layout up to tp 8 is valid on it. */
    *s = (ModelSpec){.layers = 4, .dim = 128, .heads = 8, .kv_heads = 2, .hidden = 344, .vocab = 512,
                     .max_len = 2048, .tied = 0, .eos = -1, .rope_theta = 10000.0f, .seed = 1234,
                     .moe = {.n_shared_experts = -1}};
}

int mkmodel_check_spec(const ModelSpec *s)
{
    if (s->layers < 1 || s->dim < 2 || s->heads < 1 || s->kv_heads < 1 || s->hidden < 1 || s->vocab < 2 ||
        s->max_len < 2)
        return dcp_fail("every size must be positive (layers %d dim %d heads %d kv-heads %d hidden %d vocab %d "
                        "max-len %d)",
                        s->layers, s->dim, s->heads, s->kv_heads, s->hidden, s->vocab, s->max_len);
    if (!s->head_dim && s->dim % s->heads) return dcp_fail("--dim %d is not divisible by --heads %d", s->dim, s->heads);
    int D = s->head_dim ? s->head_dim : s->dim / s->heads;
    if (D % 2) return dcp_fail("head dim %d must be even for RoPE", D);
    if (s->arch < 0 || s->arch >= arch_count) return dcp_fail("unknown architecture %d", s->arch);
    const Arch *a = &arch_table[s->arch];
    if (s->mtp_layers && (!a->mla || s->mtp_layers < 0 || s->mtp_layers > 4))
        return dcp_fail("--mtp-layers %d: DeepSeek architectures take 0 to 4", s->mtp_layers);
    if (s->attention_bias && !a->attention_bias)
        return dcp_fail("--attention-bias: %s has no attention_bias field", a->name);
    if (s->mlp_bias && !a->mlp_bias) return dcp_fail("--mlp-bias: %s has no mlp_bias field", a->name);
    if (s->sliding_window && a->window == WINDOW_NONE) return dcp_fail("--sliding-window: %s has none", a->name);
    if (s->heads % s->kv_heads)
        return dcp_fail("--heads %d is not divisible by --kv-heads %d", s->heads, s->kv_heads);
    if (s->eos >= s->vocab) return dcp_fail("--eos %d outside the vocabulary of %d", s->eos, s->vocab);
    if (a->mla && deepseek_check_spec(s)) return -1;
    if (a->moe && moe_check_spec(s)) return -1;
    if (a->qk_norm != 2 && s->qk_norm)
        return dcp_fail("--qk-norm: %s has no use_qk_norm field (Qwen3's norms are always there)", a->name);
    if (a->moe != 2 && s->partial_rotary) return dcp_fail("--partial-rotary: only for glm4_moe");
    if (!a->mla && (s->fp8_block || s->int4_group || s->nvfp4)) {
        return dcp_fail("--quant: only for deepseek_v2 / deepseek_v3 models");
    }
    if (!!s->fp8_block + !!s->int4_group + !!s->nvfp4 > 1) return dcp_fail("--quant: one format per model");
    if (s->nvfp4 && (s->dim % 16 || s->moe.moe_hidden % 16))
        return dcp_fail("--quant nvfp4: --dim %d and --moe-hidden %d must be multiples of 16", s->dim,
                        s->moe.moe_hidden);
    if (s->int4_group && (s->int4_group % 8 || s->dim % s->int4_group || s->moe.moe_hidden % s->int4_group))
        return dcp_fail("--quant int4-w4a16: the group (%d) must be a multiple of 8 dividing --dim %d and "
                        "--moe-hidden %d",
                        s->int4_group, s->dim, s->moe.moe_hidden);
    return 0;
}

void mkmodel_config(const ModelSpec *s, Config *c)
{
    memset(c, 0, sizeof *c);
    c->dim = s->dim;
    c->hidden_dim = s->hidden;
    c->n_layers = s->layers;
    c->mtp_layers = s->mtp_layers;
    c->n_heads = s->heads;
    c->n_kv_heads = s->kv_heads;
    c->head_dim = s->head_dim ? s->head_dim : s->dim / s->heads;
    c->vocab_size = s->vocab;
    c->max_seq_len = s->max_len;
    c->rope_theta = s->rope_theta;
    c->rope = s->rope;
    if (c->rope.type == ROPE_DEFAULT) memset(&c->rope, 0, sizeof c->rope);
    if (c->rope.type == ROPE_YARN) { /* transformers' defaults */
        if (!c->rope.beta_fast) c->rope.beta_fast = 32;
        if (!c->rope.beta_slow) c->rope.beta_slow = 1;
        c->rope.truncate = 1;
        c->rope.attention_factor = c->rope.factor > 1 ? 0.1f * logf(c->rope.factor) + 1.0f : 1.0f;
    }
    const Arch *a = &arch_table[s->arch >= 0 && s->arch < arch_count ? s->arch : 0];
    c->arch = s->arch;
    c->qkv_bias = a->qkv_bias || s->attention_bias;
    c->o_bias = a->attention_bias == 1 && s->attention_bias; /* GLM's: q/k/v only */
    c->mlp_bias = s->mlp_bias;
    c->qk_norm = a->qk_norm == 1 || (a->qk_norm == 2 && s->qk_norm);
    c->sliding_window = s->sliding_window;
    c->window_first_layer = a->window == WINDOW_UPPER ? (s->max_window_layers < s->layers ? s->max_window_layers
                                                                                          : s->layers)
                                                      : 0;
    c->norm_eps = 1e-5f;
    c->rope_style = ROPE_ROTATE_HALF;
    c->tied_embeddings = s->tied;
    c->bos_id = -1;
    c->n_eos = 0;
    if (s->eos >= 0) c->eos_ids[c->n_eos++] = s->eos;
    c->format = FORMAT_GENERATED;
    if (a->moe) moe_spec_config(s, c);
    if (a->mla) deepseek_spec_config(s, c);
}

void mkmodel_tensor(const ModelSpec *s, TensorKind k, int layer, float *out)
{
    Config c;
    mkmodel_config(s, &c);
    int rows, cols;
    tensor_full_shape(&c, k, &rows, &cols);
    uint64_t st = s->seed * 0x100000001B3ull + (uint64_t)k * 1000003u + (uint64_t)layer * 7919u;
    splitmix64(&st);
    size_t n = (size_t)rows * cols;
    int is_norm = (k == T_RMS_ATT || k == T_RMS_FFN || k == T_RMS_FINAL || k == T_Q_NORM || k == T_K_NORM);
    int is_bias = k >= T_BQ && k <= T_B_DOWN;
    /* Uniform weights scaled by 1/sqrt(fan-in) keep activations O(1), so
     * the logits spread and greedy argmax has few near-ties. */
    float scale = is_norm ? 0.1f : is_bias ? 0.2f : (k == T_EMBED ? 1.0f : 1.7f / sqrtf((float)cols));
    if ((k == T_WO || k == T_DOWN) && s->branch_scale > 0.0f) scale *= s->branch_scale;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(&st) >> 11) * (1.0 / 9007199254740992.0); /* [0,1) */
        float v = (float)(2.0 * u - 1.0) * scale;
        out[i] = is_norm ? 1.0f + v : v;
    }
}
