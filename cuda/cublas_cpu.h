// A stand-in for the cuBLAS calls of the CUDA backend when it runs on the
// CPU through HIP-CPU (gpu_runtime.h): the same column-major GEMMs by
// OpenBLAS. Device memory is host memory there, so a GEMM waits for the
// handle's stream (the kernels queued before it) and then runs on the
// calling thread, which keeps the stream's order. bf16 operands are widened
// exactly to fp32 and accumulated in fp32, as cuBLAS's CUBLAS_COMPUTE_32F.
#ifndef DCP_CUBLAS_CPU_H
#define DCP_CUBLAS_CPU_H

#include <cblas.h>
#include <cstdlib>
#include <vector>

typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0 } cublasMath_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

struct dcp_cublas {
    hipStream_t stream;
};
typedef dcp_cublas *cublasHandle_t;

inline cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new dcp_cublas{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t h, hipStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
inline const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE";
}

inline CBLAS_TRANSPOSE dcp_cublas_op(cublasOperation_t op) { return op == CUBLAS_OP_T ? CblasTrans : CblasNoTrans; }

inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float *alpha, const float *A, int lda, const float *B, int ldb,
                                  const float *beta, float *C, int ldc)
{
    if (hipStreamSynchronize(h->stream) != hipSuccess) return CUBLAS_STATUS_INVALID_VALUE;
    cblas_sgemm(CblasColMajor, dcp_cublas_op(ta), dcp_cublas_op(tb), m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

// rows x cols of a column-major operand of type t at p, widened to fp32
inline const float *dcp_cublas_widen(const void *p, cudaDataType t, size_t elements, std::vector<float> &buf)
{
    if (t == CUDA_R_32F) return static_cast<const float *>(p);
    const __nv_bfloat16 *b = static_cast<const __nv_bfloat16 *>(p);
    buf.resize(elements);
    for (size_t i = 0; i < elements; i++) buf[i] = __bfloat162float(b[i]);
    return buf.data();
}

inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                   cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                   cublasComputeType_t, cublasGemmAlgo_t)
{
    if (ct != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
    if (hipStreamSynchronize(h->stream) != hipSuccess) return CUBLAS_STATUS_INVALID_VALUE;
    // the stored extents: op(A) is m x k, so A holds lda x (ta ? m : k)
    std::vector<float> wa, wb;
    const float *a = dcp_cublas_widen(A, at, (size_t)lda * (ta == CUBLAS_OP_T ? m : k), wa);
    const float *b = dcp_cublas_widen(B, bt, (size_t)ldb * (tb == CUBLAS_OP_T ? k : n), wb);
    cblas_sgemm(CblasColMajor, dcp_cublas_op(ta), dcp_cublas_op(tb), m, n, k, *static_cast<const float *>(alpha), a,
                lda, b, ldb, *static_cast<const float *>(beta), static_cast<float *>(C), ldc);
    return CUBLAS_STATUS_SUCCESS;
}

// The batched forms: batch products, each operand stepping by its stride.
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                int n, int k, const float *alpha, const float *A, int lda,
                                                long long sa, const float *B, int ldb, long long sb, const float *beta,
                                                float *C, int ldc, long long sc, int batch)
{
    for (int i = 0; i < batch; i++) {
        cublasStatus_t rc = cublasSgemm(h, ta, tb, m, n, k, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
        if (rc != CUBLAS_STATUS_SUCCESS) return rc;
    }
    return CUBLAS_STATUS_SUCCESS;
}

inline size_t dcp_cublas_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                 int n, int k, const void *alpha, const void *A, cudaDataType at,
                                                 int lda, long long sa, const void *B, cudaDataType bt, int ldb,
                                                 long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
                                                 long long sc, int batch, cublasComputeType_t compute,
                                                 cublasGemmAlgo_t algo)
{
    for (int i = 0; i < batch; i++) {
        cublasStatus_t rc = cublasGemmEx(h, ta, tb, m, n, k, alpha, (const char *)A + i * sa * dcp_cublas_size(at), at,
                                         lda, (const char *)B + i * sb * dcp_cublas_size(bt), bt, ldb, beta,
                                         (char *)C + i * sc * dcp_cublas_size(ct), ct, ldc, compute, algo);
        if (rc != CUBLAS_STATUS_SUCCESS) return rc;
    }
    return CUBLAS_STATUS_SUCCESS;
}

#endif
