/*
 * train/train.c: the training loop of meshtrain (see train/train.h).
 *
 * Shape of a run (train_run):
 *   open the data set -> configuration string -> join the mesh (peers that
 *   disagree are refused, the field named) -> model, SGD, communicator,
 *   loaders -> resume (optional) -> digest check -> steps -> final
 *   evaluation, save, barrier.
 *
 * The gradients of a step's last backward are averaged over the peers
 * bucket by bucket by train/gradsync.c, which nn's grad-ready callback
 * feeds; the timeline shows when the engine really ran each bucket.
 */
#include "config.h"

#include "train/train-internal.h"

#include "common/util.h"
#include "train/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- configuration ------------------------------------------------------- */

void train_cfg_init(struct train_cfg *c)
{
    static const struct train_cfg defaults = {
        .model = {.arch = "resnet50", .seed = 1},
        .device = "cpu",
        .gpu = -1,
        .data = "synthetic",
        .augment = -1,
        .on_bad = MESH_DATA_BAD_FAIL,
        .batch = 32,
        .accumulate = 1,
        .epochs = 1,
        .lr = {.kind = MESH_NN_LR_CONST,
               .base_lr = 0.1,
               .warmup_start = 0.1,
               .gamma = 0.1},
        .sgd = {.momentum = 0.9f, .weight_decay = 1e-4f},
        .bucket_mb = 25,
        .chunk_mb = MESH_GRADSYNC_CHUNK_MB_DEFAULT,
        .compress = TRAIN_COMPRESS_NONE,
        .algo = MESH_ALGO_AUTO,
        .verify_every = 100,
        .eval_every = 1,
        .keep = 3,
        .timeline_steps = 20,
        .log_every = 10,
        .simulate_scale = 1,
        .simulate_gpus = 1,
        .min_peers = 1,
    };

    *c = defaults;
}

/* One dense item of --compress, or -EINVAL (no message). */
static int compress_dense(const char *s, size_t len, int *out)
{
    if (len == 4 && !strncmp(s, "none", 4))
        *out = TRAIN_COMPRESS_NONE;
    else if (len == 4 && !strncmp(s, "fp16", 4))
        *out = TRAIN_COMPRESS_FP16;
    else if (len == 4 && !strncmp(s, "bf16", 4))
        *out = TRAIN_COMPRESS_BF16;
    else
        return -EINVAL;
    return 0;
}

int train_compress_parse(const char *s, struct train_cfg *c)
{
    const char *comma = strchr(s, ',');
    struct mesh_sparse_cfg sp = c->sparse;
    char item[64];
    int dense = TRAIN_COMPRESS_NONE, rc;

    sp.kind = MESH_SPARSE_NONE;
    sp.param = 0;
    if (!comma && compress_dense(s, strlen(s), &dense) == 0)
        goto out;
    /* a sparse item first, then maybe ",fp16" or ",bf16" */
    if (strlen(s) >= sizeof(item))
        return mesh_err(-EINVAL, "--compress: \"%.40s...\" is too long", s);
    snprintf(item, sizeof(item), "%.*s",
             (int)(comma ? (size_t)(comma - s) : strlen(s)), s);
    if (compress_dense(item, strlen(item), &dense) == 0)
        return mesh_err(-EINVAL,
                        "--compress %s: only topk:R or threshold:T may "
                        "come before the comma (e.g. topk:0.01,fp16)",
                        s);
    rc = mesh_sparse_parse(item, &sp);
    /* a known kind keeps mesh_sparse_parse's message (what is wrong) */
    if (rc < 0 &&
        (!strncmp(item, "topk:", 5) || !strncmp(item, "threshold:", 10)))
        return rc;
    if (rc < 0)
        return mesh_err(rc,
                        "--compress: \"%s\" is not none, fp16, bf16, "
                        "topk:R or threshold:T (optionally with ,fp16 or "
                        ",bf16)",
                        s);
    if (comma && (compress_dense(comma + 1, strlen(comma + 1), &dense) < 0 ||
                  dense == TRAIN_COMPRESS_NONE))
        return mesh_err(-EINVAL,
                        "--compress %s: \"%s\" after the comma is not "
                        "fp16 or bf16",
                        s, comma + 1);
out:
    c->compress = dense;
    c->sparse.kind = sp.kind;
    c->sparse.param = sp.param;
    return 0;
}

static const char *compress_name(int c)
{
    return c == TRAIN_COMPRESS_FP16   ? "fp16"
           : c == TRAIN_COMPRESS_BF16 ? "bf16"
                                      : "none";
}

/* --compress as the configuration shows it: "fp16", "topk:0.01,fp16". */
static void compress_spec(const struct train_cfg *c, char *buf, size_t cap)
{
    if (c->sparse.kind == MESH_SPARSE_NONE) {
        snprintf(buf, cap, "%s", compress_name(c->compress));
        return;
    }
    mesh_sparse_name(&c->sparse, buf, cap);
    if (c->compress != TRAIN_COMPRESS_NONE)
        snprintf(buf + strlen(buf), cap - strlen(buf), ",%s",
                 compress_name(c->compress));
}

static const char *lr_kind_name(int k)
{
    return k == MESH_NN_LR_STEP     ? "step"
           : k == MESH_NN_LR_COSINE ? "cosine"
                                    : "const";
}

static double now_s(const struct trainer *t)
{
    return mesh_now_s() - t->t0;
}

/* Also the gradient buckets' event callback (mesh_gradsync_event_fn). */
static void tl_push(void *arg, const char *name, int tid, int bucket, int chunk,
                    size_t bytes, double ts, double dur)
{
    struct trainer *t = arg;
    struct mesh_tl_event e = {
        .name = name,
        .tid = tid,
        .bucket = bucket,
        .chunk = chunk,
        .bytes = bytes,
        .step = t->step,
        .ts = ts,
        .dur = dur,
    };

    if (!t->c->timeline || t->rank != 0 || t->step >= t->c->timeline_steps)
        return;
    mesh_timeline_add(&t->tl, &e);
}

/* An event of the trainer's own (not of a bucket). */
static void tl_add(struct trainer *t, const char *name, int tid, double ts,
                   double dur)
{
    tl_push(t, name, tid, -1, -1, 0, ts, dur);
}

/* ---- test faults --------------------------------------------------------- */

static const char *const fault_names[] = {
    [TRAIN_FAULT_ALLREDUCE] = "allreduce",   [TRAIN_FAULT_BETWEEN] = "between",
    [TRAIN_FAULT_CHECKPOINT] = "checkpoint", [TRAIN_FAULT_EVAL] = "eval",
    [TRAIN_FAULT_AGREE] = "agree",           [TRAIN_FAULT_XFER] = "xfer",
    [TRAIN_FAULT_CATCHUP] = "catchup",
};

/* MESHTRAIN_TEST_FAULT's entry for slot (train-internal.h). */
static int fault_parse(struct trainer *t, int slot)
{
    const char *v = getenv("MESHTRAIN_TEST_FAULT");
    char buf[512], *tok, *save = NULL;

    if (!v || !*v)
        return 0;
    snprintf(buf, sizeof(buf), "%s", v);
    for (tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char moment[32] = "", sig[16] = "";
        int s, m;
        unsigned long long step = 0;

        if (sscanf(tok, "%d:%31[a-z]:%llu:%15s", &s, moment, &step, sig) < 2)
            return mesh_err(-EINVAL, "MESHTRAIN_TEST_FAULT: bad entry \"%s\"",
                            tok);
        if (s != slot)
            continue;
        for (m = 1; m < (int)MESH_ARRAY_SIZE(fault_names); m++)
            if (!strcmp(moment, fault_names[m]))
                break;
        if (m == (int)MESH_ARRAY_SIZE(fault_names))
            return mesh_err(-EINVAL, "MESHTRAIN_TEST_FAULT: no moment \"%s\"",
                            moment);
        t->fault.moment = m;
        t->fault.step = step;
        t->fault.sig = !strcmp(sig, "stop") ? SIGSTOP : SIGKILL;
    }
    return 0;
}

void train_fault(struct trainer *t, int moment)
{
    if (t->fault.moment != moment ||
        (moment != TRAIN_FAULT_XFER && moment != TRAIN_FAULT_CATCHUP &&
         t->step != t->fault.step))
        return;
    t->fault.moment = TRAIN_FAULT_NONE; /* once */
    fprintf(stderr,
            "meshtrain: test fault: signal %d at %s of step %" PRIu64 "\n",
            t->fault.sig, fault_names[moment], t->step);
    fflush(stderr);
    raise(t->fault.sig);
}

/* ---- host copies of device slabs ----------------------------------------- */

static float *params_host(struct trainer *t, int *rc)
{
    float *p = mesh_nn_model_params(t->model);

    *rc = 0;
    if (t->host_slabs)
        return p;
    *rc = mesh_nn_download(t->ctx, t->hparams, p, t->nparams * 4);
    return t->hparams;
}

float *train_momentum_host(struct trainer *t, int *rc)
{
    float *p = mesh_nn_sgd_momentum(t->sgd);

    *rc = 0;
    if (t->host_slabs)
        return p;
    *rc = mesh_nn_download(t->ctx, t->hmom, p, t->nparams * 4);
    return t->hmom;
}

/* ---- collectives on small things ----------------------------------------- */

static int sum_floats(struct trainer *t, float *x, size_t n)
{
    if (!t->coll)
        return 0;
    return mesh_coll_allreduce(t->coll, x, x, n, MESH_DT_F32, MESH_REDOP_SUM,
                               t->c->algo);
}

/* Average the BN running statistics over the peers (identical after). */
int train_bn_average(struct trainer *t)
{
    if (t->sim)
        return 0; /* no statistics to average */
    return mesh_gradsync_average(t->gs, mesh_nn_model_buffers(t->model),
                                 t->hbuf, t->nbuffers);
}

static int snap_copy(struct trainer *t, float *dst, float *dev, size_t n,
                     int to_dev);

int train_bn_keep(struct trainer *t)
{
    if (t->sim || !t->nbuffers)
        return 0;
    if (!t->bn_own && !(t->bn_own = malloc(t->nbuffers * 4)))
        return mesh_err(-ENOMEM, "out of memory for the BN statistics");
    return snap_copy(t, t->bn_own, mesh_nn_model_buffers(t->model), t->nbuffers,
                     0);
}

int train_bn_restore(struct trainer *t)
{
    if (t->sim || !t->nbuffers || !t->bn_own)
        return 0;
    return snap_copy(t, t->bn_own, mesh_nn_model_buffers(t->model), t->nbuffers,
                     1);
}

