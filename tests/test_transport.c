/*
 * tests/test_transport.c: one transport, real processes on 127.0.0.1.
 *
 *   tests/test_transport [TRANSPORT]     (default "tcp")
 *
 * Transport-generic: every check goes through mesh_transport_find(), so the
 * verbs transport re-runs the same suite. Each scenario forks its peers
 * (ports from tests/ports.h), builds the world itself and
 * collects one result line per child through a pipe; children's logs go to
 * files that the parent reads back to check the refusal lines. The parent
 * prints TAP.
 */
#include "config.h"

#include "common/util.h"
#include "tests/ports.h"
#include "tests/tap.h"
#include "transport/shm/shm.h"
#include "transport/tcp/tcp.h"
#include "transport/transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXP 8
#define MSG  2048

static const struct mesh_transport_ops *ops;
static const char *secret = "correct horse battery staple, 32b";
static const char *config = "model=resnet50\nbatch=32\nlr=0.1\n";
static const char *test_host = "127.0.0.1";

/* ---- worlds ------------------------------------------------------------ */

struct world_cfg {
    int n;
    int streams;
    double peer_timeout_s;
    double join_timeout_s;
    int insecure;
};

struct ctx {
    int rank;
    struct world_cfg cfg;
    uint16_t base;
    struct mesh_peer peers[MAXP];
    struct mesh_world w;
    struct mesh_transport_opts o;
    mesh_transport_t *t;
    int ready_fd; /* child -> parent: one byte when set up */
    int go_fd;    /* parent -> child: one byte to go on */
};

/* n + 1 free consecutive ports (the last one for an extra client). */
static uint16_t pick_ports(int n)
{
    return test_ports_pick(n + 1);
}

static void world_build(struct ctx *cx)
{
    for (int i = 0; i < cx->cfg.n; i++) {
        snprintf(cx->peers[i].host, sizeof(cx->peers[i].host), "%s", test_host);
        cx->peers[i].port = (uint16_t)(cx->base + i);
        cx->peers[i].local_rank = i;
    }
    cx->w.rank = cx->rank;
    cx->w.size = cx->cfg.n;
    cx->w.peers = cx->peers;
    mesh_transport_opts_init(&cx->o);
    cx->o.streams = cx->cfg.streams;
    cx->o.peer_timeout_s = cx->cfg.peer_timeout_s;
    cx->o.join_timeout_s = cx->cfg.join_timeout_s;
    if (cx->cfg.insecure) {
        cx->o.insecure = 1;
    } else {
        cx->o.secret = (const uint8_t *)secret;
        cx->o.secret_len = strlen(secret);
    }
    snprintf(cx->o.job_id, sizeof(cx->o.job_id), "test-job");
    snprintf(cx->o.config, sizeof(cx->o.config), "%s", config);
}

static int mesh_up(struct ctx *cx, char *msg, size_t len)
{
    int rc;

    world_build(cx);
    rc = ops->listen(&cx->w, &cx->o, &cx->t);
    if (rc < 0) {
        snprintf(msg, len, "listen: %s", mesh_err_msg(rc));
        return rc;
    }
    rc = ops->connect(cx->t);
    if (rc < 0) {
        snprintf(msg, len, "%s", mesh_err_msg(rc));
        return rc;
    }
    return 0;
}

/*
 * The end of a child whose last operation must fail: rc < 0 gives its
 * error as the message and 0; rc >= 0 is the test's failure (-1), worded
 * as fmt says.
 */
