/* common/util.c: errors, logging, time and memory helpers. */
#include "config.h"

#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MESH_ERR_MAX 1024

static _Thread_local char err_buf[MESH_ERR_MAX];
static _Thread_local int err_set;

static void err_vset(const char *fmt, va_list ap)
{
    vsnprintf(err_buf, sizeof(err_buf), fmt, ap);
    err_set = 1;
}

int mesh_err(int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    err_vset(fmt, ap);
    va_end(ap);
    return code;
}

int mesh_err_errno(const char *fmt, ...)
{
    int saved = errno ? errno : EIO;
    char what[MESH_ERR_MAX / 2];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    snprintf(err_buf, sizeof(err_buf), "%s: %s", what, strerror(saved));
    err_set = 1;
    return -saved;
}

int mesh_err_prefix(int code, const char *fmt, ...)
{
    char ctx[MESH_ERR_MAX];
    char old[MESH_ERR_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(ctx, sizeof(ctx), fmt, ap);
    va_end(ap);
    snprintf(old, sizeof(old), "%s", mesh_err_msg(code));
    snprintf(err_buf, sizeof(err_buf), "%s: %s", ctx, old);
    err_set = 1;
    return code;
}

const char *mesh_err_msg(int code)
{
    if (!err_set)
        snprintf(err_buf, sizeof(err_buf), "%s",
                 code < 0 ? strerror(-code) : "unknown error");
    return err_buf;
}

void mesh_err_clear(void)
{
    err_set = 0;
    err_buf[0] = '\0';
}

static atomic_int log_rank = -1;
static const char *log_program = "meshtrain";

void mesh_log_set_program(const char *name)
{
    log_program = name;
}
static atomic_int log_level = -1;

void mesh_log_set_rank(int rank)
{
    atomic_store(&log_rank, rank);
}

void mesh_log_set_level(enum mesh_log_level level)
{
    atomic_store(&log_level, (int)level);
}

static int level_from_env(void)
{
    const char *s = getenv("MESHTRAIN_LOG");

    if (!s)
        return MESH_LOG_INFO;
    if (!strcasecmp(s, "error"))
        return MESH_LOG_ERROR;
    if (!strcasecmp(s, "warn"))
        return MESH_LOG_WARN;
    if (!strcasecmp(s, "debug"))
        return MESH_LOG_DEBUG;
    return MESH_LOG_INFO;
}

int mesh_log_enabled(enum mesh_log_level level)
{
    int cur = atomic_load(&log_level);

    if (cur < 0) {
        cur = level_from_env();
        atomic_store(&log_level, cur);
    }
    return (int)level <= cur;
}

void mesh_log(enum mesh_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warning", "info", "debug"};
    char line[2048];
    int n, rank = atomic_load(&log_rank);
    va_list ap;

    if (!mesh_log_enabled(level))
        return;
    if (rank >= 0)
        n = snprintf(line, sizeof(line), "[%s rank %d] %s: ", log_program, rank,
                     names[level]);
    else
        n = snprintf(line, sizeof(line), "[%s] %s: ", log_program,
                     names[level]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    n = (int)strlen(line);
    line[n++] = '\n';
    /* One write per line so that lines of several threads never mix. */
    if (write(STDERR_FILENO, line, (size_t)n) < 0) {
        /* Nothing sensible to do when stderr is gone. */
    }
}

uint64_t mesh_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double mesh_now_s(void)
{
    return (double)mesh_now_ns() * 1e-9;
}

int mesh_host_alloc(size_t len, void **out)
{
    static atomic_int warned;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t rounded = (len + page - 1) / page * page;
    void *p = NULL;

    if (rounded == 0)
        rounded = page;
    if (posix_memalign(&p, page, rounded) != 0)
        return mesh_err(-ENOMEM, "cannot allocate %zu bytes of host memory",
                        len);
    if (mlock(p, rounded) != 0 && !atomic_exchange(&warned, 1))
        mesh_warn("mlock of %zu bytes failed (%s); host buffers stay "
                  "pageable (raise RLIMIT_MEMLOCK, ulimit -l, to pin them)",
                  rounded, strerror(errno));
    *out = p;
    return 0;
}

void mesh_host_free(void *ptr, size_t len)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t rounded = (len + page - 1) / page * page;

    if (!ptr)
        return;
    munlock(ptr, rounded ? rounded : page);
    free(ptr);
}

const char *mesh_file_type_name(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG:
        return "a regular file";
    case S_IFDIR:
        return "a directory";
    case S_IFIFO:
        return "a FIFO";
    case S_IFCHR:
        return "a character device";
    case S_IFBLK:
        return "a block device";
    case S_IFSOCK:
        return "a socket";
    case S_IFLNK:
        return "a symbolic link";
    }
    return "of an unknown type";
}

int mesh_open_input(const char *what, const char *path, int dir_ok, int *fd,
                    struct stat *st)
{
    const char *sep = what && *what ? " " : "";
    struct stat s;
    int f, flags, rc;

