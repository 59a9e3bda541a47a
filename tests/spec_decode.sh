#!/bin/bash
# Speculative decoding changes no output (docs/design.md, "Speculative
# decoding"): a mixed batch - greedy, seeded sampling at temperature 0.8
# with top-p and top-k, a stop string, min_tokens, logprobs and
# prompt_logprobs - gives the JSON Lines of a run without speculation,
# byte for byte less the timings and the speculation counts, with n-gram
# drafts at K = 1, 3 and 5, at one rank, -tp 2, -tp 4 -dcp 4 (ag_rs and
# a2a), -tp 2 -dp 2, -tp 2 -dp 2 with expert parallelism (against its
# own run without speculation: EP is its own reduction order), under
# preemption (a KV cache of a few blocks, chunked prefill) and after a
# killed run is resumed; for DeepSeek-V3 (latent attention, MoE) and a
# Llama model of one KV head. The same with DeepSeek's MTP drafts from a
# DeepSeek-V3 model written with an MTP layer, which also drafts the same
# tokens at every layout, and drafts and accepts, request by request, what
# transformers and a torch MTP module give (tests/data/spec/mtp_counts.txt). The drafts really are tried: some accepted, some
# rejected, and the counts add up between the requests, the steps and the
# summary line.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
TOK=$SHARED/models/stories260K/tok512.bin
[ -f "$TOK" ] || { echo "$TOK not found: skipped" >&2; exit 77; }
command -v h5dump >/dev/null 2>&1 || { echo "h5dump (hdf5-tools) not installed: skipped" >&2; exit 77; }
SHAPE="--layers 2 --dim 64 --heads 8 --hidden 128 --vocab 512 --branch-scale 0.01"
"$MKMODEL" --out "$WORK/v3" --arch deepseek_v3 $SHAPE --first-dense 1 --q-lora-rank 24 --norm-topk-prob >/dev/null &&
    "$MKMODEL" --out "$WORK/mtp" --arch deepseek_v3 $SHAPE --first-dense 1 --q-lora-rank 24 --norm-topk-prob \
        --mtp-layers 1 >/dev/null &&
    "$MKMODEL" --out "$WORK/llama" --arch llama $SHAPE --kv-heads 1 >/dev/null ||
    { echo "FAIL: dcpinfer-mkmodel could not write the models" >&2; exit 1; }

# Prompts whose outputs repeat parts of them, as tool results copied into
# an answer: with o_proj and down_proj scaled down (--branch-scale) each
# token's successor follows mostly from the token itself, so the greedy
# chain a seed of 8 ids starts is continued wherever the prompt holds it.
# A prompt is the seed, its chain with every 9th token changed, and the
# seed again: drafts from the copy are accepted up to a changed token.
seed_ids() { awk -v i=$1 'BEGIN { for (j = 0; j < 8; j++) printf "%s%d", j ? ", " : "", 3 + (j * 37 + i * 101 + 5) % 509 }'; }
for i in 0 1 2 3 4 5 6 7; do
    echo "{\"id\": \"r$i\", \"prompt_token_ids\": [$(seed_ids $i)], \"max_tokens\": 48, \"temperature\": 0, \"ignore_eos\": true}"
done >"$WORK/seeds.jsonl"
# requests 1 and 3 sample at temperature 0.8, 4 at 0.3 (near enough to the
# chain that its drafts are tried: its generator must draw once per token
# output), 2 has min_tokens and logprobs, 3 scores its prompt, 5 gets a
# stop string from a first run's text, the others want logprobs
prompts() {
    for i in 0 1 2 3 4 5 6 7; do
        chain=$(token_ids "$WORK/$m-chain.jsonl" r$i | awk -F, -v OFS=", " '{ for (k = 9; k <= NF; k += 9) $k = 3 + ($k + 1) % 509; $1 = $1; print }')
        case $i in
        1) extra=', "temperature": 0.8, "top_p": 0.9, "top_k": 40' ;;
        4) extra=', "temperature": 0.3, "top_p": 0.9, "top_k": 40, "logprobs": 1' ;;
        2) extra=', "temperature": 0, "min_tokens": 30, "logprobs": 2' ;;
        3) extra=', "prompt_logprobs": 1, "temperature": 0.8' ;;
        5) extra=', "temperature": 0'${STOP:+, \"stop\": [\"$STOP\"]} ;;
        *) extra=', "temperature": 0, "logprobs": 1' ;;
        esac
        echo "{\"id\": \"r$i\", \"prompt_token_ids\": [$(seed_ids $i), $chain, $(seed_ids $i)], \"max_tokens\": $((36 + 4 * i)), \"seed\": $((i + 3))$extra}"
    done
}

