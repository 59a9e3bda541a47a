#!/usr/bin/env python3
"""Reference logits and greedy tokens for the quantized test checkpoints
(not run by the test suite).

v3_int4 is tests/data/deepseek/v3_yarn with its routed experts in
compressed-tensors' pack-quantized INT4 W4A16 (symmetric, groups of
GROUP along the input, bf16 scales), the other matrices as they were, as
Kimi K2-Thinking/K2.5/K2.6 ship: written by the compressed-tensors package
itself (calculate_qparams for the scales, PackedQuantizationCompressor for
the packing, QuantizationConfig for config.json), and v3_int4_twin holds
what compressed-tensors decompresses it to, as float32. transformers runs
the twin for the reference (logits.f32, greedy.txt beside the INT4
checkpoint).

tests/data/deepseek/v3_fp8 is block-scaled FP8 (F8_E4M3 layer matrices
with a float32 weight_scale_inv per 16 x 16 block; made by
make_deepseek_refs.py) and v3_fp8_twin its dequantized float32 twin. This
script runs the twin on the prompt and writes, beside the FP8 checkpoint,
       logits.f32   float32 little-endian logits, (PROMPT_LEN, vocab)
       greedy.txt   the GREEDY ids transformers generates greedily
which test_hf_reference and test_backends hold dcpinfer's FP8 model to.
(transformers' own FP8 loader, FineGrainedFP8Config(dequantize=True),
refuses this checkpoint: kv_a_proj_with_mqa's 40 rows are not a whole
number of 16-row blocks, as DeepSeek-V3's 576 are not of 128.)

Usage: python3 tests/ref/make_quant_refs.py   (needs torch, transformers >= 5)
"""
import os

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(TOP, "tests", "data", "deepseek")
GREEDY = 32


def load(d, **kw):
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True,
                                                       attn_implementation="eager", **kw)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, f"{d}: {bad}"
    return model.eval()


def reference(model, out):
    prompt = torch.tensor([[int(x) for x in open(os.path.join(out, "prompt.txt")).read().split()]])
    n = prompt.shape[1]
    with torch.no_grad():
        logits = model(prompt).logits[0].float().numpy()
        greedy = model.generate(prompt, max_new_tokens=GREEDY, do_sample=False, min_new_tokens=GREEDY)[0, n:].tolist()
    np.asarray(logits, dtype="<f4").tofile(os.path.join(out, "logits.f32"))
    with open(os.path.join(out, "greedy.txt"), "w") as f:
        f.write(" ".join(map(str, greedy)) + "\n")
    gaps = np.sort(logits, axis=1)
    print(f"{out}: logits |max| {np.abs(logits).max():.2f}, smallest top-2 gap "
          f"{np.min(gaps[:, -1] - gaps[:, -2]):.2e}, greedy {greedy[:8]}...")


GROUP = 32
# Kimi K2's ignore list: attention, shared experts, dense layers, the LM head
IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]


def make_int4(src, out, twin):
    import json
    import re
    import shutil
    import compressed_tensors
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import load_file, save_file
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    w = load_file(os.path.join(src, "model.safetensors"))
    q, t, n = {}, {}, 0
    for name, x in w.items():
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        linear = module and x.dim() == 2 and not name.endswith("mlp.gate.weight") and name.startswith("model.layers.")
        if not linear or any(re.match(p[3:], module) if p.startswith("re:") else p == module for p in IGNORE):
            q[name] = t[name] = x
            continue
        xb = x.to(torch.bfloat16)  # the checkpoint's own type: the scales take it
        g = xb.float().reshape(x.shape[0], -1, GROUP)
        scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
        sd = PackedQuantizationCompressor.compress({"weight": xb, "weight_scale": scale.to(torch.bfloat16),
                                                    "weight_zero_point": zp}, scheme)
        for k, v in sd.items():
            q[f"{module}.{k}"] = v.contiguous()
        t[name] = PackedQuantizationCompressor.decompress(dict(sd), scheme)["weight"].float().contiguous()
        n += 1
    for d, tensors in ((out, q), (twin, t)):
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "model.safetensors"))
        shutil.copy(os.path.join(src, "prompt.txt"), d)
    cfg = json.load(open(os.path.join(src, "config.json")))
    json.dump(cfg, open(os.path.join(twin, "config.json"), "w"), indent=2)
    qc = QuantizationConfig(config_groups={"group_0": scheme}, quant_method="compressed-tensors",
                            format="pack-quantized", ignore=IGNORE, quantization_status="compressed")
    cfg["quantization_config"] = qc.model_dump(exclude_none=True, mode="json")
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    print(f"{out}: {n} INT4 matrices, groups of {GROUP}, compressed-tensors {compressed_tensors.__version__}")


