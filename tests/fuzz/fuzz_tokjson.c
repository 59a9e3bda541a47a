/* Fuzz target: a Hugging Face tokenizer.json, then an encode and a decode
 * of a fixed text with the tokenizer the parser accepted; every id must be
 * one the tokenizer knows. */
#include <stdint.h>
#include <stdlib.h>

#include "hftok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    HfTokenizer *t = hftok_parse("tokenizer.json", (const char *)data, size);
    if (!t) return 0;
    static const char text[] = "Hello world, 12345 ñ 日本 😀 <s> \t\n  end";
    int *ids, n;
    if (hftok_encode(t, text, sizeof text - 1, 1, &ids, &n) == 0) {
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= hftok_vocab_size(t)) abort();
        free(hftok_decode(t, ids, n, 0));
        free(hftok_decode(t, ids, n, 1));
        free(ids);
    }
    hftok_free(t);
    return 0;
}
