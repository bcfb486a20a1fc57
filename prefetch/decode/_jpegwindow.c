/* prefetch._jpegwindow: decode one window of a JPEG at a DCT scale with libjpeg-turbo.
 *
 * The crop path of the loader (prefetch.window_decode) asks for "this window of this file at
 * 1/N of full size". libjpeg-turbo can do exactly that without decoding the rest of the image:
 * scale_denom = N picks its scaled inverse DCTs (N = 1, 2, 4, 8), jpeg_crop_scanline() limits
 * the decoded columns to the iMCU columns that cover the window, and jpeg_skip_scanlines()
 * skips the rows above it; decoding stops after the window's last row. This is what
 * tf.io.decode_and_crop_jpeg and DALI do.
 *
 *   header(data) -> (width, height, components, colorspace)
 *   decode(data, top, left, height, width, scale_denom, channels, fast_dct) -> bytearray
 *   entropy_decode_rows(data, last_row) -> rows entropy-decoded (the floor; see below)
 *   draws(seed, epoch, index, stream, count) -> bytes: `count` float64 draws of a sample's
 *       generator, equal to np.random.default_rng([seed, epoch, index, stream]).random(count)
 *   decode_chunk(...) -> (windows, table): a chunk of samples read, their boxes drawn and
 *       their windows decoded with the GIL released (see decode_chunk below)
 *
 * `decode` returns height * width * channels bytes, rows of RGB (channels=3) or gray
 * (channels=1) pixels; the window is in the coordinates of the scaled image, whose size is
 * ceil(full / scale_denom) on each axis. Every libjpeg error and warning (corrupt or truncated
 * data) is a ValueError: the caller then hands the file to a decoder that reports it in its own
 * words. The GIL is released while libjpeg works; nothing here keeps state between calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

/* libjpeg's internal header, where installed (Debian's libjpeg-turbo dev package has it): its
 * entropy decoder's decode_mcu lets entropy_decode_rows decode exactly the rows it is asked. */
#ifdef __has_include
#if __has_include(<jpegint.h>)
#define JPEG_INTERNALS
#endif
#endif

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr base;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} strict_errors;

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

static void strict(struct jpeg_decompress_struct *cinfo, strict_errors *errors) {
    cinfo->err = jpeg_std_error(&errors->base);
    errors->base.error_exit = fail;
    errors->base.emit_message = warn_or_trace;
    errors->message[0] = '\0';
}

static const char *colorspace_name(J_COLOR_SPACE space) {
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

/* What a JPEG's header says. */
typedef struct {
    JDIMENSION width, height;
    int components;
    J_COLOR_SPACE space;
    int sequential; /* neither progressive nor arithmetic-coded */
} jpeg_info;

/* Reads the header of the JPEG in data[0, size) into `info`: 0, or -1 with libjpeg's reason in
 * errors->message. */
static int read_header(const unsigned char *data, size_t size, jpeg_info *info,
                       strict_errors *errors) {
    struct jpeg_decompress_struct cinfo;
    strict(&cinfo, errors);
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

static PyObject *header(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:header", &data)) {
        return NULL;
    }
    jpeg_info info;
    strict_errors errors;
    int failed = read_header((const unsigned char *)data.buf, (size_t)data.len, &info, &errors);
    PyBuffer_Release(&data);
    if (failed) {
        return PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", errors.message);
    }
    return Py_BuildValue("(IIis)", info.width, info.height, info.components,
                         colorspace_name(info.space));
}

/* Rows asked of each jpeg_read_scanlines call (libjpeg returns at most a row group per call):
 * fewer calls than one row at a time; the same pixels, measured 0-5% faster per window. */
#define ROWS_PER_READ 16

/* Decode rows [top, top + height) and columns [left, left + width) of the image scaled by
 * 1/scale_denom into `out` (height * width * channels bytes). Returns 0, or -1 with a message in
 * errors->message (set by libjpeg, or here for a window outside the scaled image). */
static int decode_window(struct jpeg_decompress_struct *cinfo, strict_errors *errors,
                         const unsigned char *data, size_t size, JDIMENSION top,
                         JDIMENSION left, JDIMENSION height, JDIMENSION width,
                         unsigned int scale_denom, int channels, int fast_dct,
                         unsigned char *out) {
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

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int top, left, height, width, scale_denom;
    int channels, fast_dct;
    if (!PyArg_ParseTuple(args, "y*IIIIIip:decode", &data, &top, &left, &height, &width,
                          &scale_denom, &channels, &fast_dct)) {
        return NULL;
    }
    if (channels != 1 && channels != 3) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "channels must be 1 or 3, got %d", channels);
    }
    if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8, got %u",
                            scale_denom);
    }
    if (height == 0 || width == 0 || (size_t)height * width > (size_t)1 << 31) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "window %ux%u is empty or too large", width,
                            height);
    }
    PyObject *result =
        PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)height * width * channels);
    if (result == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(result);
    struct jpeg_decompress_struct cinfo;
    strict_errors errors;
    strict(&cinfo, &errors);
    jpeg_create_decompress(&cinfo);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = decode_window(&cinfo, &errors, (const unsigned char *)data.buf, (size_t)data.len,
                           top, left, height, width, scale_denom, channels, fast_dct, out);
    Py_END_ALLOW_THREADS
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    if (status != 0) {
        Py_DECREF(result);
        return PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", errors.message);
    }
    return result;
}

