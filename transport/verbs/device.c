/*
 * transport/verbs/device.c: the RDMA device, port and GID (dev_open,
 * dev_close) and the queue pairs (create, INFO encode/decode, connect).
 * The control exchange over the TCP mesh is transport/base.c's.
 */
#include "config.h"

#include "transport/verbs/verbs-internal.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- device, port, GID --------------------------------------------------- */

int verbs_mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0;
}

/* The first RoCE v2 GID of the port (IPv4-mapped preferred), else -1: the
 * mesh's device and the catch-up's side channels (side.c) alike. */
int verbs_rocev2_gid(struct ibv_context *ctx, uint8_t port, int tbl_len)
{
    static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    int best = -1;

    for (int i = 0; i < tbl_len; i++) {
        struct ibv_gid_entry e;

        if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0) ||
            e.gid_type != IBV_GID_TYPE_ROCE_V2)
            continue;
        if (!memcmp(e.gid.raw, v4, sizeof(v4)))
            return i;
        if (best < 0)
            best = i;
    }
    return best;
}

/* Does this port work for us: active, and (with ib_port) the one asked. */
static int port_usable(struct ibv_context *ctx, int port,
                       struct ibv_port_attr *pa)
{
    if (ibv_query_port(ctx, (uint8_t)port, pa))
        return 0;
    return pa->state == IBV_PORT_ACTIVE;
}

/*
 * Open the device and port the options name (defaults: the first device
 * with an active port, its first active port), pick the GID, and build the
 * PD, completion channel and CQ. On failure nothing stays open.
 */
