#!/usr/bin/env python3
"""Small random DeepSeek-V2/V3 models (multi-head latent attention and
mixture-of-experts layers) with reference logits and greedy tokens from
Hugging Face transformers (not run by the test suite).

Each case is built by transformers from a config, its weights drawn again
so that they are not near zero (normal, std 1/sqrt(fan-in); norms around 1;
a non-zero e_score_correction_bias), saved as config.json +
model.safetensors (float32) in tests/data/deepseek/CASE/, reloaded (no
missing or unexpected weights allowed), and run on a prompt of PROMPT_LEN
random ids. Beside the model:
  prompt.txt   the prompt ids, one line
  logits.f32   float32 little-endian logits, (PROMPT_LEN, vocab), every position
  greedy.txt   the GREEDY ids transformers generates greedily after the prompt
Also v3_fp8: v3_yarn's layer matrices as block-scaled FP8 (16 x 16 blocks
of F8_E4M3 with a float32 weight_scale_inv each) and v3_fp8_twin, its
dequantized float32 twin (the same prompt; no transformers run).
Cases: v3_yarn (DeepseekV3: q_lora_rank, YaRN with mscale, interleaved
RoPE, 8 routed experts in 4 groups, sigmoid scores with a correction bias,
a shared expert, the first layer dense) and v2_softmax (DeepseekV2: no
q_lora_rank, softmax routing, group_limited_greedy).

dcpinfer does not run these models yet: today they check that their
configs are read and refused with the right line (tests/hf_refusals.sh).

Usage: python3 tests/ref/make_deepseek_refs.py   (needs torch, transformers >= 5)
"""
import math
import os

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(TOP, "tests", "data", "deepseek")
PROMPT_LEN, GREEDY = 224, 32

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
              num_attention_heads=8, num_key_value_heads=8, n_shared_experts=1, n_routed_experts=8,
              kv_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, num_experts_per_tok=2,
              first_k_dense_replace=1, rms_norm_eps=1e-6, tie_word_embeddings=False,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
CASES = {
    "v3_yarn": DeepseekV3Config(
        **COMMON, max_position_embeddings=512, q_lora_rank=24, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
        rope_interleave=True,
        rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}),
    "v2_softmax": DeepseekV2Config(
        **COMMON, max_position_embeddings=1024, q_lora_rank=None, n_group=4, topk_group=2, topk_method="group_limited_greedy",
        norm_topk_prob=False, routed_scaling_factor=1.5),
}


