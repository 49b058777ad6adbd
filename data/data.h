/*
 * data/data.h: data sets and the prefetching batch loader.
 *
 * The folder's files: data.c opens a data set from its spec (info,
 * fingerprint, close); idx.c (fashion-mnist), cifar.c, synthetic.c and
 * folder.c (imagefolder) read one format each, idx.c and cifar.c through
 * reader.c (whole files, gzip or plain, errors with byte offsets); jpeg.c
 * decodes imagefolder's files; transform.c makes one sample (resampling,
 * augmentation, normalisation) and the epoch permutation; loader.c is the
 * threaded loader and its state record. data-internal.h holds what they
 * share: the data set's layout and the random streams below.
 *
 * A data set is opened from a --data spec string:
 *   synthetic[:N]        N random samples (default 50000 train, N/5 eval)
 *                        in the model's input shape (default 3x224x224,
 *                        1000 classes), labels random, images drawn from
 *                        64 random images generated once from the seed
 *                        (the seed benchmark's mode)
 *   fashion-mnist[:DIR]  IDX files (gzip or plain) in DIR, default
 *                        /usr/share/datasets/fashion-mnist
 *   cifar10:DIR          data_batch_1..5.bin and test_batch.bin (also
 *                        found in DIR/cifar-10-batches-bin)
 *   imagefolder:DIR      DIR/train/<class>/NAME.jpg + DIR/val/<class>/NAME.jpg,
 *                        or DIR/<class>/NAME.jpg (then no evaluation split);
 *                        classes sorted by name (strcmp), files too
 *
 * Output: float32 NCHW batches, normalised per channel ((x/255 - mean) /
 * std; ImageNet's statistics for imagefolder, the data set's own for
 * fashion-mnist (0.2860/0.3530) and cifar10, 0.5/0.2887 (uniform bytes) for
 * synthetic) at the requested (channels, size, size), and int32 labels.
 * A grey source feeds 3 channels by replication; RGB feeds 1 channel as
 * luma (0.299 R + 0.587 G + 0.114 B). A source of another size is fitted
 * by bilinear resize (default) or centred zero padding/cropping.
 *
 * Transforms:
 *   imagefolder train: RandomResizedCrop as torchvision (scale 0.08-1,
 *     ratio 3/4-4/3, 10 tries, then the centre fallback), horizontal flip
 *     with p = 0.5, bilinear resampling (half-pixel centres, edge clamp,
 *     no antialias filter), normalisation.
 *   imagefolder eval: resize the shorter side to round(size * 256 / 224),
 *     centre crop size x size (done as one resampling of the source).
 *   cifar10 train (augment on by default): pad 4 + random 32x32 crop +
 *     flip. fashion-mnist and synthetic: no augmentation unless asked, then
 *     the same pad-crop-flip.
 *
 * Randomness (portable, documented so that other tools can replay it):
 *   splitmix64(s): s += 0x9e3779b97f4a7c15; z = s;
 *     z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9;
 *     z = (z ^ z >> 27) * 0x94d049bb133111eb; return z ^ z >> 31.
 *   key(a, b, c): s = a; x = splitmix64(s); s = x ^ b; x = splitmix64(s);
 *     s = x ^ c; return splitmix64(s)   (each splitmix64 advances s).
 *   A stream seeded with k is xoshiro256** whose four words are the next
 *   four splitmix64 outputs of s = k. bounded(n) = ((next >> 32) * n) >> 32;
 *   uniform() = (next >> 11) * 2^-53.
 *   Epoch e's permutation of the n training samples: identity, then
 *   Fisher-Yates from i = n-1 down to 1 swapping i with bounded(i + 1),
 *   on the stream key(seed, 0x7065726d ("perm"), e).
 *   Sample augmentation uses the stream key(seed, e + 1, index): it depends
 *   only on (seed, epoch, sample index), never on thread scheduling.
 *   A bad sample skipped (MESH_DATA_BAD_SKIP) is replaced by the next good
 *   index j after it (wrapping), with j's label and j's stream.
 *
 * Sharding (training): global batch G = batch * world. Step s of epoch e
 * covers permutation positions [s G, (s + 1) G); peer r takes the block
 * [s G + r batch, s G + (r + 1) batch). steps_per_epoch = floor(n / G) on
 * every peer; the n mod G samples at the end of each permutation are not
 * used that epoch (a different remainder every epoch). One process with
 * batch b and world 1 reads, in steps N s + r, exactly what peer r of N
 * reads in step s: the same micro-batches for --accumulate N (with
 * accumulate = N both count N floor(n / (b N)) micro-batches per epoch).
 *
 * Sharding (evaluation): no shuffle, no augmentation. Peer r takes the
 * samples r, r + world, r + 2 world, ... in batches of `batch`, the last
 * one partial; every sample is evaluated exactly once over all peers.
 *
 * Threads: a pool of `threads` workers fills a ring of `depth` batches
 * ahead of the consumer, one sample per task. Each sample's bytes depend
 * only on (seed, epoch, index), so batches are identical for any thread
 * count. Only one thread may call mesh_data_next/seek on a loader.
 */
