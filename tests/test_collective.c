/*
 * tests/test_collective.c: the collectives over a real transport (default
 * TCP), with real processes on 127.0.0.1.
 *
 *   tests/test_collective [NMAX [TRANSPORT [LAYOUTS]]]
 *
 * ("3 verbs" and "1 auto 2x2" in the verbs lane; "8 shm 2x2,2x3,3x1" in
 * tests/collective_shm.sh, "1 auto 2x2,3x1" in tests/collective_auto.sh:
 * then also H hosts of L ranks each, the ranks of a "host" told apart by
 * MESHTRAIN_SHM_TEST_HOST.)
 *
 * For each N = 2..8 the parent forks N ranks that form a mesh, create a
 * communicator and run a battery: every operation, algorithm and dtype,
 * counts 0, 1, N-1, primes and a few MiB, in place and out of place, against
 * a serial reference (inputs are small integers, so every sum is exact in
 * any order); random floats, where the order matters, must give bitwise
 * the same bytes on every rank; several collectives started back to back
 * before any wait. Each rank sends one line per group ("name ok hash
 * detail") through a pipe; the parent prints one TAP line per group,
 * requiring every rank to pass and the hashes to agree where outputs must
 * be identical. Then two failure scenarios: ranks whose sizes disagree
 * (every rank must get an error), and a peer killed or stopped
 * mid-collective (every survivor must get an error naming it within the
 * peer timeout), on one host and, with LAYOUTS, on 2 hosts of 2.
 */
#include "config.h"

#include "collective/collective.h"
#include "common/util.h"
#include "tests/ports.h"
#include "tests/tap.h"
#include "transport/transport.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXP           8
#define LINE           1024
#define PEER_TIMEOUT_S 3.0
/* A stopped peer is declared dead within T (transport/tcp/progress.c). */
#define PEER_BOUND_S PEER_TIMEOUT_S
/* On top, for a loaded machine, and for the verbs lane's guest under
 * QEMU/TCG, where a 16 MiB all-reduce alone takes seconds (a SIGKILL was
 * seen noticed after 6.99 s with 4 other test jobs on 2 cores). */
#define SLACK_S 4.0
/* The fault-free scenarios (the battery, formation's budget) wait longer
 * before they take a still peer for dead: nothing dies there, and a rank
 * of a loaded machine, or of the verbs lane's guest, can be unscheduled
 * for over PEER_TIMEOUT_S (seen: 3.0 s in the guest at a host load of
 * 33), which failed every later check of the battery. Times
 * MESHTRAIN_TEST_SLOW. */
#define CALM_TIMEOUT_S 10.0

static const struct mesh_transport_ops *ops;
static const char *secret = "test_collective shared secret";

/* ---- the mesh ------------------------------------------------------------ */

struct rank_ctx {
    int rank, n;
    struct mesh_peer peers[MAXP];
    struct mesh_world w;
    struct mesh_transport_opts o;
    mesh_transport_t *t;
    mesh_coll_t *c;
    FILE *out; /* results to the parent */
    double peer_timeout_s;
};

static const size_t measure_sizes[] = {96u << 10, 4000, 96u << 10, 48};

/*
 * The formation budget scenario (SC_BUDGET; the parent draws it from a
 * seed before it forks the ranks): the sizes the job asks to time (none
 * of measure_bytes), and formation's budget.
 */
#define BUDGET_SIZES 6
static struct {
    size_t sizes[BUDGET_SIZES];
    double budget_s;
} bcase;
static int budget_run; /* the ranks run SC_BUDGET */

static int mesh_up(struct rank_ctx *x, uint16_t base, size_t chunk, int measure)
{
    struct mesh_coll_opts co;
    int rc;

    for (int i = 0; i < x->n; i++) {
        snprintf(x->peers[i].host, sizeof(x->peers[i].host), "127.0.0.1");
        x->peers[i].port = (uint16_t)(base + i);
        x->peers[i].local_rank = i;
    }
    x->w.rank = x->rank;
    x->w.size = x->n;
    x->w.peers = x->peers;
    mesh_transport_opts_init(&x->o);
    x->o.peer_timeout_s = x->peer_timeout_s;
    x->o.join_timeout_s = 30;
    x->o.secret = (const uint8_t *)secret;
    x->o.secret_len = strlen(secret);
    snprintf(x->o.job_id, sizeof(x->o.job_id), "test-collective");
    snprintf(x->o.config, sizeof(x->o.config), "test=collective\n");
    rc = ops->listen(&x->w, &x->o, &x->t);
    if (rc == 0)
        rc = ops->connect(x->t);
    if (rc < 0)
        return rc;
    mesh_coll_opts_init(&co);
    co.chunk_bytes = chunk;
    co.measure = measure;
    co.measure_bytes = 64u << 10; /* the measured choice, cheaply */
    /* and the job's sizes, unsorted, one repeated, not powers of two */
    co.measure_sizes = measure_sizes;
    co.nmeasure_sizes = (int)MESH_ARRAY_SIZE(measure_sizes);
    if (budget_run) {
        co.measure_bytes = 0;
        co.measure_sizes = bcase.sizes;
        co.nmeasure_sizes = BUDGET_SIZES;
        co.measure_budget_s = bcase.budget_s;
    }
    return mesh_coll_create(ops, x->t, &x->w, &co, &x->c);
}

/* ---- data ---------------------------------------------------------------- */

static const int dtypes[] = {MESH_DT_F32, MESH_DT_F16, MESH_DT_BF16};

/* A small integer, so that sums of up to 8 ranks are exact in any type. */
static int val(int rank, size_t i, int salt)
{
    return (int)(((size_t)rank * 131 + i * 31 + (size_t)salt * 17) % 15) - 7;
}

static void fill(int dtype, void *p, size_t n, int rank, int salt, size_t first)
{
    for (size_t i = 0; i < n; i++)
        mesh_dtype_put_f32(dtype, p, i, (float)val(rank, first + i, salt));
}

/* Expected reduction of element i over n ranks. */
static void expect_red(int dtype, void *p, size_t i, int n, int redop,
                       size_t elem, int salt)
{
    int sum = 0;

    for (int r = 0; r < n; r++)
        sum += val(r, elem, salt);
    mesh_dtype_put_f32(dtype, p, i,
                       redop == MESH_REDOP_AVG ? (float)sum / (float)n
                                               : (float)sum);
}

static uint64_t fnv(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* One group of checks on this rank: a failure detail and an output hash. */
struct group {
    char name[128];
    int ok;
    uint64_t hash;
    int hashed; /* outputs must be the same on every rank */
    char detail[256];
};

static void group_begin(struct group *g, int hashed, const char *fmt, ...)
    MESH_PRINTF(3, 4);
static void group_begin(struct group *g, int hashed, const char *fmt, ...)
{
    va_list ap;

    memset(g, 0, sizeof(*g));
    va_start(ap, fmt);
    vsnprintf(g->name, sizeof(g->name), fmt, ap);
    va_end(ap);
    for (char *s = g->name; *s; s++) /* one word on the wire */
        if (*s == ' ')
            *s = '~';
    g->ok = 1;
    g->hash = 0xcbf29ce484222325ull;
    g->hashed = hashed;
}

static void group_fail(struct group *g, const char *fmt, ...) MESH_PRINTF(2, 3);
static void group_fail(struct group *g, const char *fmt, ...)
{
    va_list ap;

    if (!g->ok)
        return;
    g->ok = 0;
    va_start(ap, fmt);
    vsnprintf(g->detail, sizeof(g->detail), fmt, ap);
    va_end(ap);
    for (char *s = g->detail; *s; s++)
        if (*s == '\n')
            *s = ' ';
}

static void group_end(struct rank_ctx *x, struct group *g)
{
    fprintf(x->out, "%s %d %016" PRIx64 " %s\n", g->name, g->ok,
            g->hashed ? g->hash : 0, g->ok ? "-" : g->detail);
    fflush(x->out);
}

/* Compare got with want; on a difference, name the first element. */
static void check(struct group *g, const void *got, const void *want, size_t n,
                  int dtype, const char *what, size_t count)
{
    size_t es = mesh_dtype_size(dtype);

    if (!memcmp(got, want, n * es))
        return;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * es, (const char *)want + i * es,
                   es)) {
            group_fail(g, "%s count %zu: element %zu wrong", what, count, i);
            return;
        }
}

