/* Chat requests: a model's chat template (jinja.h) and the conversation of
 * a request rendered into its prompt text, as transformers'
 * apply_chat_template renders it (the same variables, the same handling of
 * reasoning fields and of continue_final_message). */
#ifndef DCP_CHAT_H
#define DCP_CHAT_H

#include <jansson.h>

#include "jinja.h"

typedef struct {
    JinjaTemplate *tmpl; /* NULL: the tokenizer has no chat template */
    char *text;          /* the template's source */
    char *source;        /* where it came from, for messages */
    json_t *specials;    /* bos_token, eos_token, unk_token, pad_token: tokenizer_config.json's */
} ChatTemplate;

/* The chat template: the file at override (--chat-template), else the
 * tokenizer's: tokenizer_config.json's "chat_template" beside the
 * tokenizer file at tokenizer_path (a string, or a list of named
 * templates, of which "default"), else chat_template.jinja beside it. No
 * template at all is not an error (t->tmpl stays NULL); one that uses
 * something outside the engine's subset is (dcp_error names it). */
int chat_template_load(ChatTemplate *t, const char *override, const char *tokenizer_path);
void chat_template_free(ChatTemplate *t);

/* The prompt text of a chat request: req holds "messages" and optionally
 * "add_generation_prompt" (default true), "continue_final_message",
 * "chat_template_kwargs". Malloc'ed; NULL with *err (malloc'ed) when the
 * conversation is malformed, asks for something dcpinfer does not do (tools,
 * images) or the template fails (raise_exception's message). now: the
 * clock strftime_now reads (jinja_render). */
char *chat_render(const ChatTemplate *t, json_t *req, long long now, char **err);

#endif
