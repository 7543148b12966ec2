/* tests/unit/test_memplan.c: the memory plan of real models is sound.
 *  - No two tensors that are live at the same time share a byte of the arena (every
 *    pair is checked), unless one is a view of the other.
 *  - Every tensor lies inside the arena, 64-byte aligned.
 *  - Debug mode, which fills every buffer with NaN outside its planned live range,
 *    trains bit for bit like the normal mode: no op reads a buffer it was not given.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "sample.h"

static Plan *compile_sample(const char *file, const Define *defs, int n_defs)
{
    return sample_compile(file, defs, n_defs, NULL, 0, NULL);
}

static const Define GPT2[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
static const Define LLAMA[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 256}, {"B", 4}};

static int32_t root_of(const Plan *p, int32_t t) { return p->tensors[t].alias == PLAN_NONE ? t : p->tensors[t].alias; }

static void check_no_overlap(const Plan *p)
{
    int64_t arena = plan_space_bytes(p, PLAN_PLACE_DEVICE);
    cr_assert_gt(arena, 0);
    int pairs = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *a = &p->tensors[i];
        int64_t na = plan_tensor_nbytes(a);
        cr_assert(a->offset % 64 == 0 && a->offset >= 0 && a->offset + na <= arena,
                  "tensor %d (%s) at [%ld, +%ld) outside the arena of %ld", i, plan_str(p, a->name), (long)a->offset,
                  (long)na, (long)arena);
        for (int32_t j = i + 1; j < p->n_tensors; j++) {
            const PlanTensor *b = &p->tensors[j];
            if (root_of(p, i) == root_of(p, j)) continue;
            if (a->live_end < b->live_start || b->live_end < a->live_start) continue;
            int64_t nb = plan_tensor_nbytes(b);
            pairs++;
            cr_assert(a->offset + na <= b->offset || b->offset + nb <= a->offset,
                      "tensors %d (%s) and %d (%s) are live together (ops %d-%d, %d-%d) and overlap ([%ld, +%ld) and [%ld, +%ld))",
                      i, plan_str(p, a->name), j, plan_str(p, b->name), a->live_start, a->live_end, b->live_start,
                      b->live_end, (long)a->offset, (long)na, (long)b->offset, (long)nb);
        }
    }
    cr_assert_gt(pairs, 100, "too few live pairs to mean anything (%d)", pairs);
}

Test(memplan, gpt2_live_tensors_never_overlap)
{
    Plan *p = compile_sample("gpt2.fsm", GPT2, 6);
    check_no_overlap(p);
    plan_free(p);
}

Test(memplan, llama_live_tensors_never_overlap)
{
    Plan *p = compile_sample("llama.fsm", LLAMA, 7);
    check_no_overlap(p);
    plan_free(p);
}

Test(memplan, mlp_live_tensors_never_overlap)
{
    Plan *p = compile_sample("mlp.fsm", NULL, 0);
    check_no_overlap(p);
    plan_free(p);
}

/* Losses of `steps` steps, with or without NaN outside live ranges. */
static void train(const Plan *p, int nan_fill, int steps, float *loss)
{
    rt_exec_free(sample_train_with(p, &(ExecOptions){.seed = 3, .nan_fill = nan_fill}, steps, loss));
}

static void check_nan_fill(const Plan *p)
{
    float plain[3], poisoned[3];
    train(p, 0, 3, plain);
    train(p, 1, 3, poisoned);
    for (int s = 0; s < 3; s++) {
        cr_assert(isfinite(plain[s]), "step %d: loss %g", s + 1, plain[s]);
        cr_assert(!memcmp(&plain[s], &poisoned[s], sizeof(float)), "step %d: loss %.9g, with NaN-filled free buffers %.9g",
                  s + 1, plain[s], poisoned[s]);
    }
}

Test(memplan, gpt2_trains_identically_with_freed_buffers_poisoned) { Plan *p = compile_sample("gpt2.fsm", GPT2, 6); check_nan_fill(p); plan_free(p); }

/* A gap in a flat gradient buffer (the unused param `spare`: no gradient is made there)
 * is zeroed by the plan, not by the arena: with the clip's norm reading the whole buffer,
 * a NaN left there would change every step. */
Test(memplan, gradient_gaps_train_identically_with_freed_buffers_poisoned)
{
    const char *src = sample_source_with("mlp.fsm", "  param w_out", "  param spare: [5] = normal(1);\n");
    Setting set[] = {{"clip", "1.0"}};
    Plan *p = sample_compile_source("mlp.fsm", src, NULL, 0, set, 1, NULL);
    check_nan_fill(p);
    plan_free(p);
}
Test(memplan, llama_trains_identically_with_freed_buffers_poisoned) { Plan *p = compile_sample("llama.fsm", LLAMA, 7); check_nan_fill(p); plan_free(p); }
