/* The llama2.c tokenizer (tokenizer .bin): encode exactly as llama2.c's
 * run.c does (BOS, dummy-prefix space, UTF-8 byte fallback, merges by best
 * score) and decode with byte pieces. */
#ifndef DCP_TOKENIZER_H
#define DCP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct HfTokenizer;

typedef struct {
    struct HfTokenizer *hf;    /* a Hugging Face tokenizer.json (hftok.h); the fields below are then unused */
    char **vocab;
    float *scores;
    int vocab_size;
    int max_token_length;
    int *sorted;               /* ids ordered by piece, for lookup */
    unsigned char byte_pieces[512];
    char *path;
    char *hf_file;             /* the tokenizer.json or tiktoken file read (NULL for llama2.c's) */
    int eos_id;                /* tokenizer_config.json's eos_token, or -1 */
    uint64_t content_hash;     /* of the files it was read from (the run identity) */
} Tokenizer;

/* A llama2.c tokenizer file, or a Hugging Face tokenizer.json (a file
 * starting with '{', or a folder holding tokenizer.json; a
 * tokenizer_config.json beside it gives add_bos_token, add_eos_token and
 * eos_token, as transformers reads them). vocab_size: the
 * model's; a llama2.c file must hold exactly that many pieces, a
 * tokenizer.json no id at or above it. */
int tokenizer_load(Tokenizer *t, const char *path, int vocab_size);
/* The same from the file's bytes (path names it in messages). */
int tokenizer_parse(Tokenizer *t, const char *path, const unsigned char *data, size_t size, int vocab_size);
void tokenizer_free(Tokenizer *t);
/* How many ids the tokenizer spells: its highest id + 1. */
int tokenizer_ids(const Tokenizer *t);

/* Encodes text, with BOS (id bos, when >= 0) first; a tokenizer.json adds
 * what its post-processor adds instead. *out is malloc'ed. */
int tokenizer_encode(const Tokenizer *t, const char *text, int bos, int **out, int *n_out);
/* Encodes text as it is: no BOS, nothing of a post-processor's (a chat
 * template's output, which holds its special tokens already). */
int tokenizer_encode_plain(const Tokenizer *t, const char *text, int **out, int *n_out);

/* The bytes that token stands for after prev (llama2.c's decode): the leading
 * space is dropped after BOS and <0xNN> pieces become the raw byte. */
const char *tokenizer_decode(const Tokenizer *t, int prev, int token, int bos);
/* The text of n ids as one span (malloc'ed, *len bytes); prev is the id
 * before them (llama2.c drops a piece's leading space after BOS). With
 * skip_special, special tokens are left out (llama2.c: ids 0-2, its <unk>,
 * <s> and </s>). llama2.c pieces give raw bytes, which may cut a
 * character; a tokenizer.json's decoders give U+FFFD for those. */
char *tokenizer_decode_span(const Tokenizer *t, int prev, const int *ids, int n, int bos, int skip_special,
                            size_t *len);

#endif
