#include "requests.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void request_fail(Request *r, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    free(r->error);
    r->error = xstrdup(buf);
}

static int int_array(json_t *a, int **out, int *n, const char *field, char *why, size_t wn)
{
    if (!json_is_array(a)) {
        snprintf(why, wn, "wrong field type: \"%s\" must be an array of integers", field);
        return -1;
    }
    size_t i;
    json_t *e;
    *n = (int)json_array_size(a);
    *out = xmalloc(sizeof(int) * (size_t)(*n ? *n : 1));
    json_array_foreach(a, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < INT32_MIN || json_integer_value(e) > INT32_MAX) {
            snprintf(why, wn, "wrong field type: \"%s\"[%zu] is not a 32-bit integer", field, i);
            free(*out);
            *out = NULL;
            return -1;
        }
        (*out)[i] = (int)json_integer_value(e);
    }
    return 0;
}

/* The fields each kind of object may hold; anything else is refused, so
 * that a misspelled field cannot pass silently. */
#define SAMPLING_KEYS                                                                                         \
    "prompt", "prompt_token_ids", "max_tokens", "temperature", "top_p", "seed", "stop_token_ids", "stop",         \
        "include_stop_str_in_output", "ignore_eos", "min_tokens", "logprobs", "prompt_logprobs",                  \
        "skip_special_tokens", "max_completion_tokens", "n", "stream", "user", "top_k", "min_p",                 \
        "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"
/* a chat request's conversation and the chat template's options */
#define CHAT_KEYS "messages", "add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools", \
        "tool_choice"
static const char *plain_keys[] = {"id", SAMPLING_KEYS, CHAT_KEYS, NULL};
/* an OpenAI batch body: the same request fields; "model" names the model
 * the line was written for (the run's model is --model) */
static const char *body_keys[] = {"model", SAMPLING_KEYS, NULL};
/* a /v1/chat/completions body: the conversation, the chat template's
 * options, and the sampling fields without the prompt (logprobs is a
 * boolean there, with top_logprobs its count) */
static const char *chat_body_keys[] = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature",
                                       "top_p", "seed", "stop", "stop_token_ids", "include_stop_str_in_output",
                                       "ignore_eos", "min_tokens", "logprobs", "top_logprobs", "skip_special_tokens",
                                       "n", "stream", "user", "add_generation_prompt", "continue_final_message",
                                       "chat_template_kwargs", "tools", "tool_choice", "top_k", "min_p",
                                       "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                                       NULL};
static const char *batch_keys[] = {"custom_id", "method", "url", "body", NULL};

/* The edit distance of a and b (insertions, deletions, substitutions and
 * swaps of neighbours), up to 64 characters each. */
static int edit_distance(const char *a, const char *b)
{
    int n = (int)strlen(a), m = (int)strlen(b);
    if (n > 64 || m > 64) return 99;
    int d[65][65];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

static int check_keys(json_t *o, const char *const *keys, const char *where, char *why, size_t wn)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        int known = 0;
        for (int i = 0; keys[i] && !known; i++) known = !strcmp(k, keys[i]);
        if (known) continue;
        /* the closest known field, when a typo away */
        const char *near = NULL;
        int best = 3;
        for (int i = 0; keys[i]; i++) {
            int dist = edit_distance(k, keys[i]);
            if (dist < best) best = dist, near = keys[i];
        }
        if (near) snprintf(why, wn, "unknown field \"%s\"%s (did you mean \"%s\"?)", k, where, near);
        else snprintf(why, wn, "unknown field \"%s\"%s", k, where);
        return -1;
    }
    return 0;
}

/* "stop": a string or a list of them, none empty. */
static int parse_stop(json_t *v, Request *r, char *why, size_t wn)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_string(v) && !json_is_array(v)) {
        snprintf(why, wn, "wrong field type: \"stop\" must be a string or an array of strings");
        return -1;
    }
    r->stop = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(e) || !json_string_length(e)) {
            snprintf(why, wn, "\"stop\"[%zu] must be a non-empty string", i);
            return -1;
        }
        r->stop[r->n_stop_str++] = xstrdup(json_string_value(e));
    }
    return 0;
}

