/*
 * nn/finetune.c: starting a model from torchvision-named weights
 * (mesh_nn_model_init_from) and freezing its parameters
 * (mesh_nn_model_freeze); the tensor patterns both take.
 *
 * Loading is by name, as torch's load_state_dict(strict=True) is, with two
 * allowances that fine-tuning needs: tensors the caller skips keep their
 * fresh initialisation, and an fc whose class count differs from the
 * file's is re-initialised (and said so). Everything else that does not
 * fit (a tensor missing, unexpected, of another shape or dtype) is one
 * error that lists them all, so a user fixes a file in one go.
 */
#include "config.h"

#include "nn/model-internal.h"
#include "nn/safetensors.h"
#include "common/array.h"
#include "common/util.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- patterns ------------------------------------------------------------ */

/* Does item (len bytes, no comma) match name? A module matches the tensors
 * under it: "layer1" matches "layer1.0.conv1.weight", not "layer10.x". */
static int item_match(const char *item, size_t len, const char *name)
{
    char pat[128];

    if (len == 0 || len >= sizeof(pat))
        return 0;
    memcpy(pat, item, len);
    pat[len] = '\0';
    if (strpbrk(pat, "*?[")) {
        size_t n = strlen(name);
        char mod[64];

        if (fnmatch(pat, name, 0) == 0)
            return 1;
        /* a glob of a module: "layer*.0.bn1" matches its .weight */
        while (n > 0) {
            while (n > 0 && name[n - 1] != '.')
                n--;
            if (n == 0 || n - 1 >= sizeof(mod))
                break;
            memcpy(mod, name, n - 1);
            mod[n - 1] = '\0';
            if (fnmatch(pat, mod, 0) == 0)
                return 1;
            n--;
        }
        return 0;
    }
    return strncmp(pat, name, len) == 0 &&
           (name[len] == '\0' || name[len] == '.');
}

/* Item [*p, *p + *len) without the spaces around it. */
static void trim(const char **p, size_t *len)
{
    while (*len > 0 && isspace((unsigned char)**p))
        (*p)++, (*len)--;
    while (*len > 0 && isspace((unsigned char)(*p)[*len - 1]))
        (*len)--;
}

