/* tests/unit/test_zero_formulas.c: model state and traffic per rank as ZeRO counts them
 * (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
 * Models"), on GPT-2 shapes of 7.5B (C 4096, L 36, NH 32), 128B (C 12288, L 70, NH 96)
 * and 1T (C 25600, L 128, NH 160) params with AdamW, V 50257 and T 8 (compiling takes
 * as long at any B and T; B 64 splits over every world); the plans are compiled, never run.
 *
 * Psi is the model's params (exact: L (12 C^2 + 13 C) + (V + T) C + 2 C), N the world.
 * The plan stores wte's vocabulary padded to 50304 rows (passes/pad_vocab.c) and flattens
 * each unit (a block; the params outside blocks, "o": wte, wpe, lnf) into one buffer
 * padded to a multiple of N: each category below is checked exactly on the padded units,
 * and on the exact Psi to within the padding (N - 1 elements a unit, and the vocabulary's
 * 47 C, twice in fsdp's fp32 params, which hold the params outside blocks twice).
 * Model state in bytes per rank, in the report's categories (report/memstate.c):
 *
 *   bf16, fp16         16-bit params     16-bit grads  fp32 params  optimizer  fp32 grads
 *   none (N 1), ddp    2 Psi             2 Psi         4 Psi        8 Psi      0
 *   zero1 (P_os)       2 Psi             2 Psi         4 Psi / N    8 Psi / N  0
 *   zero2 (P_os+g)     2 Psi             2 Psi / N     4 Psi / N    8 Psi / N  0
 *   fsdp (P_os+g+p)    2 Psi / N + Ro    2 Psi / N     4 Psi / N    8 Psi / N  0
 *
 * that is ZeRO's 16 Psi (ddp), 4 Psi + 12 Psi / N (zero1), 2 Psi + 14 Psi / N (zero2) and
 * 16 Psi / N (fsdp) with K = 12 (the fp32 master 4 Psi, momentum and variance 8 Psi).
 * The optimizer reads the 16-bit grads as they are: no fp32 copy of them is made. One
 * thing ZeRO's (2 + 2 + K) Psi does not count, which fsdp plans hold:
 *  - Ro = 2 Psi_o (1 - 1 / N): fsdp keeps the params outside blocks gathered from forward
 *    to backward (as PyTorch's and FairScale's FSDP keep the root instance's: the backward
 *    starts with them), so they count as 16-bit params in full rather than as this
 *    rank's shard.
 * fsdp's per-block gathers are transient ("gathered params"), not model state.
 *
 *   fp32 (the params are the masters: ZeRO with K = 8 and 4-byte grads)
 *                      fp32 params           fp32 grads   optimizer
 *   none, ddp          4 Psi                 4 Psi        8 Psi       = 16 Psi
 *   zero1              4 Psi                 4 Psi        8 Psi / N   = 8 Psi + 8 Psi / N
 *   zero2              4 Psi                 4 Psi / N    8 Psi / N   = 4 Psi + 12 Psi / N
 *   fsdp               4 Psi / N + 4 Psi_o   4 Psi / N    8 Psi / N   = 16 Psi / N + 4 Psi_o
 * (fsdp's params outside blocks: the fp32 shard, and the gathered copy kept in full).
 *
 * The optimizer state also holds its scalars (the step count; fp16: the loss scale and
 * its good-step count), 4 bytes each.
 *
 * Bytes sent per rank and step (report/comm.c's comm_totals: ZeRO's accounting, an
 * all-reduce of a buffer 2x its bytes, a reduce-scatter or all-gather 1x the full
 * buffer), with b the bytes of the reduce dtype (the compute dtype: 2 in bf16 and fp16,
 * 4 in fp32) and of the gathered params:
 *   none  0
 *   ddp   all-reduce of the grads                              2 b Psi
 *   zero1 all-reduce of the grads, all-gather of the params     3 b Psi (FairScale's OSS;
 *         ZeRO's P_os reduce-scatters: 2 b Psi)
 *   zero2 reduce-scatter of the grads, all-gather of the params 2 b Psi
 *   fsdp  reduce-scatter, all-gather before forward and again   3 b Psi - b Psi_o (the
 *         before backward                                       params outside blocks once)
 * on the padded units exactly, plus the scalars' all-reduces (the loss, the gradient
 * norm, fp16's overflow check: at most 32 bytes).
 *
 * Cases: 7.5B in bf16, fp16 and fp32, none at world 1 and ddp, zero1, zero2 and fsdp at
 * worlds 1, 2, 4 and 64 (51 plans); 128B and 1T in bf16 and fp32, none at world 1 and
 * the four strategies at world 64 (20 plans: the world only changes the padding and the
 * shards, which 7.5B covers at every world; each 1T plan takes about a second to
 * compile, mostly memplan's). About 13 s of CPU in all, 7 s on two cores (the tests run
 * in parallel).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "report.h"
#include "sample.h"

typedef struct {
    const char *name;
    int64_t C, L, NH;
} Model;

static const Model MODELS[] = {{"7.5B", 4096, 36, 32}, {"128B", 12288, 70, 96}, {"1T", 25600, 128, 160}};
static const int64_t V = 50257, VP = 50304, T = 8, B = 64;  // VP: V as stored (pad_vocab 64)

typedef enum { S_NONE, S_DDP, S_ZERO1, S_ZERO2, S_FSDP, S_COUNT } Strategy;
static const char *const STRATEGY[S_COUNT] = {"none", "ddp", "zero1", "zero2", "fsdp"};

/* How a category is held: not at all; each param as it is (no padding: per-param
 * buffers, or a cast of each param); the padded flat units in full; this rank's shard of
 * each; the blocks' shards and the params outside blocks in full (fsdp's 16-bit params);
 * every shard, and the params outside blocks in full too (fsdp's fp32 params in fp32). */
