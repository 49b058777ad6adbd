/*
 * collective/collective.h: collectives over the transport interface.
 *
 * A communicator runs all-reduce (sum, average), reduce-scatter, all-gather,
 * broadcast and barrier over one transport and world. Every rank must issue
 * the same collectives in the same order; each one takes the communicator's
 * next sequence number, and the frames' (seq, op, dtype, count, length) let
 * the transport catch ranks that diverge in operation, type or size (an
 * error naming both sides, never a wrong result). The algorithm, reduction,
 * root and communicator options must agree too, which the frames do not
 * show: programs put them in the configuration fingerprint checked at join
 * (meshbench does).
 *
 * Non-blocking: *_start() queues the collective and returns a request at
 * once; mesh_coll_wait() blocks for it. One engine thread per communicator
 * runs the queued collectives in order, one at a time, so several may be in
 * flight from the caller's point of view (the trainer's gradient buckets).
 * The blocking forms run on the caller's thread when nothing is queued.
 * Only the communicator calls the transport while a collective runs:
 * callers must not use the transport (mesh_send, mesh_barrier) with
 * collectives in flight. A request is waited for by one thread.
 *
 * Results are bitwise identical on every rank: each element is reduced in
 * an order fixed by the algorithm (ring order, tree shape, rank order), and
 * the final bytes are then copied to everyone. 16-bit types are converted to
 * float32, added, and rounded back (to nearest even) at each reduction step;
 * an average divides by the rank count in float32 before the last rounding.
 *
 * Buffers: any host memory works; memory from mesh_coll_buf_alloc() is
 * pinned (page-aligned and mlock'ed, or from the allocator in the options,
 * or in the host's shared memory: opts host_shared) and registered with
 * the transport once. A buffer must stay untouched
 * between *_start() and the end of mesh_coll_wait().
 *
 * All functions return 0 or a negative errno-style code with a message
 * recorded by mesh_err() (common/util.h). After a failure (a peer died, ranks
 * diverged) the communicator is broken: every later collective fails with
 * the first error, and the job is aborted on every rank.
 */
#ifndef MESH_COLLECTIVE_H
#define MESH_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

typedef struct mesh_coll mesh_coll_t;         /* opaque communicator */
typedef struct mesh_coll_req mesh_coll_req_t; /* one started collective */

enum mesh_redop {
    MESH_REDOP_SUM = 0,
    MESH_REDOP_AVG = 1, /* sum divided by the rank count */
};

enum mesh_algo {
    MESH_ALGO_AUTO = 0,   /* alpha-beta cost model on measured numbers */
    MESH_ALGO_RING = 1,   /* pipelined ring: reduce-scatter + all-gather */
    MESH_ALGO_TREE = 2,   /* pipelined double binary tree (NCCL's design) */
    MESH_ALGO_PS = 3,     /* the seed's parameter-server baseline: rank 0
                             gathers, sums and sends back; comparison only */
    MESH_ALGO_DIRECT = 4, /* one hop: every rank sends its data to every
                             other and adds all N in rank order; for small
                             messages, where latency rules */
    MESH_ALGO_RD = 5,     /* recursive doubling: log2 N pairwise swaps of
                             the whole message; for small messages */
    MESH_ALGO_RHD = 6,    /* Rabenseifner: reduce-scatter by recursive
                             halving, all-gather by recursive doubling; the
                             ring's bytes in 2 log2 N hops */
    MESH_ALGO_HIER = 7,   /* hierarchical: reduce-scatter inside each host
                             (one hop, shared memory), one ring per local
                             rank between hosts, all-gather inside each
                             host; the ring where hosts differ in size */
    MESH_ALGO_HTREE = 8,  /* hierarchical tree: each host's ranks reduce to
                             their leader (one hop, shared memory), the
                             leaders run the double binary tree, each
                             leader sends the result back; the tree where
                             hosts differ in size or hold one rank each */
    MESH_ALGO_HRD = 9,    /* likewise with recursive doubling between the
                             leaders (log2 hosts hops): for small
                             messages across hosts; else rd */
    MESH_ALGO_LOCAL = 10, /* all ranks on one host, in shared memory (the
                             shm transport's windows): each copies its
                             input into its window once, adds its 1/N
                             slice straight from every window, and reads
                             the others' sums; hier elsewhere */
};
#define MESH_ALGO_LAST MESH_ALGO_LOCAL

