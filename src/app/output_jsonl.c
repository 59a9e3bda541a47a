/* Results as JSON Lines (docs/output.md, "JSON Lines results"). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "durable.h"
#include "hftok.h"
#include "output.h"
#include "reasoning.h"
#include "util.h"

/* How a token reads in log-probabilities: its own text, or "token_id:N"
 * without a tokenizer (as vLLM spells ids). */
static json_t *token_text(const Tokenizer *tok, int bos, int id)
{
    char buf[32];
    if (!tok) {
        snprintf(buf, sizeof buf, "token_id:%d", id);
        return json_string(buf);
    }
    size_t n, m;
    char *raw = tokenizer_decode_span(tok, -1, &id, 1, bos, 0, &n);
    char *s = hftok_utf8_lossy(raw, n, &m);
    json_t *v = json_stringn(s, m);
    free(raw);
    free(s);
    return v;
}

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; s && *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static json_t *real_or_null(float x) { return isfinite(x) ? json_real(x) : json_null(); }

/* A token in the chat API's logprobs: {"token", "logprob", "bytes"} (the
 * UTF-8 bytes of its text) */
static json_t *chat_token(const Tokenizer *tok, int bos, int id, float lp)
{
    json_t *e = json_object(), *t = token_text(tok, bos, id), *bytes = json_array();
    const unsigned char *s = (const unsigned char *)json_string_value(t);
    for (size_t i = 0; i < json_string_length(t); i++) json_array_append_new(bytes, json_integer(s[i]));
    json_object_set_new(e, "token", t);
    json_object_set_new(e, "logprob", real_or_null(lp));
    json_object_set_new(e, "bytes", bytes);
    return e;
}

/* One position's entry in dcpinfer's own form:
 * {"token_id", "token", "logprob", "top_logprobs": [{"token_id", "token", "logprob"}, ...]} */
static json_t *position_json(const Tokenizer *tok, int bos, int id, float lp, const int *top_id, const float *top_lp,
                             int k)
{
    json_t *o = json_object(), *top = json_array();
    json_object_set_new(o, "token_id", json_integer(id));
    json_object_set_new(o, "token", token_text(tok, bos, id));
    json_object_set_new(o, "logprob", real_or_null(lp));
    for (int j = 0; j < k && top_id[j] >= 0; j++) {
        json_t *e = json_object();
        json_object_set_new(e, "token_id", json_integer(top_id[j]));
        json_object_set_new(e, "token", token_text(tok, bos, top_id[j]));
        json_object_set_new(e, "logprob", real_or_null(top_lp[j]));
        json_array_append_new(top, e);
    }
    json_object_set_new(o, "top_logprobs", top);
    return o;
}

/* vLLM's stop_reason: the stop string, or the stop_token_ids entry, that
 * ended the request; null otherwise (EOS included) */
static json_t *stop_reason(const Config *c, const Result *r)
{
    if (r->stop_str) return json_string(r->stop_str);
    if (r->stop_token < 0) return json_null();
    for (int i = 0; i < c->n_eos; i++)
        if (r->stop_token == c->eos_ids[i]) return json_null();
    return json_integer(r->stop_token);
}

static json_t *usage(const RunInfo *in, const Request *q, const Result *r)
{
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(q->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(r->n));
    json_object_set_new(u, "total_tokens", json_integer(q->n_prompt + r->n));
    json_t *details = json_object(); /* as OpenAI names the prompt tokens served from a cache */
    json_object_set_new(details, "cached_tokens", json_integer(r->num_cached_tokens));
    json_object_set_new(u, "prompt_tokens_details", details);
    if (in->speculative_config) { /* tokens drafted for it, and those its outputs kept */
        json_object_set_new(u, "spec_draft_tokens", json_integer(r->spec_draft_tokens));
        json_object_set_new(u, "spec_accepted_tokens", json_integer(r->spec_accepted_tokens));
    }
    return u;
}

