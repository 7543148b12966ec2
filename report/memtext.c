/* report/memtext.c: the memory report as text, for `fsc --mem` and `fsexec --inspect`.
 * Sections: the summary (ranks, arena against the peak, where the peak is, params and
 * model state per param in ZeRO's categories, with ZeRO's count where it leaves
 * something out, host memory), bytes by category at the peak and at each
 * category's own maximum, the largest buffers live at the peak, and the saved
 * activations per block. A plan of several stages: a table of the stages first, then
 * each stage's report in full. Then the forward-only programs fsc planned beside the
 * step (evaluation, sampling), each with its arena's report. Every number is MemReport's;
 * this file only lays them out.
 */
#include <inttypes.h>
#include <string.h>

#include "report.h"

static void print_state(const char *label, const int64_t *st, double n, FILE *out)
{
    char a[32], v[32];
    int64_t sum = report_state_sum(st);
    fprintf(out, "  %-14s %s bytes/param:", label, report_per_param((double)sum / n, v, sizeof v));
    for (int c = MEM_PARAMS16; c <= MEM_OPT_STATE; c++)
        fprintf(out, "%s %s %s", c == MEM_PARAMS16 ? "" : " +", report_category_name((MemCategory)c),
                report_per_param((double)st[c] / n, v, sizeof v));
    fprintf(out, " (%s)\n", report_bytes(sum, a, sizeof a));
}

/* The trainable params, what this rank holds of them by dtype, and its model state as
 * ZeRO counts it (report/memstate.c), with notes where a reader of ZeRO's tables would
 * count otherwise. */
static void print_params(const MemReport *r, FILE *out)
{
    char a[32], b[32], c[32];
    if (r->frozen_count)
        fprintf(out, "  %-14s %s (%s trainable, %s frozen); buffers on this rank: ", "params",
                report_grouped(r->param_count, a, sizeof a), report_grouped(r->param_count - r->frozen_count, b, sizeof b),
                report_grouped(r->frozen_count, c, sizeof c));
    else
        fprintf(out, "  %-14s %s trainable; buffers on this rank: ", "params", report_grouped(r->param_count, a, sizeof a));
    int any = 0, host = report_state_sum(r->host_state) != 0;
    for (int pl = 0; pl < PLAN_PLACE_COUNT; pl++)
        for (int d = 0; d < PLAN_DT_COUNT; d++)
            if (r->param_dtype[pl][d])
                fprintf(out, "%s%s %s%s", any++ ? ", " : "", report_bytes(r->param_dtype[pl][d], b, sizeof b),
                        plan_dtype_name((PlanDType)d), !host ? "" : pl == PLAN_PLACE_HOST ? " on the host" :
                        " on the device");
    fprintf(out, "%s\n", any ? "" : "none");
    double n = r->param_count > 0 ? (double)r->param_count : 1;
    print_state("model state", r->state, n, out);
    if (host) {
        if (!strcmp(plan_meta_str(r->plan, "offload", "none"), "params"))
            fprintf(out, "  %-14s the device's 16-bit params are copies of the host's fp32 params, made each step "
                    "(fsdp's offload params: staged for each gather)\n", "offload");
        else if (plan_meta_int(r->plan, "delayed_update", 0))
            fprintf(out, "  %-14s the optimizer updates the fp32 params and its state on the host, one step late "
                    "(delayed_update: step t's update runs during step t+1, its gradient and scalars pending on the "
                    "host, counted as optimizer state); the device's 16-bit params are copies of the params before "
                    "it, sent each step\n", "offload");
        else
            fprintf(out, "  %-14s the optimizer updates the fp32 params and its state on the host; the device's "
                    "16-bit params are copies of the updated params, sent each step\n", "offload");
        print_state("host state", r->host_state, n, out);
    }
    int64_t g32 = r->state[MEM_GRADS32] + r->host_state[MEM_GRADS32];
    int64_t low = r->state[MEM_PARAMS16] + r->host_state[MEM_PARAMS16] + r->state[MEM_GRADS16] + r->host_state[MEM_GRADS16];
    if (g32 && low)
        fprintf(out, "  %-14s %s bytes/param without the fp32 grads (summed or reduced in fp32: "
                "accumulation over micro-batches, reduce_dtype fp32), which ZeRO's (2 + 2 + K) Psi leaves out\n", "ZeRO's count",
                report_per_param((double)(report_state_sum(r->state) + report_state_sum(r->host_state) - g32) / n, a,
                                 sizeof a));
    if (r->has_per_use_gathers)
        fprintf(out, "  note: gathered params are fsdp's per-use gathers (a block's params all-gathered for each "
                "pass that reads them, freed after it): transient, like activations, not model state, where a "
                "block's params count once, as this rank's shard (ZeRO-3's Psi / N)\n");
}

