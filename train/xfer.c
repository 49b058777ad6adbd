/*
 * train/xfer.c: --elastic state transfer to the peers a view change
 * admits (doc/elastic.md, "State transfer").
 *
 * In the new view's mesh, the members that hold the state (the senders:
 * every member of the view left that took part in it) send it to the
 * members that hold none (the needy: joiners), striped: the state is one
 * byte string of N bytes cut in XFER_CHUNKS chunks; the chunks a needy
 * peer lacks are split in contiguous runs, one per sender in rank order.
 * Every message travels on the mesh's transport (TCP, shm or verbs).
 *
 *   sender -> needy  OFFER   N, the chunk count, SHA-256 of the state
 *   needy -> sender  REQUEST that SHA-256 and a bitmap of the chunks it
 *                            already holds (from an earlier try)
 *   sender -> needy  chunk i of its run (tag XFER_TAG_DATA + i)
 *
 * The needy peer checks that every sender offers the same N and digest,
 * that N is the size its own model gives, and that the bytes it got hash
 * to that digest, before it reads a field. A try that fails (a sender
 * died) leaves the chunks received; the next view's senders send only the
 * rest, when they offer the same digest (the same step).
 *
 * The digest is the SHA-256 of the cell hashes (train/whash.c: the
 * SHA-256 of the SHA-256s of its 4 MiB cells) of the state's four parts
 * (the header, the parameters, the momentum, the BN statistics). The second
 * and third are those of the weights that the weight check after the view
 * change compares (train.c), which every member computes once for both;
 * a joiner hashes what arrives while it arrives, in order, and a joiner
 * that caught up hashed its own weights before the transfer.
 *
 * The state: a header (below), the parameters, the momentum and the BN
 * running statistics, which the view averages over the senders first (each
 * peer's own differ; evaluation and checkpoints average them too). The
 * error feedback of sparse gradients is each peer's own: a joiner starts
 * with none.
 */
#include "config.h"

#include "train/train-internal.h"

#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XFER_CHUNKS    256
#define XFER_HEADER    64
#define XFER_CTRL      128         /* bytes of an OFFER or a REQUEST */
#define XFER_MAGIC_ST  0x5358544dU /* "MTXS" little-endian: the state */
#define XFER_MAGIC_OF  0x4f58544dU /* "MTXO": an offer */
#define XFER_MAGIC_RQ  0x5258544dU /* "MTXR": a request */
#define XFER_VERSION   3           /* 3: of the parts' cell hashes */
#define XFER_TAG_OFFER 1
#define XFER_TAG_REQ   2
#define XFER_TAG_DATA  16

/* What a needy peer keeps between tries. */
struct train_xfer {
    uint8_t *blob; /* (n) */
    size_t n;
    uint8_t digest[32]; /* of the state the chunks belong to */
    uint8_t have[XFER_CHUNKS / 8];
    int virt; /* the chunks rebuild() marked hold nothing: the model's */
};

void train_xfer_free(struct trainer *t)
{
    if (!t->xfer)
        return;
    free(t->xfer->blob);
    free(t->xfer);
    t->xfer = NULL;
}

static size_t state_bytes(const struct trainer *t)
{
    return XFER_HEADER + 4 * (2 * t->nparams + t->nbuffers);
}

static size_t chunk_len(size_t n)
{
    return (n + XFER_CHUNKS - 1) / XFER_CHUNKS;
}

/* Chunk c's [off, off + len) in a state of n bytes (len 0: past the end). */
static void chunk_range(size_t n, int c, size_t *off, size_t *len)
{
    size_t cl = chunk_len(n), o = (size_t)c * cl;

    *off = o < n ? o : n;
    *len = o < n ? MESH_MIN(cl, n - o) : 0;
}

static int rank_of(uint64_t members, int slot)
{
    return __builtin_popcountll(members & ((UINT64_C(1) << slot) - 1));
}

/*
 * The missing chunks (not in have) in order; sender j of k sends the run
 * [m * j / k, m * (j + 1) / k) of that list. Fills list, returns m.
 */
static int missing(const uint8_t *have, int *list)
{
    int m = 0;

    for (int c = 0; c < XFER_CHUNKS; c++)
        if (!(have[c / 8] >> (c % 8) & 1))
            list[m++] = c;
    return m;
}

/* ---- the state's digest -------------------------------------------------- */

/*
 * The state's SHA-256: the parts' cell hashes (train_wch: whash.c), then
 * the SHA-256 of the four. A part whose hash is given (known) is skipped.
 * Each cell is hashed on its own once all its bytes are held, in any
 * order (ph_feed): a joiner's chunks come from every sender at once, each
 * sender's run in order, so a hash fed in the state's order waited for
 * the first sender's run, then the second's, and hashed most of the state
 * after the last bytes came (0.3 s of a 0.85 s transfer with 7 senders at
 * 1 Gbit/s, 8 December 2026); now only the cells of each run's last
 * chunks are left then.
 */
struct phash {
    size_t bound[5];        /* part p is [bound[p], bound[p + 1]) */
    const uint8_t *base[4]; /* where part p's bytes are */
    size_t cell0[5];        /* part p's cells are [cell0[p], cell0[p + 1]) */
    uint8_t *cells;         /* each cell's SHA-256 */
    uint8_t *done;          /* whether it is hashed */
    size_t n;               /* the state's bytes */
    unsigned known;         /* bit p: part p's hash is given */
    uint8_t h[4][32];
    uint64_t hashed; /* bytes hashed */
    double secs;     /* in SHA-256 */
};

