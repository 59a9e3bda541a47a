/* The CPU backend's ops against direct formulas: attention split into a
 * context and a new part and merged by LSE equals attention over all keys;
 * empty sides contribute nothing; the two RoPE conventions agree under the
 * row permutation that relates them; partitions cover their range; the
 * attention kernel is its defined arithmetic to the bit. */
#include <float.h>

#include "backend.h"
#include "fmath.h"
#include "kernels_cpu.h"
#include "model.h"
#include "sampler.h"
#include "testutil.h"

static float frand(uint64_t *s) { return (float)((splitmix64(s) >> 40) / 16777216.0) * 2.0f - 1.0f; }

static void test_attention_split(const Backend *be)
{
    enum { T = 3, H = 4, KVH = 2, D = 8, N = 13 };
    uint64_t s = 42;
    float q[T * H * D], k[N * KVH * D], v[N * KVH * D];
    for (int i = 0; i < T * H * D; i++) q[i] = frand(&s);
    for (int i = 0; i < N * KVH * D; i++) k[i] = frand(&s), v[i] = frand(&s);
    /* token t attends to keys [0, n[t]); context holds [0, split), new [split, n) */
    int n_all[T] = {13, 5, 1}, split[T] = {6, 5, 0};
    int nk[T], r0[T];
    float full[T * H * D], lse_full[T * H], ctx[T * H * D], lse_ctx[T * H], nw[T * H * D], lse_nw[T * H];
    for (int t = 0; t < T; t++) r0[t] = 0, nk[t] = n_all[t];
    AttnBatch a = {.T = T, .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .scale = 0.35f, .q = q, .out = full,
                   .lse = lse_full, .k = k, .v = v, .n_keys = nk, .kv_stride = KVH * D, .row0 = r0};
    be->attention(&a);
    for (int t = 0; t < T; t++) nk[t] = split[t];
    a.out = ctx, a.lse = lse_ctx;
    be->attention(&a);
    for (int t = 0; t < T; t++)
        r0[t] = split[t], nk[t] = n_all[t] - split[t];
    a.out = nw, a.lse = lse_nw;
    be->attention(&a);
    CHECK(isinf(lse_nw[1 * H]) && lse_nw[1 * H] < 0 && nw[1 * H * D] == 0.0f, "empty side: lse -inf, out 0");
    /* a sliding window: keys before key0 are left out, which equals
     * attending to the keys from key0 on */
    {
        int first[T] = {4, 5, 0};
        float win[T * H * D], lse_win[T * H], shifted[T * H * D], lse_shifted[T * H];
        for (int t = 0; t < T; t++) r0[t] = 0, nk[t] = n_all[t];
        a.key0 = first, a.out = win, a.lse = lse_win;
        be->attention(&a);
        for (int t = 0; t < T; t++)
            r0[t] = first[t], nk[t] = n_all[t] - first[t];
        a.key0 = NULL, a.out = shifted, a.lse = lse_shifted;
        be->attention(&a);
        double w = 0;
        for (int i = 0; i < T * H * D; i++) w = fmax(w, fabs(win[i] - shifted[i]));
        for (int i = 0; i < T * H; i++) w = fmax(w, isinf(lse_win[i]) && isinf(lse_shifted[i]) ? 0 : fabs(lse_win[i] - lse_shifted[i]));
        CHECK(w == 0 && isinf(lse_win[1 * H]), "sliding window (key0) differs from shifted keys by %g", w);
        for (int t = 0; t < T; t++)
            r0[t] = split[t], nk[t] = n_all[t] - split[t];
    }
    CHECK(isinf(lse_ctx[2 * H]) && lse_ctx[2 * H] < 0, "empty context: lse -inf");
    {
        float pc[T * H * (D + 1)], pn[T * H * (D + 1)];
        be->pack_partials(pc, ctx, lse_ctx, T * H, D);
        be->pack_partials(pn, nw, lse_nw, T * H, D);
        be->merge_partials(pc, pn, T * H, D, D + 1);
        for (int i = 0; i < T * H; i++) {
            memcpy(ctx + i * D, pc + i * (D + 1), sizeof(float) * D);
            lse_ctx[i] = pc[i * (D + 1) + D];
        }
        /* the merge is symmetric, bit for bit (the canonical tree's nodes
         * may be computed on either side) */
        be->pack_partials(pc, ctx, lse_ctx, T * H, D);
        float pa[T * H * (D + 1)], pb[T * H * (D + 1)];
        uint64_t s2 = 9;
        for (int i = 0; i < T * H * (D + 1); i++) pa[i] = frand(&s2), pb[i] = frand(&s2);
        pb[D] = -INFINITY;
        float ab[T * H * (D + 1)], ba[T * H * (D + 1)];
        memcpy(ab, pa, sizeof pa);
        memcpy(ba, pb, sizeof pb);
        be->merge_partials(ab, pb, T * H, D, D + 1);
        be->merge_partials(ba, pa, T * H, D, D + 1);
        CHECK(!memcmp(ab, ba, sizeof ab), "merge_partials is not symmetric bit for bit");
    }
    double worst = 0;
    for (int i = 0; i < T * H * D; i++) worst = fmax(worst, fabs(ctx[i] - full[i]));
    for (int i = 0; i < T * H; i++) worst = fmax(worst, fabs(lse_ctx[i] - lse_full[i]));
    CHECK(worst < 1e-5, "split attention differs by %g", worst);

    /* a direct softmax for token 0, head 3 (KV head 1) */
    double m = -1e30, sum = 0, o[D] = {0};
    double sc[N];
    for (int j = 0; j < N; j++) {
        double d = 0;
        for (int x = 0; x < D; x++) d += q[(0 * H + 3) * D + x] * k[(j * KVH + 1) * D + x];
        sc[j] = d * 0.35;
        m = fmax(m, sc[j]);
    }
    for (int j = 0; j < N; j++) {
        double p = exp(sc[j] - m);
        sum += p;
        for (int x = 0; x < D; x++) o[x] += p * v[(j * KVH + 1) * D + x];
    }
    worst = fabs(lse_full[3] - (m + log(sum)));
    for (int x = 0; x < D; x++) worst = fmax(worst, fabs(full[3 * D + x] - o[x] / sum));
    CHECK(worst < 1e-5, "attention vs direct softmax: %g", worst);
}

