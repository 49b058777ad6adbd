/*
 * transport/tcp.c: the TCP transport (mesh_tcp_ops).
 *
 * One progress thread per transport runs a libevent loop over raw
 * non-blocking sockets. Every piece of state below the transport lives under
 * one mutex (t->lock): the progress thread takes it in each callback, the
 * caller's thread in each operation. The caller's thread may write to a
 * socket directly (isend on an idle stream: no thread hand-off on the
 * latency path), and while it waits it reads and writes the data streams
 * itself: first a short spin, then blocked in poll() on those sockets (and
 * on an eventfd the progress thread writes when it completes a request or
 * the job fails), so that arriving bytes wake the waiter directly. It may
 * add events, but never deletes one (event_del would wait for a callback
 * that waits for our lock): the progress thread deletes events only from
 * its own callbacks. A data stream's read and write events go off while a
 * waiter does its I/O, and while a collective's executor holds the
 * transport between two of its waits (tcp_hold): no wake-up of the
 * progress thread per message. They come back when the last waiter or
 * holder leaves with sends still queued, when a waiter sleeps on the
 * condition variable instead, or at the next tick.
 *
 * Payload moves with sendmsg/recv straight between the caller's buffers and
 * the kernel: a data stream reads a frame header (48 bytes) into the
 * connection, matches it against the posted receives, then reads the
 * payload into the receive's buffer. A header with no posted receive parks
 * its stream (the read event is removed) until irecv posts one. Messages of
 * 512 KiB and more are striped over the data streams in 4 KiB-aligned
 * slices; smaller ones go whole, round-robin.
 *
 * Matching, precisely: a frame belongs to the posted receive from its peer
 * with the same (seq, tag) whose range holds the frame's first byte (the
 * earliest posted wins). Different op, dtype or count: desync. Its end
 * past the receive's range, or past the bytes still unclaimed: the link is
 * closed before any payload byte is read. No such receive: the stream
 * parks (a later receive for another slice of the same (seq, tag) is fine).
 *
 * The configuration fingerprint covers opts->config plus the transport's
 * own "transport.streams=S" line, so peers must agree on the stream count.
 *
 * Failure codes (the job's failure, returned by every later operation):
 *   -ECONNRESET    a peer closed or reset a connection, or left (goodbye)
 *                  with operations pending
 *   -EHOSTDOWN     a peer was silent past the peer timeout
 *   -EPROTO        desync, out-of-range frame, or garbage from a peer
 *   -ECANCELED     abort() was called (here or on the peer that said so)
 *   -ECONNABORTED  an abort notice with an unknown code
 * connect() also returns -ETIMEDOUT (join timeout, listing the ranks that
 * never joined) and -ECONNREFUSED (a peer's configuration differs).
 *
 * Tuning knobs for experiments (environment): MESHTRAIN_TCP_SPIN_US, how
 * long wait_any spins, reading the data streams itself, before it blocks
 * (default 200; 0: never); MESHTRAIN_TCP_POLL=0, block on the condition
 * variable (the progress thread does the I/O) instead of in poll();
 * MESHTRAIN_TCP_SOCKBUF, fixed SO_SNDBUF/SO_RCVBUF
 * bytes (default: the kernel's autotuning, which measured as fast or faster
 * on loopback).
 *
 * Wire formats and the handshake: transport/tcp-internal.h.
 */
#include "config.h"

#include "transport/tcp-internal.h"
#include "transport/transport.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* How long wait_any spins (MESHTRAIN_TCP_SPIN_US overrides). */
#define TCP_SPIN_DEFAULT_S 200e-6
/* Messages at least this long are striped over the data streams. */
#define STRIPE_MIN (512u * 1024u)
/* Bytes one callback moves before it yields to other sockets. */
#define IO_BUDGET (4u * 1024u * 1024u)
/* How long a broken data stream waits for its control connection. */
#define LOST_GRACE_S 0.5
/* Dial retry backoff. */
#define DIAL_BACKOFF_MIN_NS 10000000ull   /* 10 ms */
#define DIAL_BACKOFF_MAX_NS 1000000000ull /* 1 s */
#define ADDRS_MAX           4
#define OUTBUF_LEN          (TCP_CONFIG_WIRE_MAX + 4 * TCP_CTRL_LEN + 256)
#define INBUF_LEN           (TCP_CONFIG_WIRE_MAX + 8)
#define MSG_MAX             1024
/* Refused connections: lines logged per window for one source address
 * and kind of refusal, and for all; how many (source, kind) pairs are
 * tracked (the least recent one makes room). */
#define REFUSE_WINDOW_S 10.0
#define REFUSE_BURST    5
#define REFUSE_ALL      100
#define REFUSE_SOURCES  64

enum role { ROLE_DIALER = 'D', ROLE_ACCEPTOR = 'A' };

enum cstate {
    C_CONNECTING, /* dialer: non-blocking connect in progress */
    C_HS_HELLO,   /* reading the peer's HELLO */
    C_HS_AUTH,    /* reading the peer's AUTH */
    C_HS_CFGLEN,  /* fingerprints differ: reading the config length */
    C_HS_CFG,     /* ... and the config text */
    C_READY,      /* authenticated, attached to its link */
    C_DEAD,       /* closed or given up; events removed */
};

struct piece {
    struct piece *next;
    struct mesh_req *req;
    uint64_t seq;   /* the frame's seq and send order (mesh_frame), */
    uint32_t order; /* by which txq_insert places it */
    uint8_t hdr[TCP_FRAME_HDR_LEN];
    const uint8_t *buf; /* payload */
    uint64_t len;       /* payload bytes */
    uint64_t sent;      /* header + payload bytes written */
};

struct conn {
    struct mesh_transport *t;
    int fd;
    struct event *rev, *wev;
    int rev_on, wev_on;
    enum role role;
    int peer;   /* -1 until the acceptor has read a HELLO */
    int stream; /* 0 control, 1..S data */
    enum cstate state;
    uint64_t deadline_ns; /* handshake deadline */
    char addr[96];        /* the remote socket address, for messages */
    struct conn *hs_next, *hs_prev; /* handshakes in progress */

    /* handshake */
    uint8_t nonce[TCP_NONCE_LEN];      /* ours */
    uint8_t peer_nonce[TCP_NONCE_LEN]; /* theirs */
    uint8_t peer_fp[TCP_FP_LEN];

    /* bytes in (handshake and control messages) */
    uint8_t in[INBUF_LEN];
    size_t in_len, in_need;
    /* bytes out (handshake and control messages) */
    uint8_t out[OUTBUF_LEN];
    size_t out_len, out_off;

    /* data stream, receiving: a header, then its payload */
    uint8_t hdr[TCP_FRAME_HDR_LEN];
    size_t hdr_got;
    int parked;              /* header read, no posted receive yet */
    int spin_lost;           /* a waiter's read found it broken */
    struct mesh_frame rx_f;  /* the header */
    struct mesh_req *rx_req; /* where its payload goes */
    uint8_t *rx_dst;
    uint64_t rx_left;

    /* data stream, sending */
    struct piece *txq, *txq_tail;
    uint64_t tx_queued; /* payload bytes queued */
};

struct dial {
    int active;       /* a connection attempt exists */
    uint64_t next_ns; /* next attempt not before */
    uint64_t backoff_ns;
    unsigned addr_i;
};

struct link {
    struct conn *ctrl;  /* stream 0 */
    struct conn **data; /* (S) streams 1..S */
    int nready;         /* connections READY (of S + 1) */
    int ready;          /* all S + 1 are READY */
    int bye;            /* the peer closed the mesh normally */
    uint64_t last_rx_ns;
    uint64_t tx_ns;          /* last bytes sent on any of its connections */
    struct mesh_req *posted; /* receives posted, not yet complete */
    unsigned rr;             /* next data stream for a message */
    struct dial *dial;       /* (S + 1), dialers only */
    struct sockaddr_storage addrs[ADDRS_MAX];
    socklen_t addr_lens[ADDRS_MAX];
    unsigned naddrs;
    char why[160]; /* last reason a dial failed, for the join error */
    /* A data stream broke while the control connection still stands: the
     * verdict waits (LOST_GRACE) for a goodbye or abort notice that may
     * travel behind it on the other connection. */
    uint64_t lost_ns;
    char lost_why[160];
};

/* One source address's refusals of one kind in the current window. */
struct refuse_src {
    char host[96];     /* address without the port; "" = unused */
    char kind[48];     /* the reason's words before any number or quote */
    uint64_t since_ns; /* the window's start */
    uint64_t last_ns;  /* the latest refusal */
    unsigned logged;   /* lines logged in the window */
    uint64_t more;     /* refusals not logged in the window */
    char why[160];     /* the latest unlogged one's reason */
};

enum req_kind { REQ_SEND, REQ_RECV };

struct mesh_req {
    enum req_kind kind;
    int peer;
    struct mesh_frame f;
    uint8_t *buf;
    atomic_int done;
    int pieces_left;                /* send: pieces not fully written */
    uint64_t got;                   /* recv: payload bytes arrived */
    uint64_t reserved;              /* recv: bytes claimed by matched headers */
    int frames;                     /* recv: headers matched */
    int posted;                     /* recv: on its link's posted list */
    struct mesh_req *pnext, *pprev; /* link's posted list */
    struct mesh_req *next, *prev;   /* the transport's request list */
};

struct mesh_mr {
    void *buf;
    size_t len;
};

struct mesh_transport {
    struct mesh_world world;
    struct mesh_peer *peers;
    struct mesh_transport_opts opts;
    uint8_t *secret;
    size_t secret_len;
    int S;                            /* data streams per link */
    char config[TCP_CONFIG_WIRE_MAX]; /* opts->config + transport keys */
    size_t config_len;
    uint8_t fp[TCP_FP_LEN];

    int listen_fd;
    struct event_base *base;
    struct event *listen_ev, *wake_ev, *tick_ev;
    pthread_t thread;
    int thread_started;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct link *links; /* (size) */
    struct conn *hs;    /* handshakes in progress */
    int nhs;
    struct mesh_req *reqs; /* every request not yet freed */
    int joining;
    int nlinks_ready;
    char join_err[MSG_MAX]; /* a permanent join failure */
    int stopping;
    int accept_paused; /* accept failed hard; resume at a tick */
    uint64_t tick_ns;  /* when the last tick ran, 0 before the first */
    struct refuse_src refused[REFUSE_SOURCES]; /* log rate limits */
    uint64_t refused_since_ns;                 /* REFUSE_ALL's window */
    unsigned refused_logged;                   /* lines in it */
    uint64_t refused_more;                     /* refusals beyond them */
    int failed;
    int fail_code;
    int culprit;
    char fail_msg[MSG_MAX];
    double spin_s; /* wait_any spins this long first */
    atomic_int spinning; /* waiters reading the data streams themselves */
    atomic_int sleepers; /* waiters asleep on cond */
    int poll_wait;       /* after the spin, waiters poll() the streams */
    int kick_fd;         /* eventfd: wakes waiters blocked in poll() */
    atomic_int pollers;  /* waiters blocked in (or about to enter) poll() */
    atomic_int deferred; /* a stream's writing was left to a waiter */
    atomic_int holders;  /* threads in hold(): they come back to wait */
};

