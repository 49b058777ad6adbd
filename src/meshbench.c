/*
 * src/meshbench.c: the mesh's own benchmark.
 *
 *   meshbench [mesh options] [--op pingpong|stream|all] [-b 8] [-e 64M]
 *             [-f 2] [-n 20] [-w 5] [-c 1] [--all-pairs]
 *   meshbench [mesh options] --op allreduce|reduce_scatter|allgather|
 *             broadcast [--algo ring|tree|auto|direct|rd|rhd|hier|htree|hrd|
 *             local|ps]
 *             [--dtype float|half|bfloat16] [-o sum|avg] [--root R]
 *             [--chunk BYTES] [-t S] [--vs-fixed | --rotate]
 *             [--algos A,B] [-b -e -f -n -w -c]
 *
 * Every rank joins the mesh with the common flags (mesh/mesh.h). Ranks pair
 * up (0-1, 2-3, ...; with --all-pairs every pair in turn, round-robin) and
 * run each operation over a sweep of message sizes. Every received byte is
 * checked against the pattern its sender wrote (outside the timed region);
 * rank 0 prints the table for its own pair.
 *
 * Operations are rows of the bench_ops table below. The collectives run
 * on every rank through the communicator of collective/ and print
 * nccl-tests columns instead (src/meshbench_coll.c).
 */
#include "config.h"

#include "mesh/mesh.h"
#include "src/meshbench_coll.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The stream op keeps about this many bytes in flight per iteration. */
#define STREAM_WINDOW_BYTES (4u << 20)
#define STREAM_WINDOW_MAX   64
#define SIZE_MAX_BYTES      (1ull << 32)

struct bench {
    struct mesh *m;
    const struct mesh_transport_ops *ops;
    mesh_transport_t *t;
    int rank, size;
    size_t region; /* bytes in each of sendbuf and recvbuf */
    uint8_t *sendbuf, *recvbuf;
    mesh_mr_t *send_mr, *recv_mr;
    int iters, warmup, check;
    uint64_t errors; /* wrong bytes seen by this rank */
    /* MESHBENCH_TEST_CORRUPT=RANK:OFFSET: that rank flips one byte of its
     * first message longer than OFFSET, to prove the check catches it. */
    int corrupt_rank;
    size_t corrupt_offset;
};

/* One pairing: this rank's partner (-1 = sits this round out). */
struct round {
    int index;
    int partner;
    int lo, hi; /* the pair of rank 0, for the table */
};

struct result {
    double time_us;  /* mean time per timed iteration */
    double lat_us;   /* per message: one-way latency or time per message */
    double gbps;     /* GB/s (1e9 bytes per second) */
    uint64_t errors; /* wrong bytes in this size's exchanges */
};

struct bench_op {
    const char *name;
    int pairwise; /* 1: runs between the two ranks of each pair */
    int (*run)(struct bench *b, const struct round *rd, size_t size,
               struct result *res);
};

/* ---- content: a pattern every receiver can recompute --------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t seed_of(int src, int dst, uint64_t seq, uint32_t slot)
{
    return mix64(seq * 0x9e3779b97f4a7c15ull ^ ((uint64_t)src << 48) ^
                 ((uint64_t)dst << 32) ^ slot);
}

static uint8_t pattern_byte(uint64_t seed, size_t i)
{
    uint64_t w = seed ^ ((uint64_t)(i / 8) * 0x9e3779b97f4a7c15ull);

    return (uint8_t)(w >> (8 * (i % 8)));
}

static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
    size_t i, words = len / 8;

    for (i = 0; i < words; i++) {
        uint64_t w = seed ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull);

        memcpy(buf + 8 * i, &w, 8); /* little-endian hosts: see verify */
    }
    for (i = words * 8; i < len; i++)
        buf[i] = pattern_byte(seed, i);
}

/* The test aid: spoil one byte after the fill, once. */
static void maybe_corrupt(struct bench *b, uint8_t *buf, size_t len)
{
    if (b->rank != b->corrupt_rank || len <= b->corrupt_offset)
        return;
    buf[b->corrupt_offset] ^= 0x5a;
    b->corrupt_rank = -1;
    mesh_warn("MESHBENCH_TEST_CORRUPT: flipped byte %zu of a %zu-byte "
              "message on purpose",
              b->corrupt_offset, len);
}

