/* Hugging Face tokenizer.json (the `tokenizers` format), exact: a BPE
 * model (merges as "a b" or [a, b], ignore_merges, byte_fallback, unk and
 * fuse_unk), normalizers (NFC/NFKC/NFD/NFKD through utf8proc, Prepend,
 * Replace, Sequence), pre-tokenizers (Split with a PCRE2 regex, ByteLevel,
 * Metaspace, Digits, Sequence), added tokens matched before the model
 * (leftmost-longest), TemplateProcessing's BOS/EOS, and decoders
 * (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence).
 * Added tokens are matched as tokenizers does: those with "normalized"
 * false in the raw text, the others (normalized) in each normalized piece.
 * A component outside this list is an error naming it. */
#ifndef DCP_HFTOK_H
#define DCP_HFTOK_H

#include <stddef.h>

typedef struct HfTokenizer HfTokenizer;

/* Reads path (a tokenizer.json); NULL with dcp_error() on failure. */
HfTokenizer *hftok_load(const char *path);
/* The same from the file's len bytes (path names it in messages). */
HfTokenizer *hftok_parse(const char *path, const char *text, size_t len);
/* A tiktoken ranks file's ranks_len bytes (path names it) as the BPE
 * model, with pipeline a tokenizer.json's other parts (pre_tokenizer,
 * decoder, added_tokens, ...): the ids tiktoken gives (see tiktoken.h). */
HfTokenizer *hftok_from_ranks(const char *path, const char *ranks, size_t ranks_len, const char *pipeline);
void hftok_free(HfTokenizer *t);
int hftok_vocab_size(const HfTokenizer *t);

/* The ids of len bytes of UTF-8 text; with add_special, the
 * post-processor's tokens too (e.g. <s>). *ids is malloc'ed. */
int hftok_encode(const HfTokenizer *t, const char *text, size_t len, int add_special, int **ids, int *n);
/* The text of n ids (malloc'ed, NUL-terminated); special tokens left out
 * with skip_special; invalid UTF-8 becomes U+FFFD. */
char *hftok_decode(const HfTokenizer *t, const int *ids, int n, int skip_special);

/* The id of a token's text (an added token or a vocabulary entry), -1 if none. */
int hftok_token_id(const HfTokenizer *t, const char *s);
/* tokenizer_config.json's add_bos_token/add_eos_token (-1 when absent): the
 * post-processor then adds that BOS (EOS) id, or none. */
void hftok_set_template(HfTokenizer *t, int add_bos, int bos, int add_eos, int eos);

/* n bytes with each invalid UTF-8 subpart replaced by U+FFFD, as Rust's
 * String::from_utf8_lossy does (malloc'ed, NUL-terminated; *out_n bytes). */
char *hftok_utf8_lossy(const char *s, size_t n, size_t *out_n);

#endif
