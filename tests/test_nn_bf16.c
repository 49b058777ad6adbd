/*
 * tests/test_nn_bf16.c: the cpu backend's --precision bf16-amp, op by op:
 * convolutions (forward, backward data, backward weights) and the fully
 * connected layer on several shapes and seeds, against the double
 * reference of tests/nn_ref.h run on the same operands rounded to bfloat16
 * (round to nearest even). That is exactly what bfloat16 inputs with
 * float32 accumulation compute: a bf16 x bf16 product is exact in float32,
 * so the only differences left are float32 summation orders.
 *
 * Each op runs in both forms the backend has: oneDNN's bfloat16 kernels
 * (skipped with the reason where this CPU's oneDNN has none) and the
 * emulation that MESHTRAIN_CPU_BF16=emulate forces (float32 primitives on
 * rounded operands). Then a small ResNet's training step in bf16-amp
 * against the same step in fp32, and, in a child process with oneDNN
 * capped to AVX2 (DNNL_MAX_CPU_ISA), the refusal at open with its reason
 * and the emulation that still runs there.
 *
 * Tolerances: against the rounded reference 2e-5 (max|a - b| / max|b|:
 * float32 sums of at most a few thousand terms); against the unrounded
 * (float32 operand) reference the error must exceed 1e-4, or the operands
 * were not rounded at all (bfloat16 keeps 8 significant bits: one
 * rounding is up to 2^-9 = 2e-3 relative).
 */
#include "config.h"

#include "common/dtype.h"
#include "nn/backend.h"
#include "nn/nn.h"
#include "common/util.h"
#include "tests/nn_ref.h"
#include "tests/tap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOL      2e-5
#define ROUNDED  1e-4 /* the least error of unrounded operands */
#define MAX_BF16 3e-2 /* and the most */

static struct mesh_nn_ctx *ctx;
static const char *form; /* "oneDNN bf16" or "emulated" */
#define O (ctx->ops)
#define D (ctx->dev)

static void *dalloc(size_t bytes)
{
    void *p = NULL;

    if (O->alloc(D, bytes ? bytes : 1, &p) < 0)
        abort();
    return p;
}

/* v as float32, then rounded to bfloat16 (r) or not (f). */
static void to_f32(const double *v, double *f, double *r, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        f[i] = (float)v[i];
        r[i] = mesh_f32_from_bf16(mesh_bf16_from_f32((float)v[i]));
    }
}

static void *dev_act(const double *h, int n, int c, int hh, int w)
{
    size_t cnt = (size_t)n * c * hh * w;
    float *f = ref_newf(cnt);
    void *d = dalloc(O->act_bytes(D, n, c, hh, w));

    ref_tof(h, f, cnt);
    if (O->act_import(D, n, c, hh, w, f, d) < 0)
        abort();
    free(f);
    return d;
}

static float *host_act(const void *d, int n, int c, int h, int w)
{
    float *f = ref_newf((size_t)n * c * h * w);

    if (O->act_export(D, n, c, h, w, d, f) < 0)
        abort();
    return f;
}

static float *dev_vec(const double *h, size_t n)
{
    float *f = ref_newf(n), *d = dalloc(n * sizeof(float));

    ref_tof(h, f, n);
    if (O->upload(D, d, f, n * sizeof(float)) < 0)
        abort();
    free(f);
    return d;
}

static float *host_vec(const float *d, size_t n)
{
    float *f = ref_newf(n);

    if (O->download(D, f, d, n * sizeof(float)) < 0)
        abort();
    return f;
}

/* got (freed here) against the rounded reference want and the unrounded
 * one want32, from an op that returned rc. */
static void check(int rc, const char *tag, const char *what, float *got,
                  const double *want, const double *want32, size_t n)
{
    double e = ref_relerr_fd(got, want, n), e32 = ref_relerr_fd(got, want32, n);

    if (rc < 0)
        diag("%s", mesh_err_msg(rc));
    ok(rc == 0 && e <= TOL && e32 > ROUNDED && e32 < MAX_BF16,
       "%s %s %s: rel err %.3g (tol %.0e), %.3g against float32 operands", form,
       tag, what, e, TOL, e32);
    free(got);
}

