/*
 * nn/ctx.c: backend lookup by name, the device context and its plan cache.
 */
#include "config.h"

#include "nn/backend.h"
#include "nn/nn.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* One cached plan; the descriptor is the key (memset before filling). */
struct mesh_nn_plan_entry {
    struct mesh_nn_plan_desc d;
    struct mesh_nn_plan *plan;
    struct mesh_nn_plan_entry *next;
};

static const struct mesh_nn_backend_ops *const backends[] = {
#ifdef HAVE_DNNL
    &mesh_nn_cpu_ops,
    &mesh_nn_devsim_ops, /* a GPU test double over cpu (nn/devsim.c) */
#endif
#ifdef HAVE_CUDA
    &mesh_nn_cuda_ops,
#endif
    NULL,
};

const struct mesh_nn_backend_ops *mesh_nn_backend_find(const char *name)
{
    size_t i;

    for (i = 0; backends[i]; i++)
        if (strcmp(backends[i]->name, name) == 0)
            return backends[i];
    if (strcmp(name, "cpu") == 0)
        mesh_err(-ENOTSUP, "nn: backend \"cpu\" is not built (configure "
                           "found no oneDNN: apt-get install libdnnl-dev)");
    else if (strcmp(name, "cuda") == 0)
        mesh_err(-ENOTSUP, "nn: backend \"cuda\" is not built");
    else if (strcmp(name, "devsim") == 0)
        mesh_err(-ENOTSUP, "nn: backend \"devsim\" is not built (it runs "
                           "on the cpu backend: configure found no oneDNN)");
    else
        mesh_err(-EINVAL, "nn: unknown backend \"%s\" (cpu, cuda, devsim)",
                 name);
    return NULL;
}

int mesh_nn_backend_check(const char *backend)
{
    return mesh_nn_backend_find(backend) ? 0 : -EINVAL;
}

int mesh_nn_ctx_open(const char *backend, int threads, struct mesh_nn_ctx **out)
{
    struct mesh_nn_dev_opts o;

    mesh_nn_dev_opts_init(&o);
    o.threads = threads;
    return mesh_nn_ctx_open_opts(backend, &o, out);
}

int mesh_nn_ctx_open_opts(const char *backend, const struct mesh_nn_dev_opts *o,
                          struct mesh_nn_ctx **out)
{
    const struct mesh_nn_backend_ops *ops = mesh_nn_backend_find(backend);
    struct mesh_nn_ctx *ctx;
    int rc;

    if (!ops)
        return backends[0] ? -EINVAL : -ENOTSUP;
    if (!ops->dev_open_opts && o->precision != MESH_NN_PREC_DEFAULT &&
        o->precision != MESH_NN_PREC_FP32)
        return mesh_err(-ENOTSUP,
                        "nn: backend \"%s\" computes in fp32 "
                        "only (no tf32 or bf16-amp)",
                        backend);
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return mesh_err(-ENOMEM, "nn: out of memory");
    ctx->ops = ops;
    ctx->threads = o->threads;
    rc = ops->dev_open_opts ? ops->dev_open_opts(o, &ctx->dev)
                            : ops->dev_open(o->threads, &ctx->dev);
    if (rc < 0) {
        free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

void mesh_nn_ctx_close(struct mesh_nn_ctx *ctx)
{
    struct mesh_nn_plan_entry *e, *next;

    if (!ctx)
        return;
    for (e = ctx->plans; e; e = next) {
        next = e->next;
        ctx->ops->plan_destroy(ctx->dev, e->plan);
        free(e);
    }
    ctx->ops->dev_close(ctx->dev);
    free(ctx);
}

const char *mesh_nn_ctx_describe(struct mesh_nn_ctx *ctx)
{
    return ctx->ops->dev_describe(ctx->dev);
}

int mesh_nn_upload(struct mesh_nn_ctx *ctx, void *dev_dst, const void *host_src,
                   size_t bytes)
{
    return ctx->ops->upload(ctx->dev, dev_dst, host_src, bytes);
}

int mesh_nn_download(struct mesh_nn_ctx *ctx, void *host_dst,
                     const void *dev_src, size_t bytes)
{
    return ctx->ops->download(ctx->dev, host_dst, dev_src, bytes);
}

int mesh_nn_sync(struct mesh_nn_ctx *ctx)
{
    return ctx->ops->sync(ctx->dev);
}

int mesh_nn_ctx_plan(struct mesh_nn_ctx *ctx, const struct mesh_nn_plan_desc *d,
                     struct mesh_nn_plan **out)
{
    struct mesh_nn_plan_entry *e;
    int rc;

    for (e = ctx->plans; e; e = e->next)
        if (memcmp(&e->d, d, sizeof(*d)) == 0) {
            *out = e->plan;
            return 0;
        }
    e = calloc(1, sizeof(*e));
    if (!e)
        return mesh_err(-ENOMEM, "nn: out of memory");
    rc = ctx->ops->plan_create(ctx->dev, d, &e->plan);
    if (rc < 0) {
        free(e);
        return rc;
    }
    e->d = *d;
    e->next = ctx->plans;
    ctx->plans = e;
    *out = e->plan;
    return 0;
}