    if (!what)
        what = "";
    /* O_NONBLOCK: open() of a FIFO without a writer returns at once. */
    do {
        f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    } while (f < 0 && errno == EINTR);
    if (f < 0)
        return mesh_err_errno("%s%s%s", what, sep, path);
    if (fstat(f, &s) != 0) {
        rc = mesh_err_errno("%s%s%s: stat", what, sep, path);
        goto fail;
    }
    if (!S_ISREG(s.st_mode) && !(dir_ok && S_ISDIR(s.st_mode))) {
        rc = mesh_err(-EINVAL, "%s%s%s is %s, not a regular file%s", what, sep,
                      path, mesh_file_type_name(s.st_mode),
                      dir_ok ? " or a directory" : "");
        goto fail;
    }
    /* Reads of regular files never block; later reads want EINTR only. */
    flags = fcntl(f, F_GETFL);
    if (flags < 0 || fcntl(f, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        rc = mesh_err_errno("%s%s%s: fcntl", what, sep, path);
        goto fail;
    }
    *fd = f;
    if (st)
        *st = s;
    return 0;
fail:
    close(f);
    return rc;
}

int mesh_check_output(const char *what, const char *path)
{
    char dir[4096];
    struct stat st;
    const char *slash;

    if (!*path)
        return mesh_err(-EINVAL, "%s: empty file name", what);
    if (stat(path, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return mesh_err(-EINVAL, "%s %s is %s, not a regular file", what,
                            path, mesh_file_type_name(st.st_mode));
        if (access(path, W_OK) != 0)
            return mesh_err_errno("%s %s: cannot write", what, path);
        return 0;
    }
    if (errno != ENOENT)
        return mesh_err_errno("%s %s", what, path);
    slash = strrchr(path, '/');
    if (!slash)
        return 0;
    if ((size_t)(slash - path) >= sizeof(dir))
        return mesh_err(-ENAMETOOLONG, "%s %s: name too long", what, path);
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    if (!dir[0])
        return 0; /* "/name" */
    if (stat(dir, &st) != 0)
        return mesh_err_errno("%s %s: folder %s", what, path, dir);
    if (!S_ISDIR(st.st_mode))
        return mesh_err(-ENOTDIR, "%s %s: %s is %s, not a directory", what,
                        path, dir, mesh_file_type_name(st.st_mode));
    return 0;
}

int mesh_file_read(const char *path, size_t max, const char *what,
                   uint8_t **buf, size_t *cap, size_t *len)
{
    struct stat st;
    size_t size, done = 0;
    int fd, rc = 0;

    rc = mesh_open_input(NULL, path, 0, &fd, &st);
    if (rc < 0)
        return rc;
    if (st.st_size <= 0 || (uint64_t)st.st_size > max) {
        rc = mesh_err(-EIO, "%s: size %lld is not that of %s", path,
                      (long long)st.st_size, what);
        goto out;
    }
    size = (size_t)st.st_size;
    if (*cap < size + 1) {
        uint8_t *p = realloc(*buf, size + 1);

        if (!p) {
            rc = mesh_err(-ENOMEM, "%s: cannot allocate %zu bytes", path,
                          size + 1);
            goto out;
        }
        *buf = p;
        *cap = size + 1;
    }
    while (done < size) {
        ssize_t n = read(fd, *buf + done, size - done);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = mesh_err_errno("%s: read at byte offset %zu", path, done);
            goto out;
        }
        if (n == 0) {
            rc = mesh_err(-EIO, "%s: truncated at byte offset %zu", path, done);
            goto out;
        }
        done += (size_t)n;
    }
    (*buf)[done] = '\0';
    *len = done;
out:
    close(fd);
    return rc;
}

void mesh_shuffle(int *order, int n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 12345u;

    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j, tmp;

        x = x * 1664525u + 1013904223u;
        j = (int)((x >> 8) % (uint32_t)(i + 1));
        tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
}

int mesh_parse_long(const char *what, const char *s, long lo, long hi,
                    long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return mesh_err(-EINVAL, "%s '%s': expected an integer from %ld to %ld",
                        what, s, lo, hi);
    *out = v;
    return 0;
}

int mesh_parse_int(const char *what, const char *s, int lo, int hi, int *out)
{
    long v;
    int rc = mesh_parse_long(what, s, lo, hi, &v);

    if (rc == 0)
        *out = (int)v;
    return rc;
}

int mesh_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

void mesh_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;

    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const void *)sa;

        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
            inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], host, sizeof(host));
        else
            inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
        port = ntohs(s6->sin6_port);
        if (strchr(host, ':')) {
            snprintf(buf, len, "[%s]:%u", host, port);
            return;
        }
    } else if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const void *)sa;

        inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
        port = ntohs(s4->sin_port);
    }
    snprintf(buf, len, "%s:%u", host, port);
}
