/* report/kernels.c: what each instruction of a plan's CUDA program should cost on a GPU
 * (fsc --kernels): its FLOPs, the DRAM bytes it reads and writes, and its roofline time,
 * max(FLOPs / rate, bytes / HBM bandwidth). It is the plan's claim of what a kernel
 * should cost; bench/roofline.py holds a traced GPU step to it.
 *
 * Bytes come from the instruction's arguments: a GEMM reads m x k of A and k x n of B
 * (once when its batch stride is 0) and writes m x n of C, per batch entry, in their
 * dtypes; a LAUNCH reads or writes each argument's whole tensor once (more than a gather
 * moves: the embedding reads only its tokens' rows of the table). Which it does is
 * read from the kernel's own parameter list in the plan's module: a `const T *`
 * parameter is read, any other written, and read too when it is also one of the op's
 * inputs (an update in place: adamw's p, m, v; not adamw_cast's w, which it only
 * writes). A kernel whose parameters cannot be found falls back to the op: its outputs
 * (and its fused members') written, the rest read.
 *
 * FLOPs are the op's (ir/flops.c, PlanOp.flops), plus those of the members of its fused
 * group (the elementwise ops just before it that have no instruction of their own: the
 * last member's one LAUNCH computes them all). A GEMM does exactly 2 m n k per batch
 * entry, on tensor cores when A and B are 16-bit, or f32 in a plan compiled with the tf32
 * setting (which fsexec follows: TF32, at the TF32 rate); else f32 GEMMs run on the FMA
 * units. What the op's FLOPs leave
 * after its GEMMs is split over its LAUNCHes in proportion to the bytes each moves (the
 * layernorm backward's partial sums, its finish and its dx pass), on the FMA units; a
 * kernel named with a "_tc_" in it runs its op's products on tensor cores (codegen/cuda.h:
 * attention and its backward, codegen/cuda_flash.c), so when an op has such launches
 * they take all of its FLOPs (the others, attention_bwd's row sums, are noise beside the
 * products) at the tensor-core rate: the TF32 rate when its first argument (q) is f32.
 *
 * Alignment: a GEMM whose leading dimensions, batch strides or operand starts are not
 * multiples of 16 bytes cannot take cuBLAS's fast tensor-core kernels (they load 16 bytes
 * at a time); report.h's KernAlign lists the rules. The report names each such GEMM and
 * the rules it fails, and adds nothing to its roofline: no measurement says how much
 * slower the kernel cuBLAS falls back to runs.
 *
 * Where it sits: the report layer, after codegen in fsc; reads the plan only.
 */
#include <stdlib.h>
#include <string.h>

#include "report.h"

enum { ACC_READ = 1, ACC_WRITE = 2, MAX_PARAMS = 64 };

static int is_16bit(PlanDType t) { return t == PLAN_DT_F16 || t == PLAN_DT_BF16; }

static int is_ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Whether each of kernel `name`'s n parameters in `module` is a pointer to const: the
 * text between the parentheses after the name's first appearance as a whole word before
 * '('. 0, or -1 when there is no such text or it has another number of parameters. */
static int param_consts(const char *module, const char *name, int n, unsigned char *is_const)
{
    size_t len = strlen(name);
    const char *at = module;
    while (len && at && (at = strstr(at, name)))
        if ((at == module || !is_ident(at[-1])) && at[len] == '(') break;
        else at += len;
    if (!len || !at) return -1;
    const char *c = at + len + 1, *start = c;
    int k = 0, konst = 0, depth = 0;
    for (; *c && (depth || *c != ')'); c++) {
        if (*c == '(') depth++;
        if (*c == ')') depth--;
        if (!depth && *c == ',') {
            if (k == n) return -1;
            is_const[k++] = (unsigned char)konst, konst = 0, start = c + 1;
            continue;
        }
        /* `const` as a word before the parameter's '*': `const T *x`, `T const *x` */
        if (!strncmp(c, "const", 5) && (c == start || !is_ident(c[-1])) && !is_ident(c[5])) {
            const char *star = strchr(c, '*'), *end = strpbrk(c, ",)");
            konst |= star && end && star < end;
        }
    }
    if (!*c || k != n - 1) return -1;
    is_const[k] = (unsigned char)konst;
    return 0;
}

static int has_id(const Plan *p, int32_t at, int32_t n, int32_t t)
{
    for (int32_t i = 0; i < n; i++)
        if (p->ids[at + i] == t) return 1;
    return 0;
}

/* The first op of op k's fused group: the elementwise device ops just before it with no
 * instruction of their own (passes/fuse.c groups consecutive ops; codegen/cuda_program.c
 * emits the group at its last). has[] says which ops have instructions. */