/* Whether the device buffers a and b of bytes bytes are bitwise equal. */
static int dev_equal(const void *a, const void *b, size_t bytes)
{
    char *ha = malloc(bytes ? bytes : 1), *hb = malloc(bytes ? bytes : 1);
    int eq;

    if (!ha || !hb || O->download(D, ha, a, bytes) < 0 ||
        O->download(D, hb, b, bytes) < 0)
        abort();
    eq = memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return eq;
}

/*
 * The conversions done once (conv_fwd_keep, conv_bwd_filter_kept,
 * conv_bwd_data_after) where the plan offers them: bitwise the results of
 * the ops they stand for (y, dx, dw from test_conv, which checked those
 * against the reference), and the weight gradient read from the reserve:
 * given a zeroed x instead of the forward's, it is still the same.
 */
static void test_conv_kept(const struct ref_conv *s, struct mesh_nn_plan *p,
                           const char *tag, const void *xd, const void *dyd,
                           const float *wd, const void *yd, const void *dxd,
                           const float *dwd, void *ws)
{
    size_t res = O->plan_reserve(p), nw = (size_t)s->k * s->c * s->r * s->r;
    size_t xb = O->act_bytes(D, s->n, s->c, s->h, s->w);
    size_t yb = O->act_bytes(D, s->n, s->k, s->oh, s->ow);
    void *r, *y2, *dx2, *zx;
    float *dw2;
    int rc;

    if (!O->conv_fwd_keep || !res) {
        skip("%s %s: converts every operand per op (no reserve)", form, tag);
        return;
    }
    r = dalloc(res), y2 = dalloc(yb), dx2 = dalloc(xb), zx = dalloc(xb);
    dw2 = dalloc(nw * sizeof(float));
    rc = O->conv_fwd_keep(D, p, xd, wd, y2, r, ws);
    if (rc == 0)
        rc = O->conv_bwd_filter_kept(D, p, zx, r, dyd, dw2, ws);
    if (rc == 0 && dxd) {
        rc = O->conv_bwd_data_after(D, p, dyd, wd, dx2, ws);
        if (rc == -ENOTSUP && s->c < 4) /* a stem's, as in test_conv */
            mesh_err_clear(), rc = 0, dxd = NULL;
    }
    if (rc < 0)
        diag("%s", mesh_err_msg(rc));
    ok(rc == 0 && dev_equal(y2, yd, yb) &&
           dev_equal(dw2, dwd, nw * sizeof(float)) &&
           (!dxd || dev_equal(dx2, dxd, xb)),
       "%s %s: x converted once (%zu bytes kept): y, dw%s bitwise as "
       "above",
       form, tag, res, dxd ? ", dx" : "");
    O->free(D, r), O->free(D, y2), O->free(D, dx2), O->free(D, zx);
    O->free(D, dw2);
}

