/*
 * tests/test_nn_cuda.c: the "cuda" backend against the "cpu" backend on the
 * same inputs: every op of nn/backend.h in each precision (fp32, tf32,
 * bf16-amp), the device conversions against the collective's host ones,
 * the asynchronous copies, and a full ResNet-50 training step.
 * Skips (TAP) with the reason when CUDA is not built, no device answers,
 * or the cpu backend (the reference) is missing.
 *
 * Error measure: max|gpu - cpu| / max|cpu| per tensor. Tolerances:
 * - fp32: 1e-4 for convolution and fc (float32 sums of at most a few
 *   thousand products in different orders), 1e-3 for BN backward (its
 *   mean-subtracted sums cancel), 1e-6 for element-wise ops, pooling and
 *   SGD (one or a few float operations per element), 1e-5 for the loss.
 * - tf32: operands rounded to 10 mantissa bits (relative 2^-11 = 4.9e-4
 *   each); random-sign sums keep the relative error near that: 5e-3.
 * - bf16-amp: 7 mantissa bits (2^-8 = 3.9e-3 per operand, and the output
 *   of a conv is itself rounded to bf16 before float32): 3e-2.
 * - ResNet-50 step, fp32: 50 layers of BN renormalise and amplify the
 *   reassociation differences: logits and loss 1e-3, gradients 1e-2
 *   (max-relative over the whole slab). tf32 and bf16-amp change the
 *   arithmetic itself, so they are held to a direction test: the cosine
 *   similarity of the gradient slabs >= 0.99 (tf32) and 0.95 (bf16), and
 *   the loss within 1e-2 and 5e-2 relative. Both start from bitwise the
 *   same weights, and the device's SGD step must equal the host's formula
 *   applied to the device's own gradients within 1e-6 (one float
 *   multiply-add per element, contracted or not).
 */
#include "config.h"

#include "collective/collective.h"
#include "nn/backend.h"
#include "nn/nn.h"
#include "common/util.h"
#include "tests/nn_ref.h"
#include "tests/tap.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct mesh_nn_ctx *cpu, *gpu;
static int prec;
static const char *prec_name;

static double tol_mm(void)
{
    return prec == MESH_NN_PREC_FP32   ? 1e-4
           : prec == MESH_NN_PREC_TF32 ? 5e-3
                                       : 3e-2;
}

static uint64_t rng = 88172645463325252ull;

static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rnd(size_t n, float scale)
{
    float *f = malloc(n * sizeof(float) + 1);
    size_t i;

    if (!f)
        abort();
    for (i = 0; i < n; i++)
        f[i] = frand() * scale;
    return f;
}

static void die(const char *what, int rc)
{
    printf("Bail out! %s: %s\n", what, mesh_err_msg(rc));
    exit(1);
}

static void *dalloc(struct mesh_nn_ctx *c, size_t bytes)
{
    void *p = NULL;
    int rc = c->ops->alloc(c->dev, bytes ? bytes : 4, &p);

    if (rc < 0)
        die("alloc", rc);
    return p;
}

static void *up(struct mesh_nn_ctx *c, const float *h, size_t n)
{
    void *d = dalloc(c, n * sizeof(float));
    int rc = c->ops->upload(c->dev, d, h, n * sizeof(float));

    if (rc < 0)
        die("upload", rc);
    return d;
}

static void *upact(struct mesh_nn_ctx *c, const float *h, int n, int ch, int hh,
                   int w)
{
    void *d = dalloc(c, c->ops->act_bytes(c->dev, n, ch, hh, w));
    int rc = c->ops->act_import(c->dev, n, ch, hh, w, h, d);

    if (rc < 0)
        die("act_import", rc);
    return d;
}

static float *down(struct mesh_nn_ctx *c, const void *d, size_t n)
{
    float *h = malloc(n * sizeof(float) + 1);
    int rc;

    if (!h)
        abort();
    rc = c->ops->download(c->dev, h, d, n * sizeof(float));
    if (rc < 0)
        die("download", rc);
    return h;
}

static float *downact(struct mesh_nn_ctx *c, const void *d, int n, int ch,
                      int hh, int w)
{
    float *h = malloc((size_t)n * ch * hh * w * sizeof(float) + 1);
    int rc;

    if (!h)
        abort();
    rc = c->ops->act_export(c->dev, n, ch, hh, w, d, h);
    if (rc < 0)
        die("act_export", rc);
    return h;
}

static void cmp(const char *what, const float *got, const float *want, size_t n,
                double tol)
{
    double e = ref_relerr_ff(got, want, n);

    ok(e <= tol, "%s %s: rel err %.3g (tol %.0e)", prec_name, what, e, tol);
}

/* Compare a device tensor of the gpu with one of the cpu. */
static void cmp_dev(const char *what, const void *g, const void *c, size_t n,
                    double tol)
{
    float *a = down(gpu, g, n), *b = down(cpu, c, n);

    cmp(what, a, b, n, tol);
    free(a);
    free(b);
}

static void cmp_act(const char *what, const void *g, const void *c, int n,
                    int ch, int h, int w, double tol)
{
    float *a = downact(gpu, g, n, ch, h, w), *b = downact(cpu, c, n, ch, h, w);

    cmp(what, a, b, (size_t)n * ch * h * w, tol);
    free(a);
    free(b);
}

