/*
 * train/ckpt.c: atomic, checksummed checkpoint directories (layout in
 * train/ckpt.h).
 */
#include "config.h"

#include "train/ckpt.h"
#include "common/array.h"
#include "common/bytes.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MANIFEST     "MANIFEST"
#define MANIFEST_MAX (1u << 20)
#define PREFIX       "ckpt-"
#define TMP_PREFIX   ".ckpt-"
#define PATH_CAP     4096

struct blob {
    char name[MESH_CKPT_NAME_MAX + 1];
    uint64_t len;
    uint8_t sha[MESH_CKPT_DIGEST_LEN];
    unsigned flags;
    int pending; /* put_file: written by the caller, not hashed */
};

struct mesh_ckpt_writer {
    char dir[PATH_CAP];
    char tmp[PATH_CAP];
    uint64_t step;
    struct blob *blobs;
    size_t n;
};

struct mesh_ckpt {
    char path[PATH_CAP];
    struct mesh_ckpt_meta meta;
    uint8_t digest[MESH_CKPT_DIGEST_LEN];
    struct blob *blobs;
    size_t n;
};

/* ---- hashing ------------------------------------------------------------ */

int mesh_ckpt_sha256(const void *data, size_t len,
                     uint8_t out[MESH_CKPT_DIGEST_LEN])
{
    unsigned int olen = 0;

    if (!EVP_Digest(data, len, out, &olen, EVP_sha256(), NULL) ||
        olen != MESH_CKPT_DIGEST_LEN)
        return mesh_err(-EIO, "SHA-256 (OpenSSL EVP_Digest) failed");
    return 0;
}

static void hex(const uint8_t *d, char *out)
{
    static const char x[] = "0123456789abcdef";

    for (int i = 0; i < MESH_CKPT_DIGEST_LEN; i++) {
        out[2 * i] = x[d[i] >> 4];
        out[2 * i + 1] = x[d[i] & 15];
    }
    out[2 * MESH_CKPT_DIGEST_LEN] = '\0';
}

static int unhex(const char *s, uint8_t *d)
{
    for (int i = 0; i < 2 * MESH_CKPT_DIGEST_LEN; i++) {
        int v;

        if (s[i] >= '0' && s[i] <= '9')
            v = s[i] - '0';
        else if (s[i] >= 'a' && s[i] <= 'f')
            v = s[i] - 'a' + 10;
        else
            return -1;
        if (i % 2 == 0)
            d[i / 2] = (uint8_t)(v << 4);
        else
            d[i / 2] |= (uint8_t)v;
    }
    return s[2 * MESH_CKPT_DIGEST_LEN] == '\0' ? 0 : -1;
}

/*
 * Hash a whole file (and fsync it when do_sync); *len gets its size.
 * When expect_len is not NULL, a file of another size is an error.
 */
static int hash_file(const char *path, int do_sync, uint64_t *len,
                     uint8_t sha[MESH_CKPT_DIGEST_LEN], void *keep,
                     size_t keep_len)
{
    uint8_t buf[1 << 16];
    EVP_MD_CTX *ctx;
    uint64_t total = 0;
    unsigned int olen = 0;
    int fd, rc = 0;

    if (do_sync) {
        do {
            fd = open(path, O_RDWR | O_CLOEXEC);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0)
            return mesh_err_errno("%s", path);
    } else {
        /* a FIFO in its place would block the open, a device such as
         * /dev/zero never end: a blob must be a regular file */
        rc = mesh_open_input(NULL, path, 0, &fd, NULL);
        if (rc < 0)
            return rc;
    }
    ctx = EVP_MD_CTX_new();
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        rc = mesh_err(-EIO, "%s: SHA-256 init failed", path);
        goto out;
    }
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc =
                mesh_err_errno("%s: read at byte offset %" PRIu64, path, total);
            goto out;
        }
        if (n == 0)
            break;
        if (keep) {
            if (total + (uint64_t)n > keep_len) {
                rc = mesh_err(-EIO,
                              "%s: longer than the %zu bytes the manifest "
                              "records",
                              path, keep_len);
                goto out;
            }
            memcpy((uint8_t *)keep + total, buf, (size_t)n);
        }
        if (!EVP_DigestUpdate(ctx, buf, (size_t)n)) {
            rc = mesh_err(-EIO, "%s: SHA-256 update failed", path);
            goto out;
        }
        total += (uint64_t)n;
    }
    if (!EVP_DigestFinal_ex(ctx, sha, &olen)) {
        rc = mesh_err(-EIO, "%s: SHA-256 final failed", path);
        goto out;
    }
    if (do_sync && fsync(fd) != 0) {
        rc = mesh_err_errno("fsync %s", path);
        goto out;
    }
    *len = total;