typedef enum { H_NO, H_EXACT, H_FULL, H_SHARD, H_SHARD_ROOT_FULL, H_SHARD_AND_ROOT } Held;

/* The five categories of model state, in report order. */
static const MemCategory CATS[5] = {MEM_PARAMS16, MEM_GRADS16, MEM_PARAMS32, MEM_GRADS32, MEM_OPT_STATE};
static const int ELEM[5] = {2, 2, 4, 4, 8};  // bytes per param: the optimizer's are m and v

/* The tables of the header, [strategy][category]. */
static const Held MIXED[S_COUNT][5] = {
    [S_NONE] = {H_EXACT, H_EXACT, H_EXACT, H_NO, H_EXACT},
    [S_DDP] = {H_EXACT, H_FULL, H_FULL, H_NO, H_FULL},
    [S_ZERO1] = {H_FULL, H_FULL, H_SHARD, H_NO, H_SHARD},
    [S_ZERO2] = {H_FULL, H_SHARD, H_SHARD, H_NO, H_SHARD},
    [S_FSDP] = {H_SHARD_ROOT_FULL, H_SHARD, H_SHARD, H_NO, H_SHARD},
};
static const Held FP32[S_COUNT][5] = {
    [S_NONE] = {H_NO, H_NO, H_EXACT, H_EXACT, H_EXACT},
    [S_DDP] = {H_NO, H_NO, H_FULL, H_FULL, H_FULL},
    [S_ZERO1] = {H_NO, H_NO, H_FULL, H_FULL, H_SHARD},
    [S_ZERO2] = {H_NO, H_NO, H_FULL, H_SHARD, H_SHARD},
    [S_FSDP] = {H_NO, H_NO, H_SHARD_AND_ROOT, H_SHARD, H_SHARD},
};

/* Params of a block, and outside blocks (the model's; as stored, wte's padding rows too). */
static int64_t block_params(const Model *m) { return 12 * m->C * m->C + 13 * m->C; }
static int64_t root_params(const Model *m) { return (V + T) * m->C + 2 * m->C; }
static int64_t root_stored(const Model *m) { return root_params(m) + (VP - V) * m->C; }
static int64_t psi(const Model *m) { return m->L * block_params(m) + root_params(m); }
static int64_t padded(int64_t n, int64_t w) { return (n + w - 1) / w * w; }

/* Elements a rank holds of category h, on the padded units. */
static int64_t held_padded(const Model *m, Held h, int64_t w)
{
    int64_t blk = padded(block_params(m), w), root = padded(root_stored(m), w), all = m->L * blk + root;
    switch (h) {
    case H_NO: return 0;
    case H_EXACT: return m->L * block_params(m) + root_stored(m);
    case H_FULL: return all;
    case H_SHARD: return all / w;
    case H_SHARD_ROOT_FULL: return m->L * blk / w + root;
    case H_SHARD_AND_ROOT: return all / w + root;
    }
    return -1;
}

