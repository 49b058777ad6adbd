/*
 * mesh/hostfile.h: hostfiles, the -H host list, and where ranks come from.
 *
 * Accepted syntax, one host per line (Open MPI and Horovod), or one host per
 * comma-separated item in the -H string form:
 *
 *   # comment                     (also after an entry)
 *   node1 slots=4                 Open MPI: name, then key=value fields
 *   node2:4                       Horovod: host:slots
 *   10.0.0.3 slots=2 port=29500   IPv4, own base port
 *   [fe80::1]:2                   IPv6 literals always in brackets
 *   node4                         no slot count: one slot
 *
 * Keys: slots=N (1 <= N <= 4096), max_slots=N (accepted, must be >=
 * slots; meshtrain never oversubscribes), port=P (this host's base port).
 * The -H form is "h1:2,h2:2,[::1]:1" (no keys).
 *
 * Ranks are assigned in file order, slot by slot. The port of a slot is its
 * host entry's base port (port=, else the --port base) plus the slot's index
 * within that entry. A host listed on several lines keeps counting its
 * local ranks across them; two slots with the same host and port are an
 * error. All slots together (the world size) are at most MESH_WORLD_MAX.
 */
#ifndef MESH_HOSTFILE_H
#define MESH_HOSTFILE_H

#include "transport/transport.h"

#define MESH_PORT_DEFAULT 29400

/*
 * The largest world: a hostfile (or -H list) whose slots add up to more
 * is refused at the line that crosses it. Every rank holds a connection
 * to every other, so far fewer is the practical size; the bound keeps a
 * wrong file (slots=4096 on thousands of lines) from costing minutes.
 */
#define MESH_WORLD_MAX 65536

struct mesh_hostfile_entry {
    char host[MESH_HOST_MAX]; /* name or address, IPv6 without brackets */
    int slots;                /* >= 1 */
    int port;                 /* this entry's base port, -1 = use default */
    int line;                 /* where it was defined (1-based) */
    int column;
};

struct mesh_hostfile {
    char source[256]; /* file name, or "-H" for the string form */
    int n;            /* entries */
    struct mesh_hostfile_entry *entries;
};

/*
 * Parse text that came from source (a file name for messages). Malformed
 * input fails with -EINVAL and the message "source:line:column: expected
 * ..., found ...". *out is written on success; free with
 * mesh_hostfile_free.
 */
int mesh_hostfile_parse_text(const char *source, const char *text,
                             struct mesh_hostfile **out);

/* Read and parse the file at path. */
int mesh_hostfile_parse_file(const char *path, struct mesh_hostfile **out);

/* Parse the -H form "h1:2,h2:2" (messages say "-H:1:column"). */
int mesh_hostfile_parse_hosts(const char *hosts, struct mesh_hostfile **out);

void mesh_hostfile_free(struct mesh_hostfile *hf);

/* Total slots = world size (at most MESH_WORLD_MAX). */
int mesh_hostfile_slots(const struct mesh_hostfile *hf);

/*
 * first[i] = the local rank of entry i's first slot: the slots of the same
 * host on earlier lines (first has hf->n elements). O(entries).
 */
int mesh_hostfile_local_ranks(const struct mesh_hostfile *hf, int *first);

/*
 * Lay out the ranks: (*out)[r] is rank r's host, port and local rank, with
 * *size = total slots. base_port is the --port base; [port_lo, port_hi]
 * bounds every port (0, 0 = no bound). Errors (-EINVAL with a message): a
 * port beyond 65535 or outside the range, a duplicate host:port (naming
 * both lines). *out is malloc'ed, the caller frees it.
 */
int mesh_hostfile_layout(const struct mesh_hostfile *hf, int base_port,
                         int port_lo, int port_hi, struct mesh_peer **out,
                         int *size);

/*
 * The rank from the environment: MESHTRAIN_RANK, else SLURM_PROCID, else
 * OMPI_COMM_WORLD_RANK, else PMI_RANK. Returns 1 and writes *rank and *var
 * (the variable's name) when one is set, 0 when none is, -EINVAL when the
 * first one set is not a non-negative integer.
 */
int mesh_env_rank(int *rank, const char **var);

/* The same for the world size: MESHTRAIN_SIZE, SLURM_NTASKS,
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE (a positive integer). */
int mesh_env_size(int *size, const char **var);

/* Parse "LO-HI" (1 <= LO <= HI <= 65535). */
int mesh_parse_port_range(const char *s, int *lo, int *hi);

#endif