const char *mesh_algo_name(int algo);
/* "ring", "tree", "auto", "ps", "direct", "rd", "rhd", "hier", "htree",
 * "hrd", "local" -> *out; -EINVAL otherwise. */
int mesh_algo_parse(const char *s, int *out);

struct mesh_coll_opts {
    int algo;           /* default for all-reduce and broadcast (AUTO) */
    size_t chunk_bytes; /* pipeline chunk; 0 picks per message size */
    /*
     * Measure latency and bandwidth to the ring neighbours at create (a
     * collective step: every rank must pass the same value). Without it,
     * AUTO uses built-in numbers. Default 1.
     */
    int measure;
    /*
     * With measure: also time each of AUTO's algorithms on an all-reduce
     * of this many bytes (default 4 MiB; 0: not), and let AUTO choose
     * from the measured times (see measure_sizes), not from the model: the
     * choice then follows what each algorithm did here, on this
     * transport, for every rank alike.
     */
    size_t measure_bytes;
    /*
     * With measure: the all-reduce sizes (bytes) the job will use (the
     * trainer's buckets, meshbench's sweep), each timed with each of
     * AUTO's algorithms besides 32 bytes and measure_bytes (at most
     * MESH_COLL_POINTS sizes in all; a longer list is thinned, keeping
     * its ends), out of place (as meshbench's tables are: over shared
     * memory in place runs otherwise; the job's own calls then refine
     * the choice). The algorithms take turns run by run (so that a burst
     * of load from elsewhere spoils one run of each), every rank's times
     * are gathered, and from the slowest rank's time of each run, the
     * algorithm of least median keeps its median and each other one
     * gets that median times the median over the rounds of its time over
     * that one's in the same round (a round's load hits both), the same
     * on every rank before anything is decided from it, so every rank
     * takes the same choices; those within 30 % of the fastest then run as many
     * times again, and their medians are agreed anew, then those within 10 %,
     * then 4 % (up to 4 blocks of runs, while the budget lasts). An algorithm
     * whose scratch memory would exceed twice the message plus 8 MiB is not
     * timed (nor chosen) at that size and above, nor one that ran over twice
     * the fastest's time at each of the two sizes before where that took 2
     * ms or more; sizes that would take the measurement past its budget
     * (measure_budget_s) are not timed either. AUTO then takes,
     * for each size, the algorithm of least time on the line through the
     * measured sizes around it (beyond the largest, on the last two; when 32
     * bytes is the only size timed, above it the built-in model). NULL / 0:
     * only 32 bytes and measure_bytes. The array is read during
     * mesh_coll_create only.
     */
    const size_t *measure_sizes;
    int nmeasure_sizes;
    /*
     * With measure: the time the measurement may take (s; default 20, <= 0
     * the default). Every rank must pass the same value. Each decision to
     * time a size, or a chunk of its runs, is taken from the time spent as
     * agreed by the ranks (the most of any rank's) and its estimate from
     * the times before, 1.5 times over, so that the budget holds unless a
     * chunk runs over 1.5 times slower than the one before it (or than
     * the line of the sizes before, for a size's first chunk); a size that
     * got fewer than 3 runs of each candidate in is not kept.
     */
    double measure_budget_s;
    /*
     * The first sequence number; the communicator's collectives take
     * seq_base, seq_base + 1, ... Default MESH_COLL_SEQ_BASE, a range
     * apart from mesh/mesh.h's point-to-point counter (1, 2, ...), so that
     * both can share one transport. Every rank must pass the same value.
     */
    uint64_t seq_base;
    /*
     * Where mesh_coll_buf_alloc and the scratch take their host memory
     * (struct mesh_host_allocator, common/util.h).
     * NULL: page-aligned, mlock'ed memory (mesh_host_alloc). The trainer
     * passes nn's pinned allocator (cudaHostAlloc where a GPU answers), so
     * that device copies from these buffers run at full speed. Must outlive
     * the communicator.
     */
    const struct mesh_host_allocator *host_alloc;
    /*
     * mesh_coll_buf_alloc takes its memory from the transport's shared
     * memory of the host first (mesh_transport_ops.host_alloc: shm's
     * share of the segment), where the ranks of the host read each
     * other's inputs in place (the local all-reduce then skips copying
     * its input into its window); from host_alloc when that is full or
     * absent. Default 1; 0: always host_alloc (device copies want nn's
     * pinned memory, say). Needs no agreement between ranks: a collective
     * whose buffers are not all there copies.
     */
    int host_shared;
};

