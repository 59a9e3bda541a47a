/* dcpinfer-bench-cpu: this machine's limits, for scripts/bench-cpu.sh.
 *   read bandwidth: GB/s summing a 1 GiB array in huge pages (vector
 *     loads, 8 accumulators, threads splitting it), best of 8; with --read
 *     SECONDS, only this, as the rate over every pass for that long
 *   FMA peak: GFLOP/s of a register-only loop of independent FMAs at the
 *     widest vector the GEMM kernels use on this CPU
 *   sgemm: OpenBLAS's GFLOP/s for (M, K) x (K, N)^T through the CPU
 *     backend's --cpu-gemm openblas path
 *   gemm: the same shape through the batch-invariant GEMM (fp32 and bf16)
 *   with --gemv SECONDS, only a decode step's GEMVs (gemv_rate) against
 *     the read rate, in turn
 *   with --qgemv SECONDS, decode GEMVs over DeepSeek-V3 expert-shaped
 *     matrices (2048 x 7168, 2^28 weights in all) stored as fp32, bf16,
 *     FP8 (a scale per 128 columns), INT4 (groups of 32, bf16 scales) and
 *     NVFP4 (groups of 16),
 *     in turn: each one's stored bytes per second and weights per second,
 *     beside the read rate sustained just before
 * Usage: dcpinfer-bench-cpu [threads] [M K N]
 *        dcpinfer-bench-cpu --read SECONDS [threads]
 *        dcpinfer-bench-cpu --gemv SECONDS [threads]
 *        dcpinfer-bench-cpu --qgemv SECONDS [threads [isa]]
 *   (isa: avx2 or avx512, to measure a kernel other than the
 *   best this CPU runs) */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kernels_cpu.h"
#include "util.h"

__attribute__((target("avx2,fma"))) static float read_avx2(const float *p, size_t n)
{
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
    for (size_t i = 0; i + 64 <= n; i += 64)
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) a[j] = _mm256_add_ps(a[j], _mm256_loadu_ps(p + i + 8 * j));
    for (int j = 1; j < 8; j++) a[0] = _mm256_add_ps(a[0], a[j]);
    float s[8];
    _mm256_storeu_ps(s, a[0]);
    return s[0] + s[7];
}

/* GB/s summing a 1 GiB array with THREADS threads: the best of 8 passes
 * (the machine's limit), or, with SECONDS > 0, every pass for that long
 * together (what it sustains over a stretch, as a decode run must) */
static double read_bandwidth(int threads, double seconds)
{
    size_t n = (size_t)1 << 28; /* 1 GiB of floats */
    float *p = xmalloc_huge(n * sizeof(float)); /* in huge pages, as the model's weights are */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) p[i] = (float)(i & 7);
    double best = 0, start = now_s();
    volatile float sink = 0;
    int rep = 0;
    for (; seconds > 0 ? now_s() - start < seconds : rep < 8; rep++) {
        double t0 = now_s();
        float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            int nt = omp_get_num_threads(), me = omp_get_thread_num();
            size_t per = n / nt / 64 * 64;
            total += read_avx2(p + per * me, per);
        }
        double dt = now_s() - t0;
        sink += total;
        double gbs = n * sizeof(float) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    double all = (double)rep * n * sizeof(float) / (now_s() - start) / 1e9;
    free(p);
    return seconds > 0 ? all : best;
}

/* GB/s of the matrices of one decode step of the 110M shape (12 layers of
 * four 768 x 768, two 2048 x 768 and one 768 x 2048, then a 32000 x 768
 * LM head), in that order against one activation row, as gemm_invariant
 * reads them in dcpinfer: elements of type t in huge pages, bf16 in the
 * row groups the model loader stores; every step for SECONDS together.
 * The weights' values do not matter to the speed, but each is written:
 * untouched pages would all map the one zero page, read from cache. */
static double gemv_rate(DType t, double seconds)
{
    enum { L = 12, D = 768, HID = 2048, VOCAB = 32000 };
    static const int shape[7][2] = {{D, D}, {D, D}, {D, D}, {D, D}, {HID, D}, {HID, D}, {D, HID}}; /* out, in */
    size_t n = (size_t)L * (4 * D * D + 3 * (size_t)D * HID) + (size_t)VOCAB * D, es = dtype_bytes(t);
    char *w = xmalloc_huge(n * es);
    memset(w, 0x3c, n * es); /* small finite values in either type */
    float x[HID], y[VOCAB];
    for (int i = 0; i < HID; i++) x[i] = 1e-3f * (float)i;
    int group = t == DTYPE_BF16 ? cpu_weight_group(t) : 0, steps = 0;
    double start = now_s();
    for (; now_s() - start < seconds; steps++) {
        size_t off = 0;
        for (int l = 0; l <= L; l++)
            for (int i = 0; i < (l < L ? 7 : 1); i++) {
                int out = l < L ? shape[i][0] : VOCAB, in = l < L ? shape[i][1] : D;
                gemm_invariant(y, x, weight_ref(w + off * es, t, group), 1, in, out);
                off += (size_t)out * in;
            }
    }
    double gbs = (double)steps * n * es / (now_s() - start) / 1e9;
    free(w);
    return gbs;
}

