/*
 * src/meshbench_coll.c: meshbench's collective operations, nccl-tests style.
 *
 * For each size of the sweep and each placement (out of place, then in
 * place): one checked run (inputs are small integers, so every sum is exact
 * in any order and the expected value is known), the warmup runs, then the
 * timed runs. The time of a size is the slowest rank's mean. Columns and
 * bus bandwidth follow nccl-tests (doc/PERFORMANCE.md there):
 *   size   bytes of the whole buffer (all-gather / reduce-scatter: all
 *          ranks' blocks together), count = size / type size
 *   algbw  size / time
 *   busbw  algbw x 2(n-1)/n (all-reduce), x (n-1)/n (reduce-scatter,
 *          all-gather), x 1 (broadcast)
 * The algorithm actually run (auto resolved) closes each row.
 */
#include "config.h"

#include "src/meshbench_coll.h"
#include "collective/collective.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The input pattern repeats every PERIOD elements, a prime, so that a
 * block or chunk moved by a whole number of periods is unlikely to land on
 * a count or offset an algorithm uses; its values hash the rank and the
 * index, so that no two ranks' blocks are alike at any per-rank count.
 */
#define PERIOD 4099

static const struct {
    const char *name;
    int bit;
    int op; /* enum mesh_op */
} coll_ops[] = {
    {"allreduce", MESHBENCH_ALLREDUCE, MESH_OP_ALLREDUCE},
    {"reduce_scatter", MESHBENCH_REDUCE_SCATTER, MESH_OP_REDUCE_SCATTER},
    {"allgather", MESHBENCH_ALLGATHER, MESH_OP_ALLGATHER},
    {"broadcast", MESHBENCH_BROADCAST, MESH_OP_BROADCAST},
};

void meshbench_coll_args_init(struct meshbench_coll_args *a)
{
    memset(a, 0, sizeof(*a));
    a->algo = MESH_ALGO_AUTO;
    a->dtype = MESH_DT_F32;
    a->redop = MESH_REDOP_SUM;
    a->corrupt_rank = -1;
}

int meshbench_coll_op(const char *name, int *bit)
{
    for (size_t k = 0; k < MESH_ARRAY_SIZE(coll_ops); k++)
        if (!strcmp(name, coll_ops[k].name)) {
            *bit = coll_ops[k].bit;
            return 1;
        }
    return 0;
}

/* nccl-tests' names for the types */
static const char *type_name(int dtype)
{
    switch (dtype) {
    case MESH_DT_F16:
        return "half";
    case MESH_DT_BF16:
        return "bfloat16";
    default:
        return "float";
    }
}

static int parse_dtype(const char *s, int *out)
{
    if (!strcmp(s, "float") || !strcmp(s, "float32"))
        *out = MESH_DT_F32;
    else if (!strcmp(s, "half") || !strcmp(s, "float16"))
        *out = MESH_DT_F16;
    else if (!strcmp(s, "bfloat16") || !strcmp(s, "bf16"))
        *out = MESH_DT_BF16;
    else
        return mesh_err(-EINVAL,
                        "--dtype '%s': expected float, half or "
                        "bfloat16",
                        s);
    return 0;
}

/* --algos LIST: fixed algorithms, each once, into a->algos. */
static int parse_algos(const char *list, struct meshbench_coll_args *a)
{
    char name[32];
    const char *p = list;

    a->nalgos = 0;
    while (*p) {
        size_t len = strcspn(p, ",");
        int id, rc;

        if (len == 0 || len >= sizeof(name))
            return mesh_err(-EINVAL,
                            "--algos '%s': expected names split "
                            "by commas",
                            list);
        memcpy(name, p, len);
        name[len] = 0;
        rc = mesh_algo_parse(name, &id);
        if (rc < 0)
            return mesh_err_prefix(rc, "--algos");
        if (id == MESH_ALGO_AUTO)
            return mesh_err(-EINVAL,
                            "--algos '%s': auto always runs; list "
                            "the fixed algorithms",
                            list);
        for (int k = 0; k < a->nalgos; k++)
            if (a->algos[k] == id)
                return mesh_err(-EINVAL, "--algos '%s': %s twice", list, name);
        a->algos[a->nalgos++] = id;
        p += len;
        if (*p == ',' && !*++p)
            return mesh_err(-EINVAL, "--algos '%s': a comma at the end", list);
    }
    if (a->nalgos == 0)
        return mesh_err(-EINVAL, "--algos: no algorithm named");
    return 0;
}

int meshbench_coll_args_check(const struct meshbench_coll_args *a)
{
    if (a->vs_fixed && a->rotate)
        return mesh_err(-EINVAL, "--vs-fixed and --rotate: give one");
    if (a->nalgos && !a->vs_fixed && !a->rotate)
        return mesh_err(-EINVAL, "--algos needs --vs-fixed or --rotate");
    if (a->min_rounds && !a->rotate)
        return mesh_err(-EINVAL, "--min-rounds needs --rotate");
    return 0;
}

