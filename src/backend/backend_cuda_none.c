/* The CUDA backend of a build configured without --enable-cuda: asking for
 * it is an error that says how to get it. (With --enable-cuda the build
 * compiles cuda/backend_cuda.cu instead of this file.) */
#include "backend.h"
#include "device.h"
#include "util.h"

const Backend *backend_cuda(void)
{
    dcp_fail("--backend cuda: this dcpinfer was built without CUDA (configure --enable-cuda)");
    return NULL;
}

void backend_cuda_set_threads(int threads) { (void)threads; }

int device_select(const char *backend)
{
    (void)backend;
    return -1;
}

const char *device_name(int device)
{
    (void)device;
    return "-";
}

double device_peak_bandwidth(int device)
{
    (void)device;
    return 0;
}
