/*
 * data/folder.c: imagefolder: the tree of class folders of JPEG files,
 * scanned and sorted at open (decoded later, by data/jpeg.c).
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/array.h"
#include "common/util.h"

#include <dirent.h>
#include <sys/stat.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void data_free_names(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

#ifdef HAVE_JPEG
static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_dir(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has_jpeg_ext(const char *name)
{
    const char *dot = strrchr(name, '.');

    return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

/* Sorted names in dir (not starting with '.'), subdirectories or JPEGs. */
static int list_dir(const char *dir, int want_dirs, char ***out, size_t *nout)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **v = NULL, path[4200];
    size_t n = 0, cap = 0;

    if (!d)
        return mesh_err_errno("imagefolder: open directory %s", dir);
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (want_dirs ? !is_dir(path)
                      : (!has_jpeg_ext(e->d_name) || is_dir(path)))
            continue;
        if (mesh_array_reserve(&v, &cap, n + 1, sizeof(*v), "names") < 0)
            goto oom;
        v[n] = strdup(e->d_name);
        if (!v[n])
            goto oom;
        n++;
    }
    closedir(d);
    if (n > 1) /* qsort's array may not be NULL, even for no names */
        qsort(v, n, sizeof(*v), cmp_str);
    *out = v;
    *nout = n;
    return 0;
oom:
    closedir(d);
    data_free_names(v, n);
    return mesh_err(-ENOMEM, "imagefolder: out of memory listing %s", dir);
}

/* Fill sp from root/<class>/NAME.jpg; classes come from ds (train) or, for
 * the training split, are set from root. */
static int folder_scan(struct mesh_dataset *ds, const char *root,
                       struct split *sp, int set_classes)
{
    char **cls = NULL, **files = NULL, path[8400];
    size_t ncls = 0, nfiles = 0, cap_paths = 0, cap_labels = 0;
    int rc;

    rc = list_dir(root, 1, &cls, &ncls);
    if (rc < 0)
        return rc;
    if (set_classes) {
        if (ncls == 0) {
            rc = mesh_err(-ENOENT, "imagefolder: no class folders in %s", root);
            goto out;
        }
        if (ncls > INT32_MAX) {
            rc = mesh_err(-EINVAL, "imagefolder: too many classes");
            goto out;
        }
        ds->classes = (int)ncls;
        ds->class_names = cls;
        cls = NULL;
        ncls = 0;
    }
    for (size_t c = 0; c < (set_classes ? (size_t)ds->classes : ncls); c++) {
        const char *cname = set_classes ? ds->class_names[c] : cls[c];
        int label = -1;

        for (int k = 0; k < ds->classes; k++)
            if (!strcmp(ds->class_names[k], cname))
                label = k;
        if (label < 0) {
            rc = mesh_err(-EINVAL,
                          "imagefolder: class folder %s/%s has no "
                          "counterpart in the training split",
                          root, cname);
            goto out;
        }
        snprintf(path, sizeof(path), "%s/%s", root, cname);
        rc = list_dir(path, 0, &files, &nfiles);
        if (rc < 0)
            goto out;
        rc = mesh_array_reserve(&sp->paths, &cap_paths, sp->count + nfiles,
                                sizeof(char *), "file paths");
        if (rc == 0)
            rc =
                mesh_array_reserve(&sp->labels, &cap_labels, sp->count + nfiles,
                                   sizeof(int32_t), "labels");
        if (rc < 0) {
            mesh_err_prefix(rc, "imagefolder");
            goto out_files;
        }
        for (size_t f = 0; f < nfiles; f++) {
            size_t len = strlen(root) + strlen(cname) + strlen(files[f]) + 3;
            char *p = malloc(len);

            if (!p) {
                rc = mesh_err(-ENOMEM, "imagefolder: out of memory");
                goto out_files;
            }
            snprintf(p, len, "%s/%s/%s", root, cname, files[f]);
            sp->paths[sp->count] = p;
            sp->labels[sp->count] = label;
            sp->count++;
        }
        data_free_names(files, nfiles);
        files = NULL;
        nfiles = 0;
    }
    if (sp->count) {
        sp->bad = calloc(sp->count, sizeof(atomic_uchar));
        if (!sp->bad) {
            rc = mesh_err(-ENOMEM, "imagefolder: out of memory");
            goto out;
        }
    }
    rc = 0;
out_files:
    data_free_names(files, nfiles);
out:
    data_free_names(cls, ncls);
    return rc;
}
#endif

