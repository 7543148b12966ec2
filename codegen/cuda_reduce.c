/* codegen/cuda_reduce.c: CUDA emitters of the reductions: sum, mean, max, sum_to,
 * max_bwd, softmax, softmax_bwd and sumsq. Semantics are runtime/cpu/reduce.c's.
 *
 * sum, mean, max and sum_to share one engine, as on the CPU: x's dims, unit dims
 * dropped and neighbours of one kind merged, alternate between kept and reduced groups
 * (at most IR_MAX_RANK), and the output holds the kept groups in order. Then
 *   - nothing reduced: a copy (times mean's scale);
 *   - innermost group reduced: each output element reduces runs of x, by one thread,
 *     one warp or one block (by the reduced count), lanes strided over the runs;
 *   - innermost group kept: a block of 32 x BY threads takes 32 adjacent output
 *     columns, its BY rows of threads stride down the reduced index, and thread row 0
 *     adds the BY partial results in order.
 * Offsets are compiled in as divisions by constants. The axis ops (max_bwd, softmax,
 * softmax_bwd) view x as (outer, n, inner): a row kernel (cuda_rows.h) when inner is 1,
 * else one thread per (outer, inner) column walking down n.
 *
 * Every sum runs in an order fixed by the shapes (and the launch geometry, which is
 * compiled in): results are bitwise reproducible run to run, though not bitwise the
 * CPU's (f32 sums in another order). No atomics anywhere. sumsq has no scratch for
 * partial sums, so it runs as one block of 1024 threads accumulating in f64 (as the
 * CPU does), which bounds it by one SM's bandwidth.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include <string.h>

#include "cuda_rows.h"

#define NEG_INF "__int_as_float(0xff800000u)"

typedef enum { RED_SUM, RED_MAX } RedOp;

/* x's dims grouped (see the file comment); strides in elements, contiguous. */
typedef struct {
    int n;
    int64_t sz[IR_MAX_RANK], st[IR_MAX_RANK];
    int red[IR_MAX_RANK];
} Groups;

static Groups groups_of(const Value *x, const int *red)
{
    Groups g = {0};
    for (int d = 0; d < x->rank; d++) {
        if (x->shape[d] == 1) continue;
        if (g.n > 0 && g.red[g.n - 1] == (red[d] != 0)) g.sz[g.n - 1] *= x->shape[d];
        else g.sz[g.n] = x->shape[d], g.red[g.n] = red[d] != 0, g.n++;
    }
    if (g.n > 0) g.st[g.n - 1] = 1;
    for (int d = g.n - 2; d >= 0; d--) g.st[d] = g.st[d + 1] * g.sz[d + 1];
    return g;
}

/* The kept (red 0) or the reduced (red 1) groups of g, outermost first. */
typedef struct {
    int n;
    int64_t sz[IR_MAX_RANK], st[IR_MAX_RANK];
} Split;

static Split groups_with(const Groups *g, int red)
{
    Split s = {0};
    for (int d = 0; d < g->n; d++)
        if (g->red[d] == red) s.sz[s.n] = g->sz[d], s.st[s.n++] = g->st[d];
    return s;
}

/* The offset of flat index `var` over dims listed outermost first, as text. The
 * outermost needs no modulo: var is below the product of the sizes. */
static char *offset_expr(CuCtx *c, const char *var, int nd, const int64_t *sz, const int64_t *st)
{
    char *s = NULL;
    int64_t div = 1;
    for (int d = nd - 1; d >= 0; d--) {
        char *q = div == 1 ? cu_fmt(c, "%s", var) : cu_fmt(c, "(%s / %lldLL)", var, (long long)div);
        char *term = d == 0 ? cu_fmt(c, "%s * %lldLL", q, (long long)st[d])
                            : cu_fmt(c, "(%s %% %lldLL) * %lldLL", q, (long long)sz[d], (long long)st[d]);
        s = s ? cu_fmt(c, "%s + %s", term, s) : term;
        div *= sz[d];
    }
    return s ? s : cu_fmt(c, "0LL");
}

