/*
 * tests/test_safetensors.c: the safetensors reader and writer.
 *
 *   - round trip of several dtypes and shapes, metadata, zero-size tensors;
 *   - F16/BF16 <-> F32 conversion, exhaustive over all 65536 half values,
 *     and rounding cases;
 *   - mesh_st_read's checks (presence, dtype, shape) and their messages;
 *   - the writer's argument checks and its atomicity;
 *   - the seed corpus (tests/safetensors-corpus/ *.st): good files load,
 *     each malformed one is rejected with its expected message;
 *   - a deterministic mutation fuzzer over the corpus (bounded in time):
 *     every input is either valid or a clean error;
 *   - interoperability with PyTorch when /usr/bin/python3 imports torch
 *     (tests/st_torch_roundtrip.py writes and reads the format by hand):
 *     conversions agree with torch's, a small module and, with torchvision,
 *     a resnet18 state_dict go torch -> us -> torch and load strictly.
 *
 * Files go to a fresh directory under $TMPDIR (or /tmp), removed at the end.
 */
#include "config.h"

#include "nn/safetensors.h"
#include "common/util.h"
#include "tests/tap.h"
#include "tests/tmpdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static const char *tpath(const char *name)
{
    static char buf[512];

    snprintf(buf, sizeof(buf), "%s/%s", tmpdir, name);
    return buf;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    uint64_t x = rng_state;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

static int read_file(const char *path, uint8_t **out, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (!fp)
        return -1;
    if (fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) < 0 ||
        fseek(fp, 0, SEEK_SET) != 0) {
        fclose(fp);
        return -1;
    }
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        fclose(fp);
        return -1;
    }
    fclose(fp);
    *out = buf;
    *len = (size_t)n;
    return 0;
}

/* ---- round trip ---------------------------------------------------------- */

static void test_roundtrip(void)
{
    float w[2][3] = {{1.5f, -2.25f, 3.0f}, {0.0f, -0.0f, 1e-30f}};
    uint16_t h[5] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00};
    uint16_t bf[2][2][2] = {{{0x3f80, 0xbf80}, {0x4049, 0x0000}},
                            {{0x7f80, 0xff80}, {0x0001, 0x8000}}};
    int64_t nbt = 12345678901234ll;
    uint8_t u8[7] = {0, 1, 2, 127, 128, 254, 255};
    double f64[3] = {3.141592653589793, -1e300, 5e-324};
    int32_t i32[4] = {-1, 2147483647, -2147483647 - 1, 7};
    const char *meta[] = {
        "format",      "pt",      "quote\"and\\slash",
        "line\nbreak", "unicode", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80",
        NULL};
    struct mesh_st_entry e[] = {
        {"conv.weight", MESH_DT_F32, 2, {2, 3}, w},
        {"half", MESH_DT_F16, 1, {5}, h},
        {"bf", MESH_DT_BF16, 3, {2, 2, 2}, bf},
        {"bn.num_batches_tracked", MESH_ST_I64, 0, {0}, &nbt},
        {"bytes", MESH_ST_U8, 1, {7}, u8},
        {"dbl", MESH_ST_F64, 1, {3}, f64},
        {"empty", MESH_DT_F32, 2, {0, 4}, NULL},
        {"ints", MESH_ST_I32, 4, {1, 1, 2, 2}, i32},
        {"na\xc3\xafve \"name\"\t", MESH_DT_F32, 1, {1}, w},
    };
    int n = (int)MESH_ARRAY_SIZE(e);
    struct mesh_st_file *f = NULL;
    int rc, all = 1;

    rc = mesh_st_write(tpath("rt.st"), e, n, meta);
    ok(rc == 0, "write %d tensors with metadata: %s", n,
       rc ? mesh_err_msg(rc) : "ok");
    rc = mesh_st_open(tpath("rt.st"), &f);
    ok(rc == 0, "open it back: %s", rc ? mesh_err_msg(rc) : "ok");
    if (rc)
        return;
    ok(mesh_st_count(f) == n, "count %d", mesh_st_count(f));
    for (int i = 0; i < n; i++) {
        const struct mesh_st_tensor *t = mesh_st_find(f, e[i].name);
        size_t sz = mesh_st_dtype_size(e[i].dtype);
        uint64_t elems = 1;
        int same;

        for (int d = 0; d < e[i].ndim; d++)
            elems *= (uint64_t)e[i].shape[d];
        same = t && t == mesh_st_get(f, i) && t->dtype == e[i].dtype &&
               t->ndim == e[i].ndim && t->nbytes == elems * sz &&
               strcmp(t->name, e[i].name) == 0;
        for (int d = 0; same && d < MESH_ST_MAX_DIMS; d++)
            same = t->shape[d] == (d < e[i].ndim ? e[i].shape[d] : 0);
        if (same && elems)
            same = memcmp(mesh_st_data(f, t), e[i].data, elems * sz) == 0;
        if (!same) {
            ok(0, "tensor %s survives the round trip", e[i].name);
            all = 0;
        }
    }
    ok(all, "every tensor keeps name, dtype, shape and bytes");
    ok(mesh_st_get(f, n) == NULL && mesh_st_get(f, -1) == NULL,
       "get out of range gives NULL");
    ok(mesh_st_find(f, "nope") == NULL && mesh_st_find(f, "") == NULL,
       "find of an absent name gives NULL");
    for (int i = 0; meta[i]; i += 2) {
        const char *v = mesh_st_metadata(f, meta[i]);
        ok(v && strcmp(v, meta[i + 1]) == 0, "metadata \"%s\"", meta[i]);
    }
    ok(mesh_st_metadata(f, "absent") == NULL, "absent metadata is NULL");
    {
        int64_t got = 0;
        float row[2][3];
        double d[3];
        int64_t wide[4];

        rc = mesh_st_read(f, "bn.num_batches_tracked", MESH_ST_I64, NULL, 0,
                          &got);
        ok(rc == 0 && got == nbt, "read a scalar I64");
        rc = mesh_st_read(f, "conv.weight", MESH_DT_F32,
                          (const int64_t[]){2, 3}, 2, row);
        ok(rc == 0 && memcmp(row, w, sizeof(w)) == 0, "read F32 [2,3]");
        rc = mesh_st_read(f, "dbl", MESH_ST_F64, (const int64_t[]){3}, 1, d);
        ok(rc == 0 && memcmp(d, f64, sizeof(d)) == 0, "read F64");
        rc = mesh_st_read(f, "ints", MESH_ST_I64, (const int64_t[]){1, 1, 2, 2},
                          4, wide);
        ok(rc == 0 && wide[0] == -1 && wide[1] == 2147483647 &&
               wide[2] == -2147483648ll && wide[3] == 7,
           "read I32 widened to I64");
        rc = mesh_st_read(f, "empty", MESH_DT_F32, (const int64_t[]){0, 4}, 2,
                          NULL);
        ok(rc == 0, "read a zero-size tensor");
    }
    mesh_st_close(f);

    /* The data buffer starts 8-byte aligned and the file is exactly sized. */
    {
        uint8_t *buf;
        size_t len;
        uint64_t hl = 0;

        if (read_file(tpath("rt.st"), &buf, &len) == 0) {
            for (int i = 7; i >= 0; i--)
                hl = hl << 8 | buf[i];
            ok((8 + hl) % 8 == 0, "header padded to 8 bytes (%" PRIu64 ")", hl);
            rc = mesh_st_parse(buf, len, &f);
            ok(rc == 0, "parse from memory");
            mesh_st_close(f);
            free(buf);
        } else {
            ok(0, "reread %s", tpath("rt.st"));
        }
    }

    /* No tensors, no metadata: "{}" plus padding. */
    rc = mesh_st_write(tpath("empty.st"), NULL, 0, NULL);
    if (rc == 0)
        rc = mesh_st_open(tpath("empty.st"), &f);
    ok(rc == 0 && mesh_st_count(f) == 0, "empty file round trip");
    if (rc == 0)
        mesh_st_close(f);
}

