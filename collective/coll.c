/*
 * collective/coll.c: the communicator: its engine thread, requests, pinned
 * registered buffers, scratch, and the alpha-beta choice of algorithm (the
 * costs of collective/algos.c's table).
 *
 * Shape: callers queue requests (under mu); one engine thread takes them in
 * order, registers the buffers it meets (once, cached), grows the scratch
 * buffer when needed, compiles the collective into a schedule and runs it.
 * A blocking call made while nothing is queued or running runs the same
 * way on the caller's thread. Either way one request runs at a time (busy),
 * and only the running request touches the transport and the engine-only
 * fields below.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* formation's timing (mesh_coll_opts.measure_budget_s), by default */
#define MEAS_BUDGET_S 20.0

enum req_kind {
    REQ_COLL = 0,    /* a collective */
    REQ_DEREG = 1,   /* deregister a buffer (from mesh_coll_buf_free) */
    REQ_MEASURE = 2, /* ping-pong and stream to the ring neighbours */
};

struct mesh_coll_req {
    struct mesh_coll *c;
    int kind;
    struct coll_args a;
    int algo; /* as asked; AUTO resolved by the engine */
    uint64_t seq;
    int nseq;      /* the sequence numbers it takes, from seq */
    mesh_mr_t *mr; /* REQ_DEREG */
    int done;
    int rc;
    char msg[1024];
    double t_begin, t_end; /* mesh_now_s() when it started and ended */
    struct mesh_coll_req *next;
};

/*
 * AUTO's refinement (refine_*): formation timed the candidates for a few
 * seconds at start-up, and on a loaded machine the ranking it saw can
 * differ from the one that holds while the job runs (on 2 cores, rd 7 %
 * ahead of htree at formation, htree 16 % ahead for the next seconds; on
 * 8 namespace hosts at 64 KiB, rhd 1.7 times the tree at formation and
 * level with it after; on 2 namespace hosts at 64 MiB the tree, the ring
 * and rhd within 2.2 % at formation, the tree 10 % behind the ring
 * after). So the first all-reduces of a size take turns among
 * formation's contenders (within RF_NEAR_SMALL of its best below
 * RF_MAX_S; from there the runner-up within RF_NEAR and the others within
 * RF_NEAR_BIG, where a third within 15 % of it was once left out and ran
 * 4 % ahead of the two raced; then, where a place is left,
 * formation's fastest at the timed sizes either side; RF_RACE_NEAR at
 * most by formation's times here, RF_RACE in all below RF_MAX_S), in
 * epochs of up to RF_ROUNDS rounds (each contender once
 * a round, the order shuffled by the round; as many as fit in RF_EPOCH_S
 * by formation's times, RF_MIN_ROUNDS at least), and at an epoch's end
 * the ranks exchange their times and agree on the ranking by the same
 * rule as formation (coll_meas_agree: the slowest rank's time of each
 * run, the median of the ratios within a round) over every round of
 * every epoch so far; the contenders not clearly slower than the fastest
 * (refine_slower), nor 3 % behind it by the median once they ran enough
 * rounds (coll_race_decide: 10 rounds where formation's best call took
 * RF_MAX_S or more, 32 below) race again, at most RF_EPOCHS epochs in all
 * (and where a race's first epoch holds 12 rounds or more, the ranks agree
 * after its first 7 too, coll_race_probe: one clearly slower leaves there,
 * not after up to 31 of its calls), then
 * the fastest over all of them is kept for the size. So a close call gets up to
 * four times the rounds of a clear one, and a contender's few bad rounds do not
 * decide. And the race's first second can rank otherwise than the minutes after
 * it (8 namespace hosts at 16 KiB: every rank kept rhd after 4 epochs, which
 * then ran 1.2 times the tree), so a kept winner is re-checked
 * (refine_recheck): after a number of the size's calls, counted alike on every
 * rank, the first race's contenders race again by the same rule for
 * RF_RECHECK_EPOCHS epochs (up to RF_EPOCHS where those hold fewer rounds than
 * the 3 % rule needs), over their new rounds only, and the kept one changes
 * only where it ran clearly slower than the fastest or 3 % behind it. Every
 * rank runs the same calls in the same order and agrees on the same bytes, so
 * all take the same algorithm at every call. The cost: below RF_MAX_S about
 * RF_EPOCHS x RF_EPOCH_S = 0.15 s of calls per size at most (more where
 * RF_MIN_ROUNDS rounds of the contenders do not fit an epoch), of which the
 * slower contenders' share runs up to RF_NEAR_SMALL times the best's time (a
 * neighbour's fastest more, out at the probe where clearly slower); from
 * RF_MAX_S RF_EPOCHS x RF_MIN_ROUNDS
 * rounds at most, the others within RF_NEAR by formation's times, one
 * clearly slower out after RF_MIN_ROUNDS of its calls (at most half a
 * call over the best's each); a clear call ends after the first epoch, or at
 * its probe (7 rounds) where the epoch holds 12 or more. The first re-check
 * comes RF_RECHECK_SPAN times RF_RECHECK_EPOCHS epochs' calls of the others
 * after the keep (a re-check that holds more epochs, to reach 32 rounds below
 * RF_MAX_S, gives the others up to twice that share: 1 / 4 of the calls at
 * most, each others' call clearly slower out after one epoch), each next one
 * RF_RECHECK_GROW times further, so its share of the calls falls geometrically.
 * Each keep logs the others' calls so far and their agreed time over the
 * fastest's.
 */
#define RF_SLOTS          16     /* sizes refined (the first ones met) */
#define RF_RACE           5      /* contenders at most (below RF_MAX_S) */
#define RF_RACE_NEAR      4      /* of them by formation's times here */
#define RF_ROUNDS         31     /* rounds per epoch at most (RF_EPOCH_S) */
#define RF_MIN_ROUNDS     5      /* rounds per epoch at least */
#define RF_EPOCH_S        0.0375 /* an epoch's time, about */
#define RF_EPOCHS         4      /* epochs at most */
#define RF_NEAR           1.5  /* formation's contenders: this near its best */
#define RF_NEAR_SMALL     2.0  /* below RF_MAX_S */
#define RF_NEAR_BIG       1.2  /* from RF_MAX_S, beyond the runner-up */
#define RF_MAX_S          2e-3 /* sizes whose best call formation timed below */
#define RF_RECHECK_EPOCHS 2    /* a re-check's epochs at most */
#define RF_RECHECK_SPAN   8    /* the first re-check after this many times */
                               /* the calls one can give the others */
#define RF_RECHECK_GROW 2      /* each next one this many times further */
#define RF_TAG          0xfffffe00u /* the exchange's tags, + its step */
_Static_assert(RF_EPOCHS *RF_ROUNDS <= COLL_MEAS_RUNS_MAX, "coll-internal.h");

struct refine {
    size_t bytes;
    int race[RF_RACE]; /* the contenders, the fastest first */
    int k;             /* how many */
    int rounds;        /* per epoch */
    int epoch, pos;    /* the current epoch, the next call in it */
    int done;          /* its rounds agreed at its probe (0: none yet) */
    int epochs;        /* this race's epochs at most */
    int big;           /* formation's best call took RF_MAX_S or more */
    /* this rank's times of each contender (by its place in race) over
     * every epoch's rounds so far (s) */
    double t[RF_RACE][RF_EPOCHS * RF_ROUNDS];
    _Atomic int choice; /* the winner, once kept (0: still racing) */
    /* the re-checks of a kept winner (refine_recheck) */
    int cand[RF_RACE]; /* the first race's contenders */
    int ncand;
    int racing;             /* a race or a re-check runs */
    int resume;             /* the next re-check adds to the last one's */
    uint64_t calls;         /* the size's calls since the first keep */
    uint64_t next_check;    /* the call that starts the next re-check */
    uint64_t gap;           /* calls from one re-check to the next */
    uint64_t others_calls;  /* the re-checks' calls of the others, */
    double others_excess_s; /* and their time over the kept one's */
    _Atomic int rechecks;   /* re-checks done */
};

struct bufent {
    void *ptr;
    size_t len;
    mesh_mr_t *mr; /* registered by the engine at first use */
    int owned;     /* from mesh_coll_buf_alloc (else the caller's memory) */
    int shared;    /* owned, from the transport's host_alloc */
};

struct mesh_coll {
    const struct mesh_transport_ops *ops;
    mesh_transport_t *t;
    const struct mesh_world *w;
    struct mesh_coll_opts opts;
    struct mesh_coll_model model;
    struct coll_shape shape; /* what the cost model knows (model, shapes) */
    struct coll_hosts hosts; /* the transport's hosts (hier) */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t qcv; /* the engine waits for work */
    pthread_cond_t dcv; /* callers wait for completions */
    struct mesh_coll_req *head, *tail;
    int stop;
    int busy; /* a request is running (on the engine or inline) */
    uint64_t next_seq;
    struct bufent *bufs;
    int nbufs;
    size_t capbufs;

    /* engine only */
    size_t auto_bytes; /* AUTO's last all-reduce size and choice */
    int auto_algo;     /* (0: none yet) */
    /* AUTO's refinement of formation's choice (refine_*): its sizes,
     * written by the engine; read elsewhere once nrf says so */
    struct refine rf[RF_SLOTS];
    _Atomic int nrf;
    int failed_rc;
    char failed_msg[1024];
    void *scratch;
    size_t scratch_len;
    mesh_mr_t *scratch_mr;
    double meas_alpha, meas_beta; /* this rank's own measurement */
};

const char *mesh_algo_name(int algo)
{
    const struct coll_algo *e = coll_algo_get(algo);

    return e ? e->name : "unknown-algo";
}

int mesh_algo_parse(const char *s, int *out)
{
    char names[256] = "";
    size_t used = 0;

    for (size_t i = 0; s && i < coll_nalgos; i++)
        if (!strcmp(s, coll_algos[i].name)) {
            *out = coll_algos[i].id;
            return 0;
        }
    for (size_t i = 0; i < coll_nalgos && used < sizeof(names); i++)
        used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
                                 i ? ", " : "", coll_algos[i].name);
    return mesh_err(-EINVAL, "unknown algorithm '%s' (%s)", s ? s : "", names);
}

void mesh_coll_opts_init(struct mesh_coll_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->algo = MESH_ALGO_AUTO;
    o->measure = 1;
    o->measure_bytes = 4u << 20;
    o->measure_budget_s = MEAS_BUDGET_S;
    o->seq_base = MESH_COLL_SEQ_BASE;
    o->host_shared = 1;
}

/* ---- pinned host memory -------------------------------------------------- */

/* Pinned memory from the options' allocator, else mesh_host_alloc's
 * page-aligned mlock'ed memory (which logs a fallback). */
static int pinned_alloc(const mesh_coll_t *c, size_t len, void **out)
{
    const struct mesh_host_allocator *a = c->opts.host_alloc;

    return a ? a->alloc(a->arg, len, out) : mesh_host_alloc(len, out);
}

static void pinned_free(const mesh_coll_t *c, void *p, size_t len)
{
    const struct mesh_host_allocator *a = c->opts.host_alloc;

    if (!p)
        return;
    if (a)
        a->free(a->arg, p, len);
    else
        mesh_host_free(p, len);
}

/* ---- engine-side helpers ------------------------------------------------- */

/* The registration covering [p, p + len), registering a known buffer at
 * first use; *tmp = 1 when p is foreign memory registered for this call. */
static int find_mr(struct mesh_coll *c, const void *p, size_t len,
                   mesh_mr_t **mr, int *tmp)
{
    const char *q = p;
    struct bufent *hit = NULL;
    int rc = 0;

    *mr = NULL;
    *tmp = 0;
    if (!p || !len)
        return 0;
    if (q >= (const char *)c->scratch &&
        q + len <= (const char *)c->scratch + c->scratch_len) {
        *mr = c->scratch_mr;
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nbufs; i++) {
        const char *b = c->bufs[i].ptr;

        if (q >= b && q + len <= b + c->bufs[i].len) {
            hit = &c->bufs[i];
            break;
        }
    }
    if (hit && !hit->mr)
        rc = c->ops->reg_mr(c->t, hit->ptr, hit->len, &hit->mr);
    if (hit && rc == 0)
        *mr = hit->mr;
    pthread_mutex_unlock(&c->mu);
    if (hit || rc < 0)
        return rc;
    rc = c->ops->reg_mr(c->t, (void *)p, len, mr);
    if (rc == 0)
        *tmp = 1;
    return rc;
}

