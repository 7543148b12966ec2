// tests/cuda_emu/emu.hpp: CUDA kernel text run on the CPU, for the cuda-emu test backend
// (tests/cuda_emu/backend.c). Test infrastructure only: fsexec never sees it.
//
// The backend compiles ONE C++ translation unit per plan: this header, then the plan's
// CUDA module verbatim (codegen/cuda_module.c's prelude and kernels; its
// `#include <cuda_fp16.h>` / `<cuda_bf16.h>` find the stand-ins in include/, which
// only include this file), then one trampoline per kernel (EMU_KERNEL below). So the
// real prelude (ld/st, fs_warp_sum, fs_block_sum...) is what runs, not a copy of it.
//
// How a launch runs: one fiber (ucontext) per CUDA thread, the blocks of the grid one
// after another. __syncthreads and every warp operation are barriers where a fiber
// yields to the scheduler, which runs each ready fiber up to its next barrier, in
// forward or reverse thread order (and forward or reverse block order), and releases a
// barrier once every live thread of its block (or warp) is at it. So a race between
// two barriers shows as a difference between the two orders (the backend runs both and
// compares). A deadlock, a __syncthreads some threads of the block exited before, a
// warp operation with exited lanes, a __trap and a block of more than 1024 threads end
// the launch with a message instead of hanging or aborting.
//
// Invariants: the CUDA names below mean what the CUDA headers say (16-bit conversions
// round to nearest even, shuffles exchange within a warp of 32, min/max of mixed types
// take the common type). __shared__ variables are function statics: one instance per
// kernel, shared by the fibers of the block running; blocks run one at a time, so that
// is exactly a block's shared memory (filled with NaN bytes as each block starts).
// Dynamic shared memory (`extern __shared__ T name[]`, which module.c rewrites into a
// reference to it) is one buffer of the launch's bytes, at most 227 KiB (sm_90), 16-byte
// aligned, ending at a guard page, NaN-filled per block like the static part; what is
// not modelled: the total of static and dynamic shared memory per kernel (the static
// part of every kernel of the module is one range here), nor sm_80's lower limit.
// Floating point is the host's IEEE single precision, compiled without
// contraction (-ffp-contract=off), so results can differ from a GPU's by the ulps of
// its FMA contraction and math library.
//
// Included parts: emu_observe.hpp (the memory measures: how accesses are seen and
// matched into warp accesses), emu_tc.hpp (mma, ldmatrix, cp.async for
// codegen/kernels/tc.cuh: their layouts, numerics and what is checked), emu_abi.h (the
// launch and its measures as the backend passes them). FS_CUDA_EMU is defined for the
// kernels' sake (tc.cuh's wrappers take the emulator's side on it).
#pragma once
#include <algorithm>
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <type_traits>
#include <ucontext.h>
#include <unistd.h>
#include <unordered_map>
#include <utility>
#include <vector>

#include "emu_abi.h"

// What codegen/kernels/tc.cuh (and any kernel) tests to take the emulator's side.
#define FS_CUDA_EMU 1
// An emulator function that makes a kernel's memory accesses itself: not instrumented
// (emu_observe.hpp notes them as the hardware makes them), and never inlined, so its
// return address is the call site in the kernel.
#define EMU_UNOBSERVED __attribute__((noinline, no_sanitize("thread")))
#define EMU_QUIET __attribute__((no_sanitize("thread")))  // not instrumented, inlined where it may be

// ---- the CUDA language surface ---------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct __half { uint16_t x; };
struct __nv_bfloat16 { uint16_t x; };

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
// Every __shared__ variable is a function-local static, which emu_shared.ld gathers into
// the section emu_shared, and the scheduler fills that with 0xff bytes (NaN in every
// float type) before each block: a GPU's shared memory starts undefined, so a read
// before any write shows instead of seeing the last block's.
#define __shared__ static
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict

