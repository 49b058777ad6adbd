/*
 * tests/verbs/test_verbs.c: what only the verbs transport can get wrong,
 * on a real RDMA device (Soft-RoCE in the lane's QEMU guest).
 *
 *   tests/verbs/test_verbs
 *
 * Two ranks on 127.0.0.1 (the TCP mesh underneath), forked per scenario:
 *   - a write with a wrong rkey: both ranks fail naming the completion
 *     status, and the receive buffer is untouched;
 *   - a write past the receive window (the CTS bound check bypassed by a
 *     test hook): the HCA refuses it at the registration's end, and the
 *     guard bytes right after the window, in the same page, are untouched;
 *   - a receive's last write on another QP than its slot's, and a
 *     clear-to-send of the wrong generation (test hooks): the peer's
 *     checks (transport/verbs/wire.c) fail both ranks naming the field;
 *   - 300 collectives back to back on registered buffers: right results,
 *     and the registration count returns to where it started;
 *   - --transport auto picks RDMA where every rank has an active port;
 *   - side channels (transport/transport.h; the catch-up's RDMA reads):
 *     two in one process read 5 MiB + 123 bytes (two pieces) exactly;
 *     a garbage address, a wrapping range, an unregistered destination
 *     are refused before any post, and a wrong rkey or a range past the
 *     registration fails the read with the completion's status.
 * Without an RDMA device with an active port: a TAP skip with the reason.
 */
#include "config.h"

#include "collective/collective.h"
#include "common/util.h"
#include "tests/ports.h"
#include "tests/tap.h"
#include "transport/transport.h"
#include "transport/shm/shm.h"
#include "transport/verbs/verbs.h"

#include <infiniband/verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSG 1024

static const char *secret = "verbs lane secret, thirty-two b!";

struct two {
    int rank;
    int streams; /* QPs per peer, 0: the default */
    uint16_t base;
    struct mesh_peer peers[2];
    struct mesh_world w;
    struct mesh_transport_opts o;
    const struct mesh_transport_ops *ops;
    mesh_transport_t *t;
};

static int up(struct two *x, const char *name, char *msg)
{
    int rc;

    for (int i = 0; i < 2; i++) {
        snprintf(x->peers[i].host, sizeof(x->peers[i].host), "127.0.0.1");
        x->peers[i].port = (uint16_t)(x->base + i);
    }
    x->w.rank = x->rank;
    x->w.size = 2;
    x->w.peers = x->peers;
    mesh_transport_opts_init(&x->o);
    x->o.secret = (const uint8_t *)secret;
    x->o.secret_len = strlen(secret);
    x->o.peer_timeout_s = 3.0;
    if (x->streams)
        x->o.streams = x->streams;
    x->ops = mesh_transport_find(name);
    if (!x->ops) {
        snprintf(msg, MSG, "transport %s not built", name);
        return -1;
    }
    rc = x->ops->listen(&x->w, &x->o, &x->t);
    if (rc == 0)
        rc = x->ops->connect(x->t);
    if (rc < 0)
        snprintf(msg, MSG, "join: %s", mesh_err_msg(rc));
    return rc;
}

/*
 * Rank 1 sends 64 KiB to rank 0 with the test hook hook set on the sender
 * (BAD_RKEY: a broken rkey; OVERRUN: past the window of a 4 KiB
 * registration inside a 64 KiB allocation; IMM_QP) or on the receiver
 * (CTS_GEN): both must fail; for BAD_RKEY and OVERRUN, rank 0's buffer
 * untouched.
 */