static void print_summary(const MemReport *r, FILE *out)
{
    const Plan *p = r->plan;
    char a[32], b[32], c[256], model[64];
    const int64_t peak = r->peak[PLAN_PLACE_DEVICE];
    fprintf(out, "memory plan: %s, %s", report_clean(plan_meta_str(p, "model", "model"), model, sizeof model),
            report_label(r, c, sizeof c));
    if (r->n_stages > 1)
        fprintf(out, ", %" PRId64 " data-parallel rank%s; bytes per rank\n", r->world, r->world == 1 ? "" : "s");
    else if (r->world > 1)
        fprintf(out, " (one program for all %" PRId64 " data-parallel ranks); bytes per rank\n", r->world);
    else
        fprintf(out, " (world 1)\n");
    fprintf(out, "  %-14s %s (%s bytes)\n", "arena", report_bytes(r->arena_bytes, a, sizeof a),
            report_grouped(r->arena_bytes, b, sizeof b));
    fprintf(out, "  %-14s %s (%s bytes) at op %d of %s\n", "peak live", report_bytes(peak, a, sizeof a),
            report_grouped(peak, b, sizeof b), r->peak_at[PLAN_PLACE_DEVICE], report_grouped(p->n_ops, c, sizeof c));
    if (peak > 0)
        fprintf(out, "  %-14s %.4f (the arena is %.2f%% above the peak)\n", "arena / peak",
                (double)r->arena_bytes / (double)peak, 100.0 * ((double)r->arena_bytes / (double)peak - 1));
    fprintf(out, "  %-14s %d: %s\n", "peak op", r->peak_at[PLAN_PLACE_DEVICE],
            report_op_where(p, p->n_ops ? r->peak_at[PLAN_PLACE_DEVICE] : PLAN_NONE, c, sizeof c));
    print_params(r, out);
    if (r->host_arena_bytes)
        fprintf(out, "  %-14s arena %s (%s bytes), peak %s at op %d: the host space (pinned on CUDA ranks)\n",
                "host space", report_bytes(r->host_arena_bytes, a, sizeof a),
                report_grouped(r->host_arena_bytes, b, sizeof b), report_bytes(r->peak[PLAN_PLACE_HOST], c, sizeof c),
                r->peak_at[PLAN_PLACE_HOST]);
    else
        fprintf(out, "  %-14s none (every tensor is in device memory)\n", "host space");
    if (r->cuda_workspace)
        fprintf(out, "  %-14s cuBLAS workspace %s outside the arena on CUDA ranks (NCCL's buffers and the CUDA "
                "context: fsexec measures them when it starts)\n", "CUDA libraries",
                report_bytes(r->cuda_workspace, a, sizeof a));
    const char *shard = plan_meta_str(p, "shard", "none");
    if (strcmp(shard, "none") && !r->shard_applied)
        fprintf(out, "  note: shard %s is not applied in this plan (it has no collectives): every rank holds the "
                "whole model state\n", report_clean(shard, c, sizeof c));
}

