/*
 * tests/test_nn_algo.c: the algorithm fallback of nn/algo.c, which the
 * cuda backend runs for each convolution direction at plan time
 * (workspace queries) and at every call, against a test double of the
 * library: a try function that fails for the algorithms it is told to.
 * The general case: random candidate lists, workspaces, caps, starting
 * points and failure sets over several seeds, against the rule the
 * header states.
 */
#include "config.h"

#include "nn/algo.h"
#include "common/util.h"
#include "tests/tap.h"

#include <errno.h>
#include <string.h>

/* The test double: algorithm ids in fail[] fail with -EIO and a message
 * naming them; every try is logged in order. */
struct lib {
    unsigned fail; /* bit id: that algorithm fails */
    int tried[64]; /* ids in the order tried */
    int ntried;
};

static int try_fn(void *arg, struct mesh_nn_algo *a)
{
    struct lib *l = arg;

    if (l->ntried < 64)
        l->tried[l->ntried++] = a->id;
    if (l->fail & (1u << a->id))
        return mesh_err(-EIO, "algorithm %d broke", a->id);
    return 0;
}

/* n candidates, each id its index (the double's fail bits). */
static void mk(struct mesh_nn_algo *a, int n, const size_t *ws)
{
    int i;

    memset(a, 0, sizeof(*a) * (size_t)n);
    for (i = 0; i < n; i++) {
        a[i].id = i;
        a[i].math = i % 3;
        a[i].ws = ws ? ws[i] : 0;
    }
}

static void fixed_cases(void)
{
    struct mesh_nn_algo a[4];
    static const size_t ws[4] = {100, 5000, 200, 50};
    struct lib l;
    int cur, rc;

    /* the first works: one try, cur stays 0 */
    mk(a, 4, ws);
    memset(&l, 0, sizeof(l));
    cur = 0;
    rc = mesh_nn_algo_run(a, 4, 1000, &cur, "conv fwd", try_fn, &l);
    ok(rc == 0 && cur == 0 && l.ntried == 1 && !a[0].failed,
       "the first algorithm works: taken, tried once (rc %d cur %d)", rc, cur);

    /* the first fails: the one over the cap is skipped, the third taken */
    mk(a, 4, ws);
    memset(&l, 0, sizeof(l));
    l.fail = 1u << 0;
    cur = 0;
    rc = mesh_nn_algo_run(a, 4, 1000, &cur, "conv fwd", try_fn, &l);
    ok(rc == 0 && cur == 2 && l.ntried == 2 && l.tried[0] == 0 &&
           l.tried[1] == 2 && a[0].failed && !a[1].failed,
       "the first fails: the next within the workspace (2) is taken, 1 "
       "(5000 bytes) is skipped (rc %d cur %d tries %d)",
       rc, cur, l.ntried);

    /* a later call starts at cur and never retries a failed one */
    memset(&l, 0, sizeof(l));
    l.fail = 1u << 2;
    rc = mesh_nn_algo_run(a, 4, 1000, &cur, "conv fwd", try_fn, &l);
    ok(rc == 0 && cur == 3 && l.ntried == 2 && l.tried[0] == 2 &&
           l.tried[1] == 3,
       "a call that fails on the kept algorithm falls back to the next "
       "(rc %d cur %d tries %d)",
       rc, cur, l.ntried);

    /* all fail: the last error, its message, what and the id named */
    mk(a, 4, ws);
    memset(&l, 0, sizeof(l));
    l.fail = 0xf;
    cur = 0;
    rc = mesh_nn_algo_run(a, 4, 10000, &cur, "conv bwd data [shape]", try_fn,
                          &l);
    ok(rc == -EIO && cur == 0 && l.ntried == 4 &&
           strstr(mesh_err_msg(rc), "conv bwd data [shape]") &&
           strstr(mesh_err_msg(rc), "algorithm 3 broke") &&
           !strstr(mesh_err_msg(rc), "algorithm 0 broke"),
       "every algorithm fails: -EIO with the last one's message, cur "
       "unchanged (\"%s\")",
       mesh_err_msg(rc));
    mesh_err_clear();

    /* then nothing is left: -ENOTSUP, no try */
    memset(&l, 0, sizeof(l));
    rc = mesh_nn_algo_run(a, 4, 10000, &cur, "conv", try_fn, &l);
    ok(rc == -ENOTSUP && l.ntried == 0 &&
           strstr(mesh_err_msg(rc), "no algorithm left"),
       "nothing left: -ENOTSUP without a try (\"%s\")", mesh_err_msg(rc));
    mesh_err_clear();

    /* none fits the workspace */
    mk(a, 4, ws);
    memset(&l, 0, sizeof(l));
    rc = mesh_nn_algo_run(a, 4, 10, &cur, "conv", try_fn, &l);
    ok(rc == -ENOTSUP && l.ntried == 0, "none within 10 bytes: -ENOTSUP");
    mesh_err_clear();
    mk(a, 0, NULL);
    ok(mesh_nn_algo_next(a, 0, 0, 1) == -1 &&
           mesh_nn_algo_next(a, 0, -3, 1) == -1,
       "no candidates: next is -1");
}

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

