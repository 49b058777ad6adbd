/*
 * train/timeline.h: the trainer's --timeline trace, events in memory and
 * then a Chrome trace file (chrome://tracing, Perfetto).
 *
 * Threads (tid): 0 compute, 1 communication, 2 data, 3 copies. An event
 * of a gradient bucket names its stage, and carries the bucket, the bytes
 * it moved and, for the pinned-host pipeline, the chunk's index.
 */
#ifndef MESH_TIMELINE_H
#define MESH_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

struct mesh_tl_event {
    const char *name; /* static string; with a bucket: its stage */
    int tid;          /* 0 compute, 1 communication, 2 data, 3 copies */
    int bucket;       /* -1 or the bucket's index */
    int chunk;        /* -1 or the chunk's index in its bucket */
    size_t bytes;     /* with a bucket: the bytes it moved */
    uint64_t step;
    double ts, dur; /* seconds since the run started */
};

/* Zero-initialised: empty. */
struct mesh_timeline {
    struct mesh_tl_event *ev;
    size_t n, cap;
};

/* Append e; without memory the event is dropped (the trace is a
 * diagnostic). */
void mesh_timeline_add(struct mesh_timeline *tl, const struct mesh_tl_event *e);
/* Write the trace of rank's process to path ("--timeline PATH" in
 * errors). */
int mesh_timeline_write(const struct mesh_timeline *tl, const char *path,
                        int rank);
void mesh_timeline_free(struct mesh_timeline *tl);

#endif
