/*
 * nn/weights.c: model weights as safetensors with torchvision's names, in
 * its state_dict order (each BN's weight, bias, running_mean, running_var,
 * num_batches_tracked together), so that files load in PyTorch with
 * model.load_state_dict(safetensors.torch.load_file(path)) and torchvision's
 * exported weights load here.
 */
#include "config.h"

#include "nn/model-internal.h"
#include "nn/safetensors.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The host copy of the slabs, and the file's entries pointing into it. */
struct host_state {
    float *p, *b;
    int64_t nbt;
    struct mesh_st_entry *e;
    char (*names)[48];
    int ne;
};

static void host_free(struct host_state *h)
{
    free(h->p);
    free(h->b);
    free(h->e);
    free(h->names);
}

/* The next entry: float32 tensor t, its data at slab + t->offset. */
static void add_entry(struct host_state *h, const struct mesh_nn_tensor *t,
                      const float *slab)
{
    struct mesh_st_entry *e = &h->e[h->ne++];

    e->name = t->name;
    e->dtype = MESH_DT_F32;
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof(t->shape));
    e->data = slab + t->offset;
}

/* A BN's buffers follow its bias: running_mean, running_var, then nbt. */
static int build_entries(struct mesh_nn_model *m, struct host_state *h)
{
    int i, j;

    h->e = calloc((size_t)m->nt * 2, sizeof(*h->e));
    h->names = calloc((size_t)m->nt, sizeof(*h->names));
    if (!h->e || !h->names)
        return mesh_err(-ENOMEM, "nn: out of memory");
    for (i = 0; i < m->nt; i++) {
        const struct mesh_nn_tensor *t = &m->t[i];
        struct mesh_st_entry *e;

        if (t->kind != MESH_NN_PARAM)
            continue;
        add_entry(h, t, h->p);
        if (t->role != MESH_NN_ROLE_BN_BIAS)
            continue;
        {
            int len = (int)strlen(t->name) - (int)strlen(".bias");

            for (j = 0; j < m->nt; j++) {
                const struct mesh_nn_tensor *u = &m->t[j];

                if (u->kind != MESH_NN_BUFFER ||
                    strncmp(u->name, t->name, (size_t)len) != 0 ||
                    u->name[len] != '.')
                    continue;
                add_entry(h, u, h->b);
            }
            snprintf(h->names[i], sizeof(h->names[i]),
                     "%.*s.num_batches_tracked", len, t->name);
            e = &h->e[h->ne++];
            e->name = h->names[i];
            e->dtype = MESH_ST_I64;
            e->ndim = 0;
            e->data = &h->nbt;
        }
    }
    return 0;
}

static int host_alloc(struct mesh_nn_model *m, struct host_state *h)
{
    memset(h, 0, sizeof(*h));
    h->p = malloc(m->nparams * sizeof(float));
    h->b = malloc((m->nbuffers ? m->nbuffers : 1) * sizeof(float));
    if (!h->p || !h->b)
        return mesh_err(-ENOMEM, "nn: out of memory");
    return build_entries(m, h);
}

int mesh_nn_model_save(struct mesh_nn_model *m, const char *path)
{
    const struct mesh_nn_backend_ops *o = m->ctx->ops;
    const char *meta[] = {"format", "pt", "arch", m->arch, NULL};
    struct host_state h;
    int rc;

    rc = host_alloc(m, &h);
    if (rc == 0)
        rc = o->download(m->ctx->dev, h.p, m->params,
                         m->nparams * sizeof(float));
    if (rc == 0)
        rc = o->download(m->ctx->dev, h.b, m->buffers,
                         m->nbuffers * sizeof(float));
    h.nbt = m->batches_tracked;
    if (rc == 0)
        rc = mesh_st_write(path, h.e, h.ne, meta);
    if (rc < 0)
        mesh_err_prefix(rc, "saving weights to %s", path);
    host_free(&h);
    return rc;
}

int mesh_nn_model_load(struct mesh_nn_model *m, const char *path)
{
    const struct mesh_nn_backend_ops *o = m->ctx->ops;
    struct mesh_st_file *f = NULL;
    struct host_state h;
    int rc, i, have_nbt = 0;

    rc = host_alloc(m, &h);
    if (rc == 0)
        rc = mesh_st_open(path, &f);
    for (i = 0; rc == 0 && i < h.ne; i++) {
        const struct mesh_st_entry *e = &h.e[i];

        if (e->dtype == MESH_ST_I64) {
            int64_t v = 0;

            /* every BN counts the same steps here; keep the first */
            rc = mesh_st_read(f, e->name, MESH_ST_I64, NULL, 0, &v);
            if (rc == 0 && !have_nbt) {
                h.nbt = v;
                have_nbt = 1;
            }
            continue;
        }
        rc = mesh_st_read(f, e->name, MESH_DT_F32, e->shape, e->ndim,
                          (void *)e->data);
    }
    if (rc == 0)
        rc = o->upload(m->ctx->dev, m->params, h.p, m->nparams * sizeof(float));
    if (rc == 0)
        rc = o->upload(m->ctx->dev, m->buffers, h.b,
                       m->nbuffers * sizeof(float));
    if (rc == 0)
        m->batches_tracked = h.nbt;
    else
        mesh_err_prefix(rc, "loading weights from %s", path);
    mesh_st_close(f);
    host_free(&h);
    return rc;
}