/* ---- the battery --------------------------------------------------------- */

/* A collective's return code: a failure is the group's (and false). */
static int coll_ok(struct group *g, int rc, size_t count)
{
    if (rc >= 0)
        return 1;
    group_fail(g, "count %zu: %s", count, mesh_err_msg(rc));
    return 0;
}

static void t_allreduce(struct rank_ctx *x, int algo, int dtype, int redop,
                        const size_t *counts, int ncounts)
{
    struct group g;
    int n = x->n;

    group_begin(&g, 1, "N=%d allreduce %s %s %s", n, mesh_algo_name(algo),
                mesh_dtype_name(dtype), redop ? "avg" : "sum");
    for (int ci = 0; ci < ncounts; ci++) {
        size_t cnt = counts[ci], es = mesh_dtype_size(dtype);
        void *in = NULL, *outb = NULL, *want = malloc(cnt * es + 1);
        int salt = 1 + ci;

        if (mesh_coll_buf_alloc(x->c, cnt * es, &in) < 0 ||
            mesh_coll_buf_alloc(x->c, cnt * es, &outb) < 0 || !want) {
            group_fail(&g, "allocation: %s", mesh_err_msg(-ENOMEM));
            break;
        }
        for (size_t i = 0; i < cnt; i++)
            expect_red(dtype, want, i, n, redop, i, salt);
        for (int inplace = 0; inplace < 2; inplace++) {
            void *dst = inplace ? in : outb;

            fill(dtype, in, cnt, x->rank, salt, 0);
            if (!coll_ok(
                    &g,
                    mesh_coll_allreduce(x->c, in, dst, cnt, dtype, redop, algo),
                    cnt))
                continue;
            check(&g, dst, want, cnt, dtype,
                  inplace ? "in place" : "out of place", cnt);
            g.hash = fnv(g.hash, dst, cnt * es);
        }
        mesh_coll_buf_free(x->c, outb);
        mesh_coll_buf_free(x->c, in);
        free(want);
    }
    group_end(x, &g);
}

static void t_reduce_scatter(struct rank_ctx *x, int dtype, int redop,
                             const size_t *counts, int ncounts)
{
    struct group g;
    int n = x->n;

    group_begin(&g, 0, "N=%d reduce_scatter ring %s %s", n,
                mesh_dtype_name(dtype), redop ? "avg" : "sum");
    for (int ci = 0; ci < ncounts; ci++) {
        size_t rc_ = counts[ci], es = mesh_dtype_size(dtype);
        char *in = malloc((size_t)n * rc_ * es + 1);
        char *outb = malloc(rc_ * es + 1), *want = malloc(rc_ * es + 1);

        for (size_t j = 0; j < rc_; j++)
            expect_red(dtype, want, j, n, redop, (size_t)x->rank * rc_ + j, 3);
        for (int inplace = 0; inplace < 2; inplace++) {
            char *dst = inplace ? in + (size_t)x->rank * rc_ * es : outb;

            fill(dtype, in, (size_t)n * rc_, x->rank, 3, 0);
            if (!coll_ok(
                    &g,
                    mesh_coll_reduce_scatter(x->c, in, dst, rc_, dtype, redop),
                    rc_))
                continue;
            check(&g, dst, want, rc_, dtype,
                  inplace ? "in place" : "out of place", rc_);
        }
        free(want);
        free(outb);
        free(in);
    }
    group_end(x, &g);
}

static void t_allgather(struct rank_ctx *x, int dtype, const size_t *counts,
                        int ncounts)
{
    struct group g;
    int n = x->n;

    group_begin(&g, 1, "N=%d allgather ring %s", n, mesh_dtype_name(dtype));
    for (int ci = 0; ci < ncounts; ci++) {
        size_t sc = counts[ci], es = mesh_dtype_size(dtype);
        char *in = malloc(sc * es + 1), *outb = malloc((size_t)n * sc * es + 1);
        char *want = malloc((size_t)n * sc * es + 1);

        for (int r = 0; r < n; r++)
            fill(dtype, want + (size_t)r * sc * es, sc, r, 4, 0);
        for (int inplace = 0; inplace < 2; inplace++) {
            char *src = inplace ? outb + (size_t)x->rank * sc * es : in;

            memset(outb, 0xee, (size_t)n * sc * es);
            fill(dtype, src, sc, x->rank, 4, 0);
            if (!coll_ok(&g, mesh_coll_allgather(x->c, src, outb, sc, dtype),
                         sc))
                continue;
            check(&g, outb, want, (size_t)n * sc, dtype,
                  inplace ? "in place" : "out of place", sc);
            g.hash = fnv(g.hash, outb, (size_t)n * sc * es);
        }
        free(want);
        free(outb);
        free(in);
    }
    group_end(x, &g);
}

static void t_broadcast(struct rank_ctx *x, int algo, int dtype,
                        const size_t *counts, int ncounts)
{
    struct group g;
    int n = x->n;

    group_begin(&g, 1, "N=%d broadcast %s %s", n, mesh_algo_name(algo),
                mesh_dtype_name(dtype));
    for (int ci = 0; ci < ncounts; ci++) {
        size_t cnt = counts[ci], es = mesh_dtype_size(dtype);
        int root = (int)(cnt % (size_t)n);
        char *in = malloc(cnt * es + 1), *outb = malloc(cnt * es + 1);
        char *want = malloc(cnt * es + 1);

        fill(dtype, want, cnt, root, 5, 0);
        for (int inplace = 0; inplace < 2; inplace++) {
            char *dst = inplace ? in : outb;

            memset(outb, 0xee, cnt * es);
            fill(dtype, in, cnt, x->rank, 5, 0);
            if (!coll_ok(
                    &g,
                    mesh_coll_broadcast(x->c, in, dst, cnt, dtype, root, algo),
                    cnt))
                continue;
            check(&g, dst, want, cnt, dtype,
                  inplace ? "in place" : "out of place", cnt);
            g.hash = fnv(g.hash, dst, cnt * es);
        }
        free(want);
        free(outb);
        free(in);
    }
    group_end(x, &g);
}

/*
 * Random floats: rounding happens, so only the agreement of ranks counts.
 * Each seed draws other values and another count (uneven, and below the
 * rank count for some).
 */
/*
 * Buffers in the host's shared memory (mesh_coll_buf_alloc) on some ranks
 * only, the others' from malloc: the input (which 0) or the output (1).
 * local reads the inputs in place where every rank's is there, writes the
 * outputs in place where those are too, and copies otherwise: the same
 * sums either way, in and out of place.
 */
static void t_mixed_bufs(struct rank_ctx *x, int algo, int which)
{
    struct group g;
    size_t cnt = 300007, es = sizeof(float);
    int own = x->rank % 3 == 1; /* malloc'ed here */
    void *b[2] = {NULL, NULL}, *want = malloc(cnt * es);

    group_begin(&g, 1,
                "N=%d allreduce %s, %s in shared memory on some ranks only",
                x->n, mesh_algo_name(algo), which ? "outputs" : "inputs");
    for (int k = 0; k < 2; k++)
        if (own && k == which)
            b[k] = malloc(cnt * es);
        else if (mesh_coll_buf_alloc(x->c, cnt * es, &b[k]) < 0)
            b[k] = NULL;
    if (!b[0] || !b[1] || !want) {
        group_fail(&g, "allocation: %s", mesh_err_msg(-ENOMEM));
    } else {
        for (size_t i = 0; i < cnt; i++)
            expect_red(MESH_DT_F32, want, i, x->n, MESH_REDOP_SUM, i, 7);
        for (int inplace = 0; inplace < 2; inplace++) {
            void *dst = inplace ? b[0] : b[1];

            fill(MESH_DT_F32, b[0], cnt, x->rank, 7, 0);
            if (coll_ok(&g,
                        mesh_coll_allreduce(x->c, b[0], dst, cnt, MESH_DT_F32,
                                            MESH_REDOP_SUM, algo),
                        cnt)) {
                check(&g, dst, want, cnt, MESH_DT_F32,
                      inplace ? "in place" : "out of place", cnt);
                g.hash = fnv(g.hash, dst, cnt * es);
            }
        }
    }
    for (int k = 0; k < 2; k++)
        if (own && k == which)
            free(b[k]);
        else
            mesh_coll_buf_free(x->c, b[k]);
    free(want);
    group_end(x, &g);
}

