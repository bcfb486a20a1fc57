/* prefetch.decode._jpegwindow: the Python binding of the compiled window decoder.
 *
 *   header(data) -> (width, height, components, colorspace)
 *   walk_header(data, max_segments) -> (frame, width, height, frames, segments): the header
 *       walk (header_walk.c), equal to prefetch.io.walk_jpeg(data, max_segments)
 *   decode(data, top, left, height, width, scale_denom, channels, fast_dct) -> bytearray
 *   entropy_decode_rows(data, last_row) -> rows entropy-decoded (the floor; entropy_floor.c)
 *   draws(seed, epoch, index, stream, count) -> bytes: `count` float64 draws of a sample's
 *       generator, equal to np.random.default_rng([seed, epoch, index, stream]).random(count)
 *   decode_chunk(...) -> (windows, table): a chunk of samples read, their boxes drawn and
 *       their windows decoded with the GIL released (chunk.c)
 *
 * This file only parses arguments, makes Python objects and releases the GIL; the work is done
 * by the files named for their jobs: libjpeg_window.c (libjpeg's errors, the header, a window),
 * header_walk.c (the bound every decoder shares), entropy_floor.c, generator.c (numpy's
 * SeedSequence and PCG64), boxes.c (the crops and the DCT scale) and chunk.c (files read and
 * the chunk loop). Its Python callers are in prefetch/decode/_window.py.
 *
 * `decode` returns height * width * channels bytes, rows of RGB (channels=3) or gray
 * (channels=1) pixels; the window is in the coordinates of the scaled image, whose size is
 * ceil(full / scale_denom) on each axis. Every libjpeg error and warning (corrupt or truncated
 * data) is a ValueError: the caller then hands the file to a decoder that reports it in its own
 * words. The GIL is released while libjpeg works; nothing here keeps state between calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "entropy_floor.h"
#include "generator.h"
#include "header_walk.h"
#include "libjpeg_window.h"

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

static PyObject *walk_header(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned long max_segments;
    if (!PyArg_ParseTuple(args, "y*k:walk_header", &data, &max_segments)) {
        return NULL;
    }
    jpeg_walk walk;
    Py_BEGIN_ALLOW_THREADS
    walk_jpeg_header((const unsigned char *)data.buf, (size_t)data.len, max_segments, &walk);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return Py_BuildValue("(ikkkk)", walk.frame, walk.width, walk.height, walk.frames,
                         walk.segments);
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
    strict_errors errors;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = decode_window(&errors, (const unsigned char *)data.buf, (size_t)data.len, top, left,
                           height, width, scale_denom, channels, fast_dct, out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (status != 0) {
        Py_DECREF(result);
        return PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", errors.message);
    }
    return result;
}

static PyObject *entropy_decode_rows(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int last_row;
    if (!PyArg_ParseTuple(args, "y*I:entropy_decode_rows", &data, &last_row)) {
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    strict_errors errors;
    use_strict_errors(&cinfo, &errors);
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

#ifdef HAVE_CHUNKS

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

/* decode_chunk(paths, indices, positions, seed, epoch, stream, crop, params, flip, target_h,
 *              target_w, channels, max_pixels, pil_limit, max_bytes, max_segments, max_held,
 *              started)
 *   -> (windows: bytearray, table: bytes, handled: int)
 *
 * For each sample i (its local path as bytes, its index in the source, its row positions[i] of
 * the slot): read the file, draw its box and flip from the sample's generator (seed, epoch,
 * index, stream) and decode its window at the DCT scale, as prefetch.decode._window does for
 * one sample. `table` is int64 (len(paths), 6): status (DONE; FALLBACK: the caller reads that
 * sample itself; LATER: not reached), the offset of the window's pixels in `windows`, its
 * height and width, flipped, and the nanoseconds spent on it. `handled` samples, the first, are
 * DONE or FALLBACK: the call holds at most `max_held` bytes of files and windows at once, plus
 * the last file's window (one file alone where it is larger), and leaves the rest to the
 * caller's next call. `started` (a float64 array with a row per slot row, or None) holds each
 * sample's time.monotonic() while its file is read or its window decoded (0 after), for the
 * loader's sample_timeout_s. Two stretches without the GIL: read and plan the samples
 * (plan_samples), then decode their windows into one buffer (decode_samples). The paths are
 * the call's own (a tuple of the list's items, taken with the GIL held): another thread that
 * changes `paths` meanwhile changes nothing the call reads. */
