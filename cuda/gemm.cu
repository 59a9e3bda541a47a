// GEMMs: cuBLAS on fp32 and bf16 weights, decode's GEMV and dequantization
// on the stored formats (backend_cuda.cuh).
#include "backend_cuda.cuh"

static __nv_bfloat16 *x_bf16; // activations of a product with bf16 weights
static size_t x_bf16_cap;
static float *w_f32; // a quantized matrix widened for cuBLAS (cuda_matmul)
static size_t w_f32_cap;
static float *x_fp4; // activations quantized as NVFP4 (cuda_fp4_activations)
static size_t x_fp4_cap;

__global__ void k_to_bf16(__nv_bfloat16 *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

// ---- W4A4 activations ---------------------------------------------------

// Group g (16 columns) of row t of x (rows ldx apart; row rows[t] where
// rows is set) quantized as the matrix's W4A4 input (nvfp4_act_group, the
// CPU's arithmetic) into row t of y (in columns): the matrix is expert e's
// of a stack, e found from start[] as k_moe_matmul finds it (start NULL:
// one matrix). A matrix without an input global scale copies the row.
__global__ void k_fp4_act(float *y, const float *x, int ldx, const int *rows, const int *start, int experts, int T,
                          QS_PARAMS, size_t w_step, int in)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, groups = (size_t)in / NVFP4_ACT_GROUP;
    if (i >= (size_t)T * groups) return;
    int t = (int)(i / groups), g = (int)(i % groups) * NVFP4_ACT_GROUP, e = 0;
    while (start && e < experts && t >= start[e + 1]) e++;
    WeightRef qs = qs_ref(scale, scale8, tables, table_runs, run0, qcols, qflags);
    qs.run0 += (size_t)e * w_step / (size_t)qcols;
    float gs = weight_act_scale(&qs), *yr = y + (size_t)t * in + g;
    const float *xr = x + (size_t)(rows ? rows[t] : t) * ldx + g;
    if (gs != 0.0f) nvfp4_act_group(yr, xr, MUTANT(5) ? 1.0f : gs);
    else
        for (int k = 0; k < NVFP4_ACT_GROUP; k++) yr[k] = xr[k];
}

// T rows of x as the W4A4 matrix w (or its experts) reads them, into a
// scratch buffer grown on demand
const float *cuda_fp4_activations(const float *x, int ldx, const int *rows, const int *start, int experts, int T,
                                  WeightRef w, size_t w_step, int in)
{
    size_t n = (size_t)T * in;
    if (n > x_fp4_cap) {
        if (x_fp4) cuda_release(x_fp4);
        x_fp4_cap = 2 * n;
        x_fp4 = (float *)cuda_alloc(sizeof(float) * x_fp4_cap);
    }
    DCP_LAUNCH(k_fp4_act, blocks_for(n / NVFP4_ACT_GROUP, 256), 256, 0, stream, x_fp4, x, ldx, rows, start, experts,
               T, QS_ARGS(w), w_step, in);
    DCP_CHECK_LAUNCH(stream);
    return x_fp4;
}

// ---- GEMM -------------------------------------------------------------

// y (T, out) = x (T, in) . w (out, in)^T, all row-major. In cuBLAS's
// column-major terms: y^T (out x T) = w (out x in) . x^T (in x T).
// x (n floats) as bf16 in x_bf16, grown on demand: the activations of a
// product with bf16 weights
static const __nv_bfloat16 *activations_bf16(const float *x, size_t n)
{
    if (n > x_bf16_cap) {
        if (x_bf16) cuda_release(x_bf16);
        x_bf16_cap = 2 * n;
        x_bf16 = (__nv_bfloat16 *)cuda_alloc(sizeof(__nv_bfloat16) * x_bf16_cap);
    }
    DCP_LAUNCH(k_to_bf16, blocks_for(n, 256), 256, 0, stream, x_bf16, x, n);
    DCP_CHECK_LAUNCH(stream);
    return x_bf16;
}

// n elements of a quantized matrix widened to fp32: weight_value's
// arithmetic (w_load), so that the GEMM that follows reads the dequantized
// twin's values
template <typename W>
__global__ void k_dequant(float *m, const W *q, QS_PARAMS, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) m[i] = w_load(q, qs_ref(scale, scale8, tables, table_runs, run0, qcols, qflags), i);
}

// A quantized matrix's values in fp32, in a scratch buffer grown on demand
static const float *dequantized(WeightRef w, size_t n)
{
    if (n > w_f32_cap) {
        if (w_f32) cuda_release(w_f32);
        w_f32_cap = n;
        w_f32 = (float *)cuda_alloc(sizeof(float) * n);
    }
    if (w.dtype == DTYPE_I4)
        DCP_LAUNCH(k_dequant<Int4>, blocks_for(n, 256), 256, 0, stream, w_f32, (const Int4 *)w.data, QS_ARGS(w), n);
    else if (w.dtype == DTYPE_FP4)
        DCP_LAUNCH(k_dequant<Fp4>, blocks_for(n, 256), 256, 0, stream, w_f32, (const Fp4 *)w.data, QS_ARGS(w), n);
    else
        DCP_LAUNCH(k_dequant<uint8_t>, blocks_for(n, 256), 256, 0, stream, w_f32, (const uint8_t *)w.data, QS_ARGS(w),
                   n);
    DCP_CHECK_LAUNCH(stream);
    return w_f32;
}