static int sha_err(void)
{
    return mesh_err(-EIO, "state transfer: SHA-256 (OpenSSL EVP) failed");
}

static void ph_free(struct phash *ph)
{
    free(ph->cells);
    free(ph->done);
    ph->cells = ph->done = NULL;
}

/*
 * The state of n bytes in blob, or in parts (the header, the parameters,
 * the momentum, the BN statistics) where blob is NULL; wh, when valid:
 * the parameters' and momentum's hashes are given.
 */
static int ph_init(struct phash *ph, const struct trainer *t, size_t n,
                   const uint8_t *blob, const uint8_t *const *parts,
                   const struct train_whash *wh)
{
    size_t np = t->nparams * 4;

    memset(ph, 0, sizeof(*ph));
    ph->n = n;
    ph->bound[1] = XFER_HEADER;
    ph->bound[2] = XFER_HEADER + np;
    ph->bound[3] = XFER_HEADER + 2 * np;
    ph->bound[4] = n;
    for (int p = 0; p < 4; p++) {
        size_t len = ph->bound[p + 1] - ph->bound[p];

        ph->base[p] = blob ? blob + ph->bound[p] : parts[p];
        /* (an empty part has one cell, empty: train_wch) */
        ph->cell0[p + 1] =
            ph->cell0[p] + (len ? (len + TRAIN_WCELL - 1) / TRAIN_WCELL : 1);
    }
    if (wh && wh->valid) {
        ph->known = 1u << 1 | 1u << 2;
        memcpy(ph->h[1], wh->h, 32);
        memcpy(ph->h[2], wh->h + 32, 32);
    }
    ph->cells = malloc(32 * ph->cell0[4]);
    ph->done = calloc(ph->cell0[4], 1);
    if (!ph->cells || !ph->done) {
        ph_free(ph);
        return mesh_err(-ENOMEM, "out of memory");
    }
    return 0;
}

/* Whether every chunk that holds a byte of [beg, end) is in have. */
static int held(const uint8_t *have, size_t n, size_t beg, size_t end)
{
    size_t cl = chunk_len(n);

    for (size_t c = beg / cl; end > beg && c <= (end - 1) / cl; c++)
        if (!(have[c / 8] >> (c % 8) & 1))
            return 0;
    return 1;
}

/*
 * Hash every cell not hashed yet whose bytes are all held: whose chunks
 * are all in have (NULL: every byte is).
 */
static int ph_feed(struct phash *ph, const uint8_t *have)
{
    double t0 = mesh_now_s();
    unsigned int dl;
    int ok = 1;

    for (int p = 0; p < 4 && ok; p++) {
        size_t beg = ph->bound[p], end = ph->bound[p + 1];

        if (ph->known >> p & 1)
            continue;
        for (size_t c = ph->cell0[p]; c < ph->cell0[p + 1] && ok; c++) {
            size_t off = (c - ph->cell0[p]) * TRAIN_WCELL,
                   len = MESH_MIN(TRAIN_WCELL, end - beg - off);

            if (ph->done[c] ||
                (have && !held(have, ph->n, beg + off, beg + off + len)))
                continue;
            dl = 32;
            ok = EVP_Digest(ph->base[p] + off, len, ph->cells + 32 * c, &dl,
                            EVP_sha256(), NULL) == 1 &&
                 dl == 32;
            ph->done[c] = 1;
            ph->hashed += len;
        }
    }
    ph->secs += mesh_now_s() - t0;
    return ok ? 0 : sha_err();
}

/* Hash the rest of the state; out: its digest. */
static int ph_final(struct phash *ph, uint8_t out[32])
{
    int rc = ph_feed(ph, NULL);

    for (int p = 0; p < 4 && rc == 0; p++)
        if (!(ph->known >> p & 1))
            rc = train_wch_top(ph->cells + 32 * ph->cell0[p],
                               ph->cell0[p + 1] - ph->cell0[p], ph->h[p]);
    if (rc < 0)
        return sha_err();
    if (!EVP_Digest(ph->h, sizeof(ph->h), out, NULL, EVP_sha256(), NULL))
        rc = sha_err();
    return rc;
}

/* ---- the state as bytes -------------------------------------------------- */

static void header_write(struct trainer *t, const struct train_snap *sn,
                         uint8_t *b)
{
    memset(b, 0, XFER_HEADER);
    mesh_put_le32(b, XFER_MAGIC_ST);
    mesh_put_le32(b + 4, XFER_VERSION);
    mesh_put_le64(b + 8, sn->step);
    mesh_put_le64(b + 16, sn->d_epoch);
    mesh_put_le64(b + 24, sn->d_pos);
    mesh_put_le64(b + 32, t->nparams);
    mesh_put_le64(b + 40, t->nbuffers);
    mesh_put_le64(b + 48, t->total_steps);
}

