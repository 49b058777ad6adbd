/*
 * tests/test_nn_torch.c: parity with PyTorch, every architecture, many
 * configurations. For each case below our model is created (ImageNet or
 * CIFAR stem, a width, a seed), its BN weights, biases and running
 * statistics are randomised (not torchvision's fresh init), and it runs one
 * training step on a random batch. tests/nn_torch_ref.py (one call for all
 * cases) loads the same weights into torchvision's model with strict=True
 * and computes the same step in float64, the exact answer for the float32
 * inputs, and in float32, PyTorch's own rounding. Error per tensor:
 * max|ours - ref| / max|ref|.
 *
 * Checked per case:
 * - the weights round trip through torchvision's state_dict bitwise;
 * - logits, loss and the BN running statistics within 1e-4 of float64;
 * - every gradient within 1e-4 of the float64 gradient of the network with
 *   our ReLU masks (the exact derivative of the piece our forward chose):
 *   the arithmetic of the backward pass;
 * - in the ill-conditioned cases (rel32 in the table: resnet101, resnet152,
 *   resnet50 at batch 2), where float32 itself misses 1e-4, the three checks
 *   above are instead: each quantity within max(1e-4, K32 x PyTorch
 *   float32's error on that same quantity), against plain float64 for
 *   logits, loss and each BN buffer, and for each gradient against
 *   PyTorch float32's error on its own piece (grad32 against grad32m, the
 *   float64 gradient of the network with PyTorch float32's ReLU masks and
 *   max-pool argmax);
 * - every gradient within the criterion, max(1e-4, 4 x PyTorch
 *   float32's error), of the plain float64 gradient. This is required
 *   unless one of our ReLU masks differs from float64's, and then every
 *   such pre-activation must lie within PyTorch float32's own rounding at
 *   that ReLU (at most twice its worst error there). A pre-activation of
 *   1e-6 of its scale goes to either side of zero depending on the order
 *   of a sum; in a small late layer one such element moves every earlier
 *   gradient by up to 1e-2, and PyTorch's float32 flips too, elsewhere.
 *   The counts of flips (ours and PyTorch float32's) are printed;
 * - the evaluation-mode logits (BN on the running statistics) within 1e-4
 *   (rel32: K32 x PyTorch float32's) of float64;
 * - two SGD steps (momentum 0.9 and weight decay 1e-4 unless the case says
 *   plain, Nesterov or 5e-4) on the float64 gradients within 1e-4, and our
 *   file's save/load round trip.
 *
 * MESHTRAIN_TORCH_SWEEP=N adds N pseudo-random cases over wider ranges than
 * the table (see sweep(); MESHTRAIN_TORCH_SEED picks another set of them,
 * MESHTRAIN_TORCH_NOTABLE=1 leaves the table out), MESHTRAIN_TORCH_CASES
 * cases by hand (see parse_cases()): for measuring by hand; make check runs
 * the table. Skips (with the reason) when /usr/bin/python3 cannot import
 * torch and torchvision.
 */
#include "config.h"

#include "nn/nn.h"
#include "nn/safetensors.h"
#include "common/util.h"
#include "tests/nn_ref.h"
#include "tests/tap.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOL       1e-4
#define FLIP_BAND 2.0 /* a flip's |pre-activation| / PyTorch fp32's error */
/*
 * How far our error may exceed PyTorch float32's on the same quantity in
 * the rel32 cases. Measured over 28 such cases (the table's five, nine
 * more of resnet50/101/152 at widths 8 and 16, and those of
 * MESHTRAIN_TORCH_SWEEP=6, 9 and 10; 8792 gradient tensors): where our
 * gradient error on our masks exceeds 1e-4 (6273 tensors), ours over
 * PyTorch's on its own masks has median 1.0, 99th percentile 1.66 and
 * maximum 2.93, which is 0.73 of this limit (3 would leave 0.98); logits
 * reach 1.5 x PyTorch's error, BN buffers 1.7 x. The same arithmetic
 * summed in another order lands within a small factor of PyTorch's; a bug
 * does not: scaling the sum(dy x^) term of BN backward's dx by 1 + 1e-3
 * fails four of the five rel32 rows (at 2.1 to 6.6 x their limit), by
 * 1 + 1e-2 all five; scaling the weight gradient of layer1.0.conv1 or of
 * layer4.0.conv2 alone by 1.001 fails three of the five, by 1.01 all five.
 * A smaller bug is within float32's own rounding for that network: the
 * limit is 4 x what PyTorch float32 itself gets wrong there (up to 8.5e-3
 * in the first layers of resnet152).
 */
#define K32 4.0

struct tcase {
    const char *arch;
    int width, cifar, size, batch, classes;
    uint64_t seed;
    int rel32; /* judged against PyTorch float32's own error (K32) */
    /* 0 for the defaults: 3 input channels, label smoothing 0.1, the cpu
     * backend on 2 threads, SGD momentum 0.9 and weight decay 1e-4 */
    int in_ch;
    float smooth; /* < 0: none (0 means the default 0.1) */
    int threads;
    const char *backend;
    int sgd; /* 0 default, 1 plain SGD, 2 Nesterov 0.9, 3 wd 5e-4 */
};

static int in_ch(const struct tcase *c)
{
    return c->in_ch ? c->in_ch : 3;
}

static float smoothing(const struct tcase *c)
{
    return c->smooth < 0 ? 0.0f : c->smooth > 0 ? c->smooth : 0.1f;
}

static struct mesh_nn_sgd_cfg sgd_cfg(const struct tcase *c)
{
    struct mesh_nn_sgd_cfg s = {.momentum = 0.9f, .weight_decay = 1e-4f};

    if (c->sgd == 1)
        s.momentum = 0, s.weight_decay = 0;
    else if (c->sgd == 2)
        s.nesterov = 1;
    else if (c->sgd == 3)
        s.weight_decay = 5e-4f;
    return s;
}

