/*
 * nn/cpu_bn.c: batch normalisation (optionally with its ReLU) for the "cpu"
 * backend, with every reduction in double, as PyTorch's CPU kernels do.
 *
 * Why not oneDNN's: its batch norm sums the statistics and, in backward,
 * sum(dy) and sum(dy * (x - mean)) in float32. Over thousands of values per
 * channel that is a relative error of about 1e-5 in every output, five
 * times PyTorch's. In training mode that is enough to flip the ReLU mask of
 * values near zero (a pre-activation of 1e-5 on a scale of 10), and one
 * flipped mask in a late block moves the gradients of every layer before
 * it by 1e-3 to 1e-1: the ResNet-34 parity failures of issue #23. PyTorch
 * accumulates in double and its float32 rounding rarely reaches a mask.
 *
 * Layout: activations are oneDNN's blocked nChw<B>c (B = 16 or 8) or plain
 * NCHW (B = 1): element (n, c, s) of an (N, C, H*W) tensor lives at
 *   ((n * C/B + c/B) * HW + s) * B + c % B.
 * Reductions are split into a fixed grid of (channel block, chunk of N*HW
 * positions) tiles whose partial sums are added in tile order, so the
 * result does not depend on the number of threads: replicas with different
 * --threads stay bitwise identical.
 *
 * save holds (mean, 1/sqrt(var + eps)) per channel as float; reserve, with
 * a fused ReLU, one byte per element: 1 where the output is positive.
 */
#include "config.h"

#include "nn/cpu-bn.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/*
 * The tile bodies below are inlined into each specialised, cloned worker
 * (SPECIALISE): called out of line they would run the baseline ISA's code
 * whichever clone the loader picked.
 */
#if defined(__GNUC__)
#define ALWAYS_INLINE __attribute__((always_inline))
#else
#define ALWAYS_INLINE
#endif

/* Elements per tile and channel block: 32 Ki floats (128 KiB). */
#define TILE_ELEMS 32768

/* Positions (n, s) per tile for block size b. */
static size_t tile_pos(int b)
{
    return (size_t)TILE_ELEMS / (size_t)b;
}

static size_t tiles_per_block(const struct mesh_nn_cpu_bn *s)
{
    size_t npos = (size_t)s->n * s->hw, tp = tile_pos(s->block);

    return (npos + tp - 1) / tp;
}

size_t mesh_nn_cpu_bn_ws_bytes(const struct mesh_nn_cpu_bn *s)
{
    /* two partial sums per channel and tile, two totals, three factors */
    return (tiles_per_block(s) * 2 + 5) * (size_t)s->c * sizeof(double);
}

size_t mesh_nn_cpu_bn_reserve_bytes(const struct mesh_nn_cpu_bn *s)
{
    return s->relu ? (size_t)s->n * s->c * s->hw : 0;
}

/*
 * The tiles of channel block cb: positions [p0, p1) of N*HW. Calls body
 * with the base offset of each contiguous run of positions of one image:
 * (off, len) such that elements off + k * B + l, k < len, l < B, are the
 * run's.
 */
#define FOR_RUNS(s, cb, p0, p1, off, len, ...)                                 \
    do {                                                                       \
        size_t p_ = (p0);                                                      \
        size_t cbs_ = (size_t)(s)->c / (size_t)(s)->block;                     \
        while (p_ < (p1)) {                                                    \
            size_t n_ = p_ / (size_t)(s)->hw, sp_ = p_ % (size_t)(s)->hw;      \
            size_t len = (size_t)(s)->hw - sp_;                                \
            size_t off;                                                        \
            if (len > (p1)-p_)                                                 \
                len = (p1)-p_;                                                 \
            off = ((n_ * cbs_ + (cb)) * (size_t)(s)->hw + sp_) *               \
                  (size_t)(s)->block;                                          \
            __VA_ARGS__;                                                       \
            p_ += len;                                                         \
        }                                                                      \
    } while (0)

