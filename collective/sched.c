/*
 * collective/sched.c: schedules and their executor.
 *
 * Every algorithm compiles a collective into a schedule: sends, receives,
 * reductions and copies with "before" edges between them. The executor posts
 * every operation whose predecessors are done (receives first, in the order
 * they were added, so the streams keep flowing), runs reductions as soon as
 * their inputs have arrived, and waits on the transport otherwise. Chunked
 * algorithms therefore pipeline by construction: chunk k is being reduced
 * while chunk k + 1 is on the wire. Every message of one collective has its
 * own (seq, tag) on its link.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sched_init(struct sched *s, uint64_t seq, int op, int dtype,
                uint64_t count)
{
    *s = (struct sched){
        .seq = seq, .op = op, .dtype = dtype, .count = count, .gate = -1};
}

void sched_free(struct sched *s)
{
    free(s->ops);
    free(s->edges);
    free(s->srcs);
    memset(s, 0, sizeof(*s));
}

static int add_op(struct sched *s, int kind)
{
    struct sched_op *o;

    if (s->failed || mesh_array_reserve(&s->ops, &s->cap, (size_t)s->nops + 1,
                                        sizeof(*s->ops), "schedule ops") < 0) {
        s->failed = 1;
        return -1;
    }
    o = &s->ops[s->nops];
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->first_succ = -1;
    o->div = 1.0f;
    s->nops++;
    if (s->gate >= 0)
        sched_dep(s, s->gate, s->nops - 1);
    return s->nops - 1;
}

int sched_send(struct sched *s, int peer, uint32_t tag, uint64_t offset,
               const void *buf, size_t len, mesh_mr_t *mr)
{
    int i = add_op(s, SCHED_SEND);

    if (i < 0)
        return -1;
    s->ops[i].peer = s->peer_map ? s->peer_map[peer] : peer;
    s->ops[i].tag = tag + s->tag_base;
    s->ops[i].order = s->order;
    s->ops[i].offset = offset;
    s->ops[i].buf = (void *)buf;
    s->ops[i].len = len;
    s->ops[i].mr = mr;
    return i;
}

int sched_recv(struct sched *s, int peer, uint32_t tag, uint64_t offset,
               void *buf, size_t len, mesh_mr_t *mr)
{
    int i = add_op(s, SCHED_RECV);

    if (i < 0)
        return -1;
    s->ops[i].peer = s->peer_map ? s->peer_map[peer] : peer;
    s->ops[i].tag = tag + s->tag_base;
    s->ops[i].offset = offset;
    s->ops[i].buf = buf;
    s->ops[i].len = len;
    s->ops[i].mr = mr;
    return i;
}

/* Source pointers live in one array (ops hold an index into it until the
 * schedule runs, since the array may move while building). */
static int add_srcs(struct sched *s, int i, const void *const *src, int n)
{
    if (mesh_array_reserve(&s->srcs, &s->scap, (size_t)s->nsrcs + n,
                           sizeof(*s->srcs), "schedule sources") < 0) {
        s->failed = 1;
        return -1;
    }
    memcpy(&s->srcs[s->nsrcs], src, (size_t)n * sizeof(*src));
    s->ops[i].src = (const void **)(intptr_t)s->nsrcs;
    s->ops[i].nsrc = n;
    s->nsrcs += n;
    return 0;
}

int sched_reduce(struct sched *s, void *dst, const void *const *src, int nsrc,
                 size_t n, float div)
{
    int i = add_op(s, SCHED_REDUCE);

    if (i < 0 || nsrc < 1 || add_srcs(s, i, src, nsrc) < 0) {
        s->failed = 1;
        return -1;
    }
    s->ops[i].buf = dst;
    s->ops[i].n = n;
    s->ops[i].div = div;
    return i;
}

int sched_copy(struct sched *s, void *dst, const void *src, size_t len)
{
    int i = add_op(s, SCHED_COPY);

    if (i < 0 || add_srcs(s, i, &src, 1) < 0)
        return -1;
    s->ops[i].buf = dst;
    s->ops[i].len = len;
    return i;
}

int sched_copy_stream(struct sched *s, void *dst, const void *src, size_t len)
{
    int i = sched_copy(s, dst, src, len);

    if (i >= 0)
        s->ops[i].stream = 1;
    return i;
}

int sched_sync(struct sched *s, uint32_t tag)
{
    int i = add_op(s, SCHED_SYNC);

    if (i < 0)
        return -1;
    s->ops[i].tag = tag + s->tag_base;
    return i;
}

void sched_dep(struct sched *s, int before, int after)
{
    struct sched_edge *e;

    if (before < 0 || after < 0 || s->failed)
        return;
    if (mesh_array_reserve(&s->edges, &s->ecap, (size_t)s->nedges + 1,
                           sizeof(*s->edges), "schedule edges") < 0) {
        s->failed = 1;
        return;
    }
    e = &s->edges[s->nedges];
    e->to = after;
    e->next = s->ops[before].first_succ;
    s->ops[before].first_succ = s->nedges++;
    s->ops[after].ndeps++;
}

