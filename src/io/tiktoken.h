/* tiktoken tokenizers: a ranks file (each token's bytes in base64, a
 * space, its rank), the split pattern the model's tokenizer code carries
 * and the special tokens, giving the ids tiktoken's Encoding gives with
 * allowed_special "all". They are read into the tokenizer.json machinery
 * (hftok.h) as a byte-level BPE whose merges are ranked by their result.
 * Kimi K2.x's tokenizer (tokenization_kimi.py's TikTokenTokenizer) is one:
 * its pattern is tiktoken_kimi_pattern. */
#ifndef DCP_TIKTOKEN_H
#define DCP_TIKTOKEN_H

#include "hftok.h"

/* Kimi K2's split pattern as tokenization_kimi.py writes it (it uses
 * character-class intersection, which tiktoken's regex engine reads and
 * PCRE2 does not: tiktoken_load rewrites it). */
extern const char tiktoken_kimi_pattern[];

/* pattern with each class intersection [X&&[^Y]] written as PCRE2 reads
 * it, (?:(?![Y])[X]) (malloc'ed); NULL with dcp_error() for another form
 * of intersection. */
char *tiktoken_pcre2_pattern(const char *pattern);

/* The tokenizer of the ranks file at path, split by pattern (tiktoken's
 * regex syntax), with n_special special tokens (text and id each), which
 * are matched anywhere in the text; NULL with dcp_error() on failure. */
HfTokenizer *tiktoken_load(const char *path, const char *pattern, const char *const *special, const int *special_id,
                           int n_special);

/* A model's tiktoken file (tiktoken.model) with the tokenizer_config.json
 * beside it: Kimi K2's TikTokenTokenizer (tokenizer_class), its pattern,
 * and the ids after the ranks reserved for special tokens (256, or
 * num_reserved_special_tokens in a tokenization_kimi.py beside it), named
 * by added_tokens_decoder or <|reserved_token_ID|>. */
HfTokenizer *tiktoken_load_model(const char *path);

#endif