/*
 * Four lanes of a block at a time, in GCC's vector extensions: each lane
 * does the same IEEE double operations in the same order as the scalar
 * code would (no lane is summed with another), so the results do not
 * depend on the vector width, and the AVX2 clone's 4 doubles a vector do
 * not wait on the loads and stores that GCC's -O2 kept in the scalar
 * loop. A block of B lanes is B / 4 such groups (B = 8 or 16).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* static and inlined: no ABI */
#endif
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int64_t v4l __attribute__((vector_size(32)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint8_t v4b __attribute__((vector_size(4)));

static inline ALWAYS_INLINE v4d load4(const float *p)
{
    v4f f;

    memcpy(&f, p, sizeof(f));
    return __builtin_convertvector(f, v4d);
}

static inline ALWAYS_INLINE v4d load4d(const double *p)
{
    v4d d;

    memcpy(&d, p, sizeof(d));
    return d;
}

/* dy where the ReLU's mask byte is nonzero, else +0.0 (mask may be NULL) */
static inline ALWAYS_INLINE v4d masked4(const float *dy, const uint8_t *m)
{
    v4d g = load4(dy);
    v4b b;

    if (!m)
        return g;
    memcpy(&b, m, sizeof(b));
    /* b != 0 is -1 (all bits set) or 0 per lane */
    return (v4d)((v4l)g & __builtin_convertvector(b != 0, v4l));
}

/* ---- reductions ---------------------------------------------------------- */

/*
 * Per tile (cb, t): sum of x - shift (shift per channel, or NULL for 0)
 * and, when sq, of its square, into part[(t * C + c) * 2 + {0, 1}].
 * B is a compile-time constant in each caller (SPECIALISE).
 */
static inline ALWAYS_INLINE void tile_sums(const struct mesh_nn_cpu_bn *s,
                                           int B, size_t cb, size_t t,
                                           const float *x, const double *shift,
                                           int sq, double *part)
{
    size_t tp = tile_pos(B), npos = (size_t)s->n * s->hw;
    size_t p0 = t * tp, p1 = p0 + tp < npos ? p0 + tp : npos;
    double a[16] = {0}, q[16] = {0}, sh[16] = {0};
    v4d va[4], vq[4], vs[4];
    int l, j;

    if (shift)
        for (l = 0; l < B; l++)
            sh[l] = shift[cb * B + l];
    for (j = 0; j < 4; j++) {
        va[j] = vq[j] = (v4d){0, 0, 0, 0};
        vs[j] = load4d(sh + 4 * j);
    }
    FOR_RUNS(s, cb, p0, p1, off, len, {
        const float *px = x + off;
        size_t k;

        if (B == 1) {
            double ra = 0, rq = 0;

            for (k = 0; k < len; k++) {
                double v = (double)px[k] - sh[0];

                ra += v;
                rq += v * v;
            }
            a[0] += ra;
            q[0] += rq;
        } else {
            for (k = 0; k < len; k++)
                for (j = 0; j < B / 4; j++) {
                    v4d v = load4(px + k * B + 4 * j) - vs[j];

                    va[j] += v;
                    vq[j] += v * v;
                }
        }
    });
    if (B > 1)
        for (l = 0; l < B; l++) {
            a[l] = va[l / 4][l % 4];
            q[l] = vq[l / 4][l % 4];
        }
    for (l = 0; l < B; l++) {
        part[(t * s->c + cb * B + l) * 2] = a[l];
        part[(t * s->c + cb * B + l) * 2 + 1] = sq ? q[l] : 0;
    }
}

/*
 * Backward's two sums per tile: sum(dy') and sum(dy' * (x - mean)), where
 * dy' is dy masked by the ReLU (mask may be NULL).
 */
static inline ALWAYS_INLINE void tile_bwd_sums(const struct mesh_nn_cpu_bn *s,
                                               int B, size_t cb, size_t t,
                                               const float *x, const float *dy,
                                               const uint8_t *mask,
                                               const float *mean, double *part)
{
    size_t tp = tile_pos(B), npos = (size_t)s->n * s->hw;
    size_t p0 = t * tp, p1 = p0 + tp < npos ? p0 + tp : npos;
    double a[16] = {0}, d[16] = {0}, mu[16] = {0};
    v4d va[4], vd[4], vm[4];
    int l, j;

    for (l = 0; l < B; l++)
        mu[l] = mean[cb * B + l];
    for (j = 0; j < 4; j++) {
        va[j] = vd[j] = (v4d){0, 0, 0, 0};
        vm[j] = load4d(mu + 4 * j);
    }
    FOR_RUNS(s, cb, p0, p1, off, len, {
        const float *px = x + off, *pd = dy + off;
        const uint8_t *pm = mask ? mask + off : NULL;
        size_t k;

        if (B == 1) {
            for (k = 0; k < len; k++) {
                double g = pm && !pm[k] ? 0.0 : (double)pd[k];

                a[0] += g;
                d[0] += g * ((double)px[k] - mu[0]);
            }
        } else {
            for (k = 0; k < len; k++)
                for (j = 0; j < B / 4; j++) {
                    size_t i = k * B + 4 * j;
                    v4d g = masked4(pd + i, pm ? pm + i : NULL);

                    va[j] += g;
                    vd[j] += g * (load4(px + i) - vm[j]);
                }
        }
    });
    if (B > 1)
        for (l = 0; l < B; l++) {
            a[l] = va[l / 4][l % 4];
            d[l] = vd[l / 4][l % 4];
        }
    for (l = 0; l < B; l++) {
        part[(t * s->c + cb * B + l) * 2] = a[l];
        part[(t * s->c + cb * B + l) * 2 + 1] = d[l];
    }
}

/* Add the tiles' partial sums per channel, in tile order, into tot. */
static void combine(const struct mesh_nn_cpu_bn *s, const double *part,
                    double *tot)
{
    size_t nt = tiles_per_block(s), t;
    int c;

    for (c = 0; c < s->c; c++) {
        double a = 0, b = 0;

        for (t = 0; t < nt; t++) {
            a += part[(t * s->c + c) * 2];
            b += part[(t * s->c + c) * 2 + 1];
        }
        tot[2 * c] = a;
        tot[2 * c + 1] = b;
    }
}

/* ---- element-wise passes ------------------------------------------------- */

/*
 * y = (x - mu) * alpha + beta per channel, in double, then the ReLU when
 * relu, recording where it passes in mask when mask is not NULL.
 */
static inline ALWAYS_INLINE void
tile_affine(const struct mesh_nn_cpu_bn *s, int B, size_t cb, size_t t,
            const float *x, float *y, const double *mu, const double *alpha,
            const double *beta, int relu, uint8_t *mask)
{
    size_t tp = tile_pos(B), npos = (size_t)s->n * s->hw;
    size_t p0 = t * tp, p1 = p0 + tp < npos ? p0 + tp : npos;
    const double *m = mu + cb * B, *al = alpha + cb * B, *be = beta + cb * B;
    v4d vm[4], va[4], vb[4];
    int j;

    for (j = 0; j < B / 4; j++) {
        vm[j] = load4d(m + 4 * j);
        va[j] = load4d(al + 4 * j);
        vb[j] = load4d(be + 4 * j);
    }
    FOR_RUNS(s, cb, p0, p1, off, len, {
        size_t k;
        int l;

        if (B == 1) {
            for (k = 0; k < len; k++) {
                size_t i = off + k;
                float v = (float)(((double)x[i] - m[0]) * al[0] + be[0]);

                if (relu) {
                    if (mask)
                        mask[i] = v > 0.f;
                    v = v > 0.f ? v : 0.f;
                }
                y[i] = v;
            }
        } else {
            for (k = 0; k < len; k++)
                for (j = 0; j < B / 4; j++) {
                    size_t i = off + k * B + 4 * j;
                    v4f v = __builtin_convertvector(
                        (load4(x + i) - vm[j]) * va[j] + vb[j], v4f);

                    if (relu) {
                        v4i pos = v > 0.f; /* -1 or 0 per lane */

                        if (mask) {
                            v4b mb = __builtin_convertvector(pos & 1, v4b);

                            memcpy(mask + i, &mb, sizeof(mb));
                        }
                        v = (v4f)((v4i)v & pos);
                    }
                    memcpy(y + i, &v, sizeof(v));
                }
        }
        (void)l;
    });
}

/* dx = k1 * (dy' - k2 - (x - mean) * k3) per channel (dx may be dy). */
static inline ALWAYS_INLINE void tile_dx(const struct mesh_nn_cpu_bn *s, int B,
                                         size_t cb, size_t t, const float *x,
                                         const float *dy, const uint8_t *mask,
                                         const float *mean, const double *k,
                                         float *dx)
{
    size_t tp = tile_pos(B), npos = (size_t)s->n * s->hw;
    size_t p0 = t * tp, p1 = p0 + tp < npos ? p0 + tp : npos;
    double mu[16], k1[16], k2[16], k3[16];
    int l;

    for (l = 0; l < B; l++) {
        size_t c = cb * B + l;

        mu[l] = mean[c];
        k1[l] = k[3 * c];
        k2[l] = k[3 * c + 1];
        k3[l] = k[3 * c + 2];
    }
    FOR_RUNS(s, cb, p0, p1, off, len, {
        size_t kk;
        int j;

        if (B == 1) {
            for (kk = 0; kk < len; kk++) {
                size_t i = off + kk;
                double g = mask && !mask[i] ? 0.0 : (double)dy[i];

                dx[i] = (float)(k1[0] *
                                (g - k2[0] - ((double)x[i] - mu[0]) * k3[0]));
            }
        } else {
            v4d vmu[4], vk1[4], vk2[4], vk3[4];

            for (j = 0; j < B / 4; j++) {
                vmu[j] = load4d(mu + 4 * j);
                vk1[j] = load4d(k1 + 4 * j);
                vk2[j] = load4d(k2 + 4 * j);
                vk3[j] = load4d(k3 + 4 * j);
            }
            for (kk = 0; kk < len; kk++)
                for (j = 0; j < B / 4; j++) {
                    size_t i = off + kk * B + 4 * j;
                    v4d g = masked4(dy + i, mask ? mask + i : NULL);
                    v4f r = __builtin_convertvector(
                        vk1[j] *
                            (g - vk2[j] - (load4(x + i) - vmu[j]) * vk3[j]),
                        v4f);

                    memcpy(dx + i, &r, sizeof(r));
                }
        }
    });
}

/* ---- dispatch ------------------------------------------------------------ */

/*
 * Each tile worker, specialised for a block size and compiled for AVX2 as
 * well as the baseline (the loader picks one): BN is bound by memory, and
 * 4 doubles a vector keep up with it where 2 do not.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

#define SPECIALISE(B)                                                          \
    CLONES static void tile_sums_##B(                                          \
        const struct mesh_nn_cpu_bn *s, size_t cb, size_t t, const float *x,   \
        const double *shift, int sq, double *part)                             \
    {                                                                          \
        tile_sums(s, B, cb, t, x, shift, sq, part);                            \
    }                                                                          \
    CLONES static void tile_bwd_sums_##B(                                      \
        const struct mesh_nn_cpu_bn *s, size_t cb, size_t t, const float *x,   \
        const float *dy, const uint8_t *mask, const float *mean, double *part) \
    {                                                                          \
        tile_bwd_sums(s, B, cb, t, x, dy, mask, mean, part);                   \
    }                                                                          \
    CLONES static void tile_affine_##B(                                        \
        const struct mesh_nn_cpu_bn *s, size_t cb, size_t t, const float *x,   \
        float *y, const double *mu, const double *alpha, const double *beta,   \
        int relu, uint8_t *mask)                                               \
    {                                                                          \
        tile_affine(s, B, cb, t, x, y, mu, alpha, beta, relu, mask);           \
    }                                                                          \
    CLONES static void tile_dx_##B(const struct mesh_nn_cpu_bn *s, size_t cb,  \
                                   size_t t, const float *x, const float *dy,  \
                                   const uint8_t *mask, const float *mean,     \
                                   const double *k, float *dx)                 \
    {                                                                          \
        tile_dx(s, B, cb, t, x, dy, mask, mean, k, dx);                        \
    }

SPECIALISE(16)
SPECIALISE(8)
SPECIALISE(1)

/* Run fn over every (channel block, tile), in parallel. (clang-format
 * would put the pragma and the loop on one line.) */
// clang-format off
#define PARALLEL_TILES(s, fn_call)                                             \
    do {                                                                       \
        long ncb_ = (long)((s)->c / (s)->block);                               \
        long nt_ = (long)tiles_per_block(s);                                   \
        long it_;                                                              \
        _Pragma("omp parallel for schedule(static)")                           \
        for (it_ = 0; it_ < ncb_ * nt_; it_++) {                               \
            size_t cb = (size_t)(it_ / nt_), t = (size_t)(it_ % nt_);          \
            fn_call;                                                           \
        }                                                                      \
    } while (0)
// clang-format on

static void sums(const struct mesh_nn_cpu_bn *s, const float *x,
                 const double *shift, int sq, double *part)
{
    switch (s->block) {
    case 16:
        PARALLEL_TILES(s, tile_sums_16(s, cb, t, x, shift, sq, part));
        break;
    case 8:
        PARALLEL_TILES(s, tile_sums_8(s, cb, t, x, shift, sq, part));
        break;
    default:
        PARALLEL_TILES(s, tile_sums_1(s, cb, t, x, shift, sq, part));
        break;
    }
}

static void bwd_sums(const struct mesh_nn_cpu_bn *s, const float *x,
                     const float *dy, const uint8_t *mask, const float *mean,
                     double *part)
{
    switch (s->block) {
    case 16:
        PARALLEL_TILES(s, tile_bwd_sums_16(s, cb, t, x, dy, mask, mean, part));
        break;
    case 8:
        PARALLEL_TILES(s, tile_bwd_sums_8(s, cb, t, x, dy, mask, mean, part));
        break;
    default:
        PARALLEL_TILES(s, tile_bwd_sums_1(s, cb, t, x, dy, mask, mean, part));
        break;
    }
}

static void affine(const struct mesh_nn_cpu_bn *s, const float *x, float *y,
                   const double *mu, const double *alpha, const double *beta,
                   int relu, uint8_t *mask)
{
    switch (s->block) {
    case 16:
        PARALLEL_TILES(
            s, tile_affine_16(s, cb, t, x, y, mu, alpha, beta, relu, mask));
        break;
    case 8:
        PARALLEL_TILES(
            s, tile_affine_8(s, cb, t, x, y, mu, alpha, beta, relu, mask));
        break;
    default:
        PARALLEL_TILES(
            s, tile_affine_1(s, cb, t, x, y, mu, alpha, beta, relu, mask));
        break;
    }
}

static void dxpass(const struct mesh_nn_cpu_bn *s, const float *x,
                   const float *dy, const uint8_t *mask, const float *mean,
                   const double *k, float *dx)
{
    switch (s->block) {
    case 16:
        PARALLEL_TILES(s, tile_dx_16(s, cb, t, x, dy, mask, mean, k, dx));
        break;
    case 8:
        PARALLEL_TILES(s, tile_dx_8(s, cb, t, x, dy, mask, mean, k, dx));
        break;
    default:
        PARALLEL_TILES(s, tile_dx_1(s, cb, t, x, dy, mask, mean, k, dx));
        break;
    }
}

/* ---- the three ops ------------------------------------------------------- */

/* ws: the tiles' partial sums, per-channel totals, then 3 per channel. */
struct bn_ws {
    double *part, *tot, *mu, *al, *be;
};

static struct bn_ws ws_split(const struct mesh_nn_cpu_bn *s, void *ws)
{
    struct bn_ws w;

    w.part = ws;
    w.tot = w.part + tiles_per_block(s) * 2 * (size_t)s->c;
    w.mu = w.tot + 2 * (size_t)s->c;
    w.al = w.mu + s->c;
    w.be = w.al + s->c;
    return w;
}

void mesh_nn_cpu_bn_fwd_train(const struct mesh_nn_cpu_bn *s, const float *x,
                              float *y, const float *gamma, const float *beta,
                              float *running_mean, float *running_var,
                              float momentum, float *save, void *reserve,
                              void *ws)
{
    struct bn_ws w = ws_split(s, ws);
    double cnt = (double)s->n * s->hw;
    int c;

    /*
     * Two passes, as PyTorch's CPU kernel: the mean, then the sum of
     * squared deviations from it (no cancellation).
     */
    sums(s, x, NULL, 0, w.part);
    combine(s, w.part, w.tot);
    for (c = 0; c < s->c; c++)
        w.mu[c] = w.tot[2 * c] / cnt;
    sums(s, x, w.mu, 1, w.part);
    combine(s, w.part, w.tot);
    for (c = 0; c < s->c; c++) {
        double q = w.tot[2 * c + 1], var = q / cnt;

        /* running statistics as PyTorch's: unbiased variance, in double */
        running_mean[c] = (float)((1.0 - momentum) * running_mean[c] +
                                  (double)momentum * w.mu[c]);
        running_var[c] =
            (float)((1.0 - momentum) * running_var[c] +
                    (double)momentum * (cnt > 1 ? q / (cnt - 1) : var));
        save[c] = (float)w.mu[c];
        save[s->c + c] = (float)(1.0 / sqrt(var + (double)s->eps));
    }
    /* the affine map from the saved (float) statistics, as backward sees */
    for (c = 0; c < s->c; c++) {
        w.mu[c] = save[c];
        w.al[c] = (double)gamma[c] * save[s->c + c];
        w.be[c] = beta[c];
    }
    affine(s, x, y, w.mu, w.al, w.be, s->relu, reserve);
}

void mesh_nn_cpu_bn_fwd_infer(const struct mesh_nn_cpu_bn *s, const float *x,
                              float *y, const float *gamma, const float *beta,
                              const float *running_mean,
                              const float *running_var, void *ws)
{
    struct bn_ws w = ws_split(s, ws);
    int c;

    for (c = 0; c < s->c; c++) {
        w.mu[c] = running_mean[c];
        w.al[c] = (double)gamma[c] / sqrt((double)running_var[c] + s->eps);
        w.be[c] = beta[c];
    }
    affine(s, x, y, w.mu, w.al, w.be, s->relu, NULL);
}

void mesh_nn_cpu_bn_bwd(const struct mesh_nn_cpu_bn *s, const float *x,
                        const float *dy, const float *gamma, const float *save,
                        const void *reserve, float *dx, float *dgamma,
                        float *dbeta, void *ws)
{
    struct bn_ws w = ws_split(s, ws);
    double cnt = (double)s->n * s->hw, *tot = w.tot;
    const uint8_t *mask = s->relu ? reserve : NULL;
    double *k = w.mu; /* (gamma * inv, mean(dy'), ...) per channel: 3 c */
    int c;

    bwd_sums(s, x, dy, mask, save, w.part);
    combine(s, w.part, tot);
    for (c = 0; c < s->c; c++) {
        double inv = save[s->c + c];
        double sdy = tot[2 * c], sdx = tot[2 * c + 1];

        dbeta[c] = (float)sdy;
        dgamma[c] = (float)(sdx * inv);
        k[3 * c] = (double)gamma[c] * inv;
        k[3 * c + 1] = sdy / cnt;
        k[3 * c + 2] = sdx * inv * inv / cnt;
    }
    dxpass(s, x, dy, mask, save, k, dx);
}

void mesh_nn_cpu_bn_bwd_frozen(const struct mesh_nn_cpu_bn *s, const float *y,
                               const float *dy, const float *gamma,
                               const float *running_var, float *dx)
{
    const long B = s->block, hw = s->hw, nb = (s->c + B - 1) / B;
    const long total = (long)s->n * nb * hw * B;
    long i;

    /* element i is (n, cb, pos, l) of ((n * nb + cb) * hw + pos) * B + l;
     * one multiply per element, the same for any thread count */
#pragma omp parallel for schedule(static)
    for (i = 0; i < total; i++) {
        long c = (i / (B * hw)) % nb * B + i % B;
        double k;

        if (c >= s->c)
            continue; /* a padded channel of the last block */
        k = (double)gamma[c] / sqrt((double)running_var[c] + s->eps);
        dx[i] = s->relu && !(y[i] > 0.f) ? 0.f : (float)(dy[i] * k);
    }
}
