#!/usr/bin/env python3
"""Reference logits and greedy tokens from Hugging Face transformers for the
model families dcpinfer supports (not run by the test suite).

For each case, dcpinfer-mkmodel writes a small random model (config.json and
model.safetensors) into tests/data/hf/CASE/; transformers loads it as its
architecture's class (no missing or unexpected weights allowed), runs a
prompt of PROMPT_LEN random token ids, and this script writes beside the
model:
  prompt.txt   the prompt ids, one line
  logits.f32   float32 little-endian logits, (PROMPT_LEN, vocab), every position
  greedy.txt   the GREEDY token ids transformers generates greedily after the prompt
tests/test_hf_reference.c compares dcpinfer with these files.

Usage: python3 tests/ref/make_hf_refs.py [BUILD_DIR [CASE ...]]   (needs torch, transformers >= 5)
(CASE ...: only those, the others' files left as they are)
"""
import os
import subprocess
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(TOP, "build")
OUT = os.path.join(TOP, "tests", "data", "hf")
PROMPT_LEN, GREEDY = 320, 32
SHAPE = ["--layers", "2", "--dim", "64", "--heads", "8", "--kv-heads", "2", "--hidden", "64", "--vocab", "160",
         "--max-len", "1024"]
CASES = {
    # Llama 3.1-style frequency scaling, trained context 64 < the prompt
    "llama3": ["--rope-type", "llama3", "--rope-factor", "8", "--rope-low-freq-factor", "1",
               "--rope-high-freq-factor", "4", "--rope-original-max", "64", "--rope-theta", "500000"],
    # the transformers-5 spelling: rope_parameters holding rope_theta
    "rope_parameters": ["--rope-parameters", "--rope-theta", "20000"],
    "linear": ["--rope-type", "linear", "--rope-factor", "4"],
    "yarn": ["--rope-type", "yarn", "--rope-factor", "4", "--rope-original-max", "256", "--rope-parameters"],
    "mistral_window": ["--arch", "mistral", "--sliding-window", "48"],
    "qwen2_bias": ["--arch", "qwen2", "--sliding-window", "64", "--max-window-layers", "1", "--rope-theta",
                   "1000000"],
    "qwen3_qk_norm": ["--arch", "qwen3", "--head-dim", "16", "--attention-bias"],
    "mlp_bias": ["--mlp-bias", "--attention-bias"],
    # every feed-forward block 8 experts of 32 rows, 2 per token by softmax, renormalized
    "qwen3_moe": ["--arch", "qwen3_moe", "--head-dim", "16", "--experts", "8", "--experts-per-token", "2",
                  "--moe-hidden", "32"],
    # GLM-4.5: q/k/v biases, per-head q/k norms, RoPE on half of each head
    # (16 of 32), the first layer dense, then 8 experts in 2 groups (1
    # kept) of 32 rows, 2 per token by sigmoid scores with a correction
    # bias, renormalized and scaled, beside a shared expert
    "glm4_moe": ["--arch", "glm4_moe", "--layers", "3", "--head-dim", "32", "--attention-bias", "--qk-norm",
                 "--experts", "8", "--experts-per-token", "2", "--moe-hidden", "32", "--shared-experts", "1",
                 "--first-dense", "1", "--n-group", "2", "--topk-group", "1", "--routed-scale", "2.5",
                 "--norm-topk-prob"],
}


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    only = sys.argv[2:]
    for name, extra in CASES.items():
        if only and name not in only:
            continue
        d = os.path.join(OUT, name)
        subprocess.run([os.path.join(BUILD, "dcpinfer-mkmodel"), "--out", d, "--seed", "77"] + SHAPE + extra,
                       check=True, stdout=subprocess.DEVNULL)
        model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True,
                                                           attn_implementation="eager")
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        assert not bad, f"{name}: {bad}"
        model.eval()
        vocab = model.config.vocab_size
        rng = np.random.default_rng(sum(map(ord, name)))
        prompt = rng.integers(0, vocab, PROMPT_LEN).tolist()
        ids = torch.tensor([prompt])
        with torch.no_grad():
            logits = model(ids).logits[0].float().numpy()
            # an explicit attention mask: without one, generate() takes every
            # prompt id equal to pad_token_id for padding and masks it out
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GREEDY, do_sample=False,
                                 min_new_tokens=GREEDY, pad_token_id=0, eos_token_id=None)
        greedy = out[0, PROMPT_LEN:].tolist()
        assert logits.shape == (PROMPT_LEN, vocab)
        logits.astype("<f4").tofile(os.path.join(d, "logits.f32"))
        with open(os.path.join(d, "prompt.txt"), "w") as f:
            f.write(" ".join(map(str, prompt)) + "\n")
        with open(os.path.join(d, "greedy.txt"), "w") as f:
            f.write(" ".join(map(str, greedy)) + "\n")
        print(f"{name}: {type(model).__name__}, logits {logits.shape}, greedy {greedy[:8]}...")


if __name__ == "__main__":
    main()
