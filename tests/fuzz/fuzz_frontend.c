/* tests/fuzz/fuzz_frontend.c: libFuzzer target over the whole frontend (scanner, parser,
 * lowering with shape inference). Any crash, sanitizer report, leak or hang is a bug:
 * every input must end in a graph or in diagnostics.
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DFS_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_frontend
 *   build-fuzz/fuzz_frontend -max_total_time=600 corpus/ samples/ tests/golden/ */
#include <stdint.h>
#include <stdio.h>

#include "frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *sink;
    if (!sink) sink = fopen("/dev/null", "w");
    Diag d;
    diag_init(&d, "fuzz.fsm", (const char *)data, size, sink);
    TrainConfig train;
    FrontendOptions opt = {0};
    Graph *g = fe_compile((const char *)data, size, &opt, &train, &d);
    ir_graph_free(g);
    return 0;
}
