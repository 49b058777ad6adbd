/*
 * train/gradsync.c: the gradient buckets, their all-reduces and the
 * pinned-host pipeline (see train/gradsync.h).
 */
#include "config.h"

#include "train/gradsync.h"

#include "common/dtype.h"
#include "common/util.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#define FIRST_BUCKET_MAX_BYTES (1u << 20)

struct bucket {
    size_t lo, hi;        /* floats [lo, hi) of the gradient slab */
    void *wire;           /* (hi - lo) 16-bit values with --compress */
    mesh_coll_req_t *req; /* in flight (host slabs, or one peer) */
    int started, done;
    /* device backends with peers (the pinned-host pipeline) */
    float *pinned;         /* (hi - lo) floats, mesh_coll_buf_alloc'ed */
    void *dwire;           /* --compress: 16-bit staging on the device */
    int c0, c1;            /* its chunks: [c0, c1) of the trainer's */
    double t_start, t_end; /* seconds since the run started */
};

/*
 * One chunk of a bucket in the pinned-host pipeline: copied to the
 * bucket's host buffer (pinned, or the 16-bit wire buffer under
 * --compress), all-reduced there, copied back, on its own.
 */
struct chunk {
    size_t lo, hi;             /* floats [lo, hi) of the gradient slab */
    int bucket, index;         /* its bucket, its place in it */
    struct mesh_nn_copy *d2h;  /* in flight: device -> pinned host */
    mesh_coll_req_t *req;      /* in flight: its all-reduce */
    struct mesh_nn_copy *h2d;  /* in flight: pinned host -> device */
    double t_out, t_red, t_in; /* when each stage started */
};

struct mesh_gradsync {
    struct mesh_gradsync_opts o;
    float *grads;           /* the model's gradient slab */
    float *hgrads;          /* host copy of the gradients when not host_slabs */
    int compress;           /* the wire dtype is 16-bit (dense) */
    int sparse;             /* --compress topk / threshold */
    struct mesh_sparse *sp; /* its exchange (once the buckets are planned) */

    struct bucket *b;
    int nbuckets, next_bucket;
    /*
     * Device slabs with peers: every bucket's chunks in (bucket, chunk)
     * order, and how far each stage got this step, each a prefix:
     * ordered <= returned <= reduced <= issued <= nchunks.
     */
    struct chunk *ch;
    int nchunks;
    int ch_issued;   /* copy to the host started */
    int ch_reduced;  /* all-reduce started (this order on every rank) */
    int ch_returned; /* all-reduce done, copy back started */
    int ch_ordered;  /* the device's later ops wait for the copy back */
};

static double now_s(const struct mesh_gradsync *gs)
{
    return mesh_now_s() - gs->o.t0;
}

/* A timeline event of bucket i, or of one of its chunks. */
static void tl_add(struct mesh_gradsync *gs, const char *name, int tid, int i,
                   double ts, double dur)
{
    if (gs->o.event)
        gs->o.event(gs->o.event_arg, name, tid, i, -1,
                    (gs->b[i].hi - gs->b[i].lo) * (gs->compress ? 2 : 4), ts,
                    dur);
}

static void tl_chunk(struct mesh_gradsync *gs, const char *name, int tid,
                     const struct chunk *ch, double ts, double dur)
{
    if (gs->o.event)
        gs->o.event(gs->o.event_arg, name, tid, ch->bucket, ch->index,
                    (ch->hi - ch->lo) * (gs->compress ? 2 : 4), ts, dur);
}

/* Device slabs with peers: buckets go through the pinned-host pipeline
 * (dense only: a sparse bucket is selected on the host as a whole). */
static int pipelined(const struct mesh_gradsync *gs)
{
    return !gs->o.host_slabs && gs->o.coll && !gs->sparse;
}

/*
 * Cut every bucket into chunks of at most --chunk-mb, of equal sizes
 * within a bucket (no small tail chunk paying a whole collective's
 * latency for a few bytes).
 */
