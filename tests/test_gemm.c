/* The CPU kernels. The batch-invariant GEMM: every row's result is the same bits
 * whatever rows share the call, whatever the thread count, and whatever
 * instruction set computes it (the portable kernel, AVX2, and AVX-512 where
 * this CPU has it); bf16 weights give exactly the fp32 result of their
 * widened values; and the result is the product, within fp32 rounding of a
 * double-precision reference. The attention of one query row: the same
 * bits on every instruction set, within fp32 rounding of double precision. */
#include <omp.h>

#include "backend.h"
#include "kernels_cpu.h"
#include "quant.h"
#include "testutil.h"

static float frand(uint64_t *st) { return (float)((splitmix64(st) >> 40) / 16777216.0) - 0.5f; }

static uint16_t to_bf16(float f) /* round to nearest even */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static const char *isa_names[] = {"generic", "avx2", "avx512"};

/* y = x . w^T computed one row at a time with the given ISA */
static void rows_alone(float *y, const float *x, WeightRef w, int T, int K, int N)
{
    for (int t = 0; t < T; t++) {
        WeightRef wr = w;
        gemm_invariant(y + (size_t)t * N, x + (size_t)t * K, wr, 1, K, N);
    }
}

/* FP8 E4M3 ("fn") by its definition: 2^(e-7) (1 + m/8), subnormals
 * 2^-6 m/8, 0x7F/0xFF NaN; independent of the program's bit trick */
static float e4m3_ref(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v = e == 0 ? ldexpf((float)m / 8.0f, -6) : e == 15 && m == 7 ? NAN : ldexpf(1.0f + m / 8.0f, e - 7);
    return b & 0x80 ? -v : v;
}

/* y = x . wq^T (T rows, K columns, N outputs) on every instruction set
 * and thread count, alone or batched, and from a sub-matrix on: the fp32
 * product of the dequantized twin, bit for bit */
static void expect_twin(const char *tn, const float *x, WeightRef wq, const float *twin, int T, int K, int N)
{
    size_t ny = (size_t)T * N;
    int qcols = wq.qcols;
    float *ref = xmalloc(sizeof(float) * ny), *y = xmalloc(sizeof(float) * ny);
    CHECK(!cpu_set_isa("generic"), "%s", dcp_error());
    omp_set_num_threads(1);
    gemm_invariant(ref, x, weight_ref(twin, DTYPE_F32, 0), T, K, N);
    for (int i = 0; i < 3; i++) {
        if (cpu_set_isa(isa_names[i])) continue;
        for (int threads = 1; threads <= 2; threads++) {
            omp_set_num_threads(threads);
            gemm_invariant(y, x, wq, T, K, N);
            CHECK(!memcmp(y, ref, sizeof(float) * ny), "%s T %d K %d N %d qcols %d: %s, %d threads differs from "
                  "the dequantized twin", tn, T, K, N, qcols, isa_names[i], threads);
            rows_alone(y, x, wq, T, K, N);
            CHECK(!memcmp(y, ref, sizeof(float) * ny), "%s T %d K %d N %d qcols %d: %s, rows alone differ", tn, T, K,
                  N, qcols, isa_names[i]);
        }
        /* a sub-matrix (rows N/2 ..): the scales step with the elements */
        int h = N / 2;
        gemm_invariant(y, x, weight_at(wq, (size_t)h * K), 1, K, N - h);
        CHECK(!memcmp(y, ref + h, sizeof(float) * (N - h)), "%s K %d N %d: %s, rows from %d differ", tn, K, N,
              isa_names[i], h);
    }
    CHECK(!cpu_set_isa("auto"), "auto");
    free(ref), free(y);
}

/* A block-scaled FP8 matrix (DTYPE_F8_E4M3, runs of qcols columns per
 * scale) gives exactly the fp32 product of its dequantized twin, on every
 * instruction set and thread count, alone or batched. */
static void fp8_shape(int T, int K, int N, int qcols, uint64_t *st)
{
    float *x = xmalloc(sizeof(float) * T * K), *twin = xmalloc(sizeof(float) * N * K);
    uint8_t *q = xmalloc((size_t)N * K);
    size_t ns = (size_t)N * K / qcols;
    float *scale = xmalloc(sizeof(float) * ns);
    for (int i = 0; i < T * K; i++) x[i] = frand(st);
    /* scales from 2^-11 to 2^10: the GEMV folds 2^120 into those below 2^8 */
    for (size_t i = 0; i < ns; i++) scale[i] = ldexpf(1.0f + frand(st), (int)(splitmix64(st) % 22) - 11);
    for (size_t i = 0; i < (size_t)N * K; i++) {
        uint8_t b = (uint8_t)splitmix64(st);
        if ((b & 0x7f) == 0x7f) b ^= 1; /* no NaN weights (fp8_nan has them) */
        q[i] = b;
        twin[i] = e4m3_ref(b) * scale[i / qcols];
    }
    WeightRef wq = {.data = q, .dtype = DTYPE_F8_E4M3, .scale = scale, .qcols = qcols, .qflags = 0};
    expect_twin("fp8", x, wq, twin, T, K, N);
    free(x), free(twin), free(q), free(scale);
}

/* FP8's NaN codes (0x7f, 0xff) make their rows' products NaN on every
 * instruction set, alone or batched; the other rows are the twin's */
static void fp8_nan(uint64_t *st)
{
    enum { T = 3, K = 256, N = 9, Q = 16 };
    float x[T * K], twin[N * K], scale[N * K / Q], ref[T * N], y[T * N];
    uint8_t q[N * K];
    for (int i = 0; i < T * K; i++) x[i] = frand(st);
    for (int i = 0; i < N * K / Q; i++) scale[i] = ldexpf(1.0f + frand(st), -(int)(splitmix64(st) % 4));
    for (int i = 0; i < N * K; i++) {
        q[i] = (uint8_t)(splitmix64(st) % 0x7e);
        twin[i] = e4m3_ref(q[i]) * scale[i / Q];
    }
    q[3 * K + 17] = 0x7f, q[6 * K + 200] = 0xff;
    WeightRef wq = {.data = q, .dtype = DTYPE_F8_E4M3, .scale = scale, .qcols = Q, .qflags = 0};
    CHECK(!cpu_set_isa("generic"), "%s", dcp_error());
    gemm_invariant(ref, x, weight_ref(twin, DTYPE_F32, 0), T, K, N);
    for (int i = 0; i < 3; i++) {
        if (cpu_set_isa(isa_names[i])) continue;
        for (int t = 1; t <= T; t += T - 1) {
            gemm_invariant(y, x, wq, t, K, N);
            int bad = 0;
            for (int j = 0; j < t * N; j++) {
                int nan_row = j % N == 3 || j % N == 6;
                bad += nan_row ? !isnan(y[j]) : memcmp(&y[j], &ref[j], sizeof(float)) != 0;
            }
            CHECK(!bad, "fp8 NaN codes: %s, %d rows: %d products wrong", isa_names[i], t, bad);
        }
    }
    CHECK(!cpu_set_isa("auto"), "auto");
}

/* compressed-tensors' packed INT4 (two per byte, low nibble first, value
 * + 8) with bf16 scales per run of qcols: the value (q - 8) * scale
 * rounded to bf16, as compressed-tensors dequantizes in the scale's type;
 * and NVFP4's E2M1 elements packed the same way (sign bit 3, magnitudes
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6) with fp32 scales (an FP8 scale over the
 * global one), the product rounded to bf16 as well. Exactly the fp32
 * product of that twin, as fp8_shape. */
