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
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* Copy at most len bytes of untrusted text, replacing non-printables. */
void tcp_clean_text(char *dst, size_t dstlen, const uint8_t *src, size_t len)
{
    size_t i, n = 0;

    for (i = 0; i < len && src[i] && n + 1 < dstlen; i++)
        dst[n++] = (src[i] >= 0x20 && src[i] < 0x7f) ? (char)src[i] : '?';
    dst[n] = '\0';
}

/* ---- handshake ----------------------------------------------------------- */

void tcp_hello_encode(struct mesh_transport *t, struct conn *c, uint8_t *m)
{
    memset(m, 0, TCP_HELLO_LEN);
    mesh_put_le32(m, TCP_HS_MAGIC);
    mesh_put_le32(m + 4, TCP_PROTO_VERSION);
    mesh_put_le32(m + 8, (uint32_t)t->super.world.size);
    mesh_put_le32(m + 12, (uint32_t)t->super.world.rank);
    mesh_put_le32(m + 16, (uint32_t)c->stream);
    mesh_put_le32(m + 20, t->secret ? 0 : TCP_HELLO_INSECURE);
    memcpy(m + 24, t->super.opts.job_id,
           strnlen(t->super.opts.job_id, MESH_JOB_MAX));
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
        rd = (uint32_t)t->super.world.rank;
        ra = (uint32_t)c->peer;
    } else {
        nd = c->peer_nonce;
        na = c->nonce;
        fd = c->peer_fp;
        fa = t->fp;
        rd = (uint32_t)c->peer;
        ra = (uint32_t)t->super.world.rank;
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
                tcp_clean_text(key, sizeof(key), (const uint8_t *)p,
                               MESH_MIN(klen, sizeof(key) - 1));
                if (va)
                    tcp_clean_text(sa, sizeof(sa), (const uint8_t *)va,
                                   MESH_MIN(la, sizeof(sa) - 1));
                if (vb)
                    tcp_clean_text(sb, sizeof(sb), (const uint8_t *)vb,
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
    const uint8_t *m = c->in;
    uint32_t magic = mesh_get_le32(m), ver = mesh_get_le32(m + 4), size = mesh_get_le32(m + 8);
    uint32_t rank = mesh_get_le32(m + 12), stream = mesh_get_le32(m + 16);
    uint32_t flags = mesh_get_le32(m + 20);
    char job[MESH_JOB_MAX + 1];
    uint8_t hello[TCP_HELLO_LEN];
    int insecure = (flags & TCP_HELLO_INSECURE) != 0;

    if (magic != TCP_HS_MAGIC) {
        tcp_hs_refuse(
            c, "not a meshtrain handshake (bad magic 0x%08" PRIx32 ")", magic);
        return -1;
    }
    if (ver != TCP_PROTO_VERSION) {
        tcp_hs_refuse(c, "protocol version %" PRIu32 ", expected %u", ver,
                      TCP_PROTO_VERSION);
        return -1;
    }
    tcp_clean_text(job, sizeof(job), m + 24, MESH_JOB_MAX);
    if (strnlen((const char *)m + 24, MESH_JOB_MAX) !=
            strnlen(t->super.opts.job_id, MESH_JOB_MAX) ||
        memcmp(m + 24, t->super.opts.job_id,
               strnlen(t->super.opts.job_id, MESH_JOB_MAX))) {
        tcp_hs_refuse(c, "wrong job id '%s', expected '%s'", job,
                      t->super.opts.job_id);
        return -1;
    }
    if (size != (uint32_t)t->super.world.size) {
        tcp_hs_refuse(c, "world size %" PRIu32 ", expected %d", size,
                      t->super.world.size);
        return -1;
    }
    if (c->role == ROLE_ACCEPTOR) {
        /* The higher rank dials the lower: only higher ranks call us. */
        if (rank >= (uint32_t)t->super.world.size ||
            rank <= (uint32_t)t->super.world.rank) {
            tcp_hs_refuse(c,
                          "unknown rank %" PRIu32 " (world of %d; only ranks "
                          "above %d dial this one)",
                          rank, t->super.world.size, t->super.world.rank);
            return -1;
        }
        if (stream > (uint32_t)t->S) {
            tcp_hs_refuse(c,
                          "unknown stream %" PRIu32 " (rank %" PRIu32
                          ", %d data streams)",
                          stream, rank, t->S);
            return -1;
        }
        c->peer = (int)rank;
        c->stream = (int)stream;
    } else if (rank != (uint32_t)c->peer || stream != (uint32_t)c->stream) {
        tcp_hs_refuse(c,
                      "the peer answered as rank %" PRIu32 " stream %" PRIu32
                      ", expected rank %d stream %d",
                      rank, stream, c->peer, c->stream);
        return -1;
    }
    if (insecure != !t->secret) {
        tcp_hs_refuse(c, "authentication differs: %s here, %s there",
                      t->secret ? "a secret" : "insecure",
                      insecure ? "insecure" : "a secret");
        return -1;
    }
    memcpy(c->peer_fp, m + 24 + MESH_JOB_MAX, TCP_FP_LEN);
    memcpy(c->peer_nonce, m + 24 + MESH_JOB_MAX + TCP_FP_LEN, TCP_NONCE_LEN);
    if (c->role == ROLE_ACCEPTOR) {
        tcp_hello_encode(t, c, hello);
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
    uint8_t want[TCP_MAC_LEN], mac[TCP_MAC_LEN];
    struct link *l = &t->links[c->peer];
    struct conn *cur;
    int same_fp = !memcmp(c->peer_fp, t->fp, TCP_FP_LEN);

    if (auth_mac(t, c, other, want) < 0) {
        tcp_hs_refuse(c, "%s", mesh_err_msg(-EIO));
        return -1;
    }
    if (t->secret && CRYPTO_memcmp(want, c->in, TCP_MAC_LEN)) {
        tcp_hs_refuse(c, "wrong secret (authentication failed)");
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
        if (auth_mac(t, c, ROLE_ACCEPTOR, mac) < 0) {
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
            if (len > TCP_CONFIG_WIRE_MAX) {
                tcp_hs_refuse(c,
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
