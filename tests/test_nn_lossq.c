/*
 * tests/test_nn_lossq.c: the queued loss (mesh_nn_model_loss_start /
 * _read / _pending), which the trainer's device path reads a step late so
 * that no step waits for the device to hand its loss back. On every
 * backend built that runs here ("cpu", and "devsim", the GPU test double
 * over it; "cuda" where a GPU answers): the queued losses come back in
 * order and bitwise equal to mesh_nn_model_loss's of the same batch, for
 * several seeds and batch sizes, through the queue's growth and wrap; an
 * empty queue, bad label smoothing and a bad label are errors that name
 * what.
 */
#include "config.h"

#include "nn/nn.h"
#include "common/util.h"
#include "tests/tap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define CLASSES 10
#define SIZE    12

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

/* Batch j of a seed: images and labels. */
static void batch(unsigned seed, int j, int n, float *x, int32_t *y)
{
    unsigned s = seed * 7919u + (unsigned)j * 104729u;
    size_t i, npx = (size_t)n * 3 * SIZE * SIZE;

    for (i = 0; i < npx; i++)
        x[i] = (float)rnd(&s) / 16384.f - 1.f;
    for (i = 0; i < (size_t)n; i++)
        y[i] = (int32_t)(rnd(&s) % CLASSES);
}

/* 20 batches: the sync losses, then the same batches queued (reads
 * interleaved so that the ring wraps and grows), compared bitwise. */
static void run(const char *be, struct mesh_nn_ctx *ctx, unsigned seed, int n)
{
    struct mesh_nn_model_cfg cfg = {.arch = "resnet18",
                                    .num_classes = CLASSES,
                                    .image_size = SIZE,
                                    .cifar_stem = 1,
                                    .width = 4,
                                    .seed = seed};
    struct mesh_nn_model *m = NULL;
    float *x = malloc((size_t)n * 3 * SIZE * SIZE * sizeof(float));
    int32_t y[16];
    float want[20], got[20];
    int j, r = 0, rc, bad = 0, pend_ok = 1;

    if (!x || mesh_nn_model_create(ctx, &cfg, &m) < 0) {
        ok(0, "%s: model (%s)", be, mesh_err_msg(-ENOMEM));
        free(x);
        return;
    }
    for (j = 0; j < 20; j++) {
        batch(seed, j, n, x, y);
        if ((rc = mesh_nn_model_forward(m, n, x, 1)) < 0 ||
            (rc = mesh_nn_model_loss(m, y, 0.1f, &want[j])) < 0)
            break;
    }
    for (j = 0; rc == 0 && j < 20; j++) {
        batch(seed, j, n, x, y);
        if ((rc = mesh_nn_model_forward(m, n, x, 1)) < 0 ||
            (rc = mesh_nn_model_loss_start(m, y, 0.1f)) < 0)
            break;
        /* read one of every three: up to 14 pending, wrapping */
        if (j % 3 == 2 && (rc = mesh_nn_model_loss_read(m, &got[r++])) < 0)
            break;
        pend_ok &= mesh_nn_model_loss_pending(m) == j + 1 - r;
    }
    while (rc == 0 && r < 20)
        rc = mesh_nn_model_loss_read(m, &got[r++]);
    for (j = 0; rc == 0 && j < 20; j++)
        bad += memcmp(&want[j], &got[j], sizeof(float)) != 0;
    ok(rc == 0 && !bad && pend_ok,
       "%s seed %u batch %d: 20 queued losses in order, bitwise as "
       "mesh_nn_model_loss's (%d differ, first %.7g vs %.7g; %s)",
       be, seed, n, bad, (double)want[0], (double)got[0],
       rc ? mesh_err_msg(rc) : "ok");
    mesh_err_clear();

    rc = mesh_nn_model_loss_read(m, &got[0]);
    ok(rc == -ENOENT && mesh_nn_model_loss_pending(m) == 0,
       "%s: reading an empty queue is -ENOENT (\"%s\")", be, mesh_err_msg(rc));
    mesh_err_clear();
    rc = mesh_nn_model_loss_start(m, y, 1.5f);
    ok(rc == -EINVAL && mesh_nn_model_loss_pending(m) == 0,
       "%s: label smoothing 1.5 is -EINVAL and queues nothing", be);
    mesh_err_clear();
    y[n - 1] = CLASSES + 3;
    rc = mesh_nn_model_loss_start(m, y, 0.f);
    if (rc == 0)
        rc = mesh_nn_model_loss_read(m, &got[0]);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "label") &&
           mesh_nn_model_loss_pending(m) == 0,
       "%s: a label outside [0, %d) is -EINVAL by start or read (\"%s\")", be,
       CLASSES, mesh_err_msg(rc));
    mesh_err_clear();
    mesh_nn_model_destroy(m);
    free(x);
}

int main(void)
{
    static const char *const backends[] = {"cpu", "devsim", "cuda"};
    static const unsigned seeds[] = {1, 29};
    static const int ns[] = {1, 5};
    struct mesh_nn_ctx *ctx;
    size_t b, s, k;
    int any = 0;

    mesh_log_set_level(MESH_LOG_ERROR);
    for (b = 0; b < sizeof(backends) / sizeof(backends[0]); b++) {
        if (mesh_nn_ctx_open(backends[b], 1, &ctx) < 0) {
            diag("%s: %s", backends[b], mesh_err_msg(-ENODEV));
            mesh_err_clear();
            continue;
        }
        any = 1;
        for (s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++)
            for (k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
                run(backends[b], ctx, seeds[s], ns[k]);
        mesh_nn_ctx_close(ctx);
    }
    if (!any) {
        skip_all("no nn backend runs here (built without oneDNN?)");
        return 0;
    }
    return done();
}