/* the attention kernel (kernels_cpu.inc's attend) against its defined
 * arithmetic written plainly: every score a dot product in 16 lane chains
 * over k, added by the fixed tree, then the rest in order; times scale;
 * m the maximum (16 lane maxima from j0, by the same tree, then the rest
 * in order); p_j = exp(s_j - m) by the kernels' exp (below); their sum in
 * 16 lane chains from j0, by the tree, then the rest in order; every
 * output lane chains over j in order; out = o x (1 / sum); lse = m +
 * logf(sum). Bit for bit, on every instruction set this CPU has, fp32 and
 * bf16 KV, paged and not, for calls that read whole rows (all KV heads),
 * whole rows said to be warm, and calls that read a part of each row (one
 * KV head each, as threads split a token's heads): the kernel reads them
 * in different orders; up to five tokens of a sequence in one call (a
 * prefill chunk's, or any keys each) against each token alone; one to
 * eight query heads per KV head */
static float plain_tree(const float *a, int max)
{
    float h[8], g[4], f[2];
    for (int i = 0; i < 8; i++) h[i] = max ? (a[i] > a[i + 8] ? a[i] : a[i + 8]) : a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) g[i] = max ? (h[i] > h[i + 4] ? h[i] : h[i + 4]) : h[i] + h[i + 4];
    for (int i = 0; i < 2; i++) f[i] = max ? (g[i] > g[i + 2] ? g[i] : g[i + 2]) : g[i] + g[i + 2];
    return max ? (f[0] > f[1] ? f[0] : f[1]) : f[0] + f[1];
}
static float plain_dot(const float *x, const float *w, int K)
{
    float a[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int l = 0; l < 16; l++) a[l] = fmaf(x[k + l], w[k + l], a[l]);
    float s = plain_tree(a, 0);
    for (; k < K; k++) s = fmaf(x[k], w[k], s);
    return s;
}
/* the kernels' exp: x clamped to [-104, 89], x = k ln 2 + r, k = x / ln 2
 * rounded to nearest, e^r by Cephes's polynomial, times 2^k as 2^(k >> 1)
 * 2^(k - (k >> 1)) */