static int bad_verbs(struct two *x, int hook, char *msg)
{
    int overrun = hook == VERBS_DEBUG_OVERRUN;
    const size_t win = overrun ? 4096 : 65536, alloc = 65536;
    struct mesh_frame f = {.seq = 1,
                           .op = MESH_OP_P2P,
                           .dtype = MESH_DT_BYTE,
                           .count = win,
                           .length = win};
    uint8_t *buf;
    mesh_mr_t *mr = NULL;
    mesh_req_t *r;
    int rc;

    if (up(x, "verbs", msg) < 0)
        return -1;
    if (mesh_host_alloc(alloc, (void **)&buf) < 0) {
        snprintf(msg, MSG, "out of memory");
        return -1;
    }
    memset(buf, x->rank ? 0x11 : 0xee, alloc);
    rc = x->ops->reg_mr(x->t, buf, win, &mr);
    if (rc < 0) {
        snprintf(msg, MSG, "reg_mr: %s", mesh_err_msg(rc));
        return -1;
    }
    if (x->rank == (hook == VERBS_DEBUG_CTS_GEN ? 0 : 1))
        mesh_verbs_debug_set(hook);
    if (x->rank == 1)
        rc = x->ops->isend(x->t, 0, &f, buf, mr, &r);
    else
        rc = x->ops->irecv(x->t, 1, &f, buf, mr, &r);
    if (rc == 0)
        rc = mesh_transport_wait(x->ops, x->t, r);
    /* IMM_QP: the writes themselves succeed, the send with them; the
     * receiver's refusal comes as its notice, to the next operation */
    if (rc == 0 && x->rank == 1 && hook == VERBS_DEBUG_IMM_QP) {
        rc = x->ops->irecv(x->t, 0, &f, buf, mr, &r);
        if (rc == 0)
            rc = mesh_transport_wait(x->ops, x->t, r);
    }
    if (rc == 0) {
        snprintf(msg, MSG, "rank %d: no error", x->rank);
        return -1;
    }
    snprintf(msg, MSG, "%s", mesh_err_msg(rc));
    if (x->rank == 0 &&
        (hook == VERBS_DEBUG_BAD_RKEY || hook == VERBS_DEBUG_OVERRUN))
        for (size_t i = 0; i < alloc; i++)
            if (buf[i] != 0xee) {
                snprintf(msg, MSG,
                         "byte %zu of the receive buffer changed "
                         "(0x%02x) although the job failed",
                         i, buf[i]);
                return -1;
            }
    return 0;
}

static int child_rkey(struct two *x, char *msg)
{
    return bad_verbs(x, VERBS_DEBUG_BAD_RKEY, msg);
}

static int child_overrun(struct two *x, char *msg)
{
    return bad_verbs(x, VERBS_DEBUG_OVERRUN, msg);
}

static int child_imm_qp(struct two *x, char *msg)
{
    x->streams = 2;
    return bad_verbs(x, VERBS_DEBUG_IMM_QP, msg);
}

static int child_cts_gen(struct two *x, char *msg)
{
    return bad_verbs(x, VERBS_DEBUG_CTS_GEN, msg);
}

/* 300 all-reduces (sizes 1 float .. 256 Ki floats) on registered buffers,
 * then the registration count must be back where it started. */
