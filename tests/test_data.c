/*
 * tests/test_data.c: data sets, transforms, sharding, resume, prefetch and
 * bad data. Small data sets are generated here (IDX with zlib, cifar
 * binaries, JPEGs with libjpeg); Fashion-MNIST is checked against an
 * independent reading by Python's gzip + struct when both are present.
 */
#include "config.h"

#include "data/data.h"
#include "common/util.h"
#include "tests/jpeg_util.h"
#include "tests/tap.h"
#include "tests/tmpdir.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef HAVE_ZLIB
#include <zlib.h>
#endif

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static char tmp[256];

static void write_bytes(const char *path, const void *d, size_t n)
{
    FILE *f = fopen(path, "wb");

    if (!f || fwrite(d, 1, n, f) != n) {
        diag("cannot write %s", path);
        abort();
    }
    fclose(f);
}

static void truncate_to(const char *path, off_t len)
{
    if (truncate(path, len) != 0) {
        diag("truncate %s failed", path);
        abort();
    }
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* The source byte behind a normalised value. */
static int unnorm(float v, float mean, float std)
{
    return (int)lround((v * std + mean) * 255.0);
}

/* ---- Fashion-MNIST against Python ------------------------------------- */

static const char *py_ref =
    "import gzip, struct, hashlib, sys\n"
    "d = sys.argv[1]\n"
    "for s, t in (('train', 'train'), ('t10k', 'test')):\n"
    "    with gzip.open(d + '/' + s + '-images-idx3-ubyte.gz') as f:\n"
    "        m, n, r, c = struct.unpack('>IIII', f.read(16))\n"
    "        first = f.read(r * c)\n"
    "    with gzip.open(d + '/' + s + '-labels-idx1-ubyte.gz') as f:\n"
    "        m2, n2 = struct.unpack('>II', f.read(8))\n"
    "        lab = f.read(n2)\n"
    "    h = [lab.count(bytes([k])) for k in range(10)]\n"
    "    print(t, n, ' '.join(map(str, h)), hashlib.sha256(first)"
    ".hexdigest())\n";

static void sha_hex(const uint8_t *d, size_t n, char *out)
{
    uint8_t md[32];
    unsigned int len = 0;

    EVP_Digest(d, n, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

static void test_fmnist(void)
{
    struct mesh_data_opts o = {.spec = "fashion-mnist", .seed = 1};
    struct mesh_dataset *ds = NULL;
    struct mesh_data_info info;
    struct mesh_loader *ld = NULL;
    struct mesh_loader_opts lo = {.split = MESH_DATA_TRAIN,
                                  .batch = 100,
                                  .rank = 0,
                                  .world = 1,
                                  .threads = 2,
                                  .augment = -1};
    struct mesh_batch b;
    long hist[2][10] = {{0}};
    char line[512], cmd[1024], ref_sha[2][65] = {"", ""}, my_sha[65];
    long ref_n[2] = {0, 0}, ref_h[2][10];
    uint8_t px[784];
    float img[784];
    int32_t lab;
    FILE *p;
    int rc, nref = 0, okh = 1;

    if (access(FMNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        for (int i = 0; i < 6; i++)
            skip("Fashion-MNIST not installed (apt-get install "
                 "dataset-fashion-mnist)");
        return;
    }
    rc = mesh_data_open(&o, &ds);
    ok(rc == 0, "fashion-mnist opens: %s", rc ? mesh_err_msg(rc) : "ok");
    if (rc) {
        for (int i = 0; i < 5; i++)
            skip("no data set");
        return;
    }
    mesh_data_get_info(ds, &info);
    ok(info.train_count == 60000 && info.eval_count == 10000 &&
           info.classes == 10 && info.channels == 1 && info.size == 28,
       "fashion-mnist: 60000 train, 10000 test, 10 classes, 1x28x28 "
       "(%zu, %zu, %d, %dx%d)",
       info.train_count, info.eval_count, info.classes, info.channels,
       info.size);

    /* One epoch of the loader sees every training label once. */
    rc = mesh_loader_create(ds, &lo, &ld);
    for (uint64_t s = 0; rc == 0 && s < mesh_loader_steps_per_epoch(ld); s++) {
        rc = mesh_data_next(ld, &b);
        for (int i = 0; rc == 0 && i < b.n; i++)
            hist[0][b.y[i]]++;
    }
    mesh_loader_destroy(ld);
    ld = NULL;
    lo.split = MESH_DATA_EVAL;
    if (rc == 0)
        rc = mesh_loader_create(ds, &lo, &ld);
    while (rc == 0 && (rc = mesh_data_next(ld, &b)) == 0)
        for (int i = 0; i < b.n; i++)
            hist[1][b.y[i]]++;
    mesh_loader_destroy(ld);

    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 -c \"$PYREF\" %s", FMNIST_DIR);
    setenv("PYREF", py_ref, 1);
    p = access("/usr/bin/python3", X_OK) == 0 ? popen(cmd, "r") : NULL;
    while (p && fgets(line, sizeof(line), p)) {
        char name[16];
        int k = -1;
        long *h;

        if (sscanf(line, "%15s", name) != 1)
            continue;
        k = !strcmp(name, "train") ? 0 : !strcmp(name, "test") ? 1 : -1;
        if (k < 0)
            continue;
        h = ref_h[k];
        if (sscanf(line, "%*s %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %64s",
                   &ref_n[k], &h[0], &h[1], &h[2], &h[3], &h[4], &h[5], &h[6],
                   &h[7], &h[8], &h[9], ref_sha[k]) == 12)
            nref++;
    }
    if (p)
        pclose(p);
    if (nref != 2) {
        ok(rc == 1, "loader read both splits");
        for (int i = 0; i < 3; i++)
            skip("no /usr/bin/python3 reference");
        mesh_data_close(ds);
        return;
    }
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 10; k++)
            okh &= hist[s][k] == ref_h[s][k];
    ok(rc == 1 && okh && ref_n[0] == 60000 && ref_n[1] == 10000,
       "label histograms of both splits equal Python's (train class 0: "
       "%ld vs %ld)",
       hist[0][0], ref_h[0][0]);
    for (int s = 0; s < 2; s++) {
        rc = mesh_data_sample(ds, s ? MESH_DATA_EVAL : MESH_DATA_TRAIN, 0, 0, 0,
                              img, &lab);
        for (int i = 0; i < 784; i++)
            px[i] = (uint8_t)unnorm(img[i], info.mean[0], info.std[0]);
        sha_hex(px, 784, my_sha);
        ok(rc == 0 && !strcmp(my_sha, ref_sha[s]),
           "first %s image: SHA-256 %.16s.. equals Python's %.16s..",
           s ? "test" : "train", my_sha, ref_sha[s]);
    }
    /* 3 channels at 32: replicated and resized. */
    {
        struct mesh_data_opts o3 = {
            .spec = "fashion-mnist", .channels = 3, .size = 32, .seed = 1};
        struct mesh_dataset *d3 = NULL;
        float *x = malloc(sizeof(float) * 3 * 32 * 32);
        int same = 1;

        rc = mesh_data_open(&o3, &d3);
        if (rc == 0)
            rc = mesh_data_sample(d3, MESH_DATA_TRAIN, 5, 0, 0, x, &lab);
        for (int i = 0; rc == 0 && i < 32 * 32; i++)
            same &= x[i] == x[1024 + i] && x[i] == x[2048 + i];
        ok(rc == 0 && same, "fashion-mnist as 3x32x32: channels replicated");
        free(x);
        mesh_data_close(d3);
    }
    mesh_data_close(ds);
}

/* ---- small generated IDX set ------------------------------------------ */

static int open_spec(const char *spec, enum mesh_data_bad bad,
                     struct mesh_dataset **ds)
{
    struct mesh_data_opts o = {.spec = spec, .seed = 3, .on_bad = bad};

    return mesh_data_open(&o, ds);
}

/* Open KIND:DIR with o (o->spec points to spec, cap bytes), one test point. */
static int open_dir(struct mesh_data_opts *o, char *spec, size_t cap,
                    const char *kind, const char *dir, struct mesh_dataset **ds)
{
    int rc;

    snprintf(spec, cap, "%s:%s", kind, dir);
    o->spec = spec;
    rc = mesh_data_open(o, ds);
    ok(rc == 0, "generated %s opens: %s", kind, rc ? mesh_err_msg(rc) : "ok");
    return rc;
}

/* open_spec with warnings on and stderr caught into log (cap bytes). */
static int open_logged(const char *spec, struct mesh_dataset **ds, char *log,
                       size_t cap)
{
    char path[400];
    int fd, saved, rc;
    ssize_t n;

    snprintf(path, sizeof(path), "%s/stderr.log", tmp);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    saved = dup(2);
    fflush(stderr);
    dup2(fd, 2);
    mesh_log_set_level(MESH_LOG_WARN);
    rc = open_spec(spec, MESH_DATA_BAD_FAIL, ds);
    mesh_log_set_level(MESH_LOG_ERROR);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    n = pread(fd, log, cap - 1, 0);
    log[n > 0 ? n : 0] = '\0';
    close(fd);
    return rc;
}

#ifdef HAVE_ZLIB
static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void write_gz(const char *path, const void *d, size_t n)
{
    gzFile g = gzopen(path, "wb");

    if (!g || gzwrite(g, d, (unsigned)n) != (int)n) {
        diag("cannot write %s", path);
        abort();
    }
    gzclose(g);
}

/* IDX pair for one split: n images of 28x28; magic_fix alters the image
 * magic; label_n the label count. */
static void write_idx(const char *dir, const char *pre, uint32_t n,
                      uint32_t img_magic, uint32_t label_n, int gz)
{
    size_t isz = 16 + (size_t)n * 784, lsz = 8 + label_n;
    uint8_t *im = malloc(isz), *lb = malloc(lsz);
    char path[512];
    uint64_t s = n;

    put_be32(im, img_magic);
    put_be32(im + 4, n);
    put_be32(im + 8, 28);
    put_be32(im + 12, 28);
    for (size_t i = 16; i < isz; i++)
        im[i] = (uint8_t)lcg(&s);
    put_be32(lb, 0x801);
    put_be32(lb + 4, label_n);
    for (uint32_t i = 0; i < label_n; i++)
        lb[8 + i] = (uint8_t)(i % 10);
    snprintf(path, sizeof(path), "%s/%s-images-idx3-ubyte%s", dir, pre,
             gz ? ".gz" : "");
    gz ? write_gz(path, im, isz) : write_bytes(path, im, isz);
    snprintf(path, sizeof(path), "%s/%s-labels-idx1-ubyte%s", dir, pre,
             gz ? ".gz" : "");
    gz ? write_gz(path, lb, lsz) : write_bytes(path, lb, lsz);
    free(im);
    free(lb);
}

static void test_idx_bad(void)
{
    char dir[300], spec[320], path[400];
    struct mesh_data_opts o = {.seed = 3};
    struct mesh_dataset *ds = NULL;
    int rc;

    snprintf(dir, sizeof(dir), "%s/idx", tmp);
    mkdir(dir, 0755);
    write_idx(dir, "train", 100, 0x803, 100, 1); /* gzip'ed */
    write_idx(dir, "t10k", 20, 0x803, 20, 0);    /* plain */
    open_dir(&o, spec, sizeof(spec), "fashion-mnist", dir, &ds);
    mesh_data_close(ds);
    ds = NULL;

    /* Truncated gzip. */
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", dir);
    truncate_to(path, 3000);
    rc = open_spec(spec, MESH_DATA_BAD_SKIP, &ds);
    ok(rc < 0 && strstr(mesh_err_msg(rc), path) &&
           strstr(mesh_err_msg(rc), "offset"),
       "truncated gzip: error names file and offset: %s", mesh_err_msg(rc));
    write_idx(dir, "train", 100, 0x803, 100, 1);

    /* Garbage after the gzip stream: refused, naming the offset. */
    {
        struct stat st;
        char want[64];
        FILE *f;

        stat(path, &st);
        f = fopen(path, "ab");
        fputs("trailing junk", f);
        fclose(f);
        rc = open_spec(spec, MESH_DATA_BAD_SKIP, &ds);
        snprintf(want, sizeof(want), "compressed byte offset %lld",
                 (long long)st.st_size);
        ok(rc < 0 && strstr(mesh_err_msg(rc), path) &&
               strstr(mesh_err_msg(rc), "trailing garbage") &&
               strstr(mesh_err_msg(rc), want),
           "garbage after the gzip stream: %s", mesh_err_msg(rc));
        write_idx(dir, "train", 100, 0x803, 100, 1);

        /* A CRC that does not match: the trailer's offset, and all the
         * data before it (not "uncompressed byte offset 16"). */
        stat(path, &st);
        {
            int fd = open(path, O_RDWR);
            uint8_t b = 0;

            if (pread(fd, &b, 1, st.st_size - 8) != 1)
                diag("cannot read %s", path);
            b ^= 0xff;
            if (pwrite(fd, &b, 1, st.st_size - 8) != 1)
                diag("cannot write %s", path);
            close(fd);
        }
        rc = open_spec(spec, MESH_DATA_BAD_SKIP, &ds);
        snprintf(want, sizeof(want), "compressed byte offset %lld",
                 (long long)st.st_size - 8);
        ok(rc < 0 && strstr(mesh_err_msg(rc), "CRC") &&
               strstr(mesh_err_msg(rc), want) &&
               strstr(mesh_err_msg(rc), "78416 uncompressed bytes"),
           "gzip CRC mismatch at the trailer: %s", mesh_err_msg(rc));
        write_idx(dir, "train", 100, 0x803, 100, 1);

        /* Both X and X.gz: a warning says which one is read. */
        {
            char log[2048];

            write_idx(dir, "train", 100, 0x803, 100, 0);
            rc = open_logged(spec, &ds, log, sizeof(log));
            ok(rc == 0 && strstr(log, "both") && strstr(log, "reading") &&
                   strstr(log, "train-images-idx3-ubyte.gz"),
               "X and X.gz both present: said once: %s", log);
            mesh_data_close(ds);
            ds = NULL;
            snprintf(want, sizeof(want), "%s/train-images-idx3-ubyte", dir);
            unlink(want);
            snprintf(want, sizeof(want), "%s/train-labels-idx1-ubyte", dir);
            unlink(want);
        }
    }

    /* Bad magic. */
    write_idx(dir, "t10k", 20, 0x804, 20, 0);
    snprintf(path, sizeof(path), "%s/t10k-images-idx3-ubyte", dir);
    rc = open_spec(spec, MESH_DATA_BAD_SKIP, &ds);
    ok(rc < 0 && strstr(mesh_err_msg(rc), path) &&
           strstr(mesh_err_msg(rc), "magic") &&
           strstr(mesh_err_msg(rc), "offset 0"),
       "bad IDX magic: %s", mesh_err_msg(rc));

    /* Label count differs from the image count. */
    write_idx(dir, "t10k", 20, 0x803, 19, 0);
    rc = open_spec(spec, MESH_DATA_BAD_SKIP, &ds);
    ok(rc < 0 && strstr(mesh_err_msg(rc), "t10k-labels-idx1-ubyte") &&
           strstr(mesh_err_msg(rc), "offset 4"),
       "wrong IDX dims: %s", mesh_err_msg(rc));

    /* Short plain file: header says 20 images, 10 present. */
    write_idx(dir, "t10k", 20, 0x803, 20, 0);
    snprintf(path, sizeof(path), "%s/t10k-images-idx3-ubyte", dir);
    truncate_to(path, 16 + 10 * 784);
    rc = open_spec(spec, MESH_DATA_BAD_SKIP, &ds);
    ok(rc < 0 && strstr(mesh_err_msg(rc), path) &&
           strstr(mesh_err_msg(rc), "truncated") &&
           strstr(mesh_err_msg(rc), "offset 7856"),
       "short IDX file: %s", mesh_err_msg(rc));
}
#endif

/* ---- cifar10: the pixels carry the sample index ----------------------- */

#define CIFAR_TRAIN_PER 40
#define CIFAR_TEST      50

static void write_cifar(const char *dir, int extra)
{
    uint8_t rec[3073];
    char path[512];
    uint64_t s = 99;

    mkdir(dir, 0755);
    for (int f = 0; f <= 5; f++) {
        int n = f ? CIFAR_TRAIN_PER : CIFAR_TEST;
        FILE *fp;

        if (f)
            snprintf(path, sizeof(path), "%s/data_batch_%d.bin", dir, f);
        else
            snprintf(path, sizeof(path), "%s/test_batch.bin", dir);
        fp = fopen(path, "wb");
        for (int i = 0; i < n; i++) {
            int idx = f ? (f - 1) * CIFAR_TRAIN_PER + i : i;

            for (int k = 0; k < 3073; k++)
                rec[k] = (uint8_t)lcg(&s);
            rec[0] = (uint8_t)(idx % 10);
            rec[1] = (uint8_t)idx; /* R plane, pixel (0, 0) */
            rec[2] = (uint8_t)(idx >> 8);
            fwrite(rec, 1, sizeof(rec), fp);
        }
        if (f == 3 && extra)
            fwrite(rec, 1, (size_t)extra, fp);
        fclose(fp);
    }
}

/* Sample index of image i of a batch from an un-augmented cifar loader. */
static int cifar_index(const struct mesh_batch *b, int i,
                       const struct mesh_data_info *info)
{
    const float *x = b->x + (size_t)i * 3 * 32 * 32;

    return unnorm(x[0], info->mean[0], info->std[0]) |
           unnorm(x[1], info->mean[0], info->std[0]) << 8;
}

static int collect(struct mesh_loader *ld, int steps, int *idx, int per,
                   const struct mesh_data_info *info)
{
    struct mesh_batch b;

    for (int s = 0; s < steps; s++) {
        int rc = mesh_data_next(ld, &b);

        if (rc)
            return rc;
        for (int i = 0; i < b.n; i++)
            idx[s * per + i] = cifar_index(&b, i, info);
    }
    return 0;
}

/* Copy n batches (x and y) into buf for later comparison. */
static int grab(struct mesh_loader *ld, int n, float *buf, size_t floats,
                int32_t *lab, int batch)
{
    struct mesh_batch b;

    for (int s = 0; s < n; s++) {
        int rc = mesh_data_next(ld, &b);

        if (rc)
            return rc;
        memcpy(buf + (size_t)s * floats, b.x, sizeof(float) * floats);
        memcpy(lab + s * batch, b.y, sizeof(int32_t) * (size_t)batch);
    }
    return 0;
}

/* Create *ld over ds with lo and grab its first n batches. */
static int create_grab(struct mesh_dataset *ds,
                       const struct mesh_loader_opts *lo,
                       struct mesh_loader **ld, int n, float *buf,
                       size_t floats, int32_t *lab)
{
    int rc = mesh_loader_create(ds, lo, ld);

    return rc ? rc : grab(*ld, n, buf, floats, lab, lo->batch);
}

static void test_cifar(void)
{
    char dir[300], spec[320];
    struct mesh_data_opts o = {.seed = 7};
    struct mesh_dataset *ds = NULL, *ds2 = NULL;
    struct mesh_data_info info;
    struct mesh_loader_opts lo = {.split = MESH_DATA_TRAIN,
                                  .batch = 4,
                                  .world = 3,
                                  .threads = 2,
                                  .augment = 0};
    struct mesh_loader *ld[3] = {NULL, NULL, NULL};
    int n = 5 * CIFAR_TRAIN_PER, idx[3][16 * 4], seen[5 * CIFAR_TRAIN_PER];
    uint32_t perm[5 * CIFAR_TRAIN_PER], perm2[5 * CIFAR_TRAIN_PER];
    int rc, good, dup = 0, total = 0, match = 1;

    snprintf(dir, sizeof(dir), "%s/cifar", tmp);
    write_cifar(dir, 0);
    if (open_dir(&o, spec, sizeof(spec), "cifar10", dir, &ds) != 0)
        return;
    mesh_data_get_info(ds, &info);
    ok(info.train_count == 200 && info.eval_count == 50 && info.channels == 3 &&
           info.size == 32,
       "cifar10: 200 train, 50 test, 3x32x32");

    /* Shards: 3 peers x batch 4, 16 steps, 192 distinct samples. */
    good = 1;
    for (int r = 0; r < 3 && good; r++) {
        lo.rank = r;
        good = mesh_loader_create(ds, &lo, &ld[r]) == 0 &&
               mesh_loader_steps_per_epoch(ld[r]) == 16 &&
               collect(ld[r], 16, idx[r], 4, &info) == 0;
    }
    memset(seen, 0, sizeof(seen));
    mesh_data_permutation(ds, 0, perm);
    for (int r = 0; r < 3 && good; r++)
        for (int s = 0; s < 16; s++)
            for (int i = 0; i < 4; i++) {
                int v = idx[r][s * 4 + i];

                if (v < 0 || v >= n || seen[v]++)
                    dup++;
                total++;
                match &= (uint32_t)v == perm[s * 12 + r * 4 + i];
            }
    ok(good && dup == 0 && total == 192,
       "3 shards x 16 steps x 4: 192 samples, none twice (%d duplicates)", dup);
    ok(good && match, "peer r, step s takes permutation block s*12 + r*4");
    {
        struct mesh_batch b;
        uint64_t e = 9, st = 9;

        rc = mesh_data_next(ld[0], &b);
        mesh_data_tell(ld[0], &e, &st);
        ok(rc == 0 && b.epoch == 1 && b.step == 0 && e == 1 && st == 1,
           "after the last step comes epoch 1 step 0 (the 8 left over are "
           "dropped)");
    }
    for (int r = 0; r < 3; r++)
        mesh_loader_destroy(ld[r]);

    /* One process, --accumulate 3, reads what 3 peers read: micro-batch
     * 3 s + r is peer r's step s, over two epochs. */
    {
        static int one[96 * 4], peer[3][32 * 4];
        struct mesh_loader *l1 = NULL;
        struct mesh_loader_opts ao = lo;
        int same = 1;

        ao.world = 1;
        ao.rank = 0;
        ao.accumulate = 3;
        rc = mesh_loader_create(ds, &ao, &l1);
        good = rc == 0 && mesh_loader_steps_per_epoch(l1) == 48 &&
               collect(l1, 96, one, 4, &info) == 0;
        mesh_loader_destroy(l1);
        for (int r = 0; r < 3 && good; r++) {
            lo.rank = r;
            good = mesh_loader_create(ds, &lo, &ld[r]) == 0 &&
                   collect(ld[r], 32, peer[r], 4, &info) == 0;
            mesh_loader_destroy(ld[r]);
        }
        for (int s = 0; good && s < 32; s++)
            for (int r = 0; r < 3; r++)
                same &= !memcmp(&one[(s * 3 + r) * 4], &peer[r][s * 4],
                                4 * sizeof(int));
        ok(good && same,
           "accumulate 3 on one process = 3 peers, micro-batch for "
           "micro-batch, across an epoch boundary");
    }

    /* The documented PRNG, replayed in Python, gives the same order. */
    {
        static const char *py_perm =
            "import sys\n"
            "M = (1 << 64) - 1\n"
            "def sm(s):\n"
            "    s = (s + 0x9e3779b97f4a7c15) & M\n"
            "    z = s\n"
            "    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M\n"
            "    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M\n"
            "    return s, z ^ (z >> 31)\n"
            "def key(a, b, c):\n"
            "    s, x = sm(a)\n"
            "    s, x = sm(x ^ b)\n"
            "    s, x = sm(x ^ c)\n"
            "    return x\n"
            "rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M\n"
            "class X:\n"
            "    def __init__(self, k):\n"
            "        self.s = []\n"
            "        for i in range(4):\n"
            "            k, v = sm(k)\n"
            "            self.s.append(v)\n"
            "    def next(self):\n"
            "        s = self.s\n"
            "        r = (rotl((s[1] * 5) & M, 7) * 9) & M\n"
            "        t = (s[1] << 17) & M\n"
            "        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]\n"
            "        s[2] ^= t; s[3] = rotl(s[3], 45)\n"
            "        return r\n"
            "seed, e, n = map(int, sys.argv[1:4])\n"
            "g = X(key(seed, 0x7065726d, e))\n"
            "p = list(range(n))\n"
            "for i in range(n - 1, 0, -1):\n"
            "    j = ((g.next() >> 32) * (i + 1)) >> 32\n"
            "    p[i], p[j] = p[j], p[i]\n"
            "print(' '.join(map(str, p)))\n";
        char cmd[256];
        FILE *pp;
        int same = 1, got = 0, v;

        setenv("PYPERM", py_perm, 1);
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 -c \"$PYPERM\" 7 1 %d", n);
        mesh_data_permutation(ds, 1, perm2);
        pp = access("/usr/bin/python3", X_OK) == 0 ? popen(cmd, "r") : NULL;
        while (pp && fscanf(pp, "%d", &v) == 1) {
            same &= got < n && (uint32_t)v == perm2[got];
            got++;
        }
        if (pp)
            pclose(pp);
        if (pp)
            ok(same && got == n,
               "the permutation replays in Python from data.h's "
               "description (%d of %d)",
               got, n);
        else
            skip("no /usr/bin/python3");
    }

    /* Permutations: per epoch different, per seed reproducible. */
    mesh_data_permutation(ds, 1, perm2);
    ok(memcmp(perm, perm2, sizeof(uint32_t) * (size_t)n) != 0,
       "epoch 0 and epoch 1 permutations differ");
    rc = mesh_data_open(&o, &ds2);
    if (rc == 0)
        mesh_data_permutation(ds2, 1, perm);
    ok(rc == 0 && memcmp(perm, perm2, sizeof(uint32_t) * (size_t)n) == 0,
       "equal seeds give equal permutations");
    mesh_data_close(ds2);
    o.seed = 8;
    rc = mesh_data_open(&o, &ds2);
    if (rc == 0)
        mesh_data_permutation(ds2, 1, perm);
    ok(rc == 0 && memcmp(perm, perm2, sizeof(uint32_t) * (size_t)n) != 0,
       "another seed gives another permutation");
    mesh_data_close(ds2);

    /* Seek, state and thread count: augmented batches must be equal. */
    {
        size_t fl = 4 * 3 * 32 * 32;
        float *a = malloc(sizeof(float) * fl * 24);
        float *c = malloc(sizeof(float) * fl * 24);
        int32_t la[24 * 4], lc[24 * 4];
        uint8_t state[MESH_DATA_STATE_BYTES];
        struct mesh_loader *x = NULL, *y = NULL;

        lo.world = 1;
        lo.rank = 0;
        lo.augment = -1; /* cifar default: pad-crop + flip */
        lo.threads = 1;
        lo.depth = 2;
        rc = create_grab(ds, &lo, &x, 24, a, fl, la);
        lo.threads = 3;
        lo.depth = 0;
        if (rc == 0)
            rc = create_grab(ds, &lo, &y, 24, c, fl, lc);
        ok(rc == 0 && !memcmp(a, c, sizeof(float) * fl * 24) &&
               !memcmp(la, lc, sizeof(la)),
           "1 thread (depth 2) and 3 threads give identical augmented "
           "batches over 24 steps");
        /* 50 steps per epoch: epoch 1 step 3 is batch 53. */
        rc = mesh_data_seek(y, 1, 3);
        if (rc == 0)
            rc = grab(y, 1, c, fl, lc, 4);
        ok(rc == 0, "seek(1, 3) on a running loader: %s",
           rc ? mesh_err_msg(rc) : "ok");
        mesh_loader_destroy(x);
        x = NULL;
        lo.threads = 2;
        rc = mesh_loader_create(ds, &lo, &x);
        for (int s = 0; rc == 0 && s < 54; s++) {
            struct mesh_batch b;

            rc = mesh_data_next(x, &b);
            if (s == 53)
                good = !memcmp(b.x, c, sizeof(float) * fl) &&
                       !memcmp(b.y, lc, sizeof(int32_t) * 4) && b.epoch == 1 &&
                       b.step == 3;
        }
        ok(rc == 0 && good,
           "seek(1, 3) gives the batch an uninterrupted run reads 54th");
        /* x is now at (1, 4): restore that into y. */
        mesh_data_get_state(x, state);
        rc = grab(x, 3, a, fl, la, 4);
        if (rc == 0)
            rc = mesh_data_seek(y, 0, 0);
        if (rc == 0)
            rc = mesh_data_set_state(y, state, sizeof(state));
        if (rc == 0)
            rc = grab(y, 3, c, fl, lc, 4);
        ok(rc == 0 && !memcmp(a, c, sizeof(float) * fl * 3) &&
               !memcmp(la, lc, sizeof(int32_t) * 12),
           "get/set state resumes with identical batches: %s",
           rc ? mesh_err_msg(rc) : "ok");
        state[16] ^= 1; /* the seed */
        rc = mesh_data_set_state(y, state, sizeof(state));
        ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "seed"),
           "a state from another seed is refused: %s", mesh_err_msg(rc));
        mesh_loader_destroy(x);
        mesh_loader_destroy(y);
        free(a);
        free(c);
    }

    /* Evaluation shards: 50 samples over 3 peers, batch 4. */
    {
        struct mesh_loader_opts eo = {
            .split = MESH_DATA_EVAL, .batch = 4, .world = 3, .threads = 2};
        int cnt[50] = {0}, tot = 0, bad = 0;
        struct mesh_batch b;

        for (int r = 0; r < 3; r++) {
            struct mesh_loader *e = NULL;

            eo.rank = r;
            rc = mesh_loader_create(ds, &eo, &e);
            for (int pass = 0; rc == 0 && pass < 2; pass++) {
                while ((rc = mesh_data_next(e, &b)) == 0)
                    for (int i = 0; i < b.n; i++) {
                        int v = cifar_index(&b, i, &info);

                        if (v < 0 || v >= 50 || v % 3 != r)
                            bad++;
                        else if (pass == 0)
                            cnt[v]++;
                        tot += pass == 0;
                    }
                rc = rc == 1 ? mesh_data_seek(e, 0, 0) : rc;
            }
            mesh_loader_destroy(e);
        }
        for (int i = 0; i < 50; i++)
            bad += cnt[i] != 1;
        ok(rc == 0 && tot == 50 && bad == 0,
           "eval shards: 3 peers see each of the 50 test samples once "
           "(rewind works)");
    }

    /* Shapes and ranges: grey at 40 (resize), augmentation on. */
    {
        struct mesh_data_opts og = {.spec = spec, .channels = 1, .size = 40};
        float *xg = malloc(sizeof(float) * 1600);
        float lo_v = (0 - 0.45f) / 0.24f - 0.2f,
              hi_v = (1 - 0.45f) / 0.24f + 0.2f;
        int32_t lab;
        int inr = 1;

        rc = mesh_data_open(&og, &ds2);
        if (rc == 0)
            rc = mesh_data_sample(ds2, MESH_DATA_TRAIN, 17, 0, 1, xg, &lab);
        for (int i = 0; rc == 0 && i < 1600; i++)
            inr &= xg[i] >= lo_v && xg[i] <= hi_v;
        ok(rc == 0 && inr && lab == 7,
           "cifar as 1x40x40 (luma, resize, augmented): values in range, "
           "label kept");
        mesh_data_close(ds2);
        free(xg);
    }
    /* Padding to 36: the native image in the middle, zeros around. */
    {
        struct mesh_data_opts op = {
            .spec = spec, .size = 36, .fit = MESH_DATA_FIT_PAD};
        float *xp = malloc(sizeof(float) * 3 * 36 * 36);
        float *xn = malloc(sizeof(float) * 3 * 32 * 32);
        int32_t lab, lab2;
        int same = 1;

        rc = mesh_data_open(&op, &ds2);
        if (rc == 0)
            rc = mesh_data_sample(ds2, MESH_DATA_EVAL, 9, 0, 0, xp, &lab);
        if (rc == 0)
            rc = mesh_data_sample(ds, MESH_DATA_EVAL, 9, 0, 0, xn, &lab2);
        for (int c = 0; rc == 0 && c < 3; c++)
            for (int y = 0; y < 36; y++)
                for (int x = 0; x < 36; x++) {
                    float v = xp[(c * 36 + y) * 36 + x];
                    int in = x >= 2 && x < 34 && y >= 2 && y < 34;
                    float want = in ? xn[(c * 32 + y - 2) * 32 + x - 2]
                                    : -info.mean[c] / info.std[c];

                    same &= fabsf(v - want) < 1e-5f;
                }
        ok(rc == 0 && same && lab == lab2,
           "fit pad to 36: the 32x32 image centred, zero pixels around");
        mesh_data_close(ds2);
        free(xp);
        free(xn);
    }
    mesh_data_close(ds);

    /* Wrong record size. */
    write_cifar(dir, 100);
    o.seed = 7;
    rc = mesh_data_open(&o, &ds);
    ok(rc < 0 && strstr(mesh_err_msg(rc), "data_batch_3.bin") &&
           strstr(mesh_err_msg(rc), "3073") &&
           strstr(mesh_err_msg(rc), "offset 122920"),
       "wrong cifar size: %s", mesh_err_msg(rc));
}

