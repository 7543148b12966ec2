/* runtime/cuda/schedule.h: what the CUDA backend decides about a plan before it touches
 * a device. Pure C over the plan (no CUDA call), so the unit tests check it on machines
 * without a GPU: where each op's instructions are, the arena bytes every instruction
 * and collective reads and writes, the cuBLAS form of every GEMM, how each collective
 * runs on NCCL, and which ops must wait for which collective.
 *
 * Offsets are bytes from the start of this rank's arena (offset + rank * rank_stride,
 * as the CPU executor places tensors); the backend adds its device base once.
 *
 * Collectives run on a stream of their own. Which op waits for which collective is the
 * plan's schedule (passes/schedule.c), taken as stored after plan_check_schedule has
 * proved it safe for this rank: no op touches the bytes of a collective in flight. A run
 * of ops [from, to) then waits for every collective it started, so each run ends
 * complete (and a run that starts later than 0 only ever waits for events already
 * complete).
 *
 * Pipeline stages (cs_build_stage): a send or receive (OPF_P2P) is an NCCL point-to-point
 * call to the rank of stage `peer` at this rank's data-parallel index, on a link of its
 * own: one NCCL communicator of the two ranks and one stream per (peer, direction, tag),
 * the queue in which plan_check_p2p pairs the k-th send with the k-th receive. NCCL runs
 * the calls of one communicator, and of one stream, in order, each send until its
 * receive runs (the worst case, as the proof assumes); with one link per queue no call
 * waits for one of another queue, so what runs is what the proof simulates: each op
 * starts when reached and its waits are complete, and completes once its partner has
 * started. No ncclGroupStart/End is needed: a group would be the proof's model only for
 * calls the schedule starts together, and separate queues already never wait on each
 * other. A collective over the pipeline (group 1: the loss, tied weights' gradients) runs
 * on a communicator of the stages at this data-parallel index and a stream of its own,
 * the i-th meeting the i-th of every stage, as the proof pairs them.
 *
 * Offload: an op whose tensors lie in the host space runs on the host (it has no CUDA
 * instructions: codegen emits none); a to_host or to_device op is a copy between the
 * arena and the host space, which the backend runs on a copy stream of its own, ordered
 * by events as a collective is.
 */
#ifndef FS_CUDA_SCHEDULE_H
#define FS_CUDA_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

typedef struct {
    int64_t lo, hi;  // bytes [lo, hi) of the arena
} CsRange;

typedef enum { CS_ALL_REDUCE, CS_REDUCE_SCATTER, CS_ALL_GATHER, CS_SEND, CS_RECV, CS_COLL_COUNT } CsCollKind;

/* A pipeline link: the queue of sends to, or receives from, one peer stage with one tag
 * (plan_check_p2p's pairing queue): one NCCL communicator of the two ranks and one
 * stream. The sender is the communicator's rank 0. */
typedef struct {
    int stage;              // the peer's stage
    int send;               // 1: this rank sends on it; 0: receives
    int64_t tag;
} CsLink;

/* One collective op bound to this rank's bytes. NCCL's in-place forms: all_reduce with
 * out == x; reduce_scatter writing into x at this rank's slice; all_gather reading x
 * from this rank's slice of out. A reduce_scatter whose out lies elsewhere in x (where
 * MPI's in-place form leaves it) runs in place and then moves the slice there. */
typedef struct {
    int32_t op;
    CsCollKind kind;
    PlanDType dtype;
    int64_t in, out;        // offsets of x and out
    int64_t count;          // elements per rank's block (NCCL's count): all_reduce: all of x;
                            // reduce_scatter: out; all_gather: x
    int64_t in_bytes, out_bytes;
    int avg;                // divide the sum by the world (ncclAvg)
    int group;              // its ranks: OP_GROUP_DATA, or hybrid sharding's OP_GROUP_SHARD, _REPLICA
    int avg_over;           // avg: divide by this many ranks instead of the group's, when > 0 (a replica
                            // group's average is over all the stage's ranks: NCCL's premultiplied sum)
    int64_t nccl_out;       // where NCCL writes its result: out, or x's slice for this rank
    int move;               // then copy count elements from nccl_out to out
    CsRange range[2];       // the bytes of x and of out
    int async;              // on NCCL, ordered by events: its group has more than one rank (else a copy
                            // on the compute stream, or nothing)
    int peer;               // CS_SEND, CS_RECV: the peer's rank in the world (stage * dp + this index)
    int32_t link;           // ... and its link (CsSchedule.links)
} CsColl;

/* cuBLASLt's epilogues (cublasLtEpilogue_t), named as there; the CUDA backend maps them. */
typedef enum {
    CS_EPI_DEFAULT, CS_EPI_BIAS, CS_EPI_GELU_AUX_BIAS, CS_EPI_DGELU_BGRAD, CS_EPI_BGRADA, CS_EPI_BGRADB
} CsEpilogue;