/* Count wrong bytes; report the first one. */
static uint64_t verify(struct bench *b, const uint8_t *buf, size_t len,
                       uint64_t seed, int from, uint64_t seq, uint32_t slot)
{
    uint64_t bad = 0;
    size_t i, first = 0, words = len / 8;

    for (i = 0; i < words; i++) {
        uint64_t w = seed ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull), got;

        memcpy(&got, buf + 8 * i, 8);
        if (got == w)
            continue;
        for (size_t k = 8 * i; k < 8 * i + 8; k++)
            if (buf[k] != pattern_byte(seed, k) && !bad++)
                first = k;
    }
    for (i = words * 8; i < len; i++)
        if (buf[i] != pattern_byte(seed, i) && !bad++)
            first = i;
    if (bad) {
        mesh_error_log("wrong data from rank %d: %" PRIu64 " of %zu bytes "
                       "differ (message #%" PRIu64 " slot %u), first at offset "
                       "%zu: got 0x%02x, expected 0x%02x",
                       from, bad, len, seq, slot, first, buf[first],
                       pattern_byte(seed, first));
        b->errors += bad;
    }
    return bad;
}

/* ---- point-to-point operations ------------------------------------------- */

static int post_send(struct bench *b, int peer, uint64_t seq, uint32_t tag,
                     const void *buf, size_t len, mesh_req_t **req)
{
    struct mesh_frame f;

    mesh_frame_p2p(&f, seq, tag, len);
    return b->ops->isend(b->t, peer, &f, buf, b->send_mr, req);
}

static int post_recv(struct bench *b, int peer, uint64_t seq, uint32_t tag,
                     void *buf, size_t len, mesh_req_t **req)
{
    struct mesh_frame f;

    mesh_frame_p2p(&f, seq, tag, len);
    return b->ops->irecv(b->t, peer, &f, buf, b->recv_mr, req);
}

/* Wait for n requests; after a failure the rest are reaped too. */
static int wait_all(struct bench *b, mesh_req_t **reqs, int n)
{
    int i, rc = 0, rc2;

    for (i = 0; i < n; i++) {
        rc2 = mesh_transport_wait(b->ops, b->t, reqs[i]);
        if (rc == 0)
            rc = rc2;
    }
    return rc;
}

/*
 * Ping-pong: the pair's lower rank sends size bytes, the other answers
 * with size bytes of its own pattern. Latency is half the round trip.
 */
static int run_pingpong(struct bench *b, const struct round *rd, size_t size,
                        struct result *res)
{
    int me = b->rank, peer = rd->partner, lead = me < peer;
    int total = b->warmup + b->iters, it, rc; /* <= 2 x 10^9 */
    double sum_ns = 0;
    uint64_t bad = 0;

    for (it = 0; it < total; it++) {
        uint64_t seq = mesh_seq_next(b->m);
        uint64_t seed_out = seed_of(me, peer, seq, 0);
        uint64_t seed_in = seed_of(peer, me, seq, 0);
        mesh_req_t *reqs[2];
        uint64_t t0, t1;

        if (peer < 0)
            continue;
        if (b->check) {
            fill(b->sendbuf, size, seed_out);
            maybe_corrupt(b, b->sendbuf, size);
        }
        if (lead) {
            rc = post_recv(b, peer, seq, 1, b->recvbuf, size, &reqs[1]);
            if (rc < 0)
                return rc;
            t0 = mesh_now_ns();
            rc = post_send(b, peer, seq, 0, b->sendbuf, size, &reqs[0]);
            if (rc < 0) {
                wait_all(b, &reqs[1], 1);
                return rc;
            }
            rc = wait_all(b, reqs, 2);
            t1 = mesh_now_ns();
        } else {
            rc = post_recv(b, peer, seq, 0, b->recvbuf, size, &reqs[0]);
            if (rc < 0)
                return rc;
            t0 = mesh_now_ns();
            rc = wait_all(b, reqs, 1);
            if (rc < 0)
                return rc;
            rc = post_send(b, peer, seq, 1, b->sendbuf, size, &reqs[1]);
            if (rc == 0)
                rc = wait_all(b, &reqs[1], 1);
            t1 = mesh_now_ns();
        }
        if (rc < 0)
            return rc;
        if (it >= b->warmup)
            sum_ns += (double)(t1 - t0);
        if (b->check)
            bad += verify(b, b->recvbuf, size, seed_in, peer, seq, 0);
    }
    res->time_us = sum_ns / b->iters / 1e3;
    res->lat_us = res->time_us / 2;
    res->gbps = res->lat_us > 0 ? (double)size / (res->lat_us * 1e3) : 0;
    res->errors = bad;
    return 0;
}

