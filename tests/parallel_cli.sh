#!/bin/sh
# The whole program on 8 ranks: TP, DCP and DP layouts write the same tokens
# and texts as one rank, the HDF5 file holds the rank map and the collective
# counts, and each invalid layout stops every rank within 10 s with one line.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
command -v h5dump >/dev/null 2>&1 || { echo "h5dump (hdf5-tools) not installed: skipped" >&2; exit 77; }

model=$SHARED/models/stories260K
if [ -f "$model/stories260K.bin" ]; then
    M="--model $model/stories260K.bin --tokenizer $model/tok512.bin"
    P=$SRC/inputs/stories.jsonl
else
    echo "stories260K not found under $SHARED: using the generated model" >&2
    "$MKMODEL" --out "$WORK/mqa" --layers 4 --dim 128 --heads 8 --kv-heads 1 --hidden 172 --vocab 512
    M="--model $WORK/mqa"
    P=$SRC/inputs/demo.jsonl
fi
dump() { h5dump -d "$2" "$1" | sed -n '/DATA {/,$p'; }

run_dcp one $M --output "$WORK/one.h5" "$P"
for layout in "-tp 2 -dp 4" "-tp 4" "-tp 8 -dcp 2 --dcp-comm-backend a2a --cp-kv-cache-interleave-size 3 --block-size 15" \
    "-tp 8 -dcp 2 --max-num-batched-tokens 8 --max-num-seqs 3"; do
    checks=$((checks + 1))
    name=$(echo "$layout" | tr -c 'a-z0-9\n' '_')
    case $layout in *a2a*) a2a=$name ;; esac
    NP=8 run_dcp "$name" $M $layout --output "$WORK/$name.h5" "$P"
    if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
        fail "$layout: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
    elif [ "$(dump "$WORK/one.h5" /requests/output_tokens)" != "$(dump "$WORK/$name.h5" /requests/output_tokens)" ] ||
        [ "$(dump "$WORK/one.h5" /requests/text)" != "$(dump "$WORK/$name.h5" /requests/text)" ]; then
        fail "$layout: tokens or texts differ from one rank"
    elif ! dump "$WORK/$name.h5" /layout/tp_rank | grep -q '(0): 0, 1, ' || ! grep -q '^# rank map' "$WORK/$name.out"; then
        fail "$layout: no rank map"
    else
        pass "np 8 $layout: same tokens and texts as one rank"
    fi
done
# the recorded collective counts and KV bytes against what the run implies:
# a decode step (no prefill tokens: every token has cached context) makes
# one all-to-all per layer; every position a rank holds costs 2 x 4 x
# layers x head_dim bytes (one KV head per rank here), and at peak the
# ranks of a DCP group hold between the longest request's share and all
# requests' positions
checks=$((checks + 1))
f=$WORK/$a2a.h5
vals() { h5dump -y -d "$2" "$1" | sed -n '/DATA {/,/}/p' | tr -c '0-9\n' ' ' | tr -s ' \n' '\n' | grep .; }
attr() { h5dump -a "$2" "$1" | sed -n '/DATA {/,/}/p' | sed -n 's/.*(0): *//p'; }
L=$(attr "$f" /n_layers) D=$(attr "$f" /head_dim)
decode_steps=$(vals "$f" /steps/prefill_tokens | grep -c '^0$')
calls=$(vals "$f" /comm/decode/all_to_all/calls | sort -u)
total=$(($(vals "$f" /requests/prompt_offsets | tail -1) + $(vals "$f" /requests/output_offsets | tail -1)))
bad_kv=$(vals "$f" /memory/kv_bytes_peak | awk -v b=$((8 * L * D)) -v t="$total" \
    '$1 % b || $1 / b < 1 || $1 / b > t {print}')
if [ "$calls" = $((L * decode_steps)) ] && [ -z "$bad_kv" ] && grep -q '^  all_to_all ' "$WORK/$a2a.out"; then
    pass "all_to_all calls per rank = $L layers x $decode_steps decode steps; KV peaks in whole positions"
else
    fail "$f: all_to_all calls '$calls', expected $((L * decode_steps)); KV peaks off: $bad_kv"
fi

# the prompt file differs between ranks (node-local copies, a file caught
# mid-write): rank 0's file is the one every rank runs, so the result
# equals a run of rank 0's file (before, the ranks' schedulers diverged)
checks=$((checks + 1))
head -n 3 "$P" >"$WORK/short.jsonl"
timeout 120 "$MPIRUN" -q --oversubscribe --bind-to none -np 1 "$DCPINFER" $M -tp 2 --quiet --output "$WORK/mpmd.h5" \
    "$WORK/short.jsonl" : -np 1 "$DCPINFER" $M -tp 2 --quiet --output "$WORK/mpmd.h5" "$P" \
    >"$WORK/mpmd.out" 2>"$WORK/mpmd.err"
rc=$?
run_dcp short $M --output "$WORK/short.h5" "$WORK/short.jsonl"
if [ "$rc" != 0 ]; then
    fail "prompt file differing between ranks: exit $rc"; cat "$WORK/mpmd.err" >&2
elif [ "$(dump "$WORK/short.h5" /requests/output_tokens)" != "$(dump "$WORK/mpmd.h5" /requests/output_tokens)" ]; then
    fail "prompt file differing between ranks: tokens differ from a one-rank run of rank 0's file"
else
    pass "prompt file differing between ranks: rank 0's file ran on both"
fi

# invalid layouts: every rank exits non-zero within 10 s, one message
"$MKMODEL" --out "$WORK/g6" --layers 1 --dim 96 --heads 12 --kv-heads 2 --hidden 64 --vocab 64
"$MKMODEL" --out "$WORK/gqa" --layers 1 --dim 64 --heads 8 --kv-heads 4 --hidden 64 --vocab 64
printf '{"id": "a", "prompt_token_ids": [1, 2, 3]}\n' >"$WORK/p.jsonl"
LIMIT=10 NP=6 expect_error np_not_divisible 1 "6 ranks are not divisible by -tp 4" --model "$WORK/gqa" -tp 4 "$WORK/p.jsonl"
LIMIT=10 NP=8 expect_error dcp_not_dividing_tp 1 "-dcp 3 does not divide -tp 8" --model "$WORK/gqa" -tp 8 -dcp 3 "$WORK/p.jsonl"
LIMIT=10 NP=8 expect_error dcp_above_tp_over_kv 1 "-dcp 4 is above tp/kv_heads = 8/4 = 2" --model "$WORK/gqa" -tp 8 -dcp 4 "$WORK/p.jsonl"
LIMIT=10 NP=6 expect_error kv_group_split 1 "tp/kv_heads = 6/2 = 3 is not divisible by -dcp 2" --model "$WORK/g6" -tp 6 -dcp 2 "$WORK/p.jsonl"
LIMIT=10 NP=6 expect_error heads_not_divisible 1 "the model's 8 query heads are not divisible by -tp 6" --model "$WORK/gqa" -tp 6 "$WORK/p.jsonl"
LIMIT=10 NP=8 expect_error interleave_zero 1 "--cp-kv-cache-interleave-size 0 must be at least 1" --model "$WORK/gqa" -tp 8 -dcp 2 --cp-kv-cache-interleave-size 0 "$WORK/p.jsonl"
LIMIT=10 NP=4 expect_error dp_mismatch 1 "-dp 3 x -tp 2 = 6, but there are 4 ranks" --model "$WORK/gqa" -tp 2 -dp 3 "$WORK/p.jsonl"
finish
