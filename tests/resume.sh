#!/bin/bash
# Nothing lost: a run killed halfway (SIGKILL to one rank) and rerun with
# --resume writes the tokens and texts of an uninterrupted run, at 1 rank,
# at -tp 8 -dcp 2, and killed at -tp 2 and resumed at -tp 4 (half of the
# requests sampled), and the resumed run prefills only the requests the
# killed one had not finished; resuming on a layout of another reduction
# order is refused; resuming with other inputs is refused; records spliced
# from a journal of other inputs are redone; a rank stopped with SIGSTOP
# ends the job within --step-timeout.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
command -v h5dump >/dev/null 2>&1 || { echo "h5dump (hdf5-tools) not installed: skipped" >&2; exit 77; }
stories_or_generated
P=$WORK/p.jsonl
for i in $(seq 0 63); do
    t=$([ $((i % 2)) = 0 ] && echo 0.8 || echo 0)
    prompt=$(story_prompt $i)
    # some ask for log-probabilities and a stop string, which the journal must keep too
    extra=$([ -n "$M" ] && [ $((i % 4)) = 1 ] && echo ', "logprobs": 2, "prompt_logprobs": 1, "stop": [" park", "ball"]')
    echo "{\"id\": \"q$i\", $prompt, \"max_tokens\": $((40 + i % 50)), \"temperature\": $t, \"seed\": $i$extra}"
done >"$P"

vals() { h5dump -y -d "$2" "$1" 2>/dev/null | sed -n '/DATA {/,/}/p'; }
attr() { h5dump -a "$2" "$1" 2>/dev/null | sed -n 's/.*(0): *//p'; }
sum() { vals "$1" "$2" | tr -c '0-9\n' ' ' | tr -s ' \n' '\n' | grep . | awk '{s += $1} END {print s + 0}'; }
# lines of a file, 0 when missing
lines() { if [ -f "$1" ]; then grep -c '' "$1"; else echo 0; fi; }

# same_results A B: the two files hold the same per-request results
same_results() {
    for d in output_tokens text stop_str stop_token output_logprobs output_top_ids output_top_logprobs prompt_logprobs \
        prompt_top_ids; do
        [ "$(vals "$1" /requests/$d)" = "$(vals "$2" /requests/$d)" ] || { echo "/requests/$d differs" >&2; return 1; }
    done
}