int meshbench_coll_parse_arg(struct meshbench_coll_args *a, int argc,
                             char **argv, int *i)
{
    const char *arg = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    char *end;
    long x;
    int rc = 0;

    if (!strcmp(arg, "--vs-fixed") || !strcmp(arg, "--rotate")) {
        if (arg[2] == 'v')
            a->vs_fixed = 1;
        else
            a->rotate = 1;
        *i += 1;
        return 1;
    }
    if (!strcmp(arg, "--algos")) {
        if (!v)
            return mesh_err(-EINVAL, "%s needs a value (see --help)", arg);
        rc = parse_algos(v, a);
        if (rc < 0)
            return rc;
        *i += 2;
        return 1;
    }
    if (strcmp(arg, "--algo") && strcmp(arg, "--dtype") && strcmp(arg, "-d") &&
        strcmp(arg, "--redop") && strcmp(arg, "-o") && strcmp(arg, "--root") &&
        strcmp(arg, "--chunk") && strcmp(arg, "-t") && strcmp(arg, "--time") &&
        strcmp(arg, "--min-rounds"))
        return 0;
    if (!v)
        return mesh_err(-EINVAL, "%s needs a value (see --help)", arg);
    if (!strcmp(arg, "--algo")) {
        rc = mesh_algo_parse(v, &a->algo);
        if (rc < 0)
            rc = mesh_err_prefix(rc, "--algo");
    } else if (!strcmp(arg, "--dtype") || !strcmp(arg, "-d")) {
        rc = parse_dtype(v, &a->dtype);
    } else if (!strcmp(arg, "--redop") || !strcmp(arg, "-o")) {
        if (!strcmp(v, "sum"))
            a->redop = MESH_REDOP_SUM;
        else if (!strcmp(v, "avg"))
            a->redop = MESH_REDOP_AVG;
        else
            rc = mesh_err(-EINVAL, "%s '%s': expected sum or avg", arg, v);
    } else if (!strcmp(arg, "-t") || !strcmp(arg, "--time")) {
        double t;

        errno = 0;
        t = strtod(v, &end);
        if (errno || end == v || *end || !(t >= 0 && t <= 3600))
            rc = mesh_err(-EINVAL, "%s '%s': expected seconds from 0 to 3600",
                          arg, v);
        else
            a->time_s = t;
    } else {
        errno = 0;
        x = strtol(v, &end, 10);
        if (errno || end == v || x < 0 || x > (1L << 30) ||
            (*end && strcmp(end, "K") && strcmp(end, "M")))
            rc = mesh_err(-EINVAL, "%s '%s': expected a number from 0", arg, v);
        else if (!strcmp(arg, "--root"))
            a->root = (int)x;
        else if (!strcmp(arg, "--min-rounds") && (*end || x > 4000))
            rc = mesh_err(-EINVAL, "%s '%s': expected a number from 0 to 4000",
                          arg, v);
        else if (!strcmp(arg, "--min-rounds"))
            a->min_rounds = (int)x;
        else
            a->chunk_bytes = (size_t)x << (!strcmp(end, "K")   ? 10
                                           : !strcmp(end, "M") ? 20
                                                               : 0);
    }
    if (rc < 0)
        return rc;
    *i += 2;
    return 1;
}

const char *meshbench_coll_help(void)
{
    return "Collectives (every rank takes part; nccl-tests columns):\n"
           "  --op allreduce|reduce_scatter|allgather|broadcast\n"
           "  --algo ALGO        ring, tree, direct (one hop, for small\n"
           "                     messages), rd (recursive doubling, log2 N\n"
           "                     hops, for small messages), rhd\n"
           "                     (Rabenseifner: recursive halving, then\n"
           "                     doubling; the ring's bytes in 2 log2 N\n"
           "                     hops, for middle sizes), hier (hosts of\n"
           "                     several ranks: reduce-scatter inside each\n"
           "                     host, a ring per local rank between\n"
           "                     hosts, all-gather inside), htree and\n"
           "                     hrd (hosts of several ranks: reduce to\n"
           "                     each host's leader, the double binary\n"
           "                     tree or recursive doubling between the\n"
           "                     leaders, the result back inside each\n"
           "                     host; for small messages), local (every\n"
           "                     rank on one host, shm: each copies its\n"
           "                     input into shared memory once and adds\n"
           "                     its slice straight from every rank's\n"
           "                     copy; hier elsewhere), auto (default:\n"
           "                     the fastest of these at each size, timed\n"
           "                     when the communicator forms at the\n"
           "                     sweep's sizes) or ps (the seed's\n"
           "                     parameter-server baseline, rank 0 serves;\n"
           "                     for comparison only)\n"
           "  -d, --dtype T      float (default), half or bfloat16 (16-bit\n"
           "                     types are added in float32)\n"
           "  -o, --redop OP     sum (default) or avg\n"
           "  --root R           broadcast root (default 0)\n"
           "  --chunk BYTES      pipeline chunk (K, M suffixes; default: by\n"
           "                     message size)\n"
           "  -t, --time S       time each size for about S seconds (as\n"
           "                     many iterations as fit, at least -n);\n"
           "                     0 (default): exactly -n iterations\n"
           "  --vs-fixed         allreduce: at each size, time auto and\n"
           "                     every fixed algorithm it chooses from,\n"
           "                     taking turns run by run, and print each\n"
           "                     one's time and auto's over the best\n"
           "                     fixed one's (instead of the usual table)\n"
           "  --rotate           allreduce: likewise, but time every run:\n"
           "                     per size each one's median (the slowest\n"
           "                     rank's time per run), and auto over the\n"
           "                     best fixed one: the median of the runs'\n"
           "                     ratios (auto's run over the best's run of\n"
           "                     the same round) with a 95 % interval\n"
           "                     (order statistics), and whether it is\n"
           "                     within 1.03 (\"ok\": interval at or below),\n"
           "                     above it (\"over\": interval above) or\n"
           "                     not shown either way (\"?\"); with -t the\n"
           "                     fixed ones over 1.25 x the best's median\n"
           "                     in the first quarter sit out the rest\n"
           "  --min-rounds N     with --rotate: at least N rounds a size\n"
           "                     (at most 4000) for auto and those that\n"
           "                     do not sit out, the first quarter still\n"
           "                     the one -t and -n give (so a size may\n"
           "                     take longer than -t); for sizes where\n"
           "                     -t holds too few rounds to show 3 %\n"
           "  --algos A,B        with --vs-fixed or --rotate: the fixed\n"
           "                     algorithms to run beside auto (default:\n"
           "                     every one auto chooses from)\n"
           "size is the whole buffer (all ranks' blocks for reduce_scatter\n"
           "and allgather); algbw = size / time; busbw = algbw x 2(n-1)/n\n"
           "(allreduce), x (n-1)/n (reduce_scatter, allgather), x 1\n"
           "(broadcast). Inputs are small integers, so every sum is exact;\n"
           "#wrong counts wrong elements (any makes the exit code 4).\n";
}

void meshbench_coll_config(const struct meshbench_coll_args *a, char *buf,
                           size_t len)
{
    snprintf(buf, len,
             "coll_ops=%d\nalgo=%s\ndtype=%s\nredop=%d\nroot=%d\nchunk=%zu\n"
             "time=%.6f\nvs_fixed=%d\nrotate=%d\nmin_rounds=%d\nalgos=",
             a->ops, mesh_algo_name(a->algo), mesh_dtype_name(a->dtype),
             a->redop, a->root, a->chunk_bytes, a->time_s, a->vs_fixed,
             a->rotate, a->min_rounds);
    for (int k = 0; k < a->nalgos; k++) {
        size_t used = strlen(buf);

        snprintf(buf + used, len - used, "%s%s", k ? "," : "",
                 mesh_algo_name(a->algos[k]));
    }
    if (strlen(buf) + 1 < len)
        strcat(buf, "\n");
}

