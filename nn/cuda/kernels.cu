/*
 * nn/cuda/kernels.cu: the few kernels the "cuda" backend needs beyond cuDNN
 * and cuBLAS (see kernels.h for the contract of each launcher). Element-wise
 * kernels use grid-stride loops over size_t indices; reductions use one
 * block per row with a shared-memory tree. Kept small: this file is
 * compiled for every architecture in NVCC_ARCH_FLAGS in CI on 2 cores.
 */
#include "common/dtype.h"
#include "nn/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define THREADS 256

/* Blocks for n elements in a grid-stride loop (capped: the loop covers the
 * rest). */
static unsigned int blocks_for(size_t n)
{
    size_t b = (n + THREADS - 1) / THREADS;

    if (b > 65535u * 4u)
        b = 65535u * 4u;
    return b ? (unsigned int)b : 1u;
}

static int launched(void)
{
    return (int)cudaGetLastError();
}

#define GRID_LOOP(i, n)                                                        \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);    \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void k_relu_fwd(size_t n, const float *x, float *y, uint8_t *mask)
{
    GRID_LOOP(i, n)
    {
        float v = x[i] > 0.f ? x[i] : 0.f;

        y[i] = v;
        if (mask)
            mask[i] = v > 0.f;
    }
}

__global__ void k_relu_bwd(size_t n, const float *y, const float *dy, float *dx)
{
    GRID_LOOP(i, n)
    {
        dx[i] = y[i] > 0.f ? dy[i] : 0.f;
    }
}

__global__ void k_mask_bwd(size_t n, const uint8_t *m, const float *dy,
                           float *dx)
{
    GRID_LOOP(i, n)
    {
        dx[i] = m[i] ? dy[i] : 0.f;
    }
}

__global__ void k_add(size_t n, const float *a, const float *b, float *y,
                      int relu)
{
    GRID_LOOP(i, n)
    {
        float v = a[i] + b[i];

        y[i] = relu && !(v > 0.f) ? 0.f : v;
    }
}

__global__ void k_axpy1(size_t n, const float *x, float *y)
{
    GRID_LOOP(i, n)
    {
        y[i] += x[i];
    }
}

/* One thread per output; ties keep the first maximum in window order, and
 * a NaN wins (as PyTorch's max pool propagates NaN). */
__global__ void k_maxpool_fwd(int n, int c, int h, int w, int oh, int ow, int r,
                              int stride, int pad, const float *x, float *y,
                              int32_t *argmax)
{
    size_t total = (size_t)n * c * oh * ow;

    GRID_LOOP(i, total)
    {
        int ox = (int)(i % ow), oy = (int)(i / ow % oh);
        size_t plane = i / ((size_t)oh * ow);
        const float *xp = x + plane * (size_t)h * w;
        float best = -INFINITY;
        int bi = -1;

        for (int dy = 0; dy < r; dy++) {
            int iy = oy * stride - pad + dy;

            if (iy < 0 || iy >= h)
                continue;
            for (int dx = 0; dx < r; dx++) {
                int ix = ox * stride - pad + dx;
                float v;

                if (ix < 0 || ix >= w)
                    continue;
                v = xp[iy * w + ix];
                if (bi < 0 || v > best || isnan(v)) {
                    best = v;
                    bi = iy * w + ix;
                    if (isnan(v))
                        goto found;
                }
            }
        }
    found:
        y[i] = best;
        argmax[i] = bi;
    }
}

/* One thread per input element: the windows covering (iy, ix) are
 * oy in [ceil((iy + pad - r + 1) / stride), (iy + pad) / stride]. */
__global__ void k_maxpool_bwd(int n, int c, int h, int w, int oh, int ow, int r,
                              int stride, int pad, const float *dy,
                              const int32_t *argmax, float *dx)
{
    size_t total = (size_t)n * c * h * w;

    GRID_LOOP(i, total)
    {
        int ix = (int)(i % w), iy = (int)(i / w % h);
        size_t plane = i / ((size_t)h * w);
        const float *dyp = dy + plane * (size_t)oh * ow;
        const int32_t *ap = argmax + plane * (size_t)oh * ow;
        int me = iy * w + ix;
        int y0 = iy + pad - r + 1, y1 = (iy + pad) / stride;
        int x0 = ix + pad - r + 1, x1 = (ix + pad) / stride;
        float s = 0.f;

        y0 = y0 <= 0 ? 0 : (y0 + stride - 1) / stride;
        x0 = x0 <= 0 ? 0 : (x0 + stride - 1) / stride;
        if (y1 >= oh)
            y1 = oh - 1;
        if (x1 >= ow)
            x1 = ow - 1;
        for (int oy = y0; oy <= y1; oy++)
            for (int ox = x0; ox <= x1; ox++)
                if (ap[oy * ow + ox] == me)
                    s += dyp[oy * ow + ox];
        dx[i] = s;
    }
}