static void hex(const uint8_t *d, size_t n, char *out)
{
    size_t i;

    for (i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* The cell hashes (SHA-256) of the parameters and of the momentum, into
 * wh. */
static int weights_hash(struct trainer *t, struct train_whash *wh)
{
    float *p, *mom;
    int rc;

    wh->valid = 0;
    p = params_host(t, &rc);
    if (rc == 0 && train_wch_sum(p, t->nparams * 4, wh->h) < 0)
        rc = mesh_err(-EIO, "SHA-256 (OpenSSL EVP) of the weights failed");
    if (rc == 0)
        mom = train_momentum_host(t, &rc);
    if (rc == 0 && train_wch_sum(mom, t->nparams * 4, wh->h + 32) < 0)
        rc = mesh_err(-EIO, "SHA-256 (OpenSSL EVP) of the momentum failed");
    wh->valid = rc == 0;
    return rc;
}

/*
 * SHA-256 of the parameters and momentum (what must stay identical): of
 * their two hashes, wh's when valid (the weights have not changed since).
 */
static int weights_digest(struct trainer *t, const struct train_whash *wh,
                          uint8_t out[32])
{
    struct train_whash own;
    int rc = 0;

    if (!wh || !wh->valid) {
        rc = weights_hash(t, &own);
        wh = &own;
    }
    if (rc == 0)
        rc = mesh_ckpt_sha256(wh->h, sizeof(wh->h), out);
    return rc;
}

/*
 * Compare the weight digests of every peer (an all-gather of 32 bytes).
 * A mismatch names the peers that differ from rank 0 (or, when rank 0 is
 * alone against everyone else, rank 0).
 */
static int verify_weights(struct trainer *t, const char *when,
                          const struct train_whash *wh)
{
    uint8_t mine[32], *all;
    char list[256] = "", a[20], b[20];
    int r, bad = 0, rc;

    if (t->sim)
        return 0; /* no weights */
    rc = weights_digest(t, wh, mine);
    if (rc < 0 || !t->coll)
        return rc;
    all = malloc((size_t)t->size * 32);
    if (!all)
        return mesh_err(-ENOMEM, "out of memory");
    rc = mesh_coll_allgather(t->coll, mine, all, 32, MESH_DT_BYTE);
    if (rc < 0)
        goto out;
    for (r = 1; r < t->size; r++) {
        size_t len = strlen(list);

        if (memcmp(all, all + 32 * r, 32) == 0)
            continue;
        bad++;
        if (len < sizeof(list) - 16)
            snprintf(list + len, sizeof(list) - len, "%s%d", len ? ", " : "",
                     r);
    }
    if (bad) {
        hex(all, 8, a);
        hex(all + 32 * (bad == t->size - 1 && t->size > 2 ? 1 : 0), 8, b);
        if (bad == t->size - 1 && t->size > 2)
            rc = mesh_err(-EBADMSG,
                          "weights differ %s: rank 0 (digest "
                          "%s...) differs from every other peer (%s...)",
                          when, a, b);
        else
            rc = mesh_err(-EBADMSG,
                          "weights differ %s: rank(s) %s differ "
                          "from rank 0 (digest %s...)",
                          when, list, a);
    }
out:
    free(all);
    return rc;
}

/* ---- evaluation ---------------------------------------------------------- */

/* Top-1 and top-5 over the whole evaluation split (each peer its shard). */
static int evaluate(struct trainer *t, double *top1, double *top5)
{
    int classes = t->info.classes, rc, k;
    float *logits = NULL, counts[3] = {0, 0, 0};
    struct mesh_batch batch;
    double ts = now_s(t);

    rc = train_bn_average(t);
    if (rc == 0)
        rc = mesh_data_seek(t->eval_ld, 0, 0);
    if (rc < 0)
        return rc;
    logits = malloc((size_t)t->c->batch * (size_t)classes * sizeof(float));
    if (!logits)
        return mesh_err(-ENOMEM, "out of memory");
    while ((rc = mesh_data_next(t->eval_ld, &batch)) == 0) {
        int i;

        rc = mesh_nn_model_forward(t->model, batch.n, batch.x, 0);
        if (rc == 0)
            rc = mesh_nn_model_logits(t->model, logits);
        if (rc < 0)
            break;
        train_fault(t, TRAIN_FAULT_EVAL);
        for (i = 0; i < batch.n; i++) {
            const float *l = logits + (size_t)i * (size_t)classes;
            int y = batch.y[i], above = 0;

            /* rank of the true class: how many logits beat it (ties go
             * to the lower index, as a stable sort would) */
            for (k = 0; k < classes; k++)
                if (l[k] > l[y] || (l[k] == l[y] && k < y))
                    above++;
            counts[0] += above == 0;
            counts[1] += above < 5;
            counts[2] += 1;
        }
    }
    free(logits);
    if (rc < 0)
        return train_local(t, mesh_err_prefix(rc, "evaluation data"));
    rc = sum_floats(t, counts, 3);
    if (rc < 0)
        return rc;
    tl_add(t, "evaluate", 0, ts, now_s(t) - ts);
    t->eval_samples = counts[2];
    *top1 = counts[2] > 0 ? 100.0 * counts[0] / counts[2] : 0;
    *top5 = counts[2] > 0 ? 100.0 * counts[1] / counts[2] : 0;
    return 0;
}

/* ---- progress ------------------------------------------------------------ */

struct window {
    double t_step, t_compute, t_comm, t_data;
    double t_snap; /* --elastic: the snapshot at the step's start */
    uint64_t steps, images;
};

static void fmt_eta(double s, char *buf, size_t cap)
{
    long v = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;

    if (v >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", v / 3600, v / 60 % 60);
    else
        snprintf(buf, cap, "%ldm%02lds", v / 60, v % 60);
}

static void progress(struct trainer *t, uint64_t step, float loss, double lr,
                     const struct window *w, double eta_s, int final)
{
    double tot = w->t_compute + w->t_comm + w->t_data;
    char eta[32];

    if (t->c->quiet || t->rank != 0 || w->steps == 0)
        return;
    if (tot <= 0)
        tot = 1;
    fmt_eta(eta_s, eta, sizeof(eta));
    printf("%sstep %" PRIu64 "/%" PRIu64 " epoch %.2f loss %.4f lr %.4g | "
           "%.1f img/s | compute %.0f%% comm %.0f%% data %.0f%% | "
           "ETA %s%s",
           t->tty ? "\r\033[K" : "", step, t->total_steps,
           (double)step / (double)t->steps_per_epoch, loss, lr,
           w->t_step > 0 ? (double)w->images / w->t_step : 0.0,
           100 * w->t_compute / tot, 100 * w->t_comm / tot,
           100 * w->t_data / tot, eta, t->tty && !final ? "" : "\n");
    fflush(stdout);
}

/* ---- the run ------------------------------------------------------------- */

/*
 * The configuration that peers must share, as "key=value\n" lines: every
 * flag that changes what a peer computes, or when it joins a collective,
 * with its value as resolved (defaults filled in), so that peers that
 * would diverge, or compute other bits than a uniform run, are refused at
 * the join with the field named. tests/train_flags.sh changes every flag
 * of --help on one peer and expects a refusal or identical weights. The
 * checkpoint digest covers the first part only (what defines the training
 * trajectory), so that a resumed run may change its length or reporting,
 * and run on another number of threads.
 */
static int build_config(struct trainer *t, const uint8_t data_fp[32])
{
    const struct train_cfg *c = t->c;
    const struct mesh_nn_model_cfg *m = &t->mcfg;
    char fp[65], miles[256] = "", comp[96];
    size_t core;
    int n, i, threads;

    compress_spec(c, comp, sizeof(comp));
    /* the compute threads as open_model resolves them: oneDNN's results
     * depend on how many split a convolution's reductions (none are
     * simulated) */
    threads = t->sim ? 0 : c->threads > 0 ? c->threads : t->ncpus;
    for (i = 0; i < t->lr.num_milestones; i++) {
        size_t len = strlen(miles);

        snprintf(miles + len, sizeof(miles) - len, "%s%.9g", i ? "," : "",
                 t->lr.milestones[i]);
    }
    hex(data_fp, 32, fp);
    n = snprintf(t->config, sizeof(t->config),
                 "program=meshtrain\nmodel=%s\nwidth=%d\ncifar_stem=%d\n"
                 "zero_init_residual=%d\nclasses=%d\nchannels=%d\n"
                 "image_size=%d\nseed=%" PRIu64 "\ndata=%s\ndata_digest=%s\n"
                 "augment=%d\nbatch=%d\naccumulate=%d\nlr=%.9g\n"
                 "lr_schedule=%s\nwarmup_epochs=%.9g\nmomentum=%.9g\n"
                 "weight_decay=%.9g\nnesterov=%d\nlabel_smoothing=%.9g\n"
                 "milestones=%s\non_bad_sample=%s\n"
                 "compress=%s\ndevice=%s\nprecision=%d\n"
                 "steps_per_epoch=%" PRIu64 "\npeers=%d\n",
                 m->arch, m->width, m->cifar_stem, m->zero_init_residual,
                 m->num_classes, m->in_channels, m->image_size, m->seed,
                 t->info.name, fp, c->augment, c->batch, c->accumulate,
                 c->lr.base_lr, lr_kind_name(c->lr.kind), c->lr.warmup_epochs,
                 (double)c->sgd.momentum, (double)c->sgd.weight_decay,
                 c->sgd.nesterov, (double)c->label_smoothing,
                 miles[0] ? miles : "none",
                 c->on_bad == MESH_DATA_BAD_SKIP ? "skip" : "fail", comp,
                 c->device, c->precision, t->steps_per_epoch, t->size);
    /* sparse only, so that the dense runs' digests (and checkpoints) stay
     * what they were */
    if (n > 0 && c->sparse.kind != MESH_SPARSE_NONE)
        n += snprintf(t->config + n, sizeof(t->config) - (size_t)n,
                      "error_feedback=%d\n", !c->no_error_feedback);
    if (n < 0 || (size_t)n >= sizeof(t->config))
        return mesh_err(-EINVAL, "configuration too long");
    i = train_finetune_config(t, t->config + n, sizeof(t->config) - (size_t)n,
                              1);
    if (i < 0)
        return i;
    n += i;
    core = (size_t)n;
    t->config_core = core;
    if (mesh_ckpt_sha256(t->config, core, t->config_digest) < 0)
        return -EIO;
    n += snprintf(t->config + n, sizeof(t->config) - (size_t)n,
                  "total_steps=%" PRIu64 "\nlr_total_epochs=%.17g\n"
                  "algo=%s\nbucket_mb=%.9g\nchunk_mb=%.9g\n"
                  "threads=%d\n"
                  "verify_every=%" PRIu64 "\neval=%d\neval_every=%.9g\n"
                  "checkpoint_every=%" PRIu64 "\nresume=%d\n"
                  "elastic=%d\nmin_peers=%d\nelastic_lr=%d\n"
                  "keep_global_batch=%d\n",
                  t->total_steps, t->lr.total_epochs, mesh_algo_name(c->algo),
                  c->bucket_mb, c->chunk_mb, threads, c->verify_every,
                  !c->no_eval, c->no_eval ? 0.0 : c->eval_every,
                  c->checkpoint_every, c->resume, c->elastic,
                  c->elastic ? c->min_peers : 0, c->elastic && c->elastic_lr,
                  c->elastic && c->keep_global_batch);
    if ((size_t)n >= sizeof(t->config) - 200)
        return mesh_err(-EINVAL, "configuration too long");
    i = train_finetune_config(t, t->config + n, sizeof(t->config) - (size_t)n,
                              0);
    return i < 0 ? i : 0;
}

/*
 * --simulate-compute: no data set and no model, only the layer list with
 * the gradient slab divided by --simulate-scale (train/simulate.h).
 */
static int open_sim(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    char gpus[32] = "";
    double fwd, bwd;
    int rc;

    rc = mesh_sim_create(&c->model, c->simulate, c->batch, c->simulate_scale,
                         &t->sim);
    if (rc < 0)
        return rc;
    rc = mesh_sim_set_gpus(t->sim, c->simulate_gpus,
                           (long)t->rank * c->simulate_gpus);
    if (rc < 0)
        return rc;
    t->mcfg = *mesh_sim_config(t->sim);
    mesh_sim_model(t->sim, &t->tm);
    /* the name is in the configuration peers compare: k and G too */
    if (c->simulate_gpus > 1)
        snprintf(gpus, sizeof(gpus), ":gpus=%d", c->simulate_gpus);
    snprintf(t->sim_name, sizeof(t->sim_name), "simulate:%s:k=%.9g%s",
             c->simulate, c->simulate_scale, gpus);
    t->info.name = t->sim_name;
    t->info.classes = t->mcfg.num_classes;
    t->info.channels = t->mcfg.in_channels;
    t->info.size = t->mcfg.image_size;
    t->steps_per_epoch = UINT64_C(1) << 30;
    t->total_steps = c->iters ? c->iters : 20;
    t->lr = c->lr;
    t->nparams = mesh_sim_num_params(t->sim);
    t->host_slabs = 1;
    mesh_sim_step_time(t->sim, &fwd, &bwd);
    if (t->rank == 0 && !c->quiet)
        printf("meshtrain: simulated %s compute (%s): forward %.2f ms, "
               "backward %.2f ms per step; %zu parameters, %zu on the wire "
               "(k = %g); %d peer(s) x %d GPU(s) x batch %d\n",
               t->mcfg.arch, c->simulate, fwd * 1000, bwd * 1000,
               mesh_sim_real_params(t->sim), t->nparams, c->simulate_scale,
               t->size, c->simulate_gpus, c->batch);
    return 0;
}

/* The run's length in steps (--iters, or --epochs) and the learning rate
 * schedule over it (step's default milestones: epochs 30, 60, 80). */
static void plan_length(struct trainer *t)
{
    const struct train_cfg *c = t->c;

    t->total_steps =
        c->iters ? c->iters
                 : (uint64_t)ceil(c->epochs * (double)t->steps_per_epoch);
    if (t->total_steps == 0)
        t->total_steps = 1;
    t->lr = c->lr;
    t->lr.total_epochs =
        c->iters ? (double)t->total_steps / (double)t->steps_per_epoch
                 : c->epochs;
    if (t->lr.kind == MESH_NN_LR_STEP && t->lr.num_milestones == 0) {
        t->lr.milestones[0] = 30;
        t->lr.milestones[1] = 60;
        t->lr.milestones[2] = 80;
        t->lr.num_milestones = 3;
    }
}

/* The data set, the model's input shape from it, and the loaders. */
static int open_data(struct trainer *t, const struct mesh_opts *mo)
{
    const struct train_cfg *c = t->c;
    struct mesh_data_opts dopts;
    struct mesh_loader_opts lo;
    int rc;

    memset(&dopts, 0, sizeof(dopts));
    dopts.spec = c->data;
    dopts.channels = c->model.in_channels;
    dopts.size = c->model.image_size;
    dopts.classes = c->model.num_classes;
    dopts.seed = c->model.seed;
    dopts.on_bad = c->on_bad;
    rc = mesh_data_open(&dopts, &t->ds);
    if (rc < 0)
        return rc;
    mesh_data_get_info(t->ds, &t->info);
    if (c->model.num_classes && c->model.num_classes < t->info.classes)
        return mesh_err(-EINVAL,
                        "--num-classes %d: the data set has %d "
                        "classes",
                        c->model.num_classes, t->info.classes);
    t->mcfg = c->model;
    t->mcfg.in_channels = t->info.channels;
    t->mcfg.image_size = t->info.size;
    if (!t->mcfg.num_classes)
        t->mcfg.num_classes = t->info.classes;

    memset(&lo, 0, sizeof(lo));
    lo.split = MESH_DATA_TRAIN;
    lo.batch = c->batch;
    lo.rank = mo->world.rank;
    lo.world = mo->world.size;
    lo.threads = c->data_threads;
    lo.augment = c->augment;
    lo.accumulate = c->accumulate;
    if (c->eval_only && t->info.train_count < (size_t)c->batch *
                                                  (size_t)c->accumulate *
                                                  (size_t)mo->world.size) {
        /* no step is taken: a training split too small for one is fine */
        t->steps_per_epoch = 1;
        plan_length(t);
        goto eval;
    }
    rc = mesh_loader_create(t->ds, &lo, &t->train_ld);
    if (rc < 0)
        return rc;
    t->micro_per_epoch = mesh_loader_steps_per_epoch(t->train_ld);
    t->steps_per_epoch = t->micro_per_epoch / (uint64_t)c->accumulate;
    if (t->steps_per_epoch == 0)
        return mesh_err(-EINVAL,
                        "--data %s: %zu training samples are fewer "
                        "than one step (batch %d x accumulate %d x %d "
                        "peers)",
                        c->data, t->info.train_count, c->batch, c->accumulate,
                        mo->world.size);
    plan_length(t);
eval:
    if (t->info.eval_count > 0 && !c->no_eval) {
        lo.split = MESH_DATA_EVAL;
        lo.augment = 0;
        lo.accumulate = 0;
        rc = mesh_loader_create(t->ds, &lo, &t->eval_ld);
    }
    return rc;
}

/* The compute's context (t->ctx), once. */
static int open_ctx(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    struct mesh_nn_dev_opts dev;

    if (t->ctx)
        return 0;
    mesh_nn_dev_opts_init(&dev);
    dev.threads = c->threads > 0 ? c->threads : t->ncpus;
    dev.gpu = c->gpu;
    dev.precision = c->precision;
    return mesh_nn_ctx_open_opts(c->device, &dev, &t->ctx);
}

/*
 * --elastic on the cpu backend: the first step builds the compute's
 * kernels (oneDNN's primitives, their JIT code), 0.2-1 s on a loaded
 * machine against a step of milliseconds. A peer that joins a running job
 * would build them in its first step after its admission, while every
 * member waits for it in that step's all-reduce. So every --elastic start
 * builds them before its first step (setup): a peer that starts the job
 * right after it asked whether a job runs; a joiner once its model is
 * built, while its catch-up receives the snapshot and replays steps into
 * that model, holding its join until both are done (this came before the
 * question once, which put the whole warm-up into the join time, 4 s of
 * ResNet-50's at a load of 10). One training forward, loss and backward
 * of zeros on a model of its own, thrown away.
 * The primitives stay in oneDNN's cache, where the real model's first
 * step finds them; nothing of the real model, its state or the data is
 * touched. A peer of a job that starts together only moves that time
 * from its first step to before it; a failure only loses the head start.
 */
static void warm_up(struct trainer *t)
{
    struct mesh_nn_model_cfg mc = t->mcfg;
    struct mesh_nn_model *m = NULL;
    int n = t->c->batch, rc;
    size_t px =
        (size_t)mc.in_channels * (size_t)mc.image_size * (size_t)mc.image_size;
    float *x, loss;
    int32_t *y;
    double t0 = mesh_now_s();

    if (!t->c->elastic || t->sim || t->c->simulate ||
        strcmp(t->c->device, "cpu") != 0 || t->c->eval_only)
        return;
    x = calloc((size_t)n * px, sizeof(float));
    y = calloc((size_t)n, sizeof(int32_t));
    mc.no_init = 1;
    rc = x && y ? open_ctx(t) : -ENOMEM;
    if (rc == 0)
        rc = mesh_nn_model_create(t->ctx, &mc, &m);
    if (rc == 0)
        rc = mesh_nn_model_forward(m, n, x, 1);
    if (rc == 0)
        rc = mesh_nn_model_loss(m, y, 0.0f, &loss);
    if (rc == 0)
        rc = mesh_nn_model_backward(m, 0, NULL, NULL);
    if (rc < 0)
        mesh_info("--elastic: no warm-up of the compute: %s", mesh_err_msg(rc));
    else
        mesh_info("--elastic: the compute's kernels built in %.3f s",
                  mesh_now_s() - t0);
    mesh_nn_model_destroy(m);
    free(x);
    free(y);
}

/*
 * A joiner builds its kernels on a thread of its own, beside the rest of
 * its start: its catch-up (holding its join until both are done, as
 * before: train_catchup_ready), or, where the catch-up failed or gave up
 * (one sender on a link its ring shares), the view change that admits it
 * as soon as its model is built and sends it the whole state, about N /
 * (its link's rate): 0.6 to 1.9 s of kernels at a load of 5 to 10
 * came before that admission, not beside its transfer (bench/join.sh,
 * 8 December 2026). warm_join waits for the thread before anything else
 * runs on the device: the restore after the transfer, the first step.
 */
static void *warm_main(void *arg)
{
    struct trainer *t = arg;

    warm_up(t);
    /* (read once the thread is joined: join_report) */
    t->join_mark[TRAIN_JM_MODEL] = mesh_now_s();
    pthread_mutex_lock(&t->warm_mu);
    if (t->cu)
        train_catchup_ready(t);
    pthread_mutex_unlock(&t->warm_mu);
    return NULL;
}

/* Start it (inline where no thread can be made). */
static void warm_start(struct trainer *t)
{
    int rc = -pthread_create(&t->warm_th, NULL, warm_main, t);

    if (rc == 0) {
        t->warm_on = 1;
        return;
    }
    mesh_info("--elastic: the kernels are built before the join "
              "(pthread_create: %s)",
              strerror(-rc));
    (void)warm_main(t);
}

static void warm_join(struct trainer *t)
{
    if (!t->warm_on)
        return;
    pthread_join(t->warm_th, NULL);
    t->warm_on = 0;
}

/*
 * --batch 1 where the last stage is 1 x 1 (a small --image-size): its batch
 * norms see one value a channel in training, output their beta whatever
 * the input, and the network's output does not depend on the image.
 * PyTorch refuses to train this ("Expected more than 1 value per channel");
 * here a warning says it (rank 0), unless --freeze may hold those BNs on
 * their running statistics.
 */
static void degenerate_warn(const struct trainer *t, int rank)
{
    int k, side = t->mcfg.image_size;

    for (k = t->mcfg.cifar_stem ? 3 : 5; k > 0; k--)
        side = (side - 1) / 2 + 1;
    if (rank == 0 && !t->c->eval_only && !t->c->freeze && t->c->batch == 1 &&
        side == 1)
        mesh_warn("--batch 1 at --image-size %d: the last stage is 1 x 1, "
                  "so its batch norms see one value per channel in training "
                  "and the output does not depend on the input (PyTorch "
                  "refuses this); take --batch 2 or more, or a larger image",
                  t->mcfg.image_size);
}

static int open_model(struct trainer *t, const struct mesh_opts *mo)
{
    const struct train_cfg *c = t->c;
    int rc;

    if (t->sim)
        return 0;

    rc = open_ctx(t);
    if (rc == 0) {
        struct mesh_nn_model_cfg mc = t->mcfg;

        mc.no_init = t->joiner; /* it receives the state (train/xfer.c) */
        rc = mesh_nn_model_create(t->ctx, &mc, &t->model);
    }
    if (rc == 0) {
        t->nparams = mesh_nn_model_num_params(t->model);
        rc = train_init_apply(t);
    }
    if (rc == 0)
        rc = train_freeze_apply(t);
    if (rc == 0)
        rc = mesh_nn_sgd_create(t->model, &c->sgd, &t->sgd);
    if (rc < 0)
        return rc;
    t->mcfg = *mesh_nn_model_config(t->model);
    degenerate_warn(t, mo->world.rank);
    mesh_train_model_nn(t->model, &t->tm);
    t->nparams = mesh_nn_model_num_params(t->model);
    t->nbuffers = mesh_nn_model_num_buffers(t->model);
    t->host_slabs = strcmp(c->device, "cpu") == 0;
    /* --elastic may redo a step after a view change: its loss is read at
     * once there */
    t->loss_lag = !t->host_slabs && !c->elastic;
    if (c->profile_layers && mo->world.rank == 0) {
        rc = mesh_sim_prof_create(&t->mcfg, c->batch, &t->prof);
        if (rc < 0)
            return rc;
    }
    if (!t->host_slabs) {
        t->hparams = malloc(t->nparams * 4);
        t->hmom = malloc(t->nparams * 4);
        t->hbuf = malloc(t->nbuffers * 4 + 4);
        if (!t->hparams || !t->hmom || !t->hbuf)
            return mesh_err(-ENOMEM, "out of memory for host slabs");
    }
    if (mo->world.rank == 0 && !c->quiet)
        printf("meshtrain: %s width %d, %zu parameters, %s; data %s (%zu "
               "train, %zu eval, %d x %d x %d, %d classes); %d peer(s) x "
               "batch %d x accumulate %d\n",
               t->mcfg.arch, t->mcfg.width, t->nparams,
               mesh_nn_ctx_describe(t->ctx), t->info.name, t->info.train_count,
               t->info.eval_count, t->info.channels, t->info.size, t->info.size,
               t->info.classes, mo->world.size, c->batch, c->accumulate);
    return 0;
}

/* ---- output paths, checked before step 1 ------------------------------- */

/*
 * Can files be created in directory dir? A probe file is created and
 * removed: this catches a missing directory, a read-only file system and
 * missing permissions alike, which access(2) does not for root.
 */
static int dir_check(const char *flag, const char *path, const char *dir)
{
    char probe[PATH_MAX];
    struct stat st;
    int fd, n;

    if (stat(dir, &st) < 0)
        return mesh_err_errno("%s %s: directory %s", flag, path, dir);
    if (!S_ISDIR(st.st_mode))
        return mesh_err(-ENOTDIR, "%s %s: %s is not a directory", flag, path,
                        dir);
    n = snprintf(probe, sizeof(probe), "%s/.meshtrain-probe.%ld", dir,
                 (long)getpid());
    if (n < 0 || (size_t)n >= sizeof(probe))
        return mesh_err(-ENAMETOOLONG, "%s %s: path too long", flag, path);
    fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return mesh_err_errno("%s %s: cannot create files in %s", flag, path,
                              dir);
    close(fd);
    unlink(probe);
    return 0;
}

/*
 * An output file written at the end (or replaced by a rename from its
 * directory, as --save is): its directory must take new files, and an
 * existing file must be a writable file, not a directory. Devices and
 * pipes (/dev/null, /dev/stdout) are taken as they are.
 */
static int output_check(const char *flag, const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    struct stat st;
    int fd;

    if (!*path)
        return mesh_err(-EINVAL, "%s: empty path", flag);
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return mesh_err(-EISDIR, "%s %s: is a directory", flag, path);
        if (!S_ISREG(st.st_mode))
            return 0;
        fd = open(path, O_WRONLY | O_CLOEXEC); /* no O_TRUNC: untouched */
        if (fd < 0)
            return mesh_err_errno("%s %s", flag, path);
        close(fd);
    } else if (errno != ENOENT) {
        return mesh_err_errno("%s %s", flag, path);
    }
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else if ((size_t)(slash - path) < sizeof(dir))
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    else
        return mesh_err(-ENAMETOOLONG, "%s %s: path too long", flag, path);
    return dir_check(flag, path, dir);
}

/*
 * Before step 1 (after joining, so that a failure here aborts the job
 * naming this rank): every file this rank will write, so that a bad path
 * fails now instead of after the whole run. Rank 0 writes --save,
 * --metrics, --timeline and --profile-layers; every rank makes its
 * checkpoint directory DIR/rank-R.
 */
static int outputs_check(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    char dir[1024];
    struct stat st;
    int rc = 0;

    if (t->rank == 0) {
        if (c->save && !c->simulate)
            rc = output_check("--save", c->save);
        if (rc == 0 && c->metrics)
            rc = output_check("--metrics", c->metrics);
        if (rc == 0 && c->timeline)
            rc = output_check("--timeline", c->timeline);
        if (rc == 0 && c->profile_layers)
            rc = output_check("--profile-layers", c->profile_layers);
        if (rc < 0)
            return rc;
    }
    if (!c->checkpoint_every || !c->checkpoint_dir)
        return 0;
    rc = train_ckpt_dir(t, dir, sizeof(dir));
    if (rc < 0)
        return rc;
    if (mkdir(dir, 0777) < 0 && errno != EEXIST)
        return mesh_err_errno("--checkpoint-dir %s: cannot create %s",
                              c->checkpoint_dir, dir);
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return mesh_err(-ENOTDIR, "--checkpoint-dir %s: %s is not a directory",
                        c->checkpoint_dir, dir);
    return dir_check("--checkpoint-dir", c->checkpoint_dir, dir);
}

/*
 * An error's exit code: after joining, a collective failure is a peer's.
 * A local one (MESH_EXIT_USAGE: this rank's data, files, device or
 * flags) aborts the job naming this rank, so that its peers stop at once
 * and blame it, instead of seeing only that it left; unless every peer
 * reached the same error (agreed_err), when an abort would only race
 * with the others' last collective.
 */
static int fail(struct trainer *t, int code, int rc)
{
    const char *msg = mesh_err_msg(rc);

    fprintf(stderr, "meshtrain: rank %d: %s\n", t->rank, msg);
    if (code == MESH_EXIT_USAGE && t->mesh && !t->agreed_err)
        mesh_ops(t->mesh)->abort(mesh_transport(t->mesh), t->rank, msg);
    return code;
}

/* nn's grad-ready callback: everything from offset to the end is final. */
static int on_grad_ready(void *arg, size_t offset, size_t count)
{
    struct trainer *t = arg;

    (void)count;
    int rc;

    if (t->prof)
        mesh_sim_prof_grad(t->prof, offset);
    rc = mesh_gradsync_ready(t->gs, offset);
    train_fault(t, TRAIN_FAULT_ALLREDUCE);
    return rc;
}

/* The gradient buckets of the model, or of the simulation. */
static int gradsync_open(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    struct mesh_sparse_cfg sp = c->sparse;
    struct mesh_gradsync_opts o = {
        .coll = t->coll,
        .ctx = t->ctx,
        .host_slabs = t->host_slabs,
        .nparams = t->nparams,
        .bucket_mb = c->bucket_mb,
        .chunk_mb = c->chunk_mb,
        .wire = c->compress == TRAIN_COMPRESS_FP16   ? MESH_DT_F16
                : c->compress == TRAIN_COMPRESS_BF16 ? MESH_DT_BF16
                                                     : MESH_DT_F32,
        .sparse = c->sparse.kind ? &sp : NULL,
        .rank = t->rank,
        .size = t->size,
        .algo = c->algo,
        .grad_scale = t->gscale,
        .scale = t->sim ? c->simulate_scale : 1,
        .t0 = t->t0,
        .event = tl_push,
        .event_arg = t,
    };

    /* the pairs' values as the dense wire would carry them */
    sp.wire = o.wire;
    sp.error_feedback = !c->no_error_feedback;
    return mesh_gradsync_create(&o, &t->tm, &t->gs);
}

/*
 * The step's mean loss is known after the last forward: its average over
 * the peers starts then, so that the engine runs it while backward computes
 * (it queues before the gradient buckets, the same order on every peer),
 * instead of a latency-bound all-reduce after them on the critical path.
 */
static int loss_start(struct trainer *t, float mean)
{
    t->loss_avg = mean;
    if (!t->coll)
        return 0;
    return mesh_coll_allreduce_start(t->coll, &t->loss_avg, &t->loss_avg, 1,
                                     MESH_DT_F32, MESH_REDOP_AVG, t->c->algo,
                                     &t->loss_req);
}

/* Wait for the loss average (also on error paths: the request is freed). */
static int loss_wait(struct trainer *t, int rc)
{
    int rc2 = 0;

    if (t->loss_req)
        rc2 = mesh_coll_wait(t->loss_req);
    t->loss_req = NULL;
    return rc < 0 ? rc : rc2;
}

/*
 * The next micro-batch from the loader, its wait added to *data; the
 * simulation has no loader (and no data): an empty batch.
 */
static int batch_next(struct trainer *t, struct mesh_batch *batch, double *data)
{
    double ts = now_s(t);
    int rc;

    if (!t->train_ld) {
        memset(batch, 0, sizeof(*batch));
        return 0;
    }
    rc = mesh_data_next(t->train_ld, batch);
    if (rc > 0)
        rc = mesh_err(-EIO, "training loader ended");
    if (rc < 0)
        return train_local(t, mesh_err_prefix(rc, "data"));
    *data += now_s(t) - ts;
    tl_add(t, "data wait", 2, ts, now_s(t) - ts);
    return 0;
}

/*
 * Micro-batch k of the step: data, forward, loss, backward. The last one
 * starts the loss average (*loss_sum / K) after its forward and reports
 * its gradients to the buckets during its backward. With t->loss_lag the
 * loss is queued, not added: *loss_sum holds the previous step's sum.
 */
static int micro_batch(struct trainer *t, int k, float *loss_sum, double *data,
                       double *t_bwd_end)
{
    const struct mesh_train_model *m = &t->tm;
    const struct train_cfg *c = t->c;
    int last = k == t->accum - 1, rc;
    struct mesh_batch batch;
    float loss;
    double ts;

    rc = batch_next(t, &batch, data);
    if (rc < 0)
        return rc;
    ts = now_s(t);
    rc = m->ops->forward(m->m, batch.n, batch.x, 1);
    if (rc == 0 && t->loss_lag)
        rc = mesh_nn_model_loss_start(t->model, batch.y, c->label_smoothing);
    else if (rc == 0)
        rc = m->ops->loss(m->m, batch.y, c->label_smoothing, &loss);
    if (rc < 0)
        return train_local(t, rc);
    tl_add(t, "forward", 0, ts, now_s(t) - ts);
    if (t->prof && last)
        mesh_sim_prof_forward(t->prof, now_s(t) - ts);
    if (!t->loss_lag)
        *loss_sum += loss;
    if (last && (rc = loss_start(t, *loss_sum * t->gscale)) < 0)
        return loss_wait(t, rc);
    ts = now_s(t);
    if (t->prof && last)
        mesh_sim_prof_backward_begin(t->prof);
    rc = m->ops->backward(m->m, k > 0, last ? on_grad_ready : NULL, t);
    if (rc < 0)
        return loss_wait(t, mesh_gradsync_abort(t->gs, rc));
    if (t->prof && last)
        mesh_sim_prof_backward_end(t->prof);
    *t_bwd_end = now_s(t);
    tl_add(t, "backward", 0, ts, *t_bwd_end - ts);
    return 0;
}

/*
 * The learning rate of step (0-based): the schedule's, times the view's
 * share of the job's peers with --elastic-lr (the linear scaling rule for
 * the smaller global batch).
 */
static double step_lr(const struct trainer *t, uint64_t step)
{
    double lr =
        mesh_nn_lr_at(&t->lr, (double)step / (double)t->steps_per_epoch);

    if (t->el && t->c->elastic_lr && !t->c->keep_global_batch)
        lr *= (double)t->size / (double)t->size0;
    return lr;
}

static void pending_flush(struct trainer *t);

/*
 * With t->loss_lag: the sum of the previous step's queued losses (in
 * micro-batch order, as micro_batch adds them); *valid = 0 and a sum of 0
 * when none is queued (the run's first step).
 */
static int loss_prev(struct trainer *t, float *sum, int *valid)
{
    int k, rc;
    float l;

    *sum = 0;
    *valid = mesh_nn_model_loss_pending(t->model) >= t->accum;
    for (k = 0; *valid && k < t->accum; k++) {
        rc = mesh_nn_model_loss_read(t->model, &l);
        if (rc < 0)
            return train_local(t, rc);
        *sum += l;
    }
    return 0;
}

static int sgd_update(struct trainer *t, double lr);

/*
 * One optimizer step; *loss is the mean over the peers' micro-batches: of
 * this step, or with t->loss_lag of the previous one (*valid = 0 on the
 * run's first step, which has none).
 */
static int train_step(struct trainer *t, struct window *w, float *loss_out,
                      int *valid)
{
    const struct train_cfg *c = t->c;
    double t_begin = now_s(t), t_bwd_end = 0, data = 0, t_comm_end, lr, ts;
    float loss_sum = 0;
    int k, rc;

    *valid = 1;
    if (t->loss_lag && (rc = loss_prev(t, &loss_sum, valid)) < 0)
        return rc;
    mesh_gradsync_begin(t->gs);
    if (t->sim)
        mesh_sim_step_begin(t->sim);
    for (k = 0; k < t->accum; k++) {
        rc = micro_batch(t, k, &loss_sum, &data, &t_bwd_end);
        if (rc < 0)
            return rc;
    }
    rc = loss_wait(t, mesh_gradsync_finish(t->gs));
    if (rc < 0)
        return rc;
    if (t->el)
        pending_flush(t); /* every peer has applied the previous step */
    t_comm_end = now_s(t);
    lr = step_lr(t, t->step);
    ts = now_s(t);
    /* a joiner catching up replays this step (train/catchup.c) */
    train_serve_grad(t, t->step, (float)lr);
    rc = t->sim ? 0 : sgd_update(t, lr);
    if (rc < 0)
        return train_local(t, rc);
    train_serve_updated(t, t->step);
    tl_add(t, "optimizer", 0, ts, now_s(t) - ts);
    w->t_comm += t_comm_end - t_bwd_end;
    w->t_data += data;
    w->t_step += now_s(t) - t_begin;
    w->t_compute += (now_s(t) - t_begin) - data - (t_comm_end - t_bwd_end);
    w->steps++;
    w->images += (uint64_t)c->batch * (uint64_t)t->slots *
                 (uint64_t)(t->sim ? c->simulate_gpus : 1);
    *loss_out = t->loss_avg;
    if (t->sim)
        mesh_sim_step_end(t->sim);
    return 0;
}

/*
 * Write what a committed step left: its metrics line and (a test aid) the
 * data positions it trained on. With --elastic both wait until a later
 * step's all-reduce (or the end of the run) proves that every peer has
 * applied the step, so that a step redone after a view change is written
 * once.
 */
static void pending_flush(struct trainer *t)
{
    if (t->pending[0] && t->metrics) {
        fputs(t->pending, t->metrics);
        fflush(t->metrics);
    }
    if (t->el && t->pending[0]) {
        memcpy(t->kept, t->pending, sizeof(t->kept));
        t->kept_step = t->pending_step;
    }
    t->pending[0] = '\0';
}

/* The last step record in the metrics file (0: none, or unreadable). */
static uint64_t metrics_last_step(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    uint64_t last = 0, s;
    long size;

    if (!f)
        return 0;
    /* the tail holds the last records */
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 65536)
        (void)fseek(f, size - 65536, SEEK_SET);
    else
        rewind(f);
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "{\"step\": %" SCNu64 ",", &s) == 1 && s > last)
            last = s;
    fclose(f);
    return last;
}

