/* common/array.c: growable arrays (see common/array.h). */
#include "config.h"

#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int mesh_array_reserve(void *ptrp, size_t *cap, size_t need, size_t elem,
                       const char *what)
{
    size_t ncap = *cap ? *cap : 16;
    void *p, *np;

    if (need <= *cap)
        return 0;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            goto nomem;
        ncap *= 2;
    }
    if (elem && ncap > SIZE_MAX / elem)
        goto nomem;
    memcpy(&p, ptrp, sizeof(p));
    np = realloc(p, ncap * elem);
    if (!np)
        goto nomem;
    memcpy(ptrp, &np, sizeof(np));
    *cap = ncap;
    return 0;
nomem:
    return mesh_err(-ENOMEM, "out of memory for %zu %s", need, what);
}
