/* mesh/mesh.c: the mesh flags, the job secret, and joining the mesh. */
#include "config.h"

#include "mesh/mesh.h"
#include "mesh/hostfile.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* How long a launcher may take to deliver the secret on its pipe. */
#define SECRET_FD_TIMEOUT_MS 10000

struct mesh {
    const struct mesh_transport_ops *ops;
    mesh_transport_t *t;
    struct mesh_world world;
    struct mesh_peer *peers;
    struct mesh_transport_opts topts;
    uint8_t secret[MESH_SECRET_MAX];
    uint64_t seq;
};

enum flag_id {
    F_HOSTFILE,
    F_HOSTS,
    F_RANK,
    F_PORT,
    F_PORT_RANGE,
    F_STREAMS,
    F_TCP_CC,
    F_SECRET_FILE,
    F_INSECURE,
    F_JOIN_TIMEOUT,
    F_PEER_TIMEOUT,
    F_TRANSPORT,
    F_JOB_ID,
    F_IB_DEV,
    F_IB_PORT,
    F_GID_INDEX,
    F_BIND_TO,
};

static const struct flag {
    const char *name;  /* long form */
    const char *alias; /* short form or NULL */
    int has_arg;
    enum flag_id id;
} flags[] = {
    {"--hostfile", NULL, 1, F_HOSTFILE},
    {"--hosts", "-H", 1, F_HOSTS},
    {"--rank", NULL, 1, F_RANK},
    {"--port", NULL, 1, F_PORT},
    {"--port-range", NULL, 1, F_PORT_RANGE},
    {"--streams", NULL, 1, F_STREAMS},
    {"--tcp-congestion", NULL, 1, F_TCP_CC},
    {"--secret-file", NULL, 1, F_SECRET_FILE},
    {"--insecure", NULL, 0, F_INSECURE},
    {"--join-timeout", NULL, 1, F_JOIN_TIMEOUT},
    {"--peer-timeout", NULL, 1, F_PEER_TIMEOUT},
    {"--transport", NULL, 1, F_TRANSPORT},
    {"--job-id", NULL, 1, F_JOB_ID},
    {"--ib-dev", NULL, 1, F_IB_DEV},
    {"--ib-port", NULL, 1, F_IB_PORT},
    {"--gid-index", NULL, 1, F_GID_INDEX},
    {"--bind-to", NULL, 1, F_BIND_TO},
};

void mesh_opts_init(struct mesh_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->rank = -1;
    o->claim_fd = -1;
    o->insecure = -1;
    o->join_timeout_s = -1.0;
    o->peer_timeout_s = -1.0;
    o->ib_port = -1;
    o->gid_index = -1;
    o->bind = -1;
}

static int parse_seconds(const char *what, const char *s, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v <= 0 || v > 86400)
        return mesh_err(-EINVAL,
                        "%s '%s': expected seconds, more than 0 "
                        "and at most 86400",
                        what, s);
    *out = v;
    return 0;
}

static int parse_bool(const char *what, const char *s, int *out)
{
    if (!strcmp(s, "1") || !strcasecmp(s, "yes") || !strcasecmp(s, "true")) {
        *out = 1;
        return 0;
    }
    if (!strcmp(s, "0") || !strcasecmp(s, "no") || !strcasecmp(s, "false") ||
        !*s) {
        *out = 0;
        return 0;
    }
    return mesh_err(-EINVAL, "%s '%s': expected 1 or 0", what, s);
}

static const char *const bind_names[] = {"auto", "none", "cores"};

const char *mesh_bind_name(int mode)
{
    return mode >= 0 && mode < (int)MESH_ARRAY_SIZE(bind_names)
               ? bind_names[mode]
               : "?";
}

static int parse_bind(const char *what, const char *s, int *out)
{
    int k;

    for (k = 0; k < (int)MESH_ARRAY_SIZE(bind_names); k++)
        if (!strcmp(s, bind_names[k])) {
            *out = k;
            return 0;
        }
    return mesh_err(-EINVAL, "%s '%s': expected auto, none or cores", what, s);
}

static int set_flag(struct mesh_opts *o, enum flag_id id, const char *name,
                    const char *v)
{
    switch (id) {
    case F_HOSTFILE:
        o->hostfile = v;
        return 0;
    case F_HOSTS:
        o->hosts = v;
        return 0;
    case F_RANK:
        if (!strcmp(v, "auto")) {
            o->rank = MESH_RANK_AUTO;
            return 0;
        }
        return mesh_parse_int(name, v, 0, INT_MAX, &o->rank);
    case F_PORT:
        return mesh_parse_int(name, v, 1, 65535, &o->port);
    case F_PORT_RANGE: {
        int rc = mesh_parse_port_range(v, &o->port_lo, &o->port_hi);

        return rc < 0 ? mesh_err_prefix(rc, "%s", name) : 0;
    }
    case F_STREAMS:
        return mesh_parse_int(name, v, 1, MESH_STREAMS_MAX, &o->streams);
    case F_TCP_CC:
        o->tcp_cc = v;
        return 0;
    case F_SECRET_FILE:
        o->secret_file = v;
        return 0;
    case F_INSECURE:
        o->insecure = 1;
        return 0;
    case F_JOIN_TIMEOUT:
        return parse_seconds(name, v, &o->join_timeout_s);
    case F_PEER_TIMEOUT:
        return parse_seconds(name, v, &o->peer_timeout_s);
    case F_TRANSPORT:
        /* a world of one never looks it up: check the name here */
        if (!mesh_transport_find(v))
            return mesh_err(-EINVAL,
                            "%s '%s': unknown or unbuilt transport (tcp, "
                            "shm, verbs or auto)",
                            name, v);
        o->transport = v;
        return 0;
    case F_JOB_ID:
        o->job_id = v;
        return 0;
    case F_IB_DEV:
        o->ib_dev = v;
        return 0;
    case F_IB_PORT:
        return mesh_parse_int(name, v, 1, 255, &o->ib_port);
    case F_GID_INDEX:
        return mesh_parse_int(name, v, 0, 65535, &o->gid_index);
    case F_BIND_TO:
        return parse_bind(name, v, &o->bind);
    }
    return mesh_err(-EINVAL, "unknown mesh flag %s", name);
}

