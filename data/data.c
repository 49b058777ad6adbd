/*
 * data/data.c: data sets (synthetic, fashion-mnist, cifar10, imagefolder),
 * transforms and the prefetching loader. The formats, transforms, random
 * streams and sharding rules are documented in data/data.h.
 */
#include "config.h"

#include "data/data.h"
#include "common/bytes.h"
#include "common/util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef HAVE_ZLIB
#include <zlib.h>
#endif
#ifdef HAVE_JPEG
#include <jpeglib.h>
#endif

#define DEFAULT_FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define SYN_DEFAULT_COUNT  50000
#define SYN_POOL           64
#define MAX_SIZE           4096          /* largest output side */
#define MAX_PIXELS         (1u << 27)    /* largest decoded JPEG, pixels */
#define PERM_KEY           0x7065726dull /* "perm" */

/* ---- random streams (documented in data.h) ------------------------------ */

struct rng {
    uint64_t s[4];
};

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t key3(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t s = a, x;

    x = splitmix64(&s);
    s = x ^ b;
    x = splitmix64(&s);
    s = x ^ c;
    return splitmix64(&s);
}

static void rng_seed(struct rng *r, uint64_t k)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&k);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

/* Uniform in [0, n), n <= 2^32. */
static uint32_t rng_bounded(struct rng *r, uint64_t n)
{
    return (uint32_t)(((rng_next(r) >> 32) * n) >> 32);
}

static double rng_uniform(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- data set layout ---------------------------------------------------- */

enum kind { K_SYNTHETIC, K_FMNIST, K_CIFAR, K_FOLDER };

struct split {
    size_t count;
    int32_t *labels;   /* (count) */
    uint8_t *pix;      /* in-memory: (count or SYN_POOL, c, h, w) */
    char **paths;      /* imagefolder: (count) */
    atomic_uchar *bad; /* imagefolder: bad file already reported */
};

struct mesh_dataset {
    enum kind kind;
    const char *name;
    int classes;
    char **class_names; /* imagefolder: (classes) */
    int sc, sh, sw;     /* source channels, height, width (0: varies) */
    int co, size;       /* output channels and side */
    float mean[3], std[3];
    uint64_t seed;
    enum mesh_data_bad on_bad;
    enum mesh_data_fit fit;
    size_t root_len; /* imagefolder: strlen(DIR) + 1, paths after it */
    struct split sp[2];
};

/* Per-thread buffers for decoding. */
struct scratch {
    uint8_t *file;
    size_t file_cap;
    size_t file_len; /* bytes of the file in file */
    uint8_t *img;
    size_t img_cap;
    int32_t *xi; /* resampling: (2 * size) source columns */
    float *xw;   /* (size) weights */
};

static void scratch_free(struct scratch *s)
{
    free(s->file);
    free(s->img);
    free(s->xi);
    free(s->xw);
    memset(s, 0, sizeof(*s));
}

static int grow(uint8_t **buf, size_t *cap, size_t need)
{
    uint8_t *p;

    if (*cap >= need)
        return 0;
    p = realloc(*buf, need);
    if (!p)
        return mesh_err(-ENOMEM, "cannot allocate %zu bytes", need);
    *buf = p;
    *cap = need;
    return 0;
}

/* ---- whole-file readers with offsets in every error --------------------- */

/*
 * A file read front to back, gzip'ed (by its magic bytes) or plain. gzip is
 * inflated here rather than through gzread, so that an error names the
 * compressed offset where inflate found it, the uncompressed offset of the
 * data it was producing, and so that bytes after the last gzip member are
 * an error rather than silently ignored.
 */
struct rd {
    const char *path;
    uint64_t off; /* uncompressed bytes consumed */
    int fd;
    int gz;       /* the file starts with gzip's magic 1f 8b */
    int gz_end;   /* the last member's trailer was read and checked */
    uint64_t raw; /* file bytes read into in[] so far */
#ifdef HAVE_ZLIB
    z_stream z;
    int z_init;
    uint8_t *in; /* (RD_IN) compressed input */
#endif
};

#define RD_INIT {.fd = -1}
#define RD_IN   (1 << 17)

static int rd_open(struct rd *r, const char *path, struct stat *st)
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
        rc = mesh_err(-ENOTSUP, "%s: gzip'ed, and built without zlib; "
                      "gunzip it", path);
        goto fail;
#endif
    }
    return 0;
fail:
    close(r->fd);
    r->fd = -1;
    return rc;
}

