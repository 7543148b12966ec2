/* tests/cuda_emu/nccl_emu.c: NCCL as cuda-emu runs it between ranks: each rank of a
 * world is a process (fsexec under mpirun, MPI already started), its "device" arena a
 * host allocation, and every NCCL call of runtime/cuda/run.c a nonblocking MPI call on
 * the same ranks, with NCCL's semantics:
 *
 * - A collective (all_reduce, reduce_scatter, all_gather; over the stage's data-parallel
 *   ranks, hybrid sharding's shard or replica group, or the pipeline's stages) reads its
 *   input once it starts and writes its output once it completes; nothing else. Started
 *   when the schedule reaches it (the input is copied out then: NCCL reads it on its
 *   stream after compute has made it), completed when an op's stored waits name it or
 *   the run ends, as the CUDA backend's events order it. The inputs of every rank are
 *   gathered (MPI_Iallgather of bytes) and reduced here in rank order, in f32, rounded
 *   once to the dtype (16-bit types as NCCL's sums do); an average divides the sum by the
 *   group (ncclAvg), or with avg_over multiplies it by 1 / avg_over (the premultiplied
 *   sum); i32 sums wrap, as NCCL's do; all_gather places each rank's block. A reduce_scatter that NCCL runs in place
 *   and then moves (CsColl.move) does both.
 * - A send or receive (ncclSend / ncclRecv on its link): MPI_Issend from, or MPI_Irecv
 *   into, the arena bytes, on a duplicate of the world with the plan's tag, to the peer's
 *   rank. Issend completes only once the receive is posted: the worst case NCCL allows,
 *   as plan_check_p2p assumes. MPI matches messages of one (source, tag, communicator) in
 *   order, so the k-th send on a link meets the k-th receive, as NCCL's link queue does.
 *
 * --timeout (emu_nccl_hung, from the watchdog's thread): the first one started and not
 * complete, as the CUDA backend finds it by its events; then, as ncclCommAbort, every
 * later call fails (the main thread, blocked in MPI_Wait, is ended by the watchdog's
 * MPI_Abort, as a stream blocked in NCCL is by the abort).
 *
 * Each waits only where the CUDA backend's events would (the stored schedule), so a
 * schedule that is safe in the emulator is the one the backend runs; a wait that blocks
 * is a wait the device's stream would block at. Test infrastructure (cuda-emu), never
 * part of fsexec.
 */
#include <mpi.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_impl.h"
#include "nccl_emu.h"

struct EmuNccl {
    const CsSchedule *s;
    uint8_t *arena;
    MPI_Comm group[OP_GROUP_COUNT];  // by a collective's group: data, pipe, shard, replica (or MPI_COMM_NULL)
    MPI_Comm p2p;                    // sends and receives: the world, duplicated
    MPI_Request *req;                // per collective: in flight, else MPI_REQUEST_NULL
    uint8_t **mine, **all;           // per collective (not point-to-point): its input, every rank's
    int *size, *index;               // per collective: its group's ranks and this rank's index
    _Atomic uint8_t *inflight;        // per collective: started, not complete (read by the watchdog's thread)
    atomic_int aborted;              // emu_nccl_hung aborted the communicators
};

static int fail(char *err, size_t errlen, const char *what, int rc)
{
    char s[MPI_MAX_ERROR_STRING] = "";
    int n = 0;
    MPI_Error_string(rc, s, &n);
    snprintf(err, errlen, "cuda-emu: NCCL over MPI: %s: %s", what, s);
    return -1;
}

