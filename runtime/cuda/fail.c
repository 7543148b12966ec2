/* runtime/cuda/fail.c: the CUDA backend's error messages: `[rank r] file:line: call:
 * status: the op and its .fsm line`, for every CUDA, cuBLAS and NCCL call
 * (cuda_impl.h's check macros). A file of its own: backend.c and run.c both report
 * through it. */
#include <stdio.h>
#include <string.h>

#include "cuda_impl.h"

static const char *short_path(const char *file)
{
    const char *s = strstr(file, "runtime/");
    return s ? s : file;
}

const char *cuda_status(CUresult r)
{
    static char buf[32];  // the stub library names no error: its number then
    const char *name = NULL;
    if (cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
    snprintf(buf, sizeof buf, "CUDA error %d", (int)r);
    return buf;
}

const char *nccl_status(RtBackend *b, ncclResult_t r)
{
    static char buf[512];
    if (!nccl.loaded) return "NCCL not loaded";
    const char *last = nccl.get_last_error(b ? b->nccl : NULL);
    snprintf(buf, sizeof buf, "%s%s%s", nccl.get_error_string(r), last && *last ? " (" : "", last && *last ? last : "");
    if (last && *last) strncat(buf, ")", sizeof buf - strlen(buf) - 1);
    return buf;
}

int cuda_fail(RtBackend *b, const char *file, int line, const char *call, const char *status)
{
    char where[512];
    if (b->cur_op >= 0)
        cs_op_where(b->plan, b->cur_op, where, sizeof where);
    else
        snprintf(where, sizeof where, "%s", b->what ? b->what : "");
    snprintf(b->err, sizeof b->err, "[rank %d] %s:%d: %.*s: %s%s%s", b->rank, short_path(file), line,
             (int)strcspn(call, "("), call, status, *where ? ": " : "", where);
    return -1;
}
