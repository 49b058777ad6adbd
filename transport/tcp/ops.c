/*
 * transport/tcp/ops.c: the transport object: listen, failure, progress, abort,
 * close, and the ops table.
 */
#include "config.h"

#include "transport/tcp/tcp-internal.h"
#include "common/util.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* ---- failure ------------------------------------------------------------- */

void tcp_ctrl_send(struct conn *c, uint32_t type, int culprit, int code,
                   const char *reason)
{
    uint8_t *m;
    size_t n = reason ? strlen(reason) : 0;

    if (!c || c->state != C_READY)
        return;
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + TCP_CTRL_LEN > sizeof(c->out)) {
        /* A peer that reads nothing for this long is dead anyway. */
        return;
    }
    m = c->out + c->out_len;
    memset(m, 0, TCP_CTRL_LEN);
    if (n > TCP_CTRL_REASON_MAX)
        n = TCP_CTRL_REASON_MAX;
    mesh_put_le32(m, type);
    mesh_put_le32(m + 4, (uint32_t)culprit);
    mesh_put_le32(m + 8, (uint32_t)-code);
    mesh_put_le32(m + 12, (uint32_t)n);
    if (n)
        memcpy(m + 16, reason, n);
    c->out_len += TCP_CTRL_LEN;
    c->t->links[c->peer].tx_ns = mesh_now_ns();
    tcp_conn_flush_out(c);
}

void tcp_free_pieces(struct conn *c)
{
    struct piece *p, *n;

    for (p = c->txq; p; p = n) {
        n = p->next;
        free(p);
    }
    c->txq = c->txq_tail = NULL;
    c->tx_queued = 0;
}

/*
 * The job failed (tp_fail_job has recorded it and woken the sleepers):
 * drop every queued piece and posted receive, tell the other peers
 * (notify), wake the waiters blocked in poll() and the progress thread.
 */
static void tcp_failed(struct tp_base *b, int culprit, int code, int notify,
                       const char *reason)
{
    struct mesh_transport *t = (struct mesh_transport *)b; /* super first */

    for (int p = 0; p < b->world.size; p++) {
        struct link *l = &t->links[p];

        if (p == b->world.rank)
            continue;
        for (int s = 0; s < t->S; s++) {
            struct conn *c = l->data[s];

            if (!c)
                continue;
            tcp_free_pieces(c);
            c->rx_req = NULL;
        }
        l->posted = NULL;
        l->posted_tail = NULL;
        /* The culprit too: a desync names both sides to both. */
        if (notify && !l->bye)
            tcp_ctrl_send(l->ctrl, TCP_CTRL_ABORT, culprit, code, reason);
    }
    for (struct tp_req *r = b->reqs; r; r = r->next)
        ((struct mesh_req *)r)->posted = 0;
    tcp_kick(t, 1);
    tcp_wake(t);
}

static const struct tp_base_ops tcp_base_ops = {
    .failed = tcp_failed,
    .req_free = tcp_req_free,
};

static void tcp_close(mesh_transport_t *t);

/* ---- operations ---------------------------------------------------------- */

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rc;

static void evthread_init(void)
{
    evthread_rc = evthread_use_pthreads();
}

