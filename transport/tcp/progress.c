/*
 * transport/tcp/progress.c: the progress thread: its libevent callbacks (reads,
 * writes, wake-ups) and the tick (dials, deadlines, heartbeats, silent
 * peers), and the helpers that add and remove events.
 */
#include "config.h"

#include "transport/tcp/tcp-internal.h"
#include "common/util.h"

#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- events -------------------------------------------------------------- */

void tcp_wake(struct mesh_transport *t)
{
    event_active(t->wake_ev, EV_READ, 0);
}

/* Wake the waiters blocked in poll(); all: even from a waiter's own I/O
 * (another waiter may be blocked). */
void tcp_kick(struct mesh_transport *t, int all)
{
    int n = atomic_load(&t->pollers);
    uint64_t one = 1;
    ssize_t w;

    /* A waiter's own I/O counts it among the pollers. */
    if (!n || (tcp_in_waiter_io && n == 1 && !all))
        return;
    do
        w = write(t->kick_fd, &one, sizeof(one));
    while (w < 0 && errno == EINTR);
}

void tcp_rev_on(struct conn *c)
{
    if (!c->rev_on && c->state != C_DEAD) {
        event_add(c->rev, NULL);
        c->rev_on = 1;
    }
}

void tcp_wev_on(struct conn *c)
{
    if (!c->wev_on && c->state != C_DEAD) {
        event_add(c->wev, NULL);
        c->wev_on = 1;
    }
}

/* Whether this is the progress thread (or no progress thread runs yet). */
int tcp_on_progress_thread(const struct mesh_transport *t)
{
    return !t->thread_started || pthread_equal(pthread_self(), t->thread);
}

/* Data connection i of the mesh, i in [0, world size x S): link i / S,
 * stream i % S; NULL for this rank's own slot or one not made yet. */
struct conn *tcp_data_conn(const struct mesh_transport *t, int i)
{
    const struct link *l = &t->links[i / t->S];

    return i / t->S == t->super.world.rank || !l->data ? NULL
                                                       : l->data[i % t->S];
}

/* The progress thread deletes events (see the top of the file); from any
 * other thread these do nothing, and the event, when it fires, finds
 * nothing to do and goes away in its own callback. */
void tcp_rev_off(struct conn *c)
{
    if (c->rev_on && tcp_on_progress_thread(c->t)) {
        event_del(c->rev);
        c->rev_on = 0;
    }
}

void tcp_wev_off(struct conn *c)
{
    if (c->wev_on && tcp_on_progress_thread(c->t)) {
        event_del(c->wev);
        c->wev_on = 0;
    }
}

/* ---- event callbacks ----------------------------------------------------- */

/* Whether a thread other than the progress thread does the data streams'
 * I/O: a waiter doing it now, or a holder (tcp_hold) that comes back to do
 * it, unless a waiter sleeps and needs the progress thread to. */
static int waiter_does_io(struct mesh_transport *t)
{
    return atomic_load_explicit(&t->spinning, memory_order_relaxed) ||
           (atomic_load_explicit(&t->holders, memory_order_relaxed) &&
            !atomic_load_explicit(&t->sleepers, memory_order_relaxed));
}

void tcp_on_read(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct mesh_transport *t = c->t;

    (void)fd;
    (void)what;
    pthread_mutex_lock(&t->super.lock);
    if (c->state == C_READY && c->stream > 0 && !t->super.fail.failed &&
        !c->spin_lost && waiter_does_io(t)) {
        /* A waiting thread reads the data streams (caller_io), or a
         * holder will: leave it this one rather than wake for it again
         * and again. */
        tcp_rev_off(c);
    } else if (c->state == C_READY) {
        if (c->stream == 0)
            tcp_ctrl_read(c);
        else if (t->super.fail.failed)
            tcp_rev_off(c);
        else
            tcp_data_read(c);
    } else if (c->state == C_DEAD) {
        tcp_rev_off(c);
    } else if (c->state != C_CONNECTING) {
        tcp_hs_read(c);
    }
    pthread_mutex_unlock(&t->super.lock);
}

