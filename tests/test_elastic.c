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
 */
#include "config.h"

#include "common/util.h"
#include "tests/ports.h"
#include "tests/tap.h"
#include "train/elastic.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
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

int main(void)
{
    static const uint8_t secret[] = "test_elastic secret";
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
    plan(10);
    memset(peers, 0, sizeof(peers));
    for (i = 0; i < N; i++) {
        snprintf(peers[i].host, sizeof(peers[i].host), "127.0.0.1");
        peers[i].port = (uint16_t)(port + i);
    }
    for (i = 0; i < N; i++) {
        struct mesh_elastic_opts o;

        w[i].rank = i;
        w[i].size = N;
        w[i].peers = peers;
        memset(&o, 0, sizeof(o));
        o.world = &w[i];
        o.secret = secret;
        o.secret_len = sizeof(secret) - 1;
        o.job_id = "test_elastic";
        o.settle_s = 0.15;
        o.fd = -1;
        rc = mesh_elastic_start(&o, &el[i]);
        if (rc < 0) {
            ok(0, "slot %d starts its view thread: %s", i, mesh_err_msg(rc));
            return done();
        }
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
    return done();
}
