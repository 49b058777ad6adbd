/*
 * src/meshbench_coll.h: meshbench's collective operations (all-reduce,
 * reduce-scatter, all-gather, broadcast), printed the way nccl-tests prints
 * them. meshbench.c parses the flags and calls meshbench_coll_run.
 */
#ifndef MESH_MESHBENCH_COLL_H
#define MESH_MESHBENCH_COLL_H

#include "collective/collective.h"
#include "mesh/mesh.h"

#include <stddef.h>
#include <stdint.h>

enum meshbench_coll_op {
    MESHBENCH_ALLREDUCE = 1 << 0,
    MESHBENCH_REDUCE_SCATTER = 1 << 1,
    MESHBENCH_ALLGATHER = 1 << 2,
    MESHBENCH_BROADCAST = 1 << 3,
};

struct meshbench_coll_args {
    int ops;            /* enum meshbench_coll_op bits */
    int algo;           /* enum mesh_algo */
    int dtype;          /* enum mesh_dtype */
    int redop;          /* enum mesh_redop */
    int root;           /* broadcast */
    size_t chunk_bytes; /* 0: the communicator picks */
    double time_s;      /* > 0: timed iterations fill this long (-t) */
    size_t minbytes, maxbytes;
    int factor, iters, warmup, check;
    /* --vs-fixed: each all-reduce size also runs every fixed algorithm
     * AUTO chooses from, interleaved with auto run by run */
    int vs_fixed;
    /* --rotate: likewise, every iteration timed, each one's median and a
     * confidence interval of auto over the best fixed one */
    int rotate;
    /* --min-rounds: with --rotate, each size's rounds at least this many
     * (0: as -t and -n give) */
    int min_rounds;
    /* --algos: the fixed algorithms --vs-fixed and --rotate run beside
     * auto (nalgos 0: every one AUTO chooses from) */
    int nalgos;
    int algos[MESH_ALGO_LAST + 1];
    /* MESHBENCH_TEST_CORRUPT: that rank flips byte corrupt_offset of its
     * first checked input longer than that (-1: none). */
    int corrupt_rank;
    size_t corrupt_offset;
};

void meshbench_coll_args_init(struct meshbench_coll_args *a);

/* 1 and *bit set when name is a collective op, else 0. */
int meshbench_coll_op(const char *name, int *bit);

/*
 * Parse one of the collective flags at argv[*i] (--algo, --dtype, -d,
 * --redop, -o, --root, --chunk, -t, --vs-fixed, --rotate, --algos,
 * --min-rounds): 1 when
 * consumed (and *i advanced), 0 when not ours, < 0 with a message for a
 * bad value.
 */
int meshbench_coll_parse_arg(struct meshbench_coll_args *a, int argc,
                             char **argv, int *i);

/* After parsing: 0, or < 0 with a message for flags that do not go
 * together (--algos without --vs-fixed or --rotate, both of those,
 * --min-rounds without --rotate). */
int meshbench_coll_args_check(const struct meshbench_coll_args *a);

/* The collective flags, for --help (static text). */
const char *meshbench_coll_help(void);

/* The settings that must agree between ranks, as "key=value\n" lines. */
void meshbench_coll_config(const struct meshbench_coll_args *a, char *buf,
                           size_t len);

/*
 * Run the selected collectives over every size on every rank; rank 0
 * prints the table. *wrong = wrong elements seen by all ranks together.
 * Returns 0, or a negative code (the mesh failed: MESH_EXIT_PEER).
 */
int meshbench_coll_run(struct mesh *m, const struct meshbench_coll_args *a,
                       uint64_t *wrong);

#endif
