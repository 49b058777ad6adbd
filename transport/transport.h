/*
 * transport/transport.h: the one interface every transport implements.
 *
 * A transport knows bytes, peers and registered memory; it knows nothing of
 * collectives or tensors. Its shape follows NCCL's network plugin API:
 * listen, connect, register memory, non-blocking send and receive, test,
 * progress and close, as a const table of function pointers (one table per
 * transport, and any test double).
 *
 * Messages are tagged with a struct mesh_frame. The receiver posts what it
 * expects; the transport matches incoming frames on (seq, tag) and checks the
 * rest (see "Matching" below). All functions return 0 or a negative
 * errno-style code with a message recorded by mesh_err() (common/util.h).
 *
 * The folder, one transport per subfolder (UCX style):
 *   transport.h, transport.c  this interface: names, frames, options,
 *                             waits, and mesh_transport_find
 *   base.h, base.c            what the transports share below it: the
 *                             object each starts with (world, lock,
 *                             requests, the failure record) and the one
 *                             implementation of failing the job, checking
 *                             a peer, testing and waiting
 *   tcp/                      "tcp": sockets and a libevent progress
 *                             thread; its handshake's messages as pure
 *                             functions (tcp/wire.c); tcp/tcp-internal.h
 *                             describes it
 *   shm/                      "shm": shared memory between the ranks of
 *                             one host, over a TCP mesh that joins, carries
 *                             failures and the other hosts' data; and
 *                             "auto" (the default), the same over verbs'
 *                             auto table instead of TCP where built with
 *                             verbs; shm/shm-internal.h describes it
 *   verbs/                    "verbs" (RDMA, rdma-core) over a TCP mesh
 *                             that joins and carries failures, and the
 *                             table auto runs between hosts: verbs where
 *                             every rank has an active port, else that TCP
 *                             mesh; verbs/verbs-internal.h describes it
 */
#ifndef MESH_TRANSPORT_H
#define MESH_TRANSPORT_H

#include "common/dtype.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the world: who the peers are ------------------------------------- */

#define MESH_HOST_MAX 256

struct mesh_peer {
    char host[MESH_HOST_MAX]; /* name, IPv4 or IPv6 literal (no brackets) */
    uint16_t port;            /* where this rank listens */
    int local_rank;           /* slot index on its host */
};

struct mesh_world {
    int rank;                      /* this process */
    int size;                      /* number of ranks */
    const struct mesh_peer *peers; /* (size) entries, indexed by rank */
};

/* "host:port" (with [] around IPv6) of rank r, for messages. */
const char *mesh_peer_name(const struct mesh_world *w, int r, char *buf,
                           size_t len);

/*
 * The SHA-256 of the rank layout (every rank's "host:port" in rank order,
 * each with its NUL) into md: peers started with different hostfiles (or
 * -H) refuse each other by it. 0, or a negative errno code.
 */
int mesh_world_digest(const struct mesh_world *w, uint8_t md[32]);

/* ---- frames ------------------------------------------------------------- */

enum mesh_op {
    MESH_OP_NONE = 0,
    MESH_OP_P2P = 1, /* point-to-point (meshbench, control) */
    MESH_OP_ALLREDUCE = 2,
    MESH_OP_REDUCE_SCATTER = 3,
    MESH_OP_ALLGATHER = 4,
    MESH_OP_BROADCAST = 5,
    MESH_OP_BARRIER = 6,
    MESH_OP_PS = 7, /* parameter-server baseline */
};

const char *mesh_op_name(int op);

/*
 * The header every data frame carries on the wire (encoded little-endian,
 * fixed size). One message posted with isend may travel as several frames
 * (stripes over several streams); each frame's [offset, offset + length)
 * lies inside the message's range.
 */