static void rd_close(struct rd *r)
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
    if (r->z.avail_in < 2 || r->z.next_in[0] != 0x1f ||
        r->z.next_in[1] != 0x8b)
        return mesh_err(-EIO,
                        "%s: trailing garbage after the gzip stream at "
                        "compressed byte offset %" PRIu64
                        " (after %" PRIu64 " uncompressed bytes)",
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
            return mesh_err(-EIO,
                            "%s: gzip %s mismatch: the trailer at "
                            "compressed byte offset %" PRIu64
                            " does not match the %" PRIu64
                            " uncompressed bytes before it (a corrupt file)",
                            r->path,
                            !strcmp(r->z.msg, "incorrect data check")
                                ? "CRC-32"
                                : "length",
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
static int rd_some(struct rd *r, void *buf, size_t len, size_t *got)
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
static int rd_exact(struct rd *r, void *buf, size_t len, const char *what)
{
    uint64_t start = r->off;
    size_t got;
    int rc = rd_some(r, buf, len, &got);

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
    int rc = rd_some(r, &b, 1, &got);

    if (rc < 0)
        return rc;
    if (got)
        return mesh_err(-EIO,
                        "%s: unexpected data at byte offset %" PRIu64
                        " (the header says the file ends there)",
                        r->path, r->off - 1);
    return 0;
}

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

/* ---- fashion-mnist (IDX) ------------------------------------------------ */

/*
 * Open an IDX file of unsigned bytes with dims dimensions and read its
 * header (4 + 4 * dims bytes: the magic 0x0000080D, then one big-endian u32
 * per dimension) into hdr. On failure r is closed.
 */
static int idx_open(struct rd *r, const char *path, int dims, uint8_t *hdr)
{
    uint32_t magic = 0x800u | (uint32_t)dims;
    int rc = rd_open(r, path, NULL);

    if (rc < 0)
        return rc;
    rc = rd_exact(r, hdr, 4 + 4 * (size_t)dims, "the IDX header");
    if (rc == 0 && mesh_get_be32(hdr) != magic)
        rc = mesh_err(-EIO,
                      "%s: bad IDX magic 0x%08x at byte offset 0 (expected "
                      "0x%08x: unsigned bytes, %d dimension%s)",
                      path, mesh_get_be32(hdr), magic, dims, dims == 1 ? "" : "s");
    if (rc < 0)
        rd_close(r);
    return rc;
}

static int idx_read(const char *dir, const char *img_name, const char *lbl_name,
                    int classes, struct split *sp, int *h, int *w)
{
    char ipath[4096], lpath[4096];
    uint8_t hdr[16];
    struct rd ri = RD_INIT, rl = RD_INIT;
    uint32_t n, rows, cols, nl;
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
        goto out_img;
    }
    if (*h && ((int)rows != *h || (int)cols != *w)) {
        rc = mesh_err(-EIO,
                      "%s: wrong dimensions %u x %u at byte offset 8 "
                      "(the other split has %d x %d)",
                      ipath, rows, cols, *h, *w);
        goto out_img;
    }
    bytes = (size_t)n * rows * cols;
    sp->pix = malloc(bytes);
    sp->labels = malloc(sizeof(int32_t) * n);
    if (!sp->pix || !sp->labels) {
        rc = mesh_err(-ENOMEM, "%s: cannot allocate %zu bytes", ipath, bytes);
        goto out_img;
    }
    rc = rd_exact(&ri, sp->pix, bytes, "the images");
    if (rc < 0)
        goto out_img;
    rc = rd_end(&ri);
    if (rc < 0)
        goto out_img;

    rc = idx_open(&rl, lpath, 1, hdr);
    if (rc < 0)
        goto out_img;
    nl = mesh_get_be32(hdr + 4);
    if (nl != n) {
        rc = mesh_err(-EIO,
                      "%s: wrong dimensions: %u labels at byte offset 4, "
                      "but %s has %u images",
                      lpath, nl, ipath, n);
        goto out_lbl;
    }
    /* Labels land in the first n bytes of the int32 array, then widen
     * from the back so that nothing is overwritten before it is read. */
    rc = rd_exact(&rl, sp->labels, n, "the labels");
    if (rc < 0)
        goto out_lbl;
    rc = rd_end(&rl);
    if (rc < 0)
        goto out_lbl;
    for (uint32_t i = n; i-- > 0;) {
        uint8_t v = ((uint8_t *)sp->labels)[i];

        if (v >= classes) {
            rc =
                mesh_err(-EIO, "%s: label %u at byte offset %u is not below %d",
                         lpath, v, 8 + i, classes);
            goto out_lbl;
        }
        sp->labels[i] = v;
    }
    sp->count = n;
    *h = (int)rows;
    *w = (int)cols;
out_lbl:
    rd_close(&rl);
out_img:
    rd_close(&ri);
    return rc;
}

static int open_fmnist(struct mesh_dataset *ds, const char *dir)
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

/* ---- cifar10 ------------------------------------------------------------ */

#define CIFAR_REC 3073

/* Append the records of one batch file to sp (arrays grown by caller). */
static int cifar_file(const char *path, struct split *sp, size_t *cap)
{
    struct stat st;
    struct rd r = RD_INIT;
    size_t nrec, got;
    uint8_t *rec;
    int rc;

    rc = rd_open(&r, path, &st);
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
    if (sp->count + nrec > *cap) {
        size_t ncap = sp->count + nrec;
        uint8_t *p = realloc(sp->pix, ncap * 3072);
        int32_t *l;

        if (!p) {
            rc = mesh_err(-ENOMEM, "%s: out of memory", path);
            goto out;
        }
        sp->pix = p;
        l = realloc(sp->labels, ncap * sizeof(int32_t));
        if (!l) {
            rc = mesh_err(-ENOMEM, "%s: out of memory", path);
            goto out;
        }
        sp->labels = l;
        *cap = ncap;
    }
    for (size_t i = 0; i < nrec; i++) {
        uint8_t lab;

        rec = sp->pix + (sp->count + i) * 3072;
        rc = rd_some(&r, &lab, 1, &got);
        if (rc == 0 && got == 1)
            rc = rd_exact(&r, rec, 3072, "a record's pixels");
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
    rd_close(&r);
    return rc;
}

static int open_cifar(struct mesh_dataset *ds, const char *dir)
{
    static const float mean[3] = {0.4914f, 0.4822f, 0.4465f};
    static const float std[3] = {0.2470f, 0.2435f, 0.2616f};
    char base[4096], path[4200];
    struct stat st;
    size_t cap[2] = {0, 0};
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

/* ---- synthetic ---------------------------------------------------------- */

static int open_synthetic(struct mesh_dataset *ds, size_t count)
{
    size_t img = (size_t)ds->sc * ds->sh * ds->sw;
    struct rng r;

    ds->name = "synthetic";
    for (int c = 0; c < 3; c++) {
        ds->mean[c] = 0.5f;
        ds->std[c] = 0.2887f; /* uniform bytes: 1 / sqrt(12) */
    }
    for (int s = 0; s < 2; s++) {
        struct split *sp = &ds->sp[s];
        size_t pool = MESH_MIN(count, (size_t)SYN_POOL);

        sp->count = count;
        sp->labels = malloc(sizeof(int32_t) * count);
        sp->pix = malloc(pool * img);
        if (!sp->labels || !sp->pix)
            return mesh_err(-ENOMEM,
                            "synthetic: cannot allocate %zu "
                            "samples",
                            count);
        rng_seed(&r, key3(ds->seed, 0x73796e00ull + (uint64_t)s, 0));
        for (size_t i = 0; i < count; i++)
            sp->labels[i] = (int32_t)rng_bounded(&r, (uint64_t)ds->classes);
        for (size_t i = 0; i < pool * img; i += 8) {
            uint64_t v = rng_next(&r);

            for (size_t k = 0; k < 8 && i + k < pool * img; k++)
                sp->pix[i + k] = (uint8_t)(v >> (8 * k));
        }
        count = count / 5 ? count / 5 : 1;
    }
    return 0;
}

/* ---- imagefolder -------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_dir(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has_jpeg_ext(const char *name)
{
    const char *dot = strrchr(name, '.');

    return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

static void free_names(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Sorted names in dir (not starting with '.'), subdirectories or JPEGs. */
static int list_dir(const char *dir, int want_dirs, char ***out, size_t *nout)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **v = NULL, path[4200];
    size_t n = 0, cap = 0;

    if (!d)
        return mesh_err_errno("imagefolder: open directory %s", dir);
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (want_dirs ? !is_dir(path)
                      : (!has_jpeg_ext(e->d_name) || is_dir(path)))
            continue;
        if (n == cap) {
            char **nv;

            cap = cap ? 2 * cap : 64;
            nv = realloc(v, cap * sizeof(*v));
            if (!nv)
                goto oom;
            v = nv;
        }
        v[n] = strdup(e->d_name);
        if (!v[n])
            goto oom;
        n++;
    }
    closedir(d);
    qsort(v, n, sizeof(*v), cmp_str);
    *out = v;
    *nout = n;
    return 0;
oom:
    closedir(d);
    free_names(v, n);
    return mesh_err(-ENOMEM, "imagefolder: out of memory listing %s", dir);
}

/* Fill sp from root/<class>/NAME.jpg; classes come from ds (train) or, for
 * the training split, are set from root. */
static int folder_scan(struct mesh_dataset *ds, const char *root,
                       struct split *sp, int set_classes)
{
    char **cls = NULL, **files = NULL, path[8400];
    size_t ncls = 0, nfiles = 0, cap = 0;
    int rc;

    rc = list_dir(root, 1, &cls, &ncls);
    if (rc < 0)
        return rc;
    if (set_classes) {
        if (ncls == 0) {
            rc = mesh_err(-ENOENT, "imagefolder: no class folders in %s", root);
            goto out;
        }
        if (ncls > INT32_MAX) {
            rc = mesh_err(-EINVAL, "imagefolder: too many classes");
            goto out;
        }
        ds->classes = (int)ncls;
        ds->class_names = cls;
        cls = NULL;
        ncls = 0;
    }
    for (size_t c = 0; c < (set_classes ? (size_t)ds->classes : ncls); c++) {
        const char *cname = set_classes ? ds->class_names[c] : cls[c];
        int label = -1;

        for (int k = 0; k < ds->classes; k++)
            if (!strcmp(ds->class_names[k], cname))
                label = k;
        if (label < 0) {
            rc = mesh_err(-EINVAL,
                          "imagefolder: class folder %s/%s has no "
                          "counterpart in the training split",
                          root, cname);
            goto out;
        }
        snprintf(path, sizeof(path), "%s/%s", root, cname);
        rc = list_dir(path, 0, &files, &nfiles);
        if (rc < 0)
            goto out;
        if (sp->count + nfiles > cap) {
            size_t ncap = MESH_MAX(2 * cap, sp->count + nfiles);
            char **np = realloc(sp->paths, ncap * sizeof(char *));
            int32_t *nl;

            if (!np) {
                rc = mesh_err(-ENOMEM, "imagefolder: out of memory");
                goto out_files;
            }
            sp->paths = np;
            nl = realloc(sp->labels, ncap * sizeof(int32_t));
            if (!nl) {
                rc = mesh_err(-ENOMEM, "imagefolder: out of memory");
                goto out_files;
            }
            sp->labels = nl;
            cap = ncap;
        }
        for (size_t f = 0; f < nfiles; f++) {
            size_t len = strlen(root) + strlen(cname) + strlen(files[f]) + 3;
            char *p = malloc(len);

            if (!p) {
                rc = mesh_err(-ENOMEM, "imagefolder: out of memory");
                goto out_files;
            }
            snprintf(p, len, "%s/%s/%s", root, cname, files[f]);
            sp->paths[sp->count] = p;
            sp->labels[sp->count] = label;
            sp->count++;
        }
        free_names(files, nfiles);
        files = NULL;
        nfiles = 0;
    }
    if (sp->count) {
        sp->bad = calloc(sp->count, sizeof(atomic_uchar));
        if (!sp->bad) {
            rc = mesh_err(-ENOMEM, "imagefolder: out of memory");
            goto out;
        }
    }
    rc = 0;
out_files:
    free_names(files, nfiles);
out:
    free_names(cls, ncls);
    return rc;
}

static int open_folder(struct mesh_dataset *ds, const char *dir)
{
    static const float mean[3] = {0.485f, 0.456f, 0.406f};
    static const float std[3] = {0.229f, 0.224f, 0.225f};
    char train[4200], val[4200];
    int rc;

#ifndef HAVE_JPEG
    (void)train;
    (void)val;
    (void)rc;
    return mesh_err(-ENOTSUP, "imagefolder:%s: built without libjpeg", dir);
#else
    ds->name = "imagefolder";
    ds->sc = 3;
    memcpy(ds->mean, mean, sizeof(mean));
    memcpy(ds->std, std, sizeof(std));
    if (!is_dir(dir))
        return mesh_err(-ENOENT, "imagefolder: %s is not a directory", dir);
    ds->root_len = strlen(dir) + 1;
    snprintf(train, sizeof(train), "%s/train", dir);
    snprintf(val, sizeof(val), "%s/val", dir);
    if (is_dir(train)) {
        rc = folder_scan(ds, train, &ds->sp[MESH_DATA_TRAIN], 1);
        if (rc == 0 && is_dir(val))
            rc = folder_scan(ds, val, &ds->sp[MESH_DATA_EVAL], 0);
        else if (rc == 0)
            mesh_warn("imagefolder: %s has no val/ folder: no evaluation "
                      "(top-1/top-5 need %s)",
                      dir, val);
    } else {
        rc = folder_scan(ds, dir, &ds->sp[MESH_DATA_TRAIN], 1);
        if (rc == 0)
            mesh_warn("imagefolder: %s has no train/ folder: its class "
                      "folders are the training split, and there is no "
                      "evaluation (that needs train/ and val/)",
                      dir);
    }
    if (rc == 0 && ds->sp[MESH_DATA_TRAIN].count == 0)
        rc = mesh_err(-ENOENT, "imagefolder: no JPEG files under %s", dir);
    return rc;
#endif
}

/* ---- JPEG --------------------------------------------------------------- */

#ifdef HAVE_JPEG
struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    int warned;
};

