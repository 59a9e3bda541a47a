#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"
#include "util.h"

/* A header larger than this is not a checkpoint header but a corrupt length. */
#define ST_MAX_HEADER (100u << 20)

/* the element types read, by StDtype: their names in the header and sizes */
static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"I32", 4}, {"I64", 8}, {"U8", 1}, {"I8", 1}};

static int dtype_parse(const char *s, StDtype *d, size_t *size)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
        if (!strcmp(s, st_dtypes[i].name)) {
            *d = (StDtype)i;
            *size = st_dtypes[i].size;
            return 0;
        }
    return -1;
}

const char *st_dtype_name(StDtype d) { return st_dtypes[d].name; }

static int parse_entry(StFile *f, const char *name, json_t *e, const unsigned char *data, size_t data_len)
{
    StTensor *t = &f->tensors[f->n];
    json_t *jd = json_object_get(e, "dtype");
    json_t *js = json_object_get(e, "shape");
    json_t *jo = json_object_get(e, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return dcp_fail("%s: tensor '%s': header entry needs dtype, shape and data_offsets", f->path, name);
    size_t esize;
    if (dtype_parse(json_string_value(jd), &t->dtype, &esize))
        return dcp_fail("%s: tensor '%s': dtype %s is not supported (F32, F16, BF16, F8_E4M3, I32, I64, U8, I8)",
                        f->path, name, json_string_value(jd));
    t->ndim = (int)json_array_size(js);
    memset(t->shape, 0, sizeof t->shape);
    if (t->ndim > 4) /* 0: a scalar (ModelOpt's scales) */
        return dcp_fail("%s: tensor '%s': %d dimensions not supported", f->path, name, t->ndim);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return dcp_fail("%s: tensor '%s': bad shape", f->path, name);
        t->shape[i] = json_integer_value(d);
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel) || numel > ((uint64_t)1 << 48))
            return dcp_fail("%s: tensor '%s': shape has more than 2^48 elements", f->path, name);
    }
    json_t *b = json_array_get(jo, 0), *en = json_array_get(jo, 1);
    if (!json_is_integer(b) || !json_is_integer(en))
        return dcp_fail("%s: tensor '%s': data_offsets must be integers", f->path, name);
    json_int_t begin = json_integer_value(b), end = json_integer_value(en);
    if (begin < 0 || end < begin || (uint64_t)end > data_len)
        return dcp_fail("%s: tensor '%s': data_offsets [%lld, %lld] out of range (data section is %zu bytes; "
                        "file truncated or corrupt)",
                        f->path, name, (long long)begin, (long long)end, data_len);
    if ((uint64_t)(end - begin) != numel * esize)
        return dcp_fail("%s: tensor '%s': data_offsets span %lld bytes but shape and dtype need %llu", f->path,
                        name, (long long)(end - begin), (unsigned long long)(numel * esize));
    t->name = xstrdup(name);
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    t->file = f->path;
    f->n++;
    return 0;
}

int st_open(StFile *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->path = xstrdup(path);
    if (check_regular_file(path, "safetensors")) goto fail;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        dcp_fail("%s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    fstat(fd, &st);
    f->size = (size_t)st.st_size;
    if (f->size < 8) {
        close(fd);
        dcp_fail("%s: %zu bytes, too short for a safetensors header (truncated file?)", path, f->size);
        goto fail;
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        dcp_fail("%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    if (st_parse(f, path, f->map, f->size) == 0) {
        for (int i = 0; i < f->n; i++) f->tensors[i].mapped = 1;
        return 0;
    }
fail:
    st_close(f);
    return -1;
}

int st_parse(StFile *f, const char *path, const unsigned char *p, size_t size)
{
    if (size < 8)
        return dcp_fail("%s: %zu bytes, too short for a safetensors header (truncated file?)", path, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > ST_MAX_HEADER || hlen > size - 8)
        return dcp_fail("%s: header length %llu exceeds the file size %zu (truncated file?)", path,
                        (unsigned long long)hlen, size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, hlen, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return dcp_fail("%s: header is not a JSON object: %s", path, root ? "" : jerr.text);
    }
    free(f->tensors);
    f->tensors = xcalloc(json_object_size(root) + 1, sizeof(StTensor));
    const char *key;
    json_t *val;
    const unsigned char *data = p + 8 + hlen;
    size_t data_len = size - 8 - hlen;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) continue;
        if (parse_entry(f, key, val, data, data_len)) {
            json_decref(root);
            return -1;
        }
    }
    json_decref(root);
    return 0;
}