SPEC() { echo "{\"method\": \"ngram\", \"num_speculative_tokens\": $1, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}"; }
MTP() { echo "{\"method\": \"${2:-mtp}\", \"num_speculative_tokens\": $1}"; }

for m in v3 mtp llama; do
    STOP=
    run_dcp "$m-chain" --model "$WORK/$m" --output "$WORK/$m-chain.jsonl" "$WORK/seeds.jsonl"
    prompts >"$WORK/$m-p0.jsonl"
    run_dcp "$m-first" --model "$WORK/$m" --tokenizer "$TOK" --output "$WORK/$m-first.jsonl" "$WORK/$m-p0.jsonl"
    # the stop string: three characters from the middle of request 5's text
    STOP=$(python3 -c 'import json, re, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["id"] == "r5":
        words = re.findall("[a-z]{3}", r["text"][len(r["text"]) // 3:])
        print(words[0] if words else "")' "$WORK/$m-first.jsonl")
    P=$WORK/$m-p.jsonl
    prompts >"$P"
    checks=$((checks + 1))
    if [ -z "$STOP" ]; then
        fail "$m: no stop string could be taken from request 5's text"
        continue
    fi
    run_dcp "$m-base" --model "$WORK/$m" --tokenizer "$TOK" --output "$WORK/$m-base.jsonl" "$P"
    if [ "$(cat "$WORK/$m-base.rc")" != 0 ] || ! grep -q '"id":"r5".*"finish_reason":"stop","stop_reason":"'"$STOP"'"' "$WORK/$m-base.jsonl"; then
        fail "$m: the run without speculation failed or its stop string \"$STOP\" did not stop request 5"
        cat "$WORK/$m-base.err" >&2
        continue
    fi
    pass "$m: without speculation, request 5 stops at \"$STOP\""
    unspec "$WORK/$m-base.jsonl" >"$WORK/$m.want"
    if [ $m != llama ]; then # (the MTP layer's own cache takes a third more per position)
        Ks="1 3 5"
        set -- "1" "2 -tp 2" "4 -tp 4 -dcp 4" "4 -tp 4 -dcp 4 --dcp-comm-backend a2a" "4 -tp 2 -dp 2" \
            "4 -tp 2 -dp 2 --enable-expert-parallel" \
            "2 -tp 2 --kv-cache-memory $([ $m = mtp ] && echo 60K || echo 40K) --block-size 4 --max-num-batched-tokens 24 --max-num-seqs 4"
    else
        Ks=3
        set -- "1" "4 -tp 4 -dcp 4" "2 -tp 2 --kv-cache-memory 16K --block-size 4 --max-num-batched-tokens 24 --max-num-seqs 4"
    fi
    drafted=0 accepted=0
    for K in $Ks; do
        first=
        for layout in "$@"; do
            np=${layout%% *}
            args=${layout#"$np"}
            name=$m-k$K-$(printf "%s" "$args" | tr -c "a-z0-9" "_")
            want=$WORK/$m.want
            if [ "$args" != "${args#*expert}" ]; then # EP is its own reduction order: its run without speculation
                want=$WORK/$m-ep.want
                [ -f "$want" ] || { NP=$np run_dcp "$m-ep" --model "$WORK/$m" --tokenizer "$TOK" $args \
                    --output "$WORK/$m-ep.jsonl" "$P" && unspec "$WORK/$m-ep.jsonl" >"$want"; }
            fi
            checks=$((checks + 1))
            spec=$(SPEC $K)
            [ $m = mtp ] && spec=$(MTP $K $([ "$np" = 4 ] && echo deepseek_mtp))
            NP=$np run_dcp "$name" --model "$WORK/$m" --tokenizer "$TOK" $args --speculative-config "$spec" \
                --output "$WORK/$name.jsonl" "$P"
            if [ "$(cat "$WORK/$name.rc")" != 0 ]; then
                fail "$m, K=$K, -np $np$args: exit $(cat "$WORK/$name.rc")"; cat "$WORK/$name.err" >&2; continue
            elif ! unspec "$WORK/$name.jsonl" | cmp -s - "$want"; then
                fail "$m, K=$K, -np $np$args: the results differ from the run without speculation"
                unspec "$WORK/$name.jsonl" | diff - "$want" | head -4 | cut -c1-300 >&2
                continue
            fi
            d=$(grep -o '"spec_draft_tokens":[0-9]*' "$WORK/$name.jsonl" | awk -F: '{s += $2} END {print s + 0}')
            a=$(grep -o '"spec_accepted_tokens":[0-9]*' "$WORK/$name.jsonl" | awk -F: '{s += $2} END {print s + 0}')
            line=$(grep '^# speculative decoding' "$WORK/$name.out")
            if ! echo "$line" | grep -q "K=$K): $d draft token(s) in [0-9]* verification(s), $a accepted"; then
                fail "$m, K=$K, -np $np$args: the summary line disagrees with the requests' $d drafts, $a accepted: $line"
            elif [ "$args" != "${args#*kv-cache-memory}" ] && ! grep -qE ', [1-9][0-9]* preemption' "$WORK/$name.out"; then
                fail "$m, K=$K, -np $np$args: nothing was preempted"; grep preemption "$WORK/$name.out" >&2
            elif [ $m = mtp ] && [ "$args" = "${args#*kv-cache-memory}" ] && [ -n "$first" ] && [ "$first" != "$d $a" ]; then
                # the MTP layer's bits are the same at every layout, so are its drafts
                fail "$m, K=$K, -np $np$args: $a of $d drafts accepted, at one rank $first"
            else
                [ -z "$first" ] && first="$d $a"
                pass "$m, K=$K, -np $np$args: the same results; $a of $d drafts accepted"
                drafted=$((drafted + d)) accepted=$((accepted + a))
            fi
        done
    done
    checks=$((checks + 1))
    if [ "$accepted" -gt 0 ] && [ "$accepted" -lt "$drafted" ]; then
        pass "$m: drafts were both accepted and rejected ($accepted of $drafted)"
    else
        fail "$m: $accepted of $drafted drafts accepted: the runs did not exercise both"
    fi
done

# the MTP layer's drafts against torch's: each request's drafted and
# accepted counts at K = 1, 2, 3 are those a simulation of the scheduler
# over transformers' run of the MTP model with branches at 0.1 (attention
# then moves the drafts) and a torch MTP module gives, and its tokens
# transformers' (tests/ref/make_mtp_refs.py)
REF=$SRC/tests/data/spec/mtp_counts.txt
"$MKMODEL" --out "$WORK/mtp-ref" --arch deepseek_v3 $SHAPE --branch-scale 0.1 --first-dense 1 --q-lora-rank 24 \
    --norm-topk-prob --mtp-layers 1 >/dev/null
for i in 0 1 2 3; do
    echo "{\"id\": \"r$i\", \"prompt_token_ids\": [$(seed_ids $i)], \"max_tokens\": 40, \"temperature\": 0}"
done >"$WORK/mtp-ref.jsonl"
for K in 1 2 3; do
    run_dcp mtp-ref-k$K --model "$WORK/mtp-ref" --speculative-config "$(MTP $K)" --output "$WORK/mtp-ref-k$K.jsonl" \
        "$WORK/mtp-ref.jsonl"
    checks=$((checks + 1))
    got=$(python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(sys.argv[2], r["id"], r["usage"]["spec_draft_tokens"], r["usage"]["spec_accepted_tokens"])
    print("tokens", r["id"], " ".join(map(str, r["token_ids"])))' "$WORK/mtp-ref-k$K.jsonl" $K | sort)
    want=$(grep -E "^($K|tokens) " "$REF" | sort)
    if [ "$(cat "$WORK/mtp-ref-k$K.rc")" != 0 ] || [ -z "$want" ] || [ "$got" != "$want" ]; then
        fail "mtp against torch, K=$K: the drafts or tokens differ"; diff <(echo "$got") <(echo "$want") | head -6 | cut -c1-200 >&2
    else
        pass "mtp against torch, K=$K: each request's drafts and acceptances, $(echo "$want" | grep -v tokens | awk '{d += $3; a += $4} END {print a " of " d}'), and tokens"
    fi
done

# an MTP layer stored as the layers are: FP8 blocks, INT4 experts and
# NVFP4 (ModelOpt, W4A4) experts, each the run's without speculation
for q in "fp8-block --fp8-block 16" int4-w4a16 nvfp4-modelopt; do
    f=${q%% *}
    "$MKMODEL" --out "$WORK/mtp-$f" --arch deepseek_v3 $SHAPE --first-dense 1 --q-lora-rank 24 --norm-topk-prob \
        --mtp-layers 1 --quant $q >/dev/null
    run_dcp mtp-$f-base --model "$WORK/mtp-$f" --output "$WORK/mtp-$f-base.jsonl" "$WORK/mtp-ref.jsonl"
    run_dcp mtp-$f --model "$WORK/mtp-$f" --speculative-config "$(MTP 3)" --output "$WORK/mtp-$f.jsonl" "$WORK/mtp-ref.jsonl"
    checks=$((checks + 1))
    kind=$(grep -o 'experts [a-z0-9-]*' "$WORK/mtp-$f.out" | head -1)
    a=$(grep -o '"spec_accepted_tokens":[0-9]*' "$WORK/mtp-$f.jsonl" | awk -F: '{s += $2} END {print s + 0}')
    if [ "$(cat "$WORK/mtp-$f.rc")" != 0 ] || [ "$(cat "$WORK/mtp-$f-base.rc")" != 0 ]; then
        fail "mtp, $f: exit $(cat "$WORK/mtp-$f.rc")"; cat "$WORK/mtp-$f.err" "$WORK/mtp-$f-base.err" >&2
    elif ! unspec "$WORK/mtp-$f.jsonl" | cmp -s - <(unspec "$WORK/mtp-$f-base.jsonl"); then
        fail "mtp, $f: the results differ from the run without speculation"
    elif ! grep -q "and an MTP layer; attention" "$WORK/mtp-$f.out" || [ "$kind" = "experts float32" ] || ! [ "$a" -gt 0 ]; then
        fail "mtp, $f: $a drafts accepted; $(grep '# weights' "$WORK/mtp-$f.out")"
    else
        pass "mtp, $f ($kind): the results without speculation, $a drafts accepted"
    fi
done

# the HDF5 results: the per-request counts, and the steps' adding up to them
name=v3-h5
run_dcp $name --model "$WORK/v3" --tokenizer "$TOK" --speculative-config "$(SPEC 3)" --output "$WORK/$name.h5" "$WORK/v3-p.jsonl"
checks=$((checks + 1))
rd=$(h5_sum "$WORK/$name.h5" /requests/spec_draft_tokens) ra=$(h5_sum "$WORK/$name.h5" /requests/spec_accepted_tokens)
sd=$(h5_sum "$WORK/$name.h5" /steps/spec_drafted) sa=$(h5_sum "$WORK/$name.h5" /steps/spec_accepted)
jd=$(grep -o '"spec_draft_tokens":[0-9]*' "$WORK/v3-k3-.jsonl" | awk -F: '{s += $2} END {print s + 0}')
if [ "$(cat "$WORK/$name.rc")" = 0 ] && [ "$rd" = "$sd" ] && [ "$ra" = "$sa" ] && [ "$rd" = "$jd" ] && [ "$rd" -gt 0 ]; then
    pass "HDF5: /requests and /steps count the same $rd drafts, $ra accepted"
else
    fail "HDF5: /requests $rd drafts $ra accepted, /steps $sd and $sa, JSON Lines $jd drafts"; cat "$WORK/$name.err" >&2
fi

# a run killed halfway and resumed with speculation: the uninterrupted
# results (but for the prompt positions found in the prefix cache, which
# depend on what the killed run had computed); with n-gram drafts and with
# the MTP layer's
uncached() { unspec "$1" | sed -E 's/"cached_tokens":[0-9]+//'; }
resume_check() { # model, --speculative-config
    local m=$1 spec=$2 P=$WORK/$1-many-p.jsonl out=$WORK/$1-killed.jsonl
    for r in 0 1 2; do sed "s/\"id\": \"r/\"id\": \"x$r-r/" "$WORK/$m-p.jsonl"; done >"$P"
    run_dcp $m-many --model "$WORK/$m" --tokenizer "$TOK" --max-num-seqs 2 --output "$WORK/$m-many.jsonl" "$P"
    "$MPIRUN" -q --oversubscribe --bind-to none -np 2 "$DCPINFER" --model "$WORK/$m" --tokenizer "$TOK" -tp 2 \
        --max-num-seqs 2 --speculative-config "$spec" --output "$out" "$P" >"$WORK/$m-killed.out" 2>&1 &
    local job=$! waited=0 victim journaled
    while [ "$(grep -c '' "$out.journal.dp0" 2>/dev/null || echo 0)" -lt 8 ] && [ $waited -lt 1200 ] && kill -0 $job 2>/dev/null; do
        sleep 0.02; waited=$((waited + 1))
    done
    victim=$(pgrep -f "^$DCPINFER .*--output $out" | tail -1)
    checks=$((checks + 1))
    journaled=$(grep -c '' "$out.journal.dp0" 2>/dev/null)
    if [ -z "$victim" ]; then
        fail "$m resume: the run ended before it could be killed"
        return
    fi
    kill -9 "$victim"
    wait $job 2>/dev/null
    NP=2 run_dcp $m-resumed --model "$WORK/$m" --tokenizer "$TOK" -tp 2 --max-num-seqs 2 \
        --speculative-config "$spec" --resume --output "$out" "$P"
    if [ "$(cat "$WORK/$m-resumed.rc")" != 0 ]; then
        fail "$m resume: exit $(cat "$WORK/$m-resumed.rc")"; cat "$WORK/$m-resumed.err" >&2
    elif ! uncached "$out" | cmp -s - <(uncached "$WORK/$m-many.jsonl"); then
        fail "$m resume: the resumed results differ from an uninterrupted run without speculation"
        uncached "$out" | diff - <(uncached "$WORK/$m-many.jsonl") | head -4 | cut -c1-300 >&2
    elif ! grep -q "resum" "$WORK/$m-resumed.out" "$WORK/$m-resumed.err"; then
        fail "$m resume: the run does not say it resumed"
    else
        pass "$m resume: killed with $journaled of 24 requests journaled, resumed with speculation: the uninterrupted results"
    fi
}
resume_check v3 "$(SPEC 3)"
resume_check mtp "$(MTP 3)"

# vLLM's refusals, one line each
expect_error spec-bad-json 2 "--speculative-config '{method': not a JSON object" \
    --model "$WORK/v3" --speculative-config "{method" "$WORK/v3-p.jsonl"
expect_error spec-bad-k 2 "num_speculative_tokens 0: give an integer from 1 to 16" \
    --model "$WORK/v3" --speculative-config '{"method": "ngram", "num_speculative_tokens": 0}' "$WORK/v3-p.jsonl"
expect_error spec-min-max 2 "prompt_lookup_min 5 exceeds prompt_lookup_max 3" \
    --model "$WORK/v3" --speculative-config '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}' "$WORK/v3-p.jsonl"
expect_error spec-method 2 "method \"eagle\": choose ngram, mtp or deepseek_mtp" \
    --model "$WORK/v3" --speculative-config '{"method": "eagle", "num_speculative_tokens": 2}' "$WORK/v3-p.jsonl"
expect_error spec-no-mtp 1 "speculative decoding with \"mtp\" needs a DeepSeek model with multi-token-prediction layers" \
    --model "$WORK/v3" --speculative-config "$(MTP 2)" "$WORK/v3-p.jsonl"
echo '{"prompt_token_ids": [1, 2, 3]}' >"$WORK/tiny.jsonl"
expect_error spec-mtp-left-out 1 "says num_nextn_predict_layers 1, but the checkpoint has no 'model.layers.3.embed_tokens.weight'" \
    --model "$SRC/tests/data/deepseek/v3_yarn" --speculative-config "$(MTP 2)" "$WORK/tiny.jsonl"
finish
