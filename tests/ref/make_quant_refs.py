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
checkpoint). v3_nvfp4 and v3_nvfp4_modelopt hold the same experts in NVFP4
as compressed-tensors writes it (by the package) and as NVIDIA ModelOpt
exports it (its dequantization formula), each with its twin and
reference the same way. Then check_mkmodel_quant runs dcpinfer-mkmodel's
INT4 and NVFP4 folders against their formats' own dequantization.

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
    import compressed_tensors
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import load_file
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)

    def fn(module, x):  # the routed experts: what IGNORE leaves of the Linear modules
        xb = x.to(torch.bfloat16)  # the checkpoint's own type: the scales take it
        g = xb.float().reshape(x.shape[0], -1, GROUP)
        scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
        sd = PackedQuantizationCompressor.compress({"weight": xb, "weight_scale": scale.to(torch.bfloat16),
                                                    "weight_zero_point": zp}, scheme)
        twin = PackedQuantizationCompressor.decompress(dict(sd), scheme)["weight"]
        return {f"{module}.{k}": v.contiguous() for k, v in sd.items()}, twin

    q, t = routed_experts(load_file(os.path.join(src, "model.safetensors")), fn)
    qc = QuantizationConfig(config_groups={"group_0": scheme}, quant_method="compressed-tensors",
                            format="pack-quantized", ignore=IGNORE, quantization_status="compressed")
    save_pair(src, out, twin, q, t, qc.model_dump(exclude_none=True, mode="json"))
    print(f"{out}: INT4 experts, groups of {GROUP}, compressed-tensors {compressed_tensors.__version__}")


def check_mkmodel_quant(build):
    """dcpinfer-mkmodel --quant int4-w4a16, nvfp4 and nvfp4-modelopt write what their formats' own
    dequantization reads: the float32 twin of each folder, made here by compressed-tensors'
    decompression of every packed module (ModelOpt: its NVFP4QTensor.dequantize formula), gives
    dcpinfer's prompt log-probabilities and tokens of the quantized folder exactly."""
    import json
    import subprocess
    import tempfile
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file, save_file
    d = tempfile.mkdtemp()
    req = os.path.join(d, "p.jsonl")
    with open(req, "w") as f:
        f.write(json.dumps({"id": "x", "prompt_token_ids": list(range(3, 60)), "max_tokens": 16, "temperature": 0,
                            "prompt_logprobs": 0}) + "\n")
    for quant in ("int4-w4a16", "nvfp4", "nvfp4-modelopt"):
        q, twin = os.path.join(d, quant), os.path.join(d, quant + "-twin")
        subprocess.run([os.path.join(build, "dcpinfer-mkmodel"), "--out", q, "--arch", "deepseek_v3", "--layers", "3",
                        "--dim", "64", "--heads", "8", "--hidden", "96", "--vocab", "256", "--first-dense", "1",
                        "--q-lora-rank", "24", "--norm-topk-prob", "--quant", quant], check=True,
                       stdout=subprocess.DEVNULL)
        cfg = json.load(open(os.path.join(q, "config.json")))
        w, t, n = load_file(os.path.join(q, "model.safetensors")), {}, 0
        for name, x in w.items():
            m = name.rsplit(".", 1)[0]
            if quant == "nvfp4-modelopt" and x.dtype == torch.uint8:  # ModelOpt's formula
                codes = torch.stack((x & 15, x >> 4), -1).reshape(x.shape[0], -1).long()
                vals = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
                scale = w[m + ".weight_scale"].float() * w[m + ".weight_scale_2"]
                t[name] = (vals.reshape(x.shape[0], -1, 16) * scale.unsqueeze(-1)).reshape(vals.shape)
                t[name] = t[name].to(torch.bfloat16).float().contiguous()
                n += 1
            elif name.endswith(".weight_packed"):
                scheme = QuantizationScheme.model_validate(cfg["quantization_config"]["config_groups"]["group_0"])
                comp = NVFP4PackedCompressor if quant == "nvfp4" else PackedQuantizationCompressor
                parts = ("weight_packed", "weight_scale", "weight_global_scale" if quant == "nvfp4" else "weight_shape")
                sd = {k: w[f"{m}.{k}"] for k in parts}
                t[m + ".weight"] = comp.decompress(sd, scheme)["weight"].float().contiguous()
                n += 1
            elif not name.endswith((".weight_scale", ".weight_shape", ".weight_global_scale", ".weight_scale_2",
                                    ".input_scale")):
                t[name] = x
        os.makedirs(twin)
        save_file(t, os.path.join(twin, "model.safetensors"))
        del cfg["quantization_config"]
        json.dump(cfg, open(os.path.join(twin, "config.json"), "w"))
        out = {}
        for m in (q, twin):
            subprocess.run([os.path.join(build, "dcpinfer"), "--model", m, "--output", m + ".jsonl", "--quiet", req],
                           check=True, stdout=subprocess.DEVNULL)
            out[m] = json.loads(open(m + ".jsonl").readline())
        same = out[q]["token_ids"] == out[twin]["token_ids"] and out[q]["prompt_logprobs"] == out[twin]["prompt_logprobs"]
        print(f"mkmodel --quant {quant}: {n} packed modules; dcpinfer on it and on its format's own "
              f"dequantization of it: {'identical' if same else 'DIFFERENT'}")


def routed_experts(w, fn):
    """fn(module, float32 weight) -> (its tensors as stored, its dequantized float32 weight) for each
    routed expert's matrix; the other tensors as they are"""
    q, t = {}, {}
    for name, x in w.items():
        if ".mlp.experts." not in name or not name.endswith(".weight"):
            q[name] = t[name] = x
            continue
        stored, twin = fn(name[:-len(".weight")], x)
        q.update(stored)
        t[name] = twin.float().contiguous()
    return q, t


