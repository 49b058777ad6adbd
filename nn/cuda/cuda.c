/*
 * nn/cuda/cuda.c: the "cuda" backend of nn: convolutions and batch norm
 * through cuDNN 9, the fully connected layer through cuBLAS, the rest
 * through the small kernels of kernels.cu (extern "C" launchers).
 *
 * - One device per process, chosen from mesh_nn_dev_opts.gpu, else
 *   MESHTRAIN_LOCAL_RANK modulo the visible device count, else 0 (indices
 *   count the devices CUDA_VISIBLE_DEVICES leaves visible).
 * - Two non-blocking streams: compute (every op, cuDNN's and cuBLAS's
 *   handles are bound to it) and copy (asynchronous gradient copies, ordered
 *   after compute with events; see mesh_nn_copy_* in nn.h).
 * - Activations are NCHW float32 (act_bytes = 4 n c h w; export is a plain
 *   copy, import goes through a pinned two-slot pipeline on the copy-in
 *   stream: struct in_slot). Parameters and gradients are float32 in every
 *   precision.
 * - Precision: fp32 (CUDNN_FMA_MATH, cuBLAS's default float32), tf32 (the
 *   default on compute capability >= 8.0: cuDNN may pick TF32 tensor-core
 *   algorithms, cuBLAS CUBLAS_TF32_TENSOR_OP_MATH), bf16-amp: each
 *   convolution and fc matmul converts its operands to bfloat16 in the
 *   workspace, computes with float32 accumulation and converts the result
 *   back to float32, as autocast does around these ops; BN, the loss, the
 *   optimizer and all gradients that leave the op stay float32. A conv
 *   weight's bfloat16 copy is kept until its weights are written (struct
 *   wcache), and backward data reuses dy's copy from the backward-filter
 *   just before it, so a step converts each weight and each dy once.
 * - cuDNN API: the "legacy" imperative API of cuDNN 9 (cudnn_cnn.h,
 *   cudnn_ops.h), which 9.x still ships and documents but marks
 *   deprecated in favour of the graph API: the calls used here are
 *   cudnnGetConvolution{Forward,BackwardData,BackwardFilter}Algorithm_v7
 *   (heuristics, as PyTorch's default benchmark=False), the matching
 *   *WorkspaceSize and cudnnConvolution{Forward,BackwardData,
 *   BackwardFilter}, cudnnBatchNormalizationForwardTraining/Inference and
 *   cudnnBatchNormalizationBackward. The deprecation warnings are silenced
 *   for this file only (below); moving to the graph API is a later step.
 * - Algorithms are chosen once per plan (the plan cache of nn/ctx.c keys
 *   plans by shape): each direction keeps cuDNN's heuristic ranking (up
 *   to MESH_NN_ALGO_MAX usable candidates, each with its exact workspace)
 *   and runs the first whose workspace query worked; when a call fails,
 *   the next candidate that fits the workspace is tried and kept
 *   (nn/algo.c), as PyTorch does. The plan's workspace is the largest of
 *   the three directions' first choices plus the bfloat16 staging under
 *   bf16-amp.
 * Errors: every CUDA, cuDNN and cuBLAS call is checked with its own macro;
 * the message names the call and the plan (the layer's shape).
 */
#include "config.h"

#include "nn/algo.h"
#include "nn/backend.h"
#include "nn/cuda/kernels.h"
#include "nn/nn.h"
#include "common/util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

/* cuDNN 9 marks its whole legacy API deprecated; see the header comment. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* cuDNN algorithm workspaces above this are skipped (the next best
 * algorithm is taken): ResNet-50's convolutions need far less. */
#define WS_CAP ((size_t)1 << 30)
/* Alignment of sub-buffers carved from one workspace. */
#define ALIGN 256

/* The errno-style code of a cuDNN 9 status (grouped by category). */
static int dnn_code(cudnnStatus_t s)
{
    if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
        s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        return -ENOMEM;
    switch (CUDNN_STATUS_CATEGORY(s)) {
    case CUDNN_STATUS_NOT_SUPPORTED:
        return -ENOTSUP;
    case CUDNN_STATUS_BAD_PARAM:
        return -EINVAL;
    default:
        return -EIO;
    }
}

/* ---- check macros: one per API, each jumps to an explicit label ---------- */

#define PLAN_NAME(p) plan_name(p)

#define CUDA_CHECK(rc, expr, label, call, p)                                   \
    do {                                                                       \
        cudaError_t e_ = (expr);                                               \
        if (e_ != cudaSuccess) {                                               \
            (rc) = mesh_err(e_ == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,  \
                            "nn cuda: %s [%s]: %s", (call), PLAN_NAME(p),      \
                            cudaGetErrorString(e_));                           \
            goto label;                                                        \
        }                                                                      \
    } while (0)

#define DNN_CHECK(rc, expr, label, call, p)                                    \
    do {                                                                       \
        cudnnStatus_t s_ = (expr);                                             \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                      \
            (rc) = mesh_err(dnn_code(s_), "nn cuda: %s [%s]: %s", (call),      \
                            PLAN_NAME(p), cudnnGetErrorString(s_));            \
            goto label;                                                        \
        }                                                                      \
    } while (0)

#define BLAS_CHECK(rc, expr, label, call, p)                                   \
    do {                                                                       \
        cublasStatus_t s_ = (expr);                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                     \
            (rc) = mesh_err(s_ == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO, \
                            "nn cuda: %s [%s]: %s", (call), PLAN_NAME(p),      \
                            cublasGetStatusString(s_));                        \
            goto label;                                                        \
        }                                                                      \
    } while (0)

/* Make the device current on this thread (see bind()), or return. */
#define BIND(dev)                                                              \
    do {                                                                       \
        int b_ = bind(dev);                                                    \
        if (b_ < 0)                                                            \
            return b_;                                                         \
        (dev)->seq++;                                                          \
    } while (0)

/* Our own kernels: the launcher returns a cudaError_t as int. */
#define KERN_CHECK(rc, expr, label, call, p)                                   \
    do {                                                                       \
        int k_ = (expr);                                                       \
        if (k_ != 0) {                                                         \
            (rc) = mesh_err(-EIO, "nn cuda: kernel %s [%s]: %s", (call),       \
                            PLAN_NAME(p), mesh_cuk_strerror(k_));              \
            goto label;                                                        \
        }                                                                      \
    } while (0)

/* ---- types --------------------------------------------------------------- */

/*
 * One slot of the image input pipeline (act_import): pinned host memory
 * and device memory of cap bytes each. An import copies the caller's
 * images into the host side (a memcpy), uploads them to the device side
 * on the copy-in stream, which runs beside whatever compute still has
 * queued (the previous step), and has compute wait for that upload and
 * copy the device side into the destination (device to device, about
 * 50 us for a ResNet-50 batch of 128). Two slots alternate, so the slot
 * an import fills was last used two imports ago.
 */
struct in_slot {
    void *host, *dev;
    size_t cap;
    cudaEvent_t up;   /* recorded on copy-in after the upload */
    cudaEvent_t used; /* recorded on compute after the copy out of dev */
    int busy;         /* both events recorded at least once */
};

/* A loss of xent_start on its way to the host: the row losses and the
 * bad-label flag of n rows (n + 1 floats) in pinned memory, and the event
 * recorded on compute after their copy. */
struct xent_slot {
    float *host;
    size_t cap; /* floats */
    int n, k;
    cudaEvent_t ev;
};

/*
 * bf16-amp: a weight's bfloat16 copy, made by the first convolution that
 * needs it and reused by the others (forward, then backward data) until
 * an op writes device memory that overlaps w (an upload, the optimizer, a
 * copy in, ...: wrote() marks it stale) or a free (dev->wgen moves on:
 * every copy is stale), as autocast caches weight casts within a step.
 */
struct wcache {
    const float *w; /* the float32 weights it copies */
    size_t n;
    void *bf;          /* n bfloat16 */
    unsigned long gen; /* valid when dev->wgen; 0: stale */
};
#define NWCACHE 512

/* Small uploads (labels) bounce through pinned slots of this size, on the
 * compute stream and without a host sync; larger ones are synchronous. */
#define SMALL_UPLOAD ((size_t)64 << 10)
#define NSMALL       4

struct mesh_nn_copy {
    cudaEvent_t ev;            /* recorded on its copy stream after the copy */
    struct mesh_nn_copy *next; /* free list */
    struct mesh_nn_copy *all;  /* every handle, freed with the device */
};

struct mesh_nn_dev {
    int gpu, ndev;
    int cc;        /* compute capability, major * 10 + minor */
    int precision; /* enum mesh_nn_precision, never DEFAULT */
    long live;     /* blocks from cuda_alloc not freed (atomic) */
    /* copies out (D2H) and back (H2D) on streams of their own, so that a
     * copy back never queues behind copies out (the GPU has an engine for
     * each direction) */
    cudaStream_t compute, copy_out, copy_in;
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    /* xent scratch: n row losses then an int flag (device), host mirror */
    void *xent_dev, *xent_host;
    size_t xent_cap;
    struct mesh_nn_copy *free_copies;
    struct mesh_nn_copy *all_copies; /* also those still held by callers */
    struct in_slot in[2]; /* the image input pipeline, used in turn */
    int in_next;
    void *small[NSMALL];          /* pinned, SMALL_UPLOAD bytes each */
    cudaEvent_t small_ev[NSMALL]; /* after the slot's copy (compute) */
    int small_next;
    int small_used; /* a small upload has run: small_ev[small_last] */
    int small_last;
    struct xent_slot *xq; /* a ring of xq_cap, xq_count from xq_head */
    int xq_cap, xq_head, xq_count;
    unsigned long seq;  /* ops called (BIND counts them) */
    unsigned long wgen; /* the cache's epoch, from 1; a free moves it on */
    struct wcache wc[NWCACHE];
    int nwc;
    /* bf16-amp: the conv plan, workspace and dy whose bfloat16 copy the
     * last backward-filter left in the workspace, and the op count then:
     * backward data, called next with the same, reuses it */
    const struct mesh_nn_plan *dy_plan;
    const void *dy_ws, *dy_src;
    unsigned long dy_seq;
    char desc[256];
};

