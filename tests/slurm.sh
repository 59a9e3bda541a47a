#!/bin/bash
# The Slurm scripts in jobs/ on a real Slurm: Debian's slurm-wlm with munge,
# installed here when missing, a one-node cluster on localhost (slurmctld +
# slurmd, select/cons_tres, a partition of this machine's cores), each
# script submitted with sbatch as a user would, with the overrides a CPU
# partition needs, under LAUNCH=srun (PMIx) and LAUNCH=mpirun. Each job must
# complete and write the tokens a direct mpirun run of the same layout
# writes. The daemons are stopped at the end by their pid files.
# Needs root (to install and start the daemons); skipped (77) otherwise.
. "${DCP_SRCDIR:-$(dirname "$0")/..}/tests/lib.sh"

if [ "$(id -u)" != 0 ]; then
    echo "slurm.sh: starting a Slurm cluster needs root: skipped" >&2
    exit 77
fi
model=$SHARED/models/stories260K
if [ ! -f "$model/stories260K.bin" ]; then
    echo "slurm.sh: stories260K not found under $SHARED: skipped" >&2
    exit 77
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    echo "slurm.sh: installing slurm-wlm and munge" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >"$WORK/apt.log" 2>&1 ||
        { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >"$WORK/apt.log" 2>&1; } ||
        { tail -5 "$WORK/apt.log" >&2; echo "slurm.sh: apt-get install slurm-wlm munge failed: skipped" >&2; exit 77; }
fi

W=$WORK/slurm
mkdir -p "$W/state" "$W/spool" "$W/out"
chmod 755 "$WORK"
export SLURM_CONF=$W/slurm.conf
our_munged=
stop_cluster() {
    local f pids=""
    for f in "$W/slurmd.pid" "$W/slurmctld.pid" $our_munged; do
        [ -f "$f" ] && pids="$pids $(cat "$f")"
    done
    [ -n "$pids" ] && kill $pids 2>/dev/null
    for _ in $(seq 50); do
        kill -0 $pids 2>/dev/null || break
        sleep 0.2
    done
    rm -rf "$WORK"
}
trap stop_cluster EXIT

# munge: the key the package made, and a daemon (ours unless one runs)
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    [ -f /etc/munge/munge.key ] || runuser -u munge -- mungekey --create >/dev/null
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- munged && our_munged=/run/munge/munged.pid
    for _ in $(seq 25); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
fi

