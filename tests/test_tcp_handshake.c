/*
 * tests/test_tcp_handshake.c: the TCP handshake's messages alone, without
 * a socket (transport/tcp/wire.c).
 *
 *   tests/test_tcp_handshake
 *
 * HELLO encode/decode round trips and every malformed field refused with
 * its message, the AUTH proof against known answers and against a wrong
 * role, secret or transcript, the CONFIG length bound and the
 * configuration diff; the random cases under several seeds.
 */
#include "config.h"

#include "tests/tap.h"
#include "transport/tcp/tcp.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

static uint64_t rng;

static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static void fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)next();
}

/* A valid HELLO from rank `rank` of 8 on stream 2 of job "job-x". */
static void hello_base(struct tcp_hello *h, uint32_t rank)
{
    memset(h, 0, sizeof(*h));
    h->magic = TCP_HS_MAGIC;
    h->version = TCP_PROTO_VERSION;
    h->size = 8;
    h->rank = rank;
    h->stream = 2;
    memcpy(h->job, "job-x", 5);
    fill(h->fp, TCP_FP_LEN);
    fill(h->nonce, TCP_NONCE_LEN);
}

/* Rank 3 of 8 accepting, 4 data streams, with a secret. */
static const struct tcp_hs_self acceptor = {
    .job_id = "job-x",
    .size = 8,
    .rank = 3,
    .streams = 4,
    .secure = 1,
};

/* h checked by self: refused with exactly want (NULL: accepted). */
static void check(const char *name, const struct tcp_hello *h,
                  const struct tcp_hs_self *self, const char *want,
                  int want_identified)
{
    char why[512] = "";
    int identified = -1;
    int rc = tcp_hello_check(h, self, &identified, why, sizeof(why));

    if (!want)
        ok(rc == 0 && identified == want_identified, "%s: accepted", name);
    else if (!ok(rc < 0 && !strcmp(why, want) && identified == want_identified,
                 "%s: refused, \"%s\"", name, want))
        diag("rc %d, identified %d, why \"%s\"", rc, identified, why);
}

/* One HELLO to check: hello_base(rank) with at most one field changed and
 * perhaps another job id, checked by one of test_hello_fields' selves (the
 * acceptor unless named). Fields left out are 0 or NULL. */
struct hello_case {
    const char *name;
    uint32_t rank;
    enum { SET_KEEP, SET_MAGIC, SET_VERSION, SET_SIZE, SET_STREAM } field;
    uint32_t value;
    int insecure;    /* the HELLO's */
    const char *job; /* copied with its NUL over the start of the job id */
    enum { ACCEPTOR, DIALER, INSECURE_SELF } self;
    const char *want; /* the refusal; NULL: accepted */
    int identified;
};

static const struct hello_case hello_cases[] = {
    {"a valid HELLO (acceptor)", 5, .identified = 1},
    {"a valid HELLO (dialer)", 5, .self = DIALER},
    {"bad magic", 5, SET_MAGIC, 0x47455420 /* "GET " */,
     .want = "not a meshtrain handshake (bad magic 0x47455420)"},
    {"protocol version", 5, SET_VERSION, TCP_PROTO_VERSION + 1,
     .want = "protocol version 2, expected 1"},
    {"wrong job id", 5, .job = "job-y",
     .want = "wrong job id 'job-y', expected 'job-x'"},
    {"longer job id", 5, .job = "job-x2",
     .want = "wrong job id 'job-x2', expected 'job-x'"},
    {"shorter job id", 5, .job = "job",
     .want = "wrong job id 'job', expected 'job-x'"},
    /* The expected message is split so as not to read as a trigraph. */
    {"job id with non-printables", 5, .job = "j\x01\xff",
     .want = "wrong job id 'j?"
             "?', expected 'job-x'"},
    {"world size", 5, SET_SIZE, 9,
     .want = "world size 9, expected 8 (the hostfiles differ: 9 slots "
             "there, 8 here)"},
    {"rank past the world", 8,
     .want = "unknown rank 8 (world of 8; only ranks above 3 dial this one)"},
    {"own rank", 3,
     .want = "unknown rank 3 (world of 8; only ranks above 3 dial this one)"},
    {"lower rank dialing", 1,
     .want = "unknown rank 1 (world of 8; only ranks above 3 dial this one)"},
    {"stream past S", 5, SET_STREAM, 5,
     .want = "unknown stream 5 (rank 5, 4 data streams)"},
    {"last data stream", 5, SET_STREAM, 4, .identified = 1},
    {"dialer: another rank answered", 6, .self = DIALER,
     .want = "the peer answered as rank 6 stream 2, expected rank 5 stream 2"},
    {"dialer: another stream answered", 5, SET_STREAM, 0, .self = DIALER,
     .want = "the peer answered as rank 5 stream 0, expected rank 5 stream 2"},
    {"insecure there (the rank is named)", 5, .insecure = 1,
     .want = "authentication differs: a secret here, insecure there",
     .identified = 1},
    {"insecure here", 5, .self = INSECURE_SELF,
     .want = "authentication differs: insecure here, a secret there",
     .identified = 1},
    {"insecure on both sides", 5, .insecure = 1, .self = INSECURE_SELF,
     .identified = 1},
};