out:
    EVP_MD_CTX_free(ctx);
    close(fd);
    return rc;
}

/* ---- small file helpers ------------------------------------------------- */

static int write_all(int fd, const void *data, size_t len, const char *path)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = write(fd, (const uint8_t *)data + done,
                          MESH_MIN(len - done, (size_t)1 << 30));

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return mesh_err_errno("write %s at byte offset %zu", path, done);
        done += (size_t)n;
    }
    return 0;
}

/* Create path exclusively, write, fsync, close. */
static int write_file(const char *path, const void *data, size_t len)
{
    int fd, rc;

    do {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return mesh_err_errno("create %s", path);
    rc = write_all(fd, data, len, path);
    if (rc == 0 && fsync(fd) != 0)
        rc = mesh_err_errno("fsync %s", path);
    if (close(fd) != 0 && rc == 0)
        rc = mesh_err_errno("close %s", path);
    return rc;
}

static int fsync_dir(const char *path)
{
    int fd, rc = 0;

    do {
        fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return mesh_err_errno("open directory %s", path);
    if (fsync(fd) != 0)
        rc = mesh_err_errno("fsync directory %s", path);
    close(fd);
    return rc;
}

/* Remove a checkpoint (or temporary) directory: flat files only. */
static int remove_tree(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    char p[PATH_CAP + 300];
    int rc = 0;

    if (!d)
        return errno == ENOENT ? 0 : mesh_err_errno("open directory %s", path);
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
        if (unlink(p) != 0 && errno != ENOENT && rc == 0)
            rc = mesh_err_errno("remove %s", p);
    }
    closedir(d);
    if (rmdir(path) != 0 && errno != ENOENT && rc == 0)
        rc = mesh_err_errno("remove directory %s", path);
    return rc;
}

/* This host's name as temporary directories carry it ("" when unknown). */
static const char *this_host(void)
{
    static char host[256];

    if (!host[0] && gethostname(host, sizeof(host) - 1) != 0)
        host[0] = '\0';
    host[sizeof(host) - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/')
            *c = '_';
    return host;
}

/*
 * Whether the temporary directory name (TMP_PREFIX<step>.tmp.<pid>.<n>
 * [.<host>]) was left by a writer that is provably gone: this process, or
 * a process of this host that no longer exists. A directory can be shared
 * for a while by two processes (an --elastic peer that a view left out
 * still finishes the write it was in while its rank's number, and so its
 * directory, belongs to another peer), so a live writer's directory is
 * never removed, nor one from another host, whose own writer prunes it.
 */
static int tmp_is_stale(const char *name)
{
    const char *p = strstr(name, ".tmp.");
    char *end;
    unsigned long pid;

    if (!p)
        return 0;
    errno = 0;
    pid = strtoul(p + 5, &end, 10);
    if (errno || end == p + 5 || *end != '.' || pid == 0 || pid > INT32_MAX)
        return 1; /* not a name we write: a stray, remove it */
    strtoul(end + 1, &end, 10);
    if (*end == '.' && strcmp(end + 1, this_host()))
        return 0;
    if ((pid_t)pid == getpid())
        return 1;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static int valid_name(const char *name)
{
    size_t n = strlen(name);

    if (n == 0 || n > MESH_CKPT_NAME_MAX || name[0] == '.' ||
        !strcmp(name, MANIFEST))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int mesh_ckpt_path(const char *dir, uint64_t step, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s/" PREFIX "%09" PRIu64, dir, step);

    if (n < 0 || (size_t)n >= cap)
        return mesh_err(-ENAMETOOLONG, "checkpoint path under %s too long",
                        dir);
    return 0;
}

/* ---- writing ------------------------------------------------------------ */

int mesh_ckpt_begin(const char *dir, uint64_t step,
                    struct mesh_ckpt_writer **out)
{
    static atomic_uint counter;
    struct mesh_ckpt_writer *w;
    int n;

    if (!dir || !*dir || strlen(dir) > PATH_CAP - 200)
        return mesh_err(-EINVAL, "checkpoint directory name bad or too long");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return mesh_err_errno("create checkpoint directory %s", dir);
    w = calloc(1, sizeof(*w));
    if (!w)
        return mesh_err(-ENOMEM, "out of memory");
    snprintf(w->dir, sizeof(w->dir), "%s", dir);
    w->step = step;
    n = snprintf(w->tmp, sizeof(w->tmp),
                 "%s/" TMP_PREFIX "%09" PRIu64 ".tmp.%ld.%u.%s", dir, step,
                 (long)getpid(), atomic_fetch_add(&counter, 1), this_host());
    if (n < 0 || (size_t)n >= sizeof(w->tmp)) {
        free(w);
        return mesh_err(-ENAMETOOLONG, "checkpoint path too long");
    }
    if (mkdir(w->tmp, 0755) != 0) {
        int rc = mesh_err_errno("create %s", w->tmp);

        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* The blob named name among blobs[0, n), or NULL. */
static const struct blob *blob_lookup(const struct blob *blobs, size_t n,
                                      const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(blobs[i].name, name))
            return &blobs[i];
    return NULL;
}

/* A new blob after the n of *blobs, zeroed but for name and flags (the
 * caller counts it); NULL without memory. */
static struct blob *blob_append(struct blob **blobs, size_t n, const char *name,
                                unsigned flags)
{
    struct blob *nb = realloc(*blobs, (n + 1) * sizeof(*nb));

    if (!nb) {
        mesh_err(-ENOMEM, "out of memory");
        return NULL;
    }
    *blobs = nb;
    nb += n;
    memset(nb, 0, sizeof(*nb));
    snprintf(nb->name, sizeof(nb->name), "%s", name);
    nb->flags = flags;
    return nb;
}

static int add_blob(struct mesh_ckpt_writer *w, const char *name,
                    unsigned flags, struct blob **out)
{
    struct blob *nb;

    if (!valid_name(name))
        return mesh_err(-EINVAL,
                        "checkpoint blob name \"%s\": 1-%d characters of "
                        "[A-Za-z0-9._-], not starting with '.', not "
                        "MANIFEST",
                        name, MESH_CKPT_NAME_MAX);
    if (flags & ~MESH_CKPT_SHARED)
        return mesh_err(-EINVAL, "checkpoint blob %s: bad flags 0x%x", name,
                        flags);
    if (blob_lookup(w->blobs, w->n, name))
        return mesh_err(-EINVAL, "checkpoint blob %s given twice", name);
    if (w->n >= MESH_CKPT_BLOBS_MAX)
        return mesh_err(-EINVAL, "more than %d checkpoint blobs",
                        MESH_CKPT_BLOBS_MAX);
    nb = blob_append(&w->blobs, w->n, name, flags);
    if (!nb)
        return -ENOMEM;
    *out = nb;
    return 0;
}

int mesh_ckpt_put(struct mesh_ckpt_writer *w, const char *name,
                  const void *data, size_t len, unsigned flags)
{
    char path[PATH_CAP + 100];
    struct blob *b;
    int rc = add_blob(w, name, flags, &b);

    if (rc < 0)
        return rc;
    snprintf(path, sizeof(path), "%s/%s", w->tmp, name);
    rc = mesh_ckpt_sha256(data, len, b->sha);
    if (rc == 0)
        rc = write_file(path, data, len);
    if (rc < 0)
        return rc;
    b->len = len;
    w->n++;
    return 0;
}

int mesh_ckpt_put_file(struct mesh_ckpt_writer *w, const char *name,
                       unsigned flags, char *path, size_t cap)
{
    struct blob *b;
    int n, rc = add_blob(w, name, flags, &b);

    if (rc < 0)
        return rc;
    n = snprintf(path, cap, "%s/%s", w->tmp, name);
    if (n < 0 || (size_t)n >= cap)
        return mesh_err(-ENAMETOOLONG, "checkpoint blob path too long");
    b->pending = 1;
    w->n++;
    return 0;
}

static int agreement_digest(const struct blob *b, size_t n,
                            uint8_t out[MESH_CKPT_DIGEST_LEN])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int olen = 0;
    int ok;

    if (!ctx)
        return mesh_err(-ENOMEM, "SHA-256: out of memory");
    ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    for (size_t i = 0; ok && i < n; i++) {
        uint8_t le[8];

        if (!(b[i].flags & MESH_CKPT_SHARED))
            continue;
        mesh_put_le64(le, b[i].len);
        ok = EVP_DigestUpdate(ctx, b[i].name, strlen(b[i].name) + 1) &&
             EVP_DigestUpdate(ctx, le, 8) &&
             EVP_DigestUpdate(ctx, b[i].sha, MESH_CKPT_DIGEST_LEN);
    }
    ok = ok && EVP_DigestFinal_ex(ctx, out, &olen);
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : mesh_err(-EIO, "SHA-256 failed");
}

/* The manifest text without its final checksum line. */
static int manifest_body(const struct mesh_ckpt_meta *m, const uint8_t *dg,
                         const struct blob *b, size_t n, char **out,
                         size_t *len)
{
    size_t cap = 512 + n * (MESH_CKPT_NAME_MAX + 120), off = 0;
    char *s = malloc(cap), h[2 * MESH_CKPT_DIGEST_LEN + 1];

    if (!s)
        return mesh_err(-ENOMEM, "out of memory");
    off += (size_t)snprintf(s + off, cap - off,
                            "meshtrain-checkpoint 1\nstep %" PRIu64
                            "\nepoch %" PRIu64 "\n",
                            m->step, m->epoch);
    hex(m->config, h);
    off += (size_t)snprintf(s + off, cap - off, "config %s\n", h);
    hex(dg, h);
    off += (size_t)snprintf(s + off, cap - off, "digest %s\n", h);
    for (size_t i = 0; i < n; i++) {
        hex(b[i].sha, h);
        off += (size_t)snprintf(
            s + off, cap - off, "blob %s %" PRIu64 " %s %u\n", b[i].name,
            b[i].len, h, (b[i].flags & MESH_CKPT_SHARED) ? 1u : 0u);
    }
    *out = s;
    *len = off;
    return 0;
}

static void writer_free(struct mesh_ckpt_writer *w)
{
    free(w->blobs);
    free(w);
}

void mesh_ckpt_abort(struct mesh_ckpt_writer *w)
{
    if (!w)
        return;
    remove_tree(w->tmp);
    writer_free(w);
}

/* Move tmp to final; an existing final of the same step is replaced. */
static int install(const char *tmp, const char *final)
{
    if (rename(tmp, final) == 0)
        return 0;
    if (errno != ENOTEMPTY && errno != EEXIST)
        return mesh_err_errno("rename %s to %s", tmp, final);
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0)
        return remove_tree(tmp); /* tmp now holds the old checkpoint */
#endif
    /* No atomic exchange: move the old one aside first. */
    {
        char old[PATH_CAP + 16];

        snprintf(old, sizeof(old), "%s.old", tmp);
        if (rename(final, old) != 0)
            return mesh_err_errno("rename %s to %s", final, old);
        if (rename(tmp, final) != 0)
            return mesh_err_errno("rename %s to %s", tmp, final);
        return remove_tree(old);
    }
}

int mesh_ckpt_commit(struct mesh_ckpt_writer *w,
                     const struct mesh_ckpt_meta *meta,
                     uint8_t digest_out[MESH_CKPT_DIGEST_LEN])
{
    char path[PATH_CAP + 100], final[PATH_CAP], h[65], *body = NULL;
    uint8_t dg[MESH_CKPT_DIGEST_LEN], sum[MESH_CKPT_DIGEST_LEN];
    size_t blen = 0;
    int rc;

    if (meta->step != w->step) {
        rc = mesh_err(-EINVAL,
                      "checkpoint begun for step %" PRIu64
                      " committed as step %" PRIu64,
                      w->step, meta->step);
        goto fail;
    }
    for (size_t i = 0; i < w->n; i++) {
        struct blob *b = &w->blobs[i];

        if (!b->pending)
            continue;
        snprintf(path, sizeof(path), "%s/%s", w->tmp, b->name);
        rc = hash_file(path, 1, &b->len, b->sha, NULL, 0);
        if (rc < 0) {
            mesh_err_prefix(rc, "checkpoint blob %s was not written", b->name);
            goto fail;
        }
        b->pending = 0;
    }
    rc = agreement_digest(w->blobs, w->n, dg);
    if (rc < 0)
        goto fail;
    rc = manifest_body(meta, dg, w->blobs, w->n, &body, &blen);
    if (rc < 0)
        goto fail;
    rc = mesh_ckpt_sha256(body, blen, sum);
    if (rc < 0)
        goto fail;
    hex(sum, h);
    {
        char *nb = realloc(body, blen + 80);

        if (!nb) {
            rc = mesh_err(-ENOMEM, "out of memory");
            goto fail;
        }
        body = nb;
        blen += (size_t)snprintf(body + blen, 80, "sha256 %s\n", h);
    }
    snprintf(path, sizeof(path), "%s/" MANIFEST, w->tmp);
    rc = write_file(path, body, blen);
    if (rc < 0)
        goto fail;
    rc = fsync_dir(w->tmp);
    if (rc < 0)
        goto fail;
    rc = mesh_ckpt_path(w->dir, w->step, final, sizeof(final));
    if (rc < 0)
        goto fail;
    rc = install(w->tmp, final);
    if (rc < 0)
        goto fail;
    rc = fsync_dir(w->dir);
    if (rc < 0)
        goto out; /* in place; the caller learns durability is unsure */
    if (digest_out)
        memcpy(digest_out, dg, sizeof(dg));
out:
    free(body);
    writer_free(w);
    return rc;
fail:
    free(body);
    mesh_ckpt_abort(w);
    return rc;
}

/* ---- listing and pruning ------------------------------------------------ */

static int parse_u64(const char *s, uint64_t *v)
{
    uint64_t x = 0;

    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || x > (UINT64_MAX - 9) / 10)
            return -1;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    *v = x;
    return 0;
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? 1 : x > y ? -1 : 0;
}

int mesh_ckpt_list(const char *dir, uint64_t **steps, size_t *n)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    uint64_t *v = NULL;
    size_t cnt = 0, cap = 0;

    if (!d) {
        if (errno == ENOENT) {
            *steps = NULL;
            *n = 0;
            return 0;
        }
        return mesh_err_errno("open checkpoint directory %s", dir);
    }
    while ((e = readdir(d))) {
        uint64_t s;

        if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) ||
            parse_u64(e->d_name + strlen(PREFIX), &s))
            continue;
        if (mesh_array_reserve(&v, &cap, cnt + 1, sizeof(*v),
                               "checkpoint steps") < 0) {
            free(v);
            closedir(d);
            return -ENOMEM;
        }
        v[cnt++] = s;
    }
    closedir(d);
    if (cnt) /* qsort's base must not be NULL, even for no elements */
        qsort(v, cnt, sizeof(*v), cmp_desc);
    *steps = v;
    *n = cnt;
    return 0;
}