#define MESH_COLL_SEQ_BASE MESH_SEQ_COLL_BASE

void mesh_coll_opts_init(struct mesh_coll_opts *o);

/*
 * Create a communicator over a connected transport (ops->connect done).
 * Collective: every rank of world calls it, with the same opts. ops, t and
 * world (with its peers array) must outlive the communicator; the
 * communicator owns sequence numbers from opts->seq_base up on t: anyone
 * else sending on t (mesh_send, mesh_barrier) must stay below it. opts may
 * be NULL (defaults).
 */
int mesh_coll_create(const struct mesh_transport_ops *ops, mesh_transport_t *t,
                     const struct mesh_world *world,
                     const struct mesh_coll_opts *opts, mesh_coll_t **out);

/* Wait for queued collectives, stop the engine, free everything. NULL ok. */
void mesh_coll_destroy(mesh_coll_t *c);

/*
 * The numbers AUTO decides from, the same on every rank: one-hop latency
 * alpha (seconds), inverse bandwidth beta (seconds per byte on a link),
 * reduction cost gamma (seconds per byte added; a fixed figure), whether
 * alpha and beta were measured, and the measured time of a 32-byte
 * all-reduce with each of ring, tree, direct, rd, rhd, hier, htree, hrd
 * and local
 * (lat_s[MESH_ALGO_RING] etc.; 0 when not measured). Where measured, that
 * time replaces the model's hops x alpha: it holds what alpha misses, such
 * as the cost of many messages at one rank, or of more processes than
 * cores.
 */
#define MESH_COLL_POINTS 16
struct mesh_coll_model {
    double alpha_s;
    double beta_s_per_byte;
    double gamma_s_per_byte;
    int measured;
    /*
     * The most ranks per CPU on any machine of the communicator (the
     * transport's ranks_per_cpu), where AUTO decides by the model alone
     * (opts measure 0); else, or where the transport cannot tell, 1. Over
     * 1, that machine's CPUs do its ranks' share of all the CPU work of an
     * all-reduce (messages, bytes sent, bytes added), which bounds its
     * time from below: many small messages (the ring's 2 N (N - 1)) cost
     * more than their hops (not where hosts hold several ranks each:
     * the hierarchical forms that run there have no such bound). On a
     * cluster of a rank per core or fewer: 1, and the model is the hops'
     * alone.
     */
    double ranks_per_cpu;
    double lat_s[MESH_ALGO_LAST + 1];
    /*
     * The all-reduces timed at create (opts measure_bytes and
     * measure_sizes): npoints sizes in increasing order, the first 32
     * bytes, and each algorithm's time at each (0: not timed there).
     * budget_cut: the larger sizes were left untimed because formation's
     * time budget (budget_s, opts measure_budget_s) ran out; they follow
     * the last two's line. formation_s: this rank's time in formation's
     * timing, from the links' measurement to the last size's agreement
     * (s; 0: none).
     */
    int npoints;
    int budget_cut;
    double formation_s;
    double budget_s;
    size_t point_bytes[MESH_COLL_POINTS];
    double point_s[MESH_COLL_POINTS][MESH_ALGO_LAST + 1];
};
void mesh_coll_model_get(const mesh_coll_t *c, struct mesh_coll_model *out);

