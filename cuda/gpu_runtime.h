// The GPU runtime the CUDA backend is written against: CUDA itself under
// nvcc; under DCP_HIP_CPU, ROCm's HIP-CPU runtime (../shared/vendor/hip-cpu,
// configure --with-hip-cpu), which runs the same kernels on the CPU so that
// every test run executes them. Only the names the backend uses are mapped,
// and what HIP-CPU lacks is given here:
// - launches: DCP_LAUNCH(kernel, grid, block, shmem, stream, args...), as
//   g++ cannot parse <<<...>>>;
// - bf16: a 16-bit type with the round-to-nearest-even conversion;
// - rsqrtf, integer min/max, and the correctly rounded arithmetic
//   intrinsics (__fadd_rn, __fmul_rn, __frcp_rn), which are plain IEEE
//   operations on the CPU;
// - an idle stream thread that sleeps now and then instead of spinning
//   (several ranks share a core in the tests).
// HIP-CPU's warp is 64 threads wide: no kernel here may depend on a warp
// width, and none uses warp-level primitives.
#ifndef DCP_GPU_RUNTIME_H
#define DCP_GPU_RUNTIME_H

#ifndef DCP_HIP_CPU

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define DCP_KERNEL_LAUNCH(kernel, grid, block, shmem, stream, ...) kernel<<<grid, block, shmem, stream>>>(__VA_ARGS__)
#define GPU_RUNS_ON NULL
// cudaMemcpyAsync from pageable host memory returns once the source may be
// reused (CUDA stages it): nothing to wait for
static inline cudaError_t gpu_pageable_source_released(cudaStream_t) { return cudaSuccess; }

#else

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>

// HIP-CPU's stream thread polls with `pause` while it waits for work: with
// more ranks than cores that starves the ranks that have work. Every 32nd
// poll sleeps 20 us instead.
namespace dcp_hip_cpu {
inline void idle_poll()
{
    static thread_local unsigned polls;
    if (++polls % 32 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
    else __builtin_ia32_pause();
}
} // namespace dcp_hip_cpu
#define YieldProcessor() dcp_hip_cpu::idle_poll()

#include <hip/hip_runtime.h>

#define DCP_KERNEL_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    hipLaunchKernelGGL(kernel, dim3(grid), dim3(block), shmem, stream, __VA_ARGS__)
#define GPU_RUNS_ON "the CUDA kernels on CPU threads, through HIP-CPU"
// HIP-CPU's hipMemcpyAsync reads a pageable source when the stream reaches
// the copy, not when it is called: wait for the stream, so that the source
// may be reused on return as under CUDA
static inline hipError_t gpu_pageable_source_released(hipStream_t s) { return hipStreamSynchronize(s); }

typedef hipStream_t cudaStream_t;
typedef hipError_t cudaError_t;
typedef hipDeviceProp_t cudaDeviceProp;
#define cudaSuccess hipSuccess
#define cudaMemGetInfo hipMemGetInfo
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost(p, n) hipHostMalloc((p), (n))
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceProperties hipGetDeviceProperties

// device attributes HIP-CPU does not have: a CPU has no GPU memory bus to
// report (device_peak_bandwidth then reports none)
enum cudaDeviceAttr { cudaDevAttrMemoryClockRate, cudaDevAttrGlobalMemoryBusWidth };
inline cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr, int)
{
    *value = 0;
    return hipErrorInvalidValue;
}

// bf16 storage: the upper half of a float, rounded to nearest even
struct __nv_bfloat16 {
    uint16_t bits;
};
__host__ __device__ inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40)}; // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
__host__ __device__ inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

__host__ __device__ inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
__host__ __device__ inline int min(int a, int b) { return a < b ? a : b; }
__host__ __device__ inline int max(int a, int b) { return a > b ? a : b; }
__host__ __device__ inline float __fadd_rn(float a, float b) { return a + b; }
__host__ __device__ inline float __fmul_rn(float a, float b) { return a * b; }
__host__ __device__ inline float __frcp_rn(float a) { return 1.0f / a; }


#endif

// ---- launch limits ------------------------------------------------------
// What any CUDA GPU accepts of a launch: at most 1024 threads per block
// (x and y up to 1024, z up to 64), 48 KiB of static shared memory per
// block, grid y and z up to 65535. HIP-CPU accepts far more, so the
// backend checks every launch itself under DCPINFER_CUDA_SYNC=1
// (dcp_launch_check in backend_cuda.cu). A kernel's static shared memory
// is declared beside it with DCP_STATIC_SHARED (0 when not declared); on
// a GPU the check also compares the declaration with what the compiler
// reserved, so that the HIP-CPU check cannot drift from the kernel.
#define DCP_MAX_BLOCK_THREADS 1024
#define DCP_MAX_STATIC_SHARED (48 * 1024)
template <auto Kernel> struct dcp_static_shared {
    static constexpr size_t bytes = 0;
};
#define DCP_STATIC_SHARED(kernel, n)                                                   \
    template <> struct dcp_static_shared<kernel> {                                     \
        static constexpr size_t bytes = (n);                                           \
    };                                                                                 \
    static_assert((n) <= DCP_MAX_STATIC_SHARED, #kernel ": static shared memory above 48 KiB")
int cuda_sync_each_launch(void);
void cuda_count_launch(const char *kernel); // BackendCounts.launches; by kernel with DCPINFER_CUDA_LAUNCHES=1
void dcp_launch_check(const char *kernel, dim3 grid, dim3 block, size_t dynamic_shared, size_t static_shared,
                      const void *func);
#define DCP_LAUNCH(kernel, grid, block, shmem, stream, ...)                                                   \
    do {                                                                                                      \
        cuda_count_launch(#kernel);                                                                               \
        if (cuda_sync_each_launch())                                                                          \
            dcp_launch_check(#kernel, dim3(grid), dim3(block), (shmem), dcp_static_shared<kernel>::bytes,    \
                             (const void *)(kernel));                                                         \
        DCP_KERNEL_LAUNCH(kernel, grid, block, shmem, stream, __VA_ARGS__);                                   \
    } while (0)

#endif
