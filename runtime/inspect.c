/* runtime/inspect.c: `fsexec --inspect PLAN`. Prints what a plan holds, in sections with
 * aligned columns, from the plan alone (no backend, no ranks): a user reads here what
 * the compiler decided before asking a cluster for anything.
 *
 * A plan of several programs (pipeline stages) lists them, shows the step's schedule
 * across them (report/timeline.c), and reports memory and communication per stage; its
 * inputs, outputs and step roles carry their stage, its balance the cut fsc chose, and
 * its arenas are each stage's. Sizes read as fsc --mem writes them (report_bytes).
 *
 * Names come from a file and may be anything: each is printed through `clean`, which
 * replaces control bytes and caps the length, so a hostile plan cannot garble the
 * terminal or the layout. Scratch arrays come from plan_alloc; without them a listing
 * says so and the rest still prints.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "runtime.h"

/* Sums of sizes a hostile plan could make overflow (each size alone fits). */
static int64_t add_sat(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }
static int64_t mul_sat(int64_t a, int64_t b) { return b && a > INT64_MAX / b ? INT64_MAX : a * b; }

/* "i32[4, 64]" */
static const char *type_str(const PlanTensor *t, char *buf, size_t n)
{
    size_t at = (size_t)snprintf(buf, n, "%s[", plan_dtype_name(t->dtype));
    for (int32_t d = 0; d < t->rank && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (at < n) snprintf(buf + at, n - at, "]");
    return buf;
}

static const char *tensor_name(const Plan *p, int32_t id, char *buf, size_t n)
{
    const char *s = plan_str(p, p->tensors[id].name);
    if (*s) return report_clean(s, buf, n);
    snprintf(buf, n, "%%%d", id);
    return buf;
}

static void print_meta_value(const Plan *p, const PlanMeta *m, FILE *out)
{
    char buf[64];
    switch (m->kind) {
    case PLAN_META_STR: fprintf(out, "%s\n", report_clean(plan_str(p, m->s), buf, sizeof buf)); break;
    case PLAN_META_INT: fprintf(out, "%" PRId64 "\n", m->i); break;
    case PLAN_META_FLOAT: fprintf(out, "%g\n", m->f); break;
    case PLAN_META_COUNT: fprintf(out, "?\n"); break;
    }
}

static void print_summary(const Plan *p, FILE *out)
{
    char a[64], b[64], c[64], e[64];
    int64_t world = plan_meta_int(p, "world", 1), stages = plan_meta_int(p, "stages", 1);
    fprintf(out, "plan format   %u.%u\n", p->major, p->minor);
    fprintf(out, "model         %s\n", report_clean(plan_meta_str(p, "model", "?"), a, sizeof a));
    fprintf(out, "compiler      %s\n", report_clean(plan_meta_str(p, "compiler", "?"), a, sizeof a));
    if (plan_meta_find(p, "dims")) {  // a checkpoint records them: a resume compares them
        char d[256];
        fprintf(out, "dims          %s", report_clean(plan_meta_str(p, "dims", "?"), d, sizeof d));
        if (plan_meta_find(p, "batch_dim"))
            fprintf(out, " (batch %s)", report_clean(plan_meta_str(p, "batch_dim", "?"), a, sizeof a));
        fprintf(out, "\n");
    }
    if (plan_meta_find(p, "source"))
        fprintf(out, "source        %s\n", report_clean(plan_meta_str(p, "source", "?"), a, sizeof a));
    fprintf(out, "ranks         %" PRId64 " (%" PRId64 " data-parallel x %" PRId64 " pipeline stage%s)\n",
            world, stages > 0 ? world / stages : world, stages, stages == 1 ? "" : "s");
    fprintf(out, "strategy      shard %s, precision %s, recompute %s, offload %s\n",
            report_clean(plan_meta_str(p, "shard", "?"), a, sizeof a), report_clean(plan_meta_str(p, "precision", "?"), b, sizeof b),
            report_clean(plan_meta_str(p, "recompute", "?"), c, sizeof c), report_clean(plan_meta_str(p, "offload", "?"), e, sizeof e));

    int64_t count[PLAN_DT_COUNT] = {0}, total = 0, bytes = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (!plan_tensor_is_model_param(t)) continue;
        count[t->dtype] = add_sat(count[t->dtype], plan_tensor_logical_numel(t));  // a padded vocabulary's own
        total = add_sat(total, plan_tensor_logical_numel(t));
        bytes = add_sat(bytes, plan_tensor_nbytes(t));
    }
    if (p->n_programs) {
        for (int s = 0; s < PLAN_PLACE_COUNT; s++) {
            fprintf(out, "%-13s", s == PLAN_PLACE_DEVICE ? "device arena" : "host arena");
            for (int32_t g = 0; g < p->n_programs; g++) {
                int64_t n = p->programs[g].space_bytes[s];
                fprintf(out, "%s%s (%s bytes)", g ? " / " : " ", report_bytes(n, a, sizeof a),
                        report_grouped(n, b, sizeof b));
            }
            fprintf(out, " per rank%s\n", p->n_programs > 1 ? " by stage" : "");
        }
        fprintf(out, "programs      %d (stage, data-parallel ranks, ops:", p->n_programs);
        for (int32_t g = 0; g < p->n_programs; g++)
            fprintf(out, " %d/%d/%d", p->programs[g].stage, p->programs[g].dp_world, p->programs[g].n_ops);
        fprintf(out, ")\n");
    } else {
        fprintf(out, "arena         none (no memory plan)\n");
    }
    fprintf(out, "params        %s (%s)\n", report_grouped(total, a, sizeof a), report_bytes(bytes, b, sizeof b));
    for (int d = 0; d < PLAN_DT_COUNT; d++)
        if (count[d])
            fprintf(out, "  %-10s  %15s  %10s\n", plan_dtype_name((PlanDType)d), report_grouped(count[d], a, sizeof a),
                    report_bytes(mul_sat(count[d], plan_dtype_size((PlanDType)d)), b, sizeof b));
}

