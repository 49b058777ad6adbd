/*
 * train/timeline.c: the --timeline trace (see train/timeline.h).
 */
#include "config.h"

#include "train/timeline.h"

#include "common/array.h"
#include "common/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

void mesh_timeline_add(struct mesh_timeline *tl, const struct mesh_tl_event *e)
{
    if (mesh_array_reserve(&tl->ev, &tl->cap, tl->n + 1, sizeof(*tl->ev),
                           "timeline events") < 0)
        return;
    tl->ev[tl->n++] = *e;
}

int mesh_timeline_write(const struct mesh_timeline *tl, const char *path,
                        int rank)
{
    static const char *const threads[] = {"compute", "communication", "data",
                                          "copies"};
    FILE *f;
    size_t i;
    int k;

    f = fopen(path, "w");
    if (!f)
        return mesh_err_errno("--timeline %s", path);
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    fprintf(f,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, "
            "\"args\": {\"name\": \"meshtrain rank %d\"}}",
            rank, rank);
    for (k = 0; k < 4; k++)
        fprintf(f,
                ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": "
                "%d, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
                rank, k, threads[k]);
    for (i = 0; i < tl->n; i++) {
        const struct mesh_tl_event *e = &tl->ev[i];
        char name[80];

        if (e->chunk >= 0)
            snprintf(name, sizeof(name), "%s bucket %d chunk %d", e->name,
                     e->bucket, e->chunk);
        else if (e->bucket >= 0)
            snprintf(name, sizeof(name), "%s bucket %d", e->name, e->bucket);
        else
            snprintf(name, sizeof(name), "%s", e->name);
        fprintf(f,
                ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", "
                "\"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
                "\"args\": {\"step\": %" PRIu64,
                name, threads[e->tid], rank, e->tid, e->ts * 1e6, e->dur * 1e6,
                e->step);
        if (e->bucket >= 0)
            fprintf(f, ", \"bucket\": %d, \"bytes\": %zu", e->bucket, e->bytes);
        if (e->chunk >= 0)
            fprintf(f, ", \"chunk\": %d", e->chunk);
        fprintf(f, "}}");
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0)
        return mesh_err_errno("--timeline %s", path);
    return 0;
}

void mesh_timeline_free(struct mesh_timeline *tl)
{
    free(tl->ev);
    tl->ev = NULL;
    tl->n = tl->cap = 0;
}
