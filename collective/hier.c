/*
 * collective/hier.c: the hierarchical all-reduce, for hosts of several
 * ranks (NCCL's rings, Open MPI's han): reduce-scatter inside each host in
 * one hop (every local rank sends segment j to local rank j, over shared
 * memory where the transport has it), then one ring per local index
 * between the hosts on that segment (every NIC carries its share), then
 * all-gather inside each host in one hop. The rules every builder follows
 * are coll-internal.h's.
 *
 * Where every rank of the host has a window (the shm transport's shared
 * memory, mesh_transport_ops.host_window), the steps inside the host go
 * through the windows instead of messages, as local.c's all-reduce does:
 * each rank copies its input into its window once, a host sync, and a
 * rank adds straight from every window; the results come back the same
 * way. Where the buffers are in the host's shared memory, the inputs are
 * read and the outputs written in place instead (build_hier_win). Each
 * host decides for itself: nothing between hosts changes.
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
#include <string.h>

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

/* The rings between hosts (phase 2 of both forms), on our segment mine of
 * ml elements, in place; maxseg: the longest segment. */
static int hier_between(struct sched *s, const struct coll_args *a, char *mine,
                        size_t ml, size_t maxseg, void *scratch, mesh_mr_t *smr)
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype);
    int L = h->local, H = h->nhosts, l = h->local_of[a->rank], from, rc;
    struct coll_args r = ring_args(a, mine, ml);
    int *map = malloc((size_t)H * sizeof(*map));

    if (!map)
        return mesh_err(-ENOMEM, "out of memory building a hierarchy");
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
    if (rc < 0)
        return rc;
    s->gate = barrier_after(s, from, mine);
    if (a->redop == MESH_REDOP_AVG) {
        const void *one[1] = {mine};

        from = s->nops;
        sched_reduce(s, mine, one, 1, ml, (float)a->size);
        s->gate = barrier_after(s, from, mine);
    }
    return 0;
}

/*
 * The host's steps through its windows (local.c's, whose rules for the
 * halves this follows) where every rank of the host has one: in piece c,
 * each rank copies the c-th piece of every segment j into its window (at
 * j's place) and posts a host sync; local rank l then adds the c-th piece
 * of segment l from every window, in local-rank order, into its segment
 * in the receive buffer. After the rings between hosts, each rank copies
 * the c-th piece of its final segment into its window, a host sync, and
 * every rank copies the others' pieces out. One sync per piece and phase,
 * no message inside the host.
 *
 * In place where the buffers are in the host's shared memory (local.c's
 * rules again): from COLL_SHARED_MIN bytes, a first host sync with every
 * rank's two words (coll_host_words). Where every input is there, local
 * rank l adds segment l straight from the L inputs into its receive
 * buffer, with no sync before the rings: the rank that adds a segment is
 * the only one that reads it in any input, and an input's owner writes
 * the other segments of its output (which may be that input) only after
 * a host sync that every rank posts after its sum, or, where every
 * output is there too, the rank of that segment does, after its sum.
 * Where every output is there, local rank l writes its final segment into
 * the L - 1 other outputs itself (put_in_place), and one host sync ends
 * the collective: after it, no one writes our output or reads our input.
 * Every path adds the same inputs in the same order as the copies do: the
 * same bytes on every path, and every rank of the host reads the same
 * words, so all take the same path (each host decides for itself).
 */

/* Where every output is in place: the piece of our final segment we copy
 * into the L - 1 other outputs, while it is in our cache. */
#define HIER_PIECE (128u << 10)

/* Phase 3 with every output in place, out[0..L): our final segment (mine,
 * ms elements in, ml long) into the others' outputs, with streaming stores
 * where the host's buffers outgrow the cache (coll_stream_out: no output
 * line is read in first), a piece at a time; one host sync (tag) at the
 * end. */