def redraw(model, gen):
    """Weights with some spread: linear layers std 1/sqrt(fan-in), norms 1 +- 0.1, biases +- 0.5."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "e_score_correction_bias" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))


def make_fp8(src, out, twin, block=(16, 16)):
    """A block-scaled FP8 copy of src (as DeepSeek-V3's FP8 checkpoints:
    F8_E4M3 layer matrices with a float32 weight_scale_inv per block, the
    router, embeddings, norms and LM head unquantized) in out, and its
    dequantized float32 twin in twin."""
    import json
    import shutil
    from safetensors.torch import load_file, save_file
    w = load_file(os.path.join(src, "model.safetensors"))
    q, t = {}, {}
    for name, x in w.items():
        if x.dim() != 2 or not name.startswith("model.layers.") or name.endswith("mlp.gate.weight"):
            q[name] = t[name] = x
            continue
        r, c = x.shape
        br, bc = (r + block[0] - 1) // block[0], (c + block[1] - 1) // block[1]
        scale = torch.zeros(br, bc)
        for i in range(br):
            for j in range(bc):
                blk = x[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
                scale[i, j] = blk.abs().max().clamp(min=1e-12) / 448.0
        s = scale.repeat_interleave(block[0], 0)[:r].repeat_interleave(block[1], 1)[:, :c]
        f8 = (x / s).to(torch.float8_e4m3fn)
        q[name] = f8
        q[name + "_scale_inv"] = scale.contiguous()
        t[name] = (f8.float() * s).contiguous()
    for d, tensors in ((out, q), (twin, t)):
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "model.safetensors"))
        shutil.copy(os.path.join(src, "prompt.txt"), d)
    cfg = json.load(open(os.path.join(src, "config.json")))
    json.dump(cfg, open(os.path.join(twin, "config.json"), "w"), indent=2)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": list(block)}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    print(f"{out}: {sum(1 for k in q if k.endswith('_scale_inv'))} FP8 matrices, blocks {block}")


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name, cfg in CASES.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        gen = torch.Generator().manual_seed(1234)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        redraw(model, gen)
        model.save_pretrained(d, safe_serialization=True)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True,
                                                           attn_implementation="eager")
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        assert not bad, f"{name}: {bad}"
        model.eval()
        prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT_LEN), generator=gen)
        with torch.no_grad():
            logits = model(prompt).logits[0].float().numpy()
            out = model.generate(prompt, max_new_tokens=GREEDY, do_sample=False, min_new_tokens=GREEDY)
        greedy = out[0, PROMPT_LEN:].tolist()
        np.asarray(logits, dtype="<f4").tofile(os.path.join(d, "logits.f32"))
        with open(os.path.join(d, "prompt.txt"), "w") as f:
            f.write(" ".join(map(str, prompt[0].tolist())) + "\n")
        with open(os.path.join(d, "greedy.txt"), "w") as f:
            f.write(" ".join(map(str, greedy)) + "\n")
        gaps = np.sort(logits, axis=1)
        print(f"{name}: logits |max| {np.abs(logits).max():.2f}, smallest top-2 gap {np.min(gaps[:, -1] - gaps[:, -2]):.2e}, "
              f"greedy {greedy[:8]}...")


def check_mkmodel(build):
    """dcpinfer-mkmodel's DeepSeek folders load in transformers as their
    classes with no missing or unexpected weights; prints transformers'
    greedy tokens and log-softmax of a prompt beside dcpinfer's (run here)."""
    import json
    import subprocess
    import tempfile
    shape = ["--layers", "3", "--dim", "64", "--heads", "8", "--hidden", "96", "--vocab", "256", "--first-dense", "1"]
    for arch, extra in (("deepseek_v3", ["--q-lora-rank", "24", "--norm-topk-prob"]),
                        ("deepseek_v2", ["--n-group", "4", "--topk-group", "2", "--routed-scale", "1.25"])):
        d = tempfile.mkdtemp()
        subprocess.run([os.path.join(build, "dcpinfer-mkmodel"), "--out", d, "--arch", arch] + shape + extra,
                       check=True, stdout=subprocess.DEVNULL)
        model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True,
                                                           attn_implementation="eager")
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        prompt = torch.randint(0, 256, (1, 60), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            lsm = torch.log_softmax(model(prompt).logits[0].float(), -1)
            greedy = model.generate(prompt, max_new_tokens=16, do_sample=False)[0, 60:].tolist()
        req = os.path.join(d, "p.jsonl")
        with open(req, "w") as f:
            f.write(json.dumps({"id": "x", "prompt_token_ids": prompt[0].tolist(), "max_tokens": 16,
                                "temperature": 0, "prompt_logprobs": 0}) + "\n")
        subprocess.run([os.path.join(build, "dcpinfer"), "--model", d, "--output", req + ".out.jsonl", "--quiet", req],
                       check=True, stdout=subprocess.DEVNULL)
        r = json.loads(open(req + ".out.jsonl").readline())
        diff = max(abs(e["logprob"] - lsm[p - 1][prompt[0, p]].item()) for p, e in enumerate(r["prompt_logprobs"]) if e)
        print(f"mkmodel {arch}: loading problems {bad or 'none'}, greedy tokens "
              f"{'equal' if r['token_ids'] == greedy else 'DIFFER'}, prompt log-probabilities within {diff:.1e}")


if __name__ == "__main__":
    main()
    check_mkmodel(os.path.join(TOP, "build"))
    make_fp8(os.path.join(OUT, "v3_yarn"), os.path.join(OUT, "v3_fp8"), os.path.join(OUT, "v3_fp8_twin"))
