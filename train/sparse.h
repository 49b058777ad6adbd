/*
 * train/sparse.h: sparsified gradients with error feedback (--compress
 * topk:R and threshold:T, as Apache SINGA's distributed optimizer offers
 * them), for the gradient buckets of train/gradsync.c.
 *
 * Per bucket of n floats and per step, each rank:
 *   1. adds its residual (what it did not send before) to the bucket:
 *      acc = g + residual (error feedback; off: acc = g);
 *   2. selects (index, value) pairs from acc: top-k, the k = R n (rounded
 *      to the nearest integer, at least 1, at most n) elements of largest
 *      |acc|, ties to the lower index; threshold, every element with
 *      |acc| >= T (NaNs too: they must not hide in the residual). The
 *      values go on the wire as float32, or rounded to float16 / bfloat16
 *      with ",fp16" / ",bf16";
 *   3. keeps residual = acc - sent, exactly (sent + residual == acc
 *      bitwise: a value minus its own 16-bit rounding is a float32);
 *   4. all-gathers every rank's pairs (threshold: after an all-gather of
 *      the counts, each rank's pairs padded to the largest count), and
 *      forms the sparse sum in float32 in rank order (rank 0's pairs
 *      first), divided by the rank count: every rank ends with the same
 *      bytes, as with the dense all-reduce.
 * With one peer the same selection and rounding apply, so that one process
 * computes what N peers would.
 *
 * The pairs a peer sends are checked: indices ascending and inside the
 * bucket, counts no larger than the bucket; anything else is an error
 * naming the rank, never a write out of bounds.
 */
#ifndef MESH_TRAIN_SPARSE_H
#define MESH_TRAIN_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "collective/collective.h"

enum mesh_sparse_kind {
    MESH_SPARSE_NONE = 0,
    MESH_SPARSE_TOPK = 1,      /* param: the fraction R, 0 < R <= 1 */
    MESH_SPARSE_THRESHOLD = 2, /* param: the threshold T, 0 <= T < inf */
};

struct mesh_sparse_cfg {
    int kind;           /* enum mesh_sparse_kind */
    double param;       /* R or T */
    int wire;           /* the values' dtype: MESH_DT_F32, F16 or BF16 */
    int error_feedback; /* keep and re-add the residual (default on) */
};

/*
 * One --compress item, "topk:R" or "threshold:T", into kind and param
 * (wire and error_feedback untouched). -EINVAL with a message naming the
 * item and what is wrong with it.
 */
int mesh_sparse_parse(const char *s, struct mesh_sparse_cfg *out);

/* "topk:0.01" and the like, into buf (the form mesh_sparse_parse reads). */
void mesh_sparse_name(const struct mesh_sparse_cfg *c, char *buf, size_t cap);

/* Top-k's k for a bucket of n floats: R n to the nearest integer (halves
 * up), at least 1 and at most n; 0 for n == 0. */
size_t mesh_sparse_topk_count(double r, size_t n);

/*
 * The selection of steps 2 and 3 on its own: from acc[0..n), the chosen
 * indices (ascending) into idx and their values as c->wire into val
 * (room for n of each; top-k: k), their number in *count. residual, when
 * not NULL, gets acc - sent (acc where nothing was sent); it may be acc
 * itself. n < 2^32. Top-k reads acc twice (a radix select on |v|'s bits,
 * 16 then 15 of them). Returns 0, or -ENOMEM.
 */
int mesh_sparse_select(const struct mesh_sparse_cfg *c, const float *acc,
                       size_t n, uint32_t *idx, void *val, float *residual,
                       size_t *count);

struct mesh_sparse;

/*
 * The sparse exchange of nbuckets buckets, bucket i the floats
 * [lo[i], hi[i]) of a slab of nparams floats (each at most UINT32_MAX
 * floats), between size ranks (coll NULL: one). The residual starts at 0.
 * coll must outlive it.
 */
int mesh_sparse_create(const struct mesh_sparse_cfg *c, mesh_coll_t *coll,
                       int rank, int size, size_t nparams, const size_t *lo,
                       const size_t *hi, int nbuckets,
                       struct mesh_sparse **out);
/* Nothing may be in flight (finish or abort first). NULL is a no-op. */
void mesh_sparse_destroy(struct mesh_sparse *sp);

/*
 * Bucket i's gradients g (its hi - lo floats, host memory, scaled) are
 * final: steps 1 to 3 (g becomes acc), and the start of the exchange.
 * With one rank the result is in g at once.
 */
int mesh_sparse_start(struct mesh_sparse *sp, int i, float *g);
/*
 * Threshold: wait for bucket i's counts and start the all-gather of its
 * pairs (top-k and one rank: nothing to do). Call it for every started
 * bucket, in the order they were started, before the first
 * mesh_sparse_wait, so that the pairs of every bucket are in flight
 * together.
 */
int mesh_sparse_exchange(struct mesh_sparse *sp, int i);
/*
 * Wait for bucket i's pairs and write the averaged sparse sum into g (the
 * bucket's floats). *t0, *t1 (either may be NULL): when the pairs'
 * all-gather ran (mesh_now_s(), 0 when not known).
 */
int mesh_sparse_wait(struct mesh_sparse *sp, int i, float *g, double *t0,
                     double *t1);
/* After an error: wait for every collective in flight. */
void mesh_sparse_abort(struct mesh_sparse *sp);

/* Bytes bucket i's last exchange gathered on each rank (every rank's
 * pairs, padding included; counts not included). */
size_t mesh_sparse_bytes(const struct mesh_sparse *sp, int i);

/* The residual, nparams floats of this rank, indexed as the slab; NULL
 * without error feedback. The caller may read it (checkpoints) and write
 * it (resume) between steps. */
float *mesh_sparse_residual(struct mesh_sparse *sp);

#endif