static void put_in_place(struct sched *s, const struct coll_args *a, void **out,
                         const char *mine, size_t ms, size_t ml, uint32_t tag)
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype), pc = MESH_MAX(HIER_PIECE / es, 1);
    int L = h->local, l = h->local_of[a->rank];
    int end = sched_sync(s, tag), stream = coll_stream_out(L, a->count * es);

    for (size_t c = 0; c < nchunks(ml, pc); c++) {
        size_t o, pl;

        clip(0, ml, c, pc, &o, &pl);
        for (int j = 0; j < L; j++) {
            void *d = at(out[j], ms + o, es);
            const void *from = at(mine, o, es);

            if (j != l)
                sched_dep(s,
                          stream ? sched_copy_stream(s, d, from, pl * es)
                                 : sched_copy(s, d, from, pl * es),
                          end);
        }
    }
}

static int build_hier_win(struct sched *s, const struct coll_args *a,
                          void *scratch, mesh_mr_t *smr)
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype), half = h->win_len / 2, maxseg, ms,
           ml, pe, np;
    float div =
        a->redop == MESH_REDOP_AVG && h->nhosts == 1 ? (float)a->size : 1.0f;
    int L = h->local, l = h->local_of[a->rank], prev = -1, prev_use = -1;
    int from, rc, *out, ins = 0, outs = 0;
    const void **in, **inp;
    void **outp;
    char *mine;
    uint64_t k;
    void *base;
    size_t len;

    rc = h->ops->host_window(h->t, a->rank, &base, &len, &k);
    if (rc < 0)
        return mesh_err(rc, "allreduce hier: no window of rank %d", a->rank);
    maxseg = (a->count + (size_t)L - 1) / (size_t)L;
    segment(a->count, L, l, &ms, &ml);
    mine = at(a->recvbuf, ms, es);
    pe = MESH_MAX(half / (size_t)L / es, 1);
    if (a->chunk_bytes)
        pe = MESH_MIN(pe, MESH_MAX(a->chunk_bytes / es, 1));
    np = nchunks(maxseg, pe);
    rc = tag_room(np, 2);
    if (rc < 0)
        return rc;
    in = malloc((size_t)L * sizeof(*in));
    out = malloc((size_t)L * sizeof(*out));
    inp = calloc((size_t)L, sizeof(*inp));
    outp = calloc((size_t)L, sizeof(*outp));
    if (!in || !out || !inp || !outp) {
        rc = mesh_err(-ENOMEM, "out of memory building a hierarchy");
        goto out;
    }
    if (h->heap && a->count * es >= COLL_SHARED_MIN) {
        rc = coll_host_words(s, a, h, k, a->count * es, inp, outp, &ins, &outs);
        if (rc < 0)
            goto out;
        k++;
    }

    /* 1. Inside the host: the c-th piece of every segment into our
     * window, a sync, the c-th piece of ours added from every window;
     * or ours added from every input in place. */
    from = s->nops;
    if (ins) {
        for (int j = 0; j < L; j++)
            in[j] = at(inp[j], ms, es);
        sched_reduce(s, mine, in, L, ml, div);
    }
    for (size_t c = 0; c < (ins ? 0 : np); c++) {
        size_t ha = (size_t)((k + 1) % 2) * half, o, pl;
        int sync, red;

        sync = sched_sync(s, (uint32_t)(2 * c));
        for (int j = 0; j < L; j++) {
            size_t js, jl;
            int cin;

            if (j == l)
                continue; /* ours: added from where it is */
            segment(a->count, L, j, &js, &jl);
            clip(js, jl, c, pe, &o, &pl);
            cin = sched_copy(s, (char *)h->win[l] + ha + (size_t)j * pe * es,
                             at(a->sendbuf, o, es), pl * es);
            sched_dep(s, prev, cin);
            sched_dep(s, cin, sync);
        }
        /* what we read of the last piece, before the others overwrite it */
        sched_dep(s, prev_use, sync);
        clip(0, ml, c, pe, &o, &pl);
        for (int j = 0; j < L; j++)
            in[j] = (char *)h->win[j] + ha + (size_t)l * pe * es;
        in[l] = at(a->sendbuf, ms + o, es);
        red = sched_reduce(s, at(mine, o, es), in, L, pl, div);
        sched_dep(s, sync, red);
        prev = sync;
        prev_use = red;
        k++;
    }
    s->gate = barrier_after(s, from, mine);

    /* 2. Between hosts: a ring per local index, on our segment. */
    if (h->nhosts > 1) {
        rc = hier_between(s, a, mine, ml, maxseg, scratch, smr);
        if (rc < 0)
            goto out;
    }

    /* 3. Inside the host: the c-th piece of our final segment into our
     * window, a sync, every other segment's piece out of its owner's; or
     * ours into every output in place. */
    if (outs)
        put_in_place(s, a, outp, mine, ms, ml, 1);
    for (int j = 0; j < L; j++)
        out[j] = -1;
    for (size_t c = 0; c < (outs ? 0 : np); c++) {
        size_t hb = (size_t)((k + 1) % 2) * half, o, pl;
        int sync, cp;

        clip(0, ml, c, pe, &o, &pl);
        cp = sched_copy(s, (char *)h->win[l] + hb, at(mine, o, es), pl * es);
        sched_dep(s, prev, cp);
        sync = sched_sync(s, (uint32_t)(2 * c + 1));
        sched_dep(s, cp, sync);
        for (int j = 0; j < L; j++)
            sched_dep(s, out[j], sync);
        for (int j = 0; j < L; j++) {
            size_t js, jl;

            if (j == l)
                continue;
            segment(a->count, L, j, &js, &jl);
            clip(js, jl, c, pe, &o, &pl);
            out[j] = sched_copy(s, at(a->recvbuf, o, es),
                                (char *)h->win[j] + hb, pl * es);
            sched_dep(s, sync, out[j]);
        }
        prev = sync;
        k++;
    }
    s->gate = -1;
    rc = s->failed ? mesh_err(-ENOMEM, "out of memory building a schedule") : 0;
