/*
 * data/data-internal.h: what the files of data/ share (not installed, not
 * for callers of data/data.h): the data set's layout, the random streams,
 * the whole-file reader and each format's open function.
 */
#ifndef MESH_DATA_INTERNAL_H
#define MESH_DATA_INTERNAL_H

#include "data/data.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#ifdef HAVE_ZLIB
#include <zlib.h>
#endif

#define SYN_POOL 64
#define MAX_SIZE 4096 /* largest output side */

/* ---- random streams (documented in data.h) ------------------------------ */

struct rng {
    uint64_t s[4];
};

static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t key3(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t s = a, x;

    x = splitmix64(&s);
    s = x ^ b;
    x = splitmix64(&s);
    s = x ^ c;
    return splitmix64(&s);
}

static inline void rng_seed(struct rng *r, uint64_t k)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&k);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;

    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

/* Uniform in [0, n), n <= 2^32. */
static inline uint32_t rng_bounded(struct rng *r, uint64_t n)
{
    return (uint32_t)(((rng_next(r) >> 32) * n) >> 32);
}

static inline double rng_uniform(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- data set layout ---------------------------------------------------- */

enum kind { K_SYNTHETIC, K_FMNIST, K_CIFAR, K_FOLDER };

struct split {
    size_t count;
    int32_t *labels;   /* (count) */
    uint8_t *pix;      /* in-memory: (count or SYN_POOL, c, h, w) */
    char **paths;      /* imagefolder: (count) */
    atomic_uchar *bad; /* imagefolder: bad file already reported */
};

struct mesh_dataset {
    enum kind kind;
    const char *name;
    int classes;
    char **class_names; /* imagefolder: (classes) */
    int sc, sh, sw;     /* source channels, height, width (0: varies) */
    int co, size;       /* output channels and side */
    float mean[3], std[3];
    uint64_t seed;
    enum mesh_data_bad on_bad;
    enum mesh_data_fit fit;
    size_t root_len; /* imagefolder: strlen(DIR) + 1, paths after it */
    int whole;       /* predict set of a non-folder model: the whole JPEG
                        fitted as the model's data set fits its images */
    struct split sp[2];
};

/* Per-thread buffers for decoding. */
struct scratch {
    uint8_t *file;
    size_t file_cap;
    size_t file_len; /* bytes of the file in file */
    uint8_t *img;
    size_t img_cap;
    int32_t *xi; /* resampling: (2 * size) source columns */
    float *xw;   /* (size) weights */
};

/* data/transform.c: per-thread decoding buffers, and one sample as the
 * loader makes it (the next good one with --on-bad-sample skip). */
void data_scratch_free(struct scratch *s);
int data_make_sample(struct mesh_dataset *ds, int split, size_t idx,
                     uint64_t epoch, int augment, struct scratch *scr,
                     float *out, int32_t *label);

/* ---- data/reader.c: whole-file readers with offsets in every error ------ */

/*
 * A file read front to back, gzip'ed (by its magic bytes) or plain. gzip is
 * inflated here rather than through gzread, so that an error names the
 * compressed offset where inflate found it, the uncompressed offset of the
 * data it was producing, and so that bytes after the last gzip member are
 * an error rather than silently ignored.
 */
struct rd {
    const char *path;
    uint64_t off; /* uncompressed bytes consumed */
    int fd;
    int gz;       /* the file starts with gzip's magic 1f 8b */
    int gz_end;   /* the last member's trailer was read and checked */
    uint64_t raw; /* file bytes read into in[] so far */
#ifdef HAVE_ZLIB
    z_stream z;
    int z_init;
    uint8_t *in; /* (RD_IN) compressed input */
#endif
};

#define RD_INIT ((struct rd){.fd = -1})

int data_rd_open(struct rd *r, const char *path, struct stat *st);
void data_rd_close(struct rd *r);
int data_rd_some(struct rd *r, void *buf, size_t len, size_t *got);
int data_rd_exact(struct rd *r, void *buf, size_t len, const char *what);
/* Exactly len bytes, the last of the data (a gzip trailer's CRC included):
 * more is an error naming the offset where it starts. */
int data_rd_last(struct rd *r, void *buf, size_t len, const char *what);

/* ---- the formats: fill ds's splits, source shape and statistics --------- */

/* data/idx.c, cifar.c, synthetic.c and folder.c, from mesh_data_open. */
int data_open_fmnist(struct mesh_dataset *ds, const char *dir);
int data_open_cifar(struct mesh_dataset *ds, const char *dir);
int data_open_synthetic(struct mesh_dataset *ds, size_t count);
int data_open_folder(struct mesh_dataset *ds, const char *dir);

/* data/folder.c: free n strings and the array holding them. */
void data_free_names(char **v, size_t n);

#ifdef HAVE_JPEG
/* data/jpeg.c: decode path into sc->img as interleaved RGB (h, w, 3). */
int data_jpeg_decode(const char *path, struct scratch *sc, int *w_out,
                     int *h_out);
#endif

#endif