static json_t *own_line(const RunInfo *in, const Request *q, const Result *r, const char *text, const Tokenizer *tok)
{
    int bos = in->cfg->bos_id;
    json_t *o = json_object(), *ids = json_array();
    for (int j = 0; j < r->n; j++) json_array_append_new(ids, json_integer(r->tokens[j]));
    json_object_set_new(o, "id", json_string(q->id));
    json_object_set_new(o, "text", json_string(text));
    if (in->reasoning_parser != REASONING_NONE) { /* the text's two parts; null where the parser finds none */
        TextSpan s[2];
        reasoning_split(in->reasoning_parser, text, strlen(text), q->thinking_off, &s[0], &s[1]);
        json_object_set_new(o, "reasoning_content", s[0].n >= 0 ? json_stringn(s[0].p, (size_t)s[0].n) : json_null());
        json_object_set_new(o, "content", s[1].n >= 0 ? json_stringn(s[1].p, (size_t)s[1].n) : json_null());
    }
    json_object_set_new(o, "token_ids", ids);
    json_object_set_new(o, "finish_reason", json_string(r->finish_reason ? r->finish_reason : "error"));
    json_object_set_new(o, "stop_reason", stop_reason(in->cfg, r));
    json_object_set_new(o, "usage", usage(in, q, r));
    if (r->lp) {
        json_t *a = json_array();
        for (int j = 0; j < r->n; j++)
            json_array_append_new(a, position_json(tok, bos, r->tokens[j], r->lp[j], r->top_id + (size_t)j * q->logprobs,
                                                   r->top_lp + (size_t)j * q->logprobs, q->logprobs));
        json_object_set_new(o, "logprobs", a);
    }
    if (r->plp) {
        json_t *a = json_array();
        json_array_append_new(a, json_null()); /* nothing predicts the first prompt token */
        for (int j = 1; j < q->n_prompt; j++)
            json_array_append_new(a, position_json(tok, bos, q->prompt_tokens[j], r->plp[j],
                                                   r->ptop_id + (size_t)j * q->prompt_logprobs,
                                                   r->ptop_lp + (size_t)j * q->prompt_logprobs, q->prompt_logprobs));
        json_object_set_new(o, "prompt_logprobs", a);
    }
    json_t *m = json_object();
    json_object_set_new(m, "ttft_s", json_real(r->ttft_s));
    json_object_set_new(m, "tpot_s", json_real(r->tpot_s));
    json_object_set_new(m, "e2e_s", json_real(r->e2e_s));
    json_object_set_new(o, "metrics", m);
    json_object_set_new(o, "error", q->error ? json_string(q->error) : json_null());
    return o;
}

/* The completions API's logprobs object: tokens, token_logprobs,
 * top_logprobs (token text to log-probability) and text_offset. */
