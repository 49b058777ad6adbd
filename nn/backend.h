/*
 * nn/backend.h: the compute backend interface of nn (internal to nn/ and its
 * tests). Layers and models call only these ops; a backend is a const table
 * of function pointers chosen by name ("cpu": oneDNN; "cuda": cuDNN and
 * cuBLAS; "devsim": a GPU test double over "cpu" for the trainer's tests).
 * Nothing above this header tests which backend runs.
 *
 * The interface follows cuDNN as much as oneDNN:
 * - Buffers are opaque device pointers (void *) from the backend's alloc;
 *   the host reaches them only through upload/download.
 * - Every op with a shape has a plan, created once per shape (and shared
 *   through nn's plan cache, nn/ctx.c) and destroyed with the device. A plan
 *   knows its workspace size (scratch for one call, passed explicitly; NULL
 *   when the size is 0) and its reserve size (bytes that the forward call
 *   writes and the matching backward call reads, held by the layer).
 * - Activations (n, c, h, w) are stored in a layout the backend chooses
 *   (oneDNN: nChw16c on AVX-512 when c is a multiple of 16, else NCHW;
 *   cuDNN: NCHW or NHWC); act_bytes() gives their size and act_import()/
 *   act_export() convert from/to plain NCHW floats. Two layouts of a
 *   (n, c, 1, 1) tensor must equal the plain (n, c) matrix: the pooled
 *   features feed the fully connected layer directly.
 * - Parameters (conv weights (K, C, R, S), BN gamma/beta (C), FC weight
 *   (O, I) and bias (O)) are always plain row-major float32: they live in
 *   the model's slabs, are all-reduced and saved as they are.
 * Every op returns 0 or a negative errno-style code with mesh_err() set.
 */
#ifndef MESH_NN_BACKEND_H
#define MESH_NN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct mesh_nn_dev;
struct mesh_nn_plan;
struct mesh_nn_dev_opts;
struct mesh_nn_copy;

/* Kinds of plan (the cache key's first field). */
enum mesh_nn_plan_kind {
    MESH_NN_PLAN_CONV = 1,
    MESH_NN_PLAN_BN,
    MESH_NN_PLAN_RELU,
    MESH_NN_PLAN_ADD,
    MESH_NN_PLAN_MAXPOOL,
    MESH_NN_PLAN_AVGPOOL,
    MESH_NN_PLAN_FC,
};

/*
 * One description for every kind of plan; unused fields are 0 so that the
 * whole struct is the cache key (compare with memcmp: always memset first).
 *   CONV:    x (n, c, h, w) -> y (n, k, oh, ow); kernel r x s, stride, pad;
 *            no bias (ResNet convs have none).
 *   BN:      x, y (n, c, h, w); eps; relu = 1 fuses y = max(bn(x), 0).
 *   RELU:    x, y (n, c, h, w).
 *   ADD:     y = a + b, all (n, c, h, w); relu = 1 gives y = max(a + b, 0).
 *   MAXPOOL: x (n, c, h, w) -> y (n, c, oh, ow); window r x r, stride, pad.
 *   AVGPOOL: global average: x (n, c, h, w) -> y (n, c, 1, 1).
 *   FC:      x (n, c) -> y (n, k), y = x W^T + b, W (k, c), b (k).
 */
struct mesh_nn_plan_desc {
    int32_t kind;
    int32_t n, c, h, w;
    int32_t k, r, s, stride, pad;
    int32_t oh, ow;
    int32_t relu;
    float eps;
};

/* Output size of a window op along one dimension. */
static inline int mesh_nn_out_dim(int in, int win, int stride, int pad)
{
    return (in + 2 * pad - win) / stride + 1;
}

/*
 * The SGD update on n contiguous floats, exactly PyTorch's torch.optim.SGD
 * (1.13, foreach=False) for one parameter:
 *   d = g + wd * p                          (when wd != 0)
 *   buf = first ? d : momentum * buf + (1 - dampening) * d
 *                                           (when momentum != 0)
 *   d = nesterov ? d + momentum * buf : buf (when momentum != 0)
 *   p = p - lr * d
 */
struct mesh_nn_sgd_args {
    float lr, momentum, dampening, weight_decay;
    int nesterov;
    int first; /* 1 on the first step: the momentum buffer is initialised */
    /* when not NULL (mesh_nn_sgd_step_keep; host memory, only where the
     * slabs are too): p[i] and buf[i] before the update, written in the
     * update's own pass to keep_p[i] and keep_buf[i] (keep_buf when buf) */
    float *keep_p, *keep_buf;
};

struct mesh_nn_backend_ops {
    const char *name;