void sched_set_order(struct sched *s, uint32_t order)
{
    s->order = order;
}

/* ---- the executor -------------------------------------------------------- */

struct run {
    struct sched *s;
    int *queue; /* ready ops, FIFO; each op enters once */
    int qhead, qtail;
    int *inflight; /* SEND/RECV ops with a request */
    mesh_req_t **reqs;
    int ninflight;
    int done;
};

static void complete(struct run *r, int i)
{
    struct sched *s = r->s;

    s->ops[i].state = 2;
    r->done++;
    for (int e = s->ops[i].first_succ; e >= 0; e = s->edges[e].next) {
        int to = s->edges[e].to;

        if (--s->ops[to].ndeps == 0)
            r->queue[r->qtail++] = to;
    }
}

static int start(struct run *r, int i, const struct mesh_transport_ops *ops,
                 mesh_transport_t *t)
{
    struct sched *s = r->s;
    struct sched_op *o = &s->ops[i];
    struct mesh_frame f = {
        .seq = s->seq,
        .tag = o->tag,
        .op = (uint8_t)s->op,
        .dtype = (uint8_t)s->dtype,
        .count = s->count,
        /*
         * Each message is alone on its (seq, tag), so it is matched at
         * offset 0: a frame from a rank that laid the data out differently
         * (another count or dtype) then always meets the posted receive and
         * fails the count/dtype check or the range check, where a real
         * offset outside the expected range would wait forever. The
         * chunk's position is in the tag.
         */
        .offset = o->kind == SCHED_SYNC ? o->offset : 0,
        .length = o->len,
        .order = o->order,
    };
    static char empty; /* a valid address for zero-length messages */
    void *buf = o->buf ? o->buf : &empty;
    char sq[48];
    int rc;

    if (o->kind <= SCHED_RECV && mesh_log_enabled(MESH_LOG_DEBUG))
        mesh_debug("%s (%s) tag %u: %s %zu bytes at offset %llu %s "
                   "rank %d",
                   mesh_op_name(s->op), mesh_seq_str(s->seq, sq, sizeof(sq)),
                   o->tag, o->kind == SCHED_SEND ? "send" : "receive", o->len,
                   (unsigned long long)o->offset,
                   o->kind == SCHED_SEND ? "to" : "from", o->peer);
    switch (o->kind) {
    case SCHED_SEND:
        rc = ops->isend(t, o->peer, &f, buf, o->mr, &o->req);
        break;
    case SCHED_RECV:
        rc = ops->irecv(t, o->peer, &f, buf, o->mr, &o->req);
        break;
    case SCHED_SYNC:
        rc = ops->host_sync
                 ? ops->host_sync(t, &f, &o->req)
                 : mesh_err(-ENOTSUP, "%s: the transport has no host sync",
                            mesh_op_name(s->op));
        break;
    case SCHED_REDUCE:
        mesh_reduce_sum(s->dtype, o->buf, o->src, o->nsrc, o->n, o->div);
        complete(r, i);
        return 0;
    default:
        if (o->len && o->stream)
            mesh_copy_stream(o->buf, o->src[0], o->len);
        else if (o->len && o->buf != o->src[0])
            memmove(o->buf, o->src[0], o->len);
        complete(r, i);
        return 0;
    }
    if (rc < 0)
        return rc;
    o->state = 1;
    r->inflight[r->ninflight] = i;
    r->reqs[r->ninflight] = o->req;
    r->ninflight++;
    return 0;
}

/* Test every request in flight; complete those that are done. */
static int reap(struct run *r, const struct mesh_transport_ops *ops,
                mesh_transport_t *t)
{
    int k = 0, rc = 0;

    for (int j = 0; j < r->ninflight; j++) {
        int i = r->inflight[j], d = 0, trc;

        if (rc < 0) { /* keep the rest for the failure path */
            r->inflight[k] = i;
            r->reqs[k++] = r->reqs[j];
            continue;
        }
        trc = ops->test(t, r->reqs[j], &d);
        if (trc < 0) {
            r->s->ops[i].req = NULL; /* test freed it */
            rc = trc;
            continue;
        }
        if (d) {
            r->s->ops[i].req = NULL;
            complete(r, i);
        } else {
            r->inflight[k] = i;
            r->reqs[k++] = r->reqs[j];
        }
    }
    r->ninflight = k;
    return rc;
}

/* After a failure: abort the job so that every request fails, and free
 * them all, so that no transport write lands in the caller's buffers later. */