/* ---- conversions --------------------------------------------------------- */

static uint32_t fbits(float f)
{
    uint32_t u;

    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;

    memcpy(&f, &u, 4);
    return f;
}

/* A naive reference for half -> float, from the definition. */
static float half_ref(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;

    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexpf((float)m, -24);
    else
        v = ldexpf((float)(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Write one tensor, read it back as another dtype. */
static int convert(int from, int to, const void *src, int64_t n, void *dst)
{
    struct mesh_st_entry e = {"x", from, 1, {n}, src};
    struct mesh_st_file *f;
    int rc;

    rc = mesh_st_write(tpath("conv.st"), &e, 1, NULL);
    if (rc == 0)
        rc = mesh_st_open(tpath("conv.st"), &f);
    if (rc == 0) {
        rc = mesh_st_read(f, "x", to, &n, 1, dst);
        mesh_st_close(f);
    }
    if (rc)
        diag("convert: %s", mesh_err_msg(rc));
    return rc;
}

/* Whether F16 `h`, read as F32 `fl` and written back as `back`, went wrong:
 * the round trip is the identity except NaN, which comes back canonical. */
static int f16_wrong(uint16_t h, float fl, uint16_t back)
{
    int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    uint16_t want = nan ? (uint16_t)((h & 0x8000) | 0x7e00) : h;

    return back != want || (!nan && fl != half_ref(h)) || (nan && !isnan(fl));
}

/* The same for BF16, whose F32 value is its bits shifted up. */
static int bf16_wrong(uint16_t h, float fl, uint16_t back)
{
    int nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
    uint16_t want = nan ? 0x7fc0 : h;

    return back != want || fbits(fl) != (uint32_t)h << 16;
}

/* Convert all 65536 values `all` of 16-bit dtype `dt` (named `name`) to F32
 * in `fl` and back into `back`, and count those `wrong` says went wrong; one
 * test point. Returns the conversions' error code. */
static int check_roundtrip(int dt, const char *name,
                           int (*wrong)(uint16_t, float, uint16_t),
                           const uint16_t *all, float *fl, uint16_t *back)
{
    int bad = 0, rc;

    rc = convert(dt, MESH_DT_F32, all, 65536, fl);
    if (rc == 0)
        rc = convert(MESH_DT_F32, dt, fl, 65536, back);
    for (int i = 0; rc == 0 && i < 65536; i++)
        if (wrong(all[i], fl[i], back[i]))
            bad++;
    ok(rc == 0 && bad == 0, "%s -> F32 -> %s over all 65536 values (%d bad)",
       name, name, bad);
    return rc;
}

/* An F32 bit pattern and the 16-bit value it must round to. */
struct rounding_case {
    uint32_t f;
    uint16_t h;
};

/* Convert each case's F32 to `to` (F16 or BF16, named `name`) and check it
 * rounds as expected; one test point for the whole table. */
static void check_rounding(int to, const char *name,
                           const struct rounding_case *v, size_t n)
{
    float *src = calloc(n, sizeof *src);
    uint16_t *got = calloc(n, sizeof *got);
    int bad = 0, rc;

    if (!src || !got) {
        ok(0, "F32 -> %s rounding cases: out of memory", name);
        free(src);
        free(got);
        return;
    }
    for (size_t i = 0; i < n; i++)
        src[i] = bitsf(v[i].f);
    rc = convert(MESH_DT_F32, to, src, (int64_t)n, got);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (got[i] != v[i].h) {
            diag("F32 0x%08" PRIx32 " -> %s 0x%04x, expected 0x%04x", v[i].f,
                 name, got[i], v[i].h);
            bad++;
        }
    ok(rc == 0 && bad == 0, "F32 -> %s rounding cases", name);
    free(src);
    free(got);
}

static void test_conversions(void)
{
    uint16_t *all = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *fl = malloc(65536 * 4);
    int bad, rc;

    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;

    /* F16 -> F32 -> F16 is the identity except NaN, which is canonical. */
    rc = check_roundtrip(MESH_DT_F16, "F16", f16_wrong, all, fl, back);
    ok(rc == 0 && fl[0x3c00] == 1.0f && fl[0xc000] == -2.0f &&
           fl[0x7bff] == 65504.0f && fl[0x0001] == ldexpf(1, -24) &&
           fl[0x0400] == ldexpf(1, -14) &&
           fl[0x03ff] == 1023 * ldexpf(1, -24) && isinf(fl[0x7c00]) &&
           fl[0xfc00] < 0 && fbits(fl[0x8000]) == 0x80000000u,
       "F16 -> F32 known values (normal, subnormal, inf, -0)");

    /* BF16 likewise. */
    check_roundtrip(MESH_DT_BF16, "BF16", bf16_wrong, all, fl, back);

    /* F32 -> F16 rounding: ties to even, overflow, subnormals. */
    {
        static const struct rounding_case v[] = {
            {0x3f800000, 0x3c00}, /* 1 */
            {0x3f801000, 0x3c00}, /* 1 + 2^-11: tie, down to even */
            {0x3f803000, 0x3c02}, /* 1 + 3 * 2^-11: tie, up to even */
            {0x3f801001, 0x3c01}, /* just above the tie */
            {0x477fe000, 0x7bff}, /* 65504 */
            {0x477fefff, 0x7bff}, /* just below 65520 */
            {0x477ff000, 0x7c00}, /* 65520 rounds to inf */
            {0x7f7fffff, 0x7c00}, /* FLT_MAX */
            {0x33000000, 0x0000}, /* 2^-25: tie, down to 0 */
            {0x33000001, 0x0001}, /* above 2^-25 */
            {0x33c00000, 0x0002}, /* 1.5 * 2^-24: tie, up to even 2 */
            {0x387fc000, 0x03ff}, /* the largest subnormal */
            {0x387fe000, 0x0400}, /* tie, up into the smallest normal */
            {0x38800000, 0x0400}, /* 2^-14 */
            {0xb3800000, 0x8001}, /* -2^-24 */
            {0x00000001, 0x0000}, /* float subnormal */
            {0x80000000, 0x8000}, /* -0 */
            {0xff800000, 0xfc00}, /* -inf */
            {0x7fc00001, 0x7e00}, /* NaN */
            {0xffc00000, 0xfe00}, /* -NaN */
        };
        check_rounding(MESH_DT_F16, "F16", v, MESH_ARRAY_SIZE(v));
    }
    {
        static const struct rounding_case v[] = {
            {0x3f808000, 0x3f80},                       /* tie, down to even */
            {0x3f818000, 0x3f82},                       /* tie, up to even */
            {0x3f808001, 0x3f81}, {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to inf
                                                         */
            {0x7f7f7fff, 0x7f7f}, {0x00000001, 0x0000}, {0x80000000, 0x8000},
            {0xffc00001, 0x7fc0}, /* NaN is canonical */
        };
        check_rounding(MESH_DT_BF16, "BF16", v, MESH_ARRAY_SIZE(v));
    }
    /* F32 -> F16 over random floats agrees with F16 -> F32 ordering. */
    {
        enum { N = 200000 };
        float *src = malloc(N * 4), *re = malloc(N * 4);
        uint16_t *hh = malloc(N * 2);

        for (int i = 0; i < N; i++) {
            uint32_t u = (uint32_t)rng();
            /* Mostly in or near F16 range. */
            u = (u & 0x80000000u) |
                ((u & 0x7fffffffu) % 0x10000000u + 0x30000000u);
            src[i] = bitsf(u);
        }
        rc = convert(MESH_DT_F32, MESH_DT_F16, src, N, hh);
        if (rc == 0)
            rc = convert(MESH_DT_F16, MESH_DT_F32, hh, N, re);
        bad = 0;
        for (int i = 0; rc == 0 && i < N; i++) {
            /* The result is one of the two neighbours, the nearer one. */
            float x = src[i], y = re[i];
            uint16_t other =
                (uint16_t)(hh[i] + ((fabsf(y) < fabsf(x)) ? 1 : -1));
            float z;

            if (isinf(y) && fabsf(x) >= 65520.0f)
                continue;
            if (hh[i] == 0 || hh[i] == 0x8000) {
                if (fabsf(x) > ldexpf(1, -25))
                    bad++;
                continue;
            }
            z = half_ref(other);
            if (fabsf(y - x) > fabsf(z - x))
                bad++;
        }
        ok(rc == 0 && bad == 0,
           "F32 -> F16 picks the nearest value for %d random floats (%d bad)",
           N, bad);
        free(src);
        free(re);
        free(hh);
    }
    free(all);
    free(back);
    free(fl);
}

/* ---- mesh_st_read's checks ----------------------------------------------- */

static void test_read_errors(void)
{
    float w[64 * 64];
    int64_t nbt = 3;
    struct mesh_st_entry e[] = {
        {"layer1.0.conv1.weight", MESH_DT_F32, 4, {64, 64, 1, 1}, w},
        {"bn1.num_batches_tracked", MESH_ST_I64, 0, {0}, &nbt},
        {"u8", MESH_ST_U8, 1, {4}, w},
    };
    struct mesh_st_file *f;
    float out[64 * 64 * 9];
    int rc;

    memset(w, 0, sizeof(w));
    rc = mesh_st_write(tpath("re.st"), e, 3, NULL);
    if (rc == 0)
        rc = mesh_st_open(tpath("re.st"), &f);
    ok(rc == 0, "write and open a file for read checks");
    if (rc)
        return;
    rc = mesh_st_read(f, "layer1.0.conv1.weight", MESH_DT_F32,
                      (const int64_t[]){64, 64, 3, 3}, 4, out);
    ok(rc == -EINVAL && strcmp(mesh_err_msg(rc),
                               "layer1.0.conv1.weight: shape [64,64,1,1] in "
                               "file, [64,64,3,3] expected") == 0,
       "wrong shape: %s", mesh_err_msg(rc));
    rc = mesh_st_read(f, "layer1.0.conv1.weight", MESH_DT_F32,
                      (const int64_t[]){64, 64}, 2, out);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "[64,64,1,1] in file, "
                                                 "[64,64] expected"),
       "wrong rank: %s", mesh_err_msg(rc));
    rc = mesh_st_read(f, "bn1.num_batches_tracked", MESH_DT_F32, NULL, 0, out);
    ok(rc == -EINVAL && strcmp(mesh_err_msg(rc),
                               "bn1.num_batches_tracked: dtype I64 in file, "
                               "F32 expected") == 0,
       "wrong dtype: %s", mesh_err_msg(rc));
    rc = mesh_st_read(f, "layer1.0.conv1.weight", MESH_ST_I64,
                      (const int64_t[]){64, 64, 1, 1}, 4, out);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "dtype F32 in file, I64"),
       "float is not read as integer: %s", mesh_err_msg(rc));
    rc = mesh_st_read(f, "u8", MESH_DT_F32, (const int64_t[]){4}, 1, out);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "dtype U8 in file, F32"),
       "integer is not read as float: %s", mesh_err_msg(rc));
    rc =
        mesh_st_read(f, "fc.weight", MESH_DT_F32, (const int64_t[]){2}, 1, out);
    ok(rc == -ENOENT &&
           strcmp(mesh_err_msg(rc), "fc.weight: not in the file") == 0,
       "absent tensor: %s", mesh_err_msg(rc));
    rc = mesh_st_read(f, "u8", 99, (const int64_t[]){4}, 1, out);
    ok(rc == -EINVAL, "unknown dtype requested: %s", mesh_err_msg(rc));
    rc = mesh_st_read(f, "u8", MESH_ST_U8, (const int64_t[]){4}, 9, out);
    ok(rc == -EINVAL, "ndim out of range: %s", mesh_err_msg(rc));
    mesh_st_close(f);
}

