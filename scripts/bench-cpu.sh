#!/bin/bash
# Benchmark (not a test): dcpinfer on the CPU against this machine's limits.
#   machine: read bandwidth (1 and 2 threads) and the fp32 FMA peak, from a
#     register-only FMA loop (dcpinfer-bench-cpu), and OpenBLAS's sgemm
#     with OPENBLAS_CORETYPE naming the real core (in that command alone)
#   dcpinfer, on generated models of stories15M's and stories110M's shapes,
#   fp32 and bf16 (a checkpoint stored as bf16, run with the default dtype):
#     decode   one request, 8-token prompt, 256 tokens, 1 and 2 threads:
#              tokens/s and the fraction of the bandwidth bound (weight
#              bytes read per token x tokens/s / read bandwidth); also
#              that fraction against the read rate the machine sustains
#              for 2 s just before and just after the run (median of the
#              rounds, and their range); and bf16 / fp32 tokens/s, both
#              as the ratio of the best figures and as the median of the
#              rounds' ratios, each from two runs one after the other
#     prefill  one 512-token prompt: tokens/s, the GEMMs' GFLOP/s as a
#              fraction of the FMA peak (2 x 512 x matrix weights /
#              /timings/matmul), and attention's share of the prefill;
#              and on the 110M shape fp32 (positions up to 4160), one
#              4,000-token prompt (prefill4k), where attention reads
#              2,000 keys a token on average
#     batch    32 requests x 64 tokens decoded together on the 15M shape,
#              2 threads: tokens/s, and whether every request got exactly
#              the tokens it gets alone (--max-num-seqs 1)
#   and each run's peak resident memory. Each figure is the best of REPS
#   rounds (default 3), each round running every configuration once: the
#   machine is shared and its speed drifts, and rounds spread a slow spell
#   over all figures instead of one figure's every run. The machine
#   figures are the better of two measurements, before and after.
# DCPINFER=path runs another dcpinfer build on the same models (an earlier
# version, for before/after figures).
set -u
. "$(dirname "$0")/setup.sh"
bench_start
REPS=${REPS:-3}
D=${DCPINFER:-$B/dcpinfer}

# ---- the machine -----------------------------------------------------------
grep -q avx512f /proc/cpuinfo && core=SkylakeX || core=Haswell
# before the runs and after them, each figure the better of the two: a core
# taken away for a moment once halved the 2-thread FMA peak of a run (102.6
# against 197.7 GFLOP/s)
machine() {
    for t in 1 2; do
        OPENBLAS_CORETYPE=$core "$B/dcpinfer-bench-cpu" $t 512 768 2048 >"$W/machine$t.$1" || exit 1
    done
}
val() { cat "$2".[12] | sed -n "s/^$1 \([0-9.]*\).*/\1/p" | sort -g | tail -1; }
machine 1

# ---- models ------------------------------------------------------------------
# NAME LAYERS DIM HEADS HIDDEN (kv heads = heads, vocab 32000, untied)
shapes="15M 6 288 6 768
110M 12 768 12 2048"
# bytes a decode step reads: every matrix and the LM head (the embedding
# table gives one row); FLOPs of a prefill token: 2 x the layer matrices
weights() { echo "$1 $2 $3" | awk -v e="$4" '{ L = $1; d = $2; h = $3;
    m = L * (4 * d * d + 3 * d * h); printf "%.0f %.0f\n", (m + 32000 * d) * e, 2 * m }'; }
declare -A wbytes flops
while read -r name layers dim heads hidden; do
    for dt in f32 bf16; do
        "$B/dcpinfer-mkmodel" --out "$W/m$name-$dt" --layers $layers --dim $dim --heads $heads --kv-heads $heads \
            --hidden $hidden --vocab 32000 --max-len 1024 --seed 110 --dtype $dt >/dev/null || exit 1
        read -r "wbytes[$name.$dt]" "flops[$name.$dt]" \
            <<<"$(weights $layers $dim $hidden $([ $dt = bf16 ] && echo 2 || echo 4))"
    done
done <<<"$shapes"
"$B/dcpinfer-mkmodel" --out "$W/m110L-f32" --layers 12 --dim 768 --heads 12 --kv-heads 12 --hidden 2048 \
    --vocab 32000 --max-len 4160 --seed 110 --dtype f32 >/dev/null || exit 1