    /* Device: threads <= 0 means every online core. */
    int (*dev_open)(int threads, struct mesh_nn_dev **out);
    void (*dev_close)(struct mesh_nn_dev *dev);
    /* A line describing the device and its settings (static storage). */
    const char *(*dev_describe)(struct mesh_nn_dev *dev);

    /* Memory: zero-filled on allocation. */
    int (*alloc)(struct mesh_nn_dev *dev, size_t bytes, void **out);
    void (*free)(struct mesh_nn_dev *dev, void *p);
    /* Blocks from alloc not yet freed (the leak check of the tests). */
    long (*live_allocs)(struct mesh_nn_dev *dev);
    int (*upload)(struct mesh_nn_dev *dev, void *dst, const void *src,
                  size_t bytes);
    int (*download)(struct mesh_nn_dev *dev, void *dst, const void *src,
                    size_t bytes);
    int (*zero)(struct mesh_nn_dev *dev, void *p, size_t bytes);
    /* Wait until every op issued so far has finished. */
    int (*sync)(struct mesh_nn_dev *dev);

    /* Activation layout: bytes of an (n, c, h, w) tensor, conversions. */
    size_t (*act_bytes)(struct mesh_nn_dev *dev, int n, int c, int h, int w);
    int (*act_import)(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                      const float *host_nchw, void *dst);
    int (*act_export)(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                      const void *src, float *host_nchw);

