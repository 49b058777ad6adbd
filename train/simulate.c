/*
 * train/simulate.c: the layer list of a ResNet from its description, the
 * compute profiles, the simulated waits and the per-layer profiler (see
 * train/simulate.h).
 */
#include "config.h"

#include "train/simulate.h"
#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* One layer: a conv, a BN or the fc, with its parameter tensors. */
struct sim_layer {
    char name[48];
    double flops; /* forward, per image */
    int t0, nt;   /* its tensors [t0, t0 + nt) */
    double fwd_s, bwd_s;
};

struct sim_model {
    struct mesh_nn_model_cfg cfg;
    char arch[16];
    struct sim_layer *l;
    int nl;
    size_t lcap;
    struct mesh_nn_tensor *t;
    int nt;
    size_t tcap;
    size_t nparams;
};

struct mesh_sim {
    struct sim_model m;
    double scale;
    size_t real_params;
    float *grads;
    /* --simulate-gpus: the gradients of this process's G simulated GPUs */
    int gpus;
    float *gpu_grads; /* G slabs of m.nparams, GPU g's at g x nparams */
    double fwd_s, bwd_s;
    /* saturation figures */
    double step_late;    /* worst lateness in the current step */
    double step_stretch; /* this step's compute wall time - profiled */
    double *stretches;   /* one per finished step since the last take */
    double *lates;       /* one per finished step since the last take */
    size_t nlates, lates_cap;
    double late_max, cpu_s, cpu0;
};

struct mesh_sim_prof {
    struct sim_model m;
    int batch;
    int *layer_of; /* tensor -> layer */
    double *bwd;   /* per layer, summed over steps after the first */
    double *cur;   /* per layer, this step */
    double fwd, t_last;
    uint64_t steps; /* backward passes recorded (the first one dropped) */
    uint64_t seen;
};

/* ---- the layer list ------------------------------------------------------ */

static double now(void)
{
    return mesh_now_s();
}

static int add_layer(struct sim_model *m, const char *name, double flops)
{
    if (mesh_array_reserve(&m->l, &m->lcap, (size_t)m->nl + 1, sizeof(*m->l),
                           "simulate: layers") < 0)
        return -ENOMEM;
    memset(&m->l[m->nl], 0, sizeof(m->l[m->nl]));
    snprintf(m->l[m->nl].name, sizeof(m->l[m->nl].name), "%s", name);
    m->l[m->nl].flops = flops;
    m->l[m->nl].t0 = m->nt;
    m->nl++;
    return 0;
}

/* A parameter tensor of the last layer; name is the layer's plus suffix. */
static int add_tensor(struct sim_model *m, const char *suffix, int role,
                      int ndim, const int64_t *shape)
{
    struct mesh_nn_tensor *x;
    struct sim_layer *l = &m->l[m->nl - 1];
    size_t count = 1;
    int i;

    if (mesh_array_reserve(&m->t, &m->tcap, (size_t)m->nt + 1, sizeof(*m->t),
                           "simulate: tensors") < 0)
        return -ENOMEM;
    for (i = 0; i < ndim; i++)
        count *= (size_t)shape[i];
    x = &m->t[m->nt];
    *x = (struct mesh_nn_tensor){.kind = MESH_NN_PARAM,
                                 .role = role,
                                 .offset = m->nparams,
                                 .count = count,
                                 .ndim = ndim};
    snprintf(x->name, sizeof(x->name), "%s.%s", l->name, suffix);
    memcpy(x->shape, shape, (size_t)ndim * sizeof(*shape));
    m->nparams += count;
    m->nt++;
    l->nt++;
    return 0;
}