static int must_fail(int rc, char *msg, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int must_fail(int rc, char *msg, size_t len, const char *fmt, ...)
{
    va_list ap;

    if (rc >= 0) {
        va_start(ap, fmt);
        vsnprintf(msg, len, fmt, ap);
        va_end(ap);
        return -1;
    }
    snprintf(msg, len, "%s", mesh_err_msg(rc));
    return 0;
}

static void signal_ready(struct ctx *cx)
{
    char b = 'R';

    if (write(cx->ready_fd, &b, 1) != 1)
        _exit(3);
}

static void wait_go(struct ctx *cx)
{
    char b;

    if (read(cx->go_fd, &b, 1) != 1)
        _exit(4);
}

typedef int (*child_fn)(struct ctx *cx, char *msg, size_t len);

struct run {
    int n;
    pid_t pid[MAXP];
    int res_fd[MAXP];
    int ready_fd; /* parent reads */
    int go_fd;    /* parent writes */
    char logs[MAXP][128];
    char msg[MAXP][MSG];
    int status[MAXP]; /* exit code, or 128 + signal, -1 not reaped */
    uint16_t base;
};

/* Fork the ranks listed in ranks (all when NULL). */
static int run_start(struct run *R, int nstart, const int *ranks,
                     const struct world_cfg *cfg, uint16_t base, child_fn fn,
                     const char *tag);

/* Start a scenario's ranks on ports from base (0: none were found); a failure
 * to start is one failed test point, "LABEL: start". */
static int scenario_start(struct run *R, const char *label, int nstart,
                          const int *ranks, const struct world_cfg *cfg,
                          uint16_t base, child_fn fn, const char *tag)
{
    if (base && run_start(R, nstart, ranks, cfg, base, fn, tag) == 0)
        return 1;
    ok(0, "%s: start", label);
    return 0;
}

static int run_start(struct run *R, int nstart, const int *ranks,
                     const struct world_cfg *cfg, uint16_t base, child_fn fn,
                     const char *tag)
{
    int rp[2], gp[2];

    memset(R, 0, sizeof(*R));
    R->n = nstart;
    R->base = base;
    if (pipe(rp) || pipe(gp))
        return -1;
    fflush(stdout);
    for (int i = 0; i < nstart; i++) {
        int rank = ranks ? ranks[i] : i, res[2];

        snprintf(R->logs[i], sizeof(R->logs[i]),
                 "/tmp/test_transport.%d.%s.%d.log", (int)getpid(), tag, rank);
        R->status[i] = -1;
        if (pipe(res))
            return -1;
        R->pid[i] = fork();
        if (R->pid[i] < 0)
            return -1;
        if (R->pid[i] == 0) {
            struct ctx cx;
            char msg[MSG] = "";
            int fd, rc;

            fd = open(R->logs[i], O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd >= 0) {
                dup2(fd, STDERR_FILENO);
                close(fd);
            }
            close(res[0]);
            close(rp[0]);
            close(gp[1]);
            memset(&cx, 0, sizeof(cx));
            cx.rank = rank;
            cx.cfg = *cfg;
            cx.base = base;
            cx.ready_fd = rp[1];
            cx.go_fd = gp[0];
            mesh_log_set_rank(rank);
            rc = fn(&cx, msg, sizeof(msg));
            if (write(res[1], msg, strlen(msg)) < 0)
                rc = 1;
            close(res[1]);
            if (cx.t)
                ops->close(cx.t);
            _exit(rc ? 1 : 0);
        }
        close(res[1]);
        R->res_fd[i] = res[0];
    }
    close(rp[1]);
    close(gp[0]);
    R->ready_fd = rp[0];
    R->go_fd = gp[1];
    return 0;
}

/* Wait for k ready bytes (children set up), at most timeout_s. */
static int run_wait_ready(struct run *R, int k, double timeout_s)
{
    double end = mesh_now_s() + timeout_s;

    while (k > 0) {
        struct pollfd pfd = {.fd = R->ready_fd, .events = POLLIN};
        int ms = (int)((end - mesh_now_s()) * 1000);
        char b;

        if (ms <= 0 || poll(&pfd, 1, ms) <= 0)
            return -1;
        if (read(R->ready_fd, &b, 1) != 1)
            return -1;
        k--;
    }
    return 0;
}

static void run_go(struct run *R, int k)
{
    for (int i = 0; i < k; i++)
        if (write(R->go_fd, "G", 1) != 1)
            break;
}

/*
 * MESHTRAIN_TEST_SLOW=F: an emulated machine (the verbs lane's QEMU guest)
 * stretches reaping timeouts and scheduling waits F times; failure bounds
 * stay as they are.
 */
static double slow_factor(void)
{
    const char *slow = getenv("MESHTRAIN_TEST_SLOW");

    return slow && atof(slow) > 1.0 ? atof(slow) : 1.0;
}

/* Reap every child within timeout_s (then SIGKILL); read the results. */
static void run_finish(struct run *R, double timeout_s)
{
    double end;

    timeout_s *= slow_factor();
    end = mesh_now_s() + timeout_s;
    int left = 0;

    for (int i = 0; i < R->n; i++)
        left += R->status[i] == -1;
    while (left > 0) {
        for (int i = 0; i < R->n; i++) {
            int st;

            if (R->status[i] != -1)
                continue;
            if (waitpid(R->pid[i], &st, WNOHANG) == R->pid[i]) {
                R->status[i] =
                    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                left--;
            }
        }
        if (left && mesh_now_s() > end) {
            for (int i = 0; i < R->n; i++)
                if (R->status[i] == -1) {
                    diag("child %d timed out, killing it", i);
                    kill(R->pid[i], SIGKILL);
                }
            end = mesh_now_s() + 5;
            timeout_s = 1e9;
        }
        if (left)
            usleep(10000);
    }
    for (int i = 0; i < R->n; i++) {
        ssize_t k = read(R->res_fd[i], R->msg[i], MSG - 1);

        R->msg[i][k > 0 ? k : 0] = '\0';
        close(R->res_fd[i]);
    }
    close(R->ready_fd);
    close(R->go_fd);
}

/* The child's log, NUL-terminated (malloc'ed), then removed. */
static char *run_log(struct run *R, int i)
{
    FILE *f = fopen(R->logs[i], "r");
    char *buf = calloc(1, 1 << 20);
    size_t n = 0;

    if (f && buf) {
        n = fread(buf, 1, (1 << 20) - 1, f);
        buf[n] = '\0';
    }
    if (f)
        fclose(f);
    return buf;
}

/* Children's logs go away unless MESH_TEST_KEEP_LOGS is set. */
static void run_cleanup(struct run *R)
{
    for (int i = 0; i < R->n; i++) {
        if (getenv("MESH_TEST_KEEP_LOGS"))
            diag("log of rank %d kept in %s", i, R->logs[i]);
        else
            unlink(R->logs[i]);
    }
}

static void report_children(struct run *R, const char *what)
{
    for (int i = 0; i < R->n; i++)
        if (R->status[i] != 0)
            diag("%s: child %d status %d: %s", what, i, R->status[i],
                 R->msg[i]);
}

/* ---- data ---------------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    size_t i;

    for (i = 0; i + 8 <= n; i += 8) {
        uint64_t v = mix(seed + i);

        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)mix(seed + i);
}

/* Index of the first wrong byte, or -1. */
static long check(const uint8_t *p, size_t n, uint64_t seed)
{
    size_t i;

    for (i = 0; i + 8 <= n; i += 8) {
        uint64_t v = mix(seed + i);

        if (memcmp(p + i, &v, 8))
            return (long)i;
    }
    for (; i < n; i++)
        if (p[i] != (uint8_t)mix(seed + i))
            return (long)i;
    return -1;
}

/* A frame for a message that carries all `count` elements of its
 * collective in `length` bytes from offset 0. */
static struct mesh_frame frame(uint64_t seq, uint32_t tag, enum mesh_op op,
                               enum mesh_dtype dtype, uint64_t count,
                               uint64_t length)
{
    return (struct mesh_frame){.seq = seq,
                               .tag = tag,
                               .op = (uint8_t)op,
                               .dtype = (uint8_t)dtype,
                               .count = count,
                               .length = length};
}

static uint64_t seed_of(int src, int dst, uint64_t seq, uint32_t tag)
{
    return mix(((uint64_t)src << 48) ^ ((uint64_t)dst << 40) ^ (seq << 8) ^
               tag);
}

static const size_t sizes[] = {0,     1,      4095,    4096,    7919,
                               65536, 104729, 1000003, 8u << 20};

/*
 * One round per size: to every partner, K messages in flight at once (tags
 * 0..K-1) both ways; then check every byte. Big messages go to ring
 * neighbours only when the world is large, to bound memory.
 */
static int exchange(struct ctx *cx, int rounds_from, char *msg, size_t len)
{
    const int n = cx->cfg.n, me = cx->rank;

    for (size_t si = 0; si < MESH_ARRAY_SIZE(sizes); si++) {
        size_t sz = sizes[si];
        int K = sz >= (1u << 20) ? 1 : 3;
        int partners[MAXP], np = 0;
        uint8_t *sb[MAXP][3], *rb[MAXP][3];
        mesh_req_t *rr[MAXP][3], *sr[MAXP][3];
        uint64_t seq = (uint64_t)rounds_from + si;

        for (int p = 0; p < n; p++) {
            if (p == me)
                continue;
            if (sz >= (1u << 20) && n > 4 && p != (me + 1) % n &&
                p != (me + n - 1) % n)
                continue;
            partners[np++] = p;
        }
        for (int i = 0; i < np; i++) {
            int p = partners[i];

            for (int k = 0; k < K; k++) {
                struct mesh_frame f =
                    frame(seq, (uint32_t)k, MESH_OP_P2P, MESH_DT_BYTE, sz, sz);
                int rc;

                sb[i][k] = malloc(sz + 1);
                rb[i][k] = malloc(sz + 1);
                if (!sb[i][k] || !rb[i][k]) {
                    snprintf(msg, len, "out of memory");
                    return -1;
                }
                memset(rb[i][k], 0xee, sz + 1);
                fill(sb[i][k], sz, seed_of(me, p, seq, (uint32_t)k));
                rc = ops->irecv(cx->t, p, &f, rb[i][k], NULL, &rr[i][k]);
                if (rc < 0) {
                    snprintf(msg, len, "irecv: %s", mesh_err_msg(rc));
                    return rc;
                }
                rc = ops->isend(cx->t, p, &f, sb[i][k], NULL, &sr[i][k]);
                if (rc < 0) {
                    snprintf(msg, len, "isend: %s", mesh_err_msg(rc));
                    return rc;
                }
            }
        }
        for (int i = 0; i < np; i++) {
            int p = partners[i];

            for (int k = 0; k < K; k++) {
                long bad;
                int rc = mesh_transport_wait(ops, cx->t, sr[i][k]);

                if (rc < 0) {
                    snprintf(msg, len, "send %zu B to %d: %s", sz, p,
                             mesh_err_msg(rc));
                    return rc;
                }
                rc = mesh_transport_wait(ops, cx->t, rr[i][k]);
                if (rc < 0) {
                    snprintf(msg, len, "recv %zu B from %d: %s", sz, p,
                             mesh_err_msg(rc));
                    return rc;
                }
                bad = check(rb[i][k], sz, seed_of(p, me, seq, (uint32_t)k));
                if (bad >= 0 || rb[i][k][sz] != 0xee) {
                    snprintf(msg, len,
                             "rank %d: %zu B from %d tag %d: wrong byte at "
                             "%ld",
                             me, sz, p, k, bad >= 0 ? bad : (long)sz);
                    return -1;
                }
                free(sb[i][k]);
                free(rb[i][k]);
            }
        }
    }
    return 0;
}

/* ---- scenarios (children) ---------------------------------------------- */

static int child_exchange(struct ctx *cx, char *msg, size_t len)
{
    int rc = mesh_up(cx, msg, len);

    if (rc < 0)
        return rc;
    return exchange(cx, 1, msg, len);
}

/* Rank 1 sends what rank 0 does not expect; both must name both sides. */
static int desync_mode;

static int child_desync(struct ctx *cx, char *msg, size_t len)
{
    struct mesh_frame f =
        frame(5, 1, MESH_OP_ALLREDUCE, MESH_DT_F32, 1024, 4096);
    static uint8_t buf[16384];
    mesh_req_t *r;
    int rc = mesh_up(cx, msg, len);

    if (rc < 0)
        return rc;
    if (cx->rank == 0) {
        if (desync_mode == 0)
            f.op = MESH_OP_ALLGATHER;
        else if (desync_mode == 1)
            f.count = 512;
        else
            f.length = 2048; /* the sender sends 4096: beyond the range */
        rc = ops->irecv(cx->t, 1, &f, buf, NULL, &r);
    } else {
        rc = ops->isend(cx->t, 0, &f, buf, NULL, &r);
        if (rc >= 0)
            rc = mesh_transport_wait(ops, cx->t, r);
        if (rc >= 0) {
            /* A receive that can only end by the job failing. */
            f.seq = 99;
            rc = ops->irecv(cx->t, 0, &f, buf, NULL, &r);
        }
    }
    if (rc >= 0)
        rc = mesh_transport_wait(ops, cx->t, r);
    return must_fail(rc, msg, len, "rank %d: no error", cx->rank);
}

/*
 * Send order (mesh_frame.order, TCP). Rank 1 queues, behind a message that
 * fills the socket, messages of seq 1 with orders 9, 3, 7, 3 and one of
 * seq 2 with order 0; rank 0 then posts one receive at a time in the order
 * they must arrive: the lowest order first, posting order among equals,
 * and nothing overtakes another seq. A receive posted for a message that
 * is not next on the stream never completes (the stream waits for its own
 * receive), so a wrong order is a timeout here, not a wrong guess.
 */
#define ORDER_N 6
static const struct {
    uint64_t seq;
    uint32_t tag, order;
    size_t len;
} order_msgs[ORDER_N] = {
    {1, 0, 5, 32u << 20}, {1, 1, 9, 65536}, {1, 2, 3, 70001},
    {1, 3, 7, 4096},      {1, 4, 3, 1},     {2, 0, 0, 65536},
};
/* order_msgs' indices in the order they must arrive */
static const int order_expect[ORDER_N] = {0, 2, 4, 3, 1, 5};

static int child_order(struct ctx *cx, char *msg, size_t len)
{
    uint8_t *buf[ORDER_N] = {0};
    mesh_req_t *r[ORDER_N] = {0}; /* still pending where not NULL */
    int rc = mesh_up(cx, msg, len);

    if (rc < 0)
        return rc;
    for (int i = 0; i < ORDER_N; i++) {
        buf[i] = malloc(order_msgs[i].len);
        if (!buf[i]) {
            snprintf(msg, len, "out of memory");
            rc = -1;
            goto out;
        }
        if (cx->rank == 1)
            fill(buf[i], order_msgs[i].len,
                 seed_of(1, 0, order_msgs[i].seq, order_msgs[i].tag));
    }
    if (cx->rank == 1) {
        for (int i = 0; i < ORDER_N; i++) {
            struct mesh_frame f;

            mesh_frame_p2p(&f, order_msgs[i].seq, order_msgs[i].tag,
                           order_msgs[i].len);
            f.order = order_msgs[i].order;
            rc = ops->isend(cx->t, 0, &f, buf[i], NULL, &r[i]);
            if (rc < 0) {
                snprintf(msg, len, "isend %d: %s", i, mesh_err_msg(rc));
                goto out;
            }
        }
        signal_ready(cx); /* all queued; the receiver has read nothing */
        wait_go(cx);
        for (int i = 0; i < ORDER_N && rc >= 0; i++) {
            rc = mesh_transport_wait(ops, cx->t, r[i]);
            r[i] = NULL;
            if (rc < 0)
                snprintf(msg, len, "send %d: %s", i, mesh_err_msg(rc));
        }
        goto out;
    }
    signal_ready(cx);
    wait_go(cx);
    for (int k = 0; k < ORDER_N; k++) {
        int i = order_expect[k];
        struct mesh_frame f;
        long bad;

        mesh_frame_p2p(&f, order_msgs[i].seq, order_msgs[i].tag,
                       order_msgs[i].len);
        rc = ops->irecv(cx->t, 1, &f, buf[i], NULL, &r[0]);
        if (rc >= 0)
            rc = ops->wait_any(cx->t, &r[0], 1, 10.0 * slow_factor());
        if (rc == -ETIMEDOUT) {
            snprintf(msg, len,
                     "arrival %d: seq %" PRIu64 " tag %u (order %u) is not "
                     "next on the stream",
                     k, order_msgs[i].seq, order_msgs[i].tag,
                     order_msgs[i].order);
            goto out;
        }
        if (rc >= 0) {
            rc = mesh_transport_wait(ops, cx->t, r[0]);
            r[0] = NULL;
        }
        if (rc < 0) {
            snprintf(msg, len, "receive %d: %s", k, mesh_err_msg(rc));
            goto out;
        }
        bad = check(buf[i], order_msgs[i].len,
                    seed_of(1, 0, order_msgs[i].seq, order_msgs[i].tag));
        if (bad >= 0) {
            snprintf(msg, len, "seq %" PRIu64 " tag %u: byte %ld wrong",
                     order_msgs[i].seq, order_msgs[i].tag, bad);
            rc = -1;
            goto out;
        }
    }
out:
    /* a send or receive still pending ends with the transport's close,
     * before its buffer goes */
    for (int i = 0; i < ORDER_N && cx->t; i++)
        if (r[i]) {
            ops->close(cx->t);
            cx->t = NULL;
        }
    for (int i = 0; i < ORDER_N; i++)
        free(buf[i]);
    return rc < 0 ? -1 : 0;
}

/* Join, wait for the parent's bad clients, then prove the mesh works. */
static int child_live(struct ctx *cx, char *msg, size_t len)
{
    int rc = mesh_up(cx, msg, len);

    if (rc < 0)
        return rc;
    signal_ready(cx);
    wait_go(cx);
    return exchange(cx, 100, msg, len);
}

/*
 * Join, post a receive that never completes (from rank 3 on even ranks,
 * else from rank 0), report, and wait for the failure; the message ends
 * with the monotonic time it came.
 */
static int child_victim(struct ctx *cx, char *msg, size_t len)
{
    struct mesh_frame f = frame(1, 0, MESH_OP_P2P, MESH_DT_BYTE, 64, 64);
    uint8_t buf[64];
    mesh_req_t *r;
    int rc = mesh_up(cx, msg, len);
    int from = cx->rank % 2 == 0 ? 3 : 0;

    if (rc < 0)
        return rc;
    if (cx->rank == 3) {
        signal_ready(cx);
        for (;;)
            pause();
    }
    rc = ops->irecv(cx->t, from, &f, buf, NULL, &r);
    if (rc < 0) {
        snprintf(msg, len, "irecv: %s", mesh_err_msg(rc));
        return rc;
    }
    signal_ready(cx);
    rc = mesh_transport_wait(ops, cx->t, r);
    if (rc >= 0) {
        snprintf(msg, len, "receive completed");
        return -1;
    }
    snprintf(msg, len, "%.6f %s", mesh_now_s(), mesh_err_msg(rc));
    return 0;
}

/*
 * Rank 1 sends and closes at once; rank 0 posts its receives only after
 * the goodbye: what was sent still arrives, and one more receive fails
 * naming the peer that left.
 */
static int child_goodbye(struct ctx *cx, char *msg, size_t len)
{
    static const size_t gsz[2] = {1u << 20, 8};
    uint8_t *buf[2];
    mesh_req_t *r[2];
    int rc = mesh_up(cx, msg, len);

    if (rc < 0)
        return rc;
    for (int i = 0; i < 2; i++) {
        buf[i] = malloc(gsz[i]);
        if (!buf[i]) {
            snprintf(msg, len, "out of memory");
            return -1;
        }
        if (cx->rank == 1)
            fill(buf[i], gsz[i], seed_of(1, 0, (uint64_t)i, 0));
    }
    /*
     * Rank 0 posts its first receive late, and its second only after
     * rank 1 has had time to finish and close: a receive posted after
     * the goodbye still gets what was sent before it.
     */
    if (cx->rank == 0)
        usleep(300000);
    for (int i = 0; i < 2; i++) {
        struct mesh_frame f = {.seq = (uint64_t)i,
                               .op = MESH_OP_P2P,
                               .count = gsz[i],
                               .length = gsz[i]};

        if (cx->rank == 0 && i == 1) {
            rc = mesh_transport_wait(ops, cx->t, r[0]);
            if (rc < 0) {
                snprintf(msg, len, "message 0: %s", mesh_err_msg(rc));
                return rc;
            }
            usleep(300000);
        }
        rc = cx->rank == 1 ? ops->isend(cx->t, 0, &f, buf[i], NULL, &r[i])
                           : ops->irecv(cx->t, 1, &f, buf[i], NULL, &r[i]);
        if (rc < 0) {
            snprintf(msg, len, "post %d: %s", i, mesh_err_msg(rc));
            return rc;
        }
    }
    for (int i = 0; i < 2; i++) {
        /* rank 0's first was waited for above */
        rc =
            cx->rank == 0 && i == 0 ? 0 : mesh_transport_wait(ops, cx->t, r[i]);
        if (rc < 0) {
            snprintf(msg, len, "message %d: %s", i, mesh_err_msg(rc));
            return rc;
        }
        if (cx->rank == 0 &&
            check(buf[i], gsz[i], seed_of(1, 0, (uint64_t)i, 0)) >= 0) {
            snprintf(msg, len, "message %d: wrong contents", i);
            return -1;
        }
    }
    if (cx->rank == 1) {
        ops->close(cx->t);
        cx->t = NULL;
        return 0;
    }
    {
        struct mesh_frame f = {
            .seq = 7, .op = MESH_OP_P2P, .count = 8, .length = 8};

        usleep(200000);
        /* A send to it fails the job, blaming it (not us, the sender). */
        f.seq = 6;
        rc = ops->isend(cx->t, 1, &f, buf[1], NULL, &r[0]);
        if (rc >= 0) {
            snprintf(msg, len, "a send to a departed peer was accepted");
            return -1;
        }
        if (ops->culprit(cx->t) != 1) {
            snprintf(msg, len,
                     "after a send to departed rank 1 the job blames %d: %s",
                     ops->culprit(cx->t), mesh_err_msg(rc));
            return -1;
        }
        f.seq = 7;
        rc = ops->irecv(cx->t, 1, &f, buf[1], NULL, &r[0]);
        if (rc >= 0)
            rc = mesh_transport_wait(ops, cx->t, r[0]);
        return must_fail(rc, msg, len,
                         "a receive from a departed peer completed");
    }
}

/*
 * Peer timeout 1 s. The mesh idles for 2.5 s (heartbeats must keep it
 * alive); then rank 1 sends 8 MiB that rank 0 posts for only 2 s later (a
 * parked stream with a blocked sender is not a dead peer); then rank 2
 * aborts and the others' pending receives fail naming it and its reason.
 */
static int child_idle(struct ctx *cx, char *msg, size_t len)
{
    const size_t sz = 8u << 20;
    struct mesh_frame f = {
        .seq = 1, .op = MESH_OP_P2P, .count = sz, .length = sz};
    uint8_t *buf = malloc(sz);
    mesh_req_t *r;
    int rc = mesh_up(cx, msg, len);

    if (rc < 0)
        return rc;
    if (!buf) {
        snprintf(msg, len, "out of memory");
        return -1;
    }
    usleep(2500000);
    if (cx->rank == 1) {
        fill(buf, sz, seed_of(1, 0, 1, 0));
        rc = ops->isend(cx->t, 0, &f, buf, NULL, &r);
    } else if (cx->rank == 0) {
        usleep(2000000);
        rc = ops->irecv(cx->t, 1, &f, buf, NULL, &r);
    }
    if (cx->rank < 2) {
        if (rc >= 0)
            rc = mesh_transport_wait(ops, cx->t, r);
        if (rc < 0) {
            snprintf(msg, len, "after idling: %s", mesh_err_msg(rc));
            return rc;
        }
        if (cx->rank == 0 && check(buf, sz, seed_of(1, 0, 1, 0)) >= 0) {
            snprintf(msg, len, "after idling: wrong contents");
            return -1;
        }
        /* Now wait for something rank 2 never sends. */
        f.seq = 2;
        f.count = f.length = 8;
        rc = ops->irecv(cx->t, 2, &f, buf, NULL, &r);
        if (rc >= 0)
            rc = mesh_transport_wait(ops, cx->t, r);
    } else {
        /* until the others wait on us (8 MiB moved first: stretched on an
         * emulated machine) */
        usleep((useconds_t)(3000000 * slow_factor()));
        ops->abort(cx->t, -1, "the test aborts here");
        f.seq = 3;
        f.count = f.length = 8;
        rc = ops->isend(cx->t, 0, &f, buf, NULL, &r);
    }
    free(buf);
    return must_fail(rc, msg, len, "no failure after the abort");
}

static int child_join_fail(struct ctx *cx, char *msg, size_t len)
{
    int rc = mesh_up(cx, msg, len);

    if (rc >= 0) {
        snprintf(msg, len, "joined a mesh with missing ranks");
        return -1;
    }
    return 0;
}

/* ---- scenarios (parent) ------------------------------------------------ */

static struct world_cfg wcfg(int n, int streams)
{
    struct world_cfg c = {.n = n,
                          .streams = streams,
                          .peer_timeout_s = 10,
                          .join_timeout_s = 20,
                          .insecure = 0};

    return c;
}

static int all_ok(struct run *R)
{
    for (int i = 0; i < R->n; i++)
        if (R->status[i] != 0)
            return 0;
    return 1;
}

static void scenario_exchange(int n, int streams, int insecure)
{
    struct world_cfg c = wcfg(n, streams);
    uint16_t base = pick_ports(n);
    struct run R;
    double t0 = mesh_now_s();

    c.insecure = insecure;
    if (!base || run_start(&R, n, NULL, &c, base, child_exchange, "xchg")) {
        ok(0, "%d peers, %d streams: start", n, streams);
        return;
    }
    run_finish(&R, 40);
    report_children(&R, "exchange");
    ok(all_ok(&R),
       "%d peers on %s, %d stream%s%s: join, all pairs, sizes 0..8 MiB "
       "checked (%.1f s)",
       n, test_host, streams, streams > 1 ? "s" : "",
       insecure ? ", insecure" : "", mesh_now_s() - t0);
    if (insecure) {
        char *log = run_log(&R, 0);

        ok(log && strstr(log, "unauthenticated"),
           "insecure mode says so in the log");
        free(log);
    }
    run_cleanup(&R);
}

static void scenario_order(void)
{
    struct world_cfg c = wcfg(2, 1);
    uint16_t base = pick_ports(2);
    struct run R;
    int ready;

    if (!scenario_start(&R, "send order", 2, NULL, &c, base, child_order,
                        "order"))
        return;
    ready = run_wait_ready(&R, 2, 30 * slow_factor()) == 0;
    run_go(&R, 2);
    run_finish(&R, 60);
    report_children(&R, "send order");
    ok(ready && all_ok(&R),
       "send order: lowest order first, posting order among equals, no "
       "overtaking across seqs, behind a started message");
    run_cleanup(&R);
}

/* The same over IPv6 loopback, where the machine has it. */
static void scenario_ipv6(void)
{
    struct sockaddr_in6 s6 = {.sin6_family = AF_INET6};
    int fd = socket(AF_INET6, SOCK_STREAM, 0), have;

    s6.sin6_addr = in6addr_loopback;
    have = fd >= 0 && bind(fd, (struct sockaddr *)&s6, sizeof(s6)) == 0;
    if (fd >= 0)
        close(fd);
    if (!have) {
        skip("no IPv6 loopback (::1) here");
        return;
    }
    test_host = "::1";
    scenario_exchange(2, 2, 0);
    test_host = "127.0.0.1";
}

static void scenario_desync(int mode)
{
    static const char *what[] = {"op mismatch", "count mismatch",
                                 "oversize frame"};
    struct world_cfg c = wcfg(2, 1);
    uint16_t base = pick_ports(2);
    char a0[64], a1[64];
    struct run R;

    desync_mode = mode;
    if (!scenario_start(&R, "desync", 2, NULL, &c, base, child_desync,
                        "desync"))
        return;
    run_finish(&R, 20);
    report_children(&R, what[mode]);
    snprintf(a0, sizeof(a0), "rank 0 (127.0.0.1:%u)", (unsigned)base);
    snprintf(a1, sizeof(a1), "rank 1 (127.0.0.1:%u)", (unsigned)base + 1);
    for (int i = 0; i < 2; i++) {
        const char *m = R.msg[i];
        int good = R.status[i] == 0 && strstr(m, a0) && strstr(m, a1);

        if (mode == 0)
            good = good && strstr(m, "desync") && strstr(m, "allreduce") &&
                   strstr(m, "allgather");
        else if (mode == 1)
            good = good && strstr(m, "desync") && strstr(m, "count 1024") &&
                   strstr(m, "count 512");
        else
            good = good && strstr(m, "beyond") && strstr(m, "length 4096") &&
                   strstr(m, "length 2048");
        ok(good, "%s: rank %d fails naming both sides", what[mode], i);
        if (!good)
            diag("rank %d said: %s", i, R.msg[i]);
    }
    run_cleanup(&R);
}

/* A transport in this process posing as rank 3 of the live mesh. */
static int bad_join(uint16_t base, int n, const char *sec, const char *job,
                    const char *cfg, char *msg, size_t len)
{
    struct mesh_peer peers[MAXP];
    struct mesh_world w = {.rank = n - 1, .size = n, .peers = peers};
    struct mesh_transport_opts o;
    mesh_transport_t *t = NULL;
    int rc;

    for (int i = 0; i < n; i++) {
        snprintf(peers[i].host, sizeof(peers[i].host), "127.0.0.1");
        peers[i].port = (uint16_t)(base + i);
        peers[i].local_rank = i;
    }
    peers[n - 1].port = (uint16_t)(base + n); /* its own, free port */
    mesh_transport_opts_init(&o);
    o.streams = 1;
    o.join_timeout_s = 0.6;
    o.peer_timeout_s = 5;
    o.secret = (const uint8_t *)sec;
    o.secret_len = strlen(sec);
    snprintf(o.job_id, sizeof(o.job_id), "%s", job);
    snprintf(o.config, sizeof(o.config), "%s", cfg);
    rc = ops->listen(&w, &o, &t);
    if (rc >= 0)
        rc = ops->connect(t);
    snprintf(msg, len, "%s", rc < 0 ? mesh_err_msg(rc) : "joined");
    ops->close(t);
    return rc;
}

static int raw_connect(uint16_t port)
{
    struct sockaddr_in s4 = {.sin_family = AF_INET, .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    s4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&s4, sizeof(s4)) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* 1 when the peer closes fd within timeout_s. */
static int closed_within(int fd, double timeout_s)
{
    double end = mesh_now_s() + timeout_s;
    char b[256];

    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ms = (int)((end - mesh_now_s()) * 1000);
        ssize_t k;

        if (ms <= 0 || poll(&pfd, 1, ms) <= 0)
            return 0;
        k = read(fd, b, sizeof(b));
        if (k <= 0)
            return 1;
    }
}

/* A raw TCP HELLO (tcp only): wrong version, or a rank out of range. */
static int raw_hello(uint16_t port, uint32_t version, uint32_t rank)
{
    uint8_t m[TCP_HELLO_LEN];
    int fd = raw_connect(port), closed;

    if (fd < 0)
        return 0;
    memset(m, 0, sizeof(m));
    for (int i = 0; i < 4; i++) {
        m[i] = (uint8_t)(TCP_HS_MAGIC >> (8 * i));
        m[4 + i] = (uint8_t)(version >> (8 * i));
        m[8 + i] = (uint8_t)(4u >> (8 * i));
        m[12 + i] = (uint8_t)(rank >> (8 * i));
    }
    memcpy(m + 24, "test-job", 8);
    closed =
        write(fd, m, sizeof(m)) == (ssize_t)sizeof(m) && closed_within(fd, 3);
    close(fd);
    return closed;
}

static void scenario_live(void)
{
    struct world_cfg c = wcfg(4, 1);
    uint16_t base = pick_ports(4);
    char m[MSG], *log;
    uint8_t junk[300];
    struct run R;
    double t_loris;
    int loris, garbage, rc;

    if (!scenario_start(&R, "live mesh", 4, NULL, &c, base, child_live, "live"))
        return;
    ok(run_wait_ready(&R, 4, 20) == 0, "live mesh of 4 joined");

    /* Slow-loris: a valid-looking start, then nothing. */
    loris = raw_connect(base);
    t_loris = mesh_now_s();
    if (loris >= 0 && write(loris, "MSH1\x01", 5) != 5) {
        close(loris);
        loris = -1;
    }
    garbage = raw_connect(base);
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)mix(i);
    ok(garbage >= 0 &&
           write(garbage, junk, sizeof(junk)) == (ssize_t)sizeof(junk) &&
           closed_within(garbage, 3),
       "garbage client is dropped");
    if (garbage >= 0)
        close(garbage);

    if (!strcmp(ops->name, "tcp")) {
        ok(raw_hello(base, TCP_PROTO_VERSION + 1, 3),
           "a handshake of another protocol version is dropped");
        ok(raw_hello(base, TCP_PROTO_VERSION, 99),
           "a handshake from an unknown rank is dropped");
    } else {
        skip("raw TCP handshakes apply to the tcp transport only");
        skip("raw TCP handshakes apply to the tcp transport only");
    }
    rc =
        bad_join(base, 4, "the wrong secret", "test-job", config, m, sizeof(m));
    ok(rc < 0, "wrong secret cannot join: %s", m);
    rc = bad_join(base, 4, secret, "other-job", config, m, sizeof(m));
    ok(rc < 0, "wrong job id cannot join: %s", m);
    rc = bad_join(base, 4, secret, "test-job",
                  "model=resnet50\nbatch=64\nlr=0.1\n", m, sizeof(m));
    ok(rc < 0 && strstr(m, "batch=64 here, batch=32 there"),
       "config mismatch is refused naming the key: %s", m);
    rc = bad_join(base, 4, secret, "test-job", config, m, sizeof(m));
    ok(rc < 0, "duplicate rank 3 cannot join: %s", m);

    rc = loris >= 0 && closed_within(loris, 9);
    t_loris = mesh_now_s() - t_loris;
    ok(rc && t_loris >= 4.0,
       "slow-loris client dropped at the handshake deadline (%.1f s)", t_loris);
    if (loris >= 0)
        close(loris);

    run_go(&R, 4);
    run_finish(&R, 40);
    report_children(&R, "live");
    ok(all_ok(&R), "the mesh still works after the bad clients");
    /* Raw clients went to rank 0; a bad peer dials ranks 0..2 at once and
     * gives up at the first refusal, so its lines may be on any of them. */
    log = run_log(&R, 0);
    ok(log && strstr(log, "bad magic"), "rank 0 logged the garbage");
    ok(log && strstr(log, "handshake not completed"),
       "rank 0 logged the slow-loris");
    if (!strcmp(ops->name, "tcp")) {
        char want[64];

        snprintf(want, sizeof(want), "protocol version %u, expected %u",
                 TCP_PROTO_VERSION + 1, TCP_PROTO_VERSION);
        ok(log && strstr(log, want), "rank 0 logged the version");
        ok(log && strstr(log, "unknown rank 99"),
           "rank 0 logged the unknown rank");
    } else {
        skip("raw TCP handshakes apply to the tcp transport only");
        skip("raw TCP handshakes apply to the tcp transport only");
    }
    for (int i = 1; i < 3 && log; i++) {
        char *more = run_log(&R, i);

        if (more && strlen(log) + strlen(more) < (1 << 20) - 1)
            strcat(log, more);
        free(more);
    }
    ok(log && strstr(log, "wrong secret"), "the mesh logged the wrong secret");
    ok(log && strstr(log, "wrong job id 'other-job'"),
       "the mesh logged the wrong job");
    ok(log && strstr(log, "configuration differs: batch=32 here, batch=64 "
                          "there"),
       "the mesh logged the config key that differs");
    ok(log && strstr(log, "duplicate rank 3"), "the mesh logged the duplicate");
    free(log);
    run_cleanup(&R);
}

