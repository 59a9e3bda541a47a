// GEMMs: every product, of every weight format and row count, by one
// kernel in the CPU backend's batch-invariant arithmetic; and the W4A4
// activations (backend_cuda.cuh).
#include "backend_cuda.cuh"

static float *x_fp4; // activations quantized as NVFP4 (cuda_fp4_activations)
static size_t x_fp4_cap;

// ---- W4A4 activations ---------------------------------------------------

// Group g (16 columns) of row t of x (rows ldx apart; row rows[t] where
// rows is set) quantized as the matrix's W4A4 input (nvfp4_act_group, the
// CPU's arithmetic) into row t of y (in columns): the matrix is expert e's
// of a stack, e found from start[] (expert_of; start NULL:
// one matrix). A matrix without an input global scale copies the row.
__global__ void k_fp4_act(float *y, const float *x, int ldx, const int *rows, const int *start, int experts, int T,
                          QS_PARAMS, size_t w_step, int in)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, groups = (size_t)in / NVFP4_ACT_GROUP;
    if (i >= (size_t)T * groups) return;
    int t = (int)(i / groups), g = (int)(i % groups) * NVFP4_ACT_GROUP, e = start ? expert_of(start, experts, t) : 0;
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

// y (T, out) = x (T, in) . w (out, in)^T, row-major, each element in the
// arithmetic of the CPU backend's invariant GEMM (docs/design.md, "Same
// bits whatever shares the batch"): 16 lane chains, lane l the FMAs over
// k = l, l + 16, ... of the whole runs of 16, added by the fixed tree
// (h_i = a_i + a_(i+8), g_i = h_i + h_(i+4), (g_0 + g_2) + (g_1 + g_3)),
// then the K mod 16 tail by FMA; a stored element widened by w_load (the
// dequantized twin's value). The grid only says which elements a thread
// computes, so an element's bits are the same at any row count, batch or
// layout, and equal the CPU backend's.
// A thread computes weight row n against GM_T activation rows: it reads
// the row 16 consecutive elements at a time (whole 32-byte sectors: the
// bytes a warp fetches are all used), widens them once (a stored format's
// run scale looked up once per 16 when runs are multiples of 16) and runs
// the 16 lanes of every activation row on them. No thread waits for
// another: no shared memory, no barrier. Batched: blockIdx.z is the
// matrix of a stack, each operand stepping by its stride.
#define GM_T 4
#define GM_THREADS 128

template <typename W>
__global__ void k_gemm(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, const W *w,
                       size_t w_step, QS_PARAMS, int T, int in, int out)
{
    WeightRef qs = qs_ref(scale, scale8, tables, table_runs, run0, qcols, qflags);
    int n = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * GM_T, nt = min(GM_T, T - t0),
        whole = in - in % GM_LANES;
    if (n >= out) return;
    x += blockIdx.z * x_step + (size_t)t0 * ldx;
    y += blockIdx.z * y_step + (size_t)t0 * ldy;
    size_t row = blockIdx.z * w_step + (size_t)n * in; // weight row n's first element
    float acc[GM_T][GM_LANES];
#pragma unroll
    for (int t = 0; t < GM_T; t++)
#pragma unroll
        for (int l = 0; l < GM_LANES; l++) acc[t][l] = 0.0f;
    for (int k = 0; k < whole; k += GM_LANES) {
        float v[GM_LANES];
        w_load16(v, w, qs, row + k);
#pragma unroll
        for (int t = 0; t < GM_T; t++)
            if (t < nt) {
                const float *xr = x + (size_t)t * ldx + k;
#pragma unroll
                for (int l = 0; l < GM_LANES; l++) acc[t][l] = fmaf(xr[l], v[l], acc[t][l]);
            }
    }
#pragma unroll
    for (int t = 0; t < GM_T; t++)
        if (t < nt) {
            float s = lane_tree(acc[t]);
            const float *xr = x + (size_t)t * ldx;
            for (int k = whole; k < in; k++) s = fmaf(xr[k], w_load(w, qs, row + k), s);
            y[(size_t)t * ldy + n] = s;
        }
}

// `batch` products of T rows (backend.h): one launch, the kernel for w's format
static void gemm(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                 size_t w_step, int batch, int T, int in, int out)
{
    dim3 grid(blocks_for((size_t)out, GM_THREADS), blocks_for((size_t)T, GM_T), batch);
#define GM_LAUNCH(W)                                                                                                  \
    DCP_LAUNCH(k_gemm<W>, grid, GM_THREADS, 0, stream, y, ldy, y_step, x, ldx, x_step, (const W *)w.data, w_step,    \
               QS_ARGS(w), T, in, out)
    switch (w.dtype) {
    case DTYPE_F32: GM_LAUNCH(float); break;
    case DTYPE_BF16: GM_LAUNCH(__nv_bfloat16); break;
    case DTYPE_F8_E4M3: GM_LAUNCH(uint8_t); break;
    case DTYPE_I4: GM_LAUNCH(Int4); break;
    case DTYPE_FP4: GM_LAUNCH(Fp4); break;
    default: dcp_check_failed(__FILE__, __LINE__, "cuda gemm", "a weight format without a kernel");
    }
#undef GM_LAUNCH
    DCP_CHECK_LAUNCH(stream);
}

void cuda_matmul(float *y, const float *x, WeightRef w, int T, int in, int out)
{
    if (!T || !out) return;
    counts.matmuls++;
    gemm(y, out, 0, x, in, 0, w, 0, 1, T, in, out);
}

// All heads in one launch (backend.h): head b's weights are the b-th
// (out, in) matrix of the stack.
void cuda_matmul_batched(float *y, int ldy, size_t y_step, const float *x, int ldx, size_t x_step, WeightRef w,
                         int batch, int T, int in, int out)
{
    if (!T || !out || !batch) return;
    counts.batched_matmuls++;
    gemm(y, ldy, y_step, x, ldx, x_step, w, (size_t)out * in, batch, T, in, out);
}
