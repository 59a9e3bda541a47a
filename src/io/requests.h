/* The prompt file: one JSON request per line, in dcpinfer's own form
 *   {"id": ..., "prompt": "text" | "prompt_token_ids": [..], "max_tokens": N, ...}
 * or the OpenAI batch form ({"custom_id": ..., "body": {"prompt": ...}}); a
 * chat request carries "messages" (and the chat template's options) in
 * place of the prompt, rendered by the model's chat template (chat.h). */
#ifndef DCP_REQUESTS_H
#define DCP_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

/* vLLM's sampling parameters beyond temperature and top_p (sampler.h
 * applies them in vLLM's order) */
typedef struct {
    int top_k;                /* keep the k most likely tokens; 0: off (-1 in a request) */
    float min_p;              /* drop tokens below min_p x the most likely one's probability; 0: off */
    float presence_penalty;   /* OpenAI's: subtracted from each token generated at least once */
    float frequency_penalty;  /* OpenAI's: subtracted per time a token was generated */
    float repetition_penalty; /* over prompt and output tokens: positive logits divided, others multiplied; 1: off */
} SamplingExtra;

typedef struct {
    int max_tokens;
    float temperature;
    float top_p;
    uint64_t seed; /* run seed; a request without "seed" derives its own from it */
    SamplingExtra x;
    /* an OpenAI chat completion body without max_tokens: this many (vLLM:
     * to EOS or the context limit, INT32_MAX here); 0: max_tokens */
    int chat_max_tokens;
} RequestDefaults;

typedef struct {
    char *id;
    int line;            /* 1-based line in the prompt file */
    char *prompt;        /* text, or NULL when token ids were given */
    char *chat;          /* a chat request's messages and template options (a JSON object's text) */
    int thinking_off;    /* chat_template_kwargs "thinking": false (Kimi's switch; reasoning.h) */
    int *prompt_tokens;  /* given ids, or the tokenizer's once encoded */
    int n_prompt;
    int max_tokens;
    float temperature;
    float top_p;
    uint64_t seed;
    SamplingExtra x;
    int *bias_ids;       /* logit_bias: token ids, and what is added to their logits */
    float *bias;
    int n_bias;
    int *stop_ids;       /* stop_token_ids */
    int n_stop;
    char **stop;         /* stop strings */
    int n_stop_str;
    int include_stop_str; /* include_stop_str_in_output: the text keeps the stop string */
    int ignore_eos;      /* the model's EOS does not end the request */
    int min_tokens;      /* no stop (token or string) before this many output tokens */
    int logprobs;        /* per output token: its log-probability and the top N; -1: none */
    int prompt_logprobs; /* the same per prompt token; -1: none */
    int skip_special;    /* skip_special_tokens: special tokens are left out of the text */
    int batch;           /* an OpenAI batch line */
    int n_choices;       /* "n": the sequences of this line; its requests follow each other in the set */
    int choice;          /* which of them (0: the first, seeded as n = 1 would be) */
    int chat_api;        /* of url /v1/chat/completions: its results are chat.completion objects */
    char *error;         /* set: the request failed with this reason */
} Request;

/* The most log-probabilities a request may ask for per position. */
#define MAX_LOGPROBS 20

typedef struct {
    Request *r;
    int n;
    char *path;
    int batch; /* every valid line is an OpenAI batch line (and there is one) */
} RequestSet;

/* What a request produced. */
typedef struct {
    int *tokens;
    double *times;  /* seconds from the start at which each token was sampled */
    int n, cap;
    const char *finish_reason; /* "stop", "length" or "error" */
    double ttft_s, tpot_s, e2e_s;
    int num_cached_tokens; /* prompt positions its first admission took from the prefix cache */
    int spec_draft_tokens, spec_accepted_tokens; /* speculative decoding: tokens drafted, and accepted */
    /* the output text, made as the tokens arrive (NULL without a tokenizer) */
    char *text;
    size_t text_len, text_cap;
    int detok_prefix, detok_read; /* detok.h: the token window still being decoded */
    char *stop_str;   /* the stop string that ended the request, or NULL */
    int stop_token;   /* the stop token that ended it, or -1 */
    /* with logprobs N: per output token its log-probability (lp) and the
     * top N (top_id, top_lp: N per token) */
    float *lp, *top_lp;
    int *top_id;
    /* with prompt_logprobs N: the same per prompt token (position 0, which
     * nothing predicts, is NaN) */
    float *plp, *ptop_lp;
    int *ptop_id;
} Result;
void results_free(Result *res, int n);
/* Grows res's token arrays (and logprob arrays, for N >= 0) to hold one more. */
void result_reserve(Result *res, int logprobs);
/* A result as bytes (tokens, times, finish, text, stop, log-probabilities),
 * appended to *buf (size *n, capacity *cap), to move it between ranks;
 * result_unpack reads one back from p (q: its request) and returns the
 * bytes read. */
void result_pack(const Result *r, const Request *q, char **buf, size_t *n, size_t *cap);
size_t result_unpack(Result *r, const Request *q, const char *p);
/* Allocates the prompt log-probability arrays of n positions (NaN, ids -1). */
void result_prompt_logprobs(Result *res, int n, int top);

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
/* A deep copy of src (n > 1 makes one per sequence). */
void request_copy(Request *dst, const Request *src);
/* The most sequences one line may ask for ("n") */
#define MAX_CHOICES 128

#endif
