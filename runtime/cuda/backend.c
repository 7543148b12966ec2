/* runtime/cuda/backend.c: the CUDA backend's table (backend.h): probing for a device,
 * making the backend from a plan and its host mirror, moving tensors between the two,
 * and freeing it all. Built into libfs_cuda.so, which exports fs_cuda_backend() alone.
 *
 * Before fsexec builds anything, check_fit compares the plan's device memory with the
 * device's free memory (fit.c), so an arena larger than the GPU is an error at start,
 * not after the host mirror and the data are made.
 *
 * Making it, in order (each step measured by the device's free memory, see
 * RtBackendInfo): the schedule (schedule.c, no device yet); the device (local rank
 * modulo the device count) and its primary context, which cuBLAS and NCCL use too; the
 * arena, one cuMemAlloc of the plan's device space, filled from the host mirror in one
 * copy; the plan's kernels (jit.c: NVRTC or the on-disk cache) and every LAUNCH's
 * function and parameter pointers; cuBLAS with its workspace (meta
 * "cuda_workspace_bytes", 32 MiB by default) on the compute stream; with world > 1 the
 * collectives' stream, their events and an NCCL communicator whose id rank 0 makes and
 * MPI broadcasts; a pipeline's stage (RtBackendOptions.stage) has one over its
 * data-parallel ranks, one over the stages at its index for the pipeline's collectives,
 * and one per link of its sends and receives, each with a stream (schedule.h says why).
 * A world of one touches neither MPI nor NCCL. With offload, the
 * plan's host space (the mirror's) is page-locked for the copies.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_impl.h"
#include "fit.h"

#define MIB (1024.0 * 1024.0)

/* cuInit's failures, said the way a user can act on them. */
static const char *init_hint(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_STUB_LIBRARY: return " (the toolkit's stub libcuda.so was loaded, not the driver's)";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return " (the driver library and the kernel module differ in version)";
    case CUDA_ERROR_NO_DEVICE: return " (the driver sees no GPU; check CUDA_VISIBLE_DEVICES)";
    default: return "";
    }
}

static int probe(char *err, size_t errlen)
{
    CUresult r = cuInit(0);
    int n = 0;
    if (r != CUDA_SUCCESS) {
        snprintf(err, errlen, "cuInit: %s%s", cuda_status(r), init_hint(r));
        return -1;
    }
    if ((r = cuDeviceGetCount(&n)) != CUDA_SUCCESS || n < 1) {
        snprintf(err, errlen, "cuDeviceGetCount: %s", r != CUDA_SUCCESS ? cuda_status(r) : "no CUDA device");
        return -1;
    }
    return 0;
}

static int64_t free_bytes(int64_t *total)
{
    size_t f = 0, t = 0;
    if (cuMemGetInfo(&f, &t) != CUDA_SUCCESS) return 0;  // a report only: never fatal
    if (total) *total = (int64_t)t;
    return (int64_t)f;
}

/* The device of local_rank, its free memory (in a context made for the question and
 * released) against cuda_fit_need (fit.c). A driver call that fails says nothing here:
 * create() reports it. */
static int check_fit(const Plan *p, int local_rank, char *err, size_t errlen)
{
    CUdevice dev;
    CUcontext ctx;
    int n = 0;
    char name[96] = "", device[128];
    size_t f = 0, t = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 1) return 0;
    int ordinal = (local_rank > 0 ? local_rank : 0) % n;
    if (cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) return 0;
    int asked = cuCtxSetCurrent(ctx) == CUDA_SUCCESS && cuMemGetInfo(&f, &t) == CUDA_SUCCESS;
    cuDeviceGetName(name, sizeof name, dev);
    cuCtxSetCurrent(NULL);
    cuDevicePrimaryCtxRelease(dev);
    if (!asked) return 0;
    snprintf(device, sizeof device, "cuda:%d %s", ordinal, name);
    CudaNeed need = cuda_fit_need(p);
    return cuda_fit_check(&need, (int64_t)f, (int64_t)t, device, err, errlen);
}

