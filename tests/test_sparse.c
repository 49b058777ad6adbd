/*
 * tests/test_sparse.c: sparsified gradients with error feedback
 * (train/sparse.h) against a serial reference.
 *
 * In one process: top-k's count for the values where a cast to an integer
 * goes wrong; --compress items, good and bad; the selection against a
 * reference that sorts (top-k: largest |v| first, ties to the lower
 * index; threshold), for several seeds, sizes, fractions, thresholds
 * (nothing selected, everything selected, NaNs) and wire dtypes, with
 * error feedback's invariant checked exactly on every element: sent +
 * residual == accumulated gradient; one rank over several steps.
 *
 * Then N = 2, 3 and 5 ranks (real processes, TCP on 127.0.0.1), each with
 * three buckets in flight at once over four steps of error feedback, for
 * every configuration: every rank computes the whole mesh's reference
 * serially (every rank's residual, the sum in rank order) and compares its
 * result bitwise; the parent checks that every rank's bytes are the same.
 * Last, one rank sends an index out of range: every other rank must get
 * an error naming it.
 */
#include "config.h"

#include "collective/collective.h"
#include "common/dtype.h"
#include "common/util.h"
#include "tests/ports.h"
#include "tests/tap.h"
#include "train/sparse.h"
#include "transport/transport.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXP  5
#define NB    3
#define STEPS 4
#define NCFG  (sizeof(cfgs) / sizeof(cfgs[0]))

static const struct mesh_sparse_cfg cfgs[] = {
    {MESH_SPARSE_TOPK, 0.01, MESH_DT_F32, 1},
    {MESH_SPARSE_TOPK, 0.07, MESH_DT_F16, 1},
    {MESH_SPARSE_TOPK, 0.29, MESH_DT_BF16, 1},
    {MESH_SPARSE_TOPK, 1.0, MESH_DT_F32, 1},
    {MESH_SPARSE_TOPK, 1e-6, MESH_DT_F32, 1},
    {MESH_SPARSE_TOPK, 0.05, MESH_DT_F32, 0},
    {MESH_SPARSE_THRESHOLD, 0.6, MESH_DT_F32, 1},
    {MESH_SPARSE_THRESHOLD, 0.3, MESH_DT_F16, 1},
    {MESH_SPARSE_THRESHOLD, 0.0, MESH_DT_BF16, 1},
    {MESH_SPARSE_THRESHOLD, 1e30, MESH_DT_F32, 1},
};

/* Bucket sizes of the mesh scenarios: one float, a prime, a few pages. */
static const size_t bsize[NB] = {1, 997, 20000};

/* ---- data ---------------------------------------------------------------- */

static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/*
 * Gradients with ties: a quarter of the elements from {+-0.25, +-0.5,
 * +-1}, some zeros, the rest of magnitudes over six decades.
 */
static void gen(float *g, size_t n, uint64_t seed)
{
    static const float tie[6] = {0.25f, -0.25f, 0.5f, -0.5f, 1.f, -1.f};
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;

    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd(&s);

        if (r % 4 == 0)
            g[i] = tie[rnd(&s) % 6];
        else if (r % 17 == 1)
            g[i] = 0.f;
        else
            g[i] = (float)((double)(rnd(&s) % 2000000) / 1e6 - 1.0) *
                   powf(10.f, -(float)(rnd(&s) % 6));
    }
}