void tcp_on_write(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct mesh_transport *t = c->t;

    (void)fd;
    (void)what;
    pthread_mutex_lock(&t->super.lock);
    if (c->state == C_CONNECTING) {
        tcp_dial_connected(c);
        goto out;
    }
    if (c->state == C_DEAD) {
        tcp_wev_off(c);
        goto out;
    }
    if (c->out_off < c->out_len) {
        tcp_wev_off(c);
        tcp_conn_flush_out(c); /* re-adds the event if still blocked */
        if (c->out_off < c->out_len)
            goto out;
    }
    if (c->state == C_READY && c->stream > 0 && c->txq &&
        !t->super.fail.failed) {
        if (waiter_does_io(t)) {
            /* as on_read: a waiter writes the data streams */
            atomic_store(&t->deferred, 1);
            tcp_wev_off(c);
            tcp_kick(t, 1);
            goto out;
        }
        tcp_conn_write(c);
        if (c->txq)
            goto out;
    }
    tcp_wev_off(c);
out:
    pthread_mutex_unlock(&t->super.lock);
}

/* The tick's period once joined: 1/32 of the peer timeout, at most 0.1 s. */
static double tick_s(const struct mesh_transport *t)
{
    return MESH_MAX(MESH_MIN(t->super.opts.peer_timeout_s / 32, 0.1), 0.002);
}

/* A link with nothing sent for this long gets a heartbeat (2 ticks). */
static uint64_t heartbeat_ns(const struct mesh_transport *t)
{
    return (uint64_t)(2 * tick_s(t) * 1e9);
}

/*
 * How long a link may be silent before its peer is dead: the peer timeout
 * T less one tick. A live peer sends something at least every heartbeat
 * period plus a tick (3 ticks), so its silence reaches this only when it
 * stood still for T - 4 ticks or more. A peer that stops (dies without a
 * word, is stopped, or its host goes away) sent its last bytes up to 3
 * ticks before; the first tick after its silence reaches T - 1 tick
 * declares it dead, between T - 4 ticks and T after it stopped (T = 10 s:
 * 9.6 to 10 s), so that an --elastic view change follows within T plus
 * the agreement's own time.
 */
static uint64_t silence_limit_ns(const struct mesh_transport *t)
{
    return (uint64_t)((t->super.opts.peer_timeout_s - tick_s(t)) * 1e9);
}

void tcp_tick_arm(struct mesh_transport *t)
{
    double s = t->joining ? 0.005 : tick_s(t);
    struct timeval tv;

    tv.tv_sec = (time_t)s;
    tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
    evtimer_add(t->tick_ev, &tv);
}

/*
 * Whether this process stood still (SIGSTOP, a suspended machine, no CPU)
 * since the last tick: the monotonic clock jumped by more than the ticks
 * we scheduled. Its peers' silence during the stall is not theirs: their
 * bytes wait unread in our sockets. A stall shorter than the silence
 * limit (the peer timeout less a tick) is forgiven (their clocks start
 * again now); a longer one made us the silent peer, whom the others
 * declare dead: blame ourselves, so that
 * every rank names the same culprit (the first tick after SIGCONT runs
 * before we read their abort notices: epoll_wait returns EINTR).
 */
