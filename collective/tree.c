/*
 * collective/tree.c: NCCL's double binary tree: its shape, the tree
 * all-reduce and the tree broadcast. The rules every builder follows are
 * coll-internal.h's.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

#include <math.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- trees --------------------------------------------------------------- */

/*
 * NCCL's binary tree over ranks 0..n-1 with root 0, built from the bits of
 * the rank: a rank whose lowest set bit is b has parent (r ^ b) | (b << 1)
 * (or r ^ b when that is out of range) and children r -/+ b/2 (the upper
 * one halved until it is in range). Leaves are the odd ranks.
 */
static void btree(int n, int r, int *up, int *d0, int *d1)
{
    int bit, low, u;

    for (bit = 1; bit < n; bit <<= 1)
        if (bit & r)
            break;
    if (r == 0) {
        *up = -1;
        *d0 = -1;
        *d1 = n > 1 ? bit >> 1 : -1;
        return;
    }
    u = (r ^ bit) | (bit << 1);
    if (u >= n)
        u = r ^ bit;
    *up = u;
    low = bit >> 1;
    *d0 = low ? r - low : -1;
    *d1 = -1;
    for (; low; low >>= 1)
        if (r + low < n) {
            *d1 = r + low;
            break;
        }
}

/*
 * Tree 1 is tree 0 mirrored (n even) or shifted by one (n odd), so that the
 * leaves of one tree are the inner nodes of the other.
 */
void coll_dtree(int n, int r, int tree, int *parent, int *child0, int *child1)
{
    int u, d0, d1;

    if (tree == 0) {
        btree(n, r, parent, child0, child1);
        return;
    }
    if (n % 2) {
        btree(n, mod(r - 1, n), &u, &d0, &d1);
        *parent = u < 0 ? -1 : (u + 1) % n;
        *child0 = d0 < 0 ? -1 : (d0 + 1) % n;
        *child1 = d1 < 0 ? -1 : (d1 + 1) % n;
    } else {
        btree(n, n - 1 - r, &u, &d0, &d1);
        *parent = u < 0 ? -1 : n - 1 - u;
        *child0 = d0 < 0 ? -1 : n - 1 - d0;
        *child1 = d1 < 0 ? -1 : n - 1 - d1;
    }
}

static size_t half_start(size_t count, int t)
{
    return t == 0 ? 0 : count / 2;
}

static size_t half_len(size_t count, int t)
{
    return t == 0 ? count / 2 : count - count / 2;
}

static int nchildren(int c0, int c1)
{
    return (c0 >= 0) + (c1 >= 0);
}

size_t coll_tree_scratch(const struct coll_args *a)
{
    size_t es = mesh_dtype_size(a->dtype), total = 0;

    if (a->size < 2)
        return 0;
    for (int t = 0; t < 2; t++) {
        int p, c0, c1, nc;

        coll_dtree(a->size, a->rank, t, &p, &c0, &c1);
        nc = nchildren(c0, c1);
        total += (size_t)nc * half_len(a->count, t) * es;
        if (nc && p >= 0)
            total += half_len(a->count, t) * es;
    }
    return total;
}

/* tag of chunk k of tree t, going up (0) or down (1) */
static uint32_t tree_tag(size_t k, int t, int down)
{
    return (uint32_t)((k * 2 + (size_t)t) * 2 + (size_t)down);
}

/*
 * Double binary tree all-reduce: the first half of the data is reduced up
 * tree 0 and broadcast down it, the second half likewise on tree 1, both
 * pipelined in chunks. A node adds ((own + child0) + child1).
 */
int coll_build_tree_allreduce(struct sched *s, const struct coll_args *a,
                              void *scratch, mesh_mr_t *smr)
{
    size_t es = mesh_dtype_size(a->dtype);
    float div = a->redop == MESH_REDOP_AVG ? (float)a->size : 1.0f;
    int inplace = a->sendbuf == a->recvbuf;
    char *next = scratch;

    for (int t = 0; t < 2; t++) {
        size_t hs = half_start(a->count, t), hn = half_len(a->count, t);
        size_t ce = chunk_elems(a, hn), nk = nchunks(hn, ce);
        int p, ch[2], nc, rc;
        char *slot[2] = {NULL, NULL}, *part = NULL;

        rc = tag_room(4, nk);
        if (rc < 0)
            return rc;
        coll_dtree(a->size, a->rank, t, &p, &ch[0], &ch[1]);
        if (ch[0] < 0) { /* keep the present child first */
            ch[0] = ch[1];
            ch[1] = -1;
        }
        nc = nchildren(ch[0], ch[1]);
        for (int i = 0; i < nc; i++) {
            slot[i] = next;
            next = at(next, hn, es);
        }
        if (nc && p >= 0) {
            part = next;
            next = at(next, hn, es);
        }
        for (size_t k = 0; k < nk; k++) {
            size_t o, l;
            const void *in[3];
            int red = -1, up = -1, down = -1, rcv[2] = {-1, -1};

            clip(hs, hn, k, ce, &o, &l);
            if (nc == 0) { /* a leaf: own data up, the result down */
                up = sched_send(s, p, tree_tag(k, t, 0), o * es,
                                at(a->sendbuf, o, es), l * es, a->send_mr);
                down = sched_recv(s, p, tree_tag(k, t, 1), o * es,
                                  at(a->recvbuf, o, es), l * es, a->recv_mr);
                if (inplace)
                    sched_dep(s, up, down);
                continue;
            }
            in[0] = at(a->sendbuf, o, es);
            for (int i = 0; i < nc; i++) {
                in[1 + i] = at(slot[i], o - hs, es);
                rcv[i] = sched_recv(s, ch[i], tree_tag(k, t, 0), o * es,
                                    at(slot[i], o - hs, es), l * es, smr);
            }
            if (p < 0) {
                red =
                    sched_reduce(s, at(a->recvbuf, o, es), in, 1 + nc, l, div);
            } else {
                red =
                    sched_reduce(s, at(part, o - hs, es), in, 1 + nc, l, 1.0f);
                up = sched_send(s, p, tree_tag(k, t, 0), o * es,
                                at(part, o - hs, es), l * es, smr);
                sched_dep(s, red, up);
                down = sched_recv(s, p, tree_tag(k, t, 1), o * es,
                                  at(a->recvbuf, o, es), l * es, a->recv_mr);
                if (inplace) /* the reduction reads what lands there */
                    sched_dep(s, red, down);
            }
            for (int i = 0; i < nc; i++) {
                int snd;

                sched_dep(s, rcv[i], red);
                snd = sched_send(s, ch[i], tree_tag(k, t, 1), o * es,
                                 at(a->recvbuf, o, es), l * es, a->recv_mr);
                sched_dep(s, p < 0 ? red : down, snd);
            }
        }
    }
    return 0;
}

