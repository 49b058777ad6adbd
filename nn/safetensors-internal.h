/*
 * nn/safetensors-internal.h: the layout of a parsed file and the helpers
 * that the reader and writer (nn/safetensors.c) share with the strict JSON
 * header parser.
 */
#ifndef MESH_NN_SAFETENSORS_INTERNAL_H
#define MESH_NN_SAFETENSORS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "nn/safetensors.h"

struct mesh_st_meta {
    const char *key, *value;
    size_t pos; /* header byte of the key */
};

struct mesh_st_file {
    const uint8_t *base; /* whole file */
    size_t len;
    int owned;           /* 0 borrowed, 1 mmap'ed, 2 malloc'ed */
    const uint8_t *data; /* the data buffer, after the header */
    uint64_t data_len;
    int n;                                 /* tensors */
    struct mesh_st_tensor *t;              /* (n) in header order */
    size_t *hpos;                          /* (n) header byte of each name */
    const struct mesh_st_tensor **by_name; /* (n) sorted by name */
    int nmeta;
    struct mesh_st_meta *meta; /* (nmeta) sorted by key */
    char *arena;               /* every decoded string */
};

/*
 * Parse and validate the JSON header h (n bytes) of a file whose data
 * buffer holds data_len bytes, filling f's tensors, name index, metadata
 * and arena (mesh_st_close frees them, also after an error). Errors are
 * -EINVAL (or -ENOMEM) with "header byte N: ..." messages.
 */
int mesh_st_parse_header(struct mesh_st_file *f, const uint8_t *h, size_t n,
                         uint64_t data_len);

/* The dtype spelt s in a file ("F32"), -1 if none. */
int mesh_st_dtype_from_name(const char *s);
/* For messages: a name from a file, control bytes escaped, cut at 96. */
const char *mesh_st_show(const char *s, char *buf, size_t len);
/* For messages: "[64,64,3,3]". */
const char *mesh_st_show_shape(const int64_t *shape, int ndim, char *buf,
                               size_t len);
/* Length of the valid UTF-8 sequence at s (avail bytes), 0 if invalid. */
size_t mesh_st_utf8_len(const uint8_t *s, size_t avail);

#endif
