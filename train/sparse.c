/*
 * train/sparse.c: top-k and threshold sparsification with error feedback,
 * and the all-gather of (index, value) pairs that replaces the all-reduce
 * (see train/sparse.h).
 */
#include "config.h"

#include "train/sparse.h"

#include "common/dtype.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mesh_sparse_parse(const char *s, struct mesh_sparse_cfg *out)
{
    const char *colon = strchr(s, ':');
    size_t klen = colon ? (size_t)(colon - s) : strlen(s);
    char *end = NULL;
    double v;
    int kind;

    if (klen == 4 && !strncmp(s, "topk", 4))
        kind = MESH_SPARSE_TOPK;
    else if (klen == 9 && !strncmp(s, "threshold", 9))
        kind = MESH_SPARSE_THRESHOLD;
    else
        return mesh_err(-EINVAL,
                        "--compress: \"%s\" is not topk:R or "
                        "threshold:T",
                        s);
    if (!colon || !colon[1])
        return mesh_err(-EINVAL,
                        "--compress %s: a number must follow the "
                        "colon",
                        s);
    errno = 0;
    v = strtod(colon + 1, &end);
    if (errno || *end || end == colon + 1 || !isfinite(v))
        return mesh_err(-EINVAL, "--compress %s: \"%s\" is not a number", s,
                        colon + 1);
    if (kind == MESH_SPARSE_TOPK && !(v > 0 && v <= 1))
        return mesh_err(-EINVAL,
                        "--compress %s: the fraction R must be in (0, 1]", s);
    if (kind == MESH_SPARSE_THRESHOLD && !(v >= 0))
        return mesh_err(-EINVAL, "--compress %s: the threshold T must be >= 0",
                        s);
    out->kind = kind;
    out->param = v;
    return 0;
}

void mesh_sparse_name(const struct mesh_sparse_cfg *c, char *buf, size_t cap)
{
    if (c->kind == MESH_SPARSE_TOPK)
        snprintf(buf, cap, "topk:%.9g", c->param);
    else if (c->kind == MESH_SPARSE_THRESHOLD)
        snprintf(buf, cap, "threshold:%.9g", c->param);
    else
        snprintf(buf, cap, "none");
}

/*
 * R n rounded to the nearest integer, not truncated: R = 0.01 is slightly
 * more than 1/100 in binary, 0.07 slightly less, and a cast to an integer
 * (SINGA's) turns 0.07 x 100 = 7.0000000000000009 into 7 but 0.29 x 100 =
 * 28.999999999999996 into 28, and anything under one element into 0.
 */
size_t mesh_sparse_topk_count(double r, size_t n)
{
    double k = floor(r * (double)n + 0.5);

    if (n == 0)
        return 0;
    if (!(k >= 1))
        return 1;
    if (k >= (double)n)
        return n;
    return (size_t)k;
}

/* |v|'s bits: ordered as |v| for numbers, NaNs above infinity. */
static inline uint32_t mag_key(float v)
{
    uint32_t u;

    memcpy(&u, &v, 4);
    return u & 0x7fffffffu;
}

/* Element i of acc is chosen: its pair at j, its residual. */
static inline void take(const struct mesh_sparse_cfg *c, const float *acc,
                        size_t i, uint32_t *idx, void *val, size_t j,
                        float *residual)
{
    idx[j] = (uint32_t)i;
    mesh_dtype_put_f32(c->wire, val, j, acc[i]);
    if (residual)
        residual[i] = acc[i] - mesh_dtype_get_f32(c->wire, val, j);
}

/*
 * Top-k of acc[0..n) (0 < k < n) in two passes over acc: a histogram of
 * |v|'s upper 16 bits (sign off, so exponent and 7 mantissa bits) finds
 * the bin that holds the k-th largest; the second pass takes every index
 * above that bin, and lists the bin's own (candidates); a histogram of
 * the candidates' lower 15 bits settles which of them are chosen (ties:
 * the lower indices); the two ascending lists are merged. Writes k pairs.
 */
