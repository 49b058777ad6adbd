/*
 * tests/test_hostfile.c: hostfile and -H parsing (valid and malformed, with
 * the exact error positions), rank layout (ports, port range, duplicates),
 * the rank and size from each environment variable, the mesh flags, and
 * --bind-to (the plan, and a real binding in a child process).
 */
#include "config.h"

#include "mesh/hostfile.h"
#include "mesh/mesh.h"
#include "common/util.h"
#include "tests/tap.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *rank_vars[] = {"MESHTRAIN_RANK", "SLURM_PROCID",
                                  "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
static const char *size_vars[] = {"MESHTRAIN_SIZE", "SLURM_NTASKS",
                                  "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};

static void clear_env(void)
{
    static const char *others[] = {"MESHTRAIN_HOSTFILE",
                                   "MESHTRAIN_HOSTS",
                                   "MESHTRAIN_PORT",
                                   "MESHTRAIN_PORT_RANGE",
                                   "MESHTRAIN_STREAMS",
                                   "MESHTRAIN_TCP_CONGESTION",
                                   "MESHTRAIN_SECRET_FILE",
                                   "MESHTRAIN_SECRET_FD",
                                   "MESHTRAIN_INSECURE",
                                   "MESHTRAIN_JOB_ID",
                                   "MESHTRAIN_JOIN_TIMEOUT",
                                   "MESHTRAIN_PEER_TIMEOUT",
                                   "MESHTRAIN_TRANSPORT",
                                   "MESHTRAIN_BIND_TO",
                                   "SLURM_JOB_ID"};

    for (size_t i = 0; i < 4; i++) {
        unsetenv(rank_vars[i]);
        unsetenv(size_vars[i]);
    }
    for (size_t i = 0; i < MESH_ARRAY_SIZE(others); i++)
        unsetenv(others[i]);
}

/* text with newlines and control bytes escaped, for test names. */
static const char *esc(const char *text)
{
    static char buf[512];
    size_t n = 0;

    for (; *text && n + 5 < sizeof(buf); text++) {
        if (*text == '\n')
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, "\\n");
        else if ((unsigned char)*text < ' ')
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, "\\x%02x",
                                  (unsigned char)*text);
        else
            buf[n++] = *text;
    }
    buf[n] = '\0';
    return buf;
}

/* Parse text that must fail with exactly message want. */
static void bad(const char *text, const char *want)
{
    struct mesh_hostfile *hf = NULL;
    int rc = mesh_hostfile_parse_text("hf", text, &hf);

    ok(rc == -EINVAL && hf == NULL && !strcmp(mesh_err_msg(rc), want),
       "rejects %s: %s", esc(text), rc < 0 ? mesh_err_msg(rc) : "(accepted)");
    mesh_hostfile_free(hf);
}

static void bad_hosts(const char *text, const char *want)
{
    struct mesh_hostfile *hf = NULL;
    int rc = mesh_hostfile_parse_hosts(text, &hf);

    ok(rc == -EINVAL && !strcmp(mesh_err_msg(rc), want), "rejects -H %s: %s",
       text, rc < 0 ? mesh_err_msg(rc) : "(accepted)");
    mesh_hostfile_free(hf);
}

/* Layout must fail with a message containing want. */
static void bad_layout(const char *text, int lo, int hi, const char *want)
{
    struct mesh_hostfile *hf = NULL;
    struct mesh_peer *peers = NULL;
    int n = 0, rc;

    rc = mesh_hostfile_parse_text("hf", text, &hf);
    if (rc == 0)
        rc = mesh_hostfile_layout(hf, MESH_PORT_DEFAULT, lo, hi, &peers, &n);
    ok(rc == -EINVAL && peers == NULL && strstr(mesh_err_msg(rc), want),
       "layout of '%s' fails: %s", esc(text),
       rc < 0 ? mesh_err_msg(rc) : "(accepted)");
    mesh_hostfile_free(hf);
    free(peers);
}

