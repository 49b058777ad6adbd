/*
 * tests/fuzz_safetensors.c: libFuzzer target for the safetensors parser.
 * Not part of make check; build and run by hand with clang:
 *   make fuzz-safetensors
 *   ./tests/fuzz_safetensors -max_total_time=300 \
 *       -dict=$(srcdir)/tests/fuzz_safetensors.dict fuzz-corpus \
 *       $(srcdir)/tests/safetensors-corpus
 * Every input must either parse into a consistent file (every tensor inside
 * the data buffer, found by name, readable as its dtype and, for floats, as
 * F32) or be rejected with -EINVAL and a "safetensors: " message.
 */
#include "config.h"

#include "nn/safetensors.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);

static void check(const struct mesh_st_file *f, const uint8_t *data, size_t len)
{
    uint64_t hl = 0, total = 0;

    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | data[i];
    for (int i = 0; i < mesh_st_count(f); i++) {
        const struct mesh_st_tensor *t = mesh_st_get(f, i);
        void *buf;

        if (mesh_st_find(f, t->name) != t ||
            t->offset + t->nbytes > len - 8 - hl)
            abort();
        total += t->nbytes;
        buf = malloc(t->nbytes / mesh_st_dtype_size(t->dtype) * 8 + 1);
        if (!buf)
            abort();
        if (mesh_st_read(f, t->name, t->dtype, t->shape, t->ndim, buf) != 0)
            abort();
        if ((t->dtype == MESH_DT_F16 || t->dtype == MESH_DT_BF16) &&
            mesh_st_read(f, t->name, MESH_DT_F32, t->shape, t->ndim, buf))
            abort();
        free(buf);
    }
    if (total != len - 8 - hl)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    struct mesh_st_file *f;
    int rc;

    mesh_err_clear();
    rc = mesh_st_parse(data, len, &f);
    if (rc == 0) {
        check(f, data, len);
        mesh_st_close(f);
    } else if (rc != -EINVAL ||
               strncmp(mesh_err_msg(rc), "safetensors: ", 13) != 0) {
        abort();
    }
    return 0;
}
