/*
 * nn/cuda/module.c: the entry point of meshtrain-cuda.so, the module the
 * cuda backend is built into (nn/cuda/include.am): the table nn/ctx.c
 * reads after dlopen.
 */
#include "config.h"

#include "nn/backend.h"

const struct mesh_nn_cuda_module mesh_nn_cuda_module = {
    .abi = MESH_NN_CUDA_MODULE_ABI,
    .ops_size = sizeof(struct mesh_nn_backend_ops),
    .version = PACKAGE_VERSION,
    .ops = &mesh_nn_cuda_ops,
    .host_alloc = mesh_nn_cuda_host_alloc,
    .host_owns = mesh_nn_cuda_host_owns,
    .host_free = mesh_nn_cuda_host_free,
};