    /* Plans. */
    int (*plan_create)(struct mesh_nn_dev *dev,
                       const struct mesh_nn_plan_desc *d,
                       struct mesh_nn_plan **out);
    void (*plan_destroy)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p);
    size_t (*plan_workspace)(const struct mesh_nn_plan *p);
    size_t (*plan_reserve)(const struct mesh_nn_plan *p);

    /* Convolution: w (k, c, r, s) plain. dx is not needed for the stem. */
    int (*conv_fwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                    const void *x, const float *w, void *y, void *ws);
    int (*conv_bwd_data)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                         const void *dy, const float *w, void *dx, void *ws);
    int (*conv_bwd_filter)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *x, const void *dy, float *dw, void *ws);

    /*
     * Batch norm over (n, h, w) per channel, PyTorch's semantics:
     * training uses the biased batch variance to normalise and updates
     * running_var with the unbiased one: r = (1 - momentum) * r + momentum *
     * stat. save (2 * c floats, backend-defined contents) is written by
     * bn_fwd_train and read by bn_bwd; reserve as plan_reserve says (the
     * fused ReLU's mask). dx may alias dy.
     */
    int (*bn_fwd_train)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *x, void *y, const float *gamma,
                        const float *beta, float *running_mean,
                        float *running_var, float momentum, float *save,
                        void *reserve, void *ws);
    int (*bn_fwd_infer)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *x, void *y, const float *gamma,
                        const float *beta, const float *running_mean,
                        const float *running_var, void *ws);
    int (*bn_bwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                  const void *x, const void *dy, const float *gamma,
                  const float *beta, const float *save, const void *reserve,
                  void *dx, float *dgamma, float *dbeta, void *ws);

    /* ReLU; the backward reads the forward's output y. May run in place. */
    int (*relu_fwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                    const void *x, void *y);
    int (*relu_bwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                    const void *y, const void *dy, void *dx);

    /* y = a + b (then ReLU when the plan says so); y may alias a. */
    int (*add)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p, const void *a,
               const void *b, void *y);

    /* Max pool; the reserve carries the argmax from forward to backward. */
    int (*maxpool_fwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                       const void *x, void *y, void *reserve, void *ws);
    int (*maxpool_bwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                       const void *dy, const void *reserve, void *dx, void *ws);

    /* Global average pool. */
    int (*avgpool_fwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                       const void *x, void *y, void *ws);
    int (*avgpool_bwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                       const void *dy, void *dx, void *ws);

    /* Fully connected: x (n, c), y (n, k), w (k, c), b (k); all plain. */
    int (*fc_fwd)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                  const void *x, const float *w, const float *b, void *y,
                  void *ws);
    int (*fc_bwd_data)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                       const void *dy, const float *w, void *dx, void *ws);
    int (*fc_bwd_weights)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                          const void *x, const void *dy, float *dw, float *db,
                          void *ws);

    /*
     * Softmax cross-entropy over logits (n, k) plain, labels (n) int32 on
     * the device, with label smoothing eps (PyTorch's: target = (1 - eps) *
     * onehot + eps / k). Writes the mean loss over the batch to *loss (host)
     * and dlogits = d(mean loss)/d(logits) (n, k). Bad labels are -EINVAL.
     */
    int (*xent)(struct mesh_nn_dev *dev, int n, int k, const float *logits,
                const int32_t *labels, float smoothing, float *loss,
                float *dlogits);

    /* SGD update of n floats p with gradient g and momentum buffer buf. */
    int (*sgd)(struct mesh_nn_dev *dev, size_t n, float *p, const float *g,
               float *buf, const struct mesh_nn_sgd_args *a);

    /* y += x over n floats (gradient accumulation). */
    int (*axpy1)(struct mesh_nn_dev *dev, size_t n, const float *x, float *y);

    /*
     * Optional (NULL when the backend has none; nn/stream.c falls back to
     * dev_open(threads), synchronous upload/download, -ENOTSUP).
     * dev_open_opts: open with every option of struct mesh_nn_dev_opts.
     * copy_*: see mesh_nn_copy_* in nn.h; the backend allocates the handle.
     * convert: see mesh_nn_convert in nn.h.
     */
    int (*dev_open_opts)(const struct mesh_nn_dev_opts *o,
                         struct mesh_nn_dev **out);
    int (*copy_start)(struct mesh_nn_dev *dev, int to_host, void *dst,
                      const void *src, size_t bytes, struct mesh_nn_copy **out);
    int (*copy_test)(struct mesh_nn_dev *dev, struct mesh_nn_copy *c,
                     int *done);
    int (*copy_wait)(struct mesh_nn_dev *dev, struct mesh_nn_copy *c);
    int (*copy_order)(struct mesh_nn_dev *dev, struct mesh_nn_copy *c);
    /*
     * bn_bwd_frozen: backward of a batch norm that normalised with its
     * running statistics (a frozen BN, mesh_nn_model_freeze), to x only:
     * dx = dy * gamma / sqrt(running_var + eps), and 0 where the plan's
     * fused ReLU gave y = 0 (y is the forward's output). dx may alias dy.
     * Without it a frozen BN must have only frozen parameters before it.
     */
    int (*bn_bwd_frozen)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                         const void *y, const void *dy, const float *gamma,
                         const float *running_var, void *dx);
    int (*convert)(struct mesh_nn_dev *dev, int dst_dtype, void *dst,
                   int src_dtype, const void *src, size_t n, float scale);
    /*
     * xent_start: xent without reading the loss back; the backend queues
     * its copy to the host behind the computation. xent_read: the oldest
     * queued loss, in order, waiting for its copy (-EINVAL for a bad
     * label, -ENOENT when none is queued). Without them (cpu, devsim) nn
     * computes with xent and queues the value itself (nn/resnet.c).
     */
    int (*xent_start)(struct mesh_nn_dev *dev, int n, int k,
                      const float *logits, const int32_t *labels,
                      float smoothing, float *dlogits);
    int (*xent_read)(struct mesh_nn_dev *dev, float *loss);
    /*
     * A training convolution that converts its operands (cpu, bf16-amp)
     * can keep the converted x from forward to backward, and convert dy
     * once for both gradients. A conv plan with a nonzero plan_reserve
     * offers it; the three come together or not at all (cpu: all three):
     * - conv_fwd_keep: conv_fwd, leaving in reserve (plan_reserve bytes,
     *   held by the layer) the form of x that conv_bwd_filter_kept reads;
     * - conv_bwd_filter_kept: conv_bwd_filter with x unchanged since that
     *   forward and its reserve; it leaves dy's form at the start of ws;
     * - conv_bwd_data_after: conv_bwd_data called after
     *   conv_bwd_filter_kept with the same plan, dy and ws, neither of
     *   them written in between (nn's axpy1 on other buffers may run
     *   between): it reads that form of dy.
     * Each computes the same numbers as the op it stands for.
     */
    int (*conv_fwd_keep)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                         const void *x, const float *w, void *y, void *reserve,
                         void *ws);
    int (*conv_bwd_filter_kept)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                                const void *x, const void *reserve,
                                const void *dy, float *dw, void *ws);
    int (*conv_bwd_data_after)(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                               const void *dy, const float *w, void *dx,
                               void *ws);
};

/* The backends built in; NULL (with mesh_err) for an unknown name. */
const struct mesh_nn_backend_ops *mesh_nn_backend_find(const char *name);
/*
 * A backend's table from its functions, named PREFIX_op: every backend
 * implements the ops of MESH_NN_BACKEND_CORE (a missing one is a compile
 * error, not a NULL at run time), and one with streams those of
 * MESH_NN_BACKEND_STREAMS. upload and download, and the optional
 * dev_open_opts, are listed by each backend itself:
 *
 *   const struct mesh_nn_backend_ops mesh_nn_cpu_ops = {
 *       .name = "cpu", MESH_NN_BACKEND_CORE(cpu),
 *       .upload = cpu_copy, .download = cpu_copy,
 *   };
 */