/* A row-major PlanCuda GEMM as cuBLAS's column-major call: C^T = op(B)^T op(A)^T, so
 * cuBLAS's A operand is the plan's B and its B the plan's A, with m and n swapped. An
 * epilogue's bias runs along cuBLAS's m (the plan's n: a bias per output column), and
 * the plan's bias gradient of its B (BGRAD_B) is cuBLASLt's of its A (BGRADA), of its A
 * BGRADB. */
typedef struct {
    int trans_a, trans_b;   // cuBLAS ops: 1 = CUBLAS_OP_T
    int m, n, k, lda, ldb, ldc, batch;
    int64_t stride_a, stride_b, stride_c;  // elements between batch entries
    int64_t a, b, c;        // byte offsets of cuBLAS's A, B and C (offsets applied)
    PlanDType a_dt, b_dt, c_dt;
    CsEpilogue epilogue;    // CS_EPI_DEFAULT: a plain GEMM (cublasGemmStridedBatchedEx), unless beta
    int64_t bias, aux;      // byte offsets of the epilogue's bias vector and aux matrix (leading dim ldc)
    int beta;               // 1: cuBLASLt's C is r (beta 1) and the plan's C its D (cublasLtMatmul)
    int64_t r;              // byte offset of that C (leading dim ldc, C's dtype)
} CsGemm;

/* Offload's copy between the device arena and the host space (to_host, to_device): this
 * rank's bytes of each side. */
typedef struct {
    int32_t op;
    int to_device;          // 1: host -> device; 0: device -> host
    int64_t dev, host;      // offsets in the device arena and in the host space
    int64_t bytes;
} CsCopy;

typedef struct {
    int32_t instr, n_instr; // range in plan->cuda
    int32_t coll;           // index in colls, or -1
    int32_t copy;           // index in copies, or -1
    int host;               // computes in the host space (offload's update): the host runs it
    int32_t wait, n_wait;   // range in waits: the ops of other streams to wait for first: a
                            // collective's index in colls, or a copy's n_colls + index in copies
} CsOp;

typedef struct {
    int32_t n_ops;
    CsOp *ops;
    CsColl *colls;
    int32_t n_colls;
    CsCopy *copies;
    int32_t n_copies;
    int32_t n_host;         // ops with host set
    int32_t *waits;
    int64_t *args;          // LAUNCH args' offsets; instruction i's at args + arg_at[i]
    int32_t *arg_at;        // n_cuda entries
    CsGemm *gemms;          // n_cuda entries; filled for GEMMs
    int world;              // the data-parallel ranks of this rank's stage
    int rank;               // this rank's index among them
    int shard;              // the ranks a shard is split over (plan_shard_group); world without hybrid groups
    int stage, stages;      // this rank's pipeline stage, of how many (1: no pipeline)
    int vrank;              // the rank every view's rank_stride is at: the data-parallel index modulo shard
    CsLink *links;          // the pipeline links this rank's sends and receives use, in order of
    int32_t n_links;        // (peer stage, direction, tag)
    int32_t n_pipe;         // collectives over the pipeline (group 1)
} CsSchedule;

/* Where tensor id lies on `rank`: offset + rank * rank_stride. */
int64_t cs_offset(const Plan *p, int32_t id, int rank);
/* The cuBLAS form of instruction i (a GEMM) on `rank`. */
void cs_gemm(const Plan *p, int32_t i, int rank, CsGemm *g);
/* The collective kind of an op name, or -1 (runtime/comm.c's names). */
int cs_coll_kind(const char *op);
/* Everything above for a plan that passed plan_check. world > 1: collectives go to
 * NCCL (binds and the stored waits); world 1: each is a copy on the compute stream, or
 * nothing when in place. 0, or -1 with a message (a schedule that is unsafe on this
 * rank, a collective NCCL cannot run in place). */
int cs_build(const Plan *p, int rank, int world, CsSchedule *s, char *err, size_t errlen);
/* The same for the program of pipeline stage `stage` of `stages` (p: that program alone,
 * plan_extract_program), run as data-parallel index `rank` of `world`. */
int cs_build_stage(const Plan *p, int rank, int world, int stage, int stages, CsSchedule *s, char *err, size_t errlen);
void cs_free(CsSchedule *s);
/* "op 12 (softmax) at gpt2.fsm:27:5": the op, its name and source location (the file
 * from meta "source" when present). */
void cs_op_where(const Plan *p, int32_t op, char *buf, size_t n);
/* Collective ci as a hung one is named (--timeout on CUDA ranks): "op 40 (recv) at
 * mlp.fsm:12:5, from rank 3 (stage 1)", or "..., over the 2 data-parallel ranks of stage
 * 0" (the ranks it waits for). */
void cs_coll_describe(const Plan *p, const CsSchedule *s, int32_t ci, char *buf, size_t n);

#endif
