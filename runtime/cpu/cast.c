/* runtime/cpu/cast.c: conversions between f32 and the 16-bit float formats, rounding to
 * nearest even as PyTorch's .half() and .bfloat16() do (NaN stays NaN, overflow goes
 * to infinity), and the cast kernel. The conversions are cpu_impl.h's branch-free ld_*
 * and st_*, written out rather than with _Float16, which not every compiler here
 * supports; tests/unit/test_cast.c holds them to PyTorch bit for bit. */
#include "cpu_impl.h"

uint16_t cpu_f32_to_bf16(float f) { return st_bf16(f); }
float cpu_bf16_to_f32(uint16_t h) { return ld_bf16(h); }
uint16_t cpu_f32_to_f16(float f) { return st_f16(f); }
float cpu_f16_to_f32(uint16_t h) { return ld_f16(h); }

#define CHUNK 4096  // elements per task

void cpu_cast(const KCall *k)
{
    const KTensor *x = &k->in[0], *y = &k->out[0];
    int64_t n = x->numel, tasks = (n + CHUNK - 1) / CHUNK;
    KCHECK(x->dtype != KT_I32 && y->dtype != KT_I32 && y->numel == n, "cast: bad call (dtype %d to %d)", x->dtype, y->dtype);
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t i0 = t * CHUNK, len = imin(CHUNK, n - i0);
        float buf[CHUNK];
        if (y->dtype == KT_F32) {
            to_f32(fdata(y) + i0, x->data, x->dtype, i0, len);
        } else if (x->dtype == KT_F32) {
            from_f32(y->data, y->dtype, i0, fdata(x) + i0, len);
        } else {
            to_f32(buf, x->data, x->dtype, i0, len);
            from_f32(y->data, y->dtype, i0, buf, len);
        }
    }
}
