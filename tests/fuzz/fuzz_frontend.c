/* tests/fuzz/fuzz_frontend.c: libFuzzer target over the compiler: scanner, parser,
 * lowering with shape inference, and, for a source that compiles, every pass (autodiff,
 * optimizer, memplan) with the IR verified after each. Any crash, failed internal
 * assertion, sanitizer report, leak or hang is a bug: every input must end in a valid
 * plan or in diagnostics.
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DFS_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_frontend
 *   build-fuzz/fuzz_frontend -max_total_time=600 corpus/ samples/ tests/golden/ */
#include <stdint.h>
#include <stdio.h>

#include "frontend.h"
#include "passes.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink) sink = fopen("/dev/null", "w");
    Diag d;
    diag_init(&d, "fuzz.fsm", (const char *)data, size, sink);
    FrontendOptions opt = {0};
    Options o = {.verify = 1, .print_out = sink};
    Graph *g = fe_compile((const char *)data, size, &opt, &o.train, &d);
    if (g) passes_run(g, &o, &d);
    ir_graph_free(g);
    return 0;
}