static int pick_device(RtBackend *b, const RtBackendOptions *o)
{
    int n = 0, major = 0, minor = 0;
    char name[96] = "";
    b->what = "initializing the driver";
    CU_CHECK(b, cuInit(0));
    CU_CHECK(b, cuDeviceGetCount(&n));
    if (n < 1) return cuda_fail(b, __FILE__, __LINE__, "cuDeviceGetCount", "no CUDA device");
    int local = o->local_rank >= 0 ? o->local_rank : o->rank;
    b->ordinal = local % n;
    b->what = "opening the device";
    CU_CHECK(b, cuDeviceGet(&b->dev, b->ordinal));
    CU_CHECK(b, cuDeviceGetName(name, sizeof name, b->dev));
    CU_CHECK(b, cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, b->dev));
    CU_CHECK(b, cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, b->dev));
    snprintf(b->info.device, sizeof b->info.device, "cuda:%d %s (sm_%d%d)", b->ordinal, name, major, minor);
    b->what = "creating the device's context";
    CU_CHECK(b, cuDevicePrimaryCtxRetain(&b->ctx, b->dev));
    CU_CHECK(b, cuCtxSetCurrent(b->ctx));
    return major * 10 + minor;
}

/* The arena: one allocation of exactly the plan's bytes, starting as the host mirror's
 * prefix (every persistent tensor; the rest is written by the step before it is read). */
static int make_arena(RtBackend *b, const void *host, int64_t host_bytes)
{
    snprintf(b->what_buf, sizeof b->what_buf, "allocating the %.1f MiB arena", (double)b->arena_bytes / MIB);
    b->what = b->what_buf;
    CU_CHECK(b, cuMemAlloc(&b->arena, b->arena_bytes > 0 ? (size_t)b->arena_bytes : 1));
    b->what = "copying the host arena to the device";
    if (host_bytes > b->arena_bytes) host_bytes = b->arena_bytes;
    if (host_bytes > 0) CU_CHECK(b, cuMemcpyHtoD(b->arena, host, (size_t)host_bytes));
    b->what = NULL;
    return 0;
}

/* The plan's module (from the cache, or NVRTC), and every LAUNCH bound to it. */
static int load_module(RtBackend *b, int cc)
{
    const Plan *p = b->plan;
    char target[24], why[1800];
    JitImage im;
    b->what = "compiling the plan's kernels";
    if (jit_target(cc / 10, cc % 10, target, sizeof target, why, sizeof why) ||
        jit_compile((p->cuda_module ? p->cuda_module : ""), target, NULL, &im, why, sizeof why)) {
        snprintf(b->err, sizeof b->err, "[rank %d] %s", b->rank, why);
        return -1;
    }
    CUresult r = cuModuleLoadData(&b->module, im.image);
    if (r != CUDA_SUCCESS && im.from_cache) {  // a cache file the driver refuses: compile afresh
        jit_forget(&im);
        jit_free(&im);
        if (jit_compile((p->cuda_module ? p->cuda_module : ""), target, NULL, &im, why, sizeof why)) {
            snprintf(b->err, sizeof b->err, "[rank %d] %s", b->rank, why);
            return -1;
        }
        r = cuModuleLoadData(&b->module, im.image);
    }
    int n_kernels = 0;
    for (int32_t i = 0; i < p->n_cuda; i++) n_kernels += p->cuda[i].kind == PLAN_CU_LAUNCH;
    snprintf(b->info.jit, sizeof b->info.jit, "%d launches, module %s for %s %s%s%s", n_kernels,
             im.from_cache ? "from the cache" : "compiled by NVRTC", target, im.nvrtc, *im.note ? "; " : "", im.note);
    if (!im.from_cache) {
        size_t at = strlen(b->info.jit);
        snprintf(b->info.jit + at, sizeof b->info.jit - at, " in %.1f s", im.seconds);
    }
    jit_free(&im);
    if (r != CUDA_SUCCESS) return cuda_fail(b, __FILE__, __LINE__, "cuModuleLoadData()", cuda_status(r));
    return 0;
}

/* A LAUNCH's function, checked against its args where the driver can tell (a parameter
 * it does not have is CUDA_ERROR_INVALID_VALUE): each parameter a pointer, no more and no
 * fewer than the args. Dynamic shared memory beyond 48 KiB enabled for it (as much as the
 * kernel's largest launch takes). */
