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

int mesh_nn_cuda_host_alloc(size_t len, void **out)
{
    cudaError_t err;
    void *p = NULL;

    if (!atomic_load(&host_usable))
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

    if (!atomic_load(&host_used))
        return 0;
    if (cudaHostGetFlags(&flags, (void *)p) == cudaSuccess)
        return 1;
    cudaGetLastError();
    return 0;
}

void mesh_nn_cuda_host_free(void *p)
{
    cudaError_t err = cudaFreeHost(p);

    if (err != cudaSuccess)
        mesh_warn("cudaFreeHost: %s", cudaGetErrorString(err));
}
