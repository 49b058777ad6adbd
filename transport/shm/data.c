/*
 * transport/shm/data.c: the data path between the ranks of one host: the
 * rings, matching (the TCP transport's rules and messages), the copies,
 * the wake-ups and the progress thread.
 */
#define _GNU_SOURCE
#include "config.h"

#include "transport/shm/shm-internal.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

void shm_q_push(struct mesh_req **head, struct mesh_req **tail,
                struct mesh_req *r)
{
    r->qnext = NULL;
    if (*tail)
        (*tail)->qnext = r;
    else
        *head = r;
    *tail = r;
}

void shm_q_remove(struct mesh_req **head, struct mesh_req **tail,
                  struct mesh_req *r)
{
    struct mesh_req *prev = NULL;

    for (struct mesh_req *q = *head; q; prev = q, q = q->qnext) {
        if (q != r)
            continue;
        if (prev)
            prev->qnext = q->qnext;
        else
            *head = q->qnext;
        if (*tail == q)
            *tail = prev;
        q->qnext = NULL;
        return;
    }
}

/* ---- wake-ups ------------------------------------------------------------ */

static long futex(_Atomic uint32_t *w, int op, uint32_t val,
                  const struct timespec *ts)
{
    /* shared (not FUTEX_PRIVATE): the word lives in the segment */
    return syscall(SYS_futex, (uint32_t *)w, op, val, ts, NULL, 0);
}

void shm_ring_bell(struct mesh_transport *t, int li)
{
    struct shm_proc *pr = shm_proc_at(t, li);

    /* Pairs with the sleeper's fence between "sleeping" and its last look
     * at the rings (shm_bell_sleep): one of the two sees the other. */
    atomic_thread_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&pr->sleeping, memory_order_relaxed))
        return;
    atomic_fetch_add_explicit(&pr->bell, 1, memory_order_seq_cst);
    futex(&pr->bell, FUTEX_WAKE, INT_MAX, NULL);
}

void shm_wake_self(struct mesh_transport *t)
{
    struct shm_proc *self;

    if (!t->seg || t->me < 0)
        return;
    self = shm_proc_at(t, t->me);
    atomic_fetch_add_explicit(&self->bell, 1, memory_order_seq_cst);
    futex(&self->bell, FUTEX_WAKE, INT_MAX, NULL);
}

int shm_bell_sleep(struct mesh_transport *t, uint64_t until_ns, int waiter)
{
    struct shm_proc *self = shm_proc_at(t, t->me);
    uint64_t now = mesh_now_ns(), d;
    struct timespec ts;
    uint32_t bell;

    if (now >= until_ns)
        return 0;
    d = until_ns - now;
    ts.tv_sec = (time_t)(d / 1000000000ull);
    ts.tv_nsec = (long)(d % 1000000000ull);
    bell = atomic_load(&self->bell);
    atomic_fetch_add(&self->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst);
    /* the last look, after "sleeping": a frame published before it is
     * seen here, one published after it rings the bell */
    if (shm_poll(t)) {
        atomic_fetch_sub(&self->sleeping, 1);
        return 1;
    }
    /* a waiter's request may also complete by another thread's poll
     * (or fail): that thread rings our bell (shm_poll, shm_failed) */
    if (waiter)
        t->sleepers++;
    pthread_mutex_unlock(&t->super.lock);
    futex(&self->bell, FUTEX_WAIT, bell, &ts);
    pthread_mutex_lock(&t->super.lock);
    if (waiter)
        t->sleepers--;
    atomic_fetch_sub(&self->sleeping, 1);
    return 0;
}

/* ---- sending ------------------------------------------------------------- */

static void slot_frame(struct shm_slot *s, const struct mesh_frame *f,
                       uint64_t offset, uint64_t length, int kind)
{
    s->seq = f->seq;
    s->tag = f->tag;
    s->op = f->op;
    s->dtype = f->dtype;
    s->kind = (uint8_t)kind;
    s->count = f->count;
    s->offset = offset;
    s->length = length;
    s->addr = 0;
}

/* The frame header that slot s carries. */
static struct mesh_frame slot_header(const struct shm_slot *s)
{
    return (struct mesh_frame){.seq = s->seq,
                               .tag = s->tag,
                               .op = s->op,
                               .dtype = s->dtype,
                               .count = s->count,
                               .offset = s->offset,
                               .length = s->length};
}

/* The test aid (tp_test_wire) on a slot just framed, a piece of message
 * msg: 1 when it goes out twice. */
