/* runtime/cuda/jit.c: NVRTC with an on-disk cache (see jit.h).
 *
 * Cache file: magic "FSJIT01\n", the image's size (u64, little-endian as everything the
 * plan layer writes), the key (KEY_LEN bytes, NUL-padded), then the image. The key is
 * the text "fnv64 crc32 length target nvrtc options" of the source; the file name is
 * built from the same hashes, so a hit is a file whose header holds exactly this key and
 * whose length is exactly header + size.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

#include "jit.h"
#include "plan.h"

#define MAGIC "FSJIT01\n"
enum { MAGIC_LEN = 8, KEY_LEN = 240, HEADER_LEN = MAGIC_LEN + 8 + KEY_LEN };

static const char *short_path(const char *file)
{
    const char *s = strstr(file, "runtime/");
    return s ? s : file;
}

__attribute__((format(printf, 4, 5))) static int jfail(char *err, size_t errlen, int line, const char *fmt, ...)
{
    int at = snprintf(err, errlen, "%s:%d: ", short_path(__FILE__), line);
    if (at < 0 || (size_t)at >= errlen) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + at, errlen - (size_t)at, fmt, ap);
    va_end(ap);
    return -1;
}

/* Every NVRTC call: its name (the text of the call up to its parenthesis) and status. */
#define NVRTC_CHECK(call)                                                                              \
    do {                                                                                               \
        nvrtcResult r_ = (call);                                                                       \
        if (r_ != NVRTC_SUCCESS) {                                                                     \
            jfail(err, errlen, __LINE__, "%.*s: %s", (int)strcspn(#call, "("), #call, nvrtcGetErrorString(r_)); \
            goto fail;                                                                                 \
        }                                                                                              \
    } while (0)

int jit_target(int major, int minor, char *target, size_t n, char *err, size_t errlen)
{
    int count = 0, archs[128];
    if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count < 1 || count > 128 ||
        nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
        return jfail(err, errlen, __LINE__, "nvrtcGetSupportedArchs: NVRTC lists no architectures");
    int want = major * 10 + minor, best = -1;
    for (int i = 0; i < count; i++) {
        if (archs[i] == want) {
            snprintf(target, n, "sm_%d", want);
            return 0;
        }
        if (archs[i] < want && archs[i] > best) best = archs[i];
    }
    if (best < 0)
        return jfail(err, errlen, __LINE__, "this NVRTC cannot compile for sm_%d or any older architecture (oldest: "
                     "sm_%d)", want, archs[0]);
    snprintf(target, n, "compute_%d", best);  // PTX: the driver compiles it for the device
    return 0;
}

void jit_cache_dir(char *buf, size_t n)
{
    const char *env = getenv("FS_CUDA_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && *env)
        snprintf(buf, n, "%s", env);
    else if (xdg && *xdg)
        snprintf(buf, n, "%s/fsexec", xdg);
    else if (home && *home)
        snprintf(buf, n, "%s/.cache/fsexec", home);
    else
        buf[0] = 0;
}

/* mkdir -p: 0, or -1 with errno. */
static int make_dirs(const char *dir)
{
    char path[1024];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return errno = ENAMETOOLONG, -1;
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(path, 0755) && errno != EEXIST) return -1;
        *s = '/';
    }
    return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

static const char *const OPTIONS[] = {"-std=c++17", "-lineinfo"};
enum { N_OPTIONS = sizeof OPTIONS / sizeof *OPTIONS };

static void put_u64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* The image from a cache file whose header holds exactly this key; 0, or -1 (a miss). */
static int cache_read(JitImage *im, const char *key)
{
    FILE *f = fopen(im->path, "rb");
    if (!f) return -1;
    uint8_t h[HEADER_LEN];
    int rc = -1;
    long end = -1;
    if (fread(h, 1, HEADER_LEN, f) == HEADER_LEN && !memcmp(h, MAGIC, MAGIC_LEN) &&
        !strncmp((const char *)h + MAGIC_LEN + 8, key, KEY_LEN) && !fseek(f, 0, SEEK_END) && (end = ftell(f)) >= 0) {
        uint64_t size = get_u64(h + MAGIC_LEN);
        if (size > 0 && size == (uint64_t)end - HEADER_LEN && !fseek(f, HEADER_LEN, SEEK_SET) &&
            (im->image = plan_alloc((size_t)size + 1))) {
            if (fread(im->image, 1, (size_t)size, f) == size) {
                ((char *)im->image)[size] = 0;  // PTX is text the driver reads up to its NUL
                im->size = (size_t)size;
                rc = 0;
            } else {
                plan_dealloc(im->image);
                im->image = NULL;
            }
        }
    }
    fclose(f);
    return rc;
}

static void cache_write(JitImage *im, const char *dir, const char *key)
{
    if (make_dirs(dir)) {
        snprintf(im->note, sizeof im->note, "cache off: cannot create %.160s: %s", dir, strerror(errno));
        im->path[0] = 0;
        return;
    }
    uint8_t h[HEADER_LEN];
    memset(h, 0, sizeof h);
    memcpy(h, MAGIC, MAGIC_LEN);
    put_u64(h + MAGIC_LEN, im->size);
    memcpy(h + MAGIC_LEN + 8, key, strlen(key));
    PlanChunk chunks[2] = {{h, sizeof h}, {im->image, im->size}};
    char why[256];
    if (plan_write_atomic(im->path, chunks, 2, why, sizeof why)) {
        snprintf(im->note, sizeof im->note, "cache not written: %.200s", why);
        im->path[0] = 0;
    }
}

/* The first line of NVRTC's log that says "error" (else its first line), and the whole
 * log and source saved next to the cache, for the message. */
static void report_log(const char *log, const char *source, const char *dir, const char *stem, char *err,
                       size_t errlen)
{
    const char *line = strstr(log, "error");
    while (line && line > log && line[-1] != '\n') line--;
    if (!line) line = log;
    int len = (int)strcspn(line, "\n");
    char path[1100] = "";
    if (*dir && !make_dirs(dir)) {
        snprintf(path, sizeof path, "%s/%s.log", dir, stem);
        char cu[1100];
        snprintf(cu, sizeof cu, "%s/%s.cu", dir, stem);
        PlanChunk lc = {log, strlen(log)}, sc = {source, strlen(source)};
        char why[256];
        if (plan_write_atomic(path, &lc, 1, why, sizeof why) || plan_write_atomic(cu, &sc, 1, why, sizeof why))
            path[0] = 0;
    }
    size_t at = strlen(err);
    snprintf(err + at, errlen - at, ": %.*s%s%s%s", len > 400 ? 400 : len, line, *path ? " (whole log: " : "", path,
             *path ? ")" : "");
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The CUDA headers the source includes (cuda_fp16.h, cuda_bf16.h): the first root whose
 * include directory holds them (an include directory alone, such as /usr/include for a
 * CUDA_HOME of /usr, may not). */
static void include_dir(char *opt, size_t n)
{
    const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (size_t i = 0; i < sizeof roots / sizeof *roots; i++) {
        char header[920];
        struct stat st;
        if (!roots[i] || !*roots[i]) continue;
        snprintf(header, sizeof header, "%s/include/cuda_fp16.h", roots[i]);
        if (!stat(header, &st) && S_ISREG(st.st_mode)) {
            snprintf(opt, n, "-I%s/include", roots[i]);
            return;
        }
    }
    snprintf(opt, n, "-I/usr/local/cuda/include");
}

static int compile(const char *source, JitImage *im, const char *dir, const char *stem, char *err, size_t errlen)
{
    nvrtcProgram prog = NULL;
    char *log = NULL;
    char arch[48], inc[1000];
    snprintf(arch, sizeof arch, "--gpu-architecture=%s", im->target);
    include_dir(inc, sizeof inc);
    const char *opts[N_OPTIONS + 2] = {arch, inc};
    for (int i = 0; i < N_OPTIONS; i++) opts[2 + i] = OPTIONS[i];
    double t0 = now();
    NVRTC_CHECK(nvrtcCreateProgram(&prog, source, "fsc_module.cu", 0, NULL, NULL));
    nvrtcResult rc = nvrtcCompileProgram(prog, N_OPTIONS + 2, opts);
    if (rc != NVRTC_SUCCESS) {
        size_t n = 0;
        jfail(err, errlen, __LINE__, "nvrtcCompileProgram: %s (%s)", nvrtcGetErrorString(rc), im->target);
        if (nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && (log = plan_alloc(n + 1)) &&
            nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS) {
            log[n] = 0;
            report_log(log, source, dir, stem, err, errlen);
        }
        goto fail;
    }
    size_t size = 0;
    if (im->ptx)
        NVRTC_CHECK(nvrtcGetPTXSize(prog, &size));
    else
        NVRTC_CHECK(nvrtcGetCUBINSize(prog, &size));
    if (!(im->image = plan_alloc(size + 1))) {
        jfail(err, errlen, __LINE__, "out of memory for a %zu-byte module", size);
        goto fail;
    }
    if (im->ptx)
        NVRTC_CHECK(nvrtcGetPTX(prog, im->image));
    else
        NVRTC_CHECK(nvrtcGetCUBIN(prog, im->image));
    ((char *)im->image)[size] = 0;
    im->size = size;
    im->seconds = now() - t0;
    nvrtcDestroyProgram(&prog);
    return 0;
fail:
    plan_dealloc(log);
    if (prog) nvrtcDestroyProgram(&prog);
    jit_free(im);
    return -1;
}

int jit_compile(const char *source, const char *target, const char *cache_dir, JitImage *im, char *err, size_t errlen)
{
    memset(im, 0, sizeof *im);
    snprintf(im->target, sizeof im->target, "%s", target);
    im->ptx = !strncmp(target, "compute_", 8);
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return jfail(err, errlen, __LINE__, "nvrtcVersion failed");
    snprintf(im->nvrtc, sizeof im->nvrtc, "%d.%d", major, minor);
    char dir[800];
    if (cache_dir)
        snprintf(dir, sizeof dir, "%s", cache_dir);
    else
        jit_cache_dir(dir, sizeof dir);
    size_t len = strlen(source);
    uint64_t h = plan_fnv1a(PLAN_FNV1A_INIT, source, len);
    uint32_t crc = plan_crc32(0, source, len);
    char key[KEY_LEN], stem[96];
    snprintf(key, sizeof key, "fnv64 %016" PRIx64 " crc32 %08" PRIx32 " length %zu target %s nvrtc %s options", h, crc,
             len, target, im->nvrtc);
    for (int i = 0; i < N_OPTIONS; i++) {
        size_t at = strlen(key);
        snprintf(key + at, sizeof key - at, " %s", OPTIONS[i]);
    }
    snprintf(stem, sizeof stem, "fsc-%016" PRIx64 "-%08" PRIx32 "-%s-nvrtc%s", h, crc, target, im->nvrtc);
    if (*dir) {
        snprintf(im->path, sizeof im->path, "%s/%s.%s", dir, stem, im->ptx ? "ptx" : "cubin");
        if (!cache_read(im, key)) {
            im->from_cache = 1;
            return 0;
        }
    } else {
        snprintf(im->note, sizeof im->note, "cache off: no $FS_CUDA_CACHE, $XDG_CACHE_HOME or $HOME");
    }
    if (compile(source, im, dir, stem, err, errlen)) return -1;
    if (*im->path) cache_write(im, dir, key);
    return 0;
}

void jit_forget(const JitImage *im)
{
    if (*im->path) unlink(im->path);
}

void jit_free(JitImage *im)
{
    plan_dealloc(im->image);
    im->image = NULL;
    im->size = 0;
}