/*
 * Random floats (rounding happens) through every path of algo: malloc'ed
 * buffers (the copies through the windows), then the input, the output,
 * both, and one buffer in place in the host's shared memory (in place
 * where every rank's is there): the same bytes on every path.
 */
static void t_paths(struct rank_ctx *x, int algo, int dtype)
{
    size_t cnt = 300007, es = mesh_dtype_size(dtype), bytes = cnt * es;
    void *src = malloc(bytes), *ref = malloc(bytes), *b[2] = {NULL, NULL};
    uint64_t s = 0x51ed2700ull * (uint64_t)(x->rank + 1);
    struct group g;

    group_begin(&g, 1,
                "N=%d allreduce %s %s random: the same bytes on every "
                "path (shared memory or not)",
                x->n, mesh_algo_name(algo), mesh_dtype_name(dtype));
    if (!src || !ref) {
        group_fail(&g, "allocation: %s", mesh_err_msg(-ENOMEM));
        goto out;
    }
    for (size_t i = 0; i < cnt; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        mesh_dtype_put_f32(
            dtype, src, i,
            (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) *
                (float)(1 + i % 100));
    }
    /* path 0: malloc'ed; 1: input shared; 2: output shared; 3: both; 4:
     * one shared buffer, in place */
    for (int path = 0; path < 5 && g.ok; path++) {
        void *out;

        for (int k = 0; k < 2; k++) {
            int shared = path == 3 || path == 4 || path == k + 1;

            if (shared ? mesh_coll_buf_alloc(x->c, bytes, &b[k]) < 0
                       : !(b[k] = malloc(bytes)))
                b[k] = NULL;
            if (!b[k])
                group_fail(&g, "allocation: %s", mesh_err_msg(-ENOMEM));
        }
        if (b[0] && b[1]) {
            out = path == 4 ? b[0] : b[1];
            memcpy(b[0], src, bytes);
            if (coll_ok(&g,
                        mesh_coll_allreduce(x->c, b[0], out, cnt, dtype,
                                            MESH_REDOP_AVG, algo),
                        cnt)) {
                if (path == 0)
                    memcpy(ref, out, bytes);
                else if (memcmp(ref, out, bytes))
                    group_fail(&g, "path %d: other bytes than path 0", path);
                g.hash = fnv(g.hash, out, bytes);
            }
        }
        for (int k = 0; k < 2; k++) {
            int shared = path == 3 || path == 4 || path == k + 1;

            if (shared)
                mesh_coll_buf_free(x->c, b[k]);
            else
                free(b[k]);
            b[k] = NULL;
        }
    }
out:
    free(src);
    free(ref);
    group_end(x, &g);
}

static void t_random(struct rank_ctx *x, int algo, unsigned seed)
{
    static const size_t counts[] = {10007, 3, 1, 4099, 65, 7};
    struct group g;
    size_t cnt = counts[seed % MESH_ARRAY_SIZE(counts)];
    uint64_t s = 0x1234567ull * (uint64_t)(x->rank + 1) + seed * 0x9e3779b9ull;

    group_begin(&g, 1,
                "N=%d random floats %s seed %u (%zu): bitwise equal on all "
                "ranks",
                x->n, mesh_algo_name(algo), seed, cnt);
    for (size_t d = 0; d < MESH_ARRAY_SIZE(dtypes); d++) {
        size_t es = mesh_dtype_size(dtypes[d]);
        char *in = malloc(cnt * es), *outb = malloc(cnt * es);
        int rc;

        for (size_t i = 0; i < cnt; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            mesh_dtype_put_f32(
                dtypes[d], in, i,
                (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) *
                    (float)(1 + i % 100));
        }
        rc = mesh_coll_allreduce(x->c, in, outb, cnt, dtypes[d], MESH_REDOP_AVG,
                                 algo);
        if (rc < 0)
            group_fail(&g, "%s", mesh_err_msg(rc));
        else
            g.hash = fnv(g.hash, outb, cnt * es);
        free(outb);
        free(in);
    }
    group_end(x, &g);
}

/* Several collectives started before any wait, finished in order. */
static void t_back_to_back(struct rank_ctx *x)
{
    enum { K = 11 };
    static const int algos[] = {
        MESH_ALGO_RING, MESH_ALGO_TREE, MESH_ALGO_PS,   MESH_ALGO_DIRECT,
        MESH_ALGO_RD,   MESH_ALGO_RHD,  MESH_ALGO_HIER, MESH_ALGO_HTREE,
        MESH_ALGO_HRD,  MESH_ALGO_AUTO, MESH_ALGO_LOCAL};
    struct group g;
    mesh_coll_req_t *q[K];
    void *buf[K], *want[K];
    size_t cnt[K];
    double prev_end = 0;
    int dt[K], started = 0;

    group_begin(&g, 1, "N=%d %d collectives started back to back", x->n, K);
    for (int k = 0; k < K; k++) {
        size_t es;

        dt[k] = dtypes[k % 3];
        es = mesh_dtype_size(dt[k]);
        cnt[k] = (size_t)(k + 1) * 12345;
        buf[k] = malloc(cnt[k] * es);
        want[k] = malloc(cnt[k] * es);
        /* half the buffers registered once, half per collective */
        if (k % 2 && mesh_coll_buf_register(x->c, buf[k], cnt[k] * es) < 0)
            group_fail(&g, "register %d: %s", k, mesh_err_msg(-EINVAL));
        fill(dt[k], buf[k], cnt[k], x->rank, 10 + k, 0);
        for (size_t i = 0; i < cnt[k]; i++)
            expect_red(dt[k], want[k], i, x->n, MESH_REDOP_SUM, i, 10 + k);
    }
    for (int k = 0; k < K; k++) {
        int rc = mesh_coll_allreduce_start(
            x->c, buf[k], buf[k], cnt[k], dt[k], MESH_REDOP_SUM,
            algos[k % MESH_ARRAY_SIZE(algos)], &q[k]);

        if (rc < 0) {
            group_fail(&g, "start %d: %s", k, mesh_err_msg(rc));
            break;
        }
        started++;
    }
    for (int k = 0; k < started; k++) {
        double t0 = 0, t1 = 0;
        int rc = mesh_coll_wait_times(q[k], &t0, &t1);

        /* in order, one at a time */
        if (rc == 0 && (t1 < t0 || t0 < prev_end))
            group_fail(&g,
                       "collective %d ran %.6f..%.6f, before the "
                       "previous one ended (%.6f)",
                       k, t0, t1, prev_end);
        prev_end = t1;
        if (rc < 0)
            group_fail(&g, "collective %d: %s", k, mesh_err_msg(rc));
        else
            check(&g, buf[k], want[k], cnt[k], dt[k], "back to back", cnt[k]);
        g.hash = fnv(g.hash, buf[k], cnt[k] * mesh_dtype_size(dt[k]));
    }
    for (int k = 0; k < K; k++) {
        if (k % 2)
            mesh_coll_buf_unregister(x->c, buf[k]);
        free(want[k]);
        free(buf[k]);
    }
    group_end(x, &g);
}

static void t_barrier(struct rank_ctx *x)
{
    struct group g;

    group_begin(&g, 0, "N=%d barrier x3", x->n);
    for (int i = 0; i < 3; i++) {
        int rc = mesh_coll_barrier(x->c);

        if (rc < 0)
            group_fail(&g, "%s", mesh_err_msg(rc));
    }
    group_end(x, &g);
}

/*
 * AUTO's measured choice: the sizes timed are 32 bytes and the asked ones
 * (sorted, once each, the 48 bytes below 64 dropped); every rank holds the
 * same times and takes the same choice at every size (the hash); at each
 * timed size AUTO takes the fastest algorithm timed there.
 */
