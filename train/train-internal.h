/*
 * train/train-internal.h: the trainer's state, shared by the files of the
 * training loop (train.c: setup, steps, evaluation, teardown;
 * checkpoint.c: the trainer's checkpoints and --resume). Not a public
 * interface: train/train.h is.
 */
#ifndef MESH_TRAIN_INTERNAL_H
#define MESH_TRAIN_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <openssl/evp.h>

#include "collective/collective.h"
#include "train/gradsync.h"
#include "train/model.h"
#include "train/elastic.h"
#include "train/simulate.h"
#include "train/timeline.h"
#include "train/train.h"

/* A joiner's start-up, logged after its first step (join_first_step). */
enum train_join_mark {
    TRAIN_JM_RUN,    /* train_run entered: exec, libraries, flags */
    TRAIN_JM_INPUT,  /* data opened, configuration built */
    TRAIN_JM_ANSWER, /* a running member answered the JOIN */
    TRAIN_JM_BUILT,  /* model built (open_model) */
    TRAIN_JM_MODEL,  /* model and kernels built (warm_up) */
    TRAIN_JM_BYTES,  /* catch-up: the snapshot's bytes all in */
    TRAIN_JM_SNAP,   /* catch-up: its snapshot loaded, admission asked */
    TRAIN_JM_ADMIT,  /* the view that admits it decided */
    TRAIN_JM_MESH,   /* its mesh and communicator formed */
    TRAIN_JM_STATE,  /* the state received and checked */
    TRAIN_JM_BEGIN,  /* its first step begun */
    TRAIN_JM_N
};

/* Where a view change's time went, in seconds (view_report's "parts"). */
enum train_vc_part {
    TRAIN_VC_AGREE,   /* from the failure to the decision */
    TRAIN_VC_RESTORE, /* the snapshot restored, the weights hashed */
    TRAIN_VC_MESH,    /* the new mesh and communicator formed */
    TRAIN_VC_XFER,    /* the joiners' state sent and restored */
    TRAIN_VC_READY,   /* buckets, data layout, digest compared */
    TRAIN_VC_N
};

struct trainer {
    const struct train_cfg *c;
    struct mesh *mesh;
    mesh_coll_t *coll; /* NULL with one peer */
    int rank, size;
    int ncpus; /* mesh_bind: the CPUs this rank should keep busy */

    struct mesh_dataset *ds;
    struct mesh_data_info info;
    struct mesh_loader *train_ld, *eval_ld;
    uint64_t micro_per_epoch; /* loader steps (micro-batches) per epoch */
    uint64_t steps_per_epoch; /* optimizer steps per epoch */
    uint64_t total_steps;

    struct mesh_nn_ctx *ctx;
    struct mesh_nn_model *model;
    struct mesh_nn_sgd *sgd;
    /* BN's num_batches_tracked at step 0 (--init's, else 0; a checkpoint's
     * less its steps x --accumulate): after step s the model's counter is
     * set to nbt0 + s x --accumulate on every peer, as in a run of one
     * view, not to the forward passes this process ran (a joiner ran none
     * before it came, a view with --keep-global-batch gives peers more) */
    int64_t nbt0;
    struct mesh_nn_model_cfg mcfg;
    struct mesh_train_model tm; /* the model or the simulation, as ops */
    size_t nparams, nbuffers;
    int host_slabs; /* the backend's slabs are host memory */
    float *hparams; /* host copies for digests, checkpoints (nparams) */
    float *hmom;
    float *hbuf;                /* nbuffers */
    struct mesh_sim *sim;       /* --simulate-compute: no model, no data */
    struct mesh_sim_prof *prof; /* --profile-layers */
    char sim_name[320];
    /* nbuffers: this peer's own BN statistics, kept while an evaluation or
     * a checkpoint uses their average (train_bn_keep) */
    float *bn_own;

