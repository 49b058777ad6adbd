/* mesh/hostfile.c: hostfile and -H parsing, rank layout, rank from env. */
#include "config.h"

#include "mesh/hostfile.h"
#include "common/array.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Hostfiles are small; a bigger file is surely the wrong one. */
#define HOSTFILE_MAX_BYTES (4 << 20)
#define SLOTS_MAX          4096

/* A cursor over the text that knows its line and column for messages. */
struct cursor {
    const char *source;
    const char *p;
    int line;
    const char *line_start;
    int hosts_form; /* the -H string: ',' separates entries */
};

static int col(const struct cursor *c)
{
    return (int)(c->p - c->line_start) + 1;
}

static int at_end_of_entry(const struct cursor *c)
{
    char ch = *c->p;

    if (c->hosts_form)
        return ch == '\0' || ch == ',';
    return ch == '\0' || ch == '\n' || ch == '#';
}

static const char *found(const struct cursor *c, char *buf, size_t len)
{
    unsigned char ch = (unsigned char)*c->p;

    if (ch == '\0')
        snprintf(buf, len, "end of %s", c->hosts_form ? "list" : "file");
    else if (ch == '\n' || ch == '\r')
        snprintf(buf, len, "end of line");
    else if (isprint(ch))
        snprintf(buf, len, "'%c'", ch);
    else
        snprintf(buf, len, "byte 0x%02x", ch);
    return buf;
}

static int expected(const struct cursor *c, const char *what)
{
    char f[32];

    return mesh_err(-EINVAL, "%s:%d:%d: expected %s, found %s", c->source,
                    c->line, col(c), what, found(c, f, sizeof(f)));
}

static void skip_blanks(struct cursor *c)
{
    while (*c->p == ' ' || *c->p == '\t' || *c->p == '\r')
        c->p++;
}

static int is_name_char(char ch)
{
    return isalnum((unsigned char)ch) || ch == '.' || ch == '-' || ch == '_';
}

/* A decimal number in [lo, hi] at the cursor. */
static int parse_number(struct cursor *c, long lo, long hi, const char *what,
                        int *out)
{
    const char *start = c->p;
    long v = 0;

    if (!isdigit((unsigned char)*c->p))
        return expected(c, what);
    while (isdigit((unsigned char)*c->p)) {
        v = v * 10 + (*c->p - '0');
        if (v > hi)
            break;
        c->p++;
    }
    if (v < lo || v > hi) {
        c->p = start;
        return mesh_err(-EINVAL, "%s:%d:%d: expected %s between %ld and %ld",
                        c->source, c->line, col(c), what, lo, hi);
    }
    *out = (int)v;
    return 0;
}

static int parse_host(struct cursor *c, struct mesh_hostfile_entry *e)
{
    const char *start;
    size_t len;

    e->line = c->line;
    e->column = col(c);
    if (*c->p == '[') {
        struct in6_addr a6;
        char tmp[MESH_HOST_MAX];
        struct cursor open = *c;

        c->p++;
        start = c->p;
        while (isxdigit((unsigned char)*c->p) || *c->p == ':' || *c->p == '.' ||
               *c->p == '%' || isalnum((unsigned char)*c->p))
            c->p++;
        if (*c->p != ']')
            return expected(c, "']' closing the IPv6 address");
        len = (size_t)(c->p - start);
        if (len == 0 || len >= sizeof(tmp))
            return expected(&open, "an IPv6 address inside [ ]");
        memcpy(tmp, start, len);
        tmp[len] = '\0';
        /* A zone (fe80::1%eth0) is kept; only the address is checked. */
        {
            char addr[MESH_HOST_MAX];
            char *pct;

            snprintf(addr, sizeof(addr), "%s", tmp);
            pct = strchr(addr, '%');
            if (pct)
                *pct = '\0';
            if (inet_pton(AF_INET6, addr, &a6) != 1) {
                c->p = start;
                return mesh_err(-EINVAL,
                                "%s:%d:%d: expected an IPv6 address inside "
                                "[ ], found '%s'",
                                c->source, c->line, col(c), tmp);
            }
        }
        memcpy(e->host, tmp, len + 1);
        c->p++; /* ']' */
        return 0;
    }
    start = c->p;
    while (is_name_char(*c->p))
        c->p++;
    len = (size_t)(c->p - start);
    if (len == 0)
        return expected(c, "a host name or address");
    if (*c->p == ':' && c->p[1] != '\0' &&
        (isxdigit((unsigned char)c->p[1]) || c->p[1] == ':')) {
        /* "fe80::1" or "::1": an unbracketed IPv6 address. */
        const char *q = c->p + 1;

        while (isdigit((unsigned char)*q))
            q++;
        if (*q == ':' || isxdigit((unsigned char)*q)) {
            c->p = start;
            return mesh_err(-EINVAL,
                            "%s:%d:%d: expected an IPv6 address in brackets "
                            "(like [::1]:2), found an unbracketed one",
                            c->source, c->line, col(c));
        }
    }
    if (len >= MESH_HOST_MAX) {
        c->p = start;
        return mesh_err(-EINVAL, "%s:%d:%d: host name longer than %d bytes",
                        c->source, c->line, col(c), MESH_HOST_MAX - 1);
    }
    memcpy(e->host, start, len);
    e->host[len] = '\0';
    return 0;
}

