/* tests/unit/test_pad_vocab.c: a vocabulary the tensor cores like (passes/pad_vocab.c).
 *  - GPT-2 at V = 300 with pad_vocab 64: wte stored [320, C], its own 300 rows in the
 *    plan (PlanTensor.logical_rows), the loss's valid = 300 and the logits [.., 320];
 *    the params meta and the memory report's count are the model's (the unpadded plan's).
 *    With pad_vocab 0, or a vocabulary already a multiple, nothing changes; an untied [V, C]
 *    head read through transpose is padded, unless something else reads it. Llama's head
 *    [C, V] (read without transposing) keeps its shape and is read through a padded copy,
 *    pad(output) [C, 320]; the loss's valid = 300, the params and their count the model's.
 *    A head with a bias of its own (BERT's decoder) gets the bias padded too, [320] of 300,
 *    unless something else reads the bias.
 *  - On the CPU backend the padded plan trains as the unpadded one: five steps' losses
 *    and the final params, as the training state's logical pieces (the same names,
 *    shapes and element ranges in both plans), fp32 to rounding (only the head GEMM's
 *    width differs), bf16 to its tolerance; with the loss fused and as two ops, and with
 *    AdamW's weight decay (the sample's 0.1) and SGD with momentum and decay; GPT-2, Llama
 *    and the head with a bias.
 *  - The padding rows: step 1's gradient of wte is exactly 0 there, and after five steps
 *    the params there are still exactly 0 (+0.0: never written by an update).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "sample.h"

static const Define DIMS300[6] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 300}, {"B", 4}};
static const Define LLAMA300[7] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 300}, {"B", 4}};
enum { C = 64, V = 300, VP = 320, STEPS = 5 };

/* A tied head with a bias of its own (BERT's decoder: h @ transpose(word_emb) + bias), after a
 * layer that gives the head's input a gradient of its own; the %s is a term added to the loss. */
static const char BIASED[] = "model m {\n"
                             "  dim B = 4, T = 8, V = 300, C = 64;\n"
                             "  input tokens: i32[B, T];\n"
                             "  input targets: i32[B, T];\n"
                             "  param emb: [V, C] = normal(0.02);\n"
                             "  param w: [C, C] = normal(0.1);\n"
                             "  param bias: [V] = normal(0.02);\n"
                             "  h = gelu(embedding(emb, tokens) @ w);\n"
                             "  loss = cross_entropy(h @ transpose(emb) + bias, targets)%s;\n"
                             "}\n";

enum Model { GPT2, LLAMA, WITH_BIAS };

/* GPT-2, Llama or BIASED at V = 300 with the settings given (key, value pairs), padded or not. */
static Plan *model(enum Model which, int pad, const Setting *extra, int n_extra)
{
    Setting set[8] = {{"pad_vocab", pad ? "64" : "0"}};
    for (int i = 0; i < n_extra; i++) set[1 + i] = extra[i];
    char src[sizeof BIASED];
    snprintf(src, sizeof src, BIASED, "");
    return which == LLAMA ? sample_compile("llama.fsm", LLAMA300, 7, set, 1 + n_extra, NULL)
           : which == GPT2 ? sample_compile("gpt2.fsm", DIMS300, 6, set, 1 + n_extra, NULL)
                           : sample_compile_source("biased.fsm", src, NULL, 0, set, 1 + n_extra, NULL);
}
static Plan *gpt2(int pad, const Setting *extra, int n_extra) { return model(GPT2, pad, extra, n_extra); }

static int32_t named_param(const Plan *p, const char *name)
{
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (plan_tensor_is_model_param(&p->tensors[i]) && !strcmp(plan_str(p, p->tensors[i].name), name)) return i;
    cr_assert_fail("no param %s", name);
    return PLAN_NONE;
}

static int64_t op_int(const Plan *p, int32_t k, const char *key)
{
    const PlanOp *op = &p->ops[k];
    for (int32_t a = 0; a < op->n_attr; a++)
        if (!strcmp(plan_str(p, p->attrs[op->attr + a].key), key)) return p->attrs[op->attr + a].i;
    return 0;
}

