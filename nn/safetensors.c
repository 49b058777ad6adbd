/*
 * nn/safetensors.c: strict safetensors reader, atomic writer (see the header
 * for the format and the rules). The JSON header parser is in
 * nn/safetensors_json.c.
 */
#include "config.h"

#include "nn/safetensors.h"
#include "nn/safetensors-internal.h"

#include "common/array.h"
#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nn/safetensors.c assumes a little-endian host"
#endif

/* ---- dtypes -------------------------------------------------------------- */

static const struct {
    const char *name;
    int dtype;
    size_t size;
} dtypes[] = {
    {"F32", MESH_DT_F32, 4},         {"F16", MESH_DT_F16, 2},
    {"BF16", MESH_DT_BF16, 2},       {"I64", MESH_ST_I64, 8},
    {"I32", MESH_ST_I32, 4},         {"U8", MESH_ST_U8, 1},
    {"F64", MESH_ST_F64, 8},         {"I16", MESH_ST_I16, 2},
    {"I8", MESH_ST_I8, 1},           {"U16", MESH_ST_U16, 2},
    {"U32", MESH_ST_U32, 4},         {"U64", MESH_ST_U64, 8},
    {"BOOL", MESH_ST_BOOL, 1},       {"F8_E4M3", MESH_ST_F8_E4M3, 1},
    {"F8_E5M2", MESH_ST_F8_E5M2, 1},
};

const char *mesh_st_dtype_name(int dtype)
{
    for (size_t i = 0; i < MESH_ARRAY_SIZE(dtypes); i++)
        if (dtypes[i].dtype == dtype)
            return dtypes[i].name;
    return NULL;
}

size_t mesh_st_dtype_size(int dtype)
{
    for (size_t i = 0; i < MESH_ARRAY_SIZE(dtypes); i++)
        if (dtypes[i].dtype == dtype)
            return dtypes[i].size;
    return 0;
}

int mesh_st_dtype_from_name(const char *s)
{
    for (size_t i = 0; i < MESH_ARRAY_SIZE(dtypes); i++)
        if (strcmp(dtypes[i].name, s) == 0)
            return dtypes[i].dtype;
    return -1;
}

