/* tests/unit/test_ops.c: the op layer (ops/) on its own, without a graph or a plan.
 *  - The table: names round-trip through op_lookup; every OPF_COLLECTIVE (P2P, COPY) row
 *    names what it moves in the comm column and no other row does; op_comm_by_name and
 *    op_comm_name agree; the flag bits are distinct.
 *  - Signatures: parameters parse into kinds and defaults; op_param_index finds
 *    attributes and never tensors.
 *  - Shape rules run on plain OpTypes with attributes from any accessor (here a small
 *    array), give PyTorch's result types, and fail with a message naming the op.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "ops.h"

Test(ops, names_round_trip)
{
    for (int k = 0; k < OP_COUNT; k++) {
        cr_assert_eq(op_lookup(op_name((OpKind)k)), (OpKind)k, "%s", op_name((OpKind)k));
        cr_assert_eq(op_info_by_name(op_name((OpKind)k)), op_info((OpKind)k));
        cr_assert_not_null(op_info((OpKind)k)->shape, "%s", op_name((OpKind)k));
    }
    cr_assert_eq(op_lookup("no_such_op"), OP_COUNT);
    cr_assert_null(op_info_by_name("no_such_op"));
    cr_assert_str_eq(op_name(OP_COUNT), "?");
}

Test(ops, collectives_name_their_kind)
{
    int seen[COMM_COUNT] = {0};
    for (int k = 0; k < OP_COUNT; k++) {
        const OpInfo *info = op_info((OpKind)k);
        cr_assert_eq(!!(info->flags & (OPF_COLLECTIVE | OPF_P2P | OPF_COPY)), info->comm != COMM_NONE, "%s", info->name);
        if (info->comm == COMM_NONE) continue;
        seen[info->comm]++;
        cr_assert_eq(op_comm_by_name(info->name), info->comm);
        cr_assert_str_eq(op_comm_name(info->comm), info->name);
    }
    for (int c = 0; c < COMM_COUNT; c++) cr_assert_eq(seen[c], 1, "collective %d is one op", c);
    cr_assert_eq(op_comm_by_name("all_reduce"), COMM_ALL_REDUCE);
    cr_assert_eq(op_comm_by_name("reduce_scatter"), COMM_REDUCE_SCATTER);
    cr_assert_eq(op_comm_by_name("all_gather"), COMM_ALL_GATHER);
    cr_assert_eq(op_comm_by_name("matmul"), COMM_NONE);
    cr_assert_eq(op_comm_by_name("no_such_op"), COMM_NONE);
    cr_assert_str_eq(op_comm_name(COMM_NONE), "?");
}

Test(ops, flags_are_distinct_bits)
{
    const int flags[] = {OPF_ELEMWISE, OPF_REDUCE, OPF_VIEW, OPF_LAYOUT, OPF_HIDDEN, OPF_SAVES,
                         OPF_EFFECT, OPF_COLLECTIVE, OPF_P2P, OPF_COPY, OPF_INPLACE};
    int all = 0;
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        cr_assert_eq(flags[i] & (flags[i] - 1), 0, "flag %zu is one bit", i);
        cr_assert_eq(all & flags[i], 0, "flag %zu is its own bit", i);
        all |= flags[i];
    }
}

Test(ops, signatures_parse)
{
    const OpInfo *mm = op_info(OP_matmul);
    cr_assert_eq(mm->n_tensors, 2);
    cr_assert_eq(mm->n_params, 4);
    cr_assert_eq(mm->params[2].kind, ARG_FLAG);
    cr_assert(mm->params[2].has_default);
    cr_assert_eq(op_param_index(mm, "tb"), 3);
    cr_assert_eq(op_param_index(mm, "a"), -1, "tensors are not attributes");
    cr_assert_eq(op_info(OP_concat)->n_tensors, -1);
    const OpInfo *ar = op_info(OP_all_reduce);
    cr_assert_eq(ar->params[op_param_index(ar, "world")].kind, ARG_INT);
    cr_assert_eq(ar->params[op_param_index(ar, "avg")].def, 0);
    cr_assert_eq(op_info(OP_reshape)->params[1].kind, ARG_INTS);
}

/* Attributes from a plain array: the accessor is all a rule sees. */
typedef struct {
    const char *key;
    OpAttr v;
} KeyVal;
typedef struct {
    const KeyVal *kv;
    int n;
} KeyVals;