/* The cut fsc chose (balance auto, or as given): each stage's blocks, from the blocks
 * of the params its program holds, as "1,1 blocks per stage (stage 0: h.0; stage 1:
 * h.1), balance ". */
static void print_cut(const Plan *p, FILE *out)
{
    int32_t *cut = plan_alloc(sizeof *cut * 3 * (size_t)p->n_programs);  // [stage]: blocks, first, last
    char *held = plan_alloc((size_t)p->n_blocks + 1);
    if (!cut || !held) {
        plan_dealloc(cut), plan_dealloc(held);
        return;
    }
    for (int32_t g = 0; g < p->n_programs; g++) {
        const PlanProgram *pg = &p->programs[g];
        int32_t *c = &cut[3 * g];
        c[0] = 0, c[1] = c[2] = PLAN_NONE;
        memset(held, 0, (size_t)p->n_blocks + 1);
        for (int32_t i = pg->first_tensor; i < pg->first_tensor + pg->n_tensors; i++) {
            int32_t b = p->tensors[i].block;
            if (b < 0 || b >= p->n_blocks || held[b] || !plan_tensor_is_model_param(&p->tensors[i])) continue;
            held[b] = 1, c[0]++;
            if (c[1] == PLAN_NONE || b < c[1]) c[1] = b;
            if (b > c[2]) c[2] = b;
        }
        fprintf(out, "%s%d", g ? "," : "", c[0]);
    }
    fprintf(out, " blocks per stage (");
    for (int32_t g = 0; g < p->n_programs; g++) {
        const int32_t *c = &cut[3 * g];
        char a[64], z[64];
        fprintf(out, "%sstage %d: ", g ? "; " : "", g);
        if (c[1] == PLAN_NONE)
            fprintf(out, "none");
        else if (c[1] == c[2])
            fprintf(out, "%s", report_clean(plan_str(p, p->blocks[c[1]].name), a, sizeof a));
        else
            fprintf(out, "%s .. %s", report_clean(plan_str(p, p->blocks[c[1]].name), a, sizeof a),
                    report_clean(plan_str(p, p->blocks[c[2]].name), z, sizeof z));
    }
    fprintf(out, "), balance ");
    plan_dealloc(cut), plan_dealloc(held);
}

