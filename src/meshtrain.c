/*
 * src/meshtrain.c: the trainer program. Parses the flags (the mesh flags
 * of mesh/mesh.h and the trainer's own, one table that also drives --help)
 * and hands over to train_run() (train/train.c); --summary only builds the
 * model and prints its layer table.
 *
 *   meshrun -np 4 -H localhost:4 -- meshtrain --model resnet50 \
 *       --data synthetic --batch 32
 */
#include "config.h"

#include "collective/collective.h"
#include "nn/nn.h"
#include "mesh/mesh.h"
#include "train/train.h"
#include "common/util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The flags that need more than a number or a string: apply_custom(). */
enum {
    OPT_MODEL,
    OPT_DEVICE,
    OPT_PRECISION,
    OPT_AUGMENT,
    OPT_ON_BAD,
    OPT_LR_SCHEDULE,
    OPT_MILESTONES,
    OPT_COMPRESS,
    OPT_ALGO,
    OPT_RESUME,
    OPT_HELP,
};

/* How a flag's value lands in its struct train_cfg field. */
enum opt_kind {
    OPT_SWITCH, /* int, set to 1; the flag takes no value */
    OPT_STRING, /* const char *, the value as given */
    OPT_INT,    /* int, a whole number from lo to hi */
    OPT_U64,    /* uint64_t, a whole number from lo to hi */
    OPT_DOUBLE, /* double, a number from dlo to dhi */
    OPT_FLOAT,  /* float, a number from dlo to dhi */
    OPT_CUSTOM, /* apply_custom(), by id */
};

struct opt_doc {
    const char *name;
    enum opt_kind kind;
    int id;           /* OPT_CUSTOM: which one */
    size_t offset;    /* of the field in struct train_cfg */
    long lo, hi;      /* OPT_INT, OPT_U64 */
    double dlo, dhi;  /* OPT_DOUBLE, OPT_FLOAT */
    const char *arg;  /* argument name for --help, NULL for a switch;
                         "[=VALUE]": optional, given only as --name=VALUE */
    const char *help; /* one line */
};

/* The offset of train_cfg field f, which must have type t (else no match
 * in the _Generic, a compile error). */
#define FIELD(f, t)                                                            \
    _Generic(((struct train_cfg *)0)->f, t : offsetof(struct train_cfg, f))
#define SWITCH_FIELD(f)         OPT_SWITCH, 0, FIELD(f, int), 0, 0, 0, 0
#define STRING_FIELD(f)         OPT_STRING, 0, FIELD(f, const char *), 0, 0, 0, 0
#define INT_FIELD(f, lo, hi)    OPT_INT, 0, FIELD(f, int), lo, hi, 0, 0
#define U64_FIELD(f, lo, hi)    OPT_U64, 0, FIELD(f, uint64_t), lo, hi, 0, 0
#define DOUBLE_FIELD(f, lo, hi) OPT_DOUBLE, 0, FIELD(f, double), 0, 0, lo, hi
#define FLOAT_FIELD(f, lo, hi)  OPT_FLOAT, 0, FIELD(f, float), 0, 0, lo, hi
#define CUSTOM(id)              OPT_CUSTOM, id, 0, 0, 0, 0, 0

