#!/bin/bash
# Benchmark (not a test): expert parallelism against TP-sliced experts on a
# generated DeepSeek-V3-style model with 64 routed experts (top 8, one
# shared expert, one group as Kimi K2), at -tp 4 and -tp 8, with and
# without --enable-expert-parallel, at concurrency 1, 16 and 64 (that
# many requests at once, --max-num-seqs the same). Per run: decode
# tokens/s (the summary's decode-only steps), the MoE blocks' seconds per
# step (/timings/moe; GEMMs and exchanges
# included), the seconds and bytes of the collectives that carry the
# blocks' rows (tp_sum, moe_dispatch, moe_combine) per step, and the MoE
# blocks' share of the forward passes' time, all on the slowest rank.
# Prints one table; docs/benchmarks.md keeps the figures.
#   NPS="4 8" CONC="1 16 64" TOKENS=32 scripts/bench-moe-ep.sh
set -u
. "$(dirname "$0")/setup.sh"
PACKAGES="$PACKAGES bc"
bench_start
NPS=${NPS:-4 8}
CONC=${CONC:-1 16 64}
TOKENS=${TOKENS:-32}
"$B/dcpinfer-mkmodel" --out "$W/moe" --arch deepseek_v3 --layers 4 --first-dense 1 --dim 512 --heads 8 \
    --hidden 1024 --vocab 2000 --max-len 4096 --q-lora-rank 128 --kv-lora-rank 128 --qk-rope-dim 32 \
    --qk-nope-dim 32 --v-head-dim 32 --experts 64 --experts-per-token 8 --moe-hidden 256 --shared-experts 1 \
    --n-group 1 --topk-group 1 --norm-topk-prob --seed 11 >/dev/null || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
h5max() { h5dump -y -d "$2" "$1" 2>/dev/null | sed -n '/DATA {/,/}/p' | sed '1d;$d' | tr -c '0-9.eE+\n-' ' ' |
    tr -s ' \n' '\n' | grep . | sort -g | tail -1; }
h5sum() { h5dump -y -d "$2" "$1" 2>/dev/null | sed -n '/DATA {/,/}/p' | sed '1d;$d' | tr -c '0-9.eE+\n-' ' ' |
    tr -s ' \n' '\n' | grep . | awk '{s += $1} END {print s + 0}'; }
printf '# %5s %3s %5s %12s %14s %12s %14s %10s\n' ranks ep conc "decode tok/s" "MoE ms/step" "comm ms/step" \
    "comm B/step" "MoE share"
for np in $NPS; do
    for c in $CONC; do
        P=$W/p$c.jsonl
        for i in $(seq "$c"); do
            printf '{"id": "r%d", "prompt_token_ids": [%d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d], "max_tokens": %d, "temperature": 0, "ignore_eos": true}\n' \
                "$i" $((i % 1999 + 1)) $((i * 7 % 1999 + 1)) 3 4 5 6 7 8 9 10 11 12 13 14 15 $((i * 13 % 1999 + 1)) "$TOKENS"
        done >"$P"
        for ep in 0 1; do
            flag=""
            [ "$ep" = 1 ] && flag=--enable-expert-parallel
            out=$W/run-$np-$c-$ep
            mpirun -q --oversubscribe --bind-to none -np "$np" "$B/dcpinfer" --model "$W/moe" -tp "$np" $flag \
                --max-num-seqs "$c" --max-num-batched-tokens 2048 --output "$out.h5" "$P" >"$out.out" 2>"$out.err" ||
                { echo "run $np $c $ep failed:"; cat "$out.err"; exit 1; }
            tps=$(sed -n 's/^# decode-only steps: .* (\?\([0-9.]*\) tokens\/s.*/\1/p' "$out.out" | head -1)
            # per step (forward pass) of the run: the MoE blocks' seconds
            # on the slowest rank, the collectives' seconds and bytes there
            steps=$(h5dump -y -d /steps/seconds "$out.h5" 2>/dev/null | sed -n '/DATA {/,/}/p' | sed '1d;$d' |
                tr -c '0-9.eE+\n-' ' ' | tr -s ' \n' '\n' | grep -c .)
            moe=$(h5max "$out.h5" /timings/moe)
            xs=0 xb=0
            for ph in prefill decode; do
                for k in moe_dispatch moe_combine tp_sum; do
                    xs=$(echo "$xs + $(h5max "$out.h5" /comm/$ph/$k/seconds)" | bc -l)
                    xb=$(echo "$xb + $(h5max "$out.h5" /comm/$ph/$k/bytes)" | bc -l)
                done
            done
            fwd=$(echo "$(h5max "$out.h5" /timings/decode) + $(h5max "$out.h5" /timings/prefill)" | bc -l)
            printf '  %5d %3d %5d %12.1f %14.3f %12.3f %14.0f %9.0f%%\n' "$np" "$ep" "$c" "${tps:-0}" \
                "$(echo "1000 * $moe / $steps" | bc -l)" "$(echo "1000 * $xs / $steps" | bc -l)" \
                "$(echo "$xb / $steps" | bc -l)" "$(echo "100 * $moe / $fwd" | bc -l)"
        done
    done
done