/* top_k, min_p, the penalties and logit_bias, with vLLM's (and OpenAI's)
 * ranges */
static int parse_sampling_extra(json_t *o, Request *r, char *why, size_t wn)
{
    json_t *v;
    if ((v = json_object_get(o, "top_k")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > INT32_MAX) {
            snprintf(why, wn, "\"top_k\" must be -1 or 0 (off) or a positive integer");
            return -1;
        }
        r->x.top_k = json_integer_value(v) < 0 ? 0 : (int)json_integer_value(v);
    }
    static const struct {
        const char *name;
        double lo, hi;
        int lo_open;
    } ranges[] = {{"min_p", 0, 1, 0},
                  {"presence_penalty", -2, 2, 0},
                  {"frequency_penalty", -2, 2, 0},
                  {"repetition_penalty", 0, 2e9, 1}};
    float *dst[] = {&r->x.min_p, &r->x.presence_penalty, &r->x.frequency_penalty, &r->x.repetition_penalty};
    for (int k = 0; k < 4; k++)
        if ((v = json_object_get(o, ranges[k].name)) && !json_is_null(v)) {
            double x = json_is_number(v) ? json_number_value(v) : NAN;
            if (!(x >= ranges[k].lo && x <= ranges[k].hi) || (ranges[k].lo_open && x == ranges[k].lo)) {
                if (k == 3) snprintf(why, wn, "\"repetition_penalty\" must be a number above 0 (1: off)");
                else snprintf(why, wn, "\"%s\" must be a number in [%g, %g]", ranges[k].name, ranges[k].lo, ranges[k].hi);
                return -1;
            }
            *dst[k] = (float)x;
        }
    if ((v = json_object_get(o, "logit_bias")) && !json_is_null(v)) {
        if (!json_is_object(v)) {
            snprintf(why, wn, "wrong field type: \"logit_bias\" must be an object of token ids (as strings) to numbers");
            return -1;
        }
        size_t n = json_object_size(v);
        r->bias_ids = xmalloc(sizeof(int) * (n + 1));
        r->bias = xmalloc(sizeof(float) * (n + 1));
        const char *key;
        json_t *b;
        json_object_foreach(v, key, b)
        {
            char *end;
            long id = strtol(key, &end, 10);
            if (!*key || *end || id < 0 || id >= 1 << 24) {
                snprintf(why, wn, "\"logit_bias\": \"%.40s\" is not a token id", key);
                return -1;
            }
            if (!json_is_number(b) || !(json_number_value(b) >= -100 && json_number_value(b) <= 100)) {
                snprintf(why, wn, "\"logit_bias\" of token %ld must be a number in [-100, 100]", id);
                return -1;
            }
            r->bias_ids[r->n_bias] = (int)id, r->bias[r->n_bias++] = (float)json_number_value(b);
        }
    }
    return 0;
}