int mesh_opts_parse_arg(struct mesh_opts *o, int argc, char **argv, int *i)
{
    const char *arg = argv[*i];
    size_t k;

    for (k = 0; k < MESH_ARRAY_SIZE(flags); k++) {
        const struct flag *f = &flags[k];
        size_t n = strlen(f->name);
        const char *val = NULL;
        int used = 1, rc;

        if (!strcmp(arg, f->name) || (f->alias && !strcmp(arg, f->alias))) {
            if (f->has_arg) {
                if (*i + 1 >= argc)
                    return mesh_err(-EINVAL, "%s needs a value", arg);
                val = argv[*i + 1];
                used = 2;
            }
        } else if (f->has_arg && !strncmp(arg, f->name, n) && arg[n] == '=') {
            val = arg + n + 1;
        } else {
            continue;
        }
        rc = set_flag(o, f->id, f->name, val);
        if (rc < 0)
            return rc;
        *i += used;
        return 1;
    }
    return 0;
}

/* Apply env var name to flag id unless the flag was given. */
static int from_env(struct mesh_opts *o, enum flag_id id, const char *name)
{
    const char *v = getenv(name);

    if (!v || !*v)
        return 0;
    return set_flag(o, id, name, v);
}

static int check_secret_len(size_t len, const char *where)
{
    if (len < MESH_SECRET_MIN)
        return mesh_err(-EINVAL,
                        "the secret in %s is %zu bytes; at least %d are "
                        "needed (make one with: head -c 32 /dev/urandom | "
                        "base64 > FILE; chmod 600 FILE)",
                        where, len, MESH_SECRET_MIN);
    return 0;
}

static void trim_newline(struct mesh_opts *o, size_t *len)
{
    while (*len > 0 &&
           (o->secret[*len - 1] == '\n' || o->secret[*len - 1] == '\r'))
        (*len)--;
}

/*
 * Read the secret from fd until end of file (polling first, timeout_ms >= 0,
 * for a launcher's pipe); where names the source in messages ("secret file
 * PATH", "the secret from X" and "the secret on X" in rd and big).
 */
static int read_secret_bytes(struct mesh_opts *o, int fd, int timeout_ms,
                             const char *where, const char *rd, const char *big,
                             size_t *len)
{
    size_t got = 0;
    ssize_t n;
    int rc;

    for (;;) {
        if (timeout_ms >= 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};

            MESH_SYSCALL(rc, n = poll(&p, 1, timeout_ms), out, "poll %s",
                         where);
            if (n == 0)
                return mesh_err(-ETIMEDOUT,
                                "no job secret arrived on %s within %d s (the "
                                "launcher must write it and close the pipe)",
                                where, timeout_ms / 1000);
        }
        MESH_SYSCALL(rc, n = read(fd, o->secret + got, sizeof(o->secret) - got),
                     out, "cannot read %s", rd);
        if (n == 0)
            break;
        got += (size_t)n;
        if (got == sizeof(o->secret))
            return mesh_err(-EINVAL, "%s is larger than %d bytes", big,
                            MESH_SECRET_MAX - 1);
    }
    trim_newline(o, &got);
    rc = check_secret_len(got, where);
    if (rc == 0)
        *len = got;
out:
    return rc;
}

static int read_secret_file(struct mesh_opts *o, const char *path, size_t *len)
{
    char what[PATH_MAX + 16];
    struct stat st;
    int fd = -1, rc;

    rc = mesh_open_input("secret file", path, 0, &fd, &st);
    if (rc < 0)
        return rc;
    if (st.st_mode & 077) {
        rc = mesh_err(-EPERM,
                      "secret file %s has mode %04o, more open than 0600; "
                      "refusing it (run: chmod 600 %s)",
                      path, (unsigned)(st.st_mode & 07777), path);
    } else {
        snprintf(what, sizeof(what), "secret file %s", path);
        rc = read_secret_bytes(o, fd, -1, path, what, what, len);
    }
    close(fd);
    return rc;
}

