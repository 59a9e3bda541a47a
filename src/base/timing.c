#include "timing.h"

const char *const timing_names[TIMING_N] = {
#define TIMING_NAME(name) #name,
    TIMING_PHASES(TIMING_NAME)
#undef TIMING_NAME
};