/* Fills r from a request object (plain line, or an OpenAI body). */
static int parse_fields(json_t *o, Request *r, const char *const *keys, const char *where, char *why, size_t wn)
{
    if (check_keys(o, keys, where, why, wn)) return -1;
    json_t *p = json_object_get(o, "prompt"), *ids = json_object_get(o, "prompt_token_ids"),
           *messages = json_object_get(o, "messages");
    if (messages && (p || ids)) {
        snprintf(why, wn, "give \"messages\" or a prompt (\"prompt\", \"prompt_token_ids\"), not both");
        return -1;
    }
    if (messages) { /* rendered once the chat template is known */
        static const char *const chat_keys[] = {CHAT_KEYS, NULL};
        json_t *chat = json_object();
        for (int k = 0; chat_keys[k]; k++)
            if (json_object_get(o, chat_keys[k])) json_object_set(chat, chat_keys[k], json_object_get(o, chat_keys[k]));
        r->chat = json_dumps(chat, JSON_COMPACT);
        json_decref(chat);
        r->thinking_off = json_is_false(json_object_get(json_object_get(o, "chat_template_kwargs"), "thinking"));
    } else if (p && ids) {
        snprintf(why, wn, "give either \"prompt\" or \"prompt_token_ids\", not both");
        return -1;
    }
    if (!p && !ids && !messages) {
        snprintf(why, wn, "missing \"prompt\", \"prompt_token_ids\" or \"messages\"");
        return -1;
    }
    if (messages) {
    } else if (p && json_is_string(p)) {
        r->prompt = xstrdup(json_string_value(p));
    } else if (p && json_is_array(p)) { /* OpenAI completions also take token ids as "prompt" */
        if (int_array(p, &r->prompt_tokens, &r->n_prompt, "prompt", why, wn)) return -1;
    } else if (p) {
        snprintf(why, wn, "wrong field type: \"prompt\" must be a string or an array of token ids");
        return -1;
    } else if (int_array(ids, &r->prompt_tokens, &r->n_prompt, "prompt_token_ids", why, wn)) {
        return -1;
    }
    if (!r->prompt && !r->chat && r->n_prompt == 0) {
        snprintf(why, wn, "empty token id list");
        return -1;
    }
    json_t *v, *mt = json_object_get(o, "max_tokens"), *mct = json_object_get(o, "max_completion_tokens");
    /* fields OpenAI clients write that change nothing here: no streaming,
     * and an end user's name */
    if ((v = json_object_get(o, "n")) && !json_is_null(v)) { /* n sequences: the request is copied n - 1 times */
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > MAX_CHOICES) {
            snprintf(why, wn, "\"n\" must be an integer in [1, %d]", MAX_CHOICES);
            return -1;
        }
        r->n_choices = (int)json_integer_value(v);
    }
    if ((v = json_object_get(o, "stream")) && !json_is_null(v) && !json_is_false(v)) {
        snprintf(why, wn, "\"stream\" must be false: a batch's results are written when it ends");
        return -1;
    }
    if ((v = json_object_get(o, "user")) && !json_is_null(v) && !json_is_string(v)) {
        snprintf(why, wn, "wrong field type: \"user\" must be a string");
        return -1;
    }
    /* max_completion_tokens: the newer OpenAI name of max_tokens */
    if (mt && mct && !json_is_null(mt) && !json_is_null(mct) && !json_equal(mt, mct)) {
        snprintf(why, wn, "\"max_tokens\" and \"max_completion_tokens\" differ; give one");
        return -1;
    }
    if ((v = mt && !json_is_null(mt) ? mt : mct) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX) {
            snprintf(why, wn, "\"%s\" must be an integer from 1 to 2147483647",
                     v == mt ? "max_tokens" : "max_completion_tokens");
            return -1;
        }
        r->max_tokens = (int)json_integer_value(v);
    }
    if ((v = json_object_get(o, "temperature")) && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 1e6)) {
            snprintf(why, wn, "\"temperature\" must be a number in [0, 1e6]");
            return -1;
        }
        r->temperature = request_temperature(json_number_value(v));
    }
    if ((v = json_object_get(o, "top_p")) && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) > 0 && json_number_value(v) <= 1)) {
            snprintf(why, wn, "\"top_p\" must be a number in (0, 1]");
            return -1;
        }
        /* a positive top_p too small for a float still keeps only the most
         * likely token, not "no top-p" */
        r->top_p = fmaxf((float)json_number_value(v), FLT_MIN);
    }
    if (parse_sampling_extra(o, r, why, wn)) return -1;
    if ((v = json_object_get(o, "seed")) && !json_is_null(v)) {
        if (!json_is_integer(v)) {
            snprintf(why, wn, "wrong field type: \"seed\" must be an integer");
            return -1;
        }
        r->seed = (uint64_t)json_integer_value(v);
    }
    if ((v = json_object_get(o, "stop_token_ids")) && !json_is_null(v))
        if (int_array(v, &r->stop_ids, &r->n_stop, "stop_token_ids", why, wn)) return -1;
    if ((v = json_object_get(o, "stop")) && !json_is_null(v) && parse_stop(v, r, why, wn)) return -1;
    static const char *flags[] = {"include_stop_str_in_output", "ignore_eos", "skip_special_tokens"};
    int *flag_of[] = {&r->include_stop_str, &r->ignore_eos, &r->skip_special};
    for (int k = 0; k < 3; k++)
        if ((v = json_object_get(o, flags[k])) && !json_is_null(v)) {
            if (!json_is_boolean(v)) {
                snprintf(why, wn, "wrong field type: \"%s\" must be true or false", flags[k]);
                return -1;
            }
            *flag_of[k] = json_is_true(v);
        }
    if (r->chat_api) { /* chat: "logprobs": true, and "top_logprobs" alternatives per token */
        json_t *lp = json_object_get(o, "logprobs"), *top = json_object_get(o, "top_logprobs");
        if (lp && !json_is_null(lp) && !json_is_boolean(lp)) {
            snprintf(why, wn, "wrong field type: \"logprobs\" must be true or false in a chat request");
            return -1;
        }
        if (top && !json_is_null(top) &&
            (!json_is_integer(top) || json_integer_value(top) < 0 || json_integer_value(top) > MAX_LOGPROBS)) {
            snprintf(why, wn, "\"top_logprobs\" must be an integer in [0, %d]", MAX_LOGPROBS);
            return -1;
        }
        if (top && !json_is_null(top) && !json_is_true(lp)) {
            snprintf(why, wn, "\"top_logprobs\" needs \"logprobs\": true");
            return -1;
        }
        if (json_is_true(lp)) r->logprobs = top && !json_is_null(top) ? (int)json_integer_value(top) : 0;
    }
    const char *counts[] = {"min_tokens", r->chat_api ? "" : "logprobs", "prompt_logprobs"};
    int *count_of[] = {&r->min_tokens, &r->logprobs, &r->prompt_logprobs};
    int limit[] = {INT32_MAX, MAX_LOGPROBS, MAX_LOGPROBS};
    for (int k = 0; k < 3; k++)
        if ((v = json_object_get(o, counts[k])) && !json_is_null(v)) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > limit[k]) {
                snprintf(why, wn, "\"%s\" must be an integer in [0, %d]", counts[k], limit[k]);
                return -1;
            }
            *count_of[k] = (int)json_integer_value(v);
        }
    if (r->min_tokens > r->max_tokens) {
        snprintf(why, wn, "\"min_tokens\" (%d) is above \"max_tokens\" (%d)", r->min_tokens, r->max_tokens);
        return -1;
    }
    return 0;
}

