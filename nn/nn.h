/*
 * nn/nn.h: the whole public interface of nn: a compute device (backend
 * chosen by name), the ResNet family, loss, SGD and LR schedules, and
 * weights in safetensors with torchvision's names.
 *
 * Typical training step (errors: 0 or a negative errno-style code, message
 * in mesh_err_msg()):
 *
 *   mesh_nn_ctx_open("cpu", threads, &ctx);
 *   mesh_nn_model_create(ctx, &cfg, &model);
 *   mesh_nn_sgd_create(model, &sgd_cfg, &sgd);
 *   for (...) {
 *       mesh_nn_model_forward(model, n, images, 1);
 *       mesh_nn_model_loss(model, labels, smoothing, &loss);
 *       mesh_nn_model_backward(model, 0, on_grad_ready, arg);
 *       (all-reduce the gradient slab)
 *       mesh_nn_sgd_step(sgd, mesh_nn_lr_at(&sched, epoch_float));
 *   }
 *
 * Slabs. All parameters live in one contiguous float32 slab and their
 * gradients in another of the same size; BN running statistics in a third
 * ("buffers"). Each tensor is a view at a fixed offset. The order is
 * torchvision's state_dict order with the buffers removed: conv1.weight,
 * bn1.weight, bn1.bias, layer1.0.conv1.weight, layer1.0.bn1.weight, ...,
 * [layerL.0.downsample.0.weight, layerL.0.downsample.1.weight/.bias,] ...,
 * fc.weight, fc.bias. Buffers: bn*.running_mean then running_var, per BN in
 * the same order. num_batches_tracked is one counter for the whole model
 * (every BN counts the same training steps), written per BN on save.
 * Offsets are in floats; shapes as torchvision's (conv (K, C, R, S), fc
 * (O, I)). Slab pointers are device pointers of the backend (host memory for
 * "cpu"); use mesh_nn_upload/download to reach them from the host.
 */
#ifndef MESH_NN_H
#define MESH_NN_H

#include "common/dtype.h"
#include "common/util.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct mesh_nn_ctx;
struct mesh_nn_model;
struct mesh_nn_sgd;

/* ---- device -------------------------------------------------------------- */

/* 0 when backend (cpu, cuda, devsim) is known and built, else -EINVAL
 * with a message that says which (unknown, or not built). "cuda" loads
 * its module (meshtrain-cuda.so, see nn/ctx.c) at the first call: a
 * module that cannot be loaded is -EINVAL with the file and the reason. */
int mesh_nn_backend_check(const char *backend);

/*
 * Open a device of backend "cpu" (oneDNN) or "cuda" (when built). threads
 * <= 0: every online core. The ctx owns the backend's plans (created once
 * per shape, shared). A ctx is used by one thread at a time.
 */
int mesh_nn_ctx_open(const char *backend, int threads,
                     struct mesh_nn_ctx **out);
void mesh_nn_ctx_close(struct mesh_nn_ctx *ctx);
/* "cpu: oneDNN 2.6.3, OpenMP threads 2, activations nChw16c" and such. */
const char *mesh_nn_ctx_describe(struct mesh_nn_ctx *ctx);
/* Copy between host and device memory (slabs), bytes. */
int mesh_nn_upload(struct mesh_nn_ctx *ctx, void *dev_dst, const void *host_src,
                   size_t bytes);
int mesh_nn_download(struct mesh_nn_ctx *ctx, void *host_dst,
                     const void *dev_src, size_t bytes);
/* Wait for every op issued on the device. */
int mesh_nn_sync(struct mesh_nn_ctx *ctx);

/* ---- models -------------------------------------------------------------- */

struct mesh_nn_model_cfg {
    const char *arch;       /* resnet18|resnet34|resnet50|resnet101|resnet152 */
    int num_classes;        /* default 1000 when 0 */
    int in_channels;        /* default 3 when 0 */
    int image_size;         /* square input side, default 224 when 0 */
    int cifar_stem;         /* 3x3 stride-1 conv1, no max pool */
    int zero_init_residual; /* last BN gamma of each block = 0 */
    uint64_t seed;          /* same seed: bitwise same weights everywhere */
    int width;              /* conv1 channels, stage k has width << k (and
                               x4 in bottlenecks); default (0) 64 as
                               torchvision; smaller for fast small models */
    int no_init;            /* skip the initialisation (the slabs stay as
                               allocated): the caller loads the weights and
                               statistics (an --elastic joiner receives
                               them; ResNet-50's 25 M normals take about
                               a second to draw) */
};