EmuNccl *emu_nccl_new(const CsSchedule *s, uint8_t *arena, int rank, char *err, size_t errlen)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        snprintf(err, errlen, "cuda-emu: a world of %d ranks needs MPI started (fsexec under mpirun)", s->world * s->stages);
        return NULL;
    }
    EmuNccl *n = calloc(1, sizeof *n);
    size_t k = (size_t)s->n_colls + 1;
    if (!n || !(n->req = calloc(k, sizeof *n->req)) || !(n->mine = calloc(k, sizeof *n->mine)) ||
        !(n->all = calloc(k, sizeof *n->all)) || !(n->size = calloc(k, sizeof *n->size)) ||
        !(n->index = calloc(k, sizeof *n->index)) || !(n->inflight = calloc(k, sizeof *n->inflight))) {
        emu_nccl_free(n);
        snprintf(err, errlen, "cuda-emu: out of memory");
        return NULL;
    }
    n->s = s, n->arena = arena;
    for (int g = 0; g < OP_GROUP_COUNT; g++) n->group[g] = MPI_COMM_NULL;
    n->p2p = MPI_COMM_NULL;
    /* The splits runtime/cuda/backend.c makes for NCCL, every rank alike, in one order. */
    int dp = s->world, d = rank % dp, stage = rank / dp, shard = s->shard, rc;
    int colors[OP_GROUP_COUNT] = {[OP_GROUP_DATA] = stage, [OP_GROUP_PIPE] = d,
                                  [OP_GROUP_SHARD] = stage * dp + d / shard, [OP_GROUP_REPLICA] = stage * shard + d % shard};
    for (int g = 0; g < OP_GROUP_COUNT; g++)
        if ((rc = MPI_Comm_split(MPI_COMM_WORLD, colors[g], rank, &n->group[g])) != MPI_SUCCESS) {
            fail(err, errlen, "MPI_Comm_split", rc);
            emu_nccl_free(n);
            return NULL;
        }
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &n->p2p)) != MPI_SUCCESS) {
        fail(err, errlen, "MPI_Comm_dup", rc);
        emu_nccl_free(n);
        return NULL;
    }
    for (int32_t i = 0; i < s->n_colls; i++) {
        const CsColl *c = &s->colls[i];
        n->req[i] = MPI_REQUEST_NULL;
        if (!c->async || c->link >= 0) continue;
        MPI_Comm_size(n->group[c->group], &n->size[i]);
        MPI_Comm_rank(n->group[c->group], &n->index[i]);
        if (!(n->mine[i] = malloc((size_t)c->in_bytes + 1)) ||
            !(n->all[i] = malloc((size_t)c->in_bytes * (size_t)n->size[i] + 1))) {
            emu_nccl_free(n);
            snprintf(err, errlen, "cuda-emu: out of memory");
            return NULL;
        }
    }
    return n;
}

void emu_nccl_free(EmuNccl *n)
{
    if (!n) return;
    for (int g = 0; g < OP_GROUP_COUNT; g++)
        if (n->group[g] != MPI_COMM_NULL) MPI_Comm_free(&n->group[g]);
    if (n->p2p != MPI_COMM_NULL) MPI_Comm_free(&n->p2p);
    for (int32_t i = 0; n->s && i < n->s->n_colls; i++) {
        if (n->mine) free(n->mine[i]);
        if (n->all) free(n->all[i]);
    }
    free(n->req), free(n->mine), free(n->all), free(n->size), free(n->index), free((void *)n->inflight);
    free(n);
}

static int aborted(EmuNccl *n, char *err, size_t errlen)
{
    if (!atomic_load(&n->aborted)) return 0;
    snprintf(err, errlen, "cuda-emu: NCCL's communicators were aborted (ncclCommAbort: ncclInvalidUsage)");
    return -1;
}