/* The entropy (Huffman) decoding of the MCU rows that cover pixel rows [0, last_row], and
 * nothing else: no inverse DCT, upsampling or colour conversion. Sets *rows to the pixel rows
 * covered (whole MCU rows, at most the image's height). Returns 0, or -1 with a message.
 *
 * Single-scan (baseline) files: the entropy decoder's decode_mcu with no block buffer (the
 * coefficients are decoded and discarded; what jpeg_skip_scanlines does for whole iMCU rows),
 * MCU row by MCU row. Without libjpeg's internal header, jpeg_skip_scanlines itself, which
 * cannot be asked for the last iMCU row (a skip to the bottom decodes nothing): windows that
 * reach it are read with jpeg_read_coefficients. Progressive and multi-scan files: every scan
 * spans the whole image, so any window's decode pays for all of them: jpeg_read_coefficients
 * (all scans entropy-decoded into coefficient arrays). */
static int entropy_rows(struct jpeg_decompress_struct *cinfo, strict_errors *errors,
                        const unsigned char *data, size_t size, JDIMENSION last_row,
                        JDIMENSION *rows) {
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

static PyObject *entropy_decode_rows(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int last_row;
    if (!PyArg_ParseTuple(args, "y*I:entropy_decode_rows", &data, &last_row)) {
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    strict_errors errors;
    strict(&cinfo, &errors);
    jpeg_create_decompress(&cinfo);
    JDIMENSION rows = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = entropy_rows(&cinfo, &errors, (const unsigned char *)data.buf, (size_t)data.len,
                          last_row, &rows);
    Py_END_ALLOW_THREADS
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    if (status != 0) {
        return PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", errors.message);
    }
    return PyLong_FromUnsignedLong(rows);
}

/* draws and decode_chunk need 128-bit integers (PCG64), POSIX files, and CLOCK_MONOTONIC to be
 * Python's time.monotonic() (the `started` column): Linux. Elsewhere the module has neither and
 * the loader reads crops one sample at a time (chunk_available in _window.py). */
#if defined(__SIZEOF_INT128__) && defined(__linux__)
#define CHUNKS 1

/* ---- a sample's generator: numpy's SeedSequence and PCG64, bit for bit ----------------------
 *
 * np.random.default_rng([seed, epoch, index, stream]) is PCG64(SeedSequence(those ints)): the
 * entropy (each int as its little-endian 32-bit words, 0 as one word) is hashed into a pool of
 * four words, which generates PCG64's state and increment; Generator.random() is
 * (next64 >> 11) * 2**-53. Transcribed from numpy/random/bit_generator.pyx and pcg64.h; a test
 * compares `draws` with numpy's own. */
#define SS_POOL 4
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_SHIFT 16

static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_SHIFT;
    return value;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t result = SS_MIX_L * x - SS_MIX_R * y;
    return result ^ (result >> SS_SHIFT);
}

/* Appends `value`'s 32-bit words (least significant first; 0 is one word) to words[*n]. */
static void ss_words(uint64_t value, uint32_t *words, int *n) {
    words[(*n)++] = (uint32_t)value;
    if (value >> 32) {
        words[(*n)++] = (uint32_t)(value >> 32);
    }
}

typedef struct {
    __uint128_t state;
    __uint128_t inc;
} pcg64;

#define PCG_MULT (((__uint128_t)2549297995355413924ULL << 64) + 4865540595714422341ULL)

static uint64_t pcg64_next(pcg64 *rng) {
    rng->state = rng->state * PCG_MULT + rng->inc;
    uint64_t high = (uint64_t)(rng->state >> 64), low = (uint64_t)rng->state;
    unsigned rot = (unsigned)(high >> 58);
    uint64_t value = high ^ low;
    return (value >> rot) | (value << ((64 - rot) & 63));
}

static double pcg64_double(pcg64 *rng) {
    return (double)(pcg64_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

static void sample_rng(pcg64 *rng, uint64_t seed, uint64_t epoch, uint64_t index,
                       uint64_t stream) {
    uint32_t entropy[8];
    int n = 0;
    ss_words(seed, entropy, &n);
    ss_words(epoch, entropy, &n);
    ss_words(index, entropy, &n);
    ss_words(stream, entropy, &n);
    uint32_t pool[SS_POOL];
    uint32_t hash_const = SS_INIT_A;
    for (int i = 0; i < SS_POOL; i++) {
        pool[i] = ss_hashmix(i < n ? entropy[i] : 0, &hash_const);
    }
    for (int src = 0; src < SS_POOL; src++) {
        for (int dst = 0; dst < SS_POOL; dst++) {
            if (src != dst) {
                pool[dst] = ss_mix(pool[dst], ss_hashmix(pool[src], &hash_const));
            }
        }
    }
    for (int src = SS_POOL; src < n; src++) {
        for (int dst = 0; dst < SS_POOL; dst++) {
            pool[dst] = ss_mix(pool[dst], ss_hashmix(entropy[src], &hash_const));
        }
    }
    uint32_t state[8];
    hash_const = SS_INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t value = pool[i % SS_POOL] ^ hash_const;
        hash_const *= SS_MULT_B;
        value *= hash_const;
        value ^= value >> SS_SHIFT;
        state[i] = value;
    }
    uint64_t words[4];
    for (int i = 0; i < 4; i++) {
        words[i] = (uint64_t)state[2 * i] | ((uint64_t)state[2 * i + 1] << 32);
    }
    __uint128_t initstate = ((__uint128_t)words[0] << 64) + words[1];
    __uint128_t initseq = ((__uint128_t)words[2] << 64) + words[3];
    rng->state = 0;
    rng->inc = (initseq << 1) | 1;
    pcg64_next(rng);
    rng->state += initstate;
    pcg64_next(rng);
}

static PyObject *draws(PyObject *self, PyObject *args) {
    unsigned long long seed, epoch, index, stream;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "KKKKn:draws", &seed, &epoch, &index, &stream, &count)) {
        return NULL;
    }
    if (count < 0 || count > 1 << 20) {
        return PyErr_Format(PyExc_ValueError, "count must be in [0, 2**20], got %zd", count);
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(double));
    if (result == NULL) {
        return NULL;
    }
    double *out = (double *)PyBytes_AS_STRING(result);
    pcg64 rng;
    sample_rng(&rng, seed, epoch, index, stream);
    for (Py_ssize_t i = 0; i < count; i++) {
        out[i] = pcg64_double(&rng);
    }
    return result;
}