static void nibble_shape(DType t, int T, int K, int N, int qcols, uint64_t *st);
static float nibble_ref(DType t, int v)
{
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    return t == DTYPE_I4 ? (float)(v - 8) : v & 8 ? -e2m1[v & 7] : e2m1[v & 7];
}
static void i4_shape(int T, int K, int N, int qcols, uint64_t *st) { nibble_shape(DTYPE_I4, T, K, N, qcols, st); }
static void fp4_shape(int T, int K, int N, int qcols, uint64_t *st) { nibble_shape(DTYPE_FP4, T, K, N, qcols, st); }
static void nibble_shape(DType t, int T, int K, int N, int qcols, uint64_t *st)
{
    float *x = xmalloc(sizeof(float) * T * K), *twin = xmalloc(sizeof(float) * N * K);
    uint8_t *q = xcalloc((size_t)N * K / 2 + 1, 1);
    size_t ns = (size_t)N * K / qcols;
    float *scale = xmalloc(sizeof(float) * ns);
    /* FP4 also with its scales as stored (WeightRef.scale8): each run's
     * E4M3 code and a table of the codes' values over the global scale of
     * every 7 rows (a checkpoint matrix's, as an expert's in a stack) */
    enum { TABLE_ROWS = 7 };
    size_t table_runs = (size_t)TABLE_ROWS * K / qcols, nt = (ns + table_runs - 1) / table_runs;
    uint8_t *codes = xmalloc(ns);
    float *tables = xcalloc(WEIGHT_TABLE * nt, sizeof(float)); /* the input scale after the 256 values: 0, none */
    for (size_t j = 0; j < nt; j++)
        for (int b = 0; b < 256; b++)
            tables[WEIGHT_TABLE * j + b] = e4m3_ref((uint8_t)b) / (437.5f + 61.25f * (float)j);
    for (int i = 0; i < T * K; i++) x[i] = frand(st);
    for (size_t i = 0; i < ns; i++) { /* bf16 for INT4; for FP4 an E4M3 value over a global scale */
        codes[i] = (uint8_t)(splitmix64(st) % 0x7e);
        scale[i] = t == DTYPE_I4 ? from_bf16(to_bf16(ldexpf(1.0f + frand(st), -(int)(splitmix64(st) % 8))))
                                 : tables[WEIGHT_TABLE * (i / table_runs) + codes[i]];
    }
    for (size_t i = 0; i < (size_t)N * K; i++) {
        int v = (int)(splitmix64(st) % 16);
        q[i / 2] |= (uint8_t)(v << (4 * (i % 2)));
        twin[i] = from_bf16(to_bf16(nibble_ref(t, v) * scale[i / qcols]));
    }
    WeightRef wq = {.data = q, .dtype = t, .scale = scale, .qcols = qcols, .qflags = QF_ROUND_BF16};
    expect_twin(t == DTYPE_I4 ? "int4" : "fp4", x, wq, twin, T, K, N);
    if (t == DTYPE_FP4) {
        WeightRef wc = {.data = q, .dtype = t, .qcols = qcols, .qflags = QF_ROUND_BF16, .scale8 = codes,
                        .tables = tables, .table_runs = table_runs};
        expect_twin("fp4 codes", x, wc, twin, T, K, N);
    }
    free(x), free(twin), free(q), free(scale), free(codes), free(tables);
}

