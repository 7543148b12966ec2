/* runtime/backend.c: finds the CUDA backend library and loads it (see backend.h).
 *
 * fsexec links no GPU library: the backend and everything it needs (the driver's
 * libcuda.so.1, NVRTC, cuBLAS, NCCL) come in through one dlopen() here, only when a run
 * asks for a device. On a machine without the driver that dlopen fails on libcuda.so.1,
 * and the dynamic loader's message says exactly that, so it is passed on as it is.
 * The library is never closed: CUDA's libraries keep threads and state that do not
 * survive being unloaded, and a process loads the backend at most once.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "runtime.h"

#define CUDA_LIB "libfs_cuda.so"

/* The library's path: $FS_CUDA_BACKEND, else next to this executable. */
static int backend_path(char *path, size_t n, char *err, size_t errlen)
{
    const char *env = getenv("FS_CUDA_BACKEND");
    if (env && *env) {
        if (strlen(env) >= n) return plan_fail(err, errlen, "$FS_CUDA_BACKEND is too long");
        strcpy(path, env);
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len < 0) return plan_fail(err, errlen, "cannot find this program's path: %s", strerror(errno));
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) slash[1] = 0;
    if ((size_t)snprintf(path, n, "%s%s", slash ? exe : "./", CUDA_LIB) >= n)
        return plan_fail(err, errlen, "this program's path is too long");
    return 0;
}

const RtBackendOps *rt_backend_load_cuda(char *err, size_t errlen)
{
    static const RtBackendOps *loaded;
    if (loaded) return loaded;
    char path[PATH_MAX + 32];
    if (backend_path(path, sizeof path, err, errlen)) return NULL;
    if (access(path, R_OK) != 0) {
        plan_fail(err, errlen, "no CUDA backend: %s: %s (this fsexec was built without CUDA, or $FS_CUDA_BACKEND is "
                "wrong)", path, strerror(errno));
        return NULL;
    }
    /* RTLD_LOCAL: the backend's own copies of the plan layer stay its own. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        plan_fail(err, errlen, "no CUDA GPU: %s", why ? why : "dlopen failed");
        return NULL;
    }
    RtBackendEntry entry;
    *(void **)&entry = dlsym(h, RT_BACKEND_SYMBOL);  // POSIX's way to get a function from dlsym
    const RtBackendOps *ops = entry ? entry() : NULL;
    if (!ops || ops->abi != RT_BACKEND_ABI) {
        plan_fail(err, errlen, "%s: %s (ABI %d, this fsexec needs %d); rebuild it with this fsexec", path,
                ops ? "a backend of another version" : "not an fsexec backend", ops ? ops->abi : -1, RT_BACKEND_ABI);
        return NULL;
    }
    loaded = ops;
    return ops;
}

int rt_backend_plan_has_cuda(const Plan *p, char *err, size_t errlen)
{
    if (!p->cuda_module || !*p->cuda_module)
        return plan_fail(err, errlen, "this plan has no CUDA program; recompile it with this fsc");
    return 0;
}