static void jerr_exit(j_common_ptr c)
{
    struct jerr *e = (struct jerr *)c->err;

    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* libjpeg only warns about truncated or corrupt data (and then makes up
 * grey pixels): treat the first warning as corruption. */
static void jerr_emit(j_common_ptr c, int level)
{
    struct jerr *e = (struct jerr *)c->err;

    if (level < 0 && !e->warned) {
        c->err->format_message(c, e->msg);
        e->warned = 1;
    }
}

static size_t jpeg_offset(j_decompress_ptr c, const uint8_t *buf, size_t len)
{
    const uint8_t *p;

    if (!c->src)
        return 0;
    p = c->src->next_input_byte;
    /* At end of data libjpeg points at its own fake EOI marker. */
    if (p < buf || p > buf + len)
        return len;
    return (size_t)(p - buf);
}

/* Decode path into sc->img as interleaved RGB (h, w, 3). */
static int jpeg_decode(const char *path, struct scratch *sc, int *w_out,
                       int *h_out)
{
    struct jpeg_decompress_struct c;
    struct jerr e;
    size_t row;
    int cmyk, rc;

    rc = mesh_file_read(path, (size_t)1 << 30, "a JPEG file", &sc->file,
                        &sc->file_cap, &sc->file_len);
    if (rc < 0)
        return rc;
    memset(&c, 0, sizeof(c));
    c.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = jerr_exit;
    e.pub.emit_message = jerr_emit;
    e.warned = 0;
    if (setjmp(e.jb)) {
        rc = mesh_err(-EIO, "%s: bad JPEG at byte offset %zu: %s", path,
                      jpeg_offset(&c, sc->file, sc->file_len), e.msg);
        jpeg_destroy_decompress(&c);
        return rc;
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, sc->file, (unsigned long)sc->file_len);
    jpeg_read_header(&c, TRUE);
    if (e.warned)
        jerr_exit((j_common_ptr)&c);
    cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
    c.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    if ((uint64_t)c.image_width * c.image_height > MAX_PIXELS) {
        snprintf(e.msg, sizeof(e.msg), "image of %u x %u pixels is too big",
                 c.image_width, c.image_height);
        longjmp(e.jb, 1);
    }
    jpeg_start_decompress(&c);
    row = (size_t)c.output_width * (size_t)c.output_components;
    if (grow(&sc->img, &sc->img_cap, row * c.output_height) < 0) {
        snprintf(e.msg, sizeof(e.msg), "out of memory");
        longjmp(e.jb, 1);
    }
    while (c.output_scanline < c.output_height) {
        JSAMPROW p = sc->img + row * c.output_scanline;

        jpeg_read_scanlines(&c, &p, 1);
        if (e.warned)
            jerr_exit((j_common_ptr)&c);
    }
    jpeg_finish_decompress(&c);
    if (e.warned)
        jerr_exit((j_common_ptr)&c);
    if (cmyk) {
        /* Adobe writes inverted CMYK: R = C K / 255 etc.; in place. */
        size_t n = (size_t)c.output_width * c.output_height;

        for (size_t i = 0; i < n; i++) {
            const uint8_t *s = sc->img + 4 * i;
            uint8_t *d = sc->img + 3 * i;
            unsigned k = s[3], r = s[0] * k / 255, g = s[1] * k / 255,
                     b = s[2] * k / 255;

            d[0] = (uint8_t)r;
            d[1] = (uint8_t)g;
            d[2] = (uint8_t)b;
        }
    }
    *w_out = (int)c.output_width;
    *h_out = (int)c.output_height;
    jpeg_destroy_decompress(&c);
    return 0;
}
#endif

/* ---- transforms --------------------------------------------------------- */

/* A uint8 source image: channel k of pixel (x, y) at p[y sy + x sx + k sc]. */
struct img {
    const uint8_t *p;
    int c, h, w;
    ptrdiff_t sc, sy, sx;
};

/* The source region (x, y, w, h; pixel edges) mapped onto the output. */
struct box {
    double x, y, w, h;
};

/*
 * Bilinear resampling of box onto an (co, S, S) float image, with half-pixel
 * centres; a sample position beyond half a pixel outside the source reads
 * 0 (zero padding), inside it clamps to the edge. With box size S and an
 * integer offset this is an exact copy. Then channel mapping and
 * normalisation (out = v a + b per source channel).
 */
static int resample(const struct mesh_dataset *ds, const struct img *src,
                    struct box bx, int flip, struct scratch *scr, float *out)
{
    int S = ds->size, co = ds->co, cs = src->c;
    size_t plane = (size_t)S * S;
    float a[3], b[3], ag = 0, bg = 0;
    double stepx = bx.w / S, stepy = bx.h / S;
    int32_t *x0, *x1;
    float *wx;

    if (!scr->xi) {
        scr->xi = malloc(sizeof(int32_t) * 2 * MAX_SIZE);
        scr->xw = malloc(sizeof(float) * MAX_SIZE);
        if (!scr->xi || !scr->xw)
            return mesh_err(-ENOMEM, "out of memory");
    }
    x0 = scr->xi;
    x1 = scr->xi + MAX_SIZE;
    wx = scr->xw;
    for (int k = 0; k < cs; k++) {
        a[k] = 1.0f / (255.0f * ds->std[k]);
        b[k] = -ds->mean[k] / ds->std[k];
    }
    if (cs == 3 && co == 1) {
        float m =
            0.299f * ds->mean[0] + 0.587f * ds->mean[1] + 0.114f * ds->mean[2];
        float s =
            0.299f * ds->std[0] + 0.587f * ds->std[1] + 0.114f * ds->std[2];

        ag = 1.0f / (255.0f * s);
        bg = -m / s;
    }
    for (int ox = 0; ox < S; ox++) {
        int sx = flip ? S - 1 - ox : ox;
        double fx = bx.x + (sx + 0.5) * stepx - 0.5;

        if (fx < -0.5 || fx > src->w - 0.5) {
            x0[ox] = -1; /* zero padding */
            continue;
        }
        fx = fx < 0 ? 0 : fx > src->w - 1 ? src->w - 1 : fx;
        x0[ox] = (int32_t)fx;
        x1[ox] = MESH_MIN(x0[ox] + 1, src->w - 1);
        wx[ox] = (float)(fx - x0[ox]);
    }
    for (int oy = 0; oy < S; oy++) {
        double fy = bx.y + (oy + 0.5) * stepy - 0.5;
        int inside = !(fy < -0.5 || fy > src->h - 0.5), y0 = 0, y1 = 0;
        float wy = 0;

        if (inside) {
            fy = fy < 0 ? 0 : fy > src->h - 1 ? src->h - 1 : fy;
            y0 = (int)fy;
            y1 = MESH_MIN(y0 + 1, src->h - 1);
            wy = (float)(fy - y0);
        }
        if (inside && cs == 3 && co == 3 && src->sx == 3 && src->sc == 1) {
            /* Interleaved RGB to planar RGB (every JPEG): the hot path,
             * the same arithmetic as below without per-pixel dispatch. */
            const uint8_t *r0 = src->p + y0 * src->sy;
            const uint8_t *r1 = src->p + y1 * src->sy;
            float *o0 = out + (size_t)oy * S, *o1 = o0 + plane,
                  *o2 = o1 + plane;

            for (int ox = 0; ox < S; ox++) {
                int i0 = x0[ox] * 3, i1 = x1[ox] * 3;
                float w = wx[ox], v[3];

                if (x0[ox] < 0) {
                    o0[ox] = b[0];
                    o1[ox] = b[1];
                    o2[ox] = b[2];
                    continue;
                }
                for (int k = 0; k < 3; k++) {
                    float t = r0[i0 + k] + (r0[i1 + k] - r0[i0 + k]) * w;
                    float u = r1[i0 + k] + (r1[i1 + k] - r1[i0 + k]) * w;

                    v[k] = t + (u - t) * wy;
                }
                o0[ox] = v[0] * a[0] + b[0];
                o1[ox] = v[1] * a[1] + b[1];
                o2[ox] = v[2] * a[2] + b[2];
            }
            continue;
        }
        for (int ox = 0; ox < S; ox++) {
            float v[3] = {0, 0, 0};
            size_t o = (size_t)oy * S + ox;

            if (inside && x0[ox] >= 0) {
                const uint8_t *r0 = src->p + y0 * src->sy;
                const uint8_t *r1 = src->p + y1 * src->sy;
                ptrdiff_t i0 = x0[ox] * src->sx, i1 = x1[ox] * src->sx;
                float w = wx[ox];

                for (int k = 0; k < cs; k++) {
                    ptrdiff_t kk = k * src->sc;
                    float t = r0[i0 + kk] + (r0[i1 + kk] - r0[i0 + kk]) * w;
                    float u = r1[i0 + kk] + (r1[i1 + kk] - r1[i0 + kk]) * w;

                    v[k] = t + (u - t) * wy;
                }
            }
            if (cs == co) {
                for (int k = 0; k < co; k++)
                    out[k * plane + o] = v[k] * a[k] + b[k];
            } else if (cs == 1) {
                for (int k = 0; k < co; k++)
                    out[k * plane + o] = v[0] * a[0] + b[0];
            } else {
                out[o] =
                    (0.299f * v[0] + 0.587f * v[1] + 0.114f * v[2]) * ag + bg;
            }
        }
    }
    return 0;
}

/* torchvision's RandomResizedCrop box (scale 0.08-1, ratio 3/4-4/3). */
static struct box random_resized_crop(struct rng *r, int w, int h)
{
    double area = (double)w * h, lr0 = log(3.0 / 4.0), lr1 = log(4.0 / 3.0);
    struct box b;
    double in_ratio = (double)w / h;

    for (int t = 0; t < 10; t++) {
        double target = area * (0.08 + rng_uniform(r) * (1.0 - 0.08));
        double ratio = exp(lr0 + rng_uniform(r) * (lr1 - lr0));
        int cw = (int)lround(sqrt(target * ratio));
        int ch = (int)lround(sqrt(target / ratio));

        if (cw > 0 && ch > 0 && cw <= w && ch <= h) {
            b.y = rng_bounded(r, (uint64_t)(h - ch + 1));
            b.x = rng_bounded(r, (uint64_t)(w - cw + 1));
            b.w = cw;
            b.h = ch;
            return b;
        }
    }
    /* Fallback: the centre crop with the ratio clamped to [3/4, 4/3]. */
    if (in_ratio < 3.0 / 4.0) {
        b.w = w;
        b.h = lround(w / (3.0 / 4.0));
    } else if (in_ratio > 4.0 / 3.0) {
        b.h = h;
        b.w = lround(h * (4.0 / 3.0));
    } else {
        b.w = w;
        b.h = h;
    }
    b.x = (int)((w - b.w) / 2);
    b.y = (int)((h - b.h) / 2);
    return b;
}

/* Default augmentation per data set (training split only). */
static int default_augment(const struct mesh_dataset *ds)
{
    return ds->kind == K_FOLDER || ds->kind == K_CIFAR;
}

/* Make sample idx (no bad-sample handling). */
static int make_one(struct mesh_dataset *ds, int split, size_t idx,
                    uint64_t epoch, int augment, struct scratch *scr,
                    float *out)
{
    const struct split *sp = &ds->sp[split];
    struct rng r;
    struct img src;
    struct box bx;
    int flip = 0;

    rng_seed(&r, key3(ds->seed, epoch + 1, idx));
    if (ds->kind == K_FOLDER) {
#ifdef HAVE_JPEG
        int w, h, rc = jpeg_decode(sp->paths[idx], scr, &w, &h);

        if (rc < 0)
            return rc;
        src = (struct img){scr->img, 3, h, w, 1, (ptrdiff_t)w * 3, 3};
        if (augment) {
            bx = random_resized_crop(&r, w, h);
            flip = rng_uniform(&r) < 0.5;
        } else {
            double side_short = lround(ds->size * 256.0 / 224.0);
            double scale = side_short / MESH_MIN(w, h);
            double side = ds->size / scale;

            bx = (struct box){(w - side) / 2, (h - side) / 2, side, side};
        }
        return resample(ds, &src, bx, flip, scr, out);
#else
        return mesh_err(-ENOTSUP, "built without libjpeg");
#endif
    }
    {
        size_t img = (size_t)ds->sc * ds->sh * ds->sw;
        size_t slot = ds->kind == K_SYNTHETIC ? idx % SYN_POOL : idx;
        double S = ds->size;

        src = (struct img){sp->pix + slot * img,       ds->sc, ds->sh, ds->sw,
                           (ptrdiff_t)ds->sh * ds->sw, ds->sw, 1};
        if (!augment && ds->sc == ds->co && ds->sh == ds->size &&
            ds->sw == ds->size) {
            /* Native size, no augmentation: normalise only, what
             * resample computes for an identity box, without its cost. */
            size_t plane = (size_t)ds->sh * ds->sw;

            for (int k = 0; k < ds->sc; k++) {
                const uint8_t *p = src.p + k * plane;
                float *o = out + k * plane;
                float a = 1.0f / (255.0f * ds->std[k]);
                float b = -ds->mean[k] / ds->std[k];

                for (size_t i = 0; i < plane; i++)
                    o[i] = p[i] * a + b;
            }
            return 0;
        }
        if (ds->fit == MESH_DATA_FIT_RESIZE)
            bx = (struct box){0, 0, ds->sw, ds->sh};
        else
            bx = (struct box){floor((ds->sw - S) / 2), floor((ds->sh - S) / 2),
                              S, S};
        if (augment) {
            /* Pad 4, random crop, flip: a shift of -4..4 output pixels. */
            double dx = (int)rng_bounded(&r, 9) - 4;
            double dy = (int)rng_bounded(&r, 9) - 4;

            bx.x += dx * bx.w / S;
            bx.y += dy * bx.h / S;
            flip = rng_uniform(&r) < 0.5;
        }
        return resample(ds, &src, bx, flip, scr, out);
    }
}

/* Sample idx, or with skip the next good one after it (wrapping). */
static int make_sample(struct mesh_dataset *ds, int split, size_t idx,
                       uint64_t epoch, int augment, struct scratch *scr,
                       float *out, int32_t *label)
{
    struct split *sp = &ds->sp[split];
    int rc = 0;

    if (idx >= sp->count)
        return mesh_err(-EINVAL, "sample %zu beyond the %zu of the split", idx,
                        sp->count);
    for (size_t t = 0; t < sp->count; t++) {
        size_t j = (idx + t) % sp->count;

        if (sp->bad && ds->on_bad == MESH_DATA_BAD_SKIP &&
            atomic_load(&sp->bad[j]))
            continue;
        rc = make_one(ds, split, j, epoch, augment, scr, out);
        if (rc == 0) {
            *label = sp->labels[j];
            return 0;
        }
        if (rc == -ENOMEM || ds->on_bad == MESH_DATA_BAD_FAIL || !sp->bad)
            return rc;
        if (!atomic_exchange(&sp->bad[j], 1))
            mesh_warn("%s; skipped (--on-bad-sample skip): using the next "
                      "good sample instead",
                      mesh_err_msg(rc));
    }
    return mesh_err(rc ? rc : -EIO, "%s split of %s: no good sample left",
                    split ? "evaluation" : "training", ds->name);
}

int mesh_data_sample(struct mesh_dataset *ds, enum mesh_data_split split,
                     size_t index, uint64_t epoch, int augment, float *out,
                     int32_t *label)
{
    struct scratch scr = {0};
    int32_t lab = 0;
    int rc;

    if (split != MESH_DATA_TRAIN && split != MESH_DATA_EVAL)
        return mesh_err(-EINVAL, "bad split %d", (int)split);
    rc = make_sample(ds, split, index, epoch, augment, &scr, out, &lab);
    scratch_free(&scr);
    if (rc == 0)
        *label = lab;
    return rc;
}

void mesh_data_permutation(const struct mesh_dataset *ds, uint64_t epoch,
                           uint32_t *perm)
{
    size_t n = ds->sp[MESH_DATA_TRAIN].count;
    struct rng r;

    rng_seed(&r, key3(ds->seed, PERM_KEY, epoch));
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = n; i-- > 1;) {
        uint32_t j = rng_bounded(&r, i + 1), t = perm[i];

        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---- open / close ------------------------------------------------------- */

static int parse_count(const char *s, size_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v == 0 || v > (1ull << 31) || s[0] == '-')
        return mesh_err(-EINVAL,
                        "--data synthetic:%s: the count must be an integer "
                        "from 1 to 2^31",
                        s);
    *out = (size_t)v;
    return 0;
}

int mesh_data_open(const struct mesh_data_opts *o, struct mesh_dataset **out)
{
    struct mesh_dataset *ds;
    const char *spec = o->spec, *colon, *arg;
    size_t klen;
    int rc;

    if (!spec || !*spec)
        return mesh_err(-EINVAL, "--data: empty data set spec");
    if (o->channels < 0 || o->channels > 3 || o->channels == 2)
        return mesh_err(-EINVAL, "data: %d input channels (1 or 3 expected)",
                        o->channels);
    if (o->size < 0 || o->size > MAX_SIZE)
        return mesh_err(-EINVAL, "data: input size %d out of 1..%d", o->size,
                        MAX_SIZE);
    if (o->classes < 0)
        return mesh_err(-EINVAL, "data: %d classes", o->classes);
    ds = calloc(1, sizeof(*ds));
    if (!ds)
        return mesh_err(-ENOMEM, "out of memory");
    ds->seed = o->seed;
    ds->on_bad = o->on_bad;
    ds->fit = o->fit;
    colon = strchr(spec, ':');
    klen = colon ? (size_t)(colon - spec) : strlen(spec);
    arg = colon ? colon + 1 : NULL;
    if (klen == 9 && !strncmp(spec, "synthetic", klen)) {
        size_t count = SYN_DEFAULT_COUNT;

        ds->kind = K_SYNTHETIC;
        ds->classes = o->classes ? o->classes : 1000;
        ds->sc = o->channels ? o->channels : 3;
        ds->sh = ds->sw = o->size ? o->size : 224;
        rc = arg ? parse_count(arg, &count) : 0;
        if (rc == 0)
            rc = open_synthetic(ds, count);
    } else if (klen == 13 && !strncmp(spec, "fashion-mnist", klen)) {
        ds->kind = K_FMNIST;
        rc = open_fmnist(ds, arg && *arg ? arg : DEFAULT_FMNIST_DIR);
    } else if (klen == 7 && !strncmp(spec, "cifar10", klen)) {
        ds->kind = K_CIFAR;
        if (!arg || !*arg)
            rc = mesh_err(-EINVAL, "--data cifar10:DIR: DIR is missing");
        else
            rc = open_cifar(ds, arg);
    } else if (klen == 11 && !strncmp(spec, "imagefolder", klen)) {
        ds->kind = K_FOLDER;
        if (!arg || !*arg)
            rc = mesh_err(-EINVAL, "--data imagefolder:DIR: DIR is missing");
        else
            rc = open_folder(ds, arg);
    } else {
        rc = mesh_err(-EINVAL,
                      "--data %s: unknown data set (synthetic[:N], "
                      "fashion-mnist[:DIR], cifar10:DIR, imagefolder:DIR)",
                      spec);
    }
    if (rc < 0)
        goto fail;
    ds->co = o->channels ? o->channels : ds->sc;
    ds->size = o->size ? o->size : ds->kind == K_FOLDER ? 224 : ds->sh;
    if (ds->sc == 1) {
        ds->mean[1] = ds->mean[2] = ds->mean[0];
        ds->std[1] = ds->std[2] = ds->std[0];
    }
    if (ds->kind != K_FOLDER && ds->kind != K_SYNTHETIC && ds->sh != ds->sw &&
        ds->fit == MESH_DATA_FIT_RESIZE && o->size)
        mesh_warn("data: %s images are %d x %d; resized to a square", ds->name,
                  ds->sh, ds->sw);
    *out = ds;
    return 0;
fail:
    mesh_data_close(ds);
    return rc;
}

void mesh_data_close(struct mesh_dataset *ds)
{
    if (!ds)
        return;
    for (int s = 0; s < 2; s++) {
        struct split *sp = &ds->sp[s];

        free(sp->labels);
        free(sp->pix);
        if (sp->paths)
            free_names(sp->paths, sp->count);
        free(sp->bad);
    }
    if (ds->class_names)
        free_names(ds->class_names, (size_t)ds->classes);
    free(ds);
}

void mesh_data_get_info(const struct mesh_dataset *ds,
                        struct mesh_data_info *info)
{
    memset(info, 0, sizeof(*info));
    info->train_count = ds->sp[MESH_DATA_TRAIN].count;
    info->eval_count = ds->sp[MESH_DATA_EVAL].count;
    info->classes = ds->classes;
    info->channels = ds->co;
    info->size = ds->size;
    info->src_channels = ds->sc;
    info->src_height = ds->sh;
    info->src_width = ds->sw;
    memcpy(info->mean, ds->mean, sizeof(info->mean));
    memcpy(info->std, ds->std, sizeof(info->std));
    info->name = ds->name;
}

const char *mesh_data_class_name(const struct mesh_dataset *ds, int k)
{
    static const char *digits[] = {"0", "1", "2", "3", "4",
                                   "5", "6", "7", "8", "9"};

    if (k < 0 || k >= ds->classes)
        return "?";
    if (ds->class_names)
        return ds->class_names[k];
    return k < 10 ? digits[k] : "class";
}

static int fp_u64(EVP_MD_CTX *ctx, uint64_t v)
{
    uint8_t le[8];

    mesh_put_le64(le, v);
    return EVP_DigestUpdate(ctx, le, 8);
}

int mesh_data_fingerprint(const struct mesh_dataset *ds, uint8_t out[32])
{
    size_t img = (size_t)ds->sc * ds->sh * ds->sw;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int olen = 0;
    int ok;

    if (!ctx)
        return mesh_err(-ENOMEM, "data fingerprint: out of memory");
    ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
         EVP_DigestUpdate(ctx, "meshtrain-data 1", 17) &&
         EVP_DigestUpdate(ctx, ds->name, strlen(ds->name) + 1) &&
         fp_u64(ctx, (uint64_t)ds->classes) && fp_u64(ctx, (uint64_t)ds->co) &&
         fp_u64(ctx, (uint64_t)ds->size) && fp_u64(ctx, (uint64_t)ds->sc) &&
         fp_u64(ctx, (uint64_t)ds->sh) && fp_u64(ctx, (uint64_t)ds->sw) &&
         fp_u64(ctx, (uint64_t)ds->fit);
    for (int c = 0; ok && c < 3; c++)
        ok = fp_u64(ctx, (uint64_t)lroundf(ds->mean[c] * 1e6f)) &&
             fp_u64(ctx, (uint64_t)lroundf(ds->std[c] * 1e6f));
    for (int s = 0; ok && s < 2; s++) {
        const struct split *sp = &ds->sp[s];
        size_t pix = ds->kind == K_SYNTHETIC
                         ? MESH_MIN(sp->count, (size_t)SYN_POOL)
                         : sp->count;

        ok = fp_u64(ctx, sp->count);
        for (size_t i = 0; ok && i < sp->count; i++)
            ok = fp_u64(ctx, (uint64_t)(uint32_t)sp->labels[i]);
        if (ok && sp->pix)
            ok = EVP_DigestUpdate(ctx, sp->pix, pix * img);
        for (size_t i = 0; ok && sp->paths && i < sp->count; i++) {
            const char *rel = sp->paths[i] + ds->root_len;

            ok = EVP_DigestUpdate(ctx, rel, strlen(rel) + 1);
        }
    }
    ok = ok && EVP_DigestFinal_ex(ctx, out, &olen);
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : mesh_err(-EIO, "data fingerprint: SHA-256 failed");
}

int mesh_data_parse_bad(const char *s, enum mesh_data_bad *out)
{
    if (!strcmp(s, "skip"))
        *out = MESH_DATA_BAD_SKIP;
    else if (!strcmp(s, "fail"))
        *out = MESH_DATA_BAD_FAIL;
    else
        return mesh_err(-EINVAL, "--on-bad-sample %s: expected skip or fail",
                        s);
    return 0;
}

/* ---- the loader --------------------------------------------------------- */

/* One batch of the ring. */
struct slot {
    float *x;     /* (batch, co, size, size) */
    int32_t *y;   /* (batch) */
    uint64_t seq; /* batch sequence number it holds */
    int n;        /* samples in it */
    int done;     /* samples finished */
    int err;      /* first error of a sample, 0 if none */
    char msg[1024];
    uint64_t epoch, step;
};

struct mesh_loader {
    struct mesh_dataset *ds;
    int split, batch, rank, world, augment, nthreads, depth;
    uint64_t spe; /* steps per epoch */
    size_t sample_floats;

    pthread_mutex_t mu;
    pthread_cond_t cv_work;  /* workers: a slot or a stop */
    pthread_cond_t cv_ready; /* consumer: a batch complete */
    pthread_t *threads;
    int running; /* threads started */
    int stop;

    struct slot *slots;
    uint64_t base;        /* absolute batch index (epoch * spe + step) of
                             sequence 0 */
    uint64_t assign_seq;  /* next task: batch sequence ... */
    int assign_i;         /* ... and sample within it */
    uint64_t consume_seq; /* next batch mesh_data_next returns */
    int held;             /* the consumer holds consume_seq - 1 */
    int failed;
    uint32_t *perm; /* permutation of perm_epoch, (train count) */
    uint64_t perm_epoch;
    int perm_valid;
};

struct task {
    struct slot *slot;
    int i;
    size_t idx;
    uint64_t epoch;
};

static uint64_t eval_count_for(const struct mesh_loader *ld)
{
    size_t n = ld->ds->sp[MESH_DATA_EVAL].count;

    return n > (size_t)ld->rank
               ? (n - (size_t)ld->rank + (size_t)ld->world - 1) /
                     (size_t)ld->world
               : 0;
}

/* Under mu: can a task be handed out now? */
static int can_assign(const struct mesh_loader *ld)
{
    uint64_t released = ld->consume_seq - (uint64_t)ld->held;

    if (ld->stop || ld->failed)
        return 0;
    if (ld->assign_seq >= released + (uint64_t)ld->depth)
        return 0;
    if (ld->split == MESH_DATA_EVAL && ld->assign_seq >= ld->spe)
        return 0;
    return 1;
}

/* Under mu: take the next task; sets up its slot on the batch's first. */
static void assign(struct mesh_loader *ld, struct task *t)
{
    uint64_t seq = ld->assign_seq;
    struct slot *s = &ld->slots[seq % (uint64_t)ld->depth];
    uint64_t abs = ld->base + seq, epoch, step;

    if (ld->split == MESH_DATA_TRAIN) {
        epoch = abs / ld->spe;
        step = abs % ld->spe;
    } else {
        epoch = 0;
        step = abs;
    }
    if (ld->assign_i == 0) {
        s->seq = seq;
        s->done = 0;
        s->err = 0;
        s->epoch = epoch;
        s->step = step;
        if (ld->split == MESH_DATA_TRAIN) {
            s->n = ld->batch;
        } else {
            uint64_t left = eval_count_for(ld) - step * (uint64_t)ld->batch;

            s->n = (int)MESH_MIN(left, (uint64_t)ld->batch);
        }
    }
    t->slot = s;
    t->i = ld->assign_i;
    t->epoch = epoch;
    if (ld->split == MESH_DATA_TRAIN) {
        uint64_t pos = step * (uint64_t)ld->batch * (uint64_t)ld->world +
                       (uint64_t)ld->rank * (uint64_t)ld->batch +
                       (uint64_t)t->i;

        if (!ld->perm_valid || ld->perm_epoch != epoch) {
            mesh_data_permutation(ld->ds, epoch, ld->perm);
            ld->perm_epoch = epoch;
            ld->perm_valid = 1;
        }
        t->idx = ld->perm[pos];
    } else {
        t->idx = (size_t)((step * (uint64_t)ld->batch + (uint64_t)t->i) *
                              (uint64_t)ld->world +
                          (uint64_t)ld->rank);
    }
    if (++ld->assign_i == s->n) {
        ld->assign_i = 0;
        ld->assign_seq++;
    }
}

static void *worker(void *arg)
{
    struct mesh_loader *ld = arg;
    struct scratch scr = {0};
    struct task t;

    pthread_mutex_lock(&ld->mu);
    for (;;) {
        int rc;

        while (!ld->stop && !can_assign(ld))
            pthread_cond_wait(&ld->cv_work, &ld->mu);
        if (ld->stop)
            break;
        assign(ld, &t);
        pthread_mutex_unlock(&ld->mu);

        rc = make_sample(ld->ds, ld->split, t.idx, t.epoch, ld->augment, &scr,
                         t.slot->x + (size_t)t.i * ld->sample_floats,
                         &t.slot->y[t.i]);

        pthread_mutex_lock(&ld->mu);
        if (rc < 0 && !t.slot->err) {
            t.slot->err = rc;
            snprintf(t.slot->msg, sizeof(t.slot->msg), "%s", mesh_err_msg(rc));
        }
        if (++t.slot->done == t.slot->n)
            pthread_cond_broadcast(&ld->cv_ready);
    }
    pthread_mutex_unlock(&ld->mu);
    scratch_free(&scr);
    return NULL;
}

static int start_threads(struct mesh_loader *ld)
{
    int rc;

    ld->stop = 0;
    for (ld->running = 0; ld->running < ld->nthreads; ld->running++) {
        rc = pthread_create(&ld->threads[ld->running], NULL, worker, ld);
        if (rc != 0)
            return mesh_err(-rc, "data loader: pthread_create: %s",
                            strerror(rc));
    }
    return 0;
}

static void stop_threads(struct mesh_loader *ld)
{
    pthread_mutex_lock(&ld->mu);
    ld->stop = 1;
    pthread_cond_broadcast(&ld->cv_work);
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->running; i++)
        pthread_join(ld->threads[i], NULL);
    ld->running = 0;
}