static int bind_launch(RtBackend *b, int32_t i)
{
    const Plan *p = b->plan;
    const PlanCuda *c = &p->cuda[i];
    b->cur_op = c->op;
    CU_CHECK(b, cuModuleGetFunction(&b->fn[i], b->module, plan_str(p, c->kernel)));
    for (int32_t a = 0; a <= c->n_args; a++) {
        size_t off = 0, size = 0;
        CUresult r = cuFuncGetParamInfo(b->fn[i], (size_t)a, &off, &size);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) break;  // this driver cannot say
        if (a == c->n_args ? r == CUDA_SUCCESS : r != CUDA_SUCCESS || size != sizeof(CUdeviceptr)) {
            char why[160];
            snprintf(why, sizeof why, "kernel %s does not take exactly %d pointers (parameter %d)",
                     plan_str(p, c->kernel), c->n_args, a);
            return cuda_fail(b, __FILE__, __LINE__, "cuFuncGetParamInfo", why);
        }
    }
    /* The attribute belongs to the function, which every launch of the kernel shares: the
     * most any of them asks for, or a later, smaller one would refuse an earlier, larger. */
    int32_t smem = c->smem;
    for (int32_t j = 0; j < p->n_cuda; j++)
        if (p->cuda[j].kind == PLAN_CU_LAUNCH && p->cuda[j].kernel == c->kernel && p->cuda[j].smem > smem)
            smem = p->cuda[j].smem;
    if (smem > 48 * 1024)
        CU_CHECK(b, cuFuncSetAttribute(b->fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
    for (int32_t a = 0; a < c->n_args; a++) {
        int32_t at = b->s.arg_at[i] + a;
        b->argv[at] = b->arena + (CUdeviceptr)b->s.args[at];
        b->params[at] = &b->argv[at];
    }
    b->cur_op = -1;
    return 0;
}

static int make_blas(RtBackend *b)
{
    int64_t ws = plan_meta_int(b->plan, "cuda_workspace_bytes", 32 << 20);
    b->what = "setting up cuBLAS";
    BLAS_CHECK(b, cublasCreate(&b->blas));
    BLAS_CHECK(b, cublasSetStream(b->blas, (cudaStream_t)b->compute));
    if (ws > 0) {
        CU_CHECK(b, cuMemAlloc(&b->blas_ws, (size_t)ws));
        /* Its own workspace: cuBLAS never allocates inside a step or a graph capture. */
        BLAS_CHECK(b, cublasSetWorkspace(b->blas, (void *)(uintptr_t)b->blas_ws, (size_t)ws));
    }
    b->info.blas_workspace = ws > 0 ? ws : 0;
    return 0;
}

/* A communicator over the ranks of the world that share `color` (this one `rank` of
 * `size` among them): its id made by their first rank and broadcast among them. */
static int group_nccl(RtBackend *b, int color, int size, int rank, ncclComm_t *out)
{
    MPI_Comm c;
    if (MPI_Comm_split(MPI_COMM_WORLD, color, b->rank, &c) != MPI_SUCCESS)
        return cuda_fail(b, __FILE__, __LINE__, "MPI_Comm_split", "failed to split the world into NCCL's groups");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0 && nccl.get_unique_id(&id) != ncclSuccess) memset(&id, 0, sizeof id);
    int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c);
    MPI_Comm_free(&c);
    if (rc != MPI_SUCCESS) return cuda_fail(b, __FILE__, __LINE__, "MPI_Bcast", "failed to share a group's NCCL id");
    NCCL_CHECK(b, nccl.comm_init_rank(out, size, id, rank));
    return 0;
}

/* The scalar 1/n in NCCL's dtype t, for a premultiplied sum (f16 by the compiler's
 * _Float16; bf16 rounded to nearest even from f32). */
static void inverse_in(ncclDataType_t t, int n, void *out)
{
    float x = 1.0f / (float)n;
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint16_t h = t == ncclFloat16 ? 0 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    if (t == ncclFloat16) {
        _Float16 f = (_Float16)x;
        memcpy(&h, &f, sizeof h);
    }
    if (t == ncclFloat32) memcpy(out, &x, sizeof x);
    else memcpy(out, &h, sizeof h);
}

