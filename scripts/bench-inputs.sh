#!/bin/bash
# Input handling at scale (not a test): the time dcpinfer spends on
#   - a prompt file of 100,000 one-token requests (read, checked, scheduled,
#     written), on one rank, with the generated default model;
#   - tokenizing a 1 MB text prompt with the llama2.c tokenizer of
#     stories260K (the /timings/tokenize figure of the results file; the
#     prompt itself is above the context limit and fails alone).
# Usage: scripts/bench-inputs.sh   (BUILD_DIR=build by default)
set -eu
TOP=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$TOP/build}
SHARED=${DCP_SHARED:-$TOP/../shared}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
awk 'BEGIN {for (i = 0; i < 100000; i++) printf "{\"id\": \"r%d\", \"prompt_token_ids\": [%d], \"max_tokens\": 1}\n", i, i % 500 + 1}' \
    >"$W/100k.jsonl"
t0=$(date +%s.%N)
"$BUILD/dcpinfer" --quiet --output "$W/100k.h5" "$W/100k.jsonl" | tail -1
echo "# 100,000 one-token requests, one rank: $(echo "$(date +%s.%N) - $t0" | bc) s in all"
model=$SHARED/models/stories260K
if [ -f "$model/tok512.bin" ]; then
    awk -v n=1048576 'BEGIN {srand(1); split("Once| upon| a| time|,| the| little| girl| named| Lily|.", w, "|");
        s = ""; while (length(s) < n) s = s w[int(rand() * 11) + 1]; printf "{\"id\": \"big\", \"prompt\": \"%s\"}\n", s}' \
        >"$W/big.jsonl"
    "$BUILD/dcpinfer" --quiet --model "$model/stories260K.bin" --tokenizer "$model/tok512.bin" \
        --output "$W/big.h5" "$W/big.jsonl" >/dev/null 2>&1 || true
    secs=$(h5dump -d /timings/tokenize "$W/big.h5" | sed -n 's/.*(0): *//p')
    echo "# tokenizing a $(stat -c %s "$W/big.jsonl")-byte prompt (llama2.c tokenizer of stories260K): $secs s"
fi