static int32_t group_first(const Plan *p, int32_t k, int32_t first_op, const unsigned char *has)
{
    int32_t f = k;
    while (f > first_op && !has[f - 1] && !plan_op_on_host(p, f - 1)) {
        const OpInfo *info = op_info_by_name(plan_str(p, p->ops[f - 1].op));
        if (!info || !(info->flags & OPF_ELEMWISE)) break;
        f--;
    }
    return f;
}

/* What LAUNCH i does with argument a (ACC_*), ops [first, op] being its fused group. */
static int access_of(const Plan *p, const PlanCuda *in, int a, const unsigned char *is_const, int32_t first)
{
    int32_t t = p->ids[in->args + a];
    const PlanOp *op = &p->ops[in->op];
    int copy = ops_update_copy_input(op_lookup(plan_str(p, op->op)));
    if (copy >= 0 && copy < op->n_in && p->ids[op->in + copy] == t) return ACC_WRITE;  // written, never read
    if (is_const) return is_const[a] ? ACC_READ : ACC_WRITE | (has_id(p, op->in, op->n_in, t) ? ACC_READ : 0);
    for (int32_t k = first; k <= in->op; k++)
        if (has_id(p, p->ops[k].out, p->ops[k].n_out, t)) return ACC_WRITE;
    return ACC_READ;
}

static void launch_cost(const Plan *p, int32_t i, int32_t first, KernLaunch *l)
{
    const PlanCuda *in = &p->cuda[i];
    unsigned char konst[MAX_PARAMS];
    const char *module = p->cuda_module ? p->cuda_module : "";
    int parsed = in->n_args <= MAX_PARAMS && !param_consts(module, plan_str(p, in->kernel), in->n_args, konst);
    l->tensor_core = strstr(plan_str(p, in->kernel), "_tc_") != NULL;
    l->tf32 = l->tensor_core && in->n_args && p->tensors[p->ids[in->args]].dtype == PLAN_DT_F32;
    for (int a = 0; a < in->n_args; a++) {
        const PlanTensor *t = &p->tensors[p->ids[in->args + a]];
        int acc = access_of(p, in, a, parsed ? konst : NULL, first);
        double bytes = (double)plan_tensor_nbytes(t);
        if (acc & ACC_READ) l->bytes_read += bytes;
        if (acc & ACC_WRITE) l->bytes_written += bytes;
        if (plan_tensor_numel(t) > l->elements) l->elements = plan_tensor_numel(t);
    }
}

static void gemm_cost(const Plan *p, int32_t i, KernLaunch *l)
{
    const PlanCuda *in = &p->cuda[i];
    const PlanTensor *A = &p->tensors[p->ids[in->args]], *B = &p->tensors[p->ids[in->args + 1]],
                     *C = &p->tensors[p->ids[in->args + 2]];
    double m = (double)in->m, n = (double)in->n, k = (double)in->k, batch = (double)in->batch;
    l->flops = 2 * m * n * k * batch;
    l->tf32 = A->dtype == PLAN_DT_F32 && B->dtype == PLAN_DT_F32 && plan_meta_int(p, "tf32", 0);
    l->tensor_core = (is_16bit(A->dtype) && is_16bit(B->dtype)) || l->tf32;
    l->bytes_read = m * k * (in->stride_a ? batch : 1) * plan_dtype_size(A->dtype) +
                    k * n * (in->stride_b ? batch : 1) * plan_dtype_size(B->dtype);
    l->bytes_written = m * n * batch * plan_dtype_size(C->dtype);
    l->elements = in->m * in->n * in->batch;
    double es = plan_dtype_size(C->dtype), len = in->epilogue == PLAN_EPI_BGRAD_A ? m : n;
    if (in->beta) l->bytes_read += m * n * es;  // the residual, cuBLASLt's C
    if (!in->epilogue && !in->beta) return;
    /* The epilogue's work (its op's FLOPs beyond the product: a bias add, a GELU, a sum, a
     * residual's add) and bytes: the bias read or the bias gradient written, the GELU's
     * input written (GELU_AUX_BIAS) or read back (DGELU_BGRAD). Its FLOPs count with the
     * GEMM's (they run in its kernel, on its tensor-core flag): next to the product's they
     * are a rounding. */
    if (p->ops[in->op].flops > l->flops) l->flops = p->ops[in->op].flops;
    if (!in->epilogue) return;
    if (in->epilogue == PLAN_EPI_BIAS || in->epilogue == PLAN_EPI_GELU_AUX_BIAS) l->bytes_read += len * es;
    else l->bytes_written += len * es;
    if (in->epilogue == PLAN_EPI_GELU_AUX_BIAS) l->bytes_written += m * n * es;
    if (in->epilogue == PLAN_EPI_DGELU_BGRAD) l->bytes_read += m * n * es;
}

