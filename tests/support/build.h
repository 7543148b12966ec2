/* tests/support/build.h: shorthand for building IR graphs by hand in tests:
 *   ir_node_add(g, OP_split, INS(x), ATTRS(AI("n", 3), AI("axis", -1)), ...)   */
#ifndef FS_TEST_BUILD_H
#define FS_TEST_BUILD_H

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

#endif
