/*
 * train/checkpoint.c: the trainer's checkpoints, what they hold and how a
 * run resumes from them (the file format: train/ckpt.h).
 */
#include "config.h"

#include "train/train-internal.h"

#include "common/bytes.h"
#include "common/util.h"
#include "train/ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define RESUME_MAX_ENTRIES  32
#define TRAINER_STATE_MAGIC UINT64_C(0x31726e6961727474) /* "ttrainr1" */
/* The trainer record: magic, step, the loader's epoch, the optimizer's
 * steps, BN's num_batches_tracked, then the next step's data position
 * (epoch, position in its permutation: struct trainer's d_epoch, d_pos).
 * Records of 40 bytes (before the position) are read too: their position
 * is that of a run of one view. */
#define TRAINER_STATE_BYTES 56
#define TRAINER_STATE_OLD   40

int train_ckpt_dir(const struct trainer *t, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s/rank-%d", t->c->checkpoint_dir, t->rank);

    if (n < 0 || (size_t)n >= cap)
        return mesh_err(-ENAMETOOLONG, "--checkpoint-dir %s: path too long",
                        t->c->checkpoint_dir);
    /* DIR itself; mesh_ckpt_begin makes DIR/rank-R */
    if (mkdir(t->c->checkpoint_dir, 0777) < 0 && errno != EEXIST)
        return mesh_err_errno("--checkpoint-dir %s", t->c->checkpoint_dir);
    return 0;
}

/*
 * Checkpoint after `step` optimizer steps: the weights and averaged BN
 * statistics (safetensors), the momentum, the trainer's counters (shared,
 * identical on every peer), the loader's position, this peer's own BN
 * statistics (training goes on from them, not from the average) and,
 * with sparse gradients' error feedback, the residual (this peer's own).
 */
int train_ckpt_write(struct trainer *t, uint64_t step)
{
    struct mesh_ckpt_writer *w = NULL;
    struct mesh_ckpt_meta meta;
    uint8_t state[TRAINER_STATE_BYTES], lstate[MESH_DATA_STATE_BYTES];
    char dir[1024], path[1200];
    uint64_t epoch, lstep;
    float *mom;
    int rc;

    rc = train_bn_keep(t);
    if (rc == 0)
        rc = train_bn_average(t);
    if (rc < 0)
        return rc;
    rc = train_ckpt_dir(t, dir, sizeof(dir));
    if (rc == 0)
        rc = mesh_ckpt_begin(dir, step, &w);
    if (rc < 0)
        return train_local(t, rc);
    train_fault(t, TRAIN_FAULT_CHECKPOINT); /* a test aid */
    rc = mesh_ckpt_put_file(w, "model.safetensors", MESH_CKPT_SHARED, path,
                            sizeof(path));
    if (rc == 0)
        rc = mesh_nn_model_save(t->model, path);
    if (rc == 0)
        mom = train_momentum_host(t, &rc);
    if (rc == 0)
        rc =
            mesh_ckpt_put(w, "momentum", mom, t->nparams * 4, MESH_CKPT_SHARED);
    mesh_data_tell(t->train_ld, &epoch, &lstep);
    mesh_put_le64(state, TRAINER_STATE_MAGIC);
    mesh_put_le64(state + 8, step);
    mesh_put_le64(state + 16, epoch);
    mesh_put_le64(state + 24, (uint64_t)mesh_nn_sgd_steps(t->sgd));
    mesh_put_le64(state + 32,
                  (uint64_t)mesh_nn_model_batches_tracked(t->model));
    mesh_put_le64(state + 40, t->d_epoch);
    mesh_put_le64(state + 48, t->d_pos);
    if (rc == 0)
        rc =
            mesh_ckpt_put(w, "trainer", state, sizeof(state), MESH_CKPT_SHARED);
    mesh_data_get_state(t->train_ld, lstate);
    if (rc == 0)
        rc = mesh_ckpt_put(w, "loader", lstate, sizeof(lstate), 0);
    if (rc == 0 && t->bn_own)
        rc = mesh_ckpt_put(w, "bn_own", t->bn_own, t->nbuffers * 4, 0);
    if (rc == 0 && mesh_gradsync_residual(t->gs))
        rc = mesh_ckpt_put(w, "residual", mesh_gradsync_residual(t->gs),
                           t->nparams * 4, 0);
    /* the digested configuration as text, so that a refused --resume can
     * name what differs (not shared: the agreement digest stays what it
     * was) */
    if (rc == 0 && t->config_core)
        rc = mesh_ckpt_put(w, "config", t->config, t->config_core, 0);
    if (rc == 0)
        rc = train_bn_restore(t);
    if (rc < 0) {
        mesh_ckpt_abort(w);
        return train_local(t, rc);
    }
    memset(&meta, 0, sizeof(meta));
    meta.step = step;
    meta.epoch = epoch;
    memcpy(meta.config, t->config_digest, 32);
    rc = train_local(t, mesh_ckpt_commit(w, &meta, NULL));
    if (rc == 0)
        rc = train_local(t, mesh_ckpt_prune(dir, t->c->keep));
    if (rc == 0)
        mesh_info("checkpoint %s/ckpt-%09" PRIu64 " written", dir, step);
    return rc;
}

