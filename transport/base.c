/*
 * transport/base.c: the one implementation of what the transports share
 * (see transport/base.h).
 */
#include "config.h"

#include "transport/base.h"
#include "common/dtype.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int tp_base_init(struct tp_base *b, const char *name,
                 const struct tp_base_ops *ops, const struct mesh_world *world,
                 const struct mesh_transport_opts *opts)
{
    b->name = name;
    b->ops = ops;
    b->opts = *opts;
    b->opts.secret = NULL;
    b->world = *world;
    b->peers = calloc((size_t)world->size, sizeof(*b->peers));
    if (!b->peers)
        return mesh_err(-ENOMEM, "out of memory");
    memcpy(b->peers, world->peers, (size_t)world->size * sizeof(*b->peers));
    b->world.peers = b->peers;
    /* wait_any's deadlines are on mesh_now_ns()'s clock (monotonic) */
    if (pthread_mutex_init(&b->lock, NULL))
        return mesh_err(-ENOMEM, "pthread init failed");
    if (mesh_cond_init_monotonic(&b->cond)) {
        pthread_mutex_destroy(&b->lock);
        return mesh_err(-ENOMEM, "pthread init failed");
    }
    b->sync_ready = 1;
    return 0;
}

void tp_base_fini(struct tp_base *b)
{
    if (b->sync_ready) {
        pthread_mutex_destroy(&b->lock);
        pthread_cond_destroy(&b->cond);
        b->sync_ready = 0;
    }
    free(b->peers);
    b->peers = NULL;
    free(b->got);
    b->got = NULL;
    b->ngot = b->capgot = 0;
}

void tp_fail_job(struct tp_base *b, int culprit, int code, int notify,
                 const char *fmt, ...)
{
    char reason[TP_MSG_MAX / 2], nb[300];
    struct tp_req *r, *inflight = NULL;
    va_list ap;

    if (b->fail.failed)
        return;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    /* The oldest pending operation involving the culprit, else the
     * oldest of all (the list runs newest first). */
    for (r = b->reqs; r; r = r->next) {
        if (atomic_load(&r->done))
            continue;
        if (!inflight || r->peer == culprit || inflight->peer != culprit)
            inflight = r;
    }
    if (inflight)
        mesh_failure_msg(b->fail.msg, sizeof(b->fail.msg), reason, &inflight->f,
                         inflight->kind == TP_SEND, inflight->peer,
                         tp_pname(b, inflight->peer, nb, sizeof(nb)));
    else
        mesh_failure_msg(b->fail.msg, sizeof(b->fail.msg), reason, NULL, 0, -1,
                         NULL);
    b->fail.failed = 1;
    b->fail.code = code;
    b->fail.culprit = culprit;
    memcpy(b->fail.reason, reason, sizeof(b->fail.reason));
    mesh_error_log("%s", b->fail.msg);
    pthread_cond_broadcast(&b->cond);
    b->ops->failed(b, culprit, code, notify, reason);
}

int tp_fail_err(struct tp_base *b)
{
    return mesh_err(b->fail.code, "%s", b->fail.msg);
}

void tp_failure_of(mesh_transport_t *t, struct tp_failure *out)
{
    struct tp_base *b = (struct tp_base *)t; /* super first */

    pthread_mutex_lock(&b->lock);
    *out = b->fail;
    pthread_mutex_unlock(&b->lock);
}

void tp_fail_left(struct tp_base *b, int peer)
{
    char nb[300];

    /* -ESHUTDOWN, not -ECONNRESET: it said goodbye, it did not die (an
     * --elastic member leaves its mesh for a view change so) */
    tp_fail_job(b, peer, -ESHUTDOWN, 1,
                "rank %d (%s) left the mesh with operations pending", peer,
                tp_pname(b, peer, nb, sizeof(nb)));
}

void tp_req_link(struct tp_base *b, struct tp_req *r)
{
    r->prev = NULL;
    r->next = b->reqs;
    if (b->reqs)
        b->reqs->prev = r;
    b->reqs = r;
}

void tp_req_unlink(struct tp_base *b, struct tp_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        b->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
}

void tp_req_done(struct tp_base *b, struct tp_req *r)
{
    atomic_store_explicit(&r->done, 1, memory_order_release);
    pthread_cond_broadcast(&b->cond);
}