/* ---- the boxes: prefetch.plan._crops and _window's scale, in the same double arithmetic ---- */

/* Python's round() of a float: to the nearest integer, halves to even. */
static double round_even(double x) {
    double rounded = round(x);
    if (fabs(x - rounded) == 0.5) {
        rounded = 2.0 * round(x / 2.0);
    }
    return rounded;
}

#define CROP_RANDOM 1 /* RandomResizedCrop(scale=(p0, p1), ratio=(p2, p3)) */
#define CROP_CENTER 2 /* CenterCrop(fraction=p0) */
#define ATTEMPTS 10

typedef struct {
    long top, left, height, width;
} box_t;

/* RandomResizedCrop.box: 20 draws (10 attempts of area and ratio), then 2 for the position of
 * the first that fits, else the centred fallback. `volatile`: no fused multiply-add, so each
 * product is rounded as Python rounds it. */
static box_t random_box(long height, long width, const double *p, pcg64 *rng) {
    double area = (double)height * (double)width;
    double log_low = log(p[2]), log_high = log(p[3]);
    double d[2 * ATTEMPTS];
    for (int i = 0; i < 2 * ATTEMPTS; i++) {
        d[i] = pcg64_double(rng);
    }
    for (int i = 0; i < ATTEMPTS; i++) {
        volatile double spread = (p[1] - p[0]) * d[2 * i];
        volatile double target_area = area * (p[0] + spread);
        volatile double log_spread = (log_high - log_low) * d[2 * i + 1];
        double aspect = exp(log_low + log_spread);
        volatile double wide = target_area * aspect;
        double crop_w = round_even(sqrt(wide));
        double crop_h = round_even(sqrt(target_area / aspect));
        if (0 < crop_w && crop_w <= (double)width && 0 < crop_h && crop_h <= (double)height) {
            long w = (long)crop_w, h = (long)crop_h;
            double row = pcg64_double(rng), column = pcg64_double(rng);
            long top = (long)(row * (double)(height - h + 1));
            long left = (long)(column * (double)(width - w + 1));
            box_t box = {top < height - h ? top : height - h, left < width - w ? left : width - w,
                         h, w};
            return box;
        }
    }
    double aspect = (double)width / (double)height;
    long w = width, h = height;
    if (aspect < p[2]) {
        h = (long)round_even((double)width / p[2]);
        h = h > 1 ? h : 1;
    } else if (aspect > p[3]) {
        w = (long)round_even((double)height * p[3]);
        w = w > 1 ? w : 1;
    }
    box_t box = {(height - h) / 2, (width - w) / 2, h, w};
    return box;
}