#ifndef MESH_DATA_H
#define MESH_DATA_H

#include <stddef.h>
#include <stdint.h>

struct mesh_dataset;
struct mesh_loader;

enum mesh_data_split {
    MESH_DATA_TRAIN = 0,
    MESH_DATA_EVAL = 1,
};

/* --on-bad-sample */
enum mesh_data_bad {
    MESH_DATA_BAD_FAIL = 0, /* a bad sample is an error */
    MESH_DATA_BAD_SKIP = 1, /* warn once per file, use the next good one */
};

/* How a source of another size reaches the model's size. */
enum mesh_data_fit {
    MESH_DATA_FIT_RESIZE = 0, /* bilinear resize of the whole image */
    MESH_DATA_FIT_PAD = 1,    /* centred: zero padding or centre crop */
};

struct mesh_data_opts {
    const char *spec; /* --data, as above */
    int channels;     /* model input channels; 0: the source's */
    int size;         /* model input height = width; 0: native
                         (224 for imagefolder) */
    int classes;      /* synthetic only; 0: 1000 */
    uint64_t seed;    /* --seed: permutation, augmentation */
    enum mesh_data_bad on_bad;
    enum mesh_data_fit fit;
};

struct mesh_data_info {
    size_t train_count; /* samples in the training split */
    size_t eval_count;  /* samples in the evaluation split (may be 0) */
    int classes;
    int channels, size;        /* the output shape of every sample */
    int src_channels;          /* the source's channels (1 or 3) */
    int src_height, src_width; /* the source's size; 0 when it varies */
    float mean[3], std[3];     /* normalisation per source channel */
    const char *name;          /* "fashion-mnist", ... */
};

/*
 * Open and check a data set. In-memory formats (fashion-mnist, cifar10,
 * synthetic) are read completely and checked here: a short read, a bad
 * magic, wrong dimensions, a gzip error or a wrong record size is an error
 * naming the file and byte offset. imagefolder scans the tree here and
 * decodes lazily. Returns 0, -EINVAL (bad spec or shape), -ENOENT, -EIO,
 * -ENOTSUP (built without zlib/libjpeg), -ENOMEM.
 */
int mesh_data_open(const struct mesh_data_opts *opts,
                   struct mesh_dataset **out);
void mesh_data_close(struct mesh_dataset *ds);
void mesh_data_get_info(const struct mesh_dataset *ds,
                        struct mesh_data_info *info);

/* Class name of label k (imagefolder: the folder name; else "0", "1", ..). */
const char *mesh_data_class_name(const struct mesh_dataset *ds, int k);

/*
 * --predict DIR: the JPEG files under DIR (.jpg, .jpeg; subfolders too;
 * names starting with '.' skipped), sorted by path, as the evaluation
 * split (labels 0) of a new data set for inference with a model trained
 * on like: like's output channels, size, statistics, classes and class
 * names, and like's evaluation geometry (an imagefolder's: shorter side
 * to size * 256 / 224, centre crop; any other: the whole image fitted as
 * like fits its own, resized or centred). No JPEG under DIR is an error.
 */
int mesh_data_open_predict(const struct mesh_dataset *like, const char *dir,
                           struct mesh_dataset **out);

/* The file of sample index of split, relative to the data set's folder
 * (imagefolder and --predict sets); NULL for other data sets. */
const char *mesh_data_sample_path(const struct mesh_dataset *ds,
                                  enum mesh_data_split split, size_t index);

/*
 * One sample, synchronously, as the loader makes it: out holds channels *
 * size * size floats; *label gets the label (a substitute's label when a
 * bad sample was skipped). augment: 1 for training transforms (random from
 * (seed, epoch, index)), 0 for evaluation transforms. Thread-safe.
 */
int mesh_data_sample(struct mesh_dataset *ds, enum mesh_data_split split,
                     size_t index, uint64_t epoch, int augment, float *out,
                     int32_t *label);

/* Epoch e's permutation of the training split, into perm[train_count]. */
void mesh_data_permutation(const struct mesh_dataset *ds, uint64_t epoch,
                           uint32_t *perm);

struct mesh_loader_opts {
    enum mesh_data_split split;
    int batch;       /* per-peer batch size, >= 1 */
    int rank, world; /* this peer and the peer count */
    int threads;     /* worker threads; 0: 2 */
    int depth;       /* batches in the ring, the one the consumer holds
                        included; 0: max(3, ceil(2 threads / batch) + 1) */
    int augment;     /* -1: the data set's default (train split
                        only), 0: off, 1: on */
    int accumulate;  /* training: steps per epoch rounded down to
                        a multiple of this (--accumulate K, one
                        loader step per micro-batch); 0 or 1: no
                        rounding */
};

