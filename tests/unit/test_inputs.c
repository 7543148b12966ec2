/* tests/unit/test_inputs.c: what a plan's data inputs are (runtime/plan_inputs.c) and how
 * .npy files feed any number of them (runtime/arrays.c): the inputs in declaration order,
 * a third input filled row for row from its file in the sequential order,
 * and an index read's ignore_index (the op's "ignore_index" attribute: the hook another
 * op's attribute plugs into) let through by the file check and by the plan's value
 * proof, and only that value. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "sample.h"
#include "tmpdir.h"

static const char MODEL[] =
    "model m {\n"
    "  dim B = 4, D = 3, K = 5;\n"
    "  input x: f32[B, D];\n"
    "  input y: i32[B];\n"
    "  input s: f32[B, D];\n"
    "  param w: [D, K] = normal(0.5);\n"
    "  loss = cross_entropy((x + s) @ w, y);\n"
    "}\n";

/* A .npy file (format 1.0) of `descr` and `shape` holding n bytes of body. */
static void write_npy(const char *name, const char *descr, const char *shape, const void *body, size_t n, char *path)
{
    char dict[128];
    snprintf(path, 512, "%s/%s", tmpdir, name);
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    size_t hl = (size_t)len + 1;
    hl += (64 - (10 + hl) % 64) % 64;
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)hl, (uint8_t)(hl >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, (size_t)len, f);
    for (size_t k = (size_t)len; k + 1 < hl; k++) fputc(' ', f);
    fputc('\n', f);
    fwrite(body, 1, n, f);
    fclose(f);
}

/* The files of 6 samples: x = k, s = 10 k (every element of sample k), y from labels. */
static void write_data(const int32_t *labels, char *spec, size_t n)
{
    float x[6][3], s[6][3];
    char px[512], py[512], ps[512];
    for (int k = 0; k < 6; k++)
        for (int d = 0; d < 3; d++) x[k][d] = (float)k, s[k][d] = 10.0f * (float)k;
    write_npy("x.npy", "<f4", "(6, 3)", x, sizeof x, px);
    write_npy("y.npy", "<i4", "(6,)", labels, 6 * sizeof *labels, py);
    write_npy("s.npy", "<f4", "(6, 3)", s, sizeof s, ps);
    snprintf(spec, n, "x=%s,y=%s,s=%s", px, py, ps);
}

/* Op k's attributes moved to the end of the pool with ignore_index = v added. */
static void add_ignore_index(Plan *p, int32_t k, int64_t v)
{
    int32_t first = p->n_attrs, n = p->ops[k].n_attr;
    for (int32_t a = 0; a < n; a++) {
        PlanAttr copy = p->attrs[p->ops[k].attr + a];
        cr_assert_geq(plan_attr_add(p, &copy), 0);
    }
    PlanAttr at = {.key = plan_intern(p, "ignore_index"), .kind = PLAN_ATTR_INT, .i = v};
    cr_assert_geq(plan_attr_add(p, &at), 0);
    p->ops[k].attr = first, p->ops[k].n_attr = n + 1;
}

static int32_t input_named(const Plan *p, const char *name)
{
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_INPUT && !strcmp(plan_str(p, p->tensors[i].name), name)) return i;
    return PLAN_NONE;
}