/* The text that folds v into acc, acc's start, and the factor applied at the end. */
static const char *combine(RedOp op) { return op == RED_SUM ? "acc += v;" : "acc = fmaxf(acc, v);"; }
static const char *init_of(RedOp op) { return op == RED_SUM ? "0.f" : NEG_INF; }
static char *scaled(CuCtx *c, const char *what, float scale)
{
    return scale == 1.0f ? cu_fmt(c, "%s", what) : cu_fmt(c, "%s * %s", what, cu_float(c, scale));
}

/* A launch of one thread for each of n items, 256 to a block. */
static int flat_launch(CuCtx *c, const char *prefix, const char *src, int64_t n, const int *args, int n_args)
{
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(n, 256), &grid)) return -1;
    return cu_launch(c, prefix, src, grid, (CuDim){256, 1, 1}, 0, args, n_args);
}

/* Nothing reduced: the output is x in the same order, times scale. */
static int emit_copy(CuCtx *c, const char *prefix, int64_t n, float scale)
{
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ x, %s *__restrict__ out)\n"
        "{\n"
        "    const long long e = (long long)blockIdx.x * 256 + threadIdx.x;\n"
        "    if (e < %lldLL) st(out, e, %s);\n"
        "}\n",
        cu_tin(c, 0), cu_tout(c, 0), (long long)n, scaled(c, "ld(x, e)", scale));
    return flat_launch(c, prefix, src, n, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* Innermost group reduced: output element `row` reduces nred elements at kept offset
 * + reduced offset, its threads strided over them. */
static int emit_runs(CuCtx *c, const char *prefix, RedOp op, const Groups *g, int64_t nout, int64_t nred, float scale)
{
    Split k = groups_with(g, 0), r = groups_with(g, 1);
    // a thread for a few elements, a warp for some, a block of 256 for many
    RowGeo geo = nred <= 32 ? row_geo_thread(nout) : nred <= 4096 ? row_geo(nout, 1) : row_geo(nout, ROW_WARP_MAX + 1);
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ x, %s *__restrict__ out)\n"
        "{\n"
        "%s"
        "    const long long xb = %s;\n"
        "    float acc = %s;\n"
        "    for (long long q = tid; q < %lldLL; q += NTR) {\n"
        "        const float v = ld(x, xb + %s);\n"
        "        %s\n"
        "    }\n"
        "    acc = %s(acc);\n"
        "    if (tid == 0) st(out, row, %s);\n"
        "}\n",
        cu_tin(c, 0), cu_tout(c, 0), row_head(c, &geo, nout), offset_expr(c, "row", k.n, k.sz, k.st), init_of(op),
        (long long)nred, offset_expr(c, "q", r.n, r.sz, r.st), combine(op), op == RED_SUM ? geo.sum : geo.max,
        scaled(c, "acc", scale));
    return row_launch(c, prefix, src, &geo, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* Innermost group kept: see the file comment. */
static int emit_cols(CuCtx *c, const char *prefix, RedOp op, const Groups *g, int64_t nout, int64_t nred, float scale)
{
    Split k = groups_with(g, 0), r = groups_with(g, 1);
    int64_t inner = k.sz[k.n - 1], rows = nout / inner, ncb = cu_cdiv(inner, 32);
    int by = nred >= 512 ? 32 : 8;
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ x, %s *__restrict__ out)\n"
        "{\n"
        "    __shared__ float part[%d][33];\n"
        "    const long long r = blockIdx.x / %lldLL;\n"
        "    const long long i = (blockIdx.x %% %lldLL) * 32 + threadIdx.x;\n"
        "    float acc = %s;\n"
        "    if (i < %lldLL) {\n"
        "        const long long xb = %s + i;\n"
        "        for (long long q = threadIdx.y; q < %lldLL; q += %d) {\n"
        "            const float v = ld(x, xb + %s);\n"
        "            %s\n"
        "        }\n"
        "    }\n"
        "    part[threadIdx.y][threadIdx.x] = acc;\n"
        "    __syncthreads();\n"
        "    if (threadIdx.y == 0 && i < %lldLL) {\n"
        "        for (int y = 1; y < %d; y++) {\n"
        "            const float v = part[y][threadIdx.x];\n"
        "            %s\n"
        "        }\n"
        "        st(out, r * %lldLL + i, %s);\n"
        "    }\n"
        "}\n",
        cu_tin(c, 0), cu_tout(c, 0), by, (long long)ncb, (long long)ncb, init_of(op), (long long)inner,
        offset_expr(c, "r", k.n - 1, k.sz, k.st), (long long)nred, by, offset_expr(c, "q", r.n, r.sz, r.st), combine(op),
        (long long)inner, by, combine(op), (long long)inner, scaled(c, "acc", scale));
    CuDim grid;
    if (cu_grid1(c, rows * ncb, &grid)) return -1;
    return cu_launch(c, prefix, src, grid, (CuDim){32, by, 1}, 0, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* out = scale * (x reduced by op over the dims d with red[d]). */
static int emit_engine(CuCtx *c, const char *prefix, RedOp op, const int *red, float scale)
{
    const Value *x = cu_inv(c, 0), *o = cu_outv(c, 0);
    if (!dtype_is_float(x->dtype) || !dtype_is_float(o->dtype)) return cu_fail(c, "%s: float tensors only", prefix);
    Groups g = groups_of(x, red);
    int64_t nout = ir_numel(o), nred = ir_numel(x) / nout;
    int any = 0;
    for (int d = 0; d < g.n; d++) any |= g.red[d];
    if (!any) return emit_copy(c, prefix, nout, scale);
    if (g.red[g.n - 1]) return emit_runs(c, prefix, op, &g, nout, nred, scale);
    return emit_cols(c, prefix, op, &g, nout, nred, scale);
}

static int emit_axis_reduce(CuCtx *c, const char *prefix, RedOp op, int mean)
{
    const Value *x = cu_inv(c, 0);
    int axis = cu_axis(ir_attr_int(c->g, cu_node(c), "axis", -1), x->rank), red[IR_MAX_RANK] = {0};
    if (axis < 0) return cu_fail(c, "%s: axis out of range for rank %d", prefix, x->rank);
    red[axis] = 1;
    return emit_engine(c, prefix, op, red, mean ? 1.0f / (float)x->shape[axis] : 1.0f);
}

int cuda_sum(CuCtx *c) { return emit_axis_reduce(c, "sum", RED_SUM, 0); }
int cuda_mean(CuCtx *c) { return emit_axis_reduce(c, "mean", RED_SUM, 1); }
int cuda_max(CuCtx *c) { return emit_axis_reduce(c, "max", RED_MAX, 0); }

/* sum_to(x, shape): the output's dims align right with x's; leading dims of x, and
 * output dims of 1 that are not 1 in x, are summed. */
int cuda_sum_to(CuCtx *c)
{
    const Value *x = cu_inv(c, 0), *o = cu_outv(c, 0);
    int off = x->rank - o->rank, red[IR_MAX_RANK] = {0};
    if (off < 0) return cu_fail(c, "sum_to: rank %d to %d", x->rank, o->rank);
    for (int d = 0; d < x->rank; d++) {
        if (d < off) {
            red[d] = 1;
            continue;
        }
        int64_t want = o->shape[d - off];
        if (want != x->shape[d] && want != 1)
            return cu_fail(c, "sum_to: dim %d: %lld does not reduce to %lld", d, (long long)x->shape[d], (long long)want);
        red[d] = want != x->shape[d];
    }
    return emit_engine(c, "sum_to", RED_SUM, red, 1.0f);
}

/* ---- axis ops ------------------------------------------------------------------------ */

/* The (outer, n, inner) view of input 0 around the attribute `axis`; -1 (cu_fail) when
 * out of range. */
static int axis_view(CuCtx *c, const char *op, int64_t *outer, int64_t *n, int64_t *inner)
{
    const Value *x = cu_inv(c, 0);
    int axis = cu_axis(ir_attr_int(c->g, cu_node(c), "axis", -1), x->rank);
    if (axis < 0) return cu_fail(c, "%s: axis out of range for rank %d", op, x->rank);
    if (!dtype_is_float(x->dtype)) return cu_fail(c, "%s: float tensors only", op);
    cu_around(x, axis, outer, n, inner);
    return 0;
}

/* The opening of a kernel with one thread per (outer, inner) column: `base` is the
 * column's first element, elements down n are `inner` apart. */
static char *column_head(CuCtx *c, int64_t outer, int64_t n, int64_t inner)
{
    return cu_fmt(c,
                  "    const long long t = (long long)blockIdx.x * 256 + threadIdx.x;\n"
                  "    if (t >= %lldLL) return;\n"
                  "    const long long o = t / %lldLL, base = o * %lldLL + t %% %lldLL;\n"
                  "    const long long N = %lldLL, INNER = %lldLL;\n",
                  (long long)(outer * inner), (long long)inner, (long long)(n * inner), (long long)inner, (long long)n,
                  (long long)inner);
}

/* max_bwd(x, dy, axis, keepdim): dx is dy at the first maximum along the axis, 0
 * elsewhere; dy holds outer * inner elements whether or not the axis was kept. A warp
 * reduces a row to (max, first index), ties to the lower index, and takes lane 0's
 * answer so that every lane agrees even on NaN. */
int cuda_max_bwd(CuCtx *c)
{
    int64_t outer, n, inner;
    if (axis_view(c, "max_bwd", &outer, &n, &inner)) return -1;
    int args[3] = {cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)};
    const char *sig = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ x, const %s *__restrict__ dy, %s *__restrict__ dx)\n",
        cu_tin(c, 0), cu_tin(c, 1), cu_tout(c, 0));
    if (inner > 1) {
        const char *src = cu_fmt(c,
            "%s{\n%s"
            "    float best = ld(x, base);\n"
            "    long long arg = 0;\n"
            "    for (long long j = 1; j < N; j++) {\n"
            "        const float v = ld(x, base + j * INNER);\n"
            "        if (v > best) best = v, arg = j;\n"
            "    }\n"
            "    const float g = ld(dy, t);\n"
            "    for (long long j = 0; j < N; j++) st(dx, base + j * INNER, j == arg ? g : 0.f);\n"
            "}\n",
            sig, column_head(c, outer, n, inner));
        return flat_launch(c, "max_bwd", src, outer * inner, args, 3);
    }
    RowGeo geo = row_geo(outer, 1);  // a warp per row, whatever its length
    const char *src = cu_fmt(c,
        "%s{\n%s"
        "    const long long N = %lldLL, base = row * N;\n"
        "    float best = 0.f;\n"
        "    long long arg = N;  // N: this lane has seen nothing yet\n"
        "    for (long long j = tid; j < N; j += NTR) {\n"
        "        const float v = ld(x, base + j);\n"
        "        if (arg == N || v > best) best = v, arg = j;\n"
        "    }\n"
        "    for (int s = 16; s > 0; s >>= 1) {\n"
        "        const float ob = __shfl_xor_sync(0xffffffffu, best, s);\n"
        "        const long long oa = __shfl_xor_sync(0xffffffffu, arg, s);\n"
        "        if (oa != N && (arg == N || ob > best || (ob == best && oa < arg))) best = ob, arg = oa;\n"
        "    }\n"
        "    arg = __shfl_sync(0xffffffffu, arg, 0);\n"
        "    const float g = ld(dy, row);\n"
        "    for (long long j = tid; j < N; j += NTR) st(dx, base + j, j == arg ? g : 0.f);\n"
        "}\n",
        sig, row_head(c, &geo, outer), (long long)n);
    return row_launch(c, "max_bwd", src, &geo, args, 3);
}