static int chunks_plan(struct mesh_gradsync *gs)
{
    size_t cap = (size_t)(gs->o.chunk_mb * 1024 * 1024 / 4), total = 0;
    int i, n = 0;

    if (cap < 1)
        cap = 1;
    for (i = 0; i < gs->nbuckets; i++)
        total += (gs->b[i].hi - gs->b[i].lo + cap - 1) / cap;
    if (total > (1u << 20))
        return mesh_err(-EINVAL, "--chunk-mb %g: %zu chunks (at most %u)",
                        gs->o.chunk_mb, total, 1u << 20);
    gs->ch = calloc(total, sizeof(*gs->ch));
    if (!gs->ch)
        return mesh_err(-ENOMEM, "out of memory planning gradient chunks");
    for (i = 0; i < gs->nbuckets; i++) {
        struct bucket *b = &gs->b[i];
        size_t len = b->hi - b->lo, k = (len + cap - 1) / cap, j;

        b->c0 = n;
        for (j = 0; j < k; j++, n++) {
            gs->ch[n].lo = b->lo + len * j / k;
            gs->ch[n].hi = b->lo + len * (j + 1) / k;
            gs->ch[n].bucket = i;
            gs->ch[n].index = (int)j;
        }
        b->c1 = n;
    }
    gs->nchunks = n;
    return 0;
}

/*
 * With peers, each bucket's host buffers: the 16-bit wire buffer under
 * --compress; device slabs: a pinned host buffer per bucket (16-bit under
 * --compress: the wire buffer), the 16-bit device staging, the chunks.
 */
static int buckets_alloc(struct mesh_gradsync *gs)
{
    struct bucket *b = gs->b;
    int i, nb = gs->nbuckets;

    if (gs->compress && gs->o.coll) {
        for (i = 0; i < nb; i++) {
            int rc = mesh_coll_buf_alloc(gs->o.coll, (b[i].hi - b[i].lo) * 2,
                                         &b[i].wire);

            if (rc < 0)
                return rc;
        }
    }
    /* device slabs: a pinned host buffer per bucket (16-bit under
     * --compress: the wire buffer above), and the 16-bit device staging */
    for (i = 0; !gs->o.host_slabs && gs->o.coll && i < nb; i++) {
        size_t cnt = b[i].hi - b[i].lo;
        int rc = gs->compress ? mesh_nn_alloc(gs->o.ctx, cnt * 2, &b[i].dwire)
                              : mesh_coll_buf_alloc(gs->o.coll, cnt * 4,
                                                    (void **)&b[i].pinned);

        if (rc < 0)
            return rc;
    }
    return pipelined(gs) ? chunks_plan(gs) : 0;
}

/*
 * Cut the slab at tensor boundaries, from the end down, as DDP does: a
 * bucket closes after the tensor that takes it to its cap or more, so no
 * tiny bucket is left between two large tensors; frozen tensors are left
 * out (their gradients are never all-reduced). Bucket 0's cap is
 * FIRST_BUCKET_MAX_BYTES (or --bucket-mb if smaller), the others'
 * --bucket-mb.
 */
static int buckets_plan(struct mesh_gradsync *gs,
                        const struct mesh_train_model *m)
{
    int n = m->ntensors, i, nb = 0;
    /* simulated: the bucket sizes shrink with the gradients (same cuts) */
    double k = gs->o.scale;
    size_t cap = (size_t)(gs->o.bucket_mb * 1024 * 1024 / 4 / k);
    size_t first = (size_t)(FIRST_BUCKET_MAX_BYTES / 4 / k);
    size_t hi = gs->o.nparams;
    struct bucket *b;

    if (cap < 1)
        cap = 1;
    if (first < 1)
        first = 1;
    if (first > cap)
        first = cap;
    b = calloc((size_t)n + 1, sizeof(*b));
    if (!b)
        return mesh_err(-ENOMEM, "out of memory planning gradient buckets");
    /* Params come first in the tensor list, in slab order. A frozen
     * tensor is in no bucket: the bucket above it closes at its end. */
    for (i = n - 1; i >= 0; i--) {
        const struct mesh_nn_tensor *x = m->ops->tensor(m->m, i);

        if (x->kind != MESH_NN_PARAM)
            continue;
        if (x->frozen) {
            if (hi > x->offset + x->count) {
                b[nb].lo = x->offset + x->count;
                b[nb].hi = hi;
                nb++;
            }
            hi = x->offset;
            continue;
        }
        if (hi - x->offset >= (nb == 0 ? first : cap) && x->offset > 0) {
            b[nb].lo = x->offset;
            b[nb].hi = hi;
            hi = x->offset;
            nb++;
        }
    }
    if (hi > 0) {
        b[nb].lo = 0;
        b[nb].hi = hi;
        nb++;
    }
    gs->b = b;
    gs->nbuckets = nb;
    return buckets_alloc(gs);
}