static struct mesh_nn_plan *mkplan(struct mesh_nn_ctx *c,
                                   const struct mesh_nn_plan_desc *d)
{
    struct mesh_nn_plan *p = NULL;
    int rc = mesh_nn_ctx_plan(c, d, &p);

    if (rc < 0)
        die("plan", rc);
    return p;
}

/* Both sides of one op: index 0 gpu, 1 cpu. */
#define BOTH(i) for (int i = 0; i < 2; i++)
#define CTX(i)  ((i) ? cpu : gpu)

static void test_conv(int n, int c, int h, int k, int r, int stride, int pad)
{
    struct mesh_nn_plan_desc d;
    int oh = mesh_nn_out_dim(h, r, stride, pad);
    size_t nx = (size_t)n * c * h * h, nw = (size_t)k * c * r * r;
    size_t ny = (size_t)n * k * oh * oh;
    float *x = rnd(nx, 1), *w = rnd(nw, 0.3f), *dy = rnd(ny, 1);
    void *X[2], *W[2], *Y[2], *DY[2], *DX[2], *DW[2], *WS[2];
    char tag[96];

    memset(&d, 0, sizeof(d));
    d.kind = MESH_NN_PLAN_CONV;
    d.n = n, d.c = c, d.h = d.w = h, d.k = k, d.r = d.s = r;
    d.stride = stride, d.pad = pad, d.oh = d.ow = oh;
    BOTH(i)
    {
        struct mesh_nn_ctx *C = CTX(i);
        struct mesh_nn_plan *p = mkplan(C, &d);
        int rc;

        X[i] = upact(C, x, n, c, h, h);
        DY[i] = upact(C, dy, n, k, oh, oh);
        W[i] = up(C, w, nw);
        Y[i] = dalloc(C, C->ops->act_bytes(C->dev, n, k, oh, oh));
        DX[i] = dalloc(C, C->ops->act_bytes(C->dev, n, c, h, h));
        DW[i] = dalloc(C, nw * sizeof(float));
        WS[i] = dalloc(C, C->ops->plan_workspace(p) + 1);
        if ((rc = C->ops->conv_fwd(C->dev, p, X[i], W[i], Y[i], WS[i])) < 0 ||
            (rc = C->ops->conv_bwd_data(C->dev, p, DY[i], W[i], DX[i], WS[i])) <
                0 ||
            (rc = C->ops->conv_bwd_filter(C->dev, p, X[i], DY[i], DW[i],
                                          WS[i])) < 0)
            die("conv", rc);
    }
    snprintf(tag, sizeof(tag), "conv n%d c%d %dx%d k%d %dx%d/%d pad %d", n, c,
             h, h, k, r, r, stride, pad);
    {
        char t[128];

        snprintf(t, sizeof(t), "%s fwd", tag);
        cmp_act(t, Y[0], Y[1], n, k, oh, oh, tol_mm());
        snprintf(t, sizeof(t), "%s bwd data", tag);
        cmp_act(t, DX[0], DX[1], n, c, h, h, tol_mm());
        snprintf(t, sizeof(t), "%s bwd filter", tag);
        cmp_dev(t, DW[0], DW[1], nw, tol_mm());
    }
    BOTH(i)
    {
        struct mesh_nn_ctx *C = CTX(i);

        C->ops->free(C->dev, X[i]), C->ops->free(C->dev, W[i]);
        C->ops->free(C->dev, Y[i]), C->ops->free(C->dev, DY[i]);
        C->ops->free(C->dev, DX[i]), C->ops->free(C->dev, DW[i]);
        C->ops->free(C->dev, WS[i]);
    }
    free(x), free(w), free(dy);
}

/*
 * bf16-amp's caches on the GPU alone: a weight's bfloat16 copy is reused
 * until its weights are written (an upload into them must be seen by the
 * next forward and backward data), and dy's copy from backward-filter by
 * the backward data right after it. Each result is compared bitwise with
 * one computed without the cache (fresh buffers, an op in between).
 */