# kill_and_resume NAME NP LAYOUT...: an uninterrupted run, a run whose
# last rank is killed once its journal holds 16 finished requests, then
# --resume (on RESUME_LAYOUT, "NP ARGS", when set); compares the results
# and the work the resumed run did
kill_and_resume() {
    local name=$1 np=$2; shift 2
    local rnp=$np
    local -a rargs=("$@")
    if [ -n "${RESUME_LAYOUT:-}" ]; then
        rnp=${RESUME_LAYOUT%% *}
        read -ra rargs <<<"${RESUME_LAYOUT#"$rnp"}"
    fi
    NP=$np run_dcp "$name-full" $M "$@" --max-num-seqs 2 --output "$WORK/$name-full.h5" "$P"
    local out=$WORK/$name.h5
    timeout 300 "$MPIRUN" -q --oversubscribe --bind-to none -np "$np" "$DCPINFER" $M "$@" --max-num-seqs 2 \
        --output "$out" "$P" >"$WORK/$name-killed.out" 2>&1 &
    local job=$! waited=0
    while [ "$(lines "$out.journal.dp0")" -le 16 ] && [ $waited -lt 1200 ] && kill -0 $job 2>/dev/null; do
        sleep 0.05; waited=$((waited + 1))
    done
    local victim
    victim=$(pgrep -f "^$DCPINFER .*--output $out" | tail -1)
    checks=$((checks + 1))
    if [ -z "$victim" ]; then
        fail "$name: the run ended before it could be killed ($(lines "$out.journal.dp0") journal lines)"
        wait $job
        return
    fi
    kill -9 "$victim"
    local t0 end_s
    t0=$(date +%s)
    wait $job
    end_s=$(($(date +%s) - t0))
    local journaled
    journaled=$(($(lines "$out.journal.dp0") - 1))
    if [ $end_s -le 20 ] && [ ! -e "$out" ] && [ "$journaled" -ge 16 ] && [ "$journaled" -lt 64 ]; then
        pass "$name: rank killed; the job ended in ${end_s} s with $journaled requests journaled, no results file"
    else
        fail "$name: after the kill: ended in ${end_s} s, results file $([ -e "$out" ] && echo exists || echo absent), $journaled journaled"
    fi
    local finished
    finished=$(grep -o '"i":[0-9]*' "$out.journal.dp0" | cut -d: -f2 | tr '\n' ' ')
    NP=$rnp run_dcp "$name-resumed" $M "${rargs[@]}" --max-num-seqs 2 --resume --output "$out" "$P"
    checks=$((checks + 1))
    local resumed want_prefill got_prefill
    resumed=$(attr "$out" /resumed_requests)
    # prompt tokens of the requests the killed run had not finished
    want_prefill=$(vals "$out" /requests/prompt_offsets | tr -c '0-9\n' ' ' | tr -s ' \n' '\n' | grep . |
        awk -v done=" $finished" '{off[NR - 1] = $1} END {
            for (i = 0; i < NR - 1; i++) if (index(done, " " i " ") == 0) s += off[i + 1] - off[i]; print s + 0}')
    got_prefill=$(sum "$out" /steps/prefill_tokens)
    if [ "$(cat "$WORK/$name-resumed.rc")" != 0 ]; then
        fail "$name: resumed run exit $(cat "$WORK/$name-resumed.rc")"; cat "$WORK/$name-resumed.err" >&2
    elif ! same_results "$WORK/$name-full.h5" "$out"; then
        fail "$name: resumed tokens, texts, stops or log-probabilities differ from the uninterrupted run"
    else
        pass "$name: resumed $resumed requests from the journal; tokens, texts, stops and log-probabilities equal the uninterrupted run's"
    fi
    echo "$name: the resumed run prefilled $got_prefill prompt tokens; the unfinished requests have $want_prefill" >&2
    checks=$((checks + 1))
    if [ "$resumed" = "$journaled" ] && [ -n "$want_prefill" ] && [ "$got_prefill" = "$want_prefill" ] &&
        [ -z "$(ls "$out".journal* 2>/dev/null)" ]; then
        pass "$name: the resumed run did only the unfinished requests ($got_prefill prompt tokens); journal removed"
    else
        fail "$name: resumed $resumed (journaled $journaled), prefilled $got_prefill of $want_prefill; journal files: $(ls "$out".journal* 2>/dev/null)"
    fi
}

kill_and_resume one 1
kill_and_resume tp8dcp2 8 -tp 8 -dcp 2
# another layout of the same reduction order (docs/design.md, "Same bits at
# any layout") continues the run: its sampled requests draw the same tokens
RESUME_LAYOUT="4 -tp 4" kill_and_resume tp2to4 2 -tp 2

# other inputs than the journal's are refused; a complete file is left alone
out=$WORK/refuse.h5
(timeout 120 "$MPIRUN" -q -np 1 "$DCPINFER" $M --max-num-seqs 1 --output "$out" "$P" >/dev/null 2>&1 &)
for i in $(seq 400); do [ "$(lines "$out.journal.dp0")" -ge 3 ] && break; sleep 0.05; done
pkill -9 -f "^$DCPINFER .*--output $out"
sleep 0.5
sed 's/"max_tokens": 4/"max_tokens": 5/' "$P" >"$WORK/other.jsonl"
expect_error resume_other_prompts 1 "was written with another prompt file (its bytes)" $M --resume --output "$out" "$WORK/other.jsonl"
expect_error resume_other_sampling 1 "was written with another --seed: \"0\" there, \"9\" in this run" $M --resume --seed 9 --output "$out" "$P"
# a layout of another reduction order (here another interleave, or a tp
# that does not divide the model's K chunks) would not give the same bits
NP=8 expect_error resume_other_order 1 "was written with another reduction order" $M -tp 8 -dcp 2 \
    --cp-kv-cache-interleave-size 2 --resume --output "$out" "$P"