static void test_conv(const int *s6, uint64_t seed)
{
    struct ref_conv s = {s6[0], s6[1], s6[2], s6[2], s6[3],
                         s6[4], s6[5], s6[6], 0,     0};
    size_t nx, nw, ny;
    double *x, *w, *dy, *fx, *fw, *fdy, *rx, *rw, *rdy;
    double *y, *dx, *dw, *y32, *dx32, *dw32;
    struct mesh_nn_plan_desc d;
    struct mesh_nn_plan *p = NULL;
    void *xd, *dyd, *yd, *dxd, *ws;
    float *wd, *dwd;
    char tag[96];
    int rc;

    s.oh = s.ow = mesh_nn_out_dim(s.h, s.r, s.stride, s.pad);
    snprintf(tag, sizeof(tag), "conv n%d c%d %dx%d k%d %dx%d/%d seed %d", s.n,
             s.c, s.h, s.h, s.k, s.r, s.r, s.stride, (int)seed);
    nx = (size_t)s.n * s.c * s.h * s.w;
    nw = (size_t)s.k * s.c * s.r * s.r;
    ny = (size_t)s.n * s.k * s.oh * s.ow;
    x = ref_new(nx), fx = ref_new(nx), rx = ref_new(nx), dx = ref_new(nx);
    dx32 = ref_new(nx);
    w = ref_new(nw), fw = ref_new(nw), rw = ref_new(nw), dw = ref_new(nw);
    dw32 = ref_new(nw);
    dy = ref_new(ny), fdy = ref_new(ny), rdy = ref_new(ny), y = ref_new(ny);
    y32 = ref_new(ny);
    ref_rng_state = 0x9e3779b97f4a7c15ull * (seed + 1);
    ref_fill(x, nx, 1), ref_fill(w, nw, 0.5), ref_fill(dy, ny, 1);
    to_f32(x, fx, rx, nx), to_f32(w, fw, rw, nw), to_f32(dy, fdy, rdy, ny);
    ref_conv_fwd(&s, rx, rw, y);
    ref_conv_bwd(&s, rx, rw, rdy, dx, dw);
    ref_conv_fwd(&s, fx, fw, y32);
    ref_conv_bwd(&s, fx, fw, fdy, dx32, dw32);

    memset(&d, 0, sizeof(d));
    d.kind = MESH_NN_PLAN_CONV;
    d.n = s.n, d.c = s.c, d.h = d.w = s.h, d.k = s.k, d.r = d.s = s.r;
    d.stride = s.stride, d.pad = s.pad, d.oh = d.ow = s.oh;
    rc = mesh_nn_ctx_plan(ctx, &d, &p);
    if (!ok(rc == 0, "%s %s: plan", form, tag)) {
        diag("%s", mesh_err_msg(rc));
        skip("no plan"), skip("no plan"), skip("no plan");
        goto out;
    }
    ws = dalloc(O->plan_workspace(p));
    xd = dev_act(fx, s.n, s.c, s.h, s.w);
    dyd = dev_act(fdy, s.n, s.k, s.oh, s.ow);
    wd = dev_vec(fw, nw);
    yd = dalloc(O->act_bytes(D, s.n, s.k, s.oh, s.ow));
    dxd = dalloc(O->act_bytes(D, s.n, s.c, s.h, s.w));
    dwd = dalloc(nw * sizeof(float));
    rc = O->conv_fwd(D, p, xd, wd, yd, ws);
    check(rc, tag, "fwd", host_act(yd, s.n, s.k, s.oh, s.ow), y, y32, ny);
    if (s.c < 4 && O->conv_bwd_data(D, p, dyd, wd, dxd, ws) == -ENOTSUP) {
        mesh_err_clear();
        skip("%s %s bwd data: none for a stem (never used)", form, tag);
    } else {
        rc = O->conv_bwd_data(D, p, dyd, wd, dxd, ws);
        check(rc, tag, "bwd data", host_act(dxd, s.n, s.c, s.h, s.w), dx, dx32,
              nx);
    }
    rc = O->conv_bwd_filter(D, p, xd, dyd, dwd, ws);
    check(rc, tag, "bwd filter", host_vec(dwd, nw), dw, dw32, nw);
    test_conv_kept(&s, p, tag, xd, dyd, wd, yd, dxd, dwd, ws);
    O->free(D, ws), O->free(D, xd), O->free(D, dyd), O->free(D, wd);
    O->free(D, yd), O->free(D, dxd), O->free(D, dwd);
out:
    free(x), free(fx), free(rx), free(dx), free(dx32);
    free(w), free(fw), free(rw), free(dw), free(dw32);
    free(dy), free(fdy), free(rdy), free(y), free(y32);
}

/* y = x W^T + b and its gradients (dx, dw, db zeroed here). */
static void ref_fc(int n, int c, int k, const double *x, const double *w,
                   const double *b, const double *dy, double *y, double *dx,
                   double *dw, double *db)
{
    int i, j, l;

    memset(dx, 0, (size_t)n * c * sizeof(double));
    memset(dw, 0, (size_t)k * c * sizeof(double));
    memset(db, 0, (size_t)k * sizeof(double));
    ref_fc_fwd(n, c, k, x, w, b, y);
    for (i = 0; i < n; i++)
        for (j = 0; j < k; j++) {
            double g = dy[(size_t)i * k + j];

            db[j] += g;
            for (l = 0; l < c; l++) {
                dx[(size_t)i * c + l] += g * w[(size_t)j * c + l];
                dw[(size_t)j * c + l] += g * x[(size_t)i * c + l];
            }
        }
}

