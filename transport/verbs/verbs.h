/*
 * transport/verbs/verbs.h: wire formats and test hooks of the RDMA verbs
 * transport (transport/verbs/; its layouts and design are in
 * transport/verbs/verbs-internal.h). Nothing outside transport/ and its
 * tests includes this.
 *
 * The verbs transport opens a TCP mesh (transport/tcp/) first and uses it
 * for everything that is not payload: the authenticated join, the exchange
 * of QP details (only after the TCP handshake has authenticated the peer),
 * failure and abort propagation, and the goodbye. Its own control messages
 * travel on the TCP mesh as point-to-point frames with seq VERBS_CTRL_SEQ.
 *
 * Per peer, Q reliable-connected queue pairs (Q = --streams, at most
 * VERBS_QP_MAX) carry the data, receiver-driven:
 *
 *   receiver -> sender  SEND  CTS (clear to send): the expected frame, the
 *                             destination address and rkey, a slot number
 *                             and its generation; at most VERBS_CREDITS
 *                             slots per peer are outstanding
 *   sender -> receiver  RDMA WRITE pieces into that window, the last one
 *                             WRITE_WITH_IMM: imm = final | gen | slot
 *
 * The sender matches the CTS against its send exactly as the TCP receiver
 * matches a frame header (same desync and bounds checks, same messages);
 * every field of a CTS and every immediate is checked before use.
 */
#ifndef MESH_TRANSPORT_VERBS_VERBS_H
#define MESH_TRANSPORT_VERBS_VERBS_H

#include "transport/transport.h"

#include <stdint.h>

#define VERBS_QP_MAX       8
#define VERBS_CREDITS      32         /* outstanding CTS slots per peer */
#define VERBS_WRITE_WINDOW 32         /* write WQEs in flight per QP */
#define VERBS_PIECE        (1u << 20) /* bytes per RDMA write */

/* The TCP mesh's frames that belong to the verbs transport itself. */
#define VERBS_CTRL_SEQ UINT64_MAX
enum verbs_ctrl_tag {
    VERBS_TAG_INFO = 1,  /* QP details, once per peer after the join */
    VERBS_TAG_READY = 2, /* every QP of the sender is ready to send */
    VERBS_TAG_BYE = 3,   /* the sender closes its verbs side normally */
};

/*
 * INFO (128 bytes): u32 magic, u32 version, u32 active (1: this rank has an
 * active port and wants verbs), u32 nqp, u16 lid, u8 mtu (enum ibv_mtu),
 * u8 link layer, u8 gid[16], u8 use_gid, u8 pad[3], u32 qpn[8], u32 psn[8],
 * zero padding.
 */
#define VERBS_INFO_MAGIC   0x31425649u /* "IVB1" */
#define VERBS_INFO_VERSION 1u
#define VERBS_INFO_LEN     128

/*
 * CTS (64 bytes): u32 magic, u16 slot, u16 gen, u8 op, u8 dtype, u16 zero,
 * u32 tag, u64 seq, u64 count, u64 offset, u64 length, u64 addr, u32 rkey,
 * u32 zero.
 */
#define VERBS_CTS_MAGIC 0x53544356u /* "VCTS" */
#define VERBS_CTS_LEN   64

/* Immediate data of the last write of a message (host order here). */
#define VERBS_IMM_FINAL     0x80000000u
#define VERBS_IMM_GEN(imm)  (((imm) >> 16) & 0x7fffu)
#define VERBS_IMM_SLOT(imm) ((imm)&0xffffu)

/*
 * The formats above, decoded and checked without a device (wire.c; the
 * transport's data.c and device.c apply them to what arrives, and
 * tests/fuzz_verbs runs them anywhere). A peer's bytes are used only
 * after these checks pass; each refusal is -EPROTO with a message
 * (mesh_err) that names the peer, as "rank P (NAME)", and the field.
 */

/* INFO as decoded. */
struct verbs_info {
    int active;
    uint32_t nqp;
    uint16_t lid;
    uint8_t mtu, link_layer, use_gid;
    uint8_t gid[16];
    uint32_t qpn[VERBS_QP_MAX], psn[VERBS_QP_MAX];
};

