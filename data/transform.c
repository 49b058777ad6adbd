/*
 * data/transform.c: the transforms that make one sample (resampling,
 * RandomResizedCrop, pad-crop-flip, normalisation) and the epoch permutation.
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PERM_KEY 0x7065726dull /* "perm" */

void data_scratch_free(struct scratch *s)
{
    free(s->file);
    free(s->img);
    free(s->xi);
    free(s->xw);
    memset(s, 0, sizeof(*s));
}

/* A uint8 source image: channel k of pixel (x, y) at p[y sy + x sx + k sc]. */
struct img {
    const uint8_t *p;
    int c, h, w;
    ptrdiff_t sc, sy, sx;
};

/* The source region (x, y, w, h; pixel edges) mapped onto the output. */
struct box {
    double x, y, w, h;
};

/*
 * Bilinear resampling of box onto an (co, S, S) float image, with half-pixel
 * centres; a sample position beyond half a pixel outside the source reads
 * 0 (zero padding), inside it clamps to the edge. With box size S and an
 * integer offset this is an exact copy. Then channel mapping and
 * normalisation (out = v a + b per source channel).
 */
static int resample(const struct mesh_dataset *ds, const struct img *src,
                    struct box bx, int flip, struct scratch *scr, float *out)
{
    int S = ds->size, co = ds->co, cs = src->c;
    size_t plane = (size_t)S * S;
    float a[3], b[3], ag = 0, bg = 0;
    double stepx = bx.w / S, stepy = bx.h / S;
    int32_t *x0, *x1;
    float *wx;

    if (!scr->xi) {
        scr->xi = malloc(sizeof(int32_t) * 2 * MAX_SIZE);
        scr->xw = malloc(sizeof(float) * MAX_SIZE);
        if (!scr->xi || !scr->xw)
            return mesh_err(-ENOMEM, "out of memory");
    }
    x0 = scr->xi;
    x1 = scr->xi + MAX_SIZE;
    wx = scr->xw;
    for (int k = 0; k < cs; k++) {
        a[k] = 1.0f / (255.0f * ds->std[k]);
        b[k] = -ds->mean[k] / ds->std[k];
    }
    if (cs == 3 && co == 1) {
        float m =
            0.299f * ds->mean[0] + 0.587f * ds->mean[1] + 0.114f * ds->mean[2];
        float s =
            0.299f * ds->std[0] + 0.587f * ds->std[1] + 0.114f * ds->std[2];

        ag = 1.0f / (255.0f * s);
        bg = -m / s;
    }
    for (int ox = 0; ox < S; ox++) {
        int sx = flip ? S - 1 - ox : ox;
        double fx = bx.x + (sx + 0.5) * stepx - 0.5;

        if (fx < -0.5 || fx > src->w - 0.5) {
            x0[ox] = -1; /* zero padding */
            continue;
        }
        fx = fx < 0 ? 0 : fx > src->w - 1 ? src->w - 1 : fx;
        x0[ox] = (int32_t)fx;
        x1[ox] = MESH_MIN(x0[ox] + 1, src->w - 1);
        wx[ox] = (float)(fx - x0[ox]);
    }
    for (int oy = 0; oy < S; oy++) {
        double fy = bx.y + (oy + 0.5) * stepy - 0.5;
        int inside = !(fy < -0.5 || fy > src->h - 0.5), y0 = 0, y1 = 0;
        float wy = 0;

        if (inside) {
            fy = fy < 0 ? 0 : fy > src->h - 1 ? src->h - 1 : fy;
            y0 = (int)fy;
            y1 = MESH_MIN(y0 + 1, src->h - 1);
            wy = (float)(fy - y0);
        }
        if (inside && cs == 3 && co == 3 && src->sx == 3 && src->sc == 1) {
            /* Interleaved RGB to planar RGB (every JPEG): the hot path,
             * the same arithmetic as below without per-pixel dispatch. */
            const uint8_t *r0 = src->p + y0 * src->sy;
            const uint8_t *r1 = src->p + y1 * src->sy;
            float *o0 = out + (size_t)oy * S, *o1 = o0 + plane,
                  *o2 = o1 + plane;

            for (int ox = 0; ox < S; ox++) {
                int i0 = x0[ox] * 3, i1 = x1[ox] * 3;
                float w = wx[ox], v[3];

                if (x0[ox] < 0) {
                    o0[ox] = b[0];
                    o1[ox] = b[1];
                    o2[ox] = b[2];
                    continue;
                }
                for (int k = 0; k < 3; k++) {
                    float t = r0[i0 + k] + (r0[i1 + k] - r0[i0 + k]) * w;
                    float u = r1[i0 + k] + (r1[i1 + k] - r1[i0 + k]) * w;

                    v[k] = t + (u - t) * wy;
                }
                o0[ox] = v[0] * a[0] + b[0];
                o1[ox] = v[1] * a[1] + b[1];
                o2[ox] = v[2] * a[2] + b[2];
            }
            continue;
        }
        for (int ox = 0; ox < S; ox++) {
            float v[3] = {0, 0, 0};
            size_t o = (size_t)oy * S + ox;

            if (inside && x0[ox] >= 0) {
                const uint8_t *r0 = src->p + y0 * src->sy;
                const uint8_t *r1 = src->p + y1 * src->sy;
                ptrdiff_t i0 = x0[ox] * src->sx, i1 = x1[ox] * src->sx;
                float w = wx[ox];

                for (int k = 0; k < cs; k++) {
                    ptrdiff_t kk = k * src->sc;
                    float t = r0[i0 + kk] + (r0[i1 + kk] - r0[i0 + kk]) * w;
                    float u = r1[i0 + kk] + (r1[i1 + kk] - r1[i0 + kk]) * w;

                    v[k] = t + (u - t) * wy;
                }
            }
            if (cs == co) {
                for (int k = 0; k < co; k++)
                    out[k * plane + o] = v[k] * a[k] + b[k];
            } else if (cs == 1) {
                for (int k = 0; k < co; k++)
                    out[k * plane + o] = v[0] * a[0] + b[0];
            } else {
                out[o] =
                    (0.299f * v[0] + 0.587f * v[1] + 0.114f * v[2]) * ag + bg;
            }
        }
    }
    return 0;
}