/* Direction indices of a convolution plan. */
enum { FWD = 0, BWD_DATA = 1, BWD_FILTER = 2 };

struct mesh_nn_plan {
    struct mesh_nn_plan_desc d;
    char name[96]; /* the shape, for messages: "conv 32x64x56x56 ..." */
    size_t ws, reserve;
    size_t nx, ny; /* elements of x and y */
    /* CONV, BN */
    cudnnTensorDescriptor_t xd, yd, bnd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    /* per direction: cuDNN's ranked candidates, the one in use */
    struct mesh_nn_algo cand[3][MESH_NN_ALGO_MAX];
    int ncand[3], cur[3];
    size_t algo_area; /* bytes of the workspace the algorithms may use */
    int bf16;         /* CONV/FC: operands staged as bfloat16 */
    size_t nw;        /* CONV: weight elements */
    size_t fc_a;      /* FC under bf16: bytes of A's staging, B's follows */
};

static const float one = 1.f, zero = 0.f;

/* What the check macros name: the plan's shape, or "device". */
static const char *plan_name(const struct mesh_nn_plan *p)
{
    return p ? p->name : "device";
}

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

static void *ws_at(void *ws, size_t off)
{
    return (char *)ws + off;
}

/* ---- device -------------------------------------------------------------- */

/*
 * The CUDA runtime's current device is per thread, and a ctx may be used
 * by several threads in turn (one at a time): every op makes the device
 * current first, at the cost of a thread-local compare when it already is.
 */
static _Thread_local int bound_gpu = -1;

static int bind(struct mesh_nn_dev *dev)
{
    int rc = 0;

    if (bound_gpu == dev->gpu)
        return 0;
    CUDA_CHECK(rc, cudaSetDevice(dev->gpu), out, "cudaSetDevice", NULL);
    bound_gpu = dev->gpu;
out:
    return rc;
}

/* The device index from the options, MESHTRAIN_LOCAL_RANK or 0. */
static int pick_gpu(const struct mesh_nn_dev_opts *o, int ndev, int *out)
{
    const char *lr = getenv("MESHTRAIN_LOCAL_RANK");
    char *end;
    long v;

    if (o->gpu >= 0) {
        if (o->gpu >= ndev)
            return mesh_err(-EINVAL,
                            "nn cuda: --gpu %d: only %d device%s visible "
                            "(CUDA_VISIBLE_DEVICES counts)",
                            o->gpu, ndev, ndev == 1 ? " is" : "s are");
        *out = o->gpu;
        return 0;
    }
    if (lr && *lr) {
        errno = 0;
        v = strtol(lr, &end, 10);
        if (errno || *end || v < 0 || v > INT_MAX)
            return mesh_err(-EINVAL,
                            "nn cuda: MESHTRAIN_LOCAL_RANK=\"%s\" is not a "
                            "rank",
                            lr);
        *out = (int)(v % ndev);
        return 0;
    }
    *out = 0;
    return 0;
}

static int cuda_dev_open_opts(const struct mesh_nn_dev_opts *o,
                              struct mesh_nn_dev **out)
{
    struct mesh_nn_dev *dev;
    struct cudaDeviceProp prop;
    cudaError_t ce;
    int rc = 0, ndev = 0;

    ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0)
        return mesh_err(-ENODEV, "nn cuda: no CUDA device (%s)",
                        ce != cudaSuccess ? cudaGetErrorString(ce)
                                          : "cudaGetDeviceCount says 0");
    dev = calloc(1, sizeof(*dev));
    if (!dev)
        return mesh_err(-ENOMEM, "nn cuda: out of memory");
    dev->ndev = ndev;
    rc = pick_gpu(o, ndev, &dev->gpu);
    if (rc < 0)
        goto fail_free;
    CUDA_CHECK(rc, cudaSetDevice(dev->gpu), fail_free, "cudaSetDevice", NULL);
    bound_gpu = dev->gpu;
    mesh_nn_cuda_host_device(dev->gpu);
    CUDA_CHECK(rc, cudaGetDeviceProperties(&prop, dev->gpu), fail_free,
               "cudaGetDeviceProperties", NULL);
    dev->cc = prop.major * 10 + prop.minor;
    dev->wgen = 1; /* a weight cache entry's gen 0 is stale */
    dev->precision = o->precision;
    if (dev->precision == MESH_NN_PREC_DEFAULT)
        dev->precision = dev->cc >= 80 ? MESH_NN_PREC_TF32 : MESH_NN_PREC_FP32;
    if (dev->precision != MESH_NN_PREC_FP32 && dev->cc < 80) {
        rc = mesh_err(-ENOTSUP,
                      "nn cuda: %s needs compute capability 8.0 or newer; "
                      "%s is %d.%d",
                      dev->precision == MESH_NN_PREC_TF32 ? "tf32" : "bf16-amp",
                      prop.name, prop.major, prop.minor);
        goto fail_free;
    }
    CUDA_CHECK(rc,
               cudaStreamCreateWithFlags(&dev->compute, cudaStreamNonBlocking),
               fail_free, "cudaStreamCreateWithFlags", NULL);
    CUDA_CHECK(rc,
               cudaStreamCreateWithFlags(&dev->copy_out, cudaStreamNonBlocking),
               fail_compute, "cudaStreamCreateWithFlags", NULL);
    CUDA_CHECK(rc,
               cudaStreamCreateWithFlags(&dev->copy_in, cudaStreamNonBlocking),
               fail_copy_out, "cudaStreamCreateWithFlags", NULL);
    DNN_CHECK(rc, cudnnCreate(&dev->dnn), fail_copy, "cudnnCreate", NULL);
    DNN_CHECK(rc, cudnnSetStream(dev->dnn, dev->compute), fail_dnn,
              "cudnnSetStream", NULL);
    BLAS_CHECK(rc, cublasCreate(&dev->blas), fail_dnn, "cublasCreate", NULL);
    BLAS_CHECK(rc, cublasSetStream(dev->blas, dev->compute), fail_blas,
               "cublasSetStream", NULL);
    /* fp32 and bf16-amp (float32 compute in cublasGemmEx): the default
     * math, which keeps float32 products and sums and, unlike
     * CUBLAS_PEDANTIC_MATH, lets cuBLAS pick its fastest kernels */
    BLAS_CHECK(rc,
               cublasSetMathMode(dev->blas, dev->precision == MESH_NN_PREC_TF32
                                                ? CUBLAS_TF32_TENSOR_OP_MATH
                                                : CUBLAS_DEFAULT_MATH),
               fail_blas, "cublasSetMathMode", NULL);
    {
        size_t v = cudnnGetVersion();
        int bv = 0;

        cublasGetVersion(dev->blas, &bv);
        snprintf(dev->desc, sizeof(dev->desc),
                 "cuda: %s (sm_%d, device %d of %d), cuDNN %zu.%zu.%zu, "
                 "cuBLAS %d, precision %s, activations NCHW float32",
                 prop.name, dev->cc, dev->gpu, ndev, v / 10000, v / 100 % 100,
                 v % 100, bv,
                 dev->precision == MESH_NN_PREC_FP32   ? "fp32"
                 : dev->precision == MESH_NN_PREC_TF32 ? "tf32"
                                                       : "bf16-amp");
    }
    *out = dev;
    return 0;

fail_blas:
    cublasDestroy(dev->blas);
fail_dnn:
    cudnnDestroy(dev->dnn);
fail_copy:
    cudaStreamDestroy(dev->copy_in);
fail_copy_out:
    cudaStreamDestroy(dev->copy_out);
fail_compute:
    cudaStreamDestroy(dev->compute);
fail_free:
    free(dev);
    return rc;
}

static int cuda_dev_open(int threads, struct mesh_nn_dev **out)
{
    struct mesh_nn_dev_opts o;

    mesh_nn_dev_opts_init(&o);
    o.threads = threads;
    return cuda_dev_open_opts(&o, out);
}

static void in_slot_free(struct in_slot *s)
{
    if (s->host)
        cudaFreeHost(s->host);
    if (s->dev)
        cudaFree(s->dev);
    if (s->up)
        cudaEventDestroy(s->up);
    if (s->used)
        cudaEventDestroy(s->used);
    memset(s, 0, sizeof(*s));
}