static float plain_exp(float x)
{
    if (isnan(x)) return x;
    if (x < -104.0f) x = -104.0f;
    if (x > 89.0f) x = 89.0f;
    float kf = fmaf(x, 0x1.715476p+0f, 0x1.8p23f) - 0x1.8p23f;
    float r = fmaf(kf, -0.693359375f, x);
    r = fmaf(kf, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int k = (int)kf, k1 = k >= 0 ? k / 2 : -((1 - k) / 2); /* floor(k / 2) */
    return p * ldexpf(1.0f, k1) * ldexpf(1.0f, k - k1);
}
static void plain_attend(float *out, float *lse, const float *q, const float *k, const float *v, const size_t *row,
                         size_t hs, int j0, int n, int D, int Dv, int H, int group, float scale)
{
    float p[96];
    for (int h = 0; h < H; h++) {
        size_t at = (size_t)(h / group) * hs;
        float *o = out + (size_t)h * Dv, lane[16];
        for (int j = j0; j < n; j++) p[j] = plain_dot(q + (size_t)h * D, k + row[j] + at, D) * scale;
        int j16 = j0 + (n - j0) / 16 * 16, j;
        for (int l = 0; l < 16; l++) lane[l] = -INFINITY;
        for (j = j0; j < j16; j++) lane[(j - j0) % 16] = p[j] > lane[(j - j0) % 16] ? p[j] : lane[(j - j0) % 16];
        float m = plain_tree(lane, 1);
        for (; j < n; j++) m = p[j] > m ? p[j] : m;
        for (j = j0; j < n; j++) p[j] = plain_exp(p[j] - m);
        for (int l = 0; l < 16; l++) lane[l] = 0.0f;
        for (j = j0; j < j16; j++) lane[(j - j0) % 16] += p[j];
        float sum = plain_tree(lane, 0);
        for (; j < n; j++) sum += p[j];
        for (int d = 0; d < Dv; d++) {
            float a = 0.0f;
            for (j = j0; j < n; j++) a = fmaf(p[j], v[row[j] + at + d], a);
            o[d] = a * (1.0f / sum);
        }
        lse[h] = m + logf(sum);
    }
}
/* Attention over canonical key shards (AttnBatch.shards) is, bit for
 * bit, each shard's keys attended alone (gathered into rows of their own)
 * and the shards merged by the tree: shard g with g + G/2, then g + G/4.
 * Paged and not, with a sliding window, interleaves 1 and 3. */
static void test_attention_shards(const Backend *be)
{
    enum { T = 4, H = 4, KVH = 2, D = 8, N = 29, G = 4, B = 4 };
    uint64_t s = 7;
    float q[T * H * D], k[N * KVH * D], v[N * KVH * D];
    for (int i = 0; i < T * H * D; i++) q[i] = frand(&s);
    for (int i = 0; i < N * KVH * D; i++) k[i] = frand(&s), v[i] = frand(&s);
    int n_all[T] = {29, 1, 6, 17}, first[T] = {3, 0, 0, 9};
    for (int run = 1; run <= 3; run += 2)
        for (int window = 0; window < 2; window++)
            for (int paged = 0; paged < 2; paged++) {
                /* the sharded call */
                float out[T * H * D], lse[T * H];
                int nk[T], r0[T] = {0};
                memcpy(nk, n_all, sizeof nk);
                /* paged: KV head-major blocks of B keys in a pool, the table reversed */
                enum { NB = (N + B - 1) / B };
                float kp[NB * B * KVH * D], vp[NB * B * KVH * D];
                int table[NB];
                const int *tables[T];
                for (int b = 0; b < NB; b++) table[b] = NB - 1 - b;
                for (int j = 0; j < N; j++)
                    for (int g = 0; g < KVH; g++)
                        for (int x = 0; x < D; x++) {
                            size_t at = ((size_t)table[j / B] * KVH * B + (size_t)g * B + j % B) * D + x;
                            kp[at] = k[(j * KVH + g) * D + x];
                            vp[at] = v[(j * KVH + g) * D + x];
                        }
                for (int t = 0; t < T; t++) tables[t] = table;
                AttnBatch a = {.T = T, .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .scale = 0.3f, .q = q,
                               .out = out, .lse = lse, .k = paged ? (const void *)kp : k, .v = paged ? (const void *)vp : v,
                               .n_keys = nk, .key0 = window ? first : NULL, .kv_stride = KVH * D,
                               .row0 = paged ? NULL : r0, .blocks = paged ? tables : NULL, .block_size = B,
                               .shards = G, .shard_interleave = run};
                be->attention(&a);
                /* each shard's keys gathered, attended unsharded, packed */
                float part[G][T * H * (D + 1)];
                for (int g = 0; g < G; g++) {
                    float ks[N * KVH * D], vs[N * KVH * D], o[T * H * D], l[T * H];
                    int m = 0, cnt[T], f0[T];
                    for (int j = 0; j < N; j++)
                        if ((j / run) % G == g) {
                            memcpy(ks + m * KVH * D, k + j * KVH * D, sizeof(float) * KVH * D);
                            memcpy(vs + m * KVH * D, v + j * KVH * D, sizeof(float) * KVH * D);
                            m++;
                        }
                    for (int t = 0; t < T; t++) {
                        cnt[t] = f0[t] = 0;
                        for (int j = 0; j < n_all[t]; j++)
                            if ((j / run) % G == g) {
                                cnt[t]++;
                                if (window && j < first[t]) f0[t]++;
                            }
                    }
                    for (int t = 0; t < T; t++) {
                        /* a token with no keys in the shard: LSE -inf */
                        int one[1] = {cnt[t]}, z[1] = {0}, k0[1] = {f0[t]};
                        AttnBatch b = {.T = 1, .n_heads = H, .n_kv_heads = KVH, .head_dim = D, .scale = 0.3f,
                                       .q = q + t * H * D, .out = o + t * H * D, .lse = l + t * H, .k = ks, .v = vs,
                                       .n_keys = one, .key0 = k0, .kv_stride = KVH * D, .row0 = z};
                        if (cnt[t] > f0[t]) be->attention(&b);
                        else
                            for (int h = 0; h < H; h++) {
                                memset(o + (t * H + h) * D, 0, sizeof(float) * D);
                                l[t * H + h] = -INFINITY;
                            }
                    }
                    be->pack_partials(part[g], o, l, T * H, D);
                }
                for (int half = G / 2; half >= 1; half /= 2)
                    for (int g = 0; g < half; g++) be->merge_partials(part[g], part[g + half], T * H, D, D + 1);
                int same = 1;
                for (int i = 0; i < T * H; i++) {
                    same &= !memcmp(out + i * D, part[0] + i * (D + 1), sizeof(float) * D);
                    same &= !memcmp(&lse[i], &part[0][i * (D + 1) + D], sizeof(float));
                }
                CHECK(same, "sharded attention (interleave %d, window %d, paged %d) is not its shards merged by the tree",
                      run, window, paged);
            }
}

static void test_attend_defined(void)
{
    static const char *const isa_names[] = {"generic", "avx2", "avx512"};
    /* rows: blocks of 5 or 16 keys, enough of them for NMAX keys */
    enum { NMAX = 96, ROWS = 112, NBMAX = 20, KVH = 4, DMAX = 80, HMAX = 32, RMAX = 5 };
    static float k[ROWS * KVH * DMAX], v[ROWS * KVH * DMAX], kr[ROWS * KVH * DMAX], vr[ROWS * KVH * DMAX];
    static uint16_t kb[ROWS * KVH * DMAX], vb[ROWS * KVH * DMAX];
    static float q[RMAX * HMAX * DMAX], want[RMAX * HMAX * DMAX], got[RMAX * HMAX * DMAX];
    float want_lse[RMAX * HMAX], got_lse[RMAX * HMAX];
    float *scratch = xmalloc(attend_scratch_bytes(NMAX, RMAX * HMAX));
    int table[NBMAX], j0[RMAX], n[RMAX];
    size_t row[NMAX];
    uint64_t s = 11;
    int calls = 0, wrong = 0;
    for (int i = 0; i < ROWS * KVH * DMAX; i++) {
        k[i] = frand(&s), v[i] = frand(&s);
        kb[i] = f32_to_bf16(k[i]), vb[i] = f32_to_bf16(v[i]);
    }
    for (int ii = 0; ii < 3; ii++) {
        if (cpu_set_isa(isa_names[ii])) continue;
        for (int rep = 0; rep < 90; rep++) {
            int kvh = 1 + rep % KVH, group = (int[]){1, 2, 3, 4, 5, 8}[rep / 4 % 6], H = kvh * group;
            int D = (int[]){16, 64, 80, 24}[rep % 4];
            int Dv = rep % 5 == 4 ? D / 2 : D, paged = rep % 2, bf = rep / 2 % 2, R = 1 + rep % 7 % RMAX;
            /* paged: blocks of 5 or 16 keys, out of order, each holding its
             * keys KV head by KV head, as the CPU backend's pools do, or key
             * by key; the last 30: decode over blocks of 16 (runs of 16 keys) */
            int B = rep / 2 % 3 == 0 ? 16 : 5, hm = paged && rep % 8 != 1;
            if (rep >= 60) {
                paged = hm = 1, B = 16, R = 1, bf = rep / 4 % 2;
                group = (int[]){1, 2, 4, 5, 8}[rep / 8 % 5], H = kvh * group;
            }
            int nb = NMAX / B + 1;
            for (int i = 0; i < nb; i++) table[i] = (i * 3 + 2) % nb;
            /* R tokens of one sequence: as a prefill chunk's (one more key
             * each) or any keys (a window, DCP shards) */
            int n0 = 1 + (int)(splitmix64(&s) % (NMAX - RMAX));
            for (int r = 0; r < R; r++) {
                n[r] = rep % 3 == 1 ? 1 + (int)(splitmix64(&s) % NMAX) : n0 + r;
                j0[r] = rep % 3 == 2 ? (int)(splitmix64(&s) % (uint64_t)n[r]) : 0;
            }
            size_t stride = (size_t)kvh * D, hs = hm ? (size_t)B * D : (size_t)D;
            for (int i = 0; i < R * H * D; i++) q[i] = 2.0f * frand(&s);
            for (int j = 0; j < NMAX; j++)
                row[j] = hm      ? ((size_t)table[j / B] * kvh * B + (size_t)(j % B)) * D
                         : paged ? ((size_t)table[j / B] * B + (size_t)(j % B)) * stride
                                 : (size_t)j * stride;
            const float *kk = k, *vv = v;
            if (bf) { /* the reference reads the bf16 values as floats */
                for (size_t i = 0; i < (size_t)ROWS * stride; i++)
                    kr[i] = bf16_to_f32(kb[i]), vr[i] = bf16_to_f32(vb[i]);
                kk = kr, vv = vr;
            }
            float scale = 1.0f / sqrtf((float)D);
            for (int r = 0; r < R; r++)
                plain_attend(want + (size_t)r * H * Dv, want_lse + r * H, q + (size_t)r * H * D, kk, vv, row, hs,
                             j0[r], n[r], D, Dv, H, group, scale);
            AttendFn attend = cpu_attend(bf ? DTYPE_BF16 : DTYPE_F32);
            size_t es = bf ? 2 : 4;
            const char *kbase = bf ? (const char *)kb : (const char *)k, *vbase = bf ? (const char *)vb : (const char *)v;
            for (int way = 0; way < 4; way++) { /* whole rows; whole and warm; split by KV head; token by token */
                int parts = way == 2 ? kvh : 1, tokens = way == 3 ? R : 1;
                for (int part = 0; part < parts; part++) /* KV heads [part, part + kvh / parts) */
                    for (int t = 0; t < tokens; t++) {
                        int g0 = part * (kvh / parts), Hp = kvh / parts * group;
                        size_t r0 = (size_t)t * H + (size_t)g0 * group;
                        AttendRows ar = {.R = tokens == 1 ? R : 1, .H = Hp, .group = group, .D = D, .Dv = Dv,
                                         .j0 = j0 + t, .n = n + t, .q = q + r0 * D, .out = got + r0 * Dv,
                                         .lse = got_lse + r0, .q_stride = (size_t)H * D, .out_stride = (size_t)H * Dv,
                                         .lse_stride = (size_t)H, .k = kbase + (size_t)g0 * hs * es,
                                         .v = vbase + (size_t)g0 * hs * es, .table = paged ? table : NULL, .B = B,
                                         .stride = hm ? (size_t)D : stride, .head_stride = hs,
                                         .block_stride = (size_t)B * stride, .scale = scale, .scratch = scratch,
                                         .warm = way == 1};
                        attend(&ar);
                    }
                calls++;
                wrong += memcmp(got, want, sizeof(float) * R * H * Dv) || memcmp(got_lse, want_lse, sizeof(float) * R * H);
            }
        }
    }
    free(scratch);
    CHECK(calls >= 480, "attention kernel checks ran: %d", calls);
    CHECK(!wrong, "attention kernel differs from its defined arithmetic in %d of %d calls", wrong, calls);
    CHECK(!cpu_set_isa("auto"), "auto");
}

/* the kernels' exp (plain_exp, which the kernel check above holds them
 * to) against exp in double over [-104, 0], where the softmax calls it:
 * every 509th float (2.2 million), within 1.02 ulp (every float: at most
 * 1.01, measured once) */
static void test_exp_accuracy(void)
{
    double worst = 0, at = 0;
    long checked = 0;
    for (uint32_t b = 0x80000000u; b <= 0xc2d00000u; b += 509) { /* -0 .. -104 */
        float x, got;
        memcpy(&x, &b, sizeof x);
        got = plain_exp(x);
        double want = exp((double)x), w = fabs(want) < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(want) - 23);
        double e = fabs(got - want) / w;
        if (e > worst) worst = e, at = x;
        checked++;
    }
    CHECK(checked > 2000000 && worst <= 1.02, "exp: %.3f ulp at %a (%ld floats)", worst, at, checked);
    CHECK(plain_exp(-104.0f) == 0.0f && plain_exp(0.0f) == 1.0f && isnan(plain_exp(NAN)) &&
              plain_exp(-INFINITY) == 0.0f && isinf(plain_exp(100.0f)),
          "exp at its ends");
}