/* ---- data ---------------------------------------------------------------- */

/* An integer in [-7, 7]: sums of up to 36 ranks are exact in bfloat16. */
static int val(int rank, size_t i)
{
    uint32_t h = (uint32_t)rank * 0x9e3779b1u ^ (uint32_t)i * 0x85ebca77u;

    h ^= h >> 15;
    h *= 0xc2b2ae3du;
    h ^= h >> 13;
    return (int)(h % 15) - 7;
}

/* Encoded element values: period[k] for element index i with i % PERIOD
 * == k, for rank r (r >= 0) or for the reduction (r = -1). */
static void pattern(int dtype, int n, int redop, int r, void *out)
{
    for (size_t k = 0; k < PERIOD; k++) {
        int sum = 0;

        if (r >= 0) {
            mesh_dtype_put_f32(dtype, out, k, (float)val(r, k));
            continue;
        }
        for (int q = 0; q < n; q++)
            sum += val(q, k);
        mesh_dtype_put_f32(dtype, out, k,
                           redop == MESH_REDOP_AVG ? (float)sum / (float)n
                                                   : (float)sum);
    }
}

/* Write elements [first, first + cnt) of the pattern p into buf. */
static void fill(void *buf, size_t cnt, size_t first, const void *p, size_t es)
{
    for (size_t i = 0; i < cnt; i++)
        memcpy((char *)buf + i * es,
               (const char *)p + ((first + i) % PERIOD) * es, es);
}

static uint64_t count_wrong(const void *buf, size_t cnt, size_t first,
                            const void *p, size_t es)
{
    uint64_t bad = 0;

    for (size_t i = 0; i < cnt; i++)
        bad += memcmp((const char *)buf + i * es,
                      (const char *)p + ((first + i) % PERIOD) * es, es) != 0;
    return bad;
}

/* ---- one size ------------------------------------------------------------ */

struct ctx {
    mesh_coll_t *c;
    const struct meshbench_coll_args *a;
    int corrupt_rank; /* the test aid, until it has fired */
    int rank, n;
    size_t es;
    char *sbuf, *rbuf; /* maxbytes each, pinned and registered */
    float *times;      /* n entries, for the slowest rank's time */
    uint64_t *wrongs;  /* n entries */
    char mine[PERIOD * 4], want[PERIOD * 4];
};

/* One collective; cnt is elements per rank block for RS/AG. */
static int run_once(struct ctx *x, int op, int inplace, size_t cnt)
{
    const struct meshbench_coll_args *a = x->a;
    size_t blk = (size_t)x->rank * cnt * x->es;

    switch (op) {
    case MESH_OP_ALLREDUCE:
        return mesh_coll_allreduce(x->c, x->sbuf, inplace ? x->sbuf : x->rbuf,
                                   cnt, a->dtype, a->redop, a->algo);
    case MESH_OP_REDUCE_SCATTER:
        return mesh_coll_reduce_scatter(x->c, x->sbuf,
                                        inplace ? x->sbuf + blk : x->rbuf, cnt,
                                        a->dtype, a->redop);
    case MESH_OP_ALLGATHER:
        return mesh_coll_allgather(x->c, inplace ? x->rbuf + blk : x->sbuf,
                                   x->rbuf, cnt, a->dtype);
    default:
        return mesh_coll_broadcast(x->c, x->sbuf, inplace ? x->sbuf : x->rbuf,
                                   cnt, a->dtype, a->root, a->algo);
    }
}

/* The test aid: spoil one byte of this rank's input, once. */
static void maybe_corrupt(struct ctx *x, char *in, size_t len)
{
    if (x->rank != x->corrupt_rank || len <= x->a->corrupt_offset)
        return;
    in[x->a->corrupt_offset] ^= 0x5a;
    x->corrupt_rank = -1;
    mesh_warn("MESHBENCH_TEST_CORRUPT: flipped byte %zu of a %zu-byte "
              "input on purpose",
              x->a->corrupt_offset, len);
}

/* Fill the inputs, run once, count wrong elements on this rank. */
static int checked(struct ctx *x, int op, int inplace, size_t cnt,
                   uint64_t *bad)
{
    const struct meshbench_coll_args *a = x->a;
    size_t es = x->es, n = (size_t)x->n, me = (size_t)x->rank;
    char *out;
    int rc;

    switch (op) {
    case MESH_OP_ALLREDUCE:
        pattern(a->dtype, x->n, a->redop, x->rank, x->mine);
        pattern(a->dtype, x->n, a->redop, -1, x->want);
        fill(x->sbuf, cnt, 0, x->mine, es);
        maybe_corrupt(x, x->sbuf, cnt * es);
        rc = run_once(x, op, inplace, cnt);
        out = inplace ? x->sbuf : x->rbuf;
        *bad = rc ? 0 : count_wrong(out, cnt, 0, x->want, es);
        return rc;
    case MESH_OP_REDUCE_SCATTER:
        pattern(a->dtype, x->n, a->redop, x->rank, x->mine);
        pattern(a->dtype, x->n, a->redop, -1, x->want);
        fill(x->sbuf, n * cnt, 0, x->mine, es);
        maybe_corrupt(x, x->sbuf, n * cnt * es);
        rc = run_once(x, op, inplace, cnt);
        out = inplace ? x->sbuf + me * cnt * es : x->rbuf;
        *bad = rc ? 0 : count_wrong(out, cnt, me * cnt, x->want, es);
        return rc;
    case MESH_OP_ALLGATHER:
        pattern(a->dtype, x->n, a->redop, x->rank, x->mine);
        fill(inplace ? x->rbuf + me * cnt * es : x->sbuf, cnt, me * cnt,
             x->mine, es);
        maybe_corrupt(x, inplace ? x->rbuf + me * cnt * es : x->sbuf, cnt * es);
        rc = run_once(x, op, inplace, cnt);
        *bad = 0;
        for (int r = 0; rc == 0 && r < x->n; r++) {
            pattern(a->dtype, x->n, a->redop, r, x->want);
            *bad += count_wrong(x->rbuf + (size_t)r * cnt * es, cnt,
                                (size_t)r * cnt, x->want, es);
        }
        return rc;
    default:
        pattern(a->dtype, x->n, a->redop, x->rank, x->mine);
        pattern(a->dtype, x->n, a->redop, a->root, x->want);
        fill(x->sbuf, cnt, 0, x->mine, es);
        maybe_corrupt(x, x->sbuf, cnt * es);
        rc = run_once(x, op, inplace, cnt);
        *bad =
            rc ? 0
               : count_wrong(inplace ? x->sbuf : x->rbuf, cnt, 0, x->want, es);
        return rc;
    }
}

