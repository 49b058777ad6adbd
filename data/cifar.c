/*
 * data/cifar.c: cifar10, from its binary batch files.
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define CIFAR_REC 3073

/* Capacities of a split's arrays, in records. */
struct caps {
    size_t pix, labels;
};

/* Append the records of one batch file to sp, growing its arrays. */
static int cifar_file(const char *path, struct split *sp, struct caps *cap)
{
    struct stat st;
    struct rd r = RD_INIT;
    size_t nrec, got;
    uint8_t *rec;
    int rc;

    rc = data_rd_open(&r, path, &st);
    if (rc < 0)
        return rc;
    if (st.st_size <= 0 || st.st_size % CIFAR_REC) {
        size_t whole = (size_t)st.st_size / CIFAR_REC * CIFAR_REC;

        rc = mesh_err(-EIO,
                      "%s: size %lld is not a whole number of %d-byte "
                      "records (1 label + 3072 pixels): a partial record "
                      "starts at byte offset %zu",
                      path, (long long)st.st_size, CIFAR_REC, whole);
        goto out;
    }
    nrec = (size_t)st.st_size / CIFAR_REC;
    rc = mesh_array_reserve(&sp->pix, &cap->pix, sp->count + nrec, 3072,
                            "CIFAR records");
    if (rc == 0)
        rc = mesh_array_reserve(&sp->labels, &cap->labels, sp->count + nrec,
                                sizeof(int32_t), "CIFAR labels");
    if (rc < 0) {
        mesh_err_prefix(rc, "%s", path);
        goto out;
    }
    for (size_t i = 0; i < nrec; i++) {
        uint8_t lab;

        rec = sp->pix + (sp->count + i) * 3072;
        rc = data_rd_some(&r, &lab, 1, &got);
        if (rc == 0 && got == 1)
            rc = data_rd_exact(&r, rec, 3072, "a record's pixels");
        else if (rc == 0)
            rc = mesh_err(-EIO, "%s: truncated at byte offset %zu", path,
                          i * CIFAR_REC);
        if (rc < 0)
            goto out;
        if (lab >= 10) {
            rc = mesh_err(-EIO,
                          "%s: label %u at byte offset %zu is not below 10 "
                          "(record %zu)",
                          path, lab, i * CIFAR_REC, i);
            goto out;
        }
        sp->labels[sp->count + i] = lab;
    }
    sp->count += nrec;
out:
    data_rd_close(&r);
    return rc;
}

int data_open_cifar(struct mesh_dataset *ds, const char *dir)
{
    static const float mean[3] = {0.4914f, 0.4822f, 0.4465f};
    static const float std[3] = {0.2470f, 0.2435f, 0.2616f};
    char base[4096], path[4200];
    struct stat st;
    struct caps cap[2] = {{0, 0}, {0, 0}};
    int rc;

    ds->name = "cifar10";
    ds->classes = 10;
    ds->sc = 3;
    ds->sh = ds->sw = 32;
    memcpy(ds->mean, mean, sizeof(mean));
    memcpy(ds->std, std, sizeof(std));
    snprintf(base, sizeof(base), "%s/cifar-10-batches-bin", dir);
    if (stat(base, &st) != 0 || !S_ISDIR(st.st_mode))
        snprintf(base, sizeof(base), "%s", dir);
    for (int b = 1; b <= 5; b++) {
        snprintf(path, sizeof(path), "%s/data_batch_%d.bin", base, b);
        rc = cifar_file(path, &ds->sp[MESH_DATA_TRAIN], &cap[0]);
        if (rc < 0)
            return rc;
    }
    snprintf(path, sizeof(path), "%s/test_batch.bin", base);
    return cifar_file(path, &ds->sp[MESH_DATA_EVAL], &cap[1]);
}