/* Stored GB/s (and weights per second in *gws) of one-row products over
 * 2^28 weights of type t in matrices of 2048 x 7168, every matrix in turn,
 * for SECONDS: the decode of a DeepSeek-V3 expert's gate or up projection.
 * Quantized types come with their scales (FP8: a scale per 128 columns;
 * INT4: per 32, NVFP4: per 16, the values rounded to bf16), counted in the
 * stored bytes as held: an fp32 scale per run, or NVFP4's 1-byte code per
 * run with a table of the codes' values per matrix. */
static double qgemv_rate(DType t, double seconds, double *gws)
{
    enum { OUT = 2048, IN = 7168 };
    size_t per = (size_t)OUT * IN, mats = ((size_t)1 << 28) / per, n = mats * per;
    int qcols = t == DTYPE_I4 ? 32 : t == DTYPE_FP4 ? 16 : 128;
    size_t bytes = dtype_data_bytes(t, n), nscale = dtype_quantized(t) ? n / (size_t)qcols : 0;
    int codes = t == DTYPE_FP4;
    size_t sbytes = codes ? nscale + mats * 256 * sizeof(float) : nscale * sizeof(float);
    char *w = xmalloc_huge(bytes);
    float *scale = nscale && !codes ? xmalloc_huge(nscale * sizeof(float)) : NULL, *tables = NULL;
    uint8_t *code = codes ? xmalloc_huge(nscale) : NULL;
    uint64_t st = 5;
    for (size_t i = 0; i < bytes; i++) w[i] = (char)(splitmix64(&st) & (t == DTYPE_F8_E4M3 ? 0x77 : 0x3f));
    if (t == DTYPE_F32 || t == DTYPE_BF16) memset(w, 0x3c, bytes); /* small finite values */
    for (size_t i = 0; scale && i < nscale; i++) scale[i] = 1.0f / 64;
    if (codes) {
        memset(code, 0x38, nscale); /* E4M3 1.0 */
        tables = xcalloc(mats * WEIGHT_TABLE, sizeof(float));
        for (size_t i = 0; i < mats * WEIGHT_TABLE; i++)
            if (i % WEIGHT_TABLE < 256) tables[i] = f8e4m3_to_f32((uint8_t)(i % WEIGHT_TABLE)) / 64;
    }
    float x[IN], y[OUT];
    for (int i = 0; i < IN; i++) x[i] = 1e-3f * (float)i;
    int steps = 0;
    double start = now_s();
    for (; now_s() - start < seconds; steps++)
        for (size_t m = 0; m < mats; m++) {
            WeightRef r = {.data = w + dtype_data_bytes(t, m * per), .dtype = t,
                           .scale = scale ? scale + m * per / (size_t)qcols : NULL, .qcols = nscale ? qcols : 0,
                           .qflags = dtype_nibbles(t) ? QF_ROUND_BF16 : 0,
                           .scale8 = code ? code + m * per / (size_t)qcols : NULL,
                           .tables = tables ? tables + WEIGHT_TABLE * m : NULL, .table_runs = per / (size_t)qcols};
            gemm_invariant(y, x, r, 1, IN, OUT);
        }
    double dt = now_s() - start;
    *gws = (double)steps * n / dt / 1e9;
    double gbs = (double)steps * (bytes + sbytes) / dt / 1e9;
    free(w), free(scale), free(code), free(tables);
    return gbs;
}

__attribute__((target("avx2,fma"))) static float fma_loop_avx2(long iters)
{
    __m256 a[10], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 10; i++) a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 10
        for (int i = 0; i < 10; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    for (int i = 1; i < 10; i++) a[0] = _mm256_add_ps(a[0], a[i]);
    return _mm256_cvtss_f32(a[0]);
}