/*
 * -t: time one more (untimed) iteration, take the slowest rank's time, and
 * fill time_s with iterations (at least -n, at most 1000000). Every rank
 * computes the same count from the same agreed number.
 */
static int agree_iters(struct ctx *x, int op, int inplace, size_t cnt,
                       int *iters)
{
    const struct meshbench_coll_args *a = x->a;
    float mine, slowest = 0;
    double t0 = mesh_now_s(), n;
    int rc = run_once(x, op, inplace, cnt);

    mine = (float)(mesh_now_s() - t0);
    if (rc == 0)
        rc = mesh_coll_allgather(x->c, &mine, x->times, 1, MESH_DT_F32);
    if (rc < 0)
        return rc;
    for (int r = 0; r < x->n; r++)
        slowest = MESH_MAX(slowest, x->times[r]);
    n = slowest > 0 ? a->time_s / slowest : 1e6;
    *iters = (int)MESH_MAX((double)a->iters, MESH_MIN(n, 1e6));
    return 0;
}

/* Time and wrong count of one placement, agreed between the ranks. */
static int measure(struct ctx *x, int op, int inplace, size_t cnt,
                   double *time_us, uint64_t *wrong)
{
    const struct meshbench_coll_args *a = x->a;
    uint64_t bad = 0;
    float mine;
    double t0;
    int rc = 0, iters = a->iters;

    if (a->check)
        rc = checked(x, op, inplace, cnt, &bad);
    for (int i = 0; rc == 0 && i < a->warmup; i++)
        rc = run_once(x, op, inplace, cnt);
    if (rc == 0 && a->time_s > 0)
        rc = agree_iters(x, op, inplace, cnt, &iters);
    if (rc == 0)
        rc = mesh_coll_barrier(x->c);
    t0 = mesh_now_s();
    for (int i = 0; rc == 0 && i < iters; i++)
        rc = run_once(x, op, inplace, cnt);
    mine = (float)((mesh_now_s() - t0) / iters * 1e6);
    if (rc == 0)
        rc = mesh_coll_allgather(x->c, &mine, x->times, 1, MESH_DT_F32);
    if (rc == 0)
        rc = mesh_coll_allgather(x->c, &bad, x->wrongs, sizeof(bad),
                                 MESH_DT_BYTE);
    if (rc < 0)
        return rc;
    *time_us = 0;
    *wrong = 0;
    for (int r = 0; r < x->n; r++) {
        *time_us = MESH_MAX(*time_us, (double)x->times[r]);
        *wrong += x->wrongs[r];
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/*
 * --vs-fixed: an out-of-place all-reduce of cnt elements with auto and
 * with each fixed algorithm AUTO chooses from (ids[0] = AUTO, then
 * ids[1..nalgo)), taking turns run by run in an order shuffled each round
 * (the same on every rank), so that noise from elsewhere hits all of them
 * alike and none always runs after the same one (which warms its caches).
 * One warmup round (with -t, timed to size the rest), then the timed
 * rounds; each time is the slowest rank's least (load from elsewhere only
 * adds time, and on a shared machine a burst of it moves a median by more
 * than the 3 % asked of auto; formation's timing takes the least too),
 * into us[0..nalgo).
 */
/*
 * The warmup round of --vs-fixed and --rotate: fits[j] says whether
 * ids[j]'s scratch passes formation's bound (collective.h), and one
 * all-reduce of cnt elements with each that fits is run; with -t its
 * slowest rank's time sizes *iters (at least -n, at most most), the same
 * on every rank.
 */
static int warmup_round(struct ctx *x, size_t cnt, const int *ids, int nalgo,
                        int *fits, double most, int *iters)
{
    const struct meshbench_coll_args *a = x->a;
    double round_s, t0;
    float mine;
    int rc = 0;

    *iters = a->iters;
    for (int j = 0; j < nalgo; j++)
        fits[j] = mesh_coll_scratch_for(x->c, ids[j], cnt * x->es) <=
                  2 * cnt * x->es + ((size_t)8 << 20);
    t0 = mesh_now_s();
    for (int j = 0; rc == 0 && j < nalgo; j++)
        if (fits[j])
            rc = mesh_coll_allreduce(x->c, x->sbuf, x->rbuf, cnt, a->dtype,
                                     a->redop, ids[j]);
    mine = (float)(mesh_now_s() - t0);
    if (rc == 0 && a->time_s > 0) {
        rc = mesh_coll_allgather(x->c, &mine, x->times, 1, MESH_DT_F32);
        round_s = 0;
        for (int r = 0; rc == 0 && r < x->n; r++)
            round_s = MESH_MAX(round_s, (double)x->times[r]);
        if (rc == 0 && round_s > 0)
            *iters = (int)MESH_MAX((double)a->iters,
                                   MESH_MIN(a->time_s / round_s, most));
    }
    return rc;
}

/*
 * Round i of --vs-fixed and --rotate: an all-reduce of cnt elements with
 * each of ids[0..nalgo) that fits, in an order shuffled by i (the same on
 * every rank); rt[k] is ids[k]'s time (s), left alone where it does not
 * fit.
 */
static int timed_round(struct ctx *x, size_t cnt, const int *ids, int nalgo,
                       const int *fits, int i, double *rt)
{
    const struct meshbench_coll_args *a = x->a;
    int order[MESH_ALGO_LAST + 2], rc = 0;

    mesh_shuffle(order, nalgo, (unsigned)i + 1);
    for (int j = 0; rc == 0 && j < nalgo; j++) {
        int k = order[j];
        double t0;

        if (!fits[k])
            continue;
        t0 = mesh_now_s();
        rc = mesh_coll_allreduce(x->c, x->sbuf, x->rbuf, cnt, a->dtype,
                                 a->redop, ids[k]);
        rt[k] = mesh_now_s() - t0;
    }
    return rc;
}

#define VS_ITERS_MAX 100000.0
static int measure_vs(struct ctx *x, size_t cnt, const int *ids, int nalgo,
                      double *us)
{
    double *t;
    float mine;
    int rc, iters, fits[MESH_ALGO_LAST + 2];

    rc = warmup_round(x, cnt, ids, nalgo, fits, VS_ITERS_MAX, &iters);
    if (rc < 0)
        return rc;
    iters = MESH_MAX(iters, 1);
    t = calloc((size_t)iters * (size_t)nalgo, sizeof(*t));
    if (!t)
        return mesh_err(-ENOMEM, "out of memory for %d x %d times", iters,
                        nalgo);
    for (int i = 0; rc == 0 && i < iters; i++) {
        double rt[MESH_ALGO_LAST + 2] = {0};

        rc = timed_round(x, cnt, ids, nalgo, fits, i, rt);
        for (int k = 0; k < nalgo; k++)
            t[(size_t)k * (size_t)iters + (size_t)i] = rt[k];
    }
    for (int j = 0; rc == 0 && j < nalgo; j++) {
        double *tj = t + (size_t)j * (size_t)iters;

        us[j] = 0;
        if (!fits[j])
            continue;
        qsort(tj, (size_t)iters, sizeof(*tj), cmp_double);
        mine = (float)(tj[0] * 1e6);
        rc = mesh_coll_allgather(x->c, &mine, x->times, 1, MESH_DT_F32);
        for (int r = 0; rc == 0 && r < x->n; r++)
            us[j] = MESH_MAX(us[j], (double)x->times[r]);
    }
    free(t);
    return rc;
}

/* The algorithms --vs-fixed and --rotate run: auto (ids[0]), then --algos
 * or else every one AUTO chooses from; returns how many. */
static int rotation(const struct ctx *x, int *ids)
{
    const struct meshbench_coll_args *a = x->a;

    ids[0] = MESH_ALGO_AUTO;
    if (!a->nalgos)
        return 1 + mesh_coll_auto_algos(x->c, ids + 1);
    memcpy(ids + 1, a->algos, (size_t)a->nalgos * sizeof(*ids));
    return 1 + a->nalgos;
}

/* The line of --vs-fixed's and --rotate's header on formation's timing
 * (rank 0's). */
static void print_formation(const struct ctx *x)
{
    struct mesh_coll_model m;

    mesh_coll_model_get(x->c, &m);
    if (m.measured)
        printf("# formation timed %d sizes in %.2f s (budget %.0f s%s)\n",
               m.npoints, m.formation_s, m.budget_s,
               m.budget_cut ? "; cut: larger sizes on a line" : "");
}

/* --vs-fixed's table: one row per size, auto against each fixed one. */
static int run_vs(struct ctx *x, uint64_t *wrong_all)
{
    const struct meshbench_coll_args *a = x->a;
    int ids[MESH_ALGO_LAST + 2], nalgo, rc = 0;
    double worst = 0;

    nalgo = rotation(x, ids);
    if (x->rank == 0) {
        printf("#\n# allreduce, auto against each fixed algorithm it "
               "chooses from, taking turns run by run, out of place, %d "
               "ranks, type %s\n# time: the slowest rank's least (us); "
               "auto/best: auto's time over the best fixed one's\n",
               x->n, type_name(a->dtype));
        print_formation(x);
        printf("# %10s %6s %10s", "size", "algo", "auto");
        for (int j = 1; j < nalgo; j++)
            printf(" %10s", mesh_algo_name(ids[j]));
        printf(" %6s %9s\n", "best", "auto/best");
    }
    for (size_t size = a->minbytes;;) {
        size_t cnt = size / x->es;
        double us[MESH_ALGO_LAST + 2] = {0}, ratio;
        uint64_t w = 0;
        int best = 1;

        if (a->check)
            rc = checked(x, MESH_OP_ALLREDUCE, 0, cnt, &w);
        if (rc == 0)
            rc = measure_vs(x, cnt, ids, nalgo, us);
        if (rc == 0 && a->check) {
            rc = mesh_coll_allgather(x->c, &w, x->wrongs, sizeof(w),
                                     MESH_DT_BYTE);
            for (int r = 0; rc == 0 && r < x->n; r++)
                *wrong_all += x->wrongs[r];
        }
        if (rc < 0)
            return mesh_err_prefix(rc, "allreduce of %zu bytes", size);
        best = -1;
        for (int j = 1; j < nalgo; j++)
            if (us[j] > 0 && (best < 0 || us[j] < us[best]))
                best = j;
        best = MESH_MAX(best, 1);
        ratio = us[best] > 0 ? us[0] / us[best] : 0;
        worst = MESH_MAX(worst, ratio);
        if (x->rank == 0) {
            printf(
                "  %10zu %6s %10.1f", cnt * x->es,
                mesh_algo_name(mesh_coll_algo_for(x->c, a->algo, cnt * x->es)),
                us[0]);
            for (int j = 1; j < nalgo; j++)
                if (us[j] > 0)
                    printf(" %10.1f", us[j]);
                else
                    printf(" %10s", "-");
            printf(" %6s %9.3f\n", mesh_algo_name(ids[best]), ratio);
            fflush(stdout);
        }
        if (size > a->maxbytes / (size_t)a->factor)
            break;
        size *= (size_t)a->factor;
    }
    if (x->rank == 0) {
        printf("# worst auto/best: %.3f\n", worst);
        fflush(stdout);
    }
    return 0;
}

/*
 * The slowest rank's time of each of the m runs in ft (this rank's, s),
 * gathered into all (m x n floats), into out (m doubles), on every rank.
 */
static int slowest_runs(struct ctx *x, const float *ft, float *all, size_t m,
                        double *out)
{
    int rc = mesh_coll_allgather(x->c, ft, all, m, MESH_DT_F32);

    for (size_t e = 0; rc == 0 && e < m; e++) {
        double most = 0;

        for (int r = 0; r < x->n; r++)
            most = MESH_MAX(most, (double)all[(size_t)r * m + e]);
        out[e] = most;
    }
    return rc;
}

#define ROT_ITERS_MAX 4000 /* --rotate's rounds at most */
#define ROT_KEEP      1.25 /* the fixed ones this near the best run on */

static double median_of(double *v, int n);

/*
 * --rotate's first n1 rounds done (ft, this rank's times round by round,
 * since t0): the fixed algorithms whose median over them (the slowest
 * rank's times, gathered into tr) ran over ROT_KEEP times the least fixed
 * one's leave fits, and *n becomes the rounds that the time left (-t less
 * the slowest rank's time so far) takes at the pace of those still in (at
 * least *n, at most ROT_ITERS_MAX). The same gathered times on every
 * rank, so every rank runs the same rounds.
 */
static int rotate_prune(struct ctx *x, const float *ft, float *all, double *tr,
                        int nalgo, int n1, double t0, int *fits, int *n)
{
    double med[MESH_ALGO_LAST + 2], col[ROT_ITERS_MAX], best = 0, round = 0;
    double spent = 0;
    float el = (float)(mesh_now_s() - t0);
    int rc = slowest_runs(x, ft, all, (size_t)n1 * (size_t)nalgo, tr);

    if (rc == 0)
        rc = mesh_coll_allgather(x->c, &el, x->times, 1, MESH_DT_F32);
    if (rc < 0)
        return rc;
    for (int r = 0; r < x->n; r++)
        spent = MESH_MAX(spent, (double)x->times[r]);
    for (int k = 0; k < nalgo; k++) {
        for (int i = 0; i < n1; i++)
            col[i] = tr[(size_t)i * (size_t)nalgo + (size_t)k];
        med[k] = fits[k] ? median_of(col, n1) : 0;
        if (k > 0 && med[k] > 0 && (best <= 0 || med[k] < best))
            best = med[k];
    }
    for (int k = 1; k < nalgo; k++)
        if (fits[k] && med[k] > ROT_KEEP * best)
            fits[k] = 0;
    for (int k = 0; k < nalgo; k++)
        round += fits[k] ? med[k] : 0;
    if (round > 0 && x->a->time_s > spent)
        *n = (int)MESH_MIN(
            (double)ROT_ITERS_MAX,
            MESH_MAX((double)*n, n1 + (x->a->time_s - spent) / round));
    return 0;
}

/*
 * --rotate: like measure_vs, but every run is kept: rounds of an
 * out-of-place all-reduce of cnt elements with each of ids[0..nalgo)
 * (auto first) in an order shuffled each round, the same on every rank.
 * One warmup round (with -t, timed to size the rest), then *iters rounds
 * (at least -n, at most ROT_ITERS_MAX). With -t, after the first quarter
 * of the rounds (at least -n) the fixed algorithms whose median there ran
 * over ROT_KEEP times the least fixed one's sit out (every rank decides
 * from the same gathered times), and the rounds left take the time left
 * at the pace of those still in: a near tie gets more rounds, and the
 * pair it is judged by runs closer in time, where the load from elsewhere
 * is more alike. --min-rounds raises the rounds to at least that many
 * (the first quarter stays the one -t gives): a size whose rounds take
 * seconds (64 MiB on the 1 Gbit/s hosts: 14 to 20 rounds in 60 s) gets
 * enough to show 3 %, whatever the load. On return t[j * *iters + i] is
 * algorithm j's time in
 * round i (s), the slowest rank's, on every rank (0 where j did not run:
 * its scratch would pass formation's bound, or it sat out); the caller
 * frees t.
 */
static int measure_rotate(struct ctx *x, size_t cnt, const int *ids, int nalgo,
                          double **tout, int *iters)
{
    const struct meshbench_coll_args *a = x->a;
    float *ft = NULL, *all = NULL;
    double *tr = NULL, t0;
    int rc, fits[MESH_ALGO_LAST + 2], n1, n;
    size_t m = (size_t)ROT_ITERS_MAX * (size_t)nalgo;

    *tout = NULL;
    rc = warmup_round(x, cnt, ids, nalgo, fits, ROT_ITERS_MAX, iters);
    if (rc < 0)
        return rc;
    n = MESH_MIN(MESH_MAX(*iters, 1), ROT_ITERS_MAX);
    n1 = MESH_MIN(MESH_MAX(a->iters, n / 4), n);
    /* --min-rounds: more rounds after the same first quarter */
    n = MESH_MAX(n, MESH_MIN(a->min_rounds, ROT_ITERS_MAX));
    if (a->time_s <= 0)
        n1 = n; /* none sits out */
    /* the times round by round: ft[i * nalgo + k], this rank's; tr, the
     * slowest rank's */
    ft = calloc(m, sizeof(*ft));
    all = calloc(m * (size_t)x->n, sizeof(*all));
    tr = calloc(m, sizeof(*tr));
    *tout = calloc(m, sizeof(**tout));
    if (!ft || !all || !tr || !*tout) {
        rc = mesh_err(-ENOMEM, "out of memory for %d x %d times", ROT_ITERS_MAX,
                      nalgo);
        goto out;
    }
    t0 = mesh_now_s();
    for (int i = 0; rc == 0 && i < n; i++) {
        double rt[MESH_ALGO_LAST + 2] = {0};

        rc = timed_round(x, cnt, ids, nalgo, fits, i, rt);
        for (int k = 0; k < nalgo; k++)
            ft[(size_t)i * (size_t)nalgo + (size_t)k] = (float)rt[k];
        if (rc == 0 && i + 1 == n1 && n1 < n)
            rc = rotate_prune(x, ft, all, tr, nalgo, n1, t0, fits, &n);
    }
    if (rc == 0)
        rc = slowest_runs(x, ft, all, (size_t)n * (size_t)nalgo, tr);
    for (int k = 0; rc == 0 && k < nalgo; k++)
        for (int i = 0; i < n; i++)
            (*tout)[(size_t)k * (size_t)n + (size_t)i] =
                tr[(size_t)i * (size_t)nalgo + (size_t)k];
    *iters = n;
out:
    free(tr);
    free(all);
    free(ft);
    if (rc < 0) {
        free(*tout);
        *tout = NULL;
    }
    return rc;
}

/* The median of v[0..n) (sorts v). */
static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * The median of r[0..n) and a distribution-free 95 % confidence interval
 * for it: the order statistics of ranks n/2 -+ 0.98 sqrt(n) (binomial
 * with p = 1/2, normal approximation), the ends where n is too small to
 * reach that far (r is sorted).
 */
static void median_ci(double *r, int n, double *med, double *lo, double *hi)
{
    double h = 0.98 * sqrt((double)n);
    int j = (int)floor(n / 2.0 - h), k = (int)ceil(n / 2.0 + h);

    *med = median_of(r, n);
    *lo = r[MESH_MAX(j - 1, 0)];
    *hi = r[MESH_MIN(k, n - 1)];
}

#define ROT_GOAL 1.03 /* the bound on auto over the best fixed */

/* --rotate's table: per size each algorithm's median, auto over the best
 * fixed one with its interval and a verdict. */
static int run_rotate(struct ctx *x, uint64_t *wrong_all)
{
    const struct meshbench_coll_args *a = x->a;
    int ids[MESH_ALGO_LAST + 2], nalgo, rc = 0, rows = 0, over = 0, ok = 0;
    double worst = 0;
    size_t worst_at = 0;

    nalgo = rotation(x, ids);
    if (x->rank == 0) {
        printf("#\n# allreduce, auto against fixed algorithms, taking turns "
               "run by run (a shuffled order each round), every run timed, "
               "out of place, %d ranks, type %s\n# time: the median over "
               "the rounds of the slowest rank's time (us); auto/best: the "
               "median over the rounds of auto's time over the best fixed "
               "one's (least median) in the same round, lo..hi its 95 %% "
               "interval; ok: hi <= %.2f, over: lo > %.2f, ?: neither\n",
               x->n, type_name(a->dtype), ROT_GOAL, ROT_GOAL);
        if (a->time_s > 0)
            printf("# after the first quarter of the rounds the fixed ones "
                   "over %.2f x the best's median there sit out; rounds: "
                   "those auto and the best ran\n",
                   ROT_KEEP);
        print_formation(x);
        printf("# %10s %6s %6s", "size", "algo", "rounds");
        for (int j = 0; j < nalgo; j++)
            printf(" %10s", mesh_algo_name(ids[j]));
        printf(" %6s %9s %7s %7s %7s\n", "best", "auto/best", "lo", "hi",
               "verdict");
        fflush(stdout);
    }
    for (size_t size = a->minbytes;;) {
        size_t cnt = size / x->es;
        double *t = NULL, med[MESH_ALGO_LAST + 2] = {0}, *r, rm, lo, hi;
        uint64_t w = 0;
        int iters = 0, best = -1, ran[MESH_ALGO_LAST + 2] = {0}, most = 0;

        if (a->check)
            rc = checked(x, MESH_OP_ALLREDUCE, 0, cnt, &w);
        if (rc == 0)
            rc = measure_rotate(x, cnt, ids, nalgo, &t, &iters);
        if (rc == 0 && a->check) {
            rc = mesh_coll_allgather(x->c, &w, x->wrongs, sizeof(w),
                                     MESH_DT_BYTE);
            for (int q = 0; rc == 0 && q < x->n; q++)
                *wrong_all += x->wrongs[q];
        }
        if (rc < 0) {
            free(t);
            return mesh_err_prefix(rc, "allreduce of %zu bytes", size);
        }
        r = malloc((size_t)iters * sizeof(*r));
        if (!r) {
            free(t);
            return mesh_err(-ENOMEM, "out of memory for %d ratios", iters);
        }
        for (int j = 0; j < nalgo; j++) {
            double *tj = t + (size_t)j * (size_t)iters;
            int nr = 0;

            for (int i = 0; i < iters; i++) /* the rounds it ran */
                if (tj[i] > 0)
                    r[nr++] = tj[i];
            ran[j] = nr;
            if (nr == 0)
                continue; /* not run: scratch */
            med[j] = median_of(r, nr) * 1e6;
            most = j > 0 ? MESH_MAX(most, nr) : most;
        }
        /*
         * The best: the least median of those that ran the most rounds,
         * not of one that sat out: its median is over the first quarter
         * only, and where the load eased or grew after it, it compares
         * with the others' medians over every round by the load alone
         * (on 2 namespace hosts at 64 MiB the tree, out after 20 of 114
         * rounds, was the "best" over ring and rhd, whose rounds after
         * ran slower, and auto/best came out 0.931 over those 20).
         */
        for (int j = 1; j < nalgo; j++)
            if (most > 0 && ran[j] == most && (best < 0 || med[j] < med[best]))
                best = j;
        rm = lo = hi = 0;
        if (best > 0 && med[0] > 0) {
            const double *tb = t + (size_t)best * (size_t)iters;
            int nr = 0;

            for (int i = 0; i < iters; i++) /* the rounds both ran */
                if (tb[i] > 0 && t[i] > 0)
                    r[nr++] = t[i] / tb[i];
            median_ci(r, nr, &rm, &lo, &hi);
            iters = nr;
        }
        free(r);
        free(t);
        rows++;
        ok += rm > 0 && hi <= ROT_GOAL;
        over += lo > ROT_GOAL;
        if (rm > worst) {
            worst = rm;
            worst_at = cnt * x->es;
        }
        if (x->rank == 0) {
            printf(
                "  %10zu %6s %6d", cnt * x->es,
                mesh_algo_name(mesh_coll_algo_for(x->c, a->algo, cnt * x->es)),
                iters);
            for (int j = 0; j < nalgo; j++)
                if (med[j] > 0)
                    printf(" %10.1f", med[j]);
                else
                    printf(" %10s", "-");
            printf(" %6s %9.3f %7.3f %7.3f %7s\n",
                   best > 0 ? mesh_algo_name(ids[best]) : "-", rm, lo, hi,
                   rm <= 0          ? "-"
                   : hi <= ROT_GOAL ? "ok"
                   : lo > ROT_GOAL  ? "over"
                                    : "?");
            fflush(stdout);
        }
        if (size > a->maxbytes / (size_t)a->factor)
            break;
        size *= (size_t)a->factor;
    }
    if (x->rank == 0) {
        printf("# worst auto/best: %.3f at %zu; within %.2f (interval at or "
               "below): %d of %d sizes; above it (interval above): %d\n",
               worst, worst_at, ROT_GOAL, ok, rows, over);
        fflush(stdout);
    }
    return 0;
}

static double bus_factor(int op, int n)
{
    switch (op) {
    case MESH_OP_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case MESH_OP_REDUCE_SCATTER:
    case MESH_OP_ALLGATHER:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

/* The algorithm a collective of bytes runs with (auto resolved). */
static const char *algo_ran(const struct ctx *x, int op, size_t bytes)
{
    if (op == MESH_OP_ALLREDUCE)
        return mesh_algo_name(mesh_coll_algo_for(x->c, x->a->algo, bytes));
    if (op == MESH_OP_BROADCAST)
        return mesh_algo_name(
            mesh_coll_bcast_algo_for(x->c, x->a->algo, bytes));
    return "ring";
}

static void print_header(const struct ctx *x, const char *name)
{
    struct mesh_coll_model m;

    mesh_coll_model_get(x->c, &m);
    printf("#\n# %s: %d ranks, algo %s, type %s, kernels %s; alpha %.1f us, "
           "beta %.3f ns/B (%s",
           name, x->n, mesh_algo_name(x->a->algo), type_name(x->a->dtype),
           mesh_reduce_isa(), m.alpha_s * 1e6, m.beta_s_per_byte * 1e9,
           m.measured ? "measured" : "defaults");
    if (m.measured)
        printf("; formation timed %d sizes in %.2f s of its %.0f", m.npoints,
               m.formation_s, m.budget_s);
    printf(")\n");
    if (x->a->algo == MESH_ALGO_PS)
        printf("# ps: the seed's parameter-server baseline (rank 0 "
               "serves), for comparison only\n");
    printf("#%64s%36s\n", "out-of-place", "in-place");
    printf("# %10s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s  %s\n",
           "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
           "#wrong", "time", "algbw", "busbw", "#wrong", "algo");
    printf("# %10s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
           "(GB/s)", "(GB/s)", "");
    fflush(stdout);
}

int meshbench_coll_run(struct mesh *m, const struct meshbench_coll_args *a,
                       uint64_t *wrong)
{
    struct mesh_coll_opts co;
    struct ctx x = {.a = a};
    double bus_sum = 0;
    uint64_t wrong_all = 0;
    size_t sizes[64], nsizes = 0;
    int rows = 0, rc;

    memset(&x, 0, sizeof(x));
    x.a = a;
    x.corrupt_rank = a->corrupt_rank;
    x.rank = mesh_rank(m);
    x.n = mesh_size(m);
    x.es = mesh_dtype_size(a->dtype);
    if (a->root < 0 || a->root >= x.n)
        return mesh_err(-EINVAL, "--root %d: not a rank (0..%d)", a->root,
                        x.n - 1);
    mesh_coll_opts_init(&co);
    co.algo = a->algo;
    co.chunk_bytes = a->chunk_bytes;
    /* auto all-reduces: time the candidates at the sweep's sizes */
    if (a->algo == MESH_ALGO_AUTO && (a->ops & MESHBENCH_ALLREDUCE)) {
        for (size_t size = a->minbytes; nsizes < MESH_ARRAY_SIZE(sizes);) {
            sizes[nsizes++] = size;
            if (size > a->maxbytes / (size_t)a->factor)
                break;
            size *= (size_t)a->factor;
        }
        co.measure_sizes = sizes;
        co.nmeasure_sizes = (int)nsizes;
    }
    rc = mesh_coll_create(mesh_ops(m), mesh_transport(m), mesh_world(m), &co,
                          &x.c);
    if (rc < 0)
        return rc;
    x.times = calloc((size_t)x.n, sizeof(*x.times));
    x.wrongs = calloc((size_t)x.n, sizeof(*x.wrongs));
    if (!x.times || !x.wrongs) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto free_arrays;
    }
    rc = mesh_coll_buf_alloc(x.c, a->maxbytes, (void **)&x.sbuf);
    if (rc == 0)
        rc = mesh_coll_buf_alloc(x.c, a->maxbytes, (void **)&x.rbuf);
    if (rc < 0)
        goto free_bufs;
    for (size_t k = 0; k < MESH_ARRAY_SIZE(coll_ops); k++) {
        int op = coll_ops[k].op;
        int split = op == MESH_OP_REDUCE_SCATTER || op == MESH_OP_ALLGATHER;

        if (!(a->ops & coll_ops[k].bit))
            continue;
        if (op == MESH_OP_ALLREDUCE && (a->vs_fixed || a->rotate)) {
            rc =
                a->rotate ? run_rotate(&x, &wrong_all) : run_vs(&x, &wrong_all);
            if (rc < 0)
                goto free_bufs;
            continue;
        }
        if (x.rank == 0)
            print_header(&x, coll_ops[k].name);
        for (size_t size = a->minbytes;;) {
            size_t count = size / x.es, per = count;
            double t[2] = {0, 0};
            uint64_t w[2] = {0, 0};

            if (split) { /* whole blocks per rank */
                per = count / (size_t)x.n;
                count = per * (size_t)x.n;
            }
            for (int inplace = 0; inplace < 2; inplace++) {
                rc = measure(&x, op, inplace, per, &t[inplace], &w[inplace]);
                if (rc < 0) {
                    rc = mesh_err_prefix(rc, "%s of %zu bytes",
                                         coll_ops[k].name, size);
                    goto free_bufs;
                }
            }
            if (x.rank == 0) {
                double bytes = (double)(count * x.es), f = bus_factor(op, x.n);
                double alg0 = t[0] > 0 ? bytes / t[0] / 1e3 : 0;
                double alg1 = t[1] > 0 ? bytes / t[1] / 1e3 : 0;
                char w0[24], w1[24];

                snprintf(w0, sizeof(w0), "%" PRIu64, w[0]);
                snprintf(w1, sizeof(w1), "%" PRIu64, w[1]);
                printf("  %10zu %12zu %8s %6s %6d %8.1f %7.3f %7.3f %6s "
                       "%8.1f %7.3f %7.3f %6s  %s\n",
                       count * x.es, count, type_name(a->dtype),
                       op == MESH_OP_ALLREDUCE || op == MESH_OP_REDUCE_SCATTER
                           ? (a->redop ? "avg" : "sum")
                           : "none",
                       op == MESH_OP_BROADCAST ? a->root : -1, t[0], alg0,
                       alg0 * f, a->check ? w0 : "N/A", t[1], alg1, alg1 * f,
                       a->check ? w1 : "N/A", algo_ran(&x, op, count * x.es));
                fflush(stdout);
                bus_sum += (alg0 + alg1) * f;
            }
            rows += 2;
            wrong_all += w[0] + w[1];
            if (size > a->maxbytes / (size_t)a->factor)
                break;
            size *= (size_t)a->factor;
        }
    }
    if (x.rank == 0) {
        printf("# Out of bounds values : %" PRIu64 " %s\n", wrong_all,
               wrong_all ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.4f\n#\n",
               rows ? bus_sum / rows : 0.0);
        fflush(stdout);
    }
    *wrong = wrong_all;
free_bufs:
    mesh_coll_buf_free(x.c, x.rbuf);
    mesh_coll_buf_free(x.c, x.sbuf);
free_arrays:
    free(x.wrongs);
    free(x.times);
    mesh_coll_destroy(x.c);
    return rc;
}