namespace emu {
enum { READY, AT_BLOCK, AT_WARP, DONE, FAILED };
enum { MAX_THREADS = 1024, STACK = 256 * 1024 };

struct Access;
struct Copy {            // a cp.async in flight (emu_tc.hpp)
    void *dst;
    unsigned char bytes[16];
    int group;           // the thread's group it was issued in
};

struct Fiber {
    ucontext_t ctx;
    uint3 tid;
    int lin, state;
    std::vector<Access> acc;   // memory accesses since the warp's last barrier (emu_observe.hpp)
    std::vector<Copy> copies;  // cp.async copies not landed yet
    int groups;                // cp.async groups committed so far (the open one's number)
};

inline Fiber *cur;
inline Fiber *fibers;
inline char *stacks;
inline size_t stack_step;          // STACK plus a guard page below each stack
inline ucontext_t sched, blank;    // the scheduler; a context to copy for each fiber
inline int nthreads, reverse;
inline uint3 block_idx, block_dim, grid_dim;
inline unsigned char slots[MAX_THREADS][32];  // what each lane offers a warp exchange (mma: its fragments)
inline int (*ktramp)(void **, int);
inline void **kargs;
inline int knargs;
inline char *err;                  // the launch's message buffer
inline size_t errlen;
inline char *dyn_map, *dyn_end;    // EMU_MAX_DYN_SHARED bytes (a page multiple) up to dyn_end, a guard page after
inline char *dyn_base;             // the launch's dynamic shared memory: dyn_bytes from dyn_base, ending at dyn_end
inline size_t dyn_bytes;

// module.c rewrites `extern __shared__ T name[];` into `T (&name)[] = emu::dyn_shared;`:
// every dynamic shared array of a kernel is the launch's one buffer, as on a GPU.
struct DynShared {
    template <class T> operator T &() const { return *reinterpret_cast<T *>(dyn_base); }
};
inline constexpr DynShared dyn_shared{};

// Ends the running fiber's launch with a message (the scheduler stops at once).
[[noreturn]] inline void fail(const char *what)
{
    snprintf(err, errlen, "%s (block %u,%u,%u, thread %u,%u,%u)", what, block_idx.x, block_idx.y, block_idx.z,
             cur->tid.x, cur->tid.y, cur->tid.z);
    cur->state = FAILED;
    swapcontext(&cur->ctx, &sched);
    abort();  // a failed fiber is never resumed
}

inline void yield(int state)
{
    cur->state = state;
    swapcontext(&cur->ctx, &sched);
}
}  // namespace emu

#include "emu_observe.hpp"

#define threadIdx (emu::cur->tid)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define warpSize 32

inline void __syncthreads() { emu::yield(emu::AT_BLOCK); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::yield(emu::AT_WARP); }
inline void __threadfence() {}
inline void __threadfence_block() {}
[[noreturn]] inline void __trap() { emu::fail("__trap()"); }