/* The snapshot's parts (header: hdr) and their bounds in the state. */
static void state_parts(struct trainer *t, const struct train_snap *sn,
                        const uint8_t *hdr, size_t n, const uint8_t **part,
                        size_t *bound)
{
    size_t np = t->nparams * 4;

    /* floats as the host stores them: every peer of a job shares one
     * byte order (the configuration check compares digests of floats) */
    part[0] = hdr;
    /* a lazy snapshot is the live state (train.c, snap_restore) */
    part[1] = (const uint8_t *)(sn->lazy ? mesh_nn_model_params(t->model)
                                         : sn->params);
    part[2] =
        (const uint8_t *)(sn->lazy ? mesh_nn_sgd_momentum(t->sgd) : sn->mom);
    part[3] = (const uint8_t *)sn->buf;
    bound[0] = 0;
    bound[1] = XFER_HEADER;
    bound[2] = XFER_HEADER + np;
    bound[3] = XFER_HEADER + 2 * np;
    bound[4] = n;
}

/* Bytes [off, off + len) of the state in parts into b. */
static void parts_copy(const uint8_t *const *part, const size_t *bound,
                       size_t off, size_t len, uint8_t *b)
{
    for (int p = 0; p < 4 && len; p++) {
        size_t take;

        if (off >= bound[p + 1])
            continue;
        take = MESH_MIN(len, bound[p + 1] - off);
        memcpy(b, part[p] + (off - bound[p]), take);
        b += take;
        off += take;
        len -= take;
    }
}

/*
 * Check a received state's header (its digest matched) and load it into
 * snapshot sn. live: the weights and momentum are the model's (a joiner
 * that caught up, its own proved equal to the senders'; or one with host
 * slabs, whose caller copies them there next), which the snapshot then
 * holds lazily as a member's does (train.c, snap_take).
 */
static int state_read(struct trainer *t, uint64_t step, const uint8_t *b,
                      int live, struct train_snap *sn)
{
    size_t np = t->nparams * 4;
    uint64_t d_epoch = mesh_get_le64(b + 16), d_pos = mesh_get_le64(b + 24);

    if (mesh_get_le32(b) != XFER_MAGIC_ST ||
        mesh_get_le32(b + 4) != XFER_VERSION)
        return mesh_err(-EBADMSG, "state transfer: the state's header has "
                                  "a wrong magic or version");
    if (mesh_get_le64(b + 32) != t->nparams ||
        mesh_get_le64(b + 40) != t->nbuffers ||
        mesh_get_le64(b + 48) != t->total_steps)
        return mesh_err(-EBADMSG,
                        "state transfer: the state holds %" PRIu64
                        " parameters, %" PRIu64 " statistics and %" PRIu64
                        " steps; this peer's model has %zu, %zu and %" PRIu64,
                        mesh_get_le64(b + 32), mesh_get_le64(b + 40),
                        mesh_get_le64(b + 48), t->nparams, t->nbuffers,
                        t->total_steps);
    if (mesh_get_le64(b + 8) != step)
        return mesh_err(-EBADMSG,
                        "state transfer: the state is of step %" PRIu64
                        ", the view restarts from step %" PRIu64,
                        mesh_get_le64(b + 8), step);
    if (t->train_ld && (d_pos > t->info.train_count ||
                        d_epoch > t->total_steps / t->steps_per_epoch + 1))
        return mesh_err(-EBADMSG,
                        "state transfer: data position %" PRIu64
                        " of epoch %" PRIu64 " is outside the %" PRIu64
                        " training samples and %" PRIu64 " steps",
                        d_pos, d_epoch, (uint64_t)t->info.train_count,
                        t->total_steps);
    if (!sn->params) {
        sn->params = malloc(np);
        sn->mom = malloc(np);
        sn->buf = malloc(t->nbuffers * 4 + 4);
        if (!sn->params || !sn->mom || !sn->buf)
            return train_local(t, mesh_err(-ENOMEM, "state transfer: out "
                                                    "of memory"));
    }
    if (!live) {
        memcpy(sn->params, b + XFER_HEADER, np);
        memcpy(sn->mom, b + XFER_HEADER + np, np);
    }
    sn->lazy = live;
    if (t->nbuffers)
        memcpy(sn->buf, b + XFER_HEADER + 2 * np, t->nbuffers * 4);
    sn->step = step;
    sn->d_epoch = d_epoch;
    sn->d_pos = d_pos;
    sn->valid = 1;
    return 0;
}

/*
 * Average the senders' BN statistics into every member's snapshot sn
 * (a sum over the view in which the needy add zeros), so that every
 * sender's state is the same bytes.
 */
static int bn_average(struct trainer *t, struct train_snap *sn, int needy,
                      int senders)
{
    float *x;
    int rc;

    if (!t->nbuffers || !t->coll)
        return 0;
    x = calloc(t->nbuffers, 4);
    if (!x)
        return train_local(t, mesh_err(-ENOMEM, "out of memory"));
    if (!needy)
        for (size_t i = 0; i < t->nbuffers; i++)
            x[i] = sn->buf[i] / (float)senders;
    rc = mesh_coll_allreduce(t->coll, x, x, t->nbuffers, MESH_DT_F32,
                             MESH_REDOP_SUM, MESH_ALGO_AUTO);
    if (rc == 0 && !needy)
        memcpy(sn->buf, x, t->nbuffers * 4);
    free(x);
    return rc;
}

/* A joiner's weights and momentum as caught up, in host memory: on a
 * device backend the host copies the catch-up kept (train/catchup.c). */
static const float *caught_up_params(struct trainer *t)
{
    return t->host_slabs ? mesh_nn_model_params(t->model) : t->hparams;
}