/* fmath.h, the GPU kernels' functions (and the CPU attention's exp):
 * dcp_expf is plain_exp bit for bit; dcp_logf against log in double over
 * every 4099th positive float, within 1 ulp; dcp_sincosf against sin and
 * cos in double at RoPE's angles (to 2^20 radians), within 2 units of
 * 2^-24 (an ulp of 1) */
#define LOG_ULP 1.0      /* measured: 0.746 */
#define SINCOS_UNITS 2.0 /* measured: 1.559 */
static void test_fmath(void)
{
    long differ = 0, n = 0;
    for (uint32_t b = 0; b < 0xffffffffu - 4099; b += 4099) {
        float x;
        memcpy(&x, &b, sizeof x);
        float a = dcp_expf(x), e = plain_exp(x);
        differ += isnan(x) ? !isnan(a) : memcmp(&a, &e, sizeof a) != 0, n++;
    }
    CHECK(differ == 0, "dcp_expf differs from the kernels' exp at %ld of %ld floats", differ, n);
    double worst = 0, at = 0;
    for (uint32_t b = 1; b < 0x7f800000u; b += 4099) {
        float x;
        memcpy(&x, &b, sizeof x);
        double want = log((double)x), got = dcp_logf(x);
        double u = want == 0 ? 0x1p-149 : ldexp(1.0, ilogb(want) - 23), e = fabs(got - want) / u;
        if (e > worst) worst = e, at = x;
    }
    fprintf(stderr, "dcp_logf: at most %.3f ulp (at %a)\n", worst, at);
    CHECK(worst <= LOG_ULP, "dcp_logf: %.3f ulp at %a", worst, at);
    CHECK(dcp_logf(1.0f) == 0.0f && dcp_logf(0.0f) == -INFINITY && isnan(dcp_logf(-1.0f)) &&
              isinf(dcp_logf(INFINITY)) && isnan(dcp_logf(NAN)),
          "dcp_logf at its ends");
    worst = 0, at = 0;
    for (double x = -0x1p20; x <= 0x1p20; x += 0.3183098861837907 * 3.7) {
        float s, c, xf = (float)x;
        dcp_sincosf(xf, &s, &c);
        double e = fmax(fabs(s - sin((double)xf)), fabs(c - cos((double)xf))) * 0x1p24;
        if (e > worst) worst = e, at = xf;
    }
    fprintf(stderr, "dcp_sincosf: at most %.3f units of 2^-24 (at %a)\n", worst, at);
    CHECK(worst <= SINCOS_UNITS, "dcp_sincosf: %.3f units of 2^-24 at %a", worst, at);
}

