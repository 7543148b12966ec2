/* tests/support/sample.c: see sample.h. */
#include <criterion/criterion.h>

#include "sample.h"

const Define SAMPLE_GPT2[6] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
const Define SAMPLE_LLAMA[7] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 256}, {"B", 4}};

Plan *sample_compile(const char *file, const Define *defs, int n_defs, const Setting *set, int n_set, Graph **out)
{
    char path[512];
    snprintf(path, sizeof path, "%s/samples/%s", FS_SOURCE_DIR, file);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    static char src[1 << 16];
    size_t len = fread(src, 1, sizeof src - 1, f);
    fclose(f);
    src[len] = 0;
    Diag d;
    diag_init(&d, file, src, len, stderr);
    FrontendOptions fo = {defs, n_defs, set, n_set};
    Options o = {0};
    Graph *g = fe_compile(src, len, &fo, &o.train, &d);
    cr_assert_not_null(g, "%s does not compile", file);
    cr_assert_eq(passes_run(g, &o, &d), 0, "%s: a pass failed", file);
    char err[512];
    Plan *p = codegen_plan(g, &o.train, err, sizeof err);
    cr_assert_not_null(p, "%s: %s", file, err);
    if (out)
        *out = g;
    else
        ir_graph_free(g);
    return p;
}
