/*
 * transport/shm/join.c: which peers share this host, and the segment: the
 * INFO exchange over the authenticated TCP mesh, the memfd and its passing
 * over an abstract Unix socket (SO_PEERCRED checked), the probe for
 * process_vm_readv.
 */
#define _GNU_SOURCE
#include "config.h"

#include "transport/shm/shm-internal.h"
#include "common/bytes.h"
#include "common/util.h"
#ifdef HAVE_VERBS
#include "transport/verbs/verbs.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

/* What a peer reads in our memory to prove it may (process_vm_readv): the
 * first bytes of the probe buffer, whose whole length it then times. */
static const char cma_probe[16] = "meshtrain-cma-ok";
#define SHM_PROBE_BYTES (256u << 10)
#define SHM_PROBE_RUNS  5

/* What a peer's probe found (the SHM_TAG_CMA byte). */
enum shm_cma_verdict {
    CMA_NO = 0,     /* the kernel refuses process_vm_readv */
    CMA_YES = 1,    /* one copy by process_vm_readv */
    CMA_SLOWER = 2, /* permitted, but two copies through the slots win */
};

/* ---- identity ------------------------------------------------------------ */

struct shm_info {
    uint32_t pid, uid, ncpu;
    uint64_t ns_dev, ns_ino, probe;
    char machine[SHM_ID_MAX], boot[SHM_ID_MAX], test_host[32];
    char sock[SHM_SOCK_NAME];
};

/* The first line of a small file, or "" (a missing file is no error: the
 * identity then rests on the other fields). */
static void read_id(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");

    out[0] = '\0';
    if (!f)
        return;
    if (fgets(out, (int)len, f))
        out[strcspn(out, "\r\n")] = '\0';
    else
        out[0] = '\0';
    fclose(f);
}

static void info_self(struct mesh_transport *t, struct shm_info *in,
                      const char *probe)
{
    struct stat st;
    const char *th = getenv("MESHTRAIN_SHM_TEST_HOST");

    memset(in, 0, sizeof(*in));
    in->pid = (uint32_t)getpid();
    in->uid = (uint32_t)getuid();
    if (stat("/proc/self/ns/net", &st) == 0) {
        in->ns_dev = (uint64_t)st.st_dev;
        in->ns_ino = (uint64_t)st.st_ino;
    }
    in->probe = (uint64_t)(uintptr_t)probe;
    read_id("/etc/machine-id", in->machine, sizeof(in->machine));
    if (!in->machine[0])
        read_id("/var/lib/dbus/machine-id", in->machine, sizeof(in->machine));
    read_id("/proc/sys/kernel/random/boot_id", in->boot, sizeof(in->boot));
    {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

        in->ncpu = ncpu > 0 && ncpu <= SHM_NCPU_MAX ? (uint32_t)ncpu : 0;
    }
    if (th)
        snprintf(in->test_host, sizeof(in->test_host), "%s", th);
    memcpy(in->sock, t->sock_name, SHM_SOCK_NAME);
}

static void info_encode(const struct shm_info *in, uint8_t *m)
{
    memset(m, 0, SHM_INFO_LEN);
    mesh_put_le32(m, SHM_INFO_MAGIC);
    mesh_put_le32(m + 4, SHM_VERSION);
    mesh_put_le32(m + 8, in->pid);
    mesh_put_le32(m + 12, in->uid);
    mesh_put_le64(m + 16, in->ns_dev);
    mesh_put_le64(m + 24, in->ns_ino);
    mesh_put_le64(m + 32, in->probe);
    memcpy(m + 40, in->machine, SHM_ID_MAX);
    memcpy(m + 104, in->boot, SHM_ID_MAX);
    memcpy(m + 168, in->test_host, 32);
    memcpy(m + 200, in->sock, SHM_SOCK_NAME);
    mesh_put_le32(m + 240, in->ncpu);
}

static int info_decode(struct mesh_transport *t, int peer, const uint8_t *m,
                       struct shm_info *in)
{
    char nb[300];

