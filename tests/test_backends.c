/* Backend conformance: every op of the CUDA backend against the CPU
 * backend on the same random inputs, within a per-op tolerance. Skips
 * (77) where there is no CUDA backend (a CPU-only build, or no GPU). */
#include "backend.h"
#include "engine.h"
#include "generate.h"
#include "moe.h"
#include "quant.h"
#include "testutil.h"

static const Backend *cpu, *gpu;

static float *rnd(size_t n, uint64_t *st)
{
    float *p = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = (float)((splitmix64(st) >> 40) / 16777216.0) * 2.0f - 1.0f;
    return p;
}

static void *on_gpu(const void *host, size_t bytes)
{
    void *d = gpu->alloc(bytes);
    gpu->upload(d, host, bytes);
    return d;
}

/* A random quantized matrix of n elements on the host, runs of qcols per
 * scale: FP8 (no NaN bytes), or INT4 or FP4 whose products are rounded to
 * bf16 (compressed-tensors' W4A16, NVFP4); free q.data, q.scale. */
static WeightRef rnd_quant(DType t, size_t n, int qcols, uint64_t *st)
{
    uint8_t *q = xmalloc(n);
    float *scale = xmalloc(sizeof(float) * (n / qcols + 1));
    for (size_t i = 0; i < n; i++) {
        q[i] = (uint8_t)splitmix64(st);
        if ((q[i] & 0x7f) == 0x7f) q[i] ^= 1;
    }
    for (size_t i = 0; i < n / qcols; i++)
        scale[i] = ldexpf(t != DTYPE_F8_E4M3 ? 1.0f + (float)(splitmix64(st) % 128) / 128 : 1.0f,
                          -6 - (int)(splitmix64(st) % 4));
    WeightRef w = {.data = q, .dtype = t, .scale = scale, .qcols = qcols,
                   .qflags = t != DTYPE_F8_E4M3 ? QF_ROUND_BF16 : 0};
    return w;
}
/* An FP4 one with its scales as stored (WeightRef.scale8): E4M3 codes,
 * and per table_runs runs (a checkpoint matrix's, as an expert's) a table
 * of the codes' values over its global scale; free q.data, scale8, tables. */
static WeightRef rnd_fp4_codes(size_t n, int qcols, size_t table_runs, uint64_t *st)
{
    WeightRef w = rnd_quant(DTYPE_FP4, n, qcols, st);
    free((void *)w.scale);
    size_t ns = n / qcols, nt = (ns + table_runs - 1) / table_runs;
    uint8_t *codes = xmalloc(ns);
    float *tables = xcalloc(WEIGHT_TABLE * nt, sizeof(float));
    for (size_t i = 0; i < ns; i++) codes[i] = (uint8_t)(0x30 + splitmix64(st) % 0x20); /* 0.25 .. 7.5 */
    for (size_t j = 0; j < nt; j++)
        for (int b = 0; b < 256; b++)
            tables[WEIGHT_TABLE * j + b] = f8e4m3_to_f32((uint8_t)b) / (448.0f + 37.0f * (float)j);
    w.scale = NULL, w.scale8 = codes, w.tables = tables, w.table_runs = table_runs;
    return w;
}
static void free_quant(WeightRef q)
{
    free((void *)q.data), free((void *)q.scale), free((void *)q.scale8), free((void *)q.tables);
}
static void release_matrix(WeightRef w)
{
    gpu->release_weights(w.data);
    if (w.scale) gpu->release_weights(w.scale);
    if (w.scale8) gpu->release_weights(w.scale8), gpu->release_weights(w.tables);
}

static float *back(const void *d, size_t n)
{
    float *h = xmalloc(sizeof(float) * n);
    gpu->download(h, d, sizeof(float) * n);
    return h;
}

/* max |a - b| / (1 + |b|) */
static double diff(const float *a, const float *b, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(a[i]) && isinf(b[i]) && (a[i] < 0) == (b[i] < 0)) continue;
        w = fmax(w, fabs((double)a[i] - b[i]) / (1.0 + fabs(b[i])));
    }
    return w;
}

#define EXPECT_CLOSE(name, got, want, n, tol)                                  \
    do {                                                                       \
        double d_ = diff(got, want, n);                                        \
        fprintf(stderr, "%-16s max relative difference %.2g\n", name, d_);    \
        CHECK(d_ <= (tol), "%s differs by %g (tolerance %g)", name, d_, (double)(tol)); \
    } while (0)

