/*
 * train/finetune.c: the trainer's fine-tuning pieces: --init FILE (and
 * --init-skip), --freeze, and the configuration lines they add.
 *
 * --init: every peer reads the whole file and hashes it before joining;
 * the digest is a line of the configuration that peers must share, so a
 * peer that holds other bytes is refused at the join with the field named
 * ("init_digest"). The same bytes are then parsed and loaded (nothing is
 * read from the disk twice), before the optimizer exists.
 */
#include "config.h"

#include "train/train-internal.h"

#include "common/util.h"
#include "train/ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* safetensors' own limit is 100 MB of header; weights are far below. */
#define INIT_MAX_BYTES ((size_t)16 << 30)

int train_init_read(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    uint8_t d[32];
    size_t cap = 0;
    int rc, i;

    if (!c->init)
        return 0;
    rc = mesh_file_read(c->init, INIT_MAX_BYTES, "a weights file", &t->init_buf,
                        &cap, &t->init_len);
    if (rc < 0)
        return mesh_err_prefix(rc, "--init");
    rc = mesh_ckpt_sha256(t->init_buf, t->init_len, d);
    if (rc < 0)
        return rc;
    for (i = 0; i < 32; i++)
        snprintf(t->init_digest + 2 * i, 3, "%02x", d[i]);
    return 0;
}

/*
 * Each line of notes, as "--init FILE: LINE": on stderr as errors, else
 * logged (info, also under --quiet: what was re-initialised matters).
 */
static void print_lines(const struct trainer *t, int error, const char *notes)
{
    const char *p = notes;

    while (p && *p) {
        size_t len = strcspn(p, "\n");

        if (error)
            fprintf(stderr, "meshtrain: rank %d: --init %s: %.*s\n", t->rank,
                    t->c->init, (int)len, p);
        else
            mesh_info("--init %s: %.*s", t->c->init, (int)len, p);
        p += len;
        if (*p == '\n')
            p++;
    }
    fflush(stderr);
}

int train_init_apply(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    char *notes = NULL;
    int rc;

    if (c->init_skip && !c->init)
        return mesh_err(-EINVAL, "--init-skip needs --init");
    if (c->init_skip) {
        rc = mesh_nn_pattern_check(t->model, "--init-skip", c->init_skip);
        if (rc < 0)
            return rc;
    }
    if (!c->init)
        return 0;
    rc = mesh_nn_model_init_from(t->model, t->init_buf, t->init_len, c->init,
                                 c->init_skip, &notes);
    if (rc < 0) {
        /* every peer holds the same bytes (the join checked): rank 0
         * lists what does not fit, each peer says the error */
        if (t->rank == 0)
            print_lines(t, 1, notes);
        free(notes);
        return mesh_err_prefix(rc, "--init");
    }
    if (t->rank == 0) {
        print_lines(t, 0, notes);
        mesh_info("started from %s (sha256 %.16s...)", c->init, t->init_digest);
    }
    free(notes);
    free(t->init_buf);
    t->init_buf = NULL;
    return 0;
}

int train_freeze_apply(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    size_t n;
    int rc;

    if (!c->freeze)
        return 0;
    rc = mesh_nn_pattern_check(t->model, "--freeze", c->freeze);
    if (rc == 0)
        rc = mesh_nn_model_freeze(t->model, c->freeze);
    if (rc < 0)
        return rc;
    n = mesh_nn_model_frozen_params(t->model);
    if (t->rank == 0)
        mesh_info("--freeze %s: %zu of %zu parameters frozen, %zu trained",
                  c->freeze, n, t->nparams, t->nparams - n);
    return 0;
}

int train_finetune_config(const struct trainer *t, char *buf, size_t cap,
                          int core)
{
    const struct train_cfg *c = t->c;
    int n;

    /* nothing when unused, so earlier runs' digests stay the same */
    if (core)
        n = c->freeze ? snprintf(buf, cap, "freeze=%s\n", c->freeze) : 0;
    else
        n = snprintf(buf, cap, "%s%s%s%s%s%s%s", c->init ? "init_digest=" : "",
                     c->init ? t->init_digest : "", c->init ? "\n" : "",
                     c->init_skip ? "init_skip=" : "",
                     c->init_skip ? c->init_skip : "", c->init_skip ? "\n" : "",
                     c->eval_only ? "eval_only=1\n" : "");
    /* every peer joins --predict's collectives */
    if (!core && n >= 0 && (size_t)n < cap && c->predict)
        n += snprintf(buf + n, cap - (size_t)n, "predict=%s\n", c->predict);
    if (n < 0 || (size_t)n >= cap)
        return mesh_err(-EINVAL, "configuration too long");
    return n;
}