int mesh_ckpt_prune(const char *dir, int keep)
{
    uint64_t *steps = NULL;
    size_t n = 0;
    char path[PATH_CAP + 300];
    DIR *d;
    struct dirent *e;
    int rc;

    if (keep < 1)
        return mesh_err(-EINVAL, "--keep %d: at least 1", keep);
    rc = mesh_ckpt_list(dir, &steps, &n);
    if (rc < 0)
        return rc;
    for (size_t i = (size_t)keep; i < n && rc == 0; i++) {
        rc = mesh_ckpt_path(dir, steps[i], path, sizeof(path));
        if (rc == 0)
            rc = remove_tree(path);
    }
    free(steps);
    if (rc < 0)
        return rc;
    d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : mesh_err_errno("open %s", dir);
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) ||
            !strstr(e->d_name, ".tmp.") || !tmp_is_stale(e->d_name))
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (remove_tree(path) < 0 && rc == 0)
            rc = -EIO;
    }
    closedir(d);
    if (rc == 0)
        rc = fsync_dir(dir);
    return rc;
}

/* ---- reading ------------------------------------------------------------ */

/* Parse the manifest text (already checksummed) into c. */
static int parse_manifest(struct mesh_ckpt *c, char *text, const char *mpath)
{
    char *line, *save = NULL;
    int lineno = 0, have = 0;

    for (line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char name[MESH_CKPT_NAME_MAX + 2], a[80], b[80], x[80];
        unsigned shared;
        int used = 0;

        lineno++;
        if (lineno == 1) {
            if (strcmp(line, "meshtrain-checkpoint 1"))
                return mesh_err(-EIO,
                                "%s: line 1: not a version 1 "
                                "meshtrain checkpoint manifest",
                                mpath);
            continue;
        }
        if (sscanf(line, "step %70s%n", a, &used) == 1 && !line[used] &&
            parse_u64(a, &c->meta.step) == 0) {
            have |= 1;
        } else if (sscanf(line, "epoch %70s%n", a, &used) == 1 && !line[used] &&
                   parse_u64(a, &c->meta.epoch) == 0) {
            have |= 2;
        } else if (sscanf(line, "config %70s%n", a, &used) == 1 &&
                   !line[used] && unhex(a, c->meta.config) == 0) {
            have |= 4;
        } else if (sscanf(line, "digest %70s%n", a, &used) == 1 &&
                   !line[used] && unhex(a, c->digest) == 0) {
            have |= 8;
        } else if (sscanf(line, "blob %65s %70s %70s %u%n", name, b, x, &shared,
                          &used) == 4 &&
                   !line[used] && valid_name(name) && shared <= 1) {
            struct blob *bl;

            if (c->n >= MESH_CKPT_BLOBS_MAX)
                return mesh_err(-EIO, "%s: line %d: more than %d blobs", mpath,
                                lineno, MESH_CKPT_BLOBS_MAX);
            if (blob_lookup(c->blobs, c->n, name))
                return mesh_err(-EIO, "%s: line %d: blob %s twice", mpath,
                                lineno, name);
            bl = blob_append(&c->blobs, c->n, name,
                             shared ? MESH_CKPT_SHARED : 0);
            if (!bl)
                return -ENOMEM;
            if (parse_u64(b, &bl->len) || unhex(x, bl->sha))
                return mesh_err(-EIO, "%s: line %d: bad blob size or hash",
                                mpath, lineno);
            c->n++;
        } else {
            return mesh_err(-EIO, "%s: line %d: cannot parse \"%.60s\"", mpath,
                            lineno, line);
        }
    }
    if (have != 15)
        return mesh_err(-EIO, "%s: missing step, epoch, config or digest",
                        mpath);
    return 0;
}

