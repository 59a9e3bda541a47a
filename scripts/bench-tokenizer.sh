#!/bin/sh
# Encoding speed of dcpinfer's tokenizer.json implementation against the
# Hugging Face tokenizers package, one thread each, on the same text: MB
# megabytes (default 10) of random mixed-script lines (tests/ref/mixed_text.py),
# every line encoded without special tokens. Needs python3 with tokenizers
# (pip install tokenizers) and a built tree (BUILD, default ./build).
# Usage: scripts/bench-tokenizer.sh [MB]
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/build}
SHARED=${DCP_SHARED:-$SRC/../shared}
MB=${1:-10}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
make -C "$BUILD" tests/bench_hftok >/dev/null
python3 "$SRC/tests/ref/mixed_text.py" "$TMP/text.txt" "$MB"
echo "text: $(wc -c <"$TMP/text.txt") bytes, $(wc -l <"$TMP/text.txt") lines of random mixed-script text"
printf '%-12s %-40s %s\n' tokenizer "dcpinfer (C, 1 thread)" "tokenizers $(python3 -c 'import tokenizers; print(tokenizers.__version__)') (encode_batch, RAYON_NUM_THREADS=1)"
for dir in "$SHARED"/tokenizers/*/; do
    name=$(basename "$dir")
    ours=$("$BUILD/tests/bench_hftok" "$dir/tokenizer.json" "$TMP/text.txt" 3)
    theirs=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 - "$dir/tokenizer.json" "$TMP/text.txt" <<'PY'
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
data = open(sys.argv[2], encoding="utf-8", newline="").read()
lines = data.splitlines(keepends=True)
best = 1e30
for _ in range(3):
    t0 = time.perf_counter()
    enc = tok.encode_batch(lines, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
n = sum(len(e.ids) for e in enc)
size = len(data.encode("utf-8"))
print("%.2f MB/s (%d bytes, %d tokens, best of 3: %.3f s)" % (size / best / 1e6, size, n, best))
PY
)
    printf '%-12s %-40s %s\n' "$name" "$ours" "$theirs"
done
