/*
 * transport/shm/shm-internal.h: the shared-memory transport's design,
 * private layouts and the functions its files share. Only transport/shm/
 * includes this; the formats are in transport/shm/shm.h.
 *
 * Shape:
 *   - a mesh underneath (inner_ops: mesh_tcp_ops for shm, verbs' auto
 *     table for auto where built) joins, authenticates, carries the INFO
 *     exchange, failures, aborts and heartbeats, and all data to peers of
 *     other hosts (their requests are its requests, wrapped; the "TCP
 *     mesh" below is that mesh);
 *   - one memfd segment per host and job (join.c), rings per ordered pair;
 *   - whoever holds the lock moves the bytes (shm_poll): isend and irecv
 *     at once, wait_any while it waits (a bounded spin, then asleep on the
 *     rank's futex word in the segment, so that a peer's bell wakes the
 *     waiter itself), and a progress thread otherwise, which sleeps on the
 *     same word; a peer rings it only when a thread has said it sleeps
 *     (no system call while anyone spins); the thread ticks every
 *     SHM_TICK_MS to watch the TCP mesh, waiters or not;
 *   - a peer's goodbye is its word in the segment, set after its last
 *     frame: a pending operation with it then fails once its ring is empty;
 *   - after the rings, a window per local rank (SHM_WIN_BYTES) that the
 *     collectives write and read themselves, and host syncs: a counter
 *     per rank in its struct shm_proc, complete once every local rank's
 *     has reached it (shm_poll checks, the bells wake).
 * One mutex (super.lock) guards the transport's state.
 *
 * The files:
 *   join.c   host identity, INFO, the segment and its passing, CMA probe
 *   data.c   rings, matching, copies, wake-ups, the progress thread
 *   ops.c    listen, connect, isend, irecv, test, wait_any, abort, close
 */
#ifndef MESH_TRANSPORT_SHM_SHM_INTERNAL_H
#define MESH_TRANSPORT_SHM_SHM_INTERNAL_H

#include "common/util.h"
#include "transport/base.h"
#include "transport/shm/shm.h"
#include "transport/transport.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_TICK_MS         20
#define SHM_SPIN_DEFAULT_NS 200000ull
#define SHM_CACHE           64

/* ---- the segment (shared between the host's ranks) ---------------------- */

struct shm_seg_hdr {
    uint32_t magic, version, nlocal, slots, slot_bytes, pad0;
    uint64_t heap_bytes; /* each local rank's share (shm_heap_at) */
    uint8_t pad[SHM_CACHE - 32];
};

/* The frame of one host sync (mesh_transport_ops.host_sync), as its rank
 * posted it: what the others check theirs against. */
struct shm_sync_frame {
    uint64_t seq, count;
    uint32_t tag;
    uint8_t op, dtype, pad[2];
    uint64_t word[2]; /* the frame's offset and length: not checked */
};

struct shm_proc {
    _Atomic uint32_t bell;     /* futex word: bumped by every wake-up */
    _Atomic uint32_t sleeping; /* its threads asleep on bell (a count) */
    _Atomic uint32_t bye;      /* closed normally: nothing more comes */
    _Atomic uint32_t failed;   /* its job failed: its buffers may be gone */
    uint32_t pid;
    uint8_t pad0[SHM_CACHE - 20];
    /*
     * Host syncs: how many it has posted (release, after the frame), and
     * the frame of sync k in sync[k % 2]: it writes sync k + 1's only
     * after sync k completed, which a peer still waiting on sync k has
     * not let happen, so that a peer reads a whole frame.
     */
    _Atomic uint64_t syncs;
    struct shm_sync_frame sync[2];
    uint8_t pad1[2 * SHM_CACHE - 8 - 2 * sizeof(struct shm_sync_frame)];
};

enum shm_slot_kind { SLOT_INLINE = 1, SLOT_CMA = 2 };

