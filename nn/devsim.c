/*
 * nn/devsim.c: "devsim", a test double of a GPU for the trainer's tests
 * (--device devsim). Not a compute device: every op runs on the "cpu"
 * backend (oneDNN), synchronously, on the caller's thread. What it adds is
 * what the trainer must get right on a real GPU and cannot test without one:
 *
 * - Its memory counts as device memory: the trainer takes the path of a
 *   device backend (host copies of the slabs, download/upload, the
 *   pinned-host gradient pipeline), since only "cpu" has host slabs.
 * - copy_start queues the copy on one copy thread that runs the copies in
 *   FIFO order, as a CUDA stream does, after an optional delay per copy:
 *   MESHTRAIN_DEVSIM_COPY_US microseconds (0 to 1000000, default 0).
 *   MESHTRAIN_DEVSIM_COPY_ORDER=lifo runs the newest queued copy first
 *   instead, as copies on several streams may finish in any order: a
 *   caller that starts work in the order copies finish, rather than its
 *   own, shows. copy_test and copy_wait report and wait for a copy's
 *   completion. Compute is
 *   synchronous, so a copy started now is already ordered after every op
 *   issued so far, and copy_order (later ops wait for the copy) waits on the
 *   host.
 * - At copy_start, the destination is filled with 0xff bytes (NaN in
 *   float32 and float16) until the copy lands: a read of a pinned buffer
 *   before its copy-out completed, or an optimizer step before its copy-in,
 *   sees NaNs (or, with the delay, at least the wrong bytes), which the
 *   tests' bitwise comparisons catch; so does a source changed while its
 *   copy is queued.
 * - convert (the --compress narrowing and widening, and gradient scaling on
 *   the device) is its own scalar code, independent of the collective's
 *   conversions, as CUDA's intrinsics are: both round to nearest even.
 */
#include "config.h"

#include "common/dtype.h"
#include "nn/backend.h"
#include "nn/nn.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DELAY_ENV    "MESHTRAIN_DEVSIM_COPY_US"
#define DELAY_MAX_US 1000000L
#define ORDER_ENV    "MESHTRAIN_DEVSIM_COPY_ORDER"

/* One queued (or finished, not yet released) copy. */
struct mesh_nn_copy {
    void *dst;
    const void *src;
    size_t bytes;
    int done;                  /* the bytes landed (under the lock) */
    struct mesh_nn_copy *next; /* the queue, or the free list */
    struct mesh_nn_copy *all;  /* every handle, freed with the device */
};

struct mesh_nn_dev {
    struct mesh_nn_dev *cpu;          /* the "cpu" backend's device: every op */
    long delay_us;                    /* per copy, before its bytes move */
    int lifo;                         /* newest queued copy first */
    pthread_t thread;                 /* the copy "stream" */
    pthread_mutex_t lock;             /* everything below */
    pthread_cond_t cond;              /* queue grew, a copy finished, stop */
    struct mesh_nn_copy *head, *tail; /* queued, oldest first */
    struct mesh_nn_copy *free_copies, *all_copies;
    uint64_t issued, ndone; /* copies started, copies finished */
    long live;              /* "device" blocks not freed (atomic) */
    int stop;
    char desc[256];
};

static const struct mesh_nn_backend_ops *const cpu = &mesh_nn_cpu_ops;

/* ---- the copy thread --------------------------------------------------- */

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void *copy_thread(void *arg)
{
    struct mesh_nn_dev *dev = arg;

    pthread_mutex_lock(&dev->lock);
    for (;;) {
        struct mesh_nn_copy *c, *prev = NULL;

        while (!dev->head && !dev->stop)
            pthread_cond_wait(&dev->cond, &dev->lock);
        if (!dev->head)
            break; /* stop, and nothing is left to copy */
        c = dev->head;
        while (dev->lifo && c->next) {
            prev = c;
            c = c->next;
        }
        if (prev)
            prev->next = NULL;
        else
            dev->head = c->next;
        if (dev->tail == c)
            dev->tail = prev;
        /* c is not released before done is set, under the lock */
        pthread_mutex_unlock(&dev->lock);
        if (dev->delay_us > 0)
            sleep_us(dev->delay_us);
        memcpy(c->dst, c->src, c->bytes);
        pthread_mutex_lock(&dev->lock);
        c->done = 1;
        dev->ndone++;
        pthread_cond_broadcast(&dev->cond);
    }
    pthread_mutex_unlock(&dev->lock);
    return NULL;
}

/* Block until c (NULL: every copy issued so far) is done. */
static void wait_copy(struct mesh_nn_dev *dev, const struct mesh_nn_copy *c)
{
    pthread_mutex_lock(&dev->lock);
    while (c ? !c->done : dev->ndone < dev->issued)
        pthread_cond_wait(&dev->cond, &dev->lock);
    pthread_mutex_unlock(&dev->lock);
}

