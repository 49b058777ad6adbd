/*
 * data/loader.c: the prefetching loader: a pool of threads filling a ring
 * of batches, sharding, seek and the state record.
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the loader --------------------------------------------------------- */

/* One batch of the ring. */
struct slot {
    float *x;     /* (batch, co, size, size) */
    int32_t *y;   /* (batch) */
    uint64_t seq; /* batch sequence number it holds */
    int n;        /* samples in it */
    int done;     /* samples finished */
    int err;      /* first error of a sample, 0 if none */
    char msg[1024];
    uint64_t epoch, step;
};

struct mesh_loader {
    struct mesh_dataset *ds;
    int split, batch, rank, world, augment, nthreads, depth;
    uint64_t spe; /* steps per epoch */
    size_t sample_floats;
    /*
     * The training layout (mesh_data_layout): each optimizer step covers
     * nslots micro-batches of consecutive permutation positions, of which
     * this peer takes slots rank, rank + world, ... (kr of them). The
     * positions start at seg_pos of epoch seg_epoch (seg_spe loader steps
     * left in it); later epochs start at 0 (spe loader steps each).
     */
    int nslots, kr;
    uint64_t seg_epoch, seg_pos, seg_spe;

    pthread_mutex_t mu;
    pthread_cond_t cv_work;  /* workers: a slot or a stop */
    pthread_cond_t cv_ready; /* consumer: a batch complete */
    pthread_t *threads;
    int running; /* threads started */
    int stop;

    struct slot *slots;
    uint64_t base;        /* absolute batch index (epoch * spe + step) of
                             sequence 0 */
    uint64_t assign_seq;  /* next task: batch sequence ... */
    int assign_i;         /* ... and sample within it */
    uint64_t consume_seq; /* next batch mesh_data_next returns */
    int held;             /* the consumer holds consume_seq - 1 */
    int failed;
    uint32_t *perm; /* permutation of perm_epoch, (train count) */
    uint64_t perm_epoch;
    int perm_valid;
};

struct task {
    struct slot *slot;
    int i;
    size_t idx;
    uint64_t epoch;
};

/* Default augmentation per data set (training split only). */
static int default_augment(const struct mesh_dataset *ds)
{
    return ds->kind == K_FOLDER || ds->kind == K_CIFAR;
}

static uint64_t eval_count_for(const struct mesh_loader *ld)
{
    size_t n = ld->ds->sp[MESH_DATA_EVAL].count;

    return n > (size_t)ld->rank
               ? (n - (size_t)ld->rank + (size_t)ld->world - 1) /
                     (size_t)ld->world
               : 0;
}

/*
 * The training batch abs loader steps after the layout's start: its
 * epoch, its step within the epoch (from the epoch's first step of this
 * layout) and the position its epoch's steps count from. With the default
 * layout (slots = world x accumulate, from position 0) micro-batch u of
 * an epoch covers positions u world batch + rank batch, as before.
 */
static void train_position(const struct mesh_loader *ld, uint64_t abs,
                           uint64_t *epoch, uint64_t *step, uint64_t *p0)
{
    if (abs < ld->seg_spe) {
        *epoch = ld->seg_epoch;
        *step = abs;
        *p0 = ld->seg_pos;
    } else {
        abs -= ld->seg_spe;
        *epoch = ld->seg_epoch + 1 + abs / ld->spe;
        *step = abs % ld->spe;
        *p0 = 0;
    }
}

/* Under mu: can a task be handed out now? */
static int can_assign(const struct mesh_loader *ld)
{
    uint64_t released = ld->consume_seq - (uint64_t)ld->held;

    if (ld->stop || ld->failed)
        return 0;
    if (ld->assign_seq >= released + (uint64_t)ld->depth)
        return 0;
    if (ld->split == MESH_DATA_EVAL && ld->assign_seq >= ld->spe)
        return 0;
    return 1;
}

