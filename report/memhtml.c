/* report/memhtml.c: the memory report as one self-contained HTML page (fsc --mem=html
 * FILE): the summary as tiles, a legend, the timeline (report/memsvg.c), then the tables
 * of the text report. A plan of several stages: a table of the stages, the step's
 * schedule as a lane per stage (report/timesvg.c), then one section per stage as above.
 * With --compare, another plan's live bytes are overlaid on each chart (its stage of the
 * same number, or its largest). Inline CSS and a few lines of inline script (the
 * chart's zoom): no fonts, images or links to other files, so the page opens offline
 * and can be mailed as it is. Every string from the plan is escaped.
 */
#include <inttypes.h>
#include <string.h>

#include "memhtml.h"

/* In MemCategory's order: params blue (16-bit light), grads orange (16-bit light). */
static const char *const COLORS[MEM_CAT_COUNT] = {
    "#a0cbe8", "#ffbe7d", "#4e79a7", "#f28e2b", "#59a14f", "#8cd17d", "#b6992d", "#e15759", "#ff9d9a", "#f1ce63",
    "#499894", "#79706e", "#d4a6c8", "#9d7660",
};

static void style(FILE *out, int lanes)
{
    fputs("<style>\n"
          "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d1d1f;background:#fff;"
          "max-width:1280px;margin:20px auto;padding:0 20px}\n"
          "h1{font-size:22px;margin:0 0 2px}h2{font-size:16px;margin:26px 0 6px}\n"
          ".sub{color:#555;margin:0 0 14px}.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:0 0 12px}\n"
          ".tile{border:1px solid #ddd;border-radius:8px;padding:8px 14px;min-width:140px}\n"
          ".tile span{display:block;color:#666;font-size:12px}.tile b{display:block;font-size:19px}"
          ".tile small{color:#666}\n"
          ".legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:6px 0;font-size:13px}\n"
          ".sw{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;vertical-align:-1px}\n"
          "svg{width:100%;height:auto;display:block}svg text{font:12px system-ui,sans-serif;fill:#333}\n"
          ".grid{stroke:#e6e6e6}.axisline{stroke:#888}.axis{fill:#555;font-size:13px}.band{font-size:11px}\n"
          ".area{stroke:none}.arena{stroke:#444;stroke-dasharray:6 4}.arenalabel{fill:#444}\n"
          ".commtick{fill:#499894}.peak{stroke:#6a3d9a;stroke-width:2;vector-effect:non-scaling-stroke}"
          ".peaklabel{fill:#6a3d9a;font-weight:600}.peakbar rect{stroke:#6a3d9a;stroke-width:1;"
          "vector-effect:non-scaling-stroke}\n"
          ".compare{fill:none;stroke:#111;stroke-width:1.5;stroke-dasharray:4 2;vector-effect:non-scaling-stroke}"
          ".comparearena{stroke:#111;stroke-dasharray:1 3}.cmpsw{border:2px dashed #111;background:none;"
          "box-sizing:border-box}\n"
          ".tick{display:inline-block;width:2px;height:10px;background:#499894;margin:0 6px 0 5px;vertical-align:-1px}\n"
          ".brush{fill:#6a3d9a;fill-opacity:.12;stroke:#6a3d9a}svg{cursor:crosshair;user-select:none}\n"
          ".col rect{fill:#000;fill-opacity:0}.col:hover rect{fill-opacity:.10}\n"
          ".hint{color:#666;font-size:12px;margin:2px 0 0}\n"
          "table{border-collapse:collapse}th,td{padding:3px 12px 3px 0;text-align:left;border-bottom:1px solid #eee}\n"
          "td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}code{font-size:13px}\n"
          "footer{color:#888;font-size:12px;margin:28px 0 10px}\n",
          out);
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        fprintf(out, ".c-%s{fill:%s}.s-%s{background:%s}\n", report_category_key((MemCategory)c), COLORS[c],
                report_category_key((MemCategory)c), COLORS[c]);
    if (lanes) report_html_lanes_style(out);
    fputs("</style>\n", out);
}

