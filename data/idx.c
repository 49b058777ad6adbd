/*
 * data/idx.c: fashion-mnist, from IDX files (gzip or plain).
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* path = dir/name.gz if it exists (and zlib is built), else dir/name. */
static int find_file(const char *dir, const char *name, char *path, size_t cap)
{
    struct stat st;

    snprintf(path, cap, "%s/%s.gz", dir, name);
    if (stat(path, &st) == 0) {
#ifdef HAVE_ZLIB
        char plain[4200];

        /* say which one is read: they may differ (a stale copy) */
        snprintf(plain, sizeof(plain), "%s/%s", dir, name);
        if (stat(plain, &st) == 0)
            mesh_warn("both %s and %s exist: reading %s (remove one to "
                      "silence this)",
                      plain, path, path);
        return 0;
#else
        return mesh_err(-ENOTSUP, "%s: built without zlib; gunzip it", path);
#endif
    }
    snprintf(path, cap, "%s/%s", dir, name);
    if (stat(path, &st) == 0)
        return 0;
    return mesh_err(-ENOENT, "%s/%s(.gz): not found", dir, name);
}

/*
 * Open an IDX file of unsigned bytes with dims dimensions and read its
 * header (4 + 4 * dims bytes: the magic 0x0000080D, then one big-endian u32
 * per dimension) into hdr. On failure r is closed.
 */
static int idx_open(struct rd *r, const char *path, int dims, uint8_t *hdr)
{
    uint32_t magic = 0x800u | (uint32_t)dims;
    int rc = data_rd_open(r, path, NULL);

    if (rc < 0)
        return rc;
    rc = data_rd_exact(r, hdr, 4 + 4 * (size_t)dims, "the IDX header");
    if (rc == 0 && mesh_get_be32(hdr) != magic)
        rc = mesh_err(-EIO,
                      "%s: bad IDX magic 0x%08x at byte offset 0 (expected "
                      "0x%08x: unsigned bytes, %d dimension%s)",
                      path, mesh_get_be32(hdr), magic, dims,
                      dims == 1 ? "" : "s");
    if (rc < 0)
        data_rd_close(r);
    return rc;
}

/* The n labels of ipath's images from the IDX file lpath into labels, each
 * below classes. */
static int idx_labels(const char *lpath, const char *ipath, uint32_t n,
                      int classes, int32_t *labels)
{
    struct rd r = RD_INIT;
    uint8_t hdr[8];
    uint32_t nl;
    int rc = idx_open(&r, lpath, 1, hdr);

    if (rc < 0)
        return rc;
    nl = mesh_get_be32(hdr + 4);
    if (nl != n) {
        rc = mesh_err(-EIO,
                      "%s: wrong dimensions: %u labels at byte offset 4, "
                      "but %s has %u images",
                      lpath, nl, ipath, n);
        goto out;
    }
    /* Labels land in the first n bytes of the int32 array, then widen
     * from the back so that nothing is overwritten before it is read. */
    rc = data_rd_last(&r, labels, n, "the labels");
    for (uint32_t i = n; rc == 0 && i-- > 0;) {
        uint8_t v = ((uint8_t *)labels)[i];

        if (v >= classes)
            rc =
                mesh_err(-EIO, "%s: label %u at byte offset %u is not below %d",
                         lpath, v, 8 + i, classes);
        else
            labels[i] = v;
    }
out:
    data_rd_close(&r);
    return rc;
}

/*
 * The len bytes of images that end r, into *out (malloc'ed), in steps that
 * double: memory follows the bytes that arrive, not the header's claim (a
 * gzip'ed file of 87 bytes may claim 16 GiB of images).
 */
static int idx_pixels(struct rd *r, const char *path, size_t len, uint8_t **out)
{
    uint8_t *buf = NULL, *nb;
    size_t got = 0, step;
    int rc;

    do {
        step = MESH_MIN(len - got, MESH_MAX(got, (size_t)1 << 20));
        nb = realloc(buf, got + step);
        if (!nb) {
            rc = mesh_err(-ENOMEM, "%s: cannot allocate %zu bytes", path,
                          got + step);
            break;
        }
        buf = nb;
        rc = got + step == len
                 ? data_rd_last(r, buf + got, step, "the images")
                 : data_rd_exact(r, buf + got, step, "the images");
        got += step;
    } while (rc == 0 && got < len);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

static int idx_read(const char *dir, const char *img_name, const char *lbl_name,
                    int classes, struct split *sp, int *h, int *w)
{
    char ipath[4096], lpath[4096];
    uint8_t hdr[16];
    struct rd ri = RD_INIT;
    uint32_t n, rows, cols;
    size_t bytes;
    int rc;

    rc = find_file(dir, img_name, ipath, sizeof(ipath));
    if (rc < 0)
        return rc;
    rc = find_file(dir, lbl_name, lpath, sizeof(lpath));
    if (rc < 0)
        return rc;
    rc = idx_open(&ri, ipath, 3, hdr);
    if (rc < 0)
        return rc;
    n = mesh_get_be32(hdr + 4);
    rows = mesh_get_be32(hdr + 8);
    cols = mesh_get_be32(hdr + 12);
    if (n == 0 || n > (1u << 24) || rows == 0 || rows > MAX_SIZE || cols == 0 ||
        cols > MAX_SIZE || (uint64_t)n * rows * cols > ((uint64_t)1 << 34)) {
        rc = mesh_err(-EIO,
                      "%s: implausible IDX dimensions %u x %u x %u at byte "
                      "offset 4",
                      ipath, n, rows, cols);
        goto out;
    }
    if (*h && ((int)rows != *h || (int)cols != *w)) {
        rc = mesh_err(-EIO,
                      "%s: wrong dimensions %u x %u at byte offset 8 "
                      "(the other split has %d x %d)",
                      ipath, rows, cols, *h, *w);
        goto out;
    }
    bytes = (size_t)n * rows * cols;
    rc = idx_pixels(&ri, ipath, bytes, &sp->pix);
    if (rc < 0)
        goto out;
    sp->labels = malloc(sizeof(int32_t) * n);
    if (!sp->labels) {
        rc = mesh_err(-ENOMEM, "%s: cannot allocate %zu labels", lpath,
                      (size_t)n);
        goto out;
    }
    rc = idx_labels(lpath, ipath, n, classes, sp->labels);
    if (rc == 0) {
        sp->count = n;
        *h = (int)rows;
        *w = (int)cols;
    }
out:
    data_rd_close(&ri);
    return rc;
}

int data_open_fmnist(struct mesh_dataset *ds, const char *dir)
{
    int rc;

    ds->name = "fashion-mnist";
    ds->classes = 10;
    ds->sc = 1;
    ds->mean[0] = 0.2860f;
    ds->std[0] = 0.3530f;
    rc = idx_read(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", 10,
                  &ds->sp[MESH_DATA_TRAIN], &ds->sh, &ds->sw);
    if (rc < 0)
        return rc;
    return idx_read(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 10,
                    &ds->sp[MESH_DATA_EVAL], &ds->sh, &ds->sw);
}