/* For messages: a name from a file, control bytes escaped, cut at 96. */
const char *mesh_st_show(const char *s, char *buf, size_t len)
{
    size_t o = 0;

    for (; *s && o + 8 < len; s++) {
        unsigned char c = (unsigned char)*s;
        if (o >= 96) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    buf[o] = '\0';
    return buf;
}

/* "[64,64,3,3]" */
const char *mesh_st_show_shape(const int64_t *shape, int ndim, char *buf,
                               size_t len)
{
    size_t o = 0;

    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? "," : "",
                              shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
    return buf;
}

void mesh_st_close(struct mesh_st_file *f)
{
    if (!f)
        return;
    if (f->owned == 1 && f->len)
        munmap((void *)f->base, f->len);
    else if (f->owned == 2)
        free((void *)f->base);
    free(f->t);
    free(f->hpos);
    free(f->by_name);
    free(f->meta);
    free(f->arena);
    free(f);
}

/* Validate base[0, len); on success the file takes ownership per owned. */
static int parse_buf(const uint8_t *base, size_t len, int owned,
                     struct mesh_st_file **out)
{
    struct mesh_st_file *f;
    uint64_t hlen = 0;
    int rc;

    if (len < 8)
        return mesh_err(-EINVAL,
                        "file is %zu bytes, too short for the 8-byte header "
                        "length",
                        len);
    hlen = mesh_get_le64(base);
    if (hlen > MESH_ST_MAX_HEADER)
        return mesh_err(-EINVAL,
                        "header length %" PRIu64 " exceeds the limit of %u "
                        "bytes",
                        hlen, MESH_ST_MAX_HEADER);
    if (hlen > len - 8)
        return mesh_err(-EINVAL,
                        "header length %" PRIu64 " runs past the end of the "
                        "file (%zu bytes after the length field)",
                        hlen, len - 8);
    if (hlen < 2)
        return mesh_err(-EINVAL,
                        "header length %" PRIu64 " is too short for a JSON "
                        "object",
                        hlen);
    f = calloc(1, sizeof(*f));
    if (!f)
        return mesh_err(-ENOMEM, "out of memory");
    rc = mesh_st_parse_header(f, base + 8, (size_t)hlen, len - 8 - hlen);
    if (rc < 0) {
        mesh_st_close(f); /* owned is still 0: the buffer stays */
        return rc;
    }
    f->base = base;
    f->len = len;
    f->owned = owned;
    f->data = base + 8 + hlen;
    f->data_len = len - 8 - hlen;
    *out = f;
    return 0;
}

int mesh_st_parse(const void *buf, size_t len, struct mesh_st_file **out)
{
    int rc;

    if (!buf && len)
        return mesh_err(-EINVAL, "safetensors: NULL buffer");
    rc = parse_buf(buf, len, 0, out);
    if (rc < 0)
        mesh_err_prefix(rc, "safetensors");
    return rc;
}

/* A pipe or other non-seekable file: read it all. */
static int slurp(int fd, const char *path, uint8_t **out, size_t *outlen)
{
    size_t cap = 0, len = 0;
    uint8_t *buf = NULL;
    int rc;

    for (;;) {
        ssize_t r;

        /* at least 64 KiB free per read; the capacity doubles */
        if ((rc = mesh_array_reserve(&buf, &cap, len + ((size_t)1 << 16), 1,
                                     "bytes")) < 0) {
            mesh_err_prefix(rc, "reading %s", path);
            goto fail;
        }
        MESH_SYSCALL(rc, r = read(fd, buf + len, cap - len), fail, "read %s",
                     path);
        if (r == 0)
            break;
        len += (size_t)r;
    }
    *out = buf;
    *outlen = len;
    return 0;
fail:
    free(buf);
    return rc;
}

int mesh_st_open(const char *path, struct mesh_st_file **out)
{
    struct stat st;
    uint8_t *base = NULL;
    size_t len = 0;
    int owned;
    int fd, rc;

    MESH_SYSCALL(rc, fd = open(path, O_RDONLY | O_CLOEXEC), out, "open %s",
                 path);
    MESH_SYSCALL(rc, fstat(fd, &st), close_fd, "stat %s", path);
    if (S_ISDIR(st.st_mode)) {
        rc = mesh_err(-EISDIR, "%s: is a directory", path);
        goto close_fd;
    }
    if (S_ISREG(st.st_mode)) {
        if ((uint64_t)st.st_size > SIZE_MAX) {
            rc = mesh_err(-EFBIG, "%s: too large to map", path);
            goto close_fd;
        }
        len = (size_t)st.st_size;
        owned = 1;
        if (len) {
            void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
            if (m == MAP_FAILED) {
                rc = mesh_err_errno("mmap %s", path);
                goto close_fd;
            }
            base = m;
        }
    } else {
        owned = 2;
        if ((rc = slurp(fd, path, &base, &len)) < 0)
            goto close_fd;
    }
    rc = parse_buf(base, len, owned, out);
    if (rc < 0) {
        mesh_err_prefix(rc, "%s", path);
        if (owned == 1 && len)
            munmap(base, len);
        else if (owned == 2)
            free(base);
    }
close_fd:
    close(fd);
out:
    return rc;
}

int mesh_st_count(const struct mesh_st_file *f)
{
    return f->n;
}

const struct mesh_st_tensor *mesh_st_get(const struct mesh_st_file *f, int i)
{
    if (i < 0 || i >= f->n)
        return NULL;
    return &f->t[i];
}

const struct mesh_st_tensor *mesh_st_find(const struct mesh_st_file *f,
                                          const char *name)
{
    int lo = 0, hi = f->n - 1;

    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->by_name[mid]->name);
        if (c == 0)
            return f->by_name[mid];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const void *mesh_st_data(const struct mesh_st_file *f,
                         const struct mesh_st_tensor *t)
{
    return f->data + t->offset;
}

const char *mesh_st_metadata(const struct mesh_st_file *f, const char *key)
{
    int lo = 0, hi = f->nmeta - 1;

    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(key, f->meta[mid].key);
        if (c == 0)
            return f->meta[mid].value;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---- conversions --------------------------------------------------------- */

/*
 * common/dtype.h's conversions, but for NaNs, which keep PyTorch's bits:
 * float16 NaNs widen with their payload, signalling ones included, and
 * float32 NaNs narrow to the canonical 0x7e00 (with its sign) and 0x7fc0.
 */
static float f16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)(h & 0x8000u) << 16 | 0x7f800000u |
                    (uint32_t)(h & 0x3ffu) << 13;
    float f;

    if ((h & 0x7c00u) != 0x7c00u || !(h & 0x3ffu))
        return mesh_f32_from_f16(h);
    memcpy(&f, &bits, 4);
    return f;
}

