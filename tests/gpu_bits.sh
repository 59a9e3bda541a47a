#!/bin/sh
# The GPU backend's bits (docs/design.md, "Same bits at any layout" and
# "Same bits whatever shares the batch"): --backend cuda samples at
# temperature 1.0 over a 32K vocabulary of random weights, where the last
# bit of a logit can decide a draw, and gives the same tokens and
# log-probabilities bit for bit at one rank, -tp 2 and -tp 4 -dcp 4; and a
# request alone gives what it gives in a batch of 9. For a DeepSeek-V3
# model in every weight format (fp32, bf16, FP8 blocks, INT4 experts,
# NVFP4 experts) and a grouped-query Llama model (8 query heads on one KV
# head, so that dcp reaches 4 at tp 4) in fp32 and bf16. n-gram
# speculative decoding gives the bits of the run without it.
# Skips without the CUDA backend; a HIP-CPU build runs the kernels on the
# CPU in every suite (scripts/test.sh), a GPU in scripts/gpu-check.sh.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
SHAPE="--layers 2 --dim 64 --heads 8 --hidden 128 --vocab 32768"
"$MKMODEL" --out "$WORK/gqa" --arch llama $SHAPE --kv-heads 1 >/dev/null || { fail "mkmodel gqa"; finish; }
P=$WORK/p.jsonl
for i in 0 1 2 3 4 5 6 7 8; do
    ids=$(awk -v i=$i 'BEGIN { n = 5 + 7 * i; for (j = 0; j < n; j++) printf "%s%d", j ? ", " : "", (j * 7919 + i * 104729) % 32768 }')
    echo "{\"id\": \"s$i\", \"prompt_token_ids\": [$ids], \"max_tokens\": $((6 + i)), \"temperature\": 1.0, \"seed\": $((i + 11)), \"logprobs\": 2}"
done >"$P"
grep '"id": "s4"' "$P" >"$WORK/alone.jsonl"
run_dcp probe --backend cuda --model "$WORK/gqa" --kv-cache-memory 1M --max-tokens 1 --output "$WORK/probe.jsonl" "$WORK/alone.jsonl"
if grep -qE "built without CUDA|no usable GPU" "$WORK/probe.err"; then
    echo "$(cat "$WORK/probe.err"): skipped" >&2
    exit 77
fi
V3="--arch deepseek_v3 $SHAPE --first-dense 1 --q-lora-rank 24 --norm-topk-prob"
"$MKMODEL" --out "$WORK/gqa-bf16" --arch llama $SHAPE --kv-heads 1 --dtype bf16 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3" $V3 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3-bf16" $V3 --dtype bf16 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3-fp8" $V3 --quant fp8-block --fp8-block 32 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3-int4" $V3 --quant int4-w4a16 >/dev/null &&
    "$MKMODEL" --out "$WORK/v3-nvfp4" $V3 --quant nvfp4 >/dev/null || { fail "dcpinfer-mkmodel could not write the models"; finish; }

