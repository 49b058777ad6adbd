/*
 * tests/bench_transport.c: two peers on 127.0.0.1, one transport:
 * streaming throughput and small-message ping-pong. A developer's tool
 * (not run by make check); meshbench is the user-facing benchmark.
 *
 *   tests/bench_transport [-t tcp] [-s STREAMS] [-m BYTES] [-n MESSAGES]
 *                         [-w WINDOW] [-p PINGS] [-b PINGBYTES] [-P PORT]
 *                         [-r RANK -A HOST0 -B HOST1]
 *
 * Without -r both ranks run here (fork) on 127.0.0.1; with -r only that
 * rank runs, rank i listening at HOSTi:PORT+i (e.g. one per namespace).
 */
#include "config.h"

#include "common/util.h"
#include "transport/transport.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct bopts {
    const char *transport;
    int streams;
    size_t msg;
    int nmsg;
    int window;
    int pings;
    size_t ping_bytes;
    uint16_t port;
    const char *hosts[2];
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static int peer_main(int rank, const struct bopts *b)
{
    const struct mesh_transport_ops *ops = mesh_transport_find(b->transport);
    struct mesh_peer peers[2];
    struct mesh_world w = {.rank = rank, .size = 2, .peers = peers};
    struct mesh_transport_opts o;
    mesh_transport_t *t = NULL;
    mesh_req_t **reqs = NULL;
    uint8_t *buf = NULL;
    double *lat = NULL;
    int rc, other = 1 - rank;

    if (!ops) {
        fprintf(stderr, "no transport %s\n", b->transport);
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        snprintf(peers[i].host, sizeof(peers[i].host), "%s", b->hosts[i]);
        peers[i].port = (uint16_t)(b->port + i);
        peers[i].local_rank = i;
    }
    mesh_transport_opts_init(&o);
    o.streams = b->streams;
    o.insecure = 1;
    mesh_log_set_level(MESH_LOG_ERROR);
    rc = ops->listen(&w, &o, &t);
    if (rc >= 0)
        rc = ops->connect(t);
    if (rc < 0)
        goto out;
    buf = malloc(b->msg * (size_t)b->window);
    reqs = calloc((size_t)b->window, sizeof(*reqs));
    lat = calloc((size_t)b->pings, sizeof(*lat));
    if (!buf || !reqs || !lat) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    memset(buf, rank + 1, b->msg * (size_t)b->window);

    /* Ping-pong: rank 0 sends, rank 1 answers. */
    for (int i = -100; i < b->pings; i++) {
        struct mesh_frame f = {.seq = (uint64_t)(i + 1000),
                               .op = MESH_OP_P2P,
                               .count = b->ping_bytes,
                               .length = b->ping_bytes};
        double t0 = mesh_now_s();
        mesh_req_t *r;

        for (int leg = 0; leg < 2; leg++) {
            if ((leg == 0) == (rank == 0))
                rc = ops->isend(t, other, &f, buf, NULL, &r);
            else
                rc = ops->irecv(t, other, &f, buf, NULL, &r);
            if (rc >= 0)
                rc = mesh_transport_wait(ops, t, r);
            if (rc < 0)
                goto out;
        }
        if (i >= 0)
            lat[i] = mesh_now_s() - t0;
    }
    if (rank == 0 && b->pings > 0) {
        double sum = 0;

        for (int i = 0; i < b->pings; i++)
            sum += lat[i];
        qsort(lat, (size_t)b->pings, sizeof(*lat), cmp_double);
        printf("ping-pong %zu B: mean %.1f us, median %.1f us, p99 %.1f us "
               "(round trip, %d pings)\n",
               b->ping_bytes, sum / b->pings * 1e6, lat[b->pings / 2] * 1e6,
               lat[b->pings * 99 / 100] * 1e6, b->pings);
    }

    /* Streaming: rank 0 sends nmsg messages, window in flight. */
    {
        double t0 = mesh_now_s();
        int posted = 0, finished = 0;

        while (finished < b->nmsg) {
            while (posted < b->nmsg && posted - finished < b->window) {
                int slot = posted % b->window;
                struct mesh_frame f = {.seq = (uint64_t)posted,
                                       .op = MESH_OP_P2P,
                                       .count = b->msg,
                                       .length = b->msg};
                uint8_t *p = buf + (size_t)slot * b->msg;

                rc = rank == 0 ? ops->isend(t, 1, &f, p, NULL, &reqs[slot])
                               : ops->irecv(t, 0, &f, p, NULL, &reqs[slot]);
                if (rc < 0)
                    goto out;
                posted++;
            }
            rc = mesh_transport_wait(ops, t, reqs[finished % b->window]);
            if (rc < 0)
                goto out;
            finished++;
        }
        if (rank == 1) {
            double s = mesh_now_s() - t0;

            printf("stream %zu B x %d, %d stream%s, window %d: %.3f GB/s "
                   "(%.2f Gbit/s)\n",
                   b->msg, b->nmsg, b->streams, b->streams > 1 ? "s" : "",
                   b->window, (double)b->msg * b->nmsg / s / 1e9,
                   (double)b->msg * b->nmsg * 8 / s / 1e9);
        }
    }
    /* Both sides are done before either says goodbye. */
    {
        struct mesh_frame f = {.seq = 1u << 30, .op = MESH_OP_BARRIER};
        mesh_req_t *s, *r;

        rc = ops->isend(t, other, &f, buf, NULL, &s);
        if (rc >= 0)
            rc = ops->irecv(t, other, &f, buf, NULL, &r);
        if (rc >= 0)
            rc = mesh_transport_wait(ops, t, s);
        if (rc >= 0)
            rc = mesh_transport_wait(ops, t, r);
    }
out:
    if (rc < 0)
        fprintf(stderr, "rank %d: %s\n", rank, mesh_err_msg(rc));
    free(lat);
    free(reqs);
    free(buf);
    if (t)
        ops->close(t);
    return rc < 0;
}

