/*
 * train/whash.c: a member's weights' SHA-256 for a view change, computed
 * ahead on a thread of its own (doc/elastic.md, "The view change's own
 * cost").
 *
 * Every peer hashes its weights and momentum once per view change: the
 * state transfer's digest and the weight check after the change are
 * built from those two SHA-256s (train.c, weights_hash: cell hashes, at
 * the end of this file). On the cpu
 * backend (host slabs) that pass over the state need not wait for the
 * view change:
 *
 *   - In a view change a member starts it as soon as its snapshot is
 *     restored, and opens the view's mesh meanwhile; the transfer and
 *     the weight check wait for it (train_whash_get).
 *   - While a peer asks to be admitted (mesh_elastic_joins: the members
 *     admit it at once), or catches up (mesh_elastic_held: it asks once
 *     its snapshot is loaded), the thread hashes the live state of the
 *     step in flight, every step. The view usually restarts from that
 *     step (a member still in its update has committed only the step
 *     before the boundary where another left), or from the next: its
 *     hashes are then ready, or under way, when the view change comes.
 *
 * Which bytes: the live weights and momentum of step s (from the end of
 * the update of s - 1, or a restore of s, until the update of s), then
 * those of snapshot slot s % 2, which the update of s fills with what it
 * overwrites (train.c, sgd_update) and which nothing writes until the
 * update of s + 2 (snap_take of s + 2 does not copy into a lazy slot;
 * train_whash_snap drops the slot's hash first anyway). Every writer of
 * those bytes holds the thread off first (train_whash_hold) and tells it
 * what they hold after: the update of s (train_whash_updated), a
 * restore (train_whash_restored), anything else (train_whash_forget).
 * The thread hashes in slices of WH_SLICE bytes, and a writer waits at
 * most one slice. A hash is used only for the step it names; any doubt
 * drops it, and the view change then hashes the weights itself, as
 * without this thread.
 */
#include "config.h"

#include "train/train-internal.h"
#include "common/util.h"
#include "transport/transport.h"

#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define WH_SLICE (4u << 20) /* bytes hashed between looks at the flags */
#define WH_POLL  0.02       /* s between looks for a joiner */
#define WH_NONE  UINT64_MAX

struct wh_slot {
    uint64_t step;         /* whose state; WH_NONE: empty */
    const uint8_t *src[2]; /* its parameters' and momentum's bytes */
    size_t off;            /* bytes hashed, of 2 x half */
    int done;              /* h holds the two SHA-256s */
    uint64_t ahead;        /* bytes hashed before the view change began */
    struct train_wch wc[2];
    uint8_t h[64];
};

struct train_wh {
    struct trainer *t;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int busy;      /* a writer holds the thread off */
    int reading;   /* the thread is in a slice (without mu) */
    uint64_t live; /* the live state's step; WH_NONE: unknown */
    size_t half;   /* bytes of the parameters (and of the momentum) */
    struct wh_slot s[2];
};

static void slot_clear(struct wh_slot *w)
{
    w->step = WH_NONE;
    w->off = 0;
    w->done = 0;
    w->ahead = 0;
}

static void slot_begin(struct train_wh *wh, struct wh_slot *w, uint64_t step,
                       const void *p, const void *m)
{
    slot_clear(w);
    w->step = step;
    w->src[0] = p;
    w->src[1] = m;
}

/* Under mu, with no slice in flight: the live state's bytes. */
static void live_src(struct train_wh *wh, const void **p, const void **m)
{
    *p = mesh_nn_model_params(wh->t->model);
    *m = mesh_nn_sgd_momentum(wh->t->sgd);
}

/* Under mu: the slot to hash next (the older step first), or NULL. */
static struct wh_slot *next_slot(struct train_wh *wh)
{
    struct wh_slot *a = &wh->s[0], *b = &wh->s[1];
    int oa = a->step != WH_NONE && !a->done,
        ob = b->step != WH_NONE && !b->done;