/*
 * A window of messages j = 0..window-1 of size bytes with peer, sent from
 * (send) or received into the slot j of the send or receive buffer, then
 * waited for with the n requests already in reqs.
 */
static int window_wait(struct bench *b, int send, int peer, uint64_t seq,
                       size_t window, size_t size, mesh_req_t **reqs, int n)
{
    int j, rc = 0, rc2;

    for (j = 0; j < (int)window && rc == 0; j++) {
        if (send)
            rc = post_send(b, peer, seq, (uint32_t)j,
                           b->sendbuf + (size_t)j * size, size, &reqs[n]);
        else
            rc = post_recv(b, peer, seq, (uint32_t)j,
                           b->recvbuf + (size_t)j * size, size, &reqs[n]);
        if (rc == 0)
            n++;
    }
    rc2 = wait_all(b, reqs, n);
    return rc < 0 ? rc : rc2;
}

/*
 * Streaming: the sender keeps a window of messages (about 4 MiB, 1 to 64
 * messages) in flight, the receiver acknowledges the whole window; time
 * runs on the sender from the first send to the acknowledgement.
 */
static int stream_dir(struct bench *b, int sender, int receiver, size_t size,
                      struct result *res)
{
    int me = b->rank, total = b->warmup + b->iters, it, j, rc;
    size_t window = STREAM_WINDOW_BYTES / (size ? size : 1);
    mesh_req_t *reqs[STREAM_WINDOW_MAX + 1];
    uint64_t ack = 0, bad = 0;
    double sum_ns = 0;

    if (window < 1)
        window = 1;
    if (window > STREAM_WINDOW_MAX)
        window = STREAM_WINDOW_MAX;
    if (window * size > b->region)
        window = b->region / size;
    for (it = 0; it < total; it++) {
        uint64_t seq = mesh_seq_next(b->m), t0, t1;
        int n = 0;

        if (me == sender) {
            if (b->check)
                for (j = 0; j < (int)window; j++) {
                    fill(b->sendbuf + (size_t)j * size, size,
                         seed_of(me, receiver, seq, (uint32_t)j));
                    maybe_corrupt(b, b->sendbuf + (size_t)j * size, size);
                }
            rc = post_recv(b, receiver, seq, (uint32_t)window, &ack,
                           sizeof(ack), &reqs[n]);
            if (rc < 0)
                return rc;
            n++;
            t0 = mesh_now_ns();
            rc = window_wait(b, 1, receiver, seq, window, size, reqs, n);
            t1 = mesh_now_ns();
            if (rc < 0)
                return rc;
            if (ack != seq)
                return mesh_err(-EPROTO,
                                "stream: acknowledgement %" PRIu64
                                " from rank %d, expected %" PRIu64,
                                ack, receiver, seq);
            if (it >= b->warmup)
                sum_ns += (double)(t1 - t0);
        } else if (me == receiver) {
            rc = window_wait(b, 0, sender, seq, window, size, reqs, n);
            if (rc < 0)
                return rc;
            ack = seq;
            rc = post_send(b, sender, seq, (uint32_t)window, &ack, sizeof(ack),
                           &reqs[0]);
            if (rc == 0)
                rc = wait_all(b, reqs, 1);
            if (rc < 0)
                return rc;
            if (b->check)
                for (j = 0; j < (int)window; j++)
                    bad += verify(b, b->recvbuf + (size_t)j * size, size,
                                  seed_of(sender, me, seq, (uint32_t)j), sender,
                                  seq, (uint32_t)j);
        }
    }
    if (me == sender) {
        res->time_us = sum_ns / b->iters / 1e3;
        res->lat_us = res->time_us / (double)window;
        res->gbps =
            sum_ns > 0 ? (double)size * (double)window * b->iters / sum_ns : 0;
    }
    res->errors += bad;
    return 0;
}

static int run_stream(struct bench *b, const struct round *rd, size_t size,
                      struct result *res)
{
    int lo, hi, rc;