static int scratch_reserve(struct mesh_coll *c, size_t need)
{
    size_t len;
    void *p;
    int rc;
    mesh_mr_t *mr;

    if (need <= c->scratch_len)
        return 0;
    len = MESH_MAX(need, (size_t)1 << 20);
    len = (len + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    rc = pinned_alloc(c, len, &p);
    if (rc < 0)
        return mesh_err_prefix(rc, "scratch of %zu bytes", len);
    rc = c->ops->reg_mr(c->t, p, len, &mr);
    if (rc < 0) {
        pinned_free(c, p, len);
        return mesh_err_prefix(rc, "registering scratch");
    }
    if (c->scratch_mr)
        c->ops->dereg_mr(c->t, c->scratch_mr);
    pinned_free(c, c->scratch, c->scratch_len);
    c->scratch = p;
    c->scratch_len = len;
    c->scratch_mr = mr;
    return 0;
}

/* ---- the choice of algorithm --------------------------------------------- */

/*
 * An algorithm's time for bytes from the all-reduces timed at create: on
 * the line through the measured sizes around bytes, so exactly the time
 * measured at a measured size (below the first, its time; beyond the
 * last, on the line through the last two, never falling; beyond a single
 * one, unknown: a 32-byte time says nothing of a bucket's). -1 when it is no
 * candidate there: not timed at the measured size at or above bytes (dropped
 * from the measurement), or no choice here at all (its model says so), or
 * nothing was timed.
 */
static double measured_cost(const mesh_coll_t *c, int id, double bytes)
{
    const struct mesh_coll_model *m = &c->model;
    int np = m->npoints, k, beyond;
    double x0, x1, t0, t1;

    if (np < 1)
        return -1;
    for (k = 0; k < np && (double)m->point_bytes[k] < bytes; k++)
        ;
    if (k == 0) /* at or below the first size */
        return m->point_s[0][id] > 0 ? m->point_s[0][id] : -1;
    if (np == 1 && k == np)
        return -1; /* no line beyond a single size: the model decides */
    beyond = k == np;
    k = MESH_MIN(k, np - 1);
    if (m->point_s[k][id] <= 0 || m->point_s[k - 1][id] <= 0)
        return -1;
    x0 = (double)m->point_bytes[k - 1];
    x1 = (double)m->point_bytes[k];
    t0 = m->point_s[k - 1][id];
    t1 = m->point_s[k][id];
    if (beyond) /* the last two sizes' line, never falling */
        return t1 + MESH_MAX(t1 - t0, 0) / (x1 - x0) * (bytes - x1);
    return t0 + (t1 - t0) / (x1 - x0) * (bytes - x0);
}

/* Whether AUTO may choose id on this communicator (its model says so). */
static int auto_candidate(const mesh_coll_t *c, const struct coll_algo *e)
{
    return e->cost && e->cost(&c->shape, 32) < 1e29;
}

int mesh_coll_auto_algos(const mesh_coll_t *c, int *ids)
{
    int n = 0;

    for (size_t i = 0; i < coll_nalgos; i++)
        if (auto_candidate(c, &coll_algos[i]))
            ids[n++] = coll_algos[i].id;
    return n;
}

/* The refinement of bytes, or NULL (none yet). */
static struct refine *refine_find(const mesh_coll_t *c, size_t bytes)
{
    int n =
        atomic_load_explicit(&((mesh_coll_t *)c)->nrf, memory_order_acquire);

    for (int i = 0; i < n; i++)
        if (c->rf[i].bytes == bytes)
            return (struct refine *)&c->rf[i];
    return NULL;
}

int mesh_coll_auto_refined(const mesh_coll_t *c, size_t bytes)
{
    const struct refine *r = c ? refine_find(c, bytes) : NULL;

    return r ? atomic_load(&r->choice) : 0;
}

int mesh_coll_auto_rechecks(const mesh_coll_t *c, size_t bytes)
{
    const struct refine *r = c ? refine_find(c, bytes) : NULL;

    return r ? atomic_load(&r->rechecks) : 0;
}

int mesh_coll_algo_for(const mesh_coll_t *c, int algo, size_t bytes)
{
    double best_cost = 0;
    int best = -1, timed = 0, kept;

    if (algo == MESH_ALGO_AUTO)
        algo = c->opts.algo;
    if (algo != MESH_ALGO_AUTO)
        return algo;
    kept = mesh_coll_auto_refined(c, bytes);
    if (kept > 0)
        return kept;
    /* the measured times, where any algorithm has one at this size */
    for (size_t i = 0; i < coll_nalgos; i++) {
        const struct coll_algo *e = &coll_algos[i];
        double cost;

        if (!auto_candidate(c, e))
            continue;
        cost = measured_cost(c, e->id, (double)bytes);
        if (cost < 0)
            continue;
        timed = 1;
        if (best < 0 || cost < best_cost) {
            best = e->id;
            best_cost = cost;
        }
    }
    if (timed)
        return best;
    return coll_model_choice(&c->shape, (double)bytes);
}

/* Broadcast: a chain (ring) or the binary tree, by the same numbers. */
int mesh_coll_bcast_algo_for(const mesh_coll_t *c, int algo, size_t bytes)
{
    const struct mesh_coll_model *m = &c->model;
    double n = c->w->size, b = (double)bytes, chain, tree;

    if (algo == MESH_ALGO_AUTO)
        algo = c->opts.algo;
    if (algo == MESH_ALGO_TREE)
        return MESH_ALGO_TREE;
    if (algo != MESH_ALGO_AUTO)
        return MESH_ALGO_RING;
    chain = (n - 1) * m->alpha_s + b * m->beta_s_per_byte +
            (n - 2) * MESH_MIN(coll_chunk_of(b), b) * m->beta_s_per_byte;
    tree = c->shape.tree_depth * m->alpha_s + 2 * b * m->beta_s_per_byte +
           c->shape.tree_depth * MESH_MIN(coll_chunk_of(b), b) *
               m->beta_s_per_byte;
    return tree < chain ? MESH_ALGO_TREE : MESH_ALGO_RING;
}

void mesh_coll_model_get(const mesh_coll_t *c, struct mesh_coll_model *out)
{
    *out = c->model;
}

/* ---- AUTO's refinement (struct refine) ----------------------------------- */

/*
 * Keep algo for r's size (the end of its race or of a re-check), and
 * plan the next re-check: the first after RF_RECHECK_SPAN times the
 * calls that one re-check can give the others (so their excess over the
 * kept one's time costs at most 1 / RF_RECHECK_SPAN of it), each next
 * one RF_RECHECK_GROW times further. Logged with what the races cost.
 */
static void refine_keep(struct refine *r, int algo, const char *why, int runs)
{
    int was = atomic_load(&r->choice), n;
    char what[64] = "";

    r->racing = 0;
    atomic_store(&r->choice, algo);
    if (!was && r->ncand > 1) {
        r->gap = (uint64_t)RF_RECHECK_SPAN * RF_RECHECK_EPOCHS *
                 (uint64_t)r->rounds * (uint64_t)(r->ncand - 1);
        r->next_check = r->gap;
    } else if (was) {
        r->gap = MESH_MIN(r->gap * RF_RECHECK_GROW, (uint64_t)1 << 40);
        r->next_check = r->calls + r->gap;
        n = atomic_fetch_add(&r->rechecks, 1) + 1;
        snprintf(what, sizeof(what), "re-check %d at call %" PRIu64 ": ", n,
                 r->calls);
    }
    mesh_info("collectives: auto all-reduce of %zu bytes: %s%s, kept %s, "
              "after %d rounds (the others ran %" PRIu64 " calls of the "
              "races, %.1f ms over the fastest's time; next re-check "
              "%s%" PRIu64 ")",
              r->bytes, what, mesh_algo_name(algo), why, runs, r->others_calls,
              r->others_excess_s * 1e3, r->gap ? "at call " : "none",
              r->gap ? r->next_check : 0);
}

/*
 * Start a re-check of r's kept winner (engine, at the same call on every
 * rank): the first race's contenders take turns again, the kept one
 * first, for RF_RECHECK_EPOCHS epochs by the race's rule (more where
 * that many hold fewer rounds than the 3 % rule needs), over their new
 * rounds only (the ranking of the race's first second can differ from
 * later: on 8 namespace hosts at 16 KiB every rank kept rhd after 4
 * epochs, which then ran 1.2 times the tree); refine_agree changes the
 * choice only where the kept one ran clearly slower, or 3 % behind over
 * enough rounds (coll_race_decide). Where
 * the last re-check ended with none clearly faster, this one adds its
 * rounds to that one's (while RF_EPOCHS x RF_ROUNDS rounds fit, then
 * afresh): a gap too small for 2 epochs to show can show over more (on
 * 8 namespace hosts at 64 KiB the judge had rhd, kept, 1.15 times the
 * tree over 783 rounds, and a re-check of 16 rounds did not show it).
 */
static void refine_recheck(struct refine *r)
{
    int kept = atomic_load(&r->choice), need, ep;

    /*
     * Enough epochs for coll_race_decide's 3 % rule to move the choice
     * in this re-check (COLL_RACE_BEHIND_RUNS rounds, or
     * COLL_RACE_RECHECK_RUNS_BIG), where the epochs are short: a kept one that
     * the first re-check could not move ran on at 1.12 times the tree to the
     * second (8 namespace hosts, 64 KiB: from call 289 to 866 of the judge's
     * 2052).
     */
    need = r->big ? COLL_RACE_RECHECK_RUNS_BIG : COLL_RACE_BEHIND_RUNS;
    ep = MESH_MAX(RF_RECHECK_EPOCHS, (need + r->rounds - 1) / r->rounds);
    ep = MESH_MIN(ep, RF_EPOCHS);
    r->racing = 1;
    r->pos = 0;
    r->done = 0;
    if (r->resume && (r->epoch + ep) * r->rounds <= RF_EPOCHS * RF_ROUNDS) {
        r->epochs = r->epoch + ep;
        return;
    }
    r->k = 0;
    r->race[r->k++] = kept;
    for (int i = 0; i < r->ncand; i++)
        if (r->cand[i] != kept)
            r->race[r->k++] = r->cand[i];
    r->epoch = 0;
    r->epochs = ep;
}

/*
 * Formation's fastest at the timed size next to bytes (side 0: the
 * largest below it, 1: the smallest above it), or -1 (none timed there).
 */
static int point_winner(const mesh_coll_t *c, size_t bytes, int side,
                        const int *ids, int nauto)
{
    const struct mesh_coll_model *m = &c->model;
    int p = -1, w = -1;

    for (int i = 0; i < m->npoints; i++)
        if (side == 0 ? m->point_bytes[i] < bytes &&
                            (p < 0 || m->point_bytes[i] > m->point_bytes[p])
                      : m->point_bytes[i] > bytes &&
                            (p < 0 || m->point_bytes[i] < m->point_bytes[p]))
            p = i;
    for (int a = 0; p >= 0 && a < nauto; a++)
        if (m->point_s[p][ids[a]] > 0 &&
            (w < 0 || m->point_s[p][ids[a]] < m->point_s[p][w]))
            w = ids[a];
    return w;
}

/*
 * The refinement of an AUTO all-reduce of bytes (engine only): found, or
 * begun for a size met the first time while slots are left, from
 * formation's times (the same on every rank); NULL where nothing was
 * timed or no slot is left.
 */
static struct refine *refine_get(mesh_coll_t *c, size_t bytes)
{
    struct refine *r = refine_find(c, bytes);
    int n = atomic_load(&c->nrf), ids[MESH_ALGO_LAST + 1], nauto, first;
    double best, sum;

    if (r || !c->model.measured || n >= RF_SLOTS)
        return r;
    r = &c->rf[n];
    memset(r, 0, sizeof(*r));
    r->bytes = bytes;
    first = mesh_coll_algo_for(c, MESH_ALGO_AUTO, bytes);
    r->race[r->k++] = first;
    best = sum = measured_cost(c, first, (double)bytes);
    nauto = mesh_coll_auto_algos(c, ids);
    /*
     * The others near formation's best, the nearest first, up to
     * RF_RACE_NEAR in all (the exchange's tags: RF_TAG + up to 510
     * steps): from RF_MAX_S the runner-up within RF_NEAR and the others
     * within RF_NEAR_BIG (was 5 %), where formation's few rounds can
     * rank far behind a best that the job's calls then find slower (16
     * MiB on 2 namespace hosts under a load of 15-22: direct 1.45 times
     * ahead at formation, 1.36 times the fastest after; 4 ranks on
     * loopback at 4 MiB under a load of 21-24: local and hrd within 1 %
     * at formation, hier 1.15 times them and left out of the race, then
     * 3.7 % ahead of hrd, kept, by the judge's medians), and a winner
     * that raced nobody is never re-checked; not all within RF_NEAR
     * there (2 namespace hosts, 64 MiB: direct and rd at 1.28 and 1.43
     * times rhd raced 10 rounds, 30 of the judge's 57 calls of auto,
     * which came out 1.142 ?). Below RF_MAX_S within RF_NEAR_SMALL:
     * 4 ranks on loopback at 256 KiB under a load of 20-28, formation had
     * hier 1.62 and 1.64 times local and hrd, its fastest, in 2 runs of
     * 4, and the judge then had hier the fastest, 1.05 and 1.08 times the
     * htree kept (formation times in place, the judge out of place; on
     * this machine in place ran hier and htree slower, local faster).
     * One clearly slower is out after one epoch: RF_MIN_ROUNDS of its
     * calls, each at most RF_NEAR times the best's, or at the probe below
     * RF_MAX_S (7 calls, each at most RF_NEAR_SMALL times the best's).
     */
    while (best > 0 && r->k < RF_RACE_NEAR && c->w->size <= 511) {
        double next = 0, lim = (best <= RF_MAX_S ? RF_NEAR_SMALL
                                : r->k == 1      ? RF_NEAR
                                                 : RF_NEAR_BIG) *
                               best;
        int pick = -1;

        for (int a = 0; a < nauto; a++) {
            double t = measured_cost(c, ids[a], (double)bytes);
            int in = 0;

            for (int j = 0; j < r->k; j++)
                in |= r->race[j] == ids[a];
            if (!in && t > 0 && t <= lim && (pick < 0 || t < next)) {
                pick = ids[a];
                next = t;
            }
        }
        if (pick < 0)
            break;
        r->race[r->k++] = pick;
        sum += next;
    }
    /*
     * Where a place is left, formation's fastest at the timed sizes
     * either side races too, however it was timed at this one: one
     * size's few rounds under a burst of load can rank the fastest far
     * behind (4 ranks on loopback at 1 MiB: hier 2.7 times htree at
     * formation, the fastest at 256 KiB and 4 MiB, and 1.07 times
     * faster than htree over the 2667 rounds after). Below RF_MAX_S a
     * place is kept for it beyond RF_RACE_NEAR: formation ranked hier
     * fourth to sixth at 1 MiB in 6 runs of 6 (1.4 to 3.1 times htree
     * there, the fastest at 256 KiB or 4 MiB), where the judge then had
     * it 2 to 3 % ahead of the htree kept; one clearly slower is out at
     * the probe.
     */
    for (int side = 0; side < 2 && best > 0 && c->w->size <= 511; side++) {
        int w = point_winner(c, bytes, side, ids, nauto), in = 0;
        double t = w > 0 ? measured_cost(c, w, (double)bytes) : 0;

        for (int j = 0; j < r->k; j++)
            in |= r->race[j] == w;
        if (r->k < (best > RF_MAX_S ? RF_RACE_NEAR : RF_RACE) && !in && t > 0) {
            r->race[r->k++] = w;
            sum += t;
        }
    }
    r->rounds = best > 0 ? (int)MESH_MIN(RF_EPOCH_S / sum, RF_ROUNDS) : 0;
    r->rounds = MESH_MAX(r->rounds, RF_MIN_ROUNDS);
    r->epochs = RF_EPOCHS;
    r->big = best > RF_MAX_S;
    memcpy(r->cand, r->race, sizeof(r->cand));
    r->ncand = r->k;
    r->racing = r->k > 1;
    atomic_store(&r->choice, r->k == 1 ? first : 0);
    atomic_store_explicit(&c->nrf, n + 1, memory_order_release);
    return r;
}

/* Which contender the next call of r runs (its index in r->race). */
static int refine_turn(const struct refine *r)
{
    int order[RF_RACE], round = r->pos / r->k;

    mesh_shuffle(order, r->k,
                 (unsigned)(r->epoch * r->rounds + round) * 2654435761u + 1);
    return order[r->pos % r->k];
}

/*
 * Whether contender a ran clearly slower than contender b over runs
 * rounds (all: nranks vectors of stride floats, each contender's runs
 * from HEAD on): the slowest rank's time of each run, the ratio a / b
 * within each round, and the lower end of the 95 % interval of their
 * median (order statistics, as meshbench --rotate's judge takes them)
 * above 1. With 5 rounds that is a slower in all 5; a contender that only
 * looked 3 % slower in a few rounds races on (on 8 namespace hosts under
 * load, 5 rounds of 4 ms once ranked the ring first and the tree over 3 %
 * behind, which ran 1.47 times faster over the seconds after).
 */
static int refine_slower(const float *all, int nranks, size_t stride, int runs,
                         int a, int b)
{
    float x[COLL_MEAS_RUNS_MAX];
    int j = (int)floor(runs / 2.0 - 0.98 * sqrt((double)runs));

    for (int i = 0; i < runs; i++) {
        float ta = 0, tb = 0, y;
        int q;

        for (int r = 0; r < nranks; r++) {
            const float *v = all + (size_t)r * stride + COLL_MEAS_HEAD;

            ta = MESH_MAX(ta, v[(size_t)a * (size_t)runs + (size_t)i]);
            tb = MESH_MAX(tb, v[(size_t)b * (size_t)runs + (size_t)i]);
        }
        y = tb > 0 ? ta / tb : 1;
        for (q = i - 1; q >= 0 && x[q] > y; q--) /* sorted as they come */
            x[q + 1] = x[q];
        x[q + 1] = y;
    }
    return runs > 0 && x[MESH_MAX(j - 1, 0)] > 1.0f;
}

/*
 * See coll-internal.h. The 3 % rule (a median ratio over COLL_RACE_BEHIND
 * from COLL_RACE_BEHIND_RUNS rounds) is what moves a kept winner that
 * runs a few % behind: "clearly slower" needs the gap to show in nearly
 * every round, which a few % under load does not (on 8 namespace hosts
 * the judge had rhd, kept, 7.5 to 12.6 % behind the tree over 1500
 * rounds, and re-checks of 16 and 32 rounds did not find it clearly
 * slower). Below 2 ms a call (small: noisy, cheap) it waits for 32
 * rounds: a re-check that went by the median over 10 rounds there moved
 * from the tree to rhd, which then ran 1.09 times the tree. From 2 ms
 * (big: a call's excess is the job's time) 10 rounds: a contender that
 * stays a few % behind is out of the race there (on 2 namespace hosts at
 * 64 MiB the tree, 1.08 times rhd, raced 29 calls without being clearly
 * slower). A re-check moves a kept winner by it only from 20 rounds there:
 * one that already won a race needs more to lose it than a contender to
 * drop out (2 namespace hosts at 64 MiB: a re-check's 10 rounds moved
 * from the ring to rhd, 2.7 % slower by the judge's medians, and the next
 * moved back 160 calls later; auto/best 1.020).
 */
int coll_race_decide(const float *all, const float *v, int nranks, int k,
                     int runs, int kept, int big, int last, int *on, int *why)
{
    enum { HEAD = COLL_MEAS_HEAD };
    size_t stride = (size_t)HEAD + (size_t)k * (size_t)runs;
    int best = 0, nk = 0, slower = 0;
    int need = big ? COLL_RACE_BEHIND_RUNS_BIG : COLL_RACE_BEHIND_RUNS;
    int need_kept = big ? COLL_RACE_RECHECK_RUNS_BIG : COLL_RACE_BEHIND_RUNS;

    for (int a = 1; a < k; a++)
        if (v[HEAD + a] < v[HEAD + best])
            best = a;
    for (int a = 0; a < k; a++) {
        int out = 0;

        if (a != best) {
            slower = refine_slower(all, nranks, stride, runs, a, best);
            out = slower ||
                  (runs >= (a == kept ? need_kept : need) &&
                   v[HEAD + a] > COLL_RACE_BEHIND * (double)v[HEAD + best]);
            if (a == kept && out)
                *why = slower ? COLL_RACE_SLOWER : COLL_RACE_BEHIND_IT;
        }
        on[a] = !out;
        nk += on[a];
    }
    if (kept >= 0 && !on[kept])
        return best;
    if (nk == 1) {
        *why = COLL_RACE_CLEAR;
        return best;
    }
    if (last) {
        *why = kept >= 0 ? COLL_RACE_NONE : COLL_RACE_FASTEST;
        return kept >= 0 ? kept : best;
    }
    return -1;
}

/*
 * The end of r's epoch, or its probe (coll_race_probe; every rank at the
 * same call, seq): the ranks' times of every round so far by a ring
 * all-gather (tags RF_TAG + step, after the call's own frames), the
 * agreed ranking over all of them, the contenders that race on (at a
 * probe, to the epoch's end) or the winner.
 */
static int refine_agree(mesh_coll_t *c, struct refine *r, uint64_t seq)
{
    enum { HEAD = COLL_MEAS_HEAD };
    int n = c->w->size, me = c->w->rank, k = r->k;
    int at = r->pos / r->k, probe = at < r->rounds; /* this epoch's rounds */
    int runs = r->epoch * r->rounds + at;
    size_t stride = (size_t)HEAD + (size_t)k * (size_t)runs, vb, len;
    int live[RF_RACE], prev = -1, rc, best = -1, race[RF_RACE], nk = 0;
    int was = atomic_load(&r->choice), kept = -1, on[RF_RACE], keep, why = 0;
    double t[RF_RACE][RF_EPOCHS * RF_ROUNDS];
    static const char *const why_str[] = {
        [COLL_RACE_SLOWER] = "as the one kept ran clearly slower",
        [COLL_RACE_BEHIND_IT] = "as the one kept ran 3 % behind it",
        [COLL_RACE_CLEAR] = "as the others ran clearly slower or 3 % behind",
        [COLL_RACE_NONE] = "as none ran clearly faster",
        [COLL_RACE_FASTEST] = "as the fastest over every epoch",
    };
    float *all, v[HEAD + RF_RACE];
    struct sched s;

    vb = stride * sizeof(float);
    rc = scratch_reserve(c, MESH_MAX(c->scratch_len, (size_t)n * vb));
    if (rc < 0)
        return rc;
    all = c->scratch;
    memset(all + (size_t)me * stride, 0, vb);
    for (int a = 0; a < k; a++) {
        live[a] = 1;
        if (was && r->race[a] == was)
            kept = a;
        for (int i = 0; i < runs; i++)
            all[(size_t)me * stride + HEAD + (size_t)a * (size_t)runs + i] =
                (float)(r->t[a][i] * 1e6);
    }
    len = vb;
    sched_init(&s, seq, MESH_OP_P2P, MESH_DT_BYTE, len);
    for (int i = 0; i < n - 1; i++) {
        int sb = (me - i + n) % n, rb = (me - i - 1 + n) % n;
        int snd = sched_send(&s, (me + 1) % n, RF_TAG + (uint32_t)i, 0,
                             all + (size_t)sb * stride, len, c->scratch_mr);

        sched_dep(&s, prev, snd);
        prev = sched_recv(&s, (me - 1 + n) % n, RF_TAG + (uint32_t)i, 0,
                          all + (size_t)rb * stride, len, c->scratch_mr);
    }
    rc = s.failed ? mesh_err(-ENOMEM, "out of memory building a schedule")
                  : sched_run(&s, c->ops, c->t);
    sched_free(&s);
    if (rc < 0)
        return mesh_err_prefix(rc, "auto's refinement at %zu bytes", r->bytes);
    coll_meas_agree(all, n, live, k, runs, v);
    keep = coll_race_decide(all, v, n, k, runs, kept, r->big,
                            !probe && r->epoch + 1 == r->epochs, on, &why);
    for (int a = 0; a < k; a++)
        if (on[a] && (best < 0 || v[HEAD + a] < v[HEAD + best]))
            best = a;
    /* what the others' calls since the last agreement cost (the agreed
     * medians) */
    for (int a = 0; a < k; a++)
        if (a != best) {
            r->others_calls += (uint64_t)(at - r->done);
            r->others_excess_s +=
                (at - r->done) * (v[HEAD + a] - v[HEAD + best]) * 1e-6;
        }
    keep = keep >= 0 ? r->race[keep] : 0;
    /* the contenders that race on, the fastest first, with their times */
    race[nk] = r->race[best];
    memcpy(t[nk++], r->t[best], sizeof(t[0]));
    for (int a = 0; a < k; a++)
        if (a != best && on[a]) {
            race[nk] = r->race[a];
            memcpy(t[nk++], r->t[a], sizeof(t[0]));
        }
    memcpy(r->race, race, sizeof(race));
    memcpy(r->t, t, (size_t)nk * sizeof(t[0]));
    r->k = nk;
    if (probe) { /* the rest of the epoch, those left */
        r->done = at;
        r->pos = at * nk;
    } else {
        r->epoch++;
        r->pos = 0;
        r->done = 0;
    }
    /*
     * A re-check (was: the kept one) that ends with none clearly faster
     * lets the next one add its rounds to this one's (refine_recheck).
     */
    r->resume = keep && why == COLL_RACE_NONE;
    if (keep)
        refine_keep(r, keep, why_str[why], runs);
    return 0;
}

/* ---- running one request ------------------------------------------------- */

static const char *req_what(const struct mesh_coll_req *q, char *buf,
                            size_t len)
{
    char sq[48];

    snprintf(buf, len, "%s (%s; %s, %zu x %s)", mesh_op_name(q->a.op),
             mesh_seq_str(q->seq, sq, sizeof(sq)), mesh_algo_name(q->algo),
             q->a.count, mesh_dtype_name(q->a.dtype));
    return buf;
}

/* Ping-pong (latency) and streams (bandwidth) to the ring neighbours. */
static int run_measure(struct mesh_coll *c, struct mesh_coll_req *q)
{
    enum { PINGS = 20, STREAMS = 4 };
    const size_t mlen = (size_t)2 << 20;
    int n = c->w->size, r = c->w->rank, right = (r + 1) % n,
        left = (r + n - 1) % n, rc;
    struct sched s;
    double t0, tping = 0, tstream = 0;
    char *buf;

    rc = scratch_reserve(c, 2 * mlen);
    if (rc < 0)
        return rc;
    buf = c->scratch;
    for (int phase = 0; phase < 2; phase++) {
        int rounds = phase == 0 ? PINGS : STREAMS, prev = -1;
        size_t len = phase == 0 ? 8 : mlen;

        sched_init(&s, q->seq + (uint64_t)phase, MESH_OP_P2P, MESH_DT_BYTE,
                   len);
        for (int i = 0; i < rounds; i++) {
            int snd =
                sched_send(&s, right, (uint32_t)i, 0, buf, len, c->scratch_mr);

            sched_dep(&s, prev, snd);
            prev = sched_recv(&s, left, (uint32_t)i, 0, buf + mlen, len,
                              c->scratch_mr);
        }
        t0 = mesh_now_s();
        rc = sched_run(&s, c->ops, c->t);
        sched_free(&s);
        if (rc < 0)
            return mesh_err_prefix(rc, "measuring the links");
        if (phase == 0)
            tping = (mesh_now_s() - t0) / PINGS;
        else
            tstream = (mesh_now_s() - t0) / STREAMS;
    }
    c->meas_alpha = tping;
    c->meas_beta = MESH_MAX(tstream - tping, 1e-9) / (double)mlen;
    return 0;
}

static int run_coll(struct mesh_coll *c, struct mesh_coll_req *q)
{
    struct coll_args *a = &q->a;
    const struct coll_algo *algo;
    size_t es = mesh_dtype_size(a->dtype), sbytes, rbytes, need = 0;
    int stmp = 0, rtmp = 0, rc, turn = -1;
    struct refine *rf = NULL;
    double t0 = 0;
    struct sched s;

    switch (a->op) {
    case MESH_OP_REDUCE_SCATTER:
        sbytes = (size_t)a->size * a->count * es;
        rbytes = a->count * es;
        break;
    case MESH_OP_ALLGATHER:
        sbytes = a->count * es;
        rbytes = (size_t)a->size * a->count * es;
        break;
    default:
        sbytes = rbytes = a->count * es;
        break;
    }
    if (a->op == MESH_OP_ALLREDUCE) {
        int asked = q->algo;

        /*
         * The size of the last AUTO all-reduce (a sweep, a bucket): its
         * choice again, without going through every candidate's costs,
         * which took about 0.2 us a call: 13 % of a 4 KiB all-reduce's
         * 1.5 us between 2 ranks over shared memory.
         */
        if (asked == MESH_ALGO_AUTO && c->opts.algo == MESH_ALGO_AUTO &&
            (rf = refine_get(c, a->count * es))) {
            /* a kept winner's calls, counted alike on every rank */
            if (!rf->racing && rf->gap && rf->calls++ == rf->next_check)
                refine_recheck(rf);
            if (rf->racing) {
                turn = refine_turn(rf);
                q->algo = rf->race[turn];
                t0 = mesh_now_s();
            } else {
                q->algo = atomic_load(&rf->choice);
            }
        } else if (asked == MESH_ALGO_AUTO && c->auto_algo &&
                   c->auto_bytes == a->count * es) {
            q->algo = c->auto_algo;
        } else {
            q->algo = mesh_coll_algo_for(c, asked, a->count * es);
            if (asked == MESH_ALGO_AUTO) {
                c->auto_bytes = a->count * es;
                c->auto_algo = q->algo;
            }
        }
    } else if (a->op == MESH_OP_BROADCAST)
        q->algo = mesh_coll_bcast_algo_for(c, q->algo, a->count * es);
    algo = coll_algo_get(q->algo);
    if (a->op == MESH_OP_ALLREDUCE)
        need = algo->scratch(a);
    else if (a->op == MESH_OP_REDUCE_SCATTER)
        need = coll_ring_scratch(a);
    rc = scratch_reserve(c, need);
    if (rc < 0)
        return rc;
    rc = find_mr(c, a->sendbuf, sbytes, &a->send_mr, &stmp);
    if (rc < 0)
        return mesh_err_prefix(rc, "registering the send buffer");
    if (a->recvbuf == a->sendbuf && rbytes == sbytes) {
        a->recv_mr = a->send_mr;
    } else {
        rc = find_mr(c, a->recvbuf, rbytes, &a->recv_mr, &rtmp);
        if (rc < 0) {
            rc = mesh_err_prefix(rc, "registering the receive buffer");
            goto dereg;
        }
    }
    sched_init(&s, q->seq, a->op, a->dtype, a->count);
    if (a->size == 1) {
        if (a->op != MESH_OP_BARRIER && a->sendbuf != a->recvbuf)
            sched_copy(&s, a->recvbuf, a->sendbuf, a->count * es);
    } else {
        switch (a->op) {
        case MESH_OP_ALLREDUCE:
            rc = algo->allreduce(&s, a, c->scratch, c->scratch_mr);
            break;
        case MESH_OP_REDUCE_SCATTER:
            rc = coll_build_ring_reduce_scatter(&s, a, c->scratch,
                                                c->scratch_mr);
            break;
        case MESH_OP_ALLGATHER:
            rc = coll_build_ring_allgather(&s, a);
            break;
        case MESH_OP_BROADCAST:
            rc = algo->broadcast(&s, a);
            break;
        default:
            rc = coll_build_barrier(&s, a->rank, a->size);
            break;
        }
    }
    if (rc == 0) {
        char sq[48];

        mesh_debug("%s (%s): %zu x %s, %s, %d operations", mesh_op_name(a->op),
                   mesh_seq_str(q->seq, sq, sizeof(sq)), a->count,
                   mesh_dtype_name(a->dtype), mesh_algo_name(q->algo), s.nops);
        rc = sched_run(&s, c->ops, c->t);
    }
    sched_free(&s);
    if (rc == 0 && turn >= 0) {
        int probe = rf->done ? 0 : coll_race_probe(rf->rounds, rf->epoch);

        rf->t[turn][rf->epoch * rf->rounds + rf->pos / rf->k] =
            mesh_now_s() - t0;
        ++rf->pos;
        if (rf->pos == rf->k * rf->rounds || rf->pos == rf->k * probe)
            rc = refine_agree(c, rf, q->seq);
    }
    if (rtmp)
        c->ops->dereg_mr(c->t, a->recv_mr);
dereg:
    if (stmp)
        c->ops->dereg_mr(c->t, a->send_mr);
    return rc;
}

static void run_req(struct mesh_coll *c, struct mesh_coll_req *q)
{
    char what[256];
    int rc;

    mesh_err_clear();
    if (q->kind == REQ_DEREG) {
        q->rc = q->mr ? c->ops->dereg_mr(c->t, q->mr) : 0;
        if (q->rc < 0)
            snprintf(q->msg, sizeof(q->msg), "%s", mesh_err_msg(q->rc));
        return;
    }
    if (c->failed_rc < 0) {
        q->rc = c->failed_rc;
        snprintf(q->msg, sizeof(q->msg),
                 "%s: the communicator failed "
                 "earlier: %s",
                 req_what(q, what, sizeof(what)), c->failed_msg);
        return;
    }
    q->t_begin = mesh_now_s();
    rc = q->kind == REQ_MEASURE ? run_measure(c, q) : run_coll(c, q);
    q->t_end = mesh_now_s();
    /* One at a time: every seq below q's next is finished here. */
    if (rc == 0 && c->ops->seq_done)
        c->ops->seq_done(c->t, c->opts.seq_base, q->seq + (uint64_t)q->nseq);
    if (rc < 0) {
        snprintf(q->msg, sizeof(q->msg), "%s: %s",
                 req_what(q, what, sizeof(what)), mesh_err_msg(rc));
        c->failed_rc = rc;
        snprintf(c->failed_msg, sizeof(c->failed_msg), "%s", q->msg);
    }
    q->rc = rc;
}

/*
 * Called with mu held: run q with mu released, the communicator marked
 * busy meanwhile, then mark q done. Returns with mu held.
 */
static void run_marked(struct mesh_coll *c, struct mesh_coll_req *q)
{
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);
    run_req(c, q);
    pthread_mutex_lock(&c->mu);
    c->busy = 0;
    q->done = 1;
}