static void cuda_dev_close(struct mesh_nn_dev *dev)
{
    struct mesh_nn_copy *c, *next;
    int i;

    if (!dev)
        return;
    (void)bind(dev);
    cudaStreamSynchronize(dev->copy_out);
    cudaStreamSynchronize(dev->copy_in);
    cudaStreamSynchronize(dev->compute);
    for (c = dev->all_copies; c; c = next) {
        next = c->all;
        cudaEventDestroy(c->ev);
        free(c);
    }
    for (i = 0; i < 2; i++)
        in_slot_free(&dev->in[i]);
    for (i = 0; i < NSMALL; i++) {
        if (dev->small[i])
            cudaFreeHost(dev->small[i]);
        if (dev->small_ev[i])
            cudaEventDestroy(dev->small_ev[i]);
    }
    for (i = 0; i < dev->xq_cap; i++) {
        if (dev->xq[i].host)
            cudaFreeHost(dev->xq[i].host);
        if (dev->xq[i].ev)
            cudaEventDestroy(dev->xq[i].ev);
    }
    free(dev->xq);
    for (i = 0; i < dev->nwc; i++)
        cudaFree(dev->wc[i].bf);
    cudaFree(dev->xent_dev);
    cudaFreeHost(dev->xent_host);
    cublasDestroy(dev->blas);
    cudnnDestroy(dev->dnn);
    cudaStreamDestroy(dev->copy_in);
    cudaStreamDestroy(dev->copy_out);
    cudaStreamDestroy(dev->compute);
    free(dev);
}

static const char *cuda_dev_describe(struct mesh_nn_dev *dev)
{
    return dev->desc;
}

/* ---- memory -------------------------------------------------------------- */

/* An op writes [dst, dst + bytes): bf16 weight copies overlapping it are
 * stale (struct wcache). */
static void wrote(struct mesh_nn_dev *dev, const void *dst, size_t bytes)
{
    const char *a = dst, *b = a + bytes;
    int i;

    for (i = 0; i < dev->nwc; i++) {
        const char *w = (const char *)dev->wc[i].w;

        if (w < b && a < w + dev->wc[i].n * sizeof(float))
            dev->wc[i].gen = 0;
    }
}

static int cuda_alloc(struct mesh_nn_dev *dev, size_t bytes, void **out)
{
    void *p = NULL;
    int rc = 0;

    BIND(dev);
    CUDA_CHECK(rc, cudaMalloc(&p, bytes ? bytes : ALIGN), fail, "cudaMalloc",
               NULL);
    /* on the compute stream: every op that later uses p is ordered after */
    CUDA_CHECK(rc, cudaMemsetAsync(p, 0, bytes, dev->compute), fail_free,
               "cudaMemsetAsync", NULL);
    wrote(dev, p, bytes);
    *out = p;
    __atomic_add_fetch(&dev->live, 1, __ATOMIC_RELAXED);
    return 0;

fail_free:
    cudaFree(p);
fail:
    if (rc == -ENOMEM)
        mesh_err_prefix(rc, "allocating %zu bytes", bytes);
    return rc;
}

static void cuda_free(struct mesh_nn_dev *dev, void *p)
{
    (void)bind(dev);
    dev->wgen++; /* the address may come back as other weights */
    if (p)
        __atomic_sub_fetch(&dev->live, 1, __ATOMIC_RELAXED);
    cudaFree(p); /* synchronises with the device before freeing */
}

static long cuda_live_allocs(struct mesh_nn_dev *dev)
{
    return __atomic_load_n(&dev->live, __ATOMIC_RELAXED);
}

/* A synchronous copy ordered with the compute stream. */
static int copy_sync(struct mesh_nn_dev *dev, void *dst, const void *src,
                     size_t bytes, enum cudaMemcpyKind kind, const char *what)
{
    int rc = 0;

    if (!bytes)
        return 0;
    CUDA_CHECK(rc, cudaMemcpyAsync(dst, src, bytes, kind, dev->compute), out,
               what, NULL);
    CUDA_CHECK(rc, cudaStreamSynchronize(dev->compute), out,
               "cudaStreamSynchronize", NULL);
out:
    return rc;
}

/*
 * A small upload (the labels each step) through the next pinned slot: the
 * host waits only for that slot's previous copy, NSMALL uploads ago, not
 * for the device; the copy is on the compute stream, so ordered with
 * every op as a synchronous one. Larger uploads are synchronous.
 */
static int cuda_upload(struct mesh_nn_dev *dev, void *dst, const void *src,
                       size_t bytes)
{
    int k = dev->small_next, rc = 0;

    BIND(dev);
    wrote(dev, dst, bytes);
    if (bytes > SMALL_UPLOAD || !bytes)
        return copy_sync(dev, dst, src, bytes, cudaMemcpyHostToDevice,
                         "cudaMemcpyAsync (upload)");
    if (!dev->small[k]) {
        CUDA_CHECK(rc, cudaMallocHost(&dev->small[k], SMALL_UPLOAD), out,
                   "cudaMallocHost (upload slot)", NULL);
        CUDA_CHECK(
            rc,
            cudaEventCreateWithFlags(&dev->small_ev[k], cudaEventDisableTiming),
            out, "cudaEventCreateWithFlags (upload slot)", NULL);
    } else {
        CUDA_CHECK(rc, cudaEventSynchronize(dev->small_ev[k]), out,
                   "cudaEventSynchronize (upload slot)", NULL);
    }
    memcpy(dev->small[k], src, bytes);
    CUDA_CHECK(rc,
               cudaMemcpyAsync(dst, dev->small[k], bytes,
                               cudaMemcpyHostToDevice, dev->compute),
               out, "cudaMemcpyAsync (upload)", NULL);
    CUDA_CHECK(rc, cudaEventRecord(dev->small_ev[k], dev->compute), out,
               "cudaEventRecord (upload slot)", NULL);
    dev->small_next = (k + 1) % NSMALL;
    dev->small_used = 1;
    dev->small_last = k;
out:
    return rc;
}

static int cuda_download(struct mesh_nn_dev *dev, void *dst, const void *src,
                         size_t bytes)
{
    BIND(dev);
    return copy_sync(dev, dst, src, bytes, cudaMemcpyDeviceToHost,
                     "cudaMemcpyAsync (download)");
}

static int cuda_zero(struct mesh_nn_dev *dev, void *p, size_t bytes)
{
    int rc = 0;

    BIND(dev);
    wrote(dev, p, bytes);
    CUDA_CHECK(rc, cudaMemsetAsync(p, 0, bytes, dev->compute), out,
               "cudaMemsetAsync", NULL);
out:
    return rc;
}

static int cuda_sync(struct mesh_nn_dev *dev)
{
    int rc = 0;

    BIND(dev);
    CUDA_CHECK(rc, cudaStreamSynchronize(dev->compute), out,
               "cudaStreamSynchronize (compute)", NULL);
    CUDA_CHECK(rc, cudaStreamSynchronize(dev->copy_out), out,
               "cudaStreamSynchronize (copy out)", NULL);
    CUDA_CHECK(rc, cudaStreamSynchronize(dev->copy_in), out,
               "cudaStreamSynchronize (copy in)", NULL);
out:
    return rc;
}

static size_t cuda_act_bytes(struct mesh_nn_dev *dev, int n, int c, int h,
                             int w)
{
    (void)dev;
    return (size_t)n * c * h * w * sizeof(float);
}

/* Room for bytes in slot s, once compute is done with its device side. */
static int in_slot_grow(struct mesh_nn_dev *dev, struct in_slot *s,
                        size_t bytes)
{
    int rc = 0;

    if (s->busy)
        CUDA_CHECK(rc, cudaEventSynchronize(s->used), out,
                   "cudaEventSynchronize (input slot)", NULL);
    if (s->host)
        cudaFreeHost(s->host);
    if (s->dev)
        cudaFree(s->dev);
    s->host = s->dev = NULL;
    s->cap = 0;
    s->busy = 0;
    CUDA_CHECK(rc, cudaMallocHost(&s->host, bytes), out,
               "cudaMallocHost (input slot)", NULL);
    CUDA_CHECK(rc, cudaMalloc(&s->dev, bytes), out, "cudaMalloc (input slot)",
               NULL);
    if (!s->up)
        CUDA_CHECK(rc, cudaEventCreateWithFlags(&s->up, cudaEventDisableTiming),
                   out, "cudaEventCreateWithFlags (input slot)", NULL);
    if (!s->used)
        CUDA_CHECK(rc,
                   cudaEventCreateWithFlags(&s->used, cudaEventDisableTiming),
                   out, "cudaEventCreateWithFlags (input slot)", NULL);
    s->cap = bytes;
out:
    return rc;
}

/* Images in through the input pipeline (struct in_slot): the host waits
 * only for the slot's upload of two imports ago, never for compute. */
static int cuda_act_import(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                           const float *host_nchw, void *dst)
{
    size_t bytes = cuda_act_bytes(dev, n, c, h, w);
    struct in_slot *s = &dev->in[dev->in_next];
    int rc = 0;

    BIND(dev);
    wrote(dev, dst, bytes);
    if (bytes > s->cap) {
        rc = in_slot_grow(dev, s, bytes);
        if (rc < 0)
            goto out;
    } else if (s->busy) {
        /* the host side is free once its last upload is done */
        CUDA_CHECK(rc, cudaEventSynchronize(s->up), out,
                   "cudaEventSynchronize (input slot)", NULL);
    }
    memcpy(s->host, host_nchw, bytes);
    /* the device side is free once compute copied it out last time */
    if (s->busy)
        CUDA_CHECK(rc, cudaStreamWaitEvent(dev->copy_in, s->used, 0), out,
                   "cudaStreamWaitEvent (input slot)", NULL);
    CUDA_CHECK(rc,
               cudaMemcpyAsync(s->dev, s->host, bytes, cudaMemcpyHostToDevice,
                               dev->copy_in),
               out, "cudaMemcpyAsync (images)", NULL);
    CUDA_CHECK(rc, cudaEventRecord(s->up, dev->copy_in), out,
               "cudaEventRecord (images)", NULL);
    CUDA_CHECK(rc, cudaStreamWaitEvent(dev->compute, s->up, 0), out,
               "cudaStreamWaitEvent (images)", NULL);
    CUDA_CHECK(rc,
               cudaMemcpyAsync(dst, s->dev, bytes, cudaMemcpyDeviceToDevice,
                               dev->compute),
               out, "cudaMemcpyAsync (images, device)", NULL);
    CUDA_CHECK(rc, cudaEventRecord(s->used, dev->compute), out,
               "cudaEventRecord (images, device)", NULL);
    s->busy = 1;
    dev->in_next ^= 1;
out:
    return rc;
}