static int slot_hostile(struct shm_slot *s, const struct mesh_frame *msg)
{
    struct mesh_frame f = slot_header(s);

    switch (tp_test_wire(&f, msg, 1)) {
    case TP_WIRE_HEADER:
        s->seq = f.seq;
        s->tag = f.tag;
        s->op = f.op;
        s->dtype = f.dtype;
        s->count = f.count;
        s->offset = f.offset;
        s->length = f.length;
        return 0;
    case TP_WIRE_KIND:
        s->kind = 0x7f;
        return 0;
    case TP_WIRE_DUP:
        return 1;
    default:
        return 0;
    }
}

/* Publish what fits of the peer's queued sends; 1 if anything moved. */
static int push(struct mesh_transport *t, int peer)
{
    struct shm_peer *pp = &t->pp[peer];
    struct shm_ring *ring = shm_ring_at(t, t->me, pp->local);
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_acquire);
    uint64_t head0 = head;
    struct mesh_req *r;
    int moved = 0;

    /* Sends by address whose slot the receiver has freed: read, done. */
    while ((r = pp->aq_head) && tail > r->ack_at) {
        shm_q_remove(&pp->aq_head, &pp->aq_tail, r);
        tp_req_done(&t->super, &r->super);
        moved = 1;
    }
    while ((r = pp->sq_head) && head - tail < SHM_SLOTS) {
        const struct mesh_frame *f = &r->super.f;
        struct shm_slot *s = shm_slot_at(ring, head);

        if (r->cma) {
            slot_frame(s, f, f->offset, f->length, SLOT_CMA);
            s->addr = (uint64_t)(uintptr_t)r->buf;
            r->ack_at = head++;
            if (slot_hostile(s, f) && head - tail < SHM_SLOTS)
                memcpy(shm_slot_at(ring, head++), s, SHM_SLOT_STRIDE);
            shm_q_remove(&pp->sq_head, &pp->sq_tail, r);
            shm_q_push(&pp->aq_head, &pp->aq_tail, r);
            continue;
        }
        {
            uint64_t piece =
                MESH_MIN((uint64_t)SHM_SLOT_BYTES, f->length - r->moved);

            slot_frame(s, f, f->offset + r->moved, piece, SLOT_INLINE);
            if (piece)
                memcpy(s + 1, r->buf + r->moved, piece);
            r->moved += piece;
            head++;
            if (slot_hostile(s, f) && head - tail < SHM_SLOTS)
                memcpy(shm_slot_at(ring, head++), s, SHM_SLOT_STRIDE);
        }
        if (r->moved == f->length) {
            shm_q_remove(&pp->sq_head, &pp->sq_tail, r);
            tp_req_done(&t->super, &r->super);
        }
    }
    if (head != head0) {
        atomic_store_explicit(&ring->head, head, memory_order_release);
        shm_ring_bell(t, pp->local);
        moved = 1;
    }
    return moved;
}

/* ---- receiving ----------------------------------------------------------- */

/*
 * The posted receive that frame s of peer belongs to (transport.h's
 * matching rules, the TCP transport's messages); NULL: none yet (the ring
 * waits), or the job failed (desync, or a frame beyond its receive).
 */
static struct mesh_req *match(struct mesh_transport *t, int peer,
                              const struct shm_slot *s, struct mesh_frame *f)
{
    int self = t->super.world.rank;

    *f = slot_header(s);
    if (tp_frame_check(&t->super, peer, f) < 0)
        return NULL;
    for (struct mesh_req *r = t->pp[peer].rq_head; r; r = r->qnext) {
        int m =
            tp_frame_match(&t->super, peer, self, peer, &r->super.f, r->moved,
                           f, 1, "ring closed before its payload");

        if (m < 0)
            return NULL;
        if (m == 0)
            continue;
        return r;
    }
    /* of a later part, where the one ring from peer has the running
     * part's frames due from it behind: it broke the order */
    if (tp_frame_unmatched(&t->super, peer, f) == 1)
        tp_fail_order(&t->super, peer, f);
    return NULL;
}

