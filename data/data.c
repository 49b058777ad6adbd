/*
 * data/data.c: opening a data set from its --data spec, its info,
 * fingerprint and close.
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/bytes.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define SYN_DEFAULT_COUNT  50000

static int parse_count(const char *s, size_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v == 0 || v > (1ull << 31) || s[0] == '-')
        return mesh_err(-EINVAL,
                        "--data synthetic:%s: the count must be an integer "
                        "from 1 to 2^31",
                        s);
    *out = (size_t)v;
    return 0;
}

/* KIND:DIR, where DIR is required. */
static int open_dir(struct mesh_dataset *ds, const char *kind, const char *arg,
                    int (*open)(struct mesh_dataset *ds, const char *dir))
{
    if (!arg || !*arg)
        return mesh_err(-EINVAL, "--data %s:DIR: DIR is missing", kind);
    return open(ds, arg);
}

/* The format of --data KIND[:ARG]: its source shape, statistics and
 * splits into ds. */
static int open_kind(struct mesh_dataset *ds, const struct mesh_data_opts *o)
{
    const char *spec = o->spec, *colon = strchr(spec, ':');
    const char *arg = colon ? colon + 1 : NULL;
    size_t klen = colon ? (size_t)(colon - spec) : strlen(spec);
    int rc;

    if (klen == 9 && !strncmp(spec, "synthetic", klen)) {
        size_t count = SYN_DEFAULT_COUNT;

        ds->kind = K_SYNTHETIC;
        ds->classes = o->classes ? o->classes : 1000;
        ds->sc = o->channels ? o->channels : 3;
        ds->sh = ds->sw = o->size ? o->size : 224;
        rc = arg ? parse_count(arg, &count) : 0;
        if (rc == 0)
            rc = data_open_synthetic(ds, count);
    } else if (klen == 13 && !strncmp(spec, "fashion-mnist", klen)) {
        ds->kind = K_FMNIST;
        rc = data_open_fmnist(ds, arg && *arg ? arg : DEFAULT_FMNIST_DIR);
    } else if (klen == 7 && !strncmp(spec, "cifar10", klen)) {
        ds->kind = K_CIFAR;
        rc = open_dir(ds, "cifar10", arg, data_open_cifar);
    } else if (klen == 11 && !strncmp(spec, "imagefolder", klen)) {
        ds->kind = K_FOLDER;
        rc = open_dir(ds, "imagefolder", arg, data_open_folder);
    } else {
        rc = mesh_err(-EINVAL,
                      "--data %s: unknown data set (synthetic[:N], "
                      "fashion-mnist[:DIR], cifar10:DIR, imagefolder:DIR)",
                      spec);
    }
    return rc;
}

int mesh_data_open(const struct mesh_data_opts *o, struct mesh_dataset **out)
{
    struct mesh_dataset *ds;
    int rc;

    if (!o->spec || !*o->spec)
        return mesh_err(-EINVAL, "--data: empty data set spec");
    if (o->channels < 0 || o->channels > 3 || o->channels == 2)
        return mesh_err(-EINVAL, "data: %d input channels (1 or 3 expected)",
                        o->channels);
    if (o->size < 0 || o->size > MAX_SIZE)
        return mesh_err(-EINVAL, "data: input size %d out of 1..%d", o->size,
                        MAX_SIZE);
    if (o->classes < 0)
        return mesh_err(-EINVAL, "data: %d classes", o->classes);
    ds = calloc(1, sizeof(*ds));
    if (!ds)
        return mesh_err(-ENOMEM, "out of memory");
    ds->seed = o->seed;
    ds->on_bad = o->on_bad;
    ds->fit = o->fit;
    rc = open_kind(ds, o);
    if (rc < 0) {
        mesh_data_close(ds);
        return rc;
    }
    ds->co = o->channels ? o->channels : ds->sc;
    ds->size = o->size ? o->size : ds->kind == K_FOLDER ? 224 : ds->sh;
    if (ds->sc == 1) {
        ds->mean[1] = ds->mean[2] = ds->mean[0];
        ds->std[1] = ds->std[2] = ds->std[0];
    }
    if (ds->kind != K_FOLDER && ds->kind != K_SYNTHETIC && ds->sh != ds->sw &&
        ds->fit == MESH_DATA_FIT_RESIZE && o->size)
        mesh_warn("data: %s images are %d x %d; resized to a square", ds->name,
                  ds->sh, ds->sw);
    *out = ds;
    return 0;
}