static void reset_position(struct mesh_loader *ld, uint64_t base)
{
    ld->base = base;
    ld->assign_seq = 0;
    ld->assign_i = 0;
    ld->consume_seq = 0;
    ld->held = 0;
    ld->failed = 0;
    for (int i = 0; i < ld->depth; i++)
        ld->slots[i].seq = UINT64_MAX;
}

/* The loader's memory (its threads stopped, or never started). */
static void loader_free(struct mesh_loader *ld)
{
    if (ld->slots)
        for (int i = 0; i < ld->depth; i++) {
            free(ld->slots[i].x);
            free(ld->slots[i].y);
        }
    free(ld->slots);
    free(ld->threads);
    free(ld->perm);
    free(ld);
}

int mesh_loader_create(struct mesh_dataset *ds,
                       const struct mesh_loader_opts *o,
                       struct mesh_loader **out)
{
    struct mesh_loader *ld;
    size_t n = ds->sp[o->split == MESH_DATA_EVAL].count;
    int rc;

    if (o->split != MESH_DATA_TRAIN && o->split != MESH_DATA_EVAL)
        return mesh_err(-EINVAL, "data loader: bad split %d", (int)o->split);
    if (o->batch < 1 || o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return mesh_err(-EINVAL,
                        "data loader: bad batch %d / rank %d / world %d",
                        o->batch, o->rank, o->world);
    if (o->threads < 0 || o->threads > 256 || o->depth < 0 || o->depth > 1024)
        return mesh_err(-EINVAL, "data loader: bad threads %d / depth %d",
                        o->threads, o->depth);
    if (o->accumulate < 0 || o->accumulate > 65536)
        return mesh_err(-EINVAL, "data loader: bad accumulate %d",
                        o->accumulate);
    if (o->split == MESH_DATA_TRAIN &&
        n / ((size_t)o->world * (size_t)o->batch) <
            (size_t)MESH_MAX(o->accumulate, 1))
        return mesh_err(-EINVAL,
                        "data: the %zu training samples of %s make no step "
                        "of %d peers x batch %d x %d micro-batches",
                        n, ds->name, o->world, o->batch,
                        MESH_MAX(o->accumulate, 1));
    ld = calloc(1, sizeof(*ld));
    if (!ld)
        return mesh_err(-ENOMEM, "out of memory");
    ld->ds = ds;
    ld->split = o->split;
    ld->batch = o->batch;
    ld->rank = o->rank;
    ld->world = o->world;
    ld->nthreads = o->threads ? o->threads : 2;
    /* Enough batches in flight for two samples per thread, plus the one
     * the consumer holds; at least two ready ahead of it. */
    ld->depth =
        o->depth
            ? o->depth
            : MESH_MAX(3, (2 * ld->nthreads + o->batch - 1) / o->batch + 1);
    ld->augment = o->split == MESH_DATA_EVAL ? 0
                  : o->augment < 0           ? default_augment(ds)
                                             : !!o->augment;
    ld->sample_floats = (size_t)ds->co * ds->size * ds->size;
    if (o->split == MESH_DATA_TRAIN) {
        uint64_t k = (uint64_t)MESH_MAX(o->accumulate, 1);

        ld->spe = n / ((size_t)o->batch * (size_t)o->world) / k * k;
    } else {
        uint64_t mine = eval_count_for(ld);

        ld->spe = (mine + (uint64_t)o->batch - 1) / (uint64_t)o->batch;
    }
    rc = -ENOMEM;
    ld->threads = calloc((size_t)ld->nthreads, sizeof(pthread_t));
    ld->slots = calloc((size_t)ld->depth, sizeof(struct slot));
    if (o->split == MESH_DATA_TRAIN)
        ld->perm = malloc(sizeof(uint32_t) * n);
    if (!ld->threads || !ld->slots ||
        (o->split == MESH_DATA_TRAIN && !ld->perm)) {
        mesh_err(rc, "data loader: out of memory");
        goto fail;
    }
    for (int i = 0; i < ld->depth; i++) {
        ld->slots[i].x =
            malloc(sizeof(float) * ld->sample_floats * (size_t)ld->batch);
        ld->slots[i].y = malloc(sizeof(int32_t) * (size_t)ld->batch);
        if (!ld->slots[i].x || !ld->slots[i].y) {
            mesh_err(rc,
                     "data loader: cannot allocate %d batches of %zu "
                     "bytes",
                     ld->depth,
                     sizeof(float) * ld->sample_floats * (size_t)ld->batch);
            goto fail;
        }
    }
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv_work, NULL);
    pthread_cond_init(&ld->cv_ready, NULL);
    reset_position(ld, 0);
    rc = start_threads(ld);
    if (rc < 0) {
        mesh_loader_destroy(ld);
        return rc;
    }
    *out = ld;
    return 0;
fail:
    loader_free(ld);
    return rc;
}

