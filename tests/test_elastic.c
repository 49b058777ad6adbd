/*
 * tests/test_elastic.c: the view agreement of --elastic (train/elastic.h)
 * with three slots in one process (each its own thread and UDP socket on
 * 127.0.0.1), no trainer and no mesh.
 *
 * Slot 2 leaves view 0; the threads of slots 0 and 1 agree with it on
 * their own, as they do while their trainers run no collective (the test
 * aid MESHTRAIN_TEST_JOIN_AT's wait at a boundary, a view's mesh still
 * opening). Their next step boundary must then refuse to commit
 * (mesh_elastic_commit: -ECANCELED) until mesh_elastic_agree has returned
 * the view decided meanwhile. A member that waited on in view 0 there (a
 * late joiner at the test aid's wait, as in tests/train_elastic_join.sh)
 * left the others waiting out the new view's join timeout; the views
 * after it then never formed, and the members exited 3 and 5.
 *
 * Then (test_slow_voter): a live member slow to vote is not left out of
 * a join's view change, nor of one after a death, and one that never
 * votes is, after --peer-timeout.
 *
 * And (test_cell_hash) the weights' cell hash (train_wch, train/whash.c),
 * which the weight check and the state transfer compare: fed in any
 * pieces it is the SHA-256 of its cells' SHA-256s, and every byte counts.
 */
#include "config.h"

#include "common/util.h"
#include "tests/ports.h"
#include "tests/tap.h"
#include "train/elastic.h"
#include "train/train-internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 3

struct prober {
    struct mesh_elastic *e;
    int rc;
};

static void *probe_main(void *arg)
{
    struct prober *p = arg;

    p->rc = mesh_elastic_probe(p->e, 6.0);
    return NULL;
}

/*
 * Two joiners at once, of different job ids (tests/train_elastic_join.sh
 * starts one with another secret and one with another job): neither is
 * the job's peer, so neither refuses the other; only a member's refusal
 * names what is wrong. Slot 0 probes for 1 s inside slot 1's 6 s probe:
 * nobody runs, nobody refuses it (0). Before, slot 1 refused its JOIN:
 * "another job". (Once slot 0's probe has ended it is a starting peer of
 * its own job, and refuses slot 1: that is not looked at.)
 */
static void test_joiners_refuse_nobody(void)
{
    static const uint8_t secret[] = "test_elastic secret";
    static const char *jobs[2] = {"job_a", "job_b"};
    struct mesh_peer peers[2];
    struct mesh_world w[2];
    struct mesh_elastic *e[2];
    struct prober p[2];
    pthread_t th[2];
    uint16_t port = test_ports_pick(2);
    int i, rc;

    if (!port) {
        skip("no free block of 2 ports");
        return;
    }
    memset(peers, 0, sizeof(peers));
    for (i = 0; i < 2; i++) {
        snprintf(peers[i].host, sizeof(peers[i].host), "127.0.0.1");
        peers[i].port = (uint16_t)(port + i);
    }
    for (i = 0; i < 2; i++) {
        struct mesh_elastic_opts o;

        w[i].rank = i;
        w[i].size = 2;
        w[i].peers = peers;
        memset(&o, 0, sizeof(o));
        o.world = &w[i];
        o.secret = secret;
        o.secret_len = sizeof(secret) - 1;
        o.job_id = jobs[i];
        o.settle_s = 0.15;
        o.fd = -1;
        rc = mesh_elastic_start(&o, &e[i]);
        if (rc < 0) {
            ok(0, "slot %d starts its view thread: %s", i, mesh_err_msg(rc));
            while (i-- > 0)
                mesh_elastic_stop(e[i]);
            return;
        }
    }
    p[1].e = e[1];
    pthread_create(&th[1], NULL, probe_main, &p[1]);
    usleep(300000); /* slot 1 is probing */
    p[0].rc = mesh_elastic_probe(e[0], 1.0);
    pthread_join(th[1], NULL);
    ok(p[0].rc == 0,
       "a joiner probing is not refused by another job's joiner probing "
       "(%d; -13: refused)",
       p[0].rc);
    for (i = 0; i < 2; i++)
        mesh_elastic_stop(e[i]);
}