/*
 * --resume found no checkpoint to continue from: why (the agreement's
 * message, or none at all), which ranks hold damaged ones, and this
 * rank's own damaged files. --resume=if-any starts from step 0 with a
 * warning; --resume is an error of the configuration (exit 1): the
 * checkpoints it asked for are not there.
 */
static int resume_none(struct trainer *t, const char *why,
                       const uint64_t *damaged,
                       const struct mesh_ckpt_damage *mine)
{
    char ranks[256] = "", here[sizeof(mine->list) + 64] = "";
    int r, n = 0;

    for (r = 0; r < t->size; r++) {
        size_t len = strlen(ranks);

        if (!damaged[r])
            continue;
        n++;
        if (len < sizeof(ranks) - 16)
            snprintf(ranks + len, sizeof(ranks) - len, "%s%d", len ? ", " : "",
                     r);
    }
    if (mine->count)
        snprintf(here, sizeof(here), "; damaged here: %s", mine->list);
    if (t->c->resume == TRAIN_RESUME_IF_ANY) {
        mesh_warn("--resume=if-any: %s%s%s%s: starting from step 0", why,
                  n ? " (damaged checkpoints on rank(s) " : "", ranks,
                  n ? ")" : "");
        return 0;
    }
    /* every peer decides this from the same gathered scans */
    t->agreed_err = 1;
    return train_local(t, mesh_err(-ENOENT,
                                   "--resume: %s%s%s%s (--resume=if-any would "
                                   "start from step 0)",
                                   why,
                                   n ? "; damaged checkpoints on rank(s) " : "",
                                   ranks, here));
}

/* Every peer's scan, all-gathered: its newest entries, how many were
 * damaged. */
struct scans {
    struct mesh_ckpt_entry *all;          /* size x RESUME_MAX_ENTRIES */
    const struct mesh_ckpt_entry **lists; /* rank r's: all + r x MAX */
    size_t *counts, total;
    uint64_t *damaged;
};

static void scans_free(struct scans *sc)
{
    free(sc->all);
    free(sc->damaged);
    free(sc->counts);
    free(sc->lists);
}

/* Unpack rank r's record of the all-gather into sc. */
static int scans_unpack(struct scans *sc, int r, const uint8_t *g)
{
    uint64_t n = mesh_get_le64(g);
    size_t i;

    if (n > RESUME_MAX_ENTRIES)
        return mesh_err(-EPROTO,
                        "--resume: rank %d sent %" PRIu64 " checkpoint entries",
                        r, n);
    sc->lists[r] = sc->all + (size_t)r * RESUME_MAX_ENTRIES;
    sc->counts[r] = n;
    sc->damaged[r] = mesh_get_le64(g + 8);
    sc->total += n;
    for (i = 0; i < n; i++)
        mesh_ckpt_entry_unpack(g + 16 + i * MESH_CKPT_ENTRY_BYTES,
                               &sc->all[(size_t)r * RESUME_MAX_ENTRIES + i]);
    return 0;
}

/*
 * All-gather every rank's count, damaged count and entries (its nmine
 * newest, at most RESUME_MAX_ENTRIES) into sc (scans_free frees it).
 */