    if (mesh_get_le32(m) != SHM_INFO_MAGIC ||
        mesh_get_le32(m + 4) != SHM_VERSION)
        return mesh_err(-EPROTO,
                        "shm: rank %d (%s) sent a bad INFO (magic %08" PRIx32
                        ", version %" PRIu32 ")",
                        peer, tp_pname(&t->super, peer, nb, sizeof(nb)),
                        mesh_get_le32(m), mesh_get_le32(m + 4));
    memset(in, 0, sizeof(*in));
    in->pid = mesh_get_le32(m + 8);
    in->uid = mesh_get_le32(m + 12);
    in->ns_dev = mesh_get_le64(m + 16);
    in->ns_ino = mesh_get_le64(m + 24);
    in->probe = mesh_get_le64(m + 32);
    memcpy(in->machine, m + 40, SHM_ID_MAX - 1);
    memcpy(in->boot, m + 104, SHM_ID_MAX - 1);
    memcpy(in->test_host, m + 168, 31);
    memcpy(in->sock, m + 200, SHM_SOCK_NAME);
    in->ncpu = mesh_get_le32(m + 240);
    if (in->ncpu > SHM_NCPU_MAX) /* not a machine's: unknown */
        in->ncpu = 0;
    return 0;
}

/* Same host: the same boot (boot ids are random per boot), machine, network
 * namespace (its abstract sockets) and user, and the same test host. */
static int same_host(const struct shm_info *a, const struct shm_info *b)
{
    return a->boot[0] && !strcmp(a->boot, b->boot) &&
           !strcmp(a->machine, b->machine) && a->ns_dev == b->ns_dev &&
           a->ns_ino == b->ns_ino && a->uid == b->uid &&
           !strcmp(a->test_host, b->test_host);
}

/* Same machine: the same boot and machine ids (one kernel, whatever the
 * network namespace or user) and the same test host (a test double's
 * machine has CPUs of its own). */
static int same_cpus(const struct shm_info *a, const struct shm_info *b)
{
    return a->boot[0] && !strcmp(a->boot, b->boot) &&
           !strcmp(a->machine, b->machine) &&
           !strcmp(a->test_host, b->test_host);
}

/*
 * The most ranks per CPU on any machine of the job: each machine's ranks
 * over its online CPUs (as its ranks report them; a machine whose count
 * is unknown is left out), at least 1. From the INFOs every rank holds
 * alike, so every rank computes the same.
 */
static double ranks_per_cpu(const struct shm_info *info, int n)
{
    double most = 1.0;

    for (int p = 0; p < n; p++) {
        int first = 1, ranks = 0;
        uint32_t ncpu = 0;

        for (int q = 0; q < p && first; q++)
            first = !same_cpus(&info[p], &info[q]);
        if (!first || !info[p].boot[0])
            continue; /* counted with its first rank, or unknown */
        for (int q = p; q < n; q++)
            if (same_cpus(&info[p], &info[q])) {
                ranks++;
                if (info[q].ncpu && (!ncpu || info[q].ncpu < ncpu))
                    ncpu = info[q].ncpu;
            }
        if (ncpu)
            most = MESH_MAX(most, (double)ranks / ncpu);
    }
    return most;
}

/* ---- the abstract socket ------------------------------------------------- */

static socklen_t sock_addr(const char *name, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    /* sun_path[0] = 0: abstract, no file, gone with its last descriptor */
    memcpy(sa->sun_path + 1, name, SHM_SOCK_NAME);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                       SHM_SOCK_NAME);
}

