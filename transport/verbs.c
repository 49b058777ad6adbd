/*
 * transport/verbs.c: the RDMA verbs transport (libibverbs, rdma-core).
 *
 * Shape (see transport/verbs-internal.h for the wire formats):
 *   - a TCP mesh underneath (mesh_tcp_ops) joins and authenticates the
 *     peers, carries QP details, failures, aborts and goodbyes;
 *   - one context (device, PD, completion channel, CQ) per transport, Q RC
 *     queue pairs per peer;
 *   - receiver-driven data: irecv sends a CTS with the destination window,
 *     isend waits for it, checks it like a TCP frame header and RDMA-writes
 *     into it, the last write carrying an immediate that completes the
 *     receive;
 *   - a progress thread polls the CQ, then sleeps on the completion
 *     channel (and ticks every VERBS_TICK_MS to watch the TCP mesh).
 * One mutex guards the transport's state; the user thread posts work
 * requests under it, the progress thread handles completions under it.
 *
 * Verbs report errors three ways, and each call site says which: a
 * positive errno as return value (ibv_post_*, ibv_modify_qp, ibv_query_*),
 * NULL with errno set (ibv_open_device, ibv_alloc_pd, ibv_create_*,
 * ibv_reg_mr), or a negative count (ibv_poll_cq).
 */
#include "config.h"

#include "common/util.h"
#include "transport/tcp/tcp.h"
#include "transport/transport.h"
#include "transport/verbs-internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VERBS_TICK_MS      20     /* watch the TCP mesh at least this often */
#define VERBS_SPIN_NS      200000 /* poll the CQ this long before sleeping */
#define VERBS_WAIT_SPIN_NS 30000  /* wait_any spins this long first */
#define VERBS_RQ_DEPTH     (2 * VERBS_CREDITS + 8)
#define VERBS_SQ_DEPTH     (VERBS_CREDITS + VERBS_WRITE_WINDOW)
#define MSG_MAX            1024

/* Checked verbs calls, one per error convention. */
#define VERBS_CHECK_RC(rc, expr, label, ...)                                   \
    do {                                                                       \
        int verbs_rc_ = (expr);                                                \
        if (verbs_rc_) {                                                       \
            errno = verbs_rc_ > 0 ? verbs_rc_ : EIO;                           \
            (rc) = mesh_err_errno(__VA_ARGS__);                                \
            goto label;                                                        \
        }                                                                      \
    } while (0)
#define VERBS_CHECK_PTR(rc, ptr, expr, label, ...)                             \
    do {                                                                       \
        errno = 0;                                                             \
        (ptr) = (expr);                                                        \
        if (!(ptr)) {                                                          \
            if (!errno)                                                        \
                errno = EIO;                                                   \
            (rc) = mesh_err_errno(__VA_ARGS__);                                \
            goto label;                                                        \
        }                                                                      \
    } while (0)

static atomic_int debug_flags;

void mesh_verbs_debug_set(int flags)
{
    atomic_store(&debug_flags, flags);
}

/* ---- private layouts ----------------------------------------------------- */

struct mesh_mr {
    struct ibv_mr *mr; /* NULL when no device is open (auto on TCP) */
    char *base;
    size_t len;
    int refs;
    mesh_mr_t *inner; /* the TCP transport's handle (auto on TCP) */
    struct mesh_mr *next;
};

enum req_kind { REQ_SEND, REQ_RECV };

struct mesh_req {
    enum req_kind kind;
    int peer;
    struct mesh_frame f;
    char *buf;
    uint32_t lkey, rkey; /* of the memory under buf */
    struct ibv_mr *tmp;  /* a registration for this request only */
    atomic_int done;
    mesh_req_t *inner; /* auto on TCP: the TCP request */
    /* receive: CTS slot while one is held, else -1 */
    int slot;
    /* send: the matched window, and what is posted and acknowledged */
    int qpi;
    uint64_t raddr;
    uint32_t rrkey;
    uint32_t imm;
    uint64_t posted;
    int inflight; /* write WQEs not yet completed */
    int all_posted;
    struct mesh_req *next, *prev; /* every request of the transport */
    struct mesh_req *qnext;       /* a waiting or sending queue */
};

/* A CTS received from a peer, not yet consumed by our sends. */
struct cts {
    struct mesh_frame f;
    uint64_t addr;
    uint32_t rkey;
    uint16_t slot, gen;
    uint64_t reserved; /* bytes claimed by our sends so far */
    struct cts *next;
};

enum wr_kind { WR_RECV = 1, WR_CTS = 2, WR_WRITE = 3 };

/* A posted send WQE; a QP completes them in posting order. */
struct sent {
    enum wr_kind kind;
    struct mesh_req *r;
};

struct vqp {
    struct ibv_qp *qp;
    uint32_t psn;
    struct sent ring[VERBS_SQ_DEPTH];
    int ring_head, ring_n;
    int writes;                         /* write WQEs in flight */
    struct mesh_req *sq_head, *sq_tail; /* matched sends with pieces left */
};

struct vpeer {
    struct vqp qp[VERBS_QP_MAX];
    /* receiver side */
    struct mesh_req *slot[VERBS_CREDITS];
    uint16_t gen[VERBS_CREDITS];
    struct mesh_req *rq_head, *rq_tail; /* receives waiting for a slot */
    /* sender side */
    struct cts *cts_head, *cts_tail;
    struct mesh_req *wq_head, *wq_tail; /* sends waiting for a CTS */
    int bye;
    uint64_t bye_ns;     /* when its goodbye arrived (0: not yet checked) */
    mesh_req_t *bye_req; /* the TCP receive of its goodbye */
};

struct mesh_transport {
    const struct mesh_transport_ops *inner_ops;
    mesh_transport_t *inner;
    struct mesh_world world;
    struct mesh_peer *peers;
    struct mesh_transport_opts opts;
    int is_auto;
    int active; /* RDMA chosen (after connect) */
    int connected;

    /* the verbs context, in the order it is built */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    int cq_events; /* unacknowledged completion events */
    uint8_t port;
    struct ibv_port_attr pattr;
    int gid_index; /* -1: no GRH (InfiniBand by LID) */
    union ibv_gid gid;
    char devname[64];
    int nqp;
    struct vpeer *vp;
    char *ctrl; /* receive buffers, then CTS send buffers */
    size_t ctrl_len;
    struct ibv_mr *ctrl_mr;
    struct mesh_mr *mrs; /* the registration cache */
    int mr_live;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    int thread_started;
    int stopping;

    struct mesh_req *reqs;
    int failed;
    int fail_code;
    char fail_msg[MSG_MAX];
    /* a failed work completion, held for VERBS_WC_GRACE_NS (see tick) */
    uint64_t wc_fail_ns;
    int wc_fail_peer, wc_fail_code;
    char wc_fail_msg[MSG_MAX / 2];
};

/* ---- small helpers ------------------------------------------------------- */

static const char *pname(struct mesh_transport *t, int r, char *buf, size_t len)
{
    return mesh_peer_name(&t->world, r, buf, len);
}

static uint64_t wr_id(enum wr_kind kind, int peer, int qpi, int idx)
{
    return ((uint64_t)kind << 56) | ((uint64_t)(uint32_t)peer << 24) |
           ((uint64_t)qpi << 16) | (uint64_t)(uint16_t)idx;
}

static const char *wr_kind_name(enum wr_kind k)
{
    switch (k) {
    case WR_RECV:
        return "receive";
    case WR_CTS:
        return "clear-to-send";
    case WR_WRITE:
        return "RDMA write";
    }
    return "work request";
}

static void req_link(struct mesh_transport *t, struct mesh_req *r)
{
    r->prev = NULL;
    r->next = t->reqs;
    if (t->reqs)
        t->reqs->prev = r;
    t->reqs = r;
}

static void req_free(struct mesh_transport *t, struct mesh_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        t->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    if (r->tmp && !ibv_dereg_mr(r->tmp))
        t->mr_live--;
    free(r);
}

static void req_complete(struct mesh_transport *t, struct mesh_req *r)
{
    atomic_store_explicit(&r->done, 1, memory_order_release);
    pthread_cond_broadcast(&t->cond);
}

