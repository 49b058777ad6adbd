/*
 * nn/resnet.c: the ResNet family exactly as torchvision (v1.5) lays it out:
 * building the tensor table and slabs, torchvision's initialisation,
 * forward, loss and backward with the gradient-ready callback.
 *
 * Per block, forward keeps what backward needs:
 *   a[i] = conv_i(prev)            (conv outputs, BN's backward input)
 *   o[i] = relu(bn_i(a[i]))        (fused in one op; i < last)
 *   o[last] = bn_last(a[last]);  o[last] = relu(o[last] + shortcut)
 * where the shortcut is x, or bn_d(conv_d(x)) = od (from ad) on a stage's
 * first block. Backward uses three scratch buffers of the largest
 * activation, chosen per step so that nothing live is overwritten.
 */
#include "config.h"

#include "nn/model-internal.h"
#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPS(m) ((m)->ctx->ops)
#define DEV(m) ((m)->ctx->dev)

struct arch {
    const char *name;
    int bottleneck;
    int layers[4];
};

static const struct arch archs[] = {
    {"resnet18", 0, {2, 2, 2, 2}},   {"resnet34", 0, {3, 4, 6, 3}},
    {"resnet50", 1, {3, 4, 6, 3}},   {"resnet101", 1, {3, 4, 23, 3}},
    {"resnet152", 1, {3, 8, 36, 3}},
};

const char *mesh_nn_arch_list(void)
{
    return "resnet18, resnet34, resnet50, resnet101, resnet152";
}

/* ---- tensor table -------------------------------------------------------- */

