/* Weights as typed handles: the element types of weight storage and a
 * matrix as a backend stores it (WeightRef), with the arithmetic that steps
 * through one. Below the model and the backends, which both speak it. */
#ifndef DCP_WEIGHT_H
#define DCP_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

/* Element types of weight storage. The quantized ones (dtype_quantized)
 * come with a scale per run of columns (WeightRef.scale), a matrix's value
 * being the element's value times its scale in fp32, rounded to bf16 where
 * the checkpoint's scales are bf16 (WeightRef.qflags): exactly what the
 * checkpoint's own dequantization gives.
 *   DTYPE_F8_E4M3  FP8 E4M3 (block-scaled: f8e4m3_to_f32)
 *   DTYPE_I4       signed 4-bit integers, two per byte, element i in
 *                  byte i / 2 (the low nibble first), stored plus 8 as
 *                  compressed-tensors packs them (i4_value)
 *   DTYPE_FP4      FP4 E2M1 (NVFP4's elements), packed as DTYPE_I4
 *                  (fp4_value); the scale per run is the checkpoint's FP8
 *                  scale with its global scale applied: held as stored
 *                  (WeightRef.scale8) and looked up in a table of the
 *                  256 codes' values, or given in fp32 */
typedef enum { DTYPE_F32, DTYPE_BF16, DTYPE_F8_E4M3, DTYPE_I4, DTYPE_FP4 } DType;

static inline size_t dtype_bits(DType t)
{
    return t == DTYPE_I4 || t == DTYPE_FP4 ? 4 : t == DTYPE_BF16 ? 16 : t == DTYPE_F8_E4M3 ? 8 : 32;
}
/* packed two elements per byte */
static inline int dtype_nibbles(DType t) { return t == DTYPE_I4 || t == DTYPE_FP4; }
/* bytes per element of a type of whole bytes (not the nibble types) */
static inline size_t dtype_bytes(DType t) { return dtype_bits(t) / 8; }
/* the bytes of n elements (n even for the nibble types) */
static inline size_t dtype_data_bytes(DType t, size_t n) { return n * dtype_bits(t) / 8; }
static inline int dtype_quantized(DType t) { return t == DTYPE_F8_E4M3 || dtype_nibbles(t); }
const char *dtype_name(DType t);

/* A weight matrix as a backend stores it for matmul: data in backend memory,
 * elements of dtype. The type travels with the pointer, so a sub-matrix
 * (one layer of a stack) is taken with weight_at, which steps in elements
 * of that type; there is no arithmetic on untyped storage.
 * Rows are stored one after another (group 0), or in groups of G rows
 * (group G: the CPU's layout for bf16 decode, which then streams one
 * matrix as one run of memory): the G rows of a group side by side in
 * steps of 16 columns, so element (r, c) of a rows x cols matrix is at
 *   (r / G) * G * cols + (c / 16) * 16 * G + (r % G) * 16 + c % 16,
 * and the rows after the last whole group follow as usual (r * cols + c).
 * A grouped matrix has cols a multiple of 16; each layer of a stack is
 * grouped on its own, so weight_at still steps by whole matrices. */
/* A quantized matrix (dtype_quantized) is stored row after row, and each
 * row's columns fall in runs of qcols, each run with its own fp32 scale:
 * element (r, c) of a matrix of cols columns (a multiple of qcols) has the
 * scale scale[(r * cols + c) / qcols], so that stepping to a sub-matrix
 * steps the scales in proportion. A block-scaled checkpoint's blocks of
 * rows share a scale; it is repeated for each row (a few per cent of the
 * FP8 bytes at 128 x 128 blocks), which lets a tensor-parallel slice or a
 * K chunk start at any row.
 * NVFP4 scales may instead be held as stored (scale NULL, scale8 set):
 * each run's E4M3 code, whose value with the global scale of its matrix
 * applied is tables[WEIGHT_TABLE * t + code], t = (run0 + run) /
 * table_runs. One table per checkpoint matrix (an expert's, in a stack),
 * each of table_runs runs; run0 is the first run's place in that count, so
 * that weight_at can start anywhere. The table holds the very fp32 values
 * the fp32 scales would, at a quarter of their bytes, and after the 256
 * codes' values the matrix's input global scale (WEIGHT_TABLE_ACT: a W4A4
 * checkpoint's, which quantizes the matrix's input activations; 0 where
 * the checkpoint has none). */