static const float *caught_up_momentum(struct trainer *t)
{
    return t->host_slabs ? mesh_nn_sgd_momentum(t->sgd) : t->hmom;
}

/*
 * A joiner that caught up (train/catchup.c) holds the weights and
 * momentum of the step the view restarts from: it marks the chunks that
 * lie wholly inside them as held, so that the senders send only the rest
 * (the header, the BN statistics and the chunks across their edges). The
 * digest of the whole state, checked as always, proves them equal to the
 * senders'. With copy, it writes them where the state has them; without,
 * the hashes of its weights stand for them, and the state is read from
 * the model (state_read's live).
 */
static void rebuild(struct trainer *t, struct train_xfer *x, int copy)
{
    size_t np = t->nparams * 4, lo = XFER_HEADER, hi = XFER_HEADER + 2 * np;
    const uint8_t *p = (const uint8_t *)caught_up_params(t);
    const uint8_t *m = (const uint8_t *)caught_up_momentum(t);

    x->virt = !copy;
    for (int c = 0; c < XFER_CHUNKS; c++) {
        size_t off, len;

        chunk_range(x->n, c, &off, &len);
        if (!len || off < lo || off + len > hi)
            continue;
        x->have[c / 8] |= (uint8_t)(1u << (c % 8));
        if (copy) {
            /* the chunk, from the parameters and/or the momentum */
            size_t a = off, mid = MESH_MIN(off + len, lo + np);

            if (a < mid)
                memcpy(x->blob + a, p + (a - lo), mid - a);
            a = MESH_MAX(a, lo + np);
            if (a < off + len)
                memcpy(x->blob + a, m + (a - lo - np), off + len - a);
        }
    }
}

/*
 * A joiner that caught up, whose weights' hashes stand for the rebuilt
 * range: the bytes received inside it (in the chunks across its edges)
 * must be its own. 1 if they are not.
 */
static int rebuilt_differs(struct trainer *t, const struct train_xfer *x)
{
    size_t np = t->nparams * 4, lo = XFER_HEADER, hi = XFER_HEADER + 2 * np;
    const uint8_t *p = (const uint8_t *)caught_up_params(t);
    const uint8_t *m = (const uint8_t *)caught_up_momentum(t);

    for (int c = 0; c < XFER_CHUNKS; c++) {
        size_t off, len, a, b;

        chunk_range(x->n, c, &off, &len);
        a = MESH_MAX(off, lo);
        b = MESH_MIN(off + len, hi);
        if (!len || a >= b || (off >= lo && off + len <= hi))
            continue; /* outside, or wholly inside: rebuilt */
        for (size_t o = a; o < b;) {
            size_t e = o < lo + np ? MESH_MIN(b, lo + np) : b;
            const uint8_t *src = o < lo + np ? p + (o - lo) : m + (o - lo - np);

            if (memcmp(x->blob + o, src, e - o) != 0)
                return 1;
            o = e;
        }
    }
    return 0;
}

/* ---- the messages -------------------------------------------------------- */

struct link {
    const struct mesh_transport_ops *ops;
    mesh_transport_t *tr;
    uint64_t seq;
};

static int post(struct link *l, int send, int peer, uint32_t tag, void *buf,
                size_t len, mesh_mr_t *mr, mesh_req_t **req)
{
    struct mesh_frame f;

    mesh_frame_p2p(&f, l->seq, tag, len);
    return send ? l->ops->isend(l->tr, peer, &f, buf, mr, req)
                : l->ops->irecv(l->tr, peer, &f, buf, mr, req);
}

/* Wait for reqs[0..n) (NULL ones skipped); the first error. */
static int wait_all(struct link *l, mesh_req_t **reqs, int n)
{
    int rc = 0;

    for (int i = 0; i < n; i++) {
        if (!reqs[i])
            continue;
        if (rc == 0)
            rc = mesh_transport_wait(l->ops, l->tr, reqs[i]);
        reqs[i] = NULL;
    }
    return rc;
}

/*
 * Test aid (tests/train_elastic_corrupt.sh): MESHTRAIN_TEST_XFER_CORRUPT=
 * SLOT[:offer|:catchup|:xfer] makes slot SLOT, when it sends the state
 * (in the view change, or a catch-up snapshot: train/catchup.c), flip a
 * byte of every chunk after hashing it (a transfer corrupted on the way,
 * which the transport's checks cannot see); with :offer it offers a wrong
 * SHA-256 instead (a sender whose state differs from the others'); with
 * :catchup it flips the bytes of the catch-up snapshot only, with :xfer
 * those of the view change only (a joiner that caught up gets the chunks
 * across the edges of what it rebuilt). The joiner must refuse what it
 * got.
 */
void train_xfer_test_corrupt(int slot, int catchup, uint8_t *blob, size_t n,
                             uint8_t *digest)
{
    const char *v = getenv("MESHTRAIN_TEST_XFER_CORRUPT");
    char *end;
    long s;

    if (!v || !*v)
        return;
    s = strtol(v, &end, 10);
    if (end == v || s != slot || (!catchup && !strcmp(end, ":catchup")) ||
        (catchup && !strcmp(end, ":xfer")))
        return;
    if (!strcmp(end, ":offer"))
        digest[0] ^= 0x5a;
    else
        for (size_t o = 0; o < n; o += chunk_len(n))
            blob[o] ^= 0x5a;
}

