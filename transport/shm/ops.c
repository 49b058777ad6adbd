/*
 * transport/shm/ops.c: the transport object: listen, connect, the
 * requests (local ones here, other hosts' wrapped around the TCP mesh's),
 * wait_any's spin and sleep, abort, close, and the ops table.
 */
#include "config.h"

#include "transport/shm/shm-internal.h"
#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <linux/futex.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- failure ------------------------------------------------------------- */

/* The job failed (recorded, waiters woken): with notify, the TCP mesh tells
 * the peers; the progress thread stops waiting for a spinner. */
static void shm_failed(struct tp_base *b, int culprit, int code, int notify,
                       const char *reason)
{
    struct mesh_transport *t = (struct mesh_transport *)b; /* super first */

    (void)code;
    /* Before any caller hears of it (and frees a buffer a peer may be
     * reading by address): readers check this after each read. */
    if (t->seg && t->me >= 0) {
        atomic_store(&shm_proc_at(t, t->me)->failed, 1);
        atomic_thread_fence(memory_order_seq_cst);
    }
    if (t->bg_cond_ready)
        pthread_cond_broadcast(&t->bg_cond);
    shm_wake_self(t); /* waiters asleep on our bell */
    if (notify && t->inner)
        t->inner_ops->abort(t->inner, culprit, reason);
}

static void shm_req_release(struct tp_base *b, struct tp_req *r, int failed)
{
    struct mesh_transport *t = (struct mesh_transport *)b;
    struct mesh_req *q = (struct mesh_req *)r; /* super first */
    struct shm_peer *pp = &t->pp[r->peer];

    if (failed && q->sync_k) {
        shm_q_remove(&t->yq_head, &t->yq_tail, q);
    } else if (failed) {
        shm_q_remove(&pp->sq_head, &pp->sq_tail, q);
        shm_q_remove(&pp->aq_head, &pp->aq_tail, q);
        shm_q_remove(&pp->rq_head, &pp->rq_tail, q);
    }
    tp_req_unlink(b, r);
    free(q);
}

static const struct tp_base_ops shm_base_ops = {
    .failed = shm_failed,
    .req_free = shm_req_release,
};

static void shm_close(mesh_transport_t *t);

/* ---- listen and connect -------------------------------------------------- */

static int shm_listen_on(const struct mesh_world *world,
                         const struct mesh_transport_opts *opts,
                         const struct mesh_transport_ops *inner,
                         mesh_transport_t **out)
{
    struct mesh_transport *t;
    const char *spin = getenv("MESHTRAIN_SHM_SPIN_US");
    int rc;

    t = calloc(1, sizeof(*t));
    if (!t)
        return mesh_err(-ENOMEM, "out of memory");
    t->inner_ops = inner;
    t->sock_fd = -1;
    t->me = -1;
    t->spin_ns = SHM_SPIN_DEFAULT_NS;
    if (spin && atof(spin) >= 0 && atof(spin) <= 1e6)
        t->spin_ns = (uint64_t)(atof(spin) * 1000.0);
    rc = tp_base_init(&t->super, "shm", &shm_base_ops, world, opts);
    if (rc < 0) {
        tp_base_fini(&t->super);
        free(t);
        return rc;
    }
    if (mesh_cond_init_monotonic(&t->bg_cond) == 0)
        t->bg_cond_ready = 1;
    t->pp = calloc((size_t)world->size, sizeof(*t->pp));
    if (!t->bg_cond_ready || !t->pp) {
        rc = mesh_err(-ENOMEM, "shm: out of memory");
        goto fail;
    }
    for (int p = 0; p < world->size; p++)
        t->pp[p].local = -1;
    rc = t->inner_ops->listen(world, opts, &t->inner);
    if (rc < 0)
        goto fail;
    rc = shm_sock_open(t);
    if (rc < 0)
        goto fail;
    *out = t;
    return 0;
fail:
    shm_close(t);
    return rc;
}