static uint64_t fnv(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* ---- the serial reference ------------------------------------------------ */

static const float *sort_base;

/* Largest |v| first, ties to the lower index; NaNs above everything. */
static int by_mag(const void *a, const void *b)
{
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    float x = fabsf(sort_base[i]), y = fabsf(sort_base[j]);
    int nx = isnan(x), ny = isnan(y);

    if (nx != ny)
        return nx ? -1 : 1;
    if (!nx && x != y)
        return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

static float round_to(int dt, float v)
{
    if (dt == MESH_DT_F16)
        return mesh_f32_from_f16(mesh_f16_from_f32(v));
    if (dt == MESH_DT_BF16)
        return mesh_f32_from_bf16(mesh_bf16_from_f32(v));
    return v;
}

/*
 * The reference selection of acc[0..n): mask[i] = 1 where chosen; the
 * count returned. k from the rule written out again: R n to the nearest
 * integer, within [1, n].
 */
static size_t ref_select(const struct mesh_sparse_cfg *c, const float *acc,
                         size_t n, unsigned char *mask)
{
    size_t cnt = 0;

    memset(mask, 0, n);
    if (c->kind == MESH_SPARSE_TOPK) {
        uint32_t *ord = malloc((n ? n : 1) * 4);
        double kd = floor(c->param * (double)n + 0.5);
        size_t k = kd < 1 ? 1 : kd > (double)n ? n : (size_t)kd;

        if (n == 0)
            k = 0;
        for (size_t i = 0; i < n; i++)
            ord[i] = (uint32_t)i;
        sort_base = acc;
        qsort(ord, n, 4, by_mag);
        for (size_t j = 0; j < k; j++)
            mask[ord[j]] = 1;
        free(ord);
        return k;
    }
    for (size_t i = 0; i < n; i++)
        if (isnan(acc[i]) || fabsf(acc[i]) >= (float)c->param) {
            mask[i] = 1;
            cnt++;
        }
    return cnt;
}

/*
 * One step of the whole mesh, serially: every rank's gradients g[r] plus
 * its residual res[r] (updated), selected, and the sum in rank order
 * divided by size into out.
 */
static void ref_step(const struct mesh_sparse_cfg *c, int size, size_t n,
                     float *const *g, float *const *res, float *out)
{
    unsigned char *mask = malloc(n ? n : 1);
    float *acc = malloc((n ? n : 1) * 4);

    memset(out, 0, n * 4);
    for (int r = 0; r < size; r++) {
        for (size_t i = 0; i < n; i++)
            acc[i] = g[r][i] + (c->error_feedback ? res[r][i] : 0.f);
        ref_select(c, acc, n, mask);
        for (size_t i = 0; i < n; i++) {
            float sent = mask[i] ? round_to(c->wire, acc[i]) : 0.f;

            if (mask[i])
                out[i] += sent;
            if (c->error_feedback)
                res[r][i] = acc[i] - sent;
        }
    }
    if (size > 1)
        for (size_t i = 0; i < n; i++)
            out[i] /= (float)size;
    free(mask);
    free(acc);
}

/* ---- in one process ------------------------------------------------------ */

static void t_count(void)
{
    static const struct {
        double r;
        size_t n, k;
    } tab[] = {
        {0.01, 100, 1},     {0.07, 100, 7},       {0.29, 100, 29},
        {0.57, 100, 57},    {0.01, 150, 2},       {0.01, 149, 1},
        {0.001, 10, 1},     {1e-9, 1, 1},         {1.0, 7, 7},
        {0.5, 1, 1},        {0.3, 0, 0},          {0.01, 1234, 12},
        {0.999, 1000, 999}, {0.9999, 1000, 1000}, {0.01, 25557032, 255570},
    };
    int bad = 0;

    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        size_t k = mesh_sparse_topk_count(tab[i].r, tab[i].n);

        if (k != tab[i].k) {
            bad++;
            diag("R %g, n %zu: k %zu, want %zu", tab[i].r, tab[i].n, k,
                 tab[i].k);
        }
    }
    ok(!bad, "top-k counts: R n to the nearest integer, within [1, n] "
             "(0.29 x 100 = 29, not the cast's 28)");
}

static void t_parse(void)
{
    static const char *good[] = {"topk:0.01", "topk:1", "threshold:0",
                                 "threshold:1e-3"};
    static const char *bad[] = {"topk",          "topk:",     "topk:0",
                                "topk:1.5",      "topk:-0.1", "topk:abc",
                                "topk:0.1x",     "topk:nan",  "threshold:-1",
                                "threshold:inf", "thresh:1",  "top:0.1"};
    struct mesh_sparse_cfg c = {0};
    char name[64];
    int all = 1;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct mesh_sparse_cfg d = {0};

        if (mesh_sparse_parse(good[i], &c) < 0) {
            all = 0;
            diag("%s refused: %s", good[i], mesh_err_msg(-EINVAL));
            continue;
        }
        mesh_sparse_name(&c, name, sizeof(name));
        if (mesh_sparse_parse(name, &d) < 0 || d.kind != c.kind ||
            d.param != c.param) {
            all = 0;
            diag("%s: named %s, which does not read back", good[i], name);
        }
    }
    ok(all, "topk:R and threshold:T parse, and their names read back");
    all = 1;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = mesh_sparse_parse(bad[i], &c);

        if (rc != -EINVAL || !strstr(mesh_err_msg(rc), bad[i])) {
            all = 0;
            diag("%s: rc %d, \"%s\"", bad[i], rc, mesh_err_msg(rc));
        } else {
            diag("%s: %s", bad[i], mesh_err_msg(rc));
        }
    }
    ok(all, "bad --compress items are refused, the message naming them");
}

