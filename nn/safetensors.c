/*
 * nn/safetensors.c: strict safetensors reader, atomic writer (see the header
 * for the format and the rules).
 *
 * The header parser is a schema-driven recursive descent over exactly the
 * JSON this format uses: the top-level object holds tensor entries (objects
 * of a string and two arrays of non-negative integers) and "__metadata__" (an
 * object of strings). Nesting deeper than that is rejected where it starts,
 * so the recursion depth is fixed at three. Decoded strings go into one
 * arena: a decoded string plus its NUL is never longer than its quoted JSON
 * form, so an arena of the header's size always suffices.
 */
#include "config.h"

#include "nn/safetensors.h"
#include "nn/safetensors-internal.h"

#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
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

/* ---- the header parser ------------------------------------------------- */

struct parser {
    const uint8_t *h; /* header text */
    size_t n;         /* its length */
    size_t pos;
    uint64_t data_len;
    char *arena;
    size_t arena_used, arena_cap;
    struct mesh_st_file *f;
    int cap; /* tensors allocated in f */
    int meta_cap;
    int seen_meta;
    const char *cur; /* the tensor being parsed, for messages */
    uint64_t *ends;  /* (f->n) data_offsets[1] of each tensor, until checked */
};

/*
 * Every header error says where: "header byte 123: tensor \"x\": what".
 * The tensor is the one being parsed (p->cur), or the one passed.
 */
static int verr(size_t at, const char *name, const char *fmt, va_list ap)
{
    char msg[768], b[128];

    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (name)
        return mesh_err(-EINVAL, "header byte %zu: tensor \"%s\": %s", at,
                        mesh_st_show(name, b, sizeof(b)), msg);
    return mesh_err(-EINVAL, "header byte %zu: %s", at, msg);
}

MESH_PRINTF(3, 4)
static int perr(const struct parser *p, size_t at, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = verr(at, p->cur, fmt, ap);
    va_end(ap);
    return rc;
}

MESH_PRINTF(3, 4)
static int terr(size_t at, const char *name, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = verr(at, name, fmt, ap);
    va_end(ap);
    return rc;
}

#define PERR(p, at, ...) perr((p), (at), __VA_ARGS__)

static const char *what_is(const struct parser *p)
{
    if (p->pos >= p->n)
        return "end of header";
    switch (p->h[p->pos]) {
    case '{':
        return "'{'";
    case '}':
        return "'}'";
    case '[':
        return "'['";
    case ']':
        return "']'";
    case '"':
        return "a string";
    case ',':
        return "','";
    case ':':
        return "':'";
    case '-':
        return "a negative number";
    case ' ':
    case '\t':
    case '\n':
    case '\r':
        return "whitespace";
    case 't':
    case 'f':
        return "a boolean or garbage";
    case 'n':
        return "null or garbage";
    }
    if (p->h[p->pos] >= '0' && p->h[p->pos] <= '9')
        return "a number";
    return "an unexpected character";
}

static void skip_ws(struct parser *p)
{
    while (p->pos < p->n && (p->h[p->pos] == ' ' || p->h[p->pos] == '\t' ||
                             p->h[p->pos] == '\n' || p->h[p->pos] == '\r'))
        p->pos++;
}

