// codegen/kernels/flash_bwd.cuh: attention's backward on tensor cores, instantiated by
// codegen/cuda_flash.c for what flash.cuh's forward takes (16-bit, or f32 on tf32 mma
// under the tf32 setting; D = Dv a multiple of 8 up to 128), attention_masked's key mask included (flash.cuh).
// Semantics are runtime/cpu/attention.c's:
//   P = exp(s scale - lse), dP = dO V^T, dS = P (dP - Dr), Dr = rowsum(dO o),
//   dV = P^T dO, dK = scale dS^T Q, dQ = scale dS K.
// Three kernels, no atomics, every sum in an order the shapes fix (bitwise reproducible):
//   1. fs_flash_dsum: Dr of every query row, f32, into dq's bytes as scratch (below);
//   2. fs_flash_dkdv: a block owns 64 keys of one kv slice (warp w keys 16w..16w+15) and
//      walks, in order, the query tiles of its G query slices that see them (causal: from
//      the diagonal on), Q, dO, lse and Dr double-buffered; per tile it recomputes S^T
//      and dP^T (keys x queries) on tensor cores and accumulates dV += P^T dO and
//      dK += dS^T Q in registers;
//   3. fs_flash_dq: a block owns 64 query rows (warp w rows 16w..) and walks the key
//      tiles they see, K and V double-buffered, recomputing S and dP and accumulating
//      dQ += dS K; it reads its rows' Dr first and only then overwrites the scratch.
// P and dS are rounded to the input dtype (tf32: to tf32) for their products, as in every
// flash attention; all accumulation is f32, each output rounded once.
//
// The scratch: Dr of query row i of slice bh lives in the first float of that row of dq
// (a row is at least 16 bytes, 16-byte aligned), whichever layout (FsAttLay) dq has, so each tile's
// Dr lies in its own rows' bytes, which only kernel 3's block of that tile writes, after
// reading. dq must not share bytes with q, k, v, o or dO (as on the CPU); under
// attention_qkv dk and dv are the other columns of dq's rows, which no Dr touches.
//
// Shared tiles are flash.cuh's (pitch DP + one 16-byte chunk: conflict-free). The dK/dV kernel
// steps 32 query rows at a time, and the dQ kernel 64 keys for D <= 64 and 32 beyond (tf32: 32), so
// that a thread's accumulators and score fragments fit its registers without spilling
// (ptxas for sm_90: at head dim 64 with 64-row steps the dK/dV kernel spilled).
#pragma once
#include "flash.cuh"

template <class L, class E>
__device__ __forceinline__ float *fs_flash_dr(const E *dq, long long bh, int i)
{
    return reinterpret_cast<float *>(const_cast<E *>(dq) + L::q(bh, i));
}

// Kernel 1: LPR lanes per row (a power of two dividing the row's 16-byte chunks, D / 8, or D / 4 for f32), 16-byte
// loads of o and dO, rows = BH * TQ; blocks of 128 threads. When the chunks are odd (16-bit head dims 8, 24, 40...) a
// lane has a row to itself and its warp's reads touch twice the fewest sectors.
template <class E, int TQ, int D, int LPR, class L, long long ROWS>
__device__ __forceinline__ void fs_flash_dsum(const E *__restrict__ o, const E *__restrict__ dout, E *__restrict__ dq)
{
    const long long r = ((long long)blockIdx.x * 128 + threadIdx.x) / LPR, at = L::o(r / TQ, r % TQ);
    const int sub = threadIdx.x % LPR;
    constexpr int CE = 16 / (int)sizeof(E);  // elements per 16-byte chunk
    float x = 0.f;
    if (r < ROWS)
        for (int c = sub; c < D / CE; c += LPR) {
            const uint4 a = fs_ld128(o + at + CE * c), b = fs_ld128(dout + at + CE * c);
            const E *ea = reinterpret_cast<const E *>(&a), *eb = reinterpret_cast<const E *>(&b);
#pragma unroll
            for (int e = 0; e < CE; e++) x += ld(ea, e) * ld(eb, e);
        }
#pragma unroll
    for (int s = 1; s < LPR; s *= 2) x += __shfl_xor_sync(0xffffffffu, x, s);
    if (r < ROWS && sub == 0) *fs_flash_dr<L>(dq, r / TQ, (int)(r % TQ)) = x;
}

// Rows i0 + r, r = first, first + step, ... < n, of lse (times log2(e)) and of Dr into
// sl[r] and sd[r]; past TQ: 0.
template <int TQ, class L, class E>
__device__ __forceinline__ void fs_flash_rows(float *sl, float *sd, const float *lse, const E *dq, long long bh, int i0,
                                              int n, int first, int step)
{
    for (int r = first; r < n; r += step) {
        const bool in = i0 + r < TQ;
        sl[r] = in ? lse[bh * TQ + i0 + r] * 1.4426950408889634f : 0.f;
        sd[r] = in ? *fs_flash_dr<L>(dq, bh, i0 + r) : 0.f;
    }
}

