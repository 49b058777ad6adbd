/*
 * train/elastic.h: membership views of an elastic mesh (--elastic), agreed
 * by the survivors of a failure with no coordinator.
 *
 * The protocol is written down in doc/elastic.md; in short:
 *
 *   - The job's slots are the hostfile's ranks (at most 64). A view is a
 *     set of slots (a 64-bit mask) with an epoch number; view 0 is every
 *     slot. Ranks within a view are the members in slot order, dense.
 *   - Every peer keeps a UDP socket bound to its own TCP host:port number.
 *     Messages are HMAC-SHA256-signed with the job secret and carry the
 *     job, the sender's slot and the epoch of the view they speak about.
 *   - When a peer sees its mesh fail (or hears a PROPOSE for its current
 *     epoch e from a member), it leaves view e: it stops training (the
 *     callback aborts its transport), freezes the step it can roll back to
 *     (the lowest step whose snapshot it holds, "committed") and sends
 *     PROPOSE(e, seen, step) to every member of view e every 20 ms. seen
 *     is the set of members it has heard a PROPOSE(e) from, itself
 *     included; it only grows.
 *   - A peer decides view e + 1 = S when its seen set S has not changed
 *     for the settle time, S holds more than half of view e (quorum), and
 *     every member of S has reported exactly S. If view e formed, it
 *     first waits for every member of it not blamed, up to --peer-timeout
 *     (1 s once a death is known): one not heard is likely slow.
 *     The step every member restarts from is the lowest step reported
 *     in S. After deciding, a peer reports only DECIDED(e, S, step),
 *     which every member of view e that hears it adopts (or learns that
 *     it was left out).
 *   - Two peers can never decide different views for the same epoch: seen
 *     sets only grow, a decided peer reports nothing but its decision,
 *     and two quorums of view e share a member, whose reports both
 *     decisions would need (doc/elastic.md has the argument).
 *
 * The thread answers messages while the trainer computes, so that a slow
 * peer is never left out for being busy.
 */
#ifndef MESH_TRAIN_ELASTIC_H
#define MESH_TRAIN_ELASTIC_H

#include <stdint.h>
#include <sys/socket.h>

#include "transport/transport.h"

#define MESH_ELASTIC_MAX_SLOTS 64
/* The step a member reports when it holds no state (a joiner). */
#define MESH_ELASTIC_NO_STATE UINT64_MAX

struct mesh_elastic; /* opaque */

/* A view: its epoch, members (bit s = slot s) and the step to run next. */
struct mesh_elastic_view {
    uint64_t epoch;
    uint64_t members;
    int size;         /* members */
    uint64_t step;    /* every member restarts from this step's snapshot */
    uint64_t left;    /* members of the previous view not in this one */
    uint64_t prev;    /* the previous view's members */
    uint64_t needy;   /* members that hold no state (joiners): the others
                         send it to them (train/xfer.c) */
    double decided_s; /* mesh_now_s() when this peer learned the view */
};

struct mesh_elastic_opts {
    const struct mesh_world *world; /* every slot; world->rank is ours */
    const uint8_t *secret;          /* NULL: unsigned (--insecure) */
    size_t secret_len;
    const char *job_id;
    double settle_s; /* the seen set's quiet time before deciding */
    /* --peer-timeout: how long an agreement that knows of no death waits
     * for every member of a view that formed (0: the settle time only) */
    double wait_s;
    /* a UDP socket already bound to our slot's address (--rank auto's,
     * struct mesh_opts claim_fd; it is duplicated), or -1: bind one */
    int fd;
    /* Test aid (MESHTRAIN_TEST_FAULT ...:agree): raise this signal in
     * the first agreement, right after the first PROPOSE; 0: never. */
    int fault_sig;
};

/* Start the thread on view 0 (every slot). */
int mesh_elastic_start(const struct mesh_elastic_opts *o,
                       struct mesh_elastic **out);
void mesh_elastic_stop(struct mesh_elastic *e);

/*
 * The failed view's error (what the step returned), told before the
 * trainer drops its mesh: only a death (-ECONNRESET, -EHOSTDOWN) makes the
 * transport's culprit a member the agreement does not wait for.
 */
void mesh_elastic_set_failure(struct mesh_elastic *e, int rc);

/*
 * The transport of the current view (NULL while there is none): an
 * agreement that another member starts aborts it, so that every pending
 * and future operation fails at once.
 */
void mesh_elastic_set_transport(struct mesh_elastic *e,
                                const struct mesh_transport_ops *ops,
                                mesh_transport_t *t);

/*
 * The current view's mesh has formed (every member joined it): later
 * views need a quorum of it. A decided view whose mesh never formed does
 * not count: of two views decided for one epoch at most one can form,
 * since they share a member, which joins only one (doc/elastic.md).
 */
void mesh_elastic_formed(struct mesh_elastic *e);

/*
 * At a step boundary, before taking the snapshot of `step`: 0, or
 * -ECANCELED when an agreement has begun, or has even ended with a view
 * that mesh_elastic_agree has not returned yet (then keep the snapshots
 * and call mesh_elastic_agree).
 */