static void t_auto_choice(struct rank_ctx *x)
{
    static const size_t want[] = {32, 4000, 64u << 10, 96u << 10};
    struct mesh_coll_model m;
    int ids[MESH_ALGO_LAST + 1], nauto = mesh_coll_auto_algos(x->c, ids);
    struct group g;

    group_begin(&g, 1, "N=%d auto's choice from the timed sizes", x->n);
    mesh_coll_model_get(x->c, &m);
    /*
     * A slow machine (the verbs lane's emulated guest under load) may use
     * up formation's time budget before the larger sizes: then the sizes
     * timed must be a prefix of want, at least two, and the model must say
     * the budget cut them.
     */
    if (!m.measured || (m.npoints != (int)MESH_ARRAY_SIZE(want) &&
                        (!m.budget_cut || m.npoints < 2 ||
                         m.npoints > (int)MESH_ARRAY_SIZE(want))))
        group_fail(&g, "%d sizes timed (measured %d, budget cut %d), not %zu",
                   m.npoints, m.measured, m.budget_cut, MESH_ARRAY_SIZE(want));

    for (int k = 0; g.ok && k < m.npoints; k++) {
        int best = -1,
            got = mesh_coll_algo_for(x->c, MESH_ALGO_AUTO, m.point_bytes[k]);

        if (m.point_bytes[k] != want[k])
            group_fail(&g, "size %d timed is %zu, not %zu", k, m.point_bytes[k],
                       want[k]);
        for (int a = 0; a < nauto; a++)
            if (m.point_s[k][ids[a]] > 0 &&
                (best < 0 || m.point_s[k][ids[a]] < m.point_s[k][best]))
                best = ids[a];
        if (best < 0 ||
            (got != best && m.point_s[k][got] != m.point_s[k][best]))
            group_fail(&g,
                       "at %zu bytes auto takes %s, the fastest timed "
                       "was %s",
                       m.point_bytes[k], mesh_algo_name(got),
                       best < 0 ? "none" : mesh_algo_name(best));
        g.hash = fnv(g.hash, m.point_s[k], sizeof(m.point_s[k]));
    }
    for (size_t b = 4; b <= ((size_t)1 << 30); b *= 3) {
        int a = mesh_coll_algo_for(x->c, MESH_ALGO_AUTO, b);

        if (a <= MESH_ALGO_AUTO || a == MESH_ALGO_PS)
            group_fail(&g, "auto at %zu bytes: %s", b, mesh_algo_name(a));
        g.hash = fnv(g.hash, &a, sizeof(a));
    }
    group_end(x, &g);
}

/* One checked AUTO all-reduce of cnt floats, salt picking the data;
 * returns whether the group is still good. */
static int auto_call(struct rank_ctx *x, struct group *g, float *in, float *out,
                     const float *want, size_t cnt, int salt)
{
    fill(MESH_DT_F32, in, cnt, x->rank, salt, 0);
    if (!coll_ok(g,
                 mesh_coll_allreduce(x->c, in, out, cnt, MESH_DT_F32,
                                     MESH_REDOP_SUM, MESH_ALGO_AUTO),
                 cnt))
        return 0;
    check(g, out, want, cnt, MESH_DT_F32, "out of place", cnt);
    return g->ok;
}

/* What AUTO answers at bytes is what it kept there. */
static void auto_answers_kept(struct rank_ctx *x, struct group *g, int kept,
                              size_t bytes)
{
    int now = mesh_coll_algo_for(x->c, MESH_ALGO_AUTO, bytes);

    if (g->ok && now != kept)
        group_fail(g, "auto kept %s but answers %s", mesh_algo_name(kept),
                   mesh_algo_name(now));
}

/* Formation's best time at bytes among AUTO's algorithms (0: not timed
 * there), and its point's index in *k. */
static double formation_best(const struct mesh_coll_model *m, size_t bytes,
                             const int *ids, int nauto, int *k)
{
    double best = 0;

    *k = -1;
    for (int p = 0; p < m->npoints; p++) {
        if (m->point_bytes[p] != bytes)
            continue;
        *k = p;
        best = 0;
        for (int a = 0; a < nauto; a++)
            if (m->point_s[p][ids[a]] > 0 &&
                (best <= 0 || m->point_s[p][ids[a]] < best))
                best = m->point_s[p][ids[a]];
    }
    return best;
}

/*
 * Formation's fastest at the timed size next to bytes (side 0: below, 1:
 * above) that it also timed at bytes (point k), or -1: AUTO's refinement
 * races it too where a place is left.
 */
static int neighbour_winner(const struct mesh_coll_model *m, size_t bytes,
                            int side, const int *ids, int nauto, int k)
{
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
    return w >= 0 && k >= 0 && m->point_s[k][w] > 0 ? w : -1;
}

/*
 * AUTO's refinement (mesh_coll_auto_refined): 640 all-reduces of 4000
 * bytes (a size formation timed), each checked; formation's contenders
 * take turns and the ranks agree on one to keep within 620 calls (4
 * epochs of at most 31 rounds of at most 5): every rank keeps one, a
 * candidate that formation timed within 50 % of its best (100 % where
 * that took under 2 ms), or its fastest at a timed size next to this
 * one, the same and at the same call (the hash), and AUTO answers it
 * from then on.
 */
static void t_auto_refine(struct rank_ctx *x)
{
    enum { CALLS = 640 };
    const size_t cnt = 1000, bytes = cnt * sizeof(float);
    int ids[MESH_ALGO_LAST + 1], nauto = mesh_coll_auto_algos(x->c, ids);
    int kept = 0, kept_at = -1, cand = 0, k;
    float *in = NULL, *out = NULL, *want = malloc(cnt * sizeof(float));
    double best, near;
    struct mesh_coll_model m;
    struct group g;

    group_begin(&g, 1, "N=%d auto refines its choice at %zu bytes, agreed",
                x->n, bytes);
    mesh_coll_model_get(x->c, &m);
    if (!m.measured)
        group_fail(&g, "formation timed nothing");
    if (!want || mesh_coll_buf_alloc(x->c, bytes, (void **)&in) < 0 ||
        mesh_coll_buf_alloc(x->c, bytes, (void **)&out) < 0)
        group_fail(&g, "allocation: %s", mesh_err_msg(-ENOMEM));
    for (size_t i = 0; g.ok && i < cnt; i++)
        expect_red(MESH_DT_F32, want, i, x->n, MESH_REDOP_SUM, i, 5);
    for (int call = 0; g.ok && call < CALLS; call++) {
        if (!auto_call(x, &g, in, out, want, cnt, 5))
            break;
        if (kept_at < 0 && mesh_coll_auto_refined(x->c, bytes) > 0)
            kept_at = call;
    }
    kept = mesh_coll_auto_refined(x->c, bytes);
    for (int a = 0; a < nauto; a++)
        cand |= ids[a] == kept;
    if (g.ok && (kept <= 0 || !cand))
        group_fail(&g, "after %d calls auto kept %s", CALLS,
                   kept > 0 ? mesh_algo_name(kept) : "nothing");
    else
        auto_answers_kept(x, &g, kept, bytes);
    /* one of formation's contenders: timed within 50 % of its best (100 %
     * below 2 ms), or its fastest at a timed size next to this one */
    best = formation_best(&m, bytes, ids, nauto, &k);
    near = best <= 2e-3 ? 2.0 : 1.5;
    if (g.ok && k >= 0) {
        if (m.point_s[k][kept] > near * best * (1 + 1e-6) &&
            kept != neighbour_winner(&m, bytes, 0, ids, nauto, k) &&
            kept != neighbour_winner(&m, bytes, 1, ids, nauto, k))
            group_fail(&g,
                       "auto kept %s, timed %.1f us at formation, "
                       "beyond %.1f times the best's %.1f us",
                       mesh_algo_name(kept), m.point_s[k][kept] * 1e6, near,
                       best * 1e6);
    }
    g.hash = fnv(g.hash, &kept, sizeof(kept));
    g.hash = fnv(g.hash, &kept_at, sizeof(kept_at));
    mesh_coll_buf_free(x->c, out);
    mesh_coll_buf_free(x->c, in);
    free(want);
    group_end(x, &g);
}

/*
 * The re-check of AUTO's kept winner (mesh_coll_auto_rechecks), right
 * after t_auto_refine kept one at 4000 bytes: where formation timed 2 or
 * more contenders there (within 50 % of its best, 100 % below 2 ms; or
 * its fastest at a timed size next to it), the first re-check ends
 * within 2400 more calls (it starts at most 8 x 2 epochs x 31 rounds x 4
 * others = 1984 calls after the keep and runs at most 62 rounds of 5: 2
 * epochs, or up to 4 where 2 hold fewer than the 3 % rule's 32 rounds: 60
 * at most then), every rank at the same call and keeping the same contender
 * (the hash); where only one was timed there, nothing is re-checked. Every call
 * is checked.
 */
