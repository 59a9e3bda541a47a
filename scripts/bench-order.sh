#!/bin/bash
# Benchmark (not a test): what the canonical reduction order (docs/design.md,
# "Same bits at any layout") costs, this build against another (BASE=path
# to its dcpinfer, e.g. a build of the commit before), run for run.
#   time   generated fp32 models of stories110M's shape (12 layers, dim 768,
#          12 heads, hidden 2048, vocab 32000): with 12 KV heads (4 K
#          chunks, 1 key shard) and with 1 KV head (4 K chunks, 4 key
#          shards, so that attention is split too); one request decoding
#          256 tokens after 8 (decode), one 512-token prompt (prefill), and
#          on the 1-KV-head model one 4,000-token prompt then 64 tokens
#          (long: decode over 4,000 keys), at 1 and 2 threads. Tokens/s,
#          the best of REPS rounds (default 3), the two builds one after
#          the other in each round (this build first in odd rounds), and
#          this build / BASE.
#   bytes  what the collectives send per decode step (all ranks), 16
#          tokens decoded at -tp 2, -tp 4 -dcp 2 (ag_rs and a2a) and -tp 4
#          -dcp 4 on the 1-KV-head model with 2 layers: both builds.
set -u
. "$(dirname "$0")/setup.sh"
bench_start
REPS=${REPS:-3}
D="$B/dcpinfer"
[ -n "${BASE:-}" ] && [ -x "$BASE" ] || { echo "BASE=path to another build's dcpinfer is required" >&2; exit 1; }

for kv in 12 1; do
    "$B/dcpinfer-mkmodel" --out "$W/kv$kv" --layers 12 --dim 768 --heads 12 --kv-heads $kv --hidden 2048 \
        --vocab 32000 --max-len 4160 --seed 110 >/dev/null || exit 1
done
"$B/dcpinfer-mkmodel" --out "$W/small" --layers 2 --dim 768 --heads 12 --kv-heads 1 --hidden 2048 --vocab 32000 \
    --seed 110 >/dev/null || exit 1
prompt() { # ID N_PROMPT MAX_TOKENS SEED
    awk -v id="$1" -v n="$2" -v m="$3" -v seed="$4" 'BEGIN { srand(seed); s = "";
        for (j = 0; j < n; j++) s = s (j ? ", " : "") int(rand() * 32000);
        printf "{\"id\": \"%s\", \"prompt_token_ids\": [%s], \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}\n", id, s, m }'
}
prompt d 8 256 3 >"$W/decode.jsonl"
prompt p 512 1 5 >"$W/prefill.jsonl"
prompt l 4000 64 6 >"$W/long.jsonl"
prompt b 8 16 7 >"$W/bytes.jsonl"

run() { # BINARY THREADS MODEL PROMPTS: tokens/s of its decode steps, or of its prefill
    OMP_NUM_THREADS=$2 mpirun --bind-to none -np 1 "$1" --model "$3" --kv-cache-memory 512M \
        --output "$W/r.h5" "$4" </dev/null >"$W/r.txt" 2>&1 || { cat "$W/r.txt" >&2; exit 1; }
    if [ "$4" = "$W/prefill.jsonl" ]; then
        h5dump -d /timings/prefill "$W/r.h5" | sed -n 's/.*(0): *//p' | awk '{ print 512 / $1 }'
    else
        sed -n 's/^# decode-only steps: .*: \([0-9.]*\) tokens\/s.*/\1/p' "$W/r.txt"
    fi
}
best() { printf '%s\n' "$@" | sort -g | tail -1; }
declare -A t
cases="kv12 decode
kv12 prefill
kv1 decode
kv1 prefill
kv1 long"
for r in $(seq "$REPS"); do
    echo "# round $r of $REPS" >&2
    while read -r m what; do
        for th in 1 2; do
            for which in $( ((r % 2)) && echo new base || echo base new); do
                bin=$([ $which = new ] && echo "$D" || echo "$BASE")
                t[$m.$what.$th.$which]+=" $(run "$bin" $th "$W/$m" "$W/$what.jsonl")"
            done
        done
    done <<<"$cases"
done
echo "# canonical reduction order: this build against $BASE, best of $REPS, tokens/s"
printf '# %-5s %-8s %7s %10s %10s %7s\n' model run threads this base ratio
while read -r m what; do
    for th in 1 2; do
        a=$(best ${t[$m.$what.$th.new]}) b=$(best ${t[$m.$what.$th.base]})
        printf '  %-5s %-8s %7d %10.1f %10.1f %7.3f\n' $m $what $th "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { print a / b }')"
    done
done <<<"$cases"

echo "# bytes the collectives send per decode step, all ranks (2-layer 1-KV-head model, 16 tokens)"
printf '# %-34s %12s %12s\n' layout this base
for layout in "2 -tp 2" "4 -tp 4 -dcp 2" "4 -tp 4 -dcp 2 --dcp-comm-backend a2a" "4 -tp 4 -dcp 4"; do
    np=${layout%% *}
    args=${layout#"$np" }
    row=""
    for bin in "$D" "$BASE"; do
        mpirun -q --oversubscribe --bind-to none -np "$np" "$bin" --model "$W/small" $args --kv-cache-memory 64M \
            --output "$W/b.h5" "$W/bytes.jsonl" </dev/null >"$W/b.txt" 2>&1 || { cat "$W/b.txt" >&2; exit 1; }
        # every collective's bytes in the decode-only steps, all ranks, per step
        steps=$(sed -n 's/^# decode-only steps: \([0-9]*\) tokens.*/\1/p' "$W/b.txt")
        total=0
        for k in $(h5ls "$W/b.h5/comm/decode" | awk '{ print $1 }'); do
            n=$(h5dump -d "/comm/decode/$k/bytes" "$W/b.h5" | sed -n '/DATA {/,/}/p' | tr -c '0-9\n' ' ' |
                tr -s ' \n' '\n' | grep . | tail -n +2 | awk '{ s += $1 } END { print s + 0 }')
            total=$((total + n))
        done
        row+=" $(awk -v t=$total -v s="$steps" 'BEGIN { print t / s }')"
    done
    printf '  %-34s %12.0f %12.0f\n' "$args" $row
done