/* A transport that only counts its aborts (mesh_elastic_set_transport). */
static int aborts;

static void fake_abort(mesh_transport_t *t, int culprit, const char *why)
{
    (void)t;
    (void)culprit;
    (void)why;
    aborts++;
}

static const struct mesh_transport_ops fake_ops = {.name = "fake",
                                                   .abort = fake_abort};

struct agreer {
    struct mesh_elastic *e;
    struct mesh_elastic_view v;
    int rc;
};

static void *agree_main(void *arg)
{
    struct agreer *a = arg;

    a->rc = mesh_elastic_agree(a->e, 20.0, &a->v);
    return NULL;
}

/* "rc 0, view 2, members 0xf, needy 0x8, step 5" */
static const char *view_str(const struct agreer *a, char *buf, size_t len)
{
    snprintf(buf, len,
             "rc %d, view %llu, members %#llx, left %#llx, needy %#llx, step "
             "%llu",
             a->rc, (unsigned long long)a->v.epoch,
             (unsigned long long)a->v.members, (unsigned long long)a->v.left,
             (unsigned long long)a->v.needy, (unsigned long long)a->v.step);
    return buf;
}

/*
 * Slots 0-3 of 5 form view 1 (slot 4 is a spare), then slot 4 asks to
 * join. Slot 0 leaves view 1 at a step boundary to admit it; slot 2's
 * thread stalls for 0.4 s before it votes (the test aid
 * mesh_elastic_test_stall: a loaded machine's scheduling stall). Before,
 * slots 0, 1 and 3 decided view 2 = {0,1,3,4} once their seen set had
 * been quiet for the settle time (0.15 s): slot 2, alive, was left out
 * and exited 5, and the job shrank for nothing. Now an agreement that
 * knows of no death (the view formed, no mesh blamed anyone) waits for
 * every member of the view up to --peer-timeout (wait_s, here 2.5 s), so
 * view 2 is {0,1,2,3,4}. Then slot 4 dies (its thread stalls for good),
 * slot 0's mesh blames it, and slot 2 is slow again: slot 2 is still
 * waited for (a death known: up to 1 s), view 3 is {0,1,2,3}. Last, a
 * member that does not vote within --peer-timeout (slot 1) is left out
 * of view 4, as a dead one.
 */
#define SLOW_N      5
#define SLOW_WAIT_S 2.5

static int fake_culprit_rank;

static int fake_culprit(mesh_transport_t *t)
{
    (void)t;
    return fake_culprit_rank;
}

static const struct mesh_transport_ops fake_dead_ops = {
    .name = "fake", .abort = fake_abort, .culprit = fake_culprit};

/* slot 0 leaves; the others of who are left to their threads (as while
 * their trainers compute), then return the view too: 1 when each one's
 * is of members want */
static int slow_round(struct mesh_elastic **e, struct agreer *a, uint64_t who,
                      uint64_t want)
{
    for (int i = 0; i < SLOW_N; i++)
        if (who >> i & 1) {
            a[i].e = e[i];
            agree_main(&a[i]);
        }
    for (int i = 0; i < SLOW_N; i++)
        if ((who >> i & 1) && (a[i].rc != 0 || a[i].v.members != want))
            return 0;
    return 1;
}

/*
 * Start n slots' view threads on 127.0.0.1 ports port..port+n-1 (peers and
 * w filled here). On a failure, names the slot, stops the ones started and
 * returns the error.
 */