checks=$((checks + 1))
if [ -f "$out.journal.dp0" ]; then pass "the journal is kept after a refusal"; else fail "refusal removed the journal"; fi
before=$(stat -c %Y "$WORK/one.h5")
sleep 1
NP=1 run_dcp complete $M --max-num-seqs 2 --resume --output "$WORK/one.h5" "$P"
checks=$((checks + 1))
if [ "$(cat "$WORK/complete.rc")" = 0 ] && grep -q "already the complete result" "$WORK/complete.out" &&
    [ "$(stat -c %Y "$WORK/one.h5")" = "$before" ]; then
    pass "--resume on a complete results file: nothing to do, file untouched"
else
    fail "--resume on a complete file: exit $(cat "$WORK/complete.rc")"; cat "$WORK/complete.out" >&2
fi

# a journal spliced from a run of other inputs (the same prompts with
# other seeds) under this run's header: its records fail their checksums,
# which cover the run's identity, and their requests run again; the
# results are the uninterrupted run's
sed 's/"seed": \([0-9]*\)/"seed": 1\1/' "$P" >"$WORK/seeds.jsonl"
b=$WORK/seeds.h5
(timeout 120 "$MPIRUN" -q -np 1 "$DCPINFER" $M --max-num-seqs 2 --output "$b" "$WORK/seeds.jsonl" >/dev/null 2>&1 &)
for i in $(seq 1200); do [ "$(lines "$b.journal.dp0")" -ge 17 ] && break; sleep 0.05; done
pkill -9 -f "^$DCPINFER .*--output $b"
sleep 0.5
sp=$WORK/splice.h5
{ head -1 "$out.journal.dp0"; tail -n +2 "$b.journal.dp0"; } >"$sp.journal.dp0"
foreign=$(($(lines "$sp.journal.dp0") - 1))
NP=1 run_dcp splice $M --max-num-seqs 2 --resume --output "$sp" "$P"
checks=$((checks + 1))
if [ "$(cat "$WORK/splice.rc")" = 0 ] && [ "$foreign" -ge 16 ] &&
    grep -q "^# --resume: $foreign journal record(s) failed their checks.*written by a run of other inputs" \
        "$WORK/splice.out" && same_results "$WORK/one-full.h5" "$sp"; then
    pass "$foreign records of another run's journal under this run's header: all redone, the uninterrupted run's results"
else
    fail "spliced journal ($foreign foreign records): exit $(cat "$WORK/splice.rc"): $(grep -m1 'resume' "$WORK/splice.out")"
    cat "$WORK/splice.err" >&2
fi

# a stopped rank: the others end the job within the step timeout
out=$WORK/stopped.h5
timeout 120 "$MPIRUN" -q --oversubscribe --bind-to none -np 2 "$DCPINFER" $M -tp 2 --max-num-seqs 1 \
    --step-timeout 3 --output "$out" "$P" >"$WORK/stopped.out" 2>"$WORK/stopped.err" &
job=$!
for i in $(seq 600); do [ "$(lines "$out.journal.dp0")" -ge 2 ] && break; sleep 0.05; done
victim=$(pgrep -f "^$DCPINFER .*--output $out" | tail -1)
kill -STOP "$victim"
t0=$(date +%s.%N)
wait $job
rc=$?
took=$(echo "$(date +%s.%N) - $t0" | bc)
kill -9 "$victim" 2>/dev/null
checks=$((checks + 1))
if [ "$rc" = 5 ] && [ "$(echo "$took < 13" | bc)" = 1 ] && grep -q "no step completed in 3 s (--step-timeout)" "$WORK/stopped.err"; then
    pass "SIGSTOP-ed rank: the job ended after $took s (timeout 3 s), exit 5: $(grep -m1 'no step' "$WORK/stopped.err")"
else
    fail "SIGSTOP-ed rank: exit $rc after $took s"; head -5 "$WORK/stopped.err" >&2
fi
finish
