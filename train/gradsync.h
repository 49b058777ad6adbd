/*
 * train/gradsync.h: gradient synchronisation, as PyTorch DDP's Reducer
 * does it: the gradient slab cut into buckets, each averaged over the
 * peers as soon as backward has finished it, overlapping the rest of
 * backward. The only part of the trainer that knows both nn's device
 * copies and the communicator.
 *
 * Buckets are contiguous ranges of the gradient slab cut at tensor
 * boundaries, from the end of the slab (the first gradients backward
 * finishes) down to 0: bucket 0 is at most 1 MiB (or bucket_mb if
 * smaller) so that communication starts early, the others about
 * bucket_mb. mesh_gradsync_ready (from nn's grad-ready callback) starts
 * every bucket whose lower end is final; mesh_gradsync_finish starts the
 * rest and waits for each in order. Each bucket is scaled by grad_scale
 * and, with a 16-bit wire dtype, rounded to it on the way (also with one
 * peer, so that one process computes what N peers would).
 *
 * With a device slab and peers, each bucket goes through pinned host
 * memory (the communicator's buffers, made with nn's allocator) in chunks
 * of about chunk_mb: copies and all-reduces overlap chunk by chunk (see
 * "The pinned-host pipeline" in gradsync.c). All-reduces start in
 * (bucket, chunk) order, the same on every rank.
 *
 * A step: mesh_gradsync_begin, mesh_gradsync_ready per range (offsets
 * decreasing), then mesh_gradsync_finish; after an error during backward,
 * mesh_gradsync_abort instead.
 */
#ifndef MESH_GRADSYNC_H
#define MESH_GRADSYNC_H

#include <stddef.h>

#include "collective/collective.h"
#include "nn/nn.h"
#include "train/model.h"
#include "train/sparse.h"

/*
 * Device slabs with peers: each bucket goes through the pinned-host
 * pipeline in chunks of about chunk_mb. 4 MiB by default: its copy over
 * PCIe (12 to 50 GB/s) takes 80 to 330 us, far above the few microseconds
 * that starting a copy and its event cost, so the copy engine runs near
 * its peak; on the network (1 to 3 GB/s over TCP) it stays in flight for
 * milliseconds, so each chunk's own collective latency (2 (N - 1) hops of
 * tens of microseconds for the ring) stays a few percent up to 8 peers;
 * and ResNet-50's 97.5 MiB make about 25 chunks, so the pipeline fills
 * and drains within a fraction of a bucket.
 */
#define MESH_GRADSYNC_CHUNK_MB_DEFAULT 4

struct mesh_gradsync;

/*
 * A timeline event of the stages: name (a static string: "allreduce",
 * "allgather sparse", "copy to host", "copy to device"), tid (1 communication,
 * 3 copies), the bucket, the chunk's index in it (-1: the whole bucket), the
 * bytes it moved, start and duration in seconds since opts.t0.
 */
typedef void (*mesh_gradsync_event_fn)(void *arg, const char *name, int tid,
                                       int bucket, int chunk, size_t bytes,
                                       double ts, double dur);

struct mesh_gradsync_opts {
    mesh_coll_t *coll;       /* NULL: one peer, nothing to average */
    struct mesh_nn_ctx *ctx; /* the slab's backend (NULL: the simulator) */
    int host_slabs;          /* the gradient slab is host memory */
    size_t nparams;          /* floats in the gradient slab */
    double bucket_mb;        /* --bucket-mb */
    double chunk_mb;         /* --chunk-mb (the pipeline only) */
    int wire;                /* MESH_DT_F32, MESH_DT_F16 or MESH_DT_BF16 */
    /* --compress topk:R / threshold:T: each bucket's pairs all-gathered
     * instead of all-reduced (train/sparse.h; its wire, not the one
     * above), through host memory, without the pinned-host pipeline.
     * NULL: dense. */
    const struct mesh_sparse_cfg *sparse;
    int rank, size;   /* this peer, the peers (sparse) */
    int algo;         /* MESH_ALGO_* */
    float grad_scale; /* every gradient is multiplied by it */
    /* simulated: gradient bytes divided by scale (1: a real model); the
     * buckets are cut, and AUTO chooses, as for the real sizes */
    double scale;
    double t0;                    /* event times: since this mesh_now_s() */
    mesh_gradsync_event_fn event; /* NULL: none */
    void *event_arg;
};

/*
 * Plan the buckets of model's gradient slab (its params, in slab order)
 * and allocate their host and device buffers. The model and the
 * communicator must outlive it. Errors name what failed.
 */
int mesh_gradsync_create(const struct mesh_gradsync_opts *o,
                         const struct mesh_train_model *model,
                         struct mesh_gradsync **out);
/* Free every buffer; nothing may be in flight (finish, abort, or a device
 * sync after them). NULL is a no-op. */
void mesh_gradsync_destroy(struct mesh_gradsync *gs);

int mesh_gradsync_num_buckets(const struct mesh_gradsync *gs);
/* Floats in bucket i (bucket 0: the end of the slab). */
size_t mesh_gradsync_bucket_floats(const struct mesh_gradsync *gs, int i);
/* Chunks of the pinned-host pipeline over all buckets, 0 without it. */
int mesh_gradsync_num_chunks(const struct mesh_gradsync *gs);

/* A new step: no bucket started yet. */
void mesh_gradsync_begin(struct mesh_gradsync *gs);
/* Everything from offset to the end of the slab is final: start the
 * buckets it completes and move the pipeline on, without blocking. */
int mesh_gradsync_ready(struct mesh_gradsync *gs, size_t offset);
/* After backward: start what is left and wait for every bucket. The
 * slab then holds the scaled averages. */
int mesh_gradsync_finish(struct mesh_gradsync *gs);
/* After an error: wait for every all-reduce and copy in flight. Returns
 * rc. */
int mesh_gradsync_abort(struct mesh_gradsync *gs, int rc);

/* Sparse with error feedback: this peer's residual, nparams floats
 * indexed as the gradient slab (checkpoints save and restore it between
 * steps); NULL otherwise. */
float *mesh_gradsync_residual(struct mesh_gradsync *gs);

/*
 * Average n floats of a slab of the model's backend (host memory, or the
 * device's with host staging of n floats) over the peers, blocking.
 */
int mesh_gradsync_average(struct mesh_gradsync *gs, float *slab, float *host,
                          size_t n);

#endif
