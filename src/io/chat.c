#define _GNU_SOURCE /* memmem */
#include "chat.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static int read_template(ChatTemplate *t, const char *path)
{
    size_t len;
    if (check_regular_file(path, "chat template") || read_file(path, &t->text, &len)) return -1;
    t->source = xstrdup(path);
    return 0;
}

int chat_template_load(ChatTemplate *t, const char *override, const char *tokenizer_path)
{
    memset(t, 0, sizeof *t);
    t->specials = json_object();
    char *cfg = tokenizer_path ? path_beside(tokenizer_path, "tokenizer_config.json") : NULL;
    int rc = 0;
    json_t *root = NULL;
    if (cfg && path_exists(cfg) && !check_regular_file(cfg, "tokenizer config")) {
        json_error_t err;
        root = json_load_file(cfg, JSON_DECODE_INT_AS_REAL, &err); /* model_max_length may be 1e30 */
        if (!json_is_object(root)) rc = dcp_fail("%s:%d: not a JSON object: %s", cfg, err.line, root ? "" : err.text);
    }
    /* the special tokens transformers passes to the template */
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (int i = 0; i < 4 && root && !rc; i++) {
        json_t *v = json_object_get(root, names[i]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (json_is_string(v)) json_object_set(t->specials, names[i], v);
    }
    if (!rc && override) rc = read_template(t, override);
    else if (!rc && root && json_object_get(root, "chat_template")) {
        json_t *ct = json_object_get(root, "chat_template");
        if (json_is_array(ct)) { /* named templates: transformers takes "default" */
            size_t i;
            json_t *e;
            json_t *pick = NULL;
            json_array_foreach(ct, i, e) if (json_is_string(json_object_get(e, "name")) &&
                                             !strcmp(json_string_value(json_object_get(e, "name")), "default")) pick =
                json_object_get(e, "template");
            ct = pick;
        }
        if (!json_is_string(ct))
            rc = dcp_fail("%s: \"chat_template\" is neither a template nor a list holding a \"default\" one", cfg);
        else t->text = xstrdup(json_string_value(ct)), t->source = xstrdup(cfg);
    } else if (!rc && tokenizer_path) {
        char *jinja = path_beside(tokenizer_path, "chat_template.jinja");
        if (path_exists(jinja)) rc = read_template(t, jinja);
        free(jinja);
    }
    if (!rc && t->text) {
        char *err = NULL;
        t->tmpl = jinja_parse(t->source, t->text, strlen(t->text), &err);
        if (!t->tmpl) {
            rc = dcp_fail("chat template %s (the engine renders the part of Jinja that chat templates use; see "
                          "docs/usage.md, \"Chat requests\")",
                          err);
            free(err);
        }
    }
    json_decref(root);
    free(cfg);
    if (rc) chat_template_free(t);
    return rc;
}

void chat_template_free(ChatTemplate *t)
{
    jinja_free(t->tmpl);
    free(t->text);
    free(t->source);
    json_decref(t->specials);
    memset(t, 0, sizeof *t);
}

static char *msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *msg(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return xstrdup(buf);
}

/* a message as the template sees it: content parts joined into one string
 * (text parts only), and reasoning under both of transformers' names */
static json_t *template_message(json_t *m, size_t i, char **err)
{
    if (!json_is_object(m)) return *err = msg("messages[%zu] is not an object", i), NULL;
    if (!json_is_string(json_object_get(m, "role")))
        return *err = msg("messages[%zu] has no \"role\" string", i), NULL;
    json_t *tc = json_object_get(m, "tool_calls");
    if (tc && !json_is_null(tc) && !(json_is_array(tc) && !json_array_size(tc)))
        return *err = msg("messages[%zu] has tool_calls: dcpinfer does not run tools", i), NULL;
    json_t *c = json_object_get(m, "content"), *out;
    if (c && !json_is_string(c) && !json_is_null(c) && !json_is_array(c))
        return *err = msg("messages[%zu].content must be a string or a list of text parts", i), NULL;
    if (json_is_array(c)) { /* [{"type": "text", "text": ...}, ...]: the texts, joined by newlines */
        size_t k, len = 0;
        json_t *part;
        json_array_foreach(c, k, part)
        {
            const char *type = json_string_value(json_object_get(part, "type"));
            json_t *text = json_object_get(part, "text");
            if (json_is_object(part) && type && !strcmp(type, "text") && !json_is_string(text))
                return *err = msg("messages[%zu].content[%zu] is a text part without a string \"text\"", i, k), NULL;
            if (!json_is_object(part) || (type && strcmp(type, "text")) || !json_is_string(text))
                return *err = msg("messages[%zu].content[%zu] is not a text part (%s): dcpinfer takes text only", i, k,
                                  type ? type : "no \"type\""),
                       NULL;
            len += json_string_length(text) + 1;
        }
        char *joined = xmalloc(len + 1);
        size_t o = 0;
        json_array_foreach(c, k, part)
        {
            json_t *text = json_object_get(part, "text");
            if (k) joined[o++] = '\n';
            memcpy(joined + o, json_string_value(text), json_string_length(text));
            o += json_string_length(text);
        }
        out = json_deep_copy(m);
        json_object_set_new(out, "content", json_stringn(joined, o));
        free(joined);
    } else out = json_deep_copy(m);
    /* transformers: reasoning_content, thinking or reasoning fills "thinking" (first) and "reasoning_content" */
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    json_t *r = NULL;
    for (int f = 0; f < 3 && !r; f++) {
        json_t *v = json_object_get(m, fields[f]);
        if (v && !json_is_null(v)) r = v;
    }
    if (r) {
        json_t *aliased = json_object();
        json_object_set(aliased, "thinking", r);
        json_object_update(aliased, out);
        json_object_set(aliased, "reasoning_content", r);
        json_decref(out);
        out = aliased;
    }
    return out;
}

/* Python's str.rstrip() length of s[0..n) */
static size_t rstrip_len(const char *s, size_t n)
{
    size_t a, b;
    jinja_strip_span(s, n, 0, 1, &a, &b);
    return b;
}

/* the last occurrence of needle in hay[0..n) */
static const char *find_last(const char *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    const char *last = NULL, *end = hay + n;
    for (const char *p = hay; (p = memmem(p, (size_t)(end - p), needle, k)); p++) last = p;
    return last;
}

char *chat_render(const ChatTemplate *t, json_t *req, long long now, char **err)
{
    *err = NULL;
    if (!t->tmpl) return *err = msg("a \"messages\" request needs a chat template, and the tokenizer has none "
                                    "(give --chat-template FILE)"),
                         NULL;
    json_t *messages = json_object_get(req, "messages"), *tools = json_object_get(req, "tools");
    if (!json_is_array(messages) || !json_array_size(messages))
        return *err = msg("\"messages\" must be a non-empty list of messages"), NULL;
    if (tools && !json_is_null(tools) && !(json_is_array(tools) && !json_array_size(tools)))
        return *err = msg("\"tools\": dcpinfer does not run tools"), NULL;
    json_t *agp = json_object_get(req, "add_generation_prompt"), *cont = json_object_get(req, "continue_final_message"),
           *kwargs = json_object_get(req, "chat_template_kwargs");
    if (agp && !json_is_boolean(agp)) return *err = msg("\"add_generation_prompt\" must be true or false"), NULL;
    if (cont && !json_is_boolean(cont)) return *err = msg("\"continue_final_message\" must be true or false"), NULL;
    if (kwargs && !json_is_object(kwargs) && !json_is_null(kwargs))
        return *err = msg("\"chat_template_kwargs\" must be an object"), NULL;
    int gen = agp ? json_is_true(agp) : 1, cont_final = json_is_true(cont);
    if (gen && cont_final)
        return *err = msg("continue_final_message and add_generation_prompt cannot both be true (set "
                          "\"add_generation_prompt\": false to continue the last message)"),
               NULL;
    json_t *msgs = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m)
    {
        json_t *tm = template_message(m, i, err);
        if (!tm) {
            json_decref(msgs);
            return NULL;
        }
        json_array_append_new(msgs, tm);
    }
    /* continue_final_message: a tag after the last message's text marks
     * where the rendered prompt is cut, as transformers does */
    static const char tag[] = "CONTINUE_FINAL_MESSAGE_TAG ";
    char *final = NULL;
    if (cont_final) {
        json_t *last = json_array_get(msgs, json_array_size(msgs) - 1), *c = json_object_get(last, "content");
        if (!json_is_string(c)) {
            json_decref(msgs);
            return *err = msg("continue_final_message: the final message has no \"content\" to continue"), NULL;
        }
        if (!strstr(t->text, "content")) {
            json_decref(msgs);
            return *err = msg("continue_final_message: the chat template does not read \"content\""), NULL;
        }
        final = xstrdup(json_string_value(c));
        char *tagged = xmalloc(strlen(final) + sizeof tag);
        sprintf(tagged, "%s%s", final, tag);
        json_object_set_new(last, "content", json_string(tagged));
        free(tagged);
    }
    json_t *vars = json_object();
    json_object_update(vars, t->specials);
    if (json_is_object(kwargs)) json_object_update(vars, kwargs);
    json_object_set_new(vars, "messages", msgs);
    json_object_set_new(vars, "tools", json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(gen));
    size_t len;
    char *out = jinja_render(t->tmpl, vars, now, &len, err);
    json_decref(vars);
    if (out && final) {
        /* the final text (stripped) and the tag must both survive the template */
        size_t a, b;
        jinja_strip_span(final, strlen(final), 1, 1, &a, &b);
        final[b] = '\0';
        const char *at = find_last(out, len, "CONTINUE_FINAL_MESSAGE_TAG");
        if (!at || !strstr(out, final + a)) {
            free(out);
            out = NULL;
            *err = msg("continue_final_message: the chat template drops the final message's text");
        } else {
            size_t cut = (size_t)(at - out);
            if (!strncmp(at, tag, sizeof tag - 1)) out[cut] = '\0';
            else out[rstrip_len(out, cut)] = '\0';
        }
    }
    free(final);
    return out;
}