struct mesh_frame {
    uint64_t seq;    /* collective sequence number, same on every rank */
    uint32_t tag;    /* step within the collective (algorithm-defined) */
    uint8_t op;      /* enum mesh_op */
    uint8_t dtype;   /* enum mesh_dtype */
    uint64_t count;  /* elements in the whole collective */
    uint64_t offset; /* byte offset of this message in the collective */
    uint64_t length; /* payload bytes of this message */
    /*
     * Send order, a local hint that never travels: a send goes out ahead
     * of the queued sends to the same peer of the same seq that have not
     * started and have a higher order; equal orders keep posting order, so
     * all 0 (the default) is first in, first out. A schedule may use it
     * only where no receive it overtakes waits on one it overtook. The
     * TCP transport follows it; others may ignore it.
     */
    uint32_t order;
};

/* A receive that a schedule will post (mesh_transport_ops.expect): from
 * peer, of the message (tag, offset, length) of its collective. */
struct mesh_expect {
    int peer;
    uint32_t tag;
    uint64_t offset, length;
};

/* A point-to-point message's frame: len bytes (op P2P, dtype byte). */
void mesh_frame_p2p(struct mesh_frame *f, uint64_t seq, uint32_t tag,
                    size_t len);

/*
 * Sequence numbers from MESH_SEQ_COLL_BASE on are collectives' (the
 * default seq_base of collective/collective.h); below it, point-to-point
 * messages' (mesh/mesh.h's counter, from 1); the top 16, from
 * MESH_SEQ_OWN_BASE, the transports' own messages over the mesh under them
 * (shm's SHM_CTRL_SEQ, verbs' VERBS_CTRL_SEQ). Messages print none raw:
 * mesh_seq_str gives "collective #N" (N = seq - base + 1, the job's N-th
 * collective), "message #seq", or "transport message (seq 2^64-K)".
 */
#define MESH_SEQ_COLL_BASE (UINT64_C(1) << 62)
#define MESH_SEQ_OWN_BASE  (UINT64_MAX - 15)
/*
 * How far past an owner's low (seq_done) a peer's frame may be. A peer
 * leads only where it finished collectives with no byte from this rank
 * (a broadcast's root, a chain's head), and the frames of its lead queue
 * unread in the link (a socket's buffers, 16 ring slots, credits): 2^24
 * collectives' headers alone would be 1 GiB there.
 */
#define MESH_SEQ_AHEAD (UINT64_C(1) << 24)
const char *mesh_seq_str(uint64_t seq, char *buf, size_t len);

/* "allreduce (collective #12) tag 3 float32 count 1000 offset 0 length
 * 4000" */
const char *mesh_frame_str(const struct mesh_frame *f, char *buf, size_t len);

/*
 * A job failure's message: "reason; operation in flight: send <frame> to
 * rank P (host:port)", or "reason; no operation in flight" when f is NULL.
 * Every transport words its failures this way.
 */
void mesh_failure_msg(char *out, size_t len, const char *reason,
                      const struct mesh_frame *f, int is_send, int peer,
                      const char *peer_name);

/* ---- options shared by every transport ----------------------------------- */

#define MESH_JOB_MAX    64
#define MESH_CONFIG_MAX 2048
#define MESH_TCP_CC_MAX 16 /* the kernel's TCP_CA_NAME_MAX, with the NUL */
/* The mesh's congestion control where none is asked for (mesh/mesh.c). */
#define MESH_TCP_CC_DEFAULT "cubic"

/* The configuration key of an --elastic view (struct mesh_transport_opts). */
#define MESH_CONFIG_VIEW "view"

