/*
 * transport/tcp/wait.c: the waiter: wait_any spins doing the data streams' I/O
 * itself, then blocks in poll() on them (or on the condition variable),
 * and hold() keeps the streams with a collective's executor.
 */
#include "config.h"

#include "transport/tcp/tcp-internal.h"
#include "common/util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set while this thread does a waiter's I/O (its completions need no kick). */
_Thread_local int tcp_in_waiter_io;

/* ---- the waiter ---------------------------------------------------------- */

/* One pass of a waiter's I/O over the data streams, under the lock: write
 * what the send queues hold, read what arrived. With fds, also list what
 * each stream still waits for (*nf entries) for poll(). */
static void waiter_io(struct mesh_transport *t, struct pollfd *fds, int *nf)
{
    tcp_in_waiter_io = 1;
    for (int i = 0; i < t->super.world.size * t->S && !t->super.fail.failed;
         i++) {
        struct conn *c = tcp_data_conn(t, i);

        if (!c || c->state != C_READY || c->spin_lost)
            continue;
        if (c->txq)
            tcp_conn_write(c);
        if (!c->parked && c->state == C_READY)
            tcp_data_read(c);
        if (fds && c->state == C_READY && !c->spin_lost &&
            (!c->parked || c->txq)) {
            fds[*nf].fd = c->fd;
            fds[*nf].events =
                (short)((c->parked ? 0 : POLLIN) | (c->txq ? POLLOUT : 0));
            fds[(*nf)++].revents = 0;
        }
    }
    tcp_in_waiter_io = 0;
}

/*
 * Progress from the waiting thread: read every data stream and write what
 * its send queue holds, without blocking (under a trylock: the progress
 * thread may be at it). The progress thread's wake-up (a halted CPU woken
 * by an interrupt: ~100 us in a virtual machine) leaves the critical path.
 * Returns whether one of the requests is done, or the job failed.
 */
static int caller_io(struct mesh_transport *t, mesh_req_t *const *reqs, int n)
{
    int done;

    if (tp_any_done(reqs, n))
        return 1;
    if (pthread_mutex_trylock(&t->super.lock))
        return 0;
    waiter_io(t, NULL, NULL);
    done = tp_any_done(reqs, n) || t->super.fail.failed;
    pthread_mutex_unlock(&t->super.lock);
    return done;
}

/*
 * After the spin: block in poll() on the data streams themselves (and on
 * kick_fd, which the progress thread writes when it completes a request or
 * the job fails), doing the I/O in this thread as it becomes possible. The
 * socket wakes this thread directly: no wake-up of the progress thread,
 * no hand-over of the lock, no condition variable (measured: two wake-ups
 * and four context switches per message otherwise). Returns 1 when a
 * request is done or the job failed, 0 at the deadline, or an error.
 */