/* ---- the writer's checks and atomicity ----------------------------------- */

static int file_equals(const char *path, const uint8_t *want, size_t len)
{
    uint8_t *buf;
    size_t n;
    int same;

    if (read_file(path, &buf, &n) < 0)
        return 0;
    same = n == len && memcmp(buf, want, len) == 0;
    free(buf);
    return same;
}

/* A file that cannot be mapped (a FIFO) is read instead. */
static void test_fifo(void)
{
    float x[3] = {1, 2, 3}, y[3] = {0};
    struct mesh_st_entry e = {"x", MESH_DT_F32, 1, {3}, x};
    struct mesh_st_file *f = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    pid_t pid;
    int rc, st;

    rc = mesh_st_write(tpath("fifo-src.st"), &e, 1, NULL);
    if (rc || read_file(tpath("fifo-src.st"), &buf, &len) < 0 ||
        mkfifo(tpath("fifo"), 0600) < 0) {
        ok(0, "set up a FIFO");
        free(buf);
        return;
    }
    pid = fork();
    if (pid == 0) {
        int fd = open(tpath("fifo"), O_WRONLY);
        _exit(fd < 0 || write(fd, buf, len) != (ssize_t)len);
    }
    rc = mesh_st_open(tpath("fifo"), &f);
    if (rc == 0) {
        rc = mesh_st_read(f, "x", MESH_DT_F32, (const int64_t[]){3}, 1, y);
        mesh_st_close(f);
    }
    waitpid(pid, &st, 0);
    ok(rc == 0 && memcmp(x, y, sizeof(x)) == 0 && WIFEXITED(st) &&
           WEXITSTATUS(st) == 0,
       "read through a FIFO: %s", rc ? mesh_err_msg(rc) : "ok");
    free(buf);
}

