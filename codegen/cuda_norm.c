/* codegen/cuda_norm.c: CUDA emitters of layernorm and rmsnorm over the last dim, and
 * of their backward ops. Semantics are runtime/cpu/norm.c's: x is (rows, C); layernorm
 * takes PyTorch's biased variance in two passes (mean, then the centred sum of
 * squares), rstd = 1 / sqrt(var + eps); rmsnorm has mean 0.
 *
 * Forward: one row kernel (cuda_rows.h): statistics by row reductions, then
 * y = (x - mean) * rstd * w (+ b).
 *
 * Backward, (x, w, dy) -> dx, dw (, db), in three kernels and without atomics:
 *   1. partials: block p of P takes a chunk of 32 to 63 consecutive rows, its warps
 *      put each row's mean and rstd in shared memory, then each thread sums, for its
 *      columns and in row order, dy * xhat and dy over the chunk. With P > 1 these
 *      partial sums go to dx's bytes as f32 scratch (P * 2C floats: at most an eighth
 *      of dx, whatever its dtype); with P = 1 (fewer than 64 rows) they are dw and db.
 *   2. finish (P > 1): dw[c] and db[c] add the P partials in order, by blocks of
 *      32 columns x 8 threads down p, the 8 partial sums then added in order.
 *   3. dx: one row kernel recomputes the row's statistics and writes
 *      dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w (rmsnorm: no
 *      mean(g) term), over the scratch, which kernel 2 has finished reading.
 * So every sum has one order fixed by the shapes: bitwise reproducible. dx must not
 * share bytes with x or dy (as on the CPU) and starts 4-byte aligned (memplan gives
 * every buffer 64).
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include "cuda_rows.h"

enum { CHUNK_ROWS = 32 };  // rows per block of the partials kernel: 32 to 63 each

/* The statistics of the row at `base`: `mean` (0 for rms) and `rstd`, reduced over the
 * row's threads by `sum` (a row kernel's or, in the partials kernel, a warp's). */
static char *stats_text(CuCtx *c, int rms, const char *sum, const char *tid, const char *ntr, int64_t C, float eps)
{
    const char *mean = rms ? "    const float mean = 0.f;\n"
                           : cu_fmt(c,
                                    "    float mean = 0.f;\n"
                                    "    for (long long j = %s; j < C; j += %s) mean += ld(x, base + j);\n"
                                    "    mean = %s(mean) / (float)C;\n",
                                    tid, ntr, sum);
    return cu_fmt(c,
                  "%s"
                  "    float var = 0.f;\n"
                  "    for (long long j = %s; j < C; j += %s) {\n"
                  "        const float d = ld(x, base + j) - mean;\n"
                  "        var += d * d;\n"
                  "    }\n"
                  "    const float rstd = 1.0f / sqrtf(%s(var) / (float)C + %s);\n",
                  mean, tid, ntr, sum, cu_float(c, eps));
}

static int want_floats(CuCtx *c, const char *op, int n_in)
{
    for (int i = 0; i < n_in; i++)
        if (!dtype_is_float(cu_inv(c, i)->dtype)) return cu_fail(c, "%s: float tensors only", op);
    return 0;
}

