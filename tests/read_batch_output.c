/* A reader of OpenAI batch output files, written from OpenAI's
 * documentation of the Batch API (the output file: one JSON object per
 * line with "id", "custom_id", "response" and "error"; "response" holds
 * "status_code", "request_id" and "body", here a completions object:
 * "id", "object": "text_completion", "created", "model", "choices" with
 * "text", "index", "logprobs" (null, or "tokens", "token_logprobs",
 * "top_logprobs", "text_offset") and "finish_reason", and "usage" with
 * "prompt_tokens", "completion_tokens", "total_tokens"; "error" holds
 * "code" and "message"), or a chat completion object as OpenAI's chat API
 * documents it: "object": "chat.completion", "choices" with "index",
 * "message" ("role" "assistant", "content" a string or null, optional
 * "refusal", "tool_calls" and the reasoning models' "reasoning_content"),
 * "logprobs" (null, or "content": per token "token", "logprob", "bytes"
 * and "top_logprobs" of the same three) and "finish_reason". It refuses a
 * line missing any of these or of the wrong type, and prints per line:
 * custom_id, status (or "error"), and the text or the message's content
 * (or the error message), tab-separated; for a chat line with
 * reasoning_content, that too, after another tab.
 * Usage: read_batch_output FILE.jsonl */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

static int bad(int line, const char *what)
{
    fprintf(stderr, "line %d: %s\n", line, what);
    return 1;
}

#define NEED(cond, what) \
    if (!(cond)) return bad(line, what)

static int check_logprobs(json_t *lp, int line, json_int_t completion_tokens)
{
    json_t *tokens = json_object_get(lp, "tokens"), *tlp = json_object_get(lp, "token_logprobs"),
           *top = json_object_get(lp, "top_logprobs"), *off = json_object_get(lp, "text_offset");
    NEED(json_is_array(tokens) && json_is_array(tlp) && json_is_array(top) && json_is_array(off),
         "logprobs needs arrays tokens, token_logprobs, top_logprobs, text_offset");
    size_t n = json_array_size(tokens);
    NEED(json_array_size(tlp) == n && json_array_size(top) == n && json_array_size(off) == n,
         "logprobs arrays differ in length");
    NEED((json_int_t)n == completion_tokens, "logprobs cover other than the completion tokens");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(tlp, i), *t = json_array_get(top, i);
        NEED(json_is_string(json_array_get(tokens, i)), "a token is not a string");
        NEED(json_is_number(v) && json_number_value(v) <= 0, "a token logprob is not a number <= 0");
        NEED(json_is_integer(json_array_get(off, i)), "a text_offset is not an integer");
        NEED(json_is_object(t), "a top_logprobs entry is not an object");
        const char *k;
        json_t *x;
        json_object_foreach(t, k, x) NEED(json_is_number(x) && json_number_value(x) <= 0, "a top logprob is not <= 0");
    }
    return 0;
}

static int check_token(json_t *t, int line)
{
    json_t *bytes = json_object_get(t, "bytes"), *lp = json_object_get(t, "logprob");
    NEED(json_is_object(t) && json_is_string(json_object_get(t, "token")), "a chat logprob needs a token string");
    NEED(json_is_number(lp) && json_number_value(lp) <= 0, "a chat logprob is not a number <= 0");
    NEED(json_is_null(bytes) || json_is_array(bytes), "a chat logprob's bytes must be null or a list");
    size_t i;
    json_t *b;
    json_array_foreach(bytes, i, b) NEED(json_is_integer(b) && json_integer_value(b) >= 0 && json_integer_value(b) < 256,
                                         "a chat logprob's bytes must be byte values");
    if (json_is_array(bytes)) {
        const char *s = json_string_value(json_object_get(t, "token"));
        NEED(json_array_size(bytes) == strlen(s), "a chat logprob's bytes are not its token's");
        for (i = 0; i < json_array_size(bytes); i++)
            NEED(json_integer_value(json_array_get(bytes, i)) == (unsigned char)s[i], "a chat logprob's bytes are not its token's");
    }
    return 0;
}

static int check_chat_choice(json_t *c, int line, json_int_t completion_tokens)
{
    json_t *msg = json_object_get(c, "message"), *lp = json_object_get(c, "logprobs"), *fin = json_object_get(c, "finish_reason");
    NEED(json_is_integer(json_object_get(c, "index")), "choice.index must be an integer");
    NEED(json_is_object(msg), "choice.message must be an object");
    json_t *role = json_object_get(msg, "role"), *content = json_object_get(msg, "content"),
           *reason = json_object_get(msg, "reasoning_content"), *tools = json_object_get(msg, "tool_calls"),
           *refusal = json_object_get(msg, "refusal");
    NEED(json_is_string(role) && !strcmp(json_string_value(role), "assistant"), "message.role must be assistant");
    NEED(content && (json_is_string(content) || json_is_null(content)), "message.content must be a string or null");
    NEED(!reason || json_is_string(reason) || json_is_null(reason), "message.reasoning_content must be a string or null");
    NEED(!refusal || json_is_string(refusal) || json_is_null(refusal), "message.refusal must be a string or null");
    NEED(!tools || json_is_array(tools), "message.tool_calls must be a list");
    NEED(json_is_string(fin) && (!strcmp(json_string_value(fin), "stop") || !strcmp(json_string_value(fin), "length") ||
                                 !strcmp(json_string_value(fin), "tool_calls") ||
                                 !strcmp(json_string_value(fin), "content_filter") ||
                                 !strcmp(json_string_value(fin), "function_call")),
         "choice.finish_reason must be stop, length, tool_calls, content_filter or function_call");
    NEED(lp && (json_is_null(lp) || json_is_object(lp)), "choice.logprobs must be null or an object");
    if (json_is_object(lp)) {
        json_t *toks = json_object_get(lp, "content");
        NEED(json_is_array(toks) || json_is_null(toks), "logprobs.content must be a list or null");
        NEED((json_int_t)json_array_size(toks) == completion_tokens, "logprobs.content covers other than the completion tokens");
        size_t i;
        json_t *t;
        json_array_foreach(toks, i, t)
        {
            json_t *top = json_object_get(t, "top_logprobs");
            if (check_token(t, line)) return 1;
            NEED(json_is_array(top), "a chat logprob's top_logprobs must be a list");
            size_t k;
            json_t *x;
            json_array_foreach(top, k, x) if (check_token(x, line)) return 1;
        }
    }
    return 0;
}