static int is_nan32(float f)
{
    uint32_t x;

    memcpy(&x, &f, 4);
    return (x & 0x7fffffffu) > 0x7f800000u;
}

static uint16_t f32_to_f16(float f)
{
    if (is_nan32(f))
        return signbit(f) ? 0xfe00u : 0x7e00u;
    return mesh_f16_from_f32(f);
}

static uint16_t f32_to_bf16(float f)
{
    return is_nan32(f) ? 0x7fc0u : mesh_bf16_from_f32(f);
}

/*
 * Element i of src (F16, BF16, F32 or F64) as float, and as double. Kept
 * apart so that F16/BF16 -> F32 never passes through double, which would
 * quiet signalling NaNs and change their bits.
 */
static float load_f32(const uint8_t *src, int dtype, uint64_t i)
{
    uint16_t h;
    float f;
    double d;

    switch (dtype) {
    case MESH_DT_F16:
        memcpy(&h, src + 2 * i, 2);
        return f16_to_f32(h);
    case MESH_DT_BF16:
        memcpy(&h, src + 2 * i, 2);
        return mesh_f32_from_bf16(h);
    case MESH_DT_F32:
        memcpy(&f, src + 4 * i, 4);
        return f;
    default:
        memcpy(&d, src + 8 * i, 8);
        return (float)d;
    }
}

static double load_f64(const uint8_t *src, int dtype, uint64_t i)
{
    double d;

    if (dtype != MESH_ST_F64)
        return load_f32(src, dtype, i);
    memcpy(&d, src + 8 * i, 8);
    return d;
}

static int64_t load_int(const uint8_t *src, int dtype, uint64_t i)
{
    switch (dtype) {
    case MESH_ST_I32:
        return (int32_t)mesh_get_le32(src + 4 * i);
    case MESH_ST_I16:
        return (int16_t)mesh_get_le16(src + 2 * i);
    case MESH_ST_I8:
        return (int8_t)src[i];
    case MESH_ST_U32:
        return mesh_get_le32(src + 4 * i);
    case MESH_ST_U16:
        return mesh_get_le16(src + 2 * i);
    default: /* U8, BOOL */
        return src[i];
    }
}

static int is_float(int d)
{
    return d == MESH_DT_F32 || d == MESH_DT_F16 || d == MESH_DT_BF16 ||
           d == MESH_ST_F64;
}

static int is_small_int(int d)
{
    return d == MESH_ST_I32 || d == MESH_ST_I16 || d == MESH_ST_I8 ||
           d == MESH_ST_U32 || d == MESH_ST_U16 || d == MESH_ST_U8 ||
           d == MESH_ST_BOOL;
}

/* Which conversions mesh_st_read does (see the header). */
static int convertible(int from, int to)
{
    if (from == to)
        return 1;
    if (to == MESH_DT_F32 || to == MESH_ST_F64)
        return is_float(from);
    if (to == MESH_DT_F16 || to == MESH_DT_BF16)
        return from == MESH_DT_F32;
    if (to == MESH_ST_I64)
        return is_small_int(from);
    return 0;
}