static void test_write_errors(void)
{
    float x[4] = {1, 2, 3, 4};
    struct mesh_st_entry good = {"x", MESH_DT_F32, 1, {4}, x};
    struct mesh_st_entry dup[2] = {good, good};
    struct mesh_st_entry reserved = good, utf8 = good, dtype = good;
    struct mesh_st_entry shape = good, dims = good, nodata = good;
    const char *kvdup[] = {"a", "1", "a", "2", NULL};
    const char *kvodd[] = {"a", NULL};
    /* Writes that must fail with -EINVAL and a message containing `want`. */
    const struct {
        const struct mesh_st_entry *e;
        int n;
        const char *const *kv;
        const char *want, *what;
    } cases[] = {
        {dup, 2, NULL, "duplicate tensor name \"x\"", "duplicate names"},
        {&reserved, 1, NULL, "reserved", "reserved name"},
        {&utf8, 1, NULL, "UTF-8", "invalid UTF-8 name"},
        {&dtype, 1, NULL, "x: dtype 42", "unknown dtype"},
        {&shape, 1, NULL, "bad shape [-4]", "negative shape"},
        {&dims, 1, NULL, "", "9 dimensions"},
        {&nodata, 1, NULL, "NULL data", "NULL data"},
        {&good, 1, kvdup, "duplicate metadata key", "duplicate metadata key"},
        {&good, 1, kvodd, "has no value", "metadata key without value"},
    };
    uint8_t *orig;
    size_t olen;
    DIR *d;
    struct dirent *de;
    int rc, leftovers = 0;

    reserved.name = "__metadata__";
    utf8.name = "bad\xff";
    dtype.dtype = 42;
    shape.shape[0] = -4;
    dims.ndim = 9;
    nodata.data = NULL;
    rc = mesh_st_write(tpath("w.st"), &good, 1, NULL);
    ok(rc == 0 && read_file(tpath("w.st"), &orig, &olen) == 0,
       "write a file to overwrite");
    if (rc)
        return;
    for (size_t i = 0; i < MESH_ARRAY_SIZE(cases); i++) {
        rc = mesh_st_write(tpath("w.st"), cases[i].e, cases[i].n, cases[i].kv);
        ok(rc == -EINVAL && strstr(mesh_err_msg(rc), cases[i].want), "%s: %s",
           cases[i].what, mesh_err_msg(rc));
    }
    ok(file_equals(tpath("w.st"), orig, olen),
       "failed writes leave the old file untouched");
    rc = mesh_st_write(tpath("no/such/dir/w.st"), &good, 1, NULL);
    ok(rc == -ENOENT && strstr(mesh_err_msg(rc), "no/such/dir/w.st.tmp-"),
       "missing directory: %s", mesh_err_msg(rc));
    d = opendir(tmpdir);
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".tmp-"))
            leftovers++;
    if (d)
        closedir(d);
    ok(d && leftovers == 0, "no temporary files left behind");
    {
        struct stat st;
        ok(stat(tpath("w.st"), &st) == 0 && (st.st_mode & 0777) == 0644,
           "mode 0644");
    }
    free(orig);

    rc = mesh_st_open(tpath("absent.st"), &(struct mesh_st_file *){NULL});
    ok(rc == -ENOENT && strstr(mesh_err_msg(rc), "absent.st"),
       "open of a missing file: %s", mesh_err_msg(rc));
    rc = mesh_st_open(tmpdir, &(struct mesh_st_file *){NULL});
    ok(rc == -EISDIR, "open of a directory: %s", mesh_err_msg(rc));
    test_fifo();
}

/* ---- the seed corpus ----------------------------------------------------- */

