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
 * - bf16-amp (mesh_nn_dev_opts.precision): convolutions and the fully
 *   connected layer run oneDNN primitives with bfloat16 src, weights and
 *   diff_dst and float32 accumulation and outputs (dst, diff_src,
 *   diff_weights); activations, weights, batch norm, the loss and every
 *   gradient stay float32. Each plan reorders its float32 operands into
 *   bfloat16 staging in its workspace; in training, x once for forward and
 *   weight gradient (kept in the layer's reserve) and dy once for both
 *   gradients (plan_conv_keep). Where oneDNN has no bfloat16
 *   kernel (creation says unimplemented, or only its scalar "ref" one),
 *   that direction runs the float32 primitive on operands rounded to
 *   bfloat16 (round to nearest even) in the workspace: the same products
 *   (a bf16 x bf16 product is exact in float32), summed in float32. A CPU
 *   whose oneDNN has no bfloat16 convolution at all (AVX2 only) is refused
 *   at open, unless MESHTRAIN_CPU_BF16=emulate asks for that rounding
 *   everywhere (which also forces it where bfloat16 kernels exist).
 * - Threads: Debian's libdnnl runs on OpenMP (DNNL_CPU_THREADING_RUNTIME ==
 *   DNNL_RUNTIME_OMP); omp_set_num_threads() sets the count for the calling
 *   thread, so every op sets it again (cheap) in case the trainer calls from
 *   a thread other than the one that opened the device; so does every
 *   primitive's creation, which oneDNN sizes by that count.
 * A device is used by one thread at a time (the memory objects carry state).
 */
#include "config.h"

#include "nn/backend.h"
#include "nn/cpu-bn.h"
#include "nn/nn.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
    int emu;        /* bf16-amp on a float32 primitive: its float32 inputs
                       are rounded to bfloat16 first (see the top) */
};

/* A reorder between a user layout and a primitive's layout (or none). */
struct reo {
    struct prim r; /* r.p == NULL: layouts equal, nothing to do */
    size_t bytes;  /* size of the primitive-side buffer */
};

/*
 * CONV and FC: fwd, bwd (data) and bwdw (weights) primitives, and for each
 * the reorders of its operands from the user's float32 forms (activations
 * in act_tag's layout, plain weights) into the primitive's: another layout
 * (conv weights; x and dy of plan_conv_bwdw_plain), bfloat16 (bf16-amp),
 * or nothing (r.p == NULL). A staged operand lives in the workspace.
 */
struct mesh_nn_plan {
    struct mesh_nn_plan_desc d;
    size_t ws, reserve;
    /* CONV: the stem's bwd data may be NULL */
    struct prim fwd, bwd, bwdw, infer;
    struct reo x_fwd, w_fwd;  /* fwd's src, weights */
    struct reo dy_bwd, w_bwd; /* bwd data's diff_dst, weights */
    struct reo dx_bwd;        /* bwd data's diff_src -> user layout */
    struct reo x_bw, dy_bw;   /* bwd weights' src, diff_dst */
    struct reo dw;            /* bwd weights' diff_weights -> plain */
    struct mesh_nn_cpu_bn bn; /* BN: ours, not oneDNN's */
    /* CONV in bf16-amp: x's bfloat16 form, staged by fwd, is the one bwd
     * weights reads, kept in the layer's reserve (conv_fwd_keep); and
     * bwd data reads the same form of dy as bwd weights (share_dy) */
    int keep, share_dy;
};