out:
    free(in);
    free(out);
    free(inp);
    free(outp);
    return rc;
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
    if (h->win)
        return build_hier_win(s, a, scratch, smr);
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
        rc = hier_between(s, a, mine, ml, maxseg, scratch, smr);
        if (rc < 0) {
            free(in);
            return rc;
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
 * Inside the host, what a rank moves of its segment's share (gamma's
 * order): L - 1 segments go out and come in twice, 4 (L - 1) copies
 * (through messages: into a slot and out of it; through the windows
 * fewer, 2 L - 1, but the model keeps the messages' count there, beside
 * which local's cost was set); in place (the buffers in the host's
 * shared memory, from COLL_SHARED_MIN bytes: build_hier_win), none in
 * and L - 1 streamed out. The host's sum adds L inputs. Between hosts,
 * the ring's terms on a segment of bytes / L over H ranks, or recursive
 * doubling's on the segment where it is small. The latency: 2 hops
 * inside the host (coll_local_hop) and the hops between hosts, plus each
 * local phase's extra messages at a rank and the L - 1 other rings'
 * messages through the host's NIC and cores (COLL_MSG_HOP each).
 */
double coll_hier_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    const struct coll_hosts *h = c->hosts;
    double L, H, seg, between, hops, rd, copies, cost;
    int extra, rounds;

    if (!h || !hier_usable(h, c->size))
        return 1e30; /* not a choice here: the ring would run */
    L = h->local;
    H = h->nhosts;
    seg = bytes / L;
    rounds = coll_rd_rounds(h->nhosts, &extra);
    rd = H > 1 && seg <= HIER_RD_MAX;
    hops = H < 2 ? 0 : rd ? rounds + 2 * (extra > 0) : 2 * (H - 1);
    between = rd ? hops * seg * m->beta_s_per_byte +
                       (rounds + (extra > 0)) * seg * m->gamma_s_per_byte
                 : 2 * (H - 1) * (seg / H) * m->beta_s_per_byte +
                       (H - 1) * (seg / H) * m->gamma_s_per_byte;
    copies = h->win && h->heap && c->in_place && bytes >= COLL_SHARED_MIN
                 ? L - 1
                 : 4 * (L - 1);
    cost = coll_lat(c, MESH_ALGO_HIER,
                    2 * coll_local_hop(c) + hops +
                        COLL_MSG_HOP * (4 * (L - 2) + (L - 1) * hops)) +
           copies * seg * m->gamma_s_per_byte +
           (L - 1) * seg * m->gamma_s_per_byte + between;
    /* one host with windows, in place: local's steps, and local's cost;
     * the tie goes to local, whatever the rounding */
    return H < 2 && copies < 4 * (L - 1) ? cost * (1 + 1e-9) : cost;
}