static void test_fc(int n, int c, int k, uint64_t seed)
{
    size_t nx = (size_t)n * c, nw = (size_t)k * c, ny = (size_t)n * k;
    double *x = ref_new(nx), *fx = ref_new(nx), *rx = ref_new(nx);
    double *w = ref_new(nw), *fw = ref_new(nw), *rw = ref_new(nw);
    double *dy = ref_new(ny), *fdy = ref_new(ny), *rdy = ref_new(ny);
    double *b = ref_new(k), *y = ref_new(ny), *y32 = ref_new(ny);
    double *dx = ref_new(nx), *dx32 = ref_new(nx), *dw = ref_new(nw);
    double *dw32 = ref_new(nw), *db = ref_new(k), *db32 = ref_new(k);
    struct mesh_nn_plan_desc d;
    struct mesh_nn_plan *p = NULL;
    char tag[64];
    int rc;

    snprintf(tag, sizeof(tag), "fc n%d %d -> %d seed %d", n, c, k, (int)seed);
    ref_rng_state = 0x2545f4914f6cdd1dull * (seed + 1);
    ref_fill(x, nx, 1), ref_fill(w, nw, 0.3), ref_fill(dy, ny, 1);
    ref_fill(b, k, 0.01); /* small: the bias is added in float32 */
    to_f32(x, fx, rx, nx), to_f32(w, fw, rw, nw), to_f32(dy, fdy, rdy, ny);
    ref_fc(n, c, k, rx, rw, b, rdy, y, dx, dw, db);
    ref_fc(n, c, k, fx, fw, b, fdy, y32, dx32, dw32, db32);
    memset(&d, 0, sizeof(d));
    d.kind = MESH_NN_PLAN_FC;
    d.n = n, d.c = c, d.h = d.w = 1, d.k = k;
    rc = mesh_nn_ctx_plan(ctx, &d, &p);
    if (ok(rc == 0, "%s %s: plan", form, tag)) {
        void *ws = dalloc(O->plan_workspace(p));
        float *xd = dev_vec(fx, nx), *wd = dev_vec(fw, nw);
        float *bd = dev_vec(b, k), *dyd = dev_vec(fdy, ny);
        float *yd = dalloc(ny * 4), *dxd = dalloc(nx * 4);
        float *dwd = dalloc(nw * 4), *dbd = dalloc((size_t)k * 4), *got;

        rc = O->fc_fwd(D, p, xd, wd, bd, yd, ws);
        check(rc, tag, "fwd", host_vec(yd, ny), y, y32, ny);
        rc = O->fc_bwd_data(D, p, dyd, wd, dxd, ws);
        check(rc, tag, "bwd data", host_vec(dxd, nx), dx, dx32, nx);
        rc = O->fc_bwd_weights(D, p, xd, dyd, dwd, dbd, ws);
        check(rc, tag, "bwd weights", host_vec(dwd, nw), dw, dw32, nw);
        /* the bias gradient: a float32 sum of the rounded dy */
        got = host_vec(dbd, k);
        ok(rc == 0 && ref_relerr_fd(got, db, k) <= TOL,
           "%s %s bwd bias: rel err %.3g (tol %.0e)", form, tag,
           ref_relerr_fd(got, db, k), TOL);
        free(got);
        O->free(D, ws), O->free(D, xd), O->free(D, wd), O->free(D, bd);
        O->free(D, dyd), O->free(D, yd), O->free(D, dxd), O->free(D, dwd);
        O->free(D, dbd);
    } else {
        diag("%s", mesh_err_msg(rc));
        skip("no plan"), skip("no plan"), skip("no plan"), skip("no plan");
    }
    free(x), free(fx), free(rx), free(w), free(fw), free(rw), free(dy);
    free(fdy), free(rdy), free(b), free(y), free(y32), free(dx), free(dx32);
    free(dw), free(dw32), free(db), free(db32);
}

/* n, c, h, k, r, stride, pad: blocked channel counts and plain ones, the
 * stems (3 and 1 channels), a 3x3 on 2x2 maps (the weight gradient on
 * plain copies in fp32). */