/* conv + its BN; *h is the input side, updated to the output side. */
static int conv_bn(struct sim_model *m, const char *conv, const char *bn,
                   int ci, int co, int k, int stride, int pad, int *h)
{
    int ho = (*h + 2 * pad - k) / stride + 1;
    int64_t ws[4] = {co, ci, k, k}, bs[1] = {co};
    double hw = (double)ho * ho;
    int rc;

    rc = add_layer(m, conv, 2.0 * co * ci * k * k * hw);
    if (rc == 0)
        rc = add_tensor(m, "weight", MESH_NN_ROLE_CONV_WEIGHT, 4, ws);
    /* normalise, scale, shift, ReLU: about 4 operations per element */
    if (rc == 0)
        rc = add_layer(m, bn, 4.0 * co * hw);
    if (rc == 0)
        rc = add_tensor(m, "weight", MESH_NN_ROLE_BN_WEIGHT, 1, bs);
    if (rc == 0)
        rc = add_tensor(m, "bias", MESH_NN_ROLE_BN_BIAS, 1, bs);
    *h = ho;
    return rc;
}

/* build()'s visitor: a conv and its BN; h is the side of the layer's
 * input, hin the side of the block's (where the shortcut starts). */
struct build_walk {
    struct sim_model *m;
    int h, hin;
};

static int build_conv(void *arg, const struct mesh_nn_resnet_conv *c)
{
    struct build_walk *bw = arg;
    int rc;

    if (c->index >= 0 && c->j == 0)
        bw->hin = bw->h;
    if (c->index >= 0 && c->j == c->nconv)
        return conv_bn(bw->m, c->conv, c->bn, c->cin, c->cout, c->k, c->stride,
                       c->pad, &bw->hin);
    rc = conv_bn(bw->m, c->conv, c->bn, c->cin, c->cout, c->k, c->stride,
                 c->pad, &bw->h);
    if (c->index < 0 && !bw->m->cfg.cifar_stem)
        bw->h = (bw->h + 2 - 3) / 2 + 1; /* max pool 3x3 stride 2 */
    return rc;
}

static int build(struct sim_model *m, const struct mesh_nn_model_cfg *cfg)
{
    struct build_walk bw = {.m = m};
    int feat, rc;

    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    mesh_nn_model_cfg_defaults(&m->cfg);
    if (m->cfg.width < 1 || m->cfg.width > 4096 || m->cfg.image_size < 8 ||
        m->cfg.image_size > 4096)
        return mesh_err(-EINVAL,
                        "simulate: width %d or image size %d out "
                        "of range",
                        m->cfg.width, m->cfg.image_size);
    bw.h = m->cfg.image_size;
    rc = mesh_nn_resnet_walk(&m->cfg, build_conv, &bw, &feat);
    if (rc < 0)
        return rc;
    snprintf(m->arch, sizeof(m->arch), "%s", cfg->arch);
    m->cfg.arch = m->arch;
    rc = add_layer(m, "fc", 2.0 * feat * m->cfg.num_classes);
    if (rc == 0) {
        int64_t ws[2] = {m->cfg.num_classes, feat};
        int64_t bs[1] = {m->cfg.num_classes};

        rc = add_tensor(m, "weight", MESH_NN_ROLE_FC_WEIGHT, 2, ws);
        if (rc == 0)
            rc = add_tensor(m, "bias", MESH_NN_ROLE_FC_BIAS, 1, bs);
    }
    return rc;
}

static void model_free(struct sim_model *m)
{
    free(m->l);
    free(m->t);
}

static double total_flops(const struct sim_model *m)
{
    double f = 0;
    int i;

    for (i = 0; i < m->nl; i++)
        f += m->l[i].flops;
    return f;
}

/* ---- profiles ----------------------------------------------------------- */

static void spread(struct sim_model *m, double step_s)
{
    double f = total_flops(m);
    int i;

    for (i = 0; i < m->nl; i++) {
        m->l[i].fwd_s = step_s / 3 * m->l[i].flops / f;
        m->l[i].bwd_s = 2 * step_s / 3 * m->l[i].flops / f;
    }
}

/* A profile has a line per layer: ResNet-152's is under 20 KB. */
#define SIM_CSV_MAX (1 << 20)