void st_close(StFile *f)
{
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = xmalloc(n);
    snprintf(s, n, "%s/%s", dir, name);
    return s;
}

int st_index_parse(const char *path, const char *text, size_t len, char ***names_out, int *n_out)
{
    *names_out = NULL;
    *n_out = 0;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return dcp_fail("%s:%d: %s", path, jerr.line, jerr.text);
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        return dcp_fail("%s: no \"weight_map\" object", path);
    }
    /* distinct shard file names, in first-seen order */
    char **names = xcalloc(json_object_size(map) + 1, sizeof(char *));
    int n = 0, rc = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val)
    {
        const char *fn = json_is_string(val) ? json_string_value(val) : NULL;
        if (!fn || !fn[0] || strchr(fn, '/')) {
            rc = dcp_fail("%s: weight_map entry '%s' is not a file name in the model folder", path, key);
            break;
        }
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = !strcmp(names[i], fn);
        if (!seen) names[n++] = xstrdup(fn);
    }
    json_decref(root);
    if (rc) {
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        return -1;
    }
    *names_out = names;
    *n_out = n;
    return 0;
}

int st_checkpoint_open(StCheckpoint *ck, const char *dir)
{
    memset(ck, 0, sizeof *ck);
    char *single = join(dir, "model.safetensors");
    char *index = join(dir, "model.safetensors.index.json");
    int rc = -1;
    if (path_exists(single)) {
        ck->files = xcalloc(1, sizeof(StFile));
        if (st_open(&ck->files[0], single) == 0) {
            ck->n_files = 1;
            rc = 0;
        }
    } else if (path_exists(index)) {
        char *text = NULL, **names = NULL;
        size_t len;
        int n = 0;
        rc = check_regular_file(index, "index") || read_file(index, &text, &len) ||
                     st_index_parse(index, text, len, &names, &n)
                 ? -1
                 : 0;
        free(text);
        ck->files = xcalloc(n ? (size_t)n : 1, sizeof(StFile));
        for (int i = 0; i < n && rc == 0; i++) {
            char *p = join(dir, names[i]);
            rc = st_open(&ck->files[i], p);
            free(p);
            if (rc == 0) ck->n_files++;
        }
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
    } else {
        dcp_fail("%s: neither model.safetensors nor model.safetensors.index.json found", dir);
    }
    free(single);
    free(index);
    if (rc) st_checkpoint_close(ck);
    return rc;
}

void st_checkpoint_close(StCheckpoint *ck)
{
    for (int i = 0; i < ck->n_files; i++) st_close(&ck->files[i]);
    free(ck->files);
    memset(ck, 0, sizeof *ck);
}

void st_checkpoint_unwrap(StCheckpoint *ck, const char *prefix, const char *const *skip)
{
    size_t pl = strlen(prefix);
    for (int i = 0; i < ck->n_files; i++) {
        StFile *f = &ck->files[i];
        for (int j = 0; j < f->n; j++) {
            char *name = f->tensors[j].name;
            if (!strncmp(name, prefix, pl)) {
                memmove(name, name + pl, strlen(name + pl) + 1);
                continue;
            }
            int drop = 0;
            for (int k = 0; skip[k] && !drop; k++) drop = !strncmp(name, skip[k], strlen(skip[k]));
            if (!drop) continue;
            free(name);
            f->tensors[j--] = f->tensors[--f->n];
        }
    }
}