int shm_sock_open(struct mesh_transport *t)
{
    static const char hex[] = "0123456789abcdef";
    uint8_t rnd[16];
    struct sockaddr_un sa;
    socklen_t sl;
    int rc = 0, fd = -1;
    ssize_t got;

    MESH_SYSCALL(rc, fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC), fail,
                 "shm: open /dev/urandom");
    MESH_SYSCALL(rc, got = read(fd, rnd, sizeof(rnd)), fail,
                 "shm: read /dev/urandom");
    close(fd);
    fd = -1;
    if (got != (ssize_t)sizeof(rnd))
        return mesh_err(-EIO, "shm: short read from /dev/urandom");
    memset(t->sock_name, 0, sizeof(t->sock_name));
    memcpy(t->sock_name, "meshtrain-shm-", 14);
    for (int i = 0; i < 12; i++) {
        t->sock_name[14 + 2 * i] = hex[rnd[i] >> 4];
        t->sock_name[15 + 2 * i] = hex[rnd[i] & 15];
    }
    sl = sock_addr(t->sock_name, &sa);
    MESH_SYSCALL(rc, fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), fail,
                 "shm: socket(AF_UNIX)");
    MESH_SYSCALL(rc, bind(fd, (struct sockaddr *)&sa, sl), fail,
                 "shm: bind of an abstract Unix socket");
    MESH_SYSCALL(rc, listen(fd, SHM_LOCAL_MAX), fail, "shm: listen");
    t->sock_fd = fd;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Wait for fd to be readable until deadline_ns: 0, or -ETIMEDOUT. */
static int wait_in(int fd, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = mesh_now_ns();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr;

        if (now >= deadline_ns)
            return -ETIMEDOUT;
        pr = poll(&pfd, 1, (int)((deadline_ns - now) / 1000000ull) + 1);
        if (pr > 0)
            return 0;
        if (pr < 0 && errno != EINTR)
            return -errno;
    }
}

static int peer_pid(int fd, pid_t *pid, uid_t *uid)
{
    struct ucred cr;
    socklen_t cl = sizeof(cr);

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0)
        return -errno;
    *pid = cr.pid;
    *uid = cr.uid;
    return 0;
}

/*
 * The host's first rank: hand the segment to every other local rank. A
 * caller must say its rank and be that rank's process (SO_PEERCRED against
 * its authenticated INFO); anyone else is logged and dropped.
 */
static int seg_give(struct mesh_transport *t, int memfd)
{
    uint64_t end =
        mesh_now_ns() + (uint64_t)(t->super.opts.join_timeout_s * 1e9);
    int left = t->nlocal - 1, rc = 0;
    uint8_t *given = calloc((size_t)t->super.world.size, 1);

    if (!given)
        return mesh_err(-ENOMEM, "out of memory");
    while (left > 0) {
        int c, r;
        uint8_t m[4];
        pid_t pid = 0;
        uid_t uid = 0;
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {.iov_base = m, .iov_len = 4};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = cbuf,
                            .msg_controllen = sizeof(cbuf)};
        struct cmsghdr *cm;

        rc = wait_in(t->sock_fd, end);
        if (rc < 0) {
            rc = mesh_err(rc,
                          "shm: %d local rank(s) never came for the "
                          "segment within the join timeout",
                          left);
            break;
        }
        c = accept4(t->sock_fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            rc = mesh_err_errno("shm: accept");
            break;
        }
        if (wait_in(c, mesh_now_ns() + 5000000000ull) < 0 ||
            recv(c, m, 4, MSG_WAITALL) != 4 || peer_pid(c, &pid, &uid) < 0) {
            mesh_warn("shm: a caller on the segment socket said nothing; "
                      "dropped");
            close(c);
            continue;
        }
        r = (int)mesh_get_le32(m);
        if (r < 0 || r >= t->super.world.size || t->pp[r].local < 0 ||
            given[r] || pid != t->pp[r].pid || uid != getuid()) {
            mesh_warn("shm: a caller (pid %d) posing as rank %d refused on "
                      "the segment socket",
                      (int)pid, r);
            close(c);
            continue;
        }
        memset(cbuf, 0, sizeof(cbuf));
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
        mesh_put_le32(m, (uint32_t)t->nlocal);
        if (sendmsg(c, &mh, MSG_NOSIGNAL) != 4) {
            rc = mesh_err_errno("shm: passing the segment to rank %d", r);
            close(c);
            break;
        }
        close(c);
        given[r] = 1;
        left--;
    }
    free(given);
    return rc;
}

/* Any other local rank: fetch the segment from the host's first rank
 * (whose socket name and pid its INFO gave). */
