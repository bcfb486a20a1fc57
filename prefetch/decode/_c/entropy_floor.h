/* The entropy floor: the Huffman decoding of a JPEG's rows down to one, and nothing else. See
 * entropy_floor.c. */
#ifndef PREFETCH_ENTROPY_FLOOR_H
#define PREFETCH_ENTROPY_FLOOR_H

#include "libjpeg_window.h"

/* The entropy (Huffman) decoding of the MCU rows that cover pixel rows [0, last_row], and
 * nothing else: no inverse DCT, upsampling or colour conversion. Sets *rows to the pixel rows
 * covered (whole MCU rows, at most the image's height). Returns 0, or -1 with a message. */
int entropy_rows(struct jpeg_decompress_struct *cinfo, strict_errors *errors,
                 const unsigned char *data, size_t size, JDIMENSION last_row, JDIMENSION *rows);

#endif