int train_eval_report(struct trainer *t, double top1, double top5)
{
    const struct train_cfg *c = t->c;
    const char *from = c->init ? c->init : "the checkpoint";

    if (t->rank != 0)
        return 0;
    printf("eval-only (%s): test accuracy of %.0f samples over %d peer(s): "
           "top-1 %.2f %% top-5 %.2f %%\n",
           from, t->eval_samples, t->size, top1, top5);
    fflush(stdout);
    if (!t->metrics)
        return 0;
    fprintf(t->metrics,
            "{\"eval_only\": true, \"samples\": %.0f, \"top1\": %.4f, "
            "\"top5\": %.4f, \"peers\": %d, \"batch\": %d}\n",
            t->eval_samples, top1, top5, t->size, c->batch);
    if (fflush(t->metrics) != 0)
        return train_local(t, mesh_err_errno("--metrics %s", c->metrics));
    return 0;
}

void train_freeze_report(const struct trainer *t)
{
    size_t sum = 0;
    int i;

    if (!t->c->freeze || t->rank != 0 || !t->gs)
        return;
    for (i = 0; i < mesh_gradsync_num_buckets(t->gs); i++)
        sum += mesh_gradsync_bucket_floats(t->gs, i);
    mesh_info("--freeze: the gradient buckets average %zu of the %zu "
              "parameters' gradients",
              sum, t->nparams);
}

/* ---- --predict ----------------------------------------------------------- */

#define PRED_K 5 /* top-5 */

/* One image's result: classes (as floats, exact) and probabilities. */
struct pred {
    float cls[PRED_K], prob[PRED_K];
};

/* Softmax of n logits, the k best (ties: the lower class, as a stable
 * sort would). */