static void elementwise(uint64_t *st)
{
    enum { T = 7, DIM = 96, OUT = 50, H = 4, D = 24 };
    /* matmul over a stack of layers, each layer's view taken as the engine
     * takes it (weight_at), in fp32 and in bf16 storage */
    enum { LAYERS = 3 };
    float *x = rnd(T * DIM, st), *w = rnd((size_t)LAYERS * OUT * DIM, st), y[T * OUT];
    float *dx = on_gpu(x, sizeof(float) * T * DIM), *dy = gpu->alloc(sizeof(float) * T * OUT);
    const char *dtypes[2] = {"float32", "bfloat16"};
    for (int b = 0; b < 2; b++) {
        CHECK(gpu->set_gemm_dtype(dtypes[b]) == 0, "%s GEMMs: %s", dtypes[b], dcp_error());
        WeightRef stack = gpu->gemm_weights(weight_ref(w, DTYPE_F32, 0), (size_t)LAYERS * OUT * DIM);
        for (int l = 0; l < LAYERS; l++) {
            cpu->matmul(y, x, weight_ref(w + (size_t)l * OUT * DIM, DTYPE_F32, 0), T, DIM, OUT);
            gpu->matmul(dy, dx, weight_at(stack, (size_t)l * OUT * DIM), T, DIM, OUT);
            float *gy = back(dy, T * OUT);
            char name[32];
            snprintf(name, sizeof name, "matmul %s l%d", b ? "bf16" : "f32", l);
            /* bf16 weights and activations, fp32 accumulation: within bf16 rounding */
            EXPECT_CLOSE(name, gy, y, T * OUT, b ? 5e-2 : 1e-5);
            free(gy);
        }
        gpu->release_weights(stack.data);
    }
    gpu->set_gemm_dtype("float32");
    /* an FP8 cache's scales: x / s and x * s, each one fp32 operation, the same bits */
    for (int divide = 0; divide < 2; divide++) {
        float sx[T * DIM];
        memcpy(sx, x, sizeof sx);
        float *ds = on_gpu(x, sizeof sx);
        cpu->scale(sx, T * DIM, 0.0123f, divide);
        gpu->scale(ds, T * DIM, 0.0123f, divide);
        float *gs = back(ds, T * DIM);
        CHECK(!memcmp(gs, sx, sizeof sx), "scale (%s) differs from the CPU's", divide ? "divide" : "multiply");
        free(gs);
        gpu->release(ds);
    }
    /* rmsnorm */
    float *g = rnd(DIM, st), n1[T * DIM];
    cpu->rmsnorm(n1, DIM, x, DIM, g, T, DIM, 1e-5f);
    float *dg = on_gpu(g, sizeof(float) * DIM), *dn = gpu->alloc(sizeof(float) * T * DIM);
    gpu->rmsnorm(dn, DIM, dx, DIM, dg, T, DIM, 1e-5f);
    float *gn = back(dn, T * DIM);
    EXPECT_CLOSE("rmsnorm", gn, n1, T * DIM, 1e-5);
    free(gn);
    { /* strided: the first DIM - 8 values of each row, into rows DIM + 4 apart */
        enum { NW = DIM - 8, LY = DIM + 4 };
        float ns[T * LY];
        memset(ns, 0, sizeof ns);
        float *dns = on_gpu(ns, sizeof ns);
        cpu->rmsnorm(ns, LY, x, DIM, g, T, NW, 1e-5f);
        gpu->rmsnorm(dns, LY, dx, DIM, dg, T, NW, 1e-5f);
        gn = back(dns, T * LY);
        EXPECT_CLOSE("rmsnorm strided", gn, ns, T * LY, 1e-5);
        free(gn);
        gpu->release(dns);
    }
    /* rope, both conventions */
    int pos[T] = {0, 1, 5, 17, 100, 511, 4000};
    int *dpos = on_gpu(pos, sizeof pos);
    float freq[D / 2];
    for (int i = 0; i < D / 2; i++) freq[i] = 1.0f / powf(500000.0f, (float)(2 * i) / D) / (i % 3 + 1);
    float *dfreq = on_gpu(freq, sizeof freq);
    for (int style = 0; style < 2; style++) {
        float *q = rnd(T * H * D, st);
        float *dq = on_gpu(q, sizeof(float) * T * H * D);
        cpu->rope(q, D, q, D, pos, T, H, D, freq, 1.1f, (RopeStyle)style);
        gpu->rope(dq, D, dq, D, dpos, T, H, D, dfreq, 1.1f, (RopeStyle)style);
        float *gq = back(dq, T * H * D);
        EXPECT_CLOSE(style ? "rope rotate-half" : "rope adjacent", gq, q, T * H * D, 1e-5);
        free(gq);
        /* strided, out of place: the first RD values of each (token, head)
         * row (D apart) into rows RD + 2 apart, as the rows alone would be */
        enum { RD = D - 8, LY = RD + 2 };
        float ys[T * H * LY], alone[T * H * RD];
        memset(ys, 0, sizeof ys);
        float *dys = on_gpu(ys, sizeof ys);
        gpu->upload(dq, q, sizeof(float) * T * H * D);
        cpu->rope(ys, LY, q, D, pos, T, H, RD, freq, 1.1f, (RopeStyle)style);
        gpu->rope(dys, LY, dq, D, dpos, T, H, RD, dfreq, 1.1f, (RopeStyle)style);
        for (int r = 0; r < T * H; r++) memcpy(alone + r * RD, q + r * D, sizeof(float) * RD);
        cpu->rope(alone, RD, alone, RD, pos, T, H, RD, freq, 1.1f, (RopeStyle)style);
        size_t rows_differ = 0;
        for (int r = 0; r < T * H; r++) rows_differ += memcmp(ys + r * LY, alone + r * RD, sizeof(float) * RD) != 0;
        CHECK(rows_differ == 0, "rope strided: %zu of %d rows differ from the rows roped alone", rows_differ, T * H);
        gq = back(dys, T * H * LY);
        EXPECT_CLOSE(style ? "rope rotate-half strided" : "rope adjacent strided", gq, ys, T * H * LY, 1e-5);
        free(gq);
        free(q);
        gpu->release(dys);
        gpu->release(dq);
    }
    /* silu_mul, add */
    float *a = rnd(T * DIM, st), *b = rnd(T * DIM, st);
    float *da = on_gpu(a, sizeof(float) * T * DIM), *db = on_gpu(b, sizeof(float) * T * DIM);
    cpu->silu_mul(a, b, T * DIM);
    gpu->silu_mul(da, db, T * DIM);
    float *ga = back(da, T * DIM);
    EXPECT_CLOSE("silu_mul", ga, a, T * DIM, 1e-6);
    free(ga);
    cpu->add(a, b, T * DIM);
    gpu->add(da, db, T * DIM);
    ga = back(da, T * DIM);
    EXPECT_CLOSE("add", ga, a, T * DIM, 1e-6);
    free(ga);
    /* embedding and row gather */
    /* a rank's rows 10..39 of a vocabulary of 50: the others' tokens are
     * zeros; in fp32, and in bf16 (on the CPU grouped in 8s as it holds
     * bf16 matrices: three groups and a tail of six rows) */
    enum { ROW0 = 10, ROWS = 30 };
    int tok[T] = {13, 0, 39, 40, 10, 20, 25};
    int *dtok = on_gpu(tok, sizeof tok);
    float e1[T * DIM], want[T * DIM];
    uint16_t tb[ROWS * DIM];
    f32_to_bf16_n(tb, w + ROW0 * DIM, ROWS * DIM);
    for (int bf = 0; bf < 2; bf++) {
        for (int t = 0; t < T; t++)
            for (int c = 0; c < DIM; c++) {
                int r = tok[t] - ROW0;
                want[t * DIM + c] = r < 0 || r >= ROWS ? 0.0f : bf ? bf16_to_f32(tb[r * DIM + c]) : w[tok[t] * DIM + c];
            }
        uint16_t grouped[ROWS * DIM];
        memcpy(grouped, tb, sizeof tb);
        WeightRef table = bf ? weight_ref(grouped, DTYPE_BF16, weight_group_rows(grouped, ROWS, DIM, 2, 8))
                             : weight_ref(w + ROW0 * DIM, DTYPE_F32, 0);
        /* the GPU holds bf16 row after row (it has no gemm_row_group) */
        WeightRef dtable = gpu->gemm_weights(bf ? weight_ref(tb, DTYPE_BF16, 0) : table, ROWS * DIM);
        cpu->embedding(e1, table, ROW0, ROWS, tok, T, DIM);
        gpu->embedding(dn, dtable, ROW0, ROWS, dtok, T, DIM);
        float *ge = back(dn, T * DIM);
        EXPECT_CLOSE(bf ? "embedding bf16 grouped (CPU)" : "embedding (CPU)", e1, want, T * DIM, 0);
        EXPECT_CLOSE(bf ? "embedding bf16" : "embedding", ge, want, T * DIM, 0);
        free(ge);
        gpu->release_weights(dtable.data);
    }
    cpu->gather_rows(e1, x, (int[]){6, 2, 2}, 3, DIM);
    int *drows = on_gpu((int[]){6, 2, 2}, 3 * sizeof(int));
    gpu->gather_rows(dn, dx, drows, 3, DIM);
    float *ge = back(dn, 3 * DIM);
    EXPECT_CLOSE("gather_rows", ge, e1, 3 * DIM, 0);
    free(ge);
    /* a bias added to every row */
    cpu->add_bias(a, g, T, DIM);
    gpu->add_bias(da, dg, T, DIM);
    ga = back(da, T * DIM);
    EXPECT_CLOSE("add_bias", ga, a, T * DIM, 1e-6);
    free(ga);
    void *bufs[] = {dx, dy, dg, dn, dpos, da, db, dtok, drows, dfreq};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->release(bufs[i]);
    free(x), free(w), free(g), free(a), free(b);
}