static void test_rope(const Backend *be)
{
    enum { D = 8, H = 2 };
    uint64_t s = 7;
    float adj[H * D], half[H * D];
    /* half-layout index j*D/2 + i holds adjacent-layout index 2i + j */
    for (int h = 0; h < H; h++)
        for (int i = 0; i < D / 2; i++)
            for (int j = 0; j < 2; j++) {
                float x = frand(&s);
                adj[h * D + 2 * i + j] = x;
                half[h * D + j * D / 2 + i] = x;
            }
    int pos[1] = {37};
    float freq[D / 2];
    for (int i = 0; i < D / 2; i++) freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / D);
    be->rope(adj, D, adj, D, pos, 1, H, D, freq, 1.0f, ROPE_ADJACENT_PAIRS);
    be->rope(half, D, half, D, pos, 1, H, D, freq, 1.0f, ROPE_ROTATE_HALF);
    double worst = 0;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < D / 2; i++)
            for (int j = 0; j < 2; j++) worst = fmax(worst, fabs(adj[h * D + 2 * i + j] - half[h * D + j * D / 2 + i]));
    CHECK(worst < 1e-6, "RoPE conventions disagree by %g", worst);
    /* position 0 is the identity */
    float x[D] = {1, 2, 3, 4, 5, 6, 7, 8}, y[D];
    memcpy(y, x, sizeof x);
    pos[0] = 0;
    be->rope(y, D, y, D, pos, 1, 1, D, freq, 1.0f, ROPE_ROTATE_HALF);
    CHECK(!memcmp(x, y, sizeof x), "RoPE at position 0 changes the vector");
    /* the cos/sin scale multiplies the rotated vector */
    float z[D];
    memcpy(y, x, sizeof x);
    memcpy(z, x, sizeof x);
    pos[0] = 9;
    be->rope(y, D, y, D, pos, 1, 1, D, freq, 1.0f, ROPE_ROTATE_HALF);
    be->rope(z, D, z, D, pos, 1, 1, D, freq, 1.25f, ROPE_ROTATE_HALF);
    worst = 0;
    for (int i = 0; i < D; i++) worst = fmax(worst, fabs(z[i] - 1.25f * y[i]));
    CHECK(worst < 1e-5, "RoPE scale: %g", worst);
}