static int shm_listen(const struct mesh_world *world,
                      const struct mesh_transport_opts *opts,
                      mesh_transport_t **out)
{
    return shm_listen_on(world, opts, &mesh_tcp_ops, out);
}

/* auto: between hosts verbs where every rank has an active port, else
 * TCP (the verbs auto table decides at connect). */
static int auto_listen(const struct mesh_world *world,
                       const struct mesh_transport_opts *opts,
                       mesh_transport_t **out)
{
#ifdef HAVE_VERBS
    return shm_listen_on(world, opts, &mesh_verbs_auto_ops, out);
#else
    return shm_listen_on(world, opts, &mesh_tcp_ops, out);
#endif
}

static int shm_connect(mesh_transport_t *t)
{
    int rc = t->inner_ops->connect(t->inner);

    if (rc < 0)
        return rc;
    /* Authenticated from here on: find the host's ranks, share memory. */
    rc = shm_join(t);
    if (rc < 0)
        return rc;
    if (t->seg) {
        uint64_t now = mesh_now_ns();

        /* the rings' clocks start now (shm_stale_check) */
        for (int p = 0; p < t->super.world.size; p++)
            t->pp[p].in_moved_ns = now;
        if (pthread_create(&t->thread, NULL, shm_progress_main, t))
            return mesh_err(-EAGAIN, "shm: cannot start the progress thread");
        t->thread_started = 1;
    }
    t->connected = 1;
    return 0;
}

/* ---- requests ------------------------------------------------------------ */

/* Registered with the mesh underneath too: its peers of other hosts may
 * need it (verbs). */
