/*
 * bench/data_loader.c: imagefolder loader throughput (decode + transform)
 * in images/s, to compare with what training consumes. Generates a JPEG
 * set first when DIR has none (--count files of --width x --height,
 * smooth gradients plus noise, quality 90, 10 classes).
 *
 *   bench/data_loader --dir /tmp/jpegs --threads 2 --size 224 --batch 32
 *
 * Prints one line per mode (train: random-resized-crop + flip; eval:
 * resize + centre crop): images, seconds, images/s, and the time the
 * consumer waited.
 */
#include "config.h"

#include "data/data.h"
#include "common/util.h"
#include "tests/jpeg_util.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#ifdef HAVE_JPEG
/* Smooth gradients plus noise from the image's seed. */
static void bench_row(uint8_t *row, int y, int w, int h, void *arg)
{
    unsigned *seed = arg;

    for (int x = 0; x < w; x++) {
        *seed = *seed * 1664525u + 1013904223u;
        row[3 * x] = (uint8_t)((x * 255 / w + (*seed >> 28)) & 255);
        row[3 * x + 1] = (uint8_t)((y * 255 / h + (*seed >> 24 & 15)));
        row[3 * x + 2] = (uint8_t)(((x ^ y) & 127) + (*seed >> 26));
    }
}

static int generate(const char *dir, int count, int w, int h)
{
    char p[4200];
    int rc;

    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return mesh_err_errno("mkdir %s", dir);
    for (int c = 0; c < 10; c++) {
        snprintf(p, sizeof(p), "%s/class%d", dir, c);
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return mesh_err_errno("mkdir %s", p);
    }
    for (int i = 0; i < count; i++) {
        unsigned seed = (unsigned)i;

        snprintf(p, sizeof(p), "%s/class%d/img%05d.jpg", dir, i % 10, i);
        rc = jpeg_util_write(p, w, h, 90, bench_row, &seed);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static double cpu_s(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static int run(struct mesh_dataset *ds, int augment, int threads, int size,
               int batch, int steps, const char *mode)
{
    struct mesh_loader_opts lo = {.split = MESH_DATA_TRAIN,
                                  .batch = batch,
                                  .world = 1,
                                  .threads = threads,
                                  .augment = augment};
    struct mesh_loader *ld;
    struct mesh_batch b;
    double t0, wait = 0, dt, cpu;
    int rc, imgs = 0;

    rc = mesh_loader_create(ds, &lo, &ld);
    if (rc < 0)
        return rc;
    cpu = cpu_s();
    t0 = mesh_now_s();
    for (int s = 0; s < steps; s++) {
        rc = mesh_data_next(ld, &b);
        if (rc < 0)
            break;
        imgs += b.n;
        wait += b.wait_s;
    }
    dt = mesh_now_s() - t0;
    mesh_loader_destroy(ld);
    cpu = cpu_s() - cpu;
    if (rc < 0)
        return rc;
    /* images per CPU-second: what one idle core does, whatever the load. */
    printf("%-5s threads=%d size=%d batch=%d images=%d seconds=%.2f "
           "images/s=%.1f consumer_wait=%.2fs cpu_s=%.2f "
           "images/cpu_s=%.1f\n",
           mode, threads, size, batch, imgs, dt, imgs / dt, wait, cpu,
           imgs / cpu);
    return 0;
}

#endif

#ifndef HAVE_JPEG
int main(void)
{
    fprintf(stderr, "data_loader: built without libjpeg\n");
    return 77;
}
#else
int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"dir", required_argument, NULL, 'd'},
        {"threads", required_argument, NULL, 't'},
        {"size", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'b'},
        {"steps", required_argument, NULL, 'n'},
        {"count", required_argument, NULL, 'c'},
        {"width", required_argument, NULL, 'W'},
        {"height", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = "/tmp/meshtrain-jpegs";
    int threads = 2, size = 224, batch = 32, steps = 0, count = 500;
    int w = 500, h = 375, opt, rc;
    struct mesh_data_opts o = {.seed = 1, .on_bad = MESH_DATA_BAD_FAIL};
    struct mesh_dataset *ds = NULL;
    char spec[4200], probe[4300];
    struct stat st;

    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
        case 'd':
            dir = optarg;
            break;
        case 't':
            threads = atoi(optarg);
            break;
        case 's':
            size = atoi(optarg);
            break;
        case 'b':
            batch = atoi(optarg);
            break;
        case 'n':
            steps = atoi(optarg);
            break;
        case 'c':
            count = atoi(optarg);
            break;
        case 'W':
            w = atoi(optarg);
            break;
        case 'H':
            h = atoi(optarg);
            break;
        default:
            printf("usage: %s [--dir DIR] [--threads N] [--size S] "
                   "[--batch B] [--steps N (default: one epoch)]\n"
                   "       [--count N --width W --height H: the set "
                   "generated when DIR has none]\n",
                   argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (threads < 1 || size < 1 || batch < 1 || count < batch || w < 1 ||
        h < 1) {
        fprintf(stderr, "data_loader: bad arguments\n");
        return 2;
    }
    snprintf(probe, sizeof(probe), "%s/class0", dir);
    if (stat(probe, &st) != 0) {
        double t0 = mesh_now_s();

        rc = generate(dir, count, w, h);
        if (rc < 0) {
            fprintf(stderr, "data_loader: %s\n", mesh_err_msg(rc));
            return 1;
        }
        printf("generated %d JPEGs of %dx%d in %s (%.1f s)\n", count, w, h, dir,
               mesh_now_s() - t0);
    }
    snprintf(spec, sizeof(spec), "imagefolder:%s", dir);
    o.spec = spec;
    o.size = size;
    o.channels = 3;
    rc = mesh_data_open(&o, &ds);
    if (rc < 0) {
        fprintf(stderr, "data_loader: %s\n", mesh_err_msg(rc));
        return 1;
    }
    {
        struct mesh_data_info info;

        mesh_data_get_info(ds, &info);
        if (!steps)
            steps = (int)(info.train_count / (size_t)batch);
    }
    rc = run(ds, 1, threads, size, batch, steps, "train");
    if (rc == 0)
        rc = run(ds, 0, threads, size, batch, steps, "eval");
    mesh_data_close(ds);
    if (rc < 0) {
        fprintf(stderr, "data_loader: %s\n", mesh_err_msg(rc));
        return 1;
    }
    return 0;
}
#endif