int mesh_ckpt_open(const char *path, struct mesh_ckpt **out)
{
    struct mesh_ckpt *c;
    char mpath[PATH_CAP + 100], *text = NULL, *last;
    uint8_t sum[MESH_CKPT_DIGEST_LEN], want[MESH_CKPT_DIGEST_LEN];
    uint8_t dg[MESH_CKPT_DIGEST_LEN], *tbuf = NULL;
    size_t len = 0, tcap = 0;
    DIR *d;
    struct dirent *e;
    int rc;

    if (strlen(path) >= PATH_CAP - 100)
        return mesh_err(-ENAMETOOLONG, "checkpoint path too long");
    c = calloc(1, sizeof(*c));
    if (!c)
        return mesh_err(-ENOMEM, "out of memory");
    snprintf(c->path, sizeof(c->path), "%s", path);
    snprintf(mpath, sizeof(mpath), "%s/" MANIFEST, path);
    rc = mesh_file_read(mpath, MANIFEST_MAX, "a manifest", &tbuf, &tcap, &len);
    text = (char *)tbuf;
    if (rc < 0)
        goto fail;
    /* The last line is "sha256 <hex>\n" over everything before it. */
    if (len < 73 || text[len - 1] != '\n' || memchr(text, '\0', len)) {
        rc =
            mesh_err(-EIO, "%s: truncated or not text (%zu bytes)", mpath, len);
        goto fail;
    }
    text[len - 1] = '\0';
    last = strrchr(text, '\n');
    if (!last || strncmp(last + 1, "sha256 ", 7) ||
        unhex(last + 8, want) != 0) {
        rc = mesh_err(-EIO,
                      "%s: the final sha256 line is missing or "
                      "damaged (truncated?)",
                      mpath);
        goto fail;
    }
    rc = mesh_ckpt_sha256(text, (size_t)(last + 1 - text), sum);
    if (rc < 0)
        goto fail;
    if (memcmp(sum, want, sizeof(sum))) {
        rc = mesh_err(-EIO,
                      "%s: checksum mismatch (the manifest was "
                      "modified or damaged)",
                      mpath);
        goto fail;
    }
    last[1] = '\0';
    rc = parse_manifest(c, text, mpath);
    if (rc < 0)
        goto fail;
    rc = agreement_digest(c->blobs, c->n, dg);
    if (rc < 0)
        goto fail;
    if (memcmp(dg, c->digest, sizeof(dg))) {
        rc = mesh_err(-EIO,
                      "%s: the agreement digest does not match the "
                      "blobs listed",
                      mpath);
        goto fail;
    }
    for (size_t i = 0; i < c->n; i++) {
        struct blob *b = &c->blobs[i];
        char bpath[PATH_CAP + 100];
        uint64_t blen = 0;

        snprintf(bpath, sizeof(bpath), "%s/%s", path, b->name);
        rc = hash_file(bpath, 0, &blen, sum, NULL, 0);
        if (rc < 0)
            goto fail;
        if (blen != b->len) {
            rc = mesh_err(-EIO,
                          "%s: %s: %" PRIu64 " bytes, the manifest "
                          "records %" PRIu64,
                          bpath, blen < b->len ? "truncated" : "too long", blen,
                          b->len);
            goto fail;
        }
        if (memcmp(sum, b->sha, sizeof(sum))) {
            rc =
                mesh_err(-EIO, "%s: SHA-256 mismatch (content damaged)", bpath);
            goto fail;
        }
    }
    /* A stray file means someone wrote into a finished checkpoint. */
    d = opendir(path);
    if (!d) {
        rc = mesh_err_errno("open %s", path);
        goto fail;
    }
    while ((e = readdir(d))) {
        int known = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                    !strcmp(e->d_name, MANIFEST);

        for (size_t i = 0; i < c->n && !known; i++)
            known = !strcmp(e->d_name, c->blobs[i].name);
        if (!known) {
            rc = mesh_err(-EIO, "%s/%s: file not in the manifest", path,
                          e->d_name);
            closedir(d);
            goto fail;
        }
    }
    closedir(d);
    free(text);
    *out = c;
    return 0;
fail:
    free(text);
    mesh_ckpt_close(c);
    return rc;
}