/* ---- device ------------------------------------------------------------ */

static int read_delay(long *out)
{
    const char *v = getenv(DELAY_ENV);
    char *end;
    long us;

    *out = 0;
    if (!v || !*v)
        return 0;
    errno = 0;
    us = strtol(v, &end, 10);
    if (errno || *end || us < 0 || us > DELAY_MAX_US)
        return mesh_err(-EINVAL,
                        "nn devsim: %s=\"%s\" is not a number of "
                        "microseconds from 0 to %ld",
                        DELAY_ENV, v, DELAY_MAX_US);
    *out = us;
    return 0;
}

static int read_order(int *lifo)
{
    const char *v = getenv(ORDER_ENV);

    *lifo = 0;
    if (!v || !*v || strcmp(v, "fifo") == 0)
        return 0;
    if (strcmp(v, "lifo") == 0) {
        *lifo = 1;
        return 0;
    }
    return mesh_err(-EINVAL, "nn devsim: %s=\"%s\" is not fifo or lifo",
                    ORDER_ENV, v);
}

static int sim_dev_open(int threads, struct mesh_nn_dev **out)
{
    struct mesh_nn_dev *dev;
    int rc;

    dev = calloc(1, sizeof(*dev));
    if (!dev)
        return mesh_err(-ENOMEM, "nn devsim: out of memory");
    rc = read_delay(&dev->delay_us);
    if (rc == 0)
        rc = read_order(&dev->lifo);
    if (rc < 0)
        goto fail_free;
    rc = cpu->dev_open(threads, &dev->cpu);
    if (rc < 0)
        goto fail_free;
    rc = -pthread_mutex_init(&dev->lock, NULL);
    if (rc < 0) {
        mesh_err(rc, "nn devsim: pthread_mutex_init: %s", strerror(-rc));
        goto fail_cpu;
    }
    rc = -pthread_cond_init(&dev->cond, NULL);
    if (rc < 0) {
        mesh_err(rc, "nn devsim: pthread_cond_init: %s", strerror(-rc));
        goto fail_lock;
    }
    rc = -pthread_create(&dev->thread, NULL, copy_thread, dev);
    if (rc < 0) {
        mesh_err(rc, "nn devsim: pthread_create (copy thread): %s",
                 strerror(-rc));
        goto fail_cond;
    }
    snprintf(dev->desc, sizeof(dev->desc),
             "devsim (a GPU test double, not a compute device: copies on a "
             "thread, %s, %ld us each; ops on %s)",
             dev->lifo ? "newest first" : "in order", dev->delay_us,
             cpu->dev_describe(dev->cpu));
    *out = dev;
    return 0;

fail_cond:
    pthread_cond_destroy(&dev->cond);
fail_lock:
    pthread_mutex_destroy(&dev->lock);
fail_cpu:
    cpu->dev_close(dev->cpu);
fail_free:
    free(dev);
    return rc;
}

/* Finish the queued copies, stop the thread, free every copy handle. */
static void sim_dev_close(struct mesh_nn_dev *dev)
{
    struct mesh_nn_copy *c, *next;

    if (!dev)
        return;
    pthread_mutex_lock(&dev->lock);
    dev->stop = 1;
    pthread_cond_broadcast(&dev->cond);
    pthread_mutex_unlock(&dev->lock);
    pthread_join(dev->thread, NULL);
    for (c = dev->all_copies; c; c = next) {
        next = c->all;
        free(c);
    }
    pthread_cond_destroy(&dev->cond);
    pthread_mutex_destroy(&dev->lock);
    cpu->dev_close(dev->cpu);
    free(dev);
}

static const char *sim_dev_describe(struct mesh_nn_dev *dev)
{
    return dev->desc;
}

/* Every op issued so far, the copies included, has finished. */
static int sim_sync(struct mesh_nn_dev *dev)
{
    wait_copy(dev, NULL);
    return cpu->sync(dev->cpu);
}

/* ---- asynchronous copies ----------------------------------------------- */

static int sim_copy_start(struct mesh_nn_dev *dev, int to_host, void *dst,
                          const void *src, size_t bytes,
                          struct mesh_nn_copy **out)
{
    struct mesh_nn_copy *c;