// Decode's product on a quantized matrix, up to QG_T rows of x: one block
// per output row, its threads striding the row's elements (each widened as
// w_load widens it) and summing in fp32, then a tree over the threads.
// The matrix is read once, as stored, with no fp32 copy.
#define QG_T 8
#define QG_THREADS 128
template <typename W>
__global__ void k_qgemv(float *y, const float *x, const W *w, QS_PARAMS, int T, int in, int out)
{
    WeightRef qs = qs_ref(scale, scale8, tables, table_runs, run0, qcols, qflags);
    __shared__ float red[QG_T][QG_THREADS];
    int row = blockIdx.x, tid = threadIdx.x;
    float acc[QG_T] = {0};
    size_t base = (size_t)row * in;
    for (int k = tid; k < in; k += QG_THREADS) {
        float v = w_load(w, qs, base + k);
#pragma unroll
        for (int t = 0; t < QG_T; t++)
            if (t < T) acc[t] = fmaf(x[(size_t)t * in + k], v, acc[t]);
    }
#pragma unroll
    for (int t = 0; t < QG_T; t++) red[t][tid] = acc[t];
    __syncthreads();
    for (int half = QG_THREADS / 2; half > 0; half /= 2) {
        if (tid < half)
            for (int t = 0; t < T; t++) red[t][tid] += red[t][tid + half];
        __syncthreads();
    }
    if (tid < T) y[(size_t)tid * out + row] = red[tid][0];
}
DCP_STATIC_SHARED(k_qgemv<uint8_t>, sizeof(float) * QG_T * QG_THREADS);
DCP_STATIC_SHARED(k_qgemv<Int4>, sizeof(float) * QG_T * QG_THREADS);
DCP_STATIC_SHARED(k_qgemv<Fp4>, sizeof(float) * QG_T * QG_THREADS);

void cuda_matmul(float *y, const float *x, WeightRef w, int T, int in, int out)
{
    if (!T || !out) return;
    counts.matmuls++;
    const float one = 1.0f, zero = 0.0f;
    if (dtype_quantized(w.dtype) && T <= QG_T) { // decode: read as stored
        if (w.dtype == DTYPE_I4)
            DCP_LAUNCH(k_qgemv<Int4>, out, QG_THREADS, 0, stream, y, x, (const Int4 *)w.data, QS_ARGS(w), T, in, out);
        else if (w.dtype == DTYPE_FP4)
            DCP_LAUNCH(k_qgemv<Fp4>, out, QG_THREADS, 0, stream, y, x, (const Fp4 *)w.data, QS_ARGS(w), T, in, out);
        else
            DCP_LAUNCH(k_qgemv<uint8_t>, out, QG_THREADS, 0, stream, y, x, (const uint8_t *)w.data, QS_ARGS(w), T, in,
                       out);
        DCP_CHECK_LAUNCH(stream);
        return;
    }
    if (dtype_quantized(w.dtype)) { // prefill: widened, then cuBLAS's fp32 GEMM
        const float *wf = dequantized(w, (size_t)out * in);
        DCP_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, wf, in, x, in, &zero, y, out));
        return;
    }
    if (w.dtype == DTYPE_F32) {
        DCP_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, (const float *)w.data, in, x, in,
                              &zero, y, out));
        return;
    }
    const __nv_bfloat16 *xb = activations_bf16(x, (size_t)T * in);
    DCP_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w.data, CUDA_R_16BF, in, xb, CUDA_R_16BF,
                           in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// One cuBLAS strided-batched GEMM for all heads (backend.h): head b's
// weights are the b-th (out, in) matrix of the stack.
void cuda_matmul_batched(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                         int batch, int T, int in, int out)
{
    if (!T || !out || !batch) return;
    counts.batched_matmuls++;
    const float one = 1.0f, zero = 0.0f;
    long long w_step = (long long)out * in;
    if (w.dtype == DTYPE_F32) {
        DCP_CHECK(cublasSgemmStridedBatched(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, (const float *)w.data,
                                            in, w_step, x, ldx, (long long)x_step, &zero, y, ldy, (long long)y_step,
                                            batch));
        return;
    }
    // the activations as bf16, at the same offsets: from x to the last head's last row
    const __nv_bfloat16 *xb = activations_bf16(x, (size_t)(T - 1) * ldx + (size_t)(batch - 1) * x_step + in);
    DCP_CHECK(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w.data, CUDA_R_16BF, in,
                                         w_step, xb, CUDA_R_16BF, ldx, (long long)x_step, &zero, y, CUDA_R_32F, ldy,
                                         (long long)y_step, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

