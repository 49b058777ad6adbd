/*
 * transport/tcp/data.c: the data plane: requests, frame headers, reading and
 * matching frames, writing the send queues, the control connections, and
 * isend, irecv and test.
 */
#include "config.h"

#include "transport/tcp/tcp-internal.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* ---- requests ------------------------------------------------------------ */

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
    else
        l->posted_tail = r->pprev;
    r->posted = 0;
}

static void req_complete(struct mesh_transport *t, struct mesh_req *r)
{
    if (r->super.kind == TP_RECV) {
        posted_remove(&t->links[r->super.peer], r);
        tp_recv_got(&t->super, &r->super);
    }
    tp_req_done(&t->super, &r->super);
    tcp_kick(t, 0);
}

/* ---- the data plane ------------------------------------------------------ */

/*
 * A peer said goodbye. What it sent before still arrives on its data
 * streams (other sockets than the goodbye's), so its receives may still
 * complete; the job fails only when a stream broke mid-frame or with sends
 * queued (cut), or when every stream has ended with operations pending.
 */
static void bye_check(struct mesh_transport *t, int peer, int cut)
{
    struct link *l = &t->links[peer];
    int s;

    if (t->super.fail.failed)
        return;
    /* A parked stream waits for a receive none of the pending ones is. */
    for (s = 0; s < t->S; s++)
        if (l->data[s] && l->data[s]->state == C_READY && !l->data[s]->parked)
            break;
    if (cut || (s == t->S && tp_req_pending(&t->super, peer)))
        tp_fail_left(&t->super, peer);
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
        tcp_ctrl_read(l->ctrl);
    if (c->state == C_READY)
        tcp_conn_kill(c);
    if (t->super.fail.failed || t->stopping)
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
    tp_fail_job(&t->super, c->peer, -ECONNRESET, 1, "rank %d (%s) %s", c->peer,
                tcp_pname(t, c->peer, nb, sizeof(nb)), why);
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
    struct mesh_req *r;

    if (tp_frame_check(&t->super, c->peer, f) < 0) {
        tcp_conn_kill(c);
        return MATCH_FAILED;
    }
    for (r = l->posted; r; r = r->pnext) {
        const struct mesh_frame *e = &r->super.f;
        int m =
            tp_frame_match(&t->super, c->peer, t->super.world.rank, c->peer, e,
                           r->reserved, f, 1, "link closed before its payload");

        if (m == 0)
            continue;
        if (m < 0) {
            tcp_conn_kill(c);
            return MATCH_FAILED;
        }
        r->reserved += f->length;
        r->frames++;
        c->rx_req = r;
        c->rx_dst = r->buf + (f->offset - e->offset);
        c->rx_left = f->length;
        return MATCH_OK;
    }
    switch (tp_frame_unmatched(&t->super, c->peer, f)) {
    case 0:
        return MATCH_WAIT;
    case 1:
        /* of a later part: fine while another stream may still bring
         * the running part's frames due from the peer */
        for (int s = 0; s < t->S; s++) {
            struct conn *o = l->data[s];

            if (o != c && !(o && o->parked && o->state == C_READY &&
                            tp_frame_later(&t->super, c->peer, &o->rx_f)))
                return MATCH_WAIT;
        }
        tp_fail_order(&t->super, c->peer, f);
        break;
    default:
        break;
    }
    tcp_conn_kill(c);
    return MATCH_FAILED;
}

/* The current frame's payload has fully arrived. */
static void data_piece_done(struct conn *c)
{
    struct mesh_req *r = c->rx_req;

    r->got += c->rx_f.length;
    c->rx_req = NULL;
    c->hdr_got = 0;
    if (r->got == r->super.f.length)
        req_complete(c->t, r);
}

