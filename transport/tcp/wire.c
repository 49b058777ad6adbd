/*
 * transport/tcp/wire.c: the handshake's messages as pure functions: HELLO
 * encoded, decoded and checked, the AUTH proof (HMAC-SHA256 over the
 * transcript), the CONFIG length check and the configuration diff. No
 * sockets, no transport object: handshake.c drives them, and
 * tests/test_tcp_handshake checks them alone.
 */
#include "config.h"

#include "transport/tcp/tcp.h"
#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>

/* An ABORT's error code as it came, as the failure reported (tcp.h). */
int tcp_ctrl_code(uint32_t wire)
{
    switch (wire) {
    case ECONNRESET:
    case EHOSTDOWN:
    case EPROTO:
    case ECANCELED:
    case ESHUTDOWN:
        return -(int)wire;
    default: /* e.g. 2^31, whose negation as an int overflows */
        return -ECONNABORTED;
    }
}

/* Copy at most len bytes of untrusted text, replacing non-printables. */
void tcp_clean_text(char *dst, size_t dstlen, const uint8_t *src, size_t len)
{
    size_t i, n = 0;

    for (i = 0; i < len && src[i] && n + 1 < dstlen; i++)
        dst[n++] = (src[i] >= 0x20 && src[i] < 0x7f) ? (char)src[i] : '?';
    dst[n] = '\0';
}

void tcp_hello_encode(const struct tcp_hello *h, uint8_t *m)
{
    memset(m, 0, TCP_HELLO_LEN);
    mesh_put_le32(m, TCP_HS_MAGIC);
    mesh_put_le32(m + 4, h->version);
    mesh_put_le32(m + 8, h->size);
    mesh_put_le32(m + 12, h->rank);
    mesh_put_le32(m + 16, h->stream);
    mesh_put_le32(m + 20, h->insecure ? TCP_HELLO_INSECURE : 0);
    memcpy(m + 24, h->job, MESH_JOB_MAX);
    memcpy(m + 24 + MESH_JOB_MAX, h->fp, TCP_FP_LEN);
    memcpy(m + 24 + MESH_JOB_MAX + TCP_FP_LEN, h->nonce, TCP_NONCE_LEN);
}

void tcp_hello_decode(const uint8_t *m, struct tcp_hello *h)
{
    h->magic = mesh_get_le32(m);
    h->version = mesh_get_le32(m + 4);
    h->size = mesh_get_le32(m + 8);
    h->rank = mesh_get_le32(m + 12);
    h->stream = mesh_get_le32(m + 16);
    h->insecure = (mesh_get_le32(m + 20) & TCP_HELLO_INSECURE) != 0;
    memcpy(h->job, m + 24, MESH_JOB_MAX);
    memcpy(h->fp, m + 24 + MESH_JOB_MAX, TCP_FP_LEN);
    memcpy(h->nonce, m + 24 + MESH_JOB_MAX + TCP_FP_LEN, TCP_NONCE_LEN);
}

int tcp_hello_check(const struct tcp_hello *h, const struct tcp_hs_self *self,
                    int *identified, char *why, size_t whylen)
{
    size_t jl = strnlen(self->job_id, MESH_JOB_MAX);
    char job[MESH_JOB_MAX + 1];

    *identified = 0;
    if (h->magic != TCP_HS_MAGIC) {
        snprintf(why, whylen,
                 "not a meshtrain handshake (bad magic 0x%08" PRIx32 ")",
                 h->magic);
        return -EPROTO;
    }
    if (h->version != TCP_PROTO_VERSION) {
        snprintf(why, whylen, "protocol version %" PRIu32 ", expected %u",
                 h->version, TCP_PROTO_VERSION);
        return -EPROTO;
    }
    tcp_clean_text(job, sizeof(job), h->job, MESH_JOB_MAX);
    if (strnlen((const char *)h->job, MESH_JOB_MAX) != jl ||
        memcmp(h->job, self->job_id, jl)) {
        snprintf(why, whylen, "wrong job id '%s', expected '%s'", job,
                 self->job_id);
        return -EPERM;
    }
    if (h->size != (uint32_t)self->size) {
        snprintf(why, whylen,
                 "world size %" PRIu32 ", expected %d (the hostfiles "
                 "differ: %" PRIu32 " slots there, %d here)",
                 h->size, self->size, h->size, self->size);
        return -EPERM;
    }
    if (!self->dialer) {
        /* The higher rank dials the lower: only higher ranks call us. */
        if (h->rank >= (uint32_t)self->size ||
            h->rank <= (uint32_t)self->rank) {
            snprintf(why, whylen,
                     "unknown rank %" PRIu32 " (world of %d; only ranks "
                     "above %d dial this one)",
                     h->rank, self->size, self->rank);
            return -EPERM;
        }
        if (h->stream > (uint32_t)self->streams) {
            snprintf(why, whylen,
                     "unknown stream %" PRIu32 " (rank %" PRIu32
                     ", %d data streams)",
                     h->stream, h->rank, self->streams);
            return -EPERM;
        }
        *identified = 1;
    } else if (h->rank != (uint32_t)self->peer ||
               h->stream != (uint32_t)self->stream) {
        snprintf(why, whylen,
                 "the peer answered as rank %" PRIu32 " stream %" PRIu32
                 ", expected rank %d stream %d",
                 h->rank, h->stream, self->peer, self->stream);
        return -EPERM;
    }
    if (h->insecure != !self->secure) {
        snprintf(why, whylen, "authentication differs: %s here, %s there",
                 self->secure ? "a secret" : "insecure",
                 h->insecure ? "insecure" : "a secret");
        return -EPERM;
    }
    return 0;
}

