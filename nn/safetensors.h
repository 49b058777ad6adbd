/*
 * nn/safetensors.h: a strict reader and an atomic writer for the safetensors
 * format that PyTorch and Hugging Face use for weights.
 *
 * File layout:
 *   u64 N (little-endian)      header length in bytes, 2 <= N <= 100000000
 *   N bytes of UTF-8 JSON      {"__metadata__": {"key": "value", ...},
 *                               "name": {"dtype": "F32", "shape": [2, 3],
 *                                        "data_offsets": [begin, end]}, ...}
 *                              optionally followed by spaces (padding)
 *   the data buffer            every tensor contiguous, row-major,
 *                              little-endian, at [begin, end) of the buffer
 *
 * The reader is as strict as the reference implementation and more: the
 * header must be one JSON object (no leading whitespace), every tensor entry
 * has exactly the keys dtype, shape and data_offsets, names are unique valid
 * UTF-8 without NUL, shape and offsets are non-negative integers, end - begin
 * equals the element count times the dtype size, and the tensors tile the
 * data buffer exactly: no overlap, no hole, no trailing byte. Every violation
 * is an error (-EINVAL, message via mesh_err) naming the tensor where there
 * is one and the byte offset in the header, counted from the first byte after
 * the length field:
 *   "w.st: header byte 16: tensor \"fc.weight\": unknown dtype \"F17\""
 * Nothing is read out of bounds, and the parser does not recurse on input.
 *
 * All functions return 0 or a negative errno-style code unless noted, with
 * the message recorded by mesh_err() (common/util.h). Requires a little-endian
 * host.
 */
#ifndef MESH_NN_SAFETENSORS_H
#define MESH_NN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

/*
 * The dtypes beyond enum mesh_dtype (MESH_DT_F32, MESH_DT_F16, MESH_DT_BF16)
 * that safetensors files carry; torchvision writes num_batches_tracked as
 * I64. File spelling in brackets.
 */
enum mesh_st_dtype {
    MESH_ST_I64 = 16, /* "I64" */
    MESH_ST_I32,      /* "I32" */
    MESH_ST_U8,       /* "U8" */
    MESH_ST_F64,      /* "F64" */
    MESH_ST_I16,      /* "I16" */
    MESH_ST_I8,       /* "I8" */
    MESH_ST_U16,      /* "U16" */
    MESH_ST_U32,      /* "U32" */
    MESH_ST_U64,      /* "U64" */
    MESH_ST_BOOL,     /* "BOOL", one byte per element */
    MESH_ST_F8_E4M3,  /* "F8_E4M3", read and written as raw bytes only */
    MESH_ST_F8_E5M2,  /* "F8_E5M2", likewise */
};

#define MESH_ST_MAX_DIMS   8
#define MESH_ST_MAX_HEADER 100000000u /* the reference implementation's */

/* "F32", "I64", ...; NULL for a value that is no safetensors dtype. */
const char *mesh_st_dtype_name(int dtype);
/* Bytes per element; 0 for a value that is no safetensors dtype. */
size_t mesh_st_dtype_size(int dtype);

struct mesh_st_file; /* opaque: a parsed, validated file */

/* One tensor of a parsed file; owned by the file, valid until close. */
struct mesh_st_tensor {
    const char *name;                /* NUL-terminated UTF-8 */
    int dtype;                       /* MESH_DT_* or MESH_ST_* */
    int ndim;                        /* 0 (a scalar) .. MESH_ST_MAX_DIMS */
    int64_t shape[MESH_ST_MAX_DIMS]; /* (ndim) entries, the rest 0 */
    uint64_t offset;                 /* from the start of the data buffer */
    uint64_t nbytes;                 /* elements * dtype size */
};

/*
 * Map (or, for a pipe, read) the file at path and validate all of it.
 * On success *out owns the mapping; free it with mesh_st_close().
 * Errors start with the path. As with any mmap reader, a file truncated in
 * place by another process while open faults (SIGBUS) on access; replacing
 * it with rename, as mesh_st_write does, is safe. A parsed file is never
 * modified, so threads may share it.
 */
int mesh_st_open(const char *path, struct mesh_st_file **out);

/*
 * The same from memory. The file borrows buf: it must stay valid and
 * unchanged until mesh_st_close(). Errors start with "safetensors".
 */
int mesh_st_parse(const void *buf, size_t len, struct mesh_st_file **out);

/* Number of tensors (0 or more). */
int mesh_st_count(const struct mesh_st_file *f);

/* Tensor i, 0 <= i < count, in header order; NULL when i is out of range. */
const struct mesh_st_tensor *mesh_st_get(const struct mesh_st_file *f, int i);

/* The tensor called name, or NULL (O(log n)). */
const struct mesh_st_tensor *mesh_st_find(const struct mesh_st_file *f,
                                          const char *name);

/* Raw little-endian bytes of t (t->nbytes of them, any alignment). */
const void *mesh_st_data(const struct mesh_st_file *f,
                         const struct mesh_st_tensor *t);

/* The "__metadata__" value for key, or NULL if absent. */
const char *mesh_st_metadata(const struct mesh_st_file *f, const char *key);

/*
 * Copy tensor name into dst (aligned for dtype) as dtype with exactly the
 * given shape (ndim entries; shape may be NULL when ndim is 0).
 * Conversions besides same-dtype copies:
 *   F32 <- F16, BF16, F64;  F16, BF16 <- F32;  F64 <- F32, F16, BF16;
 *   I64 <- I32, I16, I8, U32, U16, U8, BOOL.
 * F32 -> F16/BF16 rounds to nearest even (as PyTorch's .half(), .bfloat16()).
 * Errors name the tensor and what differs:
 *   "layer1.0.conv1.weight: shape [64,64,1,1] in file, [64,64,3,3] expected"
 *   "fc.bias: dtype I64 in file, F32 expected"
 *   "fc.bias: not in the file"
 */
int mesh_st_read(const struct mesh_st_file *f, const char *name, int dtype,
                 const int64_t *shape, int ndim, void *dst);

/* Unmap and free; NULL is fine. */
void mesh_st_close(struct mesh_st_file *f);

/* One tensor to write. data holds elements * dtype size bytes, row-major. */
struct mesh_st_entry {
    const char *name; /* valid UTF-8, unique, not "__metadata__" */
    int dtype;        /* MESH_DT_F32/F16/BF16 or MESH_ST_* */
    int ndim;         /* 0 .. MESH_ST_MAX_DIMS */
    int64_t shape[MESH_ST_MAX_DIMS];
    const void *data; /* may be NULL when there are no elements */
};

/*
 * Write n entries, in this order in header and buffer, to path atomically:
 * a temporary file in the same directory is written, fsync'ed and renamed
 * over path, then the directory is fsync'ed; on error path is untouched.
 * metadata_kv is NULL or "key", "value", ..., NULL (unique keys). The header
 * is padded with spaces so that the data buffer starts 8-byte aligned. The
 * new file has mode 0644.
 */
int mesh_st_write(const char *path, const struct mesh_st_entry *e, int n,
                  const char *const *metadata_kv);

#endif