static int load_csv(struct sim_model *m, const char *path)
{
    struct stat st;
    FILE *f;
    char line[256];
    int lineno = 0, i, fd, rc;
    char *seen;

    /* never blocks on a FIFO; refuses anything but a regular file */
    rc = mesh_open_input("--simulate-compute", path, 0, &fd, &st);
    if (rc < 0)
        return rc;
    if (st.st_size > SIM_CSV_MAX) {
        close(fd);
        return mesh_err(-EFBIG,
                        "--simulate-compute %s: %lld bytes, more "
                        "than a layer profile's %d",
                        path, (long long)st.st_size, SIM_CSV_MAX);
    }
    f = fdopen(fd, "r");
    if (!f) {
        rc = mesh_err_errno("--simulate-compute %s", path);
        close(fd);
        return rc;
    }
    seen = calloc((size_t)m->nl, 1);
    if (!seen) {
        fclose(f);
        return mesh_err(-ENOMEM, "simulate: out of memory");
    }
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        char name[64];
        double fw, bw;
        int used = 0;

        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            rc = mesh_err(-EINVAL, "%s:%d: line too long", path, lineno);
            break;
        }
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] == '#' || line[0] == 0 || strncmp(line, "layer,", 6) == 0)
            continue;
        if (sscanf(line, "%63[^,],%lf,%lf%n", name, &fw, &bw, &used) != 3 ||
            line[used] != 0 || !isfinite(fw) || !isfinite(bw) || fw < 0 ||
            bw < 0 || fw > 1e6 || bw > 1e6) {
            rc = mesh_err(-EINVAL,
                          "%s:%d: expected \"layer,forward_ms,"
                          "backward_ms\" with times in [0, 1e6]",
                          path, lineno);
            break;
        }
        for (i = 0; i < m->nl; i++)
            if (strcmp(m->l[i].name, name) == 0)
                break;
        if (i == m->nl) {
            rc = mesh_err(-EINVAL, "%s:%d: no layer \"%s\" in %s", path, lineno,
                          name, m->cfg.arch);
            break;
        }
        if (seen[i]) {
            rc = mesh_err(-EINVAL, "%s:%d: layer \"%s\" given twice", path,
                          lineno, name);
            break;
        }
        seen[i] = 1;
        m->l[i].fwd_s = fw / 1000;
        m->l[i].bwd_s = bw / 1000;
    }
    if (rc == 0 && ferror(f))
        rc = mesh_err(-EIO, "%s: read error", path);
    for (i = 0; rc == 0 && i < m->nl; i++)
        if (!seen[i])
            rc = mesh_err(-EINVAL, "%s: no row for layer \"%s\"", path,
                          m->l[i].name);
    free(seen);
    fclose(f);
    return rc;
}

int mesh_sim_create(const struct mesh_nn_model_cfg *cfg, const char *profile,
                    int batch, double scale, struct mesh_sim **out)
{
    struct mesh_sim *s;
    size_t off = 0;
    int i, rc;

    if (!(scale >= 1) || scale > 1e6)
        return mesh_err(-EINVAL, "--simulate-scale %g: must be in [1, 1e6]",
                        scale);
    if (batch < 1)
        return mesh_err(-EINVAL, "simulate: batch %d", batch);
    s = calloc(1, sizeof(*s));
    if (!s)
        return mesh_err(-ENOMEM, "simulate: out of memory");
    rc = build(&s->m, cfg);
    if (rc == 0) {
        if (strcmp(profile, "k80") == 0)
            spread(&s->m, MESH_SIM_K80_STEP_S * batch / 32.0);
        else if (strcmp(profile, "h200") == 0)
            spread(&s->m, MESH_SIM_H200_STEP_S * batch / 32.0);
        else
            rc = load_csv(&s->m, profile);
    }
    if (rc < 0) {
        mesh_sim_destroy(s);
        return rc;
    }
    s->scale = scale;
    s->real_params = s->m.nparams;
    for (i = 0; i < s->m.nt; i++) {
        struct mesh_nn_tensor *x = &s->m.t[i];

        x->count = (size_t)ceil((double)x->count / scale);
        x->offset = off;
        off += x->count;
    }
    s->m.nparams = off;
    for (i = 0; i < s->m.nl; i++) {
        s->fwd_s += s->m.l[i].fwd_s;
        s->bwd_s += s->m.l[i].bwd_s;
    }
    s->grads = calloc(off, sizeof(float));
    if (!s->grads) {
        mesh_sim_destroy(s);
        return mesh_err(-ENOMEM, "simulate: out of memory for %zu floats", off);
    }
    *out = s;
    return 0;
}

