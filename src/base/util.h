/* Small shared helpers: error reporting, allocation, clocks. */
#ifndef DCP_UTIL_H
#define DCP_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Functions that can fail return 0 on success and -1 on failure, after
 * recording a one-line reason that the caller may print or wrap. */
int dcp_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *dcp_error(void);

/* Allocation failure is not recoverable for an inference run: these print
 * the size and exit. Memory from them is released with free(). */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* n bytes for data streamed from memory (weights, bandwidth loops): at
 * least 2 MiB go on a 2 MiB boundary, in transparent huge pages where the
 * kernel offers them (madvise mode), so that a linear read does not miss
 * the TLB every 4 KiB. Released with free(). */
void *xmalloc_huge(size_t n);

double now_s(void);

/* Balanced split of n items over p parts: part i gets [start, start+count). */
void balanced_part(int n, int p, int i, int *start, int *count);
/* Parses a byte count with an optional K, M, G, T or P suffix (powers of
 * 1024); from 1K to 1P, else -1. */
int parse_bytes(const char *s, size_t *out);
/* The unit to print a size of `bytes` in: "GiB", "MiB", "KiB" (the largest
 * that gives at least 1) or "B"; *scale is its bytes. */
const char *size_unit(double bytes, double *scale);

/* Deterministic generators shared by sampling and the test-model writer. */
uint64_t splitmix64(uint64_t *state);

/* 64-bit FNV-1a hash of n bytes, continued from h (start with FNV_START). */
#define FNV_START 14695981039346656037ull
uint64_t fnv1a(uint64_t h, const void *data, size_t n);

/* fp16/bf16 <-> fp32 conversions used by the checkpoint readers/writers. */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
/* dst (n) = src rounded to bf16, as f32_to_bf16 */
void f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
float f16_to_f32(uint16_t h);

/* Reads a whole file into a NUL-terminated buffer; *len_out excludes the NUL. */
int read_file(const char *path, char **data_out, size_t *len_out);
int path_is_dir(const char *path);
int path_exists(const char *path);
/* The file name in path's folder (path a file's name), malloc'ed. */
char *path_beside(const char *path, const char *name);
/* Continues *h over a file's identity: its size and its bytes, all of
 * them up to 1 GiB; above, its first head bytes (a header) and 17 blocks
 * of 4 KiB spread over the rest, its last bytes among them. Enough to tell
 * apart two checkpoints of one shape without reading terabytes. */
int hash_file_sampled(const char *path, size_t head, uint64_t *h);
/* Fails unless path is a regular file (not a FIFO, device or directory,
 * which could block or never end); what names it in the message. */
int check_regular_file(const char *path, const char *what);

#endif
