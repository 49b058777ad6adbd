/*
 * nn/cpu-bn.h: the cpu backend's batch norm (nn/cpu_bn.c), with its
 * reductions in double. Internal to nn/cpu_dnnl.c.
 */
#ifndef MESH_NN_CPU_BN_H
#define MESH_NN_CPU_BN_H

#include <stddef.h>

/* One batch norm's shape and layout. */
struct mesh_nn_cpu_bn {
    int n, c, hw; /* batch, channels, height * width */
    int block;    /* channels per block of the layout: 16, 8 or 1 (NCHW) */
    int relu;     /* a ReLU follows, fused */
    float eps;
};

/* Bytes of workspace each op needs, and of the fused ReLU's mask. */
size_t mesh_nn_cpu_bn_ws_bytes(const struct mesh_nn_cpu_bn *s);
size_t mesh_nn_cpu_bn_reserve_bytes(const struct mesh_nn_cpu_bn *s);

/*
 * Training forward: batch statistics (biased variance to normalise, the
 * unbiased one into running_var, PyTorch's rule with momentum), y (may be
 * x), save = (mean, 1 / sqrt(var + eps)) as 2 c floats, reserve = the
 * ReLU's mask when relu.
 */
void mesh_nn_cpu_bn_fwd_train(const struct mesh_nn_cpu_bn *s, const float *x,
                              float *y, const float *gamma, const float *beta,
                              float *running_mean, float *running_var,
                              float momentum, float *save, void *reserve,
                              void *ws);

/* Inference forward with the running statistics. */
void mesh_nn_cpu_bn_fwd_infer(const struct mesh_nn_cpu_bn *s, const float *x,
                              float *y, const float *gamma, const float *beta,
                              const float *running_mean,
                              const float *running_var, void *ws);

/* Backward from save and reserve: dx (may alias dy), dgamma, dbeta. */
void mesh_nn_cpu_bn_bwd(const struct mesh_nn_cpu_bn *s, const float *x,
                        const float *dy, const float *gamma, const float *save,
                        const void *reserve, float *dx, float *dgamma,
                        float *dbeta, void *ws);

/* Backward of the inference form (frozen BN) to x: dx (may alias dy) =
 * dy * gamma / sqrt(running_var + eps), 0 where the ReLU's y is 0. */
void mesh_nn_cpu_bn_bwd_frozen(const struct mesh_nn_cpu_bn *s, const float *y,
                               const float *dy, const float *gamma,
                               const float *running_var, float *dx);

#endif