static void top_k(const float *l, int n, int k, struct pred *out)
{
    double mx = l[0], sum = 0;
    int i, j, m;

    for (i = 1; i < n; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (i = 0; i < n; i++)
        sum += exp((double)l[i] - mx);
    for (j = 0; j < k; j++) {
        int best = -1;

        for (i = 0; i < n; i++) {
            int taken = 0;

            for (m = 0; m < j; m++)
                taken |= (int)out->cls[m] == i;
            if (!taken && (best < 0 || l[i] > l[best]))
                best = i;
        }
        out->cls[j] = (float)best;
        out->prob[j] = (float)(exp((double)l[best] - mx) / sum);
    }
}

/* One record per peer for predict_agree: the count and a digest of the
 * sorted file names. */
struct listing {
    uint64_t n;
    uint8_t digest[32];
};

/* SHA-256 of ds's file names (relative, each with its NUL), or zeros. */
static int names_digest(struct mesh_dataset *ds, uint64_t n, uint8_t out[32])
{
    size_t len = 0, i;
    char *buf, *q;
    int rc;

    memset(out, 0, 32);
    for (i = 0; i < n; i++)
        len += strlen(mesh_data_sample_path(ds, MESH_DATA_EVAL, i)) + 1;
    buf = malloc(len + 1);
    if (!buf)
        return mesh_err(-ENOMEM, "out of memory");
    for (i = 0, q = buf; i < n; i++) {
        const char *p = mesh_data_sample_path(ds, MESH_DATA_EVAL, i);

        memcpy(q, p, strlen(p) + 1);
        q += strlen(p) + 1;
    }
    rc = mesh_ckpt_sha256(buf, len, out);
    free(buf);
    return rc;
}

/* Every peer must list the same images (count and names): else every
 * peer fails alike, naming the first that differs from rank 0. */
static int predict_agree(struct trainer *t, struct mesh_dataset *ds, uint64_t n)
{
    struct listing mine, *all;
    int r, rc;

    memset(&mine, 0, sizeof(mine));
    mine.n = n;
    if (ds && (rc = names_digest(ds, n, mine.digest)) < 0)
        return rc;
    if (!t->coll)
        return 0;
    all = calloc((size_t)t->size, sizeof(*all));
    if (!all)
        return mesh_err(-ENOMEM, "out of memory");
    rc = mesh_coll_allgather(t->coll, &mine, all, sizeof(mine), MESH_DT_BYTE);
    for (r = 1; rc == 0 && r < t->size; r++) {
        if (all[r].n == all[0].n && !memcmp(all[r].digest, all[0].digest, 32))
            continue;
        t->agreed_err = 1;
        t->local_err = 1;
        if (all[r].n != all[0].n)
            rc = mesh_err(-EINVAL,
                          "--predict %s: rank 0 lists %" PRIu64 " images, "
                          "rank %d %" PRIu64 " (every peer needs the same "
                          "folder)",
                          t->c->predict, all[0].n, r, all[r].n);
        else
            rc = mesh_err(-EINVAL,
                          "--predict %s: rank 0 and rank %d list %" PRIu64
                          " images under other names (every peer needs "
                          "the same folder)",
                          t->c->predict, r, all[0].n);
    }
    free(all);
    return rc;
}

/* A CSV field: quoted when it holds a comma, a quote or a line break. */
static void csv_field(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Class k by name (an imagefolder's folder), else its number. */
static const char *class_label(struct mesh_dataset *ds, int k, char buf[16])
{
    const char *name = mesh_data_class_name(ds, k);

    if (strcmp(name, "class") != 0)
        return name; /* a folder's name, or "0".."9" */
    snprintf(buf, 16, "%d", k);
    return buf;
}

/* Rank 0: the CSV of every image, all[r * per + j] being image j*size+r. */
static int predict_write(struct trainer *t, struct mesh_dataset *ds,
                         const struct pred *all, size_t per, uint64_t n, int k)
{
    const char *path = t->c->predict_out;
    FILE *f = fopen(path, "w");
    uint64_t i;
    int j, rc = 0;

    if (!f)
        return mesh_err_errno("--predict-out %s", path);
    fprintf(f, "image");
    for (j = 1; j <= k; j++)
        fprintf(f, ",top%d,p%d", j, j);
    fprintf(f, "\n");
    for (i = 0; i < n; i++) {
        const struct pred *p = &all[(size_t)(i % (uint64_t)t->size) * per +
                                    (size_t)(i / (uint64_t)t->size)];
        char buf[16];

        csv_field(f, mesh_data_sample_path(ds, MESH_DATA_EVAL, (size_t)i));
        for (j = 0; j < k; j++) {
            fputc(',', f);
            csv_field(f, class_label(ds, (int)p->cls[j], buf));
            fprintf(f, ",%.6f", (double)p->prob[j]);
        }
        fputc('\n', f);
    }
    if (ferror(f))
        rc = mesh_err(-EIO, "--predict-out %s: write error", path);
    if (fclose(f) != 0 && rc == 0)
        rc = mesh_err_errno("--predict-out %s", path);
    return rc;
}

int train_predict(struct trainer *t)
{
    const struct train_cfg *c = t->c;
    struct mesh_dataset *ds = NULL;
    struct mesh_loader *ld = NULL;
    struct mesh_loader_opts lo;
    struct mesh_data_info info;
    struct mesh_batch b;
    struct pred *mine = NULL, *all = NULL;
    float *logits = NULL;
    uint64_t n = 0;
    size_t per, got = 0;
    int classes = t->mcfg.num_classes, k, rc, i;

    if (!c->predict)
        return 0;
    k = classes < PRED_K ? classes : PRED_K;
    /* a peer that cannot open the folder still joins the count check,
     * so that its peers do not wait for it */
    rc = mesh_data_open_predict(t->ds, c->predict, &ds);
    if (rc == 0) {
        mesh_data_get_info(ds, &info);
        n = info.eval_count;
    }
    if (predict_agree(t, rc == 0 ? ds : NULL, n) < 0 || rc < 0) {
        mesh_data_close(ds);
        return rc < 0 ? train_local(t, rc) : -EINVAL;
    }
    per = (size_t)((n + (uint64_t)t->size - 1) / (uint64_t)t->size);
    memset(&lo, 0, sizeof(lo));
    lo.split = MESH_DATA_EVAL;
    lo.batch = c->batch;
    lo.rank = t->rank;
    lo.world = t->size;
    lo.threads = c->data_threads;
    lo.augment = 0;
    rc = mesh_loader_create(ds, &lo, &ld);
    mine = calloc(per + 1, sizeof(*mine));
    all = calloc(per * (size_t)t->size + 1, sizeof(*all));
    logits = malloc((size_t)c->batch * (size_t)classes * sizeof(float));
    if (rc == 0 && (!mine || !all || !logits))
        rc = mesh_err(-ENOMEM, "--predict: out of memory");
    if (rc == 0)
        rc = mesh_data_seek(ld, 0, 0);
    while (rc == 0 && (rc = mesh_data_next(ld, &b)) == 0) {
        rc = mesh_nn_model_forward(t->model, b.n, b.x, 0);
        if (rc == 0)
            rc = mesh_nn_model_logits(t->model, logits);
        for (i = 0; rc == 0 && i < b.n && got < per; i++)
            top_k(logits + (size_t)i * (size_t)classes, classes, k,
                  &mine[got++]);
    }
    if (rc > 0)
        rc = 0; /* the end of the folder */
    if (rc < 0)
        rc = train_local(t, mesh_err_prefix(rc, "--predict %s", c->predict));
    /* a peer that failed still joins the gather (its rows zero): the
     * collective sequence stays the same everywhere */
    if (t->coll) {
        int rc2 = mesh_coll_allgather(t->coll, mine, all, per * sizeof(*mine),
                                      MESH_DT_BYTE);

        if (rc == 0)
            rc = rc2;
    } else {
        memcpy(all, mine, per * sizeof(*mine));
    }
    if (rc == 0 && t->rank == 0) {
        rc = train_local(t, predict_write(t, ds, all, per, n, k));
        if (rc == 0 && !c->quiet)
            printf("predict: %" PRIu64 " images of %s, top-%d classes in "
                   "%s\n",
                   n, c->predict, k, c->predict_out);
    }
    free(logits);
    free(all);
    free(mine);
    mesh_loader_destroy(ld);
    mesh_data_close(ds);
    return rc;
}