static int shm_reg_mr(mesh_transport_t *t, void *buf, size_t len,
                      mesh_mr_t **out)
{
    struct mesh_mr *m = calloc(1, sizeof(*m));
    int rc;

    if (!m)
        return mesh_err(-ENOMEM, "out of memory");
    m->base = buf;
    m->len = len;
    rc = t->inner_ops->reg_mr(t->inner, buf, len, &m->inner);
    if (rc < 0) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

static int shm_dereg_mr(mesh_transport_t *t, mesh_mr_t *mr)
{
    int rc = 0;

    if (mr && mr->inner)
        rc = t->inner_ops->dereg_mr(t->inner, mr->inner);
    free(mr);
    return rc;
}

static int post(mesh_transport_t *t, int peer, const struct mesh_frame *f,
                void *buf, mesh_mr_t *mr, enum tp_req_kind kind,
                mesh_req_t **out)
{
    const char *what = kind == TP_SEND ? "isend" : "irecv";
    struct mesh_req *r;
    struct shm_peer *pp;
    int rc = tp_check_buf(&t->super, what, f, buf);

    if (rc < 0)
        return rc;
    r = calloc(1, sizeof(*r));
    if (!r)
        return mesh_err(-ENOMEM, "out of memory");
    r->super.kind = kind;
    r->super.peer = peer;
    r->super.f = *f;
    r->buf = buf;
    pthread_mutex_lock(&t->super.lock);
    rc = tp_check_peer(&t->super, peer, what);
    if (rc < 0)
        goto fail;
    pp = &t->pp[peer];
    if (pp->local < 0) {
        /* another host: the mesh underneath's request, wrapped */
        mesh_mr_t *im = mr ? mr->inner : NULL;

        pthread_mutex_unlock(&t->super.lock);
        rc = kind == TP_SEND
                 ? t->inner_ops->isend(t->inner, peer, f, buf, im, &r->inner)
                 : t->inner_ops->irecv(t->inner, peer, f, buf, im, &r->inner);
        if (rc < 0) {
            free(r);
            return rc;
        }
        *out = r;
        return 0;
    }
    shm_check_gone(t, peer);
    /*
     * After its goodbye a peer reads nothing more, so a send to it fails
     * the job; but a receive may still find its frames in the ring (it
     * sent them before it closed, as over TCP), so it fails only where
     * the ring is empty.
     */
    if (!t->super.fail.failed && atomic_load(&shm_proc_at(t, pp->local)->bye)) {
        struct shm_ring *in = shm_ring_at(t, pp->local, t->me);

        if (kind == TP_SEND || atomic_load(&in->head) == atomic_load(&in->tail))
            tp_fail_left(&t->super, peer);
    }
    if (t->super.fail.failed) {
        rc = tp_fail_err(&t->super);
        goto fail;
    }
    tp_req_link(&t->super, &r->super);
    if (kind == TP_SEND) {
        r->cma = pp->cma && f->length >= SHM_CMA_MIN;
        shm_q_push(&pp->sq_head, &pp->sq_tail, r);
    } else {
        shm_q_push(&pp->rq_head, &pp->rq_tail, r);
    }
    shm_poll(t);
    pthread_mutex_unlock(&t->super.lock);
    *out = r;
    return 0;
fail:
    pthread_mutex_unlock(&t->super.lock);
    free(r);
    return rc;
}

static int shm_isend(mesh_transport_t *t, int peer, const struct mesh_frame *f,
                     const void *buf, mesh_mr_t *mr, mesh_req_t **out)
{
    return post(t, peer, f, (void *)buf, mr, TP_SEND, out);
}

static int shm_irecv(mesh_transport_t *t, int peer,
                     const struct mesh_frame *expect, void *buf, mesh_mr_t *mr,
                     mesh_req_t **out)
{
    return post(t, peer, expect, buf, mr, TP_RECV, out);
}

/* A failure of the TCP mesh seen by one of its requests: the job's too. */
static void adopt_locked(mesh_transport_t *t)
{
    pthread_mutex_lock(&t->super.lock);
    shm_adopt_inner(t);
    pthread_mutex_unlock(&t->super.lock);
}

static int shm_test(mesh_transport_t *t, mesh_req_t *req, int *done)
{
    int rc;

    if (!req)
        return mesh_err(-EINVAL, "shm test: NULL request");
    if (req->inner) {
        rc = t->inner_ops->test(t->inner, req->inner, done);
        if (rc < 0)
            adopt_locked(t);
        if (rc < 0 || *done)
            free(req);
        return rc;
    }
    if (!atomic_load_explicit(&req->super.done, memory_order_acquire)) {
        pthread_mutex_lock(&t->super.lock);
        shm_poll(t);
        pthread_mutex_unlock(&t->super.lock);
    }
    return tp_test(&t->super, req, done);
}

static int req_done(mesh_req_t *r)
{
    struct tp_req *s = r->inner ? (struct tp_req *)r->inner : &r->super;

    return atomic_load_explicit(&s->done, memory_order_acquire);
}

static int any_done(mesh_req_t *const *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (reqs[i] && req_done(reqs[i]))
            return 1;
    return 0;
}

/* Requests of other hosts only: the TCP mesh waits itself. */
static int wait_inner(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                      double timeout_s)
{
    mesh_req_t *in[64] = {0},
               **v = n <= 64 ? in : calloc((size_t)n, sizeof(*v));
    int rc;

    if (!v)
        return mesh_err(-ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        v[i] = reqs[i] ? reqs[i]->inner : NULL;
    rc = t->inner_ops->wait_any(t->inner, v, n, timeout_s);
    if (v != in)
        free(v);
    if (rc < 0 && rc != -ETIMEDOUT)
        adopt_locked(t);
    return rc;
}

/* How long a wait that includes another host's request sleeps at once. */
#define SHM_MIXED_NAP_NS 100000ull

static int shm_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                        double timeout_s)
{
    uint64_t now = mesh_now_ns(), spin_end = now + t->spin_ns;
    uint64_t deadline =
        timeout_s < 0 ? MESH_NO_DEADLINE : now + (uint64_t)(timeout_s * 1e9);
    int local = 0, remote = 0, rc = 0, bell;

    for (int i = 0; i < n; i++) {
        if (!reqs[i])
            continue;
        if (reqs[i]->inner)
            remote++;
        else
            local++;
    }
    if (remote && !local)
        return wait_inner(t, reqs, n, timeout_s);
    pthread_mutex_lock(&t->super.lock);
    /* Spin: poll the rings ourselves, yielding the CPU each round. */
    t->spinners++;
    for (;;) {
        if (t->super.fail.failed) {
            rc = tp_fail_err(&t->super);
            break;
        }
        shm_poll(t);
        if (any_done(reqs, n))
            break;
        now = mesh_now_ns();
        if (now >= spin_end || now >= deadline) {
            rc = 1;
            break;
        }
        pthread_mutex_unlock(&t->super.lock);
        sched_yield();
        pthread_mutex_lock(&t->super.lock);
    }
    /*
     * Sleep. Only this host's requests: on our bell, still counted among
     * the spinners, so that a peer's bell wakes this thread itself, which
     * polls (one wake-up, not the progress thread's and then ours); at
     * most a tick at once, though a failure rings the bell too
     * (shm_failed). With another host's request among them: the progress
     * thread moves the bytes and wakes us, in naps for the TCP mesh's.
     */
    bell = !remote && t->seg && t->me >= 0;
    if (!bell) {
        t->spinners--;
        pthread_cond_signal(&t->bg_cond);
    }
    while (rc == 1) {
        uint64_t until = deadline;

        if (any_done(reqs, n)) {
            rc = 0;
        } else if (t->super.fail.failed) {
            rc = tp_fail_err(&t->super);
        } else if (bell) {
            now = mesh_now_ns();
            if (now >= deadline)
                rc = mesh_err(-ETIMEDOUT,
                              "shm wait: no request completed within %.3f s",
                              timeout_s);
            else
                shm_bell_sleep(
                    t, MESH_MIN(deadline, now + SHM_TICK_MS * 1000000ull), 1);
        } else {
            if (remote)
                until = MESH_MIN(deadline, mesh_now_ns() + SHM_MIXED_NAP_NS);
            if (mesh_cond_sleep(&t->super.cond, &t->super.lock, until) < 0 &&
                until == deadline)
                rc = mesh_err(-ETIMEDOUT,
                              "shm wait: no request completed within %.3f s",
                              timeout_s);
        }
    }
    /*
     * Not woken for it: the progress thread takes its bell again at its
     * next tick. Waking it here (and the peers' bells waking it again)
     * would cost each wait two wake-ups of a thread no waiter needs; until
     * then a peer's frames wait in the ring for our next call.
     */
    if (bell)
        t->spinners--;
    pthread_mutex_unlock(&t->super.lock);
    return rc;
}

static int shm_progress(mesh_transport_t *t)
{
    int rc;

    pthread_mutex_lock(&t->super.lock);
    shm_poll(t);
    pthread_mutex_unlock(&t->super.lock);
    rc = tp_progress(&t->super);
    if (rc == 0 && t->inner_ops->progress(t->inner) < 0) {
        adopt_locked(t);
        rc = tp_progress(&t->super);
    }
    return rc;
}

/* The TCP mesh carries every failure's notice, the culprit with it. */
static int shm_culprit(mesh_transport_t *t)
{
    return t && t->inner ? t->inner_ops->culprit(t->inner) : -1;
}

static void shm_abort(mesh_transport_t *t, int culprit, const char *why)
{
    if (!t)
        return;
    t->inner_ops->abort(t->inner, culprit, why);
    if (t->inner_ops->progress(t->inner) < 0)
        adopt_locked(t);
}

/* The rings' frames are checked here, the TCP mesh's there. */
static void shm_seq_done(mesh_transport_t *t, uint64_t base, uint64_t low)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->super.lock);
    tp_seq_done(&t->super, base, low);
    pthread_mutex_unlock(&t->super.lock);
    if (t->inner && t->inner_ops->seq_done)
        t->inner_ops->seq_done(t->inner, base, low);
}

