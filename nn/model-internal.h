/*
 * nn/model-internal.h: the layout of a ResNet model, shared by nn/resnet.c,
 * nn/weights.c and nn/optim.c (not part of the public interface).
 */
#ifndef MESH_NN_MODEL_INTERNAL_H
#define MESH_NN_MODEL_INTERNAL_H

#include "nn/backend.h"
#include "nn/nn.h"

/* A convolution without bias; its weight (cout, cin, k, k) in params. */
struct nn_conv {
    int cin, cout, k, stride, pad;
    size_t w;               /* offset of the weight in params */
    int h, wd, oh, ow;      /* input and output sides for this batch */
    struct mesh_nn_plan *p; /* owned by the ctx's cache */
    int frozen;             /* no weight gradient (mesh_nn_model_freeze) */
    void *reserve;          /* what the backend keeps from forward to backward
                               (conv_fwd_keep), device, or NULL */
};

/* A batch norm over c channels: gamma at g, beta at g + c (params);
 * running mean at rm, running var at rm + c (buffers). */
struct nn_bn {
    int c, relu;
    size_t g, rm;
    int h, wd;
    struct mesh_nn_plan *p;
    float *save;   /* (2 c) saved statistics, device */
    void *reserve; /* the fused ReLU's mask, device, or NULL */
    int frozen;    /* weight and bias frozen: the running statistics
                      normalise also in training (mesh_nn_model_freeze) */
};

/* One residual block: basic (two 3x3) or bottleneck (1x1, 3x3, 1x1). */
struct nn_block {
    int bottleneck, has_ds;
    int nconv; /* 2 or 3 */
    struct nn_conv c[3], cd;
    struct nn_bn b[3], bd;
    struct mesh_nn_plan *join; /* out = relu(main + shortcut) */
    struct mesh_nn_plan *relu; /* its backward */
    struct mesh_nn_plan *gadd; /* d(x) = d(main) + d(shortcut) */
    /* activations (device): x is the previous output, not owned */
    void *x;
    void *a[3], *o[3]; /* conv outputs, bn outputs (o[last] = out) */
    void *ad, *od;     /* downsample conv and bn outputs */
    char name[16];     /* "layer2.0" */
};

enum nn_prof {
    NN_PROF_CONV_FWD = 0,
    NN_PROF_CONV_BWD_DATA,
    NN_PROF_CONV_BWD_FILTER,
    NN_PROF_BN_FWD,
    NN_PROF_BN_BWD,
    NN_PROF_ELTWISE, /* add, relu */
    NN_PROF_POOL,
    NN_PROF_FC,
    NN_PROF_LOSS,
    NN_PROF_OTHER, /* input import, gradient accumulation */
    NN_PROF_COUNT,
};

struct mesh_nn_model {
    struct mesh_nn_ctx *ctx;
    struct mesh_nn_model_cfg cfg;
    char arch[16];

    /* tensors: params then buffers */
    struct mesh_nn_tensor *t;
    int nt;
    size_t nt_alloc;
    size_t nparams, nbuffers;
    float *params, *grads, *buffers; /* device slabs */
    int64_t batches_tracked;

    /* layers */
    struct nn_conv conv1;
    struct nn_bn bn1;
    struct mesh_nn_plan *maxpool, *avgpool, *fc;
    struct nn_block *blocks;
    int nblocks;
    int feat;    /* channels into fc */
    size_t fc_w; /* fc weight offset; bias follows */
    int fc_frozen;
    /* mesh_nn_model_freeze: params [0, frozen_below) are all frozen, so
     * backward stops where it reaches them */
    size_t frozen_below;

    /* per batch size */
    int n;
    int train;     /* last forward was training */
    int have_loss; /* dlogits are valid */
    /* losses of mesh_nn_model_loss_start not yet read; where the backend
     * has no xent_start, their values, a ring of lq_cap */
    int lq_pending, lq_head, lq_cap;
    float *lq;
    void *in, *a0, *o0, *p0; /* input, stem conv, stem bn, max pool out */
    void *pool_res;          /* max pool reserve */
    void *pooled;            /* (n, feat) */
    float *logits, *dlogits; /* (n, classes) device */
    int32_t *labels;         /* (n) device */
    void *g[3];              /* backward scratch, each max_act bytes */
    void *ws;                /* workspace, max over plans */
    size_t ws_bytes, max_act;
    float *gscratch; /* accumulate: max tensor size */
    size_t max_tensor;

    int profile;
    double prof[NN_PROF_COUNT];
};

#endif