static PyObject *decode_chunk(PyObject *self, PyObject *args) {
    PyObject *paths, *indices, *positions, *started_object;
    chunk_options options;
    int target_h, target_w;
    Py_ssize_t max_held;
    if (!PyArg_ParseTuple(args, "O!O!O!KKKi(dddd)iiiiLLLknO:decode_chunk", &PyList_Type,
                          &paths, &PyList_Type, &indices, &PyList_Type, &positions,
                          &options.seed, &options.epoch, &options.stream, &options.crop,
                          &options.params[0], &options.params[1], &options.params[2],
                          &options.params[3], &options.flip, &target_h, &target_w,
                          &options.channels, &options.max_pixels, &options.pil_limit,
                          &options.max_bytes, &options.max_segments, &max_held,
                          &started_object)) {
        return NULL;
    }
    if (max_held < 0) {
        return PyErr_Format(PyExc_ValueError, "max_held must be >= 0, got %zd", max_held);
    }
    options.max_held = (size_t)max_held;
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
    /* The call's own references to the paths: the files are opened with the GIL released, when
     * another thread may change `paths` (and free a path whose last reference it held). */
    PyObject *held = PyList_AsTuple(paths);
    PyObject *table = held == NULL ? NULL
                                   : PyBytes_FromStringAndSize(
                                         NULL, n * T_COLUMNS * (Py_ssize_t)sizeof(int64_t));
    sample_t *samples = calloc(n > 0 ? (size_t)n : 1, sizeof(sample_t));
    PyObject *result = NULL;
    if (table == NULL || samples == NULL) {
        if (table != NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    int64_t *cells = (int64_t *)PyBytes_AS_STRING(table);
    memset(cells, 0, (size_t)n * T_COLUMNS * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *path = PyTuple_GET_ITEM(held, i);
        samples[i].row = cells + i * T_COLUMNS;
        samples[i].index = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(indices, i));
        samples[i].position = PyLong_AsSsize_t(PyList_GET_ITEM(positions, i));
        if (PyErr_Occurred() || !PyBytes_Check(path) || samples[i].position < 0 ||
            (options.started != NULL && samples[i].position >= rows)) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "paths must be bytes and positions rows of `started`");
            }
            goto done;
        }
        samples[i].path = PyBytes_AS_STRING(path); /* `held` keeps it alive */
    }
    size_t total, planned;
    Py_BEGIN_ALLOW_THREADS
    total = plan_samples(samples, (size_t)n, &options, &planned);
    Py_END_ALLOW_THREADS
    PyObject *windows = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (windows == NULL) {
        free_samples(samples, planned);
        goto done;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(windows);
    Py_BEGIN_ALLOW_THREADS
    decode_samples(samples, planned, &options, out);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(NNn)", windows, table, (Py_ssize_t)planned);
    table = NULL; /* the result's (N), or released with it on failure */
done:
    Py_XDECREF(table);
    free(samples);
    Py_XDECREF(held);
    if (options.started != NULL) {
        PyBuffer_Release(&started);
    }
    return result;
}

#endif /* HAVE_CHUNKS */

static PyMethodDef methods[] = {
    {"header", header, METH_VARARGS,
     "header(data) -> (width, height, components, colorspace) of a JPEG's header."},
    {"walk_header", walk_header, METH_VARARGS,
     "walk_header(data, max_segments) -> (frame, width, height, frames, segments): the JPEG "
     "header walk, equal to prefetch.io.walk_jpeg(data, max_segments)."},
    {"decode", decode, METH_VARARGS,
     "decode(data, top, left, height, width, scale_denom, channels, fast_dct) -> bytearray: "
     "the window's rows of pixels in the image scaled by 1/scale_denom."},
    {"entropy_decode_rows", entropy_decode_rows, METH_VARARGS,
     "entropy_decode_rows(data, last_row) -> int: entropy-decode the iMCU rows covering pixel "
     "rows 0..last_row (no IDCT or colour); the pixel rows covered."},
#ifdef HAVE_CHUNKS
    {"draws", draws, METH_VARARGS,
     "draws(seed, epoch, index, stream, count) -> bytes: `count` float64 draws, equal to "
     "np.random.default_rng([seed, epoch, index, stream]).random(count)."},
    {"decode_chunk", decode_chunk, METH_VARARGS,
     "decode_chunk(paths, indices, positions, seed, epoch, stream, crop, params, flip, "
     "target_h, target_w, channels, max_pixels, pil_limit, max_bytes, max_segments, max_held, "
     "started) -> (windows, table, handled): a chunk of samples read, their boxes drawn and "
     "windows decoded without the GIL, holding at most max_held bytes."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "prefetch.decode._jpegwindow",
    "Decode windows of JPEGs at a DCT scale with libjpeg-turbo (sources: prefetch/decode/_c/).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__jpegwindow(void) { return PyModule_Create(&module); }