void mesh_loader_destroy(struct mesh_loader *ld)
{
    if (!ld)
        return;
    stop_threads(ld);
    pthread_cond_destroy(&ld->cv_ready);
    pthread_cond_destroy(&ld->cv_work);
    pthread_mutex_destroy(&ld->mu);
    loader_free(ld);
}

uint64_t mesh_loader_steps_per_epoch(const struct mesh_loader *ld)
{
    return ld->spe;
}

int mesh_data_next(struct mesh_loader *ld, struct mesh_batch *batch)
{
    struct slot *s;
    uint64_t t0;
    int rc;

    pthread_mutex_lock(&ld->mu);
    if (ld->held) {
        ld->held = 0;
        pthread_cond_broadcast(&ld->cv_work);
    }
    if (ld->split == MESH_DATA_EVAL && ld->consume_seq >= ld->spe) {
        pthread_mutex_unlock(&ld->mu);
        return 1;
    }
    s = &ld->slots[ld->consume_seq % (uint64_t)ld->depth];
    t0 = mesh_now_ns();
    while (!(s->seq == ld->consume_seq && s->done == s->n))
        pthread_cond_wait(&ld->cv_ready, &ld->mu);
    if (s->err) {
        /* The message was recorded on a worker thread: raise it here. */
        ld->failed = 1;
        rc = mesh_err(s->err, "%s", s->msg);
        pthread_mutex_unlock(&ld->mu);
        return rc;
    }
    batch->x = s->x;
    batch->y = s->y;
    batch->n = s->n;
    batch->channels = ld->ds->co;
    batch->size = ld->ds->size;
    batch->epoch = s->epoch;
    batch->step = s->step;
    batch->wait_s = (double)(mesh_now_ns() - t0) * 1e-9;
    ld->consume_seq++;
    ld->held = 1;
    pthread_mutex_unlock(&ld->mu);
    return 0;
}