/* One block per (n, c) plane. */
__global__ void k_avgpool_fwd(int hw, const float *x, float *y)
{
    __shared__ float sh[THREADS];
    const float *xp = x + (size_t)blockIdx.x * hw;
    float s = 0.f;

    for (int j = threadIdx.x; j < hw; j += blockDim.x)
        s += xp[j];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k)
            sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        y[blockIdx.x] = sh[0] / (float)hw;
}

__global__ void k_avgpool_bwd(size_t total, int hw, const float *dy, float *dx)
{
    GRID_LOOP(i, total)
    {
        dx[i] = dy[i / hw] / (float)hw;
    }
}

__global__ void k_bias_fill(size_t total, int k, const float *b, float *y)
{
    GRID_LOOP(i, total)
    {
        y[i] = b[i % k];
    }
}

__global__ void k_bias_grad(int n, int k, const float *dy, float *db)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    float s = 0.f;

    if (j >= k)
        return;
    for (int i = 0; i < n; i++)
        s += dy[(size_t)i * k + j];
    db[j] = s;
}

/* Block-wide reduction (max or sum) of one value per thread. */
__device__ float block_reduce(float v, float *sh, int is_max)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) {
            float o = sh[threadIdx.x + k];

            sh[threadIdx.x] =
                is_max ? fmaxf(sh[threadIdx.x], o) : sh[threadIdx.x] + o;
        }
        __syncthreads();
    }
    v = sh[0];
    __syncthreads();
    return v;
}

/* One block per row. */
__global__ void k_xent(int n, int k, const float *logits, const int32_t *labels,
                       float eps, float *rowloss, float *dlogits, int *bad)
{
    __shared__ float sh[THREADS];
    const float *z = logits + (size_t)blockIdx.x * k;
    float *dz = dlogits + (size_t)blockIdx.x * k;
    int lab = labels[blockIdx.x];
    float m = -INFINITY, s = 0.f, zs = 0.f, lse;

    if (lab < 0 || lab >= k) {
        if (threadIdx.x == 0) {
            *bad = 1;
            rowloss[blockIdx.x] = 0.f;
        }
        for (int j = threadIdx.x; j < k; j += blockDim.x)
            dz[j] = 0.f;
        return;
    }
    for (int j = threadIdx.x; j < k; j += blockDim.x)
        m = fmaxf(m, z[j]);
    m = block_reduce(m, sh, 1);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        s += expf(z[j] - m);
        zs += z[j];
    }
    s = block_reduce(s, sh, 0);
    zs = block_reduce(zs, sh, 0);
    lse = m + logf(s);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        float t = eps / (float)k + (j == lab ? 1.f - eps : 0.f);

        dz[j] = (expf(z[j] - lse) - t) / (float)n;
    }
    if (threadIdx.x == 0)
        rowloss[blockIdx.x] = lse - (1.f - eps) * z[lab] - eps / (float)k * zs;
}