float request_temperature(double t) { return t < TEMPERATURE_GREEDY_BELOW ? 0.0f : (float)t; }

static char *id_text(json_t *v)
{
    char buf[64];
    if (json_is_string(v)) return xstrdup(json_string_value(v));
    snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
    return xstrdup(buf);
}

/* One line into r; chat_max_tokens (when nonzero) is the max_tokens of an
 * OpenAI chat completion body that gives none */
static int parse_line(json_t *o, Request *r, int chat_max_tokens, char *why, size_t wn)
{
    if (!json_is_object(o)) {
        snprintf(why, wn, "a request must be a JSON object");
        return -1;
    }
    json_t *body = json_object_get(o, "body");
    json_t *idv = json_object_get(o, body ? "custom_id" : "id");
    if (idv && !json_is_string(idv) && !json_is_integer(idv)) {
        snprintf(why, wn, "wrong field type: \"%s\" must be a string or an integer", body ? "custom_id" : "id");
        return -1;
    }
    if (idv) r->id = id_text(idv);
    if (body) {
        if (!json_is_object(body)) {
            snprintf(why, wn, "wrong field type: \"body\" must be an object");
            return -1;
        }
        json_t *url = json_object_get(o, "url");
        const char *u = json_string_value(url);
        if (url && (!u || (strcmp(u, "/v1/completions") && strcmp(u, "/v1/chat/completions")))) {
            snprintf(why, wn, "\"url\" must be \"/v1/completions\" or \"/v1/chat/completions\"");
            return -1;
        }
        if (check_keys(o, batch_keys, " (OpenAI batch line)", why, wn)) return -1;
        r->batch = 1;
        r->chat_api = u && !strcmp(u, "/v1/chat/completions");
        if (!r->chat_api && json_object_get(body, "messages")) {
            snprintf(why, wn, "\"messages\" in a \"/v1/completions\" body: chat requests go to \"url\": "
                              "\"/v1/chat/completions\"");
            return -1;
        }
        if (r->chat_api && !json_object_get(body, "messages")) {
            snprintf(why, wn, "a \"/v1/chat/completions\" body needs \"messages\"");
            return -1;
        }
        if (r->chat_api && chat_max_tokens) r->max_tokens = chat_max_tokens;
        return parse_fields(body, r, r->chat_api ? chat_body_keys : body_keys, " in \"body\"", why, wn);
    }
    return parse_fields(o, r, plain_keys, "", why, wn);
}

