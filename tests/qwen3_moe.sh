#!/bin/sh
# Qwen3-MoE (every feed-forward block a mixture of experts, routed by
# softmax and renormalized) gives transformers' 32 greedy tokens after its
# 320-token prompt (tests/data/hf/qwen3_moe, tests/ref/make_hf_refs.py) at
# one rank and at every kind of layout: its experts split by TP, its KV
# cache by DCP (4 query heads share each of 2 KV heads), DP, chunked
# prefill and a second request in the same steps, and expert parallelism
# (whole experts over 4 and 8 ranks, no shared experts). The plan's weight
# bytes are the run's.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
M=$SRC/tests/data/hf/qwen3_moe
want=$(id_list "$M/greedy.txt")
printf '{"id": "ref", "prompt_token_ids": [%s], "max_tokens": 32, "temperature": 0, "ignore_eos": true}\n' \
    "$(id_list "$M/prompt.txt")" >"$WORK/p.jsonl"
printf '{"id": "b", "prompt_token_ids": [7, 7, 7, 1, 150, 3], "max_tokens": 20, "temperature": 0, "ignore_eos": true}\n' \
    >>"$WORK/p.jsonl"
run_dcp one --model "$M" --output "$WORK/one.jsonl" "$WORK/p.jsonl"
other=$(token_ids "$WORK/one.jsonl" b)
for layout in "1 --max-num-batched-tokens 64" "2 -tp 2" "4 -tp 4 -dcp 2 --max-num-batched-tokens 100" \
    "8 -tp 8 -dcp 4 --dcp-comm-backend a2a" "4 -tp 2 -dp 2" "8 -tp 4 -dcp 2 -dp 2 --max-num-batched-tokens 64" \
    "4 -tp 4 -dcp 2 --enable-expert-parallel" "8 -tp 2 -dp 4 --enable-expert-parallel --max-num-batched-tokens 64"; do
    checks=$((checks + 1))
    np=${layout%% *}
    name=$(echo "$layout" | tr -d ' -')
    NP=$np run_dcp "$name" --model "$M" --max-num-seqs 4 ${layout#"$np"} --output "$WORK/$name.jsonl" "$WORK/p.jsonl"
    if [ "$(cat "$WORK/$name.rc")" = 0 ] && [ "$(token_ids "$WORK/$name.jsonl" ref)" = "$want" ] && [ -n "$other" ] &&
        [ "$(token_ids "$WORK/$name.jsonl" b)" = "$other" ]; then
        pass "${layout#"$np" }: transformers' 32 greedy tokens, and one rank's for the second request"
    else
        fail "${layout#"$np" }: exit $(cat "$WORK/$name.rc"), '$(token_ids "$WORK/$name.jsonl" ref)' vs '$want'"
        cat "$WORK/$name.err" >&2
    fi
done
checks=$((checks + 1))
NP=4 run_dcp w --model "$M" -tp 4 -dcp 2 --output "$WORK/w.h5" "$WORK/p.jsonl"
plan=$("$BUILD/dcpinfer-plan" --model "$M" -tp 4 -dcp 2 | sed -n 's/^# weight bytes by TP rank: //p')
run=$(h5_numbers "$WORK/w.h5" /memory/weight_bytes | tr '\n' ' ' | sed 's/ $//')
if [ -n "$plan" ] && [ "$plan" = "$run" ]; then
    pass "-tp 4 -dcp 2: the plan's weight bytes per rank are the run's ($run)"
else
    fail "-tp 4 -dcp 2: the plan says '$plan' weight bytes per rank, the run '$run'"
fi
finish