/*
 * mesh_sparse_select against ref_select; the invariant: residual + sent
 * == acc exactly (bitwise, but for the sign of zero), and residual ==
 * acc where nothing was sent. Returns the number of failures.
 */
static int select_case(const struct mesh_sparse_cfg *c, const float *acc,
                       size_t n, const char *what)
{
    unsigned char *mask = malloc(n ? n : 1);
    uint32_t *idx = malloc((n ? n : 1) * 4);
    float *val = malloc((n ? n : 1) * 4), *res = malloc((n ? n : 1) * 4);
    size_t cnt = 0, want = ref_select(c, acc, n, mask), j = 0;
    int bad = 0;

    mesh_sparse_select(c, acc, n, idx, val, res, &cnt);
    if (cnt != want) {
        diag("%s: %zu selected, want %zu", what, cnt, want);
        bad++;
    }
    for (size_t i = 0; i < n && !bad; i++) {
        float a = acc[i], r = res[i];

        if (mask[i]) {
            float s = mesh_dtype_get_f32(c->wire, val, j);

            if (j >= cnt || idx[j] != i) {
                diag("%s: pair %zu is index %u, want %zu", what, j,
                     j < cnt ? idx[j] : 0u, i);
                bad++;
            } else if (s != round_to(c->wire, a) ||
                       (!isnan(a) && !(s + r == a)) ||
                       (isnan(a) && !isnan(s))) {
                diag("%s: at %zu acc %a sent %a residual %a", what, i,
                     (double)a, (double)s, (double)r);
                bad++;
            }
            j++;
        } else if (memcmp(&r, &a, 4)) {
            diag("%s: at %zu (not sent) residual %a, acc %a", what, i,
                 (double)r, (double)a);
            bad++;
        }
    }
    free(mask);
    free(idx);
    free(val);
    free(res);
    return bad;
}

static void t_select(void)
{
    static const size_t sizes[] = {1, 2, 100, 1000, 4097, 65536};
    static const double fr[] = {1e-6, 0.01, 0.07, 0.5, 1.0};
    static const float th[] = {0.f, 1e-4f, 0.25f, 0.5f, 1.f, 1e30f};
    static const int dts[] = {MESH_DT_F32, MESH_DT_F16, MESH_DT_BF16};
    int bad = 0, cases = 0;
    char what[128];

    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
        for (uint64_t seed = 1; seed <= 3; seed++) {
            size_t n = sizes[si];
            float *acc = malloc(n * 4);

            gen(acc, n, seed * 131 + n);
            for (size_t d = 0; d < 3; d++) {
                for (size_t f = 0; f < sizeof(fr) / sizeof(fr[0]); f++) {
                    struct mesh_sparse_cfg c = {MESH_SPARSE_TOPK, fr[f], dts[d],
                                                1};

                    snprintf(what, sizeof(what), "topk:%g %s n %zu seed %d",
                             fr[f], mesh_dtype_name(dts[d]), n, (int)seed);
                    bad += select_case(&c, acc, n, what);
                    cases++;
                }
                for (size_t t = 0; t < sizeof(th) / sizeof(th[0]); t++) {
                    struct mesh_sparse_cfg c = {MESH_SPARSE_THRESHOLD,
                                                (double)th[t], dts[d], 1};

                    snprintf(what, sizeof(what),
                             "threshold:%g %s n %zu seed %d", (double)th[t],
                             mesh_dtype_name(dts[d]), n, (int)seed);
                    bad += select_case(&c, acc, n, what);
                    cases++;
                }
            }
            free(acc);
        }
    ok(!bad,
       "selection = the sorting reference, sent + residual == acc "
       "exactly (%d cases: 6 sizes, 3 seeds, 3 wire dtypes, 5 "
       "fractions, 6 thresholds)",
       cases);
}

