/* A sample's generator: numpy's SeedSequence and PCG64, bit for bit.
 *
 * Python twin: prefetch.plan.Augment.rng (prefetch/plan/_crops.py), which is
 * np.random.default_rng([seed, epoch, index, AUGMENT_STREAM]), and Generator.random(). A test
 * (tests/test_chunk_decode.py) compares `draws` with numpy's own.
 *
 * np.random.default_rng([seed, epoch, index, stream]) is PCG64(SeedSequence(those ints)): the
 * entropy (each int as its little-endian 32-bit words, 0 as one word) is hashed into a pool of
 * four words, which generates PCG64's state and increment; Generator.random() is
 * (next64 >> 11) * 2**-53. Transcribed from numpy/random/bit_generator.pyx (SeedSequence,
 * after Melissa O'Neill's seed_seq_fe), numpy/random/src/pcg64/pcg64.h (PCG64, after Melissa
 * O'Neill's PCG) and numpy/random/src/distributions (random_standard_uniform), under these
 * notices (NOTICE, at the root of the project, holds them all):
 *
 * Copyright (c) 2005-2025, NumPy Developers.
 * All rights reserved.
 *
 * Redistribution and use in source and binary forms, with or without modification, are
 * permitted provided that the following conditions are met:
 *
 *     * Redistributions of source code must retain the above copyright notice, this list of
 *       conditions and the following disclaimer.
 *
 *     * Redistributions in binary form must reproduce the above copyright notice, this list
 *       of conditions and the following disclaimer in the documentation and/or other
 *       materials provided with the distribution.
 *
 *     * Neither the name of the NumPy Developers nor the names of any contributors may be
 *       used to endorse or promote products derived from this software without specific
 *       prior written permission.
 *
 * THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS
 * OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF
 * MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE
 * COPYRIGHT OWNER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
 * EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE
 * GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED
 * AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING
 * NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF
 * ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
 *
 * numpy.random's own notice (Copyright (c) 2019 Kevin Sheppard, 3-clause BSD, the same terms)
 * and PCG's (Copyright 2014 Melissa O'Neill <oneill@pcg-random.org>, MIT) are in NOTICE. */
#include "generator.h"

#ifdef HAVE_GENERATOR

#define SS_POOL 4
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_SHIFT 16

/* SeedSequence's hashmix. */
static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_SHIFT;
    return value;
}

/* SeedSequence's mix. */
static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t result = SS_MIX_L * x - SS_MIX_R * y;
    return result ^ (result >> SS_SHIFT);
}

/* Appends `value`'s 32-bit words (least significant first; 0 is one word) to words[*n]:
 * SeedSequence's _coerce_to_uint32_array of one int. */
static void ss_words(uint64_t value, uint32_t *words, int *n) {
    words[(*n)++] = (uint32_t)value;
    if (value >> 32) {
        words[(*n)++] = (uint32_t)(value >> 32);
    }
}

#define PCG_MULT (((__uint128_t)2549297995355413924ULL << 64) + 4865540595714422341ULL)

/* pcg64.h's pcg64_random_r: a step of the LCG, then XSL-RR output. */
static uint64_t pcg64_next(pcg64 *rng) {
    rng->state = rng->state * PCG_MULT + rng->inc;
    uint64_t high = (uint64_t)(rng->state >> 64), low = (uint64_t)rng->state;
    unsigned rot = (unsigned)(high >> 58);
    uint64_t value = high ^ low;
    return (value >> rot) | (value << ((64 - rot) & 63));
}

double pcg64_double(pcg64 *rng) {
    return (double)(pcg64_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

void sample_rng(pcg64 *rng, uint64_t seed, uint64_t epoch, uint64_t index, uint64_t stream) {
    uint32_t entropy[8];
    int n = 0;
    ss_words(seed, entropy, &n);
    ss_words(epoch, entropy, &n);
    ss_words(index, entropy, &n);
    ss_words(stream, entropy, &n);
    /* SeedSequence.mix_entropy */
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
    /* SeedSequence.generate_state(4, np.uint64) */
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
    /* pcg64.h's pcg64_set_seed */
    __uint128_t initstate = ((__uint128_t)words[0] << 64) + words[1];
    __uint128_t initseq = ((__uint128_t)words[2] << 64) + words[3];
    rng->state = 0;
    rng->inc = (initseq << 1) | 1;
    pcg64_next(rng);
    rng->state += initstate;
    pcg64_next(rng);
}

#endif /* HAVE_GENERATOR */
