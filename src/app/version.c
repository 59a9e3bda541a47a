/* dcpinfer --version: the release, how this build was configured, and the
 * libraries it runs with, for bug reports and for telling builds apart. */
#include "version.h"

#include <cblas.h>
#include <hdf5.h>
#include <jansson.h>
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "device.h"
#include "kernels_cpu.h"

void print_version(FILE *f)
{
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(mpi, &len); /* allowed before MPI_Init */
    char *nl = strchr(mpi, '\n');
    if (nl) *nl = '\0';
    char *comma = strchr(mpi, ','); /* Open MPI: "Open MPI v4.1.4, package: ..." */
    if (comma) *comma = '\0';
    unsigned h5[3] = {0};
    H5get_libversion(&h5[0], &h5[1], &h5[2]);
    fprintf(f, "%s %s\n", PACKAGE_NAME, PACKAGE_VERSION);
    fprintf(f, "configure: %s\n", *DCP_CONFIGURE_ARGS ? DCP_CONFIGURE_ARGS : "(no options)");
    fprintf(f, "backends: cpu (kernels: %s on this CPU); %s\n", cpu_isa(), DCP_CUDA_BUILD);
#if defined(__clang__)
    const char *cc = "clang ";
#elif defined(__GNUC__)
    const char *cc = "gcc ";
#else
    const char *cc = "";
#endif
    fprintf(f, "sanitizers: %s; compiler: %s%s\n", DCP_SANITIZERS, cc, __VERSION__);
    fprintf(f, "libraries: %s; HDF5 %u.%u.%u; OpenBLAS (%s); jansson %s\n", mpi, h5[0], h5[1], h5[2],
            openblas_get_config(), JANSSON_VERSION);
#if defined(MPIX_CUDA_AWARE_SUPPORT)
    const char *built = MPIX_CUDA_AWARE_SUPPORT ? "built CUDA-aware" : "built without CUDA support";
#else
    const char *built = "no CUDA-awareness query (mpi-ext.h)";
#endif
    fprintf(f, "MPI and device memory: %s; takes device buffers now: %s\n", built,
            device_mpi_accepts_device_buffers() ? "yes" : "no (staged through host memory)");
}