const StTensor *st_find(const StCheckpoint *ck, const char *name)
{
    for (int i = 0; i < ck->n_files; i++)
        for (int j = 0; j < ck->files[i].n; j++)
            if (!strcmp(ck->files[i].tensors[j].name, name)) return &ck->files[i].tensors[j];
    return NULL;
}

/* Drops a tensor's pages from this process's resident memory once copied:
 * they stay in the page cache, and a later read faults them back in. Only
 * pages wholly inside the tensor, which no other tensor shares. */
static void st_release(const StTensor *t)
{
    if (!t->mapped) return; /* parsed from memory the caller owns */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)t->data + page - 1) / page * page, b = ((uintptr_t)t->data + t->nbytes) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* A block-scaled FP8 tensor's scales (scale_inv: [rows / block_rows, cols
 * / block_cols] rounded up), checked against its shape and read as fp32;
 * NULL with dcp_error() when they do not fit. */
static float *f8_block_scales(const StTensor *t, const StTensor *scale_inv, int block_rows, int block_cols,
                              int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, int64_t *bc_out)
{
    int64_t rows = t->ndim == 1 ? 1 : t->shape[0], cols = t->ndim == 1 ? t->shape[0] : t->shape[1];
    int64_t br = (rows + block_rows - 1) / block_rows, bc = (cols + block_cols - 1) / block_cols;
    if (t->dtype != ST_F8_E4M3 || t->ndim != 2 || !scale_inv || scale_inv->ndim != 2 || scale_inv->shape[0] != br ||
        scale_inv->shape[1] != bc) {
        dcp_fail("%s: tensor '%s': FP8 needs a weight_scale_inv of [%lld, %lld] (blocks of %d x %d)", t->file,
                 t->name, (long long)br, (long long)bc, block_rows, block_cols);
        return NULL;
    }
    if (row0 < 0 || col0 < 0 || row0 + nrows > rows || col0 + ncols > cols) {
        dcp_fail("%s: tensor '%s': slice [%lld+%lld, %lld+%lld] outside shape", t->file, t->name, (long long)row0,
                 (long long)nrows, (long long)col0, (long long)ncols);
        return NULL;
    }
    float *scale = xmalloc(sizeof(float) * (size_t)(br * bc));
    if (st_read_f32(scale_inv, 0, br, 0, bc, scale)) {
        free(scale);
        return NULL;
    }
    /* a scale that is not a finite number would poison every value of its
     * block: named here rather than found as NaN logits; scales that are
     * all zero make the matrix zero, a broken export rather than a model */
    int64_t zeros = 0;
    for (int64_t i = 0; i < br * bc; i++) zeros += scale[i] == 0;
    if (zeros == br * bc) {
        dcp_fail("%s: tensor '%s': all %lld block scales are 0, which would make '%s' all zeros", scale_inv->file,
                 scale_inv->name, (long long)(br * bc), t->name);
        free(scale);
        return NULL;
    }
    for (int64_t i = 0; i < br * bc; i++)
        if (!isfinite(scale[i])) {
            dcp_fail("%s: tensor '%s': block [%lld, %lld] has the scale %g, not a finite number", scale_inv->file,
                     scale_inv->name, (long long)(i / bc), (long long)(i % bc), (double)scale[i]);
            free(scale);
            return NULL;
        }
    *bc_out = bc;
    return scale;
}

int st_read_f32_scaled(const StTensor *t, const StTensor *scale_inv, int block_rows, int block_cols, int64_t row0,
                       int64_t nrows, int64_t col0, int64_t ncols, float *dst)
{
    int64_t bc, cols = t->ndim == 1 ? t->shape[0] : t->shape[1];
    float *scale = f8_block_scales(t, scale_inv, block_rows, block_cols, row0, nrows, col0, ncols, &bc);
    if (!scale) return -1;
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t c = 0; c < ncols; c++) {
            int64_t R = row0 + r, C = col0 + c;
            dst[r * ncols + c] = f8e4m3_to_f32(t->data[R * cols + C]) * scale[(R / block_rows) * bc + C / block_cols];
        }
    free(scale);
    return 0;
}

