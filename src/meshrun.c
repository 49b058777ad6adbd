/*
 * src/meshrun.c: start every rank of a mesh job and watch them.
 *
 *   meshrun -np N [--hostfile F | -H h1:2,h2:2] [--launcher local|ssh]
 *           -- PROGRAM ARGS...
 *
 * meshrun takes no part in the job's communication: it starts each rank
 * (fork/exec on this host, ssh elsewhere) with MESHTRAIN_RANK, _SIZE,
 * _LOCAL_RANK, _HOSTFILE or _HOSTS and _JOB_ID set, hands each one the
 * job's fresh secret on a pipe (MESHTRAIN_SECRET_FD; over ssh, on its
 * stdin), prefixes every output line with the rank, and on the first
 * failure stops the others (SIGTERM, then SIGKILL after a grace period),
 * names the culprit and exits with its code (see usage(), "Exit status").
 * A rank whose mesh failed reports whom it blames on its stderr
 * (MESH_REPORT_CULPRIT, asked for with MESHTRAIN_REPORT_FD=2); meshrun
 * takes those lines out of the output.
 *
 * With --elastic a dead rank stops nobody; --restarts K starts it again
 * on its host (up to K times per slot, with backoff), and the new process
 * joins the running job (doc/elastic.md, "Joining"). --max-peers M starts
 * only the first M slots; the others are spares, started in place of a
 * slot whose restarts are used up.
 */
#include "config.h"

#include "mesh/hostfile.h"
#include "mesh/mesh.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define LINE_MAX_BYTES     65536
#define SECRET_BYTES       32
#define DEFAULT_GRACE_S    5.0
#define DRAIN_AFTER_EXIT_S 2.0
/* How long a rank's "peer failed" exit waits for the culprit's own. */
#define SETTLE_S 0.5
/* --restarts: the first restart of a slot waits this long, each next one
 * twice as long as the one before, up to RESTART_MAX_S. */
#define RESTART_DELAY_S 1.0
#define RESTART_MAX_S   30.0
/* A restarted process still running this long after the first rank
 * finished missed the job's end (it was waiting to join): stopped. */
#define LATE_S 60.0

enum launcher { LAUNCH_AUTO, LAUNCH_LOCAL, LAUNCH_SSH };

struct stream {
    int fd;     /* read end of the rank's stdout or stderr, -1 closed */
    int out;    /* where its lines go: 1 or 2 */
    size_t len; /* bytes waiting for a newline */
    char buf[LINE_MAX_BYTES];
};

struct proc {
    int rank;
    int local_rank;
    const char *host;
    int remote;
    pid_t pid;
    int running;
    int status;        /* from waitpid, once it has exited */
    int blames;        /* the culprit its failed mesh reported, -1: none */
    int blamed_at;     /* order of that report among all ranks' (1, 2, ...) */
    int started;       /* launched at least once (not a spare) */
    int restarts;      /* --restarts: how often it was started again */
    double restart_at; /* a (re)start is due then (monotonic s), 0: none */
    int late;          /* stopped by late_stop */
    int left;          /* --elastic: a view change left its slot out */
    int member;        /* --elastic: in the job's view (started with the job, or
                        * joined since it started again), not a joiner */
    double kill_at;    /* late_stop's SIGKILL is due then, 0: none */
    struct stream s[2];
};

struct run {
    int np;
    const char *hostfile; /* absolute path */
    const char *hosts;
    enum launcher launcher;
    const char *ssh;
    double grace_s;
    char **argv; /* the program and its arguments */
    struct proc *procs;
    char secret[2 * SECRET_BYTES + 2];
    char job_id[64];
    int reports;        /* culprit reports received so far */
    int elastic;        /* --elastic: a rank's exit stops no other */
    int min_peers;      /* --elastic: ranks that must finish (exit 0) */
    int max_peers;      /* --elastic: ranks running at once (0: every slot) */
    int restarts;       /* --restarts: per slot */
    double finished_at; /* --restarts: when the first rank exited 0 */
    int first_np;       /* the slots started with the job (--max-peers) */
    int over;           /* --elastic: no member of the view runs any more */
};