static int cuda_act_export(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                           const void *src, float *host_nchw)
{
    BIND(dev);
    return cuda_download(dev, host_nchw, src, cuda_act_bytes(dev, n, c, h, w));
}

/* ---- plans --------------------------------------------------------------- */

static void plan_free_descs(struct mesh_nn_plan *p)
{
    if (p->cd)
        cudnnDestroyConvolutionDescriptor(p->cd);
    if (p->wd)
        cudnnDestroyFilterDescriptor(p->wd);
    if (p->bnd)
        cudnnDestroyTensorDescriptor(p->bnd);
    if (p->yd)
        cudnnDestroyTensorDescriptor(p->yd);
    if (p->xd)
        cudnnDestroyTensorDescriptor(p->xd);
}

static cudnnMathType_t base_math(const struct mesh_nn_dev *dev)
{
    switch (dev->precision) {
    case MESH_NN_PREC_FP32:
        return CUDNN_FMA_MATH;
    case MESH_NN_PREC_BF16_AMP:
        return CUDNN_TENSOR_OP_MATH;
    default:
        return CUDNN_DEFAULT_MATH; /* TF32 allowed */
    }
}

/* fp32 precision must not take an algorithm that runs on tensor cores. */
static int math_ok(const struct mesh_nn_dev *dev, cudnnMathType_t m)
{
    return dev->precision != MESH_NN_PREC_FP32 ||
           (m != CUDNN_TENSOR_OP_MATH &&
            m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
}

/*
 * cuDNN's heuristic ranking of one direction: the candidates that
 * succeeded, fit WS_CAP and respect the precision, in its order, with the
 * math type each runs with (set on the descriptor before each call).
 */
#define RANK_ALGOS(rc, dev, p, dir, perf_t, get_fn, args, label)               \
    do {                                                                       \
        perf_t perf_[16];                                                      \
        int n_ = 0, i_;                                                        \
                                                                               \
        DNN_CHECK(rc, cudnnSetConvolutionMathType((p)->cd, base_math(dev)),    \
                  label, "cudnnSetConvolutionMathType", p);                    \
        DNN_CHECK(rc, get_fn args, label, #get_fn, p);                         \
        (p)->ncand[dir] = 0;                                                   \
        for (i_ = 0; i_ < n_ && (p)->ncand[dir] < MESH_NN_ALGO_MAX; i_++)      \
            if (perf_[i_].status == CUDNN_STATUS_SUCCESS &&                    \
                perf_[i_].memory <= WS_CAP &&                                  \
                math_ok(dev, perf_[i_].mathType)) {                            \
                struct mesh_nn_algo *a_ = &(p)->cand[dir][(p)->ncand[dir]++];  \
                                                                               \
                a_->id = (int)perf_[i_].algo;                                  \
                a_->math = (dev)->precision == MESH_NN_PREC_FP32               \
                               ? CUDNN_FMA_MATH                                \
                               : perf_[i_].mathType;                           \
                a_->ws = perf_[i_].memory;                                     \
                a_->failed = 0;                                                \
            }                                                                  \
        if ((p)->ncand[dir] == 0) {                                            \
            (rc) = mesh_err(-ENOTSUP,                                          \
                            "nn cuda: %s [%s]: no usable algorithm among %d",  \
                            #get_fn, (p)->name, n_);                           \
            goto label;                                                        \
        }                                                                      \
    } while (0)

/* The exact workspace of candidate a of direction dir, with its math. */
static int ws_query(struct mesh_nn_dev *dev, struct mesh_nn_plan *p, int dir,
                    const struct mesh_nn_algo *a, size_t *out)
{
    int rc = 0;

    DNN_CHECK(rc, cudnnSetConvolutionMathType(p->cd, (cudnnMathType_t)a->math),
              out, "cudnnSetConvolutionMathType", p);
    if (dir == FWD)
        DNN_CHECK(rc,
                  cudnnGetConvolutionForwardWorkspaceSize(
                      dev->dnn, p->xd, p->wd, p->cd, p->yd,
                      (cudnnConvolutionFwdAlgo_t)a->id, out),
                  out, "cudnnGetConvolutionForwardWorkspaceSize", p);
    else if (dir == BWD_DATA)
        DNN_CHECK(rc,
                  cudnnGetConvolutionBackwardDataWorkspaceSize(
                      dev->dnn, p->wd, p->yd, p->cd, p->xd,
                      (cudnnConvolutionBwdDataAlgo_t)a->id, out),
                  out, "cudnnGetConvolutionBackwardDataWorkspaceSize", p);
    else
        DNN_CHECK(rc,
                  cudnnGetConvolutionBackwardFilterWorkspaceSize(
                      dev->dnn, p->xd, p->yd, p->cd, p->wd,
                      (cudnnConvolutionBwdFilterAlgo_t)a->id, out),
                  out, "cudnnGetConvolutionBackwardFilterWorkspaceSize", p);
out:
    return rc;
}

/*
 * Every candidate's exact workspace; one whose query fails or that needs
 * more than WS_CAP is marked failed (the next is taken, as PyTorch does),
 * and the first left is the direction's choice.
 */
static int conv_choose(struct mesh_nn_dev *dev, struct mesh_nn_plan *p, int dir)
{
    struct mesh_nn_algo *a;
    size_t ws;
    int i, rc;

    for (i = 0; i < p->ncand[dir]; i++) {
        a = &p->cand[dir][i];
        rc = ws_query(dev, p, dir, a, &ws);
        if (rc < 0 || ws > WS_CAP) {
            mesh_debug("nn cuda: [%s]: direction %d, algorithm %d: %s", p->name,
                       dir, a->id,
                       rc < 0 ? mesh_err_msg(rc) : "workspace over the cap");
            mesh_err_clear();
            a->failed = 1;
            continue;
        }
        a->ws = ws;
    }
    p->cur[dir] = mesh_nn_algo_next(p->cand[dir], p->ncand[dir], 0, WS_CAP);
    if (p->cur[dir] < 0)
        return mesh_err(-ENOTSUP,
                        "nn cuda: [%s]: direction %d: the workspace query of "
                        "each of its %d algorithms failed",
                        p->name, dir, p->ncand[dir]);
    return 0;
}

static int conv_plan(struct mesh_nn_dev *dev, struct mesh_nn_plan *p)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    cudnnDataType_t dt = p->bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    size_t stage = 0;
    int rc = 0, i;

    DNN_CHECK(rc, cudnnCreateTensorDescriptor(&p->xd), out,
              "cudnnCreateTensorDescriptor", p);
    DNN_CHECK(rc, cudnnCreateTensorDescriptor(&p->yd), out,
              "cudnnCreateTensorDescriptor", p);
    DNN_CHECK(rc, cudnnCreateFilterDescriptor(&p->wd), out,
              "cudnnCreateFilterDescriptor", p);
    DNN_CHECK(rc, cudnnCreateConvolutionDescriptor(&p->cd), out,
              "cudnnCreateConvolutionDescriptor", p);
    DNN_CHECK(rc,
              cudnnSetTensor4dDescriptor(p->xd, CUDNN_TENSOR_NCHW, dt, d->n,
                                         d->c, d->h, d->w),
              out, "cudnnSetTensor4dDescriptor (x)", p);
    DNN_CHECK(rc,
              cudnnSetTensor4dDescriptor(p->yd, CUDNN_TENSOR_NCHW, dt, d->n,
                                         d->k, d->oh, d->ow),
              out, "cudnnSetTensor4dDescriptor (y)", p);
    DNN_CHECK(rc,
              cudnnSetFilter4dDescriptor(p->wd, dt, CUDNN_TENSOR_NCHW, d->k,
                                         d->c, d->r, d->s),
              out, "cudnnSetFilter4dDescriptor", p);
    /* cross-correlation, as PyTorch; float32 accumulation in every mode */
    DNN_CHECK(rc,
              cudnnSetConvolution2dDescriptor(
                  p->cd, d->pad, d->pad, d->stride, d->stride, 1, 1,
                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              out, "cudnnSetConvolution2dDescriptor", p);
    RANK_ALGOS(rc, dev, p, FWD, cudnnConvolutionFwdAlgoPerf_t,
               cudnnGetConvolutionForwardAlgorithm_v7,
               (dev->dnn, p->xd, p->wd, p->cd, p->yd, 16, &n_, perf_), out);
    RANK_ALGOS(rc, dev, p, BWD_DATA, cudnnConvolutionBwdDataAlgoPerf_t,
               cudnnGetConvolutionBackwardDataAlgorithm_v7,
               (dev->dnn, p->wd, p->yd, p->cd, p->xd, 16, &n_, perf_), out);
    RANK_ALGOS(rc, dev, p, BWD_FILTER, cudnnConvolutionBwdFilterAlgoPerf_t,
               cudnnGetConvolutionBackwardFilterAlgorithm_v7,
               (dev->dnn, p->xd, p->yd, p->cd, p->wd, 16, &n_, perf_), out);
    /* the exact workspace of each candidate; the algorithm area holds the
     * largest first choice, and a fallback must fit in it */
    for (i = 0; i < 3; i++) {
        rc = conv_choose(dev, p, i);
        if (rc < 0)
            goto out;
        if (align_up(p->cand[i][p->cur[i]].ws) > stage)
            stage = align_up(p->cand[i][p->cur[i]].ws);
    }
    p->algo_area = stage;
    /* bf16: [algorithm | x | w | y] staging, 2 bytes an element */
    p->nw = (size_t)d->k * d->c * d->r * d->s;
    if (p->bf16)
        stage +=
            align_up(p->nx * 2) + align_up(p->nw * 2) + align_up(p->ny * 2);
    p->ws = stage;
out:
    return rc;
}

static int bn_plan(struct mesh_nn_dev *dev, struct mesh_nn_plan *p)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    int rc = 0;

    (void)dev;
    if (d->eps < CUDNN_BN_MIN_EPSILON || !(d->eps > 0.f))
        return mesh_err(-EINVAL, "nn cuda: [%s]: eps %g is invalid", p->name,
                        (double)d->eps);
    DNN_CHECK(rc, cudnnCreateTensorDescriptor(&p->xd), out,
              "cudnnCreateTensorDescriptor", p);
    DNN_CHECK(rc, cudnnCreateTensorDescriptor(&p->bnd), out,
              "cudnnCreateTensorDescriptor", p);
    DNN_CHECK(rc,
              cudnnSetTensor4dDescriptor(p->xd, CUDNN_TENSOR_NCHW,
                                         CUDNN_DATA_FLOAT, d->n, d->c, d->h,
                                         d->w),
              out, "cudnnSetTensor4dDescriptor", p);
    DNN_CHECK(
        rc,
        cudnnDeriveBNTensorDescriptor(p->bnd, p->xd, CUDNN_BATCHNORM_SPATIAL),
        out, "cudnnDeriveBNTensorDescriptor", p);
    /* backward: a copy of dy (masked by the ReLU) so dx may alias dy */
    p->ws = p->nx * sizeof(float);
    p->reserve = d->relu ? p->nx : 0; /* the fused ReLU's mask, a byte each */
out:
    return rc;
}

static int cuda_plan_create(struct mesh_nn_dev *dev,
                            const struct mesh_nn_plan_desc *d,
                            struct mesh_nn_plan **out)
{
    struct mesh_nn_plan *p;
    int rc = 0;

    BIND(dev);
    if (d->n < 1 || d->c < 1 || d->h < 1 || d->w < 1)
        return mesh_err(-EINVAL,
                        "nn cuda: plan of kind %d: bad shape "
                        "%dx%dx%dx%d",
                        d->kind, d->n, d->c, d->h, d->w);
    p = calloc(1, sizeof(*p));
    if (!p)
        return mesh_err(-ENOMEM, "nn cuda: out of memory");
    p->d = *d;
    p->nx = (size_t)d->n * d->c * d->h * d->w;
    switch (d->kind) {
    case MESH_NN_PLAN_CONV:
        p->d.oh = mesh_nn_out_dim(d->h, d->r, d->stride, d->pad);
        p->d.ow = mesh_nn_out_dim(d->w, d->s, d->stride, d->pad);
        p->ny = (size_t)d->n * d->k * p->d.oh * p->d.ow;
        p->bf16 = dev->precision == MESH_NN_PREC_BF16_AMP;
        snprintf(p->name, sizeof(p->name),
                 "conv %dx%dx%dx%d -> %d, %dx%d stride %d pad %d", d->n, d->c,
                 d->h, d->w, d->k, d->r, d->s, d->stride, d->pad);
        if (d->k < 1 || d->r < 1 || d->s < 1 || d->stride < 1 || d->pad < 0 ||
            p->d.oh < 1 || p->d.ow < 1) {
            rc = mesh_err(-EINVAL, "nn cuda: [%s]: bad parameters", p->name);
            goto fail;
        }
        rc = conv_plan(dev, p);
        if (rc == -ENOTSUP && p->bf16) {
            /* a shape cuDNN has no bfloat16 algorithm for (the 3-channel
             * stem may be one): this convolution computes in float32 */
            mesh_warn("nn cuda: [%s]: %s; float32 for this convolution",
                      p->name, mesh_err_msg(rc));
            mesh_err_clear();
            plan_free_descs(p);
            p->xd = p->yd = NULL;
            p->wd = NULL;
            p->cd = NULL;
            p->bf16 = 0;
            rc = conv_plan(dev, p);
        }
        break;
    case MESH_NN_PLAN_BN:
        snprintf(p->name, sizeof(p->name), "bn%s %dx%dx%dx%d",
                 d->relu ? "+relu" : "", d->n, d->c, d->h, d->w);
        rc = bn_plan(dev, p);
        break;
    case MESH_NN_PLAN_RELU:
    case MESH_NN_PLAN_ADD:
        snprintf(p->name, sizeof(p->name), "%s %dx%dx%dx%d",
                 d->kind == MESH_NN_PLAN_RELU ? "relu"
                 : d->relu                    ? "add+relu"
                                              : "add",
                 d->n, d->c, d->h, d->w);
        break;
    case MESH_NN_PLAN_MAXPOOL:
        p->d.oh = mesh_nn_out_dim(d->h, d->r, d->stride, d->pad);
        p->d.ow = mesh_nn_out_dim(d->w, d->r, d->stride, d->pad);
        snprintf(p->name, sizeof(p->name),
                 "maxpool %dx%dx%dx%d, %dx%d stride %d pad %d", d->n, d->c,
                 d->h, d->w, d->r, d->r, d->stride, d->pad);
        if (d->r < 1 || d->stride < 1 || d->pad < 0 || 2 * d->pad > d->r ||
            p->d.oh < 1 || p->d.ow < 1) {
            rc = mesh_err(-EINVAL, "nn cuda: [%s]: bad parameters", p->name);
            goto fail;
        }
        p->ny = (size_t)d->n * d->c * p->d.oh * p->d.ow;
        p->reserve = p->ny * sizeof(int32_t); /* argmax */
        break;
    case MESH_NN_PLAN_AVGPOOL:
        snprintf(p->name, sizeof(p->name), "avgpool %dx%dx%dx%d", d->n, d->c,
                 d->h, d->w);
        break;
    case MESH_NN_PLAN_FC:
        snprintf(p->name, sizeof(p->name), "fc %dx%d -> %d", d->n, d->c, d->k);
        if (d->k < 1) {
            rc = mesh_err(-EINVAL, "nn cuda: [%s]: bad parameters", p->name);
            goto fail;
        }
        p->bf16 = dev->precision == MESH_NN_PREC_BF16_AMP;
        /* bf16 staging of a gemm's A (W or x) and B (x or dy) */
        if (p->bf16) {
            size_t kc = (size_t)d->k * d->c, nc = (size_t)d->n * d->c;
            size_t nk = (size_t)d->n * d->k;

            p->fc_a = align_up((kc > nc ? kc : nc) * 2);
            p->ws = p->fc_a + align_up((nc > nk ? nc : nk) * 2);
        }
        break;
    default:
        rc = mesh_err(-EINVAL, "nn cuda: unknown plan kind %d", d->kind);
        goto fail;
    }
    if (rc < 0)
        goto fail;
    *out = p;
    return 0;

fail:
    plan_free_descs(p);
    free(p);
    return rc;
}

static void cuda_plan_destroy(struct mesh_nn_dev *dev, struct mesh_nn_plan *p)
{
    (void)dev; /* descriptors are host objects */
    if (!p)
        return;
    plan_free_descs(p);
    free(p);
}

static size_t cuda_plan_workspace(const struct mesh_nn_plan *p)
{
    return p->ws;
}

static size_t cuda_plan_reserve(const struct mesh_nn_plan *p)
{
    return p->reserve;
}

/* ---- convolution --------------------------------------------------------- */

/* The bf16 staging areas of a conv plan's workspace. */
struct stage {
    void *algo, *x, *w, *y;
};

static struct stage conv_stage(const struct mesh_nn_plan *p, void *ws)
{
    struct stage s = {ws, NULL, NULL, NULL};
    size_t off = p->algo_area;

    if (p->bf16) {
        s.x = ws_at(ws, off);
        off += align_up(p->nx * 2);
        s.w = ws_at(ws, off);
        off += align_up(p->nw * 2);
        s.y = ws_at(ws, off);
    }
    return s;
}

/* To bfloat16 (dt 2) or back to float32 (dt 0) on the compute stream. */
static int to_bf16(struct mesh_nn_dev *dev, struct mesh_nn_plan *p, void *dst,
                   const void *src, size_t n)
{
    int rc = 0;

    KERN_CHECK(rc,
               mesh_cuk_convert(dev->compute, n, MESH_DT_BF16, dst, MESH_DT_F32,
                                src, 1.f),
               out, "convert f32->bf16", p);
out:
    return rc;
}

static int from_bf16(struct mesh_nn_dev *dev, struct mesh_nn_plan *p, void *dst,
                     const void *src, size_t n)
{
    int rc = 0;

    KERN_CHECK(rc,
               mesh_cuk_convert(dev->compute, n, MESH_DT_F32, dst, MESH_DT_BF16,
                                src, 1.f),
               out, "convert bf16->f32", p);
out:
    return rc;
}

/* One convolution call of direction dir: a (x or dy), b (w or dy) -> y
 * (y, dx or dw), through the candidate the fallback hands it. */
struct conv_call {
    struct mesh_nn_dev *dev;
    struct mesh_nn_plan *p;
    int dir;
    const void *a, *b;
    void *y, *ws;
};

static int conv_try(void *arg, struct mesh_nn_algo *a)
{
    struct conv_call *c = arg;
    struct mesh_nn_plan *p = c->p;
    cudnnHandle_t h = c->dev->dnn;
    int rc = 0;

    DNN_CHECK(rc, cudnnSetConvolutionMathType(p->cd, (cudnnMathType_t)a->math),
              out, "cudnnSetConvolutionMathType", p);
    if (c->dir == FWD)
        DNN_CHECK(rc,
                  cudnnConvolutionForward(h, &one, p->xd, c->a, p->wd, c->b,
                                          p->cd,
                                          (cudnnConvolutionFwdAlgo_t)a->id,
                                          c->ws, a->ws, &zero, p->yd, c->y),
                  out, "cudnnConvolutionForward", p);
    else if (c->dir == BWD_DATA)
        DNN_CHECK(rc,
                  cudnnConvolutionBackwardData(
                      h, &one, p->wd, c->b, p->yd, c->a, p->cd,
                      (cudnnConvolutionBwdDataAlgo_t)a->id, c->ws, a->ws, &zero,
                      p->xd, c->y),
                  out, "cudnnConvolutionBackwardData", p);
    else
        DNN_CHECK(rc,
                  cudnnConvolutionBackwardFilter(
                      h, &one, p->xd, c->a, p->yd, c->b, p->cd,
                      (cudnnConvolutionBwdFilterAlgo_t)a->id, c->ws, a->ws,
                      &zero, p->wd, c->y),
                  out, "cudnnConvolutionBackwardFilter", p);
out:
    return rc;
}

/* The direction's kept algorithm, else the next that works (kept then). */
static int conv_run(struct mesh_nn_dev *dev, struct mesh_nn_plan *p, int dir,
                    const void *a, const void *b, void *y, void *ws)
{
    static const char *const dirs[3] = {"forward", "backward data",
                                        "backward filter"};
    struct conv_call c = {dev, p, dir, a, b, y, ws};
    char what[160];

    snprintf(what, sizeof(what), "nn cuda: [%s] %s", p->name, dirs[dir]);
    return mesh_nn_algo_run(p->cand[dir], p->ncand[dir], p->algo_area,
                            &p->cur[dir], what, conv_try, &c);
}

/*
 * The bfloat16 copy of the n weights w: the cached one when nothing may
 * have written them since it was made, else converted now (into the
 * cache, or into the staging area stage when the cache is full).
 */
static int weights_bf16(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const float *w, size_t n, void *stage, const void **out)
{
    struct wcache *c = NULL;
    int i, rc = 0;

    for (i = 0; i < dev->nwc; i++)
        if (dev->wc[i].w == w && dev->wc[i].n == n) {
            c = &dev->wc[i];
            break;
        }
    if (c && c->gen == dev->wgen) {
        *out = c->bf;
        return 0;
    }
    if (!c && dev->nwc < NWCACHE) {
        void *bf = NULL;

        if (cudaMalloc(&bf, n * 2) == cudaSuccess) {
            c = &dev->wc[dev->nwc++];
            c->w = w;
            c->n = n;
            c->bf = bf;
        } else {
            cudaGetLastError(); /* no room: convert into the staging */
        }
    }
    rc = to_bf16(dev, p, c ? c->bf : stage, w, n);
    if (rc < 0)
        return rc;
    if (c)
        c->gen = dev->wgen;
    *out = c ? c->bf : stage;
    return 0;
}

static int cuda_conv_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                         const void *x, const float *w, void *y, void *ws)
{
    struct stage s = conv_stage(p, ws);
    const void *xx = x, *ww = w;
    void *yy = y;
    int rc = 0;

    BIND(dev);
    if (p->bf16) {
        if ((rc = to_bf16(dev, p, s.x, x, p->nx)) < 0 ||
            (rc = weights_bf16(dev, p, w, p->nw, s.w, &ww)) < 0)
            return rc;
        xx = s.x;
        yy = s.y;
    }
    rc = conv_run(dev, p, FWD, xx, ww, yy, s.algo);
    if (rc == 0 && p->bf16)
        rc = from_bf16(dev, p, y, s.y, p->ny);
    return rc;
}

static int cuda_conv_bwd_data(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                              const void *dy, const float *w, void *dx,
                              void *ws)
{
    struct stage s = conv_stage(p, ws);
    const void *dyy = dy, *ww = w;
    void *dxx = dx;
    int rc = 0;

    BIND(dev);
    if (p->bf16) {
        /* dy's copy from the backward-filter just before, if that was the
         * previous op, on the same plan, workspace and dy */
        int have = dev->dy_plan == p && dev->dy_ws == ws && dev->dy_src == dy &&
                   dev->dy_seq == dev->seq - 1;

        dev->dy_plan = NULL;
        if ((!have && (rc = to_bf16(dev, p, s.y, dy, p->ny)) < 0) ||
            (rc = weights_bf16(dev, p, w, p->nw, s.w, &ww)) < 0)
            return rc;
        dyy = s.y;
        dxx = s.x;
    }
    rc = conv_run(dev, p, BWD_DATA, dyy, ww, dxx, s.algo);
    if (rc == 0 && p->bf16)
        rc = from_bf16(dev, p, dx, s.x, p->nx);
    return rc;
}

static int cuda_conv_bwd_filter(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                                const void *x, const void *dy, float *dw,
                                void *ws)
{
    struct stage s = conv_stage(p, ws);
    const void *xx = x, *dyy = dy;
    void *dww = dw;
    int rc = 0;

    BIND(dev);
    if (p->bf16) {
        if ((rc = to_bf16(dev, p, s.x, x, p->nx)) < 0 ||
            (rc = to_bf16(dev, p, s.y, dy, p->ny)) < 0)
            return rc;
        xx = s.x;
        dyy = s.y;
        dww = s.w;
    }
    rc = conv_run(dev, p, BWD_FILTER, xx, dyy, dww, s.algo);
    if (rc == 0 && p->bf16)
        rc = from_bf16(dev, p, dw, s.w, p->nw);
    if (rc == 0 && p->bf16) { /* s.y keeps dy's copy for backward data */
        dev->dy_plan = p;
        dev->dy_ws = ws;
        dev->dy_src = dy;
        dev->dy_seq = dev->seq;
    }
    return rc;
}

/* ---- batch norm ---------------------------------------------------------- */

static int cuda_bn_fwd_train(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                             const void *x, void *y, const float *gamma,
                             const float *beta, float *running_mean,
                             float *running_var, float momentum, float *save,
                             void *reserve, void *ws)
{
    int rc = 0;

    BIND(dev);
    (void)ws;
    /* cuDNN updates running_var with the unbiased batch variance and
     * normalises with the biased one, as PyTorch (which calls it) does */
    DNN_CHECK(rc,
              cudnnBatchNormalizationForwardTraining(
                  dev->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, p->xd, x,
                  p->xd, y, p->bnd, gamma, beta, (double)momentum, running_mean,
                  running_var, (double)p->d.eps, save, save + p->d.c),
              out, "cudnnBatchNormalizationForwardTraining", p);
    if (p->d.relu)
        KERN_CHECK(rc, mesh_cuk_relu_fwd(dev->compute, p->nx, y, y, reserve),
                   out, "relu (bn)", p);
out:
    return rc;
}

static int cuda_bn_fwd_infer(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                             const void *x, void *y, const float *gamma,
                             const float *beta, const float *running_mean,
                             const float *running_var, void *ws)
{
    int rc = 0;

    BIND(dev);
    (void)ws;
    DNN_CHECK(rc,
              cudnnBatchNormalizationForwardInference(
                  dev->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, p->xd, x,
                  p->xd, y, p->bnd, gamma, beta, running_mean, running_var,
                  (double)p->d.eps),
              out, "cudnnBatchNormalizationForwardInference", p);
    if (p->d.relu)
        KERN_CHECK(rc, mesh_cuk_relu_fwd(dev->compute, p->nx, y, y, NULL), out,
                   "relu (bn)", p);
out:
    return rc;
}

static int cuda_bn_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                       const void *x, const void *dy, const float *gamma,
                       const float *beta, const float *save,
                       const void *reserve, void *dx, float *dgamma,
                       float *dbeta, void *ws)
{
    const void *g = dy;
    int rc = 0;

    BIND(dev);
    (void)beta;
    if (p->d.relu) {
        KERN_CHECK(rc, mesh_cuk_mask_bwd(dev->compute, p->nx, reserve, dy, ws),
                   out, "relu mask (bn backward)", p);
        g = ws;
    } else if (dx == dy) {
        CUDA_CHECK(rc,
                   cudaMemcpyAsync(ws, dy, p->nx * sizeof(float),
                                   cudaMemcpyDeviceToDevice, dev->compute),
                   out, "cudaMemcpyAsync (bn backward)", p);
        g = ws;
    }
    DNN_CHECK(rc,
              cudnnBatchNormalizationBackward(
                  dev->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero,
                  p->xd, x, p->xd, g, p->xd, dx, p->bnd, gamma, dgamma, dbeta,
                  (double)p->d.eps, save, save + p->d.c),
              out, "cudnnBatchNormalizationBackward", p);
out:
    return rc;
}