struct mesh_transport_opts {
    int streams;           /* TCP streams per link (data), >= 1 */
    double join_timeout_s; /* give up joining after this (default 60) */
    double peer_timeout_s; /* a silent peer is dead after this (10) */
    const uint8_t *secret; /* shared job secret; NULL with insecure */
    size_t secret_len;
    int insecure; /* run without authentication (logged) */
    char job_id[MESH_JOB_MAX];
    /*
     * The configuration that must agree between peers, as "key=value\n"
     * lines (at most MESH_CONFIG_MAX bytes). Its SHA-256 goes in the
     * handshake; on a mismatch the log line names the key that differs.
     * A line MESH_CONFIG_VIEW "=N:..." (the membership view of
     * --elastic) orders two configurations whose N differ: the side of
     * the lower N fails its join at once (its view is superseded), the
     * other waits on for the peer to come back in the later view.
     */
    char config[MESH_CONFIG_MAX];
    /*
     * The mesh is one view of a job whose views differ in size (--elastic):
     * a peer of another world size may be in another view, and is waited
     * for. Else (0) a peer of this job with another world size runs with
     * another hostfile, and fails its join at once (tcp).
     */
    int views;
    /* Transport-specific (verbs): device, port, GID index; NULL/-1 = auto. */
    const char *ib_dev;
    int ib_port;
    int gid_index;
    /*
     * TCP: the congestion control of every socket (TCP_CONGESTION), as
     * checked by mesh_tcp_cc_check; "" keeps the host's default.
     */
    char tcp_cc[MESH_TCP_CC_MAX];
    int tcp_cc_default; /* tcp_cc is the mesh's default, not asked for */
    /*
     * TCP (and the TCP under shm and verbs): a listening socket on this
     * rank's port (mesh_tcp_listen_socket) that the caller keeps open
     * across meshes, and that the mesh accepts on instead of binding its
     * own; -1 (the default): it binds its own, closed with it. --elastic
     * keeps one for the life of the process, so that a peer that dials
     * before this one has opened the next view's mesh waits in its
     * backlog until it has, instead of being refused and backing off.
     * The transport never closes it.
     */
    int listen_fd;
};

void mesh_transport_opts_init(struct mesh_transport_opts *o);

/*
 * Whether this process may give its TCP sockets congestion control name
 * (a probe socket tries it): 0, or -EINVAL (not a name of 1 to 15 letters,
 * digits, '_' or '-'), -ENOENT (this kernel has none by that name) or
 * -EPERM (not allowed here), with a message that lists what is available
 * or allowed and how to change it.
 */
int mesh_tcp_cc_check(const char *name);

/*
 * A listening socket (non-blocking, close-on-exec) on the TCP port of
 * rank world->rank, with opts->tcp_cc, for opts->listen_fd: 0 with *out
 * set (the caller closes it), or a negative errno-style code.
 */
int mesh_tcp_listen_socket(const struct mesh_world *world,
                           const struct mesh_transport_opts *opts, int *out);

/* ---- the interface ------------------------------------------------------- */

typedef struct mesh_transport mesh_transport_t; /* opaque, per transport */
typedef struct mesh_mr mesh_mr_t;               /* registered memory */
typedef struct mesh_req mesh_req_t;             /* one isend/irecv */

struct mesh_transport_ops {
    const char *name;

    /*
     * Bind this rank's address (world->peers[world->rank]) and start
     * accepting. world and opts are copied. *out is written on success.
     */
    int (*listen)(const struct mesh_world *world,
                  const struct mesh_transport_opts *opts,
                  mesh_transport_t **out);

    /*
     * Join the mesh: connect to every peer (retrying with backoff) and
     * complete the handshake on every link, or fail at the join timeout
     * with an error listing the ranks that never answered.
     */
    int (*connect)(mesh_transport_t *t);

    /* Register [buf, buf+len) once; data buffers must lie in one. */
    int (*reg_mr)(mesh_transport_t *t, void *buf, size_t len, mesh_mr_t **out);
    int (*dereg_mr)(mesh_transport_t *t, mesh_mr_t *mr);

    /*
     * Start sending f->length bytes of buf to peer. The buffer must stay
     * untouched until the request completes. mr may be NULL for memory the
     * transport need not register (TCP).
     */
    int (*isend)(mesh_transport_t *t, int peer, const struct mesh_frame *f,
                 const void *buf, mesh_mr_t *mr, mesh_req_t **out);