/* layernorm(x, w, b, eps), rmsnorm(x, w, eps) -> y */
static int emit_norm(CuCtx *c, int rms)
{
    const char *op = op_name(cu_node(c)->op);
    if (want_floats(c, op, rms ? 2 : 3)) return -1;
    const Value *x = cu_inv(c, 0);
    int64_t C = x->shape[x->rank - 1], rows = ir_numel(x) / C;
    float eps = (float)ir_attr_float(c->g, cu_node(c), "eps", 1e-5);
    RowGeo geo = row_geo(rows, C);
    const char *bias = rms ? "" : cu_fmt(c, "const %s *__restrict__ b, ", cu_tin(c, 2));
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ x, const %s *__restrict__ w, %s%s *__restrict__ y)\n"
        "{\n"
        "%s"
        "    const long long C = %lldLL, base = row * C;\n"
        "%s"
        "    for (long long j = tid; j < C; j += NTR) st(y, base + j, %s);\n"
        "}\n",
        cu_tin(c, 0), cu_tin(c, 1), bias, cu_tout(c, 0), row_head(c, &geo, rows), (long long)C,
        stats_text(c, rms, geo.sum, "tid", "NTR", C, eps),
        rms ? "ld(x, base + j) * rstd * ld(w, j)" : "(ld(x, base + j) - mean) * rstd * ld(w, j) + ld(b, j)");
    if (rms) return row_launch(c, op, src, &geo, (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
    return row_launch(c, op, src, &geo, (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_in_id(c, 2), cu_out_id(c, 0)}, 4);
}

int cuda_layernorm(CuCtx *c) { return emit_norm(c, 0); }
int cuda_rmsnorm(CuCtx *c) { return emit_norm(c, 1); }

/* ---- backward ---------------------------------------------------------------------- */

/* Kernel 1 (file comment): x, dy -> partial sums in dx's bytes, or dw (and db). */
static int emit_partials(CuCtx *c, int rms, int64_t rows, int64_t C, int64_t P, float eps)
{
    const char *op = op_name(cu_node(c)->op);
    const char *outs = P > 1 ? cu_fmt(c, "%s *__restrict__ dx", cu_tout(c, 0))
                     : rms   ? cu_fmt(c, "%s *__restrict__ dw", cu_tout(c, 1))
                             : cu_fmt(c, "%s *__restrict__ dw, %s *__restrict__ db", cu_tout(c, 1), cu_tout(c, 2));
    const char *store = P > 1 ? cu_fmt(c,
                                       "        float *part = reinterpret_cast<float *>(dx) + p * %lldLL;\n"
                                       "        part[c] = aw;\n"
                                       "%s",
                                       (long long)(2 * C), rms ? "" : "        part[C + c] = ab;\n")
                              : cu_fmt(c, "        st(dw, c, aw);\n%s", rms ? "" : "        st(db, c, ab);\n");
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void __launch_bounds__(256) KNAME(const %s *__restrict__ x, const %s *__restrict__ dy, %s)\n"
        "{\n"
        "    __shared__ float s_mean[64], s_rstd[64];\n"
        "    const long long C = %lldLL, ROWS = %lldLL, P = %lldLL;\n"
        "    const long long p = blockIdx.x, r0 = p * ROWS / P, r1 = (p + 1) * ROWS / P;\n"
        "    const int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;\n"
        "    for (long long r = r0 + warp; r < r1; r += 8) {\n"
        "        const long long base = r * C;\n"
        "    %s"
        "        if (lane == 0) s_mean[r - r0] = mean, s_rstd[r - r0] = rstd;\n"
        "    }\n"
        "    __syncthreads();\n"
        "    for (long long c = threadIdx.x; c < C; c += 256) {\n"
        "        float aw = 0.f, ab = 0.f;\n"
        "        for (long long r = r0; r < r1; r++) {\n"
        "            const float g = ld(dy, r * C + c);\n"
        "            aw += g * ((ld(x, r * C + c) - s_mean[r - r0]) * s_rstd[r - r0]);\n"
        "            ab += g;\n"
        "        }\n"
        "%s"
        "    }\n"
        "}\n",
        cu_tin(c, 0), cu_tin(c, 2), outs, (long long)C, (long long)rows, (long long)P,
        stats_text(c, rms, "fs_warp_sum", "lane", "32", C, eps), store);
    int args[4] = {cu_in_id(c, 0), cu_in_id(c, 2)}, n = 2;
    if (P > 1) args[n++] = cu_out_id(c, 0);
    else {
        args[n++] = cu_out_id(c, 1);
        if (!rms) args[n++] = cu_out_id(c, 2);
    }
    CuDim grid;
    if (cu_grid1(c, P, &grid)) return -1;
    return cu_launch(c, op, src, grid, (CuDim){256, 1, 1}, 0, args, n);
}