static void test_openmpi(void)
{
    const char *text = "# cluster\n"
                       "\n"
                       "node1 slots=2\n"
                       "  node2 slots=1 port=30000   # its own port\n"
                       "10.0.0.3\n"
                       "node1 max_slots=4 slots=2 port=29500\n";
    struct mesh_hostfile *hf = NULL;
    struct mesh_peer *p = NULL;
    int n = 0, rc;

    rc = mesh_hostfile_parse_text("hf", text, &hf);
    ok(rc == 0 && hf->n == 4, "Open MPI syntax parses: %s",
       rc ? mesh_err_msg(rc) : "4 entries");
    if (rc)
        return;
    ok(hf->entries[1].line == 4 && hf->entries[1].column == 3 &&
           hf->entries[1].port == 30000 && hf->entries[2].slots == 1,
       "entries keep line, column, port and default slots");
    ok(mesh_hostfile_slots(hf) == 6, "6 slots");
    rc = mesh_hostfile_layout(hf, MESH_PORT_DEFAULT, 0, 0, &p, &n);
    ok(rc == 0 && n == 6, "layout of 6 ranks");
    if (rc == 0) {
        ok(!strcmp(p[0].host, "node1") && p[0].port == 29400 &&
               p[1].port == 29401 && p[1].local_rank == 1,
           "node1 slots on base port + index");
        ok(!strcmp(p[2].host, "node2") && p[2].port == 30000 &&
               p[2].local_rank == 0,
           "port= sets the host's base port");
        ok(!strcmp(p[3].host, "10.0.0.3") && p[3].port == 29400,
           "IPv4 address, one slot");
        ok(p[4].port == 29500 && p[5].port == 29501 && p[4].local_rank == 2 &&
               p[5].local_rank == 3,
           "a host on two lines keeps counting local ranks");
    }
    free(p);
    mesh_hostfile_free(hf);
}

static void test_horovod_and_ipv6(void)
{
    struct mesh_hostfile *hf = NULL;
    struct mesh_peer *p = NULL;
    struct mesh_world w;
    char name[300];
    int n = 0, rc;

    rc = mesh_hostfile_parse_text("hf", "a:2\nb:3 # five\n", &hf);
    ok(rc == 0 && hf->n == 2 && mesh_hostfile_slots(hf) == 5,
       "Horovod host:N lines");
    mesh_hostfile_free(hf);
    hf = NULL;

    rc = mesh_hostfile_parse_text(
        "hf", "[fe80::1%eth0] slots=2 port=40000\n[::1]:1\n", &hf);
    ok(rc == 0 && hf->n == 2 && !strcmp(hf->entries[0].host, "fe80::1%eth0"),
       "bracketed IPv6 with zone, brackets removed: %s",
       rc ? mesh_err_msg(rc) : hf->entries[0].host);
    if (rc == 0 &&
        mesh_hostfile_layout(hf, MESH_PORT_DEFAULT, 0, 0, &p, &n) == 0) {
        w.rank = 0;
        w.size = n;
        w.peers = p;
        ok(p[1].port == 40001 && !strcmp(p[2].host, "::1") &&
               !strcmp(mesh_peer_name(&w, 2, name, sizeof(name)),
                       "[::1]:29400"),
           "IPv6 peer name %s", name);
    } else {
        ok(0, "IPv6 layout: %s", mesh_err_msg(rc));
    }
    free(p);
    p = NULL;
    mesh_hostfile_free(hf);
    hf = NULL;

    rc = mesh_hostfile_parse_hosts("h1:2, h2:2,[::1]:3,solo", &hf);
    ok(rc == 0 && hf->n == 4 && mesh_hostfile_slots(hf) == 8 &&
           !strcmp(hf->entries[1].host, "h2") &&
           !strcmp(hf->entries[2].host, "::1") && hf->entries[3].slots == 1,
       "-H string form: %s", rc ? mesh_err_msg(rc) : "8 slots");
    mesh_hostfile_free(hf);
}

