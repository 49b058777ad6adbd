/*
 * train/ckpt.h: checkpoint files. The trainer decides what goes in (named
 * opaque blobs: the weights as a safetensors file, momentum buffers, BN
 * running statistics, the data loader's state, ...); this module writes
 * them atomically with checksums, verifies them on reading, lists and
 * prunes them.
 *
 * Layout: a checkpoint is a directory DIR/ckpt-<step, 9+ digits> holding
 * one file per blob (named as the blob) and a MANIFEST:
 *
 *   meshtrain-checkpoint 1
 *   step <u64>
 *   epoch <u64>
 *   config <64 hex: the configuration digest>
 *   digest <64 hex: the agreement digest, below>
 *   blob <name> <bytes> <64 hex: SHA-256 of the file> <shared 0|1>
 *   ...
 *   sha256 <64 hex: SHA-256 of every byte above this line>
 *
 * The agreement digest is the SHA-256 over, for each blob written with
 * MESH_CKPT_SHARED in manifest order: its name, a NUL, its size (8 bytes
 * little-endian) and its SHA-256. Shared blobs are those that are
 * bitwise identical on every peer (weights, optimizer state, averaged BN
 * statistics); "the newest checkpoint every peer holds with the same
 * digest" compares this digest.
 *
 * Atomicity: blobs are written into DIR/.ckpt-<step>.tmp.<pid>.<n>.<host>/,
 * each file fsync'ed, then MANIFEST, then the temporary directory is
 * fsync'ed, renamed to its final name (atomically exchanged with an older
 * checkpoint of the same step, which is then removed) and DIR is fsync'ed.
 * A crash leaves either the old state or the new checkpoint, never a
 * partial one under a final name; leftover temporary directories are
 * ignored by mesh_ckpt_list and removed by mesh_ckpt_prune once their
 * writer is gone. A checkpoint directory belongs to one process (give each
 * peer its own, e.g. DIR/rank-R), but a writer still running in it (an
 * --elastic peer left out of the view finishing its write) is safe.
 *
 * Weights as safetensors (nn/safetensors.h):
 *   mesh_ckpt_put_file(w, "model.safetensors", MESH_CKPT_SHARED, p, cap);
 *   mesh_st_write(p, entries, n, metadata_kv);
 *   ... mesh_ckpt_put(w, "momentum", ...), mesh_ckpt_commit(w, &meta, dg);
 * and on resume mesh_ckpt_blob_path(c, "model.safetensors", p, cap) then
 * mesh_st_open(p, &f): the file a user loads into PyTorch as it is.
 */
#ifndef MESH_CKPT_H
#define MESH_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define MESH_CKPT_DIGEST_LEN 32
#define MESH_CKPT_NAME_MAX   64 /* blob names: [A-Za-z0-9._-], no leading '.' */
#define MESH_CKPT_BLOBS_MAX  1024

/* Blob flag: identical on every peer; enters the agreement digest. */
#define MESH_CKPT_SHARED 1u

struct mesh_ckpt_meta {
    uint64_t step; /* optimizer steps done */
    uint64_t epoch;
    uint8_t config[MESH_CKPT_DIGEST_LEN]; /* digest of the configuration */
};

struct mesh_ckpt_writer;
struct mesh_ckpt;

/* SHA-256 of len bytes (OpenSSL EVP). Returns 0 or -EIO. */
int mesh_ckpt_sha256(const void *data, size_t len,
                     uint8_t out[MESH_CKPT_DIGEST_LEN]);

/* "DIR/ckpt-<step>" into buf. -ENAMETOOLONG if it does not fit. */
int mesh_ckpt_path(const char *dir, uint64_t step, char *buf, size_t cap);

/*
 * Start checkpoint `step` in dir (created if missing, one level). Returns
 * 0, -EINVAL, or -errno of mkdir/open with the path in the message.
 */
int mesh_ckpt_begin(const char *dir, uint64_t step,
                    struct mesh_ckpt_writer **out);

/* Write blob `name` from memory (written and fsync'ed now). -EINVAL for a
 * bad or duplicate name. */
int mesh_ckpt_put(struct mesh_ckpt_writer *w, const char *name,
                  const void *data, size_t len, unsigned flags);

/*
 * Reserve blob `name` as a file that the caller writes itself at the path
 * returned in path (e.g. mesh_st_write for safetensors) before commit;
 * commit hashes and fsyncs it (missing: an error).
 */
int mesh_ckpt_put_file(struct mesh_ckpt_writer *w, const char *name,
                       unsigned flags, char *path, size_t cap);

