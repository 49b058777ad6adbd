/*
 * nn/optim.c: SGD over the parameter slab (PyTorch's torch.optim.SGD) and
 * learning-rate schedules (step, cosine, linear warmup).
 */
#include "config.h"

#include "nn/model-internal.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A run of adjacent tensors that share one weight decay. */
struct sgd_run {
    size_t off, count;
    float wd;
};

struct mesh_nn_sgd {
    struct mesh_nn_model *m;
    struct mesh_nn_sgd_cfg cfg;
    float *mom; /* momentum slab (device), NULL without momentum */
    struct sgd_run *runs;
    int nruns;
    int64_t steps;
};

int mesh_nn_sgd_create(struct mesh_nn_model *m,
                       const struct mesh_nn_sgd_cfg *cfg,
                       struct mesh_nn_sgd **out)
{
    struct mesh_nn_sgd *s;
    int i, rc;

    if (!(cfg->momentum >= 0.f) || !(cfg->weight_decay >= 0.f) ||
        !(cfg->dampening >= 0.f))
        return mesh_err(-EINVAL, "nn: SGD momentum, dampening and weight "
                                 "decay must be >= 0");
    if (cfg->nesterov && (cfg->momentum <= 0.f || cfg->dampening != 0.f))
        return mesh_err(-EINVAL,
                        "nn: Nesterov momentum requires a momentum and zero "
                        "dampening");
    s = calloc(1, sizeof(*s));
    if (!s)
        return mesh_err(-ENOMEM, "nn: out of memory");
    s->m = m;
    s->cfg = *cfg;
    s->runs = calloc((size_t)m->nt, sizeof(*s->runs));
    if (!s->runs) {
        free(s);
        return mesh_err(-ENOMEM, "nn: out of memory");
    }
    for (i = 0; i < m->nt; i++) {
        const struct mesh_nn_tensor *t = &m->t[i];
        int skip = cfg->wd_skip_bn_bias && (t->role == MESH_NN_ROLE_BN_WEIGHT ||
                                            t->role == MESH_NN_ROLE_BN_BIAS ||
                                            t->role == MESH_NN_ROLE_FC_BIAS);
        float wd = skip ? 0.f : cfg->weight_decay;

        /* a frozen tensor is neither decayed nor moved */
        if (t->kind != MESH_NN_PARAM || t->frozen)
            continue;
        if (s->nruns && s->runs[s->nruns - 1].wd == wd &&
            s->runs[s->nruns - 1].off + s->runs[s->nruns - 1].count ==
                t->offset) {
            s->runs[s->nruns - 1].count += t->count;
        } else {
            s->runs[s->nruns].off = t->offset;
            s->runs[s->nruns].count = t->count;
            s->runs[s->nruns].wd = wd;
            s->nruns++;
        }
    }
    /* without momentum too (zeros, never read by the update), so that
     * checkpoints, digests and --elastic's snapshots hold the same
     * fields in every run */
    rc = m->ctx->ops->alloc(m->ctx->dev, m->nparams * sizeof(float),
                            (void **)&s->mom);
    if (rc < 0) {
        free(s->runs);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void mesh_nn_sgd_destroy(struct mesh_nn_sgd *s)
{
    if (!s)
        return;
    if (s->mom)
        s->m->ctx->ops->free(s->m->ctx->dev, s->mom);
    free(s->runs);
    free(s);
}

static int sgd_step(struct mesh_nn_sgd *s, float lr, float *keep_params,
                    float *keep_mom)
{
    struct mesh_nn_model *m = s->m;
    struct mesh_nn_sgd_args a;
    float *buf = s->cfg.momentum > 0.f ? s->mom : NULL;
    int i, rc;

    if (!isfinite(lr) || lr < 0.f)
        return mesh_err(-EINVAL, "nn: learning rate %g is invalid", (double)lr);
    memset(&a, 0, sizeof(a));
    a.lr = lr;
    a.momentum = s->cfg.momentum;
    a.dampening = s->cfg.dampening;
    a.nesterov = s->cfg.nesterov;
    a.first = s->steps == 0;
    for (i = 0; i < s->nruns; i++) {
        const struct sgd_run *r = &s->runs[i];

        a.weight_decay = r->wd;
        a.keep_p = keep_params ? keep_params + r->off : NULL;
        a.keep_buf = keep_params && buf ? keep_mom + r->off : NULL;
        rc = m->ctx->ops->sgd(m->ctx->dev, r->count, m->params + r->off,
                              m->grads + r->off, buf ? buf + r->off : NULL, &a);
        if (rc < 0)
            return rc;
    }
    s->steps++;
    return 0;
}

int mesh_nn_sgd_step(struct mesh_nn_sgd *s, float lr)
{
    return sgd_step(s, lr, NULL, NULL);
}

int mesh_nn_sgd_step_keep(struct mesh_nn_sgd *s, float lr, float *keep_params,
                          float *keep_mom)
{
    if (!keep_params || !keep_mom)
        return mesh_err(-EINVAL, "nn: sgd_step_keep: no array to keep the "
                                 "state in");
    return sgd_step(s, lr, keep_params, keep_mom);
}

float *mesh_nn_sgd_momentum(struct mesh_nn_sgd *s)
{
    return s->mom;
}

int64_t mesh_nn_sgd_steps(const struct mesh_nn_sgd *s)
{
    return s->steps;
}

void mesh_nn_sgd_set_steps(struct mesh_nn_sgd *s, int64_t steps)
{
    s->steps = steps;
}

/* ---- schedules ----------------------------------------------------------- */

int mesh_nn_lr_parse(const char *s, int *kind)
{
    if (strcmp(s, "const") == 0 || strcmp(s, "constant") == 0)
        *kind = MESH_NN_LR_CONST;
    else if (strcmp(s, "step") == 0)
        *kind = MESH_NN_LR_STEP;
    else if (strcmp(s, "cosine") == 0)
        *kind = MESH_NN_LR_COSINE;
    else
        return mesh_err(-EINVAL,
                        "unknown LR schedule \"%s\" (const, step, cosine)", s);
    return 0;
}

double mesh_nn_lr_at(const struct mesh_nn_lr_sched *s, double epoch)
{
    double lr = s->base_lr;
    int i;

    if (epoch < s->warmup_epochs && s->warmup_epochs > 0)
        /* Goyal et al.: linear from warmup_start * lr to lr */
        return s->base_lr * (s->warmup_start + (1.0 - s->warmup_start) * epoch /
                                                   s->warmup_epochs);
    switch (s->kind) {
    case MESH_NN_LR_STEP:
        for (i = 0; i < s->num_milestones && i < 8; i++)
            if (epoch >= s->milestones[i])
                lr *= s->gamma;
        break;
    case MESH_NN_LR_COSINE: {
        double span = s->total_epochs - s->warmup_epochs;
        double t = span > 0 ? (epoch - s->warmup_epochs) / span : 1.0;

        if (t > 1.0)
            t = 1.0;
        lr = s->base_lr * 0.5 * (1.0 + cos(M_PI * t));
        break;
    }
    default:
        break;
    }
    return lr;
}