static void drain(struct run *r, const struct mesh_transport_ops *ops,
                  mesh_transport_t *t, const char *why)
{
    ops->abort(t, -1, why);
    for (int tries = 0; r->ninflight > 0 && tries < 600; tries++) {
        int k = 0;

        for (int j = 0; j < r->ninflight; j++) {
            int d = 0;

            if (ops->test(t, r->reqs[j], &d) < 0 || d)
                continue;
            r->reqs[k++] = r->reqs[j];
        }
        r->ninflight = k;
        if (k)
            ops->wait_any(t, r->reqs, k, 0.1);
    }
    if (r->ninflight)
        mesh_warn("%d transport requests did not end after the abort",
                  r->ninflight);
}

/*
 * Tell the transport every receive s will post (its expect), so that a
 * peer's frame that none of them takes fails the job at once instead of
 * waiting for ever. Only a schedule with messages: one that only syncs
 * (coll_host_words) runs before its collective's own, of the same seq and
 * op, whose receives it would hide.
 */
static int expect(const struct sched *s, const struct mesh_transport_ops *ops,
                  mesh_transport_t *t)
{
    struct mesh_frame f = {.seq = s->seq,
                           .op = (uint8_t)s->op,
                           .dtype = (uint8_t)s->dtype,
                           .count = s->count};
    struct mesh_expect *e;
    size_t n = 0, msgs = 0;

    if (!ops->expect)
        return 0;
    for (int i = 0; i < s->nops; i++) {
        n += s->ops[i].kind == SCHED_RECV;
        msgs += s->ops[i].kind <= SCHED_RECV;
    }
    if (!msgs)
        return 0;
    e = malloc(MESH_MAX(n, 1) * sizeof(*e));
    if (!e)
        return mesh_err(-ENOMEM, "out of memory running a %s schedule",
                        mesh_op_name(s->op));
    n = 0;
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == SCHED_RECV) /* at offset 0, as start() posts */
            e[n++] = (struct mesh_expect){.peer = s->ops[i].peer,
                                          .tag = s->ops[i].tag,
                                          .offset = 0,
                                          .length = s->ops[i].len};
    ops->expect(t, &f, e, n);
    free(e);
    return 0;
}

int sched_run(struct sched *s, const struct mesh_transport_ops *ops,
              mesh_transport_t *t)
{
    struct run r = {.s = s};
    char msg[1024];
    int rc = 0;
    if (s->failed)
        return mesh_err(-ENOMEM, "out of memory building a %s schedule",
                        mesh_op_name(s->op));
    if (s->nops == 0)
        return 0;
    /* Resolve source indices into pointers now that srcs no longer moves. */
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == SCHED_REDUCE || s->ops[i].kind == SCHED_COPY)
            s->ops[i].src = &s->srcs[(intptr_t)s->ops[i].src];
    /* The executor comes back to wait_any until all is done: the
     * transport may leave the data streams' I/O to this thread. */
    if (ops->hold)
        ops->hold(t, 1);
    r.queue = malloc((size_t)s->nops * sizeof(*r.queue));
    r.inflight = malloc((size_t)s->nops * sizeof(*r.inflight));
    r.reqs = malloc((size_t)s->nops * sizeof(*r.reqs));
    if (!r.queue || !r.inflight || !r.reqs) {
        rc = mesh_err(-ENOMEM, "out of memory running a %s schedule",
                      mesh_op_name(s->op));
        goto free_arrays;
    }
    rc = expect(s, ops, t);
    if (rc < 0)
        goto free_arrays;
    /* Receives first: posted early, they let the peers' data flow in. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < s->nops; i++)
            if (s->ops[i].ndeps == 0 &&
                (s->ops[i].kind == SCHED_RECV) == (pass == 0))
                r.queue[r.qtail++] = i;
    while (r.done < s->nops) {
        while (r.qhead < r.qtail) {
            rc = start(&r, r.queue[r.qhead++], ops, t);
            if (rc < 0)
                goto fail;
        }
        if (r.done == s->nops)
            break;
        if (r.ninflight == 0) {
            rc = mesh_err(-EDEADLK,
                          "%s schedule stuck with %d of %d "
                          "operations done",
                          mesh_op_name(s->op), r.done, s->nops);
            goto fail;
        }
        rc = ops->wait_any(t, r.reqs, r.ninflight, 1.0);
        if (rc < 0 && rc != -ETIMEDOUT)
            goto fail;
        rc = reap(&r, ops, t);
        if (rc < 0)
            goto fail;
    }
    goto free_arrays;

fail:
    snprintf(msg, sizeof(msg), "%s", mesh_err_msg(rc));
    drain(&r, ops, t, msg);
    mesh_err_clear();
    rc = mesh_err(rc, "%s", msg);
free_arrays:
    if (ops->hold)
        ops->hold(t, 0);
    free(r.reqs);
    free(r.inflight);
    free(r.queue);
    return rc;
}
