/* Fuzz target: the llama2.c model header (with the file size taken from
 * the input) and the llama2.c tokenizer file, then an encode and decode of
 * text with the accepted tokenizer. Input: 2 bytes of vocabulary size, the
 * 28-byte model header, 8 bytes of file size, then the tokenizer file up to
 * a line "\n--text--\n" and the text after it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "tokenizer.h"

static const char sep[] = "\n--text--\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 38) return 0;
    Config c;
    uint64_t file_size;
    memcpy(&file_size, data + 30, 8);
    config_from_llama2c_header("model.bin", data + 2, 28, (size_t)(file_size >> 16), &c);
    int vocab = 1 + (data[0] | data[1] << 8) % 600;
    const uint8_t *tok = data + 38, *end = data + size;
    size_t tok_len = (size_t)(end - tok);
    const char *text = "";
    char *owned = NULL;
    const uint8_t *hit = memmem(tok, tok_len, sep, sizeof sep - 1);
    if (hit) {
        size_t text_len = (size_t)(end - hit) - (sizeof sep - 1);
        owned = malloc(text_len + 1);
        memcpy(owned, hit + sizeof sep - 1, text_len);
        owned[text_len] = '\0';
        text = owned;
        tok_len = (size_t)(hit - tok);
    }
    unsigned char *copy = malloc(tok_len ? tok_len : 1);
    memcpy(copy, tok, tok_len);
    Tokenizer t;
    if (tokenizer_parse(&t, "tokenizer.bin", copy, tok_len, vocab) == 0) {
        int *ids, n;
        if (tokenizer_encode(&t, text, data[0] & 1 ? 1 : -1, &ids, &n) == 0) {
            for (int i = 0; i < n; i++) {
                if (ids[i] < 0 || ids[i] >= vocab) abort();
                (void)tokenizer_decode(&t, i ? ids[i - 1] : 1, ids[i], 1);
            }
            free(ids);
        }
        tokenizer_free(&t);
    }
    free(copy);
    free(owned);
    return 0;
}
