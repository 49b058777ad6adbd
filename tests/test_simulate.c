/*
 * tests/test_simulate.c: the simulated layer list of train/simulate.c
 * against nn's real model (names, order, offsets, counts), the profiles'
 * totals, the scale rule, the CSV profile parser and the backward order.
 */
#include "config.h"

#include "train/simulate.h"
#include "common/util.h"
#include "tests/tap.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Compare the simulated tensors with nn's parameter tensors. */
static int same_as_nn(const char *arch, int width, int size, int cifar)
{
    struct mesh_nn_model_cfg cfg;
    struct mesh_nn_ctx *ctx = NULL;
    struct mesh_nn_model *m = NULL;
    struct mesh_sim *s = NULL;
    int i, np = 0, good = 1;

    memset(&cfg, 0, sizeof(cfg));
    cfg.arch = arch;
    cfg.width = width;
    cfg.image_size = size;
    cfg.num_classes = 10;
    cfg.cifar_stem = cifar;
    if (mesh_nn_ctx_open("cpu", 1, &ctx) < 0 ||
        mesh_nn_model_create(ctx, &cfg, &m) < 0 ||
        mesh_sim_create(&cfg, "k80", 32, 1, &s) < 0) {
        diag("%s", mesh_err_msg(-1));
        good = 0;
        goto out;
    }
    for (i = 0; i < mesh_nn_model_num_tensors(m); i++) {
        const struct mesh_nn_tensor *x = mesh_nn_model_tensor(m, i);
        const struct mesh_nn_tensor *y = mesh_sim_tensor(s, np);

        if (x->kind != MESH_NN_PARAM)
            continue;
        np++;
        if (!y || strcmp(x->name, y->name) != 0 || x->offset != y->offset ||
            x->count != y->count || x->role != y->role) {
            diag("tensor %d: nn %s @%zu x%zu, sim %s", i, x->name, x->offset,
                 x->count, y ? y->name : "(none)");
            good = 0;
            break;
        }
    }
    if (np != mesh_sim_num_tensors(s) ||
        mesh_sim_num_params(s) != mesh_nn_model_num_params(m))
        good = 0;
out:
    mesh_sim_destroy(s);
    mesh_nn_model_destroy(m);
    mesh_nn_ctx_close(ctx);
    return good;
}

struct order {
    size_t last;
    int calls, bad;
};

static int on_grad(void *arg, size_t offset, size_t count)
{
    struct order *o = arg;

    if (offset + count != o->last)
        o->bad = 1;
    o->last = offset;
    o->calls++;
    return 0;
}

/* --simulate-gpus: each range, when reported, holds the mean of the
 * simulated GPUs' patterns, and nothing below it is written yet. */
struct gpus_check {
    const float *grads;
    int first, gpus, calls, bad;
};

