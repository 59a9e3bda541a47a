#!/usr/bin/env python3
"""Reference n-gram drafts for tests/test_scheduler.c (tests/data/spec/ngram_cases.txt).

vLLM's ngram method drafts from the longest suffix of the context, at least
prompt_lookup_min and at most prompt_lookup_max tokens long, that also ends
earlier in the context; among equally long ones the earliest wins; the k
tokens (at most) that followed it there are the drafts. Written here by
brute force over every earlier end, so that dcpinfer's scan is checked
against the definition, not against itself."""
import random


def drafts(tokens, lo, hi, k):
    n = len(tokens)
    best, where = 0, -1
    for end in range(n - 1):  # an earlier occurrence ending at `end`
        m = 0
        while m < hi and m <= end and tokens[end - m] == tokens[n - 1 - m]:
            m += 1
        if m > best:
            best, where = m, end
    if best < lo:
        return []
    return tokens[where + 1:where + 1 + k]


def main():
    rnd = random.Random(5)
    with open("tests/data/spec/ngram_cases.txt", "w") as f:
        f.write("# lookup_min lookup_max k n tokens... | drafts... (tests/ref/make_ngram_refs.py)\n")
        for _ in range(400):
            n = rnd.randrange(1, 40)
            vocab = rnd.choice([2, 3, 5, 20])
            toks = [rnd.randrange(vocab) for _ in range(n)]
            lo = rnd.randrange(1, 5)
            hi = rnd.randrange(lo, 7)
            k = rnd.randrange(1, 6)
            d = drafts(toks, lo, hi, k)
            f.write(f"{lo} {hi} {k} {n} {' '.join(map(str, toks))} | {' '.join(map(str, d))}\n")


if __name__ == "__main__":
    main()
