/* tests/fuzz/fuzz_plan.c: libFuzzer over the plan reader. Any bytes at all must give a
 * plan or a message, never a crash, a leak or undefined behaviour (ASan and UBSan are on
 * in the FS_FUZZ build); a plan that is read must survive rt_inspect, which indexes it
 * without further checks. Checksums would stop most mutations at the frame checks, so
 * each input is read twice: as it is, and with every checksum recomputed, which takes
 * mutated contents on to the decoder and plan_check.
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DFS_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_plan
 *   build-fuzz/fuzz_plan -max_total_time=600 corpus/   (seed it with plans fsc wrote)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

static FILE *devnull;

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static uint32_t get32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* Rewrites every checksum the layout in plan.h lets it find, so mutated contents reach
 * the decoder and plan_check. */
static void fix_crcs(uint8_t *b, size_t n)
{
    if (n < 32) return;
    uint64_t n_sec = get32(b + 12);
    if (32 + 24 * n_sec > n) return;
    for (uint64_t i = 0; i < n_sec; i++) {
        uint8_t *e = b + 32 + 24 * i;
        uint64_t off = get64(e + 8), len = get64(e + 16);
        if (off <= n && len <= n - off) put32(e + 4, plan_crc32(0, b + off, (size_t)len));
    }
    put32(b + 24, 0);
    put32(b + 24, plan_crc32(0, b, (size_t)(32 + 24 * n_sec)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_one(const uint8_t *buf, size_t size)
{
    char err[256] = "";
    Plan *p = plan_read_mem(buf, size, err, sizeof err);
    if (p) {
        rt_inspect(p, devnull);
        plan_free(p);
    } else if (!err[0]) {
        abort();  // every refusal has a message
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!devnull) devnull = fopen("/dev/null", "w");
    uint8_t *buf = malloc(size ? size : 1);  // exactly size bytes: ASan sees any overread
    if (!buf) return 0;
    memcpy(buf, data, size);
    read_one(buf, size);
    fix_crcs(buf, size);
    if (memcmp(buf, data, size)) read_one(buf, size);
    free(buf);
    return 0;
}
