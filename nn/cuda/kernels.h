/*
 * nn/cuda/kernels.h: the CUDA kernels of the "cuda" backend (kernels.cu),
 * reached through extern "C" launchers so that the backend itself stays in
 * plain C (cuda.c). Every launcher enqueues on the given stream and returns
 * the cudaError_t of the launch (cudaGetLastError() after it), as an int so
 * that this header needs no CUDA types: 0 is success. Pointers are device
 * pointers; tensors are NCHW float32 unless said otherwise.
 */
#ifndef MESH_NN_CUDA_KERNELS_H
#define MESH_NN_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y = max(x, 0) over n; mask (n bytes, may be NULL) = (y > 0). */
int mesh_cuk_relu_fwd(void *stream, size_t n, const float *x, float *y,
                      uint8_t *mask);
/* dx = y > 0 ? dy : 0 (in place allowed). */
int mesh_cuk_relu_bwd(void *stream, size_t n, const float *y, const float *dy,
                      float *dx);
/* dx = mask ? dy : 0 (in place allowed). */
int mesh_cuk_mask_bwd(void *stream, size_t n, const uint8_t *mask,
                      const float *dy, float *dx);
/* y = a + b, then max(., 0) when relu (y may alias a or b). */
int mesh_cuk_add(void *stream, size_t n, const float *a, const float *b,
                 float *y, int relu);
/* y += x. */
int mesh_cuk_axpy1(void *stream, size_t n, const float *x, float *y);

/* Max pool r x r window; argmax (n, c, oh, ow) int32 index into h * w. */
int mesh_cuk_maxpool_fwd(void *stream, int n, int c, int h, int w, int oh,
                         int ow, int r, int stride, int pad, const float *x,
                         float *y, int32_t *argmax);
/* Gather form: each input element sums the dy of the windows that chose
 * it (deterministic, no atomics). */
int mesh_cuk_maxpool_bwd(void *stream, int n, int c, int h, int w, int oh,
                         int ow, int r, int stride, int pad, const float *dy,
                         const int32_t *argmax, float *dx);
/* Global average: y (n * c) = mean over hw; dx = dy / hw broadcast. */
int mesh_cuk_avgpool_fwd(void *stream, int nc, int hw, const float *x,
                         float *y);
int mesh_cuk_avgpool_bwd(void *stream, int nc, int hw, const float *dy,
                         float *dx);

/* y (n, k) = broadcast bias b (k); db (k) = column sums of dy (n, k). */
int mesh_cuk_bias_fill(void *stream, int n, int k, const float *b, float *y);
int mesh_cuk_bias_grad(void *stream, int n, int k, const float *dy, float *db);

/*
 * Softmax cross-entropy with label smoothing eps, per row i:
 * rowloss[i] = lse - (1 - eps) x[label] - eps / k sum_j x[j];
 * dlogits = (softmax - target) / n. *bad = 1 when a label is outside
 * [0, k) (that row's outputs are then 0).
 */
int mesh_cuk_xent(void *stream, int n, int k, const float *logits,
                  const int32_t *labels, float eps, float *rowloss,
                  float *dlogits, int *bad);

/* PyTorch's SGD on n floats (see struct mesh_nn_sgd_args); buf may be
 * NULL when momentum == 0. */
int mesh_cuk_sgd(void *stream, size_t n, float *p, const float *g, float *buf,
                 float lr, float momentum, float dampening, float wd,
                 int nesterov, int first);

/* Conversions with a scale between MESH_DT_F32, MESH_DT_F16 and
 * MESH_DT_BF16 (common/dtype.h); one side float32; round to nearest even. */
int mesh_cuk_convert(void *stream, size_t n, int dst_dtype, void *dst,
                     int src_dtype, const void *src, float scale);

/* A readable name of a launcher's return code. */
const char *mesh_cuk_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif
