/*
 * tests/test_ckpt.c: checkpoint round trip, agreement digest, corruption
 * (bit flip, truncation, stray and missing files), atomicity (stale
 * temporary directories, aborted writers) and --keep pruning.
 */
#include "config.h"

#include "nn/safetensors.h"
#include "train/ckpt.h"
#include "common/util.h"
#include "tests/tap.h"
#include "tests/tmpdir.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define WLEN (1u << 20)

static char tmp[256];

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
}

/* One checkpoint: weights (shared, from wseed), momentum (shared), a
 * per-peer data state (not shared) and a caller-written file. */
static int write_ckpt(const char *dir, uint64_t step, uint32_t wseed,
                      uint32_t state_seed, uint8_t *digest)
{
    static uint8_t w[WLEN], m[4096], st[64];
    struct mesh_ckpt_writer *wr;
    struct mesh_ckpt_meta meta = {.step = step, .epoch = step / 100};
    char path[4200];
    FILE *f;
    int rc;

    fill(w, sizeof(w), wseed);
    fill(m, sizeof(m), wseed + 1);
    fill(st, sizeof(st), state_seed);
    memset(meta.config, 0xab, sizeof(meta.config));
    rc = mesh_ckpt_begin(dir, step, &wr);
    if (rc < 0)
        return rc;
    if ((rc = mesh_ckpt_put(wr, "weights", w, sizeof(w), MESH_CKPT_SHARED)) <
            0 ||
        (rc = mesh_ckpt_put(wr, "momentum", m, sizeof(m), MESH_CKPT_SHARED)) <
            0 ||
        (rc = mesh_ckpt_put(wr, "data.state", st, sizeof(st), 0)) < 0 ||
        (rc = mesh_ckpt_put_file(wr, "model.safetensors", MESH_CKPT_SHARED,
                                 path, sizeof(path))) < 0) {
        mesh_ckpt_abort(wr);
        return rc;
    }
    f = fopen(path, "wb");
    if (!f) {
        mesh_ckpt_abort(wr);
        return -EIO;
    }
    fprintf(f, "safetensors stand-in, weights %u", (unsigned)wseed);
    fclose(f);
    return mesh_ckpt_commit(wr, &meta, digest);
}