/* worst errors per architecture and rule, ours and PyTorch float32's */
struct worst {
    int n;           /* cases */
    double g, g32;   /* gradients vs plain float64 */
    double gm, g32m; /* gradients vs float64 on each one's own masks */
    double f, f32;   /* logits, loss, BN running statistics */
};

/*
 * BasicBlock and Bottleneck networks at full width (torchvision's own
 * model) and at small widths, both stems, batches 2 to 16, 32 to 128 px,
 * 10 to 1000 classes, within 1e-4 (rel32 0). Then (rel32 1) resnet101 and
 * resnet152 at width 8, CIFAR and ImageNet stems, batch 4, and resnet50 at
 * batch 2: there float32 itself is ill-conditioned. Our logits and BN
 * statistics miss float64 by up to 7.9e-4 (PyTorch float32: 5.7e-4), our
 * gradients on our masks by up to 4.9e-3 (PyTorch float32 on its own
 * masks: 3.7e-3; against plain float64 both miss by up to 0.3, the ReLU
 * flips), so they are judged against PyTorch float32's own error (K32).
 * The sweep judges every Bottleneck network so: resnet50 at batch 4 to 16
 * and 80 to 96 px reaches 1.03e-4 on its own masks (PyTorch float32:
 * 1.25e-4), while the two resnet50 rows above, at 8.2e-5 and 2.8e-5, keep
 * within 1e-4.
 */
static const struct tcase table[] = {
    {"resnet18", 64, 0, 64, 2, 10, 1, 0, 0, 0, 0, NULL, 0},
    {"resnet18", 16, 0, 128, 4, 100, 2, 0, 0, 0, 0, NULL, 0},
    {"resnet18", 8, 1, 32, 16, 10, 3, 0, 0, 0, 0, NULL, 0},
    {"resnet18", 16, 1, 14, 8, 10, 11, 0, 0, 0, 0, NULL,
     0}, /* 2x2 last stage: plain bwd weights */
    {"resnet34", 16, 0, 128, 8, 100, 5, 0, 0, 0, 0, NULL, 0},
    {"resnet34", 8, 1, 32, 8, 1000, 6, 0, 0, 0, 0, NULL, 0},
    {"resnet34", 8, 0, 96, 4, 10, 4, 0, 0, 0, 0, NULL, 0},
    {"resnet50", 16, 0, 112, 8, 100, 8, 0, 0, 0, 0, NULL, 0},
    {"resnet50", 8, 1, 32, 16, 10, 9, 0, 0, 0, 0, NULL, 0},
    {"resnet101", 8, 1, 32, 4, 10, 10, 1, 0, 0, 0, NULL, 0},
    {"resnet101", 8, 0, 64, 4, 100, 12, 1, 0, 0, 0, NULL, 0},
    {"resnet152", 8, 1, 32, 4, 10, 13, 1, 0, 0, 0, NULL, 0},
    {"resnet152", 8, 0, 64, 4, 100, 14, 1, 0, 0, 0, NULL, 0},
    {"resnet50", 8, 0, 64, 2, 10, 15, 1, 0, 0, 0, NULL, 0},
    /*
     * What the sweep found uncovered, cheap: batch 1 (BN over 4 values in
     * the 2x2 last stage) on odd sides where the stride-2 convs and the
     * max pool round, widths and input channels that are not multiples of
     * 8, no and more label smoothing, 1 and 3 threads, the devsim backend,
     * Nesterov, plain SGD and a larger weight decay.
     */
    {"resnet18", 6, 0, 35, 1, 7, 21, 1, 1, -1, 1, "devsim", 2},
    {"resnet34", 5, 1, 13, 3, 2, 22, 1, 2, 0.3f, 3, NULL, 1},
    {"resnet50", 6, 0, 47, 5, 37, 23, 1, 4, 0, 1, "devsim", 3},
};

static struct mesh_nn_ctx *ctx;
static const char *ctx_backend;
static int ctx_threads;
static uint64_t rng;

/* The ctx of case c's backend and threads, reopened when they change. */
static int use_ctx(const struct tcase *c)
{
    const char *b = c->backend ? c->backend : "cpu";
    int th = c->threads ? c->threads : 2, rc;

    if (ctx && strcmp(b, ctx_backend) == 0 && th == ctx_threads)
        return 0;
    mesh_nn_ctx_close(ctx);
    ctx = NULL;
    rc = mesh_nn_ctx_open(b, th, &ctx);
    if (rc < 0) {
        diag("%s", mesh_err_msg(rc));
        return rc;
    }
    ctx_backend = b, ctx_threads = th;
    return 0;
}

static double unif(void) /* [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static double gauss(void)
{
    double u = unif(), v = unif();

    return sqrt(-2 * log(1 - u)) * cos(2 * M_PI * v);
}

static void case_name(const struct tcase *c, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s w%d %s %dpx b%d %dcls s%llu", c->arch,
                     c->width, c->cifar ? "cifar" : "imagenet", c->size,
                     c->batch, c->classes, (unsigned long long)c->seed);

    if (n > 0 && (size_t)n < len &&
        (c->in_ch || c->smooth || c->threads || c->backend || c->sgd))
        snprintf(buf + n, len - (size_t)n, " in%d ls%g t%d %s sgd%d", in_ch(c),
                 (double)smoothing(c), c->threads ? c->threads : 2,
                 c->backend ? c->backend : "cpu", c->sgd);
}

static int create(const struct tcase *c, struct mesh_nn_model **m)
{
    struct mesh_nn_model_cfg cfg = {.arch = c->arch,
                                    .num_classes = c->classes,
                                    .in_channels = in_ch(c),
                                    .image_size = c->size,
                                    .cifar_stem = c->cifar,
                                    .width = c->width,
                                    .seed = c->seed};

    return mesh_nn_model_create(ctx, &cfg, m);
}

/* Download a slab, or NULL. */
static float *slab(float *dev, size_t n)
{
    float *h = malloc(n * sizeof(float) + 1);

    if (h && mesh_nn_download(ctx, h, dev, n * sizeof(float)) < 0) {
        free(h);
        h = NULL;
    }
    return h;
}