static void tile(FILE *out, const char *label, const char *big, const char *small)
{
    fprintf(out, "<div class=\"tile\"><span>%s</span><b>", label);
    html_text(out, big);
    fprintf(out, "</b><small>");
    html_text(out, small);
    fprintf(out, "</small></div>\n");
}

/* "shard fsdp, precision bf16, recompute none" */
static void settings(const Plan *p, FILE *out)
{
    char c[64];
    fprintf(out, "shard ");
    html_text(out, report_clean(plan_meta_str(p, "shard", "none"), c, sizeof c));
    fprintf(out, ", precision ");
    html_text(out, report_clean(plan_meta_str(p, "precision", "?"), c, sizeof c));
    fprintf(out, ", recompute ");
    html_text(out, report_clean(plan_meta_str(p, "recompute", "none"), c, sizeof c));
}

/* The title (a stage's: its label, a level down), the settings and the tiles. */
static void summary(const MemReport *r, FILE *out)
{
    const Plan *p = r->plan;
    char a[64], b[64], c[256], model[64];
    int64_t peak = r->peak[PLAN_PLACE_DEVICE], state = report_state_sum(r->state);
    if (r->n_stages > 1) {
        report_label(r, c, sizeof c);
        c[0] = 'S';
        fprintf(out, "<h2 id=\"stage-%d\">%s</h2>\n", r->stage, c);
    } else {
        fprintf(out, "<h1>");
        html_text(out, report_clean(plan_meta_str(p, "model", "model"), model, sizeof model));
        fprintf(out, ": memory plan</h1>\n");
    }
    fprintf(out, "<p class=\"sub\">%s%s; bytes per rank; %s ops; ", report_ranks(r, a, sizeof a),
            r->world > 1 ? ", one program for every rank" : "", report_grouped(p->n_ops, b, sizeof b));
    settings(p, out);
    fprintf(out, "</p>\n<div class=\"tiles\">\n");
    snprintf(c, sizeof c, "%s bytes", report_grouped(r->arena_bytes, b, sizeof b));
    tile(out, "arena", report_bytes(r->arena_bytes, a, sizeof a), c);
    snprintf(c, sizeof c, "at op %d", r->peak_at[PLAN_PLACE_DEVICE]);
    tile(out, "peak live", report_bytes(peak, a, sizeof a), c);
    snprintf(a, sizeof a, "%.4f", peak > 0 ? (double)r->arena_bytes / (double)peak : 0.0);
    snprintf(c, sizeof c, "%.2f%% above the peak", peak > 0 ? 100.0 * ((double)r->arena_bytes / (double)peak - 1) : 0.0);
    tile(out, "arena / peak", a, c);
    tile(out, "params", report_grouped(r->param_count, a, sizeof a),
         report_bytes(r->state[MEM_PARAMS16] + r->state[MEM_PARAMS32], b, sizeof b));
    char per[32];
    report_per_param((double)state / (double)(r->param_count > 0 ? r->param_count : 1), per, sizeof per);
    snprintf(a, sizeof a, "%s B/param", per);
    tile(out, "model state", a, report_bytes(state, b, sizeof b));
    snprintf(c, sizeof c, "arena, peak %s", report_bytes(r->peak[PLAN_PLACE_HOST], b, sizeof b));
    tile(out, "host space", r->host_arena_bytes ? report_bytes(r->host_arena_bytes, a, sizeof a) : "none",
         r->host_arena_bytes ? c : "every tensor in device memory");
    fprintf(out, "</div>\n");
}