static void shm_expect(mesh_transport_t *t, const struct mesh_frame *f,
                       const struct mesh_expect *recv, size_t n)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->super.lock);
    tp_expect(&t->super, f, recv, n);
    pthread_mutex_unlock(&t->super.lock);
    if (t->inner && t->inner_ops->expect)
        t->inner_ops->expect(t->inner, f, recv, n);
}

mesh_transport_t *mesh_shm_inner(mesh_transport_t *t)
{
    return t ? t->inner : NULL;
}

int mesh_shm_local(mesh_transport_t *t, int peer)
{
    if (!t || peer < 0 || peer >= t->super.world.size)
        return -1;
    return t->pp[peer].local >= 0;
}

int mesh_shm_one_copy(mesh_transport_t *t, int peer)
{
    if (!t || peer < 0 || peer >= t->super.world.size)
        return -1;
    return t->pp[peer].local >= 0 && t->pp[peer].cma;
}

static int shm_host_of(mesh_transport_t *t, int rank)
{
    if (!t || !t->host || rank < 0 || rank >= t->super.world.size)
        return rank;
    return t->host[rank];
}

static double shm_ranks_per_cpu(mesh_transport_t *t)
{
    return t && t->ranks_per_cpu > 1 ? t->ranks_per_cpu : 1.0;
}