/* ---- element-wise and pooling -------------------------------------------- */

static int cuda_relu_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                         const void *x, void *y)
{
    int rc = 0;

    BIND(dev);
    KERN_CHECK(rc, mesh_cuk_relu_fwd(dev->compute, p->nx, x, y, NULL), out,
               "relu", p);
out:
    return rc;
}

static int cuda_relu_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                         const void *y, const void *dy, void *dx)
{
    int rc = 0;

    BIND(dev);
    KERN_CHECK(rc, mesh_cuk_relu_bwd(dev->compute, p->nx, y, dy, dx), out,
               "relu backward", p);
out:
    return rc;
}

static int cuda_add(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                    const void *a, const void *b, void *y)
{
    int rc = 0;

    BIND(dev);
    KERN_CHECK(rc, mesh_cuk_add(dev->compute, p->nx, a, b, y, p->d.relu), out,
               "add", p);
out:
    return rc;
}

static int cuda_maxpool_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *x, void *y, void *reserve, void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    int rc = 0;

    BIND(dev);
    (void)ws;
    KERN_CHECK(rc,
               mesh_cuk_maxpool_fwd(dev->compute, d->n, d->c, d->h, d->w, d->oh,
                                    d->ow, d->r, d->stride, d->pad, x, y,
                                    reserve),
               out, "maxpool", p);
