/*
 * tests/fuzz_handshake.c: hostile handshake messages of the tcp transport
 * (transport/tcp/wire.c), as a peer that has not authenticated yet sends
 * them. Byte 0 picks the message:
 *   0: a HELLO (from byte 2, zero-padded or cut to TCP_HELLO_LEN), checked
 *      as the acceptor of rank 1 in a world of 4 with 2 streams (byte 1
 *      bit 0 set: as the dialer of rank 3, stream 2) does; a refusal's
 *      words name the field (magic, version, job id, world size, rank,
 *      stream, authentication).
 *   1: two CONFIGs (split at byte 1's value): tcp_config_diff must say
 *      which key differs (or that none does), terminated in its buffer,
 *      and tcp_config_view_order must
 *      answer -1, 0 or 1 either way round, opposite.
 *   2: a CONFIG's length (bytes 1-4): refused past TCP_CONFIG_WIRE_MAX.
 *   3: an AUTH proof (32 bytes) against a transcript: refused.
 */
#include "config.h"

#include "tests/fuzz.h"
#include "transport/tcp/tcp.h"
#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <string.h>

const char fuzz_name[] = "handshake";

static void hello(const uint8_t *data, size_t len)
{
    uint8_t m[TCP_HELLO_LEN] = {0};
    struct tcp_hello h;
    struct tcp_hs_self self = {
        .job_id = "fuzzjob", .size = 4, .rank = 1, .streams = 2, .secure = 1};
    char why[256] = "";
    int id = -1, rc;

    if (len > 1 && (data[1] & 1)) {
        self.rank = 3;
        self.dialer = 1;
        self.peer = 2;
        self.stream = 2;
    }
    if (len > 2)
        memcpy(m, data + 2, MESH_MIN(len - 2, sizeof(m)));
    tcp_hello_decode(m, &h);
    rc = tcp_hello_check(&h, &self, &id, why, sizeof(why));
    if (id != 0 && id != 1)
        fuzz_fail("identified is %d", id);
    if (rc < 0 && !why[0])
        fuzz_fail("a HELLO refused without words");
    if (rc == 0 &&
        (h.size != 4 || (!self.dialer && (h.rank <= 1 || h.rank > 3))))
        fuzz_fail("a HELLO of size %u rank %u accepted", h.size, h.rank);
    if (tcp_hello_world_differs(&h, &self) && (rc == 0 || h.size == 4))
        fuzz_fail("world_differs for an accepted HELLO");
    if (rc < 0)
        rc = mesh_err(rc, "HELLO refused: %s", why);
    fuzz_answer(rc, NULL, 0);
}

static void config(const uint8_t *data, size_t len)
{
    size_t cut = len > 1 ? MESH_MIN((size_t)data[1], len - 2) : 0;
    const char *a = len > 2 ? (const char *)data + 2 : "";
    const char *b = a + cut;
    size_t alen = cut, blen = len > 2 ? len - 2 - cut : 0;
    char out[300];
    int ab, ba;

    memset(out, 0x55, sizeof(out));
    out[0] = '\0';
    tcp_config_diff(a, alen, b, blen, out, sizeof(out));
    if (!memchr(out, '\0', sizeof(out)))
        fuzz_fail("config_diff left its buffer unterminated");
    ab = tcp_config_view_order(a, alen, b, blen);
    ba = tcp_config_view_order(b, blen, a, alen);
    if (ab < -1 || ab > 1 || ab != -ba)
        fuzz_fail("view order %d one way, %d the other", ab, ba);
    if (!out[0])
        fuzz_fail("config_diff said nothing");
    fuzz_answer(mesh_err(-EPERM, "configurations differ: %s", out), NULL, 0);
}

static void config_len(const uint8_t *data, size_t len)
{
    uint8_t b[4] = {0};
    char why[256] = "";
    uint32_t n;
    int rc;

    memcpy(b, data + 1, MESH_MIN(len - 1, sizeof(b)));
    n = mesh_get_le32(b);
    rc = tcp_config_len_check(n, why, sizeof(why));
    if ((rc < 0) != (n > TCP_CONFIG_WIRE_MAX))
        fuzz_fail("CONFIG length %u: %d", n, rc);
    if (rc < 0)
        rc = mesh_err(rc, "CONFIG refused: %s", why);
    fuzz_answer(rc, NULL, 0);
}

static void auth(const uint8_t *data, size_t len)
{
    static const uint8_t secret[] = "fuzz secret";
    struct tcp_transcript tr;
    uint8_t got[TCP_MAC_LEN] = {0}, want[TCP_MAC_LEN];
    int rc;

    memset(&tr, 7, sizeof(tr));
    memcpy(got, data + 1, MESH_MIN(len - 1, sizeof(got)));
    if (tcp_auth_mac(secret, sizeof(secret), &tr, 'D', want) < 0)
        fuzz_fail("HMAC failed");
    rc = tcp_auth_verify(secret, sizeof(secret), &tr, 'D', got);
    if ((rc == 0) != !memcmp(got, want, sizeof(got)))
        fuzz_fail("AUTH verify said %d", rc);
    if (rc < 0)
        rc = mesh_err(rc, "AUTH refused: wrong secret");
    fuzz_answer(rc, NULL, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    mesh_err_clear();
    if (!len) {
        fuzz_answer(0, NULL, 0);
        return 0;
    }
    switch (data[0] & 3) {
    case 0:
        hello(data, len);
        break;
    case 1:
        config(data, len);
        break;
    case 2:
        config_len(data, len);
        break;
    default:
        auth(data, len);
        break;
    }
    return 0;
}