awk 'BEGIN { srand(3); s = ""; for (j = 0; j < 8; j++) s = s (j ? ", " : "") int(rand() * 32000);
    printf "{\"id\": \"d\", \"prompt_token_ids\": [%s], \"max_tokens\": 256, \"temperature\": 0, \"ignore_eos\": true}\n", s }' \
    >"$W/decode.jsonl"
awk 'BEGIN { srand(5); s = ""; for (j = 0; j < 512; j++) s = s (j ? ", " : "") int(rand() * 32000);
    printf "{\"id\": \"p\", \"prompt_token_ids\": [%s], \"max_tokens\": 1, \"temperature\": 0}\n", s }' >"$W/prefill.jsonl"
awk 'BEGIN { srand(6); s = ""; for (j = 0; j < 4000; j++) s = s (j ? ", " : "") int(rand() * 32000);
    printf "{\"id\": \"l\", \"prompt_token_ids\": [%s], \"max_tokens\": 1, \"temperature\": 0}\n", s }' >"$W/long.jsonl"
awk 'BEGIN { srand(7); for (i = 0; i < 32; i++) { len = 16 + int(rand() * 32); s = "";
    for (j = 0; j < len; j++) s = s (j ? ", " : "") int(rand() * 32000);
    printf "{\"id\": \"r%d\", \"prompt_token_ids\": [%s], \"max_tokens\": 64, \"temperature\": 0, \"ignore_eos\": true}\n", i, s } }' \
    >"$W/batch.jsonl"