/* The algorithm an all-reduce of bytes would run with algo (AUTO chooses). */
int mesh_coll_algo_for(const mesh_coll_t *c, int algo, size_t bytes);
/*
 * Where formation timed the candidates, AUTO refines its choice for each of
 * the first 16 all-reduce sizes it meets: its first calls there take turns
 * among formation's contenders (where its best call took under 2 ms those
 * within 100 % of it, else the runner-up within 50 % and the others within
 * 20 %; the nearest first, 4 at most, then its fastest at the timed sizes
 * either side where a place is left, 5 in all below 2 ms), in epochs of
 * 5 to 31 rounds (about 37.5 ms by formation's times), and at each epoch's end
 * (and after the first 7 rounds of a first epoch of 12 or more) the ranks
 * exchange their times and agree on the ranking over every round so far (as
 * formation does); those not clearly slower than the fastest (the 95 % interval
 * of the median of their ratios to it within a round above 1) nor, over enough
 * rounds, 3 % behind it race on, at most 4 epochs, then the fastest is
 * kept (and logged). A kept winner is re-checked later: the same contenders
 * race again for at most 2 epochs, over their new rounds only (or those and the
 * last re-check's, where that one ended with none clearly faster), the
 * first time after 8 times the calls a re-check can give the others, each
 * next time twice as far, and the choice changes only where the kept one
 * ran clearly slower than the fastest or, over 32 rounds or more, its
 * median over 1.03 times the fastest's (logged, with the calls the others
 * ran and their time over the fastest's). Every rank takes the same
 * algorithm at every call. Returns the algorithm kept for bytes (during a
 * re-check, the one kept before it), or 0 while its first race runs or
 * where it was never refined; mesh_coll_algo_for answers it too once kept.
 */
int mesh_coll_auto_refined(const mesh_coll_t *c, size_t bytes);
/* How many re-checks of the winner kept for bytes have ended (0: none,
 * or not refined). */
int mesh_coll_auto_rechecks(const mesh_coll_t *c, size_t bytes);
/*
 * AUTO's candidates for an all-reduce on this communicator (the
 * algorithms it times and chooses from) into ids[0..MESH_ALGO_LAST];
 * returns how many.
 */
int mesh_coll_auto_algos(const mesh_coll_t *c, int *ids);
/*
 * The scratch memory an all-reduce of bytes (float32) with algo needs on
 * the rank that needs most (the same answer on every rank); 0 for an
 * unknown algorithm or AUTO.
 */
size_t mesh_coll_scratch_for(const mesh_coll_t *c, int algo, size_t bytes);
/* Likewise for a broadcast: MESH_ALGO_RING (a chain) or MESH_ALGO_TREE. */
int mesh_coll_bcast_algo_for(const mesh_coll_t *c, int algo, size_t bytes);

/* ---- pinned, registered buffers ------------------------------------------ */

/* len bytes of pinned host memory, registered with the transport at first
 * use and reused. Free with mesh_coll_buf_free (not while in use). */
int mesh_coll_buf_alloc(mesh_coll_t *c, size_t len, void **out);
void mesh_coll_buf_free(mesh_coll_t *c, void *buf);

/*
 * The caller's own memory (a gradient slab, say), registered with the
 * transport at first use and then reused, instead of for every collective
 * that touches it. The memory stays the caller's: unregister it (not while
 * in use) before freeing it; destroy unregisters what is left.
 */
int mesh_coll_buf_register(mesh_coll_t *c, void *buf, size_t len);
void mesh_coll_buf_unregister(mesh_coll_t *c, void *buf);

/* ---- collectives: start, then wait --------------------------------------- */

/*
 * recvbuf[0..count) = reduction of every rank's sendbuf[0..count).
 * sendbuf == recvbuf is in place. algo: MESH_ALGO_* (AUTO: the
 * communicator's default, chosen per size). dtype F32, F16 or BF16.
 */