    (void)to_host; /* one address space: both directions are a memcpy */
    pthread_mutex_lock(&dev->lock);
    c = dev->free_copies;
    if (c) {
        dev->free_copies = c->next;
    } else {
        c = calloc(1, sizeof(*c));
        if (!c) {
            pthread_mutex_unlock(&dev->lock);
            return mesh_err(-ENOMEM, "nn devsim: out of memory");
        }
        c->all = dev->all_copies;
        dev->all_copies = c;
    }
    /* until the copy lands, the destination holds NaNs (see the top) */
    memset(dst, 0xff, bytes);
    c->dst = dst;
    c->src = src;
    c->bytes = bytes;
    c->done = 0;
    dev->issued++;
    c->next = NULL;
    if (dev->tail)
        dev->tail->next = c;
    else
        dev->head = c;
    dev->tail = c;
    pthread_cond_broadcast(&dev->cond);
    pthread_mutex_unlock(&dev->lock);
    *out = c;
    return 0;
}

static int sim_copy_test(struct mesh_nn_dev *dev, struct mesh_nn_copy *c,
                         int *done)
{
    pthread_mutex_lock(&dev->lock);
    *done = c->done;
    pthread_mutex_unlock(&dev->lock);
    return 0;
}

static void copy_release(struct mesh_nn_dev *dev, struct mesh_nn_copy *c)
{
    pthread_mutex_lock(&dev->lock);
    c->next = dev->free_copies;
    dev->free_copies = c;
    pthread_mutex_unlock(&dev->lock);
}

static int sim_copy_wait(struct mesh_nn_dev *dev, struct mesh_nn_copy *c)
{
    wait_copy(dev, c);
    copy_release(dev, c);
    return 0;
}

/* Compute is synchronous: ordering later ops after c is waiting for it. */
static int sim_copy_order(struct mesh_nn_dev *dev, struct mesh_nn_copy *c)
{
    return sim_copy_wait(dev, c);
}

/* ---- conversions: the base layer's scalar ones (round to nearest even,
 * as CUDA's __float2*_rn; NaN quieted, as F16C) ------------------------- */

static int sim_convert(struct mesh_nn_dev *dev, int dst_dtype, void *dst,
                       int src_dtype, const void *src, size_t n, float scale)
{
    size_t i;

    (void)dev;
    for (i = 0; i < n; i++) {
        float v = mesh_dtype_get_f32(src_dtype, src, i);

        if (scale != 1.f)
            v *= scale;
        mesh_dtype_put_f32(dst_dtype, dst, i, v);
    }
    return 0;
}

/* ---- every other op: the cpu backend's ----------------------------------- */

static int sim_alloc(struct mesh_nn_dev *dev, size_t bytes, void **out)
{
    int rc = cpu->alloc(dev->cpu, bytes, out);

    if (rc == 0)
        __atomic_add_fetch(&dev->live, 1, __ATOMIC_RELAXED);
    return rc;
}

static void sim_free(struct mesh_nn_dev *dev, void *p)
{
    if (p)
        __atomic_sub_fetch(&dev->live, 1, __ATOMIC_RELAXED);
    cpu->free(dev->cpu, p);
}

static long sim_live_allocs(struct mesh_nn_dev *dev)
{
    return __atomic_load_n(&dev->live, __ATOMIC_RELAXED);
}

static int sim_upload(struct mesh_nn_dev *dev, void *dst, const void *src,
                      size_t bytes)
{
    return cpu->upload(dev->cpu, dst, src, bytes);
}

static int sim_download(struct mesh_nn_dev *dev, void *dst, const void *src,
                        size_t bytes)
{
    return cpu->download(dev->cpu, dst, src, bytes);
}

static int sim_zero(struct mesh_nn_dev *dev, void *p, size_t bytes)
{
    return cpu->zero(dev->cpu, p, bytes);
}

static size_t sim_act_bytes(struct mesh_nn_dev *dev, int n, int c, int h, int w)
{
    return cpu->act_bytes(dev->cpu, n, c, h, w);
}

static int sim_act_import(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                          const float *host, void *dst)
{
    return cpu->act_import(dev->cpu, n, c, h, w, host, dst);
}

static int sim_act_export(struct mesh_nn_dev *dev, int n, int c, int h, int w,
                          const void *src, float *host)
{
    return cpu->act_export(dev->cpu, n, c, h, w, src, host);
}

static int sim_plan_create(struct mesh_nn_dev *dev,
                           const struct mesh_nn_plan_desc *d,
                           struct mesh_nn_plan **out)
{
    return cpu->plan_create(dev->cpu, d, out);
}

static void sim_plan_destroy(struct mesh_nn_dev *dev, struct mesh_nn_plan *p)
{
    cpu->plan_destroy(dev->cpu, p);
}

static size_t sim_plan_workspace(const struct mesh_nn_plan *p)
{
    return cpu->plan_workspace(p);
}

static size_t sim_plan_reserve(const struct mesh_nn_plan *p)
{
    return cpu->plan_reserve(p);
}