static const struct {
    const char *file;
    const char *msg; /* NULL: the file is valid */
} corpus[] = {
    {"bad-escape.st", "header byte 3: invalid JSON: bad escape '\\q'"},
    {"bad-utf8.st", "header byte 3: invalid UTF-8 in a string"},
    {"bytes-overflow.st",
     "header byte 1: tensor \"w\": byte size of shape [4611686018427387904] "
     "overflows"},
    {"control-char.st",
     "header byte 3: invalid JSON: unescaped control character 0x01 in a "
     "string"},
    {"deep-nesting.st",
     "header byte 5: tensor \"a\": expected an object, found '['"},
    {"deep-shape.st",
     "header byte 29: tensor \"a\": expected a non-negative integer in "
     "\"shape\", found '['"},
    {"dtype-lowercase.st",
     "header byte 16: tensor \"w\": unknown dtype \"f32\""},
    {"duplicate-field.st",
     "header byte 20: tensor \"w\": duplicate field \"dtype\""},
    {"duplicate-metadata-key.st",
     "header byte 33: duplicate metadata key \"a\" (first at header byte 17)"},
    {"duplicate-metadata.st", "header byte 19: duplicate \"__metadata__\""},
    {"duplicate-name-escaped.st",
     "header byte 54: tensor \"w\": duplicate tensor name (first at header "
     "byte 1)"},
    {"duplicate-name.st",
     "header byte 54: tensor \"w\": duplicate tensor name (first at header "
     "byte 1)"},
    {"elements-overflow.st",
     "header byte 1: tensor \"w\": element count of shape "
     "[4294967296,4294967296,2] overflows"},
    {"empty-entry.st", "header byte 1: tensor \"w\": missing \"dtype\""},
    {"exponent-offset.st",
     "header byte 50: tensor \"w\": expected an integer in \"data_offsets\", "
     "found a fraction or exponent"},
    {"float-shape.st",
     "header byte 29: tensor \"w\": expected an integer in \"shape\", found a "
     "fraction or exponent"},
    {"good-basic.st", NULL},
    {"good-empty.st", NULL},
    {"good-escapes.st", NULL},
    {"good-out-of-order.st", NULL},
    {"good-zero-size.st", NULL},
    {"header-huge-u64.st",
     "header length 18446744073709551615 exceeds the limit of 100000000 bytes"},
    {"header-nul-padding.st",
     "header byte 2: trailing garbage after the header's JSON object"},
    {"header-past-eof.st",
     "header length 1000 runs past the end of the file (2 bytes after the "
     "length field)"},
    {"header-tiny.st", "header length 1 is too short for a JSON object"},
    {"header-too-large.st",
     "header length 100000001 exceeds the limit of 100000000 bytes"},
    {"header-trailing-garbage.st",
     "header byte 3: trailing garbage after the header's JSON object"},
    {"header-zero.st", "header length 0 is too short for a JSON object"},
    {"hole-at-start.st",
     "header byte 1: tensor \"a\": data_offsets [4,8] leave a hole: data "
     "bytes [0,4) belong to no tensor"},
    {"hole.st",
     "header byte 62: tensor \"b\": data_offsets [8,12] leave a hole: data "
     "bytes [4,8) belong to no tensor"},
    {"leading-space.st",
     "header byte 0: the header must start with '{', found whitespace"},
    {"leading-zero.st",
     "header byte 29: tensor \"w\": invalid JSON: leading zero in a number in "
     "\"shape\""},
    {"literal-true.st",
     "header byte 14: tensor \"a\": invalid JSON: expected a string as the "
     "dtype, found a boolean or garbage"},
    {"lone-high-surrogate.st",
     "header byte 3: invalid JSON: high surrogate \\ud800 without a low one"},
    {"lone-low-surrogate.st",
     "header byte 3: invalid JSON: lone low surrogate \\udc00"},
    {"long-name.st",
     "header byte 315: tensor \"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\x0a"
     "mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm...\": unknown "
     "dtype \"F17\""},
    {"metadata-not-object.st",
     "header byte 16: invalid JSON: expected '{' as the value of "
     "\"__metadata__\", found a string"},
    {"metadata-not-string.st",
     "header byte 21: metadata \"a\": the value must be a string, found a "
     "number"},
    {"missing-colon.st", "header byte 5: invalid JSON: expected ':' after a "
                         "tensor name, found '{'"},
    {"missing-dtype.st", "header byte 1: tensor \"w\": missing \"dtype\""},
    {"missing-offsets.st",
     "header byte 1: tensor \"w\": missing \"data_offsets\""},
    {"missing-shape.st", "header byte 1: tensor \"w\": missing \"shape\""},
    {"nbytes-mismatch.st",
     "header byte 1: tensor \"layer1.0.conv1.weight\": data_offsets [0,8] "
     "hold 8 bytes but dtype F32 shape [2,2] needs 16"},
    {"negative-shape.st",
     "header byte 29: tensor \"w\": expected a non-negative integer in "
     "\"shape\", found a negative number"},
    {"no-tensors-with-data.st",
     "trailing garbage: 4 data bytes but no tensors"},
    {"not-object.st",
     "header byte 0: the header must start with '{', found '['"},
    {"nul-in-name.st",
     "header byte 3: NUL character (\\u0000) in a string is not supported"},
    {"offset-u64-overflow.st",
     "header byte 50: tensor \"w\": integer in \"data_offsets\" is larger "
     "than 18446744073709551615"},
    {"offsets-one.st",
     "header byte 53: tensor \"w\": \"data_offsets\" needs two entries "
     "[begin, end], found 1"},
    {"offsets-out-of-range.st",
     "header byte 1: tensor \"fc.bias\": data_offsets [0,16] run past the end "
     "of the data buffer (8 bytes)"},
    {"offsets-reversed.st",
     "header byte 1: tensor \"w\": data_offsets [4,0] end before they begin"},
    {"offsets-three.st",
     "header byte 53: tensor \"w\": more than 2 entries in \"data_offsets\""},
    {"overlap-same.st",
     "header byte 62: tensor \"b\": data_offsets [0,8] overlap tensor \"a\" "
     "[0,8]"},
    {"overlap-zero-size.st",
     "header byte 62: tensor \"z\": data_offsets [4,4] overlap tensor \"a\" "
     "[0,8]"},
    {"overlap.st",
     "header byte 62: tensor \"b\": data_offsets [4,12] overlap tensor \"a\" "
     "[0,8]"},
    {"overlong-utf8.st", "header byte 3: invalid UTF-8 in a string"},
    {"shape-int-overflow.st",
     "header byte 29: tensor \"w\": integer in \"shape\" is larger than "
     "9223372036854775807"},
    {"short-file.st",
     "file is 3 bytes, too short for the 8-byte header length"},
    {"short-unicode-escape.st",
     "header byte 3: invalid JSON: \\u needs four hex digits"},
    {"surrogate-utf8.st", "header byte 3: invalid UTF-8 in a string"},
    {"tensor-not-object.st",
     "header byte 5: tensor \"w\": expected an object, found '['"},
    {"too-many-dims.st",
     "header byte 32: tensor \"w\": more than 8 entries in \"shape\""},
    {"trailing-comma.st",
     "header byte 54: invalid JSON: trailing comma in the header object"},
    {"trailing-garbage.st",
     "header byte 1: tensor \"a\": trailing garbage: the data buffer has 8 "
     "bytes but this last tensor ends at 4"},
    {"unknown-dtype.st", "header byte 16: tensor \"w\": unknown dtype \"F17\""},
    {"unknown-field.st", "header byte 53: tensor \"w\": unknown field \"foo\""},
    {"unterminated-object.st",
     "header byte 53: invalid JSON: expected ',' or '}' in the header object, "
     "found end of header"},
    {"unterminated-string.st",
     "header byte 14: tensor \"a\": invalid JSON: unterminated string as the "
     "dtype"},
};

static char corpus_dir[512];

/* A valid file: every tensor reads back as itself and, if float, as F32. */
static int exercise(const struct mesh_st_file *f, uint64_t data_len)
{
    uint64_t total = 0;

    for (int i = 0; i < mesh_st_count(f); i++) {
        const struct mesh_st_tensor *t = mesh_st_get(f, i);
        uint64_t elems = t->nbytes / mesh_st_dtype_size(t->dtype);
        void *buf;
        int rc;

        if (mesh_st_find(f, t->name) != t || t->offset + t->nbytes > data_len)
            return -1;
        total += t->nbytes;
        buf = malloc(elems * 8 + 1);
        if (!buf)
            return -1;
        rc = mesh_st_read(f, t->name, t->dtype, t->shape, t->ndim, buf);
        if (rc == 0 && (t->dtype == MESH_DT_F16 || t->dtype == MESH_DT_BF16 ||
                        t->dtype == MESH_ST_F64))
            rc = mesh_st_read(f, t->name, MESH_DT_F32, t->shape, t->ndim, buf);
        free(buf);
        if (rc)
            return -1;
    }
    return total == data_len ? 0 : -1;
}

static uint64_t data_len_of(const uint8_t *b, size_t len)
{
    uint64_t h = 0;

    for (int i = 7; i >= 0; i--)
        h = h << 8 | b[i];
    return len - 8 - h;
}