static void test_bf16_caches(void)
{
    struct mesh_nn_plan_desc d;
    int n = 2, c = 16, h = 9, k = 32, rc, i;
    size_t nx = (size_t)n * c * h * h, nw = (size_t)k * c * 9;
    size_t ny = (size_t)n * k * h * h, bx = nx * 4, by = ny * 4;
    float *x = rnd(nx, 1), *w1 = rnd(nw, 0.3f), *w2 = rnd(nw, 0.3f);
    float *dy = rnd(ny, 1), *a = malloc(by > bx ? by : bx);
    float *b = malloc(by > bx ? by : bx);
    void *X, *W, *W2, *Y, *DY, *DX, *DW, *WS, *T;
    struct mesh_nn_plan *p;

    memset(&d, 0, sizeof(d));
    d.kind = MESH_NN_PLAN_CONV;
    d.n = n, d.c = c, d.h = d.w = h, d.k = k, d.r = d.s = 3;
    d.stride = 1, d.pad = 1, d.oh = d.ow = h;
    p = mkplan(gpu, &d);
    X = up(gpu, x, nx), W = up(gpu, w1, nw), W2 = up(gpu, w2, nw);
    DY = up(gpu, dy, ny), Y = dalloc(gpu, by), DX = dalloc(gpu, bx);
    DW = dalloc(gpu, nw * 4), T = dalloc(gpu, 64);
    WS = dalloc(gpu, gpu->ops->plan_workspace(p) + 1);
    /* forward with w1 (cached), then w2 uploaded into the same buffer */
    if ((rc = gpu->ops->conv_fwd(gpu->dev, p, X, W, Y, WS)) < 0 ||
        (rc = gpu->ops->upload(gpu->dev, W, w2, nw * 4)) < 0 ||
        (rc = gpu->ops->conv_fwd(gpu->dev, p, X, W, Y, WS)) < 0 ||
        (rc = gpu->ops->download(gpu->dev, a, Y, by)) < 0 ||
        (rc = gpu->ops->conv_fwd(gpu->dev, p, X, W2, Y, WS)) < 0 ||
        (rc = gpu->ops->download(gpu->dev, b, Y, by)) < 0)
        die("bf16 cache fwd", rc);
    ok(memcmp(a, b, by) == 0,
       "bf16: forward after new weights were uploaded uses them");
    /* backward data after backward filter (dy's copy reused), against
     * backward data after another op (dy converted again) */
    if ((rc = gpu->ops->conv_bwd_filter(gpu->dev, p, X, DY, DW, WS)) < 0 ||
        (rc = gpu->ops->conv_bwd_data(gpu->dev, p, DY, W, DX, WS)) < 0 ||
        (rc = gpu->ops->download(gpu->dev, a, DX, bx)) < 0 ||
        (rc = gpu->ops->zero(gpu->dev, T, 64)) < 0 ||
        (rc = gpu->ops->conv_bwd_data(gpu->dev, p, DY, W2, DX, WS)) < 0 ||
        (rc = gpu->ops->download(gpu->dev, b, DX, bx)) < 0)
        die("bf16 cache bwd", rc);
    ok(memcmp(a, b, bx) == 0,
       "bf16: backward data reusing dy's copy and the weights' equals one "
       "without");
    /* the optimizer writes the weights: the next backward data sees it */
    if ((rc = gpu->ops->axpy1(gpu->dev, nw, W2, W)) < 0 || /* W = 2 w2 */
        (rc = gpu->ops->conv_bwd_data(gpu->dev, p, DY, W, DX, WS)) < 0 ||
        (rc = gpu->ops->download(gpu->dev, a, DX, bx)) < 0 ||
        (rc = gpu->ops->conv_bwd_data(gpu->dev, p, DY, W2, DX, WS)) < 0 ||
        (rc = gpu->ops->download(gpu->dev, b, DX, bx)) < 0)
        die("bf16 cache axpy", rc);
    for (i = 0; i < (int)(bx / 4) && a[i] == 2.f * b[i]; i++)
        ;
    ok(i == (int)(bx / 4),
       "bf16: backward data after an op wrote the weights uses them (first "
       "mismatch %d)",
       i);
    gpu->ops->free(gpu->dev, X), gpu->ops->free(gpu->dev, W);
    gpu->ops->free(gpu->dev, W2), gpu->ops->free(gpu->dev, DY);
    gpu->ops->free(gpu->dev, Y), gpu->ops->free(gpu->dev, DX);
    gpu->ops->free(gpu->dev, DW), gpu->ops->free(gpu->dev, T);
    gpu->ops->free(gpu->dev, WS);
    free(x), free(w1), free(w2), free(dy), free(a), free(b);
}

static void test_bn(int n, int c, int h, int relu)
{
    struct mesh_nn_plan_desc d;
    size_t nx = (size_t)n * c * h * h;
    float *x = rnd(nx, 2), *dy = rnd(nx, 1), *g = rnd(c, 1), *b = rnd(c, 1);
    float *rv = malloc(c * sizeof(float)), *rm = rnd(c, 0.1f);
    void *X[2], *Y[2], *DY[2], *DX[2], *G[2], *B[2], *RM[2], *RV[2];
    void *SAVE[2], *RES[2], *WS[2], *DG[2], *Y2[2];
    char t[96];
    int i;

    for (i = 0; i < c; i++)
        rv[i] = 1.f + 0.5f * frand();
    memset(&d, 0, sizeof(d));
    d.kind = MESH_NN_PLAN_BN;
    d.n = n, d.c = c, d.h = d.w = h, d.relu = relu, d.eps = 1e-5f;
    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);
        struct mesh_nn_plan *p = mkplan(C, &d);
        int rc;

        X[j] = upact(C, x, n, c, h, h);
        DY[j] = upact(C, dy, n, c, h, h);
        Y[j] = dalloc(C, C->ops->act_bytes(C->dev, n, c, h, h));
        Y2[j] = dalloc(C, C->ops->act_bytes(C->dev, n, c, h, h));
        DX[j] = dalloc(C, C->ops->act_bytes(C->dev, n, c, h, h));
        G[j] = up(C, g, c), B[j] = up(C, b, c);
        RM[j] = up(C, rm, c), RV[j] = up(C, rv, c);
        SAVE[j] = dalloc(C, 2 * c * sizeof(float));
        DG[j] = dalloc(C, 2 * c * sizeof(float));
        RES[j] = dalloc(C, C->ops->plan_reserve(p) + 1);
        WS[j] = dalloc(C, C->ops->plan_workspace(p) + 1);
        if ((rc = C->ops->bn_fwd_train(C->dev, p, X[j], Y[j], G[j], B[j], RM[j],
                                       RV[j], 0.1f, SAVE[j], RES[j], WS[j])) <
                0 ||
            (rc = C->ops->bn_fwd_infer(C->dev, p, X[j], Y2[j], G[j], B[j],
                                       RM[j], RV[j], WS[j])) < 0 ||
            /* dx aliases dy, as the model runs it */
            (rc = C->ops->bn_bwd(C->dev, p, X[j], DY[j], G[j], B[j], SAVE[j],
                                 RES[j], DY[j], DG[j], (float *)DG[j] + c,
                                 WS[j])) < 0)
            die("bn", rc);
    }
    snprintf(t, sizeof(t), "bn%s n%d c%d %dx%d y", relu ? "+relu" : "", n, c, h,
             h);
    cmp_act(t, Y[0], Y[1], n, c, h, h, 1e-4);
    strcat(t, " running mean");
    cmp_dev(t, RM[0], RM[1], c, 1e-5);
    strcpy(strstr(t, " running mean"), " running var");
    cmp_dev(t, RV[0], RV[1], c, 1e-5);
    strcpy(strstr(t, " running var"), " infer");
    cmp_act(t, Y2[0], Y2[1], n, c, h, h, 1e-4);
    strcpy(strstr(t, " infer"), " dx");
    cmp_act(t, DY[0], DY[1], n, c, h, h, 1e-3);
    strcpy(strstr(t, " dx"), " dgamma dbeta");
    cmp_dev(t, DG[0], DG[1], 2 * (size_t)c, 1e-3);
    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);
        void *all[] = {X[j],  Y[j],  Y2[j],   DY[j], DX[j],  G[j], B[j],
                       RM[j], RV[j], SAVE[j], DG[j], RES[j], WS[j]};

        for (i = 0; i < (int)(sizeof(all) / sizeof(all[0])); i++)
            C->ops->free(C->dev, all[i]);
    }
    free(x), free(dy), free(g), free(b), free(rv), free(rm);
}