namespace emu {
template <class To, class From> inline To bit_cast(From f)
{
    static_assert(sizeof(To) == sizeof(From), "a bit cast between types of different sizes");
    To t;
    memcpy(&t, &f, sizeof t);
    return t;
}
}  // namespace emu
inline float __int_as_float(int i) { return emu::bit_cast<float>(i); }
inline int __float_as_int(float f) { return emu::bit_cast<int>(f); }
inline float __uint_as_float(unsigned u) { return emu::bit_cast<float>(u); }
inline unsigned __float_as_uint(float f) { return emu::bit_cast<unsigned>(f); }
inline double __longlong_as_double(long long i) { return emu::bit_cast<double>(i); }
inline long long __double_as_longlong(double d) { return emu::bit_cast<long long>(d); }
inline int __float2int_rn(float f) { return (int)nearbyintf(f); }  // the default rounding: to nearest even
inline int __float2int_rz(float f) { return (int)f; }
inline int __popc(unsigned u) { return __builtin_popcount(u); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
template <class A, class B> inline typename std::common_type<A, B>::type min(A a, B b) { return b < a ? b : a; }
template <class A, class B> inline typename std::common_type<A, B>::type max(A a, B b) { return a < b ? b : a; }

// ---- warp exchanges: every lane of the warp offers a value, then every lane reads ------
namespace emu {
inline int lane() { return cur->lin % 32; }
template <class T> inline T exchange(T v, int src)
{
    static_assert(sizeof(T) <= 8, "a warp exchange of more than 8 bytes");
    int base = cur->lin - lane();
    memcpy(slots[cur->lin], &v, sizeof(T));
    yield(AT_WARP);
    T r;
    if (base + src >= nthreads) src = lane();  // no such lane: the caller's own value, as CUDA leaves it undefined
    memcpy(&r, slots[base + src], sizeof(T));
    yield(AT_WARP);  // nobody offers again before every lane has read
    return r;
}
}  // namespace emu

template <class T> inline T __shfl_xor_sync(unsigned, T v, int m, int = 32) { return emu::exchange(v, (emu::lane() ^ m) & 31); }
template <class T> inline T __shfl_sync(unsigned, T v, int src, int = 32) { return emu::exchange(v, src & 31); }
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int = 32)
{
    return emu::exchange(v, emu::lane() + (int)d < 32 ? emu::lane() + (int)d : emu::lane());
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned d, int = 32)
{
    return emu::exchange(v, emu::lane() >= (int)d ? emu::lane() - (int)d : emu::lane());
}
inline unsigned __ballot_sync(unsigned, int pred)
{
    int base = emu::cur->lin - emu::lane();
    unsigned p = pred != 0, r = 0;
    memcpy(emu::slots[emu::cur->lin], &p, 4);
    emu::yield(emu::AT_WARP);
    for (int l = 0; l < 32 && base + l < emu::nthreads; l++) {
        unsigned q;
        memcpy(&q, emu::slots[base + l], 4);
        r |= q << l;
    }
    emu::yield(emu::AT_WARP);
    return r;
}
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, !pred) == 0; }
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }

// ---- 16-bit conversions, to nearest even (as runtime/cpu/cpu_impl.h) -------------------
inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((uint32_t)h.x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40u)};  // NaN stays NaN
    return {(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __half2float(__half h)
{
    uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, a = h.x & 0x7fffu;
    if (a >= 0x7c00u) return __uint_as_float(sign | 0x7f800000u | (a & 0x3ffu) << 13);
    if (a < 0x0400u) return (sign ? -1.f : 1.f) * (float)a * 0x1p-24f;  // subnormal
    return __uint_as_float(sign | ((a << 13) + 0x38000000u));
}
inline __half __float2half_rn(float f)
{
    uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, h;
    if (a > 0x7f800000u) h = 0x7e00u | ((a >> 13) & 0x3ffu);
    else if (a >= 0x477ff000u) h = 0x7c00u;  // rounds to infinity
    else if (a < 0x38800000u) h = __float_as_uint(__uint_as_float(a) * 0x1p24f + 0x1p23f) - 0x4b000000u;  // subnormal: the FPU rounds
    else {
        uint32_t r = a - 0x38000000u;
        h = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
    }
    return {(uint16_t)(sign | h)};
}
inline __half __float2half(float f) { return __float2half_rn(f); }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }

#include "emu_tc.hpp"

// ---- the scheduler -----------------------------------------------------------------------
namespace emu {
inline void entry()
{
    if (ktramp(kargs, knargs)) {  // checked before the launch: cannot happen here
        snprintf(err, errlen, "kernel parameters do not match");
        cur->state = FAILED;
    } else {
        cur->state = DONE;
    }
    swapcontext(&cur->ctx, &sched);
}

// UBSan (the backend compiles kernels with it, fatal) exits with status 1 after its
// message; aborting instead lets the backend's handler of SIGABRT say which kernel of
// which op it was in. The callback is set in UBSan's own runtime (found by its soname)
// and in whatever runtime the process linked first (an ASan build's), since either
// may be the one that reports.
extern "C" void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));
inline void on_sanitizer_death() { abort(); }