static void test_malformed(void)
{
    bad("node1 slots=x\n", "hf:1:13: expected a slot count, found 'x'");
    bad("a:2\nb slots=2 bogus=1\n",
        "hf:2:11: expected slots=N, max_slots=N, port=P, '#' or end of "
        "line, found 'b'");
    bad("fe80::1 slots=2\n",
        "hf:1:1: expected an IPv6 address in brackets (like [::1]:2), found "
        "an unbracketed one");
    bad("ok\n[::1 slots=2\n",
        "hf:2:5: expected ']' closing the IPv6 address, found ' '");
    bad("[zz::1]:2\n",
        "hf:1:2: expected an IPv6 address inside [ ], found 'zz::1'");
    bad("a:0\n", "hf:1:3: expected a slot count after ':' between 1 and "
                 "4096");
    bad("a port=70000\n", "hf:1:8: expected a port number between 1 and 65535");
    bad("a:2x\n", "hf:1:4: expected whitespace, '#' or end of line, found "
                  "'x'");
    bad("a@b\n", "hf:1:2: expected ':', whitespace, '#' or end of line, "
                 "found '@'");
    bad("a slots=2 slots=3\n", "hf:1:11: slots given twice");
    bad("a max_slots=1 slots=2\n", "hf:1:1: max_slots=1 is less than slots=2");
    bad("a slots=\n", "hf:1:9: expected a slot count, found end of line");
    bad("a:\n", "hf:1:3: expected a slot count after ':', found end of line");
    bad("# only comments\n\n", "hf: no hosts listed");
    bad("a\n\tb:\x01\n",
        "hf:2:4: expected a slot count after ':', found byte 0x01");
    bad_hosts("h1:2,,h2", "-H:1:6: expected a host name or address, found "
                          "','");
    bad_hosts("h1:2 x", "-H:1:6: expected ':' and a slot count, ',' or end "
                        "of list, found 'x'");
    bad_hosts("h1:", "-H:1:4: expected a slot count after ':', found end of "
                     "list");
}

static void test_layout_errors(void)
{
    bad_layout("a slots=2\nb\na slots=1\n", 0, 0,
               "hf:3:1: duplicate host:port a:29400 (rank 3) already used "
               "by rank 0 from line 1");
    bad_layout("a:2 port=29399\na:1\n", 0, 0, "duplicate host:port a:29400");
    bad_layout("a:3\n", 29400, 29401,
               "slot 2 of a (rank 2) needs port 29402, outside --port-range "
               "29400-29401");
    bad_layout("a:2 port=65535\n", 0, 0, "needs port 65536, beyond 65535");
    {
        struct mesh_hostfile *hf = NULL;
        struct mesh_peer *p = NULL;
        int n = 0, rc;

        rc = mesh_hostfile_parse_text("hf", "a:2\nb:2\n", &hf);
        if (rc == 0)
            rc = mesh_hostfile_layout(hf, 29400, 29400, 29401, &p, &n);
        ok(rc == 0 && n == 4 && p[3].port == 29401,
           "every port inside --port-range 29400-29401");
        free(p);
        mesh_hostfile_free(hf);
    }
}

/* text of n lines "PREFIX<i> slots=S" (a malloc'ed string). */
static char *many_lines(int n, const char *prefix, int slots)
{
    size_t cap = (size_t)n * 48 + 1, at = 0;
    char *t = malloc(cap);
    int i;

    for (i = 0; t && i < n; i++)
        at += (size_t)snprintf(t + at, cap - at, "%s%d slots=%d\n", prefix, i,
                               slots);
    return t;
}