static void test_eltwise_pool(int n, int c, int h)
{
    struct mesh_nn_plan_desc dr, da, dm, dv;
    size_t nx = (size_t)n * c * h * h;
    int oh = mesh_nn_out_dim(h, 3, 2, 1);
    size_t ny = (size_t)n * c * oh * oh;
    float *a = rnd(nx, 1), *b = rnd(nx, 1), *dyp = rnd(ny, 1);
    float *dvh = rnd((size_t)n * c, 1);
    void *A[2], *B[2], *R[2], *DR[2], *S[2], *MP[2], *RES[2], *DMP[2], *DYP[2],
        *AV[2], *DV[2], *DAV[2], *WS[2];

    memset(&dr, 0, sizeof(dr));
    dr.kind = MESH_NN_PLAN_RELU, dr.n = n, dr.c = c, dr.h = dr.w = h;
    da = dr;
    da.kind = MESH_NN_PLAN_ADD, da.relu = 1;
    dm = dr;
    dm.kind = MESH_NN_PLAN_MAXPOOL, dm.r = dm.s = 3, dm.stride = 2;
    dm.pad = 1, dm.oh = dm.ow = oh;
    dv = dr;
    dv.kind = MESH_NN_PLAN_AVGPOOL, dv.oh = dv.ow = 1;
    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);
        struct mesh_nn_plan *pr = mkplan(C, &dr), *pa = mkplan(C, &da);
        struct mesh_nn_plan *pm = mkplan(C, &dm), *pv = mkplan(C, &dv);
        size_t ws = C->ops->plan_workspace(pm);
        int rc;

        if (C->ops->plan_workspace(pv) > ws)
            ws = C->ops->plan_workspace(pv);
        A[j] = upact(C, a, n, c, h, h), B[j] = upact(C, b, n, c, h, h);
        R[j] = dalloc(C, nx * 4 + 64), DR[j] = dalloc(C, nx * 4 + 64);
        S[j] = dalloc(C, nx * 4 + 64);
        MP[j] = dalloc(C, C->ops->act_bytes(C->dev, n, c, oh, oh));
        DMP[j] = dalloc(C, nx * 4 + 64);
        RES[j] = dalloc(C, C->ops->plan_reserve(pm) + 1);
        DYP[j] = upact(C, dyp, n, c, oh, oh);
        AV[j] = dalloc(C, C->ops->act_bytes(C->dev, n, c, 1, 1));
        DV[j] = upact(C, dvh, n, c, 1, 1);
        DAV[j] = dalloc(C, nx * 4 + 64);
        WS[j] = dalloc(C, ws + 1);
        if ((rc = C->ops->relu_fwd(C->dev, pr, A[j], R[j])) < 0 ||
            (rc = C->ops->relu_bwd(C->dev, pr, R[j], B[j], DR[j])) < 0 ||
            (rc = C->ops->add(C->dev, pa, A[j], B[j], S[j])) < 0 ||
            (rc = C->ops->maxpool_fwd(C->dev, pm, A[j], MP[j], RES[j], WS[j])) <
                0 ||
            (rc = C->ops->maxpool_bwd(C->dev, pm, DYP[j], RES[j], DMP[j],
                                      WS[j])) < 0 ||
            (rc = C->ops->avgpool_fwd(C->dev, pv, A[j], AV[j], WS[j])) < 0 ||
            (rc = C->ops->avgpool_bwd(C->dev, pv, DV[j], DAV[j], WS[j])) < 0)
            die("eltwise/pool", rc);
    }
    cmp_act("relu fwd", R[0], R[1], n, c, h, h, 1e-6);
    cmp_act("relu bwd", DR[0], DR[1], n, c, h, h, 1e-6);
    cmp_act("add+relu", S[0], S[1], n, c, h, h, 1e-6);
    cmp_act("maxpool 3x3/2 fwd", MP[0], MP[1], n, c, oh, oh, 1e-6);
    cmp_act("maxpool 3x3/2 bwd", DMP[0], DMP[1], n, c, h, h, 1e-6);
    cmp_act("avgpool fwd", AV[0], AV[1], n, c, 1, 1, 1e-6);
    cmp_act("avgpool bwd", DAV[0], DAV[1], n, c, h, h, 1e-6);
    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);
        void *all[] = {A[j],   B[j],   R[j],  DR[j], S[j],   MP[j], RES[j],
                       DMP[j], DYP[j], AV[j], DV[j], DAV[j], WS[j]};

        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            C->ops->free(C->dev, all[i]);
    }
    free(a), free(b), free(dyp), free(dvh);
}

