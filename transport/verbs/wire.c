/*
 * transport/verbs/wire.c: what a peer sends the verbs transport outside
 * the TCP mesh's checked frames, decoded and checked as pure functions
 * (transport/verbs/verbs.h): its QP details (INFO), its clear-to-sends,
 * and the immediates of the writes that complete our receives. No device
 * and no transport object: device.c and data.c apply them, and
 * tests/fuzz_verbs feeds them hostile bytes on any machine.
 */
#include "config.h"

#include "transport/verbs/verbs.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* enum ibv_mtu's range (IBV_MTU_256 .. IBV_MTU_4096) and enum
 * ibv_link_layer's (UNSPECIFIED, INFINIBAND, ETHERNET), without the
 * verbs header */
#define WIRE_MTU_MIN        1
#define WIRE_MTU_MAX        5
#define WIRE_LINK_LAYER_MAX 2
#define WIRE_LID_UNICAST    0xc000u /* multicast LIDs from here */

/* Whether bytes [from, to) of m are all zero. */
static int zero_bytes(const uint8_t *m, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (m[i])
            return 0;
    return 1;
}

int verbs_route_ok(int use_gid, uint16_t lid, const uint8_t gid[16])
{
    return use_gid ? !zero_bytes(gid, 0, 16)
                   : lid != 0 && lid < WIRE_LID_UNICAST;
}

int verbs_info_check(const uint8_t *m, int peer, const char *pname, int nqp,
                     int use_gid, struct verbs_info *out)
{
    struct verbs_info r;
    uint32_t active;

    memset(&r, 0, sizeof(r));
    if (mesh_get_le32(m) != VERBS_INFO_MAGIC ||
        mesh_get_le32(m + 4) != VERBS_INFO_VERSION)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details of an unknown "
                        "format (magic 0x%08" PRIx32 " version %" PRIu32 ")",
                        peer, pname, mesh_get_le32(m), mesh_get_le32(m + 4));
    active = mesh_get_le32(m + 8);
    if (active > 1)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details with active "
                        "flag %" PRIu32 " (0 or 1)",
                        peer, pname, active);
    r.active = (int)active;
    r.nqp = mesh_get_le32(m + 12);
    if (!r.active) {
        *out = r;
        return 0;
    }
    if (r.nqp != (uint32_t)nqp)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) has %" PRIu32
                        " QPs per peer, this rank %d",
                        peer, pname, r.nqp, nqp);
    r.lid = mesh_get_le16(m + 16);
    r.mtu = m[18];
    r.link_layer = m[19];
    memcpy(r.gid, m + 20, 16);
    r.use_gid = m[36];
    if (r.mtu < WIRE_MTU_MIN || r.mtu > WIRE_MTU_MAX)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details with MTU code %u "
                        "(enum ibv_mtu: %d to %d)",
                        peer, pname, r.mtu, WIRE_MTU_MIN, WIRE_MTU_MAX);
    if (r.link_layer > WIRE_LINK_LAYER_MAX)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details with link layer "
                        "%u (enum ibv_link_layer: 0 to %d)",
                        peer, pname, r.link_layer, WIRE_LINK_LAYER_MAX);
    if (r.use_gid > 1)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details with GID flag %u "
                        "(0 or 1)",
                        peer, pname, r.use_gid);
    if ((r.use_gid != 0) != (use_gid != 0))
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) %s a GID, this rank %s (mixed "
                        "InfiniBand and RoCE? see --gid-index)",
                        peer, pname, r.use_gid ? "uses" : "does not use",
                        use_gid ? "does" : "does not");
    if (r.use_gid && !verbs_route_ok(1, r.lid, r.gid))
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details with GID flag 1 "
                        "and a GID of zeros",
                        peer, pname);
    if (!r.use_gid && !verbs_route_ok(0, r.lid, r.gid))
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details with LID 0x%04x "
                        "and no GID (a unicast LID is 0x0001 to 0xbfff)",
                        peer, pname, r.lid);
    for (int q = 0; q < VERBS_QP_MAX; q++) {
        r.qpn[q] = mesh_get_le32(m + 40 + 4 * q);
        r.psn[q] = mesh_get_le32(m + 72 + 4 * q);
        if (q >= nqp) {
            if (r.qpn[q] || r.psn[q])
                return mesh_err(-EPROTO,
                                "verbs: rank %d (%s) sent QP details with QP "
                                "%d of %d set (QP number 0x%" PRIx32
                                ", PSN 0x%" PRIx32 ")",
                                peer, pname, q, nqp, r.qpn[q], r.psn[q]);
            continue;
        }
        if (!r.qpn[q] || r.qpn[q] > 0xffffff)
            return mesh_err(-EPROTO,
                            "verbs: rank %d (%s) sent QP details with QP "
                            "number 0x%" PRIx32 " for QP %d (24 bits, not 0)",
                            peer, pname, r.qpn[q], q);
        if (r.psn[q] > 0xffffff)
            return mesh_err(-EPROTO,
                            "verbs: rank %d (%s) sent QP details with PSN "
                            "0x%" PRIx32 " for QP %d (24 bits)",
                            peer, pname, r.psn[q], q);
    }
    if (!zero_bytes(m, 37, 40) || !zero_bytes(m, 104, VERBS_INFO_LEN))
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details with padding "
                        "bytes that are not zero",
                        peer, pname);
    *out = r;
    return 0;
}