    if (rd->partner < 0) {
        /* Sit out, but keep the sequence numbers in step. */
        int dirs = rd->index >= 0 ? 2 : 1;

        for (long it = 0; it < dirs * ((long)b->warmup + b->iters); it++)
            mesh_seq_next(b->m);
        return 0;
    }
    lo = MESH_MIN(b->rank, rd->partner);
    hi = MESH_MAX(b->rank, rd->partner);
    rc = stream_dir(b, lo, hi, size, res);
    if (rc < 0 || rd->index < 0)
        return rc;
    /* --all-pairs: the other direction too, so every link is checked. */
    {
        struct result back = {0};

        rc = stream_dir(b, hi, lo, size, &back);
        res->errors += back.errors;
    }
    return rc;
}

/*
 * The point-to-point operations, in the order they run; the collectives
 * follow them (src/meshbench_coll.c).
 */
static const struct bench_op bench_ops[] = {
    {"pingpong", 1, run_pingpong},
    {"stream", 1, run_stream},
};

/* ---- pairing ------------------------------------------------------------ */

/*
 * Round-robin tournament (circle method) over n ranks, n - 1 rounds for
 * even n and n for odd n (one rank rests each round). all_pairs = 0 uses
 * the fixed pairing 0-1, 2-3, ... instead (index -1).
 */
static int partner_of(int n, int all_pairs, int round, int r)
{
    int m, k;

    if (!all_pairs) {
        int p = r ^ 1;

        return p < n ? p : -1;
    }
    m = n % 2 ? n + 1 : n; /* with a virtual resting rank for odd n */
    if (r == m - 1)
        goto fixed;
    k = ((2 * round - r) % (m - 1) + (m - 1)) % (m - 1);
    if (k == r)
        k = m - 1;
    return k < n ? k : -1;
fixed:
    for (k = 0; k < m - 1; k++)
        if ((((2 * round - k) % (m - 1) + (m - 1)) % (m - 1)) == k)
            return k;
    return -1;
}

static int rounds_of(int n, int all_pairs)
{
    if (!all_pairs)
        return 1;
    return n % 2 ? n : n - 1;
}

/* ---- flags -------------------------------------------------------------- */

static int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v;
    unsigned long long mul = 1;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s)
        goto bad;
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10;
    else if (*end == 'M' || *end == 'm')
        mul = 1ull << 20;
    else if (*end == 'G' || *end == 'g')
        mul = 1ull << 30;
    else if (*end)
        goto bad;
    if (mul > 1 && end[1])
        goto bad;
    if (v == 0 || v > SIZE_MAX_BYTES / mul)
        goto bad;
    *out = (size_t)(v * mul);
    return 0;
bad:
    return mesh_err(-EINVAL,
                    "size '%s': expected bytes from 1 to 4G, "
                    "with an optional K, M or G suffix",
                    s);
}

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: meshbench [mesh options] [options]\n"
            "\n"
            "Benchmark of the mesh. Point to point: every rank joins, ranks\n"
            "pair up (0-1, 2-3, ...) and exchange messages over a sweep of\n"
            "sizes; every received byte is verified. Rank 0 prints a table\n"
            "for its own pair. Collectives: every rank takes part, rank 0\n"
            "prints nccl-tests columns.\n"
            "\n"
            "  --op OP            pingpong, stream, all (both; the default),\n"
            "                     allreduce, reduce_scatter, allgather or\n"
            "                     broadcast; may be repeated or\n"
            "                     comma-separated\n"
            "  -b, --minbytes N   smallest message (default 8; K, M, G "
            "suffixes)\n"
            "  -e, --maxbytes N   largest message (default 64M)\n"
            "  -f, --stepfactor F multiply the size by F each step (default "
            "2)\n"
            "  -n, --iters N      timed iterations per size (default 20, at\n"
            "                     most 10^9; 10^5 with --vs-fixed/--rotate)\n"
            "  -w, --warmup N     untimed iterations first (default 5)\n"
            "  -c, --check 0|1    verify every received byte (default 1)\n"
            "  --all-pairs        every pair of ranks in turn (round-robin),\n"
            "                     streaming both ways: checks every link\n"
            "  -h, --help         this text\n"
            "\n"
            "pingpong: lat_us is half the round trip, GB/s = size / lat.\n"
            "stream: a window of messages (about 4 MiB, at most 64) in "
            "flight,\n"
            "acknowledged per window; lat_us = time per message.\n"
            "\n"
            "%s\n%s\n%s",
            meshbench_coll_help(), mesh_opts_help(), mesh_exit_help());
}

