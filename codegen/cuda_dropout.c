/* codegen/cuda_dropout.c: the CUDA emitter of dropout(x, rng; p, key, batch, mb, mbs).
 *
 * runtime/cpu/dropout.c is the reference: the mask is ops/philox.h's fs_dropout_keep,
 * which the module's prelude defines from the same text the CPU compiles
 * (FS_PHILOX_CUDA), on the element's index in the global tensor; the rng words (seed,
 * step, data-parallel index) are read on the device, so a step needs no host round trip
 * and can be captured as a graph. Each element is x * scale or x * 0 in f32, the scale
 * 1 / (1 - p) rounded to float once and compiled in exactly, stored to its dtype once.
 */
#include "cuda.h"
#include "philox.h"

int cuda_dropout(CuCtx *c)
{
    const Node *nd = cu_node(c);
    const Value *x = cu_inv(c, 0);
    int64_t n = ir_numel(x);
    if (n == 0) return 0;
    if (cu_inv(c, 1)->dtype != DT_I32) return cu_fail(c, "the rng input must be i32");
    double p = ir_attr_float(c->g, nd, "p", 0);
    if (!(p >= 0 && p < 1)) return cu_fail(c, "p = %g is outside [0, 1)", p);
    int64_t key = ir_attr_int(c->g, nd, "key", 0), batch = ir_attr_int(c->g, nd, "batch", 0);
    int64_t mb = ir_attr_int(c->g, nd, "mb", 0), mbs = ir_attr_int(c->g, nd, "mbs", 1);
    char *base = batch ? cu_fmt(c, "(unsigned long long)(((long long)rng[3] * %lldLL + %lldLL) * %lldLL)", (long long)mbs,
                                (long long)mb, (long long)n)
                       : "0ull";
    char *src = cu_fmt(c,
                       "extern \"C\" __global__ void KNAME(const %s *x, const int *rng, %s *y)\n"
                       "{\n"
                       "    const unsigned long long seed = (unsigned int)rng[0] | (unsigned long long)(unsigned int)rng[1] << 32;\n"
                       "    const unsigned int step = (unsigned int)rng[2];\n"
                       "    const unsigned long long base = %s;\n"
                       "    %s st(y, i, ld(x, i) * (fs_dropout_keep(seed, step, %uu, base + (unsigned long long)i, %lluull) ? %s : 0.0f));\n"
                       "}\n",
                       cu_tin(c, 0), cu_tout(c, 0), base, cu_loop(c, cu_index(n), n), (unsigned)key,
                       fs_dropout_threshold(p), cu_float(c, (float)(1.0 / (1.0 - p))));
    return cu_launch(c, "dropout", src, cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0,
                     (const int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
}