/* Read a message by address from the peer's memory. */
static int cma_read(struct mesh_transport *t, int peer, void *dst,
                    uint64_t addr, uint64_t len)
{
    uint64_t done = 0;

    while (done < len) {
        struct iovec l = {.iov_base = (char *)dst + done,
                          .iov_len = (size_t)(len - done)};
        struct iovec r = {.iov_base = (void *)(uintptr_t)(addr + done),
                          .iov_len = (size_t)(len - done)};
        ssize_t got = process_vm_readv(t->pp[peer].pid, &l, 1, &r, 1, 0);

        if (got <= 0) {
            char nb[300];
            int e = got < 0 ? errno : EIO;

            if (got < 0 && e == EINTR)
                continue;
            /* Its job failed and the buffer went: wait for the notice. */
            atomic_thread_fence(memory_order_seq_cst);
            if (atomic_load_explicit(&shm_proc_at(t, t->pp[peer].local)->failed,
                                     memory_order_relaxed))
                return -EAGAIN;
            tp_fail_job(&t->super, peer, -e, 1,
                        "shm: reading %" PRIu64 " bytes from rank %d (%s) "
                        "with process_vm_readv failed: %s",
                        len, peer, tp_pname(&t->super, peer, nb, sizeof(nb)),
                        strerror(e));
            return -e;
        }
        done += (uint64_t)got;
    }
    return 0;
}

/* Land the peer's published frames in their receives; 1 if any did. */
static int pull(struct mesh_transport *t, int peer)
{
    struct shm_peer *pp = &t->pp[peer];
    struct shm_ring *ring = shm_ring_at(t, pp->local, t->me);
    uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
    uint64_t tail0 = tail;

    if (head != pp->in_head) {
        pp->in_head = head;
        pp->in_moved_ns = mesh_now_ns();
    }
    pp->parked = 0;
    while (tail < head && !t->super.fail.failed) {
        const struct shm_slot *s = shm_slot_at(ring, tail);
        struct mesh_frame f;
        struct mesh_req *r = match(t, peer, s, &f);
        /* read once: the peer's memory, checked below, then acted on */
        int kind = *(const volatile uint8_t *)&s->kind;
        char *dst;

        if (!r) {
            /* no posted receive takes it (yet): the ring waits */
            pp->parked = !t->super.fail.failed;
            pp->parked_f = f;
            break;
        }
        /* A peer's slot is not trusted further than its receive's range:
         * an inline payload longer than a slot would be read past it. */
        if (kind != SLOT_CMA &&
            (kind != SLOT_INLINE || f.length > SHM_SLOT_BYTES)) {
            char nb[300];

            tp_fail_job(&t->super, peer, -EPROTO, 1,
                        "shm: rank %d (%s) sent garbage on its ring (slot "
                        "kind %u, length %" PRIu64 "; a slot holds %u bytes)",
                        peer, tp_pname(&t->super, peer, nb, sizeof(nb)),
                        (unsigned)kind, f.length, SHM_SLOT_BYTES);
            break;
        }
        dst = r->buf + (f.offset - r->super.f.offset);
        if (kind == SLOT_CMA) {
            if (f.length && cma_read(t, peer, dst, s->addr, f.length) < 0)
                break;
            /*
             * A sender whose job failed may have freed the buffer before
             * we read it: what we read is void, and the frame stays. Its
             * failure's notice, naming the culprit, is on its way over the
             * TCP mesh (the first to see a failure tells everyone).
             */
            atomic_thread_fence(memory_order_seq_cst);
            if (atomic_load_explicit(&shm_proc_at(t, pp->local)->failed,
                                     memory_order_relaxed))
                break;
        } else if (f.length) {
            memcpy(dst, s + 1, f.length);
        }
        r->moved += f.length;
        r->frames++;
        tail++;
        if (r->moved == r->super.f.length) {
            shm_q_remove(&pp->rq_head, &pp->rq_tail, r);
            tp_recv_got(&t->super, &r->super);
            tp_req_done(&t->super, &r->super);
        }
    }
    if (tail != tail0) {
        atomic_store_explicit(&ring->tail, tail, memory_order_release);
        shm_ring_bell(t, pp->local);
        pp->in_moved_ns = mesh_now_ns();
        return 1;
    }
    return 0;
}

/* ---- host syncs ---------------------------------------------------------- */

static int rank_of_local(struct mesh_transport *t, int li);

void shm_sync_post(struct mesh_transport *t, struct mesh_req *r)
{
    struct shm_proc *me = shm_proc_at(t, t->me);
    const struct mesh_frame *f = &r->super.f;
    struct shm_sync_frame *y;

    /* a failure's message names the first peer it waits for */
    if (t->nlocal > 1)
        r->super.peer = rank_of_local(t, t->me == 0 ? 1 : 0);
    r->sync_k = ++t->syncs;
    y = &me->sync[r->sync_k % 2];
    *y = (struct shm_sync_frame){.seq = f->seq,
                                 .count = f->count,
                                 .tag = f->tag,
                                 .op = f->op,
                                 .dtype = f->dtype,
                                 .word = {r->word[0], r->word[1]}};
    /* the frame and our window's writes before the count */
    atomic_store_explicit(&me->syncs, r->sync_k, memory_order_release);
    shm_q_push(&t->yq_head, &t->yq_tail, r);
    for (int li = 0; li < t->nlocal; li++)
        if (li != t->me)
            shm_ring_bell(t, li);
}

