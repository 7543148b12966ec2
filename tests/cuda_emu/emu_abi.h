/* tests/cuda_emu/emu_abi.h: what the cuda-emu backend (backend.c, C) and a module compiled
 * for the emulator (emu.hpp, C++) pass each other across dlsym: one launch, and what was
 * measured of it. Plain C, included by both sides; a change here changes the hash of
 * every cached module (module.c hashes the emulator's headers), so no stale module is
 * ever called through another layout.
 */
#ifndef FS_CUDA_EMU_ABI_H
#define FS_CUDA_EMU_ABI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes [lo, hi) of one argument mapping: global memory, as far as the measures go. */
typedef struct {
    const void *lo, *hi;
} EmuRange;

/* The memory measures of one launch (emu_observe.hpp says how accesses are matched):
 * sums over the warp-level accesses of the launch. */
typedef struct {
    long long g_accesses;  // warp accesses to global memory
    long long g_sectors;   // 32-byte sectors they touched
    long long g_ideal;     // the fewest sectors that hold the bytes they accessed
    long long s_accesses;  // warp accesses to shared memory
    long long s_ways;      // sum of their ways (1: conflict-free)
    long long s_conflicted;// of them with more than one way
    int s_ways_max;        // the worst
} EmuMeasure;

typedef int (*EmuTramp)(void **args, int n);

typedef struct {
    EmuTramp tramp;          // the kernel's trampoline (EMU_KERNEL)
    void **args;             // its pointer arguments
    int nargs;
    const int *grid, *block; // 3 each
    int smem;                // dynamic shared memory, bytes (at most EMU_MAX_DYN_SHARED)
    int reverse;             // blocks and threads in reverse order
    const EmuRange *global;  // the argument mappings: what counts as global memory
    int n_global;
    EmuMeasure *measure;     // NULL: nothing observed; else the launch's measures, added in
    char *err;               // the message of a failed launch
    size_t errlen;
} EmuLaunchArgs;

/* emu_launch (emu.hpp): 0, or -1 with a message in err. */
typedef int (*EmuLaunch)(const EmuLaunchArgs *a);

/* sm_90's limit of dynamic shared memory per block: 227 KiB. */
enum { EMU_MAX_DYN_SHARED = 227 * 1024 };

#ifdef __cplusplus
}
#endif

#endif
