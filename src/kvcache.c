#include "kvcache.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void pool_init(BlockPool *p, int n_blocks, int block_size)
{
    memset(p, 0, sizeof *p);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->free_ids = xmalloc(sizeof(int) * (size_t)(n_blocks ? n_blocks : 1));
    for (int i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
}

void pool_free_all(BlockPool *p)
{
    free(p->free_ids);
    memset(p, 0, sizeof *p);
}

int table_reserve(BlockPool *p, BlockTable *t, int n)
{
    int missing = n - t->n;
    if (missing <= 0) return 0;
    if (missing > p->n_free) return -1;
    if (n > t->cap) t->ids = xrealloc(t->ids, sizeof(int) * (size_t)(t->cap = n > 2 * t->cap ? n : 2 * t->cap));
    while (t->n < n) t->ids[t->n++] = p->free_ids[--p->n_free];
    return 0;
}

static int cmp_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

void table_release(BlockPool *p, BlockTable *t)
{
    for (int i = 0; i < t->n; i++) p->free_ids[p->n_free++] = t->ids[i];
    t->n = 0;
    /* keep the lowest free id on top, so allocation order never depends on
     * the order requests finished in */
    qsort(p->free_ids, (size_t)p->n_free, sizeof(int), cmp_desc);
}

void table_free(BlockTable *t)
{
    free(t->ids);
    memset(t, 0, sizeof *t);
}

size_t kv_bytes_per_position(int n_layers, int kv_heads, int head_dim)
{
    return 2 * sizeof(float) * (size_t)n_layers * kv_heads * head_dim;
}

int parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v <= 0) return -1;
    double mult = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1024.0; end++; break;
    case 'M': mult = 1024.0 * 1024; end++; break;
    case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    }
    if (toupper((unsigned char)*end) == 'B') end++; /* 512M, 512MB, 512MiB */
    if (*end == 'i' && toupper((unsigned char)end[1]) == 'B') end += 2;
    if (*end) return -1;
    *out = (size_t)(v * mult);
    return 0;
}
