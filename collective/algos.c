/*
 * collective/algos.c: ring, double binary tree, parameter-server, direct,
 * recursive doubling, chain and barrier schedules.
 *
 * Each builder turns one collective into sends, receives and reductions
 * (collective/sched.c runs them). Data is cut into chunks so that the steps
 * pipeline; every (step, chunk) message gets its own tag, so a link never
 * carries two messages with the same (seq, tag). Every step sends a message
 * even when its slice is empty (count 0, or fewer elements than ranks): the
 * receivers then always see one frame per step, and a rank that disagrees
 * about the size gets a desync error from the transport instead of waiting.
 *
 * Buffer hazards: where a receive lands in memory that an earlier send of
 * the same collective reads, the receive is posted only after that send
 * completed (the data dependency alone would make it safe in practice, the
 * transport's contract asks for the buffer to stay untouched).
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_MIN  (512u << 10)
#define CHUNK_MAX  (4u << 20)
#define CHUNKS_MAX 4096 /* per slice, whatever chunk size was asked for */

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static char *at(const void *base, size_t elems, size_t es)
{
    return base ? (char *)base + elems * es : NULL;
}

/* Elements per chunk for a slice of n elements. */
static size_t chunk_elems(const struct coll_args *a, size_t n)
{
    size_t es = mesh_dtype_size(a->dtype);
    size_t bytes = a->chunk_bytes;

    size_t ce;

    if (!bytes) {
        bytes = n * es / 8;
        bytes = MESH_MAX(bytes, CHUNK_MIN);
        bytes = MESH_MIN(bytes, CHUNK_MAX);
    }
    ce = MESH_MAX(bytes / es, 1);
    /* a tiny --chunk on a big message: bound the schedule's size */
    if (n / ce >= CHUNKS_MAX)
        ce = (n + CHUNKS_MAX - 1) / CHUNKS_MAX;
    return ce;
}

/* Chunks covering n elements (at least one: empty messages still flow). */
static size_t nchunks(size_t n, size_t ce)
{
    return n ? (n + ce - 1) / ce : 1;
}

/* Clip chunk k of a slice [start, start + len) to [*o, *o + *l). */
static void clip(size_t start, size_t len, size_t k, size_t ce, size_t *o,
                 size_t *l)
{
    size_t off = MESH_MIN(k * ce, len);

    *o = start + off;
    *l = MESH_MIN(ce, len - off);
}

/* Balanced ring segment j of count over n ranks. */
static void segment(size_t count, int n, int j, size_t *start, size_t *len)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;

    *start = (size_t)j * base + MESH_MIN((size_t)j, rem);
    *len = base + ((size_t)j < rem);
}

static int tag_room(size_t steps, size_t k)
{
    if (k && steps > (size_t)UINT32_MAX / k)
        return mesh_err(-E2BIG,
                        "too many chunks (%zu x %zu): raise the "
                        "chunk size",
                        steps, k);
    return 0;
}

/* ---- ring ---------------------------------------------------------------- */

/*
 * Whether the receive buffer lies apart from the send buffer. A step whose
 * reduction is final (the ring's last reduce-scatter step, the first
 * halving round of rhd) may then receive straight into the receive buffer
 * and add the input there: the kernel's copy writes the destination once
 * and the reduction adds into it while it is in cache, where a scratch
 * slot cost a second cold stream of writes (and, with two ranks, all of
 * the ring's scratch). In place, the input is still to be read there.
 */
