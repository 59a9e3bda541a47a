#!/usr/bin/env python3
"""W4A4 NVFP4 test checkpoints and their references (not run by the test
suite).

A random DeepSeek-V3 model (v3_yarn's shapes with moe_intermediate_size 64,
so that -tp 4 leaves each rank whole groups of 16 of the down projection's
input), its routed experts quantized two ways, weights and activations:

  v3_w4a4       compressed-tensors' NVFP4 scheme (nvfp4-pack-quantized,
                input_activations 4-bit floats in dynamic "local" groups of
                16), written by the package: weight_packed, weight_scale,
                weight_global_scale and input_global_scale per Linear.
  v3_w4a4_mo    NVIDIA ModelOpt's NVFP4 export in its two config files:
                config.json's quantization_config with "ignore", and
                hf_quant_config.json with "exclude_modules", both with
                kv_cache_quant_algo FP8; weight, weight_scale,
                weight_scale_2 and input_scale per Linear
                (make_quant_refs.py's ModelOpt formulas), and an FP8 KV
                cache scale per layer, self_attn.k_scale and v_scale (the
                latent cache's range over 448, as ModelOpt calibrates it;
                v_scale the same, which an MLA cache does not use).

Each has its dequantized float32 twin (NAME_twin). The input scales come
from the model's own activations on the prompt (every token through every
expert), as a calibration would: compressed-tensors' generate_gparam of
the observed range, ModelOpt's amax / (6 * 448); gate_proj and up_proj
read the same input and get the same scale.

References beside each quantized checkpoint, from transformers running the
twin in float32:
  logits.f32, greedy.txt                 weight-only: activations as they are
  logits_emulate.f32, greedy_emulate.txt every routed expert's Linear input
                                         fake-quantized by compressed-tensors
                                         itself (compute_dynamic_scales_and_zp
                                         and fake_quantize with the Linear's
                                         input global scale: ModelOpt's is
                                         1 / input_scale, as vLLM takes it)

Usage: python3 tests/ref/make_w4a4_refs.py   (needs torch, transformers >= 5,
compressed-tensors)
"""
import json
import math
import os
import shutil
import sys
import types

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, DeepseekV3Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_quant_refs import IGNORE, modelopt_nvfp4, routed_experts  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(TOP, "tests", "data", "deepseek")
PROMPT_LEN, GREEDY = 96, 32
MO_EXCLUDE = ["lm_head", "model.layers.*.self_attn*", "model.layers.*.shared_experts*", "model.layers.0.mlp*",
              "model.layers.*.mlp.gate"]

CONFIG = DeepseekV3Config(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=64, num_hidden_layers=3,
    num_attention_heads=8, num_key_value_heads=8, n_shared_experts=1, n_routed_experts=8, kv_lora_rank=32,
    qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, num_experts_per_tok=2, first_k_dense_replace=1,
    rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    max_position_embeddings=512, q_lora_rank=24, n_group=4, topk_group=2, norm_topk_prob=True,
    routed_scaling_factor=2.5, rope_interleave=True,
    rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0})


def load(d):
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True,
                                                       attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, f"{d}: {bad}"
    return model.eval()


def experts_modules(model):
    return [(l, layer.mlp.experts) for l, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]


