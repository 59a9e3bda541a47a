#!/usr/bin/env python3
"""Random lines of mixed-script text from a seed, exactly as
tests/mixed_text.h makes them (see there). As a program, writes MB
megabytes of lines (seed 2026) to FILE, for scripts/bench-tokenizer.sh.

Usage: python3 tests/ref/mixed_text.py FILE MB
"""
import sys

M64 = (1 << 64) - 1
RANGES = [
    (0x61, 26), (0x61, 26), (0x41, 26), (0x30, 10), (0x20, 1), (0x20, 1), (0x21, 15),
    (0x3A, 7), (0xC0, 64), (0x17F, 1), (0x391, 57), (0x410, 64), (0x621, 42), (0x905, 53),
    (0xE01, 46), (0xAC00, 11172), (0x4E00, 20902), (0x3041, 86), (0x1F600, 80), (0x1F3FB, 5), (0x300, 112),
    (0x200D, 1), (0xFE0F, 1), (0x9, 1), (0xA, 1), (0x2019, 1),
]


class Mix:
    def __init__(self, seed):
        self.s = seed & M64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def line(self):
        out = []
        for _ in range(1 + self.next() % 12):
            start, size = RANGES[self.next() % len(RANGES)]
            for _ in range(1 + self.next() % 8):
                out.append(chr(start + self.next() % size))
        return "".join(out)


def fnv1a(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def write_roundtrip(path, encode, round_trips, seed=1, lines=10000):
    """The round-trip reference test_hftok reads: `lines` random lines from
    seed, a header with the text's hash, then per line the FNV-1a hash of
    encode(line)'s ids (int32, little-endian) and 1 when round_trips(line,
    ids), else 0. Returns how many round-trip."""
    import struct

    mix = Mix(seed)
    texts = [mix.line() for _ in range(lines)]
    text_hash = fnv1a(b"".join(t.encode("utf-8") + b"\n" for t in texts))
    rows, same = [], 0
    for t in texts:
        ids = encode(t)
        rt = round_trips(t, ids)
        same += rt
        rows.append("%016x %d" % (fnv1a(struct.pack("<%di" % len(ids), *ids)), rt))
    with open(path, "w") as f:
        f.write("# seed %d, %d lines, text %016x\n" % (seed, lines, text_hash))
        f.write("\n".join(rows) + "\n")
    return same


if __name__ == "__main__":
    path, mb = sys.argv[1], float(sys.argv[2])
    mix, total = Mix(2026), 0
    with open(path, "w", encoding="utf-8", newline="") as f:
        while total < mb * 1e6:
            # a line's own newlines are kept: the benchmark encodes whole lines of the file
            s = mix.line().replace("\n", " ") + "\n"
            f.write(s)
            total += len(s.encode("utf-8"))
