/*
 * transport/verbs/ops.c: the transport object: requests' list, failure, listen,
 * connect, abort, close, and the ops tables (verbs, auto).
 */
#include "config.h"

#include "transport/verbs/verbs-internal.h"
#include "common/util.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------- */

void verbs_req_free(struct mesh_transport *t, struct mesh_req *r)
{
    tp_req_unlink(&t->super, &r->super);
    if (r->tmp && !ibv_dereg_mr(r->tmp))
        t->mr_live--;
    free(r);
}

/* ---- failure ------------------------------------------------------------- */

/* The job failed (tp_fail_job has recorded it and woken the waiters): with
 * notify, the TCP mesh tells the peers. */
static void verbs_failed(struct tp_base *b, int culprit, int code, int notify,
                         const char *reason)
{
    struct mesh_transport *t = (struct mesh_transport *)b; /* super first */

    (void)code;
    if (notify && t->inner)
        t->inner_ops->abort(t->inner, culprit, reason);
}

static const struct tp_base_ops verbs_base_ops = {
    .failed = verbs_failed,
    .req_free = verbs_req_release,
};

void verbs_adopt_inner_failure(struct mesh_transport *t,
                               const struct tp_failure *f)
{
    tp_fail_job(&t->super, -1, f->code, 0, "%s", f->reason);
}

static void verbs_close(mesh_transport_t *t);

/* ---- the interface ------------------------------------------------------- */

