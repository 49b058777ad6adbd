/*
 * tests/fuzz_main.c: what every hostile-input harness links (tests/fuzz.h),
 * and, without FUZZ_LIBFUZZER, their main: the replay of make check.
 *
 *   tests/fuzz_NAME                  the cases of
 *                                    $srcdir/tests/fuzz-corpus/NAME.txt, TAP
 *   tests/fuzz_NAME --seeds DIR      write each case's bytes to DIR/<case>
 *                                    (libFuzzer's seed corpus)
 *   tests/fuzz_NAME FILE...          feed each file (a crash libFuzzer
 *                                    saved) and say what came of it
 *
 * The corpus file holds one case per "case" line:
 *
 *   # a comment
 *   case NAME          the case's name, [A-Za-z0-9._-]
 *   expect ok          the parser accepts it, or
 *   expect TEXT        it refuses it with a message containing TEXT
 *   data BYTES         appended to the case's input (as many lines as
 *                      needed): C escapes \n \t \r \\ \0 and \xHH, the
 *                      rest as is (a line's end is not part of it)
 */
#include "config.h"

#include "tests/fuzz.h"
#include "tests/tmpdir.h"
#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int fuzz_rc;
char fuzz_msg[1024];

void fuzz_fail(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "fuzz_%s: ", fuzz_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

void fuzz_answer(int rc, const char *const *must, int n)
{
    const char *m;

    fuzz_rc = rc;
    fuzz_msg[0] = '\0';
    if (rc >= 0)
        return;
    /* mesh_err_msg(0) with no message recorded says "unknown error" */
    m = mesh_err_msg(0);
    if (!strcmp(m, "unknown error") || !*m)
        fuzz_fail("refused (%d) without a message", rc);
    snprintf(fuzz_msg, sizeof(fuzz_msg), "%s", m);
    for (int i = 0; i < n; i++)
        if (!strstr(fuzz_msg, must[i]))
            fuzz_fail("the message does not name '%s': %s", must[i], fuzz_msg);
}

static char tmp_path[4096];

static void tmp_gone(void)
{
    if (tmp_path[0])
        tmpdir_remove(tmp_path);
}

const char *fuzz_tmpdir(void)
{
    if (!tmp_path[0]) {
        char name[64];

        snprintf(name, sizeof(name), "fuzz_%s", fuzz_name);
        if (tmpdir_make(tmp_path, sizeof(tmp_path), name) < 0)
            fuzz_fail("cannot make a temporary directory: %s", strerror(errno));
        atexit(tmp_gone);
    }
    return tmp_path;
}

void fuzz_write(const char *name, const void *data, size_t len)
{
    char path[4200];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", fuzz_tmpdir(), name);
    for (char *s = strchr(path + strlen(tmp_path) + 1, '/'); s;
         s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdir(path, 0700) < 0 && errno != EEXIST)
            fuzz_fail("mkdir %s: %s", path, strerror(errno));
        *s = '/';
    }
    f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f))
        fuzz_fail("write %s: %s", path, strerror(errno));
}

void fuzz_clean(void)
{
    const char *d = fuzz_tmpdir();

    tmpdir_remove(d);
    if (mkdir(d, 0700) < 0)
        fuzz_fail("mkdir %s: %s", d, strerror(errno));
}

#ifndef FUZZ_LIBFUZZER
#include "tests/tap.h"

struct fcase {
    char name[128];
    char expect[512]; /* "ok", or a part of the refusal's message */
    int line;
    uint8_t *data;
    size_t len, cap;
};

/* Append the escaped bytes s to c; -1 on a bad escape. */
static int unescape(struct fcase *c, const char *s)
{
    for (; *s; s++) {
        int v = (unsigned char)*s;

        if (c->len + 1 > c->cap) {
            size_t cap = c->cap ? 2 * c->cap : 256;
            uint8_t *d = realloc(c->data, cap);

            if (!d)
                return -1;
            c->data = d;
            c->cap = cap;
        }
        if (*s == '\\') {
            s++;
            if (*s == 'n')
                v = '\n';
            else if (*s == 't')
                v = '\t';
            else if (*s == 'r')
                v = '\r';
            else if (*s == '0')
                v = 0;
            else if (*s == '\\')
                v = '\\';
            else if (*s == 'x' && mesh_hexval(s[1]) >= 0 &&
                     mesh_hexval(s[2]) >= 0) {
                v = mesh_hexval(s[1]) << 4 | mesh_hexval(s[2]);
                s += 2;
            } else
                return -1;
        }
        c->data[c->len++] = (uint8_t)v;
    }
    return 0;
}