static void test_fc(int n, int c, int k)
{
    struct mesh_nn_plan_desc d;
    float *x = rnd((size_t)n * c, 1), *w = rnd((size_t)k * c, 0.2f);
    float *b = rnd(k, 1), *dy = rnd((size_t)n * k, 1);
    void *X[2], *W[2], *Bb[2], *Y[2], *DY[2], *DX[2], *DW[2], *DB[2], *WS[2];
    char t[64];

    memset(&d, 0, sizeof(d));
    d.kind = MESH_NN_PLAN_FC, d.n = n, d.c = c, d.h = d.w = 1, d.k = k;
    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);
        struct mesh_nn_plan *p = mkplan(C, &d);
        int rc;

        X[j] = up(C, x, (size_t)n * c), W[j] = up(C, w, (size_t)k * c);
        Bb[j] = up(C, b, k), DY[j] = up(C, dy, (size_t)n * k);
        Y[j] = dalloc(C, (size_t)n * k * 4);
        DX[j] = dalloc(C, (size_t)n * c * 4);
        DW[j] = dalloc(C, (size_t)k * c * 4), DB[j] = dalloc(C, k * 4);
        WS[j] = dalloc(C, C->ops->plan_workspace(p) + 1);
        if ((rc = C->ops->fc_fwd(C->dev, p, X[j], W[j], Bb[j], Y[j], WS[j])) <
                0 ||
            (rc = C->ops->fc_bwd_data(C->dev, p, DY[j], W[j], DX[j], WS[j])) <
                0 ||
            (rc = C->ops->fc_bwd_weights(C->dev, p, X[j], DY[j], DW[j], DB[j],
                                         WS[j])) < 0)
            die("fc", rc);
    }
    snprintf(t, sizeof(t), "fc %dx%d->%d fwd", n, c, k);
    cmp_dev(t, Y[0], Y[1], (size_t)n * k, tol_mm());
    snprintf(t, sizeof(t), "fc %dx%d->%d bwd data", n, c, k);
    cmp_dev(t, DX[0], DX[1], (size_t)n * c, tol_mm());
    snprintf(t, sizeof(t), "fc %dx%d->%d bwd weights", n, c, k);
    cmp_dev(t, DW[0], DW[1], (size_t)k * c, tol_mm());
    snprintf(t, sizeof(t), "fc %dx%d->%d bwd bias", n, c, k);
    cmp_dev(t, DB[0], DB[1], k, 1e-5);
    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);
        void *all[] = {X[j],  W[j],  Bb[j], Y[j], DY[j],
                       DX[j], DW[j], DB[j], WS[j]};

        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            C->ops->free(C->dev, all[i]);
    }
    free(x), free(w), free(b), free(dy);
}

static void test_xent_sgd(int n, int k, float eps)
{
    float *z = rnd((size_t)n * k, 4), loss[2];
    int32_t *lab = malloc(n * sizeof(int32_t));
    size_t np = 1000;
    float *p = rnd(np, 1), *g = rnd(np, 1), *m = rnd(np, 1);
    struct mesh_nn_sgd_args a = {
        .lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-4f, .nesterov = 1};
    void *Z[2], *L[2], *DZ[2], *P[2], *G[2], *M[2];
    int rc;

    for (int i = 0; i < n; i++)
        lab[i] = (int32_t)((unsigned)(i * 7919) % (unsigned)k);
    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);

        Z[j] = up(C, z, (size_t)n * k);
        L[j] = dalloc(C, n * sizeof(int32_t));
        if ((rc = C->ops->upload(C->dev, L[j], lab, n * sizeof(int32_t))) < 0)
            die("upload", rc);
        DZ[j] = dalloc(C, (size_t)n * k * 4);
        P[j] = up(C, p, np), G[j] = up(C, g, np), M[j] = up(C, m, np);
        if ((rc = C->ops->xent(C->dev, n, k, Z[j], L[j], eps, &loss[j],
                               DZ[j])) < 0 ||
            (rc = C->ops->sgd(C->dev, np, P[j], G[j], M[j], &a)) < 0 ||
            (rc = C->ops->axpy1(C->dev, np, G[j], M[j])) < 0)
            die("xent/sgd", rc);
    }
    ok(fabs(loss[0] - loss[1]) <= 1e-5 * fabs(loss[1]),
       "%s xent n%d k%d eps %.1f loss %.7g vs %.7g", prec_name, n, k,
       (double)eps, (double)loss[0], (double)loss[1]);
    cmp_dev("xent dlogits", DZ[0], DZ[1], (size_t)n * k, 1e-5);
    cmp_dev("sgd params", P[0], P[1], np, 1e-6);
    cmp_dev("sgd momentum + axpy", M[0], M[1], np, 1e-6);
    /* a bad label is an error, not a wrong loss */
    lab[0] = k;
    if ((rc = gpu->ops->upload(gpu->dev, L[0], lab, n * sizeof(int32_t))) < 0)
        die("upload", rc);
    rc = gpu->ops->xent(gpu->dev, n, k, Z[0], L[0], eps, &loss[0], DZ[0]);
    ok(rc == -EINVAL, "xent: label %d of %d classes is -EINVAL (%s)", k, k,
       rc < 0 ? mesh_err_msg(rc) : "accepted");
    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);
        void *all[] = {Z[j], L[j], DZ[j], P[j], G[j], M[j]};

        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            C->ops->free(C->dev, all[i]);
    }
    free(z), free(lab), free(p), free(g), free(m);
}

