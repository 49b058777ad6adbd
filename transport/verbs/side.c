/*
 * transport/verbs/side.c: side channels (transport/transport.h, "side
 * channels"): one RC queue pair on a protection domain of its own, for
 * one-sided RDMA reads outside a mesh (train/catchup.c: a joiner reads
 * the members' snapshot stripes and gradients while it is in no mesh).
 *
 * Shape: the device and port as the verbs transport picks them (--ib-dev,
 * --ib-port, --gid-index), opened once per process user (mesh_side_dev);
 * per channel a PD, a CQ and one QP. Memory registered on a channel is
 * reachable through that QP only: a member exposes to one joiner the
 * stripe it sends that joiner, nothing else. A read is cut into pieces of
 * SIDE_PIECE bytes, SIDE_WINDOW of them posted at a time; RC completes
 * them in order, so the bytes done so far are a prefix of the read.
 *
 * A read whose peer does not answer fails: by the queue pair's retries
 * (qp_retry: within the peer timeout) on an HCA, and in any case once no
 * completion has come for the peer timeout (Soft-RoCE, 6.1's rdma_rxe,
 * never completed a read to a queue pair that does not answer: the
 * verbs lane saw none in 60 s). A channel whose read failed reads no
 * more (its pieces may still be posted): it is closed.
 */
#include "config.h"

#include "transport/verbs/verbs-internal.h"
#include "common/util.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIDE_PIECE  (4u << 20)
#define SIDE_WINDOW 8
#define SIDE_RD_MAX 16 /* outstanding reads asked of a QP */
#define SIDE_MR_MAX 64 /* registrations per channel */

struct mesh_side_dev {
    struct ibv_context *ctx;
    uint8_t port;
    struct ibv_port_attr pattr;
    int gid_index; /* -1: no GRH (InfiniBand by LID) */
    union ibv_gid gid;
    int rd_atom, rd_init; /* the device's max_qp_rd_atom, _init_rd_atom */
    char name[96];
};

struct mesh_side {
    mesh_side_dev_t *d;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t psn;
    int connected;
    double peer_timeout_s;
    struct ibv_mr *mr[SIDE_MR_MAX];
    int nmr;
    /* the read in progress: len bytes into dst (lkey) from raddr (rkey);
     * posted and done so far, WQEs in flight */
    int reading, failed;
    double last; /* the read's start, or its last completion */
    uint8_t *dst;
    size_t len, posted, done;
    uint64_t raddr;
    uint32_t rkey, lkey;
    int inflight;
};

