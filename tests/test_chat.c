/* Chat templates against jinja2 as transformers configures it
 * (tests/ref/make_chat_refs.py):
 * - tests/data/chat/jinja-cases.jsonl: small templates, one feature each,
 *   render byte-identically to jinja2, or fail where jinja2 fails and
 *   when (parsing or rendering);
 * - tests/data/chat/templates.jsonl: the real templates in
 *   ../shared/chat-templates x a dozen conversations give the text of
 *   apply_chat_template and, through the model's tokenizer, its prompt ids;
 * - templates with constructs outside the subset are refused at parse
 *   time with the construct and its line, and chat_template_load finds a
 *   template where transformers does. */
#include <jansson.h>
#include <time.h>

#include "chat.h"
#include "hftok.h"
#include "jinja.h"
#include "reasoning.h"
#include "tiktoken.h"
#include "testutil.h"

static const char *src_dir(void)
{
    const char *s = getenv("srcdir");
    return s ? s : ".";
}

static json_t *load_jsonl(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tests/data/chat/%s", src_dir(), name);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    json_t *all = json_array();
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        if (j) json_array_append_new(all, j);
    }
    free(line);
    fclose(f);
    return all;
}

static void test_cases(void)
{
    json_t *cases = load_jsonl("jinja-cases.jsonl");
    if (!CHECK_OK(cases && json_array_size(cases) > 80, "tests/data/chat/jinja-cases.jsonl missing or short")) return;
    size_t i;
    json_t *c;
    int same = 0;
    json_array_foreach(cases, i, c)
    {
        const char *tmpl = json_string_value(json_object_get(c, "template"));
        json_t *want = json_object_get(c, "out");
        char *err = NULL, *out = NULL;
        size_t len = 0;
        JinjaTemplate *t = jinja_parse("case", tmpl, strlen(tmpl), &err);
        if (t) out = jinja_render(t, json_object_get(c, "vars"), (long long)time(NULL), &len, &err);
        if (want) {
            int ok = out && len == json_string_length(want) && !memcmp(out, json_string_value(want), len);
            CHECK(ok, "case %zu %s: got [%s] (%s), jinja2 gives [%s]", i, tmpl, out ? out : "-", err ? err : "",
                  json_string_value(want));
            same += ok;
        } else { /* failing as jinja2 fails, and when: parsing, or rendering */
            const char *at = json_string_value(json_object_get(c, "at"));
            int parse = at && !strcmp(at, "parse");
            int ok = !out && (parse ? !t : t != NULL);
            CHECK(ok, "case %zu %s: %s [%s], jinja2 fails %s with: %s", i, tmpl,
                  out ? "rendered" : t ? "failed rendering" : "failed parsing", out ? out : err ? err : "",
                  parse ? "parsing" : "rendering", json_string_value(json_object_get(c, "message")));
            same += ok;
        }
        free(out);
        free(err);
        jinja_free(t);
    }
    printf("jinja cases: %d of %zu as jinja2\n", same, json_array_size(cases));
    json_decref(cases);
}

/* raise_exception's message is the error, as the template wrote it */
static void test_raise(void)
{
    const char *tmpl = "{% if messages[0].role != 'user' %}{{ raise_exception('Roles must start with user, not ' + "
                       "messages[0].role) }}{% endif %}ok";
    char *err = NULL;
    size_t len;
    JinjaTemplate *t = jinja_parse("t", tmpl, strlen(tmpl), &err);
    json_t *vars = json_pack("{s:[{s:s}]}", "messages", "role", "system");
    char *out = t ? jinja_render(t, vars, 0, &len, &err) : NULL;
    CHECK(!out && err && !strcmp(err, "Roles must start with user, not system"), "raise_exception: [%s]",
          err ? err : "(none)");
    free(out);
    free(err);
    json_decref(vars);
    jinja_free(t);
}