static void test_corpus(void)
{
    const char *top = getenv("top_srcdir");
    int missing = 0, extra = 0;
    DIR *d;
    struct dirent *de;

    snprintf(corpus_dir, sizeof(corpus_dir), "%s/tests/safetensors-corpus",
             top && *top ? top : ".");
    for (size_t i = 0; i < MESH_ARRAY_SIZE(corpus); i++) {
        char path[1024];
        struct mesh_st_file *f = NULL;
        uint8_t *buf = NULL;
        size_t len = 0;
        int rc, rc2;

        snprintf(path, sizeof(path), "%s/%s", corpus_dir, corpus[i].file);
        if (read_file(path, &buf, &len) < 0) {
            ok(0, "corpus file %s is readable", path);
            missing++;
            continue;
        }
        rc = mesh_st_open(path, &f);
        if (!corpus[i].msg) {
            ok(rc == 0 && exercise(f, data_len_of(buf, len)) == 0,
               "%s loads (%d tensors): %s", corpus[i].file,
               rc ? -1 : mesh_st_count(f), rc ? mesh_err_msg(rc) : "ok");
            if (rc == 0)
                mesh_st_close(f);
        } else {
            char want[1024];

            snprintf(want, sizeof(want), "%s: %s", path, corpus[i].msg);
            ok(rc == -EINVAL && strcmp(mesh_err_msg(rc), want) == 0,
               "%s is rejected: %s", corpus[i].file, mesh_err_msg(rc));
            if (rc == 0)
                mesh_st_close(f);
        }
        /* From memory, the same verdict and message. */
        rc2 = mesh_st_parse(buf, len, &f);
        if (rc2 == 0)
            mesh_st_close(f);
        if ((rc2 == 0) != (corpus[i].msg == NULL) ||
            (rc2 && !strstr(mesh_err_msg(rc2), corpus[i].msg)))
            ok(0, "%s from memory: %s", corpus[i].file, mesh_err_msg(rc2));
        free(buf);
    }
    /* Every .st in the directory has an entry above. */
    d = opendir(corpus_dir);
    while (d && (de = readdir(d))) {
        size_t n = strlen(de->d_name), i;

        if (n < 3 || strcmp(de->d_name + n - 3, ".st") != 0)
            continue;
        for (i = 0; i < MESH_ARRAY_SIZE(corpus); i++)
            if (strcmp(corpus[i].file, de->d_name) == 0)
                break;
        if (i == MESH_ARRAY_SIZE(corpus)) {
            diag("corpus file %s has no expected message", de->d_name);
            extra++;
        }
    }
    if (d)
        closedir(d);
    ok(d && missing == 0 && extra == 0,
       "the table covers the corpus directory %s", corpus_dir);
}

/* ---- mutation fuzzer ----------------------------------------------------- */

struct seed {
    uint8_t *b;
    size_t len;
};

static const char *const tokens[] = {
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\\u",
    "\\ud800",
    "\\udc00",
    "\\u0000",
    "0",
    "1",
    "-1",
    "01",
    "1.5",
    "1e3",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "\"dtype\"",
    "\"shape\"",
    "\"data_offsets\"",
    "\"__metadata__\"",
    "\"F32\"",
    "\"F16\"",
    "\"BF16\"",
    "\"I64\"",
    "\"BOOL\"",
    "\"F8_E4M3\"",
    "\"x\"",
    "[]",
    "{}",
    "[0,0]",
    " ",
    "\t",
    "\n",
    "\xff",
    "\xc3\xa9",
    "\xf0\x9f\x98\x80",
    "\xed\xa0\x80",
    "null",
    "true",
};

static void put_len(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_len(const uint8_t *b)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

/*
 * One mutant of seed s in out (capacity cap); returns its length. Header
 * edits keep the length field in step half of the time, so that mutants get
 * past the length check into the JSON and the offset checks.
 */
static size_t mutate(const struct seed *seeds, int nseeds, uint8_t *out,
                     size_t cap)
{
    const struct seed *s = &seeds[rng() % (uint64_t)nseeds];
    size_t len = MESH_MIN(s->len, cap);
    uint64_t hl = len >= 8 ? get_len(s->b) : 0;
    int rounds = 1 + (int)(rng() % 3);

    memcpy(out, s->b, len);
    for (int r = 0; r < rounds; r++) {
        int kind = (int)(rng() % 8);
        size_t pos, n;

        if (len >= 8)
            hl = get_len(out);
        switch (kind) {
        case 0: /* bit flips anywhere */
            for (int k = 0; len && k < 1 + (int)(rng() % 4); k++) {
                pos = rng() % len;
                out[pos] ^= (uint8_t)(1u << (rng() % 8));
            }
            break;
        case 1: /* truncation */
            len = len ? rng() % len : 0;
            break;
        case 2: { /* the length field */
            static const uint64_t v[] = {
                0,         1,          2,
                7,         8,          100000000,
                100000001, UINT64_MAX, (uint64_t)1 << 63};
            if (len < 8)
                break;
            switch (rng() % 3) {
            case 0:
                put_len(out, v[rng() % MESH_ARRAY_SIZE(v)]);
                break;
            case 1:
                put_len(out, hl + (rng() % 17) - 8);
                break;
            default:
                put_len(out, len - 8 - (rng() % 9));
            }
            break;
        }
        case 3:   /* insert a token into the header */
        case 4: { /* delete a span of the header */
            size_t hend = len < 8 ? 0 : (size_t)MESH_MIN(hl, len - 8);
            const char *tok = tokens[rng() % MESH_ARRAY_SIZE(tokens)];
            size_t tl = strlen(tok);

            if (len < 8)
                break;
            pos = 8 + (hend ? rng() % (hend + 1) : 0);
            if (kind == 3) {
                if (len + tl > cap)
                    break;
                memmove(out + pos + tl, out + pos, len - pos);
                memcpy(out + pos, tok, tl);
                len += tl;
                if (rng() % 2)
                    put_len(out, hl + tl);
            } else {
                n = 1 + rng() % 8; /* not inside MESH_MIN: one draw */
                n = MESH_MIN(n, len - pos);
                memmove(out + pos, out + pos + n, len - pos - n);
                len -= n;
                if (rng() % 2)
                    put_len(out, hl >= n ? hl - n : 0);
            }
            break;
        }
        case 5: /* change a digit: shapes and offsets */
            for (int k = 0; k < 16 && len > 8; k++) {
                pos = 8 + rng() % (len - 8);
                if (out[pos] >= '0' && out[pos] <= '9') {
                    out[pos] = (uint8_t)('0' + rng() % 10);
                    break;
                }
            }
            break;
        case 6: { /* the header of one seed, the data of another */
            const struct seed *o = &seeds[rng() % (uint64_t)nseeds];
            uint64_t ohl = o->len >= 8 ? get_len(o->b) : 0;
            size_t keep = (size_t)MESH_MIN(8 + hl, (uint64_t)len);

            if (len < 8 || o->len < 8 || ohl > o->len - 8)
                break;
            n = MESH_MIN(o->len - 8 - (size_t)ohl, cap - keep);
            memcpy(out + keep, o->b + 8 + ohl, n);
            len = keep + n;
            break;
        }
        default: /* append or drop data bytes */
            if (rng() % 2 && len < cap) {
                n = 1 + rng() % 16;
                n = MESH_MIN(n, cap - len);
                for (size_t k = 0; k < n; k++)
                    out[len + k] = (uint8_t)rng();
                len += n;
            } else if (len > 8) {
                len -= 1 + rng() % MESH_MIN(len - 8, 16);
            }
        }
    }
    return len;
}

static void test_fuzz(void)
{
    enum { ITERS = 200000, CAP = 1 << 18 };
    const double budget_s = 10.0;
    struct seed seeds[MESH_ARRAY_SIZE(corpus) + 1];
    int nseeds = 0, valid = 0, invalid = 0, broken = 0, iters = 0;
    uint8_t *scratch = malloc(CAP);
    double t0 = mesh_now_s();

    for (size_t i = 0; i < MESH_ARRAY_SIZE(corpus); i++) {
        char path[1024];

        snprintf(path, sizeof(path), "%s/%s", corpus_dir, corpus[i].file);
        if (read_file(path, &seeds[nseeds].b, &seeds[nseeds].len) == 0)
            nseeds++;
    }
    if (!nseeds || !scratch) {
        ok(0, "fuzz: corpus loaded from %s", corpus_dir);
        free(scratch);
        return;
    }
    rng_state = 0x243f6a8885a308d3ull; /* the same mutants every run */
    for (iters = 0; iters < ITERS && mesh_now_s() - t0 < budget_s; iters++) {
        size_t len = mutate(seeds, nseeds, scratch, CAP);
        /* An exact-size copy, so that a sanitizer sees any overread. */
        uint8_t *b = malloc(len ? len : 1);
        struct mesh_st_file *f;
        int rc;

        memcpy(b, scratch, len);
        mesh_err_clear();
        rc = mesh_st_parse(b, len, &f);
        if (rc == 0) {
            valid++;
            if (exercise(f, data_len_of(b, len)) < 0) {
                broken++;
                diag("iteration %d: accepted but inconsistent", iters);
            }
            mesh_st_close(f);
        } else {
            invalid++;
            if (rc != -EINVAL ||
                strncmp(mesh_err_msg(rc), "safetensors: ", 13) != 0) {
                broken++;
                diag("iteration %d: rc %d, message \"%s\"", iters, rc,
                     mesh_err_msg(rc));
            }
        }
        free(b);
    }
    ok(broken == 0 && iters >= 1000,
       "fuzz: %d mutants in %.1f s, %d valid, %d rejected cleanly, %d broken",
       iters, mesh_now_s() - t0, valid, invalid, broken);
    for (int i = 0; i < nseeds; i++)
        free(seeds[i].b);
    free(scratch);
}

static int test_torchvision(void);

/* ---- PyTorch interoperability -------------------------------------------- */

/* The generator st_torch_roundtrip.py uses too. */
static void lcg_bits(float *out, int n)
{
    uint32_t s = 12345;

    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        memcpy(&out[i], &s, 4);
    }
}