# every run: the KV cache given (no profiling pass), MPI on device buffers
RUN="--backend cuda --kv-cache-memory 64M --mpi-device-buffers yes"
for m in gqa gqa-bf16 v3 v3-bf16 v3-fp8 v3-int4 v3-nvfp4; do
    NP=1 run_dcp "$m-one" $RUN --model "$WORK/$m" --output "$WORK/$m-one.jsonl" "$P"
    [ "$(cat "$WORK/$m-one.rc")" = 0 ] || { fail "$m: one rank: exit $(cat "$WORK/$m-one.rc")"; cat "$WORK/$m-one.err" >&2; continue; }
    untimed "$WORK/$m-one.jsonl" >"$WORK/$m-one.want"
    for layout in "2 -tp 2" "4 -tp 4 -dcp 4"; do
        np=${layout%% *} args=${layout#* }
        name=$m-$np
        checks=$((checks + 1))
        NP=$np run_dcp "$name" $RUN --model "$WORK/$m" $args --output "$WORK/$name.jsonl" "$P"
        if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
            fail "$m $args: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2
        elif ! untimed "$WORK/$name.jsonl" | cmp -s - "$WORK/$m-one.want"; then
            fail "$m $args: tokens or log-probabilities differ from one rank's"
            untimed "$WORK/$name.jsonl" | diff - "$WORK/$m-one.want" | head -4 | cut -c1-300 >&2
        else
            pass "$m $args: every token and log-probability one rank's, bit for bit"
        fi
    done
    checks=$((checks + 1))
    NP=1 run_dcp "$m-alone" $RUN --model "$WORK/$m" --output "$WORK/$m-alone.jsonl" "$WORK/alone.jsonl"
    if [ "$(cat "$WORK/$m-alone.rc")" != 0 ]; then
        fail "$m alone: exit $(cat "$WORK/$m-alone.rc")"; cat "$WORK/$m-alone.err" >&2
    elif [ "$(untimed "$WORK/$m-alone.jsonl")" != "$(grep '"id":"s4"' "$WORK/$m-one.want")" ]; then
        fail "$m: request s4 alone differs from s4 in the batch of 9"
    else
        pass "$m: request s4 alone gives its bits in the batch of 9"
    fi
done
# speculative decoding on the GPU backend: n-gram drafts and the MTP
# layer's verified as chunks (split-KV attention over a chunk's rows, the
# LM head's rows) give the bits of the run without them, at one rank and
# -tp 4 -dcp 4, the MTP layer's the same drafts at both; the prompts hold
# a stale copy of the chain a --branch-scale model writes
# (tests/spec_decode.sh), so drafts are both accepted and rejected
"$MKMODEL" --out "$WORK/chain" --arch deepseek_v3 --layers 2 --dim 64 --heads 8 --hidden 128 --vocab 512 \
    --first-dense 1 --q-lora-rank 24 --norm-topk-prob --branch-scale 0.01 --mtp-layers 1 >/dev/null
seed_ids() { awk -v i=$1 'BEGIN { for (j = 0; j < 8; j++) printf "%s%d", j ? ", " : "", 3 + (j * 37 + i * 101 + 5) % 509 }'; }
for i in 0 1 2 3; do
    echo "{\"id\": \"c$i\", \"prompt_token_ids\": [$(seed_ids $i)], \"max_tokens\": 48, \"temperature\": 0, \"ignore_eos\": true}"
done >"$WORK/seeds.jsonl"
NP=1 run_dcp chain $RUN --model "$WORK/chain" --output "$WORK/chain.jsonl" "$WORK/seeds.jsonl"
for i in 0 1 2 3; do
    copy=$(token_ids "$WORK/chain.jsonl" c$i | awk -F, -v OFS=", " '{ for (k = 9; k <= NF; k += 9) $k = 3 + ($k + 1) % 509; $1 = $1; print }')
    t=$([ $i = 1 ] && echo 0.3 || echo 0)
    echo "{\"id\": \"c$i\", \"prompt_token_ids\": [$(seed_ids $i), $copy, $(seed_ids $i)], \"max_tokens\": 40, \"temperature\": $t, \"seed\": $i, \"logprobs\": 2}"
done >"$WORK/spec.jsonl"
NP=1 run_dcp spec-base $RUN --model "$WORK/chain" --output "$WORK/spec-base.jsonl" "$WORK/spec.jsonl"
unspec "$WORK/spec-base.jsonl" >"$WORK/spec-base.want"
for method in ngram mtp; do
    SPEC='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
    [ $method = mtp ] && SPEC='{"method": "mtp", "num_speculative_tokens": 3}'
    first=
    for layout in "1" "4 -tp 4 -dcp 4"; do
        np=${layout%% *}
        args=${layout#"$np"}
        name=spec-$method-$np
        checks=$((checks + 1))
        NP=$np run_dcp $name $RUN --model "$WORK/chain" $args --speculative-config "$SPEC" --output "$WORK/$name.jsonl" \
            "$WORK/spec.jsonl"
        a=$(grep -o '"spec_accepted_tokens":[0-9]*' "$WORK/$name.jsonl" | awk -F: '{s += $2} END {print s + 0}')
        d=$(grep -o '"spec_draft_tokens":[0-9]*' "$WORK/$name.jsonl" | awk -F: '{s += $2} END {print s + 0}')
        if [ "$(cat "$WORK/$name.rc")" != 0 ] || [ "$(cat "$WORK/spec-base.rc")" != 0 ]; then
            fail "$method -np $np$args: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" "$WORK/spec-base.err" >&2
        elif ! unspec "$WORK/$name.jsonl" | cmp -s - "$WORK/spec-base.want"; then
            fail "$method -np $np$args: the results differ from the run without it"
        elif ! [ "$a" -gt 0 ] || ! [ "$a" -lt "$d" ]; then
            fail "$method -np $np$args: $a of $d drafts accepted: not both accepted and rejected"
        elif [ -n "$first" ] && [ "$first" != "$d $a" ]; then
            fail "$method -np $np$args: $a of $d drafts accepted, at one rank $first"
        else
            pass "$method -np $np$args: the bits of the run without it, $a of $d drafts accepted"
            first="$d $a"
        fi
    done
done
# the draws are near their edges: bf16 weights (another rounding of the
# same model) change the bits
checks=$((checks + 1))
if cmp -s "$WORK/v3-one.want" "$WORK/v3-bf16-one.want"; then
    fail "fp32 and bf16 weights gave the same bits: the test cannot tell roundings apart"
else
    pass "fp32 and bf16 weights differ in the bits, as they should"
fi
finish