int verbs_dev_open(struct mesh_transport *t)
{
    struct ibv_device **list;
    struct ibv_device_attr da;
    int n = 0, rc = 0, found = 0;
    int cqe;

    errno = 0;
    list = ibv_get_device_list(&n);
    if (!list)
        return mesh_err_errno("verbs: ibv_get_device_list");
    for (int i = 0; i < n && !found; i++) {
        const char *name = ibv_get_device_name(list[i]);
        struct ibv_context *ctx;

        if (t->super.opts.ib_dev && strcmp(name, t->super.opts.ib_dev))
            continue;
        ctx = ibv_open_device(list[i]);
        if (!ctx)
            continue;
        if (ibv_query_device(ctx, &da)) {
            ibv_close_device(ctx);
            continue;
        }
        for (int p = 1; p <= da.phys_port_cnt && !found; p++) {
            if (t->super.opts.ib_port > 0 && p != t->super.opts.ib_port)
                continue;
            if (port_usable(ctx, p, &t->pattr)) {
                t->ctx = ctx;
                t->port = (uint8_t)p;
                snprintf(t->devname, sizeof(t->devname), "%s", name);
                found = 1;
            }
        }
        if (!found)
            ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    if (!found) {
        if (!n)
            return mesh_err(-ENODEV, "verbs: no RDMA device found");
        if (t->super.opts.ib_dev || t->super.opts.ib_port > 0)
            return mesh_err(-ENODEV,
                            "verbs: no active port on %s, port %d, among %d "
                            "RDMA device(s) (--ib-dev, --ib-port)",
                            t->super.opts.ib_dev ? t->super.opts.ib_dev
                                                 : "any device",
                            t->super.opts.ib_port, n);
        return mesh_err(-ENODEV,
                        "verbs: none of %d RDMA device(s) has an "
                        "active port",
                        n);
    }

    t->gid_index = -1;
    if (t->super.opts.gid_index >= 0) {
        if (t->super.opts.gid_index >= t->pattr.gid_tbl_len) {
            rc = mesh_err(-EINVAL,
                          "verbs: --gid-index %d out of range (%s port %u "
                          "has %d GIDs)",
                          t->super.opts.gid_index, t->devname, t->port,
                          t->pattr.gid_tbl_len);
            goto close_dev;
        }
        t->gid_index = t->super.opts.gid_index;
    } else if (t->pattr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        t->gid_index = verbs_rocev2_gid(t->ctx, t->port, t->pattr.gid_tbl_len);
        if (t->gid_index < 0) {
            rc = mesh_err(-ENODEV,
                          "verbs: %s port %u (Ethernet) has no RoCE v2 GID; "
                          "give one with --gid-index",
                          t->devname, t->port);
            goto close_dev;
        }
    }
    if (t->gid_index >= 0)
        VERBS_CHECK_RC(rc,
                       ibv_query_gid(t->ctx, t->port, t->gid_index, &t->gid),
                       close_dev, "verbs: ibv_query_gid %s port %u index %d",
                       t->devname, t->port, t->gid_index);

    VERBS_CHECK_PTR(rc, t->pd, ibv_alloc_pd(t->ctx), close_dev,
                    "verbs: ibv_alloc_pd on %s", t->devname);
    VERBS_CHECK_PTR(rc, t->chan, ibv_create_comp_channel(t->ctx), free_pd,
                    "verbs: ibv_create_comp_channel on %s", t->devname);
    cqe = MESH_MAX(t->super.world.size - 1, 1) * VERBS_QP_MAX *
          (VERBS_RQ_DEPTH + VERBS_SQ_DEPTH);
    cqe = MESH_MIN(cqe, da.max_cqe);
    VERBS_CHECK_PTR(rc, t->cq, ibv_create_cq(t->ctx, cqe, NULL, t->chan, 0),
                    destroy_chan, "verbs: ibv_create_cq(%d) on %s", cqe,
                    t->devname);
    mesh_debug("verbs: %s port %u, %s, GID index %d, active MTU %d", t->devname,
               t->port,
               t->pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet"
                                                              : "InfiniBand",
               t->gid_index, verbs_mtu_bytes(t->pattr.active_mtu));
    return 0;

destroy_chan:
    ibv_destroy_comp_channel(t->chan);
    t->chan = NULL;
free_pd:
    ibv_dealloc_pd(t->pd);
    t->pd = NULL;
close_dev:
    ibv_close_device(t->ctx);
    t->ctx = NULL;
    return rc;
}

/* ---- QPs ----------------------------------------------------------------- */

uint8_t *verbs_rbuf(struct mesh_transport *t, int peer, int qpi, int idx)
{
    size_t i = ((size_t)peer * VERBS_QP_MAX + (size_t)qpi) * VERBS_RQ_DEPTH +
               (size_t)idx;

    return (uint8_t *)t->ctrl + i * VERBS_CTS_LEN;
}

uint8_t *verbs_sbuf(struct mesh_transport *t, int peer, int slot)
{
    size_t base = (size_t)t->super.world.size * VERBS_QP_MAX * VERBS_RQ_DEPTH;

    return (uint8_t *)t->ctrl +
           (base + (size_t)peer * VERBS_CREDITS + (size_t)slot) * VERBS_CTS_LEN;
}

int verbs_post_recv(struct mesh_transport *t, int peer, int qpi, int idx)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)verbs_rbuf(t, peer, qpi, idx),
        .length = VERBS_CTS_LEN,
        .lkey = t->ctrl_mr->lkey,
    };
    struct ibv_recv_wr wr =
                           {
                               .wr_id = verbs_wr_id(WR_RECV, peer, qpi, idx),
                               .sg_list = &sge,
                               .num_sge = 1,
                           },
                       *bad;
    int rc = 0;

    VERBS_CHECK_RC(rc, ibv_post_recv(t->vp[peer].qp[qpi].qp, &wr, &bad), out,
                   "verbs: ibv_post_recv to rank %d QP %d", peer, qpi);
out:
    return rc;
}

/*
 * Retransmission: each try waits 4.096 us * 2^timeout for an ack, and a
 * send fails after retry_cnt + 1 tries. A dead peer must surface as a
 * retry-exceeded completion within the peer timeout even when the TCP mesh
 * has not noticed yet, so tries * wait <= peer timeout. The wait itself
 * stays at 268 ms (2^16) where the bound allows: shorter ones fire
 * spuriously on a loaded host (Soft-RoCE under emulation), and a spurious
 * retransmission costs a whole message.
 */
static void qp_retry(double peer_timeout_s, uint8_t *timeout, uint8_t *retry)
{
    uint8_t e = 16;
    double wait;
    int tries;

    while (e > 8 && 2.0 * 4.096e-6 * (double)(1u << e) > peer_timeout_s)
        e--;
    wait = 4.096e-6 * (double)(1u << e);
    tries = (int)(peer_timeout_s / wait);
    *timeout = e;
    *retry = (uint8_t)MESH_MAX(1, MESH_MIN(tries - 1, 7));
}