static int sim_conv_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *x, const float *w, void *y, void *ws)
{
    return cpu->conv_fwd(dev->cpu, p, x, w, y, ws);
}

static int sim_conv_bwd_data(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                             const void *dy, const float *w, void *dx, void *ws)
{
    return cpu->conv_bwd_data(dev->cpu, p, dy, w, dx, ws);
}

static int sim_conv_bwd_filter(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                               const void *x, const void *dy, float *dw,
                               void *ws)
{
    return cpu->conv_bwd_filter(dev->cpu, p, x, dy, dw, ws);
}

static int sim_bn_fwd_train(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *x, void *y, const float *gamma,
                            const float *beta, float *rmean, float *rvar,
                            float momentum, float *save, void *reserve,
                            void *ws)
{
    return cpu->bn_fwd_train(dev->cpu, p, x, y, gamma, beta, rmean, rvar,
                             momentum, save, reserve, ws);
}

static int sim_bn_fwd_infer(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                            const void *x, void *y, const float *gamma,
                            const float *beta, const float *rmean,
                            const float *rvar, void *ws)
{
    return cpu->bn_fwd_infer(dev->cpu, p, x, y, gamma, beta, rmean, rvar, ws);
}

static int sim_bn_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                      const void *x, const void *dy, const float *gamma,
                      const float *beta, const float *save, const void *reserve,
                      void *dx, float *dgamma, float *dbeta, void *ws)
{
    return cpu->bn_bwd(dev->cpu, p, x, dy, gamma, beta, save, reserve, dx,
                       dgamma, dbeta, ws);
}

static int sim_bn_bwd_frozen(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                             const void *y, const void *dy, const float *gamma,
                             const float *rvar, void *dx)
{
    return cpu->bn_bwd_frozen(dev->cpu, p, y, dy, gamma, rvar, dx);
}

static int sim_relu_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *x, void *y)
{
    return cpu->relu_fwd(dev->cpu, p, x, y);
}

static int sim_relu_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                        const void *y, const void *dy, void *dx)
{
    return cpu->relu_bwd(dev->cpu, p, y, dy, dx);
}

static int sim_add(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                   const void *a, const void *b, void *y)
{
    return cpu->add(dev->cpu, p, a, b, y);
}

static int sim_maxpool_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *x, void *y, void *reserve, void *ws)
{
    return cpu->maxpool_fwd(dev->cpu, p, x, y, reserve, ws);
}

static int sim_maxpool_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *dy, const void *reserve, void *dx,
                           void *ws)
{
    return cpu->maxpool_bwd(dev->cpu, p, dy, reserve, dx, ws);
}

static int sim_avgpool_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *x, void *y, void *ws)
{
    return cpu->avgpool_fwd(dev->cpu, p, x, y, ws);
}

static int sim_avgpool_bwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *dy, void *dx, void *ws)
{
    return cpu->avgpool_bwd(dev->cpu, p, dy, dx, ws);
}

static int sim_fc_fwd(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                      const void *x, const float *w, const float *b, void *y,
                      void *ws)
{
    return cpu->fc_fwd(dev->cpu, p, x, w, b, y, ws);
}

static int sim_fc_bwd_data(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                           const void *dy, const float *w, void *dx, void *ws)
{
    return cpu->fc_bwd_data(dev->cpu, p, dy, w, dx, ws);
}

static int sim_fc_bwd_weights(struct mesh_nn_dev *dev, struct mesh_nn_plan *p,
                              const void *x, const void *dy, float *dw,
                              float *db, void *ws)
{
    return cpu->fc_bwd_weights(dev->cpu, p, x, dy, dw, db, ws);
}

static int sim_xent(struct mesh_nn_dev *dev, int n, int k, const float *logits,
                    const int32_t *labels, float smoothing, float *loss,
                    float *dlogits)
{
    return cpu->xent(dev->cpu, n, k, logits, labels, smoothing, loss, dlogits);
}

static int sim_sgd(struct mesh_nn_dev *dev, size_t n, float *p, const float *g,
                   float *buf, const struct mesh_nn_sgd_args *a)
{
    return cpu->sgd(dev->cpu, n, p, g, buf, a);
}

static int sim_axpy1(struct mesh_nn_dev *dev, size_t n, const float *x,
                     float *y)
{
    return cpu->axpy1(dev->cpu, n, x, y);
}

const struct mesh_nn_backend_ops mesh_nn_devsim_ops = {
    .name = "devsim",
    MESH_NN_BACKEND_CORE(sim),
    .upload = sim_upload,
    .download = sim_download,
    MESH_NN_BACKEND_STREAMS(sim),
    .bn_bwd_frozen = sim_bn_bwd_frozen,
};
