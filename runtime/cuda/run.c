/* runtime/cuda/run.c: the CUDA backend's step: each op's instructions in plan order on
 * the compute stream (cuLaunchKernel for LAUNCH, one strided-batched cuBLAS call for a
 * GEMM, one cublasLtMatmul for a GEMM with an epilogue: lt.c), collectives on NCCL's
 * stream, and the capture and replay of a whole step as a CUDA graph.
 *
 * Ordering between the two streams is by events only, decided in schedule.c: a
 * collective's stream waits for the compute stream to reach it (every op before it is
 * then done), and an op that touches a collective's bytes waits for that collective to
 * finish. At the end of every run the compute stream waits for each collective the run
 * started, so a run's work is one chain on the compute stream: a download after it, or
 * a graph capture of it, sees all of it. A collective over one rank is not in flight: it
 * is a device copy on the compute stream (or nothing, in place), as
 * runtime/cpu/comm_local.c does on the host. A pipeline stage's sends and receives are
 * NCCL's point-to-point calls, each on its link's stream, ordered by events the same way
 * (schedule.h: one link per pairing queue, so NCCL runs what plan_check_p2p proved). Offload's copies between the arena and the
 * host space go on a copy stream, ordered by events the same way (the copies of one step
 * run in plan order); an op of the host space waits on the host for the copies the
 * schedule names, not for the compute stream, then runs on the host
 * (RtBackendOptions.host_op) while the device works on what is queued.
 *
 * A captured step (--cuda-graph) holds the host's ops too, as host-function nodes
 * (cuLaunchHostFunc) on a host stream forked from the step's start: each after the
 * copies its waits name and the host op before it, as the host runs them above, and
 * never after device compute; each copy then also waits for the host's work queued
 * before it (the host op above returned before the copy was queued), and the compute
 * stream joins the host stream at the end. A host function calls no CUDA function; one
 * whose op fails marks it, and the replay says which after it has run.
 *
 * A traced step (fsexec --trace, cuda_run_step_timed) records a timing event before and
 * after each op's work on the stream that work is on, and reads them all once the step
 * is done: the op's span, from the step's first event.
 *
 * Nothing here allocates: a step is launches, library calls and event records on what
 * backend.c made.
 */
#include <stdio.h>

#include "cuda_impl.h"

static cudaDataType blas_type(PlanDType t)
{
    switch (t) {
    case PLAN_DT_F16: return CUDA_R_16F;
    case PLAN_DT_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;  // plan_check refuses i32 GEMMs
    }
}

ncclDataType_t cuda_nccl_type(PlanDType t)
{
    switch (t) {
    case PLAN_DT_F16: return ncclFloat16;
    case PLAN_DT_BF16: return ncclBfloat16;
    case PLAN_DT_I32: return ncclInt32;
    default: return ncclFloat32;
    }
}

/* A traced step: op cur_op's start (end 0) or end (1) on the stream its work is on. */
static int mark(RtBackend *b, int end, CUstream s)
{
    if (b->timing) CU_CHECK(b, cuEventRecord(b->tev[2 * b->cur_op + end], s));
    return 0;
}

static int launch(RtBackend *b, int32_t i)
{
    const PlanCuda *c = &b->plan->cuda[i];
    CU_CHECK(b, cuLaunchKernel(b->fn[i], (unsigned)c->grid[0], (unsigned)c->grid[1], (unsigned)c->grid[2],
                               (unsigned)c->block[0], (unsigned)c->block[1], (unsigned)c->block[2], (unsigned)c->smem,
                               b->compute, b->params + b->s.arg_at[i], NULL));
    return 0;
}

/* C = op(A) @ op(B), accumulated in f32 (beta 0: C is written, never read). TF32 only
 * for all-f32 GEMMs when asked; 16-bit operands always accumulate in plain f32. */
