// The CUDA status overload of dcp_check (see src/check.h).
#ifndef DCP_CHECK_CUH
#define DCP_CHECK_CUH

#include <stdio.h>

#include "gpu_runtime.h"

#include "check.h"

static inline void dcp_check(cudaError_t rc, const char *file, int line, const char *stmt)
{
    if (rc != cudaSuccess) dcp_check_failed(file, line, stmt, cudaGetErrorString(rc));
}


// After a kernel launch: the launch's own error and, when the environment
// sets DCPINFER_CUDA_SYNC=1, the kernel's (the stream is synchronised), so
// that a fault is reported at the launch that caused it, not at a later
// call. Off by default: it serialises the host with the GPU.
#define DCP_CHECK_LAUNCH(stream)                                                \
    do {                                                                        \
        DCP_CHECK(cudaGetLastError());                                          \
        if (cuda_sync_each_launch()) DCP_CHECK(cudaStreamSynchronize(stream)); \
    } while (0)

#endif