static int waiter_poll(struct mesh_transport *t, mesh_req_t *const *reqs, int n,
                       uint64_t deadline)
{
    int cap = t->super.world.size * t->S + 1, rc = 0;
    struct pollfd stack[65], *fds = stack;

    if (cap > (int)MESH_ARRAY_SIZE(stack)) {
        fds = malloc((size_t)cap * sizeof(*fds));
        if (!fds)
            return mesh_err(-ENOMEM, "out of memory");
    }
    atomic_fetch_add(&t->pollers, 1);
    for (;;) {
        uint64_t now, ms;
        int nf = 0;

        pthread_mutex_lock(&t->super.lock);
        waiter_io(t, fds, &nf);
        if (tp_any_done(reqs, n) || t->super.fail.failed) {
            pthread_mutex_unlock(&t->super.lock);
            rc = 1;
            break;
        }
        pthread_mutex_unlock(&t->super.lock);
        fds[nf].fd = t->kick_fd;
        fds[nf].events = POLLIN;
        fds[nf].revents = 0;
        now = mesh_now_ns();
        if (now >= deadline)
            break;
        /* Bounded: a stream that changes state under us is seen again. */
        ms = MESH_MIN((deadline - now) / 1000000u + 1, (uint64_t)100);
        if (poll(fds, (nfds_t)nf + 1, (int)ms) < 0 && errno != EINTR) {
            rc = mesh_err(-errno, "tcp wait: poll: %s", strerror(errno));
            break;
        }
        if (fds[nf].revents & POLLIN) {
            uint64_t v;

            if (read(t->kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                mesh_debug("tcp: kick read: %s", strerror(errno));
        }
    }
    atomic_fetch_sub(&t->pollers, 1);
    if (fds != stack)
        free(fds);
    return rc;
}

/*
 * Hand the data streams back to the progress thread (under the lock; any
 * thread). A stream that is ready and not parked has its read event off,
 * while the job stands, only because a spinning waiter was reading it; a
 * stream with pieces queued may have its write event off because a waiter
 * was writing it. reads = 0: the sends only (the last waiter leaves; what
 * arrives can wait for the next waiter, or the tick).
 */
static void spin_release_io(struct mesh_transport *t, int reads)
{
    if (t->super.fail.failed)
        return;
    atomic_store(&t->deferred, 0);
    for (int i = 0; i < t->super.world.size * t->S; i++) {
        struct conn *c = tcp_data_conn(t, i);

        if (!c || c->state != C_READY)
            continue;
        if (reads && !c->parked)
            tcp_rev_on(c);
        if (c->txq)
            tcp_wev_on(c);
    }
}

void tcp_spin_release(struct mesh_transport *t)
{
    spin_release_io(t, 1);
}

/*
 * The last waiter (or holder) has left: sleepers need the progress thread
 * to read, and sends left queued need it to write, unless a holder comes
 * back for them (tcp_hold).
 */
static void last_out(struct mesh_transport *t)
{
    int sleepers = atomic_load(&t->sleepers);

    if (sleepers || (atomic_load(&t->deferred) && !atomic_load(&t->holders))) {
        pthread_mutex_lock(&t->super.lock);
        spin_release_io(t, sleepers);
        pthread_mutex_unlock(&t->super.lock);
    }
}

int tcp_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                 double timeout_s)
{
    uint64_t start = mesh_now_ns(), deadline = MESH_NO_DEADLINE;
    int rc = 0;

    if (n <= 0 || !reqs)
        return mesh_err(-EINVAL, "tcp wait_any: no requests");
    if (timeout_s >= 0)
        deadline = start + (uint64_t)(timeout_s * 1e9);
    /* A short spin saves the sleep/wake round trip on small messages;
     * then poll() the streams (or sleep while the progress thread works). */
    if (t->spin_s > 0 || t->poll_wait) {
        uint64_t spin_end = start + (uint64_t)(t->spin_s * 1e9);
        int done = 0;

        atomic_fetch_add(&t->spinning, 1);
        for (;;) {
            done = caller_io(t, reqs, n);
            if (done || mesh_now_ns() >= spin_end)
                break;
            sched_yield(); /* a rank sharing this CPU may need it */
        }
        if (!done && t->poll_wait)
            done = waiter_poll(t, reqs, n, deadline);
        if (atomic_fetch_sub(&t->spinning, 1) == 1)
            last_out(t);
        if (done < 0)
            return done;
        if (done && !tp_any_done(reqs, n))
            done = 0; /* the job failed: its error, below */
        if (done)
            return 0;
        if (t->poll_wait && mesh_now_ns() >= deadline)
            return mesh_err(-ETIMEDOUT,
                            "tcp wait: no request completed within %.3f s",
                            timeout_s);
    }
    pthread_mutex_lock(&t->super.lock);
    /* About to sleep: the progress thread must read for us again. (A
     * spinner leaving at this moment sees sleepers, or we see it gone.) */
    atomic_fetch_add(&t->sleepers, 1);
    if (!atomic_load(&t->spinning))
        tcp_spin_release(t);
    rc = tp_wait_sleep(&t->super, reqs, n, deadline, timeout_s);
    atomic_fetch_sub(&t->sleepers, 1);
    pthread_mutex_unlock(&t->super.lock);
    return rc;
}

/*
 * A schedule's executor holds the transport while it runs: it comes back
 * to wait_any until its requests are done, so between two waits (while it
 * reduces a chunk or posts the next operations) the data streams stay
 * with it, as with a waiter: a blocked send is deferred, a stream that a
 * receive unparks is left to be read, and the progress thread, on an
 * event, hands the stream back instead of doing the I/O. Without this the
 * progress thread, on the same CPU, was woken once or twice per message
 * and preempted the executor for a lock it held (about ten context
 * switches per 1 MiB all-reduce of 2 ranks). The last holder or waiter to
 * leave gives the progress thread what is still queued; a waiter that
 * goes to sleep on the condition variable (MESHTRAIN_TCP_POLL=0) rearms
 * everything and has the progress thread do the I/O again, holder or not.
 */
void tcp_hold(mesh_transport_t *t, int on)
{
    if (on) {
        atomic_fetch_add(&t->holders, 1);
        return;
    }
    if (atomic_fetch_sub(&t->holders, 1) == 1 && !atomic_load(&t->spinning))
        last_out(t);
}
