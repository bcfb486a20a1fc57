/* The crop boxes and the DCT scale: C twins of prefetch/plan/_crops.py and
 * prefetch/decode/_window.py. See boxes.c. */
#ifndef PREFETCH_BOXES_H
#define PREFETCH_BOXES_H

#include "generator.h"

#define CROP_RANDOM 1 /* RandomResizedCrop(scale=(p0, p1), ratio=(p2, p3)) */
#define CROP_CENTER 2 /* CenterCrop(fraction=p0) */

/* prefetch.plan.Box: rows [top, top + height), columns [left, left + width). */
typedef struct {
    long top, left, height, width;
} box_t;

#ifdef HAVE_GENERATOR
/* Twin of RandomResizedCrop.box (prefetch/plan/_crops.py); p = (scale, ratio). */
box_t random_box(long height, long width, const double *p, pcg64 *rng);
#endif

/* Twin of CenterCrop.box (prefetch/plan/_crops.py); p[0] = fraction. */
box_t center_box(long height, long width, const double *p, long target_h, long target_w);

/* Twin of dct_scale (prefetch/decode/_window.py). */
unsigned dct_scale(box_t box, long target_h, long target_w);

/* Twin of scaled_box (prefetch/decode/_window.py). */
box_t scaled_box(box_t box, long full_h, long full_w, unsigned scale);

#endif