static void stall_check(struct mesh_transport *t, uint64_t now)
{
    uint64_t prev = t->tick_ns, stall;
    double tick = t->joining ? 0.005 : tick_s(t);
    char me[300];

    t->tick_ns = now;
    if (!prev || now - prev <= (uint64_t)((2 * tick + 0.5) * 1e9))
        return;
    stall = now - prev - (uint64_t)(tick * 1e9);
    if (!t->super.fail.failed && !t->joining && stall >= silence_limit_ns(t)) {
        tp_fail_job(&t->super, t->super.world.rank, -EHOSTDOWN, 1,
                    "rank %d (%s) itself stood still for %.1f s (stopped, "
                    "suspended or not scheduled), past the peer timeout of "
                    "%.1f s less a tick: its peers declare it dead",
                    t->super.world.rank,
                    tcp_pname(t, t->super.world.rank, me, sizeof(me)),
                    (double)stall / 1e9, t->super.opts.peer_timeout_s);
        return;
    }
    if ((double)stall >= t->super.opts.peer_timeout_s / 4 * 1e9)
        mesh_warn("this rank stood still for %.1f s (stopped, suspended or "
                  "not scheduled); its peers' silence meanwhile is not held "
                  "against them",
                  (double)stall / 1e9);
    for (int p = 0; p < t->super.world.size; p++) {
        struct link *l = &t->links[p];

        if (p == t->super.world.rank)
            continue;
        l->last_rx_ns = MESH_MIN(l->last_rx_ns + stall, now);
        l->data_rx_ns = MESH_MIN(l->data_rx_ns + stall, now);
        if (l->lost_ns)
            l->lost_ns = MESH_MIN(l->lost_ns + stall, now);
    }
}

/*
 * The margin of the peer timeout: a silence that ended (the peer's bytes
 * arrived since the last tick) was a live peer's; keep the longest. Each
 * tick sees the silence so far (after stall_check forgave our own
 * stalls), so the one kept is at most a tick short of the real one. A
 * peer declared dead never ends its silence and is not counted.
 */
static void silence_note(struct mesh_transport *t, int p, uint64_t now)
{
    struct link *l = &t->links[p];
    uint64_t sil = now > l->last_rx_ns ? now - l->last_rx_ns : 0;

    if (sil < l->sil_ns && l->sil_ns > t->live_sil_ns) {
        t->live_sil_ns = l->sil_ns;
        t->live_sil_rank = p;
    }
    l->sil_ns = sil;
}

/*
 * A stream of p parked on a frame that no posted receive takes, while
 * this rank waits on a receive from p. A frame of a later part while
 * frames of the running one are still due from p waits for those on p's
 * other streams (data.c, data_match): p sent them before it, so they
 * come within the network's time; any other parked frame (a point-to-
 * point one, of no collective's seqs, such as the links' measure at the
 * mesh's forming) waits for a receive posted later, which p's data then
 * still due lets this rank reach. A peer that sends nothing on any data
 * stream for twice the peer timeout meanwhile never will (a hostile or
 * broken one; its heartbeats keep it from looking silent): fail the job
 * naming it, as with one stream, rather than wait forever. (Twice: a dead
 * or stopped rank that holds this one back is declared so first, by its
 * silence.)
 */
static void ahead_check(struct mesh_transport *t, int p, uint64_t now)
{
    struct link *l = &t->links[p];
    char fb[200], nb[300];

    if (!l->posted || now - l->data_rx_ns <=
                          (uint64_t)(2 * t->super.opts.peer_timeout_s * 1e9))
        return;
    for (int s = 0; s < t->S; s++) {
        struct conn *c = l->data[s];

        if (!c || !c->parked || c->state != C_READY)
            continue;
        if (tp_frame_later(&t->super, p, &c->rx_f)) {
            tp_fail_order(&t->super, p, &c->rx_f);
            return;
        }
        tp_fail_job(&t->super, p, -EPROTO, 1,
                    "rank %d (%s) sent a frame that no receive posted here "
                    "takes, %s, while receives from it are still due here "
                    "and none of its data streams moved for %.1f s (twice "
                    "the peer timeout)",
                    p, tcp_pname(t, p, nb, sizeof(nb)),
                    mesh_frame_str(&c->rx_f, fb, sizeof(fb)),
                    (double)(now - l->data_rx_ns) / 1e9);
        return;
    }
}

/* Periodic: dials, handshake deadlines, heartbeats, silent peers, peers
 * whose frames a parked stream waits for. */