/* Kernel 2: dw (and db) from the P partials in dx's bytes. */
static int emit_finish(CuCtx *c, int rms, int64_t C, int64_t P)
{
    const char *op = op_name(cu_node(c)->op);
    const char *db = rms ? "" : cu_fmt(c, ", %s *__restrict__ db", cu_tout(c, 2));
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ dx, %s *__restrict__ dw%s)\n"
        "{\n"
        "    __shared__ float pw[8][33], pb[8][33];\n"
        "    const long long C = %lldLL, P = %lldLL;\n"
        "    const long long c = (long long)blockIdx.x * 32 + threadIdx.x;\n"
        "    const float *part = reinterpret_cast<const float *>(dx);\n"
        "    float aw = 0.f, ab = 0.f;\n"
        "    if (c < C)\n"
        "        for (long long p = threadIdx.y; p < P; p += 8) aw += part[p * 2 * C + c], ab += part[p * 2 * C + C + c];\n"
        "    pw[threadIdx.y][threadIdx.x] = aw, pb[threadIdx.y][threadIdx.x] = ab;\n"
        "    __syncthreads();\n"
        "    if (threadIdx.y != 0 || c >= C) return;\n"
        "    for (int y = 1; y < 8; y++) aw += pw[y][threadIdx.x], ab += pb[y][threadIdx.x];\n"
        "    st(dw, c, aw);\n"
        "%s"
        "}\n",
        cu_tout(c, 0), cu_tout(c, 1), db, (long long)C, (long long)P, rms ? "" : "    st(db, c, ab);\n");
    int args[3] = {cu_out_id(c, 0), cu_out_id(c, 1), rms ? 0 : cu_out_id(c, 2)};
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(C, 32), &grid)) return -1;
    return cu_launch(c, op, src, grid, (CuDim){32, 8, 1}, 0, args, rms ? 2 : 3);
}

/* Kernel 3: dx, row by row. */
static int emit_dx(CuCtx *c, int rms, int64_t rows, int64_t C, float eps)
{
    const char *op = op_name(cu_node(c)->op);
    RowGeo geo = row_geo(rows, C);
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ x, const %s *__restrict__ w, const %s *__restrict__ dy, "
        "%s *__restrict__ dx)\n"
        "{\n"
        "%s"
        "    const long long C = %lldLL, base = row * C;\n"
        "%s"
        "    float a = 0.f, b = 0.f;\n"
        "    for (long long j = tid; j < C; j += NTR) {\n"
        "        const float g = ld(dy, base + j) * ld(w, j), h = (ld(x, base + j) - mean) * rstd;\n"
        "        a += g, b += g * h;\n"
        "    }\n"
        "    a = %s;\n"
        "    b = %s(b) / (float)C;\n"
        "    for (long long j = tid; j < C; j += NTR) {\n"
        "        const float g = ld(dy, base + j) * ld(w, j), h = (ld(x, base + j) - mean) * rstd;\n"
        "        st(dx, base + j, rstd * (g - a - h * b));\n"
        "    }\n"
        "}\n",
        cu_tin(c, 0), cu_tin(c, 1), cu_tin(c, 2), cu_tout(c, 0), row_head(c, &geo, rows), (long long)C,
        stats_text(c, rms, geo.sum, "tid", "NTR", C, eps), rms ? "0.f" : cu_fmt(c, "%s(a) / (float)C", geo.sum), geo.sum);
    return row_launch(c, op, src, &geo, (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_in_id(c, 2), cu_out_id(c, 0)}, 4);
}

/* layernorm_bwd(x, w, dy, eps) -> dx, dw, db; rmsnorm_bwd(x, w, dy, eps) -> dx, dw */
static int emit_norm_bwd(CuCtx *c, int rms)
{
    if (want_floats(c, op_name(cu_node(c)->op), 3)) return -1;
    const Value *x = cu_inv(c, 0);
    int64_t C = x->shape[x->rank - 1], rows = ir_numel(x) / C, P = rows / CHUNK_ROWS > 1 ? rows / CHUNK_ROWS : 1;
    float eps = (float)ir_attr_float(c->g, cu_node(c), "eps", 1e-5);
    if (emit_partials(c, rms, rows, C, P, eps)) return -1;
    if (P > 1 && emit_finish(c, rms, C, P)) return -1;
    return emit_dx(c, rms, rows, C, eps);
}

int cuda_layernorm_bwd(CuCtx *c) { return emit_norm_bwd(c, 0); }
int cuda_rmsnorm_bwd(CuCtx *c) { return emit_norm_bwd(c, 1); }