void mesh_data_close(struct mesh_dataset *ds)
{
    if (!ds)
        return;
    for (int s = 0; s < 2; s++) {
        struct split *sp = &ds->sp[s];

        free(sp->labels);
        free(sp->pix);
        if (sp->paths)
            data_free_names(sp->paths, sp->count);
        free(sp->bad);
    }
    if (ds->class_names)
        data_free_names(ds->class_names, (size_t)ds->classes);
    free(ds);
}

void mesh_data_get_info(const struct mesh_dataset *ds,
                        struct mesh_data_info *info)
{
    memset(info, 0, sizeof(*info));
    info->train_count = ds->sp[MESH_DATA_TRAIN].count;
    info->eval_count = ds->sp[MESH_DATA_EVAL].count;
    info->classes = ds->classes;
    info->channels = ds->co;
    info->size = ds->size;
    info->src_channels = ds->sc;
    info->src_height = ds->sh;
    info->src_width = ds->sw;
    memcpy(info->mean, ds->mean, sizeof(info->mean));
    memcpy(info->std, ds->std, sizeof(info->std));
    info->name = ds->name;
}

const char *mesh_data_class_name(const struct mesh_dataset *ds, int k)
{
    static const char *digits[] = {"0", "1", "2", "3", "4",
                                   "5", "6", "7", "8", "9"};

    if (k < 0 || k >= ds->classes)
        return "?";
    if (ds->class_names)
        return ds->class_names[k];
    return k < 10 ? digits[k] : "class";
}

static int fp_u64(EVP_MD_CTX *ctx, uint64_t v)
{
    uint8_t le[8];

    mesh_put_le64(le, v);
    return EVP_DigestUpdate(ctx, le, 8);
}

int mesh_data_fingerprint(const struct mesh_dataset *ds, uint8_t out[32])
{
    size_t img = (size_t)ds->sc * ds->sh * ds->sw;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int olen = 0;
    int ok;

    if (!ctx)
        return mesh_err(-ENOMEM, "data fingerprint: out of memory");
    ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
         EVP_DigestUpdate(ctx, "meshtrain-data 1", 17) &&
         EVP_DigestUpdate(ctx, ds->name, strlen(ds->name) + 1) &&
         fp_u64(ctx, (uint64_t)ds->classes) && fp_u64(ctx, (uint64_t)ds->co) &&
         fp_u64(ctx, (uint64_t)ds->size) && fp_u64(ctx, (uint64_t)ds->sc) &&
         fp_u64(ctx, (uint64_t)ds->sh) && fp_u64(ctx, (uint64_t)ds->sw) &&
         fp_u64(ctx, (uint64_t)ds->fit);
    for (int c = 0; ok && c < 3; c++)
        ok = fp_u64(ctx, (uint64_t)lroundf(ds->mean[c] * 1e6f)) &&
             fp_u64(ctx, (uint64_t)lroundf(ds->std[c] * 1e6f));
    for (int s = 0; ok && s < 2; s++) {
        const struct split *sp = &ds->sp[s];
        size_t pix = ds->kind == K_SYNTHETIC
                         ? MESH_MIN(sp->count, (size_t)SYN_POOL)
                         : sp->count;

        ok = fp_u64(ctx, sp->count);
        for (size_t i = 0; ok && i < sp->count; i++)
            ok = fp_u64(ctx, (uint64_t)(uint32_t)sp->labels[i]);
        if (ok && sp->pix)
            ok = EVP_DigestUpdate(ctx, sp->pix, pix * img);
        for (size_t i = 0; ok && sp->paths && i < sp->count; i++) {
            const char *rel = sp->paths[i] + ds->root_len;

            ok = EVP_DigestUpdate(ctx, rel, strlen(rel) + 1);
        }
    }
    ok = ok && EVP_DigestFinal_ex(ctx, out, &olen);
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : mesh_err(-EIO, "data fingerprint: SHA-256 failed");
}

int mesh_data_parse_bad(const char *s, enum mesh_data_bad *out)
{
    if (!strcmp(s, "skip"))
        *out = MESH_DATA_BAD_SKIP;
    else if (!strcmp(s, "fail"))
        *out = MESH_DATA_BAD_FAIL;
    else
        return mesh_err(-EINVAL, "--on-bad-sample %s: expected skip or fail",
                        s);
    return 0;
}