/* ---- imagefolder ------------------------------------------------------ */

#ifdef HAVE_JPEG
/* The pixels of write_jpeg's images. */
struct test_image {
    int solid, r, g, b;
    uint64_t s; /* noise state */
};

static void test_image_row(uint8_t *row, int y, int w, int h, void *arg)
{
    struct test_image *t = arg;

    for (int x = 0; x < w; x++) {
        if (t->solid) {
            row[3 * x] = (uint8_t)t->r;
            row[3 * x + 1] = (uint8_t)t->g;
            row[3 * x + 2] = (uint8_t)t->b;
        } else {
            row[3 * x] = (uint8_t)(x * 255 / w);
            row[3 * x + 1] = (uint8_t)(y * 255 / h);
            row[3 * x + 2] = (uint8_t)lcg(&t->s);
        }
    }
}

/* A w x h JPEG: solid (r, g, b) when solid, else a gradient + noise. */
static void write_jpeg(const char *path, int w, int h, int solid, int r, int g,
                       int b)
{
    struct test_image t = {solid, r, g, b, (uint64_t)w * 31 + (uint64_t)h};
    int rc = jpeg_util_write(path, w, h, 95, test_image_row, &t);

    if (rc < 0) {
        diag("%s", mesh_err_msg(rc));
        abort();
    }
}