Test(pad_vocab, the_head_is_padded_and_the_model_keeps_its_own_V)
{
    Plan *p = gpt2(1, NULL, 0), *u = gpt2(0, NULL, 0);
    const PlanTensor *wte = &p->tensors[named_param(p, "wte")], *plain = &u->tensors[named_param(u, "wte")];
    cr_assert(wte->shape[0] == VP && wte->shape[1] == C && wte->logical_rows == V, "wte [%lld, %lld] of %lld rows",
              (long long)wte->shape[0], (long long)wte->shape[1], (long long)wte->logical_rows);
    cr_assert(plain->shape[0] == V && plain->logical_rows == 0);
    cr_assert_eq(plan_tensor_logical_numel(wte), (int64_t)V * C);
    int losses = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        if (strncmp(plan_str(p, p->ops[k].op), "cross_entropy", 13)) continue;
        const PlanTensor *lg = &p->tensors[p->ids[p->ops[k].in]];
        cr_assert_eq(lg->shape[lg->rank - 1], VP, "the logits are [.., %d]", VP);
        cr_assert_eq(op_int(p, k, "valid"), V, "%s: valid = %d", plan_str(p, p->ops[k].op), V);
        losses++;
    }
    cr_assert_gt(losses, 0);
    for (int32_t k = 0; k < u->n_ops; k++) cr_assert_eq(op_int(u, k, "valid"), 0);
    /* The model's params, whatever the storage: meta, the memory report and the state. */
    cr_assert_eq(plan_meta_int(p, "params", 0), plan_meta_int(u, "params", 0));
    char err[256];
    MemReport *rp = report_mem_new(p, err, sizeof err), *ru = report_mem_new(u, err, sizeof err);
    cr_assert(rp && ru, "%s", err);
    cr_assert_eq(rp->param_count, ru->param_count);
    cr_assert_gt(rp->arena_bytes, ru->arena_bytes, "the padding is in the memory plan");
    report_mem_free(rp), report_mem_free(ru);
    plan_free(p), plan_free(u);
}

Test(pad_vocab, nothing_to_pad)
{
    const Define d256[6] = {{"L", 1}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
    Plan *p = sample_compile("gpt2.fsm", d256, 6, NULL, 0, NULL);
    cr_assert_eq(p->tensors[named_param(p, "wte")].logical_rows, 0, "256 is a multiple of 64 already");
    plan_free(p);
    const Define ll[7] = {{"L", 1}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 256}, {"B", 4}};
    p = sample_compile("llama.fsm", ll, 7, NULL, 0, NULL);
    for (int32_t k = 0; k < p->n_ops; k++) cr_assert_str_neq(plan_str(p, p->ops[k].op), "pad");
    plan_free(p);
}

/* Llama's head is stored [C, V]: its vocabulary is its columns, which padding the param would interleave with
 * the padding. The param keeps its shape; the head GEMM reads pad(output) [C, 320], its columns and zeros (made
 * again for the backward, whose slice takes the model's 300 columns of the gradient back out), the logits are
 * [.., 320] and the loss's valid = 300. Nothing of the model changes: params, their shapes and the count. */
Test(pad_vocab, a_head_stored_by_columns_is_read_through_a_padded_copy)
{
    Plan *p = model(LLAMA, 1, NULL, 0), *u = model(LLAMA, 0, NULL, 0);
    const PlanTensor *out = &p->tensors[named_param(p, "output")];
    cr_assert(out->shape[0] == C && out->shape[1] == V && out->logical_rows == 0);
    int pads = 0, slices = 0, losses = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const char *op = plan_str(p, p->ops[k].op);
        const PlanTensor *y = &p->tensors[p->ids[p->ops[k].out]];
        if (!strcmp(op, "pad")) {
            cr_assert(p->ids[p->ops[k].in] == named_param(p, "output") && y->shape[0] == C && y->shape[1] == VP);
            pads++;
        }
        slices += !strcmp(op, "slice") && y->shape[1] == V;
        if (!strncmp(op, "cross_entropy", 13)) {
            cr_assert_eq(op_int(p, k, "valid"), V, "%s: valid", op);
            losses++;
        }
    }
    cr_assert(pads >= 1 && slices == 1 && losses >= 1, "%d pads, %d slices, %d losses", pads, slices, losses);
    cr_assert_eq(plan_meta_int(p, "params", 0), plan_meta_int(u, "params", 0));
    char err[256];
    MemReport *rp = report_mem_new(p, err, sizeof err), *ru = report_mem_new(u, err, sizeof err);
    cr_assert(rp && ru, "%s", err);
    cr_assert_eq(rp->param_count, ru->param_count, "the model's own params");
    report_mem_free(rp), report_mem_free(ru);
    plan_free(p), plan_free(u);
}