/* Hybrid sharding (CsSchedule.shard < dp): the shard groups of `shard` consecutive
 * ranks of a stage and the replica groups of the stage's ranks at one index within them,
 * as runtime/comm.c splits MPI's; each collective's op, an average over avg_over ranks a
 * sum premultiplied by 1 / avg_over (the average is over all the stage's ranks, not the
 * replica group's). */
static int make_hybrid_nccl(RtBackend *b)
{
    int shard = b->s.shard, hybrid = shard > 1 && shard < b->dp, d = b->dp_rank;
    if (hybrid && (group_nccl(b, b->stage * b->dp + d / shard, shard, d % shard, &b->group_nccl[0]) ||
                   group_nccl(b, b->stage * shard + d % shard, b->dp / shard, d / shard, &b->group_nccl[1])))
        return -1;
    for (int32_t ci = 0; ci < b->s.n_colls; ci++) {
        const CsColl *c = &b->s.colls[ci];
        b->redop[ci] = c->avg ? ncclAvg : ncclSum;
        if (!c->async || !c->avg || c->avg_over <= 0) continue;
        double scalar[2];
        inverse_in(cuda_nccl_type(c->dtype), c->avg_over, scalar);
        NCCL_CHECK(b, nccl.red_op_create_pre_mul_sum(&b->redop[ci], scalar, cuda_nccl_type(c->dtype), ncclScalarHostImmediate,
                                                     cuda_comm_of(b, c->group)));
    }
    return 0;
}

/* Link order over the whole world: by sender's stage, receiver's stage, tag. Every rank
 * makes its links' communicators in this order, so the two ranks of the first link any
 * rank still waits on are both at it (each makes its links one at a time). */
static int64_t link_key(const RtBackend *b, const CsLink *l)
{
    int from = l->send ? b->stage : l->stage, to = l->send ? l->stage : b->stage;
    return ((int64_t)from * b->stages + to) * ((int64_t)1 << 32) + l->tag;
}

/* The pipeline's links (schedule.h): per link a communicator of its two ranks, whose id
 * the sender makes and sends over MPI, and a stream. */