struct shm_slot {
    uint64_t seq;
    uint32_t tag;
    uint8_t op, dtype, kind, pad0;
    uint64_t count, offset, length;
    uint64_t addr; /* SLOT_CMA: the sender's address of the payload */
    uint8_t pad1[SHM_CACHE - 48];
    /* then slot_bytes of payload (SLOT_INLINE) */
};

struct shm_ring {
    _Atomic uint64_t head; /* slots published by the sender */
    uint8_t pad0[SHM_CACHE - 8];
    _Atomic uint64_t tail; /* slots freed by the receiver */
    uint8_t pad1[SHM_CACHE - 8];
    /* then slots of (sizeof(struct shm_slot) + slot_bytes) */
};

#define SHM_SLOT_STRIDE (sizeof(struct shm_slot) + SHM_SLOT_BYTES)
#define SHM_RING_BYTES  (sizeof(struct shm_ring) + SHM_SLOTS * SHM_SLOT_STRIDE)
#define SHM_PAGE        4096u

/* ---- this process's side ------------------------------------------------ */

/* A run of pages of our share of the segment (shm_heap_at), by offset. */
struct shm_ext {
    size_t off, len;
};

struct mesh_mr {
    void *base;
    size_t len;
    mesh_mr_t *inner; /* the mesh underneath's registration */
};

struct mesh_req {
    struct tp_req super; /* kind, peer, frame, done, the request list */
    mesh_req_t *inner;   /* a peer of another host: the TCP mesh's request */
    char *buf;
    uint64_t moved;   /* send: bytes published; receive: bytes landed */
    int frames;       /* receive: frames landed */
    int cma;          /* send: by address, completes when read */
    uint64_t ack_at;  /* send by address: done once tail passes this */
    uint64_t sync_k;  /* a host sync: its number (1, 2, ...), else 0 */
    uint64_t word[2]; /* a host sync: its words (host_sync_word) */
    struct mesh_req *qnext;
};

struct shm_peer {
    int local; /* index in the segment, -1: another host */
    int cma;   /* it reads our memory by process_vm_readv */
    pid_t pid; /* its process (INFO, checked at the pass) */
    struct mesh_req *sq_head, *sq_tail; /* sends not fully published */
    struct mesh_req *aq_head, *aq_tail; /* sends by address, not yet read */
    struct mesh_req *rq_head, *rq_tail; /* posted receives */
    int gone;                           /* its goodbye seen */
    /*
     * Its ring to us (shm_stale_check): the head we saw last, when the
     * ring last moved (a slot published or taken), and whether its tail
     * slot waits with a frame that no posted receive takes (parked_f).
     */
    uint64_t in_head, in_moved_ns;
    int parked;
    struct mesh_frame parked_f;
};

struct mesh_transport {
    struct tp_base super; /* world, opts, lock, cond, requests, failure */
    const struct mesh_transport_ops *inner_ops;
    mesh_transport_t *inner;
    int connected;

    int sock_fd; /* abstract Unix socket (listen), until connect ends */
    char sock_name[SHM_SOCK_NAME];

    struct shm_peer *pp;  /* (size) */
    int *host;            /* (size): the lowest rank of each rank's host */
    double ranks_per_cpu; /* the most on any machine (ranks_per_cpu op) */
    int me;               /* our index in the segment, -1: none */
    int nlocal;
    uint8_t *seg;
    size_t seg_len;
    size_t heap_bytes;         /* each local rank's share, 0: none */
    struct shm_ext *heap_free; /* our share's free runs, by offset */
    int nheap_free;
    size_t cap_heap_free;
    struct shm_ext *heap_used; /* what host_alloc gave out */
    int nheap_used;
    size_t cap_heap_used;
    int cma_logged;
    uint64_t syncs;                     /* host syncs posted */
    struct mesh_req *yq_head, *yq_tail; /* host syncs not yet complete */

    uint64_t spin_ns;
    int spinners; /* threads in wait_any: they poll, the thread need not */
    int sleepers; /* of them, those asleep on our bell: a poll that moves
                   * anything rings it for them */
    pthread_cond_t bg_cond;
    int bg_cond_ready;
    pthread_t thread;
    int thread_started;
    int stopping;
    uint64_t tick_ns; /* the progress thread's last tick (its stalls) */
};

