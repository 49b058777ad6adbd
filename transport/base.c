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
    for (int i = 0; i < TP_SEQ_OWNERS; i++) {
        free(b->seqs[i].exp);
        free(b->seqs[i].due);
    }
    memset(b->seqs, 0, sizeof(b->seqs));
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

/*
 * Fail the job blaming culprit for a desync between receiver, which
 * expected e, and sender, which sent f (then tail): -EPROTO.
 */
static int fail_desync(struct tp_base *b, int culprit, int receiver,
                       const struct mesh_frame *e, int sender,
                       const struct mesh_frame *f, const char *tail)
{
    char fa[200], fb[200], rn[300], sn[300];

    tp_fail_job(b, culprit, -EPROTO, 1,
                "desync between rank %d (%s), which expected %s, and rank %d "
                "(%s), which sent %s%s",
                receiver, tp_pname(b, receiver, rn, sizeof(rn)),
                mesh_frame_str(e, fa, sizeof(fa)), sender,
                tp_pname(b, sender, sn, sizeof(sn)),
                mesh_frame_str(f, fb, sizeof(fb)), tail);
    return -EPROTO;
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
    if (e->op != f->op || e->dtype != f->dtype || e->count != f->count)
        return fail_desync(b, culprit, receiver, e, sender, f, "");
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

/* An owner whose running part f is of: 1 (*o set), else 0. */
static int part_of(const struct tp_base *b, const struct mesh_frame *f,
                   const struct tp_seq_owner **o)
{
    *o = seq_owner(b, f->seq);
    return *o && (*o)->plan && f->seq == (*o)->part.seq &&
           f->op == (*o)->part.op;
}

/* o's running part as a frame in f's place (tag, offset, length), for
 * messages */
static const struct mesh_frame *part_as(const struct tp_seq_owner *o,
                                        const struct mesh_frame *f,
                                        struct mesh_frame *out)
{
    *out = o->part;
    out->tag = f->tag;
    out->offset = f->offset;
    out->length = f->length;
    return out;
}

/* (peer, tag) order of the receives, for the binary search */
static int exp_cmp(const void *x, const void *y)
{
    const struct tp_exp *a = x, *c = y;

    if (a->peer != c->peer)
        return a->peer < c->peer ? -1 : 1;
    return a->tag < c->tag ? -1 : a->tag > c->tag;
}

/* The first of o's receives from peer of tag (its equals follow), or
 * NULL. */
static struct tp_exp *exp_find(const struct tp_seq_owner *o, int peer,
                               uint32_t tag)
{
    size_t lo = 0, hi = o->nexp;
    struct tp_exp key = {.peer = peer, .tag = tag};

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (exp_cmp(&o->exp[mid], &key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < o->nexp && !exp_cmp(&o->exp[lo], &key) ? &o->exp[lo] : NULL;
}

/* Whether e, at or past exp_find's answer, is still one of (peer, tag). */
static int exp_is(const struct tp_seq_owner *o, const struct tp_exp *e,
                  int peer, uint32_t tag)
{
    return e && e < o->exp + o->nexp && e->peer == peer && e->tag == tag;
}

/* Whether f starts in receive e (transport.h's matching rule). */
static int exp_holds(const struct tp_exp *e, const struct mesh_frame *f)
{
    return e->length
               ? f->offset >= e->offset && f->offset - e->offset < e->length
               : f->offset == e->offset;
}

void tp_expect(struct tp_base *b, const struct mesh_frame *f,
               const struct mesh_expect *recv, size_t n)
{
    struct tp_seq_owner *o = (struct tp_seq_owner *)seq_owner(b, f->seq);
    size_t nb = (size_t)b->world.size * sizeof(*o->due);

    if (!o)
        return;
    o->prev_op = o->plan && o->part.seq == f->seq ? o->part.op : -1;
    o->plan = 0;
    if (n > o->capexp) {
        struct tp_exp *e = realloc(o->exp, n * sizeof(*e));

        if (!e)
            return; /* unchecked, not wrong */
        o->exp = e;
        o->capexp = n;
    }
    if (!o->due && !(o->due = malloc(nb)))
        return;
    memset(o->due, 0, nb);
    for (size_t i = 0; i < n; i++) {
        o->exp[i] = (struct tp_exp){.peer = recv[i].peer,
                                    .tag = recv[i].tag,
                                    .offset = recv[i].offset,
                                    .length = recv[i].length};
        if (recv[i].peer >= 0 && recv[i].peer < b->world.size)
            o->due[recv[i].peer]++;
    }
    o->nexp = n;
    qsort(o->exp, n, sizeof(*o->exp), exp_cmp);
    o->part = *f;
    o->plan = 1;
}

void tp_recv_got(struct tp_base *b, const struct tp_req *r)
{
    const struct tp_seq_owner *co;
    struct tp_seq_owner *o;
    struct tp_exp *e;

    if (!part_of(b, &r->f, &co))
        return;
    o = (struct tp_seq_owner *)co;
    for (e = exp_find(o, r->peer, r->f.tag); exp_is(o, e, r->peer, r->f.tag);
         e++)
        if (!e->done && exp_holds(e, &r->f)) {
            e->done = 1;
            o->due[r->peer]--;
            return;
        }
}

/* Whether f is of a part after o's running one (a later seq, or another
 * op of its seq than the running part's and the one before it). */
static int part_later(const struct tp_seq_owner *o, const struct mesh_frame *f)
{
    return f->seq > o->part.seq || (f->seq == o->part.seq &&
                                    f->op != o->part.op && f->op != o->prev_op);
}

int tp_frame_later(const struct tp_base *b, int sender,
                   const struct mesh_frame *f)
{
    const struct tp_seq_owner *o = seq_owner(b, f->seq);

    return o && o->plan && o->due[sender] > 0 && part_later(o, f);
}

int tp_frame_unmatched(struct tp_base *b, int sender,
                       const struct mesh_frame *f)
{
    const struct tp_seq_owner *o;
    const struct tp_exp *e, *in = NULL;
    struct mesh_frame pe;
    char fb[200], sn[300];
    const char *why;

    if (!part_of(b, f, &o)) {
        if (!o || !o->plan || part_later(o, f))
            return tp_frame_later(b, sender, f);
        /* the owner runs its parts in order, each to its end */
        why = "a frame of a part of a collective that finished here (a "
              "duplicate or a stale frame: no receive will ever match it)";
    } else if (f->dtype != o->part.dtype || f->count != o->part.count) {
        return fail_desync(b, sender, b->world.rank, part_as(o, f, &pe), sender,
                           f, "");
    } else {
        for (e = exp_find(o, sender, f->tag); exp_is(o, e, sender, f->tag); e++)
            if (exp_holds(e, f) && (!in || in->done))
                in = e;
        if (!in)
            why = "a frame that no receive of its collective here expects "
                  "(another step or offset)";
        else if (in->done)
            why = "a duplicate, of a message received in full";
        else if (f->length > in->offset + in->length - f->offset)
            why = "a frame past the end of its message";
        else
            return 0;
    }
    tp_fail_job(b, sender, -EPROTO, 1, "rank %d (%s) sent %s: %s", sender,
                tp_pname(b, sender, sn, sizeof(sn)), why,
                mesh_frame_str(f, fb, sizeof(fb)));
    return -EPROTO;
}

int tp_fail_order(struct tp_base *b, int sender, const struct mesh_frame *f)
{
    const struct tp_seq_owner *o = seq_owner(b, f->seq);
    struct mesh_frame pe;
    char fb[200], sn[300];

    if (o && o->plan && f->seq == o->part.seq)
        return fail_desync(b, sender, b->world.rank, part_as(o, f, &pe), sender,
                           f, " ahead of frames of it still due from it");
    tp_fail_job(b, sender, -EPROTO, 1,
                "rank %d (%s) sent a frame of a later collective or part, %s, "
                "ahead of frames of the one running here that are still due "
                "from it (it cannot have finished that one; every stream "
                "from it waits so)",
                sender, tp_pname(b, sender, sn, sizeof(sn)),
                mesh_frame_str(f, fb, sizeof(fb)));
    return -EPROTO;
}

void tp_seq_done(struct tp_base *b, uint64_t base, uint64_t low)
{
    struct tp_seq_owner *free_one = NULL;

    for (int i = 0; i < TP_SEQ_OWNERS; i++) {
        struct tp_seq_owner *o = &b->seqs[i];

        if (o->used && o->base == base) {
            /* the part running is finished: the low covers its frames */
            if (o->plan && o->part.seq < low)
                o->plan = 0;
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
    if (free_one && low != UINT64_MAX) {
        free_one->used = 1;
        free_one->base = base;
        free_one->low = low;
        free_one->plan = 0;
    }
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

enum tp_wire tp_test_wire(struct mesh_frame *f, const struct mesh_frame *msg,
                          int slot)
{
    static const char *const kinds[] = {
        "op",   "dtype", "count", "seq", "tag",   "offset", "length", "long",
        "huge", "magic", "kind",  "dup", "stale", "ahead",  "inside"};
    static atomic_int kind = -1; /* -1: not read yet; 0: none */
    static atomic_ulong left;
    int k = atomic_load(&kind);
    uint64_t span;

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
    if (!k)
        return TP_WIRE_NONE;
    /* magic is a TCP header's, kind a ring slot's: the frames of the
     * other count not; inside counts only the frames it can move past
     * their message (one that ends before its collective's last bytes) */
    span = mul_sat(f->count, mesh_dtype_size(f->dtype));
    if ((k == 10 && slot) || (k == 11 && !slot) ||
        (k == 15 &&
         (span < f->length || span - f->length < msg->offset + msg->length)) ||
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
    case 13:
        f->seq -= 1;
        break;
    case 14:
        f->seq += 2;
        break;
    case 15:
        f->offset = span - f->length;
        break;
    default:
        return TP_WIRE_DUP;
    }
    return TP_WIRE_HEADER;
}