static const struct opt_doc opts[] = {
    {"model", CUSTOM(OPT_MODEL), "NAME",
     "resnet18|resnet34|resnet50|resnet101|resnet152 (default resnet50)"},
    {"width", INT_FIELD(model.width, 1, 1024), "W",
     "conv1 channels; stage k has W << k (default 64, torchvision's)"},
    {"num-classes", INT_FIELD(model.num_classes, 1, 1000000), "N",
     "classes of the final layer (default: the data set's)"},
    {"image-size", INT_FIELD(model.image_size, 8, 4096), "S",
     "input side in pixels (default: the data set's; 224 synthetic)"},
    {"in-channels", INT_FIELD(model.in_channels, 1, 3), "C",
     "input channels (default: the data set's)"},
    {"cifar-stem", SWITCH_FIELD(model.cifar_stem), NULL,
     "3x3 stride-1 first conv and no max pool, for small images"},
    {"zero-init-residual", SWITCH_FIELD(model.zero_init_residual), NULL,
     "initialise each block's last BN gamma to 0"},
    {"seed", U64_FIELD(model.seed, 0, LONG_MAX), "N",
     "weights, data order and augmentation (default 1)"},
    {"threads", INT_FIELD(threads, 1, 4096), "N",
     "compute threads, the same on every peer (default: the CPUs --bind-to "
     "gave this peer, else its CPUs / peers on this host; more than the "
     "bound CPUs: a warning)"},
    {"device", CUSTOM(OPT_DEVICE), "cpu|cuda|devsim",
     "compute backend (default cpu; devsim: a GPU test double for tests)"},
    {"gpu", INT_FIELD(gpu, 0, 1023), "N",
     "cuda: device index among the visible ones (default: local rank)"},
    {"precision", CUSTOM(OPT_PRECISION), "fp32|tf32|bf16-amp",
     "math mode: cuda default tf32 where the GPU has it; cpu fp32 or "
     "bf16-amp (oneDNN bfloat16 kernels; MESHTRAIN_CPU_BF16=emulate "
     "where the CPU has none)"},
    {"summary", SWITCH_FIELD(summary), NULL,
     "print the model's layer table and exit"},
    {"data", STRING_FIELD(data), "SPEC",
     "synthetic[:N], fashion-mnist[:DIR], cifar10:DIR, imagefolder:DIR "
     "(default synthetic)"},
    {"data-threads", INT_FIELD(data_threads, 1, 256), "N",
     "data loader threads per peer (default 2)"},
    {"augment", CUSTOM(OPT_AUGMENT), "on|off",
     "training augmentation (default: the data set's)"},
    {"on-bad-sample", CUSTOM(OPT_ON_BAD), "fail|skip",
     "a corrupt sample stops training, or is replaced (default fail)"},
    {"batch", INT_FIELD(batch, 1, 1 << 20), "B",
     "samples per peer and micro-batch (default 32)"},
    {"accumulate", INT_FIELD(accumulate, 1, 1 << 16), "K",
     "micro-batches per step (default 1)"},
    {"epochs", DOUBLE_FIELD(epochs, 1e-9, 1e6), "E",
     "training length in epochs (default 1)"},
    {"iters", U64_FIELD(iters, 1, LONG_MAX), "N",
     "training length in steps (overrides --epochs)"},
    {"lr", DOUBLE_FIELD(lr.base_lr, 0, 1e6), "LR",
     "learning rate after warmup (default 0.1)"},
    {"momentum", FLOAT_FIELD(sgd.momentum, 0, 1), "M",
     "SGD momentum (default 0.9)"},
    {"weight-decay", FLOAT_FIELD(sgd.weight_decay, 0, 1), "WD",
     "L2 weight decay (default 1e-4)"},
    {"nesterov", SWITCH_FIELD(sgd.nesterov), NULL, "Nesterov momentum"},
    {"lr-schedule", CUSTOM(OPT_LR_SCHEDULE), "const|step|cosine",
     "learning-rate schedule over the run (default const)"},
    {"warmup-epochs", DOUBLE_FIELD(lr.warmup_epochs, 0, 1e6), "E",
     "linear warmup from 0.1 x lr (default 0)"},
    {"milestones", CUSTOM(OPT_MILESTONES), "E1,E2,..",
     "epochs where step multiplies lr by 0.1 (default 30,60,80)"},
    {"label-smoothing", FLOAT_FIELD(label_smoothing, 0, 0.999), "S",
     "label smoothing of the loss (default 0)"},
    {"bucket-mb", DOUBLE_FIELD(bucket_mb, 1e-6, 1 << 20), "MB",
     "gradient bucket size in MiB (default 25; the first is <= 1)"},
    {"chunk-mb", DOUBLE_FIELD(chunk_mb, 1e-6, 1 << 20), "MB",
     "device backends: pipeline chunks of a bucket in MiB (default 4)"},
    {"compress", CUSTOM(OPT_COMPRESS), "none|fp16|bf16|topk:R|threshold:T",
     "gradients on the wire: 16-bit, or sparse pairs of the largest |g| "
     "(a fraction R, or |g| >= T; then ,fp16 or ,bf16 too; default none)"},
    {"no-error-feedback", SWITCH_FIELD(no_error_feedback), NULL,
     "topk/threshold: drop what was not sent (default: add it to the "
     "next step's gradients)"},
    {"algo", CUSTOM(OPT_ALGO),
     "ring|tree|direct|rd|rhd|hier|htree|hrd|local|auto|ps",
     "all-reduce algorithm (default auto; ps with --simulate-compute "
     "only)"},
    {"verify-every", U64_FIELD(verify_every, 0, LONG_MAX), "N",
     "compare weight digests every N steps, 0: only at start (default 100)"},
    {"eval-every", DOUBLE_FIELD(eval_every, 0, 1e6), "E",
     "top-1/top-5 on the test split every E epochs, and at the end "
     "(default 1)"},
    {"no-eval", SWITCH_FIELD(no_eval), NULL, "no evaluation at all"},
    {"checkpoint-every", U64_FIELD(checkpoint_every, 0, LONG_MAX), "N",
     "checkpoint every N steps (default 0: never; needs --checkpoint-dir)"},
    {"checkpoint-dir", STRING_FIELD(checkpoint_dir), "DIR",
     "checkpoints go to DIR/rank-R (one per peer)"},
    {"keep", INT_FIELD(keep, 1, 1000000), "N",
     "checkpoints kept per peer (default 3)"},
    {"resume", CUSTOM(OPT_RESUME), "[=if-any]",
     "continue from the newest checkpoint every peer holds; none usable "
     "is an error, or with =if-any a start from step 0"},
    {"save", STRING_FIELD(save), "FILE",
     "final weights as safetensors (rank 0, torchvision's names)"},
    {"init", STRING_FIELD(init), "FILE",
     "start from safetensors weights in torchvision's names (another "
     "--num-classes: fc re-initialised)"},
    {"init-skip", STRING_FIELD(init_skip), "PATTERN",
     "--init keeps these tensors fresh, e.g. fc or layer4.1,fc"},
    {"freeze", STRING_FIELD(freeze), "PATTERN",
     "keep these parameters fixed, not all-reduced; their BN uses running "
     "statistics, e.g. conv1,bn1,layer1"},
    {"eval-only", SWITCH_FIELD(eval_only), NULL,
     "with --init or --resume: evaluate the test split, no training"},
    {"predict", STRING_FIELD(predict), "DIR",
     "at the end: top-5 classes of every JPEG under DIR, as CSV (rank 0)"},
    {"predict-out", STRING_FIELD(predict_out), "FILE",
     "--predict's CSV (default predictions.csv)"},
    {"metrics", STRING_FIELD(metrics), "FILE",
     "one JSON object per step (rank 0)"},
    {"timeline", STRING_FIELD(timeline), "FILE",
     "Chrome trace of the first steps (rank 0; Perfetto)"},
    {"timeline-steps", U64_FIELD(timeline_steps, 1, 1000000), "N",
     "steps recorded by --timeline (default 20)"},
    {"log-every", U64_FIELD(log_every, 0, LONG_MAX), "N",
     "progress line every N steps when not on a TTY (default 10)"},
    {"quiet", SWITCH_FIELD(quiet), NULL, "no progress lines"},
    {"elastic", SWITCH_FIELD(elastic), NULL,
     "survive dead peers: the survivors agree on a new view and redo the "
     "step (doc/elastic.md)"},
    {"min-peers", INT_FIELD(min_peers, 1, 64), "M",
     "--elastic: stop (exit 6) when a view has fewer peers (default 1)"},
    {"elastic-lr", SWITCH_FIELD(elastic_lr), NULL,
     "--elastic: scale lr by the view's share of the peers (linear rule)"},
    {"keep-global-batch", SWITCH_FIELD(keep_global_batch), NULL,
     "--elastic: keep the global batch by accumulating more micro-batches"},
    {"simulate-compute", STRING_FIELD(simulate), "k80|h200|CSV",
     "wait each layer's profiled time instead of computing (no data)"},
    {"simulate-scale", DOUBLE_FIELD(simulate_scale, 1, 1e6), "K",
     "simulated: gradient bytes / K on the wire (default 1)"},
    {"simulate-gpus", INT_FIELD(simulate_gpus, 1, 64), "G",
     "simulated: each peer stands for G GPUs, their mean summed here "
     "(default 1)"},
    {"profile-layers", STRING_FIELD(profile_layers), "FILE",
     "per-layer forward/backward ms as CSV (rank 0; --simulate-compute)"},
    {"help", CUSTOM(OPT_HELP), NULL, "print this help and exit"},
};