static int tcp_listen(const struct mesh_world *world,
                      const struct mesh_transport_opts *opts,
                      mesh_transport_t **out)
{
    struct mesh_transport *t;
    size_t clen;
    int rc, n;

    if (!world || !opts || world->size < 1 || world->rank < 0 ||
        world->rank >= world->size || !world->peers)
        return mesh_err(-EINVAL, "tcp: invalid world (rank %d of %d)",
                        world ? world->rank : -1, world ? world->size : 0);
    if (opts->streams < 1 || opts->streams > 64)
        return mesh_err(-EINVAL, "tcp: streams must be 1..64, not %d",
                        opts->streams);
    if (!(opts->peer_timeout_s > 0) || !(opts->join_timeout_s > 0))
        return mesh_err(-EINVAL, "tcp: timeouts must be positive");
    if ((!opts->secret || !opts->secret_len) && !opts->insecure)
        return mesh_err(-EINVAL, "no shared secret: give --secret-file FILE "
                                 "(mode 0600), or --insecure to run without "
                                 "authentication");
    clen = strnlen(opts->config, MESH_CONFIG_MAX);
    if (clen >= MESH_CONFIG_MAX)
        return mesh_err(-EINVAL, "tcp: configuration longer than %d bytes",
                        MESH_CONFIG_MAX - 1);
    if (opts->tcp_cc[0] && (rc = mesh_tcp_cc_check(opts->tcp_cc)) < 0)
        return rc;
    pthread_once(&evthread_once, evthread_init);
    if (evthread_rc < 0)
        return mesh_err(-EIO, "evthread_use_pthreads failed");

    t = calloc(1, sizeof(*t));
    if (!t)
        return mesh_err(-ENOMEM, "out of memory");
    t->listen_fd = -1;
    t->kick_fd = -1;
    t->S = opts->streams;
    rc = tp_base_init(&t->super, "tcp", &tcp_base_ops, world, opts);
    if (rc < 0)
        goto fail;
    t->links = calloc((size_t)world->size, sizeof(*t->links));
    if (!t->links) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto fail;
    }
    for (int p = 0; p < world->size; p++) {
        t->links[p].data = calloc((size_t)t->S, sizeof(struct conn *));
        t->links[p].dial = calloc((size_t)t->S + 1, sizeof(struct dial));
        if (!t->links[p].data || !t->links[p].dial) {
            rc = mesh_err(-ENOMEM, "out of memory");
            goto fail;
        }
        for (int s = 0; s <= t->S; s++)
            t->links[p].dial[s].backoff_ns = DIAL_BACKOFF_MIN_NS;
    }
    if (opts->secret && opts->secret_len) {
        t->secret = malloc(opts->secret_len);
        if (!t->secret) {
            rc = mesh_err(-ENOMEM, "out of memory");
            goto fail;
        }
        memcpy(t->secret, opts->secret, opts->secret_len);
        t->secret_len = opts->secret_len;
    }
    /* The stream count must agree too: it joins the fingerprint. */
    n = snprintf(t->config, sizeof(t->config), "%.*stransport.streams=%d\n",
                 (int)clen, opts->config, t->S);
    t->config_len = (size_t)n;
    if (!EVP_Digest(t->config, t->config_len, t->fp, NULL, EVP_sha256(),
                    NULL)) {
        rc = mesh_err(-EIO, "SHA-256 failed");
        goto fail;
    }
    {
        const char *spin = getenv("MESHTRAIN_TCP_SPIN_US");

        /* The spinning waiter reads the sockets itself (caller_io) and
         * yields the CPU each round, so it pays even on 2 cores shared by
         * 4 ranks (measured: 4 KiB all-reduce on loopback, 2 ranks
         * 65-210 us sleeping, 15-27 us spinning; 4 ranks no worse). */
        const char *pw = getenv("MESHTRAIN_TCP_POLL");

        t->spin_s = spin ? atof(spin) * 1e-6 : TCP_SPIN_DEFAULT_S;
        if (t->spin_s < 0 || t->spin_s > 1)
            t->spin_s = TCP_SPIN_DEFAULT_S;
        t->poll_wait = !pw || strcmp(pw, "0") != 0;
    }
    t->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->kick_fd < 0) {
        rc = mesh_err(-errno, "tcp: eventfd: %s", strerror(errno));
        goto fail;
    }

    rc = tcp_listen_socket(t, &t->listen_fd);
    if (rc < 0)
        goto fail;
    t->base = event_base_new();
    if (!t->base) {
        rc = mesh_err(-ENOMEM, "event_base_new failed");
        goto fail;
    }
    t->listen_ev = event_new(t->base, t->listen_fd, EV_READ | EV_PERSIST,
                             tcp_on_accept, t);
    t->wake_ev = event_new(t->base, -1, 0, tcp_on_wake, t);
    t->tick_ev = evtimer_new(t->base, tcp_on_tick, t);
    if (!t->listen_ev || !t->wake_ev || !t->tick_ev ||
        event_add(t->listen_ev, NULL) < 0) {
        rc = mesh_err(-ENOMEM, "libevent: cannot create events");
        goto fail;
    }
    tcp_tick_arm(t);
    if (pthread_create(&t->thread, NULL, tcp_progress_main, t)) {
        rc = mesh_err(-EAGAIN, "cannot start the progress thread");
        goto fail;
    }
    t->thread_started = 1;
    if (!t->secret)
        mesh_warn("insecure: this mesh is unauthenticated (no secret); "
                  "anyone who can reach port %u can join it",
                  (unsigned)t->super.peers[t->super.world.rank].port);
    mesh_debug("tcp: rank %d listening on port %u, %d data streams",
               world->rank, (unsigned)t->super.peers[world->rank].port, t->S);
    *out = t;
    return 0;
fail:
    tcp_close(t);
    return rc;
}

static int tcp_reg_mr(mesh_transport_t *t, void *buf, size_t len,
                      mesh_mr_t **out)
{
    struct mesh_mr *mr = malloc(sizeof(*mr));

    (void)t;
    if (!mr)
        return mesh_err(-ENOMEM, "out of memory");
    mr->buf = buf;
    mr->len = len;
    *out = mr;
    return 0;
}

