/*
 * nn/cpu_dnnl.c: the "cpu" backend of nn on oneDNN's C API (dnnl.h, 2.x).
 *
 * - Activations with a channel count that is a multiple of the CPU's
 *   vector block (16 floats on AVX-512, 8 on AVX2) live in oneDNN's blocked
 *   layout nChw16c / nChw8c, which its convolutions, batch norm, pooling and
 *   binary ops all read and write directly, so no reorder runs between
 *   layers. Other channel counts (the 3-channel input) stay NCHW.
 * - Weights stay plain OIHW in the slab; each conv plan holds the reorder
 *   primitives to and from the layout its convolution prefers, and the
 *   reordered copy lives in the caller's workspace.
 * - Every primitive is created once, in plan_create; memory objects are
 *   created with no data and pointed at the caller's buffers per call.
 *   Scratchpads are user-provided (the workspace), so nothing allocates per
 *   call.
 * - Threads: Debian's libdnnl runs on OpenMP (DNNL_CPU_THREADING_RUNTIME ==
 *   DNNL_RUNTIME_OMP); omp_set_num_threads() sets the count for the calling
 *   thread, so every op sets it again (cheap) in case the trainer calls from
 *   a thread other than the one that opened the device.
 * A device is used by one thread at a time (the memory objects carry state).
 */
#include "config.h"

#include "nn/backend.h"
#include "nn/cpu-bn.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#define MESH_DNNL_OMP 1
#endif

/* Check a oneDNN call: on failure record what failed and jump. */
#define DNNL_CHECK(rc, expr, label, what)                                      \
    do {                                                                       \
        dnnl_status_t st_ = (expr);                                            \
        if (st_ != dnnl_success) {                                             \
            (rc) = mesh_err(st_ == dnnl_out_of_memory ? -ENOMEM : -EIO,        \
                            "oneDNN %s: %s", (what), status_str(st_));         \
            goto label;                                                        \
        }                                                                      \
    } while (0)

#define MAX_ARGS 12

/* A primitive with its argument list; memory objects are set per call. */
struct prim {
    dnnl_primitive_t p;
    dnnl_primitive_desc_t pd;
    int nargs;
    dnnl_exec_arg_t args[MAX_ARGS];
    size_t scratch; /* bytes of user scratchpad, 0 if none */
};

/* A reorder between a user layout and a primitive's layout (or none). */
struct reo {
    struct prim r; /* r.p == NULL: layouts equal, nothing to do */
    size_t bytes;  /* size of the primitive-side buffer */
};

struct mesh_nn_plan {
    struct mesh_nn_plan_desc d;
    size_t ws, reserve;
    /* CONV: fwd, bwd data, bwd weights (the stem's bwd data may be NULL). */
    struct prim fwd, bwd, bwdw, infer;
    struct reo w_fwd, w_bwd, dw;
    /* bwd weights on plain copies of x and dy (see plan_conv_bwdw_plain) */
    struct reo x_bw, dy_bw;
    struct mesh_nn_cpu_bn bn; /* BN: ours, not oneDNN's */
};

struct mesh_nn_dev {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    int threads;
    int block; /* 16, 8 or 0 (plain only) */
    long live; /* blocks allocated and not freed (atomic) */
    char desc[160];
};

static const char *status_str(dnnl_status_t s)
{
    switch (s) {
    case dnnl_success:
        return "success";
    case dnnl_out_of_memory:
        return "out of memory";
    case dnnl_invalid_arguments:
        return "invalid arguments";
    case dnnl_unimplemented:
        return "unimplemented";
    case dnnl_iterator_ends:
        return "iterator ends";
    case dnnl_runtime_error:
        return "runtime error";
    case dnnl_not_required:
        return "not required";
    default:
        return "unknown status";
    }
}

static void set_threads(struct mesh_nn_dev *dev)
{
#ifdef MESH_DNNL_OMP
    omp_set_num_threads(dev->threads);
#else
    (void)dev;
#endif
}

/* ---- device ------------------------------------------------------------- */

