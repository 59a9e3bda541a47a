#include "kvcache.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Free ids: every id from next_fresh up has never been handed out, and the
 * ids released below it form a binary min-heap. Allocation takes the
 * lowest free id (deterministic whatever order requests finished in) at
 * O(log n) a block, and the bookkeeping grows with the blocks in use, not
 * with the size of the pool. */
static void heap_push(BlockPool *p, int id)
{
    if (p->n_heap == p->cap_heap)
        p->heap = xrealloc(p->heap, sizeof(int) * (size_t)(p->cap_heap = p->cap_heap ? 2 * p->cap_heap : 256));
    int i = p->n_heap++;
    while (i > 0 && p->heap[(i - 1) / 2] > id) {
        p->heap[i] = p->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    p->heap[i] = id;
}

static int take_lowest(BlockPool *p)
{
    if (!p->n_heap) return p->next_fresh++;
    int top = p->heap[0], last = p->heap[--p->n_heap], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= p->n_heap) break;
        if (c + 1 < p->n_heap && p->heap[c + 1] < p->heap[c]) c++;
        if (p->heap[c] >= last) break;
        p->heap[i] = p->heap[c];
        i = c;
    }
    if (p->n_heap) p->heap[i] = last;
    return top;
}

void pool_init(BlockPool *p, int n_blocks, int block_size)
{
    memset(p, 0, sizeof *p);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->n_free = n_blocks;
}

void pool_free_all(BlockPool *p)
{
    free(p->heap);
    memset(p, 0, sizeof *p);
}

int table_reserve(BlockPool *p, BlockTable *t, int n)
{
    int missing = n - t->n;
    if (missing <= 0) return 0;
    if (missing > p->n_free) return -1;
    if (n > t->cap) t->ids = xrealloc(t->ids, sizeof(int) * (size_t)(t->cap = n > 2 * t->cap ? n : 2 * t->cap));
    while (t->n < n) t->ids[t->n++] = take_lowest(p);
    p->n_free -= missing;
    return 0;
}

void table_release(BlockPool *p, BlockTable *t)
{
    for (int i = 0; i < t->n; i++) heap_push(p, t->ids[i]);
    p->n_free += t->n;
    t->n = 0;
}

void table_free(BlockTable *t)
{
    free(t->ids);
    memset(t, 0, sizeof *t);
}

size_t kv_bytes_per_position(int n_layers, int kv_heads, int head_dim, size_t elem_bytes)
{
    return 2 * elem_bytes * (size_t)n_layers * kv_heads * head_dim;
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
