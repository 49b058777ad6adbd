/*
 * collective/reduce.c: the reduction kernels and 16-bit conversions.
 *
 * Three paths, picked at run time: AVX-512F, AVX2 with F16C, and scalar.
 * Every path adds in float32 in the same order (src[0] + src[1] + ...),
 * divides with an IEEE division (never a reciprocal multiply) and rounds
 * 16-bit results to nearest even, so all paths give bitwise the same
 * result. NaN payloads are not part of that promise.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/dtype.h"
#include "common/util.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define MESH_X86 1
#include <immintrin.h>
#endif

/* The scalar loop, also the tail of the vector paths (from element i). */
static void sum_scalar(int dtype, void *dst, const void *const *src, int nsrc,
                       size_t i, size_t n, float div)
{
    for (; i < n; i++) {
        float acc = mesh_dtype_get_f32(dtype, src[0], i);

        for (int j = 1; j < nsrc; j++)
            acc += mesh_dtype_get_f32(dtype, src[j], i);
        if (div != 1.0f)
            acc /= div;
        mesh_dtype_put_f32(dtype, dst, i, acc);
    }
}

static void convert_scalar(int dd, void *dst, int sd, const void *src, size_t i,
                           size_t n)
{
    for (; i < n; i++)
        mesh_dtype_put_f32(dd, dst, i, mesh_dtype_get_f32(sd, src, i));
}

/* ---- AVX2 + F16C --------------------------------------------------------- */

#ifdef MESH_X86
#define AVX2 __attribute__((target("avx2,f16c")))

AVX2 static inline __m256 ld8(int dtype, const void *p, size_t i)
{
    switch (dtype) {
    case MESH_DT_F16:
        return _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case MESH_DT_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                  (const __m128i *)((const uint16_t *)p + i))),
                              16));
    default:
        return _mm256_loadu_ps((const float *)p + i);
    }
}

AVX2 static inline void st8(int dtype, void *p, size_t i, __m256 v)
{
    switch (dtype) {
    case MESH_DT_F16:
        _mm_storeu_si128(
            (__m128i *)((uint16_t *)p + i),
            _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    case MESH_DT_BF16: {
        __m256i x = _mm256_castps_si256(v);
        __m256i lsb =
            _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_add_epi32(
            x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        __m256i q = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));

        r = _mm256_srli_epi32(_mm256_blendv_epi8(r, q, nan), 16);
        r = _mm256_packus_epi32(r, r);
        r = _mm256_permute4x64_epi64(r, 0x08);
        _mm_storeu_si128((__m128i *)((uint16_t *)p + i),
                         _mm256_castsi256_si128(r));
        break;
    }
    default:
        _mm256_storeu_ps((float *)p + i, v);
        break;
    }
}

AVX2 static void sum_avx2(int dtype, void *dst, const void *const *src,
                          int nsrc, size_t n, float div)
{
    __m256 vd = _mm256_set1_ps(div);
    size_t i = 0;

    if (dtype == MESH_DT_F32 && nsrc == 2 && div == 1.0f) {
        const float *a = src[0], *b = src[1];
        float *d = dst;

        for (; i + 16 <= n; i += 16) {
            __m256 x0 =
                _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
            __m256 x1 = _mm256_add_ps(_mm256_loadu_ps(a + i + 8),
                                      _mm256_loadu_ps(b + i + 8));
            _mm256_storeu_ps(d + i, x0);
            _mm256_storeu_ps(d + i + 8, x1);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 acc = ld8(dtype, src[0], i);

        for (int j = 1; j < nsrc; j++)
            acc = _mm256_add_ps(acc, ld8(dtype, src[j], i));
        if (div != 1.0f)
            acc = _mm256_div_ps(acc, vd);
        st8(dtype, dst, i, acc);
    }
    sum_scalar(dtype, dst, src, nsrc, i, n, div);
}

AVX2 static void convert_avx2(int dd, void *dst, int sd, const void *src,
                              size_t n)
{
    size_t i = 0;

    for (; i + 8 <= n; i += 8)
        st8(dd, dst, i, ld8(sd, src, i));
    convert_scalar(dd, dst, sd, src, i, n);
}

/* ---- AVX-512F ------------------------------------------------------------ */

#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 ld16(int dtype, const void *p, size_t i)
{
    switch (dtype) {
    case MESH_DT_F16:
        return _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    case MESH_DT_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                                  (const __m256i *)((const uint16_t *)p + i))),
                              16));
    default:
        return _mm512_loadu_ps((const float *)p + i);
    }
}

AVX512 static inline void st16(int dtype, void *p, size_t i, __m512 v)
{
    switch (dtype) {
    case MESH_DT_F16:
        _mm256_storeu_si256(
            (__m256i *)((uint16_t *)p + i),
            _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    case MESH_DT_BF16: {
        __m512i x = _mm512_castps_si512(v);
        __m512i lsb =
            _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_add_epi32(
            x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        __m512i q = _mm512_or_si512(x, _mm512_set1_epi32(0x400000));

        r = _mm512_srli_epi32(_mm512_mask_blend_epi32(nan, r, q), 16);
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i),
                            _mm512_cvtepi32_epi16(r));
        break;
    }
    default:
        _mm512_storeu_ps((float *)p + i, v);
        break;
    }
}