// P (masked, f32) and dS of a 16 x (8 NTI) tile pair from the scores x and dP y (C
// fragments), in place: x becomes P, y dS. Element (a, b) of the fragment is query
// qrow(a, b), key kcol(a, b); lse2, dr give the query's lse log2(e) and Dr. MPER > 0:
// query slice bh's key mask, its bias joining the raw score as in the forward (times rs = 1 / scale).
template <int TQ, int SK, bool CAUSAL, int NTI, int MPER, class QF, class KF, class LF, class RF, class MT>
__device__ __forceinline__ void fs_flash_ds(float (*x)[4], float (*y)[4], float sl2, QF qrow, KF kcol, LF lse2, RF dr,
                                            const MT *mask, long long bh, float rs)
{
    const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
#pragma unroll
    for (int nt = 0; nt < NTI; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int a = g + 8 * (i >> 1), b = 8 * nt + 2 * t + (i & 1), qi = qrow(a, b), kj = kcol(a, b);
            bool vis = qi < TQ && kj < SK && (!CAUSAL || kj <= qi);
            float s = x[nt][i];
            if (MPER && vis) {
                const float kb = fs_key_bias<MPER, SK>(mask, bh, kj);
                vis = kb != __int_as_float(0xff800000u);
                s += kb * rs;
            }
            const float p = vis ? exp2f(s * sl2 - lse2(a, b)) : 0.f;
            x[nt][i] = p;
            y[nt][i] = p * (y[nt][i] - dr(a, b));
        }
}

// Kernel 2: blockIdx.x = key tile * BKV + kv slice; 128 threads; BM query rows a step.
// Shared: K, V (64 rows each), then two buffers of Q and dO (BM rows each), then floats:
// two of lse and Dr (BM each).
template <class E, int TQ, int SK, int D, int G, bool CAUSAL, class L, int BM, long long BKV, int MPER = 0,
          class MT = int>
__device__ __forceinline__ void fs_flash_dkdv(const E *__restrict__ q, const E *__restrict__ k, const E *__restrict__ v,
                                              const float *__restrict__ lse, const E *__restrict__ dout,
                                              const E *__restrict__ dq, E *__restrict__ dk, E *__restrict__ dv,
                                              float scale, const MT *__restrict__ mask = nullptr)
{
    using F = FsFlashDim<D, E>;
    constexpr int BN = 64, P = F::P, NQT = (TQ + BM - 1) / BM;
    extern __shared__ uint4 fs_dyn[];
    E *sk = reinterpret_cast<E *>(fs_dyn), *sv = sk + BN * P, *sq = sv + BN * P, *so = sq + 2 * BM * P;
    float *sl = reinterpret_cast<float *>(so + 2 * BM * P), *sd = sl + 2 * BM;
    const int warp = threadIdx.x / 32, w0 = 16 * warp;
    const long long bkv = blockIdx.x % BKV;
    const int j0 = (int)(blockIdx.x / BKV) * BN;
    const int qt0 = CAUSAL ? j0 / BM : 0, per = NQT - qt0, steps = G * per;
    const float sl2 = scale * 1.4426950408889634f;

    fs_flash_copy<BN, D, 128, L::k_pitch>(sk, k + L::k(bkv, j0), SK - j0);
    fs_flash_copy<BN, D, 128, L::k_pitch>(sv, v + L::k(bkv, j0), SK - j0);
    auto load = [&](int st, int buf) {  // step st: query slice bkv G + st / per, tile qt0 + st % per
        const long long bh = bkv * G + st / per;
        const int i0 = (qt0 + st % per) * BM;
        fs_flash_copy<BM, D, 128, L::q_pitch>(sq + buf * BM * P, q + L::q(bh, i0), TQ - i0);
        fs_flash_copy<BM, D, 128, L::o_pitch>(so + buf * BM * P, dout + L::o(bh, i0), TQ - i0);
        fs_flash_rows<TQ, L>(sl + buf * BM, sd + buf * BM, lse, dq, bh, i0, BM, threadIdx.x, 128);
    };
    load(0, 0);
    fs_cp_async_commit();

    float adk[F::NT][4], adv[F::NT][4];
#pragma unroll
    for (int nt = 0; nt < F::NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) adk[nt][i] = adv[nt][i] = 0.f;
    for (int st = 0; st < steps; st++) {
        fs_cp_async_wait<0>();
        __syncthreads();  // step st's tiles are in; step st - 1's buffers are free
        if (st + 1 < steps) load(st + 1, (st + 1) & 1);
        fs_cp_async_commit();
        const int buf = st & 1, i0 = (qt0 + st % per) * BM;
        const E *cq = sq + buf * BM * P, *co = so + buf * BM * P;
        const float *cl = sl + buf * BM, *cd = sd + buf * BM;

        float s[BM / 8][4], dp[BM / 8][4];  // S^T and dP^T: rows keys, columns queries
#pragma unroll
        for (int nt = 0; nt < BM / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) s[nt][i] = dp[nt][i] = 0.f;
        fs_mma_abt<P, F::KT, BM / 8>(s, sk, w0, cq);
        fs_mma_abt<P, F::KT, BM / 8>(dp, sv, w0, co);
        fs_flash_ds<TQ, SK, CAUSAL, BM / 8, MPER>(
            s, dp, sl2, [&](int, int b) { return i0 + b; }, [&](int a, int) { return j0 + w0 + a; },
            [&](int, int b) { return cl[b]; }, [&](int, int b) { return cd[b]; }, mask, bkv * G + st / per,
            1.0f / scale);
        fs_mma_xb<P, BM / 16, F::NT>(adv, s, co);
        fs_mma_xb<P, BM / 16, F::NT>(adk, dp, cq);
    }
    // Out through each warp's own rows of sk and sv, which only that warp has read.
    fs_flash_store<D, L::k_pitch>(adk, scale, scale, sk, w0, dk + L::k(bkv, j0 + w0), SK - j0 - w0);
    fs_flash_store<D, L::k_pitch>(adv, 1.0f, 1.0f, sv, w0, dv + L::k(bkv, j0 + w0), SK - j0 - w0);
}

