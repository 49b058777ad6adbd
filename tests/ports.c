/*
 * tests/ports.c: TCP ports for the tests that start peers (see
 * tests/ports.h for the rules shared with tests/ports.sh).
 */
#include "config.h"

#include "tests/ports.h"
#include "mesh/hostfile.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define PORTS_LOW 20000u
/* Runs started by hand (benchmarks, a user's job) listen from meshtrain's
 * default port on: those ports are left to them. */
#define PORTS_BUSY_LO MESH_PORT_DEFAULT
#define PORTS_BUSY_HI (MESH_PORT_DEFAULT + 256u)

/* The block this process holds (an flock'ed file), -1 when none. */
static int held_fd = -1;

/* 1 when fd binds to sa with the transport's SO_REUSEADDR; closes fd. */
static int binds(int fd, const void *sa, socklen_t len)
{
    int one = 1, ok_ = 0;

    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0)
        ok_ = bind(fd, (const struct sockaddr *)sa, len) == 0;
    close(fd);
    return ok_;
}

/* 1 when port binds on the wildcard address: IPv6 with IPv4 mapped, or
 * IPv4 alone where there is no IPv6. */
static int port_free(uint16_t port)
{
    struct sockaddr_in6 s6 = {.sin6_family = AF_INET6};
    struct sockaddr_in s4 = {.sin_family = AF_INET};
    int fd, zero = 0;

    fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        s6.sin6_addr = in6addr_any;
        s6.sin6_port = htons(port);
        if (setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero))) {
            close(fd);
            return 0;
        }
        return binds(fd, &s6, sizeof(s6));
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    s4.sin_addr.s_addr = htonl(INADDR_ANY);
    s4.sin_port = htons(port);
    return binds(fd, &s4, sizeof(s4));
}

/* [*lo, *hi): whole blocks below the ephemeral range, else above it, else
 * (a machine configured oddly) 20000..60000. */
static void port_span(unsigned *lo, unsigned *hi)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    unsigned elo = 0, ehi = 0, above;
    int got = f ? fscanf(f, "%u %u", &elo, &ehi) : 0;

    if (f)
        fclose(f);
    *lo = PORTS_LOW;
    *hi = 60000;
    if (got != 2 || elo > ehi || ehi > 65535)
        return;
    above = (ehi + TEST_PORTS_MAX) / TEST_PORTS_MAX * TEST_PORTS_MAX;
    if (elo >= PORTS_LOW + 64 * TEST_PORTS_MAX) {
        *hi = elo;
    } else if (above + 64 * TEST_PORTS_MAX <= 65536) {
        *lo = above;
        *hi = 65536;
    }
}

/* An flock'ed lock file for the block at base, or -1 when someone else
 * holds it. Where the lock folder cannot be used, -2: no lock, pick by
 * the bind check alone. */
static int block_lock(unsigned base)
{
    const char *tmp = getenv("TMPDIR");
    char path[4096];
    int fd;

    if (!tmp || !*tmp)
        tmp = "/tmp";
    snprintf(path, sizeof(path), "%s/meshtrain-test-ports", tmp);
    if (mkdir(path, 01777) == 0)
        chmod(path, 01777); /* past the umask: every user's tests share it */
    snprintf(path, sizeof(path), "%s/meshtrain-test-ports/%u", tmp, base);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return -2;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int busy = errno == EWOULDBLOCK;

        close(fd);
        return busy ? -1 : -2;
    }
    return fd;
}

uint16_t test_ports_pick(int n)
{
    static unsigned calls;
    unsigned lo, hi, nblocks, k;

    if (n < 1 || n > TEST_PORTS_MAX)
        return 0;
    if (held_fd >= 0) {
        close(held_fd);
        held_fd = -1;
    }
    port_span(&lo, &hi);
    nblocks = (hi - lo) / TEST_PORTS_MAX;
    /* Start where this pid points, so that tests rarely meet at all, one
     * block on for each call, so that a scenario never gets the ports that
     * the one before it used. */
    k = ((unsigned)getpid() * 7919u + calls++) % nblocks;
    for (unsigned tries = 0; tries < nblocks; tries++, k = (k + 1) % nblocks) {
        unsigned base = lo + k * TEST_PORTS_MAX;
        int fd, i;

        if (base + TEST_PORTS_MAX > PORTS_BUSY_LO && base < PORTS_BUSY_HI)
            continue;
        fd = block_lock(base);
        if (fd == -1)
            continue;
        for (i = 0; i < n; i++)
            if (!port_free((uint16_t)(base + (unsigned)i)))
                break;
        if (i < n) {
            if (fd >= 0)
                close(fd);
            continue;
        }
        held_fd = fd;
        return (uint16_t)base;
    }
    return 0;
}

int test_ports_clash(const char *msg)
{
    return msg && strstr(msg, strerror(EADDRINUSE)) != NULL;
}
