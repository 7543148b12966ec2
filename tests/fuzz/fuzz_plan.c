/* tests/fuzz/fuzz_plan.c: libFuzzer over the plan reader, the plan checks and one step of
 * the CPU backend. Any bytes at all must give a plan or a message, never a crash, a leak
 * or undefined behaviour (ASan and UBSan are on in the FS_FUZZ build); a plan that is
 * read must survive rt_inspect, which indexes it without further checks. Checksums would
 * stop most mutations at the frame checks, so each input is read twice: as it is, and
 * with every checksum recomputed, which takes mutated contents on to the decoder,
 * plan_check and rt_plan_check_ops. A plan of several programs (pipeline stages) also
 * meets plan_check_p2p, and each of its first programs, extracted, must pass plan_check.
 *
 * A plan that passes rt_plan_check_ops runs one step (rt_exec_new, the built-in data or
 * none, rt_exec_run, free) with nan_fill on, so no kernel may stop on it (a KCHECK abort
 * is a hole in the checks). One input in eight (by length, so a finding replays) also
 * runs under the guard, whose canaries must not reach what the checks proved; its
 * findings themselves are allowed (a plan whose float buffers overlap while live computes
 * wrong numbers, it does not crash), and it costs a pass over the arena per op.
 * Skipped, to keep an iteration short: plans for more than one rank (they need MPI),
 * with an arena over 64 MiB or more than 4096 ops. Everything runs on one thread.
 *   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DFS_FUZZ=ON
 *   cmake --build build-fuzz --target fuzz_plan
 *   tests/fuzz/seed.sh build/fsc corpus/      (plans fsc wrote, in every strategy)
 *   build-fuzz/fuzz_plan -max_total_time=900 -mutate_depth=2 -cross_over=0 corpus/
 * (The FS_FUZZ build stops at the first UBSan report: a report is a finding. Few
 * mutations an input and no cross-over keep most inputs readable plans; see the mutator
 * below.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

enum { MAX_OPS = 4096 };
#define MAX_ARENA ((int64_t)64 << 20)

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
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* A section's items: `hdr` bytes of counts, then items of `item` bytes (plan/format.h). */
static void items_of(const uint8_t *e, const uint8_t *sec, uint64_t len, uint64_t *hdr, uint64_t *item)
{
    int list = !memcmp(e, "IDS ", 4) || !memcmp(e, "OUTS", 4) || !memcmp(e, "INTS", 4);
    *hdr = list ? 4 : 8;
    *item = !memcmp(e, "INTS", 4) ? 8 : list || !memcmp(e, "STRS", 4) ? 4 : get32(sec + 4);
    if (*item < 4 || *item > len) *item = 4;
}

/* The damage the issue is about: a few bytes changed inside one section, and every
 * checksum made whole again. The section is chosen uniformly, so the small ones that
 * hold the ops get as many edits as the string table. An edit flips a bit, sets a byte,
 * nudges a 32-bit field, or copies a field from the same place in another record (the
 * dtype, shape, offset or an input id of another tensor or op): damage that keeps the
 * plan readable, which plan_check alone lets through. One time in eight, libFuzzer's own
 * mutators, which also resize. Edits are few (run with a small -mutate_depth): each
 * one more is less likely to leave the plan readable. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    uint64_t r = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    uint64_t n_sec = size >= 32 ? get32(data + 12) : 0;
    if (next(&r) % 8 == 0 || n_sec == 0 || 32 + 24 * n_sec > size) return LLVMFuzzerMutate(data, size, max_size);
    const uint8_t *e = data + 32 + 24 * (next(&r) % n_sec);
    uint64_t off = get64(e + 8), len = get64(e + 16), hdr, item;
    if (len < 16 || off > size || len > size - off) return LLVMFuzzerMutate(data, size, max_size);
    items_of(e, data + off, len, &hdr, &item);
    uint64_t n_items = (len - hdr) / item;
    for (int n = next(&r) % 4 ? 1 : 2; n > 0 && n_items; n--) {
        uint64_t col = (next(&r) % item) & ~(uint64_t)3;
        uint64_t at = off + hdr + next(&r) % n_items * item + col, from = off + hdr + next(&r) % n_items * item + col;
        if (at + 4 > off + len || from + 4 > off + len) continue;
        switch (next(&r) % 4) {
        case 0: data[at + next(&r) % 4] ^= (uint8_t)(1u << next(&r) % 8); break;
        case 1: data[at + next(&r) % 4] = (uint8_t)next(&r); break;
        case 2: put32(data + at, get32(data + at) + (uint32_t)(next(&r) % 9) - 4); break;
        default: memmove(data + at, data + from, 4);
        }
    }
    fix_crcs(data, size);
    return size;
}

/* One step of a checked plan; every refusal on the way must say why. */
static void run_step(const Plan *p, int guard)
{
    char err[1024] = "";
    if (rt_plan_check_ops(p, err, sizeof err)) {
        if (!err[0]) abort();
        return;
    }
    if (plan_meta_int(p, "world", 1) != 1 || plan_space_bytes(p, PLAN_PLACE_DEVICE) > MAX_ARENA ||
        plan_space_bytes(p, PLAN_PLACE_HOST) > MAX_ARENA || p->n_ops > MAX_OPS)  // each space is allocated
        return;
    Exec *e = rt_exec_new(p, &(ExecOptions){.seed = 1, .nan_fill = 1, .guard = guard}, err, sizeof err);
    if (!e) {
        if (!err[0]) abort();
        return;
    }
    /* Data the plan cannot take (a vocab below 256 for the byte corpus, inputs of neither
     * kind) is refused with a message; the step then runs on inputs left at zero. */
    RtData *d = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 1, err, sizeof err);
    if (d) rt_data_fill(d, 1);
    else if (!err[0]) abort();
    rt_exec_run(e, 1, RT_PHASES_ALL);
    rt_data_close(d);
    rt_exec_free(e);
}

/* The pipeline checks of a plan of several programs: a message or a pass, never a crash;
 * an extracted program is a whole plan. The first few only: each extract copies the
 * string table. */
static void check_programs(const Plan *p)
{
    char err[1024] = "";
    if (p->n_programs < 2) return;
    if (plan_check_p2p(p, err, sizeof err) && !err[0]) abort();
    for (int32_t k = 0; k < p->n_programs && k < 4; k++) {
        Plan *q = plan_extract_program(p, k, err, sizeof err);
        if (!q) {
            if (!err[0]) abort();
            continue;
        }
        if (plan_check(q, err, sizeof err)) abort();  // an extract of a checked plan is sound
        plan_free(q);
    }
}

static void read_one(const uint8_t *buf, size_t size)
{
    char err[256] = "";
    Plan *p = plan_read_mem(buf, size, err, sizeof err);
    if (p) {
        rt_inspect(p, devnull);
        check_programs(p);
        run_step(p, size % 8 == 7);
        plan_free(p);
    } else if (!err[0]) {
        abort();  // every refusal has a message
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!devnull) {
        devnull = fopen("/dev/null", "w");
        rt_set_threads(1);
    }
    uint8_t *buf = malloc(size ? size : 1);  // exactly size bytes: ASan sees any overread
    if (!buf) return 0;
    memcpy(buf, data, size);
    read_one(buf, size);
    fix_crcs(buf, size);
    if (memcmp(buf, data, size)) read_one(buf, size);
    free(buf);
    return 0;
}
