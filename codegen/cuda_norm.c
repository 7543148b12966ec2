/* codegen/cuda_norm.c: CUDA launches of layernorm and rmsnorm over the last dim, and of
 * their backward ops; the kernels are codegen/kernels/norm.cuh's templates, instantiated
 * with the shapes, dtypes and eps. Semantics are runtime/cpu/norm.c's.
 *
 * Forward: one row kernel (cuda_rows.h): statistics by row reductions, then
 * y = (x - mean) * rstd * w (+ b).
 *
 * Backward, (x, w, dy) -> dx, dw (, db), in three kernels and without atomics:
 *   1. partials: block p of P takes a chunk of 32 to 63 consecutive rows and sums, per
 *      column and in row order, dy * xhat and dy. With P > 1 these partial sums go to
 *      dx's bytes as f32 scratch (P * 2C floats: at most an eighth of dx, whatever its
 *      dtype); with P = 1 (fewer than 64 rows) they are dw and db.
 *   2. finish (P > 1): dw[c] and db[c] add the P partials in order.
 *   3. dx: one row kernel recomputes the row's statistics and writes dx over the
 *      scratch, which kernel 2 has finished reading.
 * So every sum has one order fixed by the shapes: bitwise reproducible. The _add ops
 * (a residual stream's gradient r added to dx) pass r to kernel 3. dx must not
 * share bytes with x, dy or r (as on the CPU) and starts 4-byte aligned (memplan gives
 * every buffer 64).
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include "cuda_rows.h"

enum { CHUNK_ROWS = 32 };  // rows per block of the partials kernel: 32 to 63 each

static int want_floats(CuCtx *c, const char *op, int n_in)
{
    for (int i = 0; i < n_in; i++)
        if (!dtype_is_float(cu_inv(c, i)->dtype)) return cu_fail(c, "%s: float tensors only", op);
    return 0;
}

/* The norm's shape and eps: x is (rows, C). */
typedef struct {
    const char *op, *eps;
    int rms;
    int64_t rows, C;
} Norm;

static Norm norm_of(CuCtx *c, int rms)
{
    const Value *x = cu_inv(c, 0);
    int64_t C = x->shape[x->rank - 1];
    cu_use(c, "norm.cuh");
    return (Norm){op_name(cu_node(c)->op), cu_float(c, (float)ir_attr_float(c->g, cu_node(c), "eps", 1e-5)), rms,
                  ir_numel(x) / C, C};
}

