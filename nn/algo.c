/*
 * nn/algo.c: a library's ranked algorithms with fallback (see algo.h).
 */
#include "config.h"

#include "nn/algo.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int mesh_nn_algo_next(const struct mesh_nn_algo *a, int n, int from, size_t cap)
{
    int i;

    for (i = from < 0 ? 0 : from; i < n; i++)
        if (!a[i].failed && a[i].ws <= cap)
            return i;
    return -1;
}

int mesh_nn_algo_run(struct mesh_nn_algo *a, int n, size_t cap, int *cur,
                     const char *what, mesh_nn_algo_try_fn try_fn, void *arg)
{
    char msg[256];
    int i = mesh_nn_algo_next(a, n, *cur, cap), next, rc;

    if (i < 0)
        return mesh_err(-ENOTSUP,
                        "%s: no algorithm left to try (%d candidates, "
                        "workspace %zu bytes)",
                        what, n, cap);
    for (;;) {
        rc = try_fn(arg, &a[i]);
        if (rc == 0) {
            *cur = i;
            return 0;
        }
        a[i].failed = 1;
        next = mesh_nn_algo_next(a, n, i + 1, cap);
        if (next < 0)
            return mesh_err_prefix(rc, "%s: algorithm %d, the last usable",
                                   what, a[i].id);
        snprintf(msg, sizeof(msg), "%s", mesh_err_msg(rc));
        mesh_warn("%s: algorithm %d failed (%s); trying algorithm %d", what,
                  a[i].id, msg, a[next].id);
        mesh_err_clear();
        i = next;
    }
}
