// codegen/kernels/attention_f32.cuh: attention and its backward on CUDA cores, every
// product, sum and softmax in f32, for what the tensor-core kernels (flash.cuh) do not
// take: fp32 plans, head dims that are not a multiple of 8 or above 128, D != Dv.
// Instantiated by codegen/cuda_attention.c, whose comment gives the algorithm; semantics
// are runtime/cpu/attention.c's. Tensors of any float dtype (loaded as f32 into shared
// memory, each output rounded once), addressed through FsAttLay (attn_layout.cuh), so
// attention's contiguous slices and attention_qkv's packed heads run the same code.
//
// Forward: 128 threads; a block owns BQ = 4 RPW query rows of one slice (warp w rows w,
// w + 4, ...), walks key tiles of 32, lane j scoring key j; online softmax by warp
// shuffles. Backward: 256 threads; fs_attf_dkdv owns TB keys of a kv slice and walks the
// query tiles of its G query slices that see them; fs_attf_dq owns TB query rows and
// walks their key tiles; each recomputes P and dS of a tile pair, one thread an element,
// and sums every gradient over tiles in order (no atomics: bitwise reproducible).
// Shared rows read across lanes have an odd pitch (D | 1), so lanes fall in distinct banks.
// attention_masked: MPER > 0 and mask [BH / MPER, S], i32 (boolean: slice bh sees key j where
// mask[bh / MPER * S + j] != 0) or float (additive: that value added to the scaled score, -inf
// masking the key; attn_layout.cuh's fs_key_bias). A row that sees no key: o = 0, lse = -inf,
// no gradient.
#pragma once
#include "attn_layout.cuh"
#include "prelude.cuh"

// The forward: blockIdx.x = bh * NQT + (NQT - 1 - query tile) (longest tiles first).
template <class TQ, class TK, class TV, class TO, int T, int S, int D, int DV, int G, bool CAUSAL, int RPW, class L,
          int MPER = 0, class MT = int>
