/* Reasoning output: the generated text split into its reasoning (between
 * think tags) and its content, as vLLM's reasoning parsers of the same
 * names split a finished output (--reasoning-parser). */
#ifndef DCP_REASONING_H
#define DCP_REASONING_H

#include <stddef.h>

enum { REASONING_NONE, REASONING_DEEPSEEK_R1, REASONING_QWEN3, REASONING_KIMI_K2 };

/* The parser of a --reasoning-parser name; -1 for an unknown one. */
int reasoning_parser(const char *name);

/* A span of the text; n < 0: absent (vLLM's None). */
typedef struct {
    const char *p;
    long n;
} TextSpan;

/* text (len bytes) split by parser: deepseek_r1 and kimi_k2 take all of
 * an output without "</think>" as reasoning (their models may think to
 * the end), qwen3 none of it; a "<think>" the model writes is dropped, and
 * a missing one (the chat template put it in the prompt) is no matter.
 * kimi_k2 with thinking off (chat_template_kwargs "thinking": false)
 * leaves the text whole as content. */
void reasoning_split(int parser, const char *text, size_t len, int thinking_off, TextSpan *reasoning,
                     TextSpan *content);

#endif
