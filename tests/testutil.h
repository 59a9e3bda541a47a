/* Helpers shared by the C tests: assertions that count, the shared model
 * folder, and requests built in memory. */
#ifndef DCP_TESTUTIL_H
#define DCP_TESTUTIL_H

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "requests.h"
#include "util.h"

static int test_failures;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            test_failures++;                                              \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fputc('\n', stderr);                                          \
        }                                                                 \
    } while (0)

/* CHECK that also yields the condition, to skip what depends on it */
#define CHECK_OK(cond, ...)          \
    ({                               \
        int ok_ = !!(cond);          \
        CHECK(ok_, __VA_ARGS__);     \
        ok_;                         \
    })

#define TEST_SKIP 77

/* ../shared beside the source tree, or DCP_SHARED */
static inline const char *shared_dir(void)
{
    const char *d = getenv("DCP_SHARED");
    return d ? d : "../shared";
}

static inline char *shared_path(const char *rel)
{
    const char *d = shared_dir();
    char *p = xmalloc(strlen(d) + strlen(rel) + 2);
    sprintf(p, "%s/%s", d, rel);
    return p;
}

/* A fresh scratch directory under TMPDIR. */
static inline char *scratch_dir(void)
{
    const char *t = getenv("TMPDIR");
    char *p = xmalloc(strlen(t ? t : "/tmp") + 32);
    sprintf(p, "%s/dcptest.XXXXXX", t ? t : "/tmp");
    if (!mkdtemp(p)) {
        perror("mkdtemp");
        exit(99);
    }
    return p;
}

static inline void remove_tree(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Adds a request with the given prompt ids to set (grown by one). */
static inline Request *add_request(RequestSet *set, const int *ids, int n, int max_tokens, float temperature,
                                   float top_p, uint64_t seed)
{
    set->r = xrealloc(set->r, sizeof(Request) * (size_t)(set->n + 1));
    Request *r = &set->r[set->n++];
    memset(r, 0, sizeof *r);
    r->logprobs = r->prompt_logprobs = -1; /* none asked, as a prompt line without them */
    r->skip_special = 1;
    char id[32];
    snprintf(id, sizeof id, "r%d", set->n - 1);
    r->id = xstrdup(id);
    r->line = set->n;
    r->prompt_tokens = xmalloc(sizeof(int) * (size_t)n);
    memcpy(r->prompt_tokens, ids, sizeof(int) * (size_t)n);
    r->n_prompt = n;
    r->max_tokens = max_tokens;
    r->temperature = temperature;
    r->top_p = top_p;
    r->seed = seed;
    if (!set->path) set->path = xstrdup("(test)");
    return r;
}

/* "full token sequence" of a CASE in REFERENCE-llama2c.txt; returns count. */
static inline int reference_tokens(const char *ref, int case_no, int *out, int cap)
{
    char head[32];
    snprintf(head, sizeof head, "CASE %d:", case_no);
    const char *p = strstr(ref, head);
    if (!p) return -1;
    p = strstr(p, "full token sequence");
    if (!p) return -1;
    p = strchr(p, '\n');
    int n = 0;
    while (p && n < cap) {
        while (*p == ' ' || *p == '\n') p++;
        if (*p < '0' || *p > '9') break;
        out[n++] = (int)strtol(p, (char **)&p, 10);
    }
    return n;
}

/* 1 when s is valid UTF-8 (whole characters only) */
static inline int valid_utf8(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        int n = *u < 0x80 ? 1 : (*u & 0xE0) == 0xC0 ? 2 : (*u & 0xF0) == 0xE0 ? 3 : (*u & 0xF8) == 0xF0 ? 4 : 0;
        if (!n) return 0;
        for (int k = 1; k < n; k++)
            if ((u[k] & 0xC0) != 0x80) return 0;
        u += n;
    }
    return 1;
}

/* The whitespace-separated ids of a file (a test model's prompt.txt), at
 * most cap; returns how many. */
static inline int read_ids(const char *path, int *ids, int cap)
{
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && n < cap && fscanf(f, "%d", &ids[n]) == 1) n++;
    if (f) fclose(f);
    return n;
}

/* A test model's reference logits (dir/logits.f32: n positions of vocab
 * floats, from transformers), malloc'ed; a check fails when short. */
static inline float *read_ref_logits_named(const char *dir, const char *file, int n, int vocab)
{
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    float *ref = xmalloc(sizeof(float) * (size_t)n * vocab);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(ref, sizeof(float), (size_t)n * vocab, f) : 0;
    if (f) fclose(f);
    CHECK(got == (size_t)n * vocab, "%s: holds %zu of %d floats", path, got, n * vocab);
    return ref;
}
/* dir/logits.f32, the reference logits beside a test model */
static inline float *read_ref_logits(const char *dir, int n, int vocab)
{
    return read_ref_logits_named(dir, "logits.f32", n, vocab);
}

/* A generate() logits callback (GenOptions.on_logits) keeping every
 * position's logits of one request. */
typedef struct {
    float *logits; /* (positions, vocab) */
    int vocab;
} PromptLogits;

static inline void capture_prompt_logits(void *ctx, int request, int pos, const float *logits, int vocab)
{
    PromptLogits *c = ctx;
    (void)request;
    memcpy(c->logits + (size_t)pos * vocab, logits, sizeof(float) * vocab);
}

static inline int test_finish(const char *name)
{
    if (test_failures) fprintf(stderr, "%s: %d check(s) failed\n", name, test_failures);
    else fprintf(stderr, "%s: all checks passed\n", name);
    return test_failures ? 1 : 0;
}

#endif
