/*
 * transport/verbs/verbs-internal.h: the verbs transport's design, private
 * layouts and the functions its files share. Only transport/verbs/
 * includes this; the wire formats are in transport/verbs/verbs.h.
 *
 *
 * Shape (see transport/verbs/verbs.h for the wire formats):
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
 *
 * The files:
 *   device.c    device, port and GID; the QPs and their INFO exchange over
 *               the TCP mesh
 *   data.c      the data path (CTS, RDMA writes), completions, the
 *               progress thread and its tick
 *   requests.c  memory registration, isend, irecv, test, wait_any
 *   ops.c       listen, connect, failure, abort, close and the ops tables
 */
#ifndef MESH_TRANSPORT_VERBS_VERBS_INTERNAL_H
#define MESH_TRANSPORT_VERBS_VERBS_INTERNAL_H

#include "common/bytes.h"
#include "common/util.h"
#include "transport/base.h"
#include "transport/transport.h"
#include "transport/verbs/verbs.h"

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

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

struct mesh_mr {
    struct ibv_mr *mr; /* NULL when no device is open (auto on TCP) */
    char *base;
    size_t len;
    int refs;
    struct mesh_mr *next;
};

struct mesh_req {
    struct tp_req super; /* kind, peer, frame, done, the request list */
    char *buf;
    uint32_t lkey, rkey; /* of the memory under buf */
    struct ibv_mr *tmp;  /* a registration for this request only */
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
    struct mesh_req *qnext; /* a waiting or sending queue */
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
    struct verbs_grants grants;         /* its CTSs' slots: generation, open */
    struct mesh_req *wq_head, *wq_tail; /* sends waiting for a CTS */
    int bye;
    uint64_t bye_ns;     /* when its goodbye arrived (0: not yet checked) */
    mesh_req_t *bye_req; /* the TCP receive of its goodbye */
};

struct mesh_transport {
    struct tp_base super; /* world, opts, lock, cond, requests, failure */
    const struct mesh_transport_ops *inner_ops;
    mesh_transport_t *inner;
    int is_auto;
    int active; /* RDMA chosen (after connect) */
    int connected;
    /* auto: the operations connect chose (verbs, or TCP on inner) */
    const struct mesh_transport_ops *use;

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

    pthread_t thread;
    int thread_started;
    int stopping;

    /* a failed work completion, held for VERBS_WC_GRACE_NS (see tick) */
    uint64_t wc_fail_ns;
    int wc_fail_peer, wc_fail_code;
    char wc_fail_msg[MSG_MAX / 2];
};

struct remote {
    int active;
    uint32_t nqp;
    uint16_t lid;
    uint8_t mtu, link_layer, use_gid;
    union ibv_gid gid;
    uint32_t qpn[VERBS_QP_MAX], psn[VERBS_QP_MAX];
};

static inline const char *verbs_pname(struct mesh_transport *t, int r,
                                      char *buf, size_t len)
{
    return tp_pname(&t->super, r, buf, len);
}

/* device.c */
int verbs_mtu_bytes(enum ibv_mtu m);
int verbs_rocev2_gid(struct ibv_context *ctx, uint8_t port, int tbl_len);
int verbs_dev_open(struct mesh_transport *t);
void verbs_dev_close(struct mesh_transport *t);
uint8_t *verbs_rbuf(struct mesh_transport *t, int peer, int qpi, int idx);
uint8_t *verbs_sbuf(struct mesh_transport *t, int peer, int slot);
int verbs_post_recv(struct mesh_transport *t, int peer, int qpi, int idx);
int verbs_qps_create(struct mesh_transport *t);
void verbs_info_encode(struct mesh_transport *t, int peer, uint8_t *m);
int verbs_info_decode(struct mesh_transport *t, int peer, const uint8_t *m,
                      struct remote *r);
int verbs_qps_connect(struct mesh_transport *t, int peer,
                      const struct remote *r);
/* The remote end of an RC queue pair and this end's send side, for
 * verbs_qp_rts. */
struct verbs_qp_link {
    uint8_t port;              /* this end's port */
    enum ibv_mtu mtu;          /* the path's: the smaller of both ends' */
    uint32_t dest_qpn, rq_psn; /* the remote QP and its first PSN */
    uint32_t sq_psn;           /* this end's first PSN */
    uint16_t dlid;
    const union ibv_gid *dgid; /* NULL: no GRH (InfiniBand by LID) */
    int sgid_index;
    uint8_t dest_rd_atomic, rd_atomic; /* RDMA reads in, out */
    double peer_timeout_s;             /* a dead peer fails within it */
};
int verbs_qp_rts(struct ibv_qp *qp, const struct verbs_qp_link *l,
                 const char *what);

/* data.c */
uint64_t verbs_wr_id(enum wr_kind kind, int peer, int qpi, int idx);
void verbs_q_remove(struct mesh_req **head, struct mesh_req **tail,
                    struct mesh_req *r);
void verbs_q_push(struct mesh_req **head, struct mesh_req **tail,
                  struct mesh_req *r);
int verbs_grant_slots(struct mesh_transport *t, int peer);
int verbs_match_sends(struct mesh_transport *t, int peer);
void *verbs_progress_main(void *arg);

/* requests.c */
int verbs_reg_mr(mesh_transport_t *t, void *buf, size_t len, mesh_mr_t **out);
int verbs_dereg_mr(mesh_transport_t *t, mesh_mr_t *mr);
int verbs_isend(mesh_transport_t *t, int peer, const struct mesh_frame *f,
                const void *buf, mesh_mr_t *mr, mesh_req_t **out);
int verbs_irecv(mesh_transport_t *t, int peer, const struct mesh_frame *expect,
                void *buf, mesh_mr_t *mr, mesh_req_t **out);
int verbs_test(mesh_transport_t *t, mesh_req_t *req, int *done);
int verbs_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                   double timeout_s);
int verbs_progress(mesh_transport_t *t);
/* base's req_free: test() hands a request back */
void verbs_req_release(struct tp_base *b, struct tp_req *r, int failed);

/* ops.c */
void verbs_req_free(struct mesh_transport *t, struct mesh_req *r);
/* The TCP mesh failed (a dead or aborting peer): adopt its failure f (its
 * code and reason, not its operation in flight: one of ours, meaningless
 * to the user). */
void verbs_adopt_inner_failure(struct mesh_transport *t,
                               const struct tp_failure *f);

#endif