AVX512 static void sum_avx512(int dtype, void *dst, const void *const *src,
                              int nsrc, size_t n, float div)
{
    __m512 vd = _mm512_set1_ps(div);
    size_t i = 0;

    if (dtype == MESH_DT_F32 && nsrc == 2 && div == 1.0f) {
        const float *a = src[0], *b = src[1];
        float *d = dst;

        for (; i + 32 <= n; i += 32) {
            __m512 x0 =
                _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
            __m512 x1 = _mm512_add_ps(_mm512_loadu_ps(a + i + 16),
                                      _mm512_loadu_ps(b + i + 16));
            _mm512_storeu_ps(d + i, x0);
            _mm512_storeu_ps(d + i + 16, x1);
        }
    }
    for (; i + 16 <= n; i += 16) {
        __m512 acc = ld16(dtype, src[0], i);

        for (int j = 1; j < nsrc; j++)
            acc = _mm512_add_ps(acc, ld16(dtype, src[j], i));
        if (div != 1.0f)
            acc = _mm512_div_ps(acc, vd);
        st16(dtype, dst, i, acc);
    }
    sum_scalar(dtype, dst, src, nsrc, i, n, div);
}

AVX512 static void convert_avx512(int dd, void *dst, int sd, const void *src,
                                  size_t n)
{
    size_t i = 0;

    for (; i + 16 <= n; i += 16)
        st16(dd, dst, i, ld16(sd, src, i));
    convert_scalar(dd, dst, sd, src, i, n);
}
#endif /* MESH_X86 */

/* ---- dispatch ------------------------------------------------------------ */

/* enum mesh_isa's names, which MESHTRAIN_ISA takes too */
static const char *const isa_names[] = {
    [MESH_ISA_SCALAR] = "scalar",
    [MESH_ISA_AVX2] = "avx2",
    [MESH_ISA_AVX512] = "avx512f",
};

const char *mesh_isa_name(int isa)
{
    if (isa < 0 || isa >= (int)MESH_ARRAY_SIZE(isa_names))
        return isa_names[MESH_ISA_SCALAR];
    return isa_names[isa];
}

int mesh_isa_available(int isa)
{
    switch (isa) {
    case MESH_ISA_SCALAR:
        return 1;
#ifdef MESH_X86
    case MESH_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case MESH_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

static int isa_pick(void)
{
    const char *cap = getenv("MESHTRAIN_ISA");
    int max = MESH_ISA_AVX512;

    for (int isa = 0; cap && isa < (int)MESH_ARRAY_SIZE(isa_names); isa++)
        if (!strcmp(cap, isa_names[isa]))
            max = isa;
    for (int isa = max; isa > MESH_ISA_SCALAR; isa--)
        if (mesh_isa_available(isa))
            return isa;
    return MESH_ISA_SCALAR;
}

int mesh_isa_best(void)
{
    static atomic_int best = -1; /* racing first calls store the same */
    int b = atomic_load(&best);

    if (b < 0) {
        b = isa_pick();
        atomic_store(&best, b);
    }
    return b;
}

const char *mesh_reduce_isa(void)
{
    return mesh_isa_name(mesh_isa_best());
}

static int dtype_ok(int dtype)
{
    return dtype == MESH_DT_F32 || dtype == MESH_DT_F16 ||
           dtype == MESH_DT_BF16;
}

void mesh_reduce_sum_isa(int isa, int dtype, void *dst, const void *const *src,
                         int nsrc, size_t n, float div)
{
    if (!dtype_ok(dtype) || nsrc < 1)
        return;
    switch (isa) {
#ifdef MESH_X86
    case MESH_ISA_AVX512:
        sum_avx512(dtype, dst, src, nsrc, n, div);
        return;
    case MESH_ISA_AVX2:
        sum_avx2(dtype, dst, src, nsrc, n, div);
        return;
#endif
    default:
        sum_scalar(dtype, dst, src, nsrc, 0, n, div);
        return;
    }
}

void mesh_copy_stream(void *dst, const void *src, size_t len)
{
#ifdef MESH_X86
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;

    if (len < 256) {
        memcpy(dst, src, len);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    for (; len >= 64; d += 64, s += 64, len -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));

        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, len);
    /* streaming stores are weakly ordered: all of them before whatever
     * publishes the bytes (a host sync's release store) */
    _mm_sfence();
#else
    memcpy(dst, src, len);
#endif
}

void mesh_reduce_sum(int dtype, void *dst, const void *const *src, int nsrc,
                     size_t n, float div)
{
    mesh_reduce_sum_isa(mesh_isa_best(), dtype, dst, src, nsrc, n, div);
}

void mesh_convert_isa(int isa, int dst_dtype, void *dst, int src_dtype,
                      const void *src, size_t n)
{
    if (!dtype_ok(dst_dtype) || !dtype_ok(src_dtype))
        return;
    if (dst_dtype == src_dtype) {
        if (dst != src)
            memmove(dst, src, n * mesh_dtype_size(dst_dtype));
        return;
    }
    switch (isa) {
#ifdef MESH_X86
    case MESH_ISA_AVX512:
        convert_avx512(dst_dtype, dst, src_dtype, src, n);
        return;
    case MESH_ISA_AVX2:
        convert_avx2(dst_dtype, dst, src_dtype, src, n);
        return;
#endif
    default:
        convert_scalar(dst_dtype, dst, src_dtype, src, 0, n);
        return;
    }
}

void mesh_convert(int dst_dtype, void *dst, int src_dtype, const void *src,
                  size_t n)
{
    mesh_convert_isa(mesh_isa_best(), dst_dtype, dst, src_dtype, src, n);
}