/* CenterCrop.box (no draws). */
static box_t center_box(long height, long width, const double *p, long target_h,
                        long target_w) {
    double full_h = (double)(width * target_h) / (double)target_w;
    double full_w = (double)(height * target_w) / (double)target_h;
    full_h = full_h < (double)height ? full_h : (double)height;
    full_w = full_w < (double)width ? full_w : (double)width;
    long h = (long)(p[0] * full_h), w = (long)(p[0] * full_w);
    h = h > 1 ? h : 1;
    w = w > 1 ? w : 1;
    box_t box = {(height - h + 1) / 2, (width - w + 1) / 2, h, w};
    return box;
}

/* prefetch.decode._window.dct_scale and scaled_box. */
static unsigned dct_scale(box_t box, long target_h, long target_w) {
    static const long scales[] = {8, 4, 2};
    for (int i = 0; i < 3; i++) {
        if (box.height / scales[i] >= target_h && box.width / scales[i] >= target_w) {
            return (unsigned)scales[i];
        }
    }
    return 1;
}

static box_t scaled_box(box_t box, long full_h, long full_w, unsigned scale) {
    long s = (long)scale;
    long rows = (full_h + s - 1) / s, columns = (full_w + s - 1) / s;
    long top = (long)round_even((double)box.top / (double)s);
    long left = (long)round_even((double)box.left / (double)s);
    top = top < rows - 1 ? top : rows - 1;
    left = left < columns - 1 ? left : columns - 1;
    long bottom = (long)round_even((double)(box.top + box.height) / (double)s);
    long right = (long)round_even((double)(box.left + box.width) / (double)s);
    bottom = bottom > top + 1 ? bottom : top + 1;
    bottom = bottom < rows ? bottom : rows;
    right = right > left + 1 ? right : left + 1;
    right = right < columns ? right : columns;
    box_t out = {top, left, bottom - top, right - left};
    return out;
}

