/*
 * train/elastic.c: the view agreement of --elastic (see train/elastic.h
 * and doc/elastic.md): one UDP socket and one thread per peer.
 */
#include "config.h"

#include "train/elastic.h"

#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSG_MAGIC   0x4c45454dU /* "MEEL" little-endian */
#define MSG_VERSION 2
#define MSG_BODY    64
#define MSG_BYTES   (MSG_BODY + 32)
#define TICK_MS     10
#define RESEND_S    0.02
#define ANNOUNCE_S  3.0 /* a decision is re-sent this long */
#define HISTORY     64
#define SILENT_S    0.3 /* a member of seen this quiet ends the round */
#define IDLE_MS     100 /* the thread's tick while nothing is going on */
/* how long a member not heard is waited for once a death is known: a
 * live process's scheduling stall on a loaded machine (some 200-300 ms
 * at a load of 40 on 2 cores), with margin (wait_limit) */
#define DEATH_WAIT_S 1.0

#define JOIN_RESEND_S 0.1
#define JOIN_FRESH_S  1.0 /* a join request this old is stale */

enum msg_type {
    MSG_PROPOSE = 1,
    MSG_DECIDED = 2,
    MSG_JOIN = 3,    /* a peer started later asks to be admitted */
    MSG_STATUS = 4,  /* a member's answer to it: its view */
    MSG_REFUSED = 5, /* unsigned answer to a JOIN that failed the checks */
};

/* MSG_REFUSED's reasons (its step field) */
enum { REFUSED_SECRET = 1, REFUSED_JOB = 2, REFUSED_WORLD = 3 };

enum state { ST_NORMAL, ST_AGREEING, ST_EXCLUDED, ST_JOINING };

struct decision {
    uint64_t epoch;   /* of the view left */
    uint64_t prev;    /* that view's members */
    uint64_t members; /* the next view's */
    uint64_t step;
    uint64_t needy; /* its members that hold no state (joiners) */
};

struct mesh_elastic {
    int nslots, me, fd;
    struct sockaddr_storage addr[MESH_ELASTIC_MAX_SLOTS];
    socklen_t addrlen[MESH_ELASTIC_MAX_SLOTS];
    uint8_t secret[256];
    size_t secret_len;
    uint8_t job[8]; /* SHA-256 of the job id, first bytes */
    /* SHA-256 of the slots' host:port (mesh_world_digest), first bytes:
     * every message carries them (a JOIN the slot count too), so that a
     * peer started with another hostfile is not heard, and its JOIN is
     * refused at once (REFUSED_WORLD) */
    uint8_t layout[4];
    /* when a REFUSED_WORLD to a slot was last logged (the last entry:
     * slots past ours) */
    double world_warned[MESH_ELASTIC_MAX_SLOTS + 1];
    double settle_s;
    double wait_s; /* --peer-timeout: see wait_limit */
    int fault_sig;

    pthread_t thread;
    int running, stop;
    double started; /* monotonic seconds */
    double cpu_s;   /* the thread's CPU time, when it ended */
    pthread_mutex_t mu;
    pthread_cond_t cv;

    const struct mesh_transport_ops *ops;
    mesh_transport_t *t;

    /* the view, and the agreement on leaving it */
    enum state state;
    uint64_t epoch, members;
    uint64_t base;      /* the last view whose mesh formed: quorums of it */
    uint64_t committed; /* the lowest step whose snapshot is kept */
    uint32_t round;     /* of this epoch's agreement */
    uint64_t seen;      /* members heard in this round (grows) */
    double seen_at;     /* when seen last grew */
    uint64_t report[MESH_ELASTIC_MAX_SLOTS]; /* each one's seen set */
    uint64_t rstep[MESH_ELASTIC_MAX_SLOTS];  /* and step */
    double heard_at[MESH_ELASTIC_MAX_SLOTS]; /* its last PROPOSE */
    uint64_t heard; /* whose report of this round we hold */
    /* members of this epoch our own mesh blamed for its failure (its
     * culprit, taken when the trainer drops the mesh, if the failure was
     * a death: fail_rc): no one waits for their PROPOSE */
    uint64_t blamed;
    int fail_rc;   /* the failed mesh's error (mesh_elastic_set_failure) */
    uint64_t adds; /* joiners this agreement admits (grows) */
    uint64_t radds[MESH_ELASTIC_MAX_SLOTS]; /* each one's adds */
    uint64_t joins;     /* join requests heard while NORMAL */
    uint64_t held;      /* of which these ask to wait: they are catching up */
    int take_held;      /* test aid: admit held requests too */
    int eager;          /* leave at once when a peer asks to be admitted */
    uint16_t side_port; /* ours, told in STATUS */
    uint16_t side[MESH_ELASTIC_MAX_SLOTS]; /* the members' (STATUS) */
    uint64_t side_epoch[MESH_ELASTIC_MAX_SLOTS];
    uint64_t side_members[MESH_ELASTIC_MAX_SLOTS];
    uint64_t status_from; /* running members whose STATUS we hold */
    int hold;             /* a joiner: our JOIN asks the members to wait */
    /* a joiner: 1 + the step its catch-up holds (0: none); its JOIN holds
     * until every member reports a committed step at least that one */
    uint64_t need;
    uint64_t side_committed[MESH_ELASTIC_MAX_SLOTS]; /* 1 + (STATUS) */
    uint64_t hold_view; /* a joiner: 1 + the epoch it catches up from */
    double join_at[MESH_ELASTIC_MAX_SLOTS]; /* the latest, per slot */
    /* its hold_view (0: it does not catch up) */
    uint64_t join_view[MESH_ELASTIC_MAX_SLOTS];
    int formed_once; /* a view's mesh has formed here */
    /* the trainer asked whether a job runs (mesh_elastic_probe); until
     * then no agreement may count this process as a member: a slot's
     * restarted process would report step 0 in the agreement that leaves
     * its dead predecessor out, and the view would restart from a step
     * no member holds */
    int probed;
    /* ST_JOINING: the epoch a running member reported (a decision for
     * an older epoch is stale), whether one has, and a refusal */
    uint64_t join_epoch;
    int join_heard, refused;
    uint64_t passed;   /* ST_JOINING: the newest view a member named */
    uint64_t answered; /* slots that answered our join request */
    /* our last refusal sent to a slot (the last entry: slots past ours);
     * one for all made two joiners refused at once starve: the first's
     * requests came first every time */
    double refused_at[MESH_ELASTIC_MAX_SLOTS + 1];
    uint64_t refused_slots; /* the slots whose join requests we refused */
    double decided_at;      /* when the last decision was adopted */
    const struct mesh_world *world;
    char refused_by[MESH_HOST_MAX + 16];
    uint32_t refused_nslots; /* REFUSED_WORLD: the job's slot count */
    uint64_t my_step;        /* frozen on leaving */
    double left_at;          /* when this peer left its view (leave) */
    struct decision last;    /* the latest decision, re-sent a while */
    double announce_until;   /* monotonic seconds */
    double sent_at;
    int decided;    /* a decision waits for mesh_elastic_agree */
    double stall_s; /* test aid: mesh_elastic_test_stall */
    int early;      /* ours, taken before the settle time (try_decide) */
    struct decision hist[HISTORY];
    int nhist;
};

