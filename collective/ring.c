/*
 * collective/ring.c: the ring schedules: all-reduce, reduce-scatter,
 * all-gather, and the chain broadcast (the ring's one-way path). The rules
 * every builder follows are coll-internal.h's.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

#include <math.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- ring ---------------------------------------------------------------- */

/*
 * Room for steps x nk tags, and prev[k]: the last operation of chunk k so
 * far (-1 at the start), which the next step's operation on chunk k
 * follows.
 */
static int chunk_chain(size_t steps, size_t nk, int **prev)
{
    int rc = tag_room(steps, nk);

    if (rc < 0)
        return rc;
    *prev = malloc(nk * sizeof(**prev));
    if (!*prev)
        return mesh_err(-ENOMEM, "out of memory building a ring");
    for (size_t k = 0; k < nk; k++)
        (*prev)[k] = -1;
    return 0;
}

size_t coll_ring_scratch(const struct coll_args *a)
{
    size_t es = mesh_dtype_size(a->dtype), n = (size_t)a->size, slots;

    if (a->size < 2)
        return 0;
    slots = n - 1 - (size_t)recv_apart(a);
    if (a->op == MESH_OP_REDUCE_SCATTER)
        return slots * a->count * es;
    return slots * ((a->count + n - 1) / n) * es;
}

/*
 * All-reduce: reduce-scatter, after which rank r holds the final value of
 * segment r + 1, then all-gather. Segment j is reduced in ring order:
 * ((x_j + x_j+1) + x_j+2) + ..., whoever runs it.
 *
 * A partial sum is only forwarded, so it is added in place into the scratch
 * slot its chunk was received into, while the kernel's copy has left that
 * slot in cache, and sent on from there: the receive buffer is written once
 * per element (by the last step or by the all-gather), where writing every
 * partial sum into it cost a cold read-for-ownership per step. Out of
 * place, the last step receives into the receive buffer itself and adds
 * the input there (recv_apart).
 *
 * Every send's order (mesh_frame.order) is its chunk: a chunk that has
 * just been reduced is forwarded ahead of later chunks' sends still queued
 * on the link, while it is in cache, instead of after the whole step. Safe
 * because chunk k's operations depend on chunk k's alone: a receive posted
 * late (in place, the all-gather's) waits only for chunk k's messages,
 * which nothing of a later chunk overtakes.
 */
int coll_build_ring_allreduce(struct sched *s, const struct coll_args *a,
                              void *scratch, mesh_mr_t *smr)
{
    int n = a->size, r = a->rank, left = mod(r - 1, n), right = mod(r + 1, n);
    size_t es = mesh_dtype_size(a->dtype);
    size_t maxseg = (a->count + (size_t)n - 1) / (size_t)n;
    size_t ce = chunk_elems(a, maxseg), nk = nchunks(maxseg, ce);
    int inplace = a->sendbuf == a->recvbuf, direct = recv_apart(a);
    float div = a->redop == MESH_REDOP_AVG ? (float)n : 1.0f;
    /* reader[st * nk + k]: the last op that reads this rank's input where
     * all-gather step st lands (segment r - st, chunk k) */
    int *prev, *reader, rc;

    rc = chunk_chain(2 * (size_t)n, nk, &prev);
    if (rc < 0)
        return rc;
    reader = malloc((size_t)(n - 1) * nk * sizeof(*reader));
    if (!reader) {
        free(prev);
        return mesh_err(-ENOMEM, "out of memory building a ring");
    }
    for (int st = 0; st < n - 1; st++) {
        size_t ss, sl, rs, rl;

        segment(a->count, n, mod(r - st, n), &ss, &sl);
        segment(a->count, n, mod(r - st - 1, n), &rs, &rl);
        for (size_t k = 0; k < nk; k++) {
            size_t o, l, roff, rlen;
            uint32_t tag = (uint32_t)((size_t)st * nk + k);
            char *slot;
            mesh_mr_t *slot_mr;
            const void *in[2];
            int snd, rcv, red, last;

            sched_set_order(s, (uint32_t)k);
            clip(ss, sl, k, ce, &o, &l);
            /* step st forwards what step st - 1 added into its slot */
            if (st == 0)
                snd = sched_send(s, right, tag, o * es, at(a->sendbuf, o, es),
                                 l * es, a->send_mr);
            else
                snd = sched_send(
                    s, right, tag, o * es,
                    at(scratch, (size_t)(st - 1) * maxseg + (o - ss), es),
                    l * es, smr);
            sched_dep(s, prev[k], snd);
            if (st == 0)
                reader[k] = snd;
            clip(rs, rl, k, ce, &roff, &rlen);
            last = st == n - 2;
            if (last && direct) {
                slot = at(a->recvbuf, roff, es);
                slot_mr = a->recv_mr;
            } else {
                slot = at(scratch, (size_t)st * maxseg + (roff - rs), es);
                slot_mr = smr;
            }
            rcv = sched_recv(s, left, tag, roff * es, slot, rlen * es, slot_mr);
            in[0] = slot;
            in[1] = at(a->sendbuf, roff, es);
            red = sched_reduce(s, last ? at(a->recvbuf, roff, es) : slot, in, 2,
                               rlen, last ? div : 1.0f);
            sched_dep(s, rcv, red);
            if (st < n - 2)
                reader[(size_t)(st + 1) * nk + k] = red;
            prev[k] = red;
        }
    }
    for (int st = 0; st < n - 1; st++) {
        size_t ss, sl, rs, rl;

        segment(a->count, n, mod(r + 1 - st, n), &ss, &sl);
        segment(a->count, n, mod(r - st, n), &rs, &rl);
        for (size_t k = 0; k < nk; k++) {
            size_t o, l;
            uint32_t tag = (uint32_t)((size_t)(n - 1 + st) * nk + k);
            int snd, rcv;

            sched_set_order(s, (uint32_t)k);
            clip(ss, sl, k, ce, &o, &l);
            snd = sched_send(s, right, tag, o * es, at(a->recvbuf, o, es),
                             l * es, a->recv_mr);
            sched_dep(s, prev[k], snd);
            /*
             * In place, step st lands where the reduce-scatter's first send
             * (st = 0) or its step st - 1's reduce read this rank's input.
             * Out of place nothing else touches it.
             */
            clip(rs, rl, k, ce, &o, &l);
            rcv = sched_recv(s, left, tag, o * es, at(a->recvbuf, o, es),
                             l * es, a->recv_mr);
            if (inplace)
                sched_dep(s, reader[(size_t)st * nk + k], rcv);
            prev[k] = rcv;
        }
    }
    free(reader);
    free(prev);
    return 0;
}

