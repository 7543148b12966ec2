/* tests/cuda_emu/test_tc.c: the emulated tensor-core and async-copy instructions
 * (codegen/kernels/tc.cuh run by tests/cuda_emu/emu_tc.hpp) and the emulator's memory
 * measures (emu_observe.hpp), through the kernels of tc_kernels.cu:
 *   - random tiles multiplied by mma (bf16, f16 at m16n8k16, tf32 at m16n8k8): every
 *     lane's every fragment element against a plain matrix product, the fragments packed
 *     and read here by the PTX ISA's layout formulas, written out anew (values whose sums
 *     are exact in f32, so any order of adds gives the same bits);
 *   - ldmatrix x1, x2, x4 and .trans against the documented layout;
 *   - cp.async: without a wait the kernel reads poison (NaN); wait_group 1 lands the
 *     older group only; wait_all everything, zero-fill included;
 *   - dynamic shared memory of 200 KiB, and more than 227 KiB refused;
 *   - sectors per ideal of coalesced, strided and 128-bit accesses, and bank-conflict
 *     ways of a transpose through shared memory with and without padding, each against
 *     numbers derived by hand in the test's comment.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_plans.h"

#ifndef FS_SOURCE_DIR
#error "FS_SOURCE_DIR: the source tree, set by tests/cuda_emu/cuda_emu.cmake"
#endif

TestSuite(tc, .init = emu_plans_load);

/* tc.cuh then tc_kernels.cu, the #include "..." lines dropped, as a plan's module is made. */
static char *tc_source(void)
{
    static const char *const files[] = {FS_SOURCE_DIR "/codegen/kernels/tc.cuh",
                                        FS_SOURCE_DIR "/tests/cuda_emu/tc_kernels.cu"};
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap), line[4096];
    cr_assert(out);
    for (int f = 0; f < 2; f++) {
        FILE *in = fopen(files[f], "r");
        cr_assert(in, "cannot read %s", files[f]);
        while (fgets(line, sizeof line, in)) {
            size_t k = strlen(line);
            if (!strncmp(line, "#include \"", 10)) continue;
            if (n + k + 1 > cap) cr_assert(out = realloc(out, cap *= 2));
            memcpy(out + n, line, k + 1);
            n += k;
        }
        fclose(in);
    }
    return out;
}

static T *tc_plan(void)
{
    char *src = tc_source();
    T *t = t_new(src);
    free(src);
    return t;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A random k 2^e, |k| <= 8, -3 <= e <= 3: exact in bf16, f16 and tf32, and 16 products
 * of two plus one more such number add up exactly in f32 in any order. */
static float small(unsigned *seed)
{
    int k = (int)(rand_r(seed) % 17) - 8, e = (int)(rand_r(seed) % 7) - 3;
    return ldexpf((float)k, e);
}

/* x (exact as below) as 16 bits: bf16, or f16 (a normal number or zero). */
static uint32_t to16(float x, int f16)
{
    if (!f16) return bits(x) >> 16;
    if (x == 0) return 0;
    int e;
    float m = frexpf(fabsf(x), &e);  // x = m 2^e, m in [0.5, 1)
    uint32_t mant = (uint32_t)ldexpf(m, 11) & 0x3ffu;
    return (x < 0 ? 0x8000u : 0) | (uint32_t)(e - 1 + 15) << 10 | mant;
}

enum { BF16, F16, TF32 };

/* A (16 x K) B (K x 8) + C through kernel, fragments by the PTX ISA's formulas. */
static void check_mma(const char *kernel, int type)
{
    int K = type == TF32 ? 8 : 16;
    unsigned seed = 1234u + (unsigned)type;
    float A[16][16], B[16][8], C[16][8];
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < K; k++) A[r][k] = small(&seed);
    for (int k = 0; k < K; k++)
        for (int c = 0; c < 8; c++) B[k][c] = small(&seed);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) C[r][c] = small(&seed);
    T *t = tc_plan();
    int32_t a = tensor(t, PLAN_DT_F32, 128), b = tensor(t, PLAN_DT_F32, 64), c = tensor(t, PLAN_DT_F32, 128),
            d = tensor(t, PLAN_DT_F32, 128);
    uint32_t *fa = (uint32_t *)t_f32(t, a), *fb = (uint32_t *)t_f32(t, b);
    float *fc = t_f32(t, c);
    for (int l = 0; l < 32; l++) {
        int g = l / 4, q = l % 4;
        for (int r = 0; r < 4; r++) {
            if (type == TF32) {  // a[r]: row g + 8 (r & 1), column q + 4 (r >> 1); b[r]: row q + 4r of column g
                fa[4 * l + r] = bits(A[g + 8 * (r & 1)][q + 4 * (r >> 1)]) | 0x1fffu;  // low 13 bits: not read
                if (r < 2) fb[2 * l + r] = bits(B[q + 4 * r][g]) | 0x0abcu;
            } else {  // a[r]: row g + 8 (r & 1), columns 2q + 8 (r >> 1) + {0, 1}; b[r]: rows 2q + 8r + {0, 1}
                int row = g + 8 * (r & 1), col = 2 * q + 8 * (r >> 1);
                fa[4 * l + r] = to16(A[row][col], type == F16) | to16(A[row][col + 1], type == F16) << 16;
                if (r < 2)
                    fb[2 * l + r] = to16(B[2 * q + 8 * r][g], type == F16) | to16(B[2 * q + 8 * r + 1][g], type == F16) << 16;
            }
        }
        for (int i = 0; i < 4; i++) fc[4 * l + i] = C[g + 8 * (i >> 1)][2 * q + (i & 1)];
    }
    launch(t, kernel, 1, 1, 32, 1, (int32_t[]){a, b, c, d}, 4);
    cr_assert_eq(t_run(t), 0, "%s", t->err);
    const float *fd = t_f32(t, d);
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {  // d[i]: row g + 8 (i >> 1), column 2q + (i & 1)
            int row = l / 4 + 8 * (i >> 1), col = 2 * (l % 4) + (i & 1);
            double want = C[row][col];
            for (int k = 0; k < K; k++) want += (double)A[row][k] * B[k][col];
            cr_expect_eq(fd[4 * l + i], (float)want, "%s: lane %d, d[%d] (row %d, column %d): %g, want %g", kernel, l,
                         i, row, col, fd[4 * l + i], want);
        }
    t_free(t);
}