void mesh_ckpt_close(struct mesh_ckpt *c)
{
    if (!c)
        return;
    free(c->blobs);
    free(c);
}

void mesh_ckpt_get_meta(const struct mesh_ckpt *c, struct mesh_ckpt_meta *meta)
{
    *meta = c->meta;
}

void mesh_ckpt_get_digest(const struct mesh_ckpt *c,
                          uint8_t digest[MESH_CKPT_DIGEST_LEN])
{
    memcpy(digest, c->digest, MESH_CKPT_DIGEST_LEN);
}

size_t mesh_ckpt_blob_count(const struct mesh_ckpt *c)
{
    return c->n;
}

const char *mesh_ckpt_blob_name(const struct mesh_ckpt *c, size_t i)
{
    return i < c->n ? c->blobs[i].name : NULL;
}

static const struct blob *find_blob(const struct mesh_ckpt *c, const char *name)
{
    const struct blob *b = blob_lookup(c->blobs, c->n, name);

    if (!b)
        mesh_err(-ENOENT, "%s: no blob named %s", c->path, name);
    return b;
}

int mesh_ckpt_blob_size(const struct mesh_ckpt *c, const char *name,
                        size_t *len)
{
    const struct blob *b = find_blob(c, name);

    if (!b)
        return -ENOENT;
    *len = (size_t)b->len;
    return 0;
}