/*
 * Where a sender's chunks come from: a chunk inside one part of the
 * snapshot is sent from it where it is, one across the parts' edges (at
 * most 3) from a copy, so that a sender neither allocates nor copies the
 * state. With the test aid MESHTRAIN_TEST_XFER_CORRUPT, which flips the
 * bytes sent, every chunk is sent from a copy of the whole state.
 */
struct source {
    const uint8_t *part[4]; /* the header, parameters, momentum, statistics */
    size_t bound[5];
    uint8_t hdr[XFER_HEADER];
    uint8_t *blob;    /* (n) the whole state (the test aid), or NULL */
    uint8_t *edge;    /* the chunks across the parts' edges */
    mesh_mr_t *mr[5]; /* the parts' (the blob's: mr[0]), the edge's */
    uint8_t *at[XFER_CHUNKS];
    mesh_mr_t *mr_of[XFER_CHUNKS];
};

static void source_close(struct link *l, struct source *src)
{
    for (int i = 0; i < 5; i++)
        if (src->mr[i])
            l->ops->dereg_mr(l->tr, src->mr[i]);
    free(src->blob);
    free(src->edge);
}

static int source_open(struct trainer *t, struct link *l,
                       const struct train_snap *sn, size_t n, int whole,
                       struct source *src)
{
    size_t cl = chunk_len(n), off, len;
    int nedge = 0, rc = 0;

    memset(src, 0, sizeof(*src));
    header_write(t, sn, src->hdr);
    state_parts(t, sn, src->hdr, n, src->part, src->bound);
    if (whole) {
        src->blob = malloc(n);
        if (!src->blob)
            return train_local(t, mesh_err(-ENOMEM, "out of memory"));
        parts_copy(src->part, src->bound, 0, n, src->blob);
        rc = l->ops->reg_mr(l->tr, src->blob, n, &src->mr[0]);
        for (int c = 0; c < XFER_CHUNKS && rc == 0; c++) {
            chunk_range(n, c, &off, &len);
            src->at[c] = src->blob + off;
            src->mr_of[c] = src->mr[0];
        }
        return rc;
    }
    src->edge = malloc(3 * cl);
    if (!src->edge)
        return train_local(t, mesh_err(-ENOMEM, "out of memory"));
    rc = l->ops->reg_mr(l->tr, src->edge, 3 * cl, &src->mr[4]);
    for (int p = 1; p < 4 && rc == 0; p++)
        if (src->bound[p + 1] > src->bound[p])
            rc = l->ops->reg_mr(l->tr, (void *)(uintptr_t)src->part[p],
                                src->bound[p + 1] - src->bound[p], &src->mr[p]);
    for (int c = 0; c < XFER_CHUNKS && rc == 0; c++) {
        int p = 0;

        chunk_range(n, c, &off, &len);
        if (!len)
            continue;
        while (p < 3 && off >= src->bound[p + 1])
            p++;
        if (p > 0 && off + len <= src->bound[p + 1]) {
            src->at[c] =
                (uint8_t *)(uintptr_t)src->part[p] + (off - src->bound[p]);
            src->mr_of[c] = src->mr[p];
            continue;
        }
        /* across an edge (each edge lies in one chunk), or the header's */
        if (nedge == 3)
            return mesh_err(-EPROTO, "state transfer: more than 3 chunks "
                                     "across the state's parts");
        src->at[c] = src->edge + (size_t)nedge++ * cl;
        src->mr_of[c] = src->mr[4];
        parts_copy(src->part, src->bound, off, len, src->at[c]);
    }
    return rc;
}

/* Sender: offer the state to every needy peer, then send each its run. */
static int send_state(struct trainer *t, struct link *l, uint64_t members,
                      uint64_t needy, int sender, int senders,
                      const struct source *src, size_t n, const uint8_t *digest,
                      struct train_xfer_stats *st)
{
    int nn = __builtin_popcountll(needy), k = 0, rc = 0, list[XFER_CHUNKS];
    uint8_t *ctrl = NULL;
    mesh_req_t **reqs = NULL;
    mesh_mr_t *cmr = NULL;
    int nreq = 0, cap = nn * (2 + XFER_CHUNKS);