static void scenario_kill(int sig)
{
    struct world_cfg c = wcfg(4, 2);
    uint16_t base = pick_ports(4);
    const char *name = sig == SIGKILL ? "SIGKILL" : "SIGSTOP";
    char culprit[64];
    struct run R;
    double t0;

    c.peer_timeout_s = 2.0;
    if (!scenario_start(&R, name, 4, NULL, &c, base, child_victim,
                        sig == SIGKILL ? "kill" : "stop"))
        return;
    if (run_wait_ready(&R, 4, 20) < 0) {
        ok(0, "%s: mesh of 4 did not come up", name);
        for (int i = 0; i < 4; i++)
            kill(R.pid[i], SIGKILL);
        run_finish(&R, 5);
        run_cleanup(&R);
        return;
    }
    t0 = mesh_now_s();
    kill(R.pid[3], sig);
    /* Survivors are reaped first; then the stopped one is killed. */
    for (int i = 0; i < 3; i++) {
        double end = t0 + 15;
        int st;

        while (mesh_now_s() < end &&
               waitpid(R.pid[i], &st, WNOHANG) != R.pid[i])
            usleep(10000);
        if (mesh_now_s() >= end) {
            kill(R.pid[i], SIGKILL);
            waitpid(R.pid[i], &st, 0);
        }
        R.status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    kill(R.pid[3], SIGKILL);
    run_finish(&R, 5);
    snprintf(culprit, sizeof(culprit), "rank 3 (127.0.0.1:%u)",
             (unsigned)base + 3);
    for (int i = 0; i < 3; i++) {
        double when = atof(R.msg[i]) - t0;
        /* The bound: T (transport/tcp/progress.c, silence_limit_ns),
         * plus scheduling slack. */
        double bound = sig == SIGKILL ? 2.0 : c.peer_timeout_s + 2.0;
        int good = R.status[i] == 0 && strstr(R.msg[i], culprit) && when >= 0 &&
                   when <= bound;

        ok(good,
           "%s of rank 3: rank %d's pending receive failed after "
           "%.2f s naming the culprit",
           name, i, when);
        if (!good)
            diag("rank %d said: %s", i, R.msg[i]);
        else if (i == 0)
            diag("%s", strchr(R.msg[i], ' ') + 1);
    }
    run_cleanup(&R);
}

static void scenario_goodbye(void)
{
    struct world_cfg c = wcfg(2, 2);
    uint16_t base = pick_ports(2);
    char who[64];
    struct run R;

    if (!scenario_start(&R, "goodbye", 2, NULL, &c, base, child_goodbye, "bye"))
        return;
    run_finish(&R, 20);
    report_children(&R, "goodbye");
    snprintf(who, sizeof(who), "rank 1 (127.0.0.1:%u)", (unsigned)base + 1);
    ok(all_ok(&R), "data sent before a peer closes still arrives");
    ok(R.status[0] == 0 && strstr(R.msg[0], who) &&
           strstr(R.msg[0], "left the mesh"),
       "a later send to it fails the job blaming it, a receive fails "
       "naming it: %s",
       R.msg[0]);
    run_cleanup(&R);
}

/* Whether a rank of R declared itself stood still: the machine did not
 * schedule it for the peer timeout, which the transport reports as it
 * should, but then the scenario did not test what it meant to. */
static int run_stood_still(const struct run *R)
{
    for (int i = 0; i < R->n; i++)
        if (strstr(R->msg[i], "itself stood still"))
            return 1;
    return 0;
}

static void scenario_idle(void)
{
    struct world_cfg c = wcfg(3, 2);
    uint16_t base;
    char who[64];
    struct run R;

    c.peer_timeout_s = 1.0;
    /* A 1 s peer timeout on a loaded machine (or an emulated one, the
     * verbs lane's guest) can see a rank descheduled for longer; that
     * rank then rightly declares itself dead, and the scenario runs
     * again, up to 3 times in all. */
    for (int attempt = 1;; attempt++) {
        base = pick_ports(3);
        if (!scenario_start(&R, "idle", 3, NULL, &c, base, child_idle, "idle"))
            return;
        run_finish(&R, 30);
        if (!run_stood_still(&R) || attempt == 3)
            break;
        diag("idle, try %d: a rank was not scheduled for the 1 s peer "
             "timeout (%s); running the scenario again",
             attempt, R.msg[0]);
        run_cleanup(&R);
    }
    report_children(&R, "idle");
    ok(R.status[0] == 0 && R.status[1] == 0 &&
           !strstr(R.msg[0], "after idling") &&
           !strstr(R.msg[1], "after idling"),
       "an idle mesh and a parked, blocked stream outlive a 1 s peer "
       "timeout");
    snprintf(who, sizeof(who), "rank 2 (127.0.0.1:%u)", (unsigned)base + 2);
    for (int i = 0; i < 3; i++)
        ok(R.status[i] == 0 && strstr(R.msg[i], who) &&
               strstr(R.msg[i], "the test aborts here"),
           "abort() on rank 2 fails rank %d naming it and why: %s", i,
           R.msg[i]);
    run_cleanup(&R);
}

static void scenario_join_timeout(void)
{
    struct world_cfg c = wcfg(4, 1);
    uint16_t base = pick_ports(4);
    const int ranks[2] = {0, 1};
    struct run R;

    c.join_timeout_s = 1.5;
    if (!scenario_start(&R, "join timeout", 2, ranks, &c, base, child_join_fail,
                        "join"))
        return;
    run_finish(&R, 20);
    for (int i = 0; i < 2; i++) {
        char r2[64], r3[64], other[32];
        const char *m = R.msg[i];
        int good;

        snprintf(r2, sizeof(r2), "rank 2 (127.0.0.1:%u", (unsigned)base + 2);
        snprintf(r3, sizeof(r3), "rank 3 (127.0.0.1:%u", (unsigned)base + 3);
        snprintf(other, sizeof(other), "rank %d (", 1 - i);
        good = R.status[i] == 0 && strstr(m, "join") && strstr(m, r2) &&
               strstr(m, r3) && !strstr(m, other);
        ok(good, "join timeout on rank %d names exactly ranks 2 and 3", i);
        if (!good)
            diag("rank %d said: %s", i, m);
    }
    run_cleanup(&R);
}

/*
 * --elastic views (MESH_CONFIG_VIEW, tcp): rank 1 comes to the mesh of
 * view 5 late, still opening view 4's. Its join fails at once, saying
 * that rank 0 is in a later view, while rank 0 waits on for it; rank 1
 * then joins in view 5, and so does rank 0. Both used to fail
 * ("configuration differs"), and the next view failed the same way with
 * the next late peer: the views raced upward.
 */
struct view_peer {
    uint16_t base;
    int rank;
    const char *view;
    int kept, listen_fd; /* kept: accept on listen_fd (o.listen_fd) */
    int hold;            /* leave the mesh open, in t */
    mesh_transport_t *t;
    int rc;
    char msg[MSG];
};

static void *view_join(void *arg)
{
    struct view_peer *p = arg;
    struct mesh_peer peers[2];
    struct mesh_world w = {.rank = p->rank, .size = 2, .peers = peers};
    struct mesh_transport_opts o;
    mesh_transport_t *t = NULL;

    for (int i = 0; i < 2; i++) {
        snprintf(peers[i].host, sizeof(peers[i].host), "127.0.0.1");
        peers[i].port = (uint16_t)(p->base + i);
        peers[i].local_rank = i;
    }
    mesh_transport_opts_init(&o);
    o.streams = 1;
    o.join_timeout_s = 30;
    o.peer_timeout_s = 5;
    o.secret = (const uint8_t *)secret;
    o.secret_len = strlen(secret);
    snprintf(o.job_id, sizeof(o.job_id), "test-job");
    snprintf(o.config, sizeof(o.config), "%s" MESH_CONFIG_VIEW "=%s\n", config,
             p->view);
    if (p->kept)
        o.listen_fd = p->listen_fd;
    p->rc = ops->listen(&w, &o, &t);
    if (p->rc >= 0)
        p->rc = ops->connect(t);
    snprintf(p->msg, sizeof(p->msg), "%s",
             p->rc < 0 ? mesh_err_msg(p->rc) : "joined");
    if (p->hold && p->rc >= 0)
        p->t = t;
    else
        ops->close(t);
    return NULL;
}

static void scenario_view_order(void)
{
    uint16_t base = pick_ports(2);
    struct view_peer p0 = {.base = base, .rank = 0, .view = "5:0,1"};
    struct view_peer late = {.base = base, .rank = 1, .view = "4:0,1"};
    struct view_peer p1 = {.base = base, .rank = 1, .view = "5:0,1"};
    pthread_t th;

    if (!base) {
        skip("no free ports");
        skip("no free ports");
        return;
    }
    pthread_create(&th, NULL, view_join, &p0);
    view_join(&late);
    ok(late.rc < 0 && strstr(late.msg, "rank 0 ") &&
           strstr(late.msg, "is in a later view"),
       "views: a peer of an earlier view fails its join at once: %s", late.msg);
    view_join(&p1);
    pthread_join(th, NULL);
    ok(p0.rc == 0 && p1.rc == 0,
       "views: the peer of the later view waited; both then joined it "
       "(rank 0: %s; rank 1: %s)",
       p0.msg, p1.msg);
}

/*
 * Rank 0's listening socket for 2 ranks on base (*lfd), kept by the test
 * as --elastic keeps one, and views 1 and 2 of the pair on it (a: view 1,
 * b: view 2); 0, or the error of the socket.
 */
static int kept_setup(uint16_t base, int *lfd, struct view_peer *a0,
                      struct view_peer *a1, struct view_peer *b0,
                      struct view_peer *b1)
{
    struct mesh_peer peers[2];
    struct mesh_world w = {.rank = 0, .size = 2, .peers = peers};
    struct mesh_transport_opts o;
    int rc;

    *a0 = (struct view_peer){.base = base, .rank = 0, .view = "1:0,1"};
    *a1 = (struct view_peer){.base = base, .rank = 1, .view = "1:0,1"};
    *b0 = (struct view_peer){.base = base, .rank = 0, .view = "2:0,1"};
    *b1 = (struct view_peer){.base = base, .rank = 1, .view = "2:0,1"};
    for (int i = 0; i < 2; i++) {
        snprintf(peers[i].host, sizeof(peers[i].host), "127.0.0.1");
        peers[i].port = (uint16_t)(base + i);
        peers[i].local_rank = i;
    }
    mesh_transport_opts_init(&o);
    rc = mesh_tcp_listen_socket(&w, &o, lfd);
    a0->kept = b0->kept = 1;
    a0->listen_fd = b0->listen_fd = *lfd;
    return rc;
}

/*
 * A listening socket kept across meshes (o.listen_fd, as --elastic keeps
 * one for all its views): rank 0's two meshes in turn accept on it, and
 * between them, and after the second, the port still accepts a
 * connection (a peer that dials early waits in its backlog, not
 * refused); a mesh never closes it, and once its owner does, the port
 * refuses.
 */
static void scenario_kept_listener(void)
{
    uint16_t base = pick_ports(2);
    struct view_peer a0, a1, b0, b1;
    pthread_t th;
    int lfd = -1, fd, rc;

    if (!base) {
        for (int i = 0; i < 4; i++)
            skip("no free ports");
        return;
    }
    rc = kept_setup(base, &lfd, &a0, &a1, &b0, &b1);
    if (rc == 0) {
        pthread_create(&th, NULL, view_join, &a1);
        view_join(&a0);
        pthread_join(th, NULL);
    }
    fd = rc == 0 ? raw_connect(base) : -1;
    ok(rc == 0 && a0.rc == 0 && a1.rc == 0 && fd >= 0,
       "kept listener: a mesh accepts on it (rank 0: %s; rank 1: %s), and "
       "after its close the port still accepts (%s)",
       a0.msg, a1.msg, fd >= 0 ? "connected" : "refused");
    if (fd >= 0)
        close(fd);
    /* rank 1's dials may come before rank 0's mesh: they wait in the
     * kept backlog */
    if (rc == 0) {
        pthread_create(&th, NULL, view_join, &b1);
        view_join(&b0);
        pthread_join(th, NULL);
    }
    ok(rc == 0 && b0.rc == 0 && b1.rc == 0,
       "kept listener: the next mesh on it forms too (rank 0: %s; rank 1: "
       "%s)",
       b0.msg, b1.msg);
    fd = rc == 0 ? raw_connect(base) : -1;
    ok(fd >= 0 && fcntl(lfd, F_GETFD) >= 0,
       "kept listener: the meshes left it open (%s)",
       fd >= 0 ? "the port accepts" : "the port refuses");
    if (fd >= 0)
        close(fd);
    if (lfd >= 0)
        close(lfd);
    fd = raw_connect(base);
    ok(rc == 0 && fd < 0, "kept listener: closed by its owner, the port "
                          "refuses");
    if (fd >= 0)
        close(fd);
}

/* Both ranks of a 2-rank mesh of view `view`, left open; 0 when both
 * joined. */
static int hold_pair(struct view_peer *p0, struct view_peer *p1)
{
    pthread_t th;

    p0->hold = p1->hold = 1;
    pthread_create(&th, NULL, view_join, p1);
    view_join(p0);
    pthread_join(th, NULL);
    return p0->rc == 0 && p1->rc == 0 ? 0 : -1;
}

static void close_pair(struct view_peer *p0, struct view_peer *p1)
{
    ops->close(p0->t);
    ops->close(p1->t);
    p0->t = p1->t = NULL;
}

/*
 * A failed mesh on a kept listening socket (its view is changing)
 * accepts no more: a connection made meanwhile waits in the backlog, and
 * the next mesh on the socket is the one that takes it (here a bad
 * HELLO, which it refuses). Accepted by the failed mesh, a dial of the
 * next view was refused there (the failed mesh's view is the earlier)
 * and backed off.
 */
static void scenario_kept_failed(void)
{
    uint16_t base = pick_ports(2);
    struct view_peer a0, a1, b0, b1;
    uint8_t m[TCP_HELLO_LEN];
    int lfd = -1, fd = -1, waited = 0, taken = 0, rc;

    if (!base) {
        for (int i = 0; i < 2; i++)
            skip("no free ports");
        return;
    }
    rc = kept_setup(base, &lfd, &a0, &a1, &b0, &b1);
    if (rc == 0)
        rc = hold_pair(&a0, &a1);
    if (rc == 0) {
        ops->abort(a0.t, -1, "the view is changing (test)");
        fd = raw_connect(base);
        memset(m, 0xa5, sizeof(m)); /* no magic: refused when read */
        if (fd >= 0 && write(fd, m, sizeof(m)) == (ssize_t)sizeof(m))
            waited = !closed_within(fd, 0.5);
        close_pair(&a0, &a1);
    }
    ok(rc == 0 && waited,
       "kept listener: a failed mesh leaves a new connection in the "
       "backlog (rank 0: %s; rank 1: %s)",
       a0.msg, a1.msg);
    if (rc == 0 && fd >= 0 && hold_pair(&b0, &b1) == 0) {
        taken = closed_within(fd, 20);
        close_pair(&b0, &b1);
    } else if (b0.t || b1.t) {
        close_pair(&b0, &b1);
    }
    ok(taken,
       "kept listener: the next mesh on it took that connection "
       "(and refused its bad HELLO; rank 0: %s; rank 1: %s)",
       b0.msg, b1.msg);
    if (fd >= 0)
        close(fd);
    if (lfd >= 0)
        close(lfd);
}

/* In-process checks of the API's edges (no peers needed). */
/* ---- shm: the segment's life ----------------------------------------------
 */

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Whether this process maps the shm transport's segment (a memfd). */
static int maps_segment(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;

    if (!f)
        return -1;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, "memfd:meshtrain-shm") != NULL;
    fclose(f);
    return found;
}

