#define _GNU_SOURCE /* memmem */
#include "reasoning.h"

#include <string.h>

int reasoning_parser(const char *name)
{
    static const char *const names[] = {"none", "deepseek_r1", "qwen3", "kimi_k2"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) return i;
    return -1;
}

static const char *find(const char *s, size_t n, const char *what) { return memmem(s, n, what, strlen(what)); }

static TextSpan span(const char *a, const char *b) { return (TextSpan){a, (long)(b - a)}; }
/* vLLM's "content or None": an empty content is absent */
static TextSpan or_none(const char *a, const char *b) { return b > a ? span(a, b) : (TextSpan){a, -1}; }

void reasoning_split(int parser, const char *text, size_t len, int thinking_off, TextSpan *reasoning,
                     TextSpan *content)
{
    const char *end = text + len, *close;
    static const char open_tag[] = "<think>", close_tag[] = "</think>";
    *reasoning = (TextSpan){text, -1};
    *content = span(text, end);
    if (parser == REASONING_NONE || (parser == REASONING_KIMI_K2 && thinking_off)) return;
    if (parser == REASONING_KIMI_K2) {
        /* "<think>" is dropped only where the output starts with it; the
         * reasoning ends at "</think>", "</thinking>" or a tool-call
         * section (which stays in the content) */
        const char *from = len >= 7 && !memcmp(text, open_tag, 7) ? text + 7 : text, *at;
        if ((at = find(text, len, close_tag))) {
            *reasoning = span(from, at);
            *content = or_none(at + 8, end);
        } else if ((at = find(text, len, "</thinking>"))) {
            *reasoning = span(from, at);
            *content = or_none(at + 11, end);
        } else if ((at = find(text, len, "<|tool_calls_section_begin|>"))) {
            *reasoning = span(from, at);
            *content = or_none(at, end);
        } else {
            *reasoning = span(from, end);
            *content = (TextSpan){end, -1};
        }
        return;
    }
    if (parser == REASONING_QWEN3 && !find(text, len, close_tag)) return; /* no reasoning */
    /* the text after the first "<think>", if there is one */
    const char *open = find(text, len, open_tag), *from = open ? open + 7 : text;
    if (!(close = find(from, (size_t)(end - from), close_tag))) { /* deepseek_r1: still thinking */
        *reasoning = span(from, end);
        *content = (TextSpan){end, -1};
        return;
    }
    *reasoning = span(from, close);
    *content = or_none(close + 8, end);
}