static int on_grad_gpus(void *arg, size_t offset, size_t count)
{
    struct gpus_check *c = arg;
    size_t i;

    for (i = 0; i < count; i++) {
        float sum = 0;

        for (int g = 0; g < c->gpus; g++)
            sum += (float)((c->first + g) % 64 + 1 + (long)((offset + i) % 8));
        if (c->grads[offset + i] != sum * (1.0f / (float)c->gpus))
            c->bad = 1;
    }
    for (i = 0; i < offset; i++)
        if (c->grads[i] != 0)
            c->bad = 1;
    c->calls++;
    return 0;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

int main(void)
{
    struct mesh_nn_model_cfg cfg;
    struct mesh_sim *s = NULL;
    struct mesh_sim_stats st;
    struct order o;
    double fwd, bwd, t0;
    char path[] = "/tmp/test_simulate.XXXXXX";
    int fd, i, rc;

    plan(17);
    ok(same_as_nn("resnet50", 8, 32, 1), "resnet50 (width 8, cifar stem): "
                                         "the same tensors as nn");
    ok(same_as_nn("resnet18", 8, 64, 0), "resnet18 (width 8, 64 px): the "
                                         "same tensors as nn");
    ok(same_as_nn("resnet101", 4, 32, 0), "resnet101 (width 4): the same "
                                          "tensors as nn");

    memset(&cfg, 0, sizeof(cfg));
    cfg.arch = "resnet50";
    rc = mesh_sim_create(&cfg, "k80", 32, 1, &s);
    ok(rc == 0 && mesh_sim_real_params(s) == 25557032,
       "resnet50 at 224 px: 25,557,032 parameters without building it");
    mesh_sim_step_time(s, &fwd, &bwd);
    ok(fabs(fwd + bwd - 0.705) < 1e-9 && fabs(bwd - 2 * fwd) < 1e-9,
       "k80: 0.705 s per step, backward 2 x forward (%.4f + %.4f)", fwd, bwd);
    mesh_sim_destroy(s);
    s = NULL;

    rc = mesh_sim_create(&cfg, "h200", 64, 16, &s);
    mesh_sim_step_time(s, &fwd, &bwd);
    ok(rc == 0 && fabs(fwd + bwd - 2 * MESH_SIM_H200_STEP_S) < 1e-9,
       "h200 at batch 64: twice the batch-32 step");
    {
        size_t sum = 0;

        for (i = 0; i < mesh_sim_num_tensors(s); i++)
            sum += mesh_sim_tensor(s, i)->count;
        ok(sum == mesh_sim_num_params(s) &&
               mesh_sim_num_params(s) >= 25557032 / 16 &&
               mesh_sim_num_params(s) < 25557032 / 16 + 200,
           "k = 16: %zu floats on the wire, ceil per tensor",
           mesh_sim_num_params(s));
    }
    memset(&o, 0, sizeof(o));
    o.last = mesh_sim_num_params(s);
    mesh_sim_step_begin(s);
    t0 = mesh_now_s();
    mesh_sim_forward(s);
    rc = mesh_sim_backward(s, on_grad, &o);
    mesh_sim_step_end(s);
    ok(rc == 0 && !o.bad && o.last == 0 && o.calls == 161,
       "backward reports 161 ranges, contiguous from the end down to 0");
    ok(mesh_now_s() - t0 >= fwd + bwd, "a step waits at least its "
                                       "profiled time");
    mesh_sim_stats_take(s, &st);
    ok(st.steps == 1 && st.late_max_s >= 0, "saturation figures over one "
                                            "step");
    mesh_sim_destroy(s);
    s = NULL;

    /* --simulate-gpus: the mean of G patterns, range by range */
    cfg.arch = "resnet18";
    cfg.width = 4;
    rc = mesh_sim_create(&cfg, "h200", 32, 1, &s);
    {
        struct gpus_check c = {.first = 61, .gpus = 3};

        rc = rc ? rc : mesh_sim_set_gpus(s, 3, 61);
        c.grads = mesh_sim_grads(s);
        rc = rc ? rc : mesh_sim_backward(s, on_grad_gpus, &c);
        ok(rc == 0 && !c.bad && c.calls == mesh_sim_num_tensors(s),
           "3 simulated GPUs (61, 62, 63): every range their mean when "
           "reported, nothing below it yet (%d ranges)",
           c.calls);
        c.first = 0;
        c.gpus = 1;
        memset(mesh_sim_grads(s), 0, mesh_sim_num_params(s) * sizeof(float));
        rc = mesh_sim_set_gpus(s, 1, 0);
        rc = rc ? rc : mesh_sim_backward(s, NULL, NULL);
        for (i = 0; rc == 0 && (size_t)i < mesh_sim_num_params(s); i++)
            if (c.grads[i] != 0)
                rc = -1;
        ok(rc == 0, "1 GPU: the slab is left as it is");
        ok(mesh_sim_set_gpus(s, 0, 0) == -EINVAL &&
               mesh_sim_set_gpus(s, MESH_SIM_MAX_GPUS + 1, 0) == -EINVAL,
           "0 or more than %d GPUs refused: %s", MESH_SIM_MAX_GPUS,
           mesh_err_msg(-EINVAL));
    }
    mesh_sim_destroy(s);
    s = NULL;

    /* a CSV profile: every layer, then errors */
    fd = mkstemp(path);
    if (fd < 0) {
        skip_all("mkstemp failed");
        return 0;
    }
    close(fd);
    cfg.arch = "resnet18";
    cfg.width = 4;
    {
        static const char *names[] = {"conv1", "bn1"};
        FILE *f = fopen(path, "w");

        fprintf(f, "# batch 32\nlayer,forward_ms,backward_ms\n");
        for (i = 0; i < 2; i++)
            fprintf(f, "%s,1,2\n", names[i]);
        for (i = 1; i <= 4; i++) {
            int b, c;

            for (b = 0; b < 2; b++) {
                for (c = 1; c <= 2; c++)
                    fprintf(f,
                            "layer%d.%d.conv%d,0.5,1\nlayer%d.%d.bn%d,"
                            "0.1,0.2\n",
                            i, b, c, i, b, c);
                if (b == 0 && i > 1)
                    fprintf(f,
                            "layer%d.0.downsample.0,0.5,1\n"
                            "layer%d.0.downsample.1,0.1,0.2\n",
                            i, i);
            }
        }
        fprintf(f, "fc,3,4\n");
        fclose(f);
    }
    rc = mesh_sim_create(&cfg, path, 32, 1, &s);
    if (rc == 0)
        mesh_sim_step_time(s, &fwd, &bwd);
    ok(rc == 0 && fabs(fwd - (1 + 1 + 19 * 0.5 + 19 * 0.1 + 3) / 1000) < 1e-12,
       "a CSV profile with every resnet18 layer (%s)",
       rc ? mesh_err_msg(rc) : "ok");
    mesh_sim_destroy(s);
    s = NULL;
    write_file(path, "layer,forward_ms,backward_ms\nconv1,1,2\n");
    rc = mesh_sim_create(&cfg, path, 32, 1, &s);
    ok(rc < 0 && strstr(mesh_err_msg(rc), "no row for layer \"bn1\""),
       "a missing layer is named: %s", mesh_err_msg(rc));
    write_file(path, "conv1,1,x\n");
    rc = mesh_sim_create(&cfg, path, 32, 1, &s);
    ok(rc < 0 && strstr(mesh_err_msg(rc), ":1:"),
       "a bad row is named by "
       "line: %s",
       mesh_err_msg(rc));
    write_file(path, "conv9,1,2\n");
    rc = mesh_sim_create(&cfg, path, 32, 1, &s);
    ok(rc < 0 && strstr(mesh_err_msg(rc), "no layer \"conv9\""),
       "an unknown layer is named: %s", mesh_err_msg(rc));
    unlink(path);
    return done();
}