/*
 * One use of the windows (host_window, host_sync): 4 KiB of ours into the
 * half of our window that the next sync publishes (its number's parity,
 * as collective/local.c does), the sync, then both neighbours' 4 KiB
 * checked in theirs.
 */
static int shm_window_op(struct ctx *cx, int op, const int nb[2], char *msg,
                         size_t len)
{
    const int me = cx->rank;
    const size_t n = 4096;
    struct mesh_frame f =
        frame((uint64_t)op + 1, 2, MESH_OP_P2P, MESH_DT_BYTE, 0, 0);
    mesh_req_t *q;
    void *base;
    size_t wlen, half;
    uint64_t k;
    int rc = ops->host_window(cx->t, me, &base, &wlen, &k);

    if (rc < 0 || wlen < 2 * n) {
        snprintf(msg, len, "op %d: rank %d has no window (%d, %zu bytes)", op,
                 me, rc, wlen);
        return -1;
    }
    half = ((k + 1) % 2) * (wlen / 2);
    fill((uint8_t *)base + half, n, seed_of(me, 1, (uint64_t)op, 0));
    rc = ops->host_sync(cx->t, &f, &q);
    if (rc == 0)
        rc = mesh_transport_wait(ops, cx->t, q);
    if (rc < 0) {
        snprintf(msg, len, "op %d: host sync: %s", op, mesh_err_msg(rc));
        return rc;
    }
    for (int j = 0; j < 2; j++) {
        uint64_t kj;

        rc = ops->host_window(cx->t, nb[j], &base, &wlen, &kj);
        if (rc < 0 || kj != k + 1 ||
            check((uint8_t *)base + half, n,
                  seed_of(nb[j], 1, (uint64_t)op, 0)) >= 0) {
            snprintf(msg, len,
                     "op %d: rank %d's window (%d, sync %" PRIu64
                     "): wrong bytes",
                     op, nb[j], rc, kj);
            return -1;
        }
    }
    return 0;
}