/* softmax(x, axis): y = exp(x - max) / sum(exp(x - max)), as 1/sum times each term. */
int cuda_softmax(CuCtx *c)
{
    int64_t outer, n, inner;
    if (axis_view(c, "softmax", &outer, &n, &inner)) return -1;
    int args[2] = {cu_in_id(c, 0), cu_out_id(c, 0)};
    const char *sig = cu_fmt(c, "extern \"C\" __global__ void KNAME(const %s *__restrict__ x, %s *__restrict__ y)\n",
                             cu_tin(c, 0), cu_tout(c, 0));
    if (inner > 1) {
        const char *src = cu_fmt(c,
            "%s{\n%s"
            "    float m = " NEG_INF ";\n"
            "    for (long long j = 0; j < N; j++) m = fmaxf(m, ld(x, base + j * INNER));\n"
            "    float s = 0.f;\n"
            "    for (long long j = 0; j < N; j++) s += expf(ld(x, base + j * INNER) - m);\n"
            "    const float r = 1.0f / s;\n"
            "    for (long long j = 0; j < N; j++) st(y, base + j * INNER, expf(ld(x, base + j * INNER) - m) * r);\n"
            "}\n",
            sig, column_head(c, outer, n, inner));
        return flat_launch(c, "softmax", src, outer * inner, args, 2);
    }
    RowGeo geo = row_geo(outer, n);
    const char *src = cu_fmt(c,
        "%s{\n%s"
        "    const long long N = %lldLL, base = row * N;\n"
        "    float m = " NEG_INF ";\n"
        "    for (long long j = tid; j < N; j += NTR) m = fmaxf(m, ld(x, base + j));\n"
        "    m = %s(m);\n"
        "    float s = 0.f;\n"
        "    for (long long j = tid; j < N; j += NTR) s += expf(ld(x, base + j) - m);\n"
        "    const float r = 1.0f / %s(s);\n"
        "    for (long long j = tid; j < N; j += NTR) st(y, base + j, expf(ld(x, base + j) - m) * r);\n"
        "}\n",
        sig, row_head(c, &geo, outer), (long long)n, geo.max, geo.sum);
    return row_launch(c, "softmax", src, &geo, args, 2);
}

