/*
 * common/bytes.h: fixed-width integers in byte buffers, for everything that
 * leaves the process: wire messages (transport), checkpoint and loader state
 * (train, data), file headers (safetensors, IDX). Little-endian unless the
 * name says otherwise; no alignment is assumed.
 */
#ifndef MESH_BYTES_H
#define MESH_BYTES_H

#include <stdint.h>

static inline void mesh_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void mesh_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void mesh_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t mesh_get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t mesh_get_le32(const uint8_t *p)
{
    uint32_t v = 0;

    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static inline uint64_t mesh_get_le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Big-endian, as IDX files store their header. */
static inline uint32_t mesh_get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           p[3];
}

#endif