int mesh_side_dev_open(const struct mesh_transport_opts *o,
                       mesh_side_dev_t **out)
{
    struct ibv_device **list;
    struct ibv_device_attr da;
    mesh_side_dev_t *d;
    int n = 0, rc = 0;

    d = calloc(1, sizeof(*d));
    if (!d)
        return mesh_err(-ENOMEM, "out of memory");
    errno = 0;
    list = ibv_get_device_list(&n);
    if (!list) {
        free(d);
        return mesh_err_errno("verbs: ibv_get_device_list");
    }
    for (int i = 0; i < n && !d->ctx; i++) {
        const char *name = ibv_get_device_name(list[i]);
        struct ibv_context *ctx;

        if (o->ib_dev && strcmp(name, o->ib_dev))
            continue;
        ctx = ibv_open_device(list[i]);
        if (!ctx)
            continue;
        if (ibv_query_device(ctx, &da)) {
            ibv_close_device(ctx);
            continue;
        }
        for (int p = 1; p <= da.phys_port_cnt && !d->ctx; p++) {
            if (o->ib_port > 0 && p != o->ib_port)
                continue;
            if (ibv_query_port(ctx, (uint8_t)p, &d->pattr) == 0 &&
                d->pattr.state == IBV_PORT_ACTIVE) {
                d->ctx = ctx;
                d->port = (uint8_t)p;
                d->rd_atom = da.max_qp_rd_atom;
                d->rd_init = da.max_qp_init_rd_atom;
                snprintf(d->name, sizeof(d->name), "%s port %d", name, p);
            }
        }
        if (!d->ctx)
            ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    if (!d->ctx) {
        free(d);
        return mesh_err(-ENODEV, "no active RDMA port%s%s among %d device(s)",
                        o->ib_dev ? " on " : "", o->ib_dev ? o->ib_dev : "", n);
    }
    d->gid_index = -1;
    if (o->gid_index >= 0) {
        if (o->gid_index >= d->pattr.gid_tbl_len) {
            rc = mesh_err(-EINVAL, "--gid-index %d out of range (%s has %d)",
                          o->gid_index, d->name, d->pattr.gid_tbl_len);
            goto close_dev;
        }
        d->gid_index = o->gid_index;
    } else if (d->pattr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        d->gid_index = verbs_rocev2_gid(d->ctx, d->port, d->pattr.gid_tbl_len);
        if (d->gid_index < 0) {
            rc = mesh_err(-ENODEV, "%s (Ethernet) has no RoCE v2 GID", d->name);
            goto close_dev;
        }
    }
    if (d->gid_index >= 0)
        VERBS_CHECK_RC(rc,
                       ibv_query_gid(d->ctx, d->port, d->gid_index, &d->gid),
                       close_dev, "verbs: ibv_query_gid %s index %d", d->name,
                       d->gid_index);
    *out = d;
    return 0;

close_dev:
    ibv_close_device(d->ctx);
    free(d);
    return rc;
}

void mesh_side_dev_close(mesh_side_dev_t *d)
{
    if (!d)
        return;
    if (ibv_close_device(d->ctx))
        mesh_warn("verbs: ibv_close_device failed");
    free(d);
}

const char *mesh_side_dev_name(const mesh_side_dev_t *d)
{
    return d->name;
}

int mesh_side_open(mesh_side_dev_t *d, double peer_timeout_s, mesh_side_t **out)
{
    mesh_side_t *s = calloc(1, sizeof(*s));
    struct ibv_qp_init_attr ia = {
        .cap = {.max_send_wr = SIDE_WINDOW + 1,
                .max_recv_wr = 1,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 1,
    };
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = d->port,
        .qp_access_flags = IBV_ACCESS_REMOTE_READ,
    };
    int rc = 0;

    if (!s)
        return mesh_err(-ENOMEM, "out of memory");
    s->d = d;
    s->peer_timeout_s = peer_timeout_s;
    VERBS_CHECK_PTR(rc, s->pd, ibv_alloc_pd(d->ctx), free_s,
                    "verbs: ibv_alloc_pd on %s", d->name);
    VERBS_CHECK_PTR(rc, s->cq,
                    ibv_create_cq(d->ctx, 2 * SIDE_WINDOW + 4, NULL, NULL, 0),
                    free_pd, "verbs: ibv_create_cq on %s", d->name);
    ia.send_cq = ia.recv_cq = s->cq;
    VERBS_CHECK_PTR(rc, s->qp, ibv_create_qp(s->pd, &ia), destroy_cq,
                    "verbs: ibv_create_qp on %s", d->name);
    VERBS_CHECK_RC(rc,
                   ibv_modify_qp(s->qp, &a,
                                 IBV_QP_STATE | IBV_QP_PKEY_INDEX |
                                     IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
                   destroy_qp, "verbs: side QP to INIT on %s", d->name);
    s->psn = (uint32_t)(mesh_now_ns() ^ s->qp->qp_num) & 0xffffff;
    *out = s;
    return 0;

destroy_qp:
    ibv_destroy_qp(s->qp);
destroy_cq:
    ibv_destroy_cq(s->cq);
free_pd:
    ibv_dealloc_pd(s->pd);
free_s:
    free(s);
    return rc;
}

/*
 * The address (MESH_SIDE_ADDR bytes): u32 QP number, u32 PSN, u16 LID,
 * u8 MTU (enum ibv_mtu), u8 use_gid, u8 read depth (the reads this QP
 * answers at once), 3 zero bytes, u8 gid[16].
 */
void mesh_side_addr(const mesh_side_t *s, uint8_t a[MESH_SIDE_ADDR])
{
    const mesh_side_dev_t *d = s->d;

    memset(a, 0, MESH_SIDE_ADDR);
    mesh_put_le32(a, s->qp->qp_num);
    mesh_put_le32(a + 4, s->psn);
    mesh_put_le16(a + 8, d->pattr.lid);
    a[10] = (uint8_t)d->pattr.active_mtu;
    a[11] = d->gid_index >= 0;
    a[12] = (uint8_t)MESH_MAX(1, MESH_MIN(d->rd_atom, SIDE_RD_MAX));
    memcpy(a + 16, d->gid.raw, 16);
}

int mesh_side_connect(mesh_side_t *s, const uint8_t a[MESH_SIDE_ADDR])
{
    const mesh_side_dev_t *d = s->d;
    uint32_t qpn = mesh_get_le32(a), psn = mesh_get_le32(a + 4);
    enum ibv_mtu mtu = (enum ibv_mtu)a[10];
    int use_gid = a[11], rd = a[12], mine;
    union ibv_gid dgid;
    int rc;

    /* every field from the network is checked before use */
    if (!qpn || qpn > 0xffffff || psn > 0xffffff || !verbs_mtu_bytes(mtu) ||
        use_gid > 1 || rd < 1)
        return mesh_err(-EPROTO,
                        "a side channel's address is malformed (QP number "
                        "0x%" PRIx32 ", PSN 0x%" PRIx32 ", MTU %d, GID flag "
                        "%d, read depth %d)",
                        qpn, psn, (int)mtu, use_gid, rd);
    /* the rest as the transport's own QP details (transport/verbs/wire.c):
     * zero padding, a unicast LID where no GID routes, a GID where one
     * does */
    if (a[13] || a[14] || a[15] ||
        !verbs_route_ok(use_gid, mesh_get_le16(a + 8), a + 16))
        return mesh_err(-EPROTO,
                        "a side channel's address is malformed (padding "
                        "%02x%02x%02x, LID 0x%04x without a GID: a unicast "
                        "LID is 0x0001 to 0xbfff; or an all-zero GID)",
                        a[13], a[14], a[15], mesh_get_le16(a + 8));
    if (use_gid != (d->gid_index >= 0))
        return mesh_err(-EPROTO,
                        "the side channel's peer %s a GID, %s %s (mixed "
                        "InfiniBand and RoCE? see --gid-index)",
                        use_gid ? "uses" : "does not use", d->name,
                        d->gid_index >= 0 ? "does" : "does not");
    if (s->connected)
        return mesh_err(-EISCONN, "the side channel is connected already");
    mine = MESH_MAX(1, MESH_MIN(d->rd_init, SIDE_RD_MAX));
    memcpy(dgid.raw, a + 16, 16);
    {
        struct verbs_qp_link l = {
            .port = d->port,
            .mtu = MESH_MIN(mtu, d->pattr.active_mtu),
            .dest_qpn = qpn,
            .rq_psn = psn,
            .sq_psn = s->psn,
            .dlid = mesh_get_le16(a + 8),
            .dgid = use_gid ? &dgid : NULL,
            .sgid_index = d->gid_index,
            .dest_rd_atomic =
                (uint8_t)MESH_MAX(1, MESH_MIN(d->rd_atom, SIDE_RD_MAX)),
            .rd_atomic = (uint8_t)MESH_MIN(mine, rd),
            .peer_timeout_s = s->peer_timeout_s,
        };
        char what[128];

        snprintf(what, sizeof(what), "side QP on %s", d->name);
        rc = verbs_qp_rts(s->qp, &l, what);
    }
    if (rc == 0)
        s->connected = 1;
    return rc;
}

int mesh_side_reg(mesh_side_t *s, void *buf, size_t len, int remote_read,
                  uint64_t *raddr, uint32_t *rkey)
{
    struct ibv_mr *mr;
    int rc = 0;

    if (!len || s->nmr == SIDE_MR_MAX)
        return mesh_err(-EINVAL, "side channel: %s",
                        len ? "too many registrations" : "nothing to register");
    VERBS_CHECK_PTR(rc, mr,
                    ibv_reg_mr(s->pd, buf, len,
                               remote_read ? IBV_ACCESS_REMOTE_READ
                                           : IBV_ACCESS_LOCAL_WRITE),
                    out, "verbs: ibv_reg_mr of %zu bytes on %s", len,
                    s->d->name);
    s->mr[s->nmr++] = mr;
    if (raddr)
        *raddr = (uint64_t)(uintptr_t)buf;
    if (rkey)
        *rkey = mr->rkey;
out:
    return rc;
}

/* Post pieces while the window has room. */
static int side_post(mesh_side_t *s)
{
    int rc = 0;

    while (s->posted < s->len && s->inflight < SIDE_WINDOW) {
        size_t n = MESH_MIN((size_t)SIDE_PIECE, s->len - s->posted);
        struct ibv_sge sge = {
            .addr = (uintptr_t)(s->dst + s->posted),
            .length = (uint32_t)n,
            .lkey = s->lkey,
        };
        struct ibv_send_wr wr =
                               {
                                   .wr_id = s->posted,
                                   .sg_list = &sge,
                                   .num_sge = 1,
                                   .opcode = IBV_WR_RDMA_READ,
                                   .send_flags = IBV_SEND_SIGNALED,
                                   .wr.rdma = {.remote_addr =
                                                   s->raddr + s->posted,
                                               .rkey = s->rkey},
                               },
                           *bad;

        VERBS_CHECK_RC(rc, ibv_post_send(s->qp, &wr, &bad), out,
                       "verbs: ibv_post_send (RDMA read) on %s", s->d->name);
        s->posted += n;
        s->inflight++;
    }
out:
    return rc;
}

int mesh_side_read(mesh_side_t *s, void *dst, size_t len, uint64_t raddr,
                   uint32_t rkey)
{
    const uint8_t *p = dst;
    struct ibv_mr *mr = NULL;

    if (!s->connected || s->reading || s->failed)
        return mesh_err(-EBUSY, "side channel: %s",
                        s->reading  ? "a read is in progress"
                        : s->failed ? "a read failed on it"
                                    : "not connected");
    /* the remote range is the peer's word: it must not wrap; its HCA
     * checks it against the rkey's registration */
    if (!len || raddr > UINT64_MAX - len)
        return mesh_err(-EPROTO,
                        "side channel: a read of %zu bytes at 0x%" PRIx64
                        " is out of range",
                        len, raddr);
    for (int i = 0; i < s->nmr && !mr; i++)
        if (p >= (const uint8_t *)s->mr[i]->addr && len <= s->mr[i]->length &&
            (size_t)(p - (const uint8_t *)s->mr[i]->addr) <=
                s->mr[i]->length - len)
            mr = s->mr[i];
    if (!mr)
        return mesh_err(-EINVAL,
                        "side channel: the read's destination (%zu "
                        "bytes) is not registered",
                        len);
    s->reading = 1;
    s->dst = dst;
    s->len = len;
    s->posted = s->done = 0;
    s->raddr = raddr;
    s->rkey = rkey;
    s->lkey = mr->lkey;
    s->inflight = 0;
    s->last = mesh_now_s();
    return side_post(s);
}

int mesh_side_poll(mesh_side_t *s, size_t *done)
{
    struct ibv_wc wc[SIDE_WINDOW];
    int n, rc = 0;

    if (!s->reading) {
        *done = s->done;
        return 1;
    }
    n = ibv_poll_cq(s->cq, SIDE_WINDOW, wc);
    if (n < 0)
        return mesh_err(-EIO, "verbs: ibv_poll_cq on %s failed (%d)",
                        s->d->name, n);
    if (n > 0)
        s->last = mesh_now_s();
    else if (n == 0 && mesh_now_s() - s->last > s->peer_timeout_s) {
        s->reading = 0;
        s->failed = 1;
        return mesh_err(-ETIMEDOUT,
                        "an RDMA read of %zu bytes from the side channel's "
                        "peer had no completion in %.1f s (the peer "
                        "timeout): the peer does not answer",
                        s->len, s->peer_timeout_s);
    }
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS) {
            s->reading = 0;
            s->failed = 1;
            return mesh_err(-EIO,
                            "an RDMA read of %zu bytes from the side "
                            "channel's peer failed: %s (vendor error 0x%x)",
                            s->len, ibv_wc_status_str(wc[i].status),
                            wc[i].vendor_err);
        }
        /* in order: each completion ends the piece at its offset */
        s->done = MESH_MIN(s->len, (size_t)wc[i].wr_id + SIDE_PIECE);
        s->inflight--;
    }
    rc = side_post(s);
    if (rc < 0) {
        s->reading = 0;
        s->failed = 1;
        return rc;
    }
    *done = s->done;
    if (s->done < s->len)
        return 0;
    s->reading = 0;
    return 1;
}

void mesh_side_close(mesh_side_t *s)
{
    if (!s)
        return;
    /* the QP first: no access to the memory after its registrations go */
    if (ibv_destroy_qp(s->qp))
        mesh_warn("verbs: ibv_destroy_qp (side channel) failed");
    for (int i = 0; i < s->nmr; i++)
        if (ibv_dereg_mr(s->mr[i]))
            mesh_warn("verbs: ibv_dereg_mr (side channel) failed");
    if (ibv_destroy_cq(s->cq))
        mesh_warn("verbs: ibv_destroy_cq (side channel) failed");
    if (ibv_dealloc_pd(s->pd))
        mesh_warn("verbs: ibv_dealloc_pd (side channel) failed");
    free(s);
}
