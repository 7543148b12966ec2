/* report/kernelout.c: the kernel report (report/kernels.c) as text and as JSON, for
 * fsc --kernels and --kernels=json. Every number is KernReport's; this file only lays
 * them out. The JSON of a plan of one program:
 *
 *   {"model", "gpu": {"name", "flops_16bit", "flops_tf32", "flops_fp32", "hbm_bw"}, "n_instructions",
 *    "n_launches", "n_gemms", "flops", "tensor_core_flops", "bytes_read", "bytes_written",
 *    "roofline_ms" (the whole step's), "launches": [{"index" (in the CUDA program),
 *    "op" (plan op id), "kind" (its name), "phase", "line", "block", "instruction"
 *    ("launch" or "gemm"), "kernel" (a LAUNCH's; "cublas" for a GEMM), "grid": [x, y, z],
 *    "block_dim": [x, y, z], "blocks", "threads" (per block), "smem" (dynamic bytes), a
 *    GEMM's "gemm": [m, n, k, batch], "aligned" (whether it passes every 16-byte rule of
 *    report.h's KernAlign) and "misaligned" (the names of those it fails: "ldb", "offset_c"),
 *    "elements" (of its largest argument), "flops", "tensor_core", "tf32" (those at the TF32 rate), "bytes_read",
 *    "bytes_written", "roofline_ms"}], "n_misaligned_gemms", "misaligned_roofline_ms" (their
 *    roofline, no penalty added), "kinds": [{"kind", "instructions", "launches",
 *    "gemms", "flops", "tensor_core_flops", "bytes_read", "bytes_written", "roofline_ms"}]
 *    (the longest first)}
 *
 * Several programs (pipeline stages): {"model", "gpu", "n_stages", "stages": [the object
 * above for each program, with "stage"]}. A GEMM's grid and block are zeros (cuBLAS picks).
 */
#include <jansson.h>
#include <string.h>

#include "report.h"

static void put(json_t *o, const char *key, json_t *v, int *bad)
{
    if (!v || json_object_set_new(o, key, v)) *bad = 1;
}

static void push(json_t *a, json_t *v, int *bad)
{
    if (!v || json_array_append_new(a, v)) *bad = 1;
}

/* Strings from the plan, cleaned: always valid UTF-8, whatever the file held. */
static json_t *jstr(const char *s)
{
    char buf[64];
    return json_string(report_clean(s, buf, sizeof buf));
}

static int64_t product(const int32_t *d) { return (int64_t)d[0] * d[1] * d[2]; }

static json_t *dims(const int32_t *d, int *bad)
{
    json_t *a = json_array();
    for (int i = 0; i < 3 && a; i++) push(a, json_integer(d[i]), bad);
    return a;
}

static json_t *launch(const KernReport *r, const KernLaunch *l, int *bad)
{
    const Plan *p = r->plan;
    const PlanCuda *in = &p->cuda[l->index];
    const PlanOp *op = &p->ops[l->op];
    int gemm = in->kind == PLAN_CU_GEMM;
    json_t *o = json_object();
    if (!o) return NULL;
    put(o, "index", json_integer(l->index), bad);
    put(o, "op", json_integer(l->op), bad);
    put(o, "kind", jstr(plan_str(p, op->op)), bad);
    put(o, "phase", json_string(plan_phase_name(op->phase)), bad);
    put(o, "line", json_integer(op->line), bad);
    put(o, "block", op->block == PLAN_NONE ? json_null() : jstr(plan_str(p, p->blocks[op->block].name)), bad);
    put(o, "instruction", json_string(gemm ? "gemm" : "launch"), bad);
    put(o, "kernel", gemm ? json_string("cublas") : jstr(plan_str(p, in->kernel)), bad);
    put(o, "grid", dims(in->grid, bad), bad);
    put(o, "block_dim", dims(in->block, bad), bad);
    put(o, "blocks", json_integer(product(in->grid)), bad);
    put(o, "threads", json_integer(product(in->block)), bad);
    put(o, "smem", json_integer(in->smem), bad);
    if (gemm) {
        json_t *g = json_array();
        const int64_t mnkb[] = {in->m, in->n, in->k, in->batch};
        for (int i = 0; i < 4 && g; i++) push(g, json_integer(mnkb[i]), bad);
        put(o, "gemm", g, bad);
        put(o, "epilogue", json_string(plan_epilogue_name(in->epilogue)), bad);
        put(o, "beta", json_integer(in->beta), bad);
        json_t *rules = json_array();
        for (int k = 0; k < KERN_ALIGN_COUNT && rules; k++)
            if (l->misaligned & 1u << k) push(rules, json_string(report_align_name((KernAlign)k)), bad);
        put(o, "aligned", json_boolean(!l->misaligned), bad);
        put(o, "misaligned", rules, bad);
    }
    put(o, "elements", json_integer(l->elements), bad);
    put(o, "flops", json_real(l->flops), bad);
    put(o, "tensor_core", json_boolean(l->tensor_core), bad);
    put(o, "tf32", json_boolean(l->tf32), bad);
    put(o, "bytes_read", json_real(l->bytes_read), bad);
    put(o, "bytes_written", json_real(l->bytes_written), bad);
    put(o, "roofline_ms", json_real(l->seconds * 1e3), bad);
    return o;
}

