/*
 * collective/hier.c: the hierarchical all-reduce, for hosts of several
 * ranks (NCCL's rings, Open MPI's han): reduce-scatter inside each host in
 * one hop (every local rank sends segment j to local rank j, over shared
 * memory where the transport has it), then one ring per local index
 * between the hosts on that segment (every NIC carries its share), then
 * all-gather inside each host in one hop. The rules every builder follows
 * are coll-internal.h's.
 *
 * Between the hosts, a segment of up to HIER_RD_MAX bytes goes by
 * recursive doubling instead of the ring (log2 H hops instead of
 * 2 (H - 1): the hierarchical form of rd, for latency); every rank of a
 * ring has the same segment, so all choose alike.
 */
#include "config.h"

#include "collective/coll-internal.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>

#define HIER_RD_MAX (64u << 10)

/* Usable: equal hosts of two ranks or more (else the ring runs). */
static int hier_usable(const struct coll_hosts *h, int size)
{
    return h && h->local >= 2 && h->nhosts * h->local == size;
}

/* The ring between hosts on local index l's segment of ml elements. */
static struct coll_args ring_args(const struct coll_args *a, void *seg,
                                  size_t ml)
{
    struct coll_args r = *a;

    r.op = MESH_OP_ALLREDUCE;
    r.redop = MESH_REDOP_SUM; /* the host's step divided already */
    r.rank = a->hosts->host_of[a->rank];
    r.size = a->hosts->nhosts;
    r.count = ml;
    r.sendbuf = r.recvbuf = seg;
    r.send_mr = a->recv_mr;
    r.hosts = NULL;
    return r;
}

size_t coll_hier_scratch(const struct coll_args *a)
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype), maxseg;
    struct coll_args r;

    if (!hier_usable(h, a->size))
        return coll_ring_scratch(a);
    maxseg = (a->count + (size_t)h->local - 1) / (size_t)h->local;
    r = ring_args(a, a->recvbuf, maxseg);
    return (size_t)(h->local - 1) * maxseg * es +
           (h->nhosts > 1
                ? MESH_MAX(coll_ring_scratch(&r),
                           maxseg * es <= HIER_RD_MAX ? coll_rd_scratch(&r) : 0)
                : 0);
}

/* A no-op the next phase waits on: after every op in [from, s->nops). */
static int barrier_after(struct sched *s, int from, void *anywhere)
{
    int g, upto = s->nops;

    s->gate = -1;
    g = sched_copy(s, anywhere, anywhere, 0);
    for (int i = from; i < upto; i++)
        sched_dep(s, i, g);
    return g;
}