/* Randomise the BN weights, biases and running statistics (as a trained
 * model has them: not 1, 0, 0, 1). */
static int randomise_bn(struct mesh_nn_model *m)
{
    size_t np = mesh_nn_model_num_params(m), nb = mesh_nn_model_num_buffers(m);
    float *p = slab(mesh_nn_model_params(m), np);
    float *b = slab(mesh_nn_model_buffers(m), nb);
    int i, rc = -ENOMEM;

    if (!p || !b)
        goto out;
    for (i = 0; i < mesh_nn_model_num_tensors(m); i++) {
        const struct mesh_nn_tensor *t = mesh_nn_model_tensor(m, i);
        float *v = t->kind == MESH_NN_PARAM ? p + t->offset : b + t->offset;
        size_t k;

        for (k = 0; k < t->count; k++)
            switch (t->role) {
            case MESH_NN_ROLE_BN_WEIGHT:
                v[k] = (float)(0.5 + unif());
                break;
            case MESH_NN_ROLE_BN_BIAS:
                v[k] = (float)(0.4 * unif() - 0.2);
                break;
            case MESH_NN_ROLE_BN_MEAN:
                v[k] = (float)(0.2 * unif() - 0.1);
                break;
            case MESH_NN_ROLE_BN_VAR:
                v[k] = (float)(0.8 + 0.4 * unif());
                break;
            default:
                break;
            }
    }
    rc = mesh_nn_upload(ctx, mesh_nn_model_params(m), p, np * sizeof(float));
    if (rc == 0)
        rc = mesh_nn_upload(ctx, mesh_nn_model_buffers(m), b,
                            nb * sizeof(float));
    mesh_nn_model_set_batches_tracked(m, 3);
out:
    free(p), free(b);
    return rc;
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    int rc = f && fputs(text, f) >= 0 ? 0 : -errno;

    if (f && fclose(f) != 0 && rc == 0)
        rc = -errno;
    return rc < 0 ? mesh_err(rc, "%s: %s", path, strerror(-rc)) : 0;
}

/*
 * Phase 1: model, weights, input, one training step; our ReLU outputs and
 * results to files in dir for nn_torch_ref.py and for phase 3.
 */
static int prepare(const struct tcase *c, const char *dir)
{
    struct mesh_nn_model *m = NULL;
    size_t npix = (size_t)c->batch * in_ch(c) * c->size * c->size, i;
    float *images = malloc(npix * sizeof(float)), *acts = NULL, *ze = NULL;
    int32_t *labels = malloc(c->batch * sizeof(int32_t));
    struct mesh_st_entry *e = NULL;
    char path[512], text[160], (*names)[16] = NULL;
    int nr = 0, k, rc;

    rng = c->seed * 0x9E3779B97F4A7C15ULL + 1;
    for (i = 0; i < npix; i++)
        images[i] = (float)gauss();
    for (k = 0; k < c->batch; k++)
        labels[k] = (int32_t)(unif() * c->classes);
    snprintf(text, sizeof(text),
             "arch=%s width=%d cifar=%d size=%d batch=%d classes=%d "
             "own32=%d inch=%d smooth=%.9g momentum=%.9g wd=%.9g "
             "nesterov=%d\n",
             c->arch, c->width, c->cifar, c->size, c->batch, c->classes,
             c->rel32, in_ch(c), (double)smoothing(c),
             (double)sgd_cfg(c).momentum, (double)sgd_cfg(c).weight_decay,
             sgd_cfg(c).nesterov);
    snprintf(path, sizeof(path), "%s/cfg", dir);
    rc = write_text(path, text);
    if (rc == 0)
        rc = create(c, &m);
    if (rc == 0)
        rc = randomise_bn(m);
    snprintf(path, sizeof(path), "%s/weights.safetensors", dir);
    if (rc == 0)
        rc = mesh_nn_model_save(m, path);
    if (rc == 0) {
        struct mesh_st_entry in[2] = {
            {"images",
             MESH_DT_F32,
             4,
             {c->batch, in_ch(c), c->size, c->size},
             images},
            {"labels", MESH_ST_I32, 1, {c->batch}, labels},
        };

        snprintf(path, sizeof(path), "%s/input.safetensors", dir);
        rc = mesh_st_write(path, in, 2, NULL);
    }
    /* an evaluation forward first, on the randomised running statistics */
    ze = malloc((size_t)c->batch * c->classes * sizeof(float));
    if (rc == 0)
        rc = ze ? mesh_nn_model_forward(m, c->batch, images, 0) : -ENOMEM;
    if (rc == 0)
        rc = mesh_nn_model_logits(m, ze);
    if (rc == 0)
        rc = mesh_nn_model_forward(m, c->batch, images, 1);
    if (rc < 0)
        goto out;

    /* every ReLU's output, before the backward */
    nr = mesh_nn_model_num_relus(m);
    e = calloc(nr, sizeof(*e));
    names = calloc(nr, sizeof(*names));
    {
        size_t total = 0, off = 0;
        int shape[4];

        for (k = 0; k < nr; k++) {
            mesh_nn_model_relu(m, k, NULL, shape, NULL);
            total += (size_t)shape[0] * shape[1] * shape[2] * shape[3];
        }
        acts = malloc(total * sizeof(float));
        for (k = 0; rc == 0 && k < nr; k++) {
            rc = mesh_nn_model_relu(m, k, NULL, shape, acts + off);
            snprintf(names[k], sizeof(names[k]), "relu.%03d", k);
            e[k].name = names[k];
            e[k].dtype = MESH_DT_F32;
            e[k].ndim = 4;
            e[k].shape[0] = shape[0], e[k].shape[1] = shape[1];
            e[k].shape[2] = shape[2], e[k].shape[3] = shape[3];
            e[k].data = acts + off;
            off += (size_t)shape[0] * shape[1] * shape[2] * shape[3];
        }
    }
    snprintf(path, sizeof(path), "%s/relu.safetensors", dir);
    if (rc == 0)
        rc = mesh_st_write(path, e, nr, NULL);
    {
        float loss;
        size_t np = mesh_nn_model_num_params(m);
        size_t nb = mesh_nn_model_num_buffers(m);
        size_t nz = (size_t)c->batch * c->classes;
        float *g = NULL, *b = NULL, *z = malloc(nz * sizeof(float));

        if (rc == 0)
            rc = mesh_nn_model_loss(m, labels, smoothing(c), &loss);
        if (rc == 0)
            rc = mesh_nn_model_backward(m, 0, NULL, NULL);
        if (rc == 0)
            rc = mesh_nn_model_logits(m, z);
        if (rc == 0 && (!(g = slab(mesh_nn_model_grads(m), np)) ||
                        !(b = slab(mesh_nn_model_buffers(m), nb))))
            rc = -ENOMEM;
        if (rc == 0) {
            struct mesh_st_entry out[5] = {
                {"grads", MESH_DT_F32, 1, {(int64_t)np}, g},
                {"buffers", MESH_DT_F32, 1, {(int64_t)nb}, b},
                {"logits", MESH_DT_F32, 2, {c->batch, c->classes}, z},
                {"loss", MESH_DT_F32, 1, {1}, &loss},
                {"logits_eval", MESH_DT_F32, 2, {c->batch, c->classes}, ze},
            };

            snprintf(path, sizeof(path), "%s/ours.safetensors", dir);
            rc = mesh_st_write(path, out, 5, NULL);
        }
        free(g), free(b), free(z);
    }
out:
    if (rc < 0)
        diag("%s", mesh_err_msg(rc));
    mesh_nn_model_destroy(m);
    free(images), free(labels), free(acts), free(e), free(names), free(ze);
    return rc;
}