inline int setup()
{
    if (stacks) return 0;
    if (void *h = dlopen("libubsan.so.1", RTLD_NOLOAD | RTLD_LAZY)) {
        void (*set)(void (*)(void));
        *(void **)&set = dlsym(h, "__sanitizer_set_death_callback");
        if (set) set(on_sanitizer_death);
        dlclose(h);
    }
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(on_sanitizer_death);
    long page = sysconf(_SC_PAGESIZE);
    stack_step = STACK + (size_t)page;
    stacks = (char *)mmap(nullptr, MAX_THREADS * stack_step, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) return stacks = nullptr, -1;
    for (int t = 0; t < MAX_THREADS; t++)  // a fiber that overflows its stack faults, not corrupts its neighbour
        if (mprotect(stacks + t * stack_step, (size_t)page, PROT_NONE)) return -1;
    size_t dyn = ((size_t)EMU_MAX_DYN_SHARED + (size_t)page - 1) / (size_t)page * (size_t)page;
    dyn_map = (char *)mmap(nullptr, dyn + (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
    if (dyn_map == MAP_FAILED) return dyn_map = nullptr, -1;
    dyn_end = dyn_map + dyn;
    if (mprotect(dyn_end, (size_t)page, PROT_NONE)) return -1;  // an access past the launch's bytes faults
    fibers = new Fiber[MAX_THREADS];
    return getcontext(&blank);
}

inline const char *state_name(int s)
{
    return s == READY ? "running" : s == AT_BLOCK ? "at __syncthreads" : s == AT_WARP ? "at a warp operation" : "exited";
}

// Runs the block block_idx to its end: 0, or -1 with err set.
inline int run_block()
{
    if (__start_emu_shared != __stop_emu_shared) memset(__start_emu_shared, 0xff, (size_t)(__stop_emu_shared - __start_emu_shared));
    if (dyn_bytes) memset(dyn_base, 0xff, dyn_bytes);
    for (int t = 0; t < nthreads; t++) {
        Fiber *f = &fibers[t];
        f->ctx = blank;  // a copy: no getcontext (a system call) per thread
        f->ctx.uc_stack.ss_sp = stacks + t * stack_step + (stack_step - STACK);
        f->ctx.uc_stack.ss_size = STACK;
        f->ctx.uc_link = nullptr;
        makecontext(&f->ctx, entry, 0);
        f->lin = t;
        f->acc.clear(), f->copies.clear(), f->groups = 0;
        f->tid = {(unsigned)t % block_dim.x, (unsigned)t / block_dim.x % block_dim.y, (unsigned)t / (block_dim.x * block_dim.y)};
        f->state = READY;
    }
    for (;;) {
        for (int k = 0; k < nthreads; k++) {
            Fiber *f = &fibers[reverse ? nthreads - 1 - k : k];
            if (f->state != READY) continue;
            cur = f;
            observing = measure != nullptr;
            swapcontext(&sched, &f->ctx);
            observing = false;
            if (f->state == FAILED) return -1;
        }
        int done = 0, at_block = 0, released = 0;
        for (int t = 0; t < nthreads; t++) done += fibers[t].state == DONE, at_block += fibers[t].state == AT_BLOCK;
        if (done == nthreads) {
            for (int w = 0; w * 32 < nthreads; w++) flush_warp(fibers, nthreads, w);
            return 0;
        }
        for (int w = 0; w * 32 < nthreads; w++) {
            int at = 0, n = 0, gone = 0;
            for (int t = w * 32; t < nthreads && t < w * 32 + 32; t++)
                n++, at += fibers[t].state == AT_WARP, gone += fibers[t].state == DONE;
            if (at > 0 && gone > 0) {
                snprintf(err, errlen, "a warp operation in warp %d of block %u,%u,%u after %d of its lanes exited", w,
                         block_idx.x, block_idx.y, block_idx.z, gone);
                return -1;
            }
            if (at == n) {
                for (int t = w * 32; t < w * 32 + n; t++) fibers[t].state = READY;
                flush_warp(fibers, nthreads, w);
                released = 1;
            }
        }
        if (!released && at_block > 0) {
            if (at_block + done == nthreads && done > 0) {
                snprintf(err, errlen, "__syncthreads in block %u,%u,%u after %d of its %d threads exited", block_idx.x,
                         block_idx.y, block_idx.z, done, nthreads);
                return -1;
            }
            if (at_block == nthreads) {
                for (int t = 0; t < nthreads; t++) fibers[t].state = READY;
                for (int w = 0; w * 32 < nthreads; w++) flush_warp(fibers, nthreads, w);
                released = 1;
            }
        }
        if (!released) break;
    }
    int at = snprintf(err, errlen, "deadlock in block %u,%u,%u:", block_idx.x, block_idx.y, block_idx.z);
    for (int t = 0; t < nthreads && at > 0 && (size_t)at < errlen; t++)
        if (t == 0 || fibers[t].state != fibers[t - 1].state)
            at += snprintf(err + at, errlen - (size_t)at, " from thread %d %s;", t, state_name(fibers[t].state));
    return -1;
}

// Calls kernel f with the launch's pointer arguments, once each is cast to its parameter's type.
template <class... P, size_t... I> inline void call(void (*f)(P...), void **a, std::index_sequence<I...>)
{
    f(static_cast<P>(a[I])...);
}
template <class... P> inline int call(void (*f)(P...), void **a, int n)
{
    static_assert((std::is_pointer<P>::value && ...), "a kernel parameter that is not a pointer");
    if (n != (int)sizeof...(P)) return -1;
    if (a) call(f, a, std::index_sequence_for<P...>{});
    return 0;
}
template <class... P> inline int arity(void (*)(P...)) { return (int)sizeof...(P); }
}  // namespace emu

// The trampoline the backend finds with dlsym: emu_k_NAME(args, n) runs one thread of
// kernel NAME (args NULL: only checks that it takes n pointers).
#define EMU_KERNEL(name) \
    extern "C" int emu_k_##name(void **a, int n) { return emu::call(name, a, n); }

// Runs grid x block threads of the kernel behind a->tramp, blocks and threads in forward
// or reverse order, with a->smem bytes of dynamic shared memory; observed (its measures
// added into a->measure) when that is set. 0, or -1 with a message in a->err.
extern "C" __attribute__((visibility("default"))) int emu_launch(const EmuLaunchArgs *a)
{
    using namespace emu;
    const int *grid = a->grid, *block = a->block;
    err = a->err, errlen = a->errlen;
    long long n = (long long)block[0] * block[1] * block[2];
    if (n < 1 || n > MAX_THREADS) {
        snprintf(err, errlen, "a block of %lld threads (CUDA allows 1 to %d)", n, MAX_THREADS);
        return -1;
    }
    if (a->smem < 0 || a->smem > EMU_MAX_DYN_SHARED) {
        snprintf(err, errlen, "%d bytes of dynamic shared memory (a block has at most %d on sm_90)", a->smem,
                 EMU_MAX_DYN_SHARED);
        return -1;
    }
    if (a->tramp(nullptr, a->nargs)) {
        snprintf(err, errlen, "the kernel does not take %d pointers", a->nargs);
        return -1;
    }
    if (setup()) {
        snprintf(err, errlen, "cannot map the fibers' stacks and the dynamic shared memory");
        return -1;
    }
    ktramp = a->tramp, kargs = a->args, knargs = a->nargs, reverse = a->reverse, nthreads = (int)n;
    dyn_bytes = (size_t)a->smem, dyn_base = dyn_end - (dyn_bytes + 15) / 16 * 16;  // 16-byte aligned, as CUDA's
    measure = a->measure, globals = a->global, n_globals = a->n_global;
    block_dim = {(unsigned)block[0], (unsigned)block[1], (unsigned)block[2]};
    grid_dim = {(unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2]};
    long long blocks = (long long)grid[0] * grid[1] * grid[2];
    int rc = 0;
    for (long long b = 0; b < blocks && !rc; b++) {
        long long k = a->reverse ? blocks - 1 - b : b;
        block_idx = {(unsigned)(k % grid[0]), (unsigned)(k / grid[0] % grid[1]), (unsigned)(k / ((long long)grid[0] * grid[1]))};
        rc = run_block();
    }
    measure = nullptr, globals = nullptr, n_globals = 0;
    return rc;
}
