#!/usr/bin/env python3
"""Reference token ids and decoded texts from the Hugging Face `tokenizers`
package for the tokenizer.json files in ../shared/tokenizers (not run by the
test suite). Writes tests/data/tok/NAME.jsonl: one line per corpus text,
{"text": ..., "ids": [...] (add_special_tokens=False), "with_special": [...]
(add_special_tokens=True), "decoded": ... (skip_special_tokens=True),
"decoded_all": ... (skip_special_tokens=False)}. Only the ids and texts are
committed, not the tokenizers. tests/test_hftok.c compares dcpinfer with them.

Usage: python3 tests/ref/make_tok_refs.py [SHARED_DIR]   (needs tokenizers)
"""
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(TOP), "shared")
OUT = os.path.join(TOP, "tests", "data", "tok")

CORPUS = [
    "",
    " ",
    "   ",
    "\t",
    "\n",
    "Hello",
    "Hello world",
    " Hello world",
    "Once upon a time, there was a little girl named Lily.",
    "It's 2026: I'd've thought they'll say we're done, isn't it?",
    "'ſ 'S 'ſt 'ST 'Ll",                                   # contractions with Unicode letters
    "1 12 123 1234 12345 123456789 3.14159 1,000,000 0x1F 2026-11-29",
    "def f(x):\n\treturn x  *  2\n\n\n    # four spaces\n",
    "if (a && b) { c->d[3] = \"e\"; }   // trailing",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "مرحبا بالعالم، هذا نص عربي.",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "Tiếng Việt có dấu: Xin chào thế giới!",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️",
    "Ñandú café naïve façade coöperate Ångström",
    "e\u0301 versus \u00e9, Å and \u212b, ﬁ ligature, ① ②",   # combining marks, compatibility forms
    "<s>special</s> inside <|endoftext|> and <|im_start|>user<|im_end|> <think>x</think>",
    "<|begin_of_text|>Hi<|eot_id|> <tool_call>{}</tool_call>",
    "multiple   spaces    and\ttabs\t\tand\r\nwindows lines",
    "ALL CAPS SHOUTING AND MiXeD cAsE",
    "a" * 300,
    "The quick brown fox jumps over the lazy dog. " * 5,
    "😀" * 20,
    "\u0000 nul and \u007f del and \u200b zero width",
]


def main():
    os.makedirs(OUT, exist_ok=True)
    print(f"tokenizers {tokenizers.__version__}")
    for name in ("llama3", "qwen3", "mistral-sp"):
        tok = Tokenizer.from_file(os.path.join(SHARED, "tokenizers", name, "tokenizer.json"))
        with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
            for text in CORPUS:
                ids = tok.encode(text, add_special_tokens=False).ids
                special = tok.encode(text, add_special_tokens=True).ids
                line = {"text": text, "ids": ids, "with_special": special,
                        "decoded": tok.decode(ids, skip_special_tokens=True),
                        "decoded_all": tok.decode(ids, skip_special_tokens=False)}
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
        print(f"{name}: {len(CORPUS)} texts")


if __name__ == "__main__":
    main()


# Added tokens matched in the normalized text ("normalized": true), with
# lstrip / rstrip / single_word, on copies of the shared tokenizers with a
# few tokens added (tests/test_hftok.c adds the same): added-variants.jsonl,
# one line per text: {"base", "add", "text", "ids"}.
VARIANTS = [
    ("mistral-sp", [
        {"id": 32000, "content": "café", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
        {"id": 32001, "content": "Once", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False, "special": False},
    ], ["Un café noir", "Once upon a café", "  Once upon", "cafécafé", "Hello world", "xcafé"]),
    ("qwen3", [
        {"id": 151669, "content": "e\u0301x", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
        {"id": 151670, "content": "<tag>", "single_word": True, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
    ], ["the \u00e9x ray", "the e\u0301x ray", "a <tag> b", "a<tag>b", "<tag>"]),
    ("llama3", [
        {"id": 128256, "content": "world", "single_word": False, "lstrip": False, "rstrip": True, "normalized": True, "special": False},
    ], ["Hello world  again", "worldwide world"]),
]
with open(os.path.join(OUT, "added-variants.jsonl"), "w") as f:
    for base, add, texts in VARIANTS:
        with open(os.path.join(SHARED, "tokenizers", base, "tokenizer.json"), encoding="utf-8") as src:
            spec = json.load(src)
        spec["added_tokens"] += add
        tok = Tokenizer.from_str(json.dumps(spec))
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"base": base, "add": add, "text": text, "ids": ids}, ensure_ascii=False) + "\n")
print("added-variants.jsonl written")