static int popcount64(uint64_t x)
{
    return __builtin_popcountll(x);
}

const char *mesh_elastic_slots_str(uint64_t mask, char *buf, size_t len)
{
    size_t n = 0;
    int s;

    buf[0] = '\0';
    for (s = 0; s < 64 && n + 4 < len; s++)
        if (mask >> s & 1)
            n += (size_t)snprintf(buf + n, len - n, "%s%d", n ? "," : "", s);
    if (!n)
        snprintf(buf, len, "none");
    return buf;
}

/* ---- messages ------------------------------------------------------------ */

static int sign(const struct mesh_elastic *e, const uint8_t *body,
                uint8_t mac[32])
{
    unsigned int len = 32;

    if (!HMAC(EVP_sha256(), e->secret, (int)e->secret_len, body, MSG_BODY, mac,
              &len) ||
        len != 32)
        return -EIO;
    return 0;
}

static void send_msg(struct mesh_elastic *e, int type, uint64_t epoch,
                     uint64_t mask, uint64_t step, uint64_t extra,
                     uint64_t extra2, int to)
{
    uint32_t round = type == MSG_PROPOSE ? e->round : 0;
    uint8_t m[MSG_BYTES];

    memset(m, 0, sizeof(m));
    mesh_put_le32(m, MSG_MAGIC);
    m[4] = MSG_VERSION;
    m[5] = (uint8_t)type;
    mesh_put_le16(m + 6, (uint16_t)e->me);
    memcpy(m + 8, e->job, 8);
    mesh_put_le64(m + 16, epoch);
    mesh_put_le64(m + 24, mask);
    mesh_put_le64(m + 32, step);
    mesh_put_le32(m + 40, round);
    mesh_put_le64(m + 44, extra);
    mesh_put_le64(m + 52, extra2);
    /* our world: a peer of another hostfile is not heard, and a job
     * refuses its JOIN at once */
    if (type == MSG_JOIN)
        mesh_put_le32(m + 40, (uint32_t)e->nslots);
    memcpy(m + 60, e->layout, 4);
    if (sign(e, m, m + MSG_BODY) < 0)
        return;
    /* a lost datagram is re-sent at the next tick */
    (void)sendto(e->fd, m, sizeof(m), MSG_DONTWAIT,
                 (const struct sockaddr *)&e->addr[to], e->addrlen[to]);
}

static void send_all(struct mesh_elastic *e, int type, uint64_t epoch,
                     uint64_t to_mask, uint64_t mask, uint64_t step,
                     uint64_t extra, uint64_t extra2)
{
    for (int s = 0; s < e->nslots; s++)
        if (s != e->me && (to_mask >> s & 1))
            send_msg(e, type, epoch, mask, step, extra, extra2, s);
}

/* A decision goes to the members of the view left and to its joiners. */
static void send_decided(struct mesh_elastic *e, const struct decision *d)
{
    send_all(e, MSG_DECIDED, d->epoch, d->prev | d->members, d->members,
             d->step, d->needy, d->prev);
}

/* ---- the agreement ------------------------------------------------------- */

static const struct decision *find_decision(const struct mesh_elastic *e,
                                            uint64_t epoch)
{
    for (int i = 0; i < e->nhist; i++)
        if (e->hist[i].epoch == epoch)
            return &e->hist[i];
    return NULL;
}

/* Under mu: start round r of the agreement: seen is only us again. */
static void new_round(struct mesh_elastic *e, uint32_t r)
{
    double now = mesh_now_s();

    e->round = r;
    e->seen = UINT64_C(1) << e->me;
    e->seen_at = now;
    e->heard = UINT64_C(1) << e->me;
    e->report[e->me] = e->seen;
    e->radds[e->me] = e->adds;
    e->rstep[e->me] = e->my_step;
    for (int s = 0; s < e->nslots; s++)
        e->heard_at[s] = now;
    e->sent_at = 0;
}

/*
 * Wake the thread from its idle poll (IDLE_MS): an empty datagram to our
 * own socket, which receive() drops.
 */
static void wake(struct mesh_elastic *e)
{
    (void)sendto(e->fd, "", 0, MSG_DONTWAIT,
                 (const struct sockaddr *)&e->addr[e->me], e->addrlen[e->me]);
}

/* Under mu: slot s catches up from sessions of an earlier epoch than
 * ours: we drained them when we left it, so the steps since never
 * reached it; admitted, it would need the whole state. It asks again
 * once it caught up from our epoch (train/catchup.c). */
static int stale_catchup(const struct mesh_elastic *e, int s)
{
    return e->join_view[s] && e->join_view[s] - 1 < e->epoch;
}

/* Under mu: the joiners heard lately that are not members. */
static uint64_t fresh_joins(struct mesh_elastic *e)
{
    double now = mesh_now_s();
    uint64_t j = 0;

    for (int s = 0; s < e->nslots; s++)
        if ((e->joins >> s & 1) && !(e->members >> s & 1) &&
            (e->take_held || (!(e->held >> s & 1) && !stale_catchup(e, s))) &&
            now - e->join_at[s] < JOIN_FRESH_S)
            j |= UINT64_C(1) << s;
    return j;
}

/* Under mu: the held join requests heard lately (joiners catching up). */
static uint64_t held_joins(struct mesh_elastic *e)
{
    double now = mesh_now_s();
    uint64_t j = 0;

    for (int s = 0; s < e->nslots; s++)
        if ((e->joins & e->held) >> s & 1 && !(e->members >> s & 1) &&
            now - e->join_at[s] < JOIN_FRESH_S)
            j |= UINT64_C(1) << s;
    return j;
}

