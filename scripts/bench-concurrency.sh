#!/bin/bash
# Benchmark (not a test): what DCP buys at a fixed KV memory per rank.
# Runs one synthetic agentic trace (dcpinfer-mktrace) on 8 ranks (tp 8)
# with plain TP and with DCP: dcp 1/2/4/8 on a generated MQA model
# (1 KV head), dcp 1/2 on a GQA model (4 KV heads) and dcp 1/2/4/8 on a
# DeepSeek-V3-style MLA model (one 32-float latent row per position and
# layer, as many bytes as the MQA model's K and V), sweeping the
# offered concurrency (--max-num-seqs). Every run has a logical KV block of
# 16 positions (--block-size 16/dcp), so that the comparison is of
# capacity, not of rounding. Prints a table and the ratio of the maximum
# running requests at dcp N to dcp 1, and writes OUT/concurrency.dat and
# OUT/concurrency.png (gnuplot).
# Then prefix caching: a multi-turn agentic trace (dcpinfer-mktrace
# --sessions, each turn holding its session's history) on the MQA model at
# dcp 1/2/4/8, with and without --enable-prefix-caching, one turn per
# session in flight (--max-num-seqs SESSIONS): output tokens/s, the
# prefill positions computed (the sum of /steps/prefill_tokens) and
# cached, TTFT, and the throughput with the cache over without
# (OUT/prefix_caching.dat).
#   OUT=bench-out KV=1600K REQUESTS=256 OFFERED="4 8 16 32 64 128" SESSIONS=16 TURNS=4 \
#   PARTS="concurrency prefix" scripts/bench-concurrency.sh
set -u
. "$(dirname "$0")/setup.sh"
PACKAGES="$PACKAGES gnuplot-nox"
ensure_packages || exit 1
build_dcpinfer || exit 1
NP=${NP:-8}
KV=${KV:-1600K}
REQUESTS=${REQUESTS:-256}
OFFERED=${OFFERED:-4 8 16 32 64 128}
OUT=${OUT:-$TOP/bench-out}
SESSIONS=${SESSIONS:-16}
TURNS=${TURNS:-4}
PARTS=${PARTS:-concurrency prefix}
mkdir -p "$OUT"
bench_workdir

B=$BUILD_DIR
"$B/dcpinfer-mkmodel" --out "$W/mqa" --layers 4 --dim 128 --heads 8 --kv-heads 1 --hidden 344 --vocab 512 \
    --max-len 4096 --seed 5 || exit 1
"$B/dcpinfer-mkmodel" --out "$W/gqa" --layers 4 --dim 128 --heads 8 --kv-heads 4 --hidden 344 --vocab 512 \
    --max-len 4096 --seed 6 || exit 1
"$B/dcpinfer-mkmodel" --out "$W/mla" --arch deepseek_v3 --layers 4 --dim 128 --heads 8 --hidden 344 --vocab 512 \
    --max-len 4096 --seed 7 --kv-lora-rank 24 --qk-rope-dim 8 --qk-nope-dim 16 --v-head-dim 16 --q-lora-rank 64 \
    --experts 8 --experts-per-token 2 --moe-hidden 96 --first-dense 1 >/dev/null || exit 1
# inputs 1/256 of the published trace's 67K tokens, outputs 1/25 of its 400
"$B/dcpinfer-mktrace" --requests "$REQUESTS" --median-input 256 --sigma-input 0.3 --median-output 16 \
    --max-input 2000 --vocab 512 --out "$W/trace.jsonl" || exit 1

num() { sed -n "$2" "$1" | head -1; }
h5sum() { h5dump -y -d "$2" "$1" 2>/dev/null | sed -n '/DATA {/,/}/p' | sed '1d;$d' | tr -c '0-9\n' ' ' |
    tr -s ' \n' '\n' | awk '{s += $1} END {print s + 0}'; }

