/*
 * nn/safetensors_json.c: the strict JSON header parser of the safetensors
 * reader (nn/safetensors.c; see nn/safetensors.h for the rules).
 *
 * A schema-driven recursive descent over exactly the JSON this format uses:
 * the top-level object holds tensor entries (objects of a string and two
 * arrays of non-negative integers) and "__metadata__" (an object of
 * strings). Nesting deeper than that is rejected where it starts, so the
 * recursion depth is fixed at three. Decoded strings go into one arena: a
 * decoded string plus its NUL is never longer than its quoted JSON form, so
 * an arena of the header's size always suffices.
 */
#include "config.h"

#include "nn/safetensors-internal.h"

#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    const uint8_t *h; /* header text */
    size_t n;         /* its length */
    size_t pos;
    uint64_t data_len;
    char *arena;
    size_t arena_used, arena_cap;
    struct mesh_st_file *f;
    size_t t_cap, hpos_cap, ends_cap; /* elements allocated in f->t ... */
    size_t meta_cap;
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

/* Four hex digits at p->pos + 2 (after "\u"); -1 if not. */
static long hex4(const struct parser *p, size_t at)
{
    long v = 0;

    if (at + 6 > p->n)
        return -1;
    for (size_t i = at + 2; i < at + 6; i++) {
        int d = mesh_hexval(p->h[i]);
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
            /* the one-character escapes and what they stand for */
            static const char esc[] = "\"\\/bfnrt";
            static const char val[] = "\"\\/\b\f\n\r\t";
            const char *k;
            uint8_t e;
            long cp;

            if (p->pos + 1 >= p->n)
                return PERR(p, start, "invalid JSON: unterminated string %s",
                            ctx);
            e = p->h[p->pos + 1];
            if (e && (k = strchr(esc, e)) != NULL) {
                *o++ = val[k - esc];
                p->pos += 2;
                continue;
            }
            if (e != 'u')
                return PERR(p, p->pos, "invalid JSON: bad escape '\\%c'",
                            e >= 0x20 && e < 0x7f ? e : '?');
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

/* Just after an object's '{': an immediate '}' is consumed (returns 1). */
static int empty_object(struct parser *p)
{
    skip_ws(p);
    if (p->pos < p->n && p->h[p->pos] == '}') {
        p->pos++;
        return 1;
    }
    return 0;
}

/*
 * A member's key and the ':' after it; *at is the key's header byte. noun
 * names the key in messages ("a field name").
 */
static int parse_key(struct parser *p, const char *noun, size_t *at,
                     const char **key)
{
    char as[64], after[64];
    int rc;

    snprintf(as, sizeof(as), "as %s", noun);
    snprintf(after, sizeof(after), "after %s", noun);
    skip_ws(p);
    *at = p->pos;
    if ((rc = parse_string(p, as, key)) < 0 || (rc = expect(p, ':', after)) < 0)
        return rc;
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
    if (empty_object(p))
        return 0;
    do {
        const char *k, *v;
        size_t at;

        if ((rc = mesh_array_reserve(&f->meta, &p->meta_cap,
                                     (size_t)f->nmeta + 1, sizeof(*f->meta),
                                     "metadata entries")) < 0)
            return rc;
        if ((rc = parse_key(p, "a metadata key", &at, &k)) < 0)
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

    if ((rc = mesh_array_reserve(&f->t, &p->t_cap, (size_t)f->n + 1,
                                 sizeof(*f->t), "tensors")) < 0 ||
        (rc = mesh_array_reserve(&f->hpos, &p->hpos_cap, (size_t)f->n + 1,
                                 sizeof(*f->hpos), "tensors")) < 0 ||
        (rc = mesh_array_reserve(&p->ends, &p->ends_cap, (size_t)f->n + 1,
                                 sizeof(*p->ends), "tensors")) < 0)
        return rc;
    p->cur = name;
    skip_ws(p);
    if (p->pos >= p->n || p->h[p->pos] != '{')
        return PERR(p, p->pos, "expected an object, found %s", what_is(p));
    p->pos++;
    if (!empty_object(p)) {
        do {
            size_t mark = p->arena_used;
            size_t at;
            const char *k;
            int bit;

            if ((rc = parse_key(p, "a field name", &at, &k)) < 0)
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
                return PERR(
                    p, at, "element count of shape %s overflows",
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
                        mesh_st_show_shape(t->shape, t->ndim, s, sizeof(s)),
                        need);
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
                        mesh_st_show(f->meta[i].key, b, sizeof(b)),
                        f->meta[i - 1].pos);
    return 0;
}

static int parse_header(struct parser *p)
{
    int rc;

    if (p->n == 0 || p->h[0] != '{')
        return PERR(p, 0, "the header must start with '{', found %s",
                    what_is(p));
    p->pos = 1;
    if (!empty_object(p)) {
        do {
            const char *key;
            size_t keypos;

            if ((rc = parse_key(p, "a tensor name", &keypos, &key)) < 0)
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