/* Under mu: leave the current view (once per epoch). */
static void leave(struct mesh_elastic *e)
{
    if (e->state != ST_NORMAL)
        return;
    e->state = ST_AGREEING;
    e->eager = 0; /* until the trainer's next step boundary */
    e->my_step = e->committed;
    e->left_at = mesh_now_s();
    e->adds = fresh_joins(e);
    new_round(e, 0);
    if (e->ops && e->t)
        e->ops->abort(e->t, -1, "the mesh's view is changing");
    wake(e); /* to send PROPOSE now, when the trainer left */
    pthread_cond_broadcast(&e->cv);
}

/* Under mu: adopt decision d of our epoch. */
static void adopt(struct mesh_elastic *e, const struct decision *d)
{
    if (e->nhist < HISTORY)
        e->hist[e->nhist++] = *d;
    else {
        memmove(e->hist, e->hist + 1, (HISTORY - 1) * sizeof(e->hist[0]));
        e->hist[HISTORY - 1] = *d;
    }
    e->last = *d;
    e->announce_until = mesh_now_s() + ANNOUNCE_S;
    if (!(d->members >> e->me & 1)) {
        e->state = ST_EXCLUDED;
    } else {
        e->state = ST_NORMAL;
        e->epoch = d->epoch + 1;
        e->members = d->members;
        /* a joiner holds no snapshot until the state arrives */
        e->committed = d->needy >> e->me & 1 ? MESH_ELASTIC_NO_STATE : d->step;
    }
    e->joins &= ~d->members;
    e->adds = 0;
    e->blamed = 0;
    e->fail_rc = 0;
    e->decided = 1;
    e->eager = 0; /* until the trainer's next step boundary */
    e->decided_at = mesh_now_s();
    pthread_cond_broadcast(&e->cv);
}

/*
 * Under mu: how long after leaving the view this peer waits for every
 * member of it (not blamed) before the settle time may decide. Every
 * member of a view whose mesh formed was alive then: one not heard yet
 * is more likely slow (a loaded machine's scheduling stall) than dead.
 * The settle time alone once left such a live member out of a join's
 * view change, or of the one after a joiner's death (it exited 5, and
 * the job shrank for nothing).
 *   - The view formed and this peer knows of no death (its mesh blamed
 *     nobody and did not fail of one: a join at a step boundary, or
 *     another member's PROPOSE aborted this peer's mesh): --peer-timeout,
 *     the silence after which a peer is dead anywhere else. A member
 *     that died meanwhile is blamed by a peer whose mesh saw it, which
 *     decides sooner (the others adopt its decision), or costs the wait.
 *   - The view formed and a death is known: DEATH_WAIT_S at most, since
 *     a second death at once (which no mesh blames) is likely then.
 *   - The view never formed (view 0 with spares, a mesh that could not
 *     be joined): 0, the settle time only; a member may never have
 *     started.
 */
static double wait_limit(const struct mesh_elastic *e)
{
    if (!e->formed_once || e->base != e->members)
        return 0;
    if (!e->blamed && e->fail_rc != -ECONNRESET && e->fail_rc != -EHOSTDOWN)
        return e->wait_s;
    return MESH_MIN(e->wait_s, DEATH_WAIT_S);
}

/*
 * Under mu: decide if every member of our seen set reports it. The settle
 * time waits for members not heard yet (wait_limit: every member, for a
 * while); when there are none (every member of the view was
 * heard, or is the one our mesh blamed for its failure) there is nobody
 * to wait for, and the decision is taken at once.
 */
static void try_decide(struct mesh_elastic *e)
{
    struct decision d;
    uint64_t step = UINT64_MAX;
    double now = mesh_now_s();
    int early;

    if (e->state != ST_AGREEING)
        return;
    early = ((e->seen | e->blamed) & e->members) == e->members;
    if (!early && now - e->seen_at < e->settle_s)
        return;
    if (!early && now - e->left_at < wait_limit(e))
        return;
    if (2 * popcount64(e->seen & e->base) <= popcount64(e->base))
        return; /* no quorum of the last view that formed */
    d.needy = e->adds;
    for (int s = 0; s < e->nslots; s++) {
        if (!(e->seen >> s & 1))
            continue;
        if (!(e->heard >> s & 1) || e->report[s] != e->seen ||
            e->radds[s] != e->adds)
            return;
        if (e->rstep[s] == MESH_ELASTIC_NO_STATE)
            d.needy |= UINT64_C(1) << s;
        else if (e->rstep[s] < step)
            step = e->rstep[s];
    }
    d.epoch = e->epoch;
    d.prev = e->members;
    d.members = e->seen | e->adds;
    d.step = step; /* MESH_ELASTIC_NO_STATE: nobody holds it */
    e->early = early && now - e->seen_at < e->settle_s;
    adopt(e, &d);
    send_decided(e, &d);
}

/* Under mu: a join request from slot from (verified). */
static void take_join(struct mesh_elastic *e, int from, uint64_t hold,
                      uint64_t view)
{
    uint64_t bit = UINT64_C(1) << from;
    int running = e->formed_once || e->epoch > 0;

    if (e->state == ST_EXCLUDED)
        return;
    if (e->state == ST_JOINING) {
        /* we are not training either */
        send_msg(e, MSG_STATUS, 0, 0, 0, 0, 0, from);
        return;
    }
    /* a member's slot asks again: its old process died, which the mesh
     * will notice; it is admitted by the view change after that */
    if (running && !(e->members & bit)) {
        e->joins |= bit;
        e->join_at[from] = mesh_now_s();
        /* a joiner catching up (train/catchup.c) asks to wait */
        e->held = hold == 1 ? e->held | bit : e->held & ~bit;
        e->join_view[from] = view;
        if (e->state == ST_AGREEING && !(e->adds & bit) &&
            (e->take_held || (hold != 1 && !stale_catchup(e, from)))) {
            e->adds |= bit;
            e->radds[e->me] = e->adds;
            e->seen_at = mesh_now_s();
        }
        /* admitted now, not at the next step boundary: the view restarts
         * from the step in flight, as it would from a boundary where
         * another member had not committed it yet. Not while another
         * joiner catches up: at the boundary, as before, both enter in
         * one view change if both are ready by then */
        if (e->eager && e->state == ST_NORMAL && e->formed_once &&
            (fresh_joins(e) & bit) && !(held_joins(e) & ~bit)) {
            mesh_debug("slot %d asks to be admitted: leaving view %" PRIu64
                       " at step %" PRIu64 " (committed)",
                       from, e->epoch, e->committed);
            leave(e);
        }
    }
    /* 1 + the step committed: a joiner asks to be admitted only once
     * every member has committed the step its snapshot holds (the view
     * restarts from the lowest step committed) */
    send_msg(e, MSG_STATUS, e->epoch, e->members, (uint64_t)running,
             e->side_port, running ? e->committed + 1 : 0, from);
}