/* The same on the exact Psi: ZeRO's formula (fsdp with the params outside blocks in full). */
static double held_exact(const Model *m, Held h, int64_t w)
{
    double p = (double)psi(m), o = (double)root_params(m);
    switch (h) {
    case H_NO: return 0;
    case H_EXACT:
    case H_FULL: return p;
    case H_SHARD: return p / (double)w;
    case H_SHARD_ROOT_FULL: return p / (double)w + o * (1 - 1.0 / (double)w);
    case H_SHARD_AND_ROOT: return p / (double)w + o;
    }
    return -1;
}

/* The optimizer's scalars: the step count; fp16's loss scale and its good-step count. */
static int64_t scalars(const char *precision) { return strcmp(precision, "fp16") ? 4 : 12; }

/* Bytes sent per rank and step, on the padded units, but the scalars. */
static double comm_formula(const Model *m, Strategy s, int b, int64_t w)
{
    double all = (double)held_padded(m, H_FULL, w), root = (double)padded(root_stored(m), w);
    static const double times[S_COUNT] = {0, 2, 3, 2, 3};
    return b * (times[s] * all - (s == S_FSDP ? root : 0));
}

static Plan *compile(const Model *m, Strategy s, const char *precision, int w)
{
    char world[16];
    snprintf(world, sizeof world, "%d", w);
    const Define dims[] = {{"C", m->C}, {"L", m->L}, {"NH", m->NH}, {"T", T}, {"V", V}, {"B", B}};
    const Setting set[] = {{"shard", STRATEGY[s]}, {"world", world}, {"precision", precision}, {"optimizer", "adamw"}};
    return sample_compile("gpt2.fsm", dims, 6, set, 4, NULL);
}

static void check_state(const Model *m, Strategy s, const char *precision, int w, const MemReport *r, const char *what)
{
    const Held *row = strcmp(precision, "fp32") ? MIXED[s] : FP32[s];
    for (int c = 0; c < 5; c++) {
        int64_t got = r->state[CATS[c]], extra = CATS[c] == MEM_OPT_STATE ? scalars(precision) : 0;
        int64_t want = ELEM[c] * held_padded(m, row[c], w) + extra;
        double zero = ELEM[c] * held_exact(m, row[c], w);
        double slack = (double)ELEM[c] * ((double)w * (double)(m->L + 1) + 2.0 * (double)((VP - V) * m->C));
        const char *name = report_category_name(CATS[c]);
        cr_expect_eq(got, want, "%s: %s %lld bytes, the padded formula %lld", what, name, (long long)got, (long long)want);
        cr_expect(fabs((double)(got - extra) - zero) <= slack, "%s: %s %lld bytes, ZeRO's formula on the exact Psi %.0f",
                  what, name, (long long)got, zero);
        cr_expect_eq(r->host_state[CATS[c]], 0, "%s: %s on the host", what, name);
    }
}

static void check(const Model *m, Strategy s, const char *precision, int w)
{
    char what[96], err[256];
    snprintf(what, sizeof what, "%s %s %s world %d", m->name, STRATEGY[s], precision, w);
    Plan *p = compile(m, s, precision, w);
    MemReport *r = report_mem_new(p, err, sizeof err);
    cr_assert_not_null(r, "%s: %s", what, err);
    cr_expect_eq(r->param_count, psi(m), "%s: %lld params, the shapes say %lld", what, (long long)r->param_count,
                 (long long)psi(m));
    check_state(m, s, precision, w, r, what);
    cr_expect_eq(r->has_per_use_gathers, s == S_FSDP, "%s: only fsdp gathers per use", what);
    CommTotals c = comm_totals(p);
    double want = comm_formula(m, s, strcmp(precision, "fp32") ? 2 : 4, w);
    cr_expect(c.bytes >= want && c.bytes <= want + 32, "%s: %.0f bytes sent a step, the formula %.0f", what, c.bytes,
              want);
    report_mem_free(r);
    plan_free(p);
}

/* none at world 1, and every other strategy at each world. */
static void check_model(int k, const char *precision, const int *worlds, int n_worlds)
{
    const Model *m = &MODELS[k];
    check(m, S_NONE, precision, 1);
    for (int s = S_DDP; s < S_COUNT; s++)
        for (int i = 0; i < n_worlds; i++) check(m, (Strategy)s, precision, worlds[i]);
}

