/*
 * transport/tcp/handshake.c: the handshake every connection opens with:
 * HELLO, AUTH (HMAC-SHA256 over the transcript), and CONFIG when the
 * fingerprints differ; a connection that passes is attached to its link.
 */
#include "config.h"

#include "transport/tcp/tcp-internal.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* ---- handshake ----------------------------------------------------------- */

void tcp_hs_hello(struct mesh_transport *t, struct conn *c, uint8_t *m)
{
    struct tcp_hello h = {
        .version = TCP_PROTO_VERSION,
        .size = (uint32_t)t->super.world.size,
        .rank = (uint32_t)t->super.world.rank,
        .stream = (uint32_t)c->stream,
        .insecure = !t->secret,
    };

    memcpy(h.job, t->super.opts.job_id,
           strnlen(t->super.opts.job_id, MESH_JOB_MAX));
    memcpy(h.fp, t->fp, TCP_FP_LEN);
    memcpy(h.nonce, c->nonce, TCP_NONCE_LEN);
    tcp_hello_encode(&h, m);
}

/* c's transcript, from either side. */
static void transcript(struct mesh_transport *t, struct conn *c,
                       struct tcp_transcript *tr)
{
    int dialer = c->role == ROLE_DIALER;

    memcpy(tr->nonce_d, dialer ? c->nonce : c->peer_nonce, TCP_NONCE_LEN);
    memcpy(tr->nonce_a, dialer ? c->peer_nonce : c->nonce, TCP_NONCE_LEN);
    memcpy(tr->fp_d, dialer ? t->fp : c->peer_fp, TCP_FP_LEN);
    memcpy(tr->fp_a, dialer ? c->peer_fp : t->fp, TCP_FP_LEN);
    tr->rank_d = (uint32_t)(dialer ? t->super.world.rank : c->peer);
    tr->rank_a = (uint32_t)(dialer ? c->peer : t->super.world.rank);
    tr->stream = (uint32_t)c->stream;
}

/* The proof for one role on c (tcp_auth_mac). */
static int auth_mac(struct mesh_transport *t, struct conn *c, enum role who,
                    uint8_t *mac)
{
    struct tcp_transcript tr;

    transcript(t, c, &tr);
    return tcp_auth_mac(t->secret, t->secret_len, &tr, who, mac);
}

void tcp_hs_refuse(struct conn *c, const char *fmt, ...)
{
    struct mesh_transport *t = c->t;
    char why[MSG_MAX / 2], nb[300];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (c->role == ROLE_ACCEPTOR) {
        tcp_refuse_warn(t, c->addr, c->peer, why);
    } else {
        struct link *l = &t->links[c->peer];

        snprintf(l->why, sizeof(l->why), "%s", why);
        mesh_debug("dial rank %d (%s) stream %d: %s", c->peer,
                   tcp_pname(t, c->peer, nb, sizeof(nb)), c->stream, why);
    }
    tcp_conn_kill(c);
}

static void link_check_ready(struct mesh_transport *t, struct link *l)
{
    if (!l->ready && l->nready == t->S + 1) {
        l->ready = 1;
        t->nlinks_ready++;
        pthread_cond_broadcast(&t->super.cond);
    }
}

static void hs_attach(struct conn *c)
{
    struct mesh_transport *t = c->t;
    struct link *l = &t->links[c->peer];

    tcp_hs_remove(t, c);
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
        unsigned int uto =
            (unsigned int)(t->super.opts.peer_timeout_s * 1000.0);

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
    l->data_rx_ns = l->last_rx_ns;
    l->tx_ns = l->last_rx_ns;
    link_check_ready(t, l);
    /* Bytes may already wait in the socket. */
    tcp_rev_on(c);
    if (c->out_len > c->out_off)
        tcp_wev_on(c);
}

static int hs_got_hello(struct conn *c)
{
    struct mesh_transport *t = c->t;
    struct tcp_hs_self self = {
        .job_id = t->super.opts.job_id,
        .size = t->super.world.size,
        .rank = t->super.world.rank,
        .streams = t->S,
        .secure = t->secret != NULL,
        .dialer = c->role == ROLE_DIALER,
        .peer = c->peer,
        .stream = c->stream,
    };
    struct tcp_hello h;
    char why[MSG_MAX / 2];
    uint8_t hello[TCP_HELLO_LEN];
    int identified, rc;

    tcp_hello_decode(c->in, &h);
    rc = tcp_hello_check(&h, &self, &identified, why, sizeof(why));
    if (identified && c->role == ROLE_ACCEPTOR) {
        c->peer = (int)h.rank;
        c->stream = (int)h.stream;
    }
    if (rc < 0 && tcp_hello_world_differs(&h, &self)) {
        if (c->role == ROLE_ACCEPTOR) {
            /* our size, for the dialer's message (tcp_hello_world_differs) */
            tcp_hs_hello(t, c, hello);
            tcp_out_append(c, hello, sizeof(hello));
            tcp_conn_flush_out(c);
        } else if (!t->super.opts.views && !t->links[c->peer].ready &&
                   !t->join_err[0]) {
            char nb[300];

            snprintf(t->join_err, sizeof(t->join_err),
                     "rank %d (%s) is in a world of %" PRIu32
                     " slots, this peer's has %d: its hostfile (-H, "
                     "--hostfile) differs from the job's",
                     c->peer, tcp_pname(t, c->peer, nb, sizeof(nb)), h.size,
                     t->super.world.size);
            pthread_cond_broadcast(&t->super.cond);
        }
    }
    if (rc < 0) {
        tcp_hs_refuse(c, "%s", why);
        return -1;
    }
    memcpy(c->peer_fp, h.fp, TCP_FP_LEN);
    memcpy(c->peer_nonce, h.nonce, TCP_NONCE_LEN);
    if (c->role == ROLE_ACCEPTOR) {
        tcp_hs_hello(t, c, hello);
        tcp_out_append(c, hello, sizeof(hello));
    } else {
        uint8_t mac[TCP_MAC_LEN];

        if (auth_mac(t, c, ROLE_DIALER, mac) < 0) {
            tcp_hs_refuse(c, "%s", mesh_err_msg(-EIO));
            return -1;
        }
        tcp_out_append(c, mac, sizeof(mac));
    }
    tcp_conn_flush_out(c);
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
    tcp_out_append(c, len, 4);
    tcp_out_append(c, t->config, t->config_len);
    tcp_conn_flush_out(c);
    c->state = C_HS_CFGLEN;
    c->in_len = 0;
    c->in_need = 4;
}