static void print_settings(const Plan *p, FILE *out)
{
    static const char *const shown[] = {"model", "compiler", "params", "source", "dims", "batch_dim"};
    char buf[64];
    fprintf(out, "\ntraining settings\n");
    for (int32_t i = 0; i < p->n_meta; i++) {
        const char *key = plan_str(p, p->meta[i].key);
        int skip = 0;
        for (size_t k = 0; k < sizeof shown / sizeof *shown; k++) skip |= !strcmp(key, shown[k]);
        if (skip) continue;
        fprintf(out, "  %-22s ", report_clean(key, buf, sizeof buf));
        if (!strcmp(key, "balance") && p->n_programs > 1) print_cut(p, out);
        print_meta_value(p, &p->meta[i], out);
    }
}

/* Program g's ranges of tensors and outputs (a plan of no program: all of them). */
static void ranges(const Plan *p, int32_t g, int32_t *t0, int32_t *t1, int32_t *o0, int32_t *o1)
{
    if (!p->n_programs) {
        *t0 = *o0 = 0, *t1 = p->n_tensors, *o1 = p->n_outputs;
        return;
    }
    const PlanProgram *pg = &p->programs[g];
    *t0 = pg->first_tensor, *t1 = pg->first_tensor + pg->n_tensors;
    *o0 = pg->first_output, *o1 = pg->first_output + pg->n_outputs;
}

/* "stage 1  " before each row of a pipeline's listing; nothing for one program. */
static void stage_label(const Plan *p, int32_t g, FILE *out)
{
    if (p->n_programs > 1) fprintf(out, "stage %-3d ", g);
}

/* Inputs (the batch the data loader fills) and outputs (the first of a program's is its
 * loss), each program's, under its stage's label in a pipeline. */
static void print_io(const Plan *p, FILE *out)
{
    char n[64], t[128], b[32];
    int w = 8;
    int32_t n_prog = p->n_programs > 1 ? p->n_programs : 1, t0, t1, o0, o1;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_INPUT) {
            int len = (int)strlen(tensor_name(p, i, n, sizeof n));
            if (len > w) w = len;
        }
    for (int32_t i = 0; i < p->n_outputs; i++) {
        int len = (int)strlen(tensor_name(p, p->outputs[i], n, sizeof n));
        if (len > w) w = len;
    }
    fprintf(out, "\ninputs\n");
    for (int32_t g = 0; g < n_prog; g++) {
        ranges(p, g, &t0, &t1, &o0, &o1);
        for (int32_t i = t0; i < t1; i++)
            if (p->tensors[i].role == PLAN_ROLE_INPUT) {
                fprintf(out, "  ");
                stage_label(p, g, out);
                fprintf(out, "%-*s  %-24s %10s\n", w, tensor_name(p, i, n, sizeof n),
                        type_str(&p->tensors[i], t, sizeof t),
                        report_bytes(plan_tensor_nbytes(&p->tensors[i]), b, sizeof b));
            }
    }
    fprintf(out, "\noutputs\n");
    for (int32_t g = 0; g < n_prog; g++) {
        ranges(p, g, &t0, &t1, &o0, &o1);
        for (int32_t i = o0; i < o1; i++) {
            int32_t id = p->outputs[i];
            fprintf(out, "  ");
            stage_label(p, g, out);
            fprintf(out, "%-*s  %-24s %10s%s\n", w, tensor_name(p, id, n, sizeof n),
                    type_str(&p->tensors[id], t, sizeof t),
                    report_bytes(plan_tensor_nbytes(&p->tensors[id]), b, sizeof b),
                    i == o0 ? "  (loss)" : "");
        }
    }
}

static void print_blocks(const Plan *p, FILE *out)
{
    fprintf(out, "\nblocks (%d)\n", p->n_blocks);
    if (!p->n_blocks) return;
    int64_t *params = plan_alloc(sizeof *params * (size_t)p->n_blocks * 2);
    if (!params) {
        fprintf(out, "  (out of memory)\n");
        return;
    }
    int64_t *ops = params + p->n_blocks;
    memset(params, 0, sizeof *params * (size_t)p->n_blocks * 2);
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->block >= 0 && plan_tensor_is_model_param(t))
            params[t->block] = add_sat(params[t->block], plan_tensor_logical_numel(t));
    }
    for (int32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].block >= 0) ops[p->ops[i].block]++;
    char name[64], layer[64], a[32], b[32];
    int w = 6;
    for (int32_t i = 0; i < p->n_blocks; i++) {
        int len = (int)strlen(report_clean(plan_str(p, p->blocks[i].name), name, sizeof name));
        if (len > w) w = len;
    }
    fprintf(out, "  %-*s  %-16s %8s %15s\n", w, "block", "layer", "ops", "params");
    for (int32_t i = 0; i < p->n_blocks; i++)
        fprintf(out, "  %-*s  %-16s %8s %15s\n", w, report_clean(plan_str(p, p->blocks[i].name), name, sizeof name),
                report_clean(plan_str(p, p->blocks[i].layer), layer, sizeof layer), report_grouped(ops[i], a, sizeof a),
                report_grouped(params[i], b, sizeof b));
    plan_dealloc(params);
}