static void test_matmul_rmsnorm(const Backend *be)
{
    float x[2 * 3] = {1, 2, 3, -1, 0, 2}, w[2 * 3] = {1, 0, 1, 0.5f, -1, 2}, y[4];
    be->matmul(y, x, weight_ref(w, DTYPE_F32, 0), 2, 3, 2);
    CHECK(y[0] == 4 && y[1] == 4.5f && y[2] == 1 && y[3] == 3.5f, "matmul %g %g %g %g", y[0], y[1], y[2], y[3]);
    float g[3] = {1, 2, 0.5f}, r[3];
    be->rmsnorm(r, 3, x, 3, g, 1, 3, 0.0f);
    float inv = 1.0f / sqrtf(14.0f / 3.0f);
    CHECK(fabsf(r[0] - inv) < 1e-6f && fabsf(r[1] - 4 * inv) < 1e-6f && fabsf(r[2] - 1.5f * inv) < 1e-6f, "rmsnorm");
    /* rows apart: x's 2 rows of 3 into rows of 4, the fourth left alone */
    float r2[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    be->rmsnorm(r2, 4, x, 3, g, 2, 3, 0.0f);
    float inv2 = 1.0f / sqrtf(5.0f / 3.0f);
    CHECK(fabsf(r2[0] - inv) < 1e-6f && fabsf(r2[4] + inv2) < 1e-6f && r2[5] == 0.0f &&
              fabsf(r2[6] - inv2) < 1e-6f && r2[3] == 9 && r2[7] == 9,
          "rmsnorm with strides: %g %g %g %g", r2[4], r2[5], r2[6], r2[7]);
}

static void test_partition(void)
{
    int n[] = {172, 8, 7, 512, 1};
    for (size_t c = 0; c < sizeof n / sizeof *n; c++) {
        int next = 0, lo = 1 << 30, hi = 0;
        for (int i = 0; i < 8; i++) {
            int st, cnt;
            balanced_part(n[c], 8, i, &st, &cnt);
            CHECK(st == next, "part %d of %d starts at %d, expected %d", i, n[c], st, next);
            next = st + cnt;
            lo = cnt < lo ? cnt : lo;
            hi = cnt > hi ? cnt : hi;
        }
        CHECK(next == n[c] && hi - lo <= 1, "partition of %d: end %d, sizes %d..%d", n[c], next, lo, hi);
    }
}

/* the vocabulary scans against their definitions, plain scans: rows of
 * every length around the lanes' width and a vocabulary's, with ties, both
 * zeros, infinities and NaNs */
static void test_vocab_scans(void)
{
    uint64_t s = 7;
    static float x[32003];
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 2.0f, -FLT_MAX};
    int wrong_max = 0, wrong_finite = 0, rows = 0;
    for (int n = 1; n <= 32003; n = n < 70 ? n + 1 : n * 3 + 1) {
        for (int rep = 0; rep < 40; rep++, rows++) {
            for (int i = 0; i < n; i++) x[i] = (float)(int)(frand(&s) * 3); /* -2 .. 2: many ties */
            int specials = rep % 8; /* 0: none; the rest place up to 7 */
            for (int k = 0; k < specials; k++)
                x[splitmix64(&s) % (uint64_t)n] = special[(rep / 8 + k) % 7];
            int best = 0, finite = 1;
            for (int i = 1; i < n; i++)
                if (x[i] > x[best]) best = i;
            for (int i = 0; i < n; i++) finite &= isfinite(x[i]) != 0;
            wrong_max += argmax_f32(x, n) != best;
            wrong_finite += logits_finite(x, n) != finite;
        }
    }
    CHECK(!wrong_max, "argmax_f32 differs from a plain scan in %d of %d rows", wrong_max, rows);
    CHECK(!wrong_finite, "logits_finite differs from isfinite in %d of %d rows", wrong_finite, rows);
}