/* The secret a launcher (meshrun) writes on a pipe and then closes. */
static int read_secret_fd(struct mesh_opts *o, const char *val, size_t *len)
{
    char where[64], rd[80], big[80];
    int fd, rc;

    rc = mesh_parse_int("MESHTRAIN_SECRET_FD", val, 0, INT_MAX, &fd);
    if (rc < 0)
        return rc;
    snprintf(where, sizeof(where), "MESHTRAIN_SECRET_FD=%d", fd);
    if (fcntl(fd, F_GETFD) < 0)
        return mesh_err_errno("%s is not an open file descriptor", where);
    snprintf(rd, sizeof(rd), "the secret from %s", where);
    snprintf(big, sizeof(big), "the secret on %s", where);
    rc = read_secret_bytes(o, fd, SECRET_FD_TIMEOUT_MS, where, rd, big, len);
    close(fd);
    return rc;
}

static int finish_secret(struct mesh_opts *o)
{
    const char *fdv = getenv("MESHTRAIN_SECRET_FD");
    const char *file = o->secret_file;
    size_t len = 0;
    int rc = 0, have = 0;

    if (o->insecure < 0) {
        const char *v = getenv("MESHTRAIN_INSECURE");

        o->insecure = 0;
        if (v && (rc = parse_bool("MESHTRAIN_INSECURE", v, &o->insecure)) < 0)
            return rc;
    }
    if (!file && !fdv)
        file = getenv("MESHTRAIN_SECRET_FILE");
    if (file && *file) {
        rc = read_secret_file(o, file, &len);
        have = 1;
    } else if (fdv && *fdv) {
        rc = read_secret_fd(o, fdv, &len);
        have = 1;
    }
    /* The pipe is read once; children of this program must not see it. */
    if (fdv) {
        if (file && *file) {
            int fd;

            if (!mesh_parse_int("MESHTRAIN_SECRET_FD", fdv, 0, INT_MAX, &fd))
                close(fd);
        }
        unsetenv("MESHTRAIN_SECRET_FD");
    }
    if (rc < 0)
        return rc;
    if (o->insecure) {
        OPENSSL_cleanse(o->secret, sizeof(o->secret));
        o->topts.secret = NULL;
        o->topts.secret_len = 0;
        o->topts.insecure = 1;
        mesh_warn("running without authentication (--insecure): any "
                  "process that reaches these ports can join the job");
        return 0;
    }
    if (!have)
        return mesh_err(-EINVAL,
                        "no job secret: pass --secret-file FILE (the same "
                        "file on every peer, mode 0600; make one with: head "
                        "-c 32 /dev/urandom | base64 > FILE; chmod 600 "
                        "FILE), or start the job with meshrun, which makes "
                        "one per job, or pass --insecure to run without "
                        "authentication");
    o->topts.secret = o->secret;
    o->topts.secret_len = len;
    o->topts.insecure = 0;
    return 0;
}

static int finish_job_id(struct mesh_opts *o)
{
    const char *id = o->job_id;
    const char *s;
    char buf[MESH_JOB_MAX + 16];

    if (!id)
        id = getenv("MESHTRAIN_JOB_ID");
    if (!id || !*id) {
        s = getenv("SLURM_JOB_ID");
        if (s && *s) {
            snprintf(buf, sizeof(buf), "slurm-%s", s);
            id = buf;
        }
    }
    if (!id || !*id)
        id = "meshtrain";
    if (strlen(id) >= MESH_JOB_MAX)
        return mesh_err(-EINVAL, "job id '%s' is longer than %d bytes", id,
                        MESH_JOB_MAX - 1);
    for (s = id; *s; s++)
        if (*s <= ' ' || *s > '~')
            return mesh_err(-EINVAL,
                            "job id '%s': only printable "
                            "characters without spaces",
                            id);
    snprintf(o->topts.job_id, sizeof(o->topts.job_id), "%s", id);
    return 0;
}

/*
 * --rank auto: the first slot of this host that no process of this host
 * holds. A slot is this host's when its address can be bound here, and
 * free when its UDP port (host:port, the --elastic agreement's socket)
 * is not bound yet: the socket is bound without SO_REUSEADDR and kept
 * (o->claim_fd) for the life of the process, so two peers started at
 * once never take the same slot (the kernel lets one bind win).
 */
static int claim_slot(struct mesh_opts *o, const struct mesh_peer *peers,
                      int size)
{
    int mine = 0, taken = 0;

    for (int r = 0; r < size; r++) {
        struct addrinfo hints, *res = NULL;
        char port[16];
        int fd, err;

        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_DGRAM;
        snprintf(port, sizeof(port), "%u", (unsigned)peers[r].port);
        if (getaddrinfo(peers[r].host, port, &hints, &res) != 0 || !res)
            continue;
        fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        err = fd < 0                                         ? errno
              : bind(fd, res->ai_addr, res->ai_addrlen) == 0 ? 0
                                                             : errno;
        freeaddrinfo(res);
        if (err == 0) {
            o->rank = r;
            o->claim_fd = fd;
            mesh_info("--rank auto: slot %d (%s:%u), the first free one of "
                      "this host",
                      r, peers[r].host, (unsigned)peers[r].port);
            return 0;
        }
        if (fd >= 0)
            close(fd);
        mine += err != EADDRNOTAVAIL;
        taken += err == EADDRINUSE;
    }
    if (!mine)
        return mesh_err(-EINVAL,
                        "--rank auto: no slot of %s is on this host (none "
                        "of their addresses can be bound here)",
                        o->source);
    return mesh_err(-EBUSY,
                    "--rank auto: every slot of this host in %s is taken "
                    "(%d in use by running peers)",
                    o->source, taken);
}