/* Set while this thread does a waiter's I/O (its completions need no kick). */
static _Thread_local int in_waiter_io;

static void conn_kill(struct conn *c);
static void dial_failed(struct mesh_transport *t, int peer, int stream);
static void conn_flush_out(struct conn *c);
static int conn_write(struct conn *c);
static void ctrl_read(struct conn *c);
static void on_read(evutil_socket_t fd, short what, void *arg);
static void spin_release(struct mesh_transport *t);
static void on_write(evutil_socket_t fd, short what, void *arg);

/* ---- small helpers ------------------------------------------------------ */

static const char *pname(struct mesh_transport *t, int r, char *buf, size_t len)
{
    return mesh_peer_name(&t->world, r, buf, len);
}

/* Copy at most len bytes of untrusted text, replacing non-printables. */
static void clean_text(char *dst, size_t dstlen, const uint8_t *src, size_t len)
{
    size_t i, n = 0;

    for (i = 0; i < len && src[i] && n + 1 < dstlen; i++)
        dst[n++] = (src[i] >= 0x20 && src[i] < 0x7f) ? (char)src[i] : '?';
    dst[n] = '\0';
}

static void sockaddr_str(const struct sockaddr *sa, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;

    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const void *)sa;

        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
            inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], host, sizeof(host));
        else
            inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
        port = ntohs(s6->sin6_port);
        if (strchr(host, ':')) {
            snprintf(buf, len, "[%s]:%u", host, port);
            return;
        }
    } else if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const void *)sa;

        inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
        port = ntohs(s4->sin_port);
    }
    snprintf(buf, len, "%s:%u", host, port);
}

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
static void refuse_flush(struct refuse_src *r, uint64_t now)
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
static void refuse_flush_all(struct mesh_transport *t, uint64_t now)
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
static void refuse_warn(struct mesh_transport *t, const char *addr, int claimed,
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
                 pname(t, claimed, nb, sizeof(nb)), addr, why);
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
        refuse_flush(r, now);
    if (!r || !r->host[0]) {
        if (!r) {
            r = lru;
            if (r->host[0])
                refuse_flush(r, now);
        }
        memcpy(r->host, addr, hl);
        r->host[hl] = '\0';
        snprintf(r->kind, sizeof(r->kind), "%s", kind);
        r->since_ns = now;
    }
    r->last_ns = now;
    if (now - t->refused_since_ns >= win)
        refuse_flush_all(t, now);
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
static void refuse_tick(struct mesh_transport *t, uint64_t now)
{
    uint64_t win = (uint64_t)(REFUSE_WINDOW_S * 1e9);

    for (int i = 0; i < REFUSE_SOURCES; i++)
        if (t->refused[i].host[0] && now - t->refused[i].since_ns >= win)
            refuse_flush(&t->refused[i], now);
    if (now - t->refused_since_ns >= win)
        refuse_flush_all(t, now);
}

static void wake(struct mesh_transport *t)
{
    event_active(t->wake_ev, EV_READ, 0);
}

/* Wake the waiters blocked in poll(); all: even from a waiter's own I/O
 * (another waiter may be blocked). */
static void kick(struct mesh_transport *t, int all)
{
    int n = atomic_load(&t->pollers);
    uint64_t one = 1;
    ssize_t w;

    /* A waiter's own I/O counts it among the pollers. */
    if (!n || (in_waiter_io && n == 1 && !all))
        return;
    do
        w = write(t->kick_fd, &one, sizeof(one));
    while (w < 0 && errno == EINTR);
}

static void rev_on(struct conn *c)
{
    if (!c->rev_on && c->state != C_DEAD) {
        event_add(c->rev, NULL);
        c->rev_on = 1;
    }
}

static void wev_on(struct conn *c)
{
    if (!c->wev_on && c->state != C_DEAD) {
        event_add(c->wev, NULL);
        c->wev_on = 1;
    }
}

/* Whether this is the progress thread (or no progress thread runs yet). */
static int on_progress_thread(const struct mesh_transport *t)
{
    return !t->thread_started || pthread_equal(pthread_self(), t->thread);
}

/* Data connection i of the mesh, i in [0, world size x S): link i / S,
 * stream i % S; NULL for this rank's own slot or one not made yet. */
static struct conn *data_conn(const struct mesh_transport *t, int i)
{
    const struct link *l = &t->links[i / t->S];

    return i / t->S == t->world.rank || !l->data ? NULL : l->data[i % t->S];
}

/* The progress thread deletes events (see the top of the file); from any
 * other thread these do nothing, and the event, when it fires, finds
 * nothing to do and goes away in its own callback. */
static void rev_off(struct conn *c)
{
    if (c->rev_on && on_progress_thread(c->t)) {
        event_del(c->rev);
        c->rev_on = 0;
    }
}

static void wev_off(struct conn *c)
{
    if (c->wev_on && on_progress_thread(c->t)) {
        event_del(c->wev);
        c->wev_on = 0;
    }
}

/* The words of /proc/sys/net/ipv4/NAME, or "unknown". */
static const char *proc_ipv4(const char *name, char *buf, size_t len)
{
    char path[128];
    FILE *f;
    size_t n = 0;

    snprintf(path, sizeof(path), "/proc/sys/net/ipv4/%s", name);
    f = fopen(path, "re");
    if (f) {
        n = fread(buf, 1, len - 1, f);
        fclose(f);
    }
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        n--;
    buf[n] = 0;
    return n ? buf : "unknown";
}

int mesh_tcp_cc_check(const char *name)
{
    char list[512];
    size_t len = name ? strnlen(name, MESH_TCP_CC_MAX) : 0;
    int fd, rc = 0;

    if (!len || len >= MESH_TCP_CC_MAX ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789_-") != len)
        return mesh_err(-EINVAL,
                        "TCP congestion control '%.*s%s': expected a name "
                        "of 1 to %d letters, digits, '_' or '-', such as "
                        "cubic",
                        (int)len, name ? name : "",
                        len >= MESH_TCP_CC_MAX ? "..." : "",
                        MESH_TCP_CC_MAX - 1);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mesh_err_errno("TCP congestion control '%s': socket", name);
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)len) <
        0) {
        if (errno == ENOENT)
            rc = mesh_err(-ENOENT,
                          "TCP congestion control '%s': this kernel has "
                          "none by that name (available: %s; a module may "
                          "add it: modprobe tcp_%s)",
                          name,
                          proc_ipv4("tcp_available_congestion_control", list,
                                    sizeof(list)),
                          name);
        else if (errno == EPERM)
            rc = mesh_err(-EPERM,
                          "TCP congestion control '%s': not allowed for "
                          "this process (allowed: %s; root can add it to "
                          "net.ipv4.tcp_allowed_congestion_control)",
                          name,
                          proc_ipv4("tcp_allowed_congestion_control", list,
                                    sizeof(list)));
        else
            rc = mesh_err_errno("TCP congestion control '%s': setsockopt "
                                "TCP_CONGESTION",
                                name);
    }
    close(fd);
    return rc;
}

/* --tcp-congestion on fd, if one was given. */
static int set_cc(struct mesh_transport *t, int fd)
{
    int rc = 0;

    if (t->opts.tcp_cc[0])
        MESH_SYSCALL(rc,
                     setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION,
                                t->opts.tcp_cc,
                                (socklen_t)strlen(t->opts.tcp_cc)),
                     out, "setsockopt TCP_CONGESTION %s", t->opts.tcp_cc);
out:
    return rc;
}

static int set_sockopts(struct mesh_transport *t, int fd)
{
    int one = 1, rc = 0;
    const char *env = getenv("MESHTRAIN_TCP_SOCKBUF");

    (void)t;
    MESH_SYSCALL(rc,
                 setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)),
                 out, "setsockopt TCP_NODELAY");
    if (env && atoi(env) > 0) {
        int sz = atoi(env);

        MESH_SYSCALL(rc, setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)),
                     out, "setsockopt SO_SNDBUF");
        MESH_SYSCALL(rc, setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz)),
                     out, "setsockopt SO_RCVBUF");
    }
out:
    return rc;
}

/* ---- requests ----------------------------------------------------------- */

static void req_link(struct mesh_transport *t, struct mesh_req *r)
{
    r->prev = NULL;
    r->next = t->reqs;
    if (t->reqs)
        t->reqs->prev = r;
    t->reqs = r;
}

static void req_unlink(struct mesh_transport *t, struct mesh_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        t->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
}

static void posted_remove(struct link *l, struct mesh_req *r)
{
    if (!r->posted)
        return;
    if (r->pprev)
        r->pprev->pnext = r->pnext;
    else
        l->posted = r->pnext;
    if (r->pnext)
        r->pnext->pprev = r->pprev;
    r->posted = 0;
}

static void req_complete(struct mesh_transport *t, struct mesh_req *r)
{
    if (r->kind == REQ_RECV)
        posted_remove(&t->links[r->peer], r);
    atomic_store_explicit(&r->done, 1, memory_order_release);
    pthread_cond_broadcast(&t->cond);
    kick(t, 0);
}

/* ---- failure --------------------------------------------------------------
 */

static void ctrl_send(struct conn *c, uint32_t type, int culprit, int code,
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
    conn_flush_out(c);
}

static void free_pieces(struct conn *c)
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
 * Fail the job: record the message (reason + the operation in flight),
 * drop every queued piece and posted receive, tell the other peers
 * (notify), wake every waiter. The first failure wins.
 */
static void fail_job(struct mesh_transport *t, int culprit, int code,
                     int notify, const char *fmt, ...) MESH_PRINTF(5, 6);

static void fail_job(struct mesh_transport *t, int culprit, int code,
                     int notify, const char *fmt, ...)
{
    char reason[MSG_MAX / 2], nb[300];
    struct mesh_req *r, *inflight = NULL;
    va_list ap;
    int p;

    if (t->failed)
        return;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    /* The oldest pending operation involving the culprit, else the
     * oldest of all (the list runs newest first). */
    for (r = t->reqs; r; r = r->next) {
        if (atomic_load(&r->done))
            continue;
        if (!inflight || r->peer == culprit || inflight->peer != culprit)
            inflight = r;
    }
    if (inflight)
        mesh_failure_msg(t->fail_msg, sizeof(t->fail_msg), reason,
                         &inflight->f, inflight->kind == REQ_SEND,
                         inflight->peer,
                         pname(t, inflight->peer, nb, sizeof(nb)));
    else
        mesh_failure_msg(t->fail_msg, sizeof(t->fail_msg), reason, NULL, 0,
                         -1, NULL);
    t->failed = 1;
    t->fail_code = code;
    t->culprit = culprit;
    mesh_error_log("%s", t->fail_msg);

    for (p = 0; p < t->world.size; p++) {
        struct link *l = &t->links[p];

        if (p == t->world.rank)
            continue;
        for (int s = 0; s < t->S; s++) {
            struct conn *c = l->data[s];

            if (!c)
                continue;
            free_pieces(c);
            c->rx_req = NULL;
        }
        l->posted = NULL;
        /* The culprit too: a desync names both sides to both. */
        if (notify && !l->bye)
            ctrl_send(l->ctrl, TCP_CTRL_ABORT, culprit, code, reason);
    }
    for (r = t->reqs; r; r = r->next)
        r->posted = 0;
    pthread_cond_broadcast(&t->cond);
    kick(t, 1);
    wake(t);
}

