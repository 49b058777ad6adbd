/*
 * tests/test_nn_model.c: whole ResNets on the backend.
 * - parameter counts of the family against torchvision's;
 * - deterministic initialisation (same seed: bitwise equal; other seed:
 *   different) and its statistics;
 * - full forward + backward of small ResNets (basic blocks with the CIFAR
 *   stem, bottlenecks with the ImageNet stem) against central finite
 *   differences of the float loss on sampled coordinates;
 * - the gradient-ready callback: strictly decreasing contiguous ranges
 *   covering the slab; gradient accumulation; SGD over the slab.
 *
 * Finite differences of a float32 network: the loss carries rounding noise
 * of about 1e-6, so the step is h = 1e-2 (well inside the region where the
 * loss is smooth for these weights) and the error is measured against the
 * tensor's gradient scale: |fd - g| / max(|g|, 0.05 max|g_tensor|) <= 3e-2.
 * A wrong formula (a missing term, a transposed weight) gives errors of
 * order 1; float rounding and the O(h^2) truncation stay below 1e-2.
 */
#include "config.h"

#include "nn/nn.h"
#include "src/util.h"
#include "tests/tap.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct mesh_nn_ctx *ctx;

static float *rand_images(int n, int c, int s, uint64_t seed)
{
    size_t cnt = (size_t)n * c * s * s, i;
    float *x = malloc(cnt * sizeof(float));

    for (i = 0; i < cnt; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
    }
    return x;
}

static void test_counts(void)
{
    static const struct {
        const char *arch;
        size_t params;
    } want[] = {
        {"resnet18", 11689512},  {"resnet34", 21797672},
        {"resnet50", 25557032},  {"resnet101", 44549160},
        {"resnet152", 60192808},
    };
    size_t i;

    for (i = 0; i < MESH_ARRAY_SIZE(want); i++) {
        struct mesh_nn_model_cfg cfg = {.arch = want[i].arch, .seed = 1};
        struct mesh_nn_model *m = NULL;
        int rc = mesh_nn_model_create(ctx, &cfg, &m);

        ok(rc == 0 && mesh_nn_model_num_params(m) == want[i].params,
           "%s has %zu parameters (torchvision: %zu)", want[i].arch,
           rc == 0 ? mesh_nn_model_num_params(m) : 0, want[i].params);
        if (rc == 0 && strcmp(want[i].arch, "resnet50") == 0) {
            const struct mesh_nn_tensor *t0 = mesh_nn_model_tensor(m, 0);
            const struct mesh_nn_tensor *t = mesh_nn_model_find_tensor(
                m, "layer2.0.downsample.1.running_var");
            const struct mesh_nn_tensor *c2 =
                mesh_nn_model_find_tensor(m, "layer2.0.conv2.weight");

            ok(t0 && strcmp(t0->name, "conv1.weight") == 0 && t0->offset == 0,
               "resnet50 tensor 0 is conv1.weight at 0");
            ok(t && t->kind == MESH_NN_BUFFER && t->count == 512,
               "resnet50 has layer2.0.downsample.1.running_var (512)");
            ok(c2 && c2->shape[0] == 128 && c2->shape[2] == 3,
               "resnet50 layer2.0.conv2 is the 3x3 (stride on the 3x3)");
            ok(mesh_nn_model_num_buffers(m) == 2 * 26560,
               "resnet50 has 53120 BN buffer floats");
        }
        mesh_nn_model_destroy(m);
    }
    {
        struct mesh_nn_model_cfg cfg = {.arch = "resnet51"};
        struct mesh_nn_model *m = NULL;
        int rc = mesh_nn_model_create(ctx, &cfg, &m);

        ok(rc == -EINVAL, "unknown arch is refused: %s", mesh_err_msg(rc));
    }
}

