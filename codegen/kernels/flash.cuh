// codegen/kernels/flash.cuh: attention's forward on tensor cores (FlashAttention-2), and
// the pieces its backward (flash_bwd.cuh) shares; instantiated by codegen/cuda_flash.c
// for 16-bit q, k, v (bf16 or f16, mma m16n8k16) or, in plans compiled with the tf32
// setting, f32 ones (E = float, mma m16n8k8 tf32), with one head dim D = Dv, a multiple of
// 8 up to 128. Semantics are runtime/cpu/attention.c's (see codegen/cuda_attention.c's comment):
//   o = softmax(q k^T * scale, causal mask) v,  lse = the rows' log-sum-exp (f32),
// query slice bh reading kv slice bh / G (grouped-query attention).
// attention_masked: MPER > 0, a key mask [BH / MPER, S] (attn_layout.cuh's fs_key_bias:
// i32 boolean, float additive). A masked key scores -inf in every tile (not only the edge
// ones); an additive bias b joins the raw score q.k as b / scale, so that the softmax's
// scaling by scale log2(e) adds b log2(e). A row that sees no key gives o = 0 and lse = -inf.
//
// Numerics: the products q.k are exact and summed in f32 by the tensor cores; the softmax
// runs in f32 registers (p = 2^(s scale log2(e) - m scale log2(e))); P is rounded to the
// input dtype before P V (as every flash attention does); o is accumulated in f32 and
// rounded once. lse = m scale + log(l) from the f32 sums, so it is the CPU's to f32 ulps.
// tf32: every operand of an mma (q, k, v, P; the backward's dO, dS too) is rounded to
// tf32 (10-bit mantissa, cvt.rna) as it leaves shared memory; the products are exact and
// summed in f32, so results are the CPU's to about 2^-11 relative per rounded operand.
//
// Tiles: a block of 4 warps owns BQ = 64 query rows of one slice, warp w rows 16w..16w+15
// (one mma row block). K and V stream through shared memory in tiles of BK = 64 keys,
// double-buffered: tile j + 1 is copied by cp.async while tile j is multiplied. Causal:
// tiles wholly above the diagonal are never loaded; blocks run the longest query tiles
// first. Shared rows hold DP = D rounded up to 16 elements (the pad columns zero-filled, so
// the mma's k steps need no mask) at a pitch of DP plus one 16-byte chunk (8 16-bit
// elements, 4 f32): the pitch is an odd number of 16-byte chunks, so the 8 rows an ldmatrix
// reads fall in 8 distinct bank groups (conflict-free), and a cp.async phase of 8 lanes
// writing one row's 8 chunks is too when DP is a multiple of 64 (head dims 64 and 128;
// smaller ones pay up to 2 ways on the tile copies and the output's 16-byte reads, never on
// an ldmatrix of the mma loop: measured by the cuda-emu tests,
// tests/cuda_emu/cuda_emu.cmake's attn_*). tf32 reads its fragments word by word (ldmatrix
// moves 16-bit pairs); the odd chunk pitch keeps those conflict-free too (fs_frag_a_tf32).
// Rows past the end of q, k, v are zero-filled and their scores masked; o and lse rows past
// T are not written.
//
// The output leaves through shared memory (each warp's own 16 rows of the q tile, which
// only that warp reads), so global stores are whole 16-byte chunks of consecutive rows.
//
// Layouts: every tensor is addressed through FsAttLay (attn_layout.cuh; v through k's), so the same kernels read
// attention's contiguous [BH, T, D] slices and attention_qkv's heads, which are column
// ranges of the QKV projection's rows (passes/packed_attn.c).
//
// Fragment layouts are tc.cuh's (the PTX ISA's): g = lane / 4, t = lane % 4; a C fragment
// element c[i] is at row g + 8 (i >> 1), column 2t + (i & 1).
#pragma once
#include "attn_layout.cuh"
#include "prelude.cuh"
#include "tc.cuh"