/* softmax_bwd(y, dy, axis): dx = y * (dy - sum(dy * y)). */
int cuda_softmax_bwd(CuCtx *c)
{
    int64_t outer, n, inner;
    if (axis_view(c, "softmax_bwd", &outer, &n, &inner)) return -1;
    int args[3] = {cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)};
    const char *sig = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ y, const %s *__restrict__ dy, %s *__restrict__ dx)\n",
        cu_tin(c, 0), cu_tin(c, 1), cu_tout(c, 0));
    if (inner > 1) {
        const char *src = cu_fmt(c,
            "%s{\n%s"
            "    float s = 0.f;\n"
            "    for (long long j = 0; j < N; j++) s += ld(y, base + j * INNER) * ld(dy, base + j * INNER);\n"
            "    for (long long j = 0; j < N; j++) {\n"
            "        const long long e = base + j * INNER;\n"
            "        st(dx, e, ld(y, e) * (ld(dy, e) - s));\n"
            "    }\n"
            "}\n",
            sig, column_head(c, outer, n, inner));
        return flat_launch(c, "softmax_bwd", src, outer * inner, args, 3);
    }
    RowGeo geo = row_geo(outer, n);
    const char *src = cu_fmt(c,
        "%s{\n%s"
        "    const long long N = %lldLL, base = row * N;\n"
        "    float s = 0.f;\n"
        "    for (long long j = tid; j < N; j += NTR) s += ld(y, base + j) * ld(dy, base + j);\n"
        "    s = %s(s);\n"
        "    for (long long j = tid; j < N; j += NTR) st(dx, base + j, ld(y, base + j) * (ld(dy, base + j) - s));\n"
        "}\n",
        sig, row_head(c, &geo, outer), (long long)n, geo.sum);
    return row_launch(c, "softmax_bwd", src, &geo, args, 3);
}

