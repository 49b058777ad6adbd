/*
 * data/reader.c: a file read front to back, gzip'ed or plain, whose errors
 * name the file and the byte offset (see data-internal.h).
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RD_IN (1 << 17)

int data_rd_open(struct rd *r, const char *path, struct stat *st)
{
    uint8_t magic[2];
    ssize_t n;
    int rc;

    r->path = path;
    r->off = 0;
    r->raw = 0;
    r->gz = r->gz_end = 0;
    rc = mesh_open_input("--data", path, 0, &r->fd, st);
    if (rc < 0)
        return rc;
    do {
        n = pread(r->fd, magic, sizeof(magic), 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        rc = mesh_err_errno("%s: read at byte offset 0", path);
        goto fail;
    }
    if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
#ifdef HAVE_ZLIB
        memset(&r->z, 0, sizeof(r->z));
        r->in = malloc(RD_IN);
        if (!r->in) {
            rc = mesh_err(-ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        /* 15 + 16: a gzip header and trailer, nothing else */
        if (inflateInit2(&r->z, 15 + 16) != Z_OK) {
            rc = mesh_err(-ENOMEM, "%s: inflateInit2 failed", path);
            goto fail;
        }
        r->z_init = 1;
        r->gz = 1;
#else
        rc = mesh_err(-ENOTSUP,
                      "%s: gzip'ed, and built without zlib; "
                      "gunzip it",
                      path);
        goto fail;
#endif
    }
    return 0;
fail:
    close(r->fd);
    r->fd = -1;
    return rc;
}