static int vlisten(const struct mesh_world *world,
                   const struct mesh_transport_opts *opts, int is_auto,
                   mesh_transport_t **out)
{
    struct mesh_transport *t;
    int rc;

    t = calloc(1, sizeof(*t));
    if (!t)
        return mesh_err(-ENOMEM, "out of memory");
    t->inner_ops = &mesh_tcp_ops;
    t->is_auto = is_auto;
    t->use = &mesh_verbs_ops;
    t->gid_index = -1;
    t->nqp = MESH_MAX(1, MESH_MIN(opts->streams, VERBS_QP_MAX));
    rc = tp_base_init(&t->super, "verbs", &verbs_base_ops, world, opts);
    if (rc < 0) {
        tp_base_fini(&t->super);
        free(t);
        return rc;
    }

    rc = t->inner_ops->listen(world, opts, &t->inner);
    if (rc < 0)
        goto fail;
    rc = verbs_dev_open(t);
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

static int verbs_connect(mesh_transport_t *t)
{
    int n = t->super.world.size, rc, all = 1;
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
        rc = verbs_qps_create(t);
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
        if (p != t->super.world.rank)
            verbs_info_encode(t, p, out + (size_t)p * VERBS_INFO_LEN);
    rc = tp_ctrl_exchange(&t->super, t->inner_ops, t->inner, VERBS_CTRL_SEQ,
                          VERBS_TAG_INFO, out, VERBS_INFO_LEN, in,
                          VERBS_INFO_LEN);
    if (rc < 0)
        goto out;
    all = t->ctx != NULL;
    for (int p = 0; p < n; p++) {
        if (p == t->super.world.rank)
            continue;
        rc = verbs_info_decode(t, p, in + (size_t)p * VERBS_INFO_LEN, &rem[p]);
        if (rc < 0)
            goto out;
        all = all && rem[p].active;
    }
    if (!all) {
        char nb[300];
        int who = -1;

        for (int p = 0; p < n && who < 0; p++)
            if (p != t->super.world.rank && !rem[p].active)
                who = p;
        if (!t->is_auto) {
            rc = mesh_err(-ENODEV,
                          "verbs: rank %d (%s) has no usable RDMA port; "
                          "use --transport tcp or auto",
                          who, verbs_pname(t, who, nb, sizeof(nb)));
            goto out;
        }
        mesh_info("auto transport: TCP (%s has no usable RDMA port)",
                  who < 0 ? "this rank" : verbs_pname(t, who, nb, sizeof(nb)));
        verbs_dev_close(t);
        t->connected = 1;
        rc = 0;
        goto out;
    }
    for (int p = 0; p < n && rc == 0; p++)
        if (p != t->super.world.rank)
            rc = verbs_qps_connect(t, p, &rem[p]);
    if (rc < 0)
        goto out;
    /* Nobody sends until every QP that could receive it is ready. */
    rc = tp_ctrl_exchange(&t->super, t->inner_ops, t->inner, VERBS_CTRL_SEQ,
                          VERBS_TAG_READY, ready, 0, in, VERBS_INFO_LEN);
    if (rc < 0)
        goto out;
    for (int p = 0; p < n && rc == 0; p++) {
        struct mesh_frame f = {.seq = VERBS_CTRL_SEQ,
                               .tag = VERBS_TAG_BYE,
                               .op = MESH_OP_P2P,
                               .dtype = MESH_DT_BYTE};

        if (p != t->super.world.rank)
            rc = t->inner_ops->irecv(t->inner, p, &f, NULL, NULL,
                                     &t->vp[p].bye_req);
    }
    if (rc < 0)
        goto out;
    if (pthread_create(&t->thread, NULL, verbs_progress_main, t)) {
        rc = mesh_err(-EAGAIN, "verbs: cannot start the progress thread");
        goto out;
    }
    t->thread_started = 1;
    t->active = 1;
    t->connected = 1;
    mesh_info("verbs: %s port %u, %d QP(s) per peer, MTU %d, GID index %d",
              t->devname, t->port, t->nqp, verbs_mtu_bytes(t->pattr.active_mtu),
              t->gid_index);
out:
    free(out);
    free(in);
    free(rem);
    return rc;
}

/* The TCP mesh carries every failure's notice, the culprit with it. */
static int verbs_culprit(mesh_transport_t *t)
{
    return t && t->inner ? t->inner_ops->culprit(t->inner) : -1;
}

static void verbs_abort(mesh_transport_t *t, int culprit, const char *why)
{
    int rc;

    if (!t)
        return;
    t->inner_ops->abort(t->inner, culprit, why);
    pthread_mutex_lock(&t->super.lock);
    rc = t->inner_ops->progress(t->inner);
    if (rc < 0) {
        struct tp_failure f;

        tp_failure_of(t->inner, &f);
        verbs_adopt_inner_failure(t, &f);
    }
    pthread_mutex_unlock(&t->super.lock);
}

/* Every other peer's goodbye has arrived (under t->super.lock). */
static int all_said_bye(const struct mesh_transport *t)
{
    for (int p = 0; p < t->super.world.size; p++)
        if (p != t->super.world.rank && !t->vp[p].bye)
            return 0;
    return 1;
}

static void verbs_close(mesh_transport_t *t)
{
    struct tp_req *r, *rn;
    struct mesh_mr *m, *mn;

    if (!t)
        return;
    /* Tell the peers we leave normally, unless the job failed. */
    if (t->active && !t->super.fail.failed) {
        for (int p = 0; p < t->super.world.size; p++) {
            struct mesh_frame f = {.seq = VERBS_CTRL_SEQ,
                                   .tag = VERBS_TAG_BYE,
                                   .op = MESH_OP_P2P,
                                   .dtype = MESH_DT_BYTE};
            mesh_req_t *s;

            if (p != t->super.world.rank && !t->vp[p].bye &&
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
        uint64_t end =
            mesh_now_ns() + (uint64_t)(t->super.opts.peer_timeout_s * 1e9);

        pthread_mutex_lock(&t->super.lock);
        while (!t->super.fail.failed && mesh_now_ns() < end &&
               !all_said_bye(t)) {
            pthread_mutex_unlock(&t->super.lock);
            usleep(2000);
            pthread_mutex_lock(&t->super.lock);
        }
        pthread_mutex_unlock(&t->super.lock);
    }
    if (t->thread_started) {
        pthread_mutex_lock(&t->super.lock);
        t->stopping = 1;
        pthread_mutex_unlock(&t->super.lock);
        pthread_join(t->thread, NULL);
    }
    for (r = t->super.reqs; r; r = rn) {
        struct mesh_req *q = (struct mesh_req *)r; /* super first */

        rn = r->next;
        if (q->tmp && !ibv_dereg_mr(q->tmp))
            t->mr_live--;
        free(q);
    }
    for (int p = 0; t->vp && p < t->super.world.size; p++) {
        struct cts *c, *cn;

        for (c = t->vp[p].cts_head; c; c = cn) {
            cn = c->next;
            free(c);
        }
    }
    verbs_dev_close(t);
    for (m = t->mrs; m; m = mn) {
        mn = m->next;
        free(m);
    }
    if (t->ctrl)
        mesh_host_free(t->ctrl, t->ctrl_len);
    /* The TCP mesh last: its goodbye follows ours. */
    t->inner_ops->close(t->inner);
    free(t->vp);
    tp_base_fini(&t->super);
    free(t);
}

int mesh_verbs_mr_live(mesh_transport_t *t)
{
    int n;

    if (!t)
        return -1;
    pthread_mutex_lock(&t->super.lock);
    n = t->mr_live;
    pthread_mutex_unlock(&t->super.lock);
    return n;
}

int mesh_verbs_active(mesh_transport_t *t)
{
    /* t may be another transport's (shm's "auto" asks its inner one) */
    return t && !strcmp(t->super.name, "verbs") && t->active;
}

/* The TCP mesh's frames are checked there (on TCP, every data frame);
 * the RDMA writes' headers are not. */
static void verbs_seq_done(mesh_transport_t *t, uint64_t base, uint64_t low)
{
    if (t && t->inner && t->inner_ops->seq_done)
        t->inner_ops->seq_done(t->inner, base, low);
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
    .seq_done = verbs_seq_done,
};

/* ---- auto ---------------------------------------------------------------- */

/*
 * The verbs transport that, where some rank has no active port, moves
 * everything over its TCP mesh instead: what the "auto" transport
 * (transport/shm/ops.c) runs between hosts. Connect decides once, after
 * the INFO exchange, and sets t->use; every later operation goes through
 * it. On TCP the registrations stay in the verbs cache (plain entries
 * without an ibv_mr), and TCP needs none: no mr goes down.
 */
/* A failure of the TCP mesh seen by its own call (rc): the job's here
 * too, so that a transport over this one sees it (shm's "auto"). */
static int auto_tcp_adopt(mesh_transport_t *t, int rc)
{
    struct tp_failure f;

    if (rc >= 0 || rc == -ETIMEDOUT)
        return rc;
    tp_failure_of(t->inner, &f);
    if (f.failed) {
        pthread_mutex_lock(&t->super.lock);
        verbs_adopt_inner_failure(t, &f);
        pthread_mutex_unlock(&t->super.lock);
    }
    return rc;
}

static int auto_tcp_isend(mesh_transport_t *t, int peer,
                          const struct mesh_frame *f, const void *buf,
                          mesh_mr_t *mr, mesh_req_t **out)
{
    (void)mr;
    return t->inner_ops->isend(t->inner, peer, f, buf, NULL, out);
}

static int auto_tcp_irecv(mesh_transport_t *t, int peer,
                          const struct mesh_frame *expect, void *buf,
                          mesh_mr_t *mr, mesh_req_t **out)
{
    (void)mr;
    return t->inner_ops->irecv(t->inner, peer, expect, buf, NULL, out);
}

static int auto_tcp_test(mesh_transport_t *t, mesh_req_t *req, int *done)
{
    return auto_tcp_adopt(t, t->inner_ops->test(t->inner, req, done));
}

static int auto_tcp_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs,
                             int n, double timeout_s)
{
    return auto_tcp_adopt(t,
                          t->inner_ops->wait_any(t->inner, reqs, n, timeout_s));
}

static int auto_tcp_progress(mesh_transport_t *t)
{
    return auto_tcp_adopt(t, t->inner_ops->progress(t->inner));
}

/* What auto does on TCP: the data operations of its TCP mesh. */
static const struct mesh_transport_ops auto_on_tcp = {
    .name = "auto",
    .isend = auto_tcp_isend,
    .irecv = auto_tcp_irecv,
    .test = auto_tcp_test,
    .wait_any = auto_tcp_wait_any,
    .progress = auto_tcp_progress,
};

static int auto_listen(const struct mesh_world *world,
                       const struct mesh_transport_opts *opts,
                       mesh_transport_t **out)
{
    return vlisten(world, opts, 1, out);
}

static int auto_connect(mesh_transport_t *t)
{
    int rc = verbs_connect(t);

    if (rc == 0 && !t->active)
        t->use = &auto_on_tcp;
    return rc;
}

static int auto_isend(mesh_transport_t *t, int peer, const struct mesh_frame *f,
                      const void *buf, mesh_mr_t *mr, mesh_req_t **out)
{
    return t->use->isend(t, peer, f, buf, mr, out);
}

static int auto_irecv(mesh_transport_t *t, int peer,
                      const struct mesh_frame *expect, void *buf, mesh_mr_t *mr,
                      mesh_req_t **out)
{
    return t->use->irecv(t, peer, expect, buf, mr, out);
}

static int auto_test(mesh_transport_t *t, mesh_req_t *req, int *done)
{
    return t->use->test(t, req, done);
}

static int auto_wait_any(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                         double timeout_s)
{
    return t->use->wait_any(t, reqs, n, timeout_s);
}

static int auto_progress(mesh_transport_t *t)
{
    return t->use->progress(t);
}

const struct mesh_transport_ops mesh_verbs_auto_ops = {
    .name = "auto",
    .listen = auto_listen,
    .connect = auto_connect,
    .reg_mr = verbs_reg_mr,
    .dereg_mr = verbs_dereg_mr,
    .isend = auto_isend,
    .irecv = auto_irecv,
    .test = auto_test,
    .wait_any = auto_wait_any,
    .progress = auto_progress,
    .abort = verbs_abort,
    .culprit = verbs_culprit,
    .close = verbs_close,
    .seq_done = verbs_seq_done,
};
