/* tests/support/build.h: shorthand for building IR graphs by hand in tests:
 *   ir_node_add(g, OP_split, INS(x), ATTRS(AI("n", 3), AI("axis", -1)), ...)   */
#ifndef FS_TEST_BUILD_H
#define FS_TEST_BUILD_H

#include <criterion/criterion.h>

#include "ir.h"

/* A literal array and its length, as two arguments. */
#define DIMS(...) (int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define INS(...) (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define ATTRS(...) (Attr[]){__VA_ARGS__}, (int)(sizeof((Attr[]){__VA_ARGS__}) / sizeof(Attr))
/* Attributes: an int, a float, a list of ints. */
#define AI(k, v) ((Attr){.key = (k), .kind = ATTR_INT, .i = (v)})
#define AF(k, v) ((Attr){.key = (k), .kind = ATTR_FLOAT, .f = (v)})
#define AL(k, ...) ((Attr){.key = (k), .kind = ATTR_INTS, .ints = (int64_t[]){__VA_ARGS__}, \
                          .n_list = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))})

/* A value no node makes (an input, a param). */
static inline int build_value(Graph *g, Role role, const char *name, DType dt, const int64_t *shape, int rank, int block,
                              Loc loc)
{
    Value v = {.dtype = dt, .rank = rank, .role = role, .block = block, .name = name, .loc = loc, .producer = -1, .tied_to = -1};
    for (int i = 0; i < rank; i++) v.shape[i] = shape[i];
    return ir_value_add(g, &v);
}

/* A node whose shape rule must accept it; fails the test otherwise. */
static inline int build_node(Graph *g, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block,
                             Phase phase, Loc loc)
{
    char err[256];
    int id = ir_node_add(g, op, in, n_in, attrs, n_attr, block, phase, loc, err, sizeof err);
    cr_assert_geq(id, 0, "%s: %s", op_name(op), err);
    return id;
}

#endif