/* The rank of local index li. */
static int rank_of_local(struct mesh_transport *t, int li)
{
    for (int p = 0; p < t->super.world.size; p++)
        if (t->pp[p].local == li)
            return p;
    return -1;
}

/*
 * Whether the peer at local index li has reached our sync r: 1, or 0 (not
 * yet; r then names it, as a receive from it, for a failure's message),
 * or -EPROTO after failing the job (its frame differs: a desync, named
 * here when it is at the same sync as we are; a peer ahead of us checked
 * ours already).
 */
static int sync_reached(struct mesh_transport *t, struct mesh_req *r, int li)
{
    struct shm_proc *pr = shm_proc_at(t, li);
    uint64_t k = r->sync_k, got;
    struct shm_sync_frame y;
    struct mesh_frame pf;
    int peer = rank_of_local(t, li), self = t->super.world.rank;
    char fa[200], fb[200], an[300], bn[300];

    got = atomic_load_explicit(&pr->syncs, memory_order_acquire);
    if (got < k) {
        r->super.peer = peer;
        if (atomic_load_explicit(&pr->bye, memory_order_acquire))
            tp_fail_left(&t->super, peer);
        return t->super.fail.failed ? -EPROTO : 0;
    }
    if (got > k)
        return 1;
    y = pr->sync[k % 2];
    pf = (struct mesh_frame){.seq = y.seq,
                             .tag = y.tag,
                             .op = y.op,
                             .dtype = y.dtype,
                             .count = y.count};
    if (pf.seq == r->super.f.seq && pf.tag == r->super.f.tag &&
        pf.op == r->super.f.op && pf.dtype == r->super.f.dtype &&
        pf.count == r->super.f.count)
        return 1;
    r->super.peer = peer;
    tp_fail_job(&t->super, peer, -EPROTO, 1,
                "desync between rank %d (%s), at host sync #%" PRIu64
                " of %s, and rank %d (%s), at its host sync #%" PRIu64 " of %s",
                self, tp_pname(&t->super, self, an, sizeof(an)), k,
                mesh_frame_str(&r->super.f, fa, sizeof(fa)), peer,
                tp_pname(&t->super, peer, bn, sizeof(bn)), k,
                mesh_frame_str(&pf, fb, sizeof(fb)));
    return -EPROTO;
}

/* Complete the host syncs every local rank has reached, in order; 1 if
 * any did. */
static int sync_poll(struct mesh_transport *t)
{
    struct mesh_req *r;
    int moved = 0;

    while ((r = t->yq_head) && !t->super.fail.failed) {
        int li;

        for (li = 0; li < t->nlocal; li++)
            if (li != t->me && sync_reached(t, r, li) != 1)
                break;
        if (li < t->nlocal)
            break;
        shm_q_remove(&t->yq_head, &t->yq_tail, r);
        tp_req_done(&t->super, &r->super);
        moved = 1;
    }
    return moved;
}

void shm_check_gone(struct mesh_transport *t, int peer)
{
    struct shm_peer *pp = &t->pp[peer];
    struct shm_ring *in;

    if (t->super.fail.failed || pp->local < 0 || !t->seg)
        return;
    if (!pp->gone && !atomic_load_explicit(&shm_proc_at(t, pp->local)->bye,
                                           memory_order_acquire))
        return;
    pp->gone = 1;
    in = shm_ring_at(t, pp->local, t->me);
    /* The goodbye follows its last frames and reads: take them first (a
     * request they complete is no failure). */
    if (pp->sq_head || pp->aq_head)
        push(t, peer);
    pull(t, peer);
    if (t->super.fail.failed)
        return;
    if ((pp->rq_head && atomic_load(&in->head) == atomic_load(&in->tail)) ||
        pp->sq_head || pp->aq_head)
        tp_fail_left(&t->super, peer);
}

/*
 * A ring parked on a frame that no posted receive takes waits for a
 * receive posted later, which the peer's frames behind it, or its data
 * still due on the ring, let this rank reach (a frame of a later part,
 * with frames of the running one due behind it, failed at once: match).
 * A peer that publishes nothing on its ring for twice the peer timeout
 * meanwhile, its receives due here, never will (a hostile or broken one;
 * its heartbeats on the TCP mesh keep it from looking silent): fail the
 * job naming it, as the TCP transport does (transport/tcp/progress.c,
 * ahead_check), rather than wait forever. (Twice: a dead or stopped rank
 * that holds this one back is declared so first, by its silence.)
 */