int mesh_st_read(const struct mesh_st_file *f, const char *name, int dtype,
                 const int64_t *shape, int ndim, void *dst)
{
    const struct mesh_st_tensor *t = mesh_st_find(f, name);
    const uint8_t *src;
    uint64_t n;
    char a[160], b[160];
    int same;

    if (!t)
        return mesh_err(-ENOENT, "%s: not in the file", name);
    if (!mesh_st_dtype_name(dtype))
        return mesh_err(-EINVAL,
                        "%s: dtype %d requested is not a safetensors "
                        "dtype",
                        name, dtype);
    if (!convertible(t->dtype, dtype))
        return mesh_err(-EINVAL, "%s: dtype %s in file, %s expected", name,
                        mesh_st_dtype_name(t->dtype),
                        mesh_st_dtype_name(dtype));
    if (ndim < 0 || ndim > MESH_ST_MAX_DIMS || (ndim && !shape))
        return mesh_err(-EINVAL,
                        "%s: %d dimensions expected (0..%d, with a "
                        "shape)",
                        name, ndim, MESH_ST_MAX_DIMS);
    same = ndim == t->ndim;
    for (int i = 0; same && i < ndim; i++)
        same = shape[i] == t->shape[i];
    if (!same)
        return mesh_err(-EINVAL, "%s: shape %s in file, %s expected", name,
                        mesh_st_show_shape(t->shape, t->ndim, a, sizeof(a)),
                        mesh_st_show_shape(shape, ndim, b, sizeof(b)));
    src = f->data + t->offset;
    n = t->nbytes / mesh_st_dtype_size(t->dtype);
    if (t->dtype == dtype) {
        if (t->nbytes)
            memcpy(dst, src, t->nbytes);
        return 0;
    }
    switch (dtype) {
    case MESH_DT_F32: {
        float *o = dst;
        for (uint64_t i = 0; i < n; i++)
            o[i] = load_f32(src, t->dtype, i);
        break;
    }
    case MESH_ST_F64: {
        double *o = dst;
        for (uint64_t i = 0; i < n; i++)
            o[i] = load_f64(src, t->dtype, i);
        break;
    }
    case MESH_DT_F16: {
        uint16_t *o = dst;
        for (uint64_t i = 0; i < n; i++)
            o[i] = f32_to_f16(load_f32(src, t->dtype, i));
        break;
    }
    case MESH_DT_BF16: {
        uint16_t *o = dst;
        for (uint64_t i = 0; i < n; i++)
            o[i] = f32_to_bf16(load_f32(src, t->dtype, i));
        break;
    }
    default: { /* I64 */
        int64_t *o = dst;
        for (uint64_t i = 0; i < n; i++)
            o[i] = load_int(src, t->dtype, i);
        break;
    }
    }
    return 0;
}

/* ---- writing ------------------------------------------------------------- */

struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void sb_add(struct sbuf *s, const char *d, size_t n)
{
    if (s->oom)
        return;
    if (mesh_array_reserve(&s->p, &s->cap, s->len + n + 1, 1, "bytes") < 0) {
        s->oom = 1;
        return;
    }
    memcpy(s->p + s->len, d, n);
    s->len += n;
    s->p[s->len] = '\0';
}

MESH_PRINTF(2, 3)
static void sb_printf(struct sbuf *s, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    int k;

    va_start(ap, fmt);
    k = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (k > 0)
        sb_add(s, tmp, MESH_MIN((size_t)k, sizeof(tmp) - 1));
}

/* A JSON string; s must be valid UTF-8 (checked by the caller). */
static void sb_string(struct sbuf *s, const char *str)
{
    sb_add(s, "\"", 1);
    for (; *str; str++) {
        unsigned char c = (unsigned char)*str;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_add(s, e, 2);
        } else if (c < 0x20) {
            sb_printf(s, "\\u%04x", c);
        } else {
            sb_add(s, (const char *)&c, 1);
        }
    }
    sb_add(s, "\"", 1);
}

