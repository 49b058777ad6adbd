/*
 * collective/baselines.c: the parameter-server baseline, the one-hop direct
 * all-reduce and the dissemination barrier. The rules every builder follows
 * are coll-internal.h's.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A slot of count elements for each other rank's data. */
static size_t slot_per_peer(const struct coll_args *a)
{
    if (a->size < 2)
        return 0;
    return (size_t)(a->size - 1) * a->count * mesh_dtype_size(a->dtype);
}

/*
 * Room for steps x nk tags, and the arrays of a chunk that gathers: in, the
 * reduction's inputs (one per rank), and nops operation ids; what names
 * the schedule in the error.
 */
static int gather_arrays(const struct coll_args *a, size_t steps, size_t nk,
                         size_t nops, const void ***in, int **ops,
                         const char *what)
{
    int rc = tag_room(steps, nk);

    if (rc < 0)
        return rc;
    *in = malloc((size_t)a->size * sizeof(**in));
    *ops = malloc(nops * sizeof(**ops));
    if (!*in || !*ops) {
        free(*in);
        free(*ops);
        return mesh_err(-ENOMEM, "out of memory building a %s schedule", what);
    }
    return 0;
}

/* ---- parameter server (the seed's baseline) ------------------------------ */

size_t coll_ps_scratch(const struct coll_args *a)
{
    return a->rank == 0 ? slot_per_peer(a) : 0;
}

/* Rank 0 receives everyone's data, adds it in rank order, sends it back. */
int coll_build_ps_allreduce(struct sched *s, const struct coll_args *a,
                            void *scratch, mesh_mr_t *smr)
{
    int n = a->size;
    size_t es = mesh_dtype_size(a->dtype);
    size_t ce = chunk_elems(a, a->count), nk = nchunks(a->count, ce);
    float div = a->redop == MESH_REDOP_AVG ? (float)n : 1.0f;
    const void **in;
    int *rcv, rc;

    rc = gather_arrays(a, 2, nk, (size_t)n, &in, &rcv, "ps");
    if (rc < 0)
        return rc;
    for (size_t k = 0; k < nk; k++) {
        size_t o, l;

        clip(0, a->count, k, ce, &o, &l);
        if (a->rank == 0) {
            int red;

            in[0] = at(a->sendbuf, o, es);
            for (int p = 1; p < n; p++) {
                char *slot = at(scratch, (size_t)(p - 1) * a->count + o, es);

                in[p] = slot;
                rcv[p] = sched_recv(s, p, (uint32_t)(k * 2), o * es, slot,
                                    l * es, smr);
            }
            red = sched_reduce(s, at(a->recvbuf, o, es), in, n, l, div);
            for (int p = 1; p < n; p++) {
                sched_dep(s, rcv[p], red);
                sched_dep(s, red,
                          sched_send(s, p, (uint32_t)(k * 2 + 1), o * es,
                                     at(a->recvbuf, o, es), l * es,
                                     a->recv_mr));
            }
        } else {
            int up = sched_send(s, 0, (uint32_t)(k * 2), o * es,
                                at(a->sendbuf, o, es), l * es, a->send_mr);
            int down = sched_recv(s, 0, (uint32_t)(k * 2 + 1), o * es,
                                  at(a->recvbuf, o, es), l * es, a->recv_mr);

            if (a->sendbuf == a->recvbuf)
                sched_dep(s, up, down);
        }
    }
    free(rcv);
    free(in);
    return 0;
}

/* ---- direct: one hop ----------------------------------------------------- */

size_t coll_direct_scratch(const struct coll_args *a)
{
    return slot_per_peer(a);
}

/*
 * Every rank sends its data to every other and adds all N inputs in rank
 * order, (((x_0 + x_1) + x_2) + ...), in float32: every rank computes the
 * same bytes. One hop of latency, (N - 1) x the data on each rank's link.
 */
int coll_build_direct_allreduce(struct sched *s, const struct coll_args *a,
                                void *scratch, mesh_mr_t *smr)
{
    int n = a->size, r = a->rank;
    size_t es = mesh_dtype_size(a->dtype);
    size_t ce = chunk_elems(a, a->count), nk = nchunks(a->count, ce);
    float div = a->redop == MESH_REDOP_AVG ? (float)n : 1.0f;
    int inplace = a->sendbuf == a->recvbuf;
    const void **in;
    int *ops, rc;

    rc = gather_arrays(a, 1, nk, 2 * (size_t)n, &in, &ops, "direct");
    if (rc < 0)
        return rc;
    for (size_t k = 0; k < nk; k++) {
        size_t o, l;
        int nops = 0, red;

        clip(0, a->count, k, ce, &o, &l);
        for (int q = 0; q < n; q++) {
            char *slot;

            if (q == r) {
                in[q] = at(a->sendbuf, o, es);
                continue;
            }
            /* slot of rank q: scratch block q, or q - 1 above this rank */
            slot = at(scratch, (size_t)(q < r ? q : q - 1) * a->count + o, es);
            in[q] = slot;
            ops[nops++] =
                sched_recv(s, q, (uint32_t)k, o * es, slot, l * es, smr);
        }
        for (int d = 1; d < n; d++) { /* r + 1 first: spread the load */
            int q = (r + d) % n, snd;

            snd = sched_send(s, q, (uint32_t)k, o * es, at(a->sendbuf, o, es),
                             l * es, a->send_mr);
            if (inplace) /* the sum overwrites what is being sent */
                ops[nops++] = snd;
        }
        red = sched_reduce(s, at(a->recvbuf, o, es), in, n, l, div);
        for (int i = 0; i < nops; i++)
            sched_dep(s, ops[i], red);
    }
    free(ops);
    free(in);
    return 0;
}

double coll_direct_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    double n = c->size;

    /* one hop, but n - 1 sends and n - 1 receives at each rank */
    return coll_lat(c, MESH_ALGO_DIRECT, 1 + COLL_MSG_HOP * 2 * (n - 2)) +
           (n - 1) * bytes * m->beta_s_per_byte +
           (n - 1) * bytes * m->gamma_s_per_byte;
}

/* n (n - 1) whole messages, each added by its receiver. */
double coll_direct_work(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    double n = c->size;

    return n * (n - 1) *
           (m->alpha_s + bytes * m->beta_s_per_byte +
            bytes * m->gamma_s_per_byte);
}

/* ---- barrier ------------------------------------------------------------- */

/* Dissemination: in round j, send to r + 2^j and hear from r - 2^j. */
int coll_build_barrier(struct sched *s, int rank, int size)
{
    int prev = -1;
    uint32_t j = 0;

    for (int d = 1; d < size; d <<= 1, j++) {
        int snd = sched_send(s, (rank + d) % size, j, 0, NULL, 0, NULL);

        sched_dep(s, prev, snd);
        prev = sched_recv(s, mod(rank - d, size), j, 0, NULL, 0, NULL);
    }
    return 0;
}
