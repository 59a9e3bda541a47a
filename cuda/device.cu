// Choosing the GPU of a rank, before MPI_Init (see src/device.h).
#include "gpu_runtime.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "device.h"
}

extern "C" int device_select(const char *backend)
{
    if (!backend || strcmp(backend, "cuda")) return -1;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return -1; // backend_cuda() says why
    int local = launcher_local_rank(NULL);
    int device = (local < 0 ? 0 : local) % count;
    if (cudaSetDevice(device) != cudaSuccess) return -1;
    return device;
}

extern "C" double device_peak_bandwidth(int device)
{
    int clock_khz = 0, bus_bits = 0;
    if (device < 0 || cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess)
        return 0;
    return 2.0 * clock_khz * 1e3 * bus_bits / 8.0; /* double data rate */
}

extern "C" const char *device_name(int device)
{
    static char name[256];
    cudaDeviceProp p;
    if (device < 0 || cudaGetDeviceProperties(&p, device) != cudaSuccess) return "-";
    snprintf(name, sizeof name, "%s", p.name);
    return name;
}