static void attention_and_merges(uint64_t *st)
{
    enum { T = 4, H = 4, KVH = 2, D = 40, POOL = 64, B = 8 };
    int kvd = KVH * D;
    float *q = rnd(T * H * D, st), *kpool = rnd(POOL * kvd, st), *vpool = rnd(POOL * kvd, st);
    float *dq = on_gpu(q, sizeof(float) * T * H * D), *dk = on_gpu(kpool, sizeof(float) * POOL * kvd),
          *dv = on_gpu(vpool, sizeof(float) * POOL * kvd);
    /* paged: token t reads n_keys[t] keys through its block table */
    int table0[] = {5, 1, 7}, table1[] = {2, 0, 6, 3};
    int *dt0 = on_gpu(table0, sizeof table0), *dt1 = on_gpu(table1, sizeof table1);
    int n_keys[T] = {20, 0, 32, 1};
    const int *ht[T] = {table0, table0, table1, table1}, *gt[T] = {dt0, dt0, dt1, dt1};
    float out[T * H * D], lse[T * H];
    float *dout = gpu->alloc(sizeof out), *dlse = gpu->alloc(sizeof lse);
    AttnBatch a = {.T = T, .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .scale = 0.158f, .q = q, .out = out,
                   .lse = lse, .k = kpool, .v = vpool, .n_keys = n_keys, .kv_stride = kvd, .blocks = ht, .block_size = B};
    cpu->attention(&a);
    AttnBatch ga = a;
    ga.q = dq, ga.out = dout, ga.lse = dlse, ga.k = dk, ga.v = dv, ga.blocks = gt;
    gpu->attention(&ga);
    float *go = back(dout, T * H * D), *gl = back(dlse, T * H);
    EXPECT_CLOSE("attention paged", go, out, T * H * D, 1e-5);
    EXPECT_CLOSE("attention lse", gl, lse, T * H, 1e-5);
    free(go), free(gl);
    /* contiguous keys (the new part), 300 keys: several tiles */
    int many[T] = {300, 1, 129, 128};
    float *kk = rnd(300 * kvd, st), *vv = rnd(300 * kvd, st);
    float *dkk = on_gpu(kk, sizeof(float) * 300 * kvd), *dvv = on_gpu(vv, sizeof(float) * 300 * kvd);
    AttnBatch c = {.T = T, .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .scale = 0.158f, .q = q, .out = out,
                   .lse = lse, .k = kk, .v = vv, .n_keys = many, .kv_stride = kvd};
    cpu->attention(&c);
    AttnBatch gc = c;
    gc.q = dq, gc.out = dout, gc.lse = dlse, gc.k = dkk, gc.v = dvv;
    gpu->attention(&gc);
    go = back(dout, T * H * D), gl = back(dlse, T * H);
    EXPECT_CLOSE("attention rows", go, out, T * H * D, 1e-5);
    EXPECT_CLOSE("attention lse2", gl, lse, T * H, 1e-5);
    free(go), free(gl);
    /* a sliding window (first key per token), across tiles and empty */
    int first[T] = {170, 1, 0, 64};
    c.key0 = gc.key0 = first;
    cpu->attention(&c);
    gpu->attention(&gc);
    go = back(dout, T * H * D), gl = back(dlse, T * H);
    EXPECT_CLOSE("attention window", go, out, T * H * D, 1e-5);
    EXPECT_CLOSE("attention lse3", gl, lse, T * H, 1e-5);
    free(go), free(gl);
    /* each token's keys from its own first row (row0), as a step's chunks */
    int row0[T] = {0, 40, 171, 2}; /* row0 + many[t] <= 300 */
    c.row0 = gc.row0 = row0, c.key0 = gc.key0 = NULL;
    cpu->attention(&c);
    gpu->attention(&gc);
    go = back(dout, T * H * D), gl = back(dlse, T * H);
    EXPECT_CLOSE("attention from row0", go, out, T * H * D, 1e-5);
    EXPECT_CLOSE("attention lse4", gl, lse, T * H, 1e-5);
    free(go), free(gl);
    /* sharded attention (canonical key shards) */
    c.shards = gc.shards = 4, c.shard_interleave = gc.shard_interleave = 2;
    cpu->attention(&c);
    gpu->attention(&gc);
    go = back(dout, T * H * D), gl = back(dlse, T * H);
    EXPECT_CLOSE("attention over key shards", go, out, T * H * D, 1e-5);
    EXPECT_CLOSE("shards lse", gl, lse, T * H, 1e-5);
    free(go), free(gl);
    c.shards = gc.shards = 0;
    /* merge of two packed partials, one side empty for row 1 */
    int rows = T * H;
    float *parts = rnd((size_t)2 * rows * (D + 1), st), pk[T * H * (D + 1)];
    parts[(size_t)(rows + 1) * (D + 1) + D] = -INFINITY;
    float *dparts = on_gpu(parts, sizeof(float) * 2 * rows * (D + 1));
    cpu->merge_partials(parts, parts + (size_t)rows * (D + 1), rows, D, D + 1);
    gpu->merge_partials(dparts, dparts + (size_t)rows * (D + 1), rows, D, D + 1);
    go = back(dparts, rows * (D + 1));
    EXPECT_CLOSE("merge_partials", go, parts, rows * (D + 1), 1e-6);
    free(go);
    float *dpk = gpu->alloc(sizeof pk);
    cpu->pack_partials(pk, out, lse, rows, D);
    gpu->pack_partials(dpk, dout, dlse, rows, D);
    go = back(dpk, rows * (D + 1));
    EXPECT_CLOSE("pack_partials", go, pk, rows * (D + 1), 1e-6);
    free(go);
    /* kv_write through a slot mapping, -1 skipped */
    int slots[T] = {9, -1, 0, 63};
    int *dslots = on_gpu(slots, sizeof slots);
    float *knew = rnd(T * kvd, st), *vnew = rnd(T * kvd, st);
    float *dkn = on_gpu(knew, sizeof(float) * T * kvd), *dvn = on_gpu(vnew, sizeof(float) * T * kvd);
    cpu->kv_write(kpool, vpool, DTYPE_F32, knew, vnew, slots, T, kvd, KVH, B);
    gpu->kv_write(dk, dv, DTYPE_F32, dkn, dvn, dslots, T, kvd, KVH, B);
    go = back(dk, POOL * kvd);
    EXPECT_CLOSE("kv_write", go, kpool, POOL * kvd, 0);
    free(go);
    void *bufs[] = {dq, dk, dv, dt0, dt1, dout, dlse, dkk, dvv, dparts, dpk, dslots, dkn, dvn};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->release(bufs[i]);
    free(q), free(kpool), free(vpool), free(kk), free(vv), free(parts);
    free(knew), free(vnew);
}

/* The operations of DeepSeek layers: attention over latent rows (one KV
 * head, the values the first v_dim floats of each row, paged), a latent-only
 * kv_write, strided copies and the weighted scatter-add of expert outputs. */
static void mla_ops(uint64_t *st)
{
    enum { T = 3, H = 4, D = 40, DV = 32, POOL = 64, B = 8, DIM = 24 };
    float *q = rnd(T * H * D, st), *pool = rnd(POOL * D, st);
    float *dq = on_gpu(q, sizeof(float) * T * H * D), *dp = on_gpu(pool, sizeof(float) * POOL * D);
    int table[] = {3, 0, 6, 1}, *dt = on_gpu(table, sizeof table);
    int n_keys[T] = {29, 1, 0};
    const int *ht[T] = {table, table, table}, *gt[T] = {dt, dt, dt};
    float out[T * H * DV], lse[T * H];
    float *dout = gpu->alloc(sizeof out), *dlse = gpu->alloc(sizeof lse);
    AttnBatch a = {.T = T, .n_heads = H, .n_kv_heads = 1, .head_dim = D, .scale = 0.2f, .q = q, .out = out, .lse = lse,
                   .k = pool, .v = pool, .n_keys = n_keys, .kv_stride = D, .blocks = ht, .block_size = B, .v_dim = DV};
    AttnBatch ga = a;
    ga.q = dq, ga.out = dout, ga.lse = dlse, ga.k = dp, ga.v = dp, ga.blocks = gt;
    cpu->attention(&a);
    gpu->attention(&ga);
    float *go = back(dout, T * H * DV), *gl = back(dlse, T * H);
    EXPECT_CLOSE("attention over latent rows (v_dim)", go, out, T * H * DV, 1e-5);
    EXPECT_CLOSE("latent attention lse", gl, lse, T * H, 1e-5);
    free(go), free(gl);
    int slots[T] = {5, -1, 60};
    int *dslots = on_gpu(slots, sizeof slots);
    float *row = rnd(T * D, st), *drow = on_gpu(row, sizeof(float) * T * D);
    cpu->kv_write(pool, NULL, DTYPE_F32, row, NULL, slots, T, D, 1, B);
    gpu->kv_write(dp, NULL, DTYPE_F32, drow, NULL, dslots, T, D, 1, B);
    go = back(dp, POOL * D);
    EXPECT_CLOSE("kv_write, latent rows only", go, pool, POOL * D, 0);
    free(go);
    float *src = rnd(T * DIM, st), dst[T * 10], *dsrc = on_gpu(src, sizeof(float) * T * DIM);
    float *ddst = gpu->alloc(sizeof dst);
    cpu->strided_copy(dst, 10, src + 7, DIM, T, 9);
    gpu->strided_copy(ddst, 10, dsrc + 7, DIM, T, 9);
    go = back(ddst, T * 10);
    for (int r = 0; r < T; r++) go[r * 10 + 9] = dst[r * 10 + 9] = 0; /* column 9 is not written */
    EXPECT_CLOSE("strided_copy", go, dst, T * 10, 0);
    free(go);
    void *bufs[] = {dq, dp, dt, dout, dlse, dslots, drow, dsrc, ddst};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->release(bufs[i]);
    free(q), free(pool), free(row), free(src);
}

static int *back_ints(const void *d, size_t n)
{
    int *h = xmalloc(sizeof(int) * n);
    gpu->download(h, d, sizeof(int) * n);
    return h;
}

/* MLA's absorption: one GEMM per head over strided rows, in one call */
/* Elements of a and b (n floats) whose bits differ */
static size_t bits_differ(const float *a, const float *b, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, sizeof(float)) != 0;
    return d;
}

/* The GEMM is the CPU backend's arithmetic on the device (cuda/gemm.cu):
 * every format, at row counts from one to past a tile (8) and a partial
 * block of output rows, gives the CPU backend's bits, and a row the bits
 * it has alone; plain weights with a K tail (K mod 16 = 10: every other
 * row starts off a 16-byte boundary, read element by element), the
 * stored formats at their runs (FP8 128, INT4 32, FP4 16 with values or
 * codes). */
