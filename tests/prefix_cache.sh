#!/bin/bash
# Prefix caching from the command line, on a multi-turn agentic trace
# (dcpinfer-mktrace --sessions: every turn's prompt holds the previous
# one's; half the sessions sample, seeded): the tokens are those of --no-enable-prefix-caching at 1 rank, at
# -tp 2 -dcp 2, with --max-num-seqs 2, with -dp 2, and with a KV cache so
# small that blocks are evicted and requests preempted; a DeepSeek-V3
# model's latent cache at -tp 2 -dcp 2 too. One request at a
# time, each request's /requests/num_cached_tokens is exactly the whole
# blocks (16 positions, 32 at dcp 2) of its prompt that earlier requests
# stored, short of its last token; the steps' computed prefill tokens drop
# by the cached count; JSONL's usage.prompt_tokens_details.cached_tokens
# and the summary's hit rate agree.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
command -v h5dump >/dev/null 2>&1 || { echo "h5dump (hdf5-tools) not installed: skipped" >&2; exit 77; }
"$MKMODEL" --out "$WORK/mqa" --layers 2 --dim 64 --heads 4 --kv-heads 1 --hidden 128 --vocab 300 --max-len 2048 \
    --seed 3 >/dev/null || exit 1
T=$WORK/trace.jsonl
"$BUILD/dcpinfer-mktrace" --sessions 4 --turns 4 --median-input 150 --median-output 12 --median-turn 40 --vocab 300 \
    --out "$WORK/greedy.jsonl" || exit 1
# sessions 1 and 3 sample, each turn with its own seed
awk '/"session-00[13]-/ { sub(/"temperature": 0,/, "\"temperature\": 0.8, \"seed\": " NR ",") } { print }' \
    "$WORK/greedy.jsonl" >"$T"
ARGS="--model $WORK/mqa --quiet"
prompt_total=$(sed 's/.*"prompt_token_ids": \[\([^]]*\)\].*/\1/' "$T" | tr ',' '\n' | grep -c .)

# output token ids of a result file, a request per line
outputs() {
    paste -d ' ' <(h5_numbers "$1" /requests/output_offsets | sed '$d') <(h5_numbers "$1" /requests/output_offsets | sed '1d') |
        awk -v ids="$(h5_numbers "$1" /requests/output_tokens | tr '\n' ' ')" \
            'BEGIN {split(ids, t, " ")} {s = ""; for (i = $1 + 1; i <= $2; i++) s = s (s ? "," : "") t[i]; print s}'
}

# reusable BLOCK OUT: per request, the prompt positions that whole blocks
# stored by the requests before it hold (each stored its prompt and its
# output but the last token), at most its prompt less one token
reusable() {
    sed 's/.*"prompt_token_ids": \[\([^]]*\)\].*/\1/' "$T" | paste -d ' ' - <(outputs "$2") | awk -v B="$1" '
        { np[NR] = split($1, p, ","); no = split($2, o, ",")
          for (k = 1; k <= np[NR]; k++) seq[NR, k] = p[k]
          for (k = 1; k < no; k++) seq[NR, np[NR] + k] = o[k]
          stored[NR] = np[NR] + no - 1
          best = 0
          for (i = 1; i < NR; i++) {
              l = 0
              while (l < np[NR] && l < stored[i] && seq[i, l + 1] == p[l + 1]) l++
              if (int(l / B) > best) best = int(l / B)
          }
          most = int((np[NR] - 1) / B); if (best > most) best = most
          print best * B }'
}

run_pair() { # NAME NP ARGS...: the same run with and without the cache
    local name=$1 np=$2; shift 2
    NP=$np run_dcp "$name" $ARGS --output "$WORK/$name.h5" "$@" "$T"
    NP=$np run_dcp "$name-off" $ARGS --output "$WORK/$name-off.h5" --no-enable-prefix-caching "$@" "$T"
}

NP=1 run_dcp ref $ARGS --output "$WORK/ref.h5" --no-enable-prefix-caching --max-num-seqs 1 "$T"
REF=$(outputs "$WORK/ref.h5")
checks=$((checks + 1))
if [ "$(cat "$WORK/ref.rc")" = 0 ] && [ "$(echo "$REF" | grep -c .)" = 16 ] &&
    [ "$(h5_sum "$WORK/ref.h5" /steps/prefill_tokens)" = "$prompt_total" ]; then
    pass "reference without the cache: 16 requests, $prompt_total prompt tokens computed"
else
    fail "reference run: exit $(cat "$WORK/ref.rc")"; cat "$WORK/ref.err" >&2
fi

