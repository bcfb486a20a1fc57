/* A chunk of samples: files read, boxes drawn, windows decoded, all without the GIL. See
 * chunk.c; binding.c holds the Python entry point (decode_chunk) that calls these. */
#ifndef PREFETCH_CHUNK_H
#define PREFETCH_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "boxes.h"

/* The chunk path needs 128-bit integers (PCG64), POSIX files, and CLOCK_MONOTONIC to be
 * Python's time.monotonic() (the `started` column): Linux. Elsewhere the module has neither
 * `draws` nor `decode_chunk`, and the loader reads crops one sample at a time
 * (chunk_available in prefetch/decode/_window.py). */
#if defined(HAVE_GENERATOR) && defined(__linux__)
#define HAVE_CHUNKS 1

/* The columns of decode_chunk's table (int64, one row per sample); _window.py's _STATUS,
 * _OFFSET, ... name the same columns. */
enum { T_STATUS, T_OFFSET, T_HEIGHT, T_WIDTH, T_FLIPPED, T_NANOS, T_COLUMNS };
/* T_STATUS: the window is decoded, the caller reads the sample itself, or the call stopped
 * before it (the bytes it may hold were reached: the caller passes it to the next call). */
enum { DONE = 0, FALLBACK = 1, LATER = 2 };

/* One sample of a chunk, and its row of the table. */
typedef struct {
    const char *path;
    uint64_t index;
    int64_t position;
    unsigned char *data;
    size_t size;
    box_t window;
    unsigned scale;
    int64_t *row;
} sample_t;

/* What every sample of a chunk shares. */
typedef struct {
    unsigned long long seed, epoch, stream;
    int crop, flip, channels;
    double params[4];
    long target_h, target_w;
    long long max_pixels, pil_limit, max_bytes;
    unsigned long max_segments; /* prefetch.io.MAX_HEADER_SEGMENTS */
    size_t max_held;            /* prefetch.decode._window.CHUNK_BYTES: files and windows held */
    double *started; /* the slot's `started` column (time.monotonic() per row), or NULL */
} chunk_options;

/* The first of decode_chunk's two stretches: reads the samples' files in order and plans
 * their windows (or marks them FALLBACK). It reads a file only while the files and windows it
 * holds stay within options->max_held with it (the first file always), so it holds at most
 * max(max_held, the first file) plus the last file's window; the samples past that are left
 * (LATER). Sets *planned to the samples handled; returns the bytes of their planned windows. */
size_t plan_samples(sample_t *samples, size_t n, const chunk_options *options, size_t *planned);

/* The second: decodes every planned window of samples[0, n) into `windows` at its row's
 * T_OFFSET, and frees every sample's file. */
void decode_samples(sample_t *samples, size_t n, const chunk_options *options,
                    unsigned char *windows);

/* Frees what plan_samples read and decode_samples has not freed. */
void free_samples(sample_t *samples, size_t n);

#endif /* HAVE_CHUNKS */
#endif