int mesh_ckpt_read_into(const struct mesh_ckpt *c, const char *name, void *buf,
                        size_t len)
{
    const struct blob *b = find_blob(c, name);
    char path[PATH_CAP + 100];
    uint8_t sum[MESH_CKPT_DIGEST_LEN];
    uint64_t got = 0;
    int rc;

    if (!b)
        return -ENOENT;
    snprintf(path, sizeof(path), "%s/%s", c->path, name);
    if (b->len != len)
        return mesh_err(-EIO,
                        "%s: %" PRIu64 " bytes in the checkpoint, %zu "
                        "expected by this run",
                        path, b->len, len);
    rc = hash_file(path, 0, &got, sum, buf, len);
    if (rc < 0)
        return rc;
    if (got != b->len || memcmp(sum, b->sha, sizeof(sum)))
        return mesh_err(-EIO,
                        "%s: changed since the checkpoint was opened "
                        "(size or SHA-256 mismatch)",
                        path);
    return 0;
}

int mesh_ckpt_read(const struct mesh_ckpt *c, const char *name, void **data,
                   size_t *len)
{
    const struct blob *b = find_blob(c, name);
    void *buf;
    int rc;

    if (!b)
        return -ENOENT;
    buf = malloc(b->len ? (size_t)b->len : 1);
    if (!buf)
        return mesh_err(-ENOMEM,
                        "checkpoint blob %s: cannot allocate %" PRIu64 " bytes",
                        name, b->len);
    rc = mesh_ckpt_read_into(c, name, buf, (size_t)b->len);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *data = buf;
    *len = (size_t)b->len;
    return 0;
}

