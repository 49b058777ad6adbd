/*
 * tests/test_finetune.c: starting a model from torchvision-named weights
 * (mesh_nn_model_init_from), tensor patterns, and frozen parameters
 * (mesh_nn_model_freeze) in nn and in the gradient buckets.
 * - a saved model loads back bitwise, from F32, F16 and BF16 files, with
 *   num_batches_tracked (I64) or without it;
 *   another class count re-initialises fc, said by name;
 * - every missing, unexpected, mis-shaped or mis-typed tensor is listed
 *   and the model is left as it was; --init-skip's patterns drop tensors;
 * - freezing: frozen params bitwise unchanged by SGD, the other gradients
 *   bitwise those of the unfrozen model where the forward is the same,
 *   frozen BN on running statistics (train forward = eval forward), no
 *   gradient range reported inside the frozen prefix, no bucket holding a
 *   frozen tensor; backward through frozen BNs after trained layers
 *   against finite differences.
 */
#include "config.h"

#include "nn/nn.h"
#include "nn/safetensors.h"
#include "collective/collective.h"
#include "common/dtype.h"
#include "common/util.h"
#include "train/gradsync.h"
#include "train/model.h"
#include "tests/tap.h"
#include "tests/tmpdir.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct mesh_nn_ctx *ctx;
static char dir[256];

static struct mesh_nn_model_cfg cfg(const char *arch, int classes,
                                    uint64_t seed)
{
    struct mesh_nn_model_cfg c = {.arch = arch,
                                  .num_classes = classes,
                                  .in_channels = 1,
                                  .image_size = 8,
                                  .cifar_stem = 1,
                                  .width = 8,
                                  .seed = seed};
    return c;
}

static struct mesh_nn_model *model(const char *arch, int classes, uint64_t seed)
{
    struct mesh_nn_model_cfg c = cfg(arch, classes, seed);
    struct mesh_nn_model *m = NULL;
    int rc = mesh_nn_model_create(ctx, &c, &m);

    if (rc < 0) {
        diag("%s", mesh_err_msg(rc));
        exit(1);
    }
    return m;
}

/* A host copy of a slab. */
static float *slab(struct mesh_nn_model *m, int buffers)
{
    size_t n =
        buffers ? mesh_nn_model_num_buffers(m) : mesh_nn_model_num_params(m);
    float *h = malloc(n * 4 + 4);

    mesh_nn_download(
        ctx, h, buffers ? mesh_nn_model_buffers(m) : mesh_nn_model_params(m),
        n * 4);
    return h;
}

static int same_tensor(struct mesh_nn_model *a, struct mesh_nn_model *b,
                       const char *name)
{
    const struct mesh_nn_tensor *ta = mesh_nn_model_find_tensor(a, name);
    const struct mesh_nn_tensor *tb = mesh_nn_model_find_tensor(b, name);
    float *sa = slab(a, ta->kind), *sb = slab(b, tb->kind);
    int same = ta->count == tb->count &&
               memcmp(sa + ta->offset, sb + tb->offset, ta->count * 4) == 0;

    free(sa), free(sb);
    return same;
}

static int same_slabs(struct mesh_nn_model *a, struct mesh_nn_model *b)
{
    int i, n = mesh_nn_model_num_tensors(a);

    for (i = 0; i < n; i++)
        if (!same_tensor(a, b, mesh_nn_model_tensor(a, i)->name))
            return 0;
    return 1;
}

/* The whole file at path. */
static uint8_t *slurp(const char *path, size_t *len)
{
    uint8_t *buf = NULL;
    size_t cap = 0;

    if (mesh_file_read(path, (size_t)1 << 30, "a test file", &buf, &cap, len) <
        0)
        return NULL;
    return buf;
}

/* Init m from the file at path; rc, *notes (freed by the caller). */
static int init_file(struct mesh_nn_model *m, const char *path,
                     const char *skip, char **notes)
{
    size_t len = 0;
    uint8_t *buf = slurp(path, &len);
    int rc;

    if (!buf)
        return -EIO;
    rc = mesh_nn_model_init_from(m, buf, len, path, skip, notes);
    free(buf);
    return rc;
}

/*
 * Rewrite the safetensors file src to dst: float tensors as dtype, the
 * tensor called drop left out, extra added (F32 [2]), reshape's shape
 * changed to [3], retype's dtype made I32, nbt (num_batches_tracked)
 * left out when no_nbt.
 */
