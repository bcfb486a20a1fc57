/* libjpeg's errors made strict, a JPEG's header, and one window decoded at a DCT scale with
 * libjpeg-turbo (see libjpeg_window.h).
 *
 * The crop path asks for "this window of this file at 1/N of full size". libjpeg-turbo can do
 * exactly that without decoding the rest of the image: scale_denom = N picks its scaled inverse
 * DCTs (N = 1, 2, 4, 8), jpeg_crop_scanline() limits the decoded columns to the iMCU columns
 * that cover the window, and jpeg_skip_scanlines() skips the rows above it; decoding stops after
 * the window's last row. This is what tf.io.decode_and_crop_jpeg and DALI do.
 *
 * Python twin of decode_window, for the files it does not take: _pillow_window in
 * prefetch/decode/_window.py (Pillow at the same DCT scale, the window cut). */
#include "libjpeg_window.h"

#include <stdlib.h>
#include <string.h>

static void fail(j_common_ptr cinfo) {
    strict_errors *errors = (strict_errors *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, errors->message);
    longjmp(errors->escape, 1);
}

/* Warnings (corrupt data, premature end of data) are errors here: strict, like simplejpeg. */
static void warn_or_trace(j_common_ptr cinfo, int level) {
    if (level < 0) {
        fail(cinfo);
    }
}

void use_strict_errors(struct jpeg_decompress_struct *cinfo, strict_errors *errors) {
    cinfo->err = jpeg_std_error(&errors->base);
    errors->base.error_exit = fail;
    errors->base.emit_message = warn_or_trace;
    errors->message[0] = '\0';
}

const char *colorspace_name(J_COLOR_SPACE space) {
    switch (space) {
    case JCS_GRAYSCALE:
        return "Gray";
    case JCS_YCbCr:
        return "YCbCr";
    case JCS_RGB:
        return "RGB";
    case JCS_CMYK:
        return "CMYK";
    case JCS_YCCK:
        return "YCCK";
    default:
        return "unknown";
    }
}

int read_header(const unsigned char *data, size_t size, jpeg_info *info, strict_errors *errors) {
    struct jpeg_decompress_struct cinfo;
    use_strict_errors(&cinfo, errors);
    jpeg_create_decompress(&cinfo);
    if (setjmp(errors->escape)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    info->width = cinfo.image_width;
    info->height = cinfo.image_height;
    info->components = cinfo.num_components;
    info->space = cinfo.jpeg_color_space;
    info->sequential = !cinfo.progressive_mode && !cinfo.arith_code;
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

/* Rows asked of each jpeg_read_scanlines call (libjpeg returns at most a row group per call):
 * fewer calls than one row at a time; the same pixels, measured 0-5% faster per window. */
#define ROWS_PER_READ 16

/* decode_window's work, with the object it made. */
static int read_window(struct jpeg_decompress_struct *cinfo, strict_errors *errors,
                       const unsigned char *data, size_t size, JDIMENSION top, JDIMENSION left,
                       JDIMENSION height, JDIMENSION width, unsigned int scale_denom,
                       int channels, int fast_dct, unsigned char *out) {
    volatile JSAMPROW row = NULL; /* volatile: read after a longjmp back into this frame */
    JSAMPROW rows[ROWS_PER_READ];
    if (setjmp(errors->escape)) {
        free(row);
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    cinfo->out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = scale_denom;
    cinfo->dct_method = fast_dct ? JDCT_IFAST : JDCT_ISLOW;
    jpeg_calc_output_dimensions(cinfo);
    if (left + width > cinfo->output_width || top + height > cinfo->output_height ||
        width == 0 || height == 0) {
        snprintf(errors->message, sizeof errors->message,
                 "window %ux%u at (%u, %u) is outside the %ux%u image at 1/%u",
                 (unsigned)width, (unsigned)height, (unsigned)left, (unsigned)top,
                 (unsigned)cinfo->output_width, (unsigned)cinfo->output_height, scale_denom);
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    jpeg_start_decompress(cinfo);
    /* Columns: a margin of up to 16 columns on each side, then libjpeg widens that to whole
     * iMCU columns (moving its start left). Chroma upsampling at the edge of a cropped
     * scanline repeats the edge pixel, where a full decode blends in its neighbour: with the
     * margin, the window's own columns equal a full decode's. */
    JDIMENSION left_margin = left < 16 ? left : 16;
    JDIMENSION right_room = cinfo->output_width - (left + width);
    JDIMENSION first_column = left - left_margin;
    JDIMENSION columns = left_margin + width + (right_room < 16 ? right_room : 16);
    if (columns < cinfo->output_width) {
        jpeg_crop_scanline(cinfo, &first_column, &columns);
    } else {
        first_column = 0;
        columns = cinfo->output_width;
    }
    size_t row_bytes = (size_t)columns * (size_t)channels;
    size_t skip_bytes = (size_t)(left - first_column) * (size_t)channels;
    size_t out_bytes = (size_t)width * (size_t)channels;
    row = malloc(row_bytes * ROWS_PER_READ);
    if (row == NULL) {
        snprintf(errors->message, sizeof errors->message, "out of memory for %d rows",
                 ROWS_PER_READ);
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    if (top > 0) {
        JDIMENSION skipped = jpeg_skip_scanlines(cinfo, top);
        if (skipped != top) {
            snprintf(errors->message, sizeof errors->message, "skipped %u of %u rows",
                     (unsigned)skipped, (unsigned)top);
            free(row);
            jpeg_abort_decompress(cinfo);
            return -1;
        }
    }
    for (int i = 0; i < ROWS_PER_READ; i++) {
        rows[i] = (JSAMPROW)row + (size_t)i * row_bytes;
    }
    for (JDIMENSION y = 0; y < height;) {
        JDIMENSION wanted = height - y < ROWS_PER_READ ? height - y : ROWS_PER_READ;
        JDIMENSION got = jpeg_read_scanlines(cinfo, rows, wanted);
        if (got == 0) {
            snprintf(errors->message, sizeof errors->message, "no data for row %u",
                     (unsigned)(top + y));
            free(row);
            jpeg_abort_decompress(cinfo);
            return -1;
        }
        for (JDIMENSION i = 0; i < got; i++, y++) {
            memcpy(out + (size_t)y * out_bytes, rows[i] + skip_bytes, out_bytes);
        }
    }
    free(row);
    row = NULL;
    jpeg_abort_decompress(cinfo); /* the rows below the window are never decoded */
    return 0;
}

/* A decompress object for each file, never one shared by several: libjpeg keeps a file's
 * Huffman and quantization tables in the object for the next, so a JPEG without DHT (legal:
 * the standard tables then apply, which a fresh object loads, as Pillow's does) after one with
 * optimized tables would be decoded with those, and one without DQT (which a fresh object
 * refuses, as Pillow does) with the previous file's (issue 40.1). An object costs about 0.2 us
 * to create and destroy (a C loop of 200,000 with libjpeg-turbo 2.1), a window 1-10 ms. */
int decode_window(strict_errors *errors, const unsigned char *data, size_t size, JDIMENSION top,
                  JDIMENSION left, JDIMENSION height, JDIMENSION width, unsigned int scale_denom,
                  int channels, int fast_dct, unsigned char *out) {
    struct jpeg_decompress_struct cinfo;
    use_strict_errors(&cinfo, errors);
    jpeg_create_decompress(&cinfo);
    int status = read_window(&cinfo, errors, data, size, top, left, height, width, scale_denom,
                             channels, fast_dct, out);
    jpeg_destroy_decompress(&cinfo);
    return status;
}