static void gemm_bits(uint64_t *st)
{
    enum { TMAX = 37, OUT = 40, KP = 586, KQ = 1024 };
    static const int rows[] = {1, 2, 8, 9, TMAX};
    float *x = rnd((size_t)TMAX * KQ, st), *w = rnd((size_t)OUT * KQ, st), *y = xmalloc(sizeof(float) * TMAX * OUT);
    float *one = xmalloc(sizeof(float) * OUT);
    float *dx = on_gpu(x, sizeof(float) * TMAX * KQ), *dy = gpu->alloc(sizeof(float) * TMAX * OUT);
    for (int f = 0; f < 6; f++) {
        static const char *names[] = {"f32", "bf16", "fp8", "int4", "fp4", "fp4 codes"};
        int in = f < 2 ? KP : KQ;
        WeightRef hw = {0}, cw, dw;
        if (f < 2) {
            CHECK(cpu->set_gemm_dtype(f ? "bfloat16" : "float32") == 0 && gpu->set_gemm_dtype(f ? "bfloat16" : "float32") == 0,
                  "GEMM type: %s", dcp_error());
            cw = cpu->gemm_weights(weight_ref(w, DTYPE_F32, 0), (size_t)OUT * in);
            dw = gpu->gemm_weights(weight_ref(w, DTYPE_F32, 0), (size_t)OUT * in);
        } else {
            DType t = f == 2 ? DTYPE_F8_E4M3 : f == 3 ? DTYPE_I4 : DTYPE_FP4;
            int run = f == 2 ? 128 : f == 3 ? 32 : 16;
            hw = f == 5 ? rnd_fp4_codes((size_t)OUT * in, run, (size_t)OUT / 4 * in / run, st)
                        : rnd_quant(t, (size_t)OUT * in, run, st);
            cw = hw;
            dw = gpu->gemm_weights(hw, (size_t)OUT * in);
        }
        for (size_t j = 0; j < sizeof rows / sizeof *rows; j++) {
            int T = rows[j];
            cpu->matmul(y, x, cw, T, in, OUT);
            gpu->matmul(dy, dx, dw, T, in, OUT);
            float *g = back(dy, (size_t)T * OUT);
            size_t d = bits_differ(g, y, (size_t)T * OUT);
            CHECK(d == 0, "matmul %s, %d rows of %d: %zu of %d elements differ from the CPU backend's bits", names[f],
                  T, in, d, T * OUT);
            for (int t = 0; t < T; t += T > 9 ? 12 : 1) { /* the row alone */
                gpu->matmul(dy, dx + (size_t)t * in, dw, 1, in, OUT);
                gpu->download(one, dy, sizeof(float) * OUT);
                d = bits_differ(one, g + (size_t)t * OUT, OUT);
                CHECK(d == 0, "matmul %s: row %d of %d alone: %zu of %d elements differ", names[f], t, T, d, OUT);
            }
            free(g);
        }
        fprintf(stderr, "matmul %s: the CPU backend's bits at 1 to %d rows\n", names[f], TMAX);
        if (f < 2) {
            cpu->release_weights(cw.data);
            gpu->release_weights(dw.data);
        } else {
            release_matrix(dw);
            free_quant(hw);
        }
    }
    cpu->set_gemm_dtype("float32"), gpu->set_gemm_dtype("float32");
    gpu->release(dx), gpu->release(dy);
    free(x), free(w), free(y), free(one);
}

static void batched_matmul(uint64_t *st)
{
    enum { T = 7, B = 5, IN = 24, OUT = 40, LDX = B * (IN + 3), LDY = B * OUT + 2 };
    float *x = rnd((size_t)T * LDX, st), *w = rnd((size_t)B * OUT * IN, st), *y = rnd((size_t)T * LDY, st);
    float *dx = on_gpu(x, sizeof(float) * T * LDX), *dy = on_gpu(y, sizeof(float) * T * LDY);
    for (int b = 0; b < 2; b++) {
        CHECK(gpu->set_gemm_dtype(b ? "bfloat16" : "float32") == 0 && cpu->set_gemm_dtype(b ? "bfloat16" : "float32") == 0,
              "GEMM type: %s", dcp_error());
        WeightRef dw = gpu->gemm_weights(weight_ref(w, DTYPE_F32, 0), (size_t)B * OUT * IN);
        WeightRef cw = cpu->gemm_weights(weight_ref(w, DTYPE_F32, 0), (size_t)B * OUT * IN);
        cpu->matmul_batched(y, LDY, OUT, x, LDX, IN + 3, cw, B, T, IN, OUT);
        gpu->matmul_batched(dy, LDY, OUT, dx, LDX, IN + 3, dw, B, T, IN, OUT);
        float *g = back(dy, (size_t)T * LDY);
        size_t d = bits_differ(g, y, (size_t)T * LDY);
        CHECK(d == 0, "matmul_batched %s: %zu of %d elements differ from the CPU backend's bits", b ? "bf16" : "f32", d,
              T * LDY);
        free(g);
        gpu->release_weights(dw.data);
        cpu->release_weights(cw.data);
    }
    gpu->set_gemm_dtype("float32"), cpu->set_gemm_dtype("float32");
    gpu->release(dx), gpu->release(dy);
    free(x), free(w), free(y);
}

/* Routing, the experts' grouped GEMM and the weighted sum, at the router
 * shapes of DeepSeek-V3 (256 experts in 8 groups, 8 per token), Kimi K2
 * (384 experts, one group) and DeepSeek-V2 (softmax, greedy) */