static int finish_world(struct mesh_opts *o)
{
    struct mesh_hostfile *hf = NULL;
    struct mesh_peer *peers = NULL;
    const char *var = NULL;
    int size = 0, env_size, rc;

    if (o->hostfile && o->hosts)
        return mesh_err(-EINVAL, "give either --hostfile or -H, not both");
    if (!o->hostfile && !o->hosts) {
        o->hostfile = getenv("MESHTRAIN_HOSTFILE");
        o->hosts = getenv("MESHTRAIN_HOSTS");
        if (o->hostfile && !*o->hostfile)
            o->hostfile = NULL;
        if (o->hosts && !*o->hosts)
            o->hosts = NULL;
        if (o->hostfile && o->hosts)
            return mesh_err(-EINVAL, "both MESHTRAIN_HOSTFILE and "
                                     "MESHTRAIN_HOSTS are set; unset one");
    }
    if (o->hostfile) {
        rc = mesh_hostfile_parse_file(o->hostfile, &hf);
        snprintf(o->source, sizeof(o->source), "hostfile %s", o->hostfile);
    } else if (o->hosts) {
        rc = mesh_hostfile_parse_hosts(o->hosts, &hf);
        snprintf(o->source, sizeof(o->source), "-H %s", o->hosts);
    } else {
        return mesh_err(-EINVAL, "no hosts: pass --hostfile FILE or -H "
                                 "host:slots,... (or set MESHTRAIN_HOSTFILE "
                                 "or MESHTRAIN_HOSTS)");
    }
    if (rc < 0)
        return rc;
    rc = mesh_hostfile_layout(hf, o->port, o->port_lo, o->port_hi, &peers,
                              &size);
    mesh_hostfile_free(hf);
    if (rc < 0)
        return rc;

    rc = mesh_env_size(&env_size, &var);
    if (rc < 0)
        goto fail;
    if (rc == 1 && env_size != size) {
        rc = mesh_err(-EINVAL,
                      "world size mismatch: %s has %d slots but %s=%d (the "
                      "world size is the total slot count)",
                      o->source, size, var, env_size);
        goto fail;
    }
    if (o->rank == MESH_RANK_AUTO) {
        o->rank_source = "--rank auto";
        rc = claim_slot(o, peers, size);
        if (rc < 0)
            goto fail;
    } else if (o->rank >= 0) {
        o->rank_source = "--rank";
    } else {
        rc = mesh_env_rank(&o->rank, &o->rank_source);
        if (rc < 0)
            goto fail;
        if (rc == 0) {
            if (size != 1) {
                rc = mesh_err(-EINVAL,
                              "no rank: pass --rank R or set "
                              "MESHTRAIN_RANK (meshrun, srun and mpirun "
                              "set one)");
                goto fail;
            }
            o->rank = 0;
            o->rank_source = "default";
        }
    }
    if (o->rank >= size) {
        rc = mesh_err(-EINVAL,
                      "rank %d (from %s) is outside the world of "
                      "%d slots in %s",
                      o->rank, o->rank_source, size, o->source);
        goto fail;
    }
    o->world.rank = o->rank;
    o->world.size = size;
    o->world.peers = peers;
    return 0;
fail:
    free(peers);
    return rc;
}