static int seg_take(struct mesh_transport *t, int leader, const char *name,
                    int *memfd)
{
    struct sockaddr_un sa;
    socklen_t sl = sock_addr(name, &sa);
    uint64_t end =
        mesh_now_ns() + (uint64_t)(t->super.opts.join_timeout_s * 1e9);
    int fd = -1, rc = 0;
    uint8_t m[4];
    char cbuf[CMSG_SPACE(sizeof(int))], nb[300];
    struct iovec iov = {.iov_base = m, .iov_len = 4};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = cbuf,
                        .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *cm;
    pid_t pid = 0;
    uid_t uid = 0;
    ssize_t got;

    tp_pname(&t->super, leader, nb, sizeof(nb));
    MESH_SYSCALL(rc, fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), out,
                 "shm: socket(AF_UNIX)");
    MESH_SYSCALL(rc, connect(fd, (struct sockaddr *)&sa, sl), out,
                 "shm: connecting to rank %d (%s)'s segment socket", leader,
                 nb);
    rc = peer_pid(fd, &pid, &uid);
    if (rc < 0 || pid != t->pp[leader].pid || uid != getuid()) {
        rc = mesh_err(-EACCES,
                      "shm: the segment socket of rank %d (%s) belongs to "
                      "pid %d, not to the rank's pid %d",
                      leader, nb, (int)pid, (int)t->pp[leader].pid);
        goto out;
    }
    mesh_put_le32(m, (uint32_t)t->super.world.rank);
    MESH_SYSCALL(rc, got = send(fd, m, 4, MSG_NOSIGNAL), out,
                 "shm: asking rank %d (%s) for the segment", leader, nb);
    rc = wait_in(fd, end);
    if (rc < 0) {
        rc = mesh_err(rc,
                      "shm: rank %d (%s) did not pass the segment "
                      "within the join timeout",
                      leader, nb);
        goto out;
    }
    memset(cbuf, 0, sizeof(cbuf));
    MESH_SYSCALL(rc, got = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL),
                 out, "shm: receiving the segment from rank %d (%s)", leader,
                 nb);
    cm = CMSG_FIRSTHDR(&mh);
    if (got != 4 || !cm || cm->cmsg_level != SOL_SOCKET ||
        cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len != CMSG_LEN(sizeof(int)) ||
        (int)mesh_get_le32(m) != t->nlocal) {
        rc = mesh_err(-EPROTO,
                      "shm: rank %d (%s) passed no segment, or one for %d "
                      "local ranks instead of %d",
                      leader, nb, got == 4 ? (int)mesh_get_le32(m) : -1,
                      t->nlocal);
        goto out;
    }
    memcpy(memfd, CMSG_DATA(cm), sizeof(int));
out:
    if (fd >= 0)
        close(fd);
    return rc;
}

/*
 * Each local rank's share of the segment (host_alloc's memory), in bytes:
 * MESHTRAIN_SHM_HEAP_MB on the host's first rank (0: none), else
 * SHM_HEAP_DEFAULT, at most SHM_HEAP_TOTAL over the host's ranks. The
 * memfd is sparse: only the pages written take memory, and host_free
 * gives them back.
 */
static size_t heap_bytes(int nlocal)
{
    const char *e = getenv("MESHTRAIN_SHM_HEAP_MB");
    size_t b = SHM_HEAP_DEFAULT;

    if (e && *e) {
        char *end;
        unsigned long long mb = strtoull(e, &end, 10);

        if (*end || mb > (SHM_HEAP_TOTAL >> 20))
            mesh_warn("shm: MESHTRAIN_SHM_HEAP_MB=%s is not a number of "
                      "MiB up to %llu; %zu MiB",
                      e, (unsigned long long)(SHM_HEAP_TOTAL >> 20), b >> 20);
        else
            b = (size_t)mb << 20;
    }
    return MESH_MIN(b, SHM_HEAP_TOTAL / (size_t)nlocal / SHM_PAGE * SHM_PAGE);
}

static int seg_map(struct mesh_transport *t, int memfd)
{
    void *p =
        mmap(NULL, t->seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);

    if (p == MAP_FAILED)
        return mesh_err_errno("shm: mmap of the %zu-byte segment", t->seg_len);
    t->seg = p;
    return 0;
}