// The 16-bit element types: D = A B + D, and two f32 rounded and packed (low first).
__device__ __forceinline__ void fs_mma16(float d[4], const unsigned a[4], const unsigned b[2], __nv_bfloat16)
{
    fs_mma_m16n8k16_bf16(d, a, b, d);
}
__device__ __forceinline__ void fs_mma16(float d[4], const unsigned a[4], const unsigned b[2], __half)
{
    fs_mma_m16n8k16_f16(d, a, b, d);
}
__device__ __forceinline__ unsigned fs_pack2(float lo, float hi, __nv_bfloat16)
{
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}
__device__ __forceinline__ unsigned fs_pack2(float lo, float hi, __half)
{
    return (unsigned)__half_as_ushort(__float2half_rn(lo)) | (unsigned)__half_as_ushort(__float2half_rn(hi)) << 16;
}

// Two f32 to consecutive elements p[0], p[1]: rounded and packed (16-bit; p 4-byte aligned), or as they are (f32).
__device__ __forceinline__ void fs_st2(__nv_bfloat16 *p, float lo, float hi)
{
    *reinterpret_cast<unsigned *>(p) = fs_pack2(lo, hi, __nv_bfloat16());
}
__device__ __forceinline__ void fs_st2(__half *p, float lo, float hi)
{
    *reinterpret_cast<unsigned *>(p) = fs_pack2(lo, hi, __half());
}
__device__ __forceinline__ void fs_st2(float *p, float lo, float hi) { p[0] = lo, p[1] = hi; }

// The shared-memory geometry of a head dim D in elements E (16-bit, or f32 for tf32).
template <int D, class E>
struct FsFlashDim {
    static constexpr int CE = 16 / (int)sizeof(E);  // elements per 16-byte chunk
    static constexpr int DP = (D + 15) / 16 * 16;   // columns the mma sees
    static constexpr int P = DP + CE;               // row pitch, elements: an odd number of chunks
    static constexpr int KT = DP / 16;              // 16-wide k steps over the head dim
    static constexpr int NT = DP / 8;               // n tiles over the head dim
};

// cp.async of ROWS rows of D elements, RP apart, from row pointer g (valid of them exist)
// into shared rows of pitch P; missing rows and the pad columns are zero-filled. NTH threads.
template <int ROWS, int D, int NTH, long long RP, class E>
__device__ __forceinline__ void fs_flash_copy(E *s, const E *g, int valid)
{
    using F = FsFlashDim<D, E>;
    constexpr int CPR = F::DP / F::CE;
    for (int c = threadIdx.x; c < ROWS * CPR; c += NTH) {
        const int r = c / CPR, k = c % CPR;
        const bool in = r < valid && k < D / F::CE;
        fs_cp_async16_zfill(s + r * F::P + F::CE * k, in ? g + r * RP + F::CE * k : g, in ? 16 : 0);
    }
}

// A fragment (16 x 16 at row r0, column c0) of a shared tile of pitch P, row-major.
template <int P, class E>
__device__ __forceinline__ void fs_frag_a(unsigned a[4], const E *s, int r0, int c0)
{
    const int l = threadIdx.x % 32;
    fs_ldmatrix_x4(a, s + (r0 + l % 16) * P + c0 + (l / 16) * 8);
}

// Two B fragments (n tiles n0 and n0 + 8, k = c0..c0+15) of B = S^T, S a shared tile of
// pitch P whose rows are B's columns (k tiles of K^T from K's rows): b0 = {r0, r1}, b1 = {r2, r3}.
template <int P, class E>
__device__ __forceinline__ void fs_frag_bt(unsigned b[4], const E *s, int n0, int c0)
{
    const int l = threadIdx.x % 32;
    fs_ldmatrix_x4(b, s + (n0 + (l / 16) * 8 + l % 8) * P + c0 + ((l / 8) % 2) * 8);
}