static json_t *kind(const KernKind *k, int *bad)
{
    json_t *o = json_object();
    if (!o) return NULL;
    put(o, "kind", jstr(k->op), bad);
    put(o, "instructions", json_integer(k->instructions), bad);
    put(o, "launches", json_integer(k->launches), bad);
    put(o, "gemms", json_integer(k->gemms), bad);
    put(o, "flops", json_real(k->flops), bad);
    put(o, "tensor_core_flops", json_real(k->tc_flops), bad);
    put(o, "bytes_read", json_real(k->bytes_read), bad);
    put(o, "bytes_written", json_real(k->bytes_written), bad);
    put(o, "roofline_ms", json_real(k->seconds * 1e3), bad);
    return o;
}

static json_t *gpu(const KernGpu *g, int *bad)
{
    json_t *o = json_object();
    if (!o) return NULL;
    put(o, "name", jstr(g->name), bad);
    put(o, "flops_16bit", json_real(g->flops_16bit), bad);
    put(o, "flops_tf32", json_real(g->flops_tf32), bad);
    put(o, "flops_fp32", json_real(g->flops_fp32), bad);
    put(o, "hbm_bw", json_real(g->hbm_bw), bad);
    return o;
}

static json_t *program(const KernReport *r, int *bad)
{
    json_t *o = json_object(), *ls = json_array(), *ks = json_array();
    for (int32_t j = 0; j < r->n_launch && ls; j++) push(ls, launch(r, &r->launch[j], bad), bad);
    for (int32_t k = 0; k < r->n_kind && ks; k++) push(ks, kind(&r->kind[k], bad), bad);
    if (!o) return json_decref(ls), json_decref(ks), NULL;
    put(o, "n_instructions", json_integer(r->n_launch), bad);
    put(o, "n_launches", json_integer(r->n_launches), bad);
    put(o, "n_gemms", json_integer(r->n_gemms), bad);
    put(o, "flops", json_real(r->flops), bad);
    put(o, "tensor_core_flops", json_real(r->tc_flops), bad);
    put(o, "bytes_read", json_real(r->bytes_read), bad);
    put(o, "bytes_written", json_real(r->bytes_written), bad);
    put(o, "roofline_ms", json_real(r->seconds * 1e3), bad);
    put(o, "launches", ls, bad);
    put(o, "n_misaligned_gemms", json_integer(r->n_misaligned), bad);
    put(o, "misaligned_roofline_ms", json_real(r->misaligned_seconds * 1e3), bad);
    put(o, "kinds", ks, bad);
    return o;
}

int report_kernels_json(const Plan *p, const KernGpu *g, FILE *out, char *err, size_t errlen)
{
    int bad = 0, several = p->n_programs > 1;
    json_t *o = json_object(), *stages = several ? json_array() : NULL;
    if (!o || (several && !stages)) bad = 1;
    for (int32_t k = 0; k < p->n_programs && !bad; k++) {
        KernReport *r = report_kernels_new(p, k, g, err, errlen);
        if (!r) {
            json_decref(o), json_decref(stages);
            return -1;
        }
        json_t *prog = program(r, &bad);
        report_kernels_free(r);
        if (!prog) {
            bad = 1;
        } else if (several) {
            put(prog, "stage", json_integer(k), &bad);
            push(stages, prog, &bad);
        } else {
            json_object_update(o, prog);
            json_decref(prog);
        }
    }
    if (o) {
        put(o, "model", jstr(plan_meta_str(p, "model", "model")), &bad);
        put(o, "gpu", gpu(g, &bad), &bad);
        if (several) put(o, "n_stages", json_integer(p->n_programs), &bad), put(o, "stages", stages, &bad);
    }
    int rc = !o || bad || json_dumpf(o, out, JSON_INDENT(1)) || fputc('\n', out) == EOF ? -1 : 0;
    json_decref(o);
    if (rc) snprintf(err, errlen, "out of memory, or the output could not be written");
    return rc;
}