/* Fill in cfg's defaults where a field is 0 (see above). */
void mesh_nn_model_cfg_defaults(struct mesh_nn_model_cfg *cfg);

/* The architectures, for --help: "resnet18, resnet34, ...". */
const char *mesh_nn_arch_list(void);

/*
 * One convolution of a ResNet and the batch norm after it, as
 * mesh_nn_resnet_walk() hands them to its visitor: the stem's conv1, then
 * block by block (torchvision v1.5: the stride on a bottleneck's 3x3) each
 * conv of the main path and last the block's projection shortcut.
 */
struct mesh_nn_resnet_conv {
    char conv[40], bn[40]; /* "layer2.0.conv1" and "layer2.0.bn1" */
    char block[16];        /* "layer2.0"; "" for the stem */
    int index;             /* the block's, counted over all stages; -1 stem */
    int j;                 /* conv j of the main path (0..nconv-1), nconv
                              for the shortcut; 0 for the stem */
    int nconv;             /* convs on the main path: 2 basic, 3 bottleneck */
    int has_ds;            /* the block has a projection shortcut */
    int cin, cout, k, stride, pad;
    int relu; /* a ReLU follows the batch norm */
};

typedef int (*mesh_nn_resnet_visit_fn)(void *arg,
                                       const struct mesh_nn_resnet_conv *c);

/*
 * Visit every convolution of the ResNet cfg->arch in the order of its
 * parameters; cfg's defaults must be filled in (width, in_channels). Stops
 * at the first visit that returns non-zero and returns that; -EINVAL for an
 * unknown architecture. *feat gets the channels that reach the fc.
 */
int mesh_nn_resnet_walk(const struct mesh_nn_model_cfg *cfg,
                        mesh_nn_resnet_visit_fn visit, void *arg, int *feat);

/* Build the model and initialise it as torchvision does, from cfg->seed
 * (unless cfg->no_init). */
int mesh_nn_model_create(struct mesh_nn_ctx *ctx,
                         const struct mesh_nn_model_cfg *cfg,
                         struct mesh_nn_model **out);
void mesh_nn_model_destroy(struct mesh_nn_model *m);

/* Print the layer table; its last line is "parameters: N". */
void mesh_nn_model_summary(const struct mesh_nn_model *m, FILE *f);

/* One named tensor of the model (a view into a slab). */
enum mesh_nn_tensor_kind {
    MESH_NN_PARAM = 0,  /* in params/grads */
    MESH_NN_BUFFER = 1, /* in buffers (BN running statistics) */
};
enum mesh_nn_tensor_role {
    MESH_NN_ROLE_CONV_WEIGHT = 0,
    MESH_NN_ROLE_BN_WEIGHT,
    MESH_NN_ROLE_BN_BIAS,
    MESH_NN_ROLE_FC_WEIGHT,
    MESH_NN_ROLE_FC_BIAS,
    MESH_NN_ROLE_BN_MEAN,
    MESH_NN_ROLE_BN_VAR,
};
struct mesh_nn_tensor {
    char name[48]; /* torchvision's name, e.g. "layer1.0.bn2.weight" */
    int kind;      /* enum mesh_nn_tensor_kind */
    int role;      /* enum mesh_nn_tensor_role */
    size_t offset; /* in floats, into its slab */
    size_t count;  /* floats */
    int ndim;
    int64_t shape[4];
    int frozen; /* a param that mesh_nn_model_freeze() keeps fixed */
};

/* Tensors: params first in slab order, then buffers in slab order. */
int mesh_nn_model_num_tensors(const struct mesh_nn_model *m);
const struct mesh_nn_tensor *mesh_nn_model_tensor(const struct mesh_nn_model *m,
                                                  int i);
const struct mesh_nn_tensor *
mesh_nn_model_find_tensor(const struct mesh_nn_model *m, const char *name);

