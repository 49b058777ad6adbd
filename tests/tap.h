/*
 * tests/tap.h: a tiny TAP producer for the test programs (header-only).
 *   plan(n); ok(cond, "name %d", i); skip_all("no GPU"); return done();
 */
#ifndef MESH_TAP_H
#define MESH_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_n, tap_failed, tap_planned;

static inline void plan(int n)
{
    tap_planned = n;
    printf("1..%d\n", n);
    fflush(stdout);
}

/* The rest of a TAP line: fmt formatted as printf does, and its end. */
__attribute__((format(printf, 1, 2))) static inline void
tap_line(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* The whole program skipped, the reason formatted as printf does. */
#define skip_all(...) (printf("1..0 # SKIP "), tap_line(__VA_ARGS__))
/* One test skipped, and why. */
#define skip(...) (printf("ok %d # SKIP ", ++tap_n), tap_line(__VA_ARGS__))
/* A comment. */
#define diag(...) (printf("# "), tap_line(__VA_ARGS__))

__attribute__((format(printf, 2, 3))) static inline int ok(int cond,
                                                           const char *fmt, ...)
{
    va_list ap;

    printf("%s %d - ", cond ? "ok" : "not ok", ++tap_n);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (!cond)
        tap_failed++;
    return cond;
}

/* Exit status: 0 when every planned test ran and passed. */
static inline int done(void)
{
    if (!tap_planned)
        printf("1..%d\n", tap_n);
    else if (tap_n != tap_planned)
        diag("planned %d tests but ran %d", tap_planned, tap_n);
    return tap_failed || (tap_planned && tap_n != tap_planned);
}

#endif