    struct mesh_gradsync *gs;  /* the gradient buckets */
    float loss_avg;            /* the step's loss, averaged in flight */
    mesh_coll_req_t *loss_req; /* its all-reduce, started after forward */
    int loss_lag;   /* device slabs, no --elastic: each micro-batch's loss is
                       queued on the device (mesh_nn_model_loss_start) and a
                       step's loss is read and averaged during the next step,
                       so that no step waits for the device to hand it back */
    int local_err;  /* the error is this peer's own (data, files,
                       compute), not the mesh's: exit code 1 */
    int agreed_err; /* every peer reached the same error from the same
                       shared facts: exit 1 without aborting the others */

    struct mesh_nn_lr_sched lr; /* --lr-schedule with the run's length */

    /*
     * The step's shape: each optimizer step covers `slots` micro-batches
     * of --batch samples (size x --accumulate, or the first view's with
     * --keep-global-batch), of which this peer computes `accum`; its loss
     * and gradients are scaled by gscale = size / slots before the
     * average over the peers.
     */
    int slots, accum;
    float gscale;

    /* --elastic: the view, snapshots at step boundaries, the data
     * position (epoch, permutation position) of the step being run */
    const struct mesh_opts *mo;
    struct mesh_elastic *el;
    int size0;           /* slots of the job (view 0) */
    uint64_t view_epoch; /* the current view */
    uint64_t members;
    struct train_snap {
        int valid;
        /* params and mom are not copied yet: the live weights and momentum
         * are the snapshot's until the step's update, which keeps them
         * here in its own pass (host slabs; snap_take, train_step) */
        int lazy;
        uint64_t step, d_epoch, d_pos;
        float *params, *mom, *buf;
        float *residual; /* sparse gradients' error feedback, or NULL */
    } snap[2];
    uint64_t d_epoch, d_pos;
    int d_restored; /* --resume took d_epoch, d_pos from the checkpoint */
    /* joins: no view's mesh has formed here yet (a joiner, or view 0
     * failed to form); the state received so far (train/xfer.c); the
     * join's figures, logged after the first step */
    int unformed, joiner;
    /* --elastic: the listening socket every view's mesh accepts on
     * (mesh_transport_opts.listen_fd), kept for the process's life; -1:
     * each mesh binds its own */
    int listen_fd;
    int join_rc;      /* view 0's mesh_open: -ETIMEDOUT, some slot is a spare */
    int join_batch;   /* test aid MESHTRAIN_TEST_JOINERS=N: admit joiners
                         once N ask (tests/train_elastic_join.sh), else 1 */
    int step_ms;      /* test aid MESHTRAIN_TEST_STEP_MS: a pause per step */
    uint64_t join_at; /* test aid MESHTRAIN_TEST_JOIN_AT=STEP: wait at
                         that step's start until join_batch joiners ask
                         or are refused (at most 60 s); UINT64_MAX:
                         never */
    /* MESHTRAIN_TEST_JOIN_AT=STEP,STEP2...: the next waits, in order;
     * each admission of a joiner moves join_at to the next (the verbs
     * lane's second restart); UINT64_MAX: none */
    uint64_t join_ats[4];
    struct train_xfer *xfer;
    /* catch-up (train/catchup.c): a member's side server; a joiner's
     * background fetch and replay, and the step whose state it left in
     * the model (UINT64_MAX: none) with its figures */
    struct train_serve *serve;
    struct train_catchup *cu;
    /* a joiner's warm-up, on a thread of its own (train.c, warm_start);
     * warm_mu orders its end against the catch-up's: cu is set to NULL
     * under it before the catch-up is freed */
    pthread_t warm_th;
    pthread_mutex_t warm_mu;
    int warm_on;
    /* the weights' SHA-256 ahead of a view change (train/whash.c) */
    struct train_wh *wh;
    uint64_t cu_step, cu_snap_step, cu_replayed;
    double cu_secs;
    double join_xfer_s;
    uint64_t join_bytes, join_view;
    char join_sent[256];          /* bytes from each sender */
    double join_mark[TRAIN_JM_N]; /* a joiner's start-up: mesh_now_s()
                                     at each mark, 0 before */
    double vc_parts[TRAIN_VC_N];  /* the last view change's */
    char pending[512]; /* the last step's metrics line, written once a
                          later step's all-reduce proves it committed */
    uint64_t pending_step;
    char wall[48];       /* wall_field's text */
    char snap_field[48]; /* snap_field's text */
    /* --elastic: the last line pending_flush took (written by rank 0 or
     * not), and its step: a new rank 0 writes it if its predecessor died
     * before it could (metrics_take_over) */
    char kept[512];
    uint64_t kept_step;
    int took_metrics; /* this view made us rank 0, the metrics' writer */
    FILE *samples;    /* MESHTRAIN_TEST_SAMPLES: positions trained */
    struct {
        int moment; /* enum train_fault, 0: none */
        uint64_t step;
        int sig;
    } fault; /* MESHTRAIN_TEST_FAULT, this slot's */

