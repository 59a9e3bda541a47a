#include "hparams.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

void tensor_full_shape(const Config *c, TensorKind k, int *rows, int *cols)
{
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    *rows = 1; /* the 1-D tensors */
    switch (k) {
    case T_BQ: *cols = q; return;
    case T_BK: case T_BV: *cols = kv; return;
    case T_BO: case T_B_DOWN: *cols = c->dim; return;
    case T_B_GATE: case T_B_UP: *cols = c->hidden_dim; return;
    case T_Q_NORM: case T_K_NORM: *cols = c->head_dim; return;
    default: break;
    }
    switch (k) {
    case T_EMBED: case T_LM_HEAD: *rows = c->vocab_size; *cols = c->dim; break;
    case T_RMS_ATT: case T_RMS_FFN: case T_RMS_FINAL: *rows = 1; *cols = c->dim; break;
    case T_WQ: *rows = q; *cols = c->dim; break;
    case T_WK: case T_WV: *rows = kv; *cols = c->dim; break;
    case T_WO: *rows = c->dim; *cols = q; break;
    case T_GATE: case T_UP: *rows = c->hidden_dim; *cols = c->dim; break;
    case T_DOWN: *rows = c->dim; *cols = c->hidden_dim; break;
    default: *rows = *cols = 0;
    }
}

int tensor_is_per_layer(TensorKind k)
{
    return k != T_EMBED && k != T_RMS_FINAL && k != T_LM_HEAD;
}

int tensor_layers(const Config *c, TensorKind k)
{
    if (!tensor_is_per_layer(k)) return 1;
    int ffn = k == T_GATE || k == T_UP || k == T_DOWN || k == T_B_GATE || k == T_B_UP || k == T_B_DOWN;
    if (ffn && !c->mla && c->moe.n_routed_experts) return c->moe.first_k_dense_replace;
    return c->n_layers;
}

int tensor_present(const Config *c, TensorKind k)
{
    switch (k) {
    case T_LM_HEAD: return !c->tied_embeddings;
    case T_BQ: case T_BK: case T_BV: return c->qkv_bias;
    case T_BO: return c->o_bias;
    case T_B_GATE: case T_B_UP: case T_B_DOWN: return c->mlp_bias;
    case T_Q_NORM: case T_K_NORM: return c->qk_norm;
    case T_GATE: case T_UP: case T_DOWN: return c->mla || tensor_layers(c, k) > 0; /* MoE layers: experts instead */
    default: return k < T_COUNT;
    }
}

void rope_frequencies(const Config *c, float *inv_freq, float *scale)
{
    const RopeScaling *r = &c->rope;
    int half = c->head_dim / 2;
    /* in float, as transformers computes them: theta^(2i/D), inverted */
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
    *scale = 1.0f;
    switch (r->type) {
    case ROPE_DEFAULT: break;
    case ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv_freq[i] /= r->factor;
        break;
    case ROPE_LLAMA3: {
        /* wavelengths above original/low_freq_factor are divided by factor,
         * below original/high_freq_factor kept, in between blended */
        float old = (float)r->original_max_position_embeddings;
        float low_wavelen = old / r->low_freq_factor, high_wavelen = old / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            float f = inv_freq[i], wavelen = 2.0f * (float)M_PI / f;
            float scaled = wavelen > low_wavelen ? f / r->factor : f;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                float smooth = (old / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                scaled = (1.0f - smooth) * scaled / r->factor + smooth * scaled;
            }
            inv_freq[i] = scaled;
        }
        break;
    }
    case ROPE_YARN: {
        /* interpolated below the correction range, extrapolated above it,
         * a linear ramp across it; cos/sin scaled by the attention factor */
        double dim = c->head_dim, base = c->rope_theta, orig = r->original_max_position_embeddings;
        double low = dim * log(orig / (r->beta_fast * 2 * M_PI)) / (2 * log(base));
        double high = dim * log(orig / (r->beta_slow * 2 * M_PI)) / (2 * log(base));
        if (r->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        low = low > 0 ? low : 0;
        high = high < dim - 1 ? high : dim - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float pos_freq = powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
            float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (r->factor * pos_freq);
            float ramp = (float)(((float)i - low) / (high - low));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float keep = 1.0f - ramp; /* the extrapolation's share */
            inv_freq[i] = interpolation * (1.0f - keep) + extrapolation * keep;
        }
        *scale = r->attention_factor;
        break;
    }
    }
}

void tensor_hf_name(TensorKind k, int layer, char *buf, size_t n)
{
    static const char *per_layer[] = {
        [T_RMS_ATT] = "input_layernorm.weight",     [T_WQ] = "self_attn.q_proj.weight",
        [T_WK] = "self_attn.k_proj.weight",         [T_WV] = "self_attn.v_proj.weight",
        [T_WO] = "self_attn.o_proj.weight",         [T_RMS_FFN] = "post_attention_layernorm.weight",
        [T_GATE] = "mlp.gate_proj.weight",          [T_UP] = "mlp.up_proj.weight",
        [T_DOWN] = "mlp.down_proj.weight",          [T_BQ] = "self_attn.q_proj.bias",
        [T_BK] = "self_attn.k_proj.bias",           [T_BV] = "self_attn.v_proj.bias",
        [T_BO] = "self_attn.o_proj.bias",           [T_B_GATE] = "mlp.gate_proj.bias",
        [T_B_UP] = "mlp.up_proj.bias",              [T_B_DOWN] = "mlp.down_proj.bias",
        [T_Q_NORM] = "self_attn.q_norm.weight",     [T_K_NORM] = "self_attn.k_norm.weight"};
    if (k == T_EMBED) snprintf(buf, n, "model.embed_tokens.weight");
    else if (k == T_RMS_FINAL) snprintf(buf, n, "model.norm.weight");
    else if (k == T_LM_HEAD) snprintf(buf, n, "lm_head.weight");
    else snprintf(buf, n, "model.layers.%d.%s", layer, per_layer[k]);
}

size_t model_param_count(const Config *c)
{
    size_t n = 0;
    for (int k = 0; k < T_COUNT; k++) {
        if (!tensor_present(c, (TensorKind)k)) continue;
        int r, cl;
        tensor_full_shape(c, (TensorKind)k, &r, &cl);
        n += (size_t)r * cl * (tensor_is_per_layer((TensorKind)k) ? c->n_layers : 1);
    }
    return n;
}

void config_add_eos(Config *c, int id)
{
    for (int k = 0; k < c->n_eos; k++)
        if (c->eos_ids[k] == id) return;
    if (id >= 0 && c->n_eos < (int)(sizeof c->eos_ids / sizeof *c->eos_ids)) c->eos_ids[c->n_eos++] = id;
}