void tcp_on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct mesh_transport *t = arg;
    uint64_t now;
    struct conn *c, *next;
    char nb[300];

    (void)fd;
    (void)what;
    pthread_mutex_lock(&t->super.lock);
    /* after the lock: a waiting thread may have just stamped last_rx_ns */
    now = mesh_now_ns();
    if (t->stopping) {
        event_base_loopbreak(t->base);
        goto out;
    }
    for (c = t->hs; c; c = next) {
        next = c->hs_next;
        if (now < c->deadline_ns)
            continue;
        if (c->state == C_CONNECTING) {
            int peer = c->peer;

            snprintf(t->links[peer].why, sizeof(t->links[peer].why),
                     "connect timed out");
            tcp_conn_kill(c);
        } else {
            tcp_hs_refuse(c, "handshake not completed within %.0f s",
                          TCP_HS_DEADLINE_S);
        }
    }
    tcp_dial_scan(t);
    if (!atomic_load(&t->spinning))
        tcp_spin_release(t);
    if (t->accept_paused && event_add(t->listen_ev, NULL) == 0)
        t->accept_paused = 0;
    stall_check(t, now);
    tcp_refuse_tick(t, now);
    for (int p = 0; p < t->super.world.size; p++) {
        struct link *l = &t->links[p];

        if (p == t->super.world.rank || !l->ctrl || l->bye)
            continue;
        /* Heartbeat when nothing else went to this peer lately. */
        if (l->ctrl->state == C_READY && now - l->tx_ns >= heartbeat_ns(t))
            tcp_ctrl_send(l->ctrl, TCP_CTRL_HEARTBEAT, -1, 0, NULL);
        if (!t->super.fail.failed && l->lost_ns &&
            now - l->lost_ns > (uint64_t)(LOST_GRACE_S * 1e9))
            tp_fail_job(&t->super, p, -ECONNRESET, 1, "rank %d (%s) %s", p,
                        tcp_pname(t, p, nb, sizeof(nb)), l->lost_why);
        silence_note(t, p, now);
        if (!t->super.fail.failed && now - l->last_rx_ns > silence_limit_ns(t))
            tp_fail_job(&t->super, p, -EHOSTDOWN, 1,
                        "rank %d (%s) silent for %.2f s (peer timeout %.1f s, "
                        "heartbeats every %.2f s)",
                        p, tcp_pname(t, p, nb, sizeof(nb)),
                        (double)(now - l->last_rx_ns) / 1e9,
                        t->super.opts.peer_timeout_s, 2 * tick_s(t));
        if (!t->super.fail.failed && l->data)
            ahead_check(t, p, now);
    }
    tcp_tick_arm(t);
out:
    pthread_mutex_unlock(&t->super.lock);
}

/* Work handed over by another thread. */
void tcp_on_wake(evutil_socket_t fd, short what, void *arg)
{
    struct mesh_transport *t = arg;

    (void)fd;
    (void)what;
    pthread_mutex_lock(&t->super.lock);
    if (t->stopping) {
        event_base_loopbreak(t->base);
    } else {
        if (t->super.fail.failed) {
            for (int i = 0; i < t->super.world.size * t->S; i++) {
                struct conn *c = tcp_data_conn(t, i);

                if (c) {
                    tcp_rev_off(c);
                    tcp_wev_off(c);
                }
            }
        }
        tcp_dial_scan(t);
        /* Rearm the tick at the right pace (joining starts fast). */
        evtimer_del(t->tick_ev);
        tcp_tick_arm(t);
    }
    pthread_mutex_unlock(&t->super.lock);
}

void *tcp_progress_main(void *arg)
{
    struct mesh_transport *t = arg;

    if (event_base_loop(t->base, EVLOOP_NO_EXIT_ON_EMPTY) < 0)
        mesh_error_log("TCP transport: the libevent loop failed");
    return NULL;
}
