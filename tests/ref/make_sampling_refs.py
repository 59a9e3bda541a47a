#!/usr/bin/env python3
"""Reference for dcpinfer's sampling parameters (not run by the test suite):
the logits of a random-weight Llama model (transformers, seed 0) over the
32,000-token vocabulary of ../shared/tokenizers/mistral-sp, at the last
position of a prompt followed by an output with repeats, processed as vLLM
orders the steps: logit_bias, transformers' RepetitionPenaltyLogitsProcessor
(over prompt and output ids), OpenAI's frequency and presence penalties
(logit - count x frequency - (count > 0) x presence, over output ids), then
the temperature and transformers' MinPLogitsWarper, TopKLogitsWarper and
TopPLogitsWarper on the result.

Writes tests/data/sampling/logits.f32 (the raw logits, float32 little
endian) and tests/data/sampling/cases.jsonl: per case its parameters and
either the adjusted logits of every id the adjustments touch ("logits":
[[id, value], ...]; all others unchanged) or the final distribution's
nonzero entries ("probs": [[id, p], ...]). tests/test_sampling.c reads both.

Usage: python3 tests/ref/make_sampling_refs.py [SHARED_DIR]   (needs torch, transformers)
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(TOP), "shared")
OUT = os.path.join(TOP, "tests", "data", "sampling")

tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(SHARED, "tokenizers", "mistral-sp", "tokenizer.json"))
prompt = tok.encode("Once upon a time, in a town by the sea, there lived a baker who baked bread every day.")
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
model = LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0, 0.5)  # logits spread enough that the steps keep few tokens
# an output with repeats: prompt tokens again, and tokens several times over
output = [prompt[3], prompt[3], prompt[5], 29900, 29900, 29900, 17, prompt[7], 17, 31999]
with torch.no_grad():
    logits = model(torch.tensor([prompt + output])).logits[0, -1].float()
os.makedirs(OUT, exist_ok=True)
logits.numpy().astype("<f4").tofile(os.path.join(OUT, "logits.f32"))

CASES = [
    {"name": "repetition", "repetition_penalty": 1.3},
    {"name": "repetition-below-1", "repetition_penalty": 0.8},
    {"name": "frequency-presence", "frequency_penalty": 0.7, "presence_penalty": 0.5},
    {"name": "negative-penalties", "frequency_penalty": -0.4, "presence_penalty": -1.5},
    {"name": "bias-and-penalties", "logit_bias": {"29900": 5.0, "100": -100, "7": 2.5}, "repetition_penalty": 1.1,
     "frequency_penalty": 0.3, "presence_penalty": -0.4},
    {"name": "top_k", "temperature": 0.8, "top_k": 40},
    {"name": "top_k-1", "temperature": 1.0, "top_k": 1},
    {"name": "min_p", "temperature": 1.0, "min_p": 0.1},
    {"name": "min_p-hot", "temperature": 2.0, "min_p": 0.3},
    {"name": "all", "temperature": 0.7, "min_p": 0.05, "top_k": 100, "top_p": 0.9, "repetition_penalty": 1.2,
     "frequency_penalty": 0.2, "presence_penalty": 0.1, "logit_bias": {"29900": 3.0}},
]


def adjust(x, c):
    x = x.clone()
    for k, v in c.get("logit_bias", {}).items():
        x[int(k)] += v
    ids = torch.tensor([prompt + output])
    if c.get("repetition_penalty", 1.0) != 1.0:
        x = RepetitionPenaltyLogitsProcessor(c["repetition_penalty"])(ids, x[None])[0]
    counts = torch.zeros_like(x)
    for t in output:
        counts[t] += 1
    x = x - c.get("frequency_penalty", 0.0) * counts
    x = x - c.get("presence_penalty", 0.0) * (counts > 0).float()
    return x


with open(os.path.join(OUT, "cases.jsonl"), "w") as f:
    for c in CASES:
        x = adjust(logits, c)
        rec = dict(c)
        if "temperature" not in c:  # the adjusted logits of the ids they touch
            touched = sorted(set(prompt + output) | {int(k) for k in c.get("logit_bias", {})})
            rec["logits"] = [[t, float(x[t])] for t in touched]
        else:
            s = x[None]
            ids = torch.tensor([prompt + output])
            s = TemperatureLogitsWarper(c["temperature"])(ids, s)
            if c.get("min_p"):
                s = MinPLogitsWarper(c["min_p"])(ids, s)
            if c.get("top_k"):
                s = TopKLogitsWarper(c["top_k"])(ids, s)
            if c.get("top_p", 1.0) < 1.0:
                s = TopPLogitsWarper(c["top_p"])(ids, s)
            p = torch.softmax(s[0], -1)
            rec["probs"] = [[int(t), float(p[t])] for t in torch.nonzero(p).flatten()]
        rec["prompt"], rec["output"] = prompt, output
        f.write(json.dumps(rec) + "\n")
        print(c["name"], len(rec.get("logits", rec.get("probs"))))