static void buckets_free(struct mesh_gradsync *gs)
{
    int i;

    free(gs->ch);
    gs->ch = NULL;
    gs->nchunks = 0;

    for (i = 0; gs->b && gs->o.coll && i < gs->nbuckets; i++) {
        if (gs->b[i].pinned)
            mesh_coll_buf_free(gs->o.coll, gs->b[i].pinned);
        mesh_nn_free(gs->o.ctx, gs->b[i].dwire);
    }
    for (i = 0; gs->b && gs->o.coll && i < gs->nbuckets; i++)
        if (gs->b[i].wire)
            mesh_coll_buf_free(gs->o.coll, gs->b[i].wire);
    free(gs->b);
    gs->b = NULL;
}

static float *grads_host(struct mesh_gradsync *gs)
{
    return gs->o.host_slabs ? gs->grads : gs->hgrads;
}

/*
 * The pinned-host pipeline (device slabs with peers). A bucket whose range
 * is final is scaled (and narrowed to 16 bits under --compress) on the
 * device, then each of its chunks is copied to the bucket's host buffer on
 * nn's copy stream, ordered after the backward kernels issued so far, with
 * no host wait. Then, per chunk: its all-reduce starts once its copy is
 * done, its copy back once the all-reduce is (and, under --compress, the
 * widening to float32 on the device after that), so that the copy out of
 * chunk k + 1 overlaps the network of chunk k and the copy back of chunk k
 * the network of chunk k + 1. The grad-ready callback moves this on
 * during backward (pipeline_poll), buckets_wait after it (pipeline_drain).
 */
static void *chunk_host(const struct mesh_gradsync *gs, const struct chunk *ch)
{
    const struct bucket *b = &gs->b[ch->bucket];
    size_t off = ch->lo - b->lo;

    return gs->compress ? (void *)((uint16_t *)b->wire + off)
                        : (void *)(b->pinned + off);
}

/* The device side of the chunk's copies: the gradients, or the 16-bit
 * staging under --compress. */
static void *chunk_dev(const struct mesh_gradsync *gs, const struct chunk *ch)
{
    const struct bucket *b = &gs->b[ch->bucket];

    return gs->compress ? (void *)((uint16_t *)b->dwire + (ch->lo - b->lo))
                        : (void *)(gs->grads + ch->lo);
}

static size_t chunk_bytes(const struct mesh_gradsync *gs,
                          const struct chunk *ch)
{
    return (ch->hi - ch->lo) * (gs->compress ? 2 : 4);
}

static int bucket_copy_out(struct mesh_gradsync *gs, int i)
{
    struct bucket *b = &gs->b[i];
    float *dg = gs->grads + b->lo;
    size_t n = b->hi - b->lo;
    int rc = 0, j;

    b->started = 1;
    b->done = 0;
    b->t_start = now_s(gs);
    if (gs->compress)
        rc = mesh_nn_convert(gs->o.ctx, gs->o.wire, b->dwire, MESH_DT_F32, dg,
                             n, gs->o.grad_scale);
    else if (gs->o.grad_scale != 1.0f)
        rc = mesh_nn_convert(gs->o.ctx, MESH_DT_F32, dg, MESH_DT_F32, dg, n,
                             gs->o.grad_scale);
    for (j = b->c0; rc == 0 && j < b->c1; j++) {
        struct chunk *ch = &gs->ch[j];

        ch->t_out = now_s(gs);
        rc = mesh_nn_copy_d2h_start(gs->o.ctx, chunk_host(gs, ch),
                                    chunk_dev(gs, ch), chunk_bytes(gs, ch),
                                    &ch->d2h);
        if (rc == 0)
            gs->ch_issued = j + 1;
    }
    return rc;
}

/* The next chunk in (bucket, chunk) order: wait for its copy to the host
 * (already done when pipeline_poll calls) and start its all-reduce. */