/* Random lists against the rule: the eligible candidates (not failed,
 * within the cap, at or after cur) are tried in order up to the first
 * that works. */
static void random_cases(unsigned seed0)
{
    unsigned seed = seed0;
    int round, bad = 0;

    for (round = 0; round < 2000 && !bad; round++) {
        struct mesh_nn_algo a[MESH_NN_ALGO_MAX], before[MESH_NN_ALGO_MAX];
        struct lib l;
        int n = (int)(rnd(&seed) % (MESH_NN_ALGO_MAX + 1)), i, cur, cur0;
        int want_tried[MESH_NN_ALGO_MAX], nwant = 0, want_cur = -1, rc;
        size_t cap = rnd(&seed) % 1000;

        memset(&l, 0, sizeof(l));
        mk(a, n, NULL);
        for (i = 0; i < n; i++) {
            a[i].ws = rnd(&seed) % 1200;
            a[i].failed = rnd(&seed) % 5 == 0;
            if (rnd(&seed) % 3 == 0)
                l.fail |= 1u << i;
        }
        cur0 = cur = n ? (int)(rnd(&seed) % (unsigned)n) : 0;
        memcpy(before, a, sizeof(a));
        for (i = cur; i < n; i++) {
            if (before[i].failed || before[i].ws > cap)
                continue;
            want_tried[nwant++] = i;
            if (!(l.fail & (1u << i))) {
                want_cur = i;
                break;
            }
        }
        rc = mesh_nn_algo_run(a, n, cap, &cur, "conv", try_fn, &l);
        mesh_err_clear();
        if (want_cur >= 0)
            bad |= rc != 0 || cur != want_cur;
        else
            bad |= rc != (nwant ? -EIO : -ENOTSUP) || cur != cur0;
        bad |= l.ntried != nwant;
        for (i = 0; i < nwant && !bad; i++)
            bad |= l.tried[i] != want_tried[i];
        for (i = 0; i < n && !bad; i++) {
            int tried_and_failed = 0, k;

            for (k = 0; k < nwant; k++)
                if (want_tried[k] == i && i != want_cur)
                    tried_and_failed = 1;
            bad |= a[i].failed != (before[i].failed || tried_and_failed);
        }
        if (bad)
            diag("seed %u round %d: n %d cap %zu cur %d fail %#x: rc %d "
                 "cur %d tries %d, want cur %d tries %d",
                 seed0, round, n, cap, cur0, l.fail, rc, cur, l.ntried,
                 want_cur, nwant);
    }
    ok(!bad, "seed %u: 2000 random candidate lists follow the rule", seed0);
}

int main(void)
{
    static const unsigned seeds[] = {1, 7, 2024, 99991};
    size_t i;

    plan(7 + (int)(sizeof(seeds) / sizeof(seeds[0])));
    mesh_log_set_level(MESH_LOG_ERROR); /* the fallbacks' warnings */
    fixed_cases();
    for (i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
        random_cases(seeds[i]);
    return done();
}
