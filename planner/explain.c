/* planner/explain.c: what fsc --fit prints: the space and what the pruning did with it,
 * the Pareto front of the compiled candidates (device arena per rank against modelled
 * step time) with one reason per step along it, and the winner's command line, or, when
 * nothing fits, the smallest arena found and its settings. */
#include <math.h>
#include <string.h>

#include "planner.h"
#include "report.h"

/* "-3.1 GiB", "+512 KiB" */
static const char *signed_bytes(int64_t d, char *buf, size_t n)
{
    char b[32];
    snprintf(buf, n, "%s%s", d < 0 ? "-" : "+", report_bytes(d < 0 ? -d : d, b, sizeof b));
    return buf;
}

/* "--shard zero2 --precision bf16 ..." of point p. */
static void settings_text(const Space *s, const FitPoint *p, char *buf, size_t n)
{
    Setting sets[AX_COUNT + 1];
    int k = space_settings(s, &p->cand, sets);
    buf[0] = 0;
    for (int i = 0; i < k; i++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s--%s %s", i ? " " : "", sets[i].key, sets[i].value);
    if (!k) snprintf(buf, n, "(the command line's settings)");
}

/* What changes from a to b: "zero2 -> fsdp, recompute none -> all". */
static void changes(const Space *s, const FitPoint *a, const FitPoint *b, char *buf, size_t n)
{
    buf[0] = 0;
    for (int x = 0; x < AX_COUNT; x++) {
        int ia = space_applies(s, &a->cand, x), ib = space_applies(s, &b->cand, x);
        if (!ia && !ib) continue;
        const char *va = ia ? space_value(s, &a->cand, x) : "-", *vb = ib ? space_value(s, &b->cand, x) : "-";
        if (!strcmp(va, vb)) continue;
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%s %s -> %s", buf[0] ? ", " : "",
                 x == AX_SHARD ? "shard" : s->axes[x].key, va, vb);
    }
}

static double pct(double from, double to) { return from > 0 ? 100 * (to - from) / from : 0; }

/* One reason: the step from the faster a to the smaller b. */
static void reason(const Space *s, const FitPoint *a, const FitPoint *b, FILE *out)
{
    char what[1024];
    changes(s, a, b, what, sizeof what);
    char d[40];
    fprintf(out, "      %s: %s/rank, %+.1f%% step time", what, signed_bytes(b->arena - a->arena, d, sizeof d),
            pct(a->cost.time, b->cost.time));
    double moved = b->cost.comm + b->cost.copy, before = a->cost.comm + a->cost.copy;
    if (fabs(moved - before) > 1e-12) {
        int hidden = b->cost.exposed - a->cost.exposed <= 0.01 * b->cost.time;
        fprintf(out, ", %+.0f%% comm%s", pct(before, moved), hidden ? ", hidden behind compute" : "");
        if (!hidden) fprintf(out, ", %+.2f ms exposed", (b->cost.exposed - a->cost.exposed) * 1e3);
    }
    if (fabs(b->cost.compute - a->cost.compute) > 0.01 * a->cost.compute)
        fprintf(out, ", compute %+.0f%%", pct(a->cost.compute, b->cost.compute));
    if (fabs(b->cost.bubble - a->cost.bubble) > 0.005)
        fprintf(out, ", bubble %.0f%% -> %.0f%%", 100 * a->cost.bubble, 100 * b->cost.bubble);
    fprintf(out, "\n");
}

static void point_line(const Space *s, const FitPoint *p, int64_t budget, FILE *out)
{
    char set[2048], host[64] = "", b1[32], b2[32];
    settings_text(s, p, set, sizeof set);
    if (p->host_arena) snprintf(host, sizeof host, " (+%s host)", report_bytes(p->host_arena, b2, sizeof b2));
    fprintf(out, "  %10.3f ms %11s%s %s  %s\n", p->cost.time * 1e3, report_bytes(p->arena, b1, sizeof b1), host,
            p->arena <= budget ? "fits" : "over", set);
}

void planner_report(const FitRequest *q, const FitResult *r, FILE *out)
{
    const Space *s = &r->space;
    char b[32];
    fprintf(out, "fit: world %d, %s per rank; ", q->world, report_bytes(q->budget, b, sizeof b));
    machine_print(&q->machine, out);
    fprintf(out, "searched:");
    for (int x = 0; x < AX_COUNT; x++) {
        const Axis *a = &s->axes[x];
        fprintf(out, "%s %s {", x ? ";" : "", a->key);
        for (int i = 0; i < a->n; i++) fprintf(out, "%s%s", i ? "," : "", a->value[i]);
        fprintf(out, "}%s", a->pinned ? " (pinned)" : "");
    }
    fprintf(out, "\ncandidates: %lld in the product, %lld valid, %lld compiled (%lld refused by the compiler); "
            "pruned: %lld by the time bound, %lld dominated\n",
            (long long)r->n_product, (long long)r->n_points, (long long)r->n_compiled, (long long)r->n_failed,
            (long long)r->n_time_pruned, (long long)r->n_dominated);
    fprintf(out, "Pareto front of the compiled candidates (device arena per rank against modelled step time), "
            "fastest first:\n");
    for (int i = 0; i < r->n_front; i++) {
        if (i) reason(s, &r->points[r->front[i - 1]], &r->points[r->front[i]], out);
        point_line(s, &r->points[r->front[i]], q->budget, out);
    }
    if (r->winner < 0) {
        if (r->smallest < 0) {
            fprintf(out, "no candidate compiled\n");
            return;
        }
        const FitPoint *p = &r->points[r->smallest];
        char set[2048];
        settings_text(s, p, set, sizeof set);
        char b2[32];
        fprintf(out, "nothing fits in %s per rank: the smallest arena found is %s (%lld bytes), with %s\n",
                report_bytes(q->budget, b, sizeof b), report_bytes(p->arena, b2, sizeof b2), (long long)p->arena, set);
        return;
    }
    const FitPoint *w = &r->points[r->winner];
    Setting sets[AX_COUNT + 1];
    int k = space_settings(s, &w->cand, sets);
    fprintf(out, "winner (the fastest that fits): %.3f ms, %s per rank (%lld bytes), bubble %.1f%%\n",
            w->cost.time * 1e3, report_bytes(w->arena, b, sizeof b), (long long)w->arena, 100 * w->cost.bubble);
    if (!q->command) return;
    fprintf(out, "  %s", q->command);
    for (int i = 0; i < k; i++) fprintf(out, " --%s %s", sets[i].key, sets[i].value);
    if (q->output) fprintf(out, " -o %s", q->output);
    fprintf(out, "\n");
}
