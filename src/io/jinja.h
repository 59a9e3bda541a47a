/* Chat templates: the subset of Jinja that models' chat templates use,
 * rendered as transformers renders them (jinja2's sandbox with
 * trim_blocks and lstrip_blocks, loop controls, its tojson, raise_exception
 * and strftime_now). Values follow Python's rules (truth, equality, str(),
 * json.dumps) and jinja2's default Undefined.
 *
 * A template that uses anything outside the subset (a tag, filter, test,
 * method or global function the engine lacks) is refused when it is
 * parsed, naming the construct and its line: it is never rendered
 * differently from jinja2. Rendering is bounded (nesting depth, steps,
 * memory, output size), so a hostile template fails with a message. */
#ifndef DCP_JINJA_H
#define DCP_JINJA_H

#include <jansson.h>
#include <stddef.h>

typedef struct JinjaTemplate JinjaTemplate;

/* The template in src (len bytes; name labels messages); NULL with *err
 * (malloc'ed: "name:line: what") when it cannot be parsed or uses
 * something outside the subset. */
JinjaTemplate *jinja_parse(const char *name, const char *src, size_t len, char **err);
void jinja_free(JinjaTemplate *t);

/* Renders with the variables of vars (a JSON object: messages,
 * add_generation_prompt, bos_token, ...); strftime_now reads the local
 * time of now (seconds since the epoch), so that every rank of a run
 * renders the same text. The text is malloc'ed (*len bytes,
 * NUL-terminated). NULL with *err (malloc'ed) on failure;
 * raise_exception's message is the error's text as the template wrote it. */
char *jinja_render(const JinjaTemplate *t, json_t *vars, long long now, size_t *len, char **err);

/* Python's str.strip() (lstrip(), rstrip()) of s[0..n): the kept span
 * [*from, *to), whitespace being what str.isspace() says (Unicode's) */
void jinja_strip_span(const char *s, size_t n, int left, int right, size_t *from, size_t *to);

/* Limits of one render: beyond them it fails */
#define JINJA_MAX_OUTPUT (64u << 20)  /* bytes of output */
#define JINJA_MAX_MEMORY (512u << 20) /* bytes of values */
#define JINJA_MAX_STEPS 20000000L     /* expressions and statements evaluated */
#define JINJA_MAX_DEPTH 256           /* nested macro calls; nested expressions and blocks in the source */

#endif