static int chunk_reduce(struct mesh_gradsync *gs)
{
    struct chunk *ch = &gs->ch[gs->ch_reduced];
    int rc = mesh_nn_copy_wait(gs->o.ctx, ch->d2h); /* releases it */

    ch->d2h = NULL;
    if (rc < 0)
        return rc;
    ch->t_red = now_s(gs);
    tl_chunk(gs, "copy to host", 3, ch, ch->t_out, ch->t_red - ch->t_out);
    rc = mesh_coll_allreduce_start(
        gs->o.coll, chunk_host(gs, ch), chunk_host(gs, ch), ch->hi - ch->lo,
        gs->o.wire, MESH_REDOP_AVG, gs->o.algo, &ch->req);
    if (rc == 0)
        gs->ch_reduced++;
    return rc;
}

/*
 * The next chunk's all-reduce ended with rc (its request is freed): copy
 * the result back. b0, b1: when the engine ran it, 0 when not known.
 */
static int chunk_return(struct mesh_gradsync *gs, int rc, double b0, double b1)
{
    struct chunk *ch = &gs->ch[gs->ch_returned];
    double now = now_s(gs);

    ch->req = NULL;
    if (rc < 0)
        return rc;
    if (b0 > 0 && b1 >= b0)
        tl_chunk(gs, "allreduce", 1, ch, b0 - gs->o.t0, b1 - b0);
    else
        tl_chunk(gs, "allreduce", 1, ch, ch->t_red, now - ch->t_red);
    ch->t_in = now;
    rc =
        mesh_nn_copy_h2d_start(gs->o.ctx, chunk_dev(gs, ch), chunk_host(gs, ch),
                               chunk_bytes(gs, ch), &ch->h2d);
    if (rc == 0)
        gs->ch_returned++;
    return rc;
}

/*
 * Order the device's later ops (the optimizer step) after the next
 * chunk's copy back, without a host wait, and under --compress widen it
 * to float32 on the device. The timeline shows the copy until it was seen
 * done, or until the device was ordered after it.
 */
static int chunk_order(struct mesh_gradsync *gs)
{
    struct chunk *ch = &gs->ch[gs->ch_ordered];
    int rc = mesh_nn_copy_order(gs->o.ctx, ch->h2d); /* releases it */

    ch->h2d = NULL;
    tl_chunk(gs, "copy to device", 3, ch, ch->t_in, now_s(gs) - ch->t_in);
    if (rc == 0 && gs->compress)
        rc = mesh_nn_convert(gs->o.ctx, MESH_DT_F32, gs->grads + ch->lo,
                             gs->o.wire, chunk_dev(gs, ch), ch->hi - ch->lo,
                             1.f);
    if (rc == 0)
        gs->ch_ordered++;
    return rc;
}

/*
 * A copy stage: while chunk *next (up to end) has its copy done (h2d: the
 * copy back, else the copy out), pass it on with step, which moves *next.
 */
static int copies_poll(struct mesh_gradsync *gs, const int *next, int end,
                       int h2d, int (*step)(struct mesh_gradsync *))
{
    int done, rc;

    while (*next < end) {
        const struct chunk *ch = &gs->ch[*next];

        done = 0;
        rc = mesh_nn_copy_test(gs->o.ctx, h2d ? ch->h2d : ch->d2h, &done);
        if (rc == 0 && done)
            rc = step(gs);
        if (rc < 0)
            return rc;
        if (!done)
            break;
    }
    return 0;
}

/*
 * Move the pipeline on as far as it goes without blocking. All-reduces
 * start strictly in (bucket, chunk) order, the same on every rank: chunk
 * j + 1 never before chunk j, whatever order the copies are seen to finish
 * in. A copy back is ordered here only once it is done (then the device
 * waits for nothing).
 */
static int pipeline_poll(struct mesh_gradsync *gs)
{
    int done, rc;

    rc = copies_poll(gs, &gs->ch_reduced, gs->ch_issued, 0, chunk_reduce);
    if (rc < 0)
        return rc;
    while (gs->ch_returned < gs->ch_reduced) {
        done = 0;
        rc = mesh_coll_test(gs->ch[gs->ch_returned].req, &done);
        if (rc == 0 && !done)
            break;
        rc = chunk_return(gs, rc, 0, 0); /* done: the request is freed */
        if (rc < 0)
            return rc;
    }
    return copies_poll(gs, &gs->ch_ordered, gs->ch_returned, 1, chunk_order);
}

/* After backward, every bucket's copies out issued: finish every chunk,
 * blocking on the oldest stage that holds the others up. */
