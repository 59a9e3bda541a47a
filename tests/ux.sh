#!/bin/sh
# What a user sees around the results: progress under mpirun (a long
# prefill's prompt tokens too) and on a
# terminal, the thread note only when binding limited the threads, DP
# summaries per group (never concurrent times added up), --version and
# --help; an output that is an input refused, a Hub id answered with how
# to fetch it, an interrupted run naming --resume, and a failure ending
# cleanly (every rank at MPI_Finalize, the documented status, no abort).
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"

P=$WORK/p.jsonl
for i in 1 2 3 4; do
    printf '{"id": "r%d", "prompt_token_ids": [1, %d, 3], "max_tokens": 300, "temperature": 0, "ignore_eos": true}\n' $i $i
done >"$P"
progress_re='^dcpinfer: [0-4]/4 requests done, [0-9]+ running, [0-9]+ waiting, prompts [0-9]+/12 tokens in, [0-9.]+ tokens/s, KV [0-9]+% used, [0-9hms]+ elapsed, ETA (<1s|[0-9hms]+)$'

# under mpirun stderr is a pipe: plain lines, every --progress-interval
checks=$((checks + 1))
run_dcp lines --progress-interval 0.001 --max-model-len 512 --output "$WORK/l.h5" "$P"
n=$(grep -cE "$progress_re" "$WORK/lines.err")
others=$(grep -cvE "$progress_re" "$WORK/lines.err")
if [ "$(cat "$WORK/lines.rc")" = 0 ] && [ "$n" -ge 3 ] && [ "$others" = 0 ] && ! grep -q "$(printf '\r')" "$WORK/lines.err"; then
    pass "progress under mpirun: $n plain lines"
else
    fail "progress under mpirun: $n progress lines, $others others (rc $(cat "$WORK/lines.rc")):"
    sed 's/^/    /' "$WORK/lines.err" | head >&2
fi
# the first line after the first step, the last after the last step (all
# done, nothing left: ETA 0s)
checks=$((checks + 1))
first=$(grep -E "$progress_re" "$WORK/lines.err" | head -1)
last=$(grep -E "$progress_re" "$WORK/lines.err" | tail -1)
if echo "$first" | grep -q '^dcpinfer: 0/4 requests done, 4 running, 0 waiting' &&
    echo "$last" | grep -q '^dcpinfer: 4/4 requests done, 0 running, 0 waiting, .* ETA 0s$'; then
    pass "progress: from '$first' to '$last'"
else
    fail "progress: first '$first', last '$last'"
fi

# a long prompt's prefill shows in the progress: its prompt tokens in, step
# by step (chunks of --max-num-batched-tokens 64), before its first token
checks=$((checks + 1))
printf '{"id": "long", "prompt_token_ids": [%s], "max_tokens": 2}\n' "$(seq 1 600 | awk '{printf "%s%d", (NR > 1 ? ", " : ""), $1 % 500 + 1}')" \
    >"$WORK/prefill.jsonl"
run_dcp prefill --progress-interval 0.001 --max-num-batched-tokens 64 --max-num-seqs 4 --output "$WORK/prefill.h5" \
    "$WORK/prefill.jsonl"
ins=$(grep -o 'prompts [0-9]*/600 tokens in, 0.0 tokens/s' "$WORK/prefill.err" | cut -d' ' -f2 | cut -d/ -f1 | tr '\n' ' ')
# (a line per step at most: each a whole chunk more than one before it)
steady=$(echo "$ins" | awk '{ok = NF >= 3; for (i = 1; i <= NF; i++) if ($i % 64 || (i > 1 && $i <= $(i - 1))) ok = 0; print ok}')
if [ "$(cat "$WORK/prefill.rc")" = 0 ] && [ "$steady" = 1 ]; then
    pass "a 600-token prefill in chunks of 64: progress at $ins prompt tokens in"
else
    fail "long prefill progress: '$ins' (exit $(cat "$WORK/prefill.rc"))"; head -3 "$WORK/prefill.err" >&2
fi

