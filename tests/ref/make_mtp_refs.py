#!/usr/bin/env python3
"""A small random DeepSeek-V3 model with a multi-token-prediction (MTP)
layer, and the MTP layer's draft logits from a short torch implementation
of DeepSeek's MTP module (not run by the test suite).

The model is built by transformers (DeepseekV3, which has no MTP layer)
from a config with num_nextn_predict_layers 1, its weights drawn again as
make_deepseek_refs.py draws them, and saved with the MTP layer's tensors
added under model.layers.{num_hidden_layers}. as DeepSeek's checkpoints
hold them and vLLM's deepseek_mtp reads them:
  enorm, hnorm            RMSNorm of the token's embedding and of the
                          previous position's hidden state
  eh_proj                 Linear(2 dim -> dim) over [enorm(e), hnorm(h)]
  (a decoder layer)       a full DeepseekV3DecoderLayer (MLA + MoE)
  shared_head.norm, .head the final RMSNorm and the LM head
  embed_tokens            the MTP layer's embedding
The MTP layer's embedding and head are drawn apart from the model's, so
that a program reading the model's own in their place fails the check.

The MTP module (vLLM's DeepSeekMultiTokenPredictorLayer): at position p it
takes the token at p + 1 (its embedding zeroed at position 0) and the
model's final-normed hidden state at p, runs eh_proj and the decoder
layer at position p with causal attention over positions 0..p of its own
layer, and its logits there predict the token at p + 2. Over a prompt of
PROMPT_LEN ids the tokens are the prompt shifted by one and, last, the
model's greedy token after the prompt.

Written to tests/data/deepseek/v3_mtp/: config.json, model.safetensors
(float32), prompt.txt (the prompt ids, then on a second line the greedy
token after it), mtp_logits.f32 (float32 little-endian, (PROMPT_LEN,
vocab), every position), mtp_drafts.txt (the greedy drafts: the last
position's, then each chained step's) and mtp_chain_logits.f32 ((CHAIN,
vocab): the chained steps', each at the position after the last, on the
draft before it and the MTP layer's own output state there, as vLLM
chains its draft steps).

With a build folder, also the drafts of a whole run: the model
tests/spec_decode.sh writes for it (dcpinfer-mkmodel --arch deepseek_v3
--branch-scale 0.1 --mtp-layers 1 ..., MKMODEL_ARGS below: the scale
lets attention move the drafts, so that a draft step at the wrong
position drafts other tokens, yet leaves half the drafts accepted), loaded by
transformers with its MTP layer's decoder layer as a layer one past the
last, generates greedily from four seed prompts; a simulation of
dcpinfer's scheduler (a decoding request drafts min(K, max_tokens - n - 1)
tokens: the MTP layer's greedy token at the position before the pending
one, then chained steps; drafts are kept while they equal the model's
tokens) counts each request's drafted and accepted tokens at K = 1, 2, 3
into tests/data/spec/mtp_counts.txt ("K id drafted accepted", then the
request's tokens per id: "tokens id t0 t1 ...").

Usage: python3 tests/ref/make_mtp_refs.py [BUILD]   (needs torch, transformers >= 5)
"""
import json
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_deepseek_refs import redraw  # noqa: E402  (the weights drawn as the other DeepSeek references')

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(TOP, "tests", "data", "deepseek", "v3_mtp")
PROMPT_LEN, CHAIN = 48, 2

CONFIG = DeepseekV3Config(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=8, n_shared_experts=1, n_routed_experts=8, kv_lora_rank=32,
    qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, num_experts_per_tok=2, first_k_dense_replace=1,
    rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    max_position_embeddings=512, q_lora_rank=24, n_group=4, topk_group=2, norm_topk_prob=True,
    routed_scaling_factor=2.5, rope_interleave=True, num_nextn_predict_layers=1,
    rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0})