/* Request ids seen so far: an open-addressing hash set of request indices,
 * so that checking 100,000 ids for duplicates is linear. */
typedef struct {
    int *slot; /* request index + 1; 0 is empty */
    size_t cap, n;
} IdSet;

/* Returns the index of an earlier request with r's id, or -1 after adding it. */
static int idset_add(IdSet *ids, const RequestSet *set, int index)
{
    if (2 * (ids->n + 1) > ids->cap) {
        IdSet grown = {xcalloc(ids->cap ? 2 * ids->cap : 256, sizeof(int)), ids->cap ? 2 * ids->cap : 256, 0};
        for (size_t i = 0; i < ids->cap; i++)
            if (ids->slot[i]) idset_add(&grown, set, ids->slot[i] - 1);
        free(ids->slot);
        *ids = grown;
    }
    const char *id = set->r[index].id;
    for (size_t i = fnv1a(FNV_START, id, strlen(id)) & (ids->cap - 1);; i = (i + 1) & (ids->cap - 1)) {
        if (!ids->slot[i]) {
            ids->slot[i] = index + 1;
            ids->n++;
            return -1;
        }
        if (!strcmp(set->r[ids->slot[i] - 1].id, id)) return ids->slot[i] - 1;
    }
}

static int *dup_ints(const int *a, int n)
{
    if (!a) return NULL;
    int *d = xmalloc(sizeof(int) * ((size_t)n + 1));
    memcpy(d, a, sizeof(int) * (size_t)n);
    return d;
}

void request_copy(Request *dst, const Request *src)
{
    *dst = *src;
    dst->id = xstrdup(src->id);
    dst->prompt = src->prompt ? xstrdup(src->prompt) : NULL;
    dst->chat = src->chat ? xstrdup(src->chat) : NULL;
    dst->prompt_tokens = dup_ints(src->prompt_tokens, src->n_prompt);
    dst->stop_ids = dup_ints(src->stop_ids, src->n_stop);
    dst->bias_ids = dup_ints(src->bias_ids, src->n_bias);
    if (src->bias) {
        dst->bias = xmalloc(sizeof(float) * ((size_t)src->n_bias + 1));
        memcpy(dst->bias, src->bias, sizeof(float) * (size_t)src->n_bias);
    }
    if (src->stop) {
        dst->stop = xcalloc((size_t)src->n_stop_str + 1, sizeof(char *));
        for (int k = 0; k < src->n_stop_str; k++) dst->stop[k] = xstrdup(src->stop[k]);
    }
    dst->error = src->error ? xstrdup(src->error) : NULL;
}