/* ---- a chunk of samples ------------------------------------------------------------------ */

/* The columns of decode_chunk's table (int64, one row per sample). */
enum { T_STATUS, T_OFFSET, T_HEIGHT, T_WIDTH, T_FLIPPED, T_NANOS, T_COLUMNS };
/* T_STATUS: the window is decoded, or the caller reads the sample itself. */
enum { DONE = 0, FALLBACK = 1 };

typedef struct {
    const char *path;
    uint64_t index;
    Py_ssize_t position;
    unsigned char *data;
    size_t size;
    box_t window;
    unsigned scale;
    int64_t *row;
} sample_t;

static double monotonic_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int64_t nanos_since(double began) { return (int64_t)((monotonic_s() - began) * 1e9); }

typedef struct {
    unsigned long long seed, epoch, stream;
    int crop, flip, channels;
    double params[4];
    long target_h, target_w;
    long long max_pixels, pil_limit, max_bytes;
    double *started; /* the slot's `started` column (time.monotonic() per row), or NULL */
} chunk_options;

/* Reads the file (a regular file of at most max_bytes, read as prefetch.io.read_local reads
 * it), reads its header (a sequential Huffman JPEG of at most max_pixels and Pillow's limit,
 * in a colour space libjpeg-turbo decodes as Pillow does), draws its box and flip, and picks
 * the DCT scale and the window. Returns DONE, or FALLBACK for anything else: the caller then
 * reads that sample itself, and says what is wrong with it. */
