/*
 * nn/ctx.c: backend lookup by name, the device context and its plan cache.
 */
#include "config.h"

#include "nn/backend.h"
#include "nn/nn.h"
#include "common/util.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#endif

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
    NULL,
};

/* ---- the cuda module ----------------------------------------------------- */

/* Set once the module is loaded and checked; read without the lock. */
static _Atomic(const struct mesh_nn_cuda_module *) cuda_module;

const struct mesh_nn_cuda_module *mesh_nn_cuda_loaded(void)
{
    return atomic_load_explicit(&cuda_module, memory_order_acquire);
}

#ifdef HAVE_CUDA
#define CUDA_MODULE_FILE "meshtrain-cuda.so"

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
/* The first failure's code and message, said again at every later try. */
static int cuda_rc;
static char cuda_msg[1024];

/*
 * The module's file into path: $MESHTRAIN_CUDA_MODULE when set, else the
 * one in the running program's directory (the build tree, or a relocated
 * install that keeps them together) when it is there, else the installed
 * one in pkglibdir. 0, or -ENOENT with the message naming where it looked.
 */
static int cuda_module_path(char *path, size_t len)
{
    const char *env = getenv("MESHTRAIN_CUDA_MODULE");
    char exe[PATH_MAX], *slash;
    ssize_t n;

    if (env && *env) {
        if ((size_t)snprintf(path, len, "%s", env) >= len)
            return mesh_err(-ENAMETOOLONG, "MESHTRAIN_CUDA_MODULE: too long");
        return 0;
    }
    exe[0] = 0;
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    slash = n > 0 ? memrchr(exe, '/', (size_t)n) : NULL;
    if (slash) {
        *slash = 0;
        if ((size_t)snprintf(path, len, "%s/%s", exe, CUDA_MODULE_FILE) < len &&
            access(path, F_OK) == 0)
            return 0;
    }
    snprintf(path, len, "%s/%s", MESH_PKGLIBDIR, CUDA_MODULE_FILE);
    if (access(path, F_OK) == 0)
        return 0;
    return mesh_err(-ENOENT,
                    "cannot load %s: no such file, nor %s%s%s next to the "
                    "program (MESHTRAIN_CUDA_MODULE may name the file)",
                    path, slash ? exe : "", slash ? "/" : "", CUDA_MODULE_FILE);
}

/* dlopen the module and check its table; 0, or a code with the message. */
static int cuda_module_open(const struct mesh_nn_cuda_module **out)
{
    const struct mesh_nn_cuda_module *m;
    char path[PATH_MAX + 64];
    const char *why;
    size_t n;
    void *h;
    int rc;

    rc = cuda_module_path(path, sizeof(path));
    if (rc < 0)
        return rc;
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        /* dlerror() starts with the path when the module itself failed */
        why = dlerror();
        n = strlen(path);
        if (why && strncmp(why, path, n) == 0 && strncmp(why + n, ": ", 2) == 0)
            why += n + 2;
        return mesh_err(-ENOENT, "cannot load %s: %s", path,
                        why ? why : "dlopen failed");
    }
    m = dlsym(h, "mesh_nn_cuda_module");
    if (!m) {
        rc = mesh_err(-ENOEXEC,
                      "cannot load %s: no mesh_nn_cuda_module "
                      "in it (not meshtrain's cuda module)",
                      path);
        goto fail_close;
    }
    if (m->abi != MESH_NN_CUDA_MODULE_ABI ||
        m->ops_size != sizeof(struct mesh_nn_backend_ops) || !m->version ||
        strcmp(m->version, PACKAGE_VERSION) != 0) {
        rc = mesh_err(-ENOEXEC,
                      "cannot load %s: built for meshtrain %s (module "
                      "interface %d), this is %s (interface %d)",
                      path, m->version ? m->version : "?", m->abi,
                      PACKAGE_VERSION, MESH_NN_CUDA_MODULE_ABI);
        goto fail_close;
    }
    mesh_debug("nn: cuda backend from %s", path);
    *out = m;
    return 0; /* never closed: its ops live as long as the process */

fail_close:
    dlclose(h);
    return rc;
}

/* The cuda backend's ops into *out, the module loaded at the first call:
 * 0, or the first failure's code with its message. */
static int cuda_backend(const struct mesh_nn_backend_ops **out)
{
    const struct mesh_nn_cuda_module *m = mesh_nn_cuda_loaded();
    int rc;

    if (!m) {
        pthread_mutex_lock(&cuda_lock);
        m = mesh_nn_cuda_loaded();
        if (!m && cuda_rc == 0) {
            rc = cuda_module_open(&m);
            if (rc < 0) {
                cuda_rc = rc;
                snprintf(cuda_msg, sizeof(cuda_msg), "%s", mesh_err_msg(rc));
            } else {
                atomic_store_explicit(&cuda_module, m, memory_order_release);
            }
        }
        rc = cuda_rc;
        pthread_mutex_unlock(&cuda_lock);
        if (!m)
            return mesh_err(rc, "%s", cuda_msg);
    }
    *out = m->ops;
    return 0;
}
#endif

/* The ops of backend name into *out: 0, or a code with the message. */
static int backend_lookup(const char *name,
                          const struct mesh_nn_backend_ops **out)
{
    size_t i;

    for (i = 0; backends[i]; i++)
        if (strcmp(backends[i]->name, name) == 0) {
            *out = backends[i];
            return 0;
        }
    if (strcmp(name, "cuda") == 0) {
#ifdef HAVE_CUDA
        return cuda_backend(out);
#else
        return mesh_err(-ENOTSUP, "nn: backend \"cuda\" is not built");
#endif
    }
    if (strcmp(name, "cpu") == 0)
        return mesh_err(-ENOTSUP,
                        "nn: backend \"cpu\" is not built (configure "
                        "found no oneDNN: apt-get install libdnnl-dev)");
    if (strcmp(name, "devsim") == 0)
        return mesh_err(-ENOTSUP,
                        "nn: backend \"devsim\" is not built (it runs "
                        "on the cpu backend: configure found no oneDNN)");
    return mesh_err(-EINVAL, "nn: unknown backend \"%s\" (cpu, cuda, devsim)",
                    name);
}

const struct mesh_nn_backend_ops *mesh_nn_backend_find(const char *name)
{
    const struct mesh_nn_backend_ops *ops = NULL;

    return backend_lookup(name, &ops) < 0 ? NULL : ops;
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
    const struct mesh_nn_backend_ops *ops = NULL;
    struct mesh_nn_ctx *ctx;
    int rc;

    rc = backend_lookup(backend, &ops);
    if (rc < 0)
        return rc;
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
