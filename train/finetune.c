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
        return rc;
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
    printf("eval-only (%s): %.0f test samples over %d peer(s): top-1 "
           "%.2f %% top-5 %.2f %%\n",
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
