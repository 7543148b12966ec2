/* frontend/frontend.h: from .fsm source text to a typed, shaped IR graph.
 *
 * fe_compile parses, applies the `train` section and then the command line's settings
 * over the defaults, and lowers (ast.h -> lower.c) the model into a Graph. Errors are
 * reported through the Diag, gcc style; a program with any error is never lowered to
 * completion and no Graph comes back.
 */
#ifndef FS_FRONTEND_H
#define FS_FRONTEND_H

#include "ir.h"

/* -D NAME=VALUE: overrides the value of a `dim`. */
typedef struct {
    const char *name;
    int64_t value;
} Define;

/* --key value on the fsc command line: overrides a `train` setting. */
typedef struct {
    const char *key, *value;
} Setting;

typedef struct {
    const Define *defines;
    int n_defines;
    const Setting *settings;
    int n_settings;
} FrontendOptions;

/* Returns the graph (free with ir_graph_free) and fills *train; NULL on any error. */
Graph *fe_compile(const char *src, size_t len, const FrontendOptions *opt, TrainConfig *train,
                  Diag *d);

#endif
