/*
 * train/catchup.c: --elastic joiners catch up while the job trains
 * (doc/elastic.md, "Catching up").
 *
 * A joiner does not stop the members for the whole state. Before it asks
 * to be admitted it fetches a snapshot on side connections of its own,
 * while the members go on training, and replays the steps that pass:
 *
 *   - Every member serves a TCP port (told in its STATUS answers, see
 *     train/elastic.h) from a thread of its own.
 *   - The joiner starts as soon as a running member answered its JOIN,
 *     while it builds its model. It connects to every member of the
 *     current view; each says HELLO (its view, the step of its live
 *     state, a nonce, its parameter count). The joiner names X, the
 *     highest live step, and its stripe j of K (the member's rank in the
 *     view) in AUTH, signed with the job secret over the nonce.
 *   - A member's live weights and momentum are those of step k from the
 *     end of the update of k - 1 (or boundary k) until the update of k,
 *     the same bytes on every member. Its side thread copies stripe j of
 *     the snapshot of X (a 64-byte header, the weights, the momentum)
 *     as soon as its live state is X's and not being updated: at once,
 *     or right after the update of X - 1 for a member a little behind;
 *     LATE once the update of X is done (the joiner names X + 1). The
 *     update waits for a copy under way (train_serve_grad takes mu).
 *   - It sends the stripe at once (SNAP) and hashes it meanwhile, in
 *     slices between its sends; the stripe's SHA-256 follows (DIGEST);
 *     then, after the all-reduce of every step k >= X, stripe j of the
 *     reduced gradient and the step's learning rate (GRAD). Training
 *     never waits for the joiner (but for the one copy, when the update
 *     comes during it): a joiner more than CU_QUEUE records behind is
 *     dropped.
 *   - The joiner hashes each stripe as its bytes come, checks it against
 *     its sender's SHA-256, loads the snapshot once its model is built,
 *     and applies each step's gradient with the members' own optimizer
 *     code (the same inputs give the same bits). Step k is applied once
 *     a record of step k + 1 has come: every member then took the
 *     snapshot of k + 1, so no view can restart before it.
 *   - Caught up, it asks to be admitted. The view change that admits it
 *     restarts from some step r; the joiner applies what it holds up to
 *     r, and the state transfer (train/xfer.c) then sends it only the
 *     chunks it could not rebuild (the header and the BN statistics): the
 *     SHA-256 of the whole state, agreed by the senders, proves the rest.
 *
 * On a device backend (--device cuda, devsim) a member serves the host copy
 * of its boundary's snapshot (train.c, snap_take) and downloads the reduced
 * gradients; the joiner loads the snapshot into the device and replays
 * there, with the members' optimizer kernel (doc/elastic.md, "On a device
 * backend").
 *
 * Anything that goes wrong (a view change among the members, a member or
 * the joiner dying, a record out of place) ends the catch-up; the joiner
 * then asks to be admitted as before and receives the whole state in the
 * view change. Every size, step and range from the network is checked.
 */
#include "config.h"

#include "train/train-internal.h"

#include "common/bytes.h"
#include "common/util.h"
#include "train/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define CU_MAGIC   0x4355544dU /* "MTUC": a record */
#define CU_MAGIC_B 0x4255544dU /* "MTUB": the snapshot buffer */
#define CU_VERSION 5           /* 5: a stripe's SHA-256 of its pieces' */
#define CU_HDR     96          /* every record's header */
#define CU_BLOB    64          /* the snapshot buffer's header */
#define CU_SESS    8           /* joiners served at once */
#define CU_QUEUE   16 /* records queued for one joiner; more: dropped */
#define CU_RING    4  /* steps of gradient a joiner holds */
#define CU_TRIES   8
#define CU_SLICE   (8u << 20) /* bytes hashed between two polls */
#define CU_COPY    (4u << 20) /* bytes of a stripe copied between two polls */

enum {
    K_HELLO = 1,  /* member: epoch, members, last boundary, nonce */
    K_AUTH = 2,   /* joiner: epoch, step X, stripe j of K, HMAC */
    K_LATE = 3,   /* member: boundary X has passed (its last boundary) */
    K_REFUSE = 4, /* member: the request does not fit its view */
    K_SNAP = 5,   /* member: step, size, offset, length; bytes */
    K_GRAD = 6,   /* member: step, lr, offset, count; floats */
    K_DIGEST = 7, /* member: step, its stripe's SHA-256 (cu_sh) */
    K_RDMA = 8,   /* either: a side channel's address, nonce, HMAC */
    K_ACK = 9,    /* joiner: the GRAD record of step read over RDMA */
};

/* HELLO's bytes 64-67: the member's last step, in ms (0: not known). Not
 * signed, as the rest of HELLO: the joiner only weighs whether to catch
 * up with it (cu_worth), and either way ends with the state the view
 * agreed. */
#define CU_STEP_MS 64

/* Side channels (--transport verbs; doc/elastic.md, "Catching up over
 * verbs"): HELLO's byte 56 says the member offers them, AUTH's byte 40
 * that the joiner's K_RDMA follows; a SNAP or GRAD record with byte 52
 * set carries no bytes but the address (40) and rkey (48) the joiner
 * reads them at. */
#define CU_OFFER_RDMA 1
#define CU_VIA_RDMA   1

/* Every record a member sends after the joiner's AUTH (SNAP, DIGEST, GRAD,
 * LATE, REFUSE) is signed: its sequence number (1, 2, ... on the session)
 * in bytes 56-63 and, in bytes 64-95, the HMAC-SHA256 under the job secret
 * of bytes 0-63 and the joiner's nonce (AUTH's bytes 44-59), as the
 * members' K_RDMA answer is; the joiner checks it before it reads a field
 * (an address and rkey to read over RDMA among them). A record that does
 * not verify is refused, naming the member, and the joiner fetches that
 * member's stripe from the others (cu_try: shun). */
#define CU_SEQ    56
#define CU_NONCE  44 /* AUTH: the joiner's nonce */
#define CU_DIGEST 24 /* DIGEST: the stripe's SHA-256 */

/*
 * Test aid MESHTRAIN_TEST_SIDE=MODE[@STEP][,MODE[@STEP]...]
 * (tests/verbs/guest.sh, the rejoin part): "none": this process opens no
 * side channel device (its catch-up, as a joiner or a member, goes over
 * TCP). The other modes are a member's, each taken once, in the list's
 * order, by the first session that comes to it once this member's live
 * step is STEP or later (default 0): "refuse" answers a joiner's side
 * channel address with none; "garble" with a malformed one (both come
 * first on the session: the joiner reads them before any other record,
 * cu_answers); "late" answers a joiner's AUTH with LATE (at our live
 * step), which ends that try of the joiner early, whatever the other
 * members sent it. "forge" changes a byte (48: over RDMA, the rkey) of
 * its snapshot stripe's SNAP record after it is signed (the joiner must
 * refuse it); "silent" answers with the address of a queue pair it never
 * connects, so that no RDMA read of the joiner's is ever answered (the
 * joiner's read fails within --peer-timeout). The joiner may end a try
 * for another reason before it reads the record those two act on, so
 * each stands, once taken, for every later session of the same joiner
 * (its slot) until a view admits it.
 */
static pthread_mutex_t test_side_mu = PTHREAD_MUTEX_INITIALIZER;
static int test_side_at;         /* the modes taken so far */
static const char *test_side_on; /* a mode that stands, for ... */
static int test_side_slot;       /* ... this joiner */

static int test_side(const char *mode, int slot, uint64_t step)
{
    const char *v = getenv("MESHTRAIN_TEST_SIDE"), *p;
    size_t n = strlen(mode);
    int i = 0, hit = 0;

    if (!v)
        return 0;
    if (!strcmp(mode, "none")) {
        for (p = v; *p; p += strcspn(p, ","), p += *p == ',')
            if (!strncmp(p, "none", 4) && (p[4] == ',' || !p[4]))
                return 1;
        return 0;
    }
    pthread_mutex_lock(&test_side_mu);
    hit = test_side_on && !strcmp(test_side_on, mode) && test_side_slot == slot;
    for (p = v; *p && !hit; p += strcspn(p, ","), p += *p == ',') {
        if (!strncmp(p, "none", 4) && (p[4] == ',' || !p[4]))
            continue;
        if (i++ < test_side_at)
            continue;
        hit = !strncmp(p, mode, n) &&
              (p[n] == ',' || !p[n] ||
               (p[n] == '@' && step >= strtoull(p + n + 1, NULL, 10)));
        if (hit) {
            test_side_at++;
            if (!strcmp(mode, "forge") || !strcmp(mode, "silent")) {
                test_side_on = !strcmp(mode, "forge") ? "forge" : "silent";
                test_side_slot = slot;
            }
        }
        break;
    }
    pthread_mutex_unlock(&test_side_mu);
    if (hit)
        mesh_warn("MESHTRAIN_TEST_SIDE: %s, to slot %d (test aid)", mode, slot);
    return hit;
}

/* The test aid: a view admitted these slots; a mode that stood for one
 * of them ends. */
static void test_side_admitted(uint64_t members)
{
    pthread_mutex_lock(&test_side_mu);
    if (test_side_on && (members >> test_side_slot & 1))
        test_side_on = NULL;
    pthread_mutex_unlock(&test_side_mu);
}

/* The side channels' device (verbs), a member's or a joiner's; none
 * under the test aid's "none". */
static int side_dev_open(const struct mesh_transport_opts *o,
                         mesh_side_dev_t **out)
{
    if (test_side("none", -1, 0))
        return mesh_err(-ENODEV, "MESHTRAIN_TEST_SIDE=none");
    return mesh_side_dev_open(o, out);
}

static void hdr_init(uint8_t *h, int kind, int slot)
{
    memset(h, 0, CU_HDR);
    mesh_put_le32(h, CU_MAGIC);
    h[4] = CU_VERSION;
    h[5] = (uint8_t)kind;
    mesh_put_le16(h + 6, (uint16_t)slot);
}

static int auth_mac(const uint8_t *key, size_t keylen, const uint8_t *h,
                    const uint8_t nonce[16], uint8_t mac[32])
{
    uint8_t msg[64 + 16];
    unsigned int len = 32;

    memcpy(msg, h, 64);
    memcpy(msg + 64, nonce, 16);
    if (!HMAC(EVP_sha256(), key, (int)keylen, msg, sizeof(msg), mac, &len) ||
        len != 32)
        return -EIO;
    return 0;
}

static size_t blob_bytes(size_t nparams)
{
    return CU_BLOB + 8 * nparams;
}

/*
 * The snapshot buffer's cells: its header, then the cells of the weights'
 * and of the momentum's cell hashes (train_wch: TRAIN_WCELL bytes from
 * each one's start, the last shorter). A cell's index: 0 the header,
 * 1 + c the weights' cell c, 1 + nc + c the momentum's. cell_range: cell
 * idx's bytes [*lo, *hi); cell_at: the index of the cell that holds byte
 * pos, and its range. cells_of: the cells of a cell hash of half bytes.
 */
static size_t cells_of(size_t half)
{
    return half ? (half + TRAIN_WCELL - 1) / TRAIN_WCELL : 1;
}

static void cell_range(size_t np, size_t idx, size_t *lo, size_t *hi)
{
    size_t half = np * 4, nc = cells_of(half), base, c;

    if (idx == 0) {
        *lo = 0;
        *hi = CU_BLOB;
        return;
    }
    base = idx <= nc ? CU_BLOB : CU_BLOB + half;
    c = idx <= nc ? idx - 1 : idx - 1 - nc;
    *lo = base + MESH_MIN(c * TRAIN_WCELL, half);
    *hi = base + MESH_MIN((c + 1) * TRAIN_WCELL, half);
}

static size_t cell_at(size_t np, size_t pos, size_t *lo, size_t *hi)
{
    size_t half = np * 4, idx;

    if (pos < CU_BLOB)
        idx = 0;
    else if (pos < CU_BLOB + half)
        idx = 1 + (pos - CU_BLOB) / TRAIN_WCELL;
    else
        idx = 1 + cells_of(half) + (pos - CU_BLOB - half) / TRAIN_WCELL;
    cell_range(np, idx, lo, hi);
    return idx;
}

/*
 * A stripe's SHA-256 (its DIGEST record): the SHA-256 of the SHA-256s of
 * its pieces, the stripe [lo, hi) of the snapshot buffer cut at the
 * buffer's cell edges, fed in order. A joiner keeps the SHA-256 of every
 * piece that is a whole cell (cells, 32 bytes each, and ok: a byte per
 * cell), so that its stripes' hashes give the weights' and the
 * momentum's cell hashes too (cu_load): one pass over the state.
 */
struct cu_sh {
    EVP_MD_CTX *piece, *top;
    size_t np, pos, hi;
    size_t plo, phi; /* the piece being hashed */
    uint8_t *cells, *ok;
};

static void sh_free(struct cu_sh *h)
{
    EVP_MD_CTX_free(h->piece);
    EVP_MD_CTX_free(h->top);
    h->piece = h->top = NULL;
}

static int sh_init(struct cu_sh *h, size_t np, size_t lo, size_t hi,
                   uint8_t *cells, uint8_t *ok)
{
    if (!h->piece)
        h->piece = EVP_MD_CTX_new();
    if (!h->top)
        h->top = EVP_MD_CTX_new();
    h->np = np;
    h->pos = h->plo = h->phi = lo;
    h->hi = hi;
    h->cells = cells;
    h->ok = ok;
    if (!h->piece || !h->top ||
        EVP_DigestInit_ex(h->top, EVP_sha256(), NULL) != 1)
        return -1;
    return 0;
}

/* The stripe's next n bytes (from h->pos). 0, or -1. */
static int sh_feed(struct cu_sh *h, const uint8_t *b, size_t n)
{
    if (n > h->hi - h->pos)
        return -1;
    while (n) {
        size_t take, clo, chi, c;

        if (h->pos == h->phi) { /* a piece begins */
            (void)cell_at(h->np, h->pos, &clo, &chi);
            h->plo = h->pos;
            h->phi = MESH_MIN(chi, h->hi);
            if (EVP_DigestInit_ex(h->piece, EVP_sha256(), NULL) != 1)
                return -1;
        }
        take = MESH_MIN(n, h->phi - h->pos);
        if (EVP_DigestUpdate(h->piece, b, take) != 1)
            return -1;
        h->pos += take;
        b += take;
        n -= take;
        if (h->pos == h->phi) { /* a piece ends */
            uint8_t d[32];
            unsigned int dl = 32;

            if (EVP_DigestFinal_ex(h->piece, d, &dl) != 1 || dl != 32 ||
                EVP_DigestUpdate(h->top, d, 32) != 1)
                return -1;
            c = cell_at(h->np, h->plo, &clo, &chi);
            if (h->cells && h->plo == clo && h->phi == chi) {
                memcpy(h->cells + 32 * c, d, 32);
                h->ok[c] = 1;
            }
        }
    }
    return 0;
}

/* The stripe hashed whole: its SHA-256. 0, or -1. */
static int sh_final(struct cu_sh *h, uint8_t out[32])
{
    unsigned int dl = 32;

    if (h->pos != h->hi || EVP_DigestFinal_ex(h->top, out, &dl) != 1 ||
        dl != 32)
        return -1;
    return 0;
}

