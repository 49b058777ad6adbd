/*
 * tests/test_nn_devsim.c: the GPU test double itself (nn/devsim.c), whose
 * promises tests/train_devsim.sh relies on:
 * - conversions: float32 to float16 and bfloat16 equal the collective's
 *   mesh_convert bit for bit on every 29th float32 bit pattern (148 M
 *   inputs, every exponent and, the stride being odd, every pattern of
 *   low bits: ties, subnormals, overflow, NaN; all 2^32 were checked once,
 *   30 s, too long for every make check), widening on every 16-bit input,
 *   and the scale is applied before the rounding;
 * - copies: a copy's destination holds 0xff bytes from copy_start until
 *   the copy lands (with MESHTRAIN_DEVSIM_COPY_US set, a test sees it),
 *   copies finish in the order started (FIFO) or, under
 *   MESHTRAIN_DEVSIM_COPY_ORDER=lifo, newest first; sync waits for all;
 * - bad settings are refused with the variable named.
 * Skips when the cpu backend (and so devsim) is not built.
 */
#include "config.h"

#include "collective/collective.h"
#include "nn/backend.h"
#include "nn/nn.h"
#include "common/util.h"
#include "tests/tap.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NCOPY  8
#define BLOCK  (1u << 20) /* inputs per block of the sweep */
#define STRIDE 29         /* between two inputs of the sweep */

static int open_dev(const char *delay, const char *order,
                    struct mesh_nn_ctx **out)
{
    if (delay)
        setenv("MESHTRAIN_DEVSIM_COPY_US", delay, 1);
    else
        unsetenv("MESHTRAIN_DEVSIM_COPY_US");
    if (order)
        setenv("MESHTRAIN_DEVSIM_COPY_ORDER", order, 1);
    else
        unsetenv("MESHTRAIN_DEVSIM_COPY_ORDER");
    return mesh_nn_ctx_open("devsim", 1, out);
}

/* Every STRIDE-th float32 bit pattern, narrowed by devsim and by
 * mesh_convert. */
static void narrow_sweep(struct mesh_nn_ctx *ctx)
{
    uint32_t *x = malloc(BLOCK * 4);
    uint16_t *a = malloc(BLOCK * 2), *b = malloc(BLOCK * 2);
    uint64_t base, bad16 = 0, badbf = 0, first16 = 0, firstbf = 0;
    size_t i;

    if (!x || !a || !b) {
        ok(0, "narrowing: out of memory");
        ok(0, "narrowing: out of memory");
        goto out;
    }
    for (base = 0; base < (UINT64_C(1) << 32); base += BLOCK * STRIDE) {
        for (i = 0; i < BLOCK; i++)
            x[i] = (uint32_t)(base + i * STRIDE);
        mesh_nn_convert(ctx, MESH_DT_F16, a, MESH_DT_F32, x, BLOCK, 1.f);
        mesh_convert(MESH_DT_F16, b, MESH_DT_F32, x, BLOCK);
        for (i = 0; i < BLOCK; i++)
            if (a[i] != b[i] && bad16++ == 0)
                first16 = x[i];
        mesh_nn_convert(ctx, MESH_DT_BF16, a, MESH_DT_F32, x, BLOCK, 1.f);
        mesh_convert(MESH_DT_BF16, b, MESH_DT_F32, x, BLOCK);
        for (i = 0; i < BLOCK; i++)
            if (a[i] != b[i] && badbf++ == 0)
                firstbf = x[i];
    }
    ok(bad16 == 0,
       "float32 -> float16 equals mesh_convert on 148 M inputs (%llu "
       "differ, first 0x%08llx)",
       (unsigned long long)bad16, (unsigned long long)first16);
    ok(badbf == 0,
       "float32 -> bfloat16 equals mesh_convert on 148 M inputs (%llu "
       "differ, first 0x%08llx)",
       (unsigned long long)badbf, (unsigned long long)firstbf);
out:
    free(b);
    free(a);
    free(x);
}

