/* GPU selection and MPI's view of device memory. */
#ifndef DCP_DEVICE_H
#define DCP_DEVICE_H

/* The one place a program chooses its GPU, from its parsed --backend,
 * before MPI_Init (no CUDA context may exist yet): for "cuda", picks the
 * GPU from the launcher's local rank (OMPI_COMM_WORLD_LOCAL_RANK, then
 * MV2_COMM_WORLD_LOCAL_RANK, then SLURM_LOCALID; device = local rank modulo
 * the visible devices) and makes it current. Returns the device, or -1
 * (another backend, or no usable GPU: --backend cuda then fails with the
 * reason). */
int device_select(const char *backend);
/* The node-local rank the launcher put in the environment
 * (OMPI_COMM_WORLD_LOCAL_RANK, then MV2_COMM_WORLD_LOCAL_RANK, then
 * SLURM_LOCALID), or -1 when none is set; *from names the variable. */
int launcher_local_rank(const char **from);
/* 1 when the MPI library says it takes device pointers
 * (MPIX_Query_cuda_support), else 0. */
int device_mpi_accepts_device_buffers(void);
const char *device_name(int device);
/* Peak memory bandwidth of the device in bytes/s (0 when unknown). */
double device_peak_bandwidth(int device);

#endif