static int make_links(RtBackend *b)
{
    int32_t n = b->s.n_links;
    b->link_nccl = plan_alloc(sizeof *b->link_nccl * ((size_t)n + 1));
    b->link_stream = plan_alloc(sizeof *b->link_stream * ((size_t)n + 1));
    uint8_t *made = plan_alloc((size_t)n + 1);
    if (!b->link_nccl || !b->link_stream || !made) {
        plan_dealloc(made);
        return cuda_fail(b, __FILE__, __LINE__, "plan_alloc", "out of memory");
    }
    memset(b->link_nccl, 0, sizeof *b->link_nccl * ((size_t)n + 1));
    memset(b->link_stream, 0, sizeof *b->link_stream * ((size_t)n + 1));
    memset(made, 0, (size_t)n + 1);
    int rc = 0;
    for (int32_t done = 0; done < n && !rc; done++) {
        int32_t i = -1;
        for (int32_t j = 0; j < n; j++)
            if (!made[j] && (i < 0 || link_key(b, &b->s.links[j]) < link_key(b, &b->s.links[i]))) i = j;
        made[i] = 1;
        const CsLink *l = &b->s.links[i];
        int peer = l->stage * b->dp + b->dp_rank;
        ncclUniqueId id;
        memset(&id, 0, sizeof id);
        snprintf(b->what_buf, sizeof b->what_buf, "setting up NCCL's link %s stage %d (tag %lld)",
                 l->send ? "to" : "from", l->stage, (long long)l->tag);
        b->what = b->what_buf;
        if (l->send && nccl.get_unique_id(&id) != ncclSuccess) memset(&id, 0, sizeof id);
        int mrc = l->send ? MPI_Send(&id, (int)sizeof id, MPI_BYTE, peer, 0, MPI_COMM_WORLD)
                          : MPI_Recv(&id, (int)sizeof id, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (mrc != MPI_SUCCESS) rc = cuda_fail(b, __FILE__, __LINE__, "MPI_Send/MPI_Recv", "failed to share a link's NCCL id");
        ncclResult_t r = rc ? ncclSuccess : nccl.comm_init_rank(&b->link_nccl[i], 2, id, l->send ? 0 : 1);
        if (r != ncclSuccess) rc = cuda_fail(b, __FILE__, __LINE__, "nccl.comm_init_rank(link)", nccl_status(b, r));
        CUresult cr = rc ? CUDA_SUCCESS : cuStreamCreate(&b->link_stream[i], CU_STREAM_NON_BLOCKING);
        if (cr != CUDA_SUCCESS) rc = cuda_fail(b, __FILE__, __LINE__, "cuStreamCreate(link)", cuda_status(cr));
    }
    plan_dealloc(made);
    return rc;
}

/* The communicators: the stage's data-parallel ranks (with one stage the world; its id
 * made by rank 0 and broadcast), hybrid sharding's groups, the pipeline's collectives
 * and links. Every rank makes the same MPI splits in the same order. */
static int make_nccl(RtBackend *b)
{
    b->what = "setting up NCCL";
    char why[512];
    if (cuda_nccl_load(why, sizeof why)) return cuda_fail(b, __FILE__, __LINE__, "dlopen(libnccl.so.2)", why);
    CU_CHECK(b, cuStreamCreate(&b->comm, CU_STREAM_NON_BLOCKING));
    for (int32_t c = 0; c < b->s.n_colls; c++) {
        CU_CHECK(b, cuEventCreate(&b->ready[c], CU_EVENT_DISABLE_TIMING));
        CU_CHECK(b, cuEventCreate(&b->done[c], CU_EVENT_DISABLE_TIMING));
    }
    if (!(b->redop = plan_alloc(sizeof *b->redop * ((size_t)b->s.n_colls + 1))) ||
        !(b->started = plan_alloc((size_t)b->s.n_colls + 1)))
        return cuda_fail(b, __FILE__, __LINE__, "plan_alloc", "out of memory");
    memset((void *)b->started, 0, (size_t)b->s.n_colls + 1);
    if (b->stages == 1) {
        ncclUniqueId id;
        memset(&id, 0, sizeof id);
        if (b->rank == 0) NCCL_CHECK(b, nccl.get_unique_id(&id));
        int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return cuda_fail(b, __FILE__, __LINE__, "MPI_Bcast", "failed to share NCCL's unique id");
        NCCL_CHECK(b, nccl.comm_init_rank(&b->nccl, b->world, id, b->rank));
    } else if (b->dp > 1 && group_nccl(b, b->stage, b->dp, b->dp_rank, &b->nccl)) {
        return -1;
    }
    if (b->stages > 1 && b->s.n_pipe > 0) {  // every stage runs as many (plan_check_p2p)
        if (group_nccl(b, b->dp_rank, b->stages, b->stage, &b->pipe_nccl)) return -1;
        CU_CHECK(b, cuStreamCreate(&b->pipe, CU_STREAM_NON_BLOCKING));
    }
    return make_hybrid_nccl(b) || make_links(b);
}

/* Offload's host space, the mirror's: page-locked, so its copies run at the link's speed
 * and asynchronously (cuMemHostRegister; the memory stays the mirror's); the copy stream
 * and each copy's events. */
static int make_host(RtBackend *b, const RtBackendOptions *o)
{
    if (!b->s.n_copies && !b->s.n_host) return 0;
    if (!o->host_space || !o->host_op || o->host_space_bytes < plan_space_bytes(b->plan, PLAN_PLACE_HOST)) {
        snprintf(b->err, sizeof b->err, "[rank %d] the plan has a host space (offload), but fsexec gave no host space "
                 "of its %lld bytes, or no way to run its ops", b->rank, (long long)plan_space_bytes(b->plan, PLAN_PLACE_HOST));
        return -1;
    }
    b->host = o->host_space, b->host_bytes = o->host_space_bytes, b->host_op = o->host_op, b->host_ctx = o->host_ctx;
    snprintf(b->what_buf, sizeof b->what_buf, "page-locking the %.1f MiB host space", (double)b->host_bytes / MIB);
    b->what = b->what_buf;
    if (b->host_bytes > 0) CU_CHECK(b, cuMemHostRegister(b->host, (size_t)b->host_bytes, CU_MEMHOSTREGISTER_PORTABLE));
    b->host_locked = b->host_bytes > 0;
    b->what = "creating the copy stream";
    CU_CHECK(b, cuStreamCreate(&b->copy, CU_STREAM_NON_BLOCKING));
    for (int32_t c = b->s.n_colls; c < b->s.n_colls + b->s.n_copies; c++) {
        CU_CHECK(b, cuEventCreate(&b->ready[c], CU_EVENT_DISABLE_TIMING));
        CU_CHECK(b, cuEventCreate(&b->done[c], CU_EVENT_DISABLE_TIMING));
    }
    if (!b->s.n_host) return 0;
    b->what = "creating the host stream (--cuda-graph's host-function nodes)";  // used only by a capture
    if (!(b->host_calls = plan_alloc(sizeof *b->host_calls * ((size_t)b->s.n_ops + 1))))
        return cuda_fail(b, __FILE__, __LINE__, "plan_alloc", "out of memory");
    CU_CHECK(b, cuStreamCreate(&b->host_stream, CU_STREAM_NON_BLOCKING));
    CU_CHECK(b, cuEventCreate(&b->host_mark, CU_EVENT_DISABLE_TIMING));
    return 0;
}

/* --trace: two timing events per op and one for the step's start (run.c). */
static int make_trace_events(RtBackend *b)
{
    size_t n = 2 * (size_t)b->s.n_ops + 1;
    b->what = "creating the trace's events";
    if (!(b->tev = plan_alloc(sizeof *b->tev * n))) {
        snprintf(b->err, sizeof b->err, "[rank %d] out of memory", b->rank);
        return -1;
    }
    memset(b->tev, 0, sizeof *b->tev * n);
    for (size_t i = 0; i < n; i++) CU_CHECK(b, cuEventCreate(&b->tev[i], CU_EVENT_DEFAULT));
    return 0;
}

static int setup(RtBackend *b, const RtBackendOptions *o)
{
    const Plan *p = b->plan;
    int64_t total = 0;
    char why[512];
    if (cs_build_stage(p, b->dp_rank, b->dp, b->stage, b->stages, &b->s, why, sizeof why)) {
        snprintf(b->err, sizeof b->err, "[rank %d] %s", o->rank, why);
        return -1;
    }
    size_t n_args = 1;
    for (int32_t i = 0; i < p->n_cuda; i++) n_args += (size_t)p->cuda[i].n_args;
    b->fn = plan_alloc(sizeof *b->fn * ((size_t)p->n_cuda + 1));
    b->argv = plan_alloc(sizeof *b->argv * n_args);
    b->params = plan_alloc(sizeof *b->params * n_args);
    size_t events = (size_t)b->s.n_colls + (size_t)b->s.n_copies + 1;  // the collectives', then the copies'
    b->ready = plan_alloc(sizeof *b->ready * events);
    b->done = plan_alloc(sizeof *b->done * events);
    if (!b->fn || !b->argv || !b->params || !b->ready || !b->done) {
        snprintf(b->err, sizeof b->err, "[rank %d] out of memory", o->rank);
        return -1;
    }
    memset(b->ready, 0, sizeof *b->ready * events);
    memset(b->done, 0, sizeof *b->done * events);
    int cc = pick_device(b, o);
    if (cc < 0) return -1;
    int64_t before = free_bytes(&total);
    b->info.total = total;
    b->info.context = total - before;
    if (make_arena(b, o->host_arena, o->host_bytes)) return -1;
    int64_t after_arena = free_bytes(NULL);
    b->info.arena = before - after_arena;
    b->what = "creating the compute stream";
    CU_CHECK(b, cuStreamCreate(&b->compute, CU_STREAM_NON_BLOCKING));
    if (make_host(b, o)) return -1;
    if (load_module(b, cc)) return -1;
    for (int32_t i = 0; i < p->n_cuda; i++)
        if (p->cuda[i].kind == PLAN_CU_LAUNCH && bind_launch(b, i)) return -1;
    int64_t after_module = free_bytes(NULL);
    b->info.module = after_arena - after_module;
    if (make_blas(b) || cuda_lt_make(b)) return -1;
    int64_t after_blas = free_bytes(NULL);
    b->info.blas = after_module - after_blas;
    if (b->world > 1 && make_nccl(b)) return -1;
    if (o->trace && make_trace_events(b)) return -1;
    int64_t after_comm = free_bytes(NULL);
    b->info.comm = after_blas - after_comm;
    b->info.used = total - after_comm;
    b->what = NULL;
    return 0;
}

static void destroy(RtBackend *b)
{
    if (!b) return;
    if (b->ctx) {
        /* After a fault these fail too; freeing is best effort, the process is ending. */
        cuCtxSetCurrent(b->ctx);
        if (b->graph) cuGraphExecDestroy(b->graph);
        for (int32_t ci = 0; ci < b->s.n_colls && b->redop; ci++)
            if (b->s.colls[ci].async && b->s.colls[ci].avg && b->s.colls[ci].avg_over > 0) nccl.red_op_destroy(b->redop[ci], cuda_comm_of(b, b->s.colls[ci].group));
        for (int g = 0; g < 2; g++)
            if (b->group_nccl[g]) nccl.comm_destroy(b->group_nccl[g]);
        if (b->pipe_nccl) nccl.comm_destroy(b->pipe_nccl);
        for (int32_t i = 0; i < b->s.n_links && b->link_nccl; i++) {
            if (b->link_nccl[i]) nccl.comm_destroy(b->link_nccl[i]);
            if (b->link_stream[i]) cuStreamDestroy(b->link_stream[i]);
        }
        if (b->pipe) cuStreamDestroy(b->pipe);
        if (b->nccl) nccl.comm_destroy(b->nccl);
        if (b->blas) cublasDestroy(b->blas);
        cuda_lt_free(b);
        for (int32_t c = 0; c < b->s.n_colls + b->s.n_copies && b->ready; c++) {
            if (b->ready[c]) cuEventDestroy(b->ready[c]);
            if (b->done[c]) cuEventDestroy(b->done[c]);
        }
        for (int32_t i = 0; i < 2 * b->s.n_ops + 1 && b->tev; i++)
            if (b->tev[i]) cuEventDestroy(b->tev[i]);
        if (b->module) cuModuleUnload(b->module);
        if (b->host_locked) cuMemHostUnregister(b->host);
        if (b->compute) cuStreamDestroy(b->compute);
        if (b->comm) cuStreamDestroy(b->comm);
        if (b->copy) cuStreamDestroy(b->copy);
        if (b->host_stream) cuStreamDestroy(b->host_stream);
        if (b->host_mark) cuEventDestroy(b->host_mark);
        if (b->blas_ws) cuMemFree(b->blas_ws);
        if (b->arena) cuMemFree(b->arena);
        cuDevicePrimaryCtxRelease(b->dev);
    }
    cs_free(&b->s);
    plan_dealloc(b->host_calls);
    plan_dealloc(b->fn);
    plan_dealloc(b->argv);
    plan_dealloc(b->params);
    plan_dealloc(b->ready);
    plan_dealloc(b->redop);
    plan_dealloc(b->done);
    plan_dealloc(b->tev);
    plan_dealloc(b->link_nccl);
    plan_dealloc((void *)b->started);
    plan_dealloc(b->link_stream);
    plan_dealloc(b);
}

static RtBackend *create(const RtBackendOptions *o, char *err, size_t errlen)
{
    RtBackend *b = plan_alloc(sizeof *b);
    if (!b) {
        snprintf(err, errlen, "[rank %d] out of memory", o->rank);
        return NULL;
    }
    const char *sync = getenv("FS_CUDA_SYNC");
    int world = o->world > 0 ? o->world : 1, stages = o->stages > 1 ? o->stages : 1;
    if (world % stages || o->stage < 0 || o->stage >= stages) {
        snprintf(err, errlen, "[rank %d] stage %d of %d stages in a world of %d ranks (the world is stages x "
                 "data-parallel ranks)", o->rank, o->stage, stages, world);
        plan_dealloc(b);
        return NULL;
    }
    *b = (RtBackend){.plan = o->plan, .rank = o->rank, .world = world, .tf32 = o->tf32, .stages = stages,
                     .stage = stages > 1 ? o->stage : 0, .dp = world / stages, .dp_rank = o->rank % (world / stages),
                     .verbose = o->verbose, .sync_each = sync && *sync && strcmp(sync, "0"), .cur_op = -1,
                     .arena_bytes = plan_space_bytes(o->plan, PLAN_PLACE_DEVICE) > 0 ? plan_space_bytes(o->plan, PLAN_PLACE_DEVICE) : 0};
    b->info.arena_planned = b->arena_bytes;
    if (setup(b, o)) {
        snprintf(err, errlen, "%s", b->err);
        destroy(b);
        return NULL;
    }
    if (o->verbose) fprintf(stderr, "[rank %d] cuda: %s\n", b->rank, b->info.jit);
    return b;
}

static int run_ops(RtBackend *b, int32_t from, int32_t to) { return cuda_run_ops(b, from, to); }
static int run_step(RtBackend *b, int graph) { return cuda_run_step(b, graph); }
static int run_step_timed(RtBackend *b, RtSpan *spans) { return cuda_run_step_timed(b, spans); }
static int hung(RtBackend *b, char *msg, size_t n) { return cuda_hung(b, msg, n); }

static int upload(RtBackend *b, int32_t id, const void *src)
{
    const Plan *p = b->plan;
    size_t bytes = (size_t)plan_tensor_nbytes(&p->tensors[id]);
    if (!bytes) return 0;
    b->cur_op = -1;
    snprintf(b->what_buf, sizeof b->what_buf, "uploading tensor %d (%s)", id, plan_str(p, p->tensors[id].name));
    b->what = b->what_buf;
    /* From pageable memory the copy is staged before this returns: src may change then. */
    CU_CHECK(b, cuMemcpyHtoDAsync(b->arena + (CUdeviceptr)cs_offset(p, id, b->s.vrank), src, bytes, b->compute));
    return 0;
}

static int download(RtBackend *b, int32_t id, void *dst)
{
    const Plan *p = b->plan;
    size_t bytes = (size_t)plan_tensor_nbytes(&p->tensors[id]);
    if (!bytes) return 0;
    b->cur_op = -1;
    snprintf(b->what_buf, sizeof b->what_buf, "downloading tensor %d (%s); a fault of an earlier kernel shows here: "
             "FS_CUDA_SYNC=1 names its op", id, plan_str(p, p->tensors[id].name));
    b->what = b->what_buf;
    CU_CHECK(b, cuMemcpyDtoHAsync(dst, b->arena + (CUdeviceptr)cs_offset(p, id, b->s.vrank), bytes, b->compute));
    CU_CHECK(b, cuStreamSynchronize(b->compute));
    return 0;
}

static int sync_all(RtBackend *b)
{
    b->cur_op = -1;
    b->what = "waiting for the device (a kernel failed; FS_CUDA_SYNC=1 names the op)";
    CU_CHECK(b, cuCtxSynchronize());
    return 0;
}

static void info(const RtBackend *b, RtBackendInfo *out) { *out = b->info; }

static void copied(const RtBackend *b, int64_t *to_host, int64_t *to_device)
{
    *to_host = b->to_host, *to_device = b->to_device;
}
static const char *error(const RtBackend *b) { return b->err; }

static const RtBackendOps OPS = {
    .abi = RT_BACKEND_ABI, .name = "cuda", .probe = probe, .create = create, .destroy = destroy,
    .run_ops = run_ops, .run_step = run_step, .run_step_timed = run_step_timed, .upload = upload,
    .download = download, .sync = sync_all,
    .info = info, .error = error, .check_fit = check_fit, .copied = copied, .hung = hung,
};

__attribute__((visibility("default"))) const RtBackendOps *fs_cuda_backend(void);
const RtBackendOps *fs_cuda_backend(void) { return &OPS; }