/* ---- hierarchical forms of the tree and of recursive doubling ------------ */

/*
 * Usable: equal hosts of at least two ranks (else the flat algorithm
 * runs, which is the same thing with hosts of one rank).
 */
static int lead_usable(const struct coll_hosts *h, int size)
{
    return h && h->local >= 2 && h->nhosts * h->local == size;
}

/* The leaders' all-reduce (one rank per host) on the whole message,
 * in place in the receive buffer. */
static struct coll_args lead_args(const struct coll_args *a)
{
    struct coll_args r = *a;

    r.op = MESH_OP_ALLREDUCE;
    r.redop = MESH_REDOP_SUM; /* the average divides after the hosts' step */
    r.rank = a->hosts->host_of[a->rank];
    r.size = a->hosts->nhosts;
    r.sendbuf = a->recvbuf;
    r.send_mr = a->recv_mr;
    r.hosts = NULL;
    return r;
}

static size_t lead_scratch(const struct coll_args *a,
                           size_t (*flat)(const struct coll_args *a))
{
    const struct coll_hosts *h = a->hosts;
    struct coll_args r;

    if (!lead_usable(h, a->size))
        return flat(a);
    if (h->local_of[a->rank] != 0)
        return 0;
    r = lead_args(a);
    return (size_t)(h->local - 1) * a->count * mesh_dtype_size(a->dtype) +
           (h->nhosts > 1 ? flat(&r) : 0);
}

size_t coll_htree_scratch(const struct coll_args *a)
{
    return lead_scratch(a, coll_tree_scratch);
}

size_t coll_hrd_scratch(const struct coll_args *a)
{
    return lead_scratch(a, coll_rd_scratch);
}

/* The leaders' all-reduce between the hosts (a leader's phase 2 of both
 * forms), in place in the receive buffer; an average divides after it. */
static int lead_between(struct sched *s, const struct coll_args *a,
                        void *scratch, mesh_mr_t *smr,
                        int (*between)(struct sched *s,
                                       const struct coll_args *a, void *scratch,
                                       mesh_mr_t *smr))
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype), n = a->count;
    int L = h->local, H = h->nhosts, from, rc;
    struct coll_args r = lead_args(a);
    int *map = malloc((size_t)H * sizeof(*map));

    if (!map)
        return mesh_err(-ENOMEM, "out of memory building a hierarchy");
    for (int k = 0; k < H; k++)
        map[k] = h->rank_at[k * L];
    from = s->nops;
    s->peer_map = map;
    s->tag_base = 2;
    rc = between(s, &r, at(scratch, (size_t)(L - 1) * n, es), smr);
    s->peer_map = NULL;
    s->tag_base = 0;
    free(map);
    if (rc < 0)
        return rc;
    s->gate = barrier_after(s, from, a->recvbuf);
    if (a->redop == MESH_REDOP_AVG) {
        const void *one[1] = {a->recvbuf};

        from = s->nops;
        sched_reduce(s, a->recvbuf, one, 1, n, (float)a->size);
        s->gate = barrier_after(s, from, a->recvbuf);
    }
    return 0;
}

