/*
 * tests/test_reduce.c: the reduction kernels and conversions: every
 * instruction-set path this CPU has against the scalar path, bit for bit;
 * the scalar conversions against known values and exhaustively where that
 * is cheap; and the double binary tree's shape for 1..64 ranks.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* A random finite value of dtype (all exponents, subnormals included). */
static void fill(int dtype, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dtype == MESH_DT_F32) {
            uint32_t x;

            do
                x = rnd();
            while ((x & 0x7f800000) == 0x7f800000);
            /* keep sums finite most of the time: cap the exponent */
            if (((x >> 23) & 0xff) > 200)
                x &= ~0x40000000u;
            memcpy((float *)p + i, &x, 4);
        } else {
            uint16_t h;

            do
                h = (uint16_t)rnd();
            while (dtype == MESH_DT_F16 ? (h & 0x7c00) == 0x7c00
                                        : (h & 0x7f80) == 0x7f80);
            ((uint16_t *)p)[i] = h;
        }
    }
}

static float from_bits(uint32_t x)
{
    float f;

    memcpy(&f, &x, 4);
    return f;
}

static void test_known(void)
{
    ok(mesh_f16_from_f32(1.0f) == 0x3c00 &&
           mesh_f16_from_f32(-2.0f) == 0xc000 &&
           mesh_f16_from_f32(65504.0f) == 0x7bff &&
           mesh_f16_from_f32(65519.0f) == 0x7bff &&
           mesh_f16_from_f32(65520.0f) == 0x7c00 &&
           mesh_f16_from_f32(ldexpf(1, -24)) == 0x0001 &&
           mesh_f16_from_f32(ldexpf(1, -25)) == 0x0000 &&
           mesh_f16_from_f32(ldexpf(3, -26)) == 0x0001 &&
           mesh_f16_from_f32(ldexpf(1, -14)) == 0x0400 &&
           mesh_f16_from_f32(1.0f + ldexpf(1, -11)) == 0x3c00 &&
           mesh_f16_from_f32(1.0f + ldexpf(3, -11)) == 0x3c02,
       "f16 from f32: known values, ties to even, overflow, subnormals");
    ok(mesh_bf16_from_f32(1.0f) == 0x3f80 &&
           mesh_bf16_from_f32(from_bits(0x3f808000)) == 0x3f80 &&
           mesh_bf16_from_f32(from_bits(0x3f818000)) == 0x3f82 &&
           mesh_bf16_from_f32(from_bits(0x3f808001)) == 0x3f81 &&
           mesh_bf16_from_f32(from_bits(0x7f7fffff)) == 0x7f80 &&
           (mesh_bf16_from_f32(NAN) & 0x7fc0) == 0x7fc0,
       "bf16 from f32: known values, ties to even, overflow, NaN stays NaN");
}

/* Every non-NaN half and bfloat16 survives the round trip through f32. */
static void test_roundtrip(void)
{
    int bad16 = 0, badb = 0;

    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) != 0x7c00 || !(h & 0x3ff))
            bad16 += mesh_f16_from_f32(mesh_f32_from_f16((uint16_t)h)) != h;
        if ((h & 0x7f80) != 0x7f80 || !(h & 0x7f))
            badb += mesh_bf16_from_f32(mesh_f32_from_bf16((uint16_t)h)) != h;
    }
    ok(bad16 == 0, "f16 -> f32 -> f16 is the identity (%d differ)", bad16);
    ok(badb == 0, "bf16 -> f32 -> bf16 is the identity (%d differ)", badb);
    ok(mesh_f32_from_f16(0x0001) == ldexpf(1, -24) &&
           mesh_f32_from_f16(0x03ff) == ldexpf(1023, -24) &&
           mesh_f32_from_f16(0x7c00) == INFINITY,
       "f32 from f16: subnormals and infinity");
}