// Two B fragments (n tiles c0 and c0 + 8, k = r0..r0+15) of B = S itself, S's rows its k
// (V's rows for P V): the transposing load.
template <int P, class E>
__device__ __forceinline__ void fs_frag_b(unsigned b[4], const E *s, int r0, int c0)
{
    const int l = threadIdx.x % 32;
    fs_ldmatrix_x4_trans(b, s + (r0 + ((l / 8) % 2) * 8 + l % 8) * P + c0 + (l / 16) * 8);
}

// A fragments of the 16 x 16 k step kt of a 16 x N product held as C fragments x[N/8][4]
// (P for P V, dS for dS K): rounded to E.
template <class E>
__device__ __forceinline__ void fs_c_to_a(unsigned a[4], const float (*x)[4], int kt)
{
    a[0] = fs_pack2(x[2 * kt][0], x[2 * kt][1], E());
    a[1] = fs_pack2(x[2 * kt][2], x[2 * kt][3], E());
    a[2] = fs_pack2(x[2 * kt + 1][0], x[2 * kt + 1][1], E());
    a[3] = fs_pack2(x[2 * kt + 1][2], x[2 * kt + 1][3], E());
}

// tf32 (E = float, mma m16n8k8, no ldmatrix: ldmatrix moves 16-bit pairs): the A fragment (16 x 8 at row r0,
// column c0) and the B fragment of B = S^T (n tile n0, k = c0..c0+7) of shared f32 tiles of pitch P, rounded to
// tf32. With P / 4 odd the 32 lanes' words (rows g, columns t) fall in 32 distinct banks.
template <int P>
__device__ __forceinline__ void fs_frag_a_tf32(unsigned a[4], const float *s, int r0, int c0)
{
    const int l = threadIdx.x % 32;
    const float *p = s + (r0 + l / 4) * P + c0 + l % 4;
    a[0] = fs_to_tf32(p[0]), a[1] = fs_to_tf32(p[8 * P]), a[2] = fs_to_tf32(p[4]), a[3] = fs_to_tf32(p[8 * P + 4]);
}
template <int P>
__device__ __forceinline__ void fs_frag_bt_tf32(unsigned b[2], const float *s, int n0, int c0)
{
    const int l = threadIdx.x % 32;
    const float *p = s + (n0 + l / 4) * P + c0 + l % 4;
    b[0] = fs_to_tf32(p[0]), b[1] = fs_to_tf32(p[4]);
}

// The same in tf32 (E = float: mma m16n8k8, k steps of 8).
template <int P, int KT, int NTI>
__device__ __forceinline__ void fs_mma_abt(float (*x)[4], const float *sa, int a0, const float *sb)
{
#pragma unroll
    for (int kk = 0; kk < 2 * KT; kk++) {
        unsigned a[4];
        fs_frag_a_tf32<P>(a, sa, a0, 8 * kk);
#pragma unroll
        for (int n = 0; n < NTI; n++) {
            unsigned b[2];
            fs_frag_bt_tf32<P>(b, sb, 8 * n, 8 * kk);
            fs_mma_m16n8k8_tf32(x[n], a, b, x[n]);
        }
    }
}

// x[NTI][4] += A B over k = 0..KT*16, A 16 rows at a0 of tile sa, B^T's rows n at sb
// (both pitch P): scores Q K^T, and the backward's dO V^T and K Q^T.
template <int P, int KT, int NTI, class E>
__device__ __forceinline__ void fs_mma_abt(float (*x)[4], const E *sa, int a0, const E *sb)
{
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
        unsigned a[4];
        fs_frag_a<P>(a, sa, a0, 16 * kk);
#pragma unroll
        for (int np = 0; np < NTI / 2; np++) {
            unsigned b[4];
            fs_frag_bt<P>(b, sb, 16 * np, 16 * kk);
            fs_mma16(x[2 * np], a, b, E());
            fs_mma16(x[2 * np + 1], a, b + 2, E());
        }
    }
}

