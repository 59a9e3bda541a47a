#!/bin/sh
# vLLM's sampling parameters end to end (their values against references:
# tests/test_sampling.c): seeded draws with top_k, min_p, the three
# penalties and logit_bias, from request lines, from OpenAI batch bodies and
# from the command-line defaults, give the same tokens, bit for bit, at one
# rank, -tp 4 -dcp 2 and -dp 2 (the adjustments act on each rank's shard of
# the vocabulary before greedy's argmax and the gather); a logit_bias of
# +100 makes greedy choose its token every time, on any layout; repetition
# and frequency penalties change the draws; n > 1 sequences per line.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
"$MKMODEL" --out "$WORK/m" --layers 2 --dim 64 --heads 8 --kv-heads 2 --hidden 128 --vocab 32000 >/dev/null ||
    { echo "FAIL: dcpinfer-mkmodel could not write the model" >&2; exit 1; }
P=$WORK/p.jsonl
cat >"$P" <<'JSON'
{"id": "topk", "prompt_token_ids": [5, 17, 17, 4093, 12], "max_tokens": 12, "temperature": 1.0, "seed": 1, "top_k": 20}
{"id": "minp", "prompt_token_ids": [9, 8, 7], "max_tokens": 12, "temperature": 1.5, "seed": 2, "min_p": 0.2}
{"id": "pen", "prompt_token_ids": [3, 3, 3, 900], "max_tokens": 12, "temperature": 1.0, "seed": 3, "repetition_penalty": 1.5, "frequency_penalty": 1.0, "presence_penalty": 0.5}
{"id": "all", "prompt_token_ids": [44, 45, 46], "max_tokens": 12, "temperature": 0.8, "seed": 4, "top_k": 50, "min_p": 0.05, "top_p": 0.9, "repetition_penalty": 1.2, "logit_bias": {"31000": 4.0, "7": -100}}
{"id": "bias", "prompt_token_ids": [1, 2], "max_tokens": 6, "temperature": 0, "logit_bias": {"31337": 100}}
{"id": "plain", "prompt_token_ids": [5, 17, 17, 4093, 12], "max_tokens": 12, "temperature": 1.0, "seed": 1}
JSON
ids() { grep "\"id\":\"$2\"" "$1" | sed 's/.*"token_ids":\[\([^]]*\)\].*/\1/'; }
run_dcp one --model "$WORK/m" --output "$WORK/one.jsonl" "$P"
NP=4 run_dcp tp4 --model "$WORK/m" -tp 4 -dcp 2 --output "$WORK/tp4.jsonl" "$P"
NP=2 run_dcp dp2 --model "$WORK/m" -dp 2 --max-num-seqs 2 --output "$WORK/dp2.jsonl" "$P"
for l in tp4 dp2; do
    checks=$((checks + 1))
    same=1
    for r in topk minp pen all bias plain; do [ "$(ids "$WORK/one.jsonl" $r)" = "$(ids "$WORK/$l.jsonl" $r)" ] || same=0; done
    if [ "$(cat "$WORK/one.rc")" = 0 ] && [ "$(cat "$WORK/$l.rc")" = 0 ] && [ $same = 1 ]; then
        pass "$l: the tokens of one rank for top_k, min_p, the penalties and logit_bias"
    else
        fail "$l: exit $(cat "$WORK/$l.rc"), tokens differ from one rank's"; diff "$WORK/one.jsonl" "$WORK/$l.jsonl" | head -6 >&2
    fi
done
checks=$((checks + 1))
if [ "$(ids "$WORK/one.jsonl" bias)" = "31337,31337,31337,31337,31337,31337" ] &&
    [ "$(ids "$WORK/one.jsonl" topk)" != "$(ids "$WORK/one.jsonl" plain)" ]; then
    pass "logit_bias +100 makes greedy choose 31337; top_k 20 changes the seed's draws"
else
    fail "bias: $(ids "$WORK/one.jsonl" bias); topk $(ids "$WORK/one.jsonl" topk) plain $(ids "$WORK/one.jsonl" plain)"
fi
# the penalties: no token of the output repeats at frequency 2 over 40 tokens of a flat distribution
checks=$((checks + 1))
printf '{"id": "rep", "prompt_token_ids": [1], "max_tokens": 40, "temperature": 0, "frequency_penalty": 2.0, "presence_penalty": 2.0}\n' >"$WORK/rep.jsonl"
run_dcp rep --model "$WORK/m" --output "$WORK/rep.jsonl.out" --output-format jsonl "$WORK/rep.jsonl"
run_dcp norep --model "$WORK/m" --output "$WORK/norep.jsonl.out" --output-format jsonl "$WORK/rep.jsonl" --frequency-penalty 0
rep=$(ids "$WORK/rep.jsonl.out" rep | tr ',' '\n')
if [ "$(echo "$rep" | grep -c .)" = 40 ] && [ "$(echo "$rep" | sort | uniq -d | grep -c .)" = 0 ]; then
    pass "frequency and presence penalties 2: 40 greedy tokens, none repeated"
else
    fail "penalties: $(ids "$WORK/rep.jsonl.out" rep)"