static const int convs[][7] = {
    {2, 16, 9, 32, 3, 2, 1}, {2, 32, 6, 16, 1, 1, 0}, {2, 16, 8, 16, 1, 2, 0},
    {3, 3, 11, 16, 7, 2, 3}, {2, 1, 12, 16, 3, 1, 1}, {2, 5, 7, 6, 3, 1, 1},
    {4, 64, 2, 64, 3, 1, 1}, {2, 64, 8, 64, 3, 1, 1},
};

static void test_ops(int nseeds)
{
    size_t i;
    int seed;

    for (seed = 0; seed < nseeds; seed++) {
        for (i = 0; i < MESH_ARRAY_SIZE(convs); i++)
            test_conv(convs[i], (uint64_t)seed);
        test_fc(4, 32, 10, (uint64_t)seed);
        test_fc(3, 7, 5, (uint64_t)seed);
        test_fc(8, 64, 33, (uint64_t)seed);
    }
}

static int open_bf16(const char *env, struct mesh_nn_ctx **out)
{
    struct mesh_nn_dev_opts o;

    if (env)
        setenv("MESHTRAIN_CPU_BF16", env, 1);
    else
        unsetenv("MESHTRAIN_CPU_BF16");
    mesh_nn_dev_opts_init(&o);
    o.threads = 2;
    o.precision = MESH_NN_PREC_BF16_AMP;
    return mesh_nn_ctx_open_opts("cpu", &o, out);
}

/*
 * One training step of a small ResNet-18 (1 channel, 16 px, width 16) in
 * bf16-amp against the same step in fp32 from the same weights and images:
 * the loss within 2e-2 relative and the gradient slabs' cosine >= 0.95
 * (bfloat16 changes the arithmetic, not the direction; tests/test_nn_cuda.c
 * holds its bf16-amp to the same bound). Measured here: about 0.97.
 */
static void test_model(void)
{
    struct mesh_nn_model_cfg cfg = {.arch = "resnet18",
                                    .num_classes = 10,
                                    .in_channels = 1,
                                    .image_size = 16,
                                    .cifar_stem = 1,
                                    .seed = 7,
                                    .width = 16};
    struct mesh_nn_ctx *c32 = NULL;
    struct mesh_nn_model *m[2] = {NULL, NULL};
    enum { N = 8 };
    float img[N * 16 * 16], loss[2] = {0, 0}, *g[2] = {NULL, NULL};
    int32_t lab[N];
    double dot = 0, n0 = 0, n1 = 0;
    size_t i, np = 0;
    int k, rc;

    rc = mesh_nn_ctx_open("cpu", 2, &c32);
    for (i = 0; i < MESH_ARRAY_SIZE(img); i++)
        img[i] = (float)ref_unif();
    for (i = 0; i < N; i++)
        lab[i] = (int32_t)(i * 3 % 10);
    for (k = 0; k < 2 && rc == 0; k++) {
        struct mesh_nn_ctx *c = k ? ctx : c32;

        rc = mesh_nn_model_create(c, &cfg, &m[k]);
        if (rc == 0)
            rc = mesh_nn_model_forward(m[k], N, img, 1);
        if (rc == 0)
            rc = mesh_nn_model_loss(m[k], lab, 0, &loss[k]);
        if (rc == 0)
            rc = mesh_nn_model_backward(m[k], 0, NULL, NULL);
        if (rc == 0) {
            np = mesh_nn_model_num_params(m[k]);
            g[k] = host_vec(mesh_nn_model_grads(m[k]), np);
        }
    }
    if (!ok(rc == 0, "%s resnet18 step", form)) {
        diag("%s", mesh_err_msg(rc));
        skip("no step"), skip("no step");
    } else {
        for (i = 0; i < np; i++) {
            dot += (double)g[0][i] * g[1][i];
            n0 += (double)g[0][i] * g[0][i];
            n1 += (double)g[1][i] * g[1][i];
        }
        ok(fabs(loss[1] - loss[0]) <= 2e-2 * fabs(loss[0]),
           "%s resnet18 loss %.6f, fp32 %.6f", form, loss[1], loss[0]);
        ok(dot / sqrt(n0 * n1) >= 0.95,
           "%s resnet18 gradients' cosine with fp32 %.6f (>= 0.95)", form,
           dot / sqrt(n0 * n1));
    }
    free(g[0]), free(g[1]);
    mesh_nn_model_destroy(m[0]), mesh_nn_model_destroy(m[1]);
    mesh_nn_ctx_close(c32);
}

