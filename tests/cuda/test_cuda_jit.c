/* tests/cuda/test_cuda_jit.c: NVRTC and the on-disk module cache (runtime/cuda/jit.c),
 * on machines without a GPU: NVRTC compiles without a device. A module is compiled
 * once, then read from the cache; a damaged cache file is compiled again; a compile
 * error names its first error line and where the whole log is; devices newer than
 * NVRTC get PTX.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jit.h"
#include "tmpdir.h"

static const char SRC[] =
    "#include <cuda_fp16.h>\n"
    "#include <cuda_bf16.h>\n"
    "extern \"C\" __global__ void fs_cast_1(const float *x, __nv_bfloat16 *y) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    y[i] = __float2bfloat16_rn(x[i]);\n"
    "}\n";

TestSuite(cuda_jit, .init = make_tmpdir, .fini = remove_tmpdir);

Test(cuda_jit, targets)
{
    char t[24], err[256];
    cr_assert_eq(jit_target(9, 0, t, sizeof t, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(t, "sm_90");
    cr_assert_eq(jit_target(8, 0, t, sizeof t, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(t, "sm_80");
    /* A device newer than every architecture NVRTC knows: PTX for the newest below it. */
    cr_assert_eq(jit_target(99, 9, t, sizeof t, err, sizeof err), 0, "%s", err);
    cr_assert(!strncmp(t, "compute_", 8), "%s", t);
    cr_assert_eq(jit_target(1, 0, t, sizeof t, err, sizeof err), -1);
    cr_assert(strstr(err, "cannot compile for sm_10"), "%s", err);
}

Test(cuda_jit, compiles_once_then_reads_the_cache)
{
    JitImage a, b, c;
    char err[2048];
    cr_assert_eq(jit_compile(SRC, "sm_90", tmpdir, &a, err, sizeof err), 0, "%s", err);
    cr_assert(!a.from_cache && a.image && a.size > 0 && !a.ptx);
    cr_assert(!memcmp(a.image, "\177ELF", 4), "a cubin is an ELF file");
    cr_assert_str_eq(a.note, "", "%s", a.note);
    struct stat st;
    cr_assert_eq(stat(a.path, &st), 0, "the cache file %s", a.path);
    cr_assert(strstr(a.path, "-sm_90-nvrtc"), "%s", a.path);

    cr_assert_eq(jit_compile(SRC, "sm_90", tmpdir, &b, err, sizeof err), 0, "%s", err);
    cr_assert(b.from_cache && b.size == a.size && !memcmp(a.image, b.image, a.size));
    cr_assert_eq(b.seconds, 0);

    /* Another architecture, another source: other files. */
    cr_assert_eq(jit_compile(SRC, "sm_80", tmpdir, &c, err, sizeof err), 0, "%s", err);
    cr_assert(!c.from_cache && strcmp(c.path, a.path));
    jit_free(&c);
    char src2[sizeof SRC + 8];
    snprintf(src2, sizeof src2, "%s// v2\n", SRC);
    cr_assert_eq(jit_compile(src2, "sm_90", tmpdir, &c, err, sizeof err), 0, "%s", err);
    cr_assert(!c.from_cache && strcmp(c.path, a.path));
    jit_free(&c);

    /* A damaged file (cut short) is compiled again and rewritten whole. */
    cr_assert_eq(truncate(a.path, (off_t)(st.st_size - 10)), 0);
    cr_assert_eq(jit_compile(SRC, "sm_90", tmpdir, &c, err, sizeof err), 0, "%s", err);
    cr_assert(!c.from_cache && c.size == a.size);
    jit_free(&c);
    cr_assert_eq(jit_compile(SRC, "sm_90", tmpdir, &c, err, sizeof err), 0, "%s", err);
    cr_assert(c.from_cache);
    jit_forget(&c);
    cr_assert_neq(stat(c.path, &st), 0, "forgotten");
    jit_free(&a), jit_free(&b), jit_free(&c);
}

Test(cuda_jit, ptx_for_newer_devices)
{
    JitImage im;
    char err[2048];
    cr_assert_eq(jit_compile(SRC, "compute_90", tmpdir, &im, err, sizeof err), 0, "%s", err);
    cr_assert(im.ptx && strstr(im.image, ".visible .entry fs_cast_1"), "PTX text with the kernel");
    cr_assert(strlen(im.image) <= im.size, "NUL-terminated for cuModuleLoadData");
    jit_free(&im);
}

Test(cuda_jit, compile_error_names_the_line_and_keeps_the_log)
{
    JitImage im;
    char err[2048];
    const char *bad = "extern \"C\" __global__ void k(float *x) {\n  x[0] = undefined_name;\n}\n";
    cr_assert_eq(jit_compile(bad, "sm_90", tmpdir, &im, err, sizeof err), -1);
    cr_assert(strstr(err, "runtime/cuda/jit.c:"), "%s", err);
    cr_assert(strstr(err, "nvrtcCompileProgram: NVRTC_ERROR_COMPILATION (sm_90)"), "%s", err);
    cr_assert(strstr(err, "undefined_name"), "%s", err);
    const char *log = strstr(err, "whole log: ");
    cr_assert_not_null(log, "%s", err);
    char path[512];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(log + 11, ")"), log + 11);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    cr_assert_null(im.image);
}

Test(cuda_jit, cache_off)
{
    JitImage im;
    char err[2048];
    cr_assert_eq(jit_compile(SRC, "sm_90", "", &im, err, sizeof err), 0, "%s", err);
    cr_assert(!im.from_cache && im.path[0] == 0 && strstr(im.note, "cache off"), "%s", im.note);
    jit_free(&im);
    char sub[300];
    snprintf(sub, sizeof sub, "%s/a/b", tmpdir);  // made on demand
    cr_assert_eq(jit_compile(SRC, "sm_90", sub, &im, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(im.note, "");
    jit_free(&im);
    setenv("FS_CUDA_CACHE", "/x/y", 1);
    jit_cache_dir(sub, sizeof sub);
    cr_assert_str_eq(sub, "/x/y");
    unsetenv("FS_CUDA_CACHE");
    setenv("XDG_CACHE_HOME", "/c", 1);
    jit_cache_dir(sub, sizeof sub);
    cr_assert_str_eq(sub, "/c/fsexec");
}