static int fail_err(struct mesh_transport *t)
{
    return mesh_err(t->fail_code, "%s", t->fail_msg);
}

/* ---- connections ----------------------------------------------------------
 */

static void hs_add(struct mesh_transport *t, struct conn *c)
{
    c->hs_prev = NULL;
    c->hs_next = t->hs;
    if (t->hs)
        t->hs->hs_prev = c;
    t->hs = c;
    t->nhs++;
}

static void hs_remove(struct mesh_transport *t, struct conn *c)
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
    c->rev = event_new(t->base, fd, EV_READ | EV_PERSIST, on_read, c);
    c->wev = event_new(t->base, fd, EV_WRITE | EV_PERSIST, on_write, c);
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

static void conn_free(struct conn *c)
{
    if (!c)
        return;
    event_free(c->rev);
    event_free(c->wev);
    if (c->fd >= 0)
        close(c->fd);
    free_pieces(c);
    free(c);
}

/*
 * Stop a connection for good. Handshake connections (progress thread only)
 * are freed, and a dialer's is scheduled for a retry. A READY one is shut
 * down but stays attached to its link, fd open, until mesh close, so that
 * nothing else need track who points at it; from another thread its events
 * go away in their own callbacks, which the shutdown fires.
 */
static void conn_kill(struct conn *c)
{
    struct mesh_transport *t = c->t;

    if (c->state != C_READY) {
        int peer = c->peer, stream = c->stream;
        enum role role = c->role;

        rev_off(c);
        wev_off(c);
        hs_remove(t, c);
        conn_free(c);
        if (role == ROLE_DIALER)
            dial_failed(t, peer, stream);
        return;
    }
    c->state = C_DEAD;
    free_pieces(c);
    c->rx_req = NULL;
    shutdown(c->fd, SHUT_RDWR);
    rev_off(c); /* from another thread: in their own callbacks */
    wev_off(c);
}

/* Write what is buffered in c->out; on a hard error the reader notices. */
static void conn_flush_out(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                wev_on(c);
            return;
        }
        c->out_off += (size_t)n;
    }
    c->out_off = c->out_len = 0;
}

static void out_append(struct conn *c, const void *p, size_t n)
{
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + n > sizeof(c->out))
        return; /* cannot happen: handshake messages are bounded */
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

/* ---- handshake --------------------------------------------------------------
 */

static void hello_encode(struct mesh_transport *t, struct conn *c, uint8_t *m)
{
    memset(m, 0, TCP_HELLO_LEN);
    mesh_put_le32(m, TCP_HS_MAGIC);
    mesh_put_le32(m + 4, TCP_PROTO_VERSION);
    mesh_put_le32(m + 8, (uint32_t)t->world.size);
    mesh_put_le32(m + 12, (uint32_t)t->world.rank);
    mesh_put_le32(m + 16, (uint32_t)c->stream);
    mesh_put_le32(m + 20, t->secret ? 0 : TCP_HELLO_INSECURE);
    memcpy(m + 24, t->opts.job_id, strnlen(t->opts.job_id, MESH_JOB_MAX));
    memcpy(m + 24 + MESH_JOB_MAX, t->fp, TCP_FP_LEN);
    memcpy(m + 24 + MESH_JOB_MAX + TCP_FP_LEN, c->nonce, TCP_NONCE_LEN);
}

/*
 * The proof for one role: HMAC-SHA256 over a transcript that binds both
 * nonces, both ranks, the stream, the role and both fingerprints, so that
 * no answer can be replayed or reflected.
 */
static int auth_mac(struct mesh_transport *t, struct conn *c, enum role who,
                    uint8_t *mac)
{
    uint8_t msg[16 + 1 + 2 * TCP_NONCE_LEN + 12 + 2 * TCP_FP_LEN];
    const uint8_t *nd, *na, *fd, *fa;
    uint32_t rd, ra;
    unsigned int maclen = 0;
    size_t n = 0;

    if (c->role == ROLE_DIALER) {
        nd = c->nonce;
        na = c->peer_nonce;
        fd = t->fp;
        fa = c->peer_fp;
        rd = (uint32_t)t->world.rank;
        ra = (uint32_t)c->peer;
    } else {
        nd = c->peer_nonce;
        na = c->nonce;
        fd = c->peer_fp;
        fa = t->fp;
        rd = (uint32_t)c->peer;
        ra = (uint32_t)t->world.rank;
    }
    memcpy(msg, "meshtrain-auth1", 16);
    n = 16;
    msg[n++] = (uint8_t)who;
    memcpy(msg + n, nd, TCP_NONCE_LEN);
    n += TCP_NONCE_LEN;
    memcpy(msg + n, na, TCP_NONCE_LEN);
    n += TCP_NONCE_LEN;
    mesh_put_le32(msg + n, rd);
    mesh_put_le32(msg + n + 4, ra);
    mesh_put_le32(msg + n + 8, (uint32_t)c->stream);
    n += 12;
    memcpy(msg + n, fd, TCP_FP_LEN);
    n += TCP_FP_LEN;
    memcpy(msg + n, fa, TCP_FP_LEN);
    n += TCP_FP_LEN;
    if (!t->secret) {
        memset(mac, 0, TCP_MAC_LEN);
        return 0;
    }
    if (!HMAC(EVP_sha256(), t->secret, (int)t->secret_len, msg, n, mac,
              &maclen) ||
        maclen != TCP_MAC_LEN)
        return mesh_err(-EIO, "HMAC-SHA256 failed");
    return 0;
}

/* Find "key=" line by line; the value goes to val, vlen (NULL: absent). */
static void config_get(const char *cfg, size_t len, const char *key,
                       size_t klen, const char **val, size_t *vlen)
{
    const char *p = cfg, *end = cfg + len;

    *val = NULL;
    *vlen = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *eq = memchr(p, '=', (size_t)(le - p));

        if (eq && (size_t)(eq - p) == klen && !memcmp(p, key, klen)) {
            *val = eq + 1;
            *vlen = (size_t)(le - eq - 1);
            return;
        }
        p = le + 1;
    }
}

/* Name the first key whose value differs between the two configs. */
static void config_diff(const char *a, size_t alen, const char *b, size_t blen,
                        char *out, size_t outlen)
{
    const char *cfgs[2] = {a, b};
    size_t lens[2] = {alen, blen};

    for (int side = 0; side < 2; side++) {
        const char *p = cfgs[side], *end = p + lens[side];

        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            const char *le = nl ? nl : end;
            const char *eq = memchr(p, '=', (size_t)(le - p));
            const char *va, *vb;
            size_t la, lb, klen;
            char key[128], sa[200], sb[200];

            if (!eq) {
                p = le + 1;
                continue;
            }
            klen = (size_t)(eq - p);
            config_get(a, alen, p, klen, &va, &la);
            config_get(b, blen, p, klen, &vb, &lb);
            if (!va || !vb || la != lb || memcmp(va, vb, la)) {
                clean_text(key, sizeof(key), (const uint8_t *)p,
                           MESH_MIN(klen, sizeof(key) - 1));
                if (va)
                    clean_text(sa, sizeof(sa), (const uint8_t *)va,
                               MESH_MIN(la, sizeof(sa) - 1));
                if (vb)
                    clean_text(sb, sizeof(sb), (const uint8_t *)vb,
                               MESH_MIN(lb, sizeof(sb) - 1));
                snprintf(out, outlen, "%s%s%s here, %s%s%s there", key,
                         va ? "=" : " ", va ? sa : "unset", key, vb ? "=" : " ",
                         vb ? sb : "unset");
                return;
            }
            p = le + 1;
        }
    }
    snprintf(out, outlen, "the fingerprints differ but no key does");
}

/* Drop a handshake that failed: the acceptor logs one line. */
static void hs_refuse(struct conn *c, const char *fmt, ...) MESH_PRINTF(2, 3);

static void hs_refuse(struct conn *c, const char *fmt, ...)
{
    struct mesh_transport *t = c->t;
    char why[MSG_MAX / 2], nb[300];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (c->role == ROLE_ACCEPTOR) {
        refuse_warn(t, c->addr, c->peer, why);
    } else {
        struct link *l = &t->links[c->peer];

        snprintf(l->why, sizeof(l->why), "%s", why);
        mesh_debug("dial rank %d (%s) stream %d: %s", c->peer,
                   pname(t, c->peer, nb, sizeof(nb)), c->stream, why);
    }
    conn_kill(c);
}

static void link_check_ready(struct mesh_transport *t, struct link *l)
{
    if (!l->ready && l->nready == t->S + 1) {
        l->ready = 1;
        t->nlinks_ready++;
        pthread_cond_broadcast(&t->cond);
    }
}

static void hs_attach(struct conn *c)
{
    struct mesh_transport *t = c->t;
    struct link *l = &t->links[c->peer];

    hs_remove(t, c);
    c->state = C_READY;
    c->in_len = 0;
    c->hdr_got = 0;
    if (c->stream == 0) {
        /*
         * Data unacknowledged for the peer timeout kills the link. Only
         * here: the kernel applies TCP_USER_TIMEOUT to zero-window probes
         * too, so on a data stream it would kill a link whose receiver
         * merely posts its receive late (measured: a receive posted 2 s
         * late, 1 s timeout). The control connection is always read; its
         * heartbeats carry silence detection for the whole link.
         */
        unsigned int uto = (unsigned int)(t->opts.peer_timeout_s * 1000.0);

        if (setsockopt(c->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto,
                       sizeof(uto)) < 0)
            mesh_warn("rank %d control connection: setsockopt "
                      "TCP_USER_TIMEOUT: %s",
                      c->peer, strerror(errno));
        l->ctrl = c;
        c->in_need = TCP_CTRL_LEN;
    } else {
        l->data[c->stream - 1] = c;
    }
    if (c->role == ROLE_DIALER)
        l->dial[c->stream].active = 0;
    l->nready++;
    l->last_rx_ns = mesh_now_ns();
    l->tx_ns = l->last_rx_ns;
    link_check_ready(t, l);
    /* Bytes may already wait in the socket. */
    rev_on(c);
    if (c->out_len > c->out_off)
        wev_on(c);
}