/* n batches from a training loader over ds (default augmentation, two
 * threads): 0, or the first error. */
static int run_loader(struct mesh_dataset *ds, int batch, int n)
{
    struct mesh_loader_opts lo = {.split = MESH_DATA_TRAIN,
                                  .batch = batch,
                                  .world = 1,
                                  .threads = 2,
                                  .augment = -1};
    struct mesh_loader *ld = NULL;
    struct mesh_batch b;
    int rc = mesh_loader_create(ds, &lo, &ld);

    for (int s = 0; rc == 0 && s < n; s++)
        rc = mesh_data_next(ld, &b);
    mesh_loader_destroy(ld);
    return rc;
}

static const char *classes[] = {"dog", "ant", "cat"}; /* sorted: ant cat dog */
static const int colour[3][3] = {{200, 30, 30}, {30, 200, 30}, {30, 30, 200}};

static void make_folder(const char *root)
{
    char p[600];

    mkdir(root, 0755);
    for (int sp = 0; sp < 2; sp++) {
        snprintf(p, sizeof(p), "%s/%s", root, sp ? "val" : "train");
        mkdir(p, 0755);
        for (int c = 0; c < 3; c++) {
            int n = sp ? 2 : 6;

            snprintf(p, sizeof(p), "%s/%s/%s", root, sp ? "val" : "train",
                     classes[c]);
            mkdir(p, 0755);
            for (int i = 0; i < n; i++) {
                snprintf(p, sizeof(p), "%s/%s/%s/img%02d.jpg", root,
                         sp ? "val" : "train", classes[c], i);
                /* Train: textured, various sizes; val: solid colours. */
                write_jpeg(p, 40 + 13 * i + 7 * c, 30 + 11 * i, sp,
                           colour[c][0], colour[c][1], colour[c][2]);
            }
        }
    }
    snprintf(p, sizeof(p), "%s/train/cat/notes.txt", root);
    write_bytes(p, "not an image", 12);
}