/* All equal: top-k takes the lowest indices; NaNs are always sent. */
static void t_ties(void)
{
    struct mesh_sparse_cfg top = {MESH_SPARSE_TOPK, 0.1, MESH_DT_F32, 1};
    struct mesh_sparse_cfg thr = {MESH_SPARSE_THRESHOLD, 1e30, MESH_DT_F32, 1};
    float acc[100];
    uint32_t idx[100];
    float val[100], res[100];
    size_t cnt, i;
    int good = 1;

    for (i = 0; i < 100; i++)
        acc[i] = i % 2 ? -0.5f : 0.5f;
    mesh_sparse_select(&top, acc, 100, idx, val, res, &cnt);
    for (i = 0; i < cnt; i++)
        good &= idx[i] == i && val[i] == acc[i] && res[i] == 0.f;
    ok(cnt == 10 && good,
       "100 equal magnitudes, topk:0.1: indices 0..9 "
       "(%zu chosen)",
       cnt);
    acc[37] = NAN;
    acc[90] = INFINITY;
    mesh_sparse_select(&top, acc, 100, idx, val, res, &cnt);
    ok(cnt == 10 && idx[0] == 0 && idx[8] == 37 && idx[9] == 90 &&
           isnan(val[8]) && isinf(val[9]),
       "topk: a NaN and an infinity come first");
    mesh_sparse_select(&thr, acc, 100, idx, val, res, &cnt);
    ok(cnt == 2 && idx[0] == 37 && idx[1] == 90,
       "threshold:1e30: only the NaN and the infinity are sent");
}

/* One rank, several steps: mesh_sparse against ref_step (size 1). */
static void t_one_rank(void)
{
    int bad = 0;

    for (size_t ci = 0; ci < NCFG; ci++) {
        const struct mesh_sparse_cfg *c = &cfgs[ci];
        size_t lo[NB], hi[NB], total = 0;
        struct mesh_sparse *sp = NULL;
        float *g, *ref, *gr, *res;

        for (int b = 0; b < NB; b++) {
            lo[b] = total;
            total += bsize[b];
            hi[b] = total;
        }
        g = malloc(total * 4);
        ref = malloc(total * 4);
        gr = malloc(total * 4);
        res = calloc(total, 4);
        if (mesh_sparse_create(c, NULL, 0, 1, total, lo, hi, NB, &sp) < 0) {
            diag("create: %s", mesh_err_msg(-1));
            bad++;
        }
        for (int s = 0; sp && s < STEPS; s++) {
            for (int b = 0; b < NB; b++) {
                gen(g + lo[b], bsize[b], (uint64_t)(s * 10 + b));
                memcpy(gr + lo[b], g + lo[b], bsize[b] * 4);
                if (mesh_sparse_start(sp, b, g + lo[b]) < 0)
                    bad++;
                ref_step(c, 1, bsize[b], (float *const[]){gr + lo[b]},
                         (float *const[]){res + lo[b]}, ref + lo[b]);
            }
            if (memcmp(g, ref, total * 4)) {
                diag("config %zu step %d: result differs", ci, s);
                bad++;
            }
            if (c->error_feedback &&
                memcmp(mesh_sparse_residual(sp), res, total * 4)) {
                diag("config %zu step %d: residual differs", ci, s);
                bad++;
            }
        }
        mesh_sparse_destroy(sp);
        free(g);
        free(ref);
        free(gr);
        free(res);
    }
    ok(!bad,
       "one rank, %d steps of error feedback, %zu configurations: "
       "result and residual bitwise the reference's",
       STEPS, NCFG);
}