/*
 * 300 back-to-back operations with both ring neighbours (inline sizes and
 * sizes read by address, every byte checked, then 4 KiB through the
 * windows and a host sync), then close: the segment is unmapped and no
 * descriptor is left behind.
 */
static int child_shm_segment(struct ctx *cx, char *msg, size_t len)
{
    static const size_t ssz[3] = {8, 70001, 300000};
    const int n = cx->cfg.n, me = cx->rank;
    const int nb[2] = {(me + 1) % n, (me + n - 1) % n};
    int fds0 = count_fds(), rc = mesh_up(cx, msg, len);
    uint8_t *sb = malloc(300000), *rb[2] = {malloc(300000), malloc(300000)};

    if (rc < 0)
        return rc;
    if (!sb || !rb[0] || !rb[1]) {
        snprintf(msg, len, "out of memory");
        return -1;
    }
    if (maps_segment() != 1 || mesh_shm_local(cx->t, nb[0]) != 1) {
        snprintf(msg, len, "rank %d: no shared segment after the join", me);
        return -1;
    }
    /* every rank on this machine: n over its CPUs, at least 1 */
    {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        double want = nc > 0 && n > nc ? (double)n / (double)nc : 1.0;
        double got = ops->ranks_per_cpu ? ops->ranks_per_cpu(cx->t) : -1;

        if (got < want - 1e-9 || got > want + 1e-9) {
            snprintf(msg, len,
                     "rank %d: %.3f ranks per CPU, want %.3f (%d ranks, "
                     "%ld CPUs)",
                     me, got, want, n, nc);
            return -1;
        }
    }
    /* MESHTRAIN_SHM_CMA=0 or 1 (scenario_shm): the path it asked for */
    if (getenv("MESHTRAIN_SHM_CMA") &&
        (mesh_shm_one_copy(cx->t, nb[0]) !=
             (getenv("MESHTRAIN_SHM_CMA")[0] == '1') ||
         mesh_shm_one_copy(cx->t, nb[1]) !=
             (getenv("MESHTRAIN_SHM_CMA")[0] == '1'))) {
        snprintf(msg, len, "rank %d: MESHTRAIN_SHM_CMA=%s not followed", me,
                 getenv("MESHTRAIN_SHM_CMA"));
        return -1;
    }
    for (int op = 0; op < 300; op++) {
        size_t sz = ssz[op % 3];
        mesh_req_t *rr[2], *sr[2];

        fill(sb, sz, seed_of(me, 0, (uint64_t)op, 0));
        for (int k = 0; k < 2; k++) {
            struct mesh_frame f = frame((uint64_t)op + 1, (uint32_t)k,
                                        MESH_OP_P2P, MESH_DT_BYTE, sz, sz);
            /* tag k: to the next rank (0), to the previous one (1) */
            struct mesh_frame g = f;

            g.tag = (uint32_t)(1 - k);
            rc = ops->irecv(cx->t, nb[k], &g, rb[k], NULL, &rr[k]);
            if (rc == 0)
                rc = ops->isend(cx->t, nb[k], &f, sb, NULL, &sr[k]);
            if (rc < 0) {
                snprintf(msg, len, "op %d: %s", op, mesh_err_msg(rc));
                return rc;
            }
        }
        for (int k = 0; k < 2; k++) {
            rc = mesh_transport_wait(ops, cx->t, sr[k]);
            if (rc == 0)
                rc = mesh_transport_wait(ops, cx->t, rr[k]);
            if (rc < 0) {
                snprintf(msg, len, "op %d: %s", op, mesh_err_msg(rc));
                return rc;
            }
            if (check(rb[k], sz, seed_of(nb[k], 0, (uint64_t)op, 0)) >= 0) {
                snprintf(msg, len, "op %d: %zu B from rank %d: wrong bytes", op,
                         sz, nb[k]);
                return -1;
            }
        }
        rc = shm_window_op(cx, op, nb, msg, len);
        if (rc < 0)
            return rc;
    }
    ops->close(cx->t);
    cx->t = NULL;
    free(sb);
    free(rb[0]);
    free(rb[1]);
    if (maps_segment() != 0 || count_fds() != fds0) {
        snprintf(msg, len,
                 "rank %d: after close: segment mapped %d, descriptors %d "
                 "(%d before the join)",
                 me, maps_segment(), count_fds(), fds0);
        return -1;
    }
    return 0;
}

