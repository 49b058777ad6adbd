/*
 * transport/tcp/sockopt.c: socket options (congestion control, as given by
 * --tcp-congestion and checked first; TCP_NODELAY; buffer sizes) and the
 * listening socket.
 */
#include "config.h"

#include "transport/tcp/tcp-internal.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- socket options ------------------------------------------------------ */

/* The words of /proc/sys/net/ipv4/NAME, or "unknown". */
static const char *proc_ipv4(const char *name, char *buf, size_t len)
{
    char path[128];
    FILE *f;
    size_t n = 0;

    snprintf(path, sizeof(path), "/proc/sys/net/ipv4/%s", name);
    f = fopen(path, "re");
    if (f) {
        n = fread(buf, 1, len - 1, f);
        fclose(f);
    }
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        n--;
    buf[n] = 0;
    return n ? buf : "unknown";
}

int mesh_tcp_cc_check(const char *name)
{
    char list[512];
    size_t len = name ? strnlen(name, MESH_TCP_CC_MAX) : 0;
    int fd, rc = 0;

    if (!len || len >= MESH_TCP_CC_MAX ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789_-") != len)
        return mesh_err(-EINVAL,
                        "TCP congestion control '%.*s%s': expected a name "
                        "of 1 to %d letters, digits, '_' or '-', such as "
                        "cubic",
                        (int)len, name ? name : "",
                        len >= MESH_TCP_CC_MAX ? "..." : "",
                        MESH_TCP_CC_MAX - 1);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mesh_err_errno("TCP congestion control '%s': socket", name);
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)len) < 0) {
        if (errno == ENOENT)
            rc = mesh_err(-ENOENT,
                          "TCP congestion control '%s': this kernel has "
                          "none by that name (available: %s; a module may "
                          "add it: modprobe tcp_%s)",
                          name,
                          proc_ipv4("tcp_available_congestion_control", list,
                                    sizeof(list)),
                          name);
        else if (errno == EPERM)
            rc = mesh_err(-EPERM,
                          "TCP congestion control '%s': not allowed for "
                          "this process (allowed: %s; root can add it to "
                          "net.ipv4.tcp_allowed_congestion_control)",
                          name,
                          proc_ipv4("tcp_allowed_congestion_control", list,
                                    sizeof(list)));
        else
            rc = mesh_err_errno("TCP congestion control '%s': setsockopt "
                                "TCP_CONGESTION",
                                name);
    }
    close(fd);
    return rc;
}

/* --tcp-congestion (cc) on fd, if one was given. */
static int set_cc(const char *cc, int fd)
{
    int rc = 0;

    if (cc[0])
        MESH_SYSCALL(rc,
                     setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc,
                                (socklen_t)strlen(cc)),
                     out, "setsockopt TCP_CONGESTION %s", cc);
out:
    return rc;
}

int tcp_set_cc(struct mesh_transport *t, int fd)
{
    return set_cc(t->super.opts.tcp_cc, fd);
}

int tcp_set_sockopts(struct mesh_transport *t, int fd)
{
    int one = 1, rc = 0;
    const char *env = getenv("MESHTRAIN_TCP_SOCKBUF");

    (void)t;
    MESH_SYSCALL(rc,
                 setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)),
                 out, "setsockopt TCP_NODELAY");
    if (env && atoi(env) > 0) {
        int sz = atoi(env);

        MESH_SYSCALL(rc, setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)),
                     out, "setsockopt SO_SNDBUF");
        MESH_SYSCALL(rc, setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz)),
                     out, "setsockopt SO_RCVBUF");
    }
out:
    return rc;
}

/*
 * EADDRINUSE on this rank's port: where another rank of the hostfile has
 * the same port under another host name (localhost and 127.0.0.1, two
 * loopback addresses, a name and its address), that rank is the likely
 * holder once both run on this machine: say so, naming it.
 */
static int bind_in_use(const struct mesh_world *world, uint16_t port)
{
    char name[300];
    int r;

    for (r = 0; r < world->size; r++)
        if (r != world->rank && world->peers[r].port == port)
            break;
    if (r == world->size)
        return mesh_err_errno("rank %d: bind port %u", world->rank,
                              (unsigned)port);
    return mesh_err(-EADDRINUSE,
                    "rank %d: bind port %u: %s; rank %d (%s) has this port "
                    "too: where its host is this machine, give one of them "
                    "another port=",
                    world->rank, (unsigned)port, strerror(EADDRINUSE), r,
                    mesh_peer_name(world, r, name, sizeof(name)));
}