/* 1234567 -> "1.23 M": FLOPs and bytes in the table, three significant digits. */
static const char *si(double v, char *buf, size_t n)
{
    static const char *const units[] = {"", "k", "M", "G", "T", "P"};
    int u = 0;
    while (v >= 999.5 && u < 5) v /= 1000, u++;
    snprintf(buf, n, u ? (v < 9.995 ? "%.2f %s" : v < 99.95 ? "%.1f %s" : "%.0f %s") : "%.0f %s", v, units[u]);
    return buf;
}

static void print_launch(const KernReport *r, const KernLaunch *l, FILE *out)
{
    const Plan *p = r->plan;
    const PlanCuda *in = &p->cuda[l->index];
    char name[64], fl[16], rd[16], wr[16], shape[48];
    if (in->kind == PLAN_CU_GEMM)
        snprintf(shape, sizeof shape, "gemm %lldx%lldx%lld%s", (long long)in->m, (long long)in->n, (long long)in->k,
                 in->batch > 1 ? " batched" : "");
    else
        snprintf(shape, sizeof shape, "%lld x %lld", (long long)product(in->grid), (long long)product(in->block));
    fprintf(out, "%5d %5d %-16s %-30s %-20s %6d %9s%s %8s %8s %10.2f", l->index, l->op,
            report_clean(plan_str(p, p->ops[l->op].op), name, sizeof name),
            in->kind == PLAN_CU_GEMM ? "cublas" : plan_str(p, in->kernel), shape, in->smem, si(l->flops, fl, sizeof fl),
            l->tensor_core ? "*" : " ", si(l->bytes_read, rd, sizeof rd), si(l->bytes_written, wr, sizeof wr),
            l->seconds * 1e6);
    for (int k = 0, first = 1; k < KERN_ALIGN_COUNT; k++) {
        if (!(l->misaligned & 1u << k)) continue;
        fprintf(out, "%s%s", first ? " ! " : ",", report_align_name((KernAlign)k));
        first = 0;
    }
    fputc('\n', out);
}

enum { ALIGN_NAMED = 5 };  // misaligned ops the summary names; the JSON has every GEMM

/* The tensor whose buffer t lies in (a view's root). */
static int32_t root(const Plan *p, int32_t t) { return p->tensors[t].alias != PLAN_NONE ? p->tensors[t].alias : t; }

/* Whether GEMM instruction i reads or writes a classifier's logits or their gradient, or
 * a view of them: a tensor a cross_entropy op (or its backward, or the two fused) reads
 * first or writes. */
static int of_classifier(const Plan *p, int32_t i)
{
    const PlanCuda *in = &p->cuda[i];
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (strncmp(plan_str(p, op->op), "cross_entropy", 13) || !op->n_in) continue;
        for (int a = 0; a < 3; a++) {
            int32_t t = root(p, p->ids[in->args + a]);
            if (root(p, p->ids[op->in]) == t) return 1;
            for (int32_t o = 0; o < op->n_out; o++)
                if (root(p, p->ids[op->out + o]) == t) return 1;
        }
    }
    return 0;
}

/* The misaligned GEMMs: how many, their roofline, then the first ALIGN_NAMED ops that
 * have one (an op's GEMMs are consecutive), where the model makes them, the rules they
 * fail and what would fix them. One line when every GEMM is aligned; none without GEMMs. */