int data_open_folder(struct mesh_dataset *ds, const char *dir)
{
#ifndef HAVE_JPEG
    (void)ds;
    return mesh_err(-ENOTSUP, "imagefolder:%s: built without libjpeg", dir);
#else
    static const float mean[3] = {0.485f, 0.456f, 0.406f};
    static const float std[3] = {0.229f, 0.224f, 0.225f};
    char train[4200], val[4200];
    int rc;

    ds->name = "imagefolder";
    ds->sc = 3;
    memcpy(ds->mean, mean, sizeof(mean));
    memcpy(ds->std, std, sizeof(std));
    if (!is_dir(dir))
        return mesh_err(-ENOENT, "imagefolder: %s is not a directory", dir);
    ds->root_len = strlen(dir) + 1;
    snprintf(train, sizeof(train), "%s/train", dir);
    snprintf(val, sizeof(val), "%s/val", dir);
    if (is_dir(train)) {
        rc = folder_scan(ds, train, &ds->sp[MESH_DATA_TRAIN], 1);
        if (rc == 0 && is_dir(val))
            rc = folder_scan(ds, val, &ds->sp[MESH_DATA_EVAL], 0);
        else if (rc == 0)
            mesh_warn("imagefolder: %s has no val/ folder: no evaluation "
                      "(top-1/top-5 need %s)",
                      dir, val);
    } else {
        rc = folder_scan(ds, dir, &ds->sp[MESH_DATA_TRAIN], 1);
        if (rc == 0)
            mesh_warn("imagefolder: %s has no train/ folder: its class "
                      "folders are the training split, and there is no "
                      "evaluation (that needs train/ and val/)",
                      dir);
    }
    if (rc == 0 && ds->sp[MESH_DATA_TRAIN].count == 0)
        rc = mesh_err(-ENOENT, "imagefolder: no JPEG files under %s", dir);
    return rc;
#endif
}

/* ---- --predict: every JPEG under a folder ---------------------------------
 */

#ifdef HAVE_JPEG
/* Append the JPEGs under dir (recursively) to sp->paths, unsorted. */
static int predict_walk(const char *dir, struct split *sp, size_t *cap,
                        int depth)
{
    char **names = NULL, path[4200];
    size_t n = 0, i;
    int rc;

    if (depth > 32)
        return mesh_err(-ELOOP, "--predict: %s: folders nested too deep", dir);
    rc = list_dir(dir, 0, &names, &n);
    for (i = 0; rc == 0 && i < n; i++) {
        rc = mesh_array_reserve(&sp->paths, cap, sp->count + 1, sizeof(char *),
                                "--predict: file paths");
        if (rc == 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
            sp->paths[sp->count] = strdup(path);
            if (!sp->paths[sp->count])
                rc = mesh_err(-ENOMEM, "--predict: out of memory");
            else
                sp->count++;
        }
    }
    data_free_names(names, n);
    names = NULL;
    n = 0;
    if (rc == 0)
        rc = list_dir(dir, 1, &names, &n);
    for (i = 0; rc == 0 && i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        rc = predict_walk(path, sp, cap, depth + 1);
    }
    data_free_names(names, n);
    return rc < 0 ? mesh_err_prefix(rc, "--predict") : 0;
}
#endif

int mesh_data_open_predict(const struct mesh_dataset *like, const char *dir,
                           struct mesh_dataset **out)
{
#ifndef HAVE_JPEG
    (void)like;
    (void)out;
    return mesh_err(-ENOTSUP, "--predict %s: built without libjpeg", dir);
#else
    struct mesh_dataset *ds;
    struct split *sp;
    size_t cap = 0;
    int rc, k;

    if (!is_dir(dir))
        return mesh_err(-ENOENT, "--predict %s: not a directory", dir);
    ds = calloc(1, sizeof(*ds));
    if (!ds)
        return mesh_err(-ENOMEM, "--predict: out of memory");
    ds->kind = K_FOLDER;
    ds->name = "predict";
    ds->classes = like->classes;
    ds->sc = 3;
    ds->co = like->co;
    ds->size = like->size;
    memcpy(ds->mean, like->mean, sizeof(ds->mean));
    memcpy(ds->std, like->std, sizeof(ds->std));
    ds->seed = like->seed;
    ds->on_bad = MESH_DATA_BAD_FAIL;
    ds->fit = like->fit;
    ds->whole = like->kind != K_FOLDER;
    ds->root_len = strlen(dir) + 1;
    sp = &ds->sp[MESH_DATA_EVAL];
    rc = predict_walk(dir, sp, &cap, 0);
    if (rc == 0 && sp->count == 0)
        rc =
            mesh_err(-ENOENT, "--predict %s: no JPEG files (.jpg, .jpeg)", dir);
    if (rc == 0) {
        if (sp->count > 1)
            qsort(sp->paths, sp->count, sizeof(*sp->paths), cmp_str);
        sp->labels = calloc(sp->count, sizeof(int32_t));
        sp->bad = calloc(sp->count, sizeof(atomic_uchar));
        if (!sp->labels || !sp->bad)
            rc = mesh_err(-ENOMEM, "--predict: out of memory");
    }
    if (rc == 0 && like->class_names) {
        ds->class_names = calloc((size_t)ds->classes, sizeof(char *));
        for (k = 0; ds->class_names && k < ds->classes; k++)
            if (!(ds->class_names[k] = strdup(like->class_names[k])))
                break;
        if (!ds->class_names || k < ds->classes)
            rc = mesh_err(-ENOMEM, "--predict: out of memory");
    }
    if (rc < 0) {
        mesh_data_close(ds);
        return rc;
    }
    *out = ds;
    return 0;
#endif
}

const char *mesh_data_sample_path(const struct mesh_dataset *ds,
                                  enum mesh_data_split split, size_t index)
{
    const struct split *sp = &ds->sp[split];

    if (!sp->paths || index >= sp->count)
        return NULL;
    return sp->paths[index] + ds->root_len;
}
