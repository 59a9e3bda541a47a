// The CUDA backend: the ops of src/backend/backend_cpu.c on the GPU, as
// kernels, one kind of op a file (backend_cuda.cuh); the GEMMs in the CPU
// backend's invariant arithmetic (gemm.cu). All work goes to one
// stream; downloads wait for it. Weights and the KV cache live in device
// memory from cudaMalloc (never managed memory). This file: memory, the
// stream, the launch checks and the ops table.
#include "backend_cuda.cuh"

cudaStream_t stream;
BackendCounts counts;
int gemm_bf16;

// ---- memory -----------------------------------------------------------

void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    counts.allocations++;
    DCP_CHECK(cudaMalloc(&p, bytes ? bytes : 4));
    return p;
}

void cuda_release(void *p) { DCP_CHECK(cudaFree(p)); }

// Returns once src may be reused (gpu_runtime.h); in stream order.
void cuda_upload(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    counts.uploads++;
    DCP_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    DCP_CHECK(gpu_pageable_source_released(stream));
}

// Weights: on the compute stream, waited for, so that no kernel can start
// before they land (a copy on the legacy default stream is not ordered
// before work on a non-blocking stream).
static void upload_weights(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    DCP_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    DCP_CHECK(cudaStreamSynchronize(stream));
}

void cuda_download(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    counts.downloads++;
    counts.d2h_bytes += (long long)bytes;
    DCP_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    DCP_CHECK(cudaStreamSynchronize(stream));
}

void cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    cuda_count_launch("copy");
    DCP_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

static void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    counts.allocations++;
    DCP_CHECK(cudaMallocHost(&p, bytes ? bytes : 4));
    return p;
}

static void cuda_host_release(void *p) { DCP_CHECK(cudaFreeHost(p)); }

static const float *cuda_weights(const float *host, size_t n)
{
    float *d = (float *)cuda_alloc(sizeof(float) * n);
    upload_weights(d, host, sizeof(float) * n);
    return d;
}

static void cuda_release_weights(const void *p) { cuda_release((void *)p); }

// The matrices matmul reads: as loaded (bf16 stays bf16), or fp32 rounded
// to bf16 (round to nearest even, as f32_to_bf16 does) with --dtype
// bfloat16, stored in half the memory.
// the device's total memory (HIP-CPU: the host's)
static size_t cuda_device_memory(void)
{
    size_t free_bytes = 0, total = 0;
    DCP_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return total;
}

static WeightRef cuda_gemm_weights(WeightRef host, size_t n)
{
    if (dtype_quantized(host.dtype)) { // as stored, with its scales: --dtype never widens it
        WeightRef w = host;
        size_t bytes = dtype_data_bytes(host.dtype, n);
        void *d = cuda_alloc(bytes ? bytes : 1);
        upload_weights(d, host.data, bytes);
        size_t ns = n / (size_t)host.qcols;
        w.data = d;
        if (host.scale8) { // NVFP4's codes as stored, and their tables
            size_t nt = weight_tables(host, n) * WEIGHT_TABLE;
            uint8_t *c = (uint8_t *)cuda_alloc(ns ? ns : 1);
            float *t = (float *)cuda_alloc(sizeof(float) * nt);
            upload_weights(c, host.scale8, ns);
            upload_weights(t, host.tables, sizeof(float) * nt);
            w.scale8 = c;
            w.tables = t;
            return w;
        }
        float *s = (float *)cuda_alloc(sizeof(float) * (ns ? ns : 1));
        upload_weights(s, host.scale, sizeof(float) * ns);
        w.scale = s;
        return w;
    }
    if (host.dtype == DTYPE_BF16) {
        void *d = cuda_alloc(sizeof(uint16_t) * (n ? n : 1));
        upload_weights(d, host.data, sizeof(uint16_t) * n);
        return weight_ref(d, DTYPE_BF16, 0);
    }
    const float *f = (const float *)host.data;
    if (!gemm_bf16) return weight_ref(cuda_weights(f, n), DTYPE_F32, 0);
    uint16_t *h = (uint16_t *)xmalloc(sizeof(uint16_t) * (n ? n : 1));
    f32_to_bf16_n(h, f, n);
    void *d = cuda_alloc(sizeof(uint16_t) * n);
    upload_weights(d, h, sizeof(uint16_t) * n);
    free(h);
    return weight_ref(d, DTYPE_BF16, 0);
}

static int cuda_set_gemm_dtype(const char *dtype)
{
    if (!strcmp(dtype, "auto") || !strcmp(dtype, "float32")) gemm_bf16 = 0;
    else if (!strcmp(dtype, "bfloat16")) gemm_bf16 = 1;
    else return dcp_fail("--dtype %s: choose float32 or bfloat16", dtype);
    return 0;
}

// DCPINFER_CUDA_LAUNCHES=1: each kernel's launches (device copies as
// "copy"), printed on stderr at exit; a kernel is its name's string, the
// same pointer at every launch
static struct {
    const char *kernel;
    long n;
} launch_log[64];
static void print_launches(void)
{
    for (int i = 0; i < 64 && launch_log[i].kernel; i++)
        fprintf(stderr, "dcpinfer: %8ld launches of %s\n", launch_log[i].n, launch_log[i].kernel);
}
void cuda_count_launch(const char *kernel)
{
    counts.launches++;
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DCPINFER_CUDA_LAUNCHES");
        on = e && !strcmp(e, "1");
        if (on) atexit(print_launches);
    }
    if (!on) return;
    int i = 0;
    while (i < 63 && launch_log[i].kernel && launch_log[i].kernel != kernel) i++;
    launch_log[i].kernel = kernel;
    launch_log[i].n++;
}