static void moe_ops(uint64_t *st)
{
    const struct {
        const char *name;
        MoeRouting r;
        int T;
    } cases[] = {
        {"v3 256 experts", {256, 8, 8, 4, 1, 1, 1, 2.5f}, 70},
        {"kimi 384 experts", {384, 8, 1, 1, 1, 1, 1, 2.827f}, 9},
        {"v2 softmax greedy", {64, 6, 1, 1, 0, 0, 0, 1.0f}, 33},
        {"v3 256 experts, decode of one", {256, 8, 8, 4, 1, 1, 1, 2.5f}, 1},
        {"kimi 384 experts, decode of one", {384, 8, 1, 1, 1, 1, 1, 2.827f}, 1},
    };
    enum { DIM = 96, MH = 40 };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const MoeRouting *r = &cases[k].r;
        int T = cases[k].T, E = r->experts, K = r->per_token, P = T * K;
        float *logits = rnd((size_t)T * E, st), *bias = rnd((size_t)E, st);
        for (int i = 0; i < T * E; i++) logits[i] *= 4.0f;
        if (T > 1) logits[E + 3] = logits[E + 5]; /* a tie: the lower index wins on both */
        float *dlogits = on_gpu(logits, sizeof(float) * T * E), *dbias = on_gpu(bias, sizeof(float) * E);
        int *rows = xmalloc(sizeof(int) * P), *slots = xmalloc(sizeof(int) * P), *start = xmalloc(sizeof(int) * (E + 1));
        float *wts = xmalloc(sizeof(float) * P);
        int *drows = gpu->alloc(sizeof(int) * P), *dslots = gpu->alloc(sizeof(int) * P),
            *dstart = gpu->alloc(sizeof(int) * (E + 1));
        float *dwts = gpu->alloc(sizeof(float) * P);
        const float *b = r->v3 ? bias : NULL, *db = r->v3 ? dbias : NULL;
        cpu->moe_route(r, logits, b, T, rows, wts, slots, start);
        gpu->moe_route(r, dlogits, db, T, drows, dwts, dslots, dstart);
        int *grows = back_ints(drows, P), *gslots = back_ints(dslots, P), *gstart = back_ints(dstart, E + 1);
        float *gw = back(dwts, P);
        char name[96];
        snprintf(name, sizeof name, "moe_route %s", cases[k].name);
        CHECK(!memcmp(grows, rows, sizeof(int) * P) && !memcmp(gslots, slots, sizeof(int) * P) &&
                  !memcmp(gstart, start, sizeof(int) * (E + 1)),
              "%s: the GPU chose other experts than the CPU", name);
        EXPECT_CLOSE(name, gw, wts, P, 1e-6);
        /* the GEMMs below read the CPU's grouping: a wrong one is reported
         * above, not followed by reads out of range */
        gpu->upload(drows, rows, sizeof(int) * P), gpu->upload(dslots, slots, sizeof(int) * P);
        gpu->upload(dstart, start, sizeof(int) * (E + 1)), gpu->upload(dwts, wts, sizeof(float) * P);
        /* gate-style (gathered rows, fp32 and bf16 stacks) and
         * down-style (a chunk of the rows' columns) grouped GEMMs */
        float *x = rnd((size_t)T * DIM, st), *w = rnd((size_t)E * MH * DIM, st);
        /* y2: the down-style products of both K chunks, a block each */
        float *y = xmalloc(sizeof(float) * P * MH), *y2 = xmalloc(sizeof(float) * 2 * P * DIM),
              *y1 = xmalloc(sizeof(float) * P * DIM);
        float *dx = on_gpu(x, sizeof(float) * T * DIM), *dy = gpu->alloc(sizeof(float) * P * MH),
              *dy2 = gpu->alloc(sizeof(float) * 2 * P * DIM);
        for (int bf = 0; bf < 2; bf++) {
            CHECK(gpu->set_gemm_dtype(bf ? "bfloat16" : "float32") == 0, "GEMM type: %s", dcp_error());
            WeightRef dw = gpu->gemm_weights(weight_ref(w, DTYPE_F32, 0), (size_t)E * MH * DIM);
            cpu->moe_matmul(y, x, DIM, rows, start, E, P, weight_ref(w, DTYPE_F32, 0), (size_t)MH * DIM, DIM, MH, 1);
            gpu->moe_matmul(dy, dx, DIM, drows, dstart, E, P, dw, (size_t)MH * DIM, DIM, MH, 1);
            float *g = back(dy, (size_t)P * MH);
            snprintf(name, sizeof name, "moe_matmul %s %s", bf ? "bf16" : "f32", cases[k].name);
            /* fp32: the CPU's bits (the GEMMs' arithmetic); bf16 weights
             * against the CPU's fp32 ones */
            if (bf) EXPECT_CLOSE(name, g, y, (size_t)P * MH, 5e-2);
            else CHECK(bits_differ(g, y, (size_t)P * MH) == 0, "%s differs from the CPU backend's bits", name);
            free(g);
            gpu->release_weights(dw.data);
        }
        gpu->set_gemm_dtype("float32");
        int cin = MH / 2; /* two K chunks of the pairs' hidden rows y (P, MH) */
        for (int i4 = 0; i4 < 4; i4++) { /* FP8, INT4 and FP4 stacks (FP4's scales in fp32, and as stored
                                            with a table per expert): gathered rows, and two K chunks in
                                            one call (scales stepped as weight_at steps them) */
            DType t = i4 >= 2 ? DTYPE_FP4 : i4 ? DTYPE_I4 : DTYPE_F8_E4M3;
            const char *tn = i4 == 3 ? "nvfp4 codes" : dtype_name(t);
            WeightRef q = i4 == 3 ? rnd_fp4_codes((size_t)E * MH * DIM, 4, (size_t)MH * DIM / 4, st)
                                  : rnd_quant(t, (size_t)E * MH * DIM, 4, st),
                      dq = gpu->gemm_weights(q, (size_t)E * MH * DIM);
            float *yq = xmalloc(sizeof(float) * P * DIM);
            cpu->moe_matmul(yq, x, DIM, rows, start, E, P, q, (size_t)MH * DIM, DIM, MH, 1);
            gpu->moe_matmul(dy, dx, DIM, drows, dstart, E, P, dq, (size_t)MH * DIM, DIM, MH, 1);
            float *g = back(dy, (size_t)P * MH);
            snprintf(name, sizeof name, "moe_matmul %s %s", tn, cases[k].name);
            CHECK(bits_differ(g, yq, (size_t)P * MH) == 0, "%s differs from the CPU backend's bits", name);
            free(g);
            if (i4 == 3) { /* W4A4: each expert's rows quantized with its input scale (0: none, copied) */
                float *tab = (float *)q.tables;
                for (int e = 0; e < E; e++) tab[WEIGHT_TABLE * e + WEIGHT_TABLE_ACT] = e % 3 ? 900.0f + 97.0f * e : 0;
                release_matrix(dq);
                dq = gpu->gemm_weights(q, (size_t)E * MH * DIM);
                for (int one = 0; one < 2; one++) { /* the experts' pairs; one matrix's rows in order */
                    const float *a = one ? cpu->nvfp4_act(x, DIM, NULL, NULL, 1, T, weight_at(q, MH * DIM), 0, DIM)
                                         : cpu->nvfp4_act(x, DIM, rows, start, E, P, q, (size_t)MH * DIM, DIM);
                    const float *d = one ? gpu->nvfp4_act(dx, DIM, NULL, NULL, 1, T, weight_at(dq, MH * DIM), 0, DIM)
                                         : gpu->nvfp4_act(dx, DIM, drows, dstart, E, P, dq, (size_t)MH * DIM, DIM);
                    size_t n = (size_t)(one ? T : P) * DIM;
                    g = back(d, n);
                    size_t diff = 0;
                    for (size_t i = 0; i < n; i++) diff += g[i] != a[i];
                    snprintf(name, sizeof name, "nvfp4_act %s %s", one ? "one matrix" : "experts", cases[k].name);
                    CHECK(diff == 0, "%s differs from the CPU's in %zu of %zu values", name, diff, n);
                    free(g);
                }
            }
            size_t half = (size_t)DIM * cin;
            gpu->upload(dy, yq, sizeof(float) * P * MH);
            cpu->moe_matmul(y2, yq, MH, NULL, start, E, P, q, (size_t)MH * DIM, cin, DIM, 2);
            gpu->moe_matmul(dy2, dy, MH, NULL, dstart, E, P, dq, (size_t)MH * DIM, cin, DIM, 2);
            g = back(dy2, (size_t)2 * P * DIM);
            snprintf(name, sizeof name, "moe_matmul %s chunks %s", tn, cases[k].name);
            CHECK(bits_differ(g, y2, (size_t)2 * P * DIM) == 0, "%s differs from the CPU backend's bits", name);
            /* the second chunk is the matrix from weight_at, alone */
            cpu->moe_matmul(y1, yq + cin, MH, NULL, start, E, P, weight_at(q, half), (size_t)MH * DIM, cin, DIM, 1);
            CHECK(bits_differ(y1, y2 + (size_t)P * DIM, (size_t)P * DIM) == 0,
                  "%s: chunk 1 differs from its matrix alone", name);
            free(g), free(yq);
            release_matrix(dq);
            free_quant(q);
        }
        WeightRef dw = gpu->gemm_weights(weight_ref(w, DTYPE_F32, 0), (size_t)E * MH * DIM);
        gpu->upload(dy, y, sizeof(float) * P * MH);
        cpu->moe_matmul(y2, y, MH, NULL, start, E, P, weight_ref(w, DTYPE_F32, 0), (size_t)MH * DIM, cin, DIM, 2);
        gpu->moe_matmul(dy2, dy, MH, NULL, dstart, E, P, dw, (size_t)MH * DIM, cin, DIM, 2);
        float *g = back(dy2, (size_t)2 * P * DIM);
        snprintf(name, sizeof name, "moe_matmul chunks %s", cases[k].name);
        CHECK(bits_differ(g, y2, (size_t)2 * P * DIM) == 0, "%s differs from the CPU backend's bits", name);
        free(g);
        /* the weighted sum of each token's pairs, both chunks in one call */
        float *out = xmalloc(sizeof(float) * 2 * T * DIM), *dout = gpu->alloc(sizeof(float) * 2 * T * DIM);
        gpu->upload(dy2, y2, sizeof(float) * 2 * P * DIM);
        cpu->moe_combine(out, y2, slots, wts, T, K, DIM, 2);
        gpu->moe_combine(dout, dy2, dslots, dwts, T, K, DIM, 2);
        g = back(dout, (size_t)2 * T * DIM);
        snprintf(name, sizeof name, "moe_combine %s", cases[k].name);
        EXPECT_CLOSE(name, g, out, (size_t)2 * T * DIM, 1e-6);
        free(g);
        gpu->release_weights(dw.data);
        void *bufs[] = {dlogits, dbias, drows, dslots, dstart, dwts, dx, dy, dy2, dout};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->release(bufs[i]);
        free(logits), free(bias), free(rows), free(slots), free(start), free(wts), free(grows), free(gslots);
        free(gstart), free(gw), free(x), free(w), free(y), free(y2), free(y1), free(out);
    }
}

/* ---- the shapes of real models --------------------------------------- */

/* One attention batch as models run it: T tokens of H query heads over
 * KVH KV heads of D floats (values DV wide; latent: keys only, the values
 * the first DV floats of each row, as MLA's cache), paged in blocks of B
 * rows or contiguous, over canonical key shards, in an fp32, bf16 or FP8
 * cache. */
typedef struct {
    const char *name;
    int T, H, KVH, D, DV, latent;
    int max_keys; /* the longest token's keys */
    int prefill;  /* token t attends max_keys - T + 1 + t keys (a prompt's chunk); else decode lengths */
    int B;        /* block size; 0: contiguous rows */
    int shards, interleave;
    DType kv;
    int window;   /* a sliding window of this many keys; 0: none */
} Shape;