int mesh_ckpt_blob_path(const struct mesh_ckpt *c, const char *name, char *path,
                        size_t cap)
{
    int n;

    if (!find_blob(c, name))
        return -ENOENT;
    n = snprintf(path, cap, "%s/%s", c->path, name);
    if (n < 0 || (size_t)n >= cap)
        return mesh_err(-ENAMETOOLONG, "checkpoint blob path too long");
    return 0;
}

/* ---- choosing a checkpoint to resume from ------------------------------- */

/* Add "what" to damage's list (cut with "..." once it is full). */
static void damage_add(struct mesh_ckpt_damage *damage, const char *what)
{
    size_t len, cap = sizeof(damage->list);

    damage->count++;
    len = strlen(damage->list);
    if (len + 4 >= cap)
        return; /* already cut */
    snprintf(damage->list + len, cap - len, "%s%s", len ? "; " : "", what);
    if (strlen(damage->list) == cap - 1)
        memcpy(damage->list + cap - 4, "...", 4);
}

int mesh_ckpt_scan(const char *dir, struct mesh_ckpt_entry **out, size_t *n,
                   struct mesh_ckpt_damage *damage)
{
    struct mesh_ckpt_entry *v = NULL;
    uint64_t *steps = NULL;
    size_t cnt = 0, got = 0;
    char path[PATH_CAP];
    int rc;