__global__ void k_sgd(size_t n, float *p, const float *g, float *buf, float lr,
                      float momentum, float dampening, float wd, int nesterov,
                      int first)
{
    GRID_LOOP(i, n)
    {
        float d = g[i];

        if (wd != 0.f)
            d = d + wd * p[i];
        if (momentum != 0.f) {
            float b = first ? d : momentum * buf[i] + (1.f - dampening) * d;

            buf[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        p[i] = p[i] - lr * d;
    }
}

__device__ float load_as_f32(int dt, const void *p, size_t i)
{
    if (dt == MESH_DT_F16)
        return __half2float(((const __half *)p)[i]);
    if (dt == MESH_DT_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

__device__ void store_from_f32(int dt, void *p, size_t i, float v)
{
    if (dt == MESH_DT_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else if (dt == MESH_DT_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

__global__ void k_convert(size_t n, int dt_dst, void *dst, int dt_src,
                          const void *src, float scale)
{
    GRID_LOOP(i, n)
    {
        float v = load_as_f32(dt_src, src, i);

        store_from_f32(dt_dst, dst, i, scale == 1.f ? v : v * scale);
    }
}

#define STREAM(s) ((cudaStream_t)(s))

extern "C" {

int mesh_cuk_relu_fwd(void *s, size_t n, const float *x, float *y,
                      uint8_t *mask)
{
    k_relu_fwd<<<blocks_for(n), THREADS, 0, STREAM(s)>>>(n, x, y, mask);
    return launched();
}

int mesh_cuk_relu_bwd(void *s, size_t n, const float *y, const float *dy,
                      float *dx)
{
    k_relu_bwd<<<blocks_for(n), THREADS, 0, STREAM(s)>>>(n, y, dy, dx);
    return launched();
}

int mesh_cuk_mask_bwd(void *s, size_t n, const uint8_t *mask, const float *dy,
                      float *dx)
{
    k_mask_bwd<<<blocks_for(n), THREADS, 0, STREAM(s)>>>(n, mask, dy, dx);
    return launched();
}

int mesh_cuk_add(void *s, size_t n, const float *a, const float *b, float *y,
                 int relu)
{
    k_add<<<blocks_for(n), THREADS, 0, STREAM(s)>>>(n, a, b, y, relu);
    return launched();
}

int mesh_cuk_axpy1(void *s, size_t n, const float *x, float *y)
{
    k_axpy1<<<blocks_for(n), THREADS, 0, STREAM(s)>>>(n, x, y);
    return launched();
}

int mesh_cuk_maxpool_fwd(void *s, int n, int c, int h, int w, int oh, int ow,
                         int r, int stride, int pad, const float *x, float *y,
                         int32_t *argmax)
{
    size_t total = (size_t)n * c * oh * ow;

    k_maxpool_fwd<<<blocks_for(total), THREADS, 0, STREAM(s)>>>(
        n, c, h, w, oh, ow, r, stride, pad, x, y, argmax);
    return launched();
}

int mesh_cuk_maxpool_bwd(void *s, int n, int c, int h, int w, int oh, int ow,
                         int r, int stride, int pad, const float *dy,
                         const int32_t *argmax, float *dx)
{
    size_t total = (size_t)n * c * h * w;

    k_maxpool_bwd<<<blocks_for(total), THREADS, 0, STREAM(s)>>>(
        n, c, h, w, oh, ow, r, stride, pad, dy, argmax, dx);
    return launched();
}

int mesh_cuk_avgpool_fwd(void *s, int nc, int hw, const float *x, float *y)
{
    k_avgpool_fwd<<<nc, THREADS, 0, STREAM(s)>>>(hw, x, y);
    return launched();
}

int mesh_cuk_avgpool_bwd(void *s, int nc, int hw, const float *dy, float *dx)
{
    size_t total = (size_t)nc * hw;

    k_avgpool_bwd<<<blocks_for(total), THREADS, 0, STREAM(s)>>>(total, hw, dy,
                                                                dx);
    return launched();
}

int mesh_cuk_bias_fill(void *s, int n, int k, const float *b, float *y)
{
    size_t total = (size_t)n * k;

    k_bias_fill<<<blocks_for(total), THREADS, 0, STREAM(s)>>>(total, k, b, y);
    return launched();
}

int mesh_cuk_bias_grad(void *s, int n, int k, const float *dy, float *db)
{
    k_bias_grad<<<(k + THREADS - 1) / THREADS, THREADS, 0, STREAM(s)>>>(n, k,
                                                                        dy, db);
    return launched();
}

int mesh_cuk_xent(void *s, int n, int k, const float *logits,
                  const int32_t *labels, float eps, float *rowloss,
                  float *dlogits, int *bad)
{
    k_xent<<<n, THREADS, 0, STREAM(s)>>>(n, k, logits, labels, eps, rowloss,
                                         dlogits, bad);
    return launched();
}

int mesh_cuk_sgd(void *s, size_t n, float *p, const float *g, float *buf,
                 float lr, float momentum, float dampening, float wd,
                 int nesterov, int first)
{
    k_sgd<<<blocks_for(n), THREADS, 0, STREAM(s)>>>(
        n, p, g, buf, lr, momentum, dampening, wd, nesterov, first);
    return launched();
}

int mesh_cuk_convert(void *s, size_t n, int dst_dtype, void *dst, int src_dtype,
                     const void *src, float scale)
{
    k_convert<<<blocks_for(n), THREADS, 0, STREAM(s)>>>(n, dst_dtype, dst,
                                                        src_dtype, src, scale);
    return launched();
}

const char *mesh_cuk_strerror(int err)
{
    return cudaGetErrorString((cudaError_t)err);
}

} /* extern "C" */
