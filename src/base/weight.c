#include "weight.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

const char *dtype_name(DType t)
{
    static const char *const names[] = {"float32", "bfloat16", "fp8-e4m3", "int4", "nvfp4"};
    return names[t];
}

float weight_value(WeightRef w, size_t i)
{
    const uint8_t *p = w.data;
    float v = w.dtype == DTYPE_I4 ? i4_value(p, i) : w.dtype == DTYPE_FP4 ? fp4_value(p, i) : f8e4m3_to_f32(p[i]);
    return scaled_value(v, weight_run_scale(&w, i / (size_t)w.qcols), w.qflags & QF_ROUND_BF16);
}

int weight_group_rows(void *m, int rows, int cols, size_t esize, int G)
{
    if (G <= 0 || cols % 16 || rows < G) return 0;
    size_t row_bytes = (size_t)cols * esize;
    char *group = xmalloc(row_bytes * G), *p = m;
    for (int g = 0; g + G <= rows; g += G) { /* rows g .. g+G-1, where weight_row_start and _step put them */
        memcpy(group, p + (size_t)g * row_bytes, row_bytes * G);
        for (int r = 0; r < G; r++) {
            char *to = p + weight_row_start(G, g + r, rows, cols) * esize;
            size_t step = weight_row_step(G, g + r, rows) * esize;
            for (int c = 0; c < cols; c += 16)
                memcpy(to + (size_t)(c / 16) * step, group + (size_t)r * row_bytes + (size_t)c * esize, 16 * esize);
        }
    }
    free(group);
    return G;
}