/* An untied head stored [V, C] and read through transpose is padded as the tied one is; one
 * that something else reads too (here a penalty on its values) is not. */
Test(pad_vocab, an_untied_head_read_transposed)
{
    static const char SRC[] = "model m {\n"
                              "  dim B = 4, T = 8, V = 300, C = 16;\n"
                              "  input tokens: i32[B, T];\n"
                              "  input targets: i32[B, T];\n"
                              "  param emb: [V, C] = normal(0.02);\n"
                              "  param head: [V, C] = normal(0.02);\n"
                              "  loss = cross_entropy(embedding(emb, tokens) @ transpose(head), targets);\n"
                              "}\n";
    Plan *p = sample_compile_source("head.fsm", SRC, NULL, 0, NULL, 0, NULL);
    const PlanTensor *head = &p->tensors[named_param(p, "head")], *emb = &p->tensors[named_param(p, "emb")];
    cr_assert(head->shape[0] == VP && head->logical_rows == V, "the head: [%lld, 16] of %lld rows",
              (long long)head->shape[0], (long long)head->logical_rows);
    cr_assert(emb->shape[0] == V && emb->logical_rows == 0, "the input embedding is no head");
    plan_free(p);
    static const char READ[] = "model m {\n"
                               "  dim B = 4, T = 8, V = 300, C = 16;\n"
                               "  input tokens: i32[B, T];\n"
                               "  input targets: i32[B, T];\n"
                               "  param emb: [V, C] = normal(0.02);\n"
                               "  param head: [V, C] = normal(0.02);\n"
                               "  loss = cross_entropy(embedding(emb, tokens) @ transpose(head), targets) + "
                               "sum(sum(head * head));\n"
                               "}\n";
    p = sample_compile_source("read.fsm", READ, NULL, 0, NULL, 0, NULL);
    cr_assert_eq(p->tensors[named_param(p, "head")].logical_rows, 0, "a head read elsewhere keeps its shape");
    plan_free(p);
}

/* The logits' bias is padded with the head, the loss masks the padding; a bias that something
 * else reads too (a penalty on its values) keeps its shape, and so then does the head. */
Test(pad_vocab, a_head_with_a_bias)
{
    Plan *p = model(WITH_BIAS, 1, NULL, 0);
    const PlanTensor *emb = &p->tensors[named_param(p, "emb")], *bias = &p->tensors[named_param(p, "bias")];
    cr_assert(emb->shape[0] == VP && emb->logical_rows == V, "emb [%lld, 64] of %lld rows", (long long)emb->shape[0],
              (long long)emb->logical_rows);
    cr_assert(bias->rank == 1 && bias->shape[0] == VP && bias->logical_rows == V, "bias [%lld] of %lld",
              (long long)bias->shape[0], (long long)bias->logical_rows);
    cr_assert_eq(plan_tensor_logical_numel(bias), V);
    int losses = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        if (strncmp(plan_str(p, p->ops[k].op), "cross_entropy", 13)) continue;
        cr_assert_eq(op_int(p, k, "valid"), V);
        losses++;
    }
    cr_assert_gt(losses, 0);
    plan_free(p);
    char src[sizeof BIASED + 64];
    snprintf(src, sizeof src, BIASED, " + sum(bias * bias)");
    p = sample_compile_source("read.fsm", src, NULL, 0, NULL, 0, NULL);
    cr_assert_eq(p->tensors[named_param(p, "bias")].logical_rows, 0, "a bias read elsewhere keeps its shape");
    cr_assert_eq(p->tensors[named_param(p, "emb")].logical_rows, 0, "and its head is not padded");
    plan_free(p);
}

/* An f32 piece's element i. */
static float at(const RtPiece *x, int64_t i) { return ((const float *)x->data)[i]; }