int mesh_elastic_commit(struct mesh_elastic *e, uint64_t step);

/*
 * Leave the current view (if no agreement has begun yet) and wait up to
 * timeout_s for the next one. A joiner waits for the view that admits
 * it. Returns 0 with *out, or:
 *   -EPERM      the others decided a view without this peer;
 *   -ETIMEDOUT  no quorum within timeout_s (a partition's minority), or
 *               a joiner not admitted;
 *   -EACCES     a joiner refused (another job id or secret);
 * with a message.
 */
int mesh_elastic_agree(struct mesh_elastic *e, double timeout_s,
                       struct mesh_elastic_view *out);

/*
 * A peer started with --elastic asks the job's slots to admit it (JOIN,
 * signed like every message) for up to wait_s. Returns 1 when a member of
 * a running job answered (the peer is then a joiner: mesh_elastic_agree
 * waits for the view change that admits it), 0 when none did (the job
 * is starting: the peer is one of view 0), or -EACCES when a peer refused
 * the request (another job id or secret), with a message.
 */
int mesh_elastic_probe(struct mesh_elastic *e, double wait_s);

/*
 * The joiners that asked lately (a mask of slots), when this member's
 * view has formed: at a step boundary the trainer then starts a view
 * change (mesh_elastic_agree) that admits them. 0: none.
 */
uint64_t mesh_elastic_joins(struct mesh_elastic *e);

/*
 * The slots whose join requests this peer refused (another secret or
 * job), as the requests named them: a test aid's wait (train.c,
 * MESHTRAIN_TEST_JOIN_AT) ends on them too.
 */
uint64_t mesh_elastic_refused(struct mesh_elastic *e);

/*
 * The catch-up of a joiner while the job trains (train/catchup.c,
 * doc/elastic.md "Catching up"):
 *   - a member tells its side port in its STATUS answers (0: none);
 *   - a joiner that holds its join asks the members not to admit it yet
 *     (its JOIN's step field is 1); clearing the hold asks for admission;
 *   - mesh_elastic_side_view gives the view the running members reported
 *     and each member's port (0, or -EAGAIN while not every member of
 *     it answered with one);
 *   - mesh_elastic_join_view: 1 + the epoch (as the members reported
 *     it) whose side sessions the joiner catches up from, 0 when it does
 *     not; in its JOINs. A member that has left that epoch does not
 *     admit it (it drained those sessions) until it asks from a later
 *     one;
 *   - mesh_elastic_passed: the newest view a running member named in
 *     its answers (0: none yet): the members drained the side sessions
 *     of the views before it;
 *   - mesh_elastic_held: the held requests heard lately (a member);
 *     mesh_elastic_take_held (test aid) admits held requests too.
 */
void mesh_elastic_set_side(struct mesh_elastic *e, uint16_t port);
void mesh_elastic_join_hold(struct mesh_elastic *e, int hold);
void mesh_elastic_join_view(struct mesh_elastic *e, uint64_t epoch1);
/* A joiner: step1 = 1 + the step its catch-up holds (0: none): its JOIN
 * holds until every member reports (STATUS) that step committed, so that
 * the view that admits it restarts from that step or a later one. */
void mesh_elastic_join_need(struct mesh_elastic *e, uint64_t step1);
int mesh_elastic_side_view(struct mesh_elastic *e, uint64_t *epoch,
                           uint64_t *members, uint16_t ports[]);
uint64_t mesh_elastic_passed(struct mesh_elastic *e);
uint64_t mesh_elastic_held(struct mesh_elastic *e);
void mesh_elastic_take_held(struct mesh_elastic *e);
/*
 * on: a member leaves its view as soon as it hears a peer ask to be
 * admitted (a fresh, unheld JOIN), from the agreement's thread, instead
 * of at its next step boundary (mesh_elastic_joins), unless another
 * joiner is catching up (held: it may be ready by then); the trainer turns
 * it off where it cannot redo a step (its last) and for the test aids
 * that wait at a boundary for joiners.
 */
void mesh_elastic_set_eager(struct mesh_elastic *e, int on);
/*
 * Test aid (tests/test_elastic.c): the thread stalls for secs, once, as
 * soon as it is in an agreement (it has sent no PROPOSE yet): a member
 * slow to vote, as on a loaded machine. mesh_elastic_stop ends a stall.
 */
void mesh_elastic_test_stall(struct mesh_elastic *e, double secs);
/* Slot's address as resolved for the agreement (its TCP host). */
int mesh_elastic_addr(struct mesh_elastic *e, int slot,
                      struct sockaddr_storage *ss, socklen_t *len);

/* The current view. */
void mesh_elastic_current(struct mesh_elastic *e,
                          struct mesh_elastic_view *out);

/* "0,3,5" of a slot mask. */
const char *mesh_elastic_slots_str(uint64_t mask, char *buf, size_t len);

#endif