static int check_line(json_t *o, int line)
{
    NEED(json_is_object(o), "not a JSON object");
    json_t *id = json_object_get(o, "id"), *cid = json_object_get(o, "custom_id"),
           *resp = json_object_get(o, "response"), *err = json_object_get(o, "error");
    NEED(json_is_string(id) && json_is_string(cid), "id and custom_id must be strings");
    NEED(resp && err, "response and error must both be present (null or an object)");
    NEED(json_is_null(resp) != json_is_null(err), "exactly one of response and error must be null");
    if (json_is_object(err)) {
        NEED(json_is_string(json_object_get(err, "code")) && json_is_string(json_object_get(err, "message")),
             "error needs code and message strings");
        printf("%s\terror\t%s\n", json_string_value(cid), json_string_value(json_object_get(err, "message")));
        return 0;
    }
    NEED(json_is_object(resp), "response must be an object");
    json_t *status = json_object_get(resp, "status_code"), *body = json_object_get(resp, "body");
    NEED(json_is_integer(status), "response.status_code must be an integer");
    NEED(json_is_string(json_object_get(resp, "request_id")), "response.request_id must be a string");
    NEED(json_is_object(body), "response.body must be an object");
    NEED(json_is_string(json_object_get(body, "id")), "body.id must be a string");
    json_t *obj = json_object_get(body, "object");
    int chat = json_is_string(obj) && !strcmp(json_string_value(obj), "chat.completion");
    NEED(chat || (json_is_string(obj) && !strcmp(json_string_value(obj), "text_completion")),
         "body.object must be text_completion or chat.completion");
    NEED(json_is_integer(json_object_get(body, "created")), "body.created must be an integer");
    NEED(json_is_string(json_object_get(body, "model")), "body.model must be a string");
    json_t *usage = json_object_get(body, "usage"), *choices = json_object_get(body, "choices");
    json_t *pt = json_object_get(usage, "prompt_tokens"), *ct = json_object_get(usage, "completion_tokens"),
           *tt = json_object_get(usage, "total_tokens");
    NEED(json_is_integer(pt) && json_is_integer(ct) && json_is_integer(tt), "usage needs three integer counts");
    NEED(json_integer_value(pt) + json_integer_value(ct) == json_integer_value(tt), "usage does not add up");
    NEED(json_is_array(choices) && json_array_size(choices) >= 1, "body.choices must be a non-empty array");
    json_t *c = json_array_get(choices, 0), *fin = json_object_get(c, "finish_reason"), *lp = json_object_get(c, "logprobs");
    if (chat) {
        if (check_chat_choice(c, line, json_integer_value(ct))) return 1;
        json_t *msg = json_object_get(c, "message"), *content = json_object_get(msg, "content"),
               *reason = json_object_get(msg, "reasoning_content");
        printf("%s\t%lld\t%s", json_string_value(cid), (long long)json_integer_value(status),
               json_is_string(content) ? json_string_value(content) : "(null)");
        if (reason) printf("\t%s", json_is_string(reason) ? json_string_value(reason) : "(null)");
        printf("\n");
        return 0;
    }
    NEED(json_is_string(json_object_get(c, "text")), "choice.text must be a string");
    NEED(json_is_integer(json_object_get(c, "index")), "choice.index must be an integer");
    NEED(json_is_string(fin) && (!strcmp(json_string_value(fin), "stop") || !strcmp(json_string_value(fin), "length") ||
                                 !strcmp(json_string_value(fin), "content_filter")),
         "choice.finish_reason must be stop, length or content_filter");
    NEED(lp && (json_is_null(lp) || json_is_object(lp)), "choice.logprobs must be null or an object");
    if (json_is_object(lp) && check_logprobs(lp, line, json_integer_value(ct))) return 1;
    printf("%s\t%lld\t%s\n", json_string_value(cid), (long long)json_integer_value(status),
           json_string_value(json_object_get(c, "text")));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: read_batch_output FILE.jsonl\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    static char buf[1 << 22];
    int line = 0, rc = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        json_error_t err;
        json_t *o = json_loads(buf, 0, &err);
        if (!o) rc |= bad(line, err.text);
        else rc |= check_line(o, line);
        json_decref(o);
    }
    fclose(f);
    if (!line) rc |= bad(0, "empty file");
    return rc;
}