static void *engine(void *arg)
{
    struct mesh_coll *c = arg;

    pthread_mutex_lock(&c->mu);
    for (;;) {
        struct mesh_coll_req *q;

        while ((!c->head || c->busy) && !(c->stop && !c->busy && !c->head))
            pthread_cond_wait(&c->qcv, &c->mu);
        if (!c->head)
            break;
        q = c->head;
        c->head = q->next;
        if (!c->head)
            c->tail = NULL;
        run_marked(c, q);
        pthread_cond_broadcast(&c->dcv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- requests ------------------------------------------------------------ */

static int new_req(mesh_coll_t *c, int kind, mesh_coll_req_t **out)
{
    struct mesh_coll_req *q = calloc(1, sizeof(*q));

    if (!q)
        return mesh_err(-ENOMEM, "out of memory for a collective request");
    q->c = c;
    q->kind = kind;
    q->a.rank = c->w->rank;
    q->a.size = c->w->size;
    q->a.chunk_bytes = c->opts.chunk_bytes;
    q->a.hosts = &c->hosts;
    *out = q;
    return 0;
}

/* Queue q with the next sequence number(s). */
static void submit(mesh_coll_t *c, mesh_coll_req_t *q, int nseq)
{
    pthread_mutex_lock(&c->mu);
    q->seq = c->next_seq;
    q->nseq = nseq;
    c->next_seq += (uint64_t)nseq;
    if (c->tail)
        c->tail->next = q;
    else
        c->head = q;
    c->tail = q;
    pthread_cond_signal(&c->qcv);
    pthread_mutex_unlock(&c->mu);
}

/*
 * Run q to the end and free it. When nothing is queued or running, the
 * caller's thread runs it itself (saving two thread hand-offs, which is
 * most of a small collective's time); else it queues behind the others.
 */
static int submit_wait(mesh_coll_t *c, mesh_coll_req_t *q, int nseq)
{
    int done;

    pthread_mutex_lock(&c->mu);
    if (c->head || c->busy) {
        pthread_mutex_unlock(&c->mu);
        submit(c, q, nseq);
        return mesh_coll_wait(q);
    }
    q->seq = c->next_seq;
    q->nseq = nseq;
    c->next_seq += (uint64_t)nseq;
    run_marked(c, q);
    if (c->head || c->stop)
        pthread_cond_signal(&c->qcv);
    pthread_mutex_unlock(&c->mu);
    return mesh_coll_test(q, &done);
}

int mesh_coll_test(mesh_coll_req_t *q, int *done)
{
    struct mesh_coll *c = q->c;
    int d, rc;

    pthread_mutex_lock(&c->mu);
    d = q->done;
    pthread_mutex_unlock(&c->mu);
    if (!d) {
        *done = 0;
        return 0;
    }
    rc = q->rc;
    if (rc < 0)
        mesh_err(rc, "%s", q->msg);
    free(q);
    *done = 1;
    return rc;
}

int mesh_coll_wait(mesh_coll_req_t *q)
{
    return mesh_coll_wait_times(q, NULL, NULL);
}

int mesh_coll_wait_times(mesh_coll_req_t *q, double *begin_s, double *end_s)
{
    struct mesh_coll *c = q->c;
    int done;

    pthread_mutex_lock(&c->mu);
    while (!q->done)
        pthread_cond_wait(&c->dcv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (begin_s)
        *begin_s = q->t_begin;
    if (end_s)
        *end_s = q->t_end;
    return mesh_coll_test(q, &done);
}

static int check_dtype(int dtype, int reduce)
{
    if (dtype == MESH_DT_F32 || dtype == MESH_DT_F16 || dtype == MESH_DT_BF16 ||
        (!reduce && dtype == MESH_DT_BYTE))
        return 0;
    return mesh_err(-EINVAL, "data type %d (%s) is not supported here", dtype,
                    mesh_dtype_name(dtype));
}

static int check_args(const mesh_coll_t *c, const void *sendbuf,
                      const void *recvbuf, size_t count, size_t mult, int dtype,
                      int reduce, int redop)
{
    int rc = check_dtype(dtype, reduce);

    if (rc < 0)
        return rc;
    if (reduce && redop != MESH_REDOP_SUM && redop != MESH_REDOP_AVG)
        return mesh_err(-EINVAL, "unknown reduction %d", redop);
    if (count && mult && count > SIZE_MAX / 8 / mult)
        return mesh_err(-EOVERFLOW, "%zu elements is too many", count);
    if (count && (!recvbuf || (!sendbuf && c->w->size > 0)))
        return mesh_err(-EINVAL, "NULL buffer for %zu elements", count);
    return 0;
}

static int start_coll(mesh_coll_t *c, int op, const void *sendbuf,
                      void *recvbuf, size_t count, int dtype, int redop,
                      int root, int algo, mesh_coll_req_t **out)
{
    mesh_coll_req_t *q = NULL;
    int rc = new_req(c, REQ_COLL, &q);

    if (rc < 0)
        return rc;
    q->a.op = op;
    q->a.dtype = dtype;
    q->a.redop = redop;
    q->a.root = root;
    q->a.count = count;
    q->a.sendbuf = sendbuf;
    q->a.recvbuf = recvbuf;
    q->algo = algo;
    if (!out) /* a blocking call */
        return submit_wait(c, q, 1);
    submit(c, q, 1);
    *out = q;
    return 0;
}

static int allreduce_go(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t count, int dtype, int redop, int algo,
                        mesh_coll_req_t **out)
{
    int rc = check_args(c, sendbuf, recvbuf, count, 1, dtype, 1, redop);

    if (rc == 0 && !coll_algo_get(algo))
        rc = mesh_err(-EINVAL, "unknown algorithm %d", algo);
    if (rc < 0)
        return rc;
    return start_coll(c, MESH_OP_ALLREDUCE, sendbuf, recvbuf, count, dtype,
                      redop, 0, algo, out);
}

static int reduce_scatter_go(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                             size_t recvcount, int dtype, int redop,
                             mesh_coll_req_t **out)
{
    int rc = check_args(c, sendbuf, recvbuf, recvcount, (size_t)c->w->size,
                        dtype, 1, redop);

    if (rc < 0)
        return rc;
    return start_coll(c, MESH_OP_REDUCE_SCATTER, sendbuf, recvbuf, recvcount,
                      dtype, redop, 0, MESH_ALGO_RING, out);
}

static int allgather_go(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t sendcount, int dtype, mesh_coll_req_t **out)
{
    int rc = check_args(c, sendbuf, recvbuf, sendcount, (size_t)c->w->size,
                        dtype, 0, 0);

    if (rc < 0)
        return rc;
    return start_coll(c, MESH_OP_ALLGATHER, sendbuf, recvbuf, sendcount, dtype,
                      0, 0, MESH_ALGO_RING, out);
}

static int broadcast_go(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t count, int dtype, int root, int algo,
                        mesh_coll_req_t **out)
{
    int rc = check_args(c, c->w->rank == root ? sendbuf : recvbuf, recvbuf,
                        count, 1, dtype, 0, 0);
    const struct coll_algo *e;

    if (rc == 0 && (root < 0 || root >= c->w->size))
        rc = mesh_err(-EINVAL, "broadcast root %d is not a rank (0..%d)", root,
                      c->w->size - 1);
    e = coll_algo_get(algo);
    if (rc == 0 && e && e->allreduce && !e->broadcast)
        algo = MESH_ALGO_RING; /* none of their own: the chain */
    if (rc < 0)
        return rc;
    return start_coll(c, MESH_OP_BROADCAST, sendbuf, recvbuf, count, dtype, 0,
                      root, algo, out);
}

static int barrier_go(mesh_coll_t *c, mesh_coll_req_t **out)
{
    return start_coll(c, MESH_OP_BARRIER, NULL, NULL, 0, MESH_DT_BYTE, 0, 0,
                      MESH_ALGO_RING, out);
}

/* Non-blocking forms: queue, return the request. */

/* The error of a non-blocking form fn called without a request pointer. */
static int no_out(const char *fn)
{
    return mesh_err(-EINVAL, "%s: NULL out", fn);
}

int mesh_coll_allreduce_start(mesh_coll_t *c, const void *sendbuf,
                              void *recvbuf, size_t count, int dtype, int redop,
                              int algo, mesh_coll_req_t **out)
{
    return out ? allreduce_go(c, sendbuf, recvbuf, count, dtype, redop, algo,
                              out)
               : no_out(__func__);
}

int mesh_coll_reduce_scatter_start(mesh_coll_t *c, const void *sendbuf,
                                   void *recvbuf, size_t recvcount, int dtype,
                                   int redop, mesh_coll_req_t **out)
{
    return out ? reduce_scatter_go(c, sendbuf, recvbuf, recvcount, dtype, redop,
                                   out)
               : no_out(__func__);
}

int mesh_coll_allgather_start(mesh_coll_t *c, const void *sendbuf,
                              void *recvbuf, size_t sendcount, int dtype,
                              mesh_coll_req_t **out)
{
    return out ? allgather_go(c, sendbuf, recvbuf, sendcount, dtype, out)
               : no_out(__func__);
}

int mesh_coll_broadcast_start(mesh_coll_t *c, const void *sendbuf,
                              void *recvbuf, size_t count, int dtype, int root,
                              int algo, mesh_coll_req_t **out)
{
    return out ? broadcast_go(c, sendbuf, recvbuf, count, dtype, root, algo,
                              out)
               : no_out(__func__);
}

int mesh_coll_barrier_start(mesh_coll_t *c, mesh_coll_req_t **out)
{
    return out ? barrier_go(c, out) : no_out(__func__);
}

/* Blocking forms: run on the caller's thread when the engine is idle. */

int mesh_coll_allreduce(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t count, int dtype, int redop, int algo)
{
    return allreduce_go(c, sendbuf, recvbuf, count, dtype, redop, algo, NULL);
}

int mesh_coll_reduce_scatter(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                             size_t recvcount, int dtype, int redop)
{
    return reduce_scatter_go(c, sendbuf, recvbuf, recvcount, dtype, redop,
                             NULL);
}

int mesh_coll_allgather(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t sendcount, int dtype)
{
    return allgather_go(c, sendbuf, recvbuf, sendcount, dtype, NULL);
}

int mesh_coll_broadcast(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t count, int dtype, int root, int algo)
{
    return broadcast_go(c, sendbuf, recvbuf, count, dtype, root, algo, NULL);
}

int mesh_coll_barrier(mesh_coll_t *c)
{
    return barrier_go(c, NULL);
}

/* ---- buffers ------------------------------------------------------------- */

static int table_add(mesh_coll_t *c, const struct bufent *e)
{
    int rc;

    pthread_mutex_lock(&c->mu);
    rc = mesh_array_reserve(&c->bufs, &c->capbufs, (size_t)c->nbufs + 1,
                            sizeof(*c->bufs), "the buffer table's entries");
    if (rc < 0) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    c->bufs[c->nbufs++] = *e;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* The memory of a buffer table entry back to where it came from. */
static void bufent_free(const mesh_coll_t *c, const struct bufent *e)
{
    if (e->shared)
        c->ops->host_free(c->t, e->ptr);
    else
        pinned_free(c, e->ptr, e->len);
}

int mesh_coll_buf_alloc(mesh_coll_t *c, size_t len, void **out)
{
    struct bufent e = {.len = len, .owned = 1};
    int rc = -ENOMEM;

    /* the host's shared memory first, where the others read it in place;
     * else (full, absent, not asked for) our own */
    if (c->opts.host_shared && c->hosts.heap && c->ops->host_alloc)
        rc = c->ops->host_alloc(c->t, len, &e.ptr);
    if (rc == 0)
        e.shared = 1;
    else
        rc = pinned_alloc(c, len, &e.ptr);
    if (rc < 0)
        return rc;
    rc = table_add(c, &e);
    if (rc < 0) {
        bufent_free(c, &e);
        return rc;
    }
    *out = e.ptr;
    return 0;
}

int mesh_coll_buf_register(mesh_coll_t *c, void *buf, size_t len)
{
    struct bufent e = {.ptr = buf, .len = len};

    if (!buf || !len)
        return mesh_err(-EINVAL, "mesh_coll_buf_register: empty region");
    return table_add(c, &e);
}

/* Take buf out of the table; the engine deregisters it, in queue order
 * (after the collectives queued before). Returns 0 when it was there. */
static int table_remove(mesh_coll_t *c, void *buf, int owned,
                        struct bufent *out)
{
    mesh_coll_req_t *q = NULL;
    int found = 0;

    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nbufs; i++)
        if (c->bufs[i].ptr == buf && c->bufs[i].owned == owned) {
            *out = c->bufs[i];
            c->bufs[i] = c->bufs[--c->nbufs];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    if (!found)
        return -ENOENT;
    if (out->mr && new_req(c, REQ_DEREG, &q) == 0) {
        q->mr = out->mr;
        submit(c, q, 0);
        if (mesh_coll_wait(q) < 0)
            mesh_warn("deregistering a buffer: %s", mesh_err_msg(-EIO));
    }
    return 0;
}

void mesh_coll_buf_free(mesh_coll_t *c, void *buf)
{
    struct bufent e;

    if (!buf)
        return;
    if (table_remove(c, buf, 1, &e) < 0) {
        mesh_warn("mesh_coll_buf_free: %p is not a communicator buffer", buf);
        return;
    }
    bufent_free(c, &e);
}

void mesh_coll_buf_unregister(mesh_coll_t *c, void *buf)
{
    struct bufent e;

    if (buf && table_remove(c, buf, 0, &e) < 0)
        mesh_warn("mesh_coll_buf_unregister: %p was not registered", buf);
}

/* ---- create, destroy ----------------------------------------------------- */

static void hosts_free(struct coll_hosts *h)
{
    free(h->host_of);
    free(h->local_of);
    free(h->rank_at);
    free(h->win);
    free(h->heap);
    memset(h, 0, sizeof(*h));
}

/*
 * The windows of this rank's host (local.c), where the transport has them
 * for every rank of it, all of one length; else none (h->win NULL).
 */
static int hosts_windows(mesh_coll_t *c)
{
    struct coll_hosts *h = &c->hosts;
    int hi = h->host_of[c->w->rank];
    uint64_t syncs;

    h->ops = c->ops;
    h->t = c->t;
    if (!c->ops->host_window || !c->ops->host_sync || h->local < 2)
        return 0;
    h->win = calloc((size_t)h->local, sizeof(*h->win));
    if (!h->win)
        return mesh_err(-ENOMEM, "out of memory for the hosts");
    for (int j = 0; j < h->local; j++) {
        size_t len = 0;

        if (c->ops->host_window(c->t, h->rank_at[hi * h->local + j], &h->win[j],
                                &len, &syncs) < 0 ||
            len < 2 * sizeof(double) || (j && len != h->win_len)) {
            free(h->win);
            h->win = NULL;
            h->win_len = 0;
            return 0;
        }
        h->win_len = len;
    }
    if (!c->ops->host_heap || !c->ops->host_sync_word)
        return 0;
    h->heap = calloc((size_t)h->local, sizeof(*h->heap));
    if (!h->heap)
        return mesh_err(-ENOMEM, "out of memory for the hosts");
    for (int j = 0; j < h->local; j++) {
        size_t len = 0;

        if (c->ops->host_heap(c->t, h->rank_at[hi * h->local + j], &h->heap[j],
                              &len) < 0 ||
            !len || (j && len != h->heap_len)) {
            free(h->heap);
            h->heap = NULL;
            h->heap_len = 0;
            return 0;
        }
        h->heap_len = len;
    }
    return 0;
}

/*
 * The hosts, from the transport's host_of (the lowest rank of each rank's
 * host, the same answer everywhere): hosts numbered in the order of their
 * lowest ranks, ranks on a host in rank order. local stays 0 (no
 * hierarchy) without host_of or where the hosts differ in size.
 */
static int hosts_build(mesh_coll_t *c)
{
    struct coll_hosts *h = &c->hosts;
    int n = c->w->size, *count;

    if (!c->ops->host_of || n < 2)
        return 0;
    h->host_of = calloc((size_t)n, sizeof(int));
    h->local_of = calloc((size_t)n, sizeof(int));
    count = calloc((size_t)n, sizeof(int));
    if (!h->host_of || !h->local_of || !count) {
        free(count);
        hosts_free(h);
        return mesh_err(-ENOMEM, "out of memory for the hosts");
    }
    for (int r = 0; r < n; r++) {
        int lead = c->ops->host_of(c->t, r);

        if (lead < 0 || lead >= r)
            h->host_of[r] = h->nhosts++; /* a host of its own */
        else
            h->host_of[r] = h->host_of[lead];
        h->local_of[r] = count[h->host_of[r]]++;
    }
    h->local = count[0];
    for (int k = 1; k < h->nhosts; k++)
        if (count[k] != h->local)
            h->local = 0;
    free(count);
    if (!h->local)
        return 0;
    h->rank_at = calloc((size_t)n, sizeof(int));
    if (!h->rank_at) {
        hosts_free(h);
        return mesh_err(-ENOMEM, "out of memory for the hosts");
    }
    for (int r = 0; r < n; r++)
        h->rank_at[h->host_of[r] * h->local + h->local_of[r]] = r;
    if (hosts_windows(c) < 0) {
        hosts_free(h);
        return mesh_err(-ENOMEM, "out of memory for the hosts");
    }
    if (h->local > 1)
        mesh_info("collectives: %d host(s) of %d ranks: hier runs", h->nhosts,
                  h->local);
    return 0;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;

    return (x > y) - (x < y);
}

/* Formation's measurement bounds (see mesh_coll_opts.measure_sizes). */
#define MEAS_SCRATCH_PAD (8u << 20) /* scratch beyond 2 x the message */
#define MEAS_RUNS_TINY   31         /* runs per size below 64 KiB */
#define MEAS_RUNS_SMALL  7          /* below 1 MiB */
#define MEAS_RUNS_BIG    5          /* from 1 MiB */
#define MEAS_BLOCKS      4 /* the first runs, then up to 3 blocks more */
#define MEAS_RUNS_MAX    (MEAS_BLOCKS * MEAS_RUNS_TINY)
_Static_assert(MEAS_RUNS_MAX <= COLL_MEAS_RUNS_MAX, "coll-internal.h");
#define MEAS_BLOCK_S 0.25 /* a block's time, about (more runs) */
#define MEAS_CHUNK_S 0.25 /* rounds between agreements on the time spent */
#define MEAS_LEAST   3    /* a size's first block: at least this many runs */
#define MEAS_MARGIN  1.5  /* a chunk's estimate times this must fit */
#define MEAS_DROP    2.0  /* not timed on: this slow at two sizes, */
#define MEAS_DROP_S  2e-3 /* where the fastest call took this or more */
/* contenders after block b: this near the fastest (b = 1..3) */
static const float meas_close[MEAS_BLOCKS] = {0, 1.30f, 1.10f, 1.04f};

/*
 * Runs per algorithm and block at a size: many where a run takes tens of
 * us (on loopback with 4 ranks, the least of 7 runs at 4 and 16 KiB was
 * 3 to 6 times what the same algorithms took in meshbench's sweep right
 * after), few where it takes ms.
 */
static int meas_runs(size_t bytes)
{
    return bytes < ((size_t)64 << 10)  ? MEAS_RUNS_TINY
           : bytes < ((size_t)1 << 20) ? MEAS_RUNS_SMALL
                                       : MEAS_RUNS_BIG;
}

/*
 * The sizes to time, in increasing order, distinct, multiples of 4
 * bytes: 32, measure_bytes, measure_sizes; thinned to MESH_COLL_POINTS
 * (every second inner size dropped until it fits). Returns how many.
 */
static int plan_points(const mesh_coll_t *c, size_t *pts)
{
    size_t v[64 + 2];
    int n = 0, k = 0;

    v[n++] = 32;
    if (c->opts.measure_bytes >= 64)
        v[n++] = c->opts.measure_bytes & ~(size_t)3;
    for (int i = 0; i < c->opts.nmeasure_sizes && n < 64 + 2; i++)
        if (c->opts.measure_sizes[i] >= 64)
            v[n++] = c->opts.measure_sizes[i] & ~(size_t)3;
    qsort(v, (size_t)n, sizeof(v[0]), cmp_size);
    for (int i = 0; i < n; i++)
        if (k == 0 || v[i] != v[k - 1])
            v[k++] = v[i];
    while (k > MESH_COLL_POINTS) {
        int j = 1;

        for (int i = 1; i < k; i++)
            if (i == k - 1 || i % 2 == 0)
                v[j++] = v[i];
        k = j;
    }
    memcpy(pts, v, (size_t)k * sizeof(*pts));
    return k;
}

size_t mesh_coll_scratch_for(const mesh_coll_t *c, int algo, size_t bytes)
{
    const struct coll_algo *e = coll_algo_get(algo);
    struct coll_args a = {
        .op = MESH_OP_ALLREDUCE,
        .dtype = MESH_DT_F32,
        .redop = MESH_REDOP_SUM,
        .count = bytes / sizeof(float),
        .chunk_bytes = c->opts.chunk_bytes,
        .size = c->w->size,
        .hosts = &c->hosts,
    };
    size_t most = 0;

    if (!e || !e->scratch)
        return 0;
    for (int r = 0; r < c->w->size; r++) {
        a.rank = r;
        most = MESH_MAX(most, e->scratch(&a));
    }
    return most;
}

/*
 * Runs per algorithm and block at point k: meas_runs, or more where the
 * live algorithms' estimated times (the line of the points measured
 * before, agreed) leave room in MEAS_BLOCK_S, up to MEAS_RUNS_TINY: on
 * 8 namespace hosts under load, 7 runs of 4 ms ranked rd first at
 * 256 KiB and rhd 1.33 times it, and over the seconds after rhd was
 * 1.38 times faster. The same on every rank.
 */
static int block_runs(const mesh_coll_t *c, const int *ids, int nauto, int k,
                      const int *live)
{
    size_t bytes = c->model.point_bytes[k];
    int runs = meas_runs(bytes);
    double round = 0;

    for (int a = 0; k > 0 && a < nauto; a++) {
        double est = live[a] ? measured_cost(c, ids[a], (double)bytes) : 0;

        round += est > 0 ? est : 0;
    }
    if (round > 0)
        runs = (int)MESH_MAX(
            runs, MESH_MIN(MEAS_BLOCK_S / round, (double)MEAS_RUNS_TINY));
    return runs;
}

/*
 * Time rounds i0..i1 - 1 of out-of-place all-reduces of bytes (from buf
 * into the bytes after them, buf holding twice bytes) with each
 * algorithm ids[a] whose live[a] is set, into t[a][from + i] (s); round -1
 * is a warmup, not kept. The algorithms take turns in an order shuffled
 * each round (the same on every rank), so that a burst of noise on a
 * shared machine spoils one run of each rather than all runs of one, and
 * no algorithm always follows the same one (which warms the caches for
 * it). Every rank runs the same calls in the same order. Out of place, as
 * meshbench's tables and its judge (--rotate) call them: in place, over
 * shared memory, the forms that read every rank's input where it lies
 * ran 1.2 to 2.8 times slower and ranked otherwise (4 ranks on loopback,
 * 1 MiB: hier 254 to 368 us out of place, 529 to 547 in place; local 314
 * to 397 and 745 to 1002), and formation left the fastest out of the
 * race (hier at 2.6 times htree at 4 MiB, the judge's best after).
 */
static int time_point(mesh_coll_t *c, const int *ids, const int *live,
                      int nauto, size_t bytes, float *buf,
                      double (*t)[MEAS_RUNS_MAX], int from, int i0, int i1)
{
    size_t cnt = bytes / sizeof(float);

    for (int i = i0; i < i1; i++) {
        int order[MESH_ALGO_LAST + 1];

        mesh_shuffle(order, nauto, (unsigned)(from + i) + 1);
        for (int j = 0; j < nauto; j++) {
            int a = order[j], rc;
            double t0;

            if (!live[a])
                continue;
            t0 = mesh_now_s();
            rc = mesh_coll_allreduce(c, buf, buf + cnt, cnt, MESH_DT_F32,
                                     MESH_REDOP_SUM, ids[a]);
            if (rc < 0)
                return rc;
            if (i >= 0)
                t[a][from + i] = mesh_now_s() - t0;
        }
    }
    return 0;
}

/* The least agreed time v (us) of the live algorithms (0: none). */
static float fastest(const int *live, int nauto, const float *v)
{
    float best = 0;

    for (int a = 0; a < nauto; a++)
        if (live[a] && v[a] > 0 && (best <= 0 || v[a] < best))
            best = v[a];
    return best;
}

/*
 * The contenders of a size from its agreed times v (us): the live
 * algorithms within a factor near of the fastest, into close[]; returns
 * how many.
 */
static int contenders(const int *live, int nauto, const float *v, float near,
                      int *close)
{
    float best = fastest(live, nauto, v);
    int n = 0;

    for (int a = 0; a < nauto; a++) {
        close[a] = live[a] && v[a] > 0 && v[a] <= near * best;
        n += close[a];
    }
    return n;
}

/* The least agreed time at point k (s; 0: none). */
static double point_best(const struct mesh_coll_model *m, const int *ids,
                         int nauto, int k)
{
    double best = 0;

    for (int a = 0; a < nauto; a++)
        if (m->point_s[k][ids[a]] > 0 &&
            (best <= 0 || m->point_s[k][ids[a]] < best))
            best = m->point_s[k][ids[a]];
    return best;
}

/*
 * Which algorithms to time at point k (model points 0..k-1 measured and
 * agreed, so every rank decides alike): the live ones of point k - 1
 * whose scratch fits, less those that ran over MEAS_DROP times the
 * fastest at each of the two points before where the fastest call took
 * MEAS_DROP_S or more. Not for being slow once, nor at small sizes: on a
 * shared machine a burst of load can make the best algorithm look twice
 * as slow in a short block, and a dropped one never comes back; but at
 * the largest sizes formation spent most of its time on them (4 ranks on
 * loopback, 256 MiB: ring, tree, rd and rhd 2.3 to 4 times hier, 10 of
 * its 20 s), and from a few ms up an algorithm's time grows with the
 * bytes at its own rate. Returns the estimated time of one round of
 * point k (s; 0: none), for the budget.
 */
static double plan_live(mesh_coll_t *c, const int *ids, int nauto, int k,
                        int *live)
{
    const struct mesh_coll_model *m = &c->model;
    size_t bytes = m->point_bytes[k];
    double round = 0, b1 = 0, b2 = 0;

    if (k >= 2) {
        b1 = point_best(m, ids, nauto, k - 1);
        b2 = point_best(m, ids, nauto, k - 2);
    }
    for (int a = 0; a < nauto; a++)
        if (live[a] && mesh_coll_scratch_for(c, ids[a], bytes) >
                           2 * bytes + MEAS_SCRATCH_PAD)
            live[a] = 0;
        else if (live[a] && b2 >= MEAS_DROP_S && b1 >= MEAS_DROP_S &&
                 m->point_s[k - 1][ids[a]] > MEAS_DROP * b1 &&
                 m->point_s[k - 2][ids[a]] > MEAS_DROP * b2)
            live[a] = 0;
    for (int a = 0; a < nauto; a++) {
        double est = live[a] ? measured_cost(c, ids[a], (double)bytes) : 0;

        round += est > 0 ? est : 0;
    }
    return round;
}

/*
 * Formation's clock: its start on this rank, its budget (s, the same on
 * every rank), and the time spent as last agreed (the most of any rank's
 * time since its own start), with the buffers that agree on it (one float
 * of each rank).
 */
struct meas_clock {
    double start, budget, spent;
    float *mine, *all;
};

/* Agree on the time spent: every rank's, gathered; the most. */
static int clock_agree(mesh_coll_t *c, struct meas_clock *k)
{
    int rc;

    k->mine[0] = (float)(mesh_now_s() - k->start);
    rc = mesh_coll_allgather(c, k->mine, k->all, 1, MESH_DT_F32);
    if (rc < 0)
        return rc;
    k->spent = 0;
    for (int r = 0; r < c->w->size; r++)
        k->spent = MESH_MAX(k->spent, (double)k->all[r]);
    return 0;
}

/*
 * Time up to runs rounds of point bytes (time_point; a warmup first when
 * warm, alone: the first call at a size may grow the scratch) into
 * t[.][from..), in chunks of about MEAS_CHUNK_S by est (s a round), the
 * ranks agreeing on the time spent after each (clock_agree); a chunk has
 * only as many rounds as fit, MEAS_MARGIN times over, in the budget left,
 * and each later chunk is estimated from the agreed time of the rounds
 * before it. est 0: unknown, a first chunk of one round while any budget
 * is left; est < 0: all rounds in one chunk, whatever the budget. Every
 * decision comes from agreed numbers, so every rank times the same
 * rounds. Returns how many rounds were timed (0..runs), or a negative
 * errno.
 */
static int time_rounds(mesh_coll_t *c, const int *ids, const int *live,
                       int nauto, size_t bytes, float *buf,
                       double (*t)[MEAS_RUNS_MAX], int from, int runs, int warm,
                       double est, struct meas_clock *k)
{
    int i = warm ? -1 : 0, rc;

    while (i < runs) {
        int n = est < 0 ? runs - i
                : i < 0 || est == 0
                    ? 1
                    : (int)MESH_MAX(1, MESH_MIN(MEAS_CHUNK_S / est, runs));
        double before = k->spent;

        if (est >= 0 && k->spent >= k->budget)
            break;
        if (est > 0) /* as many as fit */
            n = (int)MESH_MIN((double)n,
                              (k->budget - k->spent) / (MEAS_MARGIN * est));
        n = MESH_MIN(n, runs - i);
        if (n < 1)
            break;
        rc = time_point(c, ids, live, nauto, bytes, buf, t, from, i, i + n);
        if (rc == 0)
            rc = clock_agree(c, k);
        if (rc < 0)
            return rc;
        i += n;
        mesh_debug("collectives: formation at %zu bytes: %d rounds in %.3f "
                   "s (%.3f s estimated), %.3f s spent",
                   bytes, n, k->spent - before, n * est, k->spent);
        est = (k->spent - before) / n;
    }
    return MESH_MAX(i, 0);
}

/* agree_times' vectors: alpha, beta, the time spent so far, then the
 * algorithms' times (the agreed one) or their runs' (each rank's) */
enum { HEAD = COLL_MEAS_HEAD, AGREE_NV = HEAD + MESH_ALGO_LAST + 1 };

/* The median of x[0..n) (sorts x; at most COLL_MEAS_RUNS_MAX). */
static float median_f(float *x, int n)
{
    for (int i = 1; i < n; i++) {
        float y = x[i];
        int j = i - 1;

        for (; j >= 0 && x[j] > y; j--)
            x[j + 1] = x[j];
        x[j + 1] = y;
    }
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

/*
 * The agreed vector v from every rank's (all: nranks vectors of HEAD +
 * nauto * runs floats, rank by rank): v[0..HEAD) the ranks' mean, and for
 * each live algorithm a time from the slowest rank's time of each run,
 * T[a][i] (0 for the others):
 *   - the reference: the live algorithm of least median over its runs;
 *     its time is that median;
 *   - each other live a: the reference's median times the median over
 *     the rounds of T[a][i] / T[ref][i].
 * The algorithms took turns round by round, so a round's load from
 * elsewhere hits all of them, and the ratio within a round cancels it:
 * one algorithm's burst in a mid-load round moves its own median by as
 * much as the gap between two close ones, the median of its ratios by
 * one place. That is what bench's judge compares too (meshbench
 * --rotate: the median of auto's run over the best's run per round). The
 * median, not the least: the least favours an algorithm that is fast now
 * and then and slow most of the time (rd over shared memory at 64 KiB: a
 * least a quarter of the ring's, a median 1.3 times it). The same bytes
 * give every rank the same v.
 */
void coll_meas_agree(const float *all, int nranks, const int *live, int nauto,
                     int runs, float *v)
{
    size_t stride = (size_t)HEAD + (size_t)nauto * (size_t)runs;
    int n = MESH_MIN(runs, COLL_MEAS_RUNS_MAX), ref = -1;
    float t[MESH_ALGO_LAST + 1][COLL_MEAS_RUNS_MAX],
        med[MESH_ALGO_LAST + 1] = {0}, x[COLL_MEAS_RUNS_MAX];

    nauto = MESH_MIN(nauto, MESH_ALGO_LAST + 1);
    for (int k = 0; k < HEAD; k++) {
        float sum = 0;

        for (int r = 0; r < nranks; r++)
            sum += all[(size_t)r * stride + (size_t)k];
        v[k] = sum / (float)nranks;
    }
    for (int a = 0; a < nauto; a++) {
        v[HEAD + a] = 0;
        if (!live[a])
            continue;
        for (int i = 0; i < n; i++) {
            float most = 0;

            for (int r = 0; r < nranks; r++)
                most =
                    MESH_MAX(most, all[(size_t)r * stride + HEAD +
                                       (size_t)a * (size_t)runs + (size_t)i]);
            t[a][i] = most;
        }
        memcpy(x, t[a], (size_t)n * sizeof(*x));
        med[a] = median_f(x, n);
        if (ref < 0 || med[a] < med[ref])
            ref = a;
    }
    for (int a = 0; a < nauto && ref >= 0; a++) {
        if (!live[a])
            continue;
        if (a == ref) {
            v[HEAD + a] = med[a];
            continue;
        }
        for (int i = 0; i < n; i++)
            x[i] = t[ref][i] > 0 ? t[a][i] / t[ref][i] : 1;
        v[HEAD + a] = med[ref] * median_f(x, n);
    }
}

/*
 * This rank's alpha, beta, time since start and the times of t (runs
 * runs of each live algorithm, us) into mine, gathered from every rank
 * into all, and the agreed vector from them into v (coll_meas_agree).
 */
static int agree_times(mesh_coll_t *c, const int *live, int nauto,
                       double (*t)[MEAS_RUNS_MAX], int runs, double start,
                       float *mine, float *all, float *v)
{
    size_t stride = (size_t)HEAD + (size_t)nauto * (size_t)runs;
    int rc;

    memset(mine, 0, stride * sizeof(float));
    mine[0] = (float)(c->meas_alpha * 1e6); /* us */
    mine[1] = (float)(c->meas_beta * 1e9);  /* ns per byte */
    mine[2] = (float)(mesh_now_s() - start);
    for (int a = 0; a < nauto; a++)
        for (int i = 0; live[a] && i < runs; i++)
            mine[HEAD + (size_t)a * (size_t)runs + (size_t)i] =
                (float)(t[a][i] * 1e6);
    rc = mesh_coll_allgather(c, mine, all, stride, MESH_DT_F32);
    if (rc < 0)
        return rc;
    coll_meas_agree(all, c->w->size, live, nauto, runs, v);
    for (int r = 0; r < c->w->size; r++) /* the time spent: the most */
        v[2] = MESH_MAX(v[2], all[(size_t)r * stride + 2]);
    return 0;
}

/*
 * Measure alpha and beta to the ring neighbours, and time each of AUTO's
 * candidates at the planned sizes. Each size's times (and alpha, beta)
 * are gathered from every rank and agreed (coll_meas_agree), so that
 * every rank holds the same numbers and makes the same decisions from
 * them, the budget's included: a size is timed only where its warmup and
 * MEAS_LEAST rounds fit, MEAS_MARGIN times over, by the line of the sizes
 * before; its rounds run in chunks that each must fit by the rounds
 * before (time_rounds); and a size that got fewer than MEAS_LEAST rounds
 * in is not kept. The sizes not timed follow the last two's line. (The
 * last size timed had passed the 20 s budget by up to 3.5 s where it ran
 * slower under load than that line said.)
 */
static int agree(mesh_coll_t *c)
{
    struct mesh_coll_model *m = &c->model;
    mesh_coll_req_t *q = NULL;
    int ids[MESH_ALGO_LAST + 1], live[MESH_ALGO_LAST + 1];
    int nauto = mesh_coll_auto_algos(c, ids), np;
    size_t pts[MESH_COLL_POINTS];
    int close[MESH_ALGO_LAST + 1], runs, done;
    struct meas_clock clk = {
        .start = mesh_now_s(),
        .budget = c->opts.measure_budget_s > 0 ? c->opts.measure_budget_s
                                               : MEAS_BUDGET_S,
    };
    double t[MESH_ALGO_LAST + 1][MEAS_RUNS_MAX];
    float *v = NULL, *w = NULL, *buf = NULL, *mine = NULL, *all = NULL;
    size_t most = (size_t)HEAD + (size_t)nauto * MEAS_RUNS_MAX;
    int rc;

    rc = new_req(c, REQ_MEASURE, &q);
    if (rc < 0)
        return rc;
    submit(c, q, 2);
    rc = mesh_coll_wait(q);
    if (rc < 0)
        return rc;
    np = plan_points(c, pts);
    rc = mesh_coll_buf_alloc(c, AGREE_NV * sizeof(float), (void **)&v);
    if (rc == 0)
        rc = mesh_coll_buf_alloc(c, AGREE_NV * sizeof(float), (void **)&w);
    if (rc == 0)
        rc = mesh_coll_buf_alloc(c, most * sizeof(float), (void **)&mine);
    if (rc == 0)
        rc = mesh_coll_buf_alloc(c, (size_t)c->w->size * most * sizeof(float),
                                 (void **)&all);
    if (rc == 0)
        rc = mesh_coll_buf_alloc(c, 2 * MESH_MAX(pts[np - 1], 32),
                                 (void **)&buf);
    if (rc < 0)
        goto out;
    memset(buf, 0, 2 * MESH_MAX(pts[np - 1], 32));
    clk.mine = mine;
    clk.all = all;
    for (int a = 0; a < nauto; a++)
        live[a] = 1;
    m->npoints = 0;
    m->budget_cut = 0;
    m->budget_s = clk.budget;
    for (int k = 0; k < np; k++) {
        double round;

        m->point_bytes[k] = pts[k];
        /* the first size always, in one chunk; the others by the budget */
        round = k > 0 ? plan_live(c, ids, nauto, k, live) : -1;
        if (k > 0 &&
            (clk.spent >= clk.budget ||
             clk.spent + MEAS_MARGIN * (1 + MEAS_LEAST) * round > clk.budget))
            break;
        runs = block_runs(c, ids, nauto, k, live);
        done = time_rounds(c, ids, live, nauto, pts[k], buf, t, 0, runs, 1,
                           round, &clk);
        if (done < 0) {
            rc = done;
            goto out;
        }
        if (k > 0 && done < MEAS_LEAST)
            break; /* its time is spent, but too few runs to rank by */
        rc = agree_times(c, live, nauto, t, done, clk.start, mine, all, v);
        /*
         * The algorithms within 30 % of the fastest run as many times
         * again, and their medians over all their runs are agreed
         * anew; then those within 10 %, then 4 %, while the budget lasts:
         * where the choice is close, noise has the most say, and each
         * block spends its runs on fewer candidates. Every rank holds the
         * same agreed times, so all take the same blocks.
         */
        memcpy(close, live, sizeof(close));
        for (int b = 1; rc == 0 && b < MEAS_BLOCKS; b++) {
            int prev[MESH_ALGO_LAST + 1], more;
            double est = 0;

            memcpy(prev, close, sizeof(prev));
            if (contenders(prev, nauto, v + HEAD, meas_close[b], close) < 2)
                break;
            for (int a = 0; a < nauto; a++)
                est += close[a] ? v[HEAD + a] * 1e-6 : 0;
            more = time_rounds(c, ids, close, nauto, pts[k], buf, t, done, runs,
                               0, est, &clk);
            if (more <= 0) {
                rc = more;
                break;
            }
            done += more;
            rc = agree_times(c, close, nauto, t, done, clk.start, mine, all, w);
            for (int a = 0; rc == 0 && a < nauto; a++)
                if (close[a])
                    v[HEAD + a] = w[HEAD + a];
        }
        if (rc < 0)
            goto out;
        for (int a = 0; a < nauto; a++)
            m->point_s[k][ids[a]] = v[HEAD + a] * 1e-6;
        m->npoints = k + 1;
    }
    /* the same agreed numbers on every rank: the same sizes cut */
    m->budget_cut = m->npoints < np;
    memset(m->point_s + m->npoints, 0,
           (size_t)(MESH_COLL_POINTS - m->npoints) * sizeof(m->point_s[0]));
    m->alpha_s = v[0] * 1e-6;
    m->beta_s_per_byte = v[1] * 1e-9;
    for (int a = 0; a < nauto; a++)
        m->lat_s[ids[a]] = m->point_s[0][ids[a]];
    m->measured = 1;
    m->formation_s = mesh_now_s() - clk.start;
    c->auto_algo = 0; /* the choices come from the times now */
out:
    mesh_coll_buf_free(c, buf);
    mesh_coll_buf_free(c, all);
    mesh_coll_buf_free(c, mine);
    mesh_coll_buf_free(c, w);
    mesh_coll_buf_free(c, v);
    /* the largest sizes' scratch: given back, grown again where needed */
    if (c->scratch_mr)
        c->ops->dereg_mr(c->t, c->scratch_mr);
    pinned_free(c, c->scratch, c->scratch_len);
    c->scratch = NULL;
    c->scratch_len = 0;
    c->scratch_mr = NULL;
    return rc;
}

static void log_model(const mesh_coll_t *c)
{
    const struct mesh_coll_model *m = &c->model;
    char ranges[512] = "", times[512], share[160] = "";
    size_t used = 0, from = 8;
    int ids[MESH_ALGO_LAST + 1], nauto = mesh_coll_auto_algos(c, ids);
    int prev = -1;

    if (!m->measured && m->ranks_per_cpu > 1)
        snprintf(share, sizeof(share),
                 "; %.2f ranks per CPU on the most crowded machine: %s",
                 m->ranks_per_cpu,
                 c->shape.hosts && c->shape.hosts->local >= 2
                     ? "no bound: hosts hold several ranks each"
                     : "its CPUs' share of the work bounds the time");
    mesh_info("collectives: %d ranks, kernels %s, alpha %.1f us, beta %.3f "
              "ns/B (%.2f GB/s), gamma %.3f ns/B%s%s",
              c->w->size, mesh_reduce_isa(), m->alpha_s * 1e6,
              m->beta_s_per_byte * 1e9, 1e-9 / m->beta_s_per_byte,
              m->gamma_s_per_byte * 1e9,
              m->measured ? " (alpha, beta measured to the ring "
                            "neighbours, averaged over the ranks)"
                          : " (not measured: defaults)",
              share);
    if (m->measured && c->w->rank == 0)
        mesh_info("collectives: formation timed %d sizes in %.2f s (budget "
                  "%.0f s%s)",
                  m->npoints, m->formation_s, m->budget_s,
                  m->budget_cut ? ", cut: larger sizes on the last two's line"
                                : "");
    for (int k = 0; k < m->npoints; k++) {
        size_t tused = 0;

        times[0] = 0;
        for (int a = 0; a < nauto && tused < sizeof(times); a++)
            if (m->point_s[k][ids[a]] > 0)
                tused += (size_t)snprintf(times + tused, sizeof(times) - tused,
                                          "%s%s %.1f us", tused ? ", " : "",
                                          mesh_algo_name(ids[a]),
                                          m->point_s[k][ids[a]] * 1e6);
        mesh_info("collectives: %zu-byte all-reduce measured: %s",
                  m->point_bytes[k], times);
    }
    if (c->opts.algo != MESH_ALGO_AUTO) {
        mesh_info("collectives: all-reduce algorithm %s (fixed)",
                  mesh_algo_name(c->opts.algo));
        return;
    }
    /*
     * The choice as ranges, each from the exact size where it starts:
     * sampled 16 times an octave, then the first size of a new choice
     * found by bisection (a choice can change more than once inside an
     * octave: 7 ranks by the built-in numbers take rd at 128 KiB, rhd
     * from 142,858 bytes and the ring from 155,556).
     */
    for (size_t b = 8, lo = 0;; lo = b, b += MESH_MAX(b / 16, (size_t)1)) {
        int a = b <= ((size_t)1 << 30)
                    ? mesh_coll_algo_for(c, MESH_ALGO_AUTO, b)
                    : -1;
        size_t at = b;

        if (prev >= 0 && a != prev) {
            /* the first size after lo that does not take prev */
            for (size_t l = lo, h = b; a >= 0 && h - l > 1;) {
                size_t mid = l + (h - l) / 2;

                if (mesh_coll_algo_for(c, MESH_ALGO_AUTO, mid) == prev)
                    l = mid;
                else
                    h = at = mid;
            }
            if (used < sizeof(ranges))
                used += (size_t)snprintf(ranges + used, sizeof(ranges) - used,
                                         "%s%s from %zu B", used ? ", " : "",
                                         mesh_algo_name(prev), from);
            from = at;
            if (a >= 0) /* sampled on from there */
                a = mesh_coll_algo_for(c, MESH_ALGO_AUTO, b = at);
        }
        if (a < 0)
            break;
        prev = a;
    }
    mesh_info("collectives: auto all-reduce: %s (tree depth %d)", ranges,
              c->shape.tree_depth);
}

int mesh_coll_create(const struct mesh_transport_ops *ops, mesh_transport_t *t,
                     const struct mesh_world *world,
                     const struct mesh_coll_opts *opts, mesh_coll_t **out)
{
    mesh_coll_t *c;
    int rc;

    if (!ops || !t || !world || world->size < 1 || world->rank < 0 ||
        world->rank >= world->size)
        return mesh_err(-EINVAL, "mesh_coll_create: bad transport or world");
    c = calloc(1, sizeof(*c));
    if (!c)
        return mesh_err(-ENOMEM, "out of memory for a communicator");
    c->ops = ops;
    c->t = t;
    c->w = world;
    if (opts)
        c->opts = *opts;
    else
        mesh_coll_opts_init(&c->opts);
    if (!coll_algo_get(c->opts.algo)) {
        rc = mesh_err(-EINVAL, "unknown algorithm %d", c->opts.algo);
        goto free_c;
    }
    c->next_seq = c->opts.seq_base;
    if (c->ops->seq_done)
        c->ops->seq_done(c->t, c->opts.seq_base, c->next_seq);
    c->model.alpha_s = 50e-6; /* a LAN's order of magnitude */
    c->model.beta_s_per_byte = 1e-9;
    /* y += x streams about 6 GB/s of x from memory on the development
     * machine; a timing here would run in cache and flatter it. */
    c->model.gamma_s_per_byte = 0.16e-9;
    /* measured times have the ranks' sharing of CPUs in them */
    c->model.ranks_per_cpu = !c->opts.measure && c->ops->ranks_per_cpu
                                 ? c->ops->ranks_per_cpu(c->t)
                                 : 1.0;
    c->shape.model = &c->model;
    c->shape.size = world->size;
    coll_tree_shape(world->size, &c->shape.tree_depth, &c->shape.tree_load);
    c->shape.rd_rounds = coll_rd_rounds(world->size, &c->shape.rd_extra);
    rc = hosts_build(c);
    if (rc < 0)
        goto free_c;
    c->shape.hosts = &c->hosts;
    c->shape.in_place = c->opts.host_shared && c->hosts.win && c->hosts.heap &&
                        c->ops->host_alloc;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->qcv, NULL);
    pthread_cond_init(&c->dcv, NULL);
    rc = -pthread_create(&c->thread, NULL, engine, c);
    if (rc < 0) {
        rc = mesh_err(rc, "cannot start the collective engine thread");
        goto destroy_sync;
    }
    c->thread_started = 1;
    if (c->opts.measure && world->size > 1) {
        rc = agree(c);
        if (rc < 0) {
            rc = mesh_err_prefix(rc, "forming the communicator");
            mesh_coll_destroy(c);
            return rc;
        }
    }
    log_model(c);
    *out = c;
    return 0;

destroy_sync:
    pthread_cond_destroy(&c->dcv);
    pthread_cond_destroy(&c->qcv);
    pthread_mutex_destroy(&c->mu);
free_c:
    free(c);
    return rc;
}

void mesh_coll_destroy(mesh_coll_t *c)
{
    if (!c)
        return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->qcv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    for (int i = 0; i < c->nbufs; i++) {
        if (c->bufs[i].mr)
            c->ops->dereg_mr(c->t, c->bufs[i].mr);
        if (c->bufs[i].owned)
            bufent_free(c, &c->bufs[i]);
    }
    free(c->bufs);
    if (c->scratch_mr)
        c->ops->dereg_mr(c->t, c->scratch_mr);
    pinned_free(c, c->scratch, c->scratch_len);
    if (c->ops->seq_done)
        c->ops->seq_done(c->t, c->opts.seq_base, UINT64_MAX);
    pthread_cond_destroy(&c->dcv);
    pthread_cond_destroy(&c->qcv);
    pthread_mutex_destroy(&c->mu);
    hosts_free(&c->hosts);
    free(c);
}