/* shm_local_of: RANK's index among this host's ranks in the segment, or
 * -ENOTSUP when there is no segment here or RANK is not on this host. */
static int shm_local_of(mesh_transport_t *t, int rank)
{
    int li;

    if (!t || !t->seg || t->me < 0 || rank < 0 || rank >= t->super.world.size)
        return -ENOTSUP;
    li = rank == t->super.world.rank ? t->me : t->pp[rank].local;
    return li < 0 ? -ENOTSUP : li;
}

static int shm_host_window(mesh_transport_t *t, int rank, void **base,
                           size_t *len, uint64_t *syncs)
{
    int li;

    li = shm_local_of(t, rank);
    if (li < 0)
        return li;
    *base = shm_win_at(t, li);
    *len = SHM_WIN_BYTES;
    pthread_mutex_lock(&t->super.lock);
    *syncs = t->syncs;
    pthread_mutex_unlock(&t->super.lock);
    return 0;
}

static int shm_host_sync(mesh_transport_t *t, const struct mesh_frame *f,
                         mesh_req_t **out)
{
    struct mesh_req *r;
    int rc;

    if (!t || !f || !out)
        return mesh_err(-EINVAL, "shm host sync: NULL argument");
    if (!t->seg || t->me < 0)
        return mesh_err(-ENOTSUP, "shm host sync: no shared memory here");
    r = calloc(1, sizeof(*r));
    if (!r)
        return mesh_err(-ENOMEM, "out of memory");
    r->super.kind = TP_RECV;
    r->super.peer = t->super.world.rank;
    r->super.f = *f;
    r->super.f.offset = 0;
    r->super.f.length = 0;
    r->word[0] = f->offset;
    r->word[1] = f->length;
    pthread_mutex_lock(&t->super.lock);
    if (t->super.fail.failed) {
        rc = tp_fail_err(&t->super);
        pthread_mutex_unlock(&t->super.lock);
        free(r);
        return rc;
    }
    tp_req_link(&t->super, &r->super);
    shm_sync_post(t, r);
    shm_poll(t);
    pthread_mutex_unlock(&t->super.lock);
    *out = r;
    return 0;
}

static int shm_host_sync_word(mesh_transport_t *t, int rank, uint64_t k,
                              uint64_t word[2])
{
    struct shm_proc *pr;
    uint64_t got;
    int li;

    li = shm_local_of(t, rank);
    if (li < 0)
        return li;
    pr = shm_proc_at(t, li);
    got = atomic_load_explicit(&pr->syncs, memory_order_acquire);
    /* sync k's frame stays in sync[k % 2] until the rank posts k + 2 */
    if (k == 0 || got < k || got > k + 1)
        return -ESTALE;
    word[0] = pr->sync[k % 2].word[0];
    word[1] = pr->sync[k % 2].word[1];
    return 0;
}