void tcp_data_read(struct conn *c)
{
    struct mesh_transport *t = c->t;
    struct link *l = &t->links[c->peer];
    size_t budget = IO_BUDGET;
    char nb[300];
    ssize_t n;

    while (c->state == C_READY && !t->super.fail.failed) {
        if (!c->rx_req) {
            if (c->parked) {
                tcp_rev_off(c);
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
        if (n <= 0 && !tcp_on_progress_thread(t)) {
            /* A waiter's read (caller_io): the progress thread judges a
             * lost stream, in order with the control connection. */
            c->spin_lost = 1;
            tcp_rev_on(c);
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
        l->last_rx_ns = l->data_rx_ns = mesh_now_ns();
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
        if (tcp_frame_decode(c->hdr, &c->rx_f) < 0) {
            tp_fail_job(&t->super, c->peer, -EPROTO, 1,
                        "rank %d (%s) sent garbage on data stream %d (bad "
                        "frame header)",
                        c->peer, tcp_pname(t, c->peer, nb, sizeof(nb)),
                        c->stream);
            tcp_conn_kill(c);
            return;
        }
        switch (data_match(c)) {
        case MATCH_OK:
            if (!c->rx_left)
                data_piece_done(c);
            break;
        case MATCH_WAIT:
            c->parked = 1;
            tcp_rev_off(c);
            return;
        case MATCH_FAILED:
            return;
        }
    }
    if (t->super.fail.failed)
        tcp_rev_off(c);
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
    if (tcp_in_waiter_io) { /* never set on the progress thread */
        atomic_store(&c->t->deferred, 1);
        return;
    }
    /* A holder (hold()) comes back to wait_any and writes it then; a
     * waiter blocked in poll() meanwhile adds it to its set. */
    if (atomic_load(&c->t->holders) && !tcp_on_progress_thread(c->t)) {
        atomic_store(&c->t->deferred, 1);
        tcp_kick(c->t, 1);
        return;
    }
    tcp_wev_on(c);
}

/* Write queued pieces (any thread, under the lock). */
int tcp_conn_write(struct conn *c)
{
    struct mesh_transport *t = c->t;

    if (c->out_off < c->out_len) {
        tcp_conn_flush_out(c);
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
        if (t->super.fail.failed)
            return -1;
    }
    if (c->txq)
        tx_blocked(c);
    return 0;
}

/* ---- control connections ------------------------------------------------- */

static void ctrl_got(struct conn *c)
{
    struct mesh_transport *t = c->t;
    struct link *l = &t->links[c->peer];
    uint32_t type = mesh_get_le32(c->in);
    int culprit = (int)mesh_get_le32(c->in + 4);
    /* Every survivor reports the same kind of failure. */
    int code = tcp_ctrl_code(mesh_get_le32(c->in + 8));
    uint32_t len = mesh_get_le32(c->in + 12);
    char reason[TCP_CTRL_REASON_MAX + 1], nb[300];

    switch (type) {
    case TCP_CTRL_HEARTBEAT:
        return;
    case TCP_CTRL_ABORT:
        tcp_clean_text(reason, sizeof(reason), c->in + 16,
                       MESH_MIN(len, (uint32_t)TCP_CTRL_REASON_MAX));
        if (culprit < -1 || culprit >= t->super.world.size)
            culprit = -1;
        /* Passed on to every peer before this rank can leave: a peer that
         * heard nothing yet would otherwise read our goodbye first and
         * blame us. */
        tp_fail_job(&t->super, culprit, code, 1,
                    "%s (reported by rank %d (%s))", reason, c->peer,
                    tcp_pname(t, c->peer, nb, sizeof(nb)));
        return;
    case TCP_CTRL_BYE:
        l->bye = 1;
        l->lost_ns = 0;
        bye_check(t, c->peer, 0);
        return;
    default:
        tp_fail_job(&t->super, c->peer, -EPROTO, 1,
                    "rank %d (%s) sent garbage on its control connection "
                    "(type %" PRIu32 ")",
                    c->peer, tcp_pname(t, c->peer, nb, sizeof(nb)), type);
        tcp_conn_kill(c);
    }
}

void tcp_ctrl_read(struct conn *c)
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

/* ---- operations ---------------------------------------------------------- */

static int check_peer(struct mesh_transport *t, int peer, const char *what,
                      int sending)
{
    char nb[300];
    int rc = tp_check_peer(&t->super, peer, what);

    if (rc < 0)
        return rc;
    if (!t->links[peer].ready)
        return mesh_err(-ENOTCONN, "tcp %s: rank %d (%s) has not joined", what,
                        peer, tcp_pname(t, peer, nb, sizeof(nb)));
    if (t->links[peer].bye && sending) {
        /* It said goodbye while we still had this to send: its failure,
         * which every rank must blame on it, not on us. */
        tp_fail_job(&t->super, peer, -ECONNRESET, 1,
                    "rank %d (%s) left the mesh with a send to it still due",
                    peer, tcp_pname(t, peer, nb, sizeof(nb)));
        return tp_fail_err(&t->super);
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

/* The end of isend and irecv: hand r out, unless the job failed meanwhile
 * (failed): then the job's error, and r goes. */
static int req_out(struct mesh_transport *t, struct mesh_req *r, int failed,
                   mesh_req_t **out)
{
    int rc;

    if (failed) {
        rc = tp_fail_err(&t->super);
        tp_req_unlink(&t->super, &r->super);
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int tcp_isend(mesh_transport_t *t, int peer, const struct mesh_frame *f,
              const void *buf, mesh_mr_t *mr, mesh_req_t **out)
{
    struct mesh_req *r;
    struct link *l;
    struct piece *ps[64];
    int idle[64];
    uint64_t len = f->length, off = 0, chunk;
    int np, rc, dup = -1;
    enum tp_wire wire;

    (void)mr;
    rc = tp_check_buf(&t->super, "isend", f, buf);
    if (rc < 0)
        return rc;
    np = 1;
    pthread_mutex_lock(&t->super.lock);
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
        wire = tp_test_wire(&pf, f, 0);
        if (wire == TP_WIRE_DUP)
            dup = i;
        tcp_frame_encode(&pf, ps[i]->hdr);
        if (wire == TP_WIRE_MAGIC)
            ps[i]->hdr[0] ^= 0xff;
        ps[i]->next = NULL;
        ps[i]->req = r;
        ps[i]->seq = f->seq;
        ps[i]->order = f->order;
        ps[i]->buf = (const uint8_t *)buf + off;
        ps[i]->len = plen;
        ps[i]->sent = 0;
        off += plen;
    }
    /* The test aid's duplicate: the same piece once more, after it. */
    if (dup >= 0) {
        struct piece *d = malloc(sizeof(*d));

        if (d) {
            *d = *ps[dup];
            memmove(ps + dup + 2, ps + dup + 1,
                    (size_t)(np - dup - 1) * sizeof(*ps));
            ps[dup + 1] = d;
            np++;
        }
    }
    r->super.kind = TP_SEND;
    r->super.peer = peer;
    r->super.f = *f;
    r->buf = (uint8_t *)buf;
    r->pieces_left = np;
    tp_req_link(&t->super, &r->super);
    for (int i = 0; i < np; i++) {
        struct conn *c = l->data[(l->rr + (unsigned)i) % (unsigned)t->S];

        idle[i] = c->txq == NULL;
        txq_insert(c, ps[i]);
        c->tx_queued += ps[i]->len;
    }
    /* An idle stream sends at once from this thread. */
    for (int i = 0; i < np && !t->super.fail.failed; i++)
        if (idle[i])
            tcp_conn_write(l->data[(l->rr + (unsigned)i) % (unsigned)t->S]);
    l->rr += (unsigned)np;
    rc = req_out(t, r, t->super.fail.failed, out);
out:
    pthread_mutex_unlock(&t->super.lock);
    return rc;
}

/* Match the headers l's parked streams hold again: a receive was posted,
 * or an owner's seqs finished (a header may have become stale). */
static void parked_retry(struct mesh_transport *t, struct link *l)
{
    for (int s = 0; s < t->S && !t->super.fail.failed; s++) {
        struct conn *c = l->data ? l->data[s] : NULL;

        if (!c || !c->parked || c->state != C_READY)
            continue;
        switch (data_match(c)) {
        case MATCH_OK:
            c->parked = 0;
            if (!c->rx_left)
                data_piece_done(c);
            /* a holder, or a waiter, reads it (see tx_blocked) */
            if (atomic_load(&t->holders))
                tcp_kick(t, 1);
            else
                tcp_rev_on(c);
            break;
        case MATCH_WAIT:
        case MATCH_FAILED:
            break;
        }
    }
}

void tcp_seq_done(mesh_transport_t *t, uint64_t base, uint64_t low)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->super.lock);
    tp_seq_done(&t->super, base, low);
    for (int p = 0; p < t->super.world.size && !t->super.fail.failed; p++)
        if (p != t->super.world.rank && t->links[p].ready)
            parked_retry(t, &t->links[p]);
    pthread_mutex_unlock(&t->super.lock);
}

void tcp_expect(mesh_transport_t *t, const struct mesh_frame *f,
                const struct mesh_expect *recv, size_t n)
{
    pthread_mutex_lock(&t->super.lock);
    tp_expect(&t->super, f, recv, n);
    for (int p = 0; p < t->super.world.size && !t->super.fail.failed; p++)
        if (p != t->super.world.rank && t->links[p].ready)
            parked_retry(t, &t->links[p]);
    pthread_mutex_unlock(&t->super.lock);
}

int tcp_irecv(mesh_transport_t *t, int peer, const struct mesh_frame *expect,
              void *buf, mesh_mr_t *mr, mesh_req_t **out)
{
    struct mesh_req *r;
    struct link *l;
    int rc;

    (void)mr;
    rc = tp_check_buf(&t->super, "irecv", expect, buf);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&t->super.lock);
    rc = check_peer(t, peer, "irecv", 0);
    if (rc < 0)
        goto out;
    l = &t->links[peer];
    r = calloc(1, sizeof(*r));
    if (!r) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    r->super.kind = TP_RECV;
    r->super.peer = peer;
    r->super.f = *expect;
    r->buf = buf;
    tp_req_link(&t->super, &r->super);
    /* Append: earlier receives match first. At the tail, not by a walk:
     * a schedule posts all its receives at once (tens of thousands with
     * a small --chunk), and a walk each under the lock starved the
     * progress thread's heartbeats until the peers took this rank for
     * dead. */
    r->posted = 1;
    r->pnext = NULL;
    r->pprev = l->posted_tail;
    if (l->posted_tail)
        l->posted_tail->pnext = r;
    else
        l->posted = r;
    l->posted_tail = r;
    parked_retry(t, l);
    /* A peer that left may still have delivered this; else it never will. */
    if (l->bye)
        bye_check(t, peer, 0);
    rc = req_out(t, r, t->super.fail.failed && !atomic_load(&r->super.done),
                 out);
out:
    pthread_mutex_unlock(&t->super.lock);
    return rc;
}

int tcp_test(mesh_transport_t *t, mesh_req_t *req, int *done)
{
    return tp_test(&t->super, req, done);
}

void tcp_req_free(struct tp_base *b, struct tp_req *r, int failed)
{
    (void)failed;
    tp_req_unlink(b, r);
    free(r);
}