Test(tc, mma_bf16_m16n8k16) { check_mma("tc_mma_bf16", BF16); }
Test(tc, mma_f16_m16n8k16) { check_mma("tc_mma_f16", F16); }
Test(tc, mma_tf32_m16n8k8) { check_mma("tc_mma_tf32", TF32); }

Test(tc, ldmatrix_layouts)
{
    T *t = tc_plan();
    int32_t x = tensor(t, PLAN_DT_F32, 128), out = tensor(t, PLAN_DT_F32, 6 * 32 * 4);
    uint16_t *m = (uint16_t *)t_f32(t, x);  // matrix i, row r, column c at 64 i + 8 r + c
    for (int i = 0; i < 256; i++) m[i] = (uint16_t)(1000 + i);
    launch(t, "tc_ldmatrix", 1, 1, 32, 1, (int32_t[]){x, out}, 2);
    cr_assert_eq(t_run(t), 0, "%s", t->err);
    const uint32_t *r = (const uint32_t *)t_f32(t, out);
    static const char *const names[] = {"x1", "x2", "x4", "x1.trans", "x2.trans", "x4.trans"};
    for (int f = 0; f < 6; f++)
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) {
                int num = 1 << (f % 3), trans = f >= 3;
                uint32_t want = 0;
                // r[i]: row l/4, columns 2(l%4) + {0,1} of matrix i; .trans: rows 2(l%4) + {0,1}, column l/4
                if (i < num) {
                    int r0 = trans ? 2 * (l % 4) : l / 4, c0 = trans ? l / 4 : 2 * (l % 4);
                    int lo = 64 * i + 8 * r0 + c0, hi = trans ? lo + 8 : lo + 1;
                    want = m[lo] | (uint32_t)m[hi] << 16;
                }
                cr_expect_eq(r[(f * 32 + l) * 4 + i], want, "%s: lane %d, r[%d] = %#x, want %#x", names[f], l, i,
                             r[(f * 32 + l) * 4 + i], want);
            }
    t_free(t);
}

/* y of kernel (one of the cp.async kernels) from x = 1, 2, ..., 256. */
static T *cp_async_run(const char *kernel, int32_t *y)
{
    T *t = tc_plan();
    int32_t x = tensor(t, PLAN_DT_F32, 256);
    *y = tensor(t, PLAN_DT_F32, 256);
    for (int i = 0; i < 256; i++) t_f32(t, x)[i] = (float)(i + 1);
    launch(t, kernel, 1, 1, 32, 1, (int32_t[]){x, *y}, 2);
    cr_assert_eq(t_run(t), 0, "%s: %s", kernel, t->err);
    return t;
}

