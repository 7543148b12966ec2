/* codegen/cuda.h: CUDA C for every op of the final graph, the CUDA program of a plan.
 *
 * codegen_cuda walks the scheduled graph and, for each node (or fused group, see
 * passes/fuse.c: Node.group), calls the op's emitter `cuda_NAME` (declared from
 * ops/ops.def like every other hook). An emitter writes the CUDA C of its kernels into a
 * CuCtx and records, in order, the instructions that run them (PlanCuda in plan/plan.h):
 * LAUNCHes of its kernels, or GEMMs for cuBLAS. Everything static is compiled in:
 * shapes, strides, attributes, dtypes. A kernel's parameters are device pointers to the
 * tensors in its launch's args, nothing else, so the runtime binds every launch from the
 * plan alone and a step can be captured as a CUDA graph.
 *
 * Numerics are the CPU backend's (runtime/cpu/kernels.h): 16-bit elements are loaded
 * as f32, everything is computed in f32 (sums, statistics, softmax, loss, GEMM
 * accumulation), and each output is rounded to its dtype once, to nearest even.
 *
 * Kernel names are deterministic: PREFIX_HHHHHHHH, the hash of the kernel's text, so
 * equal kernels (the same op on the same shapes in every block) are emitted once and the
 * source of a plan depends only on the graph. The module's text (a fixed prelude, then
 * the kernels in first-use order) is the plan's CUDA module section (CUMD); `fsc --emit cuda
 * DIR` writes it and NVRTC compiles it for sm_80 and sm_90 in the test suite
 * (tests/cuda/nvrtc_compile.c), with -std=c++17 and the toolkit's include directory
 * (cuda_fp16.h, cuda_bf16.h). The kernels follow the CPU kernels' f32 expressions
 * operation for operation; compiled with -fmad=false they give the same bits for the
 * elementwise ops (with NVRTC's default contraction, an ulp here and there).
 */
#ifndef FS_CODEGEN_CUDA_H
#define FS_CODEGEN_CUDA_H

#include "ir.h"
#include "plan.h"

typedef struct CuModule CuModule;

/* The node being emitted, and where its text and instructions go. */
typedef struct {
    const Graph *g;
    int node;        // the node (a fused group: its last node)
    CuModule *m;
    char *err;       // cu_fail writes here
    size_t errlen;
    int tf32;        // the plan's tf32 setting: f32 attention on TF32 tensor cores (codegen/cuda_flash.c)
} CuCtx;

typedef struct {
    int x, y, z;
} CuDim;

/* The node being emitted, its inputs' and outputs' ids and values. */
static inline const Node *cu_node(const CuCtx *c) { return ir_node(c->g, c->node); }
static inline int cu_in_id(const CuCtx *c, int i) { return ir_in(c->g, cu_node(c), i); }
static inline int cu_out_id(const CuCtx *c, int i) { return ir_out(c->g, cu_node(c), i); }
static inline const Value *cu_inv(const CuCtx *c, int i) { return ir_value(c->g, cu_in_id(c, i)); }
static inline const Value *cu_outv(const CuCtx *c, int i) { return ir_value(c->g, cu_out_id(c, i)); }

/* One cuBLAS call, row-major as PlanCuda's GEMM describes it. A, B, C are value ids;
 * epi a PlanEpilogue, with bias and aux its value ids (0 when it has none); beta 1: r's
 * value (of C's type) is added (cuBLASLt's C, the plan's C its D). */
typedef struct {
    int A, B, C;
    int ta, tb;
    int epi, bias, aux;
    int beta, r;
    int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch, a_off, b_off, c_off;
} CuGemm;

/* ---- codegen/cuda_module.c: the module being built --------------------------------- */

/* Adds a kernel and a LAUNCH of it for the current node. `src` is the whole kernel,
 * `extern "C" __global__ void KNAME(...) { ... }`, with the literal token KNAME where its
 * name goes; cu_launch names it PREFIX_HASH, adds it to the module once (by text), and
 * records the launch: grid x block threads, smem bytes of dynamic shared memory,
 * args: value ids passed as pointers in the kernel's parameter order. 0, or -1 (cu_fail). */
int cu_launch(CuCtx *c, const char *prefix, const char *src, CuDim grid, CuDim block, int smem, const int *args,
              int n_args);
