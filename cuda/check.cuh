// CUDA and cuBLAS status overloads of dcp_check (see src/check.h).
#ifndef DCP_CHECK_CUH
#define DCP_CHECK_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "check.h"

static inline void dcp_check(cudaError_t rc, const char *file, int line, const char *stmt)
{
    if (rc != cudaSuccess) dcp_check_failed(file, line, stmt, cudaGetErrorString(rc));
}

static inline void dcp_check(cublasStatus_t rc, const char *file, int line, const char *stmt)
{
    if (rc != CUBLAS_STATUS_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuBLAS status %d (%s)", (int)rc, cublasGetStatusString(rc));
        dcp_check_failed(file, line, stmt, what);
    }
}

#endif
