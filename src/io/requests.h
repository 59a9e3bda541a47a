/* The prompt file: one JSON request per line, in dcpinfer's own form
 *   {"id": ..., "prompt": "text" | "prompt_token_ids": [..], "max_tokens": N, ...}
 * or the OpenAI batch form ({"custom_id": ..., "body": {"prompt": ...}}). */
#ifndef DCP_REQUESTS_H
#define DCP_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int max_tokens;
    float temperature;
    float top_p;
    uint64_t seed; /* run seed; a request without "seed" derives its own from it */
} RequestDefaults;

typedef struct {
    char *id;
    int line;            /* 1-based line in the prompt file */
    char *prompt;        /* text, or NULL when token ids were given */
    int *prompt_tokens;  /* given ids, or the tokenizer's once encoded */
    int n_prompt;
    int max_tokens;
    float temperature;
    float top_p;
    uint64_t seed;
    int *stop_ids;
    int n_stop;
    char *error;         /* set: the request failed with this reason */
} Request;

typedef struct {
    Request *r;
    int n;
    char *path;
} RequestSet;

/* What a request produced. */
typedef struct {
    int *tokens;
    double *times;  /* seconds from the start at which each token was sampled */
    int n, cap;
    const char *finish_reason; /* "stop", "length" or "error" */
    double ttft_s, tpot_s, e2e_s;
} Result;
void results_free(Result *res, int n);

/* Reads and validates every line. A bad line is "FILE:LINE: reason": with
 * skip_invalid it becomes a failed request and reading goes on, otherwise
 * reading stops with -1 and dcp_error() holds the message. */
int requests_read(const char *path, const RequestDefaults *d, int skip_invalid, RequestSet *set);
/* The same from the file's bytes (size of them at data), read elsewhere:
 * rank 0 reads the file once and every rank parses the same bytes. */
int requests_parse(const char *path, const char *data, size_t size, const RequestDefaults *d, int skip_invalid,
                   RequestSet *set);
/* Token ids outside [0, vocab) are input errors of the same kind. */
int requests_check_vocab(RequestSet *set, int vocab, int skip_invalid);
/* Temperatures below this sample greedily (as vLLM does): dividing logits
 * by them would overflow. */
#define TEMPERATURE_GREEDY_BELOW 1e-5
float request_temperature(double t);
void request_fail(Request *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void requests_free(RequestSet *set);

#endif