/* ---- the mesh ------------------------------------------------------------ */

static const struct mesh_transport_ops *ops;

struct rank_ctx {
    int rank, n;
    struct mesh_peer peers[MAXP];
    struct mesh_world w;
    struct mesh_transport_opts o;
    mesh_transport_t *t;
    mesh_coll_t *c;
};

static int mesh_up(struct rank_ctx *x, uint16_t base)
{
    static const char *secret = "test_sparse shared secret";
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
    x->o.peer_timeout_s = 10;
    x->o.join_timeout_s = 30;
    x->o.secret = (const uint8_t *)secret;
    x->o.secret_len = strlen(secret);
    snprintf(x->o.job_id, sizeof(x->o.job_id), "test-sparse");
    snprintf(x->o.config, sizeof(x->o.config), "test=sparse\n");
    rc = ops->listen(&x->w, &x->o, &x->t);
    if (rc == 0)
        rc = ops->connect(x->t);
    if (rc < 0)
        return rc;
    mesh_coll_opts_init(&co);
    co.measure = 0;
    return mesh_coll_create(ops, x->t, &x->w, &co, &x->c);
}

/*
 * Configuration ci over STEPS steps, three buckets in flight at once:
 * this rank's result against the serial reference of the whole mesh.
 * Writes "cfg CI ok|bad HASH" to out.
 */
static int mesh_case(struct rank_ctx *x, size_t ci, FILE *out)
{
    const struct mesh_sparse_cfg *c = &cfgs[ci];
    size_t lo[NB], hi[NB], total = 0;
    struct mesh_sparse *sp = NULL;
    float *g, *ref, *gr[MAXP], *res[MAXP];
    uint64_t h = 1469598103934665603ull;
    int bad = 0, rc;

    for (int b = 0; b < NB; b++) {
        lo[b] = total;
        total += bsize[b];
        hi[b] = total;
    }
    g = malloc(total * 4);
    ref = malloc(total * 4);
    for (int r = 0; r < x->n; r++) {
        gr[r] = malloc(total * 4);
        res[r] = calloc(total, 4);
    }
    rc = mesh_sparse_create(c, x->c, x->rank, x->n, total, lo, hi, NB, &sp);
    for (int s = 0; rc == 0 && s < STEPS; s++) {
        /* the trainer's order: start every bucket, exchange, wait */
        for (int b = 0; rc == 0 && b < NB; b++) {
            for (int r = 0; r < x->n; r++)
                gen(gr[r] + lo[b], bsize[b],
                    (uint64_t)(1000 * ci + 100 * s + 10 * b + r));
            memcpy(g + lo[b], gr[x->rank] + lo[b], bsize[b] * 4);
            rc = mesh_sparse_start(sp, b, g + lo[b]);
        }
        for (int b = 0; rc == 0 && b < NB; b++)
            rc = mesh_sparse_exchange(sp, b);
        for (int b = 0; rc == 0 && b < NB; b++)
            rc = mesh_sparse_wait(sp, b, g + lo[b], NULL, NULL);
        for (int b = 0; rc == 0 && b < NB; b++) {
            float *gp[MAXP], *rp[MAXP];

            for (int r = 0; r < x->n; r++) {
                gp[r] = gr[r] + lo[b];
                rp[r] = res[r] + lo[b];
            }
            ref_step(c, x->n, bsize[b], gp, rp, ref + lo[b]);
        }
        if (rc == 0 && memcmp(g, ref, total * 4)) {
            size_t i = 0;

            while (!memcmp(g + i, ref + i, 4))
                i++;
            fprintf(out, "# cfg %zu step %d: float %zu is %a, want %a\n", ci, s,
                    i, (double)g[i], (double)ref[i]);
            bad++;
        }
        if (rc == 0 && c->error_feedback &&
            memcmp(mesh_sparse_residual(sp), res[x->rank], total * 4)) {
            fprintf(out, "# cfg %zu step %d: residual differs\n", ci, s);
            bad++;
        }
        h = fnv(h, g, total * 4);
    }
    if (rc < 0) {
        fprintf(out, "# cfg %zu: %s\n", ci, mesh_err_msg(rc));
        bad++;
        mesh_sparse_abort(sp);
    }
    fprintf(out, "cfg %zu %s %016" PRIx64 "\n", ci, bad ? "bad" : "ok", h);
    mesh_sparse_destroy(sp);
    free(g);
    free(ref);
    for (int r = 0; r < x->n; r++) {
        free(gr[r]);
        free(res[r]);
    }
    return rc;
}

