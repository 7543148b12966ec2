/* report/memsvg.c: the timeline of the HTML report, as inline SVG. Live bytes over the
 * schedule (x: op index, y: bytes in binary units), stacked by category, one filled
 * step-shaped area per category; the arena as a dashed line; the peak as a bar of its
 * own (PEAK_BAR px wide, whatever the columns' width, stacked by category as at the peak
 * op) under a purple line with its label; the phases (forward, backward, optimizer, ...)
 * as a band under the axis, communication ops as ticks above it, both in a legend under
 * the chart. Hovering any column shows a <title> tooltip: the op, the bytes live there
 * by category and the largest transient buffers. Another plan (--compare) is overlaid
 * as the outline of its live bytes, its ops stretched over the same width.
 *
 * A long schedule is drawn in at most MAX_COLS columns: each shows the op with the most
 * bytes live among the ops it covers, so the peak is never averaged away. A few lines of
 * inline script zoom: drag over the chart to show those ops alone, double-click to show
 * them all. No fonts or files outside the page: it renders offline, as it is.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "report.h"
#include "memhtml.h"

enum { MAX_COLS = 600, TIP_TENSORS = 6, PEAK_BAR = 8 };
static const double W = 1200, H = 560, LEFT = 84, RIGHT = 24, TOP = 44, BOTTOM = 84;

/* Stacking order, bottom to top: what lives all step first. */
static const MemCategory STACK[MEM_CAT_COUNT] = {
    MEM_PARAMS32, MEM_OPT_STATE, MEM_INPUTS, MEM_PARAMS16, MEM_GATHERED, MEM_GRADS16, MEM_GRADS32, MEM_SAVED,
    MEM_RECOMPUTE, MEM_ACTS, MEM_COMM, MEM_SCRATCH, MEM_CONSTS, MEM_KV_CACHE,
};
static const char *const PHASE_COLORS[PLAN_PHASE_COUNT] = {"#dbe3ec", "#c3ccd8", "#e6ddef", "#b3bfcc", "#d6e7de",
                                                            "#cfd8c3"};

typedef struct {
    const MemReport *r;
    const MemReport *cmp;     // the plan overlaid (--compare), or NULL
    FILE *out;
    int32_t n_cols;
    int32_t *col_op;          // the op each column shows
    double ymax, unit;        // bytes at the top of the plot; bytes per axis unit
    const char *unit_name;
} Chart;

static double pw(void) { return W - LEFT - RIGHT; }
static double ph(void) { return H - TOP - BOTTOM; }
static double y_of(const Chart *c, double bytes) { return TOP + ph() * (1 - bytes / c->ymax); }
static double x_col(const Chart *c, int32_t col) { return LEFT + pw() * col / c->n_cols; }
static double x_op(const Chart *c, double op) { return LEFT + pw() * op / c->r->n_points; }
static const int64_t *cats_at(const MemReport *r, int32_t op)
{
    return &r->live_cat[PLAN_PLACE_DEVICE][(int64_t)op * MEM_CAT_COUNT];
}

/* The ops [*a, *b) a column stands for. */
static void col_ops(const Chart *c, int32_t col, int32_t *a, int32_t *b)
{
    *a = (int32_t)((int64_t)col * c->r->n_points / c->n_cols);
    *b = (int32_t)((int64_t)(col + 1) * c->r->n_points / c->n_cols);
}

double report_html_nice(double x)
{
    double p = pow(10, floor(log10(x))), m = x / p;
    return p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10);
}

static void pick_columns(Chart *c)
{
    const MemReport *r = c->r;
    const int64_t *live = r->live[PLAN_PLACE_DEVICE];
    for (int32_t col = 0; col < c->n_cols; col++) {
        int32_t a, b;
        col_ops(c, col, &a, &b);
        int32_t best = a;
        for (int32_t i = a; i < b; i++)
            if (live[i] > live[best]) best = i;
        c->col_op[col] = best;
    }
}