int mesh_opts_finish(struct mesh_opts *o)
{
    static const struct {
        enum flag_id id;
        const char *env;
    } envs[] = {
        {F_PORT, "MESHTRAIN_PORT"},
        {F_PORT_RANGE, "MESHTRAIN_PORT_RANGE"},
        {F_STREAMS, "MESHTRAIN_STREAMS"},
        {F_TCP_CC, "MESHTRAIN_TCP_CONGESTION"},
        {F_JOIN_TIMEOUT, "MESHTRAIN_JOIN_TIMEOUT"},
        {F_PEER_TIMEOUT, "MESHTRAIN_PEER_TIMEOUT"},
        {F_TRANSPORT, "MESHTRAIN_TRANSPORT"},
        {F_BIND_TO, "MESHTRAIN_BIND_TO"},
    };
    struct mesh_opts given = *o;
    size_t k;
    int rc;

    if (o->finished)
        return mesh_err(-EINVAL, "mesh options finished twice");
    mesh_transport_opts_init(&o->topts);
    /* The environment fills only what the command line left unset. */
    for (k = 0; k < MESH_ARRAY_SIZE(envs); k++) {
        int unset = 0;

        switch (envs[k].id) {
        case F_PORT:
            unset = !given.port;
            break;
        case F_PORT_RANGE:
            unset = !given.port_lo;
            break;
        case F_STREAMS:
            unset = !given.streams;
            break;
        case F_TCP_CC:
            unset = !given.tcp_cc;
            break;
        case F_JOIN_TIMEOUT:
            unset = given.join_timeout_s < 0;
            break;
        case F_PEER_TIMEOUT:
            unset = given.peer_timeout_s < 0;
            break;
        case F_TRANSPORT:
            unset = !given.transport;
            break;
        case F_BIND_TO:
            unset = given.bind < 0;
            break;
        default:
            break;
        }
        if (unset && (rc = from_env(o, envs[k].id, envs[k].env)) < 0)
            return rc;
    }
    if (!o->port)
        o->port = MESH_PORT_DEFAULT;
    if (!o->streams)
        o->streams = MESH_STREAMS_DEFAULT;
    if (!o->transport)
        o->transport = "auto"; /* shared memory within a host, else
                                  verbs or TCP */
    if (o->bind < 0)
        o->bind = MESH_BIND_AUTO;
    if (o->join_timeout_s > 0)
        o->topts.join_timeout_s = o->join_timeout_s;
    if (o->peer_timeout_s > 0)
        o->topts.peer_timeout_s = o->peer_timeout_s;
    o->topts.streams = o->streams;
    if (o->tcp_cc && !strcmp(o->tcp_cc, "host")) {
        /* the host's default: nothing to set */
    } else if (!o->tcp_cc) {
        /*
         * The mesh's own default: cubic, what a cluster's hosts run by
         * default. Where a host defaults to bbr, its timer pacing per
         * stream cost the mesh most of its throughput on this project's
         * machines (loopback, veth, a 1 Gbit/s shaped link: 86 % of the
         * line rate against 95 % with cubic or reno). Quietly the host's
         * where the kernel refuses cubic to this process.
         */
        if (mesh_tcp_cc_check(MESH_TCP_CC_DEFAULT) == 0) {
            snprintf(o->topts.tcp_cc, sizeof(o->topts.tcp_cc), "%s",
                     MESH_TCP_CC_DEFAULT);
            o->topts.tcp_cc_default = 1;
        } else {
            mesh_err_clear();
        }
    } else {
        /* Checked here, so that a typo is a usage error before joining. */
        rc = mesh_tcp_cc_check(o->tcp_cc);
        if (rc < 0)
            return mesh_err_prefix(rc, "--tcp-congestion");
        snprintf(o->topts.tcp_cc, sizeof(o->topts.tcp_cc), "%s", o->tcp_cc);
    }
    o->topts.ib_dev = o->ib_dev;
    o->topts.ib_port = o->ib_port;
    o->topts.gid_index = o->gid_index;

    rc = finish_world(o);
    if (rc < 0)
        return rc;
    mesh_log_set_rank(o->rank);
    rc = finish_job_id(o);
    if (rc < 0)
        goto fail;
    rc = finish_secret(o);
    if (rc < 0)
        goto fail;
    o->finished = 1;
    return 0;
fail:
    free((void *)o->world.peers);
    o->world.peers = NULL;
    OPENSSL_cleanse(o->secret, sizeof(o->secret));
    return rc;
}

void mesh_opts_free(struct mesh_opts *o)
{
    if (o->claim_fd >= 0)
        close(o->claim_fd);
    o->claim_fd = -1;
    OPENSSL_cleanse(o->secret, sizeof(o->secret));
    o->topts.secret = NULL;
    o->topts.secret_len = 0;
    free((void *)o->world.peers);
    o->world.peers = NULL;
    o->finished = 0;
}

static const char opts_help[] =
    "Mesh options (every mesh program; the environment variable in []\n"
    "applies when the flag is not given):\n"
    "  --hostfile FILE     hosts, Open MPI (host slots=N port=P) or\n"
    "                      Horovod (host:N) syntax [MESHTRAIN_HOSTFILE]\n"
    "  -H, --hosts LIST    hosts as h1:2,h2:2,[::1]:1 [MESHTRAIN_HOSTS]\n"
    "  --rank R            this process's rank [MESHTRAIN_RANK, else\n"
    "                      SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK];\n"
    "                      the world size is checked against\n"
    "                      MESHTRAIN_SIZE, SLURM_NTASKS,\n"
    "                      OMPI_COMM_WORLD_SIZE or PMI_SIZE; --rank auto:\n"
    "                      the first slot of this host that no running\n"
    "                      process of this host holds (its UDP port is\n"
    "                      free), e.g. a peer joining an --elastic job\n"
    "  --port P            base port; a slot listens on base + its\n"
    "                      index on its host (default 29400)\n"
    "                      [MESHTRAIN_PORT]\n"
    "  --port-range LO-HI  every port must lie in it\n"
    "                      [MESHTRAIN_PORT_RANGE]\n"
    "  --streams S         TCP connections per link (default 1, 1..16)\n"
    "                      [MESHTRAIN_STREAMS]\n"
    "  --tcp-congestion CC TCP congestion control of every connection,\n"
    "                      e.g. cubic or reno, or host: the host's\n"
    "                      default (/proc/sys/net/ipv4/\n"
    "                      tcp_congestion_control); default cubic\n"
    "                      where the kernel allows it, else host\n"
    "                      [MESHTRAIN_TCP_CONGESTION]\n"
    "  --secret-file FILE  the job's shared secret, mode 0600 or\n"
    "                      stricter [MESHTRAIN_SECRET_FILE; meshrun\n"
    "                      passes one per job on a pipe:\n"
    "                      MESHTRAIN_SECRET_FD]\n"
    "  --insecure          run without authentication (logged)\n"
    "                      [MESHTRAIN_INSECURE=1]\n"
    "  --join-timeout S    give up joining after S seconds (default\n"
    "                      60) [MESHTRAIN_JOIN_TIMEOUT]\n"
    "  --peer-timeout S    a silent peer is dead after S seconds\n"
    "                      (default 10) [MESHTRAIN_PEER_TIMEOUT]\n"
    "  --transport NAME    auto (default: shared memory within a\n"
    "                      host; between hosts verbs when every\n"
    "                      rank has an active RDMA port, else tcp),\n"
    "                      shm (shared memory within a host, tcp\n"
    "                      between hosts), tcp, or verbs (RDMA for\n"
    "                      every pair; needs an active port on\n"
    "                      every rank)\n"
    "                      [MESHTRAIN_TRANSPORT]\n"
    "  --ib-dev NAME       verbs: RDMA device (default: the first with\n"
    "                      an active port)\n"
    "  --ib-port N         verbs: port (default: the first active one)\n"
    "  --gid-index N       verbs: GID index (default: a RoCE v2 GID on\n"
    "                      Ethernet links, none on InfiniBand)\n"
    "  --job-id ID         must match on every peer [MESHTRAIN_JOB_ID,\n"
    "                      else slurm-$SLURM_JOB_ID, else meshtrain]\n"
    "  --bind-to MODE      this host's CPUs for its ranks: auto (default:\n"
    "                      an equal share each when 2 or more ranks fit\n"
    "                      and nothing bound the process already), cores\n"
    "                      (always), none [MESHTRAIN_BIND_TO]\n"
    "  MESHTRAIN_LOG=error|warn|info|debug sets the log level.\n";