/* A batch; its memory belongs to the loader and stays valid until the next
 * mesh_data_next, mesh_data_seek or mesh_loader_destroy. */
struct mesh_batch {
    const float *x;   /* (n, channels, size, size) */
    const int32_t *y; /* (n) */
    int n;            /* samples; < batch only in an eval tail */
    int channels, size;
    uint64_t epoch; /* position of this batch */
    uint64_t step;  /* step within the epoch */
    double wait_s;  /* time mesh_data_next blocked for it */
};

/*
 * Create a loader over one split and start prefetching from (epoch 0,
 * step 0). The data set must outlive the loader. Returns 0, -EINVAL (bad
 * batch/rank/world/threads), -ENOMEM, or a pthread error.
 */
int mesh_loader_create(struct mesh_dataset *ds,
                       const struct mesh_loader_opts *opts,
                       struct mesh_loader **out);
void mesh_loader_destroy(struct mesh_loader *ld);

/* Steps per epoch: equal on every peer for the training split; for the
 * evaluation split, this peer's batch count (may differ by one). */
uint64_t mesh_loader_steps_per_epoch(const struct mesh_loader *ld);

/*
 * The next batch. Training loaders run forever: after the last step of an
 * epoch comes step 0 of the next epoch. Evaluation loaders return 1 (and
 * no batch) after their last batch, until mesh_data_seek(ld, 0, 0).
 * Returns 0, 1 (end of the evaluation split) or a negative code with the
 * message of the failing sample (file and byte offset) when a sample could
 * not be made (fail mode, or every sample bad); the loader then stays
 * failed.
 */
int mesh_data_next(struct mesh_loader *ld, struct mesh_batch *batch);

/* Position of the batch the next mesh_data_next returns. */
void mesh_data_tell(const struct mesh_loader *ld, uint64_t *epoch,
                    uint64_t *step);

/* Drop prefetched batches and continue from (epoch, step). -EINVAL when
 * step >= steps per epoch (or epoch != 0 for an evaluation loader). */
int mesh_data_seek(struct mesh_loader *ld, uint64_t epoch, uint64_t step);

/*
 * --elastic: continue the training split from permutation position pos of
 * epoch (where a step starts), with another layout. Each optimizer step
 * then covers `slots` micro-batches of `batch` consecutive positions; slot
 * m of a step is read by peer m mod world, so this peer (rank) reads slots
 * rank, rank + world, ... in that order, mesh_loader_micro_per_step of
 * them. The epoch ends at its last whole step (the tail of fewer than
 * slots x batch positions is not used, as before); later epochs start at
 * position 0 with the same layout. The default layout, from
 * mesh_loader_create, is slots = world x accumulate from position 0 of
 * epoch 0, which is the sharding described above; mesh_data_seek returns
 * to position 0 of its epoch with the current slots. Returns 0, or
 * -EINVAL when the layout makes no step.
 */
int mesh_data_layout(struct mesh_loader *ld, uint64_t epoch, uint64_t pos,
                     int slots, int rank, int world);

/* Micro-batches this peer reads per optimizer step under the layout. */
int mesh_loader_micro_per_step(const struct mesh_loader *ld);

/*
 * The loader's whole position and RNG state, for checkpoints: a portable
 * little-endian record of MESH_DATA_STATE_BYTES (magic, version, seed,
 * epoch, step, batch, world, rank, sample count). Since augmentation is
 * derived from (seed, epoch, index), this is all an exact resume needs.
 * mesh_data_set_state checks the record and that seed, batch, world and
 * sample count match this loader (-EINVAL naming the field otherwise),
 * then seeks. The rank may differ (a peer may resume from another's).
 */
#define MESH_DATA_STATE_BYTES 64
void mesh_data_get_state(const struct mesh_loader *ld,
                         uint8_t state[MESH_DATA_STATE_BYTES]);
int mesh_data_set_state(struct mesh_loader *ld, const uint8_t *state,
                        size_t len);

/*
 * SHA-256 identifying what the peers train on, for the configuration
 * check at join: kind, classes, shapes, fit, normalisation, and per split
 * the count, every label and, for in-memory formats, every pixel byte;
 * for imagefolder the file paths relative to DIR (not their contents).
 * Peers whose DIRs differ in place but not in content agree. -EIO or
 * -ENOMEM on an OpenSSL failure.
 */
int mesh_data_fingerprint(const struct mesh_dataset *ds, uint8_t out[32]);

/* Parse "skip" or "fail" (--on-bad-sample). */
int mesh_data_parse_bad(const char *s, enum mesh_data_bad *out);

#endif