    if (oa && ob)
        return a->step < b->step ? a : b;
    return oa ? a : ob ? b : NULL;
}

/* Under mu: hash one slice of w (mu dropped meanwhile). */
static void slice(struct train_wh *wh, struct wh_slot *w)
{
    size_t half = wh->half, o, len;
    uint64_t step = w->step;
    int k = w->off >= half, ok = 1;

    for (int i = 0; i < 2 && w->off == 0; i++)
        ok = ok && train_wch_init(&w->wc[i], half) == 0;
    o = w->off - (size_t)k * half;
    len = MESH_MIN(half - o, (size_t)WH_SLICE);
    if (ok) {
        const uint8_t *src = w->src[k] + o;

        wh->reading = 1;
        pthread_mutex_unlock(&wh->mu);
        ok = train_wch_feed(&w->wc[k], src, len) == 0;
        pthread_mutex_lock(&wh->mu);
        wh->reading = 0;
        pthread_cond_broadcast(&wh->cv);
    }
    if (w->step != step) /* (dropped meanwhile: cannot happen) */
        return;
    if (!ok) {
        slot_clear(w); /* the view change hashes them itself */
        pthread_cond_broadcast(&wh->cv);
        return;
    }
    w->off += len;
    if (w->off < 2 * half)
        return;
    for (int i = 0; i < 2; i++)
        if (train_wch_final(&w->wc[i], w->h + 32 * i) < 0)
            ok = 0;
    if (ok)
        w->done = 1;
    else
        slot_clear(w);
    pthread_cond_broadcast(&wh->cv);
}

static void *wh_main(void *arg)
{
    struct train_wh *wh = arg;
    struct trainer *t = wh->t;

    pthread_mutex_lock(&wh->mu);
    while (!wh->stop) {
        struct wh_slot *w = wh->busy ? NULL : next_slot(wh);
        uint64_t live = wh->live;

        if (w) {
            slice(wh, w);
            continue;
        }
        /* a peer asks to be admitted: the members admit it at once, from
         * the state of the step in flight (or the one before); or it
         * catches up (a held request): it asks once its snapshot is
         * loaded, within a step or two, so every step's state is hashed
         * meanwhile, beside the training, not in the view change */
        if (!wh->busy && live != WH_NONE && wh->s[live & 1].step != live) {
            uint64_t joins;

            pthread_mutex_unlock(&wh->mu);
            joins = mesh_elastic_joins(t->el) | mesh_elastic_held(t->el);
            pthread_mutex_lock(&wh->mu);
            if (joins && !wh->busy && !wh->stop && wh->live == live &&
                wh->s[live & 1].step != live) {
                const void *p, *m;

                live_src(wh, &p, &m);
                slot_begin(wh, &wh->s[live & 1], live, p, m);
                continue;
            }
        }
        mesh_cond_sleep(&wh->cv, &wh->mu,
                        mesh_now_ns() + (uint64_t)(WH_POLL * 1e9));
    }
    pthread_mutex_unlock(&wh->mu);
    return NULL;
}

int train_whash_start(struct trainer *t)
{
    struct train_wh *wh;
    int rc;

    if (!t->el || t->sim || !t->host_slabs || !t->nparams || t->wh)
        return 0;
    wh = calloc(1, sizeof(*wh));
    if (!wh)
        return mesh_err(-ENOMEM, "out of memory");
    wh->t = t;
    wh->live = WH_NONE;
    wh->half = t->nparams * 4;
    slot_clear(&wh->s[0]);
    slot_clear(&wh->s[1]);
    pthread_mutex_init(&wh->mu, NULL);
    rc = mesh_cond_init_monotonic(&wh->cv);
    if (rc != 0) {
        pthread_mutex_destroy(&wh->mu);
        free(wh);
        return mesh_err(-EIO, "pthread_cond_init (the weights' hash)");
    }
    rc = pthread_create(&wh->th, NULL, wh_main, wh);
    if (rc != 0) {
        pthread_cond_destroy(&wh->cv);
        pthread_mutex_destroy(&wh->mu);
        free(wh);
        return mesh_err(-rc, "pthread_create (the weights' hash)");
    }
    t->wh = wh;
    return 0;
}