/* ---- the members' side --------------------------------------------------- */

/* One stripe of a snapshot: bytes [lo, hi) of the buffer of n bytes
 * (its 64-byte header, the weights, the momentum), shared by the
 * sessions that send that stripe; copied from the live state by the side
 * thread in slices of CU_COPY, each sent as soon as it is copied, and
 * hashed in slices of CU_SLICE as far as it is copied (hold: hashed
 * before a byte is sent, for the test aid that corrupts what is sent).
 * The copy is finished under mu before anything changes its source
 * (blobs_fill): the update, a view change, a new boundary's host copy. */
struct cu_blob {
    int refs;
    int hashed, hashing, bad, hold;
    struct cu_sh sh;
    size_t off;                /* hashed so far, from lo */
    size_t copied;             /* copied so far, from lo */
    const float *params, *mom; /* the source, until copied */
    size_t nparams;
    uint64_t step;
    uint8_t *b; /* hi - lo bytes */
    size_t n, lo, hi;
    uint8_t digest[32];
};

struct cu_item {
    struct cu_item *next;
    uint8_t hdr[CU_HDR];
    const uint8_t *data;
    size_t dlen, done;
    uint8_t *own;
    struct cu_blob *blob;
    int need_hash; /* sent once blob is hashed (DIGEST; SNAP with hold) */
    int pool;      /* GRAD read over RDMA: 1 + its session's gbuf */
    int forge;     /* test aid MESHTRAIN_TEST_SIDE=forge */
    int sig;       /* its header signed: once, though a full socket (EAGAIN)
                      makes it start again */
};

enum { S_FREE, S_HELLO, S_PINNED, S_STREAM, S_DRAIN };

struct cu_sess {
    int fd, state, shut;
    int hello; /* its HELLO is queued (serve_hello) */
    uint8_t nonce[16];
    uint8_t in[2 * CU_HDR]; /* AUTH, and the joiner's K_RDMA; K_ACK */
    size_t inlen, need;
    int slot, j, k;     /* the joiner, and the stripe j of k it asked for */
    uint8_t jnonce[16]; /* the joiner's (AUTH): our records are signed */
    uint64_t seq;       /* the records signed so far */
    uint64_t pin, next;
    int pin_live; /* the live state was pin's and stable when it asked */
    struct cu_item *head, *tail;
    int nq; /* queued, and lent */
    double since;
    /* over RDMA: the joiner reads its stripe (rblob, registered) and
     * each GRAD record's floats from gbuf (registered once, greg), which
     * stay lent until its K_ACK */
    mesh_side_t *side;
    struct cu_blob *rblob;
    uint8_t *gbuf[CU_QUEUE];
    int gused[CU_QUEUE], greg[CU_QUEUE];
    uint64_t gaddr[CU_QUEUE];
    uint32_t gkey[CU_QUEUE];
    struct cu_item *lent, *lent_tail;
};

struct train_serve {
    pthread_t th;
    int running, stop;
    int lfd, pipe[2];
    pthread_mutex_t mu;
    struct cu_sess s[CU_SESS];
    int valid, rank, size, me, nslots;
    uint64_t epoch, members;
    /* the step whose state the live weights and momentum hold (once
     * a boundary of the view passed), and whether they can be copied
     * now: not between the gradient's queueing and the end of the
     * update (train_serve_grad, train_serve_updated) */
    int live_valid, live_ok;
    uint64_t live;
    size_t nparams;
    /* the live weights and momentum: the model's with host slabs; on a
     * device backend (dev) the host copy of the boundary's snapshot
     * (train.c, snap_take: downloaded at every boundary, after the
     * previous update), which the update leaves alone: live moves at the
     * boundaries only, and the reduced gradients are downloaded */
    const float *params, *mom;
    int dev;
    struct trainer *t; /* the device's context; the test aid train_fault */
    uint8_t key[256];
    size_t keylen;
    mesh_side_dev_t *sdev; /* side channels' device (verbs), or NULL */
    double peer_timeout_s;
    /* the last boundary (step bstep, at bt) and the step before it took
     * step_s (0: not known yet): HELLO tells it */
    uint64_t bstep;
    double bt, step_s;
};

static void blob_unref(struct cu_blob *b)
{
    if (b && --b->refs == 0) {
        sh_free(&b->sh);
        free(b->b);
        free(b);
    }
}

static void item_free(struct cu_item *it)
{
    free(it->own);
    blob_unref(it->blob);
    free(it);
}

static struct cu_item *item_new(int kind, int slot)
{
    struct cu_item *it = calloc(1, sizeof(*it));

    if (it)
        hdr_init(it->hdr, kind, slot);
    return it;
}

static void push(struct cu_sess *ss, struct cu_item *it)
{
    if (!it)
        return;
    if (ss->tail)
        ss->tail->next = it;
    else
        ss->head = it;
    ss->tail = it;
    ss->nq++;
}

static void sess_close(struct cu_sess *ss)
{
    /* the queue pair first: nothing is read after this */
    mesh_side_close(ss->side);
    ss->side = NULL;
    while (ss->head) {
        struct cu_item *it = ss->head;

        ss->head = it->next;
        item_free(it);
    }
    while (ss->lent) {
        struct cu_item *it = ss->lent;

        ss->lent = it->next;
        item_free(it);
    }
    ss->tail = ss->lent_tail = NULL;
    ss->nq = 0;
    blob_unref(ss->rblob);
    ss->rblob = NULL;
    for (int q = 0; q < CU_QUEUE; q++) {
        free(ss->gbuf[q]);
        ss->gbuf[q] = NULL;
        ss->gused[q] = ss->greg[q] = 0;
    }
    if (ss->fd >= 0)
        close(ss->fd);
    ss->fd = -1;
    ss->state = S_FREE;
}

/* Under mu: tell the joiner why, then close once it is sent. */
static void sess_end(struct train_serve *sv, struct cu_sess *ss, int kind,
                     uint64_t arg)
{
    struct cu_item *it = item_new(kind, sv->me);

    if (it)
        mesh_put_le64(it->hdr + 8, arg);
    push(ss, it);
    ss->state = S_DRAIN;
    ss->since = mesh_now_s();
}

static void wake_serve(struct train_serve *sv)
{
    char c = 1;

    (void)!write(sv->pipe[1], &c, 1);
}

/* Under mu: up to max more bytes of b copied from its source (at most
 * the rest); 1 if more is left. */
static int blob_copy(struct cu_blob *b, size_t max)
{
    const uint8_t *src[2] = {(const uint8_t *)b->params,
                             (const uint8_t *)b->mom};
    size_t lo = b->lo + b->copied,
           hi = b->lo + b->copied + MESH_MIN(max, b->hi - b->lo - b->copied);

    /* the weights' bytes, then the momentum's, as far as they are in
     * [lo, hi) (the header was written when b was made) */
    for (int k = 0; k < 2; k++) {
        size_t p0 = CU_BLOB + (size_t)k * b->nparams * 4, a = MESH_MAX(lo, p0),
               e = MESH_MIN(hi, p0 + b->nparams * 4);

        if (a < e)
            memcpy(b->b + (a - b->lo), src[k] + (a - p0), e - a);
    }
    b->copied = hi - b->lo;
    return b->copied < b->hi - b->lo;
}

/*
 * Stripe [lo, hi) of the snapshot buffer of step (its n bytes: the 64-byte
 * header, then the weights and momentum from params and mom, those of
 * step, the same bytes on every member): a copy of those bytes only,
 * made in slices by the thread (blob_copy), and hashed by it as they
 * come. NULL when out of memory.
 */
static struct cu_blob *blob_make(size_t nparams, uint64_t step,
                                 const float *params, const float *mom,
                                 size_t lo, size_t hi)
{
    struct cu_blob *b = calloc(1, sizeof(*b));
    uint8_t head[CU_BLOB];

    if (b) {
        b->n = blob_bytes(nparams);
        b->lo = lo;
        b->hi = hi;
        b->b = malloc(hi - lo + 1);
    }
    if (!b || !b->b) {
        free(b);
        return NULL;
    }
    if (sh_init(&b->sh, nparams, lo, hi, NULL, NULL) < 0) {
        sh_free(&b->sh);
        free(b->b);
        free(b);
        return NULL;
    }
    /* test aid (train_xfer_test_corrupt): the bytes sent differ from
     * those hashed, so all are hashed first */
    b->hold = getenv("MESHTRAIN_TEST_XFER_CORRUPT") != NULL;
    b->refs = 1;
    b->step = step;
    memset(head, 0, CU_BLOB);
    mesh_put_le32(head, CU_MAGIC_B);
    mesh_put_le32(head + 4, CU_VERSION);
    mesh_put_le64(head + 8, step);
    mesh_put_le64(head + 16, nparams);
    if (lo < CU_BLOB)
        memcpy(b->b, head + lo, MESH_MIN((size_t)CU_BLOB, hi) - lo);
    b->params = params;
    b->mom = mom;
    b->nparams = nparams;
    return b;
}

/* Under mu: every stripe being copied (blob_copy) finished now, before
 * its source changes. */
static void blobs_fill(struct train_serve *sv)
{
    for (int i = 0; i < CU_SESS; i++)
        for (struct cu_item *it = sv->s[i].head; sv->s[i].state != S_FREE && it;
             it = it->next)
            if (it->blob)
                (void)blob_copy(it->blob, SIZE_MAX);
}

/* Under mu: the next slice of a stripe being copied. 1 if one was. */
static int serve_copy(struct train_serve *sv)
{
    for (int i = 0; i < CU_SESS; i++)
        for (struct cu_item *it = sv->s[i].head; sv->s[i].state != S_FREE && it;
             it = it->next)
            if (it->blob && it->blob->copied < it->blob->hi - it->blob->lo) {
                (void)blob_copy(it->blob, CU_COPY);
                return 1;
            }
    return 0;
}

/* The bytes of it's payload that may go now: a stripe's as far as it is
 * copied. */
static size_t item_ready(const struct cu_item *it)
{
    if (it->blob && it->hdr[5] == K_SNAP && it->dlen)
        return MESH_MIN(it->dlen, it->blob->copied);
    return it->dlen;
}

/* Under mu: queue stripe j of the snapshot of step (b, which holds it)
 * for ss, and the stripe's SHA-256 once hashed, then every step's
 * gradient from step on. 0, or -1 (ss closed). */
static int sess_snap(struct train_serve *sv, struct cu_sess *ss,
                     struct cu_blob *b, uint64_t step)
{
    struct cu_item *it = item_new(K_SNAP, sv->me),
                   *dg = item_new(K_DIGEST, sv->me);
    size_t lo, hi;

    if (!it || !dg) {
        free(it);
        free(dg);
        sess_close(ss);
        return -1;
    }
    lo = b->lo;
    hi = b->hi;
    mesh_put_le64(it->hdr + 8, step);
    mesh_put_le64(it->hdr + 16, b->n);
    mesh_put_le64(it->hdr + 24, lo);
    mesh_put_le64(it->hdr + 32, hi - lo);
    it->blob = b;
    b->refs++;
    it->data = b->b;
    it->dlen = hi - lo;
    it->need_hash = b->hold;
    it->forge = test_side("forge", ss->slot, sv->live);
    if (ss->side && !ss->rblob) {
        /* the joiner reads it: registered for its side channel only */
        uint64_t ra;
        uint32_t rk;

        if (mesh_side_reg(ss->side, b->b, hi - lo, 1, &ra, &rk) == 0) {
            ss->rblob = b;
            b->refs++;
            mesh_put_le64(it->hdr + 40, ra);
            mesh_put_le32(it->hdr + 48, rk);
            it->hdr[52] = CU_VIA_RDMA;
            it->dlen = 0;
        } else {
            mesh_info("catch-up: slot %d's stripe goes over TCP: %s", ss->slot,
                      mesh_err_msg(-EIO));
        }
    }
    push(ss, it);
    mesh_put_le64(dg->hdr + 8, step);
    dg->blob = b;
    b->refs++;
    dg->need_hash = 1;
    push(ss, dg);
    ss->state = S_STREAM;
    ss->next = step;
    return 0;
}

/*
 * Under mu: the joiner's AUTH (signed, from slot) offered a side channel,
 * its K_RDMA in ss->in after it: check it, open ours and connect it, and
 * answer with our address (or none: TCP), signed over the joiner's nonce.
 * The answer goes before any other record. -1: ss closed.
 */
static int sess_side(struct train_serve *sv, struct cu_sess *ss, int slot)
{
    const uint8_t *q = ss->in + CU_HDR;
    uint8_t mac[32];
    struct cu_item *it;
    int rc = -ENODEV;

    if (mesh_get_le32(q) != CU_MAGIC || q[4] != CU_VERSION || q[5] != K_RDMA ||
        mesh_get_le16(q + 6) != slot || q[56] != 1 ||
        auth_mac(sv->key, sv->keylen, q, ss->nonce, mac) < 0 ||
        CRYPTO_memcmp(mac, q + 64, 32) != 0) {
        mesh_info("catch-up: slot %d's side channel address is malformed or "
                  "not signed with the job's secret: closed",
                  slot);
        sess_close(ss);
        return -1;
    }
    it = item_new(K_RDMA, sv->me);
    if (!it) {
        sess_close(ss);
        return -1;
    }
    if (sv->sdev && test_side("refuse", slot, sv->live))
        rc = mesh_err(-ECONNREFUSED, "MESHTRAIN_TEST_SIDE=refuse");
    else if (sv->sdev) {
        rc = mesh_side_open(sv->sdev, sv->peer_timeout_s, &ss->side);
        /* (test aid: a queue pair that never answers, never connected) */
        if (rc == 0 && !test_side("silent", slot, sv->live))
            rc = mesh_side_connect(ss->side, q + 8);
    }
    if (rc == 0) {
        mesh_side_addr(ss->side, it->hdr + 8);
        it->hdr[56] = 1;
        if (test_side("garble", slot, sv->live))
            memset(it->hdr + 8, 0, 4); /* QP number 0 */
    } else {
        if (sv->sdev)
            mesh_info("catch-up: no RDMA side channel to slot %d (%s): its "
                      "stripe goes over TCP",
                      slot, mesh_err_msg(rc));
        mesh_side_close(ss->side);
        ss->side = NULL;
    }
    if (auth_mac(sv->key, sv->keylen, it->hdr, q + 40, it->hdr + 64) < 0) {
        item_free(it);
        sess_close(ss);
        return -1;
    }
    push(ss, it);
    return 0;
}