static int plan_sample(sample_t *sample, const chunk_options *options) {
    int handle = open(sample->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (handle < 0) {
        return FALLBACK;
    }
    struct stat info;
    if (fstat(handle, &info) != 0 || !S_ISREG(info.st_mode) || info.st_size < 3 ||
        (long long)info.st_size > options->max_bytes) {
        close(handle);
        return FALLBACK;
    }
    size_t size = (size_t)info.st_size;
    unsigned char *data = malloc(size + 1);
    if (data == NULL) {
        close(handle);
        return FALLBACK;
    }
    size_t got = 0;
    while (got < size + 1) { /* a byte more than its size: a file that grew is the caller's */
        ssize_t count = pread(handle, data + got, size + 1 - got, (off_t)got);
        if (count <= 0) {
            break;
        }
        got += (size_t)count;
    }
    close(handle);
    sample->data = data;
    sample->size = size;
    if (got != size || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF) {
        return FALLBACK;
    }
    jpeg_info jpeg;
    strict_errors errors;
    if (read_header(data, size, &jpeg, &errors) != 0) {
        return FALLBACK;
    }
    long height = (long)jpeg.height, width = (long)jpeg.width;
    long long pixels = (long long)height * width;
    J_COLOR_SPACE space = jpeg.space;
    if (!jpeg.sequential || (space != JCS_YCbCr && space != JCS_GRAYSCALE && space != JCS_RGB) ||
        height <= 0 || width <= 0 || (options->max_pixels >= 0 && pixels > options->max_pixels) ||
        (options->pil_limit >= 0 && pixels > options->pil_limit)) {
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
    sample->row[T_FLIPPED] = options->flip && pcg64_double(&rng) < 0.5;
    sample->scale = dct_scale(box, options->target_h, options->target_w);
    sample->window = scaled_box(box, height, width, sample->scale);
    sample->row[T_HEIGHT] = sample->window.height;
    sample->row[T_WIDTH] = sample->window.width;
    return DONE;
}

static void set_started(const chunk_options *options, Py_ssize_t position, double value) {
    if (options->started != NULL) {
        options->started[position] = value;
    }
}

static void free_samples(sample_t *samples, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        free(samples[i].data);
        samples[i].data = NULL;
    }
}

/* decode_chunk(paths, indices, positions, seed, epoch, stream, crop, params, flip, target_h,
 *              target_w, channels, max_pixels, pil_limit, max_bytes, started)
 *   -> (windows: bytearray, table: bytes)
 *
 * For each sample i (its local path as bytes, its index in the source, its row positions[i] of
 * the slot): read the file, draw its box and flip from the sample's generator (seed, epoch,
 * index, stream) and decode its window at the DCT scale, as prefetch.decode._window does for
 * one sample. `table` is int64 (len(paths), 6): status (DONE, or FALLBACK: the caller reads
 * that sample itself), the offset of the window's pixels in `windows`, its height and width,
 * flipped, and the nanoseconds spent on it. `started` (a float64 array with a row per slot row,
 * or None) holds each sample's time.monotonic() while its file is read or its window decoded
 * (0 after), for the loader's sample_timeout_s. Two stretches without the GIL: read and plan
 * every sample, then decode every window into one buffer. */
static PyObject *decode_chunk(PyObject *self, PyObject *args) {
    PyObject *paths, *indices, *positions, *started_object;
    chunk_options options;
    int target_h, target_w;
    if (!PyArg_ParseTuple(args, "O!O!O!KKKi(dddd)iiiiLLLO:decode_chunk", &PyList_Type, &paths,
                          &PyList_Type, &indices, &PyList_Type, &positions, &options.seed,
                          &options.epoch, &options.stream, &options.crop, &options.params[0],
                          &options.params[1], &options.params[2], &options.params[3],
                          &options.flip, &target_h, &target_w, &options.channels,
                          &options.max_pixels, &options.pil_limit, &options.max_bytes,
                          &started_object)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(paths);
    if (PyList_GET_SIZE(indices) != n || PyList_GET_SIZE(positions) != n) {
        return PyErr_Format(PyExc_ValueError, "paths, indices and positions differ in length");
    }
    if (options.crop != CROP_RANDOM && options.crop != CROP_CENTER) {
        return PyErr_Format(PyExc_ValueError, "crop must be 1 or 2, got %d", options.crop);
    }
    if (options.channels != 1 && options.channels != 3) {
        return PyErr_Format(PyExc_ValueError, "channels must be 1 or 3, got %d",
                            options.channels);
    }
    if (target_h <= 0 || target_w <= 0) {
        return PyErr_Format(PyExc_ValueError, "the target size must be positive");
    }
    options.target_h = target_h;
    options.target_w = target_w;
    Py_buffer started = {0};
    options.started = NULL;
    if (started_object != Py_None) {
        if (PyObject_GetBuffer(started_object, &started, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) !=
            0) {
            return NULL;
        }
        options.started = (double *)started.buf;
    }
    Py_ssize_t rows = started_object != Py_None ? started.len / (Py_ssize_t)sizeof(double) : 0;
    PyObject *table = PyBytes_FromStringAndSize(NULL, n * T_COLUMNS * (Py_ssize_t)sizeof(int64_t));
    sample_t *samples = calloc(n > 0 ? (size_t)n : 1, sizeof(sample_t));
    if (table == NULL || samples == NULL) {
        Py_XDECREF(table);
        free(samples);
        if (options.started != NULL) {
            PyBuffer_Release(&started);
        }
        return table == NULL ? NULL : PyErr_NoMemory();
    }
    int64_t *cells = (int64_t *)PyBytes_AS_STRING(table);
    memset(cells, 0, (size_t)n * T_COLUMNS * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *path = PyList_GET_ITEM(paths, i);
        samples[i].row = cells + i * T_COLUMNS;
        samples[i].index = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(indices, i));
        samples[i].position = PyLong_AsSsize_t(PyList_GET_ITEM(positions, i));
        if (PyErr_Occurred() || !PyBytes_Check(path) || samples[i].position < 0 ||
            (options.started != NULL && samples[i].position >= rows)) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "paths must be bytes and positions rows of `started`");
            }
            Py_DECREF(table);
            free(samples);
            if (options.started != NULL) {
                PyBuffer_Release(&started);
            }
            return NULL;
        }
        samples[i].path = PyBytes_AS_STRING(path); /* `paths` keeps it alive */
    }
    size_t total = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        double began = monotonic_s();
        set_started(&options, samples[i].position, began);
        int status = plan_sample(&samples[i], &options);
        set_started(&options, samples[i].position, 0.0);
        samples[i].row[T_STATUS] = status;
        samples[i].row[T_NANOS] = nanos_since(began);
        if (status == DONE) {
            samples[i].row[T_OFFSET] = (int64_t)total;
            total += (size_t)samples[i].window.height * (size_t)samples[i].window.width *
                     (size_t)options.channels;
        } else {
            free(samples[i].data);
            samples[i].data = NULL;
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *windows = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (windows == NULL) {
        free_samples(samples, n);
        free(samples);
        Py_DECREF(table);
        if (options.started != NULL) {
            PyBuffer_Release(&started);
        }
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(windows);
    Py_BEGIN_ALLOW_THREADS
    struct jpeg_decompress_struct cinfo;
    strict_errors errors;
    strict(&cinfo, &errors);
    jpeg_create_decompress(&cinfo);
    for (Py_ssize_t i = 0; i < n; i++) {
        sample_t *sample = &samples[i];
        if (sample->row[T_STATUS] != DONE) {
            continue;
        }
        double began = monotonic_s();
        set_started(&options, sample->position, began);
        box_t window = sample->window;
        int status = decode_window(&cinfo, &errors, sample->data, sample->size,
                                   (JDIMENSION)window.top, (JDIMENSION)window.left,
                                   (JDIMENSION)window.height, (JDIMENSION)window.width,
                                   sample->scale, options.channels, 1,
                                   out + sample->row[T_OFFSET]);
        set_started(&options, sample->position, 0.0);
        free(sample->data);
        sample->data = NULL;
        sample->row[T_STATUS] = status == 0 ? DONE : FALLBACK;
        sample->row[T_NANOS] += nanos_since(began);
    }
    jpeg_destroy_decompress(&cinfo);
    Py_END_ALLOW_THREADS
    free(samples);
    if (options.started != NULL) {
        PyBuffer_Release(&started);
    }
    PyObject *result = Py_BuildValue("(NN)", windows, table);
    return result;
}

#endif /* CHUNKS */

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS,
     "header(data) -> (width, height, components, colorspace) of a JPEG's header."},
    {"decode", decode, METH_VARARGS,
     "decode(data, top, left, height, width, scale_denom, channels, fast_dct) -> bytearray: "
     "the window's rows of pixels in the image scaled by 1/scale_denom."},
    {"entropy_decode_rows", entropy_decode_rows, METH_VARARGS,
     "entropy_decode_rows(data, last_row) -> int: entropy-decode the iMCU rows covering pixel "
     "rows 0..last_row (no IDCT or colour); the pixel rows covered."},
#ifdef CHUNKS
    {"draws", draws, METH_VARARGS,
     "draws(seed, epoch, index, stream, count) -> bytes: `count` float64 draws, equal to "
     "np.random.default_rng([seed, epoch, index, stream]).random(count)."},
    {"decode_chunk", decode_chunk, METH_VARARGS,
     "decode_chunk(paths, indices, positions, seed, epoch, stream, crop, params, flip, "
     "target_h, target_w, channels, max_pixels, pil_limit, max_bytes, started) -> (windows, "
     "table): a chunk of samples read, their boxes drawn and windows decoded without the GIL."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "prefetch._jpegwindow",
    "Decode one window of a JPEG at a DCT scale with libjpeg-turbo (see the C source).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__jpegwindow(void) { return PyModule_Create(&module); }