static int scans_gather(struct trainer *t, const struct mesh_ckpt_entry *mine,
                        size_t nmine, uint64_t ndamaged, struct scans *sc)
{
    size_t rec = 16 + RESUME_MAX_ENTRIES * MESH_CKPT_ENTRY_BYTES, i;
    uint8_t *pack = calloc(1, rec), *gathered;
    int r, rc = 0;

    gathered = calloc((size_t)t->size, rec);
    sc->lists = calloc((size_t)t->size, sizeof(*sc->lists));
    sc->counts = calloc((size_t)t->size, sizeof(*sc->counts));
    sc->damaged = calloc((size_t)t->size, sizeof(*sc->damaged));
    sc->all =
        calloc((size_t)t->size * RESUME_MAX_ENTRIES + 1, sizeof(*sc->all));
    if (!pack || !gathered || !sc->lists || !sc->counts || !sc->damaged ||
        !sc->all) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    mesh_put_le64(pack, nmine);
    mesh_put_le64(pack + 8, ndamaged);
    for (i = 0; i < nmine; i++)
        mesh_ckpt_entry_pack(&mine[i], pack + 16 + i * MESH_CKPT_ENTRY_BYTES);
    if (t->coll)
        rc = mesh_coll_allgather(t->coll, pack, gathered, rec, MESH_DT_BYTE);
    else
        memcpy(gathered, pack, rec);
    for (r = 0; rc == 0 && r < t->size; r++)
        rc = scans_unpack(sc, r, gathered + (size_t)r * rec);
out:
    free(gathered);
    free(pack);
    return rc;
}

/* " (bf16-amp)" after a "precision=N" line of the configuration text,
 * whose number is enum mesh_nn_precision's; else "". */
static const char *prec_name(const char *line)
{
    unsigned v;

    if (!line || sscanf(line, "precision=%u", &v) != 1)
        return "";
    switch (v) {
    case MESH_NN_PREC_DEFAULT:
        return " (default)";
    case MESH_NN_PREC_FP32:
        return " (fp32)";
    case MESH_NN_PREC_TF32:
        return " (tf32)";
    case MESH_NN_PREC_BF16_AMP:
        return " (bf16-amp)";
    }
    return "";
}

/*
 * What differs between the configuration text that checkpoint step of dir
 * was written with (its "config" blob, where it has one) and this run's:
 * "accumulate=1 there, accumulate=2 here; ..." (the first few) into why,
 * or "" when the checkpoint has none to compare.
 */
