/*
 * tests/nn_ref.h: naive reference loops (double precision, plain NCHW) for
 * the nn op tests, and the helpers the nn tests share. Header-only; the
 * product never uses these.
 */
#ifndef MESH_TESTS_NN_REF_H
#define MESH_TESTS_NN_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define IDX4(a, b, c, d, B, C, D)                                              \
    ((((size_t)(a) * (B) + (b)) * (C) + (c)) * (D) + (d))

static uint64_t ref_rng_state = 88172645463325252ULL;

static inline double ref_unif(void) /* in [-1, 1) */
{
    ref_rng_state ^= ref_rng_state << 13;
    ref_rng_state ^= ref_rng_state >> 7;
    ref_rng_state ^= ref_rng_state << 17;
    return (double)(ref_rng_state >> 11) / 4503599627370496.0 - 1.0;
}

static inline void ref_fill(double *d, size_t n, double scale)
{
    size_t i;

    for (i = 0; i < n; i++)
        d[i] = scale * ref_unif();
}

static inline double *ref_new(size_t n)
{
    double *d = calloc(n ? n : 1, sizeof(double));

    if (!d)
        abort();
    return d;
}

static inline float *ref_newf(size_t n)
{
    float *d = calloc(n ? n : 1, sizeof(float));

    if (!d)
        abort();
    return d;
}

static inline void ref_tof(const double *d, float *f, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        f[i] = (float)d[i];
}

static inline void ref_tod(const float *f, double *d, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        d[i] = f[i];
}

/*
 * Relative error max|a - b| / max|b|, b given as doubles (bd) or as floats
 * (bf, when bd is NULL): normalising by the largest reference magnitude
 * (not element-wise) keeps entries that are near zero by cancellation from
 * dominating, while still measuring the error on the scale of the tensor;
 * 0/0 is 0, a NaN difference infinity.
 */
static inline double ref_relerr(const float *a, const double *bd,
                                const float *bf, size_t n)
{
    double md = 0, mb = 0;
    size_t i;

    for (i = 0; i < n; i++) {
        double b = bd ? bd[i] : bf[i];
        double d = fabs((double)a[i] - b);

        if (d > md || d != d)
            md = d != d ? INFINITY : d;
        if (fabs(b) > mb)
            mb = fabs(b);
    }
    return mb > 0 ? md / mb : md;
}

static inline double ref_relerr_fd(const float *a, const double *b, size_t n)
{
    return ref_relerr(a, b, NULL, n);
}

static inline double ref_relerr_ff(const float *a, const float *b, size_t n)
{
    return ref_relerr(a, NULL, b, n);
}

/* ---- convolution: x (n, c, h, w), w (k, c, r, r), y (n, k, oh, ow) ------- */

struct ref_conv {
    int n, c, h, w, k, r, stride, pad, oh, ow;
};

static inline void ref_conv_fwd(const struct ref_conv *s, const double *x,
                                const double *w, double *y)
{
    int n, k, oy, ox, c, i, j;

    for (n = 0; n < s->n; n++)
        for (k = 0; k < s->k; k++)
            for (oy = 0; oy < s->oh; oy++)
                for (ox = 0; ox < s->ow; ox++) {
                    double acc = 0;

                    for (c = 0; c < s->c; c++)
                        for (i = 0; i < s->r; i++)
                            for (j = 0; j < s->r; j++) {
                                int iy = oy * s->stride - s->pad + i;
                                int ix = ox * s->stride - s->pad + j;

                                if (iy < 0 || iy >= s->h || ix < 0 ||
                                    ix >= s->w)
                                    continue;
                                acc += x[IDX4(n, c, iy, ix, s->c, s->h, s->w)] *
                                       w[IDX4(k, c, i, j, s->c, s->r, s->r)];
                            }
                    y[IDX4(n, k, oy, ox, s->k, s->oh, s->ow)] = acc;
                }
}

/* dx and dw from dy (both zeroed here). */
static inline void ref_conv_bwd(const struct ref_conv *s, const double *x,
                                const double *w, const double *dy, double *dx,
                                double *dw)
{
    int n, k, oy, ox, c, i, j;

    memset(dx, 0, (size_t)s->n * s->c * s->h * s->w * sizeof(double));
    memset(dw, 0, (size_t)s->k * s->c * s->r * s->r * sizeof(double));
    for (n = 0; n < s->n; n++)
        for (k = 0; k < s->k; k++)
            for (oy = 0; oy < s->oh; oy++)
                for (ox = 0; ox < s->ow; ox++) {
                    double g = dy[IDX4(n, k, oy, ox, s->k, s->oh, s->ow)];

                    for (c = 0; c < s->c; c++)
                        for (i = 0; i < s->r; i++)
                            for (j = 0; j < s->r; j++) {
                                int iy = oy * s->stride - s->pad + i;
                                int ix = ox * s->stride - s->pad + j;
                                size_t xi, wi;

                                if (iy < 0 || iy >= s->h || ix < 0 ||
                                    ix >= s->w)
                                    continue;
                                xi = IDX4(n, c, iy, ix, s->c, s->h, s->w);
                                wi = IDX4(k, c, i, j, s->c, s->r, s->r);
                                dx[xi] += g * w[wi];
                                dw[wi] += g * x[xi];
                            }
                }
}

/* ---- batch norm (training): x, y (n, c, hw) ------------------------------ */

