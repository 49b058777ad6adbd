/* tests/tmpdir.c: temporary directories for tests (see tests/tmpdir.h). */
#include "config.h"

#include "tests/tmpdir.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

int tmpdir_make(char *buf, size_t cap, const char *name)
{
    const char *t = getenv("TMPDIR");

    if ((size_t)snprintf(buf, cap, "%s/%s.XXXXXX", t && *t ? t : "/tmp",
                         name) >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkdtemp(buf) ? 0 : -1;
}

static int remove_one(const char *path, const struct stat *st, int flag,
                      struct FTW *ftw)
{
    return remove(path);
}

void tmpdir_remove(const char *path)
{
    nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}
