/*
 * tests/gpu/nn_time.c: ResNet training throughput of one nn device, the
 * way meshtrain runs a step on one peer (forward, loss, backward, SGD with
 * momentum), on random images; not part of make check (tests/gpu/run.sh
 * runs it). Prints one line:
 *   nn_time device=cuda precision=tf32 arch=resnet50 batch=32 img_s=...
 *
 * usage: nn_time [-d cpu|cuda] [-p fp32|tf32|bf16-amp] [-a ARCH] [-b BATCH]
 *                [-s STEPS] [-w WARMUP] [-i IMAGE_SIZE] [-g GPU]
 */
#include "config.h"

#include "nn/nn.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse_int(const char *s, const char *what, int lo, int *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > 1000000) {
        fprintf(stderr, "nn_time: %s \"%s\" must be an integer >= %d\n", what,
                s, lo);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *device = "cuda", *arch = "resnet50", *pname = "default";
    int batch = 32, steps = 20, warmup = 5, size = 224, opt, i, rc;
    struct mesh_nn_dev_opts o;
    struct mesh_nn_ctx *ctx = NULL;
    struct mesh_nn_model *m = NULL;
    struct mesh_nn_sgd *s = NULL;
    struct mesh_nn_model_cfg cfg;
    struct mesh_nn_sgd_cfg scfg = {.momentum = 0.9f, .weight_decay = 1e-4f};
    float *img = NULL, loss = 0;
    int32_t *lab = NULL;
    double t0 = 0, t1;
    size_t npx;

    mesh_nn_dev_opts_init(&o);
    while ((opt = getopt(argc, argv, "d:p:a:b:s:w:i:g:h")) != -1) {
        switch (opt) {
        case 'd':
            device = optarg;
            break;
        case 'p':
            pname = optarg;
            if (mesh_nn_precision_parse(optarg, &o.precision) < 0) {
                fprintf(stderr, "nn_time: %s\n", mesh_err_msg(-EINVAL));
                return 2;
            }
            break;
        case 'a':
            arch = optarg;
            break;
        case 'b':
            if (parse_int(optarg, "batch", 1, &batch) < 0)
                return 2;
            break;
        case 's':
            if (parse_int(optarg, "steps", 1, &steps) < 0)
                return 2;
            break;
        case 'w':
            if (parse_int(optarg, "warmup", 0, &warmup) < 0)
                return 2;
            break;
        case 'i':
            if (parse_int(optarg, "image size", 32, &size) < 0)
                return 2;
            break;
        case 'g':
            if (parse_int(optarg, "gpu", 0, &o.gpu) < 0)
                return 2;
            break;
        default:
            fprintf(stderr, "usage: nn_time [-d cpu|cuda] [-p fp32|tf32|"
                            "bf16-amp] [-a ARCH] [-b BATCH] [-s STEPS] "
                            "[-w WARMUP] [-i SIZE] [-g GPU]\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.arch = arch;
    cfg.image_size = size;
    cfg.seed = 1;
    npx = (size_t)batch * 3 * size * size;
    img = malloc(npx * sizeof(float));
    lab = malloc((size_t)batch * sizeof(int32_t));
    if (!img || !lab) {
        fprintf(stderr, "nn_time: out of memory\n");
        rc = -ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < npx; k++)
        img[k] = (float)((k * 2654435761u) % 1000) / 500.f - 1.f;
    for (i = 0; i < batch; i++)
        lab[i] = (i * 37) % 1000;
    if ((rc = mesh_nn_ctx_open_opts(device, &o, &ctx)) < 0 ||
        (rc = mesh_nn_model_create(ctx, &cfg, &m)) < 0 ||
        (rc = mesh_nn_sgd_create(m, &scfg, &s)) < 0)
        goto out;
    fprintf(stderr, "nn_time: %s\n", mesh_nn_ctx_describe(ctx));
    for (i = 0; i < warmup + steps; i++) {
        if (i == warmup) {
            if ((rc = mesh_nn_sync(ctx)) < 0)
                goto out;
            t0 = mesh_now_ns() * 1e-9;
        }
        /* the loss queued and read a step late, as the trainer's device
         * path does: no step waits for the device */
        if ((rc = mesh_nn_model_forward(m, batch, img, 1)) < 0 ||
            (rc = mesh_nn_model_loss_start(m, lab, 0.f)) < 0 ||
            (rc = mesh_nn_model_backward(m, 0, NULL, NULL)) < 0 ||
            (rc = mesh_nn_sgd_step(s, 0.01f)) < 0)
            goto out;
        if (mesh_nn_model_loss_pending(m) > 1 &&
            (rc = mesh_nn_model_loss_read(m, &loss)) < 0)
            goto out;
    }
    while (mesh_nn_model_loss_pending(m) > 0)
        if ((rc = mesh_nn_model_loss_read(m, &loss)) < 0)
            goto out;
    if ((rc = mesh_nn_sync(ctx)) < 0)
        goto out;
    t1 = mesh_now_ns() * 1e-9;
    printf("nn_time device=%s precision=%s arch=%s batch=%d steps=%d "
           "s_per_step=%.5f img_s=%.1f loss=%.4f\n",
           device, pname, arch, batch, steps, (t1 - t0) / steps,
           batch * steps / (t1 - t0), (double)loss);
out:
    if (rc < 0)
        fprintf(stderr, "nn_time: %s\n", mesh_err_msg(rc));
    mesh_nn_sgd_destroy(s);
    mesh_nn_model_destroy(m);
    mesh_nn_ctx_close(ctx);
    free(img);
    free(lab);
    return rc < 0 ? 1 : 0;
}