/*
 * The last rank sends top-k pairs with an index past the bucket: every
 * other rank must refuse them, naming it.
 */
static void mesh_bad_pairs(struct rank_ctx *x, FILE *out)
{
    struct mesh_sparse_cfg c = {MESH_SPARSE_TOPK, 0.1, MESH_DT_F32, 1};
    size_t lo = 0, hi = 100, k = 10;
    struct mesh_sparse *sp = NULL;
    float g[100];
    int rc;

    gen(g, 100, 7);
    if (x->rank == x->n - 1) {
        uint8_t *buf = calloc((size_t)x->n, k * 8);
        uint8_t *mine = buf + (size_t)x->rank * k * 8;

        for (uint32_t j = 0; j < k; j++) {
            uint32_t ix = j == 5 ? 100 + j : j;

            memcpy(mine + j * 4, &ix, 4);
        }
        rc = mesh_coll_allgather(x->c, mine, buf, k * 8, MESH_DT_BYTE);
        fprintf(out, "bad sender %d\n", rc);
        free(buf);
        return;
    }
    rc = mesh_sparse_create(&c, x->c, x->rank, x->n, 100, &lo, &hi, 1, &sp);
    if (rc == 0)
        rc = mesh_sparse_start(sp, 0, g);
    if (rc == 0)
        rc = mesh_sparse_wait(sp, 0, g, NULL, NULL);
    {
        char want[32];

        snprintf(want, sizeof(want), "rank %d sent index 105", x->n - 1);
        fprintf(out, "bad %s %s\n",
                rc == -EPROTO && strstr(mesh_err_msg(rc), want) ? "ok"
                                                                : "missed",
                rc < 0 ? mesh_err_msg(rc) : "no error");
    }
    mesh_sparse_destroy(sp);
}

static void child(int rank, int n, uint16_t base, int fd)
{
    struct rank_ctx x = {.rank = rank, .n = n};
    FILE *out = fdopen(fd, "w");
    int rc;

    alarm(120);
    mesh_log_set_rank(rank);
    mesh_log_set_level(MESH_LOG_WARN);
    if (!out)
        _exit(2);
    rc = mesh_up(&x, base);
    if (rc < 0) {
        fprintf(out, "setup %s\n", mesh_err_msg(rc));
        fclose(out);
        _exit(1);
    }
    for (size_t ci = 0; ci < NCFG && rc == 0; ci++)
        rc = mesh_case(&x, ci, out);
    if (rc == 0)
        mesh_bad_pairs(&x, out);
    fclose(out);
    mesh_coll_destroy(x.c);
    ops->close(x.t);
    _exit(rc < 0);
}

