/* The entropy floor of a window's decode (prefetch.decode.entropy_decode_rows, in
 * prefetch/decode/_window.py, is its Python entry point; it has no Python twin: it measures
 * libjpeg-turbo's own work).
 *
 * Single-scan (baseline) files: the entropy decoder's decode_mcu with no block buffer (the
 * coefficients are decoded and discarded; what jpeg_skip_scanlines does for whole iMCU rows),
 * MCU row by MCU row. Without libjpeg's internal header, jpeg_skip_scanlines itself, which
 * cannot be asked for the last iMCU row (a skip to the bottom decodes nothing): windows that
 * reach it are read with jpeg_read_coefficients. Progressive and multi-scan files: every scan
 * spans the whole image, so any window's decode pays for all of them: jpeg_read_coefficients
 * (all scans entropy-decoded into coefficient arrays). */
#include "entropy_floor.h"

/* libjpeg's internal header, where installed (Debian's libjpeg-turbo dev package has it): its
 * entropy decoder's decode_mcu lets entropy_rows decode exactly the rows it is asked. */
#ifdef __has_include
#if __has_include(<jpegint.h>)
#define JPEG_INTERNALS
#include <jpegint.h>
#endif
#endif

int entropy_rows(struct jpeg_decompress_struct *cinfo, strict_errors *errors,
                 const unsigned char *data, size_t size, JDIMENSION last_row, JDIMENSION *rows) {
    if (setjmp(errors->escape)) {
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    if (last_row >= cinfo->image_height) {
        snprintf(errors->message, sizeof errors->message,
                 "last_row %u is outside the %ux%u image", (unsigned)last_row,
                 (unsigned)cinfo->image_width, (unsigned)cinfo->image_height);
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    if (jpeg_has_multiple_scans(cinfo)) {
        jpeg_read_coefficients(cinfo);
        *rows = cinfo->image_height;
        jpeg_abort_decompress(cinfo);
        return 0;
    }
    cinfo->do_fancy_upsampling = FALSE; /* no context rows: a skip is whole iMCU rows */
    jpeg_start_decompress(cinfo);
#ifdef JPEG_INTERNALS
    /* A single-scan file's scan is interleaved (an MCU row is an iMCU row) or has one
     * component (an MCU is one block of it). */
    JDIMENSION per_row = (JDIMENSION)DCTSIZE * (JDIMENSION)cinfo->max_v_samp_factor;
    if (cinfo->comps_in_scan == 1) {
        per_row /= (JDIMENSION)cinfo->cur_comp_info[0]->v_samp_factor;
    }
    JDIMENSION mcu_rows = last_row / per_row + 1;
    for (JDIMENSION y = 0; y < mcu_rows && y < cinfo->MCU_rows_in_scan; y++) {
        for (JDIMENSION x = 0; x < cinfo->MCUs_per_row; x++) {
            (*cinfo->entropy->decode_mcu)(cinfo, NULL);
        }
    }
    *rows = mcu_rows * per_row < cinfo->image_height ? mcu_rows * per_row : cinfo->image_height;
#else
    JDIMENSION per_row = (JDIMENSION)DCTSIZE * (JDIMENSION)cinfo->max_v_samp_factor;
    JDIMENSION needed = (last_row / per_row + 1) * per_row;
    if (needed >= cinfo->image_height) {
        jpeg_abort_decompress(cinfo);
        jpeg_mem_src(cinfo, data, (unsigned long)size);
        jpeg_read_header(cinfo, TRUE);
        jpeg_read_coefficients(cinfo);
        needed = cinfo->image_height;
    } else if (jpeg_skip_scanlines(cinfo, needed) != needed) {
        snprintf(errors->message, sizeof errors->message, "could not skip %u rows",
                 (unsigned)needed);
        jpeg_abort_decompress(cinfo);
        return -1;
    }
    *rows = needed;
#endif
    jpeg_abort_decompress(cinfo);
    return 0;
}
