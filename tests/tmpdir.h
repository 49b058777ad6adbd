/*
 * tests/tmpdir.h: a fresh temporary directory for a test program's files,
 * removed with everything in it at the end.
 */
#ifndef MESH_TESTS_TMPDIR_H
#define MESH_TESTS_TMPDIR_H

#include <stddef.h>

/* Create $TMPDIR/NAME.XXXXXX (/tmp when TMPDIR is unset or empty) and put
 * its path in buf (cap bytes). 0, or -1 with errno set. */
int tmpdir_make(char *buf, size_t cap, const char *name);

/* Remove path and everything under it; symbolic links are removed, not
 * followed. */
void tmpdir_remove(const char *path);

#endif