/*
 * Reduce-scatter: as the first half of the ring all-reduce, rotated so that
 * rank r ends with segment r; partial sums are added in place into the
 * scratch slots their chunks arrived in, and forwarded from there (the last
 * step's into the receive buffer, where it does not overlap the input).
 * Sends go chunk by chunk, as the all-reduce's (all receives are posted at
 * the start, so any order is safe).
 */
int coll_build_ring_reduce_scatter(struct sched *s, const struct coll_args *a,
                                   void *scratch, mesh_mr_t *smr)
{
    int n = a->size, r = a->rank, left = mod(r - 1, n), right = mod(r + 1, n);
    size_t es = mesh_dtype_size(a->dtype), cnt = a->count;
    size_t ce = chunk_elems(a, cnt), nk = nchunks(cnt, ce);
    float div = a->redop == MESH_REDOP_AVG ? (float)n : 1.0f;
    int *prev, rc, direct = recv_apart(a);

    rc = chunk_chain((size_t)n, nk, &prev);
    if (rc < 0)
        return rc;
    for (int st = 0; st < n - 1; st++) {
        size_t sseg = (size_t)mod(r - st - 1, n);
        size_t rseg = (size_t)mod(r - st - 2, n);
        int last = st == n - 2;

        for (size_t k = 0; k < nk; k++) {
            size_t o, l;
            uint32_t tag = (uint32_t)((size_t)st * nk + k);
            const void *in[2];
            char *slot;
            mesh_mr_t *slot_mr = smr;
            int snd, rcv, red;

            sched_set_order(s, (uint32_t)k);
            clip(0, cnt, k, ce, &o, &l);
            if (st == 0)
                snd = sched_send(s, right, tag, (sseg * cnt + o) * es,
                                 at(a->sendbuf, sseg * cnt + o, es), l * es,
                                 a->send_mr);
            else
                snd = sched_send(s, right, tag, (sseg * cnt + o) * es,
                                 at(scratch, (size_t)(st - 1) * cnt + o, es),
                                 l * es, smr);
            sched_dep(s, prev[k], snd);
            slot = at(scratch, (size_t)st * cnt + o, es);
            if (last && direct) {
                slot = at(a->recvbuf, o, es);
                slot_mr = a->recv_mr;
            }
            rcv = sched_recv(s, left, tag, (rseg * cnt + o) * es, slot, l * es,
                             slot_mr);
            in[0] = slot;
            in[1] = at(a->sendbuf, rseg * cnt + o, es);
            red = sched_reduce(s, last ? at(a->recvbuf, o, es) : slot, in, 2, l,
                               last ? div : 1.0f);
            sched_dep(s, rcv, red);
            prev[k] = red;
        }
    }
    free(prev);
    return 0;
}

