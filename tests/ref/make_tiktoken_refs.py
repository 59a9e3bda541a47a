#!/usr/bin/env python3
"""Reference for dcpinfer's tiktoken tokenizers (not run by the test suite):
the cl100k_base ranks in ../shared/tokenizers/cl100k with Kimi K2's split
pattern (tokenization_kimi.py's pat_str, character-class intersections
included) and Kimi's special tokens after the ranks (its ten named ones,
then <|reserved_token_ID|> up to 256), encoded by the `tiktoken` package
with allowed_special="all".

Writes tests/data/tok/roundtrip-kimi-cl100k.txt (10,000 random mixed-script
lines, tests/ref/mixed_text.py seed 1: per line the FNV-1a hash of its ids
and 1 when decoding gives the line back) and tests/data/tok/kimi-cl100k.jsonl
(hand-written texts for the pattern's corners: title-case and modifier
letters, Han next to other letters, contractions in any case, carriage
returns, digits, special tokens; each with its ids and decoded text).
tests/test_hftok.c reads both.

Usage: python3 tests/ref/make_tiktoken_refs.py [SHARED_DIR]   (needs tiktoken)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mixed_text import write_roundtrip  # noqa: E402
from kimi_tok import kimi_encoding  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(TOP), "shared")
OUT = os.path.join(TOP, "tests", "data", "tok")
LINES, SEED = 10000, 1

enc = kimi_encoding(SHARED)


def encode(text):
    return enc.encode(text, allowed_special="all")


same = write_roundtrip(os.path.join(OUT, "roundtrip-kimi-cl100k.txt"), encode,
                       lambda t, ids: enc.decode_bytes(ids) == t.encode("utf-8"), SEED, LINES)
print("kimi-cl100k: %d of %d lines round-trip" % (same, LINES))

CASES = [
    "Hello World", "HELLO world", "ǅemal ǈubljana ǋoj", "ʰʲʷ modifier ʰa aʰ", "McDonald's DON'T we'LL I'M you'Ve",
    "漢字とかなMixed中文English", "中文abc中文", "Ωmega ΣΊΣΥΦΟΣ αβγ", "Привет, МИР! ёЁ", "naïve café résumé",
    "e\u0301te\u0301 A\u0308BC", "देवनागरी लिपि", "한국어 텍스트", "12345 1234567 ١٢٣ ⅫⅣ ²³", "line\r\nnext\rcr\n\n\nend",
    "  leading\tand trailing  ", "a  b   c    d", "emoji 😀👍🏽 👨‍👩‍👧", "x<|im_end|>y[BOS]z", "<|im_user|>user<|im_middle|>hi",
    "<|reserved_token_100300|>", "tabs\t\tand\u3000ideographic\u3000space", "'s 's 'S", "don't'll've", "😀",
    "", " ", "\n", "a", "ABCdefGHI jklMNO", "Ǆ ǅ ǆ", "$100.00 & 50% off!!!", "path/to/file.txt", "x == y && z != w",
]
with open(os.path.join(OUT, "kimi-cl100k.jsonl"), "w") as f:
    for t in CASES:
        ids = encode(t)
        f.write(json.dumps({"text": t, "ids": ids, "decoded": enc.decode(ids)}, ensure_ascii=False) + "\n")
print("kimi-cl100k: %d hand-written texts" % len(CASES))