static void t_auto_recheck(struct rank_ctx *x)
{
    enum { CALLS = 2400 };
    const size_t cnt = 1000, bytes = cnt * sizeof(float);
    int ids[MESH_ALGO_LAST + 1], nauto = mesh_coll_auto_algos(x->c, ids);
    int ncand = 0, at = -1, kept, cand = 0, k;
    float *in = NULL, *out = NULL, *want = malloc(cnt * sizeof(float));
    double best, near;
    struct mesh_coll_model m;
    struct group g;

    group_begin(&g, 1, "N=%d auto re-checks its kept winner at %zu bytes", x->n,
                bytes);
    mesh_coll_model_get(x->c, &m);
    best = formation_best(&m, bytes, ids, nauto, &k);
    near = best <= 2e-3 ? 2.0 : 1.5;
    if (k >= 0) {
        int nw[2];

        for (int a = 0; a < nauto && best > 0; a++)
            ncand +=
                m.point_s[k][ids[a]] > 0 && m.point_s[k][ids[a]] <= near * best;
        /* the fastest at the timed sizes either side race too */
        for (int side = 0; side < 2 && best > 0; side++) {
            nw[side] = neighbour_winner(&m, bytes, side, ids, nauto, k);
            ncand += nw[side] >= 0 && m.point_s[k][nw[side]] > near * best &&
                     (side == 0 || nw[1] != nw[0]);
        }
    }
    if (!want || mesh_coll_buf_alloc(x->c, bytes, (void **)&in) < 0 ||
        mesh_coll_buf_alloc(x->c, bytes, (void **)&out) < 0)
        group_fail(&g, "allocation: %s", mesh_err_msg(-ENOMEM));
    for (size_t i = 0; g.ok && i < cnt; i++)
        expect_red(MESH_DT_F32, want, i, x->n, MESH_REDOP_SUM, i, 7);
    for (int call = 0; g.ok && ncand > 1 && call < CALLS; call++) {
        if (!auto_call(x, &g, in, out, want, cnt, 7))
            break;
        if (mesh_coll_auto_rechecks(x->c, bytes) > 0) {
            at = call;
            break;
        }
    }
    kept = mesh_coll_auto_refined(x->c, bytes);
    for (int a = 0; a < nauto; a++)
        cand |= ids[a] == kept;
    if (g.ok && ncand > 1 && at < 0)
        group_fail(&g, "%d contenders, and no re-check ended in %d calls",
                   ncand, CALLS);
    else if (g.ok && ncand <= 1 && mesh_coll_auto_rechecks(x->c, bytes))
        group_fail(&g, "one contender, and yet a re-check");
    else if (g.ok && (kept <= 0 || !cand))
        group_fail(&g, "after the re-check auto kept %s",
                   kept > 0 ? mesh_algo_name(kept) : "nothing");
    else
        auto_answers_kept(x, &g, kept, bytes);
    g.hash = fnv(g.hash, &kept, sizeof(kept));
    g.hash = fnv(g.hash, &at, sizeof(at));
    mesh_coll_buf_free(x->c, out);
    mesh_coll_buf_free(x->c, in);
    free(want);
    group_end(x, &g);
}

static void battery(struct rank_ctx *x)
{
    static const int algos[] = {
        MESH_ALGO_RING, MESH_ALGO_TREE, MESH_ALGO_PS,   MESH_ALGO_DIRECT,
        MESH_ALGO_RD,   MESH_ALGO_RHD,  MESH_ALGO_HIER, MESH_ALGO_HTREE,
        MESH_ALGO_HRD,  MESH_ALGO_AUTO, MESH_ALGO_LOCAL};
    int n = x->n;
    size_t counts[] = {0, 1, (size_t)n - 1, 7, 1009, 65537};
    size_t big[] = {(size_t)3 << 20 >> (n > 4)}; /* 12 or 6 MiB of f32 */
    size_t small[] = {0, 1, (size_t)n - 1, 7, 1009};

    t_barrier(x);
    t_auto_choice(x);
    t_auto_refine(x);
    t_auto_recheck(x);
    for (size_t a = 0; a < MESH_ARRAY_SIZE(algos); a++)
        for (size_t d = 0; d < MESH_ARRAY_SIZE(dtypes); d++)
            for (int redop = 0; redop < 2; redop++)
                t_allreduce(x, algos[a], dtypes[d], redop, counts,
                            (int)MESH_ARRAY_SIZE(counts));
    /* a few MiB, where chunks pipeline */
    t_allreduce(x, MESH_ALGO_RING, MESH_DT_F32, MESH_REDOP_AVG, big, 1);
    t_allreduce(x, MESH_ALGO_TREE, MESH_DT_BF16, MESH_REDOP_SUM, big, 1);
    t_allreduce(x, MESH_ALGO_RD, MESH_DT_F16, MESH_REDOP_AVG, big, 1);
    t_allreduce(x, MESH_ALGO_RHD, MESH_DT_BF16, MESH_REDOP_AVG, big, 1);
    t_allreduce(x, MESH_ALGO_HIER, MESH_DT_F32, MESH_REDOP_AVG, big, 1);
    t_allreduce(x, MESH_ALGO_HTREE, MESH_DT_F16, MESH_REDOP_SUM, big, 1);
    t_allreduce(x, MESH_ALGO_HRD, MESH_DT_F32, MESH_REDOP_AVG, big, 1);
    t_allreduce(x, MESH_ALGO_LOCAL, MESH_DT_F32, MESH_REDOP_AVG, big, 1);
    t_allreduce(x, MESH_ALGO_LOCAL, MESH_DT_BF16, MESH_REDOP_SUM, big, 1);
    for (int which = 0; which < 2; which++) {
        t_mixed_bufs(x, MESH_ALGO_LOCAL, which);
        t_mixed_bufs(x, MESH_ALGO_AUTO, which);
        t_mixed_bufs(x, MESH_ALGO_HIER, which);
        t_mixed_bufs(x, MESH_ALGO_HTREE, which);
    }
    t_paths(x, MESH_ALGO_HIER, MESH_DT_F32);
    t_paths(x, MESH_ALGO_HRD, MESH_DT_F16);
    t_paths(x, MESH_ALGO_LOCAL, MESH_DT_BF16);
    for (size_t d = 0; d < MESH_ARRAY_SIZE(dtypes); d++) {
        for (int redop = 0; redop < 2; redop++)
            t_reduce_scatter(x, dtypes[d], redop, small,
                             (int)MESH_ARRAY_SIZE(small));
        t_allgather(x, dtypes[d], small, (int)MESH_ARRAY_SIZE(small));
        t_broadcast(x, MESH_ALGO_RING, dtypes[d], counts,
                    (int)MESH_ARRAY_SIZE(counts));
        t_broadcast(x, MESH_ALGO_TREE, dtypes[d], counts,
                    (int)MESH_ARRAY_SIZE(counts));
    }
    t_reduce_scatter(x, MESH_DT_F32, MESH_REDOP_SUM, big, 1);
    for (size_t a = 0; a < MESH_ARRAY_SIZE(algos); a++)
        for (unsigned seed = 0; seed < 3; seed++)
            t_random(x, algos[a], seed + 3 * (unsigned)a);
    t_back_to_back(x);
    t_barrier(x);
}

/* ---- formation's budget -------------------------------------------------- */

/* The line of the last two sizes timed at bytes for id (-1: none). */
static double last_line(const struct mesh_coll_model *m, int id, size_t bytes)
{
    int k = m->npoints - 1;
    double t0 = m->point_s[k - 1][id], t1 = m->point_s[k][id];
    double x0 = (double)m->point_bytes[k - 1], x1 = (double)m->point_bytes[k];

    if (t0 <= 0 || t1 <= 0)
        return -1;
    return t1 + MESH_MAX(t1 - t0, 0) / (x1 - x0) * ((double)bytes - x1);
}