/* All-gather: rank r's block travels n - 1 hops around the ring, chunk by
 * chunk as the all-reduce's (all receives are posted at the start). */
int coll_build_ring_allgather(struct sched *s, const struct coll_args *a)
{
    int n = a->size, r = a->rank, left = mod(r - 1, n), right = mod(r + 1, n);
    size_t es = mesh_dtype_size(a->dtype), cnt = a->count;
    size_t ce = chunk_elems(a, cnt), nk = nchunks(cnt, ce);
    char *mine = at(a->recvbuf, (size_t)r * cnt, es);
    int *prev, rc;

    rc = chunk_chain((size_t)n, nk, &prev);
    if (rc < 0)
        return rc;
    if (a->sendbuf != mine)
        sched_copy(s, mine, a->sendbuf, cnt * es);
    for (int st = 0; st < n - 1; st++) {
        size_t sseg = (size_t)mod(r - st, n), rseg = (size_t)mod(r - st - 1, n);

        for (size_t k = 0; k < nk; k++) {
            size_t o, l;
            uint32_t tag = (uint32_t)((size_t)st * nk + k);
            int snd, rcv;

            sched_set_order(s, (uint32_t)k);
            clip(0, cnt, k, ce, &o, &l);
            if (st == 0)
                snd = sched_send(s, right, tag, (sseg * cnt + o) * es,
                                 at(a->sendbuf, o, es), l * es, a->send_mr);
            else
                snd = sched_send(s, right, tag, (sseg * cnt + o) * es,
                                 at(a->recvbuf, sseg * cnt + o, es), l * es,
                                 a->recv_mr);
            sched_dep(s, prev[k], snd);
            rcv = sched_recv(s, left, tag, (rseg * cnt + o) * es,
                             at(a->recvbuf, rseg * cnt + o, es), l * es,
                             a->recv_mr);
            prev[k] = rcv;
        }
    }
    free(prev);
    return 0;
}

/* Broadcast down a chain root, root + 1, ..., root - 1, chunk by chunk. */
int coll_build_chain_broadcast(struct sched *s, const struct coll_args *a)
{
    int n = a->size, r = a->rank, v = mod(r - a->root, n);
    size_t es = mesh_dtype_size(a->dtype);
    size_t ce = chunk_elems(a, a->count), nk = nchunks(a->count, ce);
    int rc = tag_room(1, nk);

    if (rc < 0)
        return rc;
    if (v == 0 && a->sendbuf != a->recvbuf)
        sched_copy(s, a->recvbuf, a->sendbuf, a->count * es);
    for (size_t k = 0; k < nk; k++) {
        size_t o, l;
        int rcv = -1, snd;

        clip(0, a->count, k, ce, &o, &l);
        if (v > 0)
            rcv = sched_recv(s, mod(r - 1, n), (uint32_t)k, o * es,
                             at(a->recvbuf, o, es), l * es, a->recv_mr);
        if (v < n - 1) {
            snd = v == 0
                      ? sched_send(s, mod(r + 1, n), (uint32_t)k, o * es,
                                   at(a->sendbuf, o, es), l * es, a->send_mr)
                      : sched_send(s, mod(r + 1, n), (uint32_t)k, o * es,
                                   at(a->recvbuf, o, es), l * es, a->recv_mr);
            sched_dep(s, rcv, snd);
        }
    }
    return 0;
}

/* ---- cost ---------------------------------------------------------------- */

double coll_ring_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    double n = c->size, seg = bytes / n;

    return coll_lat(c, MESH_ALGO_RING, 2 * (n - 1)) +
           2 * (n - 1) * seg * m->beta_s_per_byte +
           (n - 1) * seg * m->gamma_s_per_byte;
}

/* 2 (n - 1) steps of n messages, each of a chunk (a slice of n, cut as
 * chunk_elems does), n - 1 of them added. */
double coll_ring_work(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    double n = c->size, seg = bytes / n;
    double nk = MESH_MAX(ceil(seg / coll_chunk_of(seg)), 1.0);

    return 2 * (n - 1) * n * nk * m->alpha_s +
           2 * (n - 1) * bytes * m->beta_s_per_byte +
           (n - 1) * bytes * m->gamma_s_per_byte;
}
