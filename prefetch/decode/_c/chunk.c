/* A chunk of samples read, planned and decoded without the GIL: the compiled twin of the
 * per-sample path (SampleReader._read -> prefetch.decode._window.decode_window
 * for a local file, a crop and no transform), for every sample of a worker's chunk at once.
 *
 * Each sample: the file read as prefetch.io.read_local reads it (read_file below), its header
 * read, its box and flip drawn from its own generator (generator.c, boxes.c), its DCT scale
 * and window picked, then its window decoded (libjpeg_window.c). Anything the per-sample path
 * would do differently (not a regular file, not a baseline JPEG, a limit, a libjpeg error) is
 * FALLBACK: the caller reads that sample the per-sample way, which says what is wrong. */
#include "chunk.h"

#ifdef HAVE_CHUNKS

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "header_walk.h"
#include "libjpeg_window.h"

static double monotonic_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int64_t nanos_since(double began) { return (int64_t)((monotonic_s() - began) * 1e9); }

static void set_started(const chunk_options *options, int64_t position, double value) {
    if (options->started != NULL) {
        options->started[position] = value;
    }
}

/* Opens the local file at `path` as prefetch.io.read_local does (read_capped in
 * prefetch/io/_local_files.py is the twin): a regular file of at least 3 and at most max_bytes
 * bytes, opened without blocking on a FIFO. Returns its descriptor with its fstat in `info`, or
 * -1 (the caller reads it the per-sample way, which says what is wrong). */
static int open_file(const char *path, long long max_bytes, struct stat *info) {
    int handle = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (handle < 0) {
        return -1;
    }
    if (fstat(handle, info) != 0 || !S_ISREG(info->st_mode) || info->st_size < 3 ||
        (long long)info->st_size > max_bytes) {
        close(handle);
        return -1;
    }
    return handle;
}

/* Whether two fstats of one open file show the same version: what a write moves, its size and
 * modification time (_version in prefetch/io/_local_files.py, the twin). Not the change time,
 * which a rename over the file moves too (the bytes read stay whole). */
