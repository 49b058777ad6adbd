/*
 * common/util.h: errors, logging, time and memory helpers shared by every
 * layer.
 *
 * common/ is the base layer: every folder may include it, and it includes
 * none of them (tests/layers.sh checks). Its headers:
 *   common/util.h    errors, logging, clocks, flag and file parsing, host
 *                    memory, struct mesh_host_allocator
 *   common/dtype.h   enum mesh_dtype: names, sizes, float16/bfloat16
 *   common/bytes.h   little-endian (and IDX's big-endian) integers in buffers
 *   common/array.h   growable arrays (mesh_array_reserve)
 *
 * Error convention (DESIGN.md): functions return 0 or a negative errno-style
 * code. The first place that detects an error records a message with
 * mesh_err(); callers that only propagate the code leave it alone, or add
 * context in front with mesh_err_prefix(). Only main() prints it and exits.
 * The message is thread-local.
 */
#ifndef MESH_UTIL_H
#define MESH_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

struct stat;

#if defined(__GNUC__)
#define MESH_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MESH_PRINTF(f, a)
#endif

/* Record "msg" as this thread's error message and return code (< 0). */
int mesh_err(int code, const char *fmt, ...) MESH_PRINTF(2, 3);

/* Put "context: " in front of the current message; returns code. */
int mesh_err_prefix(int code, const char *fmt, ...) MESH_PRINTF(2, 3);

/* This thread's last message, or a description of code if none is set. */
const char *mesh_err_msg(int code);

/* Forget this thread's message. */
void mesh_err_clear(void);

/* Log levels; MESHTRAIN_LOG=error|warn|info|debug (default info). */
enum mesh_log_level {
    MESH_LOG_ERROR = 0,
    MESH_LOG_WARN = 1,
    MESH_LOG_INFO = 2,
    MESH_LOG_DEBUG = 3,
};

/*
 * Every log line starts with "[PROGRAM rank R] " once the rank is known,
 * "[PROGRAM] " before. PROGRAM is "meshtrain" unless the program sets its
 * own name (a static string) before it logs.
 */
void mesh_log_set_program(const char *name);
void mesh_log_set_rank(int rank);
void mesh_log_set_level(enum mesh_log_level level);
int mesh_log_enabled(enum mesh_log_level level);
void mesh_log(enum mesh_log_level level, const char *fmt, ...)
    MESH_PRINTF(2, 3);

#define mesh_error_log(...) mesh_log(MESH_LOG_ERROR, __VA_ARGS__)
#define mesh_warn(...)      mesh_log(MESH_LOG_WARN, __VA_ARGS__)
#define mesh_info(...)      mesh_log(MESH_LOG_INFO, __VA_ARGS__)
#define mesh_debug(...)     mesh_log(MESH_LOG_DEBUG, __VA_ARGS__)

/* Monotonic clock. */
uint64_t mesh_now_ns(void);
double mesh_now_s(void);

/*
 * Checked syscall: retries on EINTR, and on failure records
 * "what: strerror" and jumps to label with rc = -errno.
 *   MESH_SYSCALL(rc, fd = open(p, O_RDONLY), out, "open %s", p);
 */
#define MESH_SYSCALL(rc, expr, label, ...)                                     \
    do {                                                                       \
        long mesh_sc_;                                                         \
        do {                                                                   \
            mesh_sc_ = (long)(expr);                                           \
        } while (mesh_sc_ < 0 && errno == EINTR);                              \
        if (mesh_sc_ < 0) {                                                    \
            (rc) = mesh_err_errno(__VA_ARGS__);                                \
            goto label;                                                        \
        }                                                                      \
    } while (0)

/* Record "<fmt>: strerror(errno)" and return -errno. */
int mesh_err_errno(const char *fmt, ...) MESH_PRINTF(1, 2);

/* order[0..n) = a permutation of 0..n-1 drawn from seed (Fisher-Yates on
 * a 32-bit LCG): the same on every rank and every machine for one seed, so
 * that peers can take turns in one agreed random order. */
void mesh_shuffle(int *order, int n, unsigned seed);

/*
 * s as a whole decimal integer from lo to hi into *out; else -EINVAL with
 * "<what> '<s>': expected an integer from <lo> to <hi>" (what names the
 * flag or variable, e.g. "--port").
 */
int mesh_parse_long(const char *what, const char *s, long lo, long hi,
                    long *out);
int mesh_parse_int(const char *what, const char *s, int lo, int hi, int *out);

/* The value of the hex digit c (0-9, a-f, A-F), or -1 if c is none. */
int mesh_hexval(int c);

/*
 * Open path for reading without ever blocking in open(): a FIFO or a
 * device with no writer would otherwise hang there. The file must be a
 * regular file, or a directory when dir_ok (then opened O_DIRECTORY-style,
 * for fstat and fdopendir). Anything else is -EINVAL with
 * "<what> <path> is a FIFO, not a regular file" (what names the flag, e.g.
 * "--hostfile"). On success *fd is a blocking descriptor (O_CLOEXEC) and
 * *st, when not NULL, its fstat.
 */
int mesh_open_input(const char *what, const char *path, int dir_ok, int *fd,
                    struct stat *st);

/*
 * Check an output path before anything is written: it must not exist yet
 * or be a regular file, and its folder must exist. A FIFO (which would
 * block the writer's open), a directory or a device is -EINVAL with a
 * message that names what (the flag) and the path.
 */
int mesh_check_output(const char *what, const char *path);

/* "a FIFO", "a directory", "a character device", ... for messages. */
const char *mesh_file_type_name(unsigned mode);

struct sockaddr;

/*
 * An IPv4 or IPv6 socket address as "1.2.3.4:5" or "[::1]:5" (an
 * IPv4-mapped IPv6 one as IPv4; another family "?:0"), for messages.
 */
void mesh_sockaddr_str(const struct sockaddr *sa, char *buf, size_t len);

/*
 * The whole file at path, of 1 to max bytes (else an error that calls it
 * "not <what>"), into *buf: a malloc'ed buffer of *cap bytes, grown with
 * realloc where the file needs more (start with NULL and 0; the caller
 * frees it), with a NUL after the data. *len gets the file's length. A
 * file that ends before its size says is an error.
 */
int mesh_file_read(const char *path, size_t max, const char *what,
                   uint8_t **buf, size_t *cap, size_t *len);

/*
 * Pinned host memory: page-aligned, mlock'ed where RLIMIT_MEMLOCK allows
 * (a one-time warning is logged where it does not). Freed with
 * mesh_host_free(ptr, len).
 */
int mesh_host_alloc(size_t len, void **out);
void mesh_host_free(void *ptr, size_t len);

/*
 * A host memory allocator, for a layer that takes its buffers' memory from
 * another (the communicator's options take nn's pinned allocator, say).
 */
struct mesh_host_allocator {
    int (*alloc)(void *arg, size_t len, void **out); /* 0 or -errno */
    void (*free)(void *arg, void *p, size_t len);
    void *arg;
};

#define MESH_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MESH_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define MESH_MAX(a, b)     ((a) > (b) ? (a) : (b))

#endif