int st_read_f8_scaled(const StTensor *t, const StTensor *scale_inv, int block_rows, int block_cols, int64_t row0,
                      int64_t nrows, int64_t col0, int64_t ncols, int qcols, uint8_t *dst, float *scale_dst)
{
    int64_t bc, cols = t->ndim == 1 ? t->shape[0] : t->shape[1];
    if (qcols <= 0 || block_cols % qcols || col0 % qcols || ncols % qcols)
        return dcp_fail("%s: tensor '%s': columns %lld+%lld in runs of %d do not keep to the FP8 blocks of %d",
                        t->file, t->name, (long long)col0, (long long)ncols, qcols, block_cols);
    float *scale = f8_block_scales(t, scale_inv, block_rows, block_cols, row0, nrows, col0, ncols, &bc);
    if (!scale) return -1;
    for (int64_t r = 0; r < nrows; r++) {
        int64_t R = row0 + r;
        memcpy(dst + r * ncols, t->data + R * cols + col0, (size_t)ncols);
        for (int64_t c = 0; c < ncols; c += qcols)
            scale_dst[(r * ncols + c) / qcols] = scale[(R / block_rows) * bc + (col0 + c) / block_cols];
    }
    free(scale);
    st_release(t);
    return 0;
}


int st_read_bf16(const StTensor *t, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, uint16_t *dst)
{
    int64_t rows = t->ndim == 1 ? 1 : t->shape[0];
    int64_t cols = t->ndim == 1 ? t->shape[0] : t->shape[1];
    if (t->dtype != ST_BF16 || t->ndim > 2 || row0 < 0 || col0 < 0 || row0 + nrows > rows || col0 + ncols > cols)
        return dcp_fail("%s: tensor '%s': not a bf16 slice [%lld+%lld, %lld+%lld]", t->file, t->name,
                        (long long)row0, (long long)nrows, (long long)col0, (long long)ncols);
    for (int64_t r = 0; r < nrows; r++)
        memcpy(dst + r * ncols, t->data + (size_t)((row0 + r) * cols + col0) * 2, (size_t)ncols * 2);
    st_release(t);
    return 0;
}