static int same_version(const struct stat *a, const struct stat *b) {
    return a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Reads the open file (`info`: its fstat when opened) whole into a new buffer in *data, and
 * closes it: 0, or -1 when its size or modification time moved while it was read (it grew,
 * shrank or was rewritten in place: its bytes may be half old and half new), with *data still
 * to be freed. One descriptor: a file replaced by rename meanwhile is read whole (the version
 * opened). A rewrite that moves neither while it is read is not seen. The rest of read_capped
 * (prefetch/io/_local_files.py), its twin. */
static int read_file(int handle, const struct stat *info, unsigned char **data) {
    size_t size = (size_t)info->st_size;
    *data = malloc(size + 1);
    if (*data == NULL) {
        close(handle);
        return -1;
    }
    size_t got = 0;
    while (got < size + 1) { /* a byte more than its size: a file that grew is the caller's */
        ssize_t count = pread(handle, *data + got, size + 1 - got, (off_t)got);
        if (count <= 0) {
            break;
        }
        got += (size_t)count;
    }
    struct stat after;
    int unchanged = fstat(handle, &after) == 0 && same_version(info, &after);
    close(handle);
    return got == size && unchanged ? 0 : -1;
}

/* Plans the window of a sample whose file is read: walks its header as
 * prefetch.io.check_image_bytes does (header_walk.c: one frame, at most max_segments segments, a
 * sequential Huffman frame of at most max_pixels and Pillow's limit), reads it with libjpeg as
 * _jpeg_header in prefetch/decode/_window.py does (the same size, a colour space libjpeg-turbo
 * decodes as Pillow does), draws its box and flip, and picks the DCT scale and the window.
 * Returns DONE, or FALLBACK for anything else: the caller then reads that sample itself, and
 * says what is wrong with it. */
static int plan_window(sample_t *sample, const chunk_options *options) {
    const unsigned char *data = sample->data;
    size_t size = sample->size;
    if (data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF) {
        return FALLBACK;
    }
    /* The bound every decoder shares, before libjpeg reads anything: check_image_bytes's rules
     * for a Huffman-coded sequential frame (whose scans it does not count). */
    jpeg_walk walk;
    walk_jpeg_header(data, size, options->max_segments, &walk);
    long height = (long)walk.height, width = (long)walk.width;
    long long pixels = (long long)height * width;
    if (walk.segments > options->max_segments || walk.frames != 1 ||
        (walk.frame != 0xC0 && walk.frame != 0xC1) || height <= 0 || width <= 0 ||
        (options->max_pixels >= 0 && pixels > options->max_pixels) ||
        (options->pil_limit >= 0 && pixels > options->pil_limit)) {
        return FALLBACK;
    }
    jpeg_info jpeg;
    strict_errors errors;
    if (read_header(data, size, &jpeg, &errors) != 0) {
        return FALLBACK;
    }
    J_COLOR_SPACE space = jpeg.space;
    if (!jpeg.sequential || (space != JCS_YCbCr && space != JCS_GRAYSCALE && space != JCS_RGB) ||
        (long)jpeg.height != height || (long)jpeg.width != width) {
        return FALLBACK;
    }
    pcg64 rng;
    sample_rng(&rng, options->seed, options->epoch, sample->index, options->stream);
    box_t box;
    if (options->crop == CROP_RANDOM) {
        box = random_box(height, width, options->params, &rng);
    } else {
        box = center_box(height, width, options->params, options->target_h, options->target_w);
    }
    sample->row[T_FLIPPED] = options->flip && pcg64_double(&rng) < 0.5; /* Augment.flipped */
    sample->scale = dct_scale(box, options->target_h, options->target_w);
    sample->window = scaled_box(box, height, width, sample->scale);
    sample->row[T_HEIGHT] = sample->window.height;
    sample->row[T_WIDTH] = sample->window.width;
    return DONE;
}

size_t plan_samples(sample_t *samples, size_t n, const chunk_options *options,
                    size_t *planned) {
    size_t total = 0, held = 0;
    size_t i = 0;
    for (; i < n; i++) {
        sample_t *sample = &samples[i];
        double began = monotonic_s();
        set_started(options, sample->position, began);
        struct stat info;
        int handle = open_file(sample->path, options->max_bytes, &info);
        int status = FALLBACK;
        if (handle >= 0) {
            size_t size = (size_t)info.st_size;
            if (held > 0 && held + size > options->max_held) { /* for the next call */
                close(handle);
                set_started(options, sample->position, 0.0);
                break;
            }
            sample->size = size;
            if (read_file(handle, &info, &sample->data) == 0) {
                status = plan_window(sample, options);
            }
        }
        set_started(options, sample->position, 0.0);
        sample->row[T_STATUS] = status;
        sample->row[T_NANOS] = nanos_since(began);
        if (status == DONE) {
            size_t window = (size_t)sample->window.height * (size_t)sample->window.width *
                            (size_t)options->channels;
            sample->row[T_OFFSET] = (int64_t)total;
            total += window;
            held += sample->size + window;
        } else {
            free(sample->data);
            sample->data = NULL;
        }
    }
    *planned = i;
    for (; i < n; i++) {
        samples[i].row[T_STATUS] = LATER;
    }
    return total;
}

/* Each file is decoded with a decompress object of its own (decode_window makes it): nothing
 * of one file's decode carries to the next. */
void decode_samples(sample_t *samples, size_t n, const chunk_options *options,
                    unsigned char *windows) {
    for (size_t i = 0; i < n; i++) {
        sample_t *sample = &samples[i];
        if (sample->row[T_STATUS] != DONE) {
            continue;
        }
        double began = monotonic_s();
        set_started(options, sample->position, began);
        box_t window = sample->window;
        strict_errors errors;
        int status = decode_window(&errors, sample->data, sample->size, (JDIMENSION)window.top,
                                   (JDIMENSION)window.left, (JDIMENSION)window.height,
                                   (JDIMENSION)window.width, sample->scale, options->channels, 1,
                                   windows + sample->row[T_OFFSET]);
        set_started(options, sample->position, 0.0);
        free(sample->data);
        sample->data = NULL;
        sample->row[T_STATUS] = status == 0 ? DONE : FALLBACK;
        sample->row[T_NANOS] += nanos_since(began);
    }
}

void free_samples(sample_t *samples, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(samples[i].data);
        samples[i].data = NULL;
    }
}

#endif /* HAVE_CHUNKS */
