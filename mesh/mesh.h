/*
 * mesh/mesh.h: joining the mesh, the same way in every program.
 *
 * mesh/ is the bootstrap between the programs and the transport: it turns
 * flags, environment and a hostfile (mesh/hostfile.h) into a world (size,
 * rank, peers' addresses), opens and connects the transport, and binds the
 * rank to its CPUs (--bind-to). It includes common/ and transport/ only.
 *
 * Every program that joins the mesh (meshbench, meshtrain) takes the same
 * flags and environment variables, parsed here in one place:
 *
 *   struct mesh_opts o;
 *   struct mesh *m;
 *   mesh_opts_init(&o);
 *   for (i = 1; i < argc; ) {
 *       rc = mesh_opts_parse_arg(&o, argc, argv, &i);   // 1: consumed
 *       if (rc == 0) { ...the program's own flag argv[i]...; i++; }
 *       if (rc < 0) -> MESH_EXIT_USAGE
 *   }
 *   mesh_opts_finish(&o)           -> MESH_EXIT_USAGE on failure
 *   mesh_open(&o, "model=resnet50\nbatch=32\n", &m) -> MESH_EXIT_JOIN
 *   ... mesh_ops(m)->isend(mesh_transport(m), ...) ...  -> MESH_EXIT_PEER
 *   mesh_close(m); mesh_opts_free(&o);
 *
 * Errors follow common/util.h: 0 or a negative errno-style code, with the
 * message in mesh_err_msg().
 */
#ifndef MESH_MESH_H
#define MESH_MESH_H

#include "transport/transport.h"

#include <stdint.h>

/*
 * Exit codes of every mesh program (meshbench, meshtrain), documented in
 * their man pages and --help. meshrun exits with the code of the first rank
 * that failed on its own (not MESH_EXIT_PEER), else MESH_EXIT_PEER naming
 * the culprit the ranks report (MESH_REPORT_CULPRIT); 0 only when every
 * rank exited 0 (meshrun(1), EXIT STATUS).
 */
enum mesh_exit {
    MESH_EXIT_OK = 0,
    MESH_EXIT_USAGE = 1,  /* bad flag, hostfile, rank, secret; local error */
    MESH_EXIT_JOIN = 2,   /* could not listen or join within --join-timeout */
    MESH_EXIT_PEER = 3,   /* after joining: a peer died, went silent,
                             desynced, or the job was aborted */
    MESH_EXIT_VERIFY = 4, /* received data was wrong */
    MESH_EXIT_QUORUM = 5, /* --elastic: no quorum for a new view (the
                             minority of a partition), or left out of the
                             view the others agreed on */
    MESH_EXIT_MIN_PEERS = 6, /* --elastic: the view fell below --min-peers */
};

/*
 * --streams default: one TCP connection per link. Measured with meshbench
 * --op stream on loopback and between network namespaces on the 2-core
 * development machine; see man/meshbench.1 (STREAMS) for the figures.
 */
#define MESH_STREAMS_DEFAULT 1
#define MESH_STREAMS_MAX     16
#define MESH_SECRET_MIN      16
#define MESH_SECRET_MAX      4096

struct mesh_opts {
    /* As given on the command line; unset ones are filled from the
     * environment by mesh_opts_finish. Strings point into argv. */
    const char *hostfile;    /* --hostfile FILE */
    const char *hosts;       /* -H, --hosts h1:2,h2:2 */
    int rank;                /* --rank, -1 = unset, MESH_RANK_AUTO */
    int port;                /* --port base, 0 = unset */
    int port_lo, port_hi;    /* --port-range LO-HI, 0 = unset */
    int streams;             /* --streams, 0 = unset */
    const char *tcp_cc;      /* --tcp-congestion NAME, NULL = unset */
    const char *secret_file; /* --secret-file FILE */
    int insecure;            /* --insecure, -1 = unset */
    double join_timeout_s;   /* --join-timeout, < 0 = unset */
    double peer_timeout_s;   /* --peer-timeout, < 0 = unset */
    const char *transport;   /* --transport NAME */
    const char *job_id;      /* --job-id ID */
    const char *ib_dev;      /* --ib-dev NAME (verbs), NULL = first */
    int ib_port;             /* --ib-port N (verbs), -1 = first active */
    int gid_index;           /* --gid-index N (verbs), -1 = a RoCE v2 GID */
    int bind;                /* --bind-to (enum mesh_bind), -1 = unset */

    /* Written by mesh_opts_finish. */
    int finished;
    struct mesh_world world;          /* rank, size, peers (owned) */
    struct mesh_transport_opts topts; /* timeouts, streams, secret, job id */
    const char *rank_source;          /* "--rank", "MESHTRAIN_RANK", ... */
    int claim_fd; /* --rank auto: the UDP socket bound to the slot's
                     host:port, which holds the slot (-1: none) */
    uint8_t secret[MESH_SECRET_MAX]; /* wiped by mesh_opts_free */
    char source[300];                /* hostfile name or "-H list" */
};

/* --rank auto: the first free slot of this host (mesh_opts_finish). */
#define MESH_RANK_AUTO (-2)

void mesh_opts_init(struct mesh_opts *o);

/*
 * Look at argv[*i]. If it is a mesh flag ("--port 5", "--port=5", "-H x"),
 * store it, advance *i past the flag and its value, and return 1. Return 0
 * (and leave *i alone) for any other argument, or a negative code with a
 * message for a mesh flag with a missing or bad value.
 */
int mesh_opts_parse_arg(struct mesh_opts *o, int argc, char **argv, int *i);