typedef struct {
    const char *name;
    int64_t count;
} OpCount;

static int by_count(const void *x, const void *y)
{
    const OpCount *a = x, *b = y;
    if (a->count != b->count) return a->count < b->count ? 1 : -1;
    return strcmp(a->name, b->name);
}

/* How many of each op, most frequent first. */
static void print_ops(const Plan *p, FILE *out)
{
    fprintf(out, "\nops (%d)\n", p->n_ops);
    if (!p->n_ops) return;
    int64_t *by_str = plan_alloc(sizeof *by_str * (size_t)(p->n_strs ? p->n_strs : 1));
    OpCount *rows = plan_alloc(sizeof *rows * (size_t)p->n_ops);
    if (!by_str || !rows) {
        plan_dealloc(by_str);
        plan_dealloc(rows);
        fprintf(out, "  (out of memory)\n");
        return;
    }
    memset(by_str, 0, sizeof *by_str * (size_t)p->n_strs);
    for (int32_t i = 0; i < p->n_ops; i++) by_str[p->ops[i].op]++;
    int n = 0, w = 8;
    char name[64], a[32];
    for (int32_t s = 0; s < p->n_strs; s++)
        if (by_str[s]) {
            rows[n++] = (OpCount){p->strs[s], by_str[s]};
            int len = (int)strlen(report_clean(p->strs[s], name, sizeof name));
            if (len > w) w = len;
        }
    qsort(rows, (size_t)n, sizeof *rows, by_count);
    for (int i = 0; i < n; i++)
        fprintf(out, "  %-*s %10s\n", w, report_clean(rows[i].name, name, sizeof name),
                report_grouped(rows[i].count, a, sizeof a));
    plan_dealloc(by_str);
    plan_dealloc(rows);
}

static void print_roles(const Plan *p, FILE *out)
{
    int64_t count[PLAN_ROLE_COUNT] = {0}, bytes[PLAN_ROLE_COUNT] = {0}, total = 0, tied = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        PlanRole r = p->tensors[i].role;
        count[r]++;
        if (p->tensors[i].tied_to != PLAN_NONE) {  // its bytes are another tensor's
            tied++;
            continue;
        }
        bytes[r] = add_sat(bytes[r], plan_tensor_nbytes(&p->tensors[i]));
        total = add_sat(total, plan_tensor_nbytes(&p->tensors[i]));
    }
    char a[32], b[32], c[32];
    fprintf(out, "\ntensors by role\n");
    fprintf(out, "  %-10s %10s %18s\n", "role", "tensors", "bytes");
    for (int r = 0; r < PLAN_ROLE_COUNT; r++)
        if (count[r])
            fprintf(out, "  %-10s %10s %18s %12s\n", plan_role_name((PlanRole)r), report_grouped(count[r], a, sizeof a),
                    report_grouped(bytes[r], b, sizeof b), report_bytes(bytes[r], c, sizeof c));
    fprintf(out, "  %-10s %10s %18s %12s\n", "total", report_grouped(p->n_tensors, a, sizeof a),
            report_grouped(total, b, sizeof b),
            report_bytes(total, c, sizeof c));
    if (tied)
        fprintf(out, "  (%s tied tensor%s: %s another's bytes, counted once)\n", report_grouped(tied, a, sizeof a),
                tied == 1 ? "" : "s", tied == 1 ? "shares" : "share");
}