    /*
     * Post a receive of the message described by expect from peer, written
     * straight into buf (expect->length bytes).
     *
     * Matching: an incoming frame belongs to the posted receive with the
     * same (seq, tag) whose [offset, offset + length) holds the frame's.
     * Its op, dtype and count must equal the receive's, else the link and
     * the job fail with a desync error naming both sides. A frame reaching
     * past the posted range closes the link before any payload is read. A
     * frame with no posted receive yet waits (its stream is not read),
     * unless seq_done and expect tell that none will take it.
     */
    int (*irecv)(mesh_transport_t *t, int peer, const struct mesh_frame *expect,
                 void *buf, mesh_mr_t *mr, mesh_req_t **out);

    /*
     * *done = 1 when req has completed, and then req is freed. Returns the
     * request's error (the job's failure) if it failed; req is freed then
     * too.
     */
    int (*test)(mesh_transport_t *t, mesh_req_t *req, int *done);

    /*
     * Block until at least one of reqs[0..n) completes, or timeout_s
     * passes (< 0: no timeout; a failed job always returns promptly).
     * Completed requests are NOT freed: call test on them. Returns 0, or
     * -ETIMEDOUT, or the job's failure.
     */
    int (*wait_any)(mesh_transport_t *t, mesh_req_t *const *reqs, int n,
                    double timeout_s);

    /* Drive progress from the caller (a no-op where a thread does it). */
    int (*progress)(mesh_transport_t *t);

    /*
     * Optional (NULL: not needed). hold(t, 1): from now until hold(t, 0),
     * the calling thread keeps coming back to wait_any until every request
     * it started is done (a collective's executor does), so the transport
     * may leave the I/O of its data streams to that thread instead of
     * waking a progress thread between two waits. Calls nest.
     */
    void (*hold)(mesh_transport_t *t, int on);

    /*
     * Fail the job: every pending and future operation returns an error
     * naming culprit (-1: none) and why; peers are told.
     */
    void (*abort)(mesh_transport_t *t, int culprit, const char *why);

    /*
     * Optional (NULL: unknown). The rank the failed job blames (the first
     * failure's culprit, the same on every rank that heard of it), or -1:
     * the job has not failed, or blames no one.
     */
    int (*culprit)(mesh_transport_t *t);

    /* Close every link and free everything; NULL is fine. */
    void (*close)(mesh_transport_t *t);

    /*
     * Optional (NULL: nothing is kept). The owner of the sequence numbers
     * from base up (a communicator, which runs its collectives one at a
     * time and matches every byte a peer sends it) says that every one of
     * them below low is finished on this rank: each receive it posted for
     * them completed. A peer's frame of such a seq, arriving or waiting
     * unmatched, is then one that no receive will ever match (a duplicate,
     * a stale frame), and so is one of seq low + MESH_SEQ_AHEAD or more
     * (further ahead than any peer can run): the job fails naming its
     * sender. low == UINT64_MAX: the owner is gone, its range unchecked.
     */
    void (*seq_done)(mesh_transport_t *t, uint64_t base, uint64_t low);

    /*
     * Optional (NULL: nothing is kept; with seq_done). An owner of
     * sequence numbers (seq_done's) is about to run the part of collective
     * f->seq whose frames carry f->op, f->dtype and f->count (its
     * schedule: one per seq and op, run one at a time, in order of seq;
     * a collective may have parts of other ops after it, as auto's
     * exchange of times); recv[0..n) are all the receives this rank will
     * post for it, each once (copied). From now until its next part, a
     * peer's frame of this part that lies in none of them (another tag or
     * offset), in one that completed or past one's end, or with another
     * dtype or count, is one that no receive will ever match, and so is a
     * frame of a part that ran before; and where a peer's frame of a
     * later part waits on every stream it has to this rank while a
     * receive of this part from it is due (its frames of this part would
     * be behind it), the peer broke the order: the job fails naming the
     * sender, as soon as that is known (on arrival, while the frame waits
     * unmatched, or now, for frames that wait already).
     */
    void (*expect)(mesh_transport_t *t, const struct mesh_frame *f,
                   const struct mesh_expect *recv, size_t n);