void shm_stale_check(struct mesh_transport *t, uint64_t now)
{
    uint64_t prev = t->tick_ns, stall = 0;
    uint64_t limit = (uint64_t)(2 * t->super.opts.peer_timeout_s * 1e9);
    char fb[200], nb[300];

    /* A stall of this process (stopped, not scheduled; the TCP mesh fails
     * one past the peer timeout) is not the peers' silence. */
    t->tick_ns = now;
    if (prev && now - prev > 2 * SHM_TICK_MS * 1000000ull + 500000000ull)
        stall = now - prev - SHM_TICK_MS * 1000000ull;
    for (int p = 0; p < t->super.world.size; p++) {
        struct shm_peer *pp = &t->pp[p];

        if (pp->local < 0 || p == t->super.world.rank)
            continue;
        pp->in_moved_ns = MESH_MIN(pp->in_moved_ns + stall, now);
        if (t->super.fail.failed || !pp->parked || !pp->rq_head ||
            now - pp->in_moved_ns <= limit)
            continue;
        tp_fail_job(&t->super, p, -EPROTO, 1,
                    "rank %d (%s) sent a frame that no receive posted here "
                    "takes, %s, while receives from it are still due here "
                    "and none of its data streams (its ring) moved for %.1f "
                    "s (twice the peer timeout)",
                    p, tp_pname(&t->super, p, nb, sizeof(nb)),
                    mesh_frame_str(&pp->parked_f, fb, sizeof(fb)),
                    (double)(now - pp->in_moved_ns) / 1e9);
    }
}

/* shm_poll without the wake-up of our own sleeping waiters. */
static int poll_rings(struct mesh_transport *t)
{
    int moved = 0;

    if (!t->seg || t->super.fail.failed)
        return 0;
    if (t->yq_head)
        moved = sync_poll(t);
    for (int p = 0; p < t->super.world.size; p++) {
        struct shm_peer *pp = &t->pp[p];

        if (pp->local < 0 || p == t->super.world.rank)
            continue;
        if (pp->sq_head || pp->aq_head)
            moved |= push(t, p);
        moved |= pull(t, p);
        if (t->super.fail.failed)
            return moved;
        if ((pp->rq_head || pp->sq_head || pp->aq_head) &&
            atomic_load_explicit(&shm_proc_at(t, pp->local)->bye,
                                 memory_order_relaxed))
            shm_check_gone(t, p);
    }
    return moved;
}

int shm_poll(struct mesh_transport *t)
{
    int moved = poll_rings(t);

    /* what moved may be a request a waiter asleep on our bell waits for */
    if (moved && t->sleepers)
        shm_wake_self(t);
    return moved;
}

/* ---- the progress thread ------------------------------------------------- */

void shm_adopt_inner(struct mesh_transport *t)
{
    struct tp_failure f;

    tp_failure_of(t->inner, &f);
    if (f.failed)
        tp_fail_job(&t->super, -1, f.code, 0, "%s", f.reason);
}

void *shm_progress_main(void *arg)
{
    struct mesh_transport *t = arg;
    int self = t->seg && t->me >= 0;
    uint64_t last_tick = 0;

    pthread_mutex_lock(&t->super.lock);
    while (!t->stopping) {
        uint64_t now = mesh_now_ns();

        if (now - last_tick >= SHM_TICK_MS * 1000000ull) {
            /* Watch the TCP mesh: a dead, silent or aborting peer fails
             * the job (its progress takes its own lock, not ours). */
            int rc;

            pthread_mutex_unlock(&t->super.lock);
            rc = t->inner_ops->progress(t->inner);
            pthread_mutex_lock(&t->super.lock);
            if (rc < 0)
                shm_adopt_inner(t);
            shm_poll(t);
            shm_stale_check(t, mesh_now_ns());
            last_tick = now;
        }
        if (shm_poll(t))
            continue;
        if (t->spinners || !self || t->super.fail.failed) {
            /* a waiter spins (it polls) or there is nothing to watch */
            struct timespec dl;
            uint64_t d = mesh_now_ns() + SHM_TICK_MS * 1000000ull;

            dl.tv_sec = (time_t)(d / 1000000000ull);
            dl.tv_nsec = (long)(d % 1000000000ull);
            pthread_cond_timedwait(&t->bg_cond, &t->super.lock, &dl);
            continue;
        }
        shm_bell_sleep(t, mesh_now_ns() + SHM_TICK_MS * 1000000ull, 0);
    }
    pthread_mutex_unlock(&t->super.lock);
    return NULL;
}