int mesh_coll_allreduce_start(mesh_coll_t *c, const void *sendbuf,
                              void *recvbuf, size_t count, int dtype, int redop,
                              int algo, mesh_coll_req_t **out);

/*
 * sendbuf holds size * recvcount elements; recvbuf[0..recvcount) =
 * reduction of every rank's block [rank * recvcount, (rank+1) * recvcount).
 * In place when recvbuf == sendbuf + rank * recvcount elements. Ring.
 */
int mesh_coll_reduce_scatter_start(mesh_coll_t *c, const void *sendbuf,
                                   void *recvbuf, size_t recvcount, int dtype,
                                   int redop, mesh_coll_req_t **out);

/*
 * recvbuf (size * sendcount elements) block r = rank r's sendbuf. In place
 * when sendbuf == recvbuf + rank * sendcount elements. Ring. Any dtype.
 */
int mesh_coll_allgather_start(mesh_coll_t *c, const void *sendbuf,
                              void *recvbuf, size_t sendcount, int dtype,
                              mesh_coll_req_t **out);

/*
 * recvbuf[0..count) = root's sendbuf (sendbuf is read on root only; in
 * place when equal). algo RING: a pipelined chain; TREE: a pipelined binary
 * tree; AUTO picks by size. Any dtype.
 */
int mesh_coll_broadcast_start(mesh_coll_t *c, const void *sendbuf,
                              void *recvbuf, size_t count, int dtype, int root,
                              int algo, mesh_coll_req_t **out);

/* Returns when every rank has started it (dissemination, log2 rounds). */
int mesh_coll_barrier_start(mesh_coll_t *c, mesh_coll_req_t **out);

/* Block until req is done; frees req. Returns the collective's result. */
int mesh_coll_wait(mesh_coll_req_t *req);

/*
 * mesh_coll_wait, also telling when the collective really ran (it may
 * have queued behind others): mesh_now_s() times, for a timeline. Either
 * pointer may be NULL; they stay 0 for a request that never ran.
 */
int mesh_coll_wait_times(mesh_coll_req_t *req, double *begin_s, double *end_s);

/* *done = 1 when req is done, and then req is freed and its result
 * returned (as mesh_coll_wait would). */
int mesh_coll_test(mesh_coll_req_t *req, int *done);

/* Blocking forms: start + wait. */
int mesh_coll_allreduce(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t count, int dtype, int redop, int algo);
int mesh_coll_reduce_scatter(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                             size_t recvcount, int dtype, int redop);
int mesh_coll_allgather(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t sendcount, int dtype);
int mesh_coll_broadcast(mesh_coll_t *c, const void *sendbuf, void *recvbuf,
                        size_t count, int dtype, int root, int algo);
int mesh_coll_barrier(mesh_coll_t *c);

/* ---- reduction kernels and conversions (vectorized, any thread) ---------- */

/*
 * dst[i] = round((((src[0][i] + src[1][i]) + src[2][i]) + ...) / div), in
 * float32, for n elements of dtype (F32, F16, BF16); div == 1 skips the
 * division. dst may equal any src[j] (element i is read from every
 * source before it is written). nsrc >= 1. The result is bitwise the same
 * on every instruction-set path (AVX-512, AVX2+F16C, scalar).
 */
void mesh_reduce_sum(int dtype, void *dst, const void *const *src, int nsrc,
                     size_t n, float div);

/* Element conversions between F32, F16 and BF16 (round to nearest even),
 * e.g. to put float32 gradients on the wire as 16-bit. */
void mesh_convert(int dst_dtype, void *dst, int src_dtype, const void *src,
                  size_t n);
/* The scalar conversions (mesh_f16_from_f32 and the others) are
 * common/dtype.h's. */

/* The instruction set the kernels picked: "avx512f", "avx2" or "scalar". */
const char *mesh_reduce_isa(void);

#endif