/*
 * The leader form through the host's windows (local.c's rules for the
 * halves) where every rank of the host has one: in chunk c of half a
 * window, every rank copies its input's chunk into its window and posts a
 * host sync, and the leader adds the L chunks in local-rank order into
 * its receive buffer; the leaders' all-reduce between the hosts; then in
 * chunk c the leader copies the result's chunk into its window, a host
 * sync, and every member copies it out. One sync per chunk and phase, no
 * message inside the host.
 *
 * In place where the buffers are in the host's shared memory (as hier's
 * form above): from COLL_SHARED_MIN bytes, a first host sync with every
 * rank's two words. Where every input is there, the leader adds the L
 * inputs straight into its receive buffer, with no sync: a member writes
 * its output (which may be its input) only after a host sync that the
 * leader posts after its sum. Where the leader's output is there, a host
 * sync once it holds the result, every member copies it from there, and
 * a host sync after which the leader may write it again. The same inputs
 * added in the same order on every path: the same bytes.
 */
static int build_lead_win(struct sched *s, const struct coll_args *a,
                          void *scratch, mesh_mr_t *smr,
                          int (*between)(struct sched *s,
                                         const struct coll_args *a,
                                         void *scratch, mesh_mr_t *smr))
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype), half = h->win_len / 2, ce, nch;
    float div =
        a->redop == MESH_REDOP_AVG && h->nhosts == 1 ? (float)a->size : 1.0f;
    int L = h->local, l = h->local_of[a->rank], prev = -1, prev_use = -1;
    int from, rc, lead = l == 0, ins = 0, outs = 0;
    const void **in, **inp;
    void **outp;
    uint64_t k;
    void *base;
    size_t len;

    rc = h->ops->host_window(h->t, a->rank, &base, &len, &k);
    if (rc < 0)
        return mesh_err(rc, "allreduce: no window of rank %d", a->rank);
    ce = MESH_MAX(half / es, 1);
    if (a->chunk_bytes)
        ce = MESH_MIN(ce, MESH_MAX(a->chunk_bytes / es, 1));
    nch = nchunks(a->count, ce);
    rc = tag_room(nch, 2);
    if (rc < 0)
        return rc;
    in = malloc((size_t)L * sizeof(*in));
    inp = calloc((size_t)L, sizeof(*inp));
    outp = calloc((size_t)L, sizeof(*outp));
    if (!in || !inp || !outp) {
        rc = mesh_err(-ENOMEM, "out of memory building a hierarchy");
        goto out;
    }
    if (h->heap && a->count * es >= COLL_SHARED_MIN) {
        rc = coll_host_words(s, a, h, k, a->count * es, inp, outp, &ins, &outs);
        if (rc < 0)
            goto out;
        k++;
    }

    /* 1. Every input's chunk into its window; the leader adds them. Or
     * the leader adds the inputs in place. */
    from = s->nops;
    if (ins && lead)
        sched_reduce(s, a->recvbuf, inp, L, a->count, div);
    for (size_t c = 0; c < (ins ? 0 : nch); c++) {
        size_t ha = (size_t)((k + 1) % 2) * half, o, cl;
        int cin, sync;

        clip(0, a->count, c, ce, &o, &cl);
        sync = sched_sync(s, (uint32_t)(2 * c));
        if (!lead) { /* the leader adds its own from where it is */
            cin = sched_copy(s, (char *)h->win[l] + ha, at(a->sendbuf, o, es),
                             cl * es);
            sched_dep(s, prev, cin);
            sched_dep(s, cin, sync);
        }
        sched_dep(s, prev_use, sync);
        if (lead) {
            for (int j = 0; j < L; j++)
                in[j] = (char *)h->win[j] + ha;
            in[0] = at(a->sendbuf, o, es);
            prev_use = sched_reduce(s, at(a->recvbuf, o, es), in, L, cl, div);
            sched_dep(s, sync, prev_use);
        }
        prev = sync;
        k++;
    }
    s->gate = barrier_after(s, from, a->recvbuf);

    /* 2. Between the hosts: the leaders' all-reduce, in place. */
    if (lead && h->nhosts > 1) {
        rc = lead_between(s, a, scratch, smr, between);
        if (rc < 0)
            goto out;
    }

    /* 3. The leader's result, chunk by chunk, through its window; or
     * from its output in place, between two syncs. */
    if (outp[0]) {
        int ready = sched_sync(s, 1), done = sched_sync(s, 3), cp = -1;

        if (!lead)
            cp = sched_copy_stream(s, a->recvbuf, outp[0], a->count * es);
        sched_dep(s, ready, cp);
        sched_dep(s, cp, done);
        sched_dep(s, ready, done);
        nch = 0;
    }
    prev_use = -1;
    for (size_t c = 0; c < nch; c++) {
        size_t hb = (size_t)((k + 1) % 2) * half, o, cl;
        int cp = -1, sync;

        clip(0, a->count, c, ce, &o, &cl);
        if (lead) {
            cp = sched_copy(s, (char *)h->win[0] + hb, at(a->recvbuf, o, es),
                            cl * es);
            sched_dep(s, prev, cp);
        }
        sync = sched_sync(s, (uint32_t)(2 * c + 1));
        sched_dep(s, cp, sync);
        sched_dep(s, prev_use, sync);
        if (!lead) {
            prev_use = sched_copy(s, at(a->recvbuf, o, es),
                                  (char *)h->win[0] + hb, cl * es);
            sched_dep(s, sync, prev_use);
        }
        prev = sync;
        k++;
    }
    s->gate = -1;
    rc = s->failed ? mesh_err(-ENOMEM, "out of memory building a schedule") : 0;