struct edit {
    int dtype;
    const char *drop, *extra, *reshape, *retype;
    int no_nbt;
};

static int rewrite(const char *src, const char *dst, const struct edit *ed)
{
    struct mesh_st_file *f = NULL;
    struct mesh_st_entry *e;
    void **bufs;
    float extra[3] = {1, 2, 3};
    int i, n, ne = 0, rc = mesh_st_open(src, &f);

    if (rc < 0)
        return rc;
    n = mesh_st_count(f);
    e = calloc((size_t)n + 1, sizeof(*e));
    bufs = calloc((size_t)n + 1, sizeof(*bufs));
    for (i = 0; i < n; i++) {
        const struct mesh_st_tensor *t = mesh_st_get(f, i);
        struct mesh_st_entry *x = &e[ne];
        size_t cnt = t->nbytes / mesh_st_dtype_size(t->dtype);

        if (ed->drop && !strcmp(t->name, ed->drop))
            continue;
        if (ed->no_nbt && strstr(t->name, "num_batches_tracked"))
            continue;
        x->name = t->name;
        x->ndim = t->ndim;
        memcpy(x->shape, t->shape, sizeof(x->shape));
        x->dtype = t->dtype;
        x->data = mesh_st_data(f, t);
        if (t->dtype == MESH_DT_F32 && ed->dtype != MESH_DT_F32) {
            bufs[i] = malloc(cnt * 2 + 2);
            mesh_convert(ed->dtype, bufs[i], MESH_DT_F32, x->data, cnt);
            x->dtype = ed->dtype;
            x->data = bufs[i];
        }
        if (ed->reshape && !strcmp(t->name, ed->reshape)) {
            x->ndim = 1;
            x->shape[0] = 3;
            x->dtype = MESH_DT_F32;
            x->data = extra;
        }
        if (ed->retype && !strcmp(t->name, ed->retype))
            x->dtype = MESH_ST_I32; /* same element size as F32 */
        ne++;
    }
    if (ed->extra) {
        e[ne].name = ed->extra;
        e[ne].dtype = MESH_DT_F32;
        e[ne].ndim = 1;
        e[ne].shape[0] = 2;
        e[ne].data = extra;
        ne++;
    }
    rc = mesh_st_write(dst, e, ne, NULL);
    for (i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(e);
    mesh_st_close(f);
    return rc;
}

/* diag() of each line of s. */
static void diag_lines(const char *s)
{
    while (s && *s) {
        size_t len = strcspn(s, "\n");

        diag("%.*s", (int)len, s);
        s += len;
        if (*s == '\n')
            s++;
    }
}

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

/* ---- loading ------------------------------------------------------------- */

static void test_roundtrip(const char *a_path)
{
    struct mesh_nn_model *a = model("resnet18", 10, 1);
    struct mesh_nn_model *b = model("resnet18", 10, 2);
    char *notes = NULL;
    int rc;

    mesh_nn_model_set_batches_tracked(a, 5);
    rc = mesh_nn_model_save(a, a_path);
    ok(rc == 0, "saved model A");
    ok(!same_slabs(a, b), "models of seeds 1 and 2 differ");
    rc = init_file(b, a_path, NULL, &notes);
    ok(rc == 0 && same_slabs(a, b) && mesh_nn_model_batches_tracked(b) == 5,
       "F32 file: every tensor bitwise, num_batches_tracked 5 (rc %d)", rc);
    ok(notes == NULL, "nothing skipped or re-initialised, no notes");
    free(notes);
    mesh_nn_model_destroy(b);
    mesh_nn_model_destroy(a);
}

/* F16 and BF16 files give A's params rounded to them. */
static void test_half(const char *a_path, int dtype, const char *what)
{
    struct mesh_nn_model *a = model("resnet18", 10, 1);
    struct mesh_nn_model *b = model("resnet18", 10, 2);
    struct edit ed = {.dtype = dtype};
    char p[300], *notes = NULL;
    size_t n = mesh_nn_model_num_params(a), k, bad = 0;
    float *pa = slab(a, 0), *pb;
    uint16_t *h = malloc(n * 2);
    int rc;

    path_of(p, sizeof(p), what);
    rc = rewrite(a_path, p, &ed);
    if (rc == 0)
        rc = init_file(b, p, NULL, &notes);
    pb = slab(b, 0);
    mesh_convert(dtype, h, MESH_DT_F32, pa, n);
    mesh_convert(MESH_DT_F32, pa, dtype, h, n);
    for (k = 0; k < n; k++)
        bad += memcmp(&pa[k], &pb[k], 4) != 0;
    ok(rc == 0 && bad == 0,
       "%s file: every param is A's rounded to %s (%zu differ, rc %d)", what,
       what, bad, rc);
    free(notes), free(pa), free(pb), free(h);
    mesh_nn_model_destroy(b);
    mesh_nn_model_destroy(a);
}

static void test_classes(const char *a_path)
{
    struct mesh_nn_model *a = model("resnet18", 10, 1);
    struct mesh_nn_model *c = model("resnet18", 7, 3);
    struct mesh_nn_model *fresh = model("resnet18", 7, 3);
    char *notes = NULL;
    int rc = init_file(c, a_path, NULL, &notes);

    ok(rc == 0, "7 classes from a 10-class file: loads (%s)",
       rc ? mesh_err_msg(rc) : "ok");
    ok(notes &&
           strstr(notes, "re-initialised fc.weight: 10 classes in the "
                         "file, 7 in the model") &&
           strstr(notes, "re-initialised fc.bias"),
       "the re-initialised fc is named");
    diag_lines(notes);
    ok(same_tensor(c, fresh, "fc.weight") && same_tensor(c, fresh, "fc.bias"),
       "fc keeps its fresh initialisation");
    ok(same_tensor(c, a, "conv1.weight") &&
           same_tensor(c, a, "layer4.1.bn2.running_var"),
       "the rest comes from the file");
    free(notes);
    mesh_nn_model_destroy(fresh);
    mesh_nn_model_destroy(c);
    mesh_nn_model_destroy(a);
}

static int count_lines(const char *s, const char *prefix)
{
    int n = 0;

    while (s && *s) {
        if (!strncmp(s, prefix, strlen(prefix)))
            n++;
        s = strchr(s, '\n');
        if (s)
            s++;
    }
    return n;
}

static void test_misfit(const char *a_path)
{
    struct mesh_nn_model *b = model("resnet18", 10, 2);
    struct mesh_nn_model *fresh = model("resnet18", 10, 2);
    struct edit ed = {.dtype = MESH_DT_F32,
                      .drop = "layer1.0.conv1.weight",
                      .extra = "head.extra",
                      .reshape = "layer2.0.bn1.bias",
                      .retype = "bn1.weight"};
    char p[300], *notes = NULL;
    int rc;

    path_of(p, sizeof(p), "misfit.st");
    rc = rewrite(a_path, p, &ed);
    if (rc == 0)
        rc = init_file(b, p, NULL, &notes);
    ok(rc == -EINVAL, "a file with four faults is refused (rc %d)", rc);
    diag("%s", mesh_err_msg(rc));
    ok(strstr(mesh_err_msg(rc), "1 tensor(s) missing, 1 unexpected, 2 of "
                                "another shape or dtype") != NULL,
       "the message counts them");
    ok(notes && strstr(notes, "missing layer1.0.conv1.weight\n") &&
           strstr(notes, "unexpected head.extra\n") &&
           strstr(notes, "layer2.0.bn1.bias: shape [3] in the file, [16] "
                         "expected\n") &&
           strstr(notes, "bn1.weight: dtype I32 in the file"),
       "every fault is listed by name");
    diag_lines(notes);
    ok(same_slabs(b, fresh), "the model is left as it was");
    free(notes);
    notes = NULL;

    /* with the faults skipped on purpose, the rest loads */
    rc = init_file(b, p, "layer1.0.conv1,head,layer2.0.bn1,bn1.weight", &notes);
    ok(rc == 0, "--init-skip of the four faults: loads (%s)",
       rc ? mesh_err_msg(rc) : "ok");
    ok(notes && strstr(notes, "kept the fresh initialisation of") &&
           strstr(notes, "ignored 1 tensor(s) of the file that the model "
                         "lacks (--init-skip): head.extra"),
       "what was skipped is said");
    diag_lines(notes);
    ok(same_tensor(b, fresh, "layer1.0.conv1.weight") &&
           same_tensor(b, fresh, "layer2.0.bn1.running_mean") &&
           !same_tensor(b, fresh, "layer2.1.conv1.weight"),
       "skipped tensors fresh, the others loaded");
    free(notes);
    mesh_nn_model_destroy(fresh);
    mesh_nn_model_destroy(b);
}

/* A ResNet-34 file into a ResNet-18: every extra block listed. */
static void test_many(void)
{
    struct mesh_nn_model *a = model("resnet34", 10, 1);
    struct mesh_nn_model *b = model("resnet18", 10, 1);
    struct mesh_st_file *f = NULL;
    char p[300], *notes = NULL;
    int i, want = 0, rc;

    path_of(p, sizeof(p), "r34.st");
    rc = mesh_nn_model_save(a, p);
    if (rc == 0)
        rc = mesh_st_open(p, &f);
    for (i = 0; rc == 0 && i < mesh_st_count(f); i++)
        want += mesh_nn_model_find_tensor(b, mesh_st_get(f, i)->name) == NULL &&
                !strstr(mesh_st_get(f, i)->name, "num_batches_tracked");
    mesh_st_close(f);
    rc = init_file(b, p, NULL, &notes);
    ok(rc == -EINVAL && count_lines(notes, "unexpected ") >= want && want > 50,
       "ResNet-34 into ResNet-18: all %d extra tensors listed (%d lines)", want,
       count_lines(notes, "unexpected "));
    free(notes);
    mesh_nn_model_destroy(b);
    mesh_nn_model_destroy(a);
}

static void test_nbt(const char *a_path)
{
    struct mesh_nn_model *b = model("resnet18", 10, 2);
    struct edit ed = {.dtype = MESH_DT_BF16, .no_nbt = 1};
    char p[300], *notes = NULL;
    int rc;

    mesh_nn_model_set_batches_tracked(b, 9);
    path_of(p, sizeof(p), "nonbt.st");
    rc = rewrite(a_path, p, &ed);
    if (rc == 0)
        rc = init_file(b, p, NULL, &notes);
    ok(rc == 0 && mesh_nn_model_batches_tracked(b) == 0,
       "BF16 without num_batches_tracked: loads, counter 0 (rc %d)", rc);
    free(notes);
    mesh_nn_model_destroy(b);
}

static void test_patterns(void)
{
    struct mesh_nn_model *m = model("resnet18", 10, 1);
    static const struct {
        const char *pat, *name;
        int want;
    } cases[] = {
        {"layer1", "layer1.0.conv1.weight", 1},
        {"layer1", "layer10.0.conv1.weight", 0},
        {"layer1.0.bn1", "layer1.0.bn1.weight", 1},
        {"layer1.0.bn1", "layer1.0.bn10.weight", 0},
        {"fc.weight", "fc.weight", 1},
        {"fc.weight", "fc.weight2", 0},
        {"x,fc", "fc.bias", 1},
        {"layer*.0.downsample", "layer2.0.downsample.1.bias", 1},
        {"layer*.0.downsample", "layer2.1.conv1.weight", 0},
        {"*.bn2.*", "layer3.1.bn2.running_var", 1},
        {"conv1", "layer1.0.conv1.weight", 0},
        {"layer1, layer2 ", "layer2.1.bn1.bias", 1},
        {" fc", "fc.bias", 1},
    };
    size_t i;
    int rc;

    for (i = 0; i < MESH_ARRAY_SIZE(cases); i++)
        ok(mesh_nn_pattern_match(cases[i].pat, cases[i].name) == cases[i].want,
           "pattern \"%s\" %s \"%s\"", cases[i].pat,
           cases[i].want ? "matches" : "does not match", cases[i].name);
    rc = mesh_nn_pattern_check(m, "--freeze", "layer1,laye2");
    ok(rc == -EINVAL && strstr(mesh_err_msg(rc), "\"laye2\" matches no tensor"),
       "a typo is an error: %s", mesh_err_msg(rc));
    ok(mesh_nn_pattern_check(m, "--freeze", "conv1, bn1, layer1") == 0,
       "spaces around items are ignored");
    rc = mesh_nn_pattern_check(m, "--freeze", "layer1,,fc");
    ok(rc == -EINVAL, "an empty item is an error: %s", mesh_err_msg(rc));
    rc = mesh_nn_pattern_check(m, "--freeze", "layer1, ");
    ok(rc == -EINVAL, "a blank item is an error: %s", mesh_err_msg(rc));
    ok(mesh_nn_pattern_check(m, "--init-skip", "bn1.num_batches_tracked") == 0,
       "num_batches_tracked is a tensor name too");
    mesh_nn_model_destroy(m);
}

/* ---- torchvision's resnet18 as PyTorch saves it -------------------------- */

/* Run finetune_torch.py DIR; its exit status, its last line in last. */
static int run_py(char *last, size_t cap)
{
    const char *top = getenv("top_srcdir");
    char cmd[1024], line[512];
    FILE *p;
    int st;

    last[0] = '\0';
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 '%s/tests/finetune_torch.py' '%s' 2>&1",
             top && *top ? top : ".", dir);
    p = popen(cmd, "r");
    if (!p)
        return -1;
    while (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\n")] = '\0';
        diag("python: %s", line);
        snprintf(last, cap, "%s", line);
    }
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_torch(void)
{
    struct mesh_nn_model_cfg c = {
        .arch = "resnet18", .num_classes = 1000, .image_size = 64, .seed = 1};
    struct mesh_nn_model *m = NULL, *m10 = NULL;
    struct mesh_st_file *io = NULL;
    char p[300], last[512], *notes = NULL;
    int64_t xs[4] = {2, 3, 64, 64}, ls[2] = {2, 1000};
    float *x = malloc(2 * 3 * 64 * 64 * 4), *want = malloc(2000 * 4);
    float *got = malloc(2000 * 4);
    double err = 0, scale = 0;
    int rc, i;

    if (access("/usr/bin/python3", X_OK) != 0) {
        skip("torchvision's resnet18: no /usr/bin/python3");
        goto out;
    }
    rc = run_py(last, sizeof(last));
    if (rc == 77) {
        skip("torchvision's resnet18: /usr/bin/python3: %s", last);
        goto out;
    }
    if (!ok(rc == 0, "PyTorch saves torchvision's resnet18 (exit %d)", rc))
        goto out;
    rc = mesh_nn_model_create(ctx, &c, &m);
    path_of(p, sizeof(p), "tv18.st");
    if (rc == 0)
        rc = init_file(m, p, NULL, &notes);
    ok(rc == 0 && !notes, "it loads into our resnet18 (%s)",
       rc ? mesh_err_msg(rc) : "ok");
    free(notes);
    notes = NULL;
    path_of(p, sizeof(p), "tv18-io.st");
    if (rc == 0)
        rc = mesh_st_open(p, &io);
    if (rc == 0)
        rc = mesh_st_read(io, "x", MESH_DT_F32, xs, 4, x);
    if (rc == 0)
        rc = mesh_st_read(io, "logits", MESH_DT_F32, ls, 2, want);
    if (rc == 0)
        rc = mesh_nn_model_forward(m, 2, x, 0);
    if (rc == 0)
        rc = mesh_nn_model_logits(m, got);
    for (i = 0; rc == 0 && i < 2000; i++) {
        err = fmax(err, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    ok(rc == 0 && scale > 0 && err <= 1e-4 * scale + 1e-5,
       "our evaluation logits are torch's: max error %.3g of %.3g", err, scale);
    c.num_classes = 10;
    rc = mesh_nn_model_create(ctx, &c, &m10);
    path_of(p, sizeof(p), "tv18-bf16.st");
    if (rc == 0)
        rc = init_file(m10, p, NULL, &notes);
    ok(rc == 0 && notes &&
           strstr(notes, "re-initialised fc.weight: 1000 "
                         "classes in the file, 10"),
       "its BF16 copy loads into a 10-class resnet18, fc re-initialised");
    free(notes);
out:
    mesh_st_close(io);
    mesh_nn_model_destroy(m10);
    mesh_nn_model_destroy(m);
    free(x), free(want), free(got);
}

/* ---- freezing ------------------------------------------------------------ */

static float *images(int n, uint64_t seed)
{
    float *x = malloc((size_t)n * 64 * sizeof(float));
    int i;

    for (i = 0; i < n * 64; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
    }
    return x;
}

struct ranges {
    size_t lowest;
    int calls;
};

static int on_ready(void *arg, size_t offset, size_t count)
{
    struct ranges *r = arg;

    (void)count;
    if (offset < r->lowest)
        r->lowest = offset;
    r->calls++;
    return 0;
}

/* One training step of m; the range callback's record in *r. */
static int step(struct mesh_nn_model *m, struct mesh_nn_sgd *s,
                struct ranges *r)
{
    int32_t lab[4] = {1, 3, 5, 7};
    float *x = images(4, 11), loss;
    int rc = mesh_nn_model_forward(m, 4, x, 1);

    if (rc == 0)
        rc = mesh_nn_model_loss(m, lab, 0, &loss);
    if (rc == 0)
        rc = mesh_nn_model_backward(m, 0, r ? on_ready : NULL, r);
    if (rc == 0 && s)
        rc = mesh_nn_sgd_step(s, 0.1f);
    free(x);
    return rc;
}

/* Bitwise equal gradients of every param that b has not frozen. */
static int same_free_grads(struct mesh_nn_model *a, struct mesh_nn_model *b)
{
    size_t n = mesh_nn_model_num_params(a);
    float *ga = malloc(n * 4), *gb = malloc(n * 4);
    int i, same = 1;

    mesh_nn_download(ctx, ga, mesh_nn_model_grads(a), n * 4);
    mesh_nn_download(ctx, gb, mesh_nn_model_grads(b), n * 4);
    for (i = 0; i < mesh_nn_model_num_tensors(a); i++) {
        const struct mesh_nn_tensor *t = mesh_nn_model_tensor(b, i);

        if (t->kind == MESH_NN_PARAM && !t->frozen &&
            memcmp(ga + t->offset, gb + t->offset, t->count * 4) != 0)
            same = 0;
    }
    free(ga), free(gb);
    return same;
}

/* Frozen params bitwise unchanged, every other one changed. */
static void check_moved(struct mesh_nn_model *m, const float *before,
                        const char *what)
{
    float *after = slab(m, 0);
    int i, frozen_moved = 0, free_still = 0, nfrozen = 0;

    for (i = 0; i < mesh_nn_model_num_tensors(m); i++) {
        const struct mesh_nn_tensor *t = mesh_nn_model_tensor(m, i);
        int same;

        if (t->kind != MESH_NN_PARAM)
            continue;
        same = !memcmp(before + t->offset, after + t->offset, t->count * 4);
        nfrozen += t->frozen;
        frozen_moved += t->frozen && !same;
        free_still += !t->frozen && same;
    }
    ok(nfrozen > 0 && frozen_moved == 0 && free_still == 0,
       "%s: %d frozen tensors bitwise unchanged by 3 SGD steps (%d moved), "
       "every other one moved (%d did not)",
       what, nfrozen, frozen_moved, free_still);
    free(after);
}

/* Freezing a conv or fc (no BN) changes no other gradient. */
static void test_freeze_same(const char *pat)
{
    struct mesh_nn_model *a = model("resnet18", 10, 4);
    struct mesh_nn_model *b = model("resnet18", 10, 4);
    struct mesh_nn_sgd_cfg sc = {.momentum = 0.9f, .weight_decay = 1e-4f};
    struct mesh_nn_sgd *s = NULL;
    float *before = slab(b, 0);
    int rc = mesh_nn_model_freeze(b, pat), k;

    if (rc == 0)
        rc = step(a, NULL, NULL);
    if (rc == 0)
        rc = step(b, NULL, NULL);
    ok(rc == 0 && same_free_grads(a, b),
       "--freeze %s: every other gradient bitwise the unfrozen model's", pat);
    rc = mesh_nn_sgd_create(b, &sc, &s);
    for (k = 0; rc == 0 && k < 3; k++)
        rc = step(b, s, NULL);
    ok(rc == 0, "3 steps with momentum and weight decay");
    check_moved(b, before, pat);
    free(before);
    mesh_nn_sgd_destroy(s);
    mesh_nn_model_destroy(b);
    mesh_nn_model_destroy(a);
}

/* The buckets of m: the floats they cover, and whether one holds a
 * frozen tensor. */
static void buckets(struct mesh_nn_model *m, size_t *floats, int *frozen_in)
{
    struct mesh_train_model tm;
    struct mesh_gradsync_opts o = {.ctx = ctx,
                                   .host_slabs = 1,
                                   .nparams = mesh_nn_model_num_params(m),
                                   .bucket_mb = 0.01,
                                   .chunk_mb = 4,
                                   .wire = MESH_DT_F32,
                                   .grad_scale = 1,
                                   .scale = 1};
    struct mesh_gradsync *gs = NULL;
    int i;

    *floats = 0;
    *frozen_in = 0;
    mesh_train_model_nn(m, &tm);
    if (mesh_gradsync_create(&o, &tm, &gs) < 0)
        return;
    for (i = 0; i < mesh_gradsync_num_buckets(gs); i++)
        *floats += mesh_gradsync_bucket_floats(gs, i);
    mesh_gradsync_destroy(gs);
    /* buckets tile [0, nparams) less the frozen tensors exactly when the
     * sum is that and no frozen tensor is split across (checked by sum) */
    for (i = 0; i < mesh_nn_model_num_tensors(m); i++)
        *frozen_in += mesh_nn_model_tensor(m, i)->frozen;
}

static void test_freeze_prefix(const char *pat, const char *first_free)
{
    struct mesh_nn_model *m = model("resnet50", 10, 6);
    struct mesh_nn_sgd_cfg sc = {.momentum = 0.9f, .weight_decay = 1e-4f};
    struct mesh_nn_sgd *s = NULL;
    const struct mesh_nn_tensor *ff;
    struct ranges r = {(size_t)-1, 0};
    size_t all, some, nfz;
    float *before, *buf0, *buf1;
    int rc, k, nf;

    buckets(m, &all, &nf);
    rc = mesh_nn_model_freeze(m, pat);
    ok(rc == 0, "--freeze %s (%s)", pat, rc ? mesh_err_msg(rc) : "ok");
    nfz = mesh_nn_model_frozen_params(m);
    buckets(m, &some, &nf);
    ok(all == mesh_nn_model_num_params(m) && some == all - nfz && nf > 0,
       "the buckets hold %zu of %zu floats: all but the %zu frozen", some, all,
       nfz);
    before = slab(m, 0);
    buf0 = slab(m, 1);
    rc = mesh_nn_sgd_create(m, &sc, &s);
    for (k = 0; rc == 0 && k < 3; k++)
        rc = step(m, s, &r);
    ok(rc == 0, "3 training steps");
    check_moved(m, before, pat);
    ff = mesh_nn_model_find_tensor(m, first_free);
    ok(ff && r.lowest == ff->offset && r.calls > 0,
       "backward stops at the frozen prefix: lowest range at %zu, %s at %zu",
       r.lowest, first_free, ff ? ff->offset : 0);
    buf1 = slab(m, 1);
    {
        const struct mesh_nn_tensor *t =
            mesh_nn_model_find_tensor(m, "bn1.running_mean");
        const struct mesh_nn_tensor *u =
            mesh_nn_model_find_tensor(m, "layer4.0.bn1.running_mean");

        ok(!memcmp(buf0 + t->offset, buf1 + t->offset, t->count * 4) &&
               memcmp(buf0 + u->offset, buf1 + u->offset, u->count * 4),
           "frozen BN keeps its running statistics, a trained one updates");
    }
    free(before), free(buf0), free(buf1);
    mesh_nn_sgd_destroy(s);
    mesh_nn_model_destroy(m);
}

/* Every BN frozen: a training forward is the evaluation forward. */
static void test_freeze_bn_eval(void)
{
    struct mesh_nn_model *m = model("resnet50", 10, 8);
    float *x = images(3, 5), a[30], b[30];
    int rc = mesh_nn_model_freeze(m, "conv1,bn1,layer1,layer2,layer3,layer4");

    if (rc == 0)
        rc = mesh_nn_model_forward(m, 3, x, 0);
    if (rc == 0)
        rc = mesh_nn_model_logits(m, a);
    if (rc == 0)
        rc = mesh_nn_model_forward(m, 3, x, 1);
    if (rc == 0)
        rc = mesh_nn_model_logits(m, b);
    ok(rc == 0 && memcmp(a, b, sizeof(a)) == 0,
       "all but fc frozen: the training forward's logits are the "
       "evaluation's, bitwise");
    free(x);
    mesh_nn_model_destroy(m);
}

/* A frozen layer3 after trained layers: backward runs through its BN
 * (running statistics), layer3 stays, the rest moves. */
static void test_freeze_middle(void)
{
    struct mesh_nn_model *m = model("resnet18", 10, 1);
    struct mesh_nn_sgd_cfg sc = {.momentum = 0.9f, .weight_decay = 1e-4f};
    struct mesh_nn_sgd *s = NULL;
    float *before = slab(m, 0);
    int rc = mesh_nn_model_freeze(m, "layer3"), k;

    ok(rc == 0, "--freeze layer3 (trained layers before it): %s",
       rc ? mesh_err_msg(rc) : "ok");
    if (rc == 0)
        rc = mesh_nn_sgd_create(m, &sc, &s);
    for (k = 0; rc == 0 && k < 3; k++)
        rc = step(m, s, NULL);
    ok(rc == 0, "3 training steps");
    check_moved(m, before, "layer3");
    free(before);
    mesh_nn_sgd_destroy(s);
    mesh_nn_model_destroy(m);
}

static float loss_of(struct mesh_nn_model *m, const float *x,
                     const int32_t *lab)
{
    float l = 0;

    mesh_nn_model_forward(m, 4, x, 1);
    mesh_nn_model_loss(m, lab, 0, &l);
    return l;
}

/*
 * Every BN frozen: the network is a fixed function of the conv weights,
 * and backward through the frozen BNs (their running statistics and
 * ReLU masks) must give its gradient: central differences on the
 * largest coordinate of convs behind several frozen BNs.
 */
static void test_freeze_fd(void)
{
    static const char *const names[] = {"conv1.weight", "layer1.0.conv1.weight",
                                        "layer2.0.downsample.0.weight",
                                        "layer3.1.conv2.weight"};
    struct mesh_nn_model *m = model("resnet18", 10, 12);
    int32_t lab[4] = {1, 3, 5, 7};
    float *x = images(4, 21), *g, *p = mesh_nn_model_params(m);
    size_t np = mesh_nn_model_num_params(m), i;
    double worst = 0;
    int rc = mesh_nn_model_freeze(m, "bn1,*.bn*,*.downsample.1");

    if (rc == 0) {
        loss_of(m, x, lab);
        rc = mesh_nn_model_backward(m, 0, NULL, NULL);
    }
    g = malloc(np * 4);
    mesh_nn_download(ctx, g, mesh_nn_model_grads(m), np * 4);
    for (i = 0; rc == 0 && i < MESH_ARRAY_SIZE(names); i++) {
        const struct mesh_nn_tensor *t = mesh_nn_model_find_tensor(m, names[i]);
        size_t k, best = 0;
        double gmax = 0, h = 1e-3, fd, e;
        float save, v, lp, lm;

        for (k = 0; k < t->count; k++)
            if (fabs(g[t->offset + k]) > gmax) {
                gmax = fabs(g[t->offset + k]);
                best = t->offset + k;
            }
        mesh_nn_download(ctx, &save, p + best, 4);
        v = save + (float)h;
        mesh_nn_upload(ctx, p + best, &v, 4);
        lp = loss_of(m, x, lab);
        v = save - (float)h;
        mesh_nn_upload(ctx, p + best, &v, 4);
        lm = loss_of(m, x, lab);
        mesh_nn_upload(ctx, p + best, &save, 4);
        fd = ((double)lp - lm) / (2 * h);
        e = fabs(fd - g[best]) / fmax(fabs(g[best]), 1e-4);
        diag("%s: analytic %.6g finite difference %.6g", names[i],
             (double)g[best], fd);
        worst = fmax(worst, e);
    }
    ok(rc == 0 && worst <= 3e-2,
       "every BN frozen: conv gradients through them match finite "
       "differences (worst %.3g)",
       worst);
    free(g), free(x);
    mesh_nn_model_destroy(m);
}

int main(void)
{
    char a_path[300];
    int rc;

    rc = mesh_nn_ctx_open("cpu", 1, &ctx);
    if (rc < 0) {
        skip_all("%s", mesh_err_msg(rc));
        return 0;
    }
    if (tmpdir_make(dir, sizeof(dir), "finetune") < 0) {
        skip_all("no temporary directory");
        return 0;
    }
    path_of(a_path, sizeof(a_path), "a.st");
    test_roundtrip(a_path);
    test_half(a_path, MESH_DT_F16, "F16");
    test_half(a_path, MESH_DT_BF16, "BF16");
    test_classes(a_path);
    test_misfit(a_path);
    test_many();
    test_nbt(a_path);
    test_patterns();
    test_torch();
    test_freeze_same("conv1");
    test_freeze_same("fc");
    test_freeze_same("layer2.0.conv1,layer3.1.conv2.weight");
    test_freeze_prefix("conv1,bn1,layer1,layer2", "layer3.0.conv1.weight");
    test_freeze_prefix("conv1,bn1,layer1.0.conv1,layer1.0.bn1",
                       "layer1.0.conv2.weight");
    test_freeze_bn_eval();
    test_freeze_middle();
    test_freeze_fd();
    tmpdir_remove(dir);
    mesh_nn_ctx_close(ctx);
    return done();
}