static void test_folder(void)
{
    char root[300], spec[320], path[600], trunc_off[64] = "";
    struct mesh_data_opts o = {.size = 24, .seed = 5};
    struct mesh_dataset *ds = NULL;
    struct mesh_data_info info;
    float x[3 * 24 * 24], x2[3 * 24 * 24];
    int32_t lab = -1, lab2 = -1;
    int rc, good = 1;

    snprintf(root, sizeof(root), "%s/folder", tmp);
    make_folder(root);
    if (open_dir(&o, spec, sizeof(spec), "imagefolder", root, &ds) != 0)
        return;
    mesh_data_get_info(ds, &info);
    {
        char link[320];
        struct mesh_data_opts ol = o;
        struct mesh_dataset *dl = NULL;
        uint8_t f1[32], f2[32];

        snprintf(link, sizeof(link), "imagefolder:%s/folder-link", tmp);
        rc = symlink(root, link + 12);
        ol.spec = link;
        if (rc == 0)
            rc = mesh_data_open(&ol, &dl);
        if (rc == 0)
            rc = mesh_data_fingerprint(dl, f1) | mesh_data_fingerprint(ds, f2);
        ok(rc == 0 && !memcmp(f1, f2, 32),
           "the same image folder under another path: same fingerprint");
        mesh_data_close(dl);
    }
    ok(info.train_count == 18 && info.eval_count == 6 && info.classes == 3 &&
           !strcmp(mesh_data_class_name(ds, 0), "ant") &&
           !strcmp(mesh_data_class_name(ds, 2), "dog"),
       "imagefolder: 18 train, 6 val, classes sorted ant, cat, dog");

    /* Eval transform of a solid image: every pixel is that colour. */
    rc = mesh_data_sample(ds, MESH_DATA_EVAL, 3, 0, 0, x, &lab);
    for (int c = 0; rc == 0 && c < 3; c++)
        for (int i = 0; i < 24 * 24; i++) {
            int v = unnorm(x[c * 576 + i], info.mean[c], info.std[c]);

            good &= abs(v - colour[2][c]) <= 3; /* "cat": label 1 */
        }
    ok(rc == 0 && good && lab == 1,
       "eval resize + centre crop of a solid cat image keeps its colour");

    /* Train transform: shape, range, determinism, epochs differ. */
    rc = mesh_data_sample(ds, MESH_DATA_TRAIN, 4, 0, 1, x, &lab);
    good = rc == 0;
    for (int c = 0; good && c < 3; c++)
        for (int i = 0; i < 576; i++)
            good &= x[c * 576 + i] >= -info.mean[c] / info.std[c] - 1e-4f &&
                    x[c * 576 + i] <= (1 - info.mean[c]) / info.std[c] + 1e-4f;
    rc = mesh_data_sample(ds, MESH_DATA_TRAIN, 4, 0, 1, x2, &lab2);
    ok(good && rc == 0 && !memcmp(x, x2, sizeof(float) * 3 * 576),
       "random-resized-crop: values in the normalised range, same for the "
       "same (seed, epoch, index)");
    rc = mesh_data_sample(ds, MESH_DATA_TRAIN, 4, 1, 1, x2, &lab2);
    ok(rc == 0 && memcmp(x, x2, sizeof(float) * 3 * 576) && lab == lab2,
       "another epoch, another crop, same label");

    /* Thread counts: identical loader batches. */
    {
        struct mesh_loader_opts lo = {.split = MESH_DATA_TRAIN,
                                      .batch = 3,
                                      .world = 1,
                                      .threads = 1,
                                      .augment = -1};
        struct mesh_loader *a = NULL, *b = NULL;
        size_t fl = 3 * 3 * 576;
        float *ba = malloc(sizeof(float) * fl * 8);
        float *bb = malloc(sizeof(float) * fl * 8);
        int32_t la[24], lb[24];

        rc = create_grab(ds, &lo, &a, 8, ba, fl, la);
        lo.threads = 3;
        if (rc == 0)
            rc = create_grab(ds, &lo, &b, 8, bb, fl, lb);
        ok(rc == 0 && !memcmp(ba, bb, sizeof(float) * fl * 8) &&
               !memcmp(la, lb, sizeof(la)),
           "imagefolder: 1 and 3 decoding threads give identical batches");
        mesh_loader_destroy(a);
        mesh_loader_destroy(b);
        free(ba);
        free(bb);
    }
    mesh_data_close(ds);
    ds = NULL;

    /* A truncated JPEG (train/cat/img03.jpg = index 9) and garbage. */
    snprintf(path, sizeof(path), "%s/train/cat/img03.jpg", root);
    {
        struct stat st;
        char want[64];

        stat(path, &st);
        /* Cut inside the entropy-coded data, past the headers. */
        truncate_to(path, st.st_size * 3 / 4);
        snprintf(want, sizeof(want), "offset %lld",
                 (long long)(st.st_size * 3 / 4));
        snprintf(trunc_off, sizeof(trunc_off), "%s", want);
    }
    o.on_bad = MESH_DATA_BAD_FAIL;
    rc = mesh_data_open(&o, &ds);
    if (rc == 0)
        rc = mesh_data_sample(ds, MESH_DATA_TRAIN, 9, 0, 0, x, &lab);
    ok(rc < 0 && strstr(mesh_err_msg(rc), path) &&
           strstr(mesh_err_msg(rc), trunc_off),
       "truncated JPEG, fail: %s", mesh_err_msg(rc));
    rc = ds ? run_loader(ds, 18, 1) : -1;
    ok(rc < 0 && strstr(mesh_err_msg(rc), path),
       "the loader returns that error from mesh_data_next: %s",
       mesh_err_msg(rc));
    mesh_data_close(ds);
    ds = NULL;
    o.on_bad = MESH_DATA_BAD_SKIP;
    rc = mesh_data_open(&o, &ds);
    if (rc == 0)
        rc = mesh_data_sample(ds, MESH_DATA_TRAIN, 9, 0, 0, x, &lab);
    if (rc == 0)
        rc = mesh_data_sample(ds, MESH_DATA_TRAIN, 10, 0, 0, x2, &lab2);
    ok(rc == 0 && lab == lab2 && !memcmp(x, x2, sizeof(float) * 3 * 576),
       "truncated JPEG, skip: replaced by the next good sample");
    snprintf(path, sizeof(path), "%s/train/dog/img05.jpg", root);
    write_bytes(path, "\xff\xd8\xff\xe0garbage, not a JPEG at all", 30);
    rc = run_loader(ds, 6, 6);
    ok(rc == 0, "skip: two epochs with a garbage JPEG run through");
    mesh_data_close(ds);
    o.on_bad = MESH_DATA_BAD_FAIL;
    rc = mesh_data_open(&o, &ds);
    if (rc == 0)
        rc = mesh_data_sample(ds, MESH_DATA_TRAIN, 17, 0, 1, x, &lab);
    ok(rc < 0 && strstr(mesh_err_msg(rc), path) &&
           strstr(mesh_err_msg(rc), "bad JPEG at byte offset"),
       "garbage JPEG, fail: %s", mesh_err_msg(rc));
    mesh_data_close(ds);
    ds = NULL;
    {
        /* train/ without val/: no evaluation, and a warning says so */
        char noval[400], target[700], log[2048];

        snprintf(noval, sizeof(noval), "%s/noval", tmp);
        mkdir(noval, 0755);
        snprintf(target, sizeof(target), "%s/train", noval);
        snprintf(path, sizeof(path), "%s/train", root);
        rc = symlink(path, target);
        snprintf(spec, sizeof(spec), "imagefolder:%s", noval);
        if (rc == 0)
            rc = open_logged(spec, &ds, log, sizeof(log));
        ok(rc == 0 && strstr(log, "no val/") && strstr(log, "no evaluation"),
           "imagefolder without val/: said: %s", rc ? mesh_err_msg(rc) : log);
        mesh_data_close(ds);
    }
}
#endif