    uint8_t config_digest[32];
    char config[MESH_CONFIG_MAX];
    size_t config_core; /* config's first bytes that config_digest covers
                         * (what checkpoints must agree on) */

    /* --init: the file's bytes until loaded, and their SHA-256 (hex) */
    uint8_t *init_buf;
    size_t init_len;
    char init_digest[65];
    double eval_samples; /* the last evaluation's, over every peer */

    /* output */
    double t0;
    FILE *metrics;
    struct mesh_timeline tl; /* rank 0's --timeline events */
    uint64_t step;           /* the step being run */
    int tty;
};

/*
 * Test aid (tests/train_elastic.sh): MESHTRAIN_TEST_FAULT=S:MOMENT:STEP[:stop]
 * (comma-separated, one per slot S) makes slot S raise SIGKILL (or
 * SIGSTOP) at MOMENT of step STEP (0-based): "allreduce" once a gradient
 * bucket's all-reduce has started, "between" at the step boundary,
 * "checkpoint" in the middle of writing the checkpoint after the step,
 * "eval" in the evaluation after the step, "agree" in the first view
 * agreement (STEP ignored), "xfer" halfway through a state transfer, as
 * a sender or a joiner (STEP ignored), "catchup" during a joiner's
 * catch-up: a member once it queued its snapshot for the joiner, the
 * joiner once it loaded the snapshot (STEP ignored).
 */
enum train_fault {
    TRAIN_FAULT_NONE,
    TRAIN_FAULT_ALLREDUCE,
    TRAIN_FAULT_BETWEEN,
    TRAIN_FAULT_CHECKPOINT,
    TRAIN_FAULT_EVAL,
    TRAIN_FAULT_AGREE,
    TRAIN_FAULT_XFER,
    TRAIN_FAULT_CATCHUP,
};
void train_fault(struct trainer *t, int moment);

/* Mark an error as this peer's own (MESH_EXIT_USAGE rather than PEER). */
static inline int train_local(struct trainer *t, int rc)
{
    if (rc < 0)
        t->local_err = 1;
    return rc;
}

/* How long the members wait for every peer of a new view's mesh: the
 * peer timeout, 5 s at least (a joiner's last waits keep within it). */
static inline double train_view_join_timeout(const struct trainer *t)
{
    return MESH_MAX(5.0, t->mo->topts.peer_timeout_s);
}

/* Host copies of device slabs (the slab itself with host slabs); *rc is
 * the copy's status. */
float *train_momentum_host(struct trainer *t, int *rc);
/* Average the BN running statistics over the peers (identical after). */
int train_bn_average(struct trainer *t);
/* Copy this peer's BN running statistics into t->bn_own (allocated on the
 * first call), and back into the model: around an evaluation or a
 * checkpoint during training, which use their average, so that training
 * goes on from each peer's own as in a run without them. */
int train_bn_keep(struct trainer *t);
int train_bn_restore(struct trainer *t);

/* ---- checkpoint.c ------------------------------------------------------- */

/* DIR/rank-R of --checkpoint-dir DIR in buf; makes DIR. */
int train_ckpt_dir(const struct trainer *t, char *buf, size_t cap);
/* Checkpoint after step optimizer steps. */
int train_ckpt_write(struct trainer *t, uint64_t step);
/* --resume: the step to continue from (0: none, with --resume=if-any). */
int train_ckpt_resume(struct trainer *t, uint64_t *step_out);