    ctrl = calloc((size_t)nn * 2, XFER_CTRL);
    reqs = calloc((size_t)cap, sizeof(*reqs));
    if (!ctrl || !reqs) {
        rc = train_local(t, mesh_err(-ENOMEM, "out of memory"));
        goto out;
    }
    rc = l->ops->reg_mr(l->tr, ctrl, (size_t)nn * 2 * XFER_CTRL, &cmr);
    if (rc < 0)
        goto out;
    /* every offer and request first: no needy peer waits on another */
    for (int s = 0; s < 64 && rc == 0; s++) {
        uint8_t *of, *rq;
        int peer;

        if (!(needy >> s & 1))
            continue;
        peer = rank_of(members, s);
        of = ctrl + (size_t)k * 2 * XFER_CTRL;
        rq = of + XFER_CTRL;
        mesh_put_le32(of, XFER_MAGIC_OF);
        mesh_put_le32(of + 4, XFER_VERSION);
        mesh_put_le64(of + 8, n);
        mesh_put_le32(of + 16, XFER_CHUNKS);
        memcpy(of + 24, digest, 32);
        rc =
            post(l, 1, peer, XFER_TAG_OFFER, of, XFER_CTRL, cmr, &reqs[nreq++]);
        if (rc == 0)
            rc = post(l, 0, peer, XFER_TAG_REQ, rq, XFER_CTRL, cmr,
                      &reqs[nreq++]);
        k++;
    }
    if (rc == 0)
        rc = wait_all(l, reqs, nreq);
    nreq = 0;
    k = 0;
    for (int s = 0; s < 64 && rc == 0; s++) {
        const uint8_t *rq;
        int peer, m, lo, hi;

        if (!(needy >> s & 1))
            continue;
        peer = rank_of(members, s);
        rq = ctrl + (size_t)k * 2 * XFER_CTRL + XFER_CTRL;
        k++;
        if (mesh_get_le32(rq) != XFER_MAGIC_RQ ||
            mesh_get_le32(rq + 4) != XFER_VERSION ||
            memcmp(rq + 8, digest, 32) != 0) {
            rc = mesh_err(-EPROTO,
                          "state transfer: slot %d's request is malformed "
                          "or names another state",
                          s);
            break;
        }
        m = missing(rq + 40, list);
        lo = m * sender / senders;
        hi = m * (sender + 1) / senders;
        for (int i = lo; i < hi && rc == 0; i++) {
            size_t off, len;

            chunk_range(n, list[i], &off, &len);
            if (!len)
                continue;
            rc =
                post(l, 1, peer, XFER_TAG_DATA + (uint32_t)list[i],
                     src->at[list[i]], len, src->mr_of[list[i]], &reqs[nreq++]);
            st->bytes += len;
        }
    }
    /* test aid: a sender dies halfway (MESHTRAIN_TEST_FAULT ...:xfer) */
    if (rc == 0) {
        rc = wait_all(l, reqs, nreq / 2);
        if (rc == 0)
            train_fault(t, TRAIN_FAULT_XFER);
    }
    if (rc == 0)
        rc = wait_all(l, reqs, nreq);
    else
        (void)wait_all(l, reqs, nreq);
out:
    if (cmr)
        l->ops->dereg_mr(l->tr, cmr);
    free(reqs);
    free(ctrl);
    return rc;
}

/*
 * Needy: take the offers, ask for the chunks missing, receive them, and
 * feed ph (initialised here) with the state in order as it arrives.
 */
static int recv_state(struct trainer *t, struct link *l, uint64_t members,
                      uint64_t senders_mask, int senders, struct train_xfer *x,
                      int rebuilt, const struct train_whash *wh,
                      struct phash *ph, mesh_mr_t *mr,
                      struct train_xfer_stats *st)
{
    uint8_t *ctrl, digest[32];
    mesh_req_t *reqs[64 + XFER_CHUNKS];
    mesh_mr_t *cmr = NULL;
    int nreq = 0, rc, k, m, list[XFER_CHUNKS], owner[XFER_CHUNKS];
    int peer_of[64];