Test(tc, cp_async_read_before_wait_is_nan)
{
    int32_t y;
    T *t = cp_async_run("tc_cp_async_nowait", &y);
    for (int i = 0; i < 256; i++)
        cr_expect(isnan(t_f32(t, y)[i]), "y[%d] = %g: a copy landed before any wait", i, t_f32(t, y)[i]);
    t_free(t);
}

Test(tc, cp_async_wait_group_lands_older_groups)
{
    int32_t y;
    T *t = cp_async_run("tc_cp_async_wait1", &y);
    for (int i = 0; i < 128; i++)
        cr_expect_eq(t_f32(t, y)[i], (float)(i + 1), "group 0, y[%d] = %g", i, t_f32(t, y)[i]);
    for (int i = 128; i < 256; i++)
        cr_expect(isnan(t_f32(t, y)[i]), "group 1 (newest) landed: y[%d] = %g", i, t_f32(t, y)[i]);
    t_free(t);
}

Test(tc, cp_async_wait_all_and_zero_fill)
{
    int32_t y;
    T *t = cp_async_run("tc_cp_async_waitall", &y);
    // thread 30's second copy reads 0 bytes (y[248, 252) zeros), 31's 8 (y[254, 256) zeros)
    for (int i = 0; i < 256; i++) {
        float want = (i >= 248 && i < 252) || i >= 254 ? 0.f : (float)(i + 1);
        cr_expect_eq(t_f32(t, y)[i], want, "y[%d] = %g, want %g", i, t_f32(t, y)[i], want);
    }
    t_free(t);
}

Test(tc, dynamic_shared_memory_of_200_kib)
{
    T *t = tc_plan();
    int32_t x = tensor(t, PLAN_DT_F32, 256), y = tensor(t, PLAN_DT_F32, 256);
    for (int i = 0; i < 256; i++) t_f32(t, x)[i] = (float)(i % 7);
    int32_t at = launch(t, "tc_dynamic_shared", 1, 1, 256, 1, (int32_t[]){x, y}, 2);
    t->p->cuda[at].smem = 200 * 1024;
    cr_assert_eq(t_run(t), 0, "%s", t->err);
    for (int i = 0; i < 256; i++) {  // 200 floats x[i+1] + k, k = 0..199
        float want = 200.f * (float)((i + 1) % 256 % 7) + 19900.f;
        cr_expect_eq(t_f32(t, y)[i], want, "y[%d] = %g, want %g", i, t_f32(t, y)[i], want);
    }
    t_free(t);
}

Test(tc, dynamic_shared_memory_over_227_kib_refused)
{
    T *t = tc_plan();
    int32_t x = tensor(t, PLAN_DT_F32, 256), y = tensor(t, PLAN_DT_F32, 256);
    int32_t at = launch(t, "tc_dynamic_shared", 1, 1, 256, 1, (int32_t[]){x, y}, 2);
    t->p->cuda[at].smem = 227 * 1024 + 16;
    cr_assert_neq(t_run(t), 0);
    cr_expect(strstr(t->err, "232464 bytes of dynamic shared memory"), "%s", t->err);
    t_free(t);
}

/* ---- measures --------------------------------------------------------------------------- */

typedef struct {
    int launches;
    long long global, sectors, ideal, shared, conflicted;
    double ratio, ways;
    int worst;
} Row;

/* The row of kernel in the backend's table of measures. */
static Row measured(T *t, const char *kernel)
{
    const char *table = ops->measures(t->b), *at = table;
    Row r = {0};
    size_t n = strlen(kernel);
    cr_assert(table);
    while ((at = strstr(at, kernel)) && !((at == table || at[-1] == '\n') && at[n] == ' ')) at += n;
    cr_assert(at, "no row for %s in:\n%s", kernel, table);
    cr_assert_eq(sscanf(at + n, "%d %lld %lld %lld %lf %lld %lf %d %lld", &r.launches, &r.global, &r.sectors,
                        &r.ideal, &r.ratio, &r.shared, &r.ways, &r.worst, &r.conflicted), 9, "%s", at);
    return r;
}