/* Any other local rank: map the segment the first one sized (the shares'
 * size is its choice), and check its header. */
static int seg_size(struct mesh_transport *t, int leader, int memfd)
{
    struct shm_seg_hdr h;
    struct stat st;
    int rc = 0;

    MESH_SYSCALL(rc, fstat(memfd, &st), fail, "shm: fstat of the segment");
    if ((size_t)st.st_size < sizeof(h))
        return mesh_err(-EPROTO, "shm: rank %d passed a segment of %lld bytes",
                        leader, (long long)st.st_size);
    t->seg_len = (size_t)st.st_size;
    rc = seg_map(t, memfd);
    if (rc < 0)
        return rc;
    memcpy(&h, t->seg, sizeof(h));
    t->heap_bytes = (size_t)h.heap_bytes;
    if (h.magic != SHM_SEG_MAGIC || h.version != SHM_VERSION ||
        h.nlocal != (uint32_t)t->nlocal || h.heap_bytes > SHM_HEAP_TOTAL ||
        shm_seg_bytes(t->nlocal, t->heap_bytes) != t->seg_len)
        return mesh_err(-EPROTO,
                        "shm: rank %d passed a segment of %zu bytes that is "
                        "not a version %u one for %d local ranks",
                        leader, t->seg_len, SHM_VERSION, t->nlocal);
    return 0;
fail:
    return rc;
}