/* Under mu: a joiner's AUTH is complete; check it against our view. */
static void sess_auth(struct train_serve *sv, struct cu_sess *ss)
{
    const uint8_t *a = ss->in;
    uint8_t mac[32];
    int slot = mesh_get_le16(a + 6);
    uint64_t x = mesh_get_le64(a + 16);

    if (mesh_get_le32(a) != CU_MAGIC || a[4] != CU_VERSION || a[5] != K_AUTH ||
        auth_mac(sv->key, sv->keylen, a, ss->nonce, mac) < 0 ||
        CRYPTO_memcmp(mac, a + 64, 32) != 0 || slot >= sv->nslots ||
        (sv->members >> slot & 1)) {
        mesh_info("catch-up: a request on the side port is malformed or "
                  "not signed with the job's secret: closed");
        sess_close(ss);
        return;
    }
    ss->inlen = 0; /* K_ACK records from now on */
    memcpy(ss->jnonce, a + CU_NONCE, 16);
    ss->seq = 0;
    if ((a[40] & CU_OFFER_RDMA) && sess_side(sv, ss, slot) < 0)
        return;
    if (!(a[40] & CU_OFFER_RDMA) && sv->sdev)
        mesh_info("catch-up: slot %d has no RDMA side channel: its stripe "
                  "goes over TCP",
                  slot);
    ss->slot = slot;
    ss->j = (int)mesh_get_le32(a + 24);
    ss->k = (int)mesh_get_le32(a + 28);
    if (!sv->valid || mesh_get_le64(a + 8) != sv->epoch || ss->k < 1 ||
        ss->k > sv->size || ss->j < 0 || ss->j >= ss->k ||
        mesh_get_le64(a + 32) != sv->nparams ||
        x > (sv->live_valid ? sv->live : 0) + 100000) {
        sess_end(sv, ss, K_REFUSE, 1);
        return;
    }
    if ((sv->live_valid && x < sv->live) || test_side("late", slot, sv->live)) {
        sess_end(sv, ss, K_LATE, sv->live);
        return;
    }
    /* served by serve_snap once the live state is X's and stable: at
     * once when it is (the joiner names the members' live step) */
    ss->state = S_PINNED;
    ss->pin = x;
    ss->pin_live = sv->live_valid && sv->live_ok && x == sv->live;
}