int mesh_tcp_listen_socket(const struct mesh_world *world,
                           const struct mesh_transport_opts *opts, int *out)
{
    uint16_t port = world->peers[world->rank].port;
    struct sockaddr_in6 s6;
    struct sockaddr_in s4;
    int fd, one = 1, zero = 0, rc = 0;

    fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        memset(&s6, 0, sizeof(s6));
        s6.sin6_family = AF_INET6;
        s6.sin6_addr = in6addr_any;
        s6.sin6_port = htons(port);
        /* Dual stack: IPv4 peers arrive as v4-mapped addresses. */
        if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) <
                0 ||
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
            bind(fd, (struct sockaddr *)&s6, sizeof(s6)) < 0) {
            if (errno == EADDRINUSE) {
                rc = bind_in_use(world, port);
                close(fd);
                return rc;
            }
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0) {
        /* No IPv6 here: IPv4 only. */
        MESH_SYSCALL(
            rc,
            fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0),
            out, "socket");
        memset(&s4, 0, sizeof(s4));
        s4.sin_family = AF_INET;
        s4.sin_addr.s_addr = htonl(INADDR_ANY);
        s4.sin_port = htons(port);
        MESH_SYSCALL(
            rc, setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)),
            close_fd, "setsockopt SO_REUSEADDR");
        MESH_SYSCALL(rc, bind(fd, (struct sockaddr *)&s4, sizeof(s4)), close_fd,
                     "rank %d: bind port %u", world->rank, (unsigned)port);
    }
    /*
     * Accepted connections inherit a congestion control set here. Set on
     * them after accept() instead, it would replace one that has already
     * started: bbr leaves its pacing on behind it, and the accepting
     * side's sends stayed paced (a third of the dialing side's rate on
     * two namespace hosts, as with iperf3's server under -C).
     */
    if ((rc = set_cc(opts->tcp_cc, fd)) < 0)
        goto close_fd;
    MESH_SYSCALL(rc, listen(fd, SOMAXCONN), close_fd, "listen on port %u",
                 (unsigned)port);
    *out = fd;
    return 0;
close_fd:
    close(fd);
out:
    return rc;
}

/* The transport's own, unless the caller keeps one (opts->listen_fd):
 * then a duplicate of it, which the transport closes as its own. */
int tcp_listen_socket(struct mesh_transport *t, int *out)
{
    int fd;

    if (t->super.opts.listen_fd < 0)
        return mesh_tcp_listen_socket(&t->super.world, &t->super.opts, out);
    fd = fcntl(t->super.opts.listen_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return mesh_err_errno(
            "rank %d: the kept listening socket on port %u",
            t->super.world.rank,
            (unsigned)t->super.peers[t->super.world.rank].port);
    *out = fd;
    return 0;
}

/*
 * Log the congestion control a data stream really has (under the lock,
 * once joined). bbr gets a hint: without the fq qdisc the kernel paces
 * each of its streams with a timer per burst, which measured as the
 * largest CPU cost of an all-reduce on this project's machine (loopback
 * and veth links, where it halved the throughput of every system).
 */
void tcp_log_cc(struct mesh_transport *t)
{
    char cc[MESH_TCP_CC_MAX + 1] = "";
    socklen_t len = MESH_TCP_CC_MAX;
    struct conn *c = NULL;

    for (int p = 0; p < t->super.world.size && !c; p++)
        if (p != t->super.world.rank && t->links[p].data)
            c = t->links[p].data[0];
    if (!c || c->fd < 0 ||
        getsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len) < 0)
        return;
    cc[MESH_MIN((size_t)len, sizeof(cc) - 1)] = 0;
    if (t->super.opts.tcp_cc[0] && t->super.opts.tcp_cc_default)
        mesh_info("tcp: congestion control %s (the mesh's default; "
                  "--tcp-congestion host keeps this host's)",
                  cc);
    else if (t->super.opts.tcp_cc[0])
        mesh_info("tcp: congestion control %s (--tcp-congestion)", cc);
    else if (!strcmp(cc, "bbr"))
        mesh_info("tcp: congestion control bbr (this host's default), which "
                  "paces every stream with timers: on a LAN, "
                  "--tcp-congestion cubic or reno can be much faster");
    else
        mesh_info("tcp: congestion control %s (this host's default)", cc);
}