enum { ALIGN_BYTES = 16 };

static const char *const ALIGN_NAMES[KERN_ALIGN_COUNT] = {
    "lda", "ldb", "ldc", "stride_a", "stride_b", "stride_c",
    "offset_a", "offset_b", "offset_c", "offset_bias", "offset_aux", "offset_r"};

const char *report_align_name(KernAlign rule)
{
    return rule >= 0 && rule < KERN_ALIGN_COUNT ? ALIGN_NAMES[rule] : "?";
}

/* Whether tensor t plus `extra` bytes starts off a 16-byte boundary on some rank. */
static int misplaced(const PlanTensor *t, int64_t extra)
{
    return (t->offset + extra) % ALIGN_BYTES || t->rank_stride % ALIGN_BYTES;
}

/* GEMM i's failed KernAlign rules. A, B and C have a leading dimension, a batch stride and
 * an element offset each, in their own dtypes; the epilogue's bias and aux and the residual
 * R (beta) only a start (aux and R walk C's ldc). */
static unsigned gemm_alignment(const Plan *p, int32_t i)
{
    const PlanCuda *in = &p->cuda[i];
    const int64_t ld[] = {in->lda, in->ldb, in->ldc}, stride[] = {in->stride_a, in->stride_b, in->stride_c},
                  off[] = {in->a_off, in->b_off, in->c_off};
    unsigned bad = 0;
    for (int a = 0; a < 3; a++) {
        const PlanTensor *t = &p->tensors[p->ids[in->args + a]];
        int64_t es = plan_dtype_size(t->dtype);
        if (ld[a] * es % ALIGN_BYTES) bad |= 1u << (KERN_LDA + a);
        if (in->batch > 1 && stride[a] * es % ALIGN_BYTES) bad |= 1u << (KERN_STRIDE_A + a);
        if (misplaced(t, off[a] * es)) bad |= 1u << (KERN_OFF_A + a);
    }
    for (int e = 0; e < plan_epilogue_args(in->epilogue); e++)
        if (misplaced(&p->tensors[p->ids[in->args + 3 + e]], 0)) bad |= 1u << (KERN_OFF_BIAS + e);
    if (in->beta && misplaced(&p->tensors[p->ids[in->args + in->n_args - 1]], 0)) bad |= 1u << KERN_OFF_R;
    return bad;
}

