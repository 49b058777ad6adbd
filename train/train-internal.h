/*
 * train/train-internal.h: the trainer's state, shared by the files of the
 * training loop (train.c: setup, steps, evaluation, teardown;
 * checkpoint.c: the trainer's checkpoints and --resume). Not a public
 * interface: train/train.h is.
 */
#ifndef MESH_TRAIN_INTERNAL_H
#define MESH_TRAIN_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "collective/collective.h"
#include "train/gradsync.h"
#include "train/model.h"
#include "train/simulate.h"
#include "train/timeline.h"
#include "train/train.h"

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

    struct mesh_gradsync *gs;  /* the gradient buckets */
    float loss_avg;            /* the step's loss, averaged in flight */
    mesh_coll_req_t *loss_req; /* its all-reduce, started after forward */
    int local_err;             /* the error is this peer's own (data, files,
                                  compute), not the mesh's: exit code 1 */
    int agreed_err; /* every peer reached the same error from the same
                       shared facts: exit 1 without aborting the others */

    struct mesh_nn_lr_sched lr; /* --lr-schedule with the run's length */

    uint8_t config_digest[32];
    char config[MESH_CONFIG_MAX];

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

/* Mark an error as this peer's own (MESH_EXIT_USAGE rather than PEER). */
static inline int train_local(struct trainer *t, int rc)
{
    if (rc < 0)
        t->local_err = 1;
    return rc;
}

/* Host copies of device slabs (the slab itself with host slabs); *rc is
 * the copy's status. */
float *train_momentum_host(struct trainer *t, int *rc);
/* Average the BN running statistics over the peers (identical after). */
int train_bn_average(struct trainer *t);

/* ---- checkpoint.c ------------------------------------------------------- */

/* DIR/rank-R of --checkpoint-dir DIR in buf; makes DIR. */
int train_ckpt_dir(const struct trainer *t, char *buf, size_t cap);
/* Checkpoint after step optimizer steps. */
int train_ckpt_write(struct trainer *t, uint64_t step);
/* --resume: the step to continue from (0: none, with --resume=if-any). */
int train_ckpt_resume(struct trainer *t, uint64_t *step_out);

/* ---- finetune.c ---------------------------------------------------------- */

/* --init: read the file and hash it (before the configuration). */
int train_init_read(struct trainer *t);
/* --init, --init-skip: load into the new model (before the optimizer). */
int train_init_apply(struct trainer *t);
/* --freeze: freeze the params (before the optimizer and the buckets). */
int train_freeze_apply(struct trainer *t);
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