#define MESH_NN_BACKEND_CORE(p)                                                \
    .dev_open = p##_dev_open, .dev_close = p##_dev_close,                      \
    .dev_describe = p##_dev_describe, .alloc = p##_alloc, .free = p##_free,    \
    .live_allocs = p##_live_allocs, .zero = p##_zero, .sync = p##_sync,        \
    .act_bytes = p##_act_bytes, .act_import = p##_act_import,                  \
    .act_export = p##_act_export, .plan_create = p##_plan_create,              \
    .plan_destroy = p##_plan_destroy, .plan_workspace = p##_plan_workspace,    \
    .plan_reserve = p##_plan_reserve, .conv_fwd = p##_conv_fwd,                \
    .conv_bwd_data = p##_conv_bwd_data,                                        \
    .conv_bwd_filter = p##_conv_bwd_filter, .bn_fwd_train = p##_bn_fwd_train,  \
    .bn_fwd_infer = p##_bn_fwd_infer, .bn_bwd = p##_bn_bwd,                    \
    .relu_fwd = p##_relu_fwd, .relu_bwd = p##_relu_bwd, .add = p##_add,        \
    .maxpool_fwd = p##_maxpool_fwd, .maxpool_bwd = p##_maxpool_bwd,            \
    .avgpool_fwd = p##_avgpool_fwd, .avgpool_bwd = p##_avgpool_bwd,            \
    .fc_fwd = p##_fc_fwd, .fc_bwd_data = p##_fc_bwd_data,                      \
    .fc_bwd_weights = p##_fc_bwd_weights, .xent = p##_xent, .sgd = p##_sgd,    \
    .axpy1 = p##_axpy1
#define MESH_NN_BACKEND_STREAMS(p)                                             \
    .copy_start = p##_copy_start, .copy_test = p##_copy_test,                  \
    .copy_wait = p##_copy_wait, .copy_order = p##_copy_order,                  \
    .convert = p##_convert

extern const struct mesh_nn_backend_ops mesh_nn_cpu_ops;
extern const struct mesh_nn_backend_ops mesh_nn_cuda_ops;
/* cudaHostAlloc'ed memory on the device mesh_nn_cuda_host_device named
 * (the cuda backend does when it opens one), -ENODEV before that or where
 * no device answers (remembered); free only what it returned. */
void mesh_nn_cuda_host_device(int gpu);
int mesh_nn_cuda_host_alloc(size_t len, void **out);
int mesh_nn_cuda_host_owns(const void *p);
void mesh_nn_cuda_host_free(void *p);

/*
 * The cuda backend lives in a module, meshtrain-cuda.so (nn/cuda/
 * include.am), so that no process maps a CUDA library before it asks for
 * "cuda". Its one exported symbol, mesh_nn_cuda_module, is this table;
 * nn/ctx.c checks abi, ops_size and version (a module from another build
 * is refused, not called).
 */
#define MESH_NN_CUDA_MODULE_ABI 1
struct mesh_nn_cuda_module {
    int abi;                               /* MESH_NN_CUDA_MODULE_ABI */
    size_t ops_size;                       /* sizeof(mesh_nn_backend_ops) */
    const char *version;                   /* PACKAGE_VERSION */
    const struct mesh_nn_backend_ops *ops; /* &mesh_nn_cuda_ops */
    int (*host_alloc)(size_t len, void **out);
    int (*host_owns)(const void *p);
    void (*host_free)(void *p);
};
extern const struct mesh_nn_cuda_module mesh_nn_cuda_module;
/* The module once nn/ctx.c has loaded it (the "cuda" backend was looked
 * up and the module loaded), else NULL; never loads it. */
const struct mesh_nn_cuda_module *mesh_nn_cuda_loaded(void);
/* "devsim": a test double of a GPU over the cpu backend (nn/devsim.c). */
extern const struct mesh_nn_backend_ops mesh_nn_devsim_ops;

/*
 * nn's device handle wraps a backend's device with a plan cache, so that
 * identical shapes share one plan (ResNet repeats many). The backend's own
 * struct mesh_nn_dev is opaque to everything above it.
 */
struct mesh_nn_ctx {
    const struct mesh_nn_backend_ops *ops;
    struct mesh_nn_dev *dev;
    struct mesh_nn_plan_entry *plans; /* the cache, a list */
    int threads;
};

/* Look the plan up in the cache, creating it on a miss. Owned by ctx. */
int mesh_nn_ctx_plan(struct mesh_nn_ctx *ctx, const struct mesh_nn_plan_desc *d,
                     struct mesh_nn_plan **out);

#endif
