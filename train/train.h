/*
 * train/train.h: the synchronous data-parallel training loop of meshtrain.
 *
 * meshtrain.c parses the flags into a struct train_cfg and the mesh flags
 * into a struct mesh_opts, then calls train_run(), which joins the mesh,
 * trains, evaluates, checkpoints and returns a process exit code
 * (enum mesh_exit of mesh/mesh.h).
 *
 * One optimizer step, per peer:
 *   1. K = --accumulate micro-batches of --batch samples from the loader
 *      (this peer's shard of the epoch's permutation, data/data.h);
 *   2. forward, loss, backward of each; the gradients of the last
 *      micro-batch are reported by nn range by range (from the end of the
 *      slab down), and every gradient bucket (about --bucket-mb, the first
 *      one smaller) starts its non-blocking all-reduce (average over the
 *      peers, optionally as 16-bit on the wire) as soon as its range is
 *      final, so communication overlaps the rest of backward;
 *   3. wait for every bucket, divide by K, and apply the same SGD step on
 *      every peer: the replicas stay bitwise identical, which a SHA-256
 *      digest of the weights, compared across peers, checks before step 1
 *      and every --verify-every steps.
 *
 * Batch norm uses each peer's local batch statistics; the running
 * statistics are averaged over the peers before every evaluation, every
 * checkpoint and the final save.
 *
 * The files of train/:
 *   train.c       the run: setup, the step loop, evaluation, the end
 *                 (train-internal.h: the trainer's state, shared with
 *                 checkpoint.c);
 *   model.[ch]    what a step needs of a model: nn's ResNet or the
 *                 simulation behind one ops table;
 *   gradsync.[ch] the gradient buckets, their all-reduces and the
 *                 pinned-host pipeline (the only file that knows both
 *                 nn's device copies and the communicator);
 *   sparse.[ch]   --compress topk / threshold: the pairs' selection,
 *                 error feedback and all-gather (gradsync.c calls it);
 *   checkpoint.c  what the trainer's checkpoints hold, and --resume;
 *   finetune.c    --init (and --init-skip), --freeze, --eval-only's
 *                 report, --predict;
 *   ckpt.[ch]     the checkpoint directory format (MANIFEST, blobs);
 *   timeline.[ch] the --timeline Chrome trace;
 *   simulate.[ch] simulated compute (--simulate-compute) and per-layer
 *                 timing (--profile-layers).
 */
#ifndef MESH_TRAIN_H
#define MESH_TRAIN_H

#include <stdint.h>

#include "nn/nn.h"
#include "data/data.h"
#include "mesh/mesh.h"
#include "train/sparse.h"

enum train_compress {
    TRAIN_COMPRESS_NONE = 0,
    TRAIN_COMPRESS_FP16 = 1,
    TRAIN_COMPRESS_BF16 = 2,
};

/* --resume: whether a run may start from step 0 when no checkpoint is
 * usable (none, damaged, or none that every peer holds). */
enum train_resume {
    TRAIN_RESUME_OFF = 0,
    TRAIN_RESUME_REQUIRED = 1, /* --resume: then an error (exit 1) */
    TRAIN_RESUME_IF_ANY = 2,   /* --resume=if-any: then step 0, warned */
};

struct train_cfg {
    /* model */
    struct mesh_nn_model_cfg model; /* arch, width, stem, seed; classes,
                                       channels and size come from data */
    const char *device;             /* "cpu" or "cuda" */
    int gpu;       /* cuda: device index, -1: from MESHTRAIN_LOCAL_RANK */
    int precision; /* enum mesh_nn_precision (fp32, tf32, bf16-amp) */
    int threads;   /* compute threads, 0: cores / local peers */
    int summary;   /* print the layer table and exit */

    /* data */
    const char *data; /* --data spec (data/data.h) */
    int data_threads; /* loader workers (0: 2) */
    int augment;      /* -1 data set default, 0 off, 1 on */
    enum mesh_data_bad on_bad;

    /* training */
    int batch;                  /* per peer and micro-batch */
    int accumulate;             /* micro-batches per step */
    double epochs;              /* length, when iters == 0 */
    uint64_t iters;             /* optimizer steps, 0: use epochs */
    struct mesh_nn_lr_sched lr; /* base_lr, kind, warmup, ... */
    struct mesh_nn_sgd_cfg sgd;
    float label_smoothing;

    /* communication */
    double bucket_mb;
    double chunk_mb; /* device backends: a bucket's pipeline chunks */
    int compress;    /* enum train_compress: dense 16-bit, or the pairs'
                        values with sparse */
    struct mesh_sparse_cfg sparse; /* --compress topk:R, threshold:T */
    int no_error_feedback;         /* --no-error-feedback (sparse only) */
    int algo;                      /* MESH_ALGO_* */

    /* checks, evaluation, checkpoints */
    uint64_t verify_every; /* steps between digest checks, 0: off */
    double eval_every;     /* epochs between evaluations, 0: end only */
    int no_eval;
    uint64_t checkpoint_every;  /* steps, 0: none */
    const char *checkpoint_dir; /* each peer uses DIR/rank-R */
    int keep;
    int resume;       /* enum train_resume */
    const char *save; /* final weights (safetensors), rank 0 */

    /* output */
    const char *metrics;     /* JSON lines, rank 0 */
    const char *timeline;    /* Chrome trace, rank 0 */
    uint64_t timeline_steps; /* steps recorded in the trace */
    uint64_t log_every;      /* progress lines when not a TTY */
    int quiet;

    /* fine-tuning (train/finetune.c) */
    const char *init;        /* --init FILE: torchvision-named safetensors */
    const char *init_skip;   /* --init-skip PATTERN: keep these fresh */
    const char *freeze;      /* --freeze PATTERN: fixed, not all-reduced */
    int eval_only;           /* --eval-only: evaluate, no step */
    const char *predict;     /* --predict DIR: top-5 of its JPEGs */
    const char *predict_out; /* --predict-out FILE: their CSV (rank 0) */

    /* --elastic (train/elastic.h, doc/elastic.md) */
    int elastic;           /* survive dead peers with views */
    int min_peers;         /* the smallest view that may train (>= 1) */
    int elastic_lr;        /* lr x view size / initial size */
    int keep_global_batch; /* accumulate to keep the global batch */

    /* simulated compute (train/simulate.h): the scaling benchmark */
    const char *simulate;       /* --simulate-compute PROFILE, or NULL */
    double simulate_scale;      /* k: gradient bytes divided by k */
    int simulate_gpus;          /* simulated GPUs per process (>= 1) */
    const char *profile_layers; /* --profile-layers FILE (rank 0) */
};

void train_cfg_init(struct train_cfg *c);

/*
 * Join the mesh described by mo (finished), train as c says, and return
 * the exit code (MESH_EXIT_*); errors are printed on stderr, prefixed with
 * the rank.
 */
int train_run(const struct train_cfg *c, const struct mesh_opts *mo);

/*
 * Parse --compress: "none", "fp16", "bf16", "topk:R" or "threshold:T", or
 * a sparse item and a 16-bit one joined by a comma ("topk:0.01,fp16"),
 * into c->compress and c->sparse.kind and param.
 */
int train_compress_parse(const char *s, struct train_cfg *c);

#endif