static int pipeline_drain(struct mesh_gradsync *gs)
{
    int rc = 0, rc2;

    if (gs->ch_issued != gs->nchunks)
        return mesh_err(-EPROTO,
                        "gradient pipeline: %d of %d chunks "
                        "issued after backward",
                        gs->ch_issued, gs->nchunks);
    while (rc == 0 && gs->ch_ordered < gs->nchunks) {
        rc = pipeline_poll(gs);
        if (rc < 0)
            break;
        if (gs->ch_reduced < gs->ch_issued) {
            rc = chunk_reduce(gs); /* waits for its copy out */
        } else if (gs->ch_returned < gs->ch_reduced) {
            double b0 = 0, b1 = 0;

            rc2 = mesh_coll_wait_times(gs->ch[gs->ch_returned].req, &b0, &b1);
            rc = chunk_return(gs, rc2, b0, b1);
        } else if (gs->ch_ordered < gs->ch_returned) {
            rc = chunk_order(gs); /* the device waits, the host does not */
        }
    }
    return rc;
}

/* Bring bucket i to the host, scale it, and start its average. */
static int bucket_start(struct mesh_gradsync *gs, int i)
{
    struct bucket *b = &gs->b[i];
    float *g = grads_host(gs) + b->lo;
    size_t n = b->hi - b->lo, k;
    int rc, dt = gs->o.wire, algo = gs->o.algo;

    if (pipelined(gs))
        return bucket_copy_out(gs, i);
    if (!gs->o.host_slabs) {
        rc = mesh_nn_download(gs->o.ctx, g, gs->grads + b->lo, n * 4);
        if (rc < 0)
            return rc;
    }
    if (gs->o.grad_scale != 1.0f)
        for (k = 0; k < n; k++)
            g[k] *= gs->o.grad_scale;
    b->started = 1;
    b->done = 0;
    b->t_start = now_s(gs);
    if (gs->sp) {
        rc = mesh_sparse_start(gs->sp, i, g);
        if (rc < 0 || gs->o.coll)
            return rc;
        /* one peer: the result is there */
        b->done = 1;
        b->t_end = now_s(gs);
        if (!gs->o.host_slabs)
            return mesh_nn_upload(gs->o.ctx, gs->grads + b->lo, g, n * 4);
        return 0;
    }
    if (!gs->o.coll) {
        /* One peer: nothing to average; the wire rounding still applies,
         * so that one process computes what N peers would. */
        if (dt != MESH_DT_F32) {
            uint16_t *tmp = malloc(n * 2);

            if (!tmp)
                return mesh_err(-ENOMEM, "out of memory");
            mesh_convert(dt, tmp, MESH_DT_F32, g, n);
            mesh_convert(MESH_DT_F32, g, dt, tmp, n);
            free(tmp);
        }
        b->done = 1;
        b->t_end = now_s(gs);
        /* device slabs: the scaled (and rounded) bucket goes back */
        if (!gs->o.host_slabs)
            return mesh_nn_upload(gs->o.ctx, gs->grads + b->lo, g, n * 4);
        return 0;
    }
    if (dt != MESH_DT_F32) {
        mesh_convert(dt, b->wire, MESH_DT_F32, g, n);
        return mesh_coll_allreduce_start(gs->o.coll, b->wire, b->wire, n, dt,
                                         MESH_REDOP_AVG, gs->o.algo, &b->req);
    }
    /* simulated: AUTO chooses for the bucket's real size, not k times
     * smaller (the choice the real run would make) */
    if (gs->o.scale != 1 && algo == MESH_ALGO_AUTO)
        algo = mesh_coll_algo_for(gs->o.coll, algo,
                                  (size_t)((double)n * 4 * gs->o.scale));
    return mesh_coll_allreduce_start(gs->o.coll, g, g, n, MESH_DT_F32,
                                     MESH_REDOP_AVG, algo, &b->req);
}

static int bucket_finish(struct mesh_gradsync *gs, int i, int rc)
{
    struct bucket *b = &gs->b[i];

    b->req = NULL;
    b->done = 1;
    b->t_end = now_s(gs);
    if (rc < 0)
        return rc;
    if (gs->compress)
        mesh_convert(MESH_DT_F32, grads_host(gs) + b->lo, gs->o.wire, b->wire,
                     b->hi - b->lo);
    if (!gs->o.host_slabs)
        return mesh_nn_upload(gs->o.ctx, gs->grads + b->lo,
                              grads_host(gs) + b->lo, (b->hi - b->lo) * 4);
    return 0;
}