static void test_isa(int isa)
{
    static const size_t ns[] = {0, 1, 7, 8, 15, 16, 17, 33, 100, 1000, 4099};
    static const float divs[] = {1.0f, 3.0f, 4.0f, 7.0f};
    static const int dts[] = {MESH_DT_F32, MESH_DT_F16, MESH_DT_BF16};
    size_t nmax = 4099, bad = 0, cases = 0;
    void *src[4], *want = malloc(nmax * 4), *got = malloc(nmax * 4);
    float *wide = malloc(nmax * 4);
    uint32_t *raw = malloc(nmax * 4);

    for (int j = 0; j < 4; j++)
        src[j] = malloc(nmax * 4);
    for (size_t d = 0; d < MESH_ARRAY_SIZE(dts); d++)
        for (size_t ni = 0; ni < MESH_ARRAY_SIZE(ns); ni++)
            for (int nsrc = 1; nsrc <= 4; nsrc++)
                for (size_t di = 0; di < MESH_ARRAY_SIZE(divs); di++) {
                    size_t n = ns[ni], es = mesh_dtype_size(dts[d]);

                    for (int j = 0; j < nsrc; j++)
                        fill(dts[d], src[j], n);
                    mesh_reduce_sum_isa(MESH_ISA_SCALAR, dts[d], want,
                                        (const void *const *)src, nsrc, n,
                                        divs[di]);
                    mesh_reduce_sum_isa(isa, dts[d], got,
                                        (const void *const *)src, nsrc, n,
                                        divs[di]);
                    bad += memcmp(want, got, n * es) != 0;
                    /* in place: dst is src[0] */
                    memcpy(got, src[0], n * es);
                    {
                        const void *in[4] = {got, src[1], src[2], src[3]};

                        mesh_reduce_sum_isa(isa, dts[d], got, in, nsrc, n,
                                            divs[di]);
                    }
                    bad += memcmp(want, got, n * es) != 0;
                    cases += 2;
                }
    ok(bad == 0, "%s sums equal scalar bitwise (%zu of %zu cases differ)",
       mesh_isa_name(isa), bad, cases);

    /* conversions, including values that round into half subnormals */
    bad = 0;
    for (int rep = 0; rep < 20; rep++) {
        for (size_t i = 0; i < nmax; i++) {
            raw[i] = rnd();
            if ((raw[i] & 0x7f800000) == 0x7f800000)
                raw[i] &= 0xbfffffff;
            if (rep & 1) /* around the half range: 2^-26 .. 2^17 */
                raw[i] = (raw[i] & 0x807fffff) |
                         ((uint32_t)(101 + rnd() % 44) << 23);
        }
        memcpy(wide, raw, nmax * 4);
        for (int to = MESH_DT_F16; to <= MESH_DT_BF16; to++) {
            mesh_convert_isa(MESH_ISA_SCALAR, to, want, MESH_DT_F32, wide,
                             nmax);
            mesh_convert_isa(isa, to, got, MESH_DT_F32, wide, nmax);
            bad += memcmp(want, got, nmax * 2) != 0;
            mesh_convert_isa(MESH_ISA_SCALAR, MESH_DT_F32, want, to, got, nmax);
            mesh_convert_isa(isa, MESH_DT_F32, raw, to, got, nmax);
            bad += memcmp(want, raw, nmax * 4) != 0;
        }
    }
    ok(bad == 0, "%s conversions equal scalar bitwise (%zu blocks differ)",
       mesh_isa_name(isa), bad);
    for (int j = 0; j < 4; j++)
        free(src[j]);
    free(raw);
    free(wide);
    free(got);
    free(want);
}

/* Each tree spans every rank once, with one root, and parent and child
 * links agree; reported: how many ranks are inner nodes of both trees. */
static void test_dtree(void)
{
    int bad = 0, both = 0;

    for (int n = 1; n <= 64; n++) {
        int inner_both = 0;

        for (int t = 0; t < 2; t++) {
            int roots = 0;

            for (int r = 0; r < n; r++) {
                int p, c0, c1, pp, pc0, pc1, x = r, steps = 0;

                coll_dtree(n, r, t, &p, &c0, &c1);
                if (p < 0)
                    roots++;
                else {
                    coll_dtree(n, p, t, &pp, &pc0, &pc1);
                    bad += pc0 != r && pc1 != r;
                }
                for (int ch = 0; ch < 2; ch++) {
                    int cc = ch ? c1 : c0, cp, a, b;

                    if (cc < 0)
                        continue;
                    bad += cc >= n;
                    coll_dtree(n, cc, t, &cp, &a, &b);
                    bad += cp != r;
                }
                while (p >= 0 && steps++ <= n) {
                    x = p;
                    coll_dtree(n, x, t, &p, &c0, &c1);
                }
                bad += steps > n;
            }
            bad += roots != 1;
        }
        for (int r = 0; r < n; r++) {
            int inner = 0;

            for (int t = 0; t < 2; t++) {
                int p, c0, c1;

                coll_dtree(n, r, t, &p, &c0, &c1);
                inner += c0 >= 0 || c1 >= 0;
            }
            inner_both += inner == 2;
        }
        both = MESH_MAX(both, inner_both);
    }
    ok(bad == 0, "double binary trees span 1..64 ranks (%d faults)", bad);
    diag("at most %d ranks are inner nodes of both trees", both);
}

int main(void)
{
    plan(10);
    diag("kernels: %s", mesh_reduce_isa());
    test_known();
    test_roundtrip();
    for (int isa = MESH_ISA_AVX2; isa <= MESH_ISA_AVX512; isa++) {
        if (mesh_isa_available(isa)) {
            test_isa(isa);
        } else {
            skip("%s: not available on this CPU", mesh_isa_name(isa));
            skip("%s conversions: not available on this CPU",
                 mesh_isa_name(isa));
        }
    }
    test_dtree();
    return done();
}
