/* A run's identity: everything that changes a request's tokens or texts,
 * field by field. The journal and the results file carry it; --resume
 * compares the stored one with this run's and refuses with one line naming
 * the first field that differs. The model and the tokenizer are named by
 * their contents (model_content_hash, Tokenizer.content_hash), never by
 * their paths. */
#ifndef DCP_IDENTITY_H
#define DCP_IDENTITY_H

#define IDENTITY_FIELDS(X)                                                                                   \
    X(version, "dcpinfer version")                                                                           \
    X(model, "model (its files' contents)")                                                             \
    X(tokenizer, "tokenizer (its files' contents)")                                                          \
    X(prompts, "prompt file (its bytes)")                                                                    \
    X(dtype, "--dtype (resolved)")                                                                           \
    X(kv_cache_dtype, "--kv-cache-dtype")                                                                    \
    X(nvfp4_activations, "--nvfp4-activations (a W4A4 checkpoint's; - for others)")                           \
    X(backend, "--backend")                                                                                  \
    X(cpu_gemm, "--cpu-gemm")                                                                                \
    X(max_model_len, "--max-model-len (resolved)")                                                           \
    X(max_tokens, "--max-tokens")                                                                            \
    X(temperature, "--temperature")                                                                          \
    X(top_p, "--top-p")                                                                                      \
    X(sampling, "--top-k, --min-p and the penalties")                                                        \
    X(seed, "--seed")                                                                                        \
    X(reduction_order, "reduction order (the model's canonical sizes, --cp-kv-cache-interleave-size and "      \
                       "--enable-expert-parallel, or a layout that does not divide them)")

enum {
#define IDENTITY_ENUM(name, what) ID_##name,
    IDENTITY_FIELDS(IDENTITY_ENUM)
#undef IDENTITY_ENUM
    ID_N
};

typedef struct {
    char v[ID_N][72];
} RunIdentity;

void identity_set(RunIdentity *id, int field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* {"version": "...", "model": "...", ...}, compact, malloc'ed. */
char *identity_json(const RunIdentity *id);
/* 0 when the stored identity (JSON text, NULL when there is none) equals
 * id; else -1 with dcp_error() naming where (a file) and the first field
 * that differs, its stored and its present value. */
int identity_check(const RunIdentity *id, const char *stored, const char *where);

#endif
