/* Reader for Hugging Face safetensors files (mmapped) and sharded
 * checkpoints described by model.safetensors.index.json. */
#ifndef DCP_SAFETENSORS_H
#define DCP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ST_F32, ST_F16, ST_BF16, ST_F8_E4M3, ST_I32, ST_I64, ST_U8, ST_I8 } StDtype;
/* as a checkpoint's header names it: "F32", ... */
const char *st_dtype_name(StDtype d);

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[4];
    const unsigned char *data; /* into the mapping */
    size_t nbytes;
    const char *file;          /* path of the file holding it */
    int mapped;                /* data is in st_open's read-only mapping */
} StTensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
    StTensor *tensors;
    int n;
} StFile;

/* All tensors of a checkpoint: one file or the shards of an index. */
typedef struct {
    StFile *files;
    int n_files;
} StCheckpoint;

int st_open(StFile *f, const char *path);
/* The tensors of a safetensors image of size bytes at data (st_open maps
 * the file and calls this); f->tensors point into data. */
int st_parse(StFile *f, const char *path, const unsigned char *data, size_t size);
/* The distinct shard file names of an index's weight_map (malloc'ed). */
int st_index_parse(const char *path, const char *text, size_t len, char ***names, int *n);
void st_close(StFile *f);

/* dir holds model.safetensors or model.safetensors.index.json. */
int st_checkpoint_open(StCheckpoint *ck, const char *dir);
void st_checkpoint_close(StCheckpoint *ck);
/* A wrapped checkpoint's tensors: prefix taken off the names that start
 * with it, those under a skip prefix (NULL-terminated list) dropped.
 * Others stay as they are. */
void st_checkpoint_unwrap(StCheckpoint *ck, const char *prefix, const char *const *skip);
const StTensor *st_find(const StCheckpoint *ck, const char *name);

/* Copies rows [row0, row0+nrows) x columns [col0, col0+ncols) of a 1-D or 2-D
 * tensor into dst as fp32 (row-major, ncols per row). A 1-D tensor is one row. */
int st_read_f32(const StTensor *t, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, float *dst);
/* The same slice of a bf16 tensor, as stored. Both drop the tensor's pages
 * from resident memory afterwards (a copy is all the model keeps). */
int st_read_bf16(const StTensor *t, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, uint16_t *dst);
/* The same for a block-scaled FP8 tensor (F8_E4M3): each value times the
 * scale of its (block_rows, block_cols) block in scale_inv, as DeepSeek's
 * FP8 checkpoints store them (weight_scale_inv). */
int st_read_f32_scaled(const StTensor *t, const StTensor *scale_inv, int block_rows, int block_cols, int64_t row0,
                       int64_t nrows, int64_t col0, int64_t ncols, float *dst);
/* The same slice kept in FP8: dst (nrows, ncols) the bytes as stored, and
 * scale_dst one fp32 scale per qcols columns of each row, in order (the
 * row's block's scale; WeightRef). qcols must divide block_cols, col0 and
 * ncols, so that no run of qcols crosses a block. */
int st_read_f8_scaled(const StTensor *t, const StTensor *scale_inv, int block_rows, int block_cols, int64_t row0,
                      int64_t nrows, int64_t col0, int64_t ncols, int qcols, uint8_t *dst, float *scale_dst);
/* A slice of a matrix of 4-bit elements packed two per byte, the low
 * nibble first: compressed-tensors' pack-quantized INT4 (packed I32 [rows,
 * cols / 8], eight values per word from its low bits up, each plus 8; with
 * shape, its weight_shape, checked) or NVFP4's E2M1 (U8 [rows, cols / 2]),
 * and its scales (BF16, F32 or F8_E4M3 [rows, cols / group]). dst gets the
 * slice's elements as stored, two per byte, and scale_dst one fp32 scale
 * per qcols columns of each row, in order: the stored scale times mul, or
 * divided by div when div is not 0 (NVFP4's global scale: ModelOpt
 * multiplies, compressed-tensors divides). qcols must divide group, col0
 * and ncols. With code_dst (and scale_dst NULL), the scales must be
 * F8_E4M3 and code_dst gets their codes as stored, one per run, for a
 * table of what each code's scale is (mul and div then unused). */
int st_read_nibbles(const StTensor *packed, const StTensor *scale, const StTensor *shape, int group, float mul,
                    float div, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, int qcols, uint8_t *dst,
                    float *scale_dst, uint8_t *code_dst);

#endif