void mesh_sim_destroy(struct mesh_sim *s)
{
    if (!s)
        return;
    model_free(&s->m);
    free(s->grads);
    free(s->gpu_grads);
    free(s->lates);
    free(s->stretches);
    free(s);
}

int mesh_sim_num_tensors(const struct mesh_sim *s)
{
    return s->m.nt;
}

const struct mesh_nn_tensor *mesh_sim_tensor(const struct mesh_sim *s, int i)
{
    return i >= 0 && i < s->m.nt ? &s->m.t[i] : NULL;
}

size_t mesh_sim_num_params(const struct mesh_sim *s)
{
    return s->m.nparams;
}
size_t mesh_sim_real_params(const struct mesh_sim *s)
{
    return s->real_params;
}
float *mesh_sim_grads(struct mesh_sim *s)
{
    return s->grads;
}

int mesh_sim_set_gpus(struct mesh_sim *s, int gpus, long first)
{
    size_t n = s->m.nparams, i;
    int g;

    if (gpus < 1 || gpus > MESH_SIM_MAX_GPUS || first < 0)
        return mesh_err(-EINVAL, "--simulate-gpus %d: must be in [1, %d]", gpus,
                        MESH_SIM_MAX_GPUS);
    free(s->gpu_grads);
    s->gpu_grads = NULL;
    s->gpus = gpus;
    if (gpus == 1)
        return 0;
    s->gpu_grads = malloc((size_t)gpus * n * sizeof(float));
    if (!s->gpu_grads)
        return mesh_err(-ENOMEM, "simulate: out of memory for %d x %zu floats",
                        gpus, n);
    /* small integers: every sum of them is exact in float */
    for (g = 0; g < gpus; g++)
        for (i = 0; i < n; i++)
            s->gpu_grads[(size_t)g * n + i] =
                (float)((first + g) % 64 + 1 + (long)(i % 8));
    return 0;
}