/* key=value fields after the host, Open MPI style. */
static int parse_fields(struct cursor *c, struct mesh_hostfile_entry *e,
                        int slots_given)
{
    int max_slots = -1, port_given = 0, rc;

    for (;;) {
        const char *before = c->p;
        struct cursor key;

        skip_blanks(c);
        if (at_end_of_entry(c))
            break;
        if (c->p == before)
            return expected(c, "whitespace before the next field");
        key = *c;
        if (!strncmp(c->p, "slots=", 6)) {
            if (slots_given)
                return mesh_err(-EINVAL, "%s:%d:%d: slots given twice",
                                c->source, c->line, col(&key));
            c->p += 6;
            rc = parse_number(c, 1, SLOTS_MAX, "a slot count", &e->slots);
            if (rc < 0)
                return rc;
            slots_given = 1;
        } else if (!strncmp(c->p, "max_slots=", 10)) {
            c->p += 10;
            rc = parse_number(c, 1, SLOTS_MAX, "a slot count", &max_slots);
            if (rc < 0)
                return rc;
        } else if (!strncmp(c->p, "port=", 5)) {
            if (port_given)
                return mesh_err(-EINVAL, "%s:%d:%d: port= given twice",
                                c->source, c->line, col(&key));
            c->p += 5;
            rc = parse_number(c, 1, 65535, "a port number", &e->port);
            if (rc < 0)
                return rc;
            port_given = 1;
        } else {
            return expected(c, "slots=N, max_slots=N, port=P, '#' or end "
                               "of line");
        }
        if (!at_end_of_entry(c) && *c->p != ' ' && *c->p != '\t' &&
            *c->p != '\r')
            return expected(c, "whitespace, '#' or end of line");
    }
    if (max_slots >= 0 && max_slots < e->slots)
        return mesh_err(-EINVAL, "%s:%d:%d: max_slots=%d is less than slots=%d",
                        c->source, e->line, e->column, max_slots, e->slots);
    return 0;
}

static int parse_entry(struct cursor *c, struct mesh_hostfile_entry *e)
{
    int slots_given = 0, rc;

    memset(e, 0, sizeof(*e));
    e->slots = 1;
    e->port = -1;
    rc = parse_host(c, e);
    if (rc < 0)
        return rc;
    if (*c->p == ':') {
        c->p++;
        rc = parse_number(c, 1, SLOTS_MAX, "a slot count after ':'", &e->slots);
        if (rc < 0)
            return rc;
        slots_given = 1;
    }
    if (c->hosts_form) {
        skip_blanks(c);
        if (!at_end_of_entry(c))
            return expected(c, "':' and a slot count, ',' or end of list");
        return 0;
    }
    if (!at_end_of_entry(c) && *c->p != ' ' && *c->p != '\t' && *c->p != '\r')
        return expected(c, slots_given ? "whitespace, '#' or end of line"
                                       : "':', whitespace, '#' or end of "
                                         "line");
    return parse_fields(c, e, slots_given);
}

