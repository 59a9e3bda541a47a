/* Fuzz target: the prompt file parser (dcpinfer's lines and OpenAI batch
 * lines), strict and with --skip-invalid, then the vocabulary check. */
#include <stdint.h>
#include <stdlib.h>

#include "requests.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    RequestDefaults d = {16, 1.0f, 1.0f, 7};
    for (int skip = 0; skip < 2; skip++) {
        RequestSet rs;
        if (requests_parse("fuzz.jsonl", (const char *)data, size, &d, skip, &rs) == 0) {
            requests_check_vocab(&rs, 512, 1);
            requests_free(&rs);
        }
    }
    return 0;
}