int requests_parse(const char *path, const char *data, size_t size, const RequestDefaults *d, int skip_invalid,
                   RequestSet *set)
{
    IdSet ids = {0};
    memset(set, 0, sizeof *set);
    set->path = xstrdup(path);
    int lineno = 0, cap_r = 0, rc = 0;
    for (size_t start = 0, len; start < size; start += len) {
        const char *line = data + start, *nl = memchr(line, '\n', size - start);
        len = nl ? (size_t)(nl - line) + 1 : size - start;
        lineno++;
        size_t i = 0;
        while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) i++;
        if (i == len) continue; /* blank line */
        if (set->n == cap_r) set->r = xrealloc(set->r, sizeof(Request) * (size_t)(cap_r = cap_r ? 2 * cap_r : 64));
        Request *r = &set->r[set->n++];
        memset(r, 0, sizeof *r);
        r->line = lineno;
        r->max_tokens = d->max_tokens;
        r->temperature = d->temperature;
        r->top_p = d->top_p;
        r->x = d->x;
        r->logprobs = r->prompt_logprobs = -1;
        r->skip_special = 1;
        r->n_choices = 1;
        /* a request without a seed gets one from the run seed and its line,
         * so its samples do not depend on the other requests */
        uint64_t s = d->seed ^ ((uint64_t)lineno * 0x9E3779B97F4A7C15ull);
        r->seed = splitmix64(&s);
        char why[400] = "";
        json_error_t jerr;
        const char *nul = memchr(line, '\0', len);
        json_t *o = nul ? NULL : json_loadb(line, len, 0, &jerr);
        if (nul) snprintf(why, sizeof why, "a NUL byte at column %ld (binary data in the prompt file?)",
                          (long)(nul - line) + 1);
        else if (!o && strstr(jerr.text, "\\u0000")) /* the JSON library's words name its own flag */
            snprintf(why, sizeof why, "a \\u0000 (NUL) character in a string at column %d: prompts and texts cannot "
                                      "hold one", jerr.column);
        else if (!o) snprintf(why, sizeof why, "invalid JSON: %s (column %d)", jerr.text, jerr.column);
        else parse_line(o, r, d->chat_max_tokens, why, sizeof why);
        json_decref(o);
        if (!r->id) {
            char buf[32];
            snprintf(buf, sizeof buf, "line-%d", lineno);
            r->id = xstrdup(buf);
        }
        int first = why[0] ? -1 : idset_add(&ids, set, set->n - 1);
        if (first >= 0)
            snprintf(why, sizeof why, "duplicate id \"%s\" (first on line %d)", r->id, set->r[first].line);
        if (why[0]) {
            request_fail(r, "%s:%d: %s", path, lineno, why);
            r->n_choices = 1;
            if (!skip_invalid) {
                rc = dcp_fail("%s", r->error);
                break;
            }
        }
        /* n > 1: the other sequences, each a request of its own with a seed
         * derived from the first's (which draws as with n = 1) */
        int at = set->n - 1, copies = set->r[at].n_choices;
        for (int k = 1; k < copies; k++) {
            if (set->n == cap_r) set->r = xrealloc(set->r, sizeof(Request) * (size_t)(cap_r *= 2));
            Request *c = &set->r[set->n++];
            request_copy(c, &set->r[at]);
            c->choice = k;
            uint64_t st = set->r[at].seed ^ ((uint64_t)k * 0xD1B54A32D192ED03ull);
            c->seed = splitmix64(&st);
        }
    }
    free(ids.slot);
    int plain = 0;
    for (int i = 0; i < set->n; i++) {
        set->batch += set->r[i].batch;
        plain += !set->r[i].batch && !set->r[i].error;
    }
    set->batch = set->batch > 0 && !plain;
    if (rc == 0 && set->n == 0) rc = dcp_fail("%s: no requests (the prompt file is empty)", path);
    if (rc) requests_free(set);
    return rc;
}

int requests_read(const char *path, const RequestDefaults *d, int skip_invalid, RequestSet *set)
{
    char *data;
    size_t size;
    memset(set, 0, sizeof *set);
    if (read_file(path, &data, &size)) return -1;
    int rc = requests_parse(path, data, size, d, skip_invalid, set);
    free(data);
    return rc;
}

/* The first of ids[0..n) outside [0, vocab) fails r, naming field: an id
 * the model cannot give or read is a mistake. -1 when the run stops there. */
static int ids_in_vocab(const RequestSet *set, Request *r, const int *ids, int n, const char *field, int vocab,
                        int skip_invalid)
{
    for (int j = 0; j < n && !r->error; j++) {
        if (ids[j] >= 0 && ids[j] < vocab) continue;
        request_fail(r, "%s:%d: \"%s\" names token %d, outside the vocabulary [0, %d)", set->path, r->line, field,
                     ids[j], vocab);
        if (!skip_invalid) return dcp_fail("%s", r->error);
    }
    return 0;
}