/* Read path's cases into *out (n of them); 0, or -1 with a message. */
static int read_cases(const char *path, struct fcase **out, int *n)
{
    FILE *f = fopen(path, "r");
    char line[8192];
    struct fcase *cs = NULL, *c = NULL;
    int lineno = 0, cap = 0;

    *n = 0;
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        size_t l = strlen(line);

        lineno++;
        if (l && line[l - 1] == '\n')
            line[--l] = '\0';
        if (!l || line[0] == '#')
            continue;
        if (!strncmp(line, "case ", 5)) {
            if (*n == cap) {
                cap = cap ? 2 * cap : 64;
                cs = realloc(cs, (size_t)cap * sizeof(*cs));
                if (!cs)
                    abort();
            }
            c = &cs[(*n)++];
            memset(c, 0, sizeof(*c));
            snprintf(c->name, sizeof(c->name), "%s", line + 5);
            c->line = lineno;
        } else if (c && !strncmp(line, "expect ", 7)) {
            snprintf(c->expect, sizeof(c->expect), "%s", line + 7);
        } else if (c && !strncmp(line, "data ", 5) &&
                   unescape(c, line + 5) == 0) {
            continue;
        } else {
            fprintf(stderr, "%s:%d: cannot parse this line\n", path, lineno);
            fclose(f);
            *out = cs;
            return -1;
        }
    }
    fclose(f);
    *out = cs;
    return 0;
}

static int write_seeds(const struct fcase *cs, int n, const char *dir)
{
    for (int i = 0; i < n; i++) {
        char path[4400];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", dir, cs[i].name);
        f = fopen(path, "wb");
        if (!f ||
            (cs[i].len && fwrite(cs[i].data, 1, cs[i].len, f) != cs[i].len) ||
            fclose(f)) {
            fprintf(stderr, "%s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    return 0;
}

/* Feed raw files (a crash libFuzzer saved): survive each. */
static int replay_files(int argc, char **argv)
{
    plan(argc);
    for (int i = 0; i < argc; i++) {
        uint8_t *buf = NULL;
        size_t cap = 0, len = 0;
        int rc = mesh_file_read(argv[i], (size_t)1 << 30, "an input", &buf,
                                &cap, &len);

        if (rc < 0) {
            ok(0, "%s: %s", argv[i], mesh_err_msg(rc));
            continue;
        }
        mesh_err_clear();
        LLVMFuzzerTestOneInput(buf, len);
        ok(1, "%s: %s", argv[i], fuzz_rc ? fuzz_msg : "accepted");
        free(buf);
    }
    return done();
}

static void free_cases(struct fcase *cs, int n)
{
    for (int i = 0; i < n; i++)
        free(cs[i].data);
    free(cs);
}

int main(int argc, char **argv)
{
    const char *srcdir = getenv("srcdir");
    char path[4096];
    struct fcase *cs = NULL;
    int n = 0, rc;

    snprintf(path, sizeof(path), "%s/tests/fuzz-corpus/%s.txt",
             srcdir && *srcdir ? srcdir : ".", fuzz_name);
    if (argc > 1 && strcmp(argv[1], "--seeds"))
        return replay_files(argc - 1, argv + 1);
    if (read_cases(path, &cs, &n) < 0) {
        free_cases(cs, n);
        return 1;
    }
    if (argc > 2) {
        rc = write_seeds(cs, n, argv[2]);
        free_cases(cs, n);
        return rc;
    }
    plan(n);
    for (int i = 0; i < n; i++) {
        struct fcase *c = &cs[i];
        int want_ok = !strcmp(c->expect, "ok");

        mesh_err_clear();
        LLVMFuzzerTestOneInput(c->data ? c->data : (const uint8_t *)"", c->len);
        if (want_ok)
            rc = ok(fuzz_rc == 0, "%s: accepted", c->name);
        else
            rc = ok(fuzz_rc < 0 && c->expect[0] &&
                        strstr(fuzz_msg, c->expect) != NULL,
                    "%s: refused, naming '%s'", c->name, c->expect);
        if (!rc)
            diag("%s:%d: got %s", path, c->line,
                 fuzz_rc < 0 ? fuzz_msg : "accepted");
    }
    free_cases(cs, n);
    return done();
}
#endif