static json_t *completion_logprobs(const RunInfo *in, const Request *q, const Result *r, const Tokenizer *tok)
{
    int bos = in->cfg->bos_id, k = q->logprobs;
    json_t *o = json_object(), *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    long offset = 0;
    for (int j = 0; j < r->n; j++) {
        json_t *t = token_text(tok, bos, r->tokens[j]);
        json_array_append_new(offs, json_integer(offset));
        offset += (long)utf8_chars(json_string_value(t));
        json_array_append_new(toks, t);
        json_array_append_new(lps, real_or_null(r->lp[j]));
        json_t *top = json_object();
        for (int i = 0; i < k && r->top_id[(size_t)j * k + i] >= 0; i++) {
            json_t *name = token_text(tok, bos, r->top_id[(size_t)j * k + i]);
            json_object_set_new(top, json_string_value(name), real_or_null(r->top_lp[(size_t)j * k + i]));
            json_decref(name);
        }
        json_array_append_new(tops, top);
    }
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

/* The chat API's logprobs object: {"content": [{"token", "logprob",
 * "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]} */
static json_t *chat_logprobs(const RunInfo *in, const Request *q, const Result *r, const Tokenizer *tok)
{
    int bos = in->cfg->bos_id, k = q->logprobs;
    json_t *content = json_array();
    for (int j = 0; j < r->n; j++) {
        json_t *e = chat_token(tok, bos, r->tokens[j], r->lp[j]), *top = json_array();
        for (int i = 0; i < k && r->top_id[(size_t)j * k + i] >= 0; i++)
            json_array_append_new(top, chat_token(tok, bos, r->top_id[(size_t)j * k + i], r->top_lp[(size_t)j * k + i]));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(content, e);
    }
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    return o;
}

/* A chat.completion body's one choice: the assistant's message (its
 * content, and its reasoning_content with --reasoning-parser) */
static json_t *chat_choice(const RunInfo *in, const Request *q, const Result *r, const char *text, const Tokenizer *tok)
{
    json_t *choice = json_object(), *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    if (in->reasoning_parser != REASONING_NONE) {
        TextSpan s[2];
        reasoning_split(in->reasoning_parser, text, strlen(text), q->thinking_off, &s[0], &s[1]);
        json_object_set_new(msg, "content", s[1].n >= 0 ? json_stringn(s[1].p, (size_t)s[1].n) : json_null());
        json_object_set_new(msg, "reasoning_content", s[0].n >= 0 ? json_stringn(s[0].p, (size_t)s[0].n) : json_null());
    } else json_object_set_new(msg, "content", json_string(text));
    json_object_set_new(msg, "tool_calls", json_array());
    json_object_set_new(choice, "index", json_integer(0));
    json_object_set_new(choice, "message", msg);
    json_object_set_new(choice, "logprobs", r->lp ? chat_logprobs(in, q, r, tok) : json_null());
    json_object_set_new(choice, "finish_reason", json_string(r->finish_reason));
    json_object_set_new(choice, "stop_reason", stop_reason(in->cfg, r));
    return choice;
}

/* One line of the OpenAI batch output form:
 * {"id", "custom_id", "response": {"status_code", "request_id", "body"} | null, "error": {"code", "message"} | null} */
static json_t *batch_line(const RunInfo *in, const Request *q, const Result *r, const char *text, const Tokenizer *tok,
                          long created, int index) /* index: the output line's, which the id numbers */
{
    char rid[64];
    snprintf(rid, sizeof rid, "dcpinfer-%ld-%d", created, index);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(rid));
    json_object_set_new(o, "custom_id", json_string(q->id));
    if (q->error) {
        json_t *e = json_object();
        json_object_set_new(e, "code", json_string("invalid_request"));
        json_object_set_new(e, "message", json_string(q->error));
        json_object_set_new(o, "response", json_null());
        json_object_set_new(o, "error", e);
        return o;
    }
    json_t *choice, *choices = json_array(), *body = json_object(), *resp = json_object();
    if (q->chat_api) choice = chat_choice(in, q, r, text, tok);
    else {
        choice = json_object();
        json_object_set_new(choice, "index", json_integer(0));
        json_object_set_new(choice, "text", json_string(text));
        json_object_set_new(choice, "logprobs", r->lp ? completion_logprobs(in, q, r, tok) : json_null());
        json_object_set_new(choice, "finish_reason", json_string(r->finish_reason));
        json_object_set_new(choice, "stop_reason", stop_reason(in->cfg, r));
    }
    if (r->plp) {
        json_t *own = own_line(in, q, r, text, tok);
        json_object_set(choice, "prompt_logprobs", json_object_get(own, "prompt_logprobs"));
        json_decref(own);
    }
    json_array_append_new(choices, choice);
    const char *slash = strrchr(in->model_path, '/');
    char body_id[80];
    snprintf(body_id, sizeof body_id, "%s%s", q->chat_api ? "chatcmpl-" : "", rid);
    json_object_set_new(body, "id", json_string(body_id));
    json_object_set_new(body, "object", json_string(q->chat_api ? "chat.completion" : "text_completion"));
    json_object_set_new(body, "created", json_integer(created));
    json_object_set_new(body, "model", json_string(in->served_model_name ? in->served_model_name
                                                   : slash && slash[1]                ? slash + 1
                                                                                      : in->model_path));
    json_object_set_new(body, "choices", choices);
    json_object_set_new(body, "usage", usage(in, q, r));
    json_object_set_new(resp, "status_code", json_integer(200));
    json_object_set_new(resp, "request_id", json_string(rid));
    json_object_set_new(resp, "body", body);
    json_object_set_new(o, "response", resp);
    json_object_set_new(o, "error", json_null());
    return o;
}

/* A line's n sequences (n > 1: requests i..i+n-1) as one result, output
 * line `line`: in the own form a "choices" array (index, text, token_ids,
 * finish_reason, stop_reason and the per-sequence fields), in the OpenAI
 * forms the body's choices; usage counts the prompt once and every
 * sequence's tokens. */