static const Shape shapes[] = {
    {"llama 64 mha decode 4096", 4, 8, 8, 64, 0, 0, 4096, 0, 16, 1, 1, DTYPE_F32, 0},
    {"64 mha one token", 1, 4, 4, 64, 0, 0, 1, 0, 16, 2, 1, DTYPE_F32, 0},
    {"llama 64 gqa2 bf16 shards", 3, 8, 4, 64, 0, 0, 1000, 0, 16, 8, 16, DTYPE_BF16, 0},
    {"llama3 128 gqa4 4096", 2, 32, 8, 128, 0, 0, 4096, 0, 16, 4, 1, DTYPE_F32, 0},
    {"128 gqa8 bf16 window rows", 5, 8, 1, 128, 0, 0, 300, 0, 0, 2, 16, DTYPE_BF16, 100},
    {"128 gqa2 prefill 512 rows", 512, 4, 2, 128, 0, 0, 512, 1, 0, 1, 1, DTYPE_F32, 0},
    {"64 gqa4 bf16 prefill 512", 512, 8, 2, 64, 0, 0, 700, 1, 16, 8, 16, DTYPE_BF16, 0},
    {"mla 576/512 decode 4096", 4, 16, 1, 576, 512, 1, 4096, 0, 64, 8, 16, DTYPE_F32, 0},
    {"mla 576/512 128 heads bf16", 2, 128, 1, 576, 512, 1, 1000, 0, 64, 1, 1, DTYPE_BF16, 0},
    {"mla 576/512 prefill 512", 512, 16, 1, 576, 512, 1, 600, 1, 64, 4, 1, DTYPE_F32, 0},
    {"mla 576/512 one token", 1, 16, 1, 576, 512, 1, 77, 0, 64, 8, 16, DTYPE_BF16, 0},
    {"mla 576/512 128 heads one token", 1, 128, 1, 576, 512, 1, 1024, 0, 64, 8, 1, DTYPE_BF16, 0},
    {"mla 576/512 128 heads one token 4096", 1, 128, 1, 576, 512, 1, 4096, 0, 64, 1, 1, DTYPE_BF16, 0},
    {"mla 576/512 20 heads", 3, 20, 1, 576, 512, 1, 257, 0, 16, 2, 16, DTYPE_BF16, 0},
    {"latent 192/128 bf16", 7, 16, 1, 192, 128, 1, 2000, 0, 16, 2, 1, DTYPE_BF16, 0},
    {"mla fresh prompt rows", 256, 16, 1, 576, 512, 1, 256, 1, 0, 8, 16, DTYPE_F32, 0},
    {"llama3 128 gqa4 fp8 shards", 3, 32, 8, 128, 0, 0, 2000, 0, 16, 4, 16, DTYPE_F8_E4M3, 0},
    {"64 gqa4 fp8 window prefill", 300, 8, 2, 64, 0, 0, 400, 1, 16, 2, 1, DTYPE_F8_E4M3, 50},
    {"mla 576/512 fp8 shards", 4, 16, 1, 576, 512, 1, 3000, 0, 64, 8, 16, DTYPE_F8_E4M3, 0},
    {"mla fp8 rows", 5, 16, 1, 576, 512, 1, 300, 0, 0, 2, 1, DTYPE_F8_E4M3, 0},
    {"320 gqa2 above the grouped kernel's rows", 3, 4, 2, 320, 0, 0, 700, 0, 16, 2, 1, DTYPE_F32, 0},
    {"128 gqa 32 heads on one KV head, 1500 keys", 2, 32, 1, 128, 0, 0, 1500, 0, 16, 1, 1, DTYPE_BF16, 0},
};

/* rows (n, width) of kv as a cache of type t holds them */
static void *as_cache(const float *x, size_t n, DType t)
{
    if (t == DTYPE_F32) {
        float *c = xmalloc(sizeof(float) * n);
        memcpy(c, x, sizeof(float) * n);
        return c;
    }
    if (t == DTYPE_F8_E4M3) {
        uint8_t *c = xmalloc(n);
        for (size_t i = 0; i < n; i++) c[i] = f32_to_f8e4m3(x[i]);
        return c;
    }
    uint16_t *c = xmalloc(sizeof(uint16_t) * n);
    f32_to_bf16_n(c, x, n);
    return c;
}

static void attention_shape(const Shape *sh, uint64_t *st)
{
    int T = sh->T, H = sh->H, D = sh->D, DV = sh->DV ? sh->DV : D, kvd = sh->KVH * D, N = sh->max_keys;
    size_t esz = dtype_bytes(sh->kv);
    int *n_keys = xmalloc(sizeof(int) * T), *key0 = xmalloc(sizeof(int) * T), *row0 = xcalloc(T, sizeof(int));
    for (int t = 0; t < T; t++) {
        n_keys[t] = sh->prefill ? N - T + 1 + t : t == 0 ? N : t == 1 ? 1 : 1 + (int)(splitmix64(st) % (uint64_t)N);
        key0[t] = sh->window && n_keys[t] > sh->window ? n_keys[t] - sh->window : 0;
    }
    float *q = rnd((size_t)T * H * D, st), *kx = rnd((size_t)N * kvd, st), *vx = rnd((size_t)N * kvd, st);
    for (size_t i = 0; i < (size_t)T * H * D; i++) q[i] *= 3.0f; /* scores spread over several units */
    float *dq = on_gpu(q, sizeof(float) * T * H * D);
    /* the cache: paged, filled by kv_write through a shuffled block table
     * (and compared), or contiguous rows uploaded as the cache holds them */
    void *kc, *vc, *dk, *dv;
    int *table = NULL, *dtable = NULL, nb = sh->B ? (N + sh->B - 1) / sh->B : 0, pool_blocks = nb + 3;
    const int **ht = xcalloc(T, sizeof *ht), **gt = xcalloc(T, sizeof *gt);
    if (sh->B) {
        size_t pool = (size_t)pool_blocks * sh->B * kvd;
        kc = xcalloc(pool, esz), vc = sh->latent ? NULL : xcalloc(pool, esz);
        dk = on_gpu(kc, pool * esz), dv = sh->latent ? NULL : on_gpu(vc, pool * esz);
        table = xmalloc(sizeof(int) * pool_blocks);
        for (int i = 0; i < pool_blocks; i++) table[i] = i;
        for (int i = pool_blocks - 1; i > 0; i--) {
            int j = (int)(splitmix64(st) % (uint64_t)(i + 1)), x = table[i];
            table[i] = table[j], table[j] = x;
        }
        dtable = on_gpu(table, sizeof(int) * nb);
        int *slots = xmalloc(sizeof(int) * N);
        for (int j = 0; j < N; j++) slots[j] = table[j / sh->B] * sh->B + j % sh->B;
        int *dslots = on_gpu(slots, sizeof(int) * N);
        float *dkx = on_gpu(kx, sizeof(float) * N * kvd), *dvx = on_gpu(vx, sizeof(float) * N * kvd);
        cpu->kv_write(kc, vc, sh->kv, kx, sh->latent ? NULL : vx, slots, N, kvd, sh->KVH, sh->B);
        gpu->kv_write(dk, dv, sh->kv, dkx, sh->latent ? NULL : dvx, dslots, N, kvd, sh->KVH, sh->B);
        char name[96];
        snprintf(name, sizeof name, "%s: kv_write", sh->name);
        void *got = xmalloc(pool * esz);
        gpu->download(got, dk, pool * esz);
        CHECK(!memcmp(got, kc, pool * esz), "%s: the GPU's cache rows differ from the CPU's", name);
        if (vc) {
            gpu->download(got, dv, pool * esz);
            CHECK(!memcmp(got, vc, pool * esz), "%s: the GPU's value rows differ from the CPU's", name);
        }
        free(got), free(slots);
        gpu->release(dslots), gpu->release(dkx), gpu->release(dvx);
        for (int t = 0; t < T; t++) ht[t] = table, gt[t] = dtable;
    } else {
        kc = as_cache(kx, (size_t)N * kvd, sh->kv), vc = sh->latent ? NULL : as_cache(vx, (size_t)N * kvd, sh->kv);
        dk = on_gpu(kc, (size_t)N * kvd * esz), dv = vc ? on_gpu(vc, (size_t)N * kvd * esz) : NULL;
    }
    size_t no = (size_t)T * H * DV;
    float *out = xmalloc(sizeof(float) * no), *lse = xmalloc(sizeof(float) * T * H);
    float *dout = gpu->alloc(sizeof(float) * no), *dlse = gpu->alloc(sizeof(float) * T * H);
    AttnBatch a = {.T = T, .n_heads = H, .n_kv_heads = sh->KVH, .head_dim = D, .scale = 1.0f / sqrtf((float)D),
                   .q = q, .out = out, .lse = lse, .k = kc, .v = sh->latent ? kc : vc, .n_keys = n_keys,
                   .key0 = sh->window ? key0 : NULL, .kv_stride = kvd, .blocks = sh->B ? ht : NULL,
                   .block_size = sh->B, .v_dim = sh->DV, .kv_dtype = sh->kv, .row0 = sh->B ? NULL : row0,
                   .shards = sh->shards, .shard_interleave = sh->interleave};
    AttnBatch ga = a;
    ga.q = dq, ga.out = dout, ga.lse = dlse, ga.k = dk, ga.v = sh->latent ? dk : dv, ga.blocks = sh->B ? gt : NULL;
    cpu->attention(&a);
    gpu->attention(&ga);
    float *go = back(dout, no), *gl = back(dlse, (size_t)T * H);
    char name[96];
    snprintf(name, sizeof name, "%s: out", sh->name);
    EXPECT_CLOSE(name, go, out, no, 2e-5);
    snprintf(name, sizeof name, "%s: lse", sh->name);
    EXPECT_CLOSE(name, gl, lse, (size_t)T * H, 2e-5);
    /* split-KV: the same bits when every block folds its splits (no
     * partials' memory for a block per split), and for token 0 alone */
    float *dout2 = gpu->alloc(sizeof(float) * no), *dlse2 = gpu->alloc(sizeof(float) * T * H);
    AttnBatch fa = ga;
    fa.out = dout2, fa.lse = dlse2;
    setenv("DCPINFER_CUDA_SPLIT_BYTES", "0", 1);
    gpu->attention(&fa);
    unsetenv("DCPINFER_CUDA_SPLIT_BYTES");
    float *fo = back(dout2, no), *fl = back(dlse2, (size_t)T * H);
    CHECK(bits_differ(fo, go, no) == 0 && bits_differ(fl, gl, (size_t)T * H) == 0,
          "%s: folding the splits in the kernel differs from a block per split in %zu outputs, %zu LSEs", sh->name,
          bits_differ(fo, go, no), bits_differ(fl, gl, (size_t)T * H));
    free(fo), free(fl);
    AttnBatch one = ga;
    one.T = 1, one.out = dout2, one.lse = dlse2;
    gpu->attention(&one);
    fo = back(dout2, (size_t)H * DV), fl = back(dlse2, (size_t)H);
    CHECK(bits_differ(fo, go, (size_t)H * DV) == 0 && bits_differ(fl, gl, (size_t)H) == 0,
          "%s: token 0 alone differs from token 0 in the batch", sh->name);
    free(fo), free(fl);
    gpu->release(dout2), gpu->release(dlse2);
    /* the DCP merge of two partials of this width: this batch's and its
     * rows reversed (packed as the merges pack them) */
    int rows = T * H;
    float *pk = xmalloc(sizeof(float) * 2 * rows * (DV + 1)), *dpk = gpu->alloc(sizeof(float) * 2 * rows * (DV + 1));
    cpu->pack_partials(pk, out, lse, rows, DV);
    gpu->pack_partials(dpk, dout, dlse, rows, DV);
    for (int r = 0; r < rows; r++)
        memcpy(pk + (size_t)(rows + r) * (DV + 1), pk + (size_t)(rows - 1 - r) * (DV + 1), sizeof(float) * (DV + 1));
    gpu->upload(dpk + (size_t)rows * (DV + 1), pk + (size_t)rows * (DV + 1), sizeof(float) * rows * (DV + 1));
    cpu->merge_partials(pk, pk + (size_t)rows * (DV + 1), rows, DV, DV + 1);
    gpu->merge_partials(dpk, dpk + (size_t)rows * (DV + 1), rows, DV, DV + 1);
    free(go);
    go = back(dpk, (size_t)rows * (DV + 1));
    snprintf(name, sizeof name, "%s: merge", sh->name);
    EXPECT_CLOSE(name, go, pk, (size_t)rows * (DV + 1), 2e-5);
    free(go), free(gl), free(pk), free(out), free(lse), free(q), free(kx), free(vx), free(kc), free(vc), free(table);
    free(n_keys), free(key0), free(row0), free(ht), free(gt);
    void *bufs[] = {dq, dk, dv, dtable, dout, dlse, dpk};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) gpu->release(bufs[i]);
}

