/*
 * transport/base.h: what the transports share below the interface, in the
 * style of UCX's "super": every transport's struct mesh_transport begins
 * with a struct tp_base named super (the world, the lock, the requests and
 * the job's failure), and every request with a struct tp_req. The
 * functions here are the one implementation of what works the same in
 * each: failing the job, the request list, checking a peer, waiting.
 * Nothing outside transport/ includes this.
 *
 * Every function here expects b->lock held, unless it says otherwise.
 */
#ifndef MESH_TRANSPORT_BASE_H
#define MESH_TRANSPORT_BASE_H

#include "common/util.h"
#include "transport/transport.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define TP_MSG_MAX 1024

/*
 * The built-in transports' tables (mesh_transport_find): tcp
 * (transport/tcp/ops.c); shm and "auto" (transport/shm/ops.c), shared
 * memory within a host and, between hosts, TCP (shm) or the verbs auto
 * table (auto); with HAVE_VERBS, verbs and that auto table, verbs where
 * every rank has an active port, else TCP underneath (transport/verbs/ops.c,
 * not found by name).
 */
extern const struct mesh_transport_ops mesh_tcp_ops;
extern const struct mesh_transport_ops mesh_shm_ops;
extern const struct mesh_transport_ops mesh_auto_ops;
extern const struct mesh_transport_ops mesh_verbs_ops;
extern const struct mesh_transport_ops mesh_verbs_auto_ops;

enum tp_req_kind { TP_SEND, TP_RECV };

/* The start of every transport's struct mesh_req. */
struct tp_req {
    enum tp_req_kind kind;
    int peer;
    struct mesh_frame f; /* the message (send) or what is expected (recv) */
    atomic_int done;
    struct tp_req *next, *prev; /* the transport's request list */
};

/*
 * A failed job: the first failure, the one every later operation reports.
 * A transport over another (verbs over TCP) adopts the inner one's
 * culprit, code and reason, and adds its own operation in flight.
 */
struct tp_failure {
    int failed;
    int code;                    /* negative errno */
    int culprit;                 /* the rank blamed, -1: no one */
    char reason[TP_MSG_MAX / 2]; /* why, without the operation in flight */
    char msg[TP_MSG_MAX]; /* the reason, then "; operation in flight: ..." */
};

struct tp_base;

/* What differs between the transports where the base does the rest. */
struct tp_base_ops {
    /*
     * A failure was just recorded: drop the transport's queues, with
     * notify tell the peers (culprit, code, reason), wake its waiters.
     */
    void (*failed)(struct tp_base *b, int culprit, int code, int notify,
                   const char *reason);
    /* Unlink and free a request that test() hands back; failed: the job
     * failed before it completed (unhook it from the transport's queues). */
    void (*req_free)(struct tp_base *b, struct tp_req *r, int failed);
};

/* A receive of an owner's running part (transport.h's expect). */
struct tp_exp {
    int peer;
    uint32_t tag;
    int done; /* it completed */
    uint64_t offset, length;
};

/* An owner of sequence numbers (transport.h's seq_done and expect). */
#define TP_SEQ_OWNERS 4
struct tp_seq_owner {
    int used;
    uint64_t base, low;
    /* the part running (expect), plan 0: none known */
    int plan;
    struct mesh_frame part; /* its seq, op, dtype and count */
    int prev_op;            /* the op of the part before of its seq, or -1 */
    struct tp_exp *exp;     /* (nexp) its receives, by (peer, tag) */
    size_t nexp, capexp;
    int *due; /* (world.size) its receives from each peer not complete */
};

struct tp_base {
    const char *name; /* "tcp", "verbs": the start of some messages */
    const struct tp_base_ops *ops;
    struct mesh_world world; /* world.peers is peers */
    struct mesh_peer *peers; /* (size) */
    struct mesh_transport_opts opts;
    pthread_mutex_t lock; /* guards the transport's state */
    pthread_cond_t cond;  /* on CLOCK_MONOTONIC: waiters, the join */
    int sync_ready;       /* lock and cond initialised */
    struct tp_req *reqs;  /* every request not yet freed, newest first */
    struct tp_failure fail;
    struct tp_seq_owner seqs[TP_SEQ_OWNERS];
};