def save_pair(src, out, twin, q, t, quantization_config):
    import json
    import shutil
    from safetensors.torch import save_file
    for d, tensors in ((out, q), (twin, t)):
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "model.safetensors"))
        shutil.copy(os.path.join(src, "prompt.txt"), d)
    cfg = json.load(open(os.path.join(src, "config.json")))
    json.dump(cfg, open(os.path.join(twin, "config.json"), "w"), indent=2)
    cfg["quantization_config"] = quantization_config
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)


def make_nvfp4(src, out, twin):
    """v3_nvfp4: the routed experts in NVFP4 as compressed-tensors writes it (nvfp4-pack-quantized:
    weight_packed, two E2M1 per byte; weight_scale, FP8 per 16; weight_global_scale), written and
    decompressed (the twin) by the package itself, weight-only (its NVFP4A16 preset)."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    from safetensors.torch import load_file
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])

    def fn(module, x):
        xb = x.to(torch.bfloat16)
        gs = generate_gparam(xb.float().amin(), xb.float().amax())
        g = xb.float().reshape(x.shape[0], -1, 16)
        scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights, global_scale=gs)
        sd = NVFP4PackedCompressor.compress({"weight": xb, "weight_scale": scale, "weight_global_scale": gs,
                                             "weight_zero_point": zp}, scheme)
        twin = NVFP4PackedCompressor.decompress(dict(sd), scheme)["weight"]
        return {f"{module}.{k}": v.contiguous() for k, v in sd.items()}, twin

    q, t = routed_experts(load_file(os.path.join(src, "model.safetensors")), fn)
    qc = QuantizationConfig(config_groups={"group_0": scheme}, quant_method="compressed-tensors",
                            format="nvfp4-pack-quantized", ignore=IGNORE, quantization_status="compressed")
    save_pair(src, out, twin, q, t, qc.model_dump(exclude_none=True, mode="json"))
    print(f"{out}: NVFP4 experts (compressed-tensors)")


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def modelopt_nvfp4(module, x):
    """a float32 weight as ModelOpt's NVFP4 stores it ({module}.weight, .weight_scale,
    .weight_scale_2) and its dequantized twin (bf16)"""
    xb = x.to(torch.bfloat16).float()
    ws2 = (xb.abs().max() / (6.0 * 448.0)).reshape(())
    blocks = xb.reshape(x.shape[0], -1, 16)
    s8 = (blocks.abs().amax(-1) / 6.0 / ws2).to(torch.float8_e4m3fn)
    scale = s8.float() * ws2
    y = blocks / scale.clamp(min=1e-30).unsqueeze(-1)
    idx = (y.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)  # nearest magnitude (ties: the smaller)
    code = (idx | ((y < 0).to(torch.long) << 3)).reshape(x.shape[0], -1)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    vals = E2M1[idx] * torch.where(y < 0, -1.0, 1.0)
    twin = (vals * scale.unsqueeze(-1)).reshape(x.shape).to(torch.bfloat16)
    return {f"{module}.weight": packed.contiguous(), f"{module}.weight_scale": s8.contiguous(),
            f"{module}.weight_scale_2": ws2.contiguous()}, twin


def make_nvfp4_modelopt(src, out, twin):
    """v3_nvfp4_modelopt: the same experts as NVIDIA ModelOpt exports NVFP4 (quant_method modelopt,
    quant_algo NVFP4: weight, two E2M1 per byte, the even element in the low nibble; weight_scale,
    FP8 per 16; weight_scale_2, an F32 scalar that multiplies them; input_scale; config.json's
    "ignore" and hf_quant_config.json's "exclude_modules", as ModelOpt writes both). The twin follows
    NVFP4QTensor.dequantize of nvidia-modelopt 0.47.0: e2m1 * (weight_scale.float() * weight_scale_2)
    in float32, then to the model's dtype (bf16)."""
    from safetensors.torch import load_file

    def fn(module, x):
        stored, twin = modelopt_nvfp4(module, x)
        stored[f"{module}.input_scale"] = torch.tensor(1.0)
        return stored, twin

    q, t = routed_experts(load_file(os.path.join(src, "model.safetensors")), fn)
    exclude = ["lm_head", "model.layers.*.self_attn*", "model.layers.*.shared_experts*", "model.layers.0.mlp*",
               "model.layers.*.mlp.gate"]
    qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
          "ignore": exclude}
    save_pair(src, out, twin, q, t, qc)
    import json  # ModelOpt's second file says the same, its list as exclude_modules
    json.dump({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                                                  "group_size": 16, "exclude_modules": exclude}},
              open(os.path.join(out, "hf_quant_config.json"), "w"), indent=2)
    print(f"{out}: NVFP4 experts (ModelOpt)")


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    fp8, twin = os.path.join(DATA, "v3_fp8"), os.path.join(DATA, "v3_fp8_twin")
    reference(load(twin), fp8)
    i4, twin = os.path.join(DATA, "v3_int4"), os.path.join(DATA, "v3_int4_twin")
    make_int4(os.path.join(DATA, "v3_yarn"), i4, twin)
    reference(load(twin), i4)
    for name, make in (("v3_nvfp4", make_nvfp4), ("v3_nvfp4_modelopt", make_nvfp4_modelopt)):
        d = os.path.join(DATA, name)
        make(os.path.join(DATA, "v3_yarn"), d, d + "_twin")
        reference(load(d + "_twin"), d)


if __name__ == "__main__":
    main()
    check_mkmodel_quant(os.path.join(TOP, "build"))