#ifdef HAVE_JPEG
/* torchvision's RandomResizedCrop box (scale 0.08-1, ratio 3/4-4/3). */
static struct box random_resized_crop(struct rng *r, int w, int h)
{
    double area = (double)w * h, lr0 = log(3.0 / 4.0), lr1 = log(4.0 / 3.0);
    struct box b;
    double in_ratio = (double)w / h;

    for (int t = 0; t < 10; t++) {
        double target = area * (0.08 + rng_uniform(r) * (1.0 - 0.08));
        double ratio = exp(lr0 + rng_uniform(r) * (lr1 - lr0));
        int cw = (int)lround(sqrt(target * ratio));
        int ch = (int)lround(sqrt(target / ratio));

        if (cw > 0 && ch > 0 && cw <= w && ch <= h) {
            b.y = rng_bounded(r, (uint64_t)(h - ch + 1));
            b.x = rng_bounded(r, (uint64_t)(w - cw + 1));
            b.w = cw;
            b.h = ch;
            return b;
        }
    }
    /* Fallback: the centre crop with the ratio clamped to [3/4, 4/3]. */
    if (in_ratio < 3.0 / 4.0) {
        b.w = w;
        b.h = lround(w / (3.0 / 4.0));
    } else if (in_ratio > 4.0 / 3.0) {
        b.h = h;
        b.w = lround(h * (4.0 / 3.0));
    } else {
        b.w = w;
        b.h = h;
    }
    b.x = (int)((w - b.w) / 2);
    b.y = (int)((h - b.h) / 2);
    return b;
}
#endif