static void test_synthetic(void)
{
    struct mesh_data_opts o = {.spec = "synthetic:100",
                               .channels = 3,
                               .size = 8,
                               .classes = 5,
                               .seed = 11};
    struct mesh_dataset *a = NULL, *b = NULL;
    struct mesh_data_info info;
    float xa[192], xb[192];
    int32_t la, lb;
    int rc, good = 1, inr = 1;

    rc = mesh_data_open(&o, &a);
    if (rc == 0)
        rc = mesh_data_open(&o, &b);
    if (rc == 0)
        mesh_data_get_info(a, &info);
    ok(rc == 0 && info.train_count == 100 && info.eval_count == 20 &&
           info.classes == 5 && info.channels == 3 && info.size == 8,
       "synthetic:100 at 3x8x8, 5 classes: 100 train, 20 eval");
    for (int i = 0; rc == 0 && i < 100; i++) {
        rc = mesh_data_sample(a, MESH_DATA_TRAIN, (size_t)i, 0, 0, xa, &la) |
             mesh_data_sample(b, MESH_DATA_TRAIN, (size_t)i, 0, 0, xb, &lb);
        good &= !memcmp(xa, xb, sizeof(xa)) && la == lb && la >= 0 && la < 5;
        for (int k = 0; k < 192; k++)
            inr &= fabsf(xa[k]) < 1.74f;
    }
    ok(rc == 0 && good && inr,
       "synthetic: same seed, same samples; labels and values in range");
    {
        uint8_t fa[32], fb[32];
        struct mesh_dataset *c = NULL;

        rc = mesh_data_fingerprint(a, fa);
        rc |= mesh_data_fingerprint(b, fb);
        ok(rc == 0 && !memcmp(fa, fb, 32),
           "equal data sets have equal fingerprints");
        o.seed = 12;
        rc = mesh_data_open(&o, &c);
        if (rc == 0)
            rc = mesh_data_fingerprint(c, fb);
        ok(rc == 0 && memcmp(fa, fb, 32),
           "other synthetic data, another fingerprint");
        mesh_data_close(c);
    }
    mesh_data_close(a);
    mesh_data_close(b);
    o.spec = "synthetic:0";
    rc = mesh_data_open(&o, &a);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "synthetic:0"),
       "a bad spec is refused: %s", mesh_err_msg(rc));
    o.spec = "mnist";
    rc = mesh_data_open(&o, &a);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "unknown"),
       "an unknown data set is refused: %s", mesh_err_msg(rc));
}

int main(void)
{
    int n = 6 + 6 + 19; /* synthetic, fashion-mnist, cifar10 */

    setenv("MESHTRAIN_LOG", "error", 0);
#ifdef HAVE_ZLIB
    n += 8;
#endif
#ifdef HAVE_JPEG
    n += 13;
#endif
    if (tmpdir_make(tmp, sizeof(tmp), "test_data") != 0) {
        skip_all("cannot create a temporary directory");
        return 0;
    }
    plan(n);
    test_synthetic();
    test_fmnist();
#ifdef HAVE_ZLIB
    test_idx_bad();
#endif
    test_cifar();
#ifdef HAVE_JPEG
    test_folder();
#endif
    tmpdir_remove(tmp);
    return done();
}
