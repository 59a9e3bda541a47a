#!/bin/bash
# Speculative decoding at long context: one prompt of SPEC_LONG_TOKENS
# (8,192 here; scripts/spec-long-context.sh runs 100,000 on a model of a
# 131,072-token context) and 64 greedy tokens with their log-probabilities,
# without speculation and with n-gram drafts, at one rank and at -tp 8
# -dcp 8 (each rank holding an eighth of the KV cache): the same bits, all
# four. The prompt ends with a stale copy of what the model then writes
# (dcpinfer-mkmodel --branch-scale, as in tests/spec_decode.sh), so that
# drafts are verified against keys spread over the eight shards.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
N=${SPEC_LONG_TOKENS:-8192}
CONTEXT=${SPEC_LONG_CONTEXT:-16384}
"$MKMODEL" --out "$WORK/m" --arch llama --layers 2 --dim 64 --heads 8 --kv-heads 1 --hidden 128 --vocab 512 \
    --max-len "$CONTEXT" --branch-scale 0.01 >/dev/null || { echo "FAIL: dcpinfer-mkmodel" >&2; exit 1; }
seed="17, 201, 33, 480, 95, 310, 7, 422"
echo "{\"id\": \"seed\", \"prompt_token_ids\": [$seed], \"max_tokens\": 72, \"temperature\": 0}" >"$WORK/seed.jsonl"
run_dcp chain --model "$WORK/m" --output "$WORK/chain.jsonl" "$WORK/seed.jsonl"
chain=$(token_ids "$WORK/chain.jsonl" seed | awk -F, -v OFS=", " '{ for (k = 9; k <= NF; k += 9) $k = 3 + ($k + 1) % 509; $1 = $1; print }')
[ -n "$chain" ] || { echo "FAIL: no chain: $(cat "$WORK/chain.err")" >&2; exit 1; }
# filler: N - 88 pseudo-random ids, then the seed, the stale chain, the seed
awk -v n=$((N - 88)) -v seed="$seed" -v chain="$chain" 'BEGIN {
    printf "{\"id\": \"long\", \"prompt_token_ids\": ["
    x = 12345
    for (i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648; printf "%d, ", 3 + int(x / 65536) % 509 }
    printf "%s, %s, %s], \"max_tokens\": 64, \"temperature\": 0, \"logprobs\": 2}\n", seed, chain, seed }' >"$WORK/p.jsonl"
SPEC='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
# long_run NAME NP SPEC ARGS...: the prompt at NP ranks, with n-gram drafts when SPEC is 1
long_run() {
    local name=$1 np=$2 spec=$3 t0
    shift 3
    [ "$spec" = 1 ] && set -- "$@" --speculative-config "$SPEC"
    t0=$(date +%s.%N)
    NP=$np LIMIT=${LIMIT:-600} run_dcp "$name" --model "$WORK/m" --max-model-len "$CONTEXT" "$@" \
        --output "$WORK/$name.jsonl" "$WORK/p.jsonl"
    echo "# $name: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s; $(grep -h '^# speculative' "$WORK/$name.out")" >&2
}
long_run one 1 0
long_run one-spec 1 1
long_run dcp8 8 0 -tp 8 -dcp 8
long_run dcp8-spec 8 1 -tp 8 -dcp 8
want=$WORK/one.want
unspec "$WORK/one.jsonl" >"$want"
for name in one-spec dcp8 dcp8-spec; do
    checks=$((checks + 1))
    if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
        fail "$name: exit $(cat "$WORK/$name.rc")"; tail -3 "$WORK/$name.err" >&2
    elif ! unspec "$WORK/$name.jsonl" | cmp -s - "$want"; then
        fail "$name: the tokens or log-probabilities differ from one rank's without speculation"
    else
        pass "$N-token prompt, $name: the 64 tokens and their log-probabilities of one rank without speculation, bit for bit"
    fi
done
checks=$((checks + 1))
a=$(grep -o '"spec_accepted_tokens":[0-9]*' "$WORK/dcp8-spec.jsonl" | cut -d: -f2)
if [ "${a:-0}" -gt 0 ]; then
    pass "-tp 8 -dcp 8: $a drafts accepted: $(grep -h '^# speculative' "$WORK/dcp8-spec.out")"
else
    fail "-tp 8 -dcp 8: no draft accepted: the run did not verify drafts across the shards"
fi
finish
