# Shared by the Slurm scripts in jobs/: the MPI settings GPU clusters use,
# a check of the task count, and the launcher.

# Open MPI's UCX point-to-point layer, as on InfiniBand/RoCE GPU clusters.
# UCX picks its transports itself; to pin them, set e.g.
#   export UCX_TLS=rc,sm,cuda_copy,cuda_ipc    (InfiniBand + NVLink)
#   export UCX_TLS=tcp,sm                      (no RDMA network)
export OMPI_MCA_pml=${OMPI_MCA_pml:-ucx}
export OMPI_MCA_btl=${OMPI_MCA_btl:-^openib}
# threads per rank: the CPUs Slurm gave each task
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}

tasks=${SLURM_NTASKS:?not inside a Slurm allocation (SLURM_NTASKS unset)}
if [ $((tasks % TP)) -ne 0 ]; then
    echo "jobs: $tasks tasks granted, not a multiple of TP=$TP" >&2
    exit 1
fi
SLURM_NTASKS_DIV_TP=$((tasks / TP))

# launch CMD...: starts one rank per task and checks that the MPI world is
# exactly the tasks Slurm granted (a launcher that starts a different count
# would silently change dp).
launch() {
    local cmd
    case $LAUNCH in
        srun) cmd=(srun --mpi=pmix --cpu-bind=cores) ;;
        mpirun) cmd=(mpirun -np "$tasks" --map-by "ppr:${SLURM_NTASKS_PER_NODE:-8}:node:PE=${OMP_NUM_THREADS}" --bind-to core) ;;
        *) echo "jobs: LAUNCH=$LAUNCH: choose srun or mpirun" >&2; exit 1 ;;
    esac
    echo "jobs: $LAUNCH, $tasks tasks on ${SLURM_JOB_NUM_NODES:-1} node(s), tp $TP, dp $SLURM_NTASKS_DIV_TP"
    "${cmd[@]}" bash -c '
        size=${OMPI_COMM_WORLD_SIZE:-${PMIX_SIZE:-${SLURM_NTASKS:-0}}}
        if [ "$size" != "'"$tasks"'" ]; then
            echo "jobs: MPI world size $size differs from the $SLURM_NTASKS tasks Slurm granted" >&2
            exit 1
        fi
        exec "$@"' dcpinfer-rank "$@"
}
