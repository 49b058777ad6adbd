/* tests/test_util.c: the base layer (common/): errors, host memory, clocks,
 * wire byte helpers, dtype names, sizes and scalar conversions. */
#include "config.h"

#include "common/array.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/util.h"
#include "tests/tap.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *other_thread(void *arg)
{
    (void)arg;
    /* A fresh thread sees no message from another thread. */
    return (void *)(intptr_t)(strcmp(mesh_err_msg(-EINVAL), strerror(EINVAL)) ==
                              0);
}

/* Byte helpers against the definition, over random values (3 seeds). */
static void check_bytes(void)
{
    static const uint8_t be[4] = {0x12, 0x34, 0x56, 0x78};
    int bad = 0;

    for (unsigned seed = 1; seed <= 3; seed++) {
        srand(seed);
        for (int t = 0; t < 1000; t++) {
            uint64_t v = 0;
            uint8_t b[8];

            for (int i = 0; i < 8; i++)
                v = v << 8 | (uint64_t)(rand() & 0xff);
            mesh_put_le64(b, v);
            for (int i = 0; i < 8; i++)
                bad += b[i] != (uint8_t)(v >> (8 * i));
            bad += mesh_get_le64(b) != v;
            bad += mesh_get_le32(b) != (uint32_t)v;
            bad += mesh_get_le16(b) != (uint16_t)v;
            mesh_put_le32(b, (uint32_t)(v >> 32));
            bad += mesh_get_le32(b) != (uint32_t)(v >> 32);
            mesh_put_le16(b, (uint16_t)(v >> 48));
            bad += b[0] != (uint8_t)(v >> 48) || b[1] != (uint8_t)(v >> 56);
        }
    }
    ok(bad == 0, "little-endian put/get match their definition (%d wrong)",
       bad);
    ok(mesh_get_be32(be) == 0x12345678u, "big-endian 32-bit read");
}

static void check_dtype(void)
{
    ok(mesh_dtype_size(MESH_DT_BYTE) == 1 &&
           mesh_dtype_size(MESH_DT_F32) == 4 &&
           mesh_dtype_size(MESH_DT_F16) == 2 &&
           mesh_dtype_size(MESH_DT_BF16) == 2 && mesh_dtype_size(9) == 0,
       "dtype sizes");
    ok(!strcmp(mesh_dtype_name(MESH_DT_F16), "float16") &&
           !strcmp(mesh_dtype_name(MESH_DT_BF16), "bfloat16") &&
           !strcmp(mesh_dtype_name(-1), "unknown-dtype"),
       "dtype names");
    /* IEEE values, and round to nearest even at the halfway points. */
    ok(mesh_f16_from_f32(1.0f) == 0x3c00 &&
           mesh_f16_from_f32(65504.f) == 0x7bff &&
           mesh_f16_from_f32(65520.f) == 0x7c00 &&
           mesh_f16_from_f32(0x1p-24f) == 0x0001 &&
           mesh_f16_from_f32(0x1p-25f) == 0x0000 &&
           mesh_f16_from_f32(1.0f + 0x1p-11f) == 0x3c00 &&
           mesh_f16_from_f32(1.0f + 3 * 0x1p-11f) == 0x3c02 &&
           mesh_f32_from_f16(0xc000) == -2.0f &&
           mesh_f32_from_f16(0x0001) == 0x1p-24f,
       "float16 conversions");
    ok(mesh_bf16_from_f32(1.0f) == 0x3f80 &&
           mesh_bf16_from_f32(1.0f + 0x1p-8f) == 0x3f80 &&
           mesh_bf16_from_f32(1.0f + 3 * 0x1p-8f) == 0x3f82 &&
           mesh_f32_from_bf16(0xc040) == -3.0f,
       "bfloat16 conversions");
}

/* Growth keeps the contents, doubles, and fails cleanly on overflow. */
static void check_array(void)
{
    int *v = NULL, *before;
    size_t cap = 0, n;
    int bad = 0, rc;

    for (n = 0; n < 5000; n++) {
        if (mesh_array_reserve(&v, &cap, n + 1, sizeof(*v), "ints") < 0)
            break;
        v[n] = (int)(n * 7 + 1);
    }
    for (size_t i = 0; i < n; i++)
        bad += v[i] != (int)(i * 7 + 1);
    ok(n == 5000 && bad == 0 && cap >= 5000 && cap < 10000 && cap % 16 == 0,
       "5000 appends: contents kept, capacity %zu", cap);
    before = v;
    rc = mesh_array_reserve(&v, &cap, SIZE_MAX / 2, sizeof(*v), "huge ints");
    ok(rc == -ENOMEM && v == before && cap >= 5000 &&
           strstr(mesh_err_msg(rc), "huge ints"),
       "an impossible size: -ENOMEM, array unchanged (%s)", mesh_err_msg(rc));
    free(v);
}

int main(void)
{
    pthread_t th;
    void *res;
    void *p = NULL;
    int rc;

    plan(15);
    check_array();
    check_bytes();
    check_dtype();
    rc = mesh_err(-EINVAL, "bad value %d", 42);
    ok(rc == -EINVAL, "mesh_err returns its code");
    ok(strcmp(mesh_err_msg(rc), "bad value 42") == 0, "message recorded");
    mesh_err_prefix(rc, "parsing %s", "x");
    ok(strcmp(mesh_err_msg(rc), "parsing x: bad value 42") == 0,
       "prefix adds context: %s", mesh_err_msg(rc));
    pthread_create(&th, NULL, other_thread, NULL);
    pthread_join(th, &res);
    ok(res != NULL, "messages are thread-local");
    errno = ENOENT;
    rc = mesh_err_errno("open %s", "/nope");
    ok(rc == -ENOENT && strstr(mesh_err_msg(rc), "No such file"),
       "errno message: %s", mesh_err_msg(rc));
    rc = mesh_host_alloc(12345, &p);
    ok(rc == 0 && p && ((uintptr_t)p % (uintptr_t)sysconf(_SC_PAGESIZE)) == 0,
       "host buffer is page-aligned");
    memset(p, 1, 12345);
    mesh_host_free(p, 12345);
    {
        uint64_t a = mesh_now_ns(), b = mesh_now_ns();
        ok(b >= a, "monotonic clock");
    }
    return done();
}
