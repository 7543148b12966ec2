/* ops/powc.h: x ** p for a constant p (the pow op), as PyTorch's pow with a scalar exponent
 * computes it, and its derivative: the one text that both the CPU kernels
 * (runtime/cpu/elementwise.c) and the CUDA kernels (every CUDA module carries FS_POWC_CUDA
 * after its prelude, for the elementwise chains of codegen/cuda_elementwise.c) compile, so
 * both backends take the same path for each exponent.
 *
 * FS_POWC_DEFS(QUAL) defines, with QUAL in front of each function:
 *   float fs_pow(float x, float p)       the exponents PyTorch computes without pow (2 and 3
 *       as products, 0.5 as sqrt, -0.5 as 1 / sqrt, -1 and -2 as reciprocals, 0 and 1) the
 *       same way, powf for the rest (a negative x to a fractional p is NaN)
 *   float fs_pow_grad(float x, float p)  p x ** (p - 1); 0 for p = 0, where PyTorch gives
 *       zeros (not 0 * inf at x = 0)
 * In CUDA p is a literal of the kernel, so the branches fold away. The text is plain C that
 * is also CUDA C++ (no preprocessor lines, no // comments), as it is stringized whole into
 * FS_POWC_CUDA.
 */
#ifndef FS_OPS_POWC_H
#define FS_OPS_POWC_H

#include <math.h>

#define FS_POWC_DEFS(QUAL)                                                                               \
    QUAL float fs_pow(float x, float p)                                                                  \
    {                                                                                                    \
        if (p == 2.0f) return x * x;                                                                     \
        if (p == 1.0f) return x;                                                                         \
        if (p == 0.5f) return sqrtf(x);                                                                  \
        if (p == 3.0f) return x * x * x;                                                                 \
        if (p == 0.0f) return 1.0f;                                                                      \
        if (p == -1.0f) return 1.0f / x;                                                                 \
        if (p == -0.5f) return 1.0f / sqrtf(x);                                                          \
        if (p == -2.0f) return 1.0f / (x * x);                                                           \
        return powf(x, p);                                                                               \
    }                                                                                                    \
    QUAL float fs_pow_grad(float x, float p) { return p == 0.0f ? 0.0f : p * fs_pow(x, p - 1.0f); }

#define FS_POWC_STR_(...) #__VA_ARGS__
#define FS_POWC_STR(...) FS_POWC_STR_(__VA_ARGS__)
/* The same functions as CUDA device code, a string literal for a module's text; not static,
 * like the prelude's functions (NVRTC warns of a static one a module does not call). */
#define FS_POWC_CUDA FS_POWC_STR(FS_POWC_DEFS(__device__ __forceinline__)) "\n"

FS_POWC_DEFS(static inline)

#endif
