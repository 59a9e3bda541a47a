/* The stored weight formats' elements to fp32, exactly, in one definition
 * for the host, the CPU kernels and the CUDA kernels. */
#ifndef DCP_QUANT_H
#define DCP_QUANT_H

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

#endif