/* layernorm(x, w, b, eps), rmsnorm(x, w, eps) -> y */
static int emit_norm(CuCtx *c, int rms)
{
    if (want_floats(c, op_name(cu_node(c)->op), rms ? 2 : 3)) return -1;
    Norm n = norm_of(c, rms);
    RowGeo geo = row_geo(n.rows, n.C);
    const char *b = rms ? "(const float *)nullptr" : "b";
    const char *src = cu_kernel(
        c, 0,
        cu_fmt(c, "%s, %s, %s%s", cu_pin(c, 0, "x"), cu_pin(c, 1, "w"), rms ? "" : cu_fmt(c, "%s, ", cu_pin(c, 2, "b")),
               cu_pout(c, 0, "y")),
        cu_fmt(c, "fs_norm<%s, %s, %lldLL, %lldLL>(x, w, %s, y, %s)", row_targs(c, &geo), rms ? "true" : "false",
               (long long)n.rows, (long long)n.C, b, n.eps));
    if (rms) return row_launch(c, n.op, src, &geo, (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
    return row_launch(c, n.op, src, &geo, (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_in_id(c, 2), cu_out_id(c, 0)}, 4);
}

int cuda_layernorm(CuCtx *c) { return emit_norm(c, 0); }
int cuda_rmsnorm(CuCtx *c) { return emit_norm(c, 1); }

/* ---- backward ---------------------------------------------------------------------- */

/* Kernel 1 (file comment): x, dy -> partial sums in dx's bytes, or dw (and db). */
static int emit_partials(CuCtx *c, const Norm *n, int64_t P)
{
    const char *outs = P > 1 ? cu_pout(c, 0, "dx")
                     : n->rms ? cu_pout(c, 1, "dw")
                              : cu_fmt(c, "%s, %s", cu_pout(c, 1, "dw"), cu_pout(c, 2, "db"));
    const char *args = P > 1 ? "dx, (float *)nullptr" : n->rms ? "dw, (float *)nullptr" : "dw, db";
    const char *src = cu_kernel(c, 256, cu_fmt(c, "%s, %s, %s", cu_pin(c, 0, "x"), cu_pin(c, 2, "dy"), outs),
                                cu_fmt(c, "fs_norm_bwd_partials<%s, %lldLL, %lldLL, %lldLL>(x, dy, %s, %s)",
                                       n->rms ? "true" : "false", (long long)n->rows, (long long)n->C, (long long)P,
                                       args, n->eps));
    int a[4] = {cu_in_id(c, 0), cu_in_id(c, 2)}, k = 2;
    if (P > 1) a[k++] = cu_out_id(c, 0);
    else {
        a[k++] = cu_out_id(c, 1);
        if (!n->rms) a[k++] = cu_out_id(c, 2);
    }
    CuDim grid;
    if (cu_grid1(c, P, &grid)) return -1;
    return cu_launch(c, n->op, src, grid, (CuDim){256, 1, 1}, 0, a, k);
}

/* Kernel 2: dw (and db) from the P partials in dx's bytes. */
static int emit_finish(CuCtx *c, const Norm *n, int64_t P)
{
    const char *params = cu_fmt(c, "const %s, %s%s", cu_pout(c, 0, "dx"), cu_pout(c, 1, "dw"),
                                n->rms ? "" : cu_fmt(c, ", %s", cu_pout(c, 2, "db")));
    const char *src = cu_kernel(c, 0, params,
                                cu_fmt(c, "fs_norm_bwd_finish<%s, %lldLL, %lldLL>(dx, dw, %s)", n->rms ? "true" : "false",
                                       (long long)n->C, (long long)P, n->rms ? "(float *)nullptr" : "db"));
    int a[3] = {cu_out_id(c, 0), cu_out_id(c, 1), n->rms ? 0 : cu_out_id(c, 2)};
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(n->C, 32), &grid)) return -1;
    return cu_launch(c, n->op, src, grid, (CuDim){32, 8, 1}, 0, a, n->rms ? 2 : 3);
}

/* Kernel 3: dx, row by row (plus r, the _add ops' input 3). */
static int emit_dx(CuCtx *c, const Norm *n)
{
    RowGeo geo = row_geo(n->rows, n->C);
    int add = cu_node(c)->n_in == 4;
    const char *src = cu_kernel(
        c, 0,
        cu_fmt(c, "%s, %s, %s, %s%s", cu_pin(c, 0, "x"), cu_pin(c, 1, "w"), cu_pin(c, 2, "dy"), cu_pout(c, 0, "dx"),
               add ? cu_fmt(c, ", %s", cu_pin(c, 3, "res")) : ""),
        cu_fmt(c, "fs_norm_bwd_dx<%s, %s, %lldLL, %lldLL>(x, w, dy, dx, %s%s)", row_targs(c, &geo),
               n->rms ? "true" : "false", (long long)n->rows, (long long)n->C, n->eps, add ? ", res" : ""));
    int a[5] = {cu_in_id(c, 0), cu_in_id(c, 1), cu_in_id(c, 2), cu_out_id(c, 0), add ? cu_in_id(c, 3) : 0};
    return row_launch(c, n->op, src, &geo, a, 4 + add);
}

/* layernorm_bwd(x, w, dy, eps) -> dx, dw, db; rmsnorm_bwd(x, w, dy, eps) -> dx, dw; the _add
 * forms (x, w, dy, r, eps) the same with r added to dx */
static int emit_norm_bwd(CuCtx *c, int rms)
{
    if (want_floats(c, op_name(cu_node(c)->op), cu_node(c)->n_in)) return -1;
    Norm n = norm_of(c, rms);
    int64_t P = n.rows / CHUNK_ROWS > 1 ? n.rows / CHUNK_ROWS : 1;
    if (emit_partials(c, &n, P)) return -1;
    if (P > 1 && emit_finish(c, &n, P)) return -1;
    return emit_dx(c, &n);
}

int cuda_layernorm_bwd(CuCtx *c) { return emit_norm_bwd(c, 0); }
int cuda_rmsnorm_bwd(CuCtx *c) { return emit_norm_bwd(c, 1); }
int cuda_layernorm_bwd_add(CuCtx *c) { return emit_norm_bwd(c, 0); }
int cuda_rmsnorm_bwd_add(CuCtx *c) { return emit_norm_bwd(c, 1); }