/* Returns 0: go on (configs to exchange), 1: attached, -1: dropped. */
static int hs_got_auth(struct conn *c)
{
    struct mesh_transport *t = c->t;
    enum role other = c->role == ROLE_DIALER ? ROLE_ACCEPTOR : ROLE_DIALER;
    uint8_t mac[TCP_MAC_LEN];
    struct link *l = &t->links[c->peer];
    struct tcp_transcript tr;
    struct conn *cur;
    int same_fp = !memcmp(c->peer_fp, t->fp, TCP_FP_LEN), rc;

    transcript(t, c, &tr);
    rc = tcp_auth_verify(t->secret, t->secret_len, &tr, other, c->in);
    if (rc == -EACCES) {
        tcp_hs_refuse(c, "wrong secret (authentication failed)");
        return -1;
    }
    if (rc < 0) {
        tcp_hs_refuse(c, "%s", mesh_err_msg(-EIO));
        return -1;
    }
    if (c->role == ROLE_ACCEPTOR) {
        cur = c->stream ? l->data[c->stream - 1] : l->ctrl;
        if (same_fp && cur) {
            tcp_hs_refuse(c,
                          "duplicate rank %d stream %d: that link is "
                          "already established",
                          c->peer, c->stream);
            return -1;
        }
        if (tcp_auth_mac(t->secret, t->secret_len, &tr, ROLE_ACCEPTOR, mac) <
            0) {
            tcp_hs_refuse(c, "%s", mesh_err_msg(-EIO));
            return -1;
        }
        tcp_out_append(c, mac, sizeof(mac));
        tcp_conn_flush_out(c);
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
    const char *theirs = (const char *)c->in + 4;
    char diff[600], nb[300];
    int order;

    tcp_config_diff(t->config, t->config_len, theirs, c->in_len - 4, diff,
                    sizeof(diff));
    order =
        tcp_config_view_order(t->config, t->config_len, theirs, c->in_len - 4);
    /*
     * A peer still in an earlier view (--elastic: it reached this view's
     * mesh late, or opens the one before): its side fails at once and
     * follows to ours, so this side waits on for it. Both sides used to
     * fail, and the view after ours then failed the same way with the
     * next late peer: the views raced upward.
     */
    if (order > 0) {
        tcp_hs_refuse(c,
                      "configuration differs: %s (the peer's view is the "
                      "earlier: waiting for it in this one)",
                      diff);
        return;
    }
    /*
     * Else both sides fail the join at once, naming the field: the peer
     * has proved the secret, so its configuration is the job's and will
     * not change (the acceptor used to wait out --join-timeout); or this
     * side's view is superseded by the peer's. A link that is already up
     * is not torn down by a stray connection.
     */
    if (!t->links[c->peer].ready && !t->join_err[0]) {
        if (order < 0)
            snprintf(t->join_err, sizeof(t->join_err),
                     "rank %d (%s) is in a later view: configuration "
                     "differs: %s",
                     c->peer, tcp_pname(t, c->peer, nb, sizeof(nb)), diff);
        else if (c->role == ROLE_DIALER)
            snprintf(t->join_err, sizeof(t->join_err),
                     "refused by rank %d (%s): configuration differs: %s",
                     c->peer, tcp_pname(t, c->peer, nb, sizeof(nb)), diff);
        else
            snprintf(t->join_err, sizeof(t->join_err),
                     "refused rank %d (%s): configuration differs: %s", c->peer,
                     tcp_pname(t, c->peer, nb, sizeof(nb)), diff);
        pthread_cond_broadcast(&t->super.cond);
    }
    tcp_hs_refuse(c, "configuration differs: %s", diff);
}

/* Read handshake bytes: exactly what the current step needs, no more. */
void tcp_hs_read(struct conn *c)
{
    for (;;) {
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_need - c->in_len, 0);
        char why[MSG_MAX / 2];
        uint32_t len;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0) {
            tcp_hs_refuse(c, "handshake failed: %s", strerror(errno));
            return;
        }
        if (n == 0) {
            if (c->role == ROLE_DIALER && c->state == C_HS_AUTH)
                tcp_hs_refuse(c, "closed during the handshake (a different "
                                 "secret, or a duplicate rank?)");
            else
                tcp_hs_refuse(c, "closed during the handshake");
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
            if (tcp_config_len_check(len, why, sizeof(why)) < 0) {
                tcp_hs_refuse(c, "%s", why);
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