out:
    free(in);
    free(inp);
    free(outp);
    return rc;
}

/*
 * The leader form (Open MPI han's and MVAPICH's small-message all-reduce):
 * every rank of a host sends its whole message to the host's leader (its
 * local rank 0) in one hop, over shared memory where the transport has it,
 * and the leader adds the L inputs in local-rank order; the leaders run
 * `between` (the double binary tree or recursive doubling) among the hosts
 * on the whole message; each leader sends the result to its host's ranks.
 * 2 local hops plus the leaders' hops, and a NIC carries one rank's share
 * instead of L: for small messages, where every message's latency and CPU
 * cost count. Where the hosts differ in size, or hold one rank each, the
 * flat `between` runs.
 */
static int build_lead(struct sched *s, const struct coll_args *a, void *scratch,
                      mesh_mr_t *smr,
                      int (*between)(struct sched *s, const struct coll_args *a,
                                     void *scratch, mesh_mr_t *smr))
{
    const struct coll_hosts *h = a->hosts;
    size_t es = mesh_dtype_size(a->dtype), n = a->count;
    float div = a->redop == MESH_REDOP_AVG ? (float)a->size : 1.0f;
    int L, H, hi, lead, from, rc;

    if (!lead_usable(h, a->size))
        return between(s, a, scratch, smr);
    if (h->win)
        return build_lead_win(s, a, scratch, smr, between);
    L = h->local;
    H = h->nhosts;
    hi = h->host_of[a->rank];
    lead = h->rank_at[hi * L];
    if (h->local_of[a->rank] != 0) {
        /* a member: ours to the leader (tag 0), the result back (tag 1);
         * in place, the result lands where the send reads */
        int snd = sched_send(s, lead, 0, 0, a->sendbuf, n * es, a->send_mr);
        int rcv = sched_recv(s, lead, 1, 0, a->recvbuf, n * es, a->recv_mr);

        if (a->sendbuf == a->recvbuf)
            sched_dep(s, snd, rcv);
        return s->failed
                   ? mesh_err(-ENOMEM, "out of memory building a schedule")
                   : 0;
    }

    /* 1. The host's sum, ours first, then the members' in local order; an
     * average divides at the last addition (here with one host, else after
     * the hosts' step). */
    {
        const void **in = malloc((size_t)L * sizeof(*in));
        int *rcv = malloc((size_t)L * sizeof(*rcv)), red;

        if (!in || !rcv) {
            free(in);
            free(rcv);
            return mesh_err(-ENOMEM, "out of memory building a hierarchy");
        }
        from = s->nops;
        in[0] = a->sendbuf;
        for (int j = 1; j < L; j++) {
            char *slot = at(scratch, (size_t)(j - 1) * n, es);

            in[j] = slot;
            rcv[j] =
                sched_recv(s, h->rank_at[hi * L + j], 0, 0, slot, n * es, smr);
        }
        red = sched_reduce(s, a->recvbuf, in, L, n, H > 1 ? 1.0f : div);
        for (int j = 1; j < L; j++)
            sched_dep(s, rcv[j], red);
        free(rcv);
        free(in);
        s->gate = barrier_after(s, from, a->recvbuf);
    }

    /* 2. Between the hosts: the leaders' all-reduce, in place. */
    if (H > 1) {
        rc = lead_between(s, a, scratch, smr, between);
        if (rc < 0)
            return rc;
    }

    /* 3. The result to every member of the host (tag 1). */
    for (int j = 1; j < L; j++)
        sched_send(s, h->rank_at[hi * L + j], 1, 0, a->recvbuf, n * es,
                   a->recv_mr);
    s->gate = -1;
    return s->failed ? mesh_err(-ENOMEM, "out of memory building a schedule")
                     : 0;
}

