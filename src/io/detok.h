/* Incremental detokenization: a request's output text grows as its tokens
 * arrive, whole characters at a time, so that stop strings can be looked
 * for after every token. Each step decodes a short window of tokens twice,
 * without and with the newest ones, and appends the difference: decoders
 * whose output depends on a token's place (Metaspace's first space, a
 * byte-fallback run) give the same text for the shared start of both. Text
 * ending in a cut character (raw bytes, or U+FFFD from a tokenizer.json)
 * waits for the next token; at the end it is flushed as U+FFFD. The state
 * lives in the Result (text, detok_prefix, detok_read). */
#ifndef DCP_DETOK_H
#define DCP_DETOK_H

#include <stddef.h>

#include "requests.h"
#include "tokenizer.h"

/* Starts r's text empty; the window begins a few prompt tokens back. */
void detok_start(Result *r, int n_prompt);
/* Decodes the prompt and r's first n_out output tokens as far as they make
 * whole characters (all of them, cut ones as U+FFFD, with flush); returns
 * the text's length before the call, where the new text begins. */
size_t detok_update(Result *r, const Tokenizer *t, const Request *q, int n_out, int bos, int flush);
/* Where a stop string of the request ends up in text (len bytes) now that
 * the text after before is new: the first of the request's stop strings (in
 * its order, as vLLM) found in the part that ends in the new text, at its
 * first place there; -1 if none. *which: its index. */
long stop_string_find(const Request *q, const char *text, size_t len, size_t before, int *which);

#endif
