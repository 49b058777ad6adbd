/*
 * transport/tcp/tcp.h: the TCP transport's wire formats and what the rest
 * of transport/ uses of it (the layouts and the design are in
 * transport/tcp/tcp-internal.h). Nothing outside transport/ and its tests
 * includes this.
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
