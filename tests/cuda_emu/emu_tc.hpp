// tests/cuda_emu/emu_tc.hpp: the tensor-core and async-copy instructions, as the
// emulator runs them for codegen/kernels/tc.cuh (whose fs_* wrappers call these when
// FS_CUDA_EMU is defined, inline PTX otherwise). Part of emu.hpp (included from it after
// the warp exchanges), test infrastructure only.
//
// Fragment layouts are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating
// point type", "... for mma.m16n8k8", ldmatrix), with g = lane / 4, t = lane % 4:
//   m16n8k16 .bf16/.f16 A (16x16, row): a[r] holds 2 elements (low half first) at row
//     g + 8 * (r & 1), columns 2t + 8 * (r >> 1) + {0, 1};
//   B (16x8, col): b[r] holds rows 2t + 8 * r + {0, 1} of column g;
//   C, D (16x8 f32): c[i] at row g + 8 * (i >> 1), column 2t + (i & 1);
//   m16n8k8 .tf32 A (16x8): a[r] at row g + 8 * (r & 1), column t + 4 * (r >> 1);
//     B (8x8): b[r] at row t + 4 * r, column g; C and D as above;
//   ldmatrix .m8n8 .b16: lanes 8i..8i+7 give the 8 row addresses (16 bytes each) of
//     matrix i; r[i] of lane l holds row l / 4, columns 2 (l % 4) + {0, 1} of matrix i
//     (.trans: rows 2 (l % 4) + {0, 1} of column l / 4, i.e. the transpose's).
//
// Warp-collective instructions (mma, ldmatrix) are warp barriers like the shuffles: each
// lane deposits its operands (mma) or its row address (ldmatrix) and waits for the
// warp; then each lane computes its own result from the deposits and waits again, so no
// lane deposits anew before all have read. An instruction with exited lanes fails as
// every warp operation does. Numerics of mma: each product exact (bf16, f16 and tf32
// products fit in f32), summed in f32 in k order onto C, rounding to nearest at each
// add. A GPU's tensor core adds its products in another order and width, so results can
// differ in the last bits where sums round; with values whose sums are exact (the tests
// use such) the two agree to the bit. tf32 operands: the low 13 bits of the f32 pattern
// are dropped (the tensor core reads 19 bits); fs_to_tf32 rounds to nearest, ties away
// from zero (cvt.rna.tf32.f32).
//
// cp.async: a copy that lands at the wait. When issued, its 16 source bytes are read
// (the source must not change before the wait on a GPU either) and its 16 destination
// bytes in shared memory are poisoned with 0xff (NaN in every float type), so a kernel
// that reads them before its wait reads NaN; the copy is queued on the thread in its
// open group. commit closes the open group; wait_group N lands the copies of every
// committed group but the newest N; wait_all lands all, the open group's too. Landing
// writes shared memory visible to the whole block at once, which is stronger than a GPU
// (other threads see it only after a barrier); a reader without that barrier still
// fails, as its result differs between the forward and reverse thread orders. Copies
// never waited for when the thread exits are dropped (their bytes stay NaN). Checked:
// the destination lies in shared memory, both addresses are 16-byte aligned, the
// zero-fill source size is 0 to 16. Not modelled: the L1 bypass of .cg (no caches).
#pragma once