/* sumsq(x) -> f32 []: the sum of squares of every element, in f64 (see the file
 * comment): per thread over a stride of 1024, then warps by shuffles, then warp 0's
 * thread 0 adds the 32 warp sums in order. */
int cuda_sumsq(CuCtx *c)
{
    const Value *x = cu_inv(c, 0);
    if (!dtype_is_float(x->dtype) || cu_outv(c, 0)->dtype != DT_F32) return cu_fail(c, "sumsq: float in, f32 out only");
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void __launch_bounds__(1024) KNAME(const %s *__restrict__ x, float *__restrict__ out)\n"
        "{\n"
        "    __shared__ double part[32];\n"
        "    double acc = 0.0;\n"
        "    for (long long i = threadIdx.x; i < %lldLL; i += 1024) {\n"
        "        const double v = ld(x, i);\n"
        "        acc += v * v;\n"
        "    }\n"
        "    for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);\n"
        "    if (threadIdx.x %% 32 == 0) part[threadIdx.x / 32] = acc;\n"
        "    __syncthreads();\n"
        "    if (threadIdx.x == 0) {\n"
        "        double s = 0.0;\n"
        "        for (int w = 0; w < 32; w++) s += part[w];\n"
        "        out[0] = (float)s;\n"
        "    }\n"
        "}\n",
        cu_tin(c, 0), (long long)ir_numel(x));
    return cu_launch(c, "sumsq", src, (CuDim){1, 1, 1}, (CuDim){1024, 1, 1}, 0, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)},
                     2);
}