#define WEIGHT_TABLE 260   /* floats per table: 256 values, the input global scale, padding to 16 bytes */
#define WEIGHT_TABLE_ACT 256
typedef struct {
    const void *data;
    DType dtype;
    int group; /* 0: row after row; G: rows in groups of G */
    const float *scale; /* quantized: one per qcols elements, in order */
    int qcols;
    int qflags;         /* QF_ROUND_BF16: each value rounded to bf16 */
    const uint8_t *scale8; /* NVFP4 scales as stored, one per qcols elements (scale NULL) */
    const float *tables;   /* their values, WEIGHT_TABLE per table */
    size_t table_runs, run0;
} WeightRef;
enum { QF_ROUND_BF16 = 1 };

/* an unquantized matrix */
static inline WeightRef weight_ref(const void *data, DType dtype, int group)
{
    WeightRef w = {data, dtype, group, NULL, 0, 0, NULL, NULL, 0, 0};
    return w;
}

static inline WeightRef weight_at(WeightRef w, size_t elements)
{
    WeightRef r = w;
    r.data = (const char *)w.data + dtype_data_bytes(w.dtype, elements);
    if (w.scale) r.scale = w.scale + elements / (size_t)w.qcols;
    if (w.scale8) r.scale8 = w.scale8 + elements / (size_t)w.qcols, r.run0 = w.run0 + elements / (size_t)w.qcols;
    return r;
}
/* The scale of run j of a quantized matrix (its elements j * qcols on) */
DCP_QUANT_FN float weight_run_scale(const WeightRef *w, size_t j)
{
    return w->scale ? w->scale[j] : w->tables[(w->run0 + j) / w->table_runs * WEIGHT_TABLE + w->scale8[j]];
}
/* The input global scale of the checkpoint matrix w starts in (an NVFP4
 * matrix with its codes as stored), 0 when it has none */
DCP_QUANT_FN float weight_act_scale(const WeightRef *w)
{
    return w->scale8 ? w->tables[w->run0 / w->table_runs * WEIGHT_TABLE + WEIGHT_TABLE_ACT] : 0.0f;
}
/* How many scale tables a matrix of n elements from w on reaches into */
static inline size_t weight_tables(WeightRef w, size_t n)
{
    return w.scale8 ? (w.run0 + n / (size_t)w.qcols + w.table_runs - 1) / w.table_runs : 0;
}
/* Element i of a quantized matrix's values (dtype_quantized): the stored
 * element times its scale, in fp32, as the kernels widen it. */
float weight_value(WeightRef w, size_t i);

/* Where row r's first element is, and how many elements apart its steps
 * of 16 columns are (16 for a row stored whole). */
DCP_QUANT_FN size_t weight_row_start(int group, int r, int rows, int cols)
{
    return group && r < rows / group * group ? (size_t)(r / group) * group * cols + (size_t)(r % group) * 16
                                             : (size_t)r * cols;
}
DCP_QUANT_FN size_t weight_row_step(int group, int r, int rows)
{
    return group && r < rows / group * group ? 16 * (size_t)group : 16;
}
/* Regroups one rows x cols matrix of elements of esize bytes in place,
 * from rows one after another to groups of G (0 when it stays so: cols not
 * a multiple of 16, or fewer rows than G); returns the group it has. */
int weight_group_rows(void *m, int rows, int cols, size_t esize, int G);

#endif