/*
 * Copy world (and its peers) and opts (without the secret), and create the
 * lock and the condition variable. 0, or -ENOMEM with a message; on
 * failure tp_base_fini undoes what was done.
 */
int tp_base_init(struct tp_base *b, const char *name,
                 const struct tp_base_ops *ops, const struct mesh_world *world,
                 const struct mesh_transport_opts *opts);
/* Undo tp_base_init (without the lock held); a zeroed base is fine. */
void tp_base_fini(struct tp_base *b);

/* "host:port" of rank r, for messages. */
static inline const char *tp_pname(const struct tp_base *b, int r, char *buf,
                                   size_t len)
{
    return mesh_peer_name(&b->world, r, buf, len);
}

/*
 * Fail the job, unless it has failed already (the first failure wins):
 * record the message (the reason, then the oldest pending operation
 * involving the culprit, else the oldest of all), log it, wake every
 * waiter, then let the transport drop its queues and tell the peers
 * (ops->failed).
 */
void tp_fail_job(struct tp_base *b, int culprit, int code, int notify,
                 const char *fmt, ...) MESH_PRINTF(5, 6);
/* The job's failure as this call's error: its code, its message. */
int tp_fail_err(struct tp_base *b);
/* A copy of t's failure record (out->failed = 0: none yet), for any
 * transport built on the base (without the lock held). */
void tp_failure_of(mesh_transport_t *t, struct tp_failure *out);
/* Peer left (said goodbye) with operations pending: its failure, with
 * the code -ESHUTDOWN (a peer that left, alive, not one that died). */
void tp_fail_left(struct tp_base *b, int peer);

void tp_req_link(struct tp_base *b, struct tp_req *r);
void tp_req_unlink(struct tp_base *b, struct tp_req *r);
/* Mark r done and wake the waiters. */
void tp_req_done(struct tp_base *b, struct tp_req *r);
/* The newest request of peer not done yet, or NULL. */
struct tp_req *tp_req_pending(const struct tp_base *b, int peer);
/* Whether one of reqs[0..n) (NULL entries allowed) is done; any thread,
 * without the lock. */
int tp_any_done(mesh_req_t *const *reqs, int n);

/*
 * The checks every isend and irecv (what) starts with: a buffer for a
 * non-empty message, a range that does not overflow (without the lock);
 * then, under the lock, a valid peer and a job that has not failed.
 */
int tp_check_buf(const struct tp_base *b, const char *what,
                 const struct mesh_frame *f, const void *buf);
int tp_check_peer(struct tp_base *b, int peer, const char *what);

/*
 * transport.h's matching rule for one posted receive e, of which claimed
 * bytes are taken already, and a frame f that rank sender sent to rank
 * receiver (one of them this rank, the other culprit, to whom a failure
 * is charged). Returns 0 when f belongs to another receive (seq, tag or
 * offset differ), 1 when it is e's and fits, or -EPROTO after failing the
 * job (with the lock held): a desync naming both sides, or, when
 * check_len, a frame beyond e, whose message ends with after (what became
 * of its payload).
 */
int tp_frame_match(struct tp_base *b, int culprit, int receiver, int sender,
                   const struct mesh_frame *e, uint64_t claimed,
                   const struct mesh_frame *f, int check_len,
                   const char *after);

/*
 * What a frame f that sender sent can be checked for before any receive
 * matches it (so also while it waits as an early frame): a header that
 * contradicts itself (its range past count elements of its dtype, times
 * the ranks for a reduce-scatter or all-gather), a seq that an owner
 * finished here or one too far ahead (transport.h's seq_done). 0, or
 * -EPROTO after failing the job naming sender and the fault.
 */
int tp_frame_check(struct tp_base *b, int sender, const struct mesh_frame *f);
/* seq_done's record: base's owner finished every seq below low here
 * (UINT64_MAX: it is gone); its part running goes once low passes it. */
void tp_seq_done(struct tp_base *b, uint64_t base, uint64_t low);
/* expect's record: the part f of its owner runs now, with the n receives
 * recv (the transport then checks the frames that wait). */
