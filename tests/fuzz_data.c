/*
 * tests/fuzz_data.c: hostile data files (data/): what --data reads from a
 * folder someone else filled. Byte 0 picks the data set, the rest is its
 * files' bytes:
 *   0: fashion-mnist: u16 (le) L, L bytes of an IDX images file, the
 *      rest an IDX labels file, each as both the train and t10k split
 *      (gzip'ed or plain, by their first bytes);
 *   1: cifar10: the bytes as each of the six batch files;
 *   2: imagefolder: the bytes as DIR/train/a/x.jpg and DIR/val/a/y.jpg.
 * Accepted: every sample (the first 64 of each split) decodes into its
 * shape with a label below the class count, or is refused naming the
 * file (the first refusal is the answer); refused at open: the message
 * names the file (or folder) by path. Either way the input reserved less
 * than a GiB of memory (the process's peak of virtual memory).
 */
#include "config.h"

#include "tests/fuzz.h"
#include "data/data.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char fuzz_name[] = "data";

static int run(const uint8_t *data, size_t len);

static void files(int kind, const uint8_t *d, size_t n)
{
    static const char *const cifar[] = {"data_batch_1.bin", "data_batch_2.bin",
                                        "data_batch_3.bin", "data_batch_4.bin",
                                        "data_batch_5.bin", "test_batch.bin"};

    if (kind == 0) {
        size_t l = n >= 2 ? (size_t)(d[0] | d[1] << 8) : 0;
        const uint8_t *img = d + MESH_MIN(n, 2);

        n -= MESH_MIN(n, 2);
        l = MESH_MIN(l, n);
        fuzz_write("train-images-idx3-ubyte", img, l);
        fuzz_write("t10k-images-idx3-ubyte", img, l);
        fuzz_write("train-labels-idx1-ubyte", img + l, n - l);
        fuzz_write("t10k-labels-idx1-ubyte", img + l, n - l);
    } else if (kind == 1) {
        for (int i = 0; i < 6; i++)
            fuzz_write(cifar[i], d, n);
    } else {
        fuzz_write("train/a/x.jpg", d, n);
        fuzz_write("val/a/y.jpg", d, n);
    }
}

/* The process's peak of virtual memory, in KiB (0: unknown). */
static long vm_peak_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = 0;

    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmPeak: %ld", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    long peak = vm_peak_kib();
    int rc = run(data, len);

    /* what a header claims costs memory only as its bytes arrive: no
     * input here (a few KiB) may reserve a GiB (the largest JPEG, 2^27
     * pixels, is 384 MiB) */
    if (peak && vm_peak_kib() - peak > (1L << 20))
        fuzz_fail("an input of %zu bytes reserved %ld MiB", len,
                  (vm_peak_kib() - peak) >> 10);
    return rc;
}

static int run(const uint8_t *data, size_t len)
{
    static const char *const kinds[] = {"fashion-mnist", "cifar10",
                                        "imagefolder"};
    struct mesh_data_opts o = {0};
    struct mesh_dataset *ds = NULL;
    struct mesh_data_info info;
    char spec[4200];
    const char *dir;
    int kind = len ? data[0] % 3 : 0, rc;

    fuzz_clean();
    dir = fuzz_tmpdir();
    files(kind, data + MESH_MIN(len, 1), len - MESH_MIN(len, 1));
    snprintf(spec, sizeof(spec), "%s:%s", kinds[kind], dir);
    o.spec = spec;
    o.size = kind == 2 ? 16 : 0; /* small samples: quick */
    o.seed = 1;
    mesh_err_clear();
    rc = mesh_data_open(&o, &ds);
    fuzz_answer(rc, (const char *const[]){dir}, 1);
    if (rc < 0)
        return 0;
    mesh_data_get_info(ds, &info);
    if (info.channels < 1 || info.channels > 3 || info.size < 1 ||
        info.classes < 1 || !info.train_count)
        fuzz_fail("accepted with %d channels, size %d, %d classes, %zu "
                  "samples",
                  info.channels, info.size, info.classes, info.train_count);
    for (int s = 0; s < 2 && rc == 0; s++) {
        size_t count = s ? info.eval_count : info.train_count;
        size_t each = (size_t)info.channels * info.size * info.size;
        float *x = malloc(each * sizeof(float));

        if (!x)
            fuzz_fail("out of memory");
        for (size_t i = 0; i < MESH_MIN(count, (size_t)64) && rc == 0; i++) {
            int32_t label = -1;

            mesh_err_clear();
            rc = mesh_data_sample(ds, (enum mesh_data_split)s, i, 0, !s, x,
                                  &label);
            fuzz_answer(rc, (const char *const[]){dir}, 1);
            if (rc == 0 && (label < 0 || label >= info.classes))
                fuzz_fail("sample %zu: label %d of %d classes", i, label,
                          info.classes);
        }
        free(x);
    }
    mesh_data_close(ds);
    return 0;
}
