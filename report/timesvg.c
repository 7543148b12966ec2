/* report/timesvg.c: the step's schedule in the HTML report, as inline SVG: a lane per
 * stage on one time axis (the timeline's clock: ms at the nominal rate, or units), each
 * task a box coloured by kind (forward, backward, the step's work), labelled where it is
 * wide enough, with a <title> tooltip (its ops, start, end, FLOPs); idle time is the
 * lane's bare background. Under it, each stage's busy and idle time and the bubble.
 * Drawn from report/timeline.c's numbers alone; nothing is scheduled here.
 */
#include <string.h>

#include "memhtml.h"

static const double W = 1200, LEFT = 84, RIGHT = 24, TOP = 16, ROW = 30, BOX = 22, AXIS = 44;
static const char *const KIND_CLASS[TL_KIND_COUNT] = {"tl-f", "tl-b", "tl-s", "tl-w"};
static const char *const KIND_NAME[TL_KIND_COUNT] = {"forward", "backward", "the step's work", "weight gradients"};

void report_html_lanes_style(FILE *out)
{
    fputs(".lane{fill:#f4f4f4}.tl-f{fill:#4e79a7}.tl-b{fill:#f28e2b}.tl-s{fill:#79706e}.tl-w{fill:#59a14f}"
          ".tlabel{fill:#fff;font-size:11px}\n",
          out);
}

static double x_of(const Timeline *t, double v) { return LEFT + (W - LEFT - RIGHT) * v / t->makespan; }

static void task_box(const Timeline *t, const TlTask *x, double y, FILE *out)
{
    char label[32], a[32], b[32];
    double x0 = x_of(t, report_task_drawn_from(x)), x1 = x_of(t, x->end);
    report_task_label(x, label, sizeof label);
    fprintf(out, "<g><title>stage %d: %s (%s", x->stage, label, KIND_NAME[x->kind]);
    if (x->microbatch != PLAN_NONE) fprintf(out, " of micro-batch %d", x->microbatch);
    fprintf(out, "), ops %d-%d\nfrom %s to %s", x->first_op, x->first_op + x->n_ops - 1,
            report_tl_time(t, x->start, a, sizeof a), report_tl_time(t, x->end, b, sizeof b));
    if (x->flops > 0) fprintf(out, "\n%.4g GFLOP", x->flops / 1e9);
    fprintf(out, "</title><rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" class=\"%s\"/>", x0, y,
            x1 - x0 > 0.5 ? x1 - x0 - 0.5 : 0.5, BOX, KIND_CLASS[x->kind]);
    if (x1 - x0 > 8.0 * (double)strlen(label))
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"tlabel\">%s</text>", (x0 + x1) / 2,
                y + BOX / 2 + 4, label);
    fprintf(out, "</g>\n");
}

static void axis(const Timeline *t, double y, FILE *out)
{
    double step = report_html_nice(t->makespan / 10);
    fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"axisline\"/>\n", LEFT, W - RIGHT, y, y);
    for (double v = 0; v <= t->makespan + step / 1e6; v += step)
        fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"axisline\"/><text x=\"%.1f\" "
                "y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x_of(t, v), x_of(t, v), y, y + 5, x_of(t, v), y + 18, v);
    if (t->cost == TL_COST_UNIT)
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"axis\">time (units: F = 1, B = 2)"
                "</text>\n", LEFT + (W - LEFT - RIGHT) / 2, y + 36);
    else
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"axis\">time (ms at %g TFLOP/s)"
                "</text>\n", LEFT + (W - LEFT - RIGHT) / 2, y + 36, REPORT_TL_RATE / 1e12);
}

static void numbers(const Timeline *t, FILE *out)
{
    char a[32], b[32], ranks[64];
    fprintf(out, "<table><tr><th>stage</th><th>ranks</th><th class=\"n\">tasks</th><th class=\"n\">busy</th>"
            "<th class=\"n\">idle</th><th class=\"n\">idle %%</th></tr>\n");
    for (int32_t s = 0; s < t->n_stages; s++) {
        const TlStage *st = &t->stages[s];
        fprintf(out, "<tr><td>%d</td><td>%s</td><td class=\"n\">%d</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
                "<td class=\"n\">%.1f%%</td></tr>\n", s, report_stage_ranks(t->plan, s, ranks, sizeof ranks),
                st->n_tasks, report_tl_time(t, st->busy, a, sizeof a), report_tl_time(t, st->idle, b, sizeof b),
                t->makespan > 0 ? 100 * st->idle / t->makespan : 0.0);
    }
    fprintf(out, "</table>\n<p class=\"hint\">Makespan %s; ideal %s (the busiest stage's work alone); bubble %.1f%% "
            "of the makespan. ", report_tl_time(t, t->makespan, a, sizeof a), report_tl_time(t, t->ideal, b, sizeof b),
            100 * t->bubble);
    if (t->cost == TL_COST_FLOPS)
        fprintf(out, "Each task's FLOPs at a nominal %g TFLOP/s; transfers take no time.</p>\n", REPORT_TL_RATE / 1e12);
    else
        fprintf(out, "Unit costs (forward 1, backward 2, the step's work 0)%s; transfers take no time.</p>\n",
                t->fell_back ? ": the plan's ops carry no FLOPs" : "");
}

int report_html_lanes(const Timeline *t, FILE *out)
{
    double h = TOP + ROW * t->n_stages + AXIS;
    if (t->makespan <= 0) {
        fprintf(out, "<p class=\"sub\">No task takes any time: nothing to draw.</p>\n");
        numbers(t, out);
        return ferror(out) ? -1 : 0;
    }
    fprintf(out, "<svg viewBox=\"0 0 %.0f %.0f\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" "
            "aria-label=\"the step's tasks, a lane per stage\">\n", W, h);
    for (int32_t s = 0; s < t->n_stages; s++) {
        double y = TOP + ROW * s;
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">stage %d</text>", LEFT - 8, y + BOX / 2 + 4, s);
        fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.0f\" class=\"lane\"/>\n", LEFT, y,
                W - LEFT - RIGHT, BOX);
        const TlStage *st = &t->stages[s];
        for (int32_t i = st->first_task; i < st->first_task + st->n_tasks; i++)
            if (t->tasks[i].cost > 0) task_box(t, &t->tasks[i], y, out);
    }
    axis(t, TOP + ROW * t->n_stages, out);
    fprintf(out, "</svg>\n");
    numbers(t, out);
    return ferror(out) ? -1 : 0;
}
