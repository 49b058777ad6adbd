/*
 * mpi_allreduce: the Open MPI anchor of bench/collectives.sh. Times
 * MPI_Allreduce (float32, sum, out-of-place) over a geometric range of
 * sizes and prints nccl-tests' columns, so that its output reads (and
 * parses) like meshbench's:
 *
 *   size(B) count type redop root time(us) algbw(GB/s) busbw(GB/s) #wrong
 *
 * busbw = algbw * 2(n-1)/n, GB = 1e9 bytes; time is the slowest rank's
 * mean over the timed iterations. Every rank contributes rank+1 (+ a small
 * per-element pattern), so every sum is exact and checked after timing.
 *
 * Built by bench/collectives.sh with mpicc (or `make bench/mpi_allreduce`
 * when configure found mpicc); not part of make check.
 *
 * usage: mpi_allreduce [-b min] [-e max] [-f factor] [-n iters]
 *                      [-w warmup] [-t seconds]
 * Sizes take K/M/G suffixes (powers of 1024). Iterations per size are
 * min(iters, max(1, seconds / one-iteration-time)), decided by rank 0;
 * defaults: -b 8 -e 64M -f 2 -n 200 -w 2 -t 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

static int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v;
    unsigned long long mul = 1;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1ULL << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1ULL << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1ULL << 30;
        end++;
        break;
    default:
        break;
    }
    if (*end != '\0' || v > SIZE_MAX / mul)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The value rank r contributes at element i; small integers, exact sums. */
static float pattern(int r, size_t i)
{
    return (float)(r + 1 + (int)(i % 7));
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mpi_allreduce [-b min] [-e max] [-f factor] "
               "[-n iters] [-w warmup] [-t seconds]\n");
}

int main(int argc, char **argv)
{
    size_t minb = 8, maxb = 64u << 20, factor = 2;
    long iters = 200, warmup = 2;
    double target = 1.0;
    int rank, nranks, opt, status = 0;
    float *sbuf = NULL, *rbuf = NULL;
    long total_wrong = 0;
    double bw_sum = 0;
    int bw_n = 0;

    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "mpi_allreduce: MPI_Init failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    while ((opt = getopt(argc, argv, "b:e:f:n:w:t:h")) != -1) {
        char *end = NULL;
        int bad = 0;

        switch (opt) {
        case 'b':
            bad = parse_size(optarg, &minb) != 0 || minb < 4;
            break;
        case 'e':
            bad = parse_size(optarg, &maxb) != 0;
            break;
        case 'f':
            bad = parse_size(optarg, &factor) != 0 || factor < 2;
            break;
        case 'n':
            iters = strtol(optarg, &end, 10);
            bad = *end != '\0' || iters < 1;
            break;
        case 'w':
            warmup = strtol(optarg, &end, 10);
            bad = *end != '\0' || warmup < 0;
            break;
        case 't':
            target = strtod(optarg, &end);
            bad = *end != '\0' || !(target > 0);
            break;
        case 'h':
            if (rank == 0)
                usage(stdout);
            MPI_Finalize();
            return 0;
        default:
            bad = 1;
            break;
        }
        if (bad) {
            if (rank == 0) {
                if (opt != '?')
                    fprintf(stderr,
                            "mpi_allreduce: bad value '%s' for "
                            "-%c\n",
                            optarg, opt);
                usage(stderr);
            }
            MPI_Finalize();
            return 2;
        }
    }
    if (maxb < minb || maxb / sizeof(float) > (size_t)INT32_MAX) {
        if (rank == 0)
            fprintf(stderr, "mpi_allreduce: need 4 <= min <= max < 8 GiB\n");
        MPI_Finalize();
        return 2;
    }

    sbuf = malloc(maxb);
    rbuf = malloc(maxb);
    if (sbuf == NULL || rbuf == NULL) {
        fprintf(stderr,
                "mpi_allreduce: rank %d: cannot allocate 2 x %zu "
                "bytes\n",
                rank, maxb);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < maxb / sizeof(float); i++)
        sbuf[i] = pattern(rank, i);

    if (rank == 0) {
        printf("# mpi_allreduce: %d ranks, MPI_Allreduce float sum, "
               "out-of-place\n",
               nranks);
        printf("#%12s %12s %8s %6s %6s %10s %8s %8s %6s\n", "size", "count",
               "type", "redop", "root", "time", "algbw", "busbw", "#wrong");
        printf("#%12s %12s %8s %6s %6s %10s %8s %8s %6s\n", "(B)", "(elements)",
               "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
        fflush(stdout);
    }

    for (size_t bytes = minb; bytes <= maxb;) {
        int count = (int)(bytes / sizeof(float));
        double t0, t1, mine, slowest;
        long n = iters, wrong = 0, all_wrong = 0;
        float expect_base = (float)nranks * (float)(nranks + 1) / 2.0f;

        for (long w = 0; w < warmup; w++)
            MPI_Allreduce(sbuf, rbuf, count, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        /* One timed call decides how many fit in the time target. */
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now_s();
        MPI_Allreduce(sbuf, rbuf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        mine = now_s() - t0;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (slowest > 0 && target / slowest < (double)n)
            n = (long)(target / slowest);
        if (n < 1)
            n = 1;
        MPI_Bcast(&n, 1, MPI_LONG, 0, MPI_COMM_WORLD);

        memset(rbuf, 0, bytes);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now_s();
        for (long it = 0; it < n; it++)
            MPI_Allreduce(sbuf, rbuf, count, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        t1 = now_s();
        mine = (t1 - t0) / (double)n;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

        for (int i = 0; i < count; i++) {
            float want = expect_base + (float)nranks * (float)(i % 7);

            if (rbuf[i] != want)
                wrong++;
        }
        MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

        if (rank == 0) {
            /* Sizes that are not a multiple of 4 move whole floats only. */
            size_t moved = (size_t)count * sizeof(float);
            double algbw = (double)moved / slowest / 1e9;
            double busbw = algbw * 2.0 * (nranks - 1) / nranks;

            printf(" %12zu %12d %8s %6s %6d %10.1f %8.3f %8.3f %6ld\n", moved,
                   count, "float", "sum", -1, slowest * 1e6, algbw, busbw,
                   all_wrong);
            fflush(stdout);
            total_wrong += all_wrong;
            bw_sum += busbw;
            bw_n++;
        }
        if (bytes > maxb / factor)
            break;
        bytes *= factor;
    }
    if (rank == 0) {
        printf("# Out of bounds values : %ld %s\n", total_wrong,
               total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n", bw_n ? bw_sum / bw_n : 0.0);
        status = total_wrong != 0;
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(rbuf);
    free(sbuf);
    MPI_Finalize();
    return status;
}
