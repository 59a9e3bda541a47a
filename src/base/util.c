#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

static char last_error[1024];

int dcp_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return -1;
}

const char *dcp_error(void) { return last_error; }

static void oom(size_t n)
{
    fprintf(stderr, "dcpinfer: out of memory allocating %zu bytes\n", n);
    exit(1);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *xmalloc_huge(size_t n)
{
    size_t huge = (size_t)2 << 20;
    void *p;
    if (n < huge) return xmalloc(n);
    if (posix_memalign(&p, huge, n)) oom(n);
    madvise(p, n / huge * huge, MADV_HUGEPAGE);
    return p;
}

void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) oom(count * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

void f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) { man <<= 1; exp--; }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int read_file(const char *path, char **data_out, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return dcp_fail("%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (len + 1 >= cap) buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    int bad = ferror(f), err = errno;
    fclose(f);
    if (bad) {
        free(buf);
        return dcp_fail("%s: %s", path, strerror(err));
    }
    buf[len] = '\0';
    *data_out = buf;
    if (len_out) *len_out = len;
    return 0;
}

int path_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int check_regular_file(const char *path, const char *what)
{
    struct stat st;
    if (stat(path, &st)) return dcp_fail("%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return dcp_fail("%s: the %s file is not a regular file (a %s)", path, what,
                        S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode) ? "FIFO" : "device or socket");
    return 0;
}

/* FNV-1a taken 8 bytes at a time (the bytes of a word, little-endian, in
 * one xor): the same spread for a file's bulk at a fraction of the time. */
static uint64_t fnv1a_words(uint64_t h, const unsigned char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    return fnv1a(h, p + i, n - i);
}

int hash_file_sampled(const char *path, size_t head, uint64_t *h)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        int err = errno;
        if (fd >= 0) close(fd);
        return dcp_fail("%s: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return check_regular_file(path, "model");
    }
    uint64_t size = (uint64_t)st.st_size;
    *h = fnv1a(*h, &size, sizeof size);
    enum { PIECE = 1 << 20, SAMPLE = 4096, SAMPLES = 16 };
    const uint64_t whole = (uint64_t)1 << 30; /* files up to 1 GiB are read whole */
    unsigned char *buf = xmalloc(PIECE);
    int rc = 0;
    /* the head (a header, or the whole of a file up to 1 GiB), then samples
     * spread over the rest and its last bytes */
    if (size <= whole || size <= (uint64_t)head + (SAMPLES + 1) * SAMPLE) head = (size_t)size;
    for (uint64_t at = 0; at < head && !rc; at += PIECE) {
        size_t want = head - at < PIECE ? (size_t)(head - at) : PIECE;
        ssize_t got = pread(fd, buf, want, (off_t)at);
        if (got != (ssize_t)want) rc = dcp_fail("%s: cannot read it: %s", path, got < 0 ? strerror(errno) : "short read");
        else *h = fnv1a_words(*h, buf, want);
    }
    for (int k = 0; k <= SAMPLES && !rc && head < size; k++) {
        uint64_t at = head + (size - head - SAMPLE) * (uint64_t)k / SAMPLES;
        ssize_t got = pread(fd, buf, SAMPLE, (off_t)at);
        if (got != SAMPLE) rc = dcp_fail("%s: cannot read it: %s", path, got < 0 ? strerror(errno) : "short read");
        else *h = fnv1a_words(*h, buf, SAMPLE);
    }
    free(buf);
    close(fd);
    return rc;
}

int path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

char *path_beside(const char *path, const char *name)
{
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char *p = xmalloc(dir + strlen(name) + 1);
    memcpy(p, path, dir);
    strcpy(p + dir, name);
    return p;
}

void balanced_part(int n, int p, int i, int *start, int *count)
{
    int base = n / p, rem = n % p;
    *count = base + (i < rem);
    *start = i * base + (i < rem ? i : rem);
}

const char *size_unit(double bytes, double *scale)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (u < 3 && bytes >= (double)(1ull << (10 * (u + 1)))) u++;
    *scale = (double)(1ull << (10 * u));
    return names[u];
}

int parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v <= 0) return -1;
    double mult = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1024.0; end++; break;
    case 'M': mult = 1024.0 * 1024; end++; break;
    case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    case 'P': mult = 1024.0 * 1024 * 1024 * 1024 * 1024; end++; break;
    }
    if (toupper((unsigned char)*end) == 'B') end++; /* 512M, 512MB, 512MiB */
    if (*end == 'i' && toupper((unsigned char)end[1]) == 'B') end += 2;
    if (*end) return -1;
    /* at least 1K (below that no block fits), at most 1P */
    double bytes = v * mult;
    if (!(bytes >= 1024.0 && bytes <= 1125899906842624.0)) return -1;
    *out = (size_t)bytes;
    return 0;
}