const char *mesh_opts_help(void)
{
    return opts_help;
}

const char *mesh_exit_help(void)
{
    return "Exit status:\n"
           "  0  success\n"
           "  1  usage or configuration error (flags, hostfile, rank, "
           "secret)\n"
           "  2  could not listen or join the mesh within --join-timeout\n"
           "  3  a peer failed after joining (died, went silent past\n"
           "     --peer-timeout, desynced) or the job was aborted\n"
           "  4  received data was wrong (verification failed)\n"
           "  5  --elastic: no quorum for a new view (more than half of\n"
           "     the last one), or left out of the view the others agreed\n"
           "  6  --elastic: the view fell below --min-peers\n";
}

/* ---- binding to CPUs ----------------------------------------------------- */

int mesh_bind_plan(enum mesh_bind mode, const int *allowed, int nallowed,
                   int online, int lr, int n, int *out, const char **why)
{
    int lo, hi, k;

    if (mode == MESH_BIND_NONE) {
        *why = "--bind-to none";
        return 0;
    }
    if (nallowed <= 0 || n <= 0 || lr < 0 || lr >= n) {
        *why = "no CPUs or no local rank";
        return 0;
    }
    if (mode == MESH_BIND_AUTO) {
        if (n < 2) {
            *why = "the only rank on this host";
            return 0;
        }
        if (nallowed < online) {
            *why = "already bound to some of the CPUs (by the launcher, "
                   "taskset or a cgroup)";
            return 0;
        }
        if (nallowed < n) {
            *why = "more ranks on this host than CPUs (--bind-to cores "
                   "shares them out anyway)";
            return 0;
        }
    }
    if (nallowed < n) {
        out[0] = allowed[lr % nallowed];
        return 1;
    }
    /* Shares differ by at most one CPU; the remainder goes to the last. */
    lo = (int)((long)lr * nallowed / n);
    hi = (int)((long)(lr + 1) * nallowed / n);
    for (k = lo; k < hi; k++)
        out[k - lo] = allowed[k];
    return hi - lo;
}

/* "0-3,8" for the log. */
static void cpu_list(const int *cpus, int n, char *buf, size_t len)
{
    size_t at = 0;
    int i = 0;

    buf[0] = 0;
    while (i < n && at < len) {
        int j = i;

        while (j + 1 < n && cpus[j + 1] == cpus[j] + 1)
            j++;
        at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? "," : "",
                               cpus[i]);
        if (j > i && at < len)
            at += (size_t)snprintf(buf + at, len - at, "-%d", cpus[j]);
        i = j + 1;
    }
}

