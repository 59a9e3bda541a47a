#!/bin/bash
# Benchmark (not a test): generated tokens/s on one rank for 32 requests
# decoded together vs the same 32 one at a time (--max-num-seqs 1), on a
# generated model of stories15M's shape (dim 288, 6 layers, 6 heads,
# hidden 768, vocab 32000). Prints both figures and their ratio, for the
# batch-invariant GEMM (default) and for OpenBLAS sgemm.
set -u
. "$(dirname "$0")/setup.sh"
ensure_packages || exit 1
build_dcpinfer || exit 1
N=${N:-32}
MAX_TOKENS=${MAX_TOKENS:-64}
bench_workdir

"$BUILD_DIR/dcpinfer-mkmodel" --out "$W/model" --layers 6 --dim 288 --heads 6 --kv-heads 6 --hidden 768 \
    --vocab 32000 --max-len 256 --seed 15 || exit 1
# N prompts of 16..47 token ids, greedy, fixed output length
awk -v n="$N" -v m="$MAX_TOKENS" 'BEGIN { srand(7); for (i = 0; i < n; i++) {
    len = 16 + int(rand() * 32); s = "";
    for (j = 0; j < len; j++) s = s (j ? ", " : "") int(rand() * 32000);
    printf "{\"id\": \"r%d\", \"prompt_token_ids\": [%s], \"max_tokens\": %d, \"temperature\": 0}\n", i, s, m } }' \
    >"$W/prompts.jsonl"

# tokens/s from dcpinfer's summary line
rate() { sed -n 's/^# .* output tokens in [0-9.]* s: \([0-9.]*\) tokens\/s.*$/\1/p' "$1"; }
echo "# dcpinfer batching benchmark: $N requests x $MAX_TOKENS tokens, stories15M shape, 1 rank, $(nproc) cores"
printf "# %-10s %14s %14s %8s\n" gemm "batched tok/s" "serial tok/s" ratio
for gemm in invariant openblas; do
    mpirun --bind-to none -np 1 "$BUILD_DIR/dcpinfer" --model "$W/model" --cpu-gemm $gemm --quiet --output "$W/b.h5" \
        "$W/prompts.jsonl" >"$W/batched.out" || exit 1
    mpirun --bind-to none -np 1 "$BUILD_DIR/dcpinfer" --model "$W/model" --cpu-gemm $gemm --quiet --max-num-seqs 1 \
        --output "$W/s.h5" "$W/prompts.jsonl" >"$W/serial.out" || exit 1
    b=$(rate "$W/batched.out") s=$(rate "$W/serial.out")
    same=$(cmp -s <(h5dump -d /requests/output_tokens "$W/b.h5" | tail -n +3) \
        <(h5dump -d /requests/output_tokens "$W/s.h5" | tail -n +3) && echo same || echo DIFFERENT)
    printf "  %-10s %14s %14s %8s  tokens %s\n" $gemm "$b" "$s" "$(awk -v b="$b" -v s="$s" 'BEGIN { printf "%.2f", b / s }')" "$same"
done