Test(inputs, three_in_declaration_order_each_filled_from_its_file, .init = make_tmpdir, .fini = remove_tmpdir)
{
    Plan *p = sample_compile_source("m.fsm", MODEL, NULL, 0, NULL, 0, NULL);
    int32_t ids[4], a, b;
    cr_assert_eq(rt_data_input_list(p, ids, 4), 3);
    cr_assert_str_eq(plan_str(p, p->tensors[ids[0]].name), "x");
    cr_assert_str_eq(plan_str(p, p->tensors[ids[1]].name), "y");
    cr_assert_str_eq(plan_str(p, p->tensors[ids[2]].name), "s");
    cr_assert_eq(rt_data_inputs(p, &a, &b), -1, "three inputs are not a pair");
    char spec[2048], err[512];
    int32_t labels[6] = {0, 1, 2, 3, 4, 0};
    write_data(labels, spec, sizeof spec);
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtData *d = rt_data_open(e, spec, RT_ORDER_SEQUENTIAL, 1, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    cr_assert_eq(rt_data_get_kind(d), RT_DATA_ARRAYS);
    cr_assert_eq(rt_data_samples(d), 6);
    cr_assert_eq(rt_data_rows(d), 4);
    rt_data_fill(d, 2);  // step 2: rows 4..7 of the sequence, samples (4 + row) mod 6
    const float *x = rt_exec_data(e, input_named(p, "x")), *s = rt_exec_data(e, input_named(p, "s"));
    const int32_t *y = rt_exec_data(e, input_named(p, "y"));
    for (int row = 0; row < 4; row++) {
        int k = (4 + row) % 6;
        cr_assert_eq(x[row * 3 + 2], (float)k);
        cr_assert_eq(s[row * 3], 10.0f * (float)k);
        cr_assert_eq(y[row], labels[k]);
    }
    rt_data_close(d);
    rt_exec_free(e);
    plan_free(p);
}

Test(inputs, ignore_index_passes_the_file_check_and_the_value_proof, .init = make_tmpdir, .fini = remove_tmpdir)
{
    Plan *p = sample_compile_source("m.fsm", MODEL, NULL, 0, NULL, 0, NULL);
    int32_t y = input_named(p, "y"), by;
    int64_t v;
    cr_assert_eq(rt_input_bound(p, y, &by), 5);
    cr_assert_eq(rt_input_sentinel(p, y, &v), 0, "no op allows a value outside the classes yet");
    char spec[2048], err[512];
    int32_t labels[6] = {0, -100, 2, 3, 4, 0};
    write_data(labels, spec, sizeof spec);
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    cr_assert_null(rt_data_open(e, spec, RT_ORDER_SEQUENTIAL, 1, err, sizeof err));
    cr_assert(strstr(err, "y.npy: element 1 is -100, outside the model's classes (0 to 4), which input 'y' indexes"),
              "%s", err);
    int reads = 0;  // after the Exec is made: its op check knows no ignore_index until an op's signature has one
    for (int32_t k = 0; k < p->n_ops; k++) {  // every read of y allows -100
        int32_t idx;
        int64_t n;
        if (rt_op_index(p, k, &idx, &n) == RT_INDEX_CLASSES) add_ignore_index(p, k, -100), reads++;
    }
    cr_assert_geq(reads, 1);
    cr_assert_eq(rt_input_sentinel(p, y, &v), 1);
    cr_assert_eq(v, -100);
    cr_assert_eq(rt_plan_check_values(p, NULL, err, sizeof err), 0, "%s", err);
    RtData *d = rt_data_open(e, spec, RT_ORDER_SEQUENTIAL, 1, err, sizeof err);
    cr_assert_not_null(d, "-100 is the ignore_index: %s", err);
    rt_data_close(d);
    labels[1] = -5;  // another negative value stays an error, and names the one allowed
    write_data(labels, spec, sizeof spec);
    cr_assert_null(rt_data_open(e, spec, RT_ORDER_SEQUENTIAL, 1, err, sizeof err));
    cr_assert(strstr(err, "element 1 is -5, outside the model's classes (0 to 4, or -100 (the ignore_index it skips))"),
              "%s", err);
    rt_exec_free(e);
    for (int32_t k = 0; k < p->n_ops; k++) {  // an ignore_index inside the classes: nothing beyond them to allow
        int32_t idx;
        int64_t n;
        if (rt_op_index(p, k, &idx, &n) != RT_INDEX_CLASSES) continue;
        for (int32_t a = 0; a < p->ops[k].n_attr; a++) {
            PlanAttr *at = &p->attrs[p->ops[k].attr + a];
            if (!strcmp(plan_str(p, at->key), "ignore_index")) at->i = 2;
        }
        break;
    }
    cr_assert_eq(rt_input_sentinel(p, y, &v), 0);
    plan_free(p);
}