static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    int saved = errno;
    char c = (char)sig;

    if (sig != SIGCHLD)
        got_signal = sig;
    if (write(sig_pipe[1], &c, 1) < 0) {
        /* The pipe is full: a wakeup is already pending. */
    }
    errno = saved;
}

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: meshrun [-np N] [--hostfile FILE | -H h1:2,h2:2]\n"
            "               [--launcher local|ssh] [--ssh CMD] [--grace S]\n"
            "               [--elastic] [--min-peers M] [--max-peers M]\n"
            "               [--restarts K]\n"
            "               -- PROGRAM [ARGS...]\n"
            "\n"
            "Start N ranks of PROGRAM, one per hostfile slot, in file order.\n"
            "Ranks on this host are forked; others are started with ssh.\n"
            "\n"
            "  -np, -n N          number of ranks: must equal the total slot\n"
            "                     count; with no hosts given, -H localhost:N\n"
            "  --hostfile FILE    Open MPI or Horovod hostfile "
            "[MESHTRAIN_HOSTFILE]\n"
            "  -H, --hosts LIST   h1:2,h2:2,[::1]:1 [MESHTRAIN_HOSTS]\n"
            "  --launcher MODE    auto (default: fork for this host's "
            "entries,\n"
            "                     ssh for others), local (fork every rank),\n"
            "                     ssh (ssh for every rank)\n"
            "  --ssh CMD          remote shell, run as CMD HOST COMMAND\n"
            "                     (default 'ssh -o BatchMode=yes -x -T')\n"
            "                     [MESHTRAIN_SSH]\n"
            "  --grace S          seconds between SIGTERM and SIGKILL when\n"
            "                     stopping ranks (default 5)\n"
            "  --elastic          a rank that dies stops no other (also when\n"
            "                     the program has --elastic): the survivors\n"
            "                     form a new view; view changes are reported\n"
            "  --min-peers M      --elastic: exit 0 when at least M ranks\n"
            "                     finish (default: the program's, else 1)\n"
            "  --max-peers M      --elastic: start only the first M slots;\n"
            "                     the others are spares, started in place\n"
            "                     of a slot whose restarts are used up\n"
            "                     (default: every slot)\n"
            "  --restarts K       --elastic: start a rank whose process died\n"
            "                     again, on its host, up to K times per slot\n"
            "                     (default 0), after 1 s, 2 s, 4 s ... (at\n"
            "                     most 30 s); it joins the running job\n"
            "  -h, --help         this text\n"
            "\n"
            "Every rank gets MESHTRAIN_RANK, MESHTRAIN_SIZE,\n"
            "MESHTRAIN_LOCAL_RANK, MESHTRAIN_HOSTFILE or MESHTRAIN_HOSTS,\n"
            "MESHTRAIN_JOB_ID (fresh per job), MESHTRAIN_REPORT_FD=2 (where\n"
            "a failed mesh reports its culprit to meshrun), and the job's\n"
            "fresh secret on a pipe named by MESHTRAIN_SECRET_FD (over ssh:\n"
            "on stdin). Other MESHTRAIN_* variables are passed on. Output\n"
            "lines are prefixed with '[RANK] '.\n"
            "\n"
            "Exit status (never 0 unless every rank exited 0); meshrun\n"
            "names the culprit on stderr:\n"
            "  0        every rank exited with 0\n"
            "  1        meshrun's own usage or launch error, or the code of\n"
            "           a rank that failed on its own (below)\n"
            "  C        the code C (not 0 or 3) of the first rank that\n"
            "           failed on its own, e.g. 1 (its own error), 2 (join),\n"
            "           4 (wrong data)\n"
            "  128+S    that rank was killed by signal S, or meshrun itself\n"
            "           got SIGINT/SIGTERM (S) and stopped the job\n"
            "  3        ranks exited 3 (a peer failed) and no rank failed on\n"
            "           its own within 0.5 s: the culprit is the rank most\n"
            "           of them blame (a stopped or hung rank too, which\n"
            "           meshrun then stops), else the first to exit 3\n"
            "With --elastic: 0 when at least --min-peers ranks exited 0,\n"
            "else 5 (no quorum) or 6 (below --min-peers) as the last ranks\n"
            "gave, or the first failure's code. A slot counts by its last\n"
            "process.\n");
}

static int is_local_host(const char *host)
{
    struct ifaddrs *ifs, *ifa;
    char name[HOST_NAME_MAX + 1], addr[INET6_ADDRSTRLEN];
    size_t n;
    int local = 0;

    if (!strcmp(host, "localhost") || !strncmp(host, "127.", 4) ||
        !strcmp(host, "::1"))
        return 1;
    if (gethostname(name, sizeof(name)) == 0) {
        name[sizeof(name) - 1] = '\0';
        if (!strcmp(host, name))
            return 1;
        /* "node1" matches "node1.example.org" either way round. */
        n = strcspn(name, ".");
        if (strlen(host) == n && !strncmp(host, name, n))
            return 1;
        n = strcspn(host, ".");
        if (strlen(name) == n && !strncmp(host, name, n))
            return 1;
    }
    if (getifaddrs(&ifs) != 0)
        return 0;
    for (ifa = ifs; ifa && !local; ifa = ifa->ifa_next) {
        const void *a;

        if (!ifa->ifa_addr)
            continue;
        if (ifa->ifa_addr->sa_family == AF_INET)
            a = &((struct sockaddr_in *)(void *)ifa->ifa_addr)->sin_addr;
        else if (ifa->ifa_addr->sa_family == AF_INET6)
            a = &((struct sockaddr_in6 *)(void *)ifa->ifa_addr)->sin6_addr;
        else
            continue;
        if (inet_ntop(ifa->ifa_addr->sa_family, a, addr, sizeof(addr)) &&
            !strcmp(addr, host))
            local = 1;
    }
    freeifaddrs(ifs);
    return local;
}

/* Append s to buf (cap bytes) in single quotes, shell-safe. */
static int shell_quote(char *buf, size_t cap, size_t *len, const char *s)
{
    size_t n = *len;

#define PUT(c)                                                                 \
    do {                                                                       \
        if (n + 1 >= cap)                                                      \
            return -1;                                                         \
        buf[n++] = (c);                                                        \
    } while (0)
    PUT('\'');
    for (; *s; s++) {
        if (*s == '\'') {
            PUT('\'');
            PUT('\\');
            PUT('\'');
            PUT('\'');
        } else {
            PUT(*s);
        }
    }
    PUT('\'');
    PUT(' ');
#undef PUT
    buf[n] = '\0';
    *len = n;
    return 0;
}

static int append_assign(char *buf, size_t cap, size_t *len, const char *name,
                         const char *val)
{
    char kv[PATH_MAX + 128];

    snprintf(kv, sizeof(kv), "%s=%s", name, val);
    return shell_quote(buf, cap, len, kv);
}

/*
 * The command line the remote shell runs: cd to our directory, set the
 * rank's variables (and every MESHTRAIN_* of ours but the secret's), exec
 * the program with the secret on stdin.
 */
static int remote_command(const struct run *run, const struct proc *p,
                          char *const envs[][2], int nenv, char *buf,
                          size_t cap)
{
    extern char **environ;
    char cwd[PATH_MAX];
    size_t len = 0;
    char **e;
    int i;

    if (!getcwd(cwd, sizeof(cwd)))
        snprintf(cwd, sizeof(cwd), ".");
    buf[0] = '\0';
    len = (size_t)snprintf(buf, cap, "cd ");
    if (shell_quote(buf, cap, &len, cwd) < 0)
        return -1;
    len += (size_t)snprintf(buf + len, cap - len, "&& exec env ");
    for (e = environ; *e; e++) {
        char name[128];
        const char *eq = strchr(*e, '=');
        size_t n;

        if (strncmp(*e, "MESHTRAIN_", 10) || !eq)
            continue;
        n = (size_t)(eq - *e);
        if (n >= sizeof(name))
            continue;
        memcpy(name, *e, n);
        name[n] = '\0';
        for (i = 0; i < nenv; i++)
            if (!strcmp(name, envs[i][0]))
                break;
        /* Ours win; and only one of the two host sources may arrive. */
        if (i < nenv || !strcmp(name, "MESHTRAIN_SECRET_FD") ||
            !strcmp(name, "MESHTRAIN_HOSTS") ||
            !strcmp(name, "MESHTRAIN_HOSTFILE"))
            continue;
        if (shell_quote(buf, cap, &len, *e) < 0)
            return -1;
    }
    for (i = 0; i < nenv; i++)
        if (append_assign(buf, cap, &len, envs[i][0], envs[i][1]) < 0)
            return -1;
    if (append_assign(buf, cap, &len, "MESHTRAIN_SECRET_FD", "0") < 0)
        return -1;
    for (i = 0; run->argv[i]; i++)
        if (shell_quote(buf, cap, &len, run->argv[i]) < 0)
            return -1;
    (void)p;
    return 0;
}

