/* tests/unit/test_state.c: the training state as logical tensors (runtime/state.c), what
 * checkpoints write and resume reads.
 *  - For every strategy, precision and offload at world 3 (uneven, padded shards), the
 *    pieces the ranks own tile every logical tensor exactly once: each param element,
 *    each AdamW moment element and each step counter is written by one rank. Every
 *    rank holds all of what it owns, and the pieces a rank holds lie inside their
 *    holders, without overlapping one another.
 *  - The logical names are the model's: every param under its name and shape, its two
 *    moments as "<param>.exp_avg" and "<param>.exp_avg_sq" (SGD: ".momentum_buffer"),
 *    whatever plan made them; a plan of another strategy has the same names.
 *  - Elements: a param's pieces, read at their data, are the param's values (flat
 *    storages included), for one real Exec.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

static const Define GPT2[] = {{"L", 2}, {"C", 24}, {"NH", 2}, {"T", 8}, {"V", 50}, {"B", 6}};

static Plan *compile(const char *shard, const char *precision, const char *world, const char *offload,
                     const char *optimizer)
{
    Setting set[] = {{"shard", shard}, {"precision", precision}, {"world", world}, {"offload", offload},
                     {"optimizer", optimizer}, {"momentum", "0.9"}};
    return sample_compile("gpt2.fsm", GPT2, 6, set, 6, NULL);
}

typedef struct {
    const char *name;
    int64_t first, count;
    int kind;
} Span;

static int by_span(const void *a, const void *b)
{
    const Span *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->first < y->first ? -1 : x->first > y->first;
}

static int64_t numel(const RtPiece *x)
{
    int64_t n = 1;
    for (int d = 0; d < x->rank; d++) n *= x->shape[d];
    return n;
}

/* The owned pieces of every rank tile each logical tensor once; returns the logical
 * tensors' element count by kind. */
static void check_owned_tiling(const Plan *p, int W, int64_t *by_kind)
{
    char err[512];
    Span *spans = NULL;
    size_t n = 0, cap = 0;
    RtState *st[8];
    cr_assert_leq(W, 8);
    for (int r = 0; r < W; r++) {
        st[r] = rt_state_at(p, r, W, err, sizeof err);
        cr_assert_not_null(st[r], "%s", err);
        for (int32_t i = 0; i < rt_state_count(st[r]); i++) {
            const RtPiece *x = rt_state_piece(st[r], i);
            cr_assert_gt(x->count, 0);
            cr_assert(x->first >= 0 && x->first + x->count <= numel(x), "%s [%ld, +%ld) of %ld", x->name,
                      (long)x->first, (long)x->count, (long)numel(x));
            if (!x->own) continue;
            if (n == cap) spans = realloc(spans, sizeof *spans * (cap = cap ? 2 * cap : 256));
            spans[n++] = (Span){x->name, x->first, x->count, x->kind};
        }
    }
    qsort(spans, n, sizeof *spans, by_span);
    memset(by_kind, 0, sizeof(int64_t) * RT_STATE_COUNT);
    for (size_t i = 0; i < n;) {
        int64_t at = 0;
        size_t j = i;
        for (; j < n && !strcmp(spans[j].name, spans[i].name); j++) {
            cr_assert_eq(spans[j].first, at, "%s: owned from %ld, expected %ld (a gap or an overlap)", spans[j].name,
                         (long)spans[j].first, (long)at);
            at += spans[j].count;
        }
        by_kind[spans[i].kind] += at;
        i = j;
    }
    free(spans);
    for (int r = 0; r < W; r++) rt_state_free(st[r]);
}

/* The model's params (each once) and their element count. */
static int64_t model_params(const Plan *p)
{
    int64_t n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (plan_tensor_is_model_param(&p->tensors[i])) n += plan_tensor_logical_numel(&p->tensors[i]);
    return n;
}

/* Every rank's owned elements: the params once, AdamW's two moments twice over. */
static void check_plan(const char *shard, const char *precision, const char *world, const char *offload)
{
    Plan *p = compile(shard, precision, world, offload, "adamw");
    int64_t k[RT_STATE_COUNT], psi = model_params(p);
    check_owned_tiling(p, atoi(world), k);
    cr_assert_eq(k[RT_STATE_PARAM], psi, "%s %s %s: params %ld, the model has %ld", shard, precision, offload,
                 (long)k[RT_STATE_PARAM], (long)psi);
    cr_assert_eq(k[RT_STATE_OPTIM], 2 * psi, "%s %s %s: optimizer %ld of %ld", shard, precision, offload,
                 (long)k[RT_STATE_OPTIM], (long)(2 * psi));
    int64_t other = !strcmp(precision, "fp16") ? 3 : 1;  // opt_step; fp16: loss_scale and its good-step count
    cr_assert_eq(k[RT_STATE_OTHER], other, "%s %s: step state %ld", shard, precision, (long)k[RT_STATE_OTHER]);
    plan_free(p);
}