static int child_many(struct two *x, char *msg)
{
    const size_t maxn = 256 * 1024;
    mesh_coll_t *c;
    float *buf;
    int live0, live10 = -1, live_end, rc;

    if (up(x, "verbs", msg) < 0)
        return -1;
    live0 = mesh_verbs_mr_live(x->t);
    rc = mesh_coll_create(x->ops, x->t, &x->w, NULL, &c);
    if (rc < 0) {
        snprintf(msg, MSG, "coll_create: %s", mesh_err_msg(rc));
        return -1;
    }
    rc = mesh_coll_buf_alloc(c, maxn * sizeof(float), (void **)&buf);
    if (rc < 0) {
        snprintf(msg, MSG, "buf_alloc: %s", mesh_err_msg(rc));
        return -1;
    }
    for (int it = 0; it < 300; it++) {
        size_t n = (size_t)1 << (it % 19);

        for (size_t i = 0; i < n; i++)
            buf[i] = (float)(x->rank + 1) * (float)(i % 1000 + it % 7);
        rc = mesh_coll_allreduce(c, buf, buf, n, MESH_DT_F32, MESH_REDOP_SUM,
                                 MESH_ALGO_AUTO);
        if (rc < 0) {
            snprintf(msg, MSG, "allreduce %d (%zu floats): %s", it, n,
                     mesh_err_msg(rc));
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            if (buf[i] != 3.0f * (float)(i % 1000 + it % 7)) {
                snprintf(msg, MSG, "allreduce %d: element %zu is %g", it, i,
                         (double)buf[i]);
                return -1;
            }
        if (it == 19)
            live10 = mesh_verbs_mr_live(x->t);
    }
    if (mesh_verbs_mr_live(x->t) != live10) {
        snprintf(msg, MSG,
                 "registrations grew from %d to %d over 280 "
                 "all-reduces",
                 live10, mesh_verbs_mr_live(x->t));
        return -1;
    }
    mesh_coll_buf_free(c, buf);
    mesh_coll_destroy(c);
    live_end = mesh_verbs_mr_live(x->t);
    snprintf(msg, MSG, "registrations: %d before, %d during, %d after", live0,
             live10, live_end);
    x->ops->close(x->t);
    x->t = NULL;
    return live_end == live0 ? 0 : -1;
}

/*
 * auto: shared memory within a host, verbs between hosts. The two ranks
 * pretend to be two hosts (MESHTRAIN_SHM_TEST_HOST, a test double of a
 * second machine) unless same_host.
 */
static int auto_on(struct two *x, char *msg, int same_host)
{
    int rdma, local;

    if (!same_host)
        setenv("MESHTRAIN_SHM_TEST_HOST", x->rank ? "b" : "a", 1);
    if (up(x, "auto", msg) < 0)
        return -1;
    rdma = mesh_verbs_active(mesh_shm_inner(x->t));
    local = mesh_shm_local(x->t, 1 - x->rank);
    snprintf(msg, MSG, "%s, peer by %s", rdma ? "rdma" : "tcp",
             local ? "shared memory" : "verbs");
    return rdma && local == same_host ? 0 : -1;
}

static int child_auto(struct two *x, char *msg)
{
    return auto_on(x, msg, 0);
}

static int child_auto_local(struct two *x, char *msg)
{
    return auto_on(x, msg, 1);
}

/* Fork both ranks; msgs gets each one's line; returns 0 if both said 0. */
static int run2(int (*fn)(struct two *, char *), char msgs[2][MSG],
                double timeout_s)
{
    pid_t pid[2];
    int fds[2][2], st, good = 1;
    uint16_t base = test_ports_pick(2);

    if (!base) {
        snprintf(msgs[0], MSG, "no free ports");
        snprintf(msgs[1], MSG, "no free ports");
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        if (pipe(fds[i]) < 0)
            return -1;
        pid[i] = fork();
        if (pid[i] < 0)
            return -1;
        if (pid[i] == 0) {
            struct two x;
            char m[MSG] = "";
            int rc;

            memset(&x, 0, sizeof(x));
            x.rank = i;
            x.base = base;
            close(fds[i][0]);
            alarm((unsigned)timeout_s);
            rc = fn(&x, m);
            if (write(fds[i][1], m, strlen(m)) < 0)
                _exit(3);
            if (x.t)
                x.ops->close(x.t);
            _exit(rc == 0 ? 0 : 1);
        }
        close(fds[i][1]);
    }
    for (int i = 0; i < 2; i++) {
        ssize_t k;

        waitpid(pid[i], &st, 0);
        k = read(fds[i][0], msgs[i], MSG - 1);
        msgs[i][k > 0 ? k : 0] = '\0';
        close(fds[i][0]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            good = 0;
        if (WIFSIGNALED(st))
            snprintf(msgs[i], MSG, "killed by signal %d", WTERMSIG(st));
    }
    return good ? 0 : -1;
}

/* ---- side channels ------------------------------------------------------ */

/* Two side channels a and b on d, connected to each other. */
static int side_pair(mesh_side_dev_t *d, mesh_side_t **a, mesh_side_t **b)
{
    uint8_t aa[MESH_SIDE_ADDR], ba[MESH_SIDE_ADDR];
    int rc;

    *a = *b = NULL;
    rc = mesh_side_open(d, 3.0, a);
    if (rc == 0)
        rc = mesh_side_open(d, 3.0, b);
    if (rc == 0) {
        mesh_side_addr(*a, aa);
        mesh_side_addr(*b, ba);
        rc = mesh_side_connect(*a, ba);
    }
    if (rc == 0)
        rc = mesh_side_connect(*b, aa);
    return rc;
}

/* Poll b's read to its end (60 s at most: TCG on a loaded host): 1
 * done, or < 0. */
static int side_wait(mesh_side_t *b, size_t *done)
{
    double until = mesh_now_s() + 60;

    while (mesh_now_s() < until) {
        int rc = mesh_side_poll(b, done);

        if (rc != 0)
            return rc;
        usleep(100);
    }
    return mesh_err(-ETIMEDOUT, "the read did not end in 60 s");
}

static void check_side(void)
{
    struct mesh_transport_opts o;
    mesh_side_dev_t *d = NULL;
    mesh_side_t *a = NULL, *b = NULL;
    size_t n = (5u << 20) + 123, done = 0;
    uint8_t *src = malloc(n), *dst = malloc(n + 64), bad[MESH_SIDE_ADDR];
    uint64_t ra = 0;
    uint32_t rk = 0;
    int rc, good = 1;

    mesh_transport_opts_init(&o);
    rc = mesh_side_dev_open(&o, &d);
    ok(rc == 0, "side channels: the device opens (%s)",
       rc ? mesh_err_msg(rc) : mesh_side_dev_name(d));
    if (rc || !src || !dst) {
        free(src);
        free(dst);
        return;
    }
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)(i * 131 + (i >> 13));
    memset(dst, 0xee, n + 64);
    rc = side_pair(d, &a, &b);
    if (rc == 0)
        rc = mesh_side_reg(a, src, n, 1, &ra, &rk);
    if (rc == 0)
        rc = mesh_side_reg(b, dst, n + 64, 0, NULL, NULL);
    if (rc == 0)
        rc = mesh_side_read(b, dst, n, ra, rk);
    if (rc == 0)
        rc = side_wait(b, &done);
    for (size_t i = n; i < n + 64; i++)
        good &= dst[i] == 0xee;
    ok(rc == 1 && done == n && !memcmp(src, dst, n) && good,
       "side channels: %zu bytes read over RDMA exactly, nothing past them "
       "(%s)",
       n, rc < 0 ? mesh_err_msg(rc) : "ok");

    /* refused before anything is posted */
    memset(bad, 0, sizeof(bad));
    rc = mesh_side_connect(b, bad);
    ok(rc == -EPROTO, "side channels: a zero address is refused: %s",
       mesh_err_msg(rc));
    rc = mesh_side_read(b, dst, 64, UINT64_MAX - 10, rk);
    ok(rc == -EPROTO, "side channels: a remote range that wraps is refused: %s",
       mesh_err_msg(rc));
    rc = mesh_side_read(b, src, 64, ra, rk);
    ok(rc == -EINVAL,
       "side channels: a destination outside the registrations is "
       "refused: %s",
       mesh_err_msg(rc));
    rc = mesh_side_read(b, dst, n + 65, ra, rk);
    ok(rc == -EINVAL,
       "side channels: a read past the destination's registration is "
       "refused: %s",
       mesh_err_msg(rc));
    mesh_side_close(b);
    mesh_side_close(a);

    /* the remote HCA refuses: a wrong rkey; a range past the region */
    for (int k = 0; k < 2; k++) {
        rc = side_pair(d, &a, &b);
        if (rc == 0)
            rc = mesh_side_reg(a, src, 4096, 1, &ra, &rk);
        if (rc == 0)
            rc = mesh_side_reg(b, dst, n, 0, NULL, NULL);
        memset(dst, 0xee, 8192);
        if (rc == 0)
            rc =
                mesh_side_read(b, dst, k ? 8192 : 4096, ra, k ? rk : rk ^ 0x5a);
        if (rc == 0)
            rc = side_wait(b, &done);
        ok(rc < 0 && strstr(mesh_err_msg(rc), "remote") && dst[0] == 0xee,
           "side channels: %s fails the read: %s",
           k ? "a range past the registration" : "a wrong rkey",
           rc < 0 ? mesh_err_msg(rc) : "it succeeded");
        mesh_side_close(b);
        mesh_side_close(a);
    }

    /* a peer that never answers: its queue pair is never connected (the
     * catch-up's MESHTRAIN_TEST_SIDE=silent), then one that stops
     * answering mid-transfer (closed after a first read). Each read
     * fails once its queue pair's retries are spent, within the peer
     * timeout (side_pair's 3 s; twice that allows for a loaded guest),
     * not never */
    for (int k = 0; k < 2; k++) {
        uint8_t aa[MESH_SIDE_ADDR];
        double t0, el = 0;

        a = b = NULL;
        rc = mesh_side_open(d, 3.0, &a);
        if (rc == 0)
            rc = mesh_side_open(d, 3.0, &b);
        if (rc == 0)
            rc = mesh_side_reg(a, src, 4096, 1, &ra, &rk);
        if (rc == 0)
            rc = mesh_side_reg(b, dst, n, 0, NULL, NULL);
        if (rc == 0) {
            uint8_t ba[MESH_SIDE_ADDR];

            mesh_side_addr(a, aa);
            mesh_side_addr(b, ba);
            rc = mesh_side_connect(b, aa);
            if (rc == 0 && k == 1)
                rc = mesh_side_connect(a, ba);
        }
        if (rc == 0 && k == 1) {
            /* a first read is answered; then the peer goes */
            rc = mesh_side_read(b, dst, 4096, ra, rk);
            if (rc == 0)
                rc = side_wait(b, &done);
            rc = rc == 1 && !memcmp(src, dst, 4096) ? 0 : rc < 0 ? rc : -EIO;
            mesh_side_close(a);
            a = NULL;
        }
        t0 = mesh_now_s();
        if (rc == 0)
            rc = mesh_side_read(b, dst, 4096, ra, rk);
        if (rc == 0)
            rc = side_wait(b, &done);
        el = mesh_now_s() - t0;
        ok(rc < 0 && el <= 6.0,
           "side channels: a peer that %s: the read fails in %.1f s (peer "
           "timeout 3 s): %s",
           k ? "stops answering mid-transfer" : "never answers", el,
           rc < 0 ? mesh_err_msg(rc) : "it succeeded");
        mesh_side_close(b);
        mesh_side_close(a);
    }
    mesh_side_dev_close(d);
    free(src);
    free(dst);
}

/* An RDMA device with an active port, or why not. */
static int have_rdma(char *why, size_t len)
{
    struct ibv_device **list;
    int n = 0, found = 0;

    list = ibv_get_device_list(&n);
    if (!list || !n) {
        snprintf(why, len,
                 "no RDMA device (the verbs lane boots Soft-RoCE "
                 "in QEMU: tests/verbs/lane.sh)");
        if (list)
            ibv_free_device_list(list);
        return 0;
    }
    for (int i = 0; i < n && !found; i++) {
        struct ibv_context *ctx = ibv_open_device(list[i]);
        struct ibv_port_attr pa;

        if (!ctx)
            continue;
        found = !ibv_query_port(ctx, 1, &pa) && pa.state == IBV_PORT_ACTIVE;
        ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    if (!found)
        snprintf(why, len, "no RDMA device has an active port 1");
    return found;
}

int main(void)
{
    char m[2][MSG], why[200];
    int rc;

    signal(SIGPIPE, SIG_IGN);
    if (!have_rdma(why, sizeof(why))) {
        skip_all("%s", why);
        return 0;
    }

    rc = run2(child_rkey, m, 60);
    ok(rc == 0 && strstr(m[1], "remote") && strstr(m[0], "rank 1"),
       "a write with a wrong rkey fails both ranks, buffer untouched");
    diag("rank 0: %s", m[0]);
    diag("rank 1: %s", m[1]);

    rc = run2(child_overrun, m, 60);
    ok(rc == 0 && strstr(m[1], "remote") && strstr(m[0], "rank 1"),
       "a write past the window is refused at the registration's end, "
       "guard bytes untouched");
    diag("rank 0: %s", m[0]);
    diag("rank 1: %s", m[1]);

    rc = run2(child_imm_qp, m, 60);
    ok(rc == 0 && strstr(m[0], "not on the slot's QP 0") &&
           strstr(m[0], "rank 1 (") && strstr(m[1], "rank 1 ("),
       "a receive's last write on another QP than its slot's fails both "
       "ranks, naming the writer and the QP");
    diag("rank 0: %s", m[0]);
    diag("rank 1: %s", m[1]);

    rc = run2(child_cts_gen, m, 60);
    ok(rc == 0 && strstr(m[1], "with generation 2, expected 1") &&
           strstr(m[1], "rank 0 (") && strstr(m[0], "rank 0 ("),
       "a clear-to-send of the wrong generation fails both ranks, naming "
       "its sender and the generation");
    diag("rank 0: %s", m[0]);
    diag("rank 1: %s", m[1]);

    rc = run2(child_many, m, 300);
    ok(rc == 0,
       "300 all-reduces back to back: right sums, no leaked "
       "registrations (%s)",
       m[0]);
    if (rc)
        diag("rank 1: %s", m[1]);

    rc = run2(child_auto, m, 60);
    ok(rc == 0,
       "--transport auto chooses RDMA between two hosts when both ranks "
       "have an active port (%s, %s)",
       m[0], m[1]);
    rc = run2(child_auto_local, m, 60);
    ok(rc == 0,
       "--transport auto: ranks of one host share memory, verbs beside "
       "(%s, %s)",
       m[0], m[1]);
    check_side();
    return done();
}