/*
 * In a child with oneDNN capped to AVX2 (which has no bfloat16 kernels):
 * bf16-amp is refused with the way out in the message, and emulation runs.
 * Forked before this process calls oneDNN (the cap is read once). Exit
 * status: 0, or bit 0 (no refusal), bit 1 (bad message), bit 2 (emulation
 * failed), bit 3 (the cap did not apply: skip).
 */
static int avx2_child(void)
{
    struct mesh_nn_ctx *c = NULL;
    int rc, bad = 0, capped;

    setenv("DNNL_MAX_CPU_ISA", "AVX2", 1);
    if (mesh_nn_ctx_open("cpu", 2, &c) < 0)
        return 4;
    capped = strstr(mesh_nn_ctx_describe(c), "nChw16c") == NULL;
    mesh_nn_ctx_close(c);
    if (!capped)
        return 8;
    rc = open_bf16(NULL, &c);
    if (rc == 0) {
        mesh_nn_ctx_close(c);
        return 1;
    }
    fprintf(stderr, "# AVX2: %s\n", mesh_err_msg(rc));
    if (rc != -ENOTSUP ||
        !strstr(mesh_err_msg(rc), "no bfloat16 convolution for this CPU") ||
        !strstr(mesh_err_msg(rc), "MESHTRAIN_CPU_BF16=emulate"))
        bad |= 2;
    rc = open_bf16("emulate", &ctx);
    if (rc < 0)
        return bad | 4;
    form = "AVX2 emulated";
    fprintf(stderr, "# %s\n", mesh_nn_ctx_describe(ctx));
    test_conv(convs[0], 5);
    test_fc(4, 32, 10, 5);
    if (tap_failed)
        bad |= 4;
    mesh_nn_ctx_close(ctx);
    ctx = NULL;
    return bad;
}

int main(void)
{
    pid_t pid;
    int rc, st = 0;

    if (!mesh_nn_backend_find("cpu")) {
        skip_all("no cpu backend: %s", mesh_err_msg(-ENOTSUP));
        return 0;
    }
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        /* the child's TAP lines are its own: keep them out of ours */
        if (!freopen("/dev/null", "w", stdout))
            _exit(4);
        _exit(avx2_child());
    }
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        ok(0, "AVX2 child");
    else if (WEXITSTATUS(st) & 8)
        skip("AVX2 child: oneDNN's ISA cap did not apply");
    else {
        ok(!(WEXITSTATUS(st) & 3),
           "AVX2: bf16-amp refused at open, naming MESHTRAIN_CPU_BF16");
        ok(!(WEXITSTATUS(st) & 4),
           "AVX2: MESHTRAIN_CPU_BF16=emulate runs, ops match the reference");
    }

    rc = open_bf16(NULL, &ctx);
    if (rc < 0) {
        diag("%s", mesh_err_msg(rc));
        skip("oneDNN bf16: %s", mesh_err_msg(rc));
    } else {
        form = "oneDNN bf16";
        diag("%s", mesh_nn_ctx_describe(ctx));
        ok(strstr(mesh_nn_ctx_describe(ctx), "oneDNN bfloat16") != NULL,
           "bf16-amp with oneDNN's kernels: %s", mesh_nn_ctx_describe(ctx));
        test_ops(2);
        test_model();
        mesh_nn_ctx_close(ctx);
    }

    rc = open_bf16("emulate", &ctx);
    if (!ok(rc == 0, "MESHTRAIN_CPU_BF16=emulate opens")) {
        diag("%s", mesh_err_msg(rc));
        return done();
    }
    form = "emulated";
    diag("%s", mesh_nn_ctx_describe(ctx));
    test_ops(2);
    test_model();
    mesh_nn_ctx_close(ctx);

    rc = open_bf16("fast", &ctx);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "MESHTRAIN_CPU_BF16=fast"),
       "MESHTRAIN_CPU_BF16=fast is refused: %s", mesh_err_msg(rc));
    if (rc == 0)
        mesh_nn_ctx_close(ctx);
    unsetenv("MESHTRAIN_CPU_BF16");
    return done();
}