/*
 * Formation under a small budget (bcase): the sizes timed are 32 bytes
 * and a prefix of the asked ones (sorted), the rest cut by the budget
 * (and said so), the same on every rank (the hash: the sizes, the times,
 * the choices); AUTO takes the fastest at each size timed and, at the
 * sizes cut, the fastest on the line of the last two timed (the model's
 * fallback); an algorithm not timed at a size is not timed at larger
 * ones, nor one that ran over twice the fastest at the two sizes before
 * where that took 2 ms or more; and the time formation took, which is
 * not asserted closely (a loaded machine may stop any rank for seconds),
 * stays within the budget plus SLACK_S.
 */
static void s_budget(struct rank_ctx *x)
{
    struct mesh_coll_model m;
    size_t want[BUDGET_SIZES + 1];
    int ids[MESH_ALGO_LAST + 1], nauto = mesh_coll_auto_algos(x->c, ids);
    int nwant = 1;
    struct group g;
    const char *slow = getenv("MESHTRAIN_TEST_SLOW");
    double f = slow && atof(slow) > 1.0 ? atof(slow) : 1.0;

    group_begin(&g, 1, "N=%d formation within a budget of %.2f s", x->n,
                bcase.budget_s);
    mesh_coll_model_get(x->c, &m);
    want[0] = 32;
    for (int i = 0; i < BUDGET_SIZES; i++) /* sorted and distinct */
        want[nwant++] = bcase.sizes[i];
    if (!m.measured || m.npoints < 1 || m.npoints > nwant)
        group_fail(&g, "%d sizes timed (measured %d)", m.npoints, m.measured);
    if (m.budget_cut != (m.npoints < nwant))
        group_fail(&g, "%d of %d sizes timed, but budget cut %d", m.npoints,
                   nwant, m.budget_cut);
    if (m.budget_s != bcase.budget_s)
        group_fail(&g, "budget %.3f s, not %.3f", m.budget_s, bcase.budget_s);
    if (!(m.formation_s > 0 && m.formation_s <= bcase.budget_s + SLACK_S * f))
        group_fail(&g, "formation took %.3f s, budget %.3f s", m.formation_s,
                   bcase.budget_s);
    g.hash = fnv(g.hash, &m.npoints, sizeof(m.npoints));
    g.hash = fnv(g.hash, &m.budget_cut, sizeof(m.budget_cut));
    for (int k = 0; g.ok && k < m.npoints; k++) {
        int got = mesh_coll_algo_for(x->c, MESH_ALGO_AUTO, m.point_bytes[k]);
        double b[2] = {0, 0};

        if (m.point_bytes[k] != want[k])
            group_fail(&g, "size %d timed is %zu, not %zu", k, m.point_bytes[k],
                       want[k]);
        for (int j = 0; j < 2 && k >= 2; j++)
            b[j] = formation_best(&m, m.point_bytes[k - 1 - j], ids, nauto,
                                  &(int){0});
        for (int a = 0; a < nauto; a++) {
            double now = m.point_s[k][ids[a]];
            const double *p1 = k >= 1 ? m.point_s[k - 1] : NULL;
            const double *p2 = k >= 2 ? m.point_s[k - 2] : NULL;
            int slow_ = p2 && b[0] >= 2e-3 && b[1] >= 2e-3 &&
                        p1[ids[a]] > 2 * b[0] && p2[ids[a]] > 2 * b[1];

            if (now > 0 && p1 && (p1[ids[a]] <= 0 || slow_))
                group_fail(&g, "%s timed at %zu bytes after %s",
                           mesh_algo_name(ids[a]), m.point_bytes[k],
                           slow_ ? "twice the fastest at the two sizes before"
                                 : "it was not timed");
        }
        if (m.point_s[k][got] <= 0 ||
            m.point_s[k][got] !=
                formation_best(&m, m.point_bytes[k], ids, nauto, &(int){0}))
            group_fail(&g, "at %zu bytes auto takes %s, not the fastest timed",
                       m.point_bytes[k], mesh_algo_name(got));
        g.hash = fnv(g.hash, &m.point_bytes[k], sizeof(m.point_bytes[k]));
        g.hash = fnv(g.hash, m.point_s[k], sizeof(m.point_s[k]));
        g.hash = fnv(g.hash, &got, sizeof(got));
    }
    for (int k = m.npoints; g.ok && k < nwant; k++) {
        int got = mesh_coll_algo_for(x->c, MESH_ALGO_AUTO, want[k]), best = -1;
        double cost = -1, best_cost = 0;

        for (int a = 0; m.npoints >= 2 && a < nauto; a++) {
            double t = last_line(&m, ids[a], want[k]);

            if (t >= 0 && (best < 0 || t < best_cost)) {
                best = ids[a];
                best_cost = t;
            }
            if (ids[a] == got)
                cost = t;
        }
        if (got <= MESH_ALGO_AUTO || got == MESH_ALGO_PS ||
            (best >= 0 && cost != best_cost))
            group_fail(&g,
                       "at %zu bytes (cut) auto takes %s, the last two's "
                       "line %s",
                       want[k], mesh_algo_name(got),
                       best < 0 ? "none" : mesh_algo_name(best));
        g.hash = fnv(g.hash, &got, sizeof(got));
    }
    if (x->rank == 0)
        diag("N=%d rank 0: formation timed %d of %d sizes in %.3f s (budget "
             "%.3f s)",
             x->n, m.npoints, nwant, m.formation_s, bcase.budget_s);
    group_end(x, &g);
}

/* ---- failure scenarios --------------------------------------------------- */

/* The all-reduce of the failure scenarios (the parent sets it before it
 * forks the ranks). */
static int death_algo = MESH_ALGO_RING;

/* Rank 1 asks for one element fewer: everyone must get an error. */
static void s_size_mismatch(struct rank_ctx *x)
{
    struct group g;
    size_t cnt = x->rank == 1 ? 1000 : 1001;
    float *b = calloc(1001, sizeof(float));
    int rc = mesh_coll_barrier(x->c); /* every rank has joined */

    if (rc == 0)
        rc = mesh_coll_allreduce(x->c, b, b, cnt, MESH_DT_F32, MESH_REDOP_SUM,
                                 death_algo);
    group_begin(&g, 0, "N=%d sizes disagree: every rank gets an error", x->n);
    if (rc == 0)
        group_fail(&g, "the all-reduce succeeded");
    else
        snprintf(g.detail, sizeof(g.detail), "%s", mesh_err_msg(rc));
    fprintf(x->out, "%s %d 0 %s\n", g.name, g.ok, g.detail);
    fflush(x->out);
    free(b);
}

/* Rank n-2 dies (SIGKILL) or goes silent (SIGSTOP) while a large
 * all-reduce runs. */
static void s_kill(struct rank_ctx *x, int sig)
{
    size_t cnt = (size_t)4 << 20;
    float *b = calloc(cnt, sizeof(float));
    mesh_coll_req_t *q;
    double t0;
    int victim = x->n - 2, rc;
    char name[300];

    rc = mesh_coll_barrier(x->c);
    if (rc == 0)
        rc = mesh_coll_allreduce_start(x->c, b, b, cnt, MESH_DT_F32,
                                       MESH_REDOP_SUM, death_algo, &q);
    if (rc == 0 && x->rank == victim) {
        usleep(20000);
        kill(getpid(), sig);
    }
    t0 = mesh_now_s();
    if (rc == 0) {
        rc = mesh_coll_wait(q);
        /* The first collective may finish before the death: go on. */
        for (int i = 0; rc == 0 && i < 50; i++)
            rc = mesh_coll_allreduce(x->c, b, b, cnt, MESH_DT_F32,
                                     MESH_REDOP_SUM, death_algo);
    }
    mesh_peer_name(&x->w, victim, name, sizeof(name));
    fprintf(x->out, "kill %d %.3f %d %s\n", rc < 0, mesh_now_s() - t0,
            rc < 0 && (strstr(mesh_err_msg(rc), name) != NULL),
            rc < 0 ? mesh_err_msg(rc) : "no error");
    fflush(x->out);
    free(b);
}

/* ---- the parent ---------------------------------------------------------- */

enum scenario { SC_BATTERY, SC_MISMATCH, SC_KILL, SC_STOP, SC_BUDGET };

/* The hosts the ranks of a battery pretend to be on (1: one machine). */
static int test_hosts = 1;

struct result {
    char *text; /* everything the rank wrote */
    int status;
};

