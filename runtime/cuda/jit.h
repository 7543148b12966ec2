/* runtime/cuda/jit.h: the plan's CUDA source (meta "cuda_source") to a loadable image,
 * through NVRTC, with an on-disk cache. Needs NVRTC only (no driver, no device), so it
 * is tested on machines without a GPU.
 *
 * The image is a cubin for the device's own architecture (sm_XY) when this NVRTC knows
 * it; for a newer device, PTX for the newest architecture NVRTC knows below it, which the
 * driver compiles when it loads it. The cache holds one file per (source, target, NVRTC
 * version, options), named by their hash, in $FS_CUDA_CACHE, else $XDG_CACHE_HOME/fsexec,
 * else ~/.cache/fsexec. A file starts with a header holding the whole key, checked on
 * every read, so a damaged, truncated or colliding file is compiled again, never
 * loaded; files are written atomically (plan_write_atomic), so ranks that share a cache
 * directory may compile the same module at once.
 *
 * Messages are `runtime/cuda/jit.c:LINE: nvrtcCall: STATUS: detail`; the backend puts
 * `[rank r] ` before them.
 */
#ifndef FS_CUDA_JIT_H
#define FS_CUDA_JIT_H

#include <stddef.h>

typedef struct {
    void *image;            // cubin, or NUL-terminated PTX (plan_alloc'd)
    size_t size;
    int ptx;                // the image is PTX
    int from_cache;
    double seconds;         // compile time; 0 from the cache
    char target[24];        // "sm_90", "compute_90"
    char nvrtc[16];         // "13.0"
    char path[1024];        // its cache file; "" when the cache is off
    char note[256];         // why the cache was not used or written; "" if it was
} JitImage;

/* The NVRTC target for a device of compute capability major.minor: "sm_XY" when NVRTC
 * can make a cubin for it, else "compute_XY" of the newest architecture below. 0, or -1
 * with a message (NVRTC knows nothing at or below it). */
int jit_target(int major, int minor, char *target, size_t n, char *err, size_t errlen);
/* The cache directory (see above) into buf; "" when there is none (no $HOME). */
void jit_cache_dir(char *buf, size_t n);
/* The image of `source` for `target`, from the cache in cache_dir (NULL: jit_cache_dir;
 * "": no cache) or compiled (and then cached). On a compile error the message holds the
 * first error line of NVRTC's log and the path of a file with the whole log. 0, or -1. */
int jit_compile(const char *source, const char *target, const char *cache_dir, JitImage *im, char *err, size_t errlen);
/* Removes the image's cache file (the driver refused what it held). */
void jit_forget(const JitImage *im);
void jit_free(JitImage *im);

#endif
