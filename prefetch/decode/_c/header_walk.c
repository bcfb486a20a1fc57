/* The header walk of a JPEG, for the compiled chunk path (which runs without the GIL, so it
 * cannot call the Python walk): the C twin of walk_jpeg in prefetch/io/_headers.py, which every
 * other decoder's bound (prefetch.io.check_image_bytes) uses. The same steps in the same order,
 * so that both report the same frame, size, frame count and segment count for any bytes;
 * tests/test_header_walk.py compares them on every trick and a mutated corpus. A change to one
 * is a change to the other.
 *
 * From after SOI to the first scan (SOS), the end (EOI or the last byte) or max_segments + 1
 * segments: the next marker is an 0xFF followed by a byte that is not 0xFF (a fill byte),
 * 0x00 (a stuffed zero), 0x01 (TEM) or 0xD0-0xD8 (RSTn, SOI), which have no length and are
 * passed over (_NEXT_MARKER in the Python twin); every other marker's segment is skipped by its
 * length as libjpeg skips it (a length under 2 skips nothing past the length itself). memchr
 * finds each 0xFF: linear in the bytes walked. A walk that counts max_segments + 1 segments
 * stops there and the file is refused, not passed (plan_window in chunk.c leaves it to the
 * per-sample path, whose check_image_bytes raises): no run of segments hides a frame. */
#include "header_walk.h"

#include <string.h>

#define SOS 0xDA
#define EOI 0xD9

/* _headers.JPEG_FRAMES: 0xC0-0xCF but DHT (0xC4), JPG (0xC8) and DAC (0xCC). */
static int is_frame(unsigned char marker) {
    return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
           marker != 0xCC;
}

/* Whether the byte after an 0xFF makes it a marker the walk stops at (_NEXT_MARKER). */
static int is_walked(unsigned char marker) {
    return marker != 0x00 && marker != 0x01 && marker != 0xFF &&
           !(marker >= 0xD0 && marker <= 0xD8);
}

void walk_jpeg_header(const unsigned char *data, size_t size, unsigned long max_segments,
                      jpeg_walk *out) {
    memset(out, 0, sizeof *out);
    size_t position = 2;
    while (out->segments <= max_segments) {
        size_t start;
        for (;;) { /* _NEXT_MARKER.search(data, position) */
            if (position >= size) {
                return;
            }
            const unsigned char *found = memchr(data + position, 0xFF, size - position);
            if (found == NULL) {
                return;
            }
            start = (size_t)(found - data);
            if (start + 1 >= size) {
                return;
            }
            if (is_walked(data[start + 1])) {
                break;
            }
            position = start + 1;
        }
        unsigned char marker = data[start + 1];
        if (marker == SOS || marker == EOI) {
            return;
        }
        out->segments++;
        if (is_frame(marker)) {
            out->frames++;
            if (out->frame == 0) {
                out->frame = marker;
            }
            if (start + 9 <= size) {
                unsigned long rows = (unsigned long)data[start + 5] << 8 | data[start + 6];
                unsigned long columns = (unsigned long)data[start + 7] << 8 | data[start + 8];
                if ((unsigned long long)columns * rows >
                    (unsigned long long)out->width * out->height) {
                    out->width = columns;
                    out->height = rows;
                }
            }
        }
        if (start + 4 > size) { /* its length is cut off: nothing follows */
            return;
        }
        size_t length = (size_t)data[start + 2] << 8 | data[start + 3];
        position = start + 2 + (length > 2 ? length : 2); /* as libjpeg skips a segment */
    }
}