/* Slabs (device pointers) and their sizes in floats. */
float *mesh_nn_model_params(struct mesh_nn_model *m);
float *mesh_nn_model_grads(struct mesh_nn_model *m);
size_t mesh_nn_model_num_params(const struct mesh_nn_model *m);
float *mesh_nn_model_buffers(struct mesh_nn_model *m);
size_t mesh_nn_model_num_buffers(const struct mesh_nn_model *m);
/* BN training steps counted so far (torchvision's num_batches_tracked). */
int64_t mesh_nn_model_batches_tracked(const struct mesh_nn_model *m);
void mesh_nn_model_set_batches_tracked(struct mesh_nn_model *m, int64_t n);

/* The model's configuration with defaults filled in. */
const struct mesh_nn_model_cfg *
mesh_nn_model_config(const struct mesh_nn_model *m);

/*
 * Forward n images (host, float32 NCHW (n, in_channels, size, size)).
 * train = 1: BN uses batch statistics, updates the running ones and keeps
 * what backward needs; train = 0: BN uses the running statistics. Plans and
 * activations are sized for n at the first call and rebuilt when n changes.
 */
int mesh_nn_model_forward(struct mesh_nn_model *m, int n, const float *images,
                          int train);

/* Copy the last forward's logits (n, num_classes) to the host. */
int mesh_nn_model_logits(struct mesh_nn_model *m, float *host);

/*
 * The ReLUs of the network in forward order (the stem's, then per block
 * each one on the main path and the one after the join), for tests and
 * debugging. mesh_nn_model_num_relus() counts them; mesh_nn_model_relu()
 * writes ReLU k's name to name when it is not NULL ("bn1", "layer2.0.bn1",
 * "layer2.0" for the join), gives
 * its output's shape (n, c, h, w) for the last forward, and, when out is
 * not NULL, copies that output (after the ReLU) to out as float32 NCHW.
 * Where out > 0 is the mask the backward applies. Valid after a forward
 * and before the next backward.
 */
int mesh_nn_model_num_relus(const struct mesh_nn_model *m);
int mesh_nn_model_relu(struct mesh_nn_model *m, int k, char name[32],
                       int shape[4], float *out);

/*
 * Softmax cross-entropy of the last forward against labels (host, n int32
 * in [0, num_classes)), label smoothing in [0, 1). Writes the mean loss and
 * keeps d(loss)/d(logits) for backward.
 */
int mesh_nn_model_loss(struct mesh_nn_model *m, const int32_t *labels,
                       float smoothing, float *loss);

/*
 * mesh_nn_model_loss without waiting for the value: the loss is queued
 * and mesh_nn_model_loss_read gives the queued losses back in order. On a
 * device backend ("cuda") its copy to the host runs behind the
 * computation, so the host never waits for the device here, and a read
 * some steps later finds the copy done. dlogits are kept for backward as
 * by mesh_nn_model_loss. A bad label is reported by start or by the read.
 */
int mesh_nn_model_loss_start(struct mesh_nn_model *m, const int32_t *labels,
                             float smoothing);
/* The oldest queued loss (waits for its copy); -ENOENT when none is. */
int mesh_nn_model_loss_read(struct mesh_nn_model *m, float *loss);
/* Losses queued and not yet read. */
int mesh_nn_model_loss_pending(const struct mesh_nn_model *m);

/*
 * Called during backward each time a range of the gradient slab is final:
 * [offset, offset + count) in floats. Ranges come in strictly decreasing,
 * contiguous order (from the end of the slab down to 0), one per layer (a
 * conv weight; a BN's weight and bias; fc's weight and bias), so after a
 * call everything from offset to the end of the slab is final. The device work
 * that produced the range has been issued, and for the "cpu" backend has
 * completed; a device backend calls mesh_nn_sync() first or orders a copy
 * on its stream. Return 0 to continue, < 0 to stop backward with that code.
 */
typedef int (*mesh_nn_grad_ready_fn)(void *arg, size_t offset, size_t count);

/*
 * Backward of the last training forward and loss. accumulate = 0 overwrites
 * the gradient slab; 1 adds to it (micro-batches). cb may be NULL.
 */