int verbs_cts_check(const uint8_t *m, uint32_t len, int qpi, int nqp,
                    struct verbs_grants *g, int peer, const char *pname,
                    struct verbs_cts_hdr *out)
{
    struct verbs_cts_hdr c;
    uint16_t want;

    if (len != VERBS_CTS_LEN)
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send of %" PRIu32
                        " bytes on QP %d (one is %d)",
                        peer, pname, len, qpi, VERBS_CTS_LEN);
    if (mesh_get_le32(m) != VERBS_CTS_MAGIC)
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send with magic "
                        "0x%08" PRIx32 " on QP %d",
                        peer, pname, mesh_get_le32(m), qpi);
    if (m[10] || m[11] || mesh_get_le32(m + 60))
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send with reserved "
                        "bytes that are not zero on QP %d",
                        peer, pname, qpi);
    memset(&c, 0, sizeof(c));
    c.slot = mesh_get_le16(m + 4);
    c.gen = mesh_get_le16(m + 6);
    c.f.op = m[8];
    c.f.dtype = m[9];
    c.f.tag = mesh_get_le32(m + 12);
    c.f.seq = mesh_get_le64(m + 16);
    c.f.count = mesh_get_le64(m + 24);
    c.f.offset = mesh_get_le64(m + 32);
    c.f.length = mesh_get_le64(m + 40);
    c.addr = mesh_get_le64(m + 48);
    c.rkey = mesh_get_le32(m + 56);
    if (c.slot >= VERBS_CREDITS)
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send for slot %u (it "
                        "has %d)",
                        peer, pname, c.slot, VERBS_CREDITS);
    if (nqp < 1 || c.slot % nqp != qpi)
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send for slot %u on QP "
                        "%d, not on its QP %d",
                        peer, pname, c.slot, qpi, nqp < 1 ? -1 : c.slot % nqp);
    want = (uint16_t)((g->gen[c.slot] + 1) & 0x7fff);
    if (g->open[c.slot])
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send for slot %u "
                        "(generation %u) while its grant of generation %u is "
                        "open (this rank's sends have not taken all of it)",
                        peer, pname, c.slot, c.gen, g->gen[c.slot]);
    if (c.gen != want)
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send for slot %u with "
                        "generation %u, expected %u",
                        peer, pname, c.slot, c.gen, want);
    if (!strcmp(mesh_op_name(c.f.op), "unknown-op") ||
        !mesh_dtype_size(c.f.dtype))
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send for slot %u with "
                        "op %u and dtype %u (one unknown)",
                        peer, pname, c.slot, c.f.op, c.f.dtype);
    if (c.f.offset + c.f.length < c.f.offset)
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send for slot %u whose "
                        "range wraps (offset %" PRIu64 ", length %" PRIu64 ")",
                        peer, pname, c.slot, c.f.offset, c.f.length);
    if (c.f.length && (!c.addr || c.addr + c.f.length < c.addr))
        return mesh_err(-EPROTO,
                        "rank %d (%s) sent a clear-to-send for slot %u whose "
                        "window is not in memory (address 0x%" PRIx64
                        ", length %" PRIu64 ")",
                        peer, pname, c.slot, c.addr, c.f.length);
    g->gen[c.slot] = c.gen;
    g->open[c.slot] = 1;
    *out = c;
    return 0;
}

int verbs_imm_check(uint32_t imm, int qpi, int nqp, uint32_t byte_len,
                    const struct verbs_slot_view *s, int peer,
                    const char *pname)
{
    unsigned slot = VERBS_IMM_SLOT(imm), gen = VERBS_IMM_GEN(imm);

    if (slot >= VERBS_CREDITS || !s->open || gen != s->gen)
        return mesh_err(-EPROTO,
                        "rank %d (%s) completed a write for slot %u "
                        "generation %u, which this rank never granted "
                        "(immediate 0x%08" PRIx32 ")",
                        peer, pname, slot, gen, imm);
    if (!(imm & VERBS_IMM_FINAL))
        return mesh_err(-EPROTO,
                        "rank %d (%s) completed a write for slot %u without "
                        "the final flag (immediate 0x%08" PRIx32 "): its "
                        "sends did not fill the window of %" PRIu64 " bytes",
                        peer, pname, slot, imm, s->length);
    if (nqp < 1 || (int)(slot % (unsigned)nqp) != qpi)
        return mesh_err(-EPROTO,
                        "rank %d (%s) completed a write for slot %u on QP %d, "
                        "not on the slot's QP %d (the writes before it are "
                        "not ordered with it)",
                        peer, pname, slot, qpi,
                        nqp < 1 ? -1 : (int)(slot % (unsigned)nqp));
    if (byte_len > s->length)
        return mesh_err(-EPROTO,
                        "rank %d (%s) completed a write for slot %u of %" PRIu32
                        " bytes, past its window of %" PRIu64 " bytes",
                        peer, pname, slot, byte_len, s->length);
    return 0;
}
