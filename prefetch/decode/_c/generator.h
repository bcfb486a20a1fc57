/* A sample's generator: numpy's SeedSequence and PCG64, bit for bit. See generator.c (and its
 * licence notice: transcribed from numpy). */
#ifndef PREFETCH_GENERATOR_H
#define PREFETCH_GENERATOR_H

#include <stdint.h>

#if defined(__SIZEOF_INT128__)
#define HAVE_GENERATOR 1

typedef struct {
    __uint128_t state;
    __uint128_t inc;
} pcg64;

/* np.random.default_rng([seed, epoch, index, stream]) as `rng`: prefetch.plan.Augment.rng's
 * generator (prefetch/plan/_crops.py). */
void sample_rng(pcg64 *rng, uint64_t seed, uint64_t epoch, uint64_t index, uint64_t stream);

/* The generator's next Generator.random(): (next64 >> 11) * 2**-53. */
double pcg64_double(pcg64 *rng);

#endif
#endif