static int hs_got_hello(struct conn *c)
{
    struct mesh_transport *t = c->t;
    const uint8_t *m = c->in;
    uint32_t magic = mesh_get_le32(m), ver = mesh_get_le32(m + 4), size = mesh_get_le32(m + 8);
    uint32_t rank = mesh_get_le32(m + 12), stream = mesh_get_le32(m + 16);
    uint32_t flags = mesh_get_le32(m + 20);
    char job[MESH_JOB_MAX + 1];
    uint8_t hello[TCP_HELLO_LEN];
    int insecure = (flags & TCP_HELLO_INSECURE) != 0;

    if (magic != TCP_HS_MAGIC) {
        hs_refuse(c, "not a meshtrain handshake (bad magic 0x%08" PRIx32 ")",
                  magic);
        return -1;
    }
    if (ver != TCP_PROTO_VERSION) {
        hs_refuse(c, "protocol version %" PRIu32 ", expected %u", ver,
                  TCP_PROTO_VERSION);
        return -1;
    }
    clean_text(job, sizeof(job), m + 24, MESH_JOB_MAX);
    if (strnlen((const char *)m + 24, MESH_JOB_MAX) !=
            strnlen(t->opts.job_id, MESH_JOB_MAX) ||
        memcmp(m + 24, t->opts.job_id, strnlen(t->opts.job_id, MESH_JOB_MAX))) {
        hs_refuse(c, "wrong job id '%s', expected '%s'", job, t->opts.job_id);
        return -1;
    }
    if (size != (uint32_t)t->world.size) {
        hs_refuse(c, "world size %" PRIu32 ", expected %d", size,
                  t->world.size);
        return -1;
    }
    if (c->role == ROLE_ACCEPTOR) {
        /* The higher rank dials the lower: only higher ranks call us. */
        if (rank >= (uint32_t)t->world.size ||
            rank <= (uint32_t)t->world.rank) {
            hs_refuse(c,
                      "unknown rank %" PRIu32 " (world of %d; only ranks "
                      "above %d dial this one)",
                      rank, t->world.size, t->world.rank);
            return -1;
        }
        if (stream > (uint32_t)t->S) {
            hs_refuse(c,
                      "unknown stream %" PRIu32 " (rank %" PRIu32
                      ", %d data streams)",
                      stream, rank, t->S);
            return -1;
        }
        c->peer = (int)rank;
        c->stream = (int)stream;
    } else if (rank != (uint32_t)c->peer || stream != (uint32_t)c->stream) {
        hs_refuse(c,
                  "the peer answered as rank %" PRIu32 " stream %" PRIu32
                  ", expected rank %d stream %d",
                  rank, stream, c->peer, c->stream);
        return -1;
    }
    if (insecure != !t->secret) {
        hs_refuse(c, "authentication differs: %s here, %s there",
                  t->secret ? "a secret" : "insecure",
                  insecure ? "insecure" : "a secret");
        return -1;
    }
    memcpy(c->peer_fp, m + 24 + MESH_JOB_MAX, TCP_FP_LEN);
    memcpy(c->peer_nonce, m + 24 + MESH_JOB_MAX + TCP_FP_LEN, TCP_NONCE_LEN);
    if (c->role == ROLE_ACCEPTOR) {
        hello_encode(t, c, hello);
        out_append(c, hello, sizeof(hello));
    } else {
        uint8_t mac[TCP_MAC_LEN];

        if (auth_mac(t, c, ROLE_DIALER, mac) < 0) {
            hs_refuse(c, "%s", mesh_err_msg(-EIO));
            return -1;
        }
        out_append(c, mac, sizeof(mac));
    }
    conn_flush_out(c);
    c->state = C_HS_AUTH;
    c->in_len = 0;
    c->in_need = TCP_MAC_LEN;
    return 0;
}

static void hs_send_config(struct conn *c)
{
    struct mesh_transport *t = c->t;
    uint8_t len[4];

    mesh_put_le32(len, (uint32_t)t->config_len);
    out_append(c, len, 4);
    out_append(c, t->config, t->config_len);
    conn_flush_out(c);
    c->state = C_HS_CFGLEN;
    c->in_len = 0;
    c->in_need = 4;
}

/* Returns 0: go on (configs to exchange), 1: attached, -1: dropped. */
static int hs_got_auth(struct conn *c)
{
    struct mesh_transport *t = c->t;
    enum role other = c->role == ROLE_DIALER ? ROLE_ACCEPTOR : ROLE_DIALER;
    uint8_t want[TCP_MAC_LEN], mac[TCP_MAC_LEN];
    struct link *l = &t->links[c->peer];
    struct conn *cur;
    int same_fp = !memcmp(c->peer_fp, t->fp, TCP_FP_LEN);

    if (auth_mac(t, c, other, want) < 0) {
        hs_refuse(c, "%s", mesh_err_msg(-EIO));
        return -1;
    }
    if (t->secret && CRYPTO_memcmp(want, c->in, TCP_MAC_LEN)) {
        hs_refuse(c, "wrong secret (authentication failed)");
        return -1;
    }
    if (c->role == ROLE_ACCEPTOR) {
        cur = c->stream ? l->data[c->stream - 1] : l->ctrl;
        if (same_fp && cur) {
            hs_refuse(c,
                      "duplicate rank %d stream %d: that link is "
                      "already established",
                      c->peer, c->stream);
            return -1;
        }
        if (auth_mac(t, c, ROLE_ACCEPTOR, mac) < 0) {
            hs_refuse(c, "%s", mesh_err_msg(-EIO));
            return -1;
        }
        out_append(c, mac, sizeof(mac));
        conn_flush_out(c);
    }
    if (!same_fp) {
        hs_send_config(c);
        return 0;
    }
    hs_attach(c);
    return 1;
}

static void hs_got_config(struct conn *c)
{
    struct mesh_transport *t = c->t;
    char diff[600], nb[300];

    config_diff(t->config, t->config_len, (const char *)c->in + 4,
                c->in_len - 4, diff, sizeof(diff));
    /*
     * Both sides fail the join at once, naming the field: the peer has
     * proved the secret, so its configuration is the job's and will not
     * change (the acceptor used to wait out --join-timeout). A link that
     * is already up is not torn down by a stray connection.
     */
    if (!t->links[c->peer].ready && !t->join_err[0]) {
        if (c->role == ROLE_DIALER)
            snprintf(t->join_err, sizeof(t->join_err),
                     "refused by rank %d (%s): configuration differs: %s",
                     c->peer, pname(t, c->peer, nb, sizeof(nb)), diff);
        else
            snprintf(t->join_err, sizeof(t->join_err),
                     "refused rank %d (%s): configuration differs: %s",
                     c->peer, pname(t, c->peer, nb, sizeof(nb)), diff);
        pthread_cond_broadcast(&t->cond);
    }
    hs_refuse(c, "configuration differs: %s", diff);
}

/* Read handshake bytes: exactly what the current step needs, no more. */
static void hs_read(struct conn *c)
{
    for (;;) {
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_need - c->in_len, 0);
        uint32_t len;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0) {
            hs_refuse(c, "handshake failed: %s", strerror(errno));
            return;
        }
        if (n == 0) {
            if (c->role == ROLE_DIALER && c->state == C_HS_AUTH)
                hs_refuse(c, "closed during the handshake (a different "
                             "secret, or a duplicate rank?)");
            else
                hs_refuse(c, "closed during the handshake");
            return;
        }
        c->in_len += (size_t)n;
        if (c->in_len < c->in_need)
            continue;
        switch (c->state) {
        case C_HS_HELLO:
            if (hs_got_hello(c) < 0)
                return;
            break;
        case C_HS_AUTH:
            if (hs_got_auth(c) != 0)
                return;
            break;
        case C_HS_CFGLEN:
            len = mesh_get_le32(c->in);
            if (len > TCP_CONFIG_WIRE_MAX) {
                hs_refuse(c,
                          "configuration of %" PRIu32 " bytes (at most "
                          "%d)",
                          len, TCP_CONFIG_WIRE_MAX);
                return;
            }
            c->state = C_HS_CFG;
            c->in_need = 4 + len;
            if (len)
                break;
            hs_got_config(c);
            return;
        case C_HS_CFG:
            hs_got_config(c);
            return;
        default:
            return;
        }
    }
}

/* ---- joining ------------------------------------------------------------ */

static void dial_failed(struct mesh_transport *t, int peer, int stream)
{
    struct dial *d = &t->links[peer].dial[stream];

    d->active = 0;
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
    if (set_sockopts(t, fd) < 0 || set_cc(t, fd) < 0) {
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
    sockaddr_str(sa, c->addr, sizeof(c->addr));
    d->active = 1;
    hs_add(t, c);
    do {
        rc = connect(fd, sa, l->addr_lens[d->addr_i % l->naddrs]);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0 && errno != EINPROGRESS) {
        snprintf(l->why, sizeof(l->why), "%s", strerror(errno));
        conn_kill(c);
        return;
    }
    wev_on(c);
}

static void dial_connected(struct conn *c)
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
        conn_kill(c);
        return;
    }
    wev_off(c);
    if (RAND_bytes(c->nonce, TCP_NONCE_LEN) != 1) {
        snprintf(t->links[peer].why, sizeof(t->links[peer].why),
                 "RAND_bytes failed");
        conn_kill(c);
        return;
    }
    c->state = C_HS_HELLO;
    c->in_len = 0;
    c->in_need = TCP_HELLO_LEN;
    hello_encode(t, c, hello);
    out_append(c, hello, sizeof(hello));
    conn_flush_out(c);
    rev_on(c);
}

static void dial_scan(struct mesh_transport *t)
{
    uint64_t now = mesh_now_ns();

    if (!t->joining || t->failed)
        return;
    for (int p = 0; p < t->world.rank; p++) {
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
    int budget = MESH_MAX(TCP_HS_PENDING_MAX, 2 * t->world.size * (t->S + 1));
    int per_src =
        MESH_MAX(TCP_HS_PER_SOURCE_MAX, 2 * t->world.size * (t->S + 1));
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
        conn_kill(v);
    }
}

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
    struct mesh_transport *t = arg;
    struct sockaddr_storage ss;
    socklen_t sl;
    struct conn *c;
    int fd;

    (void)what;
    pthread_mutex_lock(&t->lock);
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
                          (unsigned)t->peers[t->world.rank].port,
                          strerror(errno));
                event_del(t->listen_ev);
                t->accept_paused = 1;
            }
            break;
        }
        sockaddr_str((struct sockaddr *)&ss, addr, sizeof(addr));
        /* Whether it has sent something already (a peer's HELLO). */
        do
            n = recv(fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (t->stopping || hs_make_room(t, addr, n > 0, mesh_now_ns()) < 0) {
            refuse_warn(t, addr, -1,
                        t->stopping ? "closing"
                                    : "too many handshakes in progress");
            close(fd);
            continue;
        }
        if (set_sockopts(t, fd) < 0 || !(c = conn_new(t, fd, ROLE_ACCEPTOR))) {
            refuse_warn(t, addr, -1, mesh_err_msg(-ENOMEM));
            close(fd);
            continue;
        }
        snprintf(c->addr, sizeof(c->addr), "%s", addr);
        if (RAND_bytes(c->nonce, TCP_NONCE_LEN) != 1) {
            refuse_warn(t, addr, -1, "RAND_bytes failed");
            conn_free(c);
            continue;
        }
        c->state = C_HS_HELLO;
        c->in_need = TCP_HELLO_LEN;
        c->deadline_ns = mesh_now_ns() + (uint64_t)(TCP_HS_DEADLINE_S * 1e9);
        hs_add(t, c);
        rev_on(c);
    }
    pthread_mutex_unlock(&t->lock);
}

/* ---- the data plane ---------------------------------------------------- */