int coll_build_hier_allreduce(struct sched *s, const struct coll_args *a,
                              void *scratch, mesh_mr_t *smr)
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype), maxseg, ms, ml;
    float div = a->redop == MESH_REDOP_AVG ? (float)a->size : 1.0f;
    int L, H, me, l, hi, nin = 1, from, red, rc;
    const void **in;
    char *mine;

    if (!hier_usable(h, a->size))
        return coll_build_ring_allreduce(s, a, scratch, smr);
    L = h->local;
    H = h->nhosts;
    me = a->rank;
    l = h->local_of[me];
    hi = h->host_of[me];
    maxseg = (a->count + (size_t)L - 1) / (size_t)L;
    segment(a->count, L, l, &ms, &ml);
    mine = at(a->recvbuf, ms, es);
    in = malloc((size_t)L * sizeof(*in));
    if (!in)
        return mesh_err(-ENOMEM, "out of memory building a hierarchy");

    /* 1. Inside the host: segment j to local rank j (tag 0), and the
     * host's sum of ours from every other; an average divides the whole
     * sum once, at its last addition (here with one host, else after the
     * hosts' step), as every algorithm does. */
    if (H > 1)
        div = 1.0f;
    from = s->nops;
    in[0] = at(a->sendbuf, ms, es);
    {
        int *rcv = malloc((size_t)L * sizeof(*rcv)), nr = 0;

        if (!rcv) {
            free(in);
            return mesh_err(-ENOMEM, "out of memory building a hierarchy");
        }
        for (int j = 0; j < L; j++) {
            int peer = h->rank_at[hi * L + j];
            size_t js, jl;
            char *slot;

            if (j == l)
                continue;
            segment(a->count, L, j, &js, &jl);
            sched_send(s, peer, 0, js * es, at(a->sendbuf, js, es), jl * es,
                       a->send_mr);
            slot = at(scratch, (size_t)(nin - 1) * maxseg, es);
            in[nin++] = slot;
            rcv[nr++] = sched_recv(s, peer, 0, ms * es, slot, ml * es, smr);
        }
        red = sched_reduce(s, mine, in, nin, ml, div);
        for (int i = 0; i < nr; i++)
            sched_dep(s, rcv[i], red);
        free(rcv);
    }
    /* In place, the all-gather lands where the sends above read: the next
     * phases wait for all of phase 1. */
    s->gate = barrier_after(s, from, mine);

    /* 2. Between hosts: a ring per local index, on our segment, in place. */
    if (H > 1) {
        struct coll_args r = ring_args(a, mine, ml);
        int *map = malloc((size_t)H * sizeof(*map));

        if (!map) {
            free(in);
            return mesh_err(-ENOMEM, "out of memory building a hierarchy");
        }
        for (int k = 0; k < H; k++)
            map[k] = h->rank_at[k * L + l];
        from = s->nops;
        s->peer_map = map;
        s->tag_base = 2;
        /* maxseg, not ml: every ring's choice, whatever its segment */
        rc = (maxseg * es <= HIER_RD_MAX ? coll_build_rd_allreduce
                                         : coll_build_ring_allreduce)(
            s, &r, at(scratch, (size_t)(L - 1) * maxseg, es), smr);
        s->peer_map = NULL;
        s->tag_base = 0;
        free(map);
        if (rc < 0) {
            free(in);
            return rc;
        }
        s->gate = barrier_after(s, from, mine);
        if (a->redop == MESH_REDOP_AVG) {
            const void *one[1] = {mine};

            from = s->nops;
            sched_reduce(s, mine, one, 1, ml, (float)a->size);
            s->gate = barrier_after(s, from, mine);
        }
    }

    /* 3. Inside the host: our final segment to every local rank (tag 1),
     * theirs from each. */
    for (int j = 0; j < L; j++) {
        int peer = h->rank_at[hi * L + j];
        size_t js, jl;

        if (j == l)
            continue;
        segment(a->count, L, j, &js, &jl);
        sched_send(s, peer, 1, ms * es, mine, ml * es, a->recv_mr);
        sched_recv(s, peer, 1, js * es, at(a->recvbuf, js, es), jl * es,
                   a->recv_mr);
    }
    s->gate = -1;
    free(in);
    return s->failed ? mesh_err(-ENOMEM, "out of memory building a schedule")
                     : 0;
}

/*
 * Inside the host, (L - 1) / L of the bytes go out and come in twice
 * (memory copies: gamma's order), and the host's sum adds L inputs; between
 * hosts, the ring's terms on a segment of bytes / L over H ranks.
 */
double coll_hier_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    const struct coll_hosts *h = c->hosts;
    double L, H, seg;

    if (!h || !hier_usable(h, c->size))
        return 1e30; /* not a choice here: the ring would run */
    L = h->local;
    H = h->nhosts;
    seg = bytes / L;
    return coll_lat(c, MESH_ALGO_HIER, 2 + 2 * (H - 1)) +
           4 * (L - 1) * seg * m->gamma_s_per_byte +
           (L - 1) * seg * m->gamma_s_per_byte +
           2 * (H - 1) * (seg / H) * m->beta_s_per_byte +
           (H - 1) * (seg / H) * m->gamma_s_per_byte;
}
