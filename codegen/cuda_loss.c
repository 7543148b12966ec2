/* codegen/cuda_loss.c: CUDA emitters of cross_entropy and cross_entropy_bwd.
 * Semantics are runtime/cpu/embed.c's: logits [..., V] and i32 targets [...];
 *   loss = mean over rows of logsumexp(row) - row[target]      (an f32 scalar)
 *   dlogits = (softmax(row) - onehot(target)) * dloss / rows   (logits' dtype)
 *
 * A row's logsumexp is taken in one pass: each thread keeps a running max m and a sum s
 * of exp(x - m) over its elements (rescaling s when m grows), then the row's threads
 * combine them: M = max m, S = sum s * exp(m - M).
 *
 * The loss has no scratch to hold per-row terms, and must not depend on timing, so it
 * is one block of 1024 threads: warp w takes rows w, w + 32, ..., adds their terms in
 * f64 (as the CPU does) in row order, and thread 0 adds the 32 warp sums in order. That
 * bounds the forward loss by one SM's bandwidth; the backward is a row kernel
 * (cuda_rows.h) over every row.
 *
 * A target outside [0, V) is bad data: the kernel traps (the launch fails, and the
 * runtime reports it) rather than read out of bounds, as the CPU stops.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include "cuda_rows.h"

/* The running (m, s) of the row at `base` over this thread's elements, then combined
 * by `max` and `sum` into M and S. */
static char *lse_text(CuCtx *c, const char *max, const char *sum)
{
    return cu_fmt(c,
                  "        float m = __int_as_float(0xff800000u), s = 0.f;\n"
                  "        for (long long j = tid; j < V; j += NTR) {\n"
                  "            const float v = ld(lg, base + j);\n"
                  "            if (v > m) s = s * expf(m - v) + 1.0f, m = v;\n"
                  "            else s += expf(v - m);\n"
                  "        }\n"
                  "        const float M = %s(m);\n"
                  "        const float S = %s(s == 0.f ? 0.f : s * expf(m - M));\n",
                  max, sum);
}

static int want_types(CuCtx *c, const char *op)
{
    if (!dtype_is_float(cu_inv(c, 0)->dtype) || cu_inv(c, 1)->dtype != DT_I32)
        return cu_fail(c, "%s: float logits and i32 targets only", op);
    return 0;
}

/* cross_entropy(logits, targets) -> f32 [] */
int cuda_cross_entropy(CuCtx *c)
{
    if (want_types(c, "cross_entropy")) return -1;
    const Value *lg = cu_inv(c, 0);
    int64_t V = lg->shape[lg->rank - 1], rows = ir_numel(lg) / V;
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void __launch_bounds__(1024) KNAME(const %s *__restrict__ lg, const int *__restrict__ tg, "
        "%s *__restrict__ loss)\n"
        "{\n"
        "    __shared__ double part[32];\n"
        "    const long long V = %lldLL, ROWS = %lldLL;\n"
        "    const int tid = threadIdx.x %% 32, NTR = 32;\n"
        "    double acc = 0.0;\n"
        "    for (long long r = threadIdx.x / 32; r < ROWS; r += 32) {\n"
        "        const long long base = r * V;\n"
        "%s"
        "        const int t = tg[r];\n"
        "        if (t < 0 || t >= V) __trap();\n"
        "        acc += (double)(M + logf(S)) - (double)ld(lg, base + t);\n"
        "    }\n"
        "    if (tid == 0) part[threadIdx.x / 32] = acc;\n"
        "    __syncthreads();\n"
        "    if (threadIdx.x != 0) return;\n"
        "    double s = 0.0;\n"
        "    for (int w = 0; w < 32; w++) s += part[w];\n"
        "    st(loss, 0, (float)(s / (double)ROWS));\n"
        "}\n",
        cu_tin(c, 0), cu_tout(c, 0), (long long)V, (long long)rows, lse_text(c, "fs_warp_max", "fs_warp_sum"));
    return cu_launch(c, "cross_entropy", src, (CuDim){1, 1, 1}, (CuDim){1024, 1, 1}, 0,
                     (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
}

/* cross_entropy_bwd(logits, targets, dloss) -> dlogits */
int cuda_cross_entropy_bwd(CuCtx *c)
{
    if (want_types(c, "cross_entropy_bwd")) return -1;
    const Value *lg = cu_inv(c, 0);
    int64_t V = lg->shape[lg->rank - 1], rows = ir_numel(lg) / V;
    RowGeo geo = row_geo(rows, V);
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ lg, const int *__restrict__ tg, const %s *__restrict__ dloss, "
        "%s *__restrict__ dx)\n"
        "{\n"
        "%s"
        "    const long long V = %lldLL, base = row * V;\n"
        "    {\n"
        "%s"
        "        const float g = ld(dloss, 0) / %s, f = g / S;\n"
        "        const int t = tg[row];\n"
        "        if (t < 0 || t >= V) __trap();\n"
        "        for (long long j = tid; j < V; j += NTR) {\n"
        "            const float p = expf(ld(lg, base + j) - M) * f;\n"
        "            st(dx, base + j, j == t ? p - g : p);\n"
        "        }\n"
        "    }\n"
        "}\n",
        cu_tin(c, 0), cu_tin(c, 2), cu_tout(c, 0), row_head(c, &geo, rows), (long long)V, lse_text(c, geo.max, geo.sum),
        cu_float(c, (float)rows));
    return row_launch(c, "cross_entropy_bwd", src, &geo,
                      (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_in_id(c, 2), cu_out_id(c, 0)}, 4);
}