void mesh_data_tell(const struct mesh_loader *ld, uint64_t *epoch,
                    uint64_t *step)
{
    uint64_t abs = ld->base + ld->consume_seq;

    if (ld->split == MESH_DATA_TRAIN) {
        *epoch = abs / ld->spe;
        *step = abs % ld->spe;
    } else {
        *epoch = 0;
        *step = abs;
    }
}

int mesh_data_seek(struct mesh_loader *ld, uint64_t epoch, uint64_t step)
{
    if (ld->split == MESH_DATA_EVAL
            ? epoch != 0 || step > ld->spe
            : step >= ld->spe || epoch > UINT64_MAX / ld->spe - 1)
        return mesh_err(-EINVAL,
                        "data: cannot seek to epoch %" PRIu64 " step %" PRIu64
                        " (%" PRIu64 " steps per epoch)",
                        epoch, step, ld->spe);
    stop_threads(ld);
    reset_position(ld, epoch * ld->spe + step);
    return start_threads(ld);
}

/* ---- state record ------------------------------------------------------- */

#define STATE_MAGIC   0x6174616468736d6dull /* "mmshdata" little-endian */
#define STATE_VERSION 1

/* Layout: magic, version, seed, epoch, step, batch, world, rank | count
 * (rank in the low 32 bits of the last word, count of samples above). */