static int recv_apart(const struct coll_args *a)
{
    size_t es = mesh_dtype_size(a->dtype), n = (size_t)a->size;
    size_t sbytes = a->count * es, rbytes = a->count * es;
    const char *sb = a->sendbuf, *rb = a->recvbuf;

    if (a->op == MESH_OP_REDUCE_SCATTER)
        sbytes *= n;
    return !sb || !rb || rb + rbytes <= sb || sb + sbytes <= rb;
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

    rc = tag_room(2 * (size_t)n, nk);
    if (rc < 0)
        return rc;
    prev = malloc(nk * sizeof(*prev));
    reader = malloc((size_t)(n - 1) * nk * sizeof(*reader));
    if (!prev || !reader) {
        free(prev);
        free(reader);
        return mesh_err(-ENOMEM, "out of memory building a ring");
    }
    for (size_t k = 0; k < nk; k++)
        prev[k] = -1;
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
            red = sched_reduce(s, last ? at(a->recvbuf, roff, es) : slot, in,
                               2, rlen, last ? div : 1.0f);
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

    rc = tag_room((size_t)n, nk);
    if (rc < 0)
        return rc;
    prev = malloc(nk * sizeof(*prev));
    if (!prev)
        return mesh_err(-ENOMEM, "out of memory building a ring");
    for (size_t k = 0; k < nk; k++)
        prev[k] = -1;
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
            red = sched_reduce(s, last ? at(a->recvbuf, o, es) : slot, in, 2,
                               l, last ? div : 1.0f);
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

    rc = tag_room((size_t)n, nk);
    if (rc < 0)
        return rc;
    prev = malloc(nk * sizeof(*prev));
    if (!prev)
        return mesh_err(-ENOMEM, "out of memory building a ring");
    for (size_t k = 0; k < nk; k++)
        prev[k] = -1;
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

/* ---- parameter server (the seed's baseline) ------------------------------ */

size_t coll_ps_scratch(const struct coll_args *a)
{
    if (a->rank != 0 || a->size < 2)
        return 0;
    return (size_t)(a->size - 1) * a->count * mesh_dtype_size(a->dtype);
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

    rc = tag_room(2, nk);
    if (rc < 0)
        return rc;
    in = malloc((size_t)n * sizeof(*in));
    rcv = malloc((size_t)n * sizeof(*rcv));
    if (!in || !rcv) {
        free(in);
        free(rcv);
        return mesh_err(-ENOMEM, "out of memory building a ps schedule");
    }
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
    if (a->size < 2)
        return 0;
    return (size_t)(a->size - 1) * a->count * mesh_dtype_size(a->dtype);
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

    rc = tag_room(1, nk);
    if (rc < 0)
        return rc;
    in = malloc((size_t)n * sizeof(*in));
    ops = malloc(2 * (size_t)n * sizeof(*ops));
    if (!in || !ops) {
        free(in);
        free(ops);
        return mesh_err(-ENOMEM, "out of memory building a direct schedule");
    }
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

/* ---- recursive doubling -------------------------------------------------- */

size_t coll_rd_scratch(const struct coll_args *a)
{
    if (a->size < 2)
        return 0;
    return 2 * a->count * mesh_dtype_size(a->dtype);
}

int coll_rd_rounds(int n, int *extra)
{
    int p2 = 1, rounds = 0;

    while (p2 <= n / 2) {
        p2 *= 2;
        rounds++;
    }
    *extra = n - p2;
    return rounds;
}

/* The real rank of virtual rank v, with m ranks folded in pairs. */
static int rd_real(int v, int m)
{
    return v < m ? 2 * v + 1 : v + m;
}

/* The virtual rank of real rank r, or -1 where r folds into r + 1. */
static int rd_virtual(int r, int m)
{
    return r < 2 * m ? (r % 2 ? r / 2 : -1) : r - m;
}

/*
 * The fold of N - P extra ranks, for chunk [o, o + l): rank r (even, below
 * 2m) hands its data to r + 1 on tag_in and takes the result back on
 * tag_out (fold_leaf); rank r + 1 first adds x_r + x_r+1 into the receive
 * buffer, from a receive into slot (fold_in: returns the reduce's op).
 */
static void fold_leaf(struct sched *s, const struct coll_args *a, size_t o,
                      size_t l, uint32_t tag_in, uint32_t tag_out)
{
    size_t es = mesh_dtype_size(a->dtype);
    int snd = sched_send(s, a->rank + 1, tag_in, o * es, at(a->sendbuf, o, es),
                         l * es, a->send_mr);
    int rcv = sched_recv(s, a->rank + 1, tag_out, o * es,
                         at(a->recvbuf, o, es), l * es, a->recv_mr);

    if (a->sendbuf == a->recvbuf)
        sched_dep(s, snd, rcv);
}

static int fold_in(struct sched *s, const struct coll_args *a, size_t o,
                   size_t l, uint32_t tag, char *slot, mesh_mr_t *smr)
{
    size_t es = mesh_dtype_size(a->dtype);
    int rcv = sched_recv(s, a->rank - 1, tag, o * es, slot, l * es, smr);
    const void *in[2] = {slot, at(a->sendbuf, o, es)};
    int red = sched_reduce(s, at(a->recvbuf, o, es), in, 2, l, 1.0f);

    sched_dep(s, rcv, red);
    return red;
}

/*
 * Recursive doubling: with P the largest power of two <= N, log2(P) rounds;
 * in round j virtual rank v swaps its partial sum with v ^ 2^j, and both
 * add the same two operands (x + y and y + x are the same float), so every
 * rank ends with the same bytes. The m = N - P extra ranks fold in first:
 * ranks 2i and 2i + 1 (i < m) pair up, 2i hands its data to 2i + 1, which
 * plays virtual rank i, and gets the result back at the end. log2(P) hops
 * (+ 2 with extras), the whole message on each: for small messages, where
 * the tree's 2 x depth hops cost more.
 *
 * Scratch: two slots of count elements, used in turn; a receive into a
 * slot waits for the reduction that read it two rounds before.
 */
int coll_build_rd_allreduce(struct sched *s, const struct coll_args *a,
                            void *scratch, mesh_mr_t *smr)
{
    int n = a->size, r = a->rank, m, rounds = coll_rd_rounds(n, &m), v;
    size_t es = mesh_dtype_size(a->dtype);
    size_t ce = chunk_elems(a, a->count), nk = nchunks(a->count, ce);
    float div = a->redop == MESH_REDOP_AVG ? (float)n : 1.0f;
    int rc;

    v = rd_virtual(r, m);
    rc = tag_room((size_t)rounds + 2, nk);
    if (rc < 0)
        return rc;
    for (size_t k = 0; k < nk; k++) {
        uint32_t tag0 = (uint32_t)(k * ((size_t)rounds + 2));
        size_t o, l;
        char *slot[2];
        int reader[2] = {-1, -1}, prod = -1, snd, rcv, red;
        const void *cur, *in[2];
        mesh_mr_t *cur_mr = a->send_mr;

        clip(0, a->count, k, ce, &o, &l);
        slot[0] = at(scratch, o, es);
        slot[1] = at(scratch, a->count + o, es);
        cur = at(a->sendbuf, o, es);
        if (v < 0) { /* folded in: hand over, take the result back */
            fold_leaf(s, a, o, l, tag0, tag0 + (uint32_t)rounds + 1);
            continue;
        }
        if (r < 2 * m) { /* the partner's data first: x_r-1 + x_r */
            prod = fold_in(s, a, o, l, tag0, slot[0], smr);
            reader[0] = prod;
            cur = at(a->recvbuf, o, es);
            cur_mr = a->recv_mr;
        }
        for (int j = 0; j < rounds; j++) {
            int peer = rd_real(v ^ (1 << j), m);
            uint32_t tag = tag0 + 1 + (uint32_t)j;
            char *sl = slot[j % 2];

            snd = sched_send(s, peer, tag, o * es, cur, l * es, cur_mr);
            sched_dep(s, prod, snd);
            rcv = sched_recv(s, peer, tag, o * es, sl, l * es, smr);
            sched_dep(s, reader[j % 2], rcv);
            in[0] = cur;
            in[1] = sl;
            red = sched_reduce(s, at(a->recvbuf, o, es), in, 2, l,
                               j == rounds - 1 ? div : 1.0f);
            sched_dep(s, rcv, red);
            sched_dep(s, prod, red);
            /* the sum overwrites what is being sent */
            if (cur == (const void *)at(a->recvbuf, o, es))
                sched_dep(s, snd, red);
            reader[j % 2] = red;
            prod = red;
            cur = at(a->recvbuf, o, es);
            cur_mr = a->recv_mr;
        }
        if (r < 2 * m) { /* the result back to the folded-in partner */
            snd = sched_send(s, r - 1, tag0 + (uint32_t)rounds + 1, o * es, cur,
                             l * es, cur_mr);
            sched_dep(s, prod, snd);
        }
    }
    return 0;
}

/* ---- recursive halving and doubling (Rabenseifner) ---------------------- */

/* Elements [*o, *o + *l) of blocks [b0, b1) of a chunk [o0, o0 + l0) cut
 * into p blocks. */
static void blocks(size_t o0, size_t l0, int p, int b0, int b1, size_t *o,
                   size_t *l)
{
    size_t s0, n0, s1, n1;

    segment(l0, p, b0, &s0, &n0);
    segment(l0, p, b1 - 1, &s1, &n1);
    *o = o0 + s0;
    *l = s1 + n1 - s0;
}

/*
 * Rabenseifner's all-reduce: a reduce-scatter by recursive halving, then an
 * all-gather by recursive doubling, on P (the largest power of two <= N)
 * virtual ranks; the N - P extra ranks fold in and out as in recursive
 * doubling. In halving round j virtual rank v swaps half of its current
 * block range with v ^ (P >> (j + 1)) and adds the half it keeps; after
 * log2(P) rounds it holds the sum of block v alone, and the doubling rounds
 * hand the blocks round in the reverse order. Each block is summed by one
 * rank and copied to the others, so every rank ends with the same bytes.
 * The ring's bytes (2 (P - 1) / P of the message per link) in 2 log2(P)
 * hops instead of 2 (N - 1): for the middle sizes, where the ring's many
 * steps cost more than its perfect link use gains.
 *
 * The message is cut into chunks that run as independent pipelines (block
 * sizes near the ring's chunks); scratch: two slots of count elements used
 * in turn, as recursive doubling does, except that the first halving round
 * of an out-of-place call receives into the receive buffer (recv_apart).
 * Every send's order is its chunk, as in the ring all-reduce: a chunk's
 * later rounds go ahead of later chunks' queued sends, and chunk k's
 * operations depend on chunk k's alone (its scratch is its own range).
 */
int coll_build_rhd_allreduce(struct sched *s, const struct coll_args *a,
                             void *scratch, mesh_mr_t *smr)
{
    int n = a->size, r = a->rank, m, rounds = coll_rd_rounds(n, &m), v, p;
    size_t es = mesh_dtype_size(a->dtype), ce, nk;
    float div = a->redop == MESH_REDOP_AVG ? (float)n : 1.0f;
    uint32_t ntag = 2 * (uint32_t)rounds + 2;
    int rc, apart = recv_apart(a);

    p = 1 << rounds;
    /* the first halving round's message (half a chunk) near the ring's
     * chunk size */
    ce = chunk_elems(a, a->count / (size_t)p + 1);
    ce = ce > SIZE_MAX / 2 ? SIZE_MAX : 2 * ce;
    nk = nchunks(a->count, ce);
    v = rd_virtual(r, m);
    rc = tag_room(ntag, nk);
    if (rc < 0)
        return rc;
    for (size_t k = 0; k < nk; k++) {
        uint32_t tag0 = (uint32_t)(k * ntag);
        size_t o0, l0, o, l;
        int lo = 0, hi = p, prod = -1, reader[2] = {-1, -1};
        int gave[32], got[32];
        const void *cur, *in[2];
        mesh_mr_t *cur_mr = a->send_mr;
        char *out;

        clip(0, a->count, k, ce, &o0, &l0);
        out = at(a->recvbuf, o0, es);
        cur = at(a->sendbuf, o0, es);
        sched_set_order(s, (uint32_t)k);
        if (v < 0) { /* folded in: hand over, take the result back */
            fold_leaf(s, a, o0, l0, tag0, tag0 + ntag - 1);
            continue;
        }
        if (r < 2 * m) { /* the partner's data first: x_r-1 + x_r */
            prod = fold_in(s, a, o0, l0, tag0, at(scratch, o0, es), smr);
            reader[0] = prod;
            cur = out;
            cur_mr = a->recv_mr;
        }
        /* reduce-scatter: halve [lo, hi) each round */
        for (int j = 0; j < rounds; j++) {
            int mask = p >> (j + 1), mid = lo + (hi - lo) / 2;
            int peer = rd_real(v ^ mask, m), keep_lo, keep_hi, snd, rcv, red;
            uint32_t tag = tag0 + 1 + (uint32_t)j;
            size_t so, sl;
            char *slot;

            if (v & mask) {
                blocks(o0, l0, p, lo, mid, &so, &sl);
                keep_lo = mid;
                keep_hi = hi;
            } else {
                blocks(o0, l0, p, mid, hi, &so, &sl);
                keep_lo = lo;
                keep_hi = mid;
            }
            blocks(o0, l0, p, keep_lo, keep_hi, &o, &l);
            snd = sched_send(s, peer, tag, so * es,
                             (const char *)cur + (so - o0) * es, sl * es,
                             cur_mr);
            sched_dep(s, prod, snd);
            gave[j] = snd;
            if (cur == at(a->sendbuf, o0, es) && apart) {
                /* nothing of ours is in the receive buffer yet */
                slot = at(a->recvbuf, o, es);
                rcv = sched_recv(s, peer, tag, o * es, slot, l * es,
                                 a->recv_mr);
            } else {
                slot = at(scratch, (size_t)(j % 2) * a->count + o, es);
                rcv = sched_recv(s, peer, tag, o * es, slot, l * es, smr);
                sched_dep(s, reader[j % 2], rcv);
            }
            in[0] = (const char *)cur + (o - o0) * es;
            in[1] = slot;
            red = sched_reduce(s, at(a->recvbuf, o, es), in, 2, l,
                               j == rounds - 1 ? div : 1.0f);
            sched_dep(s, rcv, red);
            sched_dep(s, prod, red);
            reader[j % 2] = red;
            prod = red;
            cur = out;
            cur_mr = a->recv_mr;
            lo = keep_lo;
            hi = keep_hi;
        }
        /* all-gather: double [lo, hi) each round, in the reverse order */
        for (int j = 0; j < rounds; j++) {
            int mask = 1 << j, width = hi - lo, plo, snd, rcv;
            int peer = rd_real(v ^ mask, m);
            uint32_t tag = tag0 + 1 + (uint32_t)(rounds + j);

            plo = (v & mask) ? lo - width : lo + width;
            blocks(o0, l0, p, lo, hi, &o, &l);
            snd = sched_send(s, peer, tag, o * es, at(a->recvbuf, o, es),
                             l * es, a->recv_mr);
            sched_dep(s, prod, snd);
            for (int i = 0; i < j; i++)
                sched_dep(s, got[i], snd);
            blocks(o0, l0, p, plo, plo + width, &o, &l);
            rcv = sched_recv(s, peer, tag, o * es, at(a->recvbuf, o, es),
                             l * es, a->recv_mr);
            /* it lands where halving round rounds - 1 - j sent from */
            sched_dep(s, gave[rounds - 1 - j], rcv);
            got[j] = rcv;
            lo = MESH_MIN(lo, plo);
            hi = lo + 2 * width;
        }
        if (r < 2 * m) { /* the result back to the folded-in partner */
            int snd = sched_send(s, r - 1, tag0 + ntag - 1, o0 * es, out,
                                 l0 * es, a->recv_mr);

            sched_dep(s, prod, snd);
            for (int i = 0; i < rounds; i++)
                sched_dep(s, got[i], snd);
        }
    }
    return 0;
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
