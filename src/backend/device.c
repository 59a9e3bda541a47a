/* What the MPI library says about device memory, asked at run time: a
 * CUDA-aware Open MPI takes device pointers in its calls, others need the
 * data staged through host memory. */
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <stdlib.h>

#include "device.h"

int launcher_local_rank(const char **from)
{
    static const char *names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
    for (int i = 0; i < 3; i++)
        if (getenv(names[i])) {
            if (from) *from = names[i];
            return atoi(getenv(names[i]));
        }
    return -1;
}

int device_mpi_accepts_device_buffers(void)
{
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() == 1;
#else
    return 0;
#endif
}
