#!/usr/bin/env python3
"""Reference logits and greedy tokens for the quantized test checkpoints
(not run by the test suite).

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


def main():
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    fp8, twin = os.path.join(DATA, "v3_fp8"), os.path.join(DATA, "v3_fp8_twin")
    reference(load(twin), fp8)


if __name__ == "__main__":
    main()