/* Split "ssh -o X" into words (no quoting: keep the command simple). */
static int split_words(const char *s, char **words, int max, char *store,
                       size_t cap)
{
    int n = 0;

    snprintf(store, cap, "%s", s);
    for (char *tok = strtok(store, " \t"); tok; tok = strtok(NULL, " \t")) {
        if (n + 1 >= max)
            return -1;
        words[n++] = tok;
    }
    words[n] = NULL;
    return n;
}

static void child_fail(const char *what, const char *arg)
{
    char msg[512];
    int n = snprintf(msg, sizeof(msg), "meshrun: %s %s: %s\n", what, arg,
                     strerror(errno));

    if (write(STDERR_FILENO, msg, (size_t)n) < 0) {
        /* Nowhere left to report to. */
    }
    _exit(127);
}

/* In the child: become the rank and exec. Never returns. */
static void exec_rank(const struct run *run, struct proc *p, int out_w,
                      int err_w, int secret_r)
{
    char rank[16], size[16], local[16];
    char *envs[6][2];
    int nenv = 0, devnull, i;
    sigset_t none;

    setpgid(0, 0);
#ifdef PR_SET_PDEATHSIG
    /* If meshrun is killed outright, its local ranks go too. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (dup2(out_w, STDOUT_FILENO) < 0 || dup2(err_w, STDERR_FILENO) < 0)
        child_fail("cannot redirect output of", p->host);

    snprintf(rank, sizeof(rank), "%d", p->rank);
    snprintf(size, sizeof(size), "%d", run->np);
    snprintf(local, sizeof(local), "%d", p->local_rank);
    envs[nenv][0] = "MESHTRAIN_RANK";
    envs[nenv++][1] = rank;
    envs[nenv][0] = "MESHTRAIN_SIZE";
    envs[nenv++][1] = size;
    envs[nenv][0] = "MESHTRAIN_LOCAL_RANK";
    envs[nenv++][1] = local;
    envs[nenv][0] = run->hostfile ? "MESHTRAIN_HOSTFILE" : "MESHTRAIN_HOSTS";
    envs[nenv++][1] = (char *)(run->hostfile ? run->hostfile : run->hosts);
    envs[nenv][0] = "MESHTRAIN_JOB_ID";
    envs[nenv++][1] = (char *)run->job_id;
    /* A failed mesh names its culprit on stderr (MESH_REPORT_CULPRIT). */
    envs[nenv][0] = "MESHTRAIN_REPORT_FD";
    envs[nenv++][1] = "2";

    /* One host source only (an ssh-like agent may pass our env on). */
    unsetenv(run->hostfile ? "MESHTRAIN_HOSTS" : "MESHTRAIN_HOSTFILE");
    if (p->remote) {
        static char cmd[65536];
        static char store[1024];
        char *words[64];
        int n;

        /* The secret travels on ssh's stdin. */
        if (dup2(secret_r, STDIN_FILENO) < 0)
            child_fail("cannot give the secret to", p->host);
        if (remote_command(run, p, envs, nenv, cmd, sizeof(cmd)) < 0) {
            errno = E2BIG;
            child_fail("command line too long for", p->host);
        }
        n = split_words(run->ssh, words, 60, store, sizeof(store));
        if (n <= 0) {
            errno = EINVAL;
            child_fail("bad --ssh command", run->ssh);
        }
        words[n++] = (char *)p->host;
        words[n++] = cmd;
        words[n] = NULL;
        execvp(words[0], words);
        child_fail("cannot run", words[0]);
    }

    devnull = open("/dev/null", O_RDONLY);
    if (devnull < 0 || dup2(devnull, STDIN_FILENO) < 0)
        child_fail("cannot open", "/dev/null");
    {
        char fdstr[16];
        int flags = fcntl(secret_r, F_GETFD);

        /* Only the secret pipe survives exec, by number. */
        if (flags < 0 || fcntl(secret_r, F_SETFD, flags & ~FD_CLOEXEC) < 0)
            child_fail("cannot pass the secret pipe to", p->host);
        snprintf(fdstr, sizeof(fdstr), "%d", secret_r);
        setenv("MESHTRAIN_SECRET_FD", fdstr, 1);
    }
    for (i = 0; i < nenv; i++)
        setenv(envs[i][0], envs[i][1], 1);
    execvp(run->argv[0], run->argv);
    child_fail("cannot run", run->argv[0]);
}

static int launch(struct run *run, struct proc *p)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1}, sec[2] = {-1, -1};
    size_t len = strlen(run->secret);
    pid_t pid;
    int rc;

    MESH_SYSCALL(rc, pipe2(out, O_CLOEXEC), fail, "pipe");
    MESH_SYSCALL(rc, pipe2(err, O_CLOEXEC), fail_out, "pipe");
    MESH_SYSCALL(rc, pipe2(sec, O_CLOEXEC), fail_err, "pipe");
    /* The secret fits the pipe's buffer: write it all now, then EOF. */
    if (write(sec[1], run->secret, len) != (ssize_t)len) {
        rc = mesh_err_errno("cannot write the secret pipe");
        goto fail_sec;
    }
    close(sec[1]);
    sec[1] = -1;
    fflush(stdout);
    fflush(stderr);
    MESH_SYSCALL(rc, pid = fork(), fail_sec, "fork");
    if (pid == 0)
        exec_rank(run, p, out[1], err[1], sec[0]);
    setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    close(sec[0]);
    p->member = !p->started && p->rank < run->first_np;
    p->pid = pid;
    p->running = 1;
    p->started = 1;
    p->left = 0;
    p->late = 0;
    p->kill_at = 0;
    p->status = 0;
    p->blames = -1;
    p->s[0].len = p->s[1].len = 0;
    p->s[0].fd = out[0];
    p->s[0].out = STDOUT_FILENO;
    p->s[1].fd = err[0];
    p->s[1].out = STDERR_FILENO;
    return 0;
