/* codegen/cuda_embed.c: CUDA emitters of embedding, embedding_bwd, rope and rope_at. Semantics
 * are runtime/cpu/embed.c's and attention.c's (rope).
 *
 * embedding(table [V, C], idx [...]) -> [..., C]: one thread per output element copies
 * its element of the table (the same dtype: no rounding).
 *
 * embedding_bwd(idx [N...], dy [N..., C], rows = V) -> dtable [V, C]: zeros, then dy's
 * rows added at idx, without atomics. A block owns R = 32 rows of the table and CW =
 * 256 columns, accumulating them in shared memory (32 KiB), and scans all N indices in
 * tiles of 256: each tile's matches (indices in its rows) are compacted in index order
 * (warp ballots, then warp offsets), and thread t adds dy[i, c0 + t] of each match to
 * its own column. So every element sums its dy rows in index order, as on the CPU,
 * and rows nothing indexes come out 0. Cost: every block reads every index, N * V * C /
 * (R * CW) index reads in all (L2-resident: the indices are small), plus dy once.
 *
 * rope(x [..., T, D], theta, inverse): the pair (i, i + D/2) of the row at position t
 * turns by t * theta^(-2i/D) (backwards under inverse); rope_at(x, pos, ...) the same
 * with row t at position pos[0] + t, read from the i32 pos on the device. A thread takes one (t, i) and
 * computes the angle in f64 as the CPU does (pow, then cos and sin rounded to f32),
 * then turns that pair in every slice of blockIdx.y's share of the leading dims.
 *
 * An index outside [0, V) is a broken plan or bad data: the kernel traps (the launch
 * fails and the runtime reports it) rather than read or write out of bounds.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include "cuda_rows.h"

enum { EB_ROWS = 32, EB_COLS = 256 };  // embedding_bwd: table rows x columns per block
enum { ROPE_SPLIT = 64 };               // rope: blocks down the leading dims, at most

/* embedding(table, idx) -> out */
int cuda_embedding(CuCtx *c)
{
    const Value *t = cu_inv(c, 0), *idx = cu_inv(c, 1);
    if (t->rank != 2 || !dtype_is_float(t->dtype) || idx->dtype != DT_I32 || cu_outv(c, 0)->dtype != t->dtype)
        return cu_fail(c, "embedding: a float [V, C] table and i32 indices only");
    int64_t V = t->shape[0], C = t->shape[1], n = ir_numel(idx);
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ table, const int *__restrict__ idx, %s *__restrict__ out)\n"
        "{\n"
        "    const long long e = (long long)blockIdx.x * 256 + threadIdx.x;\n"
        "    if (e >= %lldLL) return;\n"
        "    const int r = idx[e / %lldLL];\n"
        "    if (r < 0 || r >= %lld) __trap();\n"
        "    out[e] = table[(long long)r * %lldLL + e %% %lldLL];\n"
        "}\n",
        cu_tin(c, 0), cu_tout(c, 0), (long long)(n * C), (long long)C, (long long)V, (long long)C, (long long)C);
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(n * C, 256), &grid)) return -1;
    return cu_launch(c, "embedding", src, grid, (CuDim){256, 1, 1}, 0, (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)},
                     3);
}