/* Device conversions equal the collective's host ones bit for bit, and the
 * asynchronous copies round-trip, ordered with compute. */
static void test_convert_copies(void)
{
    size_t n = 4099, i;
    float *x = rnd(n, 70000.f), *back = malloc(n * 4), *host = NULL;
    uint16_t *h16 = malloc(n * 2), *d16 = malloc(n * 2);
    void *X = up(gpu, x, n), *H = dalloc(gpu, n * 2), *Y = dalloc(gpu, n * 4);
    struct mesh_nn_copy *c1, *c2;
    int dts[2] = {MESH_DT_F16, MESH_DT_BF16}, k, rc, done = 0, spins = 0;

    for (k = 0; k < 2; k++) {
        int cdt = dts[k];

        x[0] = 1e9f, x[1] = -0.f, x[2] = 1e-8f; /* overflow, signs, tiny */
        if ((rc = gpu->ops->upload(gpu->dev, X, x, n * 4)) < 0 ||
            (rc = mesh_nn_convert(gpu, dts[k], H, MESH_DT_F32, X, n, 1.f)) <
                0 ||
            (rc = gpu->ops->download(gpu->dev, d16, H, n * 2)) < 0)
            die("convert", rc);
        mesh_convert(cdt, h16, MESH_DT_F32, x, n);
        ok(memcmp(h16, d16, n * 2) == 0,
           "convert f32 -> %s: bitwise as the "
           "host's",
           k ? "bf16" : "f16");
        if ((rc = mesh_nn_convert(gpu, MESH_DT_F32, Y, dts[k], H, n, 0.5f)) <
                0 ||
            (rc = gpu->ops->download(gpu->dev, back, Y, n * 4)) < 0)
            die("convert", rc);
        mesh_convert(MESH_DT_F32, x, cdt, h16, n);
        for (i = 0; i < n && back[i] == 0.5f * x[i]; i++)
            ;
        ok(i == n, "convert %s -> f32 with scale 0.5 (first mismatch %zu)",
           k ? "bf16" : "f16", i);
    }
    /* copies: gpu X -> host, host -> gpu Y, then an op that reads Y */
    if ((rc = mesh_host_alloc(n * 4, (void **)&host)) < 0)
        die("host alloc", rc);
    if ((rc = mesh_nn_copy_d2h_start(gpu, host, X, n * 4, &c1)) < 0)
        die("d2h", rc);
    while ((rc = mesh_nn_copy_test(gpu, c1, &done)) == 0 && !done &&
           spins < 100000000)
        spins++;
    ok(rc == 0 && done, "d2h copy completes (test)");
    if ((rc = mesh_nn_copy_wait(gpu, c1)) < 0)
        die("copy wait", rc);
    {
        /* a poll that finds a copy not ready must not leave that as the
         * thread's CUDA error: the next kernel launch reports it if so */
        size_t big = (size_t)64 << 20;
        void *B = dalloc(gpu, big * 4), *hb = NULL;
        int seen = 0;

        if ((rc = mesh_host_alloc(big * 4, &hb)) < 0 ||
            (rc = mesh_nn_copy_d2h_start(gpu, hb, B, big * 4, &c1)) < 0 ||
            (rc = mesh_nn_copy_test(gpu, c1, &done)) < 0)
            die("big d2h", rc);
        seen = !done;
        rc = gpu->ops->axpy1(gpu->dev, n, Y, Y); /* Y is zeroed below */
        ok(rc == 0, "a kernel after a copy poll%s: no stale error (%s)",
           seen ? " that found it not ready" : "",
           rc ? mesh_err_msg(rc) : "ok");
        if ((rc = mesh_nn_copy_wait(gpu, c1)) < 0)
            die("big copy wait", rc);
        diag("the first poll of the 256 MiB copy found it %s",
             seen ? "not ready" : "done already");
        mesh_host_free(hb, big * 4);
        gpu->ops->free(gpu->dev, B);
    }
    if ((rc = gpu->ops->download(gpu->dev, back, X, n * 4)) < 0)
        die("download", rc);
    ok(memcmp(host, back, n * 4) == 0, "d2h copy bytes");
    for (i = 0; i < n; i++)
        host[i] = (float)i;
    /* a copy back is not ordered after earlier ops (nn.h): sync first */
    if ((rc = gpu->ops->zero(gpu->dev, Y, n * 4)) < 0 ||
        (rc = mesh_nn_sync(gpu)) < 0 ||
        (rc = mesh_nn_copy_h2d_start(gpu, Y, host, n * 4, &c2)) < 0 ||
        (rc = mesh_nn_copy_order(gpu, c2)) < 0 ||
        (rc = gpu->ops->axpy1(gpu->dev, n, Y, Y)) < 0 ||
        (rc = gpu->ops->download(gpu->dev, back, Y, n * 4)) < 0)
        die("h2d", rc);
    for (i = 0; i < n && back[i] == 2.f * (float)i; i++)
        ;
    ok(i == n, "h2d copy ordered before the next op (first mismatch %zu)", i);
    mesh_host_free(host, n * 4);
    gpu->ops->free(gpu->dev, X), gpu->ops->free(gpu->dev, H);
    gpu->ops->free(gpu->dev, Y);
    free(x), free(back), free(h16), free(d16);
}

