/*
 * bench/nn_bench.c: time ResNet training steps (forward, loss, backward,
 * SGD) on random data with nn, and report seconds per iteration, images/s,
 * peak RSS and the time per op type. Driven by bench/nn_step.sh.
 *
 *   nn_bench [--model resnet50] [--batch 32] [--image-size 224]
 *            [--iters 3] [--warmup 1] [--threads 2] [--classes 1000]
 */
#include "config.h"

#include "nn/nn.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int arg_int(int argc, char **argv, const char *name, int def)
{
    int i;

    for (i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return atoi(argv[i + 1]);
    return def;
}

static const char *arg_str(int argc, char **argv, const char *name,
                           const char *def)
{
    int i;

    for (i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return def;
}

int main(int argc, char **argv)
{
    struct mesh_nn_model_cfg cfg = {0};
    struct mesh_nn_sgd_cfg scfg = {.momentum = 0.9f, .weight_decay = 1e-4f};
    struct mesh_nn_ctx *ctx = NULL;
    struct mesh_nn_model *m = NULL;
    struct mesh_nn_sgd *sgd = NULL;
    int batch = arg_int(argc, argv, "--batch", 32);
    int iters = arg_int(argc, argv, "--iters", 3);
    int warmup = arg_int(argc, argv, "--warmup", 1);
    int threads = arg_int(argc, argv, "--threads", 2);
    double t0 = 0, t_sgd = 0, total;
    struct rusage ru;
    int32_t *labels;
    float *images, loss = 0;
    size_t n, i;
    int it, rc;

    cfg.arch = arg_str(argc, argv, "--model", "resnet50");
    cfg.image_size = arg_int(argc, argv, "--image-size", 224);
    cfg.num_classes = arg_int(argc, argv, "--classes", 1000);
    cfg.seed = 1;
    n = (size_t)batch * 3 * cfg.image_size * cfg.image_size;
    images = malloc(n * sizeof(float));
    labels = malloc((size_t)batch * sizeof(int32_t));
    if (!images || !labels)
        return 1;
    for (i = 0; i < n; i++)
        images[i] = (float)((i * 2654435761u) % 1000) / 500.f - 1.f;
    for (i = 0; i < (size_t)batch; i++)
        labels[i] = (int32_t)(i % (size_t)cfg.num_classes);
    rc = mesh_nn_ctx_open("cpu", threads, &ctx);
    if (rc == 0)
        rc = mesh_nn_model_create(ctx, &cfg, &m);
    if (rc == 0)
        rc = mesh_nn_sgd_create(m, &scfg, &sgd);
    if (rc < 0)
        goto fail;
    printf("# %s\n", mesh_nn_ctx_describe(ctx));
    for (it = 0; it < warmup + iters; it++) {
        double ts;

        if (it == warmup) {
            mesh_nn_model_profile(m, 1);
            t_sgd = 0;
        }
        if (it == warmup)
            t0 = mesh_now_s();
        rc = mesh_nn_model_forward(m, batch, images, 1);
        if (rc == 0)
            rc = mesh_nn_model_loss(m, labels, 0, &loss);
        if (rc == 0)
            rc = mesh_nn_model_backward(m, 0, NULL, NULL);
        ts = mesh_now_s();
        if (rc == 0)
            rc = mesh_nn_sgd_step(sgd, 0.01f);
        t_sgd += mesh_now_s() - ts;
        if (rc < 0)
            goto fail;
        fprintf(stderr, "# iter %d loss %.4f\n", it, (double)loss);
    }
    total = mesh_now_s() - t0;
    getrusage(RUSAGE_SELF, &ru);
    printf("meshtrain %s batch %d %dx%d threads %d: %.3f s/iter %.2f img/s "
           "peak RSS %.0f MiB\n",
           cfg.arch, batch, cfg.image_size, cfg.image_size, threads,
           total / iters, batch * iters / total, ru.ru_maxrss / 1024.0);
    printf("time per op type over %d iterations:\n", iters);
    mesh_nn_model_profile_report(m, stdout);
    printf("  %-22s %10.3f s\n", "sgd update", t_sgd);
    mesh_nn_sgd_destroy(sgd);
    mesh_nn_model_destroy(m);
    mesh_nn_ctx_close(ctx);
    free(images);
    free(labels);
    return 0;
fail:
    fprintf(stderr, "nn_bench: %s\n", mesh_err_msg(rc));
    return 1;
}