/*
 * Take an RC queue pair from INIT to RTS towards the remote end l names:
 * the mesh's QPs (verbs_qps_connect) and the catch-up's side channels
 * (side.c) alike. Errors name what (e.g. "QP 2 for rank 3").
 */
int verbs_qp_rts(struct ibv_qp *qp, const struct verbs_qp_link *l,
                 const char *what)
{
    uint8_t timeout, retry;
    int rc = 0;

    qp_retry(l->peer_timeout_s, &timeout, &retry);
    {
        struct ibv_qp_attr rtr = {
            .qp_state = IBV_QPS_RTR,
            .path_mtu = l->mtu,
            .dest_qp_num = l->dest_qpn,
            .rq_psn = l->rq_psn,
            .max_dest_rd_atomic = l->dest_rd_atomic,
            .min_rnr_timer = 12,
            .ah_attr = {.is_global = 0,
                        .dlid = l->dlid,
                        .sl = 0,
                        .src_path_bits = 0,
                        .port_num = l->port},
        };
        struct ibv_qp_attr rts = {
            .qp_state = IBV_QPS_RTS,
            .timeout = timeout,
            .retry_cnt = retry,
            .rnr_retry = 7,
            .sq_psn = l->sq_psn,
            .max_rd_atomic = l->rd_atomic,
        };

        if (l->dgid) {
            rtr.ah_attr.is_global = 1;
            rtr.ah_attr.grh.dgid = *l->dgid;
            rtr.ah_attr.grh.sgid_index = (uint8_t)l->sgid_index;
            rtr.ah_attr.grh.hop_limit = 1;
        }
        VERBS_CHECK_RC(
            rc,
            ibv_modify_qp(qp, &rtr,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                              IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            out, "verbs: %s to RTR", what);
        VERBS_CHECK_RC(rc,
                       ibv_modify_qp(qp, &rts,
                                     IBV_QP_STATE | IBV_QP_TIMEOUT |
                                         IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                         IBV_QP_SQ_PSN |
                                         IBV_QP_MAX_QP_RD_ATOMIC),
                       out, "verbs: %s to RTS", what);
    }
out:
    return rc;
}

int verbs_qps_create(struct mesh_transport *t)
{
    int rc = 0;

    for (int p = 0; p < t->super.world.size; p++) {
        if (p == t->super.world.rank)
            continue;
        for (int q = 0; q < t->nqp; q++) {
            struct vqp *v = &t->vp[p].qp[q];
            struct ibv_qp_init_attr ia = {
                .send_cq = t->cq,
                .recv_cq = t->cq,
                .cap = {.max_send_wr = VERBS_SQ_DEPTH,
                        .max_recv_wr = VERBS_RQ_DEPTH,
                        .max_send_sge = 1,
                        .max_recv_sge = 1},
                .qp_type = IBV_QPT_RC,
            };
            struct ibv_qp_attr a = {
                .qp_state = IBV_QPS_INIT,
                .pkey_index = 0,
                .port_num = t->port,
                .qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
            };

            VERBS_CHECK_PTR(rc, v->qp, ibv_create_qp(t->pd, &ia), out,
                            "verbs: ibv_create_qp for rank %d", p);
            VERBS_CHECK_RC(rc,
                           ibv_modify_qp(v->qp, &a,
                                         IBV_QP_STATE | IBV_QP_PKEY_INDEX |
                                             IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
                           out, "verbs: QP for rank %d to INIT", p);
            v->psn =
                (uint32_t)(mesh_now_ns() ^ ((uint64_t)p << 8) ^ (uint64_t)q) &
                0xffffff;
            for (int i = 0; i < VERBS_RQ_DEPTH; i++) {
                rc = verbs_post_recv(t, p, q, i);
                if (rc < 0)
                    goto out;
            }
        }
    }
out:
    return rc;
}

void verbs_info_encode(struct mesh_transport *t, int peer, uint8_t *m)
{
    memset(m, 0, VERBS_INFO_LEN);
    mesh_put_le32(m, VERBS_INFO_MAGIC);
    mesh_put_le32(m + 4, VERBS_INFO_VERSION);
    mesh_put_le32(m + 8, t->ctx ? 1 : 0);
    mesh_put_le32(m + 12, (uint32_t)t->nqp);
    if (!t->ctx)
        return;
    mesh_put_le16(m + 16, t->pattr.lid);
    m[18] = (uint8_t)t->pattr.active_mtu;
    m[19] = t->pattr.link_layer;
    memcpy(m + 20, t->gid.raw, 16);
    m[36] = t->gid_index >= 0;
    for (int q = 0; q < t->nqp; q++) {
        mesh_put_le32(m + 40 + 4 * q, t->vp[peer].qp[q].qp->qp_num);
        mesh_put_le32(m + 72 + 4 * q, t->vp[peer].qp[q].psn);
    }
}

int verbs_info_decode(struct mesh_transport *t, int peer, const uint8_t *m,
                      struct remote *r)
{
    struct verbs_info vi;
    char nb[300];
    int rc = verbs_info_check(m, peer, verbs_pname(t, peer, nb, sizeof(nb)),
                              t->nqp, t->gid_index >= 0, &vi);

    if (rc < 0)
        return rc;
    memset(r, 0, sizeof(*r));
    r->active = vi.active;
    r->nqp = vi.nqp;
    r->lid = vi.lid;
    r->mtu = vi.mtu;
    r->link_layer = vi.link_layer;
    r->use_gid = vi.use_gid;
    memcpy(r->gid.raw, vi.gid, sizeof(r->gid.raw));
    memcpy(r->qpn, vi.qpn, sizeof(r->qpn));
    memcpy(r->psn, vi.psn, sizeof(r->psn));
    return 0;
}

int verbs_qps_connect(struct mesh_transport *t, int peer,
                      const struct remote *r)
{
    struct verbs_qp_link l = {
        .port = t->port,
        .mtu = MESH_MIN((enum ibv_mtu)r->mtu, t->pattr.active_mtu),
        .dlid = r->lid,
        .dgid = r->use_gid ? &r->gid : NULL,
        .sgid_index = t->gid_index,
        .dest_rd_atomic = 1,
        .rd_atomic = 1,
        .peer_timeout_s = t->super.opts.peer_timeout_s,
    };
    char what[48];
    int rc = 0;

    for (int q = 0; q < t->nqp && rc == 0; q++) {
        l.dest_qpn = r->qpn[q];
        l.rq_psn = r->psn[q];
        l.sq_psn = t->vp[peer].qp[q].psn;
        snprintf(what, sizeof(what), "QP %d for rank %d", q, peer);
        rc = verbs_qp_rts(t->vp[peer].qp[q].qp, &l, what);
    }
    return rc;
}

/* ---- closing ------------------------------------------------------------- */

/* Close what dev_open and the connect built, in reverse order. */
void verbs_dev_close(struct mesh_transport *t)
{
    for (int p = 0; t->vp && p < t->super.world.size; p++)
        for (int q = 0; q < VERBS_QP_MAX; q++) {
            if (t->vp[p].qp[q].qp && ibv_destroy_qp(t->vp[p].qp[q].qp))
                mesh_warn("verbs: ibv_destroy_qp for rank %d failed", p);
            t->vp[p].qp[q].qp = NULL;
        }
    if (t->ctrl_mr && ibv_dereg_mr(t->ctrl_mr))
        mesh_warn("verbs: ibv_dereg_mr (control buffers) failed");
    t->ctrl_mr = NULL;
    if (t->cq) {
        if (t->cq_events)
            ibv_ack_cq_events(t->cq, (unsigned)t->cq_events);
        if (ibv_destroy_cq(t->cq))
            mesh_warn("verbs: ibv_destroy_cq failed");
    }
    if (t->chan && ibv_destroy_comp_channel(t->chan))
        mesh_warn("verbs: ibv_destroy_comp_channel failed");
    for (struct mesh_mr *m = t->mrs; m; m = m->next) {
        if (m->mr && ibv_dereg_mr(m->mr))
            mesh_warn("verbs: ibv_dereg_mr failed");
        else if (m->mr)
            t->mr_live--;
        m->mr = NULL;
    }
    if (t->pd && ibv_dealloc_pd(t->pd))
        mesh_warn("verbs: ibv_dealloc_pd failed (registrations left?)");
    if (t->ctx && ibv_close_device(t->ctx))
        mesh_warn("verbs: ibv_close_device failed");
    t->cq = NULL;
    t->chan = NULL;
    t->pd = NULL;
    t->ctx = NULL;
}