    /*
     * Optional (NULL: every rank is a host of its own). The host of rank
     * (any rank, not only peers): the lowest rank on that host, the same
     * answer on every rank; valid after connect. Ranks of one host share
     * memory where the transport can (shm).
     */
    int (*host_of)(mesh_transport_t *t, int rank);

    /*
     * Optional (NULL: 1). The most ranks per CPU on any machine of the
     * job: a machine's ranks (of every network namespace: one kernel)
     * over its online CPUs, at least 1; the same answer on every rank;
     * valid after connect. Where it is over 1, ranks wait for a CPU at
     * every hop of a collective (the cost model's latency term).
     */
    double (*ranks_per_cpu)(mesh_transport_t *t);

    /*
     * Optional (NULL: none; both or neither). Memory the ranks of one host
     * share (shm), for collectives that read each other's data in place:
     * *base and *len (the same on every rank) are rank's window, mapped
     * in this process, which its owner writes and every rank of the host
     * may read; *syncs is how many host_sync this process has posted.
     * Valid after connect, until close. -ENOTSUP (no message) where rank
     * has none: another host's rank, or no shared memory here.
     */
    int (*host_window)(mesh_transport_t *t, int rank, void **base, size_t *len,
                       uint64_t *syncs);

    /*
     * A request (wait and test it as any other) that completes once every
     * rank of this host with a window has posted its own host_sync of the
     * same number (the first, the second, ...): what each wrote to its
     * window before posting it, the others may read once theirs
     * completes. f names it for the checks and the messages: seq, tag,
     * op, dtype and count must be the same on every rank, else the job
     * fails with a desync naming both sides. f->offset and f->length are
     * not checked: they are this rank's two words, which the others read
     * with host_sync_word. A rank that dies or leaves first fails the
     * job, as a peer of a send would.
     */
    int (*host_sync)(mesh_transport_t *t, const struct mesh_frame *f,
                     mesh_req_t **out);

    /*
     * Optional (NULL: none; with host_window). The two words (its frame's
     * offset and length) that rank, of this host, posted with its host
     * sync number k, read between the completion of this process's sync
     * k and its posting of sync k + 1 (the others cannot have moved past
     * k + 1 then). -ENOTSUP (no message) where rank has no window,
     * -ESTALE where rank's sync k is not readable now.
     */
    int (*host_sync_word)(mesh_transport_t *t, int rank, uint64_t k,
                          uint64_t word[2]);

    /*
     * Optional (NULL: none; all three or none). Each rank's share of the
     * host's shared memory: what host_alloc gives out lies in it, and
     * every rank of the host may read it in place, so that a collective
     * whose buffers are there skips copying its input into its window
     * (NCCL's user-buffer registration). host_alloc: len bytes, page
     * aligned, or -ENOMEM, no message, when the share is full or absent
     * (the caller takes its own memory then); valid after connect, until
     * host_free or close (thread-safe). host_heap: rank's share, mapped in
     * this process, at *base for *len bytes (0 where there is none),
     * -ENOTSUP (no message) for a rank of another host.
     */
    int (*host_alloc)(mesh_transport_t *t, size_t len, void **out);
    void (*host_free)(mesh_transport_t *t, void *p);
    int (*host_heap)(mesh_transport_t *t, int rank, void **base, size_t *len);
};

/* ---- side channels (verbs) ----------------------------------------------- */