static int tcp_dereg_mr(mesh_transport_t *t, mesh_mr_t *mr)
{
    (void)t;
    free(mr);
    return 0;
}

static int tcp_progress(mesh_transport_t *t)
{
    return tp_progress(&t->super);
}

/* The rank a failed TCP mesh blames (an abort notice's culprit), or -1:
 * not failed, or no one. */
static int tcp_culprit(mesh_transport_t *t)
{
    int culprit;

    pthread_mutex_lock(&t->super.lock);
    culprit = t->super.fail.failed ? t->super.fail.culprit : -1;
    pthread_mutex_unlock(&t->super.lock);
    return culprit;
}

static void tcp_abort(mesh_transport_t *t, int culprit, const char *why)
{
    char me[300], nb[300];

    if (!t)
        return;
    pthread_mutex_lock(&t->super.lock);
    if (culprit >= 0 && culprit < t->super.world.size)
        tp_fail_job(&t->super, culprit, -ECANCELED, 1,
                    "rank %d (%s) aborted the job, blaming rank %d (%s): %s",
                    t->super.world.rank,
                    tcp_pname(t, t->super.world.rank, me, sizeof(me)), culprit,
                    tcp_pname(t, culprit, nb, sizeof(nb)),
                    why ? why : "no reason given");
    else
        tp_fail_job(&t->super, t->super.world.rank, -ECANCELED, 1,
                    "rank %d (%s) aborted the job: %s", t->super.world.rank,
                    tcp_pname(t, t->super.world.rank, me, sizeof(me)),
                    why ? why : "no reason given");
    pthread_mutex_unlock(&t->super.lock);
}

static void tcp_close(mesh_transport_t *t)
{
    struct tp_req *r, *rn;
    struct conn *c, *cn;

    if (!t)
        return;
    if (t->thread_started) {
        pthread_mutex_lock(&t->super.lock);
        t->stopping = 1;
        for (int p = 0; p < t->super.world.size; p++) {
            struct link *l = &t->links[p];

            if (p != t->super.world.rank && l->ctrl && !l->bye)
                tcp_ctrl_send(l->ctrl, TCP_CTRL_BYE, -1, 0, NULL);
        }
        tcp_wake(t);
        pthread_mutex_unlock(&t->super.lock);
        pthread_join(t->thread, NULL);
    }
    if (t->live_sil_ns && getenv("MESHTRAIN_SILENCE_REPORT")) {
        char nb[300];

        mesh_info("tcp: the longest silence of a live peer was %.3f s "
                  "(rank %d, %s; peer timeout %.2f s)",
                  (double)t->live_sil_ns / 1e9, t->live_sil_rank,
                  tcp_pname(t, t->live_sil_rank, nb, sizeof(nb)),
                  t->super.opts.peer_timeout_s);
    }
    /* What the last windows held back is still said. */
    for (int i = 0; i < REFUSE_SOURCES; i++)
        tcp_refuse_flush(&t->refused[i], mesh_now_ns());
    tcp_refuse_flush_all(t, mesh_now_ns());
    for (c = t->hs; c; c = cn) {
        cn = c->hs_next;
        tcp_conn_free(c);
    }
    for (int p = 0; t->links && p < t->super.world.size; p++) {
        struct link *l = &t->links[p];

        tcp_conn_free(l->ctrl);
        for (int s = 0; l->data && s < t->S; s++)
            tcp_conn_free(l->data[s]);
        free(l->data);
        free(l->dial);
    }
    for (r = t->super.reqs; r; r = rn) {
        rn = r->next;
        free(r);
    }
    if (t->listen_ev)
        event_free(t->listen_ev);
    if (t->wake_ev)
        event_free(t->wake_ev);
    if (t->tick_ev)
        event_free(t->tick_ev);
    if (t->base)
        event_base_free(t->base);
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    if (t->kick_fd >= 0)
        close(t->kick_fd);
    if (t->secret) {
        OPENSSL_cleanse(t->secret, t->secret_len);
        free(t->secret);
    }
    free(t->links);
    tp_base_fini(&t->super);
    free(t);
}

const struct mesh_transport_ops mesh_tcp_ops = {
    .name = "tcp",
    .listen = tcp_listen,
    .connect = tcp_connect,
    .reg_mr = tcp_reg_mr,
    .dereg_mr = tcp_dereg_mr,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .test = tcp_test,
    .wait_any = tcp_wait_any,
    .progress = tcp_progress,
    .hold = tcp_hold,
    .abort = tcp_abort,
    .culprit = tcp_culprit,
    .close = tcp_close,
    .seq_done = tcp_seq_done,
    .expect = tcp_expect,
};