/*
 * After an error: wait for every all-reduce still in flight (its host
 * buffers are freed next) and every copy. Returns rc.
 */
int mesh_gradsync_abort(struct mesh_gradsync *gs, int rc)
{
    int i;

    if (gs->sp)
        mesh_sparse_abort(gs->sp);
    for (i = 0; i < gs->nbuckets; i++)
        if (gs->b[i].req) {
            mesh_coll_wait(gs->b[i].req);
            gs->b[i].req = NULL;
        }
    for (i = 0; i < gs->nchunks; i++) {
        struct chunk *ch = &gs->ch[i];

        if (ch->d2h)
            mesh_nn_copy_wait(gs->o.ctx, ch->d2h);
        if (ch->req)
            mesh_coll_wait(ch->req);
        if (ch->h2d)
            mesh_nn_copy_wait(gs->o.ctx, ch->h2d);
        ch->d2h = ch->h2d = NULL;
        ch->req = NULL;
    }
    return rc;
}

/*
 * Sparse buckets: the pairs of every bucket in flight (threshold: once its
 * counts are in), then each one summed in order. The timeline names the
 * all-gather ("allgather sparse") with the bytes it gathered.
 */
static int sparse_finish(struct mesh_gradsync *gs)
{
    int i, rc = 0;

    for (i = 0; rc == 0 && i < gs->nbuckets; i++)
        if (gs->b[i].started && !gs->b[i].done)
            rc = mesh_sparse_exchange(gs->sp, i);
    for (i = 0; rc == 0 && i < gs->nbuckets; i++) {
        struct bucket *b = &gs->b[i];
        double b0 = 0, b1 = 0;

        if (!b->started || b->done)
            continue;
        rc = mesh_sparse_wait(gs->sp, i, grads_host(gs) + b->lo, &b0, &b1);
        b->done = 1;
        b->t_end = now_s(gs);
        if (b0 > 0 && b1 >= b0) {
            b->t_start = b0 - gs->o.t0;
            b->t_end = b1 - gs->o.t0;
        }
        if (rc == 0 && !gs->o.host_slabs)
            rc = mesh_nn_upload(gs->o.ctx, gs->grads + b->lo,
                                grads_host(gs) + b->lo, (b->hi - b->lo) * 4);
        if (rc == 0 && gs->o.event)
            gs->o.event(gs->o.event_arg, "allgather sparse", 1, i, -1,
                        mesh_sparse_bytes(gs->sp, i), b->t_start,
                        b->t_end - b->t_start);
    }
    return rc < 0 ? mesh_gradsync_abort(gs, rc) : 0;
}

/* Start what is left, wait for every bucket in order. */
int mesh_gradsync_finish(struct mesh_gradsync *gs)
{
    int i, rc = 0, rc2;

    while (rc == 0 && gs->next_bucket < gs->nbuckets)
        rc = bucket_start(gs, gs->next_bucket++);
    if (gs->sp)
        return rc < 0 ? mesh_gradsync_abort(gs, rc) : sparse_finish(gs);
    if (pipelined(gs)) {
        if (rc == 0)
            rc = pipeline_drain(gs);
        return rc < 0 ? mesh_gradsync_abort(gs, rc) : 0;
    }
    for (i = 0; i < gs->nbuckets; i++) {
        double b0 = 0, b1 = 0;

        if (!gs->b[i].req)
            continue;
        rc2 = mesh_coll_wait_times(gs->b[i].req, &b0, &b1);
        rc2 = bucket_finish(gs, i, rc2);
        /* when the engine really ran it (it may queue behind others) */
        if (b0 > 0 && b1 >= b0) {
            gs->b[i].t_start = b0 - gs->o.t0;
            gs->b[i].t_end = b1 - gs->o.t0;
        }
        if (rc == 0)
            rc = rc2;
    }
    for (i = 0; gs->o.coll && i < gs->nbuckets; i++)
        if (gs->b[i].started)
            tl_add(gs, "allreduce", 1, i, gs->b[i].t_start,
                   gs->b[i].t_end - gs->b[i].t_start);
    return rc;
}

