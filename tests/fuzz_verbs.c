/*
 * tests/fuzz_verbs.c: hostile bytes that reach the verbs transport outside
 * the TCP mesh's checked frames (transport/verbs/wire.c, as device.c and
 * data.c apply it): a peer's QP details (INFO), its clear-to-sends, and
 * the immediates of its writes into our memory. No RDMA device needed.
 *
 * Rank 0 talks to rank 1 (10.0.0.2:29401). Byte 0: bits 0-2 the QPs per
 * peer less 1, bit 3 whether the ranks use a GID. Then records, each a
 * kind byte (its value % 4) and its bytes:
 *   0  INFO: 128 bytes (verbs_info_check)
 *   1  CTS: the QP it came on (% QPs), its length n, n bytes
 *      (verbs_cts_check against the grants so far)
 *   2  our sends took all of a grant: the slot (% VERBS_CREDITS)
 *   3  a write-with-immediate completed: the immediate (u32 LE), the QP
 *      (% QPs), the last write's bytes (u32 LE), against our grants:
 *      slot s open unless s % 3 == 2, at generation 7 s + 1, a window of
 *      1000 s bytes; an accepted one closes its slot (verbs_imm_check)
 * A record cut short ends the input. Checked: what is accepted is what
 * the transport may use (a slot of the peer's on its QP, the generation
 * after the slot's last, no second open grant, a range and a window that
 * do not wrap; an immediate of an open grant of its generation, final,
 * on its QP, no longer than its window); a refusal names the peer.
 */
#include "config.h"

#include "tests/fuzz.h"
#include "transport/verbs/verbs.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/util.h"

#include <string.h>

const char fuzz_name[] = "verbs";

#define PEER "rank 1 (10.0.0.2:29401)"

static const char *const must[] = {PEER};

/* What the harness grants in slot s (record kind 3). */
static struct verbs_slot_view granted(int s)
{
    return (struct verbs_slot_view){.open = s % 3 != 2,
                                    .gen = (uint16_t)((7 * s + 1) & 0x7fff),
                                    .length = 1000u * (unsigned)s};
}

static void info_accepted(const struct verbs_info *r, int nqp, int use_gid)
{
    if (!r->active)
        return;
    if (r->nqp != (uint32_t)nqp || r->mtu < 1 || r->mtu > 5 ||
        (r->use_gid != 0) != use_gid || r->link_layer > 2)
        fuzz_fail("INFO accepted with nqp %u, MTU %u, GID flag %u",
                  (unsigned)r->nqp, r->mtu, r->use_gid);
    for (int q = 0; q < nqp; q++)
        if (!r->qpn[q] || r->qpn[q] > 0xffffff || r->psn[q] > 0xffffff)
            fuzz_fail("INFO accepted with QP %d number 0x%x PSN 0x%x", q,
                      (unsigned)r->qpn[q], (unsigned)r->psn[q]);
}

static void cts_accepted(const struct verbs_cts_hdr *c, int qpi, int nqp,
                         uint16_t gen_before, const struct verbs_grants *g)
{
    if (c->slot >= VERBS_CREDITS || c->slot % nqp != qpi)
        fuzz_fail("CTS accepted for slot %u on QP %d of %d", c->slot, qpi, nqp);
    if (c->gen != ((gen_before + 1) & 0x7fff) || !g->open[c->slot] ||
        g->gen[c->slot] != c->gen)
        fuzz_fail("CTS accepted for slot %u generation %u after %u", c->slot,
                  c->gen, gen_before);
    if (c->f.offset + c->f.length < c->f.offset ||
        (c->f.length && (!c->addr || c->addr + c->f.length < c->addr)))
        fuzz_fail("CTS accepted with a window that wraps");
    if (!mesh_dtype_size(c->f.dtype))
        fuzz_fail("CTS accepted with dtype %u", c->f.dtype);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    struct verbs_grants g;
    int closed[VERBS_CREDITS] = {0};
    int nqp, use_gid, rc = 0;
    size_t at = 1;

    memset(&g, 0, sizeof(g));
    mesh_err_clear();
    fuzz_answer(0, NULL, 0);
    if (len < 1)
        return 0;
    nqp = 1 + (data[0] & 7);
    use_gid = (data[0] >> 3) & 1;
    while (at < len && rc == 0) {
        int kind = data[at++] % 4;

        if (kind == 0) {
            struct verbs_info r;

            if (len - at < VERBS_INFO_LEN)
                break;
            rc = verbs_info_check(data + at, 1, "10.0.0.2:29401", nqp, use_gid,
                                  &r);
            if (rc == 0)
                info_accepted(&r, nqp, use_gid);
            at += VERBS_INFO_LEN;
        } else if (kind == 1) {
            struct verbs_cts_hdr c;
            uint8_t m[256];
            int qpi;
            size_t n;
            uint16_t before;

            if (len - at < 2)
                break;
            qpi = data[at] % nqp;
            n = data[at + 1];
            at += 2;
            if (len - at < n)
                break;
            /* the transport's receive buffers hold a CTS and no more:
             * the length is what the completion says */
            memset(m, 0, sizeof(m));
            memcpy(m, data + at, n);
            at += n;
            before = n >= 6 ? g.gen[mesh_get_le16(m + 4) % VERBS_CREDITS] : 0;
            rc = verbs_cts_check(m, (uint32_t)n, qpi, nqp, &g, 1,
                                 "10.0.0.2:29401", &c);
            if (rc == 0)
                cts_accepted(&c, qpi, nqp, before, &g);
        } else if (kind == 2) {
            if (len - at < 1)
                break;
            g.open[data[at++] % VERBS_CREDITS] = 0;
        } else {
            struct verbs_slot_view sv = {0};
            uint32_t imm, bl;
            unsigned slot;
            int qpi;

            if (len - at < 9)
                break;
            imm = mesh_get_le32(data + at);
            qpi = data[at + 4] % nqp;
            bl = mesh_get_le32(data + at + 5);
            at += 9;
            slot = VERBS_IMM_SLOT(imm);
            if (slot < VERBS_CREDITS && !closed[slot])
                sv = granted((int)slot);
            rc = verbs_imm_check(imm, qpi, nqp, bl, &sv, 1, "10.0.0.2:29401");
            if (rc == 0) {
                if (!sv.open || VERBS_IMM_GEN(imm) != sv.gen ||
                    !(imm & VERBS_IMM_FINAL) || (int)(slot % nqp) != qpi ||
                    bl > sv.length)
                    fuzz_fail("immediate 0x%08x accepted on QP %d, %u bytes",
                              (unsigned)imm, qpi, (unsigned)bl);
                closed[slot] = 1;
            }
        }
    }
    fuzz_answer(rc, must, 1);
    return 0;
}