static void frame_encode(const struct mesh_frame *f, uint8_t *h)
{
    memset(h, 0, TCP_FRAME_HDR_LEN);
    mesh_put_le32(h, TCP_FRAME_MAGIC);
    h[4] = f->op;
    h[5] = f->dtype;
    mesh_put_le32(h + 8, f->tag);
    mesh_put_le64(h + 16, f->seq);
    mesh_put_le64(h + 24, f->count);
    mesh_put_le64(h + 32, f->offset);
    mesh_put_le64(h + 40, f->length);
}

static int frame_decode(const uint8_t *h, struct mesh_frame *f)
{
    if (mesh_get_le32(h) != TCP_FRAME_MAGIC || h[6] || h[7] || mesh_get_le32(h + 12))
        return -1;
    f->op = h[4];
    f->dtype = h[5];
    f->tag = mesh_get_le32(h + 8);
    f->seq = mesh_get_le64(h + 16);
    f->count = mesh_get_le64(h + 24);
    f->offset = mesh_get_le64(h + 32);
    f->length = mesh_get_le64(h + 40);
    f->order = 0; /* local to the sender */
    return 0;
}

/*
 * A peer said goodbye. What it sent before still arrives on its data
 * streams (other sockets than the goodbye's), so its receives may still
 * complete; the job fails only when a stream broke mid-frame or with sends
 * queued (cut), or when every stream has ended with operations pending.
 */
static void bye_check(struct mesh_transport *t, int peer, int cut)
{
    struct link *l = &t->links[peer];
    struct mesh_req *r;
    char nb[300];
    int s;

    if (t->failed)
        return;
    /* A parked stream waits for a receive none of the pending ones is. */
    for (s = 0; s < t->S; s++)
        if (l->data[s] && l->data[s]->state == C_READY && !l->data[s]->parked)
            break;
    for (r = t->reqs; r; r = r->next)
        if (r->peer == peer && !atomic_load(&r->done))
            break;
    if (cut || (s == t->S && r))
        fail_job(t, peer, -ECONNRESET, 1,
                 "rank %d (%s) left the mesh with operations pending", peer,
                 pname(t, peer, nb, sizeof(nb)));
}

/* A peer's connection failed: blame it unless it said goodbye or an
 * abort notice explains it (read what its control connection holds). */
static void peer_lost(struct conn *c, const char *fmt, ...) MESH_PRINTF(2, 3);

static void peer_lost(struct conn *c, const char *fmt, ...)
{
    struct mesh_transport *t = c->t;
    struct link *l = &t->links[c->peer];
    char why[300], nb[300];
    va_list ap;
    int cut = c->rx_req || c->hdr_got || c->txq;

    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);

    if (l->ctrl && l->ctrl != c && l->ctrl->state == C_READY)
        ctrl_read(l->ctrl);
    if (c->state == C_READY)
        conn_kill(c);
    if (t->failed || t->stopping)
        return;
    if (l->bye) {
        if (c != l->ctrl)
            bye_check(t, c->peer, cut);
        return;
    }
    if (c != l->ctrl && l->ctrl && l->ctrl->state == C_READY) {
        /* The tick gives the verdict (the goodbye may still be on its
         * way on the control connection). */
        if (!l->lost_ns) {
            l->lost_ns = mesh_now_ns();
            snprintf(l->lost_why, sizeof(l->lost_why), "%s", why);
        }
        return;
    }
    fail_job(t, c->peer, -ECONNRESET, 1, "rank %d (%s) %s", c->peer,
             pname(t, c->peer, nb, sizeof(nb)), why);
}

enum match_rc { MATCH_OK, MATCH_WAIT, MATCH_FAILED };

/*
 * Match the header held by data connection c against the posted receives
 * of its peer (see irecv in transport.h). Fails the job on a desync or an
 * out-of-range frame (the payload stays unread).
 */
static enum match_rc data_match(struct conn *c)
{
    struct mesh_transport *t = c->t;
    struct link *l = &t->links[c->peer];
    const struct mesh_frame *f = &c->rx_f;
    char fa[200], fb[200], me[300], them[300];
    struct mesh_req *r;

    for (r = l->posted; r; r = r->pnext) {
        const struct mesh_frame *e = &r->f;
        uint64_t end = e->offset + e->length;
        int starts_inside = e->length
                                ? (f->offset >= e->offset && f->offset < end)
                                : f->offset == e->offset;

        if (e->seq != f->seq || e->tag != f->tag || !starts_inside)
            continue;
        if (e->op != f->op || e->dtype != f->dtype || e->count != f->count) {
            fail_job(t, c->peer, -EPROTO, 1,
                     "desync between rank %d (%s), which expected %s, and "
                     "rank %d (%s), which sent %s",
                     t->world.rank, pname(t, t->world.rank, me, sizeof(me)),
                     mesh_frame_str(e, fa, sizeof(fa)), c->peer,
                     pname(t, c->peer, them, sizeof(them)),
                     mesh_frame_str(f, fb, sizeof(fb)));
            return MATCH_FAILED;
        }
        if (f->length > end - f->offset ||
            f->length > e->length - r->reserved) {
            fail_job(t, c->peer, -EPROTO, 1,
                     "rank %d (%s) sent a frame beyond the posted receive "
                     "of rank %d (%s): got %s, expected %s (%" PRIu64
                     " bytes already claimed); link closed before its "
                     "payload",
                     c->peer, pname(t, c->peer, them, sizeof(them)),
                     t->world.rank, pname(t, t->world.rank, me, sizeof(me)),
                     mesh_frame_str(f, fb, sizeof(fb)),
                     mesh_frame_str(e, fa, sizeof(fa)), r->reserved);
            conn_kill(c);
            return MATCH_FAILED;
        }
        r->reserved += f->length;
        r->frames++;
        c->rx_req = r;
        c->rx_dst = r->buf + (f->offset - e->offset);
        c->rx_left = f->length;
        return MATCH_OK;
    }
    return MATCH_WAIT;
}

/* The current frame's payload has fully arrived. */
static void data_piece_done(struct conn *c)
{
    struct mesh_req *r = c->rx_req;

    r->got += c->rx_f.length;
    c->rx_req = NULL;
    c->hdr_got = 0;
    if (r->got == r->f.length)
        req_complete(c->t, r);
}

static void data_read(struct conn *c)
{
    struct mesh_transport *t = c->t;
    struct link *l = &t->links[c->peer];
    size_t budget = IO_BUDGET;
    char nb[300];
    ssize_t n;

    while (c->state == C_READY && !t->failed) {
        if (!c->rx_req) {
            if (c->parked) {
                rev_off(c);
                return;
            }
            n = recv(c->fd, c->hdr + c->hdr_got, TCP_FRAME_HDR_LEN - c->hdr_got,
                     0);
        } else {
            size_t want = (size_t)MESH_MIN(c->rx_left, (uint64_t)budget);

            if (!want) {
                data_piece_done(c);
                continue;
            }
            n = recv(c->fd, c->rx_dst, want, 0);
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0 && !on_progress_thread(t)) {
            /* A waiter's read (caller_io): the progress thread judges a
             * lost stream, in order with the control connection. */
            c->spin_lost = 1;
            rev_on(c);
            return;
        }
        if (n < 0) {
            peer_lost(c, "connection failed (stream %d): %s", c->stream,
                      strerror(errno));
            return;
        }
        if (n == 0) {
            peer_lost(c, "closed the connection (stream %d)", c->stream);
            return;
        }
        l->last_rx_ns = mesh_now_ns();
        if (c->rx_req) {
            c->rx_dst += n;
            c->rx_left -= (uint64_t)n;
            if (!c->rx_left)
                data_piece_done(c);
            if ((size_t)n >= budget)
                return;
            budget -= (size_t)n;
            continue;
        }
        c->hdr_got += (size_t)n;
        if (c->hdr_got < TCP_FRAME_HDR_LEN)
            continue;
        if (frame_decode(c->hdr, &c->rx_f) < 0) {
            fail_job(t, c->peer, -EPROTO, 1,
                     "rank %d (%s) sent garbage on data stream %d (bad "
                     "frame header)",
                     c->peer, pname(t, c->peer, nb, sizeof(nb)), c->stream);
            conn_kill(c);
            return;
        }
        switch (data_match(c)) {
        case MATCH_OK:
            if (!c->rx_left)
                data_piece_done(c);
            break;
        case MATCH_WAIT:
            c->parked = 1;
            rev_off(c);
            return;
        case MATCH_FAILED:
            return;
        }
    }
    if (t->failed)
        rev_off(c);
}

/*
 * A data stream's socket is full with pieces still queued. A waiter doing
 * its own I/O keeps writing it (and polls for it) while the progress
 * thread sleeps on: adding the write event from this thread would wake it
 * (libevent notifies the loop) only to hand the stream back. The last
 * waiter to leave gives the progress thread what is left (spin_release).
 */
static void tx_blocked(struct conn *c)
{
    if (in_waiter_io) { /* never set on the progress thread */
        atomic_store(&c->t->deferred, 1);
        return;
    }
    /* A holder (hold()) comes back to wait_any and writes it then; a
     * waiter blocked in poll() meanwhile adds it to its set. */
    if (atomic_load(&c->t->holders) && !on_progress_thread(c->t)) {
        atomic_store(&c->t->deferred, 1);
        kick(c->t, 1);
        return;
    }
    wev_on(c);
}

/* Write queued pieces (any thread, under the lock). */
static int conn_write(struct conn *c)
{
    struct mesh_transport *t = c->t;

    if (c->out_off < c->out_len) {
        conn_flush_out(c);
        if (c->out_off < c->out_len)
            return 0;
    }
    while (c->txq && c->state == C_READY) {
        struct iovec iov[16];
        struct msghdr mh;
        struct piece *p;
        int n = 0;
        ssize_t w;

        memset(&mh, 0, sizeof(mh));
        for (p = c->txq; p && n + 2 <= (int)MESH_ARRAY_SIZE(iov); p = p->next) {
            if (p->sent < TCP_FRAME_HDR_LEN) {
                iov[n].iov_base = p->hdr + p->sent;
                iov[n++].iov_len = TCP_FRAME_HDR_LEN - p->sent;
                if (p->len) {
                    iov[n].iov_base = (void *)p->buf;
                    iov[n++].iov_len = p->len;
                }
            } else {
                uint64_t off = p->sent - TCP_FRAME_HDR_LEN;

                iov[n].iov_base = (void *)(p->buf + off);
                iov[n++].iov_len = p->len - off;
            }
        }
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            tx_blocked(c);
            return 0;
        }
        if (w < 0) {
            /* As a failed read: the control connection may still bring
             * the peer's abort notice, which names the real culprit. */
            peer_lost(c, "connection failed (stream %d): %s", c->stream,
                      strerror(errno));
            return -1;
        }
        t->links[c->peer].tx_ns = mesh_now_ns();
        /* Retire what was written. */
        while (w > 0 && c->txq) {
            uint64_t left;

            p = c->txq;
            left = TCP_FRAME_HDR_LEN + p->len - p->sent;
            if ((uint64_t)w < left) {
                p->sent += (uint64_t)w;
                w = 0;
                break;
            }
            w -= (ssize_t)left;
            c->txq = p->next;
            if (!c->txq)
                c->txq_tail = NULL;
            c->tx_queued -= p->len;
            if (--p->req->pieces_left == 0)
                req_complete(t, p->req);
            free(p);
        }
        if (t->failed)
            return -1;
    }
    if (c->txq)
        tx_blocked(c);
    return 0;
}