static int select_op(const char *list, int *mask, int *coll_mask)
{
    char buf[256], *tok, *save = NULL;

    snprintf(buf, sizeof(buf), "%s", list);
    for (tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        size_t k;

        int bit;

        if (!strcmp(tok, "all")) {
            *mask |= (1 << MESH_ARRAY_SIZE(bench_ops)) - 1;
            continue;
        }
        if (meshbench_coll_op(tok, &bit)) {
            *coll_mask |= bit;
            continue;
        }
        for (k = 0; k < MESH_ARRAY_SIZE(bench_ops); k++)
            if (!strcmp(tok, bench_ops[k].name))
                break;
        if (k == MESH_ARRAY_SIZE(bench_ops))
            return mesh_err(-EINVAL,
                            "--op '%s': expected pingpong, stream, "
                            "all, allreduce, reduce_scatter, "
                            "allgather or broadcast",
                            tok);
        *mask |= 1 << k;
    }
    return 0;
}

struct args {
    int op_mask;
    size_t minbytes, maxbytes;
    int factor;
    int iters, warmup, check, all_pairs;
    struct meshbench_coll_args coll; /* collective ops and their flags */
};

static int is_value_option(const char *arg)
{
    static const char *const names[] = {
        "--op",     "-b",           "--minbytes", "-e",      "--maxbytes",
        "-f",       "--stepfactor", "-n",         "--iters", "-w",
        "--warmup", "-c",           "--check"};

    for (size_t k = 0; k < MESH_ARRAY_SIZE(names); k++)
        if (!strcmp(arg, names[k]))
            return 1;
    return 0;
}

/* Returns 1 for --help, 0 to run, < 0 on a usage error. */
static int parse_args(struct mesh_opts *mo, struct args *a, int argc,
                      char **argv)
{
    int i = 1, rc;

    while (i < argc) {
        const char *arg = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;

        rc = mesh_opts_parse_arg(mo, argc, argv, &i);
        if (rc < 0)
            return rc;
        if (rc == 1)
            continue;
        rc = meshbench_coll_parse_arg(&a->coll, argc, argv, &i);
        if (rc < 0)
            return rc;
        if (rc == 1)
            continue;
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help"))
            return 1;
        if (!strcmp(arg, "--all-pairs")) {
            a->all_pairs = 1;
            i++;
            continue;
        }
        if (!is_value_option(arg))
            return mesh_err(-EINVAL,
                            arg[0] == '-' ? "unknown option %s (see "
                                            "--help)"
                                          : "unexpected argument "
                                            "'%s' (see --help)",
                            arg);
        if (!v)
            return mesh_err(-EINVAL, "%s needs a value (see --help)", arg);
        if (!strcmp(arg, "--op"))
            rc = select_op(v, &a->op_mask, &a->coll.ops);
        else if (!strcmp(arg, "-b") || !strcmp(arg, "--minbytes"))
            rc = parse_size(v, &a->minbytes);
        else if (!strcmp(arg, "-e") || !strcmp(arg, "--maxbytes"))
            rc = parse_size(v, &a->maxbytes);
        else if (!strcmp(arg, "-f") || !strcmp(arg, "--stepfactor"))
            rc = mesh_parse_int(arg, v, 2, 1000000, &a->factor);
        else if (!strcmp(arg, "-n") || !strcmp(arg, "--iters"))
            rc = mesh_parse_int(arg, v, 1, 1000000000, &a->iters);
        else if (!strcmp(arg, "-w") || !strcmp(arg, "--warmup"))
            rc = mesh_parse_int(arg, v, 0, 1000000000, &a->warmup);
        else if (!strcmp(arg, "-c") || !strcmp(arg, "--check")) {
            rc = mesh_parse_int(arg, v, 0, 1000000, &a->check);
            if (rc == 0 && a->check > 1)
                rc = mesh_err(-EINVAL, "%s '%s': expected 0 or 1", arg, v);
        } else
            rc = mesh_err(-EINVAL, "unhandled option %s", arg);
        if (rc < 0)
            return rc;
        i += 2;
    }
    if (a->minbytes > a->maxbytes)
        return mesh_err(-EINVAL, "-b %zu is larger than -e %zu", a->minbytes,
                        a->maxbytes);
    /* --vs-fixed keeps every run's time: -n runs of each algorithm. */
    if ((a->coll.vs_fixed || a->coll.rotate) && a->iters > 100000)
        return mesh_err(-EINVAL, "-n %d with %s: at most 100000", a->iters,
                        a->coll.vs_fixed ? "--vs-fixed" : "--rotate");
    rc = meshbench_coll_args_check(&a->coll);
    if (rc < 0)
        return rc;
    if (!a->op_mask && !a->coll.ops)
        a->op_mask = (1 << MESH_ARRAY_SIZE(bench_ops)) - 1;
    a->coll.minbytes = a->minbytes;
    a->coll.maxbytes = a->maxbytes;
    a->coll.factor = a->factor;
    a->coll.iters = a->iters;
    a->coll.warmup = a->warmup;
    a->coll.check = a->check;
    return 0;
}

