/* runtime/cuda/nccl.c: NCCL, loaded when a world of more than one rank needs it.
 *
 * A world of one rank has no collectives to run on NCCL (they are device copies), so the
 * backend must start without NCCL's library: it is some 200 MB, often not installed next
 * to the driver and the toolkit (PyTorch ships its own), and a missing libnccl.so.2 must
 * not cost a single-GPU run. libfs_cuda.so therefore links no NCCL: the first call of
 * cuda_nccl_load dlopen()s libnccl.so.2 ($FS_NCCL_LIB, else the loader's search path)
 * and resolves the handful of functions the backend calls into `nccl`; nccl.h gives only
 * the types. Until then every pointer is NULL and nothing calls through them.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_impl.h"

NcclApi nccl;

int cuda_nccl_load(char *err, size_t errlen)
{
    if (nccl.loaded) return 0;
    const char *path = getenv("FS_NCCL_LIB");
    path = path && *path ? path : "libnccl.so.2";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "NCCL is needed for a world of more than one rank: %s (set FS_NCCL_LIB to its path, "
                 "or add its directory to LD_LIBRARY_PATH)", dlerror());
        return -1;
    }
#define SYM(field, name)                                                                          \
    do {                                                                                          \
        *(void **)&nccl.field = dlsym(h, name);                                                   \
        if (!nccl.field) {                                                                        \
            snprintf(err, errlen, "%s has no %s: an NCCL older than 2.13 (ncclGetLastError)", path, name); \
            return -1;                                                                            \
        }                                                                                         \
    } while (0)
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(comm_init_rank, "ncclCommInitRank");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(get_error_string, "ncclGetErrorString");
    SYM(get_last_error, "ncclGetLastError");
    SYM(all_reduce, "ncclAllReduce");
    SYM(reduce_scatter, "ncclReduceScatter");
    SYM(all_gather, "ncclAllGather");
    SYM(red_op_create_pre_mul_sum, "ncclRedOpCreatePreMulSum");
    SYM(red_op_destroy, "ncclRedOpDestroy");
    SYM(send, "ncclSend");
    SYM(recv, "ncclRecv");
    SYM(comm_get_async_error, "ncclCommGetAsyncError");
    SYM(comm_abort, "ncclCommAbort");
#undef SYM
    nccl.loaded = 1;
    return 0;
}
