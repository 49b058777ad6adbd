/*
 * transport/verbs/requests.c: memory registration (a cache of ibv_reg_mr),
 * isend, irecv, test, wait_any and progress.
 */
#include "config.h"

#include "transport/verbs/verbs-internal.h"
#include "common/util.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- memory registration ------------------------------------------------- */

static struct mesh_mr *mr_find(struct mesh_transport *t, const void *buf,
                               size_t len)
{
    const char *b = buf;

    for (struct mesh_mr *m = t->mrs; m; m = m->next)
        if (b >= m->base && b + len <= m->base + m->len && b + len >= b)
            return m;
    return NULL;
}

int verbs_reg_mr(mesh_transport_t *t, void *buf, size_t len, mesh_mr_t **out)
{
    struct mesh_mr *m;
    int rc = 0;

    if (!buf || !len)
        return mesh_err(-EINVAL, "verbs reg_mr: empty range");
    pthread_mutex_lock(&t->super.lock);
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
    pthread_mutex_unlock(&t->super.lock);
    return rc;
}

int verbs_dereg_mr(mesh_transport_t *t, mesh_mr_t *mr)
{
    struct mesh_mr **pp;
    int rc = 0;

    if (!mr)
        return 0;
    pthread_mutex_lock(&t->super.lock);
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
free_mr:
    free(mr);
out:
    pthread_mutex_unlock(&t->super.lock);
    return rc;
}

/* ---- requests ------------------------------------------------------------ */

static int check_peer(struct mesh_transport *t, int peer, const char *what)
{
    int rc = tp_check_peer(&t->super, peer, what);

    if (rc < 0)
        return rc;
    if (!t->connected)
        return mesh_err(-ENOTCONN, "verbs %s: the mesh is not joined", what);
    if (t->vp[peer].bye) {
        tp_fail_left(&t->super, peer);
        return tp_fail_err(&t->super);
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

static struct mesh_req *req_new(struct mesh_transport *t, enum tp_req_kind kind,
                                int peer, const struct mesh_frame *f,
                                const void *buf)
{
    struct mesh_req *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    r->super.kind = kind;
    r->super.peer = peer;
    r->super.f = *f;
    r->buf = (char *)buf;
    r->slot = -1;
    tp_req_link(&t->super, &r->super);
    return r;
}

/*
 * isend and irecv (kind): a request for peer with the keys of its memory,
 * queued for a clear-to-send (send: matched against those already here) or
 * for a slot (receive: a CTS goes out when one is free).
 */
static int post(struct mesh_transport *t, enum tp_req_kind kind, int peer,
                const struct mesh_frame *f, const void *buf, mesh_mr_t *mr,
                mesh_req_t **out)
{
    const char *what = kind == TP_SEND ? "isend" : "irecv";
    struct vpeer *vp;
    struct mesh_req *r;
    int rc = tp_check_buf(&t->super, what, f, buf);

    if (rc < 0)
        return rc;
    pthread_mutex_lock(&t->super.lock);
    rc = check_peer(t, peer, what);
    if (rc < 0)
        goto out;
    r = req_new(t, kind, peer, f, buf);
    if (!r) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    rc = req_keys(t, r, mr, f->length);
    if (rc < 0) {
        verbs_req_free(t, r);
        goto out;
    }
    vp = &t->vp[peer];
    if (kind == TP_SEND) {
        verbs_q_push(&vp->wq_head, &vp->wq_tail, r);
        /* A desync fails the job here; the request stays linked and
         * test() reports the failure. */
        rc = verbs_match_sends(t, peer);
        if (rc < 0 && !t->super.fail.failed)
            tp_fail_job(&t->super, -1, rc, 1, "%s", mesh_err_msg(rc));
    } else {
        verbs_q_push(&vp->rq_head, &vp->rq_tail, r);
        rc = verbs_grant_slots(t, peer);
        if (rc < 0)
            tp_fail_job(&t->super, peer, rc, 1, "%s", mesh_err_msg(rc));
    }
    *out = r;
    rc = 0;
out:
    pthread_mutex_unlock(&t->super.lock);
    return rc;
}

int verbs_isend(mesh_transport_t *t, int peer, const struct mesh_frame *f,
                const void *buf, mesh_mr_t *mr, mesh_req_t **out)
{
    return post(t, TP_SEND, peer, f, buf, mr, out);
}

int verbs_irecv(mesh_transport_t *t, int peer, const struct mesh_frame *expect,
                void *buf, mesh_mr_t *mr, mesh_req_t **out)
{
    return post(t, TP_RECV, peer, expect, buf, mr, out);
}

/* Unhook a failed request from every queue (the job failed). */
static void req_detach(struct mesh_transport *t, struct mesh_req *r)
{
    struct vpeer *vp = &t->vp[r->super.peer];

    verbs_q_remove(&vp->rq_head, &vp->rq_tail, r);
    verbs_q_remove(&vp->wq_head, &vp->wq_tail, r);
    for (int q = 0; q < t->nqp; q++) {
        struct vqp *v = &vp->qp[q];

        verbs_q_remove(&v->sq_head, &v->sq_tail, r);
        for (int i = 0; i < v->ring_n; i++)
            if (v->ring[(v->ring_head + i) % VERBS_SQ_DEPTH].r == r)
                v->ring[(v->ring_head + i) % VERBS_SQ_DEPTH].r = NULL;
    }
    if (r->slot >= 0 && vp->slot[r->slot] == r)
        vp->slot[r->slot] = NULL;
}

void verbs_req_release(struct tp_base *b, struct tp_req *r, int failed)
{
    struct mesh_transport *t = (struct mesh_transport *)b; /* super first */

    if (failed)
        req_detach(t, (struct mesh_req *)r);
    verbs_req_free(t, (struct mesh_req *)r);
}

int verbs_test(mesh_transport_t *t, mesh_req_t *req, int *done)
{
    return tp_test(&t->super, req, done);
}

int verbs_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                   double timeout_s)
{
    uint64_t deadline = MESH_NO_DEADLINE;
    int rc;

    if (n <= 0 || !reqs)
        return mesh_err(-EINVAL, "verbs wait_any: no requests");
    /* A short spin saves the sleep/wake round trip on small messages. */
    {
        uint64_t spin_end = mesh_now_ns() + VERBS_WAIT_SPIN_NS;

        do {
            if (tp_any_done(reqs, n))
                return 0;
        } while (mesh_now_ns() < spin_end);
    }
    if (timeout_s >= 0)
        deadline = mesh_now_ns() + (uint64_t)(timeout_s * 1e9);
    pthread_mutex_lock(&t->super.lock);
    rc = tp_wait_sleep(&t->super, reqs, n, deadline, timeout_s);
    pthread_mutex_unlock(&t->super.lock);
    return rc;
}

int verbs_progress(mesh_transport_t *t)
{
    return tp_progress(&t->super);
}
