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
 * In place where the buffers are in the host's shared memory (the
 * transport's shares, where mesh_coll_buf_alloc puts them; NCCL's
 * user-buffer registration): from COLL_SHARED_MIN bytes, a first host
 * sync carries each rank's two words, where its input and its output lie
 * in its share (or LOCAL_NOWHERE). Where every rank's input and output
 * are there, nothing goes through a window: each rank adds its slice
 * straight from the L inputs into its output and copies it from there
 * into the L - 1 other outputs, then one host sync (build_direct); where
 * only the inputs are, each adds its slice of a chunk from the L inputs
 * into a half of its window, a host sync, and each copies the L sums out
 * (build_in_place; a chunk is L half windows, so one sync each); else the
 * copies above, after that first sync. Every rank reads the same words,
 * so every rank takes the same path, and each slice is added in the same
 * order on every path.
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
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define LOCAL_NOWHERE UINT64_MAX
/* The tag of that first sync (the chunks' tags count up from 0). */
#define LOCAL_TAG_WORDS UINT32_MAX
/* Where every output is in place too: the piece a rank adds, then copies
 * to the others from its cache. */
#define LOCAL_PIECE (128u << 10)

/* Usable: every rank on one host, each with a window (else hier runs). */
static int local_usable(const struct coll_hosts *h, int size)
{
    return h && h->win && h->nhosts == 1 && h->local == size && size >= 2;
}

size_t coll_local_scratch(const struct coll_args *a)
{
    return local_usable(a->hosts, a->size) ? 0 : coll_hier_scratch(a);
}

/* Where [p, p + bytes) lies in share j, or LOCAL_NOWHERE. */
static uint64_t share_offset(const struct coll_hosts *h, int j, const void *p,
                             size_t bytes)
{
    const char *b = h->heap[j], *q = p;

    if (!q || q < b || (size_t)(q - b) > h->heap_len ||
        bytes > h->heap_len - (size_t)(q - b))
        return LOCAL_NOWHERE;
    return (uint64_t)(q - b);
}

