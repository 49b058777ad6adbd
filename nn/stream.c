/*
 * nn/stream.c: device options, asynchronous device<->host copies and device
 * conversions (nn.h), dispatched to the backend's optional ops, with
 * synchronous fallbacks for backends without streams (the "cpu" backend's
 * memory is host memory: its copies complete before start returns).
 */
#include "config.h"

#include "nn/backend.h"
#include "nn/nn.h"
#include "common/util.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

void mesh_nn_dev_opts_init(struct mesh_nn_dev_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->gpu = -1;
    o->precision = MESH_NN_PREC_DEFAULT;
}

int mesh_nn_precision_parse(const char *s, int *out)
{
    static const struct {
        const char *name;
        int v;
    } t[] = {
        {"fp32", MESH_NN_PREC_FP32},
        {"tf32", MESH_NN_PREC_TF32},
        {"bf16-amp", MESH_NN_PREC_BF16_AMP},
    };
    size_t i;

    for (i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(s, t[i].name) == 0) {
            *out = t[i].v;
            return 0;
        }
    return mesh_err(-EINVAL, "unknown precision \"%s\" (fp32, tf32, bf16-amp)",
                    s);
}

int mesh_nn_alloc(struct mesh_nn_ctx *ctx, size_t bytes, void **out)
{
    return ctx->ops->alloc(ctx->dev, bytes, out);
}

void mesh_nn_free(struct mesh_nn_ctx *ctx, void *p)
{
    if (p)
        ctx->ops->free(ctx->dev, p);
}

long mesh_nn_live_allocs(struct mesh_nn_ctx *ctx)
{
    return ctx->ops->live_allocs ? ctx->ops->live_allocs(ctx->dev) : -1;
}

/*
 * The handle of a synchronous copy: it is complete when start returns, so
 * every later call only releases it. One static object serves them all (no
 * state is kept); its address tells it from a backend's handle.
 */
static struct {
    int unused;
} sync_done;
#define SYNC_COPY ((struct mesh_nn_copy *)(void *)&sync_done)

static int copy_start(struct mesh_nn_ctx *ctx, int to_host, void *dst,
                      const void *src, size_t bytes, struct mesh_nn_copy **out)
{
    int rc;

    if (ctx->ops->copy_start)
        return ctx->ops->copy_start(ctx->dev, to_host, dst, src, bytes, out);
    rc = to_host ? ctx->ops->download(ctx->dev, dst, src, bytes)
                 : ctx->ops->upload(ctx->dev, dst, src, bytes);
    if (rc < 0)
        return rc;
    *out = SYNC_COPY;
    return 0;
}

int mesh_nn_copy_d2h_start(struct mesh_nn_ctx *ctx, void *host_dst,
                           const void *dev_src, size_t bytes,
                           struct mesh_nn_copy **out)
{
    return copy_start(ctx, 1, host_dst, dev_src, bytes, out);
}

int mesh_nn_copy_h2d_start(struct mesh_nn_ctx *ctx, void *dev_dst,
                           const void *host_src, size_t bytes,
                           struct mesh_nn_copy **out)
{
    return copy_start(ctx, 0, dev_dst, host_src, bytes, out);
}

int mesh_nn_copy_test(struct mesh_nn_ctx *ctx, struct mesh_nn_copy *c,
                      int *done)
{
    if (c == SYNC_COPY) {
        *done = 1;
        return 0;
    }
    return ctx->ops->copy_test(ctx->dev, c, done);
}

int mesh_nn_copy_wait(struct mesh_nn_ctx *ctx, struct mesh_nn_copy *c)
{
    if (c == SYNC_COPY)
        return 0;
    return ctx->ops->copy_wait(ctx->dev, c);
}

int mesh_nn_copy_order(struct mesh_nn_ctx *ctx, struct mesh_nn_copy *c)
{
    if (c == SYNC_COPY)
        return 0;
    return ctx->ops->copy_order(ctx->dev, c);
}

int mesh_nn_convert(struct mesh_nn_ctx *ctx, int dst_dtype, void *dst,
                    int src_dtype, const void *src, size_t n, float scale)
{
    if (dst_dtype < MESH_DT_F32 || dst_dtype > MESH_DT_BF16 ||
        src_dtype < MESH_DT_F32 || src_dtype > MESH_DT_BF16)
        return mesh_err(-EINVAL, "nn: convert: bad dtype %d -> %d", src_dtype,
                        dst_dtype);
    if (dst_dtype != MESH_DT_F32 && src_dtype != MESH_DT_F32)
        return mesh_err(-EINVAL, "nn: convert: one side must be float32");
    if (dst == src && dst_dtype != src_dtype)
        return mesh_err(-EINVAL, "nn: convert: in place needs equal types");
    if (!ctx->ops->convert)
        return mesh_err(-ENOTSUP,
                        "nn: backend \"%s\" has no device "
                        "conversion",
                        ctx->ops->name);
    return ctx->ops->convert(ctx->dev, dst_dtype, dst, src_dtype, src, n,
                             scale);
}

/* ---- pinned host memory -------------------------------------------------- */

/* cudaHostAlloc'ed memory only once the cuda module is loaded (a cuda
 * ctx was asked for): a cpu run never maps a CUDA library for it. */
int mesh_nn_host_alloc(size_t len, void **out)
{
    const struct mesh_nn_cuda_module *m = mesh_nn_cuda_loaded();

    if (m && m->host_alloc(len, out) == 0)
        return 0;
    return mesh_host_alloc(len, out);
}

void mesh_nn_host_free(void *p, size_t len)
{
    const struct mesh_nn_cuda_module *m = mesh_nn_cuda_loaded();

    if (!p)
        return;
    if (m && m->host_owns(p)) {
        m->host_free(p);
        return;
    }
    mesh_host_free(p, len);
}

static int allocator_alloc(void *arg, size_t len, void **out)
{
    (void)arg;
    return mesh_nn_host_alloc(len, out);
}

static void allocator_free(void *arg, void *p, size_t len)
{
    (void)arg;
    mesh_nn_host_free(p, len);
}

const struct mesh_host_allocator mesh_nn_host_allocator = {
    .alloc = allocator_alloc,
    .free = allocator_free,
};
