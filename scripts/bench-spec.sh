#!/bin/bash
# Benchmark (not a test): decode tokens/s without speculative decoding and
# with n-gram drafts (--speculative-config, method ngram) at K = 2, 4 and 6,
# side by side in one run, on one rank, over a trace whose outputs repeat
# parts of their prompts, as agentic tool calls copy tool results; then
# the same for DeepSeek's MTP drafts (method mtp) at K = 1, 2 and 3 on a
# DeepSeek-V3-shaped model with an MTP layer (MTP_KS="" skips it).
#
# The model has stories110M's shape (12 layers, dim 768, 12 heads, hidden
# 2048, vocab 32000; random weights). Its o_proj and down_proj are scaled
# down (dcpinfer-mkmodel --branch-scale), so that each token's successor
# follows from the token itself and a greedy chain is continued wherever a
# prompt holds it; the compute per step is that of the full model. A first
# run gives each seed's greedy chain; a request's prompt is then its seed,
# a stale copy of the chain (every CHANGE-th token changed, as a tool
# result that differs here and there from what is written next) and the
# seed again, and the model writes the chain: drafts from the copy are
# accepted up to a changed token. Decode is bound by reading the weights,
# so a step of K + 1 rows costs little more than one of one row.
#
# Prints per K: decode tokens/s (decode-only steps), the mean acceptance
# length, the acceptance rate, the ratio to the run without, and the mean
# milliseconds of a one-row step and of a step of K + 1 rows (/steps);
# every run's output tokens must be the run's without speculation
# (checked).
# The MTP model: 12 layers (the first dense), dim 768, 12 heads, latent
# rank 256, 16 routed experts of 512 rows (2 per token) and a shared one,
# vocab 32000, one MTP layer (dcpinfer-mkmodel --mtp-layers 1), scaled as
# above; its MTP layer passes the token's embedding through, so that it
# drafts the chain the model writes, prompt copy or not.
#   N=4 requests, SEQS=1 decoding at a time, MAX_TOKENS=128 each,
#   CHANGE=8, KS="2 4 6", MTP_KS="1 2 3"
set -u
. "$(dirname "$0")/setup.sh"
bench_start
[ -n "${KEEP:-}" ] && trap - EXIT && echo "# work folder: $W"
N=${N:-4}
SEQS=${SEQS:-1}
MAX_TOKENS=${MAX_TOKENS:-128}
CHANGE=${CHANGE:-8}
KS=${KS:-2 4 6}
MTP_KS=${MTP_KS-1 2 3}

"$B/dcpinfer-mkmodel" --out "$W/llama" --layers 12 --dim 768 --heads 12 --kv-heads 12 --hidden 2048 --vocab 32000 \
    --max-len 2048 --seed 15 --branch-scale 0.002 >/dev/null || exit 1
if [ -n "$MTP_KS" ]; then
    "$B/dcpinfer-mkmodel" --out "$W/v3" --arch deepseek_v3 --layers 12 --dim 768 --heads 12 --hidden 2048 \
        --vocab 32000 --max-len 2048 --seed 15 --branch-scale 0.002 --kv-lora-rank 256 --q-lora-rank 384 \
        --qk-nope-dim 64 --qk-rope-dim 32 --v-head-dim 64 --experts 16 --experts-per-token 2 --moe-hidden 512 \
        --first-dense 1 --mtp-layers 1 >/dev/null || exit 1
fi
seed_ids() { awk -v i="$1" 'BEGIN { srand(100 + i); for (j = 0; j < 16; j++) printf "%s%d", j ? ", " : "", int(rand() * 32000) }'; }
# MODEL: each seed's greedy chain, then the trace of prompts holding a stale copy of it
trace() {
    for i in $(seq 0 $((N - 1))); do
        echo "{\"id\": \"r$i\", \"prompt_token_ids\": [$(seed_ids "$i")], \"max_tokens\": $((MAX_TOKENS + 16)), \"temperature\": 0}"
    done >"$W/seeds.jsonl"
    mpirun --bind-to none -np 1 "$B/dcpinfer" --model "$W/$1" --quiet --output "$W/$1-chains.jsonl" "$W/seeds.jsonl" \
        >/dev/null || exit 1
    for i in $(seq 0 $((N - 1))); do
        chain=$(grep "\"id\":\"r$i\"" "$W/$1-chains.jsonl" | grep -o '"token_ids":\[[^]]*\]' | sed 's/.*\[//; s/\]//' |
            awk -F, -v OFS=", " -v c="$CHANGE" '{ for (k = c; k <= NF; k += c) $k = ($k + 1) % 32000; $1 = $1; print }')
        echo "{\"id\": \"r$i\", \"prompt_token_ids\": [$(seed_ids "$i"), $chain, $(seed_ids "$i")], \"max_tokens\": $MAX_TOKENS, \"temperature\": 0}"
    done >"$W/$1-trace.jsonl"
}