static char py_last[512]; /* the script's last line of output */

/* Run the script, its output as diagnostics; its exit status or -1. */
static int run_py(const char *script, const char *verb, const char *path)
{
    char cmd[2048];
    FILE *p;
    char line[512];
    int st;

    py_last[0] = '\0';
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 '%s' %s '%s' 2>&1", script,
             verb, path);
    p = popen(cmd, "r");
    if (!p)
        return -1;
    while (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\n")] = '\0';
        diag("python: %s", line);
        snprintf(py_last, sizeof(py_last), "%s", line);
    }
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/*
 * Bit for bit, except that any NaN matches any NaN: PyTorch's NaN bits vary
 * with the code path (1.13's vectorised BF16 rounding gives 0xffff, its
 * scalar one 0x7fc0; F16C quiets signalling NaNs), ours are documented in
 * nn/safetensors.c. width is 2 (F16 or BF16 per bf) or 4 (F32).
 */
static int same_values(const void *a, const void *b, size_t n, int width,
                       int bf)
{
    const uint8_t *x = a, *y = b;

    for (size_t i = 0; i < n; i++) {
        uint32_t u = 0, v = 0;
        int nu, nv;

        memcpy(&u, x + i * width, width);
        memcpy(&v, y + i * width, width);
        if (u == v)
            continue;
        if (width == 4) {
            nu = (u & 0x7fffffffu) > 0x7f800000u;
            nv = (v & 0x7fffffffu) > 0x7f800000u;
        } else if (bf) {
            nu = (u & 0x7fffu) > 0x7f80u;
            nv = (v & 0x7fffu) > 0x7f80u;
        } else {
            nu = (u & 0x7fffu) > 0x7c00u;
            nv = (v & 0x7fffu) > 0x7c00u;
        }
        if (!nu || !nv)
            return 0;
    }
    return 1;
}