/* ---- the shares (host_alloc) --------------------------------------------- */

static int ext_insert(struct shm_ext **a, int *n, size_t *cap, int at,
                      struct shm_ext e)
{
    if (mesh_array_reserve(a, cap, (size_t)*n + 1, sizeof(**a),
                           "shm share runs") < 0)
        return -ENOMEM;
    memmove(&(*a)[at + 1], &(*a)[at], (size_t)(*n - at) * sizeof(**a));
    (*a)[at] = e;
    (*n)++;
    return 0;
}

static void ext_remove(struct shm_ext *a, int *n, int at)
{
    memmove(&a[at], &a[at + 1], (size_t)(*n - at - 1) * sizeof(*a));
    (*n)--;
}

/* The free runs of our share, first use: all of it. (lock held) */
static int heap_init(struct mesh_transport *t)
{
    struct shm_ext all = {.off = 0, .len = t->heap_bytes};

    if (t->cap_heap_free || !t->heap_bytes)
        return 0;
    return ext_insert(&t->heap_free, &t->nheap_free, &t->cap_heap_free, 0, all);
}

static int shm_host_alloc(mesh_transport_t *t, size_t len, void **out)
{
    size_t pl = (MESH_MAX(len, 1) + SHM_PAGE - 1) / SHM_PAGE * SHM_PAGE;
    struct shm_ext e = {.len = pl};
    int rc = -ENOMEM, i, at;

    if (!t || !out || !t->seg || t->me < 0 || !t->heap_bytes ||
        len > t->heap_bytes)
        return -ENOMEM;
    pthread_mutex_lock(&t->super.lock);
    if (heap_init(t) < 0)
        goto out;
    for (i = 0; i < t->nheap_free && t->heap_free[i].len < pl; i++)
        ;
    if (i == t->nheap_free)
        goto out;
    e.off = t->heap_free[i].off;
    for (at = 0; at < t->nheap_used && t->heap_used[at].off < e.off; at++)
        ;
    if (ext_insert(&t->heap_used, &t->nheap_used, &t->cap_heap_used, at, e) < 0)
        goto out;
    t->heap_free[i].off += pl;
    t->heap_free[i].len -= pl;
    if (!t->heap_free[i].len)
        ext_remove(t->heap_free, &t->nheap_free, i);
    *out = shm_heap_at(t, t->me) + e.off;
    rc = 0;
out:
    pthread_mutex_unlock(&t->super.lock);
    if (rc == 0)
        (void)mlock(*out, pl); /* pinned where RLIMIT_MEMLOCK allows */
    return rc;
}

static void shm_host_free(mesh_transport_t *t, void *p)
{
    uint8_t *base;
    struct shm_ext e;
    int i, at;

    if (!t || !p || !t->seg || t->me < 0)
        return;
    base = shm_heap_at(t, t->me);
    pthread_mutex_lock(&t->super.lock);
    for (i = 0; i < t->nheap_used; i++)
        if (base + t->heap_used[i].off == (uint8_t *)p)
            break;
    if (i == t->nheap_used) {
        pthread_mutex_unlock(&t->super.lock);
        mesh_warn("shm: %p is not from this rank's share", p);
        return;
    }
    e = t->heap_used[i];
    ext_remove(t->heap_used, &t->nheap_used, i);
    /* the pages go back to the kernel: the next use starts from zeros */
    munlock(p, e.len);
    (void)madvise(p, e.len, MADV_REMOVE);
    for (at = 0; at < t->nheap_free && t->heap_free[at].off < e.off; at++)
        ;
    if (at < t->nheap_free && e.off + e.len == t->heap_free[at].off) {
        t->heap_free[at].off = e.off; /* joins the next run */
        t->heap_free[at].len += e.len;
    } else if (ext_insert(&t->heap_free, &t->nheap_free, &t->cap_heap_free, at,
                          e) < 0) {
        at = -1; /* out of memory: the run is lost to this process */
    }
    if (at > 0 && t->heap_free[at - 1].off + t->heap_free[at - 1].len ==
                      t->heap_free[at].off) {
        t->heap_free[at - 1].len += t->heap_free[at].len;
        ext_remove(t->heap_free, &t->nheap_free, at);
    }
    pthread_mutex_unlock(&t->super.lock);
}