rate() { sed -n 's/^# decode-only steps: .* tokens\/s$/&/p' "$1" | sed 's/.*: \([0-9.]*\) tokens\/s$/\1/'; }
numbers() { h5dump -y -d "$2" "$1" | sed -n '/DATA {/,/}/p' | sed '1d;$d' | tr -c '0-9.eE+\n-' ' ' | tr -s ' \n' '\n' | grep .; }
# the mean ms of the decode-only steps of ROWS rows per request (one running)
step_ms() {
    paste <(numbers "$1" /steps/decode_tokens) <(numbers "$1" /steps/prefill_tokens) <(numbers "$1" /steps/seconds) |
        awk -v r="$2" '$1 == r && $2 == 0 { s += $3; n++ } END { if (n) printf "%.1f", 1000 * s / n; else print "-" }'
}
run() { # MODEL NAME ARGS...
    local model=$1 name=$1-$2; shift 2
    mpirun --bind-to none -np 1 "$B/dcpinfer" --model "$W/$model" --max-num-seqs "$SEQS" --output "$W/$name.h5" "$@" \
        "$W/$model-trace.jsonl" >"$W/$name.out" 2>"$W/$name.err" || { cat "$W/$name.err" >&2; exit 1; }
}
# MODEL METHOD KS: the table of one drafter
table() {
    local model=$1 method=$2 K r line len acc same base spec
    trace "$model"
    run "$model" none
    base=$(rate "$W/$model-none.out")
    numbers "$W/$model-none.h5" /requests/output_tokens >"$W/$model-none.tokens"
    printf "# %-12s %13s %18s %16s %7s %9s %11s %s\n" speculation "decode tok/s" "mean accept. len." "acceptance rate" \
        ratio "1-row ms" "K+1-row ms" outputs
    printf "  %-12s %13s %18s %16s %7s %9s %11s\n" none "$base" - - 1.00 "$(step_ms "$W/$model-none.h5" 1)" -
    for K in $3; do
        spec="{\"method\": \"ngram\", \"num_speculative_tokens\": $K, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}"
        [ "$method" = mtp ] && spec="{\"method\": \"mtp\", \"num_speculative_tokens\": $K}"
        run "$model" k$K --speculative-config "$spec"
        r=$(rate "$W/$model-k$K.out")
        line=$(grep '^# speculative decoding' "$W/$model-k$K.out")
        len=$(echo "$line" | sed 's/.*mean acceptance length \([0-9.]*\);.*/\1/')
        acc=$(echo "$line" | sed 's/.* accepted (\([0-9.]*%\)).*/\1/')
        same=$(numbers "$W/$model-k$K.h5" /requests/output_tokens | cmp -s - "$W/$model-none.tokens" && echo same || echo DIFFERENT)
        printf "  %-12s %13s %18s %16s %7s %9s %11s %s\n" "$method K=$K" "$r" "$len" "$acc" \
            "$(awk -v a="$r" -v b="$base" 'BEGIN { printf "%.2f", a / b }')" "$(step_ms "$W/$model-k$K.h5" 1)" \
            "$(step_ms "$W/$model-k$K.h5" $((K + 1)))" "$same"
    done
}
echo "# dcpinfer speculative decoding benchmark: $N requests x $MAX_TOKENS tokens, $SEQS decoding at a time, 1 rank, $(nproc) cores"
echo "# trace: prompts of $((16 + MAX_TOKENS + 16 + 16)) tokens holding a copy of the output with every ${CHANGE}th token changed"
echo "# n-gram drafts, stories110M shape (fp32)"
table llama ngram "$KS"
if [ -n "$MTP_KS" ]; then
    echo "# MTP drafts, DeepSeek-V3 shape with an MTP layer (fp32; 12 layers, 16 experts)"
    table v3 mtp "$MTP_KS"
fi