out:
    return rc;
}

static int cuda_maxpool_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *dy, const void *reserve, void *dx,
                            void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    int rc = 0;

    BIND(dev);
    (void)ws;
    KERN_CHECK(rc,
               mesh_cuk_maxpool_bwd(dev->compute, d->n, d->c, d->h, d->w, d->oh,
                                    d->ow, d->r, d->stride, d->pad, dy, reserve,
                                    dx),
               out, "maxpool backward", p);
out:
    return rc;
}

static int cuda_avgpool_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *x, void *y, void *ws)
{
    int rc = 0;

    BIND(dev);
    (void)ws;
    KERN_CHECK(rc,
               mesh_cuk_avgpool_fwd(dev->compute, p->d.n * p->d.c,
                                    p->d.h * p->d.w, x, y),
               out, "avgpool", p);
out:
    return rc;
}

static int cuda_avgpool_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *dy, void *dx, void *ws)
{
    int rc = 0;

    BIND(dev);
    (void)ws;
    KERN_CHECK(rc,
               mesh_cuk_avgpool_bwd(dev->compute, p->d.n * p->d.c,
                                    p->d.h * p->d.w, dy, dx),
               out, "avgpool backward", p);
out:
    return rc;
}

/* ---- fully connected (cuBLAS, column-major views of row-major data) ------ */