class Mtp(torch.nn.Module):
    """DeepSeek's MTP module, as vLLM's deepseek_mtp runs it."""

    def __init__(self, cfg, block):
        super().__init__()
        d = cfg.hidden_size
        self.embed_tokens = torch.nn.Embedding(cfg.vocab_size, d)
        self.enorm = DeepseekV3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * d, d, bias=False)
        self.block = block
        self.head_norm = DeepseekV3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.head = torch.nn.Linear(d, cfg.vocab_size, bias=False)

    def own_tensors(self, prefix):
        return {f"{prefix}.{k}.weight": m.weight.detach().clone()
                for k, m in (("embed_tokens", self.embed_tokens), ("enorm", self.enorm), ("hnorm", self.hnorm),
                             ("eh_proj", self.eh_proj), ("shared_head.norm", self.head_norm),
                             ("shared_head.head", self.head))}

    def forward(self, tokens, hidden, rotary):
        n = tokens.shape[1]
        pos = torch.arange(n).unsqueeze(0)
        e = self.embed_tokens(tokens)
        e[pos == 0] = 0
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1))
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        x = self.block(x, attention_mask=mask, position_ids=pos, position_embeddings=rotary(x, pos))
        if isinstance(x, tuple):
            x = x[0]
        return self.head(self.head_norm(x)), x


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(53)
    os.makedirs(OUT, exist_ok=True)
    CONFIG._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(CONFIG, dtype=torch.float32, attn_implementation="eager").eval()
    redraw(model, gen)
    # the MTP layer's decoder layer: layer num_hidden_layers of a model one
    # layer deeper, saved by transformers (its checkpoint names, per expert)
    L = CONFIG.num_hidden_layers
    deeper_cfg = DeepseekV3Config(**{**CONFIG.to_dict(), "num_hidden_layers": L + 1})
    deeper = AutoModelForCausalLM.from_config(deeper_cfg, dtype=torch.float32, attn_implementation="eager").eval()
    redraw(deeper, gen)
    mtp = Mtp(CONFIG, deeper.model.layers[L]).eval()
    redraw(mtp.embed_tokens, gen), redraw(mtp.enorm, gen), redraw(mtp.hnorm, gen), redraw(mtp.eh_proj, gen)
    redraw(mtp.head_norm, gen), redraw(mtp.head, gen)
    with tempfile.TemporaryDirectory() as tmp:
        deeper.save_pretrained(tmp, safe_serialization=True)
        block = {k: v for k, v in load_file(os.path.join(tmp, "model.safetensors")).items()
                 if k.startswith(f"model.layers.{L}.")}
    model.save_pretrained(OUT, safe_serialization=True)
    os.remove(os.path.join(OUT, "generation_config.json"))  # as the other test models: config.json alone
    path = os.path.join(OUT, "model.safetensors")
    tensors = load_file(path)
    tensors.update(block)
    tensors.update(mtp.own_tensors(f"model.layers.{L}"))
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)
    # the saved files as a reader sees them: the model reloaded (no missing or unexpected weights but the MTP layer's)
    model, info = AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float32, output_loading_info=True,
                                                       attn_implementation="eager")
    assert not info["missing_keys"], info
    prompt = torch.randint(0, CONFIG.vocab_size, (1, PROMPT_LEN), generator=gen)
    with torch.no_grad():
        out = model(prompt, output_hidden_states=True)
        hidden = out.hidden_states[-1]  # after the final norm
        nxt = int(out.logits[0, -1].argmax())
        tokens = torch.cat([prompt[:, 1:], torch.tensor([[nxt]])], dim=1)
        logits, states = mtp(tokens, hidden, model.model.rotary_emb)
        # chained drafts: the MTP layer again one position on, on its own
        # draft and its own output state there (vLLM's draft steps)
        drafts, chain = [int(logits[0, -1].argmax())], []
        for _ in range(CHAIN):
            tokens = torch.cat([tokens, torch.tensor([[drafts[-1]]])], dim=1)
            hidden = torch.cat([hidden, states[:, -1:]], dim=1)
            step, states = mtp(tokens, hidden, model.model.rotary_emb)
            chain.append(step[0, -1])
            drafts.append(int(step[0, -1].argmax()))
        logits = logits[0].float().numpy()
    with open(os.path.join(OUT, "prompt.txt"), "w") as f:
        f.write(" ".join(map(str, prompt[0].tolist())) + "\n" + str(nxt) + "\n")
    logits.astype("<f4").tofile(os.path.join(OUT, "mtp_logits.f32"))
    torch.stack(chain).float().numpy().astype("<f4").tofile(os.path.join(OUT, "mtp_chain_logits.f32"))
    with open(os.path.join(OUT, "mtp_drafts.txt"), "w") as f:
        f.write(" ".join(map(str, drafts)) + "\n")
    cfg = json.load(open(os.path.join(OUT, "config.json")))
    print(f"{OUT}: {len(tensors)} tensors, num_nextn_predict_layers {cfg.get('num_nextn_predict_layers')}, "
          f"MTP logits {logits.shape}, greedy next {nxt}")