struct tp_req *tp_req_pending(const struct tp_base *b, int peer)
{
    for (struct tp_req *r = b->reqs; r; r = r->next)
        if (r->peer == peer && !atomic_load(&r->done))
            return r;
    return NULL;
}

int tp_any_done(mesh_req_t *const *reqs, int n)
{
    for (int i = 0; i < n; i++) {
        struct tp_req *r = (struct tp_req *)reqs[i];

        if (r && atomic_load_explicit(&r->done, memory_order_acquire))
            return 1;
    }
    return 0;
}

int tp_frame_match(struct tp_base *b, int culprit, int receiver, int sender,
                   const struct mesh_frame *e, uint64_t claimed,
                   const struct mesh_frame *f, int check_len, const char *after)
{
    uint64_t end = e->offset + e->length;
    int starts_inside = e->length ? (f->offset >= e->offset && f->offset < end)
                                  : f->offset == e->offset;
    char fa[200], fb[200], rn[300], sn[300];

    if (e->seq != f->seq || e->tag != f->tag || !starts_inside)
        return 0;
    if (e->op != f->op || e->dtype != f->dtype || e->count != f->count) {
        tp_fail_job(b, culprit, -EPROTO, 1,
                    "desync between rank %d (%s), which expected %s, and "
                    "rank %d (%s), which sent %s",
                    receiver, tp_pname(b, receiver, rn, sizeof(rn)),
                    mesh_frame_str(e, fa, sizeof(fa)), sender,
                    tp_pname(b, sender, sn, sizeof(sn)),
                    mesh_frame_str(f, fb, sizeof(fb)));
        return -EPROTO;
    }
    if (check_len &&
        (f->length > end - f->offset || f->length > e->length - claimed)) {
        tp_fail_job(b, culprit, -EPROTO, 1,
                    "rank %d (%s) sent a frame beyond the posted receive "
                    "of rank %d (%s): got %s, expected %s (%" PRIu64
                    " bytes already claimed); %s",
                    sender, tp_pname(b, sender, sn, sizeof(sn)), receiver,
                    tp_pname(b, receiver, rn, sizeof(rn)),
                    mesh_frame_str(f, fb, sizeof(fb)),
                    mesh_frame_str(e, fa, sizeof(fa)), claimed, after);
        return -EPROTO;
    }
    return 1;
}

/* The owner of seq, or NULL. */
static const struct tp_seq_owner *seq_owner(const struct tp_base *b,
                                            uint64_t seq)
{
    const struct tp_seq_owner *o = NULL;

    for (int i = 0; i < TP_SEQ_OWNERS; i++)
        if (b->seqs[i].used && b->seqs[i].base <= seq &&
            seq < MESH_SEQ_OWN_BASE && (!o || b->seqs[i].base > o->base))
            o = &b->seqs[i];
    return o;
}

/* a * b, or UINT64_MAX where it overflows */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

int tp_frame_check(struct tp_base *b, int sender, const struct mesh_frame *f)
{
    uint64_t es = mesh_dtype_size(f->dtype), span, low = 0;
    const struct tp_seq_owner *o = NULL;
    char fb[200], sn[300];
    const char *why = NULL;

    /* The collective's bytes: its count of elements, the ranks' blocks
     * of them where each rank holds one (an unknown dtype or op is a
     * desync, which matching names). */
    span = mul_sat(f->count, es);
    if (f->op == MESH_OP_REDUCE_SCATTER || f->op == MESH_OP_ALLGATHER ||
        f->op == MESH_OP_PS)
        span = mul_sat(span, (uint64_t)b->world.size);
    if (es && (f->offset > span || f->length > span - f->offset))
        why = "a frame past its own collective's bytes";
    if (!why)
        o = seq_owner(b, f->seq);
    if (o) {
        low = o->low;
        if (f->seq < low)
            why = "a frame of a collective that finished here (a duplicate "
                  "or a stale frame: no receive will ever match it)";
        else if (f->seq - low >= MESH_SEQ_AHEAD)
            why = "a frame too far ahead (2^24 collectives or more past the "
                  "one running here)";
    }
    if (!why)
        return 0;
    tp_fail_job(b, sender, -EPROTO, 1, "rank %d (%s) sent %s: %s", sender,
                tp_pname(b, sender, sn, sizeof(sn)), why,
                mesh_frame_str(f, fb, sizeof(fb)));
    return -EPROTO;
}