/* Read "name" of f as floats into a new array of count, or NULL. */
static float *readf(const struct mesh_st_file *f, const char *name,
                    const int64_t *shape, int ndim, size_t count)
{
    float *v = malloc(count * sizeof(float) + 1);
    int rc = mesh_st_read(f, name, MESH_DT_F32, shape, ndim, v);

    if (rc < 0) {
        diag("%s", mesh_err_msg(rc));
        free(v);
        return NULL;
    }
    return v;
}

/*
 * The limit on one of our errors, given PyTorch float32's error on the same
 * quantity: 1e-4, or for an ill-conditioned case K32 times PyTorch's.
 */
/* ref's float64 gradients ("grad.<param>") into m's gradients. */
static int upload_grads(struct mesh_nn_model *m, const struct mesh_st_file *ref)
{
    int nt = mesh_nn_model_num_tensors(m), rc = 0;
    char name[96];

    for (int i = 0; i < nt && rc == 0; i++) {
        const struct mesh_nn_tensor *t = mesh_nn_model_tensor(m, i);
        float *r;

        if (t->kind != MESH_NN_PARAM)
            continue;
        snprintf(name, sizeof(name), "grad.%s", t->name);
        r = readf(ref, name, t->shape, t->ndim, t->count);
        rc = r ? mesh_nn_upload(ctx, mesh_nn_model_grads(m) + t->offset, r,
                                t->count * sizeof(float))
               : -EINVAL;
        free(r);
    }
    return rc;
}

/*
 * The worst relative error of m's parameters (np floats, left in *pout)
 * against ref's "<prefix>.<param>"; INFINITY where one is missing.
 */
static double sgd_err(struct mesh_nn_model *m, const struct mesh_st_file *ref,
                      const char *prefix, size_t np, float **pout)
{
    float *p = slab(mesh_nn_model_params(m), np);
    int nt = mesh_nn_model_num_tensors(m);
    double ws = 0;
    char name[96];

    for (int i = 0; p && i < nt; i++) {
        const struct mesh_nn_tensor *t = mesh_nn_model_tensor(m, i);
        float *r;

        if (t->kind != MESH_NN_PARAM)
            continue;
        snprintf(name, sizeof(name), "%s.%s", prefix, t->name);
        r = readf(ref, name, t->shape, t->ndim, t->count);
        ws = fmax(ws, r ? ref_relerr_ff(p + t->offset, r, t->count) : INFINITY);
        free(r);
    }
    *pout = p;
    return p ? ws : INFINITY;
}

static double limit(const struct tcase *c, double e32)
{
    return c->rel32 ? fmax(TOL, K32 * e32) : TOL;
}