/*
 * A side channel is one reliable-connected queue pair, outside any mesh, on
 * the RDMA device the verbs transport would take (opts' ib_dev, ib_port and
 * gid_index), with a protection domain of its own: what is registered on
 * it is reachable through that queue pair only. Its two ends swap their
 * addresses (MESH_SIDE_ADDR bytes) over a connection the caller
 * authenticates, connect, and one reads what the other registered
 * (train/catchup.c: a joiner reads the members' snapshot stripes and
 * gradients). Errors are recorded with mesh_err. Built without verbs,
 * mesh_side_dev_open fails with -ENOSYS.
 *
 *   mesh_side_dev_open   the device and port, once per process user;
 *                        -ENODEV without an active port
 *   mesh_side_dev_close  after every channel on it is closed
 *   mesh_side_dev_name   "rxe0 port 1"
 *   mesh_side_open       a channel: PD, CQ, QP; a dead or silent peer
 *                        fails a read within peer_timeout_s (-ETIMEDOUT
 *                        once no completion came for that long)
 *   mesh_side_addr       its address, to send to the other end
 *   mesh_side_connect    connect to the other end's address (from the
 *                        network: every field checked, -EPROTO if bad)
 *   mesh_side_reg        register len bytes at buf until the channel
 *                        closes: for remote reads (remote_read; *raddr and
 *                        *rkey for the other end), or as a read's
 *                        destination
 *   mesh_side_read       start reading len bytes at the other end's
 *                        (raddr, rkey) into dst, inside a registration;
 *                        one read at a time
 *   mesh_side_poll       1 when the read is done, 0 while it runs (*done:
 *                        the bytes landed so far, a prefix of dst), or < 0
 *                        when it failed (the work completion's status in
 *                        the message); the channel is then only closed
 *   mesh_side_close      the queue pair, then the registrations
 */
#define MESH_SIDE_ADDR 32
typedef struct mesh_side_dev mesh_side_dev_t;
typedef struct mesh_side mesh_side_t;

int mesh_side_dev_open(const struct mesh_transport_opts *o,
                       mesh_side_dev_t **out);
void mesh_side_dev_close(mesh_side_dev_t *d);
const char *mesh_side_dev_name(const mesh_side_dev_t *d);
int mesh_side_open(mesh_side_dev_t *d, double peer_timeout_s,
                   mesh_side_t **out);
void mesh_side_addr(const mesh_side_t *s, uint8_t addr[MESH_SIDE_ADDR]);
int mesh_side_connect(mesh_side_t *s, const uint8_t addr[MESH_SIDE_ADDR]);
int mesh_side_reg(mesh_side_t *s, void *buf, size_t len, int remote_read,
                  uint64_t *raddr, uint32_t *rkey);
int mesh_side_read(mesh_side_t *s, void *dst, size_t len, uint64_t raddr,
                   uint32_t rkey);
int mesh_side_poll(mesh_side_t *s, size_t *done);
void mesh_side_close(mesh_side_t *s);

/* The transports built in: "tcp", "shm" and "auto" always, "verbs" when
 * configured. */
const struct mesh_transport_ops *mesh_transport_find(const char *name);

/* Wait for one request (wait_any + test). Frees req. */
int mesh_transport_wait(const struct mesh_transport_ops *ops,
                        mesh_transport_t *t, mesh_req_t *req);

/*
 * One sleep of a transport's wait loop on cond, with lock held: until a
 * broadcast or, unless deadline_ns is MESH_NO_DEADLINE, until deadline_ns
 * on mesh_now_ns()'s clock (CLOCK_MONOTONIC, which cond's attributes must
 * name for the sleep to last until the deadline). Returns -ETIMEDOUT, without
 * sleeping and without recording a message (the caller words it), once the
 * deadline has passed; else 0, also after a spurious wake-up: the caller checks
 * its condition again.
 */
#define MESH_NO_DEADLINE UINT64_MAX
int mesh_cond_sleep(pthread_cond_t *cond, pthread_mutex_t *lock,
                    uint64_t deadline_ns);

/*
 * Initialises cond on CLOCK_MONOTONIC, the clock mesh_cond_sleep's deadlines
 * are on. Returns 0 or a negative errno; records no message.
 */
int mesh_cond_init_monotonic(pthread_cond_t *cond);

#endif
