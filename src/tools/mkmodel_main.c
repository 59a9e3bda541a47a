/* dcpinfer-mkmodel: writes a deterministic test model of any shape. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "mkmodel_write.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: dcpinfer-mkmodel --out PATH [options]\n"
            "Writes a deterministic model with uniform random weights.\n"
            "  --out PATH        directory (Hugging Face layout) or file (--format llama2c)\n"
            "  --format F        hf (config.json + safetensors, default) or llama2c (.bin)\n"
            "  --layers N        decoder layers (default 4)\n"
            "  --dim N           hidden size (default 128)\n"
            "  --heads N         query heads (default 8)\n"
            "  --kv-heads N      key/value heads, dividing --heads (default 2)\n"
            "  --hidden N        feed-forward size (default 344)\n"
            "  --vocab N         vocabulary size (default 512)\n"
            "  --max-len N       maximum positions (default 2048)\n"
            "  --seed N          weight seed (default 1234)\n"
            "  --dtype T         f32 (default) or bf16 (hf only)\n"
            "  --shards N        split the safetensors into N files with an index (hf only)\n"
            "  --tied            share the token embedding with the LM head\n"
            "  --eos N           end-of-sequence token id (default: none)\n"
            "  --branch-scale X  o_proj and down_proj (experts' too) scaled by X (default 1); near 0\n"
            "                    each token's output follows from the token itself, so a model\n"
            "                    continues a greedy chain its prompt holds (scripts/bench-spec.sh)\n"
            "Hugging Face architectures (hf format):\n"
            "  --arch A          llama (default), mistral, qwen2 (q/k/v biases), qwen3 (q/k norms),\n"
            "                    qwen3_moe (qwen3 with experts: --experts, --experts-per-token,\n"
            "                    --moe-hidden, defaults 8, 2, 32, renormalized), deepseek_v2 or\n"
            "                    deepseek_v3 (latent attention and experts, below), glm4_moe\n"
            "                    (GLM-4.5: grouped-query attention with DeepSeek-V3's experts, the\n"
            "                    DeepSeek options below; --attention-bias gives q/k/v biases)\n"
            "  --qk-norm         glm4_moe: per-head q/k norms (use_qk_norm)\n"
            "  --partial-rotary X  glm4_moe: the share of each head RoPE rotates (default 0.5)\n"
            "  --head-dim N      head size when it is not dim / heads\n"
            "  --attention-bias  q/k/v/o biases (llama, qwen3)\n"
            "  --mlp-bias        gate/up/down biases (llama)\n"
            "  --rope-theta X    RoPE base (default 10000)\n"
            "  --rope-type T     default, linear, llama3 or yarn scaling\n"
            "  --rope-factor X, --rope-low-freq-factor X, --rope-high-freq-factor X,\n"
            "  --rope-original-max N, --rope-beta-fast X, --rope-beta-slow X   its parameters\n"
            "  --rope-parameters write the rope block as \"rope_parameters\" (transformers 5), not\n"
            "                    \"rope_scaling\"\n"
            "  --sliding-window N  attend to the last N positions (mistral: every layer;\n"
            "                    qwen2/qwen3: the layers from --max-window-layers on)\n"
            "  --max-window-layers N\n"
            "DeepSeek (--arch deepseek_v2 or deepseek_v3; --hidden is the dense layers' size):\n"
            "  --kv-lora-rank N, --q-lora-rank N (0: q_proj), --qk-nope-dim N, --qk-rope-dim N,\n"
            "  --v-head-dim N    latent attention (defaults 32, 0, 16, 8, 16)\n"
            "  --experts N, --shared-experts N, --experts-per-token N, --moe-hidden N,\n"
            "  --first-dense N, --n-group N, --topk-group N, --routed-scale X, --norm-topk-prob\n"
            "                    experts (defaults 8, 1, 2, 32, 0; V3 4 groups keeping 2, scale 2.5)\n"
            "  --quant Q         fp8-block: layer matrices as block-scaled FP8 (F8_E4M3 with a\n"
            "                    weight_scale_inv per block, as DeepSeek-V3); int4-w4a16: the routed\n"
            "                    experts as compressed-tensors pack-quantized INT4, symmetric, bf16\n"
            "                    scales per group (as Kimi K2.x); nvfp4, nvfp4-modelopt: the routed\n"
            "                    experts as NVFP4 (E2M1, FP8 scales per 16, a global scale), as\n"
            "                    compressed-tensors or NVIDIA ModelOpt writes it\n"
            "  --fp8-block N     FP8 blocks of N x N (default 128; alone: --quant fp8-block)\n"
            "  --quant-group N   INT4 columns per scale (default 32)\n"
            "  --mtp-layers N    N multi-token-prediction layers after the last (DeepSeek-V3's\n"
            "                    num_nextn_predict_layers: model.layers.{layers}.* with enorm, hnorm,\n"
            "                    eh_proj, shared_head and embed_tokens; their matrices stored as the\n"
            "                    layers' but for those five, float32 as in DeepSeek's checkpoints)\n"
            "  --kimi-k25        wrapped as Kimi K2.5 writes it: KimiK25ForConditionalGeneration with\n"
            "                    the model as text_config (model_type kimi_k2), quantization_config on\n"
            "                    top, tensors under language_model., and a small vision_tower tensor\n"
            "Defaults are the model dcpinfer runs when no --model is given.\n");
}

int main(int argc, char **argv)
{
    ModelSpec s;
    mkmodel_default_spec(&s);
    const char *out = NULL, *format = "hf", *dtype = "f32";
    int shards = 1;
    static const struct option opts[] = {
        {"out", 1, 0, 'o'},    {"format", 1, 0, 'f'}, {"layers", 1, 0, 'l'}, {"dim", 1, 0, 'd'},
        {"heads", 1, 0, 'H'},  {"kv-heads", 1, 0, 'k'}, {"hidden", 1, 0, 'h'}, {"vocab", 1, 0, 'v'},
        {"max-len", 1, 0, 'm'}, {"seed", 1, 0, 's'},   {"dtype", 1, 0, 't'},  {"shards", 1, 0, 'S'},
        {"tied", 0, 0, 'T'},   {"eos", 1, 0, 'e'},    {"help", 0, 0, '?'},
        {"arch", 1, 0, 'A'}, {"head-dim", 1, 0, 'D'}, {"attention-bias", 0, 0, 'B'}, {"mlp-bias", 0, 0, 'M'},
        {"rope-theta", 1, 0, 'R'}, {"rope-type", 1, 0, 'Y'}, {"rope-factor", 1, 0, 'F'},
        {"rope-low-freq-factor", 1, 0, 'L'}, {"rope-high-freq-factor", 1, 0, 'G'}, {"rope-original-max", 1, 0, 'O'},
        {"rope-beta-fast", 1, 0, 'X'}, {"rope-beta-slow", 1, 0, 'Z'}, {"rope-parameters", 0, 0, 'P'},
        {"sliding-window", 1, 0, 'W'}, {"max-window-layers", 1, 0, 'N'},
        {"kv-lora-rank", 1, 0, 1000}, {"q-lora-rank", 1, 0, 1001}, {"qk-nope-dim", 1, 0, 1002},
        {"qk-rope-dim", 1, 0, 1003}, {"v-head-dim", 1, 0, 1004}, {"experts", 1, 0, 1005},
        {"shared-experts", 1, 0, 1006}, {"experts-per-token", 1, 0, 1007}, {"moe-hidden", 1, 0, 1008},
        {"first-dense", 1, 0, 1009}, {"n-group", 1, 0, 1010}, {"topk-group", 1, 0, 1011},
        {"routed-scale", 1, 0, 1012}, {"norm-topk-prob", 0, 0, 1013}, {"fp8-block", 1, 0, 1014}, {"quant", 1, 0, 1015},
        {"quant-group", 1, 0, 1016}, {"kimi-k25", 0, 0, 1017},
        {"qk-norm", 0, 0, 1018}, {"partial-rotary", 1, 0, 1019},
        {"branch-scale", 1, 0, 1020}, {"mtp-layers", 1, 0, 1021}, {0, 0, 0, 0}};
    const char *quant = NULL;
    int group = 32;
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        char *end = NULL;
        long v = optarg ? strtol(optarg, &end, 10) : 0;
        int numeric = (c < 256 && strchr("ldHkhvmsSeDOWN", c) != NULL) || (c >= 1000 && c <= 1011) || c == 1014 || c == 1016 || c == 1021;
        double x = optarg ? strtod(optarg, NULL) : 0;
        if (numeric && (!optarg[0] || *end)) {
            fprintf(stderr, "dcpinfer-mkmodel: --%s: '%s' is not an integer\n", opts[li].name, optarg);
            return 2;
        }
        switch (c) {
        case 'o': out = optarg; break;
        case 'f': format = optarg; break;
        case 'l': s.layers = (int)v; break;
        case 'd': s.dim = (int)v; break;
        case 'H': s.heads = (int)v; break;
        case 'k': s.kv_heads = (int)v; break;
        case 'h': s.hidden = (int)v; break;
        case 'v': s.vocab = (int)v; break;
        case 'm': s.max_len = (int)v; break;
        case 's': s.seed = strtoull(optarg, NULL, 10); break;
        case 't': dtype = optarg; break;
        case 'S': shards = (int)v; break;
        case 'T': s.tied = 1; break;
        case 'e': s.eos = (int)v; break;
        case 'A': {
            int found = -1;
            for (int i = 0; i < arch_count; i++)
                if (!strcmp(optarg, arch_table[i].model_type)) found = i;
            if (found < 0) {
                fprintf(stderr, "dcpinfer-mkmodel: --arch %s: choose llama, mistral, qwen2, qwen3, qwen3_moe, "
                                "deepseek_v2 or deepseek_v3\n",
                        optarg);
                return 2;
            }
            s.arch = found;
            break;
        }
        case 'D': s.head_dim = (int)v; break;
        case 'B': s.attention_bias = 1; break;
        case 'M': s.mlp_bias = 1; break;
        case 'R': s.rope_theta = (float)x; break;
        case 'Y': {
            static const char *types[] = {"default", "linear", "llama3", "yarn"};
            int found = -1;
            for (int i = 0; i < 4; i++)
                if (!strcmp(optarg, types[i])) found = i;
            if (found < 0) {
                fprintf(stderr, "dcpinfer-mkmodel: --rope-type %s: choose default, linear, llama3 or yarn\n", optarg);
                return 2;
            }
            s.rope.type = (RopeType)found;
            break;
        }
        case 'F': s.rope.factor = (float)x; break;
        case 'L': s.rope.low_freq_factor = (float)x; break;
        case 'G': s.rope.high_freq_factor = (float)x; break;
        case 'O': s.rope.original_max_position_embeddings = (int)v; break;
        case 'X': s.rope.beta_fast = (float)x; break;
        case 'Z': s.rope.beta_slow = (float)x; break;
        case 'P': s.rope_parameters = 1; break;
        case 'W': s.sliding_window = (int)v; break;
        case 1000: s.mla.kv_lora_rank = (int)v; break;
        case 1001: s.mla.q_lora_rank = (int)v; break;
        case 1002: s.mla.qk_nope_head_dim = (int)v; break;
        case 1003: s.mla.qk_rope_head_dim = (int)v; break;
        case 1004: s.mla.v_head_dim = (int)v; break;
        case 1005: s.moe.n_routed_experts = (int)v; break;
        case 1006: s.moe.n_shared_experts = (int)v; break;
        case 1007: s.moe.experts_per_token = (int)v; break;
        case 1008: s.moe.moe_hidden = (int)v; break;
        case 1009: s.moe.first_k_dense_replace = (int)v; break;
        case 1010: s.moe.n_group = (int)v; break;
        case 1011: s.moe.topk_group = (int)v; break;
        case 1012: s.moe.routed_scaling_factor = (float)x; break;
        case 1013: s.moe.norm_topk_prob = 1; break;
        case 1020:
            s.branch_scale = strtof(optarg, &end);
            if (*end || !(s.branch_scale > 0.0f && s.branch_scale <= 1.0f)) {
                fprintf(stderr, "dcpinfer-mkmodel: --branch-scale %s: give a number in (0, 1]\n", optarg);
                return 2;
            }
            break;
        case 1014: s.fp8_block = (int)v; break;
        case 1021: s.mtp_layers = (int)v; break;
        case 1015: quant = optarg; break;
        case 1016: group = (int)v; break;
        case 1017: s.kimi_k25 = 1; break;
        case 1018: s.qk_norm = 1; break;
        case 1019: s.partial_rotary = (float)x; break;
        case 'N': s.max_window_layers = (int)v; break;
        case '?':
            if (optopt == 0 && !strcmp(argv[optind - 1], "--help")) {
                usage(stdout);
                return 0;
            }
            usage(stderr);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "dcpinfer-mkmodel: --out is required\n");
        return 2;
    }
    if (arch_table[s.arch].mla) mkmodel_mla_defaults(&s);
    if (arch_table[s.arch].moe) mkmodel_moe_defaults(&s);
    if (quant && !strcmp(quant, "fp8-block")) {
        if (!s.fp8_block) s.fp8_block = 128;
    } else if (quant && !strcmp(quant, "int4-w4a16")) {
        s.int4_group = group;
    } else if (quant && (!strcmp(quant, "nvfp4") || !strcmp(quant, "nvfp4-modelopt"))) {
        s.nvfp4 = strcmp(quant, "nvfp4") ? 2 : 1;
    } else if (quant) {
        fprintf(stderr, "dcpinfer-mkmodel: --quant %s: choose fp8-block, int4-w4a16, nvfp4 or nvfp4-modelopt\n", quant);
        return 2;
    }
    int bf16 = !strcmp(dtype, "bf16");
    if (!bf16 && strcmp(dtype, "f32")) {
        fprintf(stderr, "dcpinfer-mkmodel: --dtype %s: choose f32 or bf16\n", dtype);
        return 2;
    }
    int rc;
    if (!strcmp(format, "hf")) {
        rc = mkmodel_write_hf(&s, out, bf16, shards);
    } else if (!strcmp(format, "llama2c")) {
        if (bf16) {
            fprintf(stderr, "dcpinfer-mkmodel: the llama2.c format holds f32 only\n");
            return 2;
        }
        rc = mkmodel_write_llama2c(&s, out);
    } else {
        fprintf(stderr, "dcpinfer-mkmodel: --format %s: choose hf or llama2c\n", format);
        return 2;
    }
    if (rc) {
        fprintf(stderr, "dcpinfer-mkmodel: %s\n", dcp_error());
        return 1;
    }
    printf("dcpinfer-mkmodel: wrote %s (%s)\n", out, !strcmp(format, "hf") ? arch_table[s.arch].name : "llama2.c");
    return 0;
}
