/*
 * transport/shm/shm.h: the shared-memory transport's formats and queries
 * (transport/shm/; its layouts and design are in
 * transport/shm/shm-internal.h). Nothing outside transport/ and its tests
 * includes this.
 *
 * "shm" opens a TCP mesh (transport/tcp/) first and keeps it for the
 * authenticated join, for failures, aborts and heartbeats (the liveness
 * channel) and for the peers of other hosts, whose data it carries.
 * "auto", the default, is the same transport over verbs' auto table
 * (transport/verbs/, where built): the peers of other hosts then get RDMA
 * where every rank has an active port, else its TCP mesh, and that
 * table's own TCP mesh carries the join, failures and heartbeats. After
 * the join every rank sends every other an INFO over that mesh; two ranks
 * are on the same host when their boot id, machine id, network namespace
 * and user agree (never guessed from names). The lowest rank of each host
 * then creates one memfd segment for the host's ranks and passes it over
 * an abstract Unix socket whose random name only the authenticated INFO
 * carried, checking each caller's SO_PEERCRED against its INFO.
 *
 * The segment (all integers host order, it never leaves the host):
 *   header   u32 magic, u32 version, u32 nlocal, u32 slots, u32 slot_bytes,
 *            u32 0, u64 heap_bytes
 *   procs    nlocal struct shm_proc: wake-up word, sleeping, goodbye, pid,
 *            host syncs posted and the last two syncs' frames (each with
 *            its word, host_sync_word)
 *   rings    nlocal x nlocal single-producer rings, i -> j at i * nlocal + j:
 *            head (sender), tail (receiver), then slots, each a frame header
 *            and slot_bytes of payload
 *   windows  from the next page boundary, nlocal x SHM_WIN_BYTES: local
 *            rank i's window at i (mesh_transport_ops.host_window)
 *   shares   then nlocal x heap_bytes: local rank i's share at i, the memory
 * its host_alloc gives out, which the others read in place
 *            (mesh_transport_ops.host_heap); sized by the first rank
 *            (MESHTRAIN_SHM_HEAP_MB, default SHM_HEAP_DEFAULT, 0: none),
 *            the others map what the memfd holds and check it
 * A slot holds a frame (the TCP frame's fields) and either its payload
 * (inline, two copies) or, for a message of SHM_CMA_MIN bytes or more, the
 * sender's address: the receiver reads it straight into its destination
 * with process_vm_readv (one copy) and only then frees the slot, which
 * completes the send. By address only where the receiver's probe at the
 * join found one process_vm_readv faster than two copies (on some virtual
 * machines pinning the pages costs more than the second copy), or
 * MESHTRAIN_SHM_CMA=1 asks for it; MESHTRAIN_SHM_CMA=0 never.
 */
#ifndef MESH_TRANSPORT_SHM_SHM_H
#define MESH_TRANSPORT_SHM_SHM_H

#include "transport/transport.h"

#include <stdint.h>

#define SHM_SEG_MAGIC  0x314d4853u /* "SHM1" */
#define SHM_VERSION    3u
#define SHM_SLOTS      16
#define SHM_SLOT_BYTES (64u << 10)
#define SHM_CMA_MIN    (64u << 10)
#define SHM_WIN_BYTES  (8u << 20) /* each local rank's window */
#define SHM_LOCAL_MAX  64         /* ranks of one job on one host using shm */
/* each local rank's share (host_alloc), virtual: MESHTRAIN_SHM_HEAP_MB */
#define SHM_HEAP_DEFAULT ((size_t)1 << 30)
#define SHM_HEAP_TOTAL   ((size_t)32 << 30) /* the host's shares together */
#define SHM_SOCK_NAME    40 /* abstract socket name, without the NUL */
#define SHM_ID_MAX       64 /* machine id, boot id */

/* The mesh underneath's frames that belong to the shm transport itself. */
#define SHM_CTRL_SEQ (UINT64_MAX - 1)
enum shm_ctrl_tag {
    SHM_TAG_INFO = 1, /* host identity, pid, socket name, probe address */
    SHM_TAG_CMA = 2,  /* whether the sender reads this rank's memory */
};

/*
 * INFO (256 bytes): u32 magic, u32 version, u32 pid, u32 uid, u64 netns
 * device, u64 netns inode, u64 probe address, char machine_id[64],
 * char boot_id[64], char test_host[32], char sock[40] (zero-padded),
 * u32 the machine's online CPUs (0: unknown; the collectives' cost
 * model, mesh_transport_ops.ranks_per_cpu), zeros to the end.
 */
#define SHM_INFO_MAGIC 0x4f464e49u /* "INFO" */
#define SHM_INFO_LEN   256
#define SHM_NCPU_MAX   (1u << 20) /* more: not a count (unknown) */

/*
 * MESHTRAIN_SHM_TEST_HOST (a test double for a second machine): ranks
 * whose values differ count as different hosts even on one machine, so
 * the tests can build layouts of several hosts on 127.0.0.1.
 */

/* 1 when t (an shm transport) moves data to peer through shared memory,
 * 0 when over TCP, -1 when t is not shm or peer is invalid. */
int mesh_shm_local(mesh_transport_t *t, int peer);

/* 1 when t sends peer messages of SHM_CMA_MIN bytes or more by address
 * (the peer reads them with process_vm_readv), 0 when through the slots,
 * -1 when peer is invalid. */
int mesh_shm_one_copy(mesh_transport_t *t, int peer);

/* The mesh under t (shm or auto): TCP, or verbs' auto table. */
mesh_transport_t *mesh_shm_inner(mesh_transport_t *t);

#endif