/* Append e; *slots counts the world so far, which must stay in bounds. */
static int push(struct mesh_hostfile *hf, size_t *cap,
                const struct mesh_hostfile_entry *e, long *slots)
{
    *slots += e->slots;
    if (*slots > MESH_WORLD_MAX)
        return mesh_err(-EINVAL,
                        "%s:%d:%d: %s's %d slot(s) make the world %ld ranks, "
                        "more than the limit of %d",
                        hf->source, e->line, e->column, e->host, e->slots,
                        *slots, MESH_WORLD_MAX);
    if (mesh_array_reserve(&hf->entries, cap, (size_t)hf->n + 1, sizeof(*e),
                           "hostfile entries") < 0)
        return mesh_err_prefix(-ENOMEM, "reading %s", hf->source);
    hf->entries[hf->n++] = *e;
    return 0;
}

/* The entry at c, parsed and appended as push() does. */
static int add_entry(struct cursor *c, struct mesh_hostfile *hf, size_t *cap,
                     long *slots)
{
    struct mesh_hostfile_entry e;
    int rc = parse_entry(c, &e);

    return rc < 0 ? rc : push(hf, cap, &e, slots);
}

static int parse(const char *source, const char *text, int hosts_form,
                 struct mesh_hostfile **out)
{
    struct cursor c = {.source = source,
                       .p = text,
                       .line = 1,
                       .line_start = text,
                       .hosts_form = hosts_form};
    struct mesh_hostfile *hf;
    long slots = 0;
    size_t cap = 0;
    int rc;

    hf = calloc(1, sizeof(*hf));
    if (!hf)
        return mesh_err(-ENOMEM, "out of memory reading %s", source);
    snprintf(hf->source, sizeof(hf->source), "%s", source);
    for (;;) {
        skip_blanks(&c);
        if (hosts_form) {
            rc = add_entry(&c, hf, &cap, &slots);
            if (rc < 0)
                goto fail;
            if (*c.p == '\0')
                break;
            c.p++; /* ',' */
            continue;
        }
        if (*c.p != '\0' && *c.p != '\n' && *c.p != '#') {
            rc = add_entry(&c, hf, &cap, &slots);
            if (rc < 0)
                goto fail;
        }
        if (*c.p == '#')
            while (*c.p != '\0' && *c.p != '\n')
                c.p++;
        if (*c.p == '\0')
            break;
        c.p++; /* '\n' */
        c.line++;
        c.line_start = c.p;
    }
    if (hf->n == 0) {
        rc = mesh_err(-EINVAL, "%s: no hosts listed", source);
        goto fail;
    }
    *out = hf;
    return 0;
fail:
    mesh_hostfile_free(hf);
    return rc;
}

int mesh_hostfile_parse_text(const char *source, const char *text,
                             struct mesh_hostfile **out)
{
    return parse(source, text, 0, out);
}

int mesh_hostfile_parse_hosts(const char *hosts, struct mesh_hostfile **out)
{
    return parse("-H", hosts, 1, out);
}

int mesh_hostfile_parse_file(const char *path, struct mesh_hostfile **out)
{
    struct stat st;
    char *text = NULL;
    size_t got = 0;
    ssize_t n;
    int fd = -1, rc;

    rc = mesh_open_input("hostfile", path, 0, &fd, &st);
    if (rc < 0)
        goto out_none;
    if (st.st_size > HOSTFILE_MAX_BYTES) {
        rc = mesh_err(-EFBIG,
                      "hostfile %s has %lld bytes, more than a hostfile's "
                      "%d",
                      path, (long long)st.st_size, HOSTFILE_MAX_BYTES);
        goto out_fd;
    }
    text = malloc((size_t)st.st_size + 1);
    if (!text) {
        rc = mesh_err(-ENOMEM, "out of memory reading %s", path);
        goto out_fd;
    }
    while (got < (size_t)st.st_size) {
        MESH_SYSCALL(rc, n = read(fd, text + got, (size_t)st.st_size - got),
                     out_text, "cannot read hostfile %s", path);
        if (n == 0)
            break;
        got += (size_t)n;
    }
    text[got] = '\0';
    if (strlen(text) != got) {
        rc = mesh_err(-EINVAL, "hostfile %s: a NUL byte at byte offset %zu",
                      path, strlen(text));
        goto out_text;
    }
    rc = parse(path, text, 0, out);
out_text:
    free(text);
out_fd:
    close(fd);
out_none:
    return rc;
}