uint64_t mesh_sim_grads_hash(const struct mesh_sim *s)
{
    const unsigned char *b = (const unsigned char *)s->grads;
    size_t n = s->m.nparams * sizeof(float), i;
    uint64_t h = 0xcbf29ce484222325ull;

    for (i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

const struct mesh_nn_model_cfg *mesh_sim_config(const struct mesh_sim *s)
{
    return &s->m.cfg;
}

void mesh_sim_step_time(const struct mesh_sim *s, double *fwd, double *bwd)
{
    *fwd = s->fwd_s;
    *bwd = s->bwd_s;
}

/* ---- waits ------------------------------------------------------------- */

/* Sleep until deadline (mesh_now_s() clock); remember how late we woke. */
static void wait_until(struct mesh_sim *s, double deadline)
{
    struct timespec ts;
    double late;

    ts.tv_sec = (time_t)deadline;
    ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
    late = now() - deadline;
    if (late > s->step_late)
        s->step_late = late;
}

int mesh_sim_forward(struct mesh_sim *s)
{
    double t0 = now();

    wait_until(s, t0 + s->fwd_s);
    s->step_stretch += now() - t0 - s->fwd_s;
    return 0;
}

/* The mean of the G simulated GPUs' gradients of a range, into the slab:
 * a sum in GPU order, then one multiplication by 1 / G. */
static void gpus_reduce(struct mesh_sim *s, size_t off, size_t count)
{
    size_t n = s->m.nparams, i;
    float *y = s->grads + off, inv = 1.0f / (float)s->gpus;
    int g;

    memcpy(y, s->gpu_grads + off, count * sizeof(float));
    for (g = 1; g < s->gpus; g++) {
        const float *x = s->gpu_grads + (size_t)g * n + off;

        for (i = 0; i < count; i++)
            y[i] += x[i];
    }
    for (i = 0; i < count; i++)
        y[i] *= inv;
}

int mesh_sim_backward(struct mesh_sim *s, mesh_nn_grad_ready_fn cb, void *arg)
{
    double t0 = now(), t = t0;
    int i, j, rc;

    for (i = s->m.nl - 1; i >= 0; i--) {
        const struct sim_layer *l = &s->m.l[i];

        t += l->bwd_s;
        wait_until(s, t);
        for (j = l->t0 + l->nt - 1; cb && j >= l->t0; j--) {
            if (s->gpu_grads)
                gpus_reduce(s, s->m.t[j].offset, s->m.t[j].count);
            rc = cb(arg, s->m.t[j].offset, s->m.t[j].count);
            if (rc < 0)
                return rc;
        }
    }
    s->step_stretch += now() - t0 - s->bwd_s;
    return 0;
}

static double cpu_now(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) < 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void mesh_sim_step_begin(struct mesh_sim *s)
{
    s->step_late = 0;
    s->step_stretch = 0;
    s->cpu0 = cpu_now();
}

void mesh_sim_step_end(struct mesh_sim *s)
{
    if (s->nlates == s->lates_cap) {
        size_t cap = s->lates_cap ? 2 * s->lates_cap : 64;
        double *p = realloc(s->lates, cap * sizeof(*p));
        double *q = p ? realloc(s->stretches, cap * sizeof(*q)) : NULL;

        if (p)
            s->lates = p;
        if (!q)
            return; /* the figures then cover fewer steps */
        s->stretches = q;
        s->lates_cap = cap;
    }
    s->stretches[s->nlates] = s->step_stretch;
    s->lates[s->nlates++] = s->step_late;
    if (s->step_late > s->late_max)
        s->late_max = s->step_late;
    s->cpu_s += cpu_now() - s->cpu0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

void mesh_sim_stats_take(struct mesh_sim *s, struct mesh_sim_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->steps = s->nlates;
    if (s->nlates) {
        qsort(s->lates, s->nlates, sizeof(double), cmp_double);
        out->late_median_s = s->lates[s->nlates / 2];
        qsort(s->stretches, s->nlates, sizeof(double), cmp_double);
        out->stretch_median_s = s->stretches[s->nlates / 2];
        out->late_max_s = s->late_max;
        out->cpu_per_step_s = s->cpu_s / (double)s->nlates;
    }
    s->nlates = 0;
    s->late_max = 0;
    s->cpu_s = 0;
}

/* ---- the trainer's model ops ------------------------------------------- */

static int sim_forward(void *m, int n, const float *images, int train)
{
    (void)n;
    (void)images;
    (void)train;
    return mesh_sim_forward(m);
}

static int sim_loss(void *m, const int32_t *labels, float smoothing,
                    float *loss)
{
    (void)m;
    (void)labels;
    (void)smoothing;
    *loss = 0;
    return 0;
}

static int sim_backward(void *m, int accumulate, mesh_nn_grad_ready_fn cb,
                        void *arg)
{
    (void)accumulate;
    return mesh_sim_backward(m, cb, arg);
}

static const struct mesh_nn_tensor *sim_tensor(const void *m, int i)
{
    return mesh_sim_tensor(m, i);
}

static const struct mesh_train_model_ops sim_ops = {
    .forward = sim_forward,
    .loss = sim_loss,
    .backward = sim_backward,
    .tensor = sim_tensor,
};

void mesh_sim_model(struct mesh_sim *s, struct mesh_train_model *out)
{
    out->ops = &sim_ops;
    out->m = s;
    out->grads = s->grads;
    out->ntensors = s->m.nt;
}

/* ---- --profile-layers --------------------------------------------------- */

int mesh_sim_prof_create(const struct mesh_nn_model_cfg *cfg, int batch,
                         struct mesh_sim_prof **out)
{
    struct mesh_sim_prof *p = calloc(1, sizeof(*p));
    int i, j, rc;

    if (!p)
        return mesh_err(-ENOMEM, "profile: out of memory");
    rc = build(&p->m, cfg);
    if (rc == 0) {
        p->layer_of = calloc((size_t)p->m.nt, sizeof(int));
        p->bwd = calloc((size_t)p->m.nl, sizeof(double));
        p->cur = calloc((size_t)p->m.nl, sizeof(double));
        if (!p->layer_of || !p->bwd || !p->cur)
            rc = mesh_err(-ENOMEM, "profile: out of memory");
    }
    if (rc < 0) {
        mesh_sim_prof_destroy(p);
        return rc;
    }
    for (i = 0; i < p->m.nl; i++)
        for (j = 0; j < p->m.l[i].nt; j++)
            p->layer_of[p->m.l[i].t0 + j] = i;
    p->batch = batch;
    *out = p;
    return 0;
}

void mesh_sim_prof_destroy(struct mesh_sim_prof *p)
{
    if (!p)
        return;
    model_free(&p->m);
    free(p->layer_of);
    free(p->bwd);
    free(p->cur);
    free(p);
}

void mesh_sim_prof_forward(struct mesh_sim_prof *p, double seconds)
{
    if (p->seen > 0)
        p->fwd += seconds;
}

void mesh_sim_prof_backward_begin(struct mesh_sim_prof *p)
{
    memset(p->cur, 0, (size_t)p->m.nl * sizeof(double));
    p->t_last = now();
}

void mesh_sim_prof_grad(struct mesh_sim_prof *p, size_t offset)
{
    int lo = 0, hi = p->m.nt - 1;
    double t = now();

    /* the tensor that starts at offset (binary search on offsets) */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;

        if (p->m.t[mid].offset <= offset)
            lo = mid;
        else
            hi = mid - 1;
    }
    p->cur[p->layer_of[lo]] += t - p->t_last;
    p->t_last = t;
}

void mesh_sim_prof_backward_end(struct mesh_sim_prof *p)
{
    int i;

    /* the first pass builds plans and touches memory: not recorded */
    if (p->seen++ == 0)
        return;
    for (i = 0; i < p->m.nl; i++)
        p->bwd[i] += p->cur[i];
    p->steps++;
}

int mesh_sim_prof_write(const struct mesh_sim_prof *p, const char *path)
{
    double btot = 0, n = p->steps ? (double)p->steps : 1;
    FILE *f;
    int i;

    if (p->steps == 0)
        return mesh_err(-EINVAL,
                        "--profile-layers %s: needs at least 2 "
                        "steps (the first one is not recorded)",
                        path);
    for (i = 0; i < p->m.nl; i++)
        btot += p->bwd[i];
    f = fopen(path, "w");
    if (!f)
        return mesh_err_errno("--profile-layers %s", path);
    fprintf(f,
            "# meshtrain --profile-layers: %s width %d image %d, batch %d,"
            " %llu steps averaged\n# backward: between nn's gradient-ready "
            "callbacks; forward: the measured total split as backward\n"
            "# batch %d\nlayer,forward_ms,backward_ms\n",
            p->m.cfg.arch, p->m.cfg.width, p->m.cfg.image_size, p->batch,
            (unsigned long long)p->steps, p->batch);
    for (i = 0; i < p->m.nl; i++) {
        double b = p->bwd[i] / n;
        double fw = btot > 0 ? p->fwd / n * p->bwd[i] / btot : 0;

        fprintf(f, "%s,%.6f,%.6f\n", p->m.l[i].name, fw * 1000, b * 1000);
    }
    if (fclose(f) != 0)
        return mesh_err_errno("--profile-layers %s", path);
    return 0;
}