void train_whash_stop(struct trainer *t)
{
    struct train_wh *wh = t->wh;

    if (!wh)
        return;
    pthread_mutex_lock(&wh->mu);
    wh->stop = 1;
    pthread_cond_broadcast(&wh->cv);
    pthread_mutex_unlock(&wh->mu);
    pthread_join(wh->th, NULL);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++)
            train_wch_free(&wh->s[i].wc[k]);
    pthread_cond_destroy(&wh->cv);
    pthread_mutex_destroy(&wh->mu);
    free(wh);
    t->wh = NULL;
}

void train_whash_hold(struct trainer *t)
{
    struct train_wh *wh = t->wh;

    if (!wh)
        return;
    pthread_mutex_lock(&wh->mu);
    wh->busy++;
    while (wh->reading)
        pthread_cond_wait(&wh->cv, &wh->mu);
    pthread_mutex_unlock(&wh->mu);
}

/* Under mu: a writer is done. */
static void release(struct train_wh *wh)
{
    wh->busy--;
    pthread_cond_broadcast(&wh->cv);
}

void train_whash_updated(struct trainer *t, uint64_t step, int ok)
{
    struct train_wh *wh = t->wh;
    const struct train_snap *sn = &t->snap[step & 1];
    struct wh_slot *w;

    if (!wh)
        return;
    pthread_mutex_lock(&wh->mu);
    w = &wh->s[step & 1];
    /* the state of step now lives in its snapshot slot only (the update
     * kept what it overwrote there), whole unless the slot is lazy */
    if (w->step == step) {
        if (ok && sn->valid && sn->step == step && !sn->lazy && sn->params) {
            w->src[0] = (const uint8_t *)sn->params;
            w->src[1] = (const uint8_t *)sn->mom;
        } else {
            slot_clear(w);
        }
    }
    wh->live = ok ? step + 1 : WH_NONE;
    release(wh);
    pthread_mutex_unlock(&wh->mu);
}

void train_whash_snap(struct trainer *t, uint64_t step)
{
    struct train_wh *wh = t->wh;
    struct wh_slot *w;

    if (!wh)
        return;
    train_whash_hold(t);
    pthread_mutex_lock(&wh->mu);
    w = &wh->s[step & 1];
    if (w->step != step) /* (that of step - 2, whose slot is reused) */
        slot_clear(w);
    release(wh);
    pthread_mutex_unlock(&wh->mu);
}

void train_whash_restored(struct trainer *t, uint64_t step, int ok)
{
    struct train_wh *wh = t->wh;

    if (!wh)
        return;
    pthread_mutex_lock(&wh->mu);
    for (int i = 0; i < 2; i++) {
        struct wh_slot *w = &wh->s[i];

        /* a hash of step's state stays: of the live state (restored in
         * place, or lazy and left as it was) or of its snapshot slot
         * (restored from, not written) */
        if (!ok || w->step != step)
            slot_clear(w);
        else
            w->ahead = w->done ? 2 * wh->half : w->off;
    }
    if (ok && wh->s[step & 1].step != step) {
        const void *p, *m;

        live_src(wh, &p, &m);
        slot_begin(wh, &wh->s[step & 1], step, p, m);
    }
    wh->live = ok ? step : WH_NONE;
    release(wh);
    pthread_mutex_unlock(&wh->mu);
}

void train_whash_forget(struct trainer *t)
{
    struct train_wh *wh = t->wh;

    if (!wh)
        return;
    train_whash_hold(t);
    pthread_mutex_lock(&wh->mu);
    slot_clear(&wh->s[0]);
    slot_clear(&wh->s[1]);
    wh->live = WH_NONE;
    release(wh);
    pthread_mutex_unlock(&wh->mu);
}