static void test_hello_fields(void)
{
    struct tcp_hs_self selves[] = {acceptor, acceptor, acceptor};

    selves[DIALER].dialer = 1;
    selves[DIALER].peer = 5;
    selves[DIALER].stream = 2;
    selves[INSECURE_SELF].secure = 0;

    for (size_t i = 0; i < sizeof(hello_cases) / sizeof(hello_cases[0]); i++) {
        const struct hello_case *c = &hello_cases[i];
        struct tcp_hello h;
        uint32_t *fields[] = {
            [SET_MAGIC] = &h.magic,
            [SET_VERSION] = &h.version,
            [SET_SIZE] = &h.size,
            [SET_STREAM] = &h.stream,
        };

        hello_base(&h, c->rank);
        if (c->field != SET_KEEP)
            *fields[c->field] = c->value;
        h.insecure = c->insecure;
        if (c->job)
            memcpy(h.job, c->job, strlen(c->job) + 1);
        check(c->name, &h, &selves[c->self], c->want, c->identified);
    }
}

static void test_hello_roundtrip(int seed)
{
    uint8_t m[TCP_HELLO_LEN], m2[TCP_HELLO_LEN];
    struct tcp_hello h, d;
    int same = 1, bytes = 1;

    for (int i = 0; i < 200; i++) {
        hello_base(&h, next() % 8);
        h.version = next();
        h.size = next();
        h.stream = next();
        h.insecure = next() & 1;
        fill(h.job, MESH_JOB_MAX);
        tcp_hello_encode(&h, m);
        tcp_hello_decode(m, &d);
        same &= !memcmp(&h, &d, sizeof(h));
        /* and any HELLO whose flags hold only the insecure bit */
        fill(m, sizeof(m));
        m[20] &= TCP_HELLO_INSECURE;
        m[21] = m[22] = m[23] = 0;
        tcp_hello_decode(m, &d);
        tcp_hello_encode(&d, m2);
        /* (encode always writes the magic) */
        bytes &= !memcmp(m + 4, m2 + 4, sizeof(m) - 4);
    }
    ok(same, "seed %d: 200 HELLOs decode to what was encoded", seed);
    ok(bytes, "seed %d: 200 random HELLOs encode back to their bytes", seed);
}

static int hex_eq(const uint8_t *mac, const char *hex)
{
    char s[2 * TCP_MAC_LEN + 1];

    for (int i = 0; i < TCP_MAC_LEN; i++)
        snprintf(s + 2 * i, 3, "%02x", mac[i]);
    return !strcmp(s, hex);
}

static void test_auth_known(void)
{
    static const uint8_t key[] = "known-answer secret, 32 bytes..!";
    struct tcp_transcript tr;
    uint8_t mac[TCP_MAC_LEN], zero[TCP_MAC_LEN] = {0};

    for (int i = 0; i < TCP_NONCE_LEN; i++) {
        tr.nonce_d[i] = (uint8_t)i;
        tr.nonce_a[i] = (uint8_t)(0x80 + i);
    }
    for (int i = 0; i < TCP_FP_LEN; i++) {
        tr.fp_d[i] = (uint8_t)(0x40 + i);
        tr.fp_a[i] = (uint8_t)(0xc0 + i);
    }
    tr.rank_d = 3;
    tr.rank_a = 1;
    tr.stream = 2;
    /* Python: hmac.new(key, b"meshtrain-auth1\0" + role + nd + na +
     * struct.pack('<III', 3, 1, 2) + fd + fa, hashlib.sha256) */
    ok(tcp_auth_mac(key, 32, &tr, 'D', mac) == 0 &&
           hex_eq(mac, "5b221940ffc6bcdc427558ae1a2a8bd0"
                       "056a91e6245c9618047999004ab66a73"),
       "AUTH: the dialer's proof of a known transcript");
    ok(tcp_auth_mac(key, 32, &tr, 'A', mac) == 0 &&
           hex_eq(mac, "32c833cdf446dfbb95f3ed0aad9090ed"
                       "f4212e0f7775abc03e5293b79fe03daf"),
       "AUTH: the acceptor's proof of a known transcript");
    ok(tcp_auth_mac(NULL, 0, &tr, 'D', mac) == 0 &&
           !memcmp(mac, zero, sizeof(mac)) &&
           tcp_auth_verify(NULL, 0, &tr, 'A', key) == 0,
       "AUTH: insecure proofs are zero and not checked");
}

