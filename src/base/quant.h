/* The stored formats' elements to fp32 (exactly) and back (rounded), in
 * one definition for the host, the CPU kernels and the CUDA kernels. */
#ifndef DCP_QUANT_H
#define DCP_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DCP_QUANT_FN __host__ __device__ static inline
#else
#define DCP_QUANT_FN static inline
#endif

/* FP8 E4M3, the "fn" variant (no infinities; 0x7F and 0xFF are NaN):
 * exponent and mantissa moved to fp32's positions read as the value times
 * 2^-120 (bias 7 against 127; an E4M3 subnormal becomes an fp32
 * subnormal, which the CPU and the GPU keep unless told to flush them,
 * and dcpinfer is never built so), and times 2^120 is exact. The SIMD
 * widening in kernels_cpu.c is the same arithmetic. */
DCP_QUANT_FN float f8e4m3_to_f32(uint8_t b)
{
    uint32_t u = (uint32_t)(b & 0x7f) << 20;
    float f;
    memcpy(&f, &u, sizeof f);
    f *= 0x1p120f;
    if ((b & 0x7f) == 0x7f) { /* NaN */
        u = 0x7fc00000u;
        memcpy(&f, &u, sizeof f);
    }
    return b & 0x80 ? -f : f;
}

/* Element i of compressed-tensors' packed INT4 (two per byte, the low
 * nibble first, each the value plus 8): -8 .. 7 */
DCP_QUANT_FN float i4_value(const uint8_t *p, size_t i)
{
    return (float)((int)((p[i / 2] >> (4 * (i % 2))) & 15) - 8);
}

/* Element i of packed FP4 E2M1 (two per byte, the low nibble first): bit
 * 3 the sign, bits 0-2 the magnitude 0, 0.5, 1, 1.5, 2, 3, 4 or 6 */
DCP_QUANT_FN float fp4_value(const uint8_t *p, size_t i)
{
    unsigned v = (p[i / 2] >> (4 * (i % 2))) & 15, e = (v >> 1) & 3, mant = v & 1;
    float a = e ? (float)(1u << (e - 1)) * (mant ? 1.5f : 1.0f) : 0.5f * (float)mant;
    return v & 8 ? -a : a;
}

/* A quantized element's value v times its scale s, rounded once to fp32,
 * then to bf16 (nearest even) when round_bf16: what a checkpoint whose
 * scales are bf16 dequantizes to (compressed-tensors multiplies in the
 * scale's type). Products of finite values only. */
DCP_QUANT_FN float scaled_value(float v, float s, int round_bf16)
{
    float x = v * s;
    if (round_bf16) {
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        u = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
        memcpy(&x, &u, sizeof x);
    }
    return x;
}

/* A stored scale s with its matrix's global scale applied: divided by div
 * when div is not 0 (compressed-tensors' NVFP4), else times mul (ModelOpt's
 * NVFP4; 1 for INT4) */
DCP_QUANT_FN float global_scaled(float s, float mul, float div) { return div != 0 ? s / div : s * mul; }

/* x to FP8 E4M3, rounded to nearest even, saturating at +-448 (the
 * largest finite value, as vLLM's FP8 quantization clamps); NaN stays NaN.
 * Normal results: the fp32 mantissa rounded from 23 to 3 bits and the
 * exponent rebiased (a carry moves to the next binade by itself);
 * magnitudes under 2^-6: E4M3's subnormals, multiples of 2^-9. */
DCP_QUANT_FN uint8_t f32_to_f8e4m3(float x)
{
    uint32_t u, a;
    memcpy(&u, &x, sizeof u);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7f; /* NaN */
    if (a >= 0x43e00000u) return sign | 0x7e; /* 448 and above (infinity too) */
    if (a < 0x3c800000u) { /* below 2^-6: m / 8 * 2^-6, m = |x| * 2^9 rounded to even; 8 is 2^-6's code */
        float f;
        memcpy(&f, &a, sizeof f);
        return sign | (uint8_t)rintf(f * 512.0f);
    }
    a += 0x7ffffu + ((a >> 20) & 1); /* to nearest, ties to the even mantissa */
    uint32_t code = (a >> 20) - ((127u - 7u) << 3);
    return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

/* x to the nearest FP4 E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
 * negatives), ties to the even code, saturating at +-6: the boundaries of
 * compressed-tensors' cast_to_fp4 (0.25 goes to 0, 0.75 to 1, 2.5 to 2,
 * 5 to 4). */
DCP_QUANT_FN float fp4_round(float x)
{
    float a = fabsf(x), r;
    if (a <= 0.25f) r = 0.0f;
    else if (a < 0.75f) r = 0.5f;
    else if (a <= 1.25f) r = 1.0f;
    else if (a < 1.75f) r = 1.5f;
    else if (a <= 2.5f) r = 2.0f;
    else if (a < 3.5f) r = 3.0f;
    else if (a <= 5.0f) r = 4.0f;
    else r = 6.0f;
    return x < 0 ? -r : r;
}

/* NVFP4 activations: the 16 values of one group of a row (x, into y; may
 * be the same) quantized to FP4 and back, as compressed-tensors' dynamic
 * "local" tensor-group quantization does with the Linear's input global
 * scale gs: the group's scale amax / 6 times gs, rounded to FP8 E4M3 (0
 * becomes E4M3's epsilon, 0.125), over gs; each value over that scale,
 * clamped to +-6, rounded to FP4, times the scale again. Every step one
 * fp32 operation in that order, so the bits are the package's. */
#define NVFP4_ACT_GROUP 16
DCP_QUANT_FN void nvfp4_act_group(float *y, const float *x, float gs)
{
    float amax = 0.0f;
    for (int i = 0; i < NVFP4_ACT_GROUP; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = f8e4m3_to_f32(f32_to_f8e4m3(gs * (amax / 6.0f)));
    if (s == 0.0f) s = 0.125f;
    s = s / gs;
    for (int i = 0; i < NVFP4_ACT_GROUP; i++) {
        float v = x[i] / s;
        y[i] = fp4_round(fminf(fmaxf(v, -6.0f), 6.0f)) * s;
    }
}

#endif