int emu_nccl_start(EmuNccl *n, int32_t ci, char *err, size_t errlen)
{
    const CsColl *c = &n->s->colls[ci];
    int rc;
    if (aborted(n, err, errlen)) return -1;
    atomic_store(&n->inflight[ci], 1);
    if (c->kind == CS_SEND || c->kind == CS_RECV) {
        int tag = (int)(c->link >= 0 ? n->s->links[c->link].tag : 0);
        if (c->in_bytes > 0x7fffffff) {
            snprintf(err, errlen, "cuda-emu: a message of %lld bytes (MPI counts in int)", (long long)c->in_bytes);
            return -1;
        }
        rc = c->kind == CS_SEND ? MPI_Issend(n->arena + c->in, (int)c->in_bytes, MPI_BYTE, c->peer, tag, n->p2p, &n->req[ci])
                                : MPI_Irecv(n->arena + c->out, (int)c->out_bytes, MPI_BYTE, c->peer, tag, n->p2p, &n->req[ci]);
        return rc == MPI_SUCCESS ? 0 : fail(err, errlen, c->kind == CS_SEND ? "MPI_Issend" : "MPI_Irecv", rc);
    }
    if (c->in_bytes * n->size[ci] > 0x7fffffff) {
        snprintf(err, errlen, "cuda-emu: a collective of %lld bytes (MPI counts in int)", (long long)c->in_bytes);
        return -1;
    }
    memcpy(n->mine[ci], n->arena + c->in, (size_t)c->in_bytes);
    rc = MPI_Iallgather(n->mine[ci], (int)c->in_bytes, MPI_BYTE, n->all[ci], (int)c->in_bytes, MPI_BYTE,
                        n->group[c->group], &n->req[ci]);
    return rc == MPI_SUCCESS ? 0 : fail(err, errlen, "MPI_Iallgather", rc);
}

/* Collective ci's result from every rank's input (all), as NCCL writes it. */
static void finish(EmuNccl *n, int32_t ci)
{
    const CsColl *c = &n->s->colls[ci];
    int size = n->size[ci];
    int64_t es = plan_dtype_size(c->dtype);
    uint8_t *dst = n->arena + c->nccl_out;
    if (c->kind == CS_ALL_GATHER) {
        memcpy(dst, n->all[ci], (size_t)(c->in_bytes * size));
    } else {
        /* all_reduce: every element; reduce_scatter: this rank's block of count. */
        int64_t from = c->kind == CS_REDUCE_SCATTER ? (int64_t)n->index[ci] * c->count : 0;
        float scale = !c->avg ? 1.0f : c->avg_over > 0 ? 1.0f / (float)c->avg_over : 1.0f / (float)size;
        for (int64_t i = 0; i < c->count && c->dtype == PLAN_DT_I32; i++) {  // schedule.c: no average of i32
            uint32_t acc = 0, x;  // NCCL's int32 sum wraps
            for (int r = 0; r < size; r++) {
                memcpy(&x, n->all[ci] + (size_t)(r * c->in_bytes) + 4 * (from + i), 4);
                acc += x;
            }
            memcpy(dst + 4 * i, &acc, 4);
        }
        for (int64_t i = 0; i < c->count && c->dtype != PLAN_DT_I32; i++) {
            float acc = 0.0f;
            for (int r = 0; r < size; r++) acc += emu_load(n->all[ci] + (size_t)(r * c->in_bytes), c->dtype, from + i);
            emu_store(dst, c->dtype, i, c->avg ? acc * scale : acc);
        }
    }
    if (c->move) memmove(n->arena + c->out, dst, (size_t)(c->count * es));
}

int emu_nccl_wait(EmuNccl *n, int32_t ci, char *err, size_t errlen)
{
    if (n->req[ci] == MPI_REQUEST_NULL) return 0;
    int rc = MPI_Wait(&n->req[ci], MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return fail(err, errlen, "MPI_Wait", rc);
    if (aborted(n, err, errlen)) return -1;
    atomic_store(&n->inflight[ci], 0);
    if (n->s->colls[ci].link < 0) finish(n, ci);
    return 0;
}

int emu_nccl_wait_all(EmuNccl *n, char *err, size_t errlen)
{
    for (int32_t i = 0; i < n->s->n_colls; i++)
        if (emu_nccl_wait(n, i, err, errlen)) return -1;
    return 0;
}

int32_t emu_nccl_hung(EmuNccl *n)
{
    int32_t ci = 0;
    while (ci < n->s->n_colls && !atomic_load(&n->inflight[ci])) ci++;
    atomic_store(&n->aborted, 1);
    return ci < n->s->n_colls ? ci : -1;
}