/* One ResNet-50 training step (forward, loss, backward, SGD) on both. */
static void test_resnet50_step(void)
{
    struct mesh_nn_model_cfg cfg = {
        .arch = "resnet50", .num_classes = 1000, .image_size = 224, .seed = 7};
    struct mesh_nn_sgd_cfg scfg = {.momentum = 0.9f, .weight_decay = 1e-4f};
    struct mesh_nn_model *m[2] = {NULL, NULL};
    struct mesh_nn_sgd *s[2] = {NULL, NULL};
    int n = 4, rc;
    size_t np = 0, npx = (size_t)n * 3 * 224 * 224, i;
    float *img = rnd(npx, 1.5f), loss[2], *lg[2], *gr[2], *pr[2], *p0[2];
    int32_t lab[4] = {1, 500, 999, 42};
    double dotp = 0, na = 0, nb = 0;

    BOTH(j)
    {
        struct mesh_nn_ctx *C = CTX(j);

        if ((rc = mesh_nn_model_create(C, &cfg, &m[j])) < 0 ||
            (rc = mesh_nn_sgd_create(m[j], &scfg, &s[j])) < 0 ||
            (rc = mesh_nn_model_forward(m[j], n, img, 1)) < 0 ||
            (rc = mesh_nn_model_loss(m[j], lab, 0.1f, &loss[j])) < 0 ||
            (rc = mesh_nn_model_backward(m[j], 0, NULL, NULL)) < 0)
            die("resnet50 step", rc);
        np = mesh_nn_model_num_params(m[j]);
        lg[j] = malloc((size_t)n * 1000 * 4);
        if (!lg[j] || (rc = mesh_nn_model_logits(m[j], lg[j])) < 0)
            die("logits", rc);
        gr[j] = down(C, mesh_nn_model_grads(m[j]), np);
        p0[j] = down(C, mesh_nn_model_params(m[j]), np);
        if ((rc = mesh_nn_sgd_step(s[j], 0.1f)) < 0)
            die("sgd step", rc);
        pr[j] = down(C, mesh_nn_model_params(m[j]), np);
    }
    for (i = 0; i < np; i++) {
        dotp += (double)gr[0][i] * gr[1][i];
        na += (double)gr[0][i] * gr[0][i];
        nb += (double)gr[1][i] * gr[1][i];
    }
    dotp /= sqrt(na * nb) + 1e-300;
    if (prec == MESH_NN_PREC_FP32) {
        ok(fabs(loss[0] - loss[1]) <= 1e-3 * fabs(loss[1]),
           "%s resnet50 loss %.6f vs cpu %.6f", prec_name, (double)loss[0],
           (double)loss[1]);
        cmp("resnet50 logits", lg[0], lg[1], (size_t)n * 1000, 1e-3);
        cmp("resnet50 gradients", gr[0], gr[1], np, 1e-2);
    } else {
        double lt = prec == MESH_NN_PREC_TF32 ? 1e-2 : 5e-2;
        double ct = prec == MESH_NN_PREC_TF32 ? 0.99 : 0.95;

        ok(fabs(loss[0] - loss[1]) <= lt * fabs(loss[1]),
           "%s resnet50 loss %.6f vs cpu %.6f (tol %.0e)", prec_name,
           (double)loss[0], (double)loss[1], lt);
        ok(dotp >= ct, "%s resnet50 gradient cosine %.5f (>= %.2f)", prec_name,
           dotp, ct);
    }
    /* the same initial weights on both, and the device's SGD step is
     * exactly p0 - lr (g + wd p0) from its own gradients (first step:
     * the momentum buffer is d itself) */
    cmp("resnet50 initial params", p0[0], p0[1], np, 0);
    for (i = 0; i < np; i++)
        p0[0][i] = p0[0][i] - 0.1f * (gr[0][i] + 1e-4f * p0[0][i]);
    cmp("resnet50 params after sgd, from the device's gradients", pr[0], p0[0],
        np, 1e-6);
    diag("%s resnet50: gradient cosine similarity %.6f", prec_name, dotp);
    BOTH(j)
    {
        mesh_nn_sgd_destroy(s[j]);
        mesh_nn_model_destroy(m[j]);
        free(lg[j]), free(gr[j]), free(pr[j]), free(p0[j]);
    }
    free(img);
}