/*
 * C (m x n, ldc) = alpha op(A) op(B) + beta C, all float32 in memory;
 * A is k-major per op as cuBLAS wants. Under bf16-amp the operands are
 * staged as bfloat16 in ws (A first, then B) and multiplied with float32
 * accumulation into the float32 C.
 */
static int gemm(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                const float *a, int lda, size_t na, const float *b, int ldb,
                size_t nb, float beta, float *c, int ldc, void *ws)
{
    int rc = 0;

    if (p->bf16) {
        void *ab = ws, *bb = ws_at(ws, p->fc_a);

        if ((rc = to_bf16(dev, p, ab, a, na)) < 0 ||
            (rc = to_bf16(dev, p, bb, b, nb)) < 0)
            return rc;
        BLAS_CHECK(rc,
                   cublasGemmEx(dev->blas, ta, tb, m, n, k, &one, ab,
                                CUDA_R_16BF, lda, bb, CUDA_R_16BF, ldb, &beta,
                                c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   out, "cublasGemmEx (bf16)", p);
        return 0;
    }
    BLAS_CHECK(rc,
               cublasSgemm(dev->blas, ta, tb, m, n, k, &one, a, lda, b, ldb,
                           &beta, c, ldc),
               out, "cublasSgemm", p);
out:
    return rc;
}

static int cuda_fc_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                       const void *x, const float *w, const float *b, void *y,
                       void *ws)
{
    int n = p->d.n, c = p->d.c, k = p->d.k, rc = 0;

    BIND(dev);
    KERN_CHECK(rc, mesh_cuk_bias_fill(dev->compute, n, k, b, y), out, "bias",
               p);
    /* y^T (k x n) = W (k x c) x^T: W is col-major (c x k), op T */
    rc = gemm(dev, p, CUBLAS_OP_T, CUBLAS_OP_N, k, n, c, w, c, (size_t)k * c, x,
              c, (size_t)n * c, 1.f, y, k, ws);
out:
    return rc;
}

static int cuda_fc_bwd_data(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *dy, const float *w, void *dx, void *ws)
{
    int n = p->d.n, c = p->d.c, k = p->d.k;

    BIND(dev);
    /* dx^T (c x n) = W^T (c x k, col-major W) dy^T (k x n) */
    return gemm(dev, p, CUBLAS_OP_N, CUBLAS_OP_N, c, n, k, w, c, (size_t)k * c,
                dy, k, (size_t)n * k, 0.f, dx, c, ws);
}

static int cuda_fc_bwd_weights(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                               const void *x, const void *dy, float *dw,
                               float *db, void *ws)
{
    int n = p->d.n, c = p->d.c, k = p->d.k, rc;

    BIND(dev);
    /* dW^T (c x k) = x^T (c x n) dy (n x k): dy is col-major (k x n) */
    rc = gemm(dev, p, CUBLAS_OP_N, CUBLAS_OP_T, c, k, n, x, c, (size_t)n * c,
              dy, k, (size_t)n * k, 0.f, dw, c, ws);
    if (rc < 0)
        return rc;
    KERN_CHECK(rc, mesh_cuk_bias_grad(dev->compute, n, k, dy, db), out,
               "bias gradient", p);
out:
    return rc;
}

/* ---- loss, optimizer, accumulation --------------------------------------- */

static int xent_args(int n, int k, float smoothing)
{
    if (n < 1 || k < 1 || !(smoothing >= 0.f && smoothing < 1.f))
        return mesh_err(-EINVAL,
                        "nn cuda: xent: bad arguments (n %d, k %d, "
                        "smoothing %g)",
                        n, k, (double)smoothing);
    return 0;
}

/* The kernel into the device scratch: n row losses, then the flag. */
static int xent_run(struct mesh_nn_dev *dev, int n, int k, const float *logits,
                    const int32_t *labels, float smoothing, float *dlogits)
{
    size_t need = ((size_t)n + 1) * sizeof(float);
    int rc = 0;

    if (need > dev->xent_cap) {
        cudaFree(dev->xent_dev); /* waits for the copies out of it */
        cudaFreeHost(dev->xent_host);
        dev->xent_dev = dev->xent_host = NULL;
        dev->xent_cap = 0;
        CUDA_CHECK(rc, cudaMalloc(&dev->xent_dev, need), out,
                   "cudaMalloc (xent)", NULL);
        CUDA_CHECK(rc, cudaMallocHost(&dev->xent_host, need), out,
                   "cudaMallocHost (xent)", NULL);
        dev->xent_cap = need;
    }
    CUDA_CHECK(rc,
               cudaMemsetAsync((float *)dev->xent_dev + n, 0, sizeof(int),
                               dev->compute),
               out, "cudaMemsetAsync (xent)", NULL);
    KERN_CHECK(rc,
               mesh_cuk_xent(dev->compute, n, k, logits, labels, smoothing,
                             dev->xent_dev, dlogits,
                             (int *)((float *)dev->xent_dev + n)),
               out, "xent", NULL);
out:
    return rc;
}

/* The mean of n row losses on the host, or -EINVAL for the bad flag. */
static int xent_mean(const float *rows, int n, int k, float *loss)
{
    double total = 0;
    int i, bad;

    memcpy(&bad, rows + n, sizeof(bad));
    if (bad)
        return mesh_err(-EINVAL, "nn cuda: xent: a label is outside [0, %d)",
                        k);
    for (i = 0; i < n; i++)
        total += rows[i];
    *loss = (float)(total / n);
    return 0;
}

static int cuda_xent(struct mesh_nn_dev *dev, int n, int k, const float *logits,
                     const int32_t *labels, float smoothing, float *loss,
                     float *dlogits)
{
    int rc;

    BIND(dev);
    if ((rc = xent_args(n, k, smoothing)) < 0 ||
        (rc = xent_run(dev, n, k, logits, labels, smoothing, dlogits)) < 0 ||
        (rc = copy_sync(dev, dev->xent_host, dev->xent_dev,
                        ((size_t)n + 1) * sizeof(float), cudaMemcpyDeviceToHost,
                        "cudaMemcpyAsync (xent)")) < 0)
        return rc;
    return xent_mean(dev->xent_host, n, k, loss);
}

/*
 * xent, its row losses copied to the next slot of the ring on the compute
 * stream without a host wait (the ring grows when every slot is queued).
 */