/* ---- control connections ------------------------------------------------ */

static void ctrl_got(struct conn *c)
{
    struct mesh_transport *t = c->t;
    struct link *l = &t->links[c->peer];
    uint32_t type = mesh_get_le32(c->in);
    int culprit = (int)mesh_get_le32(c->in + 4);
    int code = -(int)mesh_get_le32(c->in + 8);
    uint32_t len = mesh_get_le32(c->in + 12);
    char reason[TCP_CTRL_REASON_MAX + 1], nb[300];

    switch (type) {
    case TCP_CTRL_HEARTBEAT:
        return;
    case TCP_CTRL_ABORT:
        clean_text(reason, sizeof(reason), c->in + 16,
                   MESH_MIN(len, (uint32_t)TCP_CTRL_REASON_MAX));
        if (culprit < -1 || culprit >= t->world.size)
            culprit = -1;
        /* Every survivor reports the same kind of failure. */
        if (code != -ECONNRESET && code != -EHOSTDOWN && code != -EPROTO &&
            code != -ECANCELED)
            code = -ECONNABORTED;
        /* Passed on to every peer before this rank can leave: a peer that
         * heard nothing yet would otherwise read our goodbye first and
         * blame us. */
        fail_job(t, culprit, code, 1, "%s (reported by rank %d (%s))", reason,
                 c->peer, pname(t, c->peer, nb, sizeof(nb)));
        return;
    case TCP_CTRL_BYE:
        l->bye = 1;
        l->lost_ns = 0;
        bye_check(t, c->peer, 0);
        return;
    default:
        fail_job(t, c->peer, -EPROTO, 1,
                 "rank %d (%s) sent garbage on its control connection "
                 "(type %" PRIu32 ")",
                 c->peer, pname(t, c->peer, nb, sizeof(nb)), type);
        conn_kill(c);
    }
}

static void ctrl_read(struct conn *c)
{
    struct mesh_transport *t = c->t;

    while (c->state == C_READY) {
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_need - c->in_len, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            int e = n < 0 ? errno : 0;

            if (n < 0)
                peer_lost(c, "connection failed (control): %s", strerror(e));
            else
                peer_lost(c, "closed the connection (control)");
            return;
        }
        t->links[c->peer].last_rx_ns = mesh_now_ns();
        c->in_len += (size_t)n;
        if (c->in_len == c->in_need) {
            c->in_len = 0;
            ctrl_got(c);
        }
    }
}

/* ---- event callbacks --------------------------------------------------- */

/* Whether a thread other than the progress thread does the data streams'
 * I/O: a waiter doing it now, or a holder (tcp_hold) that comes back to do
 * it, unless a waiter sleeps and needs the progress thread to. */
static int waiter_does_io(struct mesh_transport *t)
{
    return atomic_load_explicit(&t->spinning, memory_order_relaxed) ||
           (atomic_load_explicit(&t->holders, memory_order_relaxed) &&
            !atomic_load_explicit(&t->sleepers, memory_order_relaxed));
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct mesh_transport *t = c->t;

    (void)fd;
    (void)what;
    pthread_mutex_lock(&t->lock);
    if (c->state == C_READY && c->stream > 0 && !t->failed && !c->spin_lost &&
        waiter_does_io(t)) {
        /* A waiting thread reads the data streams (caller_io), or a
         * holder will: leave it this one rather than wake for it again
         * and again. */
        rev_off(c);
    } else if (c->state == C_READY) {
        if (c->stream == 0)
            ctrl_read(c);
        else if (t->failed)
            rev_off(c);
        else
            data_read(c);
    } else if (c->state == C_DEAD) {
        rev_off(c);
    } else if (c->state != C_CONNECTING) {
        hs_read(c);
    }
    pthread_mutex_unlock(&t->lock);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct mesh_transport *t = c->t;

    (void)fd;
    (void)what;
    pthread_mutex_lock(&t->lock);
    if (c->state == C_CONNECTING) {
        dial_connected(c);
        goto out;
    }
    if (c->state == C_DEAD) {
        wev_off(c);
        goto out;
    }
    if (c->out_off < c->out_len) {
        wev_off(c);
        conn_flush_out(c); /* re-adds the event if still blocked */
        if (c->out_off < c->out_len)
            goto out;
    }
    if (c->state == C_READY && c->stream > 0 && c->txq && !t->failed) {
        if (waiter_does_io(t)) {
            /* as on_read: a waiter writes the data streams */
            atomic_store(&t->deferred, 1);
            wev_off(c);
            kick(t, 1);
            goto out;
        }
        conn_write(c);
        if (c->txq)
            goto out;
    }
    wev_off(c);
out:
    pthread_mutex_unlock(&t->lock);
}

/* The tick's period once joined: at most 1/8 of the peer timeout. */
static double tick_s(const struct mesh_transport *t)
{
    return MESH_MAX(MESH_MIN(t->opts.peer_timeout_s / 8, 0.25), 0.002);
}

/*
 * How long a link may be silent before its peer is dead. A live peer sends
 * a heartbeat at its first tick a quarter of the peer timeout T after its
 * last bytes, so up to T / 4 + one tick passes between its bytes; a peer
 * that stops right before a heartbeat was due has been silent that long
 * already. Waiting for T beyond that gap, and noticing at the next tick,
 * declares a stopped peer dead between T and T + T / 4 + 2 ticks after it
 * stopped (T = 10 s: 10 to 13 s), never before T.
 */
static uint64_t silence_limit_ns(const struct mesh_transport *t)
{
    double pt = t->opts.peer_timeout_s;

    return (uint64_t)((pt + pt / 4 + tick_s(t)) * 1e9);
}

static void tick_arm(struct mesh_transport *t)
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
 * bytes wait unread in our sockets. A stall shorter than the peer timeout
 * is forgiven (their clocks start again now); a longer one made us the
 * silent peer, whom the others declare dead: blame ourselves, so that
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
    if (!t->failed && !t->joining &&
        (double)stall >= t->opts.peer_timeout_s * 1e9) {
        fail_job(t, t->world.rank, -EHOSTDOWN, 1,
                 "rank %d (%s) itself stood still for %.1f s (stopped, "
                 "suspended or not scheduled), past the peer timeout of "
                 "%.1f s: its peers declare it dead",
                 t->world.rank, pname(t, t->world.rank, me, sizeof(me)),
                 (double)stall / 1e9, t->opts.peer_timeout_s);
        return;
    }
    if ((double)stall >= t->opts.peer_timeout_s / 4 * 1e9)
        mesh_warn("this rank stood still for %.1f s (stopped, suspended or "
                  "not scheduled); its peers' silence meanwhile is not held "
                  "against them",
                  (double)stall / 1e9);
    for (int p = 0; p < t->world.size; p++) {
        struct link *l = &t->links[p];

        if (p == t->world.rank)
            continue;
        l->last_rx_ns = MESH_MIN(l->last_rx_ns + stall, now);
        if (l->lost_ns)
            l->lost_ns = MESH_MIN(l->lost_ns + stall, now);
    }
}

/* Periodic: dials, handshake deadlines, heartbeats, silent peers. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct mesh_transport *t = arg;
    uint64_t now, pt = (uint64_t)(t->opts.peer_timeout_s * 1e9);
    struct conn *c, *next;
    char nb[300];

    (void)fd;
    (void)what;
    pthread_mutex_lock(&t->lock);
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
            conn_kill(c);
        } else {
            hs_refuse(c, "handshake not completed within %.0f s",
                      TCP_HS_DEADLINE_S);
        }
    }
    dial_scan(t);
    if (!atomic_load(&t->spinning))
        spin_release(t);
    if (t->accept_paused && event_add(t->listen_ev, NULL) == 0)
        t->accept_paused = 0;
    stall_check(t, now);
    refuse_tick(t, now);
    for (int p = 0; p < t->world.size; p++) {
        struct link *l = &t->links[p];

        if (p == t->world.rank || !l->ctrl || l->bye)
            continue;
        /* Heartbeat when nothing else went to this peer lately. */
        if (l->ctrl->state == C_READY && now - l->tx_ns >= pt / 4)
            ctrl_send(l->ctrl, TCP_CTRL_HEARTBEAT, -1, 0, NULL);
        if (!t->failed && l->lost_ns &&
            now - l->lost_ns > (uint64_t)(LOST_GRACE_S * 1e9))
            fail_job(t, p, -ECONNRESET, 1, "rank %d (%s) %s", p,
                     pname(t, p, nb, sizeof(nb)), l->lost_why);
        if (!t->failed && now - l->last_rx_ns > silence_limit_ns(t))
            fail_job(t, p, -EHOSTDOWN, 1,
                     "rank %d (%s) silent for %.1f s (peer timeout %.1f s "
                     "after its heartbeat period of %.2f s)",
                     p, pname(t, p, nb, sizeof(nb)),
                     (double)(now - l->last_rx_ns) / 1e9,
                     t->opts.peer_timeout_s,
                     t->opts.peer_timeout_s / 4 + tick_s(t));
    }
    tick_arm(t);
out:
    pthread_mutex_unlock(&t->lock);
}

/* Work handed over by another thread. */
static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    struct mesh_transport *t = arg;

    (void)fd;
    (void)what;
    pthread_mutex_lock(&t->lock);
    if (t->stopping) {
        event_base_loopbreak(t->base);
    } else {
        if (t->failed) {
            for (int i = 0; i < t->world.size * t->S; i++) {
                struct conn *c = data_conn(t, i);

                if (c) {
                    rev_off(c);
                    wev_off(c);
                }
            }
        }
        dial_scan(t);
        /* Rearm the tick at the right pace (joining starts fast). */
        evtimer_del(t->tick_ev);
        tick_arm(t);
    }
    pthread_mutex_unlock(&t->lock);
}

static void *progress_main(void *arg)
{
    struct mesh_transport *t = arg;

    if (event_base_loop(t->base, EVLOOP_NO_EXIT_ON_EMPTY) < 0)
        mesh_error_log("TCP transport: the libevent loop failed");
    return NULL;
}

/* ---- operations ---------------------------------------------------------- */

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rc;

static void evthread_init(void)
{
    evthread_rc = evthread_use_pthreads();
}

