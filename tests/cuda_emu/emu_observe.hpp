// tests/cuda_emu/emu_observe.hpp: what the emulator measures of a kernel's memory accesses,
// the two numbers that decide a memory-bound kernel's speed on a GPU: global-memory
// coalescing (32-byte sectors touched per warp access against the fewest that could hold
// the bytes) and shared-memory bank conflicts (ways per warp access). Part of emu.hpp
// (included from it, after the fiber state), test infrastructure only.
//
// How accesses are seen: module.c compiles the plan's module with GCC's
// -fsanitize=thread, which calls __tsan_readN / __tsan_writeN before every load and store
// the compiler could not prove private to the thread, and defines those callbacks here
// (hidden, so an instrumented process's own TSan runtime never takes them; the module is
// linked without it). So raw pointer accesses are seen as well as the prelude's ld/st.
// Each access is kept when a fiber of an observed launch is running and its address is
// in shared memory (the emu_shared section or the dynamic buffer) or in one of the
// launch's argument mappings (global memory); everything else (the fibers' stacks:
// local memory; the emulator's own state) is not memory a kernel is judged on. The
// emulated instructions (emu_tc.hpp: ldmatrix, cp.async) are not instrumented and note
// their own accesses, as the hardware makes them (ldmatrix: a 16-byte row per address
// lane; cp.async: a 16-byte global read and a 16-byte shared write when issued).
//
// Matching lanes into warp accesses: lanes run as separate fibers between barriers, so
// each lane's accesses are kept in order until its warp is released from a barrier (a
// warp operation, __syncthreads, the block's end). Then the accesses of the warp's lanes
// with the same call site (the return address of the callback: one load or store
// instruction of the host code), the same kind (read or write, shared or global) and the
// same occurrence (the n-th time this lane ran that site since the last barrier) form
// one warp access: exactly the lanes that executed that instruction together on a GPU,
// divergent branches included.
//
// Per warp access, global: sectors = distinct 32-byte sectors its lanes' bytes lie in;
// ideal = ceil(distinct bytes / 32). Shared: the lanes are split into phases as the
// hardware splits a wide access (4 bytes or less per lane: one phase of 32 lanes; 8:
// two half-warps; 16: four quarter-warps); in a phase, a bank's ways are the distinct
// 4-byte words addressed in it (the same word is a broadcast), and the access's ways are
// the most of any bank in any phase. 1 is conflict-free.
//
// What it does not see or model: accesses the host compiler removed or merged (a value
// kept in a register between two reads, two reads of the same address folded to one,
// which a GPU compiler mostly does too); a struct copied member by member (emu.hpp's
// vector types copied as a whole are one 16-byte access, since module.c compiles with
// -fno-tree-sra; fs_ld128/fs_st128 of codegen/kernels/tc.cuh always are); memcpy and
// memset calls in kernel code; caches (a sector read twice counts twice, as the
// per-request numbers of a profiler do); atomics' serialization; constant memory
// (__constant__ data is not in any measured range).
#pragma once