int mesh_nn_model_backward(struct mesh_nn_model *m, int accumulate,
                           mesh_nn_grad_ready_fn cb, void *arg);

/* Per-op timing of forward/backward (for benchmarks); off by default. */
void mesh_nn_model_profile(struct mesh_nn_model *m, int on);
/* Print seconds per op type accumulated since profiling was turned on. */
void mesh_nn_model_profile_report(const struct mesh_nn_model *m, FILE *f);

/*
 * Weights in safetensors with torchvision's names and dtypes (F32, and I64
 * num_batches_tracked). Load accepts F32, F16 and BF16 tensors, checks
 * every shape and needs every tensor of the model; errors name the tensor.
 */
int mesh_nn_model_save(struct mesh_nn_model *m, const char *path);
int mesh_nn_model_load(struct mesh_nn_model *m, const char *path);

/* ---- fine-tuning: start from weights, freeze parameters ------------------ */

/*
 * Tensor patterns (--init-skip, --freeze): comma-separated items, each a
 * tensor ("fc.weight"), a module, which matches every tensor under it
 * ("layer1", "layer2.0.bn1", "fc"), or a glob of either with * ? [...]
 * (fnmatch: "layer*.0.downsample"). 1 when name matches an item of
 * patterns (NULL matches nothing), else 0.
 */
int mesh_nn_pattern_match(const char *patterns, const char *name);
/* -EINVAL, naming flag and the item, when patterns is empty or one of its
 * items matches no tensor of m (a BN's num_batches_tracked included). */
int mesh_nn_pattern_check(const struct mesh_nn_model *m, const char *flag,
                          const char *patterns);

/*
 * Start m from torchvision-named safetensors held in memory (buf, len
 * bytes; what names it in messages, e.g. the path). By name, as torch's
 * load_state_dict(strict=True), except that:
 *   - tensors that skip (patterns, NULL: none) matches keep the model's
 *     fresh initialisation, and the file's such tensors are ignored;
 *   - fc.weight and fc.bias of another class count (dim 0) keep theirs:
 *     the final layer is re-initialised;
 *   - num_batches_tracked (any integer dtype, shape []) may be missing (0).
 * Float tensors may be F32, F16, BF16 (or F64); they become float32.
 * Every other tensor missing, unexpected, or of another shape or dtype
 * makes the call fail (-EINVAL) with m unchanged, the counts in the
 * message. *notes gets a malloc'ed text, one line per tensor (the caller
 * frees it; NULL when empty): on success what was skipped or
 * re-initialised ("re-initialised fc.weight: 1000 classes in the file, 10
 * in the model"), on a misfit every tensor that does not fit ("missing
 * layer1.0.conv1.weight", "unexpected x", "fc.bias: shape [5] in the
 * file, [10] expected").
 */
int mesh_nn_model_init_from(struct mesh_nn_model *m, const void *buf,
                            size_t len, const char *what, const char *skip,
                            char **notes);

/*
 * Freeze the params that patterns match (NULL: none; replaces an earlier
 * call; call it before mesh_nn_sgd_create, which then leaves them alone).
 * A frozen param gets no gradient: backward skips its weight gradient and
 * stops where every param left is frozen. A BN whose weight and bias are
 * frozen normalises with its running statistics also in training (and
 * does not update them), as torch's eval-mode BN does, and backward runs
 * through it as through that affine map. A backend without that backward
 * (cuda) needs every param before such a BN frozen too, else -EINVAL
 * naming both (freeze from conv1 on: "conv1,bn1,layer1").
 * The frozen tensors have .frozen set. -EINVAL leaves nothing frozen.
 */
int mesh_nn_model_freeze(struct mesh_nn_model *m, const char *patterns);
/* Floats of the frozen params. */
size_t mesh_nn_model_frozen_params(const struct mesh_nn_model *m);

/* ---- optimizer --------------------------------------------------------- */

struct mesh_nn_sgd_cfg {
    float momentum;      /* 0: plain SGD */
    float dampening;     /* PyTorch's, default 0 */
    float weight_decay;  /* L2, added to the gradient as PyTorch does */
    int nesterov;        /* needs momentum > 0 and dampening 0 */
    int wd_skip_bn_bias; /* no weight decay on BN weights/biases, fc.bias */
};