static void shape(int T, int K, int N, uint64_t *st)
{
    float *x = xmalloc(sizeof(float) * T * K), *w = xmalloc(sizeof(float) * N * K);
    float *wb = xmalloc(sizeof(float) * N * K); /* bf16 values widened */
    uint16_t *w16 = xmalloc(2 * (size_t)N * K);
    for (int i = 0; i < T * K; i++) x[i] = frand(st);
    for (int i = 0; i < N * K; i++) {
        w[i] = frand(st);
        w16[i] = to_bf16(w[i]);
        wb[i] = from_bf16(w16[i]);
    }
    size_t ny = (size_t)T * N;
    float *ref = xmalloc(sizeof(float) * ny), *y = xmalloc(sizeof(float) * ny), *y1 = xmalloc(sizeof(float) * ny);
    WeightRef wf = weight_ref(w, DTYPE_F32, 0), wbf = weight_ref(wb, DTYPE_F32, 0), w16r = weight_ref(w16, DTYPE_BF16, 0);

    /* the same bf16 matrix in groups of six rows (WeightRef), where K and
     * N allow; every element where the layout's formula puts it */
    uint16_t *w16g = NULL;
    if (K % 16 == 0 && N >= 6) {
        w16g = xmalloc(2 * (size_t)N * K);
        memcpy(w16g, w16, 2 * (size_t)N * K);
        CHECK(weight_group_rows(w16g, N, K, 2, 6) == 6, "N %d K %d: not grouped", N, K);
        int misplaced = 0;
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                size_t at = n < N / 6 * 6 ? (size_t)(n / 6) * 6 * K + (size_t)(k / 16) * 96 + (n % 6) * 16 + k % 16
                                          : (size_t)n * K + k;
                misplaced += w16g[at] != w16[(size_t)n * K + k];
            }
        CHECK(!misplaced, "N %d K %d: %d grouped elements misplaced", N, K, misplaced);
    } else { /* left row after row */
        uint16_t *c = xmalloc(2 * (size_t)N * K);
        memcpy(c, w16, 2 * (size_t)N * K);
        CHECK(weight_group_rows(c, N, K, 2, 6) == 0 && !memcmp(c, w16, 2 * (size_t)N * K), "K %d N %d: grouped", K,
              N);
        free(c);
    }
    WeightRef w16gr = weight_ref(w16g, DTYPE_BF16, 6);

    CHECK(!cpu_set_isa("generic"), "%s", dcp_error());
    omp_set_num_threads(1);
    gemm_invariant(ref, x, wf, T, K, N);
    /* against double precision: |err| <= K * eps * sum |x w| is the plain
     * bound; the 16 chains and the tree keep it far smaller */
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                s += (double)x[t * K + k] * w[n * K + k];
                a += fabs((double)x[t * K + k] * w[n * K + k]);
            }
            double e = fabs(ref[t * N + n] - s) / (a + 1e-30);
            if (e > worst) worst = e;
        }
    CHECK(worst < 2e-6, "T %d K %d N %d: relative error %g against double", T, K, N, worst);

    for (int i = 0; i < 3; i++) {
        if (cpu_set_isa(isa_names[i])) {
            printf("  %s: not on this CPU, skipped\n", isa_names[i]);
            continue;
        }
        for (int threads = 1; threads <= 2; threads++) {
            omp_set_num_threads(threads);
            gemm_invariant(y, x, wf, T, K, N);
            CHECK(!memcmp(y, ref, sizeof(float) * ny), "T %d K %d N %d: %s, %d threads differs from generic", T, K,
                  N, isa_names[i], threads);
            rows_alone(y1, x, wf, T, K, N);
            CHECK(!memcmp(y1, ref, sizeof(float) * ny), "T %d K %d N %d: %s, rows alone differ from the batch", T, K,
                  N, isa_names[i]);
            /* rows shared with others in odd groupings: t0 .. t0+len */
            for (int t0 = 0; t0 < T; t0 += 5) {
                int len = 1 + (int)(splitmix64(st) % 7);
                if (t0 + len > T) len = T - t0;
                gemm_invariant(y1 + (size_t)t0 * N, x + (size_t)t0 * K, wf, len, K, N);
            }
            CHECK(!memcmp(y1, ref, sizeof(float) * ny), "T %d K %d N %d: %s, regrouped rows differ", T, K, N,
                  isa_names[i]);
            /* bf16 storage: the fp32 result of the widened weights */
            float *yb = xmalloc(sizeof(float) * ny), *yw = xmalloc(sizeof(float) * ny);
            gemm_invariant(yb, x, w16r, T, K, N);
            gemm_invariant(yw, x, wbf, T, K, N);
            CHECK(!memcmp(yb, yw, sizeof(float) * ny), "T %d K %d N %d: %s bf16 differs from its widened fp32", T, K,
                  N, isa_names[i]);
            rows_alone(y1, x, w16r, T, K, N);
            CHECK(!memcmp(y1, yb, sizeof(float) * ny), "T %d K %d N %d: %s bf16 rows alone differ", T, K, N,
                  isa_names[i]);
            /* bf16 rows stored in groups of six: the same bits */
            if (w16g) {
                gemm_invariant(y1, x, w16gr, T, K, N);
                CHECK(!memcmp(y1, yb, sizeof(float) * ny), "T %d K %d N %d: %s, %d threads, grouped bf16 differs", T,
                      K, N, isa_names[i], threads);
                rows_alone(y1, x, w16gr, T, K, N);
                CHECK(!memcmp(y1, yb, sizeof(float) * ny), "T %d K %d N %d: %s grouped bf16 rows alone differ", T, K,
                      N, isa_names[i]);
            }
            free(yb);
            free(yw);
        }
    }
    CHECK(!cpu_set_isa("auto"), "auto");
    free(x), free(w), free(wb), free(w16), free(w16g), free(ref), free(y), free(y1);
}