// acc[NT][4] += X B, X 16 x (16 KS) in C fragments (rounded to E), B the shared tile sb
// (pitch P) whose rows are the k: P V, and the backward's P^T dO, dS^T Q, dS K.
template <int P, int KS, int NT, class E>
__device__ __forceinline__ void fs_mma_xb(float (*acc)[4], const float (*x)[4], const E *sb)
{
#pragma unroll
    for (int kt = 0; kt < KS; kt++) {
        unsigned a[4];
        fs_c_to_a<E>(a, x, kt);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            unsigned b[4];
            fs_frag_b<P>(b, sb, 16 * kt, 16 * np);
            fs_mma16(acc[2 * np], a, b, E());
            fs_mma16(acc[2 * np + 1], a, b + 2, E());
        }
    }
}

// The same in tf32 (E = float, m16n8k8). A C fragment holds columns 2t, 2t + 1 where an
// m16n8k8 A fragment wants t, t + 4, so each 8-wide k step takes its keys in the order 0,
// 2, 4, 6, 1, 3, 5, 7 (A column c is key 2c, or 2(c - 4) + 1) and B's rows follow: b[r] is
// row 2t + r. The sum is the same products in another order; no shuffle. B's words (rows 2t
// + r, columns g) are conflict-free when P / 4 is odd.
template <int P, int KS, int NT>
__device__ __forceinline__ void fs_mma_xb(float (*acc)[4], const float (*x)[4], const float *sb)
{
    const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
#pragma unroll
    for (int kt = 0; kt < 2 * KS; kt++) {
        const unsigned a[4] = {fs_to_tf32(x[kt][0]), fs_to_tf32(x[kt][2]), fs_to_tf32(x[kt][1]),
                               fs_to_tf32(x[kt][3])};
        const float *p = sb + (8 * kt + 2 * t) * P + g;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const unsigned b[2] = {fs_to_tf32(p[8 * n]), fs_to_tf32(p[P + 8 * n])};
            fs_mma_m16n8k8_tf32(acc[n], a, b, acc[n]);
        }
    }
}

// A warp's 16 x D result acc (C fragments, times mul) out through its own 16 rows of the
// shared tile s (pitch P, from row r0): rounded to E, then 16-byte chunks to rows g of
// global memory (row pitch RP) of which `valid` exist.
template <int D, long long RP, class E>
__device__ __forceinline__ void fs_flash_store(const float (*acc)[4], float mul0, float mul1, E *s, int r0, E *g,
                                               int valid)
{
    using F = FsFlashDim<D, E>;
    const int l = threadIdx.x % 32, gg = l / 4, t = l % 4;
#pragma unroll
    for (int nt = 0; nt < F::NT; nt++) {
        fs_st2(s + (r0 + gg) * F::P + 8 * nt + 2 * t, acc[nt][0] * mul0, acc[nt][1] * mul0);
        fs_st2(s + (r0 + gg + 8) * F::P + 8 * nt + 2 * t, acc[nt][2] * mul1, acc[nt][3] * mul1);
    }
    __syncwarp();
    constexpr int CPR = D / F::CE;
    for (int c = l; c < 16 * CPR; c += 32) {
        const int r = c / CPR, k = c % CPR;
        if (r < valid) fs_st128(g + r * RP + F::CE * k, fs_ld128(s + (r0 + r) * F::P + F::CE * k));
    }
}