/* The element-wise ops and GEMMs at the widths of real models */
static void wide_ops(uint64_t *st)
{
    enum { T = 17, DIM = 7168, IN = 2048, OUT = 576, H = 32, HD = 128 };
    float *x = rnd((size_t)T * DIM, st), *w = rnd(DIM, st), *y = xmalloc(sizeof(float) * T * DIM);
    float *dx = on_gpu(x, sizeof(float) * T * DIM), *dw = on_gpu(w, sizeof(float) * DIM),
          *dy = gpu->alloc(sizeof(float) * T * DIM);
    cpu->rmsnorm(y, DIM, x, DIM, w, T, DIM, 1e-6f);
    gpu->rmsnorm(dy, DIM, dx, DIM, dw, T, DIM, 1e-6f);
    float *g = back(dy, (size_t)T * DIM);
    EXPECT_CLOSE("rmsnorm 7168", g, y, (size_t)T * DIM, 1e-5);
    free(g);
    int pos[T];
    for (int t = 0; t < T; t++) pos[t] = (int)(splitmix64(st) % 65536);
    int *dpos = on_gpu(pos, sizeof pos);
    for (int hd = 64; hd <= HD; hd *= 2) {
        float freq[HD / 2];
        for (int i = 0; i < hd / 2; i++) freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / hd);
        float *dfreq = on_gpu(freq, sizeof(float) * hd / 2);
        memcpy(y, x, sizeof(float) * T * H * hd);
        gpu->upload(dy, x, sizeof(float) * T * H * hd);
        cpu->rope(y, hd, y, hd, pos, T, H, hd, freq, 1.0f, ROPE_ADJACENT_PAIRS);
        gpu->rope(dy, hd, dy, hd, dpos, T, H, hd, dfreq, 1.0f, ROPE_ADJACENT_PAIRS);
        g = back(dy, (size_t)T * H * hd);
        EXPECT_CLOSE(hd == 64 ? "rope 64, 32 heads" : "rope 128, 32 heads", g, y, (size_t)T * H * hd, 2e-5);
        free(g);
        gpu->release(dfreq);
    }
    float *wm = rnd((size_t)OUT * IN, st);
    for (int b = 0; b < 2; b++) {
        CHECK(gpu->set_gemm_dtype(b ? "bfloat16" : "float32") == 0, "GEMM type: %s", dcp_error());
        WeightRef dwm = gpu->gemm_weights(weight_ref(wm, DTYPE_F32, 0), (size_t)OUT * IN);
        cpu->matmul(y, x, weight_ref(wm, DTYPE_F32, 0), T, IN, OUT);
        gpu->matmul(dy, dx, dwm, T, IN, OUT);
        g = back(dy, (size_t)T * OUT);
        /* fp32: the order of 2048 products; bf16: weights and activations rounded */
        EXPECT_CLOSE(b ? "matmul 2048x576 bf16" : "matmul 2048x576 f32", g, y, (size_t)T * OUT, b ? 0.3 : 1e-4);
        free(g);
        gpu->release_weights(dwm.data);
    }
    gpu->set_gemm_dtype("float32");
    /* FP8 as stored (DeepSeek's 128-column scale runs) and INT4 (groups of
     * 32, Kimi K2's experts), prefill and decode */
    for (int i4 = 0; i4 < 4; i4++) { /* the last: FP4 with its scales as stored, a table per 144 rows */
        DType t = i4 >= 2 ? DTYPE_FP4 : i4 ? DTYPE_I4 : DTYPE_F8_E4M3;
        int run = i4 >= 2 ? 16 : i4 ? 32 : 128;
        WeightRef q = i4 == 3 ? rnd_fp4_codes((size_t)OUT * IN, run, (size_t)OUT / 4 * IN / run, st)
                              : rnd_quant(t, (size_t)OUT * IN, run, st),
                  dq = gpu->gemm_weights(q, (size_t)OUT * IN);
        CHECK(dq.dtype == t && !dq.scale == !q.scale && !dq.scale8 == !q.scale8 && dq.qcols == run &&
                  dq.qflags == q.qflags && dq.table_runs == q.table_runs,
              "quantized weights changed type on the device");
        static const int rows[] = {T, 5, 1}; /* prefill (widened for cuBLAS), decode of a few and of one */
        for (int j = 0; j < 3; j++) {
            int tk = rows[j];
            char name[64];
            cpu->matmul(y, x, q, tk, IN, OUT);
            gpu->matmul(dy, dx, dq, tk, IN, OUT);
            g = back(dy, (size_t)tk * OUT);
            snprintf(name, sizeof name, "matmul 2048x576 %s%s, %d row(s)", dtype_name(t), i4 == 3 ? " codes" : "", tk);
            EXPECT_CLOSE(name, g, y, (size_t)tk * OUT, 1e-4);
            free(g);
        }
        release_matrix(dq);
        free_quant(q);
    }
    void *bufs[] = {dx, dy, dpos};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) gpu->release(bufs[i]);
    free(x), free(w), free(y), free(wm);
}