/* Join, report, and wait to be killed. */
static int child_shm_hold(struct ctx *cx, char *msg, size_t len)
{
    int rc = mesh_up(cx, msg, len);

    if (rc < 0)
        return rc;
    signal_ready(cx);
    for (;;)
        pause();
}

/* The names in /dev/shm, sorted into one string. */
static void dev_shm_list(char *out, size_t len)
{
    struct dirent **v;
    int n = scandir("/dev/shm", &v, NULL, alphasort);

    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        size_t l = strlen(out);

        snprintf(out + l, len - l, "%s/", v[i]->d_name);
        free(v[i]);
    }
    if (n >= 0)
        free(v);
}

static void scenario_shm(void)
{
    struct world_cfg c = wcfg(3, 1);
    uint16_t base;
    char before[4096], after[4096];
    struct run R;

    /* Large messages by address (one copy), then through the slots (two
     * copies): the join's probe picks one, each path is run here. */
    for (int cma = 1; cma >= 0; cma--) {
        setenv("MESHTRAIN_SHM_CMA", cma ? "1" : "0", 1);
        base = pick_ports(3);
        if (!scenario_start(&R, "shm segment", 3, NULL, &c, base,
                            child_shm_segment, "shmseg")) {
            unsetenv("MESHTRAIN_SHM_CMA");
            return;
        }
        run_finish(&R, 60);
        report_children(&R, "shm segment");
        ok(all_ok(&R),
           "shm: 3 ranks (ranks per CPU: 3 over this machine's CPUs, at "
           "least 1), 300 back-to-back operations each way (and through "
           "the windows, with a host sync), inline and "
           "%s; after close no segment mapped, no descriptor left",
           cma ? "by address (MESHTRAIN_SHM_CMA=1)"
               : "through the slots (MESHTRAIN_SHM_CMA=0)");
        run_cleanup(&R);
    }
    unsetenv("MESHTRAIN_SHM_CMA");

    /* SIGKILL of every rank: nothing of the job outlives it. */
    dev_shm_list(before, sizeof(before));
    base = pick_ports(3);
    if (!scenario_start(&R, "shm kill all", 3, NULL, &c, base, child_shm_hold,
                        "shmkill"))
        return;
    if (run_wait_ready(&R, 3, 20) < 0)
        ok(0, "shm kill all: mesh of 3 did not come up");
    for (int i = 0; i < 3; i++)
        kill(R.pid[i], SIGKILL);
    run_finish(&R, 5);
    dev_shm_list(after, sizeof(after));
    ok(!strcmp(before, after),
       "shm: SIGKILL of every rank leaves nothing in /dev/shm (the segment "
       "is a memfd, freed with its last mapping)");
    run_cleanup(&R);
}