void tp_expect(struct tp_base *b, const struct mesh_frame *f,
               const struct mesh_expect *recv, size_t n);
/* Receive r (of peer, expecting r->f) completed: where it is one of its
 * owner's running part, no frame may fall in it any more. */
void tp_recv_got(struct tp_base *b, const struct tp_req *r);
/*
 * Frame f of sender matched no posted receive and would wait. Against its
 * owner's running part (expect): of a part that ran before, in no receive
 * of the part, in one that completed or past one's end, or with another
 * dtype or count: the job fails naming sender (-EPROTO). Else 1 where f
 * is of a later part while a receive of the running part from sender is
 * due (tp_frame_later: if every stream from sender waits so, the sender
 * broke the order, tp_fail_order), else 0.
 */
int tp_frame_unmatched(struct tp_base *b, int sender,
                       const struct mesh_frame *f);
/* Whether a waiting frame f of sender is of a later part of its owner
 * than the one running while a receive of that from sender is due. */
int tp_frame_later(const struct tp_base *b, int sender,
                   const struct mesh_frame *f);
/* Every stream from sender waits with a frame of a later part (f one of
 * them): fail the job naming sender (returns -EPROTO). */
int tp_fail_order(struct tp_base *b, int sender, const struct mesh_frame *f);

/*
 * Test aid, MESHTRAIN_TEST_WIRE=KIND[:N] (like train/'s MESHTRAIN_TEST_*
 * aids): the N-th data frame this process sends (from 1, default 1) goes
 * out hostile, so that tests can check what its receiver does with frames
 * of a peer that passed the handshake. KIND: op, dtype, count (a desync),
 * seq (2^32 collectives ahead), stale (seq - 1: the collective before's),
 * tag (another step), offset (past the message), length (its header one
 * byte longer than its payload), long (64 KiB longer), huge (length
 * 2^62), magic (tcp: a broken header), kind (shm: a slot neither inline
 * nor by address), dup (sent twice), ahead (seq + 2: a collective not
 * running here yet), inside (the last bytes of its collective, past its
 * message msg, the one f is a piece of: only such frames count).
 * slot: f is a shm ring slot's, else a TCP frame's (magic counts only
 * TCP frames, kind only slots). Returns TP_WIRE_NONE for every other
 * frame, and for the N-th the kind, with f's header fields changed for
 * the kinds that change them (the payload stays as it was).
 */
enum tp_wire {
    TP_WIRE_NONE,
    TP_WIRE_HEADER, /* f changed: send it as it is now */
    TP_WIRE_MAGIC,
    TP_WIRE_KIND,
    TP_WIRE_DUP,
};
enum tp_wire tp_test_wire(struct mesh_frame *f, const struct mesh_frame *msg,
                          int slot);

/* test() (without the lock held): done, or the job's failure, frees req
 * (ops->req_free). */
int tp_test(struct tp_base *b, mesh_req_t *req, int *done);
/*
 * wait_any's sleep on b->cond until one of reqs is done (0), the job
 * fails (its error) or deadline_ns passes (-ETIMEDOUT, which names
 * timeout_s).
 */
int tp_wait_sleep(struct tp_base *b, mesh_req_t *const *reqs, int n,
                  uint64_t deadline_ns, double timeout_s);
/* progress() where a thread does the work: the job's failure, or 0
 * (without the lock held). */
int tp_progress(struct tp_base *b);

/*
 * The control exchange of a transport built on the TCP mesh (shm, verbs),
 * without b->lock: send every peer p its len bytes at out + p * out_stride
 * (out_stride 0: the same bytes to all) and receive each peer's into
 * in + p * len, as point-to-point frames of seq and tag on the mesh inner
 * (ops); waits for all of them.
 */
int tp_ctrl_exchange(const struct tp_base *b,
                     const struct mesh_transport_ops *ops,
                     mesh_transport_t *inner, uint64_t seq, uint32_t tag,
                     const uint8_t *out, size_t out_stride, uint8_t *in,
                     size_t len);

#endif
