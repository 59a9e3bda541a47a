#!/usr/bin/env python3
"""Reference for the tokenizer round trip (not run by the test suite): for
each tokenizer.json in ../shared/tokenizers, 10,000 random mixed-script
lines (tests/ref/mixed_text.py, seed 1) are encoded by the Hugging Face
`tokenizers` package (no special tokens) and decoded again (special tokens
skipped). Writes tests/data/tok/roundtrip-NAME.txt: a header with the
text's FNV-1a hash, then per line the FNV-1a hash of its ids (int32,
little-endian) and 1 when decode(encode(s)) == s, else 0.
tests/test_hftok.c makes the same lines and compares.

Usage: python3 tests/ref/make_roundtrip_refs.py [SHARED_DIR]   (needs tokenizers)
"""
import os
import sys

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mixed_text import write_roundtrip  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(TOP), "shared")
OUT = os.path.join(TOP, "tests", "data", "tok")
LINES, SEED = 10000, 1

for name in sorted(os.listdir(os.path.join(SHARED, "tokenizers"))):
    path = os.path.join(SHARED, "tokenizers", name, "tokenizer.json")
    if not os.path.isfile(path):
        continue
    tok = Tokenizer.from_file(path)
    same = write_roundtrip(os.path.join(OUT, "roundtrip-%s.txt" % name),
                           lambda t: tok.encode(t, add_special_tokens=False).ids,
                           lambda t, ids: tok.decode(ids, skip_special_tokens=True) == t, SEED, LINES)
    print("%s: %d of %d lines round-trip" % (name, same, LINES))
