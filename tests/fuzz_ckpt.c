/*
 * tests/fuzz_ckpt.c: hostile checkpoint directories (train/ckpt.c), as a
 * damaged disk or another writer leaves them for --resume. The input up
 * to its first NUL is a manifest's text, the rest blob "w"'s bytes, laid
 * out as step 5's checkpoint: DIR/ckpt-<5>/{MANIFEST,w}. Byte 0 even: the
 * manifest gets its final "sha256 <hex>" line computed here (so that the fuzzer
 * reaches the lines behind the checksum); odd: the text is the whole manifest.
 * Then mesh_ckpt_open: accepted, each listed blob reads back in full and
 * verifies; refused, the message names the checkpoint's path. The scan
 * of DIR (mesh_ckpt_scan) must agree: one checkpoint (opened, of step 5
 * as its folder's name says), or one damaged.
 */
#include "config.h"

#include "tests/fuzz.h"
#include "train/ckpt.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char fuzz_name[] = "ckpt";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    const uint8_t *nul = len ? memchr(data + 1, 0, len - 1) : NULL;
    size_t mlen = len ? (nul ? (size_t)(nul - data) : len) - 1 : 0;
    const char *blob = nul ? (const char *)nul + 1 : NULL;
    size_t blen = nul ? len - (size_t)(nul + 1 - data) : 0;
    char dir[4200], file[4300], *text;
    const char *base;
    struct mesh_ckpt *c = NULL;
    struct mesh_ckpt_entry *ents = NULL;
    struct mesh_ckpt_damage dmg;
    size_t tlen = mlen, nent = 0;
    uint64_t step = 0;
    int rc;

    fuzz_clean();
    text = malloc(mlen + 80);
    if (!text)
        return 0;
    if (mlen)
        memcpy(text, data + 1, mlen);
    if (len && !(data[0] & 1)) {
        uint8_t sum[MESH_CKPT_DIGEST_LEN];

        if (mesh_ckpt_sha256(text, mlen, sum) < 0)
            fuzz_fail("SHA-256 failed");
        tlen += (size_t)sprintf(text + tlen, "sha256 ");
        for (int i = 0; i < MESH_CKPT_DIGEST_LEN; i++)
            tlen += (size_t)sprintf(text + tlen, "%02x", sum[i]);
        text[tlen++] = '\n';
    }
    if (mesh_ckpt_path(fuzz_tmpdir(), 5, dir, sizeof(dir)) < 0)
        fuzz_fail("no path for step 5");
    base = strrchr(dir, '/') + 1;
    snprintf(file, sizeof(file), "%s/MANIFEST", base);
    fuzz_write(file, text, tlen);
    snprintf(file, sizeof(file), "%s/w", base);
    if (blob)
        fuzz_write(file, blob, blen);
    free(text);

    mesh_err_clear();
    rc = mesh_ckpt_open(dir, &c);
    fuzz_answer(rc, (const char *const[]){dir}, 1);
    if (rc == 0) {
        struct mesh_ckpt_meta meta;

        mesh_ckpt_get_meta(c, &meta);
        step = meta.step;
        for (size_t i = 0; i < mesh_ckpt_blob_count(c); i++) {
            const char *name = mesh_ckpt_blob_name(c, i);
            size_t n = 0;
            void *buf = NULL;

            if (!name || mesh_ckpt_blob_size(c, name, &n) < 0)
                fuzz_fail("blob %zu has no name or size", i);
            if (mesh_ckpt_read(c, name, &buf, &n) < 0)
                fuzz_fail("blob %s does not read back: %s", name,
                          mesh_err_msg(-1));
            free(buf);
        }
        mesh_ckpt_close(c);
    }
    memset(&dmg, 0, sizeof(dmg));
    if (mesh_ckpt_scan(fuzz_tmpdir(), &ents, &nent, &dmg) < 0)
        fuzz_fail("scan failed: %s", mesh_err_msg(-1));
    if (nent + dmg.count != 1 || (nent == 1) != (rc == 0 && step == 5))
        fuzz_fail("scan: %zu good, %zu damaged (%s); open said %d", nent,
                  dmg.count, dmg.list, rc);
    free(ents);
    return 0;
}
