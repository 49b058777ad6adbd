/*
 * data/synthetic.c: random samples drawn from a pool generated from the seed.
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>

int data_open_synthetic(struct mesh_dataset *ds, size_t count)
{
    size_t img = (size_t)ds->sc * ds->sh * ds->sw;
    struct rng r;

    ds->name = "synthetic";
    for (int c = 0; c < 3; c++) {
        ds->mean[c] = 0.5f;
        ds->std[c] = 0.2887f; /* uniform bytes: 1 / sqrt(12) */
    }
    for (int s = 0; s < 2; s++) {
        struct split *sp = &ds->sp[s];
        size_t pool = MESH_MIN(count, (size_t)SYN_POOL);

        sp->count = count;
        sp->labels = malloc(sizeof(int32_t) * count);
        sp->pix = malloc(pool * img);
        if (!sp->labels || !sp->pix)
            return mesh_err(-ENOMEM,
                            "synthetic: cannot allocate %zu "
                            "samples",
                            count);
        rng_seed(&r, key3(ds->seed, 0x73796e00ull + (uint64_t)s, 0));
        for (size_t i = 0; i < count; i++)
            sp->labels[i] = (int32_t)rng_bounded(&r, (uint64_t)ds->classes);
        for (size_t i = 0; i < pool * img; i += 8) {
            uint64_t v = rng_next(&r);

            for (size_t k = 0; k < 8 && i + k < pool * img; k++)
                sp->pix[i + k] = (uint8_t)(v >> (8 * k));
        }
        count = count / 5 ? count / 5 : 1;
    }
    return 0;
}