void tp_recv_got(struct tp_base *b, const struct tp_req *r)
{
    if (!seq_owner(b, r->f.seq))
        return;
    if (b->ngot == b->capgot) {
        size_t cap = b->capgot ? 2 * b->capgot : 64;
        struct tp_got *g = realloc(b->got, cap * sizeof(*g));

        if (!g)
            return; /* unchecked, not wrong */
        b->got = g;
        b->capgot = cap;
    }
    b->got[b->ngot++] = (struct tp_got){.peer = r->peer,
                                        .tag = r->f.tag,
                                        .seq = r->f.seq,
                                        .offset = r->f.offset,
                                        .length = r->f.length};
}

int tp_frame_unmatched(struct tp_base *b, int sender,
                       const struct mesh_frame *f)
{
    char fb[200], sn[300];

    for (size_t i = 0; i < b->ngot; i++) {
        const struct tp_got *g = &b->got[i];

        if (g->peer != sender || g->seq != f->seq || g->tag != f->tag ||
            !(g->length
                  ? f->offset >= g->offset && f->offset - g->offset < g->length
                  : f->offset == g->offset))
            continue;
        tp_fail_job(b, sender, -EPROTO, 1,
                    "rank %d (%s) sent a duplicate: %s, of a message received "
                    "in full",
                    sender, tp_pname(b, sender, sn, sizeof(sn)),
                    mesh_frame_str(f, fb, sizeof(fb)));
        return -EPROTO;
    }
    return 0;
}

void tp_seq_done(struct tp_base *b, uint64_t base, uint64_t low)
{
    struct tp_seq_owner *free_one = NULL;
    size_t n = 0;

    /* the receives of finished seqs: tp_frame_check covers them */
    for (size_t i = 0; i < b->ngot; i++)
        if (!(b->got[i].seq >= base && b->got[i].seq < low))
            b->got[n++] = b->got[i];
    b->ngot = n;

    for (int i = 0; i < TP_SEQ_OWNERS; i++) {
        struct tp_seq_owner *o = &b->seqs[i];

        if (o->used && o->base == base) {
            if (low == UINT64_MAX)
                o->used = 0;
            else
                o->low = low;
            return;
        }
        if (!o->used && !free_one)
            free_one = o;
    }
    /* more owners than kept: the newest goes unchecked */
    if (free_one && low != UINT64_MAX)
        *free_one = (struct tp_seq_owner){.used = 1, .base = base, .low = low};
}

int tp_check_buf(const struct tp_base *b, const char *what,
                 const struct mesh_frame *f, const void *buf)
{
    if (f->length && !buf)
        return mesh_err(-EINVAL, "%s %s: NULL buffer", b->name, what);
    if (f->offset + f->length < f->offset)
        return mesh_err(-EINVAL, "%s %s: range overflows", b->name, what);
    return 0;
}

int tp_check_peer(struct tp_base *b, int peer, const char *what)
{
    if (peer < 0 || peer >= b->world.size || peer == b->world.rank)
        return mesh_err(-EINVAL, "%s %s: invalid peer %d (rank %d of %d)",
                        b->name, what, peer, b->world.rank, b->world.size);
    if (b->fail.failed)
        return tp_fail_err(b);
    return 0;
}

