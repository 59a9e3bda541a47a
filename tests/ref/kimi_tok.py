"""Kimi K2's tokenizer as the references build it: cl100k_base's ranks with
tokenization_kimi.py's split pattern and Kimi's special tokens after the
ranks (its ten named ones, then <|reserved_token_ID|> up to 256)."""
import os

import tiktoken
from tiktoken.load import load_tiktoken_bpe

KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NAMED = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>",
         "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>"]



def kimi_encoding(shared):
    ranks = load_tiktoken_bpe(os.path.join(shared, "tokenizers", "cl100k", "cl100k_base.tiktoken"))
    base = len(ranks)
    special = {("<|reserved_token_%d|>" % (base + i)) if i >= len(NAMED) else NAMED[i]: base + i for i in range(256)}
    return tiktoken.Encoding("kimi-cl100k", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=special)
