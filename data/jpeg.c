/*
 * data/jpeg.c: JPEG decoding with libjpeg; a corrupt file is an error
 * naming its byte offset.
 */
#include "config.h"

#include "data/data-internal.h"
#include "common/array.h"
#include "common/util.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#ifdef HAVE_JPEG
#include <jpeglib.h>

#define MAX_PIXELS (1u << 27) /* largest decoded JPEG, pixels */

struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    int warned;
};

static void jerr_exit(j_common_ptr c)
{
    struct jerr *e = (struct jerr *)c->err;

    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* libjpeg only warns about truncated or corrupt data (and then makes up
 * grey pixels): treat the first warning as corruption. */
static void jerr_emit(j_common_ptr c, int level)
{
    struct jerr *e = (struct jerr *)c->err;

    if (level < 0 && !e->warned) {
        c->err->format_message(c, e->msg);
        e->warned = 1;
    }
}

static size_t jpeg_offset(j_decompress_ptr c, const uint8_t *buf, size_t len)
{
    const uint8_t *p;

    if (!c->src)
        return 0;
    p = c->src->next_input_byte;
    /* At end of data libjpeg points at its own fake EOI marker. */
    if (p < buf || p > buf + len)
        return len;
    return (size_t)(p - buf);
}

/* Decode path into sc->img as interleaved RGB (h, w, 3). */
int data_jpeg_decode(const char *path, struct scratch *sc, int *w_out,
                     int *h_out)
{
    struct jpeg_decompress_struct c;
    struct jerr e;
    size_t row;
    int cmyk, rc;

    rc = mesh_file_read(path, (size_t)1 << 30, "a JPEG file", &sc->file,
                        &sc->file_cap, &sc->file_len);
    if (rc < 0)
        return rc;
    memset(&c, 0, sizeof(c));
    c.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = jerr_exit;
    e.pub.emit_message = jerr_emit;
    e.warned = 0;
    if (setjmp(e.jb)) {
        rc = mesh_err(-EIO, "%s: bad JPEG at byte offset %zu: %s", path,
                      jpeg_offset(&c, sc->file, sc->file_len), e.msg);
        jpeg_destroy_decompress(&c);
        return rc;
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, sc->file, (unsigned long)sc->file_len);
    jpeg_read_header(&c, TRUE);
    if (e.warned)
        jerr_exit((j_common_ptr)&c);
    cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
    c.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    if ((uint64_t)c.image_width * c.image_height > MAX_PIXELS) {
        snprintf(e.msg, sizeof(e.msg), "image of %u x %u pixels is too big",
                 c.image_width, c.image_height);
        longjmp(e.jb, 1);
    }
    jpeg_start_decompress(&c);
    row = (size_t)c.output_width * (size_t)c.output_components;
    if (mesh_array_reserve(&sc->img, &sc->img_cap, row * c.output_height, 1,
                           "decoded bytes") < 0) {
        snprintf(e.msg, sizeof(e.msg), "out of memory");
        longjmp(e.jb, 1);
    }
    while (c.output_scanline < c.output_height) {
        JSAMPROW p = sc->img + row * c.output_scanline;

        jpeg_read_scanlines(&c, &p, 1);
        if (e.warned)
            jerr_exit((j_common_ptr)&c);
    }
    jpeg_finish_decompress(&c);
    if (e.warned)
        jerr_exit((j_common_ptr)&c);
    if (cmyk) {
        /* Adobe writes inverted CMYK: R = C K / 255 etc.; in place. */
        size_t n = (size_t)c.output_width * c.output_height;

        for (size_t i = 0; i < n; i++) {
            const uint8_t *s = sc->img + 4 * i;
            uint8_t *d = sc->img + 3 * i;
            unsigned k = s[3], r = s[0] * k / 255, g = s[1] * k / 255,
                     b = s[2] * k / 255;

            d[0] = (uint8_t)r;
            d[1] = (uint8_t)g;
            d[2] = (uint8_t)b;
        }
    }
    *w_out = (int)c.output_width;
    *h_out = (int)c.output_height;
    jpeg_destroy_decompress(&c);
    return 0;
}
#endif