# a 30-second run under mpirun with the default settings, its stderr a pipe
# and, concurrently, the same from a pseudo-terminal (mpirun hands rank 0
# a pipe there too): a plain line every 10 s in both. One thread each, so
# that the two runs do not spin against each other.
if "$DCPINFER" --version | grep -q '^sanitizers: no'; then
    for i in $(seq 24); do
        printf '{"id": "l%d", "prompt_token_ids": [1, %d, 3], "max_tokens": 2000, "ignore_eos": true}\n' $i $i
    done >"$WORK/long.jsonl"
    long_re='^dcpinfer: [0-9]+/24 requests done, .* tokens/s, KV [0-9]+% used, [0-9hms]+ elapsed, ETA (<1s|[0-9hms]+)$'
    export OMP_NUM_THREADS=1
    "$MPIRUN" -q --bind-to none -np 1 "$DCPINFER" --output "$WORK/long-pipe.h5" "$WORK/long.jsonl" \
        >"$WORK/long-pipe.out" 2>"$WORK/long-pipe.err" &
    pipe_pid=$!
    if command -v script >/dev/null 2>&1; then
        script -qec "'$MPIRUN' -q --bind-to none -np 1 '$DCPINFER' --output '$WORK/long-pty.h5' '$WORK/long.jsonl' >'$WORK/long-pty.out'" \
            /dev/null >"$WORK/long-pty.raw" 2>&1
    fi
    wait $pipe_pid
    unset OMP_NUM_THREADS
    for how in pipe pty; do
        [ "$how" = pty ] && ! command -v script >/dev/null 2>&1 && continue
        checks=$((checks + 1))
        f=$WORK/long-$how.err
        [ "$how" = pty ] && { tr -d '\r' <"$WORK/long-pty.raw" >"$f"; }
        wall=$(sed -n 's/^# 24 request(s), 0 failed, [0-9]* output tokens in \([0-9]*\)\..*/\1/p' "$WORK/long-$how.out")
        n=$(grep -cE "$long_re" "$f")
        want=$(( ${wall:-0} / 10 - 1 ))
        [ "$want" -lt 1 ] && want=1
        if [ -n "$wall" ] && [ "$n" -ge "$want" ]; then
            pass "$wall-second run under mpirun, from a $how: $n progress lines (every 10 s), the last '$(grep -E "$long_re" "$f" | tail -1)'"
        else
            fail "$how: $n progress lines in a ${wall:-?}-second run (expected at least $want):"; head -5 "$f" >&2
        fi
    done
fi

# off with --no-progress and with --quiet (an explicit --progress wins)
for case in "noprog --no-progress" "quiet --quiet" "quietprog --quiet --progress"; do
    set -- $case
    name=$1; shift
    checks=$((checks + 1))
    run_dcp "$name" "$@" --progress-interval 0.001 --max-model-len 512 --output "$WORK/$name.h5" "$P"
    n=$(grep -cE "$progress_re" "$WORK/$name.err")
    ok=$([ "$n" = 0 ] && echo none || echo some)
    want=$([ "$name" = quietprog ] && echo some || echo none)
    if [ "$ok" = "$want" ]; then
        pass "progress with $*: $n line(s)"
    else
        fail "progress with $*: $n line(s)"
    fi
done

# on a terminal: one line rewritten in place (carriage return, erase to
# the end of the line), left with a newline at the end
if command -v script >/dev/null 2>&1; then
    checks=$((checks + 1))
    OMPI_MCA_ess_singleton_isolated=1 script -qec "'$DCPINFER' --progress-interval 0.001 --max-model-len 512 --output '$WORK/t.h5' '$P' >/dev/null" \
        /dev/null >"$WORK/tty.raw" 2>&1
    rewrites=$(tr '\r' '\n' <"$WORK/tty.raw" | grep -c "$(printf '\033')\[Kdcpinfer: [0-4]/4 requests done")
    if [ "$rewrites" -ge 2 ] && tr '\r' '\n' <"$WORK/tty.raw" | grep -q '4/4 requests done.*ETA 0s'; then
        pass "progress on a terminal: $rewrites rewrites of one line, ending at 4/4"
    else
        fail "progress on a terminal: $rewrites rewrites:"; cat -v "$WORK/tty.raw" | head -5 >&2
    fi
else
    echo "progress on a terminal: no 'script' command here, not checked" >&2
fi

# a plain executable writing stderr to a file (no launcher, no terminal):
# no progress unless asked
checks=$((checks + 1))
OMPI_MCA_ess_singleton_isolated=1 "$DCPINFER" --max-model-len 512 --output "$WORK/pl.h5" "$P" >/dev/null 2>"$WORK/plain.err"
n=$(grep -cE "$progress_re" "$WORK/plain.err")
if [ "$n" = 0 ]; then pass "no progress for a plain run into a file"; else fail "plain run: $n progress lines"; fi