__device__ __forceinline__ void fs_attf_fwd(const TQ *__restrict__ q, const TK *__restrict__ k,
                                            const TV *__restrict__ v, TO *__restrict__ o, float *__restrict__ lse,
                                            float scale, const MT *__restrict__ mask = nullptr)
{
    constexpr int BQ = 4 * RPW, CPL = (DV + 31) / 32, KP = D | 1, KVP = KP > DV ? KP : DV, NQT = (T + BQ - 1) / BQ;
    __shared__ __align__(16) float qs[BQ * D];
    __shared__ float kv[32 * KVP];
    __shared__ float ps[BQ * 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long bh = blockIdx.x / NQT, bkv = bh / G;
    const int i0 = (NQT - 1 - (int)(blockIdx.x % NQT)) * BQ;
    const float ninf = __int_as_float(0xff800000u);
    for (int e = threadIdx.x; e < BQ * D; e += 128) qs[e] = i0 + e / D < T ? ld(q, L::q(bh, i0 + e / D) + e % D) : 0.f;
    float m[RPW], l[RPW], acc[RPW][CPL];
#pragma unroll
    for (int g = 0; g < RPW; g++) {
        m[g] = ninf, l[g] = 0.f;
#pragma unroll
        for (int cc = 0; cc < CPL; cc++) acc[g][cc] = 0.f;
    }
    const int jend = CAUSAL ? min(S, i0 + BQ) : S;
    for (int j0 = 0; j0 < jend; j0 += 32) {
        __syncthreads();  // the last tile's readers of kv and ps are done; qs is in
        for (int e = threadIdx.x; e < 32 * D; e += 128) {
            const int j = e / D, d = e % D;
            kv[j * KP + d] = j0 + j < S ? ld(k, L::k(bkv, j0 + j) + d) : 0.f;
        }
        __syncthreads();
        float s[RPW];
#pragma unroll
        for (int g = 0; g < RPW; g++) s[g] = 0.f;
        if constexpr (D % 4) {
            for (int d = 0; d < D; d++) {
                const float kd = kv[lane * KP + d];
#pragma unroll
                for (int g = 0; g < RPW; g++) s[g] += qs[(warp + 4 * g) * D + d] * kd;
            }
        } else {
            for (int d = 0; d < D; d += 4) {
                const float k0 = kv[lane * KP + d], k1 = kv[lane * KP + d + 1];
                const float k2 = kv[lane * KP + d + 2], k3 = kv[lane * KP + d + 3];
#pragma unroll
                for (int g = 0; g < RPW; g++) {
                    const float4 qv = *reinterpret_cast<const float4 *>(&qs[(warp + 4 * g) * D + d]);
                    s[g] += qv.x * k0;
                    s[g] += qv.y * k1;
                    s[g] += qv.z * k2;
                    s[g] += qv.w * k3;
                }
            }
        }
        const int j = j0 + lane;
        const float b = MPER && j < S ? fs_key_bias<MPER, S>(mask, bh, j) : 0.f;
#pragma unroll
        for (int g = 0; g < RPW; g++) {
            const int i = i0 + warp + 4 * g;
            const bool vis = j < S && (!CAUSAL || j <= i) && b != ninf;
            const float x = vis ? (MPER ? s[g] * scale + b : s[g] * scale) : ninf;
            const float mx = fmaxf(m[g], fs_warp_max(x));
            const float corr = m[g] == mx ? 1.0f : expf(m[g] - mx);
            const float p = vis ? expf(x - mx) : 0.f;
            l[g] = l[g] * corr + fs_warp_sum(p);
            m[g] = mx;
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) acc[g][cc] *= corr;
            ps[(warp + 4 * g) * 32 + lane] = p;
        }
        __syncthreads();  // every score read K
        for (int e = threadIdx.x; e < 32 * DV; e += 128) {
            const int jj = e / DV, cc = e % DV;
            kv[jj * DV + cc] = j0 + jj < S ? ld(v, L::v(bkv, j0 + jj) + cc) : 0.f;
        }
        __syncthreads();
        for (int jj = 0; jj < 32; jj++) {
            float vv[CPL];
#pragma unroll
            for (int cc = 0; cc < CPL; cc++) vv[cc] = lane + 32 * cc < DV ? kv[jj * DV + lane + 32 * cc] : 0.f;
#pragma unroll
            for (int g = 0; g < RPW; g++) {
                const float p = ps[(warp + 4 * g) * 32 + jj];
#pragma unroll
                for (int cc = 0; cc < CPL; cc++) acc[g][cc] += p * vv[cc];
            }
        }
    }
#pragma unroll
    for (int g = 0; g < RPW; g++) {
        const int i = i0 + warp + 4 * g;
        if (i >= T) continue;
        const float inv = l[g] > 0.f ? 1.0f / l[g] : 0.f;  // no key seen (masked): 0
#pragma unroll
        for (int cc = 0; cc < CPL; cc++)
            if (lane + 32 * cc < DV) st(o, L::o(bh, i) + lane + 32 * cc, acc[g][cc] * inv);
        if (lane == 0) lse[bh * T + i] = m[g] + logf(l[g]);
    }
}

// Rows at(r) of src, r < n (W elements each), as f32 into the TB shared rows of dst (pitch P); zero past n.
template <int TB, int W, int P, class E, class At>
__device__ __forceinline__ void fs_attf_tile(float *dst, const E *src, At at, int n)
{
    for (int e = threadIdx.x; e < TB * W; e += 256) {
        const int r = e / W, col = e % W;
        dst[r * P + col] = r < n ? ld(src, at(r) + col) : 0.f;
    }
}

// The backward's shared tiles (TB rows each) and what both of its kernels do with them.
template <int T, int S, int D, int DV, bool CAUSAL, int TB, class L, int MPER>
struct FsAttfTiles {
    static constexpr int QP = D | 1, KP = QP, OP = DV | 1, VP = OP;
    float qs[TB * QP], dos[TB * OP], ks[TB * KP], vs[TB * VP], dss[TB * TB], ps[TB * TB], ls[TB], dr[TB];

    // qs, dos, ls and dr = rowsum(dO o) of query tile i0 of slice bh, zero past T; ends synchronized.
    template <class TQ, class TO>
    __device__ __forceinline__ void load_q(const TQ *q, const TO *o, const float *lse, const TO *dout, long long bh,
                                           int i0)
    {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        fs_attf_tile<TB, D, QP>(qs, q, [&](int r) { return L::q(bh, i0 + r); }, T - i0);
        fs_attf_tile<TB, DV, OP>(dos, dout, [&](int r) { return L::o(bh, i0 + r); }, T - i0);
        if (threadIdx.x < TB) ls[threadIdx.x] = i0 + (int)threadIdx.x < T ? lse[bh * T + i0 + threadIdx.x] : 0.f;
        __syncthreads();
        for (int r = warp; r < TB; r += 8) {
            float x = 0.f;
            if (i0 + r < T)
                for (int cc = lane; cc < DV; cc += 32) x += dos[r * OP + cc] * ld(o, L::o(bh, i0 + r) + cc);
            x = fs_warp_sum(x);
            if (lane == 0) dr[r] = x;
        }
        __syncthreads();
    }