/* What the device does per MoE layer and per MLA layer, by the backend's
 * op counters, on the DeepSeek-V3 test model: a MoE block's routing,
 * grouped GEMMs and weighted sum make no host round-trip (no upload,
 * download or wait) and give the CPU's output; the absorption is one
 * batched GEMM per matrix per layer. */
static void device_step_counts(void)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/data/deepseek/v3_yarn", getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : "..");
    Model m;
    if (!CHECK_OK(model_load(&m, dir, 1, 0) == 0, "%s: %s", dir, dcp_error())) return;
    const Config *c = &m.cfg;
    int l = 0;
    while (l < c->n_layers && !MOE_LAYER(c, l)) l++;
    enum { T = 19 };
    int dim = c->dim, chunks = m.shard.chunks;
    uint64_t st = 77;
    float *x = rnd((size_t)T * dim, &st), *want = xmalloc(sizeof(float) * chunks * T * dim);
    for (int b = 0; b < 2; b++) {
        const Backend *be = b ? gpu : cpu;
        Timings tm = {0};
        LayerEnv env = {.model = &m, .be = be, .tm = &tm, .parts = be->alloc(sizeof(float) * chunks * T * dim)};
        Uploads u = {0};
        MoeWeights w = {0};
        MoeScratch sc = {0};
        moe_load(&env, &u, &m.w.mla[l].moe, &w);
        moe_reserve(&env, &sc, T);
        float *dx = be->alloc(sizeof(float) * T * dim);
        be->upload(dx, x, sizeof(float) * T * dim);
        BackendCounts before = be->counts ? *be->counts : (BackendCounts){0};
        moe_forward(&env, &w, &sc, env.parts, dx, T);
        if (b) {
            const BackendCounts *after = be->counts;
            long trips = after->uploads + after->downloads + after->synchronizes - before.uploads - before.downloads -
                         before.synchronizes;
            fprintf(stderr, "MoE layer %d, %d tokens: %ld host round-trips, %ld grouped GEMMs\n", l, T, trips,
                    after->moe_matmuls - before.moe_matmuls);
            CHECK(trips == 0, "the MoE layer made %ld uploads, downloads or waits", trips);
            CHECK(after->moe_matmuls - before.moe_matmuls == 3,
                  "%ld grouped GEMMs, expected 3 (gate, up, and down's %d K chunks in one)",
                  after->moe_matmuls - before.moe_matmuls, chunks);
            float *got = xmalloc(sizeof(float) * chunks * T * dim);
            be->download(got, env.parts, sizeof(float) * chunks * T * dim);
            EXPECT_CLOSE("MoE layer", got, want, (size_t)chunks * T * dim, 1e-5);
            free(got);
        } else {
            memcpy(want, env.parts, sizeof(float) * chunks * T * dim);
        }
        moe_free_scratch(&env, &sc);
        moe_free(&w);
        uploads_release(&env, &u);
        be->release(dx), be->release(env.parts);
    }
    free(x), free(want);

    /* a whole prompt and one token on the device: one forward step per
     * layer call, and per MLA layer two batched GEMMs (W_uk, W_uv) and,
     * with K chunks, one per row-parallel product (o_proj, and the dense
     * down projection or the shared experts'), all chunks at once */
    char path[4200];
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    int prompt[1024], n = read_ids(path, prompt, 1024);
    RequestSet rs = {0};
    add_request(&rs, prompt, n, 4, 0.0f, 1.0f, 0);
    Timings tm = {0};
    Engine e;
    engine_init(&e, &m, gpu, NULL, NULL, &tm, NULL);
    GenOptions go = {.max_model_len = c->max_seq_len, .max_num_seqs = 4, .max_batched_tokens = 4096};
    GenStats gs = {0};
    Result res;
    BackendCounts c0 = *gpu->counts;
    generate(&e, &rs, &res, &go, &gs);
    long batched = gpu->counts->batched_matmuls - c0.batched_matmuls;
    fprintf(stderr, "%d forward steps over %d layers: %ld batched GEMMs, %ld uploads, %ld downloads\n", gs.n_steps,
            c->n_layers, batched, gpu->counts->uploads - c0.uploads, gpu->counts->downloads - c0.downloads);
    long per_layer = 2 + (m.shard.chunks > 1 ? 2 : 0);
    CHECK(gs.n_steps > 0 && batched == per_layer * c->n_layers * gs.n_steps,
          "%ld batched GEMMs in %d steps of %d layers: expected %ld per layer", batched, gs.n_steps, c->n_layers,
          per_layer);
    results_free(&res, 1);
    free(gs.steps);
    engine_free(&e);
    requests_free(&rs);
    model_free(&m);
}

/* The logits of a test model's whole prompt on the device, within the
 * bound test_hf_reference holds the CPU to: 1e-4 of transformers' (relative
 * to the row's largest logit). */
static void logits_against_transformers(const char *name)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tests/data/%s", getenv("DCP_SRCDIR") ? getenv("DCP_SRCDIR") : "..", name);
    snprintf(path, sizeof path, "%s/prompt.txt", dir);
    int prompt[1024], n = read_ids(path, prompt, 1024);
    Model m;
    if (!CHECK_OK(n > 0 && model_load(&m, dir, 1, 0) == 0, "%s: %s", name, dcp_error())) return;
    int vocab = m.cfg.vocab_size;
    float *ref = read_ref_logits(dir, n, vocab);
    RequestSet rs = {0};
    add_request(&rs, prompt, n, 1, 0.0f, 1.0f, 0);
    PromptLogits cap = {xcalloc((size_t)(n + 1) * vocab, sizeof(float)), vocab};
    Timings tm = {0};
    Engine e;
    engine_init(&e, &m, gpu, NULL, NULL, &tm, NULL);
    GenOptions go = {.max_model_len = m.cfg.max_seq_len, .max_num_seqs = 4, .max_batched_tokens = 4096,
                     .on_logits = capture_prompt_logits, .on_logits_ctx = &cap};
    Result res;
    generate(&e, &rs, &res, &go, NULL);
    double worst = 0;
    for (int p = 0; p < n; p++) {
        const float *a = cap.logits + (size_t)p * vocab, *b = ref + (size_t)p * vocab;
        double big = 0, d = 0;
        for (int v = 0; v < vocab; v++) {
            big = fmax(big, fabs(b[v]));
            d = fmax(d, fabs((double)a[v] - b[v]));
        }
        worst = fmax(worst, d / (big > 0 ? big : 1));
    }
    fprintf(stderr, "%-16s on the device: max |logit - transformers| / max |logit| = %.2g over %d positions\n", name,
            worst, n);
    CHECK(worst <= 1e-4, "%s: the device's logits differ from transformers' by %g (relative)", name, worst);
    results_free(&res, 1);
    engine_free(&e);
    requests_free(&rs);
    model_free(&m);
    free(cap.logits), free(ref);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    cpu = backend_cpu();
    gpu = backend_cuda();
    if (!gpu) {
        fprintf(stderr, "no CUDA backend: %s; skipped\n", dcp_error());
        MPI_Finalize();
        return TEST_SKIP;
    }
    uint64_t st = 2026;
    elementwise(&st);
    attention_and_merges(&st);
    mla_ops(&st);
    wide_ops(&st);
    gemm_bits(&st);
    batched_matmul(&st);
    moe_ops(&st);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) attention_shape(&shapes[i], &st);
    /* whole models only on ops that passed: a broken op (a mutant's) is
     * reported above, not followed into a model's reads out of range */
    if (test_failures) {
        fprintf(stderr, "the ops failed: the whole-model checks are skipped\n");
    } else {
        device_step_counts();
        const char *refs[] = {"hf/llama3",       "hf/qwen3_qk_norm", "hf/mistral_window",
                              "deepseek/v3_yarn", "deepseek/v2_softmax", "deepseek/v3_fp8",
                              "deepseek/v3_int4", "deepseek/v3_nvfp4", "deepseek/v3_nvfp4_modelopt"};
        for (size_t i = 0; i < sizeof refs / sizeof *refs; i++) logits_against_transformers(refs[i]);
    }
    MPI_Finalize();
    return test_finish("test_backends");
}