// Kernel 3: blockIdx.x = (NQT - 1 - query tile) * BH + bh; 128 threads; BN keys a step.
// Shared: Q, dO (64 rows each), then two buffers of K and V (BN rows each).
template <class E, int TQ, int SK, int D, int G, bool CAUSAL, class L, int BN, long long BH, int MPER = 0,
          class MT = int>
__device__ __forceinline__ void fs_flash_dq(const E *__restrict__ q, const E *__restrict__ k, const E *__restrict__ v,
                                            const float *__restrict__ lse, const E *__restrict__ dout,
                                            E *__restrict__ dq, float scale, const MT *__restrict__ mask = nullptr)
{
    using F = FsFlashDim<D, E>;
    constexpr int BQ = 64, P = F::P, NQT = (TQ + BQ - 1) / BQ;
    extern __shared__ uint4 fs_dyn[];
    E *sq = reinterpret_cast<E *>(fs_dyn), *so = sq + BQ * P, *sk = so + BQ * P, *sv = sk + 2 * BN * P;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, w0 = 16 * warp;
    const long long bh = blockIdx.x % BH;
    const int i0 = (NQT - 1 - (int)(blockIdx.x / BH)) * BQ;
    constexpr long long KR = L::k_pitch;
    const E *kg = k + L::k(bh / G, 0), *vg = v + L::k(bh / G, 0);
    const float sl2 = scale * 1.4426950408889634f;
    const int jend = CAUSAL ? min(SK, i0 + BQ) : SK, steps = (jend + BN - 1) / BN;

    float l2[2], dr[2];  // this thread's rows w0 + g and w0 + g + 8, read before any dq is written
    fs_flash_rows<TQ, L>(l2, dr, lse, dq, bh, i0 + w0 + g, 1, 0, 1);
    fs_flash_rows<TQ, L>(l2 + 1, dr + 1, lse, dq, bh, i0 + w0 + g + 8, 1, 0, 1);
    fs_flash_copy<BQ, D, 128, L::q_pitch>(sq, q + L::q(bh, i0), TQ - i0);
    fs_flash_copy<BQ, D, 128, L::o_pitch>(so, dout + L::o(bh, i0), TQ - i0);
    fs_flash_copy<BN, D, 128, KR>(sk, kg, SK);
    fs_flash_copy<BN, D, 128, KR>(sv, vg, SK);
    fs_cp_async_commit();

    float acc[F::NT][4];
#pragma unroll
    for (int nt = 0; nt < F::NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    for (int st = 0; st < steps; st++) {
        fs_cp_async_wait<0>();
        __syncthreads();  // key tile st is in (and, at st = 0, every Dr read); tile st - 1's buffers are free
        const int j0 = st * BN, nb = (st + 1) & 1;
        if (st + 1 < steps) {
            fs_flash_copy<BN, D, 128, KR>(sk + nb * BN * P, kg + (j0 + BN) * KR, SK - j0 - BN);
            fs_flash_copy<BN, D, 128, KR>(sv + nb * BN * P, vg + (j0 + BN) * KR, SK - j0 - BN);
        }
        fs_cp_async_commit();
        const E *ck = sk + (st & 1) * BN * P, *cv = sv + (st & 1) * BN * P;

        float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) s[nt][i] = dp[nt][i] = 0.f;
        fs_mma_abt<P, F::KT, BN / 8>(s, sq, w0, ck);
        fs_mma_abt<P, F::KT, BN / 8>(dp, so, w0, cv);
        fs_flash_ds<TQ, SK, CAUSAL, BN / 8, MPER>(
            s, dp, sl2, [&](int a, int) { return i0 + w0 + a; }, [&](int, int b) { return j0 + b; },
            [&](int a, int) { return l2[a >> 3]; }, [&](int a, int) { return dr[a >> 3]; }, mask, bh, 1.0f / scale);
        fs_mma_xb<P, BN / 16, F::NT>(acc, dp, ck);
    }
    fs_flash_store<D, L::q_pitch>(acc, scale, scale, sq, w0, dq + L::q(bh, i0 + w0), TQ - i0 - w0);
}
