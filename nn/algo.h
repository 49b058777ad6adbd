/*
 * nn/algo.h: running one of a library's ranked algorithms with fallback,
 * as PyTorch does for cuDNN's convolutions: the first candidate that
 * works is kept; one whose workspace query or call fails is marked and
 * the next is tried. Plain C over an opaque "try" callback, so that make
 * check tests the logic without a GPU (tests/test_nn_algo.c); the cuda
 * backend (nn/cuda/cuda.c) is its user.
 */
#ifndef MESH_NN_ALGO_H
#define MESH_NN_ALGO_H

#include <stddef.h>

/* Candidates kept per direction of a convolution. */
#define MESH_NN_ALGO_MAX 8

struct mesh_nn_algo {
    int id;     /* the library's algorithm number */
    int math;   /* the math type it runs with */
    size_t ws;  /* workspace bytes it needs (its estimate, then exact) */
    int failed; /* set when its workspace query or a call failed */
};

/*
 * The index of the first candidate of a[0..n) at or after `from` that has
 * not failed and needs at most cap bytes of workspace, or -1.
 */
int mesh_nn_algo_next(const struct mesh_nn_algo *a, int n, int from,
                      size_t cap);

/* Try one candidate: 0, or a negative code with mesh_err's message. */
typedef int (*mesh_nn_algo_try_fn)(void *arg, struct mesh_nn_algo *a);

/*
 * Call try_fn on the candidates mesh_nn_algo_next finds from *cur on (cur
 * included), in order, until one returns 0; each that fails is marked
 * failed and logged as a warning that names `what` and its message, and
 * the error message is cleared before the next. On success *cur is the
 * candidate that worked and 0 is returned. When none is left: the last
 * failure's code and message, prefixed with `what`, or -ENOTSUP when no
 * candidate could be tried; *cur is left as it was.
 */
int mesh_nn_algo_run(struct mesh_nn_algo *a, int n, size_t cap, int *cur,
                     const char *what, mesh_nn_algo_try_fn try_fn, void *arg);

#endif