/*
 * --elastic, on a peer this view made rank 0: the records of steps up to
 * restart (which every peer applied) that its predecessor may not have
 * written: it writes a step's record once the next step's all-reduce
 * completes on it, and may die after its contribution and before its
 * write, while the others dropped their copy. What the file already
 * holds is not written again (on another host the file is another one).
 */
static void metrics_take_over(struct trainer *t, uint64_t restart)
{
    uint64_t last = metrics_last_step(t->c->metrics);

    if (t->kept[0] && t->kept_step > last && t->kept_step <= restart) {
        fputs(t->kept, t->metrics);
        last = t->kept_step;
    }
    if (t->pending[0] && t->pending_step > last && t->pending_step <= restart)
        fputs(t->pending, t->metrics);
    fflush(t->metrics);
    t->pending[0] = '\0';
}

/*
 * --elastic: ", \"wall\": S", the Unix time of the record (when the step
 * finished here), which bench/chaos.sh compares with its faults' times.
 */
static const char *wall_field(struct trainer *t)
{
    struct timespec ts;

    if (!t->el || clock_gettime(CLOCK_REALTIME, &ts) < 0)
        return "";
    snprintf(t->wall, sizeof(t->wall), ", \"wall\": %.3f",
             (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
    return t->wall;
}

/* --elastic: ", \"t_snapshot\": S", the step's snapshot (in t_step). */
static const char *snap_field(struct trainer *t, const struct window *one)
{
    if (!t->el)
        return "";
    snprintf(t->snap_field, sizeof(t->snap_field), ", \"t_snapshot\": %.6f",
             one->t_snap);
    return t->snap_field;
}

static void metrics_line(struct trainer *t, uint64_t step, float loss,
                         double lr, const struct window *one)
{
    if (!t->metrics && !t->el)
        return;
    snprintf(t->pending, sizeof(t->pending),
             "{\"step\": %" PRIu64 ", \"epoch\": %.6f, \"loss\": %.9g, "
             "\"lr\": %.9g, \"images_per_s\": %.3f, \"t_step\": %.6f, "
             "\"t_compute\": %.6f, \"t_comm_exposed\": %.6f, "
             "\"t_data\": %.6f, \"peers\": %d, \"batch\": %d, "
             "\"accumulate\": %d%s%s}\n",
             step, (double)step / (double)t->steps_per_epoch, (double)loss, lr,
             one->t_step > 0 ? (double)one->images / one->t_step : 0.0,
             one->t_step, one->t_compute, one->t_comm, one->t_data, t->size,
             t->c->batch, t->accum, snap_field(t, one), wall_field(t));
    t->pending_step = step;
    if (!t->el)
        pending_flush(t);
}

static void window_add(struct window *w, const struct window *one)
{
    w->t_step += one->t_step;
    w->t_compute += one->t_compute;
    w->t_comm += one->t_comm;
    w->t_data += one->t_data;
    w->t_snap += one->t_snap;
    w->steps += one->steps;
    w->images += one->images;
}

/* Steps between evaluations (--eval-every epochs), 0: at the end only. */
static uint64_t eval_interval(const struct trainer *t)
{
    uint64_t n;

    if (!t->eval_ld || t->c->eval_every <= 0)
        return 0;
    n = (uint64_t)llround(t->c->eval_every * (double)t->steps_per_epoch);
    return n == 0 ? 1 : n;
}

/* After `done` steps: the digest check, evaluation and checkpoint due. */
static int after_step(struct trainer *t, uint64_t done, uint64_t eval_every)
{
    const struct train_cfg *c = t->c;
    double top1, top5;
    int rc;

    if (c->verify_every && done % c->verify_every == 0) {
        char when[64];

        snprintf(when, sizeof(when), "after step %" PRIu64, done);
        rc = verify_weights(t, when, NULL);
        if (rc < 0)
            return rc;
    }
    if (eval_every && done % eval_every == 0 && done != t->total_steps) {
        rc = train_bn_keep(t);
        if (rc == 0)
            rc = evaluate(t, &top1, &top5);
        if (rc == 0)
            rc = train_bn_restore(t);
        if (rc < 0)
            return rc;
        if (t->rank == 0 && !c->quiet)
            printf("%seval after step %" PRIu64 " (epoch %.2f): top-1 "
                   "%.2f %% top-5 %.2f %%\n",
                   t->tty ? "\r\033[K" : "", done,
                   (double)done / (double)t->steps_per_epoch, top1, top5);
    }
    if (c->checkpoint_every && c->checkpoint_dir &&
        done % c->checkpoint_every == 0)
        return train_ckpt_write(t, done);
    return 0;
}

/*
 * --elastic, test aid: MESHTRAIN_TEST_SAMPLES=PREFIX makes each peer write
 * PREFIX.SLOT with one line "view step epoch position count" per
 * micro-batch of each step it starts (positions in the epoch's
 * permutation), before its gradients can reach anyone: a step that was
 * not applied everywhere is redone in a later view, whose lines then
 * count; tests/train_elastic_count.py counts them.
 */
static void samples_note(struct trainer *t, uint64_t step)
{
    if (!t->samples)
        return;
    for (int j = 0; j < t->accum; j++) {
        uint64_t pos =
            t->d_pos + ((uint64_t)t->rank + (uint64_t)j * (uint64_t)t->size) *
                           (uint64_t)t->c->batch;

        fprintf(t->samples,
                "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %d\n",
                t->view_epoch, step, t->d_epoch, pos, t->c->batch);
    }
    fflush(t->samples);
}

/* The data position after a step: the next step's, or the next epoch's
 * start when no whole step is left (as the loader does). */
static void data_advance(struct trainer *t)
{
    uint64_t g = (uint64_t)t->slots * (uint64_t)t->c->batch;

    t->d_pos += g;
    if (t->train_ld && t->d_pos + g > t->info.train_count) {
        t->d_epoch++;
        t->d_pos = 0;
    }
}

/* ---- --elastic: snapshots and view changes --------------------------------
 */

static int snap_copy(struct trainer *t, float *dst, float *dev, size_t n,
                     int to_dev)
{
    if (t->host_slabs) {
        if (to_dev)
            memcpy(dev, dst, n * 4);
        else
            memcpy(dst, dev, n * 4);
        return 0;
    }
    return to_dev ? mesh_nn_upload(t->ctx, dev, dst, n * 4)
                  : mesh_nn_download(t->ctx, dst, dev, n * 4);
}

/* Copy the live weights and momentum to or from snapshot sn. */
static int snap_state(struct trainer *t, struct train_snap *sn, int to_dev)
{
    float *mom = mesh_nn_sgd_momentum(t->sgd);
    int rc = snap_copy(t, sn->params, mesh_nn_model_params(t->model),
                       t->nparams, to_dev);

    if (rc == 0)
        rc = snap_copy(t, sn->mom, mom, t->nparams, to_dev);
    return rc;
}

/*
 * The state before step (weights, momentum, BN statistics, the data
 * position), in slot step % 2: the slot of step - 1 stays, the one a
 * view change may roll back to (doc/elastic.md). With host slabs the
 * weights and momentum are not copied here: they are the live ones until
 * the step's update, which writes what it overwrites into the slot in its
 * own pass (mesh_nn_sgd_step_keep; sn->lazy until then), so that elastic
 * mode adds no pass over the model. The first snapshot of a slot copies
 * them all (the update leaves frozen tensors alone).
 */
static int snap_take(struct trainer *t, uint64_t step)
{
    struct train_snap *sn = &t->snap[step & 1];
    int rc = 0;

    train_whash_snap(t, step); /* (the slot is written) */
    sn->valid = 0;
    sn->lazy = 0;
    if (!t->sim) {
        int fresh = !sn->params;

        if (fresh) {
            sn->params = malloc(t->nparams * 4);
            sn->mom = calloc(t->nparams, 4);
            sn->buf = malloc(t->nbuffers * 4 + 4);
            if (!sn->params || !sn->mom || !sn->buf)
                return train_local(t, mesh_err(-ENOMEM, "--elastic: out of "
                                                        "memory for the "
                                                        "snapshots"));
        }
        if (t->host_slabs && !fresh)
            sn->lazy = 1;
        else
            rc = snap_state(t, sn, 0);
        if (rc == 0 && t->nbuffers)
            rc = snap_copy(t, sn->buf, mesh_nn_model_buffers(t->model),
                           t->nbuffers, 0);
        if (rc < 0)
            return train_local(t, rc);
    }
    if (t->gs && mesh_gradsync_residual(t->gs)) {
        if (!sn->residual)
            sn->residual = malloc(t->nparams * 4);
        if (!sn->residual)
            return train_local(t, mesh_err(-ENOMEM, "--elastic: out of "
                                                    "memory for the "
                                                    "snapshots"));
        memcpy(sn->residual, mesh_gradsync_residual(t->gs), t->nparams * 4);
    }
    sn->step = step;
    sn->d_epoch = t->d_epoch;
    sn->d_pos = t->d_pos;
    sn->valid = 1;
    return 0;
}

/*
 * Step's update; with --elastic and a lazy snapshot of the step, the
 * update keeps the weights and momentum it overwrites in it.
 */
static int sgd_update(struct trainer *t, double lr)
{
    struct train_snap *sn = &t->snap[t->step & 1];
    int rc;

    if (!t->el)
        return mesh_nn_sgd_step(t->sgd, (float)lr);
    train_whash_hold(t); /* (its thread may read the live state) */
    if (!sn->lazy || !sn->valid || sn->step != t->step) {
        rc = mesh_nn_sgd_step(t->sgd, (float)lr);
    } else {
        rc = mesh_nn_sgd_step_keep(t->sgd, (float)lr, sn->params, sn->mom);
        sn->lazy = 0;
        if (rc < 0)
            sn->valid = 0;
    }
    train_whash_updated(t, t->step, rc == 0);
    return rc;
}

/*
 * After a state transfer, on a member: the snapshot's BN statistics (the
 * senders' average) into the model; its weights and momentum are there.
 */
static int snap_restore_buffers(struct trainer *t, uint64_t step)
{
    struct train_snap *sn = &t->snap[step & 1];
    int rc = 0;

    if (t->sim || !t->nbuffers)
        return 0;
    rc = snap_copy(t, sn->buf, mesh_nn_model_buffers(t->model), t->nbuffers, 1);
    if (rc == 0 && t->ctx)
        rc = mesh_nn_sync(t->ctx);
    return rc < 0 ? train_local(t, rc) : 0;
}

/*
 * Roll back to the snapshot of step. A lazy one (with host slabs: the
 * live weights and momentum are step's, its update has not run) stays
 * lazy, as snap_take leaves it: the state transfer's senders read the
 * live state (xfer.c, state_parts), and the step's update fills the
 * slot (mesh_nn_sgd_step_keep). Copied only into a slot that never held
 * a whole copy (fresh: a joiner's, just allocated) when a tensor is
 * frozen, which the update leaves alone.
 */
static int snap_restore(struct trainer *t, uint64_t step, int fresh)
{
    struct train_snap *sn = &t->snap[step & 1], *other = &t->snap[~step & 1];
    int rc = 0;

    if (!sn->valid || sn->step != step)
        return train_local(t, mesh_err(-ENOENT,
                                       "--elastic: no snapshot of step %" PRIu64
                                       " to roll back to",
                                       step));
    if (!t->sim) {
        /* a lazy snapshot is the live state (its update has not run):
         * the live weights and momentum are already those of step */
        int live = sn->lazy, keep;

        keep = live && t->host_slabs &&
               (!fresh || mesh_nn_model_frozen_params(t->model) == 0);
        if (live && !keep)
            rc = snap_state(t, sn, 0);
        sn->lazy = keep;
        /* the other slot's, if lazy, is the state this one replaces */
        if (other->lazy)
            other->valid = other->lazy = 0;
        if (rc == 0 && !live)
            rc = snap_state(t, sn, 1);
        if (rc == 0 && t->nbuffers)
            rc = snap_copy(t, sn->buf, mesh_nn_model_buffers(t->model),
                           t->nbuffers, 1);
        if (rc == 0 && t->ctx)
            rc = mesh_nn_sync(t->ctx);
        if (rc < 0)
            return train_local(t, rc);
        /* the optimizer's step count too (its first step differs): a
         * joiner's is that of the state it received */
        mesh_nn_sgd_set_steps(t->sgd, (int64_t)step);
    }
    t->d_epoch = sn->d_epoch;
    t->d_pos = sn->d_pos;
    return 0;
}

/* Test aid MESHTRAIN_TEST_JOIN_AT: a joiner was admitted; the next one
 * is waited for at the next step listed, if any. */
static void join_at_next(struct trainer *t)
{
    int n = (int)MESH_ARRAY_SIZE(t->join_ats);

    t->join_at = t->join_ats[0];
    memmove(t->join_ats, t->join_ats + 1, (size_t)(n - 1) * sizeof(uint64_t));
    t->join_ats[n - 1] = UINT64_MAX;
}

/* At the start of step: the snapshot, unless a view change has begun. */
static int elastic_boundary(struct trainer *t, uint64_t step)
{
    int rc = mesh_elastic_commit(t->el, step);
    uint64_t joins;
    char list[200];

    if (rc < 0)
        return mesh_err(rc, "the mesh's view is changing");
    /* test aid: a slower job (MESHTRAIN_TEST_STEP_MS=MS at each step's
     * start), so that a joiner's start and catch-up fall inside it;
     * before the snapshot, so that the joins are looked at right after
     * it is served, as in a job without the aid */
    if (t->step_ms > 0)
        usleep((useconds_t)t->step_ms * 1000);
    /* a joiner is admitted as soon as it asks, during a step that can
     * be redone (not the last), unless a test aid waits for joiners at a
     * boundary */
    mesh_elastic_set_eager(t->el, step + 1 < t->total_steps &&
                                      t->join_at == UINT64_MAX &&
                                      t->join_batch <= 1);
    rc = snap_take(t, step);
    if (rc < 0)
        return rc;
    /* a joiner catching up may want this snapshot (train/catchup.c) */
    train_serve_boundary(t, step);
    /* peers started later asked to join: admit them now, from this
     * snapshot (doc/elastic.md, "Joining") */
    joins = mesh_elastic_joins(t->el);
    /* test aid: wait here for joiners (MESHTRAIN_TEST_JOIN_AT=STEP), until
     * MESHTRAIN_TEST_JOINERS of them asked or were refused, or another
     * member admits them; one that is catching up is admitted at once (it
     * cannot while the job waits) */
    for (int i = 0; step == t->join_at && i < 6000 &&
                    __builtin_popcountll(joins | mesh_elastic_refused(t->el)) <
                        t->join_batch;
         i++) {
        if (mesh_elastic_commit(t->el, step) < 0)
            return mesh_err(-ECANCELED, "the mesh's view is changing");
        usleep(10000);
        if (mesh_elastic_held(t->el))
            mesh_elastic_take_held(t->el);
        joins = mesh_elastic_joins(t->el);
    }
    if (joins && t->join_ats[0] == UINT64_MAX)
        t->join_at = UINT64_MAX; /* once (with more waits: at admission) */
    if (joins && __builtin_popcountll(joins) >= t->join_batch)
        return mesh_err(-ECANCELED, "slot(s) %s asked to join",
                        mesh_elastic_slots_str(joins, list, sizeof(list)));
    return 0;
}

/* The step's shape in a view of size peers (struct trainer, slots). */
static void view_shape(struct trainer *t)
{
    const struct train_cfg *c = t->c;

    t->slots = c->keep_global_batch ? t->size0 * c->accumulate
                                    : t->size * c->accumulate;
    t->accum = (t->slots - t->rank + t->size - 1) / t->size;
    t->gscale = (float)t->size / (float)t->slots;
}

static int open_comm(struct trainer *t);
static int gradsync_open(struct trainer *t);
static int run_fail(struct trainer *t, int rc);
static int verify_weights(struct trainer *t, const char *when,
                          const struct train_whash *wh);

/* The evaluation loader of this view's rank and size. */
static int eval_loader_open(struct trainer *t)
{
    struct mesh_loader_opts lo;

    mesh_loader_destroy(t->eval_ld);
    t->eval_ld = NULL;
    if (!t->ds || t->info.eval_count == 0 || t->c->no_eval)
        return 0;
    memset(&lo, 0, sizeof(lo));
    lo.split = MESH_DATA_EVAL;
    lo.batch = t->c->batch;
    lo.rank = t->rank;
    lo.world = t->size;
    lo.threads = t->c->data_threads;
    return mesh_loader_create(t->ds, &lo, &t->eval_ld);
}

/* Drop the failed view's mesh, communicator and buckets. */
static void view_close(struct trainer *t)
{
    mesh_elastic_set_transport(t->el, NULL, NULL);
    train_serve_view(t, 0);
    if (t->loss_req)
        (void)loss_wait(t, 0);
    if (t->gs)
        (void)mesh_gradsync_abort(t->gs, -ECANCELED);
    mesh_gradsync_destroy(t->gs);
    t->gs = NULL;
    mesh_coll_destroy(t->coll);
    t->coll = NULL;
    mesh_discard(t->mesh);
    t->mesh = NULL;
}

/*
 * The figures of a state transfer: on the joiner, kept for its line after
 * the first step (join_first_step); on rank 0, a metrics record.
 */
static void join_report(struct trainer *t, const struct mesh_elastic_view *v,
                        const struct train_xfer_stats *st, int needy)
{
    char list[200];

    if (needy) {
        size_t n = 0;
        int k = 0;

        t->join_view = v->epoch;
        t->join_bytes = st->bytes;
        t->join_xfer_s = st->secs;
        t->join_sent[0] = '\0';
        for (int s = 0; s < 64 && n + 40 < sizeof(t->join_sent); s++)
            if (st->senders >> s & 1)
                n += (size_t)snprintf(
                    t->join_sent + n, sizeof(t->join_sent) - n,
                    "%sslot %d: %" PRIu64, n ? ", " : "", s, st->sent[k++]);
        return;
    }
    if (t->rank != 0)
        return;
    mesh_elastic_slots_str(v->needy, list, sizeof(list));
    fprintf(stderr,
            "meshtrain: view %" PRIu64 ": state of step %" PRIu64 " (%" PRIu64
            " bytes) sent to slot(s) %s by %d peer(s) in "
            "%.3f s; this peer sent %" PRIu64 " bytes\n",
            v->epoch, v->step + 1, st->state_bytes, list,
            __builtin_popcountll(st->senders), st->secs, st->bytes);
    if (t->metrics) {
        char senders[200];

        fprintf(t->metrics,
                "{\"event\": \"transfer\", \"view\": %" PRIu64
                ", \"step\": %" PRIu64 ", \"joiners\": [%s], "
                "\"senders\": [%s], \"state_bytes\": %" PRIu64
                ", \"sent_bytes_rank0\": %" PRIu64 ", \"transfer_s\": "
                "%.6f%s}\n",
                v->epoch, v->step, list,
                mesh_elastic_slots_str(st->senders, senders, sizeof(senders)),
                st->state_bytes, st->bytes, st->secs, wall_field(t));
        fflush(t->metrics);
    }
}

/* The marks of a view change on this peer (mesh_now_s()), in order. */
enum {
    VC_FAIL,     /* the mesh failed: the view is changing */
    VC_DECIDED,  /* the next view agreed */
    VC_OPEN,     /* view_open begins */
    VC_RESTORE,  /* the snapshot restored (a joiner: its catch-up ended) */
    VC_HASH,     /* the weights hashed (or their hash begun: VC_HASHW) */
    VC_MESH,     /* the view's mesh and communicator open */
    VC_HASHW,    /* the weights' hash, begun before the mesh, done */
    VC_XFER,     /* the state transfer done */
    VC_RESTORE2, /* the state restored again (BN averaged, or received) */
    VC_SETUP,    /* buckets, data, metrics */
    VC_VERIFY,   /* the weight check done */
    VC_N
};

/*
 * Where a view change that admitted joiners went, on rank 0 and on the
 * joiners (bench/catchup.sh): one line, seconds per stage, and the bytes
 * of the state this peer hashed (one pass over the weights: 8 bytes per
 * parameter, plus the header and BN statistics on a sender; the whole
 * state on a joiner that did not catch up).
 */
static void view_stages(struct trainer *t, const struct mesh_elastic_view *v,
                        const double *mk, const struct train_xfer_stats *st,
                        uint64_t hashed, uint64_t ahead)
{
    if (t->rank != 0 && !(v->needy >> t->mo->world.rank & 1))
        return;
    fprintf(stderr,
            "meshtrain: slot %d, the change to view %" PRIu64
            ", s: agreement %.3f, restore %.3f, weights' SHA-256 %.3f "
            "(%d%% before the view change), mesh %.3f, transfer %.3f (BN "
            "average %.3f, copy %.3f, "
            "SHA-256 %.3f, the rest %.3f), restore %.3f, setup %.3f, "
            "weight check %.3f; total %.3f; SHA-256 over %" PRIu64
            " bytes of a %" PRIu64 "-byte state\n",
            t->mo->world.rank, v->epoch, mk[VC_DECIDED] - mk[VC_FAIL],
            mk[VC_RESTORE] - mk[VC_OPEN],
            (mk[VC_HASH] - mk[VC_RESTORE]) + (mk[VC_HASHW] - mk[VC_MESH]),
            (int)(t->nparams ? ahead * 100 / (8 * (uint64_t)t->nparams) : 0),
            mk[VC_MESH] - mk[VC_HASH], mk[VC_XFER] - mk[VC_HASHW], st->bn_s,
            st->copy_s, st->hash_s,
            MESH_MAX(0.0, (mk[VC_XFER] - mk[VC_HASHW]) - st->bn_s - st->copy_s -
                              st->hash_s),
            mk[VC_RESTORE2] - mk[VC_XFER], mk[VC_SETUP] - mk[VC_RESTORE2],
            mk[VC_VERIFY] - mk[VC_SETUP], mk[VC_VERIFY] - mk[VC_FAIL], hashed,
            st->state_bytes);
}

/* view_open's hash of the weights: a member's, or a joiner's that holds
 * the step the view restarts from (unless its catch-up hashed them). */
static int view_hash(struct trainer *t, const struct mesh_elastic_view *v,
                     int needy, struct train_whash *wh, uint64_t *hashed)
{
    int rc;

    if (!t->sim && !wh->valid && (!needy || t->cu_step == v->step)) {
        rc = weights_hash(t, wh);
        if (rc < 0)
            return train_local(t, rc);
    }
    if (wh->valid)
        *hashed += 8 * (uint64_t)t->nparams;
    return 0;
}

/*
 * Join view v: its members renumbered densely in slot order, a new mesh
 * whose handshake carries the view (so that a peer of another view is
 * refused), the communicator and buckets, the data re-sharded from the
 * snapshot's position, and the digests compared.
 */
static int view_open(struct trainer *t, const struct mesh_elastic_view *v,
                     double t_fail)
{
    const struct mesh_opts *mo = t->mo;
    struct mesh_peer peers[MESH_ELASTIC_MAX_SLOTS];
    struct mesh_opts vo;
    char cfg[MESH_CONFIG_MAX], list[200], when[96];
    struct train_xfer_stats st;
    struct train_whash wh;
    double mk[VC_N];
    uint64_t hashed = 0, ahead_b = 0;
    int n = 0, me = -1, rc, needy, late, ahead;

    memset(&st, 0, sizeof(st));
    memset(&wh, 0, sizeof(wh));
    mk[VC_FAIL] = t->t0 + t_fail;
    mk[VC_DECIDED] = v->decided_s;
    mk[VC_OPEN] = mesh_now_s();

    for (int s = 0; s < mo->world.size; s++) {
        if (!(v->members >> s & 1))
            continue;
        if (s == mo->world.rank)
            me = n;
        peers[n++] = mo->world.peers[s];
    }
    t->rank = me;
    t->size = n;
    t->view_epoch = v->epoch;
    t->members = v->members;
    mesh_log_set_rank(me);
    view_shape(t);
    needy = (int)(v->needy >> mo->world.rank & 1);
    if (needy) { /* a joiner waits for no later one */
        t->join_at = UINT64_MAX;
        for (int i = 0; i < (int)MESH_ARRAY_SIZE(t->join_ats); i++)
            t->join_ats[i] = UINT64_MAX;
    } else if (v->members & ~v->prev) {
        join_at_next(t); /* the test aid's joiner came (even if its
                            transfer fails) */
    }
    if (needy)
        t->join_mark[TRAIN_JM_ADMIT] = v->decided_s;
    /* a joiner on the cpu backend lets its catch-up end (the last steps
     * applied, the hash finished) while it opens the mesh, where it would
     * wait for the members' hashes anyway; on a device the catch-up's
     * thread is the device's only user until it ends */
    late = needy && t->cu && t->host_slabs;
    if (!needy) {
        /* the weights' hash starts as soon as the state is restored, on
         * its thread (a cpu backend's), unless it began before: beside
         * the mesh, not before it */
        train_whash_hold(t);
        rc = snap_restore(t, v->step, 0);
        train_whash_restored(t, v->step, rc == 0);
        if (rc < 0)
            return rc;
    } else {
        train_whash_forget(t); /* it receives its state */
    }
    if (needy && late) {
        train_catchup_aim(t, v->step);
    } else if (needy && t->cu) {
        /* what the joiner caught up to in the background: the state
         * transfer then sends only what it could not rebuild */
        (void)train_catchup_finish(t, v->step, &wh);
    }
    mk[VC_RESTORE] = mesh_now_s();
    ahead = t->wh && !needy;
    /* the weights' hashes, once: for the state's digest (a member's
     * offer, the range a joiner rebuilt) and the weight check below; each
     * peer hashes them now, beside the others, not in turn in the
     * transfer (a joiner that caught up hashed them while it waited) */
    if (!late && !ahead) {
        rc = view_hash(t, v, needy, &wh, &hashed);
        if (rc < 0)
            return rc;
    }
    mk[VC_HASH] = mesh_now_s();
    if (n > 1) {
        vo = *mo;
        vo.world.rank = me;
        vo.world.size = n;
        vo.world.peers = peers;
        vo.topts.join_timeout_s = train_view_join_timeout(t);
        vo.topts.listen_fd = t->listen_fd;
        if (snprintf(cfg, sizeof(cfg),
                     "%s" MESH_CONFIG_VIEW "=%" PRIu64 ":%s\n", t->config,
                     v->epoch,
                     mesh_elastic_slots_str(v->members, list, sizeof(list))) >=
            (int)sizeof(cfg))
            return mesh_err(-EINVAL, "configuration too long");
        rc = mesh_open(&vo, cfg, &t->mesh);
        if (rc < 0)
            return rc;
        mesh_elastic_set_transport(t->el, mesh_ops(t->mesh),
                                   mesh_transport(t->mesh));
        rc = open_comm(t);
        if (rc < 0)
            return rc;
    }
    mesh_elastic_formed(t->el); /* every member joined it */
    if (late) {
        /* (its time counts in "mesh" on the joiner's stage line) */
        (void)train_catchup_finish(t, v->step, &wh);
        rc = view_hash(t, v, needy, &wh, &hashed);
        if (rc < 0)
            return rc;
    }
    mk[VC_MESH] = mesh_now_s();
    if (ahead) {
        /* (its time after the mesh counts in "weights' SHA-256") */
        (void)train_whash_get(t, v->step, &wh, &ahead_b);
        rc = view_hash(t, v, needy, &wh, &hashed);
        if (rc < 0)
            return rc;
    }
    mk[VC_HASHW] = mesh_now_s();
    if (needy)
        t->join_mark[TRAIN_JM_MESH] = mk[VC_MESH];
    mk[VC_XFER] = mk[VC_RESTORE2] = mk[VC_HASHW];
    if (v->needy) {
        /* the joiners get the state of the step the view restarts from */
        rc = train_xfer_run(t, v, &wh, &st);
        mk[VC_XFER] = mesh_now_s();
        hashed += st.hashed;
        warm_join(t); /* (built beside the transfer: warm_start) */
        if (rc == 0)
            rc = needy ? snap_restore(t, v->step, 1)
                       : snap_restore_buffers(t, v->step);
        if (rc < 0)
            return rc;
        mk[VC_RESTORE2] = mesh_now_s();
        join_report(t, v, &st, needy);
        if (needy)
            t->join_mark[TRAIN_JM_STATE] = mk[VC_RESTORE2];
    }
    t->unformed = 0;
    rc = gradsync_open(t);
    if (rc < 0)
        return train_local(t, rc);
    /* the error feedback of sparse gradients, as before the step redone
     * (a joiner's is empty: each peer's own) */
    if (!needy && mesh_gradsync_residual(t->gs) &&
        t->snap[v->step & 1].residual)
        memcpy(mesh_gradsync_residual(t->gs), t->snap[v->step & 1].residual,
               t->nparams * 4);
    if (t->train_ld) {
        rc = mesh_data_layout(t->train_ld, t->d_epoch, t->d_pos, t->slots,
                              t->rank, t->size);
        if (rc == 0)
            rc = eval_loader_open(t);
        if (rc < 0)
            return train_local(t, rc);
    }
    /* only rank 0 writes the metrics: a joiner of a lower slot can take
     * rank 0 from us (then we hand them over), as we may take it */
    if (t->rank != 0 && t->metrics) {
        if (v->step >= t->pending_step) /* as elastic_recover does */
            pending_flush(t);
        t->pending[0] = '\0';
        fclose(t->metrics);
        t->metrics = NULL;
    }
    if (t->rank == 0 && !t->metrics && t->c->metrics) {
        t->metrics = fopen(t->c->metrics, "a");
        if (!t->metrics)
            return train_local(t,
                               mesh_err_errno("--metrics %s", t->c->metrics));
        t->took_metrics = 1;
    }
    mk[VC_SETUP] = mesh_now_s();
    snprintf(when, sizeof(when), "after the change to view %" PRIu64, v->epoch);
    if (!t->sim && !wh.valid)
        hashed += 8 * (uint64_t)t->nparams; /* verify_weights hashes them */
    rc = verify_weights(t, when, &wh);
    mk[VC_VERIFY] = mesh_now_s();
    if (rc == 0)
        train_serve_view(t, 1);
    if (rc == 0 && v->needy)
        view_stages(t, v, mk, &st, hashed, ahead_b);
    /* for the view's metrics record (view_report) */
    t->vc_parts[TRAIN_VC_AGREE] = mk[VC_DECIDED] - mk[VC_FAIL];
    t->vc_parts[TRAIN_VC_RESTORE] =
        (mk[VC_HASH] - mk[VC_DECIDED]) + (mk[VC_HASHW] - mk[VC_MESH]);
    t->vc_parts[TRAIN_VC_MESH] = mk[VC_MESH] - mk[VC_HASH];
    t->vc_parts[TRAIN_VC_XFER] = mk[VC_RESTORE2] - mk[VC_HASHW];
    t->vc_parts[TRAIN_VC_READY] = mk[VC_VERIFY] - mk[VC_RESTORE2];
    return rc;
}

/*
 * The record of a view change: one log line (rank 0), a metrics record
 * and a timeline event, and a line for meshrun.
 */
static void view_report(struct trainer *t, const struct mesh_elastic_view *v,
                        const char *why, double t_fail, double dur)
{
    char left[200], members[200], joined[200], who[1200] = "", asked[240];
    const double *m = t->vc_parts;
    size_t n = 0;

    mesh_elastic_slots_str(v->left, left, sizeof(left));
    mesh_elastic_slots_str(v->members & ~v->prev, joined, sizeof(joined));
    /* a member that heard the joiners left at once, aborting the step in
     * flight (mesh_elastic_set_eager): what failed then is no news */
    if (!v->left && (v->members & ~v->prev)) {
        snprintf(asked, sizeof(asked), "slot(s) %s asked to join", joined);
        why = asked;
    }
    mesh_elastic_slots_str(v->members, members, sizeof(members));
    for (int s = 0; s < t->mo->world.size && n + 300 < sizeof(who); s++) {
        char name[MESH_HOST_MAX + 16];

        if (!(v->left >> s & 1))
            continue;
        n += (size_t)snprintf(
            who + n, sizeof(who) - n, "%sslot %d (%s)", n ? ", " : "", s,
            mesh_peer_name(&t->mo->world, s, name, sizeof(name)));
    }
    tl_add(t, "view change", 0, t_fail, dur);
    if (t->rank != 0)
        return;
    fprintf(stderr,
            "meshtrain: view %" PRIu64 ": %s left (%s); %s%s%d peer(s) "
            "(slots %s) continue from step %" PRIu64 ", recovered in "
            "%.3f s\n",
            v->epoch, who[0] ? who : "no peer", why,
            v->members & ~v->prev ? "slot(s) " : "",
            v->members & ~v->prev ? strcat(joined, " joined; ") : "", t->size,
            members, v->step + 1, dur);
    mesh_elastic_slots_str(v->members & ~v->prev, joined, sizeof(joined));
    fprintf(stderr, MESH_REPORT_VIEW "%" PRIu64 " size %d left %s joined %s\n",
            v->epoch, t->size, left, joined);
    if (t->metrics) {
        fprintf(t->metrics,
                "{\"event\": \"view\", \"view\": %" PRIu64 ", \"step\": "
                "%" PRIu64 ", \"peers\": %d, \"members\": [%s], "
                "\"left\": [%s], \"joined\": [%s], \"recovery_s\": "
                "%.6f, \"parts\": {\"agree\": %.6f, \"restore\": %.6f, "
                "\"mesh\": %.6f, \"xfer\": %.6f, \"ready\": %.6f}%s}\n",
                v->epoch, v->step, t->size, members, v->left ? left : "",
                v->members & ~v->prev ? joined : "", dur, m[TRAIN_VC_AGREE],
                m[TRAIN_VC_RESTORE], m[TRAIN_VC_MESH], m[TRAIN_VC_XFER],
                m[TRAIN_VC_READY], wall_field(t));
        fflush(t->metrics);
    }
}

/*
 * After a failure of the mesh (rc_fail): agree on the next view with the
 * other survivors, join it and roll back to the step it restarts from
 * (*step). Returns MESH_EXIT_OK to go on, else the exit code.
 */
static int elastic_recover(struct trainer *t, int rc_fail, uint64_t *step)
{
    const struct mesh_transport_opts *to = &t->mo->topts;
    double t_fail = now_s(t), timeout;
    struct mesh_elastic_view v;
    char why[400];
    int rc, tries;

    snprintf(why, sizeof(why), "%s", mesh_err_msg(rc_fail));
    mesh_elastic_set_failure(t->el, rc_fail);
    timeout = MESH_MAX(5.0, 2 * to->peer_timeout_s);
    /* a joiner waits for the next step boundary of the job: a step, an
     * evaluation or a checkpoint may pass first */
    if (t->unformed)
        timeout = MESH_MAX(timeout, to->join_timeout_s);
    for (tries = 0; tries < 8; tries++) {
        view_close(t);
        rc = mesh_elastic_agree(t->el, timeout, &v);
        if ((rc == -EPERM || rc == -ETIMEDOUT) && t->unformed && !t->joiner) {
            /* (no catch-up here: it is admitted at once) */
            mesh_elastic_join_hold(t->el, 0);
            if (mesh_elastic_probe(t->el, 1.0) == 1) {
                /* view 0 formed without this late peer: it joins */
                mesh_info("the others formed a view without this peer: "
                          "joining it");
                t->joiner = 1;
                continue;
            }
        }
        if (rc == -EACCES) {
            fprintf(stderr, "meshtrain: slot %d: %s\n", t->mo->world.rank,
                    mesh_err_msg(rc));
            return MESH_EXIT_USAGE;
        }
        if (rc < 0) {
            fprintf(stderr, "meshtrain: slot %d: %s\n", t->mo->world.rank,
                    mesh_err_msg(rc));
            return t->unformed && t->joiner ? MESH_EXIT_JOIN : MESH_EXIT_QUORUM;
        }
        if (v.size < t->c->min_peers) {
            fprintf(stderr,
                    "meshtrain: slot %d: view %" PRIu64 " has %d peer(s), "
                    "fewer than --min-peers %d; stopping\n",
                    t->mo->world.rank, v.epoch, v.size, t->c->min_peers);
            return MESH_EXIT_MIN_PEERS;
        }
        rc = view_open(t, &v, t_fail);
        if (rc == 0)
            break;
        if (t->local_err || rc == -EBADMSG)
            return run_fail(t, rc);
        snprintf(why, sizeof(why), "joining view %" PRIu64 ": %s", v.epoch,
                 mesh_err_msg(rc));
    }
    if (tries == 8) {
        fprintf(stderr, "meshtrain: slot %d: no view could be joined: %s\n",
                t->mo->world.rank, why);
        return MESH_EXIT_PEER;
    }
    /* the last step run here was applied by every peer when the view
     * restarts after it; else it is redone */
    if (t->took_metrics)
        metrics_take_over(t, v.step);
    else if (v.step >= t->pending_step)
        pending_flush(t);
    t->took_metrics = 0;
    t->pending[0] = '\0';
    *step = v.step;
    view_report(t, &v, why, t_fail, now_s(t) - t_fail);
    return MESH_EXIT_OK;
}

/*
 * Seconds since this process started (/proc/self/stat's start time, in
 * clock ticks since boot), or since the run started where that is not
 * readable.
 */
static double process_age(const struct trainer *t)
{
    unsigned long long start = 0;
    struct timespec ts;
    char buf[1024], *p;
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    long hz = sysconf(_SC_CLK_TCK);

    if (f)
        fclose(f);
    buf[n] = '\0';
    /* field 22; the command name (field 2) may hold spaces: after ')' */
    p = strrchr(buf, ')');
    if (!p || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &ts) < 0 ||
        sscanf(p + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d "
               "%*d %*d %*d %*d %*d %llu",
               &start) != 1)
        return now_s(t);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec -
           (double)start / (double)hz;
}

/*
 * A joiner's first step is done: its join time (from the start of the
 * process to here) and what it received, one line for logs and
 * benchmarks (bench/join.sh, bench/chaos.sh).
 */
static void join_first_step(struct trainer *t, uint64_t done)
{
    static const char *const names[TRAIN_JM_N] = {
        [TRAIN_JM_RUN] = "main",         [TRAIN_JM_INPUT] = "input",
        [TRAIN_JM_ANSWER] = "answered",  [TRAIN_JM_BUILT] = "built",
        [TRAIN_JM_MODEL] = "model",      [TRAIN_JM_BYTES] = "bytes in",
        [TRAIN_JM_SNAP] = "snapshot",    [TRAIN_JM_ADMIT] = "admitted",
        [TRAIN_JM_MESH] = "mesh",        [TRAIN_JM_STATE] = "state",
        [TRAIN_JM_BEGIN] = "first step",
    };
    double now = mesh_now_s(), age = process_age(t);
    char marks[400];
    size_t n = 0;

    fprintf(stderr,
            "meshtrain: slot %d joined view %" PRIu64 ": step %" PRIu64
            " done %.3f s after start; state %" PRIu64 " bytes received "
            "in %.3f s (%s)\n",
            t->mo->world.rank, t->join_view, done, age, t->join_bytes,
            t->join_xfer_s, t->join_sent);
    /* where the join time went (bench/join.sh): each mark in seconds
     * since the process started */
    marks[0] = '\0';
    for (int i = 0; i < TRAIN_JM_N && n + 40 < sizeof(marks); i++)
        if (t->join_mark[i] > 0)
            n += (size_t)snprintf(marks + n, sizeof(marks) - n, "%s%s %.3f",
                                  n ? ", " : "", names[i],
                                  age - (now - t->join_mark[i]));
    fprintf(stderr, "meshtrain: slot %d's join, s after start: %s, done %.3f\n",
            t->mo->world.rank, marks, age);
    t->join_view = 0;
}

/* Can the survivors of this error go on in a new view? */
static int elastic_can_recover(const struct trainer *t, int rc)
{
    return t->el && !t->local_err && rc != -EBADMSG;
}

/* A step whose loss is known: its metrics line and progress. */
struct reported {
    struct window win; /* since the last progress line */
    double ema;        /* of the step time */
};

static int report(struct trainer *t, struct reported *r, uint64_t done,
                  float loss, double lr, const struct window *one)
{
    const struct train_cfg *c = t->c;

    if (!isfinite(loss))
        return train_local(
            t, mesh_err(-ERANGE, "loss is %f at step %" PRIu64 " (lower --lr?)",
                        (double)loss, done));
    r->ema = r->ema == 0 ? one->t_step : 0.9 * r->ema + 0.1 * one->t_step;
    window_add(&r->win, one);
    metrics_line(t, done, loss, lr, one);
    if ((t->tty && r->win.t_step > 0.5) ||
        (!t->tty && c->log_every && done % c->log_every == 0) ||
        done == t->total_steps) {
        progress(t, done, loss, lr, &r->win,
                 r->ema * (double)(t->total_steps - done),
                 done == t->total_steps);
        memset(&r->win, 0, sizeof(r->win));
    }
    return 0;
}

/*
 * After the last step every peer without --elastic averages one more
 * loss, so that peers on either path run the same collectives: with
 * t->loss_lag the last step's (then reported), else a placeholder that
 * nobody reads.
 */
static int loss_last(struct trainer *t, struct reported *r, int have,
                     uint64_t done, double lr, const struct window *one)
{
    float sum = 0;
    int valid = 0, rc = 0;

    if (t->el)
        return 0;
    if (t->loss_lag && have)
        rc = loss_prev(t, &sum, &valid);
    if (rc == 0)
        rc = loss_start(t, sum * t->gscale);
    rc = loss_wait(t, rc);
    if (rc < 0 || !valid)
        return rc;
    return report(t, r, done, t->loss_avg, lr, one);
}

/*
 * Steps start .. total_steps, with progress, metrics and what is due.
 * With t->loss_lag a step is reported during the next one (its loss is
 * read then), the last one after the loop. Returns 0, or the error; with
 * --elastic, a failure of the mesh changes
 * the view and the loop goes on from the step it restarts from (*code
 * gets the exit code when it cannot).
 */
static int train_loop(struct trainer *t, uint64_t start, int *code)
{
    uint64_t every = eval_interval(t), step = start, prev_done = 0;
    struct window prev_one;
    struct reported r;
    double prev_lr = 0;
    float loss = 0;
    int rc, valid = 0;

    memset(&r, 0, sizeof(r));
    memset(&prev_one, 0, sizeof(prev_one));
    while (step < t->total_steps) {
        struct window one;
        double lr = step_lr(t, step);
        uint64_t done = step + 1;

        memset(&one, 0, sizeof(one));
        t->step = step;
        if (t->el) {
            double ts = now_s(t);

            rc = elastic_boundary(t, step);
            /* part of the step's time and compute, and reported apart */
            one.t_snap = now_s(t) - ts;
            one.t_step = one.t_compute = one.t_snap;
        } else {
            rc = 0;
        }
        if (rc == 0) {
            warm_join(t);
            if (t->join_view && !t->join_mark[TRAIN_JM_BEGIN])
                t->join_mark[TRAIN_JM_BEGIN] = mesh_now_s();
            train_fault(t, TRAIN_FAULT_BETWEEN);
            samples_note(t, step);
            rc = train_step(t, &one, &loss, &valid);
        }
        if (rc == 0 && t->model)
            mesh_nn_model_set_batches_tracked(
                t->model, t->nbt0 + (int64_t)done * t->c->accumulate);
        if (rc == 0 && !t->loss_lag)
            rc = report(t, &r, done, loss, lr, &one);
        else if (rc == 0 && valid)
            rc = report(t, &r, prev_done, loss, prev_lr, &prev_one);
        if (rc == 0) {
            prev_done = done, prev_lr = lr, prev_one = one;
            data_advance(t);
            if (t->join_view)
                join_first_step(t, done);
            rc = after_step(t, done, every);
        }
        if (rc < 0 && elastic_can_recover(t, rc)) {
            *code = elastic_recover(t, rc, &step);
            if (*code != MESH_EXIT_OK)
                return rc;
            continue;
        }
        if (rc < 0)
            return rc;
        step++;
    }
    if (t->el)
        return elastic_boundary(t, step);
    return loss_last(t, &r, prev_done > 0, prev_done, prev_lr, &prev_one);
}

/* ---- setup --------------------------------------------------------------- */

/*
 * Bind this rank to its CPUs (mesh_bind) before any thread starts (data
 * loader, oneDNN), so that they inherit it.
 */
static int bind_cpus(struct trainer *t, const struct mesh_opts *mo)
{
    const struct train_cfg *c = t->c;
    int rc = mesh_bind(mo, &t->ncpus);

    /* More compute threads than bound CPUs take turns on them: with
     * oneDNN's spinning barriers, 2 threads on 1 CPU ran 15x slower. */
    if (rc == 1 && c->threads > t->ncpus)
        mesh_warn("--threads %d, but --bind-to %s bound this rank to %d "
                  "CPU%s: the threads will take turns on %s, much slower "
                  "than %d thread%s (pass --threads %d, or --bind-to none)",
                  c->threads, mesh_bind_name(mo->bind), t->ncpus,
                  t->ncpus > 1 ? "s" : "", t->ncpus > 1 ? "them" : "it",
                  t->ncpus, t->ncpus > 1 ? "s" : "", t->ncpus);
    return rc < 0 ? rc : 0;
}

/* The data set (or the simulation) and the configuration peers share. */
static int open_input(struct trainer *t, const struct mesh_opts *mo)
{
    uint8_t data_fp[32];
    int rc;

    memset(data_fp, 0, sizeof(data_fp));
    rc = t->c->simulate ? open_sim(t) : open_data(t, mo);
    if (rc == 0 && !t->c->simulate)
        rc = mesh_data_fingerprint(t->ds, data_fp);
    if (rc == 0)
        rc = train_init_read(t);
    if (rc == 0)
        rc = build_config(t, data_fp);
    return rc;
}

/* Join the mesh; the exit code. A world of one joins no mesh: nothing to
 * agree with or average. */
static int join(struct trainer *t, const struct mesh_opts *mo)
{
    struct mesh_opts o = *mo;
    int rc;

    o.topts.listen_fd = t->listen_fd; /* --elastic's, or -1 */
    rc = t->size > 1 ? mesh_open(&o, t->config, &t->mesh) : 0;

    t->join_rc = rc;
    if (rc == -ECANCELED) {
        /* A peer that had joined already aborted the job (a local error
         * of its own, before step 1) while this rank still completed its
         * last handshakes: a peer failure, as it is a moment later. */
        fprintf(stderr,
                "meshtrain: rank %d: the job was aborted while "
                "joining: %s\n",
                t->rank, mesh_err_msg(rc));
        return MESH_EXIT_PEER;
    }
    if (rc < 0) {
        fprintf(stderr, "meshtrain: rank %d: cannot join the mesh: %s\n",
                t->rank, mesh_err_msg(rc));
        return MESH_EXIT_JOIN;
    }
    return MESH_EXIT_OK;
}

/* The communicator over the mesh's transport (peers only). */
static int open_comm(struct trainer *t)
{
    struct mesh_coll_opts co;

    if (t->size <= 1)
        return 0;
    mesh_coll_opts_init(&co);
    co.algo = t->c->algo;
    /*
     * AUTO decides from the built-in cost numbers, not measured ones:
     * the algorithm fixes the summation order, and a run must repeat
     * (and resume) bitwise, whatever the network felt like at start.
     * After a view change (--elastic) too: measuring the new mesh (its
     * 32-byte all-reduces, each algorithm 31 times or more) took 0.09 to
     * 0.34 s of every view change in bench/chaos.sh, more than the rest
     * of a crash's recovery, to pick among algorithms whose step times
     * differ less than that on a model of its size (doc/elastic.md,
     * "Chaos benchmark").
     */
    co.measure = 0;
    co.measure_bytes = 0;
    /*
     * Bucket buffers that device copies use: nn's pinned memory. On the
     * CPU, the host's shared memory first (shm), where the local
     * all-reduce reads the other ranks' buckets in place.
     */
    co.host_alloc = &mesh_nn_host_allocator;
    co.host_shared = strcmp(t->c->device, "cpu") == 0;
    return mesh_coll_create(mesh_ops(t->mesh), mesh_transport(t->mesh),
                            mesh_world(t->mesh), &co, &t->coll);
}

static int open_metrics(struct trainer *t)
{
    if (t->rank != 0 || !t->c->metrics)
        return 0;
    t->metrics = fopen(t->c->metrics, "w");
    if (!t->metrics)
        return mesh_err_errno("--metrics %s", t->c->metrics);
    return 0;
}

static void print_plan(const struct trainer *t)
{
    const struct train_cfg *c = t->c;
    int nchunks = mesh_gradsync_num_chunks(t->gs);
    char comp[96], how[96];

    if (t->rank != 0 || c->quiet)
        return;
    compress_spec(c, comp, sizeof(comp));
    if (c->sparse.kind)
        snprintf(how, sizeof(how), "pairs all-gathered, %s",
                 c->no_error_feedback ? "no error feedback" : "error feedback");
    else
        snprintf(how, sizeof(how), "all-reduce %s", mesh_algo_name(c->algo));
    printf("meshtrain: %d gradient bucket(s) of up to %.3g MiB (first "
           "%.3g MiB), %s on the wire, %s; %" PRIu64 " steps of %" PRIu64
           " per epoch\n",
           mesh_gradsync_num_buckets(t->gs), c->bucket_mb,
           (double)mesh_gradsync_bucket_floats(t->gs, 0) * 4 / 1048576,
           c->compress || c->sparse.kind ? comp : "fp32", how, t->total_steps,
           t->steps_per_epoch);
    if (nchunks)
        printf("meshtrain: pinned-host pipeline: %d chunk(s) of up to %.3g "
               "MiB\n",
               nchunks, c->chunk_mb);
}

/*
 * --elastic: the view thread (view 0: every slot), and the test aid
 * MESHTRAIN_TEST_SAMPLES.
 */
static int elastic_open(struct trainer *t, const struct mesh_opts *mo)
{
    const struct train_cfg *c = t->c;
    struct mesh_elastic_opts eo;
    const char *v = getenv("MESHTRAIN_TEST_SAMPLES");
    int rc;

    t->mo = mo;
    t->size0 = t->size;
    if (!c->elastic)
        return 0;
    if (c->min_peers > t->size)
        return mesh_err(-EINVAL, "--min-peers %d: the job has %d peer(s)",
                        c->min_peers, t->size);
    memset(&eo, 0, sizeof(eo));
    eo.world = &mo->world;
    eo.secret = mo->topts.secret;
    eo.secret_len = mo->topts.secret ? mo->topts.secret_len : 0;
    eo.job_id = mo->topts.job_id;
    eo.settle_s = 0.15;
    eo.wait_s = mo->topts.peer_timeout_s;
    t->join_at = UINT64_MAX;
    for (int i = 0; i < (int)MESH_ARRAY_SIZE(t->join_ats); i++)
        t->join_ats[i] = UINT64_MAX;
    if (getenv("MESHTRAIN_TEST_JOIN_AT")) {
        char *p = getenv("MESHTRAIN_TEST_JOIN_AT");

        t->join_at = strtoull(p, &p, 10);
        for (int i = 0; *p == ',' && i < (int)MESH_ARRAY_SIZE(t->join_ats); i++)
            t->join_ats[i] = strtoull(p + 1, &p, 10);
    }
    t->step_ms = getenv("MESHTRAIN_TEST_STEP_MS")
                     ? atoi(getenv("MESHTRAIN_TEST_STEP_MS"))
                     : 0;
    t->join_batch = getenv("MESHTRAIN_TEST_JOINERS")
                        ? MESH_MAX(1, atoi(getenv("MESHTRAIN_TEST_JOINERS")))
                        : 1;
    eo.fd = mo->claim_fd;
    rc = fault_parse(t, mo->world.rank);
    if (rc < 0)
        return rc;
    if (t->fault.moment == TRAIN_FAULT_AGREE)
        eo.fault_sig = t->fault.sig;
    rc = mesh_elastic_start(&eo, &t->el);
    if (rc < 0)
        return rc;
    /* one listening socket for every view's mesh: between two views a
     * peer's dials wait in its backlog, not refused (each refusal cost
     * a dial backoff of up to 250 ms in a view change); where it cannot
     * be bound now, each mesh binds its own, and says why */
    rc = mesh_tcp_listen_socket(&mo->world, &mo->topts, &t->listen_fd);
    if (rc < 0)
        mesh_debug("no listening socket kept across views: %s",
                   mesh_err_msg(rc));
    t->members = t->size >= 64 ? UINT64_MAX : (UINT64_C(1) << t->size) - 1;
    if (v && *v) {
        char path[PATH_MAX];

        snprintf(path, sizeof(path), "%s.%d", v, mo->world.rank);
        /* appended: a slot's later process (a joiner) adds its lines */
        t->samples = fopen(path, "a");
        if (!t->samples)
            return mesh_err_errno("MESHTRAIN_TEST_SAMPLES: %s", path);
    }
    return 0;
}

/*
 * --elastic: is a job running that this peer joins (t->joiner), or is it
 * starting with this peer? The exit code, MESH_EXIT_OK to go on.
 */
static int elastic_probe(struct trainer *t)
{
    int rc;

    if (!t->el || t->size < 2)
        return MESH_EXIT_OK;
    /* a joiner that will catch up in the background (train/catchup.c)
     * asks the members to wait from its first request on */
    /* (or that builds its kernels first, setup: warm_up) */
    mesh_elastic_join_hold(t->el, !t->c->simulate && !t->sim);
    /* until every slot answered (a few ms when all start together); a
     * silent slot holds the start up to this, but view 0 would wait
     * for it until --join-timeout anyway */
    rc = mesh_elastic_probe(
        t->el, MESH_MIN(5.0, MESH_MAX(1.0, t->mo->topts.join_timeout_s / 4)));
    if (rc != 1)
        mesh_elastic_join_hold(t->el, 0);
    if (rc < 0) {
        fprintf(stderr, "meshtrain: slot %d: %s\n", t->mo->world.rank,
                mesh_err_msg(rc));
        return MESH_EXIT_USAGE;
    }
    if (rc == 1) {
        t->join_mark[TRAIN_JM_ANSWER] = mesh_now_s();
        t->joiner = 1;
        t->unformed = 1;
        mesh_info("a job is running: joining it at its next step boundary");
    }
    return MESH_EXIT_OK;
}

/*
 * Everything up to the first step: CPUs, data, configuration, the mesh,
 * output paths, model, communicator, gradient buckets, metrics file.
 * Returns the exit code, MESH_EXIT_OK to go on.
 */
static int setup(struct trainer *t, const struct mesh_opts *mo)
{
    int rc, code;

    rc = bind_cpus(t, mo);
    if (rc == 0)
        rc = open_input(t, mo);
    t->join_mark[TRAIN_JM_INPUT] = mesh_now_s();
    if (rc == 0)
        rc = elastic_open(t, mo);
    if (rc < 0)
        return fail(t, MESH_EXIT_USAGE, rc);
    code = elastic_probe(t);
    if (code != MESH_EXIT_OK)
        return code;
    /* a joiner fetches the members' state while it builds its model
     * (train/catchup.c); without a catch-up it is admitted and receives
     * the whole state */
    if (t->joiner && (rc = train_catchup_start(t)) < 0)
        mesh_info("no catch-up: %s", mesh_err_msg(rc));
    /* a peer that starts the job builds its kernels now (a joiner once
     * its model is, below) */
    if (!t->joiner)
        warm_up(t);
    if (!t->joiner) {
        code = join(t, mo);
        if (code == MESH_EXIT_JOIN && t->el &&
            (t->join_rc == -ETIMEDOUT || t->join_rc == -ECONNRESET ||
             t->join_rc == -EHOSTDOWN || t->join_rc == -ESHUTDOWN)) {
            /* some slots are not running, or a peer died (or left) while
             * the mesh formed: the peers present agree on a view of
             * themselves, if they are a quorum of the slots */
            fprintf(stderr,
                    "meshtrain: slot %d: view 0 (every slot) did not form; "
                    "agreeing on a view of the peers present\n",
                    mo->world.rank);
            t->unformed = 1;
        } else if (code != MESH_EXIT_OK) {
            return code;
        }
    }
    if (t->el && t->mesh) {
        mesh_elastic_set_transport(t->el, mesh_ops(t->mesh),
                                   mesh_transport(t->mesh));
        mesh_elastic_formed(t->el); /* view 0: a joiner now joins */
    }
    rc = outputs_check(t);
    if (rc == 0)
        rc = open_model(t, mo);
    t->join_mark[TRAIN_JM_BUILT] = mesh_now_s();
    if (rc == 0)
        train_catchup_model(t);
    if (rc == 0)
        rc = train_serve_start(t);
    if (rc == 0)
        rc = train_whash_start(t);
    if (rc < 0)
        return fail(t, MESH_EXIT_USAGE, rc);
    /* a joiner builds its kernels while its catch-up receives and loads
     * the snapshot, and is admitted only after both (it holds its join
     * until then: elastic_probe); without a catch-up (or once it failed)
     * while the view change sends it the whole state (warm_start) */
    if (t->joiner) {
        if (!t->cu)
            mesh_elastic_join_hold(t->el, 0);
        warm_start(t);
    }
    if (t->mesh && !t->unformed)
        train_serve_view(t, 1);
    if (t->unformed)
        return MESH_EXIT_OK; /* the first view's mesh opens the rest */
    rc = open_comm(t);
    if (rc < 0)
        return fail(t, MESH_EXIT_PEER, rc);
    rc = gradsync_open(t);
    if (rc == 0)
        rc = open_metrics(t);
    if (rc < 0)
        return fail(t, MESH_EXIT_USAGE, rc);
    print_plan(t);
    train_freeze_report(t);
    return MESH_EXIT_OK;
}

/*
 * Test aid (tests/train_verify.sh): MESHTRAIN_TEST_PERTURB=R makes rank R
 * change one weight by one ulp, which the digest check must catch.
 */
static void test_perturb(struct trainer *t)
{
    const char *v = getenv("MESHTRAIN_TEST_PERTURB");
    float *p, one;
    int rc;

    if (!v || !*v || atoi(v) != t->rank || t->sim)
        return;
    train_whash_forget(t);
    p = params_host(t, &rc);
    if (rc == 0) {
        one = nextafterf(p[0], INFINITY);
        if (t->host_slabs)
            p[0] = one;
        else
            mesh_nn_upload(t->ctx, mesh_nn_model_params(t->model), &one,
                           sizeof(one));
    }
    mesh_warn("MESHTRAIN_TEST_PERTURB: weight 0 changed by one ulp");
}

/*
 * Where the steps start: --resume's step, or 0; then every peer's weights
 * must be the same. Returns the exit code, MESH_EXIT_OK to go on.
 */
static int start_point(struct trainer *t, uint64_t *start)
{
    const struct train_cfg *c = t->c;
    int rc;

    if (c->resume && !c->checkpoint_dir)
        return fail(t, MESH_EXIT_USAGE,
                    mesh_err(-EINVAL, "--resume needs --checkpoint-dir"));
    if (c->resume) {
        rc = train_ckpt_resume(t, start);
        if (rc < 0)
            return fail(t,
                        t->local_err || rc == -ENOENT || rc == -EIO ||
                                rc == -EINVAL
                            ? MESH_EXIT_USAGE
                            : MESH_EXIT_PEER,
                        rc);
        /* a run already at or past its end: say so, not a silent exit */
        if (*start >= t->total_steps && t->rank == 0)
            mesh_warn("--resume: the checkpoint holds step %" PRIu64
                      ", at or past this run's last step (%" PRIu64
                      ", from --iters or --epochs): no step is trained",
                      *start, t->total_steps);
    }
    if (t->model)
        t->nbt0 = mesh_nn_model_batches_tracked(t->model) -
                  (int64_t)*start * c->accumulate;
    test_perturb(t);
    rc = verify_weights(t, *start ? "after resuming" : "before step 1", NULL);
    if (rc < 0)
        return fail(t, rc == -EBADMSG ? MESH_EXIT_VERIFY : MESH_EXIT_PEER, rc);
    return MESH_EXIT_OK;
}

/* ---- the end of a run ---------------------------------------------------- */

/* --simulate-compute: every rank's saturation figures (the bench takes
 * the worst). */
static void sim_report(struct trainer *t)
{
    struct mesh_sim_stats st;

    mesh_sim_stats_take(t->sim, &st);
    printf("meshtrain: rank %d: simulate: %" PRIu64 " steps, compute "
           "stretch median %.3f ms, wait lateness median %.3f ms max "
           "%.3f ms, cpu %.1f ms/step, %d GPU(s), grads %016" PRIx64 "\n",
           t->rank, st.steps, st.stretch_median_s * 1000,
           st.late_median_s * 1000, st.late_max_s * 1000,
           st.cpu_per_step_s * 1000, t->c->simulate_gpus,
           mesh_sim_grads_hash(t->sim));
    fflush(stdout);
}

/* The final evaluation (or the BN statistics' average without one). */
static int final_eval(struct trainer *t)
{
    double top1 = 0, top5 = 0;
    int rc;

    if (!t->eval_ld && t->c->eval_only)
        return train_local(t, mesh_err(-EINVAL,
                                       "--eval-only: --data %s has no "
                                       "test split",
                                       t->c->data));
    if (!t->eval_ld)
        return train_bn_average(t);
    rc = evaluate(t, &top1, &top5);
    if (rc == 0 && t->c->eval_only)
        return train_eval_report(t, top1, top5);
    if (rc == 0 && t->rank == 0)
        printf("%stest accuracy after %" PRIu64 " steps: top-1 %.2f %% "
               "top-5 %.2f %%\n",
               t->tty ? "\r\033[K" : "", t->total_steps, top1, top5);
    return rc;
}

/* What a run leaves: --save, --profile-layers, the simulation's figures,
 * --timeline. */
static int write_outputs(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    int rc = 0;

    if (c->save && t->rank == 0 && !t->sim)
        rc = train_local(t, mesh_nn_model_save(t->model, c->save));
    if (rc == 0 && t->prof)
        rc = train_local(t, mesh_sim_prof_write(t->prof, c->profile_layers));
    if (rc == 0 && t->sim)
        sim_report(t);
    if (rc == 0 && c->timeline && t->rank == 0)
        rc = train_local(t, mesh_timeline_write(&t->tl, c->timeline, t->rank));
    return rc;
}

/*
 * After the last step: evaluation, the last digest check, the outputs,
 * then leave the mesh together (a barrier).
 */
static int finish(struct trainer *t)
{
    int rc = final_eval(t);

    if (rc == 0)
        rc = train_predict(t);
    if (rc == 0 && t->c->verify_every)
        rc = verify_weights(t, "at the end", NULL);
    if (rc == 0)
        rc = write_outputs(t);
    /* no copy may still touch the pinned buffers freed next */
    if (rc == 0 && t->ctx)
        rc = train_local(t, mesh_nn_sync(t->ctx));
    if (rc < 0)
        return rc;
    /* the communicator's engine stops first: mesh_barrier then owns the
     * transport, and no peer hangs up while another needs it */
    mesh_gradsync_destroy(t->gs);
    t->gs = NULL;
    mesh_coll_destroy(t->coll);
    t->coll = NULL;
    return t->size > 1 ? mesh_barrier(t->mesh) : 0;
}

/* Close every resource in reverse order of opening. */
static void trainer_close(struct trainer *t)
{
    warm_join(t);
    train_catchup_stop(t);
    train_whash_stop(t);
    train_serve_stop(t);
    mesh_elastic_stop(t->el);
    t->el = NULL;
    train_xfer_free(t);
    for (int i = 0; i < 2; i++) {
        free(t->snap[i].params);
        free(t->snap[i].mom);
        free(t->snap[i].buf);
        free(t->snap[i].residual);
    }
    if (t->samples)
        fclose(t->samples);
    /* no copy may still read or write the host buffers freed below */
    if (t->ctx && mesh_nn_sync(t->ctx) < 0)
        mesh_warn("closing the device: %s", mesh_err_msg(-EIO));
    mesh_gradsync_destroy(t->gs);
    mesh_coll_destroy(t->coll);
    mesh_sim_prof_destroy(t->prof);
    mesh_sim_destroy(t->sim);
    mesh_nn_sgd_destroy(t->sgd);
    mesh_nn_model_destroy(t->model);
    mesh_nn_ctx_close(t->ctx);
    mesh_loader_destroy(t->eval_ld);
    mesh_loader_destroy(t->train_ld);
    mesh_data_close(t->ds);
    mesh_close(t->mesh);
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    if (t->metrics)
        fclose(t->metrics);
    mesh_timeline_free(&t->tl);
    free(t->hparams);
    free(t->hmom);
    free(t->hbuf);
    free(t->bn_own);
    free(t->init_buf);
    pthread_mutex_destroy(&t->warm_mu);
}

/* The exit code of an error of the steps or the end of the run. */
static int run_fail(struct trainer *t, int rc)
{
    return fail(t,
                t->local_err     ? MESH_EXIT_USAGE
                : rc == -EBADMSG ? MESH_EXIT_VERIFY
                                 : MESH_EXIT_PEER,
                rc);
}

/*
 * --elastic without a mesh yet: a joiner waits for the view change that
 * admits it (and receives the state); the peers of a view 0 that did not
 * form agree on a view of those present, from the initial weights (the
 * snapshot of step 0). Returns the exit code, MESH_EXIT_OK to go on.
 */
static int elastic_first_view(struct trainer *t, uint64_t *start)
{
    int rc;

    /* a joiner takes the running job's state, not a checkpoint's (meshrun
     * --restarts starts a dead rank again with the job's own flags) */
    if (t->c->resume && t->joiner)
        mesh_info("--resume: this peer joins a running job and takes its "
                  "state from the members, not from a checkpoint");
    if (t->c->resume && !t->joiner)
        return fail(t, MESH_EXIT_USAGE,
                    mesh_err(-EINVAL, "--resume with --elastic needs every "
                                      "slot at the start"));
    if (!t->joiner) {
        rc = snap_take(t, 0);
        if (rc < 0)
            return fail(t, MESH_EXIT_USAGE, rc);
        (void)mesh_elastic_commit(t->el, 0);
    }
    return elastic_recover(t, mesh_err(-ENOTCONN, "view 0 did not form"),
                           start);
}

int train_run(const struct train_cfg *c, const struct mesh_opts *mo)
{
    struct trainer t;
    uint64_t start = 0;
    int code, rc, first = 0;

    memset(&t, 0, sizeof(t));
    pthread_mutex_init(&t.warm_mu, NULL);
    t.listen_fd = -1;
    t.c = c;
    t.cu_step = UINT64_MAX;
    t.rank = mo->world.rank;
    t.size = mo->world.size;
    t.t0 = mesh_now_s();
    t.join_mark[TRAIN_JM_RUN] = t.t0;
    t.tty = isatty(STDOUT_FILENO);

    t.slots = t.size * c->accumulate;
    t.accum = c->accumulate;
    t.gscale = 1.0f / (float)c->accumulate;

    code = setup(&t, mo);
    if (code == MESH_EXIT_OK && t.model) /* --init's, or 0 */
        t.nbt0 = mesh_nn_model_batches_tracked(t.model);
    if (code == MESH_EXIT_OK && t.unformed) {
        first = 1; /* the view's snapshot holds the data position */
        code = elastic_first_view(&t, &start);
    } else if (code == MESH_EXIT_OK) {
        code = start_point(&t, &start);
    }
    if (code == MESH_EXIT_OK && t.train_ld && !first && !t.d_restored) {
        t.d_epoch = start / t.steps_per_epoch;
        t.d_pos =
            start % t.steps_per_epoch * (uint64_t)t.slots * (uint64_t)c->batch;
    }
    while (code == MESH_EXIT_OK) {
        rc = c->eval_only ? 0 : train_loop(&t, start, &code);
        if (code != MESH_EXIT_OK)
            break;
        if (rc == 0)
            rc = finish(&t);
        if (rc == 0) {
            pending_flush(&t);
            break;
        }
        if (elastic_can_recover(&t, rc))
            code = elastic_recover(&t, rc, &start);
        else
            code = run_fail(&t, rc);
    }
    trainer_close(&t);
    return code;
}