concurrency() {
    echo "# dcpinfer concurrency benchmark: $NP ranks, tp $NP, --kv-cache-memory $KV per rank, $REQUESTS requests"
    echo "# (trace: lognormal prompts, median 256 tokens, sigma 0.3; outputs median 16; greedy)"
    printf "# %-5s %4s %8s %8s %7s %10s %10s %9s %9s %6s\n" model dcp offered running kv_use out_tok/s dec_tok/s \
        ttft_s tpot_s preempt | tee "$OUT/concurrency.dat"
    for run in "mqa 1" "mqa 2" "mqa 4" "mqa 8" "gqa 1" "gqa 2" "mla 1" "mla 2" "mla 4" "mla 8"; do
        set -- $run
        model=$1 dcp=$2
        for offered in $OFFERED; do
            log=$W/$model-$dcp-$offered.out
            mpirun -q --oversubscribe --bind-to none -np "$NP" "$B/dcpinfer" --model "$W/$model" -tp "$NP" -dcp "$dcp" \
                --block-size $((16 / dcp)) --kv-cache-memory "$KV" --max-num-seqs "$offered" --quiet \
                --output "$W/x.h5" "$W/trace.jsonl" \
                >"$log" 2>&1 || { echo "run failed:"; cat "$log"; exit 1; }
            running=$(num "$log" 's/^# .* step(s), at most \([0-9]*\) request(s) running.*/\1/p')
            kv=$(num "$log" 's/.*KV use at most \([0-9.]*\)%.*/\1/p')
            preempt=$(num "$log" 's/.* running, \([0-9]*\) preemption(s).*/\1/p')
            tps=$(num "$log" 's/^# .* output tokens in .* s: \([0-9.]*\) tokens\/s.*/\1/p')
            dps=$(num "$log" 's/^# decode-only steps: .*: \([0-9.]*\) tokens\/s/\1/p')
            ttft=$(num "$log" 's/^  TTFT *\([0-9.]*\) .*/\1/p')
            tpot=$(num "$log" 's/^  TPOT *\([0-9.]*\) .*/\1/p')
            printf "  %-5s %4s %8s %8s %6s%% %10s %10s %9s %9s %6s\n" "$model" "$dcp" "$offered" "$running" "$kv" \
                "$tps" "${dps:-0}" "$ttft" "$tpot" "$preempt" | tee -a "$OUT/concurrency.dat"
        done
        printf "\n\n" >>"$OUT/concurrency.dat"
    done

    # the most requests running at once, per model and dcp, against dcp 1
    awk '!/^#/ && NF { if ($4 > max[$1 " " $2]) max[$1 " " $2] = $4 }
         END { for (k in max) { split(k, a, " "); if (a[2] == 1) base[a[1]] = max[k] }
               for (k in max) { split(k, a, " ");
                   printf "# %s dcp %d: at most %d running, %.2f x dcp 1 (%.2f x dcp)\n", a[1], a[2], max[k],
                       max[k] / base[a[1]], max[k] / base[a[1]] / a[2] } }' "$OUT/concurrency.dat" | sort

    gnuplot <<GP
set terminal pngcairo size 1100,460 font "sans,10"
set output "$OUT/concurrency.png"
set multiplot layout 1,2 title "dcpinfer on $NP ranks (tp $NP), KV cache $KV per rank, $REQUESTS-request agentic trace"
set logscale x 2
set key left top
set grid
set xlabel "offered concurrency (--max-num-seqs)"
set ylabel "requests running at once (max)"
set title "concurrency reached"
plot for [i=0:9] "$OUT/concurrency.dat" index i using 3:4 with linespoints lw 2 \
    title word("MQA-dcp1 MQA-dcp2 MQA-dcp4 MQA-dcp8 GQA-dcp1 GQA-dcp2 MLA-dcp1 MLA-dcp2 MLA-dcp4 MLA-dcp8", i+1)
set ylabel "output tokens/s in decode-only steps"
set title "decode throughput"
plot for [i=0:9] "$OUT/concurrency.dat" index i using 3:7 with linespoints lw 2 \
    title word("MQA-dcp1 MQA-dcp2 MQA-dcp4 MQA-dcp8 GQA-dcp1 GQA-dcp2 MLA-dcp1 MLA-dcp2 MLA-dcp4 MLA-dcp8", i+1)
unset multiplot
GP
    echo "# plot: $OUT/concurrency.png"
}

prefix_caching() {
    # first turns 1/256 of the published trace's 67K tokens, each later turn
    # adds an output stand-in and a 64-token tool result
    "$B/dcpinfer-mktrace" --sessions "$SESSIONS" --turns "$TURNS" --median-input 256 --sigma-input 0.3 \
        --median-output 16 --median-turn 64 --vocab 512 --out "$W/sessions.jsonl" || exit 1
    local prompt
    prompt=$(sed 's/.*"prompt_token_ids": \[\([^]]*\)\].*/\1/' "$W/sessions.jsonl" | tr ',' '\n' | grep -c .)
    echo "# prefix caching: $SESSIONS sessions x $TURNS turns ($prompt prompt tokens), mqa model, $NP ranks, tp $NP,"
    echo "# --max-num-seqs $SESSIONS, --kv-cache-memory $KV per rank, logical blocks of 16 positions; greedy"
    printf "# %4s %6s %10s %10s %10s %8s %9s %7s\n" dcp cache out_tok/s computed cached hit_% ttft_s preempt |
        tee "$OUT/prefix_caching.dat"
    for dcp in 1 2 4 8; do
        for cache in on off; do
            local log=$W/pc-$dcp-$cache.out flag=--enable-prefix-caching
            [ "$cache" = off ] && flag=--no-enable-prefix-caching
            mpirun -q --oversubscribe --bind-to none -np "$NP" "$B/dcpinfer" --model "$W/mqa" -tp "$NP" -dcp "$dcp" \
                --block-size $((16 / dcp)) --kv-cache-memory "$KV" --max-num-seqs "$SESSIONS" --quiet $flag \
                --output "$W/pc.h5" "$W/sessions.jsonl" >"$log" 2>&1 || { echo "run failed:"; cat "$log"; exit 1; }
            local tps ttft preempt computed cached
            tps=$(num "$log" 's/^# .* output tokens in .* s: \([0-9.]*\) tokens\/s.*/\1/p')
            ttft=$(num "$log" 's/^  TTFT *\([0-9.]*\) .*/\1/p')
            preempt=$(num "$log" 's/.* running, \([0-9]*\) preemption(s).*/\1/p')
            computed=$(h5sum "$W/pc.h5" /steps/prefill_tokens)
            cached=$(h5sum "$W/pc.h5" /requests/num_cached_tokens)
            printf "  %4s %6s %10s %10s %10s %8s %9s %7s\n" "$dcp" "$cache" "$tps" "$computed" "$cached" \
                "$(awk -v c="$cached" -v p="$prompt" 'BEGIN {printf "%.1f", 100 * c / p}')" "$ttft" "$preempt" |
                tee -a "$OUT/prefix_caching.dat"
        done
    done
    awk '!/^#/ && NF { t[$1 " " $2] = $3 }
         END { for (d = 1; d <= 8; d *= 2)
                   if (t[d " off"] > 0) printf "# dcp %d: output tokens/s with the cache / without: %.2f\n", d, t[d " on"] / t[d " off"] }' \
        "$OUT/prefix_caching.dat"
}

for part in $PARTS; do
    case $part in
        concurrency) concurrency ;;
        prefix) prefix_caching ;;
        *) echo "unknown part '$part' (PARTS: concurrency prefix)"; exit 2 ;;
    esac
done
