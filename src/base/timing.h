/* Seconds spent per phase on this rank; gathered to rank 0 for the report. */
#ifndef DCP_TIMING_H
#define DCP_TIMING_H

#define TIMING_PHASES(X) \
    X(load)              \
    X(tokenize)          \
    X(prefill)           \
    X(decode)            \
    X(sampling)          \
    X(matmul)            \
    X(attention)         \
    X(moe)               \
    X(lm_head)           \
    X(total)

typedef struct {
#define TIMING_FIELD(name) double name;
    TIMING_PHASES(TIMING_FIELD)
#undef TIMING_FIELD
} Timings;

enum {
#define TIMING_COUNT(name) TIMING_IDX_##name,
    TIMING_PHASES(TIMING_COUNT)
#undef TIMING_COUNT
    TIMING_N
};

extern const char *const timing_names[TIMING_N];

#endif