static inline struct shm_proc *shm_proc_at(struct mesh_transport *t, int li)
{
    return (struct shm_proc *)(t->seg + sizeof(struct shm_seg_hdr) +
                               (size_t)li * sizeof(struct shm_proc));
}

static inline struct shm_ring *shm_ring_at(struct mesh_transport *t, int from,
                                           int to)
{
    return (struct shm_ring *)(t->seg + sizeof(struct shm_seg_hdr) +
                               (size_t)t->nlocal * sizeof(struct shm_proc) +
                               ((size_t)from * (size_t)t->nlocal + (size_t)to) *
                                   SHM_RING_BYTES);
}

static inline struct shm_slot *shm_slot_at(struct shm_ring *r, uint64_t i)
{
    return (struct shm_slot *)((uint8_t *)(r + 1) +
                               (size_t)(i % SHM_SLOTS) * SHM_SLOT_STRIDE);
}

/* Where the windows start: after the rings, on a page boundary. */
static inline size_t shm_win_offset(int nlocal)
{
    size_t b = sizeof(struct shm_seg_hdr) +
               (size_t)nlocal * sizeof(struct shm_proc) +
               (size_t)nlocal * (size_t)nlocal * SHM_RING_BYTES;

    return (b + SHM_PAGE - 1) / SHM_PAGE * SHM_PAGE;
}

static inline uint8_t *shm_win_at(struct mesh_transport *t, int li)
{
    return t->seg + shm_win_offset(t->nlocal) + (size_t)li * SHM_WIN_BYTES;
}

/* After the windows, each local rank's share (host_alloc's memory). */
static inline uint8_t *shm_heap_at(struct mesh_transport *t, int li)
{
    return t->seg + shm_win_offset(t->nlocal) +
           (size_t)t->nlocal * SHM_WIN_BYTES + (size_t)li * t->heap_bytes;
}

static inline size_t shm_seg_bytes(int nlocal, size_t heap_bytes)
{
    return shm_win_offset(nlocal) +
           (size_t)nlocal * (SHM_WIN_BYTES + heap_bytes);
}

/* join.c */
int shm_sock_open(struct mesh_transport *t);
int shm_join(struct mesh_transport *t);
void shm_seg_close(struct mesh_transport *t);

/* data.c */
void shm_q_push(struct mesh_req **head, struct mesh_req **tail,
                struct mesh_req *r);
void shm_q_remove(struct mesh_req **head, struct mesh_req **tail,
                  struct mesh_req *r);
/* Post a host sync (the lock held): r->sync_k, our frame, the bells. */
void shm_sync_post(struct mesh_transport *t, struct mesh_req *r);
/* Move what can move with every local peer; 1 if anything moved. */
int shm_poll(struct mesh_transport *t);
/* Wake local index li if it said it sleeps. */
void shm_ring_bell(struct mesh_transport *t, int li);
/* Ring our own bell: wake our threads asleep on it. */
void shm_wake_self(struct mesh_transport *t);
/*
 * Sleep on our bell until a peer (or one of our threads) rings it, or
 * until_ns (mesh_now_ns), the lock held around it and dropped while
 * asleep; a last poll first, and 1 without sleeping when it moved
 * anything, else 0. waiter: a thread of wait_any (counted in sleepers).
 */
int shm_bell_sleep(struct mesh_transport *t, uint64_t until_ns, int waiter);
/*
 * Every tick: a ring parked on a frame that no posted receive takes, while
 * receives from its peer are due here and the ring has not moved for
 * twice the peer timeout, fails the job naming the peer (the TCP
 * transport's rule); a stall of this process is not held against it.
 */
void shm_stale_check(struct mesh_transport *t, uint64_t now);
/* A local peer that said goodbye with our operations pending: fail. */
void shm_check_gone(struct mesh_transport *t, int peer);
void *shm_progress_main(void *arg);
/* The TCP mesh failed: adopt its failure. */
void shm_adopt_inner(struct mesh_transport *t);

#endif