    memset(reqs, 0, sizeof(reqs));
    ctrl = calloc((size_t)senders * 2, XFER_CTRL);
    if (!ctrl)
        return train_local(t, mesh_err(-ENOMEM, "out of memory"));
    rc = l->ops->reg_mr(l->tr, ctrl, (size_t)senders * 2 * XFER_CTRL, &cmr);
    if (rc < 0)
        goto out;
    k = 0;
    for (int s = 0; s < 64 && rc == 0; s++) {
        if (!(senders_mask >> s & 1))
            continue;
        peer_of[k] = rank_of(members, s);
        rc = post(l, 0, peer_of[k], XFER_TAG_OFFER,
                  ctrl + (size_t)k * 2 * XFER_CTRL, XFER_CTRL, cmr,
                  &reqs[nreq++]);
        k++;
    }
    if (rc == 0)
        rc = wait_all(l, reqs, nreq);
    nreq = 0;
    for (k = 0; k < senders && rc == 0; k++) {
        const uint8_t *of = ctrl + (size_t)k * 2 * XFER_CTRL;

        if (mesh_get_le32(of) != XFER_MAGIC_OF ||
            mesh_get_le32(of + 4) != XFER_VERSION ||
            mesh_get_le64(of + 8) != x->n ||
            mesh_get_le32(of + 16) != XFER_CHUNKS)
            rc = mesh_err(-EBADMSG,
                          "state transfer: rank %d offers %" PRIu64
                          " bytes in %u chunks; this peer's model needs "
                          "%zu bytes in %d",
                          peer_of[k], mesh_get_le64(of + 8),
                          (unsigned)mesh_get_le32(of + 16), x->n, XFER_CHUNKS);
        else if (k == 0)
            memcpy(digest, of + 24, 32);
        else if (memcmp(digest, of + 24, 32) != 0)
            rc = mesh_err(-EBADMSG,
                          "state transfer: the senders offer different "
                          "states (ranks %d and %d): the view does not "
                          "agree on one",
                          peer_of[0], peer_of[k]);
    }
    if (rc < 0)
        goto out;
    if (memcmp(digest, x->digest, 32) != 0) {
        /* another state than the chunks held: start again */
        memcpy(x->digest, digest, 32);
        memset(x->have, 0, sizeof(x->have));
    }
    if (x->virt && !(rebuilt && wh->valid)) {
        /* an earlier try's rebuilt chunks were the model's, not held */
        memset(x->have, 0, sizeof(x->have));
        x->virt = 0;
    }
    if (rebuilt)
        rebuild(t, x, !wh->valid);
    rc = ph_init(ph, t, x->n, x->blob, NULL, rebuilt ? wh : NULL);
    if (rc < 0)
        goto out;
    m = missing(x->have, list);
    for (k = 0; k < senders; k++) {
        uint8_t *rq = ctrl + (size_t)k * 2 * XFER_CTRL + XFER_CTRL;

        memset(rq, 0, XFER_CTRL);
        mesh_put_le32(rq, XFER_MAGIC_RQ);
        mesh_put_le32(rq + 4, XFER_VERSION);
        memcpy(rq + 8, digest, 32);
        memcpy(rq + 40, x->have, sizeof(x->have));
        rc = post(l, 1, peer_of[k], XFER_TAG_REQ, rq, XFER_CTRL, cmr,
                  &reqs[nreq++]);
        if (rc < 0)
            break;
        for (int i = m * k / senders; i < m * (k + 1) / senders; i++)
            owner[i] = k;
    }
    for (int i = 0; i < m && rc == 0; i++) {
        size_t off, len;

        chunk_range(x->n, list[i], &off, &len);
        if (!len) {
            x->have[list[i] / 8] |= (uint8_t)(1u << (list[i] % 8));
            continue;
        }
        rc = post(l, 0, peer_of[owner[i]], XFER_TAG_DATA + (uint32_t)list[i],
                  x->blob + off, len, mr, &reqs[nreq + i]);
    }
    /* the chunks that arrive are kept, whatever fails later */
    for (int i = 0; i < nreq + m; i++) {
        int done = 0, rc2;

        if (!reqs[i])
            continue;
        if (rc == 0) {
            rc = mesh_transport_wait(l->ops, l->tr, reqs[i]);
            done = rc == 0;
        } else {
            rc2 = l->ops->test(l->tr, reqs[i], &done);
            done = rc2 == 0 && done;
        }
        reqs[i] = NULL;
        if (rc == 0 && i == nreq + m / 2)
            train_fault(t, TRAIN_FAULT_XFER); /* test aid: the joiner */
        if (done && i >= nreq) {
            size_t off, len;
            int c = list[i - nreq];

            chunk_range(x->n, c, &off, &len);
            x->have[c / 8] |= (uint8_t)(1u << (c % 8));
            st->bytes += len;
            st->sent[owner[i - nreq]] += len;
        }
        /* hash each cell once held, while the rest arrives */
        if (rc == 0 && done)
            rc = ph_feed(ph, x->have);
    }
out:
    if (cmr)
        l->ops->dereg_mr(l->tr, cmr);
    free(ctrl);
    return rc;
}

/*
 * Bench aid (bench/join.sh): MESHTRAIN_XFER_SENDERS=K makes only the K
 * lowest slots that hold the state send it, to measure striping over 1,
 * 3, 7 senders in one setup. Every peer of the job must see the same K.
 */
static uint64_t senders_of(uint64_t have)
{
    const char *v = getenv("MESHTRAIN_XFER_SENDERS");
    int k = v && *v ? atoi(v) : 0;
    uint64_t out = 0;

    if (k <= 0)
        return have;
    for (int s = 0; s < 64 && k > 0; s++)
        if (have >> s & 1) {
            out |= UINT64_C(1) << s;
            k--;
        }
    return out;
}

/*
 * A needy peer's check of what it holds: the state's digest against the
 * one every sender offered. A joiner that caught up rebuilt the weights'
 * range from its own weights, whose hashes ph was given: should a byte
 * received in that range differ from its own, the whole state is hashed.
 */
static int recv_check(struct trainer *t, struct phash *ph, int rebuilt,
                      uint64_t senders_mask, const struct train_xfer_stats *st,
                      int *live)
{
    struct train_xfer *x = t->xfer;
    uint8_t got[32];
    char list[200];
    int rc;

    *live = 0;
    if (ph->known && rebuilt_differs(t, x)) {
        uint64_t hashed = ph->hashed;
        double secs = ph->secs;

        rebuild(t, x, 1); /* the bytes the hashes stood for */
        ph_free(ph);
        rc = ph_init(ph, t, x->n, x->blob, NULL, NULL);
        ph->hashed += hashed;
        ph->secs += secs;
        if (rc < 0)
            return rc;
    }
    rc = ph_final(ph, got);
    if (rc == 0 && memcmp(got, x->digest, 32) == 0)
        *live = x->virt;
    if (rc < 0 || memcmp(got, x->digest, 32) == 0)
        return rc;
    memset(x->have, 0, sizeof(x->have));
    x->virt = 0;
    mesh_elastic_slots_str(senders_mask, list, sizeof(list));
    if (rebuilt)
        return mesh_err(-EBADMSG,
                        "state transfer: the state rebuilt from the catch-up "
                        "and the %" PRIu64 " bytes received do not hash to the "
                        "SHA-256 every sender offered (slots %s): this peer "
                        "refuses the state",
                        st->bytes, list);
    return mesh_err(-EBADMSG,
                    "state transfer: the %zu bytes received do not "
                    "hash to the SHA-256 every sender offered "
                    "(slots %s): this peer refuses the state",
                    x->n, list);
}