void mesh_data_get_state(const struct mesh_loader *ld,
                         uint8_t state[MESH_DATA_STATE_BYTES])
{
    uint64_t epoch, step;

    mesh_data_tell(ld, &epoch, &step);
    memset(state, 0, MESH_DATA_STATE_BYTES);
    mesh_put_le64(state + 0, STATE_MAGIC);
    mesh_put_le64(state + 8, STATE_VERSION);
    mesh_put_le64(state + 16, ld->ds->seed);
    mesh_put_le64(state + 24, epoch);
    mesh_put_le64(state + 32, step);
    mesh_put_le64(state + 40, (uint64_t)ld->batch);
    mesh_put_le64(state + 48, (uint64_t)ld->world);
    mesh_put_le64(state + 56, (uint64_t)(uint32_t)ld->rank |
                          (uint64_t)ld->ds->sp[ld->split].count << 32);
}

int mesh_data_set_state(struct mesh_loader *ld, const uint8_t *st, size_t len)
{
    uint64_t count = ld->ds->sp[ld->split].count;

    if (len != MESH_DATA_STATE_BYTES)
        return mesh_err(-EINVAL, "data state: %zu bytes, expected %d", len,
                        MESH_DATA_STATE_BYTES);
    if (mesh_get_le64(st) != STATE_MAGIC || mesh_get_le64(st + 8) != STATE_VERSION)
        return mesh_err(-EINVAL, "data state: bad magic or version");
    if (mesh_get_le64(st + 16) != ld->ds->seed)
        return mesh_err(-EINVAL,
                        "data state: seed %" PRIu64 " differs from this "
                        "run's %" PRIu64,
                        mesh_get_le64(st + 16), ld->ds->seed);
    if (mesh_get_le64(st + 40) != (uint64_t)ld->batch)
        return mesh_err(-EINVAL,
                        "data state: batch %" PRIu64 " differs from this "
                        "run's %d",
                        mesh_get_le64(st + 40), ld->batch);
    if (mesh_get_le64(st + 48) != (uint64_t)ld->world)
        return mesh_err(-EINVAL,
                        "data state: world %" PRIu64 " differs from this "
                        "run's %d",
                        mesh_get_le64(st + 48), ld->world);
    if (mesh_get_le64(st + 56) >> 32 != count)
        return mesh_err(-EINVAL,
                        "data state: %" PRIu64 " samples differ from this "
                        "data set's %" PRIu64,
                        mesh_get_le64(st + 56) >> 32, count);
    return mesh_data_seek(ld, mesh_get_le64(st + 24), mesh_get_le64(st + 32));
}