/*
 * Imports through the two-slot input pipeline, each into a device buffer
 * a later op may still read, sizes growing and shrinking: every export
 * gives back exactly what was imported last into that buffer. Labels-size
 * uploads go through their own slots: more of them than there are slots.
 */
static void test_import_pipeline(void)
{
    static const int sizes[5] = {3, 7, 2, 7, 5};
    float *h[5], *back = malloc(3 * 7 * 9 * 9 * sizeof(float));
    void *D[2];
    int32_t lab[37], lb[37];
    void *L = dalloc(gpu, sizeof(lab));
    int k, rc, bad = 0, i;

    D[0] = dalloc(gpu, 3 * 7 * 9 * 9 * sizeof(float));
    D[1] = dalloc(gpu, 3 * 7 * 9 * 9 * sizeof(float));
    for (k = 0; k < 5; k++) {
        size_t n = (size_t)3 * sizes[k] * 9 * 9;

        h[k] = rnd(n, 1.f);
        /* an op on the buffer the import lands in, issued before it */
        if ((rc = gpu->ops->axpy1(gpu->dev, n, D[k % 2], D[k % 2])) < 0 ||
            (rc = gpu->ops->act_import(gpu->dev, 3, sizes[k], 9, 9, h[k],
                                       D[k % 2])) < 0)
            die("act_import", rc);
        if (k >= 1) {
            size_t m = (size_t)3 * sizes[k - 1] * 9 * 9;

            if ((rc = gpu->ops->act_export(gpu->dev, 3, sizes[k - 1], 9, 9,
                                           D[(k - 1) % 2], back)) < 0)
                die("act_export", rc);
            bad += memcmp(back, h[k - 1], m * sizeof(float)) != 0;
        }
    }
    ok(!bad,
       "5 imports through 2 pipeline slots, sizes 3 7 2 7 5: each "
       "buffer holds what was imported into it (%d wrong)",
       bad);
    for (k = 0, bad = 0; k < 9; k++) {
        for (i = 0; i < 37; i++)
            lab[i] = k * 100 + i;
        if ((rc = gpu->ops->upload(gpu->dev, L, lab, sizeof(lab))) < 0 ||
            (rc = gpu->ops->download(gpu->dev, lb, L, sizeof(lb))) < 0)
            die("small upload", rc);
        bad += memcmp(lab, lb, sizeof(lab)) != 0;
    }
    ok(!bad, "9 small uploads through the pinned slots (%d wrong)", bad);
    for (k = 0; k < 5; k++)
        free(h[k]);
    free(back);
    gpu->ops->free(gpu->dev, D[0]), gpu->ops->free(gpu->dev, D[1]);
    gpu->ops->free(gpu->dev, L);
}

int main(void)
{
    static const char *const names[] = {"fp32", "tf32", "bf16-amp"};
    struct mesh_nn_dev_opts o;
    int rc, k;

#ifdef HAVE_CUDA
    /* built with CUDA, the module must load (only a GPU may be missing) */
    if (!mesh_nn_backend_find("cuda"))
        die("the cuda module", -ENOENT);
#endif
    rc = mesh_nn_ctx_open("cuda", 0, &gpu);
    if (rc < 0) {
        skip_all("%s", mesh_err_msg(rc));
        return 0;
    }
    mesh_nn_ctx_close(gpu);
    gpu = NULL;
    rc = mesh_nn_ctx_open("cpu", 0, &cpu);
    if (rc < 0) {
        skip_all("the reference: %s", mesh_err_msg(rc));
        return 0;
    }
    diag("%s", mesh_nn_ctx_describe(cpu));
    for (k = 0; k < 3; k++) {
        mesh_nn_dev_opts_init(&o);
        prec = k == 0   ? MESH_NN_PREC_FP32
               : k == 1 ? MESH_NN_PREC_TF32
                        : MESH_NN_PREC_BF16_AMP;
        prec_name = names[k];
        o.precision = prec;
        rc = mesh_nn_ctx_open_opts("cuda", &o, &gpu);
        if (rc < 0) {
            skip("%s: %s", prec_name, mesh_err_msg(rc));
            continue;
        }
        diag("%s", mesh_nn_ctx_describe(gpu));
        test_conv(2, 16, 9, 32, 3, 2, 1);
        test_conv(2, 64, 14, 256, 1, 1, 0);
        test_conv(3, 3, 23, 64, 7, 2, 3); /* the stem */
        test_conv(2, 5, 7, 6, 3, 1, 1);
        test_fc(4, 2048, 1000);
        test_fc(3, 7, 5);
        if (k == 0) {
            /* precision-independent ops: once */
            test_bn(2, 16, 5, 0);
            test_bn(3, 64, 7, 1);
            test_eltwise_pool(2, 16, 9);
            test_eltwise_pool(2, 3, 8);
            test_xent_sgd(5, 10, 0.f);
            test_xent_sgd(8, 1000, 0.1f);
            test_convert_copies();
            test_import_pipeline();
        }
        if (k == 2)
            test_bf16_caches();
        test_resnet50_step();
        mesh_nn_ctx_close(gpu);
        gpu = NULL;
    }
    mesh_nn_ctx_close(cpu);
    return done();
}