struct mesh_nn_dev {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    int threads;
    int block;    /* 16, 8 or 0 (plain only) */
    int bf16;     /* bf16-amp */
    int bf16_emu; /* bf16-amp by rounding only (MESHTRAIN_CPU_BF16) */
    long live;    /* blocks allocated and not freed (atomic) */
    char desc[224];
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

/*
 * Zero-filled memory, 64-byte aligned (one AVX-512 vector, oneDNN's
 * preference). A block of CPU_MAP_MIN bytes or more is an anonymous
 * mapping of its own, whose pages the kernel gives zeroed where each is
 * first touched: nothing writes the zeros twice, and a page is faulted in
 * by its first real write (a joiner's parameter and momentum slabs by the
 * state it receives, a gradient slab by the first backward) instead of all
 * at once here. The memset that did it faulted in every page of
 * ResNet-50's 300 MB of slabs at the model's build: 72 % of a joiner's
 * build and warm-up (perf), 0.2 to 0.4 s of CPU on a loaded machine. Each
 * block starts with a 64-byte head that holds the mapping's length (0 for
 * a block from posix_memalign).
 */
#define CPU_HEAD    64
#define CPU_MAP_MIN (1u << 20)

static int cpu_alloc(struct mesh_nn_dev *dev, size_t bytes, void **out)
{
    size_t len = bytes + CPU_HEAD;
    void *p = NULL;
    int e;

    /* the head must not wrap the length round to a small block */
    if (bytes > SIZE_MAX - CPU_HEAD)
        return mesh_err(-ENOMEM, "nn cpu: cannot allocate %zu bytes", bytes);
    if (bytes >= CPU_MAP_MIN) {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
        if (p == MAP_FAILED)
            return mesh_err(-ENOMEM, "nn cpu: cannot map %zu bytes: %s", bytes,
                            strerror(errno));
    } else {
        e = posix_memalign(&p, 64, len);
        if (e)
            return mesh_err(-ENOMEM, "nn cpu: cannot allocate %zu bytes",
                            bytes);
        memset(p, 0, len);
        len = 0;
    }
    memcpy(p, &len, sizeof(len));
    *out = (char *)p + CPU_HEAD;
    __atomic_add_fetch(&dev->live, 1, __ATOMIC_RELAXED);
    return 0;
}

static void cpu_free(struct mesh_nn_dev *dev, void *p)
{
    size_t len;
    char *head;

    if (!p)
        return;
    __atomic_sub_fetch(&dev->live, 1, __ATOMIC_RELAXED);
    head = (char *)p - CPU_HEAD;
    memcpy(&len, head, sizeof(len));
    if (len)
        munmap(head, len);
    else
        free(head);
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

static int md_tag_dt(dnnl_memory_desc_t *md, int nd, const int64_t *dims,
                     dnnl_data_type_t dt, dnnl_format_tag_t tag)
{
    dnnl_dims_t full = {0};
    int rc = 0, i;

    for (i = 0; i < nd; i++)
        full[i] = dims[i];
    DNNL_CHECK(rc, dnnl_memory_desc_init_by_tag(md, nd, full, dt, tag), out,
               "memory_desc_init");
out:
    return rc;
}

static int md_tag(dnnl_memory_desc_t *md, int nd, const int64_t *dims,
                  dnnl_format_tag_t tag)
{
    return md_tag_dt(md, nd, dims, dnnl_f32, tag);
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

    set_threads(dev); /* (oneDNN sizes a primitive by it) */
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

    set_threads(dev); /* (oneDNN sizes a primitive by it) */
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
static int pd_is_ref(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;

    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) ==
               dnnl_success &&
           impl && strncmp(impl, "ref", 3) == 0;
}

static int prim_is_ref(const struct prim *p)
{
    return pd_is_ref(p->pd);
}

/*
 * Whether oneDNN has a kernel other than its scalar reference for the op
 * descriptor od (with prim_init's attributes): what picks the bfloat16
 * primitives under bf16-amp, asked of oneDNN rather than guessed from the
 * CPU's flags.
 */
static int has_fast_impl(struct mesh_nn_dev *dev, const_dnnl_op_desc_t od,
                         const_dnnl_primitive_desc_t hint)
{
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int fast = 0;

    set_threads(dev); /* (oneDNN sizes a primitive by it) */
    if (dnnl_primitive_attr_create(&attr) != dnnl_success)
        return 0;
    if (dnnl_primitive_attr_set_scratchpad_mode(
            attr, dnnl_scratchpad_mode_user) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, od, attr, dev->eng, hint) ==
            dnnl_success) {
        fast = !pd_is_ref(pd);
        dnnl_primitive_desc_destroy(pd);
    }
    dnnl_primitive_attr_destroy(attr);
    return fast;
}

/* Whether a conv or fc plan tries bfloat16 primitives first. */
#define TRY_BF16(dev) ((dev)->bf16 && !(dev)->bf16_emu)

/* The three directions of a conv or fc plan. */
enum { DIR_FWD, DIR_BWD_DATA, DIR_BWD_W };

/*
 * The operands of a conv or fc plan as oneDNN sees them: float32 x and y
 * in the user's layout, weights (conv: any layout), and the bfloat16
 * forms of x, y (dy) and w that bf16-amp's primitives read. Outputs (dst,
 * diff_src, diff_weights, bias) are always float32.
 */
struct op_mds {
    dnnl_memory_desc_t x, y, w, b;
    dnnl_memory_desc_t xb, yb, wb;
    dnnl_dims_t st, pad, padr; /* conv only */
};

union op_desc {
    dnnl_convolution_desc_t conv;
    dnnl_inner_product_desc_t ip;
};

typedef dnnl_status_t (*op_desc_fn)(const struct op_mds *m, int dir, int bf16,
                                    union op_desc *od);

static dnnl_status_t conv_desc(const struct op_mds *m, int dir, int bf16,
                               union op_desc *od)
{
    const dnnl_memory_desc_t *x = bf16 ? &m->xb : &m->x;
    const dnnl_memory_desc_t *y = bf16 ? &m->yb : &m->y;
    const dnnl_memory_desc_t *w = bf16 ? &m->wb : &m->w;

    switch (dir) {
    case DIR_FWD:
        return dnnl_convolution_forward_desc_init(
            &od->conv, dnnl_forward_training, dnnl_convolution_direct, x, w,
            NULL, &m->y, m->st, m->pad, m->padr);
    case DIR_BWD_DATA:
        return dnnl_convolution_backward_data_desc_init(
            &od->conv, dnnl_convolution_direct, &m->x, w, y, m->st, m->pad,
            m->padr);
    default:
        return dnnl_convolution_backward_weights_desc_init(
            &od->conv, dnnl_convolution_direct, x, &m->w, NULL, y, m->st,
            m->pad, m->padr);
    }
}

static dnnl_status_t fc_desc(const struct op_mds *m, int dir, int bf16,
                             union op_desc *od)
{
    const dnnl_memory_desc_t *x = bf16 ? &m->xb : &m->x;
    const dnnl_memory_desc_t *y = bf16 ? &m->yb : &m->y;
    const dnnl_memory_desc_t *w = bf16 ? &m->wb : &m->w;

