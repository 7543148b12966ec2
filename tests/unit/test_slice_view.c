/* tests/unit/test_slice_view.c: passes/slice_view.c on graphs built by hand. A slice that
 * is one run of its input's bytes becomes slice_view, and memplan lays it in the input's
 * buffer at start x inner x 4 bytes; one whose rows are apart stays a copy; so does one
 * whose buffer a node writes while the slice is still read (here a node made to write in
 * that buffer, as an in-place op does, between the slice and its reader), but not when
 * the write comes after the last reader. */
#include <criterion/criterion.h>

#include "build.h"
#include "passes.h"

static Graph *g;

static void setup(void) { g = ir_graph_new("t"); }
static void teardown(void) { ir_graph_free(g); }
TestSuite(slice_view, .init = setup, .fini = teardown);

static int node(OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr)
{
    return build_node(g, op, in, n_in, attrs, n_attr, -1, PHASE_FORWARD, (Loc){0});
}
static int out0(int n) { return ir_out(g, ir_node(g, n), 0); }

static void run_pass(void)
{
    Options o = {0};
    config_default(&o.train);
    Diag d;
    diag_init(&d, "t", NULL, 0, stderr);
    cr_assert_eq(pass_slice_view(g, &o, &d), 0);
}

/* x: f32 [1, 4, 3], made by a node (an activation); the slice of rows [1, 3) of axis 1. */
static int sliced(int *x, int64_t axis, int64_t start)
{
    int in = build_value(g, ROLE_INPUT, "in", DT_F32, DIMS(1, 4, 3), -1, (Loc){0});
    *x = out0(node(OP_neg, INS(in), NULL, 0));
    return node(OP_slice, INS(*x), ATTRS(AI("axis", axis), AI("start", start), AI("len", 2)));
}

Test(slice_view, one_run_of_bytes_is_a_view)
{
    int x, s = sliced(&x, 1, 1);
    int y = out0(s);
    ir_output_add(g, out0(node(OP_neg, INS(y), NULL, 0)));
    run_pass();
    cr_assert_eq(ir_node(g, s)->op, OP_slice_view);
    cr_assert_eq(ir_view_parent(g, y), x);
    Options o = {0};
    config_default(&o.train);
    Diag d;
    diag_init(&d, "t", NULL, 0, stderr);
    cr_assert_eq(pass_memplan(g, &o, &d), 0);
    cr_expect_eq(ir_value(g, y)->offset, ir_value(g, x)->offset + 1 * 3 * 4, "start 1 x inner 3 x 4 bytes in");
}

Test(slice_view, rows_apart_stay_a_copy)
{
    int x, s = sliced(&x, 2, 1);  // positions 1, 2 of each of the 4 rows of 3
    ir_output_add(g, out0(node(OP_neg, INS(out0(s)), NULL, 0)));
    run_pass();
    cr_assert_eq(ir_node(g, s)->op, OP_slice);
}

/* A node after the slice that writes its output in x's buffer (as an in-place op does),
 * before (changed) or after (kept) the slice's reader; a copy, not an elementwise node,
 * which the pass counts as read with the reader (fuse may group the two). */
static int writes_x_around_reader(int before)
{
    int x, s = sliced(&x, 1, 1);
    int w = -1;
    if (before) w = out0(node(OP_copy, INS(x), NULL, 0));
    ir_output_add(g, out0(node(OP_neg, INS(out0(s)), NULL, 0)));
    if (!before) w = out0(node(OP_copy, INS(x), NULL, 0));
    g->values[w].view_of = x;
    ir_output_add(g, w);
    run_pass();
    return ir_node(g, s)->op;
}

Test(slice_view, a_write_while_read_keeps_the_copy) { cr_assert_eq(writes_x_around_reader(1), OP_slice); }

Test(slice_view, a_write_after_the_last_read_does_not) { cr_assert_eq(writes_x_around_reader(0), OP_slice_view); }

Test(slice_view, off_by_the_setting)
{
    int x, s = sliced(&x, 1, 1);
    ir_output_add(g, out0(s));
    Options o = {0};
    config_default(&o.train);
    o.train.slice_views = 0;
    Diag d;
    diag_init(&d, "t", NULL, 0, stderr);
    cr_assert_eq(pass_slice_view(g, &o, &d), 0);
    cr_assert_eq(ir_node(g, s)->op, OP_slice);
}

/* x lies in the bytes of a value a later node makes over it (ir_inplace_bind's layout:
 * the in-place op's output is the buffer, made after the slice): that node writes the
 * buffer while the slice is read, though it is the buffer's maker. */
Test(slice_view, an_in_place_maker_while_read_keeps_the_copy)
{
    int x, s = sliced(&x, 1, 1);
    int w = out0(node(OP_copy, INS(x), NULL, 0));
    ir_output_add(g, out0(node(OP_neg, INS(out0(s)), NULL, 0)));
    ir_output_add(g, w);
    g->values[x].view_of = w;
    run_pass();
    cr_assert_eq(ir_node(g, s)->op, OP_slice);
}