/* Make sample idx (no bad-sample handling). */
static int make_one(struct mesh_dataset *ds, int split, size_t idx,
                    uint64_t epoch, int augment, struct scratch *scr,
                    float *out)
{
    const struct split *sp = &ds->sp[split];
    struct rng r;
    struct img src;
    struct box bx;
    int flip = 0;

    rng_seed(&r, key3(ds->seed, epoch + 1, idx));
    if (ds->kind == K_FOLDER) {
#ifdef HAVE_JPEG
        int w, h, rc = data_jpeg_decode(sp->paths[idx], scr, &w, &h);

        if (rc < 0)
            return rc;
        src = (struct img){scr->img, 3, h, w, 1, (ptrdiff_t)w * 3, 3};
        if (ds->whole && ds->fit == MESH_DATA_FIT_RESIZE) {
            bx = (struct box){0, 0, w, h};
        } else if (ds->whole) {
            bx = (struct box){floor((w - ds->size) / 2.0),
                              floor((h - ds->size) / 2.0), ds->size, ds->size};
        } else if (augment) {
            bx = random_resized_crop(&r, w, h);
            flip = rng_uniform(&r) < 0.5;
        } else {
            double side_short = lround(ds->size * 256.0 / 224.0);
            double scale = side_short / MESH_MIN(w, h);
            double side = ds->size / scale;

            bx = (struct box){(w - side) / 2, (h - side) / 2, side, side};
        }
        return resample(ds, &src, bx, flip, scr, out);
#else
        return mesh_err(-ENOTSUP, "built without libjpeg");
#endif
    }
    {
        size_t img = (size_t)ds->sc * ds->sh * ds->sw;
        size_t slot = ds->kind == K_SYNTHETIC ? idx % SYN_POOL : idx;
        double S = ds->size;

        src = (struct img){sp->pix + slot * img,       ds->sc, ds->sh, ds->sw,
                           (ptrdiff_t)ds->sh * ds->sw, ds->sw, 1};
        if (!augment && ds->sc == ds->co && ds->sh == ds->size &&
            ds->sw == ds->size) {
            /* Native size, no augmentation: normalise only, what
             * resample computes for an identity box, without its cost. */
            size_t plane = (size_t)ds->sh * ds->sw;

            for (int k = 0; k < ds->sc; k++) {
                const uint8_t *p = src.p + k * plane;
                float *o = out + k * plane;
                float a = 1.0f / (255.0f * ds->std[k]);
                float b = -ds->mean[k] / ds->std[k];

                for (size_t i = 0; i < plane; i++)
                    o[i] = p[i] * a + b;
            }
            return 0;
        }
        if (ds->fit == MESH_DATA_FIT_RESIZE)
            bx = (struct box){0, 0, ds->sw, ds->sh};
        else
            bx = (struct box){floor((ds->sw - S) / 2), floor((ds->sh - S) / 2),
                              S, S};
        if (augment) {
            /* Pad 4, random crop, flip: a shift of -4..4 output pixels. */
            double dx = (int)rng_bounded(&r, 9) - 4;
            double dy = (int)rng_bounded(&r, 9) - 4;

            bx.x += dx * bx.w / S;
            bx.y += dy * bx.h / S;
            flip = rng_uniform(&r) < 0.5;
        }
        return resample(ds, &src, bx, flip, scr, out);
    }
}

/* Sample idx, or with skip the next good one after it (wrapping). */
int data_make_sample(struct mesh_dataset *ds, int split, size_t idx,
                     uint64_t epoch, int augment, struct scratch *scr,
                     float *out, int32_t *label)
{
    struct split *sp = &ds->sp[split];
    int rc = 0;

    if (idx >= sp->count)
        return mesh_err(-EINVAL, "sample %zu beyond the %zu of the split", idx,
                        sp->count);
    for (size_t t = 0; t < sp->count; t++) {
        size_t j = (idx + t) % sp->count;

        if (sp->bad && ds->on_bad == MESH_DATA_BAD_SKIP &&
            atomic_load(&sp->bad[j]))
            continue;
        rc = make_one(ds, split, j, epoch, augment, scr, out);
        if (rc == 0) {
            *label = sp->labels[j];
            return 0;
        }
        if (rc == -ENOMEM || ds->on_bad == MESH_DATA_BAD_FAIL || !sp->bad)
            return rc;
        if (!atomic_exchange(&sp->bad[j], 1))
            mesh_warn("%s; skipped (--on-bad-sample skip): using the next "
                      "good sample instead",
                      mesh_err_msg(rc));
    }
    return mesh_err(rc ? rc : -EIO, "%s split of %s: no good sample left",
                    split ? "evaluation" : "training", ds->name);
}

int mesh_data_sample(struct mesh_dataset *ds, enum mesh_data_split split,
                     size_t index, uint64_t epoch, int augment, float *out,
                     int32_t *label)
{
    struct scratch scr = {0};
    int32_t lab = 0;
    int rc;

    if (split != MESH_DATA_TRAIN && split != MESH_DATA_EVAL)
        return mesh_err(-EINVAL, "bad split %d", (int)split);
    rc = data_make_sample(ds, split, index, epoch, augment, &scr, out, &lab);
    data_scratch_free(&scr);
    if (rc == 0)
        *label = lab;
    return rc;
}

void mesh_data_permutation(const struct mesh_dataset *ds, uint64_t epoch,
                           uint32_t *perm)
{
    size_t n = ds->sp[MESH_DATA_TRAIN].count;
    struct rng r;

    rng_seed(&r, key3(ds->seed, PERM_KEY, epoch));
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = n; i-- > 1;) {
        uint32_t j = rng_bounded(&r, i + 1), t = perm[i];

        perm[i] = perm[j];
        perm[j] = t;
    }
}