/*
 * Under mu (a joiner): every member of the view the members reported
 * has committed the step its catch-up holds (e->need), or reports no
 * step (an older build: nothing to wait for).
 */
static int need_met(const struct mesh_elastic *e)
{
    uint64_t ep = 0, mask = 0;

    if (!e->need)
        return 1;
    for (int s = 0; s < e->nslots; s++)
        if ((e->status_from >> s & 1) && e->side_epoch[s] >= ep) {
            ep = e->side_epoch[s];
            mask = e->side_members[s];
        }
    for (int s = 0; s < e->nslots; s++)
        if ((mask >> s & 1) &&
            (!(e->status_from >> s & 1) || e->side_epoch[s] != ep ||
             (e->side_committed[s] && e->side_committed[s] < e->need)))
            return 0;
    return mask != 0;
}

/* Under mu: a member's answer to our join request. */
static void take_status(struct mesh_elastic *e, int from, uint64_t epoch,
                        uint64_t mask, uint64_t running, uint64_t port,
                        uint64_t committed1)
{
    if (e->state != ST_JOINING)
        return;
    e->answered |= UINT64_C(1) << from;
    if (running && port < 65536) {
        int met = need_met(e);

        e->side[from] = (uint16_t)port;
        e->side_epoch[from] = epoch;
        e->side_members[from] = mask;
        e->side_committed[from] = committed1;
        e->status_from |= UINT64_C(1) << from;
        if (!met && need_met(e))
            e->sent_at = 0; /* ask now: the JOIN no longer holds */
    }
    if (!running) {
        pthread_cond_broadcast(&e->cv);
        return;
    }
    if (epoch > e->passed)
        e->passed = epoch;
    /* epochs only grow: a decision for an older epoch than any member
     * reported now is stale (re-sent for a while after it was made) */
    if (!e->join_heard || epoch < e->join_epoch)
        e->join_epoch = epoch;
    e->join_heard = 1;
    pthread_cond_broadcast(&e->cv);
}

/* Under mu: one verified message. */
static void take(struct mesh_elastic *e, int type, int from, uint64_t epoch,
                 uint32_t round, uint64_t mask, uint64_t step, uint64_t extra,
                 uint64_t extra2)
{
    const struct decision *d;

    if (type == MSG_JOIN) {
        take_join(e, from, step, extra);
        return;
    }
    if (type == MSG_STATUS) {
        take_status(e, from, epoch, mask, step, extra, extra2);
        return;
    }
    if (!e->probed && !e->formed_once)
        return;
    if (e->state == ST_JOINING) {
        struct decision nd = {.epoch = epoch,
                              .prev = extra2,
                              .members = mask,
                              .step = step,
                              .needy = extra};

        /* admitted: a decision of a current epoch that names us, from a
         * member of the view it leaves */
        if (type == MSG_DECIDED && e->join_heard && epoch >= e->join_epoch &&
            (mask >> e->me & 1) && (extra2 >> from & 1)) {
            e->base = extra2; /* the view the others formed */
            adopt(e, &nd);
        }
        return;
    }
    d = find_decision(e, epoch);
    if (d) {
        /* a view we have left: tell the sender how it ended */
        if (type == MSG_PROPOSE)
            send_msg(e, MSG_DECIDED, d->epoch, d->members, d->step, d->needy,
                     d->prev, from);
        return;
    }
    if (epoch != e->epoch || e->state == ST_EXCLUDED ||
        !(e->members >> from & 1))
        return; /* a later view, or not a member: nothing to say */
    if (type == MSG_DECIDED) {
        struct decision nd = {.epoch = epoch,
                              .prev = e->members,
                              .members = mask,
                              .step = step,
                              .needy = extra};

        if (e->state == ST_NORMAL)
            leave(e);
        adopt(e, &nd);
        return;
    }
    leave(e);
    if (round < e->round)
        return; /* it will hear ours and follow */
    if (round > e->round)
        new_round(e, round);
    e->heard_at[from] = mesh_now_s();
    /* a report that grew is sent at once, not at the next resend: each
     * member decides once every one has reported the same set, which
     * took one or two resend periods (20-40 ms) of every view change */
    if (!(e->seen >> from & 1)) {
        e->seen |= UINT64_C(1) << from;
        e->seen_at = mesh_now_s();
        e->report[e->me] = e->seen;
        e->sent_at = 0;
    }
    /* the joiners a member admits are ours too (adds only grow) */
    if (extra & ~e->members & ~e->adds) {
        e->adds |= extra & ~e->members;
        e->seen_at = mesh_now_s();
        e->radds[e->me] = e->adds;
        e->sent_at = 0;
    }
    /* reports of a member only grow; keep the latest */
    e->report[from] = mask & e->members;
    e->radds[from] = extra & ~e->members;
    e->rstep[from] = step;
    e->heard |= UINT64_C(1) << from;
}

/* An unsigned refusal of a join request that failed the checks, to the
 * address it came from (at most one per tick and slot named). */
static void refuse(struct mesh_elastic *e, const uint8_t *req, int reason,
                   const struct sockaddr_storage *to, socklen_t tolen)
{
    uint8_t m[MSG_BYTES];
    double now = mesh_now_s(), *at;
    int slot = mesh_get_le16(req + 6); /* as it says: unsigned */

    pthread_mutex_lock(&e->mu);
    /* a peer that has not asked yet whether a job runs, or still asks to
     * join, speaks for no job: its refusal would reach a joiner of the
     * job before the members' own (two bad joiners at once: the one with
     * another secret heard "another job" from the other) */
    if (!e->probed || e->state == ST_JOINING) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (slot < e->nslots)
        e->refused_slots |= UINT64_C(1) << slot;
    pthread_mutex_unlock(&e->mu);
    at = &e->refused_at[MESH_MIN(slot, MESH_ELASTIC_MAX_SLOTS)];
    if (now - *at < TICK_MS / 1000.0)
        return;
    *at = now;
    memset(m, 0, sizeof(m));
    mesh_put_le32(m, MSG_MAGIC);
    m[4] = MSG_VERSION;
    m[5] = MSG_REFUSED;
    mesh_put_le16(m + 6, (uint16_t)e->me);
    memcpy(m + 8, req + 8, 8); /* the job the request named */
    mesh_put_le64(m + 32, (uint64_t)reason);
    mesh_put_le32(m + 40, (uint32_t)e->nslots); /* ours */
    (void)sendto(e->fd, m, sizeof(m), MSG_DONTWAIT, (const struct sockaddr *)to,
                 tolen);
}