/* ---- xfer.c -------------------------------------------------------------- */

/*
 * The SHA-256 of a peer's weights and of its momentum (nparams floats
 * each, as the host stores them), computed once per view change: the
 * weight check after it compares their hash (train.c), and the state
 * transfer's digest is built from them (xfer.c), so that a view change
 * hashes the weights once on each peer. Each is a cell hash (below).
 */
struct train_whash {
    int valid;
    uint8_t h[64]; /* SHA-256 of the parameters, then of the momentum */
};

struct train_xfer_stats {
    uint64_t senders;     /* slots that hold the state */
    uint64_t bytes;       /* sent (sender) or received (needy) here */
    uint64_t sent[64];    /* needy: bytes from each sender, in order */
    uint64_t state_bytes; /* the whole state */
    uint64_t hashed;      /* bytes of the state hashed here (SHA-256) */
    double secs;          /* the transfer, BN average included */
    double bn_s;          /* of which: the BN statistics' average */
    double copy_s;        /* the state copied into (out of) the buffer */
    double hash_s;        /* of which: in SHA-256 (a joiner's overlaps
                             the receiving) */
};

/*
 * In a view that admits peers without state (v->needy): the senders'
 * BN statistics averaged, then the state of step v->step sent from the
 * other members' snapshots to the needy, whose snapshot of that step it
 * becomes (checked by SHA-256). Every member calls it after the view's
 * communicator is open; then each restores the snapshot. wh: a member's
 * hashes of its weights of that step (the snapshot restored), or a
 * joiner's of those it caught up to (t->cu_step == v->step), or not
 * valid; on a joiner, the hashes of the weights received, on success.
 */
int train_xfer_run(struct trainer *t, const struct mesh_elastic_view *v,
                   struct train_whash *wh, struct train_xfer_stats *st);
void train_xfer_free(struct trainer *t);
/* Test aid MESHTRAIN_TEST_XFER_CORRUPT (see xfer.c): on slot, corrupt the
 * n bytes of blob, or its SHA-256 digest, after hashing; catchup: blob is
 * a catch-up snapshot. */
void train_xfer_test_corrupt(int slot, int catchup, uint8_t *blob, size_t n,
                             uint8_t *digest);

/* ---- catchup.c ----------------------------------------------------------- */

/* A member: serve joiners' catch-up on a side port (--elastic); the view
 * formed (1) or is changing (0); a step boundary (after the snapshot, whose
 * host copy a device backend serves); a step's reduced gradient (right
 * before the optimizer, which must not run while the side thread copies
 * the live weights: it waits here; downloaded from a device); the step's
 * update done (with host slabs the live weights are step + 1's).
 */
int train_serve_start(struct trainer *t);
void train_serve_stop(struct trainer *t);
void train_serve_view(struct trainer *t, int valid);
void train_serve_boundary(struct trainer *t, uint64_t step);
void train_serve_grad(struct trainer *t, uint64_t step, float lr);
void train_serve_updated(struct trainer *t, uint64_t step);
/* A joiner: fetch a snapshot and replay the steps while the job trains,
 * started before its model is built (train_catchup_model: built, the
 * snapshot may be loaded; on a device backend the catch-up's thread then
 * uses the device until it ends; on the cpu backend it only copies into
 * the model's host slabs and runs the optimizer's loop, beside the
 * kernels' warm-up); train_catchup_ready: the joiner may be admitted (its
 * join stays held until then, and until the snapshot is loaded);
 * train_catchup_finish(step, wh), when a
 * view admits it from step: 1 if the model holds that step's weights and
 * momentum (t->cu_step = step; on a device backend t->hparams and t->hmom
 * hold a copy), and then wh their hashes (valid: hashed while the joiner
 * waited, or when the view came). */
int train_catchup_start(struct trainer *t);
void train_catchup_model(struct trainer *t);
void train_catchup_ready(struct trainer *t);
/* train_catchup_aim(step): the target of train_catchup_finish, named
 * early, so that the catch-up ends while the caller does other work. */