static void test_auth_random(int seed)
{
    uint8_t key[32], other[32], d[TCP_MAC_LEN], a[TCP_MAC_LEN];
    int good = 1, role = 1, secret = 1, field = 1;

    for (int i = 0; i < 100; i++) {
        struct tcp_transcript tr, bad;
        size_t at;

        fill(key, sizeof(key));
        /* (HMAC pads a short key with zeros: a key ending in 0 and the
         * same key without it are one key) */
        key[sizeof(key) - 1] |= 1;
        memcpy(other, key, sizeof(other));
        other[next() % sizeof(other)] ^= (uint8_t)(1u << (next() % 8));
        fill((uint8_t *)&tr, sizeof(tr));
        tcp_auth_mac(key, sizeof(key), &tr, 'D', d);
        tcp_auth_mac(key, sizeof(key), &tr, 'A', a);
        good &= tcp_auth_verify(key, sizeof(key), &tr, 'D', d) == 0 &&
                tcp_auth_verify(key, sizeof(key), &tr, 'A', a) == 0;
        /* a reflected proof: the peer's own sent back */
        role &= tcp_auth_verify(key, sizeof(key), &tr, 'A', d) == -EACCES &&
                tcp_auth_verify(key, sizeof(key), &tr, 'D', a) == -EACCES;
        secret &=
            tcp_auth_verify(other, sizeof(other), &tr, 'D', d) == -EACCES &&
            tcp_auth_verify(key, sizeof(key) - 1, &tr, 'D', d) == -EACCES;
        /* any one bit of the transcript: a replay from another handshake */
        bad = tr;
        at = next() % sizeof(bad);
        ((uint8_t *)&bad)[at] ^= (uint8_t)(1u << (next() % 8));
        field &= tcp_auth_verify(key, sizeof(key), &bad, 'D', d) == -EACCES;
    }
    ok(good, "seed %d: 100 transcripts: each side's proof verifies", seed);
    ok(role, "seed %d: a proof for the other role is refused", seed);
    ok(secret, "seed %d: a proof under another secret is refused", seed);
    ok(field, "seed %d: a proof of another transcript (one bit) is refused",
       seed);
}

static void test_config(void)
{
    const char *a = "model=resnet18\nlr=0.1\nbatch=32\n";
    const char *b = "model=resnet18\nlr=0.2\nbatch=32\n";
    const char *c = "model=resnet18\nbatch=32\nseed=7\n";
    char out[600], why[200];

    tcp_config_diff(a, strlen(a), b, strlen(b), out, sizeof(out));
    ok(!strcmp(out, "lr=0.1 here, lr=0.2 there"),
       "CONFIG: a value differs "
       "(%s)",
       out);
    tcp_config_diff(a, strlen(a), c, strlen(c), out, sizeof(out));
    ok(!strcmp(out, "lr=0.1 here, lr unset there"),
       "CONFIG: a key missing there (%s)", out);
    tcp_config_diff(c, strlen(c), a, strlen(a), out, sizeof(out));
    ok(!strcmp(out, "seed=7 here, seed unset there"),
       "CONFIG: a key missing here, found from our side (%s)", out);
    tcp_config_diff("layout=ab\n", 10, "layout=cd\n", 10, out, sizeof(out));
    ok(!strcmp(out, "layout=ab here, layout=cd there (the hostfiles list "
                    "other hosts or ports for the slots)"),
       "CONFIG: a layout that differs says what it digests (%s)", out);
    tcp_config_diff(a, strlen(a), a, strlen(a), out, sizeof(out));
    ok(!strcmp(out, "the fingerprints differ but no key does"),
       "CONFIG: no key differs (%s)", out);
    tcp_config_diff("k=a\x01\n", 5, "k=b\n", 4, out, sizeof(out));
    ok(!strcmp(out, "k=a? here, k=b there"),
       "CONFIG: non-printables in a peer's text are replaced (%s)", out);
    /* --elastic views: the later one waits, the earlier one fails */
    ok(tcp_config_view_order("a=1\nview=12:0,1\n", 16, "a=1\nview=9:0,1\n",
                             15) == 1 &&
           tcp_config_view_order("view=9:0,1,2\n", 13, "view=12:0,1\n", 12) ==
               -1,
       "CONFIG: views order by their number, not as text");
    ok(tcp_config_view_order("view=3:0,1\n", 11, "view=3:0,2\n", 11) == 0 &&
           tcp_config_view_order(a, strlen(a), "view=3:0\n", 9) == 0 &&
           tcp_config_view_order("view=x\n", 7, "view=3:0\n", 9) == 0,
       "CONFIG: no order within a view, without one, or without a number");
    ok(tcp_config_len_check(TCP_CONFIG_WIRE_MAX, why, sizeof(why)) == 0,
       "CONFIG: %d bytes are allowed", TCP_CONFIG_WIRE_MAX);
    ok(tcp_config_len_check(TCP_CONFIG_WIRE_MAX + 1, why, sizeof(why)) ==
               -EMSGSIZE &&
           !strcmp(why, "configuration of 2113 bytes (at most 2112)"),
       "CONFIG: one byte more is refused (%s)", why);
}