# check_run NAME BLOCK EXACT: tokens as the reference's; every prompt
# position is computed or cached once, more with preemption, which
# recomputes; with EXACT, the per-request counts by reusable()
check_run() {
    local name=$1 block=$2 exact=$3
    checks=$((checks + 1))
    local got want cached step_cached computed preempt
    got=$(h5_numbers "$WORK/$name.h5" /requests/num_cached_tokens | tr '\n' ' ')
    want=$(reusable "$block" "$WORK/$name.h5" | tr '\n' ' ')
    cached=$(h5_sum "$WORK/$name.h5" /requests/num_cached_tokens)
    step_cached=$(h5_sum "$WORK/$name.h5" /steps/cached_tokens)
    computed=$(h5_sum "$WORK/$name.h5" /steps/prefill_tokens)
    preempt=$(h5_sum "$WORK/$name.h5" /steps/preempted)
    if [ "$(cat "$WORK/$name.rc")$(cat "$WORK/$name-off.rc")" != 00 ]; then
        fail "$name: exit $(cat "$WORK/$name.rc") / $(cat "$WORK/$name-off.rc")"; cat "$WORK/$name.err" "$WORK/$name-off.err" >&2
    elif [ "$(outputs "$WORK/$name.h5")" != "$REF" ] || [ "$(outputs "$WORK/$name-off.h5")" != "$REF" ]; then
        fail "$name: tokens differ from the reference's"
    elif [ "$exact" = exact ] && [ "$got" != "$want" ]; then
        fail "$name: num_cached_tokens $got, want $want"
    elif [ "$cached" -le 0 ] || [ -n "$(echo "$got" | tr ' ' '\n' | grep . | awk -v B="$block" '$1 % B')" ]; then
        fail "$name: cached counts $got are not positive whole blocks of $block"
    elif [ "$preempt" = 0 ] && { [ "$((computed + step_cached))" != "$prompt_total" ] || [ "$step_cached" != "$cached" ]; }; then
        fail "$name: steps computed $computed + cached $step_cached != $prompt_total prompt tokens (requests: $cached cached)"
    elif [ "$preempt" != 0 ] && { [ "$((computed + step_cached))" -le "$prompt_total" ] || [ "$step_cached" -lt "$cached" ]; }; then
        fail "$name: $preempt preemptions, yet steps computed $computed + cached $step_cached <= $prompt_total prompt tokens"
    else
        pass "$name: the reference's tokens; $cached of $prompt_total prompt tokens cached${exact:+ (each as its blocks allow)}, $computed computed, $preempt preemption(s), $step_cached cached at all admissions"
    fi
}

run_pair seq1 1 --max-num-seqs 1
check_run seq1 16 exact
run_pair dcp2 2 -tp 2 -dcp 2 --max-num-seqs 1
check_run dcp2 32 exact
run_pair seqs2 1 --max-num-seqs 2
check_run seqs2 16 ""
run_pair dp2 2 -dp 2 --max-num-seqs 2
check_run dp2 16 ""
# 16 blocks of 16 positions per rank at dcp 2: 512 positions, less than
# two of the longest requests
run_pair tight 2 -tp 2 -dcp 2 --max-num-seqs 4 --kv-cache-memory 64K
check_run tight 32 ""
checks=$((checks + 1))
blocks=$(h5dump -a /steps/kv_blocks_per_rank "$WORK/tight.h5" 2>/dev/null | sed -n 's/.*(0): *//p')
preempt=$(h5_sum "$WORK/tight.h5" /steps/preempted)
if [ "$preempt" -gt 0 ] && [ "$blocks" -le 16 ]; then
    pass "tight: $blocks blocks per rank, $preempt preemption(s)"
else
    fail "tight: $blocks blocks per rank, $preempt preemption(s): the cache is not small enough to test eviction"
fi

# DeepSeek-V3's latent cache (MLA + MoE), one request at a time: exact
# counts again, the tokens of the run without the cache
"$MKMODEL" --out "$WORK/mla" --arch deepseek_v3 --layers 2 --dim 64 --heads 4 --hidden 128 --vocab 300 --max-len 2048 \
    --seed 4 --kv-lora-rank 16 --qk-rope-dim 8 --qk-nope-dim 8 --v-head-dim 8 --q-lora-rank 32 --experts 8 \
    --experts-per-token 2 --moe-hidden 32 --first-dense 1 >/dev/null || exit 1
ARGS="--model $WORK/mla --quiet"
NP=1 run_dcp ref $ARGS --output "$WORK/ref.h5" --no-enable-prefix-caching --max-num-seqs 1 "$T"
REF=$(outputs "$WORK/ref.h5")
run_pair mla 2 -tp 2 -dcp 2 --max-num-seqs 1
check_run mla 32 exact
ARGS="--model $WORK/mqa --quiet"

# JSONL usage and the summary line agree with the HDF5 counts
checks=$((checks + 1))
NP=1 run_dcp jsonl --model "$WORK/mqa" --output "$WORK/seq1.jsonl" --max-num-seqs 1 "$T"
json=$(sed 's/.*"prompt_tokens_details":{"cached_tokens":\([0-9]*\)}.*/\1/' "$WORK/seq1.jsonl" | tr '\n' ' ')
h5=$(h5_numbers "$WORK/seq1.h5" /requests/num_cached_tokens | tr '\n' ' ')
cached=$(h5_sum "$WORK/seq1.h5" /requests/num_cached_tokens)
rate=$(awk -v c="$cached" -v p="$prompt_total" 'BEGIN {printf "%.1f", 100 * c / p}')
line="# prefix cache hit rate: $rate% ($cached of $prompt_total prompt tokens)"
if [ "$json" = "$h5" ] && grep -qxF "$line" "$WORK/jsonl.out"; then
    pass "JSONL cached_tokens $json; '$line'"
else
    fail "JSONL cached_tokens '$json', HDF5 '$h5'; summary: $(grep 'hit rate' "$WORK/jsonl.out")"
fi
checks=$((checks + 1))
if ! grep -q 'hit rate' "$WORK/seq1-off.out" 2>/dev/null && [ "$(h5_sum "$WORK/seq1-off.h5" /steps/cached_tokens)" = 0 ]; then
    pass "--no-enable-prefix-caching: nothing cached, no hit rate line"
else
    fail "--no-enable-prefix-caching: cached $(h5_sum "$WORK/seq1-off.h5" /steps/cached_tokens)"
fi
finish