void train_catchup_aim(struct trainer *t, uint64_t step);
int train_catchup_finish(struct trainer *t, uint64_t step,
                         struct train_whash *wh);
void train_catchup_stop(struct trainer *t);

/* ---- whash.c ------------------------------------------------------------- */

/*
 * The cell hash of a byte string: the SHA-256 of the list of the SHA-256s
 * of its cells, the TRAIN_WCELL bytes at each multiple of TRAIN_WCELL (the
 * last one shorter). Every byte is hashed once, and cells can be hashed
 * apart, in any order (a joiner's stripes as they come, train/catchup.c),
 * then combined; SHA-256 throughout. The weights' and the momentum's
 * hashes (struct train_whash) and the state transfer's parts are cell
 * hashes. train_wch_init(c, len) for a string of len bytes, fed in order
 * (train_wch_feed, any pieces), then train_wch_final; train_wch_free;
 * train_wch_sum(p, len, out) in one call; train_wch_top(cells, n, out):
 * the cell hash from its n cells' SHA-256s (n x 32 bytes). 0 or -EIO.
 */
#define TRAIN_WCELL (4u << 20)

struct train_wch {
    EVP_MD_CTX *cell; /* the cell being hashed */
    EVP_MD_CTX *top;  /* over the cells' SHA-256s */
    size_t at, len;   /* bytes fed, of len */
};

int train_wch_init(struct train_wch *c, size_t len);
int train_wch_feed(struct train_wch *c, const void *p, size_t n);
int train_wch_final(struct train_wch *c, uint8_t out[32]);
void train_wch_free(struct train_wch *c);
int train_wch_sum(const void *p, size_t len, uint8_t out[32]);
int train_wch_top(const uint8_t *cells, size_t n, uint8_t out[32]);

/*
 * A member's weights' SHA-256 for a view change, computed ahead on a
 * thread of its own (cpu backend; elsewhere every call does nothing and
 * train_whash_get finds none). train_whash_hold before any write of the
 * live weights and momentum or of a snapshot slot's, then one of:
 * train_whash_updated(step, ok) after the update of step,
 * train_whash_restored(step, ok) after a restore of step's snapshot (the
 * thread hashes that state now, unless it has or is), train_whash_forget
 * (drop every hash; it holds and releases by itself). train_whash_snap
 * (step) before snap_take of step (holds and releases by itself).
 * train_whash_get(step, wh, ahead): waits for the hash of step's state,
 * if one is kept or under way: 1 and wh valid, *ahead the bytes hashed
 * before the view change began; 0 if none (hash them yourself).
 */
int train_whash_start(struct trainer *t);
void train_whash_stop(struct trainer *t);
void train_whash_hold(struct trainer *t);
void train_whash_updated(struct trainer *t, uint64_t step, int ok);
void train_whash_restored(struct trainer *t, uint64_t step, int ok);
void train_whash_snap(struct trainer *t, uint64_t step);
void train_whash_forget(struct trainer *t);
int train_whash_get(struct trainer *t, uint64_t step, struct train_whash *wh,
                    uint64_t *ahead);

/* ---- finetune.c ---------------------------------------------------------- */

/* --init: read the file and hash it (before the configuration). */
int train_init_read(struct trainer *t);
/* --init, --init-skip: load into the new model (before the optimizer). */
int train_init_apply(struct trainer *t);
/* --freeze: freeze the params (before the optimizer and the buckets). */
int train_freeze_apply(struct trainer *t);
/* --predict: every image's top-5 over the peers, the CSV on rank 0. */
int train_predict(struct trainer *t);
/* --freeze: log how many gradient floats the buckets hold (rank 0). */
void train_freeze_report(const struct trainer *t);
/* --eval-only: print top-1 and top-5 of the evaluation just done (rank
 * 0), and its JSON record with --metrics. */
int train_eval_report(struct trainer *t, double top1, double top5);
/* The configuration lines of the flags above into buf (core: the ones
 * that define the training trajectory); their length, or < 0. */
int train_finetune_config(const struct trainer *t, char *buf, size_t cap,
                          int core);

#endif