    if (damage)
        memset(damage, 0, sizeof(*damage));
    rc = mesh_ckpt_list(dir, &steps, &cnt);
    if (rc < 0)
        return rc;
    if (cnt) {
        v = calloc(cnt, sizeof(*v));
        if (!v) {
            free(steps);
            return mesh_err(-ENOMEM, "out of memory");
        }
    }
    for (size_t i = 0; i < cnt; i++) {
        struct mesh_ckpt *c = NULL;

        rc = mesh_ckpt_path(dir, steps[i], path, sizeof(path));
        if (rc == 0)
            rc = mesh_ckpt_open(path, &c);
        if (rc == -ENOMEM) {
            free(v);
            free(steps);
            return rc;
        }
        if (rc < 0) {
            mesh_warn("checkpoint %s skipped: %s", path, mesh_err_msg(rc));
            if (damage)
                damage_add(damage, mesh_err_msg(rc));
            continue;
        }
        v[got].step = c->meta.step;
        v[got].epoch = c->meta.epoch;
        memcpy(v[got].digest, c->digest, MESH_CKPT_DIGEST_LEN);
        memcpy(v[got].config, c->meta.config, MESH_CKPT_DIGEST_LEN);
        if (v[got].step != steps[i]) {
            char what[PATH_CAP + 64];

            snprintf(what, sizeof(what), "%s: its manifest says step %" PRIu64,
                     path, v[got].step);
            mesh_warn("checkpoint %s skipped: its manifest says step %" PRIu64,
                      path, v[got].step);
            if (damage)
                damage_add(damage, what);
        } else
            got++;
        mesh_ckpt_close(c);
    }
    free(steps);
    *out = v;
    *n = got;
    return 0;
}

int mesh_ckpt_agree(const struct mesh_ckpt_entry *const *lists,
                    const size_t *counts, int npeers, uint64_t *step)
{
    const struct mesh_ckpt_entry *best = NULL;

    if (npeers < 1)
        return mesh_err(-EINVAL, "checkpoint agreement among %d peers", npeers);
    /* Candidates from peer 0; each must appear identically everywhere. */
    for (size_t i = 0; i < counts[0]; i++) {
        const struct mesh_ckpt_entry *e = &lists[0][i];
        int everywhere = 1;

        if (best && e->step <= best->step)
            continue;
        for (int p = 1; p < npeers && everywhere; p++) {
            int found = 0;

            for (size_t j = 0; j < counts[p] && !found; j++)
                found = lists[p][j].step == e->step &&
                        !memcmp(lists[p][j].digest, e->digest,
                                MESH_CKPT_DIGEST_LEN);
            everywhere = found;
        }
        if (everywhere)
            best = e;
    }
    if (!best)
        return mesh_err(-ENOENT,
                        "--resume: no checkpoint is held with the same "
                        "digest by all %d peers",
                        npeers);
    *step = best->step;
    return 0;
}

void mesh_ckpt_entry_pack(const struct mesh_ckpt_entry *e,
                          uint8_t out[MESH_CKPT_ENTRY_BYTES])
{
    mesh_put_le64(out, e->step);
    mesh_put_le64(out + 8, e->epoch);
    memcpy(out + 16, e->digest, MESH_CKPT_DIGEST_LEN);
    memcpy(out + 48, e->config, MESH_CKPT_DIGEST_LEN);
}

void mesh_ckpt_entry_unpack(const uint8_t in[MESH_CKPT_ENTRY_BYTES],
                            struct mesh_ckpt_entry *e)
{
    e->step = mesh_get_le64(in);
    e->epoch = mesh_get_le64(in + 8);
    memcpy(e->digest, in + 16, MESH_CKPT_DIGEST_LEN);
    memcpy(e->config, in + 48, MESH_CKPT_DIGEST_LEN);
}