/* Phase 3: compare. */
static void judge(const struct tcase *c, const char *dir, struct worst *w)
{
    struct mesh_st_file *ref = NULL, *ours = NULL, *tv = NULL;
    struct mesh_nn_model *m = NULL;
    struct mesh_nn_sgd *sgd = NULL;
    struct mesh_nn_sgd_cfg scfg = sgd_cfg(c);
    int64_t one[1] = {1}, zs[2] = {c->batch, c->classes};
    int64_t five[1] = {5};
    float *g = NULL, *bufs = NULL, *p0 = NULL, *p = NULL, flips[5];
    float *z = NULL, *zr = NULL, *z32 = NULL, loss, loss_r, loss32;
    double e, e32, em, wm = 0, wm32 = 0, wmf = 0, wr = 0, wb = 0, wbf = 0;
    double ws = 0, wf = 0, wf32 = 0, ge = 0, ge32 = 0;
    const char *wm_at = "", *wm32_at = "", *wmf_at = "", *wr_at = "";
    char name[96], path[512], tag[96];
    int i, rc, nt, plain_ok = 1;
    size_t np, nb;

    case_name(c, tag, sizeof(tag));
    snprintf(path, sizeof(path), "%s/ref.safetensors", dir);
    rc = mesh_st_open(path, &ref);
    snprintf(path, sizeof(path), "%s/ours.safetensors", dir);
    if (rc == 0)
        rc = mesh_st_open(path, &ours);
    snprintf(path, sizeof(path), "%s/tv.safetensors", dir);
    if (rc == 0)
        rc = mesh_st_open(path, &tv);
    if (rc == 0)
        rc = create(c, &m);
    if (!ok(rc == 0, "%s: reference files", tag)) {
        diag("%s", mesh_err_msg(rc));
        goto out;
    }
    np = mesh_nn_model_num_params(m), nb = mesh_nn_model_num_buffers(m);
    nt = mesh_nn_model_num_tensors(m);

    /* torchvision's state_dict, as it loaded ours, loads back bitwise */
    {
        int64_t sp[1] = {(int64_t)np}, sb[1] = {(int64_t)nb};
        float *b0;

        snprintf(path, sizeof(path), "%s/weights.safetensors", dir);
        rc = mesh_nn_model_load(m, path);
        p0 = rc == 0 ? slab(mesh_nn_model_params(m), np) : NULL;
        b0 = rc == 0 ? slab(mesh_nn_model_buffers(m), nb) : NULL;
        snprintf(path, sizeof(path), "%s/tv.safetensors", dir);
        if (rc == 0)
            rc = mesh_nn_model_load(m, path);
        p = rc == 0 ? slab(mesh_nn_model_params(m), np) : NULL;
        bufs = rc == 0 ? slab(mesh_nn_model_buffers(m), nb) : NULL;
        ok(rc == 0 && p0 && p && b0 && bufs && memcmp(p0, p, np * 4) == 0 &&
               memcmp(b0, bufs, nb * 4) == 0 &&
               mesh_nn_model_batches_tracked(m) == 3,
           "%s: weights round trip through torchvision's state_dict", tag);
        free(b0), free(bufs);
        bufs = NULL;
        g = readf(ours, "grads", sp, 1, np);
        bufs = readf(ours, "buffers", sb, 1, nb);
    }
    z = readf(ours, "logits", zs, 2, (size_t)c->batch * c->classes);
    zr = readf(ref, "logits", zs, 2, (size_t)c->batch * c->classes);
    z32 = readf(ref, "logits32", zs, 2, (size_t)c->batch * c->classes);
    if (!g || !bufs || !z || !zr || !z32 ||
        mesh_st_read(ours, "loss", MESH_DT_F32, one, 1, &loss) < 0 ||
        mesh_st_read(ref, "loss", MESH_DT_F32, one, 1, &loss_r) < 0 ||
        mesh_st_read(ref, "loss32", MESH_DT_F32, one, 1, &loss32) < 0 ||
        mesh_st_read(ref, "flips", MESH_DT_F32, five, 1, flips) < 0) {
        ok(0, "%s: results read", tag);
        goto out;
    }
    e = ref_relerr_ff(z, zr, (size_t)c->batch * c->classes);
    e32 = ref_relerr_ff(z32, zr, (size_t)c->batch * c->classes);
    wf = fmax(wf, e), wf32 = fmax(wf32, e32);
    ok(e <= limit(c, e32), "%s: logits rel err %.3g (PyTorch float32 %.3g)",
       tag, e, e32);
    e = fabs((double)loss - loss_r) / fabs(loss_r);
    e32 = fabs((double)loss32 - loss_r) / fabs(loss_r);
    wf = fmax(wf, e), wf32 = fmax(wf32, e32);
    ok(e <= limit(c, e32),
       "%s: loss %.7f vs %.7f, rel err %.3g (PyTorch "
       "float32 %.3g)",
       tag, (double)loss, (double)loss_r, e, e32);
    {
        float *ze =
            readf(ours, "logits_eval", zs, 2, (size_t)c->batch * c->classes);
        float *zer =
            readf(ref, "logitse", zs, 2, (size_t)c->batch * c->classes);
        float *ze32 =
            readf(ref, "logitse32", zs, 2, (size_t)c->batch * c->classes);

        e = ze && zer ? ref_relerr_ff(ze, zer, (size_t)c->batch * c->classes)
                      : INFINITY;
        e32 = ze32 && zer
                  ? ref_relerr_ff(ze32, zer, (size_t)c->batch * c->classes)
                  : INFINITY;
        ok(e <= limit(c, e32),
           "%s: evaluation logits (running statistics) rel err %.3g "
           "(PyTorch float32 %.3g)",
           tag, e, e32);
        free(ze), free(zer), free(ze32);
    }
    ok(flips[3] <= 1e-9 && flips[4] == 0,
       "%s: the ReLU-by-ReLU forward of the reference is torchvision's "
       "(%.3g in float64, %.3g in float32)",
       tag, (double)flips[3], (double)flips[4]);

    for (i = 0; i < nt; i++) {
        const struct mesh_nn_tensor *t = mesh_nn_model_tensor(m, i);
        float *r, *rm, *r32, *r32m;
        double e32m, lim;

        if (t->kind != MESH_NN_PARAM) {
            snprintf(name, sizeof(name), "new.%s", t->name);
            r = readf(ref, name, t->shape, t->ndim, t->count);
            snprintf(name, sizeof(name), "new32.%s", t->name);
            r32 = readf(ref, name, t->shape, t->ndim, t->count);
            e = r && r32 ? ref_relerr_ff(bufs + t->offset, r, t->count)
                         : INFINITY;
            e32 = r && r32 ? ref_relerr_ff(r32, r, t->count) : INFINITY;
            wf = fmax(wf, e), wf32 = fmax(wf32, e32);
            wb = fmax(wb, e);
            if (e / limit(c, e32) > wbf || e != e)
                wbf = e / limit(c, e32);
            free(r), free(r32);
            continue;
        }
        snprintf(name, sizeof(name), "grad.%s", t->name);
        r = readf(ref, name, t->shape, t->ndim, t->count);
        snprintf(name, sizeof(name), "gradm.%s", t->name);
        rm = readf(ref, name, t->shape, t->ndim, t->count);
        snprintf(name, sizeof(name), "grad32.%s", t->name);
        r32 = readf(ref, name, t->shape, t->ndim, t->count);
        snprintf(name, sizeof(name), "grad32m.%s", t->name);
        r32m = c->rel32 ? readf(ref, name, t->shape, t->ndim, t->count) : NULL;
        if (!r || !rm || !r32 || (c->rel32 && !r32m)) {
            e = em = e32 = e32m = INFINITY;
        } else {
            e = ref_relerr_ff(g + t->offset, r, t->count);
            em = ref_relerr_ff(g + t->offset, rm, t->count);
            e32 = ref_relerr_ff(r32, r, t->count);
            e32m = r32m ? ref_relerr_ff(r32, r32m, t->count) : 0;
        }
        if (em > wm || em != em)
            wm = em, wm_at = t->name;
        if (e32m > wm32 || e32m != e32m)
            wm32 = e32m, wm32_at = t->name;
        if (em / limit(c, e32m) > wmf || em != em)
            wmf = em / limit(c, e32m), wmf_at = t->name;
        ge = fmax(ge, e), ge32 = fmax(ge32, e32);
        lim = fmax(TOL, 4 * e32);
        if (e / lim > wr || e != e)
            wr = e / lim, wr_at = t->name;
        if (!(e <= lim)) {
            plain_ok = 0;
            diag("%s: grad.%s rel err %.3g (pytorch fp32 %.3g), "
                 "on our masks %.3g",
                 tag, t->name, e, e32, em);
        }
        if (!(em <= limit(c, e32m)))
            diag("%s: grad.%s on our masks rel err %.3g, PyTorch float32 "
                 "on its own %.3g",
                 tag, t->name, em, e32m);
        free(r), free(rm), free(r32), free(r32m);
    }
    if (!c->rel32)
        ok(wm <= TOL,
           "%s: every gradient within 1e-4 of float64 on our "
           "ReLU masks (worst %.3g, %s)",
           tag, wm, wm_at);
    else
        ok(wmf <= 1,
           "%s: every gradient within max(1e-4, %g x PyTorch "
           "float32's error on its own masks) of float64 on our "
           "ReLU masks (worst %.3g of the limit, %s)",
           tag, K32, wmf, wmf_at);
    diag("%s: ReLU masks differing from float64: ours %.0f, PyTorch "
         "float32's %.0f",
         tag, (double)flips[0], (double)flips[1]);
    if (flips[0] == 0)
        ok(plain_ok,
           "%s: every gradient within max(1e-4, 4 x PyTorch "
           "float32's error) of float64 (worst %.3g of the limit, "
           "%s)",
           tag, wr, wr_at);
    else
        ok(flips[2] <= FLIP_BAND,
           "%s: %.0f of our ReLU masks differ from float64's, each within "
           "PyTorch float32's rounding there (%.3g x its worst error); "
           "gradients on the plain float64 reach %.3g of the limit (%s)",
           tag, (double)flips[0], (double)flips[2], wr, wr_at);
    ok(wbf <= 1,
       "%s: BN running statistics, worst rel err %.3g (%.3g of "
       "the limit)",
       tag, wb, wbf);
    if (c->rel32)
        diag("%s: worst rel err, ours and PyTorch float32's (ratio): "
             "gradients, each on its own ReLU masks, %.3g (%s) and %.3g "
             "(%s) (%.3g); logits, loss, BN statistics %.3g and %.3g (%.3g)",
             tag, wm, wm_at, wm32, wm32_at, wm / wm32, wf, wf32, wf / wf32);
    else
        diag("%s: worst rel err, ours and PyTorch float32's (ratio): "
             "logits, loss, BN statistics %.3g and %.3g (%.3g)",
             tag, wf, wf32, wf / wf32);
    w->n++;
    w->g = fmax(w->g, ge), w->g32 = fmax(w->g32, ge32);
    w->gm = fmax(w->gm, wm), w->g32m = fmax(w->g32m, wm32);
    w->f = fmax(w->f, wf), w->f32 = fmax(w->f32, wf32);

    /*
     * One SGD step on the float64 gradients, so that it checks the
     * optimizer alone, not the conditioning of the gradients again.
     */
    free(p);
    p = NULL;
    rc = upload_grads(m, ref);
    if (rc == 0)
        rc = mesh_nn_sgd_create(m, &scfg, &sgd);
    if (rc == 0)
        rc = mesh_nn_sgd_step(sgd, 0.1f);
    ws = rc == 0 ? sgd_err(m, ref, "sgd", np, &p) : INFINITY;
    ok(p && ws <= TOL, "%s: one SGD step, worst rel err %.3g", tag, ws);

    /* a second step on the same gradients: the momentum buffer's update */
    rc = upload_grads(m, ref);
    if (rc == 0)
        rc = mesh_nn_sgd_step(sgd, 0.1f);
    free(p);
    p = NULL;
    ws = rc == 0 ? sgd_err(m, ref, "sgd2", np, &p) : INFINITY;
    ok(p && ws <= TOL, "%s: a second SGD step, worst rel err %.3g", tag, ws);

    /* our file loads back bitwise, num_batches_tracked too */
    {
        struct mesh_nn_model *m2 = NULL;
        float *a = NULL;

        snprintf(path, sizeof(path), "%s/ours-saved.safetensors", dir);
        mesh_nn_model_set_batches_tracked(m, 4);
        rc = mesh_nn_model_save(m, path);
        if (rc == 0)
            rc = create(c, &m2);
        if (rc == 0)
            rc = mesh_nn_model_load(m2, path);
        if (rc == 0)
            a = slab(mesh_nn_model_params(m2), np);
        ok(rc == 0 && p && a && memcmp(a, p, np * 4) == 0 &&
               mesh_nn_model_batches_tracked(m2) == 4,
           "%s: save and load round trip", tag);
        free(a);
        mesh_nn_model_destroy(m2);
    }
out:
    free(g), free(bufs), free(p0), free(p), free(z), free(zr), free(z32);
    mesh_nn_sgd_destroy(sgd);
    mesh_st_close(ref), mesh_st_close(ours), mesh_st_close(tv);
    mesh_nn_model_destroy(m);
}