int mesh_bind(const struct mesh_opts *o, int *ncpus)
{
    const struct mesh_world *w = &o->world;
    int allowed[CPU_SETSIZE], want[CPU_SETSIZE];
    int nallowed = 0, nwant, n = 0, lr, r, k, rc;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    const char *why = "";
    char list[256];
    cpu_set_t set;

    if (!o->finished)
        return mesh_err(-EINVAL, "mesh_bind before mesh_opts_finish");
    for (r = 0; r < w->size; r++)
        n += !strcmp(w->peers[r].host, w->peers[w->rank].host);
    lr = w->peers[w->rank].local_rank;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) < 0) {
        /* more CPUs than a cpu_set_t holds: leave the process alone */
        rc = -errno;
        if (ncpus)
            *ncpus = MESH_MAX((online > 0 ? (int)online : 1) / n, 1);
        if (o->bind == MESH_BIND_CORES)
            return mesh_err(rc, "--bind-to cores: sched_getaffinity: %s",
                            strerror(-rc));
        if (o->bind == MESH_BIND_AUTO)
            mesh_warn("not binding to CPUs: sched_getaffinity: %s",
                      strerror(-rc));
        return 0;
    }
    for (k = 0; k < CPU_SETSIZE; k++)
        if (CPU_ISSET(k, &set))
            allowed[nallowed++] = k;
    /* unless bound below: a fair share of what the host's ranks share */
    if (ncpus)
        *ncpus = MESH_MAX(nallowed / n, 1);
    nwant =
        mesh_bind_plan((enum mesh_bind)o->bind, allowed, nallowed,
                       online > 0 ? (int)online : nallowed, lr, n, want, &why);
    if (nwant == 0) {
        cpu_list(allowed, nallowed, list, sizeof(list));
        mesh_debug("not binding to CPUs (%s): local rank %d of %d may run "
                   "on %s",
                   why, lr, n, list);
        return 0;
    }
    CPU_ZERO(&set);
    for (k = 0; k < nwant; k++)
        CPU_SET(want[k], &set);
    cpu_list(want, nwant, list, sizeof(list));
    if (sched_setaffinity(0, sizeof(set), &set) < 0) {
        rc = -errno;
        if (o->bind == MESH_BIND_CORES)
            return mesh_err(rc, "--bind-to cores: cannot bind to CPU %s: %s",
                            list, strerror(-rc));
        mesh_warn("not binding to CPUs %s: sched_setaffinity: %s", list,
                  strerror(-rc));
        return 0;
    }
    if (ncpus)
        *ncpus = nwant;
    mesh_info("bound to CPU%s %s: local rank %d of %d on this host "
              "(--bind-to %s%s)",
              nwant > 1 ? "s" : "", list, lr, n, bind_names[o->bind],
              o->bind == MESH_BIND_AUTO ? "; none leaves it" : "");
    return 1;
}

/* ---- the joined mesh ----------------------------------------------------- */

/* SHA-256 of the rank layout, so peers with different hostfiles refuse. */
static int layout_digest(const struct mesh_world *w, char *hex, size_t len)
{
    uint8_t md[32];
    int rc = mesh_world_digest(w, md);

    /* 16 bytes are plenty to tell layouts apart. */
    for (int i = 0; rc == 0 && i < 16 && (size_t)(2 * i + 2) < len; i++)
        snprintf(hex + 2 * i, len - 2 * i, "%02x", md[i]);
    return rc;
}

int mesh_open(const struct mesh_opts *o, const char *config, struct mesh **out)
{
    struct mesh *m;
    char digest[40] = "";
    double t0 = mesh_now_s();
    size_t n;
    int rc;

    if (!o->finished)
        return mesh_err(-EINVAL, "mesh_open before mesh_opts_finish");
    m = calloc(1, sizeof(*m));
    if (!m)
        return mesh_err(-ENOMEM, "out of memory opening the mesh");
    m->ops = mesh_transport_find(o->transport);
    if (!m->ops) {
        rc = mesh_err(-EINVAL, "unknown or unbuilt transport '%s'",
                      o->transport);
        goto fail_m;
    }
    m->peers = malloc((size_t)o->world.size * sizeof(*m->peers));
    if (!m->peers) {
        rc = mesh_err(-ENOMEM, "out of memory opening the mesh");
        goto fail_m;
    }
    memcpy(m->peers, o->world.peers, (size_t)o->world.size * sizeof(*m->peers));
    m->world = o->world;
    m->world.peers = m->peers;
    m->topts = o->topts;
    if (o->topts.secret) {
        memcpy(m->secret, o->topts.secret, o->topts.secret_len);
        m->topts.secret = m->secret;
    }
    rc = layout_digest(&m->world, digest, sizeof(digest));
    if (rc < 0)
        goto fail_peers;
    n = (size_t)snprintf(m->topts.config, sizeof(m->topts.config),
                         "%sworld_size=%d\ntransport=%s\nstreams=%d\n"
                         "layout=%s\n",
                         config ? config : "", m->world.size, o->transport,
                         m->topts.streams, digest);
    if (n >= sizeof(m->topts.config)) {
        rc = mesh_err(-EINVAL, "program configuration longer than %d bytes",
                      MESH_CONFIG_MAX - 200);
        goto fail_peers;
    }
    if (config && *config && config[strlen(config) - 1] != '\n') {
        rc = mesh_err(-EINVAL, "program configuration must be key=value "
                               "lines ending in a newline");
        goto fail_peers;
    }
    rc = m->ops->listen(&m->world, &m->topts, &m->t);
    if (rc < 0)
        goto fail_peers;
    rc = m->ops->connect(m->t);
    if (rc < 0)
        goto fail_transport;
    {
        char me[MESH_HOST_MAX + 16];

        mesh_info("joined the mesh: rank %d of %d at %s, transport %s, %d "
                  "stream(s) per link, job %s%s, in %.3f s",
                  m->world.rank, m->world.size,
                  mesh_peer_name(&m->world, m->world.rank, me, sizeof(me)),
                  o->transport, m->topts.streams, m->topts.job_id,
                  m->topts.insecure ? ", insecure" : "", mesh_now_s() - t0);
    }
    *out = m;
    return 0;
fail_transport:
    m->ops->close(m->t);
fail_peers:
    OPENSSL_cleanse(m->secret, sizeof(m->secret));
    free(m->peers);
fail_m:
    free(m);
    return rc;
}