static int find(const void *self, const char *key, OpAttr *out)
{
    const KeyVals *a = self;
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->kv[i].key, key)) return *out = a->kv[i].v, 1;
    return 0;
}

static OpType type(DType dt, int rank, const int64_t *shape)
{
    OpType t = {.dtype = dt, .rank = rank};
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)rank);
    return t;
}

Test(ops, rules_run_on_plain_types)
{
    char err[256] = "";
    const KeyVal kv[] = {{"tb", {.kind = OPA_INT, .i = 1}}};
    KeyVals attrs = {kv, 1};
    ShapeCtx c = {.op = OP_matmul, .attrs = {&attrs, find}, .n_in = 2, .err = err, .errlen = sizeof err};
    c.in[0] = type(DT_BF16, 3, (int64_t[]){4, 8, 16});
    c.in[1] = type(DT_BF16, 2, (int64_t[]){32, 16});  // transposed: [16, 32]
    cr_assert_eq(op_shape(&c), 0, "%s", err);
    cr_assert_eq(c.n_out, 1);
    char got[64];
    cr_assert_str_eq(op_type_str(&c.out[0], got, sizeof got), "bf16[4, 8, 32]");

    attrs.n = 0;  // without tb the inner dims differ
    cr_assert_eq(op_shape(&c), -1);
    cr_assert_str_eq(err, "matmul: inner dims differ: bf16[4, 8, 16] @ bf16[32, 16] (16 vs 32)");

    /* A list attribute, and a rule that decides its outputs. */
    const KeyVal split[] = {{"n", {.kind = OPA_INT, .i = 3}}, {"axis", {.kind = OPA_INT, .i = -1}}};
    attrs = (KeyVals){split, 2};
    c = (ShapeCtx){.op = OP_split, .attrs = {&attrs, find}, .n_in = 1, .err = err, .errlen = sizeof err};
    c.in[0] = type(DT_F32, 2, (int64_t[]){2, 96});
    cr_assert_eq(op_shape(&c), 0, "%s", err);
    cr_assert_eq(c.n_out, 3);
    cr_assert_str_eq(op_type_str(&c.out[2], got, sizeof got), "f32[2, 32]");

    const int64_t dims[] = {-1, 4};
    const KeyVal shape[] = {{"shape", {.kind = OPA_INTS, .ints = dims, .n_ints = 2}}};
    attrs = (KeyVals){shape, 1};
    c = (ShapeCtx){.op = OP_reshape, .attrs = {&attrs, find}, .n_in = 1, .err = err, .errlen = sizeof err};
    c.in[0] = type(DT_I32, 2, (int64_t[]){2, 6});
    cr_assert_eq(op_shape(&c), 0, "%s", err);
    cr_assert_str_eq(op_type_str(&c.out[0], got, sizeof got), "i32[3, 4]");

    /* No accessor at all: every attribute takes its default. */
    c = (ShapeCtx){.op = OP_all_gather, .n_in = 1, .err = err, .errlen = sizeof err};
    c.in[0] = type(DT_F32, 1, (int64_t[]){8});
    cr_assert_eq(op_shape(&c), -1);
    cr_assert_str_eq(err, "all_gather: needs a flat buffer and a positive world");
}

Test(ops, dtypes)
{
    DType t;
    cr_assert_eq(dtype_parse("bf16", &t), 0);
    cr_assert_eq(t, DT_BF16);
    cr_assert_eq(dtype_size(DT_F16), 2);
    cr_assert_str_eq(dtype_name(DT_I32), "i32");
    cr_assert(!dtype_is_float(DT_I32));
    cr_assert_eq(dtype_parse("f64", &t), -1);
}