host=$(hostname)
mem=$(awk '/MemTotal/ { print int($2 / 1024 / 2) }' /proc/meminfo)
cat >"$SLURM_CONF" <<EOF
ClusterName=dcptest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd.pid
SlurmctldLogFile=$W/slurmctld.log
SlurmdLogFile=$W/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge=600
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
checks=$((checks + 1))
slurmctld -c && slurmd
state=
for _ in $(seq 60); do
    state=$(sinfo -h -N -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.5
done
if [ "$state" = idle ]; then
    pass "one-node Slurm $(sinfo -V | awk '{print $2}') up: node $host idle, $(nproc) CPUs, srun --mpi types: $(srun --mpi=list 2>&1 | tail -n +2 | tr -s ' \t\n' ' ')"
else
    fail "Slurm did not come up (node state '$state'):"
    tail -5 "$W/slurmctld.log" "$W/slurmd.log" >&2
    finish
fi

# the inputs: stories260K without a tokenizer beside it (so its text
# prompts need TOKENIZER), and the reference tokens of each layout from
# mpirun
mkdir -p "$W/model"
ln -s "$model/stories260K.bin" "$W/model/stories260K.bin"
tokens() { h5dump -y -d /requests/output_tokens "$1" 2>/dev/null | sed -n '/DATA {/,/}/p' | tr -c '0-9\n' ' ' | tr -s ' \n' ' '; }
"$MPIRUN" -q --oversubscribe --bind-to none -np 2 "$DCPINFER" --model "$W/model/stories260K.bin" --tokenizer "$model/tok512.bin" \
    -tp 2 --quiet --output "$W/ref-tp2.h5" "$SRC/inputs/stories.jsonl" >/dev/null 2>&1
# DCP needs more ranks than KV heads: a generated model with one KV head
"$MKMODEL" --out "$W/mqa" --heads 8 --kv-heads 1 >/dev/null
"$MPIRUN" -q --oversubscribe --bind-to none -np 2 "$DCPINFER" --model "$W/mqa" -tp 2 -dcp 2 --quiet \
    --output "$W/ref-mqa.h5" "$SRC/inputs/demo.jsonl" >/dev/null 2>&1
"$MPIRUN" -q --oversubscribe --bind-to none -np 2 "$DCPINFER" --model "$W/model/stories260K.bin" --tokenizer "$model/tok512.bin" \
    -dp 2 --quiet --output "$W/ref-dp2.h5" "$SRC/inputs/stories.jsonl" >/dev/null 2>&1
ref_tp2=$(tokens "$W/ref-tp2.h5") ref_dp2=$(tokens "$W/ref-dp2.h5") ref_mqa=$(tokens "$W/ref-mqa.h5")
mqa=(MODEL="$W/mqa" PROMPTS="$SRC/inputs/demo.jsonl" TP=2 DCP=2)

# submit NAME DIR SCRIPT REF [VAR=VALUE...] -- [SBATCH OPTIONS]: sbatch from
# DIR with the CPU overrides, wait for the job, and check its state, its
# log and its tokens against REF
submit() {
    local name=$1 dir=$2 script=$3 ref=$4
    shift 4
    local vars=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    checks=$((checks + 1))
    local id rc
    id=$(cd "$dir" && env MODEL="$W/model/stories260K.bin" TOKENIZER="$model/tok512.bin" PROMPTS="$SRC/inputs/stories.jsonl" \
        OUTPUT="$W/out/$name.h5" BACKEND=cpu DCPINFER="$DCPINFER" "${vars[@]}" \
        timeout 300 sbatch --parsable --wait --partition=test --gpus-per-node=0 --ntasks-per-node=2 --cpus-per-task=1 \
        --output="$W/out/$name.log" "$@" "$script" 2>"$W/out/$name.sbatch-err")
    rc=$?
    local info
    info=$(scontrol show job "$id" 2>/dev/null | grep -oE 'JobState=[A-Z]+|ExitCode=[0-9:]+' | tr '\n' ' ')
    local got
    got=$(tokens "$W/out/$name.h5")
    if [ "$rc" = 0 ] && echo "$info" | grep -q 'JobState=COMPLETED ExitCode=0:0' && [ -n "$ref" ] && [ "$got" = "$ref" ]; then
        pass "$name: job $id $info, tokens as mpirun's: $(grep '^jobs: [sm]' "$W/out/$name.log")"
    else
        fail "$name: job '$id' sbatch status $rc, $info; tokens '$got' vs '$ref':"
        cat "$W/out/$name.sbatch-err" "$W/out/$name.log" 2>/dev/null | grep -v '^  ' | head -20 | sed 's/^/    /' >&2
    fi
}

# submitted from the checkout: Slurm runs a copy from its spool folder, and
# the script finds common.sh where it was submitted from
submit 1node-srun "$SRC" jobs/dcpinfer-1node.sbatch "$ref_mqa" "${mqa[@]}" LAUNCH=srun --
submit 1node-mpirun "$SRC" jobs/dcpinfer-1node.sbatch "$ref_tp2" TP=2 DCP=1 LAUNCH=mpirun --
submit multinode-srun "$SRC/jobs" dcpinfer-multinode.sbatch "$ref_dp2" TP=1 DCP=1 LAUNCH=srun SLURM_MPI_TYPE=pmix -- --nodes=1
submit multinode-mpirun "$SRC" jobs/dcpinfer-multinode.sbatch "$ref_dp2" TP=1 DCP=1 LAUNCH=mpirun -- --nodes=1

# the log says how the job ran: no UCX network here, so Open MPI's own
# transport with a note; SLURM_MPI_TYPE respected; the world checked
checks=$((checks + 1))
if grep -q '^jobs: no RDMA network for UCX' "$W/out/1node-srun.log" &&
    grep -q '^jobs: srun (SLURM_MPI_TYPE=pmix), 2 tasks on 1 node(s), tp 1, dcp 1, dp 2' "$W/out/multinode-srun.log" &&
    grep -q '^jobs: srun, 2 tasks on 1 node(s), tp 2, dcp 2, dp 1' "$W/out/1node-srun.log" &&
    grep -q '^jobs: mpirun, 2 tasks on 1 node(s), tp 2, dcp 1, dp 1' "$W/out/1node-mpirun.log"; then
    pass "job logs: the UCX note, SLURM_MPI_TYPE, the layout"
else
    fail "job logs:"; grep -h '^jobs:' "$W"/out/*.log >&2
fi

# an installed dcpinfer, the script copied elsewhere: common.sh is found in
# PREFIX/share/dcpinfer/jobs
checks=$((checks + 1))
if make -C "$BUILD" install prefix="$W/inst" >"$W/install.log" 2>&1; then
    mkdir -p "$W/myjob"
    cp "$W/inst/share/dcpinfer/jobs/dcpinfer-1node.sbatch" "$W/myjob/run.sbatch"
    pass "make install prefix=$W/inst: $(ls "$W/inst/share/dcpinfer/jobs" | tr '\n' ' ')"
    submit installed "$W/myjob" run.sbatch "$ref_mqa" "${mqa[@]}" LAUNCH=srun DCPINFER="$W/inst/bin/dcpinfer" \
        PATH="$W/inst/bin:$PATH" --
else
    fail "make install:"; tail -5 "$W/install.log" >&2
fi

# a layout the granted tasks cannot hold: the job fails before launching,
# saying why
checks=$((checks + 1))
id=$(cd "$SRC" && env MODEL="$W/model/stories260K.bin" PROMPTS="$SRC/inputs/stories.jsonl" OUTPUT="$W/out/bad.h5" \
    BACKEND=cpu DCPINFER="$DCPINFER" TP=4 timeout 300 sbatch --parsable --wait --partition=test --gpus-per-node=0 \
    --ntasks-per-node=2 --cpus-per-task=1 --output="$W/out/bad.log" jobs/dcpinfer-1node.sbatch 2>/dev/null)
info=$(scontrol show job "$id" 2>/dev/null | grep -oE 'JobState=[A-Z]+|ExitCode=[0-9:]+' | tr '\n' ' ')
if echo "$info" | grep -q 'JobState=FAILED ExitCode=1:0' && grep -q '^jobs: 2 tasks granted, not a multiple of TP=4' "$W/out/bad.log" &&
    [ ! -e "$W/out/bad.h5" ]; then
    pass "TP=4 on 2 tasks: $info, '$(cat "$W/out/bad.log")'"
else
    fail "TP=4 on 2 tasks: $info:"; cat "$W/out/bad.log" >&2
fi
finish