static const int WORLDS[] = {1, 2, 4, 64}, W64[] = {64};

Test(zero_formulas, gpt2_7_5b_bf16) { check_model(0, "bf16", WORLDS, 4); }
Test(zero_formulas, gpt2_7_5b_fp16) { check_model(0, "fp16", WORLDS, 4); }
Test(zero_formulas, gpt2_7_5b_fp32) { check_model(0, "fp32", WORLDS, 4); }
Test(zero_formulas, gpt2_128b_bf16) { check_model(1, "bf16", W64, 1); }
Test(zero_formulas, gpt2_128b_fp32) { check_model(1, "fp32", W64, 1); }
Test(zero_formulas, gpt2_1t_bf16) { check_model(2, "bf16", W64, 1); }
Test(zero_formulas, gpt2_1t_fp32) { check_model(2, "fp32", W64, 1); }

/* Activations saved for backward, per block (Korthikanti et al., "Reducing Activation
 * Recomputation in Large Transformer Models", without dropout and with the attention
 * core in flash form: no s x s scores kept). With s the sequence, b this rank's batch,
 * h the width and a the heads, a GPT-2 block keeps, in elements: its input and
 * layernorm 1's output (2 sbh), q, k, v and the attention output (4 sbh), the residual
 * and layernorm 2's output (2 sbh), the MLP's up-projection and its GELU (8 sbh): 16 sbh
 * in the compute dtype, and attention's row log-sum-exp in f32, a s b floats. So 32 sbh +
 * 4 asb bytes in 16-bit, 64 sbh + 4 asb in fp32. merge_heads' copy of the attention
 * output is made again in the backward, not kept. Under `recompute Block` a block keeps
 * its input only: sbh in the compute dtype. Under `recompute attention` (selective: the
 * attention core reruns from layernorm 1's output) it keeps the rest: 12 sbh, and no
 * log-sum-exp. Under a mix (`h.0,attention:h.1`) each block keeps its own mode's. */
static const char *const RECOMPUTE[] = {"none", "Block", "attention", "h.0,attention:h.1-2"};

static int64_t saved_formula(int recompute, int block, int64_t e, int64_t sbh, int64_t asb)
{
    if (recompute == 3) recompute = block == 0 ? 1 : 2;
    return recompute == 1 ? e * sbh : recompute == 2 ? 12 * e * sbh : 16 * e * sbh + 4 * asb;
}

static void check_saved(const char *precision, Strategy s, int w, int recompute)
{
    const int64_t S = 32, Bt = 8, H = 64, A = 4, b = Bt / w;
    char world[16], what[128], err[256];
    snprintf(world, sizeof world, "%d", w);
    snprintf(what, sizeof what, "%s %s world %d recompute %s", precision, STRATEGY[s], w, RECOMPUTE[recompute]);
    const Define dims[] = {{"C", H}, {"L", 3}, {"NH", A}, {"T", S}, {"V", 256}, {"B", Bt}};
    const Setting set[] = {{"shard", STRATEGY[s]}, {"world", world}, {"precision", precision},
                           {"recompute", RECOMPUTE[recompute]}};
    Plan *p = sample_compile("gpt2.fsm", dims, 6, set, 4, NULL);
    MemReport *r = report_mem_new(p, err, sizeof err);
    cr_assert_not_null(r, "%s: %s", what, err);
    int64_t e = strcmp(precision, "fp32") ? 2 : 4, sbh = S * b * H;
    for (int k = 0; k < 3; k++) {
        int64_t want = saved_formula(recompute, k, e, sbh, A * S * b);
        cr_expect_eq(r->saved_by_block[k], want, "%s: block h.%d saves %lld bytes for its backward, the formula %lld",
                     what, k, (long long)r->saved_by_block[k], (long long)want);
    }
    report_mem_free(r);
    plan_free(p);
}

Test(zero_formulas, saved_activations_per_block)
{
    static const char *const precisions[] = {"fp32", "bf16", "fp16"};
    for (int i = 0; i < 3; i++)
        for (int rc = 0; rc < 4; rc++) {
            check_saved(precisions[i], S_NONE, 1, rc);
            for (int s = S_DDP; s < S_COUNT; s++) check_saved(precisions[i], (Strategy)s, 2, rc);
        }
}
