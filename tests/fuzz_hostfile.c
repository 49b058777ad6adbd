/*
 * tests/fuzz_hostfile.c: hostile hostfiles and -H lists (mesh/hostfile.c).
 * The first byte picks the form (% 3: 0 a hostfile's text, 1 -H, both cut
 * at a NUL as a C string is; 2 a hostfile read from a file), the rest is
 * the text. Accepted: every entry has a host, 1 to 4096 slots, a port of
 * -1 or 1 to 65535, and the slots add up to at most MESH_WORLD_MAX; the
 * world's ranks are laid out (mesh_hostfile_layout) or are refused, as a
 * parse is. Refused: the
 * message names the source ("fuzz-hostfile", "-H" or the file's path).
 */
#include "config.h"

#include "tests/fuzz.h"
#include "mesh/hostfile.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char fuzz_name[] = "hostfile";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    struct mesh_hostfile *hf = NULL;
    struct mesh_peer *peers = NULL;
    const char *must[1];
    char *text, path[4200];
    int rc, size = 0, form = len ? data[0] % 3 : 0;

    text = malloc(len + 1);
    if (!text)
        return 0;
    if (len)
        memcpy(text, data + 1, len - 1);
    text[len ? len - 1 : 0] = '\0';
    mesh_err_clear();
    if (form == 1) {
        rc = mesh_hostfile_parse_hosts(text, &hf);
        must[0] = "-H";
    } else if (form == 2) {
        /* the file as it is: NUL bytes too */
        fuzz_clean();
        fuzz_write("hosts", data + 1, len ? len - 1 : 0);
        snprintf(path, sizeof(path), "%s/hosts", fuzz_tmpdir());
        rc = mesh_hostfile_parse_file(path, &hf);
        must[0] = path;
    } else {
        rc = mesh_hostfile_parse_text("fuzz-hostfile", text, &hf);
        must[0] = "fuzz-hostfile";
    }
    fuzz_answer(rc, must, 1);
    if (rc == 0) {
        long total = 0;

        if (hf->n < 1)
            fuzz_fail("accepted with no entries");
        for (int i = 0; i < hf->n; i++) {
            const struct mesh_hostfile_entry *e = &hf->entries[i];

            if (!e->host[0] || !memchr(e->host, '\0', sizeof(e->host)) ||
                e->slots < 1 || e->slots > 4096 ||
                (e->port != -1 && (e->port < 1 || e->port > 65535)))
                fuzz_fail("entry %d accepted out of range", i);
            total += e->slots;
        }
        if (total > MESH_WORLD_MAX || mesh_hostfile_slots(hf) != total)
            fuzz_fail("slots add up to %ld, %d said", total,
                      mesh_hostfile_slots(hf));
        mesh_err_clear();
        rc = mesh_hostfile_layout(hf, MESH_PORT_DEFAULT, 0, 0, &peers, &size);
        fuzz_answer(rc, must, 1);
        if (rc == 0 && size != total)
            fuzz_fail("a layout of %d ranks for %ld slots", size, total);
        free(peers);
        mesh_hostfile_free(hf);
    }
    free(text);
    return 0;
}