/* "16-bit params" -> "16-bit params (bf16)": the dtypes a 16-bit category holds. */
static void category_label(const MemReport *r, MemCategory c, char *label, size_t n)
{
    size_t at = (size_t)snprintf(label, n, "%s", report_category_name(c));
    if (c != MEM_PARAMS16 && c != MEM_GRADS16) return;
    int k = 0;
    for (int d = 0; d < PLAN_DT_COUNT && at < n; d++)
        if (r->cat_dtypes[c] & (1u << d))
            at += (size_t)snprintf(label + at, n - at, "%s%s", k++ ? ", " : " (", plan_dtype_name((PlanDType)d));
    if (k && at < n) snprintf(label + at, n - at, ")");
}

static const char *cell(int64_t v, char *buf, size_t n) { return v ? report_bytes(v, buf, n) : "-"; }

static void print_categories(const MemReport *r, PlanPlace pl, FILE *out)
{
    char a[32], b[32], label[64];
    fprintf(out, "\n  %-26s %14s %18s\n", pl == PLAN_PLACE_HOST ? "host memory" : "category", "at the peak",
            "max over the step");
    for (int c = 0; c < MEM_CAT_COUNT; c++) {
        if ((pl == PLAN_PLACE_HOST || c == MEM_KV_CACHE) && !r->max_cat[pl][c]) continue;  // only a decode program has caches
        category_label(r, (MemCategory)c, label, sizeof label);
        fprintf(out, "  %-26s %14s %18s\n", label, cell(r->at_peak[pl][c], a, sizeof a),
                cell(r->max_cat[pl][c], b, sizeof b));
    }
    fprintf(out, "  %-26s %14s %18s\n", "total", report_bytes(r->peak[pl], a, sizeof a),
            report_bytes(r->peak[pl], b, sizeof b));
}

static void print_top(const MemReport *r, FILE *out)
{
    const Plan *p = r->plan;
    char name[64], type[128], bytes[32], made[160];
    int wn = 6, wt = 4;
    for (int i = 0; i < r->n_top; i++) {
        int ln = (int)strlen(report_tensor_name(p, r->top[i].tensor, name, sizeof name));
        int lt = (int)strlen(report_type(&p->tensors[r->top[i].tensor], type, sizeof type));
        wn = ln > wn ? ln : wn, wt = lt > wt ? lt : wt;
    }
    fprintf(out, "\n  largest buffers live at the peak (%d of %d)\n", r->n_top, r->n_live_at_peak);
    fprintf(out, "    %-*s  %-*s %11s  %-22s %s\n", wn, "tensor", wt, "type", "bytes", "category", "made by");
    for (int i = 0; i < r->n_top; i++) {
        int32_t t = r->top[i].tensor;
        fprintf(out, "    %-*s  %-*s %11s  %-22s %s\n", wn, report_tensor_name(p, t, name, sizeof name), wt,
                report_type(&p->tensors[t], type, sizeof type), report_bytes(r->top[i].bytes, bytes, sizeof bytes),
                report_category_name(r->top[i].cat), report_made_by(p, t, made, sizeof made));
    }
}

/* Runs of consecutive blocks of one layer with equal saved bytes, one line each; the
 * blocks of other stages are left out. */
static void print_saved(const MemReport *r, FILE *out)
{
    const Plan *p = r->plan;
    int64_t any = 0;
    for (int32_t b = 0; b <= p->n_blocks; b++) any |= r->saved_by_block[b];
    if (!any) return;
    fprintf(out, "\n  saved for backward, by the block whose backward reads it\n");
    char first[64], last[64], layer[64], a[32], b2[32];
    for (int32_t b = 0; b < p->n_blocks;) {
        int32_t e = report_block_run(r, b);
        if (!r->block_ops[b]) {  // another stage's blocks
            b = e + 1;
            continue;
        }
        report_clean(plan_str(p, p->blocks[b].name), first, sizeof first);
        report_clean(plan_str(p, p->blocks[e].name), last, sizeof last);
        report_clean(plan_str(p, p->blocks[b].layer), layer, sizeof layer);
        char label[200];
        if (e > b)
            snprintf(label, sizeof label, "%s .. %s (%s)", first, last, layer);
        else
            snprintf(label, sizeof label, "%s (%s)", first, layer);
        if (e > b)
            fprintf(out, "    %-28s %11s each, %s in all\n", label, report_bytes(r->saved_by_block[b], a, sizeof a),
                    report_bytes(report_mul_sat(r->saved_by_block[b], e - b + 1), b2, sizeof b2));
        else
            fprintf(out, "    %-28s %11s\n", label, report_bytes(r->saved_by_block[b], a, sizeof a));
        b = e + 1;
    }
    if (r->saved_by_block[p->n_blocks])
        fprintf(out, "    %-28s %11s\n", "outside blocks", report_bytes(r->saved_by_block[p->n_blocks], a, sizeof a));
}