static void child(int rank, int n, uint16_t base, int sc, int fd)
{
    struct rank_ctx x = {.rank = rank, .n = n};
    int rc;

    {
        /* MESHTRAIN_TEST_SLOW=F: an emulated machine (the verbs lane). */
        const char *slow = getenv("MESHTRAIN_TEST_SLOW");
        double f = slow && atof(slow) > 1.0 ? atof(slow) : 1.0;

        alarm((unsigned)((sc == SC_BATTERY ? 150 : 60) * f));
        x.peer_timeout_s = sc == SC_BATTERY || sc == SC_BUDGET
                               ? CALM_TIMEOUT_S * f
                               : PEER_TIMEOUT_S;
    }
    {
        /* test_hosts hosts of n / test_hosts ranks: a test double of
         * several machines for the shm transport (shm/shm.h) */
        char host[32];

        snprintf(host, sizeof(host), "host%d", rank / (n / test_hosts));
        if (test_hosts > 1)
            setenv("MESHTRAIN_SHM_TEST_HOST", host, 1);
    }
    mesh_log_set_rank(rank);
    mesh_log_set_level(MESH_LOG_WARN);
    x.out = fdopen(fd, "w");
    if (!x.out)
        _exit(2);
    /* odd N: small chunks, so that even small counts run many chunks */
    rc = mesh_up(&x, base, n % 2 ? 4096 : 0,
                 sc == SC_BATTERY || sc == SC_BUDGET);
    if (rc < 0) {
        fprintf(x.out, "setup 0 0 %s\n", mesh_err_msg(rc));
        fclose(x.out);
        _exit(1);
    }
    if (sc == SC_BATTERY)
        battery(&x);
    else if (sc == SC_BUDGET)
        s_budget(&x);
    else if (sc == SC_MISMATCH)
        s_size_mismatch(&x);
    else
        s_kill(&x, sc == SC_KILL ? SIGKILL : SIGSTOP);
    fclose(x.out);
    mesh_coll_destroy(x.c);
    ops->close(x.t);
    _exit(0);
}