/* Remove r from a singly linked queue. */
static void q_remove(struct mesh_req **head, struct mesh_req **tail,
                     struct mesh_req *r)
{
    struct mesh_req *p = NULL;

    for (struct mesh_req *q = *head; q; p = q, q = q->qnext) {
        if (q != r)
            continue;
        if (p)
            p->qnext = q->qnext;
        else
            *head = q->qnext;
        if (*tail == q)
            *tail = p;
        return;
    }
}

static void q_push(struct mesh_req **head, struct mesh_req **tail,
                   struct mesh_req *r)
{
    r->qnext = NULL;
    if (*tail)
        (*tail)->qnext = r;
    else
        *head = r;
    *tail = r;
}

/* ---- failure ------------------------------------------------------------- */

/*
 * Fail the job (first failure wins): record the message with the oldest
 * operation in flight involving the culprit, wake every waiter, and with
 * notify tell the peers through the TCP mesh.
 */
static void fail_job(struct mesh_transport *t, int culprit, int code,
                     int notify, const char *fmt, ...) MESH_PRINTF(5, 6);

static void fail_job(struct mesh_transport *t, int culprit, int code,
                     int notify, const char *fmt, ...)
{
    char reason[MSG_MAX / 2], nb[300];
    struct mesh_req *r, *inflight = NULL;
    va_list ap;

    if (t->failed)
        return;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    for (r = t->reqs; r; r = r->next) {
        if (atomic_load(&r->done))
            continue;
        if (!inflight || r->peer == culprit || inflight->peer != culprit)
            inflight = r;
    }
    if (inflight)
        mesh_failure_msg(t->fail_msg, sizeof(t->fail_msg), reason,
                         &inflight->f, inflight->kind == REQ_SEND,
                         inflight->peer,
                         pname(t, inflight->peer, nb, sizeof(nb)));
    else
        mesh_failure_msg(t->fail_msg, sizeof(t->fail_msg), reason, NULL, 0,
                         -1, NULL);
    t->failed = 1;
    t->fail_code = code;
    mesh_error_log("%s", t->fail_msg);
    pthread_cond_broadcast(&t->cond);
    if (notify && t->inner)
        t->inner_ops->abort(t->inner, culprit, reason);
}

static int fail_err(struct mesh_transport *t)
{
    return mesh_err(t->fail_code, "%s", t->fail_msg);
}

/* The TCP mesh failed (a dead or aborting peer): adopt its message, less
 * its own operation in flight (one of ours, meaningless to the user). */
static void adopt_inner_failure(struct mesh_transport *t, int rc)
{
    char why[MSG_MAX / 2];
    char *cut;

    snprintf(why, sizeof(why), "%s", mesh_err_msg(rc));
    cut = strstr(why, "; operation in flight");
    if (!cut)
        cut = strstr(why, "; no operation in flight");
    if (cut)
        *cut = '\0';
    fail_job(t, -1, rc, 0, "%s", why);
}

/* ---- device, port, GID -----------------------------------------------------
 */

static int mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0;
}

/* The first RoCE v2 GID of the port (IPv4-mapped preferred), else -1. */
static int find_rocev2_gid(struct mesh_transport *t)
{
    int best = -1;

    for (int i = 0; i < t->pattr.gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0,    0,
                                       0, 0, 0, 0, 0xff, 0xff};

        if (ibv_query_gid_ex(t->ctx, t->port, (uint32_t)i, &e, 0))
            continue;
        if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
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
static int dev_open(struct mesh_transport *t)
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

        if (t->opts.ib_dev && strcmp(name, t->opts.ib_dev))
            continue;
        ctx = ibv_open_device(list[i]);
        if (!ctx)
            continue;
        if (ibv_query_device(ctx, &da)) {
            ibv_close_device(ctx);
            continue;
        }
        for (int p = 1; p <= da.phys_port_cnt && !found; p++) {
            if (t->opts.ib_port > 0 && p != t->opts.ib_port)
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
        if (t->opts.ib_dev || t->opts.ib_port > 0)
            return mesh_err(-ENODEV,
                            "verbs: no active port on %s, port %d, among %d "
                            "RDMA device(s) (--ib-dev, --ib-port)",
                            t->opts.ib_dev ? t->opts.ib_dev : "any device",
                            t->opts.ib_port, n);
        return mesh_err(-ENODEV,
                        "verbs: none of %d RDMA device(s) has an "
                        "active port",
                        n);
    }

    t->gid_index = -1;
    if (t->opts.gid_index >= 0) {
        if (t->opts.gid_index >= t->pattr.gid_tbl_len) {
            rc = mesh_err(-EINVAL,
                          "verbs: --gid-index %d out of range (%s port %u "
                          "has %d GIDs)",
                          t->opts.gid_index, t->devname, t->port,
                          t->pattr.gid_tbl_len);
            goto close_dev;
        }
        t->gid_index = t->opts.gid_index;
    } else if (t->pattr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        t->gid_index = find_rocev2_gid(t);
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
    cqe = MESH_MAX(t->world.size - 1, 1) * VERBS_QP_MAX *
          (VERBS_RQ_DEPTH + VERBS_SQ_DEPTH);
    cqe = MESH_MIN(cqe, da.max_cqe);
    VERBS_CHECK_PTR(rc, t->cq, ibv_create_cq(t->ctx, cqe, NULL, t->chan, 0),
                    destroy_chan, "verbs: ibv_create_cq(%d) on %s", cqe,
                    t->devname);
    mesh_debug("verbs: %s port %u, %s, GID index %d, active MTU %d", t->devname,
               t->port,
               t->pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet"
                                                              : "InfiniBand",
               t->gid_index, mtu_bytes(t->pattr.active_mtu));
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

/* ---- QPs ------------------------------------------------------------------
 */

static uint8_t *rbuf(struct mesh_transport *t, int peer, int qpi, int idx)
{
    size_t i = ((size_t)peer * VERBS_QP_MAX + (size_t)qpi) * VERBS_RQ_DEPTH +
               (size_t)idx;

    return (uint8_t *)t->ctrl + i * VERBS_CTS_LEN;
}

static uint8_t *sbuf(struct mesh_transport *t, int peer, int slot)
{
    size_t base = (size_t)t->world.size * VERBS_QP_MAX * VERBS_RQ_DEPTH;

    return (uint8_t *)t->ctrl +
           (base + (size_t)peer * VERBS_CREDITS + (size_t)slot) * VERBS_CTS_LEN;
}

static int post_recv(struct mesh_transport *t, int peer, int qpi, int idx)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)rbuf(t, peer, qpi, idx),
        .length = VERBS_CTS_LEN,
        .lkey = t->ctrl_mr->lkey,
    };
    struct ibv_recv_wr wr =
                           {
                               .wr_id = wr_id(WR_RECV, peer, qpi, idx),
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

static int qps_create(struct mesh_transport *t)
{
    int rc = 0;

    for (int p = 0; p < t->world.size; p++) {
        if (p == t->world.rank)
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
                rc = post_recv(t, p, q, i);
                if (rc < 0)
                    goto out;
            }
        }
    }
out:
    return rc;
}

struct remote {
    int active;
    uint32_t nqp;
    uint16_t lid;
    uint8_t mtu, link_layer, use_gid;
    union ibv_gid gid;
    uint32_t qpn[VERBS_QP_MAX], psn[VERBS_QP_MAX];
};

static void info_encode(struct mesh_transport *t, int peer, uint8_t *m)
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

static int info_decode(struct mesh_transport *t, int peer, const uint8_t *m,
                       struct remote *r)
{
    char nb[300];