static void scenario_api(void)
{
    struct world_cfg c = wcfg(1, 1);
    struct ctx cx;
    char m[MSG];
    int rc;

    memset(&cx, 0, sizeof(cx));
    cx.cfg = c;
    cx.base = pick_ports(1);
    rc = mesh_up(&cx, m, sizeof(m));
    ok(rc == 0, "a world of one joins at once");
    ops->close(cx.t);
    ops->close(NULL); /* allowed: must not crash */

    memset(&cx, 0, sizeof(cx));
    cx.cfg = c;
    cx.base = pick_ports(1);
    world_build(&cx);
    cx.o.secret = NULL;
    cx.o.secret_len = 0;
    rc = ops->listen(&cx.w, &cx.o, &cx.t);
    ok(rc < 0 && strstr(mesh_err_msg(rc), "--secret-file") &&
           strstr(mesh_err_msg(rc), "--insecure"),
       "no secret and not insecure: refused, saying how to fix it");
    if (rc >= 0)
        ops->close(cx.t);

    cx.o.insecure = 1;
    cx.o.streams = 0;
    cx.t = NULL;
    rc = ops->listen(&cx.w, &cx.o, &cx.t);
    ok(rc < 0, "zero streams refused: %s", mesh_err_msg(rc));
    if (rc >= 0)
        ops->close(cx.t);

    /* Messages give a collective's number in the job, not its seq. */
    {
        struct mesh_frame f = frame(MESH_SEQ_COLL_BASE + 20, 0,
                                    MESH_OP_ALLREDUCE, MESH_DT_F32, 1000, 4000);
        char s1[200], s2[200], s3[200];

        mesh_frame_str(&f, s1, sizeof(s1));
        mesh_frame_p2p(&f, 5, 1, 64);
        mesh_frame_str(&f, s2, sizeof(s2));
        /* shm's own messages over its TCP mesh (SHM_CTRL_SEQ) */
        mesh_frame_p2p(&f, UINT64_MAX - 1, 1, 64);
        mesh_frame_str(&f, s3, sizeof(s3));
        ok(strstr(s1, "allreduce (collective #21)") && !strstr(s1, "4611") &&
               strstr(s1, "count 1000") && strstr(s2, "p2p (message #5)") &&
               strstr(s3, "p2p (transport message (seq 2^64-2))"),
           "frames read as the operation's number and count: '%s', '%s', "
           "'%s'",
           s1, s2, s3);
    }
}