static json_t *choices_line(const RunInfo *in, const RequestSet *rs, const Result *res, char *const *texts,
                            const Tokenizer *tok, long created, int i, int line)
{
    const Request *q = &rs->r[i];
    int n = q->n_choices;
    long completion = 0;
    for (int k = 0; k < n; k++) completion += res[i + k].n;
    if (rs->batch) {
        json_t *o = batch_line(in, q, &res[i], texts[i], tok, created, line), *body;
        if (!(body = json_object_get(json_object_get(o, "response"), "body"))) return o; /* failed: one error */
        json_t *choices = json_object_get(body, "choices");
        for (int k = 1; k < n; k++) {
            json_t *other = batch_line(in, &rs->r[i + k], &res[i + k], texts[i + k], tok, created, line);
            json_t *c = json_array_get(json_object_get(json_object_get(json_object_get(other, "response"), "body"),
                                                       "choices"),
                                       0);
            if (c) {
                json_object_set_new(c, "index", json_integer(k));
                json_array_append(choices, c);
            }
            json_decref(other);
        }
        json_t *u = json_object_get(body, "usage");
        json_object_set_new(u, "completion_tokens", json_integer(completion));
        json_object_set_new(u, "total_tokens", json_integer(q->n_prompt + completion));
        return o;
    }
    json_t *o = own_line(in, q, &res[i], texts[i], tok), *choices = json_array();
    static const char *const per_choice[] = {"text", "reasoning_content", "content", "token_ids", "finish_reason",
                                             "stop_reason", "logprobs", NULL};
    for (int k = 0; k < n; k++) {
        json_t *line = k ? own_line(in, &rs->r[i + k], &res[i + k], texts[i + k], tok) : o, *c = json_object();
        json_object_set_new(c, "index", json_integer(k));
        for (int f = 0; per_choice[f]; f++)
            if (json_object_get(line, per_choice[f])) json_object_set(c, per_choice[f], json_object_get(line, per_choice[f]));
        json_array_append_new(choices, c);
        if (k) json_decref(line);
    }
    for (int f = 0; per_choice[f]; f++) json_object_del(o, per_choice[f]);
    json_object_set_new(o, "choices", choices);
    json_t *u = json_object_get(o, "usage");
    json_object_set_new(u, "completion_tokens", json_integer(completion));
    json_object_set_new(u, "total_tokens", json_integer(q->n_prompt + completion));
    return o;
}

int output_write_jsonl(const char *path, const RunInfo *info, const RequestSet *rs, const Result *res,
                       char *const *texts, const Tokenizer *tok)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    long created = (long)time(NULL);
    /* response ids number the output lines: consecutive, a line of n
     * sequences taking one */
    for (int i = 0, ln = 0; i < rs->n; i++) {
        if (rs->r[i].choice) continue; /* in its first sequence's line */
        json_t *o = rs->r[i].n_choices > 1 ? choices_line(info, rs, res, texts, tok, created, i, ln)
                    : rs->batch ? batch_line(info, &rs->r[i], &res[i], texts[i], tok, created, ln)
                                : own_line(info, &rs->r[i], &res[i], texts[i], tok);
        ln++;
        char *line = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        size_t n = strlen(line);
        if (len + n + 1 > cap) buf = xrealloc(buf, cap = 2 * (len + n + 1));
        memcpy(buf + len, line, n);
        buf[len + n] = '\n';
        len += n + 1;
        free(line);
    }
    int rc = durable_replace(path, buf ? buf : "", len);
    if (!rc) {
        char *side = xmalloc(strlen(path) + 16), *run = xmalloc(strlen(info->identity) + 160);
        sprintf(side, "%s.run.json", path);
        int n = sprintf(run, "{\"dcpinfer_run\": 1, \"results_bytes\": %zu, \"results_hash\": \"%016llx\", \"identity\": %s}\n",
                        len, (unsigned long long)fnv1a(FNV_START, buf ? buf : "", len), info->identity);
        rc = durable_replace(side, run, (size_t)n);
        free(run);
        free(side);
    }
    free(buf);
    return rc;
}