static int gemm(RtBackend *b, int32_t i)
{
    const CsGemm *g = &b->s.gemms[i];
    if (g->epilogue != CS_EPI_DEFAULT || g->beta) return cuda_lt_gemm(b, i);
    static const float one = 1.0f, zero = 0.0f;
    int all_f32 = g->a_dt == PLAN_DT_F32 && g->b_dt == PLAN_DT_F32 && g->c_dt == PLAN_DT_F32;
    cublasComputeType_t ct = b->tf32 && all_f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    BLAS_CHECK(b, cublasGemmStridedBatchedEx(b->blas, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g->m, g->n, g->k, &one,
                                             (const void *)(uintptr_t)(b->arena + (CUdeviceptr)g->a),
                                             blas_type(g->a_dt), g->lda, g->stride_a,
                                             (const void *)(uintptr_t)(b->arena + (CUdeviceptr)g->b),
                                             blas_type(g->b_dt), g->ldb, g->stride_b, &zero,
                                             (void *)(uintptr_t)(b->arena + (CUdeviceptr)g->c), blas_type(g->c_dt),
                                             g->ldc, g->stride_c, g->batch, ct, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* The stream a collective runs on: its link's (a send or receive), the pipeline's, or
 * the data-parallel collectives'. */
static CUstream stream_of(const RtBackend *b, const CsColl *c)
{
    return c->link >= 0 ? b->link_stream[c->link] : c->group == OP_GROUP_PIPE ? b->pipe : b->comm;
}

/* One collective: a copy alone; else NCCL on its stream once compute has reached it. A
 * send or receive is NCCL's call on its link, whose sender is rank 0 (schedule.h). */
static int collective(RtBackend *b, int32_t ci)
{
    const CsColl *c = &b->s.colls[ci];
    CUdeviceptr in = b->arena + (CUdeviceptr)c->in, out = b->arena + (CUdeviceptr)c->out,
                nout = b->arena + (CUdeviceptr)c->nccl_out;
    if (!c->async) {
        if (mark(b, 0, b->compute)) return -1;
        if (in != out) CU_CHECK(b, cuMemcpyDtoDAsync(out, in, (size_t)c->in_bytes, b->compute));
        return mark(b, 1, b->compute);
    }
    CUstream st = stream_of(b, c);
    b->started[ci] = 1;
    CU_CHECK(b, cuEventRecord(b->ready[ci], b->compute));
    CU_CHECK(b, cuStreamWaitEvent(st, b->ready[ci], 0));
    if (mark(b, 0, st)) return -1;
    const void *src = (const void *)(uintptr_t)in;
    void *dst = (void *)(uintptr_t)nout;
    size_t n = (size_t)c->count;
    ncclDataType_t t = cuda_nccl_type(c->dtype);
    ncclRedOp_t op = b->redop[ci];
    ncclComm_t comm = c->link >= 0 ? b->link_nccl[c->link] : cuda_comm_of(b, c->group);
    cudaStream_t s = (cudaStream_t)st;  // the driver's and the runtime's streams are one type
    switch (c->kind) {
    case CS_ALL_REDUCE: NCCL_CHECK(b, nccl.all_reduce(src, dst, n, t, op, comm, s)); break;
    case CS_REDUCE_SCATTER: NCCL_CHECK(b, nccl.reduce_scatter(src, dst, n, t, op, comm, s)); break;
    case CS_ALL_GATHER: NCCL_CHECK(b, nccl.all_gather(src, dst, n, t, comm, s)); break;
    case CS_SEND: NCCL_CHECK(b, nccl.send(src, n, t, 1, comm, s)); break;
    case CS_RECV: NCCL_CHECK(b, nccl.recv(dst, n, t, 0, comm, s)); break;
    case CS_COLL_COUNT: break;
    }
    if (c->move) CU_CHECK(b, cuMemcpyDtoDAsync(out, nout, (size_t)c->out_bytes, st));
    if (mark(b, 1, st)) return -1;
    CU_CHECK(b, cuEventRecord(b->done[ci], st));
    return 0;
}

/* Offload's copy k between the arena and the page-locked host space, on the copy stream
 * once compute has reached it (everything before it is then made); its done event is
 * what later ops wait for. */
static int copy(RtBackend *b, int32_t k)
{
    const CsCopy *c = &b->s.copies[k];
    int32_t ev = b->s.n_colls + k;
    CUdeviceptr dev = b->arena + (CUdeviceptr)c->dev;
    CU_CHECK(b, cuEventRecord(b->ready[ev], b->compute));
    CU_CHECK(b, cuStreamWaitEvent(b->copy, b->ready[ev], 0));
    if (b->host_queued) {  // captured: what the host has queued goes first, as when it runs them itself
        CU_CHECK(b, cuStreamWaitEvent(b->copy, b->host_mark, 0));
        b->host_queued = 0;
    }
    if (mark(b, 0, b->copy)) return -1;
    if (c->to_device)
        CU_CHECK(b, cuMemcpyHtoDAsync(dev, b->host + c->host, (size_t)c->bytes, b->copy));
    else
        CU_CHECK(b, cuMemcpyDtoHAsync(b->host + c->host, dev, (size_t)c->bytes, b->copy));
    if (!b->capturing) *(c->to_device ? &b->to_device : &b->to_host) += c->bytes;  // a replay counts them
    if (mark(b, 1, b->copy)) return -1;
    CU_CHECK(b, cuEventRecord(b->done[ev], b->copy));
    return 0;
}

/* A host-function node's body, on a thread of the driver's: the op on the host mirror,
 * which calls no CUDA function; a failure is marked for the replay to report. */
static void CUDA_CB host_call(void *data)
{
    struct CudaHostCall *c = data;
    if (c->b->host_op(c->b->host_ctx, c->op) && !c->b->host_failed) c->b->host_failed = c->op + 1;
}

/* Captured: op k as a host-function node on the host stream, after the copies its waits
 * name (and, the stream's order, the host op before it). */
static int host_node(RtBackend *b, int32_t k)
{
    const CsOp *o = &b->s.ops[k];
    for (int32_t w = 0; w < o->n_wait; w++)
        CU_CHECK(b, cuStreamWaitEvent(b->host_stream, b->done[b->s.waits[o->wait + w]], 0));
    b->host_calls[k] = (struct CudaHostCall){b, k};
    CU_CHECK(b, cuLaunchHostFunc(b->host_stream, host_call, &b->host_calls[k]));
    CU_CHECK(b, cuEventRecord(b->host_mark, b->host_stream));
    b->host_queued = 1;
    return 0;
}

/* An op of the host space: it touches host bytes only, which only copies and other host
 * ops touch, so it waits for the copies its waits name (the schedule names every one
 * that touches its buffers: passes/schedule.c) and not for the device's compute, which
 * goes on with what is queued (offload's overlap: the next unit's backward) while the
 * host runs it; what follows is queued after it returns. A traced step drains the
 * compute stream first as well, so the events on it time the host's work alone. */
static int host(RtBackend *b, int32_t k)
{
    const CsOp *o = &b->s.ops[k];
    if (b->capturing) return host_node(b, k);
    if (b->timing && !b->idle) {
        CU_CHECK(b, cuStreamSynchronize(b->compute));
        b->idle = 1;
    }
    for (int32_t w = 0; w < o->n_wait; w++)
        CU_CHECK(b, cuEventSynchronize(b->done[b->s.waits[o->wait + w]]));
    if (mark(b, 0, b->compute)) return -1;
    if (b->host_op(b->host_ctx, k)) {
        snprintf(b->err, sizeof b->err, "[rank %d] the host could not run op %d", b->rank, k);
        return -1;
    }
    return mark(b, 1, b->compute);
}

static int run_op(RtBackend *b, int32_t k)
{
    const CsOp *o = &b->s.ops[k];
    if (o->host) return host(b, k);
    for (int32_t w = 0; w < o->n_wait; w++, b->idle = 0)
        CU_CHECK(b, cuStreamWaitEvent(b->compute, b->done[b->s.waits[o->wait + w]], 0));
    b->idle = 0;
    if (o->copy >= 0) return copy(b, o->copy);
    if (o->coll >= 0) return collective(b, o->coll);
    if (mark(b, 0, b->compute)) return -1;
    for (int32_t i = o->instr; i < o->instr + o->n_instr; i++)
        if (b->plan->cuda[i].kind == PLAN_CU_GEMM ? gemm(b, i) : launch(b, i)) return -1;
    return mark(b, 1, b->compute);
}

int cuda_run_ops(RtBackend *b, int32_t from, int32_t to)
{
    if (from < 0 || to > b->s.n_ops || from > to) {
        snprintf(b->err, sizeof b->err, "[rank %d] ops [%d, %d) outside the plan's %d", b->rank, from, to, b->s.n_ops);
        return -1;
    }
    CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    CU_CHECK(b, cuStreamIsCapturing(b->compute, &capturing));
    b->capturing = capturing != CU_STREAM_CAPTURE_STATUS_NONE;
    if (b->capturing && b->s.n_host) {  // the host stream forks from the step's start
        CU_CHECK(b, cuEventRecord(b->host_mark, b->compute));
        CU_CHECK(b, cuStreamWaitEvent(b->host_stream, b->host_mark, 0));
        b->host_queued = 0;
    }
    if (from == 0 && b->started) memset((void *)b->started, 0, (size_t)b->s.n_colls + 1);
    for (int32_t k = from; k < to; k++) {
        b->cur_op = k;
        if (run_op(b, k)) return -1;
        /* A fault shows at the next synchronization: with FS_CUDA_SYNC it is this op's. */
        if (b->sync_each && capturing == CU_STREAM_CAPTURE_STATUS_NONE) {
            CU_CHECK(b, cuStreamSynchronize(b->compute));
            const CsOp *o = &b->s.ops[k];
            if (o->coll >= 0 && b->s.colls[o->coll].async) CU_CHECK(b, cuStreamSynchronize(stream_of(b, &b->s.colls[o->coll])));
        }
    }
    for (int32_t k = from; k < to; k++) {
        b->cur_op = k;
        if (b->s.ops[k].coll >= 0 && b->s.colls[b->s.ops[k].coll].async)
            CU_CHECK(b, cuStreamWaitEvent(b->compute, b->done[b->s.ops[k].coll], 0));
        if (b->s.ops[k].copy >= 0)
            CU_CHECK(b, cuStreamWaitEvent(b->compute, b->done[b->s.n_colls + b->s.ops[k].copy], 0));
    }
    b->cur_op = -1;
    if (b->capturing && b->s.n_host) {  // and joins the compute stream at its end
        CU_CHECK(b, cuEventRecord(b->host_mark, b->host_stream));
        CU_CHECK(b, cuStreamWaitEvent(b->compute, b->host_mark, 0));
    }
    b->capturing = b->host_queued = 0;
    return 0;
}

/* The first step that asks records the whole step into a graph (nothing runs while it
 * records), instantiates it, and every such step replays it: one launch for the step. */
static int capture(RtBackend *b)
{
    CUgraph g = NULL;
    b->what = "capturing the step as a CUDA graph";
    CU_CHECK(b, cuStreamBeginCapture(b->compute, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    if (cuda_run_ops(b, 0, b->s.n_ops)) {
        b->capturing = b->host_queued = 0;
        cuStreamEndCapture(b->compute, &g);  // leave capture mode; the error is run_ops'
        if (g) cuGraphDestroy(g);
        return -1;
    }
    CU_CHECK(b, cuStreamEndCapture(b->compute, &g));
    CUresult r = cuGraphInstantiate(&b->graph, g, 0);
    cuGraphDestroy(g);
    if (r != CUDA_SUCCESS) return cuda_fail(b, __FILE__, __LINE__, "cuGraphInstantiate()", cuda_status(r));
    return 0;
}

int cuda_run_step(RtBackend *b, int graph)
{
    if (!graph) return cuda_run_ops(b, 0, b->s.n_ops);
    if (!b->graph && capture(b)) return -1;
    b->what = "replaying the step's CUDA graph";
    if (b->started) memset((void *)b->started, 1, (size_t)b->s.n_colls + 1);  // the graph queues every one
    b->host_failed = 0;
    CU_CHECK(b, cuGraphLaunch(b->graph, b->compute));
    for (int32_t c = 0; c < b->s.n_copies; c++)  // the copies the graph makes (--log's bytes)
        *(b->s.copies[c].to_device ? &b->to_device : &b->to_host) += b->s.copies[c].bytes;
    if (!b->s.n_host) return 0;
    CU_CHECK(b, cuStreamSynchronize(b->compute));  // the step's outputs wait for it anyway
    if (b->host_failed) {
        snprintf(b->err, sizeof b->err, "[rank %d] the host could not run op %d (a host-function node of the step's "
                 "CUDA graph)", b->rank, b->host_failed - 1);
        return -1;
    }
    return 0;
}

/* The step op by op with every op's start and end recorded on its stream, then read once
 * the compute stream (which waits for every collective and copy at a run's end) is done. */
int cuda_run_step_timed(RtBackend *b, RtSpan *spans)
{
    int32_t n = b->s.n_ops;
    if (!b->tev) {
        snprintf(b->err, sizeof b->err, "[rank %d] the backend was made without --trace's events", b->rank);
        return -1;
    }
    b->what = "timing a traced step";
    CU_CHECK(b, cuEventRecord(b->tev[2 * n], b->compute));
    b->timing = 1;
    int rc = cuda_run_ops(b, 0, n);
    b->timing = 0;
    if (rc) return -1;
    CU_CHECK(b, cuStreamSynchronize(b->compute));
    for (int32_t k = 0; k < n; k++) {
        float start, end;
        CU_CHECK(b, cuEventElapsedTime(&start, b->tev[2 * n], b->tev[2 * k]));
        CU_CHECK(b, cuEventElapsedTime(&end, b->tev[2 * n], b->tev[2 * k + 1]));
        spans[k] = (RtSpan){.start = start * 1e3, .dur = (end - start) * 1e3};
    }
    return 0;
}

/* --timeout (backend.h: hung), from the watchdog's thread while the main thread waits for
 * the device: the first collective the run queued whose done event has not happened,
 * with NCCL's asynchronous error on its communicator; then every communicator aborted. */
int cuda_hung(RtBackend *b, char *msg, size_t n)
{
    if (!b->nccl && !b->s.n_links) return 0;
    cuCtxSetCurrent(b->ctx);
    int found = 0;
    for (int32_t ci = 0; ci < b->s.n_colls && !found; ci++) {
        const CsColl *c = &b->s.colls[ci];
        if (!c->async || !b->started[ci] || cuEventQuery(b->done[ci]) != CUDA_ERROR_NOT_READY) continue;
        found = 1;
        cs_coll_describe(b->plan, &b->s, ci, msg, n);
        ncclComm_t comm = c->link >= 0 ? b->link_nccl[c->link] : cuda_comm_of(b, c->group);
        ncclResult_t async = ncclSuccess;
        size_t at = strlen(msg);
        if (comm && nccl.comm_get_async_error(comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress)
            snprintf(msg + at, n - at, " (NCCL: %s)", nccl.get_error_string(async));
    }
    ncclComm_t all[3] = {b->nccl, b->group_nccl[0], b->group_nccl[1]};
    for (int i = 0; i < 3; i++)
        if (all[i]) nccl.comm_abort(all[i]);
    if (b->pipe_nccl) nccl.comm_abort(b->pipe_nccl);
    for (int32_t i = 0; i < b->s.n_links; i++)
        if (b->link_nccl[i]) nccl.comm_abort(b->link_nccl[i]);
    b->nccl = b->group_nccl[0] = b->group_nccl[1] = b->pipe_nccl = NULL;  // aborted: not destroyed again
    for (int32_t i = 0; i < b->s.n_links; i++) b->link_nccl[i] = NULL;
    return found;
}