def calibrate(model, prompt):
    """each routed expert's input ranges on the prompt, every token through every expert:
    amax[(layer, e, "gate_up" | "down")]; and each layer's latent KV row (its normalized latent
    and its RoPE part, with room for the rotation): amax[(layer, "kv")]"""
    amax = {}
    for l, layer in enumerate(model.model.layers):
        att, rope = layer.self_attn, model.config.qk_rope_head_dim

        def latent(mod, args, out, l=l):
            amax[(l, "kv")] = max(amax.get((l, "kv"), 0.0), out.abs().max().item())

        def pe(mod, args, out, l=l, rope=rope):
            amax[(l, "kv")] = max(amax.get((l, "kv"), 0.0), 1.5 * out[..., -rope:].abs().max().item())
        att.kv_a_layernorm.register_forward_hook(latent)
        att.kv_a_proj_with_mqa.register_forward_hook(pe)
    for l, ex in experts_modules(model):
        def fwd(self, hidden_states, top_k_index, top_k_weights, l=l, orig=ex.forward):
            for e in range(self.num_experts):
                gate, up = torch.nn.functional.linear(hidden_states, self.gate_up_proj[e]).chunk(2, dim=-1)
                h = self.act_fn(gate) * up
                amax[(l, e, "gate_up")] = hidden_states.abs().max().item()
                amax[(l, e, "down")] = h.abs().max().item()
            return orig(hidden_states, top_k_index, top_k_weights)
        ex.forward = types.MethodType(fwd, ex)
    with torch.no_grad():
        model(prompt)
    return amax


def emulate(model, gscale):
    """every routed expert's Linear inputs fake-quantized by compressed-tensors as NVFP4
    activations with that Linear's input global scale gscale[(layer, e, kind)]"""
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp
    args = preset_name_to_scheme("NVFP4", ["Linear"]).input_activations

    def fq(x, gs):
        gs = torch.tensor([gs], dtype=torch.float32)
        scale, zp = compute_dynamic_scales_and_zp(x, args, None, global_scale=gs)
        return fake_quantize(x, scale, zp, args, global_scale=gs)

    for l, ex in experts_modules(model):
        def fwd(self, hidden_states, top_k_index, top_k_weights, l=l):
            final = torch.zeros_like(hidden_states)
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
            for e in range(self.num_experts):
                pos, tok = torch.where(mask[e])
                if tok.numel() == 0:
                    continue
                x = fq(hidden_states[tok], gscale[(l, e, "gate_up")])
                gate, up = torch.nn.functional.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
                h = fq(self.act_fn(gate) * up, gscale[(l, e, "down")])
                y = torch.nn.functional.linear(h, self.down_proj[e]) * top_k_weights[tok, pos, None]
                final.index_add_(0, tok, y.to(final.dtype))
            return final
        ex.forward = types.MethodType(fwd, ex)


def reference(model, prompt, out, suffix):
    n = prompt.shape[1]
    with torch.no_grad():
        logits = model(prompt).logits[0].float().numpy()
        greedy = model.generate(prompt, max_new_tokens=GREEDY, do_sample=False, min_new_tokens=GREEDY)[0, n:].tolist()
    np.asarray(logits, dtype="<f4").tofile(os.path.join(out, f"logits{suffix}.f32"))
    with open(os.path.join(out, f"greedy{suffix}.txt"), "w") as f:
        f.write(" ".join(map(str, greedy)) + "\n")
    return logits, greedy


def quantize_ct(w, amax):
    """compressed-tensors' NVFP4 (W4A4): the package compresses each routed expert's weight
    and decompresses it (the twin); input_global_scale = generate_gparam of the observed range"""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    gscale = {}

    def fn(module, x):
        xb = x.to(torch.bfloat16)
        gs = generate_gparam(xb.float().amin(), xb.float().amax())
        g = xb.float().reshape(x.shape[0], -1, 16)
        scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights, global_scale=gs)
        sd = NVFP4PackedCompressor.compress({"weight": xb, "weight_scale": scale, "weight_global_scale": gs,
                                             "weight_zero_point": zp}, scheme)
        twin = NVFP4PackedCompressor.decompress(dict(sd), scheme)["weight"]
        stored = {f"{module}.{k}": v.contiguous() for k, v in sd.items()}
        key = expert_key(module)
        a = amax[key]
        igs = generate_gparam(torch.tensor(-a), torch.tensor(a)).reshape(1).float()
        stored[f"{module}.input_global_scale"] = igs
        gscale[key] = igs.item()
        return stored, twin

    q, t = routed_experts(w, fn)
    qc = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
          "config_groups": {"group_0": scheme.model_dump(exclude_none=True, mode="json")}, "ignore": IGNORE}
    return q, t, gscale, qc


