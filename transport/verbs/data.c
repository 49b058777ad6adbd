/*
 * transport/verbs/data.c: the data path (clear-to-send, RDMA writes), the
 * completions, and the progress thread with its tick.
 */
#include "config.h"

#include "transport/verbs/verbs-internal.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int drain_cq(struct mesh_transport *t);

static atomic_int debug_flags;

void mesh_verbs_debug_set(int flags)
{
    atomic_store(&debug_flags, flags);
}

/* ---- small helpers ------------------------------------------------------- */

uint64_t verbs_wr_id(enum wr_kind kind, int peer, int qpi, int idx)
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

/* Remove r from a singly linked queue. */
void verbs_q_remove(struct mesh_req **head, struct mesh_req **tail,
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

void verbs_q_push(struct mesh_req **head, struct mesh_req **tail,
                  struct mesh_req *r)
{
    r->qnext = NULL;
    if (*tail)
        (*tail)->qnext = r;
    else
        *head = r;
    *tail = r;
}

/* ---- the data path ------------------------------------------------------- */

static int post_cts(struct mesh_transport *t, struct mesh_req *r, int slot)
{
    struct vpeer *vp = &t->vp[r->super.peer];
    int qpi = slot % t->nqp;
    struct vqp *v = &vp->qp[qpi];
    uint8_t *m = verbs_sbuf(t, r->super.peer, slot);
    struct ibv_sge sge = {.addr = (uintptr_t)m,
                          .length = VERBS_CTS_LEN,
                          .lkey = t->ctrl_mr->lkey};
    struct ibv_send_wr wr =
                           {
                               .wr_id = verbs_wr_id(WR_CTS, r->super.peer, qpi,
                                                    slot),
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
    if (atomic_fetch_and(&debug_flags, ~VERBS_DEBUG_CTS_GEN) &
        VERBS_DEBUG_CTS_GEN)
        mesh_put_le16(m + 6, (uint16_t)((vp->gen[slot] + 1) & 0x7fff));
    m[8] = r->super.f.op;
    m[9] = r->super.f.dtype;
    mesh_put_le32(m + 12, r->super.f.tag);
    mesh_put_le64(m + 16, r->super.f.seq);
    mesh_put_le64(m + 24, r->super.f.count);
    mesh_put_le64(m + 32, r->super.f.offset);
    mesh_put_le64(m + 40, r->super.f.length);
    mesh_put_le64(m + 48, (uintptr_t)r->buf);
    mesh_put_le32(m + 56, r->rkey);
    VERBS_CHECK_RC(rc, ibv_post_send(v->qp, &wr, &bad), out,
                   "verbs: posting a clear-to-send to rank %d", r->super.peer);
    v->ring[(v->ring_head + v->ring_n) % VERBS_SQ_DEPTH] =
        (struct sent){.kind = WR_CTS, .r = NULL};
    v->ring_n++;
    vp->slot[slot] = r;
    r->slot = slot;
out:
    return rc;
}

/* Give waiting receives of peer the free slots, in posting order. */
int verbs_grant_slots(struct mesh_transport *t, int peer)
{
    struct vpeer *vp = &t->vp[peer];

    for (int s = 0; s < VERBS_CREDITS && vp->rq_head; s++) {
        struct mesh_req *r;
        int rc;

        if (vp->slot[s])
            continue;
        r = vp->rq_head;
        verbs_q_remove(&vp->rq_head, &vp->rq_tail, r);
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
        uint64_t left = r->super.f.length - r->posted;
        uint32_t len = (uint32_t)MESH_MIN(left, (uint64_t)VERBS_PIECE);
        int last = r->posted + len == r->super.f.length;
        int dbg = atomic_fetch_and(&debug_flags, ~VERBS_DEBUG_BAD_RKEY);
        struct ibv_sge sge = {.addr = (uintptr_t)(r->buf + r->posted),
                              .length = len,
                              .lkey = r->lkey};
        struct ibv_send_wr wr =
                               {
                                   .wr_id = verbs_wr_id(WR_WRITE, peer, qpi, 0),
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
            verbs_q_remove(&v->sq_head, &v->sq_tail, r);
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
    const struct mesh_frame *e = &c->f, *f = &r->super.f;
    int overrun = atomic_load(&debug_flags) & VERBS_DEBUG_OVERRUN;
    int m = tp_frame_match(&t->super, r->super.peer, r->super.peer,
                           t->super.world.rank, e, c->reserved, f, !overrun,
                           "nothing was written");

    if (m <= 0)
        return m < 0 ? -1 : 0;
    if (overrun) {
        atomic_fetch_and(&debug_flags, ~VERBS_DEBUG_OVERRUN);
        r->raddr = c->addr + e->length; /* past the window: must be refused */
    } else {
        r->raddr = c->addr + (f->offset - e->offset);
    }
    c->reserved += f->length;
    r->rrkey = c->rkey;
    r->qpi = c->slot % t->nqp;
    if (t->nqp > 1 && (atomic_fetch_and(&debug_flags, ~VERBS_DEBUG_IMM_QP) &
                       VERBS_DEBUG_IMM_QP))
        r->qpi = (c->slot + 1) % t->nqp; /* not ordered with the slot's */
    r->imm = ((uint32_t)c->gen << 16) | c->slot;
    if (c->reserved >= e->length)
        r->imm |= VERBS_IMM_FINAL;
    return 1;
}

/* Match waiting sends of peer against its CTSs; start the matched ones. */
int verbs_match_sends(struct mesh_transport *t, int peer)
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
        verbs_q_remove(&vp->wq_head, &vp->wq_tail, r);
        if (c->reserved >= c->f.length) {
            /* all of it taken: the peer may grant the slot again */
            vp->grants.open[c->slot] = 0;
            if (pc)
                pc->next = c->next;
            else
                vp->cts_head = c->next;
            if (vp->cts_tail == c)
                vp->cts_tail = pc;
            free(c);
        }
        verbs_q_push(&vp->qp[r->qpi].sq_head, &vp->qp[r->qpi].sq_tail, r);
        rc = pump(t, peer, r->qpi);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- completions --------------------------------------------------------- */

static void got_cts(struct mesh_transport *t, int peer, int qpi,
                    const uint8_t *m, uint32_t len)
{
    struct vpeer *vp = &t->vp[peer];
    struct verbs_cts_hdr h;
    struct cts *c;
    char nb[300];
    int rc;

    /* every field checked before use, the slot's generation and whether
     * it is open against what this peer granted before */
    rc = verbs_cts_check(m, len, qpi, t->nqp, &vp->grants, peer,
                         verbs_pname(t, peer, nb, sizeof(nb)), &h);
    if (rc < 0) {
        tp_fail_job(&t->super, peer, rc, 1, "%s", mesh_err_msg(rc));
        return;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        tp_fail_job(&t->super, -1, -ENOMEM, 1,
                    "out of memory for a clear-to-send");
        return;
    }
    c->f = h.f;
    c->addr = h.addr;
    c->rkey = h.rkey;
    c->slot = h.slot;
    c->gen = h.gen;
    if (vp->cts_tail)
        vp->cts_tail->next = c;
    else
        vp->cts_head = c;
    vp->cts_tail = c;
    rc = verbs_match_sends(t, peer);
    if (rc < 0 && rc != -EPROTO)
        tp_fail_job(&t->super, -1, rc, 1, "%s", mesh_err_msg(rc));
}

static void got_imm(struct mesh_transport *t, int peer, int qpi, uint32_t imm,
                    uint32_t byte_len)
{
    struct vpeer *vp = &t->vp[peer];
    unsigned slot = VERBS_IMM_SLOT(imm);
    struct verbs_slot_view sv = {0};
    struct mesh_req *r;
    char nb[300];
    int rc;

    if (slot < VERBS_CREDITS && vp->slot[slot])
        sv = (struct verbs_slot_view){.open = 1,
                                      .gen = vp->gen[slot],
                                      .length = vp->slot[slot]->super.f.length};
    rc = verbs_imm_check(imm, qpi, t->nqp, byte_len, &sv, peer,
                         verbs_pname(t, peer, nb, sizeof(nb)));
    if (rc < 0) {
        tp_fail_job(&t->super, peer, rc, 1, "%s", mesh_err_msg(rc));
        return;
    }
    r = vp->slot[slot];
    vp->slot[slot] = NULL;
    r->slot = -1;
    tp_req_done(&t->super, &r->super);
    rc = verbs_grant_slots(t, peer);
    if (rc < 0)
        tp_fail_job(&t->super, peer, rc, 1, "%s", mesh_err_msg(rc));
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

    if (peer < 0 || peer >= t->super.world.size ||
        peer == t->super.world.rank || qpi >= t->nqp)
        return;
    v = &t->vp[peer].qp[qpi];
    if (kind != WR_RECV && v->ring_n > 0) {
        struct sent s = v->ring[v->ring_head];

        v->ring_head = (v->ring_head + 1) % VERBS_SQ_DEPTH;
        v->ring_n--;
        if (s.kind == WR_WRITE) {
            v->writes--;
            if (!t->super.fail.failed && s.r) {
                s.r->inflight--;
                if (wc->status == IBV_WC_SUCCESS && s.r->all_posted &&
                    !s.r->inflight)
                    tp_req_done(&t->super, &s.r->super);
            }
        }
    }
    if (t->super.fail.failed || t->stopping)
        return;
    if (wc->status != IBV_WC_SUCCESS) {
        if (t->vp[peer].bye)
            tp_fail_job(&t->super, peer, -ESHUTDOWN, 1,
                        "rank %d (%s) left the mesh with operations pending "
                        "(%s: %s)",
                        peer, verbs_pname(t, peer, nb, sizeof(nb)),
                        wr_kind_name(kind), ibv_wc_status_str(wc->status));
        else if (!t->wc_fail_ns) {
            t->wc_fail_ns = mesh_now_ns();
            t->wc_fail_peer = peer;
            t->wc_fail_code = wc_culprit_code(wc->status);
            snprintf(t->wc_fail_msg, sizeof(t->wc_fail_msg),
                     "rank %d (%s): verbs %s on QP %d failed: %s (status %d, "
                     "vendor error 0x%x)",
                     peer, verbs_pname(t, peer, nb, sizeof(nb)),
                     wr_kind_name(kind), qpi, ibv_wc_status_str(wc->status),
                     (int)wc->status, wc->vendor_err);
        }
        return;
    }
    if (kind == WR_RECV) {
        int rc;

        if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            got_imm(t, peer, qpi, ntohl(wc->imm_data), wc->byte_len);
        } else if (wc->opcode == IBV_WC_RECV) {
            got_cts(t, peer, qpi, verbs_rbuf(t, peer, qpi, idx), wc->byte_len);
        } else {
            tp_fail_job(&t->super, peer, -EPROTO, 1,
                        "rank %d (%s): unexpected receive completion opcode %d",
                        peer, verbs_pname(t, peer, nb, sizeof(nb)),
                        (int)wc->opcode);
            return;
        }
        if (t->super.fail.failed)
            return;
        rc = verbs_post_recv(t, peer, qpi, idx);
        if (rc < 0)
            tp_fail_job(&t->super, -1, rc, 1, "%s", mesh_err_msg(rc));
    } else if (kind == WR_WRITE) {
        int rc = pump(t, peer, qpi);

        if (rc < 0)
            tp_fail_job(&t->super, -1, rc, 1, "%s", mesh_err_msg(rc));
    }
}

/*
 * How long a goodbye waits for the peer's last completions. The goodbye
 * comes over TCP and the data over the RC QP: the two are not ordered, so
 * a write-with-immediate the peer finished before leaving may still sit
 * in our CQ (or in Soft-RoCE's queues) when its goodbye arrives.
 */
#define VERBS_BYE_GRACE_NS 2000000000ull

/*
 * A peer said goodbye: once the grace has passed, its pending operations
 * can no longer complete.
 */
static void bye_check(struct mesh_transport *t, int peer)
{
    struct vpeer *vp = &t->vp[peer];

    if (!vp->bye_ns)
        return;
    if (drain_cq(t) < 0 || t->super.fail.failed)
        return;
    if (tp_req_pending(&t->super, peer)) {
        if (mesh_now_ns() - vp->bye_ns < VERBS_BYE_GRACE_NS)
            return; /* look again at the next tick */
        vp->bye_ns = 0;
        tp_fail_left(&t->super, peer);
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
    struct tp_failure f;
    int rc = t->inner_ops->progress(t->inner);

    if (rc < 0) {
        tp_failure_of(t->inner, &f);
        /* A peer that blames us while our own completion failed: ours is
         * the first-hand account (a wrong key, a write past a window). */
        if (t->wc_fail_ns && !t->super.fail.failed &&
            f.culprit == t->super.world.rank)
            tp_fail_job(&t->super, t->wc_fail_peer, t->wc_fail_code, 0, "%s",
                        t->wc_fail_msg);
        else
            verbs_adopt_inner_failure(t, &f);
        return;
    }
    if (t->wc_fail_ns && !t->super.fail.failed &&
        mesh_now_ns() - t->wc_fail_ns >= VERBS_WC_GRACE_NS) {
        tp_fail_job(&t->super, t->wc_fail_peer, t->wc_fail_code, 1, "%s",
                    t->wc_fail_msg);
        return;
    }
    for (int p = 0; p < t->super.world.size; p++) {
        struct vpeer *vp = &t->vp[p];
        int done = 0;

        if (p == t->super.world.rank)
            continue;
        if (vp->bye_ns) {
            bye_check(t, p);
            if (t->super.fail.failed)
                return;
        }
        if (!vp->bye_req)
            continue;
        rc = t->inner_ops->test(t->inner, vp->bye_req, &done);
        if (rc < 0) {
            vp->bye_req = NULL;
            tp_failure_of(t->inner, &f);
            verbs_adopt_inner_failure(t, &f);
            return;
        }
        if (done) {
            vp->bye_req = NULL;
            vp->bye = 1;
            vp->bye_ns = mesh_now_ns();
            bye_check(t, p);
            if (t->super.fail.failed)
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
            tp_fail_job(&t->super, -1, -EIO, 1,
                        "verbs: ibv_poll_cq failed (%d)", n);
            return n;
        }
        if (!n)
            return total;
        for (int i = 0; i < n; i++)
            handle_wc(t, &wc[i]);
        total += n;
    }
}

void *verbs_progress_main(void *arg)
{
    struct mesh_transport *t = arg;
    uint64_t idle_since = mesh_now_ns(), last_tick = 0;

    pthread_mutex_lock(&t->super.lock);
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
            pthread_mutex_unlock(&t->super.lock);
            sched_yield();
            pthread_mutex_lock(&t->super.lock);
            continue;
        }
        /* Idle: arm the CQ, look once more, then sleep on the channel. */
        if (ibv_req_notify_cq(t->cq, 0)) {
            tp_fail_job(&t->super, -1, -EIO, 1,
                        "verbs: ibv_req_notify_cq failed");
            break;
        }
        if (drain_cq(t) > 0) {
            idle_since = mesh_now_ns();
            continue;
        }
        pthread_mutex_unlock(&t->super.lock);
        {
            struct pollfd pfd = {.fd = t->chan->fd, .events = POLLIN};
            int pr = poll(&pfd, 1, VERBS_TICK_MS);

            pthread_mutex_lock(&t->super.lock);
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
    pthread_mutex_unlock(&t->super.lock);
    return NULL;
}