int mesh_gradsync_ready(struct mesh_gradsync *gs, size_t offset)
{
    int rc;

    while (gs->next_bucket < gs->nbuckets &&
           gs->b[gs->next_bucket].lo >= offset) {
        rc = bucket_start(gs, gs->next_bucket);
        if (rc < 0)
            return rc;
        gs->next_bucket++;
    }
    return pipelined(gs) ? pipeline_poll(gs) : 0;
}

void mesh_gradsync_begin(struct mesh_gradsync *gs)
{
    int k;

    gs->next_bucket = 0;
    for (k = 0; k < gs->nbuckets; k++)
        gs->b[k].started = gs->b[k].done = 0;
    gs->ch_issued = gs->ch_reduced = gs->ch_returned = gs->ch_ordered = 0;
}

/* The sparse exchange over the planned buckets. */
static int sparse_open(struct mesh_gradsync *gs,
                       const struct mesh_sparse_cfg *c)
{
    size_t *lo = calloc((size_t)gs->nbuckets, sizeof(size_t));
    size_t *hi = calloc((size_t)gs->nbuckets, sizeof(size_t));
    int i, rc;

    if (!lo || !hi) {
        free(lo);
        free(hi);
        return mesh_err(-ENOMEM, "out of memory planning sparse buckets");
    }
    for (i = 0; i < gs->nbuckets; i++) {
        lo[i] = gs->b[i].lo;
        hi[i] = gs->b[i].hi;
    }
    rc = mesh_sparse_create(c, gs->o.coll, gs->o.coll ? gs->o.rank : 0,
                            gs->o.coll ? gs->o.size : 1, gs->o.nparams, lo, hi,
                            gs->nbuckets, &gs->sp);
    free(lo);
    free(hi);
    return rc;
}

int mesh_gradsync_create(const struct mesh_gradsync_opts *o,
                         const struct mesh_train_model *model,
                         struct mesh_gradsync **out)
{
    struct mesh_gradsync *gs = calloc(1, sizeof(*gs));
    int rc = 0;

    if (!gs)
        return mesh_err(-ENOMEM, "out of memory planning gradient buckets");
    gs->o = *o;
    gs->grads = model->grads;
    gs->compress = o->wire != MESH_DT_F32;
    if (!o->host_slabs && !(gs->hgrads = malloc(o->nparams * 4)))
        rc = mesh_err(-ENOMEM, "out of memory for host slabs");
    gs->o.sparse = NULL; /* the caller's: copied by sparse_open */
    gs->sparse = o->sparse != NULL;
    if (gs->sparse)
        gs->compress = 0; /* the pairs carry the 16-bit values */
    if (rc == 0)
        rc = buckets_plan(gs, model);
    if (rc == 0 && gs->sparse)
        rc = sparse_open(gs, o->sparse);
    if (rc < 0) {
        mesh_gradsync_destroy(gs);
        return rc;
    }
    *out = gs;
    return 0;
}

void mesh_gradsync_destroy(struct mesh_gradsync *gs)
{
    if (!gs)
        return;
    mesh_sparse_destroy(gs->sp);
    buckets_free(gs);
    free(gs->hgrads);
    free(gs);
}

int mesh_gradsync_num_buckets(const struct mesh_gradsync *gs)
{
    return gs->nbuckets;
}

size_t mesh_gradsync_bucket_floats(const struct mesh_gradsync *gs, int i)
{
    return gs->b[i].hi - gs->b[i].lo;
}

float *mesh_gradsync_residual(struct mesh_gradsync *gs)
{
    return gs->sp ? mesh_sparse_residual(gs->sp) : NULL;
}

int mesh_gradsync_num_chunks(const struct mesh_gradsync *gs)
{
    return gs->nchunks;
}

int mesh_gradsync_average(struct mesh_gradsync *gs, float *slab, float *host,
                          size_t n)
{
    int rc;

    if (!gs->o.coll || n == 0)
        return 0;
    if (gs->o.host_slabs)
        return mesh_coll_allreduce(gs->o.coll, slab, slab, n, MESH_DT_F32,
                                   MESH_REDOP_AVG, gs->o.algo);
    rc = mesh_nn_download(gs->o.ctx, host, slab, n * 4);
    if (rc == 0)
        rc = mesh_coll_allreduce(gs->o.coll, host, host, n, MESH_DT_F32,
                                 MESH_REDOP_AVG, gs->o.algo);
    if (rc == 0)
        rc = mesh_nn_upload(gs->o.ctx, slab, host, n * 4);
    return rc;
}
