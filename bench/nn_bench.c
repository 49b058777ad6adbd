/*
 * bench/nn_bench.c: time ResNet training steps (forward, loss, backward,
 * SGD) on random data with nn, and report seconds per iteration, images/s,
 * peak RSS and the time per op type. Driven by bench/nn_step.sh.
 *
 *   nn_bench [--model resnet50] [--batch 32] [--image-size 224]
 *            [--iters 3] [--warmup 1] [--threads 2] [--classes 1000]
 *            [--precision fp32|bf16-amp]
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

/* CPU seconds of every thread of the process (user + system): on a
 * shared, loaded machine a fairer measure of work than wall time. */
static double cpu_s(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
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
    const char *prec = arg_str(argc, argv, "--precision", "fp32");
    struct mesh_nn_dev_opts o;
    double t0 = 0, t_sgd = 0, total, cpu0 = 0;
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
    mesh_nn_dev_opts_init(&o);
    o.threads = threads;
    rc = mesh_nn_precision_parse(prec, &o.precision);
    if (rc == 0)
        rc = mesh_nn_ctx_open_opts("cpu", &o, &ctx);
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
        if (it == warmup) {
            t0 = mesh_now_s();
            cpu0 = cpu_s();
        }
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
    printf("meshtrain %s %s batch %d %dx%d threads %d: %.3f s/iter %.2f img/s "
           "%.3f CPU-s/iter peak RSS %.0f MiB\n",
           prec, cfg.arch, batch, cfg.image_size, cfg.image_size, threads,
           total / iters, batch * iters / total, (cpu_s() - cpu0) / iters,
           ru.ru_maxrss / 1024.0);
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