/* Records a GEMM for the current node. */
int cu_gemm(CuCtx *c, const CuGemm *gm);
/* Formats a message into c->err and returns -1: "op 12 (softmax): ...". */
int cu_fail(CuCtx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* printf into a kernel's text, which lives in the module's arena (the graph's). */
char *cu_fmt(CuCtx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The CUDA type of a dtype: "float", "__half", "__nv_bfloat16", "int". */
const char *cu_type(DType t);
/* The CUDA storage type of input / output i. */
static inline const char *cu_tin(const CuCtx *c, int i) { return cu_type(cu_inv(c, i)->dtype); }
static inline const char *cu_tout(const CuCtx *c, int i) { return cu_type(cu_outv(c, i)->dtype); }

/* The kernel templates, the .cuh files of codegen/kernels/, embedded by the build
 * (cmake/embed_kernels.cmake): file name and text. */
typedef struct {
    const char *name, *text;
} CuSource;
extern const CuSource cu_sources[];
extern const int cu_n_sources;

/* Puts codegen/kernels/FILE in the module (once, after the files it includes), so the
 * kernels the current node launches can instantiate its templates. */
void cu_use(CuCtx *c, const char *file);

/* The text of a kernel that instantiates a template: `extern "C" __global__ void KNAME(PARAMS)
 * { CALL; }`, with __launch_bounds__(bounds) when bounds > 0; cu_launch takes it as `src`. */
char *cu_kernel(CuCtx *c, int bounds, const char *params, const char *call);
/* A kernel parameter: "const __nv_bfloat16 *__restrict__ x" for input i of the node (cu_pin)
 * or "float *__restrict__ y" for output i (cu_pout). */
char *cu_pin(CuCtx *c, int i, const char *name);
char *cu_pout(CuCtx *c, int i, const char *name);

/* The prelude every module starts with (codegen/kernels/prelude.cuh) gives kernels, for each storage
 * type T in {float, __half, __nv_bfloat16, int}:
 *   float ld(const T *p, long long i);      // element i as f32 (int: converted)
 *   void  st(T *p, long long i, float v);   // v rounded to T to nearest even
 * and fs_warp_sum / fs_warp_max (f32 over a warp), fs_block_sum / fs_block_max (f32
 * over a 1-D block of up to 1024 threads, a multiple of 32, using 32 floats of static
 * shared memory). Also (an extension of the contract):
 *   float fs_rn_f16(float v), fs_rn_bf16(float v);  // v rounded through the dtype
 *   bool  fs_isfinite(float x);
 *   float fs_sigmoid(float x), fs_gelu(float x), fs_gelu_grad(float x), fs_silu_grad(float x);
 *   float fs_gelu_erf(float x), fs_gelu_erf_grad(float x);
 * the CPU's formulas (tanh-GELU as x sigmoid(2u), exact GELU by erff; runtime/cpu/elementwise.c);
 * fs_pow and fs_pow_grad, ops/powc.h's text as the CPU compiles it;
 * and fs_philox, fs_dropout_words, fs_dropout_keep, ops/philox.h's text as the CPU compiles it. */

/* ---- codegen/cuda_module.c: helpers every emitter may use (extensions) ------------ */

/* The module of one codegen_cuda call; instructions go into p. */
CuModule *cu_module_new(Arena *a, Plan *p);
const char *cu_module_text(const CuModule *m);

/* A kernel's text built piece by piece, in the module's arena: CuText t = cu_text(c);
 * cu_text_add(&t, ...); then t.s (NULL while empty). */
typedef struct {
    Arena *arena;
    char *s;
    int len, cap;
} CuText;
CuText cu_text(CuCtx *c);
void cu_text_add(CuText *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The prelude's function that rounds an f32 through dtype t ("fs_rn_bf16"), or "" for
 * f32 and i32, to write `%s(expr)`. */
const char *cu_rn(DType t);

/* Elementwise kernels run a grid-stride loop over n elements: cu_grid(n) blocks (at
 * most CU_MAX_BLOCKS) of CU_BLOCK threads, and the loop header cu_loop(c, idx, n),
 * "for (idx i = <global thread>; i < n; i += <grid threads>)". cu_index(span) is that
 * index type: "int" when every index the kernel forms stays below span and span plus
 * the grid's threads fits 31 bits, else "long long". */
enum { CU_BLOCK = 256, CU_MAX_BLOCKS = 65536 };
CuDim cu_grid(int64_t n);
const char *cu_index(int64_t span);
char *cu_loop(CuCtx *c, const char *idx, int64_t n);
/* The offset, in some tensor, of element `i` of a row-major walk over dims size[0..rank)
 * (the last fastest) when the tensor's stride along dim d is stride[d] (0: broadcast):
 * "i / 768 % 4 * 3072 + i % 768". Unit dims are dropped and dims the tensor walks as
 * one are merged first. */
char *cu_index_expr(CuCtx *c, int rank, const int64_t *size, const int64_t *stride, const char *i);
/* The offset in `in` of element `i` of `out` when in broadcasts to out (numpy rules). */
char *cu_bcast_index(CuCtx *c, const Value *out, const Value *in, const char *i);
/* The same offsets as types for the kernel templates (codegen/kernels/index.cuh, which
 * they put in the module): "FsIndex<FsTerm<1LL, 768LL, 1LL>, FsTerm<768LL, 0LL, 3072LL>>". */
char *cu_index_at(CuCtx *c, int rank, const int64_t *size, const int64_t *stride);
char *cu_bcast_at(CuCtx *c, const Value *out, const Value *in);
/* Exact literals: "0.5f", "1e-05f", "__int_as_float(0x7f800000)"; "0.90000000000000002". */
char *cu_float(CuCtx *c, float v);
char *cu_double(CuCtx *c, double v);

/* ---- codegen/cuda_elementwise.c ----------------------------------------------------- */

/* The one kernel of the fused group [first, c->node] (passes/fuse.c). */
int cu_group(CuCtx *c, int first);

/* ---- codegen/cuda_flash.c: attention on tensor cores ---------------------------------- */

/* Where row i of slice s of a tensor starts, elements: s / nh * b + s % nh * h + i * r
 * (attention's contiguous slices: nh = 1, h = 0; attention_qkv's heads: column ranges). */
typedef struct {
    int64_t nh, b, h, r;
} CuLay;

/* Attention's geometry as its emitters read it from the node: BH query slices of T rows,
 * BH / G kv slices of S rows, head dims D (q, k) and Dv (v); the layouts, and which of
 * the node's inputs hold each tensor (attention_qkv: q, k and v are input 0, k from
 * column koff of its rows and v from voff; dq, dk, dv are output 0 likewise). */
typedef struct {
    int64_t BH, G, T, S, D, Dv;
    int causal;
    float scale;  // 1 / sqrt(D)
    CuLay lq, lk, lv, lo;  // q and dq, k and dk, v and dv, o and dO
    int packed;
    int64_t koff, voff;
    int in_o, in_lse, in_dout;  // backward: inputs o, lse, dout (forward: -1)
    int64_t mper;  // attention_masked: query slices per mask row (input in_mask, [B, S]); else 0
    int in_mask;   // the mask's input: i32 (boolean) or float (additive)
} CuAtt;
/* Whether attention (bwd 0) or attention_bwd (bwd 1) of the current node runs on tensor
 * cores: every tensor 16-bit of one dtype (or every one f32 when c->tf32), D = Dv a multiple
 * of 8 up to 128, 16-byte aligned buffers. Then cu_flash_fwd / cu_flash_bwd emit it. Kernels that do their op's
 * FLOPs on tensor cores take a prefix ending in "_tc" (their names contain "_tc_"), which
 * report/kernels.c prices at the tensor-core rate. */
/* codegen/cuda_attention.c: the kernel parameters of q, k and v (attention's three inputs, or attention_qkv's
 * one: "qkv"), the arguments they pass to a template (k and v at their columns of qkv), and the ids of those
 * tensors followed by n `extra` ones into ids (how many). */
const char *cu_att_params(CuCtx *c, const CuAtt *a);
/* attention_masked's mask as a kernel parameter (", const T *__restrict__ mask") and as the last template
 * argument of its kernels (", MPER": the query slices per mask row); "" for attention without one. */
const char *cu_att_mask_param(CuCtx *c, const CuAtt *a);
const char *cu_att_mask_targ(CuCtx *c, const CuAtt *a);
const char *cu_att_args(CuCtx *c, const CuAtt *a);
int cu_att_ids(CuCtx *c, const CuAtt *a, int *ids, const int *extra, int n);
/* The FsAttLay<...> (codegen/kernels/attn_layout.cuh) of layouts q, k, v, o. */
char *cu_att_lay(CuCtx *c, const CuLay *q, const CuLay *k, const CuLay *v, const CuLay *o);
int cu_flash_takes(const CuCtx *c, const CuAtt *a, int bwd);
int cu_flash_fwd(CuCtx *c, const CuAtt *a);
int cu_flash_bwd(CuCtx *c, const CuAtt *a);

/* ---- the emitters, one per op ----------------------------------------------------- */
#define OP(name, ...) int cuda_##name(CuCtx *c);
#include "ops.def"
#undef OP

/* ---- codegen/cuda_program.c ------------------------------------------------------- */

/* The CUDA program of g (after memplan) into p, which codegen_plan has filled from g
 * (same ids): p's cuda instructions and its CUDA module section (CUMD). 0, or -1 with a message
 * (an op no emitter handles) in err. */
int codegen_cuda(const Graph *g, Plan *p, char *err, size_t errlen);
/* The CUDA source of a plan (CUDA module section (CUMD)), or NULL. */
const char *codegen_cuda_source(const Plan *p);
/* The plan's CUDA program as text, one instruction a line: "12 add 26 LAUNCH add_2d6b70f8
 * grid 24576,1,1 block 256,1,1 smem 0 args %9,%34,%35" (op id, op name, .fsm line, then
 * the kernel and its launch, or the GEMM's parameters). 0, or -1 on a write error. */
int codegen_cuda_print(const Plan *p, FILE *out);

#endif