static int listen_socket(struct mesh_transport *t, int *out)
{
    uint16_t port = t->peers[t->world.rank].port;
    struct sockaddr_in6 s6;
    struct sockaddr_in s4;
    int fd, one = 1, zero = 0, rc = 0;

    fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        memset(&s6, 0, sizeof(s6));
        s6.sin6_family = AF_INET6;
        s6.sin6_addr = in6addr_any;
        s6.sin6_port = htons(port);
        /* Dual stack: IPv4 peers arrive as v4-mapped addresses. */
        if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) <
                0 ||
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
            bind(fd, (struct sockaddr *)&s6, sizeof(s6)) < 0) {
            if (errno == EADDRINUSE) {
                rc = mesh_err_errno("rank %d: bind port %u", t->world.rank,
                                    (unsigned)port);
                close(fd);
                return rc;
            }
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0) {
        /* No IPv6 here: IPv4 only. */
        MESH_SYSCALL(
            rc,
            fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0),
            out, "socket");
        memset(&s4, 0, sizeof(s4));
        s4.sin_family = AF_INET;
        s4.sin_addr.s_addr = htonl(INADDR_ANY);
        s4.sin_port = htons(port);
        MESH_SYSCALL(
            rc, setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)),
            close_fd, "setsockopt SO_REUSEADDR");
        MESH_SYSCALL(rc, bind(fd, (struct sockaddr *)&s4, sizeof(s4)), close_fd,
                     "rank %d: bind port %u", t->world.rank, (unsigned)port);
    }
    /*
     * Accepted connections inherit a congestion control set here. Set on
     * them after accept() instead, it would replace one that has already
     * started: bbr leaves its pacing on behind it, and the accepting
     * side's sends stayed paced (a third of the dialing side's rate on
     * two namespace hosts, as with iperf3's server under -C).
     */
    if ((rc = set_cc(t, fd)) < 0)
        goto close_fd;
    MESH_SYSCALL(rc, listen(fd, SOMAXCONN), close_fd, "listen on port %u",
                 (unsigned)port);
    *out = fd;
    return 0;
close_fd:
    close(fd);
out:
    return rc;
}

static void tcp_close(mesh_transport_t *t);

static int tcp_listen(const struct mesh_world *world,
                      const struct mesh_transport_opts *opts,
                      mesh_transport_t **out)
{
    struct mesh_transport *t;
    pthread_condattr_t ca;
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
    t->opts = *opts;
    t->opts.secret = NULL;
    t->S = opts->streams;
    t->world = *world;
    t->peers = calloc((size_t)world->size, sizeof(*t->peers));
    t->links = calloc((size_t)world->size, sizeof(*t->links));
    if (!t->peers || !t->links) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto fail;
    }
    memcpy(t->peers, world->peers, (size_t)world->size * sizeof(*t->peers));
    t->world.peers = t->peers;
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

    rc = listen_socket(t, &t->listen_fd);
    if (rc < 0)
        goto fail;
    if (pthread_mutex_init(&t->lock, NULL) || pthread_condattr_init(&ca) ||
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) ||
        pthread_cond_init(&t->cond, &ca)) {
        rc = mesh_err(-ENOMEM, "pthread init failed");
        goto fail;
    }
    pthread_condattr_destroy(&ca);
    t->base = event_base_new();
    if (!t->base) {
        rc = mesh_err(-ENOMEM, "event_base_new failed");
        goto fail;
    }
    t->listen_ev =
        event_new(t->base, t->listen_fd, EV_READ | EV_PERSIST, on_accept, t);
    t->wake_ev = event_new(t->base, -1, 0, on_wake, t);
    t->tick_ev = evtimer_new(t->base, on_tick, t);
    if (!t->listen_ev || !t->wake_ev || !t->tick_ev ||
        event_add(t->listen_ev, NULL) < 0) {
        rc = mesh_err(-ENOMEM, "libevent: cannot create events");
        goto fail;
    }
    tick_arm(t);
    if (pthread_create(&t->thread, NULL, progress_main, t)) {
        rc = mesh_err(-EAGAIN, "cannot start the progress thread");
        goto fail;
    }
    t->thread_started = 1;
    if (!t->secret)
        mesh_warn("insecure: this mesh is unauthenticated (no secret); "
                  "anyone who can reach port %u can join it",
                  (unsigned)t->peers[t->world.rank].port);
    mesh_debug("tcp: rank %d listening on port %u, %d data streams",
               world->rank, (unsigned)t->peers[world->rank].port, t->S);
    *out = t;
    return 0;
fail:
    tcp_close(t);
    return rc;
}

static int resolve_peers(struct mesh_transport *t)
{
    for (int p = 0; p < t->world.rank; p++) {
        struct link *l = &t->links[p];
        struct addrinfo hints, *res = NULL, *ai;
        char port[16], nb[300];
        int rc;

        if (l->naddrs)
            continue;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        snprintf(port, sizeof(port), "%u", (unsigned)t->peers[p].port);
        rc = getaddrinfo(t->peers[p].host, port, &hints, &res);
        if (rc)
            return mesh_err(-EHOSTUNREACH,
                            "rank %d (%s): cannot resolve "
                            "host: %s",
                            p, pname(t, p, nb, sizeof(nb)), gai_strerror(rc));
        for (ai = res; ai && l->naddrs < ADDRS_MAX; ai = ai->ai_next) {
            if (ai->ai_addrlen > sizeof(l->addrs[0]))
                continue;
            memcpy(&l->addrs[l->naddrs], ai->ai_addr, ai->ai_addrlen);
            l->addr_lens[l->naddrs++] = ai->ai_addrlen;
        }
        freeaddrinfo(res);
        if (!l->naddrs)
            return mesh_err(-EHOSTUNREACH, "rank %d (%s): no usable address", p,
                            pname(t, p, nb, sizeof(nb)));
    }
    return 0;
}

/*
 * Log the congestion control a data stream really has (under the lock,
 * once joined). bbr gets a hint: without the fq qdisc the kernel paces
 * each of its streams with a timer per burst, which measured as the
 * largest CPU cost of an all-reduce on this project's machine (loopback
 * and veth links, where it halved the throughput of every system).
 */
static void log_cc(struct mesh_transport *t)
{
    char cc[MESH_TCP_CC_MAX + 1] = "";
    socklen_t len = MESH_TCP_CC_MAX;
    struct conn *c = NULL;

    for (int p = 0; p < t->world.size && !c; p++)
        if (p != t->world.rank && t->links[p].data)
            c = t->links[p].data[0];
    if (!c || c->fd < 0 ||
        getsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len) < 0)
        return;
    cc[MESH_MIN((size_t)len, sizeof(cc) - 1)] = 0;
    if (t->opts.tcp_cc[0])
        mesh_info("tcp: congestion control %s (--tcp-congestion)", cc);
    else if (!strcmp(cc, "bbr"))
        mesh_info("tcp: congestion control bbr (this host's default), which "
                  "paces every stream with timers: on a LAN, "
                  "--tcp-congestion cubic or reno can be much faster");
    else
        mesh_info("tcp: congestion control %s (this host's default)", cc);
}