/* Broadcast down tree 0 over ranks renumbered so that root is 0. */
int coll_build_tree_broadcast(struct sched *s, const struct coll_args *a)
{
    int n = a->size, v = mod(a->rank - a->root, n), p, ch[2];
    size_t es = mesh_dtype_size(a->dtype);
    size_t ce = chunk_elems(a, a->count), nk = nchunks(a->count, ce);
    int rc = tag_room(1, nk);

    if (rc < 0)
        return rc;
    coll_dtree(n, v, 0, &p, &ch[0], &ch[1]);
    if (p >= 0)
        p = (p + a->root) % n;
    for (int i = 0; i < 2; i++)
        if (ch[i] >= 0)
            ch[i] = (ch[i] + a->root) % n;
    if (v == 0 && a->sendbuf != a->recvbuf)
        sched_copy(s, a->recvbuf, a->sendbuf, a->count * es);
    for (size_t k = 0; k < nk; k++) {
        size_t o, l;
        int rcv = -1;

        clip(0, a->count, k, ce, &o, &l);
        if (p >= 0)
            rcv = sched_recv(s, p, (uint32_t)k, o * es, at(a->recvbuf, o, es),
                             l * es, a->recv_mr);
        for (int i = 0; i < 2; i++) {
            int snd;

            if (ch[i] < 0)
                continue;
            snd = v == 0
                      ? sched_send(s, ch[i], (uint32_t)k, o * es,
                                   at(a->sendbuf, o, es), l * es, a->send_mr)
                      : sched_send(s, ch[i], (uint32_t)k, o * es,
                                   at(a->recvbuf, o, es), l * es, a->recv_mr);
            sched_dep(s, rcv, snd);
        }
    }
    return 0;
}

/* ---- cost ---------------------------------------------------------------- */

void coll_tree_shape(int n, int *depth_out, double *load_out)
{
    int depth = 0;
    double load = 0;

    for (int t = 0; t < 2; t++)
        for (int r = 0; r < n; r++) {
            int d = 0, x = r, p, c0, c1;

            for (coll_dtree(n, x, t, &p, &c0, &c1); p >= 0 && d <= n;
                 coll_dtree(n, x, t, &p, &c0, &c1)) {
                x = p;
                d++;
            }
            depth = MESH_MAX(depth, d);
        }
    for (int r = 0; r < n; r++) {
        double sent = 0;

        for (int t = 0; t < 2; t++) {
            int p, c0, c1;

            coll_dtree(n, r, t, &p, &c0, &c1);
            sent += 0.5 * ((p >= 0) + (c0 >= 0) + (c1 >= 0));
        }
        load = MESH_MAX(load, sent);
    }
    *depth_out = depth;
    *load_out = load;
}

double coll_tree_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    double half = bytes / 2;

    return coll_lat(c, MESH_ALGO_TREE, 2 * c->tree_depth) +
           c->tree_load * bytes * m->beta_s_per_byte +
           bytes * m->gamma_s_per_byte +
           2 * c->tree_depth * MESH_MIN(coll_chunk_of(half), half) *
               m->beta_s_per_byte;
}

/* Each tree carries half the message up (reduce: n - 1 messages, each
 * added) and down (n - 1), chunk by chunk. */
double coll_tree_work(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    double n = c->size, half = bytes / 2;
    double nk = MESH_MAX(ceil(half / coll_chunk_of(half)), 1.0);

    return 4 * (n - 1) * nk * m->alpha_s +
           2 * (n - 1) * bytes * m->beta_s_per_byte +
           (n - 1) * bytes * m->gamma_s_per_byte;
}
