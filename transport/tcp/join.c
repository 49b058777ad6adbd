/*
 * transport/tcp/join.c: joining the mesh: connections, dialing (the higher rank
 * dials the lower, with backoff), accepting (with limits on unauthenticated
 * connections and rate-limited refusal logs), and connect().
 */
#include "config.h"

#include "transport/tcp/tcp-internal.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void dial_failed(struct mesh_transport *t, int peer, int stream);

/* ---- small helpers ------------------------------------------------------- */

/* The length of addr's host part ("1.2.3.4:5" -> 7, "[::1]:5" -> 5). */
static size_t host_len(const char *addr)
{
    const char *colon = strrchr(addr, ':');

    return colon ? (size_t)(colon - addr) : strlen(addr);
}

/* n with thousands separators: 12345 -> "12,345". */
static const char *grouped(uint64_t n, char *buf, size_t len)
{
    char digits[32];
    size_t nd, o = 0;

    nd = (size_t)snprintf(digits, sizeof(digits), "%" PRIu64, n);
    for (size_t i = 0; i < nd && o + 2 < len; i++) {
        if (i && (nd - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

/* Log what a source's window held back, and forget the window. */
void tcp_refuse_flush(struct refuse_src *r, uint64_t now)
{
    char n[40];

    if (r->more)
        mesh_warn("refused connections: ... and %s more from %s in the last "
                  "%.0f s (the latest: %s)",
                  grouped(r->more, n, sizeof(n)), r->host,
                  (double)(now - r->since_ns) / 1e9, r->why);
    r->host[0] = '\0';
    r->more = 0;
    r->logged = 0;
}

/* The same for the limit on all lines. */
void tcp_refuse_flush_all(struct mesh_transport *t, uint64_t now)
{
    char n[40];

    if (t->refused_more)
        mesh_warn("refused connections: ... and %s more in the last %.0f s "
                  "(too many to log each)",
                  grouped(t->refused_more, n, sizeof(n)),
                  (double)(now - t->refused_since_ns) / 1e9);
    t->refused_more = 0;
    t->refused_logged = 0;
    t->refused_since_ns = now;
}

/*
 * Log "refused connection from ADDR: why" (claimed >= 0: "refused rank R
 * (host:port) connecting from ADDR: why"), at most REFUSE_BURST lines per
 * source address and kind of reason in REFUSE_WINDOW_S, and REFUSE_ALL in
 * all; the rest are counted and summed up in one line per source when its
 * window ends (at a tick): a connect flood must not flood the log.
 */
void tcp_refuse_warn(struct mesh_transport *t, const char *addr, int claimed,
                     const char *why)
{
    uint64_t now = mesh_now_ns(), win = (uint64_t)(REFUSE_WINDOW_S * 1e9);
    size_t hl = MESH_MIN(host_len(addr), sizeof(t->refused[0].host) - 1);
    struct refuse_src *r = NULL, *lru = &t->refused[0];
    char kind[sizeof(lru->kind)], line[MSG_MAX], nb[300];
    size_t kl = strcspn(why, "0123456789'\"(");

    if (claimed >= 0)
        snprintf(line, sizeof(line),
                 "refused rank %d (%s) connecting from %s: %s", claimed,
                 tcp_pname(t, claimed, nb, sizeof(nb)), addr, why);
    else
        snprintf(line, sizeof(line), "refused connection from %s: %s", addr,
                 why);
    snprintf(kind, sizeof(kind), "%.*s", (int)kl, why);
    for (int i = 0; i < REFUSE_SOURCES && !r; i++) {
        struct refuse_src *e = &t->refused[i];

        if (e->host[0] && strlen(e->host) == hl && !memcmp(e->host, addr, hl) &&
            !strcmp(e->kind, kind))
            r = e;
        else if (!e->host[0] || (lru->host[0] && e->last_ns < lru->last_ns))
            lru = e;
    }
    if (r && now - r->since_ns >= win)
        tcp_refuse_flush(r, now);
    if (!r || !r->host[0]) {
        if (!r) {
            r = lru;
            if (r->host[0])
                tcp_refuse_flush(r, now);
        }
        memcpy(r->host, addr, hl);
        r->host[hl] = '\0';
        snprintf(r->kind, sizeof(r->kind), "%s", kind);
        r->since_ns = now;
    }
    r->last_ns = now;
    if (now - t->refused_since_ns >= win)
        tcp_refuse_flush_all(t, now);
    if (r->logged < REFUSE_BURST && t->refused_logged < REFUSE_ALL) {
        r->logged++;
        t->refused_logged++;
        mesh_warn("%s%s", line,
                  r->logged == REFUSE_BURST ? " (more like it in the next "
                                              "10 s are counted, not logged)"
                                            : "");
        return;
    }
    if (r->logged < REFUSE_BURST)
        t->refused_more++;
    else
        r->more++;
    snprintf(r->why, sizeof(r->why), "%s", line);
}

/* At a tick: end the windows that are over. */
void tcp_refuse_tick(struct mesh_transport *t, uint64_t now)
{
    uint64_t win = (uint64_t)(REFUSE_WINDOW_S * 1e9);

    for (int i = 0; i < REFUSE_SOURCES; i++)
        if (t->refused[i].host[0] && now - t->refused[i].since_ns >= win)
            tcp_refuse_flush(&t->refused[i], now);
    if (now - t->refused_since_ns >= win)
        tcp_refuse_flush_all(t, now);
}

/* ---- connections --------------------------------------------------------- */

static void hs_add(struct mesh_transport *t, struct conn *c)
{
    c->hs_prev = NULL;
    c->hs_next = t->hs;
    if (t->hs)
        t->hs->hs_prev = c;
    t->hs = c;
    t->nhs++;
}

void tcp_hs_remove(struct mesh_transport *t, struct conn *c)
{
    if (c->hs_prev)
        c->hs_prev->hs_next = c->hs_next;
    else if (t->hs == c)
        t->hs = c->hs_next;
    else
        return;
    if (c->hs_next)
        c->hs_next->hs_prev = c->hs_prev;
    c->hs_next = c->hs_prev = NULL;
    t->nhs--;
}

static struct conn *conn_new(struct mesh_transport *t, int fd, enum role role)
{
    struct conn *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->t = t;
    c->fd = fd;
    c->role = role;
    c->peer = -1;
    c->rev = event_new(t->base, fd, EV_READ | EV_PERSIST, tcp_on_read, c);
    c->wev = event_new(t->base, fd, EV_WRITE | EV_PERSIST, tcp_on_write, c);
    if (!c->rev || !c->wev) {
        if (c->rev)
            event_free(c->rev);
        if (c->wev)
            event_free(c->wev);
        free(c);
        return NULL;
    }
    return c;
}

void tcp_conn_free(struct conn *c)
{
    if (!c)
        return;
    event_free(c->rev);
    event_free(c->wev);
    if (c->fd >= 0)
        close(c->fd);
    tcp_free_pieces(c);
    free(c);
}

/*
 * Stop a connection for good. Handshake connections (progress thread only)
 * are freed, and a dialer's is scheduled for a retry. A READY one is shut
 * down but stays attached to its link, fd open, until mesh close, so that
 * nothing else need track who points at it; from another thread its events
 * go away in their own callbacks, which the shutdown fires.
 */
void tcp_conn_kill(struct conn *c)
{
    struct mesh_transport *t = c->t;

    if (c->state != C_READY) {
        int peer = c->peer, stream = c->stream;
        enum role role = c->role;

        tcp_rev_off(c);
        tcp_wev_off(c);
        tcp_hs_remove(t, c);
        tcp_conn_free(c);
        if (role == ROLE_DIALER)
            dial_failed(t, peer, stream);
        return;
    }
    c->state = C_DEAD;
    tcp_free_pieces(c);
    c->rx_req = NULL;
    shutdown(c->fd, SHUT_RDWR);
    tcp_rev_off(c); /* from another thread: in their own callbacks */
    tcp_wev_off(c);
}

/* Write what is buffered in c->out; on a hard error the reader notices. */
void tcp_conn_flush_out(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                tcp_wev_on(c);
            return;
        }
        c->out_off += (size_t)n;
    }
    c->out_off = c->out_len = 0;
}

void tcp_out_append(struct conn *c, const void *p, size_t n)
{
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + n > sizeof(c->out))
        return; /* cannot happen: handshake messages are bounded */
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

/* ---- joining ------------------------------------------------------------- */

static void dial_failed(struct mesh_transport *t, int peer, int stream)
{
    struct dial *d = &t->links[peer].dial[stream];

    d->active = 0;
    d->failed++;
    d->wait_ns = d->backoff_ns;
    d->next_ns = mesh_now_ns() + d->backoff_ns;
    d->backoff_ns = MESH_MIN(d->backoff_ns * 2, DIAL_BACKOFF_MAX_NS);
    d->addr_i++;
}

static void dial_start(struct mesh_transport *t, int peer, int stream)
{
    struct link *l = &t->links[peer];
    struct dial *d = &l->dial[stream];
    const struct sockaddr *sa;
    struct conn *c;
    int fd, rc;

    if (!l->naddrs)
        return;
    sa = (const struct sockaddr *)&l->addrs[d->addr_i % l->naddrs];
    fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(l->why, sizeof(l->why), "socket: %s", strerror(errno));
        dial_failed(t, peer, stream);
        return;
    }
    /* (accepted connections take it from the listening socket) */
    if (tcp_set_sockopts(t, fd) < 0 || tcp_set_cc(t, fd) < 0) {
        snprintf(l->why, sizeof(l->why), "%s", mesh_err_msg(-EIO));
        close(fd);
        dial_failed(t, peer, stream);
        return;
    }
    c = conn_new(t, fd, ROLE_DIALER);
    if (!c) {
        close(fd);
        dial_failed(t, peer, stream);
        return;
    }
    c->peer = peer;
    c->stream = stream;
    c->state = C_CONNECTING;
    /*
     * Twice the acceptor's deadline: an acceptor that is slow but finishes
     * in time has attached its end before sending its last message, and
     * giving up on that message would break a link it counts as up.
     */
    c->deadline_ns = mesh_now_ns() + (uint64_t)(2 * TCP_HS_DEADLINE_S * 1e9);
    mesh_sockaddr_str(sa, c->addr, sizeof(c->addr));
    d->active = 1;
    hs_add(t, c);
    do {
        rc = connect(fd, sa, l->addr_lens[d->addr_i % l->naddrs]);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0 && errno != EINPROGRESS) {
        snprintf(l->why, sizeof(l->why), "%s", strerror(errno));
        d->refused += errno == ECONNREFUSED;
        tcp_conn_kill(c);
        return;
    }
    tcp_wev_on(c);
}

void tcp_dial_connected(struct conn *c)
{
    struct mesh_transport *t = c->t;
    int err = 0, peer = c->peer;
    socklen_t len = sizeof(err);
    uint8_t hello[TCP_HELLO_LEN];

    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (err == EINPROGRESS)
        return;
    if (err) {
        snprintf(t->links[peer].why, sizeof(t->links[peer].why), "%s",
                 strerror(err));
        t->links[peer].dial[c->stream].refused += err == ECONNREFUSED;
        tcp_conn_kill(c);
        return;
    }
    tcp_wev_off(c);
    if (RAND_bytes(c->nonce, TCP_NONCE_LEN) != 1) {
        snprintf(t->links[peer].why, sizeof(t->links[peer].why),
                 "RAND_bytes failed");
        tcp_conn_kill(c);
        return;
    }
    c->state = C_HS_HELLO;
    c->in_len = 0;
    c->in_need = TCP_HELLO_LEN;
    tcp_hs_hello(t, c, hello);
    tcp_out_append(c, hello, sizeof(hello));
    tcp_conn_flush_out(c);
    tcp_rev_on(c);
}

void tcp_dial_scan(struct mesh_transport *t)
{
    uint64_t now = mesh_now_ns();

    if (!t->joining || t->super.fail.failed)
        return;
    for (int p = 0; p < t->super.world.rank; p++) {
        struct link *l = &t->links[p];

        for (int s = 0; s <= t->S; s++) {
            struct conn *cur = s ? l->data[s - 1] : l->ctrl;
            struct dial *d = &l->dial[s];

            if (cur || d->active || now < d->next_ns)
                continue;
            dial_start(t, p, s);
        }
    }
}

/*
 * Make room for one more pre-authentication connection from src (its
 * "host:port"), MaxStartups-style, so that idle clients cannot keep a peer
 * out. Over the per-source limit the set is src's connections, over the
 * budget all of them; one of the set goes:
 *   - the oldest idle one (nothing received) past TCP_HS_GRACE_S, or of
 *     any age when the newcomer has sent bytes already (busy);
 *   - for a busy newcomer, else the oldest busy one past the grace.
 * A peer sends its HELLO as soon as its connect completes, usually before
 * we accept it: clients that never send cannot outnumber it, however fast
 * they reconnect. Returns 0, or -1: no room (refuse the newcomer).
 */
static int hs_make_room(struct mesh_transport *t, const char *src, int busy,
                        uint64_t now)
{
    int budget =
        MESH_MAX(TCP_HS_PENDING_MAX, 2 * t->super.world.size * (t->S + 1));
    int per_src =
        MESH_MAX(TCP_HS_PER_SOURCE_MAX, 2 * t->super.world.size * (t->S + 1));
    uint64_t grace = (uint64_t)(TCP_HS_GRACE_S * 1e9),
             life = (uint64_t)(TCP_HS_DEADLINE_S * 1e9);
    size_t sl = host_len(src);

    for (;;) {
        struct conn *c, *v, *idle[2] = {NULL, NULL}, *old[2] = {NULL, NULL};
        int n_all = 0, n_src = 0, k;

        /* t->hs runs newest first: the last match is the oldest. */
        for (c = t->hs; c; c = c->hs_next) {
            int same, aged;

            if (c->role != ROLE_ACCEPTOR)
                continue;
            same = host_len(c->addr) == sl && !memcmp(c->addr, src, sl);
            n_all++;
            n_src += same;
            aged = now + life - c->deadline_ns >= grace;
            for (k = 0; k < 1 + same; k++) {
                if (c->state == C_HS_HELLO && c->in_len == 0) {
                    if (aged || busy)
                        idle[k] = c;
                } else if (aged && busy) {
                    old[k] = c;
                }
            }
        }
        if (n_src >= per_src)
            k = 1;
        else if (n_all >= budget)
            k = 0;
        else
            return 0;
        v = idle[k] ? idle[k] : old[k];
        if (!v)
            return -1;
        mesh_debug("dropped connection from %s for one from %s: too many "
                   "unauthenticated connections (%d of %d, %d of %d from "
                   "its host)",
                   v->addr, src, n_all, budget, n_src, per_src);
        tcp_conn_kill(v);
    }
}

void tcp_on_accept(evutil_socket_t lfd, short what, void *arg)
{
    struct mesh_transport *t = arg;
    struct sockaddr_storage ss;
    socklen_t sl;
    struct conn *c;
    int fd;

    (void)what;
    pthread_mutex_lock(&t->super.lock);
    if (t->super.fail.failed && t->super.opts.listen_fd >= 0) {
        /*
         * A failed mesh on a kept listening socket (--elastic: its view
         * is changing) accepts no more: a peer that dials for the next
         * view waits in the backlog for this peer's next mesh. Accepted
         * here, it was refused (this mesh's view is the earlier) and
         * backed off; the agreement is often done by then.
         */
        event_del(t->listen_ev);
        pthread_mutex_unlock(&t->super.lock);
        return;
    }
    for (;;) {
        char addr[96], peek;
        ssize_t n;

        sl = sizeof(ss);
        fd = accept4(lfd, (struct sockaddr *)&ss, &sl,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                /* Out of descriptors or memory: the listening socket
                 * stays readable, so rest until the next tick rather
                 * than spin. */
                mesh_warn("accept on port %u: %s; pausing accepts",
                          (unsigned)t->super.peers[t->super.world.rank].port,
                          strerror(errno));
                event_del(t->listen_ev);
                t->accept_paused = 1;
            }
            break;
        }
        mesh_sockaddr_str((struct sockaddr *)&ss, addr, sizeof(addr));
        /* Whether it has sent something already (a peer's HELLO). */
        do
            n = recv(fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (t->stopping || hs_make_room(t, addr, n > 0, mesh_now_ns()) < 0) {
            tcp_refuse_warn(t, addr, -1,
                            t->stopping ? "closing"
                                        : "too many handshakes in progress");
            close(fd);
            continue;
        }
        if (tcp_set_sockopts(t, fd) < 0 ||
            !(c = conn_new(t, fd, ROLE_ACCEPTOR))) {
            tcp_refuse_warn(t, addr, -1, mesh_err_msg(-ENOMEM));
            close(fd);
            continue;
        }
        snprintf(c->addr, sizeof(c->addr), "%s", addr);
        if (RAND_bytes(c->nonce, TCP_NONCE_LEN) != 1) {
            tcp_refuse_warn(t, addr, -1, "RAND_bytes failed");
            tcp_conn_free(c);
            continue;
        }
        c->state = C_HS_HELLO;
        c->in_need = TCP_HELLO_LEN;
        c->deadline_ns = mesh_now_ns() + (uint64_t)(TCP_HS_DEADLINE_S * 1e9);
        hs_add(t, c);
        tcp_rev_on(c);
    }
    pthread_mutex_unlock(&t->super.lock);
}

/* ---- operations ---------------------------------------------------------- */

static int resolve_peers(struct mesh_transport *t)
{
    for (int p = 0; p < t->super.world.rank; p++) {
        struct link *l = &t->links[p];
        struct addrinfo hints, *res = NULL, *ai;
        char port[16], nb[300];
        int rc;

        if (l->naddrs)
            continue;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        snprintf(port, sizeof(port), "%u", (unsigned)t->super.peers[p].port);
        rc = getaddrinfo(t->super.peers[p].host, port, &hints, &res);
        if (rc)
            return mesh_err(-EHOSTUNREACH,
                            "rank %d (%s): cannot resolve "
                            "host: %s",
                            p, tcp_pname(t, p, nb, sizeof(nb)),
                            gai_strerror(rc));
        for (ai = res; ai && l->naddrs < ADDRS_MAX; ai = ai->ai_next) {
            if (ai->ai_addrlen > sizeof(l->addrs[0]))
                continue;
            memcpy(&l->addrs[l->naddrs], ai->ai_addr, ai->ai_addrlen);
            l->addr_lens[l->naddrs++] = ai->ai_addrlen;
        }
        freeaddrinfo(res);
        if (!l->naddrs)
            return mesh_err(-EHOSTUNREACH, "rank %d (%s): no usable address", p,
                            tcp_pname(t, p, nb, sizeof(nb)));
    }
    return 0;
}

int tcp_connect(mesh_transport_t *t)
{
    uint64_t deadline;
    int rc = 0;

    rc = resolve_peers(t);
    if (rc < 0)
        return rc;
    deadline = mesh_now_ns() + (uint64_t)(t->super.opts.join_timeout_s * 1e9);
    pthread_mutex_lock(&t->super.lock);
    t->joining = 1;
    tcp_wake(t);
    for (;;) {
        struct timespec ts;
        uint64_t now;

        if (t->super.fail.failed) {
            rc = tp_fail_err(&t->super);
            break;
        }
        if (t->join_err[0]) {
            rc = mesh_err(-ECONNREFUSED, "%s", t->join_err);
            break;
        }
        if (t->nlinks_ready == t->super.world.size - 1)
            break;
        now = mesh_now_ns();
        if (now >= deadline) {
            char msg[MSG_MAX], nb[300];
            size_t n;

            n = (size_t)snprintf(msg, sizeof(msg),
                                 "join timed out after %.1f s; never joined:",
                                 t->super.opts.join_timeout_s);
            for (int p = 0; p < t->super.world.size && n < sizeof(msg); p++) {
                struct link *l = &t->links[p];

                if (p == t->super.world.rank || l->ready)
                    continue;
                n += (size_t)snprintf(
                    msg + n, sizeof(msg) - n, " rank %d (%s%s%s)", p,
                    tcp_pname(t, p, nb, sizeof(nb)), l->why[0] ? ": " : "",
                    p < t->super.world.rank ? l->why : "");
            }
            rc = mesh_err(-ETIMEDOUT, "%s", msg);
            break;
        }
        ts.tv_sec =
            (time_t)(MESH_MIN(deadline, now + 100000000ull) / 1000000000ull);
        ts.tv_nsec =
            (long)(MESH_MIN(deadline, now + 100000000ull) % 1000000000ull);
        pthread_cond_timedwait(&t->super.cond, &t->super.lock, &ts);
    }
    t->joining = 0;
    if (!rc)
        tcp_log_cc(t);
    pthread_mutex_unlock(&t->super.lock);
    if (!rc) {
        unsigned failed = 0, refused = 0;
        uint64_t wait = 0;

        /* what the dial backoff may have cost: a link's last wait after
         * a refused attempt bounds the time its peer was up unseen */
        for (int p = 0; p < t->super.world.rank; p++)
            for (int s = 0; s <= t->S; s++) {
                failed += t->links[p].dial[s].failed;
                refused += t->links[p].dial[s].refused;
                wait = MESH_MAX(wait, t->links[p].dial[s].failed
                                          ? t->links[p].dial[s].wait_ns
                                          : 0);
            }
        mesh_debug("tcp: rank %d joined the mesh (%d peers, %d data streams "
                   "per link); %u dial(s) failed first (%u refused: "
                   "nothing listened), the longest last wait %.3f s",
                   t->super.world.rank, t->super.world.size - 1, t->S, failed,
                   refused, (double)wait / 1e9);
    }
    return rc;
}