/* The host's first rank: a fresh memfd, sized, mapped and initialised. */
static int seg_create(struct mesh_transport *t, int *memfd)
{
    struct shm_seg_hdr *h;
    int fd = -1, rc = 0;

    MESH_SYSCALL(rc, fd = memfd_create("meshtrain-shm", MFD_CLOEXEC), fail,
                 "shm: memfd_create");
    MESH_SYSCALL(rc, ftruncate(fd, (off_t)t->seg_len), fail,
                 "shm: sizing the segment to %zu bytes", t->seg_len);
    rc = seg_map(t, fd);
    if (rc < 0)
        goto fail;
    h = (struct shm_seg_hdr *)t->seg;
    h->magic = SHM_SEG_MAGIC;
    h->version = SHM_VERSION;
    h->nlocal = (uint32_t)t->nlocal;
    h->slots = SHM_SLOTS;
    h->slot_bytes = SHM_SLOT_BYTES;
    h->heap_bytes = t->heap_bytes;
    *memfd = fd;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Whether this process may read the peer's memory: its probe's bytes. */
static int cma_probe_ok(pid_t pid, uint64_t addr)
{
    char got[sizeof(cma_probe)];
    struct iovec l = {.iov_base = got, .iov_len = sizeof(got)};
    struct iovec r = {.iov_base = (void *)(uintptr_t)addr,
                      .iov_len = sizeof(got)};

    if (process_vm_readv(pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof(got))
        return -errno;
    return memcmp(got, cma_probe, sizeof(got)) ? -EFAULT : 0;
}

/*
 * The least time, in ns, of SHM_PROBE_RUNS reads of the peer's whole probe
 * buffer by process_vm_readv (one copy), and of two memcpy of as many
 * bytes here (what the slots cost: into a slot, out of it); 0 for the
 * first where a read fell short.
 */
static void cma_probe_time(pid_t pid, uint64_t addr, char *buf,
                           uint64_t *cma_ns, uint64_t *copy_ns)
{
    char *a = buf, *b = buf + SHM_PROBE_BYTES;

    *cma_ns = *copy_ns = UINT64_MAX;
    for (int i = 0; i < SHM_PROBE_RUNS; i++) {
        struct iovec l = {.iov_base = a, .iov_len = SHM_PROBE_BYTES};
        struct iovec r = {.iov_base = (void *)(uintptr_t)addr,
                          .iov_len = SHM_PROBE_BYTES};
        uint64_t t0 = mesh_now_ns(), t1, t2;

        if (process_vm_readv(pid, &l, 1, &r, 1, 0) !=
            (ssize_t)SHM_PROBE_BYTES) {
            *cma_ns = 0;
            return;
        }
        t1 = mesh_now_ns();
        memcpy(b, a, SHM_PROBE_BYTES);
        __asm__ volatile("" : : "r"(b) : "memory");
        memcpy(a, b, SHM_PROBE_BYTES);
        __asm__ volatile("" : : "r"(a) : "memory");
        t2 = mesh_now_ns();
        *cma_ns = MESH_MIN(*cma_ns, t1 - t0);
        *copy_ns = MESH_MIN(*copy_ns, t2 - t1);
    }
}

/*
 * MESHTRAIN_SHM_CMA: "auto" (default: one copy where the probe finds it
 * faster than two), "1" (one copy wherever permitted), "0" (never).
 */
static int cma_mode(void)
{
    const char *e = getenv("MESHTRAIN_SHM_CMA");

    if (!e || !*e || !strcmp(e, "auto"))
        return -1;
    if (!strcmp(e, "0") || !strcmp(e, "1"))
        return e[0] - '0';
    mesh_warn("shm: MESHTRAIN_SHM_CMA=%s is none of auto, 0, 1: auto", e);
    return -1;
}

/* The verdict on reading peer p's memory (CMA_*), logged once per job. */
static int cma_verdict(struct mesh_transport *t, int p, uint64_t addr,
                       char *buf, int mode, int *logged)
{
    uint64_t cma_ns, copy_ns;
    int v;

    if (mode == 0 || cma_probe_ok(t->pp[p].pid, addr) < 0)
        return CMA_NO;
    if (mode == 1)
        return CMA_YES;
    cma_probe_time(t->pp[p].pid, addr, buf, &cma_ns, &copy_ns);
    if (cma_ns == 0)
        return CMA_NO;
    v = cma_ns <= copy_ns ? CMA_YES : CMA_SLOWER;
    if (!*logged) {
        *logged = 1;
        mesh_info("shm: %u KiB from rank %d: process_vm_readv %.1f us, two "
                  "copies %.1f us: %s",
                  SHM_PROBE_BYTES >> 10, p, (double)cma_ns / 1e3,
                  (double)copy_ns / 1e3,
                  v == CMA_YES ? "one copy" : "two copies through the slots");
    }
    return v;
}

void shm_seg_close(struct mesh_transport *t)
{
    if (t->seg)
        munmap(t->seg, t->seg_len);
    t->seg = NULL;
    if (t->sock_fd >= 0)
        close(t->sock_fd);
    t->sock_fd = -1;
}

/* What carries the data to the peers of other hosts. */
static const char *remote_kind(struct mesh_transport *t)
{
#ifdef HAVE_VERBS
    if (t->inner_ops == &mesh_verbs_auto_ops && mesh_verbs_active(t->inner))
        return "RDMA verbs";
#endif
    return "TCP";
}

int shm_join(struct mesh_transport *t)
{
    int n = t->super.world.size, me = t->super.world.rank, rc, leader = -1;
    int memfd = -1;
    struct shm_info self, *info = calloc((size_t)n, sizeof(*info));
    uint8_t *out = calloc(SHM_INFO_LEN, 1);
    uint8_t *in = calloc((size_t)n, SHM_INFO_LEN);
    uint8_t *cma_out = calloc((size_t)n, 1), *cma_in = calloc((size_t)n, 1);
    /* our probe buffer (peers read it), then two for our own timings */
    char *probe = malloc(3 * (size_t)SHM_PROBE_BYTES);
    int mode = cma_mode(), logged = 0;
    char nb[300];

    if (!info || !out || !in || !cma_out || !cma_in || !probe) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    memset(probe, 0x5a, 3 * (size_t)SHM_PROBE_BYTES);
    memcpy(probe, cma_probe, sizeof(cma_probe));
    info_self(t, &self, probe);
    info_encode(&self, out);
    rc = tp_ctrl_exchange(&t->super, t->inner_ops, t->inner, SHM_CTRL_SEQ,
                          SHM_TAG_INFO, out, 0, in, SHM_INFO_LEN);
    if (rc < 0)
        goto out;
    /* Local indices in rank order; the lowest local rank leads. */
    t->nlocal = 0;
    for (int p = 0; p < n; p++) {
        if (p == me) {
            info[p] = self;
        } else {
            rc = info_decode(t, p, in + (size_t)p * SHM_INFO_LEN, &info[p]);
            if (rc < 0)
                goto out;
        }
        t->pp[p].local = -1;
        if (p == me || same_host(&self, &info[p])) {
            if (t->nlocal == SHM_LOCAL_MAX) {
                mesh_warn("shm: more than %d ranks on this host; rank %d "
                          "uses TCP",
                          SHM_LOCAL_MAX, p);
                continue;
            }
            t->pp[p].local = t->nlocal++;
            t->pp[p].pid = (pid_t)info[p].pid;
            if (leader < 0)
                leader = p;
        }
    }
    /* Every rank's host, for the collectives: its lowest rank. */
    t->host = calloc((size_t)n, sizeof(*t->host));
    if (!t->host) {
        rc = mesh_err(-ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < n; p++) {
        t->host[p] = p;
        for (int q = 0; q < p; q++)
            if (same_host(&info[p], &info[q])) {
                t->host[p] = q;
                break;
            }
    }
    t->ranks_per_cpu = ranks_per_cpu(info, n);
    t->me = t->pp[me].local;
    if (t->me < 0) {
        /* more than SHM_LOCAL_MAX here and we are past them: TCP only */
        for (int p = 0; p < n; p++)
            t->pp[p].local = -1;
        t->nlocal = 0;
        goto log;
    }
    if (t->nlocal > 1) {
        if (leader == me) {
            t->heap_bytes = heap_bytes(t->nlocal);
            t->seg_len = shm_seg_bytes(t->nlocal, t->heap_bytes);
            rc = seg_create(t, &memfd);
            if (rc == 0)
                rc = seg_give(t, memfd);
        } else {
            rc = seg_take(t, leader, info[leader].sock, &memfd);
            if (rc == 0)
                rc = seg_size(t, leader, memfd);
        }
        if (memfd >= 0)
            close(memfd); /* the mapping keeps it */
        if (rc < 0)
            goto out;
        shm_proc_at(t, t->me)->pid = (uint32_t)getpid();
    }
    /* Who reads our memory: each rank probes the others' (the exchange
     * returns once every peer has, so the probe buffer may go after it). */
    for (int p = 0; p < n; p++)
        if (p != me && t->pp[p].local >= 0)
            cma_out[p] = (uint8_t)cma_verdict(
                t, p, info[p].probe, probe + SHM_PROBE_BYTES, mode, &logged);
    rc = tp_ctrl_exchange(&t->super, t->inner_ops, t->inner, SHM_CTRL_SEQ,
                          SHM_TAG_CMA, cma_out, 1, cma_in, 1);
    if (rc < 0)
        goto out;
log:
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        tp_pname(&t->super, p, nb, sizeof(nb));
        if (t->pp[p].local < 0) {
            mesh_info("shm: rank %d (%s) is on another host: %s", p, nb,
                      remote_kind(t));
            continue;
        }
        t->pp[p].cma = cma_in[p] == CMA_YES;
        if (t->pp[p].cma)
            mesh_info("shm: rank %d (%s) shares this host: shared memory, "
                      "one copy (process_vm_readv) from %u bytes",
                      p, nb, SHM_CMA_MIN);
        else if (cma_in[p] == CMA_SLOWER)
            mesh_info("shm: rank %d (%s) shares this host: shared memory, "
                      "two copies through the slots (its probe found them "
                      "faster than process_vm_readv)",
                      p, nb);
        else
            mesh_info("shm: rank %d (%s) shares this host: shared memory, "
                      "two copies through the slots (it may not read this "
                      "process's memory with process_vm_readv)",
                      p, nb);
    }
    if (t->sock_fd >= 0)
        close(t->sock_fd);
    t->sock_fd = -1;
    rc = 0;
out:
    free(info);
    free(out);
    free(in);
    free(cma_out);
    free(cma_in);
    free(probe);
    return rc;
}