static int cuda_xent_start(struct mesh_nn_dev *dev, int n, int k,
                           const float *logits, const int32_t *labels,
                           float smoothing, float *dlogits)
{
    size_t need = (size_t)n + 1;
    struct xent_slot *x;
    int rc;

    BIND(dev);
    if ((rc = xent_args(n, k, smoothing)) < 0)
        return rc;
    if (dev->xq_count == dev->xq_cap) {
        int cap = dev->xq_cap ? 2 * dev->xq_cap : 4, i;
        struct xent_slot *q = calloc((size_t)cap, sizeof(*q));

        if (!q)
            return mesh_err(-ENOMEM, "nn cuda: out of memory (loss queue)");
        for (i = 0; i < dev->xq_cap; i++)
            q[i] = dev->xq[(dev->xq_head + i) % dev->xq_cap];
        free(dev->xq);
        dev->xq = q;
        dev->xq_cap = cap;
        dev->xq_head = 0;
    }
    x = &dev->xq[(dev->xq_head + dev->xq_count) % dev->xq_cap];
    if (!x->ev)
        CUDA_CHECK(rc, cudaEventCreateWithFlags(&x->ev, cudaEventDisableTiming),
                   out, "cudaEventCreateWithFlags (xent)", NULL);
    if (need > x->cap) {
        if (x->host)
            cudaFreeHost(x->host);
        x->host = NULL;
        x->cap = 0;
        CUDA_CHECK(rc, cudaMallocHost((void **)&x->host, need * sizeof(float)),
                   out, "cudaMallocHost (xent)", NULL);
        x->cap = need;
    }
    rc = xent_run(dev, n, k, logits, labels, smoothing, dlogits);
    if (rc < 0)
        goto out;
    CUDA_CHECK(rc,
               cudaMemcpyAsync(x->host, dev->xent_dev, need * sizeof(float),
                               cudaMemcpyDeviceToHost, dev->compute),
               out, "cudaMemcpyAsync (xent, queued)", NULL);
    CUDA_CHECK(rc, cudaEventRecord(x->ev, dev->compute), out,
               "cudaEventRecord (xent)", NULL);
    x->n = n;
    x->k = k;
    dev->xq_count++;
out:
    return rc;
}

/* The oldest queued loss: wait for its copy (long done, usually). */
static int cuda_xent_read(struct mesh_nn_dev *dev, float *loss)
{
    struct xent_slot *x;
    int rc = 0;

    BIND(dev);
    if (!dev->xq_count)
        return mesh_err(-ENOENT, "nn cuda: no loss is queued");
    x = &dev->xq[dev->xq_head];
    dev->xq_head = (dev->xq_head + 1) % dev->xq_cap;
    dev->xq_count--;
    CUDA_CHECK(rc, cudaEventSynchronize(x->ev), out,
               "cudaEventSynchronize (xent)", NULL);
    rc = xent_mean(x->host, x->n, x->k, loss);
out:
    return rc;
}

static int cuda_sgd(struct mesh_nn_dev *dev, size_t n, float *p, const float *g,
                    float *buf, const struct mesh_nn_sgd_args *a)
{
    int rc = 0;

    BIND(dev);
    wrote(dev, p, n * sizeof(float));
    if (a->momentum != 0.f && !buf)
        return mesh_err(-EINVAL, "nn cuda: sgd: momentum without a buffer");
    if (a->keep_p)
        return mesh_err(-ENOTSUP, "nn cuda: sgd: keeping the state before "
                                  "the step needs host slabs");
    KERN_CHECK(rc,
               mesh_cuk_sgd(dev->compute, n, p, g, buf, a->lr, a->momentum,
                            a->dampening, a->weight_decay, a->nesterov,
                            a->first),
               out, "sgd", NULL);
out:
    return rc;
}

static int cuda_axpy1(struct mesh_nn_dev *dev, size_t n, const float *x,
                      float *y)
{
    int rc = 0;

    BIND(dev);
    wrote(dev, y, n * sizeof(float));
    KERN_CHECK(rc, mesh_cuk_axpy1(dev->compute, n, x, y), out, "axpy", NULL);
out:
    return rc;
}

static int cuda_convert(struct mesh_nn_dev *dev, int dst_dtype, void *dst,
                        int src_dtype, const void *src, size_t n, float scale)
{
    int rc = 0;

    BIND(dev);
    wrote(dev, dst, n * (dst_dtype == MESH_DT_F32 ? 4 : 2));
    KERN_CHECK(rc,
               mesh_cuk_convert(dev->compute, n, dst_dtype, dst, src_dtype, src,
                                scale),
               out, "convert", NULL);
out:
    return rc;
}

/* ---- asynchronous copies (the pinned-host gradient pipeline) ------------- */

static int copy_get(struct mesh_nn_dev *dev, struct mesh_nn_copy **out)
{
    struct mesh_nn_copy *c = dev->free_copies;
    int rc = 0;

    if (c) {
        dev->free_copies = c->next;
        *out = c;
        return 0;
    }
    c = calloc(1, sizeof(*c));
    if (!c)
        return mesh_err(-ENOMEM, "nn cuda: out of memory");
    /* no timing: the cheapest event, enough for ordering and queries */
    CUDA_CHECK(rc, cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming),
               fail, "cudaEventCreateWithFlags", NULL);
    c->all = dev->all_copies;
    dev->all_copies = c;
    *out = c;
    return 0;

fail:
    free(c);
    return rc;
}

static void copy_put(struct mesh_nn_dev *dev, struct mesh_nn_copy *c)
{
    c->next = dev->free_copies;
    dev->free_copies = c;
}

/*
 * A copy out: record "compute reached here", make the copy-out stream wait
 * for it, copy, record the copy's end (the same event serves both:
 * cudaStreamWaitEvent captures the recording current at the time of the
 * call). A copy back does not wait for compute (nn.h): waiting would queue
 * it behind every backward kernel issued so far, which the gradients it
 * lands in do not need, and leave it exposed after backward.
 */
static int cuda_copy_start(struct mesh_nn_dev *dev, int to_host, void *dst,
                           const void *src, size_t bytes,
                           struct mesh_nn_copy **out)
{
    struct mesh_nn_copy *c = NULL;
    cudaStream_t st = to_host ? dev->copy_out : dev->copy_in;
    int rc;

    /* bind first: a new handle's event belongs to the current device */
    BIND(dev);
    rc = copy_get(dev, &c);
    if (rc < 0)
        return rc;
    if (!to_host) {
        wrote(dev, dst, bytes);
        /* after the uploads issued so far, which no longer block the
         * host (cuda_upload): one may have targeted the same memory */
        if (dev->small_used)
            CUDA_CHECK(
                rc, cudaStreamWaitEvent(st, dev->small_ev[dev->small_last], 0),
                fail, "cudaStreamWaitEvent (uploads)", NULL);
    } else {
        CUDA_CHECK(rc, cudaEventRecord(c->ev, dev->compute), fail,
                   "cudaEventRecord (compute)", NULL);
        CUDA_CHECK(rc, cudaStreamWaitEvent(st, c->ev, 0), fail,
                   "cudaStreamWaitEvent (copy)", NULL);
    }
    CUDA_CHECK(rc,
               cudaMemcpyAsync(dst, src, bytes,
                               to_host ? cudaMemcpyDeviceToHost
                                       : cudaMemcpyHostToDevice,
                               st),
               fail,
               to_host ? "cudaMemcpyAsync (gradients to host)"
                       : "cudaMemcpyAsync (gradients to device)",
               NULL);
    CUDA_CHECK(rc, cudaEventRecord(c->ev, st), fail, "cudaEventRecord (copy)",
               NULL);
    *out = c;
    return 0;

fail:
    copy_put(dev, c);
    return rc;
}

static int cuda_copy_test(struct mesh_nn_dev *dev, struct mesh_nn_copy *c,
                          int *done)
{
    cudaError_t e;
    int rc = 0;

    BIND(dev);
    e = cudaEventQuery(c->ev);
    if (e == cudaErrorNotReady) {
        /* the runtime also records "not ready" as this thread's last
         * error, which the next kernel launcher (cudaGetLastError) would
         * report as its own failure: clear it, as PyTorch does */
        (void)cudaGetLastError();
        *done = 0;
        return 0;
    }
    CUDA_CHECK(rc, e, out, "cudaEventQuery (copy)", NULL);
    *done = 1;
out:
    return rc;
}

static int cuda_copy_wait(struct mesh_nn_dev *dev, struct mesh_nn_copy *c)
{
    int rc = 0;

    BIND(dev);
    CUDA_CHECK(rc, cudaEventSynchronize(c->ev), out,
               "cudaEventSynchronize (copy)", NULL);
out:
    copy_put(dev, c);
    return rc;
}

static int cuda_copy_order(struct mesh_nn_dev *dev, struct mesh_nn_copy *c)
{
    int rc = 0;

    BIND(dev);
    CUDA_CHECK(rc, cudaStreamWaitEvent(dev->compute, c->ev, 0), out,
               "cudaStreamWaitEvent (compute)", NULL);
out:
    copy_put(dev, c);
    return rc;
}

const struct mesh_nn_backend_ops mesh_nn_cuda_ops = {
    .name = "cuda",
    MESH_NN_BACKEND_CORE(cuda),
    .upload = cuda_upload,
    .download = cuda_download,
    .dev_open_opts = cuda_dev_open_opts,
    MESH_NN_BACKEND_STREAMS(cuda),
    .xent_start = cuda_xent_start,
    .xent_read = cuda_xent_read,
};
