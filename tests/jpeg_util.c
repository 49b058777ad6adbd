/* tests/jpeg_util.c: writing JPEG files (see tests/jpeg_util.h). */
#include "config.h"

#include "tests/jpeg_util.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>

#ifdef HAVE_JPEG
#include <jpeglib.h>

int jpeg_util_write(const char *path, int w, int h, int quality,
                    jpeg_util_row_fn *fill, void *arg)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    uint8_t *row = malloc((size_t)w * 3);
    FILE *f = fopen(path, "wb");

    if (!f || !row) {
        free(row);
        if (f)
            fclose(f);
        return mesh_err_errno("create %s", path);
    }
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        fill(row, (int)c.next_scanline, w, h, arg);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
    free(row);
    return 0;
}
#endif
