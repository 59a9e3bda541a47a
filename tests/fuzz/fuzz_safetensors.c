/* Fuzz target: a safetensors file (header and data) and, with the first
 * byte odd, a model.safetensors.index.json. Every tensor the parser accepts
 * is read whole, so that an offset or shape it should have refused shows up
 * as an out-of-bounds read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (data[0] & 1) {
        char **names;
        int n;
        if (st_index_parse("index.json", (const char *)data + 1, size - 1, &names, &n) == 0) {
            for (int i = 0; i < n; i++) {
                if (!names[i][0] || strchr(names[i], '/')) abort();
                free(names[i]);
            }
            free(names);
        }
        return 0;
    }
    /* a copy of exactly the input's size, so that reading past it is caught */
    unsigned char *copy = malloc(size - 1 ? size - 1 : 1);
    memcpy(copy, data + 1, size - 1);
    StFile f;
    memset(&f, 0, sizeof f);
    if (st_parse(&f, "model.safetensors", copy, size - 1) == 0) {
        for (int i = 0; i < f.n; i++) {
            const StTensor *t = &f.tensors[i];
            if (t->ndim > 2) continue;
            int64_t rows = t->ndim == 1 ? 1 : t->shape[0], cols = t->ndim == 1 ? t->shape[0] : t->shape[1];
            if (rows * cols > 1 << 16) continue;
            float *out = malloc(sizeof(float) * (size_t)(rows * cols + 1));
            st_read_f32(t, 0, rows, 0, cols, out);
            free(out);
        }
    }
    st_close(&f);
    free(copy);
    return 0;
}