    switch (dir) {
    case DIR_FWD:
        return dnnl_inner_product_forward_desc_init(
            &od->ip, dnnl_forward_training, x, w, &m->b, &m->y);
    case DIR_BWD_DATA:
        return dnnl_inner_product_backward_data_desc_init(&od->ip, &m->x, w, y);
    default:
        return dnnl_inner_product_backward_weights_desc_init(&od->ip, x, &m->w,
                                                             &m->b, y);
    }
}

/*
 * Create one direction's primitive: in bfloat16 when try_bf16 and oneDNN
 * has a kernel for it, else in float32 (p->emu set when that stands in
 * for bf16-amp). A backward direction gets a forward primitive
 * descriptor of its own data type as the hint.
 */
static int op_prim(struct mesh_nn_dev *dev, op_desc_fn mk,
                   const struct op_mds *m, int dir, int try_bf16,
                   const struct argq *a, int na, struct prim *p,
                   const char *what)
{
    dnnl_primitive_desc_t hint = NULL;
    union op_desc od, fd;
    int bf16 = try_bf16, rc = 0;

    set_threads(dev); /* (oneDNN sizes a primitive by it) */
    for (;;) {
        if (dir != DIR_FWD) {
            DNNL_CHECK(rc, mk(m, DIR_FWD, bf16, &fd), out, what);
            if (dnnl_primitive_desc_create(&hint, &fd, NULL, dev->eng, NULL) !=
                dnnl_success) {
                hint = NULL;
                if (!bf16)
                    return mesh_err(-EIO, "oneDNN %s: no forward hint", what);
            }
        }
        DNNL_CHECK(rc, mk(m, dir, bf16, &od), out, what);
        if (!bf16 ||
            ((hint || dir == DIR_FWD) && has_fast_impl(dev, &od, hint)))
            break;
        mesh_debug("nn cpu: %s: no bfloat16 kernel in oneDNN, float32 on "
                   "operands rounded to bfloat16",
                   what);
        if (hint)
            dnnl_primitive_desc_destroy(hint);
        hint = NULL;
        bf16 = 0;
    }
    rc = prim_init(dev, p, &od, NULL, hint, a, na, what);
    if (rc == 0)
        p->emu = dev->bf16 && !bf16;
out:
    if (hint)
        dnnl_primitive_desc_destroy(hint);
    return rc;
}

/*
 * mp = m with x and y as plain (nchw) descriptors of pl's shape: 1 when
 * that changes either, 0 when both are plain already, < 0 on an error.
 */
static int plain_mds(const struct mesh_nn_plan *pl, const struct op_mds *m,
                     struct op_mds *mp)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    const int64_t xd[4] = {d->n, d->c, d->h, d->w};
    const int64_t yd[4] = {d->n, d->k, d->oh, d->ow};
    int rc;

    *mp = *m;
    if ((rc = md_tag(&mp->x, 4, xd, dnnl_nchw)) < 0 ||
        (rc = md_tag(&mp->y, 4, yd, dnnl_nchw)) < 0)
        return rc;
    return !(dnnl_memory_desc_equal(&mp->x, &m->x) &&
             dnnl_memory_desc_equal(&mp->y, &m->y));
}

/*
 * oneDNN 2.6 has no JIT kernel for the weight gradient of some convolutions
 * on blocked activations: a 3x3 convolution on 2x2 or 1x1 maps (the last
 * stage of a ResNet on small images) and a stem with one input channel.
 * There it falls back to "ref:any", a scalar loop that took 500 ms where
 * the whole rest of the step took 100 ms. On plain (nchw) copies of x and
 * dy its GEMM-based kernel does the same job in a few milliseconds, so
 * when the blocked primitive is the reference one, the plan uses that
 * kernel instead (plan_conv then reorders x and dy to plain copies in the
 * workspace). The plan is unchanged when the plain form is no better.
 */
static int plan_conv_bwdw_plain(struct mesh_nn_dev *dev,
                                struct mesh_nn_plan *pl, const struct op_mds *m)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    const struct argq a[] = {
        {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
        {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
        {DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, NULL},
    };
    struct op_mds mp;
    struct prim alt;
    int rc;

    if ((rc = plain_mds(pl, m, &mp)) <= 0)
        return rc; /* an error, or already plain: nothing better to try */
    rc = op_prim(dev, conv_desc, &mp, DIR_BWD_W, 0, a, 3, &alt,
                 "conv bwd weights (plain)");
    if (rc < 0)
        return rc;
    if (prim_is_ref(&alt)) {
        prim_fini(&alt);
        return 0;
    }
    prim_fini(&pl->bwdw);
    pl->bwdw = alt;
    mesh_debug("nn cpu: conv %dx%d on %dx%d, %d -> %d channels: weight "
               "gradient on plain copies of x and dy",
               d->r, d->s, d->h, d->w, d->c, d->k);
    return 0;
}

/*
 * The same for the forward and the data gradient, between a channel count
 * that is a multiple of the vector block and one that is not (e.g. 32 and
 * 8 on AVX-512): oneDNN 2.6 has no JIT kernel for either direction when
 * one side is blocked and the other plain ("ref:any", 20 to 90 ms where
 * the rest of a small step took a few), but its GEMM kernel runs them on
 * plain copies. The input is staged plain (plan_reorders); the forward's
 * output must be plain already, the data gradient's is reordered back
 * into the user's layout (dx_bwd). The plan is unchanged when the plain
 * form is no better.
 */
static int plan_conv_plain(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl,
                           const struct op_mds *m, int dir,
                           const struct argq *a, struct prim *p)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    struct op_mds mp;
    struct prim alt;
    int rc;

    if ((rc = plain_mds(pl, m, &mp)) <= 0)
        return rc; /* an error, or already plain */
    if (dir == DIR_FWD && !dnnl_memory_desc_equal(&mp.y, &m->y))
        return 0; /* its output would need a reorder back */
    if (op_prim(dev, conv_desc, &mp, dir, 0, a, 3, &alt,
                dir == DIR_FWD ? "conv fwd (plain)" : "conv bwd data (plain)") <
        0) {
        mesh_err_clear();
        return 0;
    }
    if (prim_is_ref(&alt)) {
        prim_fini(&alt);
        return 0;
    }
    prim_fini(p);
    *p = alt;
    mesh_debug("nn cpu: conv %dx%d on %dx%d, %d -> %d channels: %s on plain "
               "copies",
               d->r, d->s, d->h, d->w, d->c, d->k,
               dir == DIR_FWD ? "forward" : "data gradient");
    return 0;
}