// The forward: one block of 128 threads per (query tile, slice), BH slices of TQ rows,
// kv slices of SK rows; blockIdx.x = (NQT - 1 - query tile) * BH + bh. Dynamic shared
// memory: (64 + 4 * 64) * P elements.
template <class E, int TQ, int SK, int D, int G, bool CAUSAL, class L, long long BH, int MPER = 0, class MT = int>
__device__ __forceinline__ void fs_flash_fwd(const E *__restrict__ q, const E *__restrict__ k, const E *__restrict__ v,
                                             E *__restrict__ o, float *__restrict__ lse, float scale,
                                             const MT *__restrict__ mask = nullptr)
{
    using F = FsFlashDim<D, E>;
    constexpr int BQ = 64, BK = 64, P = F::P, NQT = (TQ + BQ - 1) / BQ;
    extern __shared__ uint4 fs_dyn[];
    E *sq = reinterpret_cast<E *>(fs_dyn), *sk = sq + BQ * P, *sv = sk + 2 * BK * P;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const long long bh = blockIdx.x % BH;
    const int i0 = (NQT - 1 - (int)(blockIdx.x / BH)) * BQ, w0 = 16 * warp;
    constexpr long long KR = L::k_pitch;
    const E *kg = k + L::k(bh / G, 0), *vg = v + L::k(bh / G, 0);
    const float sl2 = scale * 1.4426950408889634f, ninf = __int_as_float(0xff800000u), rs = 1.0f / scale;
    const int jend = CAUSAL ? min(SK, i0 + BQ) : SK, ntiles = (jend + BK - 1) / BK;

    fs_flash_copy<BQ, D, 128, L::q_pitch>(sq, q + L::q(bh, i0), TQ - i0);
    fs_flash_copy<BK, D, 128, KR>(sk, kg, SK);
    fs_flash_copy<BK, D, 128, KR>(sv, vg, SK);
    fs_cp_async_commit();

    float m[2] = {ninf, ninf}, l[2] = {0.f, 0.f}, acc[F::NT][4];
#pragma unroll
    for (int nt = 0; nt < F::NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    for (int jt = 0; jt < ntiles; jt++) {
        fs_cp_async_wait<0>();
        __syncthreads();  // tile jt is in for every thread; tile jt - 1's buffers are free
        const int j0 = jt * BK, nb = (jt + 1) & 1;
        if (jt + 1 < ntiles) {
            fs_flash_copy<BK, D, 128, KR>(sk + nb * BK * P, kg + (j0 + BK) * KR, SK - j0 - BK);
            fs_flash_copy<BK, D, 128, KR>(sv + nb * BK * P, vg + (j0 + BK) * KR, SK - j0 - BK);
        }
        fs_cp_async_commit();
        const E *ck = sk + (jt & 1) * BK * P, *cv = sv + (jt & 1) * BK * P;

        float s[BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        fs_mma_abt<P, F::KT, BK / 8>(s, sq, w0, ck);

        // a mask, or some key past the end or the diagonal
        if (MPER || j0 + BK > SK || (CAUSAL && j0 + BK - 1 > i0 + w0)) {
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = j0 + 8 * nt + 2 * t + (i & 1), row = i0 + w0 + g + 8 * (i >> 1);
                    const float b = MPER && j < SK ? fs_key_bias<MPER, SK>(mask, bh, j) : 0.f;
                    if (j >= SK || (CAUSAL && j > row) || b == ninf) s[nt][i] = ninf;
                    else if (MPER) s[nt][i] += b * rs;
                }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = m[h];
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mb = mx == ninf ? 0.f : mx * sl2;  // a row with nothing visible yet: p = 0, no NaN
            const float corr = exp2f(m[h] * sl2 - mb);
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++) {
                s[nt][2 * h] = exp2f(s[nt][2 * h] * sl2 - mb);
                s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] * sl2 - mb);
                sum += s[nt][2 * h] + s[nt][2 * h + 1];
            }
            l[h] = l[h] * corr + sum;  // this thread's columns; the quad's are added at the end
            m[h] = mx;
#pragma unroll
            for (int nt = 0; nt < F::NT; nt++) acc[nt][2 * h] *= corr, acc[nt][2 * h + 1] *= corr;
        }
        fs_mma_xb<P, BK / 16, F::NT>(acc, s, cv);
    }

    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        inv[h] = l[h] > 0.f ? 1.0f / l[h] : 0.f;
        const int row = i0 + w0 + g + 8 * h;
        if (t == 0 && row < TQ) lse[bh * TQ + row] = m[h] * scale + logf(l[h]);
    }
    fs_flash_store<D, L::o_pitch>(acc, inv[0], inv[1], sq, w0, o + L::o(bh, i0 + w0), TQ - i0 - w0);
}