void report_mem_print(const MemReport *r, FILE *out)
{
    print_summary(r, out);
    print_categories(r, PLAN_PLACE_DEVICE, out);
    if (r->peak[PLAN_PLACE_HOST]) print_categories(r, PLAN_PLACE_HOST, out);
    print_top(r, out);
    print_saved(r, out);
}

/* One line per stage: its ranks, ops, arenas, peak and params; then the largest. */
static void print_stage_table(const MemStages *s, FILE *out)
{
    const Plan *p = s->plan;
    const MemReport *big = report_stages_largest(s);
    char a[32], b[32], c[32], d[32], e[32], model[64], ranks[64];
    fprintf(out, "memory plan: %s, %d pipeline stages x %" PRId64 " data-parallel rank%s (world %s); bytes per rank\n",
            report_clean(plan_meta_str(p, "model", "model"), model, sizeof model), s->n, s->stage[0]->world,
            s->stage[0]->world == 1 ? "" : "s", report_grouped(report_mul_sat(s->n, s->stage[0]->world), a, sizeof a));
    fprintf(out, "  %-5s  %-13s %9s %14s %14s %12s %15s\n", "stage", "ranks", "ops", "device arena", "peak live",
            "host arena", "params");
    for (int32_t k = 0; k < s->n; k++) {
        const MemReport *r = s->stage[k];
        fprintf(out, "  %-5d  %-13s %9s %14s %14s %12s %15s\n", k, report_ranks(r, ranks, sizeof ranks),
                report_grouped(r->plan->n_ops, a, sizeof a), report_bytes(r->arena_bytes, b, sizeof b),
                report_bytes(r->peak[PLAN_PLACE_DEVICE], c, sizeof c), report_bytes(r->host_arena_bytes, d, sizeof d),
                report_grouped(r->param_count, e, sizeof e));
    }
    fprintf(out, "  largest arena: %s, %s (what --mem-limit checks)\n", report_label(big, ranks, sizeof ranks),
            report_bytes(big->arena_bytes, a, sizeof a));
}

void report_stages_print(const MemStages *s, FILE *out)
{
    if (s->n == 1) {
        report_mem_print(s->stage[0], out);
        return;
    }
    print_stage_table(s, out);
    for (int32_t k = 0; k < s->n; k++) {
        fputc('\n', out);
        report_mem_print(s->stage[k], out);
    }
}

void report_forward_print(const Plan *p, FILE *out)
{
    const Plan *sub[3] = {p->eval, p->sample, p->decode};
    static const char *const title[3] = {
        "evaluation program (fsexec --val-data): the forward and the loss, no backward, no optimizer; its own arena,\n"
        "which the params are copied into before each evaluation",
        "sampling program (fsexec --sample past T tokens, --no-kv-cache, or where there is no decode program): the\n"
        "forward of one sequence on one rank; its own arena",
        "decode program (fsexec --sample): the forward of one token at a position on one rank, with a KV cache per\n"
        "attention (kv cache: 2 x layers x kv heads x T x head dim x dtype size); its own arena"};
    for (int k = 0; k < 3; k++) {
        if (!sub[k]) continue;
        char err[256];
        MemStages *st = report_stages_new(sub[k], err, sizeof err);
        fprintf(out, "\n%s\n", title[k]);
        if (st) report_stages_print(st, out);
        else fprintf(out, "memory plan: none (%s)\n", err);
        report_stages_free(st);
    }
}