static int cpu_dev_open(int threads, struct mesh_nn_dev **out)
{
    struct mesh_nn_dev *dev;
    dnnl_cpu_isa_t isa;
    int rc = 0;

    dev = calloc(1, sizeof(*dev));
    if (!dev)
        return mesh_err(-ENOMEM, "nn cpu: out of memory");
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    dev->threads = threads;
    set_threads(dev);
    DNNL_CHECK(rc, dnnl_engine_create(&dev->eng, dnnl_cpu, 0), fail_free,
               "engine_create");
    DNNL_CHECK(
        rc, dnnl_stream_create(&dev->strm, dev->eng, dnnl_stream_default_flags),
        fail_engine, "stream_create");
    isa = dnnl_get_effective_cpu_isa();
    if (isa == dnnl_cpu_isa_avx512_core || isa == dnnl_cpu_isa_all ||
        (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core)
        dev->block = 16;
    else if ((isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2)
        dev->block = 8;
    else
        dev->block = 0;
    {
        const dnnl_version_t *v = dnnl_version();
        snprintf(dev->desc, sizeof(dev->desc),
                 "cpu: oneDNN %d.%d.%d, %s threads %d, activations %s",
                 v->major, v->minor, v->patch,
#ifdef MESH_DNNL_OMP
                 "OpenMP",
#else
                 "native",
#endif
                 dev->threads,
                 dev->block == 16  ? "nChw16c"
                 : dev->block == 8 ? "nChw8c"
                                   : "NCHW");
    }
    *out = dev;
    return 0;

fail_engine:
    dnnl_engine_destroy(dev->eng);
fail_free:
    free(dev);
    return rc;
}

static void cpu_dev_close(struct mesh_nn_dev *dev)
{
    if (!dev)
        return;
    dnnl_stream_destroy(dev->strm);
    dnnl_engine_destroy(dev->eng);
    free(dev);
}

static const char *cpu_dev_describe(struct mesh_nn_dev *dev)
{
    return dev->desc;
}

static int cpu_alloc(struct mesh_nn_dev *dev, size_t bytes, void **out)
{
    void *p = NULL;
    int e;

    /* 64-byte alignment: one AVX-512 vector, oneDNN's preference. */
    e = posix_memalign(&p, 64, bytes ? bytes : 64);
    if (e)
        return mesh_err(-ENOMEM, "nn cpu: cannot allocate %zu bytes", bytes);
    memset(p, 0, bytes);
    *out = p;
    __atomic_add_fetch(&dev->live, 1, __ATOMIC_RELAXED);
    return 0;
}

static void cpu_free(struct mesh_nn_dev *dev, void *p)
{
    if (p)
        __atomic_sub_fetch(&dev->live, 1, __ATOMIC_RELAXED);
    free(p);
}

static long cpu_live_allocs(struct mesh_nn_dev *dev)
{
    return __atomic_load_n(&dev->live, __ATOMIC_RELAXED);
}

static int cpu_copy(struct mesh_nn_dev *dev, void *dst, const void *src,
                    size_t bytes)
{
    (void)dev;
    if (bytes)
        memmove(dst, src, bytes);
    return 0;
}

static int cpu_zero(struct mesh_nn_dev *dev, void *p, size_t bytes)
{
    (void)dev;
    if (bytes)
        memset(p, 0, bytes);
    return 0;
}

static int cpu_sync(struct mesh_nn_dev *dev)
{
    int rc = 0;

    DNNL_CHECK(rc, dnnl_stream_wait(dev->strm), out, "stream_wait");
out:
    return rc;
}

/* ---- memory descriptors ------------------------------------------------- */

static dnnl_format_tag_t act_tag(const struct mesh_nn_dev *dev, int c)
{
    if (dev->block == 16 && c % 16 == 0)
        return dnnl_nChw16c;
    if (dev->block == 8 && c % 8 == 0)
        return dnnl_nChw8c;
    return dnnl_nchw;
}

static int md_act(const struct mesh_nn_dev *dev, dnnl_memory_desc_t *md, int n,
                  int c, int h, int w)
{
    dnnl_dims_t dims = {n, c, h, w, 0, 0, 0, 0, 0, 0, 0, 0};
    int rc = 0;

    DNNL_CHECK(
        rc,
        dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_f32, act_tag(dev, c)),
        out, "memory_desc_init (activation)");
out:
    return rc;
}

static int md_tag(dnnl_memory_desc_t *md, int nd, const int64_t *dims,
                  dnnl_format_tag_t tag)
{
    dnnl_dims_t full = {0};
    int rc = 0, i;

    for (i = 0; i < nd; i++)
        full[i] = dims[i];
    DNNL_CHECK(rc, dnnl_memory_desc_init_by_tag(md, nd, full, dnnl_f32, tag),
               out, "memory_desc_init");
out:
    return rc;
}

static size_t cpu_act_bytes(struct mesh_nn_dev *dev, int n, int c, int h, int w)
{
    dnnl_memory_desc_t md;

    if (md_act(dev, &md, n, c, h, w) < 0)
        return 0;
    return dnnl_memory_desc_get_size(&md);
}

/* ---- primitives ---------------------------------------------------------- */

static void prim_fini(struct prim *p)
{
    int i;

    for (i = 0; i < p->nargs; i++)
        dnnl_memory_destroy(p->args[i].memory);
    p->nargs = 0;
    if (p->p)
        dnnl_primitive_destroy(p->p);
    p->p = NULL;
    if (p->pd)
        dnnl_primitive_desc_destroy(p->pd);
    p->pd = NULL;
}

/*
 * Add an argument whose memory descriptor the primitive reports (or md,
 * when the caller knows it: per-channel vectors).
 */
static int prim_arg_md(struct mesh_nn_dev *dev, struct prim *p, int arg,
                       dnnl_query_t q, int idx, const dnnl_memory_desc_t *md)
{
    int rc = 0;

    if (p->nargs >= MAX_ARGS)
        return mesh_err(-EINVAL, "nn cpu: too many primitive arguments");
    if (!md)
        md = dnnl_primitive_desc_query_md(p->pd, q, idx);
    if (!md)
        return mesh_err(-EIO, "oneDNN: query of argument %d failed", arg);
    DNNL_CHECK(rc,
               dnnl_memory_create(&p->args[p->nargs].memory, md, dev->eng,
                                  DNNL_MEMORY_NONE),
               out, "memory_create");
    p->args[p->nargs].arg = arg;
    p->nargs++;
out:
    return rc;
}

static int prim_arg(struct mesh_nn_dev *dev, struct prim *p, int arg,
                    dnnl_query_t q, int idx)
{
    return prim_arg_md(dev, p, arg, q, idx, NULL);
}

/*
 * Create the primitive from an op descriptor: user scratchpad, optional
 * post-ops, then the arguments listed as (arg, query, index) triples.
 */
struct argq {
    int arg;
    dnnl_query_t q;
    int idx;
    const dnnl_memory_desc_t *md; /* used instead of the query if set */
};

static int prim_init(struct mesh_nn_dev *dev, struct prim *p,
                     const_dnnl_op_desc_t od, dnnl_post_ops_t post,
                     const_dnnl_primitive_desc_t hint, const struct argq *a,
                     int na, const char *what)
{
    dnnl_primitive_attr_t attr = NULL;
    const dnnl_memory_desc_t *sp;
    int rc = 0, i;

    memset(p, 0, sizeof(*p));
    DNNL_CHECK(rc, dnnl_primitive_attr_create(&attr), fail, what);
    DNNL_CHECK(rc,
               dnnl_primitive_attr_set_scratchpad_mode(
                   attr, dnnl_scratchpad_mode_user),
               fail_attr, what);
    if (post)
        DNNL_CHECK(rc, dnnl_primitive_attr_set_post_ops(attr, post), fail_attr,
                   what);
    DNNL_CHECK(rc, dnnl_primitive_desc_create(&p->pd, od, attr, dev->eng, hint),
               fail_attr, what);
    DNNL_CHECK(rc, dnnl_primitive_create(&p->p, p->pd), fail_pd, what);
    for (i = 0; i < na; i++) {
        rc = prim_arg_md(dev, p, a[i].arg, a[i].q, a[i].idx, a[i].md);
        if (rc < 0)
            goto fail_pd;
    }
    sp = dnnl_primitive_desc_query_md(p->pd, dnnl_query_scratchpad_md, 0);
    p->scratch = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if (p->scratch) {
        rc = prim_arg(dev, p, DNNL_ARG_SCRATCHPAD, dnnl_query_scratchpad_md, 0);
        if (rc < 0)
            goto fail_pd;
    }
    if (mesh_log_enabled(MESH_LOG_DEBUG)) {
        const char *impl = NULL;

        if (dnnl_primitive_desc_query(p->pd, dnnl_query_impl_info_str, 0,
                                      &impl) == dnnl_success &&
            impl)
            mesh_debug("nn cpu: %s uses %s", what, impl);
    }
    dnnl_primitive_attr_destroy(attr);
    return 0;

fail_pd:
    prim_fini(p);
fail_attr:
    if (attr)
        dnnl_primitive_attr_destroy(attr);
fail:
    return rc;
}

/* The memory descriptor a primitive wants for one argument. */
static const dnnl_memory_desc_t *prim_md(const struct prim *p, dnnl_query_t q,
                                         int idx)
{
    return dnnl_primitive_desc_query_md(p->pd, q, idx);
}

/*
 * Run a primitive: handles are given in the order of its arguments (the
 * scratchpad last, taken from ws). Returns 0 or -EIO.
 */
static int prim_run(struct mesh_nn_dev *dev, struct prim *p, void *const *h,
                    void *ws, const char *what)
{
    int rc = 0, i;

    set_threads(dev);
    for (i = 0; i < p->nargs; i++) {
        void *ptr = p->args[i].arg == DNNL_ARG_SCRATCHPAD ? ws : h[i];

        DNNL_CHECK(
            rc,
            dnnl_memory_set_data_handle_v2(p->args[i].memory, ptr, dev->strm),
            out, "set_data_handle");
    }
    DNNL_CHECK(rc, dnnl_primitive_execute(p->p, dev->strm, p->nargs, p->args),
               out, what);
out:
    return rc;
}

/* A reorder from md src to md dst, or none when they are equal. */
static int reo_init(struct mesh_nn_dev *dev, struct reo *r,
                    const dnnl_memory_desc_t *src,
                    const dnnl_memory_desc_t *dst, int prim_is_dst)
{
    dnnl_primitive_attr_t attr = NULL;
    int rc = 0;

    memset(r, 0, sizeof(*r));
    if (dnnl_memory_desc_equal(src, dst))
        return 0;
    r->bytes = dnnl_memory_desc_get_size(prim_is_dst ? dst : src);
    DNNL_CHECK(rc, dnnl_primitive_attr_create(&attr), fail, "reorder");
    DNNL_CHECK(rc,
               dnnl_primitive_attr_set_scratchpad_mode(
                   attr, dnnl_scratchpad_mode_user),
               fail_attr, "reorder");
    DNNL_CHECK(rc,
               dnnl_reorder_primitive_desc_create(&r->r.pd, src, dev->eng, dst,
                                                  dev->eng, attr),
               fail_attr, "reorder_primitive_desc_create");
    DNNL_CHECK(rc, dnnl_primitive_create(&r->r.p, r->r.pd), fail_pd,
               "reorder primitive_create");
    rc = prim_arg(dev, &r->r, DNNL_ARG_FROM, dnnl_query_src_md, 0);
    if (rc == 0)
        rc = prim_arg(dev, &r->r, DNNL_ARG_TO, dnnl_query_dst_md, 0);
    if (rc == 0) {
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(r->r.pd, dnnl_query_scratchpad_md, 0);

        r->r.scratch = sp ? dnnl_memory_desc_get_size(sp) : 0;
        if (r->r.scratch)
            rc = prim_arg(dev, &r->r, DNNL_ARG_SCRATCHPAD,
                          dnnl_query_scratchpad_md, 0);
    }
    if (rc < 0)
        goto fail_pd;
    dnnl_primitive_attr_destroy(attr);
    return 0;

fail_pd:
    prim_fini(&r->r);
    r->bytes = 0;
fail_attr:
    dnnl_primitive_attr_destroy(attr);
fail:
    return rc;
}

static int reo_run(struct mesh_nn_dev *dev, struct reo *r, const void *from,
                   void *to, void *ws)
{
    void *h[2] = {(void *)from, to};

    return prim_run(dev, &r->r, h, ws, "reorder");
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* ---- plans --------------------------------------------------------------- */

/* Whether oneDNN picked its reference (scalar, unblocked) implementation. */
static int prim_is_ref(const struct prim *p)
{
    const char *impl = NULL;

    return dnnl_primitive_desc_query(p->pd, dnnl_query_impl_info_str, 0,
                                     &impl) == dnnl_success &&
           impl && strncmp(impl, "ref", 3) == 0;
}

/*
 * oneDNN 2.6 has no JIT kernel for the weight gradient of some convolutions
 * on blocked activations: a 3x3 convolution on 2x2 or 1x1 maps (the last
 * stage of a ResNet on small images) and a stem with one input channel.
 * There it falls back to "ref:any", a scalar loop that took 500 ms where
 * the whole rest of the step took 100 ms. On plain (nchw) copies of x and
 * dy its GEMM-based kernel does the same job in a few milliseconds, so
 * when the blocked primitive is the reference one, the plan reorders x and
 * dy to plain copies in the workspace and uses that kernel instead. Returns
 * 0 with the plan unchanged when the plain form is no better.
 */
static int
plan_conv_bwdw_plain(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl,
                     const dnnl_memory_desc_t *x, const dnnl_memory_desc_t *y,
                     const dnnl_memory_desc_t *w_any, const dnnl_dims_t st,
                     const dnnl_dims_t pad, const dnnl_dims_t padr)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    const int64_t xd[4] = {d->n, d->c, d->h, d->w};
    const int64_t yd[4] = {d->n, d->k, d->oh, d->ow};
    dnnl_memory_desc_t xp, yp;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t hint = NULL;
    struct prim alt;
    int rc;

    if ((rc = md_tag(&xp, 4, xd, dnnl_nchw)) < 0 ||
        (rc = md_tag(&yp, 4, yd, dnnl_nchw)) < 0)
        return rc;
    if (dnnl_memory_desc_equal(&xp, x) && dnnl_memory_desc_equal(&yp, y))
        return 0; /* already plain: nothing better to try */
    DNNL_CHECK(rc,
               dnnl_convolution_forward_desc_init(
                   &cd, dnnl_forward_training, dnnl_convolution_direct, &xp,
                   w_any, NULL, &yp, st, pad, padr),
               out, "convolution_forward_desc_init (plain)");
    DNNL_CHECK(rc, dnnl_primitive_desc_create(&hint, &cd, NULL, dev->eng, NULL),
               out, "conv fwd (plain hint)");
    DNNL_CHECK(
        rc,
        dnnl_convolution_backward_weights_desc_init(
            &cd, dnnl_convolution_direct, &xp, w_any, NULL, &yp, st, pad, padr),
        out, "convolution_backward_weights_desc_init (plain)");
    {
        const struct argq a[] = {
            {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
            {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
            {DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, NULL},
        };
        rc = prim_init(dev, &alt, &cd, NULL, hint, a, 3,
                       "conv bwd weights (plain)");
        if (rc < 0)
            goto out;
    }
    if (prim_is_ref(&alt)) {
        prim_fini(&alt);
        goto out;
    }
    rc = reo_init(dev, &pl->x_bw, x, prim_md(&alt, dnnl_query_src_md, 0), 1);
    if (rc == 0)
        rc = reo_init(dev, &pl->dy_bw, y,
                      prim_md(&alt, dnnl_query_diff_dst_md, 0), 1);
    if (rc < 0) {
        prim_fini(&alt);
        prim_fini(&pl->x_bw.r);
        pl->x_bw.bytes = 0;
        goto out;
    }
    prim_fini(&pl->bwdw);
    pl->bwdw = alt;
    mesh_debug("nn cpu: conv %dx%d on %dx%d, %d -> %d channels: weight "
               "gradient on plain copies of x and dy",
               d->r, d->s, d->h, d->w, d->c, d->k);
out:
    if (hint)
        dnnl_primitive_desc_destroy(hint);
    return rc;
}

static int plan_conv(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    dnnl_memory_desc_t x, y, w_any, w_user;
    dnnl_convolution_desc_t cd;
    dnnl_dims_t st = {d->stride, d->stride};
    dnnl_dims_t pad = {d->pad, d->pad};
    int64_t wd[4] = {d->k, d->c, d->r, d->s};
    int64_t pr_h = (int64_t)(d->oh - 1) * d->stride + d->r - d->h - d->pad;
    int64_t pr_w = (int64_t)(d->ow - 1) * d->stride + d->s - d->w - d->pad;
    dnnl_dims_t padr = {pr_h, pr_w};
    size_t need;
    int rc;

    if ((rc = md_act(dev, &x, d->n, d->c, d->h, d->w)) < 0 ||
        (rc = md_act(dev, &y, d->n, d->k, d->oh, d->ow)) < 0 ||
        (rc = md_tag(&w_any, 4, wd, dnnl_format_tag_any)) < 0 ||
        (rc = md_tag(&w_user, 4, wd, dnnl_oihw)) < 0)
        return rc;

    rc = 0;
    DNNL_CHECK(rc,
               dnnl_convolution_forward_desc_init(
                   &cd, dnnl_forward_training, dnnl_convolution_direct, &x,
                   &w_any, NULL, &y, st, pad, padr),
               out, "convolution_forward_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
            {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, NULL},
            {DNNL_ARG_DST, dnnl_query_dst_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->fwd, &cd, NULL, NULL, a, 3, "conv fwd");
        if (rc < 0)
            goto out;
    }
    rc = reo_init(dev, &pl->w_fwd, &w_user,
                  prim_md(&pl->fwd, dnnl_query_weights_md, 0), 1);
    if (rc < 0)
        goto out;

    DNNL_CHECK(
        rc,
        dnnl_convolution_backward_weights_desc_init(
            &cd, dnnl_convolution_direct, &x, &w_any, NULL, &y, st, pad, padr),
        out, "convolution_backward_weights_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
            {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
            {DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->bwdw, &cd, NULL, pl->fwd.pd, a, 3,
                       "conv bwd weights");
        if (rc < 0)
            goto out;
    }
    if (prim_is_ref(&pl->bwdw)) {
        rc = plan_conv_bwdw_plain(dev, pl, &x, &y, &w_any, st, pad, padr);
        if (rc < 0)
            goto out;
    }
    rc =
        reo_init(dev, &pl->dw,
                 prim_md(&pl->bwdw, dnnl_query_diff_weights_md, 0), &w_user, 0);
    if (rc < 0)
        goto out;

    /*
     * Backward data: the stem's input (3 channels, plain) needs no gradient
     * and oneDNN may have no fast kernel for it; its absence is reported
     * only when someone asks for it.
     */
    DNNL_CHECK(rc,
               dnnl_convolution_backward_data_desc_init(
                   &cd, dnnl_convolution_direct, &x, &w_any, &y, st, pad, padr),
               out, "convolution_backward_data_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
            {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, NULL},
            {DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->bwd, &cd, NULL, pl->fwd.pd, a, 3,
                       "conv bwd data");
        if (rc < 0) {
            mesh_err_clear();
            rc = 0;
        } else {
            rc = reo_init(dev, &pl->w_bwd, &w_user,
                          prim_md(&pl->bwd, dnnl_query_weights_md, 0), 1);
            if (rc < 0)
                goto out;
        }
    }

    /* Workspace: the reordered weights, then the scratchpad. */
    need = align64(pl->w_fwd.bytes) +
           MESH_MAX(pl->fwd.scratch, pl->w_fwd.r.scratch);
    pl->ws = need;
    need = align64(pl->dw.bytes) + align64(pl->x_bw.bytes) +
           align64(pl->dy_bw.bytes) +
           MESH_MAX(MESH_MAX(pl->bwdw.scratch, pl->dw.r.scratch),
                    MESH_MAX(pl->x_bw.r.scratch, pl->dy_bw.r.scratch));
    pl->ws = MESH_MAX(pl->ws, need);
    need = align64(pl->w_bwd.bytes) +
           MESH_MAX(pl->bwd.scratch, pl->w_bwd.r.scratch);
    pl->ws = MESH_MAX(pl->ws, need);
out:
    return rc;
}

/*
 * Batch norm is ours (nn/cpu_bn.c), not oneDNN's: oneDNN sums its
 * statistics in float32, which flips ReLU masks near zero that PyTorch
 * (summing in double) keeps; see the top of nn/cpu_bn.c. It reads and
 * writes the same layouts as oneDNN's primitives.
 */
static int plan_bn(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    struct mesh_nn_cpu_bn *b = &pl->bn;

    b->n = d->n;
    b->c = d->c;
    b->hw = d->h * d->w;
    b->block = act_tag(dev, d->c) == dnnl_nchw ? 1 : dev->block;
    b->relu = d->relu;
    b->eps = d->eps;
    pl->ws = mesh_nn_cpu_bn_ws_bytes(b);
    pl->reserve = mesh_nn_cpu_bn_reserve_bytes(b);
    return 0;
}

static int plan_relu(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    dnnl_eltwise_desc_t ed;
    dnnl_memory_desc_t x;
    int rc;

    if ((rc = md_act(dev, &x, d->n, d->c, d->h, d->w)) < 0)
        return rc;
    DNNL_CHECK(rc,
               dnnl_eltwise_forward_desc_init(&ed, dnnl_forward_training,
                                              dnnl_eltwise_relu_use_dst_for_bwd,
                                              &x, 0.f, 0.f),
               out, "eltwise_forward_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
            {DNNL_ARG_DST, dnnl_query_dst_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->fwd, &ed, NULL, NULL, a, 2, "relu fwd");
        if (rc < 0)
            goto out;
    }
    DNNL_CHECK(rc,
               dnnl_eltwise_backward_desc_init(
                   &ed, dnnl_eltwise_relu_use_dst_for_bwd, &x, &x, 0.f, 0.f),
               out, "eltwise_backward_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_DST, dnnl_query_dst_md, 0, NULL},
            {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
            {DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->bwd, &ed, NULL, pl->fwd.pd, a, 3, "relu bwd");
        if (rc < 0)
            goto out;
    }
    pl->ws = MESH_MAX(pl->fwd.scratch, pl->bwd.scratch);
out:
    return rc;
}

static int plan_add(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    dnnl_binary_desc_t bd;
    dnnl_post_ops_t post = NULL;
    dnnl_memory_desc_t x;
    int rc;

    if ((rc = md_act(dev, &x, d->n, d->c, d->h, d->w)) < 0)
        return rc;
    DNNL_CHECK(rc, dnnl_binary_desc_init(&bd, dnnl_binary_add, &x, &x, &x), out,
               "binary_desc_init");
    if (d->relu) {
        DNNL_CHECK(rc, dnnl_post_ops_create(&post), out, "post_ops_create");
        DNNL_CHECK(rc,
                   dnnl_post_ops_append_eltwise(post, 1.f, dnnl_eltwise_relu,
                                                0.f, 0.f),
                   out, "post_ops_append_eltwise");
    }
    {
        const struct argq a[] = {
            {DNNL_ARG_SRC_0, dnnl_query_src_md, 0, NULL},
            {DNNL_ARG_SRC_1, dnnl_query_src_md, 1, NULL},
            {DNNL_ARG_DST, dnnl_query_dst_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->fwd, &bd, post, NULL, a, 3, "add");
        if (rc < 0)
            goto out;
    }
    pl->ws = pl->fwd.scratch;
out:
    if (post)
        dnnl_post_ops_destroy(post);
    return rc;
}

static int plan_pool(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    int max = d->kind == MESH_NN_PLAN_MAXPOOL;
    dnnl_alg_kind_t alg = max ? dnnl_pooling_max : dnnl_pooling_avg;
    dnnl_pooling_desc_t pd;
    dnnl_memory_desc_t x, y;
    dnnl_dims_t st, ker, pad, padr;
    const dnnl_memory_desc_t *wsmd;
    int rc;

    if (max) {
        st[0] = st[1] = d->stride;
        ker[0] = ker[1] = d->r;
        pad[0] = pad[1] = d->pad;
        padr[0] = (int64_t)(d->oh - 1) * d->stride + d->r - d->h - d->pad;
        padr[1] = (int64_t)(d->ow - 1) * d->stride + d->r - d->w - d->pad;
    } else {
        st[0] = ker[0] = d->h;
        st[1] = ker[1] = d->w;
        pad[0] = pad[1] = padr[0] = padr[1] = 0;
    }
    if ((rc = md_act(dev, &x, d->n, d->c, d->h, d->w)) < 0 ||
        (rc = md_act(dev, &y, d->n, d->c, d->oh, d->ow)) < 0)
        return rc;
    DNNL_CHECK(rc,
               dnnl_pooling_forward_desc_init(&pd, dnnl_forward_training, alg,
                                              &x, &y, st, ker, pad, padr),
               out, "pooling_forward_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
            {DNNL_ARG_DST, dnnl_query_dst_md, 0, NULL},
            {DNNL_ARG_WORKSPACE, dnnl_query_workspace_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->fwd, &pd, NULL, NULL, a, max ? 3 : 2,
                       "pool fwd");
        if (rc < 0)
            goto out;
    }
    wsmd = prim_md(&pl->fwd, dnnl_query_workspace_md, 0);
    pl->reserve = max && wsmd ? dnnl_memory_desc_get_size(wsmd) : 0;
    DNNL_CHECK(
        rc,
        dnnl_pooling_backward_desc_init(&pd, alg, &x, &y, st, ker, pad, padr),
        out, "pooling_backward_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
            {DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, NULL},
            {DNNL_ARG_WORKSPACE, dnnl_query_workspace_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->bwd, &pd, NULL, pl->fwd.pd, a, max ? 3 : 2,
                       "pool bwd");
        if (rc < 0)
            goto out;
    }
    pl->ws = MESH_MAX(pl->fwd.scratch, pl->bwd.scratch);
out:
    return rc;
}

static int plan_fc(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    dnnl_inner_product_desc_t id;
    dnnl_memory_desc_t x, y, w, b;
    int64_t xd[2] = {d->n, d->c}, yd[2] = {d->n, d->k}, wd[2] = {d->k, d->c};
    int64_t bd[1] = {d->k};
    int rc;

    if ((rc = md_tag(&x, 2, xd, dnnl_nc)) < 0 ||
        (rc = md_tag(&y, 2, yd, dnnl_nc)) < 0 ||
        (rc = md_tag(&w, 2, wd, dnnl_oi)) < 0 ||
        (rc = md_tag(&b, 1, bd, dnnl_x)) < 0)
        return rc;
    DNNL_CHECK(rc,
               dnnl_inner_product_forward_desc_init(&id, dnnl_forward_training,
                                                    &x, &w, &b, &y),
               out, "inner_product_forward_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
            {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, NULL},
            {DNNL_ARG_BIAS, dnnl_query_weights_md, 1, NULL},
            {DNNL_ARG_DST, dnnl_query_dst_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->fwd, &id, NULL, NULL, a, 4, "fc fwd");
        if (rc < 0)
            goto out;
    }
    DNNL_CHECK(rc, dnnl_inner_product_backward_data_desc_init(&id, &x, &w, &y),
               out, "inner_product_backward_data_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
            {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, NULL},
            {DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, NULL},
        };
        rc = prim_init(dev, &pl->bwd, &id, NULL, pl->fwd.pd, a, 3,
                       "fc bwd data");
        if (rc < 0)
            goto out;
    }
    DNNL_CHECK(
        rc, dnnl_inner_product_backward_weights_desc_init(&id, &x, &w, &b, &y),
        out, "inner_product_backward_weights_desc_init");
    {
        const struct argq a[] = {
            {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
            {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
            {DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, NULL},
            {DNNL_ARG_DIFF_BIAS, dnnl_query_diff_weights_md, 1, NULL},
        };
        rc = prim_init(dev, &pl->bwdw, &id, NULL, pl->fwd.pd, a, 4,
                       "fc bwd weights");
        if (rc < 0)
            goto out;
    }
    pl->ws =
        MESH_MAX(pl->fwd.scratch, MESH_MAX(pl->bwd.scratch, pl->bwdw.scratch));
out:
    return rc;
}

static void cpu_plan_destroy(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl)
{
    (void)dev;
    if (!pl)
        return;
    prim_fini(&pl->fwd);
    prim_fini(&pl->bwd);
    prim_fini(&pl->bwdw);
    prim_fini(&pl->infer);
    prim_fini(&pl->w_fwd.r);
    prim_fini(&pl->w_bwd.r);
    prim_fini(&pl->dw.r);
    prim_fini(&pl->x_bw.r);
    prim_fini(&pl->dy_bw.r);
    free(pl);
}

static int cpu_plan_create(struct mesh_nn_dev *dev,
                           const struct mesh_nn_plan_desc *d,
                           struct mesh_nn_plan **out)
{
    struct mesh_nn_plan *pl;
    int rc;

    if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0)
        return mesh_err(-EINVAL, "nn cpu: bad plan shape (%d, %d, %d, %d)",
                        d->n, d->c, d->h, d->w);
    pl = calloc(1, sizeof(*pl));
    if (!pl)
        return mesh_err(-ENOMEM, "nn cpu: out of memory");
    pl->d = *d;
    switch (d->kind) {
    case MESH_NN_PLAN_CONV:
        rc = plan_conv(dev, pl);
        break;
    case MESH_NN_PLAN_BN:
        rc = plan_bn(dev, pl);
        break;
    case MESH_NN_PLAN_RELU:
        rc = plan_relu(dev, pl);
        break;
    case MESH_NN_PLAN_ADD:
        rc = plan_add(dev, pl);
        break;
    case MESH_NN_PLAN_MAXPOOL:
    case MESH_NN_PLAN_AVGPOOL:
        rc = plan_pool(dev, pl);
        break;
    case MESH_NN_PLAN_FC:
        rc = plan_fc(dev, pl);
        break;
    default:
        rc = mesh_err(-EINVAL, "nn cpu: unknown plan kind %d", d->kind);
    }
    if (rc < 0) {
        cpu_plan_destroy(dev, pl);
        return rc;
    }
    *out = pl;
    return 0;
}

static size_t cpu_plan_workspace(const struct mesh_nn_plan *p)
{
    return p->ws;
}

static size_t cpu_plan_reserve(const struct mesh_nn_plan *p)
{
    return p->reserve;
}

/* ---- ops ----------------------------------------------------------------- */

static int cpu_conv_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *x, const float *w, void *y, void *ws)
{
    void *wp = (void *)w;
    char *scratch = ws;
    int rc;

    if (p->w_fwd.r.p) {
        wp = ws;
        scratch = (char *)ws + align64(p->w_fwd.bytes);
        rc = reo_run(dev, &p->w_fwd, w, wp, scratch);
        if (rc < 0)
            return rc;
    }
    {
        void *h[3] = {(void *)x, wp, y};

        return prim_run(dev, &p->fwd, h, scratch, "conv fwd");
    }
}

static int cpu_conv_bwd_data(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                             const void *dy, const float *w, void *dx, void *ws)
{
    void *wp = (void *)w;
    char *scratch = ws;
    int rc;

    if (!p->bwd.p)
        return mesh_err(-ENOTSUP,
                        "nn cpu: oneDNN has no backward-data convolution for "
                        "%d input channels",
                        p->d.c);
    if (p->w_bwd.r.p) {
        wp = ws;
        scratch = (char *)ws + align64(p->w_bwd.bytes);
        rc = reo_run(dev, &p->w_bwd, w, wp, scratch);
        if (rc < 0)
            return rc;
    }
    {
        void *h[3] = {(void *)dy, wp, dx};

        return prim_run(dev, &p->bwd, h, scratch, "conv bwd data");
    }
}

static int cpu_conv_bwd_filter(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                               const void *x, const void *dy, float *dw,
                               void *ws)
{
    void *dwp = dw;
    char *scratch = ws;
    int rc;

    if (p->dw.r.p) {
        dwp = scratch;
        scratch += align64(p->dw.bytes);
    }
    /* the plain copies (plan_conv_bwdw_plain): of x, of dy, or of both,
     * whichever is blocked; the other goes in as it is */
    if (p->x_bw.r.p || p->dy_bw.r.p) {
        void *xp = scratch, *dyp = scratch + align64(p->x_bw.bytes);

        scratch = (char *)dyp + align64(p->dy_bw.bytes);
        if (p->x_bw.r.p) {
            rc = reo_run(dev, &p->x_bw, x, xp, scratch);
            if (rc < 0)
                return rc;
            x = xp;
        }
        if (p->dy_bw.r.p) {
            rc = reo_run(dev, &p->dy_bw, dy, dyp, scratch);
            if (rc < 0)
                return rc;
            dy = dyp;
        }
    }
    {
        void *h[3] = {(void *)x, (void *)dy, dwp};

        rc = prim_run(dev, &p->bwdw, h, scratch, "conv bwd weights");
        if (rc < 0)
            return rc;
    }
    if (p->dw.r.p)
        rc = reo_run(dev, &p->dw, dwp, dw, scratch);
    return rc;
}

static int cpu_bn_fwd_train(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *x, void *y, const float *gamma,
                            const float *beta, float *running_mean,
                            float *running_var, float momentum, float *save,
                            void *reserve, void *ws)
{
    set_threads(dev);
    mesh_nn_cpu_bn_fwd_train(&p->bn, x, y, gamma, beta, running_mean,
                             running_var, momentum, save, reserve, ws);
    return 0;
}

static int cpu_bn_fwd_infer(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *x, void *y, const float *gamma,
                            const float *beta, const float *running_mean,
                            const float *running_var, void *ws)
{
    set_threads(dev);
    mesh_nn_cpu_bn_fwd_infer(&p->bn, x, y, gamma, beta, running_mean,
                             running_var, ws);
    return 0;
}

static int cpu_bn_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                      const void *x, const void *dy, const float *gamma,
                      const float *beta, const float *save, const void *reserve,
                      void *dx, float *dgamma, float *dbeta, void *ws)
{
    (void)beta;
    set_threads(dev);
    mesh_nn_cpu_bn_bwd(&p->bn, x, dy, gamma, save, reserve, dx, dgamma, dbeta,
                       ws);
    return 0;
}

static int cpu_relu_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *x, void *y)
{
    void *h[2] = {(void *)x, y};

    return prim_run(dev, &p->fwd, h, NULL, "relu fwd");
}

static int cpu_relu_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *y, const void *dy, void *dx)
{
    void *h[3] = {(void *)y, (void *)dy, dx};

    return prim_run(dev, &p->bwd, h, NULL, "relu bwd");
}

static int cpu_add(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                   const void *a, const void *b, void *y)
{
    void *h[3] = {(void *)a, (void *)b, y};

    return prim_run(dev, &p->fwd, h, NULL, "add");
}

static int cpu_maxpool_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *x, void *y, void *reserve, void *ws)
{
    void *h[3] = {(void *)x, y, reserve};

    return prim_run(dev, &p->fwd, h, ws, "maxpool fwd");
}

static int cpu_maxpool_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *dy, const void *reserve, void *dx,
                           void *ws)
{
    void *h[3] = {(void *)dy, dx, (void *)reserve};

    return prim_run(dev, &p->bwd, h, ws, "maxpool bwd");
}

