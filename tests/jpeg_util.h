/*
 * tests/jpeg_util.h: writing JPEG files, for the programs that feed the
 * imagefolder loader generated images (tests/test_data, bench/data_loader).
 * Built only with libjpeg (HAVE_JPEG).
 */
#ifndef MESH_TESTS_JPEG_UTIL_H
#define MESH_TESTS_JPEG_UTIL_H

#include <stdint.h>

/* Fill row y of a w x h image: w interleaved RGB pixels. Called for
 * y = 0, 1, .., h - 1 in that order. */
typedef void jpeg_util_row_fn(uint8_t *row, int y, int w, int h, void *arg);

/*
 * Write a w x h RGB JPEG of the given quality (libjpeg's 1..100) to path,
 * its rows from fill(row, y, w, h, arg). 0, or a negative code with a
 * message naming path when it cannot be created (libjpeg's own errors end
 * the program, as its default handler does).
 */
int jpeg_util_write(const char *path, int w, int h, int quality,
                    jpeg_util_row_fn *fill, void *arg);

#endif