static int topk_select(const struct mesh_sparse_cfg *c, const float *acc,
                       size_t n, size_t k, uint32_t *idx, void *val,
                       float *residual)
{
    uint32_t *hist = calloc(1u << 16, sizeof(uint32_t)), *cand = NULL, b;
    size_t i, j, o, need = k, ns = 0, nc = 0, nch = 0;

    if (!hist)
        return mesh_err(-ENOMEM, "out of memory selecting top-k");
    for (i = 0; i < n; i++)
        hist[mag_key(acc[i]) >> 15]++;
    /* the elements above bin b number fewer than k, with it k or more */
    for (b = 0xffff; b > 0 && hist[b] < need; b--)
        need -= hist[b];
    cand = malloc((hist[b] ? hist[b] : 1) * sizeof(uint32_t));
    if (!cand) {
        free(hist);
        return mesh_err(-ENOMEM, "out of memory selecting top-k");
    }
    for (i = 0; i < n; i++) {
        uint32_t hb = mag_key(acc[i]) >> 15;

        if (hb > b) {
            idx[ns++] = (uint32_t)i;
            continue;
        }
        if (hb == b)
            cand[nc++] = (uint32_t)i;
        if (residual && residual != acc)
            residual[i] = acc[i]; /* a chosen candidate's is set below */
    }
    /* need of the nc candidates: the largest lower bits, ties in order */
    memset(hist, 0, sizeof(uint32_t) << 15);
    for (j = 0; j < nc; j++)
        hist[mag_key(acc[cand[j]]) & 0x7fff]++;
    for (b = 0x7fff; b > 0 && hist[b] < need; b--)
        need -= hist[b];
    for (j = 0; j < nc; j++) {
        uint32_t lo = mag_key(acc[cand[j]]) & 0x7fff;

        if (lo > b || (lo == b && need > 0)) {
            if (lo == b)
                need--;
            cand[nch++] = cand[j];
        }
    }
    /* merge both ascending lists into idx, from the back (ns + nch == k) */
    i = ns;
    j = nch;
    o = ns + nch;
    while (j > 0) {
        if (i > 0 && idx[i - 1] > cand[j - 1])
            idx[--o] = idx[--i];
        else
            idx[--o] = cand[--j];
    }
    for (o = 0; o < ns + nch; o++)
        take(c, acc, idx[o], idx, val, o, residual);
    free(cand);
    free(hist);
    return 0;
}

int mesh_sparse_select(const struct mesh_sparse_cfg *c, const float *acc,
                       size_t n, uint32_t *idx, void *val, float *residual,
                       size_t *count)
{
    size_t i, j = 0, k;
    int rc;

    if (c->kind == MESH_SPARSE_TOPK) {
        k = mesh_sparse_topk_count(c->param, n);
        if (k > 0 && k < n) {
            rc = topk_select(c, acc, n, k, idx, val, residual);
            if (rc < 0)
                return rc;
            *count = k;
            return 0;
        }
        for (i = 0; i < n; i++) /* k == n: all of them */
            take(c, acc, i, idx, val, j++, residual);
    } else {
        float t = (float)c->param;

        for (i = 0; i < n; i++) {
            /* not "|v| >= T": a NaN is sent, not kept forever */
            if (!(fabsf(acc[i]) < t))
                take(c, acc, i, idx, val, j++, residual);
            else if (residual && residual != acc)
                residual[i] = acc[i];
        }
    }
    *count = j;
    return 0;
}

/* ---- the exchange -------------------------------------------------------- */

struct sbucket {
    size_t lo, n;
    uint32_t *idx;  /* this rank's selection: (k or n) indices */
    void *val;      /* (k or n) values of cfg.wire */
    size_t count;   /* selected this step */
    uint64_t *cnts; /* (size) every rank's count (threshold) */
    uint8_t *gath;  /* (size) slots of `slot` pairs: indices, then values */
    size_t gath_cap;
    size_t slot;                  /* pairs per rank this step */
    mesh_coll_req_t *creq, *preq; /* in flight: counts, pairs */
};

struct mesh_sparse {
    struct mesh_sparse_cfg c;
    mesh_coll_t *coll;
    int rank, size;
    size_t vsize;    /* bytes per value on the wire */
    float *residual; /* (nparams) with error feedback */
    struct sbucket *b;
    int nb;
};

static size_t pair_bytes(const struct mesh_sparse *sp)
{
    return 4 + sp->vsize;
}

/* Room for size slots of `slot` pairs in bucket b's gather buffer. */
static int gath_reserve(struct mesh_sparse *sp, struct sbucket *b, size_t slot)
{
    size_t need = (size_t)sp->size * slot * pair_bytes(sp);

    if (need <= b->gath_cap)
        return 0;
    need += need / 4; /* threshold: counts vary from step to step */
    free(b->gath);
    b->gath_cap = 0;
    b->gath = malloc(need);
    if (!b->gath)
        return mesh_err(-ENOMEM,
                        "out of memory for the sparse all-gather "
                        "(%zu bytes)",
                        need);
    b->gath_cap = need;
    return 0;
}

/* This rank's pairs into its slot of the gather buffer. */
static void gath_pack(struct mesh_sparse *sp, struct sbucket *b)
{
    uint8_t *s;

    if (b->slot == 0)
        return; /* nothing selected, maybe nothing allocated */
    s = b->gath + (size_t)sp->rank * b->slot * pair_bytes(sp);
    memcpy(s, b->idx, b->count * 4);
    memcpy(s + b->slot * 4, b->val, b->count * sp->vsize);
}