/* Elements [from, to) of data (dtype dt) are +0.0 (all bits zero). */
static void zeros(const void *data, PlanDType dt, int64_t from, int64_t to, const char *what)
{
    int es = plan_dtype_size(dt);
    static const uint8_t zero[8];
    for (int64_t i = from; i < to; i++)
        cr_assert(!memcmp((const uint8_t *)data + i * es, zero, (size_t)es), "%s: padding element %lld is not +0",
                  what, (long long)i);
}

/* Each padded param's rows [V, VP) are +0.0: in its f32 tensor and in the fp32 master of its
 * flat unit; returns how many tensors held them. */
static int padding_is_zero(const Exec *e, const Plan *p)
{
    int held = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PLAN_ROLE_PARAM || !t->logical_rows) continue;
        cr_assert(t->shape[0] == VP && t->logical_rows == V);
        int64_t row = plan_tensor_numel(t) / VP;  // C, or 1 for a bias
        const char *name = plan_str(p, t->name);
        /* A 16-bit param is the step's compute copy, made from the master each step; its bytes are
         * another buffer's once the step is over. */
        if (t->dtype == PLAN_DT_F32) zeros(rt_exec_data(e, i), t->dtype, V * row, VP * row, name), held++;
        for (int32_t s = 0; s < p->n_tensors && t->unit != PLAN_NONE; s++) {
            const PlanTensor *m = &p->tensors[s];
            if (m->unit != t->unit || m->dtype != PLAN_DT_F32 || !rt_flat_is_storage(p, s) || m->sharded) continue;
            zeros(rt_exec_data(e, s), PLAN_DT_F32, t->flat_offset + V * row, t->flat_offset + VP * row, name), held++;
        }
    }
    return held;
}

/* Both plans' params after training, as logical pieces: the same pieces, values within tol
 * of each other (relative to the tensor's largest); the padded plan's padding rows zero. */
static void same_training(enum Model which, const char *precision, const char *fuse, const char *optimizer,
                          double loss_tol, double param_tol)
{
    Setting set[] = {{"precision", precision}, {"fuse_loss", fuse}, {"optimizer", optimizer}, {"momentum", "0.9"},
                     {"weight_decay", "0.1"}, {"lr", strcmp(optimizer, "sgd") ? "1e-3" : "0.1"}, {"warmup", "0"}};
    Plan *p = model(which, 1, set, 7), *u = model(which, 0, set, 7);
    float lp[STEPS], lu[STEPS];
    Exec *ep = sample_train(p, 5, STEPS, lp), *eu = sample_train(u, 5, STEPS, lu);
    for (int s = 0; s < STEPS; s++)
        cr_assert(fabsf(lp[s] - lu[s]) <= loss_tol * fabsf(lu[s]), "%s %s: step %d loss %.9g padded, %.9g not",
                  precision, optimizer, s + 1, lp[s], lu[s]);
    cr_assert(lp[STEPS - 1] < lp[0], "it trains");
    char err[256];
    RtState *sp = rt_state_new(ep, err, sizeof err), *su = rt_state_new(eu, err, sizeof err);
    cr_assert(sp && su, "%s", err);
    cr_assert_eq(rt_state_count(sp), rt_state_count(su), "the same logical pieces");
    int params = 0;
    for (int32_t i = 0; i < rt_state_count(su); i++) {
        const RtPiece *x = rt_state_piece(su, i), *y = NULL;
        for (int32_t j = 0; j < rt_state_count(sp) && !y; j++) {
            const RtPiece *c = rt_state_piece(sp, j);
            if (!strcmp(c->name, x->name) && c->first == x->first) y = c;
        }
        cr_assert_not_null(y, "%s from %lld: not in the padded plan's state", x->name, (long long)x->first);
        cr_assert(y->count == x->count && y->rank == x->rank && y->kind == x->kind, "%s", x->name);
        for (int d = 0; d < x->rank; d++) cr_assert_eq(y->shape[d], x->shape[d], "%s dim %d", x->name, d);
        if (x->kind != RT_STATE_PARAM) continue;
        cr_assert(x->dtype == PLAN_DT_F32 && y->dtype == PLAN_DT_F32);
        double big = 0, worst = 0;
        for (int64_t k = 0; k < x->count; k++) big = fmax(big, fabs(at(x, k)));
        for (int64_t k = 0; k < x->count; k++) worst = fmax(worst, fabs(at(x, k) - at(y, k)));
        cr_assert(worst <= param_tol * fmax(big, 1), "%s %s: %s differs by %g of %g", precision, optimizer, x->name,
                  worst, big);
        params++;
    }
    cr_assert_gt(params, 0);
    /* Llama's param has no padding; BIASED's emb and bias have, each in its master */
    cr_assert_geq(padding_is_zero(ep, p), which == GPT2 ? 1 : which == WITH_BIAS ? 2 : 0, "the fp32 masters");
    rt_state_free(sp), rt_state_free(su);
    rt_exec_free(ep), rt_exec_free(eu);
    plan_free(p), plan_free(u);
}