int mesh_nn_pattern_match(const char *patterns, const char *name)
{
    const char *p = patterns;

    while (p && *p) {
        size_t len = strcspn(p, ","), tl = len;
        const char *it = p;

        trim(&it, &tl);
        if (item_match(it, tl, name))
            return 1;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* Is name one of the model's tensors, or a BN's num_batches_tracked? */
static int model_has(const struct mesh_nn_model *m, const char *item,
                     size_t len)
{
    int i;

    for (i = 0; i < m->nt; i++) {
        char nbt[64];
        const char *name = m->t[i].name;

        if (item_match(item, len, name))
            return 1;
        if (m->t[i].role != MESH_NN_ROLE_BN_MEAN)
            continue;
        snprintf(nbt, sizeof(nbt), "%.*s.num_batches_tracked",
                 (int)(strlen(name) - strlen(".running_mean")), name);
        if (item_match(item, len, nbt))
            return 1;
    }
    return 0;
}

int mesh_nn_pattern_check(const struct mesh_nn_model *m, const char *flag,
                          const char *patterns)
{
    const char *p = patterns;

    if (!p || !*p)
        return mesh_err(-EINVAL, "%s: empty pattern", flag);
    while (*p) {
        size_t len = strcspn(p, ","), tl = len;
        const char *it = p;

        trim(&it, &tl);
        if (tl == 0)
            return mesh_err(-EINVAL, "%s \"%s\": an empty item", flag,
                            patterns);
        if (tl >= 128)
            return mesh_err(-EINVAL, "%s: item \"%.40s...\" is too long", flag,
                            it);
        if (!model_has(m, it, tl))
            return mesh_err(-EINVAL,
                            "%s: \"%.*s\" matches no tensor of %s (names "
                            "as torchvision's: conv1, bn1, layer1, "
                            "layer2.0.bn1, fc.weight, ...)",
                            flag, (int)tl, it, m->arch);
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* ---- a growable report --------------------------------------------------- */

struct text {
    char *s;
    size_t len, cap;
    int n; /* items added */
};

static MESH_PRINTF(2, 3) void text_add(struct text *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || mesh_array_reserve(&t->s, &t->cap, t->len + (size_t)n + 1, 1,
                                    "nn: report") < 0)
        return;
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
    t->n++;
}

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t cap)
{
    size_t len = 0;
    int i;

    buf[len++] = '[';
    buf[len] = '\0';
    for (i = 0; i < ndim && len < cap - 24; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? "," : "",
                                (long long)shape[i]);
    snprintf(buf + len, cap - len, "]");
}

/* ---- loading ------------------------------------------------------------- */

struct init_state {
    struct mesh_nn_model *m;
    const struct mesh_st_file *f;
    const char *skip;
    float *p, *b;     /* host copies of the slabs */
    uint8_t *seen;    /* per file tensor: taken (or skipped) */
    int have_nbt;     /* a num_batches_tracked was read */
    int64_t nbt;      /* the first one */
    struct text bad;  /* "missing x", one line each */
    struct text note; /* "re-initialised fc.weight: ...", one line each */
    struct text kept, ignored; /* --init-skip: "a, b, c" */
    int nmissing, nunexpected, nshape;
};

static void mark_seen(struct init_state *s, const struct mesh_st_tensor *ft)
{
    int i, n = mesh_st_count(s->f);

    for (i = 0; i < n; i++)
        if (mesh_st_get(s->f, i) == ft)
            s->seen[i] = 1;
}

static int float_dtype(int dt)
{
    return dt == MESH_DT_F32 || dt == MESH_DT_F16 || dt == MESH_DT_BF16 ||
           dt == MESH_ST_F64;
}

static int int_dtype(int dt)
{
    return dt == MESH_ST_I64 || dt == MESH_ST_I32 || dt == MESH_ST_I16 ||
           dt == MESH_ST_I8 || dt == MESH_ST_U32 || dt == MESH_ST_U16 ||
           dt == MESH_ST_U8;
}

/*
 * fc with another class count: the file's shape differs in dim 0 only.
 * The tensor keeps its fresh initialisation.
 */
static int fc_other_classes(const struct mesh_nn_tensor *t,
                            const struct mesh_st_tensor *ft)
{
    int i;

    if (t->role != MESH_NN_ROLE_FC_WEIGHT && t->role != MESH_NN_ROLE_FC_BIAS)
        return 0;
    if (ft->ndim != t->ndim || ft->shape[0] == t->shape[0])
        return 0;
    for (i = 1; i < t->ndim; i++)
        if (ft->shape[i] != t->shape[i])
            return 0;
    return 1;
}

/* Model tensor t from the file, into the host slabs. */
static int take_tensor(struct init_state *s, const struct mesh_nn_tensor *t)
{
    const struct mesh_st_tensor *ft;
    char a[96], b[96];
    float *dst = (t->kind == MESH_NN_PARAM ? s->p : s->b) + t->offset;
    int i, same = 1, rc;

    if (mesh_nn_pattern_match(s->skip, t->name)) {
        ft = mesh_st_find(s->f, t->name);
        if (ft)
            mark_seen(s, ft);
        text_add(&s->kept, "%s%s", s->kept.n ? ", " : "", t->name);
        return 0;
    }
    ft = mesh_st_find(s->f, t->name);
    if (!ft) {
        s->nmissing++;
        text_add(&s->bad, "missing %s\n", t->name);
        return 0;
    }
    mark_seen(s, ft);
    if (!float_dtype(ft->dtype)) {
        s->nshape++;
        text_add(&s->bad,
                 "%s: dtype %s in the file, F32, F16 or BF16 "
                 "expected\n",
                 t->name, mesh_st_dtype_name(ft->dtype));
        return 0;
    }
    if (fc_other_classes(t, ft)) {
        text_add(&s->note,
                 "re-initialised %s: %lld classes in the file, %lld in "
                 "the model\n",
                 t->name, (long long)ft->shape[0], (long long)t->shape[0]);
        return 0;
    }
    same = ft->ndim == t->ndim;
    for (i = 0; same && i < t->ndim; i++)
        same = ft->shape[i] == t->shape[i];
    if (!same) {
        s->nshape++;
        shape_str(ft->shape, ft->ndim, a, sizeof(a));
        shape_str(t->shape, t->ndim, b, sizeof(b));
        text_add(&s->bad, "%s: shape %s in the file, %s expected\n", t->name, a,
                 b);
        return 0;
    }
    rc = mesh_st_read(s->f, t->name, MESH_DT_F32, t->shape, t->ndim, dst);
    return rc;
}

/* A BN's num_batches_tracked (torchvision: I64, shape []); optional. */
static int take_nbt(struct init_state *s, const struct mesh_nn_tensor *mean)
{
    const struct mesh_st_tensor *ft;
    char name[64];
    int64_t v = 0;
    int rc;

    snprintf(name, sizeof(name), "%.*s.num_batches_tracked",
             (int)(strlen(mean->name) - strlen(".running_mean")), mean->name);
    ft = mesh_st_find(s->f, name);
    if (!ft)
        return 0;
    mark_seen(s, ft);
    if (mesh_nn_pattern_match(s->skip, name))
        return 0;
    if (!int_dtype(ft->dtype) || ft->ndim > 1 ||
        (ft->ndim == 1 && ft->shape[0] != 1)) {
        char a[96];

        s->nshape++;
        shape_str(ft->shape, ft->ndim, a, sizeof(a));
        text_add(&s->bad, "%s: %s %s in the file, an I64 scalar expected\n",
                 name, mesh_st_dtype_name(ft->dtype), a);
        return 0;
    }
    {
        int64_t one[1] = {1};

        rc = mesh_st_read(s->f, name, MESH_ST_I64, ft->ndim ? one : NULL,
                          ft->ndim, &v);
    }
    if (rc == 0 && !s->have_nbt) {
        s->nbt = v;
        s->have_nbt = 1;
    }
    return rc;
}

/* The error of a file that does not fit: counts (the tensors in notes). */
static int misfit(struct init_state *s)
{
    return mesh_err(-EINVAL,
                    "does not fit %s: %d tensor(s) missing, %d unexpected, "
                    "%d of another shape or dtype (--init-skip drops "
                    "tensors on purpose)",
                    s->m->arch, s->nmissing, s->nunexpected, s->nshape);
}

int mesh_nn_model_init_from(struct mesh_nn_model *m, const void *buf,
                            size_t len, const char *what, const char *skip,
                            char **notes)
{
    const struct mesh_nn_backend_ops *o = m->ctx->ops;
    struct init_state s;
    struct mesh_st_file *f = NULL;
    int rc, i, n;

    memset(&s, 0, sizeof(s));
    s.m = m;
    s.skip = skip;
    *notes = NULL;
    rc = mesh_st_parse(buf, len, &f);
    if (rc < 0)
        return mesh_err_prefix(rc, "%s", what);
    s.f = f;
    n = mesh_st_count(f);
    s.p = malloc(m->nparams * sizeof(float));
    s.b = malloc((m->nbuffers + 1) * sizeof(float));
    s.seen = calloc((size_t)n + 1, 1);
    if (!s.p || !s.b || !s.seen) {
        rc = mesh_err(-ENOMEM, "nn: out of memory");
        goto out;
    }
    /* the fresh initialisation, for what is skipped or re-initialised */
    rc = o->download(m->ctx->dev, s.p, m->params, m->nparams * sizeof(float));
    if (rc == 0)
        rc = o->download(m->ctx->dev, s.b, m->buffers,
                         m->nbuffers * sizeof(float));
    for (i = 0; rc == 0 && i < m->nt; i++) {
        rc = take_tensor(&s, &m->t[i]);
        if (rc == 0 && m->t[i].role == MESH_NN_ROLE_BN_MEAN)
            rc = take_nbt(&s, &m->t[i]);
    }
    for (i = 0; rc == 0 && i < n; i++) {
        const struct mesh_st_tensor *ft = mesh_st_get(f, i);

        if (s.seen[i])
            continue;
        if (mesh_nn_pattern_match(skip, ft->name)) {
            text_add(&s.ignored, "%s%s", s.ignored.n ? ", " : "", ft->name);
            continue;
        }
        s.nunexpected++;
        text_add(&s.bad, "unexpected %s\n", ft->name);
    }
    if (rc < 0)
        goto out;
    if (s.kept.n)
        text_add(&s.note,
                 "kept the fresh initialisation of %d tensor(s) "
                 "(--init-skip): %s\n",
                 s.kept.n, s.kept.s);
    if (s.ignored.n)
        text_add(&s.note,
                 "ignored %d tensor(s) of the file that the model "
                 "lacks (--init-skip): %s\n",
                 s.ignored.n, s.ignored.s);
    if (s.bad.n) {
        rc = misfit(&s);
        goto out;
    }
    rc = o->upload(m->ctx->dev, m->params, s.p, m->nparams * sizeof(float));
    if (rc == 0)
        rc = o->upload(m->ctx->dev, m->buffers, s.b,
                       m->nbuffers * sizeof(float));
    if (rc == 0)
        m->batches_tracked = s.have_nbt ? s.nbt : 0;
out:
    if (rc < 0)
        mesh_err_prefix(rc, "%s", what);
    /* a misfit's notes are the tensors that do not fit; other errors
     * have none */
    if (rc == 0) {
        *notes = s.note.s;
        free(s.bad.s);
    } else {
        *notes = s.bad.n ? s.bad.s : NULL;
        if (!s.bad.n)
            free(s.bad.s);
        free(s.note.s);
    }
    free(s.kept.s);
    free(s.ignored.s);
    free(s.seen);
    free(s.b);
    free(s.p);
    mesh_st_close(f);
    return rc;
}

/* ---- freezing ------------------------------------------------------------ */

/* The param tensor at slab offset off. */
static struct mesh_nn_tensor *param_at(struct mesh_nn_model *m, size_t off)
{
    int i;

    for (i = 0; i < m->nt; i++)
        if (m->t[i].kind == MESH_NN_PARAM && m->t[i].offset == off)
            return &m->t[i];
    return NULL;
}

static void conv_freeze(struct mesh_nn_model *m, struct nn_conv *c)
{
    struct mesh_nn_tensor *t = param_at(m, c->w);

    c->frozen = t && t->frozen;
}

/*
 * A BN whose weight and bias are both frozen normalises with its running
 * statistics; backward runs through it with the backend's bn_bwd_frozen,
 * and a backend without one (cuda) needs every parameter before it frozen
 * too (backward then stops before it).
 */
static int bn_freeze(struct mesh_nn_model *m, struct nn_bn *b)
{
    struct mesh_nn_tensor *w = param_at(m, b->g),
                          *bias = param_at(m, b->g + b->c);

    b->frozen = w && bias && w->frozen && bias->frozen;
    if (b->frozen && b->g + 2 * (size_t)b->c > m->frozen_below &&
        !m->ctx->ops->bn_bwd_frozen) {
        const struct mesh_nn_tensor *first = NULL;
        int i;

        for (i = 0; i < m->nt && !first; i++)
            if (m->t[i].kind == MESH_NN_PARAM && !m->t[i].frozen)
                first = &m->t[i];
        return mesh_err(-EINVAL,
                        "--freeze: %.*s is frozen (it normalises with its "
                        "running statistics), but %s before it is trained, "
                        "and the %s backend has no backward through a "
                        "frozen batch norm: freeze the network from conv1 "
                        "on up to a layer, e.g. conv1,bn1,layer1",
                        (int)(strlen(w->name) - strlen(".weight")), w->name,
                        first ? first->name : "a parameter", m->ctx->ops->name);
    }
    return 0;
}

int mesh_nn_model_freeze(struct mesh_nn_model *m, const char *patterns)
{
    int i, j, rc;

    m->frozen_below = 0;
    for (i = 0; i < m->nt; i++) {
        struct mesh_nn_tensor *t = &m->t[i];

        t->frozen = t->kind == MESH_NN_PARAM && patterns &&
                    mesh_nn_pattern_match(patterns, t->name);
    }
    /* params are in slab order first in the table */
    for (i = 0; i < m->nt && m->t[i].kind == MESH_NN_PARAM && m->t[i].frozen;
         i++)
        m->frozen_below = m->t[i].offset + m->t[i].count;
    conv_freeze(m, &m->conv1);
    rc = bn_freeze(m, &m->bn1);
    for (i = 0; rc == 0 && i < m->nblocks; i++) {
        struct nn_block *b = &m->blocks[i];

        for (j = 0; rc == 0 && j < b->nconv; j++) {
            conv_freeze(m, &b->c[j]);
            rc = bn_freeze(m, &b->b[j]);
        }
        if (rc == 0 && b->has_ds) {
            conv_freeze(m, &b->cd);
            rc = bn_freeze(m, &b->bd);
        }
    }
    {
        struct mesh_nn_tensor *w = param_at(m, m->fc_w);
        struct mesh_nn_tensor *b =
            param_at(m, m->fc_w + (size_t)m->cfg.num_classes * m->feat);

        /* one op makes both gradients: skipped when neither is needed */
        m->fc_frozen = w && b && w->frozen && b->frozen;
    }
    if (rc < 0)
        mesh_nn_model_freeze(m, NULL);
    return rc;
}

size_t mesh_nn_model_frozen_params(const struct mesh_nn_model *m)
{
    size_t n = 0;
    int i;

    for (i = 0; i < m->nt; i++)
        if (m->t[i].kind == MESH_NN_PARAM && m->t[i].frozen)
            n += m->t[i].count;
    return n;
}