/* Model state in ZeRO's categories, and what a reader of ZeRO's tables would count otherwise. */
static void state_note(const MemReport *r, FILE *out)
{
    double n = (double)(r->param_count > 0 ? r->param_count : 1);
    char v[32];
    fprintf(out, "<p class=\"hint\">Model state, as ZeRO counts it: %s bytes/param =",
            report_per_param((double)report_state_sum(r->state) / n, v, sizeof v));
    for (int c = MEM_PARAMS16; c <= MEM_OPT_STATE; c++)
        fprintf(out, "%s %s %s", c == MEM_PARAMS16 ? "" : " +", report_category_name((MemCategory)c),
                report_per_param((double)r->state[c] / n, v, sizeof v));
    fprintf(out, " (each param's 16-bit copy once, whatever made it: a cast, a gather kept for the step, a copy to the "
            "device).");
    if (r->state[MEM_GRADS32] && (r->state[MEM_PARAMS16] || r->state[MEM_GRADS16]))
        fprintf(out, " ZeRO's (2 + 2 + K) &Psi; leaves out the fp32 grads (summed or reduced in fp32: accumulation over micro-batches, reduce_dtype fp32).");
    if (r->has_per_use_gathers)
        fprintf(out, " Gathered params are fsdp's per-use gathers (a block's params all-gathered for each pass "
                "that reads them, freed after it): transient, like activations, not model state, where a block's "
                "params count once, as this rank's shard (ZeRO-3's &Psi; / N).");
    fprintf(out, "</p>\n");
}

static void legend(const MemReport *r, const MemReport *cmp, const char *cmp_name, FILE *out)
{
    char b[32], arena[32], name[64];
    fprintf(out, "<div class=\"legend\">");
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        if (r->max_cat[PLAN_PLACE_DEVICE][c])
            fprintf(out, "<span><i class=\"sw s-%s\"></i>%s <small>(%s at the peak)</small></span>",
                    report_category_key((MemCategory)c), report_category_name((MemCategory)c),
                    r->at_peak[PLAN_PLACE_DEVICE][c] ? report_bytes(r->at_peak[PLAN_PLACE_DEVICE][c], b, sizeof b) : "none");
    fprintf(out, "<span><i class=\"sw\" style=\"background:#6a3d9a\"></i>peak (its op's stack, drawn %s)</span>",
            "wider than one op");
    if (cmp) {
        fprintf(out, "<span class=\"cmp\"><i class=\"sw cmpsw\"></i>compared: <code>");
        html_text(out, report_clean(cmp_name, name, sizeof name));
        fprintf(out, "</code> (peak %s, arena %s; its %d ops stretched to this width)</span>",
                report_bytes(cmp->peak[PLAN_PLACE_DEVICE], b, sizeof b), report_bytes(cmp->arena_bytes, arena, sizeof arena),
                cmp->plan->n_ops);
    }
    fprintf(out, "</div>\n");
    state_note(r, out);
}

static void category_table(const MemReport *r, PlanPlace pl, FILE *out)
{
    char a[32], b[32];
    fprintf(out, "<h2>%s</h2>\n<table><tr><th>category</th><th class=\"n\">at the peak</th><th class=\"n\">max over the "
            "step</th></tr>\n", pl == PLAN_PLACE_HOST ? "Host memory, by category" : "Bytes by category");
    for (int c = 0; c < MEM_CAT_COUNT; c++) {
        if (pl == PLAN_PLACE_HOST && !r->max_cat[pl][c]) continue;
        fprintf(out, "<tr><td><i class=\"sw s-%s\"></i>%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>\n",
                report_category_key((MemCategory)c), report_category_name((MemCategory)c),
                r->at_peak[pl][c] ? report_bytes(r->at_peak[pl][c], a, sizeof a) : "-",
                r->max_cat[pl][c] ? report_bytes(r->max_cat[pl][c], b, sizeof b) : "-");
    }
    fprintf(out, "<tr><th>total</th><th class=\"n\">%s</th><th class=\"n\"></th></tr></table>\n",
            report_bytes(r->peak[pl], a, sizeof a));
}

