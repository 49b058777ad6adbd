/*
 * tests/fuzz_frames.c: hostile data frames from peers (transport/base.c's
 * checks, as transport/tcp/data.c applies them to each frame header that
 * arrives). Rank 0 of a world of 4 runs collective seq 100 (1 to 99 done;
 * seqs from 1 are its owner's, transport.h's seq_done), whose
 * shape the first 4 bytes choose (op, dtype, element count, receives per
 * peer); every receive is posted. The rest of the input is frames, 49
 * bytes each: the sender (1 + byte % 3, one stream each) and a 48-byte
 * header in the tcp layout (transport/tcp/tcp.h). Each goes through what
 * tcp does: the header's checks, tp_frame_check, tp_frame_match against
 * the sender's posted receives in order, and for a frame no receive takes
 * tp_frame_unmatched (a frame that waits parks the sender's stream; one
 * of a later part ahead of frames still due fails, tp_fail_order).
 * Checked: a frame a receive takes lands inside it, never past what is
 * left of it; a failure names the sender (its rank and address).
 */
#include "config.h"

#include "tests/fuzz.h"
#include "transport/base.h"
#include "transport/tcp/tcp.h"
#include "common/bytes.h"
#include "common/dtype.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

const char fuzz_name[] = "frames";

#define WORLD 4
#define SEQ   100
#define MAXRX 8 /* receives per peer */

struct rx {
    struct tp_req req; /* its frame: what is expected */
    uint64_t claimed;  /* bytes of it that frames took */
    int done;
};

static void failed(struct tp_base *b, int culprit, int code, int notify,
                   const char *reason)
{
    (void)b;
    (void)culprit;
    (void)code;
    (void)notify;
    (void)reason;
}

static void req_free(struct tp_base *b, struct tp_req *r, int f)
{
    (void)b;
    (void)r;
    (void)f;
}

static const struct tp_base_ops ops = {.failed = failed, .req_free = req_free};

/* The job failed: the answer, which must name the sender. */
static void refused(struct tp_base *b, int sender)
{
    char who[32];

    if (!b->fail.failed)
        fuzz_fail("a check refused a frame without failing the job");
    if (b->fail.culprit != sender)
        fuzz_fail("rank %d blamed for rank %d's frame: %s", b->fail.culprit,
                  sender, b->fail.msg);
    snprintf(who, sizeof(who), "rank %d (", sender);
    fuzz_answer(tp_fail_err(b), (const char *const[]){who}, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    static const int opv[] = {MESH_OP_ALLREDUCE, MESH_OP_REDUCE_SCATTER,
                              MESH_OP_ALLGATHER, MESH_OP_BROADCAST};
    struct mesh_peer peers[WORLD];
    struct mesh_world w = {.rank = 0, .size = WORLD, .peers = peers};
    struct mesh_transport_opts topts = {0};
    struct mesh_expect exp[WORLD * MAXRX];
    struct rx rx[WORLD][MAXRX];
    struct mesh_frame part = {0};
    struct tp_base b;
    int nrx, parked[WORLD] = {0}, nexp = 0;
    uint64_t bytes, es;

    memset(&b, 0, sizeof(b));
    memset(peers, 0, sizeof(peers));
    for (int r = 0; r < WORLD; r++) {
        snprintf(peers[r].host, sizeof(peers[r].host), "10.0.0.%d", r + 1);
        peers[r].port = (uint16_t)(29400 + r);
    }
    mesh_err_clear();
    fuzz_answer(0, NULL, 0);
    if (len < 4 || tp_base_init(&b, "tcp", &ops, &w, &topts) < 0)
        goto out;
    /* the collective: its shape, and each peer's receives (consecutive
     * slices of its block of the bytes) */
    part.seq = SEQ;
    part.op = (uint8_t)opv[data[0] % 4];
    part.dtype = data[0] / 4 % 2 ? MESH_DT_F32 : MESH_DT_F16;
    part.count = 1 + (uint64_t)(data[1] | data[2] << 8);
    es = mesh_dtype_size(part.dtype);
    bytes = part.count * es;
    nrx = 1 + data[3] % MAXRX;
    tp_seq_done(&b, 1, SEQ); /* collectives 1 to SEQ - 1 done */
    memset(rx, 0, sizeof(rx));
    for (int p = 1; p < WORLD; p++)
        for (int i = 0; i < nrx; i++) {
            struct rx *x = &rx[p][i];
            uint64_t lo = bytes * (uint64_t)i / (uint64_t)nrx;
            uint64_t hi = bytes * (uint64_t)(i + 1) / (uint64_t)nrx;

            x->req.kind = TP_RECV;
            x->req.peer = p;
            x->req.f = part;
            x->req.f.tag = (uint32_t)i;
            x->req.f.offset = lo;
            x->req.f.length = hi - lo;
            exp[nexp++] = (struct mesh_expect){
                .peer = p, .tag = (uint32_t)i, .offset = lo, .length = hi - lo};
        }
    tp_expect(&b, &part, exp, (size_t)nexp);
    for (size_t at = 4; at + 49 <= len; at += 49) {
        int s = 1 + data[at] % (WORLD - 1), m = 0, u;
        struct mesh_frame f = {0};

        if (parked[s])
            continue; /* its stream reads nothing more */
        if (tcp_frame_decode(data + at + 1, &f) < 0) {
            tp_fail_job(&b, s, -EPROTO, 1,
                        "rank %d (%s:%d) sent garbage on data stream 1 "
                        "(bad frame header)",
                        s, peers[s].host, peers[s].port);
            refused(&b, s);
            goto out;
        }
        if (tp_frame_check(&b, s, &f) < 0) {
            refused(&b, s);
            goto out;
        }
        for (int i = 0; i < nrx && !m; i++) {
            struct rx *x = &rx[s][i];
            const struct mesh_frame *e = &x->req.f;

            if (x->done)
                continue;
            m = tp_frame_match(&b, s, 0, s, e, x->claimed, &f, 1,
                               "link closed before its payload");
            if (m < 0) {
                refused(&b, s);
                goto out;
            }
            if (!m)
                continue;
            /* where tcp copies the payload: inside what is left */
            if (f.offset < e->offset || f.offset - e->offset > e->length ||
                f.length > e->length - (f.offset - e->offset) ||
                f.length > e->length - x->claimed)
                fuzz_fail("a frame at %llu + %llu taken by a receive at "
                          "%llu + %llu with %llu claimed",
                          (unsigned long long)f.offset,
                          (unsigned long long)f.length,
                          (unsigned long long)e->offset,
                          (unsigned long long)e->length,
                          (unsigned long long)x->claimed);
            x->claimed += f.length;
            if (x->claimed == e->length) {
                x->done = 1;
                tp_recv_got(&b, &x->req);
            }
        }
        if (m)
            continue;
        u = tp_frame_unmatched(&b, s, &f);
        if (u == 0) {
            parked[s] = 1;
            continue;
        }
        if (u == 1)
            tp_fail_order(&b, s, &f);
        refused(&b, s);
        goto out;
    }
out:
    tp_base_fini(&b);
    return 0;
}