/* An optimizer over the model's parameter slab; owns the momentum slab. */
int mesh_nn_sgd_create(struct mesh_nn_model *m,
                       const struct mesh_nn_sgd_cfg *cfg,
                       struct mesh_nn_sgd **out);
void mesh_nn_sgd_destroy(struct mesh_nn_sgd *s);
/* params -= lr * update(grads) with PyTorch's torch.optim.SGD formulas. */
int mesh_nn_sgd_step(struct mesh_nn_sgd *s, float lr);
/*
 * mesh_nn_sgd_step that also writes what it overwrites, the parameters and
 * the momentum before the step, to keep_params and keep_mom (host arrays
 * of num_params floats; keep_mom not written without momentum): a snapshot of
 * the state before the step in the update's own pass over it (--elastic).
 * The entries of frozen tensors are not written. -ENOTSUP where the slabs
 * are not host memory (the cuda backend).
 */
int mesh_nn_sgd_step_keep(struct mesh_nn_sgd *s, float lr, float *keep_params,
                          float *keep_mom);
/* Momentum slab (device, num_params floats), for checkpoints; all zeros
 * without momentum. */
float *mesh_nn_sgd_momentum(struct mesh_nn_sgd *s);
/* Steps taken (0: the momentum buffer is not initialised yet). */
int64_t mesh_nn_sgd_steps(const struct mesh_nn_sgd *s);
void mesh_nn_sgd_set_steps(struct mesh_nn_sgd *s, int64_t steps);

/* ---- learning-rate schedules --------------------------------------------- */

enum mesh_nn_lr_kind {
    MESH_NN_LR_CONST = 0,
    MESH_NN_LR_STEP,   /* lr * gamma^(number of milestones passed) */
    MESH_NN_LR_COSINE, /* lr * (1 + cos(pi * t / T)) / 2 after warmup */
};

struct mesh_nn_lr_sched {
    int kind;             /* enum mesh_nn_lr_kind */
    double base_lr;       /* after warmup (Goyal: 0.1 * batch / 256) */
    double warmup_epochs; /* linear ramp from warmup_start * base_lr */
    double warmup_start;  /* fraction of base_lr at epoch 0 */
    double gamma;         /* STEP: factor per milestone (0.1) */
    double milestones[8]; /* STEP: epochs, ascending */
    int num_milestones;
    double total_epochs; /* COSINE: T (warmup included) */
};

/* Parse "const", "step", "cosine"; -EINVAL naming the string otherwise. */
int mesh_nn_lr_parse(const char *s, int *kind);
/* The learning rate at a fractional epoch (step / steps_per_epoch). */
double mesh_nn_lr_at(const struct mesh_nn_lr_sched *s, double epoch);

/* ---- device options, asynchronous copies (device backends) --------------- */

enum mesh_nn_precision {
    MESH_NN_PREC_DEFAULT = 0, /* the backend's default (cuda: tf32) */
    MESH_NN_PREC_FP32,        /* IEEE float32 math everywhere */
    MESH_NN_PREC_TF32,        /* float32 storage, TF32 tensor-core math */
    MESH_NN_PREC_BF16_AMP,    /* convolutions and fc in bfloat16 with
                                 float32 accumulation; weights, BN,
                                 gradients and the all-reduce float32 */
};

struct mesh_nn_dev_opts {
    int threads;   /* cpu: compute threads, <= 0 every online core */
    int gpu;       /* cuda: device index among the visible ones (after
                      CUDA_VISIBLE_DEVICES); -1: MESHTRAIN_LOCAL_RANK modulo
                      the device count, or 0 */
    int precision; /* enum mesh_nn_precision; "cpu" accepts fp32/default */
};

/* Defaults: threads 0, gpu -1, precision default. */
void mesh_nn_dev_opts_init(struct mesh_nn_dev_opts *o);
/* Parse "fp32", "tf32", "bf16-amp"; -EINVAL naming the string otherwise. */
int mesh_nn_precision_parse(const char *s, int *out);
/* mesh_nn_ctx_open with every device option. */
int mesh_nn_ctx_open_opts(const char *backend, const struct mesh_nn_dev_opts *o,
                          struct mesh_nn_ctx **out);