/*
 * Fill unset fields from the environment (MESHTRAIN_*, Slurm, Open MPI,
 * PMI), read the hostfile and lay out the ranks, resolve the rank and check
 * the world size, read the secret (--secret-file, MESHTRAIN_SECRET_FD,
 * MESHTRAIN_SECRET_FILE) or accept --insecure. Sets the log rank. Every
 * failure here is a usage or configuration error (MESH_EXIT_USAGE).
 */
int mesh_opts_finish(struct mesh_opts *o);

/*
 * --bind-to: which of this host's CPUs a rank runs on. The host's ranks are
 * the slots with the same host string in the layout.
 *   auto   bind (as cores) when this host runs 2 or more ranks, each can
 *          have a CPU of its own, and nothing has bound the process yet
 *          (it may run on every online CPU); otherwise leave it alone
 *   none   leave the process as it was started
 *   cores  local rank i of n gets the i-th of n equal, contiguous shares of
 *          the CPUs the process may run on; with more ranks than CPUs,
 *          CPU i mod count
 */
enum mesh_bind { MESH_BIND_AUTO, MESH_BIND_NONE, MESH_BIND_CORES };

/*
 * The plan behind mesh_bind, without system calls: the CPUs for local rank
 * lr of n under mode, given the CPUs the process may run on now (allowed,
 * nallowed of them, ascending) and the host's online count. Writes them to
 * out (room for nallowed) and returns how many; 0 means leave the process
 * as it is, with the reason in *why.
 */
int mesh_bind_plan(enum mesh_bind mode, const int *allowed, int nallowed,
                   int online, int lr, int n, int *out, const char **why);

/*
 * Apply --bind-to to the calling thread (threads it starts later inherit
 * it: call this before starting any). Logs the choice. *ncpus (may be
 * NULL) gets how many CPUs this rank should keep busy (compute threads):
 * those it was bound to, else its share (at least 1) of those it may run
 * on, which the host's ranks all share. Returns 1
 * when it bound the thread, 0 when it left it alone; a failed binding is an
 * error under "cores" and a warning (0) under "auto".
 */
/* "auto", "none" or "cores". */
const char *mesh_bind_name(int mode);

int mesh_bind(const struct mesh_opts *o, int *ncpus);

/* Wipe the secret and free what finish allocated. */
void mesh_opts_free(struct mesh_opts *o);

/* The mesh flags and environment variables, for --help (static text). */
const char *mesh_opts_help(void);

/* The exit codes above, for --help (static text). */
const char *mesh_exit_help(void);

/* ---- the joined mesh ----------------------------------------------------- */

struct mesh; /* opaque */

/*
 * Join: find the transport, listen on this rank's address, connect to every
 * peer and complete every handshake (within the join timeout). config is
 * the program's settings that must agree between peers, as "key=value\n"
 * lines (NULL for none); the world size, transport, streams and the rank
 * layout are added to it. o must have been finished; it may be freed after
 * this returns. Failure means MESH_EXIT_JOIN.
 */
int mesh_open(const struct mesh_opts *o, const char *config, struct mesh **out);

/*
 * The line a rank started by meshrun writes on the file descriptor named
 * by MESHTRAIN_REPORT_FD when its mesh failed: this prefix, then the rank
 * the failure blames, then a newline. meshrun names the culprit most ranks
 * agree on.
 */
#define MESH_REPORT_CULPRIT "meshrun-report: culprit "

/*
 * --elastic: the line the new rank 0 writes on stderr after a view change,
 * "meshrun-report: view E size N left S1,S2", which meshrun turns into
 * one line of its own.
 */
#define MESH_REPORT_VIEW "meshrun-report: view "

/*
 * Close every link and free the mesh (NULL is fine). Call mesh_barrier
 * first for a clean end, so that no peer sees this as a failure. A failed
 * mesh first reports its culprit (MESH_REPORT_CULPRIT) where
 * MESHTRAIN_REPORT_FD asks.
 */
void mesh_close(struct mesh *m);

/*
 * Close a failed mesh without reporting a culprit (--elastic: the
 * survivors form a new view instead of failing the job).
 */
void mesh_discard(struct mesh *m);

/* What collectives and programs drive. Valid until mesh_close. */
const struct mesh_transport_ops *mesh_ops(const struct mesh *m);
mesh_transport_t *mesh_transport(const struct mesh *m);
const struct mesh_world *mesh_world(const struct mesh *m);
const struct mesh_transport_opts *mesh_topts(const struct mesh *m);
int mesh_rank(const struct mesh *m);
int mesh_size(const struct mesh *m);

/*
 * The next collective sequence number. Every rank calls its collectives in
 * the same order, so the numbers agree; the transport's desync check
 * catches a rank that does not.
 */
uint64_t mesh_seq_next(struct mesh *m);

/*
 * Point-to-point helpers over the transport for programs and tests:
 * send/receive len bytes with frame (seq, tag, MESH_OP_P2P, byte). Both
 * block until done or the job fails.
 */
int mesh_send(struct mesh *m, int peer, uint64_t seq, uint32_t tag,
              const void *buf, size_t len);
int mesh_recv(struct mesh *m, int peer, uint64_t seq, uint32_t tag, void *buf,
              size_t len);

/*
 * Every rank waits for every other (an all-to-all of 8-byte tokens): when
 * it returns 0, every rank has reached the barrier. Used before closing so
 * that no rank hangs up while another still needs it.
 */
int mesh_barrier(struct mesh *m);

#endif