static void top_table(const MemReport *r, FILE *out)
{
    const Plan *p = r->plan;
    char name[64], type[128], b[32], made[160], where[256];
    fprintf(out, "<h2>Largest buffers live at the peak</h2>\n<p class=\"sub\">op %d: ", r->peak_at[PLAN_PLACE_DEVICE]);
    html_text(out, report_op_where(p, p->n_ops ? r->peak_at[PLAN_PLACE_DEVICE] : PLAN_NONE, where, sizeof where));
    fprintf(out, "; %d of the %d buffers live there</p>\n<table><tr><th>tensor</th><th>type</th><th class=\"n\">bytes</th>"
            "<th>category</th><th>made by</th></tr>\n", r->n_top, r->n_live_at_peak);
    for (int i = 0; i < r->n_top; i++) {
        int32_t t = r->top[i].tensor;
        fprintf(out, "<tr><td><code>");
        html_text(out, report_tensor_name(p, t, name, sizeof name));
        fprintf(out, "</code></td><td><code>%s</code></td><td class=\"n\">%s</td><td><i class=\"sw s-%s\"></i>%s</td><td>",
                report_type(&p->tensors[t], type, sizeof type), report_bytes(r->top[i].bytes, b, sizeof b),
                report_category_key(r->top[i].cat), report_category_name(r->top[i].cat));
        html_text(out, report_made_by(p, t, made, sizeof made));
        fprintf(out, "</td></tr>\n");
    }
    fprintf(out, "</table>\n");
}

static void saved_row(const MemReport *r, int32_t b, int32_t e, FILE *out)
{
    const Plan *p = r->plan;
    char name[64], layer[64], a[32], all[32];
    fprintf(out, "<tr><td>");
    html_text(out, report_clean(plan_str(p, p->blocks[b].name), name, sizeof name));
    if (e > b) {
        fprintf(out, " .. ");
        html_text(out, report_clean(plan_str(p, p->blocks[e].name), name, sizeof name));
    }
    fprintf(out, "</td><td>");
    html_text(out, report_clean(plan_str(p, p->blocks[b].layer), layer, sizeof layer));
    fprintf(out, "</td><td class=\"n\">%s%s</td><td class=\"n\">%s</td></tr>\n", report_bytes(r->saved_by_block[b], a, sizeof a),
            e > b ? " each" : "", report_bytes(report_mul_sat(r->saved_by_block[b], e - b + 1), all, sizeof all));
}

static void saved_table(const MemReport *r, FILE *out)
{
    const Plan *p = r->plan;
    char a[32];
    int64_t any = 0;
    for (int32_t k = 0; k <= p->n_blocks; k++) any |= r->saved_by_block[k];
    if (!any) return;
    fprintf(out, "<h2>Saved for backward, by the block whose backward reads it</h2>\n<table><tr><th>blocks</th>"
            "<th>layer</th><th class=\"n\">bytes</th><th class=\"n\">in all</th></tr>\n");
    for (int32_t b = 0; b < p->n_blocks; b = report_block_run(r, b) + 1)
        if (r->block_ops[b]) saved_row(r, b, report_block_run(r, b), out);
    if (r->saved_by_block[p->n_blocks])
        fprintf(out, "<tr><td>outside blocks</td><td></td><td class=\"n\">%s</td><td></td></tr>\n",
                report_bytes(r->saved_by_block[p->n_blocks], a, sizeof a));
    fprintf(out, "</table>\n");
}