fail_sec:
    close(sec[0]);
    if (sec[1] >= 0)
        close(sec[1]);
fail_err:
    close(err[0]);
    close(err[1]);
fail_out:
    close(out[0]);
    close(out[1]);
fail:
    return rc;
}

/* Mark the slots of a view report's list ("3", "1,4" or "none") left out
 * (1) or members again (0). */
static void mark_slots(struct run *run, const char *list, int left)
{
    for (const char *c = list; *c;) {
        char *end;
        long s = strtol(c, &end, 10);

        if (end == c)
            return;
        /* a report of a view that left a slot out may come after
         * meshrun restarted the slot: the new process, not yet a
         * member, is not the one that left */
        if (s >= 0 && s < run->np && !(left && !run->procs[s].member)) {
            run->procs[s].left = left;
            run->procs[s].member = !left;
        }
        c = end + (*end == ',');
    }
}

/* A rank's culprit report (MESH_REPORT_CULPRIT) on its stderr: note it;
 * a view change's (MESH_REPORT_VIEW): say it, and note who left. */
static int take_report(struct run *run, struct proc *p, const char *line,
                       size_t n)
{
    size_t k = strlen(MESH_REPORT_CULPRIT), kv = strlen(MESH_REPORT_VIEW);
    char num[16];
    long r;
    char *end;

    if (n > kv && n < 400 && !memcmp(line, MESH_REPORT_VIEW, kv)) {
        unsigned long long view;
        int size;
        char left[300], joined[300] = "";

        if (sscanf(line + kv, "%llu size %d left %299s joined %299s", &view,
                   &size, left, joined) < 3)
            return 0;
        mark_slots(run, left, 1);
        mark_slots(run, joined, 0);
        fprintf(stderr,
                "meshrun: view %llu: %d rank(s) continue; slot(s) %s left "
                "(reported by rank %d)\n",
                view, size, left, p->rank);
        return 1;
    }

    if (n <= k || n - k >= sizeof(num) || memcmp(line, MESH_REPORT_CULPRIT, k))
        return 0;
    memcpy(num, line + k, n - k);
    num[n - k] = '\0';
    r = strtol(num, &end, 10);
    if (*end || r < 0 || r >= run->np)
        return 0;
    p->blames = (int)r;
    p->blamed_at = ++run->reports;
    return 1;
}

/* Write "[rank] line\n" with one write call, so lines never mix. */
static void emit(struct run *run, struct proc *p, struct stream *s,
                 const char *line, size_t n)
{
    char buf[LINE_MAX_BYTES + 32];
    int h = snprintf(buf, sizeof(buf), "[%d] ", p->rank);
    size_t total;

    if (s->out == STDERR_FILENO && take_report(run, p, line, n))
        return;

    if (n > LINE_MAX_BYTES)
        n = LINE_MAX_BYTES;
    memcpy(buf + h, line, n);
    total = (size_t)h + n;
    buf[total++] = '\n';
    for (size_t off = 0; off < total;) {
        ssize_t w = write(s->out, buf + off, total - off);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* our own output is gone; keep running the job */
        off += (size_t)w;
    }
}