/* Workspace bytes that stage() needs for one operand of raw bytes. */
static size_t stage_bytes(const struct reo *r, const struct prim *p, size_t raw)
{
    return r->r.p ? align64(r->bytes) : p->emu ? align64(raw) : 0;
}

/* dst = src rounded to bfloat16 (nearest even; NaNs stay NaNs), n floats. */
static void round_bf16(float *dst, const float *src, size_t n)
{
    size_t i;

#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= 65536)
#endif
    for (i = 0; i < n; i++) {
        uint32_t u;

        memcpy(&u, &src[i], sizeof(u));
        if ((u & 0x7fffffffu) > 0x7f800000u)
            u |= 0x400000u;
        else
            u += 0x7fffu + ((u >> 16) & 1u);
        u &= 0xffff0000u;
        memcpy(&dst[i], &u, sizeof(u));
    }
}

/*
 * Bring one operand (raw bytes of float32 at src) into the form primitive
 * p reads: reordered into buf (stage_bytes of room), and rounded to
 * bfloat16 there when p emulates bf16-amp; src itself when neither is
 * needed. scratch is the reorder's.
 */
static int stage(struct mesh_nn_dev *dev, struct reo *r, const struct prim *p,
                 const void *src, size_t raw, char *buf, void *scratch,
                 const void **out)
{
    int rc;

    *out = src;
    if (r->r.p) {
        rc = reo_run(dev, r, src, buf, scratch);
        if (rc < 0)
            return rc;
        *out = buf;
        if (p->emu)
            round_bf16((float *)buf, (const float *)buf, r->bytes / 4);
    } else if (p->emu) {
        set_threads(dev);
        round_bf16((float *)buf, src, raw / 4);
        *out = buf;
    }
    return 0;
}

/* Bytes of a float32 tensor of a * b * c * d elements. */
static size_t f32_bytes(int a, int b, int c, int d)
{
    return (size_t)a * b * c * d * sizeof(float);
}

/* The reorders of a conv or fc plan's operands, once its primitives exist
 * (those of bwd data only when it has one). */
static int plan_reorders(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl,
                         const struct op_mds *m, const dnnl_memory_desc_t *wu)
{
    int rc;

    if ((rc = reo_init(dev, &pl->x_fwd, &m->x,
                       prim_md(&pl->fwd, dnnl_query_src_md, 0), 1)) < 0 ||
        (rc = reo_init(dev, &pl->w_fwd, wu,
                       prim_md(&pl->fwd, dnnl_query_weights_md, 0), 1)) < 0 ||
        (rc = reo_init(dev, &pl->x_bw, &m->x,
                       prim_md(&pl->bwdw, dnnl_query_src_md, 0), 1)) < 0 ||
        (rc = reo_init(dev, &pl->dy_bw, &m->y,
                       prim_md(&pl->bwdw, dnnl_query_diff_dst_md, 0), 1)) < 0 ||
        (rc = reo_init(dev, &pl->dw,
                       prim_md(&pl->bwdw, dnnl_query_diff_weights_md, 0), wu,
                       0)) < 0)
        return rc;
    if (pl->bwd.p &&
        ((rc = reo_init(dev, &pl->dy_bwd, &m->y,
                        prim_md(&pl->bwd, dnnl_query_diff_dst_md, 0), 1)) < 0 ||
         (rc = reo_init(dev, &pl->w_bwd, wu,
                        prim_md(&pl->bwd, dnnl_query_weights_md, 0), 1)) < 0 ||
         (rc = reo_init(dev, &pl->dx_bwd,
                        prim_md(&pl->bwd, dnnl_query_diff_src_md, 0), &m->x,
                        0)) < 0))
        return rc;
    return 0;
}

/* The workspace of a conv or fc plan: per direction its staged operands,
 * then the largest scratchpad of the primitive and its reorders. */
static size_t plan_op_ws(const struct mesh_nn_plan *pl, size_t xb, size_t yb,
                         size_t wb)
{
    size_t f, b = 0, w;

    f = stage_bytes(&pl->x_fwd, &pl->fwd, xb) +
        stage_bytes(&pl->w_fwd, &pl->fwd, wb) +
        MESH_MAX(pl->fwd.scratch,
                 MESH_MAX(pl->x_fwd.r.scratch, pl->w_fwd.r.scratch));
    if (pl->bwd.p)
        b = align64(pl->dx_bwd.bytes) + stage_bytes(&pl->dy_bwd, &pl->bwd, yb) +
            stage_bytes(&pl->w_bwd, &pl->bwd, wb) +
            MESH_MAX(MESH_MAX(pl->bwd.scratch, pl->dx_bwd.r.scratch),
                     MESH_MAX(pl->dy_bwd.r.scratch, pl->w_bwd.r.scratch));
    w = align64(pl->dw.bytes) + stage_bytes(&pl->x_bw, &pl->bwdw, xb) +
        stage_bytes(&pl->dy_bw, &pl->bwdw, yb) +
        MESH_MAX(MESH_MAX(pl->bwdw.scratch, pl->dw.r.scratch),
                 MESH_MAX(pl->x_bw.r.scratch, pl->dy_bw.r.scratch));
    return MESH_MAX(f, MESH_MAX(b, w));
}

/*
 * bf16-amp's conversions of a conv's operands, done once where they can
 * be: every direction on oneDNN's bfloat16 kernels, forward and weight
 * gradient reading x in one layout (then forward converts it into the
 * layer's reserve and bwd weights reads it there: the reserve is what
 * makes conv_fwd_keep and the two ops after it available), and both
 * gradients reading dy in one layout (then bwd weights converts it at the
 * start of the workspace and bwd data reads it there). The workspace of
 * plan_op_ws() already holds each of these orders: staged dy first, then
 * the other operands at most as large as before.
 */