static int expect(struct parser *p, char c, const char *ctx)
{
    skip_ws(p);
    if (p->pos >= p->n || p->h[p->pos] != (uint8_t)c)
        return PERR(p, p->pos, "invalid JSON: expected '%c' %s, found %s", c,
                    ctx, what_is(p));
    p->pos++;
    return 0;
}

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Four hex digits at p->pos + 2 (after "\u"); -1 if not. */
static long hex4(const struct parser *p, size_t at)
{
    long v = 0;

    if (at + 6 > p->n)
        return -1;
    for (size_t i = at + 2; i < at + 6; i++) {
        int d = hexval(p->h[i]);
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Length of the valid UTF-8 sequence at s (avail bytes), 0 if invalid. */
size_t mesh_st_utf8_len(const uint8_t *s, size_t avail)
{
    uint8_t c = s[0];
    size_t need;
    uint32_t cp;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (avail < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((need == 3 && cp < 0x800) || (need == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0; /* overlong, out of range or a surrogate */
    return need;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/*
 * A JSON string at p->pos (after whitespace), decoded into the arena;
 * *out points at it (NUL-terminated). NUL characters are rejected because
 * names are C strings.
 */
static int parse_string(struct parser *p, const char *ctx, const char **out)
{
    size_t start;
    char *o;

    skip_ws(p);
    if (p->pos >= p->n || p->h[p->pos] != '"')
        return PERR(p, p->pos, "invalid JSON: expected a string %s, found %s",
                    ctx, what_is(p));
    start = p->pos++;
    /* Enough room by construction (see the file comment); checked anyway. */
    if (p->arena_cap - p->arena_used < p->n - start)
        return PERR(p, start, "internal: string arena exhausted");
    o = p->arena + p->arena_used;
    for (;;) {
        uint8_t c;

        if (p->pos >= p->n)
            return PERR(p, start, "invalid JSON: unterminated string %s", ctx);
        c = p->h[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20)
            return PERR(p, p->pos,
                        "invalid JSON: unescaped control character 0x%02x "
                        "in a string",
                        c);
        if (c == '\\') {
            uint8_t e;
            long cp;

            if (p->pos + 1 >= p->n)
                return PERR(p, start, "invalid JSON: unterminated string %s",
                            ctx);
            e = p->h[p->pos + 1];
            switch (e) {
            case '"':
            case '\\':
            case '/':
                *o++ = (char)e;
                p->pos += 2;
                continue;
            case 'b':
                *o++ = '\b';
                p->pos += 2;
                continue;
            case 'f':
                *o++ = '\f';
                p->pos += 2;
                continue;
            case 'n':
                *o++ = '\n';
                p->pos += 2;
                continue;
            case 'r':
                *o++ = '\r';
                p->pos += 2;
                continue;
            case 't':
                *o++ = '\t';
                p->pos += 2;
                continue;
            case 'u':
                break;
            default:
                return PERR(p, p->pos, "invalid JSON: bad escape '\\%c'",
                            e >= 0x20 && e < 0x7f ? e : '?');
            }
            cp = hex4(p, p->pos);
            if (cp < 0)
                return PERR(p, p->pos,
                            "invalid JSON: \\u needs four hex digits");
            if (cp >= 0xdc00 && cp <= 0xdfff)
                return PERR(p, p->pos,
                            "invalid JSON: lone low surrogate \\u%04lx", cp);
            if (cp >= 0xd800 && cp <= 0xdbff) {
                long lo = -1;

                if (p->pos + 7 < p->n && p->h[p->pos + 6] == '\\' &&
                    p->h[p->pos + 7] == 'u')
                    lo = hex4(p, p->pos + 6);
                if (lo < 0xdc00 || lo > 0xdfff)
                    return PERR(p, p->pos,
                                "invalid JSON: high surrogate \\u%04lx "
                                "without a low one",
                                cp);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p->pos += 6;
            }
            if (cp == 0)
                return PERR(p, p->pos,
                            "NUL character (\\u0000) in a string is not "
                            "supported");
            o += put_utf8(o, (uint32_t)cp);
            p->pos += 6;
            continue;
        }
        {
            size_t k = mesh_st_utf8_len(p->h + p->pos, p->n - p->pos);
            if (k == 0)
                return PERR(p, p->pos, "invalid UTF-8 in a string");
            memcpy(o, p->h + p->pos, k);
            o += k;
            p->pos += k;
        }
    }
    *o++ = '\0';
    *out = p->arena + p->arena_used;
    p->arena_used = (size_t)(o - p->arena);
    return 0;
}

/* A non-negative JSON integer that fits in max. */
static int parse_uint(struct parser *p, const char *ctx, uint64_t max,
                      uint64_t *out)
{
    size_t start;
    uint64_t v = 0;

    skip_ws(p);
    start = p->pos;
    if (p->pos >= p->n || p->h[p->pos] < '0' || p->h[p->pos] > '9')
        return PERR(p, p->pos, "expected a non-negative integer %s, found %s",
                    ctx, what_is(p));
    if (p->h[p->pos] == '0' && p->pos + 1 < p->n && p->h[p->pos + 1] >= '0' &&
        p->h[p->pos + 1] <= '9')
        return PERR(p, p->pos, "invalid JSON: leading zero in a number %s",
                    ctx);
    while (p->pos < p->n && p->h[p->pos] >= '0' && p->h[p->pos] <= '9') {
        unsigned d = p->h[p->pos] - '0';
        if (v > (max - d) / 10)
            return PERR(p, start, "integer %s is larger than %" PRIu64, ctx,
                        max);
        v = v * 10 + d;
        p->pos++;
    }
    if (p->pos < p->n &&
        (p->h[p->pos] == '.' || p->h[p->pos] == 'e' || p->h[p->pos] == 'E'))
        return PERR(p, start,
                    "expected an integer %s, found a fraction or "
                    "exponent",
                    ctx);
    *out = v;
    return 0;
}

/* "[u, u, ...]" with at most maxn values, each <= max; *count on return. */
static int parse_uint_array(struct parser *p, const char *ctx, int maxn,
                            uint64_t max, uint64_t *vals, int *count)
{
    size_t start;
    int n = 0;
    int rc;

    skip_ws(p);
    start = p->pos;
    if ((rc = expect(p, '[', ctx)) < 0)
        return rc;
    skip_ws(p);
    if (p->pos < p->n && p->h[p->pos] == ']') {
        p->pos++;
        *count = 0;
        return 0;
    }
    for (;;) {
        uint64_t v = 0;

        if ((rc = parse_uint(p, ctx, max, &v)) < 0)
            return rc;
        if (n == maxn)
            return PERR(p, start, "more than %d entries %s", maxn, ctx);
        vals[n++] = v;
        skip_ws(p);
        if (p->pos < p->n && p->h[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->n && p->h[p->pos] == ']') {
            p->pos++;
            break;
        }
        return PERR(p, p->pos,
                    "invalid JSON: expected ',' or ']' in %s, "
                    "found %s",
                    ctx, what_is(p));
    }
    *count = n;
    return 0;
}

/* After a member: ',' (returns 1) or the closing '}' (returns 0). */
static int next_member(struct parser *p, const char *ctx)
{
    skip_ws(p);
    if (p->pos < p->n && p->h[p->pos] == ',') {
        p->pos++;
        skip_ws(p);
        if (p->pos < p->n && p->h[p->pos] == '}')
            return PERR(p, p->pos, "invalid JSON: trailing comma in %s", ctx);
        return 1;
    }
    if (p->pos < p->n && p->h[p->pos] == '}') {
        p->pos++;
        return 0;
    }
    return PERR(p, p->pos, "invalid JSON: expected ',' or '}' in %s, found %s",
                ctx, what_is(p));
}

static int parse_metadata(struct parser *p, size_t keypos)
{
    struct mesh_st_file *f = p->f;
    int rc;

    if (p->seen_meta)
        return PERR(p, keypos, "duplicate \"__metadata__\"");
    p->seen_meta = 1;
    if ((rc = expect(p, '{', "as the value of \"__metadata__\"")) < 0)
        return rc;
    skip_ws(p);
    if (p->pos < p->n && p->h[p->pos] == '}') {
        p->pos++;
        return 0;
    }
    do {
        const char *k, *v;
        size_t at;

        if (f->nmeta == p->meta_cap) {
            int cap = p->meta_cap ? 2 * p->meta_cap : 8;
            struct mesh_st_meta *m = realloc(f->meta, (size_t)cap * sizeof(*m));
            if (!m)
                return mesh_err(-ENOMEM, "out of memory for metadata");
            f->meta = m;
            p->meta_cap = cap;
        }
        skip_ws(p);
        at = p->pos;
        if ((rc = parse_string(p, "as a metadata key", &k)) < 0 ||
            (rc = expect(p, ':', "after a metadata key")) < 0)
            return rc;
        skip_ws(p);
        if (p->pos < p->n && p->h[p->pos] != '"') {
            char b[128];
            return PERR(p, p->pos,
                        "metadata \"%s\": the value must be a string, "
                        "found %s",
                        mesh_st_show(k, b, sizeof(b)), what_is(p));
        }
        if ((rc = parse_string(p, "as a metadata value", &v)) < 0)
            return rc;
        f->meta[f->nmeta].key = k;
        f->meta[f->nmeta].value = v;
        f->meta[f->nmeta].pos = at;
        f->nmeta++;
    } while ((rc = next_member(p, "\"__metadata__\"")) == 1);
    return rc;
}

/* The entry of tensor name (key at header byte keypos), value at p->pos. */
static int parse_tensor(struct parser *p, const char *name, size_t keypos)
{
    struct mesh_st_file *f = p->f;
    struct mesh_st_tensor *t;
    uint64_t shape[MESH_ST_MAX_DIMS], offs[2];
    int ndim = 0, noffs = 0, seen = 0, dtype = -1;
    char s[160];
    int rc;

    if (f->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        struct mesh_st_tensor *nt = realloc(f->t, (size_t)cap * sizeof(*nt));
        size_t *np;
        uint64_t *ne;

        if (!nt)
            return mesh_err(-ENOMEM, "out of memory for tensors");
        f->t = nt;
        np = realloc(f->hpos, (size_t)cap * sizeof(*np));
        if (!np)
            return mesh_err(-ENOMEM, "out of memory for tensors");
        f->hpos = np;
        ne = realloc(p->ends, (size_t)cap * sizeof(*ne));
        if (!ne)
            return mesh_err(-ENOMEM, "out of memory for tensors");
        p->ends = ne;
        p->cap = cap;
    }
    p->cur = name;
    skip_ws(p);
    if (p->pos >= p->n || p->h[p->pos] != '{')
        return PERR(p, p->pos, "expected an object, found %s", what_is(p));
    p->pos++;
    skip_ws(p);
    if (p->pos < p->n && p->h[p->pos] == '}') {
        p->pos++;
    } else {
        do {
            size_t mark = p->arena_used;
            size_t at;
            const char *k;
            int bit;

            skip_ws(p);
            at = p->pos;
            if ((rc = parse_string(p, "as a field name", &k)) < 0 ||
                (rc = expect(p, ':', "after a field name")) < 0)
                return rc;
            if (strcmp(k, "dtype") == 0)
                bit = 1;
            else if (strcmp(k, "shape") == 0)
                bit = 2;
            else if (strcmp(k, "data_offsets") == 0)
                bit = 4;
            else
                return PERR(p, at, "unknown field \"%s\"",
                            mesh_st_show(k, s, sizeof(s)));
            p->arena_used = mark; /* field names are not kept */
            if (seen & bit)
                return PERR(p, at, "duplicate field \"%s\"", k);
            seen |= bit;
            if (bit == 1) {
                const char *d;

                skip_ws(p);
                at = p->pos;
                if ((rc = parse_string(p, "as the dtype", &d)) < 0)
                    return rc;
                dtype = mesh_st_dtype_from_name(d);
                if (dtype < 0)
                    return PERR(p, at, "unknown dtype \"%s\"",
                                mesh_st_show(d, s, sizeof(s)));
                p->arena_used = mark;
            } else if (bit == 2) {
                if ((rc = parse_uint_array(p, "in \"shape\"", MESH_ST_MAX_DIMS,
                                           INT64_MAX, shape, &ndim)) < 0)
                    return rc;
            } else {
                skip_ws(p);
                at = p->pos;
                if ((rc = parse_uint_array(p, "in \"data_offsets\"", 2,
                                           UINT64_MAX, offs, &noffs)) < 0)
                    return rc;
                if (noffs != 2)
                    return PERR(p, at,
                                "\"data_offsets\" needs two entries [begin, "
                                "end], found %d",
                                noffs);
            }
        } while ((rc = next_member(p, "a tensor entry")) == 1);
        if (rc < 0)
            return rc;
    }
    if (seen != 7)
        return PERR(p, keypos, "missing \"%s\"",
                    !(seen & 1)   ? "dtype"
                    : !(seen & 2) ? "shape"
                                  : "data_offsets");

    /* Its numbers are checked once the whole header is known to be JSON. */
    t = &f->t[f->n];
    memset(t, 0, sizeof(*t));
    t->name = name;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = (int64_t)shape[i];
    t->offset = offs[0];
    p->ends[f->n] = offs[1];
    f->hpos[f->n] = keypos;
    f->n++;
    p->cur = NULL;
    return 0;
}

/* Each tensor's shape, dtype size and data_offsets must agree. */
static int check_sizes(struct parser *p)
{
    struct mesh_st_file *f = p->f;
    char s[160];

    for (int k = 0; k < f->n; k++) {
        struct mesh_st_tensor *t = &f->t[k];
        uint64_t elems = 1, need, begin = t->offset, end = p->ends[k];
        size_t size = mesh_st_dtype_size(t->dtype);
        size_t at = f->hpos[k];

        p->cur = t->name;
        for (int i = 0; i < t->ndim; i++) {
            uint64_t d = (uint64_t)t->shape[i];
            if (d && elems > UINT64_MAX / d)
                return PERR(p, at, "element count of shape %s overflows",
                            mesh_st_show_shape(t->shape, t->ndim, s, sizeof(s)));
            elems *= d;
        }
        if (elems > UINT64_MAX / size)
            return PERR(p, at, "byte size of shape %s overflows",
                        mesh_st_show_shape(t->shape, t->ndim, s, sizeof(s)));
        need = elems * size;
        if (begin > end)
            return PERR(p, at,
                        "data_offsets [%" PRIu64 ",%" PRIu64
                        "] end before they begin",
                        begin, end);
        if (end - begin != need)
            return PERR(p, at,
                        "data_offsets [%" PRIu64 ",%" PRIu64 "] hold %" PRIu64
                        " bytes but dtype %s shape %s needs %" PRIu64,
                        begin, end, end - begin, mesh_st_dtype_name(t->dtype),
                        mesh_st_show_shape(t->shape, t->ndim, s, sizeof(s)), need);
        if (end > p->data_len)
            return PERR(p, at,
                        "data_offsets [%" PRIu64 ",%" PRIu64
                        "] run past the end of the data buffer (%" PRIu64
                        " bytes)",
                        begin, end, p->data_len);
        t->nbytes = need;
    }
    p->cur = NULL;
    return 0;
}

static int cmp_by_name(const void *a, const void *b)
{
    const struct mesh_st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int cmp_meta(const void *a, const void *b)
{
    const struct mesh_st_meta *x = a, *y = b;
    int c = strcmp(x->key, y->key);

    if (c)
        return c;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

struct span {
    uint64_t begin, end;
    int idx;
};

static int cmp_span(const void *a, const void *b)
{
    const struct span *x = a, *y = b;

    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

/* Tensors must tile [0, data_len) exactly: no overlap, hole or tail. */
static int check_coverage(const struct parser *p)
{
    const struct mesh_st_file *f = p->f;
    struct span *sp;
    uint64_t covered = 0;
    int last = -1, rc = 0;
    char s[128];

    if (f->n == 0) {
        if (p->data_len)
            return mesh_err(-EINVAL,
                            "trailing garbage: %" PRIu64 " data bytes but no "
                            "tensors",
                            p->data_len);
        return 0;
    }
    sp = malloc((size_t)f->n * sizeof(*sp));
    if (!sp)
        return mesh_err(-ENOMEM, "out of memory for the offset check");
    for (int i = 0; i < f->n; i++) {
        sp[i].begin = f->t[i].offset;
        sp[i].end = f->t[i].offset + f->t[i].nbytes;
        sp[i].idx = i;
    }
    qsort(sp, (size_t)f->n, sizeof(*sp), cmp_span);
    for (int i = 0; i < f->n; i++) {
        const struct mesh_st_tensor *t = &f->t[sp[i].idx];

        if (sp[i].begin < covered) {
            rc = terr(f->hpos[sp[i].idx], t->name,
                      "data_offsets [%" PRIu64 ",%" PRIu64
                      "] overlap tensor \"%s\" [%" PRIu64 ",%" PRIu64 "]",
                      sp[i].begin, sp[i].end,
                      mesh_st_show(f->t[sp[last].idx].name, s, sizeof(s)),
                      sp[last].begin, sp[last].end);
            goto out;
        }
        if (sp[i].begin > covered) {
            rc = terr(f->hpos[sp[i].idx], t->name,
                      "data_offsets [%" PRIu64 ",%" PRIu64
                      "] leave a hole: data bytes [%" PRIu64 ",%" PRIu64
                      ") belong to no tensor",
                      sp[i].begin, sp[i].end, covered, sp[i].begin);
            goto out;
        }
        if (sp[i].end > covered || last < 0) {
            covered = sp[i].end;
            last = i;
        }
    }
    if (covered != p->data_len)
        rc = terr(f->hpos[sp[last].idx], f->t[sp[last].idx].name,
                  "trailing garbage: the data buffer has %" PRIu64
                  " bytes but this last tensor ends at %" PRIu64,
                  p->data_len, covered);
out:
    free(sp);
    return rc;
}

static int check_unique(const struct parser *p)
{
    struct mesh_st_file *f = p->f;
    char b[128];

    if (f->n) {
        f->by_name = malloc((size_t)f->n * sizeof(*f->by_name));
        if (!f->by_name)
            return mesh_err(-ENOMEM, "out of memory for the name index");
    }
    for (int i = 0; i < f->n; i++)
        f->by_name[i] = &f->t[i];
    if (f->n > 1)
        qsort(f->by_name, (size_t)f->n, sizeof(*f->by_name), cmp_by_name);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0) {
            size_t a = (size_t)(f->by_name[i - 1] - f->t);
            size_t c = (size_t)(f->by_name[i] - f->t);
            return terr(f->hpos[MESH_MAX(a, c)], f->by_name[i]->name,
                        "duplicate tensor name (first at header byte %zu)",
                        f->hpos[MESH_MIN(a, c)]);
        }
    if (f->nmeta > 1)
        qsort(f->meta, (size_t)f->nmeta, sizeof(*f->meta), cmp_meta);
    for (int i = 1; i < f->nmeta; i++)
        if (strcmp(f->meta[i - 1].key, f->meta[i].key) == 0)
            return PERR(p, f->meta[i].pos,
                        "duplicate metadata key \"%s\" (first at header "
                        "byte %zu)",
                        mesh_st_show(f->meta[i].key, b, sizeof(b)), f->meta[i - 1].pos);
    return 0;
}

static int parse_header(struct parser *p)
{
    int rc;

    if (p->n == 0 || p->h[0] != '{')
        return PERR(p, 0, "the header must start with '{', found %s",
                    what_is(p));
    p->pos = 1;
    skip_ws(p);
    if (p->pos < p->n && p->h[p->pos] == '}') {
        p->pos++;
    } else {
        do {
            const char *key;
            size_t keypos;

            skip_ws(p);
            keypos = p->pos;
            if ((rc = parse_string(p, "as a tensor name", &key)) < 0 ||
                (rc = expect(p, ':', "after a tensor name")) < 0)
                return rc;
            if (strcmp(key, "__metadata__") == 0)
                rc = parse_metadata(p, keypos);
            else
                rc = parse_tensor(p, key, keypos);
            if (rc < 0)
                return rc;
        } while ((rc = next_member(p, "the header object")) == 1);
        if (rc < 0)
            return rc;
    }
    /* Writers pad the header with spaces; anything else is garbage. */
    skip_ws(p);
    if (p->pos != p->n)
        return PERR(p, p->pos,
                    "trailing garbage after the header's JSON object");
    if ((rc = check_sizes(p)) < 0 || (rc = check_unique(p)) < 0 ||
        (rc = check_coverage(p)) < 0)
        return rc;
    return 0;
}

int mesh_st_parse_header(struct mesh_st_file *f, const uint8_t *h, size_t n,
                         uint64_t data_len)
{
    struct parser p;
    int rc;

    memset(&p, 0, sizeof(p));
    p.h = h;
    p.n = n;
    p.data_len = data_len;
    p.arena_cap = p.n + 1;
    p.arena = malloc(p.arena_cap);
    p.f = f;
    if (!p.arena)
        return mesh_err(-ENOMEM, "out of memory for a %zu-byte header", p.n);
    f->arena = p.arena;
    rc = parse_header(&p);
    free(p.ends);
    return rc;
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
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    int rc;

    if (!buf)
        return mesh_err(-ENOMEM, "out of memory");
    for (;;) {
        ssize_t r;

        if (len == cap) {
            uint8_t *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return mesh_err(-ENOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
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

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    float f;

    if (exp == 0 && man == 0) {
        bits = sign;
    } else if (exp == 0) {
        /* Subnormal: normalise man * 2^-24. */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even; NaN becomes 0x7e00 with its sign, as in PyTorch. */
static uint16_t f32_to_f16(float f)
{
    uint32_t x, ax, sign, r, rem;

    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero */
        uint32_t e = ax >> 23, m, shift, half;

        if (ax <= 0x33000000u) /* <= 2^-25 rounds to zero */
            return (uint16_t)sign;
        m = (ax & 0x7fffffu) | 0x800000u;
        shift = 126 - e; /* 14 .. 24 */
        r = m >> shift;
        rem = m & ((1u << shift) - 1);
        half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    r = (ax - 0x38000000u) >> 13; /* rebias 127 -> 15 */
    rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1)))
        r++;
    return (uint16_t)(sign | r);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;

    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even; NaN becomes 0x7fc0, as in PyTorch. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t x;

    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0u;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
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
        return bf16_to_f32(h);
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
    int32_t i32;
    int16_t i16;
    uint32_t u32;
    uint16_t u16;

    switch (dtype) {
    case MESH_ST_I32:
        memcpy(&i32, src + 4 * i, 4);
        return i32;
    case MESH_ST_I16:
        memcpy(&i16, src + 2 * i, 2);
        return i16;
    case MESH_ST_I8:
        return (int8_t)src[i];
    case MESH_ST_U32:
        memcpy(&u32, src + 4 * i, 4);
        return u32;
    case MESH_ST_U16:
        memcpy(&u16, src + 2 * i, 2);
        return u16;
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
    if (s->cap - s->len < n + 1) {
        size_t cap = s->cap ? s->cap : 1024;
        char *np;

        while (cap - s->len < n + 1)
            cap *= 2;
        np = realloc(s->p, cap);
        if (!np) {
            s->oom = 1;
            return;
        }
        s->p = np;
        s->cap = cap;
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
                    -EINVAL, "%s: bad shape %s", mesh_st_show(e[i].name, b, sizeof(b)),
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