static void test_init(void)
{
    struct mesh_nn_model_cfg cfg = {.arch = "resnet18", .num_classes = 10,
                                    .seed = 42};
    struct mesh_nn_model *a = NULL, *b = NULL, *c = NULL;
    size_t n, i, cnt;
    const struct mesh_nn_tensor *t;
    float *pa, *pb, *pc;
    double s = 0, s2 = 0, want;
    int rc;

    rc = mesh_nn_model_create(ctx, &cfg, &a);
    rc |= mesh_nn_model_create(ctx, &cfg, &b);
    cfg.seed = 43;
    cfg.zero_init_residual = 1;
    rc |= mesh_nn_model_create(ctx, &cfg, &c);
    if (!ok(rc == 0, "three resnet18 models")) {
        mesh_nn_model_destroy(a), mesh_nn_model_destroy(b);
        mesh_nn_model_destroy(c);
        return;
    }
    n = mesh_nn_model_num_params(a);
    pa = malloc(n * 4), pb = malloc(n * 4), pc = malloc(n * 4);
    mesh_nn_download(ctx, pa, mesh_nn_model_params(a), n * 4);
    mesh_nn_download(ctx, pb, mesh_nn_model_params(b), n * 4);
    mesh_nn_download(ctx, pc, mesh_nn_model_params(c), n * 4);
    ok(memcmp(pa, pb, n * 4) == 0, "same seed: bitwise equal weights");
    ok(memcmp(pa, pc, n * 4) != 0, "other seed: different weights");
    t = mesh_nn_model_find_tensor(a, "layer3.1.conv1.weight");
    cnt = t->count;
    for (i = 0; i < cnt; i++) {
        s += pa[t->offset + i];
        s2 += (double)pa[t->offset + i] * pa[t->offset + i];
    }
    want = sqrt(2.0 / (256 * 9));
    ok(fabs(s / cnt) < 0.01 * want * 10 &&
           fabs(sqrt(s2 / cnt) / want - 1) < 0.02,
       "kaiming_normal fan_out: std %.5f (want %.5f)", sqrt(s2 / cnt), want);
    t = mesh_nn_model_find_tensor(a, "fc.weight");
    {
        double mx = 0, bound = 1 / sqrt(512.0);

        for (i = 0; i < t->count; i++)
            mx = fabs(pa[t->offset + i]) > mx ? fabs(pa[t->offset + i]) : mx;
        ok(mx <= bound && mx > 0.95 * bound,
           "fc.weight uniform within 1/sqrt(512): max %.5f", mx);
    }
    t = mesh_nn_model_find_tensor(a, "layer1.1.bn2.weight");
    ok(pa[t->offset] == 1.f && pc[t->offset] == 0.f &&
           pc[mesh_nn_model_find_tensor(c, "layer1.1.bn1.weight")->offset] ==
               1.f,
       "BN gamma 1; zero_init_residual zeroes only the last BN of a block");
    free(pa), free(pb), free(pc);
    mesh_nn_model_destroy(a), mesh_nn_model_destroy(b);
    mesh_nn_model_destroy(c);
}

/* gradient-ready callback: record ranges */
struct ranges {
    size_t next; /* the end the next range must have */
    int bad, calls;
};

static int on_ready(void *arg, size_t off, size_t count)
{
    struct ranges *r = arg;

    if (off + count != r->next || count == 0)
        r->bad++;
    r->next = off;
    r->calls++;
    return 0;
}

static float loss_at(struct mesh_nn_model *m, int n, const float *x,
                     const int32_t *lab)
{
    float l = NAN;

    if (mesh_nn_model_forward(m, n, x, 1) < 0 ||
        mesh_nn_model_loss(m, lab, 0.1f, &l) < 0)
        return NAN;
    return l;
}

static void test_fd(const struct mesh_nn_model_cfg *cfg, int n,
                    const char *const *names, int nnames)
{
    struct mesh_nn_model *m = NULL;
    float *x, *grads, *p, loss;
    int32_t lab[8];
    struct ranges r;
    size_t np;
    int i, rc;
    double worst = 0;

    rc = mesh_nn_model_create(ctx, cfg, &m);
    if (!ok(rc == 0, "%s %dx%d%s: created", cfg->arch, cfg->image_size,
            cfg->image_size, cfg->cifar_stem ? " cifar stem" : "")) {
        diag("%s", mesh_err_msg(rc));
        return;
    }
    np = mesh_nn_model_num_params(m);
    x = rand_images(n, mesh_nn_model_config(m)->in_channels,
                    cfg->image_size, 7);
    for (i = 0; i < n; i++)
        lab[i] = (i * 3 + 1) % cfg->num_classes;
    loss = loss_at(m, n, x, lab);
    r.next = np, r.bad = 0, r.calls = 0;
    rc = mesh_nn_model_backward(m, 0, on_ready, &r);
    ok(rc == 0 && isfinite(loss), "forward + backward: loss %.5f", loss);
    ok(r.bad == 0 && r.next == 0 && r.calls > 0,
       "gradient-ready: %d ranges, contiguous, decreasing, down to 0",
       r.calls);
    grads = malloc(np * 4), p = mesh_nn_model_params(m);
    mesh_nn_download(ctx, grads, mesh_nn_model_grads(m), np * 4);

    for (i = 0; i < nnames; i++) {
        const struct mesh_nn_tensor *t = mesh_nn_model_find_tensor(m, names[i]);
        double gmax = 0, h = 1e-2, e, fd;
        size_t k, best = 0;
        float save, lp, lm;

        if (!t) {
            ok(0, "tensor %s exists", names[i]);
            continue;
        }
        /* the coordinate with the largest gradient, plus a pseudo-random one */
        for (k = 0; k < t->count; k++)
            if (fabs(grads[t->offset + k]) > gmax) {
                gmax = fabs(grads[t->offset + k]);
                best = k;
            }
        for (int j = 0; j < 2; j++) {
            size_t idx = t->offset + (j ? (best * 7 + 13) % t->count : best);
            double g = grads[idx], den;

            mesh_nn_download(ctx, &save, p + idx, 4);
            {
                float v = save + (float)h;

                mesh_nn_upload(ctx, p + idx, &v, 4);
                lp = loss_at(m, n, x, lab);
                v = save - (float)h;
                mesh_nn_upload(ctx, p + idx, &v, 4);
                lm = loss_at(m, n, x, lab);
                mesh_nn_upload(ctx, p + idx, &save, 4);
            }
            fd = ((double)lp - lm) / (2 * h);
            den = fmax(fabs(g), 0.05 * gmax);
            e = den > 0 ? fabs(fd - g) / den : fabs(fd - g);
            diag("%s[%zu]: analytic %.6g finite diff %.6g err %.3g", names[i],
                 idx - t->offset, g, fd, e);
            worst = e > worst ? e : worst;
        }
    }
    ok(worst <= 3e-2, "%s: gradients match finite differences (worst %.3g)",
       cfg->arch, worst);

    /* accumulate: two backward passes of the same batch give 2x */
    {
        float *g2 = malloc(np * 4);
        double e = 0;
        size_t k;

        loss_at(m, n, x, lab);
        rc = mesh_nn_model_backward(m, 0, NULL, NULL);
        mesh_nn_download(ctx, grads, mesh_nn_model_grads(m), np * 4);
        loss_at(m, n, x, lab);
        rc |= mesh_nn_model_backward(m, 1, NULL, NULL);
        mesh_nn_download(ctx, g2, mesh_nn_model_grads(m), np * 4);
        for (k = 0; k < np; k++)
            e = fmax(e, fabs(g2[k] - 2 * grads[k]));
        ok(rc == 0 && e <= 1e-5, "accumulate doubles the gradient (%.3g)", e);
        free(g2);
    }
    free(x), free(grads);
    mesh_nn_model_destroy(m);
}