static void head(const Plan *p, int lanes, FILE *out)
{
    char model[64];
    fprintf(out, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>");
    html_text(out, report_clean(plan_meta_str(p, "model", "model"), model, sizeof model));
    fprintf(out, " - memory plan</title>\n");
    style(out, lanes);
    fprintf(out, "</head>\n<body>\n");
}

static int tail(FILE *out)
{
    fprintf(out, "<footer>Computed from the plan by the same code as <code>fsc --mem</code> and <code>fsexec --inspect"
            "</code>.</footer>\n</body>\n</html>\n");
    return ferror(out) ? -1 : 0;
}

/* One program's report: the summary, its timeline and its tables. */
static int body(const MemReport *r, const MemReport *cmp, const char *cmp_name, FILE *out)
{
    summary(r, out);
    legend(r, cmp, cmp_name, out);
    if (report_html_chart(r, cmp, out)) return -1;
    fprintf(out, "<p class=\"hint\">Hover a column for the op, the bytes live there by category and its largest "
            "transient buffers. Columns stand for one op each, or for the fullest op of a run. Drag across the "
            "chart to zoom into those ops; double-click to see every op again.</p>\n");
    category_table(r, PLAN_PLACE_DEVICE, out);
    if (r->peak[PLAN_PLACE_HOST]) category_table(r, PLAN_PLACE_HOST, out);
    top_table(r, out);
    saved_table(r, out);
    return 0;
}

int report_mem_html(const MemReport *r, FILE *out)
{
    head(r->plan, 0, out);
    return body(r, NULL, NULL, out) ? -1 : tail(out);
}

/* What stage k of a plan of n is compared with: other's stage k when other has n
 * stages, else other's largest; NULL without other. */
static const MemReport *compared(const MemStages *other, int32_t k, int32_t n)
{
    if (!other) return NULL;
    return other->n == n ? other->stage[k] : report_stages_largest(other);
}

/* The stages side by side: ranks, ops, arenas, peak and params, each linked to its section. */
static void stage_table(const MemStages *s, FILE *out)
{
    char a[32], b[32], c[32], d[32], e[32], f[32];
    fprintf(out, "<table><tr><th>stage</th><th>ranks</th><th class=\"n\">ops</th><th class=\"n\">device arena</th>"
            "<th class=\"n\">peak live</th><th class=\"n\">host arena</th><th class=\"n\">params</th></tr>\n");
    for (int32_t k = 0; k < s->n; k++) {
        const MemReport *r = s->stage[k];
        fprintf(out, "<tr><td><a href=\"#stage-%d\">%d</a>%s</td><td>%s</td><td class=\"n\">%s</td><td class=\"n\">%s"
                "</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>\n", k, k,
                k == s->largest ? " (largest)" : "", report_ranks(r, a, sizeof a),
                report_grouped(r->plan->n_ops, b, sizeof b), report_bytes(r->arena_bytes, c, sizeof c),
                report_bytes(r->peak[PLAN_PLACE_DEVICE], d, sizeof d), report_bytes(r->host_arena_bytes, e, sizeof e),
                report_grouped(r->param_count, f, sizeof f));
    }
    fprintf(out, "</table>\n");
}

/* The schedule: a lane per stage, costed by FLOPs when the plan has them. */
static int schedule(const MemStages *s, FILE *out)
{
    char err[256];
    Timeline *t = report_timeline_new(s->plan, TL_COST_FLOPS, err, sizeof err);
    fprintf(out, "<h2>Schedule, a lane per stage</h2>\n");
    if (!t) {
        fprintf(out, "<p class=\"sub\">No schedule: ");
        html_text(out, err);
        fprintf(out, "</p>\n");
        return 0;
    }
    int rc = report_html_lanes(t, out);
    report_timeline_free(t);
    return rc;
}

int report_stages_html(const MemStages *s, FILE *out) { return report_stages_html_compare(s, NULL, NULL, out); }

int report_stages_html_compare(const MemStages *s, const MemStages *other, const char *other_name, FILE *out)
{
    if (s->n == 1) {
        head(s->plan, 0, out);
        return body(s->stage[0], compared(other, 0, 1), other_name, out) ? -1 : tail(out);
    }
    const Plan *p = s->plan;
    char a[32], model[64];
    head(p, 1, out);
    fprintf(out, "<h1>");
    html_text(out, report_clean(plan_meta_str(p, "model", "model"), model, sizeof model));
    fprintf(out, ": memory plan, %d pipeline stages</h1>\n<p class=\"sub\">%d stages x %" PRId64 " data-parallel rank%s "
            "(world %s); bytes per rank; ", s->n, s->n, s->stage[0]->world, s->stage[0]->world == 1 ? "" : "s",
            report_grouped(report_mul_sat(s->n, s->stage[0]->world), a, sizeof a));
    settings(p, out);
    fprintf(out, "; --mem-limit checks the largest arena, stage %d's</p>\n", s->largest);
    stage_table(s, out);
    if (schedule(s, out)) return -1;
    for (int32_t k = 0; k < s->n; k++) {
        fprintf(out, "<section>\n");
        if (body(s->stage[k], compared(other, k, s->n), other_name, out)) return -1;
        fprintf(out, "</section>\n");
    }
    return tail(out);
}