    if (mesh_get_le32(m) != VERBS_INFO_MAGIC || mesh_get_le32(m + 4) != VERBS_INFO_VERSION)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent QP details of an unknown "
                        "format (magic 0x%08" PRIx32 " version %" PRIu32 ")",
                        peer, pname(t, peer, nb, sizeof(nb)), mesh_get_le32(m),
                        mesh_get_le32(m + 4));
    memset(r, 0, sizeof(*r));
    r->active = mesh_get_le32(m + 8) == 1;
    r->nqp = mesh_get_le32(m + 12);
    if (!r->active)
        return 0;
    if (r->nqp != (uint32_t)t->nqp)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) has %" PRIu32
                        " QPs per peer, this rank %d",
                        peer, pname(t, peer, nb, sizeof(nb)), r->nqp, t->nqp);
    r->lid = mesh_get_le16(m + 16);
    r->mtu = m[18];
    r->link_layer = m[19];
    memcpy(r->gid.raw, m + 20, 16);
    r->use_gid = m[36];
    if (!mtu_bytes((enum ibv_mtu)r->mtu) || r->use_gid > 1)
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) sent a bad MTU (%u) or GID flag",
                        peer, pname(t, peer, nb, sizeof(nb)), r->mtu);
    if ((r->use_gid != 0) != (t->gid_index >= 0))
        return mesh_err(-EPROTO,
                        "verbs: rank %d (%s) %s a GID, this rank %s (mixed "
                        "InfiniBand and RoCE? see --gid-index)",
                        peer, pname(t, peer, nb, sizeof(nb)),
                        r->use_gid ? "uses" : "does not use",
                        t->gid_index >= 0 ? "does" : "does not");
    for (int q = 0; q < t->nqp; q++) {
        r->qpn[q] = mesh_get_le32(m + 40 + 4 * q);
        r->psn[q] = mesh_get_le32(m + 72 + 4 * q);
        if (!r->qpn[q] || r->qpn[q] > 0xffffff || r->psn[q] > 0xffffff)
            return mesh_err(-EPROTO,
                            "verbs: rank %d (%s) sent a bad QP number "
                            "0x%" PRIx32 " or PSN",
                            peer, pname(t, peer, nb, sizeof(nb)), r->qpn[q]);
    }
    return 0;
}

