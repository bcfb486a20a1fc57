/* The header walk of a JPEG: the C twin of walk_jpeg in prefetch/io/_headers.py. See
 * header_walk.c. */
#ifndef PREFETCH_HEADER_WALK_H
#define PREFETCH_HEADER_WALK_H

#include <stddef.h>

/* What the walk found before the first scan: _headers.JpegHeader, field for field. */
typedef struct {
    int frame;               /* the first frame (SOF) marker, 0 when there is none */
    unsigned long width;     /* of the largest frame (by pixels), 0 when there is none */
    unsigned long height;
    unsigned long frames;    /* frame headers seen */
    unsigned long segments;  /* segments walked, at most max_segments + 1 */
} jpeg_walk;

/* Walks the JPEG in data[0, size) (which starts with SOI) from its start to its first scan,
 * its end or max_segments + 1 segments, as walk_jpeg does; more than max_segments is a refusal
 * for the caller to make. */
void walk_jpeg_header(const unsigned char *data, size_t size, unsigned long max_segments,
                      jpeg_walk *out);

#endif
