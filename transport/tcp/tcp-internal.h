/*
 * transport/tcp/tcp-internal.h: the TCP transport's design, private
 * layouts and the functions its files share. Only transport/tcp/ includes
 * this; the wire formats are in transport/tcp/tcp.h.
 *
 *
 * One progress thread per transport runs a libevent loop over raw
 * non-blocking sockets. Every piece of state below the transport lives under
 * one mutex (t->super.lock): the progress thread takes it in each callback, the
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
 * The files, one layer each:
 *   sockopt.c    socket options, congestion control, the listening socket
 *   wire.c       the handshake's messages, pure: HELLO encoded, decoded
 *                and checked, the AUTH proof, the CONFIG checks
 *   handshake.c  the handshake on a new connection (HELLO, AUTH, CONFIG),
 *                driven by its socket
 *   join.c       connections, dialing and accepting, refusals; connect()
 *   data.c       requests, frames, the data and control streams; isend,
 *                irecv, test
 *   progress.c   the progress thread: libevent callbacks and the tick
 *   wait.c       the waiter: wait_any's own I/O, spin and poll(); hold()
 *   ops.c        listen, failure, abort, close and the ops table
 */
#ifndef MESH_TRANSPORT_TCP_TCP_INTERNAL_H
#define MESH_TRANSPORT_TCP_TCP_INTERNAL_H

#include "common/util.h"
#include "transport/base.h"
#include "transport/tcp/tcp.h"
#include "transport/transport.h"

#include <event2/util.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* How long wait_any spins (MESHTRAIN_TCP_SPIN_US overrides). */
#define TCP_SPIN_DEFAULT_S 200e-6
/* Messages at least this long are striped over the data streams. */
#define STRIPE_MIN (512u * 1024u)
/* Bytes one callback moves before it yields to other sockets. */
#define IO_BUDGET (4u * 1024u * 1024u)
/* How long a broken data stream waits for its control connection. */
#define LOST_GRACE_S 0.5
/* Dial retry backoff. At most 250 ms: in a view change a peer whose
 * listener is not up yet (its snapshot restored, its old mesh closed)
 * refuses the first dials, and the last wait before it is seen delays the
 * whole view's mesh (up to 0.64 s of a 1 s cap, in bench/join.sh); a
 * refused dial costs the two sides a SYN and a reset, or a handshake. */
#define DIAL_BACKOFF_MIN_NS 10000000ull  /* 10 ms */
#define DIAL_BACKOFF_MAX_NS 250000000ull /* 250 ms */
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
    uint64_t wait_ns; /* the last wait after a failure */
    unsigned addr_i;
    unsigned failed;  /* attempts that failed */
    unsigned refused; /* ... of them refused: nothing listened there */
};

struct link {
    struct conn *ctrl;  /* stream 0 */
    struct conn **data; /* (S) streams 1..S */
    int nready;         /* connections READY (of S + 1) */
    int ready;          /* all S + 1 are READY */
    int bye;            /* the peer closed the mesh normally */
    uint64_t last_rx_ns;
    uint64_t data_rx_ns;     /* last bytes on any of its data streams */
    uint64_t tx_ns;          /* last bytes sent on any of its connections */
    struct mesh_req *posted; /* receives posted, not yet complete */
    struct mesh_req *posted_tail; /* its last: a schedule posts thousands */
    unsigned rr;                  /* next data stream for a message */
    struct dial *dial;            /* (S + 1), dialers only */
    struct sockaddr_storage addrs[ADDRS_MAX];
    socklen_t addr_lens[ADDRS_MAX];
    unsigned naddrs;
    char why[160]; /* last reason a dial failed, for the join error */
    /* A data stream broke while the control connection still stands: the
     * verdict waits (LOST_GRACE) for a goodbye or abort notice that may
     * travel behind it on the other connection. */
    uint64_t lost_ns;
    char lost_why[160];
    uint64_t sil_ns; /* its silence at the last tick */
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

struct mesh_req {
    struct tp_req super; /* kind, peer, frame, done, the request list */
    uint8_t *buf;
    int pieces_left;                /* send: pieces not fully written */
    uint64_t got;                   /* recv: payload bytes arrived */
    uint64_t reserved;              /* recv: bytes claimed by matched headers */
    int frames;                     /* recv: headers matched */
    int posted;                     /* recv: on its link's posted list */
    struct mesh_req *pnext, *pprev; /* link's posted list */
};

struct mesh_mr {
    void *buf;
    size_t len;
};

struct mesh_transport {
    struct tp_base super; /* world, opts, lock, cond, requests, failure */
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