Test(state, every_element_owned_once_for_every_strategy)
{
    check_plan("none", "fp32", "1", "none");
    check_plan("ddp", "fp32", "3", "none");
    check_plan("zero1", "fp32", "3", "none");
    check_plan("zero2", "bf16", "3", "none");
    check_plan("zero2", "fp32", "3", "none");
    check_plan("fsdp", "fp16", "3", "none");
    check_plan("zero1", "fp32", "3", "optimizer");
    check_plan("zero2", "bf16", "3", "optimizer");
    check_plan("fsdp", "bf16", "3", "params");
    check_plan("none", "bf16", "1", "optimizer");
}

/* The names every plan of the model shares. */
Test(state, names_are_the_models_whatever_the_plan)
{
    char err[512];
    Plan *a = compile("none", "fp32", "1", "none", "adamw"), *b = compile("fsdp", "bf16", "3", "none", "adamw");
    RtState *sa = rt_state_of_plan(a, err, sizeof err), *sb = rt_state_of_plan(b, err, sizeof err);
    cr_assert(sa && sb, "%s", err);
    const char *want[] = {"wte", "wte.exp_avg", "wte.exp_avg_sq", "h.1.attn.w", "h.1.attn.w.exp_avg_sq", "opt_step"};
    for (int k = 0; k < 6; k++) {
        int in_a = 0, in_b = 0;
        for (int32_t i = 0; i < rt_state_count(sa); i++) in_a |= !strcmp(rt_state_piece(sa, i)->name, want[k]);
        for (int32_t i = 0; i < rt_state_count(sb); i++) in_b |= !strcmp(rt_state_piece(sb, i)->name, want[k]);
        cr_assert(in_a && in_b, "'%s': in the none plan %d, in the fsdp plan %d", want[k], in_a, in_b);
    }
    for (int32_t i = 0; i < rt_state_count(sb); i++) {  // the fsdp plan's params have their model shapes
        const RtPiece *x = rt_state_piece(sb, i);
        if (!strcmp(x->name, "h.1.attn.w")) cr_assert(x->rank == 2 && x->shape[0] == 24 && x->shape[1] == 72);
    }
    rt_state_free(sa), rt_state_free(sb);
    plan_free(a), plan_free(b);
    Plan *s = compile("zero2", "fp32", "3", "none", "sgd");
    RtState *ss = rt_state_of_plan(s, err, sizeof err);
    cr_assert_not_null(ss, "%s", err);
    int found = 0;
    for (int32_t i = 0; i < rt_state_count(ss); i++) found |= !strcmp(rt_state_piece(ss, i)->name, "wpe.momentum_buffer");
    cr_assert(found, "SGD's state is named <param>.momentum_buffer");
    rt_state_free(ss);
    plan_free(s);
}

/* A real Exec at world 1 with flat storage (ddp): each param's pieces read its values. */
Test(state, pieces_point_at_the_params_values)
{
    char err[512];
    Plan *flat = compile("ddp", "fp32", "1", "none", "adamw"), *own = compile("none", "fp32", "1", "none", "adamw");
    Exec *a = rt_exec_new(flat, &(ExecOptions){.seed = 7}, err, sizeof err);
    Exec *b = rt_exec_new(own, &(ExecOptions){.seed = 7}, err, sizeof err);
    cr_assert(a && b, "%s", err);
    RtState *sa = rt_state_new(a, err, sizeof err);
    cr_assert_not_null(sa, "%s", err);
    int checked = 0;
    for (int32_t i = 0; i < rt_state_count(sa); i++) {
        const RtPiece *x = rt_state_piece(sa, i);
        if (x->kind != RT_STATE_PARAM) continue;
        RtTensor t;
        cr_assert_eq(rt_exec_tensor(b, x->name, &t), 0, "'%s' is a param of the unsharded plan", x->name);
        cr_assert_eq(memcmp(x->data, (const float *)t.data + x->first, sizeof(float) * (size_t)x->count), 0,
                     "'%s' [%ld, +%ld): the flat storage's bytes are the param's", x->name, (long)x->first,
                     (long)x->count);
        checked++;
    }
    cr_assert_gt(checked, 10);
    rt_state_free(sa);
    rt_exec_free(a), rt_exec_free(b);
    plan_free(flat), plan_free(own);
}