/* constructs outside the subset: refused when parsed, with their line */
static void test_refusals(void)
{
    static const char *const cases[][2] = {
        {"a\n{% include 'x.jinja' %}", "t:2: the tag 'include' is not supported"},
        {"{{ x }}\n\n{{ x | wordcount }}", "t:3: the filter 'wordcount' is not supported"},
        {"{{ cycler('a', 'b') }}", "t:1: the function 'cycler' is not supported"},
        {"{% for x in xs recursive %}{% endfor %}", "t:1: recursive for loops are not supported"},
        {"{{ x is divisibleby3 }}", "t:1: the test 'divisibleby3' is not supported"},
        {"{% if x %}", "'endif' is missing"},
        {"{% endif %}", "t:1: unexpected 'endif'"},
        {"{% break %}", "t:1: 'break' outside a for loop"},
        {"{{ x | map('upper') }}", "t:1: map is supported with attribute= only"},
        {"{% raw %}{{ x }}{% endraw %}", "t:1: the tag 'raw' is not supported"},
        {"{{ 'unclosed }}", "t:1: a string literal is not closed"},
        {"{% set a, b = 1, 2 %}", "t:1: this form of set is not supported"},
        {"{{ x }", "t:1: a {{ tag is not closed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *err = NULL;
        JinjaTemplate *t = jinja_parse("t", cases[i][0], strlen(cases[i][0]), &err);
        CHECK(!t && err && strstr(err, cases[i][1]), "%s: want \"%s\", got \"%s\"", cases[i][0], cases[i][1],
              err ? err : "(parsed)");
        free(err);
        jinja_free(t);
    }
    /* Python's methods that the engine lacks parse (jinja2 finds them when
     * it runs) and are refused when called, as are unknown filters, tests
     * and functions inside an if */
    static const char *const at_render[][2] = {
        {"{{ 'x'.title() }}", "t:1: the method 'title' of a str is not supported"},
        {"{% for x in [1] %}\n{{ loop.cycle('a', 'b') }}{% endfor %}", "t:2: the method 'cycle' of a LoopContext is not supported"},
        {"{% if true %}{{ x | wordcount }}{% endif %}", "t:1: the filter 'wordcount' is not supported"},
        {"{% if 1 is divisibleby3 %}{% endif %}", "t:1: the test 'divisibleby3' is not supported"},
        {"{{ cycler('a') if true }}", "t:1: UndefinedError: 'cycler' is undefined"},
        {"{% macro f() %}{% endmacro %}{{ f }}{{ range }}", "t:1: printing the function 'range' is not supported"},
    };
    for (size_t i = 0; i < sizeof at_render / sizeof at_render[0]; i++) {
        char *err = NULL, *out = NULL;
        size_t len;
        JinjaTemplate *t = jinja_parse("t", at_render[i][0], strlen(at_render[i][0]), &err);
        json_t *vars = json_object();
        if (t) out = jinja_render(t, vars, 0, &len, &err);
        CHECK(t && !out && err && strstr(err, at_render[i][1]), "%s: want \"%s\" when rendered, got \"%s\"",
              at_render[i][0], at_render[i][1], err ? err : "(rendered)");
        free(out);
        free(err);
        json_decref(vars);
        jinja_free(t);
    }
    /* nesting past the bound is refused, not a stack overflow */
    size_t n = 100000;
    char *deep = xmalloc(3 * n + 16);
    strcpy(deep, "{{ ");
    memset(deep + 3, '(', n);
    memset(deep + 3 + n, ')', n);
    strcpy(deep + 3 + 2 * n, " }}");
    char *err = NULL;
    JinjaTemplate *t = jinja_parse("t", deep, strlen(deep), &err);
    CHECK(!t && err && strstr(err, "nest more than"), "deep nesting: %s", err ? err : "(parsed)");
    free(err);
    /* so do chains of attributes, filters and operators, which nest the same way */
    static const char *const links[] = {".b", "|trim", " and x", " ~ x", "[0]"};
    for (int k = 0; k < 5; k++) {
        strcpy(deep, "{{ x");
        for (int i = 0; i < 1000; i++) strcat(deep + 4 + i * strlen(links[k]), links[k]);
        strcat(deep, " }}");
        err = NULL;
        t = jinja_parse("t", deep, strlen(deep), &err);
        CHECK(!t && err && strstr(err, "nest more than"), "a chain of 1000 '%s': %s", links[k], err ? err : "(parsed)");
        free(err);
        jinja_free(t);
    }
    free(deep);
    /* a long flat list (comparisons, a body's statements) costs memory in
     * proportion to its length: 100,000 chained comparisons parse */
    n = 100000;
    deep = xmalloc(5 * n + 16);
    strcpy(deep, "{{ 0");
    for (size_t i = 0; i < n; i++) memcpy(deep + 4 + 5 * i, " < 1 ", 5);
    strcpy(deep + 4 + 5 * n, "}}");
    err = NULL;
    t = jinja_parse("t", deep, strlen(deep), &err);
    CHECK(t != NULL, "100,000 chained comparisons: %s", err ? err : "");
    free(err);
    jinja_free(t);
    free(deep);
    /* rendering is bounded: steps, output, recursion */
    static const char *const heavy[][2] = {
        {"{% set r = range(1000) %}{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}{% endfor %}",
         "steps"},
        {"{% set s = 'xxxxxxxxxxxxxxxx' %}{% for a in range(100000) %}\n{{ s * 100 }}{% endfor %}",
         "t:2: the template's output exceeds 64 MiB"},
        {"{% for i in range(100000) %}\n{% set x = 'x' * 10000 %}{% endfor %}", "t:2: the template needs more than 512 MiB"},
        {"{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", "nest more than"},
        {"{% set ns = namespace(x=1) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x == [ns.x] }}",
         "a value nests more than"},
    };
    for (size_t i = 0; i < sizeof heavy / sizeof heavy[0]; i++) {
        char *out = NULL;
        size_t len;
        err = NULL;
        t = jinja_parse("t", heavy[i][0], strlen(heavy[i][0]), &err);
        json_t *vars = json_object();
        if (t) out = jinja_render(t, vars, 0, &len, &err);
        CHECK(t && !out && err && strstr(err, heavy[i][1]), "%s: want an error with \"%s\", got %s", heavy[i][0],
              heavy[i][1], err ? err : "output");
        json_decref(vars);
        free(out);
        free(err);
        jinja_free(t);
    }
}

static HfTokenizer *kimi_tokenizer(const char *cl100k)
{
    /* tests/ref/kimi_tok.py: the ten named tokens, then reserved ones, after the ranks */
    static const char *const named[] = {"[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                        "<|start_header_id|>", "<|end_header_id|>", "[EOT]", "<|im_system|>",
                                        "<|im_middle|>"};
    const char *special[256];
    int ids[256];
    char names[256][40];
    for (int i = 0; i < 256; i++) {
        if (i < 10) special[i] = named[i];
        else snprintf(names[i], sizeof names[i], "<|reserved_token_%d|>", 100256 + i), special[i] = names[i];
        ids[i] = 100256 + i;
    }
    return tiktoken_load(cl100k, tiktoken_kimi_pattern, special, ids, 256);
}

static void test_templates(void)
{
    json_t *recs = load_jsonl("templates.jsonl");
    if (!CHECK_OK(recs && json_array_size(recs) >= 48, "tests/data/chat/templates.jsonl missing or short")) return;
    size_t i;
    json_t *r;
    int texts = 0, ids_same = 0, n = 0;
    const char *last_tmpl = "", *last_tok = "";
    ChatTemplate ct = {0};
    HfTokenizer *tok = NULL;
    json_array_foreach(recs, i, r)
    {
        const char *file = json_string_value(json_object_get(r, "template")),
                   *tname = json_string_value(json_object_get(r, "tokenizer")),
                   *conv = json_string_value(json_object_get(r, "conversation"));
        if (strcmp(file, last_tmpl)) {
            chat_template_free(&ct);
            char rel[512];
            snprintf(rel, sizeof rel, "chat-templates/%s", file);
            char *path = shared_path(rel);
            size_t len;
            ct.specials = json_object();
            if (!CHECK_OK(!read_file(path, &ct.text, &len), "%s: %s", path, dcp_error())) {
                free(path);
                continue;
            }
            char *err = NULL;
            ct.tmpl = jinja_parse(file, ct.text, len, &err);
            CHECK(ct.tmpl, "%s: %s", file, err);
            free(err);
            free(path);
            last_tmpl = file;
        }
        if (strcmp(tname, last_tok)) {
            hftok_free(tok);
            char rel[512];
            snprintf(rel, sizeof rel, !strcmp(tname, "kimi-cl100k") ? "tokenizers/cl100k/cl100k_base.tiktoken"
                                                                     : "tokenizers/%s/tokenizer.json",
                     tname);
            char *path = shared_path(rel);
            tok = !strcmp(tname, "kimi-cl100k") ? kimi_tokenizer(path) : hftok_load(path);
            CHECK(tok, "%s: %s", path, dcp_error());
            free(path);
            last_tok = tname;
        }
        if (!ct.tmpl || !tok) continue;
        json_decref(ct.specials);
        ct.specials = json_incref(json_object_get(r, "special_tokens"));
        json_t *req = json_pack("{s:O, s:O, s:O, s:O}", "messages", json_object_get(r, "messages"),
                                "add_generation_prompt", json_object_get(r, "add_generation_prompt"),
                                "continue_final_message", json_object_get(r, "continue_final_message"),
                                "chat_template_kwargs", json_object_get(r, "chat_template_kwargs"));
        char *err = NULL, *text = chat_render(&ct, req, 0, &err);
        json_t *want = json_object_get(r, "text");
        n++;
        if (!want) {
            CHECK(!text, "%s / %s: rendered, transformers fails with %s", file, conv,
                  json_string_value(json_object_get(r, "error")));
        } else if (CHECK_OK(text && !strcmp(text, json_string_value(want)), "%s / %s: text [%s] (%s), transformers [%s]",
                            file, conv, text ? text : "-", err ? err : "", json_string_value(want))) {
            texts++;
            int *ids = NULL, nid = 0;
            if (!hftok_encode(tok, text, strlen(text), 0, &ids, &nid)) {
                json_t *w = json_object_get(r, "ids");
                int ok = (int)json_array_size(w) == nid;
                for (int k = 0; ok && k < nid; k++) ok = json_integer_value(json_array_get(w, (size_t)k)) == ids[k];
                CHECK(ok, "%s / %s: %d prompt ids differ from apply_chat_template's %zu", file, conv, nid,
                      json_array_size(w));
                ids_same += ok;
            }
            free(ids);
        }
        free(text);
        free(err);
        json_decref(req);
    }
    chat_template_free(&ct);
    hftok_free(tok);
    printf("real templates: %d conversations, %d texts and %d prompt-id lists as transformers\n", n, texts, ids_same);
    json_decref(recs);
}

/* The three parsers on the outputs their models write, as vLLM's
 * extract_reasoning splits them (NULL: None) */
static void test_reasoning(void)
{
    static const struct {
        const char *parser, *text;
        int thinking_off;
        const char *reasoning, *content;
    } cases[] = {
        {"deepseek_r1", "<think>a b</think>answer", 0, "a b", "answer"},
        {"deepseek_r1", "a b</think>answer", 0, "a b", "answer"},             /* <think> in the prompt */
        {"deepseek_r1", "still thinking", 0, "still thinking", NULL},        /* no end: all reasoning */
        {"deepseek_r1", "<think>r</think>", 0, "r", NULL},                   /* empty content is None */
        {"deepseek_r1", "x<think>r</think>c", 0, "r", "c"},                  /* text before <think> dropped */
        {"deepseek_r1", "<think></think>\n\nc", 0, "", "\n\nc"},
        {"qwen3", "<think>\nr\n</think>\n\nanswer", 0, "\nr\n", "\n\nanswer"},
        {"qwen3", "r</think>c", 0, "r", "c"},
        {"qwen3", "no tags at all", 0, NULL, "no tags at all"},              /* no end: all content */
        {"qwen3", "<think>unfinished", 0, NULL, "<think>unfinished"},
        {"qwen3", "a</think>b</think>c", 0, "a", "b</think>c"},
        {"kimi_k2", "<think>r</think>c", 0, "r", "c"},
        {"kimi_k2", "r</think>c", 0, "r", "c"},
        {"kimi_k2", "x<think>r</think>c", 0, "x<think>r", "c"},              /* <think> dropped only at the start */
        {"kimi_k2", "r</thinking>c", 0, "r", "c"},
        {"kimi_k2", "r<|tool_calls_section_begin|>t", 0, "r", "<|tool_calls_section_begin|>t"},
        {"kimi_k2", "thinking on", 0, "thinking on", NULL},
        {"kimi_k2", "<think>r</think>c", 1, NULL, "<think>r</think>c"},      /* "thinking": false */
        {"none", "<think>r</think>c", 0, NULL, "<think>r</think>c"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TextSpan r, c;
        reasoning_split(reasoning_parser(cases[i].parser), cases[i].text, strlen(cases[i].text), cases[i].thinking_off,
                        &r, &c);
        int ok = (cases[i].reasoning ? r.n == (long)strlen(cases[i].reasoning) && !memcmp(r.p, cases[i].reasoning, (size_t)r.n)
                                     : r.n < 0) &&
                 (cases[i].content ? c.n == (long)strlen(cases[i].content) && !memcmp(c.p, cases[i].content, (size_t)c.n)
                                   : c.n < 0);
        CHECK(ok, "%s \"%s\": reasoning [%.*s] content [%.*s]", cases[i].parser, cases[i].text, (int)(r.n > 0 ? r.n : 0),
              r.p, (int)(c.n > 0 ? c.n : 0), c.p);
    }
    CHECK(reasoning_parser("granite") < 0, "an unknown parser is refused");
}

int main(void)
{
    test_reasoning();
    test_cases();
    test_raise();
    test_refusals();
    char *probe = shared_path("chat-templates/Qwen-Qwen3-0.6B.jinja");
    if (path_exists(probe)) test_templates();
    else printf("%s not found: real templates skipped\n", probe);
    free(probe);
    if (test_failures) fprintf(stderr, "%d check(s) failed\n", test_failures);
    return test_failures ? 1 : 0;
}