int tp_test(struct tp_base *b, mesh_req_t *req, int *done)
{
    struct tp_req *r = (struct tp_req *)req;
    int rc = 0;

    if (!r)
        return mesh_err(-EINVAL, "%s test: NULL request", b->name);
    pthread_mutex_lock(&b->lock);
    if (atomic_load(&r->done)) {
        b->ops->req_free(b, r, 0);
        *done = 1;
    } else if (b->fail.failed) {
        rc = tp_fail_err(b);
        b->ops->req_free(b, r, 1);
        *done = 1;
    } else {
        *done = 0;
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int tp_wait_sleep(struct tp_base *b, mesh_req_t *const *reqs, int n,
                  uint64_t deadline_ns, double timeout_s)
{
    for (;;) {
        if (tp_any_done(reqs, n))
            return 0;
        if (b->fail.failed)
            return tp_fail_err(b);
        if (mesh_cond_sleep(&b->cond, &b->lock, deadline_ns) < 0)
            return mesh_err(-ETIMEDOUT,
                            "%s wait: no request completed within %.3f s",
                            b->name, timeout_s);
    }
}

int tp_progress(struct tp_base *b)
{
    int rc = 0;

    pthread_mutex_lock(&b->lock);
    if (b->fail.failed)
        rc = tp_fail_err(b);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int tp_ctrl_exchange(const struct tp_base *b,
                     const struct mesh_transport_ops *ops,
                     mesh_transport_t *inner, uint64_t seq, uint32_t tag,
                     const uint8_t *out, size_t out_stride, uint8_t *in,
                     size_t len)
{
    int n = b->world.size, rc = 0, rc2;
    mesh_req_t **rq = calloc((size_t)n * 2, sizeof(*rq));

    if (!rq)
        return mesh_err(-ENOMEM, "out of memory");
    for (int p = 0; p < n && rc == 0; p++) {
        struct mesh_frame f = {.seq = seq,
                               .tag = tag,
                               .op = MESH_OP_P2P,
                               .dtype = MESH_DT_BYTE,
                               .count = len,
                               .length = len};

        if (p == b->world.rank)
            continue;
        rc = ops->irecv(inner, p, &f, in + (size_t)p * len, NULL, &rq[2 * p]);
        if (rc == 0)
            rc = ops->isend(inner, p, &f, out + (size_t)p * out_stride, NULL,
                            &rq[2 * p + 1]);
    }
    for (int i = 0; i < 2 * n; i++) {
        if (!rq[i])
            continue;
        rc2 = mesh_transport_wait(ops, inner, rq[i]);
        if (rc == 0)
            rc = rc2;
    }
    free(rq);
    return rc;
}

enum tp_wire tp_test_wire(struct mesh_frame *f, int slot)
{
    static const char *const kinds[] = {
        "op",   "dtype", "count", "seq",  "tag", "offset", "length",
        "long", "huge",  "magic", "kind", "dup", "stale"};
    static atomic_int kind = -1; /* -1: not read yet; 0: none */
    static atomic_ulong left;
    int k = atomic_load(&kind);

    if (k < 0) {
        const char *v = getenv("MESHTRAIN_TEST_WIRE");
        unsigned long n = 1;

        k = 0;
        for (size_t i = 0; v && i < MESH_ARRAY_SIZE(kinds); i++) {
            size_t len = strlen(kinds[i]);

            if (!strncmp(v, kinds[i], len) &&
                (v[len] == '\0' || v[len] == ':')) {
                k = (int)i + 1;
                if (v[len] == ':')
                    n = strtoul(v + len + 1, NULL, 10);
                break;
            }
        }
        atomic_store(&left, n ? n : 1);
        atomic_store(&kind, k);
    }
    /* magic is a TCP header's, kind a ring slot's: the frames of the
     * other count not */
    if (!k || (k == 10 && slot) || (k == 11 && !slot) ||
        atomic_fetch_sub(&left, 1) != 1)
        return TP_WIRE_NONE;
    fprintf(stderr, "meshtrain: test aid: a hostile frame (%s)\n",
            kinds[k - 1]);
    switch (k) {
    case 1:
        f->op =
            f->op == MESH_OP_ALLGATHER ? MESH_OP_BROADCAST : MESH_OP_ALLGATHER;
        break;
    case 2:
        f->dtype ^= 1;
        break;
    case 3:
        f->count += 1;
        break;
    case 4:
        f->seq += UINT64_C(1) << 32;
        break;
    case 5:
        f->tag += 1000;
        break;
    case 6:
        f->offset += f->length + 4096;
        break;
    case 7:
        f->length += 1;
        break;
    case 8:
        f->length += 64u << 10;
        break;
    case 9:
        f->length = UINT64_C(1) << 62;
        break;
    case 10:
        return TP_WIRE_MAGIC;
    case 11:
        return TP_WIRE_KIND;
    default:
        return TP_WIRE_DUP;
    }
    return TP_WIRE_HEADER;
}