/* ---- the driver ---------------------------------------------------------- */

static void print_header(const struct bench *b, const struct args *a,
                         const struct mesh_opts *mo)
{
    printf("# meshbench: %d ranks, transport %s, %d stream(s) per link, "
           "iters %d, warmup %d, check %s%s\n",
           b->size, mo->transport, mo->streams, b->iters, b->warmup,
           b->check ? "on" : "off", mo->topts.insecure ? ", insecure" : "");
    printf("# pairs: %s; rank 0 reports its own pair\n",
           a->all_pairs ? "every pair in turn" : "0-1, 2-3, ...");
    printf("# %-9s %7s %12s %12s %12s %10s %8s\n", "op", "pair", "size",
           "time_us", "lat_us", "GB/s", "errors");
    fflush(stdout);
}

static int run_all(struct bench *b, const struct args *a)
{
    int nrounds = rounds_of(b->size, a->all_pairs);
    size_t k;

    for (k = 0; k < MESH_ARRAY_SIZE(bench_ops); k++) {
        const struct bench_op *op = &bench_ops[k];
        int rounds = op->pairwise ? nrounds : 1;

        if (!(a->op_mask & (1 << k)))
            continue;
        for (int r = 0; r < rounds; r++) {
            struct round rd = {.index = a->all_pairs ? r : -1};

            rd.partner = partner_of(b->size, a->all_pairs, r, b->rank);
            for (size_t size = a->minbytes;;) {
                struct result res = {0};
                char pair[32];
                int rc;

                rc = op->run(b, &rd, size, &res);
                if (rc < 0)
                    return mesh_err_prefix(rc, "%s of %zu bytes", op->name,
                                           size);
                if (b->rank == 0) {
                    if (rd.partner < 0)
                        snprintf(pair, sizeof(pair), "rest");
                    else
                        snprintf(pair, sizeof(pair), "0-%d", rd.partner);
                    printf("  %-9s %7s %12zu %12.2f %12.2f %10.4f %8" PRIu64
                           "\n",
                           op->name, pair, size, res.time_us, res.lat_us,
                           res.gbps, res.errors);
                    fflush(stdout);
                }
                if (size > a->maxbytes / (size_t)a->factor)
                    break;
                size *= (size_t)a->factor;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct args a = {.minbytes = 8,
                     .maxbytes = 64u << 20,
                     .factor = 2,
                     .iters = 20,
                     .warmup = 5,
                     .check = 1};
    struct bench b;
    struct mesh_opts mo;
    int rc, code = MESH_EXIT_USAGE;

    mesh_log_set_program("meshbench");
    memset(&b, 0, sizeof(b));
    b.corrupt_rank = -1;
    meshbench_coll_args_init(&a.coll);
    mesh_opts_init(&mo);
    rc = parse_args(&mo, &a, argc, argv);
    if (rc == 1) {
        usage(stdout);
        return MESH_EXIT_OK;
    }
    if (rc < 0) {
        fprintf(stderr, "meshbench: %s\n", mesh_err_msg(rc));
        return MESH_EXIT_USAGE;
    }
    rc = mesh_opts_finish(&mo);
    if (rc < 0) {
        fprintf(stderr, "meshbench: %s\n", mesh_err_msg(rc));
        return MESH_EXIT_USAGE;
    }
    if (mo.world.size < 2) {
        fprintf(stderr,
                "meshbench: needs at least 2 ranks, the hosts "
                "have %d slot\n",
                mo.world.size);
        goto out_opts;
    }
    rc = mesh_bind(&mo, NULL);
    if (rc < 0) {
        fprintf(stderr, "meshbench: %s\n", mesh_err_msg(rc));
        goto out_opts;
    }
    {
        const char *c = getenv("MESHBENCH_TEST_CORRUPT");
        unsigned long long off;
        int r, n = 0;

        if (c && (sscanf(c, "%d:%llu%n", &r, &off, &n) != 2 || c[n])) {
            fprintf(stderr,
                    "meshbench: MESHBENCH_TEST_CORRUPT='%s': "
                    "expected RANK:OFFSET\n",
                    c);
            goto out_opts;
        }
        if (c) {
            b.corrupt_rank = r;
            b.corrupt_offset = (size_t)off;
            a.coll.corrupt_rank = r;
            a.coll.corrupt_offset = (size_t)off;
        }
    }
    b.iters = a.iters;
    b.warmup = a.warmup;
    b.check = a.check;
    /* The collectives bring their own (registered) buffers. */
    b.region =
        a.op_mask ? MESH_MAX(a.maxbytes, (size_t)STREAM_WINDOW_BYTES) : 4096;
    rc = mesh_host_alloc(b.region, (void **)&b.sendbuf);
    if (rc == 0)
        rc = mesh_host_alloc(b.region, (void **)&b.recvbuf);
    if (rc < 0) {
        fprintf(stderr, "meshbench: %s\n", mesh_err_msg(rc));
        goto out_bufs;
    }
    {
        char config[512];
        size_t used;

        /* Peers must run the same sweep, or they would desync. */
        snprintf(config, sizeof(config),
                 "program=meshbench\nops=%d\nminbytes=%zu\nmaxbytes=%zu\n"
                 "factor=%d\niters=%d\nwarmup=%d\ncheck=%d\nall_pairs=%d\n",
                 a.op_mask, a.minbytes, a.maxbytes, a.factor, a.iters, a.warmup,
                 a.check, a.all_pairs);
        used = strlen(config);
        meshbench_coll_config(&a.coll, config + used, sizeof(config) - used);
        rc = mesh_open(&mo, config, &b.m);
    }
    if (rc < 0) {
        fprintf(stderr, "meshbench: rank %d: cannot join the mesh: %s\n",
                mo.world.rank, mesh_err_msg(rc));
        code = MESH_EXIT_JOIN;
        goto out_bufs;
    }
    b.ops = mesh_ops(b.m);
    b.t = mesh_transport(b.m);
    b.rank = mesh_rank(b.m);
    b.size = mesh_size(b.m);
    code = MESH_EXIT_PEER;
    rc = b.ops->reg_mr(b.t, b.sendbuf, b.region, &b.send_mr);
    if (rc == 0)
        rc = b.ops->reg_mr(b.t, b.recvbuf, b.region, &b.recv_mr);
    if (rc < 0) {
        fprintf(stderr, "meshbench: rank %d: %s\n", b.rank, mesh_err_msg(rc));
        goto out_mesh;
    }
    if (b.rank == 0 && a.op_mask)
        print_header(&b, &a, &mo);
    rc = run_all(&b, &a);
    if (rc == 0 && a.coll.ops) {
        uint64_t wrong = 0;

        rc = meshbench_coll_run(b.m, &a.coll, &wrong);
        b.errors += wrong;
    }
    if (rc == 0)
        rc = mesh_barrier(b.m);
    if (rc < 0) {
        fprintf(stderr, "meshbench: rank %d: %s\n", b.rank, mesh_err_msg(rc));
        goto out_mr;
    }
    if (b.errors) {
        fprintf(stderr,
                "meshbench: rank %d: %" PRIu64 " wrong bytes "
                "received\n",
                b.rank, b.errors);
        code = MESH_EXIT_VERIFY;
    } else {
        code = MESH_EXIT_OK;
    }
out_mr:
    if (b.recv_mr)
        b.ops->dereg_mr(b.t, b.recv_mr);
    if (b.send_mr)
        b.ops->dereg_mr(b.t, b.send_mr);
out_mesh:
    mesh_close(b.m);
out_bufs:
    mesh_host_free(b.recvbuf, b.region);
    mesh_host_free(b.sendbuf, b.region);
out_opts:
    mesh_opts_free(&mo);
    return code;
}