int mesh_sparse_create(const struct mesh_sparse_cfg *c, mesh_coll_t *coll,
                       int rank, int size, size_t nparams, const size_t *lo,
                       const size_t *hi, int nbuckets, struct mesh_sparse **out)
{
    struct mesh_sparse *sp;
    int i, rc = 0;

    if (c->kind != MESH_SPARSE_TOPK && c->kind != MESH_SPARSE_THRESHOLD)
        return mesh_err(-EINVAL, "sparse gradients: unknown kind %d", c->kind);
    if (size < 1 || rank < 0 || rank >= size || (size > 1 && !coll))
        return mesh_err(-EINVAL, "sparse gradients: rank %d of %d", rank, size);
    sp = calloc(1, sizeof(*sp));
    if (!sp)
        return mesh_err(-ENOMEM, "out of memory");
    sp->c = *c;
    sp->coll = size > 1 ? coll : NULL;
    sp->rank = rank;
    sp->size = size;
    sp->vsize = mesh_dtype_size(c->wire);
    sp->nb = nbuckets;
    sp->b = calloc((size_t)nbuckets, sizeof(*sp->b));
    if (!sp->b || sp->vsize == 0 || c->wire == MESH_DT_BYTE)
        rc = sp->b
                 ? mesh_err(-EINVAL, "sparse gradients: wire dtype %d", c->wire)
                 : mesh_err(-ENOMEM, "out of memory");
    if (rc == 0 && c->error_feedback &&
        !(sp->residual = calloc(nparams ? nparams : 1, sizeof(float))))
        rc = mesh_err(-ENOMEM, "out of memory for the residual (%zu floats)",
                      nparams);
    for (i = 0; rc == 0 && i < nbuckets; i++) {
        struct sbucket *b = &sp->b[i];
        size_t n = hi[i] - lo[i], cap;

        b->lo = lo[i];
        b->n = n;
        if (hi[i] < lo[i] || hi[i] > nparams || n > UINT32_MAX) {
            rc = mesh_err(-EINVAL,
                          "sparse gradients: bucket %d [%zu, %zu) of "
                          "%zu floats (at most 2^32 - 1 each)",
                          i, lo[i], hi[i], nparams);
            break;
        }
        /* top-k selects k, threshold up to all n */
        cap = c->kind == MESH_SPARSE_TOPK ? mesh_sparse_topk_count(c->param, n)
                                          : n;
        b->idx = malloc((cap ? cap : 1) * 4);
        b->val = malloc((cap ? cap : 1) * sp->vsize);
        b->cnts = calloc((size_t)size, sizeof(uint64_t));
        if (!b->idx || !b->val || !b->cnts)
            rc = mesh_err(-ENOMEM, "out of memory for sparse bucket %d", i);
        if (rc == 0 && c->kind == MESH_SPARSE_TOPK)
            rc = gath_reserve(sp, b, mesh_sparse_topk_count(c->param, n));
    }
    if (rc < 0) {
        mesh_sparse_destroy(sp);
        return rc;
    }
    *out = sp;
    return 0;
}

void mesh_sparse_destroy(struct mesh_sparse *sp)
{
    int i;

    if (!sp)
        return;
    for (i = 0; sp->b && i < sp->nb; i++) {
        free(sp->b[i].idx);
        free(sp->b[i].val);
        free(sp->b[i].cnts);
        free(sp->b[i].gath);
    }
    free(sp->b);
    free(sp->residual);
    free(sp);
}

int mesh_sparse_start(struct mesh_sparse *sp, int i, float *g)
{
    struct sbucket *b = &sp->b[i];
    float *res = sp->residual ? sp->residual + b->lo : NULL;
    size_t j;
    int rc;

    if (res)
        for (j = 0; j < b->n; j++)
            g[j] += res[j];
    rc = mesh_sparse_select(&sp->c, g, b->n, b->idx, b->val, res, &b->count);
    if (rc < 0)
        return rc;
    b->cnts[sp->rank] = b->count;
    if (!sp->coll) {
        b->slot = b->count;
        b->cnts[0] = b->count;
        if (gath_reserve(sp, b, b->slot) < 0)
            return -ENOMEM;
        gath_pack(sp, b);
        return mesh_sparse_wait(sp, i, g, NULL, NULL);
    }
    if (sp->c.kind == MESH_SPARSE_THRESHOLD)
        return mesh_coll_allgather_start(sp->coll, &b->cnts[sp->rank], b->cnts,
                                         sizeof(uint64_t), MESH_DT_BYTE,
                                         &b->creq);
    /* top-k: every rank sends k pairs, known in advance */
    b->slot = b->count;
    gath_pack(sp, b);
    return mesh_coll_allgather_start(
        sp->coll, b->gath + (size_t)sp->rank * b->slot * pair_bytes(sp),
        b->gath, b->slot * pair_bytes(sp), MESH_DT_BYTE, &b->preq);
}

