/*
 * common/array.h: growable arrays.
 *
 *     struct item *v = NULL;
 *     size_t n = 0, cap = 0;
 *
 *     if ((rc = mesh_array_reserve(&v, &cap, n + 1, sizeof(*v), "items")) < 0)
 *         return rc;
 *     v[n++] = item;
 *
 * The capacity doubles (from 16 elements), so appends cost O(1) amortised.
 */
#ifndef MESH_ARRAY_H
#define MESH_ARRAY_H

#include <stddef.h>

/*
 * Make *(T **)ptrp hold at least need elements of elem bytes; *cap counts
 * elements. 0, or -ENOMEM (also on size overflow) with a message naming
 * what; the array and *cap are unchanged on failure.
 */
int mesh_array_reserve(void *ptrp, size_t *cap, size_t need, size_t elem,
                       const char *what);

#endif