int main(int argc, char **argv)
{
    /* scenario_exchange: peers, streams, insecure */
    static const int exchanges[][3] = {
        {2, 1, 0}, {2, 4, 0}, {2, 1, 1}, {4, 1, 0}, {4, 4, 0}, {8, 2, 0},
    };
    const char *name = argc > 1 ? argv[1] : "tcp";

    signal(SIGPIPE, SIG_IGN);
    ops = mesh_transport_find(name);
    if (!ops) {
        skip_all("transport '%s' is not built", name);
        return 0;
    }
    diag("transport %s", name);
    scenario_api();
    for (size_t i = 0; i < MESH_ARRAY_SIZE(exchanges); i++)
        scenario_exchange(exchanges[i][0], exchanges[i][1], exchanges[i][2]);
    scenario_ipv6();
    for (int mode = 0; mode < 3; mode++)
        scenario_desync(mode);
    scenario_live();
    scenario_goodbye();
    scenario_idle();
    scenario_kill(SIGKILL);
    scenario_kill(SIGSTOP);
    scenario_join_timeout();
    if (!strcmp(name, "shm"))
        scenario_shm();
    if (!strcmp(name, "tcp")) {
        /* A waiter's two other ways to wait (the children inherit these):
         * asleep on the condition variable while the progress thread does
         * the I/O, and in poll() at once, without the spin. */
        scenario_order();
        scenario_view_order();
        scenario_kept_listener();
        scenario_kept_failed();
        diag("waiters sleep while the progress thread reads "
             "(MESHTRAIN_TCP_POLL=0)");
        setenv("MESHTRAIN_TCP_POLL", "0", 1);
        scenario_exchange(4, 2, 0);
        scenario_kill(SIGKILL);
        unsetenv("MESHTRAIN_TCP_POLL");
        diag("waiters poll() without a spin (MESHTRAIN_TCP_SPIN_US=0)");
        setenv("MESHTRAIN_TCP_SPIN_US", "0", 1);
        scenario_exchange(4, 2, 0);
        scenario_exchange(2, 1, 0);
        scenario_kill(SIGKILL);
        scenario_kill(SIGSTOP);
        unsetenv("MESHTRAIN_TCP_SPIN_US");
    }
    return done();
}
