/* runtime/init.c: parameter initialization with a counter-based RNG.
 *
 * Every random number in the runtime is Philox4x32-10 (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3", SC'11): a pure function of a 64-bit key and a 128-bit
 * counter, so any element can be made without the ones before it. A parameter's element
 * i is drawn from key = seed, counter = (i, FNV-1a 64 of the param's full name): each
 * rank of a sharded plan makes exactly its own slice, identical to the same slice of the
 * unsharded tensor, and the values do not depend on the thread count or the order in
 * which parameters are visited.
 *
 * One counter block gives four 32-bit words; an element uses one block:
 *   uniform(a, b)   a + (b - a) * u, u in [0, 1) from words 0-1 (53 bits)
 *   normal(0, std)  std * Box-Muller(u1 in (0, 1] from words 0-1, u2 in [0, 1) from words 2-3)
 * computed in double, rounded once to f32.
 */
#include <math.h>

#include "runtime.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void rt_philox(uint64_t key, const uint32_t ctr[4], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        if (r) k0 += PHILOX_W0, k1 += PHILOX_W1;
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

uint64_t rt_fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* [0, 1) with 53 random bits. */
double rt_unit(uint32_t hi, uint32_t lo)
{
    return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

double rt_normal(const uint32_t w[4])
{
    double u1 = 1.0 - rt_unit(w[0], w[1]);  // (0, 1]: log(u1) is finite
    double u2 = rt_unit(w[2], w[3]);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

void rt_init_param(const char *name, uint64_t seed, PlanInit kind, double a, double b, int64_t first, int64_t count,
                   float *out)
{
    if (kind == PLAN_INIT_NONE || kind == PLAN_INIT_ZEROS || kind == PLAN_INIT_ONES) {
        float v = kind == PLAN_INIT_ONES ? 1.0f : 0.0f;
        for (int64_t i = 0; i < count; i++) out[i] = v;
        return;
    }
    uint64_t h = rt_fnv1a(name);
    int normal = kind == PLAN_INIT_NORMAL;
#pragma omp parallel for schedule(static) if (count > 65536)
    for (int64_t i = 0; i < count; i++) {
        uint64_t at = (uint64_t)(first + i);
        uint32_t ctr[4] = {(uint32_t)at, (uint32_t)(at >> 32), (uint32_t)h, (uint32_t)(h >> 32)}, w[4];
        rt_philox(seed, ctr, w);
        out[i] = normal ? (float)(a * rt_normal(w)) : (float)(a + (b - a) * rt_unit(w[0], w[1]));
    }
}