static void test_sampler(void)
{
    float l[5] = {1, 3, 3, 0, -1};
    CHECK(argmax_f32(l, 5) == 1, "argmax tie goes to the lowest index");
    char scratch[5 * 16];
    int first[40], again[40];
    for (int rep = 0; rep < 2; rep++) {
        Sampler s;
        sampler_init(&s, 0.8f, 0.9f, 99);
        for (int i = 0; i < 40; i++) {
            float x[5] = {1, 3, 2.5f, 0, -1};
            (rep ? again : first)[i] = sampler_sample(&s, x, 5, scratch);
        }
    }
    CHECK(!memcmp(first, again, sizeof first), "same seed, same samples");
    int seen[5] = {0};
    for (int i = 0; i < 40; i++) seen[first[i]]++;
    CHECK(seen[1] > 0 && seen[2] > 0 && seen[4] == 0, "top-p 0.9 keeps 1 and 2, drops 4 (%d %d %d)", seen[1],
          seen[2], seen[4]);
}

/* llama2.c's top-p written plainly (qsort of the candidates, largest
 * first, equal ones lower index first): sampler_sample must choose the
 * same token from the same logits and coin, with 151,936 logits flat
 * (nearly all candidates), peaked, and with many equal values. */
typedef struct {
    float p;
    int i;
} PlainPI;
static int plain_desc(const void *a, const void *b)
{
    const PlainPI *x = a, *y = b;
    return x->p > y->p ? -1 : x->p < y->p ? 1 : x->i - y->i;
}
static int plain_top_p(const float *probs, int n, float top_p, float coin, PlainPI *pi)
{
    float cutoff = (1.0f - top_p) / (float)(n - 1), cum = 0.0f, cdf = 0.0f;
    int m = 0, last;
    for (int i = 0; i < n; i++)
        if (probs[i] >= cutoff) pi[m++] = (PlainPI){probs[i], i};
    qsort(pi, (size_t)m, sizeof *pi, plain_desc);
    for (last = 0; last < m; last++)
        if ((cum += pi[last].p) > top_p) break;
    if (last == m) last = m - 1;
    for (int i = 0; i <= last; i++)
        if (coin * cum < (cdf += pi[i].p)) return pi[i].i;
    return pi[last].i;
}