int tcp_hello_world_differs(const struct tcp_hello *h,
                            const struct tcp_hs_self *self)
{
    size_t jl = strnlen(self->job_id, MESH_JOB_MAX);

    return h->magic == TCP_HS_MAGIC && h->version == TCP_PROTO_VERSION &&
           strnlen((const char *)h->job, MESH_JOB_MAX) == jl &&
           !memcmp(h->job, self->job_id, jl) && h->size != (uint32_t)self->size;
}

int tcp_auth_mac(const uint8_t *secret, size_t secret_len,
                 const struct tcp_transcript *tr, int role, uint8_t *mac)
{
    uint8_t msg[16 + 1 + 2 * TCP_NONCE_LEN + 12 + 2 * TCP_FP_LEN];
    unsigned int maclen = 0;
    size_t n;

    memcpy(msg, "meshtrain-auth1", 16);
    n = 16;
    msg[n++] = (uint8_t)role;
    memcpy(msg + n, tr->nonce_d, TCP_NONCE_LEN);
    n += TCP_NONCE_LEN;
    memcpy(msg + n, tr->nonce_a, TCP_NONCE_LEN);
    n += TCP_NONCE_LEN;
    mesh_put_le32(msg + n, tr->rank_d);
    mesh_put_le32(msg + n + 4, tr->rank_a);
    mesh_put_le32(msg + n + 8, tr->stream);
    n += 12;
    memcpy(msg + n, tr->fp_d, TCP_FP_LEN);
    n += TCP_FP_LEN;
    memcpy(msg + n, tr->fp_a, TCP_FP_LEN);
    n += TCP_FP_LEN;
    if (!secret) {
        memset(mac, 0, TCP_MAC_LEN);
        return 0;
    }
    if (!HMAC(EVP_sha256(), secret, (int)secret_len, msg, n, mac, &maclen) ||
        maclen != TCP_MAC_LEN)
        return mesh_err(-EIO, "HMAC-SHA256 failed");
    return 0;
}

int tcp_auth_verify(const uint8_t *secret, size_t secret_len,
                    const struct tcp_transcript *tr, int role,
                    const uint8_t *got)
{
    uint8_t want[TCP_MAC_LEN];
    int rc = tcp_auth_mac(secret, secret_len, tr, role, want);

    if (rc < 0)
        return rc;
    if (secret && CRYPTO_memcmp(want, got, TCP_MAC_LEN))
        return -EACCES;
    return 0;
}

int tcp_config_len_check(uint32_t len, char *why, size_t whylen)
{
    if (len <= TCP_CONFIG_WIRE_MAX)
        return 0;
    snprintf(why, whylen, "configuration of %" PRIu32 " bytes (at most %d)",
             len, TCP_CONFIG_WIRE_MAX);
    return -EMSGSIZE;
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

/* The number that starts a "view=N:..." line's value: 0, or -1. */
static int config_view(const char *cfg, size_t len, uint64_t *n)
{
    const char *v;
    size_t vl, i;

    config_get(cfg, len, MESH_CONFIG_VIEW, strlen(MESH_CONFIG_VIEW), &v, &vl);
    if (!v || !vl || vl > 40)
        return -1;
    *n = 0;
    for (i = 0; i < vl && v[i] >= '0' && v[i] <= '9'; i++) {
        if (*n > (UINT64_MAX - 9) / 10)
            return -1;
        *n = *n * 10 + (uint64_t)(v[i] - '0');
    }
    return i ? 0 : -1;
}

int tcp_config_view_order(const char *a, size_t alen, const char *b,
                          size_t blen)
{
    uint64_t na, nb;

    if (config_view(a, alen, &na) < 0 || config_view(b, blen, &nb) < 0 ||
        na == nb)
        return 0;
    return na > nb ? 1 : -1;
}

void tcp_config_diff(const char *a, size_t alen, const char *b, size_t blen,
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
                /* the layout is a digest: say what it digests */
                snprintf(out, outlen, "%s%s%s here, %s%s%s there%s", key,
                         va ? "=" : " ", va ? sa : "unset", key, vb ? "=" : " ",
                         vb ? sb : "unset",
                         strcmp(key, "layout") ? ""
                                               : " (the hostfiles list other "
                                                 "hosts or ports for the "
                                                 "slots)");
                return;
            }
            p = le + 1;
        }
    }
    snprintf(out, outlen, "the fingerprints differ but no key does");
}

/* ---- data frames --------------------------------------------------------- */

void tcp_frame_encode(const struct mesh_frame *f, uint8_t *h)
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

int tcp_frame_decode(const uint8_t *h, struct mesh_frame *f)
{
    if (mesh_get_le32(h) != TCP_FRAME_MAGIC || h[6] || h[7] ||
        mesh_get_le32(h + 12))
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