static void drain(struct run *run, struct proc *p, struct stream *s)
{
    ssize_t n;
    size_t start = 0, i;

    n = read(s->fd, s->buf + s->len, sizeof(s->buf) - s->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        if (s->len)
            emit(run, p, s, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)n;
    for (i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n')
            continue;
        emit(run, p, s, s->buf + start, i - start);
        start = i + 1;
    }
    if (start == 0 && s->len == sizeof(s->buf)) {
        /* A line longer than the buffer: pass it on in pieces. */
        emit(run, p, s, s->buf, s->len);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

/* Everything a rank that has exited left in its pipes, now. */
static void drain_all(struct run *run, struct proc *p)
{
    for (int k = 0; k < 2; k++) {
        struct stream *s = &p->s[k];
        struct pollfd pf;

        for (int i = 0; i < 1024 && s->fd >= 0; i++) {
            pf.fd = s->fd;
            pf.events = POLLIN;
            if (poll(&pf, 1, 0) <= 0 || !pf.revents)
                break;
            drain(run, p, s);
        }
    }
}

static void signal_all(struct run *run, int sig)
{
    for (int r = 0; r < run->np; r++)
        if (run->procs[r].running)
            kill(-run->procs[r].pid, sig);
}

static int exit_code_of(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

static int setup_signals(void)
{
    struct sigaction sa;
    int rc;

    MESH_SYSCALL(rc, pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK), out, "pipe");
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL) ||
        sigaction(SIGHUP, &sa, NULL) || sigaction(SIGCHLD, &sa, NULL)) {
        rc = mesh_err_errno("sigaction");
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    return 0;
out:
    return rc;
}

/* Say which rank failed the job; returns its exit code (never 0). */
static int name_culprit(const struct run *run, int cand, int running)
{
    const struct proc *p = &run->procs[cand];
    int code = exit_code_of(p->status);

    if (WIFSIGNALED(p->status))
        fprintf(stderr, "meshrun: rank %d (%s) was killed by signal %d%s\n",
                cand, p->host, WTERMSIG(p->status),
                running ? "; stopping the other ranks" : "");
    else
        fprintf(stderr, "meshrun: rank %d (%s) exited with code %d%s\n", cand,
                p->host, code, running ? "; stopping the other ranks" : "");
    return code ? code : 1;
}

/*
 * The culprit the ranks' reports agree on: the rank most of them blame,
 * the first one blamed among equals; -1 when no rank reported one.
 */
static int agreed_culprit(const struct run *run)
{
    int best = -1, best_n = 0, best_at = 0;

    for (int c = 0; c < run->np; c++) {
        int n = 0, at = 0;

        for (int r = 0; r < run->np; r++) {
            const struct proc *p = &run->procs[r];

            if (p->blames != c)
                continue;
            n++;
            if (!at || p->blamed_at < at)
                at = p->blamed_at;
        }
        if (n > best_n || (n && n == best_n && at < best_at)) {
            best = c;
            best_n = n;
            best_at = at;
        }
    }
    return best;
}

/* Name the rank the others blame; returns code, their exit code. */
static int name_blamed(const struct run *run, int culprit, int code,
                       int running)
{
    const struct proc *p = &run->procs[culprit];
    int n = 0;

    for (int r = 0; r < run->np; r++)
        n += run->procs[r].blames == culprit;
    if (p->running)
        fprintf(stderr,
                "meshrun: rank %d (%s) failed the job: %d rank(s) name it "
                "the culprit, and it has not exited (stopped or hung); "
                "exit code %d%s\n",
                culprit, p->host, n, code,
                running ? "; stopping the other ranks" : "");
    else
        fprintf(stderr,
                "meshrun: rank %d (%s) failed the job: %d rank(s) name it "
                "the culprit; exit code %d%s\n",
                culprit, p->host, n, code,
                running ? "; stopping the other ranks" : "");
    return code ? code : 1;
}

/*
 * --elastic: 0 when at least --min-peers ranks finished (exit 0); else
 * the code the last survivors gave (5: no quorum, 6: below --min-peers),
 * or the first failure's.
 */
static int elastic_code(const struct run *run)
{
    int ok = 0, code = 0;

    for (int r = 0; r < run->np; r++) {
        int c = exit_code_of(run->procs[r].status);

        if (!run->procs[r].started)
            continue; /* a spare, never needed */
        if (c == 0)
            ok++;
        else if (c == MESH_EXIT_QUORUM || c == MESH_EXIT_MIN_PEERS || !code)
            code = c;
    }
    if (ok >= run->min_peers) {
        fprintf(stderr,
                "meshrun: %d of %d rank(s) finished (--elastic, at least "
                "%d needed)\n",
                ok, run->np, run->min_peers);
        return 0;
    }
    fprintf(stderr,
            "meshrun: only %d of %d rank(s) finished, fewer than "
            "--min-peers %d; exit code %d\n",
            ok, run->np, run->min_peers, code ? code : 1);
    return code ? code : 1;
}

/* A dead rank's pipes, before its slot starts again: what is left in
 * them, then closed. */
static void streams_close(struct run *run, struct proc *p)
{
    drain_all(run, p);
    for (int k = 0; k < 2; k++) {
        struct stream *s = &p->s[k];

        if (s->fd < 0)
            continue;
        if (s->len)
            emit(run, p, s, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
    }
}

/* --restarts: the wait before a slot's next start (1 s, 2 s, 4 s, ...). */
static double restart_delay(const struct proc *p)
{
    double d = RESTART_DELAY_S;

    for (int i = 0; i < p->restarts && d < RESTART_MAX_S; i++)
        d *= 2;
    return MESH_MIN(d, RESTART_MAX_S);
}

/*
 * --restarts: rank p's process died with code (not 0). Start its slot
 * again after the backoff, or a spare slot in its place once its restarts
 * are used up; not when the view fell below --min-peers (exit 6), where
 * the others stop too.
 */
static void schedule_restart(struct run *run, struct proc *p, int code)
{
    struct proc *q = NULL;

    if ((!run->restarts && !run->max_peers) || code == MESH_EXIT_MIN_PEERS)
        return;
    if (p->restarts < run->restarts) {
        p->restart_at = mesh_now_s() + restart_delay(p);
        fprintf(stderr,
                "meshrun: restarting rank %d (%s) in %.0f s (restart %d "
                "of %d)\n",
                p->rank, p->host, restart_delay(p), p->restarts + 1,
                run->restarts);
        return;
    }
    for (int r = 0; r < run->np && !q; r++)
        if (!run->procs[r].started && !run->procs[r].restart_at)
            q = &run->procs[r];
    if (!q) {
        fprintf(stderr,
                "meshrun: rank %d (%s) used up its %d restart(s), and no "
                "spare slot is left\n",
                p->rank, p->host, run->restarts);
        return;
    }
    q->restart_at = mesh_now_s() + RESTART_DELAY_S;
    fprintf(stderr,
            "meshrun: rank %d (%s) used up its %d restart(s); starting spare "
            "slot %d (%s) in %.0f s\n",
            p->rank, p->host, run->restarts, q->rank, q->host, RESTART_DELAY_S);
}

/*
 * --restarts: start the slots whose time has come, while the job runs (a
 * restarted process joins the running ranks; with none left, the job is
 * over). Returns how many started.
 */
static int restart_due(struct run *run, int running, int stopping)
{
    double now = mesh_now_s();
    int n = 0, rc;

    for (int r = 0; r < run->np; r++) {
        struct proc *q = &run->procs[r];
        int again = q->started;

        if (!q->restart_at || now < q->restart_at)
            continue;
        q->restart_at = 0;
        /* the job is stopping (or a signal, not yet acted on, asks it
         * to), over, or has finished training */
        if (stopping || got_signal || running + n == 0 || run->finished_at ||
            run->over)
            continue;
        streams_close(run, q);
        rc = launch(run, q);
        if (rc < 0) {
            fprintf(stderr, "meshrun: cannot start rank %d on %s again: %s\n",
                    r, q->host, mesh_err_msg(rc));
            continue;
        }
        if (again)
            q->restarts++;
        n++;
        if (again)
            fprintf(stderr,
                    "meshrun: rank %d (%s) started again (restart %d of "
                    "%d); it joins the running job\n",
                    r, q->host, q->restarts, run->restarts);
        else
            fprintf(stderr,
                    "meshrun: spare slot %d (%s) started; it joins the "
                    "running job\n",
                    r, q->host);
    }
    return n;
}

/*
 * --elastic, once the first rank finished: a rank that a view change left
 * out (stopped, hung, or cut off) and that still runs can no longer
 * finish; and with --restarts, a process started again that waits to
 * join a job that ended: at once when no member runs any more (over),
 * else LATE_S after the first rank finished. Stop them
 * (SIGTERM, continued if stopped; SIGKILL after --grace). Other ranks
 * that started with the job are never stopped here.
 */
static void late_stop(struct run *run)
{
    double now = mesh_now_s();

    if (!run->finished_at && !run->over)
        return;
    for (int r = 0; r < run->np; r++) {
        struct proc *q = &run->procs[r];
        int joiner = q->restarts || r >= run->first_np;

        if (q->running && q->late && q->kill_at && now >= q->kill_at) {
            kill(-q->pid, SIGKILL);
            q->kill_at = 0;
        }
        if (!q->running || q->late ||
            !(q->left || (joiner && now >= run->finished_at + LATE_S) ||
              (run->over && !q->member)))
            continue;
        q->late = 1;
        q->kill_at = now + run->grace_s;
        if (q->left)
            fprintf(stderr,
                    "meshrun: rank %d (%s), left out of the view, still "
                    "runs after the job %s; stopping it\n",
                    r, q->host, run->over ? "ended" : "finished");
        else if (run->over)
            fprintf(stderr,
                    "meshrun: rank %d (%s), started again, has no job left "
                    "to join; stopping it\n",
                    r, q->host);
        else
            fprintf(stderr,
                    "meshrun: rank %d (%s), started again, still runs %.0f "
                    "s after the job finished; stopping it\n",
                    r, q->host, LATE_S);
        kill(-q->pid, SIGTERM);
        kill(-q->pid, SIGCONT);
    }
}

/* --elastic: whether a member of the job's view still runs. */
static int members_running(const struct run *run)
{
    for (int r = 0; r < run->np; r++)
        if (run->procs[r].running && run->procs[r].member)
            return 1;
    return 0;
}

/* Watch the ranks until all have exited; returns meshrun's exit code. */
static int supervise(struct run *run)
{
    struct pollfd *pfds;
    struct stream **owners;
    struct proc **procs_of;
    int cand = -1, cand_pri = 0, code = 0, running = 0, stopping = 0;
    int killed = 0;
    double kill_at = 0, all_exited_at = 0, settle_at = 0;

    pfds = calloc(2 * (size_t)run->np + 1, sizeof(*pfds));
    owners = calloc(2 * (size_t)run->np + 1, sizeof(*owners));
    procs_of = calloc(2 * (size_t)run->np + 1, sizeof(*procs_of));
    if (!pfds || !owners || !procs_of) {
        fprintf(stderr, "meshrun: out of memory\n");
        signal_all(run, SIGKILL);
        free(pfds);
        free(owners);
        free(procs_of);
        return 1;
    }
    for (int r = 0; r < run->np; r++)
        running += run->procs[r].running;
    for (;;) {
        int n = 0, open_streams = 0, timeout = 100;
        pid_t pid;
        int status;

        /*
         * Reap every rank that has exited. The culprit is the rank killed
         * by a signal or failing for its own reasons, not one exiting 3
         * (MESH_EXIT_PEER) in reaction to it: such a one is only a
         * candidate for SETTLE_S, in case the culprit's own exit is
         * reported a moment later.
         */
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (int r = 0; r < run->np; r++) {
                struct proc *p = &run->procs[r];
                int c, pri;

                if (p->pid != pid || !p->running)
                    continue;
                p->running = 0;
                p->status = status;
                running--;
                /* Its last lines (and culprit report) before its exit. */
                drain_all(run, p);
                c = exit_code_of(status);
                if (c == 0 && !run->finished_at)
                    run->finished_at = mesh_now_s();
                /* the last member finished: a process started again
                 * that has not joined yet has no job left to join
                 * (late_stop stops it now, not LATE_S later) */
                if (c == 0 && run->elastic && !members_running(run))
                    run->over = 1;
                if (c == 0 || stopping)
                    continue;
                if (run->elastic && p->late)
                    continue; /* late_stop's, said then */
                if (run->elastic) {
                    /* the others form a new view without it */
                    if (WIFSIGNALED(status))
                        fprintf(stderr,
                                "meshrun: rank %d (%s) was killed by "
                                "signal %d; %d rank(s) go on (--elastic)\n",
                                r, p->host, WTERMSIG(status), running);
                    else
                        fprintf(stderr,
                                "meshrun: rank %d (%s) exited with code "
                                "%d; %d rank(s) go on (--elastic)\n",
                                r, p->host, c, running);
                    p->member = 0;
                    if (running > 0 && !members_running(run)) {
                        /* the job is gone (no quorum): a restarted
                         * process would start a new one from step 0 */
                        if ((run->restarts || run->max_peers) && !run->over)
                            fprintf(stderr,
                                    "meshrun: no member of the job's view "
                                    "runs any more; no restarts, and the "
                                    "rank(s) waiting to join are stopped\n");
                        run->over = 1;
                    } else if (running > 0) {
                        schedule_restart(run, p, c);
                    }
                    continue;
                }
                pri = WIFSIGNALED(status) ? 3 : c != 3 ? 2 : 1;
                if (pri > cand_pri) {
                    cand = r;
                    cand_pri = pri;
                }
                if (!settle_at)
                    settle_at = mesh_now_s() + SETTLE_S;
            }
        }
        if (cand >= 0 && !stopping &&
            (cand_pri >= 2 || mesh_now_s() >= settle_at || running == 0)) {
            int agreed = cand_pri == 1 ? agreed_culprit(run) : -1;

            if (agreed >= 0 && agreed != cand)
                code =
                    name_blamed(run, agreed,
                                exit_code_of(run->procs[cand].status), running);
            else
                code = name_culprit(run, cand, running);
            stopping = 1;
            signal_all(run, SIGTERM);
            /* A stopped rank (SIGSTOP) acts on it only once continued. */
            signal_all(run, SIGCONT);
            kill_at = mesh_now_s() + run->grace_s;
        }
        if (run->restarts || run->max_peers)
            running += restart_due(run, running, stopping);
        if (run->elastic && !stopping)
            late_stop(run);
        if (got_signal && !stopping) {
            int sig = got_signal;

            fprintf(stderr, "meshrun: got signal %d; stopping the job\n", sig);
            code = 128 + sig;
            stopping = 1;
            signal_all(run, sig == SIGINT ? SIGINT : SIGTERM);
            kill_at = mesh_now_s() + run->grace_s;
        }
        if (stopping && !killed && running > 0 && mesh_now_s() >= kill_at) {
            fprintf(stderr,
                    "meshrun: %d rank(s) still running after %.1f "
                    "s; sending SIGKILL\n",
                    running, run->grace_s);
            signal_all(run, SIGKILL);
            killed = 1;
        }
        for (int r = 0; r < run->np; r++) {
            for (int k = 0; k < 2; k++) {
                struct stream *s = &run->procs[r].s[k];

                if (s->fd < 0)
                    continue;
                pfds[n].fd = s->fd;
                pfds[n].events = POLLIN;
                owners[n] = s;
                procs_of[n] = &run->procs[r];
                n++;
                open_streams++;
            }
        }
        if (running == 0) {
            /* Output held open by a rank's own children ends the wait. */
            if (all_exited_at == 0)
                all_exited_at = mesh_now_s();
            if (!open_streams ||
                mesh_now_s() - all_exited_at > DRAIN_AFTER_EXIT_S)
                break;
        }
        pfds[n].fd = sig_pipe[0];
        pfds[n].events = POLLIN;
        if (poll(pfds, (nfds_t)n + 1, timeout) < 0 && errno != EINTR) {
            fprintf(stderr, "meshrun: poll: %s\n", strerror(errno));
            signal_all(run, SIGKILL);
            code = 1;
            stopping = 1;
        }
        for (int i = 0; i < n; i++)
            if (pfds[i].revents)
                drain(run, procs_of[i], owners[i]);
        if (pfds[n].revents) {
            char junk[64];

            while (read(sig_pipe[0], junk, sizeof(junk)) > 0) {
            }
        }
    }
    if (run->elastic && code == 0)
        code = elastic_code(run);
    /* Whatever path led here: 0 only when every rank exited 0. */
    for (int r = 0; r < run->np && code == 0 && !run->elastic; r++)
        if (!run->procs[r].running && run->procs[r].status != 0)
            code = name_culprit(run, r, 0);
    for (int r = 0; r < run->np; r++)
        for (int k = 0; k < 2; k++)
            if (run->procs[r].s[k].fd >= 0)
                close(run->procs[r].s[k].fd);
    free(pfds);
    free(owners);
    free(procs_of);
    return code;
}

static int make_secret(struct run *run)
{
    unsigned char raw[SECRET_BYTES], id[8];
    int i;

    if (RAND_bytes(raw, sizeof(raw)) != 1 || RAND_bytes(id, sizeof(id)) != 1)
        return mesh_err(-EIO, "RAND_bytes failed: no randomness for the "
                              "job secret");
    for (i = 0; i < SECRET_BYTES; i++)
        snprintf(run->secret + 2 * i, 3, "%02x", raw[i]);
    OPENSSL_cleanse(raw, sizeof(raw));
    snprintf(run->job_id, sizeof(run->job_id), "meshrun-");
    for (i = 0; i < (int)sizeof(id); i++)
        snprintf(run->job_id + 8 + 2 * i, 3, "%02x", id[i]);
    return 0;
}

static int parse_args(struct run *run, int argc, char **argv)
{
    int i;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (a[0] != '-')
            break;
        if (!strcmp(a, "--elastic")) {
            run->elastic = 1;
            continue;
        }
        if (!v)
            return mesh_err(-EINVAL, "%s needs a value", a);
        if (!strcmp(a, "-np") || !strcmp(a, "-n") || !strcmp(a, "--np")) {
            char *end;
            long n = strtol(v, &end, 10);

            if (*end || n < 1 || n > 65536)
                return mesh_err(-EINVAL, "%s '%s': expected a rank count", a,
                                v);
            run->np = (int)n;
        } else if (!strcmp(a, "--hostfile")) {
            run->hostfile = v;
        } else if (!strcmp(a, "-H") || !strcmp(a, "--hosts")) {
            run->hosts = v;
        } else if (!strcmp(a, "--launcher")) {
            if (!strcmp(v, "local"))
                run->launcher = LAUNCH_LOCAL;
            else if (!strcmp(v, "ssh"))
                run->launcher = LAUNCH_SSH;
            else if (!strcmp(v, "auto"))
                run->launcher = LAUNCH_AUTO;
            else
                return mesh_err(-EINVAL,
                                "--launcher '%s': expected local, "
                                "ssh or auto",
                                v);
        } else if (!strcmp(a, "--ssh")) {
            run->ssh = v;
        } else if (!strcmp(a, "--min-peers")) {
            char *end;
            long n = strtol(v, &end, 10);

            if (*end || n < 1 || n > 65536)
                return mesh_err(-EINVAL,
                                "--min-peers '%s': expected a rank "
                                "count",
                                v);
            run->min_peers = (int)n;
        } else if (!strcmp(a, "--max-peers")) {
            char *end;
            long n = strtol(v, &end, 10);

            if (*end || n < 1 || n > 65536)
                return mesh_err(-EINVAL,
                                "--max-peers '%s': expected a rank "
                                "count",
                                v);
            run->max_peers = (int)n;
        } else if (!strcmp(a, "--restarts")) {
            char *end;
            long n = strtol(v, &end, 10);

            if (*end || n < 0 || n > 1000)
                return mesh_err(-EINVAL,
                                "--restarts '%s': expected a count from 0 "
                                "to 1000",
                                v);
            run->restarts = (int)n;
        } else if (!strcmp(a, "--grace")) {
            char *end;

            run->grace_s = strtod(v, &end);
            if (*end || !(run->grace_s >= 0 && run->grace_s <= 3600))
                return mesh_err(-EINVAL,
                                "--grace '%s': expected seconds "
                                "from 0 to 3600",
                                v);
        } else {
            return mesh_err(-EINVAL,
                            "unknown option %s (see meshrun "
                            "--help)",
                            a);
        }
        i++;
    }
    if (i >= argc)
        return mesh_err(-EINVAL, "no program to run: meshrun [options] -- "
                                 "PROGRAM [ARGS...]");
    run->argv = argv + i;
    /* the program's own --elastic and --min-peers count too */
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--elastic"))
            run->elastic = 1;
        else if (!run->min_peers && !strncmp(argv[i], "--min-peers=", 12))
            run->min_peers = atoi(argv[i] + 12);
        else if (!run->min_peers && !strcmp(argv[i], "--min-peers") &&
                 i + 1 < argc)
            run->min_peers = atoi(argv[i + 1]);
    }
    if (run->min_peers < 1)
        run->min_peers = 1;
    if ((run->restarts || run->max_peers) && !run->elastic)
        return mesh_err(-EINVAL,
                        "%s needs --elastic (here or in the program's "
                        "arguments): without it a dead rank stops the job",
                        run->restarts ? "--restarts" : "--max-peers");
    if (run->max_peers && run->max_peers < run->min_peers)
        return mesh_err(-EINVAL, "--max-peers %d is below --min-peers %d",
                        run->max_peers, run->min_peers);
    return 0;
}