def quantize_mo(w, amax):
    """ModelOpt's NVFP4: weight, weight_scale, weight_scale_2 (make_quant_refs.py's modelopt_nvfp4)
    and input_scale = amax / (6 * 448); the input global scale ModelOpt's readers apply is its inverse"""
    gscale = {}

    def fn(module, x):
        stored, twin = modelopt_nvfp4(module, x)
        key = expert_key(module)
        iscale = torch.tensor(amax[key] / (6.0 * 448.0), dtype=torch.float32)
        stored[f"{module}.input_scale"] = iscale
        gscale[key] = (1.0 / iscale).item()
        return stored, twin

    q, t = routed_experts(w, fn)
    for l in range(CONFIG.num_hidden_layers):
        s = torch.tensor(amax[(l, "kv")] / 448.0, dtype=torch.float32)
        q[f"model.layers.{l}.self_attn.k_scale"] = s
        q[f"model.layers.{l}.self_attn.v_scale"] = s.clone()
    qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "producer": {"name": "modelopt"},
          "config_groups": {"group_0": {"targets": ["Linear"],
                                        "weights": {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False},
                                        "input_activations": {"num_bits": 4, "type": "float", "group_size": 16,
                                                              "dynamic": False}}},
          "ignore": MO_EXCLUDE}
    return q, t, gscale, qc


def expert_key(module):
    """model.layers.L.mlp.experts.E.(gate|up|down)_proj -> (L, E, "gate_up" | "down")"""
    parts = module.split(".")
    return int(parts[2]), int(parts[5]), "down" if parts[6] == "down_proj" else "gate_up"


def main():
    from safetensors.torch import load_file, save_file
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    base = os.path.join(OUT, "v3_w4a4_twin")  # the unquantized model first, then its place is the twin's
    gen = torch.Generator().manual_seed(4321)
    model = AutoModelForCausalLM.from_config(CONFIG, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))
    prompt = torch.randint(0, CONFIG.vocab_size, (1, PROMPT_LEN), generator=gen)
    model.save_pretrained(base, safe_serialization=True)
    if os.path.exists(os.path.join(base, "generation_config.json")):
        os.remove(os.path.join(base, "generation_config.json"))
    amax = calibrate(load(base), prompt)
    w = load_file(os.path.join(base, "model.safetensors"))
    cfg = json.load(open(os.path.join(base, "config.json")))
    for name, quantize in (("v3_w4a4", quantize_ct), ("v3_w4a4_mo", quantize_mo)):
        out, twin = os.path.join(OUT, name), os.path.join(OUT, name + "_twin")
        q, t, gscale, qc = quantize(w, amax)
        for d, tensors in ((out, q), (twin, t)):
            os.makedirs(d, exist_ok=True)
            save_file(tensors, os.path.join(d, "model.safetensors"))
            with open(os.path.join(d, "prompt.txt"), "w") as f:
                f.write(" ".join(map(str, prompt[0].tolist())) + "\n")
        json.dump(cfg, open(os.path.join(twin, "config.json"), "w"), indent=2)
        json.dump(dict(cfg, quantization_config=qc), open(os.path.join(out, "config.json"), "w"), indent=2)
        if name == "v3_w4a4_mo":
            json.dump({"producer": {"name": "modelopt"},
                       "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                                        "exclude_modules": MO_EXCLUDE}},
                      open(os.path.join(out, "hf_quant_config.json"), "w"), indent=2)
        lw, gw = reference(load(twin), prompt, out, "")
        m = load(twin)
        emulate(m, gscale)
        le, ge = reference(m, prompt, out, "_emulate")
        print(f"{name}: {sum(k.endswith('input_global_scale') or k.endswith('input_scale') for k in q)} input scales; "
              f"emulated activations move the logits by up to {np.abs(le - lw).max():.3f} "
              f"(largest {np.abs(lw).max():.2f}); greedy {'same' if ge == gw else 'differs'}: {gw[:6]} / {ge[:6]}")


if __name__ == "__main__":
    main()