int main(int argc, char **argv)
{
    struct bopts b = {.transport = "tcp",
                      .streams = 1,
                      .msg = 64u << 20,
                      .nmsg = 32,
                      .window = 2,
                      .pings = 10000,
                      .ping_bytes = 8,
                      .port = 0,
                      .hosts = {"127.0.0.1", "127.0.0.1"}};
    pid_t pid;
    int c, st, rc, only = -1;

    while ((c = getopt(argc, argv, "t:s:m:n:w:p:b:P:r:A:B:h")) != -1) {
        switch (c) {
        case 't':
            b.transport = optarg;
            break;
        case 's':
            b.streams = atoi(optarg);
            break;
        case 'm':
            b.msg = (size_t)strtoull(optarg, NULL, 0);
            break;
        case 'n':
            b.nmsg = atoi(optarg);
            break;
        case 'w':
            b.window = atoi(optarg);
            break;
        case 'p':
            b.pings = atoi(optarg);
            break;
        case 'b':
            b.ping_bytes = (size_t)strtoull(optarg, NULL, 0);
            break;
        case 'P':
            b.port = (uint16_t)atoi(optarg);
            break;
        case 'r':
            only = atoi(optarg);
            break;
        case 'A':
            b.hosts[0] = optarg;
            break;
        case 'B':
            b.hosts[1] = optarg;
            break;
        default:
            fprintf(stderr,
                    "usage: %s [-t tcp] [-s STREAMS] [-m BYTES] [-n MESSAGES] "
                    "[-w WINDOW] [-p PINGS] [-b PINGBYTES] [-P PORT] "
                    "[-r RANK -A HOST0 -B HOST1]\n",
                    argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    if (b.streams < 1 || b.window < 1 || b.nmsg < 1 || b.pings < 0 ||
        b.ping_bytes > b.msg || only > 1) {
        fprintf(stderr, "%s: bad arguments\n", argv[0]);
        return 2;
    }
    if (only >= 0) {
        if (!b.port)
            b.port = 29400;
        return peer_main(only, &b);
    }
    if (!b.port)
        b.port = (uint16_t)(30000 + getpid() % 20000);
    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        rc = peer_main(1, &b);
        fflush(stdout);
        _exit(rc);
    }
    rc = peer_main(0, &b);
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
        rc = 1;
    return rc;
}