/*
 * Decode and check peer's INFO m (VERBS_INFO_LEN bytes) against this
 * rank's nqp and whether it uses a GID: magic, version, the active flag
 * (0 or 1), and of an active peer: its number of QPs, the MTU (an enum
 * ibv_mtu, 256 to 4096 bytes), the link layer, the GID flag, a LID a
 * unicast one where no GID is used, a GID not all zero where one is, each
 * QP number (24 bits, not 0) and PSN (24 bits), and the zero padding.
 */
int verbs_info_check(const uint8_t *m, int peer, const char *pname, int nqp,
                     int use_gid, struct verbs_info *out);
/* Whether a peer's route is one a QP can take: a GID not all zeros where
 * GIDs route (RoCE), else a unicast LID (0x0001 to 0xbfff). */
int verbs_route_ok(int use_gid, uint16_t lid, const uint8_t gid[16]);

/* A CTS as decoded. */
struct verbs_cts_hdr {
    struct mesh_frame f; /* the receive's expected frame */
    uint64_t addr;       /* its window in the receiver's memory */
    uint32_t rkey;
    uint16_t slot, gen;
};

/* The sender's record of a peer's grants: per slot, the generation of
 * its last CTS, and whether that one is still open (not all sends
 * matched). */
struct verbs_grants {
    uint16_t gen[VERBS_CREDITS];
    uint8_t open[VERBS_CREDITS];
};

/*
 * Decode and check a CTS of len bytes m that peer sent on QP qpi of nqp,
 * against g: its length, magic and zero bytes, a slot of the peer's
 * VERBS_CREDITS on the QP it belongs to (slot % nqp), its generation the
 * one after the slot's last (15 bits), no open grant of that slot, a
 * known op and dtype, a range (offset + length) that does not wrap, and a
 * window (addr + length) that does not wrap, not at address 0. On success
 * g records the grant open (the caller closes it once its sends took all
 * of it).
 */
int verbs_cts_check(const uint8_t *m, uint32_t len, int qpi, int nqp,
                    struct verbs_grants *g, int peer, const char *pname,
                    struct verbs_cts_hdr *out);

/* What the receiver granted in one slot (verbs_imm_check). */
struct verbs_slot_view {
    int open;        /* a receive holds the slot */
    uint16_t gen;    /* of its CTS */
    uint64_t length; /* of its window */
};

/*
 * Check the immediate imm (host order) of a write-with-immediate that
 * completed on QP qpi of nqp, its last write byte_len bytes long, against
 * what this rank granted in the slot it names (s: that slot's view; the
 * caller reads it only for a slot below VERBS_CREDITS, else passes one
 * not open): a slot of ours, open, of the same generation, the final
 * flag, the slot's QP (the writes before it went there: RC orders them
 * only on one QP), and a last write no longer than the window.
 */
int verbs_imm_check(uint32_t imm, int qpi, int nqp, uint32_t byte_len,
                    const struct verbs_slot_view *s, int peer,
                    const char *pname);

/*
 * Test hooks (tests/verbs only). The next RDMA write of this process uses
 * a wrong rkey (BAD_RKEY) or lands past the end of the receiver's window
 * (OVERRUN, the CTS bound check skipped): the target HCA must refuse it
 * and the job must fail naming the status, never corrupt memory. The
 * next send's writes go on another QP than its slot's (IMM_QP, with 2 QPs
 * or more), or the next CTS carries the generation after its own
 * (CTS_GEN): the peer's checks (verbs_imm_check, verbs_cts_check) must
 * fail the job naming this rank and the field.
 */
enum {
    VERBS_DEBUG_BAD_RKEY = 1,
    VERBS_DEBUG_OVERRUN = 2,
    VERBS_DEBUG_IMM_QP = 4,
    VERBS_DEBUG_CTS_GEN = 8,
};
void mesh_verbs_debug_set(int flags);

/* Live entries of t's registration cache (ibv_reg_mr not yet undone),
 * including per-operation registrations in flight; -1 if t is not verbs. */
int mesh_verbs_mr_live(mesh_transport_t *t);

/* 1 when t moves data by RDMA, 0 when it fell back to TCP (auto). */
int mesh_verbs_active(mesh_transport_t *t);

#endif