static int cpu_avgpool_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *x, void *y, void *ws)
{
    void *h[2] = {(void *)x, y};

    return prim_run(dev, &p->fwd, h, ws, "avgpool fwd");
}

static int cpu_avgpool_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *dy, void *dx, void *ws)
{
    void *h[2] = {(void *)dy, dx};

    return prim_run(dev, &p->bwd, h, ws, "avgpool bwd");
}

static int cpu_fc_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                      const void *x, const float *w, const float *b, void *y,
                      void *ws)
{
    void *h[4] = {(void *)x, (void *)w, (void *)b, y};

    return prim_run(dev, &p->fwd, h, ws, "fc fwd");
}

static int cpu_fc_bwd_data(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *dy, const float *w, void *dx, void *ws)
{
    void *h[3] = {(void *)dy, (void *)w, dx};

    return prim_run(dev, &p->bwd, h, ws, "fc bwd data");
}

static int cpu_fc_bwd_weights(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                              const void *x, const void *dy, float *dw,
                              float *db, void *ws)
{
    void *h[4] = {(void *)x, (void *)dy, dw, db};

    return prim_run(dev, &p->bwdw, h, ws, "fc bwd weights");
}

/* Softmax cross-entropy: rows are short (classes), plain C in double. */
static int cpu_xent(struct mesh_nn_dev *dev, int n, int k, const float *logits,
                    const int32_t *labels, float smoothing, float *loss,
                    float *dlogits)
{
    double total = 0, eps = smoothing;
    int i, j;

    (void)dev;
    if (n <= 0 || k <= 0)
        return mesh_err(-EINVAL, "nn: cross-entropy of %d x %d logits", n, k);
    for (i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= k)
            return mesh_err(-EINVAL,
                            "nn: label %d of sample %d is outside [0, %d)",
                            labels[i], i, k);
    for (i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * k;
        float *dz = dlogits + (size_t)i * k;
        double m = z[0], s = 0, lse, sum_logp = 0;

        for (j = 1; j < k; j++)
            m = z[j] > m ? z[j] : m;
        for (j = 0; j < k; j++)
            s += exp(z[j] - m);
        lse = m + log(s);
        for (j = 0; j < k; j++)
            sum_logp += z[j] - lse;
        total += (1 - eps) * (lse - z[labels[i]]) - eps / k * sum_logp;
        for (j = 0; j < k; j++) {
            double t = eps / k + (j == labels[i] ? 1 - eps : 0);

            dz[j] = (float)((exp(z[j] - lse) - t) / n);
        }
    }
    *loss = (float)(total / n);
    return 0;
}