static void plan_conv_keep(const struct mesh_nn_dev *dev,
                           struct mesh_nn_plan *pl)
{
    if (!TRY_BF16(dev) || !pl->x_fwd.r.p || !pl->x_bw.r.p || pl->fwd.emu ||
        pl->bwdw.emu ||
        !dnnl_memory_desc_equal(prim_md(&pl->fwd, dnnl_query_src_md, 0),
                                prim_md(&pl->bwdw, dnnl_query_src_md, 0)))
        return;
    pl->keep = 1;
    pl->reserve = align64(pl->x_fwd.bytes);
    pl->share_dy =
        pl->bwd.p && !pl->bwd.emu && pl->dy_bwd.r.p && pl->dy_bw.r.p &&
        dnnl_memory_desc_equal(prim_md(&pl->bwd, dnnl_query_diff_dst_md, 0),
                               prim_md(&pl->bwdw, dnnl_query_diff_dst_md, 0));
}

static int plan_conv(struct mesh_nn_dev *dev, struct mesh_nn_plan *pl)
{
    const struct mesh_nn_plan_desc *d = &pl->d;
    const int64_t xd[4] = {d->n, d->c, d->h, d->w};
    const int64_t yd[4] = {d->n, d->k, d->oh, d->ow};
    const int64_t wd[4] = {d->k, d->c, d->r, d->s};
    const struct argq fa[] = {
        {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
        {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, NULL},
        {DNNL_ARG_DST, dnnl_query_dst_md, 0, NULL},
    };
    const struct argq ba[] = {
        {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
        {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, NULL},
        {DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, NULL},
    };
    const struct argq wa[] = {
        {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
        {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
        {DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, NULL},
    };
    dnnl_memory_desc_t w_user;
    struct op_mds m;
    int rc;

    memset(&m, 0, sizeof(m));
    m.st[0] = m.st[1] = d->stride;
    m.pad[0] = m.pad[1] = d->pad;
    m.padr[0] = (int64_t)(d->oh - 1) * d->stride + d->r - d->h - d->pad;
    m.padr[1] = (int64_t)(d->ow - 1) * d->stride + d->s - d->w - d->pad;
    if ((rc = md_act(dev, &m.x, d->n, d->c, d->h, d->w)) < 0 ||
        (rc = md_act(dev, &m.y, d->n, d->k, d->oh, d->ow)) < 0 ||
        (rc = md_tag(&m.w, 4, wd, dnnl_format_tag_any)) < 0 ||
        (rc = md_tag(&w_user, 4, wd, dnnl_oihw)) < 0 ||
        (rc = md_tag_dt(&m.xb, 4, xd, dnnl_bf16, dnnl_format_tag_any)) < 0 ||
        (rc = md_tag_dt(&m.yb, 4, yd, dnnl_bf16, dnnl_format_tag_any)) < 0 ||
        (rc = md_tag_dt(&m.wb, 4, wd, dnnl_bf16, dnnl_format_tag_any)) < 0)
        return rc;

    rc = op_prim(dev, conv_desc, &m, DIR_FWD, TRY_BF16(dev), fa, 3, &pl->fwd,
                 "conv fwd");
    if (rc == 0 && prim_is_ref(&pl->fwd))
        rc = plan_conv_plain(dev, pl, &m, DIR_FWD, fa, &pl->fwd);
    if (rc == 0)
        rc = op_prim(dev, conv_desc, &m, DIR_BWD_W, TRY_BF16(dev), wa, 3,
                     &pl->bwdw, "conv bwd weights");
    if (rc == 0 && prim_is_ref(&pl->bwdw))
        rc = plan_conv_bwdw_plain(dev, pl, &m);
    if (rc < 0)
        return rc;
    /*
     * Backward data: the stem's input (3 channels, plain) needs no gradient
     * and oneDNN may have no fast kernel for it; its absence is reported
     * only when someone asks for it.
     */
    if (op_prim(dev, conv_desc, &m, DIR_BWD_DATA, TRY_BF16(dev), ba, 3,
                &pl->bwd, "conv bwd data") < 0)
        mesh_err_clear();
    else if (prim_is_ref(&pl->bwd) &&
             (rc = plan_conv_plain(dev, pl, &m, DIR_BWD_DATA, ba, &pl->bwd)) <
                 0)
        return rc;
    rc = plan_reorders(dev, pl, &m, &w_user);
    if (rc < 0)
        return rc;
    pl->ws = plan_op_ws(pl, f32_bytes(d->n, d->c, d->h, d->w),
                        f32_bytes(d->n, d->k, d->oh, d->ow),
                        f32_bytes(d->k, d->c, d->r, d->s));
    plan_conv_keep(dev, pl);
    return 0;
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
    const int64_t xd[2] = {d->n, d->c}, yd[2] = {d->n, d->k};
    const int64_t wd[2] = {d->k, d->c}, bd[1] = {d->k};
    const struct argq fa[] = {
        {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
        {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, NULL},
        {DNNL_ARG_BIAS, dnnl_query_weights_md, 1, NULL},
        {DNNL_ARG_DST, dnnl_query_dst_md, 0, NULL},
    };
    const struct argq ba[] = {
        {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
        {DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0, NULL},
        {DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0, NULL},
    };
    const struct argq wa[] = {
        {DNNL_ARG_SRC, dnnl_query_src_md, 0, NULL},
        {DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0, NULL},
        {DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0, NULL},
        {DNNL_ARG_DIFF_BIAS, dnnl_query_diff_weights_md, 1, NULL},
    };
    struct op_mds m;
    int rc;

    memset(&m, 0, sizeof(m));
    if ((rc = md_tag(&m.x, 2, xd, dnnl_nc)) < 0 ||
        (rc = md_tag(&m.y, 2, yd, dnnl_nc)) < 0 ||
        (rc = md_tag(&m.w, 2, wd, dnnl_oi)) < 0 ||
        (rc = md_tag(&m.b, 1, bd, dnnl_x)) < 0 ||
        (rc = md_tag_dt(&m.xb, 2, xd, dnnl_bf16, dnnl_nc)) < 0 ||
        (rc = md_tag_dt(&m.yb, 2, yd, dnnl_bf16, dnnl_nc)) < 0 ||
        (rc = md_tag_dt(&m.wb, 2, wd, dnnl_bf16, dnnl_oi)) < 0)
        return rc;
    if ((rc = op_prim(dev, fc_desc, &m, DIR_FWD, TRY_BF16(dev), fa, 4, &pl->fwd,
                      "fc fwd")) < 0 ||
        (rc = op_prim(dev, fc_desc, &m, DIR_BWD_DATA, TRY_BF16(dev), ba, 3,
                      &pl->bwd, "fc bwd data")) < 0 ||
        (rc = op_prim(dev, fc_desc, &m, DIR_BWD_W, TRY_BF16(dev), wa, 4,
                      &pl->bwdw, "fc bwd weights")) < 0 ||
        (rc = plan_reorders(dev, pl, &m, &m.w)) < 0)
        return rc;
    pl->ws =
        plan_op_ws(pl, f32_bytes(d->n, d->c, 1, 1), f32_bytes(d->n, d->k, 1, 1),
                   f32_bytes(d->k, d->c, 1, 1));
    return 0;
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
    prim_fini(&pl->x_fwd.r);
    prim_fini(&pl->w_fwd.r);
    prim_fini(&pl->dy_bwd.r);
    prim_fini(&pl->w_bwd.r);
    prim_fini(&pl->dx_bwd.r);
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

/*
 * Each conv and fc op stages its operands (stage()) into the workspace, in
 * the order plan_op_ws() counts them, and gives the rest to the scratchpads.
 */
static int cpu_conv_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *x, const float *w, void *y, void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    size_t xb = f32_bytes(d->n, d->c, d->h, d->w);
    size_t wb = f32_bytes(d->k, d->c, d->r, d->s);
    char *bx = ws, *bw = bx + stage_bytes(&p->x_fwd, &p->fwd, xb);
    char *scratch = bw + stage_bytes(&p->w_fwd, &p->fwd, wb);
    const void *h[3] = {NULL, NULL, y};
    int rc;

    if ((rc = stage(dev, &p->x_fwd, &p->fwd, x, xb, bx, scratch, &h[0])) < 0 ||
        (rc = stage(dev, &p->w_fwd, &p->fwd, w, wb, bw, scratch, &h[1])) < 0)
        return rc;
    return prim_run(dev, &p->fwd, (void *const *)h, scratch, "conv fwd");
}

static int cpu_conv_bwd_data(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                             const void *dy, const float *w, void *dx, void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    size_t yb = f32_bytes(d->n, d->k, d->oh, d->ow);
    size_t wb = f32_bytes(d->k, d->c, d->r, d->s);
    char *bdx = ws, *bdy = bdx + align64(p->dx_bwd.bytes), *bw, *scratch;
    const void *h[3] = {NULL, NULL, p->dx_bwd.r.p ? (void *)bdx : dx};
    int rc;

    if (!p->bwd.p)
        return mesh_err(-ENOTSUP,
                        "nn cpu: oneDNN has no backward-data convolution for "
                        "%d input channels",
                        p->d.c);
    bw = bdy + stage_bytes(&p->dy_bwd, &p->bwd, yb);
    scratch = bw + stage_bytes(&p->w_bwd, &p->bwd, wb);
    if ((rc = stage(dev, &p->dy_bwd, &p->bwd, dy, yb, bdy, scratch, &h[0])) <
            0 ||
        (rc = stage(dev, &p->w_bwd, &p->bwd, w, wb, bw, scratch, &h[1])) < 0 ||
        (rc = prim_run(dev, &p->bwd, (void *const *)h, scratch,
                       "conv bwd data")) < 0)
        return rc;
    if (p->dx_bwd.r.p)
        rc = reo_run(dev, &p->dx_bwd, bdx, dx, scratch);
    return rc;
}

/* Weight gradients (conv and fc): dw (and db for fc) from x and dy. */
static int bwd_weights(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                       const void *x, const void *dy, float *dw, float *db,
                       size_t xb, size_t yb, void *ws, const char *what)
{
    char *bdw = ws, *bx = bdw + align64(p->dw.bytes);
    char *bdy = bx + stage_bytes(&p->x_bw, &p->bwdw, xb);
    char *scratch = bdy + stage_bytes(&p->dy_bw, &p->bwdw, yb);
    const void *h[4] = {NULL, NULL, p->dw.r.p ? (void *)bdw : dw, db};
    int rc;

    if ((rc = stage(dev, &p->x_bw, &p->bwdw, x, xb, bx, scratch, &h[0])) < 0 ||
        (rc = stage(dev, &p->dy_bw, &p->bwdw, dy, yb, bdy, scratch, &h[1])) <
            0 ||
        (rc = prim_run(dev, &p->bwdw, (void *const *)h, scratch, what)) < 0)
        return rc;
    if (p->dw.r.p)
        rc = reo_run(dev, &p->dw, bdw, dw, scratch);
    return rc;
}

static int cpu_conv_bwd_filter(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                               const void *x, const void *dy, float *dw,
                               void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;

    return bwd_weights(
        dev, p, x, dy, dw, NULL, f32_bytes(d->n, d->c, d->h, d->w),
        f32_bytes(d->n, d->k, d->oh, d->ow), ws, "conv bwd weights");
}

/* conv_fwd, converting x into reserve for cpu_conv_bwd_filter_kept. */
static int cpu_conv_fwd_keep(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                             const void *x, const float *w, void *y,
                             void *reserve, void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    size_t wb = f32_bytes(d->k, d->c, d->r, d->s);
    char *bw = ws, *scratch = bw + stage_bytes(&p->w_fwd, &p->fwd, wb);
    const void *h[3] = {reserve, NULL, y};
    int rc;

    if (!p->keep)
        return cpu_conv_fwd(dev, p, x, w, y, ws);
    if ((rc = reo_run(dev, &p->x_fwd, x, reserve, scratch)) < 0 ||
        (rc = stage(dev, &p->w_fwd, &p->fwd, w, wb, bw, scratch, &h[1])) < 0)
        return rc;
    return prim_run(dev, &p->fwd, (void *const *)h, scratch, "conv fwd");
}

/* conv_bwd_filter on the x that cpu_conv_fwd_keep kept; dy's bfloat16
 * form stays at the start of ws for cpu_conv_bwd_data_after. */
static int cpu_conv_bwd_filter_kept(struct mesh_nn_dev *dev,
                                    struct mesh_nn_plan *p, const void *x,
                                    const void *reserve, const void *dy,
                                    float *dw, void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    size_t yb = f32_bytes(d->n, d->k, d->oh, d->ow);
    char *bdy = ws, *bdw = bdy + stage_bytes(&p->dy_bw, &p->bwdw, yb);
    char *scratch = bdw + align64(p->dw.bytes);
    const void *h[3] = {reserve, NULL, p->dw.r.p ? (void *)bdw : dw};
    int rc;

    if (!p->keep)
        return cpu_conv_bwd_filter(dev, p, x, dy, dw, ws);
    if ((rc = stage(dev, &p->dy_bw, &p->bwdw, dy, yb, bdy, scratch, &h[1])) <
            0 ||
        (rc = prim_run(dev, &p->bwdw, (void *const *)h, scratch,
                       "conv bwd weights")) < 0)
        return rc;
    if (p->dw.r.p)
        rc = reo_run(dev, &p->dw, bdw, dw, scratch);
    return rc;
}

/* conv_bwd_data reading the dy that cpu_conv_bwd_filter_kept converted. */
static int cpu_conv_bwd_data_after(struct mesh_nn_dev *dev,
                                   struct mesh_nn_plan *p, const void *dy,
                                   const float *w, void *dx, void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    size_t yb = f32_bytes(d->n, d->k, d->oh, d->ow);
    size_t wb = f32_bytes(d->k, d->c, d->r, d->s);
    char *bdy = ws, *bdx = bdy + stage_bytes(&p->dy_bwd, &p->bwd, yb);
    char *bw = bdx + align64(p->dx_bwd.bytes);
    char *scratch = bw + stage_bytes(&p->w_bwd, &p->bwd, wb);
    const void *h[3] = {bdy, NULL, p->dx_bwd.r.p ? (void *)bdx : dx};
    int rc;

    if (!p->share_dy)
        return cpu_conv_bwd_data(dev, p, dy, w, dx, ws);
    if ((rc = stage(dev, &p->w_bwd, &p->bwd, w, wb, bw, scratch, &h[1])) < 0 ||
        (rc = prim_run(dev, &p->bwd, (void *const *)h, scratch,
                       "conv bwd data")) < 0)
        return rc;
    if (p->dx_bwd.r.p)
        rc = reo_run(dev, &p->dx_bwd, bdx, dx, scratch);
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

static int cpu_bn_bwd_frozen(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                             const void *y, const void *dy, const float *gamma,
                             const float *running_var, void *dx)
{
    set_threads(dev);
    mesh_nn_cpu_bn_bwd_frozen(&p->bn, y, dy, gamma, running_var, dx);
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
    const struct mesh_nn_plan_desc *d = &p->d;
    size_t xb = f32_bytes(d->n, d->c, 1, 1), wb = f32_bytes(d->k, d->c, 1, 1);
    char *bx = ws, *bw = bx + stage_bytes(&p->x_fwd, &p->fwd, xb);
    char *scratch = bw + stage_bytes(&p->w_fwd, &p->fwd, wb);
    const void *h[4] = {NULL, NULL, b, y};
    int rc;

    if ((rc = stage(dev, &p->x_fwd, &p->fwd, x, xb, bx, scratch, &h[0])) < 0 ||
        (rc = stage(dev, &p->w_fwd, &p->fwd, w, wb, bw, scratch, &h[1])) < 0)
        return rc;
    return prim_run(dev, &p->fwd, (void *const *)h, scratch, "fc fwd");
}

static int cpu_fc_bwd_data(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *dy, const float *w, void *dx, void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;
    size_t yb = f32_bytes(d->n, d->k, 1, 1), wb = f32_bytes(d->k, d->c, 1, 1);
    char *bdy = ws, *bw = bdy + stage_bytes(&p->dy_bwd, &p->bwd, yb);
    char *scratch = bw + stage_bytes(&p->w_bwd, &p->bwd, wb);
    const void *h[3] = {NULL, NULL, dx};
    int rc;

    if ((rc = stage(dev, &p->dy_bwd, &p->bwd, dy, yb, bdy, scratch, &h[0])) <
            0 ||
        (rc = stage(dev, &p->w_bwd, &p->bwd, w, wb, bw, scratch, &h[1])) < 0)
        return rc;
    return prim_run(dev, &p->bwd, (void *const *)h, scratch, "fc bwd data");
}

static int cpu_fc_bwd_weights(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                              const void *x, const void *dy, float *dw,
                              float *db, void *ws)
{
    const struct mesh_nn_plan_desc *d = &p->d;

    return bwd_weights(dev, p, x, dy, dw, db, f32_bytes(d->n, d->c, 1, 1),
                       f32_bytes(d->n, d->k, 1, 1), ws, "fc bwd weights");
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

/*
 * cpu_sgd's update with a->keep_p (and a->keep_buf with momentum): the
 * values it overwrites are written there in the same pass, the arithmetic
 * the same as below operation by operation (so bitwise the same result).
 */
static int sgd_keep(size_t n, float *restrict p, const float *restrict g,
                    float *restrict buf, const struct mesh_nn_sgd_args *a)
{
    const float lr = a->lr, mom = a->momentum, wd = a->weight_decay;
    const float damp1 = 1.f - a->dampening;
    float *restrict kp = a->keep_p, *restrict kb = a->keep_buf;
    size_t i;

    if (mom == 0.f) {
        for (i = 0; i < n; i++) {
            const float pi = p[i];
            float d = g[i];

            kp[i] = pi;
            if (wd != 0.f)
                d = d + wd * pi;
            p[i] = pi + -lr * d;
        }
        return 0;
    }
    for (i = 0; i < n; i++) {
        const float pi = p[i], bi = buf[i];
        float d = g[i], b;

        kp[i] = pi;
        kb[i] = bi;
        if (wd != 0.f)
            d = d + wd * pi;
        b = a->first ? d : bi * mom + damp1 * d;
        buf[i] = b;
        d = a->nesterov ? d + mom * b : b;
        p[i] = pi + -lr * d;
    }
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
    if (a->keep_p)
        return sgd_keep(n, p, g, buf, a);
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
    cpu_free(dev, scratch); /* (cpu_alloc counted it live) */
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

/* ---- bf16-amp ---------------------------------------------------------- */

/*
 * Whether oneDNN has bfloat16 kernels for this CPU: a ResNet 3x3
 * convolution's plan in bf16-amp gets bfloat16 primitives (oneDNN 2.6:
 * AVX512-BF16 or AMX natively, plain AVX-512 by its own emulation; none on
 * AVX2).
 */
static int bf16_supported(struct mesh_nn_dev *dev)
{
    struct mesh_nn_plan_desc d;
    struct mesh_nn_plan *pl = NULL;
    int yes;

    memset(&d, 0, sizeof(d));
    d.kind = MESH_NN_PLAN_CONV;
    d.n = 2, d.c = d.k = 64, d.h = d.w = d.oh = d.ow = 8;
    d.r = d.s = 3, d.stride = 1, d.pad = 1;
    if (cpu_plan_create(dev, &d, &pl) < 0) {
        mesh_err_clear();
        return 0;
    }
    yes = !pl->fwd.emu && !pl->bwd.emu && !pl->bwdw.emu;
    cpu_plan_destroy(dev, pl);
    return yes;
}

static int cpu_dev_open_opts(const struct mesh_nn_dev_opts *o,
                             struct mesh_nn_dev **out)
{
    const char *env = getenv("MESHTRAIN_CPU_BF16");
    struct mesh_nn_dev *dev;
    int emu = 0, rc;

    if (o->precision == MESH_NN_PREC_TF32)
        return mesh_err(-ENOTSUP, "nn cpu: no tf32 on the cpu backend "
                                  "(--precision fp32 or bf16-amp)");
    if (env && *env) {
        if (strcmp(env, "emulate") != 0)
            return mesh_err(-EINVAL,
                            "MESHTRAIN_CPU_BF16=%s: the only value is "
                            "\"emulate\"",
                            env);
        emu = 1;
    }
    rc = cpu_dev_open(o->threads, &dev);
    if (rc < 0 || o->precision != MESH_NN_PREC_BF16_AMP) {
        if (rc == 0)
            *out = dev;
        return rc;
    }
    dev->bf16 = 1;
    if (!emu && !bf16_supported(dev)) {
        const dnnl_version_t *v = dnnl_version();

        cpu_dev_close(dev);
        return mesh_err(-ENOTSUP,
                        "--precision bf16-amp: oneDNN %d.%d.%d has no "
                        "bfloat16 convolution for this CPU (it needs "
                        "AVX512-BF16, AMX or at least AVX-512); set "
                        "MESHTRAIN_CPU_BF16=emulate to round the operands "
                        "to bfloat16 and compute in float32 instead (the "
                        "same results, slower than fp32)",
                        v->major, v->minor, v->patch);
    }
    dev->bf16_emu = emu;
    {
        size_t len = strlen(dev->desc);

        snprintf(dev->desc + len, sizeof(dev->desc) - len, ", bf16-amp (%s)",
                 emu ? "emulated: float32 on bfloat16-rounded operands"
                     : "oneDNN bfloat16 kernels");
    }
    *out = dev;
    return 0;
}

const struct mesh_nn_backend_ops mesh_nn_cpu_ops = {
    .name = "cpu",
    MESH_NN_BACKEND_CORE(cpu),
    .upload = cpu_copy,
    .download = cpu_copy,
    .dev_open_opts = cpu_dev_open_opts,
    .bn_bwd_frozen = cpu_bn_bwd_frozen,
    .conv_fwd_keep = cpu_conv_fwd_keep,
    .conv_bwd_filter_kept = cpu_conv_bwd_filter_kept,
    .conv_bwd_data_after = cpu_conv_bwd_data_after,
};