static int start_slots(int n, uint16_t port, struct mesh_peer *peers,
                       struct mesh_world *w, struct mesh_elastic **e,
                       const char *job_id, double wait_s)
{
    static const uint8_t secret[] = "test_elastic secret";

    memset(peers, 0, (size_t)n * sizeof(*peers));
    for (int i = 0; i < n; i++) {
        snprintf(peers[i].host, sizeof(peers[i].host), "127.0.0.1");
        peers[i].port = (uint16_t)(port + i);
    }
    for (int i = 0; i < n; i++) {
        struct mesh_elastic_opts o;
        int rc;

        w[i].rank = i;
        w[i].size = n;
        w[i].peers = peers;
        memset(&o, 0, sizeof(o));
        o.world = &w[i];
        o.secret = secret;
        o.secret_len = sizeof(secret) - 1;
        o.job_id = job_id;
        o.settle_s = 0.15;
        o.wait_s = wait_s;
        o.fd = -1;
        rc = mesh_elastic_start(&o, &e[i]);
        if (rc < 0) {
            ok(0, "slot %d starts its view thread: %s", i, mesh_err_msg(rc));
            while (i-- > 0)
                mesh_elastic_stop(e[i]);
            return rc;
        }
    }
    return 0;
}

static void test_slow_voter(void)
{
    struct mesh_peer peers[SLOW_N];
    struct mesh_world w[SLOW_N];
    struct mesh_elastic *e[SLOW_N];
    struct agreer a[SLOW_N];
    pthread_t th[SLOW_N];
    uint16_t port = test_ports_pick(SLOW_N);
    char buf[200];
    double t0;
    int i, rc, good;

    if (!port) {
        for (i = 0; i < 5; i++)
            skip("no free block of %d ports", SLOW_N);
        return;
    }
    if (start_slots(SLOW_N, port, peers, w, e, "test_elastic slow",
                    SLOW_WAIT_S) < 0)
        return;

    /* view 1 = {0,1,2,3}: slot 4 never started (it has not probed, so it
     * takes no part); view 0 never formed, so the settle time decides */
    good = 1;
    for (i = 0; i < 4; i++)
        good &= mesh_elastic_probe(e[i], 5.0) == 0;
    for (i = 0; i < 4; i++) {
        a[i].e = e[i];
        pthread_create(&th[i], NULL, agree_main, &a[i]);
    }
    for (i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        good &= a[i].rc == 0 && a[i].v.epoch == 1 && a[i].v.members == 0xf;
    }
    for (i = 0; i < 4; i++) {
        mesh_elastic_formed(e[i]);
        good &= mesh_elastic_commit(e[i], 5) == 0;
    }
    ok(good, "slots 0-3 of 5 form view 1 and commit step 5 (slot 0: %s)",
       view_str(&a[0], buf, sizeof(buf)));

    /* slot 4 asks to join; slot 2 will be slow to vote */
    mesh_elastic_test_stall(e[2], 0.4);
    rc = mesh_elastic_probe(e[4], 10.0);
    a[4].e = e[4];
    pthread_create(&th[4], NULL, agree_main, &a[4]);
    for (i = 0; i < 1000 && !(mesh_elastic_joins(e[0]) >> 4 & 1); i++)
        usleep(10000);
    /* (slot 4's agree_main runs in th[4]) */
    good = slow_round(e, a, 0xf, 0x1f);
    pthread_join(th[4], NULL);
    for (i = 0; i < SLOW_N; i++)
        good &= a[i].rc == 0 && a[i].v.epoch == 2 && a[i].v.members == 0x1f &&
                a[i].v.needy == 0x10 && a[i].v.step == 5;
    ok(rc == 1 && good,
       "slot 2, slow to vote, is in the view that admits slot 4: view 2 of "
       "slots 0-4 on every slot (probe %d; slot 2: %s)",
       rc, view_str(&a[2], buf, sizeof(buf)));

    /* view 2 formed; slot 4 dies (its thread stalls for good) and slot
     * 0's mesh blames it; slot 2 is slow again */
    good = 1;
    for (i = 0; i < SLOW_N; i++) {
        mesh_elastic_formed(e[i]);
        good &= mesh_elastic_commit(e[i], 6) == 0;
    }
    mesh_elastic_test_stall(e[4], 30.0);
    mesh_elastic_test_stall(e[2], 0.4);
    fake_culprit_rank = 4; /* view rank 4 = slot 4 */
    mesh_elastic_set_failure(e[0], -ECONNRESET);
    mesh_elastic_set_transport(e[0], &fake_dead_ops,
                               (mesh_transport_t *)&aborts);
    mesh_elastic_set_transport(e[0], NULL, NULL); /* takes the culprit */
    good &= slow_round(e, a, 0xf, 0xf);
    ok(good && a[0].v.epoch == 3 && a[0].v.left == 0x10 && a[0].v.step == 6,
       "a death known, slot 2 (slow) is still waited for: view 3 of slots "
       "0-3 (slot 2: %s)",
       view_str(&a[2], buf, sizeof(buf)));

    /* view 3 formed; slot 1 stops voting for good */
    good = 1;
    for (i = 0; i < 4; i++) {
        mesh_elastic_formed(e[i]);
        good &= mesh_elastic_commit(e[i], 7) == 0;
    }
    mesh_elastic_test_stall(e[1], 30.0);
    t0 = mesh_now_s();
    a[0].e = e[0];
    agree_main(&a[0]);
    diag("view 4 decided %.2f s after slot 0 left view 3 (wait %.1f s)",
         mesh_now_s() - t0, SLOW_WAIT_S);
    ok(good && a[0].rc == 0 && a[0].v.epoch == 4 && a[0].v.members == 0xd &&
           a[0].v.left == 0x2 && a[0].v.step == 7,
       "slot 1, silent past --peer-timeout, is left out of view 4 (%s)",
       view_str(&a[0], buf, sizeof(buf)));
    good = 1;
    for (i = 2; i < 4; i++) {
        a[i].e = e[i];
        agree_main(&a[i]);
        good &= a[i].rc == 0 && a[i].v.epoch == 4 && a[i].v.members == 0xd;
    }
    ok(good, "slots 2 and 3 join view 4 too (slot 3: %s)",
       view_str(&a[3], buf, sizeof(buf)));
    for (i = 0; i < SLOW_N; i++)
        mesh_elastic_stop(e[i]);
}