namespace emu {
enum { MMA_BF16, MMA_F16, MMA_TF32 };

inline float tf32_bits(uint32_t u) { return __uint_as_float(u & 0xffffe000u); }
inline float half16(uint32_t h, int type)
{
    return type == MMA_BF16 ? __bfloat162float(__nv_bfloat16{(uint16_t)h}) : __half2float(__half{(uint16_t)h});
}

struct MmaDeposit {
    uint32_t a[4], b[2];
};

// D = A B + C for the warp, this lane's fragments in and out (layouts above).
EMU_UNOBSERVED inline void mma(int type, float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    static_assert(sizeof(MmaDeposit) <= sizeof slots[0], "an mma deposit larger than a slot");
    MmaDeposit mine;
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    memcpy(slots[cur->lin], &mine, sizeof mine);
    float acc[4] = {c[0], c[1], c[2], c[3]};
    yield(AT_WARP);
    int base = cur->lin - lane(), g = lane() / 4, t = lane() % 4, K = type == MMA_TF32 ? 8 : 16;
    if (base + 32 > nthreads) fail("a warp of fewer than 32 threads at an mma");
    MmaDeposit w[32];
    for (int l = 0; l < 32; l++) memcpy(&w[l], slots[base + l], sizeof w[l]);
    auto A = [&](int row, int k) {  // element (row, k) of A, from the lane that holds it
        if (type == MMA_TF32) return tf32_bits(w[(row % 8) * 4 + k % 4].a[row / 8 + 2 * (k / 4)]);
        uint32_t r = w[(row % 8) * 4 + (k % 8) / 2].a[row / 8 + 2 * (k / 8)];
        return half16(k % 2 ? r >> 16 : r & 0xffffu, type);
    };
    auto B = [&](int k, int col) {
        if (type == MMA_TF32) return tf32_bits(w[col * 4 + k % 4].b[k / 4]);
        uint32_t r = w[col * 4 + (k % 8) / 2].b[k / 8];
        return half16(k % 2 ? r >> 16 : r & 0xffffu, type);
    };
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < K; k++) acc[i] += A(g + 8 * (i >> 1), k) * B(k, 2 * t + (i & 1));
    yield(AT_WARP);
    memcpy(d, acc, sizeof acc);
}

// ldmatrix .m8n8 .x{num} (.trans) .b16: r[0..num) of this lane.
EMU_UNOBSERVED inline void ldmatrix(uint32_t *r, int num, bool trans, const void *row)
{
    uintptr_t a = (uintptr_t)row;
    if (lane() < 8 * num) {
        if (!in_shared(a)) fail("ldmatrix: a row address outside shared memory");
        if (a % 16) fail("ldmatrix: a row address not 16-byte aligned");
        note((uintptr_t)__builtin_return_address(0), row, 16, false);
    }
    memcpy(slots[cur->lin], &a, sizeof a);
    yield(AT_WARP);
    int base = cur->lin - lane(), l = lane();
    if (base + 32 > nthreads) fail("a warp of fewer than 32 threads at an ldmatrix");
    for (int m = 0; m < num; m++) {
        uint16_t h[2];
        for (int e = 0; e < 2; e++) {
            int rw = trans ? 2 * (l % 4) + e : l / 4, col = trans ? l / 4 : 2 * (l % 4) + e;
            uintptr_t at;
            memcpy(&at, slots[base + 8 * m + rw], sizeof at);
            memcpy(&h[e], (const char *)at + 2 * col, 2);
        }
        r[m] = h[0] | (uint32_t)h[1] << 16;
    }
    yield(AT_WARP);
}

// cp.async of 16 bytes, src_bytes of them from src and the rest zeros.
EMU_UNOBSERVED inline void cp_async(void *dst, const void *src, int src_bytes)
{
    if (!in_shared((uintptr_t)dst)) fail("cp.async: a destination outside shared memory");
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) fail("cp.async: an address not 16-byte aligned");
    if (src_bytes < 0 || src_bytes > 16) fail("cp.async: a source size outside 0..16");
    Copy c{dst, {0}, cur->groups};
    if (src_bytes) memcpy(c.bytes, src, (size_t)src_bytes);
    if (src_bytes) note((uintptr_t)__builtin_return_address(0), src, (unsigned)src_bytes, false);
    note((uintptr_t)__builtin_return_address(0), dst, 16, true);
    memset(dst, 0xff, 16);
    cur->copies.push_back(c);
}

inline void cp_async_commit() { cur->groups++; }

// Lands every copy of a group older than the newest `keep` committed ones (all, open
// group included, when keep < 0), in the order they were issued.
EMU_UNOBSERVED inline void cp_async_wait(int keep)
{
    std::vector<Copy> &q = cur->copies;
    size_t kept = 0;
    for (size_t i = 0; i < q.size(); i++) {
        if (keep < 0 || q[i].group < cur->groups - keep) memcpy(q[i].dst, q[i].bytes, 16);
        else q[kept++] = q[i];
    }
    q.resize(kept);
}
}  // namespace emu