/* Fork n ranks; each one's output into text[r] (malloc'ed). */
static int run(int n, char **text, int *status)
{
    uint16_t base = test_ports_pick(n);
    pid_t pid[MAXP];
    FILE *in[MAXP];

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
            close(p[0]);
            for (int k = 0; k < r; k++)
                fclose(in[k]);
            child(r, n, base, p[1]);
        }
        close(p[1]);
        in[r] = fdopen(p[0], "r");
    }
    /* a rank writes a few lines per case: a pipe holds them all, so
     * reading the ranks one after another blocks nobody */
    for (int r = 0; r < n; r++) {
        size_t len = 0, cap = 4096;
        char buf[512];

        text[r] = calloc(1, cap);
        while (text[r] && fgets(buf, sizeof(buf), in[r])) {
            size_t l = strlen(buf);

            if (len + l + 1 > cap)
                text[r] = realloc(text[r], cap *= 2);
            if (!text[r])
                break;
            memcpy(text[r] + len, buf, l + 1);
            len += l;
        }
        fclose(in[r]);
    }
    for (int r = 0; r < n; r++) {
        int st = 0;

        waitpid(pid[r], &st, 0);
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return 0;
}

/* The line of text that starts with prefix, or NULL. */
static const char *line_of(const char *text, const char *prefix)
{
    size_t l = strlen(prefix);

    for (const char *s = text; s && *s; s = strchr(s, '\n'), s = s ? s + 1 : s)
        if (!strncmp(s, prefix, l))
            return s;
    return NULL;
}

static void t_mesh(int n)
{
    char *text[MAXP] = {0};
    int status[MAXP] = {0}, setup_ok = 1;

    for (int attempt = 0; attempt < 3; attempt++) {
        int clash = 0;

        if (run(n, text, status) < 0) {
            setup_ok = 0;
            break;
        }
        for (int r = 0; r < n; r++)
            if (text[r] && !strncmp(text[r], "setup ", 6) &&
                test_ports_clash(text[r]))
                clash = 1;
        if (!clash)
            break;
        for (int r = 0; r < n; r++) {
            free(text[r]);
            text[r] = NULL;
        }
    }
    for (size_t ci = 0; ci < NCFG; ci++) {
        char prefix[32], name[64], h0[32] = "";
        int good = setup_ok, same = 1;

        snprintf(prefix, sizeof(prefix), "cfg %zu ", ci);
        for (int r = 0; setup_ok && r < n; r++) {
            const char *l = text[r] ? line_of(text[r], prefix) : NULL;
            char res[8] = "", hash[32] = "";

            if (!l || sscanf(l + strlen(prefix), "%7s %31s", res, hash) != 2 ||
                strcmp(res, "ok")) {
                good = 0;
                diag("N=%d rank %d: %s", n, r, text[r] ? text[r] : "");
                continue;
            }
            if (r == 0)
                snprintf(h0, sizeof(h0), "%s", hash);
            else if (strcmp(h0, hash))
                same = 0;
        }
        mesh_sparse_name(&cfgs[ci], name, sizeof(name));
        ok(good && same,
           "N=%d %s,%s%s: every rank = the serial reference, bitwise, "
           "over %d steps (hashes %s)",
           n, name, mesh_dtype_name(cfgs[ci].wire),
           cfgs[ci].error_feedback ? "" : " no error feedback", STEPS,
           same ? "agree" : "DIFFER");
    }
    {
        int good = setup_ok;

        for (int r = 0; setup_ok && r < n - 1; r++) {
            const char *l = text[r] ? line_of(text[r], "bad ") : NULL;

            if (!l || strncmp(l, "bad ok ", 7)) {
                good = 0;
                diag("N=%d rank %d: %s", n, r, l ? l : "(no line)");
            } else if (r == 0) {
                diag("N=%d rank 0: %.*s", n, (int)strcspn(l + 7, "\n"), l + 7);
            }
        }
        ok(good,
           "N=%d: pairs with an index past the bucket are refused "
           "by every other rank, naming the sender",
           n);
    }
    for (int r = 0; r < n; r++)
        free(text[r]);
}

int main(void)
{
    static const int ns[] = {2, 3, 5};

    signal(SIGPIPE, SIG_IGN);
    plan(8 + 3 * ((int)NCFG + 1));
    t_count();
    t_parse();
    t_select();
    t_ties();
    t_one_rank();

    ops = mesh_transport_find("tcp");
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
        if (!ops) {
            for (size_t k = 0; k < NCFG + 1; k++)
                skip("the tcp transport is not built");
            continue;
        }
        t_mesh(ns[i]);
    }
    return done();
}