    struct link *links; /* (size) */
    struct conn *hs;    /* handshakes in progress */
    int nhs;
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
    double spin_s;       /* wait_any spins this long first */
    atomic_int spinning; /* waiters reading the data streams themselves */
    atomic_int sleepers; /* waiters asleep on cond */
    int poll_wait;       /* after the spin, waiters poll() the streams */
    int kick_fd;         /* eventfd: wakes waiters blocked in poll() */
    atomic_int pollers;  /* waiters blocked in (or about to enter) poll() */
    atomic_int deferred; /* a stream's writing was left to a waiter */
    atomic_int holders;  /* threads in hold(): they come back to wait */
    /* The longest silence of a peer that spoke again, and whose, as the
     * ticks saw it (a bench aid: MESHTRAIN_SILENCE_REPORT logs it). */
    uint64_t live_sil_ns;
    int live_sil_rank;
};

/* Set while this thread does a waiter's I/O (its completions need no kick;
 * wait.c). */
extern _Thread_local int tcp_in_waiter_io;

static inline const char *tcp_pname(struct mesh_transport *t, int r, char *buf,
                                    size_t len)
{
    return tp_pname(&t->super, r, buf, len);
}

/* sockopt.c */
int tcp_set_cc(struct mesh_transport *t, int fd);
int tcp_set_sockopts(struct mesh_transport *t, int fd);
int tcp_listen_socket(struct mesh_transport *t, int *out);
void tcp_log_cc(struct mesh_transport *t);

/* handshake.c */
/* This side's HELLO on c. */
void tcp_hs_hello(struct mesh_transport *t, struct conn *c, uint8_t *m);
/* Drop a handshake that failed: the acceptor logs one line. */
void tcp_hs_refuse(struct conn *c, const char *fmt, ...) MESH_PRINTF(2, 3);
void tcp_hs_read(struct conn *c);

/* join.c */
void tcp_refuse_flush(struct refuse_src *r, uint64_t now);
void tcp_refuse_flush_all(struct mesh_transport *t, uint64_t now);
void tcp_refuse_warn(struct mesh_transport *t, const char *addr, int claimed,
                     const char *why);
void tcp_refuse_tick(struct mesh_transport *t, uint64_t now);
void tcp_hs_remove(struct mesh_transport *t, struct conn *c);
void tcp_conn_free(struct conn *c);
void tcp_conn_kill(struct conn *c);
void tcp_conn_flush_out(struct conn *c);
void tcp_out_append(struct conn *c, const void *p, size_t n);
void tcp_dial_connected(struct conn *c);
void tcp_dial_scan(struct mesh_transport *t);
void tcp_on_accept(evutil_socket_t lfd, short what, void *arg);
int tcp_connect(mesh_transport_t *t);

/* data.c */
void tcp_data_read(struct conn *c);
int tcp_conn_write(struct conn *c);
void tcp_ctrl_read(struct conn *c);
int tcp_isend(mesh_transport_t *t, int peer, const struct mesh_frame *f,
              const void *buf, mesh_mr_t *mr, mesh_req_t **out);
int tcp_irecv(mesh_transport_t *t, int peer, const struct mesh_frame *expect,
              void *buf, mesh_mr_t *mr, mesh_req_t **out);
int tcp_test(mesh_transport_t *t, mesh_req_t *req, int *done);
/* transport.h's seq_done: record it, then check the parked headers. */
void tcp_seq_done(mesh_transport_t *t, uint64_t base, uint64_t low);
/* transport.h's expect: record it, then check the parked headers. */
void tcp_expect(mesh_transport_t *t, const struct mesh_frame *f,
                const struct mesh_expect *recv, size_t n);
/* base's req_free: test() hands a request back */
void tcp_req_free(struct tp_base *b, struct tp_req *r, int failed);

/* progress.c */
void tcp_wake(struct mesh_transport *t);
void tcp_kick(struct mesh_transport *t, int all);
void tcp_rev_on(struct conn *c);
void tcp_wev_on(struct conn *c);
int tcp_on_progress_thread(const struct mesh_transport *t);
struct conn *tcp_data_conn(const struct mesh_transport *t, int i);
void tcp_rev_off(struct conn *c);
void tcp_wev_off(struct conn *c);
void tcp_on_read(evutil_socket_t fd, short what, void *arg);
void tcp_on_write(evutil_socket_t fd, short what, void *arg);
void tcp_tick_arm(struct mesh_transport *t);
void tcp_on_tick(evutil_socket_t fd, short what, void *arg);
void tcp_on_wake(evutil_socket_t fd, short what, void *arg);
void *tcp_progress_main(void *arg);

/* wait.c */
void tcp_spin_release(struct mesh_transport *t);
int tcp_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                 double timeout_s);
void tcp_hold(mesh_transport_t *t, int on);

/* ops.c */
void tcp_ctrl_send(struct conn *c, uint32_t type, int culprit, int code,
                   const char *reason);
void tcp_free_pieces(struct conn *c);

#endif