    // ks, vs of key tile j0 of kv slice bkv, zero past S.
    template <class TK, class TV>
    __device__ __forceinline__ void load_kv(const TK *k, const TV *v, long long bkv, int j0)
    {
        fs_attf_tile<TB, D, KP>(ks, k, [&](int j) { return L::k(bkv, j0 + j); }, S - j0);
        fs_attf_tile<TB, DV, VP>(vs, v, [&](int j) { return L::v(bkv, j0 + j); }, S - j0);
    }

    // dss = dS (and ps = P when keep_p) of the tile pair (i0, j0) of slice bh, TB x TB, row = query. A thread's
    // elements e = threadIdx.x + 256 u share key j = e % TB (TB divides 256), so each key's element is loaded once
    // for the NE rows (a warp's rows are one, a broadcast); each sum runs over d in order.
    template <class MT>
    __device__ __forceinline__ void scores(int i0, int j0, float scale, bool keep_p, const MT *mask, long long bh)
    {
        constexpr int NE = (TB * TB + 255) / 256, RS = 256 / TB;  // elements a thread, rows between them
        const int j = threadIdx.x % TB, r0 = threadIdx.x / TB, jj = j0 + j;
        float s[NE], dp[NE];
#pragma unroll
        for (int u = 0; u < NE; u++) s[u] = dp[u] = 0.f;
        for (int d = 0; d < D; d++) {
            const float kd = ks[j * KP + d];
#pragma unroll
            for (int u = 0; u < NE; u++)
                if (r0 + RS * u < TB) s[u] += qs[(r0 + RS * u) * QP + d] * kd;
        }
        for (int cc = 0; cc < DV; cc++) {
            const float vc = vs[j * VP + cc];
#pragma unroll
            for (int u = 0; u < NE; u++)
                if (r0 + RS * u < TB) dp[u] += dos[(r0 + RS * u) * OP + cc] * vc;
        }
        const float b = MPER && jj < S ? fs_key_bias<MPER, S>(mask, bh, jj) : 0.f;  // the key's mask
        const bool key = jj < S && b != __int_as_float(0xff800000u);
#pragma unroll
        for (int u = 0; u < NE; u++) {
            const int r = r0 + RS * u, i = i0 + r, e = r * TB + j;
            if (r >= TB) continue;
            const bool vis = key && i < T && (!CAUSAL || jj <= i);
            const float p = vis ? expf(MPER ? s[u] * scale + b - ls[r] : s[u] * scale - ls[r]) : 0.f;
            if (keep_p) ps[e] = p;
            dss[e] = vis ? p * (dp[u] - dr[r]) : 0.f;
        }
    }
};

// acc[u] += A B (TRANS: A^T B) at this thread's elements e = threadIdx.x + 256 u of a TB x W block (row e / W,
// column e % W): A the TB x TB tile a (row = query), B the TB rows of b (pitch P); each sum in row order. When W
// divides 256 a thread's elements share their column: b's element is loaded once for all of them.
template <int TB, int W, int P, int U, bool TRANS>
__device__ __forceinline__ void fs_attf_acc(float *acc, const float *a, const float *b)
{
    if constexpr (256 % W == 0) {
        constexpr int RS = 256 / W;
        const int col = threadIdx.x % W, row0 = threadIdx.x / W;
        float x[U];
#pragma unroll
        for (int u = 0; u < U; u++) x[u] = 0.f;
        for (int t = 0; t < TB; t++) {
            const float bv = b[t * P + col];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int row = row0 + RS * u;
                if (row < TB) x[u] += a[TRANS ? t * TB + row : row * TB + t] * bv;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) acc[u] += x[u];
    } else {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = threadIdx.x + 256 * u, row = e / W, col = e % W;
            float x = 0.f;
            if (e < TB * W)
                for (int t = 0; t < TB; t++) x += a[TRANS ? t * TB + row : row * TB + t] * b[t * P + col];
            acc[u] += x;
        }
    }
}

// The TB x W block acc (times mul) to rows at(r), r < n, of out.
template <int TB, int W, int U, class E, class At>
__device__ __forceinline__ void fs_attf_store(const float *acc, E *out, At at, int n, float mul)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int e = threadIdx.x + 256 * u, r = e / W, col = e % W;
        if (e < TB * W && r < n) st(out, at(r) + col, acc[u] * mul);
    }
}