int st_read_nibbles(const StTensor *packed, const StTensor *scale, const StTensor *shape, int group, float mul,
                    float div, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, int qcols, uint8_t *dst,
                    float *scale_dst, uint8_t *code_dst)
{
    int per = packed->dtype == ST_I32 ? 8 : 2; /* elements per stored element */
    int64_t rows = packed->ndim == 2 ? packed->shape[0] : 0, cols = packed->ndim == 2 ? packed->shape[1] * per : 0;
    if (shape) { /* weight_shape: the matrix's own shape, which the packing rounds up to 8 columns */
        int64_t s[2] = {0, 0};
        for (int i = 0; i < 2 && shape->ndim == 1 && shape->shape[0] == 2; i++) {
            if (shape->dtype == ST_I64) memcpy(&s[i], shape->data + 8 * i, 8);
            else if (shape->dtype == ST_I32) {
                int32_t v;
                memcpy(&v, shape->data + 4 * i, 4);
                s[i] = v;
            }
        }
        if (s[0] != rows || s[1] != cols)
            return dcp_fail("%s: tensor '%s': weight_shape [%lld, %lld] is not that of its packing [%lld, %lld / 8]",
                            packed->file, shape->name, (long long)s[0], (long long)s[1], (long long)rows,
                            (long long)cols);
    }
    if ((packed->dtype != ST_I32 && packed->dtype != ST_U8) || packed->ndim != 2 || !scale || scale->ndim != 2 ||
        scale->shape[0] != rows || group <= 0 || cols % group || scale->shape[1] != cols / group ||
        (scale->dtype != ST_BF16 && scale->dtype != ST_F32 && scale->dtype != ST_F8_E4M3))
        return dcp_fail("%s: tensor '%s': 4-bit elements need an I32 or U8 packing [rows, cols / %d] and BF16, F32 "
                        "or F8_E4M3 scales [rows, cols / %d]",
                        packed->file, packed->name, per == 8 ? 8 : 2, group);
    if (code_dst && scale->dtype != ST_F8_E4M3)
        return dcp_fail("%s: tensor '%s' is %s where NVFP4's scales are F8_E4M3", scale->file, scale->name,
                        st_dtype_name(scale->dtype));
    if (qcols <= 0 || group % qcols || col0 % qcols || ncols % qcols || row0 < 0 || col0 < 0 || row0 + nrows > rows ||
        col0 + ncols > cols)
        return dcp_fail("%s: tensor '%s': slice [%lld+%lld, %lld+%lld] in runs of %d outside its shape or its groups "
                        "of %d",
                        packed->file, packed->name, (long long)row0, (long long)nrows, (long long)col0,
                        (long long)ncols, qcols, group);
    size_t gs = (size_t)(cols / group);
    float *srow = xmalloc(sizeof(float) * gs);
    for (int64_t r = 0; r < nrows; r++) {
        const unsigned char *from = packed->data + (size_t)(row0 + r) * (size_t)(cols / 2);
        size_t at = (size_t)(r * ncols); /* this row's first element in dst */
        if (col0 % 2 == 0 && at % 2 == 0)
            memcpy(dst + at / 2, from + col0 / 2, (size_t)(ncols + 1) / 2);
        else /* a run of odd width: nibble by nibble */
            for (int64_t c = 0; c < ncols; c++) {
                int64_t j = col0 + c;
                unsigned v = (from[j / 2] >> (4 * (j % 2))) & 15, i = (unsigned)((at + c) % 2);
                uint8_t *b = dst + (at + c) / 2;
                *b = (uint8_t)((*b & (i ? 0x0f : 0xf0)) | v << (4 * i));
            }
        if (code_dst) {
            const unsigned char *codes = scale->data + (size_t)(row0 + r) * gs;
            for (int64_t c = 0; c < ncols; c += qcols) code_dst[(at + c) / qcols] = codes[(col0 + c) / group];
            continue;
        }
        if (scale->dtype == ST_F8_E4M3)
            for (size_t g = 0; g < gs; g++) srow[g] = f8e4m3_to_f32(scale->data[(size_t)(row0 + r) * gs + g]);
        else if (st_read_f32(scale, row0 + r, 1, 0, (int64_t)gs, srow)) {
            free(srow);
            return -1;
        }
        for (int64_t c = 0; c < ncols; c += qcols) {
            float sv = srow[(col0 + c) / group];
            scale_dst[(at + c) / qcols] = global_scaled(sv, mul, div);
        }
    }
    free(srow);
    st_release(packed);
    return 0;
}

int st_read_f32(const StTensor *t, int64_t row0, int64_t nrows, int64_t col0, int64_t ncols, float *dst)
{
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return dcp_fail("%s: tensor '%s' is %s, which needs the model's quantization_config", t->file, t->name,
                        st_dtype_name(t->dtype));
    int64_t rows = t->ndim == 1 ? 1 : t->shape[0];
    int64_t cols = t->ndim == 1 ? t->shape[0] : t->shape[1];
    if (t->ndim > 2 || row0 < 0 || col0 < 0 || row0 + nrows > rows || col0 + ncols > cols)
        return dcp_fail("%s: tensor '%s': slice [%lld+%lld, %lld+%lld] outside shape", t->file, t->name,
                        (long long)row0, (long long)nrows, (long long)col0, (long long)ncols);
    for (int64_t r = 0; r < nrows; r++) {
        size_t first = (size_t)((row0 + r) * cols + col0);
        float *out = dst + r * ncols;
        switch (t->dtype) {
        case ST_F32:
            memcpy(out, t->data + first * 4, (size_t)ncols * 4); /* memcpy: data may be unaligned */
            break;
        default:
            break; /* refused above */
        case ST_BF16:
        case ST_F16:
            for (int64_t c = 0; c < ncols; c++) {
                uint16_t h;
                memcpy(&h, t->data + (first + c) * 2, 2);
                out[c] = t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
            }
            break;
        }
    }
    st_release(t);
    return 0;
}