/* One number from a sysfs file of cpu0's cache index i: 0 where none. */
static unsigned long cache_attr(int i, const char *name)
{
    char path[96], line[32], unit = 0;
    unsigned long v = 0;
    FILE *f;

    snprintf(path, sizeof(path),
             "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, name);
    f = fopen(path, "r");
    if (!f)
        return 0;
    if (!fgets(line, sizeof(line), f) || sscanf(line, "%lu%c", &v, &unit) < 1)
        v = 0;
    fclose(f);
    return v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
}

/*
 * The last-level cache's bytes, from sysfs (glibc's sysconf said 320 MiB
 * for this machine's 32 MiB L3, as the hypervisor's CPUID has it); 8 MiB
 * where it does not say.
 */
static size_t llc_bytes(void)
{
    static atomic_size_t llc; /* racing first calls store the same */
    size_t b = atomic_load(&llc);
    unsigned long best = 0;

    if (b)
        return b;
    for (int i = 0; i < 16; i++) {
        unsigned long level = cache_attr(i, "level"), size;

        if (!level)
            break;
        size = cache_attr(i, "size");
        if (level > best && size) {
            best = level;
            b = size;
        }
    }
    if (!b)
        b = (size_t)8 << 20;
    atomic_store(&llc, b);
    return b;
}

int coll_stream_out(int local, size_t bytes)
{
    return 2.0 * (double)local * (double)bytes > (double)llc_bytes();
}

/*
 * Our two words at host sync k + 1 (coll-internal.h): where our input and
 * our output lie in our share (LOCAL_NOWHERE: not there, or the output
 * overlaps the input without being it, which the order of writes of the
 * paths in place does not allow).
 */
int coll_host_words(struct sched *s, const struct coll_args *a,
                    const struct coll_hosts *h, uint64_t k, size_t bytes,
                    const void **in, void **out, int *ins, int *outs)
{
    struct sched w;
    int L = h->local, me = h->local_of[a->rank], hi = h->host_of[a->rank];
    int apart = a->recvbuf == a->sendbuf || recv_apart(a), i, rc;

    sched_init(&w, s->seq, s->op, s->dtype, s->count);
    i = sched_sync(&w, LOCAL_TAG_WORDS);
    if (i >= 0) {
        w.ops[i].offset =
            apart ? share_offset(h, me, a->sendbuf, bytes) : LOCAL_NOWHERE;
        w.ops[i].len =
            apart ? share_offset(h, me, a->recvbuf, bytes) : LOCAL_NOWHERE;
    }
    rc = sched_run(&w, h->ops, h->t);
    sched_free(&w);
    if (rc < 0)
        return rc;
    *ins = *outs = 1;
    for (int j = 0; j < L; j++) {
        uint64_t word[2];

        rc = h->ops->host_sync_word(h->t, h->rank_at[hi * L + j], k + 1, word);
        if (rc < 0)
            return mesh_err(rc, "allreduce: rank %d's words at host sync #%llu",
                            h->rank_at[hi * L + j],
                            (unsigned long long)(k + 1));
        for (int d = 0; d < 2; d++) {
            int *all = d ? outs : ins;

            if (word[d] == LOCAL_NOWHERE || word[d] > h->heap_len ||
                bytes > h->heap_len - word[d])
                *all = 0;
            else if (d)
                out[j] = (char *)h->heap[j] + word[d];
            else
                in[j] = (const char *)h->heap[j] + word[d];
        }
    }
    return 0;
}

/*
 * Every input and output in place (in, out; ours at [me]): piece by
 * piece, we add our slice straight from the L inputs into the start of
 * our window (a piece fits the cache), copy the sum from there into the L
 * outputs, with streaming stores where the host's buffers outgrow the
 * cache (coll_stream_out: no output line is read in first, where a plain
 * copy reads each before it writes it), and post one host sync at
 * the end, after which no one writes our output or reads our input any
 * more. Our slice of every input and output is ours alone until then: the
 * rank that adds a slice is the only one that reads it in any input (an
 * output that is its input included) and the only one that writes it
 * anywhere. Our window is ours too: every rank has passed the first sync,
 * so has read what we published there before, and this path publishes
 * nothing in it.
 */
static int build_direct(struct sched *s, const struct coll_args *a,
                        const struct coll_hosts *h, const void **in, void **out)
{
    size_t es = mesh_dtype_size(a->dtype), ce, nch, ms, ml;
    float div = a->redop == MESH_REDOP_AVG ? (float)a->size : 1.0f;
    int L = h->local, me = h->local_of[a->rank], end,
        stream = coll_stream_out(L, a->count * es);
    const void **src = malloc((size_t)L * sizeof(*src));
    int *cp = malloc((size_t)L * sizeof(*cp));
    char *piece = h->win[me];

    if (!src || !cp) {
        free(src);
        free(cp);
        return mesh_err(-ENOMEM, "out of memory building a local all-reduce");
    }
    for (int j = 0; j < L; j++)
        cp[j] = -1;
    segment(a->count, L, me, &ms, &ml);
    ce = MESH_MAX(MESH_MIN(LOCAL_PIECE, h->win_len) / es, 1);
    if (a->chunk_bytes)
        ce = MESH_MIN(ce, MESH_MAX(a->chunk_bytes / es, 1));
    nch = nchunks(ml, ce);
    end = sched_sync(s, 0);
    for (size_t c = 0; c < nch; c++) {
        size_t o, l;
        int red;

        clip(ms, ml, c, ce, &o, &l);
        for (int j = 0; j < L; j++)
            src[j] = (const char *)in[j] + o * es;
        red = sched_reduce(s, piece, src, L, l, div);
        /* after the piece before's copies, which read the window */
        for (int j = 0; j < L; j++)
            sched_dep(s, cp[j], red);
        for (int j = 0; j < L; j++) {
            cp[j] = (stream ? sched_copy_stream : sched_copy)(
                s, (char *)out[j] + o * es, piece, l * es);
            sched_dep(s, red, cp[j]);
            sched_dep(s, cp[j], end);
        }
    }
    free(src);
    free(cp);
    return s->failed ? mesh_err(-ENOMEM, "out of memory building a schedule")
                     : 0;
}

/*
 * Every input in place in[0..L) (ours at in[me]), k host syncs so far:
 * per chunk of L half windows, our slice's sum from the L inputs into
 * the half of the sync that publishes it, that sync, the L sums out.
 */
static int build_in_place(struct sched *s, const struct coll_args *a,
                          const struct coll_hosts *h, uint64_t k,
                          const void **in)
{
    size_t es = mesh_dtype_size(a->dtype), half = h->win_len / 2, ce, nch;
    float div = a->redop == MESH_REDOP_AVG ? (float)a->size : 1.0f;
    int L = h->local, me = h->local_of[a->rank], prev = -1, *out, rc;
    const void **src;

    ce = MESH_MAX(half / es, 1) * (size_t)L;
    if (a->chunk_bytes)
        ce = MESH_MIN(ce, MESH_MAX(a->chunk_bytes / es, 1));
    nch = nchunks(a->count, ce);
    rc = tag_room(nch, 1);
    if (rc < 0)
        return rc;
    src = malloc((size_t)L * sizeof(*src));
    out = malloc((size_t)L * sizeof(*out));
    if (!src || !out) {
        free(src);
        free(out);
        return mesh_err(-ENOMEM, "out of memory building a local all-reduce");
    }
    for (int j = 0; j < L; j++)
        out[j] = -1;
    for (size_t c = 0; c < nch; c++) {
        /* published by sync k + 1, in its half; after sync k, when every
         * rank has read what sync k - 1 published there */
        size_t hb = (size_t)((k + 1) % 2) * half, o, l, ms, ml;
        int red, sb;

        clip(0, a->count, c, ce, &o, &l);
        segment(l, L, me, &ms, &ml);
        for (int j = 0; j < L; j++)
            src[j] = (const char *)in[j] + (o + ms) * es;
        red = sched_reduce(s, (char *)h->win[me] + hb, src, L, ml, div);
        sched_dep(s, prev, red);
        sb = sched_sync(s, (uint32_t)c);
        sched_dep(s, red, sb);
        /* the sums of the chunk before read before we post this one */
        for (int j = 0; j < L; j++)
            sched_dep(s, out[j], sb);
        for (int j = 0; j < L; j++) {
            size_t js, jl;

            segment(l, L, j, &js, &jl);
            out[j] = sched_copy(s, at(a->recvbuf, o + js, es),
                                (char *)h->win[j] + hb, jl * es);
            sched_dep(s, sb, out[j]);
        }
        prev = sb;
        k++;
    }
    free(src);
    free(out);
    return s->failed ? mesh_err(-ENOMEM, "out of memory building a schedule")
                     : 0;
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
    if (h->heap && a->count * es >= COLL_SHARED_MIN) {
        const void **inp = malloc((size_t)h->local * sizeof(*inp));
        void **outp = malloc((size_t)h->local * sizeof(*outp));
        int ins = 0, outs = 0;

        rc = inp && outp ? coll_host_words(s, a, h, k, a->count * es, inp, outp,
                                           &ins, &outs)
                         : mesh_err(-ENOMEM, "out of memory building a "
                                             "local all-reduce");
        k++;
        if (rc == 0 && ins && outs)
            rc = build_direct(s, a, h, inp, outp);
        else if (rc == 0 && ins)
            rc = build_in_place(s, a, h, k, inp);
        free(inp);
        free(outp);
        if (rc < 0 || ins)
            return rc;
    }
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
 * byte each, gamma's order), or in place (the buffers in the host's
 * shared memory, from COLL_SHARED_MIN bytes: build_direct) only the
 * slice into the L - 1 other outputs; the slice's sum adds L inputs; two
 * host syncs per chunk of half a window, a hop each (the chunk:
 * COLL_CHUNK_MAX, the model's stand-in for the transport's half window),
 * or in place the two of one.
 */
double coll_local_cost(const struct coll_shape *c, double bytes)
{
    const struct mesh_coll_model *m = c->model;
    const struct coll_hosts *h = c->hosts;
    double L, chunks, in;

    if (!h || !local_usable(h, c->size))
        return 1e30; /* not a choice here: hier would run */
    L = h->local;
    in = c->in_place && h->heap && bytes >= COLL_SHARED_MIN ? 0 : bytes;
    /* in place, one host sync ends it whatever the size */
    chunks = in > 0 ? MESH_MAX(1.0, bytes / (double)COLL_CHUNK_MAX) : 1.0;
    return coll_lat(c, MESH_ALGO_LOCAL, 2.0) +
           2.0 * (chunks - 1.0) * m->alpha_s +
           (in + 2.0 * (L - 1.0) / L * bytes) * m->gamma_s_per_byte;
}
