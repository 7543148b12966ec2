/* runtime/cpu/cast.c: conversions between f32 and the 16-bit float formats, rounding to
 * nearest even as PyTorch's .half() and .bfloat16() do (NaN stays NaN, overflow goes
 * to infinity), and the cast kernel. Written out rather than with _Float16, which not
 * every compiler here supports. */
#include <string.h>

#include "cpu_impl.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t cpu_f32_to_bf16(float f)
{
    uint32_t u = bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

float cpu_bf16_to_f32(uint16_t h) { return from_bits((uint32_t)h << 16); }

uint16_t cpu_f32_to_f16(float f)
{
    uint32_t u = bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                         // rounds to inf
    if (a < 0x38800000u) {
        /* Subnormal half (or zero): shift the full significand into place, then round. */
        if (a < 0x33000000u) return (uint16_t)sign;  // below half of the smallest subnormal
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23);            // so that the result counts 2^-24 units
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        q += rem > half || (rem == half && (q & 1));
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u;  // rebias the exponent from 127 to 15
    uint32_t q = r >> 13, rem = r & 0x1fffu;
    q += rem > 0x1000u || (rem == 0x1000u && (q & 1));
    return (uint16_t)(sign | q);
}

float cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return from_bits(sign | 0x7f800000u | (m << 13));
    if (e) return from_bits(sign | ((e + 112) << 23) | (m << 13));
    if (!m) return from_bits(sign);
    /* Subnormal: normalize. */
    int k = 0;
    while (!(m & 0x400u)) m <<= 1, k++;
    return from_bits(sign | ((uint32_t)(113 - k) << 23) | ((m & 0x3ffu) << 13));
}

static float load(const KTensor *t, int64_t i)
{
    switch (t->dtype) {
    case KT_F16: return cpu_f16_to_f32(((const uint16_t *)t->data)[i]);
    case KT_BF16: return cpu_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

static void store(const KTensor *t, int64_t i, float v)
{
    switch (t->dtype) {
    case KT_F16: ((uint16_t *)t->data)[i] = cpu_f32_to_f16(v); break;
    case KT_BF16: ((uint16_t *)t->data)[i] = cpu_f32_to_bf16(v); break;
    default: ((float *)t->data)[i] = v;
    }
}

void cpu_cast(const KCall *k)
{
    const KTensor *x = &k->in[0], *y = &k->out[0];
    int64_t n = x->numel;
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) store(y, i, load(x, i));
}