/* fp32: the head GEMM's width is all that differs, so a step differs by rounding alone; AdamW
 * normalizes the gradient, so a param moves by about lr (1e-3) a step whatever its size, and
 * rounding shows in its update at about 1e-6 of that. */
Test(pad_vocab, fp32_trains_as_unpadded) { same_training(GPT2, "fp32", "1", "adamw", 1e-6, 1e-5); }
Test(pad_vocab, fp32_unfused_sgd_trains_as_unpadded) { same_training(GPT2, "fp32", "0", "sgd", 1e-6, 1e-5); }
/* bf16: the same rounding differences, in 8-bit mantissas. */
Test(pad_vocab, bf16_trains_as_unpadded) { same_training(GPT2, "bf16", "1", "adamw", 1e-3, 1e-2); }
/* Llama's [C, V] head through its padded copy: the same. */
Test(pad_vocab, llama_fp32_trains_as_unpadded) { same_training(LLAMA, "fp32", "1", "adamw", 1e-6, 1e-5); }
Test(pad_vocab, llama_fp32_unfused_sgd_trains_as_unpadded) { same_training(LLAMA, "fp32", "0", "sgd", 1e-6, 1e-5); }
Test(pad_vocab, llama_bf16_trains_as_unpadded) { same_training(LLAMA, "bf16", "1", "adamw", 1e-3, 1e-2); }
/* A head with a bias: the bias padded with it (its gradient's padded sums are over zero columns). */
Test(pad_vocab, biased_fp32_trains_as_unpadded) { same_training(WITH_BIAS, "fp32", "1", "adamw", 1e-6, 1e-5); }
Test(pad_vocab, biased_fp32_unfused_sgd_trains_as_unpadded)
{
    same_training(WITH_BIAS, "fp32", "0", "sgd", 1e-6, 1e-5);
}
Test(pad_vocab, biased_bf16_trains_as_unpadded) { same_training(WITH_BIAS, "bf16", "1", "adamw", 1e-3, 1e-2); }

/* Step 1's gradient of wte: 0 exactly on the padding rows, whichever loss op made it. */
static void zero_gradient(const char *fuse)
{
    Setting set[] = {{"fuse_loss", fuse}};
    Plan *p = gpt2(1, set, 1);
    RtData *d;
    Exec *e = sample_exec(p, 5, &d);
    rt_data_fill(d, 1);
    cr_assert_eq(rt_exec_run_ops(e, 1, 0, rt_exec_first_op(e, PLAN_PHASE_OPTIMIZER), RT_PHASES_ALL), 0);
    RtTensor g;
    cr_assert_eq(rt_exec_tensor(e, "wte.grad", &g), 0);
    cr_assert(g.dtype == PLAN_DT_F32 && g.numel == (int64_t)VP * C);
    zeros(g.data, g.dtype, (int64_t)V * C, g.numel, "wte.grad");
    double own = 0;
    for (int64_t i = 0; i < (int64_t)V * C; i++) own = fmax(own, fabs(((const float *)g.data)[i]));
    cr_assert_gt(own, 0, "the model's rows have a gradient");
    rt_data_close(d);
    rt_exec_free(e);
    plan_free(p);
}

Test(pad_vocab, padding_gets_no_gradient_fused) { zero_gradient("1"); }
Test(pad_vocab, padding_gets_no_gradient_unfused) { zero_gradient("0"); }
