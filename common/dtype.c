/*
 * common/dtype.c: names, sizes and scalar float16 / bfloat16 conversions of
 * enum mesh_dtype (see common/dtype.h).
 */
#include "config.h"

#include "common/dtype.h"

#include <string.h>

const char *mesh_dtype_name(int dtype)
{
    switch (dtype) {
    case MESH_DT_BYTE:
        return "byte";
    case MESH_DT_F32:
        return "float32";
    case MESH_DT_F16:
        return "float16";
    case MESH_DT_BF16:
        return "bfloat16";
    }
    return "unknown-dtype";
}

size_t mesh_dtype_size(int dtype)
{
    switch (dtype) {
    case MESH_DT_BYTE:
        return 1;
    case MESH_DT_F32:
        return 4;
    case MESH_DT_F16:
    case MESH_DT_BF16:
        return 2;
    }
    return 0;
}

static uint32_t f32_bits(float f)
{
    uint32_t x;

    memcpy(&x, &f, sizeof(x));
    return x;
}

static float f32_from_bits(uint32_t x)
{
    float f;

    memcpy(&f, &x, sizeof(f));
    return f;
}

uint16_t mesh_f16_from_f32(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    uint32_t e, m, shift, h, rem, half;

    if (ax > 0x7f800000) /* NaN: quieted, payload truncated (as F16C) */
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000) /* 65520 and up round to infinity */
        return (uint16_t)(sign | 0x7c00);
    if (ax >= 0x38800000) { /* a normal half: rebias, round to even */
        uint32_t r = ax - 0x38000000;

        r += 0xfff + ((r >> 13) & 1);
        return (uint16_t)(sign | (r >> 13));
    }
    if (ax <= 0x33000000) /* at most 2^-25: rounds to zero */
        return sign;
    /* a subnormal half: units of 2^-24 */
    e = ax >> 23;
    m = (ax & 0x7fffff) | 0x800000;
    shift = 126 - e;
    h = m >> shift;
    rem = m & ((1u << shift) - 1);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float mesh_f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f;
    uint32_t m = h & 0x3ff;
    uint32_t x;

    if (e == 0x1f) {
        x = sign | 0x7f800000 | (m << 13) | (m ? 0x400000u : 0);
    } else if (e) {
        x = sign | ((e + 112) << 23) | (m << 13);
    } else if (!m) {
        x = sign;
    } else {
        e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        x = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    return f32_from_bits(x);
}

uint16_t mesh_bf16_from_f32(float f)
{
    uint32_t x = f32_bits(f);

    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x | 0x400000) >> 16);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

float mesh_f32_from_bf16(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}