/* Fork n ranks; collect what each wrote. */
static int run(int n, int sc, struct result *res)
{
    uint16_t base = test_ports_pick(n);
    pid_t pid[MAXP];
    int fds[MAXP];

    if (!base)
        return -1;
    fflush(stdout);
    for (int r = 0; r < n; r++) {
        int p[2];

        if (pipe(p))
            return -1;
        pid[r] = fork();
        if (pid[r] < 0)
            return -1;
        if (pid[r] == 0) {
            for (int k = 0; k < r; k++)
                close(fds[k]);
            close(p[0]);
            child(r, n, base, sc, p[1]);
        }
        close(p[1]);
        fds[r] = p[0];
        res[r].text = calloc(1, 1);
    }
    /* read every pipe to its end, all at once (children block otherwise);
     * a stopped rank is killed once every other rank has finished */
    for (int open_ = n; open_ > 0;) {
        struct pollfd pf[MAXP];

        for (int r = 0; r < n; r++) {
            pf[r].fd = fds[r];
            pf[r].events = POLLIN;
        }
        if (poll(pf, (nfds_t)n, -1) < 0 && errno != EINTR)
            break;
        for (int r = 0; r < n; r++) {
            char buf[4096];
            ssize_t got;
            size_t have;

            if (fds[r] < 0 || !(pf[r].revents & (POLLIN | POLLHUP)))
                continue;
            got = read(fds[r], buf, sizeof(buf));
            if (got <= 0) {
                close(fds[r]);
                fds[r] = -1;
                pf[r].fd = -1;
                open_--;
                continue;
            }
            have = strlen(res[r].text);
            res[r].text = realloc(res[r].text, have + (size_t)got + 1);
            memcpy(res[r].text + have, buf, (size_t)got);
            res[r].text[have + (size_t)got] = 0;
        }
        if (sc == SC_STOP && open_ == 1 && fds[n - 2] >= 0)
            kill(pid[n - 2], SIGKILL);
    }
    for (int r = 0; r < n; r++) {
        int st = 0;

        waitpid(pid[r], &st, 0);
        res[r].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return 0;
}

/*
 * run(), again with fresh ports when a rank could not bind its port at the
 * start: the ports were free when picked, but a process outside our tests
 * may take one before every rank has bound its own. Only that failure, and
 * only at the start ("setup" is a rank's first line), is tried again.
 */
static int run_ports(int n, int sc, struct result *res)
{
    for (int attempt = 0;; attempt++) {
        int clash = 0, rc = run(n, sc, res);

        for (int r = 0; rc == 0 && r < n; r++)
            if (res[r].text && !strncmp(res[r].text, "setup ", 6) &&
                test_ports_clash(res[r].text))
                clash = 1;
        if (!clash || attempt == 4)
            return rc;
        diag("N=%d: a port was taken by another process; again on fresh "
             "ports",
             n);
        for (int r = 0; r < n; r++) {
            free(res[r].text);
            res[r].text = NULL;
        }
        memset(res, 0, sizeof(*res) * (size_t)n);
    }
}

/* Line k of text (0-based), copied into out. */
static int nth_line(const char *text, int k, char *out, size_t len)
{
    const char *s = text;

    for (int i = 0; i < k && s; i++) {
        s = strchr(s, '\n');
        if (s)
            s++;
    }
    if (!s || !*s)
        return -1;
    snprintf(out, len, "%.*s", (int)(strcspn(s, "\n")), s);
    return 0;
}

/* label: what the battery ran under, prefixed to each test ("": the
 * defaults). */
static void report_battery(int n, struct result *res, const char *label)
{
    char line[LINE];
    int nlines = 0;

    for (int k = 0; nth_line(res[0].text, k, line, sizeof(line)) == 0; k++) {
        char name[LINE], name_r[LINE], detail[LINE] = "", hash0[32];
        int okall = 1, hashes_equal = 1;

        if (sscanf(line, "%1023s %*d %31s", name, hash0) != 2)
            continue;
        nlines++;
        for (int r = 0; r < n; r++) {
            char lr[LINE], h[32];
            int okr = 0, off = 0;

            if (nth_line(res[r].text, k, lr, sizeof(lr)) < 0 ||
                sscanf(lr, "%1023s %d %31s %n", name_r, &okr, h, &off) < 3 ||
                strcmp(name, name_r)) {
                okall = 0;
                snprintf(detail, sizeof(detail),
                         "rank %d: no result "
                         "(exit %d)",
                         r, res[r].status);
                continue;
            }
            if (!okr && okall) {
                okall = 0;
                snprintf(detail, sizeof(detail), "rank %d: %s", r, lr + off);
            }
            if (strcmp(h, hash0))
                hashes_equal = 0;
        }
        for (char *s = name; *s; s++)
            if (*s == '~')
                *s = ' ';
        ok(okall && hashes_equal, "%s%s%s", label, name,
           hashes_equal ? "" : " (outputs differ between ranks)");
        if (!okall)
            diag("%s", detail);
    }
    ok(nlines > 0 && strstr(res[0].text, "back~to~back") != NULL,
       "%sN=%d battery ran to the end (rank 0 exit %d)", label, n,
       res[0].status);
    if (nlines == 0 || !strstr(res[0].text, "back~to~back"))
        for (int r = 0; r < n; r++)
            diag("rank %d (exit %d): %s", r, res[r].status, res[r].text);
}

/* Run the battery on n ranks and report it. */
static void battery_of(int n, const char *label)
{
    struct result res[MAXP];

    memset(res, 0, sizeof(res));
    if (run_ports(n, SC_BATTERY, res) < 0) {
        ok(0, "%sN=%d: could not start the ranks", label, n);
        return;
    }
    report_battery(n, res, label);
    for (int r = 0; r < n; r++)
        free(res[r].text);
}

/*
 * Formation on n ranks under a budget drawn from seed (bcase): 6 sizes
 * from 1 KiB to 4 MiB, each 2 to 4 times the one before, and 0.1 to 0.6
 * s; run and
 * report (s_budget).
 */
static void check_budget(int n, unsigned seed, const char *label)
{
    struct result res[MAXP];
    uint64_t s = 0x9e3779b97f4a7c15ull * (seed + 1);
    char line[LINE], name[LINE], h0[32] = "";
    int all = 1, same = 1;

    for (int i = 0; i < BUDGET_SIZES; i++) {
        size_t lo = i ? bcase.sizes[i - 1] : 512;

        s = s * 6364136223846793005ull + 1442695040888963407ull;
        /* within [2 lo, 4 lo), a multiple of 4 */
        bcase.sizes[i] = (2 * lo + (size_t)(s >> 33) % (2 * lo)) & ~(size_t)3;
    }
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    bcase.budget_s = 0.1 + 0.1 * (double)((s >> 33) % 6);
    diag("%sN=%d seed %u: sizes %zu..%zu, budget %.1f s", label, n, seed,
         bcase.sizes[0], bcase.sizes[BUDGET_SIZES - 1], bcase.budget_s);
    memset(res, 0, sizeof(res));
    budget_run = 1;
    if (run_ports(n, SC_BUDGET, res) < 0) {
        budget_run = 0;
        ok(0, "%sN=%d formation within a budget: could not start the ranks",
           label, n);
        return;
    }
    budget_run = 0;
    snprintf(name, sizeof(name), "N=%d formation within its budget", n);
    for (int r = 0; r < n; r++) {
        char h[32];
        int okr = 0, off = 0;

        if (nth_line(res[r].text, 0, line, sizeof(line)) < 0 ||
            sscanf(line, "%1023s %d %31s %n", name, &okr, h, &off) < 3) {
            all = 0;
            diag("rank %d (exit %d): no result: %s", r, res[r].status,
                 res[r].text);
            continue;
        }
        if (!okr) {
            all = 0;
            diag("rank %d: %s", r, line + off);
        }
        if (r == 0)
            snprintf(h0, sizeof(h0), "%s", h);
        else if (strcmp(h, h0))
            same = 0;
    }
    for (char *p = name; *p; p++)
        if (*p == '~')
            *p = ' ';
    ok(all && same, "%s%s (seed %u)%s", label, name, seed,
       same ? "" : " (outputs differ between ranks)");
    for (int r = 0; r < n; r++)
        free(res[r].text);
}

/* N = 4, rank 2 dies or stops mid-all-reduce: every survivor must get an
 * error naming it within the peer timeout's bound (plus SLACK_S). */
static void check_death(int sc, int sig, const char *how, const char *label)
{
    struct result res[MAXP];
    int all = 1, victim = 2;
    double worst = 0;

    memset(res, 0, sizeof(res));
    if (run_ports(4, sc, res) < 0) {
        ok(0, "N=4 rank 2 %s: could not start the ranks", how);
        return;
    }
    for (int r = 0; r < 4; r++) {
        int erred = 0, named = 0;
        double secs = 0;

        if (r == victim) {
            /* SIGKILL ends it either way (the parent kills a stopped one) */
            if (res[r].status != 128 + SIGKILL) {
                all = 0;
                diag("rank %d was to end by signal %d: exit %d", r, sig,
                     res[r].status);
            }
            continue;
        }
        if (sscanf(res[r].text, "kill %d %lf %d", &erred, &secs, &named) != 3 ||
            !erred || !named || secs > PEER_BOUND_S + SLACK_S)
            all = 0;
        worst = MESH_MAX(worst, secs);
        diag("rank %d (exit %d): %s", r, res[r].status, res[r].text);
    }
    ok(all,
       "%sN=4 rank 2 %s mid-all-reduce: every survivor errors naming it "
       "within the peer timeout's bound (%.2f s; slowest %.2f s)",
       label, how, PEER_BOUND_S, worst);
    for (int r = 0; r < 4; r++)
        free(res[r].text);
}

/* N = 3, rank 1 asks for one element fewer: every rank must get an error. */
static void check_mismatch(const char *label)
{
    struct result res[MAXP];

    memset(res, 0, sizeof(res));
    if (run_ports(3, SC_MISMATCH, res) == 0) {
        int all = 1;

        for (int r = 0; r < 3; r++) {
            char line[LINE];
            int okr = 0;

            if (nth_line(res[r].text, 0, line, sizeof(line)) < 0 ||
                sscanf(line, "%*s %d", &okr) != 1 || !okr) {
                all = 0;
                diag("rank %d: %s", r, res[r].text);
            } else {
                diag("rank %d: %s", r, strchr(line, ' ') + 1);
            }
        }
        ok(all,
           "%sN=3 sizes disagree (1000 vs 1001): every rank gets an "
           "error",
           label);
        for (int r = 0; r < 3; r++)
            free(res[r].text);
    } else {
        ok(0, "%sN=3 sizes disagree: could not start the ranks", label);
    }
}

int main(int argc, char **argv)
{
    int nmax = argc > 1 ? atoi(argv[1]) : MAXP;
    /* argv: [NMAX [TRANSPORT [LAYOUTS]]] */
    const char *name = argc > 2 ? argv[2] : "tcp";

    ops = mesh_transport_find(name);
    if (!ops) {
        skip_all("transport '%s' is not built", name);
        return 0;
    }
    diag("transport %s", name);
    signal(SIGPIPE, SIG_IGN);
    diag("kernels: %s", mesh_reduce_isa());
    for (int n = 2; n <= nmax && n <= MAXP; n++)
        battery_of(n, "");
    /* argv[3]: layouts "HxL,..." (H hosts of L ranks), e.g. 2x2,2x3,3x1 */
    for (const char *l = argc > 3 ? argv[3] : NULL; l && *l;) {
        int h = 0, per = 0, used = 0;
        char label[64];

        if (sscanf(l, "%dx%d%n", &h, &per, &used) != 2 || h < 1 || per < 1 ||
            h * per > MAXP) {
            ok(0, "layout '%s': expected HxL with H x L <= %d", l, MAXP);
            break;
        }
        snprintf(label, sizeof(label), "%d hosts x %d: ", h, per);
        test_hosts = h;
        battery_of(h * per, label);
        test_hosts = 1;
        l += used;
        l += *l == ',';
    }

    if (!strcmp(name, "tcp")) {
        /*
         * The executor holds the transport (it leaves the data streams'
         * I/O to the executing thread between two waits). A waiter that
         * sleeps on the condition variable instead (no spin, no poll)
         * needs the progress thread to do that I/O, holder or not: every
         * collective would hang here otherwise. The children inherit
         * these settings.
         */
        setenv("MESHTRAIN_TCP_POLL", "0", 1);
        setenv("MESHTRAIN_TCP_SPIN_US", "0", 1);
        battery_of(3, "waiters asleep (MESHTRAIN_TCP_POLL=0, SPIN_US=0): ");
        /* and waiters that poll() at once, without the spin */
        unsetenv("MESHTRAIN_TCP_POLL");
        battery_of(4, "waiters poll at once (MESHTRAIN_TCP_SPIN_US=0): ");
        unsetenv("MESHTRAIN_TCP_SPIN_US");
    }

    {
        /* MESHTRAIN_COLL_SEED: other sizes and budgets (default 1) */
        const char *e = getenv("MESHTRAIN_COLL_SEED");
        unsigned seed = e ? (unsigned)strtoul(e, NULL, 0) : 1;

        for (int n = 2; n <= nmax && n <= MAXP; n *= 2)
            check_budget(n, seed + (unsigned)n, "");
    }
    check_mismatch("");
    check_death(SC_KILL, SIGKILL, "killed (SIGKILL)", "");
    check_death(SC_STOP, SIGSTOP, "stopped (SIGSTOP, silent)", "");
    if (argc > 3) {
        /* with layouts: also across 2 hosts of 2, where the victim's host
         * shares memory with one survivor and the others reach it over
         * the mesh between hosts */
        test_hosts = 2;
        check_death(SC_KILL, SIGKILL, "killed (SIGKILL)", "2 hosts x 2: ");
        check_death(SC_STOP, SIGSTOP, "stopped (SIGSTOP, silent)",
                    "2 hosts x 2: ");
        test_hosts = 1;
    }
    if (ops->host_sync) {
        /* the same over the windows of local: its host syncs see the
         * disagreement, the death and the silence */
        death_algo = MESH_ALGO_LOCAL;
        check_mismatch("local: ");
        check_death(SC_KILL, SIGKILL, "killed (SIGKILL)", "local: ");
        check_death(SC_STOP, SIGSTOP, "stopped (SIGSTOP, silent)", "local: ");
        death_algo = MESH_ALGO_RING;
    }
    return done();
}