int train_whash_get(struct trainer *t, uint64_t step, struct train_whash *out,
                    uint64_t *ahead)
{
    struct train_wh *wh = t->wh;
    struct wh_slot *w;

    *ahead = 0;
    if (!wh)
        return 0;
    pthread_mutex_lock(&wh->mu);
    w = &wh->s[step & 1];
    while (w->step == step && !w->done && !wh->stop)
        pthread_cond_wait(&wh->cv, &wh->mu);
    if (w->step == step && w->done) {
        memcpy(out->h, w->h, sizeof(out->h));
        out->valid = 1;
        *ahead = w->ahead;
    }
    pthread_mutex_unlock(&wh->mu);
    return out->valid;
}

/* ---- the cell hash ------------------------------------------------------- */

int train_wch_init(struct train_wch *c, size_t len)
{
    if (!c->cell)
        c->cell = EVP_MD_CTX_new();
    if (!c->top)
        c->top = EVP_MD_CTX_new();
    c->at = 0;
    c->len = len;
    if (!c->cell || !c->top ||
        EVP_DigestInit_ex(c->cell, EVP_sha256(), NULL) != 1 ||
        EVP_DigestInit_ex(c->top, EVP_sha256(), NULL) != 1)
        return -EIO;
    return 0;
}

int train_wch_feed(struct train_wch *c, const void *p, size_t n)
{
    const uint8_t *b = p;
    uint8_t h[32];
    unsigned int dl;

    if (n > c->len - c->at)
        return -EIO;
    while (n) {
        size_t in = c->at % TRAIN_WCELL, take = MESH_MIN(n, TRAIN_WCELL - in);

        if (EVP_DigestUpdate(c->cell, b, take) != 1)
            return -EIO;
        c->at += take;
        b += take;
        n -= take;
        /* a cell is whole: its SHA-256 into the list (the last cell's
         * in train_wch_final) */
        if (c->at % TRAIN_WCELL == 0 && c->at < c->len) {
            dl = 32;
            if (EVP_DigestFinal_ex(c->cell, h, &dl) != 1 || dl != 32 ||
                EVP_DigestUpdate(c->top, h, 32) != 1 ||
                EVP_DigestInit_ex(c->cell, EVP_sha256(), NULL) != 1)
                return -EIO;
        }
    }
    return 0;
}

int train_wch_final(struct train_wch *c, uint8_t out[32])
{
    uint8_t h[32];
    unsigned int dl = 32;

    if (c->at != c->len)
        return -EIO;
    /* the last cell (an empty string has one, empty) */
    if (EVP_DigestFinal_ex(c->cell, h, &dl) != 1 || dl != 32 ||
        EVP_DigestUpdate(c->top, h, 32) != 1)
        return -EIO;
    dl = 32;
    if (EVP_DigestFinal_ex(c->top, out, &dl) != 1 || dl != 32)
        return -EIO;
    return 0;
}

void train_wch_free(struct train_wch *c)
{
    EVP_MD_CTX_free(c->cell);
    EVP_MD_CTX_free(c->top);
    c->cell = c->top = NULL;
}

int train_wch_sum(const void *p, size_t len, uint8_t out[32])
{
    struct train_wch c = {0};
    int rc = train_wch_init(&c, len);

    if (rc == 0)
        rc = train_wch_feed(&c, p, len);
    if (rc == 0)
        rc = train_wch_final(&c, out);
    train_wch_free(&c);
    return rc;
}

int train_wch_top(const uint8_t *cells, size_t n, uint8_t out[32])
{
    return EVP_Digest(cells, 32 * n, out, NULL, EVP_sha256(), NULL) == 1 ? 0
                                                                         : -EIO;
}