static void print_alignment(const KernReport *r, FILE *out)
{
    const Plan *p = r->plan;
    if (!r->n_gemms) return;
    if (!r->n_misaligned) {
        fprintf(out, "GEMMs: all %d have leading dimensions, batch strides and offsets that are multiples of 16 "
                "bytes\n", r->n_gemms);
        return;
    }
    fprintf(out, "GEMMs with a leading dimension, batch stride or offset not a multiple of 16 bytes: %d of %d "
            "(their roofline %.3f ms):\n", r->n_misaligned, r->n_gemms, r->misaligned_seconds * 1e3);
    int named = 0, more = 0, head = 0, offset = 0;
    for (int32_t j = 0, next; j < r->n_launch; j = next) {
        const KernLaunch *l = &r->launch[j];
        unsigned bad = 0;
        int gemms = 0;
        for (next = j; next < r->n_launch && r->launch[next].op == l->op; next++)
            bad |= r->launch[next].misaligned, gemms += r->launch[next].misaligned != 0;
        if (!bad) continue;
        if (named == ALIGN_NAMED) {
            more++;
            continue;
        }
        const PlanOp *op = &p->ops[l->op];
        char name[64], file[64], why[256], count[32] = "";
        int cls = of_classifier(p, l->index);
        head |= cls, offset |= (bad >> KERN_OFF_A) != 0;
        if (gemms > 1) snprintf(count, sizeof count, ", %d GEMMs", gemms);
        fprintf(out, "  op %d %s", l->op, report_clean(plan_str(p, op->op), name, sizeof name));
        const char *src = plan_meta_str(p, "source", NULL);
        if (op->line > 0 && src) fprintf(out, " at %s:%d:%d", report_clean(src, file, sizeof file), op->line, op->col);
        else if (op->line > 0) fprintf(out, " at line %d, column %d", op->line, op->col);
        fprintf(out, "%s: %s%s\n", count, report_align_describe(p, l->index, bad, why, sizeof why),
                cls ? " (a classifier head)" : "");
        named++;
    }
    if (more) fprintf(out, "  and %d more op%s\n", more, more > 1 ? "s" : "");
    fprintf(out, "  fix: such a dim a multiple of 8 elements in 16 bits, 4 in fp32%s\n",
            offset ? " (an offset: the sizes of what lies before it)" : "");
    if (head)
        fprintf(out, "  a classifier head: --pad_vocab pads a head stored [V, C] (and its bias), or one stored [C, V] "
                     "with no bias\n");
}

static void print_program(const KernReport *r, FILE *out)
{
    char fl[16], tc[16], rd[16], wr[16];
    fprintf(out, "%5s %5s %-16s %-30s %-20s %6s %10s %8s %8s %10s\n", "#", "op", "kind", "kernel",
            "blocks x threads", "smem", "FLOP", "read B", "write B", "roofline us");
    for (int32_t j = 0; j < r->n_launch; j++) print_launch(r, &r->launch[j], out);
    fprintf(out, "\nby op kind (the longest first):\n%-18s %6s %6s %10s %10s %9s %9s %11s %6s\n", "kind", "launch",
            "gemm", "FLOP", "on TC", "read B", "write B", "roofline ms", "share");
    for (int32_t k = 0; k < r->n_kind; k++) {
        const KernKind *x = &r->kind[k];
        char name[64];
        fprintf(out, "%-18s %6d %6d %10s %10s %9s %9s %11.3f %5.1f%%\n", report_clean(x->op, name, sizeof name),
                x->launches, x->gemms, si(x->flops, fl, sizeof fl), si(x->tc_flops, tc, sizeof tc),
                si(x->bytes_read, rd, sizeof rd), si(x->bytes_written, wr, sizeof wr), x->seconds * 1e3,
                r->seconds > 0 ? 100 * x->seconds / r->seconds : 0.0);
    }
    fprintf(out, "step: %d instructions (%d launches, %d GEMMs), %sFLOP (%sFLOP on tensor cores), %sB read, "
            "%sB written; roofline %.3f ms\n", r->n_launch, r->n_launches, r->n_gemms, si(r->flops, fl, sizeof fl),
            si(r->tc_flops, tc, sizeof tc), si(r->bytes_read, rd, sizeof rd), si(r->bytes_written, wr, sizeof wr),
            r->seconds * 1e3);
    print_alignment(r, out);
}

int report_kernels_print(const Plan *p, const KernGpu *g, FILE *out, char *err, size_t errlen)
{
    char name[64];
    fprintf(out, "CUDA program of %s on %s: %.0f TFLOP/s bf16/fp16 tensor cores, %.0f TFLOP/s fp32, %.0f GB/s HBM, "
            "%.0f TFLOP/s tf32;\nroofline = max(FLOP / rate, bytes / HBM); FLOP marked * run on tensor cores; "
            "! marks a GEMM not 16-byte aligned\n",
            report_clean(plan_meta_str(p, "model", "model"), name, sizeof name), g->name, g->flops_16bit / 1e12,
            g->flops_fp32 / 1e12, g->hbm_bw / 1e9, g->flops_tf32 / 1e12);
    for (int32_t k = 0; k < p->n_programs; k++) {
        KernReport *r = report_kernels_new(p, k, g, err, errlen);
        if (!r) return -1;
        if (p->n_programs > 1) {
            char label[96];
            fprintf(out, "\n== %s\n", report_stage_label(p, k, label, sizeof label));
        }
        fputc('\n', out);
        print_program(r, out);
        report_kernels_free(r);
    }
    if (ferror(out)) snprintf(err, errlen, "the output could not be written");
    return ferror(out) ? -1 : 0;
}