/* Under mu: take the next task; sets up its slot on the batch's first. */
static void assign(struct mesh_loader *ld, struct task *t)
{
    uint64_t seq = ld->assign_seq;
    struct slot *s = &ld->slots[seq % (uint64_t)ld->depth];
    uint64_t abs = ld->base + seq, epoch, step;

    uint64_t p0 = 0;

    if (ld->split == MESH_DATA_TRAIN) {
        train_position(ld, abs, &epoch, &step, &p0);
    } else {
        epoch = 0;
        step = abs;
    }
    if (ld->assign_i == 0) {
        s->seq = seq;
        s->done = 0;
        s->err = 0;
        s->epoch = epoch;
        s->step = step;
        if (ld->split == MESH_DATA_TRAIN) {
            s->n = ld->batch;
        } else {
            uint64_t left = eval_count_for(ld) - step * (uint64_t)ld->batch;

            s->n = (int)MESH_MIN(left, (uint64_t)ld->batch);
        }
    }
    t->slot = s;
    t->i = ld->assign_i;
    t->epoch = epoch;
    if (ld->split == MESH_DATA_TRAIN) {
        uint64_t b = (uint64_t)ld->batch, kr = (uint64_t)ld->kr;
        uint64_t pos =
            p0 + step / kr * (uint64_t)ld->nslots * b +
            ((uint64_t)ld->rank + step % kr * (uint64_t)ld->world) * b +
            (uint64_t)t->i;

        if (!ld->perm_valid || ld->perm_epoch != epoch) {
            mesh_data_permutation(ld->ds, epoch, ld->perm);
            ld->perm_epoch = epoch;
            ld->perm_valid = 1;
        }
        t->idx = ld->perm[pos];
    } else {
        t->idx = (size_t)((step * (uint64_t)ld->batch + (uint64_t)t->i) *
                              (uint64_t)ld->world +
                          (uint64_t)ld->rank);
    }
    if (++ld->assign_i == s->n) {
        ld->assign_i = 0;
        ld->assign_seq++;
    }
}

static void *worker(void *arg)
{
    struct mesh_loader *ld = arg;
    struct scratch scr = {0};
    struct task t;

    pthread_mutex_lock(&ld->mu);
    for (;;) {
        int rc;

        while (!ld->stop && !can_assign(ld))
            pthread_cond_wait(&ld->cv_work, &ld->mu);
        if (ld->stop)
            break;
        assign(ld, &t);
        pthread_mutex_unlock(&ld->mu);

        rc = data_make_sample(ld->ds, ld->split, t.idx, t.epoch, ld->augment,
                              &scr, t.slot->x + (size_t)t.i * ld->sample_floats,
                              &t.slot->y[t.i]);

        pthread_mutex_lock(&ld->mu);
        if (rc < 0 && !t.slot->err) {
            t.slot->err = rc;
            snprintf(t.slot->msg, sizeof(t.slot->msg), "%s", mesh_err_msg(rc));
        }
        if (++t.slot->done == t.slot->n)
            pthread_cond_broadcast(&ld->cv_ready);
    }
    pthread_mutex_unlock(&ld->mu);
    data_scratch_free(&scr);
    return NULL;
}

static int start_threads(struct mesh_loader *ld)
{
    int rc;

    ld->stop = 0;
    for (ld->running = 0; ld->running < ld->nthreads; ld->running++) {
        rc = pthread_create(&ld->threads[ld->running], NULL, worker, ld);
        if (rc != 0)
            return mesh_err(-rc, "data loader: pthread_create: %s",
                            strerror(rc));
    }
    return 0;
}

static void stop_threads(struct mesh_loader *ld)
{
    pthread_mutex_lock(&ld->mu);
    ld->stop = 1;
    pthread_cond_broadcast(&ld->cv_work);
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->running; i++)
        pthread_join(ld->threads[i], NULL);
    ld->running = 0;
}

static void reset_position(struct mesh_loader *ld, uint64_t base)
{
    ld->base = base;
    ld->assign_seq = 0;
    ld->assign_i = 0;
    ld->consume_seq = 0;
    ld->held = 0;
    ld->failed = 0;
    for (int i = 0; i < ld->depth; i++)
        ld->slots[i].seq = UINT64_MAX;
}