const char *report_align_describe(const Plan *p, int32_t i, unsigned bad, char *buf, size_t n)
{
    static const char *const operand[] = {"A", "B", "C", "bias", "aux", "R"};
    const PlanCuda *in = &p->cuda[i];
    const int64_t dims[] = {in->lda, in->ldb, in->ldc, in->stride_a, in->stride_b, in->stride_c};
    size_t at = 0;
    buf[0] = 0;
    for (int rule = 0; rule < KERN_ALIGN_COUNT && at < n; rule++) {
        if (!(bad & 1u << rule)) continue;
        const char *sep = at ? ", " : "";
        int w;
        if (rule < KERN_OFF_A) {
            int a = rule % 3;
            int64_t es = plan_dtype_size(p->tensors[p->ids[in->args + a]].dtype);
            w = snprintf(buf + at, n - at, "%s%s %lld x %lld B", sep, ALIGN_NAMES[rule], (long long)dims[rule],
                         (long long)es);
        } else {
            w = snprintf(buf + at, n - at, "%soffset of %s", sep, operand[rule - KERN_OFF_A]);
        }
        at += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

/* The FLOPs of op k's group that its GEMMs leave, split over its LAUNCHes [a, b) by the
 * bytes each moves (equally when none moves any); over its tensor-core LAUNCHes only
 * when it has some. */
static void split_flops(const Plan *p, KernLaunch *l, int32_t a, int32_t b, int32_t first)
{
    double flops = 0, gemm = 0, bytes = 0;
    int launches = 0, tc = 0;
    for (int32_t k = first; k <= l[a].op; k++) flops += p->ops[k].flops > 0 ? p->ops[k].flops : 0;
    for (int32_t j = a; j < b; j++) tc |= p->cuda[l[j].index].kind == PLAN_CU_LAUNCH && l[j].tensor_core;
    for (int32_t j = a; j < b; j++) {
        if (p->cuda[l[j].index].kind == PLAN_CU_GEMM) {
            gemm += l[j].flops;
            continue;
        }
        if (tc && !l[j].tensor_core) continue;
        bytes += l[j].bytes_read + l[j].bytes_written;
        launches++;
    }
    double rest = flops > gemm ? flops - gemm : 0;
    for (int32_t j = a; j < b; j++)
        if (p->cuda[l[j].index].kind == PLAN_CU_LAUNCH && (!tc || l[j].tensor_core))
            l[j].flops = bytes > 0 ? rest * (l[j].bytes_read + l[j].bytes_written) / bytes : rest / launches;
}

static KernKind *kind_of(KernReport *r, const char *op)
{
    for (int32_t k = 0; k < r->n_kind; k++)
        if (!strcmp(r->kind[k].op, op)) return &r->kind[k];
    r->kind[r->n_kind] = (KernKind){.op = op};
    return &r->kind[r->n_kind++];
}

static int by_time(const void *a, const void *b)
{
    const KernKind *x = a, *y = b;
    if (x->seconds != y->seconds) return x->seconds < y->seconds ? 1 : -1;
    return strcmp(x->op, y->op);
}

static void sum_kinds(KernReport *r)
{
    const Plan *p = r->plan;
    for (int32_t j = 0; j < r->n_launch; j++) {
        const KernLaunch *l = &r->launch[j];
        KernKind *k = kind_of(r, plan_str(p, p->ops[l->op].op));
        int gemm = p->cuda[l->index].kind == PLAN_CU_GEMM;
        k->instructions++, k->gemms += gemm, k->launches += !gemm;
        r->n_gemms += gemm, r->n_launches += !gemm;
        k->flops += l->flops, k->bytes_read += l->bytes_read, k->bytes_written += l->bytes_written;
        k->seconds += l->seconds;
        if (l->tensor_core) k->tc_flops += l->flops, r->tc_flops += l->flops;
        r->flops += l->flops, r->bytes_read += l->bytes_read, r->bytes_written += l->bytes_written;
        r->seconds += l->seconds;
        if (l->misaligned) r->n_misaligned++, r->misaligned_seconds += l->seconds;
    }
    qsort(r->kind, (size_t)r->n_kind, sizeof *r->kind, by_time);
}

static KernReport *fail(KernReport *r, unsigned char *has, char *err, size_t errlen, const char *why)
{
    snprintf(err, errlen, "%s", why);
    free(has);
    report_kernels_free(r);
    return NULL;
}

KernReport *report_kernels_new(const Plan *p, int32_t k, const KernGpu *gpu, char *err, size_t errlen)
{
    if (!p->n_cuda || k < 0 || k >= p->n_programs) {
        snprintf(err, errlen, "the plan has no CUDA program (it has no memory plan)");
        return NULL;
    }
    const PlanProgram *pr = &p->programs[k];
    KernReport *r = calloc(1, sizeof *r);
    unsigned char *has = calloc((size_t)p->n_ops + 1, 1);
    if (r) {
        r->launch = calloc((size_t)p->n_cuda, sizeof *r->launch);
        r->kind = calloc((size_t)p->n_cuda, sizeof *r->kind);
    }
    if (!r || !has || !r->launch || !r->kind) return fail(r, has, err, errlen, "out of memory");
    r->plan = p, r->program = k, r->gpu = *gpu;
    for (int32_t i = 0; i < p->n_cuda; i++) has[p->cuda[i].op] = 1;
    for (int32_t i = 0; i < p->n_cuda; i++) {
        const PlanCuda *in = &p->cuda[i];
        if (in->op < pr->first_op || in->op >= pr->first_op + pr->n_ops) continue;
        KernLaunch *l = &r->launch[r->n_launch++];
        *l = (KernLaunch){.index = i, .op = in->op};
        if (in->kind == PLAN_CU_GEMM) gemm_cost(p, i, l), l->misaligned = gemm_alignment(p, i);
        else launch_cost(p, i, group_first(p, in->op, pr->first_op, has), l);
    }
    for (int32_t a = 0, b; a < r->n_launch; a = b) {  // each op's instructions [a, b)
        for (b = a + 1; b < r->n_launch && r->launch[b].op == r->launch[a].op;) b++;
        split_flops(p, r->launch, a, b, group_first(p, r->launch[a].op, pr->first_op, has));
    }
    for (int32_t j = 0; j < r->n_launch; j++) {
        KernLaunch *l = &r->launch[j];
        double rate = !l->tensor_core ? gpu->flops_fp32 : l->tf32 ? gpu->flops_tf32 : gpu->flops_16bit;
        double compute = l->flops / rate;
        double memory = (l->bytes_read + l->bytes_written) / gpu->hbm_bw;
        l->seconds = compute > memory ? compute : memory;
    }
    sum_kinds(r);
    free(has);
    return r;
}

void report_kernels_free(KernReport *r)
{
    if (!r) return;
    free(r->launch);
    free(r->kind);
    free(r);
}