/* Send what the socket takes; -1 when the joiner is gone. */
static int sess_send(struct train_serve *sv, struct cu_sess *ss)
{
    while (ss->head) {
        struct cu_item *it = ss->head;
        struct iovec iov[2];
        struct msghdr mh;
        int n = 0;
        ssize_t w;

        if (it->need_hash && it->blob->bad)
            return -1;
        if (it->need_hash && !it->blob->hashed)
            return 0; /* its SHA-256 is being computed */
        if (it->done == 0 && it->hdr[5] == K_DIGEST)
            memcpy(it->hdr + CU_DIGEST, it->blob->digest, 32);
        if (it->done == 0 && it->pool && !it->hdr[52]) {
            /* read over RDMA from its buffer, registered at first use */
            int q = it->pool - 1;

            if (!ss->greg[q] &&
                mesh_side_reg(ss->side, ss->gbuf[q], it->dlen, 1, &ss->gaddr[q],
                              &ss->gkey[q]) < 0) {
                mesh_info("catch-up: slot %d dropped: %s", ss->slot,
                          mesh_err_msg(-EIO));
                return -1;
            }
            ss->greg[q] = 1;
            mesh_put_le64(it->hdr + 40, ss->gaddr[q]);
            mesh_put_le32(it->hdr + 48, ss->gkey[q]);
            it->hdr[52] = CU_VIA_RDMA;
            it->dlen = 0;
        }
        if (!it->sig && it->hdr[5] != K_HELLO && it->hdr[5] != K_RDMA) {
            /* its header as it goes, signed (CU_SEQ) */
            it->sig = 1;
            mesh_put_le64(it->hdr + CU_SEQ, ++ss->seq);
            if (auth_mac(sv->key, sv->keylen, it->hdr, ss->jnonce,
                         it->hdr + 64) < 0)
                return -1;
            if (it->forge) /* test aid: the rkey, after the signature */
                it->hdr[48] ^= 0x5a;
        }
        if (it->done < CU_HDR) {
            iov[n].iov_base = it->hdr + it->done;
            iov[n++].iov_len = CU_HDR - it->done;
        }
        if (it->dlen) {
            size_t d = it->done > CU_HDR ? it->done - CU_HDR : 0;

            if (item_ready(it) > d) {
                iov[n].iov_base = (void *)(uintptr_t)(it->data + d);
                iov[n++].iov_len = item_ready(it) - d;
            }
        }
        if (n == 0)
            return 0; /* the rest of its stripe is being copied */
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        w = sendmsg(ss->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR
                       ? 0
                       : -1;
        it->done += (size_t)w;
        if (it->done < CU_HDR + it->dlen)
            return 0;
        ss->head = it->next;
        if (!ss->head)
            ss->tail = NULL;
        if (it->pool) {
            /* lent until the joiner's K_ACK says it read it */
            it->next = NULL;
            if (ss->lent_tail)
                ss->lent_tail->next = it;
            else
                ss->lent = it;
            ss->lent_tail = it;
            continue;
        }
        ss->nq--;
        item_free(it);
    }
    return 0;
}

/* Under mu: a K_ACK in ss->in: the oldest GRAD record lent is read. -1
 * (ss closed) for anything else. */
static int sess_ack(struct cu_sess *ss)
{
    const uint8_t *a = ss->in;
    struct cu_item *it = ss->lent;

    if (mesh_get_le32(a) != CU_MAGIC || a[4] != CU_VERSION || a[5] != K_ACK ||
        !it || mesh_get_le64(a + 8) != mesh_get_le64(it->hdr + 8)) {
        sess_close(ss);
        return -1;
    }
    ss->lent = it->next;
    if (!ss->lent)
        ss->lent_tail = NULL;
    ss->gused[it->pool - 1] = 0;
    ss->nq--;
    item_free(it);
    return 0;
}

/* Under mu: ss's HELLO, with our view and live step. */
static void sess_hello(struct train_serve *sv, struct cu_sess *ss)
{
    struct cu_item *it = item_new(K_HELLO, sv->me);

    if (!it) {
        sess_close(ss);
        return;
    }
    ss->hello = 1;
    mesh_put_le64(it->hdr + 8, sv->epoch);
    mesh_put_le64(it->hdr + 16, sv->members);
    /* on a device backend, once the live step's update has begun, the
     * next boundary's snapshot is the first it can serve */
    mesh_put_le64(it->hdr + 24,
                  !sv->live_valid ? 0 : sv->live + (sv->dev && !sv->live_ok));
    memcpy(it->hdr + 32, ss->nonce, 16);
    mesh_put_le64(it->hdr + 48, sv->nparams);
    it->hdr[56] = sv->sdev ? CU_OFFER_RDMA : 0;
    mesh_put_le32(it->hdr + CU_STEP_MS,
                  (uint32_t)MESH_MIN(sv->step_s * 1e3 + 0.5, 4e9));
    push(ss, it);
}

/*
 * Under mu: the sessions whose HELLO waits go on. A joiner may connect
 * while our view changes: it starts again as soon as every member of the
 * next view reports that view (cu_try), before its mesh formed here. Its
 * HELLO then waits until the view is ours and its first boundary passed
 * (a live step to name: a HELLO of step 0 would have it ask for a step
 * long gone, and try again), or 1 s at most, instead of a close that
 * would cost it a try.
 */
static void serve_hello(struct train_serve *sv, double now)
{
    for (int i = 0; i < CU_SESS; i++) {
        struct cu_sess *ss = &sv->s[i];

        if (ss->state == S_HELLO && !ss->hello && sv->valid &&
            (sv->live_valid || now - ss->since > 1))
            sess_hello(sv, ss);
    }
}

/* Under mu: a new joiner's connection. */
static void serve_accept(struct train_serve *sv)
{
    int fd = accept4(sv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC),
        one = 1;
    struct cu_sess *ss = NULL;

    if (fd < 0)
        return;
    for (int i = 0; i < CU_SESS && !ss; i++)
        if (sv->s[i].state == S_FREE)
            ss = &sv->s[i];
    if (!ss) {
        close(fd);
        return;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    memset(ss, 0, sizeof(*ss));
    ss->fd = fd;
    ss->need = CU_HDR;
    ss->state = S_HELLO;
    ss->since = mesh_now_s();
    if (RAND_bytes(ss->nonce, sizeof(ss->nonce)) != 1) {
        sess_close(ss);
        return;
    }
    serve_hello(sv, ss->since);
}

/* Under mu: bytes from a joiner (its AUTH, and K_RDMA; K_ACK records
 * over RDMA; or EOF). */
static void sess_read(struct train_serve *sv, struct cu_sess *ss)
{
    uint8_t junk[256];
    ssize_t r;

    if (ss->state == S_HELLO) {
        r = recv(ss->fd, ss->in + ss->inlen, ss->need - ss->inlen,
                 MSG_DONTWAIT);
        if (r > 0) {
            ss->inlen += (size_t)r;
            /* (its flag read before its HMAC is checked, only to know
             * how much to read) */
            if (ss->inlen == CU_HDR && (ss->in[40] & CU_OFFER_RDMA))
                ss->need = 2 * CU_HDR;
            if (ss->inlen == ss->need)
                sess_auth(sv, ss);
            return;
        }
    } else if (ss->side) {
        r = recv(ss->fd, ss->in + ss->inlen, CU_HDR - ss->inlen, MSG_DONTWAIT);
        if (r > 0) {
            ss->inlen += (size_t)r;
            if (ss->inlen == CU_HDR) {
                ss->inlen = 0;
                (void)sess_ack(ss);
            }
            return;
        }
    } else {
        /* nothing more is expected: anything else ends it */
        r = recv(ss->fd, junk, sizeof(junk), MSG_DONTWAIT);
        if (r > 0) {
            sess_close(ss);
            return;
        }
    }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        sess_close(ss);
}

/*
 * Under mu: the sessions pinned at the live step get their snapshot now,
 * while the live weights and momentum are that step's and stable (from
 * the end of the previous update, or the boundary, to the queueing of
 * the step's gradient: train_serve_grad takes mu before the update, so
 * the update waits for a copy under way, and only then). The copy is
 * made here, not on the training thread, and of each session's stripe
 * only.
 */
static void serve_snap(struct train_serve *sv)
{
    size_t n = blob_bytes(sv->nparams);

    if (!sv->valid || !sv->live_valid || !sv->live_ok)
        return;
    for (int i = 0; i < CU_SESS; i++) {
        struct cu_sess *ss = &sv->s[i];
        struct cu_blob *b = NULL;
        size_t lo, hi;

        if (ss->state != S_PINNED || ss->pin != sv->live)
            continue;
        /* its stripe only: a copy of that stripe that a session sends
         * (another joiner's) is shared */
        lo = n * (size_t)ss->j / (size_t)ss->k;
        hi = n * (size_t)(ss->j + 1) / (size_t)ss->k;
        for (int o = 0; o < CU_SESS && !b; o++)
            for (struct cu_item *it = sv->s[o].head; it && !b; it = it->next)
                if (it->blob && it->blob->step == sv->live &&
                    it->blob->lo == lo && it->blob->hi == hi)
                    b = it->blob;
        if (b)
            b->refs++;
        else
            b = blob_make(sv->nparams, sv->live, sv->params, sv->mom, lo, hi);
        if (!b) { /* the catch-up fails; the joiner is admitted as before */
            sess_end(sv, ss, K_REFUSE, 2);
            continue;
        }
        /* read over RDMA: whole before the joiner is told where */
        if (ss->side)
            (void)blob_copy(b, SIZE_MAX);
        mesh_info("catch-up: slot %d is sent the snapshot of step %" PRIu64
                  ", %s%s",
                  ss->slot, sv->live,
                  ss->pin_live ? "the live state when it asked"
                               : "once this peer's state reached it",
                  ss->side ? " (it reads it over RDMA)" : "");
        if (sess_snap(sv, ss, b, sv->live) == 0)
            train_fault(sv->t, TRAIN_FAULT_CATCHUP); /* test aid: dies */
        blob_unref(b);
    }
}

/* Under mu, released while hashing: the next slice of the SHA-256 of a
 * stripe that a session sends. 1 if more is left to hash. */
static int serve_hash(struct train_serve *sv)
{
    struct cu_blob *b = NULL;
    uint8_t d[32];
    size_t len;
    int ok;

    for (int i = 0; i < CU_SESS && !b; i++)
        for (struct cu_item *it = sv->s[i].head;
             sv->s[i].state != S_FREE && it && !b; it = it->next)
            if (it->blob && !it->blob->hashed && !it->blob->bad &&
                !it->blob->hashing &&
                (it->blob->off < it->blob->copied ||
                 it->blob->copied == it->blob->hi - it->blob->lo))
                b = it->blob;
    if (!b)
        return 0;
    b->refs++;
    b->hashing = 1;
    len = MESH_MIN((size_t)CU_SLICE, b->copied - b->off);
    pthread_mutex_unlock(&sv->mu);
    ok = sh_feed(&b->sh, b->b + b->off, len) == 0;
    if (ok && b->off + len == b->hi - b->lo)
        ok = sh_final(&b->sh, d) == 0;
    pthread_mutex_lock(&sv->mu);
    b->hashing = 0;
    b->off += len;
    if (!ok) {
        b->bad = 1; /* its sessions close */
    } else if (b->off == b->hi - b->lo) {
        /* test aid */
        train_xfer_test_corrupt(sv->me, 1, b->b, b->hi - b->lo, d);
        memcpy(b->digest, d, 32);
        b->hashed = 1;
    }
    blob_unref(b);
    return 1; /* the sessions may have changed meanwhile: look again */
}

static void *serve_main(void *arg)
{
    struct train_serve *sv = arg;

    pthread_mutex_lock(&sv->mu);
    while (!sv->stop) {
        struct pollfd pf[2 + CU_SESS];
        int at[CU_SESS], np = 0, more;
        double now = mesh_now_s();
        char buf[64];

        serve_snap(sv);
        serve_hello(sv, now);
        /* a slice of a stripe's copy, and of its hash, between sends */
        more = serve_copy(sv);
        more |= serve_hash(sv);
        pf[np].fd = sv->pipe[0];
        pf[np++].events = POLLIN;
        pf[np].fd = sv->lfd;
        pf[np++].events = POLLIN;
        for (int i = 0; i < CU_SESS; i++) {
            struct cu_sess *ss = &sv->s[i];

            at[i] = -1;
            if (ss->state == S_FREE)
                continue;
            /* a joiner silent before its AUTH, or one that does not
             * read what we drain, is given up */
            if ((ss->state == S_HELLO && now - ss->since > 10) ||
                (ss->state == S_DRAIN && now - ss->since > 30)) {
                sess_close(ss);
                continue;
            }
            /* closed (then wait for its EOF) once our next view is
             * valid: a joiner tells the view change that admits it from
             * another by its DECIDED, which may come late (a loaded
             * host); one not admitted starts again once we serve */
            if (ss->state == S_DRAIN && !ss->head && !ss->shut && sv->valid) {
                (void)shutdown(ss->fd, SHUT_WR);
                ss->shut = 1;
            }
            at[i] = np;
            pf[np].fd = ss->fd;
            pf[np++].events =
                (short)(POLLIN | (ss->head && (!ss->head->need_hash ||
                                               ss->head->blob->hashed ||
                                               ss->head->blob->bad)
                                      ? POLLOUT
                                      : 0));
        }
        pthread_mutex_unlock(&sv->mu);
        (void)poll(pf, (nfds_t)np, more ? 0 : 100);
        pthread_mutex_lock(&sv->mu);
        if (pf[0].revents)
            while (read(sv->pipe[0], buf, sizeof(buf)) > 0)
                ;
        if (pf[1].revents & POLLIN)
            serve_accept(sv);
        for (int i = 0; i < CU_SESS; i++) {
            struct cu_sess *ss = &sv->s[i];
            short re;

            if (at[i] < 0 || ss->state == S_FREE || ss->fd != pf[at[i]].fd)
                continue;
            re = pf[at[i]].revents;
            if (re & (POLLIN | POLLHUP | POLLERR))
                sess_read(sv, ss);
            if (ss->state != S_FREE && (re & POLLOUT) && sess_send(sv, ss) < 0)
                sess_close(ss);
        }
    }
    for (int i = 0; i < CU_SESS; i++)
        if (sv->s[i].state != S_FREE)
            sess_close(&sv->s[i]);
    pthread_mutex_unlock(&sv->mu);
    return NULL;
}

int train_serve_start(struct trainer *t)
{
    struct train_serve *sv;
    struct sockaddr_storage ss;
    socklen_t len;
    int rc, one = 1;

    if (!t->el || t->sim || t->mo->world.size < 2 ||
        getenv("MESHTRAIN_NO_CATCHUP"))
        return 0;
    sv = calloc(1, sizeof(*sv));
    if (!sv)
        return mesh_err(-ENOMEM, "out of memory");
    sv->lfd = sv->pipe[0] = sv->pipe[1] = -1;
    for (int i = 0; i < CU_SESS; i++)
        sv->s[i].fd = -1;
    sv->me = t->mo->world.rank;
    sv->nslots = t->mo->world.size;
    sv->nparams = t->nparams;
    sv->dev = !t->host_slabs;
    if (!sv->dev) {
        sv->params = mesh_nn_model_params(t->model);
        sv->mom = mesh_nn_sgd_momentum(t->sgd);
    }
    sv->t = t;
    sv->peer_timeout_s = t->mo->topts.peer_timeout_s;
    if (t->mo->topts.secret) {
        if (t->mo->topts.secret_len > sizeof(sv->key)) {
            free(sv);
            return mesh_err(-EINVAL, "catch-up: the secret is too long");
        }
        memcpy(sv->key, t->mo->topts.secret, t->mo->topts.secret_len);
        sv->keylen = t->mo->topts.secret_len;
    }
    /* over verbs, joiners read the state over RDMA: side channels on the
     * mesh's device (without one, TCP as on every other transport) */
    if (t->mo->transport && !strcmp(t->mo->transport, "verbs")) {
        rc = side_dev_open(&t->mo->topts, &sv->sdev);
        if (rc < 0) {
            mesh_info("catch-up: no RDMA side channels (%s): joiners get "
                      "the state over TCP",
                      mesh_err_msg(rc));
            mesh_err_clear();
            sv->sdev = NULL;
        }
    }
    rc = mesh_elastic_addr(t->el, sv->me, &ss, &len);
    if (rc == 0) {
        /* our slot's host, a port of the system's choice */
        if (ss.ss_family == AF_INET)
            ((struct sockaddr_in *)&ss)->sin_port = 0;
        else
            ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
        sv->lfd =
            socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (sv->lfd < 0)
            rc = mesh_err_errno("catch-up: socket");
    }
    if (rc == 0)
        (void)setsockopt(sv->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (rc == 0 && (bind(sv->lfd, (struct sockaddr *)&ss, len) < 0 ||
                    listen(sv->lfd, CU_SESS) < 0))
        rc = mesh_err_errno("catch-up: cannot listen on a side port");
    if (rc == 0 && getsockname(sv->lfd, (struct sockaddr *)&ss, &len) < 0)
        rc = mesh_err_errno("catch-up: getsockname");
    if (rc == 0 && pipe2(sv->pipe, O_NONBLOCK | O_CLOEXEC) < 0)
        rc = mesh_err_errno("catch-up: pipe");
    if (rc == 0) {
        pthread_mutex_init(&sv->mu, NULL);
        rc = -pthread_create(&sv->th, NULL, serve_main, sv);
        if (rc < 0)
            pthread_mutex_destroy(&sv->mu);
    }
    if (rc < 0) {
        if (sv->lfd >= 0)
            close(sv->lfd);
        if (sv->pipe[0] >= 0) {
            close(sv->pipe[0]);
            close(sv->pipe[1]);
        }
        mesh_side_dev_close(sv->sdev);
        free(sv);
        return rc;
    }
    sv->running = 1;
    t->serve = sv;
    mesh_elastic_set_side(t->el,
                          ntohs(ss.ss_family == AF_INET
                                    ? ((struct sockaddr_in *)&ss)->sin_port
                                    : ((struct sockaddr_in6 *)&ss)->sin6_port));
    return 0;
}

void train_serve_stop(struct trainer *t)
{
    struct train_serve *sv = t->serve;

    if (!sv)
        return;
    if (t->el)
        mesh_elastic_set_side(t->el, 0);
    pthread_mutex_lock(&sv->mu);
    sv->stop = 1;
    pthread_mutex_unlock(&sv->mu);
    wake_serve(sv);
    pthread_join(sv->th, NULL);
    pthread_mutex_destroy(&sv->mu);
    close(sv->lfd);
    close(sv->pipe[0]);
    close(sv->pipe[1]);
    mesh_side_dev_close(sv->sdev); /* (every session closed) */
    OPENSSL_cleanse(sv->key, sizeof(sv->key));
    free(sv);
    t->serve = NULL;
}

void train_serve_view(struct trainer *t, int valid)
{
    struct train_serve *sv = t->serve;

    if (!sv)
        return;
    pthread_mutex_lock(&sv->mu);
    /* (a view change may restore the live state: the stripes being
     * copied from it are finished first) */
    blobs_fill(sv);
    if (valid) {
        test_side_admitted(t->members);
        sv->epoch = t->view_epoch;
        sv->members = t->members;
        sv->rank = t->rank;
        sv->size = t->size;
        sv->live_valid = 0;
        sv->valid = 1;
    } else {
        /* the view is changing: what is queued still goes out (the
         * joiner it admits needs it), nothing more */
        sv->valid = 0;
        for (int i = 0; i < CU_SESS; i++)
            if (sv->s[i].state != S_FREE && sv->s[i].state != S_DRAIN &&
                (sv->s[i].state != S_HELLO || sv->s[i].hello)) {
                sv->s[i].state = S_DRAIN;
                sv->s[i].since = mesh_now_s();
            }
    }
    pthread_mutex_unlock(&sv->mu);
    wake_serve(sv);
}

/* Under mu: the live state is now step's; pins before it are late. 1 if
 * a session waits for it. */
static int serve_live(struct train_serve *sv, uint64_t step)
{
    int need = 0;

    sv->live = step;
    sv->live_valid = 1;
    sv->live_ok = 1;
    for (int i = 0; i < CU_SESS; i++) {
        struct cu_sess *ss = &sv->s[i];

        if (ss->state == S_PINNED && ss->pin < step)
            sess_end(sv, ss, K_LATE, step);
        else if ((ss->state == S_PINNED && ss->pin == step) ||
                 (ss->state == S_HELLO && !ss->hello))
            need = 1; /* (its HELLO waited for a live step: serve_hello) */
    }
    return need;
}

void train_serve_boundary(struct trainer *t, uint64_t step)
{
    struct train_serve *sv = t->serve;
    const struct train_snap *sn = &t->snap[step & 1];
    double now;
    int need;

    if (!sv)
        return;
    pthread_mutex_lock(&sv->mu);
    now = mesh_now_s();
    if (sv->bt > 0 && step == sv->bstep + 1)
        sv->step_s = now - sv->bt;
    sv->bt = now;
    sv->bstep = step;
    if (sv->dev && (!sn->valid || sn->step != step || !sn->params)) {
        sv->live_valid = 0; /* no host copy of this step's state */
        pthread_mutex_unlock(&sv->mu);
        return;
    }
    if (sv->dev) {
        /* read by serve_snap until the next boundary (serve_live), while
         * snap_take writes the other slot */
        sv->params = sn->params;
        sv->mom = sn->mom;
    }
    need = serve_live(sv, step);
    pthread_mutex_unlock(&sv->mu);
    if (need)
        wake_serve(sv);
}

void train_serve_updated(struct trainer *t, uint64_t step)
{
    struct train_serve *sv = t->serve;
    int need = 0;

    if (!sv)
        return;
    pthread_mutex_lock(&sv->mu);
    /* the state of step + 1, the same bytes on every member (the same
     * reduced gradient, the same update), though its boundary has not
     * passed: a view that restarts before it fails the joiner's
     * catch-up, which is then admitted as before. On a device backend
     * its host copy is made at that boundary: not before */
    if (!sv->dev && sv->live_valid && sv->live == step)
        need = serve_live(sv, step + 1);
    pthread_mutex_unlock(&sv->mu);
    if (need)
        wake_serve(sv);
}

void train_serve_grad(struct trainer *t, uint64_t step, float lr)
{
    struct train_serve *sv = t->serve;
    const float *g;
    size_t lo, hi;
    int any = 0, rc;

    if (!sv)
        return;
    g = mesh_nn_model_grads(t->model);
    pthread_mutex_lock(&sv->mu);
    /* the update follows: the live weights are not to be copied until
     * it ends (train_serve_updated), and the stripes of them being
     * copied are finished first */
    blobs_fill(sv);
    if (sv->live_valid && sv->live == step)
        sv->live_ok = 0;
    for (int i = 0; i < CU_SESS; i++) {
        struct cu_sess *ss = &sv->s[i];
        struct cu_item *it;

        if (ss->state != S_STREAM)
            continue;
        lo = sv->nparams * (size_t)ss->j / (size_t)ss->k;
        hi = sv->nparams * (size_t)(ss->j + 1) / (size_t)ss->k;
        if (ss->nq >= CU_QUEUE || ss->next != step) {
            mesh_info("catch-up: slot %d is %d records behind; dropped (it "
                      "will get the whole state when admitted)",
                      ss->slot, ss->nq);
            sess_close(ss);
            continue;
        }
        it = item_new(K_GRAD, sv->me);
        if (it && ss->side && hi > lo) {
            /* read over RDMA: a buffer of the session's, free again
             * once read (nq counts those lent: one is free) */
            int q = 0;

            while (q < CU_QUEUE - 1 && ss->gused[q])
                q++;
            if (!ss->gbuf[q])
                ss->gbuf[q] = malloc((hi - lo) * 4);
            if (ss->gbuf[q] && !ss->gused[q]) {
                ss->gused[q] = 1;
                it->pool = q + 1;
                it->data = ss->gbuf[q];
            }
        } else if (it) {
            it->own = malloc((hi - lo) * 4 + 1);
            it->data = it->own;
        }
        if (!it || !it->data) {
            if (it)
                item_free(it);
            sess_close(ss);
            continue;
        }
        /* on a device backend, from the device: the reduced gradient's
         * copy in and scaling are ordered before (train/gradsync.c) */
        rc = 0;
        if (!sv->dev)
            memcpy((void *)(uintptr_t)it->data, g + lo, (hi - lo) * 4);
        else
            rc = mesh_nn_download(t->ctx, (void *)(uintptr_t)it->data, g + lo,
                                  (hi - lo) * 4);
        if (rc < 0) {
            mesh_info("catch-up: slot %d dropped: %s", ss->slot,
                      mesh_err_msg(rc));
            item_free(it);
            sess_close(ss);
            continue;
        }
        mesh_put_le64(it->hdr + 8, step);
        memcpy(it->hdr + 16, &lr, 4);
        mesh_put_le64(it->hdr + 24, lo);
        mesh_put_le64(it->hdr + 32, hi - lo);
        it->dlen = (hi - lo) * 4;
        push(ss, it);
        ss->next = step + 1;
        any = 1;
    }
    pthread_mutex_unlock(&sv->mu);
    if (any)
        wake_serve(sv);
}

/* ---- the joiner's side --------------------------------------------------- */

struct cu_peer {
    int fd, slot, eof;
    uint64_t at;   /* the step of its live state, from HELLO */
    double step_s; /* its last step's time, from HELLO (0: not known) */
    uint8_t nonce[16];
    uint8_t hdr[CU_HDR];
    size_t hlen;
    uint8_t *dst; /* the current record's payload goes here */
    size_t left;
    int kind, snap_done, dig_done; /* its stripe, its SHA-256 came */
    struct cu_sh sh;               /* its stripe's SHA-256, as the bytes come */
    size_t hashed;  /* the first hashed bytes of its stripe are in sh */
    uint64_t rstep; /* the current GRAD record's step */
    uint64_t next;  /* the GRAD step expected next */
    uint8_t digest[32];
    double t_first, t_done; /* its stripe's first and last bytes came */
    size_t got;             /* its stripe's bytes in */
    /* over RDMA: its side channel (offered in its HELLO; rdma once its
     * K_RDMA connected it), the nonce it signs that with, and the
     * record being read: rdlen bytes from rd0 */
    int offer, rdma, rd;
    mesh_side_t *side;
    uint8_t jnonce[16]; /* ours (AUTH): its records are signed over it */
    uint64_t seq;       /* its records verified so far */
    uint8_t *rd0;
    size_t rdlen;
    double rd_t0; /* the read began */
};

struct train_catchup {
    struct trainer *t;
    pthread_t th;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, result; /* 1 caught up to target, -1 given up */
    uint64_t target;  /* the step the admitting view restarts from */

    uint64_t epoch, members;
    int k, senders; /* members sending (0: all; the bench aid) */
    /* the catch-up starts before the model is built, which it overlaps:
     * the parameter count is the members' (HELLO) until the model is
     * (model: t->model and t->sgd usable, train_catchup_model) */
    size_t np;
    /* snap_in: the snapshot whole, not loaded yet; ready: the joiner's
     * kernels built too (train_catchup_ready), so that it may be admitted;
     * unhold: clear the hold once it is */
    int model, snap_in, ready, unhold;
    struct cu_peer p[MESH_ELASTIC_MAX_SLOTS];
    uint64_t x;    /* the snapshot's step */
    uint64_t live; /* the highest step the members were at, from HELLO */
    uint8_t *blob;
    size_t n, got;
    /* the SHA-256 of each of blob's cells (cell_at) that a stripe's hash
     * gave whole (cellok) */
    uint8_t *cells, *cellok;
    int loaded;
    uint64_t applied; /* the model holds the state before this step */
    uint64_t maxseen; /* a GRAD record of this step has come */
    float *g[CU_RING];
    uint64_t gstep[CU_RING];
    int gparts[CU_RING];
    float glr[CU_RING];
    double t0, t_snap, t_end;
    double t_rx;        /* the last bytes of a record came (mesh_now_s) */
    double t_ask, t_in; /* AUTH sent; the stripes' bytes all in */
    uint64_t steps;
    /* the SHA-256 of the model's weights and momentum (the state of step
     * hstep), hashed in slices while the joiner waits, so that the view
     * change that admits it need not: hoff of the 8 np bytes in so far,
     * h once hdone */
    struct train_wch hwc[2];
    uint64_t hstep;
    size_t hoff;
    int hdone;
    uint8_t h[64];
    /* a step is applied as soon as its gradient is whole; until a record
     * of the next one proves it committed, the state before it (of step
     * bstep; UINT64_MAX: none) is kept in blob, after the snapshot's
     * header, with its hashes if bdone, for a view that restarts from
     * bstep */
    uint64_t bstep;
    int bdone;
    uint8_t bh[64];
    size_t hoff_tgt; /* hashed when the target came (the log line) */
    int rolled;      /* the state kept was put back */
    /* side channels (--transport verbs): the device (NULL: TCP);
     * side_bad: the members whose side channel did not connect or
     * answer (their stripes come over TCP from then on), no_rdma once two
     * did (the fault is ours, most likely: every stripe over TCP); bytes
     * read over RDMA in this try */
    mesh_side_dev_t *sdev;
    char sdev_name[96];
    uint64_t side_bad;
    int no_rdma;
    size_t rdma_snap, rdma_grad;
    /* members whose records did not verify: the next tries stripe the
     * snapshot across the others */
    uint64_t shun;
};

static void cu_close(struct train_catchup *cu)
{
    for (int i = 0; i < cu->k; i++) {
        mesh_side_close(cu->p[i].side);
        cu->p[i].side = NULL;
        cu->p[i].rdma = cu->p[i].rd = 0;
        if (cu->p[i].fd >= 0) {
            close(cu->p[i].fd);
            cu->p[i].fd = -1;
        }
        sh_free(&cu->p[i].sh);
    }
    cu->k = 0;
}

/* Blocking send of a header (the socket is non-blocking: poll). */
static int send_all_fd(int fd, const uint8_t *b, size_t n, double until)
{
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        struct pollfd pf = {.fd = fd, .events = POLLOUT};

        if (w > 0) {
            b += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        if (mesh_now_s() > until || poll(&pf, 1, 50) < 0)
            return -1;
    }
    return 0;
}

/* A non-blocking connect, given up at until (a host that does not
 * answer must not hold the joiner). */
static int connect_until(int fd, const struct sockaddr_storage *ss,
                         socklen_t len, double until)
{
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    socklen_t el = sizeof(int);
    int err = 0;

    if (connect(fd, (const struct sockaddr *)ss, len) == 0)
        return 0;
    if (errno != EINPROGRESS)
        return -1;
    while (poll(&pf, 1, 50) == 0)
        if (mesh_now_s() > until)
            return -1;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err)
        return -1;
    return 0;
}

/* Read the rest of p's header (CU_HDR bytes) from its non-blocking
 * socket until it is whole (0), or until the peer closes, fails or stays
 * silent past until (-1; what came stays in p->hdr). */
static int cu_read_hdr(struct cu_peer *p, double until)
{
    while (p->hlen < CU_HDR) {
        struct pollfd pf = {.fd = p->fd, .events = POLLIN};
        ssize_t r =
            recv(p->fd, p->hdr + p->hlen, CU_HDR - p->hlen, MSG_DONTWAIT);

        if (r > 0) {
            p->hlen += (size_t)r;
            continue;
        }
        if (r == 0 ||
            (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
            mesh_now_s() > until)
            return -1;
        if (poll(&pf, 1, 50) < 0 && errno != EINTR)
            return -1;
    }
    return 0;
}

/* Connect to every member of the view and read its HELLO; *np: the
 * parameter count they all give (when not 0, the one they must give). */
static int cu_connect(struct train_catchup *cu, const uint16_t *ports,
                      size_t *np)
{
    struct trainer *t = cu->t;
    double until = mesh_now_s() + 3;
    int i = 0, rc = 0;

    for (int s = 0; s < MESH_ELASTIC_MAX_SLOTS && rc == 0; s++) {
        struct sockaddr_storage ss;
        socklen_t len;
        struct cu_peer *p;
        int one = 1;

        if (!(cu->members >> s & 1) || (cu->shun >> s & 1) ||
            (cu->senders && i == cu->senders))
            continue;
        p = &cu->p[i++];
        memset(p, 0, sizeof(*p));
        p->slot = s;
        p->fd = -1;
        cu->k = i;
        if (mesh_elastic_addr(t->el, s, &ss, &len) < 0)
            return -1;
        if (ss.ss_family == AF_INET)
            ((struct sockaddr_in *)&ss)->sin_port = htons(ports[s]);
        else
            ((struct sockaddr_in6 *)&ss)->sin6_port = htons(ports[s]);
        p->fd =
            socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (p->fd < 0 || connect_until(p->fd, &ss, len, until) < 0)
            return -1;
        (void)setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    /* every HELLO */
    for (i = 0; i < cu->k; i++) {
        struct cu_peer *p = &cu->p[i];

        if (cu_read_hdr(p, until) < 0)
            return -1;
        p->hlen = 0;
        if (mesh_get_le32(p->hdr) != CU_MAGIC || p->hdr[4] != CU_VERSION ||
            p->hdr[5] != K_HELLO || mesh_get_le16(p->hdr + 6) != p->slot ||
            mesh_get_le64(p->hdr + 8) != cu->epoch ||
            mesh_get_le64(p->hdr + 16) != cu->members ||
            mesh_get_le64(p->hdr + 48) == 0 ||
            mesh_get_le64(p->hdr + 48) > (SIZE_MAX - CU_BLOB) / 8 ||
            (*np && mesh_get_le64(p->hdr + 48) != *np))
            return -1; /* the view moved on, or another model */
        *np = (size_t)mesh_get_le64(p->hdr + 48);
        p->at = mesh_get_le64(p->hdr + 24);
        p->step_s = mesh_get_le32(p->hdr + CU_STEP_MS) / 1e3;
        memcpy(p->nonce, p->hdr + 32, 16);
        p->offer = p->hdr[56] & CU_OFFER_RDMA;
    }
    return 0;
}

/*
 * A side channel to each member that offers one, with what it may fill
 * registered on it (its stripe of the snapshot, and of each gradient of
 * the ring): over verbs, the joiner reads those over RDMA. A member
 * without one sends over TCP.
 */
static void cu_sides(struct train_catchup *cu, size_t np)
{
    double pt = cu->t->mo->topts.peer_timeout_s;

    for (int i = 0; i < cu->k && cu->sdev && !cu->no_rdma; i++) {
        struct cu_peer *p = &cu->p[i];
        size_t lo = cu->n * (size_t)i / (size_t)cu->k,
               hi = cu->n * (size_t)(i + 1) / (size_t)cu->k,
               glo = np * (size_t)i / (size_t)cu->k,
               ghi = np * (size_t)(i + 1) / (size_t)cu->k;
        int rc;

        if (!p->offer || (cu->side_bad >> p->slot & 1))
            continue;
        rc = mesh_side_open(cu->sdev, pt, &p->side);
        if (rc == 0)
            rc = mesh_side_reg(p->side, cu->blob + lo, hi - lo, 0, NULL, NULL);
        for (int r = 0; r < CU_RING && rc == 0 && ghi > glo; r++)
            rc = mesh_side_reg(p->side, cu->g[r] + glo, (ghi - glo) * 4, 0,
                               NULL, NULL);
        if (rc < 0) {
            mesh_info("catch-up: no RDMA side channel to slot %d (%s): its "
                      "stripe comes over TCP",
                      p->slot, mesh_err_msg(rc));
            mesh_side_close(p->side);
            p->side = NULL;
        }
    }
}

static int cu_auth(struct train_catchup *cu, uint64_t x, size_t np)
{
    const struct mesh_opts *mo = cu->t->mo;
    const uint8_t *key = mo->topts.secret;
    size_t keylen = key ? mo->topts.secret_len : 0;

    for (int i = 0; i < cu->k; i++) {
        struct cu_peer *p = &cu->p[i];
        uint8_t h[2 * CU_HDR], *q = h + CU_HDR;

        hdr_init(h, K_AUTH, mo->world.rank);
        mesh_put_le64(h + 8, cu->epoch);
        mesh_put_le64(h + 16, x);
        mesh_put_le32(h + 24, (uint32_t)i);
        mesh_put_le32(h + 28, (uint32_t)cu->k);
        mesh_put_le64(h + 32, np);
        h[40] = p->side ? CU_OFFER_RDMA : 0;
        /* our nonce: the member signs its records over it */
        if (RAND_bytes(p->jnonce, 16) != 1)
            return -1;
        memcpy(h + CU_NONCE, p->jnonce, 16);
        p->seq = 0;
        if (auth_mac(key, keylen, h, p->nonce, h + 64) < 0)
            return -1;
        /* our side channel's address, signed too: the member answers
         * with its own, signed over our nonce */
        hdr_init(q, K_RDMA, mo->world.rank);
        if (p->side) {
            mesh_side_addr(p->side, q + 8);
            q[56] = 1;
            memcpy(q + 40, p->jnonce, 16);
            if (auth_mac(key, keylen, q, p->nonce, q + 64) < 0)
                return -1;
        }
        if (send_all_fd(p->fd, h, p->side ? 2 * CU_HDR : CU_HDR,
                        mesh_now_s() + 3) < 0)
            return -1;
        p->next = x;
    }
    return 0;
}

/*
 * The model's weights and momentum in host memory: the model's own with
 * host slabs; on a device backend the host copies t->hparams and t->hmom,
 * which the catch-up keeps equal to the device's (cu_put, cu_pull) and
 * which hold the state caught up to when it is done (train/xfer.c reads
 * them then).
 */
static float *cu_w(const struct train_catchup *cu)
{
    struct trainer *t = cu->t;

    return t->host_slabs ? mesh_nn_model_params(t->model) : t->hparams;
}

static float *cu_m(const struct train_catchup *cu)
{
    struct trainer *t = cu->t;

    return t->host_slabs ? mesh_nn_sgd_momentum(t->sgd) : t->hmom;
}

/* Under mu: the model's weights and momentum from src (the weights, then
 * the momentum, as the snapshot has them); uploaded on a device backend
 * (this thread is the only one to use the device until the catch-up
 * ends: the training thread waits to be admitted). */
static int cu_put(struct train_catchup *cu, const uint8_t *src)
{
    struct trainer *t = cu->t;
    size_t half = cu->np * 4;
    int rc = 0;

    memcpy(cu_w(cu), src, half);
    memcpy(cu_m(cu), src + half, half);
    if (!t->host_slabs)
        rc = mesh_nn_upload(t->ctx, mesh_nn_model_params(t->model), src, half);
    if (rc == 0 && !t->host_slabs)
        rc = mesh_nn_upload(t->ctx, mesh_nn_sgd_momentum(t->sgd), src + half,
                            half);
    if (rc < 0)
        mesh_info("catch-up: the state cannot be loaded into the device: %s",
                  mesh_err_msg(rc));
    return rc;
}

/* Under mu, after an update on a device backend: its host copies (the
 * download waits for the update, on the device's stream). */
static int cu_pull(struct train_catchup *cu)
{
    struct trainer *t = cu->t;
    size_t half = cu->np * 4;
    int rc;

    if (t->host_slabs)
        return 0;
    rc = mesh_nn_download(t->ctx, t->hparams, mesh_nn_model_params(t->model),
                          half);
    if (rc == 0)
        rc = mesh_nn_download(t->ctx, t->hmom, mesh_nn_sgd_momentum(t->sgd),
                              half);
    if (rc < 0)
        mesh_info("catch-up: the state cannot be read from the device: %s",
                  mesh_err_msg(rc));
    return rc;
}

/* Under mu: the model's weights and momentum changed (now step's): their
 * SHA-256 starts again. */
static void cu_hash_reset(struct train_catchup *cu, uint64_t step)
{
    cu->hstep = step;
    cu->hoff = 0;
    cu->hdone = 0;
}

/*
 * On the catch-up thread, with or without mu (only this thread writes
 * what it reads): hash up to max more bytes of the weights and momentum
 * (those of step applied, in host memory: cu_w, cu_m), the weights'
 * SHA-256 and the momentum's as the view change's weight check has them
 * (train.c, weights_hash). 1 if more is left, 0 if done (or nothing to
 * hash), -1 on an OpenSSL error.
 */
static int cu_hash_state(struct train_catchup *cu, size_t max)
{
    size_t half = cu->np * 4;

    if (!cu->loaded || cu->hdone || cu->hstep != cu->applied)
        return 0;
    for (int k = 0; k < 2 && cu->hoff == 0; k++)
        if (train_wch_init(&cu->hwc[k], half) < 0)
            return -1;
    while (max && cu->hoff < 2 * half) {
        int k = cu->hoff >= half;
        const uint8_t *src =
            k ? (const uint8_t *)cu_m(cu) : (const uint8_t *)cu_w(cu);
        size_t o = cu->hoff - (size_t)k * half, len = MESH_MIN(half - o, max);

        if (train_wch_feed(&cu->hwc[k], src + o, len) < 0)
            return -1;
        cu->hoff += len;
        max -= len;
    }
    if (cu->hoff < 2 * half)
        return 1;
    for (int k = 0; k < 2; k++)
        if (train_wch_final(&cu->hwc[k], cu->h + 32 * k) < 0)
            return -1;
    cu->hdone = 1;
    return 0;
}

/*
 * Under mu: apply the gradients held: up to the target, or without one
 * up to the last step a record came for (maxseen: committed, as every
 * member took its snapshot before that record's all-reduce) and that
 * step too once its gradient is whole, keeping the state before it in
 * blob: a view may still restart from maxseen (then the state kept is
 * put back), not before.
 */
static int cu_apply(struct train_catchup *cu)
{
    struct trainer *t = cu->t;
    size_t half = cu->np * 4;
    int rc;

    if (!cu->loaded)
        return 0; /* (the model is built, and has np parameters) */
    if (cu->target != UINT64_MAX && cu->bstep == cu->target &&
        cu->applied == cu->target + 1) {
        rc = cu_put(cu, cu->blob + CU_BLOB);
        if (rc < 0)
            return rc;
        cu->applied = cu->target;
        cu->steps--;
        cu_hash_reset(cu, cu->applied);
        if (cu->bdone) {
            memcpy(cu->h, cu->bh, 64);
            cu->hoff = 2 * half;
            cu->hdone = 1;
        }
        cu->bstep = UINT64_MAX;
        cu->rolled = 1;
    }
    for (;;) {
        int r = (int)(cu->applied % CU_RING);
        uint64_t lim = cu->target != UINT64_MAX ? cu->target : cu->maxseen + 1;

        if (cu->applied >= lim || cu->gstep[r] != cu->applied ||
            cu->gparts[r] != cu->k)
            break;
        /* not proved committed yet: once the state before it is hashed
         * (a view restarting from it needs the hashes), that state is
         * kept, and the step applied */
        if (cu->target == UINT64_MAX && cu->applied == cu->maxseen &&
            !(cu->hdone && cu->hstep == cu->applied))
            break;
        if (cu->target == UINT64_MAX && cu->applied == cu->maxseen) {
            memcpy(cu->blob + CU_BLOB, cu_w(cu), half);
            memcpy(cu->blob + CU_BLOB + half, cu_m(cu), half);
            cu->bstep = cu->applied;
            cu->bdone = 1;
            memcpy(cu->bh, cu->h, 64);
        }
        /* the members' optimizer, on the device where theirs runs */
        if (t->host_slabs)
            memcpy(mesh_nn_model_grads(t->model), cu->g[r], half);
        else if ((rc = mesh_nn_upload(t->ctx, mesh_nn_model_grads(t->model),
                                      cu->g[r], half)) < 0)
            return rc;
        mesh_nn_sgd_set_steps(t->sgd, (int64_t)cu->applied);
        rc = mesh_nn_sgd_step(t->sgd, cu->glr[r]);
        if (rc == 0)
            rc = cu_pull(cu);
        if (rc < 0)
            return rc;
        cu->gstep[r] = UINT64_MAX;
        cu->applied++;
        cu->steps++;
        cu_hash_reset(cu, cu->applied);
    }
    return 0;
}

/*
 * On the catch-up thread, with or without mu (only this thread writes
 * what it reads): hash up to max more bytes of the snapshot's stripes,
 * as far as they came (stripe i from p[i]): the hashes run while the
 * rest arrive, not after. 1 if max stopped it, 0 if it hashed all that
 * came, -1 on an OpenSSL error.
 */
static int cu_hash_some(struct train_catchup *cu, size_t max)
{
    for (int i = 0; i < cu->k && max; i++) {
        struct cu_peer *p = &cu->p[i];
        size_t lo = cu->n * (size_t)i / (size_t)cu->k, end, len;

        if (p->snap_done)
            end = cu->n * (size_t)(i + 1) / (size_t)cu->k;
        else if (p->kind == K_SNAP && p->dst && p->hlen == CU_HDR)
            end = (size_t)(p->dst - cu->blob);
        else
            continue;
        if (end <= lo + p->hashed)
            continue;
        len = MESH_MIN(end - lo - p->hashed, max);
        if (sh_feed(&p->sh, cu->blob + lo + p->hashed, len) < 0)
            return -1;
        p->hashed += len;
        max -= len;
    }
    return max == 0;
}

/*
 * The cell hashes of the weights and of the momentum of the snapshot in
 * blob, into h (as train.c's weights_hash): from the SHA-256s of the
 * cells the stripes' hashes kept, and of the others (the few across two
 * stripes) hashed now. 0, or -1.
 */
static int cu_cells(struct train_catchup *cu, uint8_t h[64])
{
    size_t half = cu->np * 4, nc = cells_of(half);

    for (size_t c = 1; c < 1 + 2 * nc; c++) {
        size_t lo, hi;

        if (cu->cellok[c])
            continue;
        cell_range(cu->np, c, &lo, &hi);
        if (!EVP_Digest(cu->blob + lo, hi - lo, cu->cells + 32 * c, NULL,
                        EVP_sha256(), NULL))
            return -1;
        cu->cellok[c] = 1;
    }
    if (train_wch_top(cu->cells + 32, nc, h) < 0 ||
        train_wch_top(cu->cells + 32 * (1 + nc), nc, h + 32) < 0)
        return -1;
    return 0;
}

/* The snapshot and every SHA-256 came: check and load it. */
static int cu_load(struct train_catchup *cu)
{
    struct trainer *t = cu->t;
    uint8_t d[32], h[64];

    if (t->nparams != cu->np) {
        mesh_info("catch-up: the members' model has %zu parameters, this "
                  "peer's %zu",
                  cu->np, t->nparams);
        return -1;
    }
    if (cu_hash_some(cu, SIZE_MAX) < 0)
        return -1;
    for (int i = 0; i < cu->k; i++) {
        struct cu_peer *p = &cu->p[i];

        if (p->hashed != cu->n * (size_t)(i + 1) / (size_t)cu->k -
                             cu->n * (size_t)i / (size_t)cu->k ||
            sh_final(&p->sh, d) < 0 || memcmp(d, p->digest, 32) != 0) {
            mesh_info("catch-up: the snapshot received does not hash to the "
                      "SHA-256 the members offered (slot %d's stripe)",
                      p->slot);
            return -1;
        }
    }
    if (mesh_get_le32(cu->blob) != CU_MAGIC_B ||
        mesh_get_le32(cu->blob + 4) != CU_VERSION ||
        mesh_get_le64(cu->blob + 8) != cu->x ||
        mesh_get_le64(cu->blob + 16) != t->nparams)
        return -1;
    if (cu_cells(cu, h) < 0 || cu_put(cu, cu->blob + CU_BLOB) < 0)
        return -1;
    cu->loaded = 1;
    /* the state's hashes came with the stripes' (one pass) */
    cu_hash_reset(cu, cu->x);
    memcpy(cu->h, h, 64);
    cu->hoff = 8 * cu->np;
    cu->hdone = 1;
    cu->t_snap = mesh_now_s() - cu->t0;
    t->join_mark[TRAIN_JM_SNAP] = cu->t0 + cu->t_snap;
    train_fault(t, TRAIN_FAULT_CATCHUP); /* test aid: the joiner dies */
    /* admit us now, not a step later: the view that admits us restarts
     * from a boundary at or after X, and the gradients of the steps up to
     * it were all-reduced before it, so they come (cu_apply applies them
     * up to the target; what does not come in time is sent in the view
     * change). Not when a member closed meanwhile (a snapshot that came
     * while the model was built, then a view change or a drop): no more
     * steps come on these connections, and the next try loads its own */
    for (int i = 0; i < cu->k; i++)
        if (cu->p[i].eof)
            return 0;
    if (mesh_elastic_passed(t->el) > cu->epoch)
        return 0; /* (nor once the members moved on: cu_try) */
    /* the members admit us as soon as we ask: not before every one has
     * committed X (else the view would restart before it) */
    mesh_elastic_join_need(t->el, cu->x + 1);
    if (cu->ready)
        mesh_elastic_join_hold(t->el, 0);
    else
        cu->unhold = 1;
    return 0;
}

/*
 * Under mu: the header p->hdr, just complete, is signed by its member
 * with the job's secret over our nonce (CU_SEQ): every record's header but
 * the K_RDMA answer, which carries no sequence number, is also the next
 * one. 0, or -1 (forged, or garbled on the way: logged, naming the
 * member).
 */
static int cu_signed(struct train_catchup *cu, struct cu_peer *p)
{
    const struct mesh_opts *mo = cu->t->mo;
    static const char *const kinds[] = {"?",      "HELLO", "AUTH", "LATE",
                                        "REFUSE", "SNAP",  "GRAD", "DIGEST",
                                        "RDMA",   "ACK"};
    const uint8_t *h = p->hdr;
    int kind = h[5], seq_ok;
    uint8_t mac[32];
    char name[MESH_HOST_MAX + 16];

    seq_ok = kind == K_RDMA || mesh_get_le64(h + CU_SEQ) == p->seq + 1;
    if (seq_ok &&
        auth_mac(mo->topts.secret, mo->topts.secret ? mo->topts.secret_len : 0,
                 h, p->jnonce, mac) == 0 &&
        CRYPTO_memcmp(mac, h + 64, 32) == 0) {
        if (kind != K_RDMA)
            p->seq++;
        return 0;
    }
    mesh_info("catch-up: slot %d (%s) sent a %s record whose header is not "
              "signed with the job's secret over this peer's nonce%s "
              "(forged, or garbled on the way): refused; its stripe is "
              "fetched from the other member(s)",
              p->slot, mesh_peer_name(&mo->world, p->slot, name, sizeof(name)),
              kind < (int)MESH_ARRAY_SIZE(kinds) ? kinds[kind] : "unknown",
              seq_ok ? "" : ", or out of sequence");
    return -1;
}

/* p's side channel did not connect or answer: its stripe comes over TCP
 * in the next tries; after a second member's, every stripe. */
static void cu_side_bad(struct train_catchup *cu, const struct cu_peer *p)
{
    cu->side_bad |= UINT64_C(1) << p->slot;
    if (__builtin_popcountll(cu->side_bad) > 1)
        cu->no_rdma = 1;
}

/*
 * Under mu: p's K_RDMA, its answer to ours (signed over our nonce:
 * cu_signed): its side channel's address (connect ours to it), or none
 * (then TCP). 0, -1 (out of place: the catch-up fails), -4 (ours did not
 * connect: try again over TCP).
 */
static int cu_rdma(struct train_catchup *cu, struct cu_peer *p)
{
    const uint8_t *h = p->hdr;
    int rc;

    /* (its signature is checked: cu_signed) */
    if (!p->side || p->rdma) {
        mesh_info("catch-up: slot %d's side channel address is out of place",
                  p->slot);
        return -1;
    }
    if (h[56] != 1) {
        mesh_info("catch-up: slot %d has no RDMA side channel: its stripe "
                  "comes over TCP",
                  p->slot);
        mesh_side_close(p->side);
        p->side = NULL;
        return 0;
    }
    rc = mesh_side_connect(p->side, h + 8);
    if (rc < 0) {
        mesh_info("catch-up: slot %d's side channel: %s; trying again, its "
                  "stripe over TCP",
                  p->slot, mesh_err_msg(rc));
        cu_side_bad(cu, p);
        return -4;
    }
    p->rdma = 1;
    return 0;
}

/* Under mu: the record whose header p holds carries no bytes but where
 * to read them (SNAP or GRAD over RDMA): start reading p->left bytes into
 * p->dst. 0, or -1 (the catch-up fails). */
static int cu_read(struct cu_peer *p)
{
    int rc;

    if (!p->rdma) {
        mesh_info("catch-up: slot %d says to read a record over RDMA, "
                  "without a side channel",
                  p->slot);
        return -1;
    }
    if (!p->left)
        return 0;
    rc = mesh_side_read(p->side, p->dst, p->left, mesh_get_le64(p->hdr + 40),
                        mesh_get_le32(p->hdr + 48));
    if (rc < 0) {
        mesh_info("catch-up: slot %d: %s", p->slot, mesh_err_msg(rc));
        return -1;
    }
    p->rd = 1;
    p->rd0 = p->dst;
    p->rdlen = p->left;
    p->rd_t0 = mesh_now_s();
    return 0;
}

/*
 * Under mu: a record's header from p is complete: check it and say where
 * its payload goes. 1: wait (its step has no room yet), 0 go on, -1 the
 * catch-up fails, -2 boundary X had passed (LATE), -4 try again over TCP.
 */
static int cu_header(struct train_catchup *cu, struct cu_peer *p)
{
    const uint8_t *h = p->hdr;
    size_t np = cu->np;

    if (mesh_get_le32(h) != CU_MAGIC || h[4] != CU_VERSION ||
        mesh_get_le16(h + 6) != p->slot)
        return -1;
    p->kind = h[5];
    p->dst = NULL;
    p->left = 0;
    if (p->kind == K_RDMA)
        return cu_rdma(cu, p);
    if (p->side && !p->rdma)
        return -1; /* its K_RDMA comes first */
    if (p->kind == K_LATE)
        return -2;
    if (p->kind == K_REFUSE)
        return -3;
    if (p->kind == K_SNAP) {
        uint64_t n = mesh_get_le64(h + 16), off = mesh_get_le64(h + 24),
                 len = mesh_get_le64(h + 32);
        int i = (int)(p - cu->p);

        if (p->snap_done || mesh_get_le64(h + 8) != cu->x || n != cu->n ||
            off != cu->n * (size_t)i / (size_t)cu->k ||
            off + len != cu->n * (size_t)(i + 1) / (size_t)cu->k)
            return -1;
        p->dst = cu->blob + off;
        p->left = len;
        return h[52] == CU_VIA_RDMA ? cu_read(p) : h[52] ? -1 : 0;
    }
    if (p->kind == K_DIGEST) {
        if (!p->snap_done || p->dig_done || mesh_get_le64(h + 8) != cu->x)
            return -1;
        memcpy(p->digest, h + CU_DIGEST, 32);
        p->dst = NULL;
        p->left = 0;
        return 0;
    }
    if (p->kind == K_GRAD) {
        uint64_t k = mesh_get_le64(h + 8), off = mesh_get_le64(h + 24),
                 cnt = mesh_get_le64(h + 32);
        int i = (int)(p - cu->p), r;
        float lr;

        memcpy(&lr, h + 16, 4);
        if (!p->dig_done || k != p->next || !isfinite(lr) ||
            off != np * (size_t)i / (size_t)cu->k ||
            off + cnt != np * (size_t)(i + 1) / (size_t)cu->k)
            return -1;
        if (k > cu->maxseen || cu->maxseen == UINT64_MAX)
            cu->maxseen = k;
        if (k >= cu->applied + CU_RING)
            return 1; /* no room yet: it waits in the socket */
        r = (int)(k % CU_RING);
        if (cu->gstep[r] != k) {
            cu->gstep[r] = k;
            cu->gparts[r] = 0;
            cu->glr[r] = lr;
        } else if (memcmp(&cu->glr[r], &lr, 4) != 0) {
            return -1; /* the members disagree on the step's rate */
        }
        p->rstep = k;
        p->dst = (uint8_t *)(cu->g[r] + off);
        p->left = cnt * 4;
        return h[52] == CU_VIA_RDMA ? cu_read(p) : h[52] ? -1 : 0;
    }
    return -1; /* REFUSE, or anything else */
}

/* Under mu: a record's payload from p is complete. */
static int cu_record_done(struct train_catchup *cu, struct cu_peer *p)
{
    p->hlen = 0;
    p->dst = NULL;
    if (p->kind == K_RDMA)
        return 0;
    if (p->kind == K_SNAP) {
        int all = 1;

        p->snap_done = 1;
        p->t_done = mesh_now_s() - cu->t0;
        for (int i = 0; i < cu->k; i++)
            all &= cu->p[i].snap_done;
        if (all) {
            cu->t_in = mesh_now_s() - cu->t0;
            cu->t->join_mark[TRAIN_JM_BYTES] = cu->t0 + cu->t_in;
        }
        return 0;
    }
    if (p->kind == K_DIGEST) {
        int all = 1;

        p->dig_done = 1;
        for (int i = 0; i < cu->k; i++)
            all &= cu->p[i].dig_done;
        cu->snap_in = all;
        if (all && cu->model && cu_load(cu) < 0)
            return -1;
        return 0;
    }
    cu->gparts[p->rstep % CU_RING]++;
    p->next = p->rstep + 1;
    return 0;
}

/* cu_alloc's buffers freed (those there). */
static void cu_free_bufs(struct train_catchup *cu)
{
    free(cu->blob);
    free(cu->cells);
    free(cu->cellok);
    cu->blob = cu->cells = cu->cellok = NULL;
    for (int r = 0; r < CU_RING; r++) {
        free(cu->g[r]);
        cu->g[r] = NULL;
    }
}

/* The buffers for a model of np parameters: the snapshot and CU_RING
 * steps of gradient. -1 when out of memory. */
static int cu_alloc(struct train_catchup *cu, size_t np)
{
    int ok;

    cu->n = blob_bytes(np);
    cu->blob = malloc(cu->n);
    cu->cells = malloc(32 * (1 + 2 * cells_of(np * 4)));
    cu->cellok = malloc(1 + 2 * cells_of(np * 4));
    ok = cu->blob && cu->cells && cu->cellok;
    for (int r = 0; r < CU_RING; r++) {
        cu->g[r] = malloc(np * 4 + 4);
        ok &= cu->g[r] != NULL;
    }
    if (ok)
        return 0;
    mesh_info("catch-up: out of memory for a snapshot of %zu bytes", cu->n);
    cu_free_bufs(cu);
    return -1;
}

/*
 * Under mu: the reads over RDMA in progress: what landed counts as the
 * bytes of a TCP payload would (the snapshot is hashed as it comes); a
 * record read whole is done, and a GRAD record's K_ACK lets its member
 * use the buffer again. -1 when the catch-up fails; -4 when a read failed
 * (a side channel that does not answer: retried, or a member gone: the
 * view changes): try again over TCP.
 */
static int cu_reads(struct train_catchup *cu)
{
    for (int i = 0; i < cu->k; i++) {
        struct cu_peer *p = &cu->p[i];
        size_t done = 0, d;
        uint64_t step = p->rstep;
        int rc, grad = p->kind == K_GRAD;

        if (!p->rd || p->eof)
            continue;
        rc = mesh_side_poll(p->side, &done);
        if (rc < 0) {
            /* a side channel that does not answer (or a member gone):
             * the read fails within --peer-timeout (transport/verbs/
             * side.c); the next try reads that member's stripe over TCP */
            mesh_info("catch-up: slot %d: %s, %.1f s after the read of %zu "
                      "bytes began; trying again, its stripe over TCP",
                      p->slot, mesh_err_msg(rc), mesh_now_s() - p->rd_t0,
                      p->rdlen);
            p->rd = 0;
            cu_side_bad(cu, p);
            return -4;
        }
        d = done - (p->rdlen - p->left);
        p->dst = p->rd0 + done;
        p->left = p->rdlen - done;
        if (d)
            cu->t_rx = mesh_now_s();
        if (grad) {
            cu->rdma_grad += d;
        } else {
            if (d && !p->t_first)
                p->t_first = mesh_now_s() - cu->t0;
            cu->got += d;
            p->got += d;
            cu->rdma_snap += d;
        }
        if (rc == 0)
            continue;
        p->rd = 0;
        if (cu_record_done(cu, p) < 0)
            return -1;
        if (grad) {
            uint8_t h[CU_HDR];

            hdr_init(h, K_ACK, cu->t->mo->world.rank);
            mesh_put_le64(h + 8, step);
            if (send_all_fd(p->fd, h, CU_HDR, mesh_now_s() + 1) < 0)
                p->eof = 1;
        }
    }
    return 0;
}

/*
 * Each member we offered a side channel answers it (K_RDMA) before any
 * other record (sess_side): read every member's answer now, so that each
 * side channel is settled (connected; none: that stripe over TCP; one that
 * does not connect: the next try over TCP) and said in the log before this
 * try reads any other record, whatever ends it (a member's LATE read
 * before another's answer would hide that answer). Without mu, as
 * cu_connect (only this thread writes what it reads). 0; 1: try again (a
 * member closed or did not answer within --peer-timeout, 3 s at least; an
 * answer not signed, which shuns its member; or a side channel that did
 * not connect); -1: the catch-up fails (an answer out of place).
 */
static int cu_answers(struct train_catchup *cu)
{
    double until =
        mesh_now_s() + MESH_MAX(3.0, cu->t->mo->topts.peer_timeout_s);
    int rc = 0;

    for (int i = 0; i < cu->k; i++) {
        struct cu_peer *p = &cu->p[i];
        int r;

        if (!p->side)
            continue;
        if (cu_read_hdr(p, until) < 0) {
            mesh_info("catch-up: slot %d did not answer this peer's side "
                      "channel",
                      p->slot);
            rc = MESH_MAX(rc, 1);
            continue;
        }
        p->hlen = 0;
        if (cu_signed(cu, p) < 0) {
            cu->shun |= UINT64_C(1) << p->slot;
            rc = MESH_MAX(rc, 1);
            continue;
        }
        r = cu_header(cu, p);
        if (r == -4) {
            rc = MESH_MAX(rc, 1);
        } else if (r < 0) {
            mesh_info("catch-up: slot %d answered this peer's side channel "
                      "out of place (kind %d)",
                      p->slot, p->hdr[5]);
            rc = 2;
        }
    }
    return rc == 2 ? -1 : rc;
}

/*
 * How long an admitted joiner waits in the view change for the gradients
 * it lacks, while they keep coming (3 s without a byte ends it, as it
 * always did): the members wait for it there, but for less than the whole
 * state over the same links. Within the peer timeout, so that no
 * member's wait for it in the transfer nears that (3 s at least), and 2 s
 * short of the members' join timeout for the view's mesh
 * (train_view_join_timeout), which a joiner on a device opens only after
 * this wait.
 */
static double cu_wait_cap(const struct train_catchup *cu)
{
    double pt = cu->t->mo->topts.peer_timeout_s;

    return MESH_MIN(MESH_MAX(3.0, 0.8 * pt),
                    train_view_join_timeout(cu->t) - 2.0);
}

/*
 * One try: connect, name the boundary margin steps after the last one
 * the members passed (0: that one, which they copy at once unless its
 * update has begun), receive and apply until the target is reached. 1
 * done, 0 try again (*margin grown after LATE), -1 give up.
 */
static int cu_why_line; /* (the log line when the catch-up fails) */

static int cu_why(int line, int rc)
{
    mesh_debug("catch-up: try ends (%d) at line %d", rc, line);
    cu_why_line = line;
    return rc;
}

/* Under mu, caught up: when each stripe's first and last bytes came, in
 * s into the catch-up (bench/join.sh reads it). */
static void cu_stripes_report(const struct train_catchup *cu)
{
    char line[64 * MESH_ELASTIC_MAX_SLOTS];
    size_t n = 0;

    line[0] = '\0';
    for (int i = 0; i < cu->k && n + 64 < sizeof(line); i++)
        n += (size_t)snprintf(line + n, sizeof(line) - n, "%sslot %d %.3f-%.3f",
                              i ? ", " : "", cu->p[i].slot, cu->p[i].t_first,
                              cu->p[i].t_done);
    mesh_info("catch-up: the snapshot asked at %.3f s, its stripes came "
              "(first byte-last byte, s into the catch-up): %s",
              cu->t_ask, line);
}

/*
 * Under mu, while the snapshot comes: whether catching up still pays.
 * The stripes share the senders' links with the members' training, and
 * each step's gradient (4 np bytes, a stripe of it from each of the K
 * members) follows on the same links. The catch-up goes at the pace of
 * its slowest stripe: at the rate r that one came so far, the snapshot
 * takes S = (its length) / r, and its stripe of a gradient the fraction
 * f = 4 np / (K r T) of the members' step T (from the stripes' total
 * rate until 8 December 2026, which missed one member whose link its
 * all-reduce kept busier: bench/join.sh --senders 3 --rate 200mbit,
 * stripes in at 4.5, 4.6 and 11.6 s, B 1.46 x N / R). The
 * joiner asks to be admitted once its snapshot is loaded; the view
 * change then waits for the gradients of the steps that passed
 * meanwhile (S / T of them: f S at r, or the whole state, S, at most,
 * which it sends instead). So the rest of the catch-up e s into the
 * snapshot is S - e + min(f, 1) S, and the whole state in the view
 * change about S, from links the members' pause frees: the whole state
 * is sooner while e < min(f, 1) S. Only from f >= 1/2, where the
 * catch-up's bytes take the links at least half as long again as the
 * snapshot's, beside the members' steps (which they slow): below, the
 * members' training matters more. One sender of ResNet-50's 205 MB on a
 * 200 Mbit/s link that a 7-peer ring shares: r 12 MB/s, T 8 to 13 s, f
 * 0.7 to 1 (doc/elastic.md, "One sender"). Judged from 0.5 s into the
 * snapshot on, once its first bytes came 0.25 s before (r counts from
 * them: a member copies its stripe before it sends, 0.1 to 0.5 s for all
 * of ResNet-50's at a load of 10; the links are shaped from the first
 * byte, tbf's burst is 4 ms of its rate), while every stripe comes, with
 * the members' step times (HELLO). Every second spent before giving up
 * is one more of the join (the bytes received are dropped: the view
 * restarts from a later step): from 2 s, as until 8 December 2026, it
 * was 18 to 25 % of the join with one sender at 200 Mbit/s, the whole
 * state itself 1.05 x N / R on the wire. 1: give up (the joiner is
 * admitted with the whole state); 0: go on.
 */
static int cu_worth(struct train_catchup *cu, double now)
{
    double e = now - cu->t0 - cu->t_ask, step = 0, s = 0, f = 0, r = 0;
    int slow = -1;

    if (cu->snap_in || cu->got >= cu->n || cu->got == 0 || e < 0.5 ||
        now - cu->t_rx > 1)
        return 0;
    for (int i = 0; i < cu->k; i++) {
        const struct cu_peer *p = &cu->p[i];
        double since, ri, len;

        /* a stripe not begun is a member that does not send (a silent
         * side channel, a member gone), not a rate: its own timeout ends
         * the try */
        if (!p->snap_done && !p->t_first)
            return 0;
        step = MESH_MAX(step, p->step_s);
        if (p->snap_done)
            continue;
        since = now - cu->t0 - p->t_first; /* s since its first bytes */
        if (since < 0.25 || !p->got)
            return 0;
        ri = (double)p->got / since;
        len = (double)(cu->n * (size_t)(i + 1) / (size_t)cu->k -
                       cu->n * (size_t)i / (size_t)cu->k);
        if (len / ri > s) {
            s = len / ri;
            r = ri;
            slow = i;
        }
    }
    if (step <= 0 || slow < 0)
        return 0;
    f = 4.0 * (double)cu->np / (double)cu->k / (r * step);
    if (f < 0.5 || MESH_MIN(f, 1.0) * s <= e)
        return 0;
    mesh_info("catch-up: given up %.1f s into the snapshot (%zu of %zu "
              "bytes in): its slowest stripe (slot %d's) comes at %.1f MB/s, "
              "at which its part of a step's gradient (%.1f MB) takes %.0f%% "
              "of the members' %.2f s step; the whole state in the view "
              "change is sooner",
              e, cu->got, cu->n, cu->p[slow].slot, r / 1e6,
              4e-6 * (double)cu->np / (double)cu->k, 100 * f, step);
    return 1;
}

static int cu_try(struct train_catchup *cu, uint64_t *margin)
{
    struct trainer *t = cu->t;
    uint16_t ports[MESH_ELASTIC_MAX_SLOTS];
    double until = mesh_now_s() + 3, eof_at = 0, tgt_at = 0, wait_s;
    uint64_t x = 0;
    size_t nparams;
    int rc, ans = 0, rehold = 0;
    char pbuf[4 * MESH_ELASTIC_MAX_SLOTS];

    /* every member of the view the running members report, with a port */
    while (mesh_elastic_side_view(t->el, &cu->epoch, &cu->members, ports) < 0) {
        if (mesh_now_s() > until || cu->stop || cu->target != UINT64_MAX)
            return cu_why(__LINE__, -1);
        pthread_mutex_unlock(&cu->mu);
        usleep(20000);
        pthread_mutex_lock(&cu->mu);
    }
    /* every member's records were refused: the view change sends the
     * state (over the mesh, authenticated) */
    if (!(cu->members & ~cu->shun))
        return cu_why(__LINE__, -1);
    nparams = cu->np;
    mesh_elastic_join_view(t->el, cu->epoch + 1);
    pthread_mutex_unlock(&cu->mu);
    rc = cu_connect(cu, ports, &nparams);
    for (int i = 0; i < cu->k && rc == 0; i++)
        x = MESH_MAX(x, cu->p[i].at);
    cu->live = x;
    x += *margin;
    /* a try that ended before its AUTH was answered (cu->np still 0)
     * sized the buffers by HELLOs not yet authenticated: another count
     * now, they are sized anew (cellok, cells and blob by np) */
    if (rc == 0 && cu->blob && cu->n != blob_bytes(nparams))
        cu_free_bufs(cu);
    if (rc == 0 && !cu->blob && cu_alloc(cu, nparams) < 0) {
        pthread_mutex_lock(&cu->mu);
        return cu_why(__LINE__, -1);
    }
    /* each stripe's hash, kept cell by cell for the state's */
    if (rc == 0)
        memset(cu->cellok, 0, 1 + 2 * cells_of(nparams * 4));
    for (int i = 0; i < cu->k && rc == 0; i++)
        rc = sh_init(&cu->p[i].sh, nparams, cu->n * (size_t)i / (size_t)cu->k,
                     cu->n * (size_t)(i + 1) / (size_t)cu->k, cu->cells,
                     cu->cellok);
    if (rc == 0) {
        cu_sides(cu, nparams);
        rc = cu_auth(cu, x, nparams);
    }
    if (rc == 0)
        ans = cu_answers(cu);
    if (rc < 0 || ans > 0)
        usleep(200000); /* a view forming or changing: try again */
    pthread_mutex_lock(&cu->mu);
    if (rc < 0 || ans > 0)
        return cu_why(__LINE__, 0);
    if (ans < 0)
        return cu_why(__LINE__, -1);
    cu->np = nparams;
    cu->x = x;
    cu->t_ask = mesh_now_s() - cu->t0;
    cu->t_in = 0;
    cu->applied = x;
    cu->maxseen = x;
    cu->loaded = 0;
    cu->snap_in = 0;
    cu->got = 0;
    cu->rdma_snap = cu->rdma_grad = 0;
    cu->bstep = UINT64_MAX;
    cu_hash_reset(cu, UINT64_MAX);
    for (int r = 0; r < CU_RING; r++)
        cu->gstep[r] = UINT64_MAX;
    /* to catch up: half the time the joiner waits to be admitted
     * (elastic_recover's), so that it is admitted with the whole state
     * within that time if it cannot */
    wait_s = MESH_MAX(5.0, 2 * t->mo->topts.peer_timeout_s);
    wait_s = MESH_MAX(wait_s, t->mo->topts.join_timeout_s);
    until = mesh_now_s() + MESH_MAX(10.0, wait_s / 2);
    while (!cu->stop) {
        struct pollfd pf[MESH_ELASTIC_MAX_SLOTS];
        int ix[MESH_ELASTIC_MAX_SLOTS], np = 0, open = 0, more, reading = 0;
        double now = mesh_now_s();

        /* the snapshot came before the model was built */
        if (cu->snap_in && !cu->loaded && cu->model && cu_load(cu) < 0)
            return cu_why(__LINE__, -1);
        if (cu_apply(cu) < 0)
            return cu_why(__LINE__, -1);
        if (cu->target != UINT64_MAX) {
            if (!tgt_at) {
                tgt_at = now;
                cu->hoff_tgt = cu->hdone ? 8 * cu->np : cu->hoff;
            }
            /* the state's SHA-256 finished here, for the view change */
            if (cu->loaded && cu->applied == cu->target) {
                (void)cu_hash_state(cu, SIZE_MAX);
                cu_stripes_report(cu);
                return 1;
            }
            /* the view change waits for us: what does not come (a
             * member is gone) is sent in it instead, and so is the whole
             * state where we lack more than it (over one slow link the
             * snapshot can take steps, whose gradients come behind it:
             * 200 MB for ResNet-50 in two, as long as its 205 MB state),
             * or the snapshot itself after 3 s */
            if (cu->target < cu->x ||
                (cu->loaded && cu->applied > cu->target) ||
                now - MESH_MAX(tgt_at, cu->t_rx) > 3 ||
                now - tgt_at > (cu->loaded ? cu_wait_cap(cu) : 3) ||
                (cu->target - cu->applied) * cu->np * 4 > cu->n ||
                (eof_at && now - MESH_MAX(eof_at, tgt_at) > 0.5))
                return cu_why(__LINE__, -1);
        }
        /* a member names a view after ours: the members drain these
         * sessions (no more steps come), so we must not be admitted in
         * the view change after it, which would need that view's steps:
         * our join waits again until the next try loaded its snapshot */
        if (cu->target == UINT64_MAX && !rehold &&
            mesh_elastic_passed(t->el) > cu->epoch) {
            rehold = 1;
            cu->unhold = 0;
            mesh_elastic_join_hold(t->el, 1);
        }
        /* not caught up in time: admitted as before */
        if (!cu->steps && now > until)
            return cu_why(__LINE__, -1);
        if (cu->target == UINT64_MAX && cu_worth(cu, now))
            return cu_why(__LINE__, -1);
        for (int i = 0; i < cu->k; i++) {
            struct cu_peer *p = &cu->p[i];

            if (p->eof)
                continue;
            open++;
            /* a GRAD record waiting for room stays in the socket, and
             * what follows a record read over RDMA until it is read */
            reading |= p->rd;
            if ((p->hlen == CU_HDR && !p->dst) || p->rd)
                continue;
            ix[np] = i;
            pf[np].fd = p->fd;
            pf[np++].events = POLLIN;
        }
        if (open < cu->k && !eof_at)
            eof_at = now;
        if (open < cu->k && cu->target == UINT64_MAX) {
            /* a member closed: the view changed. Unless it is the view
             * change that admits us, start again in the next view as
             * soon as every member of it reports it (a view that leaves
             * us out), not after a fixed wait, which a job's last steps
             * may not outlast. A close that no view change follows (a
             * member that dropped us, too far behind): after 3 s, or
             * half the peer timeout */
            uint16_t pp[MESH_ELASTIC_MAX_SLOTS];
            uint64_t ep, mm;

            if (mesh_elastic_side_view(t->el, &ep, &mm, pp) == 0 &&
                ep > cu->epoch) {
                mesh_info("catch-up: the members' view %" PRIu64
                          " (slots %s) leaves out this peer and follows the "
                          "view of this try (%" PRIu64 "): starting again "
                          "from it",
                          ep, mesh_elastic_slots_str(mm, pbuf, sizeof(pbuf)),
                          cu->epoch);
                /* held, as above: this report may come before the view
                 * passed here, and the next try starts from nothing */
                if (!rehold) {
                    cu->unhold = 0;
                    mesh_elastic_join_hold(t->el, 1);
                }
                return cu_why(__LINE__, 0);
            }
            if (now - eof_at > MESH_MAX(3.0, 0.5 * t->mo->topts.peer_timeout_s))
                return cu_why(__LINE__, 0);
        }
        /* a slice of the snapshot's SHA-256, or of the state's once it
         * is loaded, between the receives; without mu, which the
         * training thread waits for (train_catchup_aim, _model, _ready):
         * what they hash, and where they are, only this thread writes */
        pthread_mutex_unlock(&cu->mu);
        more = cu->blob && !cu->loaded ? cu_hash_some(cu, CU_SLICE)
                                       : cu_hash_state(cu, CU_SLICE);
        if (more >= 0)
            (void)poll(pf, (nfds_t)np, more ? 0 : reading ? 1 : 50);
        pthread_mutex_lock(&cu->mu);
        if (more < 0)
            return cu_why(__LINE__, -1);
        if (reading && (rc = cu_reads(cu)) < 0)
            return cu_why(__LINE__, rc == -4 ? 0 : -1);
        for (int j = 0; j < np; j++) {
            struct cu_peer *p = &cu->p[ix[j]];
            ssize_t r;

            if (!(pf[j].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (p->hlen < CU_HDR)
                r = recv(p->fd, p->hdr + p->hlen, CU_HDR - p->hlen,
                         MSG_DONTWAIT);
            else
                r = recv(p->fd, p->dst, p->left, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                           errno != EINTR)) {
                p->eof = 1;
                continue;
            }
            if (r < 0)
                continue;
            if (p->hlen < CU_HDR) {
                p->hlen += (size_t)r;
                if (p->hlen < CU_HDR)
                    continue;
                if (cu_signed(cu, p) < 0) {
                    /* the next try fetches its stripe from the others */
                    cu->shun |= UINT64_C(1) << p->slot;
                    return cu_why(__LINE__, 0);
                }
                rc = cu_header(cu, p);
                if (rc == -2 || rc == -3 || rc == -4) {
                    /* X had passed, or the view changed meanwhile, or
                     * RDMA failed: again over TCP */
                    if (rc == -2) {
                        *margin = *margin ? *margin * 2 : 1;
                        mesh_info("catch-up: slot %d is past step %" PRIu64
                                  " (LATE, at %" PRIu64 "): asking %" PRIu64
                                  " step(s) ahead",
                                  p->slot, cu->x, mesh_get_le64(p->hdr + 8),
                                  *margin);
                    }
                    return cu_why(__LINE__, 0);
                }
                if (rc < 0) {
                    mesh_info("catch-up: slot %d sent a record out of place "
                              "(kind %d)",
                              p->slot, p->kind);
                    return cu_why(__LINE__, -1);
                }
                if (rc == 1)
                    continue;
            } else {
                cu->t_rx = mesh_now_s();
                p->dst += r;
                p->left -= (size_t)r;
                if (p->kind == K_SNAP && !p->t_first)
                    p->t_first = mesh_now_s() - cu->t0;
                if (p->kind == K_SNAP) {
                    cu->got += (size_t)r;
                    p->got += (size_t)r;
                }
            }
            if (p->left == 0 && cu_record_done(cu, p) < 0)
                return cu_why(__LINE__, -1);
        }
        /* headers that waited for room (after cu_apply's next round) */
        if (cu_apply(cu) < 0)
            return cu_why(__LINE__, -1);
        for (int i = 0; i < cu->k; i++) {
            struct cu_peer *p = &cu->p[i];

            if (p->hlen == CU_HDR && !p->dst && !p->eof && p->kind == K_GRAD) {
                rc = cu_header(cu, p);
                if (rc < 0)
                    return cu_why(__LINE__, -1);
                if (rc == 0 && p->left == 0 && cu_record_done(cu, p) < 0)
                    return cu_why(__LINE__, -1);
            }
        }
    }
    return cu_why(__LINE__, -1);
}

static void *cu_main(void *arg)
{
    struct train_catchup *cu = arg;
    uint64_t margin = 0; /* the boundary just passed: served at once */
    const struct mesh_opts *mo = cu->t->mo;
    int rc = 0;

    /* over verbs, the stripes and gradients are read over RDMA, on the
     * mesh's device (without one, they come over TCP) */
    if (mo->transport && !strcmp(mo->transport, "verbs")) {
        rc = side_dev_open(&mo->topts, &cu->sdev);
        if (rc < 0)
            mesh_info("catch-up: no RDMA side channels (%s): the state comes "
                      "over TCP",
                      mesh_err_msg(rc));
        else
            snprintf(cu->sdev_name, sizeof(cu->sdev_name), "%s",
                     mesh_side_dev_name(cu->sdev));
        mesh_err_clear();
        rc = 0;
    }
    pthread_mutex_lock(&cu->mu);
    for (int i = 0;
         i < CU_TRIES && rc == 0 && !cu->stop && cu->target == UINT64_MAX;
         i++) {
        rc = cu_try(cu, &margin);
        cu_close(cu);
        if (rc == 0)
            mesh_info("catch-up: try %d ended (train/catchup.c:%d); trying "
                      "again",
                      i + 1, cu_why_line);
    }
    mesh_side_dev_close(cu->sdev);
    cu->sdev = NULL;
    cu->result = rc == 1 ? 1 : -1;
    cu->t_end = mesh_now_s() - cu->t0;
    if (cu->result < 0) {
        mesh_info("catch-up did not complete (its last try ended at "
                  "train/catchup.c:%d): this peer asks to be admitted and "
                  "receives the whole state in the view change",
                  cu_why_line);
        mesh_elastic_join_view(cu->t->el, 0);
        mesh_elastic_join_need(cu->t->el, 0);
        /* once its model is built (admitted, it must join the view's
         * mesh at once, and receives the state into the model's slabs);
         * its kernels are built beside the transfer, which takes about N
         * / (its link's rate) here (train.c, warm_start) */
        if (cu->model)
            mesh_elastic_join_hold(cu->t->el, 0);
        else
            cu->unhold = 1;
    }
    pthread_cond_broadcast(&cu->cv);
    pthread_mutex_unlock(&cu->mu);
    return NULL;
}

int train_catchup_start(struct trainer *t)
{
    struct train_catchup *cu;
    int rc;

    t->cu_step = UINT64_MAX;
    /* (before the model is built: the conditions elastic_probe's hold
     * names; the buffers come with the members' parameter count) */
    if (!t->el || t->sim || t->c->simulate || getenv("MESHTRAIN_NO_CATCHUP"))
        return 0;
    cu = calloc(1, sizeof(*cu));
    if (!cu)
        return mesh_err(-ENOMEM, "out of memory");
    cu->t = t;
    cu->target = UINT64_MAX;
    /* bench aid (bench/join.sh): MESHTRAIN_XFER_SENDERS=K, the K lowest
     * members send, as in the view change's transfer (train/xfer.c) */
    if (getenv("MESHTRAIN_XFER_SENDERS"))
        cu->senders = MESH_MAX(0, atoi(getenv("MESHTRAIN_XFER_SENDERS")));
    for (int r = 0; r < CU_RING; r++)
        cu->gstep[r] = UINT64_MAX;
    cu->hstep = cu->bstep = UINT64_MAX;
    for (int i = 0; i < MESH_ELASTIC_MAX_SLOTS; i++)
        cu->p[i].fd = -1;
    pthread_mutex_init(&cu->mu, NULL);
    rc = mesh_cond_init_monotonic(&cu->cv);
    if (rc < 0) {
        pthread_mutex_destroy(&cu->mu);
        free(cu);
        return mesh_err(rc, "catch-up: pthread_cond_init: %s", strerror(-rc));
    }
    cu->t0 = mesh_now_s();
    mesh_elastic_join_hold(t->el, 1);
    rc = -pthread_create(&cu->th, NULL, cu_main, cu);
    if (rc < 0) {
        mesh_elastic_join_hold(t->el, 0);
        pthread_cond_destroy(&cu->cv);
        pthread_mutex_destroy(&cu->mu);
        free(cu);
        return mesh_err(rc, "catch-up: pthread_create: %s", strerror(-rc));
    }
    cu->running = 1;
    t->cu = cu;
    return 0;
}

void train_catchup_model(struct trainer *t)
{
    struct train_catchup *cu = t->cu;

    if (!cu)
        return;
    pthread_mutex_lock(&cu->mu);
    cu->model = 1;
    /* (a catch-up that failed waits for no kernels: cu_main) */
    if (cu->unhold && cu->result < 0) {
        mesh_elastic_join_hold(t->el, 0);
        cu->unhold = 0;
    }
    pthread_mutex_unlock(&cu->mu);
}

void train_catchup_ready(struct trainer *t)
{
    struct train_catchup *cu = t->cu;

    if (!cu)
        return;
    pthread_mutex_lock(&cu->mu);
    cu->ready = 1;
    if (cu->unhold)
        mesh_elastic_join_hold(t->el, 0);
    cu->unhold = 0;
    pthread_mutex_unlock(&cu->mu);
}

void train_catchup_stop(struct trainer *t)
{
    struct train_catchup *cu = t->cu;

    if (!cu)
        return;
    /* the warm-up's thread no longer tells it (train.c, warm_main) */
    pthread_mutex_lock(&t->warm_mu);
    t->cu = NULL;
    pthread_mutex_unlock(&t->warm_mu);
    pthread_mutex_lock(&cu->mu);
    cu->stop = 1;
    pthread_mutex_unlock(&cu->mu);
    pthread_join(cu->th, NULL);
    pthread_cond_destroy(&cu->cv);
    pthread_mutex_destroy(&cu->mu);
    cu_free_bufs(cu);
    train_wch_free(&cu->hwc[0]);
    train_wch_free(&cu->hwc[1]);
    free(cu);
    t->cu = NULL;
}

void train_catchup_aim(struct trainer *t, uint64_t step)
{
    struct train_catchup *cu = t->cu;

    if (!cu)
        return;
    pthread_mutex_lock(&cu->mu);
    cu->target = step;
    pthread_mutex_unlock(&cu->mu);
}

int train_catchup_finish(struct trainer *t, uint64_t step,
                         struct train_whash *wh)
{
    struct train_catchup *cu = t->cu;
    uint64_t deadline;
    int ok, rc = 0;

    t->cu_step = UINT64_MAX;
    if (!cu)
        return 0;
    /* (the catch-up thread gives up within its cap, cu_try) */
    deadline = mesh_now_ns() + (uint64_t)((cu_wait_cap(cu) + 1) * 1e9);
    pthread_mutex_lock(&cu->mu);
    cu->target = step;
    while (!cu->result && rc == 0)
        rc = mesh_cond_sleep(&cu->cv, &cu->mu, deadline);
    ok = cu->result == 1 && cu->loaded && cu->applied == step;
    if (ok)
        mesh_info("caught up in the background: a snapshot of step %" PRIu64
                  " (%zu bytes; the members were at step %" PRIu64
                  " when it asked, %.3f s into the catch-up; its bytes in at "
                  "%.3f s) in %.3f s, then %" PRIu64 " step(s) "
                  "replayed%s; state of step %" PRIu64 " after %.3f s, "
                  "%zu of its %zu bytes hashed while it waited",
                  cu->x, cu->n, cu->live, cu->t_ask, cu->t_in, cu->t_snap,
                  cu->steps,
                  cu->rolled ? " (one more undone: the view restarts "
                               "before it)"
                             : "",
                  step, cu->t_end, cu->hoff_tgt, 8 * cu->np);
    if (ok && cu->rdma_snap)
        mesh_info("catch-up over RDMA (%s): %zu of the snapshot's %zu bytes "
                  "and %zu bytes of gradients read from the members' memory",
                  cu->sdev_name, cu->rdma_snap, cu->n, cu->rdma_grad);
    if (ok && cu->hdone && cu->hstep == step) {
        memcpy(wh->h, cu->h, 64);
        wh->valid = 1;
    }
    t->cu_snap_step = ok ? cu->x : UINT64_MAX;
    t->cu_replayed = ok ? cu->steps : 0;
    t->cu_secs = ok ? cu->t_end : 0;
    pthread_mutex_unlock(&cu->mu);
    train_catchup_stop(t);
    if (ok)
        t->cu_step = step;
    return ok;
}