static void test_top_p_reference(void)
{
    enum { N = 151936, DRAWS = 24 };
    float *logits = xmalloc(sizeof(float) * N), *x = xmalloc(sizeof(float) * N), *probs = xmalloc(sizeof(float) * N);
    PlainPI *pi = xmalloc(sizeof(PlainPI) * N);
    void *scratch = xmalloc(sampler_scratch_bytes(N));
    uint64_t st = 77;
    double t_new = 0, t_plain = 0;
    int wrong = 0, draws = 0;
    for (int shape = 0; shape < 3; shape++) {
        for (int i = 0; i < N; i++) {
            double u = (double)(splitmix64(&st) >> 11) / 9007199254740992.0;
            /* flat: every token near the others; peaked: a few dominate;
             * ties: values from a handful of levels */
            logits[i] = shape == 0 ? (float)(0.5 * u) : shape == 1 ? (float)(30.0 * u * u * u * u) : (float)(int)(u * 4);
        }
        const float top_ps[] = {0.9f, 0.5f, 0.999f};
        for (int d = 0; d < DRAWS; d++, draws++) {
            Sampler s;
            sampler_init(&s, 1.3f, top_ps[d % 3], 1000 + (uint64_t)d);
            uint64_t rng = s.rng;
            memcpy(x, logits, sizeof(float) * N);
            double t0 = now_s();
            int got = sampler_sample(&s, x, N, scratch);
            t_new += now_s() - t0;
            /* the same softmax and coin as the sampler's */
            memcpy(probs, logits, sizeof(float) * N);
            Sampler ref;
            sampler_init(&ref, 1.3f, 1.0f, 1);
            ref.rng = rng;
            int full = sampler_sample(&ref, probs, N, scratch); /* top_p 1: probs now softmaxed, coin drawn */
            (void)full;
            uint64_t r2 = rng;
            r2 ^= r2 >> 12, r2 ^= r2 << 25, r2 ^= r2 >> 27;
            float coin = (float)((uint32_t)((r2 * 0x2545F4914F6CDD1Dull) >> 32) >> 8) / 16777216.0f;
            t0 = now_s();
            int want = plain_top_p(probs, N, top_ps[d % 3], coin, pi);
            t_plain += now_s() - t0;
            wrong += got != want;
        }
    }
    CHECK(!wrong, "top-p differs from the plain qsort definition in %d of %d draws", wrong, draws);
    fprintf(stderr, "top-p over %d logits: %.2f ms a draw (the plain qsort: %.2f ms)\n", N, 1e3 * t_new / draws,
            1e3 * t_plain / draws);
    free(logits), free(x), free(probs), free(pi), free(scratch);
}

static void test_half_floats(void)
{
    CHECK(bf16_to_f32(f32_to_bf16(1.5f)) == 1.5f, "bf16 round trip");
    CHECK(bf16_to_f32(0x3f80) == 1.0f && bf16_to_f32(0xc000) == -2.0f, "bf16 values");
    CHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0xc000) == -2.0f && f16_to_f32(0x0001) == ldexpf(1, -24),
          "f16 values incl. subnormal");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const Backend *be = backend_cpu();
    test_attention_split(be);
    test_attention_shards(be);
    test_attend_defined();
    test_exp_accuracy();
    test_fmath();
    test_rope(be);
    test_matmul_rmsnorm(be);
    test_partition();
    test_vocab_scans();
    test_sampler();
    test_top_p_reference();
    test_half_floats();
    MPI_Finalize();
    return test_finish("test_ops");
}