/*
 * Write MANIFEST, fsync, rename into place, fsync dir. Frees w in every
 * case (on failure the temporary directory is removed). digest_out, if
 * not NULL, gets the agreement digest.
 */
int mesh_ckpt_commit(struct mesh_ckpt_writer *w,
                     const struct mesh_ckpt_meta *meta,
                     uint8_t digest_out[MESH_CKPT_DIGEST_LEN]);

/* Give up: remove the temporary directory and free w. */
void mesh_ckpt_abort(struct mesh_ckpt_writer *w);

/*
 * Steps of the checkpoints in dir, newest first (names only, not
 * verified): *steps is malloc'ed (free it), *n may be 0. A missing dir is
 * an empty list.
 */
int mesh_ckpt_list(const char *dir, uint64_t **steps, size_t *n);

/* A verified checkpoint, as peers compare them for --resume. */
struct mesh_ckpt_entry {
    uint64_t step;
    uint64_t epoch;
    uint8_t digest[MESH_CKPT_DIGEST_LEN]; /* agreement digest */
    uint8_t config[MESH_CKPT_DIGEST_LEN]; /* configuration digest */
};

/* The checkpoints that mesh_ckpt_scan left out because they are damaged. */
struct mesh_ckpt_damage {
    size_t count;    /* how many */
    char list[2048]; /* "PATH: why; PATH: why" (cut with "..." to fit) */
};

/*
 * The checkpoints in dir that verify completely (mesh_ckpt_open), newest
 * first; a damaged one is reported with mesh_warn (file and fault) and
 * left out, and counted and described in *damage (may be NULL). *out is
 * malloc'ed (free it); *n may be 0.
 */
int mesh_ckpt_scan(const char *dir, struct mesh_ckpt_entry **out, size_t *n,
                   struct mesh_ckpt_damage *damage);

/*
 * --resume: the newest step that every peer holds with the same digest.
 * lists[p] (counts[p] entries, any order) is peer p's scan. Returns 0 and
 * *step, or -ENOENT (with a message) when no checkpoint is common.
 */
int mesh_ckpt_agree(const struct mesh_ckpt_entry *const *lists,
                    const size_t *counts, int npeers, uint64_t *step);

/* An entry as 80 portable bytes (little-endian step, epoch, then the two
 * digests), for exchanging scans between peers. */
#define MESH_CKPT_ENTRY_BYTES 80
void mesh_ckpt_entry_pack(const struct mesh_ckpt_entry *e,
                          uint8_t out[MESH_CKPT_ENTRY_BYTES]);
void mesh_ckpt_entry_unpack(const uint8_t in[MESH_CKPT_ENTRY_BYTES],
                            struct mesh_ckpt_entry *e);

/* Keep the `keep` newest checkpoints (keep >= 1), remove the others and
 * every leftover temporary directory whose writer is provably gone (this
 * process, or a process of this host that no longer runs). */
int mesh_ckpt_prune(const char *dir, int keep);

/*
 * Open the checkpoint directory at path and verify it completely: the
 * manifest's syntax and checksum, every blob's presence, size and
 * SHA-256, and that no blob file is missing. A corrupt or truncated
 * checkpoint is -EIO (or -ENOENT) with a message naming the file and what
 * is wrong.
 */
int mesh_ckpt_open(const char *path, struct mesh_ckpt **out);
void mesh_ckpt_close(struct mesh_ckpt *c);

void mesh_ckpt_get_meta(const struct mesh_ckpt *c, struct mesh_ckpt_meta *meta);
void mesh_ckpt_get_digest(const struct mesh_ckpt *c,
                          uint8_t digest[MESH_CKPT_DIGEST_LEN]);

/* Blobs in manifest order; -ENOENT when name is absent. */
size_t mesh_ckpt_blob_count(const struct mesh_ckpt *c);
const char *mesh_ckpt_blob_name(const struct mesh_ckpt *c, size_t i);
int mesh_ckpt_blob_size(const struct mesh_ckpt *c, const char *name,
                        size_t *len);

/* Read a blob into a malloc'ed buffer, checking its SHA-256 again. */
int mesh_ckpt_read(const struct mesh_ckpt *c, const char *name, void **data,
                   size_t *len);

/* Read a blob of exactly len bytes into buf (-EIO naming the blob when its
 * size differs), checking its SHA-256. */
int mesh_ckpt_read_into(const struct mesh_ckpt *c, const char *name, void *buf,
                        size_t len);

/* Path of a blob's file (verified by mesh_ckpt_open), e.g. for
 * mesh_st_open. */
int mesh_ckpt_blob_path(const struct mesh_ckpt *c, const char *name, char *path,
                        size_t cap);

#endif
