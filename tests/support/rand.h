/* tests/support/rand.h: the kernel tests' random numbers: a fixed xorshift-multiply
 * stream, so every run draws the same values. */
#ifndef FS_TEST_RAND_H
#define FS_TEST_RAND_H

#include <stdint.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;

/* Uniform in [lo, hi). */
static inline float urand(float lo, float hi)
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    double u = (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
    return lo + (float)u * (hi - lo);
}

#endif
