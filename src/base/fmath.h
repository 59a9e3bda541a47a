/* The CUDA backend's exp, log, sin and cos: defined by additions,
 * multiplications, fused multiply-adds and bit operations only, so that a
 * GPU and the HIP-CPU build (which runs the same kernels on the host, in
 * CI) compute the same bits, where CUDA's expf/logf/sinf/cosf and a host
 * libm's differ in the last bit. The CPU backend keeps the C library's
 * (its results are checked against llama2.c's, which uses them).
 * Accuracy: about 1 ulp over the ranges the kernels use. The CPU
 * backend's attention uses dcp_expf too, in vector lanes. */
#ifndef DCP_FMATH_H
#define DCP_FMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DCP_MATH_FN __host__ __device__ static inline
#else
#define DCP_MATH_FN static inline
#endif

DCP_MATH_FN float dcp_bits_float(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}
DCP_MATH_FN uint32_t dcp_float_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

/* e^x, the same bits on every instruction set and with every libm: x
 * clamped to [-104, 89] (NaN kept; e^-104 rounds to 0, e^89 to infinity),
 * x = k ln 2 + r with k = x log2(e) rounded to nearest (the 1.5 x 2^23
 * trick) and r by two FMAs (ln 2 in two parts), e^r by Cephes's polynomial
 * (Horner, FMAs), times 2^k as two factors (so that a result below 2^-126
 * is rounded once). On [-104, 0] (every float, against exp in double): at
 * most 1.01 ulp from e^x, 14 of 1.12e9 floats above 1 ulp, 99.2% the bits
 * of glibc's expf. The CPU's attention (kernels_cpu.c) computes it in
 * vector lanes by the same operations and constants. */
#define EXP_LO -104.0f
#define EXP_HI 89.0f
#define EXP_MAGIC 0x1.8p23f
#define EXP_LOG2E 0x1.715476p+0f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f
DCP_MATH_FN float dcp_expf(float x)
{
    x = x < EXP_LO ? EXP_LO : x > EXP_HI ? EXP_HI : x;
    float t = fmaf(x, EXP_LOG2E, EXP_MAGIC), kf = t - EXP_MAGIC;
    float r = fmaf(kf, -EXP_LN2_LO, fmaf(kf, -EXP_LN2_HI, x));
    float p = fmaf(fmaf(fmaf(fmaf(fmaf(EXP_P0, r, EXP_P1), r, EXP_P2), r, EXP_P3), r, EXP_P4), r, EXP_P5);
    p = fmaf(p, r * r, r) + 1.0f;
    /* k >> 1: floor(k / 2), as the vector shifts */
    int32_t k = (int32_t)(dcp_float_bits(t) - dcp_float_bits(EXP_MAGIC)), k1 = k >> 1, k2 = k - k1;
    return p * dcp_bits_float((uint32_t)(k1 + 127) << 23) * dcp_bits_float((uint32_t)(k2 + 127) << 23);
}

/* ln x: x = 2^e m with m in [sqrt(1/2), sqrt(2)), ln(m) by Cephes's logf
 * polynomial in f = m - 1, plus e ln 2 in two parts; 0 gives -inf, a
 * negative x or NaN gives NaN, inf gives inf; subnormals are scaled first */
DCP_MATH_FN float dcp_logf(float x)
{
    if (!(x > 0.0f)) return x == 0.0f ? -INFINITY : NAN;
    if (x == INFINITY) return x;
    int e = 0;
    if (x < 0x1p-126f) x *= 0x1p23f, e = -23;
    uint32_t b = dcp_float_bits(x);
    e += (int)(b >> 23) - 126;
    float m = dcp_bits_float((b & 0x007fffffu) | 0x3f000000u); /* [0.5, 1) */
    float f;
    if (m < 0.707106781186547524f) e -= 1, f = m + m - 1.0f;
    else f = m - 1.0f;
    float z = f * f;
    float y = fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(7.0376836292e-2f, f, -1.1514610310e-1f), f, 1.1676998740e-1f), f,
                                               -1.2420140846e-1f),
                                          f, 1.4249322787e-1f),
                                     f, -1.6668057665e-1f),
                                f, 2.0000714765e-1f),
                           f, -2.4999993993e-1f),
                      f, 3.3333331174e-1f) *
              f * z;
    float ef = (float)e;
    y = fmaf(ef, -2.12194440e-4f, y);
    y = fmaf(z, -0.5f, y);
    return fmaf(ef, 0.693359375f, f + y);
}

/* sin x and cos x: x reduced by pi/2 in double precision (k = the nearest
 * integer to x 2/pi, r = x - k pi/2 with pi/2 in two parts), exact enough
 * for RoPE's angles (positions times frequencies, below 2^24); sin and cos
 * of r on [-pi/4, pi/4] by Cephes's sinf/cosf polynomials, swapped and
 * signed by k's quadrant */
DCP_MATH_FN void dcp_sincosf(float x, float *s, float *c)
{
    double a = x, k = rint(a * 0.63661977236758134308);
    float r = (float)(a - k * 1.5707963267948966 - k * 6.123233995736766e-17), z = r * r;
    float sr = fmaf(fmaf(fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f), z, -1.6666654611e-1f), z * r, r);
    float cr = fmaf(fmaf(fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f), z, 4.166664568298827e-2f), z * z,
                    fmaf(-0.5f, z, 1.0f));
    long long q = (long long)k & 3;
    *s = q == 0 ? sr : q == 1 ? cr : q == 2 ? -sr : -cr;
    *c = q == 0 ? cr : q == 1 ? -sr : q == 2 ? -cr : sr;
}

#endif