/* Device memory of the ctx's backend (zero-filled), e.g. the 16-bit
 * staging of a bucket for mesh_nn_convert; host memory for "cpu". */
int mesh_nn_alloc(struct mesh_nn_ctx *ctx, size_t bytes, void **out);
void mesh_nn_free(struct mesh_nn_ctx *ctx, void *p);
/* Device blocks allocated on ctx and not yet freed, counted by the backend
 * (every alloc of the model, the optimizer and the caller); -1 when the
 * backend does not count. */
long mesh_nn_live_allocs(struct mesh_nn_ctx *ctx);

/*
 * Pinned host memory for the buffers device copies read and write:
 * cudaHostAlloc'ed (on the device's context) where built with CUDA and a
 * cuda ctx has been opened, else page-aligned mlock'ed memory
 * (mesh_host_alloc): open the ctx first. Free with
 * mesh_nn_host_free(p, len). mesh_nn_host_allocator wraps both for a
 * communicator's options (struct mesh_host_allocator, common/util.h).
 */
int mesh_nn_host_alloc(size_t len, void **out);
void mesh_nn_host_free(void *p, size_t len);
extern const struct mesh_host_allocator mesh_nn_host_allocator;

/*
 * Asynchronous copies between device memory and host memory, for the
 * gradient buckets. Host memory should be pinned (mesh_nn_host_alloc, or a
 * communicator's buffers made with mesh_nn_host_allocator), else the copy
 * is staged by the driver and the call may block.
 *
 * A D2H copy is ordered after every op issued on the device so far (an
 * event recorded on the compute stream, waited on by a copy stream), so it
 * may be started from the gradient-ready callback without a sync. An H2D
 * copy runs on a copy stream of its own (cuda: D2H and H2D each have one,
 * so a copy back does not queue behind copies out; they run in order
 * within a direction) and is NOT ordered after the device ops issued so
 * far, so that it does not wait for the rest of backward: its destination
 * must not be in use by them (the trainer's copies back land in gradients
 * whose copy out has completed; else mesh_nn_sync() first).
 * mesh_nn_copy_order() makes later device ops (the optimizer step) wait
 * for it without blocking the host.
 * Backends without streams ("cpu") copy synchronously: the copy is done
 * when start returns. Every started copy must be finished with
 * mesh_nn_copy_wait() or mesh_nn_copy_order(), which release it.
 */
struct mesh_nn_copy;
int mesh_nn_copy_d2h_start(struct mesh_nn_ctx *ctx, void *host_dst,
                           const void *dev_src, size_t bytes,
                           struct mesh_nn_copy **out);
int mesh_nn_copy_h2d_start(struct mesh_nn_ctx *ctx, void *dev_dst,
                           const void *host_src, size_t bytes,
                           struct mesh_nn_copy **out);
/* *done = 1 when the copy has completed (the host may read host_dst). */
int mesh_nn_copy_test(struct mesh_nn_ctx *ctx, struct mesh_nn_copy *c,
                      int *done);
/* Block until the copy completed; releases c (also on error). */
int mesh_nn_copy_wait(struct mesh_nn_ctx *ctx, struct mesh_nn_copy *c);
/* Device ops issued after this call wait for c; releases c. */
int mesh_nn_copy_order(struct mesh_nn_ctx *ctx, struct mesh_nn_copy *c);

/*
 * dst = scale * src, n elements in device memory, converted between
 * float32 and float16 / bfloat16 (MESH_DT_F32, MESH_DT_F16, MESH_DT_BF16)
 * (round to nearest even), on the compute stream (for --compress and gradient
 * scaling on the device). One side must be float32; dst may equal src only when
 * both are float32. -ENOTSUP when the backend has no device conversion ("cpu":
 * use the collective's mesh_convert on the host slab).
 */
int mesh_nn_convert(struct mesh_nn_ctx *ctx, int dst_dtype, void *dst,
                    int src_dtype, const void *src, size_t n, float scale);

#endif
