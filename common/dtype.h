/*
 * common/dtype.h: the one element-type enum of the tree, with names, sizes
 * and the scalar float16 / bfloat16 conversions.
 *
 * The values travel on the wire (struct mesh_frame's dtype) and name the
 * element type of every buffer the transport, the collectives, nn's device
 * conversions and safetensors handle. The vectorised conversions of whole
 * buffers are the collective's (mesh_convert, collective/reduce.c) and the
 * device backends' (mesh_nn_convert); they round as these do.
 */
#ifndef MESH_DTYPE_H
#define MESH_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum mesh_dtype {
    MESH_DT_BYTE = 0,
    MESH_DT_F32 = 1,
    MESH_DT_F16 = 2,
    MESH_DT_BF16 = 3,
};

/* "byte", "float32", "float16", "bfloat16"; "unknown-dtype" otherwise. */
const char *mesh_dtype_name(int dtype);
/* Bytes per element; 0 for a value outside enum mesh_dtype. */
size_t mesh_dtype_size(int dtype);

/*
 * float32 <-> IEEE float16 and bfloat16, rounding to nearest even. NaNs
 * stay NaNs (quieted, payload truncated, as F16C does); float16 overflows
 * to infinity and underflows through its subnormals to signed zero.
 */
uint16_t mesh_f16_from_f32(float f);
float mesh_f32_from_f16(uint16_t h);
uint16_t mesh_bf16_from_f32(float f);
float mesh_f32_from_bf16(uint16_t h);

/* p[i] = v, p an array of dtype F32, F16 or BF16 (v rounded as above).
 * Inline: the scalar reduction loops (collective/reduce.c) call them per
 * element. */
static inline void mesh_dtype_put_f32(int dtype, void *p, size_t i, float v)
{
    if (dtype == MESH_DT_F16)
        ((uint16_t *)p)[i] = mesh_f16_from_f32(v);
    else if (dtype == MESH_DT_BF16)
        ((uint16_t *)p)[i] = mesh_bf16_from_f32(v);
    else
        ((float *)p)[i] = v;
}

/* p[i] as float32, p an array of dtype F32, F16 or BF16. */
static inline float mesh_dtype_get_f32(int dtype, const void *p, size_t i)
{
    if (dtype == MESH_DT_F16)
        return mesh_f32_from_f16(((const uint16_t *)p)[i]);
    if (dtype == MESH_DT_BF16)
        return mesh_f32_from_bf16(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

#ifdef __cplusplus
}
#endif

#endif
