/*
 * collective/local.c: the direct-read all-reduce of the ranks of one host
 * (Open MPI vader's and NCCL's shared-memory idea, on the transport's
 * windows, mesh_transport_ops.host_window): no message goes through a
 * ring of slots. Per chunk, each rank copies its input into its window
 * once (all but its own slice), a host sync, each adds its 1/L slice
 * straight from the other L - 1 windows and its own input, in local-rank
 * order, into its window's other half, a host sync, and each copies the L
 * sums out. Every slice is added once, by one rank, and
 * copied to all: the same bytes everywhere, in the order hier adds them.
 * The rules every builder follows are coll-internal.h's.
 *
 * The halves: what a rank publishes at its K-th host sync (the
 * transport's count, the same on every rank) lies in half K % 2 of its
 * window, written after sync K - 1 completed (every rank had then read
 * what was published at K - 2 there) and read by the others before they
 * post sync K + 1. So a chunk posts two syncs, and a collective needs no
 * sync at its end: the next one's first writes go to the other half.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>

/* Usable: every rank on one host, each with a window (else hier runs). */
static int local_usable(const struct coll_hosts *h, int size)
{
    return h && h->win && h->nhosts == 1 && h->local == size && size >= 2;
}

size_t coll_local_scratch(const struct coll_args *a)
{
    return local_usable(a->hosts, a->size) ? 0 : coll_hier_scratch(a);
}

int coll_build_local_allreduce(struct sched *s, const struct coll_args *a,
                               void *scratch, mesh_mr_t *smr)
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype), half, ce, nch;
    float div = a->redop == MESH_REDOP_AVG ? (float)a->size : 1.0f;
    uint64_t k;
    void *mine;
    size_t len;
    int L, me, prev_sync = -1, *out, rc;
    const void **in;

    if (!local_usable(h, a->size))
        return coll_build_hier_allreduce(s, a, scratch, smr);
    L = h->local;
    me = h->local_of[a->rank];
    rc = h->ops->host_window(h->t, a->rank, &mine, &len, &k);
    if (rc < 0)
        return mesh_err(rc, "allreduce local: no window of rank %d", a->rank);
    half = h->win_len / 2;
    ce = MESH_MAX(half / es, 1);
    if (a->chunk_bytes)
        ce = MESH_MIN(ce, MESH_MAX(a->chunk_bytes / es, 1));
    nch = nchunks(a->count, ce);
    rc = tag_room(nch, 2);
    if (rc < 0)
        return rc;
    in = malloc((size_t)L * sizeof(*in));
    out = malloc((size_t)L * sizeof(*out));
    if (!in || !out) {
        free(in);
        free(out);
        return mesh_err(-ENOMEM, "out of memory building a local all-reduce");
    }
    for (int j = 0; j < L; j++)
        out[j] = -1;
    for (size_t c = 0; c < nch; c++) {
        /* the syncs this chunk posts: numbers k + 1 and k + 2 */
        size_t ha = (size_t)((k + 1) % 2) * half, hb = half - ha, o, l, ms, ml;
        int sa, red, sb;

        clip(0, a->count, c, ce, &o, &l);
        segment(l, L, me, &ms, &ml);
        /* 1. our input into our window, for the others to add: all but
         * our own slice, which we add from where it is */
        sa = sched_sync(s, (uint32_t)(2 * c));
        for (int part = 0; part < 2; part++) {
            size_t po = part ? ms + ml : 0, pl = part ? l - ms - ml : ms;
            int cin = sched_copy(s, (char *)h->win[me] + ha + po * es,
                                 at(a->sendbuf, o + po, es), pl * es);

            sched_dep(s, prev_sync, cin);
            sched_dep(s, cin, sa);
        }
        for (int j = 0; j < L; j++)
            sched_dep(s, out[j], sa);
        /* 2. our slice's sum, from every window in local-rank order, into
         * the other half of ours */
        for (int j = 0; j < L; j++)
            in[j] = (char *)h->win[j] + ha + ms * es;
        in[me] = at(a->sendbuf, o + ms, es);
        red =
            sched_reduce(s, (char *)h->win[me] + hb + ms * es, in, L, ml, div);
        sched_dep(s, sa, red);
        sb = sched_sync(s, (uint32_t)(2 * c + 1));
        sched_dep(s, red, sb);
        /* 3. every slice's sum out of its owner's window */
        for (int j = 0; j < L; j++) {
            size_t js, jl;

            segment(l, L, j, &js, &jl);
            out[j] = sched_copy(s, at(a->recvbuf, o + js, es),
                                (char *)h->win[j] + hb + js * es, jl * es);
            sched_dep(s, sb, out[j]);
        }
        prev_sync = sb;
        k += 2;
    }
    free(in);
    free(out);
    return s->failed ? mesh_err(-ENOMEM, "out of memory building a schedule")
                     : 0;
}

/*
 * Copies: the input into the window, and the L - 1 other slices out (a
 * byte each, gamma's order); the slice's sum adds L inputs; two host syncs
 * per chunk of half a window, a hop each (the chunk: COLL_CHUNK_MAX, the
 * model's stand-in for the transport's half window).
 */
double coll_local_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    const struct coll_hosts *h = c->hosts;
    double L, chunks;

    if (!h || !local_usable(h, c->size))
        return 1e30; /* not a choice here: hier would run */
    L = h->local;
    chunks = MESH_MAX(1.0, bytes / (double)COLL_CHUNK_MAX);
    return coll_lat(c, MESH_ALGO_LOCAL, 2.0) +
           2.0 * (chunks - 1.0) * m->alpha_s +
           (bytes + 2.0 * (L - 1.0) / L * bytes) * m->gamma_s_per_byte;
}