# the thread note: only when binding lowered the thread count
if [ "$(nproc)" -ge 2 ]; then
    checks=$((checks + 1))
    printf '{"id": "a", "prompt_token_ids": [1, 2], "max_tokens": 2}\n' >"$WORK/one.jsonl"
    OMP_NUM_THREADS=1 "$MPIRUN" -q --bind-to core -np 1 "$DCPINFER" --output "$WORK/n1.h5" "$WORK/one.jsonl" \
        >"$WORK/omp1.out" 2>&1
    "$MPIRUN" -q --bind-to core -np 1 "$DCPINFER" --output "$WORK/n2.h5" "$WORK/one.jsonl" >"$WORK/bound.out" 2>&1
    if ! grep -q '# note: rank 0 is bound' "$WORK/omp1.out" && grep -q '# 1 request(s), 0 failed' "$WORK/omp1.out" &&
        grep -q "# note: rank 0 is bound to 1 CPU(s), so it runs 1 thread(s) instead of its share of $(nproc)" "$WORK/bound.out"; then
        pass "thread note: none with OMP_NUM_THREADS=1, one when bound to a core"
    else
        fail "thread note:"; grep -h 'note' "$WORK/omp1.out" "$WORK/bound.out" >&2
    fi
fi

# DP: step counts and decode-only figures per group, each equal to what
# the file's /steps records for that group
checks=$((checks + 1))
NP=2 run_dcp dp -dp 2 --max-model-len 512 --output "$WORK/dp.h5" "$P"
col() { h5dump -y -d "/steps/$1" "$WORK/dp.h5" | sed -n '/DATA {/,/}/p' | tr -c '0-9.e\n-' ' ' | tr -s ' \n' '\n' | grep .; }
col dp_rank >"$WORK/g"
col prefill_tokens >"$WORK/pf"
col decode_tokens >"$WORK/dt"
want=$(paste "$WORK/g" "$WORK/pf" "$WORK/dt" | awk '{ n[$1]++; if ($2 == 0) t[$1] += $3 }
    END { printf "steps %d %d; decode-only tokens %d %d", n[0], n[1], t[0], t[1] }')
steps=$(sed -n 's/^# steps per DP group (the groups run concurrently): \([0-9]*\) \([0-9]*\),.*/\1 \2/p' "$WORK/dp.out")
tokens=$(sed -n 's/^# decode-only steps per DP group: 0: \([0-9]*\) tokens .*; 1: \([0-9]*\) tokens .*; together .*/\1 \2/p' "$WORK/dp.out")
got="steps $steps; decode-only tokens $tokens"
if [ "$got" = "$want" ] && ! grep -q '^# decode-only steps:' "$WORK/dp.out"; then
    pass "dp 2 summary per group: $got"
else
    fail "dp 2 summary: printed '$got', /steps gives '$want'"; grep '^# ' "$WORK/dp.out" >&2
fi

# each group's wall time is at least its decode-only time and at most the
# run's (which ends when the slowest group does)
checks=$((checks + 1))
walls=$(sed -n "s/^# DP groups' generation wall time (the run's is the slowest): 0: \([0-9.]*\) s, 1: \([0-9.]*\) s$/\1 \2/p" "$WORK/dp.out")
decode=$(sed -n 's/^# decode-only steps per DP group: 0: [0-9]* tokens in \([0-9.]*\) s .*; 1: [0-9]* tokens in \([0-9.]*\) s .*/\1 \2/p' "$WORK/dp.out")
run=$(sed -n 's/^# 4 request(s), 0 failed, [0-9]* output tokens in \([0-9.]*\) s.*/\1/p' "$WORK/dp.out")
if [ -n "$walls" ] && [ -n "$decode" ] && [ -n "$run" ] &&
    echo "$walls $decode $run" | awk '{ exit !($1 >= $3 && $2 >= $4 && $1 <= $5 + 0.001 && $2 <= $5 + 0.001) }'; then
    pass "dp 2 wall times $walls s, decode-only $decode s, run $run s"
else
    fail "dp 2 wall times '$walls', decode-only '$decode', run '$run'"
fi

# --output that names the prompt file (or another input) is refused and
# the input kept
cp "$P" "$WORK/same.jsonl"
expect_error output_is_prompts 1 "--output $WORK/same.jsonl: dcpinfer would write $WORK/same.jsonl, which is the prompt file it reads" \
    --output "$WORK/same.jsonl" "$WORK/same.jsonl"
checks=$((checks + 1))
if cmp -s "$P" "$WORK/same.jsonl"; then pass "the prompt file is untouched"; else fail "the prompt file was changed"; fi
"$MKMODEL" --out "$WORK/tiny" --layers 1 --dim 16 --heads 2 --kv-heads 1 --hidden 16 --vocab 64 >/dev/null
expect_error output_is_model 1 "which is a file of the model it reads" --model "$WORK/tiny" \
    --output "$WORK/tiny/model.safetensors" "$P"

# a Hugging Face Hub id: only local folders load, and the line says how
expect_error hub_id 1 "Qwen/Qwen3-0.6B: model path does not exist; dcpinfer loads local folders only and downloads nothing: fetch it first (huggingface-cli download Qwen/Qwen3-0.6B --local-dir models/Qwen3-0.6B), then --model models/Qwen3-0.6B" \
    --model Qwen/Qwen3-0.6B "$P"

# --help names every architecture family, not the Llama family alone
checks=$((checks + 1))
if "$DCPINFER" --help | head -5 | grep -q "Llama, Mistral, Qwen2/3, DeepSeek-V2/V3" &&
    ! "$DCPINFER" --help | grep -q "Llama-family"; then
    pass "--help: $("$DCPINFER" --help | sed -n 4p)"
else
    fail "--help does not name the architectures: $("$DCPINFER" --help | sed -n 4p)"
fi

# SIGTERM (scancel, a time limit) and SIGINT: one line naming --resume
for i in $(seq 8); do
    printf '{"id": "i%d", "prompt_token_ids": [1, %d, 3], "max_tokens": 2000, "ignore_eos": true}\n' $i $i
done >"$WORK/int.jsonl"
for sig in TERM INT; do
    checks=$((checks + 1))
    "$MPIRUN" -q --bind-to none -np 1 "$DCPINFER" --output "$WORK/int$sig.h5" "$WORK/int.jsonl" \
        >"$WORK/int$sig.out" 2>"$WORK/int$sig.err" &
    job=$!
    for i in $(seq 400); do [ -s "$WORK/int$sig.h5.journal.dp0" ] && break; sleep 0.02; done
    kill -$sig "$(pgrep -f "^$DCPINFER .*--output $WORK/int$sig.h5" | tail -1)"
    wait $job
    if grep -q "^dcpinfer: interrupted: the requests finished so far are kept in $WORK/int$sig.h5.journal\*; rerun the same command with --resume to run the rest$" "$WORK/int$sig.err"; then
        pass "SIG$sig: $(grep interrupted "$WORK/int$sig.err")"
    else
        fail "SIG$sig: no line naming --resume:"; cat "$WORK/int$sig.err" >&2
    fi
done

# an expected failure ends cleanly on every rank: the documented status, one
# line from dcpinfer, no MPI_Abort. mpirun (without -q) then prints its own
# notice of a non-zero exit, which the README's troubleshooting explains.
checks=$((checks + 1))
timeout 120 "$MPIRUN" --oversubscribe --bind-to none -np 2 "$DCPINFER" -tp 3 "$P" >"$WORK/layout.out" 2>"$WORK/layout.err"
rc=$?
if [ $rc = 1 ] && [ "$(grep -c '^dcpinfer:' "$WORK/layout.err")" = 1 ] && ! grep -q "MPI_ABORT" "$WORK/layout.err" &&
    grep -q "2 ranks are not divisible by -tp 3" "$WORK/layout.err"; then
    pass "a layout error on 2 ranks: exit 1, one line from dcpinfer, no MPI_Abort"
else
    fail "a layout error: exit $rc:"; cat "$WORK/layout.err" >&2
fi

# --version: the release, the build's configuration and libraries
checks=$((checks + 1))
"$DCPINFER" --version >"$WORK/version" 2>&1
if grep -q "^dcpinfer [0-9]" "$WORK/version" && grep -q '^configure: ' "$WORK/version" &&
    grep -q '^backends: cpu (kernels: [a-z0-9]* on this CPU); cuda ' "$WORK/version" &&
    grep -q '^libraries: .*MPI.*; HDF5 [0-9]*\.[0-9]*\.[0-9]*; OpenBLAS' "$WORK/version" &&
    grep -q '^MPI and device memory: .*; takes device buffers now: ' "$WORK/version"; then
    pass "--version: $(tr '\n' '|' <"$WORK/version")"
else
    fail "--version:"; cat "$WORK/version" >&2
fi
finish