/* 256 threads, 8 warps, each warp one read of x and one write of y, the tensors 64-byte
 * aligned (so a warp's 128 contiguous bytes are 4 whole sectors):
 *   stride 1: read 4 sectors (ideal 4), write 4 (4): 8 x 8 = 64 of 64;
 *   stride 2: each lane's 4 bytes 8 apart, 256 bytes: read 8 sectors (ideal 4): 8 x 12 = 96;
 *   stride 8: 32 bytes apart, a sector each: read 32 (ideal 4): 8 x 36 = 288;
 *   fs_ld128/fs_st128: 16 bytes a lane, 512 contiguous: 16 sectors (ideal 16) each way,
 *   8 x 32 = 256 of 256. */
Test(tc, sectors_per_ideal)
{
    static const char *const kernels[] = {"tc_stride1", "tc_stride2", "tc_stride8", "tc_vector"};
    static const long long sectors[] = {64, 96, 288, 256}, ideal[] = {64, 64, 64, 256};
    T *t = tc_plan();
    int32_t x = tensor(t, PLAN_DT_F32, 2048), y = tensor(t, PLAN_DT_F32, 1024);
    for (int k = 0; k < 4; k++) launch(t, kernels[k], 1, 1, 256, 1, (int32_t[]){x, y}, 2);
    cr_assert_eq(t_run(t), 0, "%s", t->err);
    for (int k = 0; k < 4; k++) {
        Row r = measured(t, kernels[k]);
        cr_expect_eq(r.launches, 1, "%s", kernels[k]);
        cr_expect_eq(r.global, 16, "%s: %lld warp accesses to global memory, want 16", kernels[k], r.global);
        cr_expect_eq(r.sectors, sectors[k], "%s: %lld sectors, want %lld", kernels[k], r.sectors, sectors[k]);
        cr_expect_eq(r.ideal, ideal[k], "%s: ideal %lld, want %lld", kernels[k], r.ideal, ideal[k]);
        cr_expect_eq(r.shared, 0, "%s", kernels[k]);
    }
    t_free(t);
}

/* One warp, s[32][32 + PAD] floats, lane l owning row l; 32 writes s[l][j], then 32 times
 * the reads s[j][l] and s[l][j]: 96 warp accesses. PAD 0: s[l][j] is word 32 l + j, bank
 * j for every lane, 32 words: 32 ways (64 accesses); s[j][l] is 32 j + l: banks 0..31, 1
 * way (32). Ways sum 64 x 32 + 32 = 2080. PAD 1: word 33 l + j, bank (l + j) % 32: 1 way
 * everywhere, sum 96. ldmatrix's module: the 2-byte stores s[24 l + e] put lanes l, l + 8,
 * l + 16, l + 24 in one bank (48 l bytes: 12 l words, 96 = 0 mod 32): 4 ways, 8 of them;
 * each ldmatrix (6) reads rows 48 bytes apart, banks 12 r + {0..3} mod 32 all distinct in
 * a phase of 8 rows: 1 way. 14 accesses, ways sum 38. */
Test(tc, bank_conflict_ways)
{
    T *t = tc_plan();
    int32_t x = tensor(t, PLAN_DT_F32, 1024), y = tensor(t, PLAN_DT_F32, 1024), out = tensor(t, PLAN_DT_F32, 768);
    launch(t, "tc_banks_conflict", 1, 1, 32, 1, (int32_t[]){x, y}, 2);
    launch(t, "tc_banks_padded", 1, 1, 32, 1, (int32_t[]){x, y}, 2);
    launch(t, "tc_ldmatrix", 1, 1, 32, 1, (int32_t[]){x, out}, 2);
    cr_assert_eq(t_run(t), 0, "%s", t->err);
    Row c = measured(t, "tc_banks_conflict"), p = measured(t, "tc_banks_padded"), l = measured(t, "tc_ldmatrix");
    cr_expect_eq(c.shared, 96);
    cr_expect_eq(c.worst, 32);
    cr_expect_eq(c.conflicted, 64);
    cr_expect(fabs(c.ways - 2080.0 / 96) < 0.01, "average ways %g, want %g", c.ways, 2080.0 / 96);
    cr_expect_eq(p.shared, 96);
    cr_expect_eq(p.worst, 1);
    cr_expect_eq(p.conflicted, 0);
    cr_expect_eq(l.shared, 14);
    cr_expect_eq(l.worst, 4);
    cr_expect_eq(l.conflicted, 8);
    cr_expect(fabs(l.ways - 38.0 / 14) < 0.01, "average ways %g, want %g", l.ways, 38.0 / 14);
    t_free(t);
}