static int add_tensor(struct mesh_nn_model *m, const char *name, int kind,
                      int role, int ndim, const int64_t *shape)
{
    struct mesh_nn_tensor *t;
    size_t count = 1;
    int i;

    if (mesh_array_reserve(&m->t, &m->nt_alloc, (size_t)m->nt + 1,
                           sizeof(*m->t), "nn: tensors") < 0)
        return -ENOMEM;
    t = &m->t[m->nt++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->kind = kind;
    t->role = role;
    t->ndim = ndim;
    for (i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        count *= (size_t)shape[i];
    }
    t->count = count;
    if (kind == MESH_NN_PARAM) {
        t->offset = m->nparams;
        m->nparams += count;
    } else {
        t->offset = m->nbuffers;
        m->nbuffers += count;
    }
    if (count > m->max_tensor)
        m->max_tensor = count;
    return 0;
}

static int def_conv(struct mesh_nn_model *m, struct nn_conv *c,
                    const char *name, int cin, int cout, int k, int stride,
                    int pad)
{
    int64_t shape[4] = {cout, cin, k, k};
    char full[48];

    c->cin = cin;
    c->cout = cout;
    c->k = k;
    c->stride = stride;
    c->pad = pad;
    c->w = m->nparams;
    snprintf(full, sizeof(full), "%s.weight", name);
    return add_tensor(m, full, MESH_NN_PARAM, MESH_NN_ROLE_CONV_WEIGHT, 4,
                      shape);
}

/* BN params now; its buffers are added after every param (bn_buffers). */
static int def_bn(struct mesh_nn_model *m, struct nn_bn *b, const char *name,
                  int c, int relu)
{
    int64_t shape[1] = {c};
    char full[48];
    int rc;

    b->c = c;
    b->relu = relu;
    b->g = m->nparams;
    snprintf(full, sizeof(full), "%s.weight", name);
    rc = add_tensor(m, full, MESH_NN_PARAM, MESH_NN_ROLE_BN_WEIGHT, 1, shape);
    if (rc == 0) {
        snprintf(full, sizeof(full), "%s.bias", name);
        rc = add_tensor(m, full, MESH_NN_PARAM, MESH_NN_ROLE_BN_BIAS, 1, shape);
    }
    return rc;
}

/* The BN's running statistics, named after its weight tensor. */
static int def_bn_buffers(struct mesh_nn_model *m, struct nn_bn *b)
{
    int64_t shape[1] = {b->c};
    char full[48], base[48] = "";
    int i, rc, len = -1;

    /* the weight's name, copied: add_tensor may move m->t */
    for (i = 0; i < m->nt; i++)
        if (m->t[i].kind == MESH_NN_PARAM && m->t[i].offset == b->g) {
            len = (int)strlen(m->t[i].name) - (int)strlen(".weight");
            snprintf(base, sizeof(base), "%s", m->t[i].name);
        }
    if (len < 0)
        return mesh_err(-EINVAL, "nn: internal error: BN without weight");
    b->rm = m->nbuffers;
    snprintf(full, sizeof(full), "%.*s.running_mean", len, base);
    rc = add_tensor(m, full, MESH_NN_BUFFER, MESH_NN_ROLE_BN_MEAN, 1, shape);
    if (rc == 0) {
        snprintf(full, sizeof(full), "%.*s.running_var", len, base);
        rc = add_tensor(m, full, MESH_NN_BUFFER, MESH_NN_ROLE_BN_VAR, 1, shape);
    }
    return rc;
}

/* ---- the layer walk ---------------------------------------------------- */

static const struct arch *arch_find(const char *name)
{
    for (size_t i = 0; name && i < MESH_ARRAY_SIZE(archs); i++)
        if (strcmp(name, archs[i].name) == 0)
            return &archs[i];
    return NULL;
}

/* The main path's conv j of a block whose first conv takes cin channels:
 * bottleneck 1x1, 3x3 (stride s), 1x1 to 4 x planes; basic 3x3 (stride s),
 * 3x3. */
static void block_conv(struct mesh_nn_resnet_conv *c, int bottleneck, int cin,
                       int planes, int s)
{
    int j = c->j;

    c->cin = j == 0 ? cin : planes;
    if (bottleneck) {
        c->cout = j == 2 ? planes * 4 : planes;
        c->k = j == 1 ? 3 : 1;
        c->stride = j == 1 ? s : 1;
        c->pad = j == 1 ? 1 : 0;
    } else {
        c->cout = planes;
        c->k = 3;
        c->stride = j == 0 ? s : 1;
        c->pad = 1;
    }
    c->relu = j < c->nconv - 1;
    snprintf(c->conv, sizeof(c->conv), "%s.conv%d", c->block, j + 1);
    snprintf(c->bn, sizeof(c->bn), "%s.bn%d", c->block, j + 1);
}

int mesh_nn_resnet_walk(const struct mesh_nn_model_cfg *cfg,
                        mesh_nn_resnet_visit_fn visit, void *arg, int *feat)
{
    const struct arch *a = arch_find(cfg->arch);
    struct mesh_nn_resnet_conv c;
    int expansion, inplanes, stage, i, rc;

    if (!a)
        return mesh_err(-EINVAL, "nn: unknown model \"%s\" (%s)",
                        cfg->arch ? cfg->arch : "(none)", mesh_nn_arch_list());
    expansion = a->bottleneck ? 4 : 1;
    inplanes = cfg->width;
    memset(&c, 0, sizeof(c));
    snprintf(c.conv, sizeof(c.conv), "conv1");
    snprintf(c.bn, sizeof(c.bn), "bn1");
    c.index = -1;
    c.cin = cfg->in_channels;
    c.cout = cfg->width;
    c.k = cfg->cifar_stem ? 3 : 7;
    c.stride = cfg->cifar_stem ? 1 : 2;
    c.pad = cfg->cifar_stem ? 1 : 3;
    c.relu = 1;
    rc = visit(arg, &c);
    c.index = 0;
    for (stage = 0; stage < 4 && rc == 0; stage++) {
        int planes = cfg->width << stage;

        for (i = 0; i < a->layers[stage] && rc == 0; i++, c.index++) {
            int s = i == 0 && stage > 0 ? 2 : 1;
            int cin = i == 0 ? inplanes : planes * expansion;

            snprintf(c.block, sizeof(c.block), "layer%d.%d", stage + 1, i);
            c.nconv = a->bottleneck ? 3 : 2;
            c.has_ds = i == 0 && (s != 1 || inplanes != planes * expansion);
            for (c.j = 0; c.j < c.nconv && rc == 0; c.j++) {
                block_conv(&c, a->bottleneck, cin, planes, s);
                rc = visit(arg, &c);
            }
            if (rc == 0 && c.has_ds) {
                c.cin = cin;
                c.cout = planes * expansion;
                c.k = 1;
                c.stride = s;
                c.pad = 0;
                c.relu = 0;
                snprintf(c.conv, sizeof(c.conv), "%s.downsample.0", c.block);
                snprintf(c.bn, sizeof(c.bn), "%s.downsample.1", c.block);
                rc = visit(arg, &c);
            }
        }
        inplanes = planes * expansion;
    }
    if (rc == 0)
        *feat = inplanes;
    return rc;
}

/*
 * fn on every BN of the model in its order: bn1, then each block's, its
 * downsample's last. Stops at the first error.
 */
static int each_bn(struct mesh_nn_model *m,
                   int (*fn)(struct mesh_nn_model *m, struct nn_bn *b))
{
    int rc = fn(m, &m->bn1);

    for (int i = 0; i < m->nblocks && rc == 0; i++) {
        struct nn_block *b = &m->blocks[i];

        for (int j = 0; j < b->nconv && rc == 0; j++)
            rc = fn(m, &b->b[j]);
        if (rc == 0 && b->has_ds)
            rc = fn(m, &b->bd);
    }
    return rc;
}

/* define()'s visitor: a conv and its BN into their places in the model. */
static int define_conv(void *arg, const struct mesh_nn_resnet_conv *c)
{
    struct mesh_nn_model *m = arg;
    struct nn_conv *conv = &m->conv1;
    struct nn_bn *bn = &m->bn1;
    int rc;

    if (c->index >= 0) {
        struct nn_block *b = &m->blocks[c->index];

        if (c->j == 0) {
            snprintf(b->name, sizeof(b->name), "%s", c->block);
            b->bottleneck = c->nconv == 3;
            b->nconv = c->nconv;
            b->has_ds = c->has_ds;
        }
        conv = c->j < c->nconv ? &b->c[c->j] : &b->cd;
        bn = c->j < c->nconv ? &b->b[c->j] : &b->bd;
    }
    rc = def_conv(m, conv, c->conv, c->cin, c->cout, c->k, c->stride, c->pad);
    if (rc == 0)
        rc = def_bn(m, bn, c->bn, c->cout, c->relu);
    return rc;
}

static int define(struct mesh_nn_model *m, const struct arch *a)
{
    int stage, nb = 0, rc;

    for (stage = 0; stage < 4; stage++)
        nb += a->layers[stage];
    m->blocks = calloc((size_t)nb, sizeof(*m->blocks));
    if (!m->blocks)
        return mesh_err(-ENOMEM, "nn: out of memory");
    m->nblocks = nb;
    rc = mesh_nn_resnet_walk(&m->cfg, define_conv, m, &m->feat);
    if (rc < 0)
        return rc;
    m->fc_w = m->nparams;
    {
        int64_t ws[2] = {m->cfg.num_classes, m->feat};
        int64_t bs[1] = {m->cfg.num_classes};

        rc = add_tensor(m, "fc.weight", MESH_NN_PARAM, MESH_NN_ROLE_FC_WEIGHT,
                        2, ws);
        if (rc == 0)
            rc = add_tensor(m, "fc.bias", MESH_NN_PARAM, MESH_NN_ROLE_FC_BIAS,
                            1, bs);
        /* backward accumulates fc's weight and bias as one range through
         * gscratch: with few features and many classes (width 8, 1000
         * classes) that range is the largest */
        if ((size_t)(ws[0] * ws[1] + bs[0]) > m->max_tensor)
            m->max_tensor = (size_t)(ws[0] * ws[1] + bs[0]);
    }
    /* buffers in the same order as their BNs */
    if (rc == 0)
        rc = each_bn(m, def_bn_buffers);
    return rc;
}

/* ---- initialisation ------------------------------------------------------ */

/*
 * A splitmix64 stream per tensor (seeded from the seed and the tensor's
 * index), so each tensor's values depend only on (seed, index) and the code
 * is the same in every process: same seed, bitwise same weights.
 */
struct rng {
    uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1), 53 bits. */
static double rng_unif(struct rng *r)
{
    return ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_normal(struct rng *r)
{
    double u1 = rng_unif(r), u2 = rng_unif(r);

    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int init_weights(struct mesh_nn_model *m)
{
    float *p = NULL, *bufs = NULL;
    int i, rc;
    size_t k;

    p = malloc(m->nparams * sizeof(float));
    bufs = malloc((m->nbuffers ? m->nbuffers : 1) * sizeof(float));
    if (!p || !bufs) {
        rc = mesh_err(-ENOMEM, "nn: out of memory");
        goto out;
    }
    for (i = 0; i < m->nt; i++) {
        const struct mesh_nn_tensor *t = &m->t[i];
        struct rng r = {m->cfg.seed * 0x2545f4914f6cdd1dULL + (uint64_t)i};
        float *dst = (t->kind == MESH_NN_PARAM ? p : bufs) + t->offset;
        double bound;

        rng_next(&r);
        switch (t->role) {
        case MESH_NN_ROLE_CONV_WEIGHT: {
            /* kaiming_normal_(mode="fan_out", nonlinearity="relu") */
            double fan_out = (double)t->shape[0] * t->shape[2] * t->shape[3];
            double sd = sqrt(2.0 / fan_out);

            for (k = 0; k < t->count; k++)
                dst[k] = (float)(sd * rng_normal(&r));
            break;
        }
        case MESH_NN_ROLE_BN_WEIGHT:
        case MESH_NN_ROLE_BN_VAR:
            for (k = 0; k < t->count; k++)
                dst[k] = 1.f;
            break;
        case MESH_NN_ROLE_BN_BIAS:
        case MESH_NN_ROLE_BN_MEAN:
            memset(dst, 0, t->count * sizeof(float));
            break;
        case MESH_NN_ROLE_FC_WEIGHT:
        case MESH_NN_ROLE_FC_BIAS:
            /*
             * nn.Linear's default: kaiming_uniform_(a=sqrt(5)) for the
             * weight and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias;
             * both bounds are 1/sqrt(fan_in).
             */
            bound = 1.0 / sqrt((double)m->feat);
            for (k = 0; k < t->count; k++)
                dst[k] = (float)(bound * (2.0 * rng_unif(&r) - 1.0));
            break;
        }
    }
    if (m->cfg.zero_init_residual) {
        for (i = 0; i < m->nblocks; i++) {
            struct nn_block *b = &m->blocks[i];

            memset(p + b->b[b->nconv - 1].g, 0,
                   (size_t)b->b[b->nconv - 1].c * sizeof(float));
        }
    }
    rc = OPS(m)->upload(DEV(m), m->params, p, m->nparams * sizeof(float));
    if (rc == 0 && m->nbuffers)
        rc = OPS(m)->upload(DEV(m), m->buffers, bufs,
                            m->nbuffers * sizeof(float));
out:
    free(p);
    free(bufs);
    return rc;
}

/* ---- create / destroy ---------------------------------------------------- */

static void free_batch(struct mesh_nn_model *m)
{
    const struct mesh_nn_backend_ops *o = OPS(m);
    struct mesh_nn_dev *d = DEV(m);
    int i, j;

#define FREE(p)                                                                \
    do {                                                                       \
        if (p)                                                                 \
            o->free(d, p);                                                     \
        (p) = NULL;                                                            \
    } while (0)
    FREE(m->in);
    FREE(m->a0);
    FREE(m->o0);
    FREE(m->p0);
    FREE(m->pool_res);
    FREE(m->pooled);
    FREE(m->logits);
    FREE(m->dlogits);
    FREE(m->labels);
    for (i = 0; i < 3; i++)
        FREE(m->g[i]);
    FREE(m->ws);
    FREE(m->bn1.reserve);
    FREE(m->conv1.reserve);
    for (i = 0; i < m->nblocks; i++) {
        struct nn_block *b = &m->blocks[i];

        FREE(b->cd.reserve);
        for (j = 0; j < b->nconv; j++) {
            FREE(b->c[j].reserve);
            FREE(b->a[j]);
            FREE(b->o[j]);
            FREE(b->b[j].reserve);
        }
        FREE(b->ad);
        FREE(b->od);
        FREE(b->bd.reserve);
    }
#undef FREE
    m->n = 0;
    m->have_loss = 0;
}

static int alloc_save(struct mesh_nn_model *m, struct nn_bn *b)
{
    return OPS(m)->alloc(DEV(m), 2 * (size_t)b->c * sizeof(float),
                         (void **)&b->save);
}

static int free_save(struct mesh_nn_model *m, struct nn_bn *b)
{
    if (b->save)
        OPS(m)->free(DEV(m), b->save);
    return 0;
}

void mesh_nn_model_destroy(struct mesh_nn_model *m)
{
    if (!m)
        return;
    free_batch(m);
    each_bn(m, free_save);
    if (m->gscratch)
        OPS(m)->free(DEV(m), m->gscratch);
    if (m->params)
        OPS(m)->free(DEV(m), m->params);
    if (m->grads)
        OPS(m)->free(DEV(m), m->grads);
    if (m->buffers)
        OPS(m)->free(DEV(m), m->buffers);
    free(m->blocks);
    free(m->t);
    free(m->lq);
    free(m);
}

/* 0, or -EINVAL naming what (and the range, if say_range) outside it. */
static int check_range(const char *what, int v, int lo, int hi, int say_range)
{
    char range[40] = "";

    if (v >= lo && v <= hi)
        return 0;
    if (say_range)
        snprintf(range, sizeof(range), " [%d, %d]", lo, hi);
    return mesh_err(-EINVAL, "nn: %s %d is out of range%s", what, v, range);
}

void mesh_nn_model_cfg_defaults(struct mesh_nn_model_cfg *cfg)
{
    if (!cfg->num_classes)
        cfg->num_classes = 1000;
    if (!cfg->in_channels)
        cfg->in_channels = 3;
    if (!cfg->image_size)
        cfg->image_size = 224;
    if (!cfg->width)
        cfg->width = 64;
}

int mesh_nn_model_create(struct mesh_nn_ctx *ctx,
                         const struct mesh_nn_model_cfg *cfg,
                         struct mesh_nn_model **out)
{
    const struct arch *a = arch_find(cfg->arch);
    struct mesh_nn_model *m;
    int rc;

    if (!a)
        return mesh_err(-EINVAL, "nn: unknown model \"%s\" (%s)",
                        cfg->arch ? cfg->arch : "(none)", mesh_nn_arch_list());
    m = calloc(1, sizeof(*m));
    if (!m)
        return mesh_err(-ENOMEM, "nn: out of memory");
    m->ctx = ctx;
    m->cfg = *cfg;
    snprintf(m->arch, sizeof(m->arch), "%s", a->name);
    m->cfg.arch = m->arch;
    mesh_nn_model_cfg_defaults(&m->cfg);
    if ((rc = check_range("num_classes", m->cfg.num_classes, 1, 1000000, 0)) <
            0 ||
        (rc = check_range("in_channels", m->cfg.in_channels, 1, 64, 1)) < 0 ||
        (rc = check_range("image size", m->cfg.image_size, 8, 4096, 1)) < 0 ||
        (rc = check_range("width", m->cfg.width, 1, 1024, 1)) < 0)
        goto fail;
    rc = define(m, a);
    if (rc < 0)
        goto fail;
    rc = OPS(m)->alloc(DEV(m), m->nparams * sizeof(float), (void **)&m->params);
    if (rc == 0)
        rc = OPS(m)->alloc(DEV(m), m->nparams * sizeof(float),
                           (void **)&m->grads);
    if (rc == 0)
        rc = OPS(m)->alloc(DEV(m), m->nbuffers * sizeof(float),
                           (void **)&m->buffers);
    if (rc == 0)
        rc = each_bn(m, alloc_save);
    if (rc == 0 && !m->cfg.no_init)
        rc = init_weights(m);
    if (rc < 0)
        goto fail;
    *out = m;
    return 0;
fail:
    mesh_nn_model_destroy(m);
    return rc;
}

/* ---- accessors ----------------------------------------------------------- */

int mesh_nn_model_num_tensors(const struct mesh_nn_model *m)
{
    return m->nt;
}

const struct mesh_nn_tensor *mesh_nn_model_tensor(const struct mesh_nn_model *m,
                                                  int i)
{
    return i >= 0 && i < m->nt ? &m->t[i] : NULL;
}

const struct mesh_nn_tensor *
mesh_nn_model_find_tensor(const struct mesh_nn_model *m, const char *name)
{
    int i;

    for (i = 0; i < m->nt; i++)
        if (strcmp(m->t[i].name, name) == 0)
            return &m->t[i];
    return NULL;
}

float *mesh_nn_model_params(struct mesh_nn_model *m)
{
    return m->params;
}
float *mesh_nn_model_grads(struct mesh_nn_model *m)
{
    return m->grads;
}
float *mesh_nn_model_buffers(struct mesh_nn_model *m)
{
    return m->buffers;
}

size_t mesh_nn_model_num_params(const struct mesh_nn_model *m)
{
    return m->nparams;
}

size_t mesh_nn_model_num_buffers(const struct mesh_nn_model *m)
{
    return m->nbuffers;
}

int64_t mesh_nn_model_batches_tracked(const struct mesh_nn_model *m)
{
    return m->batches_tracked;
}

void mesh_nn_model_set_batches_tracked(struct mesh_nn_model *m, int64_t n)
{
    m->batches_tracked = n;
}

const struct mesh_nn_model_cfg *
mesh_nn_model_config(const struct mesh_nn_model *m)
{
    return &m->cfg;
}

/* ---- summary ------------------------------------------------------------- */

static size_t conv_params(const struct nn_conv *c)
{
    return (size_t)c->cout * c->cin * c->k * c->k;
}

static void row(FILE *f, const char *name, const char *type, int c, int h,
                size_t params)
{
    char shape[32];

    snprintf(shape, sizeof(shape), "%d x %d x %d", c, h, h);
    fprintf(f, "%-24s %-22s %-18s %12zu\n", name, type, shape, params);
}

void mesh_nn_model_summary(const struct mesh_nn_model *m, FILE *f)
{
    const struct mesh_nn_model_cfg *cfg = &m->cfg;
    int h = cfg->image_size, i, j;
    char type[32], name[48];

    fprintf(f, "model: %s, %d classes, input %d x %d x %d%s%s\n", m->arch,
            cfg->num_classes, cfg->in_channels, h, h,
            cfg->cifar_stem ? ", CIFAR stem" : "",
            cfg->zero_init_residual ? ", zero-init residual BN" : "");
    fprintf(f, "%-24s %-22s %-18s %12s\n", "layer", "type",
            "output (C x H x W)", "parameters");
    h = mesh_nn_out_dim(h, m->conv1.k, m->conv1.stride, m->conv1.pad);
    snprintf(type, sizeof(type), "conv %dx%d/%d", m->conv1.k, m->conv1.k,
             m->conv1.stride);
    row(f, "conv1", type, m->cfg.width, h, conv_params(&m->conv1));
    row(f, "bn1 + relu", "batchnorm", m->cfg.width, h, 2 * m->cfg.width);
    if (!cfg->cifar_stem) {
        h = mesh_nn_out_dim(h, 3, 2, 1);
        row(f, "maxpool", "max pool 3x3/2", m->cfg.width, h, 0);
    }
    for (i = 0; i < m->nblocks; i++) {
        const struct nn_block *b = &m->blocks[i];
        int hin = h;

        for (j = 0; j < b->nconv; j++) {
            const struct nn_conv *c = &b->c[j];

            h = mesh_nn_out_dim(h, c->k, c->stride, c->pad);
            snprintf(name, sizeof(name), "%s.conv%d", b->name, j + 1);
            snprintf(type, sizeof(type), "conv %dx%d/%d", c->k, c->k,
                     c->stride);
            row(f, name, type, c->cout, h, conv_params(c));
            snprintf(name, sizeof(name), "%s.bn%d%s", b->name, j + 1,
                     j < b->nconv - 1 ? " + relu" : "");
            row(f, name, "batchnorm", c->cout, h, 2 * (size_t)c->cout);
        }
        if (b->has_ds) {
            int hd = mesh_nn_out_dim(hin, 1, b->cd.stride, 0);

            snprintf(name, sizeof(name), "%s.downsample.0", b->name);
            snprintf(type, sizeof(type), "conv 1x1/%d", b->cd.stride);
            row(f, name, type, b->cd.cout, hd, conv_params(&b->cd));
            snprintf(name, sizeof(name), "%s.downsample.1", b->name);
            row(f, name, "batchnorm", b->cd.cout, hd, 2 * (size_t)b->cd.cout);
        }
        snprintf(name, sizeof(name), "%s (add + relu)", b->name);
        row(f, name, "residual", b->c[b->nconv - 1].cout, h, 0);
    }
    row(f, "avgpool", "global average pool", m->feat, 1, 0);
    fprintf(f, "%-24s %-22s %-18d %12zu\n", "fc", "fully connected",
            cfg->num_classes,
            (size_t)cfg->num_classes * m->feat + cfg->num_classes);
    fprintf(f, "buffers: %zu (BN running statistics)\n", m->nbuffers);
    fprintf(f, "parameters: %zu\n", m->nparams);
}

/* ---- per-batch setup ----------------------------------------------------- */

static int plan(struct mesh_nn_model *m, struct mesh_nn_plan_desc *d,
                struct mesh_nn_plan **out)
{
    struct mesh_nn_plan *p;
    size_t ws;
    int rc;

    rc = mesh_nn_ctx_plan(m->ctx, d, &p);
    if (rc < 0)
        return rc;
    ws = OPS(m)->plan_workspace(p);
    if (ws > m->ws_bytes)
        m->ws_bytes = ws;
    *out = p;
    return 0;
}

static int alloc_act(struct mesh_nn_model *m, int c, int h, void **out)
{
    size_t bytes = OPS(m)->act_bytes(DEV(m), m->n, c, h, h);

    if (!bytes)
        return mesh_err(-EINVAL, "nn: bad activation shape");
    if (bytes > m->max_act)
        m->max_act = bytes;
    return OPS(m)->alloc(DEV(m), bytes, out);
}

/* A plan of kind over (n, c, h, h), every other field 0 (the cache key). */
static void plan_desc(struct mesh_nn_plan_desc *d, int kind, int n, int c,
                      int h)
{
    memset(d, 0, sizeof(*d));
    d->kind = kind;
    d->n = n;
    d->c = c;
    d->h = d->w = h;
}

static int setup_conv(struct mesh_nn_model *m, struct nn_conv *c, int h)
{
    struct mesh_nn_plan_desc d;
    size_t res;
    int rc;

    c->h = c->wd = h;
    c->oh = c->ow = mesh_nn_out_dim(h, c->k, c->stride, c->pad);
    if (c->oh < 1)
        return mesh_err(-EINVAL,
                        "nn: input %d x %d is too small for %s (%dx%d/%d)",
                        m->cfg.image_size, m->cfg.image_size, m->arch, c->k,
                        c->k, c->stride);
    plan_desc(&d, MESH_NN_PLAN_CONV, m->n, c->cin, h);
    d.k = c->cout;
    d.r = d.s = c->k;
    d.stride = c->stride;
    d.pad = c->pad;
    d.oh = d.ow = c->oh;
    rc = plan(m, &d, &c->p);
    if (rc < 0)
        return rc;
    /* bf16-amp on the cpu: x converted once for forward and backward */
    res = OPS(m)->conv_fwd_keep ? OPS(m)->plan_reserve(c->p) : 0;
    return res ? OPS(m)->alloc(DEV(m), res, &c->reserve) : 0;
}

static int setup_bn(struct mesh_nn_model *m, struct nn_bn *b, int h)
{
    struct mesh_nn_plan_desc d;
    size_t res;
    int rc;

    b->h = b->wd = h;
    plan_desc(&d, MESH_NN_PLAN_BN, m->n, b->c, h);
    d.relu = b->relu;
    d.eps = 1e-5f;
    rc = plan(m, &d, &b->p);
    if (rc < 0)
        return rc;
    res = OPS(m)->plan_reserve(b->p);
    return res ? OPS(m)->alloc(DEV(m), res, &b->reserve) : 0;
}

static int simple_plan(struct mesh_nn_model *m, int kind, int c, int h,
                       int relu, struct mesh_nn_plan **out)
{
    struct mesh_nn_plan_desc d;

    plan_desc(&d, kind, m->n, c, h);
    d.relu = relu;
    if (kind == MESH_NN_PLAN_AVGPOOL)
        d.oh = d.ow = 1;
    return plan(m, &d, out);
}

static int setup_batch(struct mesh_nn_model *m, int n)
{
    const struct mesh_nn_model_cfg *cfg = &m->cfg;
    struct mesh_nn_plan_desc d;
    int h = cfg->image_size, rc, i, j;
    void *x;

    free_batch(m);
    m->n = n;
    m->ws_bytes = 0;
    m->max_act = 0;
    rc = alloc_act(m, cfg->in_channels, h, &m->in);
    if (rc == 0)
        rc = setup_conv(m, &m->conv1, h);
    if (rc < 0)
        goto fail;
    h = m->conv1.oh;
    if ((rc = alloc_act(m, m->conv1.cout, h, &m->a0)) < 0 ||
        (rc = setup_bn(m, &m->bn1, h)) < 0 ||
        (rc = alloc_act(m, m->conv1.cout, h, &m->o0)) < 0)
        goto fail;
    x = m->o0;
    if (!cfg->cifar_stem) {
        plan_desc(&d, MESH_NN_PLAN_MAXPOOL, n, m->conv1.cout, h);
        d.r = d.s = 3;
        d.stride = 2;
        d.pad = 1;
        d.oh = d.ow = mesh_nn_out_dim(h, 3, 2, 1);
        rc = plan(m, &d, &m->maxpool);
        if (rc < 0)
            goto fail;
        h = d.oh;
        if ((rc = alloc_act(m, m->conv1.cout, h, &m->p0)) < 0)
            goto fail;
        if (OPS(m)->plan_reserve(m->maxpool) &&
            (rc = OPS(m)->alloc(DEV(m), OPS(m)->plan_reserve(m->maxpool),
                                &m->pool_res)) < 0)
            goto fail;
        x = m->p0;
    }
    for (i = 0; i < m->nblocks; i++) {
        struct nn_block *b = &m->blocks[i];
        int hin = h, cout = b->c[b->nconv - 1].cout;

        b->x = x;
        for (j = 0; j < b->nconv; j++) {
            rc = setup_conv(m, &b->c[j], h);
            if (rc < 0)
                goto fail;
            h = b->c[j].oh;
            if ((rc = alloc_act(m, b->c[j].cout, h, &b->a[j])) < 0 ||
                (rc = setup_bn(m, &b->b[j], h)) < 0 ||
                (rc = alloc_act(m, b->c[j].cout, h, &b->o[j])) < 0)
                goto fail;
        }
        if (b->has_ds) {
            if ((rc = setup_conv(m, &b->cd, hin)) < 0 ||
                (rc = alloc_act(m, cout, b->cd.oh, &b->ad)) < 0 ||
                (rc = setup_bn(m, &b->bd, b->cd.oh)) < 0 ||
                (rc = alloc_act(m, cout, b->cd.oh, &b->od)) < 0)
                goto fail;
        }
        if ((rc = simple_plan(m, MESH_NN_PLAN_ADD, cout, h, 1, &b->join)) < 0 ||
            (rc = simple_plan(m, MESH_NN_PLAN_RELU, cout, h, 0, &b->relu)) <
                0 ||
            (rc = simple_plan(m, MESH_NN_PLAN_ADD, b->c[0].cin, hin, 0,
                              &b->gadd)) < 0)
            goto fail;
        x = b->o[b->nconv - 1];
    }
    if ((rc = simple_plan(m, MESH_NN_PLAN_AVGPOOL, m->feat, h, 0,
                          &m->avgpool)) < 0 ||
        (rc = alloc_act(m, m->feat, 1, &m->pooled)) < 0)
        goto fail;
    plan_desc(&d, MESH_NN_PLAN_FC, n, m->feat, 1);
    d.k = cfg->num_classes;
    if ((rc = plan(m, &d, &m->fc)) < 0)
        goto fail;
    {
        size_t lb = (size_t)n * cfg->num_classes * sizeof(float);

        if ((rc = OPS(m)->alloc(DEV(m), lb, (void **)&m->logits)) < 0 ||
            (rc = OPS(m)->alloc(DEV(m), lb, (void **)&m->dlogits)) < 0 ||
            (rc = OPS(m)->alloc(DEV(m), (size_t)n * sizeof(int32_t),
                                (void **)&m->labels)) < 0)
            goto fail;
    }
    for (i = 0; i < 3; i++)
        if ((rc = OPS(m)->alloc(DEV(m), m->max_act, &m->g[i])) < 0)
            goto fail;
    if (m->ws_bytes && (rc = OPS(m)->alloc(DEV(m), m->ws_bytes, &m->ws)) < 0)
        goto fail;
    return 0;
fail:
    free_batch(m);
    return rc;
}

/* ---- forward ------------------------------------------------------------- */

/* Time one op into m->prof[k] when profiling (the CPU backend is
 * synchronous; a device backend's time here is issue time unless synced). */
#define PROF(m, k, expr)                                                       \
    do {                                                                       \
        uint64_t t0_ = (m)->profile ? mesh_now_ns() : 0;                       \
        rc = (expr);                                                           \
        if ((m)->profile)                                                      \
            (m)->prof[k] += (double)(mesh_now_ns() - t0_) * 1e-9;              \
        if (rc < 0)                                                            \
            return rc;                                                         \
    } while (0)

/* Whether a conv's backward reads what its training forward kept. */
static int conv_kept(const struct mesh_nn_model *m, const struct nn_conv *c)
{
    return m->train && c->reserve && !c->frozen;
}

static int conv_fwd(struct mesh_nn_model *m, struct nn_conv *c, const void *x,
                    void *y)
{
    int rc;

    if (conv_kept(m, c))
        PROF(m, NN_PROF_CONV_FWD,
             OPS(m)->conv_fwd_keep(DEV(m), c->p, x, m->params + c->w, y,
                                   c->reserve, m->ws));
    else
        PROF(m, NN_PROF_CONV_FWD,
             OPS(m)->conv_fwd(DEV(m), c->p, x, m->params + c->w, y, m->ws));
    return 0;
}

static int bn_fwd(struct mesh_nn_model *m, struct nn_bn *b, const void *x,
                  void *y)
{
    const float *g = m->params + b->g;
    float *rm = m->buffers + b->rm;
    int rc;

    /* a frozen BN normalises with its running statistics, as torch's
     * eval-mode BN in a fine-tuned network does */
    if (m->train && !b->frozen)
        PROF(m, NN_PROF_BN_FWD,
             OPS(m)->bn_fwd_train(DEV(m), b->p, x, y, g, g + b->c, rm,
                                  rm + b->c, 0.1f, b->save, b->reserve, m->ws));
    else
        PROF(m, NN_PROF_BN_FWD,
             OPS(m)->bn_fwd_infer(DEV(m), b->p, x, y, g, g + b->c, rm,
                                  rm + b->c, m->ws));
    return 0;
}

static int block_fwd(struct mesh_nn_model *m, struct nn_block *b)
{
    const void *in = b->x;
    const void *sc = b->x;
    int j, rc;

    for (j = 0; j < b->nconv; j++) {
        if ((rc = conv_fwd(m, &b->c[j], in, b->a[j])) < 0 ||
            (rc = bn_fwd(m, &b->b[j], b->a[j], b->o[j])) < 0)
            return rc;
        in = b->o[j];
    }
    if (b->has_ds) {
        if ((rc = conv_fwd(m, &b->cd, b->x, b->ad)) < 0 ||
            (rc = bn_fwd(m, &b->bd, b->ad, b->od)) < 0)
            return rc;
        sc = b->od;
    }
    PROF(m, NN_PROF_ELTWISE,
         OPS(m)->add(DEV(m), b->join, b->o[b->nconv - 1], sc,
                     b->o[b->nconv - 1]));
    return 0;
}

int mesh_nn_model_forward(struct mesh_nn_model *m, int n, const float *images,
                          int train)
{
    const struct mesh_nn_model_cfg *cfg = &m->cfg;
    int rc, i;

    if (n <= 0)
        return mesh_err(-EINVAL, "nn: forward of %d images", n);
    if (n != m->n) {
        rc = setup_batch(m, n);
        if (rc < 0)
            return rc;
    }
    m->train = train;
    m->have_loss = 0;
    PROF(m, NN_PROF_OTHER,
         OPS(m)->act_import(DEV(m), n, cfg->in_channels, cfg->image_size,
                            cfg->image_size, images, m->in));
    if ((rc = conv_fwd(m, &m->conv1, m->in, m->a0)) < 0 ||
        (rc = bn_fwd(m, &m->bn1, m->a0, m->o0)) < 0)
        return rc;
    if (!cfg->cifar_stem)
        PROF(m, NN_PROF_POOL,
             OPS(m)->maxpool_fwd(DEV(m), m->maxpool, m->o0, m->p0, m->pool_res,
                                 m->ws));
    for (i = 0; i < m->nblocks; i++) {
        rc = block_fwd(m, &m->blocks[i]);
        if (rc < 0)
            return rc;
    }
    {
        struct nn_block *last = &m->blocks[m->nblocks - 1];

        PROF(m, NN_PROF_POOL,
             OPS(m)->avgpool_fwd(DEV(m), m->avgpool, last->o[last->nconv - 1],
                                 m->pooled, m->ws));
    }
    PROF(
        m, NN_PROF_FC,
        OPS(m)->fc_fwd(DEV(m), m->fc, m->pooled, m->params + m->fc_w,
                       m->params + m->fc_w + (size_t)cfg->num_classes * m->feat,
                       m->logits, m->ws));
    if (train)
        m->batches_tracked++;
    return 0;
}

int mesh_nn_model_logits(struct mesh_nn_model *m, float *host)
{
    if (!m->n)
        return mesh_err(-EINVAL, "nn: no forward has run");
    return OPS(m)->download(DEV(m), host, m->logits,
                            (size_t)m->n * m->cfg.num_classes * sizeof(float));
}

int mesh_nn_model_num_relus(const struct mesh_nn_model *m)
{
    int i, k = 1;

    for (i = 0; i < m->nblocks; i++)
        k += m->blocks[i].nconv;
    return k;
}

int mesh_nn_model_relu(struct mesh_nn_model *m, int k, char name[32],
                       int shape[4], float *out)
{
    const struct nn_conv *c = &m->conv1;
    const void *act = m->o0;
    int i;

    if (!m->n)
        return mesh_err(-EINVAL, "nn: no forward has run");
    if (k < 0 || k >= mesh_nn_model_num_relus(m))
        return mesh_err(-EINVAL, "nn: ReLU %d of %d", k,
                        mesh_nn_model_num_relus(m));
    if (name)
        snprintf(name, 32, "bn1");
    for (i = 0; k > 0; i++) {
        struct nn_block *b = &m->blocks[i];

        if (k <= b->nconv) {
            c = &b->c[k - 1];
            act = b->o[k - 1];
            if (name && k == b->nconv)
                snprintf(name, 32, "%s", b->name);
            else if (name)
                snprintf(name, 32, "%s.bn%d", b->name, k);
            break;
        }
        k -= b->nconv;
    }
    shape[0] = m->n, shape[1] = c->cout, shape[2] = c->oh, shape[3] = c->ow;
    if (!out)
        return 0;
    return OPS(m)->act_export(DEV(m), m->n, c->cout, c->oh, c->ow, act, out);
}

/* The checks and the labels' upload of mesh_nn_model_loss(_start). */
static int loss_prepare(struct mesh_nn_model *m, const int32_t *labels,
                        float smoothing)
{
    if (!m->n)
        return mesh_err(-EINVAL, "nn: loss before any forward");
    if (!(smoothing >= 0.f && smoothing < 1.f))
        return mesh_err(-EINVAL, "nn: label smoothing %g is outside [0, 1)",
                        (double)smoothing);
    return OPS(m)->upload(DEV(m), m->labels, labels,
                          (size_t)m->n * sizeof(int32_t));
}

int mesh_nn_model_loss(struct mesh_nn_model *m, const int32_t *labels,
                       float smoothing, float *loss)
{
    float l;
    int rc = loss_prepare(m, labels, smoothing);

    if (rc < 0)
        return rc;
    PROF(m, NN_PROF_LOSS,
         OPS(m)->xent(DEV(m), m->n, m->cfg.num_classes, m->logits, m->labels,
                      smoothing, &l, m->dlogits));
    m->have_loss = 1;
    *loss = l;
    return 0;
}

int mesh_nn_model_loss_start(struct mesh_nn_model *m, const int32_t *labels,
                             float smoothing)
{
    float l;
    int rc = loss_prepare(m, labels, smoothing);

    if (rc < 0)
        return rc;
    if (OPS(m)->xent_start) {
        PROF(m, NN_PROF_LOSS,
             OPS(m)->xent_start(DEV(m), m->n, m->cfg.num_classes, m->logits,
                                m->labels, smoothing, m->dlogits));
    } else {
        /* computed now; queued here, in a ring that grows */
        if (m->lq_pending == m->lq_cap) {
            int cap = m->lq_cap ? 2 * m->lq_cap : 8, i;
            float *q = malloc((size_t)cap * sizeof(float));

            if (!q)
                return mesh_err(-ENOMEM, "nn: out of memory (loss queue)");
            for (i = 0; i < m->lq_pending; i++)
                q[i] = m->lq[(m->lq_head + i) % m->lq_cap];
            free(m->lq);
            m->lq = q;
            m->lq_cap = cap;
            m->lq_head = 0;
        }
        PROF(m, NN_PROF_LOSS,
             OPS(m)->xent(DEV(m), m->n, m->cfg.num_classes, m->logits,
                          m->labels, smoothing, &l, m->dlogits));
        m->lq[(m->lq_head + m->lq_pending) % m->lq_cap] = l;
    }
    m->lq_pending++;
    m->have_loss = 1;
    return 0;
}

int mesh_nn_model_loss_read(struct mesh_nn_model *m, float *loss)
{
    if (!m->lq_pending)
        return mesh_err(-ENOENT, "nn: no loss is queued");
    m->lq_pending--;
    if (OPS(m)->xent_start)
        return OPS(m)->xent_read(DEV(m), loss);
    *loss = m->lq[m->lq_head];
    m->lq_head = (m->lq_head + 1) % m->lq_cap;
    return 0;
}

int mesh_nn_model_loss_pending(const struct mesh_nn_model *m)
{
    return m->lq_pending;
}

/* ---- backward ------------------------------------------------------------ */

struct bwd {
    struct mesh_nn_model *m;
    int accumulate;
    mesh_nn_grad_ready_fn cb;
    void *arg;
};

/* Where an op writes the gradient of [off, off + count). */
static float *gdst(struct bwd *b, size_t off)
{
    return b->accumulate ? b->m->gscratch : b->m->grads + off;
}

/*
 * The gradient of [off, off + count) is computed (or, frozen, not needed):
 * accumulate, report.
 */
static int gdone(struct bwd *b, size_t off, size_t count, int frozen)
{
    struct mesh_nn_model *m = b->m;
    int rc;

    if (b->accumulate && !frozen)
        PROF(m, NN_PROF_OTHER,
             OPS(m)->axpy1(DEV(m), count, m->gscratch, m->grads + off));
    if (b->cb) {
        rc = b->cb(b->arg, off, count);
        if (rc < 0)
            return mesh_err_prefix(rc, "nn: gradient-ready callback");
    }
    return 0;
}

/* BN backward from dy to dx (may alias), then its two gradients; y is
 * its forward output. */
static int bn_bwd(struct bwd *w, struct nn_bn *b, const void *x, const void *y,
                  const void *dy, void *dx)
{
    struct mesh_nn_model *m = w->m;
    float *dg = gdst(w, b->g);
    int rc;

    if (b->frozen) {
        /* running statistics: an affine map (and the ReLU's mask of its
         * output y); no gradient of its own */
        PROF(m, NN_PROF_BN_BWD,
             OPS(m)->bn_bwd_frozen(DEV(m), b->p, y, dy, m->params + b->g,
                                   m->buffers + b->rm + b->c, dx));
        return gdone(w, b->g, 2 * (size_t)b->c, 1);
    }
    PROF(m, NN_PROF_BN_BWD,
         OPS(m)->bn_bwd(DEV(m), b->p, x, dy, m->params + b->g,
                        m->params + b->g + b->c, b->save, b->reserve, dx, dg,
                        dg + b->c, m->ws));
    return gdone(w, b->g, 2 * (size_t)b->c, 0);
}

/* Conv backward: filter gradient first (reported), then dx unless NULL. */
static int conv_bwd(struct bwd *w, struct nn_conv *c, const void *x,
                    const void *dy, void *dx)
{
    struct mesh_nn_model *m = w->m;
    size_t count = conv_params(c);
    int rc;

    if (conv_kept(m, c))
        PROF(m, NN_PROF_CONV_BWD_FILTER,
             OPS(m)->conv_bwd_filter_kept(DEV(m), c->p, x, c->reserve, dy,
                                          gdst(w, c->w), m->ws));
    else if (!c->frozen)
        PROF(
            m, NN_PROF_CONV_BWD_FILTER,
            OPS(m)->conv_bwd_filter(DEV(m), c->p, x, dy, gdst(w, c->w), m->ws));
    rc = gdone(w, c->w, count, c->frozen);
    if (rc < 0 || !dx)
        return rc;
    /* the gradient-ready callback leaves the device and m->ws alone */
    if (conv_kept(m, c))
        PROF(m, NN_PROF_CONV_BWD_DATA,
             OPS(m)->conv_bwd_data_after(DEV(m), c->p, dy, m->params + c->w, dx,
                                         m->ws));
    else
        PROF(m, NN_PROF_CONV_BWD_DATA,
             OPS(m)->conv_bwd_data(DEV(m), c->p, dy, m->params + c->w, dx,
                                   m->ws));
    return 0;
}

/*
 * Every parameter below end is frozen (mesh_nn_model_freeze): backward
 * has nothing left to compute, not even the gradient of the input.
 */
static int frozen_below(const struct bwd *w, size_t end)
{
    return end <= w->m->frozen_below;
}

#define BWD_STOP 1 /* block_bwd: the rest of backward is frozen */

static size_t bn_end(const struct nn_bn *b)
{
    return b->g + 2 * (size_t)b->c;
}

/* The scratch buffer index not in {a, b}. */
static int other(int a, int b)
{
    int i;

    for (i = 0; i < 3; i++)
        if (i != a && i != b)
            return i;
    return -1;
}

/*
 * Backward of one block: the gradient of its output is in g[gi]; on return
 * *go names the buffer with the gradient of its input. BWD_STOP where the
 * parameters left are all frozen.
 */
static int block_bwd(struct bwd *w, struct nn_block *b, int gi, int *go)
{
    struct mesh_nn_model *m = w->m;
    void **g = m->g;
    int last = b->nconv - 1, sc, cur, nxt, j, rc;

    /* through the join's ReLU, in place: g[gi] = d(main) = d(shortcut) */
    PROF(m, NN_PROF_ELTWISE,
         OPS(m)->relu_bwd(DEV(m), b->relu, b->o[last], g[gi], g[gi]));
    if (b->has_ds) {
        /* params of the shortcut come last in the slab: report them first */
        int t = other(gi, gi);

        sc = other(gi, t);
        if (frozen_below(w, bn_end(&b->bd)))
            return BWD_STOP;
        if ((rc = bn_bwd(w, &b->bd, b->ad, b->od, g[gi], g[t])) < 0 ||
            (rc = conv_bwd(w, &b->cd, b->x, g[t], g[sc])) < 0)
            return rc;
        cur = gi; /* the main path may now run in place in g[gi] */
    } else {
        sc = gi;
        cur = other(gi, gi);
    }
    /* bn_last: d(main) -> g[cur] (in place when g[gi] is free) */
    if (frozen_below(w, bn_end(&b->b[last])))
        return BWD_STOP;
    rc = bn_bwd(w, &b->b[last], b->a[last], b->o[last], g[gi], g[cur]);
    if (rc < 0)
        return rc;
    for (j = last; j >= 0; j--) {
        const void *in = j ? b->o[j - 1] : b->x;

        nxt = other(cur, sc);
        if (frozen_below(w, b->c[j].w + conv_params(&b->c[j])))
            return BWD_STOP;
        rc = conv_bwd(w, &b->c[j], in, g[cur], g[nxt]);
        if (rc < 0)
            return rc;
        cur = nxt;
        if (j) {
            if (frozen_below(w, bn_end(&b->b[j - 1])))
                return BWD_STOP;
            rc = bn_bwd(w, &b->b[j - 1], b->a[j - 1], b->o[j - 1], g[cur],
                        g[cur]);
            if (rc < 0)
                return rc;
        }
    }
    /* d(x) = d(main) + d(shortcut) */
    PROF(m, NN_PROF_ELTWISE,
         OPS(m)->add(DEV(m), b->gadd, g[cur], g[sc], g[cur]));
    *go = cur;
    return 0;
}

int mesh_nn_model_backward(struct mesh_nn_model *m, int accumulate,
                           mesh_nn_grad_ready_fn cb, void *arg)
{
    const struct mesh_nn_model_cfg *cfg = &m->cfg;
    struct bwd w = {m, accumulate, cb, arg};
    size_t fcn = (size_t)cfg->num_classes * m->feat;
    int gi = 0, go, i, rc;

    if (!m->n || !m->train || !m->have_loss)
        return mesh_err(-EINVAL,
                        "nn: backward needs a training forward and its loss");
    if (accumulate && !m->gscratch) {
        rc = OPS(m)->alloc(DEV(m), m->max_tensor * sizeof(float),
                           (void **)&m->gscratch);
        if (rc < 0)
            return rc;
    }
    /* fc: weight and bias are adjacent, one range */
    if (frozen_below(&w, m->nparams))
        return 0; /* every parameter is frozen */
    {
        float *dw = gdst(&w, m->fc_w);

        if (!m->fc_frozen)
            PROF(m, NN_PROF_FC,
                 OPS(m)->fc_bwd_weights(DEV(m), m->fc, m->pooled, m->dlogits,
                                        dw, dw + fcn, m->ws));
        rc = gdone(&w, m->fc_w, fcn + cfg->num_classes, m->fc_frozen);
        if (rc < 0)
            return rc;
        PROF(m, NN_PROF_FC,
             OPS(m)->fc_bwd_data(DEV(m), m->fc, m->dlogits, m->params + m->fc_w,
                                 m->g[1], m->ws));
    }
    PROF(m, NN_PROF_POOL,
         OPS(m)->avgpool_bwd(DEV(m), m->avgpool, m->g[1], m->g[gi], m->ws));
    for (i = m->nblocks - 1; i >= 0; i--) {
        rc = block_bwd(&w, &m->blocks[i], gi, &go);
        if (rc != 0)
            return rc == BWD_STOP ? 0 : rc;
        gi = go;
    }
    if (!cfg->cifar_stem) {
        go = other(gi, gi);
        PROF(m, NN_PROF_POOL,
             OPS(m)->maxpool_bwd(DEV(m), m->maxpool, m->g[gi], m->pool_res,
                                 m->g[go], m->ws));
        gi = go;
    }
    if (frozen_below(&w, bn_end(&m->bn1)))
        return 0;
    rc = bn_bwd(&w, &m->bn1, m->a0, m->o0, m->g[gi], m->g[gi]);
    if (rc == 0 && !frozen_below(&w, m->conv1.w + conv_params(&m->conv1)))
        rc = conv_bwd(&w, &m->conv1, m->in, m->g[gi], NULL);
    return rc;
}

/* ---- profiling ----------------------------------------------------------- */

void mesh_nn_model_profile(struct mesh_nn_model *m, int on)
{
    m->profile = on;
    memset(m->prof, 0, sizeof(m->prof));
}

void mesh_nn_model_profile_report(const struct mesh_nn_model *m, FILE *f)
{
    static const char *const names[NN_PROF_COUNT] = {
        "conv forward", "conv backward data", "conv backward filter",
        "bn forward",   "bn backward",        "add/relu",
        "pooling",      "fully connected",    "loss",
        "other",
    };
    double total = 0;
    int i;

    for (i = 0; i < NN_PROF_COUNT; i++)
        total += m->prof[i];
    for (i = 0; i < NN_PROF_COUNT; i++)
        fprintf(f, "  %-22s %10.3f s  %5.1f %%\n", names[i], m->prof[i],
                total > 0 ? 100.0 * m->prof[i] / total : 0.0);
    fprintf(f, "  %-22s %10.3f s\n", "total", total);
}
