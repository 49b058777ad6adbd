/*
 * transport/tcp/tcp.h: the TCP transport's wire formats, and its handshake
 * messages as pure functions (transport/tcp/wire.c). The layouts and the
 * design are in transport/tcp/tcp-internal.h. Nothing outside transport/
 * and its tests includes this.
 *
 * Every link between two ranks is one control connection (stream 0:
 * handshake, heartbeats, abort notices, goodbye) plus S data connections
 * (streams 1..S: frames). The higher rank dials the lower. Every connection
 * opens with the same handshake, all messages fixed-size:
 *
 *   dialer -> acceptor   HELLO   (magic, version, job, world, rank, stream,
 *                                 flags, config fingerprint, nonce)
 *   acceptor -> dialer   HELLO   (only after the dialer's checked out)
 *   dialer -> acceptor   AUTH    HMAC-SHA256(secret, transcript, role 'D')
 *   acceptor -> dialer   AUTH    HMAC-SHA256(secret, transcript, role 'A')
 *   (fingerprints differ: both send CONFIG = u32 length + text, then drop)
 *
 * All integers are little-endian.
 */
#ifndef MESH_TRANSPORT_TCP_TCP_H
#define MESH_TRANSPORT_TCP_TCP_H

#include "common/bytes.h"
#include "transport/transport.h"

#include <stddef.h>
#include <stdint.h>

#define TCP_HS_MAGIC      0x3148534du /* "MSH1" */
#define TCP_PROTO_VERSION 1u
#define TCP_FRAME_MAGIC   0x4d52464du /* "MFRM" */

#define TCP_NONCE_LEN 32
#define TCP_FP_LEN    32 /* SHA-256 */
#define TCP_MAC_LEN   32 /* HMAC-SHA256 */

/* HELLO: u32 magic, u32 version, u32 world size, u32 rank, u32 stream,
 * u32 flags, char job[MESH_JOB_MAX], u8 fp[32], u8 nonce[32]. */
#define TCP_HELLO_LEN      (6 * 4 + MESH_JOB_MAX + TCP_FP_LEN + TCP_NONCE_LEN)
#define TCP_HELLO_INSECURE 1u /* flags: the sender runs without a secret */

/* CONFIG: u32 length, then that many bytes of "key=value\n" text. */
#define TCP_CONFIG_WIRE_MAX (MESH_CONFIG_MAX + 64)

/*
 * Data frame header (48 bytes): u32 magic, u8 op, u8 dtype, u16 zero,
 * u32 tag, u32 zero, u64 seq, u64 count, u64 offset, u64 length; then
 * length payload bytes.
 */
#define TCP_FRAME_HDR_LEN 48

/*
 * Control message (fixed 512 bytes): u32 type, i32 culprit, u32 error code
 * (positive errno), u32 reason length, char reason[496].
 */
#define TCP_CTRL_LEN        512
#define TCP_CTRL_REASON_MAX (TCP_CTRL_LEN - 16)
enum tcp_ctrl_type {
    TCP_CTRL_HEARTBEAT = 1,
    TCP_CTRL_ABORT = 2, /* the job failed: culprit + reason */
    TCP_CTRL_BYE = 3,   /* the sender closes the mesh normally */
};

/*
 * The handshake's messages as pure functions (transport/tcp/wire.c): no
 * sockets, no transport object. Checks return 0, or a negative errno with
 * the refusal's words in why (as the acceptor logs them).
 */

/* A HELLO, field by field. */
struct tcp_hello {
    uint32_t magic; /* TCP_HS_MAGIC (encode writes it) */
    uint32_t version;
    uint32_t size;             /* world size */
    uint32_t rank;             /* the sender's */
    uint32_t stream;           /* 0 control, 1..S data */
    int insecure;              /* the sender runs without a secret */
    uint8_t job[MESH_JOB_MAX]; /* the job id, zero-padded */
    uint8_t fp[TCP_FP_LEN];    /* the configuration's SHA-256 */
    uint8_t nonce[TCP_NONCE_LEN];
};

/* What the receiver of a HELLO expects. */
struct tcp_hs_self {
    const char *job_id;
    int size, rank;   /* the world, this rank */
    int streams;      /* data streams per link */
    int secure;       /* this rank has a secret */
    int dialer;       /* this side dialed... */
    int peer, stream; /* ...this rank's stream (dialer only) */
};

