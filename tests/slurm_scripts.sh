#!/bin/bash
# The Slurm scripts in jobs/ without a Slurm cluster (tests/slurm.sh runs
# them under a real one, as root): run by bash inside a faked allocation
# (SLURM_NTASKS and the rest set, LAUNCH=mpirun, BACKEND=cpu) with an
# scontrol that fails as a busy controller's does, each script completes
# instead of stopping at that call; and with DCP left to its default
# (auto) each picks the largest dcp the model allows: 1 for a GQA model
# whose KV heads the ranks split, 2 for an MQA model at tp 2. DCP=8 on the
# GQA model is refused in dcpinfer's words.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"
mkdir -p "$WORK/bin"
printf '#!/bin/sh\necho "scontrol: error: Unable to contact slurm controller (connect failure)" >&2\nexit 1\n' \
    >"$WORK/bin/scontrol"
chmod +x "$WORK/bin/scontrol"
"$MKMODEL" --out "$WORK/gqa" --layers 2 --dim 64 --heads 8 --kv-heads 2 --hidden 128 --vocab 300 --seed 1 >/dev/null &&
    "$MKMODEL" --out "$WORK/mqa" --layers 2 --dim 64 --heads 4 --kv-heads 1 --hidden 128 --vocab 300 --seed 2 \
        >/dev/null || exit 1
printf '{"id": "a", "prompt_token_ids": [5, 17, 200, 31], "max_tokens": 4}\n' >"$WORK/p.jsonl"
# job SCRIPT NAME MODEL [VAR=VALUE...]: the script in a faked 2-task allocation
job() {
    local script=$1 name=$2 model=$3; shift 3
    (cd "$WORK" && env PATH="$WORK/bin:$PATH" SLURM_JOB_ID=$name SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 \
        SLURM_JOB_NUM_NODES=1 SLURM_CPUS_PER_TASK=1 SLURM_SUBMIT_DIR="$WORK" MODEL="$model" PROMPTS="$WORK/p.jsonl" \
        OUTPUT="$WORK/$name.h5" TP=2 LAUNCH=mpirun BACKEND=cpu DCPINFER="$DCPINFER" "$@" \
        bash "$SRC/jobs/$script" >"$WORK/$name.out" 2>"$WORK/$name.err")
    echo $? >"$WORK/$name.rc"
}
for script in dcpinfer-1node.sbatch dcpinfer-multinode.sbatch; do
    for m in gqa mqa; do
        name=${script%%.*}-$m
        want=$([ $m = gqa ] && echo 1 || echo 2)
        job "$script" "$name" "$WORK/$m"
        checks=$((checks + 1))
        if [ "$(cat "$WORK/$name.rc")" = 0 ] && [ -f "$WORK/$name.h5" ] &&
            grep -q "^# layout: 2 rank(s) = dp 1 x tp 2, dcp $want," "$WORK/$name.out"; then
            pass "$script, $m model, scontrol failing: completed at tp 2 dcp $want (DCP=auto)"
        else
            fail "$script, $m model: exit $(cat "$WORK/$name.rc"), $(grep '^# layout' "$WORK/$name.out")"
            tail -5 "$WORK/$name.err" >&2
        fi
    done
done
checks=$((checks + 1))
job dcpinfer-1node.sbatch dcp8 "$WORK/gqa" DCP=8
if [ "$(cat "$WORK/dcp8.rc")" != 0 ] && grep -q "invalid layout: -dcp 8 does not divide -tp 2" "$WORK/dcp8.err"; then
    pass "DCP=8 at TP=2: refused ($(grep -m1 -o 'invalid layout: [^;]*' "$WORK/dcp8.err"))"
else
    fail "DCP=8 at TP=2: exit $(cat "$WORK/dcp8.rc"): $(tail -2 "$WORK/dcp8.err")"
fi
finish