/* PyTorch's SGD, operation by operation, in float (see backend.h). */
static int cpu_sgd(struct mesh_nn_dev *dev, size_t n, float *p, const float *g,
                   float *buf, const struct mesh_nn_sgd_args *a)
{
    const float lr = a->lr, mom = a->momentum, wd = a->weight_decay;
    const float damp1 = 1.f - a->dampening;
    size_t i;

    (void)dev;
    for (i = 0; i < n; i++) {
        float d = g[i];

        if (wd != 0.f)
            d = d + wd * p[i];
        if (mom != 0.f) {
            float b = a->first ? d : buf[i] * mom + damp1 * d;

            buf[i] = b;
            d = a->nesterov ? d + mom * b : b;
        }
        p[i] = p[i] + -lr * d;
    }
    return 0;
}

static int cpu_axpy1(struct mesh_nn_dev *dev, size_t n, const float *x,
                     float *y)
{
    size_t i;

    (void)dev;
    for (i = 0; i < n; i++)
        y[i] += x[i];
    return 0;
}

/* ---- layout conversion ------------------------------------------------- */

static int act_convert(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                       const void *src, void *dst, int to_dev)
{
    dnnl_memory_desc_t plain, act;
    int64_t dims[4] = {n, c, h, w};
    struct reo r;
    void *scratch = NULL;
    int rc;

    if ((rc = md_tag(&plain, 4, dims, dnnl_nchw)) < 0 ||
        (rc = md_act(dev, &act, n, c, h, w)) < 0)
        return rc;
    if (dnnl_memory_desc_equal(&plain, &act))
        return cpu_copy(dev, dst, src, (size_t)n * c * h * w * sizeof(float));
    rc = to_dev ? reo_init(dev, &r, &plain, &act, 1)
                : reo_init(dev, &r, &act, &plain, 0);
    if (rc < 0)
        return rc;
    if (r.r.scratch && cpu_alloc(dev, r.r.scratch, &scratch) < 0) {
        prim_fini(&r.r);
        return -ENOMEM;
    }
    rc = reo_run(dev, &r, src, dst, scratch);
    free(scratch);
    prim_fini(&r.r);
    return rc;
}

static int cpu_act_import(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                          const float *host, void *dst)
{
    return act_convert(dev, n, c, h, w, host, dst, 1);
}

static int cpu_act_export(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                          const void *src, float *host)
{
    return act_convert(dev, n, c, h, w, src, host, 0);
}

const struct mesh_nn_backend_ops mesh_nn_cpu_ops = {
    .name = "cpu",
    MESH_NN_BACKEND_CORE(cpu),
    .upload = cpu_copy,
    .download = cpu_copy,
};