/* Under mu: a refusal of our join request (unsigned: it may be forged,
 * which can only stop this joiner, never disturb the job). */
static void take_refused(struct mesh_elastic *e, const uint8_t *m,
                         const struct sockaddr_storage *src)
{
    int from = mesh_get_le16(m + 6);
    uint64_t why = mesh_get_le64(m + 32);
    char addr[INET6_ADDRSTRLEN + 16];

    if (e->state != ST_JOINING || memcmp(m + 8, e->job, 8) ||
        (from >= e->nslots && why != REFUSED_WORLD) ||
        (why != REFUSED_SECRET && why != REFUSED_JOB && why != REFUSED_WORLD))
        return;
    e->refused = (int)why;
    e->refused_nslots = mesh_get_le32(m + 40);
    if (why != REFUSED_WORLD)
        mesh_peer_name(e->world, from, e->refused_by, sizeof(e->refused_by));
    else {
        /* (another hostfile: its slot there may be none of ours) */
        mesh_sockaddr_str((const struct sockaddr *)src, addr, sizeof(addr));
        snprintf(e->refused_by, sizeof(e->refused_by), "%s (slot %d)", addr,
                 from);
    }
    pthread_cond_broadcast(&e->cv);
}

/* A signed JOIN of another world (slot count or layout): refuse it, and
 * say so here too, at most every 5 s (the joiner asks every 100 ms until
 * it hears the refusal). */
static void world_refuse(struct mesh_elastic *e, const uint8_t *m,
                         const struct sockaddr_storage *src, socklen_t srclen)
{
    uint32_t n = mesh_get_le32(m + 40);
    int slot = mesh_get_le16(m + 6);
    double now = mesh_now_s(), *at;
    int log;

    refuse(e, m, REFUSED_WORLD, src, srclen);
    at = &e->world_warned[MESH_MIN(slot, MESH_ELASTIC_MAX_SLOTS)];
    pthread_mutex_lock(&e->mu);
    log = e->probed && e->state != ST_JOINING && (!*at || now - *at > 5);
    if (log)
        *at = now;
    pthread_mutex_unlock(&e->mu);
    if (!log)
        return;
    if (n != (uint32_t)e->nslots)
        mesh_warn(
            "refused a join request from slot %d: its hostfile has %" PRIu32
            " slot(s), this job's %d (-H or --hostfile differ); the job "
            "goes on",
            slot, n, e->nslots);
    else
        mesh_warn("refused a join request from slot %d: its hostfile lists "
                  "other hosts or ports for the job's %d slots (-H or "
                  "--hostfile differ); the job goes on",
                  slot, e->nslots);
}

static void receive(struct mesh_elastic *e)
{
    uint8_t m[MSG_BYTES + 1], mac[32];
    struct sockaddr_storage src;
    socklen_t srclen = sizeof(src);
    ssize_t n;

    while ((n = recvfrom(e->fd, m, sizeof(m), MSG_DONTWAIT,
                         (struct sockaddr *)&src, &srclen)) >= 0) {
        int from;

        if (n != MSG_BYTES || mesh_get_le32(m) != MSG_MAGIC ||
            m[4] != MSG_VERSION)
            goto next;
        if (m[5] == MSG_REFUSED) {
            pthread_mutex_lock(&e->mu);
            take_refused(e, m, &src);
            pthread_mutex_unlock(&e->mu);
            goto next;
        }
        if (memcmp(m + 8, e->job, 8)) {
            /* a join request of another job: say so, nothing else */
            if (m[5] == MSG_JOIN)
                refuse(e, m, REFUSED_JOB, &src, srclen);
            goto next;
        }
        if (sign(e, m, mac) < 0 ||
            CRYPTO_memcmp(mac, m + MSG_BODY, sizeof(mac)) != 0) {
            /* unsigned, or another secret: a joiner is told why */
            if (m[5] == MSG_JOIN)
                refuse(e, m, REFUSED_SECRET, &src, srclen);
            goto next;
        }
        from = mesh_get_le16(m + 6);
        if (memcmp(m + 60, e->layout, 4) ||
            (m[5] == MSG_JOIN &&
             mesh_get_le32(m + 40) != (uint32_t)e->nslots)) {
            /* a peer of this job (it has the secret), started with
             * another hostfile: its JOIN is refused at once, nothing of
             * ours changes */
            if (m[5] == MSG_JOIN)
                world_refuse(e, m, &src, srclen);
            goto next;
        }
        if (from >= e->nslots || from == e->me || m[5] < MSG_PROPOSE ||
            m[5] > MSG_STATUS)
            goto next;
        pthread_mutex_lock(&e->mu);
        take(e, m[5], from, mesh_get_le64(m + 16), mesh_get_le32(m + 40),
             mesh_get_le64(m + 24), mesh_get_le64(m + 32),
             mesh_get_le64(m + 44), mesh_get_le64(m + 52));
        pthread_mutex_unlock(&e->mu);
    next:
        srclen = sizeof(src);
    }
}

/* Under mu: has a member of seen gone quiet in this round? */
static int silent_member(const struct mesh_elastic *e, double now)
{
    for (int s = 0; s < e->nslots; s++)
        if (s != e->me && (e->seen >> s & 1) && now - e->heard_at[s] > SILENT_S)
            return 1;
    return 0;
}