/* Large worlds: a cap that names the line, and a layout in linear time. */
static void test_large(void)
{
    struct mesh_hostfile *hf = NULL;
    struct mesh_peer *p = NULL;
    char *text;
    clock_t t0;
    double cpu;
    int n = 0, rc;

    /* 4,000 lines of slots=4096: the 17th line crosses 65,536 ranks. */
    text = many_lines(4000, "h", 4096);
    t0 = clock();
    rc = text ? mesh_hostfile_parse_text("hf", text, &hf) : -ENOMEM;
    if (rc == 0)
        rc = mesh_hostfile_layout(hf, 29400, 0, 0, &p, &n);
    cpu = (double)(clock() - t0) / CLOCKS_PER_SEC;
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "hf:17:1:") &&
           strstr(mesh_err_msg(rc), "65536"),
       "4000 lines x slots=4096: refused at line 17 in %.2f s: %s", cpu,
       rc ? mesh_err_msg(rc) : "accepted");
    free(p);
    p = NULL;
    mesh_hostfile_free(hf);
    hf = NULL;
    free(text);

    /* The largest world allowed, one slot per host: O(N) to lay out (the
     * quadratic scans took tens of seconds; the bound is generous). */
    text = many_lines(MESH_WORLD_MAX, "node-", 1);
    t0 = clock();
    rc = text ? mesh_hostfile_parse_text("hf", text, &hf) : -ENOMEM;
    if (rc == 0)
        rc = mesh_hostfile_layout(hf, 29400, 0, 0, &p, &n);
    cpu = (double)(clock() - t0) / CLOCKS_PER_SEC;
    ok(rc == 0 && n == MESH_WORLD_MAX && cpu < 5.0 &&
           p[n - 1].local_rank == 0 && !strcmp(p[n - 1].host, "node-65535"),
       "%d hosts of one slot laid out in %.2f s of CPU (< 5 s): %s",
       MESH_WORLD_MAX, cpu, rc ? mesh_err_msg(rc) : "ok");
    free(p);
    p = NULL;
    mesh_hostfile_free(hf);
    hf = NULL;
    free(text);

    /* One host on many lines keeps counting local ranks; duplicates are
     * still found, naming the first line. */
    rc = mesh_hostfile_parse_text("hf", "a:3\nb:1\na:2 port=30000\n", &hf);
    if (rc == 0)
        rc = mesh_hostfile_layout(hf, 29400, 0, 0, &p, &n);
    ok(rc == 0 && n == 6 && p[4].local_rank == 3 && p[5].local_rank == 4 &&
           p[3].local_rank == 0,
       "a host's local ranks continue across lines");
    free(p);
    mesh_hostfile_free(hf);
}

static void test_file(void)
{
    char path[] = "/tmp/meshtrain-hf-XXXXXX";
    struct mesh_hostfile *hf = NULL;
    int fd = mkstemp(path), rc;
    const char *text = "localhost slots=2\n127.0.0.1:1\n";

    ok(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text),
       "temporary hostfile written");
    close(fd);
    rc = mesh_hostfile_parse_file(path, &hf);
    ok(rc == 0 && mesh_hostfile_slots(hf) == 3, "file parsed: 3 slots");
    mesh_hostfile_free(hf);
    unlink(path);
    rc = mesh_hostfile_parse_file(path, &hf);
    ok(rc == -ENOENT && strstr(mesh_err_msg(rc), path),
       "missing file named: %s", mesh_err_msg(rc));
}

static void test_env(void)
{
    const char *var = NULL;
    int v = -1, rc, i;

    clear_env();
    ok(mesh_env_rank(&v, &var) == 0, "no rank variable set");
    /* Set them from the lowest priority up: each new one must win. */
    for (i = 3; i >= 0; i--) {
        char val[8];

        snprintf(val, sizeof(val), "%d", 10 + i);
        setenv(rank_vars[i], val, 1);
        rc = mesh_env_rank(&v, &var);
        ok(rc == 1 && v == 10 + i && !strcmp(var, rank_vars[i]),
           "rank %d from %s", v, var ? var : "?");
        snprintf(val, sizeof(val), "%d", 20 + i);
        setenv(size_vars[i], val, 1);
        rc = mesh_env_size(&v, &var);
        ok(rc == 1 && v == 20 + i && !strcmp(var, size_vars[i]),
           "size %d from %s", v, var ? var : "?");
    }
    setenv("MESHTRAIN_RANK", "two", 1);
    rc = mesh_env_rank(&v, &var);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "MESHTRAIN_RANK='two'"),
       "bad rank value: %s", mesh_err_msg(rc));
    setenv("MESHTRAIN_SIZE", "0", 1);
    rc = mesh_env_size(&v, &var);
    ok(rc == -EINVAL, "size 0 refused: %s", mesh_err_msg(rc));
    clear_env();
}