static int valid_utf8(const char *s)
{
    size_t n = strlen(s);

    for (size_t i = 0; i < n;) {
        size_t k = mesh_st_utf8_len((const uint8_t *)s + i, n - i);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Duplicates in strs (n of them, every stride-th); the first or NULL. */
static const char *find_dup(const char *const *strs, int n, int stride, int *rc)
{
    const char **s;
    const char *dup = NULL;

    *rc = 0;
    if (n < 2)
        return NULL;
    s = malloc((size_t)n * sizeof(*s));
    if (!s) {
        *rc = mesh_err(-ENOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        s[i] = strs[(size_t)i * stride];
    qsort(s, (size_t)n, sizeof(*s), cmp_str);
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0)
            dup = s[i];
    free(s);
    return dup;
}

static int write_all(int fd, const void *buf, size_t len, const char *path)
{
    const uint8_t *p = buf;
    int rc = 0;

    while (len) {
        ssize_t w;
        MESH_SYSCALL(rc, w = write(fd, p, MESH_MIN(len, (size_t)1 << 30)), out,
                     "write %s", path);
        p += w;
        len -= (size_t)w;
    }
out:
    return rc;
}

/* Build the header; nbytes[i] receives entry i's size. */
static int build_header(const struct mesh_st_entry *e, int n,
                        const char *const *kv, uint64_t *nbytes, struct sbuf *h)
{
    const char **names;
    const char *dup;
    uint64_t off = 0;
    int nkv = 0, rc;
    char b[128], sh[192];

    for (; kv && kv[2 * nkv]; nkv++) {
        if (!kv[2 * nkv + 1])
            return mesh_err(-EINVAL, "metadata key \"%s\" has no value",
                            mesh_st_show(kv[2 * nkv], b, sizeof(b)));
        if (!valid_utf8(kv[2 * nkv]) || !valid_utf8(kv[2 * nkv + 1]))
            return mesh_err(-EINVAL, "metadata \"%s\": invalid UTF-8",
                            mesh_st_show(kv[2 * nkv], b, sizeof(b)));
    }
    dup = find_dup(kv, nkv, 2, &rc);
    if (rc < 0)
        return rc;
    if (dup)
        return mesh_err(-EINVAL, "duplicate metadata key \"%s\"",
                        mesh_st_show(dup, b, sizeof(b)));
    for (int i = 0; i < n; i++) {
        uint64_t elems = 1;
        size_t size = mesh_st_dtype_size(e[i].dtype);

        if (!e[i].name || !valid_utf8(e[i].name) ||
            strcmp(e[i].name, "__metadata__") == 0)
            return mesh_err(-EINVAL, "entry %d: name %s", i,
                            !e[i].name ? "is NULL"
                            : strcmp(e[i].name, "__metadata__") == 0
                                ? "\"__metadata__\" is reserved"
                                : "is not valid UTF-8");
        if (!size)
            return mesh_err(-EINVAL, "%s: dtype %d is not a safetensors dtype",
                            mesh_st_show(e[i].name, b, sizeof(b)), e[i].dtype);
        if (e[i].ndim < 0 || e[i].ndim > MESH_ST_MAX_DIMS)
            return mesh_err(-EINVAL, "%s: %d dimensions (0..%d allowed)",
                            mesh_st_show(e[i].name, b, sizeof(b)), e[i].ndim,
                            MESH_ST_MAX_DIMS);
        for (int d = 0; d < e[i].ndim; d++) {
            uint64_t v = (uint64_t)e[i].shape[d];
            if (e[i].shape[d] < 0 || (v && elems > UINT64_MAX / v))
                return mesh_err(
                    -EINVAL, "%s: bad shape %s",
                    mesh_st_show(e[i].name, b, sizeof(b)),
                    mesh_st_show_shape(e[i].shape, e[i].ndim, sh, sizeof(sh)));
            elems *= v;
        }
        if (elems > UINT64_MAX / size || off > UINT64_MAX - elems * size)
            return mesh_err(-EINVAL, "%s: too large",
                            mesh_st_show(e[i].name, b, sizeof(b)));
        nbytes[i] = elems * size;
        if (nbytes[i] && !e[i].data)
            return mesh_err(-EINVAL, "%s: NULL data",
                            mesh_st_show(e[i].name, b, sizeof(b)));
        off += nbytes[i];
    }
    names = malloc(((size_t)n + 1) * sizeof(*names));
    if (!names)
        return mesh_err(-ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        names[i] = e[i].name;
    dup = find_dup(names, n, 1, &rc);
    free(names);
    if (rc < 0)
        return rc;
    if (dup)
        return mesh_err(-EINVAL, "duplicate tensor name \"%s\"",
                        mesh_st_show(dup, b, sizeof(b)));

    sb_add(h, "{", 1);
    if (nkv) {
        sb_string(h, "__metadata__");
        sb_add(h, ":{", 2);
        for (int i = 0; i < nkv; i++) {
            if (i)
                sb_add(h, ",", 1);
            sb_string(h, kv[2 * i]);
            sb_add(h, ":", 1);
            sb_string(h, kv[2 * i + 1]);
        }
        sb_add(h, "}", 1);
    }
    off = 0;
    for (int i = 0; i < n; i++) {
        if (i || nkv)
            sb_add(h, ",", 1);
        sb_string(h, e[i].name);
        sb_printf(h, ":{\"dtype\":\"%s\",\"shape\":[",
                  mesh_st_dtype_name(e[i].dtype));
        for (int d = 0; d < e[i].ndim; d++)
            sb_printf(h, "%s%" PRId64, d ? "," : "", e[i].shape[d]);
        sb_printf(h, "],\"data_offsets\":[%" PRIu64 ",", off);
        off += nbytes[i];
        sb_printf(h, "%" PRIu64 "]}", off);
    }
    sb_add(h, "}", 1);
    while (!h->oom && (8 + h->len) % 8)
        sb_add(h, " ", 1);
    if (h->oom)
        return mesh_err(-ENOMEM, "out of memory for the header");
    if (h->len > MESH_ST_MAX_HEADER)
        return mesh_err(-EINVAL, "header of %zu bytes exceeds the limit of %u",
                        h->len, MESH_ST_MAX_HEADER);
    return 0;
}

int mesh_st_write(const char *path, const struct mesh_st_entry *e, int n,
                  const char *const *metadata_kv)
{
    struct sbuf h = {0};
    uint64_t *nbytes = NULL;
    uint8_t len8[8];
    char *tmp = NULL, *dir = NULL, *slash;
    int fd = -1, dfd = -1, rc;

    if (n < 0 || (n && !e))
        return mesh_err(-EINVAL, "%s: bad tensor list", path);
    nbytes = calloc((size_t)n + 1, sizeof(*nbytes));
    if (!nbytes)
        return mesh_err(-ENOMEM, "out of memory");
    if ((rc = build_header(e, n, metadata_kv, nbytes, &h)) < 0) {
        mesh_err_prefix(rc, "%s", path);
        goto free_bufs;
    }
    tmp = malloc(strlen(path) + 16);
    dir = strdup(path);
    if (!tmp || !dir) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto free_bufs;
    }
    sprintf(tmp, "%s.tmp-XXXXXX", path);
    slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';

    MESH_SYSCALL(rc, fd = mkstemp(tmp), free_bufs, "create %s", tmp);
    MESH_SYSCALL(rc, fchmod(fd, 0644), unlink_tmp, "chmod %s", tmp);
    mesh_put_le64(len8, (uint64_t)h.len);
    if ((rc = write_all(fd, len8, 8, tmp)) < 0 ||
        (rc = write_all(fd, h.p, h.len, tmp)) < 0)
        goto unlink_tmp;
    for (int i = 0; i < n; i++)
        if (nbytes[i] && (rc = write_all(fd, e[i].data, nbytes[i], tmp)) < 0)
            goto unlink_tmp;
    MESH_SYSCALL(rc, fsync(fd), unlink_tmp, "fsync %s", tmp);
    rc = close(fd);
    fd = -1;
    if (rc < 0) {
        rc = mesh_err_errno("close %s", tmp);
        goto unlink_tmp;
    }
    MESH_SYSCALL(rc, rename(tmp, path), unlink_tmp, "rename %s to %s", tmp,
                 path);
    /* The rename is durable once the directory is. */
    MESH_SYSCALL(rc, dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC),
                 free_bufs, "open directory %s", dir);
    MESH_SYSCALL(rc, fsync(dfd), close_dir, "fsync directory %s", dir);
    rc = 0;
close_dir:
    close(dfd);
    goto free_bufs;
unlink_tmp:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
free_bufs:
    free(dir);
    free(tmp);
    free(nbytes);
    free(h.p);
    return rc;
}