static int tcp_connect(mesh_transport_t *t)
{
    uint64_t deadline;
    int rc = 0;

    rc = resolve_peers(t);
    if (rc < 0)
        return rc;
    deadline = mesh_now_ns() + (uint64_t)(t->opts.join_timeout_s * 1e9);
    pthread_mutex_lock(&t->lock);
    t->joining = 1;
    wake(t);
    for (;;) {
        struct timespec ts;
        uint64_t now;

        if (t->failed) {
            rc = fail_err(t);
            break;
        }
        if (t->join_err[0]) {
            rc = mesh_err(-ECONNREFUSED, "%s", t->join_err);
            break;
        }
        if (t->nlinks_ready == t->world.size - 1)
            break;
        now = mesh_now_ns();
        if (now >= deadline) {
            char msg[MSG_MAX], nb[300];
            size_t n;

            n = (size_t)snprintf(msg, sizeof(msg),
                                 "join timed out after %.1f s; never joined:",
                                 t->opts.join_timeout_s);
            for (int p = 0; p < t->world.size && n < sizeof(msg); p++) {
                struct link *l = &t->links[p];

                if (p == t->world.rank || l->ready)
                    continue;
                n += (size_t)snprintf(
                    msg + n, sizeof(msg) - n, " rank %d (%s%s%s)", p,
                    pname(t, p, nb, sizeof(nb)), l->why[0] ? ": " : "",
                    p < t->world.rank ? l->why : "");
            }
            rc = mesh_err(-ETIMEDOUT, "%s", msg);
            break;
        }
        ts.tv_sec =
            (time_t)(MESH_MIN(deadline, now + 100000000ull) / 1000000000ull);
        ts.tv_nsec =
            (long)(MESH_MIN(deadline, now + 100000000ull) % 1000000000ull);
        pthread_cond_timedwait(&t->cond, &t->lock, &ts);
    }
    t->joining = 0;
    if (!rc)
        log_cc(t);
    pthread_mutex_unlock(&t->lock);
    if (!rc)
        mesh_debug("tcp: rank %d joined the mesh (%d peers, %d data streams "
                   "per link)",
                   t->world.rank, t->world.size - 1, t->S);
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

static int check_peer(struct mesh_transport *t, int peer, const char *what,
                      int sending)
{
    char nb[300];

    if (peer < 0 || peer >= t->world.size || peer == t->world.rank)
        return mesh_err(-EINVAL, "tcp %s: invalid peer %d (rank %d of %d)",
                        what, peer, t->world.rank, t->world.size);
    if (t->failed)
        return fail_err(t);
    if (!t->links[peer].ready)
        return mesh_err(-ENOTCONN, "tcp %s: rank %d (%s) has not joined", what,
                        peer, pname(t, peer, nb, sizeof(nb)));
    if (t->links[peer].bye && sending) {
        /* It said goodbye while we still had this to send: its failure,
         * which every rank must blame on it, not on us. */
        fail_job(t, peer, -ECONNRESET, 1,
                 "rank %d (%s) left the mesh with a send to it still due", peer,
                 pname(t, peer, nb, sizeof(nb)));
        return fail_err(t);
    }
    return 0;
}

/*
 * Queue p on c in send order (mesh_frame.order): ahead of the first piece of
 * its seq that has not started and has a higher order, else last. Among
 * the unstarted pieces of one seq the queue stays sorted by order, in
 * posting order where equal.
 */
static void txq_insert(struct conn *c, struct piece *p)
{
    struct piece **at = &c->txq, *q = c->txq_tail;

    if (!q || q->seq != p->seq || q->order <= p->order || q->sent) {
        if (q)
            q->next = p;
        else
            c->txq = p;
        c->txq_tail = p;
        return;
    }
    for (; *at; at = &(*at)->next) {
        q = *at;
        if (!q->sent && q->seq == p->seq && q->order > p->order)
            break;
    }
    /* the tail's order is higher, so some piece qualified */
    p->next = *at;
    *at = p;
}

static int tcp_isend(mesh_transport_t *t, int peer, const struct mesh_frame *f,
                     const void *buf, mesh_mr_t *mr, mesh_req_t **out)
{
    struct mesh_req *r;
    struct link *l;
    struct piece *ps[64];
    int idle[64];
    uint64_t len = f->length, off = 0, chunk;
    int np, rc;

    (void)mr;
    if (len && !buf)
        return mesh_err(-EINVAL, "tcp isend: NULL buffer");
    if (f->offset + len < f->offset)
        return mesh_err(-EINVAL, "tcp isend: range overflows");
    np = 1;
    pthread_mutex_lock(&t->lock);
    rc = check_peer(t, peer, "isend", 1);
    if (rc < 0)
        goto out;
    l = &t->links[peer];
    if (len >= STRIPE_MIN && t->S > 1)
        np = (int)MESH_MIN((uint64_t)t->S, len / (STRIPE_MIN / 2));
    r = calloc(1, sizeof(*r));
    if (!r) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    /* Stripe in 4 KiB-aligned slices; the last takes the rest. */
    chunk = ((len / (uint64_t)np) + 4095) & ~(uint64_t)4095;
    for (int i = 0; i < np; i++) {
        uint64_t plen = i == np - 1 ? len - off : MESH_MIN(chunk, len - off);
        struct mesh_frame pf = *f;

        ps[i] = malloc(sizeof(struct piece));
        if (!ps[i]) {
            while (i-- > 0)
                free(ps[i]);
            free(r);
            rc = mesh_err(-ENOMEM, "out of memory");
            goto out;
        }
        pf.offset = f->offset + off;
        pf.length = plen;
        frame_encode(&pf, ps[i]->hdr);
        ps[i]->next = NULL;
        ps[i]->req = r;
        ps[i]->seq = f->seq;
        ps[i]->order = f->order;
        ps[i]->buf = (const uint8_t *)buf + off;
        ps[i]->len = plen;
        ps[i]->sent = 0;
        off += plen;
    }
    r->kind = REQ_SEND;
    r->peer = peer;
    r->f = *f;
    r->buf = (uint8_t *)buf;
    r->pieces_left = np;
    req_link(t, r);
    for (int i = 0; i < np; i++) {
        struct conn *c = l->data[(l->rr + (unsigned)i) % (unsigned)t->S];

        idle[i] = c->txq == NULL;
        txq_insert(c, ps[i]);
        c->tx_queued += ps[i]->len;
    }
    /* An idle stream sends at once from this thread. */
    for (int i = 0; i < np && !t->failed; i++)
        if (idle[i])
            conn_write(l->data[(l->rr + (unsigned)i) % (unsigned)t->S]);
    l->rr += (unsigned)np;
    if (t->failed) {
        rc = fail_err(t);
        req_unlink(t, r);
        free(r);
        goto out;
    }
    *out = r;
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int tcp_irecv(mesh_transport_t *t, int peer,
                     const struct mesh_frame *expect, void *buf, mesh_mr_t *mr,
                     mesh_req_t **out)
{
    struct mesh_req *r;
    struct link *l;
    int rc;

    (void)mr;
    if (expect->length && !buf)
        return mesh_err(-EINVAL, "tcp irecv: NULL buffer");
    if (expect->offset + expect->length < expect->offset)
        return mesh_err(-EINVAL, "tcp irecv: range overflows");
    pthread_mutex_lock(&t->lock);
    rc = check_peer(t, peer, "irecv", 0);
    if (rc < 0)
        goto out;
    l = &t->links[peer];
    r = calloc(1, sizeof(*r));
    if (!r) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    r->kind = REQ_RECV;
    r->peer = peer;
    r->f = *expect;
    r->buf = buf;
    req_link(t, r);
    /* Append: earlier receives match first. */
    r->posted = 1;
    r->pnext = NULL;
    if (!l->posted) {
        r->pprev = NULL;
        l->posted = r;
    } else {
        struct mesh_req *q = l->posted;

        while (q->pnext)
            q = q->pnext;
        q->pnext = r;
        r->pprev = q;
    }
    /* Streams parked on a header may now go on. */
    for (int s = 0; s < t->S && !t->failed; s++) {
        struct conn *c = l->data[s];

        if (!c || !c->parked || c->state != C_READY)
            continue;
        switch (data_match(c)) {
        case MATCH_OK:
            c->parked = 0;
            if (!c->rx_left)
                data_piece_done(c);
            /* a holder, or a waiter, reads it (see tx_blocked) */
            if (atomic_load(&t->holders))
                kick(t, 1);
            else
                rev_on(c);
            break;
        case MATCH_WAIT:
        case MATCH_FAILED:
            break;
        }
    }
    /* A peer that left may still have delivered this; else it never will. */
    if (l->bye)
        bye_check(t, peer, 0);
    if (t->failed && !atomic_load(&r->done)) {
        rc = fail_err(t);
        req_unlink(t, r);
        free(r);
        goto out;
    }
    *out = r;
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int tcp_test(mesh_transport_t *t, mesh_req_t *req, int *done)
{
    int rc = 0;

    if (!req)
        return mesh_err(-EINVAL, "tcp test: NULL request");
    pthread_mutex_lock(&t->lock);
    if (atomic_load(&req->done)) {
        req_unlink(t, req);
        free(req);
        *done = 1;
    } else if (t->failed) {
        rc = fail_err(t);
        req_unlink(t, req);
        free(req);
        *done = 1;
    } else {
        *done = 0;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int any_done(mesh_req_t *const *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (reqs[i] &&
            atomic_load_explicit(&reqs[i]->done, memory_order_acquire))
            return 1;
    return 0;
}

/* One pass of a waiter's I/O over the data streams, under the lock: write
 * what the send queues hold, read what arrived. With fds, also list what
 * each stream still waits for (*nf entries) for poll(). */
static void waiter_io(struct mesh_transport *t, struct pollfd *fds, int *nf)
{
    in_waiter_io = 1;
    for (int i = 0; i < t->world.size * t->S && !t->failed; i++) {
        struct conn *c = data_conn(t, i);

        if (!c || c->state != C_READY || c->spin_lost)
            continue;
        if (c->txq)
            conn_write(c);
        if (!c->parked && c->state == C_READY)
            data_read(c);
        if (fds && c->state == C_READY && !c->spin_lost &&
            (!c->parked || c->txq)) {
            fds[*nf].fd = c->fd;
            fds[*nf].events =
                (short)((c->parked ? 0 : POLLIN) | (c->txq ? POLLOUT : 0));
            fds[(*nf)++].revents = 0;
        }
    }
    in_waiter_io = 0;
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

    if (any_done(reqs, n))
        return 1;
    if (pthread_mutex_trylock(&t->lock))
        return 0;
    waiter_io(t, NULL, NULL);
    done = any_done(reqs, n) || t->failed;
    pthread_mutex_unlock(&t->lock);
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
static int waiter_poll(struct mesh_transport *t, mesh_req_t *const *reqs,
                       int n, uint64_t deadline)
{
    int cap = t->world.size * t->S + 1, rc = 0;
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

        pthread_mutex_lock(&t->lock);
        waiter_io(t, fds, &nf);
        if (any_done(reqs, n) || t->failed) {
            pthread_mutex_unlock(&t->lock);
            rc = 1;
            break;
        }
        pthread_mutex_unlock(&t->lock);
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
    if (t->failed)
        return;
    atomic_store(&t->deferred, 0);
    for (int i = 0; i < t->world.size * t->S; i++) {
        struct conn *c = data_conn(t, i);

        if (!c || c->state != C_READY)
            continue;
        if (reads && !c->parked)
            rev_on(c);
        if (c->txq)
            wev_on(c);
    }
}

static void spin_release(struct mesh_transport *t)
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
        pthread_mutex_lock(&t->lock);
        spin_release_io(t, sleepers);
        pthread_mutex_unlock(&t->lock);
    }
}

static int tcp_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
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
        if (done && !any_done(reqs, n))
            done = 0; /* the job failed: its error, below */
        if (done)
            return 0;
        if (t->poll_wait && mesh_now_ns() >= deadline)
            return mesh_err(-ETIMEDOUT,
                            "tcp wait: no request completed within %.3f s",
                            timeout_s);
    }
    pthread_mutex_lock(&t->lock);
    /* About to sleep: the progress thread must read for us again. (A
     * spinner leaving at this moment sees sleepers, or we see it gone.) */
    atomic_fetch_add(&t->sleepers, 1);
    if (!atomic_load(&t->spinning))
        spin_release(t);
    for (;;) {
        if (any_done(reqs, n))
            break;
        if (t->failed) {
            rc = fail_err(t);
            break;
        }
        if (mesh_cond_sleep(&t->cond, &t->lock, deadline) < 0) {
            rc = mesh_err(-ETIMEDOUT,
                          "tcp wait: no request completed within %.3f s",
                          timeout_s);
            break;
        }
    }
    atomic_fetch_sub(&t->sleepers, 1);
    pthread_mutex_unlock(&t->lock);
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
static void tcp_hold(mesh_transport_t *t, int on)
{
    if (on) {
        atomic_fetch_add(&t->holders, 1);
        return;
    }
    if (atomic_fetch_sub(&t->holders, 1) == 1 && !atomic_load(&t->spinning))
        last_out(t);
}

static int tcp_progress(mesh_transport_t *t)
{
    int rc = 0;

    pthread_mutex_lock(&t->lock);
    if (t->failed)
        rc = fail_err(t);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int mesh_tcp_culprit(mesh_transport_t *t)
{
    int culprit;

    pthread_mutex_lock(&t->lock);
    culprit = t->failed ? t->culprit : -1;
    pthread_mutex_unlock(&t->lock);
    return culprit;
}

static void tcp_abort(mesh_transport_t *t, int culprit, const char *why)
{
    char me[300], nb[300];

    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    if (culprit >= 0 && culprit < t->world.size)
        fail_job(t, culprit, -ECANCELED, 1,
                 "rank %d (%s) aborted the job, blaming rank %d (%s): %s",
                 t->world.rank, pname(t, t->world.rank, me, sizeof(me)),
                 culprit, pname(t, culprit, nb, sizeof(nb)),
                 why ? why : "no reason given");
    else
        fail_job(t, t->world.rank, -ECANCELED, 1,
                 "rank %d (%s) aborted the job: %s", t->world.rank,
                 pname(t, t->world.rank, me, sizeof(me)),
                 why ? why : "no reason given");
    pthread_mutex_unlock(&t->lock);
}

static void tcp_close(mesh_transport_t *t)
{
    struct mesh_req *r, *rn;
    struct conn *c, *cn;

    if (!t)
        return;
    if (t->thread_started) {
        pthread_mutex_lock(&t->lock);
        t->stopping = 1;
        for (int p = 0; p < t->world.size; p++) {
            struct link *l = &t->links[p];

            if (p != t->world.rank && l->ctrl && !l->bye)
                ctrl_send(l->ctrl, TCP_CTRL_BYE, -1, 0, NULL);
        }
        wake(t);
        pthread_mutex_unlock(&t->lock);
        pthread_join(t->thread, NULL);
        pthread_mutex_destroy(&t->lock);
        pthread_cond_destroy(&t->cond);
    }
    /* What the last windows held back is still said. */
    for (int i = 0; i < REFUSE_SOURCES; i++)
        refuse_flush(&t->refused[i], mesh_now_ns());
    refuse_flush_all(t, mesh_now_ns());
    for (c = t->hs; c; c = cn) {
        cn = c->hs_next;
        conn_free(c);
    }
    for (int p = 0; t->links && p < t->world.size; p++) {
        struct link *l = &t->links[p];

        conn_free(l->ctrl);
        for (int s = 0; l->data && s < t->S; s++)
            conn_free(l->data[s]);
        free(l->data);
        free(l->dial);
    }
    for (r = t->reqs; r; r = rn) {
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
    free(t->peers);
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
    .culprit = mesh_tcp_culprit,
    .close = tcp_close,
};