def check_mkmodel_int4(build):
    """dcpinfer-mkmodel --quant int4-w4a16 writes what compressed-tensors
    reads: its float32 twin, made here by compressed-tensors'
    decompression of every packed module, gives dcpinfer's prompt
    log-probabilities and tokens of the INT4 folder exactly."""
    import json
    import subprocess
    import tempfile
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file, save_file
    d = tempfile.mkdtemp()
    i4, twin = os.path.join(d, "i4"), os.path.join(d, "twin")
    subprocess.run([os.path.join(build, "dcpinfer-mkmodel"), "--out", i4, "--arch", "deepseek_v3", "--layers", "3",
                    "--dim", "64", "--heads", "8", "--hidden", "96", "--vocab", "256", "--first-dense", "1",
                    "--q-lora-rank", "24", "--norm-topk-prob", "--quant", "int4-w4a16"], check=True,
                   stdout=subprocess.DEVNULL)
    cfg = json.load(open(os.path.join(i4, "config.json")))
    scheme = QuantizationScheme.model_validate(cfg["quantization_config"]["config_groups"]["group_0"])
    w, t = load_file(os.path.join(i4, "model.safetensors")), {}
    for name, x in w.items():
        if name.endswith(".weight_packed"):
            m = name[:-len(".weight_packed")]
            sd = {k: w[f"{m}.{k}"] for k in ("weight_packed", "weight_scale", "weight_shape")}
            t[m + ".weight"] = PackedQuantizationCompressor.decompress(sd, scheme)["weight"].float().contiguous()
        elif not name.endswith((".weight_scale", ".weight_shape")):
            t[name] = x
    os.makedirs(twin)
    save_file(t, os.path.join(twin, "model.safetensors"))
    del cfg["quantization_config"]
    json.dump(cfg, open(os.path.join(twin, "config.json"), "w"))
    req = os.path.join(d, "p.jsonl")
    with open(req, "w") as f:
        f.write(json.dumps({"id": "x", "prompt_token_ids": list(range(3, 60)), "max_tokens": 16, "temperature": 0,
                            "prompt_logprobs": 0}) + "\n")
    out = {}
    for m in (i4, twin):
        subprocess.run([os.path.join(build, "dcpinfer"), "--model", m, "--output", m + ".jsonl", "--quiet", req],
                       check=True, stdout=subprocess.DEVNULL)
        out[m] = json.loads(open(m + ".jsonl").readline())
    same = out[i4]["token_ids"] == out[twin]["token_ids"] and out[i4]["prompt_logprobs"] == out[twin]["prompt_logprobs"]
    print(f"mkmodel --quant int4-w4a16: {sum(1 for k in w if k.endswith('_packed'))} packed modules; dcpinfer on it "
          f"and on compressed-tensors' decompression of it: {'identical' if same else 'DIFFERENT'}")


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    fp8, twin = os.path.join(DATA, "v3_fp8"), os.path.join(DATA, "v3_fp8_twin")
    reference(load(twin), fp8)
    i4, twin = os.path.join(DATA, "v3_int4"), os.path.join(DATA, "v3_int4_twin")
    make_int4(os.path.join(DATA, "v3_yarn"), i4, twin)
    reference(load(twin), i4)


if __name__ == "__main__":
    main()
    check_mkmodel_int4(os.path.join(TOP, "build"))