/* Run mesh_opts_parse_arg over args, then finish; returns finish's rc. */
static int opts_run(struct mesh_opts *o, int argc, char **argv)
{
    int i = 0, rc;

    mesh_opts_init(o);
    while (i < argc) {
        rc = mesh_opts_parse_arg(o, argc, argv, &i);
        if (rc <= 0)
            return rc < 0 ? rc
                          : mesh_err(-EINVAL, "not a mesh flag: %s", argv[i]);
    }
    return mesh_opts_finish(o);
}

static void test_opts(void)
{
    struct mesh_opts o;
    char secret[] = "/tmp/meshtrain-secret-XXXXXX";
    int fd, rc, i;

    clear_env();
    {
        char *argv[] = {
            "-H",        "localhost:4", "--rank=2",   "--port",         "31000",
            "--streams", "2",           "--insecure", "--join-timeout", "1.5"};

        rc = opts_run(&o, 10, argv);
        ok(rc == 0 && o.world.size == 4 && o.world.rank == 2 &&
               o.world.peers[2].port == 31002 && o.topts.streams == 2 &&
               o.topts.insecure && o.topts.join_timeout_s == 1.5 &&
               o.topts.peer_timeout_s == 10.0 &&
               !strcmp(o.topts.job_id, "meshtrain"),
           "flags: %s", rc ? mesh_err_msg(rc) : "world of 4, rank 2");
        mesh_opts_free(&o);
    }
    {
        char *argv[] = {"--port"};

        mesh_opts_init(&o);
        i = 0;
        rc = mesh_opts_parse_arg(&o, 1, argv, &i);
        ok(rc == -EINVAL && i == 0 &&
               !strcmp(mesh_err_msg(rc), "--port needs a value"),
           "missing value: %s", mesh_err_msg(rc));
    }
    {
        char *argv[] = {"--streams=99"};

        mesh_opts_init(&o);
        i = 0;
        rc = mesh_opts_parse_arg(&o, 1, argv, &i);
        ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "--streams '99'"),
           "bad value: %s", mesh_err_msg(rc));
    }
    /* --tcp-congestion: checked against the kernel before joining. */
    {
        char *argv[] = {"-H",         "localhost:2",      "--rank", "0",
                        "--insecure", "--tcp-congestion", "reno"};

        rc = opts_run(&o, 7, argv);
        ok(rc == 0 && !strcmp(o.topts.tcp_cc, "reno"),
           "--tcp-congestion reno (every kernel has it): %s",
           rc ? mesh_err_msg(rc) : o.topts.tcp_cc);
        mesh_opts_free(&o);
        rc = opts_run(&o, 5, argv);
        /* the mesh's cubic where this process may set it, else the host's
         * default (the empty name), quietly */
        ok(rc == 0 &&
               (mesh_tcp_cc_check("cubic") == 0
                    ? !strcmp(o.topts.tcp_cc, "cubic") && o.topts.tcp_cc_default
                    : !o.topts.tcp_cc[0]),
           "no --tcp-congestion: cubic where allowed, else the host's "
           "default (%s)",
           rc ? mesh_err_msg(rc) : o.topts.tcp_cc);
        mesh_err_clear();
        mesh_opts_free(&o);
        argv[6] = "host";
        rc = opts_run(&o, 7, argv);
        ok(rc == 0 && !o.topts.tcp_cc[0],
           "--tcp-congestion host: the host's default (%s)",
           rc ? mesh_err_msg(rc) : "empty name");
        mesh_opts_free(&o);
        argv[6] = "reno";
        setenv("MESHTRAIN_TCP_CONGESTION", "no_such_cc", 1);
        rc = opts_run(&o, 5, argv);
        ok(rc == -ENOENT &&
               strstr(mesh_err_msg(rc), "--tcp-congestion: TCP congestion "
                                        "control 'no_such_cc': this kernel "
                                        "has none") &&
               strstr(mesh_err_msg(rc), "available: ") &&
               strstr(mesh_err_msg(rc), "reno"),
           "MESHTRAIN_TCP_CONGESTION is checked, the choices listed: %s",
           mesh_err_msg(rc));
        rc = opts_run(&o, 7, argv);
        ok(rc == 0 && !strcmp(o.topts.tcp_cc, "reno"),
           "the flag wins over MESHTRAIN_TCP_CONGESTION: %s",
           rc ? mesh_err_msg(rc) : o.topts.tcp_cc);
        mesh_opts_free(&o);
        unsetenv("MESHTRAIN_TCP_CONGESTION");
        argv[6] = "reno;rm";
        rc = opts_run(&o, 7, argv);
        ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "'reno;rm': expected "
                                                     "a name of 1 to 15"),
           "a malformed name: %s", mesh_err_msg(rc));
        argv[6] = "a_name_of_16_chr";
        rc = opts_run(&o, 7, argv);
        ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "1 to 15"),
           "a name too long for the kernel: %s", mesh_err_msg(rc));
    }
    {
        char *argv[] = {"--model", "x"};

        mesh_opts_init(&o);
        i = 0;
        ok(mesh_opts_parse_arg(&o, 2, argv, &i) == 0 && i == 0,
           "a program's own flag is left alone");
    }
    /* Environment: used when flags are absent; flags win. */
    setenv("MESHTRAIN_HOSTS", "localhost:3", 1);
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_NTASKS", "3", 1);
    setenv("SLURM_JOB_ID", "777", 1);
    setenv("MESHTRAIN_PORT", "32000", 1);
    setenv("MESHTRAIN_INSECURE", "1", 1);
    {
        char *argv[] = {"--port", "33000"};

        rc = opts_run(&o, 2, argv);
        ok(rc == 0 && o.world.size == 3 && o.world.rank == 1 &&
               !strcmp(o.rank_source, "SLURM_PROCID") &&
               o.world.peers[0].port == 33000 &&
               !strcmp(o.topts.job_id, "slurm-777"),
           "environment fills the rest: %s",
           rc ? mesh_err_msg(rc) : "rank 1 of 3 from SLURM_PROCID");
        mesh_opts_free(&o);
    }
    setenv("SLURM_NTASKS", "4", 1);
    rc = opts_run(&o, 0, NULL);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "world size mismatch") &&
           strstr(mesh_err_msg(rc), "SLURM_NTASKS=4"),
       "size checked: %s", mesh_err_msg(rc));
    unsetenv("SLURM_NTASKS");
    setenv("SLURM_PROCID", "3", 1);
    rc = opts_run(&o, 0, NULL);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "rank 3 (from SLURM_PROCID) "
                                                 "is outside the world of 3"),
       "rank range checked: %s", mesh_err_msg(rc));
    unsetenv("SLURM_PROCID");
    rc = opts_run(&o, 0, NULL);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "no rank"),
       "rank required: %s", mesh_err_msg(rc));
    /* Secrets. */
    unsetenv("MESHTRAIN_INSECURE");
    setenv("MESHTRAIN_RANK", "0", 1);
    rc = opts_run(&o, 0, NULL);
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "no job secret") &&
           strstr(mesh_err_msg(rc), "--secret-file") &&
           strstr(mesh_err_msg(rc), "--insecure"),
       "no secret: says how to fix it");
    fd = mkstemp(secret);
    ok(fd >= 0 && write(fd, "0123456789abcdef0123\n", 21) == 21,
       "secret file written");
    close(fd);
    chmod(secret, 0644);
    {
        char *argv[] = {"--secret-file", secret};

        rc = opts_run(&o, 2, argv);
        ok(rc == -EPERM && strstr(mesh_err_msg(rc), secret) &&
               strstr(mesh_err_msg(rc), "0644"),
           "open secret file refused: %s", mesh_err_msg(rc));
        chmod(secret, 0600);
        rc = opts_run(&o, 2, argv);
        ok(rc == 0 && o.topts.secret_len == 20 && !o.topts.insecure &&
               !memcmp(o.topts.secret, "0123456789abcdef0123", 20),
           "0600 secret file read, newline trimmed: %s",
           rc ? mesh_err_msg(rc) : "20 bytes");
        mesh_opts_free(&o);
    }
    {
        int p[2];

        ok(pipe(p) == 0 && write(p[1], "pipe-secret-0123456789", 22) == 22,
           "secret pipe written");
        close(p[1]);
        {
            char fdv[16];

            snprintf(fdv, sizeof(fdv), "%d", p[0]);
            setenv("MESHTRAIN_SECRET_FD", fdv, 1);
        }
        rc = opts_run(&o, 0, NULL);
        ok(rc == 0 && o.topts.secret_len == 22 &&
               !getenv("MESHTRAIN_SECRET_FD") && fcntl(p[0], F_GETFD) < 0,
           "secret from MESHTRAIN_SECRET_FD, fd closed, variable unset: %s",
           rc ? mesh_err_msg(rc) : "ok");
        mesh_opts_free(&o);
    }
    {
        FILE *f = fopen(secret, "w");

        fputs("short\n", f);
        fclose(f);
        setenv("MESHTRAIN_SECRET_FILE", secret, 1);
        rc = opts_run(&o, 0, NULL);
        ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "at least 16"),
           "short secret refused: %s", mesh_err_msg(rc));
    }
    unlink(secret);
    clear_env();
}