static void rm_case(const char *dir)
{
    static const char *const files[] = {"cfg",
                                        "weights.safetensors",
                                        "input.safetensors",
                                        "relu.safetensors",
                                        "ours.safetensors",
                                        "ref.safetensors",
                                        "tv.safetensors",
                                        "ours-saved.safetensors"};
    char path[512];
    size_t i;

    for (i = 0; i < MESH_ARRAY_SIZE(files); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static const char *const archs[] = {"resnet18", "resnet34", "resnet50",
                                    "resnet101", "resnet152"};

static int arch_index(const char *arch)
{
    int i;

    for (i = 0; i < 4 && strcmp(archs[i], arch) != 0; i++)
        ;
    return i;
}

/* The side of the last stage's output for an input of side s. */
static int last_side(int s, int cifar)
{
    int k;

    for (k = cifar ? 3 : 5; k > 0; k--)
        s = (s - 1) / 2 + 1;
    return s;
}

/*
 * N more cases from a seed (MESHTRAIN_TORCH_SEED, default 0), wider than
 * the table: widths 3 to 24 (channels not a multiple of 8), any image side
 * (stride-2 convs and the max pool round), batches 1 to 16 (1 only where
 * the last stage keeps more than one value per channel, as torch's BN
 * needs), 2 to 300 classes, 1 to 4 input channels, label smoothing 0, 0.1
 * or 0.3, 1 to 3 threads, the devsim backend, plain SGD, Nesterov and a
 * larger weight decay. Bottleneck networks and batches under 4 are judged
 * against PyTorch float32's own error (rel32).
 *
 * Measured (seeds 2 to 37, 432 cases: 57 at batch 1, 88 on devsim, 203 on
 * odd sides, 106 with 1, 2 or 4 input channels): both SGD steps within
 * 3.9e-7, evaluation logits within 1.2e-6 (2.0 x PyTorch float32 at
 * most); over each whole network our worst error against PyTorch
 * float32's has median 1.0 (forward, 420 cases) and 1.02 (gradients on
 * each one's own masks, 277 rel32 cases), 90th percentiles 1.4 and 1.65.
 * 30 cases miss a limit, always one tensor or scalar of a near-singular
 * network, where float32 itself is off by 1e-4 to 1e-1: a last stage whose
 * BN sees 2 to 72 values a channel (batch 1 to 5 at 1x1 to 3x3), or
 * resnet101/152. The worst, resnet34:3:0:28:2:22:26111:3:0.3:3:cpu:3
 * (MESHTRAIN_TORCH_CASES; 2 values a channel in layer4), has logits 20 x
 * PyTorch float32's 5.8e-6 error; seeds 26112 and 26113 of the same shape
 * are 1.24 and 1.46 x it (up to 6e-4). Op by op, our batch norm matches
 * PyTorch float32 on 2 to 4 values a channel in every layout.
 */
static struct tcase *sweep(int n, int *count)
{
    static const int widths[] = {3, 4, 5, 6, 8, 12, 16, 24};
    static const int batches[] = {1, 2, 3, 4, 5, 8, 16};
    static const float smooths[] = {-1, 0.1f, 0.3f};
    struct tcase *c = calloc((size_t)n + MESH_ARRAY_SIZE(table), sizeof(*c));
    const char *env = getenv("MESHTRAIN_TORCH_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : 0;
    int i, nt = getenv("MESHTRAIN_TORCH_NOTABLE") ? 0 : MESH_ARRAY_SIZE(table);

    memcpy(c, table, (size_t)nt * sizeof(*c));
    rng = 0x5EEDULL + (uint64_t)n + seed * 0x9E3779B97F4A7C15ULL;
    for (i = 0; i < n; i++) {
        struct tcase *t = &c[nt + i];
        double u = unif();

        /* mostly the cheap networks: resnet101/152 cost 10x */
        t->arch = archs[u < 0.35   ? 0
                        : u < 0.6  ? 1
                        : u < 0.85 ? 2
                        : u < 0.95 ? 3
                                   : 4];
        t->width = widths[(int)(unif() * 8)];
        t->cifar = unif() < 0.4;
        t->size = t->cifar ? 8 + (int)(unif() * 33) : 17 + (int)(unif() * 104);
        do
            t->batch = batches[(int)(unif() * 7)];
        while (t->batch == 1 && last_side(t->size, t->cifar) < 2);
        t->classes = 2 + (int)(unif() * 299);
        t->seed = 1000 * seed + 100 + (uint64_t)i;
        t->in_ch = unif() < 0.3 ? 1 + (int)(unif() * 4) : 0;
        t->smooth = smooths[(int)(unif() * 3)];
        t->threads = 1 + (int)(unif() * 3);
        t->backend = unif() < 0.2 ? "devsim" : NULL;
        t->sgd = (int)(unif() * 4);
        t->rel32 = arch_index(t->arch) >= 2 || t->batch < 4;
    }
    *count = n + nt;
    return c;
}

/*
 * MESHTRAIN_TORCH_CASES: more cases by hand (a sweep's failure, again),
 * ';'-separated, each
 * arch:width:cifar:size:batch:classes:seed[:in_ch:smooth:threads:backend:sgd]
 * as the sweep's names print them (smooth 0: none; backend cpu or devsim).
 */
static struct tcase *parse_cases(const char *spec, struct tcase *c, int *count)
{
    char *dup = strdup(spec), *save = NULL, *item;
    int n = *count;

    for (item = strtok_r(dup, ";", &save); item && n < 512;
         item = strtok_r(NULL, ";", &save)) {
        struct tcase t = {0};
        char arch[16] = "", be[16] = "";
        float sm = 0.1f;
        unsigned long long seed = 0;
        int k = sscanf(item, "%15[^:]:%d:%d:%d:%d:%d:%llu:%d:%f:%d:%15[^:]:%d",
                       arch, &t.width, &t.cifar, &t.size, &t.batch, &t.classes,
                       &seed, &t.in_ch, &sm, &t.threads, be, &t.sgd);
        int a = arch_index(arch);

        if (k < 7 || a > 4 || strcmp(archs[a], arch) != 0) {
            diag("MESHTRAIN_TORCH_CASES: cannot read \"%s\"", item);
            continue;
        }
        t.arch = archs[a];
        t.seed = seed;
        t.smooth = k >= 9 ? (sm == 0 ? -1 : sm) : 0;
        t.backend = k >= 11 && strcmp(be, "devsim") == 0 ? "devsim" : NULL;
        t.rel32 = a >= 2 || t.batch < 4;
        c = realloc(c, (size_t)(n + 1) * sizeof(*c));
        c[n++] = t;
    }
    free(dup);
    *count = n;
    return c;
}

int main(void)
{
    char dir[] = "/tmp/meshtrain-nn-torch-XXXXXX", cmd[8192], sub[600];
    const char *src = getenv("top_srcdir"), *env;
    struct worst worst[5][2];
    int i, ncase, rc, ready[512];
    struct tcase *cases;
    size_t len;

    if (access("/usr/bin/python3", X_OK) != 0) {
        skip_all("no /usr/bin/python3");
        return 0;
    }
    if (system("/usr/bin/python3 -c 'import torch, torchvision' "
               ">/dev/null 2>&1") != 0) {
        skip_all("/usr/bin/python3 cannot import torch and torchvision "
                 "(apt-get install python3-torch python3-torchvision)");
        return 0;
    }
    rc = use_ctx(&table[0]);
    if (rc < 0) {
        skip_all("%s", mesh_err_msg(rc));
        return 0;
    }
    memset(worst, 0, sizeof(worst));
    if (!mkdtemp(dir)) {
        ok(0, "mkdtemp: %s", strerror(errno));
        return done();
    }
    env = getenv("MESHTRAIN_TORCH_SWEEP");
    cases = sweep(env ? atoi(env) : 0, &ncase);
    if ((env = getenv("MESHTRAIN_TORCH_CASES")) != NULL)
        cases = parse_cases(env, cases, &ncase);
    if (ncase > (int)MESH_ARRAY_SIZE(ready))
        ncase = (int)MESH_ARRAY_SIZE(ready);

    len = (size_t)snprintf(cmd, sizeof(cmd),
                           "/usr/bin/python3 %s/tests/nn_torch_ref.py",
                           src ? src : ".");
    for (i = 0; i < ncase; i++) {
        char tag[96];

        case_name(&cases[i], tag, sizeof(tag));
        snprintf(sub, sizeof(sub), "%s/%d", dir, i);
        ready[i] = mkdir(sub, 0700) == 0 && use_ctx(&cases[i]) == 0 &&
                   prepare(&cases[i], sub) == 0;
        ok(ready[i], "%s: one training step on our side", tag);
        if (ready[i] && len + strlen(sub) + 2 < sizeof(cmd))
            len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " %s", sub);
    }
    rc = system(cmd);
    ok(rc == 0, "PyTorch's reference steps (%d cases)", ncase);
    for (i = 0; i < ncase; i++) {
        int a = arch_index(cases[i].arch);

        snprintf(sub, sizeof(sub), "%s/%d", dir, i);
        if (ready[i] && rc == 0 && use_ctx(&cases[i]) == 0)
            judge(&cases[i], sub, &worst[a][cases[i].rel32 != 0]);
        rm_case(sub);
    }
    for (i = 0; i < 10; i++) {
        const struct worst *w = &worst[i / 2][i % 2];

        if (w->n && i % 2)
            diag("%s, %d case%s judged against PyTorch float32: worst "
                 "rel err, ours (PyTorch float32's): gradients vs float64 "
                 "%.3g (%.3g), on each one's own masks %.3g (%.3g); "
                 "logits, loss, BN statistics %.3g (%.3g)",
                 archs[i / 2], w->n, w->n > 1 ? "s" : "", w->g, w->g32, w->gm,
                 w->g32m, w->f, w->f32);
        else if (w->n)
            diag("%s, %d case%s within 1e-4: worst rel err, ours (PyTorch "
                 "float32's): gradients vs float64 %.3g (%.3g), on our "
                 "masks %.3g; logits, loss, BN statistics %.3g (%.3g)",
                 archs[i / 2], w->n, w->n > 1 ? "s" : "", w->g, w->g32, w->gm,
                 w->f, w->f32);
    }
    rmdir(dir);
    free(cases);
    mesh_nn_ctx_close(ctx);
    return done();
}