static void test_torch(void)
{
    static const char *const model[] = {
        "0.weight",       "1.weight",      "1.bias",
        "1.running_mean", "1.running_var", "1.num_batches_tracked",
        "2.weight",       "2.bias",
    };
    static const int64_t shapes[][4] = {
        {4, 3, 3, 3}, {4}, {4}, {4}, {4}, {0}, {2, 5}, {2},
    };
    static const int ndims[] = {4, 1, 1, 1, 1, 0, 2, 1};
    const char *top = getenv("top_srcdir");
    char script[1024];
    float bits[4096], *allf = malloc(65536 * 4), mine32[65536];
    uint16_t h16[4096], mine16[4096], bf[4096], all16[65536];
    float mw[8][4 * 3 * 3 * 3];
    int64_t nbt = 0;
    struct mesh_st_entry out[3 + 8];
    struct mesh_st_file *f;
    int64_t sq[2] = {64, 64}, n65536 = 65536;
    int rc, good, r18;

    snprintf(script, sizeof(script), "%s/tests/st_torch_roundtrip.py",
             top && *top ? top : ".");
    if (access("/usr/bin/python3", X_OK) != 0) {
        skip("PyTorch interoperability: no /usr/bin/python3");
        free(allf);
        return;
    }

    /* torch writes, we read. */
    rc = run_py(script, "write", tmpdir);
    if (rc == 77) {
        skip("PyTorch interoperability: /usr/bin/python3 %s", py_last);
        free(allf);
        return;
    }
    ok(rc == 0, "torch writes %s", tpath("torch.st"));
    rc = rc ? -EIO : mesh_st_open(tpath("torch.st"), &f);
    ok(rc == 0, "we open torch's file: %s", rc ? mesh_err_msg(rc) : "ok");
    if (rc) {
        free(allf);
        return;
    }
    ok(mesh_st_metadata(f, "format") &&
           strcmp(mesh_st_metadata(f, "format"), "pt") == 0,
       "torch's metadata format=pt");
    lcg_bits(bits, 4096);
    rc = mesh_st_read(f, "bits.f32", MESH_DT_F32, sq, 2, mine32);
    ok(rc == 0 && memcmp(mine32, bits, sizeof(bits)) == 0,
       "F32 bit patterns from torch");
    /* torch's .half() / .bfloat16() against our rounding, read as F16. */
    rc = mesh_st_read(f, "bits.f32", MESH_DT_F16, sq, 2, mine16);
    if (rc == 0)
        rc = mesh_st_read(f, "bits.f16", MESH_DT_F16, sq, 2, h16);
    ok(rc == 0 && same_values(mine16, h16, 4096, 2, 0),
       "our F32 -> F16 equals torch .half() on 4096 patterns (NaN: any)");
    rc = mesh_st_read(f, "bits.f32", MESH_DT_BF16, sq, 2, mine16);
    if (rc == 0)
        rc = mesh_st_read(f, "bits.bf16", MESH_DT_BF16, sq, 2, bf);
    ok(rc == 0 && same_values(mine16, bf, 4096, 2, 1),
       "our F32 -> BF16 equals torch .bfloat16() on 4096 patterns (NaN: "
       "any)");
    /* torch's .float() of every half and bfloat16 against ours. */
    rc = mesh_st_read(f, "allhalf.f16", MESH_DT_F32, &n65536, 1, mine32);
    if (rc == 0)
        rc = mesh_st_read(f, "allhalf.f32", MESH_DT_F32, &n65536, 1, allf);
    good = rc == 0 && same_values(mine32, allf, 65536, 4, 0);
    rc = mesh_st_read(f, "allbf16.bf16", MESH_DT_F32, &n65536, 1, mine32);
    if (rc == 0)
        rc = mesh_st_read(f, "allbf16.f32", MESH_DT_F32, &n65536, 1, allf);
    ok(good && rc == 0 && same_values(mine32, allf, 65536, 4, 0),
       "our F16/BF16 -> F32 equals torch .float() on all 65536 values "
       "(NaN: any)");
    rc = mesh_st_read(f, "allhalf.f16", MESH_DT_F16, &n65536, 1, all16);
    ok(rc == 0 && all16[40000] == 40000, "F16 read as F16 is a copy");

    /* The model tensors, with torchvision's names and shapes. */
    good = 1;
    for (int i = 0; i < 8; i++) {
        char name[64];

        snprintf(name, sizeof(name), "model.%s", model[i]);
        if (ndims[i] == 0)
            rc = mesh_st_read(f, name, MESH_ST_I64, NULL, 0, &nbt);
        else
            rc = mesh_st_read(f, name, MESH_DT_F32, shapes[i], ndims[i], mw[i]);
        if (rc) {
            diag("%s", mesh_err_msg(rc));
            good = 0;
        }
    }
    ok(good && nbt == 42,
       "model tensors read with their shapes, "
       "num_batches_tracked %" PRId64,
       nbt);
    mesh_st_close(f);

    /* We write, torch reads and compares. */
    lcg_bits(bits, 4096);
    {
        uint16_t c16[4096], cbf[4096];
        struct mesh_st_entry conv = {"x", MESH_DT_F32, 2, {64, 64}, bits};

        rc = mesh_st_write(tpath("bits.st"), &conv, 1, NULL);
        if (rc == 0)
            rc = mesh_st_open(tpath("bits.st"), &f);
        if (rc == 0) {
            rc = mesh_st_read(f, "x", MESH_DT_F16, sq, 2, c16);
            if (rc == 0)
                rc = mesh_st_read(f, "x", MESH_DT_BF16, sq, 2, cbf);
            mesh_st_close(f);
        }
        memcpy(h16, c16, sizeof(h16));
        memcpy(bf, cbf, sizeof(bf));
    }
    nbt += 1;
    out[0] = (struct mesh_st_entry){"bits.f32", MESH_DT_F32, 2, {64, 64}, bits};
    out[1] = (struct mesh_st_entry){"bits.f16", MESH_DT_F16, 2, {64, 64}, h16};
    out[2] = (struct mesh_st_entry){"bits.bf16", MESH_DT_BF16, 2, {64, 64}, bf};
    for (int i = 0; i < 8; i++) {
        static char names[8][64];

        snprintf(names[i], sizeof(names[i]), "model.%s", model[i]);
        out[3 + i] = (struct mesh_st_entry){
            names[i],
            ndims[i] ? MESH_DT_F32 : MESH_ST_I64,
            ndims[i],
            {0},
            ndims[i] ? (const void *)mw[i] : (const void *)&nbt};
        memcpy(out[3 + i].shape, shapes[i], sizeof(shapes[i]));
    }
    rc = rc ? rc
            : mesh_st_write(tpath("ours.st"), out, 11,
                            (const char *const[]){"format", "pt", NULL});
    ok(rc == 0, "we write %s: %s", tpath("ours.st"),
       rc ? mesh_err_msg(rc) : "ok");
    r18 = test_torchvision();
    rc = rc ? rc : run_py(script, "check", tmpdir);
    ok(rc == 0 || rc == 8, "torch reads our file, checks rounding and loads "
                           "the model strictly");
    if (r18)
        ok(rc == 0 || rc == 4, "torch loads our resnet18 file strictly, "
                               "every tensor equal");
    free(allf);
}

/*
 * torchvision's resnet18 state_dict, written by the script next to
 * torch.st: we check a few names and shapes and write every tensor back, in
 * reverse order so that the offsets differ, for the script to load strictly
 * and compare. Returns 1 when r18-ours.st was written.
 */
static int test_torchvision(void)
{
    struct mesh_st_file *f = NULL;
    struct mesh_st_entry *e = NULL;
    const struct mesh_st_tensor *fc;
    float *w = NULL;
    int64_t nbt = 0;
    int n, rc;

    if (access(tpath("r18.st"), F_OK) != 0) {
        skip("torchvision resnet18 round trip: %s", py_last);
        return 0;
    }
    rc = mesh_st_open(tpath("r18.st"), &f);
    ok(rc == 0, "open torchvision resnet18 from torch: %s",
       rc ? mesh_err_msg(rc) : "ok");
    if (rc)
        return 0;
    n = mesh_st_count(f);
    w = malloc(64 * 64 * 3 * 3 * sizeof(*w));
    rc = mesh_st_read(f, "layer1.0.conv1.weight", MESH_DT_F32,
                      (const int64_t[]){64, 64, 3, 3}, 4, w);
    if (rc == 0)
        rc = mesh_st_read(f, "layer4.1.bn2.num_batches_tracked", MESH_ST_I64,
                          NULL, 0, &nbt);
    fc = mesh_st_find(f, "fc.weight");
    ok(rc == 0 && nbt == 1000 && fc && fc->ndim == 2 && fc->shape[0] == 1000 &&
           fc->shape[1] == 512,
       "resnet18: %d tensors, torchvision names and shapes: %s", n,
       rc ? mesh_err_msg(rc) : "ok");
    e = calloc((size_t)n, sizeof(*e));
    for (int i = 0; e && i < n; i++) {
        const struct mesh_st_tensor *t = mesh_st_get(f, n - 1 - i);

        e[i].name = t->name;
        e[i].dtype = t->dtype;
        e[i].ndim = t->ndim;
        memcpy(e[i].shape, t->shape, sizeof(e[i].shape));
        e[i].data = mesh_st_data(f, t);
    }
    rc = e ? mesh_st_write(tpath("r18-ours.st"), e, n,
                           (const char *const[]){"format", "pt", NULL})
           : -ENOMEM;
    ok(rc == 0, "write resnet18 back: %s", rc ? mesh_err_msg(rc) : "ok");
    mesh_st_close(f);
    unlink(tpath("r18.st"));
    free(e);
    free(w);
    return rc == 0;
}

int main(void)
{
    if (tmpdir_make(tmpdir, sizeof(tmpdir), "test_safetensors") < 0) {
        printf("Bail out! mkdtemp %s: %s\n", tmpdir, strerror(errno));
        return 1;
    }
    test_roundtrip();
    test_conversions();
    test_read_errors();
    test_write_errors();
    test_corpus();
    test_fuzz();
    test_torch();
    tmpdir_remove(tmpdir);
    return done();
}