/* embedding_bwd(idx, dy, rows) -> dtable (file comment) */
int cuda_embedding_bwd(CuCtx *c)
{
    const Value *idx = cu_inv(c, 0), *o = cu_outv(c, 0);
    if (idx->dtype != DT_I32 || !dtype_is_float(cu_inv(c, 1)->dtype) || o->rank != 2)
        return cu_fail(c, "embedding_bwd: i32 indices and float gradients only");
    int64_t V = o->shape[0], C = o->shape[1], n = ir_numel(idx), ncb = cu_cdiv(C, EB_COLS);
    if (n > INT_MAX) return cu_fail(c, "embedding_bwd: %lld indices, more than %d", (long long)n, INT_MAX);
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void __launch_bounds__(256) KNAME(const int *__restrict__ idx, const %s *__restrict__ dy, "
        "%s *__restrict__ out)\n"
        "{\n"
        "    __shared__ float acc[%d][256];\n"
        "    __shared__ int m_pos[256], m_row[256], w_cnt[8];\n"
        "    const long long N = %lldLL, V = %lldLL, C = %lldLL;\n"
        "    const long long v0 = (long long)(blockIdx.x / %lld) * %d;\n"
        "    const long long col = (long long)(blockIdx.x %% %lld) * 256 + threadIdx.x;\n"
        "    const int t = threadIdx.x, lane = t %% 32, warp = t / 32;\n"
        "    for (int r = 0; r < %d; r++) acc[r][t] = 0.f;\n"
        "    for (long long i0 = 0; i0 < N; i0 += 256) {\n"
        "        int r = -1;\n"
        "        if (i0 + t < N) {\n"
        "            const int v = idx[i0 + t];\n"
        "            if (v < 0 || v >= V) __trap();\n"
        "            if (v >= v0 && v < v0 + %d) r = (int)(v - v0);\n"
        "        }\n"
        "        const unsigned hit = __ballot_sync(0xffffffffu, r >= 0);\n"
        "        if (lane == 0) w_cnt[warp] = __popc(hit);\n"
        "        __syncthreads();\n"
        "        int at = 0, total = 0;\n"
        "        for (int w = 0; w < 8; w++) at += w < warp ? w_cnt[w] : 0, total += w_cnt[w];\n"
        "        if (r >= 0) {\n"
        "            const int k = at + __popc(hit & ((1u << lane) - 1u));\n"
        "            m_pos[k] = t, m_row[k] = r;\n"
        "        }\n"
        "        __syncthreads();\n"
        "        if (col < C)\n"
        "            for (int k = 0; k < total; k++) acc[m_row[k]][t] += ld(dy, (i0 + m_pos[k]) * C + col);\n"
        "        __syncthreads();\n"
        "    }\n"
        "    if (col < C)\n"
        "        for (int r = 0; r < %d && v0 + r < V; r++) st(out, (v0 + r) * C + col, acc[r][t]);\n"
        "}\n",
        cu_tin(c, 1), cu_tout(c, 0), EB_ROWS, (long long)n, (long long)V, (long long)C, (long long)ncb, EB_ROWS,
        (long long)ncb, EB_ROWS, EB_ROWS, EB_ROWS);
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(V, EB_ROWS) * ncb, &grid)) return -1;
    return cu_launch(c, "embedding_bwd", src, grid, (CuDim){EB_COLS, 1, 1}, 0,
                     (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
}

/* rope(x, theta, inverse) -> y, and rope_at(x, pos, theta, inverse) -> y with row t at
 * position pos[0] + t (at: pos's input index, or -1) (file comment) */
static int rope(CuCtx *c, const char *op, int at)
{
    const Value *x = cu_inv(c, 0);
    if (!dtype_is_float(x->dtype) || x->rank < 2 || x->shape[x->rank - 1] % 2)
        return cu_fail(c, "%s: a float [..., T, D] input with D even only", op);
    int64_t T = x->shape[x->rank - 2], D = x->shape[x->rank - 1], H = D / 2, outer = ir_numel(x) / (T * D);
    double theta = ir_attr_float(c->g, cu_node(c), "theta", 10000), sign = ir_attr_int(c->g, cu_node(c), "inverse", 0) ? -1 : 1;
    int split = outer < ROPE_SPLIT ? (int)outer : ROPE_SPLIT;
    const char *src = cu_fmt(c,
        "extern \"C\" __global__ void KNAME(const %s *__restrict__ x, %s%s *__restrict__ y)\n"
        "{\n"
        "    const long long e = (long long)blockIdx.x * 256 + threadIdx.x;\n"
        "    if (e >= %lldLL) return;\n"
        "    const long long T = %lldLL, D = %lldLL, H = %lldLL, t = e / H, i = e %% H;\n"
        "    const double ang = %s * (double)(%st) * pow(%s, -2.0 * (double)i / (double)D);\n"
        "    const float cs = (float)cos(ang), sn = (float)sin(ang);\n"
        "    for (long long o = blockIdx.y; o < %lldLL; o += %d) {\n"
        "        const long long a = (o * T + t) * D + i, b = a + H;\n"
        "        const float u = ld(x, a), w = ld(x, b);\n"
        "        st(y, a, u * cs - w * sn);\n"
        "        st(y, b, w * cs + u * sn);\n"
        "    }\n"
        "}\n",
        cu_tin(c, 0), at < 0 ? "" : "const int *__restrict__ pos, ", cu_tout(c, 0), (long long)(T * H), (long long)T,
        (long long)D, (long long)H, cu_double(c, sign), at < 0 ? "" : "pos[0] + ", cu_double(c, theta), (long long)outer,
        split);
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(T * H, 256), &grid)) return -1;
    grid.y = split;
    if (at < 0) return cu_launch(c, op, src, grid, (CuDim){256, 1, 1}, 0, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
    return cu_launch(c, op, src, grid, (CuDim){256, 1, 1}, 0, (int[]){cu_in_id(c, 0), cu_in_id(c, at), cu_out_id(c, 0)}, 3);
}

int cuda_rope(CuCtx *c) { return rope(c, "rope", -1); }

int cuda_rope_at(CuCtx *c)
{
    if (cu_inv(c, 1)->dtype != DT_I32 || ir_numel(cu_inv(c, 1)) != 1) return cu_fail(c, "rope_at: an i32 [1] pos only");
    return rope(c, "rope_at", 1);
}