/* one token's H heads over keys j0 .. n-1 */
static void attend_row(DType kt, float *out, float *lse, const float *q, const void *k, const void *v,
                       const int *table, int B, int stride, int j0, int n, int D, int H, int group, float scale,
                       float *scratch)
{
    AttendRows a = {.R = 1, .H = H, .group = group, .D = D, .Dv = D, .j0 = &j0, .n = &n, .q = q, .out = out,
                    .lse = lse, .k = k, .v = v, .table = table, .B = B, .stride = (size_t)stride,
                    .head_stride = (size_t)D, .block_stride = (size_t)B * stride, .scale = scale, .scratch = scratch};
    cpu_attend(kt)(&a);
}

/* One attention row over n paged keys: the same bits on every ISA, and
 * softmax(q k / sqrt(D)) v within fp32 rounding of double precision. */
static void attention_row(int n, int D, int B, uint64_t *st)
{
    int nblocks = (n + B - 1) / B, stride = 3 * D; /* three KV heads per row; the middle one is read */
    int *table = xmalloc(sizeof(int) * nblocks);
    for (int i = 0; i < nblocks; i++) table[i] = nblocks - 1 - i; /* blocks in reverse order */
    size_t rows = (size_t)nblocks * B;
    float *k = xmalloc(sizeof(float) * rows * stride), *v = xmalloc(sizeof(float) * rows * stride);
    float *q = xmalloc(sizeof(float) * 6 * D), *score = xmalloc(attend_scratch_bytes(n, 6));
    float *ref = xmalloc(sizeof(float) * D), *out = xmalloc(sizeof(float) * D);
    for (size_t i = 0; i < rows * stride; i++) k[i] = 4 * frand(st), v[i] = frand(st);
    for (int d = 0; d < 6 * D; d++) q[d] = frand(st);
    float scale = 1.0f / sqrtf((float)D), lse_ref = 0, lse;
    int j0 = n / 5;
    double *s = xmalloc(sizeof(double) * n), m = -INFINITY, sum = 0;
    for (int j = j0; j < n; j++) {
        const float *kj = k + ((size_t)table[j / B] * B + j % B) * stride + D;
        s[j] = 0;
        for (int d = 0; d < D; d++) s[j] += (double)q[d] * kj[d];
        s[j] *= scale;
        m = s[j] > m ? s[j] : m;
    }
    for (int j = j0; j < n; j++) sum += exp(s[j] - m);
    double worst = 0;
    for (int d = 0; d < D; d++) {
        double o = 0;
        for (int j = j0; j < n; j++) o += exp(s[j] - m) / sum * v[((size_t)table[j / B] * B + j % B) * stride + D + d];
        out[d] = (float)o;
    }
    for (int i = 0; i < 3; i++) {
        if (cpu_set_isa(isa_names[i])) continue;
        float *o = i == 0 ? ref : out;
        float *l = i == 0 ? &lse_ref : &lse;
        float exact[4096];
        memcpy(exact, out, sizeof(float) * D);
        attend_row(DTYPE_F32, o, l, q, k + D, v + D, table, B, stride, j0, n, D, 1, 1, scale, score);
        if (i == 0) {
            for (int d = 0; d < D; d++) {
                double e = fabs(ref[d] - exact[d]);
                worst = e > worst ? e : worst;
            }
            CHECK(worst < 2e-6, "attention n %d D %d: %g from double precision", n, D, worst);
            CHECK(fabs(lse_ref - (m + log(sum))) < 1e-5, "attention lse %g vs %g", lse_ref, m + log(sum));
        } else {
            CHECK(!memcmp(out, ref, sizeof(float) * D) && lse == lse_ref, "attention n %d D %d: %s differs from generic",
                  n, D, isa_names[i]);
        }
    }
    /* six query heads on the three KV heads (two each) in one call, fp32,
     * bf16 and FP8 caches: each head exactly as alone, on every ISA; and an
     * FP8 cache gives exactly the fp32 cache of its widened values */
    uint16_t *k16 = xmalloc(2 * rows * stride), *v16 = xmalloc(2 * rows * stride);
    uint8_t *k8 = xmalloc(rows * stride), *v8 = xmalloc(rows * stride);
    float *kw = xmalloc(sizeof(float) * rows * stride), *vw = xmalloc(sizeof(float) * rows * stride);
    for (size_t i = 0; i < rows * stride; i++) {
        k16[i] = to_bf16(k[i]), v16[i] = to_bf16(v[i]);
        k8[i] = f32_to_f8e4m3(k[i]), v8[i] = f32_to_f8e4m3(v[i]);
        kw[i] = e4m3_ref(k8[i]), vw[i] = e4m3_ref(v8[i]);
    }
    float *all = xmalloc(sizeof(float) * 6 * D), *one = xmalloc(sizeof(float) * D), lse6[6];
    float *wide = xmalloc(sizeof(float) * 6 * D), lsew[6];
    static const char *kt_names[] = {"fp32", "bf16", "fp8"};
    for (int i = 0; i < 3; i++) {
        if (cpu_set_isa(isa_names[i])) continue;
        for (int c = 0; c < 3; c++) {
            DType kt = c == 1 ? DTYPE_BF16 : c == 2 ? DTYPE_F8_E4M3 : DTYPE_F32;
            const void *kk = c == 1 ? (const void *)k16 : c == 2 ? (const void *)k8 : k;
            const void *vv = c == 1 ? (const void *)v16 : c == 2 ? (const void *)v8 : v;
            attend_row(kt, all, lse6, q, kk, vv, table, B, stride, j0, n, D, 6, 2, scale, score);
            int differ = 0;
            for (int h = 0; h < 6; h++) {
                size_t e = (size_t)(h / 2) * D * dtype_bytes(kt);
                attend_row(kt, one, &lse, q + (size_t)h * D, (const char *)kk + e, (const char *)vv + e, table, B,
                           stride, j0, n, D, 1, 1, scale, score);
                differ += memcmp(one, all + (size_t)h * D, sizeof(float) * D) || lse != lse6[h];
            }
            CHECK(!differ, "attention n %d D %d, %s %s: %d of 6 heads differ from alone", n, D, isa_names[i],
                  kt_names[c], differ);
            if (kt != DTYPE_F8_E4M3) continue;
            attend_row(DTYPE_F32, wide, lsew, q, kw, vw, table, B, stride, j0, n, D, 6, 2, scale, score);
            CHECK(!memcmp(wide, all, sizeof(float) * 6 * D) && !memcmp(lsew, lse6, sizeof lse6),
                  "attention n %d D %d, %s: the FP8 cache differs from its widened fp32 twin", n, D, isa_names[i]);
        }
    }
    CHECK(!cpu_set_isa("auto"), "auto");
    free(k16), free(v16), free(k8), free(v8), free(kw), free(vw), free(all), free(one), free(wide);
    free(table), free(k), free(v), free(q), free(score), free(ref), free(out), free(s);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    uint64_t st = 42;
    /* K around the 16-lane width and its tail, N around the 4-row blocks
     * of the portable kernel, T around the 3- and 6-row tiles */
    static const int Ks[] = {1, 7, 16, 17, 31, 48, 100, 775};
    static const int Ns[] = {1, 3, 6, 9, 70};
    static const int Ts[] = {1, 2, 3, 4, 7, 20};
    for (size_t a = 0; a < sizeof Ks / sizeof *Ks; a++)
        for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
            for (size_t c = 0; c < sizeof Ts / sizeof *Ts; c++) shape(Ts[c], Ks[a], Ns[b], &st);
    shape(64, 768, 300, &st); /* large enough for the threaded path */
    /* several blocks, the widest blocks (small K); several row groups
     * (about 2 MiB of activations each: 256 rows at K = 2048) */
    shape(406, 344, 128, &st);
    shape(406, 128, 344, &st);
    shape(406, 2048, 24, &st);
    shape(13, 16, 600, &st);
    shape(13, 1040, 10, &st);
    /* AVX2's panels of 16 weight rows: a part panel after whole ones, with
     * a tail of K; K = 2048, whose lanes' runs are padded apart */
    shape(12, 33, 17, &st);
    shape(18, 2048, 40, &st);
    /* bf16 groups of six: two threads splitting rows inside a group's
     * reach (1003 rows: 167 groups and one row), decode and prefill */
    shape(1, 64, 1003, &st);
    shape(9, 64, 1003, &st);
    /* rows by the GEMV block by block: fewer than a tile, and one or two
     * after the tiles (both AVX2 prefill kernels), in blocks of 1008 and
     * 144 rows when grouped, which would start inside a bf16 group if
     * blocks were multiples of 16 only */
    shape(4, 64, 2100, &st);
    shape(8, 64, 2100, &st);
    shape(20, 768, 700, &st);
    /* FP8: every byte's value against the format's definition, then
     * products at scale runs narrower than, equal to and wider than a
     * vector (DeepSeek's 128), decode and prefill */
    int wrong = 0;
    for (int b = 0; b < 256; b++) {
        float a = f8e4m3_to_f32((uint8_t)b), r = e4m3_ref((uint8_t)b);
        wrong += isnan(r) ? !isnan(a) : memcmp(&a, &r, sizeof a) != 0;
    }
    CHECK(!wrong, "f8e4m3_to_f32: %d of 256 bytes differ from the E4M3 definition", wrong);
    /* and back: the nearest of the 253 finite values (ties to the even
     * code), saturating at 448, for every value, every midpoint between
     * neighbours and a floats either side of it, and random floats */
    wrong = 0;
    int tried = 0;
    for (int i = 0; i < 200000 + 6 * 0x7e; i++, tried++) {
        float x;
        if (i < 6 * 0x7e) {
            float a = e4m3_ref((uint8_t)(i / 6)), b = e4m3_ref((uint8_t)(i / 6 + 1)), mid = (a + b) / 2;
            float xs[6] = {a, b, mid, nextafterf(mid, 0), nextafterf(mid, 1e9f), -mid};
            x = xs[i % 6];
        } else {
            x = ldexpf(frand(&st), 12 - (int)(splitmix64(&st) % 30));
        }
        uint8_t best = 0;
        for (int c = 1; c < 0x7f; c++) { /* the nearest magnitude, ties to the even code */
            float d = fabsf(e4m3_ref((uint8_t)c) - fabsf(x)), bd = fabsf(e4m3_ref(best) - fabsf(x));
            if (d < bd || (d == bd && !(c & 1))) best = (uint8_t)c;
        }
        wrong += f32_to_f8e4m3(x) != (uint8_t)((x < 0 ? 0x80 : 0) | best);
    }
    CHECK(!wrong, "f32_to_f8e4m3: %d of %d values not the nearest E4M3", wrong, tried);
    fp8_shape(1, 48, 70, 4, &st);
    fp8_shape(7, 96, 33, 8, &st);
    fp8_shape(1, 256, 203, 16, &st);
    fp8_shape(20, 768, 300, 128, &st);
    fp8_shape(406, 2048, 40, 128, &st);
    fp8_nan(&st);
    /* INT4 W4A16, groups of 32 as Kimi K2's experts (and narrower runs) */
    i4_shape(1, 64, 50, 4, &st);
    i4_shape(3, 96, 40, 8, &st);
    i4_shape(1, 256, 203, 32, &st);
    i4_shape(20, 768, 300, 32, &st);
    i4_shape(406, 2048, 40, 32, &st);
    /* NVFP4 (W4A16): groups of 16 */
    fp4_shape(1, 64, 50, 4, &st);
    fp4_shape(1, 256, 203, 16, &st);
    fp4_shape(5, 768, 300, 16, &st);
    fp4_shape(406, 2048, 40, 16, &st);
    /* head sizes around the 16- and 64-lane groups, key counts around 4 */
    static const int Ds[] = {8, 16, 40, 64, 128, 200};
    static const int ns[] = {1, 3, 4, 9, 100, 1000};
    for (size_t a = 0; a < sizeof Ds / sizeof *Ds; a++)
        for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) attention_row(ns[b], Ds[a], 16, &st);
    CHECK(cpu_set_isa("sse9") < 0, "unknown ISA accepted");
    printf("gemm: isa %s, %d failures\n", cpu_isa(), test_failures);
    MPI_Finalize();
    return test_failures ? 1 : 0;
}