static void flip_byte(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    int c;

    fseek(f, off, SEEK_SET);
    c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static int open_err(const char *path, const char *want)
{
    struct mesh_ckpt *c = NULL;
    int rc = mesh_ckpt_open(path, &c);

    mesh_ckpt_close(c);
    diag("%s", rc < 0 ? mesh_err_msg(rc) : "opened");
    return rc < 0 && strstr(mesh_err_msg(rc), want) != NULL;
}

int main(void)
{
    char dir[300], p[4300], bp[4400], livep[4400], otherp[4700], host[256] = "";
    uint8_t d1[32], d2[32], d3[32], dg[32];
    uint8_t *w = malloc(WLEN), *ref = malloc(WLEN);
    struct mesh_ckpt *c = NULL;
    struct mesh_ckpt_meta meta;
    uint64_t *steps = NULL;
    size_t n = 0, len = 0;
    void *data = NULL;
    pid_t dead, live;
    int rc;

    if (tmpdir_make(tmp, sizeof(tmp), "test_ckpt") < 0) {
        skip_all("cannot create a temporary directory");
        return 0;
    }
    plan(33);
    snprintf(dir, sizeof(dir), "%s/ck", tmp);

    /* Round trip. */
    rc = write_ckpt(dir, 100, 1, 1, d1);
    ok(rc == 0, "write checkpoint 100: %s", rc ? mesh_err_msg(rc) : "ok");
    mesh_ckpt_path(dir, 100, p, sizeof(p));
    rc = mesh_ckpt_open(p, &c);
    ok(rc == 0, "open and verify it: %s", rc ? mesh_err_msg(rc) : "ok");
    if (rc == 0) {
        mesh_ckpt_get_meta(c, &meta);
        mesh_ckpt_get_digest(c, dg);
        fill(ref, WLEN, 1);
        rc = mesh_ckpt_read(c, "weights", &data, &len);
        ok(meta.step == 100 && meta.epoch == 1 && meta.config[7] == 0xab &&
               !memcmp(dg, d1, 32) && mesh_ckpt_blob_count(c) == 4 &&
               !strcmp(mesh_ckpt_blob_name(c, 3), "model.safetensors"),
           "step, epoch, config, digest and blob list come back");
        ok(rc == 0 && len == WLEN && !memcmp(data, ref, WLEN),
           "the weights blob comes back byte for byte");
        free(data);
        rc = mesh_ckpt_read_into(c, "momentum", w, 100);
        ok(rc == -EIO && strstr(mesh_err_msg(rc), "4096 bytes"),
           "reading a blob into a buffer of another size fails: %s",
           mesh_err_msg(rc));
        rc = mesh_ckpt_blob_path(c, "model.safetensors", bp, sizeof(bp));
        ok(rc == 0 && access(bp, R_OK) == 0 &&
               mesh_ckpt_read(c, "nope", &data, &len) == -ENOENT,
           "a caller-written file has a path; an absent blob is -ENOENT");
        mesh_ckpt_close(c);
        c = NULL;
    } else {
        for (int i = 0; i < 4; i++)
            skip("no checkpoint");
    }

    /* Agreement digest: shared blobs only. */
    rc = write_ckpt(dir, 200, 1, 2, d2);
    rc |= write_ckpt(dir, 300, 2, 1, d3);
    ok(rc == 0 && !memcmp(d1, d2, 32) && memcmp(d1, d3, 32),
       "digest ignores the per-peer blob and follows the shared ones");

    /* Names. */
    {
        struct mesh_ckpt_writer *wr = NULL;
        int bad = 0;

        rc = mesh_ckpt_begin(dir, 999, &wr);
        bad += mesh_ckpt_put(wr, "../x", "a", 1, 0) == -EINVAL;
        bad += mesh_ckpt_put(wr, "MANIFEST", "a", 1, 0) == -EINVAL;
        bad += mesh_ckpt_put(wr, ".hidden", "a", 1, 0) == -EINVAL;
        bad += mesh_ckpt_put(wr, "ok", "a", 1, 0) == 0;
        bad += mesh_ckpt_put(wr, "ok", "a", 1, 0) == -EINVAL;
        ok(rc == 0 && bad == 5,
           "bad, reserved and duplicate blob names are refused");
        mesh_ckpt_abort(wr);
    }

    /* An unwritten caller file fails the commit and leaves nothing. */
    {
        struct mesh_ckpt_writer *wr = NULL;
        struct mesh_ckpt_meta m2 = {.step = 400};

        rc = mesh_ckpt_begin(dir, 400, &wr);
        if (rc == 0)
            rc = mesh_ckpt_put_file(wr, "w.safetensors", 0, bp, sizeof(bp));
        if (rc == 0)
            rc = mesh_ckpt_commit(wr, &m2, NULL);
        mesh_ckpt_path(dir, 400, p, sizeof(p));
        ok(rc < 0 && access(p, F_OK) != 0 &&
               strstr(mesh_err_msg(rc), "w.safetensors"),
           "commit without the caller's file fails, no checkpoint 400: %s",
           mesh_err_msg(rc));
    }

    /* Corruption, each on a fresh copy of step 100. */
    mesh_ckpt_path(dir, 100, p, sizeof(p));
    snprintf(bp, sizeof(bp), "%s/weights", p);
    flip_byte(bp, 12345);
    ok(open_err(p, "weights: SHA-256 mismatch"),
       "a bit flip in a blob is detected, naming the file");
    write_ckpt(dir, 100, 1, 1, NULL);
    truncate(bp, WLEN - 10);
    ok(open_err(p, "weights: truncated"),
       "a truncated blob is detected, naming the file");
    write_ckpt(dir, 100, 1, 1, NULL);
    snprintf(bp, sizeof(bp), "%s/MANIFEST", p);
    flip_byte(bp, 30);
    ok(open_err(p, "MANIFEST: checksum mismatch"),
       "a bit flip in the manifest is detected");
    write_ckpt(dir, 100, 1, 1, NULL);
    {
        struct stat st;

        stat(bp, &st);
        truncate(bp, st.st_size - 20);
    }
    ok(open_err(p, "MANIFEST"), "a truncated manifest is detected");
    write_ckpt(dir, 100, 1, 1, NULL);
    snprintf(bp, sizeof(bp), "%s/momentum", p);
    unlink(bp);
    ok(open_err(p, "momentum"), "a missing blob file is detected");
    write_ckpt(dir, 100, 1, 1, NULL);
    snprintf(bp, sizeof(bp), "%s/extra", p);
    fclose(fopen(bp, "w"));
    ok(open_err(p, "extra: file not in the manifest"),
       "a stray file is detected");
    write_ckpt(dir, 100, 1, 1, NULL);
    rc = mesh_ckpt_open(p, &c);
    ok(rc == 0, "rewriting step 100 replaces the damaged one: %s",
       rc ? mesh_err_msg(rc) : "ok");
    mesh_ckpt_close(c);
    c = NULL;

    /* Atomicity: a stale temporary directory (a crash mid-write: the pid
     * of a child that has exited), beside those of writers that may still
     * run: a live process of this host, and one of another host. */
    dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    snprintf(bp, sizeof(bp), "%s/.ckpt-000000900.tmp.%ld.0", dir, (long)dead);
    mkdir(bp, 0755);
    live = fork();
    if (live == 0) {
        pause();
        _exit(0);
    }
    gethostname(host, sizeof(host) - 1);
    snprintf(livep, sizeof(livep), "%s/.ckpt-000001000.tmp.%ld.0.%s", dir,
             (long)live, host);
    mkdir(livep, 0755);
    snprintf(otherp, sizeof(otherp),
             "%s/.ckpt-000001000.tmp.%ld.0.not-%s.example", dir, (long)dead,
             host);
    mkdir(otherp, 0755);
    snprintf(p, sizeof(p), "%s/weights", bp);
    fclose(fopen(p, "w"));
    rc = mesh_ckpt_list(dir, &steps, &n);
    ok(rc == 0 && n == 3 && steps[0] == 300 && steps[1] == 200 &&
           steps[2] == 100,
       "list: newest first, the stale temporary directory ignored");
    free(steps);
    steps = NULL;

    /* --keep 3 after six more (one with a ten-digit step). */
    for (uint64_t s = 500; s <= 900 && rc == 0; s += 100)
        rc = write_ckpt(dir, s, (uint32_t)s, 1, NULL);
    if (rc == 0)
        rc = write_ckpt(dir, 12345678901ull, 7, 1, NULL);
    if (rc == 0)
        rc = mesh_ckpt_prune(dir, 3);
    if (rc == 0)
        rc = mesh_ckpt_list(dir, &steps, &n);
    ok(rc == 0 && n == 3 && steps[0] == 12345678901ull && steps[1] == 900 &&
           steps[2] == 800,
       "prune --keep 3 leaves the three newest (%zu left)", n);
    free(steps);
    ok(access(bp, F_OK) != 0, "prune removed the stale temporary directory");
    ok(access(livep, F_OK) == 0,
       "prune kept the temporary directory of a live writer");
    ok(access(otherp, F_OK) == 0,
       "prune kept the temporary directory of another host's writer");
    kill(live, SIGKILL);
    waitpid(live, NULL, 0);
    rc = mesh_ckpt_prune(dir, 3);
    ok(rc == 0 && access(livep, F_OK) != 0,
       "once that writer is gone, prune removes its directory");
    rmdir(otherp);
    ok(mesh_ckpt_prune(dir, 0) == -EINVAL, "--keep 0 is refused");
    mesh_ckpt_path(dir, 900, p, sizeof(p));
    rc = mesh_ckpt_open(p, &c);
    if (rc == 0)
        rc = mesh_ckpt_read_into(c, "weights", w, WLEN);
    fill(ref, WLEN, 900);
    ok(rc == 0 && !memcmp(w, ref, WLEN), "a kept checkpoint still reads");
    mesh_ckpt_close(c);
    rc = mesh_ckpt_list("/nonexistent/ckpt", &steps, &n);
    ok(rc == 0 && n == 0, "a missing directory lists as empty");
    /* an empty one too (a rank's directory before its first checkpoint;
     * under UBSan, with no NULL handed to qsort) */
    snprintf(p, sizeof(p), "%s/empty", tmp);
    mkdir(p, 0755);
    rc = mesh_ckpt_list(p, &steps, &n);
    ok(rc == 0 && n == 0, "an empty directory lists as empty");
    free(steps);
    steps = NULL;

    /* Weights as safetensors through put_file + mesh_st_write. */
    {
        static float conv[2 * 3 * 3 * 3], bias[2];
        struct mesh_st_entry e[2] = {
            {"conv.weight", MESH_DT_F32, 4, {2, 3, 3, 3}, conv},
            {"conv.bias", MESH_DT_F32, 1, {2}, bias},
        };
        static const char *md[] = {"format", "pt", NULL};
        struct mesh_ckpt_writer *wr = NULL;
        struct mesh_ckpt_meta m = {.step = 1000};
        struct mesh_st_file *sf = NULL;
        float back[54];
        int64_t shape[4] = {2, 3, 3, 3};

        for (int i = 0; i < 54; i++)
            conv[i] = (float)i * 0.25f - 3.0f;
        bias[0] = 1.5f;
        bias[1] = -2.5f;
        rc = mesh_ckpt_begin(dir, 1000, &wr);
        if (rc == 0)
            rc = mesh_ckpt_put_file(wr, "model.safetensors", MESH_CKPT_SHARED,
                                    bp, sizeof(bp));
        if (rc == 0)
            rc = mesh_st_write(bp, e, 2, md);
        if (rc == 0)
            rc = mesh_ckpt_commit(wr, &m, NULL);
        else
            mesh_ckpt_abort(wr);
        mesh_ckpt_path(dir, 1000, p, sizeof(p));
        c = NULL;
        if (rc == 0)
            rc = mesh_ckpt_open(p, &c);
        if (rc == 0)
            rc = mesh_ckpt_blob_path(c, "model.safetensors", bp, sizeof(bp));
        if (rc == 0)
            rc = mesh_st_open(bp, &sf);
        if (rc == 0)
            rc = mesh_st_read(sf, "conv.weight", MESH_DT_F32, shape, 4, back);
        ok(rc == 0 && !memcmp(back, conv, sizeof(conv)) &&
               mesh_ckpt_blob_count(c) == 1,
           "safetensors weights written by mesh_st_write inside a "
           "checkpoint verify and read back: %s",
           rc ? mesh_err_msg(rc) : "ok");
        mesh_st_close(sf);
        mesh_ckpt_close(c);
    }

    /* --resume agreement over three peers' directories. */
    {
        struct mesh_ckpt_entry *l[3] = {NULL, NULL, NULL}, back;
        size_t cnt[3] = {0, 0, 0};
        uint8_t rec[MESH_CKPT_ENTRY_BYTES];
        uint64_t step = 0;
        char pd[3][320];

        rc = 0;
        for (int r = 0; r < 3; r++) {
            snprintf(pd[r], sizeof(pd[r]), "%s/peer%d", tmp, r);
            /* Steps 10 and 20 alike everywhere, except that peer 1's
             * step 30 has other weights and peer 2's step 30 is damaged. */
            rc |= write_ckpt(pd[r], 10, 10, (uint32_t)r, NULL);
            rc |= write_ckpt(pd[r], 20, 20, (uint32_t)r, NULL);
            rc |= write_ckpt(pd[r], 30, r == 1 ? 31 : 30, (uint32_t)r, NULL);
        }
        mesh_ckpt_path(pd[2], 30, p, sizeof(p));
        snprintf(bp, sizeof(bp), "%s/momentum", p);
        flip_byte(bp, 7);
        mesh_log_set_level(MESH_LOG_ERROR); /* the skip warning */
        for (int r = 0; r < 3 && rc == 0; r++)
            rc = mesh_ckpt_scan(pd[r], &l[r], &cnt[r], NULL);
        mesh_log_set_level(MESH_LOG_INFO);
        ok(rc == 0 && cnt[0] == 3 && cnt[2] == 2 && l[0][0].step == 30 &&
               l[0][2].step == 10,
           "scan: verified checkpoints newest first, the damaged one out");
        {
            struct mesh_ckpt_entry *l2 = NULL;
            struct mesh_ckpt_damage dmg;
            size_t n2 = 0;
            int rc2;

            mesh_log_set_level(MESH_LOG_ERROR);
            rc2 = mesh_ckpt_scan(pd[2], &l2, &n2, &dmg);
            mesh_log_set_level(MESH_LOG_INFO);
            ok(rc2 == 0 && n2 == 2 && dmg.count == 1 && strstr(dmg.list, bp) &&
                   strstr(dmg.list, "SHA-256"),
               "scan: the damaged one is counted and named with why: %s",
               dmg.list);
            free(l2);
        }
        if (rc == 0)
            rc = mesh_ckpt_agree((const struct mesh_ckpt_entry *const *)l, cnt,
                                 3, &step);
        ok(rc == 0 && step == 20,
           "agree: the newest step all peers hold with one digest is 20");
        if (rc == 0)
            rc = mesh_ckpt_agree((const struct mesh_ckpt_entry *const *)l, cnt,
                                 2, &step);
        ok(rc == 0 && step == 20 && l[1][0].step == 30 &&
               memcmp(l[0][0].digest, l[1][0].digest, 32),
           "agree: peer 1's step 30 differs from peer 0's, so 20");
        cnt[1] = 1; /* peer 1 only has its odd step 30 */
        rc = mesh_ckpt_agree((const struct mesh_ckpt_entry *const *)l, cnt, 3,
                             &step);
        ok(rc == -ENOENT && strstr(mesh_err_msg(rc), "3 peers"),
           "agree: nothing common is -ENOENT: %s", mesh_err_msg(rc));
        mesh_ckpt_entry_pack(&l[0][1], rec);
        mesh_ckpt_entry_unpack(rec, &back);
        ok(!memcmp(&back, &l[0][1], sizeof(back)) && rec[0] == 20,
           "entries pack to 80 little-endian bytes and back");
        for (int r = 0; r < 3; r++)
            free(l[r]);
    }

    free(w);
    free(ref);
    tmpdir_remove(tmp);
    return done();
}