void tcp_hello_encode(const struct tcp_hello *h, uint8_t *m);
void tcp_hello_decode(const uint8_t *m, struct tcp_hello *h);
/*
 * Check a decoded HELLO against self, in the order the acceptor refuses
 * it. *identified = 1 when the acceptor has taken the sender's rank and
 * stream as valid (later refusals name that rank).
 */
int tcp_hello_check(const struct tcp_hello *h, const struct tcp_hs_self *self,
                    int *identified, char *why, size_t whylen);
/*
 * 1 when h is a HELLO of this job and protocol whose world size differs
 * from self's: the peer runs with another hostfile (or -H). The acceptor
 * answers such a HELLO with its own before it refuses, so that the dialer
 * fails its join at once, naming both sizes, instead of dialing again
 * until --join-timeout (HELLO is not authenticated: a process that answers
 * at a peer's address can only make the join fail sooner).
 */
int tcp_hello_world_differs(const struct tcp_hello *h,
                            const struct tcp_hs_self *self);

/* Both sides' view of one connection's handshake, dialer (d) and acceptor
 * (a) alike. */
struct tcp_transcript {
    uint8_t nonce_d[TCP_NONCE_LEN], nonce_a[TCP_NONCE_LEN];
    uint32_t rank_d, rank_a, stream;
    uint8_t fp_d[TCP_FP_LEN], fp_a[TCP_FP_LEN];
};

/*
 * The proof of one role ('D' dialer, 'A' acceptor): HMAC-SHA256 under the
 * secret over "meshtrain-auth1\0", the role, both nonces, both ranks, the
 * stream and both fingerprints, so that no answer can be replayed or
 * reflected; all zero without a secret (insecure). 0 or -EIO.
 */
int tcp_auth_mac(const uint8_t *secret, size_t secret_len,
                 const struct tcp_transcript *tr, int role, uint8_t *mac);
/* Whether got is role's proof: 0, -EACCES (it is not), or -EIO. */
int tcp_auth_verify(const uint8_t *secret, size_t secret_len,
                    const struct tcp_transcript *tr, int role,
                    const uint8_t *got);

/* A CONFIG's announced length: 0, or -EMSGSIZE past TCP_CONFIG_WIRE_MAX. */
int tcp_config_len_check(uint32_t len, char *why, size_t whylen);
/* Name the first key whose value differs between two "key=value\n"
 * configurations: "k=v here, k=w there" (or "k unset"). */
void tcp_config_diff(const char *a, size_t alen, const char *b, size_t blen,
                     char *out, size_t outlen);
/*
 * Order two configurations by their MESH_CONFIG_VIEW lines ("view=N:..."):
 * 1 when a's N is the higher, -1 when b's is, 0 when they are equal or
 * either has no such line (or no number in it).
 */
int tcp_config_view_order(const char *a, size_t alen, const char *b,
                          size_t blen);
/*
 * An ABORT's error code as it came (a positive errno, untrusted) as the
 * failure every survivor reports: -ECONNRESET, -EHOSTDOWN, -EPROTO,
 * -ECANCELED or -ESHUTDOWN as sent, anything else -ECONNABORTED.
 */
int tcp_ctrl_code(uint32_t wire);
/* Copy at most len bytes of untrusted text, replacing non-printables. */
void tcp_clean_text(char *dst, size_t dstlen, const uint8_t *src, size_t len);

/*
 * A data frame's 48-byte header (layout above): encode, and decode with
 * its checks (magic, reserved bytes zero); -1 for a bad header. The
 * decoded frame's order is 0 (local to the sender).
 */
void tcp_frame_encode(const struct mesh_frame *f, uint8_t *h);
int tcp_frame_decode(const uint8_t *h, struct mesh_frame *f);

/* Handshake deadline per connection. */
#define TCP_HS_DEADLINE_S 5.0
/*
 * Connections accepted and not yet authenticated, at most (twice the
 * mesh's own connection count where that is more): in all, and from one
 * source address. A newcomer over either limit takes the place of an idle
 * one (nothing received yet) of the same set past its first
 * TCP_HS_GRACE_S; one that has sent bytes already (a peer's HELLO) that of
 * any idle one, else of one past the grace (transport/tcp/join.c,
 * hs_make_room). With none such the newcomer is refused.
 */
#define TCP_HS_PENDING_MAX    256
#define TCP_HS_PER_SOURCE_MAX 64
#define TCP_HS_GRACE_S        0.25

#endif