static void y_axis(Chart *c)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int64_t arena = c->r->arena_bytes, peak = c->r->peak[PLAN_PLACE_DEVICE];
    double top = (double)(arena > peak ? arena : peak);
    if (c->cmp && (double)c->cmp->arena_bytes > top) top = (double)c->cmp->arena_bytes;
    if (c->cmp && (double)c->cmp->peak[PLAN_PLACE_DEVICE] > top) top = (double)c->cmp->peak[PLAN_PLACE_DEVICE];
    int u = 0;
    c->unit = 1;
    while (u < 5 && top >= 1024 * c->unit) c->unit *= 1024, u++;
    c->unit_name = names[u];
    double span = top > 0 ? top * 1.1 / c->unit : 1, step = report_html_nice(span / 8);
    c->ymax = ceil(span / step) * step * c->unit;
    for (double v = 0; v <= c->ymax / c->unit + step / 2; v += step) {
        double y = y_of(c, v * c->unit);
        fprintf(c->out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>", LEFT, W - RIGHT, y, y);
        fprintf(c->out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g %s</text>\n", LEFT - 8, y + 4, v, c->unit_name);
    }
    fprintf(c->out, "<text x=\"18\" y=\"%.1f\" transform=\"rotate(-90 18 %.1f)\" text-anchor=\"middle\" class=\"axis\">"
            "live bytes per rank (%s)</text>\n", TOP + ph() / 2, TOP + ph() / 2, c->unit_name);
}

static void x_axis(const Chart *c)
{
    int32_t n = c->r->n_points;
    double step = report_html_nice(n / 10.0 > 1 ? n / 10.0 : 1);
    double y = TOP + ph();
    fprintf(c->out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"axisline\"/>\n", LEFT, W - RIGHT, y, y);
    fprintf(c->out, "<g class=\"xticks\">");
    for (double v = 0; v <= n; v += step)
        fprintf(c->out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"axisline\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                x_op(c, v), x_op(c, v), y, y + 5, x_op(c, v), y + 18, v);
    fprintf(c->out, "</g><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"zoomlabel\"></text>\n",
            LEFT + pw() / 2, y + 18);
    fprintf(c->out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"axis\">op index (the schedule, in order)"
            "</text>\n", LEFT + pw() / 2, H - 12);
}

/* The phase of op k for the band: a communication op counts as the phase around it
 * (it shows as a tick of its own), so forward, backward and optimizer stay one run each. */
static PlanPhase band_phase(const Plan *p, int32_t k)
{
    while (k > 0 && p->ops[k].phase == PLAN_PHASE_COMM) k--;
    return p->ops[k].phase;
}

/* Runs of one phase under the axis, labelled where there is room; collectives as ticks. */
static void phase_band(const Chart *c)
{
    const Plan *p = c->r->plan;
    double y = TOP + ph() + 26;
    for (int32_t a = 0; a < p->n_ops;) {
        int32_t b = a;
        PlanPhase ph_ = band_phase(p, a);
        while (b + 1 < p->n_ops && band_phase(p, b + 1) == ph_) b++;
        double x0 = x_op(c, a), x1 = x_op(c, b + 1);
        fprintf(c->out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"14\" fill=\"%s\"><title>%s: ops %d-%d</title>"
                "</rect>", x0, y, x1 - x0, PHASE_COLORS[ph_], plan_phase_name(ph_), a, b);
        if (x1 - x0 > 60)
            fprintf(c->out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"band\">%s</text>", (x0 + x1) / 2,
                    y + 11, plan_phase_name(ph_));
        fputc('\n', c->out);
        a = b + 1;
    }
    for (int32_t k = 0; k < p->n_ops; k++)
        if (p->ops[k].phase == PLAN_PHASE_COMM)
            fprintf(c->out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"1\" height=\"4\" class=\"commtick\"/>", x_op(c, k + 0.5),
                    y - 5);
    fputc('\n', c->out);
}

/* One closed step-shaped area per category: its top edge left to right, then the top
 * of the categories below it right to left. */
static void areas(const Chart *c)
{
    for (int s = 0; s < MEM_CAT_COUNT; s++) {
        MemCategory cat = STACK[s];
        if (!c->r->max_cat[PLAN_PLACE_DEVICE][cat]) continue;
        fprintf(c->out, "<path class=\"area c-%s\" d=\"", report_category_key(cat));
        for (int pass = 0; pass < 2; pass++)
            for (int32_t k = 0; k < c->n_cols; k++) {
                int32_t col = pass ? c->n_cols - 1 - k : k;
                const int64_t *v = cats_at(c->r, c->col_op[col]);
                double below = 0;
                for (int j = 0; j < s; j++) below += (double)v[STACK[j]];
                double y = y_of(c, pass ? below : below + (double)v[cat]);
                double xa = x_col(c, col), xb = x_col(c, col + 1);
                fprintf(c->out, "%s%.1f %.1fL%.1f %.1f", !pass && !k ? "M" : "L", pass ? xb : xa, y, pass ? xa : xb, y);
            }
        fprintf(c->out, "Z\"/>\n");
    }
}

static void tip_tensors(const Chart *c, int32_t op, MemTensor *top)
{
    const Plan *p = c->r->plan;
    char name[64], type[128], b[32], made[160];
    int n = report_live_at(c->r, op, PLAN_PLACE_DEVICE, 1, top, TIP_TENSORS);
    fprintf(c->out, "\nlargest transient buffers (%d live):", n);
    for (int i = 0; i < n && i < TIP_TENSORS; i++) {
        fprintf(c->out, "\n  ");
        html_text(c->out, report_tensor_name(p, top[i].tensor, name, sizeof name));
        fprintf(c->out, " %s %s, %s, ", report_type(&p->tensors[top[i].tensor], type, sizeof type),
                report_bytes(top[i].bytes, b, sizeof b), report_category_name(top[i].cat));
        html_text(c->out, report_made_by(p, top[i].tensor, made, sizeof made));
    }
}

/* An invisible column per op group, carrying the tooltip. */
static void hover(const Chart *c)
{
    const MemReport *r = c->r;
    MemTensor top[TIP_TENSORS];
    char where[256], b[32];
    for (int32_t col = 0; col < c->n_cols; col++) {
        int32_t op = c->col_op[col];
        int32_t a, e;
        col_ops(c, col, &a, &e);
        e--;
        fprintf(c->out, "<g class=\"col\"><title>op %d: ", op);
        html_text(c->out, report_op_where(r->plan, r->plan->n_ops ? op : PLAN_NONE, where, sizeof where));
        if (e > a) fprintf(c->out, "\n(this column: ops %d-%d; it shows the fullest)", a, e);
        fprintf(c->out, "\nlive: %s", report_bytes(r->live[PLAN_PLACE_DEVICE][op], b, sizeof b));
        for (int s = MEM_CAT_COUNT - 1; s >= 0; s--)
            if (cats_at(r, op)[STACK[s]])
                fprintf(c->out, "\n  %s %s", report_category_name(STACK[s]), report_bytes(cats_at(r, op)[STACK[s]], b, sizeof b));
        tip_tensors(c, op, top);
        fprintf(c->out, "</title><rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\"/></g>\n", x_col(c, col), TOP,
                x_col(c, col + 1) - x_col(c, col), ph());
    }
}

/* The peak's label, on the side of its line where it fits (about 7 px a character). */
static void peak_label(const Chart *c, double x)
{
    const MemReport *r = c->r;
    char a[32], where[256], label[320];
    int32_t k = r->peak_at[PLAN_PLACE_DEVICE];
    snprintf(label, sizeof label, "peak %s at op %d: %s", report_bytes(r->peak[PLAN_PLACE_DEVICE], a, sizeof a), k,
             report_op_where(r->plan, r->plan->n_ops ? k : PLAN_NONE, where, sizeof where));
    double width = 7.0 * (double)strlen(label);
    int left = x + 6 + width > W - RIGHT && x - 6 - width >= LEFT - 60;
    fprintf(c->out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" class=\"peaklabel\">", x + (left ? -6 : 6),
            TOP - 18, left ? "end" : "start");
    html_text(c->out, label);
    fprintf(c->out, "</text>\n");
}

/* The peak op's stack as a bar PEAK_BAR px wide, centred on it: one column may be a
 * pixel or two, too narrow to see under the line. */
static void peak_bar(const Chart *c, double x)
{
    const int64_t *v = cats_at(c->r, c->r->peak_at[PLAN_PLACE_DEVICE]);
    double below = 0;
    fprintf(c->out, "<g class=\"peakbar\">");
    for (int s = 0; s < MEM_CAT_COUNT; s++) {
        if (!v[STACK[s]]) continue;
        double y0 = y_of(c, below), y1 = y_of(c, below + (double)v[STACK[s]]);
        fprintf(c->out, "<rect class=\"c-%s\" x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%.1f\"/>",
                report_category_key(STACK[s]), x - PEAK_BAR / 2.0, y1, PEAK_BAR, y0 - y1);
        below += (double)v[STACK[s]];
    }
    fprintf(c->out, "</g>\n");
}

/* The arena line (outside the zoomed group: it spans every op) and its label. */
static void arena_line(const Chart *c)
{
    char a[32];
    double ya = y_of(c, (double)c->r->arena_bytes);
    fprintf(c->out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"arena\"/>", LEFT, W - RIGHT, ya, ya);
    fprintf(c->out, "<text x=\"%.1f\" y=\"%.1f\" class=\"arenalabel\">arena %s</text>\n", LEFT + 6, ya - 6,
            report_bytes(c->r->arena_bytes, a, sizeof a));
}

/* The peak: its bar, and a line from the top of the bar up to its label. */
static void peak_marker(const Chart *c)
{
    const MemReport *r = c->r;
    double x = x_op(c, r->peak_at[PLAN_PLACE_DEVICE] + 0.5), yp = y_of(c, (double)r->peak[PLAN_PLACE_DEVICE]);
    peak_bar(c, x);
    fprintf(c->out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"peak\"/>\n", x, x, TOP - 14, yp);
}

/* The compared plan's live bytes as an outline, its ops stretched over the plot. */
static void compare_line(const Chart *c)
{
    const MemReport *o = c->cmp;
    int32_t n = o->n_points;
    fprintf(c->out, "<path class=\"compare\" d=\"");
    for (int32_t k = 0; k < n; k++) {
        double y = y_of(c, (double)o->live[PLAN_PLACE_DEVICE][k]);
        fprintf(c->out, "%s%.1f %.1fL%.1f %.1f", k ? "L" : "M", LEFT + pw() * k / n, y, LEFT + pw() * (k + 1) / n, y);
    }
    fprintf(c->out, "\"/>\n");
    double ya = y_of(c, (double)o->arena_bytes);
    fprintf(c->out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"comparearena\"/>\n", LEFT,
            W - RIGHT, ya, ya);
}

/* The band's phases and the communication ticks, named with their colours. */
static void phase_legend(const Chart *c)
{
    const Plan *p = c->r->plan;
    int seen[PLAN_PHASE_COUNT] = {0}, comm = 0;
    for (int32_t k = 0; k < p->n_ops; k++) seen[band_phase(p, k)] = 1, comm |= p->ops[k].phase == PLAN_PHASE_COMM;
    fprintf(c->out, "<div class=\"legend phases\"><span>phases (the band under the axis):</span>");
    for (int ph_ = 0; ph_ < PLAN_PHASE_COUNT; ph_++)
        if (seen[ph_])
            fprintf(c->out, "<span><i class=\"sw\" style=\"background:%s\"></i>%s</span>", PHASE_COLORS[ph_],
                    plan_phase_name((PlanPhase)ph_));
    if (comm) fprintf(c->out, "<span><i class=\"tick\"></i>a communication op (collective, send, receive or copy)</span>");
    fprintf(c->out, "</div>\n");
}

/* Drag over the chart to zoom into those ops (the plot group is stretched; the axis
 * ticks give way to the range shown), double-click to show every op again. The script
 * holds no '<', so the page stays plain nested tags to a reader of tags. */
static void zoom_script(const Chart *c)
{
    fprintf(c->out, "<script>(function(){var s=document.currentScript.previousElementSibling;"
            "while(s&&s.tagName.toLowerCase()!='svg')s=s.previousElementSibling;if(!s)return;"
            "var L=%.1f,PW=%.1f,N=%d,g=s.querySelector('.zoomed'),br=s.querySelector('.brush'),"
            "lab=s.querySelector('.zoomlabel'),tk=s.querySelector('.xticks'),v0=L,v1=L+PW,d0=null;"
            "function X(e){var p=s.createSVGPoint();p.x=e.clientX;p.y=e.clientY;"
            "return Math.max(L,Math.min(L+PW,p.matrixTransform(s.getScreenCTM().inverse()).x));}"
            "function show(){var k=PW/(v1-v0);g.setAttribute('transform','translate('+(L-v0*k)+' 0) scale('+k+' 1)');"
            "var zoomed=PW-0.5>v1-v0;tk.style.display=zoomed?'none':'';lab.textContent=zoomed?'ops '+"
            "Math.floor((v0-L)/PW*N)+' to '+Math.ceil((v1-L)/PW*N-1)+' (double-click: every op)':'';}"
            "s.addEventListener('mousedown',function(e){d0=X(e);br.setAttribute('x',d0);br.setAttribute('width',0);"
            "br.style.display='';e.preventDefault();});"
            "s.addEventListener('mousemove',function(e){if(d0===null)return;var x=X(e);"
            "br.setAttribute('x',Math.min(x,d0));br.setAttribute('width',Math.abs(x-d0));});"
            "s.addEventListener('mouseup',function(e){if(d0===null)return;var x=X(e),a=Math.min(x,d0),b=Math.max(x,d0);"
            "d0=null;br.style.display='none';if(3>b-a)return;var w=v1-v0;"
            "var n0=v0+(a-L)*w/PW,n1=v0+(b-L)*w/PW;v0=n0;v1=n1;show();});"
            "s.addEventListener('dblclick',function(){v0=L;v1=L+PW;show();});})();</script>\n",
            LEFT, pw(), c->r->n_points);
}

int report_html_chart(const MemReport *r, const MemReport *cmp, FILE *out)
{
    Chart c = {.r = r, .cmp = cmp, .out = out, .n_cols = r->n_points < MAX_COLS ? r->n_points : MAX_COLS};
    c.col_op = plan_alloc(sizeof *c.col_op * (size_t)c.n_cols);
    if (!c.col_op) return -1;
    pick_columns(&c);
    fprintf(out, "<svg viewBox=\"0 0 %.0f %.0f\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" "
            "aria-label=\"live bytes per op, stacked by category\">\n", W, H);
    fprintf(out, "<defs><clipPath id=\"plot-%d\"><rect x=\"%.1f\" y=\"0\" width=\"%.1f\" height=\"%.1f\"/>"
            "</clipPath></defs>\n", r->stage, LEFT, pw(), H);
    y_axis(&c);
    x_axis(&c);
    fprintf(out, "<g clip-path=\"url(#plot-%d)\"><g class=\"zoomed\">\n", r->stage);
    areas(&c);
    phase_band(&c);
    peak_marker(&c);
    if (cmp) compare_line(&c);
    hover(&c);
    fprintf(out, "</g></g>\n");
    arena_line(&c);
    peak_label(&c, x_op(&c, r->peak_at[PLAN_PLACE_DEVICE] + 0.5));
    fprintf(out, "<rect class=\"brush\" x=\"0\" y=\"%.1f\" width=\"0\" height=\"%.1f\" style=\"display:none\"/>\n",
            TOP, ph());
    fprintf(out, "</svg>\n");
    zoom_script(&c);
    phase_legend(&c);
    plan_dealloc(c.col_op);
    return 0;
}