/* The loader's memory (its threads stopped, or never started). */
static void loader_free(struct mesh_loader *ld)
{
    if (ld->slots)
        for (int i = 0; i < ld->depth; i++) {
            free(ld->slots[i].x);
            free(ld->slots[i].y);
        }
    free(ld->slots);
    free(ld->threads);
    free(ld->perm);
    free(ld);
}

int mesh_loader_create(struct mesh_dataset *ds,
                       const struct mesh_loader_opts *o,
                       struct mesh_loader **out)
{
    struct mesh_loader *ld;
    size_t n = ds->sp[o->split == MESH_DATA_EVAL].count;
    int rc;

    if (o->split != MESH_DATA_TRAIN && o->split != MESH_DATA_EVAL)
        return mesh_err(-EINVAL, "data loader: bad split %d", (int)o->split);
    if (o->batch < 1 || o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return mesh_err(-EINVAL,
                        "data loader: bad batch %d / rank %d / world %d",
                        o->batch, o->rank, o->world);
    if (o->threads < 0 || o->threads > 256 || o->depth < 0 || o->depth > 1024)
        return mesh_err(-EINVAL, "data loader: bad threads %d / depth %d",
                        o->threads, o->depth);
    if (o->accumulate < 0 || o->accumulate > 65536)
        return mesh_err(-EINVAL, "data loader: bad accumulate %d",
                        o->accumulate);
    if (o->split == MESH_DATA_TRAIN &&
        n / ((size_t)o->world * (size_t)o->batch) <
            (size_t)MESH_MAX(o->accumulate, 1))
        return mesh_err(-EINVAL,
                        "data: the %zu training samples of %s make no step "
                        "of %d peers x batch %d x %d micro-batches",
                        n, ds->name, o->world, o->batch,
                        MESH_MAX(o->accumulate, 1));
    ld = calloc(1, sizeof(*ld));
    if (!ld)
        return mesh_err(-ENOMEM, "out of memory");
    ld->ds = ds;
    ld->split = o->split;
    ld->batch = o->batch;
    ld->rank = o->rank;
    ld->world = o->world;
    ld->nthreads = o->threads ? o->threads : 2;
    /* Enough batches in flight for two samples per thread, plus the one
     * the consumer holds; at least two ready ahead of it. */
    ld->depth =
        o->depth
            ? o->depth
            : MESH_MAX(3, (2 * ld->nthreads + o->batch - 1) / o->batch + 1);
    ld->augment = o->split == MESH_DATA_EVAL ? 0
                  : o->augment < 0           ? default_augment(ds)
                                             : !!o->augment;
    ld->sample_floats = (size_t)ds->co * ds->size * ds->size;
    if (o->split == MESH_DATA_TRAIN) {
        uint64_t k = (uint64_t)MESH_MAX(o->accumulate, 1);

        ld->spe = n / ((size_t)o->batch * (size_t)o->world) / k * k;
        ld->nslots = o->world * (int)k;
        ld->kr = (int)k;
        ld->seg_spe = ld->spe;
    } else {
        uint64_t mine = eval_count_for(ld);

        ld->spe = (mine + (uint64_t)o->batch - 1) / (uint64_t)o->batch;
    }
    rc = -ENOMEM;
    ld->threads = calloc((size_t)ld->nthreads, sizeof(pthread_t));
    ld->slots = calloc((size_t)ld->depth, sizeof(struct slot));
    if (o->split == MESH_DATA_TRAIN)
        ld->perm = malloc(sizeof(uint32_t) * n);
    if (!ld->threads || !ld->slots ||
        (o->split == MESH_DATA_TRAIN && !ld->perm)) {
        mesh_err(rc, "data loader: out of memory");
        goto fail;
    }
    for (int i = 0; i < ld->depth; i++) {
        ld->slots[i].x =
            malloc(sizeof(float) * ld->sample_floats * (size_t)ld->batch);
        ld->slots[i].y = malloc(sizeof(int32_t) * (size_t)ld->batch);
        if (!ld->slots[i].x || !ld->slots[i].y) {
            mesh_err(rc,
                     "data loader: cannot allocate %d batches of %zu "
                     "bytes",
                     ld->depth,
                     sizeof(float) * ld->sample_floats * (size_t)ld->batch);
            goto fail;
        }
    }
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv_work, NULL);
    pthread_cond_init(&ld->cv_ready, NULL);
    reset_position(ld, 0);
    rc = start_threads(ld);
    if (rc < 0) {
        mesh_loader_destroy(ld);
        return rc;
    }
    *out = ld;
    return 0;
fail:
    loader_free(ld);
    return rc;
}

