# Shared by the Slurm scripts in jobs/: the defaults of their variables, the
# MPI transport, a check of the task count, and the launcher.

MODEL=${MODEL:-$HOME/models/my-model}
PROMPTS=${PROMPTS:-$HOME/prompts.jsonl}
OUTPUT=${OUTPUT:-${SLURM_SUBMIT_DIR:-$PWD}/dcpinfer-${SLURM_JOB_ID:-0}.h5}
TOKENIZER=${TOKENIZER:-}
TP=${TP:-8}
DCP=${DCP:-auto} # the largest the model allows at TP (dcpinfer -dcp auto)
LAUNCH=${LAUNCH:-srun}
BACKEND=${BACKEND:-cuda}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}

# Open MPI's UCX layer where UCX has an RDMA network (InfiniBand, RoCE), as
# on GPU clusters; UCX picks its transports itself; to pin them, set e.g.
#   export UCX_TLS=rc,sm,cuda_copy,cuda_ipc    (InfiniBand + NVLink)
# Without such a network, forcing UCX stops every rank ("PML ucx cannot be
# selected"), so Open MPI then chooses (shared memory within a node, TCP
# between nodes). OMPI_MCA_pml set by the user is kept either way.
if [ -z "${OMPI_MCA_pml:-}" ]; then
    if command -v ucx_info >/dev/null 2>&1 &&
        ucx_info -d 2>/dev/null | grep -qE 'Transport: *(rc_verbs|rc_mlx5|dc_mlx5|ud_verbs|ud_mlx5)'; then
        export OMPI_MCA_pml=ucx
    else
        echo "jobs: no RDMA network for UCX ($(command -v ucx_info >/dev/null 2>&1 && echo "ucx_info -d lists none" ||
            echo "ucx_info not installed")): Open MPI chooses its own transport; set OMPI_MCA_pml=ucx to insist"
    fi
fi
export OMPI_MCA_btl=${OMPI_MCA_btl:-^openib}
# threads per rank: the CPUs Slurm gave each task
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}

tasks=${SLURM_NTASKS:?not inside a Slurm allocation (SLURM_NTASKS unset)}
if [ $((tasks % TP)) -ne 0 ]; then
    echo "jobs: $tasks tasks granted, not a multiple of TP=$TP" >&2
    exit 1
fi
SLURM_NTASKS_DIV_TP=$((tasks / TP))

# the arguments of every script's run
dcpinfer_args=(--backend "$BACKEND" --model "$MODEL" -tp "$TP" -dcp "$DCP" --resume
    --step-timeout "$STEP_TIMEOUT" --output "$OUTPUT")
[ -n "$TOKENIZER" ] && dcpinfer_args+=(--tokenizer "$TOKENIZER")

# launch CMD...: starts one rank per task and checks that the MPI world is
# exactly the tasks Slurm granted (a launcher that starts a different count
# would silently change dp). srun uses SLURM_MPI_TYPE when set, else PMIx
# (Debian's Open MPI starts under --mpi=pmix, not pmi2).
launch() {
    local cmd
    case $LAUNCH in
        srun) cmd=(srun --cpu-bind=cores)
            [ -z "${SLURM_MPI_TYPE:-}" ] && cmd+=(--mpi=pmix) ;;
        mpirun) cmd=(mpirun -np "$tasks" --map-by "ppr:${SLURM_NTASKS_PER_NODE:-8}:node:PE=${OMP_NUM_THREADS}" --bind-to core) ;;
        *) echo "jobs: LAUNCH=$LAUNCH: choose srun or mpirun" >&2; exit 1 ;;
    esac
    echo "jobs: $LAUNCH${SLURM_MPI_TYPE:+ (SLURM_MPI_TYPE=$SLURM_MPI_TYPE)}, $tasks tasks on ${SLURM_JOB_NUM_NODES:-1} node(s), tp $TP, dcp $DCP, dp $SLURM_NTASKS_DIV_TP, $OMP_NUM_THREADS thread(s) per rank"
    "${cmd[@]}" bash -c '
        size=${OMPI_COMM_WORLD_SIZE:-${PMIX_SIZE:-${SLURM_NTASKS:-0}}}
        if [ "$size" != "'"$tasks"'" ]; then
            echo "jobs: this launch started $size ranks, but Slurm granted the job '"$tasks"' tasks" >&2
            exit 1
        fi
        exec "$@"' dcpinfer-rank "$@"
}