namespace emu {
struct Access {
    uintptr_t pc, addr;
    unsigned size;
    int kind;  // KIND_* bits
};
enum { KIND_WRITE = 1, KIND_SHARED = 2 };

inline EmuMeasure *measure;      // the observed launch's measures; NULL: none observed
inline bool observing;           // a fiber of the observed launch is running
inline bool noting;              // note() is running: the library code it calls is instrumented too
inline const EmuRange *globals;
inline int n_globals;
extern "C" char __start_emu_shared[] __attribute__((weak)), __stop_emu_shared[] __attribute__((weak));

EMU_QUIET inline bool in_shared(uintptr_t a)
{
    return (a >= (uintptr_t)__start_emu_shared && a < (uintptr_t)__stop_emu_shared) ||
           (a >= (uintptr_t)dyn_base && a < (uintptr_t)dyn_base + dyn_bytes);
}

// Keeps one access of the running lane: pc its site, p its address.
EMU_UNOBSERVED inline void note(uintptr_t pc, const void *p, unsigned size, bool write)
{
    if (!observing || noting) return;
    uintptr_t a = (uintptr_t)p;
    int kind = write ? KIND_WRITE : 0;
    if (in_shared(a)) {
        kind |= KIND_SHARED;
    } else {
        int g = 0;
        while (g < n_globals && !(a >= (uintptr_t)globals[g].lo && a < (uintptr_t)globals[g].hi)) g++;
        if (g == n_globals) return;
    }
    noting = true;
    cur->acc.push_back(Access{pc, a, size, kind});
    noting = false;
}

// One warp access to global memory: its lanes' byte ranges [lo, hi).
EMU_UNOBSERVED inline void judge_global(std::vector<std::pair<uintptr_t, uintptr_t>> &r)
{
    std::vector<uintptr_t> sectors;
    for (auto &x : r)
        for (uintptr_t s = x.first >> 5; s <= (x.second - 1) >> 5; s++) sectors.push_back(s);
    std::sort(sectors.begin(), sectors.end());
    long long n = std::unique(sectors.begin(), sectors.end()) - sectors.begin(), bytes = 0;
    std::sort(r.begin(), r.end());
    uintptr_t end = 0;
    for (auto &x : r) {  // the union of the ranges
        uintptr_t lo = x.first > end ? x.first : end;
        if (x.second > lo) bytes += (long long)(x.second - lo);
        if (x.second > end) end = x.second;
    }
    measure->g_accesses++;
    measure->g_sectors += n;
    measure->g_ideal += (bytes + 31) / 32;
}

struct LaneAccess {
    int lane;
    uintptr_t addr;
    unsigned size;
};

// One warp access to shared memory, by its lanes.
EMU_UNOBSERVED inline void judge_shared(const std::vector<LaneAccess> &lanes)
{
    unsigned size = 4;
    for (auto &x : lanes) size = x.size > size ? x.size : size;
    int per_phase = size <= 4 ? 32 : size <= 8 ? 16 : 8, ways = 1;
    for (int phase = 0; phase * per_phase < 32; phase++) {
        std::vector<std::pair<unsigned, uintptr_t>> words;  // (bank, word)
        for (auto &x : lanes)
            if (x.lane / per_phase == phase)
                for (uintptr_t w = x.addr / 4; w <= (x.addr + x.size - 1) / 4; w++)
                    words.push_back({(unsigned)(w % 32), w});
        std::sort(words.begin(), words.end());
        words.erase(std::unique(words.begin(), words.end()), words.end());
        for (size_t i = 0, j; i < words.size(); i = j) {
            for (j = i; j < words.size() && words[j].first == words[i].first;) j++;
            if ((int)(j - i) > ways) ways = (int)(j - i);
        }
    }
    measure->s_accesses++;
    measure->s_ways += ways;
    measure->s_conflicted += ways > 1;
    if (ways > measure->s_ways_max) measure->s_ways_max = ways;
}

// The accesses warp w's lanes kept since its last barrier, matched into warp accesses and
// judged; the lanes' lists emptied.
EMU_UNOBSERVED inline void flush_warp(Fiber *fib, int nthreads, int w)
{
    if (!measure) return;
    struct Key {
        uintptr_t pc;
        int kind, n, lane, i;
    };
    std::vector<Key> keys;
    for (int t = w * 32; t < nthreads && t < w * 32 + 32; t++) {
        std::vector<Access> &acc = fib[t].acc;
        std::unordered_map<uintptr_t, int> seen;  // (site, kind): how often so far
        for (int i = 0; i < (int)acc.size(); i++) {
            int n = seen[acc[i].pc * 4 + (uintptr_t)acc[i].kind]++;
            keys.push_back(Key{acc[i].pc, acc[i].kind, n, t - w * 32, i});
        }
    }
    std::sort(keys.begin(), keys.end(), [](const Key &a, const Key &b) {
        return a.pc != b.pc ? a.pc < b.pc : a.kind != b.kind ? a.kind < b.kind
                                          : a.n != b.n       ? a.n < b.n
                                                             : a.lane < b.lane;
    });
    for (size_t i = 0, j; i < keys.size(); i = j) {
        std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
        std::vector<LaneAccess> lanes;
        for (j = i; j < keys.size() && keys[j].pc == keys[i].pc && keys[j].kind == keys[i].kind && keys[j].n == keys[i].n;
             j++) {
            const Access &x = fib[w * 32 + keys[j].lane].acc[keys[j].i];
            ranges.push_back({x.addr, x.addr + x.size});
            lanes.push_back(LaneAccess{keys[j].lane, x.addr, x.size});
        }
        if (keys[i].kind & KIND_SHARED) judge_shared(lanes);
        else judge_global(ranges);
    }
    for (int t = w * 32; t < nthreads && t < w * 32 + 32; t++) fib[t].acc.clear();
}

// Note of an access the emulator makes for an instruction, at the call site of the
// emulated instruction (the caller of its noinline function).
#define EMU_NOTE(p, size, write) emu::note((uintptr_t)__builtin_return_address(0), (p), (size), (write))
}  // namespace emu

// The callbacks of GCC's -fsanitize=thread instrumentation (module.c). Hidden: they bind
// within the module, never to a TSan runtime the process may have loaded.
#define EMU_TSAN(n)                                                                                                   \
    extern "C" __attribute__((visibility("hidden"))) EMU_UNOBSERVED void __tsan_read##n(void *p)                     \
    {                                                                                                                 \
        emu::note((uintptr_t)__builtin_return_address(0), p, n, false);                                               \
    }                                                                                                                 \
    extern "C" __attribute__((visibility("hidden"))) EMU_UNOBSERVED void __tsan_write##n(void *p)                    \
    {                                                                                                                 \
        emu::note((uintptr_t)__builtin_return_address(0), p, n, true);                                                \
    }                                                                                                                 \
    extern "C" __attribute__((visibility("hidden"))) EMU_UNOBSERVED void __tsan_unaligned_read##n(void *p)           \
    {                                                                                                                 \
        emu::note((uintptr_t)__builtin_return_address(0), p, n, false);                                               \
    }                                                                                                                 \
    extern "C" __attribute__((visibility("hidden"))) EMU_UNOBSERVED void __tsan_unaligned_write##n(void *p)          \
    {                                                                                                                 \
        emu::note((uintptr_t)__builtin_return_address(0), p, n, true);                                                \
    }
EMU_TSAN(1)
EMU_TSAN(2)
EMU_TSAN(4)
EMU_TSAN(8)
EMU_TSAN(16)
extern "C" __attribute__((visibility("hidden"))) EMU_UNOBSERVED void __tsan_read_range(void *p, unsigned long n)
{
    emu::note((uintptr_t)__builtin_return_address(0), p, (unsigned)n, false);
}
extern "C" __attribute__((visibility("hidden"))) EMU_UNOBSERVED void __tsan_write_range(void *p, unsigned long n)
{
    emu::note((uintptr_t)__builtin_return_address(0), p, (unsigned)n, true);
}
extern "C" __attribute__((visibility("hidden"))) void __tsan_init() {}
extern "C" __attribute__((visibility("hidden"))) void __tsan_func_entry(void *) {}
extern "C" __attribute__((visibility("hidden"))) void __tsan_func_exit() {}