int train_xfer_run(struct trainer *t, const struct mesh_elastic_view *v,
                   struct train_whash *wh, struct train_xfer_stats *st)
{
    uint64_t holders = v->members & ~v->needy, senders_mask;
    int me = t->mo->world.rank, needy = (int)(v->needy >> me & 1);
    int senders, rc, rebuilt, live = 0, host;
    struct train_snap *sn = &t->snap[v->step & 1];
    struct link l;
    struct phash ph;
    struct source src;
    mesh_mr_t *mr = NULL;
    const char *v_corrupt;
    uint8_t digest[32];
    size_t n = state_bytes(t);
    double t0 = mesh_now_s(), t1;

    senders_mask = senders_of(holders);
    senders = __builtin_popcountll(senders_mask);
    memset(st, 0, sizeof(*st));
    memset(&ph, 0, sizeof(ph));
    st->senders = senders_mask;
    if (t->sim)
        return 0; /* no weights, no data: the step is all there is */
    if (!senders || v->step == MESH_ELASTIC_NO_STATE)
        return train_local(t, mesh_err(-ENOENT,
                                       "state transfer: no member of view "
                                       "%" PRIu64 " holds the state (every "
                                       "one joined late)",
                                       v->epoch));
    if (!t->mesh)
        return mesh_err(-EINVAL, "state transfer: no mesh");
    rc = bn_average(t, sn, needy, __builtin_popcountll(holders));
    st->bn_s = mesh_now_s() - t0;
    if (rc < 0)
        return rc;
    l.ops = mesh_ops(t->mesh);
    l.tr = mesh_transport(t->mesh);
    l.seq = mesh_seq_next(t->mesh);
    if (needy) {
        if (!t->xfer) {
            t->xfer = calloc(1, sizeof(*t->xfer));
            if (!t->xfer)
                return train_local(t, mesh_err(-ENOMEM, "out of memory"));
        }
        if (t->xfer->n != n) {
            free(t->xfer->blob);
            t->xfer->blob = malloc(n);
            t->xfer->n = t->xfer->blob ? n : 0;
            memset(t->xfer->digest, 0, 32);
            memset(t->xfer->have, 0, sizeof(t->xfer->have));
            if (!t->xfer->blob)
                return train_local(t, mesh_err(-ENOMEM, "out of memory"));
        }
        rebuilt = t->cu_step == v->step;
        rc = l.ops->reg_mr(l.tr, t->xfer->blob, n, &mr);
        if (rc == 0)
            rc = recv_state(t, &l, v->members, senders_mask, senders, t->xfer,
                            rebuilt, wh, &ph, mr, st);
        if (mr)
            l.ops->dereg_mr(l.tr, mr);
        if (rc == 0)
            rc = recv_check(t, &ph, rebuilt, senders_mask, st, &live);
        st->hashed = ph.hashed;
        st->hash_s = ph.secs;
        if (rc == 0) {
            /* the weights' hashes, for the weight check: those of the
             * bytes now loaded */
            memcpy(wh->h, ph.h[1], 32);
            memcpy(wh->h + 32, ph.h[2], 32);
            wh->valid = 1;
        }
        ph_free(&ph);
        if (rc < 0)
            return rc;
        /* host slabs: the weights and momentum go straight into the
         * model, which the snapshot then holds lazily, as where the joiner
         * rebuilt them (live): one copy of the state, not two (into the
         * snapshot, then from it into the model at its restore) */
        host = !live && t->host_slabs;
        t1 = mesh_now_s();
        rc = state_read(t, v->step, t->xfer->blob, live || host, sn);
        if (rc == 0 && host) {
            size_t np = t->nparams * 4;

            memcpy(mesh_nn_model_params(t->model), t->xfer->blob + XFER_HEADER,
                   np);
            memcpy(mesh_nn_sgd_momentum(t->sgd),
                   t->xfer->blob + XFER_HEADER + np, np);
        }
        st->copy_s = mesh_now_s() - t1;
        if (rc < 0)
            return rc;
        train_xfer_free(t);
        t->cu_step = UINT64_MAX; /* the model is no longer the catch-up's */
    } else if (senders_mask >> me & 1) {
        if (!sn->valid || sn->step != v->step)
            return train_local(t, mesh_err(-ENOENT,
                                           "state transfer: no snapshot of "
                                           "step %" PRIu64,
                                           v->step));
        /* the test aid flips the bytes sent: from a copy */
        v_corrupt = getenv("MESHTRAIN_TEST_XFER_CORRUPT");
        t1 = mesh_now_s();
        rc = source_open(t, &l, sn, n, v_corrupt && *v_corrupt, &src);
        st->copy_s = mesh_now_s() - t1;
        /* the header's and BN statistics' hashes; the weights' are wh */
        if (rc == 0)
            rc = ph_init(&ph, t, n, src.blob, src.part, wh);
        if (rc == 0)
            rc = ph_final(&ph, digest);
        st->hashed = ph.hashed;
        st->hash_s = ph.secs;
        ph_free(&ph);
        if (rc == 0 && src.blob)
            train_xfer_test_corrupt(me, 0, src.blob, n, digest);
        if (rc == 0)
            rc = send_state(t, &l, v->members, v->needy,
                            rank_of(senders_mask, me), senders, &src, n, digest,
                            st);
        source_close(&l, &src);
        if (rc < 0)
            return rc;
    }
    st->state_bytes = n;
    st->secs = mesh_now_s() - t0;
    return 0;
}
