/*
 * collective/rd.c: recursive doubling, and recursive halving and doubling
 * (Rabenseifner), with the fold of the ranks beyond a power of two. The
 * rules every builder follows are coll-internal.h's.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
    int rcv = sched_recv(s, a->rank + 1, tag_out, o * es, at(a->recvbuf, o, es),
                         l * es, a->recv_mr);

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
            snd =
                sched_send(s, peer, tag, so * es,
                           (const char *)cur + (so - o0) * es, sl * es, cur_mr);
            sched_dep(s, prod, snd);
            gave[j] = snd;
            if (cur == at(a->sendbuf, o0, es) && apart) {
                /* nothing of ours is in the receive buffer yet */
                slot = at(a->recvbuf, o, es);
                rcv =
                    sched_recv(s, peer, tag, o * es, slot, l * es, a->recv_mr);
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

/* ---- costs --------------------------------------------------------------- */

/* log2 P swaps of the whole message, + 2 hops where N is not P. */
double coll_rd_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    int fold = c->rd_extra > 0;
    double hops = c->rd_rounds + 2 * fold;

    return coll_lat(c, MESH_ALGO_RD, hops) + hops * bytes * m->beta_s_per_byte +
           (c->rd_rounds + fold) * bytes * m->gamma_s_per_byte;
}

/*
 * Rabenseifner's: the ring's bytes through each link, in 2 log2 P hops
 * (+ 2 where N is not P), and with extras the fold's whole message in and
 * out of the folding ranks, which also add it.
 */
double coll_rhd_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    int fold = c->rd_extra > 0;
    double p = (double)(1 << c->rd_rounds);

    return coll_lat(c, MESH_ALGO_RHD, 2 * c->rd_rounds + 2 * fold) +
           (2 * (p - 1) / p + 2 * fold) * bytes * m->beta_s_per_byte +
           ((p - 1) / p + fold) * bytes * m->gamma_s_per_byte;
}

/* The fold's extras' whole messages in and out; log2 P rounds of P whole
 * messages, each added. */
double coll_rd_work(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    double e = c->rd_extra, p = (double)(1 << c->rd_rounds);
    double msgs = 2 * e + p * c->rd_rounds;

    return msgs * m->alpha_s + msgs * bytes * m->beta_s_per_byte +
           (e + p * c->rd_rounds) * bytes * m->gamma_s_per_byte;
}

/* The fold as rd's; the halving's and the doubling's log2 P rounds of P
 * messages each move (P - 1) / P of the message, the halving's added. */
double coll_rhd_work(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    double e = c->rd_extra, p = (double)(1 << c->rd_rounds);

    return (2 * e + 2 * p * c->rd_rounds) * m->alpha_s +
           (2 * e + 2 * (p - 1)) * bytes * m->beta_s_per_byte +
           (e + p - 1) * bytes * m->gamma_s_per_byte;
}