int requests_check_vocab(RequestSet *set, int vocab, int skip_invalid)
{
    for (int i = 0; i < set->n; i++) {
        Request *r = &set->r[i];
        if (r->error) continue;
        if (ids_in_vocab(set, r, r->stop_ids, r->n_stop, "stop_token_ids", vocab, skip_invalid) ||
            ids_in_vocab(set, r, r->bias_ids, r->n_bias, "logit_bias", vocab, skip_invalid))
            return -1;
        if (r->error || r->prompt || r->chat) continue;
        for (int j = 0; j < r->n_prompt; j++) {
            if (r->prompt_tokens[j] >= 0 && r->prompt_tokens[j] < vocab) continue;
            request_fail(r, "%s:%d: token id %d at position %d is outside the vocabulary [0, %d)", set->path,
                         r->line, r->prompt_tokens[j], j, vocab);
            if (!skip_invalid) return dcp_fail("%s", r->error);
            break;
        }
    }
    return 0;
}

void requests_free(RequestSet *set)
{
    for (int i = 0; i < set->n; i++) {
        Request *r = &set->r[i];
        free(r->id);
        free(r->prompt);
        free(r->chat);
        free(r->prompt_tokens);
        free(r->stop_ids);
        free(r->bias_ids);
        free(r->bias);
        for (int k = 0; k < r->n_stop_str; k++) free(r->stop[k]);
        free(r->stop);
        free(r->error);
    }
    free(set->r);
    free(set->path);
    memset(set, 0, sizeof *set);
}

void results_free(Result *res, int n)
{
    for (int i = 0; i < n; i++) {
        Result *r = &res[i];
        void *blocks[] = {r->tokens, r->times, r->text, r->stop_str, r->lp, r->top_lp, r->top_id,
                          r->plp, r->ptop_lp, r->ptop_id};
        for (size_t k = 0; k < sizeof blocks / sizeof *blocks; k++) free(blocks[k]);
    }
}

void result_reserve(Result *r, int logprobs)
{
    if (r->n < r->cap && (logprobs < 0 || r->lp)) return;
    int cap = r->n < r->cap ? r->cap : r->cap ? 2 * r->cap : 16;
    size_t k = logprobs > 0 ? (size_t)logprobs : 0;
    r->tokens = xrealloc(r->tokens, sizeof(int) * (size_t)cap);
    r->times = xrealloc(r->times, sizeof(double) * (size_t)cap);
    if (logprobs >= 0) {
        r->lp = xrealloc(r->lp, sizeof(float) * (size_t)cap);
        r->top_lp = xrealloc(r->top_lp, sizeof(float) * (size_t)cap * k + 1);
        r->top_id = xrealloc(r->top_id, sizeof(int) * (size_t)cap * k + 1);
    }
    r->cap = cap;
}

void result_prompt_logprobs(Result *r, int n, int top)
{
    if (r->plp) return;
    size_t k = (size_t)n * (size_t)(top > 0 ? top : 0);
    r->plp = xmalloc(sizeof(float) * (size_t)(n + 1));
    r->ptop_lp = xmalloc(sizeof(float) * (k + 1));
    r->ptop_id = xmalloc(sizeof(int) * (k + 1));
    for (int i = 0; i < n; i++) r->plp[i] = NAN;
    for (size_t i = 0; i < k; i++) {
        r->ptop_lp[i] = NAN;
        r->ptop_id[i] = -1;
    }
}

static const char *finish_reasons[] = {"stop", "length", "error"};

static void put(char **buf, size_t *n, size_t *cap, const void *p, size_t len)
{
    if (*n + len > *cap) *buf = xrealloc(*buf, *cap = 2 * (*n + len) + 256);
    if (len) memcpy(*buf + *n, p, len);
    *n += len;
}

