/* libjpeg's errors made strict, a JPEG's header, and one window decoded at a DCT scale.
 *
 * Everything here runs without the GIL and keeps no state between calls: read_header and
 * decode_window make a decompress object for each file (libjpeg_window.c says why). */
#ifndef PREFETCH_LIBJPEG_WINDOW_H
#define PREFETCH_LIBJPEG_WINDOW_H

#include <setjmp.h>
#include <stddef.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t declared first */

#include <jpeglib.h>

/* libjpeg's error manager with a way out: `escape` is where `fail` jumps, `message` what
 * libjpeg said. */
typedef struct {
    struct jpeg_error_mgr base;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} strict_errors;

/* Makes every libjpeg error and warning (corrupt data, premature end of data) of `cinfo` a jump
 * to errors->escape with the reason in errors->message: strict, like simplejpeg. */
void use_strict_errors(struct jpeg_decompress_struct *cinfo, strict_errors *errors);

/* The name prefetch gives libjpeg's colour space (simplejpeg's names). */
const char *colorspace_name(J_COLOR_SPACE space);

/* What a JPEG's header says. */
typedef struct {
    JDIMENSION width, height;
    int components;
    J_COLOR_SPACE space;
    int sequential; /* neither progressive nor arithmetic-coded */
} jpeg_info;

/* Reads the header of the JPEG in data[0, size) into `info` with a decompress object of its
 * own: 0, or -1 with libjpeg's reason in errors->message. */
int read_header(const unsigned char *data, size_t size, jpeg_info *info, strict_errors *errors);

/* Decodes rows [top, top + height) and columns [left, left + width) of the image scaled by
 * 1/scale_denom into `out` (height * width * channels bytes), with a decompress object of its
 * own. Returns 0, or -1 with a message in errors->message. */
int decode_window(strict_errors *errors, const unsigned char *data, size_t size, JDIMENSION top,
                  JDIMENSION left, JDIMENSION height, JDIMENSION width, unsigned int scale_denom,
                  int channels, int fast_dct, unsigned char *out);

#endif