__attribute__((target("avx512f"))) static float fma_loop_avx512(long iters)
{
    __m512 a[12], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    for (int i = 1; i < 12; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}

static double fma_peak(int threads)
{
    int wide = !strcmp(cpu_isa(), "avx512");
    long iters = 100000000;
    double flops = (double)iters * (wide ? 12 * 16 : 10 * 8) * 2 * threads, best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = now_s();
#pragma omp parallel num_threads(threads)
        sink += wide ? fma_loop_avx512(iters) : fma_loop_avx2(iters);
        double g = flops / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

static double gflops(int M, int K, int N, double seconds) { return 2.0 * M * K * N / seconds / 1e9; }

int main(int argc, char **argv)
{
    int gemv = argc > 2 && !strcmp(argv[1], "--gemv"), qgemv = argc > 2 && !strcmp(argv[1], "--qgemv");
    int timed = gemv || qgemv || (argc > 2 && !strcmp(argv[1], "--read")); /* --read, --gemv or --qgemv SECONDS [threads] */
    double seconds = timed ? atof(argv[2]) : 0;
    int threads = timed ? (argc > 3 ? atoi(argv[3]) : omp_get_max_threads())
                        : (argc > 1 ? atoi(argv[1]) : omp_get_max_threads());
    int M = argc > 4 ? atoi(argv[2]) : 512, K = argc > 4 ? atoi(argv[3]) : 768, N = argc > 4 ? atoi(argv[4]) : 2048;
    if (threads < 1 || (timed ? seconds <= 0 : M < 1 || K < 1 || N < 1)) {
        fprintf(stderr, "usage: dcpinfer-bench-cpu [threads] [M K N] | --read SECONDS [threads] | --gemv SECONDS "
                        "[threads] | --qgemv SECONDS [threads [isa]]\n");
        return 2;
    }
    backend_set_threads(threads);
    if (qgemv && argc > 4 && cpu_set_isa(argv[4])) {
        fprintf(stderr, "dcpinfer-bench-cpu: %s\n", dcp_error());
        return 2;
    }
    if (strcmp(cpu_isa(), "generic") == 0) { /* the read loop is AVX2 as well */
        fprintf(stderr, "dcpinfer-bench-cpu: needs AVX2 and FMA\n");
        return 1;
    }
    if (gemv) { /* in turn, so that each sees the machine of the same minutes */
        for (int round = 0; round < 2; round++)
            printf("read_sustained_gbs %.2f  gemv_f32_gbs %.2f  gemv_bf16_gbs %.2f\n", read_bandwidth(threads, seconds),
                   gemv_rate(DTYPE_F32, seconds), gemv_rate(DTYPE_BF16, seconds));
        return 0;
    }
    if (qgemv) { /* each type beside the read rate of the same minute */
        static const struct {
            DType t;
            const char *name;
        } types[] = {{DTYPE_F32, "f32"}, {DTYPE_BF16, "bf16"}, {DTYPE_F8_E4M3, "fp8"}, {DTYPE_I4, "int4"},
                     {DTYPE_FP4, "nvfp4"}};
        for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
            double read = read_bandwidth(threads, seconds), gws, gbs = qgemv_rate(types[i].t, seconds, &gws);
            printf("qgemv_%s read_sustained_gbs %.2f stored_gbs %.2f gweights_s %.2f\n", types[i].name, read, gbs, gws);
        }
        return 0;
    }
    if (timed) {
        printf("read_sustained_gbs %.2f\n", read_bandwidth(threads, seconds));
        return 0;
    }
    printf("threads %d isa %s\n", threads, cpu_isa());
    printf("read_bandwidth_gbs %.2f\n", read_bandwidth(threads, 0));
    printf("fma_peak_gflops %.1f\n", fma_peak(threads));
    /* COPIES weight matrices used in turn, as a model's layers are: the
     * weights come from memory, not from the cache the previous call left */
    enum { COPIES = 16 };
    float *x = xmalloc(sizeof(float) * M * K), *w = xmalloc(sizeof(float) * N * K * COPIES);
    float *y = xmalloc(sizeof(float) * M * N);
    uint16_t *w16 = xmalloc(2 * (size_t)N * K * COPIES);
    uint64_t st = 1;
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (float)((splitmix64(&st) >> 40) / 16777216.0) - 0.5f;
    for (size_t i = 0; i < (size_t)N * K * COPIES; i++) {
        w[i] = (float)((splitmix64(&st) >> 40) / 16777216.0) - 0.5f;
        uint32_t u;
        memcpy(&u, &w[i], 4);
        w16[i] = (uint16_t)(u >> 16);
    }
    /* the CPU backend's --cpu-gemm openblas path: threads split N, each
     * calling a single-threaded sgemm */
    const Backend *openblas = backend_cpu();
    backend_cpu_set_gemm("openblas");
    double best = 1e30;
    for (int rep = 0; rep < 20; rep++) {
        double t0 = now_s();
        openblas->matmul(y, x, weight_ref(w, DTYPE_F32, 0), M, K, N);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    printf("sgemm_gflops %.1f  # M %d K %d N %d\n", gflops(M, K, N, best), M, K, N);
    backend_cpu_set_gemm("invariant");
    for (int b = 0; b < 2; b++) {
        WeightRef wr = b ? weight_ref(w16, DTYPE_BF16, 0) : weight_ref(w, DTYPE_F32, 0);
        best = 1e30;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now_s();
            for (int c = 0; c < COPIES; c++) gemm_invariant(y, x, weight_at(wr, (size_t)c * N * K), M, K, N);
            double dt = (now_s() - t0) / COPIES;
            if (dt < best) best = dt;
        }
        printf("gemm_%s_gflops %.1f\n", b ? "bf16" : "f32", gflops(M, K, N, best));
    }
    free(x), free(w), free(y), free(w16);
    return 0;
}