void mesh_hostfile_free(struct mesh_hostfile *hf)
{
    if (!hf)
        return;
    free(hf->entries);
    free(hf);
}

int mesh_hostfile_slots(const struct mesh_hostfile *hf)
{
    int i, n = 0;

    for (i = 0; i < hf->n; i++)
        n += hf->entries[i].slots;
    return n;
}

/*
 * An open-addressing hash table of keys (a host, or a host and a port)
 * to an int, so that laying out N ranks takes O(N) and not O(N^2): with
 * 4,000 lines of slots=4096 the quadratic scans ran for minutes.
 */
struct slot_map {
    size_t mask;
    struct slot_map_entry {
        const char *host; /* NULL: empty */
        int port;         /* -1 for a key of a host alone */
        int value;
    } * e;
};

static int map_init(struct slot_map *m, size_t n)
{
    size_t cap = 16;

    while (cap < 2 * n)
        cap *= 2;
    m->mask = cap - 1;
    m->e = calloc(cap, sizeof(*m->e));
    return m->e ? 0 : mesh_err(-ENOMEM, "out of memory laying out ranks");
}

static uint64_t map_hash(const char *host, int port)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */

    for (; *host; host++)
        h = (h ^ (unsigned char)*host) * 1099511628211ull;
    return (h ^ (uint64_t)(unsigned)port) * 1099511628211ull;
}

/* The entry of (host, port): found, or empty for the caller to fill. */
static struct slot_map_entry *map_find(struct slot_map *m, const char *host,
                                       int port)
{
    size_t i = (size_t)map_hash(host, port) & m->mask;

    while (m->e[i].host && (m->e[i].port != port || strcmp(m->e[i].host, host)))
        i = (i + 1) & m->mask;
    return &m->e[i];
}

int mesh_hostfile_local_ranks(const struct mesh_hostfile *hf, int *first)
{
    struct slot_map m;
    int i, rc;

    rc = map_init(&m, (size_t)hf->n);
    if (rc < 0)
        return rc;
    for (i = 0; i < hf->n; i++) {
        const struct mesh_hostfile_entry *e = &hf->entries[i];
        struct slot_map_entry *s = map_find(&m, e->host, -1);

        if (!s->host) {
            s->host = e->host;
            s->port = -1;
            s->value = 0;
        }
        first[i] = s->value; /* slots of this host on earlier lines */
        s->value += e->slots;
    }
    free(m.e);
    return 0;
}