/* The cell hash of len bytes of p, by its definition. */
static void cells_by_hand(const uint8_t *p, size_t len, uint8_t out[32])
{
    size_t n = len ? (len + TRAIN_WCELL - 1) / TRAIN_WCELL : 1;
    uint8_t *list = calloc(n, 32);

    for (size_t c = 0; list && c < n; c++)
        EVP_Digest(p + c * TRAIN_WCELL,
                   len ? MESH_MIN((size_t)TRAIN_WCELL, len - c * TRAIN_WCELL)
                       : 0,
                   list + 32 * c, NULL, EVP_sha256(), NULL);
    EVP_Digest(list, 32 * n, out, NULL, EVP_sha256(), NULL);
    free(list);
}

static void test_cell_hash(void)
{
    size_t lens[] = {0, 1000, TRAIN_WCELL, 2 * TRAIN_WCELL + 12345};
    size_t len = lens[3];
    uint8_t *p = malloc(len), a[32], b[32], c[32], whole[32];
    uint32_t seed = 7;
    struct train_wch w = {0};
    int good = p != NULL, rc = 0;

    for (size_t i = 0; p && i < len; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
    for (int k = 0; good && k < 4; k++) {
        train_wch_sum(p, lens[k], a);
        cells_by_hand(p, lens[k], b);
        good = !memcmp(a, b, 32);
    }
    ok(good, "a cell hash is the SHA-256 of its 4 MiB cells' SHA-256s "
             "(0, 1000 bytes, one cell, 2 cells and a part)");
    /* fed in pieces across the cells' edges */
    if (p) {
        size_t cut[] = {7, TRAIN_WCELL - 7, TRAIN_WCELL + 1,
                        2 * TRAIN_WCELL + 5, len};
        size_t at = 0;

        rc = train_wch_init(&w, len);
        for (int k = 0; k < 5 && rc == 0; k++) {
            rc = train_wch_feed(&w, p + at, cut[k] - at);
            at = cut[k];
        }
        if (rc == 0)
            rc = train_wch_final(&w, c);
        train_wch_free(&w);
    }
    ok(p && rc == 0 && !memcmp(a, c, 32),
       "fed in pieces across the cells' edges, the same hash (%d)", rc);
    if (p)
        EVP_Digest(p, len, whole, NULL, EVP_sha256(), NULL);
    ok(p && memcmp(a, whole, 32), "it is not the SHA-256 of the bytes");
    good = p != NULL;
    for (size_t i = 0; good && i < len; i += TRAIN_WCELL - 1) {
        p[i] ^= 1;
        train_wch_sum(p, len, b);
        good = memcmp(a, b, 32) != 0;
        p[i] ^= 1;
    }
    ok(good, "a bit flipped anywhere changes it");
    free(p);
}

int main(void)
{
    struct mesh_peer peers[N];
    struct mesh_world w[N];
    struct mesh_elastic *el[N];
    struct mesh_elastic_view v, l;
    uint16_t port = test_ports_pick(N);
    int rc, i, bad = 0;

    if (!port) {
        skip_all("no free block of %d ports", N);
        return 0;
    }
    plan(20);
    test_cell_hash();
    if (start_slots(N, port, peers, w, el, "test_elastic", 0) < 0)
        return done();
    for (i = 0; i < N; i++) {
        mesh_elastic_formed(el[i]); /* view 0 (every slot) formed */
        bad += mesh_elastic_commit(el[i], 5) < 0;
    }
    ok(!bad, "3 slots in view 0 commit step 5");

    /* slot 2 leaves; slots 0 and 1 are left to their threads */
    rc = mesh_elastic_agree(el[2], 20.0, &l);
    ok(rc == 0 && l.epoch == 1 && l.members == 7 && l.step == 5,
       "slot 2 leaves view 0: view 1 of slots 0,1,2 from step 5 (rc %d, "
       "view %llu, members %#llx, step %llu)",
       rc, (unsigned long long)l.epoch, (unsigned long long)l.members,
       (unsigned long long)l.step);

    /* the threads of slots 0 and 1 adopt it without their trainers */
    for (i = 0; i < 2000; i++) {
        mesh_elastic_current(el[0], &v);
        if (v.epoch == 1)
            break;
        usleep(10000);
    }
    ok(v.epoch == 1, "slot 0's thread adopts view 1 on its own (view %llu)",
       (unsigned long long)v.epoch);

    /* the regression: slot 0's next boundary saw NORMAL and committed */
    rc = mesh_elastic_commit(el[0], 6);
    ok(rc == -ECANCELED,
       "slot 0's next boundary does not commit step 6 in the view it left "
       "(%d, want -ECANCELED)",
       rc);
    rc = mesh_elastic_commit(el[0], 6);
    ok(rc == -ECANCELED, "nor at the boundary after (%d)", rc);
    /* a mesh of view 0 that its trainer finishes opening now (late: its
     * thread adopted view 1) is superseded: aborted at once, as during
     * an agreement. It was not, and went on opening in view 0 */
    mesh_elastic_set_transport(el[0], &fake_ops, (mesh_transport_t *)&aborts);
    ok(aborts == 1,
       "a mesh set after the thread adopted a later view is aborted at "
       "once (%d abort(s))",
       aborts);
    mesh_elastic_set_transport(el[0], NULL, NULL);

    rc = mesh_elastic_agree(el[0], 20.0, &v);
    ok(rc == 0 && v.epoch == 1 && v.members == 7 && v.step == 5 && v.left == 0,
       "slot 0 then joins view 1 from step 5, none left (rc %d, view %llu, "
       "step %llu)",
       rc, (unsigned long long)v.epoch, (unsigned long long)v.step);
    rc = mesh_elastic_commit(el[0], 6);
    ok(rc == 0, "in view 1 slot 0 commits step 6 again (%d)", rc);

    rc = mesh_elastic_agree(el[1], 20.0, &v);
    ok(rc == 0 && v.epoch == 1 && v.step == 5,
       "slot 1 joins view 1 from step 5 too (rc %d, view %llu, step %llu)", rc,
       (unsigned long long)v.epoch, (unsigned long long)v.step);
    ok(mesh_elastic_commit(el[1], 6) == 0 && mesh_elastic_commit(el[2], 6) == 0,
       "slots 1 and 2 commit step 6 in view 1");

    for (i = 0; i < N; i++)
        mesh_elastic_stop(el[i]);
    test_joiners_refuse_nobody();
    test_slow_voter();
    return done();
}