void result_pack(const Result *r, const Request *q, char **buf, size_t *n, size_t *cap)
{
    int fin = -1;
    for (int k = 0; k < 3; k++)
        if (r->finish_reason && !strcmp(r->finish_reason, finish_reasons[k])) fin = k;
    int has_text = r->text != NULL, stop_len = r->stop_str ? (int)strlen(r->stop_str) : -1;
    int lp = r->lp ? q->logprobs : -1, plp = r->plp ? q->prompt_logprobs : -1;
    int head[10] = {r->n, fin, r->stop_token, has_text, stop_len, lp, plp, r->num_cached_tokens,
                    r->spec_draft_tokens, r->spec_accepted_tokens};
    double t[3] = {r->ttft_s, r->tpot_s, r->e2e_s};
    size_t len = r->text_len, tokens = (size_t)r->n, np = (size_t)q->n_prompt;
    put(buf, n, cap, head, sizeof head);
    put(buf, n, cap, t, sizeof t);
    put(buf, n, cap, &len, sizeof len);
    if (has_text) put(buf, n, cap, r->text, len);
    if (stop_len > 0) put(buf, n, cap, r->stop_str, (size_t)stop_len);
    put(buf, n, cap, r->tokens, sizeof(int) * tokens);
    put(buf, n, cap, r->times, sizeof(double) * tokens);
    if (lp >= 0) {
        put(buf, n, cap, r->lp, sizeof(float) * tokens);
        put(buf, n, cap, r->top_lp, sizeof(float) * tokens * (size_t)lp);
        put(buf, n, cap, r->top_id, sizeof(int) * tokens * (size_t)lp);
    }
    if (plp >= 0) {
        put(buf, n, cap, r->plp, sizeof(float) * np);
        put(buf, n, cap, r->ptop_lp, sizeof(float) * np * (size_t)plp);
        put(buf, n, cap, r->ptop_id, sizeof(int) * np * (size_t)plp);
    }
}

static void *take(const char **p, size_t len, size_t extra)
{
    void *v = xmalloc(len + extra);
    if (len) memcpy(v, *p, len);
    *p += len;
    return v;
}

size_t result_unpack(Result *r, const Request *q, const char *p)
{
    const char *p0 = p;
    int head[10];
    double t[3];
    size_t len;
    memcpy(head, p, sizeof head);
    memcpy(t, p + sizeof head, sizeof t);
    memcpy(&len, p + sizeof head + sizeof t, sizeof len);
    p += sizeof head + sizeof t + sizeof len;
    results_free(r, 1);
    memset(r, 0, sizeof *r);
    size_t tokens = (size_t)head[0], np = (size_t)q->n_prompt;
    int lp = head[5], plp = head[6];
    r->n = r->cap = head[0];
    r->finish_reason = head[1] >= 0 ? finish_reasons[head[1]] : NULL;
    r->stop_token = head[2];
    r->num_cached_tokens = head[7];
    r->spec_draft_tokens = head[8];
    r->spec_accepted_tokens = head[9];
    r->ttft_s = t[0], r->tpot_s = t[1], r->e2e_s = t[2];
    if (head[3]) {
        r->text = take(&p, len, 1);
        r->text[len] = '\0';
        r->text_len = r->text_cap = len;
    }
    if (head[4] >= 0) {
        r->stop_str = take(&p, (size_t)head[4], 1);
        r->stop_str[head[4]] = '\0';
    }
    r->tokens = take(&p, sizeof(int) * tokens, sizeof(int));
    r->times = take(&p, sizeof(double) * tokens, sizeof(double));
    if (lp >= 0) {
        r->lp = take(&p, sizeof(float) * tokens, sizeof(float));
        r->top_lp = take(&p, sizeof(float) * tokens * (size_t)lp, sizeof(float));
        r->top_id = take(&p, sizeof(int) * tokens * (size_t)lp, sizeof(int));
    }
    if (plp >= 0) {
        r->plp = take(&p, sizeof(float) * np, sizeof(float));
        r->ptop_lp = take(&p, sizeof(float) * np * (size_t)plp, sizeof(float));
        r->ptop_id = take(&p, sizeof(int) * np * (size_t)plp, sizeof(int));
    }
    return (size_t)(p - p0);
}