/* Tell meshrun whom the failed job blames (MESH_REPORT_CULPRIT). */
static void report_culprit(const struct mesh *m)
{
    const char *v = getenv("MESHTRAIN_REPORT_FD");
    int culprit = m->ops->culprit ? m->ops->culprit(m->t) : -1;
    char line[64], *end;
    long fd;
    int n;

    if (!v || !*v || culprit < 0)
        return;
    /* Parsed here without mesh_err: the job's message must stay. */
    fd = strtol(v, &end, 10);
    if (*end || fd < 0 || fd > INT_MAX)
        return;
    n = snprintf(line, sizeof(line), MESH_REPORT_CULPRIT "%d\n", culprit);
    if (write((int)fd, line, (size_t)n) != n)
        mesh_warn("MESHTRAIN_REPORT_FD=%s: cannot report the culprit: %s", v,
                  strerror(errno));
}

void mesh_close(struct mesh *m)
{
    if (!m)
        return;
    report_culprit(m);
    m->ops->close(m->t);
    OPENSSL_cleanse(m->secret, sizeof(m->secret));
    free(m->peers);
    free(m);
}

void mesh_discard(struct mesh *m)
{
    if (!m)
        return;
    m->ops->close(m->t);
    OPENSSL_cleanse(m->secret, sizeof(m->secret));
    free(m->peers);
    free(m);
}

const struct mesh_transport_ops *mesh_ops(const struct mesh *m)
{
    return m->ops;
}

mesh_transport_t *mesh_transport(const struct mesh *m)
{
    return m->t;
}

const struct mesh_world *mesh_world(const struct mesh *m)
{
    return &m->world;
}

const struct mesh_transport_opts *mesh_topts(const struct mesh *m)
{
    return &m->topts;
}

int mesh_rank(const struct mesh *m)
{
    return m->world.rank;
}

int mesh_size(const struct mesh *m)
{
    return m->world.size;
}

uint64_t mesh_seq_next(struct mesh *m)
{
    return ++m->seq;
}

int mesh_send(struct mesh *m, int peer, uint64_t seq, uint32_t tag,
              const void *buf, size_t len)
{
    struct mesh_frame f;
    mesh_req_t *req;
    int rc;

    mesh_frame_p2p(&f, seq, tag, len);
    rc = m->ops->isend(m->t, peer, &f, buf, NULL, &req);
    if (rc < 0)
        return rc;
    return mesh_transport_wait(m->ops, m->t, req);
}

int mesh_recv(struct mesh *m, int peer, uint64_t seq, uint32_t tag, void *buf,
              size_t len)
{
    struct mesh_frame f;
    mesh_req_t *req;
    int rc;

    mesh_frame_p2p(&f, seq, tag, len);
    rc = m->ops->irecv(m->t, peer, &f, buf, NULL, &req);
    if (rc < 0)
        return rc;
    return mesh_transport_wait(m->ops, m->t, req);
}

int mesh_barrier(struct mesh *m)
{
    int n = m->world.size, me = m->world.rank, i, k = 0, rc = 0, rc2;
    uint64_t seq = mesh_seq_next(m);
    uint64_t *tokens;
    mesh_req_t **reqs;
    struct mesh_frame f;

    if (n == 1)
        return 0;
    tokens = calloc((size_t)n, sizeof(*tokens));
    reqs = calloc(2 * (size_t)n, sizeof(*reqs));
    if (!tokens || !reqs) {
        rc = mesh_err(-ENOMEM, "out of memory in barrier");
        goto out;
    }
    memset(&f, 0, sizeof(f));
    f.seq = seq;
    f.op = MESH_OP_BARRIER;
    f.dtype = MESH_DT_BYTE;
    f.count = sizeof(uint64_t);
    f.length = sizeof(uint64_t);
    tokens[me] = seq;
    for (i = 0; i < n && rc == 0; i++) {
        if (i == me)
            continue;
        rc = m->ops->irecv(m->t, i, &f, &tokens[i], NULL, &reqs[k]);
        if (rc == 0)
            k++;
    }
    for (i = 0; i < n && rc == 0; i++) {
        if (i == me)
            continue;
        rc = m->ops->isend(m->t, i, &f, &tokens[me], NULL, &reqs[k]);
        if (rc == 0)
            k++;
    }
    /* Complete (or, after a failure, reap) every posted request. */
    for (i = 0; i < k; i++) {
        rc2 = mesh_transport_wait(m->ops, m->t, reqs[i]);
        if (rc == 0)
            rc = rc2;
    }
    for (i = 0; i < n && rc == 0; i++)
        if (tokens[i] != seq)
            rc = mesh_err(-EPROTO,
                          "barrier: rank %d sent token %llu, "
                          "expected %llu",
                          i, (unsigned long long)tokens[i],
                          (unsigned long long)seq);
out:
    free(reqs);
    free(tokens);
    return rc;
}