fi
# the command line's defaults apply where a request does not say, in OpenAI batch bodies too
checks=$((checks + 1))
printf '{"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": [5, 17, 17, 4093, 12], "max_tokens": 12, "temperature": 1.0, "seed": 1}}\n' >"$WORK/b.jsonl"
run_dcp cli --model "$WORK/m" --top-k 20 --output "$WORK/cli.jsonl" "$WORK/b.jsonl"
printf '{"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": [5, 17, 17, 4093, 12], "max_tokens": 12, "temperature": 1.0, "seed": 1, "top_k": 20}}\n' >"$WORK/b2.jsonl"
run_dcp body --model "$WORK/m" --output "$WORK/body.jsonl" "$WORK/b2.jsonl"
cli=$(sed 's/.*"text":"\([^"]*\)".*/\1/' "$WORK/cli.jsonl")
body=$(sed 's/.*"text":"\([^"]*\)".*/\1/' "$WORK/body.jsonl")
if [ "$(cat "$WORK/cli.rc")" = 0 ] && [ "$cli" = "$body" ] && grep -q '"object":"text_completion"' "$WORK/body.jsonl"; then
    pass "--top-k 20 as a default equals a batch body's top_k 20"
else
    fail "defaults: exit $(cat "$WORK/cli.rc"): '$cli' vs '$body'"; cat "$WORK/cli.err" >&2
fi
# n: a line's sequences as one result; the first draws as n = 1 does, the
# others from seeds derived from its seed; the same at -tp 4 -dcp 2; in
# HDF5 one row per sequence with its "choice"; in an OpenAI batch body, n
# choices with usage over all of them
printf '%s\n' '{"id": "n3", "prompt_token_ids": [5, 6, 7], "max_tokens": 8, "temperature": 1.0, "seed": 9, "n": 3, "top_k": 30}' \
    '{"id": "n1", "prompt_token_ids": [5, 6, 7], "max_tokens": 8, "temperature": 1.0, "seed": 9, "top_k": 30}' >"$WORK/n.jsonl"
run_dcp n_one --model "$WORK/m" --output "$WORK/n_one.jsonl" "$WORK/n.jsonl"
NP=4 run_dcp n_tp4 --model "$WORK/m" -tp 4 -dcp 2 --output "$WORK/n_tp4.jsonl" "$WORK/n.jsonl"
choice_ids() { grep '"id":"n3"' "$1" | grep -o '"index":[0-9]*,"text":"[^"]*","token_ids":\[[^]]*\]' | sed 's/.*"token_ids":\[\([^]]*\)\]/\1/'; }
c=$(choice_ids "$WORK/n_one.jsonl")
checks=$((checks + 1))
if [ "$(echo "$c" | grep -c .)" = 3 ] && [ "$(echo "$c" | head -1)" = "$(ids "$WORK/n_one.jsonl" n1)" ] &&
    [ "$(echo "$c" | sort -u | grep -c .)" = 3 ] && [ "$c" = "$(choice_ids "$WORK/n_tp4.jsonl")" ] &&
    grep '"id":"n3"' "$WORK/n_one.jsonl" | grep -q '"completion_tokens":24,'; then
    pass "n 3: three sequences in one line, the first n = 1's, the same at -tp 4 -dcp 2"
else
    fail "n: $(cat "$WORK/n_one.jsonl")"
fi
if command -v h5dump >/dev/null 2>&1; then
    run_dcp n_h5 --model "$WORK/m" --output "$WORK/n.h5" "$WORK/n.jsonl"
    checks=$((checks + 1))
    choice=$(h5dump -y -d /requests/choice "$WORK/n.h5" | sed -n '/DATA {/,/}/p' | tr -d ' \n')
    if [ "$choice" = "DATA{0,1,2,0}" ]; then pass "n in HDF5: one row per sequence, choice 0 1 2 0"
    else fail "n in HDF5: $choice"; fi
fi
# (and the response ids number the output lines: consecutive after it;
# --served-model-name is the responses' "model")
for c in b c d; do
    printf '{"custom_id": "%s", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": [5, 6], "max_tokens": 3%s}}\n' \
        $c "$([ $c = b ] && echo ', "n": 2')"
done >"$WORK/nc.jsonl"
run_dcp nc --model "$WORK/m" --served-model-name org/served-name --output "$WORK/nc_out.jsonl" "$WORK/nc.jsonl"
checks=$((checks + 1))
if [ "$(cat "$WORK/nc.rc")" = 0 ] && "$BUILD/tests/read_batch_output" "$WORK/nc_out.jsonl" >/dev/null &&
    [ "$(head -1 "$WORK/nc_out.jsonl" | grep -o '"index":[01]' | tr -d '\n')" = '"index":0"index":1' ] &&
    head -1 "$WORK/nc_out.jsonl" | grep -q '"completion_tokens":6,' &&
    [ "$(grep -o '^{"id":"dcpinfer-[0-9]*-[0-9]*"' "$WORK/nc_out.jsonl" | sed 's/.*-\([0-9]*\)"$/\1/' | tr '\n' ' ')" = "0 1 2 " ] &&
    [ "$(grep -c '"model":"org/served-name"' "$WORK/nc_out.jsonl")" = 3 ]; then
    pass "n 2 in an OpenAI batch body: two choices, usage over both; response ids 0, 1, 2 for its line and the next two; --served-model-name"
else
    fail "n in a batch body: $(cat "$WORK/nc_out.jsonl" "$WORK/nc.err")"
fi
expect_error bad_topk 2 "--top-k: -3 is out of range: it takes -1 to 2147483647" --model "$WORK/m" --top-k -3 "$P"
printf '{"id": "x", "prompt_token_ids": [1], "logit_bias": {"40000": 1}}\n' >"$WORK/bad.jsonl"
expect_error bias_vocab 1 '"logit_bias" names token 40000, outside the vocabulary [0, 32000)' --model "$WORK/m" "$WORK/bad.jsonl"
finish