run() { # THREADS MODEL PROMPTS OUT [args]: one run, its summary in OUT.txt
    local t=$1 m=$2 p=$3 out=$4
    shift 4
    OMP_NUM_THREADS=$t mpirun --bind-to none -np 1 "$D" --model "$m" --kv-cache-memory ${KVM:-256M} --quiet \
        --output "$out.h5" "$@" "$p" </dev/null >"$out.txt" 2>&1 || { cat "$out.txt" >&2; exit 1; }
}
h5val() { h5dump -d "$2" "$1" | sed -n 's/.*(0): *//p'; }
best() { printf '%s\n' "$@" | sort -g | tail -1; } # of the values given
least() { printf '%s\n' "$@" | sort -g | head -1; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rss() { sed -n 's/.*peak resident \([0-9.]*\) MiB.*/\1/p' "$1"; }

# the read bandwidth the machine sustains at this moment: every pass over
# the 1 GiB array for 2 s, taken just before and just after each decode
# run. A decode run's tokens/s is a rate over seconds of the machine as it
# is then (a neighbour's load included), while the best of 8 short passes
# is its limit on a quiet moment: run beside run, the fraction compares
# like with like.
# RATE (decode tokens/s) x the weight bytes of SHAPE.DTYPE, in % of GBS
of_read() { awk -v r="$1" -v b="${wbytes[$2]}" -v w="$3" 'BEGIN { print 100 * r * b / (w * 1e9) }'; }
sustained() { "$B/dcpinfer-bench-cpu" --read 2 "$1" | sed -n 's/^read_sustained_gbs //p'; }

# bf16 / fp32 decode is also taken pair by pair: the two runs of a round
# one after the other (fp32 first in odd rounds, bf16 first in even ones,
# so that a drift favours neither), their ratio, then the median of the
# rounds. The best of each dtype's rounds may come from different moments
# of the machine: on the Zen 4, 2-thread pairs a minute apart gave 1.13 and
# 1.75 with the same binary.
declare -A dec beside pair prefill_s gemm_s att_s batch mem
for r in $(seq "$REPS"); do
    echo "# round $r of $REPS" >&2
    while read -r name layers dim heads hidden; do
        for t in 1 2; do
            declare -A now=()
            for dt in $( ((r % 2)) && echo f32 bf16 || echo bf16 f32); do
                b0=$(sustained $t)
                run $t "$W/m$name-$dt" "$W/decode.jsonl" "$W/d"
                b1=$(sustained $t)
                rate=$(sed -n 's/^# decode-only steps: .*: \([0-9.]*\) tokens\/s.*/\1/p' "$W/d.txt")
                now[$dt]=$rate
                dec[$name.$dt.$t]+=" $rate"
                beside[$name.$dt.$t]+=" $(of_read "$rate" "$name.$dt" "$(awk -v x="$b0" -v y="$b1" 'BEGIN { print (x + y) / 2 }')")"
                mem[d.$name.$dt.$t]+=" $(rss "$W/d.txt")"
            done
            pair[$name.$t]+=" $(awk -v b="${now[bf16]}" -v f="${now[f32]}" 'BEGIN { print b / f }')"
        done
        for dt in f32 bf16; do
            m="$W/m$name-$dt"
            for t in 1 2; do
                run $t "$m" "$W/prefill.jsonl" "$W/p"
                prefill_s[$name.$dt.$t]+=" $(h5val "$W/p.h5" /timings/prefill)"
                gemm_s[$name.$dt.$t]+=" $(h5val "$W/p.h5" /timings/matmul)"
                att_s[$name.$dt.$t]+=" $(h5val "$W/p.h5" /timings/attention)"
                mem[p.$name.$dt.$t]+=" $(rss "$W/p.txt")"
            done
        done
    done <<<"$shapes"
    for t in 1 2; do # 4,000 tokens x 12 layers of 2 x 3 KiB keys and values: 281 MiB of KV
        KVM=320M run $t "$W/m110L-f32" "$W/long.jsonl" "$W/l"
        prefill_s[L.$t]+=" $(h5val "$W/l.h5" /timings/prefill)"
        gemm_s[L.$t]+=" $(h5val "$W/l.h5" /timings/matmul)"
        att_s[L.$t]+=" $(h5val "$W/l.h5" /timings/attention)"
        mem[L.$t]+=" $(rss "$W/l.txt")"
    done
    for dt in f32 bf16; do
        run 2 "$W/m15M-$dt" "$W/batch.jsonl" "$W/b.$dt"
        batch[$dt]+=" $(sed -n 's/^# .* output tokens in [0-9.]* s: \([0-9.]*\) tokens\/s.*$/\1/p' "$W/b.$dt.txt")"
        mem[b.$dt]+=" $(rss "$W/b.$dt.txt")"
    done
done
machine 2
bw1=$(val read_bandwidth_gbs "$W/machine1") bw2=$(val read_bandwidth_gbs "$W/machine2")
peak1=$(val fma_peak_gflops "$W/machine1") peak2=$(val fma_peak_gflops "$W/machine2")
echo "# dcpinfer CPU benchmark: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores," \
    "kernels $(sed -n 's/.*isa //p' "$W/machine1.1"), best of $REPS"
printf "# machine: read bandwidth %s GB/s (1 thread), %s GB/s (2); FMA peak %s GFLOP/s (1), %s (2)\n" \
    "$bw1" "$bw2" "$peak1" "$peak2"
printf "# 512x768x2048 GEMM GFLOP/s, 1 / 2 threads: OpenBLAS sgemm (%s) %s / %s, dcpinfer fp32 %s / %s, bf16 %s / %s\n" \
    $core "$(val sgemm_gflops "$W/machine1")" "$(val sgemm_gflops "$W/machine2")" \
    "$(val gemm_f32_gflops "$W/machine1")" "$(val gemm_f32_gflops "$W/machine2")" \
    "$(val gemm_bf16_gflops "$W/machine1")" "$(val gemm_bf16_gflops "$W/machine2")"

# SHAPE DTYPE RUN THREADS TOKENS KEY MEMKEY: a prefill's row, from the
# least of its rounds' times
prefill_row() {
    local s g a peak gf
    s=$(least ${prefill_s[$6]}) g=$(least ${gemm_s[$6]}) a=$(least ${att_s[$6]})
    peak=$([ $4 = 1 ] && echo "$peak1" || echo "$peak2")
    gf=$(awk -v f="${flops[$1.$2]}" -v g="$g" -v n="$5" 'BEGIN { printf "%.1f", n * f / g / 1e9 }')
    printf "  %-5s %-5s %-9s %7s %10.1f %10s %12s %9s  (%.0f%% of FMA peak; attention %.0f%% of prefill)\n" \
        $1 $2 $3 $4 "$(awk -v s="$s" -v n="$5" 'BEGIN { print n / s }')" - "$gf" "$(least ${mem[$7]})" \
        "$(awk -v g="$gf" -v p="$peak" 'BEGIN { print 100 * g / p }')" "$(awk -v a="$a" -v s="$s" 'BEGIN { print 100 * a / s }')"
}
printf "\n# %-5s %-5s %-8s %8s %10s %10s %12s %9s\n" shape dtype run threads "tokens/s" "of bound" "GEMM GFLOP/s" "RSS MiB"
while read -r name layers dim heads hidden; do
    for dt in f32 bf16; do
        for t in 1 2; do
            rate=$(best ${dec[$name.$dt.$t]})
            bw=$([ $t = 1 ] && echo "$bw1" || echo "$bw2")
            printf "  %-5s %-5s %-8s %8s %10s %9.0f%% %12s %9s  (%.0f%% of the read rate beside it; rounds %.0f-%.0f%%)\n" \
                $name $dt decode $t "$rate" \
                "$(of_read "$rate" "$name.$dt" "$bw")" - \
                "$(least ${mem[d.$name.$dt.$t]})" "$(median ${beside[$name.$dt.$t]})" \
                "$(least ${beside[$name.$dt.$t]})" "$(best ${beside[$name.$dt.$t]})"
        done
        for t in 1 2; do
            prefill_row $name $dt prefill $t 512 "$name.$dt.$t" "p.$name.$dt.$t"
        done
    done
done <<<"$shapes"
for t in 1 2; do
    prefill_row 110M f32 prefill4k $t 4000 L.$t L.$t
done

for dt in f32 bf16; do
    run 2 "$W/m15M-$dt" "$W/batch.jsonl" "$W/s" --max-num-seqs 1
    same=$(cmp -s <(h5dump -d /requests/output_tokens "$W/b.$dt.h5" | tail -n +3) \
        <(h5dump -d /requests/output_tokens "$W/s.h5" | tail -n +3) && echo "tokens as alone" || echo "TOKENS DIFFER")
    printf "  %-5s %-5s %-8s %8s %10s %10s %12s %9s  32 requests; %s\n" 15M $dt batch 2 \
        "$(best ${batch[$dt]})" - - "$(least ${mem[b.$dt]})" "$same"
done

printf "\n# bf16 / fp32 decode tokens/s: the best figures' ratio; run beside run, the median of the rounds (range)\n"
while read -r name layers dim heads hidden; do
    for t in 1 2; do
        printf "  %-5s %d thread%s  %.2fx  run beside run %.2fx (%.2f-%.2fx)\n" $name $t "$([ $t = 1 ] && echo ' ' || echo s)" \
            "$(awk -v b="$(best ${dec[$name.bf16.$t]})" -v f="$(best ${dec[$name.f32.$t]})" 'BEGIN { print b / f }')" \
            "$(median ${pair[$name.$t]})" "$(least ${pair[$name.$t]})" "$(best ${pair[$name.$t]})"
    done
done <<<"$shapes"

# Stored weight formats, decode's GEMV over DeepSeek-V3 expert-shaped
# matrices (2048 x 7168, 1 GiB as fp32): each format's stored bytes per
# second against the read rate sustained just before it, and its weights
# per second against fp32's (the best of REPS rounds each)
declare -A qg
for r in $(seq "$REPS"); do
    for t in 1 2; do
        "$B/dcpinfer-bench-cpu" --qgemv 2 $t >"$W/qg.$t.$r" || exit 1
    done
done
printf "\n# %-6s %-8s %14s %14s %10s %12s\n" format threads "stored GB/s" "of read rate" "Gweights/s" "x fp32"
for t in 1 2; do
    f32=$(cat "$W"/qg.$t.* | sed -n 's/^qgemv_f32 .* gweights_s \([0-9.]*\).*/\1/p' | sort -g | tail -1)
    for q in f32 bf16 fp8 int4 nvfp4; do
        line=$(cat "$W"/qg.$t.* | grep "^qgemv_$q " | sort -k7 -g | tail -1) # its best round
        echo "$line" | awk -v t=$t -v q=$q -v f="$f32" '{ printf "  %-6s %-8s %14.2f %13.0f%% %10.2f %11.2fx\n",
            q, t, $5, 100 * $5 / $3, $7, $7 / f }'
    done
done