int coll_build_htree_allreduce(struct sched *s, const struct coll_args *a,
                               void *scratch, mesh_mr_t *smr)
{
    return build_lead(s, a, scratch, smr, coll_build_tree_allreduce);
}

int coll_build_hrd_allreduce(struct sched *s, const struct coll_args *a,
                             void *scratch, mesh_mr_t *smr)
{
    return build_lead(s, a, scratch, smr, coll_build_rd_allreduce);
}

/*
 * The leader's load: (L - 1) messages in and out over shared memory
 * (copies: gamma's order) and L inputs added; the leaders' algorithm on
 * the whole message between the hosts (the flat cost over H ranks). The
 * latency: 2 local hops, the leaders' hops, and the leader's extra
 * messages in each local phase.
 */
static double lead_cost(const struct coll_shape *c, double bytes, int algo,
                        double (*flat)(const struct coll_shape *c,
                                       double bytes))
{
    const struct mesh_coll_model *m = c->model;
    const struct coll_hosts *h = c->hosts;
    double L, hops = 0, bw = 0;

    if (!h || !lead_usable(h, c->size))
        return 1e30; /* not a choice here: the flat algorithm would run */
    L = h->local;
    if (h->nhosts > 1 && m->alpha_s > 0) {
        /* the leaders' flat cost over H ranks, split into its hops (its
         * cost at 0 bytes, from the model's alpha alone) and the rest */
        struct mesh_coll_model lm = *m;
        struct coll_shape ls = {.model = &lm, .size = h->nhosts};
        double at0;

        memset(lm.lat_s, 0, sizeof(lm.lat_s));
        coll_tree_shape(h->nhosts, &ls.tree_depth, &ls.tree_load);
        ls.rd_rounds = coll_rd_rounds(h->nhosts, &ls.rd_extra);
        at0 = flat(&ls, 0);
        hops = at0 / m->alpha_s;
        bw = flat(&ls, bytes) - at0;
    }
    return coll_lat(c, algo,
                    2 * coll_local_hop(c) + hops + COLL_MSG_HOP * 2 * (L - 2)) +
           bw + 3 * (L - 1) * bytes * m->gamma_s_per_byte;
}

double coll_htree_cost(const struct coll_shape *c, double bytes)
{
    return lead_cost(c, bytes, MESH_ALGO_HTREE, coll_tree_cost);
}

double coll_hrd_cost(const struct coll_shape *c, double bytes)
{
    return lead_cost(c, bytes, MESH_ALGO_HRD, coll_rd_cost);
}