/* Another world size fails the dialer's join at once: only for a HELLO of
 * this job and protocol (tcp_hello_world_differs). */
static void test_hello_world(void)
{
    struct tcp_hello h;
    struct tcp_hs_self dialer = acceptor;

    dialer.dialer = 1;
    dialer.peer = 5;
    dialer.stream = 2;
    hello_base(&h, 5);
    ok(!tcp_hello_world_differs(&h, &acceptor) &&
           !tcp_hello_world_differs(&h, &dialer),
       "world size: the same world does not differ");
    h.size = 3; /* a smaller hostfile, and a rank past it */
    ok(tcp_hello_world_differs(&h, &acceptor) &&
           tcp_hello_world_differs(&h, &dialer),
       "world size: 3 slots there, 8 here differ, on either side");
    memcpy(h.job, "job-y", 6);
    ok(!tcp_hello_world_differs(&h, &acceptor),
       "world size: another job's HELLO does not count");
    hello_base(&h, 5);
    h.size = 9;
    h.version = TCP_PROTO_VERSION + 1;
    ok(!tcp_hello_world_differs(&h, &acceptor),
       "world size: another protocol's HELLO does not count");
    hello_base(&h, 5);
    h.size = 9;
    h.magic = 0;
    ok(!tcp_hello_world_differs(&h, &acceptor),
       "world size: a HELLO with a bad magic does not count");
}

/* An ABORT's code: the five failures as sent, anything else (a hostile
 * 2^31 too, whose negation as an int overflowed) -ECONNABORTED. */
static void test_ctrl_code(void)
{
    static const struct {
        uint32_t wire;
        int want;
    } cases[] = {
        {ECONNRESET, -ECONNRESET},
        {EHOSTDOWN, -EHOSTDOWN},
        {EPROTO, -EPROTO},
        {ECANCELED, -ECANCELED},
        {ESHUTDOWN, -ESHUTDOWN},
        {0, -ECONNABORTED},
        {EPERM, -ECONNABORTED},
        {UINT32_C(0x7fffffff), -ECONNABORTED},
        {UINT32_C(0x80000000), -ECONNABORTED},
        {UINT32_C(0xffffffff), -ECONNABORTED},
    };
    int good = 1;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (tcp_ctrl_code(cases[i].wire) != cases[i].want) {
            diag("code %#x: %d, expected %d", (unsigned)cases[i].wire,
                 tcp_ctrl_code(cases[i].wire), cases[i].want);
            good = 0;
        }
    ok(good, "an ABORT's code: 5 failures as sent, 0, EPERM, 2^31 - 1, "
             "2^31 and 2^32 - 1 as -ECONNABORTED");
}

int main(void)
{
    static const int seeds[] = {1, 2, 7, 42, 20240601};

    rng = 1;
    test_hello_fields();
    test_hello_world();
    test_auth_known();
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        rng = 0x9e3779b97f4a7c15ull * (uint64_t)(seeds[i] + 1);
        test_hello_roundtrip(seeds[i]);
        test_auth_random(seeds[i]);
    }
    test_config();
    test_ctrl_code();
    return done();
}
