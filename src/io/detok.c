#include "detok.h"

#include <stdlib.h>
#include <string.h>

#include "hftok.h"
#include "util.h"

/* tokens of the window kept before the first new one, as context */
#define DETOK_CONTEXT 5

void detok_start(Result *r, int n_prompt)
{
    r->text_cap = 64;
    r->text = xmalloc(r->text_cap);
    r->text[0] = '\0';
    r->text_len = 0;
    r->detok_prefix = n_prompt > DETOK_CONTEXT ? n_prompt - DETOK_CONTEXT : 0;
    r->detok_read = n_prompt;
}

/* 1 when s ends inside a character: a UTF-8 lead byte missing some of its
 * continuation bytes, or the U+FFFD a tokenizer.json decoder puts there. */
static int cut_at_end(const char *s, size_t n)
{
    if (n >= 3 && !memcmp(s + n - 3, "\xEF\xBF\xBD", 3)) return 1;
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back;
    }
    return 0;
}

static int seq_token(const Request *q, const Result *r, int i)
{
    return i < q->n_prompt ? q->prompt_tokens[i] : r->tokens[i - q->n_prompt];
}

size_t detok_update(Result *r, const Tokenizer *t, const Request *q, int n_out, int bos, int flush)
{
    size_t before = r->text_len;
    int end = q->n_prompt + n_out, p0 = r->detok_prefix, rd = r->detok_read;
    if (end <= rd) return before;
    int *ids = xmalloc(sizeof(int) * (size_t)(end - p0));
    for (int i = p0; i < end; i++) ids[i - p0] = seq_token(q, r, i);
    int prev = p0 > 0 ? seq_token(q, r, p0 - 1) : -1;
    size_t la, lb;
    char *a = tokenizer_decode_span(t, prev, ids, rd - p0, bos, q->skip_special, &la);
    char *b = tokenizer_decode_span(t, prev, ids, end - p0, bos, q->skip_special, &lb);
    if (lb > la && (flush || !cut_at_end(b + la, lb - la))) {
        size_t n;
        char *add = hftok_utf8_lossy(b + la, lb - la, &n);
        if (r->text_len + n + 1 > r->text_cap) r->text = xrealloc(r->text, r->text_cap = 2 * (r->text_len + n + 1));
        memcpy(r->text + r->text_len, add, n + 1);
        r->text_len += n;
        free(add);
        r->detok_prefix = rd;
        r->detok_read = end;
    }
    free(a);
    free(b);
    free(ids);
    return before;
}

long stop_string_find(const Request *q, const char *text, size_t len, size_t before, int *which)
{
    for (int k = 0; k < q->n_stop_str; k++) {
        size_t m = strlen(q->stop[k]);
        for (size_t i = before + 1 > m ? before + 1 - m : 0; i + m <= len; i++)
            if (!memcmp(text + i, q->stop[k], m)) {
                *which = k;
                return (long)i;
            }
    }
    return -1;
}