static void usage(FILE *f)
{
    size_t i;

    fprintf(f, "usage: meshrun -np N [-H hosts | --hostfile F] -- meshtrain "
               "[OPTIONS]\n"
               "       meshtrain [MESH OPTIONS] [OPTIONS]\n"
               "Synchronous data-parallel training of ResNets over a "
               "peer-to-peer mesh.\n\nTraining options:\n");
    for (i = 0; i < MESH_ARRAY_SIZE(opts); i++) {
        char left[96]; /* the longest, --algo's list of names, whole */

        snprintf(left, sizeof(left), "--%s%s%s", opts[i].name,
                 opts[i].arg && opts[i].arg[0] != '[' ? " " : "",
                 opts[i].arg ? opts[i].arg : "");
        fprintf(f, "  %-28s %s\n", left, opts[i].help);
    }
    fprintf(f, "\n%s\n%s", mesh_opts_help(), mesh_exit_help());
}

/* Flag values, worded as mesh_parse_long() words the mesh flags. */
static int parse_long(const char *flag, const char *s, long lo, long hi,
                      long *out)
{
    char what[64];

    snprintf(what, sizeof(what), "--%s", flag);
    return mesh_parse_long(what, s, lo, hi, out);
}

static int parse_double(const char *flag, const char *s, double lo, double hi,
                        double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return mesh_err(-EINVAL, "--%s '%s': expected a number from %g to %g",
                        flag, s, lo, hi);
    *out = v;
    return 0;
}