static void widen_and_scale(struct mesh_nn_ctx *ctx)
{
    static uint16_t h[65536];
    static float fa[65536], fb[65536];
    float x[4] = {3.0f, 1.0f / 3.0f, 65504.0f, 1e-6f}, y[4];
    uint16_t ha[4], hb[4];
    int dt, bad = 0;
    size_t i;

    for (i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (dt = MESH_DT_F16; dt <= MESH_DT_BF16; dt++) {
        mesh_nn_convert(ctx, MESH_DT_F32, fa, dt, h, 65536, 1.f);
        mesh_convert(MESH_DT_F32, fb, dt, h, 65536);
        bad += memcmp(fa, fb, sizeof(fa)) != 0;
    }
    ok(bad == 0, "float16 and bfloat16 -> float32 equal mesh_convert on "
                 "all 2^16 inputs");
    /* the scale multiplies in float32, then rounds once */
    mesh_nn_convert(ctx, MESH_DT_F16, ha, MESH_DT_F32, x, 4, 0.5f);
    for (i = 0; i < 4; i++)
        y[i] = x[i] * 0.5f;
    mesh_convert(MESH_DT_F16, hb, MESH_DT_F32, y, 4);
    mesh_nn_convert(ctx, MESH_DT_F32, y, MESH_DT_F32, x, 4, 0.25f);
    ok(memcmp(ha, hb, sizeof(ha)) == 0 && y[0] == 0.75f && y[2] == 16376.0f,
       "convert scales before rounding, also float32 to float32");
}

/*
 * NCOPY copies into distinct destinations, 50 ms each: poisoned until they
 * land. FIFO: when copy NCOPY/2 is done, every earlier one is (no timing
 * involved). lifo: the thread takes copy 0 at once, then the newest queued
 * one each time (7, 6, ..., 1), so copy 1 lands 250 ms after copy 7, and
 * is checked right after copy 7 landed.
 */
static void copies(struct mesh_nn_ctx *ctx, int lifo)
{
    static float src[NCOPY][256], dst[NCOPY][256];
    struct mesh_nn_copy *c[NCOPY];
    int i, k, poisoned = 1, landed = 1, order = 1, rc = 0, done;
    uint32_t bits;

    for (i = 0; i < NCOPY; i++)
        for (k = 0; k < 256; k++)
            src[i][k] = (float)(i * 256 + k);
    for (i = 0; i < NCOPY && rc == 0; i++)
        rc = mesh_nn_copy_d2h_start(ctx, dst[i], src[i], sizeof(dst[i]), &c[i]);
    ok(rc == 0, "%s: %d copies started", lifo ? "lifo" : "fifo", NCOPY);
    if (rc < 0)
        return;
    /* the two copies that run last are 300 ms away */
    memcpy(&bits, &dst[lifo ? 1 : NCOPY - 1][0], 4);
    poisoned = bits == 0xffffffffu;
    memcpy(&bits, &dst[lifo ? 2 : NCOPY - 2][255], 4);
    poisoned = poisoned && bits == 0xffffffffu;
    ok(poisoned, "%s: destinations hold 0xff bytes until their copy lands",
       lifo ? "lifo" : "fifo");
    k = lifo ? NCOPY - 1 : NCOPY / 2;
    rc = mesh_nn_copy_wait(ctx, c[k]);
    for (i = 0; i < NCOPY; i++) {
        done = 0;
        if (i == k)
            continue;
        mesh_nn_copy_test(ctx, c[i], &done);
        if (!lifo && i < k && !done)
            order = 0; /* an earlier copy is still queued */
        if (lifo && i == 1 && done)
            order = 0; /* the oldest queued one did not wait */
    }
    ok(rc == 0 && order, "%s: copies finish %s", lifo ? "lifo" : "fifo",
       lifo ? "newest first" : "in the order started");
    for (i = 0; i < NCOPY; i++)
        if (i != k)
            rc |= i % 2 ? mesh_nn_copy_wait(ctx, c[i])
                        : mesh_nn_copy_order(ctx, c[i]);
    for (i = 0; i < NCOPY; i++)
        landed = landed && memcmp(dst[i], src[i], sizeof(src[i])) == 0;
    ok(rc == 0 && landed, "%s: every copy landed after wait/order",
       lifo ? "lifo" : "fifo");
}

static void sync_waits(struct mesh_nn_ctx *ctx)
{
    static float src[4096], dst[4096];
    struct mesh_nn_copy *c;
    int rc, i;

    for (i = 0; i < 4096; i++)
        src[i] = (float)i;
    rc = mesh_nn_copy_h2d_start(ctx, dst, src, sizeof(dst), &c);
    if (rc == 0)
        rc = mesh_nn_sync(ctx);
    ok(rc == 0 && memcmp(dst, src, sizeof(src)) == 0,
       "sync waits for the copies in flight");
    if (rc == 0)
        mesh_nn_copy_wait(ctx, c);
}

int main(void)
{
    struct mesh_nn_ctx *ctx = NULL;
    int rc;

    rc = open_dev(NULL, NULL, &ctx);
    if (rc == -ENOTSUP) {
        skip_all("%s", mesh_err_msg(rc));
        return 0;
    }
    plan(18);
    ok(rc == 0, "devsim opens: %s", rc ? mesh_err_msg(rc) : "");
    if (rc < 0)
        return done();
    narrow_sweep(ctx);
    widen_and_scale(ctx);
    mesh_nn_ctx_close(ctx);

    rc = open_dev("50000", NULL, &ctx);
    ok(rc == 0, "devsim opens with a 50 ms delay per copy");
    if (rc < 0)
        return done();
    copies(ctx, 0);
    sync_waits(ctx);
    mesh_nn_ctx_close(ctx);
    rc = open_dev("50000", "lifo", &ctx);
    ok(rc == 0, "devsim opens with copies newest first");
    if (rc < 0)
        return done();
    copies(ctx, 1);
    mesh_nn_ctx_close(ctx);

    rc = open_dev("-1", NULL, &ctx);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "MESHTRAIN_DEVSIM_COPY_US"),
       "a bad delay is refused, naming the variable: %s", mesh_err_msg(rc));
    rc = open_dev(NULL, "random", &ctx);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "MESHTRAIN_DEVSIM_COPY_ORDER"),
       "a bad order is refused, naming the variable: %s", mesh_err_msg(rc));
    return done();
}