static int qps_connect(struct mesh_transport *t, int peer,
                       const struct remote *r)
{
    enum ibv_mtu mtu = MESH_MIN((enum ibv_mtu)r->mtu, t->pattr.active_mtu);
    uint8_t timeout, retry;
    int rc = 0;

    qp_retry(t->opts.peer_timeout_s, &timeout, &retry);

    for (int q = 0; q < t->nqp; q++) {
        struct vqp *v = &t->vp[peer].qp[q];
        struct ibv_qp_attr rtr = {
            .qp_state = IBV_QPS_RTR,
            .path_mtu = mtu,
            .dest_qp_num = r->qpn[q],
            .rq_psn = r->psn[q],
            .max_dest_rd_atomic = 1,
            .min_rnr_timer = 12,
            .ah_attr = {.is_global = 0,
                        .dlid = r->lid,
                        .sl = 0,
                        .src_path_bits = 0,
                        .port_num = t->port},
        };
        struct ibv_qp_attr rts = {
            .qp_state = IBV_QPS_RTS,
            .timeout = timeout,
            .retry_cnt = retry,
            .rnr_retry = 7,
            .sq_psn = v->psn,
            .max_rd_atomic = 1,
        };

        if (r->use_gid) {
            rtr.ah_attr.is_global = 1;
            rtr.ah_attr.grh.dgid = r->gid;
            rtr.ah_attr.grh.sgid_index = (uint8_t)t->gid_index;
            rtr.ah_attr.grh.hop_limit = 1;
        }
        VERBS_CHECK_RC(
            rc,
            ibv_modify_qp(v->qp, &rtr,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                              IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            out, "verbs: QP %d for rank %d to RTR", q, peer);
        VERBS_CHECK_RC(rc,
                       ibv_modify_qp(v->qp, &rts,
                                     IBV_QP_STATE | IBV_QP_TIMEOUT |
                                         IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                         IBV_QP_SQ_PSN |
                                         IBV_QP_MAX_QP_RD_ATOMIC),
                       out, "verbs: QP %d for rank %d to RTS", q, peer);
    }
out:
    return rc;
}

/* ---- the control exchange over the TCP mesh ---------------------------------
 */

/* Send msg (len bytes, tag) to every peer and receive theirs into in. */
static int ctrl_exchange(struct mesh_transport *t, uint32_t tag,
                         const uint8_t *out, size_t out_stride, uint8_t *in,
                         size_t len)
{
    int n = t->world.size, rc = 0, rc2;
    mesh_req_t **rq = calloc((size_t)n * 2, sizeof(*rq));

    if (!rq)
        return mesh_err(-ENOMEM, "out of memory");
    for (int p = 0; p < n && rc == 0; p++) {
        struct mesh_frame f = {.seq = VERBS_CTRL_SEQ,
                               .tag = tag,
                               .op = MESH_OP_P2P,
                               .dtype = MESH_DT_BYTE,
                               .count = len,
                               .length = len};

        if (p == t->world.rank)
            continue;
        rc = t->inner_ops->irecv(t->inner, p, &f, in + (size_t)p * len, NULL,
                                 &rq[2 * p]);
        if (rc == 0)
            rc = t->inner_ops->isend(t->inner, p, &f,
                                     out + (size_t)p * out_stride, NULL,
                                     &rq[2 * p + 1]);
    }
    for (int i = 0; i < 2 * n; i++) {
        if (!rq[i])
            continue;
        rc2 = mesh_transport_wait(t->inner_ops, t->inner, rq[i]);
        if (rc == 0)
            rc = rc2;
    }
    free(rq);
    return rc;
}

/* ---- the data path ------------------------------------------------------ */

static int post_cts(struct mesh_transport *t, struct mesh_req *r, int slot)
{
    struct vpeer *vp = &t->vp[r->peer];
    int qpi = slot % t->nqp;
    struct vqp *v = &vp->qp[qpi];
    uint8_t *m = sbuf(t, r->peer, slot);
    struct ibv_sge sge = {.addr = (uintptr_t)m,
                          .length = VERBS_CTS_LEN,
                          .lkey = t->ctrl_mr->lkey};
    struct ibv_send_wr wr =
                           {
                               .wr_id = wr_id(WR_CTS, r->peer, qpi, slot),
                               .sg_list = &sge,
                               .num_sge = 1,
                               .opcode = IBV_WR_SEND,
                               .send_flags = IBV_SEND_SIGNALED,
                           },
                       *bad;
    int rc = 0;

    vp->gen[slot] = (uint16_t)((vp->gen[slot] + 1) & 0x7fff);
    memset(m, 0, VERBS_CTS_LEN);
    mesh_put_le32(m, VERBS_CTS_MAGIC);
    mesh_put_le16(m + 4, (uint16_t)slot);
    mesh_put_le16(m + 6, vp->gen[slot]);
    m[8] = r->f.op;
    m[9] = r->f.dtype;
    mesh_put_le32(m + 12, r->f.tag);
    mesh_put_le64(m + 16, r->f.seq);
    mesh_put_le64(m + 24, r->f.count);
    mesh_put_le64(m + 32, r->f.offset);
    mesh_put_le64(m + 40, r->f.length);
    mesh_put_le64(m + 48, (uintptr_t)r->buf);
    mesh_put_le32(m + 56, r->rkey);
    VERBS_CHECK_RC(rc, ibv_post_send(v->qp, &wr, &bad), out,
                   "verbs: posting a clear-to-send to rank %d", r->peer);
    v->ring[(v->ring_head + v->ring_n) % VERBS_SQ_DEPTH] =
        (struct sent){.kind = WR_CTS, .r = NULL};
    v->ring_n++;
    vp->slot[slot] = r;
    r->slot = slot;
out:
    return rc;
}

/* Give waiting receives of peer the free slots, in posting order. */
static int grant_slots(struct mesh_transport *t, int peer)
{
    struct vpeer *vp = &t->vp[peer];

    for (int s = 0; s < VERBS_CREDITS && vp->rq_head; s++) {
        struct mesh_req *r;
        int rc;

        if (vp->slot[s])
            continue;
        r = vp->rq_head;
        q_remove(&vp->rq_head, &vp->rq_tail, r);
        rc = post_cts(t, r, s);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Post write pieces of the matched sends of QP v while the window allows. */
static int pump(struct mesh_transport *t, int peer, int qpi)
{
    struct vqp *v = &t->vp[peer].qp[qpi];
    int rc = 0;

    while (v->sq_head && v->writes < VERBS_WRITE_WINDOW) {
        struct mesh_req *r = v->sq_head;
        uint64_t left = r->f.length - r->posted;
        uint32_t len = (uint32_t)MESH_MIN(left, (uint64_t)VERBS_PIECE);
        int last = r->posted + len == r->f.length;
        int dbg = atomic_fetch_and(&debug_flags, ~VERBS_DEBUG_BAD_RKEY);
        struct ibv_sge sge = {.addr = (uintptr_t)(r->buf + r->posted),
                              .length = len,
                              .lkey = r->lkey};
        struct ibv_send_wr wr =
                               {
                                   .wr_id = wr_id(WR_WRITE, peer, qpi, 0),
                                   .sg_list = &sge,
                                   .num_sge = len ? 1 : 0,
                                   .opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM
                                                  : IBV_WR_RDMA_WRITE,
                                   .send_flags = IBV_SEND_SIGNALED,
                                   .imm_data = last ? htonl(r->imm) : 0,
                                   .wr = {.rdma = {.remote_addr =
                                                       r->raddr + r->posted,
                                                   .rkey = r->rrkey}},
                               },
                           *bad;

        if (dbg & VERBS_DEBUG_BAD_RKEY)
            wr.wr.rdma.rkey ^= 0x5a5a5a;
        VERBS_CHECK_RC(rc, ibv_post_send(v->qp, &wr, &bad), out,
                       "verbs: posting an RDMA write to rank %d", peer);
        v->ring[(v->ring_head + v->ring_n) % VERBS_SQ_DEPTH] =
            (struct sent){.kind = WR_WRITE, .r = r};
        v->ring_n++;
        v->writes++;
        r->inflight++;
        r->posted += len;
        if (last) {
            r->all_posted = 1;
            q_remove(&v->sq_head, &v->sq_tail, r);
        }
    }
out:
    return rc;
}

/*
 * Match a CTS against a send (the checks of the TCP receiver's
 * data_match, from the sender's side). Returns 1 matched, 0 not this one,
 * -1 the job failed.
 */
static int cts_match(struct mesh_transport *t, struct mesh_req *r,
                     struct cts *c)
{
    const struct mesh_frame *e = &c->f, *f = &r->f;
    uint64_t end = e->offset + e->length;
    char fa[200], fb[200], me[300], them[300];
    int starts_inside = e->length ? (f->offset >= e->offset && f->offset < end)
                                  : f->offset == e->offset;
    int overrun = atomic_load(&debug_flags) & VERBS_DEBUG_OVERRUN;

    if (e->seq != f->seq || e->tag != f->tag || !starts_inside)
        return 0;
    if (e->op != f->op || e->dtype != f->dtype || e->count != f->count) {
        fail_job(t, r->peer, -EPROTO, 1,
                 "desync between rank %d (%s), which expected %s, and "
                 "rank %d (%s), which sent %s",
                 r->peer, pname(t, r->peer, them, sizeof(them)),
                 mesh_frame_str(e, fa, sizeof(fa)), t->world.rank,
                 pname(t, t->world.rank, me, sizeof(me)),
                 mesh_frame_str(f, fb, sizeof(fb)));
        return -1;
    }
    if (!overrun &&
        (f->length > end - f->offset || f->length > e->length - c->reserved)) {
        fail_job(t, r->peer, -EPROTO, 1,
                 "rank %d (%s) sent a frame beyond the posted receive "
                 "of rank %d (%s): got %s, expected %s (%" PRIu64
                 " bytes already claimed); nothing was written",
                 t->world.rank, pname(t, t->world.rank, me, sizeof(me)),
                 r->peer, pname(t, r->peer, them, sizeof(them)),
                 mesh_frame_str(f, fb, sizeof(fb)),
                 mesh_frame_str(e, fa, sizeof(fa)), c->reserved);
        return -1;
    }
    if (overrun) {
        atomic_fetch_and(&debug_flags, ~VERBS_DEBUG_OVERRUN);
        r->raddr = c->addr + e->length; /* past the window: must be refused */
    } else {
        r->raddr = c->addr + (f->offset - e->offset);
    }
    c->reserved += f->length;
    r->rrkey = c->rkey;
    r->qpi = c->slot % t->nqp;
    r->imm = ((uint32_t)c->gen << 16) | c->slot;
    if (c->reserved >= e->length)
        r->imm |= VERBS_IMM_FINAL;
    return 1;
}

/* Match waiting sends of peer against its CTSs; start the matched ones. */
static int match_sends(struct mesh_transport *t, int peer)
{
    struct vpeer *vp = &t->vp[peer];
    struct mesh_req *r, *rn;
    int rc = 0;

    for (r = vp->wq_head; r; r = rn) {
        struct cts *c, *pc = NULL;
        int m = 0;

        rn = r->qnext;
        for (c = vp->cts_head; c; pc = c, c = c->next) {
            m = cts_match(t, r, c);
            if (m)
                break;
        }
        if (m < 0)
            return -EPROTO;
        if (!m)
            continue;
        q_remove(&vp->wq_head, &vp->wq_tail, r);
        if (c->reserved >= c->f.length) {
            if (pc)
                pc->next = c->next;
            else
                vp->cts_head = c->next;
            if (vp->cts_tail == c)
                vp->cts_tail = pc;
            free(c);
        }
        q_push(&vp->qp[r->qpi].sq_head, &vp->qp[r->qpi].sq_tail, r);
        rc = pump(t, peer, r->qpi);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- completions -------------------------------------------------------- */

static void got_cts(struct mesh_transport *t, int peer, int qpi,
                    const uint8_t *m, uint32_t len)
{
    struct vpeer *vp = &t->vp[peer];
    struct cts *c;
    char nb[300];
    int rc;

    if (len != VERBS_CTS_LEN || mesh_get_le32(m) != VERBS_CTS_MAGIC || m[10] || m[11] ||
        mesh_get_le32(m + 60)) {
        fail_job(t, peer, -EPROTO, 1,
                 "rank %d (%s) sent a malformed clear-to-send (%" PRIu32
                 " bytes)",
                 peer, pname(t, peer, nb, sizeof(nb)), len);
        return;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        fail_job(t, -1, -ENOMEM, 1, "out of memory for a clear-to-send");
        return;
    }
    c->slot = mesh_get_le16(m + 4);
    c->gen = mesh_get_le16(m + 6);
    c->f.op = m[8];
    c->f.dtype = m[9];
    c->f.tag = mesh_get_le32(m + 12);
    c->f.seq = mesh_get_le64(m + 16);
    c->f.count = mesh_get_le64(m + 24);
    c->f.offset = mesh_get_le64(m + 32);
    c->f.length = mesh_get_le64(m + 40);
    c->addr = mesh_get_le64(m + 48);
    c->rkey = mesh_get_le32(m + 56);
    if (c->slot >= VERBS_CREDITS || c->slot % t->nqp != qpi ||
        c->gen > 0x7fff || c->f.offset + c->f.length < c->f.offset ||
        c->addr + c->f.length < c->addr) {
        fail_job(t, peer, -EPROTO, 1,
                 "rank %d (%s) sent an invalid clear-to-send (slot %u on QP "
                 "%d, range overflow?)",
                 peer, pname(t, peer, nb, sizeof(nb)), c->slot, qpi);
        free(c);
        return;
    }
    if (vp->cts_tail)
        vp->cts_tail->next = c;
    else
        vp->cts_head = c;
    vp->cts_tail = c;
    rc = match_sends(t, peer);
    if (rc < 0 && rc != -EPROTO)
        fail_job(t, -1, rc, 1, "%s", mesh_err_msg(rc));
}

static void got_imm(struct mesh_transport *t, int peer, uint32_t imm)
{
    struct vpeer *vp = &t->vp[peer];
    unsigned slot = VERBS_IMM_SLOT(imm);
    struct mesh_req *r;
    char nb[300];
    int rc;

    if (slot >= VERBS_CREDITS || !vp->slot[slot] ||
        VERBS_IMM_GEN(imm) != vp->gen[slot] || !(imm & VERBS_IMM_FINAL)) {
        fail_job(t, peer, -EPROTO, 1,
                 "rank %d (%s) completed a write for slot %u generation %u, "
                 "which this rank never granted",
                 peer, pname(t, peer, nb, sizeof(nb)), slot,
                 VERBS_IMM_GEN(imm));
        return;
    }
    r = vp->slot[slot];
    vp->slot[slot] = NULL;
    r->slot = -1;
    req_complete(t, r);
    rc = grant_slots(t, peer);
    if (rc < 0)
        fail_job(t, peer, rc, 1, "%s", mesh_err_msg(rc));
}

static int wc_culprit_code(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_WR_FLUSH_ERR:
        return -ECONNRESET;
    default:
        return -EPROTO;
    }
}

static void handle_wc(struct mesh_transport *t, const struct ibv_wc *wc)
{
    enum wr_kind kind = (enum wr_kind)(wc->wr_id >> 56);
    int peer = (int)((wc->wr_id >> 24) & 0xffffffffu);
    int qpi = (int)((wc->wr_id >> 16) & 0xff);
    int idx = (int)(wc->wr_id & 0xffff);
    char nb[300];
    struct vqp *v;

    if (peer < 0 || peer >= t->world.size || peer == t->world.rank ||
        qpi >= t->nqp)
        return;
    v = &t->vp[peer].qp[qpi];
    if (kind != WR_RECV && v->ring_n > 0) {
        struct sent s = v->ring[v->ring_head];

        v->ring_head = (v->ring_head + 1) % VERBS_SQ_DEPTH;
        v->ring_n--;
        if (s.kind == WR_WRITE) {
            v->writes--;
            if (!t->failed && s.r) {
                s.r->inflight--;
                if (wc->status == IBV_WC_SUCCESS && s.r->all_posted &&
                    !s.r->inflight)
                    req_complete(t, s.r);
            }
        }
    }
    if (t->failed || t->stopping)
        return;
    if (wc->status != IBV_WC_SUCCESS) {
        if (t->vp[peer].bye)
            fail_job(t, peer, -ECONNRESET, 1,
                     "rank %d (%s) left the mesh with operations pending "
                     "(%s: %s)",
                     peer, pname(t, peer, nb, sizeof(nb)), wr_kind_name(kind),
                     ibv_wc_status_str(wc->status));
        else if (!t->wc_fail_ns) {
            t->wc_fail_ns = mesh_now_ns();
            t->wc_fail_peer = peer;
            t->wc_fail_code = wc_culprit_code(wc->status);
            snprintf(t->wc_fail_msg, sizeof(t->wc_fail_msg),
                     "rank %d (%s): verbs %s on QP %d failed: %s (status %d, "
                     "vendor error 0x%x)",
                     peer, pname(t, peer, nb, sizeof(nb)), wr_kind_name(kind),
                     qpi, ibv_wc_status_str(wc->status), (int)wc->status,
                     wc->vendor_err);
        }
        return;
    }
    if (kind == WR_RECV) {
        int rc;

        if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            got_imm(t, peer, ntohl(wc->imm_data));
        } else if (wc->opcode == IBV_WC_RECV) {
            got_cts(t, peer, qpi, rbuf(t, peer, qpi, idx), wc->byte_len);
        } else {
            fail_job(t, peer, -EPROTO, 1,
                     "rank %d (%s): unexpected receive completion opcode %d",
                     peer, pname(t, peer, nb, sizeof(nb)), (int)wc->opcode);
            return;
        }
        if (t->failed)
            return;
        rc = post_recv(t, peer, qpi, idx);
        if (rc < 0)
            fail_job(t, -1, rc, 1, "%s", mesh_err_msg(rc));
    } else if (kind == WR_WRITE) {
        int rc = pump(t, peer, qpi);

        if (rc < 0)
            fail_job(t, -1, rc, 1, "%s", mesh_err_msg(rc));
    }
}

/*
 * How long a goodbye waits for the peer's last completions. The goodbye
 * comes over TCP and the data over the RC QP: the two are not ordered, so
 * a write-with-immediate the peer finished before leaving may still sit
 * in our CQ (or in Soft-RoCE's queues) when its goodbye arrives.
 */
#define VERBS_BYE_GRACE_NS 2000000000ull

static int drain_cq(struct mesh_transport *t);

/*
 * A peer said goodbye: once the grace has passed, its pending operations
 * can no longer complete.
 */
static void bye_check(struct mesh_transport *t, int peer)
{
    struct vpeer *vp = &t->vp[peer];
    char nb[300];

    if (!vp->bye_ns)
        return;
    if (drain_cq(t) < 0 || t->failed)
        return;
    for (struct mesh_req *r = t->reqs; r; r = r->next)
        if (r->peer == peer && !atomic_load(&r->done)) {
            if (mesh_now_ns() - vp->bye_ns < VERBS_BYE_GRACE_NS)
                return; /* look again at the next tick */
            vp->bye_ns = 0;
            fail_job(t, peer, -ECONNRESET, 1,
                     "rank %d (%s) left the mesh with operations pending", peer,
                     pname(t, peer, nb, sizeof(nb)));
            return;
        }
    vp->bye_ns = 0; /* nothing pending: nothing to fail */
}

/*
 * How long a failed work completion waits before it fails the job. A peer
 * that fails the job first (say, because a third rank went silent) tears
 * its queue pairs and memory down while our writes to it are in flight:
 * they fail with a remote access or operation error, which names that
 * peer, while its abort notice, naming the real culprit, is still on its
 * way over TCP. The notice wins when it comes within this grace.
 */
#define VERBS_WC_GRACE_NS 1000000000ull

/* Watch the TCP mesh: its failures and the peers' goodbyes; fail the job
 * for a work completion that failed more than the grace ago. */
static void tick(struct mesh_transport *t)
{
    int rc = t->inner_ops->progress(t->inner);

    if (rc < 0) {
        /* A peer that blames us while our own completion failed: ours is
         * the first-hand account (a wrong key, a write past a window). */
        if (t->wc_fail_ns && !t->failed &&
            mesh_tcp_culprit(t->inner) == t->world.rank)
            fail_job(t, t->wc_fail_peer, t->wc_fail_code, 0, "%s",
                     t->wc_fail_msg);
        else
            adopt_inner_failure(t, rc);
        return;
    }
    if (t->wc_fail_ns && !t->failed &&
        mesh_now_ns() - t->wc_fail_ns >= VERBS_WC_GRACE_NS) {
        fail_job(t, t->wc_fail_peer, t->wc_fail_code, 1, "%s",
                 t->wc_fail_msg);
        return;
    }
    for (int p = 0; p < t->world.size; p++) {
        struct vpeer *vp = &t->vp[p];
        int done = 0;

        if (p == t->world.rank)
            continue;
        if (vp->bye_ns) {
            bye_check(t, p);
            if (t->failed)
                return;
        }
        if (!vp->bye_req)
            continue;
        rc = t->inner_ops->test(t->inner, vp->bye_req, &done);
        if (rc < 0) {
            vp->bye_req = NULL;
            adopt_inner_failure(t, rc);
            return;
        }
        if (done) {
            vp->bye_req = NULL;
            vp->bye = 1;
            vp->bye_ns = mesh_now_ns();
            bye_check(t, p);
            if (t->failed)
                return;
        }
    }
}

static int drain_cq(struct mesh_transport *t)
{
    struct ibv_wc wc[32];
    int n, total = 0;

    for (;;) {
        n = ibv_poll_cq(t->cq, (int)MESH_ARRAY_SIZE(wc), wc);
        if (n < 0) {
            fail_job(t, -1, -EIO, 1, "verbs: ibv_poll_cq failed (%d)", n);
            return n;
        }
        if (!n)
            return total;
        for (int i = 0; i < n; i++)
            handle_wc(t, &wc[i]);
        total += n;
    }
}

static void *progress_main(void *arg)
{
    struct mesh_transport *t = arg;
    uint64_t idle_since = mesh_now_ns(), last_tick = 0;

    pthread_mutex_lock(&t->lock);
    while (!t->stopping) {
        uint64_t now;
        int n = drain_cq(t);

        now = mesh_now_ns();
        if (now - last_tick >= VERBS_TICK_MS * 1000000ull) {
            tick(t);
            last_tick = now;
        }
        if (n != 0) {
            idle_since = now;
            continue;
        }
        if (now - idle_since < VERBS_SPIN_NS) {
            pthread_mutex_unlock(&t->lock);
            sched_yield();
            pthread_mutex_lock(&t->lock);
            continue;
        }
        /* Idle: arm the CQ, look once more, then sleep on the channel. */
        if (ibv_req_notify_cq(t->cq, 0)) {
            fail_job(t, -1, -EIO, 1, "verbs: ibv_req_notify_cq failed");
            break;
        }
        if (drain_cq(t) > 0) {
            idle_since = mesh_now_ns();
            continue;
        }
        pthread_mutex_unlock(&t->lock);
        {
            struct pollfd pfd = {.fd = t->chan->fd, .events = POLLIN};
            int pr = poll(&pfd, 1, VERBS_TICK_MS);

            pthread_mutex_lock(&t->lock);
            if (pr > 0) {
                struct ibv_cq *cq;
                void *cq_ctx;

                if (!ibv_get_cq_event(t->chan, &cq, &cq_ctx) &&
                    ++t->cq_events >= 64) {
                    ibv_ack_cq_events(t->cq, (unsigned)t->cq_events);
                    t->cq_events = 0;
                }
                idle_since = mesh_now_ns();
            }
        }
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

/* ---- the interface --------------------------------------------------------
 */

static void verbs_close(mesh_transport_t *t);

static int vlisten(const struct mesh_world *world,
                   const struct mesh_transport_opts *opts, int is_auto,
                   mesh_transport_t **out)
{
    struct mesh_transport *t;
    pthread_condattr_t ca;
    int rc;

    t = calloc(1, sizeof(*t));
    if (!t)
        return mesh_err(-ENOMEM, "out of memory");
    t->inner_ops = &mesh_tcp_ops;
    t->is_auto = is_auto;
    t->opts = *opts;
    t->world = *world;
    t->gid_index = -1;
    t->peers = calloc((size_t)world->size, sizeof(*t->peers));
    if (!t->peers) {
        free(t);
        return mesh_err(-ENOMEM, "out of memory");
    }
    memcpy(t->peers, world->peers, (size_t)world->size * sizeof(*t->peers));
    t->world.peers = t->peers;
    t->nqp = MESH_MAX(1, MESH_MIN(opts->streams, VERBS_QP_MAX));
    /* wait_any's deadlines are on mesh_now_ns()'s clock (monotonic) */
    if (pthread_mutex_init(&t->lock, NULL) || pthread_condattr_init(&ca) ||
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) ||
        pthread_cond_init(&t->cond, &ca)) {
        free(t->peers);
        free(t);
        return mesh_err(-ENOMEM, "pthread init failed");
    }
    pthread_condattr_destroy(&ca);

    rc = t->inner_ops->listen(world, opts, &t->inner);
    if (rc < 0)
        goto fail;
    rc = dev_open(t);
    if (rc < 0 && !is_auto)
        goto fail;
    if (rc < 0) {
        mesh_info("auto transport: no usable RDMA port here (%s)",
                  mesh_err_msg(rc));
        mesh_err_clear();
    }
    *out = t;
    return 0;

fail:
    verbs_close(t);
    return rc;
}

static int verbs_listen(const struct mesh_world *world,
                        const struct mesh_transport_opts *opts,
                        mesh_transport_t **out)
{
    return vlisten(world, opts, 0, out);
}

static int auto_listen(const struct mesh_world *world,
                       const struct mesh_transport_opts *opts,
                       mesh_transport_t **out)
{
    return vlisten(world, opts, 1, out);
}

/* Close what dev_open and the connect built, in reverse order. */
static void dev_close(struct mesh_transport *t)
{
    for (int p = 0; t->vp && p < t->world.size; p++)
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

static int verbs_connect(mesh_transport_t *t)
{
    int n = t->world.size, rc, all = 1;
    uint8_t *out = NULL, *in = NULL, ready[VERBS_INFO_LEN] = {0};
    struct remote *rem = NULL;

    rc = t->inner_ops->connect(t->inner);
    if (rc < 0)
        return rc;
    /* Authenticated from here on: build the QPs and trade their details. */
    if (t->ctx) {
        t->vp = calloc((size_t)n, sizeof(*t->vp));
        t->ctrl_len = ((size_t)n * VERBS_QP_MAX * VERBS_RQ_DEPTH +
                       (size_t)n * VERBS_CREDITS) *
                      VERBS_CTS_LEN;
        rc = mesh_host_alloc(t->ctrl_len, (void **)&t->ctrl);
        if (!t->vp || rc < 0) {
            rc = mesh_err(-ENOMEM, "verbs: out of memory for %d peers", n);
            goto out;
        }
        VERBS_CHECK_PTR(
            rc, t->ctrl_mr,
            ibv_reg_mr(t->pd, t->ctrl, t->ctrl_len, IBV_ACCESS_LOCAL_WRITE),
            out, "verbs: ibv_reg_mr of %zu control bytes", t->ctrl_len);
        rc = qps_create(t);
        if (rc < 0)
            goto out;
    }
    out = calloc((size_t)n, VERBS_INFO_LEN);
    in = calloc((size_t)n, VERBS_INFO_LEN);
    rem = calloc((size_t)n, sizeof(*rem));
    if (!out || !in || !rem) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < n; p++)
        if (p != t->world.rank)
            info_encode(t, p, out + (size_t)p * VERBS_INFO_LEN);
    rc = ctrl_exchange(t, VERBS_TAG_INFO, out, VERBS_INFO_LEN, in,
                       VERBS_INFO_LEN);
    if (rc < 0)
        goto out;
    all = t->ctx != NULL;
    for (int p = 0; p < n; p++) {
        if (p == t->world.rank)
            continue;
        rc = info_decode(t, p, in + (size_t)p * VERBS_INFO_LEN, &rem[p]);
        if (rc < 0)
            goto out;
        all = all && rem[p].active;
    }
    if (!all) {
        char nb[300];
        int who = -1;

        for (int p = 0; p < n && who < 0; p++)
            if (p != t->world.rank && !rem[p].active)
                who = p;
        if (!t->is_auto) {
            rc = mesh_err(-ENODEV,
                          "verbs: rank %d (%s) has no usable RDMA port; "
                          "use --transport tcp or auto",
                          who, pname(t, who, nb, sizeof(nb)));
            goto out;
        }
        mesh_info("auto transport: TCP (%s has no usable RDMA port)",
                  who < 0 ? "this rank" : pname(t, who, nb, sizeof(nb)));
        dev_close(t);
        t->connected = 1;
        rc = 0;
        goto out;
    }
    for (int p = 0; p < n && rc == 0; p++)
        if (p != t->world.rank)
            rc = qps_connect(t, p, &rem[p]);
    if (rc < 0)
        goto out;
    /* Nobody sends until every QP that could receive it is ready. */
    rc = ctrl_exchange(t, VERBS_TAG_READY, ready, 0, in, VERBS_INFO_LEN);
    if (rc < 0)
        goto out;
    for (int p = 0; p < n && rc == 0; p++) {
        struct mesh_frame f = {.seq = VERBS_CTRL_SEQ,
                               .tag = VERBS_TAG_BYE,
                               .op = MESH_OP_P2P,
                               .dtype = MESH_DT_BYTE};

        if (p != t->world.rank)
            rc = t->inner_ops->irecv(t->inner, p, &f, NULL, NULL,
                                     &t->vp[p].bye_req);
    }
    if (rc < 0)
        goto out;
    if (pthread_create(&t->thread, NULL, progress_main, t)) {
        rc = mesh_err(-EAGAIN, "verbs: cannot start the progress thread");
        goto out;
    }
    t->thread_started = 1;
    t->active = 1;
    t->connected = 1;
    mesh_info("verbs: %s port %u, %d QP(s) per peer, MTU %d, GID index %d",
              t->devname, t->port, t->nqp, mtu_bytes(t->pattr.active_mtu),
              t->gid_index);
out:
    free(out);
    free(in);
    free(rem);
    return rc;
}

/* ---- memory registration
 * ----------------------------------------------------- */

static struct mesh_mr *mr_find(struct mesh_transport *t, const void *buf,
                               size_t len)
{
    const char *b = buf;

    for (struct mesh_mr *m = t->mrs; m; m = m->next)
        if (b >= m->base && b + len <= m->base + m->len && b + len >= b)
            return m;
    return NULL;
}

static int verbs_reg_mr(mesh_transport_t *t, void *buf, size_t len,
                        mesh_mr_t **out)
{
    struct mesh_mr *m;
    int rc = 0;

    if (!buf || !len)
        return mesh_err(-EINVAL, "verbs reg_mr: empty range");
    pthread_mutex_lock(&t->lock);
    m = mr_find(t, buf, len);
    if (m) {
        m->refs++;
        *out = m;
        goto out;
    }
    m = calloc(1, sizeof(*m));
    if (!m) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    if (t->pd)
        VERBS_CHECK_PTR(
            rc, m->mr,
            ibv_reg_mr(t->pd, buf, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
            free_m, "verbs: ibv_reg_mr of %zu bytes at %p", len, buf);
    else if (t->connected) {
        rc = t->inner_ops->reg_mr(t->inner, buf, len, &m->inner);
        if (rc < 0)
            goto free_m;
    }
    m->base = buf;
    m->len = len;
    m->refs = 1;
    m->next = t->mrs;
    t->mrs = m;
    if (m->mr)
        t->mr_live++;
    *out = m;
    goto out;

free_m:
    free(m);
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int verbs_dereg_mr(mesh_transport_t *t, mesh_mr_t *mr)
{
    struct mesh_mr **pp;
    int rc = 0;

    if (!mr)
        return 0;
    pthread_mutex_lock(&t->lock);
    for (pp = &t->mrs; *pp && *pp != mr; pp = &(*pp)->next)
        ;
    if (!*pp) {
        rc = mesh_err(-EINVAL, "verbs dereg_mr: unknown registration");
        goto out;
    }
    if (--mr->refs > 0)
        goto out;
    *pp = mr->next;
    if (mr->mr) {
        VERBS_CHECK_RC(rc, ibv_dereg_mr(mr->mr), free_mr,
                       "verbs: ibv_dereg_mr of %zu bytes", mr->len);
        t->mr_live--;
    }
    if (mr->inner)
        rc = t->inner_ops->dereg_mr(t->inner, mr->inner);
free_mr:
    free(mr);
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/* ---- requests -------------------------------------------------------------
 */

static int check_peer(struct mesh_transport *t, int peer, const char *what)
{
    char nb[300];

    if (peer < 0 || peer >= t->world.size || peer == t->world.rank)
        return mesh_err(-EINVAL, "verbs %s: invalid peer %d (rank %d of %d)",
                        what, peer, t->world.rank, t->world.size);
    if (t->failed)
        return fail_err(t);
    if (!t->connected)
        return mesh_err(-ENOTCONN, "verbs %s: the mesh is not joined", what);
    if (t->vp[peer].bye) {
        fail_job(t, peer, -ECONNRESET, 1,
                 "rank %d (%s) left the mesh with operations pending", peer,
                 pname(t, peer, nb, sizeof(nb)));
        return fail_err(t);
    }
    return 0;
}

/* The keys of [buf, buf+len): from mr, the cache, or a registration for
 * this request alone (callers that pass no mr, e.g. tests; slow). */
static int req_keys(struct mesh_transport *t, struct mesh_req *r, mesh_mr_t *mr,
                    size_t len)
{
    struct mesh_mr *m = mr;
    int rc = 0;

    if (!len)
        return 0;
    if (m && m->mr && (char *)r->buf >= m->base &&
        (char *)r->buf + len <= m->base + m->len) {
        r->lkey = m->mr->lkey;
        r->rkey = m->mr->rkey;
        return 0;
    }
    m = mr_find(t, r->buf, len);
    if (m && m->mr) {
        r->lkey = m->mr->lkey;
        r->rkey = m->mr->rkey;
        return 0;
    }
    VERBS_CHECK_PTR(
        rc, r->tmp,
        ibv_reg_mr(t->pd, r->buf, len,
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
        out, "verbs: ibv_reg_mr of %zu bytes at %p", len, r->buf);
    t->mr_live++;
    r->lkey = r->tmp->lkey;
    r->rkey = r->tmp->rkey;
out:
    return rc;
}

static struct mesh_req *req_new(struct mesh_transport *t, enum req_kind kind,
                                int peer, const struct mesh_frame *f,
                                const void *buf)
{
    struct mesh_req *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    r->kind = kind;
    r->peer = peer;
    r->f = *f;
    r->buf = (char *)buf;
    r->slot = -1;
    req_link(t, r);
    return r;
}

static int verbs_isend(mesh_transport_t *t, int peer,
                       const struct mesh_frame *f, const void *buf,
                       mesh_mr_t *mr, mesh_req_t **out)
{
    struct mesh_req *r;
    int rc;

    if (f->length && !buf)
        return mesh_err(-EINVAL, "verbs isend: NULL buffer");
    if (f->offset + f->length < f->offset)
        return mesh_err(-EINVAL, "verbs isend: range overflows");
    if (t->connected && !t->active) {
        r = calloc(1, sizeof(*r));
        if (!r)
            return mesh_err(-ENOMEM, "out of memory");
        rc = t->inner_ops->isend(t->inner, peer, f, buf, mr ? mr->inner : NULL,
                                 &r->inner);
        if (rc < 0) {
            free(r);
            return rc;
        }
        *out = r;
        return 0;
    }
    pthread_mutex_lock(&t->lock);
    rc = check_peer(t, peer, "isend");
    if (rc < 0)
        goto out;
    r = req_new(t, REQ_SEND, peer, f, buf);
    if (!r) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    rc = req_keys(t, r, mr, f->length);
    if (rc < 0) {
        req_free(t, r);
        goto out;
    }
    q_push(&t->vp[peer].wq_head, &t->vp[peer].wq_tail, r);
    /* A desync fails the job here; the request stays linked and test()
     * reports the failure. */
    rc = match_sends(t, peer);
    if (rc < 0 && !t->failed)
        fail_job(t, -1, rc, 1, "%s", mesh_err_msg(rc));
    *out = r;
    rc = 0;
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int verbs_irecv(mesh_transport_t *t, int peer,
                       const struct mesh_frame *expect, void *buf,
                       mesh_mr_t *mr, mesh_req_t **out)
{
    struct mesh_req *r;
    int rc;

    if (expect->length && !buf)
        return mesh_err(-EINVAL, "verbs irecv: NULL buffer");
    if (expect->offset + expect->length < expect->offset)
        return mesh_err(-EINVAL, "verbs irecv: range overflows");
    if (t->connected && !t->active) {
        r = calloc(1, sizeof(*r));
        if (!r)
            return mesh_err(-ENOMEM, "out of memory");
        rc = t->inner_ops->irecv(t->inner, peer, expect, buf,
                                 mr ? mr->inner : NULL, &r->inner);
        if (rc < 0) {
            free(r);
            return rc;
        }
        *out = r;
        return 0;
    }
    pthread_mutex_lock(&t->lock);
    rc = check_peer(t, peer, "irecv");
    if (rc < 0)
        goto out;
    r = req_new(t, REQ_RECV, peer, expect, buf);
    if (!r) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    rc = req_keys(t, r, mr, expect->length);
    if (rc < 0) {
        req_free(t, r);
        goto out;
    }
    q_push(&t->vp[peer].rq_head, &t->vp[peer].rq_tail, r);
    rc = grant_slots(t, peer);
    if (rc < 0)
        fail_job(t, peer, rc, 1, "%s", mesh_err_msg(rc));
    *out = r;
    rc = 0;
out:
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/* Unhook a failed request from every queue (the job failed). */
static void req_detach(struct mesh_transport *t, struct mesh_req *r)
{
    struct vpeer *vp = &t->vp[r->peer];

    q_remove(&vp->rq_head, &vp->rq_tail, r);
    q_remove(&vp->wq_head, &vp->wq_tail, r);
    for (int q = 0; q < t->nqp; q++) {
        struct vqp *v = &vp->qp[q];

        q_remove(&v->sq_head, &v->sq_tail, r);
        for (int i = 0; i < v->ring_n; i++)
            if (v->ring[(v->ring_head + i) % VERBS_SQ_DEPTH].r == r)
                v->ring[(v->ring_head + i) % VERBS_SQ_DEPTH].r = NULL;
    }
    if (r->slot >= 0 && vp->slot[r->slot] == r)
        vp->slot[r->slot] = NULL;
}

static int verbs_test(mesh_transport_t *t, mesh_req_t *req, int *done)
{
    int rc = 0;

    if (!req)
        return mesh_err(-EINVAL, "verbs test: NULL request");
    if (req->inner) {
        rc = t->inner_ops->test(t->inner, req->inner, done);
        if (*done)
            free(req);
        return rc;
    }
    pthread_mutex_lock(&t->lock);
    if (atomic_load(&req->done)) {
        req_free(t, req);
        *done = 1;
    } else if (t->failed) {
        rc = fail_err(t);
        req_detach(t, req);
        req_free(t, req);
        *done = 1;
    } else {
        *done = 0;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int any_done(mesh_req_t *const *reqs, int n)
{
    for (int i = 0; i < n; i++)
        if (reqs[i] && !reqs[i]->inner &&
            atomic_load_explicit(&reqs[i]->done, memory_order_acquire))
            return 1;
    return 0;
}

static int verbs_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                          double timeout_s)
{
    uint64_t deadline = MESH_NO_DEADLINE;
    int rc = 0;

    if (n <= 0 || !reqs)
        return mesh_err(-EINVAL, "verbs wait_any: no requests");
    if (t->connected && !t->active) {
        mesh_req_t **in = calloc((size_t)n, sizeof(*in));

        if (!in)
            return mesh_err(-ENOMEM, "out of memory");
        for (int i = 0; i < n; i++)
            in[i] = reqs[i] ? reqs[i]->inner : NULL;
        rc = t->inner_ops->wait_any(t->inner, in, n, timeout_s);
        free(in);
        return rc;
    }
    /* A short spin saves the sleep/wake round trip on small messages. */
    {
        uint64_t spin_end = mesh_now_ns() + VERBS_WAIT_SPIN_NS;

        do {
            if (any_done(reqs, n))
                return 0;
        } while (mesh_now_ns() < spin_end);
    }
    if (timeout_s >= 0)
        deadline = mesh_now_ns() + (uint64_t)(timeout_s * 1e9);
    pthread_mutex_lock(&t->lock);
    for (;;) {
        if (any_done(reqs, n))
            break;
        if (t->failed) {
            rc = fail_err(t);
            break;
        }
        if (mesh_cond_sleep(&t->cond, &t->lock, deadline) < 0) {
            rc = mesh_err(-ETIMEDOUT,
                          "verbs wait: no request completed within %.3f s",
                          timeout_s);
            break;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

static int verbs_progress(mesh_transport_t *t)
{
    int rc = 0;

    if (t->connected && !t->active)
        return t->inner_ops->progress(t->inner);
    pthread_mutex_lock(&t->lock);
    if (t->failed)
        rc = fail_err(t);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/* The TCP mesh carries every failure's notice, the culprit with it. */
static int verbs_culprit(mesh_transport_t *t)
{
    return t && t->inner ? mesh_tcp_culprit(t->inner) : -1;
}

static void verbs_abort(mesh_transport_t *t, int culprit, const char *why)
{
    int rc;

    if (!t)
        return;
    t->inner_ops->abort(t->inner, culprit, why);
    pthread_mutex_lock(&t->lock);
    rc = t->inner_ops->progress(t->inner);
    if (rc < 0)
        adopt_inner_failure(t, rc);
    pthread_mutex_unlock(&t->lock);
}

/* Every other peer's goodbye has arrived (under t->lock). */
static int all_said_bye(const struct mesh_transport *t)
{
    for (int p = 0; p < t->world.size; p++)
        if (p != t->world.rank && !t->vp[p].bye)
            return 0;
    return 1;
}

static void verbs_close(mesh_transport_t *t)
{
    struct mesh_req *r, *rn;
    struct mesh_mr *m, *mn;

    if (!t)
        return;
    /* Tell the peers we leave normally, unless the job failed. */
    if (t->active && !t->failed) {
        for (int p = 0; p < t->world.size; p++) {
            struct mesh_frame f = {.seq = VERBS_CTRL_SEQ,
                                   .tag = VERBS_TAG_BYE,
                                   .op = MESH_OP_P2P,
                                   .dtype = MESH_DT_BYTE};
            mesh_req_t *s;

            if (p != t->world.rank && !t->vp[p].bye &&
                t->inner_ops->isend(t->inner, p, &f, NULL, NULL, &s) == 0)
                mesh_transport_wait(t->inner_ops, t->inner, s);
        }
    }
    /*
     * Linger until every peer has said goodbye too, within the peer
     * timeout: a peer's last RDMA writes into us, and the acknowledgements
     * of ours, need our QPs alive until that peer is done.
     */
    if (t->active && t->thread_started) {
        uint64_t end = mesh_now_ns() + (uint64_t)(t->opts.peer_timeout_s * 1e9);

        pthread_mutex_lock(&t->lock);
        while (!t->failed && mesh_now_ns() < end && !all_said_bye(t)) {
            pthread_mutex_unlock(&t->lock);
            usleep(2000);
            pthread_mutex_lock(&t->lock);
        }
        pthread_mutex_unlock(&t->lock);
    }
    if (t->thread_started) {
        pthread_mutex_lock(&t->lock);
        t->stopping = 1;
        pthread_mutex_unlock(&t->lock);
        pthread_join(t->thread, NULL);
    }
    for (r = t->reqs; r; r = rn) {
        rn = r->next;
        if (r->tmp && !ibv_dereg_mr(r->tmp))
            t->mr_live--;
        free(r);
    }
    for (int p = 0; t->vp && p < t->world.size; p++) {
        struct cts *c, *cn;

        for (c = t->vp[p].cts_head; c; c = cn) {
            cn = c->next;
            free(c);
        }
    }
    dev_close(t);
    for (m = t->mrs; m; m = mn) {
        mn = m->next;
        free(m);
    }
    if (t->ctrl)
        mesh_host_free(t->ctrl, t->ctrl_len);
    /* The TCP mesh last: its goodbye follows ours. */
    t->inner_ops->close(t->inner);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    free(t->vp);
    free(t->peers);
    free(t);
}

int mesh_verbs_mr_live(mesh_transport_t *t)
{
    int n;

    if (!t)
        return -1;
    pthread_mutex_lock(&t->lock);
    n = t->mr_live;
    pthread_mutex_unlock(&t->lock);
    return n;
}

int mesh_verbs_active(mesh_transport_t *t)
{
    return t && t->active;
}

const struct mesh_transport_ops mesh_verbs_ops = {
    .name = "verbs",
    .listen = verbs_listen,
    .connect = verbs_connect,
    .reg_mr = verbs_reg_mr,
    .dereg_mr = verbs_dereg_mr,
    .isend = verbs_isend,
    .irecv = verbs_irecv,
    .test = verbs_test,
    .wait_any = verbs_wait_any,
    .progress = verbs_progress,
    .abort = verbs_abort,
    .culprit = verbs_culprit,
    .close = verbs_close,
};

const struct mesh_transport_ops mesh_auto_ops = {
    .name = "auto",
    .listen = auto_listen,
    .connect = verbs_connect,
    .reg_mr = verbs_reg_mr,
    .dereg_mr = verbs_dereg_mr,
    .isend = verbs_isend,
    .irecv = verbs_irecv,
    .test = verbs_test,
    .wait_any = verbs_wait_any,
    .progress = verbs_progress,
    .abort = verbs_abort,
    .culprit = verbs_culprit,
    .close = verbs_close,
};
