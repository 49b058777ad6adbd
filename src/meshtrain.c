/*
 * src/meshtrain.c: the trainer program. For now it builds a model and
 * prints its layer table (--summary); the trainer issue adds training.
 *
 * Options are one table (opts[]) that drives both getopt_long and --help,
 * so adding a flag is one row plus one case in apply_opt().
 */
#include "config.h"

#include "nn/nn.h"
#include "src/util.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct config {
    struct mesh_nn_model_cfg model;
    int threads;
    int summary;
    const char *device;
};

enum {
    OPT_MODEL = 'm',
    OPT_HELP = 'h',
    OPT_NUM_CLASSES = 256,
    OPT_IMAGE_SIZE,
    OPT_IN_CHANNELS,
    OPT_CIFAR_STEM,
    OPT_ZERO_INIT_RESIDUAL,
    OPT_SEED,
    OPT_THREADS,
    OPT_DEVICE,
    OPT_SUMMARY,
};

struct opt_doc {
    struct option o;
    const char *arg;  /* argument name for --help, NULL for none */
    const char *help; /* one line */
};

static const struct opt_doc opts[] = {
    {{"model", required_argument, NULL, OPT_MODEL}, "NAME",
     "resnet18|resnet34|resnet50|resnet101|resnet152 (default resnet50)"},
    {{"num-classes", required_argument, NULL, OPT_NUM_CLASSES}, "N",
     "classes of the final layer (default 1000)"},
    {{"image-size", required_argument, NULL, OPT_IMAGE_SIZE}, "S",
     "input side in pixels, e.g. 224, 32, 28 (default 224)"},
    {{"in-channels", required_argument, NULL, OPT_IN_CHANNELS}, "C",
     "input channels (default 3)"},
    {{"cifar-stem", no_argument, NULL, OPT_CIFAR_STEM}, NULL,
     "3x3 stride-1 first conv and no max pool, for small images"},
    {{"zero-init-residual", no_argument, NULL, OPT_ZERO_INIT_RESIDUAL}, NULL,
     "initialise each block's last BN gamma to 0"},
    {{"seed", required_argument, NULL, OPT_SEED}, "N",
     "seed of the weight initialisation (default 1)"},
    {{"threads", required_argument, NULL, OPT_THREADS}, "N",
     "compute threads (default: every core)"},
    {{"device", required_argument, NULL, OPT_DEVICE}, "cpu|cuda",
     "compute backend (default cpu)"},
    {{"summary", no_argument, NULL, OPT_SUMMARY}, NULL,
     "print the model's layer table and exit"},
    {{"help", no_argument, NULL, OPT_HELP}, NULL, "print this help and exit"},
};

static void usage(FILE *f)
{
    size_t i;

    fprintf(f, "usage: meshtrain [OPTIONS]\n"
               "Synchronous data-parallel training of ResNets over a "
               "peer-to-peer mesh.\n\n");
    for (i = 0; i < MESH_ARRAY_SIZE(opts); i++) {
        char left[48];

        snprintf(left, sizeof(left), "--%s%s%s", opts[i].o.name,
                 opts[i].arg ? " " : "", opts[i].arg ? opts[i].arg : "");
        fprintf(f, "  %-26s %s\n", left, opts[i].help);
    }
}

static int parse_int(const char *flag, const char *s, long lo, long hi,
                     long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return mesh_err(-EINVAL, "--%s: \"%s\" is not an integer in [%ld, %ld]",
                        flag, s, lo, hi);
    *out = v;
    return 0;
}

static int apply_opt(struct config *c, int id, const char *name,
                     const char *arg)
{
    long v;
    int rc = 0;

    switch (id) {
    case OPT_MODEL: c->model.arch = arg; break;
    case OPT_NUM_CLASSES:
        rc = parse_int(name, arg, 1, 1000000, &v);
        c->model.num_classes = (int)v;
        break;
    case OPT_IMAGE_SIZE:
        rc = parse_int(name, arg, 8, 4096, &v);
        c->model.image_size = (int)v;
        break;
    case OPT_IN_CHANNELS:
        rc = parse_int(name, arg, 1, 64, &v);
        c->model.in_channels = (int)v;
        break;
    case OPT_CIFAR_STEM: c->model.cifar_stem = 1; break;
    case OPT_ZERO_INIT_RESIDUAL: c->model.zero_init_residual = 1; break;
    case OPT_SEED:
        rc = parse_int(name, arg, 0, LONG_MAX, &v);
        c->model.seed = (uint64_t)v;
        break;
    case OPT_THREADS:
        rc = parse_int(name, arg, 1, 4096, &v);
        c->threads = (int)v;
        break;
    case OPT_DEVICE: c->device = arg; break;
    case OPT_SUMMARY: c->summary = 1; break;
    default: rc = mesh_err(-EINVAL, "unknown option");
    }
    return rc;
}

static int parse_args(int argc, char **argv, struct config *c)
{
    struct option lo[MESH_ARRAY_SIZE(opts) + 1];
    size_t i;
    int id, rc;

    memset(lo, 0, sizeof(lo));
    for (i = 0; i < MESH_ARRAY_SIZE(opts); i++)
        lo[i] = opts[i].o;
    opterr = 0;
    while ((id = getopt_long(argc, argv, "m:h", lo, NULL)) != -1) {
        const char *name = "?";

        if (id == '?' || id == ':')
            return mesh_err(-EINVAL, "unknown or incomplete option \"%s\" "
                                     "(see --help)",
                            argv[optind - 1]);
        if (id == OPT_HELP) {
            usage(stdout);
            return 1;
        }
        for (i = 0; i < MESH_ARRAY_SIZE(opts); i++)
            if (opts[i].o.val == id)
                name = opts[i].o.name;
        rc = apply_opt(c, id, name, optarg);
        if (rc < 0)
            return rc;
    }
    if (optind < argc)
        return mesh_err(-EINVAL, "unexpected argument \"%s\" (see --help)",
                        argv[optind]);
    return 0;
}

int main(int argc, char **argv)
{
    struct config c;
    struct mesh_nn_ctx *ctx = NULL;
    struct mesh_nn_model *m = NULL;
    int rc;

    memset(&c, 0, sizeof(c));
    c.model.arch = "resnet50";
    c.model.seed = 1;
    c.device = "cpu";
    rc = parse_args(argc, argv, &c);
    if (rc > 0)
        return 0;
    if (rc < 0) {
        fprintf(stderr, "meshtrain: %s\n", mesh_err_msg(rc));
        return 2;
    }
    if (!c.summary) {
        fprintf(stderr, "meshtrain: training is not available in this "
                        "build yet; use --summary (see --help)\n");
        return 2;
    }
    rc = mesh_nn_ctx_open(c.device, c.threads, &ctx);
    if (rc == 0)
        rc = mesh_nn_model_create(ctx, &c.model, &m);
    if (rc == 0)
        mesh_nn_model_summary(m, stdout);
    mesh_nn_model_destroy(m);
    mesh_nn_ctx_close(ctx);
    if (rc < 0) {
        fprintf(stderr, "meshtrain: %s\n", mesh_err_msg(rc));
        return 1;
    }
    return 0;
}