static void config_diff(const struct trainer *t, const char *dir, uint64_t step,
                        char *why, size_t cap)
{
    struct mesh_ckpt *ck = NULL;
    char path[1200], *there = NULL, *mine, *save = NULL, *line, *grown;
    size_t len = 0, n = 0;
    int shown = 0, more = 0;

    why[0] = '\0';
    mine = strndup(t->config, t->config_core);
    if (!mine || mesh_ckpt_path(dir, step, path, sizeof(path)) < 0 ||
        mesh_ckpt_open(path, &ck) < 0 ||
        mesh_ckpt_read(ck, "config", (void **)&there, &len) < 0)
        goto out;
    grown = realloc(there, len + 1);
    if (!grown)
        goto out;
    there = grown;
    there[len] = '\0';
    /* lines of ours that the checkpoint's text lacks, each with the
     * checkpoint's line of the same key */
    for (line = strtok_r(mine, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        const char *eq = strchr(line, '=');
        size_t key = eq ? (size_t)(eq - line) + 1 : strlen(line);
        const char *p, *other = NULL;
        size_t l;
        int same = 0;

        for (p = there; *p; p += l + (p[l] == '\n')) {
            l = strcspn(p, "\n");
            if (l == strlen(line) && !strncmp(p, line, l))
                same = 1;
            else if (l >= key && !strncmp(p, line, key))
                other = p;
        }
        if (same)
            continue;
        if (shown == 3) {
            more++;
            continue;
        }
        if (n < cap)
            n += (size_t)snprintf(why + n, cap - n, "%s%.*s%s there, %s%s here",
                                  shown ? "; " : "",
                                  other ? (int)strcspn(other, "\n") : 4,
                                  other ? other : "none", prec_name(other),
                                  line, prec_name(line));
        shown++;
    }
    if (more && n < cap)
        snprintf(why + n, cap - n, "; and %d more", more);
out:
    mesh_ckpt_close(ck);
    free(there);
    free(mine);
}

/*
 * The newest step that every peer holds with the same agreement digest:
 * 1 and *step, or 0 when there is none, after resume_none (then an error,
 * or 0 with --resume=if-any). Errors when this rank's checkpoint of that
 * step was written with another configuration.
 */
static int resume_pick(struct trainer *t, const char *dir,
                       const struct scans *sc,
                       const struct mesh_ckpt_entry *mine, size_t nmine,
                       const struct mesh_ckpt_damage *damage, uint64_t *step)
{
    char why[1200];
    size_t i;
    int rc;

    *step = 0;
    if (sc->total == 0) {
        snprintf(why, sizeof(why), "no peer has a usable checkpoint in %s",
                 t->c->checkpoint_dir);
        return resume_none(t, why, sc->damaged, damage);
    }
    rc = mesh_ckpt_agree(sc->lists, sc->counts, t->size, step);
    if (rc == -ENOENT) {
        const char *msg = mesh_err_msg(rc);

        if (!strncmp(msg, "--resume: ", 10))
            msg += 10;
        snprintf(why, sizeof(why), "%s", msg);
        *step = 0;
        return resume_none(t, why, sc->damaged, damage);
    }
    if (rc < 0)
        return rc;
    for (i = 0; i < nmine; i++)
        if (mine[i].step == *step &&
            memcmp(mine[i].config, t->config_digest, 32) != 0) {
            config_diff(t, dir, *step, why, sizeof(why));
            return mesh_err(-EINVAL,
                            "--resume: checkpoint %s/ckpt-%09" PRIu64
                            " was written with another configuration "
                            "(model, data, batch, seed, optimizer or peer "
                            "count)%s%s",
                            dir, *step, why[0] ? ": " : "", why);
        }
    return 1;
}

/*
 * The next step's data position from the trainer record. A view with
 * another global batch (--elastic) moved it off the multiples of this
 * view's, which the loader's record (a step within its layout) cannot
 * hold: lay the loader out from it, as a view change does.
 */
static int resume_position(struct trainer *t, const char *path, uint64_t epoch,
                           uint64_t pos)
{
    uint64_t g = (uint64_t)t->slots * (uint64_t)t->c->batch, e, s;

    if (pos > t->info.train_count || epoch > t->total_steps)
        return mesh_err(-EIO,
                        "%s/trainer: data position %" PRIu64 " of epoch "
                        "%" PRIu64 " is past the %" PRIu64 " samples or the "
                        "run",
                        path, pos, epoch, (uint64_t)t->info.train_count);
    t->d_epoch = epoch;
    t->d_pos = pos;
    t->d_restored = 1;
    mesh_data_tell(t->train_ld, &e, &s);
    if (e == epoch && s * g == pos)
        return 0;
    return mesh_data_layout(t->train_ld, epoch, pos, t->slots, t->rank,
                            t->size);
}

/* Load the weights, the momentum, the trainer's counters, the loader's
 * position and the residual (sparse gradients) from the checkpoint ck of
 * step. */
static int resume_load(struct trainer *t, struct mesh_ckpt *ck,
                       const char *path, uint64_t step)
{
    uint8_t *state = NULL;
    void *lstate = NULL;
    size_t llen = 0, slen = 0;
    char st[1300];
    int rc;

    rc = mesh_ckpt_blob_path(ck, "model.safetensors", st, sizeof(st));
    if (rc == 0)
        rc = mesh_nn_model_load(t->model, st);
    if (rc == 0) {
        float *mom = t->host_slabs ? mesh_nn_sgd_momentum(t->sgd) : t->hmom;

        rc = mesh_ckpt_read_into(ck, "momentum", mom, t->nparams * 4);
        if (rc == 0 && !t->host_slabs)
            rc = mesh_nn_upload(t->ctx, mesh_nn_sgd_momentum(t->sgd), mom,
                                t->nparams * 4);
    }
    if (rc == 0)
        rc = mesh_ckpt_read(ck, "trainer", (void **)&state, &slen);
    if (rc == 0 &&
        ((slen != TRAINER_STATE_BYTES && slen != TRAINER_STATE_OLD) ||
         mesh_get_le64(state) != TRAINER_STATE_MAGIC ||
         mesh_get_le64(state + 8) != step))
        rc = mesh_err(-EIO,
                      "%s/trainer: not a meshtrain trainer record for "
                      "step %" PRIu64,
                      path, step);
    if (rc == 0) {
        mesh_nn_sgd_set_steps(t->sgd, (int64_t)mesh_get_le64(state + 24));
        mesh_nn_model_set_batches_tracked(t->model,
                                          (int64_t)mesh_get_le64(state + 32));
        rc = mesh_ckpt_read(ck, "loader", &lstate, &llen);
    }
    /* --eval-only on a training split too small for a step has none */
    if (rc == 0 && t->train_ld)
        rc = mesh_data_set_state(t->train_ld, lstate, llen);
    if (rc == 0 && t->train_ld && slen == TRAINER_STATE_BYTES)
        rc = resume_position(t, path, mesh_get_le64(state + 40),
                             mesh_get_le64(state + 48));
    /* this peer's own BN statistics, where the checkpoint has them (the
     * model's are their average) */
    if (rc == 0 && t->nbuffers && !t->sim &&
        mesh_ckpt_blob_path(ck, "bn_own", st, sizeof(st)) == 0) {
        rc = train_bn_keep(t);
        if (rc == 0)
            rc = mesh_ckpt_read_into(ck, "bn_own", t->bn_own, t->nbuffers * 4);
        if (rc == 0)
            rc = train_bn_restore(t);
    }
    /* the configuration digest (error_feedback=1) agreed: it must be here */
    if (rc == 0 && mesh_gradsync_residual(t->gs)) {
        rc = mesh_ckpt_read_into(ck, "residual", mesh_gradsync_residual(t->gs),
                                 t->nparams * 4);
        if (rc == -ENOENT)
            rc = mesh_err(rc,
                          "%s: no residual (the error feedback of "
                          "--compress topk or threshold)",
                          path);
    }
    free(lstate);
    free(state);
    return rc;
}

/*
 * --resume: every peer scans its directory, the scans are all-gathered
 * (RESUME_MAX_ENTRIES newest of each, and how many were damaged), and
 * every peer picks the newest step that all hold with the same agreement
 * digest. When there is none (no checkpoint at all, only damaged ones, or
 * none in common), resume_none decides: an error, or *step = 0 with
 * --resume=if-any.
 */
int train_ckpt_resume(struct trainer *t, uint64_t *step_out)
{
    struct mesh_ckpt_entry *mine = NULL;
    struct mesh_ckpt_damage damage;
    struct scans sc = {0};
    struct mesh_ckpt *ck = NULL;
    char dir[1024], path[1200];
    uint64_t step = 0;
    size_t nmine = 0;
    int rc;

    rc = train_ckpt_dir(t, dir, sizeof(dir));
    if (rc == 0)
        rc = mesh_ckpt_scan(dir, &mine, &nmine, &damage);
    if (rc < 0)
        return train_local(t, rc);
    if (nmine > RESUME_MAX_ENTRIES)
        nmine = RESUME_MAX_ENTRIES; /* newest first */
    rc = scans_gather(t, mine, nmine, damage.count, &sc);
    if (rc == 0)
        rc = resume_pick(t, dir, &sc, mine, nmine, &damage, &step);
    if (rc == 0)
        *step_out = 0;
    if (rc <= 0)
        goto out;
    rc = mesh_ckpt_path(dir, step, path, sizeof(path));
    if (rc == 0)
        rc = mesh_ckpt_open(path, &ck);
    if (rc < 0)
        goto out;
    rc = resume_load(t, ck, path, step);
    if (rc < 0)
        rc = mesh_err_prefix(rc, "--resume from %s", path);
    if (rc == 0) {
        if (t->rank == 0)
            mesh_info("resumed from step %" PRIu64 " (%s)", step, path);
        *step_out = step;
    }
out:
    mesh_ckpt_close(ck);
    scans_free(&sc);
    free(mine);
    return rc;
}