/* mesh_bind_plan's CPUs for one case, as "0,1,2" ("" for none). */
static const char *plan_str(enum mesh_bind mode, const int *allowed,
                            int nallowed, int online, int lr, int n,
                            const char **why)
{
    static char buf[256];
    int out[64], k, got, at = 0;

    got = mesh_bind_plan(mode, allowed, nallowed, online, lr, n, out, why);
    buf[0] = 0;
    for (k = 0; k < got; k++)
        at += snprintf(buf + at, sizeof(buf) - (size_t)at, "%s%d", k ? "," : "",
                       out[k]);
    return buf;
}

static void test_bind(void)
{
    static const int eight[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int some[] = {2, 3, 6, 7};
    const char *why = "", *got;
    struct mesh_opts o;
    int rc, ok_all, lr;

    /* auto: one CPU share each when the host's ranks fit */
    ok(!strcmp(plan_str(MESH_BIND_AUTO, eight, 2, 2, 0, 2, &why), "0") &&
           !strcmp(plan_str(MESH_BIND_AUTO, eight, 2, 2, 1, 2, &why), "1"),
       "auto: 2 ranks on 2 CPUs get one each");
    ok(!strcmp(plan_str(MESH_BIND_AUTO, eight, 8, 8, 1, 2, &why), "4,5,6,7"),
       "auto: rank 1 of 2 on 8 CPUs gets 4-7");
    ok_all = 1;
    ok_all &= !strcmp(plan_str(MESH_BIND_AUTO, eight, 8, 8, 0, 3, &why), "0,1");
    ok_all &=
        !strcmp(plan_str(MESH_BIND_AUTO, eight, 8, 8, 1, 3, &why), "2,3,4");
    ok_all &=
        !strcmp(plan_str(MESH_BIND_AUTO, eight, 8, 8, 2, 3, &why), "5,6,7");
    ok(ok_all, "auto: 3 ranks on 8 CPUs: 0-1, 2-4, 5-7 (every CPU once)");
    got = plan_str(MESH_BIND_AUTO, eight, 8, 8, 0, 1, &why);
    ok(!*got && strstr(why, "only rank"),
       "auto: a lone rank is left alone "
       "(%s)",
       why);
    got = plan_str(MESH_BIND_AUTO, eight, 2, 2, 3, 4, &why);
    ok(!*got && strstr(why, "more ranks"),
       "auto: 4 ranks on 2 CPUs are left alone (%s)", why);
    got = plan_str(MESH_BIND_AUTO, some, 4, 8, 0, 2, &why);
    ok(!*got && strstr(why, "already bound"),
       "auto: a process already bound to 4 of 8 CPUs is left alone (%s)", why);
    got = plan_str(MESH_BIND_NONE, eight, 8, 8, 0, 2, &why);
    ok(!*got && strstr(why, "none"), "none: left alone");
    /* cores: always, within what the process may use */
    ok(!strcmp(plan_str(MESH_BIND_CORES, some, 4, 8, 1, 2, &why), "6,7"),
       "cores: shares of the allowed CPUs (rank 1 of 2 on 2,3,6,7: 6-7)");
    ok_all = 1;
    for (lr = 0; lr < 4; lr++) {
        char want[4];

        snprintf(want, sizeof(want), "%d", lr % 2);
        ok_all &=
            !strcmp(plan_str(MESH_BIND_CORES, eight, 2, 2, lr, 4, &why), want);
    }
    ok(ok_all, "cores: 4 ranks on 2 CPUs alternate 0,1,0,1");
    got = plan_str(MESH_BIND_CORES, eight, 8, 8, 0, 1, &why);
    ok(!strcmp(got, "0,1,2,3,4,5,6,7"), "cores: a lone rank gets them all");

    /* the flag and its variable */
    clear_env();
    {
        char *argv[] = {"-H", "localhost:2", "--rank",
                        "1",  "--insecure",  "--bind-to=cores"};

        rc = opts_run(&o, 6, argv);
        ok(rc == 0 && o.bind == MESH_BIND_CORES, "--bind-to=cores parsed");
        mesh_opts_free(&o);
    }
    {
        char *argv[] = {"-H", "localhost:2", "--rank", "1", "--insecure"};

        setenv("MESHTRAIN_BIND_TO", "none", 1);
        rc = opts_run(&o, 5, argv);
        ok(rc == 0 && o.bind == MESH_BIND_NONE, "MESHTRAIN_BIND_TO=none used");
        mesh_opts_free(&o);
        unsetenv("MESHTRAIN_BIND_TO");
        rc = opts_run(&o, 5, argv);
        ok(rc == 0 && o.bind == MESH_BIND_AUTO, "auto by default");
        mesh_opts_free(&o);
    }
    {
        char *argv[] = {"-H",         "localhost:2", "--rank", "1",
                        "--insecure", "--bind-to",   "socket"};

        rc = opts_run(&o, 7, argv);
        ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "--bind-to 'socket'") &&
               strstr(mesh_err_msg(rc), "auto, none or cores"),
           "bad --bind-to: %s", mesh_err_msg(rc));
        setenv("MESHTRAIN_BIND_TO", "x", 1);
        rc = opts_run(&o, 5, argv);
        ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "MESHTRAIN_BIND_TO 'x'"),
           "bad MESHTRAIN_BIND_TO: %s", mesh_err_msg(rc));
        unsetenv("MESHTRAIN_BIND_TO");
    }

    /* A real binding, in a child so that this process stays unbound: rank 1
     * of localhost:2 under cores gets the plan for its allowed CPUs. */
    {
        char *argv[] = {"-H",         "localhost:2", "--rank", "1",
                        "--insecure", "--bind-to",   "cores"};
        int allowed[CPU_SETSIZE], want[CPU_SETSIZE], nallowed = 0, nwant, k;
        int status = -1, ncpus = 0;
        cpu_set_t set;
        pid_t pid;

        CPU_ZERO(&set);
        rc = sched_getaffinity(0, sizeof(set), &set);
        for (k = 0; k < CPU_SETSIZE; k++)
            if (CPU_ISSET(k, &set))
                allowed[nallowed++] = k;
        nwant = mesh_bind_plan(MESH_BIND_CORES, allowed, nallowed, nallowed, 1,
                               2, want, &why);
        rc = opts_run(&o, 7, argv);
        pid = rc == 0 ? fork() : -1;
        if (pid == 0) {
            int bad = mesh_bind(&o, &ncpus) != 1 || ncpus != nwant;

            CPU_ZERO(&set);
            bad |= sched_getaffinity(0, sizeof(set), &set) < 0 ||
                   CPU_COUNT(&set) != nwant;
            for (k = 0; k < nwant; k++)
                bad |= !CPU_ISSET(want[k], &set);
            _exit(bad);
        }
        if (pid > 0)
            waitpid(pid, &status, 0);
        ok(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "mesh_bind: rank 1 of 2 runs on exactly the planned %d of %d "
           "CPU(s)",
           nwant, nallowed);
        mesh_opts_free(&o);
    }
    clear_env();
}

int main(void)
{
    plan(90);
    test_openmpi();
    test_horovod_and_ipv6();
    test_malformed();
    test_layout_errors();
    test_large();
    test_file();
    test_env();
    test_opts();
    test_bind();
    return done();
}