void data_rd_close(struct rd *r)
{
#ifdef HAVE_ZLIB
    if (r->z_init)
        inflateEnd(&r->z);
    r->z_init = 0;
    free(r->in);
    r->in = NULL;
#endif
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

/* Up to len plain bytes from the file into buf; *got = 0 at its end. */
static int rd_raw(struct rd *r, void *buf, size_t len, size_t *got)
{
    ssize_t n;

    do {
        n = read(r->fd, buf, MESH_MIN(len, (size_t)1 << 30));
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return mesh_err_errno("%s: read at byte offset %" PRIu64, r->path,
                              r->raw);
    r->raw += (uint64_t)n;
    *got = (size_t)n;
    return 0;
}

#ifdef HAVE_ZLIB
/* The compressed offset inflate has consumed up to. */
static uint64_t rd_zoff(const struct rd *r)
{
    return r->raw - r->z.avail_in;
}

/* Refill the input when inflate has used it all; *eof at the file's end. */
static int rd_fill(struct rd *r, int *eof)
{
    size_t got;
    int rc;

    *eof = 0;
    if (r->z.avail_in)
        return 0;
    rc = rd_raw(r, r->in, RD_IN, &got);
    if (rc < 0)
        return rc;
    r->z.next_in = r->in;
    r->z.avail_in = (uInt)got;
    *eof = got == 0;
    return 0;
}

/* After a member's trailer (out: uncompressed bytes so far): another
 * member follows, or the file ends. */
static int rd_next_member(struct rd *r, uint64_t out)
{
    int eof, rc;

    rc = rd_fill(r, &eof);
    if (rc < 0)
        return rc;
    if (eof) {
        r->gz_end = 1;
        return 0;
    }
    if (r->z.avail_in == 1) {
        /* one byte left in the buffer: move it and read behind it */
        size_t got;

        r->in[0] = r->z.next_in[0];
        rc = rd_raw(r, r->in + 1, RD_IN - 1, &got);
        if (rc < 0)
            return rc;
        r->z.next_in = r->in;
        r->z.avail_in = (uInt)(1 + got);
    }
    if (r->z.avail_in < 2 || r->z.next_in[0] != 0x1f || r->z.next_in[1] != 0x8b)
        return mesh_err(-EIO,
                        "%s: trailing garbage after the gzip stream at "
                        "compressed byte offset %" PRIu64 " (after %" PRIu64
                        " uncompressed bytes)",
                        r->path, rd_zoff(r), out);
    if (inflateReset(&r->z) != Z_OK)
        return mesh_err(-EIO, "%s: inflateReset failed", r->path);
    return 0;
}

static int rd_some_gz(struct rd *r, uint8_t *buf, size_t len, size_t *done)
{
    while (*done < len && !r->gz_end) {
        uInt want = (uInt)MESH_MIN(len - *done, (size_t)1 << 30);
        int eof, zrc, rc;

        rc = rd_fill(r, &eof);
        if (rc < 0)
            return rc;
        if (eof)
            return mesh_err(-EIO,
                            "%s: truncated gzip stream: the file ends at "
                            "compressed byte offset %" PRIu64
                            " (uncompressed byte offset %" PRIu64 ")",
                            r->path, r->raw, r->off + *done);
        r->z.next_out = buf + *done;
        r->z.avail_out = want;
        zrc = inflate(&r->z, Z_NO_FLUSH);
        *done += want - r->z.avail_out;
        if (zrc == Z_STREAM_END) {
            rc = rd_next_member(r, r->off + *done);
            if (rc < 0)
                return rc;
            continue;
        }
        if (zrc == Z_OK || (zrc == Z_BUF_ERROR && r->z.avail_in == 0))
            continue;
        if (zrc == Z_MEM_ERROR)
            return mesh_err(-ENOMEM, "%s: out of memory inflating", r->path);
        if (zrc == Z_DATA_ERROR && r->z.msg &&
            (!strcmp(r->z.msg, "incorrect data check") ||
             !strcmp(r->z.msg, "incorrect length check")))
            /* inflate checks the trailer's 4 bytes after reading them */
            return mesh_err(
                -EIO,
                "%s: gzip %s mismatch: the trailer at "
                "compressed byte offset %" PRIu64 " does not match the %" PRIu64
                " uncompressed bytes before it (a corrupt file)",
                r->path,
                !strcmp(r->z.msg, "incorrect data check") ? "CRC-32" : "length",
                rd_zoff(r) - 4, r->off + *done);
        return mesh_err(-EIO,
                        "%s: gzip error at compressed byte offset %" PRIu64
                        " (uncompressed byte offset %" PRIu64 "): %s",
                        r->path, rd_zoff(r), r->off + *done,
                        r->z.msg ? r->z.msg : zError(zrc));
    }
    return 0;
}
#endif

/* Read up to len bytes; *got gets the count. Errors name file + offset. */
int data_rd_some(struct rd *r, void *buf, size_t len, size_t *got)
{
    size_t done = 0, n;
    int rc = 0;

#ifdef HAVE_ZLIB
    if (r->gz) {
        rc = rd_some_gz(r, buf, len, &done);
        if (rc < 0)
            return rc;
        len = done;
    }
#endif
    while (done < len) {
        rc = rd_raw(r, (uint8_t *)buf + done, len - done, &n);
        if (rc < 0)
            return rc;
        if (n == 0)
            break;
        done += n;
    }
    r->off += done;
    *got = done;
    return 0;
}

/* Exactly len bytes, or "truncated at byte offset". */
int data_rd_exact(struct rd *r, void *buf, size_t len, const char *what)
{
    uint64_t start = r->off;
    size_t got;
    int rc = data_rd_some(r, buf, len, &got);

    if (rc < 0)
        return rc;
    if (got < len)
        return mesh_err(-EIO,
                        "%s: truncated: end of data at byte offset %" PRIu64
                        " while reading %s (%zu bytes from offset %" PRIu64 ")",
                        r->path, r->off, what, len, start);
    return 0;
}

/* The data must end here (this also checks a gzip trailer's CRC). */
static int rd_end(struct rd *r)
{
    uint8_t b;
    size_t got;
    int rc = data_rd_some(r, &b, 1, &got);

    if (rc < 0)
        return rc;
    if (got)
        return mesh_err(-EIO,
                        "%s: unexpected data at byte offset %" PRIu64
                        " (the header says the file ends there)",
                        r->path, r->off - 1);
    return 0;
}

int data_rd_last(struct rd *r, void *buf, size_t len, const char *what)
{
    int rc = data_rd_exact(r, buf, len, what);

    return rc < 0 ? rc : rd_end(r);
}