static void *thread_main(void *arg)
{
    struct mesh_elastic *e = arg;
    struct pollfd pf = {.fd = e->fd, .events = POLLIN};
    struct rusage ru;

    for (;;) {
        double now;
        int idle;

        pthread_mutex_lock(&e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        if (e->state == ST_AGREEING && e->stall_s > 0) {
            uint64_t until = mesh_now_ns() + (uint64_t)(e->stall_s * 1e9);

            e->stall_s = 0;
            while (!e->stop && mesh_cond_sleep(&e->cv, &e->mu, until) == 0)
                ;
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        now = mesh_now_s();
        try_decide(e);
        if (e->state == ST_AGREEING && silent_member(e, now)) {
            /* a member died during the agreement: start again without
             * it (doc/elastic.md, "Rounds") */
            new_round(e, e->round + 1);
        }
        if (e->state == ST_JOINING && now - e->sent_at >= JOIN_RESEND_S) {
            send_all(e, MSG_JOIN, 0, ~(uint64_t)0, 0,
                     (uint64_t)(e->hold || !need_met(e)), e->hold_view, 0);
            e->sent_at = now;
        } else if (e->state == ST_AGREEING && now - e->sent_at >= RESEND_S) {
            send_all(e, MSG_PROPOSE, e->epoch, e->members, e->seen, e->my_step,
                     e->adds, 0);
            e->sent_at = now;
            if (e->fault_sig) {
                int sig = e->fault_sig;

                e->fault_sig = 0;
                fprintf(stderr,
                        "meshtrain: test fault: signal %d during the "
                        "agreement\n",
                        sig);
                raise(sig);
            }
        } else if (e->state != ST_AGREEING && e->state != ST_JOINING &&
                   now < e->announce_until &&
                   now - e->sent_at >= 5 * RESEND_S) {
            send_decided(e, &e->last);
            e->sent_at = now;
        }
        /* training, nothing to re-send: no need to tick often (a
         * datagram, or wake(), ends the poll at once) */
        idle = e->state == ST_NORMAL && now >= e->announce_until;
        pthread_mutex_unlock(&e->mu);
        if (poll(&pf, 1, idle ? IDLE_MS : TICK_MS) > 0)
            receive(e);
    }
    /* its cost, for mesh_elastic_stop's log (bench/elastic_cost.sh) */
    if (getrusage(RUSAGE_THREAD, &ru) == 0)
        e->cpu_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
                   1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    return NULL;
}

/* Under mu: the refusal of our join request, as an error. */
static int refused_err(const struct mesh_elastic *e)
{
    if (e->refused == REFUSED_WORLD && e->refused_nslots != (uint32_t)e->nslots)
        return mesh_err(-EACCES,
                        "the job's peer %s refused this peer: the job has "
                        "%" PRIu32 " slot(s), this peer's hostfile %d (-H or "
                        "--hostfile differ from the job's)",
                        e->refused_by, e->refused_nslots, e->nslots);
    if (e->refused == REFUSED_WORLD)
        return mesh_err(-EACCES,
                        "the job's peer %s refused this peer: the job's "
                        "hostfile lists other hosts or ports for its %d "
                        "slots than this peer's (-H or --hostfile differ)",
                        e->refused_by, e->nslots);
    return mesh_err(-EACCES, "the job's peer %s refused this peer: %s",
                    e->refused_by,
                    e->refused == REFUSED_JOB
                        ? "it runs another job (--job-id differs)"
                        : "the join request's signature is wrong (another "
                          "--secret-file, or --insecure on one side only)");
}

/* ---- setup --------------------------------------------------------------- */

static int resolve(struct mesh_elastic *e, const struct mesh_world *w, int s,
                   int family)
{
    struct addrinfo hints, *res = NULL;
    char port[16];
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = family;
    hints.ai_socktype = SOCK_DGRAM;
    snprintf(port, sizeof(port), "%u", (unsigned)w->peers[s].port);
    rc = getaddrinfo(w->peers[s].host, port, &hints, &res);
    if (rc != 0 || !res)
        return mesh_err(-EHOSTUNREACH, "--elastic: cannot resolve %s: %s",
                        w->peers[s].host, gai_strerror(rc));
    memcpy(&e->addr[s], res->ai_addr, res->ai_addrlen);
    e->addrlen[s] = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int mesh_elastic_start(const struct mesh_elastic_opts *o,
                       struct mesh_elastic **out)
{
    const struct mesh_world *w = o->world;
    struct mesh_elastic *e;
    unsigned char md[32];
    unsigned int mdlen = 0;
    char name[MESH_HOST_MAX + 16];
    int rc, s;

    if (w->size > MESH_ELASTIC_MAX_SLOTS)
        return mesh_err(-EINVAL, "--elastic: at most %d peers (%d given)",
                        MESH_ELASTIC_MAX_SLOTS, w->size);
    if (o->secret_len > sizeof(e->secret))
        return mesh_err(-EINVAL,
                        "--elastic: the secret is longer than %zu "
                        "bytes",
                        sizeof(e->secret));
    e = calloc(1, sizeof(*e));
    if (!e)
        return mesh_err(-ENOMEM, "out of memory");
    e->fd = -1;
    e->world = w;
    e->nslots = w->size;
    e->me = w->rank;
    e->settle_s = o->settle_s;
    e->wait_s = o->wait_s;
    e->fault_sig = o->fault_sig;
    if (o->secret) {
        memcpy(e->secret, o->secret, o->secret_len);
        e->secret_len = o->secret_len;
    }
    if (!EVP_Digest(o->job_id, strlen(o->job_id), md, &mdlen, EVP_sha256(),
                    NULL)) {
        rc = mesh_err(-EIO, "EVP_Digest(sha256) failed");
        goto fail_e;
    }
    memcpy(e->job, md, 8);
    rc = mesh_world_digest(w, md);
    if (rc < 0)
        goto fail_e;
    memcpy(e->layout, md, 4);
    e->members = w->size == 64 ? UINT64_MAX : (UINT64_C(1) << w->size) - 1;
    e->base = e->members;
    /* our own address first, then the others' in its family */
    rc = resolve(e, w, e->me, AF_UNSPEC);
    for (s = 0; s < w->size && rc == 0; s++)
        if (s != e->me)
            rc = resolve(e, w, s, e->addr[e->me].ss_family);
    if (rc < 0)
        goto fail_e;
    if (o->fd >= 0) {
        e->fd = fcntl(o->fd, F_DUPFD_CLOEXEC, 0);
        if (e->fd < 0) {
            rc = mesh_err_errno("--elastic: dup");
            goto fail_e;
        }
    } else {
        e->fd = socket(e->addr[e->me].ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (e->fd < 0) {
            rc = mesh_err_errno("--elastic: socket");
            goto fail_e;
        }
        /* no SO_REUSEADDR: a second process of this slot on this host
         * fails here instead of sharing its messages */
        if (bind(e->fd, (struct sockaddr *)&e->addr[e->me], e->addrlen[e->me]) <
            0) {
            rc = mesh_err_errno("--elastic: cannot bind UDP %s (is another "
                                "peer of this slot running here?)",
                                mesh_peer_name(w, e->me, name, sizeof(name)));
            goto fail_fd;
        }
    }
    pthread_mutex_init(&e->mu, NULL);
    rc = mesh_cond_init_monotonic(&e->cv);
    if (rc < 0) {
        pthread_mutex_destroy(&e->mu);
        rc = mesh_err(rc, "--elastic: pthread_cond_init: %s", strerror(-rc));
        goto fail_fd;
    }
    rc = -pthread_create(&e->thread, NULL, thread_main, e);
    if (rc < 0) {
        rc = mesh_err(rc, "--elastic: pthread_create: %s", strerror(-rc));
        goto fail_sync;
    }
    e->running = 1;
    e->started = mesh_now_s();
    *out = e;
    return 0;
fail_sync:
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
fail_fd:
    close(e->fd);
fail_e:
    OPENSSL_cleanse(e->secret, sizeof(e->secret));
    free(e);
    return rc;
}

void mesh_elastic_stop(struct mesh_elastic *e)
{
    if (!e)
        return;
    if (e->running) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        wake(e);
        pthread_cond_broadcast(&e->cv); /* a test stall */
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
        mesh_debug("--elastic: the view thread used %.6f s of CPU in %.1f s",
                   e->cpu_s, mesh_now_s() - e->started);
    }
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    close(e->fd);
    OPENSSL_cleanse(e->secret, sizeof(e->secret));
    free(e);
}

/*
 * Under mu: the slot of the member the failed mesh blames, into blamed
 * (while the view it served is still ours: not after a decision), if the
 * mesh failed of a death: a connection lost without a goodbye
 * (-ECONNRESET) or silence (-EHOSTDOWN). Other failures name a live
 * peer: one that left the mesh for this view change (-ESHUTDOWN; a loaded
 * machine may delay its PROPOSE past the others' decision, which must
 * not then leave it out), aborted the job (-ECANCELED) or sent garbage;
 * the settle time waits for them as for anyone not heard yet.
 */
static void take_culprit(struct mesh_elastic *e)
{
    int c, r = 0;

    if (!e->t || !e->ops->culprit || e->decided ||
        (e->state != ST_NORMAL && e->state != ST_AGREEING) ||
        (e->fail_rc != -ECONNRESET && e->fail_rc != -EHOSTDOWN))
        return;
    c = e->ops->culprit(e->t);
    if (c < 0)
        return;
    /* view ranks are the members in slot order */
    for (int s = 0; s < e->nslots; s++) {
        if (!(e->members >> s & 1))
            continue;
        if (r++ == c) {
            if (s != e->me)
                e->blamed |= UINT64_C(1) << s;
            return;
        }
    }
}

void mesh_elastic_set_failure(struct mesh_elastic *e, int rc)
{
    pthread_mutex_lock(&e->mu);
    e->fail_rc = rc;
    pthread_mutex_unlock(&e->mu);
}

void mesh_elastic_set_transport(struct mesh_elastic *e,
                                const struct mesh_transport_ops *ops,
                                mesh_transport_t *t)
{
    pthread_mutex_lock(&e->mu);
    take_culprit(e);
    e->ops = ops;
    e->t = t;
    /* an agreement under way, or one that ended while the trainer opened
     * this mesh (a decision that mesh_elastic_agree has not returned
     * yet, or one that left this peer out): the mesh's view is
     * superseded, and the others have left it or will */
    if (t && (e->state != ST_NORMAL || e->decided))
        ops->abort(t, -1, "the mesh's view is changing");
    pthread_mutex_unlock(&e->mu);
}

void mesh_elastic_formed(struct mesh_elastic *e)
{
    pthread_mutex_lock(&e->mu);
    /* members is the view that formed, unless a later view has been
     * adopted meanwhile (it has not formed) */
    if (!e->decided)
        e->base = e->members;
    e->formed_once = 1;
    pthread_mutex_unlock(&e->mu);
}

int mesh_elastic_commit(struct mesh_elastic *e, uint64_t step)
{
    int rc = 0;

    pthread_mutex_lock(&e->mu);
    /* an agreement under way, or one that this peer's thread ended
     * (adopted) while the trainer was away from its transport: a test
     * aid's wait at a boundary, or a view's mesh still opening. The
     * trainer must join that view (mesh_elastic_agree returns it) */
    if (e->state != ST_NORMAL || e->decided)
        rc = -ECANCELED;
    else
        e->committed = step;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void mesh_elastic_current(struct mesh_elastic *e, struct mesh_elastic_view *out)
{
    pthread_mutex_lock(&e->mu);
    out->epoch = e->epoch;
    out->members = e->members;
    out->size = popcount64(e->members);
    out->step = e->committed;
    out->left = 0;
    pthread_mutex_unlock(&e->mu);
}

int mesh_elastic_probe(struct mesh_elastic *e, double wait_s)
{
    uint64_t deadline = mesh_now_ns() + (uint64_t)(wait_s * 1e9);
    int rc = 0;

    uint64_t others =
        (e->nslots == 64 ? UINT64_MAX : (UINT64_C(1) << e->nslots) - 1) &
        ~(UINT64_C(1) << e->me);

    pthread_mutex_lock(&e->mu);
    e->probed = 1;
    e->state = ST_JOINING;
    e->sent_at = 0;
    e->decided = 0;
    e->join_heard = 0;
    e->passed = 0;
    e->hold_view = 0;
    e->need = 0;
    e->answered = 0;
    e->status_from = 0;
    wake(e); /* out of its idle poll: the first JOIN goes now */
    /* until a member of a running job answers, or every other slot said
     * that it is starting too */
    while (!e->join_heard && !e->refused && e->answered != others && rc == 0)
        rc = mesh_cond_sleep(&e->cv, &e->mu, deadline);
    if (e->refused)
        rc = refused_err(e);
    else if (e->join_heard)
        rc = 1;
    else {
        /* nobody trains yet: the job is starting, with us */
        e->state = ST_NORMAL;
        rc = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

uint64_t mesh_elastic_refused(struct mesh_elastic *e)
{
    uint64_t r;

    pthread_mutex_lock(&e->mu);
    r = e->refused_slots;
    pthread_mutex_unlock(&e->mu);
    return r;
}

uint64_t mesh_elastic_joins(struct mesh_elastic *e)
{
    uint64_t j = 0;

    pthread_mutex_lock(&e->mu);
    if (e->state == ST_NORMAL && e->formed_once)
        j = fresh_joins(e);
    pthread_mutex_unlock(&e->mu);
    return j;
}

int mesh_elastic_agree(struct mesh_elastic *e, double timeout_s,
                       struct mesh_elastic_view *out)
{
    uint64_t deadline = mesh_now_ns() + (uint64_t)(timeout_s * 1e9);
    char a[200], b[200];
    int rc = 0, joining;

    pthread_mutex_lock(&e->mu);
    joining = e->state == ST_JOINING;
    if (e->state == ST_NORMAL && !e->decided)
        leave(e);
    while (!e->decided && !e->refused && rc == 0)
        rc = mesh_cond_sleep(&e->cv, &e->mu, deadline);
    if (!e->decided && e->refused) {
        rc = refused_err(e);
    } else if (!e->decided && joining) {
        rc = mesh_err(-ETIMEDOUT,
                      "not admitted within %.1f s: the job's peers answered "
                      "but no view change took this peer in (is the job at "
                      "its end, or at --max-peers?)",
                      timeout_s);
    } else if (!e->decided) {
        rc = mesh_err(-ETIMEDOUT,
                      "no quorum for a new view within %.1f s: heard only "
                      "slot(s) %s, and a view needs more than half of the "
                      "last one that formed (slots %s)",
                      timeout_s, mesh_elastic_slots_str(e->seen, a, sizeof(a)),
                      mesh_elastic_slots_str(e->base, b, sizeof(b)));
    } else if (e->state == ST_EXCLUDED) {
        rc = mesh_err(-EPERM,
                      "left out of view %" PRIu64 ": the others (slots %s) "
                      "agreed on it without this peer",
                      e->last.epoch + 1,
                      mesh_elastic_slots_str(e->last.members, a, sizeof(a)));
    } else {
        e->decided = 0;
        out->epoch = e->epoch;
        out->members = e->members;
        out->size = popcount64(e->members);
        out->step = e->last.step;
        out->left = e->last.prev & ~e->members;
        out->prev = e->last.prev;
        out->needy = e->last.needy & e->members;
        out->decided_s = e->decided_at;
        if (e->early)
            mesh_info("view %" PRIu64 " decided without the settle time: "
                      "every member of view %" PRIu64 " heard (slots %s) "
                      "or blamed by this peer's mesh (slots %s)",
                      e->epoch, e->last.epoch,
                      mesh_elastic_slots_str(e->last.members, a, sizeof(a)),
                      mesh_elastic_slots_str(e->last.prev & ~e->last.members, b,
                                             sizeof(b)));
        e->early = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void mesh_elastic_set_side(struct mesh_elastic *e, uint16_t port)
{
    pthread_mutex_lock(&e->mu);
    e->side_port = port;
    pthread_mutex_unlock(&e->mu);
}

void mesh_elastic_join_hold(struct mesh_elastic *e, int hold)
{
    pthread_mutex_lock(&e->mu);
    e->hold = hold;
    e->sent_at = 0; /* the next JOIN says so at once */
    pthread_mutex_unlock(&e->mu);
    wake(e);
}

void mesh_elastic_join_need(struct mesh_elastic *e, uint64_t step1)
{
    pthread_mutex_lock(&e->mu);
    e->need = step1;
    pthread_mutex_unlock(&e->mu);
}

void mesh_elastic_join_view(struct mesh_elastic *e, uint64_t epoch1)
{
    pthread_mutex_lock(&e->mu);
    e->hold_view = epoch1;
    pthread_mutex_unlock(&e->mu);
}

void mesh_elastic_test_stall(struct mesh_elastic *e, double secs)
{
    pthread_mutex_lock(&e->mu);
    e->stall_s = secs;
    pthread_mutex_unlock(&e->mu);
}

void mesh_elastic_set_eager(struct mesh_elastic *e, int on)
{
    pthread_mutex_lock(&e->mu);
    /* not when an agreement began, or ended, since the trainer's commit
     * at this boundary: else the flag would outlive it into the next
     * view's opening, and a joiner's JOIN would abort that */
    e->eager = on && e->state == ST_NORMAL && !e->decided;
    pthread_mutex_unlock(&e->mu);
}

void mesh_elastic_take_held(struct mesh_elastic *e)
{
    pthread_mutex_lock(&e->mu);
    e->take_held = 1;
    pthread_mutex_unlock(&e->mu);
}

uint64_t mesh_elastic_passed(struct mesh_elastic *e)
{
    uint64_t v;

    pthread_mutex_lock(&e->mu);
    v = e->passed;
    pthread_mutex_unlock(&e->mu);
    return v;
}

uint64_t mesh_elastic_held(struct mesh_elastic *e)
{
    uint64_t j = 0;

    pthread_mutex_lock(&e->mu);
    if (e->state == ST_NORMAL && e->formed_once)
        j = held_joins(e);
    pthread_mutex_unlock(&e->mu);
    return j;
}

int mesh_elastic_side_view(struct mesh_elastic *e, uint64_t *epoch,
                           uint64_t *members, uint16_t ports[])
{
    int rc = -EAGAIN;

    pthread_mutex_lock(&e->mu);
    /* the view most running members named, if every one of its members
     * answered with a port */
    for (int s = 0; s < e->nslots && rc < 0; s++) {
        uint64_t m = e->side_members[s], ok = 0;

        if (!(e->status_from >> s & 1) || !(m >> s & 1))
            continue;
        for (int r = 0; r < e->nslots; r++)
            if ((m >> r & 1) && (e->status_from >> r & 1) &&
                e->side_epoch[r] == e->side_epoch[s] &&
                e->side_members[r] == m && e->side[r])
                ok |= UINT64_C(1) << r;
        if (ok == m && !(m >> e->me & 1)) {
            *epoch = e->side_epoch[s];
            *members = m;
            for (int r = 0; r < e->nslots; r++)
                ports[r] = (m >> r & 1) ? e->side[r] : 0;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int mesh_elastic_addr(struct mesh_elastic *e, int slot,
                      struct sockaddr_storage *ss, socklen_t *len)
{
    if (slot < 0 || slot >= e->nslots)
        return -EINVAL;
    *ss = e->addr[slot];
    *len = e->addrlen[slot];
    return 0;
}
