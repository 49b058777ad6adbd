/*
 * nn/cuda/host.c: pinned host memory from the CUDA runtime, behind
 * mesh_nn_host_alloc (nn/stream.c) when built with CUDA.
 */
#include "config.h"

#include "common/util.h"
#include "nn/backend.h"

#include <errno.h>
#include <stdatomic.h>

#include <cuda_runtime.h>

/* ---- pinned host memory (mesh_nn_host_alloc) ----------------------------- */

static atomic_int host_usable = 1; /* cleared at the first failure */
static atomic_int host_used;       /* set at the first success */
/* The device of the last cuda device opened, -1 before: any runtime call
 * on a thread without a current device creates a context on device 0
 * (hundreds of MiB there, and a process on every GPU's peer). */
static atomic_int host_gpu = -1;

void mesh_nn_cuda_host_device(int gpu)
{
    atomic_store(&host_gpu, gpu);
}

/* Make host_gpu current on this thread; 0, or -ENODEV before any device. */
static int host_bind(void)
{
    int gpu = atomic_load(&host_gpu);

    if (gpu < 0)
        return -ENODEV;
    if (cudaSetDevice(gpu) != cudaSuccess) {
        cudaGetLastError();
        return -ENODEV;
    }
    return 0;
}

int mesh_nn_cuda_host_alloc(size_t len, void **out)
{
    cudaError_t err;
    void *p = NULL;

    /* before a cuda device is open (and in cpu runs) this memory is only
     * mlock'ed: pinning it would create a context on device 0 */
    if (!atomic_load(&host_usable) || host_bind() < 0)
        return -ENODEV;
    err = cudaHostAlloc(&p, len ? len : 1, cudaHostAllocPortable);
    if (err != cudaSuccess) {
        if (atomic_exchange(&host_usable, 0))
            mesh_debug("cudaHostAlloc: %s; using mlock'ed host memory",
                       cudaGetErrorString(err));
        cudaGetLastError();
        return -ENODEV;
    }
    atomic_store(&host_used, 1);
    *out = p;
    return 0;
}

int mesh_nn_cuda_host_owns(const void *p)
{
    unsigned int flags;

    if (!atomic_load(&host_used) || host_bind() < 0)
        return 0;
    if (cudaHostGetFlags(&flags, (void *)p) == cudaSuccess)
        return 1;
    cudaGetLastError();
    return 0;
}

void mesh_nn_cuda_host_free(void *p)
{
    cudaError_t err;

    (void)host_bind(); /* set before any pinned block exists */
    err = cudaFreeHost(p);
    if (err != cudaSuccess)
        mesh_warn("cudaFreeHost: %s", cudaGetErrorString(err));
}