int main(int argc, char **argv)
{
    static char hostfile_abs[PATH_MAX];
    static char local_hosts[64];
    struct mesh_hostfile *hf = NULL;
    struct run run;
    int *first = NULL; /* each hostfile entry's first local rank */
    int rc, r, e, code = 1;

    memset(&run, 0, sizeof(run));
    run.grace_s = DEFAULT_GRACE_S;
    run.ssh = getenv("MESHTRAIN_SSH");
    if (!run.ssh || !*run.ssh)
        run.ssh = "ssh -o BatchMode=yes -x -T";
    rc = parse_args(&run, argc, argv);
    if (rc == 1)
        return 0;
    if (rc < 0)
        goto usage_error;
    if (run.hostfile && run.hosts) {
        rc = mesh_err(-EINVAL, "give either --hostfile or -H, not both");
        goto usage_error;
    }
    if (!run.hostfile && !run.hosts) {
        const char *f = getenv("MESHTRAIN_HOSTFILE");
        const char *h = getenv("MESHTRAIN_HOSTS");

        if (f && *f)
            run.hostfile = f;
        else if (h && *h)
            run.hosts = h;
    }
    if (!run.hostfile && !run.hosts) {
        if (!run.np) {
            rc = mesh_err(-EINVAL, "give -np N, a --hostfile or -H");
            goto usage_error;
        }
        snprintf(local_hosts, sizeof(local_hosts), "localhost:%d", run.np);
        run.hosts = local_hosts;
    }
    if (run.hostfile) {
        /* Ranks may run elsewhere: give them an absolute path. */
        if (!realpath(run.hostfile, hostfile_abs)) {
            rc = mesh_err_errno("hostfile %s", run.hostfile);
            goto usage_error;
        }
        rc = mesh_hostfile_parse_file(hostfile_abs, &hf);
        run.hostfile = hostfile_abs;
    } else {
        rc = mesh_hostfile_parse_hosts(run.hosts, &hf);
    }
    if (rc < 0)
        goto usage_error;
    r = mesh_hostfile_slots(hf);
    if (run.np && run.np != r) {
        rc = mesh_err(-EINVAL,
                      "-np %d but the hosts have %d slots: the world size is "
                      "the total slot count (drop -np or list %d slots)",
                      run.np, r, run.np);
        goto usage_error;
    }
    run.np = r;
    if (run.max_peers > run.np) {
        rc = mesh_err(-EINVAL,
                      "--max-peers %d but the hosts have %d slots (list the "
                      "spare slots in the hostfile)",
                      run.max_peers, run.np);
        goto usage_error;
    }
    /* at the end, fewer than --min-peers finished is a failure: refuse a
     * job that could never have as many, rather than after its run */
    if (run.elastic && run.min_peers > run.np) {
        rc = mesh_err(-EINVAL,
                      "--min-peers %d but the hosts have %d slots: the job "
                      "could never finish with that many",
                      run.min_peers, run.np);
        goto usage_error;
    }
    run.procs = calloc((size_t)run.np, sizeof(*run.procs));
    if (!run.procs) {
        rc = mesh_err(-ENOMEM, "out of memory for %d ranks", run.np);
        goto usage_error;
    }
    first = calloc((size_t)hf->n, sizeof(*first));
    if (!first) {
        rc = mesh_err(-ENOMEM, "out of memory for %d hosts", hf->n);
        goto usage_error;
    }
    rc = mesh_hostfile_local_ranks(hf, first);
    if (rc < 0)
        goto usage_error;
    r = 0;
    for (e = 0; e < hf->n; e++) {
        const struct mesh_hostfile_entry *en = &hf->entries[e];
        int earlier = first[e], remote;

        remote = run.launcher == LAUNCH_SSH ||
                 (run.launcher == LAUNCH_AUTO && !is_local_host(en->host));
        for (int j = 0; j < en->slots; j++, r++) {
            struct proc *p = &run.procs[r];

            p->rank = r;
            p->local_rank = earlier + j;
            p->host = en->host;
            p->remote = remote;
            p->blames = -1;
            p->s[0].fd = p->s[1].fd = -1;
        }
    }
    rc = make_secret(&run);
    if (rc < 0)
        goto usage_error;
    rc = setup_signals();
    if (rc < 0)
        goto usage_error;
    /* --max-peers: the slots after the first M are spares */
    run.first_np = run.max_peers ? run.max_peers : run.np;
    for (r = 0; r < run.first_np; r++) {
        rc = launch(&run, &run.procs[r]);
        if (rc < 0) {
            fprintf(stderr, "meshrun: cannot start rank %d on %s: %s\n", r,
                    run.procs[r].host, mesh_err_msg(rc));
            signal_all(&run, SIGTERM);
            break;
        }
    }
    code = supervise(&run);
    /* kept until now: --restarts hands it to every new process */
    OPENSSL_cleanse(run.secret, sizeof(run.secret));
    if (rc < 0 && code == 0)
        code = 1;
    free(first);
    free(run.procs);
    mesh_hostfile_free(hf);
    return code;

usage_error:
    fprintf(stderr, "meshrun: %s\n", mesh_err_msg(rc));
    free(first);
    free(run.procs);
    mesh_hostfile_free(hf);
    return 1;
}