void mesh_loader_destroy(struct mesh_loader *ld)
{
    if (!ld)
        return;
    stop_threads(ld);
    pthread_cond_destroy(&ld->cv_ready);
    pthread_cond_destroy(&ld->cv_work);
    pthread_mutex_destroy(&ld->mu);
    loader_free(ld);
}

uint64_t mesh_loader_steps_per_epoch(const struct mesh_loader *ld)
{
    return ld->spe;
}

int mesh_data_next(struct mesh_loader *ld, struct mesh_batch *batch)
{
    struct slot *s;
    uint64_t t0;
    int rc;

    pthread_mutex_lock(&ld->mu);
    if (ld->held) {
        ld->held = 0;
        pthread_cond_broadcast(&ld->cv_work);
    }
    if (ld->split == MESH_DATA_EVAL && ld->consume_seq >= ld->spe) {
        pthread_mutex_unlock(&ld->mu);
        return 1;
    }
    s = &ld->slots[ld->consume_seq % (uint64_t)ld->depth];
    t0 = mesh_now_ns();
    while (!(s->seq == ld->consume_seq && s->done == s->n))
        pthread_cond_wait(&ld->cv_ready, &ld->mu);
    if (s->err) {
        /* The message was recorded on a worker thread: raise it here. */
        ld->failed = 1;
        rc = mesh_err(s->err, "%s", s->msg);
        pthread_mutex_unlock(&ld->mu);
        return rc;
    }
    batch->x = s->x;
    batch->y = s->y;
    batch->n = s->n;
    batch->channels = ld->ds->co;
    batch->size = ld->ds->size;
    batch->epoch = s->epoch;
    batch->step = s->step;
    batch->wait_s = (double)(mesh_now_ns() - t0) * 1e-9;
    ld->consume_seq++;
    ld->held = 1;
    pthread_mutex_unlock(&ld->mu);
    return 0;
}

void mesh_data_tell(const struct mesh_loader *ld, uint64_t *epoch,
                    uint64_t *step)
{
    uint64_t abs = ld->base + ld->consume_seq, p0;

    if (ld->split == MESH_DATA_TRAIN) {
        train_position(ld, abs, epoch, step, &p0);
    } else {
        *epoch = 0;
        *step = abs;
    }
}

int mesh_data_seek(struct mesh_loader *ld, uint64_t epoch, uint64_t step)
{
    if (ld->split == MESH_DATA_EVAL
            ? epoch != 0 || step > ld->spe
            : step >= ld->spe || epoch > UINT64_MAX / ld->spe - 1)
        return mesh_err(-EINVAL,
                        "data: cannot seek to epoch %" PRIu64 " step %" PRIu64
                        " (%" PRIu64 " steps per epoch)",
                        epoch, step, ld->spe);
    stop_threads(ld);
    if (ld->split == MESH_DATA_TRAIN) {
        ld->seg_epoch = 0;
        ld->seg_pos = 0;
        ld->seg_spe = ld->spe;
    }
    reset_position(ld, epoch * ld->spe + step);
    return start_threads(ld);
}

