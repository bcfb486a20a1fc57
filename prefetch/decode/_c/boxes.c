/* The boxes: prefetch.plan._crops (RandomResizedCrop.box, CenterCrop.box) and
 * prefetch.decode._window (dct_scale, scaled_box), in the same double arithmetic, so that the
 * chunk path's windows are the per-sample path's to the pixel (tests/test_chunk_decode.py
 * compares them for every shape). A change to a Python twin is a change here. */
#include "boxes.h"

#include <math.h>

/* Python's round() of a float: to the nearest integer, halves to even. */
static double round_even(double x) {
    double rounded = round(x);
    if (fabs(x - rounded) == 0.5) {
        rounded = 2.0 * round(x / 2.0);
    }
    return rounded;
}

#ifdef HAVE_GENERATOR
/* torchvision's attempts before the centred fallback: _crops.ATTEMPTS. */
#define ATTEMPTS 10

/* RandomResizedCrop.box: 20 draws (10 attempts of area and ratio), then 2 for the position of
 * the first that fits, else the centred fallback. `volatile`: no fused multiply-add, so each
 * product is rounded as Python rounds it. */
box_t random_box(long height, long width, const double *p, pcg64 *rng) {
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
#endif

/* CenterCrop.box (no draws). */
box_t center_box(long height, long width, const double *p, long target_h, long target_w) {
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

/* dct_scale: the largest N in (8, 4, 2) that keeps the box at least the target at 1/N, or 1
 * (_window.DCT_SCALES). */
unsigned dct_scale(box_t box, long target_h, long target_w) {
    static const long scales[] = {8, 4, 2};
    for (int i = 0; i < 3; i++) {
        if (box.height / scales[i] >= target_h && box.width / scales[i] >= target_w) {
            return (unsigned)scales[i];
        }
    }
    return 1;
}

/* scaled_box: `box` on the grid of the image decoded at 1/scale, never empty. */
box_t scaled_box(box_t box, long full_h, long full_w, unsigned scale) {
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
