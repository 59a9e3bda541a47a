/* The llama2.c tokenizer (tokenizer .bin): encode exactly as llama2.c's
 * run.c does (BOS, dummy-prefix space, UTF-8 byte fallback, merges by best
 * score) and decode with byte pieces. */
#ifndef DCP_TOKENIZER_H
#define DCP_TOKENIZER_H

#include <stddef.h>

typedef struct {
    char **vocab;
    float *scores;
    int vocab_size;
    int max_token_length;
    int *sorted;               /* ids ordered by piece, for lookup */
    unsigned char byte_pieces[512];
    char *path;
} Tokenizer;

/* vocab_size: the model's; the file must hold exactly that many pieces. */
int tokenizer_load(Tokenizer *t, const char *path, int vocab_size);
/* The same from the file's bytes (path names it in messages). */
int tokenizer_parse(Tokenizer *t, const char *path, const unsigned char *data, size_t size, int vocab_size);
void tokenizer_free(Tokenizer *t);

/* Encodes text, with BOS (id bos, when >= 0) first. *out is malloc'ed. */
int tokenizer_encode(const Tokenizer *t, const char *text, int bos, int **out, int *n_out);

/* The bytes that token stands for after prev (llama2.c's decode): the leading
 * space is dropped after BOS and <0xNN> pieces become the raw byte. */
const char *tokenizer_decode(const Tokenizer *t, int prev, int token, int bos);

#endif