int mesh_data_layout(struct mesh_loader *ld, uint64_t epoch, uint64_t pos,
                     int slots, int rank, int world)
{
    uint64_t n = ld->ds->sp[MESH_DATA_TRAIN].count, g, kr;

    if (ld->split != MESH_DATA_TRAIN || slots < 1 || world < 1 || rank < 0 ||
        rank >= world || world > slots)
        return mesh_err(-EINVAL, "data: bad layout: %d slots, rank %d of %d",
                        slots, rank, world);
    g = (uint64_t)slots * (uint64_t)ld->batch;
    if (n / g == 0 || pos > n)
        return mesh_err(-EINVAL,
                        "data: the %" PRIu64 " training samples make no "
                        "step of %d micro-batches of %d (position %" PRIu64 ")",
                        n, slots, ld->batch, pos);
    kr = ((uint64_t)slots - (uint64_t)rank + (uint64_t)world - 1) /
         (uint64_t)world;
    stop_threads(ld);
    ld->nslots = slots;
    ld->rank = rank;
    ld->world = world;
    ld->kr = (int)kr;
    ld->spe = n / g * kr;
    ld->seg_epoch = epoch;
    ld->seg_pos = pos;
    ld->seg_spe = (n - pos) / g * kr;
    reset_position(ld, 0);
    return start_threads(ld);
}

int mesh_loader_micro_per_step(const struct mesh_loader *ld)
{
    return ld->kr;
}

/* ---- state record ------------------------------------------------------- */

#define STATE_MAGIC   0x6174616468736d6dull /* "mmshdata" little-endian */
#define STATE_VERSION 1

/* Layout: magic, version, seed, epoch, step, batch, world, rank | count
 * (rank in the low 32 bits of the last word, count of samples above). */
void mesh_data_get_state(const struct mesh_loader *ld,
                         uint8_t state[MESH_DATA_STATE_BYTES])
{
    uint64_t epoch, step;

    mesh_data_tell(ld, &epoch, &step);
    memset(state, 0, MESH_DATA_STATE_BYTES);
    mesh_put_le64(state + 0, STATE_MAGIC);
    mesh_put_le64(state + 8, STATE_VERSION);
    mesh_put_le64(state + 16, ld->ds->seed);
    mesh_put_le64(state + 24, epoch);
    mesh_put_le64(state + 32, step);
    mesh_put_le64(state + 40, (uint64_t)ld->batch);
    mesh_put_le64(state + 48, (uint64_t)ld->world);
    mesh_put_le64(state + 56, (uint64_t)(uint32_t)ld->rank |
                                  (uint64_t)ld->ds->sp[ld->split].count << 32);
}

int mesh_data_set_state(struct mesh_loader *ld, const uint8_t *st, size_t len)
{
    uint64_t count = ld->ds->sp[ld->split].count;

    if (len != MESH_DATA_STATE_BYTES)
        return mesh_err(-EINVAL, "data state: %zu bytes, expected %d", len,
                        MESH_DATA_STATE_BYTES);
    if (mesh_get_le64(st) != STATE_MAGIC ||
        mesh_get_le64(st + 8) != STATE_VERSION)
        return mesh_err(-EINVAL, "data state: bad magic or version");
    if (mesh_get_le64(st + 16) != ld->ds->seed)
        return mesh_err(-EINVAL,
                        "data state: seed %" PRIu64 " differs from this "
                        "run's %" PRIu64,
                        mesh_get_le64(st + 16), ld->ds->seed);
    if (mesh_get_le64(st + 40) != (uint64_t)ld->batch)
        return mesh_err(-EINVAL,
                        "data state: batch %" PRIu64 " differs from this "
                        "run's %d",
                        mesh_get_le64(st + 40), ld->batch);
    if (mesh_get_le64(st + 48) != (uint64_t)ld->world)
        return mesh_err(-EINVAL,
                        "data state: world %" PRIu64 " differs from this "
                        "run's %d",
                        mesh_get_le64(st + 48), ld->world);
    if (mesh_get_le64(st + 56) >> 32 != count)
        return mesh_err(-EINVAL,
                        "data state: %" PRIu64 " samples differ from this "
                        "data set's %" PRIu64,
                        mesh_get_le64(st + 56) >> 32, count);
    return mesh_data_seek(ld, mesh_get_le64(st + 24), mesh_get_le64(st + 32));
}