/* Channel ch's mean and biased variance over the batch and the plane. */
static inline void ref_bn_stats(int n, int c, int hw, const double *x, int ch,
                                double *mean, double *var)
{
    double cnt = (double)n * hw, m = 0, v = 0;
    int i, p;

    for (i = 0; i < n; i++)
        for (p = 0; p < hw; p++)
            m += x[((size_t)i * c + ch) * hw + p];
    m /= cnt;
    for (i = 0; i < n; i++)
        for (p = 0; p < hw; p++) {
            double d = x[((size_t)i * c + ch) * hw + p] - m;

            v += d * d;
        }
    *mean = m;
    *var = v / cnt;
}

static inline void ref_bn_fwd(int n, int c, int hw, const double *x,
                              const double *g, const double *b, double eps,
                              int relu, double *y, double *mean, double *var)
{
    int i, ch, p;

    for (ch = 0; ch < c; ch++) {
        double m, v;

        ref_bn_stats(n, c, hw, x, ch, &m, &v);
        mean[ch] = m;
        var[ch] = v;
        for (i = 0; i < n; i++)
            for (p = 0; p < hw; p++) {
                size_t k = ((size_t)i * c + ch) * hw + p;
                double o = g[ch] * (x[k] - m) / sqrt(v + eps) + b[ch];

                y[k] = relu && o < 0 ? 0 : o;
            }
    }
}

/* dy is the gradient of the (post-ReLU when relu) output y. */
static inline void ref_bn_bwd(int n, int c, int hw, const double *x,
                              const double *g, const double *y,
                              const double *dy_in, double eps, int relu,
                              double *dx, double *dg, double *db)
{
    int i, ch, p;
    double cnt = (double)n * hw;

    for (ch = 0; ch < c; ch++) {
        double m, v, sdy = 0, sdyx = 0, rs;

        ref_bn_stats(n, c, hw, x, ch, &m, &v);
        rs = 1 / sqrt(v + eps);
        for (i = 0; i < n; i++)
            for (p = 0; p < hw; p++) {
                size_t k = ((size_t)i * c + ch) * hw + p;
                double dy = relu && y[k] <= 0 ? 0 : dy_in[k];

                sdy += dy;
                sdyx += dy * (x[k] - m) * rs;
            }
        dg[ch] = sdyx;
        db[ch] = sdy;
        for (i = 0; i < n; i++)
            for (p = 0; p < hw; p++) {
                size_t k = ((size_t)i * c + ch) * hw + p;
                double dy = relu && y[k] <= 0 ? 0 : dy_in[k];
                double xh = (x[k] - m) * rs;

                dx[k] = g[ch] * rs * (dy - sdy / cnt - xh * sdyx / cnt);
            }
    }
}

/* ---- max pool (r x r, stride, pad) and global average pool --------------- */

static inline void ref_maxpool_fwd(int n, int c, int h, int w, int r,
                                   int stride, int pad, int oh, int ow,
                                   const double *x, double *y, int *arg)
{
    int i, ch, oy, ox, a, b;

    for (i = 0; i < n; i++)
        for (ch = 0; ch < c; ch++)
            for (oy = 0; oy < oh; oy++)
                for (ox = 0; ox < ow; ox++) {
                    double best = -INFINITY;
                    int bi = -1;

                    for (a = 0; a < r; a++)
                        for (b = 0; b < r; b++) {
                            int iy = oy * stride - pad + a;
                            int ix = ox * stride - pad + b;
                            size_t k;

                            if (iy < 0 || iy >= h || ix < 0 || ix >= w)
                                continue;
                            k = IDX4(i, ch, iy, ix, c, h, w);
                            if (x[k] > best) {
                                best = x[k];
                                bi = (int)k;
                            }
                        }
                    y[IDX4(i, ch, oy, ox, c, oh, ow)] = best;
                    arg[IDX4(i, ch, oy, ox, c, oh, ow)] = bi;
                }
}

/* ---- fully connected: x (n, c), w (k, c), b (k), y (n, k) ---------------- */

static inline void ref_fc_fwd(int n, int c, int k, const double *x,
                              const double *w, const double *b, double *y)
{
    int i, j, l;

    for (i = 0; i < n; i++)
        for (j = 0; j < k; j++) {
            double acc = b[j];

            for (l = 0; l < c; l++)
                acc += x[(size_t)i * c + l] * w[(size_t)j * c + l];
            y[(size_t)i * k + j] = acc;
        }
}

/* ---- softmax cross-entropy with label smoothing (mean over n) ------------ */

static inline double ref_xent(int n, int k, const double *z, const int32_t *lab,
                              double eps, double *dz)
{
    double total = 0;
    int i, j;

    for (i = 0; i < n; i++) {
        const double *zi = z + (size_t)i * k;
        double m = zi[0], s = 0, lse;

        for (j = 1; j < k; j++)
            m = zi[j] > m ? zi[j] : m;
        for (j = 0; j < k; j++)
            s += exp(zi[j] - m);
        lse = m + log(s);
        for (j = 0; j < k; j++) {
            double t = eps / k + (j == lab[i] ? 1 - eps : 0);

            total += -t * (zi[j] - lse);
            if (dz)
                dz[(size_t)i * k + j] = (exp(zi[j] - lse) - t) / n;
        }
    }
    return total / n;
}

#endif