MKMODEL_ARGS = ["--arch", "deepseek_v3", "--layers", "2", "--dim", "64", "--heads", "8", "--hidden", "128",
                "--vocab", "512", "--branch-scale", "0.1", "--first-dense", "1", "--q-lora-rank", "24",
                "--norm-topk-prob", "--mtp-layers", "1"]
SEEDS, MAX_TOKENS, KS = 4, 40, (1, 2, 3)


def seed_ids(i):
    """tests/spec_decode.sh's seed_ids"""
    return [3 + (j * 37 + i * 101 + 5) % 509 for j in range(8)]


def run_drafts(build):
    import subprocess
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "mtp")
        subprocess.run([os.path.join(build, "dcpinfer-mkmodel"), "--out", d] + MKMODEL_ARGS, check=True,
                       stdout=subprocess.DEVNULL)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        cfg = model.config
        L = cfg.num_hidden_layers
        deeper = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                      num_hidden_layers=L + 1).eval()
        mtp = Mtp(cfg, deeper.model.layers[L]).eval()
        t = load_file(os.path.join(d, "model.safetensors"))
        with torch.no_grad():
            for name, m in (("embed_tokens", mtp.embed_tokens), ("enorm", mtp.enorm), ("hnorm", mtp.hnorm),
                            ("eh_proj", mtp.eh_proj), ("shared_head.norm", mtp.head_norm),
                            ("shared_head.head", mtp.head)):
                m.weight.copy_(t[f"model.layers.{L}.{name}.weight"])
        lines = []
        for i in range(SEEDS):
            prompt = torch.tensor([seed_ids(i)])
            with torch.no_grad():
                seq = model.generate(prompt, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False)
                hidden = model(seq, output_hidden_states=True).hidden_states[-1]
                tokens = seq[:, 1:]
                first, states = mtp(tokens, hidden[:, :-1], model.model.rotary_emb)
            out = seq[0].tolist()
            P = prompt.shape[1]
            lines.append("tokens r%d %s" % (i, " ".join(map(str, out[P:]))))

            def chain(n, k):
                """the k drafts of a verification whose pending token is at position n"""
                drafts = [int(first[0, n - 1].argmax())]
                toks, hid, st = tokens[:, :n], hidden[:, :n], states[:, n - 1:n]
                with torch.no_grad():
                    for _ in range(k - 1):
                        toks = torch.cat([toks, torch.tensor([[drafts[-1]]])], dim=1)
                        hid = torch.cat([hid, st], dim=1)
                        lg, xs = mtp(toks, hid, model.model.rotary_emb)
                        drafts.append(int(lg[0, -1].argmax()))
                        st = xs[:, -1:]
                return drafts

            for K in KS:
                n_out, drafted, accepted = 1, 0, 0  # the prefill step outputs the first token
                while n_out < MAX_TOKENS:
                    k = min(K, MAX_TOKENS - n_out - 1)
                    pending = P + n_out - 1
                    a = 0
                    if k > 0:
                        for dj in chain(pending, k):
                            if dj != out[pending + 1 + a]:
                                break
                            a += 1
                        drafted, accepted = drafted + k, accepted + a
                    n_out += a + 1
                lines.append("%d r%d %d %d" % (K, i, drafted, accepted))
    path = os.path.join(TOP, "tests", "data", "spec", "mtp_counts.txt")
    with open(path, "w") as f:
        f.write("\n".join(sorted(lines, key=lambda x: (x.startswith("tokens"), x))) + "\n")
    print(path + ":\n" + "\n".join(l for l in lines if not l.startswith("tokens")))


if __name__ == "__main__":
    main()
    if len(sys.argv) > 1:
        run_drafts(sys.argv[1])