int mesh_hostfile_layout(const struct mesh_hostfile *hf, int base_port,
                         int port_lo, int port_hi, struct mesh_peer **out,
                         int *size)
{
    int n = mesh_hostfile_slots(hf), r = 0, i, j, rc;
    struct mesh_peer *peers;
    struct slot_map used = {0}; /* host:port -> the rank that has it */
    int *origin = NULL;         /* entry index of each rank, for messages */
    int *first = NULL;          /* each entry's first local rank */

    if (n <= 0)
        return mesh_err(-EINVAL, "%s: no slots", hf->source);
    if (n > MESH_WORLD_MAX)
        return mesh_err(-EINVAL, "%s: %d ranks, more than the limit of %d",
                        hf->source, n, MESH_WORLD_MAX);
    peers = calloc((size_t)n, sizeof(*peers));
    origin = calloc((size_t)n, sizeof(*origin));
    first = calloc((size_t)hf->n, sizeof(*first));
    if (!peers || !origin || !first) {
        rc = mesh_err(-ENOMEM, "out of memory laying out %d ranks", n);
        goto fail;
    }
    rc = mesh_hostfile_local_ranks(hf, first);
    if (rc < 0)
        goto fail;
    rc = map_init(&used, (size_t)n);
    if (rc < 0)
        goto fail;
    for (i = 0; i < hf->n; i++) {
        const struct mesh_hostfile_entry *e = &hf->entries[i];
        int base = e->port > 0 ? e->port : base_port;

        for (j = 0; j < e->slots; j++, r++) {
            long port = (long)base + j;
            struct slot_map_entry *u;

            if (port > 65535) {
                rc = mesh_err(-EINVAL,
                              "%s:%d:%d: slot %d of %s (rank %d) needs port "
                              "%ld, beyond 65535",
                              hf->source, e->line, e->column, j, e->host, r,
                              port);
                goto fail;
            }
            if (port_lo > 0 && (port < port_lo || port > port_hi)) {
                rc = mesh_err(-EINVAL,
                              "%s:%d:%d: slot %d of %s (rank %d) needs port "
                              "%ld, outside --port-range %d-%d",
                              hf->source, e->line, e->column, j, e->host, r,
                              port, port_lo, port_hi);
                goto fail;
            }
            snprintf(peers[r].host, sizeof(peers[r].host), "%s", e->host);
            peers[r].port = (uint16_t)port;
            peers[r].local_rank = first[i] + j;
            origin[r] = i;
            u = map_find(&used, e->host, (int)port);
            if (u->host) {
                const struct mesh_hostfile_entry *o =
                    &hf->entries[origin[u->value]];

                rc = mesh_err(-EINVAL,
                              "%s:%d:%d: duplicate host:port %s:%u (rank "
                              "%d) already used by rank %d from line %d; "
                              "give one of them another port=",
                              hf->source, e->line, e->column, e->host,
                              (unsigned)port, r, u->value, o->line);
                goto fail;
            }
            u->host = e->host;
            u->port = (int)port;
            u->value = r;
        }
    }
    free(used.e);
    free(first);
    free(origin);
    *out = peers;
    *size = n;
    return 0;
fail:
    free(used.e);
    free(first);
    free(origin);
    free(peers);
    return rc;
}

/* First set variable of names[]: 1 and value, 0 if none, <0 if invalid. */
static int env_int(const char *const *names, int min, int *val,
                   const char **var)
{
    int i;

    for (i = 0; names[i]; i++) {
        const char *s = getenv(names[i]);
        char *end;
        long v;

        if (!s || !*s)
            continue;
        errno = 0;
        v = strtol(s, &end, 10);
        if (errno || *end || v < min || v > INT_MAX)
            return mesh_err(-EINVAL, "%s='%s' is not an integer >= %d",
                            names[i], s, min);
        *val = (int)v;
        *var = names[i];
        return 1;
    }
    return 0;
}

int mesh_env_rank(int *rank, const char **var)
{
    static const char *const names[] = {"MESHTRAIN_RANK", "SLURM_PROCID",
                                        "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                        NULL};

    return env_int(names, 0, rank, var);
}

int mesh_env_size(int *size, const char **var)
{
    static const char *const names[] = {"MESHTRAIN_SIZE", "SLURM_NTASKS",
                                        "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                        NULL};

    return env_int(names, 1, size, var);
}

int mesh_parse_port_range(const char *str, int *lo, int *hi)
{
    const char *s = str;
    char *end;
    long a, b;

    errno = 0;
    a = strtol(s, &end, 10);
    if (errno || end == s || *end != '-')
        goto bad;
    s = end + 1;
    b = strtol(s, &end, 10);
    if (errno || end == s || *end)
        goto bad;
    if (a < 1 || b > 65535 || a > b)
        goto bad;
    *lo = (int)a;
    *hi = (int)b;
    return 0;
bad:
    return mesh_err(-EINVAL,
                    "port range '%s': expected LO-HI with "
                    "1 <= LO <= HI <= 65535",
                    str);
}