// Kernel 1: dK and dV of one key tile of one kv slice (blockIdx.x = bkv * NKT + tile), over the
// query tiles that see it in each of the slice's G query slices.
template <class TQ, class TK, class TV, class TO, int T, int S, int D, int DV, int G, bool CAUSAL, int TB, class L,
          int MPER = 0, class MT = int>
__device__ __forceinline__ void fs_attf_dkdv(const TQ *__restrict__ q, const TK *__restrict__ k,
                                             const TV *__restrict__ v, const TO *__restrict__ o,
                                             const float *__restrict__ lse, const TO *__restrict__ dout, TK *dk, TV *dv,
                                             float scale, const MT *__restrict__ mask = nullptr)
{
    constexpr int NKT = (S + TB - 1) / TB, UK = (TB * D + 255) / 256, UV = (TB * DV + 255) / 256;
    using Tiles = FsAttfTiles<T, S, D, DV, CAUSAL, TB, L, MPER>;
    __shared__ Tiles sh;
    const long long bkv = blockIdx.x / NKT;
    const int j0 = (int)(blockIdx.x % NKT) * TB;
    float ak[UK], av[UV];
#pragma unroll
    for (int u = 0; u < UK; u++) ak[u] = 0.f;
#pragma unroll
    for (int u = 0; u < UV; u++) av[u] = 0.f;
    sh.load_kv(k, v, bkv, j0);
    for (long long bh = bkv * G; bh < (bkv + 1) * G; bh++)
        for (int i0 = CAUSAL ? j0 : 0; i0 < T; i0 += TB) {
            __syncthreads();  // the last tile's readers of qs, dos, ps, dss are done
            sh.load_q(q, o, lse, dout, bh, i0);
            sh.scores(i0, j0, scale, true, mask, bh);
            __syncthreads();
            fs_attf_acc<TB, D, Tiles::QP, UK, true>(ak, sh.dss, sh.qs);  // dK += dS^T Q
            fs_attf_acc<TB, DV, Tiles::OP, UV, true>(av, sh.ps, sh.dos);  // dV += P^T dO
        }
    fs_attf_store<TB, D, UK>(ak, dk, [&](int j) { return L::k(bkv, j0 + j); }, S - j0, scale);
    fs_attf_store<TB, DV, UV>(av, dv, [&](int j) { return L::v(bkv, j0 + j); }, S - j0, 1.0f);
}

// Kernel 2: dQ of one query tile (blockIdx.x = bh * NQT + (NQT - 1 - tile): longest first), over its key tiles.
template <class TQ, class TK, class TV, class TO, int T, int S, int D, int DV, int G, bool CAUSAL, int TB, class L,
          int MPER = 0, class MT = int>
__device__ __forceinline__ void fs_attf_dq(const TQ *__restrict__ q, const TK *__restrict__ k,
                                           const TV *__restrict__ v, const TO *__restrict__ o,
                                           const float *__restrict__ lse, const TO *__restrict__ dout, TQ *dq,
                                           float scale, const MT *__restrict__ mask = nullptr)
{
    constexpr int NQT = (T + TB - 1) / TB, UK = (TB * D + 255) / 256;
    using Tiles = FsAttfTiles<T, S, D, DV, CAUSAL, TB, L, MPER>;
    __shared__ Tiles sh;
    const long long bh = blockIdx.x / NQT;
    const int i0 = (NQT - 1 - (int)(blockIdx.x % NQT)) * TB;
    float aq[UK];
#pragma unroll
    for (int u = 0; u < UK; u++) aq[u] = 0.f;
    sh.load_q(q, o, lse, dout, bh, i0);
    const int jend = CAUSAL ? min(S, i0 + TB) : S;
    for (int j0 = 0; j0 < jend; j0 += TB) {
        __syncthreads();  // the last tile's readers of ks, vs, dss are done
        sh.load_kv(k, v, bh / G, j0);
        __syncthreads();
        sh.scores(i0, j0, scale, false, mask, bh);
        __syncthreads();
        fs_attf_acc<TB, D, Tiles::KP, UK, false>(aq, sh.dss, sh.ks);  // dQ += dS K
    }
    fs_attf_store<TB, D, UK>(aq, dq, [&](int r) { return L::q(bh, i0 + r); }, T - i0, scale);
}