int cuda_sync_each_launch(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DCPINFER_CUDA_SYNC");
        on = e && !strcmp(e, "1");
    }
    return on;
}

void dcp_launch_check(const char *kernel, dim3 grid, dim3 block, size_t dynamic_shared, size_t static_shared,
                      const void *func)
{
    char what[160];
    unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (!threads || threads > DCP_MAX_BLOCK_THREADS || block.z > 64)
        snprintf(what, sizeof what, "%lu threads per block (%ux%ux%u): a GPU takes 1 to %d", threads, block.x,
                 block.y, block.z, DCP_MAX_BLOCK_THREADS);
    else if (!grid.x || !grid.y || !grid.z || grid.y > 65535 || grid.z > 65535)
        snprintf(what, sizeof what, "grid %ux%ux%u: a GPU takes 1 to 65535 blocks in y and z", grid.x, grid.y, grid.z);
    else if (static_shared + dynamic_shared > DCP_MAX_STATIC_SHARED)
        snprintf(what, sizeof what, "%zu bytes of shared memory per block: a GPU takes %d without opting in",
                 static_shared + dynamic_shared, DCP_MAX_STATIC_SHARED);
    else
        what[0] = 0;
#ifndef DCP_HIP_CPU
    cudaFuncAttributes attr;
    if (!what[0] && cudaFuncGetAttributes(&attr, func) == cudaSuccess && attr.sharedSizeBytes != static_shared)
        snprintf(what, sizeof what, "%zu bytes of static shared memory, declared as %zu (DCP_STATIC_SHARED)",
                 (size_t)attr.sharedSizeBytes, static_shared);
#else
    (void)func;
#endif
    if (what[0]) dcp_check_failed(__FILE__, __LINE__, kernel, what);
}

static void cuda_synchronize(void)
{
    counts.synchronizes++;
    DCP_CHECK(cudaStreamSynchronize(stream));
}

#ifdef DCP_HIP_CPU
#include <memory>
#include <tbb/global_control.h>
// HIP-CPU runs a kernel's blocks through the C++ parallel algorithms (TBB):
// at most the rank's share of the cores, as the CPU backend's threads
extern "C" void backend_cuda_set_threads(int threads)
{
    static std::unique_ptr<tbb::global_control> limit;
    limit.reset();
    if (threads > 0) limit.reset(new tbb::global_control(tbb::global_control::max_allowed_parallelism, threads));
}
#else
extern "C" void backend_cuda_set_threads(int threads) { (void)threads; }
#endif

// ---- the table ----------------------------------------------------------

static Backend cuda_table;

extern "C" const Backend *backend_cuda(void)
{
    static int ready;
    if (ready) return &cuda_table;
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        dcp_fail("--backend cuda: no usable GPU on this machine (%s)",
                 rc != cudaSuccess ? cudaGetErrorString(rc) : "no CUDA device visible");
        return NULL;
    }
    DCP_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Backend b;
    memset(&b, 0, sizeof b);
    b.name = "cuda";
    b.runs_on = GPU_RUNS_ON;
    b.host_memory = 0;
    b.device_memory = cuda_device_memory;
    b.alloc = cuda_alloc;
    b.release = cuda_release;
    b.upload = cuda_upload;
    b.download = cuda_download;
    b.copy = cuda_copy;
    b.host_alloc = cuda_host_alloc;
    b.host_release = cuda_host_release;
    b.weights = cuda_weights;
    b.gemm_weights = cuda_gemm_weights;
    b.release_weights = cuda_release_weights;
    b.set_gemm_dtype = cuda_set_gemm_dtype;
    b.nvfp4_act = cuda_fp4_activations;
    b.synchronize = cuda_synchronize;
    b.matmul = cuda_matmul;
    b.rmsnorm = cuda_rmsnorm;
    b.rope = cuda_rope;
    b.silu_mul = cuda_silu_mul;
    b.add = cuda_add;
    b.sum_parts = cuda_sum_parts;
    b.scale = cuda_scale;
    b.add_bias = cuda_add_bias;
    b.embedding = cuda_embedding;
    b.gather_rows = cuda_gather_rows;
    b.kv_write = cuda_kv_write;
    b.kv_dtypes = 1u << DTYPE_F32 | 1u << DTYPE_BF16 | 1u << DTYPE_F8_E4M3;
    b.round_kv = cuda_round_kv;
    b.strided_copy = cuda_strided_copy;
    b.matmul_batched = cuda_matmul_batched;
    b.moe_route = cuda_moe_route;
    b.moe_matmul = cuda_moe_matmul;
    b.moe_combine = cuda_moe_combine;
    b.counts = &counts;
    b.attention = cuda_attention;
    b.merge_partials = cuda_merge_partials;
    b.pack_partials = cuda_pack_partials;
    cuda_table = b;
    ready = 1;
    return &cuda_table;
}