int mesh_sparse_exchange(struct mesh_sparse *sp, int i)
{
    struct sbucket *b = &sp->b[i];
    size_t max = 0;
    int r, rc;

    if (!b->creq)
        return 0;
    rc = mesh_coll_wait(b->creq);
    b->creq = NULL;
    if (rc < 0)
        return rc;
    for (r = 0; r < sp->size; r++) {
        if (b->cnts[r] > b->n || (r == sp->rank && b->cnts[r] != b->count))
            return mesh_err(-EPROTO,
                            "sparse all-gather, bucket %d: rank %d "
                            "announced %llu pairs for %zu floats",
                            i, r, (unsigned long long)b->cnts[r], b->n);
        if (b->cnts[r] > max)
            max = (size_t)b->cnts[r];
    }
    b->slot = max;
    if (max == 0)
        return 0; /* every rank knows: nothing selected anywhere */
    rc = gath_reserve(sp, b, max);
    if (rc < 0)
        return rc;
    gath_pack(sp, b);
    return mesh_coll_allgather_start(
        sp->coll, b->gath + (size_t)sp->rank * max * pair_bytes(sp), b->gath,
        max * pair_bytes(sp), MESH_DT_BYTE, &b->preq);
}

/* g = (sum over the ranks, in rank order, of their pairs) / size. */
static int sparse_sum(struct mesh_sparse *sp, int i, float *g)
{
    struct sbucket *b = &sp->b[i];
    size_t j, pb = pair_bytes(sp);
    int r;

    memset(g, 0, b->n * sizeof(float));
    for (r = 0; b->slot > 0 && r < sp->size; r++) {
        const uint8_t *s = b->gath + (size_t)r * b->slot * pb;
        const uint8_t *v = s + b->slot * 4;
        size_t cnt =
            sp->c.kind == MESH_SPARSE_TOPK ? b->slot : (size_t)b->cnts[r];
        uint32_t prev = 0;

        for (j = 0; j < cnt; j++) {
            uint32_t ix;

            memcpy(&ix, s + j * 4, 4);
            if (ix >= b->n || (j > 0 && ix <= prev))
                return mesh_err(-EPROTO,
                                "sparse all-gather, bucket %d: rank %d "
                                "sent index %u at %zu (bucket of %zu "
                                "floats, indices must ascend)",
                                i, r, ix, j, b->n);
            prev = ix;
            if (sp->c.wire == MESH_DT_F32) {
                float x;

                memcpy(&x, v + j * 4, 4);
                g[ix] += x;
            } else {
                uint16_t h;

                memcpy(&h, v + j * 2, 2);
                g[ix] += sp->c.wire == MESH_DT_F16 ? mesh_f32_from_f16(h)
                                                   : mesh_f32_from_bf16(h);
            }
        }
    }
    if (sp->size > 1)
        for (j = 0; j < b->n; j++)
            g[j] /= (float)sp->size;
    return 0;
}

int mesh_sparse_wait(struct mesh_sparse *sp, int i, float *g, double *t0,
                     double *t1)
{
    struct sbucket *b = &sp->b[i];
    int rc = 0;

    if (t0)
        *t0 = 0;
    if (t1)
        *t1 = 0;
    if (b->creq) /* mesh_sparse_exchange was not called */
        rc = mesh_sparse_exchange(sp, i);
    if (rc == 0 && b->preq)
        rc = mesh_coll_wait_times(b->preq, t0, t1);
    b->preq = NULL;
    if (rc < 0)
        return rc;
    return sparse_sum(sp, i, g);
}

void mesh_sparse_abort(struct mesh_sparse *sp)
{
    int i;

    for (i = 0; i < sp->nb; i++) {
        if (sp->b[i].creq)
            mesh_coll_wait(sp->b[i].creq);
        if (sp->b[i].preq)
            mesh_coll_wait(sp->b[i].preq);
        sp->b[i].creq = sp->b[i].preq = NULL;
    }
}

size_t mesh_sparse_bytes(const struct mesh_sparse *sp, int i)
{
    return (size_t)sp->size * sp->b[i].slot * pair_bytes(sp);
}

float *mesh_sparse_residual(struct mesh_sparse *sp)
{
    return sp->residual;
}