static int parse_milestones(const char *s, struct mesh_nn_lr_sched *l)
{
    char buf[256], *tok, *save = NULL;
    int n = 0, rc;

    if (strlen(s) >= sizeof(buf))
        return mesh_err(-EINVAL, "--milestones: too long");
    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        double v;

        if (n == (int)MESH_ARRAY_SIZE(l->milestones))
            return mesh_err(-EINVAL, "--milestones: at most %d",
                            (int)MESH_ARRAY_SIZE(l->milestones));
        rc = parse_double("milestones", tok, 0, 1e9, &v);
        if (rc < 0)
            return rc;
        if (n > 0 && v <= l->milestones[n - 1])
            return mesh_err(-EINVAL,
                            "--milestones: \"%s\" is not "
                            "ascending",
                            s);
        l->milestones[n++] = v;
    }
    l->num_milestones = n;
    return 0;
}

/* --model NAME: one of mesh_nn_arch_list()'s "a, b, c". */
static int check_model(const char *name)
{
    const char *list = mesh_nn_arch_list(), *p = list;
    size_t n = strlen(name);

    while (n && (p = strstr(p, name)) != NULL) {
        if ((p == list || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return 0;
        p += n;
    }
    return mesh_err(-EINVAL, "--model \"%s\": unknown model (%s)", name, list);
}

static int apply_custom(struct train_cfg *c, int id, const char *name,
                        const char *arg)
{
    int rc = 0;

    switch (id) {
    case OPT_MODEL:
        rc = check_model(arg);
        c->model.arch = arg;
        break;
    case OPT_DEVICE:
        /* unknown, or not built: said now, not after the data is read */
        rc = mesh_nn_backend_check(arg);
        if (rc < 0)
            rc = mesh_err_prefix(rc, "--device %s", arg);
        c->device = arg;
        break;
    case OPT_PRECISION:
        rc = mesh_nn_precision_parse(arg, &c->precision);
        if (rc < 0)
            rc = mesh_err_prefix(rc, "--%s", name);
        break;
    case OPT_AUGMENT:
        if (!strcmp(arg, "on"))
            c->augment = 1;
        else if (!strcmp(arg, "off"))
            c->augment = 0;
        else
            rc = mesh_err(-EINVAL, "--augment: \"%s\" is not on or off", arg);
        break;
    case OPT_ON_BAD:
        rc = mesh_data_parse_bad(arg, &c->on_bad);
        break;
    case OPT_LR_SCHEDULE:
        rc = mesh_nn_lr_parse(arg, &c->lr.kind);
        if (rc < 0)
            rc = mesh_err_prefix(rc, "--%s", name);
        break;
    case OPT_MILESTONES:
        rc = parse_milestones(arg, &c->lr);
        break;
    case OPT_COMPRESS:
        rc = train_compress_parse(arg, c);
        break;
    case OPT_ALGO:
        /* ps: checked in main (only with --simulate-compute) */
        rc = mesh_algo_parse(arg, &c->algo);
        if (rc < 0)
            rc = mesh_err_prefix(rc, "--%s", name);
        break;
    case OPT_RESUME:
        if (!arg)
            c->resume = TRAIN_RESUME_REQUIRED;
        else if (!strcmp(arg, "if-any"))
            c->resume = TRAIN_RESUME_IF_ANY;
        else
            rc = mesh_err(-EINVAL,
                          "--resume=%s: expected --resume or "
                          "--resume=if-any",
                          arg);
        break;
    default:
        rc = mesh_err(-EINVAL, "internal error: option %d", id);
    }
    return rc;
}

/* Flag o with value arg (NULL for a switch) into its field of c. */
static int apply_opt(struct train_cfg *c, const struct opt_doc *o,
                     const char *arg)
{
    char *field = (char *)c + o->offset;
    long v = 0;
    double d = 0;
    int rc = 0;

    if (o->kind == OPT_CUSTOM)
        return apply_custom(c, o->id, o->name, arg);
    if (o->kind == OPT_INT || o->kind == OPT_U64)
        rc = parse_long(o->name, arg, o->lo, o->hi, &v);
    else if (o->kind == OPT_DOUBLE || o->kind == OPT_FLOAT)
        rc = parse_double(o->name, arg, o->dlo, o->dhi, &d);
    if (rc < 0)
        return rc;
    switch (o->kind) {
    case OPT_SWITCH:
        *(int *)field = 1;
        break;
    case OPT_STRING:
        *(const char **)field = arg;
        break;
    case OPT_INT:
        *(int *)field = (int)v;
        break;
    case OPT_U64:
        *(uint64_t *)field = (uint64_t)v;
        break;
    case OPT_DOUBLE:
        *(double *)field = d;
        break;
    case OPT_FLOAT:
        *(float *)field = (float)d;
        break;
    case OPT_CUSTOM:
        break;
    }
    return 0;
}

/*
 * Mesh flags first (mesh/mesh.h), then the table above; "--flag value" and
 * "--flag=value" both work. Returns 1 for --help.
 */
static int parse_args(int argc, char **argv, struct mesh_opts *mo,
                      struct train_cfg *c)
{
    int i = 1, rc;

    while (i < argc) {
        const char *a = argv[i], *val = NULL, *eq;
        size_t k, len;

        rc = mesh_opts_parse_arg(mo, argc, argv, &i);
        if (rc < 0)
            return rc;
        if (rc == 1)
            continue;
        if (!strcmp(a, "-h"))
            return 1;
        if (strncmp(a, "--", 2) != 0)
            return mesh_err(-EINVAL,
                            "unexpected argument \"%s\" (see "
                            "--help)",
                            a);
        a += 2;
        eq = strchr(a, '=');
        len = eq ? (size_t)(eq - a) : strlen(a);
        for (k = 0; k < MESH_ARRAY_SIZE(opts); k++)
            if (strlen(opts[k].name) == len && !strncmp(opts[k].name, a, len))
                break;
        if (k == MESH_ARRAY_SIZE(opts))
            return mesh_err(-EINVAL, "unknown option \"%s\" (see --help)",
                            argv[i]);
        if (opts[k].kind == OPT_CUSTOM && opts[k].id == OPT_HELP)
            return 1;
        if (opts[k].arg) {
            if (eq) {
                val = eq + 1;
            } else if (opts[k].arg[0] == '[') {
                val = NULL; /* optional: only "--name=value" gives one */
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                return mesh_err(-EINVAL, "--%s needs a value %s", opts[k].name,
                                opts[k].arg);
            }
        } else if (eq) {
            return mesh_err(-EINVAL, "--%s takes no value", opts[k].name);
        }
        rc = apply_opt(c, &opts[k], val);
        if (rc < 0)
            return rc;
        i++;
    }
    return 0;
}

/* Nothing names hosts or a world size: flags, MESHTRAIN_*, Slurm, MPI. */
static int lone_process(const struct mesh_opts *mo)
{
    static const char *const vars[] = {
        "MESHTRAIN_HOSTFILE", "MESHTRAIN_HOSTS",      "MESHTRAIN_SIZE",
        "SLURM_NTASKS",       "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
    };
    size_t i;

    if (mo->hosts || mo->hostfile)
        return 0;
    for (i = 0; i < MESH_ARRAY_SIZE(vars); i++) {
        const char *v = getenv(vars[i]);

        if (v && *v)
            return 0;
    }
    return 1;
}

static int summary(const struct train_cfg *c)
{
    struct mesh_nn_ctx *ctx = NULL;
    struct mesh_nn_model *m = NULL;
    int rc;

    rc = mesh_nn_ctx_open(c->device, c->threads, &ctx);
    if (rc == 0)
        rc = mesh_nn_model_create(ctx, &c->model, &m);
    if (rc == 0)
        mesh_nn_model_summary(m, stdout);
    mesh_nn_model_destroy(m);
    mesh_nn_ctx_close(ctx);
    return rc;
}

/*
 * The files rank 0 writes, the checkpoint folder and the weights and
 * folder every peer reads (--init, --predict), checked before anything
 * runs: a FIFO would block the open until a writer or reader came, and a
 * directory or a device would fail only after training.
 */
static int check_outputs(const struct train_cfg *c, int rank)
{
    const struct {
        const char *flag, *path;
    } outs[] = {
        {"--metrics", c->metrics},
        {"--timeline", c->timeline},
        {"--save", c->save},
        {"--profile-layers", c->profile_layers},
        {"--predict-out", c->predict ? c->predict_out : NULL},
    };
    struct stat st;
    size_t k;
    int rc;

    /* every peer writes DIR/rank-R: DIR is made when missing */
    if (c->checkpoint_dir && stat(c->checkpoint_dir, &st) == 0 &&
        !S_ISDIR(st.st_mode))
        return mesh_err(-ENOTDIR, "--checkpoint-dir %s is %s, not a directory",
                        c->checkpoint_dir, mesh_file_type_name(st.st_mode));
    /* every peer reads --init and lists --predict's folder */
    if (c->init) {
        int fd;

        if ((rc = mesh_open_input("--init", c->init, 0, &fd, NULL)) < 0)
            return rc;
        close(fd);
    }
    if (c->predict) {
        if (stat(c->predict, &st) != 0)
            return mesh_err_errno("--predict %s", c->predict);
        if (!S_ISDIR(st.st_mode))
            return mesh_err(-ENOTDIR, "--predict %s is %s, not a directory",
                            c->predict, mesh_file_type_name(st.st_mode));
    }
    if (rank != 0)
        return 0;
    for (k = 0; k < MESH_ARRAY_SIZE(outs); k++)
        if (outs[k].path &&
            (rc = mesh_check_output(outs[k].flag, outs[k].path)) < 0)
            return rc;
    return 0;
}

int main(int argc, char **argv)
{
    struct train_cfg c;
    struct mesh_opts mo;
    int rc, code, lone, level = -1;

    setvbuf(stdout, NULL, _IOLBF, 0);
    train_cfg_init(&c);
    mesh_opts_init(&mo);
    rc = parse_args(argc, argv, &mo, &c);
    if (rc > 0) {
        usage(stdout);
        return MESH_EXIT_OK;
    }
    if (rc < 0) {
        fprintf(stderr, "meshtrain: %s\n", mesh_err_msg(rc));
        return MESH_EXIT_USAGE;
    }
    if (c.summary) {
        rc = summary(&c);
        if (rc < 0)
            fprintf(stderr, "meshtrain: %s\n", mesh_err_msg(rc));
        return rc < 0 ? MESH_EXIT_USAGE : MESH_EXIT_OK;
    }
    if (c.simulate &&
        (c.resume || c.save || c.checkpoint_every || c.profile_layers)) {
        fprintf(stderr,
                "meshtrain: --simulate-compute has no weights: "
                "--resume, --save, --checkpoint-every and --profile-layers "
                "need real compute\n");
        return MESH_EXIT_USAGE;
    }
    if (c.simulate && (c.init || c.freeze || c.eval_only)) {
        fprintf(stderr, "meshtrain: --simulate-compute has no weights: "
                        "--init, --freeze and --eval-only need real "
                        "compute\n");
        return MESH_EXIT_USAGE;
    }
    if (c.init_skip && !c.init) {
        fprintf(stderr, "meshtrain: --init-skip needs --init\n");
        return MESH_EXIT_USAGE;
    }
    if (c.predict_out && !c.predict) {
        fprintf(stderr, "meshtrain: --predict-out needs --predict\n");
        return MESH_EXIT_USAGE;
    }
    if (c.predict && !c.predict_out)
        c.predict_out = "predictions.csv";
    if (c.simulate && c.predict) {
        fprintf(stderr, "meshtrain: --simulate-compute has no weights: "
                        "--predict needs real compute\n");
        return MESH_EXIT_USAGE;
    }
    if (c.eval_only && c.no_eval) {
        fprintf(stderr, "meshtrain: --eval-only and --no-eval contradict "
                        "each other\n");
        return MESH_EXIT_USAGE;
    }
    if (c.eval_only && !c.init && !c.resume) {
        fprintf(stderr, "meshtrain: --eval-only needs weights: --init FILE "
                        "or --resume\n");
        return MESH_EXIT_USAGE;
    }
    if (c.algo == MESH_ALGO_PS && !c.simulate) {
        fprintf(stderr,
                "meshtrain: --algo: ps is a benchmark baseline "
                "(meshbench, and meshtrain with --simulate-compute), use "
                "ring, tree, direct, rd, rhd, hier, htree, hrd, local or "
                "auto\n");
        return MESH_EXIT_USAGE;
    }
    if (c.simulate_scale != 1 && !c.simulate) {
        fprintf(stderr, "meshtrain: --simulate-scale needs "
                        "--simulate-compute\n");
        return MESH_EXIT_USAGE;
    }
    if (c.simulate_gpus != 1 && !c.simulate) {
        fprintf(stderr, "meshtrain: --simulate-gpus needs "
                        "--simulate-compute\n");
        return MESH_EXIT_USAGE;
    }
    if (c.no_error_feedback && !c.sparse.kind) {
        fprintf(stderr, "meshtrain: --no-error-feedback needs --compress "
                        "topk:R or threshold:T\n");
        return MESH_EXIT_USAGE;
    }
    if (c.resume && !c.checkpoint_dir) {
        fprintf(stderr, "meshtrain: --resume needs --checkpoint-dir\n");
        return MESH_EXIT_USAGE;
    }
    /* there is no default directory: checkpoints nobody asked to put
     * anywhere would silently not exist */
    if (c.checkpoint_every && !c.checkpoint_dir) {
        fprintf(stderr, "meshtrain: --checkpoint-every needs "
                        "--checkpoint-dir\n");
        return MESH_EXIT_USAGE;
    }
    lone = lone_process(&mo);
    if (lone) {
        /* No hosts anywhere: a world of one, which has no peer to
         * authenticate and joins no mesh (train_run skips it), so the
         * warning about running without a secret would mislead. */
        mo.hosts = "localhost:1";
        if (mo.insecure < 0 && !mo.secret_file) {
            mo.insecure = 1;
            level = mesh_log_enabled(MESH_LOG_DEBUG)  ? MESH_LOG_DEBUG
                    : mesh_log_enabled(MESH_LOG_INFO) ? MESH_LOG_INFO
                    : mesh_log_enabled(MESH_LOG_WARN) ? MESH_LOG_WARN
                                                      : MESH_LOG_ERROR;
            mesh_log_set_level(MESH_LOG_ERROR);
        }
    }
    rc = mesh_opts_finish(&mo);
    if (level >= 0)
        mesh_log_set_level((enum mesh_log_level)level);
    if (rc < 0) {
        fprintf(stderr, "meshtrain: %s\n", mesh_err_msg(rc));
        mesh_opts_free(&mo);
        return MESH_EXIT_USAGE;
    }
    /* --elastic: the views' meshes differ in size (transport.h) */
    mo.topts.views = c.elastic;
    rc = check_outputs(&c, mo.rank);
    if (rc < 0) {
        fprintf(stderr, "meshtrain: %s\n", mesh_err_msg(rc));
        mesh_opts_free(&mo);
        return MESH_EXIT_USAGE;
    }
    code = train_run(&c, &mo);
    mesh_opts_free(&mo);
    return code;
}