static int shm_host_heap(mesh_transport_t *t, int rank, void **base,
                         size_t *len)
{
    int li;

    li = shm_local_of(t, rank);
    if (li < 0)
        return li;
    *base = shm_heap_at(t, li);
    *len = t->heap_bytes;
    return 0;
}

static void shm_close(mesh_transport_t *t)
{
    struct tp_req *r, *rn;

    if (!t)
        return;
    if (t->seg && t->me >= 0) {
        /* Our last frames are in the rings: say goodbye after them. */
        pthread_mutex_lock(&t->super.lock);
        if (t->connected && !t->super.fail.failed) {
            atomic_store_explicit(&shm_proc_at(t, t->me)->bye, 1,
                                  memory_order_release);
            for (int li = 0; li < t->nlocal; li++)
                if (li != t->me)
                    shm_ring_bell(t, li);
        }
        pthread_mutex_unlock(&t->super.lock);
    }
    if (t->thread_started) {
        struct shm_proc *self = shm_proc_at(t, t->me);

        pthread_mutex_lock(&t->super.lock);
        t->stopping = 1;
        pthread_cond_broadcast(&t->bg_cond);
        pthread_mutex_unlock(&t->super.lock);
        atomic_fetch_add(&self->bell, 1);
        syscall(SYS_futex, (uint32_t *)&self->bell, FUTEX_WAKE, INT_MAX, NULL,
                NULL, 0);
        pthread_join(t->thread, NULL);
    }
    for (r = t->super.reqs; r; r = rn) {
        rn = r->next;
        free(r);
    }
    t->super.reqs = NULL;
    shm_seg_close(t);
    if (t->inner)
        t->inner_ops->close(t->inner);
    free(t->pp);
    free(t->host);
    free(t->heap_free);
    free(t->heap_used);
    if (t->bg_cond_ready)
        pthread_cond_destroy(&t->bg_cond);
    tp_base_fini(&t->super);
    free(t);
}

const struct mesh_transport_ops mesh_shm_ops = {
    .name = "shm",
    .listen = shm_listen,
    .connect = shm_connect,
    .reg_mr = shm_reg_mr,
    .dereg_mr = shm_dereg_mr,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .test = shm_test,
    .wait_any = shm_wait_any,
    .progress = shm_progress,
    .abort = shm_abort,
    .culprit = shm_culprit,
    .close = shm_close,
    .seq_done = shm_seq_done,
    .expect = shm_expect,
    .host_of = shm_host_of,
    .ranks_per_cpu = shm_ranks_per_cpu,
    .host_window = shm_host_window,
    .host_sync = shm_host_sync,
    .host_sync_word = shm_host_sync_word,
    .host_alloc = shm_host_alloc,
    .host_free = shm_host_free,
    .host_heap = shm_host_heap,
};

/* shm, with verbs' auto table instead of TCP underneath where built. */
const struct mesh_transport_ops mesh_auto_ops = {
    .name = "auto",
    .listen = auto_listen,
    .connect = shm_connect,
    .reg_mr = shm_reg_mr,
    .dereg_mr = shm_dereg_mr,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .test = shm_test,
    .wait_any = shm_wait_any,
    .progress = shm_progress,
    .abort = shm_abort,
    .culprit = shm_culprit,
    .close = shm_close,
    .seq_done = shm_seq_done,
    .expect = shm_expect,
    .host_of = shm_host_of,
    .ranks_per_cpu = shm_ranks_per_cpu,
    .host_window = shm_host_window,
    .host_sync = shm_host_sync,
    .host_sync_word = shm_host_sync_word,
    .host_alloc = shm_host_alloc,
    .host_free = shm_host_free,
    .host_heap = shm_host_heap,
};