static void test_errors(void)
{
    struct mesh_nn_model_cfg cfg = {.arch = "resnet18", .num_classes = 4,
                                    .image_size = 16, .cifar_stem = 1};
    struct mesh_nn_model *m = NULL;
    int32_t lab[2] = {0, 9};
    float *x, l;
    int rc;

    if (mesh_nn_model_create(ctx, &cfg, &m) < 0) {
        ok(0, "model for error tests");
        return;
    }
    rc = mesh_nn_model_backward(m, 0, NULL, NULL);
    ok(rc == -EINVAL, "backward before forward: %s", mesh_err_msg(rc));
    x = rand_images(2, 3, 16, 1);
    rc = mesh_nn_model_forward(m, 2, x, 1);
    ok(rc == 0, "forward");
    rc = mesh_nn_model_loss(m, lab, 0, &l);
    ok(rc == -EINVAL, "label 9 of 4 classes: %s", mesh_err_msg(rc));
    lab[1] = 1;
    rc = mesh_nn_model_loss(m, lab, 1.5f, &l);
    ok(rc == -EINVAL, "smoothing 1.5: %s", mesh_err_msg(rc));
    free(x);
    mesh_nn_model_destroy(m);
}

int main(void)
{
    static const char *const basic[] = {
        "conv1.weight",          "bn1.weight",           "layer1.0.conv1.weight",
        "layer2.0.bn2.bias",     "layer3.0.downsample.0.weight",
        "layer4.1.conv2.weight", "layer4.1.bn2.weight",  "fc.weight",
        "fc.bias",
    };
    static const char *const bottle[] = {
        "conv1.weight",           "layer1.0.conv1.weight",
        "layer1.0.downsample.1.weight", "layer2.0.conv2.weight",
        "layer3.5.bn3.weight",    "layer4.2.conv3.weight",
        "fc.weight",
    };
    struct mesh_nn_model_cfg c18 = {.arch = "resnet18", .num_classes = 5,
                                    .image_size = 8, .cifar_stem = 1,
                                    .seed = 3};
    struct mesh_nn_model_cfg c50 = {.arch = "resnet50", .num_classes = 7,
                                    .in_channels = 1, .image_size = 32,
                                    .seed = 5};
    int rc;

    rc = mesh_nn_ctx_open("cpu", 2, &ctx);
    if (rc < 0) {
        char why[256];

        snprintf(why, sizeof(why), "%s", mesh_err_msg(rc));
        skip_all(why);
        return 0;
    }
    test_counts();
    test_init();
    test_fd(&c18, 4, basic, (int)MESH_ARRAY_SIZE(basic));
    test_fd(&c50, 4, bottle, (int)MESH_ARRAY_SIZE(bottle));
    test_errors();
    mesh_nn_ctx_close(ctx);
    return done();
}