static void print_sections(const Plan *p, FILE *out)
{
    fprintf(out, "\nsections\n");
    if (!p->n_sections) {
        fprintf(out, "  (a plan built in memory, not read from a file)\n");
        return;
    }
    char a[32], b[32];
    fprintf(out, "  %-4s %14s %14s  %s\n", "tag", "offset", "bytes", "crc32");
    for (int32_t i = 0; i < p->n_sections; i++) {
        const PlanSection *s = &p->sections[i];
        fprintf(out, "  %-4s %14s %14s  %08" PRIx32 "\n", s->tag, report_grouped((int64_t)s->offset, a, sizeof a),
                report_grouped((int64_t)s->length, b, sizeof b), s->crc);
    }
}

/* The memory report, computed by report/ as for fsc --mem: one per stage. */
static void print_memory(const Plan *p, FILE *out)
{
    char err[256];
    MemStages *s = report_stages_new(p, err, sizeof err);
    fputc('\n', out);
    if (!s) {
        fprintf(out, "memory plan: none (%s)\n", err);
        return;
    }
    report_stages_print(s, out);
    report_stages_free(s);
    report_forward_print(p, out);
}

/* Each program: its stage's ranks and what it holds. */
static void print_programs(const Plan *p, FILE *out)
{
    char a[32], b[32], c[32], d[32], ranks[64];
    fprintf(out, "\nprograms (%d)\n", p->n_programs);
    if (!p->n_programs) return;
    fprintf(out, "  %-5s  %-13s %8s %10s %10s %8s %14s %12s\n", "stage", "ranks", "dp world", "ops", "tensors", "outputs",
            "device arena", "host arena");
    for (int32_t k = 0; k < p->n_programs; k++) {
        const PlanProgram *g = &p->programs[k];
        fprintf(out, "  %-5d  %-13s %8d %10s %10s %8d %14s %12s\n", g->stage, report_stage_ranks(p, k, ranks, sizeof ranks),
                g->dp_world, report_grouped(g->n_ops, a, sizeof a), report_grouped(g->n_tensors, b, sizeof b),
                g->n_outputs, report_bytes(g->space_bytes[PLAN_PLACE_DEVICE], c, sizeof c),
                report_bytes(g->space_bytes[PLAN_PLACE_HOST], d, sizeof d));
    }
}

/* The stored schedule: ops per stream, waits, and the tensors the step loop reads by role. */
static void print_schedule(const Plan *p, FILE *out)
{
    int32_t per[PLAN_STREAM_COUNT] = {0}, waiting = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        per[p->ops[k].stream]++;
        waiting += p->ops[k].n_wait > 0;
    }
    fprintf(out, "\nschedule\n");
    for (int s = 0; s < PLAN_STREAM_COUNT; s++)
        if (per[s]) fprintf(out, "  %-12s %6d ops\n", plan_stream_name((PlanStream)s), per[s]);
    fprintf(out, "  %-12s %6d (%d ops wait for a collective first)\n", "waits", p->n_waits, waiting);
    char n[64];
    fprintf(out, "step roles\n");
    int32_t n_prog = p->n_programs > 1 ? p->n_programs : 1, t0, t1, o0, o1;
    for (int32_t g = 0; g < n_prog; g++) {
        ranges(p, g, &t0, &t1, &o0, &o1);
        for (int r = 1; r < PLAN_SR_COUNT; r++)
            for (int32_t id = t0; id < t1; id++)
                if (p->tensors[id].step_role == (PlanStepRole)r) {
                    fprintf(out, "  ");
                    stage_label(p, g, out);
                    fprintf(out, "%-12s %s\n", plan_step_role_name((PlanStepRole)r), tensor_name(p, id, n, sizeof n));
                    break;
                }
    }
}

/* A plan of several programs: the step's tasks on the timeline's clock (report/timeline.c). */
static void print_timeline(const Plan *p, FILE *out)
{
    char err[256];
    if (p->n_programs < 2) return;
    Timeline *t = report_timeline_new(p, TL_COST_FLOPS, err, sizeof err);
    fputc('\n', out);
    if (t)
        report_timeline_print(t, out);
    else
        fprintf(out, "timeline: none (%s)\n", err);
    report_timeline_free(t);
}

void rt_inspect(const Plan *p, FILE *out)
{
    print_summary(p, out);
    print_settings(p, out);
    print_io(p, out);
    print_programs(p, out);
    print_blocks(p, out);
    print_ops(p, out);
    print_schedule(p, out);
    print_timeline(p, out);
    print_roles(p, out);
    print_memory(p, out);
    fputc('\n', out);
    comm_report(p, out);
    print_sections(p, out);
}
